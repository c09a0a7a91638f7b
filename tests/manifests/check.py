#!/usr/bin/env python3
"""Checks manifests/, the Helm chart and the Dockerfile (run by
tests/manifests/check.sh, which provides the tools; part of `make test`
through tests/unit/test_manifests.c).

- Built-in kinds (everything in manifests/, the examples, the chart as
  `helm template` renders it) against Kubernetes' own JSON schemas, strict
  (unknown fields are errors), for Kubernetes 1.30 and the newest version
  kubernetes-validate knows.
- The CRD: a structural schema as the API server demands (every node typed,
  no properties next to additionalProperties, defaults valid, no CEL), the
  names, subresources and printer columns of docs/trainingjob.md, every
  field of that document's example, and its defaults.
- TrainingJobs (the examples, docs/trainingjob.md's example) against the
  CRD's own schema, strictly like `kubectl apply` (unknown fields are
  errors), then defaulted as the API server would and checked again; their
  embedded core types (resources, tolerations, env, metadata) against the
  core definitions. Files under tests/manifests/bad/ must be rejected, each
  with the error its "# expect:" line names.
- --json-out DIR: every example TrainingJob (defaulted) and every file
  under tests/manifests/operator-rejects/ as JSON for the C test, which
  feeds them to the operator's own spec parser (rl_op_job_parse).
- --operator BIN: `BIN render -f` of every example file (make test passes
  it): what it prints
  is a List of built-in objects valid against Kubernetes' schemas
  (strict), its pods pass the "restricted" Pod Security Standard; every
  file under tests/manifests/operator-rejects/ is refused (exit 2, one
  line naming the field its "# expect:" line names).
- The operator's RBAC: covers what the operator creates and what the
  per-job Role grants (RBAC lets nobody grant what it lacks), no
  wildcards; the Deployment's flags exist in cmd/operator/main.c.
- Helm: `helm lint --strict`, `helm template` with the default values
  (equal to manifests/: CRD byte for byte, RBAC rules, Deployment) and with
  watchNamespaces (Roles per namespace, no cluster-wide grant), values that
  must fail.
- The Dockerfile: hadolint, and what it COPYs is in the build context."""

import argparse
import copy
import functools
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import jsonschema
import yaml
from kubernetes_validate import utils as kvu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "k8s"))
import podsecurity  # noqa: E402  (the stand-in's admission: the Pod Security Standards' checks)
K8S_MIN = "1.30.0"

# docs/trainingjob.md's defaults (none under spec.training: the worker has its own)
SPEC_DEFAULTS = {"imagePullPolicy": "IfNotPresent", "replicas": 1, "nprocPerNode": 1, "gpusPerNode": 0,
                 "restartLimit": 3, "terminationGracePeriodSeconds": 60, "suspend": False, "disruptible": False,
                 "networkPolicy": True,
                 "cleanPodPolicy": "All", "metricsPort": 9090, "rdzvPort": 29400}
PRINTER_COLUMNS = [("Phase", "string", ".status.phase"), ("Ready", "integer", ".status.readyReplicas"),
                   ("Desired", "integer", ".spec.replicas"), ("Step", "integer", ".status.step"),
                   ("Loss", "number", ".status.loss"), ("Age", "date", ".metadata.creationTimestamp")]
# the CRD's fields typed as core types: (schema path, core definition)
CORE_TYPES = [("spec.resources", "io.k8s.api.core.v1.ResourceRequirements"),
              ("spec.tolerations[]", "io.k8s.api.core.v1.Toleration"),
              ("spec.env[]", "io.k8s.api.core.v1.EnvVar"),
              ("spec.env[].valueFrom", "io.k8s.api.core.v1.EnvVarSource"),
              ("spec.imagePullSecrets[]", "io.k8s.api.core.v1.LocalObjectReference"),
              ("spec.volumes[]", "io.k8s.api.core.v1.Volume"),
              ("spec.volumeMounts[]", "io.k8s.api.core.v1.VolumeMount"),
              ("spec.podMetadata", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
              ("spec.affinity", "io.k8s.api.core.v1.Affinity"),
              ("spec.topologySpreadConstraints[]", "io.k8s.api.core.v1.TopologySpreadConstraint")]
# what the operator does (docs/trainingjob.md): (apiGroup, resource, verbs)
OPERATOR_NEEDS = [("ringleader.dev", "trainingjobs", "get list watch"),
                  ("ringleader.dev", "trainingjobs/status", "patch"),
                  ("", "pods", "get list watch create delete"),
                  ("", "services", "get create"), ("", "secrets", "create"),
                  ("", "serviceaccounts", "get create"),
                  ("rbac.authorization.k8s.io", "roles", "get create"),
                  ("rbac.authorization.k8s.io", "rolebindings", "get create"),
                  ("policy", "poddisruptionbudgets", "get create"),
                  ("networking.k8s.io", "networkpolicies", "get create"),
                  ("coordination.k8s.io", "leases", "get list watch create update"),
                  ("", "events", "create patch")]
# what the per-job Role grants the workers: the operator must hold it all
WORKER_ROLE = [("coordination.k8s.io", "leases", "get create update patch"),
               ("discovery.k8s.io", "endpointslices", "get list watch")]

failures = []
checks = 0


def check(ok, where, msg=""):
    global checks
    checks += 1
    if not ok:
        failures.append("%s: %s" % (where, msg))
        print("FAIL %s: %s" % (where, msg), flush=True)
    return ok


def rel(path):
    return os.path.relpath(path, ROOT)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def docs_of_text(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def ident(doc):
    md = doc.get("metadata") or {}
    ns = md.get("namespace")
    return "%s %s%s" % (doc.get("kind"), ns + "/" if ns else "", md.get("name"))


# ---- Kubernetes' own schemas ------------------------------------------------------
kvu.schema_contents = functools.lru_cache(maxsize=None)(kvu.schema_contents)
K8S_VERSIONS = [K8S_MIN, kvu.latest_version()]


def core_defs(version=K8S_MIN):
    return kvu.schema_contents("kubernetes-json-schema/v%s-local-strict/_definitions.json" % version, version)


def validate_builtin(doc, where):
    for v in K8S_VERSIONS:
        try:
            kvu.validate(doc, v, strict=True)
            check(True, where)
        except kvu.ValidationError as e:
            check(False, where, "%s against Kubernetes %s: %s at %s" % (ident(doc), v, e.message,
                                                                         "/".join(map(str, e.path))))
        except kvu.SchemaNotFoundError as e:
            check(False, where, e.message)


def core_validator(definition):
    d = core_defs()
    return jsonschema.Draft202012Validator(dict(d, **{"$ref": "#/$defs/" + definition}))


# ---- the CRD's schema -----------------------------------------------------------------
KEYWORDS = {"description", "type", "format", "title", "default", "maximum", "exclusiveMaximum", "minimum",
            "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
            "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf", "oneOf",
            "anyOf", "not", "properties", "additionalProperties", "nullable", "example",
            "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type",
            "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-embedded-resource"}
PY_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
            "array": list}


def structural(node, path, where):
    """The API server's structural-schema rules, and our own: no CEL."""
    unknown = set(node) - KEYWORDS
    check(not unknown, where, "%s: keywords the API server does not take here: %s" % (path, sorted(unknown)))
    t = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        check(t is None, where, "%s: int-or-string with a type" % path)
        check(node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], where,
              "%s: int-or-string needs anyOf [integer, string]" % path)
    else:
        check(t in PY_TYPES or (t is None and node.get("x-kubernetes-preserve-unknown-fields")), where,
              "%s: no type (structural schemas type every node)" % path)
    for sub in ("allOf", "anyOf", "oneOf"):
        for s in node.get(sub) or []:
            check(set(s) <= {"type"} or not s.get("properties"), where, "%s.%s: no types or fields in %s" %
                  (path, sub, sub))
    if t == "object":
        props = node.get("properties") or {}
        check(not (props and "additionalProperties" in node), where,
              "%s: properties and additionalProperties together" % path)
        for k, s in props.items():
            structural(s, "%s.%s" % (path, k), where)
        ap = node.get("additionalProperties")
        if isinstance(ap, dict):
            structural(ap, path + ".*", where)
        for r in node.get("required") or []:
            check(r in props, where, "%s: required %s is not a property" % (path, r))
    if t == "array":
        check("items" in node, where, "%s: an array needs items" % path)
        if "items" in node:
            structural(node["items"], path + "[]", where)
        keys = node.get("x-kubernetes-list-map-keys")
        if keys:
            check(node.get("x-kubernetes-list-type") == "map", where, "%s: map keys on a non-map list" % path)
            for k in keys:
                check(k in (node["items"].get("required") or []), where, "%s: list map key %s not required" %
                      (path, k))
    if "enum" in node and t in PY_TYPES:
        for v in node["enum"]:
            check(isinstance(v, PY_TYPES[t]) and not (t != "boolean" and isinstance(v, bool)), where,
                  "%s: enum value %r is not a %s" % (path, v, t))
    if "default" in node:
        check(not path.startswith("metadata"), where, "%s: defaults under metadata" % path)
        errs = list(jsonschema.Draft202012Validator(to_jsonschema(node)).iter_errors(node["default"]))
        check(not errs, where, "%s: default %r is invalid: %s" % (path, node["default"],
                                                                  errs[0].message if errs else ""))


def to_jsonschema(node, path=""):
    """The CRD schema as a JSON Schema that, like `kubectl apply` (field
    validation Strict), rejects fields the schema does not have."""
    out = {}
    for k, v in node.items():
        if k.startswith("x-kubernetes-") or k in ("nullable", "example"):
            continue
        if k == "properties":
            out[k] = {p: to_jsonschema(s, "%s.%s" % (path, p)) for p, s in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = to_jsonschema(v, path + "[]")
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [to_jsonschema(s, path) for s in v]
        else:
            out[k] = v
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (node.get("type") == "object" and "additionalProperties" not in node and path != ".metadata"
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def schema_at(schema, dotted):
    """The schema node of a path like spec.env[].valueFrom (None: absent).
    Below a node that keeps unknown fields (x-kubernetes-preserve-unknown-
    fields: a core object passed through, like spec.volumes[]) every path
    is that node."""
    node = schema
    for part in path_parts(dotted):
        if (node or {}).get("x-kubernetes-preserve-unknown-fields") and part != "[]" and \
                part not in (node.get("properties") or {}):
            return node
        if part == "[]":
            node = node.get("items") if node else None
        else:
            props = (node or {}).get("properties")
            if props is not None:
                node = props.get(part)
            elif isinstance((node or {}).get("additionalProperties"), dict):
                node = node["additionalProperties"]
            else:
                node = None
        if node is None:
            return None
    return node


def path_parts(dotted):
    """spec.env[].name -> [spec, env, [], name]; a dot inside a key (a
    label key such as kueue.x-k8s.io/queue-name) is written \\."""
    return [p.replace("\\.", ".") for p in re.findall(r"(?:\\.|[^.\[\]\\])+|\[\]", dotted)]


def leaves(obj, prefix=""):
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            k = k.replace(".", "\\.")
            yield from leaves(v, "%s.%s" % (prefix, k) if prefix else k)
    elif isinstance(obj, list) and obj and all(isinstance(x, (dict, list)) for x in obj):
        for x in obj:
            yield from leaves(x, prefix + "[]")
    else:
        yield prefix


def apply_defaults(node, obj):
    """Structural defaulting, as the API server does on create."""
    if isinstance(obj, dict) and node.get("type") == "object":
        props = node.get("properties") or {}
        for k, s in props.items():
            if k not in obj and "default" in s:
                obj[k] = copy.deepcopy(s["default"])
            if k in obj:
                apply_defaults(s, obj[k])
        ap = node.get("additionalProperties")
        if isinstance(ap, dict):
            for k in obj:
                if k not in props:
                    apply_defaults(ap, obj[k])
    elif isinstance(obj, list) and isinstance(node.get("items"), dict):
        for x in obj:
            apply_defaults(node["items"], x)


def check_crd(crd, where):
    spec = crd["spec"]
    names = spec["names"]
    check(crd["metadata"]["name"] == "trainingjobs.ringleader.dev", where, "CRD name")
    check(spec["group"] == "ringleader.dev" and spec["scope"] == "Namespaced", where, "group/scope")
    check((names.get("kind"), names.get("plural"), names.get("singular"), names.get("shortNames"),
           names.get("categories")) == ("TrainingJob", "trainingjobs", "trainingjob", ["tj"], ["ringleader"]),
          where, "names: %r" % names)
    vs = spec["versions"]
    check(len(vs) == 1 and vs[0]["name"] == "v1alpha1" and vs[0]["served"] and vs[0]["storage"], where,
          "one version, v1alpha1, served and stored")
    v = vs[0]
    schema = v["schema"]["openAPIV3Schema"]
    check("x-kubernetes-validations" not in json.dumps(schema), where, "CEL rules: the test server cannot")
    structural(schema, "", where)
    md = schema["properties"].get("metadata", {})
    check(set(md.get("properties", {})) <= {"name", "generateName"}, where,
          "metadata: only name and generateName may be restricted")
    check(schema.get("required") == ["spec"] and schema["properties"]["spec"].get("required") == ["image"],
          where, "required: spec and spec.image")
    sub = v.get("subresources") or {}
    check("status" in sub, where, "status subresource")
    sc = sub.get("scale") or {}
    check(sc == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                 "labelSelectorPath": ".status.selector"}, where, "scale subresource: %r" % sc)
    for p, t in ((".spec.replicas", "integer"), (".status.replicas", "integer"), (".status.selector", "string")):
        n = schema_at(schema, p[1:])
        check(n is not None and n.get("type") == t, where, "scale path %s is not a %s field" % (p, t))
    cols = [(c["name"], c["type"], c["jsonPath"]) for c in v.get("additionalPrinterColumns") or []]
    check(cols == PRINTER_COLUMNS, where, "printer columns: %r" % cols)
    for name, typ, p in cols:
        if p.startswith(".metadata."):
            continue
        n = schema_at(schema, p[1:])
        check(n is not None and n.get("type") == typ, where, "column %s: %s is not a %s field" % (name, p, typ))
    sp = schema["properties"]["spec"]["properties"]
    for k, d in SPEC_DEFAULTS.items():
        check(sp.get(k, {}).get("default", "<none>") == d, where, "spec.%s: default %r, want %r" %
              (k, sp.get(k, {}).get("default", "<none>"), d))
    have = [p for p in leaves_of_schema(schema) if "default" in (schema_at(schema, p) or {})]
    check(sorted(have) == sorted("spec." + k for k in SPEC_DEFAULTS), where, "defaults on exactly %s, not %s" %
          (sorted(SPEC_DEFAULTS), have))
    defs = core_defs()["$defs"]
    for p, d in CORE_TYPES:
        mine = set((schema_at(schema, p) or {}).get("properties", {}))
        core = set(defs[d].get("properties", {}))
        check(mine and mine <= core, where, "%s: fields %s are not %s's" % (p, sorted(mine - core), d))
    return schema


def leaves_of_schema(node, prefix=""):
    yield prefix
    for k, s in (node.get("properties") or {}).items():
        yield from leaves_of_schema(s, "%s.%s" % (prefix, k) if prefix else k)
    if isinstance(node.get("items"), dict):
        yield from leaves_of_schema(node["items"], prefix + "[]")


def check_training_generated(worker, crd, crd_path):
    """spec.training is the worker's config tables, as `make manifests`
    writes them: the text, and the schema it reads back as."""
    spec = importlib.util.spec_from_file_location("crd_training", os.path.join(ROOT, "scripts/crd_training.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    schema = gen.schema_of(worker)
    text = open(crd_path).read()
    where = "manifests/crd.yaml"
    check(gen.render(text, schema) == text, where,
          "spec.training is not what the worker's config tables give (make manifests)")
    mine = schema_at(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "spec.training")
    check(mine == schema, where, "spec.training does not read back as `ringleader-worker --print-schema`")


def check_doc_contract(schema, crd_validator, where="docs/trainingjob.md"):
    """Every field of the document's example is in the schema, and the
    example (its spec) is a valid TrainingJob."""
    text = open(os.path.join(ROOT, "docs/trainingjob.md")).read()
    m = re.search(r"```yaml\n(.*?)```", text, re.S)
    if not check(m is not None, where, "no yaml block"):
        return
    lines = m.group(1).splitlines()
    s = next(i for i, line in enumerate(lines) if line.startswith("spec:"))
    t = next(i for i, line in enumerate(lines) if line.startswith("status:"))
    head = yaml.safe_load("\n".join(lines[:s]))
    spec = yaml.safe_load("\n".join(lines[s:t]))
    job = {"apiVersion": head["apiVersion"], "kind": head["kind"], "metadata": head["metadata"], **spec}
    for p in leaves(job["spec"], "spec"):
        check(schema_at(schema, p) is not None, where, "%s is not in the CRD schema" % p)
    errs = list(crd_validator.iter_errors(job))
    check(not errs, where, "its example is not a valid TrainingJob: %s" % "; ".join(fmt(e) for e in errs[:3]))
    for line in lines[t + 1:]:
        mm = re.match(r"^  ([A-Za-z]+)(?: / ([A-Za-z]+))?:?", line)
        for name in (mm.groups() if mm else ()):
            if name:
                check(schema_at(schema, "status." + name) is not None, where, "status.%s not in the schema" % name)


def check_status_writes(schema, where="pkg/operator"):
    """Every status field the operator writes is in the schema: the API
    server prunes the others from its /status writes, silently."""
    src = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(ROOT, "pkg/operator/*.c"))))
    fields = set(re.findall(r'(?:jset|cJSON_Add\w*ToObject)\((?:st|p->status),\s*"(\w+)"', src))
    fields |= set(re.findall(r'add_counted\([^;]*?,\s*"(\w+)"\)', src))
    fields |= set(re.findall(r'\{"ringleader\.dev/[\w-]+",\s*"(\w+)"', src))
    body = re.search(r"\nbool rl_op_set_condition\(.*?\n}\n", src, re.S)
    cond = set(re.findall(r'(?:jset|cJSON_Add\w*ToObject)\(c,\s*"(\w+)"', body.group(0) if body else ""))
    if not check(len(fields) >= 10 and {"type", "status"} <= cond, where,
                 "could not find the status fields the operator writes (tests/manifests/check.py:"
                 " check_status_writes reads pkg/operator/*.c; update it with the operator)"):
        return
    for f in sorted(fields):
        check(schema_at(schema, "status." + f) is not None, where,
              "the operator writes status.%s; the CRD schema lacks it (the API server would prune it)" % f)
    for f in sorted(cond):
        check(schema_at(schema, "status.conditions[]." + f) is not None, where,
              "the operator writes status.conditions[].%s; the CRD schema lacks it" % f)


def fmt(e):
    return "%s: %s" % (e.json_path, e.message)


def check_trainingjob(job, crd_schema, validator, where):
    """Schema-valid before and after defaulting; core types valid. Returns
    (errors, defaulted object)."""
    errs = [fmt(e) for e in validator.iter_errors(job)]
    obj = copy.deepcopy(job)
    if not errs:
        apply_defaults(crd_schema, obj)
        errs = ["after defaulting: " + fmt(e) for e in validator.iter_errors(obj)]
    if not errs:
        errs += [fmt(e) for e in core_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
                 .iter_errors(obj.get("metadata") or {})]
        for p, d in CORE_TYPES:
            val = core_validator(d)
            for x in values_at(obj, p):
                errs += ["%s: %s" % (p, fmt(e)) for e in val.iter_errors(x)]
    return errs, obj


def values_at(obj, dotted):
    cur = [obj]
    for part in path_parts(dotted):
        nxt = []
        for c in cur:
            if part == "[]":
                nxt += c if isinstance(c, list) else []
            elif isinstance(c, dict) and part in c:
                nxt.append(c[part])
        cur = nxt
    return cur


def expectation(path):
    m = re.search(r"^# expect: (.+)$", open(path).read(), re.M)
    return m.group(1).strip() if m else None


# ---- RBAC -------------------------------------------------------------------------------
def covers(rules, group, resource, verb):
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
               and verb in r.get("verbs", []) and not r.get("resourceNames") for r in rules)


def check_rules(rules, where):
    for r in rules:
        check("*" not in r.get("verbs", []) + r.get("resources", []) + r.get("apiGroups", []), where,
              "a wildcard in %r" % r)
        check(not set(r.get("verbs", [])) & {"escalate", "bind", "impersonate"}, where, "escalate/bind/impersonate")
        if "secrets" in r.get("resources", []):
            check(set(r["verbs"]) == {"create"}, where, "secrets are created, never read or rewritten: %r" % r)
    for g, res, verbs in OPERATOR_NEEDS:
        for v in verbs.split():
            check(covers(rules, g, res, v), where, "the operator needs %s on %s%s" % (v, g + "/" if g else "", res))
    for g, res, verbs in WORKER_ROLE:
        for v in verbs.split():
            check(covers(rules, g, res, v), where, "the per-job Role grants %s on %s/%s: the operator must hold it" %
                  (v, g, res))


def render_job(operator, path):
    """`operator render -f path`: (exit status, stdout, stderr)."""
    p = subprocess.run([operator, "render", "-f", path], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def check_render(operator, path, jobs):
    """An example rendered: every object a valid built-in, every pod
    admitted by the restricted Pod Security Standard; jobs x (6 + replicas)
    objects."""
    where = "render -f " + rel(path)
    rc, out, err = render_job(operator, path)
    check(rc == 0, where, "exit %d: %s" % (rc, err.strip()))
    if rc:
        return
    docs = docs_of_text(out)
    check(len(docs) == 1 and docs[0].get("kind") == "List", where, "not one List")
    items = docs[0].get("items") or []
    # Service, Secret, ServiceAccount, Role, RoleBinding, PDB, NetworkPolicy (unless off), pods
    want = sum(6 + ((j.get("spec") or {}).get("networkPolicy", True) is not False) +
               (j.get("spec") or {}).get("replicas", 1) for j in jobs)
    check(len(items) == want, where, "%d objects, want %d" % (len(items), want))
    for o in items:
        validate_builtin(o, "%s: %s" % (where, ident(o)))
        if o.get("kind") == "Pod":
            bad = podsecurity.violations(o.get("spec") or {}, "restricted")
            check(not bad, "%s: %s" % (where, ident(o)), "violates restricted: %s" % "; ".join(bad))


def check_render_refuses(operator, path, want):
    where = "render -f " + rel(path)
    rc, out, err = render_job(operator, path)
    lines = err.strip().splitlines()
    check(rc == 2 and not out and len(lines) == 1 and want in lines[0], where,
          "want exit 2 and one line naming %s, got exit %d: %r" % (want, rc, err))


def operator_flags_exist(args, where):
    src = open(os.path.join(ROOT, "cmd/operator/main.c")).read()
    for a in args:
        if a.startswith("--"):  # --name=value is --name's value (cmd/flags.c)
            check('"%s"' % a.split("=")[0] in src, where,
                  "flag %s is not one of ringleader-operator's (cmd/operator/main.c)" % a)


def container(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0]


# ---- helm -------------------------------------------------------------------------------
def helm(helm_bin, *args):
    home = os.path.join(os.path.dirname(os.path.abspath(helm_bin)), "..", "helm-home")  # in the venv
    p = subprocess.run([helm_bin, *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, HELM_CACHE_HOME=home + "/cache", HELM_CONFIG_HOME=home + "/config",
                                HELM_DATA_HOME=home + "/data"))
    return p.returncode, p.stdout, p.stderr


def render(helm_bin, *sets):
    args = ["template", "ringleader", "helm/ringleader", "-n", "ringleader-system", "--include-crds",
            "--kube-version", K8S_MIN]
    for s in sets:
        args += ["--set", s]
    rc, out, err = helm(helm_bin, *args)
    check(rc == 0, "helm template %s" % " ".join(sets), err.strip())
    return docs_of_text(out) if rc == 0 else []


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def check_helm(helm_bin, crd, operator_docs):
    chart = "helm/ringleader"
    for sets in ([], ["watchNamespaces={ml,research}"]):
        args = ["lint", "--strict", chart, "--kube-version", K8S_MIN]
        for s in sets:
            args += ["--set", s]
        rc, out, err = helm(helm_bin, *args)
        check(rc == 0, "helm lint %s" % " ".join(sets), (out + err).strip())

    cluster_role = by_kind(operator_docs, "ClusterRole")[0]
    op_deploy = by_kind(operator_docs, "Deployment")[0]

    docs = render(helm_bin)
    where = "helm template (default values)"
    for d in docs:
        if d["kind"] != "CustomResourceDefinition":
            validate_builtin(d, where)
    check([d for d in docs if d["kind"] == "CustomResourceDefinition"] == [crd], where,
          "the CRD is not manifests/crd.yaml")
    kinds = sorted(d["kind"] for d in docs)
    check(kinds == sorted(["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                           "Deployment"]), where, "objects: %s" % kinds)
    cr = by_kind(docs, "ClusterRole")
    if cr:
        check(cr[0]["rules"] == cluster_role["rules"], where, "ClusterRole rules differ from manifests/operator.yaml")
    dep = by_kind(docs, "Deployment")
    if dep:
        hc, mc = container(dep[0]), container(op_deploy)
        for k in ("command", "args", "env", "ports", "livenessProbe", "readinessProbe", "securityContext",
                  "resources", "volumeMounts"):
            check(hc.get(k) == mc.get(k), where, "Deployment container %s differs from manifests/operator.yaml:"
                  " %r vs %r" % (k, hc.get(k), mc.get(k)))
        check(dep[0]["spec"]["template"]["spec"]["securityContext"] ==
              op_deploy["spec"]["template"]["spec"]["securityContext"], where, "pod securityContext differs")
        check(dep[0]["metadata"]["name"] == op_deploy["metadata"]["name"] == "ringleader-operator", where,
              "names: ringleader-operator for `helm install ringleader`")

    docs = render(helm_bin, "watchNamespaces={ml,research}")
    where = "helm template (watchNamespaces ml, research)"
    for d in docs:
        if d["kind"] != "CustomResourceDefinition":
            validate_builtin(d, where)
    check(not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding"), where,
          "a cluster-wide grant although namespaces are set")
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in by_kind(docs, "Role")}
    binds = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in by_kind(docs, "RoleBinding")}
    for ns in ("ml", "research"):
        r = roles.get((ns, "ringleader-operator"))
        check(r is not None and r["rules"] == cluster_role["rules"], where, "Role in %s: the operator's rules" % ns)
        b = binds.get((ns, "ringleader-operator"))
        check(b is not None and b["subjects"] == [{"kind": "ServiceAccount", "name": "ringleader-operator",
                                                   "namespace": "ringleader-system"}], where, "RoleBinding in %s" % ns)
    el = roles.get(("ringleader-system", "ringleader-operator-election"))
    check(el is not None and covers(el["rules"], "coordination.k8s.io", "leases", "update"), where,
          "the election Lease's Role in the release namespace")
    dep = by_kind(docs, "Deployment")
    args = container(dep[0])["args"] if dep else []
    check("--namespace" in args and args[args.index("--namespace") + 1] == "ml,research", where,
          "--namespace ml,research in %r" % args)
    operator_flags_exist(args, where)

    docs = render(helm_bin, "leaderElection.enabled=false")
    dep = by_kind(docs, "Deployment")
    args = container(dep[0])["args"] if dep else []
    check("--leader-elect=false" in args and "--lease-name" not in args, "helm template (no election)", repr(args))
    operator_flags_exist(args, "helm template (no election)")

    for sets, why in ((["replicaCount=2", "leaderElection.enabled=false"], "two operators without an election"),
                      (["logLevel=loud"], "a log level the operator refuses"),
                      (["watchNamespaces={Not_A_Namespace}"], "a namespace that is no DNS label")):
        args = ["template", "x", chart]
        for s in sets:
            args += ["--set", s]
        rc, _, _ = helm(helm_bin, *args)
        check(rc != 0, "helm template %s" % " ".join(sets), "rendered although it is %s" % why)


# ---- Dockerfile ------------------------------------------------------------------------------
def check_dockerfile(hadolint):
    where = "Dockerfile"
    p = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    check(p.returncode == 0, where, "hadolint: " + (p.stdout + p.stderr).strip())
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    allowed = [line[1:].rstrip("/") for line in open(os.path.join(ROOT, ".dockerignore")).read().splitlines()
               if line.startswith("!")]
    for m in re.finditer(r"^COPY (?!--from)(.+)$", text, re.M):
        for src in m.group(1).split()[:-1]:
            check(os.path.exists(os.path.join(ROOT, src)), where, "COPY %s: no such path" % src)
            check(src.rstrip("/") in allowed, where, "COPY %s: excluded by .dockerignore" % src)
    for name in set(re.findall(r"bin/ringleader-([a-z]+)", text)):
        check(os.path.exists(os.path.join(ROOT, "cmd", name, "main.c")), where, "no cmd/%s/main.c" % name)


# ---- main ----------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    ap.add_argument("--hadolint", required=True)
    ap.add_argument("--json-out", help="write TrainingJobs for the operator's parser here")
    ap.add_argument("--operator", help="ringleader-operator, to check what `render` prints")
    ap.add_argument("--worker", required=True, help="ringleader-worker, whose --print-schema is spec.training")
    a = ap.parse_args()

    crd_path = os.path.join(ROOT, "manifests/crd.yaml")
    chart_crd = os.path.join(ROOT, "helm/ringleader/crds/trainingjob.yaml")
    check(open(crd_path, "rb").read() == open(chart_crd, "rb").read(), rel(chart_crd),
          "not byte-identical to manifests/crd.yaml (make manifests)")
    crd = load_docs(crd_path)[0]
    check_training_generated(a.worker, crd, crd_path)
    validate_builtin(crd, "manifests/crd.yaml")
    schema = check_crd(crd, "manifests/crd.yaml")
    validator = jsonschema.Draft202012Validator(to_jsonschema(schema), format_checker=jsonschema.FormatChecker())
    check_doc_contract(schema, validator)
    check_status_writes(schema)

    operator_docs = load_docs(os.path.join(ROOT, "manifests/operator.yaml"))
    for d in operator_docs:
        validate_builtin(d, "manifests/operator.yaml")
    check(sorted(d["kind"] for d in operator_docs) ==
          sorted(["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"]),
          "manifests/operator.yaml", "objects")
    check_rules(by_kind(operator_docs, "ClusterRole")[0]["rules"], "manifests/operator.yaml ClusterRole")
    dep = by_kind(operator_docs, "Deployment")[0]
    operator_flags_exist(container(dep)["args"], "manifests/operator.yaml")
    check(dep["spec"]["template"]["spec"]["serviceAccountName"] ==
          by_kind(operator_docs, "ServiceAccount")[0]["metadata"]["name"] ==
          by_kind(operator_docs, "ClusterRoleBinding")[0]["subjects"][0]["name"], "manifests/operator.yaml",
          "one ServiceAccount: the Deployment's and the binding's")

    out = a.json_out
    if out:
        os.makedirs(out, exist_ok=True)
    secrets = {}
    jobs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "manifests/examples/*.yaml"))):
        for d in load_docs(path):
            if d.get("kind") == "TrainingJob":
                jobs.append((path, d))
            else:
                validate_builtin(d, rel(path))
                if d.get("kind") == "Secret":
                    secrets[d["metadata"]["name"]] = set(d.get("stringData") or {}) | set(d.get("data") or {})
    check(len(jobs) >= 3, "manifests/examples", "fewer than 3 TrainingJobs")
    for path, d in jobs:
        where = "%s (%s)" % (rel(path), ident(d))
        errs, obj = check_trainingjob(d, schema, validator, where)
        check(not errs, where, "; ".join(errs[:5]))
        cs = ((obj.get("spec") or {}).get("s3") or {}).get("credentialsSecret")
        if cs:
            keys = {cs.get("accessKeyIdKey") or "AWS_ACCESS_KEY_ID", cs.get("secretAccessKeyKey") or
                    "AWS_SECRET_ACCESS_KEY"}
            check(cs["name"] in secrets and keys <= secrets[cs["name"]], where,
                  "credentialsSecret %s with keys %s is not among the examples" % (cs["name"], sorted(keys)))
        if out:
            name = "example-%s-%s.json" % (os.path.basename(path)[:-5], obj["metadata"]["name"])
            with open(os.path.join(out, name), "w") as f:
                json.dump({"expect": None, "object": obj}, f)

    bad = sorted(glob.glob(os.path.join(ROOT, "tests/manifests/bad/*.yaml")))
    check(len(bad) >= 5, "tests/manifests/bad", "fewer than 5 cases")
    for path in bad:
        want = expectation(path)
        errs, _ = check_trainingjob(load_docs(path)[0], schema, validator, rel(path))
        check(want and any(want in e for e in errs), rel(path),
              "want an error with %r, got %s" % (want, errs or "none: accepted"))

    for path in sorted(glob.glob(os.path.join(ROOT, "tests/manifests/operator-rejects/*.yaml"))):
        want = expectation(path)
        errs, obj = check_trainingjob(load_docs(path)[0], schema, validator, rel(path))
        check(want and not errs, rel(path), "must pass the schema (the operator is to refuse it): %s" % errs[:3])
        if out:
            with open(os.path.join(out, "reject-" + os.path.basename(path)[:-5] + ".json"), "w") as f:
                json.dump({"expect": want, "object": obj}, f)
        if a.operator:
            check_render_refuses(a.operator, path, want)

    if a.operator:
        for path in sorted(set(p for p, _ in jobs)):
            check_render(a.operator, path, [d for p, d in jobs if p == path])

    check_helm(a.helm, crd, operator_docs)
    check_dockerfile(a.hadolint)

    print("manifests: %d checks, %d failures (Kubernetes %s)" % (checks, len(failures), ", ".join(K8S_VERSIONS)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
