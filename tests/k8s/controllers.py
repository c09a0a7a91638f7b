"""What runs beside the API server in a real cluster, reduced to what the
tests need: without --kubelet, the binding and final deletion of pods
(LocalNode: every pod bound to the first node at creation, a graceful
delete finished by a timer; the kubelet (kubelet.py) takes both over with
--kubelet), the EndpointSlice controller, the garbage collector, and
record_event for the controllers of the other modules (nodes.py: node
lifecycle and PodGC; disruption.py; autoscaler.py)."""

import copy
import json
import threading
import time

from k8slib import APIError, label_match, now_rfc3339

NODE_NAME = "standin-node"
SVC_LABEL = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"


class LocalNode:
    """Scheduler + kubelet of one node. Binding: a pod created without
    spec.nodeName is bound to this node at once (the real scheduler would
    bind it moments later in a separate write). Termination: a graceful
    delete sets deletionTimestamp = now + grace and deletionGracePeriodSeconds,
    and the pod is removed when the grace period ends (the kubelet's final
    delete with grace 0), at once for grace 0, finished pods, or unbound
    pods, as the real pod registry does."""

    def __init__(self, store):
        self.store = store
        self.timers = {}

    def on_pod_create(self, pod):
        pod.setdefault("spec", {}).setdefault("nodeName", NODE_NAME)

    @staticmethod
    def effective_grace(cur, grace):
        """The grace period a delete gets, as the pod registry decides it:
        the request's, else the pod's, else 30 s; none for finished or
        unbound pods."""
        spec = cur.get("spec") or {}
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        try:
            grace = max(0, int(grace))
        except (TypeError, ValueError):
            grace = 30
        if (cur.get("status") or {}).get("phase") in ("Succeeded", "Failed") or not spec.get("nodeName"):
            grace = 0
        return grace

    def graceful_delete(self, t, cur, grace):
        st = self.store
        m = cur["metadata"]
        grace = self.effective_grace(cur, grace)
        if m.get("deletionTimestamp") and grace >= int(m.get("deletionGracePeriodSeconds") or 0) \
                and m.get("deletionGracePeriodSeconds"):
            return copy.deepcopy(cur), False
        if grace == 0 and not m.get("finalizers"):
            return st.remove(t, cur), True
        new = copy.deepcopy(cur)
        nm = new["metadata"]
        nm["deletionTimestamp"] = now_rfc3339(time.time() + grace)
        nm["deletionGracePeriodSeconds"] = grace
        st._commit(t, "MODIFIED", new, cur)
        if grace > 0:
            self._schedule(t, nm["namespace"], nm["name"], nm["uid"], grace)
        return copy.deepcopy(new), False

    def _schedule(self, t, ns, name, uid, grace):
        old = self.timers.pop(uid, None)
        if old:
            old.cancel()
        tm = threading.Timer(grace, self._terminated, (t, ns, name, uid))
        tm.daemon = True
        self.timers[uid] = tm
        tm.start()

    def _terminated(self, t, ns, name, uid):
        st = self.store
        with st.lock:
            self.timers.pop(uid, None)
            cur = st.objs[t.key].get((ns, name))
            if cur is None or cur["metadata"]["uid"] != uid:
                return
            if cur["metadata"].get("finalizers"):
                new = copy.deepcopy(cur)
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                st._commit(t, "MODIFIED", new, cur)
            else:
                st.remove(t, cur)


def _pod_ready(pod):
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


class EndpointSliceController:
    """Keeps EndpointSlices for every Service with a selector, as
    kube-controller-manager's endpointslice controller does: slices named
    <service>-<random5>, at most max_per_slice endpoints each, one slice
    per distinct resolved port set, a placeholder slice (no endpoints) for
    a service without any, and the conditions rule
    serving = pod Ready, terminating = deletionTimestamp set,
    ready = publishNotReadyAddresses || (serving && !terminating); each
    endpoint's nodeName, and zone from that node's
    topology.kubernetes.io/zone label."""

    KEYS = {("", "pods"), ("", "services"), ("discovery.k8s.io", "endpointslices")}

    def __init__(self, store, max_per_slice, log):
        self.store, self.max = store, max(1, max_per_slice)
        self.log = log
        self.wake = threading.Event()
        self.stop = False
        store.listeners.append(self._on_event)

    def _on_event(self, ev):
        if ev.key in self.KEYS:
            self.wake.set()

    def run(self):
        while not self.stop:
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self.reconcile()
            except Exception as e:  # keep the controller alive, like a real one
                self.log({"msg": "endpointslice controller error", "error": repr(e)})

    @staticmethod
    def _ports_for(svc, pod):
        out = []
        for p in (svc.get("spec") or {}).get("ports") or []:
            if not isinstance(p, dict):
                continue
            tp = p.get("targetPort", p.get("port"))
            num = None
            if isinstance(tp, int):
                num = tp
            elif isinstance(tp, str) and tp.isdigit():
                num = int(tp)
            elif isinstance(tp, str):
                for c in (pod.get("spec") or {}).get("containers") or []:
                    for cp in (c or {}).get("ports") or []:
                        if isinstance(cp, dict) and cp.get("name") == tp:
                            num = cp.get("containerPort")
            if num is None:
                continue
            e = {"name": p.get("name", ""), "port": num, "protocol": p.get("protocol", "TCP")}
            if p.get("appProtocol"):
                e["appProtocol"] = p["appProtocol"]
            out.append(e)
        return out

    def _endpoint(self, svc, pod, nodes):
        spec, m = pod.get("spec") or {}, pod["metadata"]
        serving = _pod_ready(pod)
        terminating = bool(m.get("deletionTimestamp"))
        publish = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
        ep = {"addresses": [pod["status"]["podIP"]],
              "conditions": {"ready": publish or (serving and not terminating),
                             "serving": serving, "terminating": terminating},
              "targetRef": {"kind": "Pod", "namespace": m["namespace"], "name": m["name"],
                            "uid": m["uid"]}}
        if spec.get("hostname") and spec.get("subdomain") == svc["metadata"]["name"]:
            ep["hostname"] = spec["hostname"]
        if spec.get("nodeName"):
            ep["nodeName"] = spec["nodeName"]
            # the real controller copies the node's zone label into the endpoint
            node = nodes.get(spec["nodeName"]) or {}
            zone = ((node.get("metadata") or {}).get("labels") or {}).get("topology.kubernetes.io/zone")
            if zone:
                ep["zone"] = zone
        return ep

    def reconcile(self):
        st = self.store
        with st.lock:
            t_sl = st.types[("discovery.k8s.io", "v1", "endpointslices")]
            svcs = list(st.objs[("", "services")].values())
            pods = list(st.objs[("", "pods")].values())
            nodes = {n["metadata"]["name"]: n for n in st.objs.get(("", "nodes"), {}).values()}
            slices = list(st.objs[t_sl.key].values())
            wanted = set()
            for svc in svcs:
                sel = (svc.get("spec") or {}).get("selector")
                if not isinstance(sel, dict) or not sel:
                    continue
                ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
                wanted.add((ns, name))
                reqs = [(k, "=", [v]) for k, v in sel.items()]
                groups = {}
                for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
                    pm = pod["metadata"]
                    if pm.get("namespace") != ns or not label_match(reqs, pm.get("labels")):
                        continue
                    if not (pod.get("status") or {}).get("podIP"):
                        continue
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    ports = self._ports_for(svc, pod)
                    groups.setdefault(json.dumps(ports, sort_keys=True), []).append(
                        self._endpoint(svc, pod, nodes))
                desired = []
                for pk in sorted(groups):
                    eps = groups[pk]
                    for i in range(0, len(eps), self.max):
                        desired.append((json.loads(pk), eps[i:i + self.max]))
                if not desired:
                    desired = [(None, None)]
                mine = sorted((s for s in slices
                               if s["metadata"].get("namespace") == ns
                               and (s["metadata"].get("labels") or {}).get(SVC_LABEL) == name
                               and (s["metadata"].get("labels") or {}).get(MANAGED_BY) == CONTROLLER),
                              key=lambda s: s["metadata"]["name"])
                labels = dict(svc["metadata"].get("labels") or {})
                labels[SVC_LABEL] = name
                labels[MANAGED_BY] = CONTROLLER
                owner = [{"apiVersion": "v1", "kind": "Service", "name": name,
                          "uid": svc["metadata"]["uid"], "controller": True,
                          "blockOwnerDeletion": True}]
                for i, (ports, eps) in enumerate(desired):
                    body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                            "metadata": {"generateName": name + "-", "namespace": ns,
                                         "labels": labels, "ownerReferences": owner},
                            "addressType": "IPv4", "endpoints": eps}
                    if ports is not None:
                        body["ports"] = ports
                    if i < len(mine):
                        cur = mine[i]
                        new = copy.deepcopy(cur)
                        new["metadata"]["labels"] = labels
                        new["metadata"]["ownerReferences"] = owner
                        new["addressType"], new["endpoints"] = "IPv4", eps
                        if ports is not None:
                            new["ports"] = ports
                        else:
                            new.pop("ports", None)
                        if new != cur:
                            st.update(t_sl, ns, cur["metadata"]["name"], new, require_rv=False)
                    else:
                        st.create(t_sl, ns, body)
                for extra in mine[len(desired):]:
                    st.remove(t_sl, extra)
            for s in slices:
                lb = s["metadata"].get("labels") or {}
                if lb.get(MANAGED_BY) == CONTROLLER and \
                        (s["metadata"].get("namespace"), lb.get(SVC_LABEL)) not in wanted:
                    try:
                        st.remove(t_sl, s)
                    except APIError:
                        pass


def record_event(store, obj, kind, reason, message, typ="Normal", component="", api_version="v1"):
    """A core/v1 Event about obj from a controller (no counting of
    repeats): cluster-scoped objects' Events live in "default", as the
    real recorders put them."""
    m = obj["metadata"]
    ns = m.get("namespace") or "default"
    now = now_rfc3339()
    ref = {"kind": kind, "name": m["name"], "uid": m.get("uid", ""), "apiVersion": api_version,
           "resourceVersion": m.get("resourceVersion", "")}
    if m.get("namespace"):
        ref["namespace"] = m["namespace"]
    try:
        with store.lock:
            store.create(store.types[("", "v1", "events")], ns, {
                "metadata": {"name": "%s.%x" % (m["name"], time.time_ns()), "namespace": ns},
                "involvedObject": ref, "reason": reason, "message": message,
                "source": {"component": component}, "firstTimestamp": now, "lastTimestamp": now,
                "count": 1, "type": typ, "eventTime": None, "reportingComponent": component,
                "reportingInstance": ""})
    except APIError:
        pass  # the namespace is going away


def gc_loop(store):
    """The garbage collector's thread: background deletion of dependents."""
    while True:
        store.gc_wake.wait(0.5)
        store.gc_wake.clear()
        if store.gc_step():
            time.sleep(0.05)
            store.gc_wake.set()
