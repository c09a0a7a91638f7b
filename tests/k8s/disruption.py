"""PodDisruptionBudgets as 1.32 enforces them: the disruption controller
that keeps each PDB's status, and the eviction subresource (policy/v1
Eviction, POST pods/NAME/eviction) that consults it.

The controller (pkg/controller/disruption): pods = those of the PDB's
namespace its selector matches ({} matches all, none nothing);
  maxUnavailable (int or "N%" of the expected pods, rounded up):
      expectedPods = the scale of the pods' controllers, desiredHealthy =
      expectedPods - maxUnavailable (>= 0);
  minAvailable int: desiredHealthy = it, expectedPods = the pods' number;
  minAvailable "N%": expectedPods from the controllers, desiredHealthy =
      N% of it rounded up;
  controllers' scale: the /scale of the ownerReference with controller
  true (a Deployment, a custom resource with a scale subresource); pods
  without one are left out (Warning UnmanagedPods); a controller that
  cannot be found fails the sync: disruptionsAllowed 0, DisruptionAllowed
  False SyncFailed with the error;
  currentHealthy = Ready pods not being deleted and not in disruptedPods
  (an eviction's record, dropped after 2 min or once the pod is deleting);
  disruptionsAllowed = currentHealthy - desiredHealthy, 0 when negative or
  expectedPods is 0; condition DisruptionAllowed True SufficientPods /
  False InsufficientPods; observedGeneration = the PDB's generation.

The eviction (pkg/registry/core/pod/storage/eviction.go): a pod that is
Pending, Succeeded, Failed or terminating is deleted without looking at
budgets; more than one PDB matching (a selector that is empty matches
nothing here) is a 500; a pod that is not Ready passes when the PDB says
unhealthyPodEvictionPolicy AlwaysAllow, or (IfHealthyBudget, the default)
when currentHealthy >= desiredHealthy > 0; otherwise the budget must
allow a disruption: 429 TooManyRequests "Cannot evict pod as it would
violate the pod's disruption budget." with the cause DisruptionBudget
"The disruption budget NAME needs N healthy pods and has M currently"
(or, while the controller has not seen the PDB's generation, "... is
still being processed by the server." with retryAfterSeconds 10), else
disruptionsAllowed - 1 and the pod in status.disruptedPods. Then the pod
gets DisruptionTarget True (EvictionByEvictionAPI, "Eviction API:
evicting") and is deleted with the Eviction's deleteOptions (its own
grace period by default): 201 and a Status Success. dryRun=All changes
nothing."""

import copy
import threading
import time

from controllers import record_event
from k8slib import APIError, bad_request, now_rfc3339, parse_rfc3339, scaled_value, selector_match

PODS, PDBS = ("", "pods"), ("policy", "poddisruptionbudgets")
DELETION_TIMEOUT = 120.0  # disruptedPods entries live this long
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def is_ready(pod):
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [] if isinstance(c, dict))


def controller_ref(pod):
    return next((r for r in pod["metadata"].get("ownerReferences") or []
                 if isinstance(r, dict) and r.get("controller")), None)


def pdb_selects(pdb, pod, for_eviction):
    """The controller's LabelSelectorAsSelector; eviction.go also ignores
    a PDB whose selector is empty."""
    sel = (pdb.get("spec") or {}).get("selector")
    if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    empty = not isinstance(sel, dict) or not (sel.get("matchLabels") or sel.get("matchExpressions"))
    if for_eviction and empty:
        return False
    return selector_match(sel, pod["metadata"].get("labels"))


def pdbs_for(store, pod):
    with store.lock:
        return [copy.deepcopy(p) for p in store.objs[PDBS].values() if pdb_selects(p, pod, True)]


# ---- the eviction subresource ---------------------------------------------------------------

def _too_many(message, cause, retry_after=0):
    details = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    headers = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return APIError(429, "TooManyRequests", message, details, headers)


def _healthy_may_go(pod, pdb):
    """An unready pod may go without using up the budget."""
    if is_ready(pod):
        return False
    spec, s = pdb.get("spec") or {}, pdb.get("status") or {}
    if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    desired = int(s.get("desiredHealthy") or 0)
    return int(s.get("currentHealthy") or 0) >= desired > 0


def _check_and_decrement(store, pod, pdb, dry):
    s, name = pdb.get("status") or {}, pdb["metadata"]["name"]
    if int(s.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation") or 1):
        raise _too_many(VIOLATION, "The disruption budget %s is still being processed by the server." % name, 10)
    allowed = int(s.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise APIError(403, "Forbidden", 'poddisruptionbudgets.policy "%s" is forbidden: pdb disruptions allowed '
                       "is negative" % name, {"name": name, "group": "policy", "kind": "poddisruptionbudgets"})
    if allowed == 0:
        raise _too_many(VIOLATION, "The disruption budget %s needs %d healthy pods and has %d currently"
                        % (name, int(s.get("desiredHealthy") or 0), int(s.get("currentHealthy") or 0)))
    if dry:
        return
    new = copy.deepcopy(pdb)
    ns = new.setdefault("status", {})
    ns["disruptionsAllowed"] = allowed - 1
    if allowed - 1 == 0:
        ns["conditions"] = _set_condition(ns.get("conditions"), False, "InsufficientPods", "",
                                          ns.get("observedGeneration"))
    ns.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = now_rfc3339()
    t = store.types[("policy", "v1", "poddisruptionbudgets")]
    store.update(t, new["metadata"]["namespace"], pdb["metadata"]["name"], new, sub="status", require_rv=False)


def _delete(store, pod, opts, dry):
    """addConditionAndDeletePod: DisruptionTarget first, then the delete."""
    t = store.types[("", "v1", "pods")]
    m = pod["metadata"]
    pre = opts.get("preconditions") or {}
    if pre.get("uid") and pre["uid"] != m["uid"]:
        raise APIError(409, "Conflict", 'Operation cannot be fulfilled on Pod "%s": the UID in the precondition '
                       "(%s) does not match the UID in record (%s). The object might have been deleted and then "
                       "recreated" % (m["name"], pre["uid"], m["uid"]), {"name": m["name"], "kind": "Pod"})
    if dry:
        return
    new = copy.deepcopy(pod)
    st = new.setdefault("status", {})
    conds = [c for c in st.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    old = next((c for c in st.get("conditions") or [] if c.get("type") == "DisruptionTarget"), None)
    conds.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                  "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == "True"
                  else now_rfc3339(), "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"})
    st["conditions"] = conds
    store._finish_update(t, pod, new, False)
    keep = ("gracePeriodSeconds", "propagationPolicy", "orphanDependents")
    dopts = {k: v for k, v in opts.items() if k in keep}
    store.delete(t, m["namespace"], m["name"], dopts)


def evict(store, ns, name, body, dry_run=False):
    """POST pods/NAME/eviction; the Status to answer (201) or APIError."""
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    if (body.get("metadata") or {}).get("name") != name:
        raise bad_request("name in URL does not match name in Eviction object")
    opts = body.get("deleteOptions") or {}
    if not isinstance(opts, dict):
        raise bad_request("deleteOptions must be a JSON object")
    dry = dry_run or "All" in (opts.get("dryRun") or [])
    with store.lock:
        pod = store.get(store.types[("", "v1", "pods")], ns, name)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            _delete(store, pod, opts, dry)  # it disrupts nothing (more)
            return _success()
        pdbs = pdbs_for(store, pod)
        if len(pdbs) > 1:
            raise APIError(500, "InternalError", "Internal error occurred: " + MULTIPLE,
                           {"causes": [{"message": MULTIPLE}]})
        if pdbs and not _healthy_may_go(pod, pdbs[0]):
            _check_and_decrement(store, pod, pdbs[0], dry)
        _delete(store, pod, opts, dry)
    return _success()


def _success():
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


# ---- the controller -------------------------------------------------------------------------

def _set_condition(conds, ok, reason, message, generation):
    """meta.SetStatusCondition of DisruptionAllowed: the transition time
    moves only when the status does."""
    conds = copy.deepcopy(conds or [])
    status = "True" if ok else "False"
    c = next((x for x in conds if x.get("type") == "DisruptionAllowed"), None)
    if c is None:
        c = {"type": "DisruptionAllowed"}
        conds.append(c)
    if c.get("status") != status:
        c["lastTransitionTime"] = now_rfc3339()
    c.update(status=status, reason=reason, message=message)
    if generation:
        c["observedGeneration"] = generation
    for k in ("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message"):
        if k in c:
            c[k] = c.pop(k)  # the real field order
    return conds


class SyncFailed(Exception):
    pass


class DisruptionController:
    def __init__(self, store, log):
        self.store, self.log = store, log
        self.wake = threading.Event()
        self.warned = set()  # (pdb uid, message) of UnmanagedPods/NotDeleted Events sent
        store.listeners.append(self._on_event)

    def _on_event(self, ev):
        if ev.key not in (("", "events"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases")):
            self.wake.set()  # pods, PDBs, and whatever may own pods (their scale)

    def run(self):
        while True:
            self.wake.wait(1.0)  # the 1 s tick also expires disruptedPods entries
            self.wake.clear()
            try:
                with self.store.lock:
                    for pdb in list(self.store.objs[PDBS].values()):
                        self.sync(pdb)
            except Exception as e:  # keep the controller alive, like a real one
                self.log({"msg": "disruption controller error", "error": repr(e)})

    def sync(self, pdb):
        st = self.store
        pods = [p for p in st.objs[PODS].values() if pdb_selects(pdb, p, False)]
        try:
            expected, desired = self._expected(pdb, pods)
        except SyncFailed as e:
            return self._fail_safe(pdb, str(e))
        disrupted = self._disrupted(pdb, pods)
        healthy = sum(1 for p in pods if not p["metadata"].get("deletionTimestamp")
                      and p["metadata"]["name"] not in disrupted and is_ready(p))
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        gen = int(pdb["metadata"].get("generation") or 1)
        old = pdb.get("status") or {}
        status = {"observedGeneration": gen}
        if disrupted:
            status["disruptedPods"] = disrupted
        status.update(disruptionsAllowed=allowed, currentHealthy=healthy, desiredHealthy=desired,
                      expectedPods=expected)
        status["conditions"] = _set_condition(old.get("conditions"), allowed > 0,
                                              "SufficientPods" if allowed > 0 else "InsufficientPods", "", gen)
        self._write(pdb, status)

    def _expected(self, pdb, pods):
        spec = pdb.get("spec") or {}
        try:
            if spec.get("maxUnavailable") is not None:
                expected = self._scale(pdb, pods)
                return expected, max(0, expected - scaled_value(spec["maxUnavailable"], expected, True))
            mina = spec.get("minAvailable")
            if isinstance(mina, int) and not isinstance(mina, bool):
                return len(pods), mina
            if mina is not None:
                expected = self._scale(pdb, pods)
                return expected, scaled_value(mina, expected, True)
        except ValueError as e:
            raise SyncFailed(str(e))
        return 0, 0

    def _scale(self, pdb, pods):
        """Sum of the replicas of the pods' controllers (each counted once)."""
        seen, unmanaged = {}, []
        for p in pods:
            ref = controller_ref(p)
            if ref is None:
                unmanaged.append(p["metadata"]["name"])
            elif ref.get("uid") not in seen:
                seen[ref.get("uid")] = self._replicas(p, ref)
        if unmanaged:
            sel = _selector_text((pdb.get("spec") or {}).get("selector"))
            self._warn(pdb, "UnmanagedPods", "Pods selected by this PodDisruptionBudget (selector: %s) were "
                       "found to be unmanaged. As a result, the status of the PDB cannot be calculated "
                       "correctly, which may result in undefined behavior. To account for these pods please set "
                       "\".spec.minAvailable\" field of the PDB to an integer value." % sel)
        return sum(seen.values())

    def _replicas(self, pod, ref):
        st = self.store
        api = ref.get("apiVersion") or ""
        group = api.split("/")[0] if "/" in api else ""
        t = next((x for x in st.types.values() if x.kind == ref.get("kind") and x.group == group), None)
        if t is not None and not t.scale:
            raise SyncFailed("%s does not implement the scale subresource" % t.qualified)
        obj = st.objs[t.key].get((pod["metadata"]["namespace"], ref.get("name"))) if t else None
        if obj is None or obj["metadata"].get("uid") != ref.get("uid"):
            raise SyncFailed('found no controllers for pod "%s"' % pod["metadata"]["name"])
        return int((st.scale_of(t, obj).get("spec") or {}).get("replicas") or 0)

    def _disrupted(self, pdb, pods):
        old = (pdb.get("status") or {}).get("disruptedPods") or {}
        out, now = {}, time.time()
        for p in pods:
            name = p["metadata"]["name"]
            if p["metadata"].get("deletionTimestamp") or name not in old:
                continue
            if (parse_rfc3339(old[name]) or 0) + DELETION_TIMEOUT < now:
                self._warn(p, "NotDeleted", "Pod was expected by PDB %s/%s to be deleted but it wasn't"
                           % (pdb["metadata"]["namespace"], pdb["metadata"]["name"]), kind="Pod")
            else:
                out[name] = old[name]
        return out

    def _fail_safe(self, pdb, why):
        status = copy.deepcopy(pdb.get("status") or {})
        status["disruptionsAllowed"] = 0
        status["conditions"] = _set_condition(status.get("conditions"), False, "SyncFailed", why,
                                              status.get("observedGeneration"))
        self._write(pdb, status)

    def _write(self, pdb, status):
        if status == (pdb.get("status") or {}):
            return
        st = self.store
        new = copy.deepcopy(pdb)
        new["status"] = status
        t = st.types[("policy", "v1", "poddisruptionbudgets")]
        st.update(t, pdb["metadata"]["namespace"], pdb["metadata"]["name"], new, sub="status", require_rv=False)

    def _warn(self, obj, reason, message, kind="PodDisruptionBudget"):
        key = (obj["metadata"].get("uid"), reason, message)
        if key in self.warned:
            return
        self.warned.add(key)
        record_event(self.store, obj, kind, reason, message, "Warning", "controllermanager",
                     "policy/v1" if kind == "PodDisruptionBudget" else "v1")


def _selector_text(sel):
    """A LabelSelector as its selector string (what %v of the real one shows)."""
    sel = sel or {}
    parts = ["%s=%s" % kv for kv in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op = str(e.get("operator", "")).lower()
        parts.append("%s %s (%s)" % (e.get("key"), op, ",".join(e.get("values") or [])))
    return ",".join(parts)
