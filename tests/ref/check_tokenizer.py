#!/usr/bin/env python3
"""Reference check: ringleader's byte-level BPE equals Hugging Face `tokenizers`.

Tokenizers are trained here with the `tokenizers` package on a generated
multilingual corpus (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari,
Thai, CJK, Hangul, kana, combining marks, emoji with ZWJ, skin tones and
flags, digit runs, contractions, whitespace runs with tabs, CR LF, NBSP,
U+3000, U+2028 and NEL): GPT-2's layout (ByteLevel pre-tokenizer) at three
vocabulary sizes, one with a prefix space, and Llama 3's (a Split pattern,
ByteLevel without its pattern, ignore_merges, a BOS template), one saved
with the older "a b" merge strings, and Qwen2's (its Split pattern and the
NFC normalizer, on text with decomposed letters, Hangul jamo and
singletons such as the Angstrom sign that NFC rewrites). Held-out documents go through
`ringleader-prepare jsonl --tokenizer`; the shard must hold, token for
token, what `tokenizers` gives each document in the same frame (the
template's tokens, else the end-of-text token before it), with special
tokens written in the text read as plain text (as the C side does for a
corpus: a clone without those added tokens encodes the expectation).
`ringleader-prepare decode` must give the text back (decode(encode(x)) ==
x; with a prefix space, what `tokenizers` decodes; with NFC, NFC(x)). A
WordPiece file and one with another normalizer (NFKC) are refused with one line naming the field, exit 2,
nothing written. Then a model trains on those shards with data.tokenizer
set: its checkpoint opens in transformers as it is (AutoTokenizer encodes
as tokenizers does, config.json names BOS/EOS, and pipeline
("text-generation", model=step_dir) generates), and a job whose
data.tokenizer is not the one dataset.json names is refused, exit 2.

Usage: check_tokenizer.py --prepare bin/ringleader-prepare [--worker bin/ringleader-worker]
Prints one PASS/FAIL line per check, SELF-CHECK lines proving a comparison
can fail, then "N passed, M failed"; exits 1 if anything failed.
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import Report  # noqa: E402

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SCRIPTS = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "àéèêüöäñçßøåœ",
           "абвгдежзийклмнопрстуфхцчшщыэюяАБВГД", "αβγδεζηθικλμνξοπρστυφχψωΑΒΓ",
           "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "אבגדהוזחטיכלמנסעפצקרשת", "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह्ािीु",
           "กขคงจฉชซญดตถทนบปผพฟมยรลวสหอ่้", "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
           "가나다라마바사아자차카타파하한국어", "あいうえおかきくけこさしすせそアイウエオ"]
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🤖", "✨", "e\u0301", "n\u0303",
         # what NFC rewrites: a mark after its letter, jamo into a syllable, singletons, marks reordered
         "A\u030a", "\u1100\u1161\u11a8", "\u212b", "\u2126", "q\u0307\u0323", "\u0344"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00a0", "\u3000", "\u2028", "\u0085", " \t ", "    "]
WORDS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't", "don't", "I'M", "ringleader", "<|", "|>",
         ".", ",", "!?", "...", "()", "{}", "==", "->", "#", "$", "%", "\"", "'", "def f(x):", "x += 1;"]


def corpus(seed, n):
    rng = random.Random(seed)

    def word():
        r = rng.random()
        if r < 0.6:
            s = rng.choice(SCRIPTS)
            return "".join(rng.choice(s) for _ in range(rng.randint(1, 10)))
        if r < 0.72:
            return str(rng.randint(0, 10 ** rng.randint(1, 9)))
        if r < 0.82:
            return rng.choice(EMOJI)
        return rng.choice(WORDS)

    docs = []
    for _ in range(n):
        out = []
        for _ in range(rng.randint(1, 80)):
            out.append(word())
            out.append(rng.choice(SPACES) if rng.random() < 0.3 else " ")
        docs.append("".join(out))
    return docs


def train(kind, vocab, docs, path):
    if kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = ["<|begin_of_text|>", "<|end_of_text|>"]
    elif kind == "qwen2":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=(kind == "prefix"))
        special = ["<|endoftext|>", "<|pad|>"]
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens(["ringleader"])  # an added token that is not special: matched in any text
    if kind == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if kind == "llama3":
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])])
    tok.save(path)
    return tok


def legacy_merges(path):
    """Rewrites the merges as "a b" strings, the format of older files."""
    d = json.load(open(path, encoding="utf-8"))
    d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)


def ordinary(path):
    """The same tokenizer with its special added tokens gone: text that
    spells one is plain text, as ringleader-prepare encodes a corpus."""
    d = json.load(open(path, encoding="utf-8"))
    d["added_tokens"] = [a for a in d["added_tokens"] if not a["special"]]
    d["post_processor"] = None
    return Tokenizer.from_str(json.dumps(d))


def read_shards(pattern):
    out = []
    for f in sorted(glob.glob(pattern)):
        raw = open(f, "rb").read()
        hdr = np.frombuffer(raw[:1024], dtype="<i4")
        out += np.frombuffer(raw[1024:], dtype="<u2" if hdr[0] == 20240520 else "<u4").tolist()
    return out


def check_one(rep, args, tmp, name, kind, vocab, train_docs, held, legacy=False):
    path = os.path.join(tmp, f"{name}.json")
    tok = train(kind, vocab, train_docs, path)
    if legacy:
        legacy_merges(path)
        tok = Tokenizer.from_file(path)
    plain = ordinary(path)
    jl = os.path.join(tmp, f"{name}.jsonl")
    with open(jl, "w", encoding="utf-8") as f:
        for d in held:
            f.write(json.dumps({"text": d}) + "\n")
    out = os.path.join(tmp, f"{name}-out")
    cmd = [args.prepare, "jsonl", "--tokenizer", path, "--val-fraction", "0", "--out", out, jl]
    frame_before, frame_after = [], []
    if kind == "llama3":
        frame_before = [tok.token_to_id("<|begin_of_text|>")]
    else:  # two special tokens: the end-of-text one is named
        cmd[2:2] = ["--eos", "<|endoftext|>"]
        frame_before = [tok.token_to_id("<|endoftext|>")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    rep.check(p.returncode == 0, f"{name}: ringleader-prepare jsonl --tokenizer exits 0"
                                 + (f" ({p.stderr.strip()[-300:]})" if p.returncode else ""))
    if p.returncode:
        return
    per_doc = [frame_before + plain.encode(d, add_special_tokens=False).ids + frame_after for d in held]
    want = [i for ids in per_doc for i in ids]
    got = read_shards(os.path.join(out, "train_*.bin"))
    first = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), None)
    detail = "" if got == want else f" first difference at token {first}, lengths {len(got)} vs {len(want)}"
    rep.check(got == want, f"{name}: {len(held)} held-out documents, {len(want)} tokens equal to tokenizers' "
                           f"(vocab {tok.get_vocab_size()}){detail}")
    bad = list(want)
    bad[len(bad) // 2] ^= 1
    rep.self_check(got != bad, f"{name}: one id changed is seen")
    meta = json.load(open(os.path.join(out, "dataset.json")))
    rep.check(meta["tokenizer"]["vocab_size"] == tok.get_vocab_size() and meta["tokens"] == len(want),
              f"{name}: dataset.json names the vocabulary ({meta['tokenizer']['vocab_size']}) and the tokens")
    d = subprocess.run([args.prepare, "decode", "--tokenizer", path] + sorted(glob.glob(os.path.join(out, "train_*.bin"))),
                       capture_output=True)
    sep = tok.decode(frame_before, skip_special_tokens=False)
    if kind == "prefix":  # the prefix space stays, as in tokenizers' own decode
        text = "".join(tok.decode(ids, skip_special_tokens=False) for ids in per_doc)
    elif kind == "qwen2":  # the normalized text
        text = "".join(sep + unicodedata.normalize("NFC", doc) for doc in held)
        rep.self_check(text != "".join(sep + doc for doc in held), f"{name}: NFC changes the held-out text")
    else:
        text = "".join(sep + doc for doc in held)
    rep.check(d.returncode == 0 and d.stdout == text.encode("utf-8"),
              f"{name}: ringleader-prepare decode gives the documents back ({len(d.stdout)} bytes)")


def check_refusals(rep, args, tmp, docs):
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(docs[:200], trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    nfkc = train("gpt2", 300, docs[:200], os.path.join(tmp, "nfkc.json"))
    nfkc.normalizer = normalizers.NFKC()
    jl = os.path.join(tmp, "one.jsonl")
    open(jl, "w").write(json.dumps({"text": "hello"}) + "\n")
    for name, tok, field in [("wordpiece", wp, "model.type"), ("nfkc", nfkc, "normalizer")]:
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        out = os.path.join(tmp, f"{name}-out")
        p = subprocess.run([args.prepare, "jsonl", "--tokenizer", path, "--out", out, jl], capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        rep.check(p.returncode == 2 and len(lines) == 1 and path in lines[0] and field in lines[0]
                  and not os.path.exists(out),
                  f"{name} tokenizer.json refused: exit {p.returncode}, one line naming {field}: {p.stderr.strip()[:160]}")


def check_checkpoint(rep, args, tmp, train_docs, held):
    from transformers import AutoTokenizer, pipeline  # torch's venv only; the bench imports this file without

    for name in ("llama3-2000", "gpt2-300"):
        tok_path, out = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}-out")
        job = {"model": {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 64},
               "train": {"steps": 6, "warmup_steps": 1, "seq_len": 32, "micro_batch": 4, "global_batch_tokens": 256,
                         "eval_every": 0, "eval_batches": 0, "log_every": 3},
               "data": {"train": f"{out}/train_*.bin", "val": "", "eval_task": "", "tokenizer": tok_path},
               "checkpoint": {"uri": f"file://{tmp}/{name}-ck", "every_steps": 0, "keep": 1}}
        cfg = os.path.join(tmp, f"{name}-job.json")
        json.dump(job, open(cfg, "w"))
        env = dict(os.environ, OMP_NUM_THREADS="1", RL_NO_PROGRESS="1")
        p = subprocess.run([args.worker, "--config", cfg], capture_output=True, text=True, env=env)
        rep.check(p.returncode == 0, f"{name}: a model trains on the shards with data.tokenizer set"
                                     + (f" ({p.stderr.strip()[-400:]})" if p.returncode else ""))
        if p.returncode:
            continue
        step_dir = os.path.join(tmp, f"{name}-ck", open(os.path.join(tmp, f"{name}-ck", "latest")).read().strip())
        ref = Tokenizer.from_file(tok_path)
        at = AutoTokenizer.from_pretrained(step_dir)
        text = held[3]
        same = at(text, add_special_tokens=True)["input_ids"] == ref.encode(text).ids
        rep.check(same and at.decode(ref.encode(text, add_special_tokens=False).ids) == text,
                  f"{name}: AutoTokenizer.from_pretrained(step dir) encodes and decodes as tokenizers does")
        conf = json.load(open(os.path.join(step_dir, "config.json")))
        want_bos = ref.token_to_id("<|begin_of_text|>") if name.startswith("llama3") else None
        want_eos = None if name.startswith("llama3") else ref.token_to_id("<|endoftext|>")  # prepare's --eos
        rep.check(conf["bos_token_id"] == want_bos and at.bos_token_id == want_bos and conf["eos_token_id"] == want_eos
                  and at.eos_token_id == want_eos,
                  f"{name}: config.json and the tokenizer agree on BOS {conf['bos_token_id']} and EOS {conf['eos_token_id']}")
        gen = pipeline("text-generation", model=step_dir, device="cpu")
        res = gen("hello ", max_new_tokens=8, do_sample=False)[0]["generated_text"]
        rep.check(isinstance(res, str) and res.startswith("hello ") and len(res) > len("hello "),
                  f"{name}: pipeline(\"text-generation\", model=step dir) generates: {res[:60]!r}")
    # a job whose tokenizer is not the one the shards were made with
    job["data"]["tokenizer"] = os.path.join(tmp, "gpt2-prefix-1000.json")
    json.dump(job, open(cfg, "w"))
    p = subprocess.run([args.worker, "--config", cfg], capture_output=True, text=True, env=env)
    err = [ln for ln in p.stderr.splitlines() if "dataset.json" in ln]
    rep.check(p.returncode == 2 and err and "gpt2-prefix-1000.json" in err[0] and "gpt2-300.json" in err[0],
              f"another data.tokenizer than dataset.json's is refused, exit {p.returncode}: {(err or [''])[0][:200]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", required=True)
    ap.add_argument("--worker")
    args = ap.parse_args()
    rep = Report()
    train_docs, held = corpus(1, 3000), corpus(2, 400)
    held += ["", "a", " leading", "trailing  ", "x" * 5000, " " * 3000 + "y", "12345678901234567890",
             "a literal <|endoftext|> and <|begin_of_text|> inside", "ringleader" * 3, "\r\n\r\n\t \u0085\u2028"]
    with tempfile.TemporaryDirectory() as tmp:
        check_one(rep, args, tmp, "gpt2-300", "gpt2", 300, train_docs, held)
        check_one(rep, args, tmp, "gpt2-4000", "gpt2", 4000, train_docs, held)
        check_one(rep, args, tmp, "gpt2-prefix-1000", "prefix", 1000, train_docs, held)
        check_one(rep, args, tmp, "llama3-2000", "llama3", 2000, train_docs, held)
        check_one(rep, args, tmp, "llama3-600-legacy-merges", "llama3", 600, train_docs, held, legacy=True)
        check_one(rep, args, tmp, "qwen2-nfc-1500", "qwen2", 1500, train_docs, held)
        check_refusals(rep, args, tmp, train_docs)
        if args.worker:
            check_checkpoint(rep, args, tmp, train_docs, held)
    print(f"{rep.passed} passed, {rep.failed} failed")
    sys.exit(1 if rep.failed else 0)


if __name__ == "__main__":
    main()
