"""Structural schemas of CRDs (apiextensions.k8s.io/v1), applied to custom
resources in the real API server's order: pruning of unknown fields (and
of nulls in non-nullable fields), defaulting, then OpenAPI validation with
the texts of k8s.io/kube-openapi's validator as apiextensions-apiserver
turns them into field errors. Pure functions, no I/O.

Not reproduced: x-kubernetes-validations (CEL; the server logs a warning
when a CRD carries any), allOf/anyOf/oneOf/not, string formats, list-type
and map-keys semantics (lists are atomic), embedded resources' metadata.
As in the real validator, integer formats (int32/int64) are not
range-checked: kube-openapi's format validator applies to strings only."""

import json
import re

from k8slib import APIError

ROOT_KEEP = ("apiVersion", "kind", "metadata")


# ---- field errors (k8s.io/apimachinery/pkg/util/validation/field) ----------------

class FieldError:
    """One field.Error. typ: Required, Invalid, TypeInvalid, NotSupported,
    TooLong, TooMany. node: path (list) of the object the check ran on,
    for ratcheting."""

    TYPES = {"Required": ("Required value", "FieldValueRequired"),
             "Invalid": ("Invalid value", "FieldValueInvalid"),
             "TypeInvalid": ("Invalid value", "FieldValueTypeInvalid"),
             "NotSupported": ("Unsupported value", "FieldValueNotSupported"),
             "TooLong": ("Too long", "FieldValueTooLong"),
             "TooMany": ("Too many", "FieldValueTooMany"),
             "Forbidden": ("Forbidden", "FieldValueForbidden")}

    def __init__(self, typ, field, value=None, detail="", node=None):
        self.typ, self.field, self.value, self.detail = typ, field, value, detail
        self.node = node or []

    def body(self):
        """field.Error.ErrorBody(): Required, Forbidden and TooLong omit the value."""
        name = self.TYPES[self.typ][0]
        if self.typ in ("Required", "Forbidden", "TooLong"):
            s = name
        else:
            s = "%s: %s" % (name, go_value(self.value))
        if self.detail:
            s += ": " + self.detail
        return s

    def __str__(self):
        return "%s: %s" % (self.field, self.body()) if self.field else self.body()

    def cause(self):
        return {"reason": self.TYPES[self.typ][1], "message": self.body(), "field": self.field}


def go_float(f):
    """Go's %v of a float64 (shortest form, exponent from 1e21 on)."""
    if f != f or f in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(f)]
    if f.is_integer() and abs(f) < 1e21:
        return str(int(f))
    r = repr(f)
    if "e" in r:
        m, e = r.split("e")
        e = int(e)
        return "%se%s%02d" % (m, "-" if e < 0 else "+", abs(e))
    return r


def go_value(v, nested=False):
    """How field.Error prints a bad value: %v for scalars, %q for strings,
    %#v (Go syntax) for maps and lists of an unstructured object."""
    if v is None:
        return "interface {}(nil)" if nested else "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "map[string]interface {}{%s}" % ", ".join(
            "%s:%s" % (json.dumps(k, ensure_ascii=False), go_value(v[k], True)) for k in sorted(v))
    if isinstance(v, list):
        return "[]interface {}{%s}" % ", ".join(go_value(x, True) for x in v)
    return str(v)


def invalid(kind, group, name, errs):
    """apierrors.NewInvalid: 422, reason Invalid, the aggregate message
    (duplicates dropped, several joined as [a, b]) and one cause each."""
    seen, msgs = set(), []
    for e in errs:
        s = str(e)
        if s not in seen:
            seen.add(s)
            msgs.append(s)
    qk = kind + ("." + group if group else "")
    msg = '%s "%s" is invalid' % (qk, name)
    if msgs:
        msg += ": " + (msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]")
    details = {"name": name, "kind": kind, "causes": [e.cause() for e in errs]}
    if group:
        details["group"] = group
    return APIError(422, "Invalid", msg, details)


# ---- pruning and defaulting ---------------------------------------------------------

def _child_path(path, key):
    return key if not path else path + "." + key


def prune(obj, s, path="", root=True):
    """Drops fields the schema does not specify (structural pruning), in
    place; returns the pruned paths ("spec.foo") for fieldValidation."""
    out = []
    if not isinstance(s, dict) or s.get("x-kubernetes-int-or-string"):
        return out
    if isinstance(obj, dict):
        props = s.get("properties") or {}
        addl = s.get("additionalProperties")
        preserve = bool(s.get("x-kubernetes-preserve-unknown-fields"))
        for k in list(obj.keys()):
            if root and k in ROOT_KEEP:
                continue
            p = _child_path(path, k)
            if k in props:
                out += prune(obj[k], props[k], p, False)
            elif isinstance(addl, dict):
                out += prune(obj[k], addl, p, False)
            elif addl is True or preserve:
                continue
            else:
                del obj[k]
                out.append(p)
    elif isinstance(obj, list) and isinstance(s.get("items"), dict):
        for i, v in enumerate(obj):
            out += prune(v, s["items"], "%s[%d]" % (path, i), False)
    return out


def _copy_json(v):
    return json.loads(json.dumps(v))


def default(obj, s):
    """Nulls in non-nullable fields are dropped (or defaulted), then each
    absent property with a default gets it, top-down, so a defaulted parent
    gets its children's defaults too (structuraldefaulting.Default)."""
    if not isinstance(s, dict):
        return
    if isinstance(obj, dict):
        props = s.get("properties") or {}
        for k, ps in props.items():
            if not isinstance(ps, dict):
                continue
            if k in obj and obj[k] is None and not ps.get("nullable"):
                if "default" in ps:
                    obj[k] = _copy_json(ps["default"])
                else:
                    del obj[k]
            elif k not in obj and "default" in ps:
                obj[k] = _copy_json(ps["default"])
        addl = s.get("additionalProperties")
        for k, v in obj.items():
            if k in props:
                default(v, props[k])
            elif isinstance(addl, dict):
                default(v, addl)
    elif isinstance(obj, list) and isinstance(s.get("items"), dict):
        for v in obj:
            default(v, s["items"])


# ---- validation ---------------------------------------------------------------------

def type_name(v):
    """kube-openapi's name for a JSON value's type (used in type errors)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "unknown"


def _type_ok(v, t):
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    return True


def _same_json(a, b):
    if _type_ok(a, "number") and _type_ok(b, "number"):
        return a == b
    return type(a) is type(b) and a == b


def _enum(obj, s, err):
    """field.NotSupported: every allowed value quoted, non-strings as their JSON."""
    allowed = s.get("enum")
    if isinstance(allowed, list) and not any(_same_json(obj, x) for x in allowed):
        err("NotSupported", obj, "supported values: " + ", ".join(
            json.dumps(x if isinstance(x, str) else json.dumps(x), ensure_ascii=False) for x in allowed))


def _num(n):
    return go_float(float(n)) if isinstance(n, float) else str(n)


def validate(obj, s, path="", node=None, errs=None):
    """All errors of obj against schema s, in a fixed order: per value its
    type, enum, numeric, string and array checks, then an object's required
    fields and its properties in schema order."""
    if errs is None:
        errs = []
    node = node or []
    if not isinstance(s, dict):
        return errs
    where = path if path else "body"

    def err(typ, value, detail, at_node=None):
        errs.append(FieldError(typ, path, value, detail, node if at_node is None else at_node))

    if obj is None:
        if s.get("nullable") or s.get("x-kubernetes-preserve-unknown-fields") and not s.get("type"):
            return errs
        if s.get("type") or s.get("x-kubernetes-int-or-string"):
            t = "integer,string" if s.get("x-kubernetes-int-or-string") else s["type"]
            err("TypeInvalid", "null", "%s in body must be of type %s: \"null\"" % (where, t))
        return errs
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string"):
        if not (_type_ok(obj, "integer") or isinstance(obj, str)):
            tn = type_name(obj)
            err("TypeInvalid", tn, "%s in body must be of type integer,string: \"%s\"" % (where, tn))
            return errs
    elif t and not _type_ok(obj, t):
        tn = type_name(obj)
        err("TypeInvalid", tn, "%s in body must be of type %s: \"%s\"" % (where, t, tn))
        _enum(obj, s, err)
        return errs
    _enum(obj, s, err)
    if _type_ok(obj, "number"):
        mx, mn = s.get("maximum"), s.get("minimum")
        if mx is not None:
            if s.get("exclusiveMaximum") and obj >= mx:
                err("Invalid", obj, "%s in body should be less than %s" % (where, _num(mx)))
            elif obj > mx:
                err("Invalid", obj, "%s in body should be less than or equal to %s" % (where, _num(mx)))
        if mn is not None:
            if s.get("exclusiveMinimum") and obj <= mn:
                err("Invalid", obj, "%s in body should be greater than %s" % (where, _num(mn)))
            elif obj < mn:
                err("Invalid", obj, "%s in body should be greater than or equal to %s" % (where, _num(mn)))
        mo = s.get("multipleOf")
        if mo and (obj / mo) != int(obj / mo):
            err("Invalid", obj, "%s in body should be a multiple of %s" % (where, _num(mo)))
    if isinstance(obj, str):
        if s.get("maxLength") is not None and len(obj) > s["maxLength"]:
            n = s["maxLength"]
            err("TooLong", obj, "may not be more than %d %s" % (n, "byte" if n == 1 else "bytes"))
        if s.get("minLength") is not None and len(obj) < s["minLength"]:
            err("Invalid", obj, "%s in body should be at least %d chars long" % (where, s["minLength"]))
        if s.get("pattern"):
            try:
                ok = re.search(s["pattern"], obj) is not None
            except re.error:
                ok = True
            if not ok:
                err("Invalid", obj, "%s in body should match '%s'" % (where, s["pattern"]))
    if isinstance(obj, list):
        if s.get("minItems") is not None and len(obj) < s["minItems"]:
            err("Invalid", len(obj), "%s in body should have at least %d items" % (where, s["minItems"]))
        if s.get("maxItems") is not None and len(obj) > s["maxItems"]:
            n = s["maxItems"]
            err("TooMany", len(obj), "must have at most %d %s" % (n, "item" if n == 1 else "items"))
        if s.get("uniqueItems"):
            seen = []
            for v in obj:
                if v in seen:
                    err("Invalid", obj, "%s in body shouldn't contain duplicates" % where)
                    break
                seen.append(v)
        if isinstance(s.get("items"), dict):
            for i, v in enumerate(obj):
                validate(v, s["items"], "%s[%d]" % (path, i), node + [i], errs)
    if isinstance(obj, dict):
        if s.get("minProperties") is not None and len(obj) < s["minProperties"]:
            err("Invalid", len(obj), "%s in body should have at least %d properties"
                % (where, s["minProperties"]))
        if s.get("maxProperties") is not None and len(obj) > s["maxProperties"]:
            n = s["maxProperties"]
            err("TooMany", len(obj), "must have at most %d %s" % (n, "item" if n == 1 else "items"))
        for r in s.get("required") or []:
            if r not in obj:
                errs.append(FieldError("Required", _child_path(path, r), None, "", node))
        props = s.get("properties") or {}
        for k, ps in props.items():
            if k in obj and not (not path and k in ROOT_KEEP and k == "metadata"):
                validate(obj[k], ps, _child_path(path, k), node + [k], errs)
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            for k in sorted(obj):
                if k not in props:
                    validate(obj[k], addl, _child_path(path, k), node + [k], errs)
    return errs


def _at(obj, node):
    cur = obj
    for k in node:
        if isinstance(k, int):
            if not isinstance(cur, list) or k >= len(cur):
                return _MISSING
            cur = cur[k]
        else:
            if not isinstance(cur, dict) or k not in cur:
                return _MISSING
            cur = cur[k]
    return cur


_MISSING = object()


def ratchet(errs, new, old):
    """Validation ratcheting (beta and on by default since 1.30): an error
    on a value the update did not change is not reported."""
    if old is None:
        return errs
    keep = []
    for e in errs:
        o = _at(old, e.node)
        if o is not _MISSING and o == _at(new, e.node):
            continue
        keep.append(e)
    return keep


def uses_cel(s):
    if isinstance(s, dict):
        if s.get("x-kubernetes-validations"):
            return True
        return any(uses_cel(v) for v in s.values())
    if isinstance(s, list):
        return any(uses_cel(v) for v in s)
    return False


def structural_errors(s, path):
    """The checks of a CRD's schema the stand-in makes (a subset of the
    real structural-schema rules): a type at the root (object) and on every
    property, unless int-or-string or preserve-unknown-fields."""
    errs = []
    if not isinstance(s, dict):
        errs.append(FieldError("Required", path, None, "schemas are required"))
        return errs
    if s.get("type") != "object":
        if not s.get("type"):
            errs.append(FieldError("Required", path + ".type", None, "must not be empty at the root"))
        else:
            errs.append(FieldError("Invalid", path + ".type", s.get("type"), "must be object at the root"))

    def walk(x, p):
        for k, ps in (x.get("properties") or {}).items():
            q = "%s.properties[%s]" % (p, k)
            if not isinstance(ps, dict):
                continue
            if not ps.get("type") and not ps.get("x-kubernetes-int-or-string") and \
                    not ps.get("x-kubernetes-preserve-unknown-fields"):
                errs.append(FieldError("Required", q + ".type", None,
                                       "must not be empty for specified object fields"))
            walk(ps, q)
        if isinstance(x.get("items"), dict):
            walk(x["items"], p + ".items")
        if isinstance(x.get("additionalProperties"), dict):
            walk(x["additionalProperties"], p + ".additionalProperties")
    walk(s, path)
    return errs
