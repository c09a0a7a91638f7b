#!/usr/bin/env python3
"""Tokenizer throughput, side by side: pkg/tok (bench_tok, C, OpenMP) and
Hugging Face tokenizers' encode_batch and encode_batch_fast (Rust, rayon;
the second skips offsets), the same byte-level BPE
tokenizer.json, the same documents, the same number of threads, alternating
rounds. The tokenizer is trained with tokenizers on check_tokenizer.py's
multilingual generator; the documents are held out. Each round's token
count must equal tokenizers' (make test-ref checks the ids themselves).

Usage: bench_tok.py --bin build/bench/bench_tok [--docs N] [--vocab V] [--rounds R]
Prints one JSON line per round and implementation, then a summary line."""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "ref"))
from check_tokenizer import corpus, ordinary, train  # noqa: E402


def zipf_corpus(seed, n):
    """Text that repeats itself as prose does: 5,000 Latin-letter words drawn
    with Zipf's law (the word caches of both sides hit, as on real text)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("etaoinshrdlucmfwypvbgkqjxz"[:rng.randint(8, 26)]) for _ in range(rng.randint(1, 10)))
             for _ in range(5000)]
    weights = [1.0 / (k + 1) for k in range(len(words))]
    docs = []
    for _ in range(n):
        ws = rng.choices(words, weights, k=rng.randint(20, 160))
        docs.append(" ".join(ws) + rng.choice([".\n", ". ", "!\n\n", ", and 42.\n"]))
    return docs


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
        for kind, text in (("gpt2", "multilingual"), ("llama3", "multilingual"), ("qwen2", "multilingual"),
                           ("gpt2", "zipf")):
            gen = corpus if text == "multilingual" else zipf_corpus
            train(kind, args.vocab, gen(1, 6000), path)
            tok = ordinary(path)  # special tokens as plain text, as the C side encodes a corpus
            docs = gen(3, args.docs)
            jl = os.path.join(tmp, "docs.jsonl")
            with open(jl, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps({"text": d}) + "\n")
            nbytes = sum(len(d.encode("utf-8")) for d in docs)
            want = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
            ours, theirs, fast = [], [], []
            for _ in range(args.rounds):
                p = subprocess.run([args.bin, path, jl, "1"], capture_output=True, text=True, env=env, check=True)
                line = json.loads(p.stdout.strip().splitlines()[-1])
                if line["tokens"] != want:
                    sys.exit(f"bench_tok: {kind}: ringleader made {line['tokens']} tokens, tokenizers {want}")
                ours.append(line["mb_per_s"])
                print(json.dumps(dict(line, tokenizer=kind, text=text)), flush=True)
                # encode_batch (what the issue names) and encode_batch_fast (no offsets)
                for impl, fn, out in (("tokenizers", tok.encode_batch, theirs),
                                      ("tokenizers_fast", getattr(tok, "encode_batch_fast", None), fast)):
                    if fn is None:
                        continue
                    t0 = time.perf_counter()
                    fn(docs, add_special_tokens=False)
                    dt = time.perf_counter() - t0
                    out.append(nbytes / dt / 1e6)
                    print(json.dumps({"bench": "tokenize", "impl": impl, "tokenizer": kind, "text": text, "docs": len(docs),
                                      "bytes": nbytes, "tokens": want, "threads": threads, "seconds": round(dt, 4),
                                      "mb_per_s": round(out[-1], 2)}), flush=True)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            mf = statistics.median(fast) if fast else None
            print(json.dumps({"bench": "tokenize_summary", "tokenizer": kind, "text": text, "vocab": tok.get_vocab_size(),
                              "mb": round(nbytes / 1e6, 1),
                              "ringleader_mb_per_s": mo, "tokenizers_mb_per_s": round(mt, 2),
                              "tokenizers_fast_mb_per_s": round(mf, 2) if mf else None,
                              "ratio": round(mo / mt, 2), "ratio_fast": round(mo / mf, 2) if mf else None,
                              "threads": threads}), flush=True)


if __name__ == "__main__":
    main()
