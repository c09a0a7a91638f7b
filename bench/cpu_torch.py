#!/usr/bin/env python3
"""The PyTorch side of `make bench-cpu-vs-torch`: the model ringleader
trains (Llama: RMSNorm, RoPE, grouped-query attention, SwiGLU, untied
lm_head) trained on the CPU the way a careful PyTorch user would: fp32,
torch.set_num_threads(--threads), scaled_dot_product_attention with
is_causal (PyTorch's fused CPU flash kernel) and its GQA path, AdamW fused
where this PyTorch has the CPU kernel (else foreach), clip_grad_norm_ at
1.0, set_to_none gradients, and optionally torch.compile of the model.
Same configs, batch, accumulation, optimizer hyper-parameters and token
distribution as bench/cpu_train.c (uniform random ids; the numbers
measure compute). Prints one JSON line.

usage: cpu_torch.py --config default|10m [--compile] [--threads N] [--steps N] [--warmup N]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # hidden, intermediate, layers, heads, kv heads, vocab, seq_len, micro_batch, global_batch_tokens
    "default": dict(d=128, ff=352, layers=4, heads=4, kv=2, vocab=257, seq=64, micro=16, tokens=2048),
    "10m": dict(d=384, ff=1024, layers=6, heads=6, kv=2, vocab=257, seq=256, micro=8, tokens=2048),
}


def rope_tables(seq, hd, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(seq).float(), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.hd = c["heads"], c["kv"], c["d"] // c["heads"]
        self.n1, self.n2 = nn.RMSNorm(c["d"], eps=1e-5), nn.RMSNorm(c["d"], eps=1e-5)
        self.q = nn.Linear(c["d"], self.h * self.hd, bias=False)
        self.k = nn.Linear(c["d"], self.kv * self.hd, bias=False)
        self.v = nn.Linear(c["d"], self.kv * self.hd, bias=False)
        self.o = nn.Linear(self.h * self.hd, c["d"], bias=False)
        self.gate = nn.Linear(c["d"], c["ff"], bias=False)
        self.up = nn.Linear(c["d"], c["ff"], bias=False)
        self.down = nn.Linear(c["ff"], c["d"], bias=False)

    def forward(self, x, cos, sin, gqa):
        B, T, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos[:T], sin[:T]), rope(k, cos[:T], sin[:T])
        if gqa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            r = self.h // self.kv
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["d"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = nn.RMSNorm(c["d"], eps=1e-5)
        self.head = nn.Linear(c["d"], c["vocab"], bias=False)
        cos, sin = rope_tables(c["seq"], c["d"] // c["heads"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # SDPA's enable_gqa exists from PyTorch 2.5; before it, k/v are repeated
        self.gqa = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, x, y):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h, self.cos, self.sin, self.gqa)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def make_opt(model):
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **kw)
        model(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)).backward()
        opt.step()  # a PyTorch without the CPU fused kernel refuses here
        opt.zero_grad(set_to_none=True)
        return opt, "fused"
    except (RuntimeError, TypeError):
        model.zero_grad(set_to_none=True)
        return torch.optim.AdamW(model.parameters(), foreach=True, **kw), "foreach"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int)
    a = ap.parse_args()
    c = CONFIGS[a.config]
    steps = a.steps or (30 if a.config == "default" else 6)
    warmup = a.warmup if a.warmup is not None else (5 if a.compile else 3 if a.config == "default" else 1)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(c)
    opt, kind = make_opt(model)
    # the optimizer's initial state is created above on a tiny batch; the
    # trained weights are not what is measured
    fwd = torch.compile(model) if a.compile else model
    accum = c["tokens"] // (c["micro"] * c["seq"])
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, c["vocab"], (64, c["micro"], c["seq"] + 1), generator=g)

    def step(i):
        for m in range(accum):
            b = data[(i * accum + m) % len(data)]
            loss = fwd(b[:, :-1], b[:, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(warmup + i)
    dt = time.perf_counter() - t0
    assert math.isfinite(loss.item())
    nparams = sum(p.numel() for p in model.parameters())
    print(json.dumps({"bench": "cpu_torch", "config": a.config, "mode": "compile" if a.compile else "eager",
                      "params": nparams, "steps": steps, "seconds": round(dt, 3),
                      "tokens_per_s": round(steps * c["tokens"] / dt, 1), "threads": a.threads,
                      "adamw": kind, "sdpa_gqa": model.gqa, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
