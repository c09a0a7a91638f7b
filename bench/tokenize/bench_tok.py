#!/usr/bin/env python3
"""Tokenizer throughput, side by side: pkg/tok (bench_tok, C, OpenMP) and
Hugging Face tokenizers' encode_batch (Rust, rayon), the same byte-level BPE
tokenizer.json, the same documents, the same number of threads, alternating
rounds. The tokenizer is trained with tokenizers on check_tokenizer.py's
multilingual generator; the documents are held out. Each round's token
count must equal tokenizers' (make test-ref checks the ids themselves).

Usage: bench_tok.py --bin build/bench/bench_tok [--docs N] [--vocab V] [--rounds R]
Prints one JSON line per round and implementation, then a summary line."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "ref"))
from check_tokenizer import corpus, ordinary, train  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    threads = os.cpu_count()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # before tokenizers starts its pool
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        for kind in ("gpt2", "llama3"):
            train(kind, args.vocab, corpus(1, 6000), path)
            tok = ordinary(path)  # special tokens as plain text, as the C side encodes a corpus
            docs = corpus(3, args.docs)
            jl = os.path.join(tmp, "docs.jsonl")
            with open(jl, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps({"text": d}) + "\n")
            nbytes = sum(len(d.encode("utf-8")) for d in docs)
            want = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
            ours, theirs = [], []
            for _ in range(args.rounds):
                p = subprocess.run([args.bin, path, jl, "1"], capture_output=True, text=True, env=env, check=True)
                line = json.loads(p.stdout.strip().splitlines()[-1])
                if line["tokens"] != want:
                    sys.exit(f"bench_tok: {kind}: ringleader made {line['tokens']} tokens, tokenizers {want}")
                ours.append(line["mb_per_s"])
                print(json.dumps(dict(line, tokenizer=kind)), flush=True)
                t0 = time.perf_counter()
                tok.encode_batch(docs, add_special_tokens=False)
                dt = time.perf_counter() - t0
                theirs.append(nbytes / dt / 1e6)
                print(json.dumps({"bench": "tokenize", "impl": "tokenizers", "tokenizer": kind, "docs": len(docs),
                                  "bytes": nbytes, "tokens": want, "threads": threads, "seconds": round(dt, 4),
                                  "mb_per_s": round(theirs[-1], 2)}), flush=True)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            print(json.dumps({"bench": "tokenize_summary", "tokenizer": kind, "vocab": tok.get_vocab_size(),
                              "ringleader_mb_per_s": mo, "tokenizers_mb_per_s": round(mt, 2),
                              "ratio": round(mo / mt, 2), "threads": threads}), flush=True)


if __name__ == "__main__":
    main()
