"""The stand-in's nodes as core/v1 Node objects, and the controllers that
act on them in a real cluster.

  - Cluster: --nodes N registers N nodes at start (standin-node, then
    standin-node-1, ...), each a copy of one template: --max-pods (the
    allocatable pods; the kubelet's default 110), --gpus (nvidia.com/gpu,
    present only when > 0), the kubelet's well-known labels,
    kubernetes.io/hostname = the name, topology.kubernetes.io/zone from
    --zones (round-robin), a rack label (--rack-label, from --racks: node i
    takes racks[(i // zones) % racks], so a zone holds several racks), the
    --node-label labels; InternalIP 127.0.0.1
    for the first node and 127.0.0.(K+1) for standin-node-K. Deleting a
    Node object is losing the machine: its processes are killed and its
    pods are left to PodGC. Node names are never reused. With --autoscaler
    the --nodes ones are annotated cluster-autoscaler.kubernetes.io/
    scale-down-disabled: it removes only nodes it added.
  - reclaim (admin POST /nodes/NAME/reclaim): a spot interruption notice:
    cordoned, tainted karpenter.sh/disrupted:NoSchedule and Ready False
    ("node is shutting down") at once, its pods stopped by the kubelet's
    graceful node shutdown (kubelet.py), the Node deleted after the notice.
  - NodeLifecycle: the node lifecycle controller's taints by condition
    (node.kubernetes.io/unschedulable:NoSchedule while cordoned,
    node.kubernetes.io/not-ready:NoSchedule while not Ready) and PodGC's
    orphan collection: a pod bound to a node that no longer exists gets
    phase Failed and DisruptionTarget True (DeletionByPodGC, "PodGC: node
    no longer exists") unless it is terminal, then a delete with grace 0.
    The real PodGC waits for the node to be missing 40 s (quarantine) and
    runs every 20 s; here 1 s and 0.5 s."""

import copy
import os
import platform
import threading
import time

from controllers import NODE_NAME
from k8slib import APIError, now_rfc3339

NODES, PODS = ("", "nodes"), ("", "pods")
GPU = "nvidia.com/gpu"
DEFAULT_MAX_PODS = 110  # the kubelet's --max-pods
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NOT_READY = "node.kubernetes.io/not-ready"
DISRUPTED = "karpenter.sh/disrupted"
PODGC_QUARANTINE = 1.0


def node_name(i):
    return NODE_NAME if i == 0 else "%s-%d" % (NODE_NAME, i)


def node_index(name):
    """standin-node -> 0, standin-node-K -> K, anything else -> None."""
    if name == NODE_NAME:
        return 0
    head, _, tail = name.rpartition("-")
    return int(tail) if head == NODE_NAME and tail.isdigit() else None


def _memory_kib():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    except (ValueError, OSError):
        return 1 << 20


def _cond(typ, status, reason, message, t):
    return {"type": typ, "status": status, "lastHeartbeatTime": t, "lastTransitionTime": t,
            "reason": reason, "message": message}


class NodeTemplate:
    """What every node of the stand-in is made of (the autoscaler's node
    group template too)."""

    def __init__(self, args):
        self.max_pods = args.max_pods if args.max_pods is not None else DEFAULT_MAX_PODS
        self.gpus = args.gpus or 0
        self.zones = [z for z in (args.zones or "").split(",") if z]
        self.racks = [r for r in (args.racks or "").split(",") if r]
        self.rack_label = args.rack_label
        self.labels = {}
        for kv in args.node_label or []:
            k, _, v = kv.partition("=")
            self.labels[k] = v

    def zone(self, i):
        return self.zones[i % len(self.zones)] if self.zones else None

    def rack(self, i):
        return self.racks[(i // max(1, len(self.zones))) % len(self.racks)] if self.racks else None

    def build(self, i, static_annotation=False):
        name = node_name(i)
        labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        if self.zone(i):
            labels["topology.kubernetes.io/zone"] = self.zone(i)
        if self.rack(i):
            labels[self.rack_label] = self.rack(i)
        labels.update(self.labels)
        meta = {"name": name, "labels": labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}
        if static_annotation:
            meta["annotations"][SCALE_DOWN_DISABLED] = "true"
        cap = {"cpu": str(os.cpu_count() or 1), "memory": "%dKi" % _memory_kib(),
               "ephemeral-storage": "10Gi", "pods": str(self.max_pods)}
        if self.gpus > 0:
            cap[GPU] = str(self.gpus)
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                "spec": {"providerID": "standin://" + name},
                "status": {"capacity": cap, "allocatable": dict(cap), "conditions": self._conditions(),
                           "addresses": [{"type": "InternalIP", "address": "127.0.0.%d" % (i + 1)},
                                         {"type": "Hostname", "address": name}],
                           "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                           "nodeInfo": self._info(name)}}

    @staticmethod
    def _conditions():
        t = now_rfc3339()
        return [_cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory "
                      "available", t),
                _cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", t),
                _cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available",
                      t),
                _cond("Ready", "True", "KubeletReady", "kubelet is posting ready status", t)]

    @staticmethod
    def _info(name):
        return {"machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": platform.release(),
                "osImage": "standin (local processes)", "containerRuntimeVersion": "standin://1.32.0",
                "kubeletVersion": "v1.32.0-standin", "kubeProxyVersion": "v1.32.0-standin",
                "operatingSystem": "linux", "architecture": "amd64"}


class Cluster:
    """The machines: node objects in the store, added at start, by the
    autoscaler, gone when deleted (by the autoscaler, a reclaim or kubectl)."""

    def __init__(self, store, args, log):
        self.store, self.log = store, log
        self.tmpl = NodeTemplate(args)
        self.min_nodes = max(1, args.nodes)
        self.next_index = self.min_nodes
        self.kubelet = None   # set by the App when pods run (reclaim needs it)
        for i in range(self.min_nodes):
            self._register(self.tmpl.build(i, static_annotation=bool(args.autoscaler)))

    def _register(self, node):
        st = self.store
        st.create(st.types[("", "v1", "nodes")], None, node)
        self.log({"msg": "node registered", "node": node["metadata"]["name"]})

    def add(self):
        """A new machine from the template, as the cloud provider would
        make it for the autoscaler. Returns its name."""
        with self.store.lock:
            i = self.next_index
            self.next_index += 1
            self._register(self.tmpl.build(i))
        return node_name(i)

    def planned(self, k):
        """The node objects the next k add() calls would make (simulation)."""
        return [self.tmpl.build(self.next_index + j) for j in range(k)]

    def get(self, name):
        with self.store.lock:
            n = self.store.objs[NODES].get(("", name))
            return copy.deepcopy(n) if n is not None else None

    def names(self):
        with self.store.lock:
            return sorted(n for _, n in self.store.objs[NODES])

    def host_ip(self, name):
        n = self.get(name)
        for a in ((n or {}).get("status") or {}).get("addresses") or []:
            if a.get("type") == "InternalIP":
                return a.get("address")
        return "127.0.0.1"

    def write(self, name, change, status=False):
        """Read-modify-write of a node (change mutates a copy); False if gone."""
        st = self.store
        t = st.types[("", "v1", "nodes")]
        with st.lock:
            cur = st.objs[NODES].get(("", name))
            if cur is None:
                return False
            new = copy.deepcopy(cur)
            change(new)
            if new != cur:
                st.update(t, None, name, new, sub="status" if status else None, require_rv=False)
            return True

    def set_max_pods(self, name, n):
        def change(node):
            for k in ("capacity", "allocatable"):
                node["status"][k]["pods"] = str(DEFAULT_MAX_PODS if n is None else int(n))
        return self.write(name, change, status=True)

    def delete(self, name, uid=None):
        """The machine is gone: its Node object goes (pods stay for PodGC)."""
        st = self.store
        with st.lock:
            cur = st.objs[NODES].get(("", name))
            if cur is None or (uid and cur["metadata"]["uid"] != uid):
                return False
            st.remove(st.types[("", "v1", "nodes")], cur)
        self.log({"msg": "node deleted", "node": name})
        return True

    # -- spot reclaim ------------------------------------------------------------------------
    def reclaim(self, name, notice):
        """A spot interruption notice: cordon + taint + NotReady now, the
        kubelet's graceful node shutdown, the machine gone after notice s."""
        if self.kubelet is None:
            raise APIError(409, "Conflict", "no kubelet (start the stand-in with --kubelet)")
        node = self.get(name)
        if node is None:
            raise APIError(404, "NotFound", 'nodes "%s" not found' % name, {"name": name, "kind": "nodes"})
        notice = max(0.0, float(notice))
        self.write(name, lambda n: _cordon_and_taint(n, DISRUPTED))
        self.write(name, _shutting_down, status=True)
        self.kubelet.shutdown_node(name, notice)
        tm = threading.Timer(notice, self.delete, (name, node["metadata"]["uid"]))
        tm.daemon = True
        tm.start()
        self.log({"msg": "node reclaim notice", "node": name, "notice": notice})
        return {"node": name, "notice": notice}

    # -- admin GET /nodes --------------------------------------------------------------------
    def describe(self):
        st = self.store
        with st.lock:
            nodes = [copy.deepcopy(n) for _, n in sorted(st.objs[NODES].items())]
            pods = list(st.objs[PODS].values())
        out = []
        for n in nodes:
            name, spec = n["metadata"]["name"], n.get("spec") or {}
            mine = sorted("%s/%s" % (p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods
                          if (p.get("spec") or {}).get("nodeName") == name)
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or [])
            out.append({"name": name, "hostIP": self.host_ip(name),
                        "zone": (n["metadata"].get("labels") or {}).get("topology.kubernetes.io/zone"),
                        "cordoned": bool(spec.get("unschedulable")), "ready": ready,
                        "taints": spec.get("taints") or [], "pods": mine,
                        "maxPods": int((n.get("status") or {}).get("allocatable", {}).get("pods") or 0)})
        return out


def _cordon_and_taint(node, key):
    spec = node.setdefault("spec", {})
    spec["unschedulable"] = True
    taints = spec.setdefault("taints", [])
    if not any(t.get("key") == key for t in taints):
        taints.append({"key": key, "effect": "NoSchedule"})


def _shutting_down(node):
    for c in node["status"].get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "False":
            c.update(status="False", reason="KubeletNotReady", message="node is shutting down",
                     lastTransitionTime=now_rfc3339(), lastHeartbeatTime=now_rfc3339())


# ---- node lifecycle controller + PodGC -------------------------------------------------------

def _condition_taints(node):
    """The taints the node lifecycle controller keeps by the node's state."""
    want = []
    if (node.get("spec") or {}).get("unschedulable"):
        want.append({"key": UNSCHEDULABLE, "effect": "NoSchedule"})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    if not ready:
        want.append({"key": NOT_READY, "effect": "NoSchedule"})
    return want


class NodeLifecycle:
    def __init__(self, store, log):
        self.store, self.log = store, log
        self.wake = threading.Event()
        self.missing = {}  # node name -> monotonic time it was first seen missing
        store.listeners.append(self._on_event)

    def _on_event(self, ev):
        if ev.key in (NODES, PODS):
            self.wake.set()

    def run(self):
        while True:
            self.wake.wait(0.5)
            self.wake.clear()
            try:
                self.taint_by_condition()
                self.gc_orphans()
            except Exception as e:  # keep the controller alive, like a real one
                self.log({"msg": "node lifecycle error", "error": repr(e)})

    def taint_by_condition(self):
        st = self.store
        t = st.types[("", "v1", "nodes")]
        with st.lock:
            for cur in list(st.objs[NODES].values()):
                taints = (cur.get("spec") or {}).get("taints") or []
                keep = [x for x in taints if x.get("key") not in (UNSCHEDULABLE, NOT_READY)]
                want = keep + _condition_taints(cur)
                if [(x.get("key"), x.get("effect")) for x in want] == \
                        [(x.get("key"), x.get("effect")) for x in taints]:
                    continue
                new = copy.deepcopy(cur)
                have = {(x.get("key"), x.get("effect")): x for x in taints}
                want = [have.get((x["key"], x["effect"])) or dict(x, timeAdded=now_rfc3339()) for x in want]
                if want:
                    new.setdefault("spec", {})["taints"] = want
                else:
                    new.get("spec", {}).pop("taints", None)
                st.update(t, None, cur["metadata"]["name"], new, require_rv=False)

    def gc_orphans(self):
        st = self.store
        now = time.monotonic()
        with st.lock:
            have = {n for _, n in st.objs[NODES]}
            bound = {}
            for p in st.objs[PODS].values():
                nn = (p.get("spec") or {}).get("nodeName")
                if nn and nn not in have:
                    bound.setdefault(nn, []).append(p)
            self.missing = {nn: self.missing.get(nn, now) for nn in bound}
            for nn, pods in bound.items():
                if now - self.missing[nn] >= PODGC_QUARANTINE:
                    for p in pods:
                        self._force_delete(p)

    def _force_delete(self, pod):
        st = self.store
        t = st.types[("", "v1", "pods")]
        m = pod["metadata"]
        if m.get("deletionTimestamp") and m.get("deletionGracePeriodSeconds") == 0:
            return  # deleted already; finalizers keep it
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            new = copy.deepcopy(pod)
            s = new.setdefault("status", {})
            s["phase"] = "Failed"
            conds = [c for c in s.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339(), "reason": "DeletionByPodGC",
                          "message": "PodGC: node no longer exists"})
            s["conditions"] = conds
            st._finish_update(t, pod, new, False)
        try:
            st.delete(t, m["namespace"], m["name"], {"gracePeriodSeconds": 0})
        except APIError:
            return
        self.log({"msg": "podgc: forced deletion of orphaned pod", "pod": "%s/%s" % (m["namespace"], m["name"]),
                  "node": (pod.get("spec") or {}).get("nodeName")})
