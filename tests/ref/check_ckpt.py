#!/usr/bin/env python3
"""Reference check: a checkpoint ringleader wrote loads in Hugging Face.

ringleader trains a small GQA model for a few steps with a file://
checkpoint URI; transformers' LlamaForCausalLM.from_pretrained then loads
the newest step directory (model.safetensors + config.json, nothing else)
and its logits on fixed tokens must equal the logits of our C model built
from the same checkpoint by tests/ref/ckpt_logits.c. The official
`safetensors` package reads both safetensors files, the optimizer's fp32
master copy must equal the model weights bit for bit, and the manifest's
sizes and sha256 must match the files (hashlib, independent of OpenSSL).

Usage: check_ckpt.py --worker bin/ringleader-worker --prepare bin/ringleader-prepare
                     --logits build/tests/ckpt_logits
Prints one PASS/FAIL line per check, SELF-CHECK lines proving a comparison
can fail, then "N passed, M failed"; exits 1 if anything failed.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import Report  # noqa: E402

LOGITS_TOL = 1e-5

MODEL = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "rope_theta": 50000, "rms_norm_eps": 1e-6}


def rel_err(got, want):
    got, want = got.double(), want.double()
    den = torch.linalg.vector_norm(want).item()
    return torch.linalg.vector_norm(got - want).item() / den if den > 0 else float("inf")


def run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", RL_NO_PROGRESS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        raise SystemExit(f"check_ckpt: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--prepare", required=True)
    ap.add_argument("--logits", required=True)
    a = ap.parse_args()
    rep = Report()
    with tempfile.TemporaryDirectory(prefix="check-ckpt-") as d:
        run([a.prepare, "arith", "--out", f"{d}/data"])
        job = {"model": MODEL,
               "train": {"steps": 12, "warmup_steps": 2, "seq_len": 32, "micro_batch": 4,
                         "global_batch_tokens": 512, "eval_every": 0, "eval_batches": 0, "log_every": 4},
               "data": {"train": f"{d}/data/train_*.bin", "val": "", "eval_task": ""},
               "checkpoint": {"uri": f"file://{d}/ck", "every_steps": 6, "keep": 2}}
        with open(f"{d}/job.json", "w") as f:
            json.dump(job, f)
        run([a.worker, "--config", f"{d}/job.json"])
        os.makedirs(f"{d}/out")
        run([a.logits, f"file://{d}/ck", f"{d}/out"])
        with open(f"{d}/out/meta.json") as f:
            meta = json.load(f)
        with open(f"{d}/ck/latest") as f:
            latest = f.read().strip()
        rep.check(latest == meta["dir"] == "step-00000012", f"latest names {latest}, the final step")
        step_dir = f"{d}/ck/{latest}"

        # manifest: sizes and hashes, recomputed here
        with open(f"{step_dir}/manifest.json") as f:
            man = json.load(f)
        names = sorted(x["name"] for x in man["files"])
        rep.check(names == ["config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"],
                  f"manifest lists {names}")
        for x in man["files"]:
            with open(f"{step_dir}/{x['name']}", "rb") as f:
                blob = f.read()
            rep.check(len(blob) == x["size"] and hashlib.sha256(blob).hexdigest() == x["sha256"],
                      f"{x['name']}: size and sha256 match the manifest")

        # Hugging Face loads the directory as it is
        model, info = LlamaForCausalLM.from_pretrained(step_dir, dtype=torch.float32,
                                                       attn_implementation="eager", output_loading_info=True)
        model.eval()
        # lists or sets depending on the transformers version
        missing = [k for key in ("missing_keys", "unexpected_keys", "mismatched_keys") for k in info.get(key, [])]
        rep.check(not missing, f"from_pretrained: no missing, unexpected or mismatched keys {missing}")
        cfg = model.config
        # read what the model runs with, not config attributes (transformers 5
        # moved rope_theta into rope_parameters)
        hd = MODEL["hidden_size"] // MODEL["num_attention_heads"]
        want_inv = 1.0 / (MODEL["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        inv = model.model.rotary_emb.inv_freq.float()
        eps = {m.variance_epsilon for m in model.modules() if hasattr(m, "variance_epsilon")}
        rep.check(cfg.num_key_value_heads == 2 and inv.shape == want_inv.shape
                  and torch.allclose(inv, want_inv, rtol=1e-6, atol=0) and eps == {MODEL["rms_norm_eps"]}
                  and not cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(),
                  "config.json read as the job's model (GQA 8/2, rope theta, eps, untied lm_head)")

        B, T, V = meta["batch"], meta["seq"], meta["vocab"]
        tokens = torch.from_numpy(np.fromfile(f"{d}/out/tokens.i32", dtype="<i4").astype(np.int64)).view(B, T)
        ours = torch.from_numpy(np.fromfile(f"{d}/out/logits.f32", dtype="<f4").copy()).view(B, T, V)
        with torch.no_grad():
            hf = model(tokens).logits
        err = rel_err(ours, hf)
        rep.check(err < LOGITS_TOL, f"logits: ours vs transformers from the checkpoint: {err:.3g} relative "
                  f"(max abs {(ours.double() - hf.double()).abs().max().item():.3g})")
        # the comparison can fail: nudge one weight and it must
        with torch.no_grad():
            model.model.layers[0].self_attn.k_proj.weight[0, 0] += 0.5
            bad = rel_err(ours, model(tokens).logits)
        rep.self_check(bad > 10 * LOGITS_TOL, f"a nudged k_proj weight is caught ({bad:.3g} relative)")

        # the official reader takes both files; master weights are the model's, bit for bit
        with safe_open(f"{step_dir}/model.safetensors", "pt") as fm, \
                safe_open(f"{step_dir}/optimizer.safetensors", "pt") as fo:
            mkeys = set(fm.keys())
            okeys = set(fo.keys())
            rep.check(okeys == {p + k for k in mkeys for p in ("master.", "exp_avg.", "exp_avg_sq.")},
                      f"optimizer.safetensors: master/exp_avg/exp_avg_sq for all {len(mkeys)} tensors")
            same = all(torch.equal(fm.get_tensor(k), fo.get_tensor("master." + k)) for k in mkeys)
            rep.check(same, "master weights equal model.safetensors bit for bit")
            nonneg = all(bool((fo.get_tensor("exp_avg_sq." + k) >= 0).all()) for k in mkeys)
            moved = any(bool(fo.get_tensor("exp_avg." + k).abs().sum() > 0) for k in mkeys)
            rep.check(nonneg and moved, "AdamW moments present (exp_avg_sq >= 0, exp_avg non-zero)")
            rep.check(fm.metadata().get("format") == "pt", "model.safetensors metadata format=pt")
        with open(f"{step_dir}/trainer_state.json") as f:
            st = json.load(f)
        rep.check(st["step"] == 12 and int(st["data"]["sample_index"]) == 12 * 16 and st["world_size"] == 1,
                  "trainer_state: step 12, sample_index 192, world 1")
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
