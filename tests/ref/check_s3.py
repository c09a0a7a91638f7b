#!/usr/bin/env python3
"""Reference check: checkpoints in S3 against the AWS SDK (boto3).

A radosgw (which checks every signature) runs for the duration. ringleader
trains with an s3:// checkpoint URI; boto3 then downloads the newest step
and every file must match the sizes and sha256 ringleader put in its
manifest before uploading (so: byte-identical through another client,
including an object ringleader sent as a multipart upload);
transformers' LlamaForCausalLM.from_pretrained loads the downloaded
directory and its logits equal those of our C model reading the same
checkpoint straight from S3; the official safetensors package reads both
files. Then boto3 uploads that checkpoint under another prefix and
ringleader resumes from it.

Usage: check_s3.py --worker W --prepare P --logits L --rgwserve R
Prints PASS/FAIL lines, SELF-CHECK lines, then "N passed, M failed".
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import boto3
import numpy as np
import torch
from botocore.config import Config
from safetensors import safe_open
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_ckpt import LOGITS_TOL, rel_err  # noqa: E402
from report import Report  # noqa: E402

BUCKET = "rl-ref"
# big enough that optimizer.safetensors (about 18 MB) goes up as a
# multipart upload of 5 MiB parts
MODEL = {"hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "rope_theta": 50000, "rms_norm_eps": 1e-6}


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"check_s3: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return r


def job(d, uri, steps):
    j = {"model": MODEL,
         "train": {"steps": steps, "warmup_steps": 2, "seq_len": 32, "micro_batch": 4,
                   "global_batch_tokens": 512, "eval_every": 0, "eval_batches": 0, "log_every": 1},
         "data": {"train": f"{d}/data/train_*.bin", "val": "", "eval_task": ""},
         "checkpoint": {"uri": uri, "every_steps": 3, "keep": 2, "s3": {"part_mb": 5}}}
    with open(f"{d}/job.json", "w") as f:
        json.dump(j, f)
    return f"{d}/job.json"


def main():
    ap = argparse.ArgumentParser()
    for k in ("worker", "prepare", "logits", "rgwserve"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    rep = Report()
    srv = subprocess.Popen([a.rgwserve, "1024"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(srv.stdout.readline())
        env = dict(os.environ, OMP_NUM_THREADS="1", RL_NO_PROGRESS="1", AWS_ACCESS_KEY_ID=info["access_key"],
                   AWS_SECRET_ACCESS_KEY=info["secret_key"], AWS_ENDPOINT_URL_S3=info["endpoint"],
                   AWS_REGION="us-east-1")
        s3 = boto3.client("s3", endpoint_url=info["endpoint"], region_name="us-east-1",
                          aws_access_key_id=info["access_key"], aws_secret_access_key=info["secret_key"],
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="check-s3-") as d:
            run([a.prepare, "arith", "--out", f"{d}/data"], env)
            run([a.worker, "--config", job(d, f"s3://{BUCKET}/run", 6)], env)
            latest = s3.get_object(Bucket=BUCKET, Key="run/latest")["Body"].read().decode().strip()
            rep.check(latest == "step-00000006", f"boto3 reads latest: {latest}")
            step = f"{d}/dl/{latest}"
            os.makedirs(step)
            man = json.loads(s3.get_object(Bucket=BUCKET, Key=f"run/{latest}/manifest.json")["Body"].read())
            for x in man["files"]:
                s3.download_file(BUCKET, f"run/{latest}/{x['name']}", f"{step}/{x['name']}")
                with open(f"{step}/{x['name']}", "rb") as f:
                    blob = f.read()
                rep.check(len(blob) == x["size"] and hashlib.sha256(blob).hexdigest() == x["sha256"],
                          f"{x['name']} ({len(blob)} bytes) read back by boto3 matches ringleader's manifest")
            head = s3.head_object(Bucket=BUCKET, Key=f"run/{latest}/optimizer.safetensors")
            # a multipart object's ETag is "<md5 of part md5s>-<parts>"; radosgw
            # keeps that form even when its Complete response carried none
            rep.check("-" in head["ETag"], f"optimizer.safetensors went up as a multipart upload (ETag {head['ETag']})")

            # Hugging Face loads what boto3 downloaded; logits equal ours read from S3
            model = LlamaForCausalLM.from_pretrained(step, dtype=torch.float32, attn_implementation="eager")
            model.eval()
            os.makedirs(f"{d}/out")
            run([a.logits, f"s3://{BUCKET}/run", f"{d}/out"], env)
            with open(f"{d}/out/meta.json") as f:
                meta = json.load(f)
            B, T, V = meta["batch"], meta["seq"], meta["vocab"]
            tokens = torch.from_numpy(np.fromfile(f"{d}/out/tokens.i32", dtype="<i4").astype(np.int64)).view(B, T)
            ours = torch.from_numpy(np.fromfile(f"{d}/out/logits.f32", dtype="<f4").copy()).view(B, T, V)
            with torch.no_grad():
                err = rel_err(ours, model(tokens).logits)
            rep.check(meta["dir"] == latest and err < LOGITS_TOL,
                      f"logits: ours (from s3://) vs transformers (from boto3's download): {err:.3g} relative")
            with safe_open(f"{step}/model.safetensors", "pt") as fm, safe_open(f"{step}/optimizer.safetensors", "pt") as fo:
                rep.check(len(fo.keys()) == 3 * len(fm.keys()) > 0, "safetensors reads both files")

            # boto3 uploads the checkpoint elsewhere (manifest last, as ringleader
            # does); ringleader resumes from it
            s3.download_file(BUCKET, f"run/{latest}/manifest.json", f"{step}/manifest.json")
            for name in [x["name"] for x in man["files"]] + ["manifest.json"]:
                s3.upload_file(f"{step}/{name}", BUCKET, f"byboto3/{latest}/{name}")
            s3.put_object(Bucket=BUCKET, Key="byboto3/latest", Body=(latest + "\n").encode())
            r = run([a.worker, "--config", job(d, f"s3://{BUCKET}/byboto3", 9)], env)
            resumed = [json.loads(line) for line in r.stderr.splitlines()
                       if line.startswith("{") and '"event":"resume"' in line]
            rep.check(len(resumed) == 1 and resumed[0].get("found") and resumed[0].get("step") == 6,
                      f"ringleader resumed from the boto3 upload: {resumed}")
            got = s3.get_object(Bucket=BUCKET, Key="byboto3/latest")["Body"].read().decode().strip()
            rep.check(got == "step-00000009", f"and committed its own step after it: {got}")
            # the comparison can fail: a flipped byte must not match the manifest
            blob = bytearray(open(f"{step}/model.safetensors", "rb").read())
            blob[-1] ^= 1
            want = next(x["sha256"] for x in man["files"] if x["name"] == "model.safetensors")
            rep.self_check(hashlib.sha256(blob).hexdigest() != want, "a flipped byte fails the manifest check")
    finally:
        srv.stdin.close()
        srv.wait(timeout=60)
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
