"""Pod Security admission (the PodSecurity plugin, on by default since 1.25),
written from the Pod Security Standards (kubernetes.io/docs/concepts/
security/pod-security-standards) and the plugin's documented behaviour:
a namespace labelled pod-security.kubernetes.io/enforce=LEVEL (privileged,
baseline, restricted; -version: the standards' version, "latest" when
absent) refuses pod creates that violate LEVEL with 403 Forbidden

    pods "x" is forbidden: violates PodSecurity "restricted:latest": A (...), B (...)

one entry per failed check, in the order of the checks' ids; with
pod-security.kubernetes.io/warn=LEVEL the create goes through with a
Warning header "would violate PodSecurity ...". Pure functions, no I/O.

Checked: host namespaces, privileged, capabilities (baseline: only the
default set may be added; restricted: drop ALL, add only
NET_BIND_SERVICE), hostPath volumes, hostPorts, seccomp (baseline: not
Unconfined; restricted: RuntimeDefault or Localhost, on the pod or every
container), and for restricted: volume types, allowPrivilegeEscalation,
runAsNonRoot, runAsUser 0. Not checked: AppArmor, SELinux options,
/proc mount type, sysctls, Windows host process, the legacy seccomp
annotations; pod updates, workload resources (no warnings for
Deployments), exemptions, the audit mode."""

ENFORCE = "pod-security.kubernetes.io/enforce"
WARN = "pod-security.kubernetes.io/warn"
LEVELS = ("privileged", "baseline", "restricted")

# Capabilities a baseline pod may add (the container runtimes' defaults).
BASELINE_CAPS = frozenset(("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                           "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"))
RESTRICTED_VOLUMES = frozenset(("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                "persistentVolumeClaim", "projected", "secret"))
SECCOMP_OK = ("RuntimeDefault", "Localhost")


def policy(ns_labels, mode):
    """(level, version) a namespace's labels set for mode ENFORCE or WARN,
    or None (privileged: nothing to check). A level that is not one of
    LEVELS is checked as restricted, the strictest reading."""
    level = (ns_labels or {}).get(mode)
    if level is None or level == "privileged":
        return None
    version = (ns_labels or {}).get(mode + "-version") or "latest"
    return (level if level in LEVELS else "restricted"), version


# ---- helpers ----------------------------------------------------------------------

def _d(v):
    return v if isinstance(v, dict) else {}


def _containers(spec):
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                yield c


def _sc(c):
    return _d(c.get("securityContext"))


def _quoted(names):
    return ", ".join('"%s"' % n for n in names)


def _who(names, word="container"):
    """container "a" / containers "a", "b" """
    return '%s%s %s' % (word, "" if len(names) == 1 else "s", _quoted(names))


def _must(names, what):
    return "%s %s" % (_who(names), what)


# ---- the checks, each -> None or (title, detail) ---------------------------------

def _allow_privilege_escalation(spec):
    bad = [c.get("name", "") for c in _containers(spec)
           if _sc(c).get("allowPrivilegeEscalation") is not False]
    if bad:
        return ("allowPrivilegeEscalation != false",
                _must(bad, "must set securityContext.allowPrivilegeEscalation=false"))


def _added_caps(c):
    return [str(x) for x in _d(_sc(c).get("capabilities")).get("add") or []]


def _capabilities_baseline(spec):
    names, caps = [], []
    for c in _containers(spec):
        extra = [x for x in _added_caps(c) if x not in BASELINE_CAPS]
        if extra:
            names.append(c.get("name", ""))
            caps += [x for x in extra if x not in caps]
    if names:
        return "non-default capabilities", "%s must not include %s in securityContext.capabilities.add" % (
            _who(names), _quoted(caps))


def _capabilities_restricted(spec):
    no_drop, adders, caps = [], [], []
    for c in _containers(spec):
        drop = _d(_sc(c).get("capabilities")).get("drop") or []
        if "ALL" not in drop:
            no_drop.append(c.get("name", ""))
        extra = [x for x in _added_caps(c) if x != "NET_BIND_SERVICE"]
        if extra:
            adders.append(c.get("name", ""))
            caps += [x for x in extra if x not in caps]
    parts = []
    if no_drop:
        parts.append(_must(no_drop, 'must set securityContext.capabilities.drop=["ALL"]'))
    if adders:
        parts.append("%s must not include %s in securityContext.capabilities.add"
                     % (_who(adders), _quoted(caps)))
    if parts:
        return "unrestricted capabilities", "; ".join(parts)


def _host_namespaces(spec):
    on = ["%s=true" % f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f) is True]
    if on:
        return "host namespaces", ", ".join(on)


def _host_path_volumes(spec):
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if isinstance(v, dict) and "hostPath" in v]
    if bad:
        return "hostPath volumes", _who(bad, "volume")


def _host_ports(spec):
    names, ports = [], []
    for c in _containers(spec):
        hp = [p.get("hostPort") for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
        if hp:
            names.append(c.get("name", ""))
            ports += [str(p) for p in hp if str(p) not in ports]
    if names:
        return "hostPort", "%s %s hostPort%s %s" % (_who(names), "uses" if len(names) == 1 else "use",
                                                    "" if len(ports) == 1 else "s", ", ".join(ports))


def _privileged(spec):
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("privileged") is True]
    if bad:
        return "privileged", _must(bad, "must not set securityContext.privileged=true")


def _restricted_volumes(spec):
    names, types = [], []
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        bad = [k for k in v if k != "name" and k not in RESTRICTED_VOLUMES]
        if bad:
            names.append(v.get("name", ""))
            types += [t for t in bad if t not in types]
    if names:
        return "restricted volume types", "%s %s restricted volume type%s %s" % (
            _who(names, "volume"), "uses" if len(names) == 1 else "use", "" if len(types) == 1 else "s",
            _quoted(types))


def _run_as_non_root(spec):
    pod = _d(spec.get("securityContext")).get("runAsNonRoot")
    parts, explicit, unset = [], [], []
    if pod is False:
        parts.append("pod must not set securityContext.runAsNonRoot=false")
    for c in _containers(spec):
        v = _sc(c).get("runAsNonRoot")
        if v is False:
            explicit.append(c.get("name", ""))
        elif v is None and pod is not True:
            unset.append(c.get("name", ""))
    if explicit:
        parts.append(_must(explicit, "must not set securityContext.runAsNonRoot=false"))
    if unset and pod is None:
        parts.append("pod or " + _must(unset, "must set securityContext.runAsNonRoot=true"))
    if parts:
        return "runAsNonRoot != true", "; ".join(parts)


def _run_as_user(spec):
    pod = _d(spec.get("securityContext")).get("runAsUser") == 0
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if pod or bad:
        who = " and ".join((["pod"] if pod else []) + ([_who(bad)] if bad else []))
        return "runAsUser=0", "%s must not set runAsUser=0" % who


def _seccomp_type(sc):
    return _d(sc.get("seccompProfile")).get("type")


def _seccomp_baseline(spec):
    parts = []
    if _seccomp_type(_d(spec.get("securityContext"))) == "Unconfined":
        parts.append('pod must not set securityContext.seccompProfile.type to "Unconfined"')
    bad = [c.get("name", "") for c in _containers(spec) if _seccomp_type(_sc(c)) == "Unconfined"]
    if bad:
        parts.append(_must(bad, 'must not set securityContext.seccompProfile.type to "Unconfined"'))
    if parts:
        return "seccompProfile", "; ".join(parts)


def _seccomp_restricted(spec):
    pod = _seccomp_type(_d(spec.get("securityContext")))
    parts, bad, unset = [], {}, []
    if pod is not None and pod not in SECCOMP_OK:
        parts.append('pod must not set securityContext.seccompProfile.type to "%s"' % pod)
    for c in _containers(spec):
        t = _seccomp_type(_sc(c))
        if t is not None and t not in SECCOMP_OK:
            bad.setdefault(t, []).append(c.get("name", ""))
        elif t is None and pod is None:
            unset.append(c.get("name", ""))
    for t, names in bad.items():
        parts.append(_must(names, 'must not set securityContext.seccompProfile.type to "%s"' % t))
    if unset:
        parts.append("pod or " + _must(unset, 'must set securityContext.seccompProfile.type to '
                                       '"RuntimeDefault" or "Localhost"'))
    if parts:
        return "seccompProfile", "; ".join(parts)


# (check id, levels it belongs to, check); a restricted check replaces the
# baseline one of the same id prefix, as the standard tightens it.
CHECKS = (
    ("allowPrivilegeEscalation", ("restricted",), _allow_privilege_escalation),
    ("capabilities_baseline", ("baseline",), _capabilities_baseline),
    ("capabilities_restricted", ("restricted",), _capabilities_restricted),
    ("hostNamespaces", ("baseline", "restricted"), _host_namespaces),
    ("hostPathVolumes", ("baseline", "restricted"), _host_path_volumes),
    ("hostPorts", ("baseline", "restricted"), _host_ports),
    ("privileged", ("baseline", "restricted"), _privileged),
    ("restrictedVolumes", ("restricted",), _restricted_volumes),
    ("runAsNonRoot", ("restricted",), _run_as_non_root),
    ("runAsUser", ("restricted",), _run_as_user),
    ("seccompProfile_baseline", ("baseline",), _seccomp_baseline),
    ("seccompProfile_restricted", ("restricted",), _seccomp_restricted),
)


def violations(spec, level):
    """The failed checks of a pod spec at level, as "title (detail)"."""
    out = []
    for _, levels, check in CHECKS:
        if level in levels:
            r = check(_d(spec))
            if r:
                out.append("%s (%s)" % r)
    return out


def verdict(ns_labels, spec, mode):
    """For mode ENFORCE or WARN: None, or 'PodSecurity "LEVEL:VERSION": A (...), B (...)'."""
    p = policy(ns_labels, mode)
    if p is None:
        return None
    v = violations(spec, p[0])
    return 'PodSecurity "%s:%s": %s' % (p[0], p[1], ", ".join(v)) if v else None
