"""Parquet fixtures for tests/e2e/test_parquet.c, written by pyarrow (the
writer Hugging Face datasets' to_parquet uses), with the same documents as
JSON Lines beside them so the test can compare the two readers.

usage: make_parquet.py DIR
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

d = sys.argv[1]
docs = ["", "hello world", "ünïcode ✓ 2+2=4\n", "tabs\tand\r\nCRLF", "日本語のテキスト", "emoji 👩‍💻🇫🇷"]
docs += [f"document {i}: " + "ab " * (i % 13) for i in range(60)]
half = len(docs) // 2
# several row groups, an extra column before the text, zstd
pq.write_table(pa.table({"id": list(range(half)), "text": docs[:half]}), f"{d}/a.parquet",
               row_group_size=7, compression="zstd")
# large_string, dictionary-encoded pages, snappy
pq.write_table(pa.table({"text": pa.array(docs[half:], pa.large_string())}), f"{d}/b.parquet",
               row_group_size=10, compression="snappy", use_dictionary=True)
with open(f"{d}/docs.jsonl", "w") as f:
    for t in docs:
        f.write(json.dumps({"text": t}) + "\n")
# bad inputs
pq.write_table(pa.table({"text": pa.array(["x", None, "z"])}), f"{d}/null.parquet")
pq.write_table(pa.table({"text": pa.array([1, 2])}), f"{d}/int.parquet")
pq.write_table(pa.table({"body": pa.array(["x"]), "id": [1]}), f"{d}/nofield.parquet")
pq.write_table(pa.table({"text": pa.array([{"a": "x"}])}), f"{d}/nested.parquet")
with open(f"{d}/docs.jsonl", "rb") as f:
    open(f"{d}/notparquet.parquet", "wb").write(f.read())
