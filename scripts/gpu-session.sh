#!/bin/sh
# A GPU session in a few device calls, for a GPU machine that cannot build
# the project (the lent ones have nvcc and PyTorch but not libcurl, cJSON,
# OpenBLAS... and nothing can be installed there). Here, first:
#
#   make gpu-portable                                   # build/portable, ~47 MB
#   cp ../shared/bench/torch_baseline.py bench/gpu/     # git ignores it
#
# then one device call per phase, each well inside 10 minutes, carrying
# build/portable and bench/gpu/torch_baseline.py:
#
#   scripts/gpu-session.sh test      # every test-gpu check, then memcheck,
#                                    # initcheck and synccheck of a whole step
#                                    # and racecheck of attention and of the
#                                    # fused GEMMs in a tiny step
#   scripts/gpu-session.sh bench-a   # config a beside PyTorch eager + compile
#   scripts/gpu-session.sh bench-b   # config b likewise
#   scripts/gpu-session.sh offload   # train.offload optimizer and layers
#                                    # through the trainer beside none, on
#                                    # config a and b (gpu_bench --offload)
#
# Several phases may go in one call (scripts/gpu-session.sh test bench-a):
# a lease is short and each call may have to start a machine. T_TEST,
# T_SAN and T_BENCH (seconds) bound each step.
#
#   scripts/gpu-session.sh lease     # test, bench-a, bench-b, offload in one call: the baseline's
#                                    # torch.compile builds run on the CPUs
#                                    # while the GPU checks run, then the
#                                    # benchmarks time with warm caches
#
# Logs and JSON lines go to $OUT (the device tool brings that folder back),
# else build/gpu-session. Every step is bounded by timeout so a hang costs
# minutes, not the lease.
set -u
O=${OUT:-build/gpu-session}
mkdir -p "$O"
P=build/portable
[ -x $P/gpu_test ] || { echo "gpu-session: $P is missing (make gpu-portable here, then carry it)" >&2; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -1; python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null
} >"$O/gpu.txt" 2>&1
cat "$O/gpu.txt"
[ $# -gt 0 ] || { echo "usage: $0 test | bench-a | bench-b | offload | lease ..." >&2; exit 2; }
test_phase() {
    timeout ${T_TEST:-300} $P/gpu_test >"$O/test-gpu.log" 2>&1
    echo "test-gpu exit $?"; grep -E '^(FAIL|test-gpu)' "$O/test-gpu.log"
    if command -v compute-sanitizer >/dev/null; then
        RL_GPU_WRAP="compute-sanitizer --tool memcheck --error-exitcode 9" \
            timeout ${T_SAN:-150} $P/gpu_test "step gqa-hd32 B=2 T=7" >"$O/memcheck.log" 2>&1
        echo "memcheck exit $?"; tail -3 "$O/memcheck.log"
        # our attention kernels, and our fused GEMMs in the tiny step that
        # runs them ("attention" alone would take in cuDNN's and whole
        # trainer steps, far too slow under racecheck)
        for k in "attention fwd" "attention bwd" "step gqa-hd32 B=2 T=7 fused"; do
            RL_GPU_WRAP="compute-sanitizer --tool racecheck --error-exitcode 9" \
                timeout ${T_SAN:-150} $P/gpu_test "$k" >>"$O/racecheck.log" 2>&1
            echo "racecheck $k exit $?"; tail -2 "$O/racecheck.log"
        done
        # reads of memory nothing wrote, and barriers misused, over a whole step
        for t in initcheck synccheck; do
            RL_GPU_WRAP="compute-sanitizer --tool $t --error-exitcode 9" \
                timeout ${T_SAN:-150} $P/gpu_test "step gqa-hd32 B=2 T=7" >>"$O/initsync.log" 2>&1
            echo "$t exit $?"; tail -2 "$O/initsync.log"
        done
    fi
}
bench_phase() { # config
    STEPS=${STEPS:-20} WARMUP=${WARMUP:-5} RL_BENCH_OUT="$O/bench-$1.jsonl" \
        timeout ${T_BENCH:-540} bench/gpu/run.sh $P/gpu_bench "$1" >"$O/bench-$1.log" 2>&1
    echo "bench $1 exit $?"; grep -v '^{' "$O/bench-$1.log" | tail -20
}
offload_phase() { # each mode on each config, a short run (T_OFF bounds it all)
    end=$(($(date +%s) + ${T_OFF:-150}))
    for cfg in a b; do for mode in optimizer layers; do
        left=$((end - $(date +%s))); [ $left -gt 5 ] || break 2
        timeout $left $P/gpu_bench --config $cfg --offload $mode --steps ${OFF_STEPS:-4} --warmup 2 \
            --ddp-rounds 1 >>"$O/offload.jsonl" 2>>"$O/offload.log"
        echo "offload $cfg $mode exit $?"
    done; done
    cat "$O/offload.jsonl"
}
for phase in "$@"; do
case $phase in
test) test_phase ;;
bench-a | bench-b) bench_phase "${phase#bench-}" ;;
offload) offload_phase ;;
lease)
    PREWARM=1 RL_BENCH_OUT="$O/prewarm.jsonl" timeout ${T_WARM:-300} \
        bench/gpu/run.sh $P/gpu_bench a b >"$O/prewarm.log" 2>&1 &
    warm=$!
    test_phase
    wait $warm; echo "prewarm exit $?"
    bench_phase a; bench_phase b; offload_phase ;;
*)
    echo "usage: $0 test | bench-a | bench-b | offload | lease ..." >&2; exit 2 ;;
esac
done
