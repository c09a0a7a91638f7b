#!/usr/bin/env python3
"""Summary of bench/gpu/run.sh's JSON lines against issue 6's targets.

Per config: tokens/s, model TFLOP/s, MFU (the PyTorch lines get the same
peak as ringleader's line, which names it), peak memory; then
ringleader / torch.compile tokens/s (target >= 1.1), MFU on b (target >= 0.5)
and memory against PyTorch's (target: no higher); the DDP overhead at world
size 1, NCCL on vs off (target < 1%).

  python3 bench/gpu/summary.py build/bench/gpu_bench.jsonl
"""
import json
import sys


def fastest(rows, impl):
    runs = [r for r in rows if r.get("impl") == impl and "tokens_per_s" in r]
    return max(runs, key=lambda r: r["tokens_per_s"], default=None)


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    by_cfg = {}
    for r in rows:
        by_cfg.setdefault(r.get("config", "?"), []).append(r)
    for cfg, rs in sorted(by_cfg.items()):
        peak = next((r.get("peak_tflops") for r in rs if r.get("peak_tflops")), None)
        gpu = next((r.get("gpu") for r in rs if r.get("gpu")), "?")
        print(f"config {cfg} on {gpu} (dense bf16 peak {peak} TFLOP/s)")
        print(f"  {'impl':<40}{'tokens/s':>12}{'ms/step':>10}{'TFLOP/s':>10}{'MFU':>8}{'mem GiB':>9}")
        for r in rs:
            if r.get("impl") in ("ringleader-profile", "ringleader-ddp", "ringleader-ddp-slots", "ringleader-offload"):
                continue
            if "error" in r or "skipped" in r:
                print(f"  {r.get('impl', '?'):<40}  {r.get('error') or r.get('skipped')}")
                continue
            mfu = r.get("mfu")
            if mfu is None and peak:
                mfu = r["model_tflops"] / peak
            name = r["impl"] + (f" ({r['attn']}" + (f", fused {r['fused'] or 'none'}" if "fused" in r else "") + ")"
                                if r.get("attn") else "")
            print(f"  {name:<40}{r['tokens_per_s']:>12,}{r['ms_per_step']:>10}{r['model_tflops']:>10}"
                  f"{(mfu or 0) * 100:>7.1f}%{r['peak_mem_gib']:>9}")
        for prof in (r for r in rs if r.get("impl") == "ringleader-profile"):
            cats = [(k[3:], v) for k, v in prof.items() if k.startswith("ms_")]
            total = sum(v for _, v in cats) or 1.0
            print(f"  ringleader ({prof.get('attn', '?')}) kernel time per step: " +
                  ", ".join(f"{k} {v:.1f} ms ({100 * v / total:.0f}%)" for k, v in cats))
            print(f"  attention fwd {prof.get('attn_fwd_tflops')} TFLOP/s, bwd {prof.get('attn_bwd_tflops')} "
                  f"TFLOP/s (FlashAttention's counting); GEMMs {prof.get('gemm_tflops')} TFLOP/s")
        ddp = next((r for r in rs if r.get("impl") == "ringleader-ddp"), None)
        if ddp:
            ov = ddp["overhead"]
            print(f"  DDP at world size 1, nccl on vs off: {ddp['ms_per_step_on']} vs {ddp['ms_per_step_off']} ms/step, "
                  f"overhead {ov * 100:.2f}% (target < 1%) {'MET' if ov < 0.01 else 'NOT MET'}; "
                  f"{ddp['buckets']} buckets, allreduce {ddp['ms_allreduce_busy']} ms busy, "
                  f"{ddp['ms_allreduce_exposed']} ms exposed")
        slots = next((r for r in rs if r.get("impl") == "ringleader-ddp-slots"), None)
        if ddp and slots:
            print(f"  dist.shard per step: optimizer {ddp['ms_per_step_shard_optimizer']} ms, gradients "
                  f"{ddp['ms_per_step_shard_gradients']} ms (flat buffer), "
                  f"{slots['ms_per_step_shard_gradients_slots']} ms in slots as at world > 1 "
                  f"({slots['device_bytes'] / 2**30:.2f} vs {slots['device_bytes_flat'] / 2**30:.2f} GiB)")
        for off in (r for r in rs if r.get("impl") == "ringleader-offload"):
            print(f"  train.offload {off['mode']}: {off['tokens_per_s']} tokens/s vs none {off['tokens_per_s_none']} "
                  f"({off['vs_none']}x), exposed waits per step {off['ms_stream_wait']} ms (stream), "
                  f"{off['ms_host_wait']} ms (host); {off['device_bytes'] / 2**30:.2f} vs "
                  f"{off['device_bytes_none'] / 2**30:.2f} GiB")
        # the first ringleader line: the default (auto) attention's; a second,
        # our own kernels', follows when auto took cuDNN
        ours = next((r for r in rs if r.get("impl") == "ringleader" and "tokens_per_s" in r), None)
        comp = fastest(rs, "pytorch-compile")  # the faster attention variant
        eager = fastest(rs, "pytorch-eager")
        if ours and comp:
            ratio = ours["tokens_per_s"] / comp["tokens_per_s"]
            print(f"  ringleader / torch.compile ({comp.get('attn', '?')}) tokens/s: {ratio:.3f} (target >= 1.1) "
                  f"{'MET' if ratio >= 1.1 else 'NOT MET'}")
        ref_mem = [r["peak_mem_gib"] for r in (comp, eager) if r]
        if ours and ref_mem:
            ok = ours["peak_mem_gib"] <= min(ref_mem)
            print(f"  memory {ours['peak_mem_gib']} GiB vs PyTorch {min(ref_mem)} GiB "
                  f"(target: no higher) {'MET' if ok else 'NOT MET'}")
        if ours and cfg == "b" and ours.get("mfu") is not None:
            print(f"  MFU {ours['mfu'] * 100:.1f}% (target >= 50% on b) {'MET' if ours['mfu'] >= 0.5 else 'NOT MET'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench/gpu_bench.jsonl")
