#!/usr/bin/env bash
# Installs what building and testing ringleader needs on Debian 12, once.
# Idempotent: when every package is already present it only checks and exits.
# Usage: scripts/deps.sh [build|test|ref|image]
# (image: buildah and mmdebstrap, for make image-test; nothing else)
set -euo pipefail
what=${1:-build}
pkgs=(build-essential pkg-config libcurl4-openssl-dev libcjson-dev libssl-dev libexpat1-dev
      libopenblas-dev libomp-dev libmicrohttpd-dev libyaml-dev libpcre2-dev libutf8proc-dev)
case "$what" in
  test) pkgs+=(libcriterion-dev clang libclang-rt-14-dev python3 python3-venv openssl etcd-server kubectl
              radosgw ceph-mon ceph-osd ceph-common curl) ;;
  ref)  pkgs+=(libcriterion-dev python3 python3-venv radosgw ceph-mon ceph-osd ceph-common) ;;
  build) ;;
  image) pkgs=(buildah mmdebstrap) ;;
  *) echo "deps.sh: unknown target '$what' (build|test|ref|image)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
