#!/usr/bin/env python3
"""Writes spec.training of the TrainingJob CRD from the worker's config
tables (`ringleader-worker --print-schema`) into manifests/crd.yaml, then
copies that file to the Helm chart. `make manifests` runs it; the manifests
test (tests/manifests/check.py) calls render() and fails when either file
differs from what this would write.

Usage: scripts/crd_training.py --worker bin/ringleader-worker [--check]
Standard library only: it runs before any venv exists."""
import argparse
import json
import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRD = "manifests/crd.yaml"
CHART_CRD = "helm/ringleader/crds/trainingjob.yaml"
MARK = "# spec.training: written by `make manifests` from `ringleader-worker --print-schema`"
INDENT = 14  # spec.training's key in the CRD

PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9 ,;.()/_+'-]*")
FLOW_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def scalar(v, flow=False):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = repr(v)
        # YAML 1.1 readers (PyYAML) take 1e-06 for a string: give the mantissa a dot
        m = re.fullmatch(r"(-?\d+)(e[-+]\d+)", s)
        return m.group(1) + ".0" + m.group(2) if m else s
    ok = (FLOW_PLAIN if flow else PLAIN).fullmatch(v) and v.lower() not in YAML_WORDS and not v.endswith(":")
    return v if ok else json.dumps(v)


def emit(node, indent):
    out = []
    for k, v in node.items():
        pad = " " * indent
        if isinstance(v, dict):
            out.append("%s%s:" % (pad, k))
            out += emit(v, indent + 2)
        elif isinstance(v, list):
            out.append("%s%s: [%s]" % (pad, k, ", ".join(scalar(x, True) for x in v)))
        elif isinstance(v, str) and len(v) > 72 and "  " not in v and v == v.strip() and "\n" not in v:
            # folded: YAML joins the lines with single spaces again
            out.append("%s%s: >-" % (pad, k))
            out += [pad + "  " + line for line in textwrap.wrap(v, 76, break_long_words=False, break_on_hyphens=False)]
        else:
            out.append("%s%s: %s" % (pad, k, scalar(v)))
    return out


def schema_of(worker):
    p = subprocess.run([worker, "--print-schema"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit("%s --print-schema failed (exit %d): %s" % (worker, p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def render(crd_text, schema):
    """crd_text with its spec.training block replaced by schema."""
    lines = crd_text.split("\n")
    at = [i for i, line in enumerate(lines) if line.strip() == MARK]
    if len(at) != 1 or lines[at[0] + 1] != " " * INDENT + "training:":
        raise ValueError("%s: no single '%s' line above spec.training" % (CRD, MARK))
    start = at[0] + 1
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > INDENT):
        end += 1
    block = [" " * INDENT + "training:"] + emit(schema, INDENT + 2)
    return "\n".join(lines[:start] + block + lines[end:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True)
    ap.add_argument("--check", action="store_true", help="only say whether the files are current")
    a = ap.parse_args()
    path = os.path.join(ROOT, CRD)
    old = open(path).read()
    new = render(old, schema_of(a.worker))
    chart = os.path.join(ROOT, CHART_CRD)
    stale = [f for f, want in ((path, new), (chart, new)) if not os.path.exists(f) or open(f).read() != want]
    if a.check:
        for f in stale:
            print("%s: not what `make manifests` writes" % os.path.relpath(f, ROOT), file=sys.stderr)
        return 1 if stale else 0
    for f in stale:
        tmp = f + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(new)
        os.replace(tmp, f)
        print("wrote %s" % os.path.relpath(f, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
