#!/bin/sh
# make bench-gpu: ringleader's GPU step and the PyTorch baseline, on the same
# GPU, in one command, for the issue's two configs; JSON lines on stdout
# (and in $RL_BENCH_OUT, default build/bench/gpu_bench.jsonl), then a summary
# table against the targets.
#
#   bench/gpu/run.sh [BENCH_BIN] [CONFIG...]      CONFIG: a, b (default: both)
#
# Environment:
#   TORCH_BASELINE  path of torch_baseline.py (default: ../shared/bench/, then
#                   shared/bench/ and bench/gpu/ in this checkout: on a device
#                   machine only the checkout travels, so copy it in there)
#   BENCH_PYTHON    interpreter for the baseline (default python3), used as
#                   it is when it imports torch
#   BENCH_VENV      otherwise a venv made for it (default build/venv-bench:
#                   ignored by git, removed by make clean), with
#                   --system-site-packages; torch is pip-installed into it
#                   only if still not importable and ringleader found a GPU
#   STEPS, WARMUP   timed and warm-up steps (default 30 and 10, the baseline's)
#   BATCH_B         sequences per step for config b (default 8: 16384 tokens;
#                   the baseline's own default of 64 would need ~4x the memory)
#   TORCH_ATTN      the baseline's attention variants (default "gqa expand":
#                   SDPA with enable_gqa, and K/V repeated to every head; which
#                   is faster depends on the PyTorch build, and we compare
#                   with the faster)
#   SKIP_TORCH=1    ringleader only;  SKIP_COMPILE=1  no torch.compile run
set -u
BIN=${1:-build/bench/gpu_bench}
[ $# -gt 0 ] && shift
CONFIGS=${*:-a b}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
BATCH_B=${BATCH_B:-8}
TORCH_ATTN=${TORCH_ATTN:-gqa expand}
OUTF=${RL_BENCH_OUT:-build/bench/gpu_bench.jsonl}
mkdir -p "$(dirname "$OUTF")"
: >"$OUTF"

if [ ! -x "$BIN" ]; then
    echo "bench-gpu: $BIN is missing (make $BIN)" >&2
    exit 1
fi

baseline=""
for cand in "${TORCH_BASELINE:-}" ../shared/bench/torch_baseline.py shared/bench/torch_baseline.py \
    bench/gpu/torch_baseline.py; do
    if [ -n "$cand" ] && [ -f "$cand" ]; then baseline=$cand && break; fi
done

# The baseline's Python, set up on first use (after ringleader's run has
# found a GPU: no venv, no download on a machine without one). An
# interpreter that already imports torch is used as it is (BENCH_PYTHON,
# else python3: on the lent GPU machines python3 is itself the venv that
# holds PyTorch, and a venv made from it would not see its packages);
# otherwise a venv is made and torch installed into it.
py=""
py_state=unset
setup_torch() {
    [ "$py_state" = unset ] || return 0
    py_state=none
    [ "${SKIP_TORCH:-0}" = 1 ] && return 0
    if [ -z "$baseline" ]; then
        echo "bench-gpu: torch_baseline.py not found (set TORCH_BASELINE); PyTorch runs skipped" >&2
        return 0
    fi
    p=${BENCH_PYTHON:-python3}
    if ! "$p" -c 'import torch' 2>/dev/null; then
        venv=${BENCH_VENV:-build/venv-bench}
        if [ ! -x "$venv/bin/python" ]; then
            python3 -m venv --system-site-packages "$venv" >&2 || { echo "bench-gpu: cannot make a venv" >&2; return 0; }
        fi
        p=$venv/bin/python
        if ! "$p" -c 'import torch' 2>/dev/null; then
            echo "bench-gpu: installing torch into $venv" >&2
            "$p" -m pip install -q torch >&2 || return 0
        fi
    fi
    if ! "$p" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        echo "bench-gpu: PyTorch ($p) cannot see a GPU; PyTorch runs skipped" >&2
        return 0
    fi
    echo "bench-gpu: PyTorch from $("$p" -c 'import sys, torch; print(sys.executable, torch.__version__)')" >&2
    py=$p
    py_state=ready
}

# the JSON lines of a run to stdout and the log, tagged with the config;
# a run with none (a crash, an out-of-memory traceback) gets an error line
emit() { # config, impl, output
    lines=$(printf '%s\n' "$3" | grep '^{')
    [ -n "$lines" ] || lines="{\"impl\":\"$2\",\"error\":\"no result (see stderr)\"}"
    printf '%s\n' "$lines" | while IFS= read -r line; do
        case $line in *'"config"'*) ;; *) line=$(printf '%s\n' "$line" | sed 's/^{/{"config":"'"$1"'",/') ;; esac
        printf '%s\n' "$line" | tee -a "$OUTF"
    done
}

# PREWARM=1: only compile the baseline's torch.compile variants (one step
# each, nothing reported) so that the timed runs after it, in the same
# machine, find the inductor caches warm; scripts/gpu-session.sh lease runs
# it on the CPUs while the GPU checks run
for cfg in $CONFIGS; do
    case $cfg in
    a) targs="--vocab 50000 --hidden 768 --ffn 3072 --layers 12 --heads 12 --kv-heads 3 --seq 512 --batch 64"
       rargs="--config a" ;;
    b) targs="--vocab 32000 --hidden 2048 --ffn 5632 --layers 22 --heads 32 --kv-heads 4 --seq 2048 --batch $BATCH_B"
       rargs="--config b --batch $BATCH_B" ;;
    *) echo "bench-gpu: unknown config $cfg (a or b)" >&2; exit 2 ;;
    esac
    if [ "${PREWARM:-0}" = 1 ]; then
        setup_torch
        for attn in $TORCH_ATTN; do
            [ -n "$py" ] && "$py" "$baseline" $targs --steps 1 --warmup 1 --attn "$attn" --compile >/dev/null
        done
        continue
    fi
    res=$("$BIN" $rargs --steps "$STEPS" --warmup "$WARMUP")
    emit "$cfg" ringleader "$res"
    case $res in *'"skipped"'*) continue ;; esac # no GPU: nothing to compare with
    # the comparison first, the runs for tuning after it: a lease cut short
    # still leaves the figures that matter
    setup_torch
    if [ -n "$py" ]; then
        for attn in $TORCH_ATTN; do
            emit "$cfg" pytorch-eager \
                "$(PYTHONUNBUFFERED=1 "$py" "$baseline" $targs --steps "$STEPS" --warmup "$WARMUP" --attn "$attn")"
            if [ "${SKIP_COMPILE:-0}" != 1 ]; then
                emit "$cfg" pytorch-compile \
                    "$(PYTHONUNBUFFERED=1 "$py" "$baseline" $targs --steps "$STEPS" --warmup "$WARMUP" --attn "$attn" --compile)"
            fi
        done
    fi
    # auto took cuDNN: our own kernels' step and profile too, for their tuning
    case $res in *'"attn":"cudnn"'*)
        emit "$cfg" ringleader \
            "$("$BIN" $rargs --steps "$STEPS" --warmup "$WARMUP" --attention own --ddp-rounds 0)" ;;
    esac
    # the fused GEMMs the other way than auto took (on: our GEMMs with
    # SwiGLU and the classifier inside; off: cuBLASLt and separate kernels)
    case $res in
    *'"fused":""'*) other=on ;;
    *) other=off ;;
    esac
    emit "$cfg" ringleader \
        "$("$BIN" $rargs --steps "$STEPS" --warmup "$WARMUP" --fused $other --ddp-rounds 0)"
    # every layer's norm outputs and SwiGLU product kept: what recompute costs
    emit "$cfg" ringleader-keep \
        "$("$BIN" $rargs --steps "$STEPS" --warmup "$WARMUP" --recompute 0 --profile-steps 0 --ddp-rounds 0)"
    # the same step launched kernel by kernel: what the CUDA graphs save
    emit "$cfg" ringleader-eager \
        "$("$BIN" $rargs --steps "$STEPS" --warmup "$WARMUP" --eager --profile-steps 0 --ddp-rounds 0)"
done

[ "${PREWARM:-0}" = 1 ] || python3 "$(dirname "$0")/summary.py" "$OUTF" >&2 || true
