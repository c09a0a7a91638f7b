"""kube-scheduler over the stand-in's nodes: 1.32's default profile reduced
to the filters the tests need, as plain functions that the scheduling
loop (run from the kubelet's thread) and the cluster autoscaler's
simulation (autoscaler.py) share.

Filters, in the framework's order; a node's status is that of the first
filter that rejects it, as RunFilterPlugins stops there:
  NodeUnschedulable  spec.unschedulable, unless the pod tolerates
                     node.kubernetes.io/unschedulable:NoSchedule
  TaintToleration    the node's first NoSchedule/NoExecute taint the pod
                     does not tolerate
  NodeAffinity       nodeSelector, then required nodeAffinity
                     (nodeSelectorTerms ORed; matchExpressions In, NotIn,
                     Exists, DoesNotExist, Gt, Lt; matchFields metadata.name)
  NodeResourcesFit   pod count against allocatable pods, nvidia.com/gpu
  PodTopologySpread  whenUnsatisfiable DoNotSchedule: maxSkew over the
                     domains of nodes that carry every constraint's key and
                     pass the pod's node affinity (nodeAffinityPolicy Honor,
                     nodeTaintsPolicy Ignore), counting matching pods of the
                     pod's namespace that are not terminating
  InterPodAffinity   required podAffinity (the first-of-a-group exception),
                     podAntiAffinity, and existing pods' anti-affinity
When none fits: the FitError message (a count per reason, sorted as the
real histogram) and the preemption post-filter's verdict per node. Among
fitting nodes: the fewest matching pods of ScheduleAnyway constraints,
then the fewest pods, then the name (deterministic; the real scores
differ). Terminal pods leave the cache, as in the real scheduler."""

import collections
import copy

from k8slib import node_selector_term_match, now_rfc3339, selector_match, tolerates

PODS, NODES = ("", "pods"), ("", "nodes")
GPU = "nvidia.com/gpu"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

R_UNSCHEDULABLE = "node(s) were unschedulable"
R_SELECTOR = "node(s) didn't match Pod's node affinity/selector"
R_SPREAD = "node(s) didn't match pod topology spread constraints"
R_SPREAD_LABEL = R_SPREAD + " (missing required label)"
R_AFFINITY = "node(s) didn't match pod affinity rules"
R_ANTI = "node(s) didn't match pod anti-affinity rules"
R_EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"


def is_terminal(pod):
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_gpus(pod):
    """nvidia.com/gpu the pod's containers ask for (limits, else requests)."""
    n = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        r = (c.get("resources") or {}) if isinstance(c, dict) else {}
        v = (r.get("limits") or {}).get(GPU) or (r.get("requests") or {}).get(GPU)
        try:
            n += int(v or 0)
        except (TypeError, ValueError):
            pass
    return n


def _labels(o):
    return o["metadata"].get("labels") or {}


def allocatable(node, res):
    try:
        return int(((node.get("status") or {}).get("allocatable") or {}).get(res) or 0)
    except (TypeError, ValueError):
        return 0


class Snapshot:
    """The scheduler cache for one pass: node objects by name, the
    non-terminal pods bound to each, the namespaces' labels. It holds
    references into the store: read under the store's lock only."""

    def __init__(self, nodes, pods, namespaces):
        self.nodes = {n["metadata"]["name"]: n for n in sorted(nodes, key=lambda n: n["metadata"]["name"])}
        self.on = {name: [] for name in self.nodes}
        for p in pods:
            nn = (p.get("spec") or {}).get("nodeName")
            if nn in self.on and not is_terminal(p):
                self.on[nn].append(p)
        self.ns_labels = {o["metadata"]["name"]: _labels(o) for o in namespaces}

    @classmethod
    def of(cls, store):
        with store.lock:
            return cls(store.objs[NODES].values(), store.objs[PODS].values(),
                       store.objs[("", "namespaces")].values())

    def assume(self, pod, node_name):
        """The pod as bound to the node, for the rest of the pass."""
        p = dict(pod)
        p["spec"] = dict(pod.get("spec") or {}, nodeName=node_name)
        self.on[node_name].append(p)

    def add_node(self, node):
        name = node["metadata"]["name"]
        self.nodes[name] = node
        self.on.setdefault(name, [])

    def drop_node(self, name):
        self.nodes.pop(name, None)
        return self.on.pop(name, [])


# ---- inter-pod terms --------------------------------------------------------------------

def _term_namespaces(term, owner_ns, snap):
    """namespaces + namespaceSelector ({} is every namespace); neither:
    the namespace of the pod that owns the term."""
    names = set(term.get("namespaces") or [])
    sel = term.get("namespaceSelector")
    if isinstance(sel, dict):
        names |= {ns for ns, lb in snap.ns_labels.items() if selector_match(sel, lb)}
    elif not names:
        names = {owner_ns}
    return names


def _term_matches(term, owner_ns, pod, snap):
    return pod["metadata"].get("namespace") in _term_namespaces(term, owner_ns, snap) and \
        selector_match(term.get("labelSelector"), _labels(pod))


def _required(pod, kind):
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return [t for t in aff.get("requiredDuringSchedulingIgnoredDuringExecution") or [] if isinstance(t, dict)]


class PodState:
    """What PreFilter computes once per pod and pass: its affinity terms
    and their counts per topology pair, existing pods' anti-affinity
    against it, the spread constraints' counts per domain."""

    def __init__(self, pod, snap):
        self.pod, self.ns = pod, pod["metadata"].get("namespace")
        spec = pod.get("spec") or {}
        self.tols = spec.get("tolerations") or []
        self.aff_terms = _required(pod, "podAffinity")
        self.anti_terms = _required(pod, "podAntiAffinity")
        tsc = [c for c in spec.get("topologySpreadConstraints") or [] if isinstance(c, dict)]
        self.hard = [c for c in tsc if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"]
        self.soft = [c for c in tsc if c.get("whenUnsatisfiable") == "ScheduleAnyway"]
        self.aff_counts, self.anti_counts, self.existing_anti = self._affinity_counts(snap)
        self.spread = [self._spread_counts(c, snap) for c in self.hard]

    def _affinity_counts(self, snap):
        aff, anti, existing = (collections.Counter() for _ in range(3))
        for name, pods in snap.on.items():
            labels = _labels(snap.nodes[name])
            for p in pods:
                if self.aff_terms and all(_term_matches(t, self.ns, p, snap) for t in self.aff_terms):
                    for t in self.aff_terms:
                        if t.get("topologyKey") in labels:
                            aff[(t["topologyKey"], labels[t["topologyKey"]])] += 1
                for t in self.anti_terms:
                    if t.get("topologyKey") in labels and _term_matches(t, self.ns, p, snap):
                        anti[(t["topologyKey"], labels[t["topologyKey"]])] += 1
                for t in _required(p, "podAntiAffinity"):
                    if t.get("topologyKey") in labels and \
                            _term_matches(t, p["metadata"].get("namespace"), self.pod, snap):
                        existing[(t["topologyKey"], labels[t["topologyKey"]])] += 1
        return aff, anti, existing

    def _spread_counts(self, c, snap):
        """Domain value -> matching pods, over the eligible nodes."""
        keys = [x.get("topologyKey") for x in self.hard]
        counts = collections.Counter()
        for name, node in snap.nodes.items():
            labels = _labels(node)
            if not all(k in labels for k in keys) or _node_affinity(self.pod, node):
                continue
            counts[labels[c["topologyKey"]]] += sum(1 for p in snap.on[name] if self._counts_for(c, p))
        return counts

    def _counts_for(self, c, p):
        return p["metadata"].get("namespace") == self.ns and not p["metadata"].get("deletionTimestamp") \
            and selector_match(c.get("labelSelector"), _labels(p))


# ---- the filters: None, or [(reason, unresolvable)] -------------------------------------

def _unschedulable(st, node, snap):
    if (node.get("spec") or {}).get("unschedulable") and not tolerates(st.tols, UNSCHEDULABLE_TAINT):
        return [(R_UNSCHEDULABLE, True)]
    return None


def _taints(st, node, snap):
    for taint in (node.get("spec") or {}).get("taints") or []:
        if isinstance(taint, dict) and taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not tolerates(st.tols, taint):
            return [("node(s) had untolerated taint {%s: %s}" % (taint.get("key"), taint.get("value") or ""),
                     True)]
    return None


def _node_affinity(pod, node):
    spec = pod.get("spec") or {}
    labels = _labels(node)
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return [(R_SELECTOR, True)]
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(req, dict) and not any(node_selector_term_match(t, node)
                                         for t in req.get("nodeSelectorTerms") or []):
        return [(R_SELECTOR, True)]
    return None


def _resources(st, node, snap):
    pods = snap.on[node["metadata"]["name"]]
    out = []
    if len(pods) + 1 > allocatable(node, "pods"):
        out.append(("Too many pods", False))
    g = pod_gpus(st.pod)
    if g and g > allocatable(node, GPU) - sum(pod_gpus(p) for p in pods):
        out.append(("Insufficient " + GPU, False))
    return out or None


def _spread(st, node, snap):
    labels = _labels(node)
    for c, counts in zip(st.hard, st.spread):
        k = c.get("topologyKey")
        if k not in labels:
            return [(R_SPREAD_LABEL, True)]
        self_match = 1 if selector_match(c.get("labelSelector"), _labels(st.pod)) else 0
        low = min(counts.values()) if counts else 0
        if counts.get(labels[k], 0) + self_match - low > int(c.get("maxSkew") or 1):
            return [(R_SPREAD, False)]
    return None


def _interpod(st, node, snap):
    labels = _labels(node)
    if st.aff_terms:
        if any(t.get("topologyKey") not in labels for t in st.aff_terms):
            return [(R_AFFINITY, True)]
        found = all(st.aff_counts[(t["topologyKey"], labels[t["topologyKey"]])] > 0 for t in st.aff_terms)
        # The first pod of a group with affinity to itself may go anywhere.
        first = not st.aff_counts and all(_term_matches(t, st.ns, st.pod, snap) for t in st.aff_terms)
        if not found and not first:
            return [(R_AFFINITY, True)]
    for t in st.anti_terms:
        if t.get("topologyKey") in labels and st.anti_counts[(t["topologyKey"], labels[t["topologyKey"]])] > 0:
            return [(R_ANTI, False)]
    if any(st.existing_anti[(k, v)] > 0 for k, v in labels.items()):
        return [(R_EXISTING_ANTI, False)]
    return None


FILTERS = (_unschedulable, _taints, lambda st, node, snap: _node_affinity(st.pod, node), _resources,
           _spread, _interpod)


def filter_node(st, node, snap):
    for f in FILTERS:
        r = f(st, node, snap)
        if r:
            return r
    return None


def feasible(pod, snap):
    """(PodState, fitting node names, {node: [(reason, unresolvable)]})."""
    st = PodState(pod, snap)
    ok, why = [], {}
    for name, node in snap.nodes.items():
        r = filter_node(st, node, snap)
        if r:
            why[name] = r
        else:
            ok.append(name)
    return st, ok, why


def _histogram(items):
    return ", ".join(sorted("%d %s" % (n, r) for r, n in collections.Counter(items).items()))


def fit_error(pod, n_nodes, why):
    """The PodScheduled False message: the filters' reasons counted over
    the nodes, then what the preemption post-filter found per node (no
    victims are ever chosen here: all pods are treated as equals)."""
    if n_nodes == 0:
        return "no nodes available to schedule pods"
    msg = "0/%d nodes are available: %s." % (n_nodes, _histogram(r for rs in why.values() for r, _ in rs))
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return msg + " preemption: not eligible due to preemptionPolicy=Never."
    pre = _histogram("Preemption is not helpful for scheduling" if any(u for _, u in rs)
                     else "No preemption victims found for incoming pod" for rs in why.values())
    return msg + " preemption: 0/%d nodes are available: %s." % (n_nodes, pre)


def _soft_score(st, name, snap):
    """Matching pods in the node's domain of each ScheduleAnyway constraint."""
    labels, score = _labels(snap.nodes[name]), 0
    for c in st.soft:
        k = c.get("topologyKey")
        if k not in labels:
            continue
        for other, node in snap.nodes.items():
            if _labels(node).get(k) == labels[k]:
                score += sum(1 for p in snap.on[other] if st._counts_for(c, p))
    return score


def pick(st, ok, snap):
    return min(ok, key=lambda n: (_soft_score(st, n, snap), len(snap.on[n]), n))


def waiting_pods(store):
    """Pods the default scheduler has to place, in its queue's order."""
    pods = [p for p in store.objs[PODS].values() if not (p.get("spec") or {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp") and not is_terminal(p)
            and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"]
    pods.sort(key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                             p["metadata"].get("creationTimestamp", ""), int(p["metadata"]["resourceVersion"])))
    return pods


# The PodTopologyLabels admission plugin's own keys (Kubernetes 1.35,
# beta): copied from the node onto the pod at binding, with the keys an
# admin configures beside them.
TOPOLOGY_LABELS = ("topology.k8s.io/zone", "topology.k8s.io/region")


def copy_topology_labels(pod, node, keys):
    """The binding's admission: the node's labels of those keys onto the
    pod (a label the node lacks is left alone), before any container
    starts, so the downward API sees them."""
    have = _labels(node)
    for k in TOPOLOGY_LABELS + tuple(keys):
        if k in have:
            pod.setdefault("metadata", {}).setdefault("labels", {})[k] = have[k]


class Scheduler:
    """The scheduling loop: one pass whenever the store changed. A pod is
    bound in a separate write (spec.nodeName + PodScheduled True, and the
    node's topology labels: copy_topology_labels), or its PodScheduled
    False condition and a FailedScheduling Event say why."""

    def __init__(self, store, event, topology_keys=()):
        self.store, self.event = store, event
        self.topology_keys = tuple(topology_keys)
        self.seen_rv = None

    def schedule(self):
        st = self.store
        with st.lock:
            if st.rv == self.seen_rv:
                return  # nothing changed since the last pass
            snap = Snapshot.of(st)
            for p in waiting_pods(st):
                self._one(p, snap)
            self.seen_rv = st.rv

    def _one(self, p, snap):
        st = self.store
        t = st.types[("", "v1", "pods")]
        state, ok, why = feasible(p, snap)
        new = copy.deepcopy(p)
        conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        old = next((c for c in (p.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"), None)
        if not ok:
            msg = fit_error(p, len(snap.nodes), why)
            if old and old.get("status") == "False" and old.get("message") == msg:
                return
            since = old.get("lastTransitionTime") if old and old.get("status") == "False" else now_rfc3339()
            conds.append({"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                          "lastTransitionTime": since, "reason": "Unschedulable", "message": msg})
            new.setdefault("status", {})["conditions"] = conds
            st._finish_update(t, p, new, False)
            self.event(p, "FailedScheduling", msg, "Warning", "default-scheduler")
            return
        node = pick(state, ok, snap)
        new["spec"]["nodeName"] = node
        copy_topology_labels(new, snap.nodes[node], self.topology_keys)
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": now_rfc3339()})
        new.setdefault("status", {})["conditions"] = conds
        st._finish_update(t, p, new, False)
        snap.assume(p, node)
        self.event(p, "Scheduled", "Successfully assigned %s/%s to %s"
                   % (p["metadata"]["namespace"], p["metadata"]["name"], node), component="default-scheduler")
