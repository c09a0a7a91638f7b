# Two images, both running as a non-root user (65532):
#  - the workers' (the last stage, the default target): ringleader-worker and
#    ringleader-prepare, built with CUDA + NCCL, on NVIDIA's CUDA runtime image;
#  - the operator's (target `operator`): ringleader-operator alone, built
#    without CUDA on Debian 12 and run on Debian 12 slim with only the
#    libraries it links -- no CUDA library, so no GPU image for a control
#    plane pod.
#
#   docker build -t registry.example.com/ringleader:0.1.0 .
#   docker build --target operator -t registry.example.com/ringleader-operator:0.1.0 .
#
# Needs BuildKit (Docker 23+ uses it by default). No `# syntax=` line on
# purpose: the builder's own Dockerfile frontend is used, so a build does
# not pull a frontend image.
#
# Ubuntu 24.04, not 22.04: pkg/http uses CURLOPT_PROTOCOLS_STR (libcurl >=
# 7.85); 22.04 has libcurl 7.81.
#
# Network: only the apt steps and the pyarrow wheel download (the package
# lists, .debs and wheel kept in BuildKit cache mounts). The compile and everything after it run
# with --network=none, so once the base images are present and the apt
# layers are built (or cached), a source change rebuilds without network.
# For a machine that never has network: pull the base images and export the
# build cache once where there is network (see README, "The image").

ARG CUDA_VERSION=12.6.3
ARG UBUNTU=ubuntu24.04
# The two bases: NVIDIA's CUDA images by default. With USE_CUDA=0 (a
# CPU-only build: no nvcc, no NCCL) a Debian 12 or Ubuntu 24.04 base will do;
# `make image-test` builds this file on a Debian 12 base it makes with
# mmdebstrap (scripts/image-test.sh).
ARG BUILD_BASE=nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}
ARG RUNTIME_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ARG USE_CUDA=1
# The operator's: Debian 12 for both, so the binary meets the C library it
# was built against (one built on Ubuntu 24.04 needs glibc 2.38 or later).
ARG OPERATOR_BUILD_BASE=debian:12
ARG OPERATOR_BASE=debian:12-slim

# ---- operator build: no CUDA --------------------------------------------------------
FROM ${OPERATOR_BUILD_BASE} AS operator-build
ENV DEBIAN_FRONTEND=noninteractive
RUN rm -f /etc/apt/apt.conf.d/docker-clean && \
    echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt,sharing=locked \
    apt-get update && \
    apt-get install -y --no-install-recommends \
      build-essential pkg-config libcurl4-openssl-dev libcjson-dev libssl-dev libexpat1-dev \
      libopenblas-dev libmicrohttpd-dev libyaml-dev libpcre2-dev libutf8proc-dev
WORKDIR /src
COPY Makefile ./
COPY cmd cmd
COPY pkg pkg
# the library carries the GPU model's buffer layout (host C) for the memory accounting
COPY kernels kernels
ARG EXTRA_CFLAGS=-Wno-error
RUN --network=none \
    make -j"$(nproc)" USE_CUDA=0 CFLAGS="$EXTRA_CFLAGS" bin/ringleader-operator

# ---- operator runtime: Debian 12 slim, no CUDA ------------------------------------------
FROM ${OPERATOR_BASE} AS operator
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
RUN rm -f /etc/apt/apt.conf.d/docker-clean && \
    echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
# what `readelf -d` lists as NEEDED for ringleader-operator, and CA
# certificates for an API server a kubeconfig names by a public CA
# (OpenBLAS: the worker's own config checks, which the operator runs)
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt,sharing=locked \
    apt-get update && \
    apt-get install -y --no-install-recommends ca-certificates libcurl4 libcjson1 libssl3 libopenblas0 \
      libgomp1 libmicrohttpd12 libyaml-0-2 libpcre2-8-0 libutf8proc2
COPY --from=operator-build /src/bin/ringleader-operator /usr/local/bin/
# a missing shared library, or any CUDA one, fails the build
RUN --network=none \
    groupadd --gid 65532 ringleader && \
    useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ringleader && \
    if ldd /usr/local/bin/ringleader-operator | grep -E 'not found|libcuda|libnvidia|libnccl|libcublas|libcudnn'; then \
      echo "ringleader-operator: missing or CUDA libraries" >&2; exit 1; \
    fi
USER 65532:65532
ENTRYPOINT []
CMD ["ringleader-operator", "--help"]

# ---- build ------------------------------------------------------------------------
FROM ${BUILD_BASE} AS build
ARG USE_CUDA
ENV DEBIAN_FRONTEND=noninteractive
# keep downloaded .debs in the cache mount (the image's docker-clean hook
# would delete them after each install)
RUN rm -f /etc/apt/apt.conf.d/docker-clean && \
    echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
# libnccl-dev (USE_CUDA=1 only) comes from the CUDA apt repository the
# image has configured; the devel image already ships it (held), so this
# pins nothing new.
# Versions are not pinned (DL3008): they are the base image's Ubuntu
# release's, and pinned versions break when its archive moves on.
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt,sharing=locked \
    nccl= && if [ "$USE_CUDA" = 1 ]; then nccl=libnccl-dev; fi && \
    apt-get update && \
    apt-get install -y --no-install-recommends ${nccl:+"$nccl"} \
      build-essential pkg-config libcurl4-openssl-dev libcjson-dev libssl-dev libexpat1-dev \
      libopenblas-dev libmicrohttpd-dev libyaml-dev libpcre2-dev libutf8proc-dev python3 python3-venv
# Apache Arrow's C++ libraries for ringleader-prepare parquet: no distribution
# packages them, pyarrow's wheel does (the Makefile's `make parquet`). Behind
# a TLS-intercepting proxy, give its CA bundle as the optional secret pip-ca
# (--secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt; make image-test does).
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi && \
    python3 -m venv /opt/arrow && /opt/arrow/bin/pip install -q --disable-pip-version-check pyarrow

WORKDIR /src
COPY Makefile ./
COPY scripts/ref_venv.sh scripts/
COPY cmd cmd
COPY pkg pkg
COPY kernels kernels
COPY tests/support/make_parquet.py tests/support/
# CUDA_ARCHS: nvcc -gencode flags (the Makefile's default: sm_80 and sm_90).
# EXTRA_CFLAGS: warnings are not fatal here; the tested compiler is
# Debian 12's gcc 12 (make test, -Werror), this image's is Ubuntu's gcc 13.
ARG CUDA_ARCHS=
ARG EXTRA_CFLAGS=-Wno-error
RUN --network=none \
    make -j"$(nproc)" USE_CUDA="$USE_CUDA" CFLAGS="$EXTRA_CFLAGS" ${CUDA_ARCHS:+CUDA_ARCHS="$CUDA_ARCHS"} \
      ARROW_VENV=/opt/arrow bin/ringleader-worker bin/ringleader-prepare lib/ringleader/libringleader-parquet.so && \
    mkdir -p /out/bin /out/data /out/lib/ringleader && \
    cp bin/ringleader-worker bin/ringleader-prepare /out/bin/ && \
    pa=$(/opt/arrow/bin/python -c 'import pyarrow; print(pyarrow.get_library_dirs()[0])') && \
    cp lib/ringleader/libringleader-parquet.so "$pa"/libarrow.so.[0-9]* "$pa"/libparquet.so.[0-9]* /out/lib/ringleader/ && \
    bin/ringleader-prepare arith --out /out/data/arith && \
    mkdir /tmp/pq && /opt/arrow/bin/python tests/support/make_parquet.py /tmp/pq && \
    bin/ringleader-prepare parquet --out /tmp/pq/out /tmp/pq/a.parquet /tmp/pq/b.parquet && rm -rf /tmp/pq

# ---- the workers' runtime (the default target) -------------------------------------------
FROM ${RUNTIME_BASE} AS worker
ARG USE_CUDA
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
RUN rm -f /etc/apt/apt.conf.d/docker-clean && \
    echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
# the shared libraries the binaries link, nothing else (libnccl2 and
# cuBLAS are in the CUDA runtime image already). The names are Ubuntu
# 24.04's; on a base whose archive has no 64-bit time_t renames (Debian 12)
# a name's "t64" suffix is dropped, and of "a/b" the first the archive has
# is taken (utf8proc's soname differs: 3 in Ubuntu 24.04, 2 in Debian 12).
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt,sharing=locked \
    apt-get update && \
    set -- ca-certificates libcurl4t64 libcjson1 libssl3t64 libexpat1 libopenblas0 libgomp1 \
      libmicrohttpd12t64 libyaml-0-2 libpcre2-8-0 libutf8proc3/libutf8proc2 && \
    if [ "$USE_CUDA" = 1 ]; then set -- "$@" libnccl2; fi && \
    for p; do shift; a=${p%%/*}; b=${p#*/}; \
      for c in "$a" "$b" "${a%t64}"; do apt-cache show "$c" >/dev/null 2>&1 && break; done; \
      set -- "$@" "$c"; done && \
    apt-get install -y --no-install-recommends "$@"

COPY --from=build /out/bin/ /usr/local/bin/
# the Parquet reader and Arrow's libraries beside it (its RUNPATH is $ORIGIN)
COPY --from=build /out/lib/ /usr/local/lib/
# the arithmetic corpus, where the embedded default config looks for it
# (data/arith relative to the working directory) and the examples name it
COPY --from=build /out/data/ /opt/ringleader/data/
# a missing shared library fails the build, not the first pod (libcuda
# comes from the node's driver at run time)
RUN --network=none \
    groupadd --gid 65532 ringleader && \
    useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ringleader && \
    for b in /usr/local/bin/ringleader-* /usr/local/lib/ringleader/*.so*; do \
      if ldd "$b" | grep 'not found' | grep -v 'libcuda\.so'; then echo "$b: missing libraries" >&2; exit 1; fi; \
    done

USER 65532:65532
WORKDIR /opt/ringleader
ENTRYPOINT []
CMD ["ringleader-worker", "--help"]
