"""The stand-in's object store: resource types (built-in and from CRDs),
one global resourceVersion counter, the event history that watches and
exact LISTs read, and the write rules of the real API server (409s,
generation, status/scale subresources, finalizers, graceful pod deletion,
garbage collection). One lock guards it all; a Condition wakes watchers."""

import base64
import collections
import copy
import datetime
import json
import random
import threading
import time
import re
import uuid

import podsecurity
import schema
from k8slib import (APIError, DNS1123_SUB, bad_request, human_duration, jsonpath,
                    now_rfc3339, parse_rfc3339)


class ResType:
    def __init__(self, group, version, plural, singular, kind, namespaced, short=(),
                 status=False, scale=None, generation=False, categories=(), crd=None,
                 columns=None, fields=(), schema=None, verbs=None):
        self.group, self.version, self.plural = group, version, plural
        self.singular, self.kind, self.namespaced = singular, kind, namespaced
        self.short, self.status, self.scale = list(short), status, scale
        self.generation, self.categories, self.crd = generation, list(categories), crd
        self.columns = columns  # CRD additionalPrinterColumns, None for built-ins
        self.fields = ("metadata.name", "metadata.namespace") + tuple(fields)
        self.schema = schema    # a CRD version's openAPIV3Schema
        self.verbs = verbs      # discovery verbs when not the usual eight

    @property
    def gv(self):
        return self.version if self.group == "" else self.group + "/" + self.version

    @property
    def key(self):  # storage key: every served version of a CRD shares it
        return (self.group, self.plural)

    @property
    def qualified(self):  # the "leases.coordination.k8s.io" of error messages
        return self.plural if self.group == "" else self.plural + "." + self.group

    def details(self, name):
        d = {"name": name, "kind": self.plural}
        if self.group:
            d["group"] = self.group
        return d


MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")

DEPLOY_SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": None}

BUILTINS = [
    ResType("", "v1", "namespaces", "namespace", "Namespace", False, ["ns"], status=True,
            fields=("status.phase",)),
    ResType("", "v1", "pods", "pod", "Pod", True, ["po"], status=True, categories=["all"],
            fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                    "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                    "status.podIP", "status.nominatedNodeName")),
    ResType("", "v1", "nodes", "node", "Node", False, ["no"], status=True, fields=("spec.unschedulable",)),
    ResType("", "v1", "services", "service", "Service", True, ["svc"], status=True,
            categories=["all"], fields=("spec.clusterIP", "spec.type")),
    ResType("", "v1", "secrets", "secret", "Secret", True, fields=("type",)),
    ResType("", "v1", "configmaps", "configmap", "ConfigMap", True, ["cm"]),
    ResType("", "v1", "events", "event", "Event", True, ["ev"],
            fields=("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                    "involvedObject.uid", "involvedObject.apiVersion",
                    "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                    "reportingComponent", "source", "type")),
    ResType("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", True, ["sa"]),
    ResType("coordination.k8s.io", "v1", "leases", "lease", "Lease", True),
    ResType("discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice", True),
    ResType("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", True, ["pdb"],
            status=True, generation=True),
    ResType("networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", True, ["netpol"]),
    ResType("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", True),
    ResType("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", True),
    ResType("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", False),
    ResType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding",
            "ClusterRoleBinding", False),
    ResType("apps", "v1", "deployments", "deployment", "Deployment", True, ["deploy"],
            status=True, scale=DEPLOY_SCALE, generation=True, categories=["all"]),
    ResType("events.k8s.io", "v1", "events", "event", "Event", True, ["ev"]),
    ResType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
            "CustomResourceDefinition", False, ["crd", "crds"], status=True, generation=True,
            categories=["api-extensions"]),
    ResType("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "", "SelfSubjectAccessReview",
            False, verbs=["create"]),
]

GROUP_ORDER = ["", "apps", "events.k8s.io", "authorization.k8s.io", "networking.k8s.io", "rbac.authorization.k8s.io",
               "coordination.k8s.io", "discovery.k8s.io", "apiextensions.k8s.io"]

def _age(o):
    ts = parse_rfc3339(o["metadata"].get("creationTimestamp"))
    return human_duration(time.time() - ts) if ts is not None else "<unknown>"


def _pod_ready(o):
    """READY: the containers and (1.29+) the native sidecars among the init containers."""
    st, spec = o.get("status") or {}, o.get("spec") or {}
    sidecars = {c.get("name") for c in spec.get("initContainers") or []
                if isinstance(c, dict) and c.get("restartPolicy") == "Always"}
    cs = (st.get("containerStatuses") or []) + [c for c in st.get("initContainerStatuses") or []
                                                if c.get("name") in sidecars]
    n = len(spec.get("containers") or []) + len(sidecars)
    return "%d/%d" % (sum(1 for c in cs if c.get("ready")), n)


def _pod_status(o):
    """The STATUS column of the real pod printer: the pod's reason, else a
    container's waiting or terminated reason (ExitCode:N without one)."""
    st = o.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    running = False
    for c in reversed(st.get("containerStatuses") or []):
        s = c.get("state") or {}
        if (s.get("waiting") or {}).get("reason"):
            reason = s["waiting"]["reason"]
        elif "terminated" in s:
            t = s["terminated"]
            reason = t.get("reason") or ("Signal:%d" % t["signal"] if t.get("signal")
                                         else "ExitCode:%d" % t.get("exitCode", 0))
        elif "running" in s and c.get("ready"):
            running = True
    if reason == "Completed" and running:
        reason = "Running"
    if o["metadata"].get("deletionTimestamp"):
        if st.get("reason") == "NodeLost":
            return "Unknown"
        if st.get("phase") not in ("Succeeded", "Failed"):
            return "Terminating"
    return reason


def _qos(spec):
    """The pod's QoS class: Guaranteed when every container has cpu and
    memory limits equal to its requests, BestEffort when none has any."""
    cs = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    any_set, guaranteed = False, True
    for c in cs:
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        if any(k in req or k in lim for k in ("cpu", "memory")):
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or str(req.get(k, lim[k])) != str(lim[k]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _pod_restarts(o):
    n, last = 0, None
    for c in (o.get("status") or {}).get("containerStatuses") or []:
        n += c.get("restartCount", 0)
        ts = parse_rfc3339(((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        if ts is not None and (last is None or ts > last):
            last = ts
    if n and last is not None:
        return "%d (%s ago)" % (n, human_duration(time.time() - last))
    return str(n)


def _node_status(o):
    """STATUS of the real node printer: the Ready condition, then
    SchedulingDisabled when cordoned."""
    ready = next((c.get("status") for c in (o.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), None)
    out = {"True": "Ready", "False": "NotReady"}.get(ready, "Unknown")
    return out + (",SchedulingDisabled" if (o.get("spec") or {}).get("unschedulable") else "")


def _node_roles(o):
    roles = sorted(k.split("/", 1)[1] for k in (o["metadata"].get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/") and k.split("/", 1)[1])
    return ",".join(roles) or "<none>"


def _node_ip(o):
    return next((a.get("address") for a in (o.get("status") or {}).get("addresses") or []
                 if a.get("type") == "InternalIP"), "<none>")


def _node_info(key):
    return lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get(key) or "<unknown>"


def _pdb_field(key):
    def get(o):
        v = (o.get("spec") or {}).get(key)
        return "N/A" if v is None else str(v)
    return get


def _svc_ports(o):
    ps = (o.get("spec") or {}).get("ports") or []
    return ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP")) for p in ps) or "<none>"


def _eps_endpoints(o):
    addrs = [a for e in (o.get("endpoints") or []) for a in (e.get("addresses") or [])]
    return ",".join(addrs) if addrs else "<unset>"


def _eps_ports(o):
    ps = o.get("ports")
    return ",".join(str(p.get("port")) for p in ps) if ps else "<unset>"


# The columns the real server's printers give `kubectl get` for the
# built-ins people look at while debugging a test (others: Name + Age).
BUILTIN_COLUMNS = {
    ("", "pods"): [("Ready", "string", _pod_ready), ("Status", "string", _pod_status),
                   ("Restarts", "string", _pod_restarts), ("Age", "string", _age),
                   ("IP", "string", lambda o: (o.get("status") or {}).get("podIP") or "<none>", 1),
                   ("Node", "string", lambda o: (o.get("spec") or {}).get("nodeName") or "<none>", 1)],
    ("", "services"): [("Type", "string", lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
                       ("Cluster-IP", "string", lambda o: (o.get("spec") or {}).get("clusterIP") or "<none>"),
                       ("External-IP", "string", lambda o: "<none>"),
                       ("Port(s)", "string", _svc_ports), ("Age", "string", _age)],
    ("", "nodes"): [("Status", "string", _node_status), ("Roles", "string", _node_roles),
                    ("Age", "string", _age), ("Version", "string", _node_info("kubeletVersion")),
                    ("Internal-IP", "string", _node_ip, 1), ("External-IP", "string", lambda o: "<none>", 1),
                    ("OS-Image", "string", _node_info("osImage"), 1),
                    ("Kernel-Version", "string", _node_info("kernelVersion"), 1),
                    ("Container-Runtime", "string", _node_info("containerRuntimeVersion"), 1)],
    ("policy", "poddisruptionbudgets"): [
        ("Min Available", "string", _pdb_field("minAvailable")),
        ("Max Unavailable", "string", _pdb_field("maxUnavailable")),
        ("Allowed Disruptions", "integer",
         lambda o: int((o.get("status") or {}).get("disruptionsAllowed") or 0)),
        ("Age", "string", _age)],
    ("coordination.k8s.io", "leases"): [
        ("Holder", "string", lambda o: (o.get("spec") or {}).get("holderIdentity") or ""),
        ("Age", "string", _age)],
    ("discovery.k8s.io", "endpointslices"): [
        ("AddressType", "string", lambda o: o.get("addressType", "")),
        ("Ports", "string", _eps_ports), ("Endpoints", "string", _eps_endpoints),
        ("Age", "string", _age)],
}

RAND5 = "bcdfghjklmnpqrstvwxz2456789"


def rand5():
    return "".join(random.choice(RAND5) for _ in range(5))


def _meta(o):
    m = o.get("metadata")
    if not isinstance(m, dict):
        m = o["metadata"] = {}
    return m


def _strip_for_gen(o, status_sub):
    return {k: v for k, v in o.items()
            if k not in ("metadata", "kind", "apiVersion") and not (status_sub and k == "status")}


def _same(a, b):
    def norm(o):
        o = copy.deepcopy(o)
        o.get("metadata", {}).pop("resourceVersion", None)
        o.get("metadata", {}).pop("managedFields", None)
        return o
    return norm(a) == norm(b)


def set_path(obj, dotted, value):
    parts = [p for p in dotted.split(".") if p]
    cur = obj
    for p in parts[:-1]:
        if not isinstance(cur.get(p), dict):
            cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value


class Event:
    __slots__ = ("rv", "type", "key", "obj", "prev")

    def __init__(self, rv, typ, key, obj, prev):
        self.rv, self.type, self.key, self.obj, self.prev = rv, typ, key, obj, prev


ISTIO_PROXY = "istio-proxy"
ISTIO_INJECT = "sidecar.istio.io/inject"
ISTIO_IMAGE = "docker.io/istio/proxyv2:1.24.2"  # the kubelet runs it as a built-in (kubelet.py)


def istio_proxy_container():
    """The container Istio's injection template adds (reduced): pilot-agent
    running Envoy, as user 1337 with nothing privileged."""
    env = [{"name": n, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f}}}
           for n, f in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                        ("INSTANCE_IP", "status.podIP"))]
    return {"name": ISTIO_PROXY, "image": ISTIO_IMAGE, "imagePullPolicy": "IfNotPresent",
            "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
            "env": env,
            "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"cpu": "2", "memory": "1Gi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                "privileged": False, "readOnlyRootFilesystem": True, "runAsGroup": 1337,
                                "runAsNonRoot": True, "runAsUser": 1337},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}


class Store:
    def __init__(self, history=1000, log=None):
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rv = 1
        self.types = {}          # (group, version, plural) -> ResType
        self.objs = collections.defaultdict(dict)   # (group, plural) -> {(ns, name): obj}
        self.history = collections.deque(maxlen=max(1, history))
        self.floor = self.rv     # every event with rv > floor is still in history
        self.obj_history = collections.defaultdict(list)
        self.epoch = 0           # bumped when an outage drops every connection
        self.log = log or (lambda *a: None)
        self.listeners = []      # callables(event) run after each commit, lock held
        self.node = None         # the kubelet/scheduler model (kubelet.py)
        self.gc_queue = collections.deque()
        self.gc_wake = threading.Event()
        self.next_ip = 1
        for t in BUILTINS:
            self.types[(t.group, t.version, t.plural)] = t
        self.create(self.types[("", "v1", "namespaces")], None,
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        for ns in ("kube-system", "kube-public"):
            self.create(self.types[("", "v1", "namespaces")], None,
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # ---- type lookup ---------------------------------------------------------------
    def find_type(self, group, version, plural):
        return self.types.get((group, version, plural))

    def groups(self):
        """[(group, [versions])] in discovery order."""
        g = collections.OrderedDict()
        for t in self.types.values():
            g.setdefault(t.group, [])
            if t.version not in g[t.group]:
                g[t.group].append(t.version)
        order = {n: i for i, n in enumerate(GROUP_ORDER)}
        return sorted(g.items(), key=lambda kv: (order.get(kv[0], 100), kv[0]))

    # ---- commits ---------------------------------------------------------------------
    def _commit(self, t, typ, obj, prev):
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        k = (_meta(obj).get("namespace", ""), obj["metadata"]["name"])
        if typ == "DELETED":
            self.objs[t.key].pop(k, None)
        else:
            self.objs[t.key][k] = obj
        if len(self.history) == self.history.maxlen:
            self.floor = self.history[0].rv
        ev = Event(self.rv, typ, t.key, obj, prev)
        self.history.append(ev)
        self.obj_history[(t.plural, t.group, k[0], k[1])].append(
            {"rv": str(self.rv), "type": typ, "object": self.out(t, obj)})
        for fn in self.listeners:
            fn(ev)
        self.cond.notify_all()
        return obj

    def compact(self):
        with self.lock:
            self.history.clear()
            self.floor = self.rv
            self.cond.notify_all()

    def out(self, t, obj):
        o = copy.deepcopy(obj)
        o["apiVersion"], o["kind"] = t.gv, t.kind
        if t.schema is not None:
            # As the real decoder from etcd: defaults a CRD gained after the
            # object was stored show on every read.
            schema.default(o, t.schema)
        return o

    # ---- reads -----------------------------------------------------------------------
    def get(self, t, ns, name):
        with self.lock:
            o = self.objs[t.key].get((ns or "", name))
            if o is None:
                raise APIError(404, "NotFound", '%s "%s" not found' % (t.qualified, name),
                               t.details(name))
            return copy.deepcopy(o)

    def snapshot(self, t, ns, rv=None):
        """Objects of t (in ns, or all) as of rv (None = now), sorted by
        namespace/name. rv must be >= floor (checked by the caller)."""
        with self.lock:
            state = dict(self.objs[t.key])
            if rv is not None and rv < self.rv:
                for ev in reversed(self.history):
                    if ev.rv <= rv:
                        break
                    if ev.key != t.key:
                        continue
                    m = ev.obj["metadata"]
                    k = (m.get("namespace", ""), m["name"])
                    if ev.type == "ADDED":
                        state.pop(k, None)
                    else:
                        state[k] = ev.prev
            items = [copy.deepcopy(o) for k, o in sorted(state.items())
                     if ns is None or k[0] == ns]
            return items

    # ---- writes ----------------------------------------------------------------------
    def _check_ns(self, t, ns, verb="create"):
        if not t.namespaced:
            return
        if ("", ns) not in self.objs[("", "namespaces")]:
            raise APIError(404, "NotFound", 'namespaces "%s" not found' % ns,
                           {"name": ns, "kind": "namespaces"})
        nso = self.objs[("", "namespaces")][("", ns)]
        if verb == "create" and nso["metadata"].get("deletionTimestamp"):
            raise APIError(403, "Forbidden",
                           '%s "%s" is forbidden: unable to create new content in namespace %s '
                           'because it is being terminated' % (t.qualified, "", ns),
                           {"kind": t.plural})

    def _check_body(self, t, ns, body, url_name=None):
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        av, kind = body.get("apiVersion"), body.get("kind")
        if av is not None and av != t.gv:
            raise bad_request("the API version in the data (%s) does not match the expected API "
                              "version (%s)" % (av, t.gv))
        if kind is not None and kind != t.kind:
            raise bad_request("%s in version \"%s\" cannot be handled as a %s: no kind \"%s\" is "
                              "registered for version \"%s\"" % (kind, t.version, t.kind, kind, t.gv))
        m = body.get("metadata")
        if m is not None and not isinstance(m, dict):
            raise bad_request("metadata must be an object")
        m = _meta(body)
        if t.namespaced:
            if m.get("namespace") not in (None, "", ns):
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            m["namespace"] = ns
        else:
            m.pop("namespace", None)
        if url_name is not None and m.get("name") not in (None, "", url_name):
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (m.get("name"), url_name))
        for f in ("labels", "annotations"):
            v = m.get(f)
            if v is not None and (not isinstance(v, dict) or
                                  not all(isinstance(x, str) for x in v.values())):
                raise APIError(422, "Invalid", '%s "%s" is invalid: metadata.%s: Invalid value: '
                               'must be a map of strings' % (t.kind, m.get("name", ""), f),
                               t.details(m.get("name", "")))

    def _validate_typed(self, t, obj):
        """Field types of the built-ins whose clients we test, as the real
        decoder (400) and validation (422) enforce them. Leases: MicroTime
        needs exactly 6 fractional digits, durations are integers > 0."""
        if t.key != ("coordination.k8s.io", "leases"):
            return
        name = obj["metadata"].get("name", "")
        spec = obj.get("spec")
        if spec is None:
            return
        if not isinstance(spec, dict):
            raise bad_request('Lease in version "v1" cannot be handled as a Lease: json: cannot '
                              'unmarshal into Go struct field Lease.spec of type v1.LeaseSpec')
        for f in ("holderIdentity", "strategy", "preferredHolder"):
            if spec.get(f) is not None and not isinstance(spec[f], str):
                raise bad_request('Lease in version "v1" cannot be handled as a Lease: json: cannot '
                                  'unmarshal %s into Go struct field LeaseSpec.spec.%s of type string'
                                  % (type(spec[f]).__name__, f))
        for f in ("leaseDurationSeconds", "leaseTransitions"):
            v = spec.get(f)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not -2**31 <= v < 2**31:
                raise bad_request('Lease in version "v1" cannot be handled as a Lease: json: cannot '
                                  'unmarshal %s into Go struct field LeaseSpec.spec.%s of type int32'
                                  % (json.dumps(v), f))
            if f == "leaseDurationSeconds" and v <= 0:
                raise self._invalid(t, name, "spec.leaseDurationSeconds",
                                    "Invalid value: %d: must be greater than 0" % v)
            if f == "leaseTransitions" and v < 0:
                raise self._invalid(t, name, "spec.leaseTransitions",
                                    "Invalid value: %d: must be greater than or equal to 0" % v)
        for f in ("acquireTime", "renewTime"):
            v = spec.get(f)
            if v is None:
                continue
            if not isinstance(v, str) or not MICROTIME.match(v):
                raise bad_request('Lease in version "v1" cannot be handled as a Lease: parsing time '
                                  '%s as "2006-01-02T15:04:05.000000Z07:00": cannot parse %s'
                                  % (json.dumps(v), json.dumps(v)))
            # The real server stores the parsed time and writes it back in UTC.
            d = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
            spec[f] = d.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _invalid(self, t, name, field, why):
        """apierrors.NewInvalid with one cause: the qualified kind
        ("Lease.coordination.k8s.io", "Pod") and the cause type from the
        error's wording."""
        d = t.details(name)
        d["kind"] = t.kind
        reason = "FieldValueInvalid"
        for prefix, r in (("Required value", "FieldValueRequired"),
                          ("Unsupported value", "FieldValueNotSupported"),
                          ("Forbidden", "FieldValueForbidden"), ("Too long", "FieldValueTooLong"),
                          ("Too many", "FieldValueTooMany")):
            if why.startswith(prefix):
                reason = r
        d["causes"] = [{"reason": reason, "message": why, "field": field}]
        qk = t.kind + ("." + t.group if t.group else "")
        return APIError(422, "Invalid", '%s "%s" is invalid: %s: %s' % (qk, name, field, why), d)

    # ---- custom resources: structural schema -------------------------------------------
    def _schema_in(self, t, obj, fv, warnings):
        """What decoding a custom resource does: unknown fields pruned (a 400
        with fieldValidation=Strict, a warning with Warn, the default),
        nulls dropped, defaults applied."""
        if t.schema is None:
            return
        unknown = schema.prune(obj, t.schema)
        if unknown and fv == "Strict":
            raise bad_request('%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                              % (t.kind, t.version, t.kind,
                                 ", ".join('unknown field "%s"' % u for u in unknown)))
        if unknown and fv != "Ignore" and warnings is not None:
            warnings.extend('unknown field "%s"' % u for u in unknown)
        schema.default(obj, t.schema)

    def _schema_check(self, t, obj, old=None):
        if t.schema is None:
            return
        errs = schema.ratchet(schema.validate(obj, t.schema), obj, old)
        if errs:
            raise schema.invalid(t.kind, t.group, obj["metadata"].get("name", ""), errs)

    def create(self, t, ns, body, dry_run=False, fv=None, warnings=None):
        with self.lock:
            self._check_body(t, ns, body)
            if t.schema is not None:
                body = copy.deepcopy(body)
                self._schema_in(t, body, fv, warnings)
            m = body["metadata"]
            if not m.get("name"):
                if m.get("generateName"):
                    for _ in range(20):
                        cand = m["generateName"] + rand5()
                        if (ns or "", cand) not in self.objs[t.key]:
                            break
                    m["name"] = cand
                else:
                    d = t.details("")
                    d["kind"] = t.kind
                    d["causes"] = [{"reason": "FieldValueRequired",
                                    "message": "Required value: name or generateName is required",
                                    "field": "metadata.name"}]
                    raise APIError(422, "Invalid", '%s "" is invalid: metadata.name: Required value: '
                                   'name or generateName is required' % t.kind, d)
            name = m["name"]
            if not isinstance(name, str) or len(name) > 253 or not DNS1123_SUB.match(name):
                raise self._invalid(t, str(name), "metadata.name",
                                    'Invalid value: "%s": a lowercase RFC 1123 subdomain must consist '
                                    "of lower case alphanumeric characters, '-' or '.', and must start "
                                    "and end with an alphanumeric character" % name)
            self._check_ns(t, ns)
            if (ns or "", name) in self.objs[t.key]:
                raise APIError(409, "AlreadyExists", '%s "%s" already exists' % (t.qualified, name),
                               t.details(name))
            obj = copy.deepcopy(body)
            obj["apiVersion"], obj["kind"] = t.gv, t.kind
            m = obj["metadata"]
            for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "managedFields", "selfLink"):
                m.pop(f, None)
            m["uid"] = str(uuid.uuid4())
            m["creationTimestamp"] = now_rfc3339()
            if t.generation:
                m["generation"] = 1
            else:
                m.pop("generation", None)
            if t.status and t.key not in (("", "namespaces"), ("", "nodes")):
                obj.pop("status", None)  # (a kubelet registers its Node with status)
            self._validate_typed(t, obj)
            self._schema_check(t, obj)
            self._defaults_create(t, obj)
            if t.key == ("", "pods"):
                self._pod_security(obj, warnings)
            if dry_run:
                obj["metadata"]["resourceVersion"] = ""
                return copy.deepcopy(obj)
            self._commit(t, "ADDED", obj, None)
            if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self.register_crd(obj)
            if t.key == ("", "namespaces"):
                # What the serviceaccount controller does moments later (done
                # at once here, so a pod created right after is admitted).
                self.create(self.types[("", "v1", "serviceaccounts")], obj["metadata"]["name"],
                            {"metadata": {"name": "default"}})
            return copy.deepcopy(obj)

    def _defaults_create(self, t, obj):
        key = t.key
        spec = obj.setdefault("spec", {}) if key in (("", "pods"), ("", "services"),
                                                     ("apps", "deployments")) else None
        if key == ("", "namespaces"):
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif key == ("", "pods"):
            self._admit_pod(obj)
            self._inject_sidecar(obj)
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("serviceAccountName", "default")
            spec.setdefault("enableServiceLinks", True)
            for c in spec.get("containers") or []:
                if isinstance(c, dict):
                    img = str(c.get("image", ""))
                    tag = img.rsplit("/", 1)[-1]
                    c.setdefault("imagePullPolicy",
                                 "Always" if (":" not in tag or tag.endswith(":latest")) and "@" not in tag
                                 else "IfNotPresent")
                    c.setdefault("terminationMessagePath", "/dev/termination-log")
                    c.setdefault("terminationMessagePolicy", "File")
                    for p in c.get("ports") or []:
                        if isinstance(p, dict):
                            p.setdefault("protocol", "TCP")
                    # requests default to limits
                    r = c.get("resources")
                    if isinstance(r, dict) and isinstance(r.get("limits"), dict):
                        req = r.setdefault("requests", {})
                        for k, v in r["limits"].items():
                            req.setdefault(k, v)
            spec.setdefault("securityContext", {})
            spec.setdefault("priority", 0)
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            # the DefaultTolerationSeconds admission plugin
            tols = spec.setdefault("tolerations", [])
            for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(isinstance(t, dict) and t.get("key") == k for t in tols):
                    tols.append({"key": k, "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": 300})
            obj["status"] = {"phase": "Pending", "qosClass": _qos(spec)}
            if self.node:
                self.node.on_pod_create(obj)
        elif key == ("", "services"):
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
            if spec.get("clusterIP") in (None, ""):
                self.next_ip += 1
                spec["clusterIP"] = "10.96.%d.%d" % (self.next_ip // 250, self.next_ip % 250 + 2)
            spec["clusterIPs"] = [spec["clusterIP"]]
            for p in spec.get("ports") or []:
                if isinstance(p, dict):
                    p.setdefault("protocol", "TCP")
                    p.setdefault("targetPort", p.get("port"))
            obj["status"] = {"loadBalancer": {}}
        elif key == ("apps", "deployments"):
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault("strategy", {"type": "RollingUpdate",
                                         "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
            obj["status"] = {}
        elif key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
            for k, v in list((obj.get("stringData") or {}).items()):
                obj.setdefault("data", {})[k] = base64.b64encode(str(v).encode()).decode()
            obj.pop("stringData", None)
        elif key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_status(obj)

    FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                   "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
                   "status.podIPs")

    def _admit_pod(self, obj):
        """Validation of the fields a kubelet relies on, then the
        ServiceAccount admission plugin: the account must exist (403), its
        name is copied to spec.serviceAccount and, unless automount is off,
        the kube-api-access projected volume is mounted in every container."""
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        spec = obj["spec"]
        errs = []
        cs = spec.get("containers")
        if not isinstance(cs, list) or not cs:
            errs.append(schema.FieldError("Required", "spec.containers"))
            cs = []
        seen = set()
        for i, c in enumerate(cs):
            p = "spec.containers[%d]" % i
            if not isinstance(c, dict):
                errs.append(schema.FieldError("Invalid", p, c, "must be an object"))
                continue
            if not c.get("name"):
                errs.append(schema.FieldError("Required", p + ".name"))
            elif c["name"] in seen:
                errs.append(schema.FieldError("Invalid", p + ".name", c["name"], "Duplicate value"))
            seen.add(c.get("name"))
            if not c.get("image"):
                errs.append(schema.FieldError("Required", p + ".image"))
            for k, f in (("command", "command"), ("args", "args")):
                v = c.get(f)
                if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
                    errs.append(schema.FieldError("Invalid", p + "." + k, v, "must be a list of strings"))
            for j, e in enumerate(c.get("env") or []):
                fr = ((e or {}).get("valueFrom") or {}).get("fieldRef") if isinstance(e, dict) else None
                if isinstance(fr, dict):
                    fp = fr.get("fieldPath", "")
                    if fp not in self.FIELD_PATHS and not re.match(
                            r"^metadata\.(labels|annotations)\['[^']+'\]$", fp):
                        errs.append(schema.FieldError(
                            "NotSupported", "%s.env[%d].valueFrom.fieldRef.fieldPath" % (p, j), fp,
                            "supported values: " + ", ".join(
                                '"%s"' % x for x in ("metadata.name", "metadata.namespace",
                                                     "metadata.uid", "spec.nodeName",
                                                     "spec.serviceAccountName", "status.hostIP",
                                                     "status.hostIPs", "status.podIP",
                                                     "status.podIPs"))))
        if errs:
            raise schema.invalid("Pod", "", name, errs)
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        spec["serviceAccountName"] = spec["serviceAccount"] = sa
        sao = self.objs[("", "serviceaccounts")].get((ns, sa))
        if sao is None:
            raise APIError(403, "Forbidden", 'pods "%s" is forbidden: error looking up service account '
                           '%s/%s: serviceaccount "%s" not found' % (name, ns, sa, sa),
                           {"name": name, "kind": "pods"})
        auto = spec.get("automountServiceAccountToken")
        if auto is None:
            auto = sao.get("automountServiceAccountToken", True) is not False
        if auto:
            mp = "/var/run/secrets/kubernetes.io/serviceaccount"
            if not any(isinstance(m, dict) and m.get("mountPath") == mp
                       for c in spec["containers"] for m in c.get("volumeMounts") or []):
                vol = "kube-api-access-" + rand5()
                spec.setdefault("volumes", []).append({"name": vol, "projected": {
                    "defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt",
                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
                for c in spec["containers"]:
                    c.setdefault("volumeMounts", []).append({"name": vol, "readOnly": True,
                                                             "mountPath": mp})

    def _inject_sidecar(self, pod):
        """Istio's sidecar injector, a mutating webhook (after the built-in
        mutating plugins, before validation): pods of a namespace labelled
        istio-injection=enabled get the istio-proxy container, unless the
        pod's label (or annotation) sidecar.istio.io/inject is "false" or
        it uses the host's network. Istio CNI mode: no istio-init (which
        needs NET_ADMIN), so the pod can still pass "restricted". With the
        annotation sidecar.istio.io/nativeSidecar "true" it is a native
        sidecar: the first init container, restartPolicy Always."""
        m, spec = pod["metadata"], pod["spec"]
        labels = self.objs[("", "namespaces")][("", m["namespace"])]["metadata"].get("labels") or {}
        ann = m.get("annotations") or {}
        opt = (m.get("labels") or {}).get(ISTIO_INJECT, ann.get(ISTIO_INJECT, "true"))
        if labels.get("istio-injection") != "enabled" or opt == "false" or spec.get("hostNetwork"):
            return
        if any(isinstance(c, dict) and c.get("name") == ISTIO_PROXY
               for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])):
            return  # injected already (istioctl kube-inject)
        proxy = istio_proxy_container()
        native = ann.get("sidecar.istio.io/nativeSidecar") == "true"
        if native:
            proxy["restartPolicy"] = "Always"
            spec["initContainers"] = [proxy] + (spec.get("initContainers") or [])
        else:
            spec["containers"].append(proxy)
        m.setdefault("annotations", {})["sidecar.istio.io/status"] = json.dumps(
            {"initContainers": [ISTIO_PROXY] if native else None,
             "containers": None if native else [ISTIO_PROXY], "volumes": [], "imagePullSecrets": None},
            separators=(",", ":"))
        m.setdefault("labels", {}).setdefault("security.istio.io/tlsMode", "istio")

    def _pod_security(self, pod, warnings):
        """The PodSecurity admission plugin (podsecurity.py): validating, so it
        sees the pod as the mutating plugins and webhooks left it."""
        m = pod["metadata"]
        labels = self.objs[("", "namespaces")][("", m["namespace"])]["metadata"].get("labels") or {}
        warn = podsecurity.verdict(labels, pod.get("spec"), podsecurity.WARN)
        if warn and warnings is not None:
            warnings.append("would violate " + warn)
        deny = podsecurity.verdict(labels, pod.get("spec"), podsecurity.ENFORCE)
        if deny:
            raise APIError(403, "Forbidden", 'pods "%s" is forbidden: violates %s' % (m["name"], deny),
                           {"name": m["name"], "kind": "pods"})

    def update(self, t, ns, name, body, sub=None, dry_run=False, require_rv=None, fv=None,
               warnings=None):
        """PUT semantics: body is the whole new object (for sub=status: only
        its status is taken)."""
        with self.lock:
            self._check_body(t, ns, body, name)
            if t.schema is not None:
                body = copy.deepcopy(body)
                self._schema_in(t, body, fv, warnings)
            k = (ns or "", name)
            cur = self.objs[t.key].get(k)
            if cur is None:
                raise APIError(404, "NotFound", '%s "%s" not found' % (t.qualified, name),
                               t.details(name))
            want_rv = body["metadata"].get("resourceVersion")
            if require_rv is None:
                require_rv = t.crd is not None
            if want_rv in (None, "") and require_rv and sub is None:
                raise self._invalid(t, name, "metadata.resourceVersion",
                                    "Invalid value: 0x0: must be specified for an update")
            if want_rv not in (None, "") and want_rv != cur["metadata"]["resourceVersion"]:
                raise self.conflict(t, name)
            new = copy.deepcopy(body)
            new["apiVersion"], new["kind"] = t.gv, t.kind
            if sub == "status":
                n2 = copy.deepcopy(cur)
                if "status" in new:
                    n2["status"] = new["status"]
                else:
                    n2.pop("status", None)
                new = n2
            else:
                m, cm = new["metadata"], cur["metadata"]
                m["name"] = name
                for f in ("uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation"):
                    if f in cm:
                        m[f] = cm[f]
                    else:
                        m.pop(f, None)
                if t.status:
                    if "status" in cur:
                        new["status"] = copy.deepcopy(cur["status"])
                    else:
                        new.pop("status", None)
                self._defaults_update(t, cur, new)
                if t.generation and _strip_for_gen(new, t.status) != _strip_for_gen(cur, t.status):
                    m["generation"] = int(cm.get("generation", 1)) + 1
            self._schema_check(t, new, cur)
            return self._finish_update(t, cur, new, dry_run)

    def _defaults_update(self, t, cur, new):
        if t.key == ("", "services"):
            spec, old = new.setdefault("spec", {}), cur.get("spec", {})
            if spec.get("clusterIP") in (None, ""):
                spec["clusterIP"] = old.get("clusterIP")
                spec["clusterIPs"] = old.get("clusterIPs")
            elif spec["clusterIP"] != old.get("clusterIP"):
                raise self._invalid(t, new["metadata"]["name"], "spec.clusterIPs[0]",
                                    "Invalid value: []string{\"%s\"}: may not change once set"
                                    % spec["clusterIP"])
            for f, dv in (("type", "ClusterIP"), ("sessionAffinity", "None"),
                          ("ipFamilies", ["IPv4"]), ("ipFamilyPolicy", "SingleStack"),
                          ("internalTrafficPolicy", "Cluster")):
                spec.setdefault(f, dv)
            for p in spec.get("ports") or []:
                if isinstance(p, dict):
                    p.setdefault("protocol", "TCP")
                    p.setdefault("targetPort", p.get("port"))
        elif t.key == ("", "pods"):
            spec, old = new.setdefault("spec", {}), cur.get("spec", {})
            for f in ("nodeName", "restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy",
                      "schedulerName", "serviceAccountName", "serviceAccount", "enableServiceLinks",
                      "securityContext", "priority", "preemptionPolicy"):
                if f in old and f not in spec:
                    spec[f] = old[f]
            for c in spec.get("containers") or []:
                if isinstance(c, dict):
                    oc = next((x for x in old.get("containers") or [] if x.get("name") == c.get("name")), {})
                    for f in ("imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy"):
                        if f in oc and f not in c:
                            c[f] = oc[f]

            def mutable_stripped(sp):
                sp = copy.deepcopy(sp)
                for f in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
                    sp.pop(f, None)
                for lst in ("containers", "initContainers"):
                    for c in sp.get(lst) or []:
                        if isinstance(c, dict):
                            c.pop("image", None)
                return sp
            if mutable_stripped(spec) != mutable_stripped(old):
                raise self._invalid(t, new["metadata"]["name"], "spec",
                                    "Forbidden: pod updates may not change fields other than "
                                    "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                                    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
                                    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it "
                                    "to be set to 1 if it was previously negative)")
        elif t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_status(new)
        elif t.key == ("", "secrets"):
            for k, v in list((new.get("stringData") or {}).items()):
                new.setdefault("data", {})[k] = base64.b64encode(str(v).encode()).decode()
            new.pop("stringData", None)

    def _finish_update(self, t, cur, new, dry_run):
        self._validate_typed(t, new)
        if _same(cur, new):
            return copy.deepcopy(cur)
        if dry_run:
            return copy.deepcopy(new)
        m = new["metadata"]
        # As the real registry: an object marked for deletion whose grace
        # period is over goes away once its last finalizer is removed.
        if m.get("deletionTimestamp") and not m.get("finalizers") \
                and not m.get("deletionGracePeriodSeconds"):
            self._commit(t, "MODIFIED", new, cur)
            return self.remove(t, new)
        self._commit(t, "MODIFIED", new, cur)
        if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.register_crd(new)
        return copy.deepcopy(new)

    def conflict(self, t, name):
        return APIError(409, "Conflict",
                        'Operation cannot be fulfilled on %s "%s": the object has been modified; '
                        'please apply your changes to the latest version and try again'
                        % (t.qualified, name), t.details(name))

    # ---- deletion --------------------------------------------------------------------
    def remove(self, t, obj):
        """Removes obj now (DELETED event) and queues its dependents for GC."""
        cur = self.objs[t.key].get((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        if cur is None:
            return copy.deepcopy(obj)
        gone = copy.deepcopy(cur)
        self._commit(t, "DELETED", gone, cur)
        self.gc_queue.append(gone["metadata"]["uid"])
        self.gc_wake.set()
        if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.unregister_crd(gone)
        if t.key == ("", "namespaces"):
            self._empty_namespace(gone["metadata"]["name"])
        return copy.deepcopy(gone)

    def delete(self, t, ns, name, opts):
        """DELETE: returns (object, deleted_now)."""
        with self.lock:
            cur = self.objs[t.key].get((ns or "", name))
            if cur is None:
                raise APIError(404, "NotFound", '%s "%s" not found' % (t.qualified, name),
                               t.details(name))
            pre = opts.get("preconditions") or {}
            cm = cur["metadata"]
            if pre.get("uid") not in (None, "") and pre["uid"] != cm["uid"]:
                raise APIError(409, "Conflict",
                               'Operation cannot be fulfilled on %s "%s": Precondition failed: UID in '
                               'precondition: %s, UID in object meta: %s'
                               % (t.qualified, name, pre["uid"], cm["uid"]), t.details(name))
            if pre.get("resourceVersion") not in (None, "") and pre["resourceVersion"] != cm["resourceVersion"]:
                raise APIError(409, "Conflict",
                               'Operation cannot be fulfilled on %s "%s": Precondition failed: '
                               'ResourceVersion in precondition: %s, ResourceVersion in object meta: %s'
                               % (t.qualified, name, pre["resourceVersion"], cm["resourceVersion"]),
                               t.details(name))
            if opts.get("dryRun"):
                return copy.deepcopy(cur), True
            policy = opts.get("propagationPolicy")
            if policy is None and opts.get("orphanDependents") is True:
                policy = "Orphan"
            if policy not in (None, "Background", "Foreground", "Orphan"):
                raise self._invalid(t, name, "propagationPolicy",
                                    'Unsupported value: "%s": supported values: "Foreground", '
                                    '"Background", "Orphan", "nil"' % policy)
            if policy == "Orphan":
                self._orphan(cm["uid"])
            if t.key == ("", "pods") and self.node:
                res = self.node.graceful_delete(t, cur, opts.get("gracePeriodSeconds"))
                if res is not None:
                    return res
            if policy == "Foreground" and self._has_dependents(cm["uid"]):
                new = copy.deepcopy(cur)
                nm = new["metadata"]
                nm.setdefault("deletionTimestamp", now_rfc3339())
                nm.setdefault("deletionGracePeriodSeconds", 0)
                if "foregroundDeletion" not in nm.setdefault("finalizers", []):
                    nm["finalizers"].append("foregroundDeletion")
                self._commit(t, "MODIFIED", new, cur)
                self.gc_queue.append(("foreground", t, ns, name, cm["uid"]))
                self.gc_wake.set()
                return copy.deepcopy(new), False
            if cm.get("finalizers"):
                if cm.get("deletionTimestamp"):
                    return copy.deepcopy(cur), False
                new = copy.deepcopy(cur)
                new["metadata"]["deletionTimestamp"] = now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                self._commit(t, "MODIFIED", new, cur)
                return copy.deepcopy(new), False
            return self.remove(t, cur), True

    def _all_objects(self):
        for key, objs in self.objs.items():
            t = next((x for x in self.types.values() if x.key == key), None)
            if t is None:
                continue
            for o in list(objs.values()):
                yield t, o

    def _dependents(self, uid):
        return [(t, o) for t, o in self._all_objects()
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]

    def _has_dependents(self, uid):
        return bool(self._dependents(uid))

    def _orphan(self, uid):
        for t, o in self._dependents(uid):
            new = copy.deepcopy(o)
            new["metadata"]["ownerReferences"] = [r for r in new["metadata"]["ownerReferences"]
                                                  if r.get("uid") != uid]
            if not new["metadata"]["ownerReferences"]:
                del new["metadata"]["ownerReferences"]
            self._commit(t, "MODIFIED", new, o)

    def _uid_alive(self, uid):
        return any(o["metadata"].get("uid") == uid for _, o in self._all_objects())

    def gc_step(self):
        """One pass of the garbage collector (runs on its own thread, like
        kube-controller-manager's): dependents whose owners are all gone are
        deleted (background propagation); foreground owners lose their
        finalizer once their dependents are gone."""
        with self.lock:
            work = list(self.gc_queue)
            self.gc_queue.clear()
            for w in work:
                if isinstance(w, tuple):
                    _, t, ns, name, uid = w
                    deps = self._dependents(uid)
                    for dt, d in deps:
                        try:
                            self.delete(dt, d["metadata"].get("namespace"), d["metadata"]["name"],
                                        {"propagationPolicy": "Foreground"})
                        except APIError:
                            pass
                    if self._dependents(uid):
                        self.gc_queue.append(w)
                        continue
                    cur = self.objs[t.key].get((ns or "", name))
                    if cur is not None and cur["metadata"]["uid"] == uid:
                        new = copy.deepcopy(cur)
                        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers", [])
                                                         if f != "foregroundDeletion"]
                        if not new["metadata"]["finalizers"]:
                            del new["metadata"]["finalizers"]
                        self._finish_update(t, cur, new, False)
                    continue
                for dt, d in self._dependents(w):
                    refs = d["metadata"].get("ownerReferences") or []
                    if any(self._uid_alive(r.get("uid")) for r in refs):
                        continue
                    try:
                        self.delete(dt, d["metadata"].get("namespace"), d["metadata"]["name"], {})
                    except APIError:
                        pass
            return bool(self.gc_queue)

    def _empty_namespace(self, ns):
        for t, o in list(self._all_objects()):
            if t.namespaced and o["metadata"].get("namespace") == ns:
                self.remove(t, o)

    # ---- CRDs ------------------------------------------------------------------------
    def _crd_status(self, crd):
        names = (crd.get("spec") or {}).get("names") or {}
        st = crd.setdefault("status", {})
        st["acceptedNames"] = {k: names[k] for k in ("plural", "singular", "kind", "listKind",
                                                      "shortNames", "categories") if k in names}
        st.setdefault("acceptedNames", {}).setdefault("listKind", names.get("kind", "") + "List")
        t = now_rfc3339()
        st["conditions"] = [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": t},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": t}]
        st["storedVersions"] = [v.get("name") for v in (crd.get("spec") or {}).get("versions") or []
                                if isinstance(v, dict) and v.get("storage")]

    def validate_crd(self, body):
        t = self.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        spec = body.get("spec") if isinstance(body, dict) else None
        name = ((body or {}).get("metadata") or {}).get("name", "")
        if not isinstance(spec, dict):
            raise self._invalid(t, name, "spec", "Required value")
        names = spec.get("names") or {}
        group = spec.get("group")
        if not group or not names.get("plural") or not names.get("kind"):
            raise self._invalid(t, name, "spec.names", "Required value: group, names.plural and "
                                "names.kind are required")
        if name != names["plural"] + "." + group:
            raise self._invalid(t, name, "metadata.name",
                                'Invalid value: "%s": must be spec.names.plural+"."+spec.group' % name)
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            raise self._invalid(t, name, "spec.scope", 'Unsupported value: "%s": supported values: '
                                '"Cluster", "Namespaced"' % spec.get("scope"))
        vers = spec.get("versions")
        if not isinstance(vers, list) or not vers:
            raise self._invalid(t, name, "spec.versions", "Invalid value: must have exactly one "
                                "version marked as storage version")
        if sum(1 for v in vers if isinstance(v, dict) and v.get("storage")) != 1:
            raise self._invalid(t, name, "spec.versions", "Invalid value: must have exactly one "
                                "version marked as storage version")
        errs = []
        for i, v in enumerate(vers):
            if isinstance(v, dict):
                s = (v.get("schema") or {}).get("openAPIV3Schema") if isinstance(v.get("schema"), dict) \
                    else None
                errs += schema.structural_errors(s, "spec.versions[%d].schema.openAPIV3Schema" % i)
        if errs:
            raise schema.invalid(t.kind, t.group, name, errs)

    def register_crd(self, crd):
        self.unregister_crd(crd, keep_objects=True)
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for v in spec.get("versions") or []:
            if not isinstance(v, dict) or not v.get("served", True):
                continue
            sub = v.get("subresources") or {}
            scale = sub.get("scale")
            sch = (v.get("schema") or {}).get("openAPIV3Schema")
            if schema.uses_cel(sch):
                self.log({"msg": "warning: x-kubernetes-validations (CEL) are not evaluated by the "
                                 "stand-in", "crd": crd["metadata"]["name"], "version": v["name"]})
            t = ResType(spec["group"], v["name"], names["plural"],
                        names.get("singular") or names["kind"].lower(), names["kind"],
                        spec.get("scope") == "Namespaced", names.get("shortNames") or [],
                        status="status" in sub, scale=scale, generation=True,
                        categories=names.get("categories") or [], crd=crd["metadata"]["name"],
                        columns=v.get("additionalPrinterColumns"),
                        schema=sch if isinstance(sch, dict) else None)
            self.types[(t.group, t.version, t.plural)] = t

    def unregister_crd(self, crd, keep_objects=False):
        cname = crd["metadata"]["name"]
        for k, t in list(self.types.items()):
            if t.crd == cname:
                del self.types[k]
                if not keep_objects:
                    for o in list(self.objs[t.key].values()):
                        self.types[k] = t
                        self.remove(t, o)
                        del self.types[k]

    # ---- scale -----------------------------------------------------------------------
    def scale_of(self, t, obj):
        sc = t.scale
        spec_r = jsonpath(obj, sc["specReplicasPath"]) if sc.get("specReplicasPath") else None
        st_r = jsonpath(obj, sc["statusReplicasPath"]) if sc.get("statusReplicasPath") else None
        if t.key == ("apps", "deployments"):
            ml = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            sel = ",".join("%s=%s" % kv for kv in sorted(ml.items()))
        else:
            sel = jsonpath(obj, sc["labelSelectorPath"]) if sc.get("labelSelectorPath") else None
        m = obj["metadata"]
        s = {"kind": "Scale", "apiVersion": "autoscaling/v1",
             "metadata": {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                            "creationTimestamp") if k in m},
             "spec": {"replicas": int(spec_r or 0)} if spec_r else {},
             "status": {"replicas": int(st_r or 0)}}
        if sel:
            s["status"]["selector"] = sel
        return s

    def set_scale(self, t, ns, name, scale):
        with self.lock:
            cur = self.objs[t.key].get((ns or "", name))
            if cur is None:
                raise APIError(404, "NotFound", '%s "%s" not found' % (t.qualified, name),
                               t.details(name))
            if not isinstance(scale, dict) or scale.get("kind") not in (None, "Scale"):
                raise bad_request("the body must be an autoscaling/v1 Scale")
            want = (scale.get("metadata") or {}).get("resourceVersion")
            if want not in (None, "") and want != cur["metadata"]["resourceVersion"]:
                raise self.conflict(t, name)
            r = (scale.get("spec") or {}).get("replicas", 0)
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                d = {"name": name, "kind": "Scale"}
                raise APIError(422, "Invalid", 'Scale.autoscaling "%s" is invalid: spec.replicas: '
                               'Invalid value: %s: must be greater than or equal to 0' % (name, r), d)
            new = copy.deepcopy(cur)
            set_path(new, t.scale["specReplicasPath"], r)
            self._schema_check(t, new, cur)
            if _strip_for_gen(new, t.status) != _strip_for_gen(cur, t.status):
                new["metadata"]["generation"] = int(cur["metadata"].get("generation", 1)) + 1
            return self._finish_update(t, cur, new, False)

    # ---- list ------------------------------------------------------------------------
    def table(self, t, items, include="Metadata"):
        """meta.k8s.io/v1 Table as the server builds it: CRDs' printer columns
        (or Age by default), Name + Age for built-ins."""
        cols = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                 "description": "Name must be unique within a namespace."}]
        specs = []
        builtin = BUILTIN_COLUMNS.get(t.key)
        if builtin:
            for name, typ, fn, *prio in builtin:
                cols.append({"name": name, "type": typ, "format": "", "description": "",
                             "priority": prio[0] if prio else 0})
                specs.append({"fn": fn, "type": typ})
        elif t.columns:
            for c in t.columns:
                cols.append({"name": c.get("name", ""), "type": c.get("type", "string"),
                             "format": c.get("format", ""), "description": c.get("description", ""),
                             "priority": c.get("priority", 0)})
                specs.append(c)
        else:
            cols.append({"name": "Age", "type": "date", "format": "", "priority": 0,
                         "description": "CreationTimestamp is a timestamp representing the server "
                                        "time when this object was created."})
            specs.append({"jsonPath": ".metadata.creationTimestamp", "type": "date"})
        rows = []
        for o in items:
            cells = [o["metadata"]["name"]]
            for c in specs:
                v = c["fn"](o) if "fn" in c else jsonpath(o, c.get("jsonPath", ""))
                if c.get("type") == "date" and isinstance(v, str):
                    ts = parse_rfc3339(v)
                    v = human_duration(time.time() - ts) if ts is not None else v
                elif v is not None and c.get("type") in ("string",) and not isinstance(v, str):
                    v = json.dumps(v)
                cells.append(v)
            row = {"cells": cells}
            if include == "Object":
                row["object"] = self.out(t, o)
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                 "metadata": copy.deepcopy(o["metadata"])}
            rows.append(row)
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
                "columnDefinitions": cols, "rows": rows}
