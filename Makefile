# ringleader: one entry point.
#   make            build bin/ringleader-worker and bin/ringleader-prepare
#   make run        install deps, build, train the embedded default (arithmetic)
#   make test       install deps, build, run the CPU test suite (Criterion + fuzz smoke)
#   make test-ref   compare the CPU model with Hugging Face transformers (PyTorch)
#   make asan       build and run the tests under ASan + UBSan
#   make fuzz       run every libFuzzer target for FUZZ_SECONDS each
#   make bench      CPU throughput benchmarks, JSON lines on stdout
#   make bench-cpu-vs-torch   the CPU trainer beside PyTorch's (eager, torch.compile), alternating
#   make test-gpu / bench-gpu   GPU kernels vs the CPU reference / GPU benchmark beside PyTorch
#   make bench-gpu-plan   the GPU step's FLOPs, bytes, launches and roofline, without a GPU
#   make test-gpu-emu   the same GPU checks with the CUDA code emulated on the CPU (kernels/README.md)
#   make image-test the Dockerfile built with buildah on a Debian 12 base (CPU) and run in it (root)

BUILD   ?= build
BIN     ?= bin
CC      ?= gcc
OPT     ?= -O3 -g
SAN     ?=
PKGS    := libcjson openblas libcurl openssl expat libmicrohttpd yaml-0.1 libpcre2-8 libutf8proc
CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wvla -fopenmp \
                 -Ipkg -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_COMMON) $(OPT) $(SAN) $(CUDA_DEFS) $(CFLAGS)
LDLIBS  := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -fopenmp -lpthread -lm

# ---- CUDA detection: nvcc and nccl.h both found -> the GPU path is built ----
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME := $(if $(NVCC),$(abspath $(dir $(NVCC))/..))
NCCL_H  := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/include/nccl.h /usr/include/nccl.h))
USE_CUDA ?= $(if $(and $(NVCC),$(NCCL_H)),1,0)
ifeq ($(USE_CUDA),1)
  # sm_80 and sm_90 machine code always, compute_90 PTX for GPUs newer than
  # both, and the visible GPU's own arch when it is another one of 8.0 or up
  # (the kernels use bf16 tensor-core instructions; nothing is added where
  # nvidia-smi finds no GPU).
  GPU_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | \
              tr -d ' .' | awk '/^[0-9]+$$/ && $$1 >= 80 && $$1 != 80 && $$1 != 90')
  GPU_COMMA := ,
  CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90] \
                $(if $(GPU_CC),-gencode arch=compute_$(GPU_CC)$(GPU_COMMA)code=sm_$(GPU_CC))
  CUDA_DEFS  := -DRL_CUDA=1 -I$(CUDA_HOME)/include
  KERNEL_SRCS := $(wildcard kernels/*.cu)
  KERNEL_OBJS := $(KERNEL_SRCS:%.cu=$(BUILD)/%.o)
  CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnccl -lcublasLt -lstdc++
  LDLIBS  += $(CUDA_LDLIBS)
endif

# kernels/gpu_layout.c: the GPU model's buffer layout in host C, which the
# memory accounting reads in every build
PKG_SRCS := $(sort $(wildcard pkg/*/*.c)) kernels/gpu_layout.c
PKG_OBJS := $(PKG_SRCS:%.c=$(BUILD)/%.o)
LIB      := $(BUILD)/libringleader.a
# The flags this build directory's objects were made with (written below,
# once the nvcc flags are known): objects depend on it, so another
# USE_CUDA, OPT or SAN in the same BUILD makes them again instead of
# linking a mix (a USE_CUDA=0 library under make gpu-portable did).
FLAGS_STAMP := $(BUILD)/.flags
CMDS     := worker prepare operator
BINS     := $(CMDS:%=$(BIN)/ringleader-%)
# Tests in tiers, one Criterion binary each, all on the helpers in
# tests/support: unit (no server, no long training: the fast loop, under
# two minutes on 2 cores, make test-unit), integration (radosgw, etcd, the
# Kubernetes stand-in, kubectl as an oracle; DDP ranks and minutes-long
# training runs) and e2e (the whole system: the operator binary with
# kubectl and worker pods, the binaries' command lines, the default job
# trained).
# build/tests/all holds every tier, so make test and make asan stay one
# Criterion run with one summary line.
TEST_TIERS := unit integration e2e
TEST_SUPPORT_SRCS := $(sort $(wildcard tests/support/*.c))
TEST_SUPPORT_OBJS := $(TEST_SUPPORT_SRCS:tests/%.c=$(BUILD)/tests/obj/%.o)
tier_objs = $(patsubst tests/%.c,$(BUILD)/tests/obj/%.o,$(sort $(wildcard tests/$(1)/*.c)))
TEST_OBJS := $(foreach t,$(TEST_TIERS),$(call tier_objs,$(t))) $(TEST_SUPPORT_OBJS)
TEST_BIN := $(BUILD)/tests/all
TIER_BINS := $(TEST_TIERS:%=$(BUILD)/tests/%)
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_SECONDS ?= 30

.PHONY: all deps run test test-unit test-integration test-e2e test-ref asan fuzz fuzz-smoke bench test-gpu bench-gpu bench-gpu-plan clean
all: $(BINS)

deps:
	@scripts/deps.sh test

# Each object depends on the headers it includes (-MMD -MP writes them
# into a .d file beside it), so touching one header rebuilds its users only.
DEPFLAGS = -MMD -MP
$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -c $< -o $@
# The float model's elementwise loops (exp, clamps, selects) vectorize only
# when float compares may not trap; nothing here reads the FP exception flags.
$(BUILD)/pkg/model/cpu_f32.o: ALL_CFLAGS += -fno-trapping-math
# Our sgemm's micro-kernel keeps its tile in registers only when optimized,
# in every build (the sanitizer build's -O1 left it a fifteenth as fast)
$(BUILD)/pkg/model/sgemm.o: ALL_CFLAGS += -O3
# AdamW's sqrtf vectorizes when it need not set errno (nothing reads it)
$(BUILD)/pkg/train/optim.o: ALL_CFLAGS += -fno-trapping-math -fno-math-errno
$(BUILD)/tests/obj/%.o: tests/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/support $(DEPFLAGS) -c $< -o $@

# nvcc: host-side warnings are errors as on the C side; -lineinfo costs
# nothing at run time and lets ncu / compute-sanitizer name source lines.
NVCC_FLAGS ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-Wall,-Wextra -Werror all-warnings
BUILD_FLAGS := $(ALL_CFLAGS) | $(NVCC_FLAGS) $(CUDA_ARCHS)
$(shell mkdir -p $(BUILD) && { [ -f $(FLAGS_STAMP) ] && [ "$$(cat $(FLAGS_STAMP))" = '$(BUILD_FLAGS)' ] || \
  printf '%s\n' '$(BUILD_FLAGS)' > $(FLAGS_STAMP); })
$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh pkg/model/*.h pkg/util/*.h) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_ARCHS) -Ipkg -I. -c $< -o $@

$(LIB): $(PKG_OBJS) $(KERNEL_OBJS)
	@rm -f $@
	ar rcs $@ $^

# Each binary: the .c files of its cmd/<name>/ folder and the shared flag
# parser. Kept, not deleted as intermediates, so a relink does not recompile.
CMD_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard $(CMDS:%=cmd/%/*.c))) $(BUILD)/cmd/flags.o
.SECONDARY: $(CMD_OBJS)
.SECONDEXPANSION:
$(BIN)/ringleader-%: $$(patsubst %.c,$(BUILD)/%.o,$$(wildcard cmd/$$*/*.c)) $(BUILD)/cmd/flags.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(ALL_CFLAGS) $^ -o $@ $(LDLIBS)
# The operator links no CUDA library in any build: none of the archive's
# objects it pulls calls CUDA, and its image (the Dockerfile's operator
# stage) has no CUDA runtime to load one from.
$(BIN)/ringleader-operator: LDLIBS := $(filter-out $(CUDA_LDLIBS),$(LDLIBS))

# ---- Parquet: ringleader-prepare parquet reads through Apache Arrow's C++ -------
# library. Debian 12 packages no Arrow, so the shared libraries and headers
# come from pyarrow's wheel (PyPI, a private venv; documented for building
# C++ against pyarrow: pyarrow.get_include / get_library_dirs). The shim
# (pkg/data/parquet_arrow.cc) is its own shared object in lib/ringleader
# beside bin/, which ringleader-prepare loads only in that mode; it finds
# Arrow's libraries beside itself ($$ORIGIN, the image copies them there) or
# in the venv. make test builds it; make and make run do not need it.
ARROW_VENV ?= .venv-arrow
PARQUET_DIR := $(dir $(BIN))lib/ringleader
PARQUET_LIB := $(PARQUET_DIR)/libringleader-parquet.so
.PHONY: parquet
parquet: $(PARQUET_LIB)
$(PARQUET_LIB): pkg/data/parquet_arrow.cc
	@scripts/ref_venv.sh $(ARROW_VENV) pyarrow:pyarrow.parquet
	@mkdir -p $(dir $@)
	pa=$$($(ARROW_VENV)/bin/python -c 'import pyarrow; print(pyarrow.get_library_dirs()[0])') && \
	$(CXX) -std=c++20 -O2 -g -fPIC -shared -Wall -Wextra -Werror -isystem "$$pa/include" $< -o $@ \
	  "$$pa"/libparquet.so.[0-9]* "$$pa"/libarrow.so.[0-9]* -Wl,--no-undefined \
	  -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,"$$pa"

# ---- the embedded default: arithmetic corpus, then train ----------------------
RUN_DATA ?= data/arith
run:
	@scripts/deps.sh build
	@$(MAKE) --no-print-directory all
	@test -f $(RUN_DATA)/.done || (bin/ringleader-prepare arith --out $(RUN_DATA) && touch $(RUN_DATA)/.done)
	bin/ringleader-worker $(ARGS)

# ---- generated files: spec.training of the CRD (and the chart's copy of it)
# is the worker's config tables (scripts/crd_training.py; the manifests
# test fails while they differ)
.PHONY: manifests
manifests: $(BIN)/ringleader-worker
	python3 scripts/crd_training.py --worker $(BIN)/ringleader-worker

# ---- the image: built with buildah on a Debian 12 base made by mmdebstrap, then run ----
# (no Docker engine needed; root; scripts/image-test.sh says what it checks)
.PHONY: image-test
image-test:
	@scripts/image-test.sh

# ---- tests ---------------------------------------------------------------------
$(TEST_BIN): $(TEST_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_OBJS) $(LIB) -o $@ $(LDLIBS) -lcriterion
$(foreach t,$(TEST_TIERS),$(eval $(BUILD)/tests/$(t): $(call tier_objs,$(t))))
$(TIER_BINS): $(TEST_SUPPORT_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(filter %.o,$^) $(LIB) -o $@ $(LDLIBS) -lcriterion

test:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory -j2 all $(PARQUET_LIB) $(TEST_BIN) fuzz-build
	@$(MAKE) --no-print-directory -j2 fuzz-smoke
	@scripts/run-tests.sh $(TEST_BIN) -j2 --verbose=0

# One tier on its own (the binaries are needed: tests run the real ones);
# the time the run took is the last line.
test-unit test-integration test-e2e: test-%:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory -j2 all $(PARQUET_LIB) $(BUILD)/tests/$*
	@t0=$$(date +%s); scripts/run-tests.sh $(BUILD)/tests/$* -j2 --verbose=0; rc=$$?; \
	  echo "test-$*: $$(( $$(date +%s) - t0 )) s"; exit $$rc

# Every fuzz target, built with clang's libFuzzer + ASan + UBSan. The
# library is compiled once with coverage instrumentation (fuzzer-no-link)
# and each target links only the objects it uses from that archive: one
# compile of pkg/ instead of one per target.
FUZZ_CC ?= clang
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined \
              -fno-sanitize-recover=undefined -Wno-pass-failed -fopenmp -Ipkg -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
FUZZ_OBJS := $(PKG_SRCS:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_LIB  := $(BUILD)/fuzz/libringleader-fuzz.a
$(FUZZ_OBJS): $(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_LIB): $(FUZZ_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(FUZZ_BINS): $(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(DEPFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB) -o $@ $(LDLIBS)
.PHONY: fuzz-build
fuzz-build: $(FUZZ_BINS)

# fuzz-smoke: the seeds plus a short, reproducible run of each target (part
# of make test: a fixed seed and run count, so CI does not turn red on a new
# random finding; `make fuzz` explores with fresh randomness for longer).
# Targets are independent, so `make -j2 fuzz-smoke` runs two at a time.
FUZZ_LIMIT ?= -seed=1 -runs=300000
FUZZ_RUNS := $(FUZZ_BINS:$(BUILD)/fuzz/%=fuzz-run-%)
.PHONY: fuzz-smoke $(FUZZ_RUNS)
fuzz-smoke: $(FUZZ_RUNS)
$(FUZZ_RUNS): fuzz-run-%: $(BUILD)/fuzz/%
	@mkdir -p $(BUILD)/fuzz/corpus/$*
	@$< $(FUZZ_LIMIT) -print_final_stats=0 $(BUILD)/fuzz/corpus/$* tests/fuzz/seeds/$* \
	    >$(BUILD)/fuzz/$*.log 2>&1 || { cat $(BUILD)/fuzz/$*.log; echo "fuzz target $* FAILED"; exit 1; }
	@echo "fuzz $*: $$(grep -o 'Done [0-9]* runs' $(BUILD)/fuzz/$*.log), clean"
# fuzz_docs_split writes and opens a file per input, and under ASan the
# reader's 1 MiB block costs about a millisecond (some 900 runs a second):
# a tenth of the runs, past which its coverage hardly grows. Only where
# FUZZ_LIMIT is this file's default; make fuzz's time limit still applies.
ifeq ($(origin FUZZ_LIMIT),file)
fuzz-run-fuzz_docs_split: FUZZ_LIMIT := -seed=1 -runs=30000
endif

fuzz: $(FUZZ_BINS)
	@$(MAKE) --no-print-directory fuzz-smoke FUZZ_LIMIT=-max_total_time=$(FUZZ_SECONDS)

asan:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory BUILD=build-asan BIN=build-asan/bin OPT="-O1 -g" \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" USE_CUDA=0 \
	  build-asan/tests/all build-asan/bin/ringleader-worker build-asan/bin/ringleader-prepare build-asan/bin/ringleader-operator \
	  build-asan/lib/ringleader/libringleader-parquet.so
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp RL_TEST_BIN=build-asan/bin scripts/run-tests.sh build-asan/tests/all -j2 --verbose=0

# Reference check against Hugging Face transformers (PyTorch, CPU).
REF_VENV ?= .venv-ref
test-ref:
	@scripts/deps.sh ref
	@$(MAKE) --no-print-directory all $(BUILD)/tests/refdump $(BUILD)/tests/ckpt_logits $(BUILD)/tests/rgwserve
	@scripts/ref_venv.sh $(REF_VENV)
	$(REF_VENV)/bin/python tests/ref/check_llama.py --dump $(BUILD)/tests/refdump
	$(REF_VENV)/bin/python tests/ref/check_ckpt.py --worker $(BIN)/ringleader-worker \
	  --prepare $(BIN)/ringleader-prepare --logits $(BUILD)/tests/ckpt_logits
	$(REF_VENV)/bin/python tests/ref/check_s3.py --worker $(BIN)/ringleader-worker \
	  --prepare $(BIN)/ringleader-prepare --logits $(BUILD)/tests/ckpt_logits --rgwserve $(BUILD)/tests/rgwserve
	$(REF_VENV)/bin/python tests/ref/check_tokenizer.py --prepare $(BIN)/ringleader-prepare --worker $(BIN)/ringleader-worker

$(BUILD)/tests/rgwserve: tests/ref/rgwserve.c tests/support/rgwtest.c tests/support/daemon.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(filter %.c,$^) $(LIB) -o $@ $(LDLIBS)

$(BUILD)/tests/ckpt_logits: tests/ref/ckpt_logits.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

$(BUILD)/tests/refdump: tests/ref/refdump.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

# ---- benchmarks -----------------------------------------------------------------
$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

# the checkpoint bench uploads to a radosgw it starts
$(BUILD)/bench/ckpt: bench/ckpt.c tests/support/rgwtest.c tests/support/daemon.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(filter %.c,$^) $(LIB) -o $@ $(LDLIBS)

# the rendezvous bench runs agents against the Kubernetes stand-in
$(BUILD)/bench/rdzv: bench/rdzv.c tests/support/jobtest.c tests/support/standin.c tests/support/etcdtest.c \
                     tests/support/daemon.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(filter %.c,$^) $(LIB) -o $@ $(LDLIBS)

# the operator bench counts ringleader-operator's requests to the stand-in
$(BUILD)/bench/operator: bench/operator.c tests/support/standin.c tests/support/daemon.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(filter %.c,$^) $(LIB) -o $@ $(LDLIBS)

BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(sort $(wildcard bench/*.c)))
# the rendezvous and checkpoint benches start etcd, the stand-in and radosgw
# the tokenizer beside Hugging Face tokenizers (a small venv of its own)
TOK_VENV ?= .venv-tok
bench:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory all $(BENCH_BINS) $(BUILD)/bench/bench_tok
	@for b in $(BENCH_BINS); do $$b || exit 1; done
	@scripts/ref_venv.sh $(TOK_VENV) tokenizers:tokenizers numpy:numpy
	$(TOK_VENV)/bin/python bench/tokenize/bench_tok.py --bin $(BUILD)/bench/bench_tok

# the CPU trainer beside PyTorch's on the CPU (eager and torch.compile),
# alternating in one run; PyTorch from the reference check's venv
.PHONY: bench-cpu-vs-torch
CPU_VS_TORCH_ROUNDS ?= 3
bench-cpu-vs-torch:
	@scripts/deps.sh ref
	@$(MAKE) --no-print-directory $(BUILD)/bench/cpu_train
	@scripts/ref_venv.sh $(REF_VENV)
	$(REF_VENV)/bin/python bench/cpu_vs_torch.py --ours $(BUILD)/bench/cpu_train --rounds $(CPU_VS_TORCH_ROUNDS) \
	  --threads $$(nproc)

$(BUILD)/bench/bench_tok: bench/tokenize/bench_tok.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

# ---- GPU checks and benchmarks (kernels/, tests/gpu/, bench/gpu/) --------------------
# Built only with CUDA; each binary says so in one line and exits 0 where no
# GPU is visible. bench-gpu runs ringleader and the PyTorch baseline
# (eager and torch.compile) on the same GPU in one command.
GPU_TEST_BIN  := $(BUILD)/tests/gpu_test
GPU_BENCH_BIN := $(BUILD)/bench/gpu_bench
GPU_TEST_SRCS := tests/gpu/test_gpu.c tests/gpu/test_gpu_train.c
$(GPU_TEST_BIN): $(GPU_TEST_SRCS) tests/gpu/check.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(GPU_TEST_SRCS) $(LIB) -o $@ $(LDLIBS)

$(GPU_BENCH_BIN): bench/gpu/bench_gpu.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

# test-gpu-emu: the GPU code compiled for the host with g++ -- kernels/*.cu
# and *.cuh as they are, kernel launches turned into a fiber per CUDA thread
# (tests/gpu/emu/emu.cpp, mma emulated), the CUDA runtime and cuBLASLt
# replaced by host stand-ins (tests/gpu/emu/fake_cuda.cpp), NCCL by one
# whose ranks are threads on emulated devices (fake_nccl.cpp) -- then the
# kernel checks (tests/gpu/kernels_emu.cpp) and the whole test-gpu suite
# on it. Needs the CUDA headers, not a GPU; slow (minutes), and no
# substitute for test-gpu: it checks the code's logic, not the hardware.
# The fake runtime reports one architecture's limits, RL_EMU_SM (default
# 90), and refuses what that hardware refuses. Everything runs as sm_90;
# first, as each of EMU_ARCHS (sm_80: 163 KB of shared memory per block,
# sm_86 and sm_89: 99 KB), the attention checks of head_dim 128 (whose
# backward fits 99 KB only single-buffered), whole steps of a
# head_dim-64 and a head_dim-128 model (~20 s each) and the fused GEMMs'
# steps (60 KB of shared memory each, ~35 s).
EMU_DIR   := $(BUILD)/emu
EMU_FLAGS := -std=c++20 -O2 -g -fno-strict-aliasing -Wall -Wextra -Werror -Wno-unknown-pragmas \
             -Wno-attributes -Wno-unused-function -DRL_KERNEL_EMU -Ipkg -I. -I$(CUDA_HOME)/include
EMU_KOBJS := $(KERNEL_SRCS:kernels/%.cu=$(EMU_DIR)/kernels/%.o)
EMU_ROBJS := $(EMU_DIR)/emu.o $(EMU_DIR)/fake_cuda.o $(EMU_DIR)/fake_nccl.o $(EMU_DIR)/fake_cudnn.o \
             $(EMU_DIR)/fake_graph.o
EMU_LIBS  := $(filter-out -lcudart -lnccl -lcublasLt,$(LDLIBS))
GPU_EMU_BIN := $(EMU_DIR)/kernels_emu
CXX ?= g++
.PHONY: test-gpu-emu
$(EMU_DIR)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh tests/gpu/emu/*.h pkg/model/*.h pkg/util/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_FLAGS) -include tests/gpu/emu/emu.h -x c++ -c $< -o $@
$(EMU_DIR)/%.o: tests/gpu/emu/%.cpp $(wildcard tests/gpu/emu/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_FLAGS) -c $< -o $@
$(GPU_EMU_BIN): tests/gpu/kernels_emu.cpp $(wildcard kernels/*.cuh) $(EMU_ROBJS) $(EMU_KOBJS) $(LIB)
	$(CXX) $(EMU_FLAGS) $(filter %.cpp %.o,$^) $(LIB) -o $@ $(EMU_LIBS)
$(EMU_DIR)/gpu_test: $(GPU_TEST_SRCS) tests/gpu/check.h $(EMU_KOBJS) $(EMU_ROBJS) $(LIB)
	$(CC) $(ALL_CFLAGS) $(GPU_TEST_SRCS) $(EMU_KOBJS) $(EMU_ROBJS) $(LIB) -o $@ $(EMU_LIBS) -lstdc++
$(EMU_DIR)/gpu_bench: bench/gpu/bench_gpu.c $(EMU_KOBJS) $(EMU_ROBJS) $(LIB)
	$(CC) $(ALL_CFLAGS) $< $(EMU_KOBJS) $(EMU_ROBJS) $(LIB) -o $@ $(EMU_LIBS) -lstdc++

# gpu-portable: test-gpu and gpu_bench as one binary for a GPU machine that
# cannot build the project (scripts/gpu-session.sh runs it there). OpenBLAS,
# gfortran, OpenMP and cudart linked statically; NCCL and cuBLASLt from that
# machine (its PyTorch's nvidia-* pip wheels carry both); every other library
# the binary needs (libcurl, OpenSSL, expat, libmicrohttpd, cJSON and
# theirs) copied into lib/ beside it; glibc and libstdc++ from the machine.
PORT_DIR := $(BUILD)/portable
PORT_LIBS := -Wl,--as-needed -static-libgcc -Wl,-Bstatic -lopenblas -lgfortran -lquadmath -lgomp -lstdc++ \
             -Wl,-Bdynamic -lcjson -lcurl -lssl -lcrypto -lexpat -lmicrohttpd -lpcre2-8 -lutf8proc \
             -L$(CUDA_HOME)/lib64 -lcudart_static -lcublasLt -lnccl \
             -Wl,-rpath,$(CUDA_HOME)/lib64 -lpthread -ldl -lrt -lm
PORT_SYSLIBS := linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc|libgcc_s|libnccl|libcublas
.PHONY: gpu-portable
$(PORT_DIR)/ringleader-gpu: tests/gpu/portable_main.c $(GPU_TEST_SRCS) tests/gpu/check.h bench/gpu/bench_gpu.c $(LIB)
	@rm -rf $(PORT_DIR) && mkdir -p $(PORT_DIR)/lib
	$(CC) $(ALL_CFLAGS) -Dmain=rl_gpu_test_main -c tests/gpu/test_gpu.c -o $(PORT_DIR)/test_gpu.o
	$(CC) $(ALL_CFLAGS) -c tests/gpu/test_gpu_train.c -o $(PORT_DIR)/test_gpu_train.o
	$(CC) $(ALL_CFLAGS) -Dmain=rl_gpu_bench_main -c bench/gpu/bench_gpu.c -o $(PORT_DIR)/bench_gpu.o
	$(CC) $(ALL_CFLAGS) $< $(PORT_DIR)/test_gpu.o $(PORT_DIR)/test_gpu_train.o $(PORT_DIR)/bench_gpu.o $(LIB) \
	  -o $@ $(PORT_LIBS)
	strip $@
	cp -L $$(ldd $@ | awk '$$3 ~ /^\// {print $$3}' | grep -Ev '$(PORT_SYSLIBS)') $(PORT_DIR)/lib/
	for t in test bench; do printf '%s\n' '#!/bin/sh' \
	  '# built by make gpu-portable: the multi-call binary beside it, with its libraries; NCCL and' \
	  '# cuBLASLt from the CUDA toolkit where there is one, else from the nvidia-* pip wheels' \
	  'd=$$(cd "$$(dirname "$$0")" && pwd); p=$$d/lib' \
	  'w=$$(python3 -c "import nvidia, os; r = list(nvidia.__path__)[0]; print(r + \"/nccl/lib:\" + r + \"/cublas/lib\")" 2>/dev/null)' \
	  '[ -e $(CUDA_HOME)/lib64/libnccl.so.2 ] && [ -e $(CUDA_HOME)/lib64/libcublasLt.so.13 ] || p=$$p:$$w' \
	  '# cuDNN (dlopen libcudnn.so.9, train.attention) from the toolkit, else the nvidia-cudnn wheel' \
	  '# with what its runtime-fused engines load (NVRTC, cuBLASLt of its CUDA major)' \
	  '[ -e $(CUDA_HOME)/lib64/libcudnn.so.9 ] || p=$$p:$$(python3 -c "import nvidia; r = list(nvidia.__path__)[0]; print(r + \"/cudnn/lib:\" + r + \"/cuda_nvrtc/lib:\" + r + \"/cublas/lib\")" 2>/dev/null)' \
	  '# RL_GPU_WRAP: a command to run it under (compute-sanitizer ...)' \
	  "LD_LIBRARY_PATH=\"\$$p\$${LD_LIBRARY_PATH:+:\$$LD_LIBRARY_PATH}\" exec \$${RL_GPU_WRAP:-} \"\$$d/ringleader-gpu\" $$t \"\$$@\"" \
	  >$(PORT_DIR)/gpu_$$t; chmod +x $(PORT_DIR)/gpu_$$t; done
	@du -sh $(PORT_DIR)
gpu-portable: $(PORT_DIR)/ringleader-gpu

ifeq ($(USE_CUDA),1)
test-gpu:
	@$(MAKE) --no-print-directory $(GPU_TEST_BIN)
	$(GPU_TEST_BIN) $(GPU_TEST_ARGS)

EMU_ARCHS ?= 80 86 89
test-gpu-emu:
	@$(MAKE) --no-print-directory $(GPU_EMU_BIN) $(EMU_DIR)/gpu_test $(EMU_DIR)/gpu_bench
	for sm in $(EMU_ARCHS); do RL_EMU_SM=$$sm $(EMU_DIR)/gpu_test hd=128 && \
	  RL_EMU_SM=$$sm $(EMU_DIR)/gpu_test "step arch-" && \
	  RL_EMU_SM=$$sm $(EMU_DIR)/gpu_test "fused gemm" || exit 1; done
	$(GPU_EMU_BIN)
	$(EMU_DIR)/gpu_bench --config a --vocab 300 --hidden 64 --ffn 96 --layers 1 --heads 2 --kv-heads 1 \
	  --seq 32 --batch 2 --steps 2 --warmup 1
	$(EMU_DIR)/gpu_bench --config a --vocab 300 --hidden 64 --ffn 96 --layers 4 --heads 2 --kv-heads 1 \
	  --seq 32 --batch 2 --steps 2 --warmup 1 --ddp-rounds 1 --offload layers
	$(EMU_DIR)/gpu_test $(GPU_TEST_ARGS)
	# the checks whose streams wait on each other's, again with every stream
	# queued until something needs it (fake_graph.cpp): a missing wait shows
	RL_EMU_DEFER=1 $(EMU_DIR)/gpu_test "trainer: offload" && RL_EMU_DEFER=1 $(EMU_DIR)/gpu_test "2 ranks = 1 rank"

bench-gpu:
	@$(MAKE) --no-print-directory $(GPU_BENCH_BIN)
	bench/gpu/run.sh $(GPU_BENCH_BIN)

# bench-gpu-plan: no GPU needed; the step's plan for configs a and b (one
# JSON line each) from the model's own launch list (gpu_bench --plan)
bench-gpu-plan:
	@$(MAKE) --no-print-directory $(GPU_BENCH_BIN)
	@$(GPU_BENCH_BIN) --plan --config a && $(GPU_BENCH_BIN) --plan --config b
else
test-gpu test-gpu-emu bench-gpu bench-gpu-plan:
	@echo "$@: skipped: this build has no CUDA (nvcc or nccl.h not found); nothing was run"
endif

clean:
	rm -rf $(BUILD) build-asan $(BIN)

-include $(PKG_OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(FUZZ_OBJS:.o=.d) $(FUZZ_BINS:=.d) \
         $(CMD_OBJS:.o=.d)
