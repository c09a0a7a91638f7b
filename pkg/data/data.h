/* data: token shards (llm.c / nanoGPT format), a stateless sampler, a
 * prefetching loader, and the byte-level tokenizer.
 *
 * Shard formats, llm.c's two: 256 little-endian int32 header words (1024
 * bytes): [0] = magic, [1] = version, [2] = token count, rest zero; then
 * `count` little-endian tokens, nothing after them:
 *   20240520 / 1: uint16 tokens (GPT-2's vocabulary, anything below 65536);
 *   20240801 / 7: uint32 tokens (llm.c's format for Llama 3's 128k vocabulary).
 *
 * Samples: the concatenation of a dataset's shards (in sorted path order) is
 * cut into non-overlapping windows of seq_len+1 tokens starting at multiples
 * of seq_len (the last token of a window is the first of the next, as the
 * target of the last input). A global sample index g maps to
 * (epoch = g / n_windows, window = perm_{seed,epoch}(g % n_windows)), where
 * perm is a keyed bijection computed on the fly, so any rank can find any
 * sample without shared state and a run resumes at an exact position. */
#ifndef RL_DATA_H
#define RL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define RL_SHARD_MAGIC 20240520 /* uint16 tokens */
#define RL_SHARD_VERSION 1
#define RL_SHARD32_MAGIC 20240801 /* uint32 tokens */
#define RL_SHARD32_VERSION 7
#define RL_SHARD_HEADER_BYTES 1024
#define RL_SHARD_MAX_TOKENS ((uint64_t)INT32_MAX)

/* Byte-level tokenizer: bytes are tokens 0..255, end-of-text is 256. */
#define RL_TOK_EOT 256
#define RL_TOK_VOCAB 257

/* ---- shards ----------------------------------------------------------------- */
/* Validate a shard header. `buf` holds the first `len` bytes of the file,
 * `file_size` is the whole file's size; `name` is used in messages.
 * Checks magic and version (one of the two formats), and that file_size ==
 * 1024 + token_bytes * count exactly (shorter = truncated, longer =
 * trailing garbage). *token_bytes (may be NULL): 2 or 4. Fuzzed. */
int rl_shard_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                          uint64_t *ntokens, int *token_bytes, rl_err *e);
/* Write a uint16 shard atomically (temp file + rename). */
int rl_shard_write(const char *path, const uint16_t *tokens, size_t n, rl_err *e);
/* Streaming writer for corpora too large to hold in memory: writes
 * <dir>/<prefix>_000000.bin, _000001.bin, ..., starting a new shard every
 * shard_tokens tokens, token_bytes (2 or 4) a token; each shard appears
 * atomically when complete. close commits the last shard (an empty split
 * still gets one empty shard), removes stale <prefix>_NNNNNN.bin left by an
 * earlier, larger run, and frees w even on failure; abort discards the
 * unfinished shard. add32 takes ids of any width (into a 2-byte writer,
 * one above 65535 is RL_EINPUT naming it). */
typedef struct rl_shard_writer rl_shard_writer;
int rl_shard_writer_open(const char *dir, const char *prefix, uint64_t shard_tokens, int token_bytes,
                         rl_shard_writer **out, rl_err *e);
int rl_shard_writer_add(rl_shard_writer *w, const uint16_t *tok, size_t n, rl_err *e);
int rl_shard_writer_add32(rl_shard_writer *w, const uint32_t *tok, size_t n, rl_err *e);
int rl_shard_writer_close(rl_shard_writer *w, int *nshards, uint64_t *ntokens, rl_err *e);
void rl_shard_writer_abort(rl_shard_writer *w);

/* ---- datasets: several shards read as one token stream ------------------- */
typedef struct rl_dataset rl_dataset;
/* `pattern`: a file, or a glob(3) pattern (sorted); comma-separated lists of
 * either are allowed. Every shard's header is validated here; token values
 * are checked against vocab_size as they are read. */
int rl_dataset_open(const char *pattern, int vocab_size, rl_dataset **out, rl_err *e);
uint64_t rl_dataset_tokens(const rl_dataset *d);
int rl_dataset_nshards(const rl_dataset *d);
/* Read n tokens starting at global token offset `off` into dst (int32).
 * A token >= vocab_size is RL_EINPUT naming the shard file and its index.
 * Thread-safe (pread). */
int rl_dataset_read(rl_dataset *d, uint64_t off, size_t n, int32_t *dst, rl_err *e);
void rl_dataset_close(rl_dataset *d);
/* Entropy (nats) of the token frequencies over the first max_tokens tokens:
 * the loss of the best model that ignores context, which a model that
 * learns must fall well below. */
int rl_dataset_unigram_entropy(rl_dataset *d, uint64_t max_tokens, double *nats, rl_err *e);

/* ---- sampler ------------------------------------------------------------------ */
typedef struct rl_sampler {
    uint64_t n_windows; /* samples per epoch */
    int seq_len;
    uint64_t seed;
    bool shuffle; /* false: window = g % n_windows (eval) */
} rl_sampler;
/* Fails (RL_EINPUT) if the dataset holds fewer than seq_len+1 tokens. */
int rl_sampler_init(rl_sampler *s, uint64_t dataset_tokens, int seq_len, uint64_t seed,
                    bool shuffle, rl_err *e);
/* Token offset of the window for global sample index g. */
uint64_t rl_sampler_offset(const rl_sampler *s, uint64_t g);

/* ---- loader: a prefetch thread fills a ring of micro-batches ---------------
 * Micro-batch k (k = 0, 1, ...) of this rank holds the samples
 *   start + (k / accum) * global_batch + rank_offset + (k % accum) * batch + j,
 *   j = 0..batch-1,   where accum = rank_count / batch,
 * i.e. each optimizer step consumes global_batch consecutive global sample
 * indices and this rank reads its disjoint slice [rank_offset, rank_offset +
 * rank_count) of them in micro-batches of `batch` sequences. */
typedef struct rl_loader_opts {
    int batch;          /* B: sequences per micro-batch */
    int seq_len;        /* T */
    int global_batch;   /* sequences per optimizer step, all ranks */
    int rank_offset;    /* this rank's first sequence within a global batch */
    int rank_count;     /* this rank's sequences per global batch (multiple of batch) */
    uint64_t start;     /* global sample index of the first global batch */
    uint64_t seed;
    bool shuffle;
    int depth;          /* micro-batches prefetched ahead (>= 1) */
    double timeout_s;   /* rl_loader_next gives up after this long (RL_ETIMEOUT) */
} rl_loader_opts;

typedef struct rl_loader rl_loader;
int rl_loader_open(rl_dataset *d, const rl_loader_opts *o, rl_loader **out, rl_err *e);
/* Copy the next micro-batch: inputs[B*T], targets[B*T] (targets = inputs
 * shifted by one). Blocks until ready. Errors from the prefetch thread
 * (bad token, I/O) are returned here, once, with their message. */
int rl_loader_next(rl_loader *l, int32_t *inputs, int32_t *targets, rl_err *e);
/* Global sample index of the next micro-batch's first sample (resume cursor
 * is this value at a step boundary, minus rank_offset: the same on every
 * rank, and simply this value on the rank with rank_offset 0). */
uint64_t rl_loader_position(const rl_loader *l);
/* What this loader has handed out: the number of samples and the sum
 * (mod 2^64) of rl_hash64(global sample index) over them. Sums from all
 * ranks add up to the single-process value exactly when the ranks consumed
 * the same samples, disjointly: the test of "identical data consumed". */
void rl_loader_digest(const rl_loader *l, uint64_t *count, uint64_t *sum);
void rl_loader_close(rl_loader *l);

/* ---- tokenizer ------------------------------------------------------------------ */
/* Bytes -> tokens (one per byte). dst must hold n entries. */
void rl_tok_encode(const unsigned char *src, size_t n, uint16_t *dst);
/* Tokens -> bytes; EOT and ids > 255 are skipped. Returns bytes written
 * (at most n), always NUL-terminates when cap > 0. */
size_t rl_tok_decode(const int32_t *tok, size_t n, char *dst, size_t cap);

/* ---- JSON Lines documents ------------------------------------------------------------
 * One JSON object per line, the document's text in the string field
 * `field` (blank lines skipped). Errors name the file and line: RL_EINPUT
 * for a line that is not one JSON object, lacks the field, holds something
 * else than a string there, or is longer than max_line bytes (0: 64 MiB). */
typedef struct rl_jsonl rl_jsonl;
int rl_jsonl_open(const char *path, const char *field, size_t max_line, rl_jsonl **out, rl_err *e);
/* The next document: *text (UTF-8, valid until the next call) and *len;
 * *text NULL at the end of the file. */
int rl_jsonl_next(rl_jsonl *j, const char **text, size_t *len, rl_err *e);
long long rl_jsonl_line(const rl_jsonl *j); /* the line of the document last returned */
long long rl_jsonl_offset(const rl_jsonl *j); /* bytes of the file read so far */
void rl_jsonl_close(rl_jsonl *j);
/* One line's bytes (no newline) -> its field's text (malloc'ed), `where`
 * ("file:line") leading every message. The parser the reader runs; fuzzed. */
int rl_jsonl_parse_line(const char *line, size_t len, const char *field, const char *where, char **text,
                        size_t *tlen, rl_err *e);

/* ---- Parquet documents ---------------------------------------------------------------
 * One string column (string, large_string, string_view or a dictionary of
 * them) of a Parquet file, row by row, read by Apache Arrow's C++ library
 * through the shim `lib` (pkg/data/parquet_arrow.cc, built by make
 * parquet), loaded on the first open. Errors name the file (and the row,
 * from 0): RL_EINPUT for a file Arrow cannot read, no such column, a
 * column of another type, a null value, or a missing or foreign `lib`. */
typedef struct rl_parquet rl_parquet;
int rl_parquet_open(const char *lib, const char *path, const char *field, rl_parquet **out, rl_err *e);
/* The next document: *text (Arrow's bytes, not NUL-terminated, valid
 * until the next call; they may hold NULs) and *len; *text NULL at the end. */
int rl_parquet_next(rl_parquet *p, const char **text, size_t *len, rl_err *e);
long long rl_parquet_row(const rl_parquet *p);  /* of the document last returned, -1 before */
long long rl_parquet_rows(const rl_parquet *p); /* in the file, from its footer */
void rl_parquet_close(rl_parquet *p);

/* ---- documents of a file: the two above, or text cut at a separator; one loop ------
 * `field`: JSON Lines' and Parquet's text field, or RL_DOCS_TEXT's
 * separator (a C string, not empty: refused; not part of any document;
 * empty documents between two are skipped). Text is read in blocks of 1 MiB: memory follows the longest
 * document, not the file. */
typedef enum { RL_DOCS_JSONL, RL_DOCS_PARQUET, RL_DOCS_TEXT } rl_docs_format;
typedef struct rl_docs rl_docs;
int rl_docs_open(rl_docs_format f, const char *path, const char *field, const char *parquet_lib, rl_docs **out,
                 rl_err *e);
/* The next document, *len bytes (valid until the next call; not
 * NUL-terminated in general), *text NULL at the end. */
int rl_docs_next(rl_docs *d, const char **text, size_t *len, rl_err *e);
/* How much of the file's `size` bytes is read (Parquet: by rows), for progress. */
uint64_t rl_docs_done(const rl_docs *d, uint64_t size);
void rl_docs_close(rl_docs *d);

/* ---- dataset.json: what ringleader-prepare wrote -------------------------------------------
 * Checks the file's bytes (`name` leads every message) against the job:
 * sha256 (hex) of data.tokenizer's file, NULL for the byte-level
 * tokenizer, and `tokenizer` its path for messages; the tokenizer's ids
 * must fit model_vocab. RL_EINPUT naming both sides on a mismatch.
 * *eos_id: the end-of-text token the documents were framed with (its
 * "eos_id"), -1 if it names none. Fuzzed. */
int rl_dataset_meta_check(const char *json, size_t len, const char *name, const char *sha256,
                          const char *tokenizer, int model_vocab, int64_t *eos_id, rl_err *e);

/* ---- synthetic corpora ------------------------------------------------------------- */
/* Arithmetic: lines "a+b=c\n" with 0 <= a,b < 10^digits. Pairs whose
 * rl_hash64(seed ^ (a * 10^digits + b)) falls in the held-out fraction never
 * appear in train; `val` holds each held-out pair once. Train is
 * `train_tokens` long (pairs drawn at random from the training set). */
typedef struct rl_arith_opts {
    int digits;           /* 1..4 */
    double holdout;       /* fraction of pairs held out, 0 < holdout < 1 */
    uint64_t seed;
    uint64_t train_tokens;
} rl_arith_opts;
bool rl_arith_is_heldout(const rl_arith_opts *o, long a, long b);
/* Writes <dir>/train_000000.bin (one or more shards) and <dir>/val_000000.bin. */
int rl_arith_generate(const rl_arith_opts *o, const char *dir, rl_err *e);

#endif
