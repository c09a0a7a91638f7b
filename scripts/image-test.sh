#!/usr/bin/env bash
# make image-test: the Dockerfile built and run without a Docker engine.
#
#   1. a Debian 12 base (mmdebstrap, minbase, Debian's packages), cached as a
#      tarball in $RL_IMAGE_CACHE (default /var/cache/ringleader-image) under
#      a hash of how it is made, and rebuilt when older than
#      $RL_IMAGE_BASE_MAX_DAYS (30);
#   2. that tarball imported as the image localhost/ringleader-base:debian12
#      into a throwaway buildah store (vfs) under /var/tmp;
#   3. the Dockerfile built on it with `buildah bud` (chroot isolation,
#      USE_CUDA=0, EXTRA_CFLAGS empty: warnings stay errors with Debian 12's
#      gcc, the tested compiler), twice: the workers' image (the default
#      target) and the operator's (--target operator), every base the
#      Debian 12 one;
#   4. in the workers' image, as the image's user 65532:65532 with the root
#      file system read-only and a tmpfs at /tmp (a pod's
#      readOnlyRootFilesystem + emptyDir): the worker on the embedded default
#      (it must train and answer held-out sums), ringleader-prepare
#      --help and its Parquet reader (Arrow must answer); in the operator's, the same way, ringleader-operator --help,
#      and ldd must show every library found and none of CUDA's.
#
# Needs root (buildah's chroot isolation, mmdebstrap's root mode, a bind
# mount) and network to Debian's archive (mmdebstrap and the Dockerfile's
# apt steps; the apt .debs and lists are kept in buildah's cache mounts
# under $RL_IMAGE_CACHE/tmp, so a second run downloads little).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'image-test: %s\n' "$*"; }
die() { printf 'image-test: FAILED: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (buildah chroot isolation, mmdebstrap, a read-only bind mount)"
scripts/deps.sh image

CACHE=${RL_IMAGE_CACHE:-/var/cache/ringleader-image}
MAX_DAYS=${RL_IMAGE_BASE_MAX_DAYS:-30}
MIRROR=${RL_IMAGE_MIRROR:-http://deb.debian.org}
T0=$SECONDS
lap() { printf '%ds' $((SECONDS - $1)); }

# ---- 1. the base rootfs, made once per recipe ---------------------------------------
MM_ARGS=(--variant=minbase --mode=root --format=tar
         --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
         --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
         bookworm)
MM_SOURCES=("deb $MIRROR/debian bookworm main" "deb $MIRROR/debian bookworm-updates main"
            "deb $MIRROR/debian-security bookworm-security main")
key=$( { mmdebstrap --version; printf '%s\n' "${MM_ARGS[@]}" "${MM_SOURCES[@]}"; } | sha256sum | cut -c1-16)
base_tar=$CACHE/debian12-$key.tar
mkdir -p "$CACHE/tmp"
exec 9>"$CACHE/lock"
timeout 3600 flock 9 || die "another image-test held $CACHE/lock for an hour"
if [ -f "$base_tar" ] && [ -z "$(find "$base_tar" -mtime +"$MAX_DAYS")" ]; then
  say "base: cached $base_tar ($(du -m "$base_tar" | cut -f1) MB, $(( ($(date +%s) - $(stat -c %Y "$base_tar")) / 3600 )) h old)"
else
  t=$SECONDS
  say "base: mmdebstrap ${MM_ARGS[*]} -> $base_tar"
  rm -f "$CACHE"/debian12-*.tar "$CACHE"/debian12-*.tar.part
  nice timeout 1200 mmdebstrap --quiet "${MM_ARGS[@]}" "$base_tar.part" "${MM_SOURCES[@]}" \
    || die "mmdebstrap failed (network to $MIRROR?)"
  mv "$base_tar.part" "$base_tar"
  say "base: built in $(lap "$t") ($(du -m "$base_tar" | cut -f1) MB)"
fi

# ---- 2. a throwaway buildah store with the base imported -----------------------------
WORK=$(mktemp -d /var/tmp/ringleader-image.XXXXXX)
LOGS=${RL_IMAGE_LOGS:-build/image-test}   # build.log, worker.log, ... of the last run
rm -rf "$LOGS" && mkdir -p "$LOGS"
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
B() { "${BUILDAH[@]}" "$@"; }
RO_ROOTS=()
cleanup() {
  set +e
  for r in "${RO_ROOTS[@]}"; do umount -l "$r"; done
  B rm --all >/dev/null 2>&1
  # a store's leftover mounts (vfs has none but /run's) before its files go
  grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
export TMPDIR=$WORK/tmp   # buildah's temporary files (the bud's: below)
mkdir -p "$TMPDIR"
t=$SECONDS
ctr=$(B from scratch)
B add --quiet "$ctr" "$base_tar" / >/dev/null
B commit --quiet --rm "$ctr" localhost/ringleader-base:debian12 >/dev/null
say "base: imported as localhost/ringleader-base:debian12 in $(lap "$t")"

# ---- 3. the Dockerfile, both stages on that base --------------------------------------
# Two things Debian 12's buildah (1.28) cannot take, removed from a copy:
#  - RUN --network=none: it parses only --mount on RUN, so those steps (the
#    compile, the user and library check) run here with the build's network;
#  - sharing=locked on two cache mounts of one RUN: it releases only the last
#    one's lock (containers/buildah#4342, fixed in 1.29), so the runtime
#    stage's apt step would wait forever for the build stage's; the mounts
#    are shared here instead (one image-test at a time holds $CACHE/lock).
sed -e 's/^RUN --network=none /RUN /' -e 's/,sharing=locked//g' Dockerfile >"$WORK/Dockerfile"
bv=$(buildah --version | awk '{print $3}')
n=$(grep -c '^RUN --network=none ' Dockerfile || true)
[ "$n" -eq 0 ] || say "build: buildah $bv has no RUN --network; $n RUN step(s) of the Dockerfile run with network here"
n=$(grep -c 'sharing=locked' Dockerfile || true)
[ "$n" -eq 0 ] || say "build: buildah $bv leaves sharing=locked cache mounts locked (buildah#4342); $n made shared here"
# bud TAG LOG [--target STAGE]: the Dockerfile built on the Debian 12 base
# pip in the build (pyarrow) trusts what this machine's pip trusts: a proxy's CA
PIP_CA=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
bud() {
  local tag=$1 log=$2; shift 2
  [ -s "$PIP_CA" ] && set -- "$@" --secret "id=pip-ca,src=$PIP_CA"
  # TMPDIR: where buildah keeps RUN --mount=type=cache directories (the apt cache)
  TMPDIR=$CACHE/tmp nice timeout 2700 "${BUILDAH[@]}" bud --isolation chroot --format docker --pull=never --layers=false \
    --ignorefile .dockerignore -f "$WORK/Dockerfile" "$@" \
    --build-arg BUILD_BASE=localhost/ringleader-base:debian12 \
    --build-arg RUNTIME_BASE=localhost/ringleader-base:debian12 \
    --build-arg OPERATOR_BUILD_BASE=localhost/ringleader-base:debian12 \
    --build-arg OPERATOR_BASE=localhost/ringleader-base:debian12 \
    --build-arg USE_CUDA=0 --build-arg EXTRA_CFLAGS= \
    -t "$tag" . 2>&1 | while IFS= read -r l; do printf '%(%T)T %s\n' -1 "$l"; done >"$log" \
    || { tail -n 60 "$log"; die "buildah bud $* failed (last lines above)"; }
  grep -E '^[0-9:]+ (\[[0-9]/[0-9]\] )?(STEP|COMMIT)' "$log" | cut -c1-140 | sed 's/^/  /'
}
t=$SECONDS
say "build: buildah bud --isolation chroot --format docker --pull=never --build-arg USE_CUDA=0 (every base: the Debian 12 one)"
bud localhost/ringleader:image-test "$LOGS/build.log"
say "build: the workers' image in $(lap "$t"), $(B images --format '{{.Size}}' localhost/ringleader:image-test)"
t=$SECONDS
bud localhost/ringleader-operator:image-test "$LOGS/build-operator.log" --target operator
say "build: the operator's image (--target operator) in $(lap "$t"), $(B images --format '{{.Size}}' localhost/ringleader-operator:image-test)"

# ---- 4. run them: the image's user, read-only root, tmpfs /tmp ---------------------------
# buildah run has no --read-only, and its chroot isolation ignores the
# spec's root.readonly: the container's root is made read-only underneath
# it, by a read-only bind mount of its mount point, which buildah's chroot
# inherits. buildah cannot then create its per-run mount points there, so
# they are made first in the container's layer; and after each run it fails
# to remove them again and panics (exit 2): on this root its exit status
# means nothing, so each command's own comes back on a marker line.
# ro_open IMAGE: ctr becomes a container of IMAGE whose root is read-only
# (its USER must be 65532:65532; wd is its WorkingDir, / when it sets none)
ro_open() {
  local user root
  user=$(B inspect --format '{{.Docker.Config.User}}' "$1")
  wd=$(B inspect --format '{{.Docker.Config.WorkingDir}}' "$1")
  [ -n "$wd" ] || wd=/
  [ "$user" = 65532:65532 ] || die "$1: the image's USER is '$user', not 65532:65532"
  ctr=$(B from --pull=never "$1")
  root=$(B mount "$ctr")
  for f in /etc/hosts /etc/hostname /etc/resolv.conf /run/.containerenv; do
    [ -e "$root$f" ] || touch "$root$f"
  done
  mount --bind "$root" "$root"
  mount -o remount,bind,ro "$root"
  RO_ROOTS+=("$root")
}
# in CMD... as the image's user (or --user), a tmpfs at /tmp as a pod's emptyDir;
# stdout+stderr to LOG, buildah's own to LOG.buildah; returns CMD's status
ro_run() {
  local log=$1 to=$2; shift 2
  local opts=(); [ "$1" = --user ] && { opts=(--user "$2"); shift 2; }
  timeout -k 30 "$to" "${BUILDAH[@]}" run --isolation chroot --mount type=tmpfs,destination=/tmp,tmpfs-mode=1777 \
    "${opts[@]}" "$ctr" -- sh -c '"$@" 2>&1; echo "image-test-exit=$?"' sh "$@" >"$log" 2>"$log.buildah" || true
  local rc; rc=$(sed -n 's/^image-test-exit=//p' "$log" | tail -n 1)
  sed -i '/^image-test-exit=/d' "$log"
  [ -n "$rc" ] || { cat "$log.buildah" >&2; die "buildah run $* did not run (or ran past ${to}s)"; }
  return "$rc"
}
# probe NAME: the open container runs as 65532:65532 in wd, / read-only, /tmp writable
probe() {
  if ro_run "$LOGS/$1-ro-probe.log" 120 --user 0:0 touch /ro-probe; then die "$1: the root file system is writable (as root)"; fi
  grep -q 'Read-only file system' "$LOGS/$1-ro-probe.log" \
    || die "$1: writing / failed, but not as read-only: $(cat "$LOGS/$1-ro-probe.log")"
  ro_run "$LOGS/$1-probe.log" 120 sh -c 'id -u; id -g; pwd; touch /tmp/probe && echo tmp-writable' \
    || die "$1: probe as the image's user failed: $(cat "$LOGS/$1-probe.log")"
  [ "$(cat "$LOGS/$1-probe.log")" = $'65532\n65532\n'"$wd"$'\ntmp-writable' ] \
    || die "$1: probe as the image's user: unexpected: $(cat "$LOGS/$1-probe.log")"
  say "run: $1: as the image's USER 65532:65532 in $wd; root read-only ($(head -n 1 "$LOGS/$1-ro-probe.log") as root), /tmp a writable tmpfs"
}
# run_help NAME BINARY: BINARY --help exits 0 in the open container
run_help() {
  ro_run "$LOGS/$2.log" 120 "$2" --help || { cat "$LOGS/$2.log"; die "$1: $2 --help failed"; }
  say "run: $1: $2 --help exited 0: $(head -n 1 "$LOGS/$2.log" | cut -c1-100)"
}

# the operator's checks take seconds, the worker's training minutes: they come first
ro_open localhost/ringleader-operator:image-test
probe operator
run_help operator ringleader-operator
ro_run "$LOGS/operator-ldd.log" 120 ldd /usr/local/bin/ringleader-operator \
  || { cat "$LOGS/operator-ldd.log"; die "operator: ldd ringleader-operator failed"; }
if grep -E 'not found' "$LOGS/operator-ldd.log"; then die "operator: a library of ringleader-operator is missing"; fi
if grep -iE 'libcuda|libnvidia|libnccl|libcublas|libcudnn' "$LOGS/operator-ldd.log"; then
  die "operator: ringleader-operator loads a CUDA library"
fi
say "run: operator: ldd: $(awk '$1 ~ /^lib/ {print $1}' "$LOGS/operator-ldd.log" | tr '\n' ' ')(no CUDA library)"

ro_open localhost/ringleader:image-test
probe workers
say "run: (buildah $bv cannot remove its per-run mount points from a read-only root and panics after each run: the command's own exit status is used)"
t=$SECONDS
say "run: workers: ringleader-worker (the embedded default)"
rc=0; ro_run "$LOGS/worker.log" 1800 nice ringleader-worker || rc=$?
[ "$rc" -eq 0 ] || { tail -n 40 "$LOGS/worker.log"; die "the worker exited $rc"; }
grep -E '^(trained|held-out)' "$LOGS/worker.log" | sed 's/^/  /'
grep -A3 '^held-out sums answered' "$LOGS/worker.log" | tail -n 3 | sed 's/^/  /'
grep -q '^trained [0-9]* steps' "$LOGS/worker.log" || { tail -n 20 "$LOGS/worker.log"; die "no 'trained N steps' line"; }
grep -Eq '^held-out sums answered exactly: [0-9]+ of [0-9]+' "$LOGS/worker.log" \
  || { tail -n 20 "$LOGS/worker.log"; die "no held-out sums line"; }
say "run: workers: worker exited 0 in $(lap "$t")"
run_help workers ringleader-prepare
# the Parquet reader loads in the image and Arrow answers (a file that is
# not Parquet: Arrow's own message, exit 2; the build stage converted a real one)
rc=0; ro_run "$LOGS/parquet.log" 120 ringleader-prepare parquet --out /tmp/pq /etc/passwd || rc=$?
{ [ "$rc" -eq 2 ] && grep -q 'Parquet magic bytes not found' "$LOGS/parquet.log"; } \
  || { cat "$LOGS/parquet.log"; die "workers: ringleader-prepare parquet did not reach Arrow (exit $rc)"; }
say "run: workers: ringleader-prepare parquet reaches Arrow: $(head -n 1 "$LOGS/parquet.log" | cut -c1-100)"
say "passed in $(lap "$T0") (built on Debian 12, USE_CUDA=0; both images run as 65532:65532, read-only root, tmpfs /tmp)"
