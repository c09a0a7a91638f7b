#!/usr/bin/env python3
"""Reference check: the C model against Hugging Face's LlamaForCausalLM.

Our own unit tests compare the float model with a double model built from the
same source, so a shared misreading of Llama (RoPE pairing, RMSNorm eps
placement, GQA head mapping, loss reduction) would pass them. This script is
the independent witness: transformers, in float32 on the CPU, recomputes the
step from the parameters and batch that tests/ref/refdump.c wrote, and every
logit, the loss and every parameter's gradient must agree.

Usage: check_llama.py --dump build/tests/refdump
Prints one PASS/FAIL line per check, SELF-CHECK lines proving the comparison
can fail, then "N passed, M failed"; exits 1 if anything failed.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import Report  # noqa: E402

LOGITS_TOL = 1e-5
LOSS_TOL = 1e-6
GRAD_TOL = 1e-5

# (label, refdump flags). The first is refdump's default: GQA, 4 query heads
# per kv head. The second is plain multi-head attention with odd sizes. The
# third is GQA with 2 heads per group, a non-default theta and eps, so that
# those fields are proved to reach both sides.
CONFIGS = [
    ("gqa-8h/2kv", []),
    ("mha-6h/6kv-odd", ["--layers", "3", "--hidden", "48", "--heads", "6", "--kv-heads", "6",
                        "--inter", "100", "--vocab", "61", "--seq", "13", "--batch", "2",
                        "--seed", "11"]),
    ("gqa-6h/3kv-theta", ["--layers", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "3",
                          "--inter", "72", "--vocab", "50", "--seq", "9", "--batch", "2",
                          "--theta", "500000", "--eps", "1e-6", "--seed", "23"]),
]


def rel_err(got, want):
    """Norm-wise relative error ||got - want|| / ||want||, in float64."""
    got = got.detach().double()
    want = want.detach().double()
    den = torch.linalg.vector_norm(want).item()
    num = torch.linalg.vector_norm(got - want).item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def max_abs(got, want):
    return (got.detach().double() - want.detach().double()).abs().max().item()


def read_raw(d, name, dtype, count):
    a = np.fromfile(os.path.join(d, name), dtype=np.dtype(dtype).newbyteorder("<"))
    if a.size != count:
        raise SystemExit(f"check_llama: {name}: {a.size} values, expected {count}")
    return torch.from_numpy(a.astype(np.dtype(dtype)))


def build_model(cfg_json):
    fields = {k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg = LlamaConfig(**fields)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)  # the init is overwritten, but keep the run repeatable
    model = LlamaForCausalLM(cfg).to(device="cpu", dtype=torch.float32)
    return cfg, model


def load_params(model, ours, params):
    with torch.no_grad():
        for n, p in model.named_parameters():
            t = ours[n]
            p.copy_(params[t["offset"]:t["offset"] + p.numel()].view(p.shape))


def check_config(rep, label, cfg_json, model):
    """The settings the C side used must be the ones transformers runs with."""
    hd = cfg_json["hidden_size"] // cfg_json["num_attention_heads"]
    theta = float(cfg_json["rope_theta"])
    want = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    inv_freq = model.model.rotary_emb.inv_freq.float()
    eps = {m.variance_epsilon for m in model.modules() if hasattr(m, "variance_epsilon")}
    attn = model.config._attn_implementation
    ok = (inv_freq.shape == want.shape and torch.allclose(inv_freq, want, rtol=1e-6, atol=0)
          and eps == {cfg_json["rms_norm_eps"]} and attn == "eager"
          and all(p.dtype == torch.float32 for p in model.parameters()))
    rep.self_check(ok, f"{label}: transformers uses theta={theta:g} eps={sorted(eps)} attn={attn} float32")


def run_config(rep, dump_bin, label, flags):
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="refdump-") as d:
        r = subprocess.run([dump_bin, d] + flags, capture_output=True, text=True)
        if r.returncode != 0:
            rep.check(False, f"{label}: refdump exited {r.returncode}: {r.stderr.strip()}")
            return
        t_dump = time.perf_counter() - t0
        with open(os.path.join(d, "config.json")) as f:
            cfg_json = json.load(f)
        with open(os.path.join(d, "tensors.json")) as f:
            tensors = json.load(f)
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        B, T, V = meta["batch"], meta["seq"], cfg_json["vocab_size"]
        total = sum(math.prod(t["shape"]) for t in tensors)
        params = read_raw(d, "params.f32", np.float32, total)
        grads = read_raw(d, "grads.f32", np.float32, total)
        tokens = read_raw(d, "tokens.i32", np.int32, B * T).long().view(B, T)
        targets = read_raw(d, "targets.i32", np.int32, B * T).long()
        c_logits = read_raw(d, "logits.f32", np.float32, B * T * V).view(B * T, V)

    t1 = time.perf_counter()
    cfg, model = build_model(cfg_json)
    check_config(rep, label, cfg_json, model)

    # The tensor table must tile the buffer exactly, and name every HF
    # parameter with its shape: a tensor we failed to load would leave
    # transformers' random init in place and the comparison would be moot.
    layout_ok, off = True, 0
    for t in sorted(tensors, key=lambda t: t["offset"]):
        layout_ok &= t["offset"] == off
        off += math.prod(t["shape"])
    hf = dict(model.named_parameters())
    ours = {t["name"]: t for t in tensors}
    missing = sorted(set(hf) - set(ours))
    extra = sorted(set(ours) - set(hf))
    bad_shape = sorted(n for n in set(hf) & set(ours) if list(hf[n].shape) != ours[n]["shape"])
    rep.check(layout_ok and not missing and not extra and not bad_shape,
              f"{label}: {len(ours)} tensors tile {total} params and match HF names/shapes"
              + (f" (missing {missing})" if missing else "")
              + (f" (unknown {extra})" if extra else "")
              + (f" (shape {bad_shape})" if bad_shape else "")
              + ("" if layout_ok else " (offsets leave gaps/overlaps)"))
    if missing or extra or bad_shape:
        return
    load_params(model, ours, params)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=tokens).logits.view(B * T, V)
    loss = F.cross_entropy(logits, targets)
    loss.backward()
    t_torch = time.perf_counter() - t1

    # The setup must be one that can expose bugs.
    norms_moved = all((p != 1).any().item() for n, p in hf.items() if p.ndim == 1)
    spread = logits.detach().std().item()
    rep.self_check(norms_moved and spread > 0.3,
                   f"{label}: norm weights perturbed={norms_moved}, logit std={spread:.3f} (> 0.3), "
                   f"loss {loss.item():.4f} vs uniform {math.log(V):.4f}")

    e = rel_err(c_logits, logits)
    rep.check(e < LOGITS_TOL, f"{label}: logits rel={e:.2e} maxabs={max_abs(c_logits, logits):.2e}")
    c_loss = float(meta["loss"])
    e = abs(c_loss - loss.item()) / abs(loss.item())
    rep.check(e < LOSS_TOL, f"{label}: loss rel={e:.2e} (C {c_loss:.8f}, HF {loss.item():.8f})")
    worst = None
    for n, p in hf.items():
        t = ours[n]
        g = grads[t["offset"]:t["offset"] + p.numel()].view(p.shape)
        e = rel_err(g, p.grad)
        rep.check(e < GRAD_TOL, f"{label}: grad {n} rel={e:.2e} maxabs={max_abs(g, p.grad):.2e}")
        if worst is None or e > worst[1]:
            worst = (n, e)

    # The comparison must notice a 0.1% error in any one tensor: scale the
    # worst-agreeing gradient and demand that it would have failed.
    n = worst[0]
    t = ours[n]
    g = grads[t["offset"]:t["offset"] + hf[n].numel()].view(hf[n].shape) * 1.001
    e = rel_err(g, hf[n].grad)
    rep.self_check(e >= GRAD_TOL, f"{label}: grad {n} scaled by 1.001 gives rel={e:.2e}, "
                                  f"which the {GRAD_TOL:g} tolerance rejects")
    # And the logits comparison must notice a RoPE detail: the same weights
    # under twice the theta must be rejected.
    _, wrong = build_model(dict(cfg_json, rope_theta=2 * float(cfg_json["rope_theta"])))
    load_params(wrong, ours, params)
    with torch.no_grad():
        e = rel_err(c_logits, wrong(input_ids=tokens).logits.view(B * T, V))
    rep.self_check(e >= LOGITS_TOL, f"{label}: transformers with rope_theta x2 gives logits rel={e:.2e}, "
                                    f"which the {LOGITS_TOL:g} tolerance rejects")
    print(f"TIME {label}: refdump {t_dump:.2f}s, transformers {t_torch:.2f}s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="path to the refdump binary")
    a = ap.parse_args()
    if not os.access(a.dump, os.X_OK):
        print(f"check_llama: --dump {a.dump}: not an executable (build it with make test-ref)",
              file=sys.stderr)
        return 2
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)
    print(f"check_llama: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"cpu float32, eager attention", flush=True)
    rep = Report()
    for label, flags in CONFIGS:
        run_config(rep, a.dump, label, flags)
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
