"""Pure helpers of the Kubernetes stand-in: Status bodies, patches (merge,
JSON, strategic), label and field selectors, JSONPath for printer columns,
ages as kubectl prints them. No I/O, no threads: the server imports these."""

import base64
import copy
import datetime
import re


class APIError(Exception):
    """An error the API answers with a `kind: Status` body."""

    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details
        self.headers = headers or {}

    def body(self):
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code, reason, message, details=None):
    b = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details is not None:
        b["details"] = details
    return b


def bad_request(msg):
    return APIError(400, "BadRequest", msg)


def now_rfc3339(t=None):
    d = datetime.datetime.fromtimestamp(t, datetime.timezone.utc) if t is not None \
        else datetime.datetime.now(datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(s):
    try:
        return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def human_duration(secs):
    """The age strings kubectl shows (apimachinery's HumanDuration)."""
    if secs < -1:
        return "<invalid>"
    s = max(0, int(secs))
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = s // 3600
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    d = h // 24
    if h < 192:
        return "%dd%dh" % (d, h % 24) if h % 24 else "%dd" % d
    if d < 365 * 2:
        return "%dd" % d
    return "%dy" % (d // 365)


# ---- patches -------------------------------------------------------------------

def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _ptr(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise APIError(422, "Invalid", "invalid JSON pointer %r in json patch" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts, op):
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise APIError(422, "Invalid",
                           "the server rejected our request due to an error in our request: "
                           "json patch %s operation does not apply: doc is missing path: /%s"
                           % (op, "/".join(parts)))
    return cur


def json_patch(doc, ops):
    """RFC 6902 JSON patch."""
    if not isinstance(ops, list):
        raise bad_request("json patch must be a JSON array of operations")
    doc = copy.deepcopy(doc)

    def add(d, parts, val, op):
        if not parts:
            return val
        parent = _walk(d, parts[:-1], op)
        last = parts[-1]
        if isinstance(parent, dict):
            parent[last] = val
        elif isinstance(parent, list):
            if last == "-":
                parent.append(val)
            elif last.isdigit() and int(last) <= len(parent):
                parent.insert(int(last), val)
            else:
                raise APIError(422, "Invalid", "json patch %s operation: index %s out of range" % (op, last))
        else:
            raise APIError(422, "Invalid", "json patch %s operation: parent is not a container" % op)
        return d

    def remove(d, parts, op):
        if not parts:
            raise APIError(422, "Invalid", "json patch %s operation: cannot remove the root" % op)
        parent = _walk(d, parts[:-1], op)
        last = parts[-1]
        if isinstance(parent, dict) and last in parent:
            return parent.pop(last)
        if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
            return parent.pop(int(last))
        raise APIError(422, "Invalid",
                       "the server rejected our request due to an error in our request: "
                       "json patch %s operation does not apply: doc is missing path: /%s"
                       % (op, "/".join(parts)))

    for o in ops:
        if not isinstance(o, dict) or not isinstance(o.get("op"), str) or not isinstance(o.get("path"), str):
            raise bad_request("json patch operations need string 'op' and 'path'")
        op, parts = o["op"], _ptr(o["path"])
        if op == "add":
            doc = add(doc, parts, copy.deepcopy(o.get("value")), op)
        elif op == "remove":
            remove(doc, parts, op)
        elif op == "replace":
            _walk(doc, parts, op)
            if not parts:
                doc = copy.deepcopy(o.get("value"))
            else:
                remove(doc, parts, op)
                doc = add(doc, parts, copy.deepcopy(o.get("value")), op)
        elif op in ("move", "copy"):
            if not isinstance(o.get("from"), str):
                raise bad_request("json patch %s needs 'from'" % op)
            src = _ptr(o["from"])
            val = copy.deepcopy(_walk(doc, src, op))
            if op == "move":
                remove(doc, src, op)
            doc = add(doc, parts, val, op)
        elif op == "test":
            if _walk(doc, parts, op) != o.get("value"):
                raise APIError(422, "Invalid", "the server rejected our request due to an error in our "
                               "request: testing value /%s failed" % "/".join(parts))
        else:
            raise bad_request("Unexpected kind: %s" % op)
    return doc


# Merge keys of the built-in list fields that kubectl's strategic merge
# patches address by key (from the Go struct tags of core/v1 and friends).
SMP_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid",
    "hostAliases": "ip", "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name", "subsets": None,
}
SMP_SETS = {"finalizers"}


def _smp_key(field, items):
    if field == "ports":
        if all(isinstance(i, dict) and "containerPort" in i for i in items):
            return "containerPort"
        return "port"
    return SMP_KEYS.get(field)


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items()
                if not (k.startswith("$") or k.startswith("$setElementOrder/"))}
    if isinstance(d, list):
        return [_strip(x) for x in d]
    return d


def strategic_merge_patch(target, patch):
    """Strategic merge patch for built-in types: a merge patch that merges
    lists of keyed items by key, honours $patch: replace/delete, $retainKeys
    and $deleteFromPrimitiveList, and ignores $setElementOrder (order is
    not modelled)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            f = k.split("/", 1)[1]
            if isinstance(out.get(f), list) and isinstance(v, list):
                out[f] = [x for x in out[f] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            if v.get("$patch") == "delete":
                out.pop(k, None)
            else:
                out[k] = strategic_merge_patch(out.get(k), v)
        elif isinstance(v, list):
            cur = out.get(k)
            key = _smp_key(k, v)
            if k in SMP_SETS and isinstance(cur, list):
                out[k] = cur + [x for x in v if x not in cur]
            elif key and isinstance(cur, list) and all(isinstance(i, dict) for i in v + cur):
                res = [copy.deepcopy(i) for i in cur]
                for item in v:
                    idx = next((n for n, c in enumerate(res) if c.get(key) == item.get(key)), None)
                    if item.get("$patch") == "delete":
                        if idx is not None:
                            res.pop(idx)
                    elif idx is not None:
                        res[idx] = strategic_merge_patch(res[idx], item)
                    else:
                        res.append(_strip(item))
                out[k] = res
            else:
                out[k] = _strip(v)
        else:
            out[k] = v
    if isinstance(patch.get("$retainKeys"), list):
        keep = set(patch["$retainKeys"])
        out = {k: v for k, v in out.items() if k in keep}
    return out


# ---- selectors -----------------------------------------------------------------

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VAL = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_label_selector(s):
    """Returns a list of (key, op, values); op in =, !=, in, notin, exists, !."""
    reqs = []
    if s is None or s.strip() == "":
        return reqs
    for raw in _split_top(s):
        r = raw.strip()
        m = re.match(r"^(\S+?)\s+(in|notin)\s*\((.*)\)$", r)
        if m:
            key, op = m.group(1), m.group(2)
            vals = [v.strip() for v in m.group(3).split(",")]
            vals = [v for v in vals if v != ""] if op == "notin" or any(vals) else vals
        elif r.startswith("!"):
            key, op, vals = r[1:].strip(), "!", []
        elif "!=" in r:
            key, v = r.split("!=", 1)
            key, op, vals = key.strip(), "!=", [v.strip()]
        elif "==" in r:
            key, v = r.split("==", 1)
            key, op, vals = key.strip(), "=", [v.strip()]
        elif "=" in r:
            key, v = r.split("=", 1)
            key, op, vals = key.strip(), "=", [v.strip()]
        else:
            key, op, vals = r, "exists", []
        if not key or not _LABEL_KEY.match(key) or any(not _LABEL_VAL.match(v) for v in vals):
            raise bad_request("unable to parse requirement: found '%s', expected: identifier" % r)
        reqs.append((key, op, vals))
    return reqs


def label_match(reqs, labels):
    labels = labels or {}
    for key, op, vals in reqs:
        has = key in labels
        v = labels.get(key)
        if op == "=" and not (has and v == vals[0]):
            return False
        if op == "!=" and has and v == vals[0]:
            return False
        if op == "in" and not (has and v in vals):
            return False
        if op == "notin" and has and v in vals:
            return False
        if op == "exists" and not has:
            return False
        if op == "!" and has:
            return False
    return True


def selector_match(sel, labels):
    """A metav1.LabelSelector object (matchLabels, matchExpressions In/
    NotIn/Exists/DoesNotExist) against labels: None matches nothing, {}
    everything, as LabelSelectorAsSelector makes them."""
    if not isinstance(sel, dict):
        return False
    labels = labels or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        if not _expr_match(e, labels):
            return False
    return True


def _expr_match(e, labels):
    """One matchExpressions requirement (also a NodeSelectorRequirement,
    with Gt/Lt comparing integers)."""
    key, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
    has, v = key in labels, labels.get(key)
    if op == "In":
        return has and v in vals
    if op == "NotIn":
        return not has or v not in vals
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt") and has and len(vals) == 1:
        try:
            a, b = int(v), int(vals[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_selector_term_match(term, node):
    """A NodeSelectorTerm: its matchExpressions on the node's labels and
    matchFields (metadata.name) all hold; an empty term matches nothing."""
    if not isinstance(term, dict):
        return False
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    if not all(isinstance(e, dict) and _expr_match(e, labels) for e in exprs):
        return False
    own = {"metadata.name": node["metadata"]["name"]}
    return all(isinstance(e, dict) and e.get("key") == "metadata.name" and _expr_match(e, own)
               for e in fields)


def tolerates(tolerations, taint):
    """Whether one of the pod's tolerations tolerates the taint
    (v1.Toleration.ToleratesTaint)."""
    for t in tolerations or []:
        if not isinstance(t, dict):
            continue
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if (t.get("operator") or "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def scaled_value(v, total, round_up):
    """intstr.GetScaledValueFromIntOrPercent: an int as it is, "N%" of
    total rounded up or down; ValueError for anything else."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.endswith("%") and v[:-1].isdigit():
        n = int(v[:-1]) * total
        return -(-n // 100) if round_up else n // 100
    raise ValueError("invalid value for IntOrString: invalid value %r" % (v,))


def parse_field_selector(s, allowed):
    """Returns [(path, op, value)]; a field outside `allowed` is a 400 as in
    the real server."""
    reqs = []
    if s is None or s.strip() == "":
        return reqs
    for raw in s.split(","):
        r = raw.strip()
        for op in ("!=", "==", "="):
            if op in r:
                k, v = r.split(op, 1)
                k = k.strip()
                if k not in allowed:
                    raise bad_request('field label not supported: %s' % k)
                reqs.append((k, "!=" if op == "!=" else "=", v.strip()))
                break
        else:
            raise bad_request("invalid selector: '%s'; can't understand '%s'" % (s, r))
    return reqs


def get_path(obj, dotted):
    cur = obj
    for p in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return cur


def field_match(reqs, obj):
    for k, op, v in reqs:
        got = get_path(obj, k)
        got = "" if got is None else (str(got).lower() if isinstance(got, bool) else str(got))
        if (op == "=") != (got == v):
            return False
    return True


def jsonpath(obj, expr):
    """The JSONPath subset printer columns use: .a.b, [n], [?(@.k=="v")]."""
    tokens = re.findall(r'\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*["\']([^"\']*)["\']\)\]|\[\*\]',
                        expr.strip())
    cur = [obj]
    for name, idx, fk, fv in tokens:
        nxt = []
        for c in cur:
            if name:
                if isinstance(c, dict) and name in c:
                    nxt.append(c[name])
            elif idx:
                if isinstance(c, list) and int(idx) < len(c):
                    nxt.append(c[int(idx)])
            elif fk:
                if isinstance(c, list):
                    nxt.extend(x for x in c if isinstance(x, dict) and str(get_path(x, fk)) == fv)
            elif isinstance(c, list):
                nxt.extend(c)
        cur = nxt
    return cur[0] if cur else None


DNS1123_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---- protobuf: the two request kinds kubectl only sends that way ------------------

def _pb_fields(b):
    """Protobuf wire format -> [(field number, value)]: varints as ints,
    length-delimited as bytes (fixed32/64 skipped)."""
    out, i = [], 0
    while i < len(b):
        key, i = _pb_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _pb_varint(b, i)
        elif wt == 2:
            n, i = _pb_varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = None, i + 8
        elif wt == 5:
            v, i = None, i + 4
        else:
            raise ValueError("protobuf wire type %d" % wt)
        out.append((num, v))
    return out


def _pb_varint(b, i):
    shift = n = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7f) << shift
        shift += 7
        if not c & 0x80:
            return n, i


# Field numbers of k8s.io/api's generated.proto for the kinds kubectl's
# typed commands (create secret/configmap/namespace/serviceaccount/role/
# rolebinding/token, auth can-i, drain's evictions) send as protobuf. Value kinds: s string,
# i varint, b bool, rs repeated string, map string->string, mapb
# string->bytes (base64 in JSON), m:T message, rm:T repeated message.
_META = (1, "metadata", "m:ObjectMeta")
_PB = {
    "ObjectMeta": [(1, "name", "s"), (2, "generateName", "s"), (3, "namespace", "s"),
                   (11, "labels", "map"), (12, "annotations", "map"), (14, "finalizers", "rs")],
    "Secret": [_META, (2, "data", "mapb"), (3, "type", "s"), (4, "stringData", "map"),
               (5, "immutable", "b")],
    "ConfigMap": [_META, (2, "data", "map"), (3, "binaryData", "mapb"), (4, "immutable", "b")],
    "Namespace": [_META],
    "ServiceAccount": [_META, (4, "automountServiceAccountToken", "b")],
    "Role": [_META, (2, "rules", "rm:PolicyRule")],
    "ClusterRole": [_META, (2, "rules", "rm:PolicyRule")],
    "PolicyRule": [(1, "verbs", "rs"), (2, "apiGroups", "rs"), (3, "resources", "rs"),
                   (4, "resourceNames", "rs"), (5, "nonResourceURLs", "rs")],
    "RoleBinding": [_META, (2, "subjects", "rm:Subject"), (3, "roleRef", "m:RoleRef")],
    "ClusterRoleBinding": [_META, (2, "subjects", "rm:Subject"), (3, "roleRef", "m:RoleRef")],
    "Subject": [(1, "kind", "s"), (2, "apiGroup", "s"), (3, "name", "s"), (4, "namespace", "s")],
    "RoleRef": [(1, "apiGroup", "s"), (2, "kind", "s"), (3, "name", "s")],
    "TokenRequest": [_META, (2, "spec", "m:TokenRequestSpec")],
    "TokenRequestSpec": [(1, "audiences", "rs"), (4, "expirationSeconds", "i"),
                         (3, "boundObjectRef", "m:BoundObjectReference")],
    "BoundObjectReference": [(1, "kind", "s"), (2, "apiVersion", "s"), (3, "name", "s"),
                             (4, "uid", "s")],
    "SelfSubjectAccessReview": [_META, (2, "spec", "m:SelfSubjectAccessReviewSpec")],
    "SelfSubjectAccessReviewSpec": [(1, "resourceAttributes", "m:ResourceAttributes"),
                                    (2, "nonResourceAttributes", "m:NonResourceAttributes")],
    "ResourceAttributes": [(1, "namespace", "s"), (2, "verb", "s"), (3, "group", "s"),
                           (4, "version", "s"), (5, "resource", "s"), (6, "subresource", "s"),
                           (7, "name", "s")],
    "NonResourceAttributes": [(1, "path", "s"), (2, "verb", "s")],
    # policy/v1 Eviction (kubectl drain's typed client)
    "Eviction": [_META, (2, "deleteOptions", "m:DeleteOptions")],
    "DeleteOptions": [(1, "gracePeriodSeconds", "i"), (2, "preconditions", "m:Preconditions"),
                      (3, "orphanDependents", "b"), (4, "propagationPolicy", "s"), (5, "dryRun", "rs")],
    "Preconditions": [(1, "uid", "s"), (2, "resourceVersion", "s")],
}


def _pb_decode(b, typ):
    spec = {num: (name, kind) for num, name, kind in _PB[typ]}
    d = {}
    for num, v in _pb_fields(b):
        if num not in spec:
            continue
        name, kind = spec[num]
        if kind == "s":
            d[name] = v.decode("utf-8", "replace")
        elif kind == "i":
            d[name] = v
        elif kind == "b":
            d[name] = bool(v)
        elif kind == "rs":
            d.setdefault(name, []).append(v.decode("utf-8", "replace"))
        elif kind in ("map", "mapb"):
            ent = dict(_pb_fields(v))
            k = ent.get(1, b"").decode("utf-8", "replace")
            val = ent.get(2, b"")
            d.setdefault(name, {})[k] = base64.b64encode(val).decode() if kind == "mapb" \
                else val.decode("utf-8", "replace")
        elif kind.startswith("m:"):
            d[name] = _pb_decode(v, kind[2:])
        elif kind.startswith("rm:"):
            d.setdefault(name, []).append(_pb_decode(v, kind[3:]))
    return d


def decode_protobuf(raw):
    """The Kubernetes protobuf envelope ("k8s\\0" + runtime.Unknown) of one
    of the kinds above, as the JSON object it stands for; None otherwise."""
    if not raw.startswith(b"k8s\x00"):
        return None
    unk = dict(_pb_fields(raw[4:]))
    tm = {n: v.decode() for n, v in _pb_fields(unk.get(1, b""))}
    kind = tm.get(2)
    if kind not in _PB or kind in ("ObjectMeta",):
        return None
    o = _pb_decode(unk.get(2, b""), kind)
    o["apiVersion"], o["kind"] = tm.get(1), kind
    return o
