"""A small cluster autoscaler (--autoscaler MAX_NODES): cluster-autoscaler
1.32's loop over one node group, standin-pool, whose template is the
stand-in's node (nodes.py), between --nodes and MAX_NODES nodes. It runs
every 0.5 s (the real scan interval is 10 s).

Scale-up: pods that have been Unschedulable (PodScheduled False) for
--scale-up-delay seconds and would not fit any existing node (the
scheduler's own filters, scheduler.py, with the pods already placed in the
simulation) are bin-packed onto copies of the template; as many nodes as
that takes are added at once (up to MAX_NODES), and each pod that
triggered it gets an Event TriggeredScaleUp from cluster-autoscaler: "pod
triggered scale-up: [{standin-pool 1->2 (max: 3)}]". A pod the template
cannot take (or when the group is at its maximum) gets NotTriggerScaleUp:
"pod didn't trigger scale-up: 1 node(s) didn't match Pod's node
affinity/selector" / "... 1 max node group size reached" (at most every
30 s per pod). The scheduler then binds the pods to the new nodes.

Scale-down (only in a loop without scale-up): a node is unneeded when its
utilization is under 0.5 (nvidia.com/gpu requested of allocatable on a
GPU node, else its pods of its allocatable pods, standing in for cpu and
memory) and every pod on it can move: CA's drainability rules in their
order -- DaemonSet and mirror pods stay, safe-to-evict "true" moves; then
a pod whose controller is not a ReplicationController, Job, ReplicaSet or
StatefulSet blocks ("NS/NAME is not replicated"), as does a kube-system pod,
a pod annotated cluster-autoscaler.kubernetes.io/safe-to-evict "false" or
karpenter.sh/do-not-disrupt "true" (Karpenter's, honoured here too: "pod
annotated as not safe to evict present: NS/NAME"), a pod whose PDB has no
disruption left ("not enough pod disruption budget to move NS/NAME") --
and the scheduler finds each a place on the other nodes ("no place to move
pods"). Nodes annotated cluster-autoscaler.kubernetes.io/scale-down-disabled
(the --nodes ones) and nodes not Ready are never removed, nor any below
--nodes. A node unneeded for --scale-down-unneeded seconds is tainted
ToBeDeletedByClusterAutoscaler:NoSchedule and emptied through the eviction
API (Events ScaleDown on node and pods; ScaleDownEmpty for an empty node);
once its pods are gone its Node is deleted (the machine with it). An
eviction refused (a PDB) aborts it at once: Warning ScaleDownFailed "failed
to drain the node, aborting ScaleDown" on the node, the taint removed (the
real one retries evictions for up to 2 min first). Why a node is not
removed: the admin GET /nodes ("unremovable") and the log."""

import copy
import time

from controllers import record_event
from disruption import PDBS, pdb_selects, controller_ref, evict
from k8slib import APIError
from nodes import SCALE_DOWN_DISABLED, node_index
from scheduler import GPU, Snapshot, allocatable, feasible, filter_node, PodState, pick, pod_gpus, waiting_pods

GROUP = "standin-pool"
LOOP = 0.5
UTILIZATION = 0.5
TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
SAFE = "cluster-autoscaler.kubernetes.io/safe-to-evict"
KARPENTER = "karpenter.sh/do-not-disrupt"
REPLICATED = ("ReplicationController", "Job", "ReplicaSet", "StatefulSet")
NOTE_EVERY = 30.0
DELAY_AFTER_FAILURE = 180.0  # --scale-down-delay-after-failure


def _unschedulable(pod):
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable" for c in (pod.get("status") or {}).get("conditions") or [])


def _key(pod):
    return "%s/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"])


def _stays(pod):
    """DaemonSet and mirror pods neither block nor move."""
    ref = controller_ref(pod) or {}
    ann = pod["metadata"].get("annotations") or {}
    return ref.get("kind") == "DaemonSet" or "kubernetes.io/config.mirror" in ann


def _untaint(node):
    node["spec"]["taints"] = [t for t in node["spec"].get("taints") or [] if t.get("key") != TO_BE_DELETED]
    if not node["spec"]["taints"]:
        del node["spec"]["taints"]


class Autoscaler:
    def __init__(self, store, cluster, args, log):
        self.store, self.cluster, self.log = store, cluster, log
        self.max = max(args.autoscaler, cluster.min_nodes)
        self.delay = args.scale_up_delay
        self.unneeded_for = args.scale_down_unneeded
        self.first_seen = {}   # pod uid -> monotonic time it was first seen unschedulable
        self.noted = {}        # pod uid -> (message, monotonic time) of its last NotTriggerScaleUp
        self.unneeded = {}     # node -> monotonic time since it is unneeded
        self.unremovable = {}  # node -> why not
        self.draining = {}     # node -> its uid, while its pods go
        self.failed = {}       # node -> (why, monotonic time) of its last failed scale-down

    def run(self):
        while True:
            time.sleep(LOOP)
            try:
                with self.store.lock:
                    if not self.scale_up():
                        self.scale_down()
                    self.finish_drains()
            except Exception as e:  # keep it alive, like the real one
                import traceback
                self.log({"msg": "autoscaler error", "error": repr(e), "trace": traceback.format_exc()[-1500:]})

    # -- scale-up -----------------------------------------------------------------------------
    def scale_up(self):
        st, now = self.store, time.monotonic()
        snap = Snapshot.of(st)
        pending = [p for p in waiting_pods(st) if _unschedulable(p)]
        self.first_seen = {p["metadata"]["uid"]: self.first_seen.get(p["metadata"]["uid"], now) for p in pending}
        due = [p for p in pending if now - self.first_seen[p["metadata"]["uid"]] >= self.delay]
        due = [p for p in due if not self._fits_existing(p, snap)]
        if not due:
            return False
        size = len(snap.nodes)
        added, placed, refused = self._binpack(due, snap, max(0, self.max - size))
        for p, why in refused:
            self._note(p, "pod didn't trigger scale-up: " + why)
        if not added:
            return False
        for _ in added:
            self.cluster.add()
        msg = "pod triggered scale-up: [{%s %d->%d (max: %d)}]" % (GROUP, size, size + len(added), self.max)
        for p in placed:
            record_event(st, p, "Pod", "TriggeredScaleUp", msg, "Normal", "cluster-autoscaler")
        self.log({"msg": "autoscaler: scale-up", "group": GROUP, "from": size, "to": size + len(added),
                  "nodes": [n["metadata"]["name"] for n in added], "pods": [_key(p) for p in placed]})
        return True

    @staticmethod
    def _fits_existing(pod, snap):
        """FilterOutSchedulable: a pod the scheduler can place now needs no
        node; it holds its place in the simulation."""
        state, ok, _ = feasible(pod, snap)
        if ok:
            snap.assume(pod, pick(state, ok, snap))
        return bool(ok)

    def _binpack(self, pods, snap, room):
        """The pods on as few new template nodes as they fit (first fit)."""
        planned = self.cluster.planned(room)
        added, placed, refused = [], [], []
        for p in pods:
            names = [n["metadata"]["name"] for n in added]
            state, ok, _ = feasible(p, snap)
            fits = [n for n in ok if n in names]
            if fits:
                snap.assume(p, pick(state, fits, snap))
                placed.append(p)
                continue
            if len(added) == len(planned):
                refused.append((p, "1 max node group size reached"))
                continue
            node = planned[len(added)]
            snap.add_node(node)
            why = filter_node(PodState(p, snap), node, snap)
            if why:
                snap.drop_node(node["metadata"]["name"])
                refused.append((p, ", ".join(sorted("1 " + r for r, _ in why))))
                continue
            added.append(node)
            snap.assume(p, node["metadata"]["name"])
            placed.append(p)
        return added, placed, refused

    def _note(self, pod, msg):
        uid, now = pod["metadata"]["uid"], time.monotonic()
        last = self.noted.get(uid)
        if last and last[0] == msg and now - last[1] < NOTE_EVERY:
            return
        self.noted[uid] = (msg, now)
        record_event(self.store, pod, "Pod", "NotTriggerScaleUp", msg, "Normal", "cluster-autoscaler")

    # -- scale-down ---------------------------------------------------------------------------
    def scale_down(self):
        st, now = self.store, time.monotonic()
        names = sorted(Snapshot.of(st).nodes, key=lambda n: (node_index(n) is None, node_index(n) or 0))
        budgets = {p["metadata"]["uid"]: int((p.get("status") or {}).get("disruptionsAllowed") or 0)
                   for p in st.objs[PDBS].values()}
        before, self.unremovable = self.unremovable, {}
        for name in names:
            if name in self.draining:
                continue
            why, movable, used = self._removable(name, budgets)
            if why:
                self.unneeded.pop(name, None)
                self.unremovable[name] = why
                if before.get(name) != why:  # as CA logs it, once per change here
                    self.log({"msg": "autoscaler: node cannot be removed", "node": name, "reason": why})
                continue
            since = self.unneeded.setdefault(name, now)
            if now - since >= self.unneeded_for and len(names) - len(self.draining) > self.cluster.min_nodes:
                for uid, n in used.items():
                    budgets[uid] -= n
                self._start_drain(name, movable)
                return
        self.unneeded = {n: t for n, t in self.unneeded.items() if n in names}

    def _removable(self, name, budgets):
        """(why not or None, pods to evict, PDB disruptions they use)."""
        snap = Snapshot.of(self.store)
        node = snap.nodes[name]
        failed = self.failed.get(name)
        if failed and time.monotonic() - failed[1] < DELAY_AFTER_FAILURE:
            return failed[0], [], {}
        if (node["metadata"].get("annotations") or {}).get(SCALE_DOWN_DISABLED) == "true":
            return "scale down is disabled for the node (annotation %s)" % SCALE_DOWN_DISABLED, [], {}
        if not any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (node.get("status") or {}).get("conditions") or []):
            return "node is not ready", [], {}
        pods = [p for p in snap.on[name] if not _stays(p)]
        util, res = self._utilization(node, pods)
        if util >= UTILIZATION:
            return "%s requested (%.6g%% of allocatable) is above the scale-down utilization threshold" \
                % (res, util * 100), [], {}
        used = {}
        for p in pods:
            why = self._blocked(p, budgets, used)
            if why:
                return why, [], {}
        if not self._fit_elsewhere(name, pods, snap):
            return "no place to move pods", [], {}
        return None, pods, used

    @staticmethod
    def _utilization(node, pods):
        if allocatable(node, GPU) > 0:
            return sum(pod_gpus(p) for p in pods) / allocatable(node, GPU), GPU
        return len(pods) / max(1, allocatable(node, "pods")), "pods"

    def _blocked(self, pod, budgets, used):
        """CA's drainability rules for one pod (see the module's doc)."""
        ann = pod["metadata"].get("annotations") or {}
        if ann.get(KARPENTER) == "true":
            return "pod annotated as not safe to evict present: " + _key(pod)
        if ann.get(SAFE) == "true":
            return None
        ref = controller_ref(pod)
        if ref is None or ref.get("kind") not in REPLICATED:
            return "%s is not replicated" % _key(pod)
        pdbs = [p for p in self.store.objs[PDBS].values() if pdb_selects(p, pod, True)]
        if pod["metadata"]["namespace"] == "kube-system" and not pdbs:
            return "non-daemonset, non-mirrored, non-pdb-assigned kube-system pod present: " + _key(pod)
        if ann.get(SAFE) == "false":
            return "pod annotated as not safe to evict present: " + _key(pod)
        for pdb in pdbs:
            uid = pdb["metadata"]["uid"]
            if budgets.get(uid, 0) - used.get(uid, 0) < 1:
                return "not enough pod disruption budget to move " + _key(pod)
            used[uid] = used.get(uid, 0) + 1
        return None

    def _fit_elsewhere(self, name, pods, snap):
        snap.drop_node(name)
        for other in list(self.draining):
            snap.drop_node(other)
        for p in pods:
            q = copy.deepcopy(p)
            q["spec"].pop("nodeName", None)
            state, ok, _ = feasible(q, snap)
            if not ok:
                return False
            snap.assume(q, pick(state, ok, snap))
        return True

    def _start_drain(self, name, pods):
        node = self.cluster.get(name)
        self.cluster.write(name, lambda n: n.setdefault("spec", {}).setdefault("taints", []).append(
            {"key": TO_BE_DELETED, "value": str(int(time.time())), "effect": "NoSchedule"}))
        self.draining[name] = node["metadata"]["uid"]
        self.unneeded.pop(name, None)
        self.log({"msg": "autoscaler: scale-down", "node": name, "pods": [_key(p) for p in pods]})
        if not pods:
            record_event(self.store, node, "Node", "ScaleDownEmpty",
                         'Scale-down: removing empty node "%s"' % name, "Normal", "cluster-autoscaler")
            return
        record_event(self.store, node, "Node", "ScaleDown", "marked the node as toBeDeleted/unschedulable",
                     "Normal", "cluster-autoscaler")
        for p in pods:
            try:
                evict(self.store, p["metadata"]["namespace"], p["metadata"]["name"],
                      {"metadata": {"name": p["metadata"]["name"]}})
            except APIError as e:
                if e.code == 404:
                    continue
                return self._abort(name, node, p, e)
            record_event(self.store, p, "Pod", "ScaleDown", "deleting pod for node scale down", "Normal",
                         "cluster-autoscaler")

    def _abort(self, name, node, pod, err):
        self.draining.pop(name, None)
        self.cluster.write(name, _untaint)
        record_event(self.store, node, "Node", "ScaleDownFailed", "failed to drain the node, aborting ScaleDown",
                     "Warning", "cluster-autoscaler")
        self.failed[name] = ("failed to evict pod %s: %s" % (_key(pod), err.message), time.monotonic())
        self.log({"msg": "autoscaler: scale-down failed", "node": name, "pod": _key(pod), "error": err.message})

    def finish_drains(self):
        """A draining node whose pods are gone is deleted (the machine too)."""
        st = self.store
        for name, uid in list(self.draining.items()):
            left = [p for p in st.objs[("", "pods")].values() if (p.get("spec") or {}).get("nodeName") == name
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not _stays(p)]
            if left:
                continue
            self.draining.pop(name)
            if self.cluster.delete(name, uid):
                self.log({"msg": "autoscaler: node removed", "node": name})

    # -- admin GET /nodes -----------------------------------------------------------------------
    def describe(self, name):
        now = time.monotonic()
        since = self.unneeded.get(name)
        return {"unneededFor": round(now - since, 1) if since is not None else None,
                "unremovable": self.unremovable.get(name), "draining": name in self.draining}
