"""RBAC authorization as kube-apiserver's RBAC authorizer decides it, for
the stand-in's service-account and test users: ClusterRoleBindings, then
RoleBindings of the request's namespace; a rule allows when its verbs,
apiGroups, resources (with "resource/subresource", "*" and "*/sub") and
resourceNames all match. A request without a name (create, list, watch,
deletecollection) never matches a rule with resourceNames. The members of
system:masters bypass authorization, as in the real chain. Not reproduced:
nonResourceURLs (every non-resource path is allowed to an authenticated
user), aggregated ClusterRoles (aggregationRule), escalation checks on
writes of roles and bindings."""

from k8slib import APIError

MASTERS = "system:masters"


def sa_user(ns, name):
    return "system:serviceaccount:%s:%s" % (ns, name)


def sa_groups(ns):
    return ["system:serviceaccounts", "system:serviceaccounts:%s" % ns, "system:authenticated"]


def _applies(subject, user, groups, ns):
    if not isinstance(subject, dict):
        return False
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        # A RoleBinding may leave out the namespace of a service account
        # in its own namespace.
        sa_ns = subject.get("namespace") or ns
        return bool(sa_ns) and user == sa_user(sa_ns, name)
    return False


def _has(lst, want, star="*"):
    return isinstance(lst, list) and (star in lst or want in lst)


def _resource_match(rule, resource, sub):
    combined = resource + ("/" + sub if sub else "")
    for r in rule.get("resources") or []:
        if r == "*" or r == combined:
            return True
        if sub and r == "*/" + sub:
            return True
    return False


def rule_allows(rule, verb, group, resource, sub, name):
    if not isinstance(rule, dict):
        return False
    if not _has(rule.get("verbs"), verb):
        return False
    if not _has(rule.get("apiGroups"), group):
        return False
    if not _resource_match(rule, resource, sub):
        return False
    names = rule.get("resourceNames") or []
    if not names:
        return True
    return bool(name) and name in names


def authorize(store, user, groups, verb, group, resource, sub, ns, name):
    """(allowed, reason): reason names bindings whose role is missing, as
    the real authorizer appends them to the 403 message."""
    if MASTERS in groups:
        return True, ""
    errs = []
    with store.lock:
        crs = store.objs[("rbac.authorization.k8s.io", "clusterroles")]
        roles = store.objs[("rbac.authorization.k8s.io", "roles")]

        def role_rules(ref, binding_ns):
            if not isinstance(ref, dict):
                return []
            if ref.get("kind") == "ClusterRole":
                r = crs.get(("", ref.get("name")))
                if r is None:
                    errs.append('clusterrole.rbac.authorization.k8s.io "%s" not found' % ref.get("name"))
                    return []
            elif ref.get("kind") == "Role" and binding_ns:
                r = roles.get((binding_ns, ref.get("name")))
                if r is None:
                    errs.append('role.rbac.authorization.k8s.io "%s" not found' % ref.get("name"))
                    return []
            else:
                return []
            return r.get("rules") or []

        bindings = [(b, None) for b in store.objs[("rbac.authorization.k8s.io",
                                                    "clusterrolebindings")].values()]
        if ns:
            bindings += [(b, ns) for (bns, _), b in
                         sorted(store.objs[("rbac.authorization.k8s.io", "rolebindings")].items())
                         if bns == ns]
        for b, bns in bindings:
            if not any(_applies(s, user, groups, bns) for s in b.get("subjects") or []):
                continue
            for rule in role_rules(b.get("roleRef"), bns):
                if rule_allows(rule, verb, group, resource, sub, name):
                    return True, ""
    return False, ("RBAC: " + ", ".join(errs)) if errs else ""


def forbidden(t_qualified, t_plural, t_group, user, verb, sub, ns, name, reason=""):
    """The 403 of the real server (responsewriters.forbiddenMessage)."""
    res = t_plural + ("/" + sub if sub else "")
    what = '%s "%s"' % (t_qualified, name) if name else t_qualified
    scope = ('in the namespace "%s"' % ns) if ns else "at the cluster scope"
    msg = '%s is forbidden: User "%s" cannot %s resource "%s" in API group "%s" %s' % (
        what, user, verb, res, t_group, scope)
    if reason:
        msg += ": " + reason
    details = {"group": t_group, "kind": t_plural}
    if name:
        details = {"name": name, "group": t_group, "kind": t_plural}
    return APIError(403, "Forbidden", msg, details)
