#!/usr/bin/env bash
# The reference test (make test-ref) needs PyTorch and transformers, which are
# far too heavy for the C build and must never leak into it, so they live in a
# private venv that is created once and then only checked: a second run costs
# one python start, not a download. torch from PyPI brings its CUDA wheels
# (several GB); that is the price of using the ordinary, unpinned client path.
# Usage: scripts/ref_venv.sh DIR [PIP:IMPORT ...]   (default: the reference check's set;
#        make bench's tokenizer comparison names only tokenizers and numpy)
set -euo pipefail
die() { echo "ref_venv.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ -n "$1" ] || { echo "usage: scripts/ref_venv.sh DIR [PIP:IMPORT ...]" >&2; exit 2; }
dir=$1
shift
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(torch:torch transformers:transformers tokenizers:tokenizers safetensors:safetensors
                                 numpy:numpy boto3:boto3)
py=$dir/bin/python

if [ ! -x "$py" ]; then
  command -v python3 >/dev/null || die "python3 not found (scripts/deps.sh ref installs it)"
  echo "ref_venv.sh: creating $dir" >&2
  python3 -m venv "$dir" ||
    die "python3 -m venv $dir failed (is python3-venv installed? scripts/deps.sh ref)"
fi

# pip name -> import name; install only what does not import yet.
missing=()
for spec in "${specs[@]}"; do
  "$py" -c "import ${spec#*:}" >/dev/null 2>&1 || missing+=("${spec%%:*}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "ref_venv.sh: installing ${missing[*]} into $dir (torch is several GB; first run only)" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$py" -m pip install -q --disable-pip-version-check --no-input "${missing[@]}" >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  die "pip install ${missing[*]} into $dir failed (see above); fix the cause, or rm -rf $dir and retry"
fi
imports=$(printf '%s\n' "${specs[@]}" | sed 's/.*://' | paste -sd, -)
"$py" -c "import $imports" 2>"$log" || {
  cat "$log" >&2
  die "installed, but the imports still fail in $dir; rm -rf $dir and retry"
}
