/* ringleader-prepare: turn text into token shards, or generate the synthetic
 * corpora (arithmetic, uniform random tokens). A thin layer over pkg/data:
 * parse flags, call the library, report what was written. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/flags.h"
#include "data/data.h"
#include "tok/tok.h"
#include "util/util.h"

#define PROG "ringleader-prepare"
#define DEFAULT_SHARD_TOKENS 100000000ull

static const char usage[] =
    "usage: " PROG " <mode> --out DIR [options]\n"
    "\n"
    "Writes llm.c-format token shards: DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin.\n"
    "\n"
    "modes:\n"
    "  text FILE...      each file one document: byte-level tokens (0..255) after an\n"
    "                    end-of-text token (256), or --tokenizer's; the last\n"
    "                    --val-fraction of the stream becomes val\n"
    "      --tokenizer F      a Hugging Face tokenizer.json (byte-level BPE): documents\n"
    "                         encoded on every core, wrapped in the tokens its\n"
    "                         post-processor adds (Llama 3: BOS), else after --eos\n"
    "      --eos TOKEN        the token before each document when the tokenizer's\n"
    "                         template adds none (default: its only special token)\n"
    "      --split-on S       documents inside each file, separated by the string S\n"
    "                         (not kept; empty documents skipped), read in 1 MiB blocks\n"
    "                         and checked before any shard is written, as for jsonl\n"
    "      --val-fraction F   fraction of tokens for val, in [0, 1) (default 0.05;\n"
    "                         0 writes no val split)\n"
    "      --shard-tokens N   tokens per shard (default 100000000)\n"
    "  jsonl FILE...     JSON Lines (one object per line, as datasets' to_json writes),\n"
    "                    each line a document; every line is read before any shard\n"
    "                    is written\n"
    "      --field NAME       the string field holding the text (default \"text\")\n"
    "      --tokenizer F, --eos TOKEN, --val-fraction F, --shard-tokens N   as for text\n"
    "  parquet FILE...   Parquet (as datasets' to_parquet writes): each row of a string\n"
    "                    column a document, read by Apache Arrow's C++ library (the\n"
    "                    reader `make parquet` builds into lib/ringleader beside bin/);\n"
    "                    every row is read before any shard is written\n"
    "      --field NAME, --tokenizer F, --eos TOKEN, --val-fraction F, --shard-tokens N\n"
    "                         as for jsonl\n"
    "  decode FILE...    shards back to text, on stdout (no --out)\n"
    "      --tokenizer F      the tokenizer that wrote them (default byte-level)\n"
    "  arith             lines \"a+b=c\\n\"; held-out pairs appear only in val\n"
    "      --digits D         operand digits, 1..4 (default 2)\n"
    "      --holdout H        fraction of pairs held out for val, in (0, 1) (default 0.1)\n"
    "      --seed S           (default 1337)\n"
    "      --tokens N         train tokens, rounded up to a whole line (default 2000000)\n"
    "  synthetic         uniform random tokens, for throughput tests\n"
    "      --tokens N         train tokens (default 10000000); val gets N/20 more\n"
    "      --vocab V          tokens are in [0, V), V in [1, 1048576] (default 257; above\n"
    "                         65536 the shards hold uint32 ids, llm.c's Llama 3 format)\n"
    "      --seed S           (default 1337)\n"
    "      --shard-tokens N   tokens per shard (default 100000000)\n"
    "\n"
    "common:\n"
    "  --out DIR         output directory (created if missing; required)\n"
    "  -h, --help        this text\n"
    "\n"
    "text, jsonl and parquet also write DIR/dataset.json: the tokenizer (sha256, vocabulary),\n"
    "token counts and sources. Progress goes to stderr: a status line on a terminal,\n"
    "else JSON lines (event prepare_progress). Ends with one JSON log line (event\n"
    "prepare_done) naming what was written.\n";

/* ---- flag parsing ----------------------------------------------------------- */

static int bad_flag(const char *flag, const char *what) {
    fprintf(stderr, PROG ": error: %s: %s\n", flag, what);
    return 2;
}

static int parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    char what[160];
    snprintf(what, sizeof what, "must be an integer in [%llu, %llu]", (unsigned long long)min,
             (unsigned long long)max);
    if (!*s || *s == '-' || *s == '+') return bad_flag(flag, what);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max) return bad_flag(flag, what);
    *out = v;
    return 0;
}

static int parse_num(const char *flag, const char *s, double lo, bool lo_incl, double hi,
                     bool hi_incl, double *out) {
    char what[160];
    snprintf(what, sizeof what, "must be a number in %c%g, %g%c", lo_incl ? '[' : '(', lo, hi,
             hi_incl ? ']' : ')');
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || errno || *end || !isfinite(v) || (lo_incl ? v < lo : v <= lo) ||
        (hi_incl ? v > hi : v >= hi))
        return bad_flag(flag, what);
    *out = v;
    return 0;
}

typedef struct {
    const char *mode;
    const char *out;
    double val_fraction;
    uint64_t shard_tokens;
    uint64_t digits;
    double holdout;
    uint64_t seed;
    uint64_t tokens;
    bool tokens_set;
    uint64_t vocab;
    const char *field;
    const char *tokenizer, *eos;
    const char *split_on;    /* text: the document separator, or NULL (a file is one) */
    const char *parquet_lib; /* the Arrow shim, beside this binary */
    const char **files;
    int nfiles;
} args;

/* Returns 0, 2 on a bad command line, or -1 after printing --help. */
static int parse_args(int argc, char **argv, args *a) {
    a->val_fraction = 0.05;
    a->shard_tokens = DEFAULT_SHARD_TOKENS;
    a->digits = 2;
    a->holdout = 0.1;
    a->seed = 1337;
    a->vocab = RL_TOK_VOCAB;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return -1;
        }
    }
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    a->mode = argv[1];
    bool recs = !strcmp(a->mode, "jsonl") || !strcmp(a->mode, "parquet"),
         text = recs || !strcmp(a->mode, "text"),
         arith = !strcmp(a->mode, "arith"), synth = !strcmp(a->mode, "synthetic"),
         decode = !strcmp(a->mode, "decode");
    if (!text && !arith && !synth && !decode) {
        fprintf(stderr, PROG ": %s: unknown mode (text, jsonl, parquet, decode, arith or synthetic; see --help)\n",
                a->mode);
        return 2;
    }
    a->files = calloc((size_t)argc, sizeof *a->files);
    if (!a->files) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    /* each mode takes its own flags; the values are checked below */
    const char *out = NULL, *valf = NULL, *shard = NULL, *digits = NULL, *holdout = NULL, *seed = NULL,
               *tokens = NULL, *vocab = NULL, *field = NULL;
    rl_flag fl[12];
    int n = 0;
    if (!decode) fl[n++] = (rl_flag){"--out", NULL, RL_FLAG_STR, &out, 0, 0};
    if (text || decode) fl[n++] = (rl_flag){"--tokenizer", NULL, RL_FLAG_STR, &a->tokenizer, 0, 0};
    if (text) fl[n++] = (rl_flag){"--eos", NULL, RL_FLAG_STR, &a->eos, 0, 0};
    if (!strcmp(a->mode, "text")) fl[n++] = (rl_flag){"--split-on", NULL, RL_FLAG_STR, &a->split_on, 0, 0};
    if (text) fl[n++] = (rl_flag){"--val-fraction", NULL, RL_FLAG_STR, &valf, 0, 0};
    if (text || synth) fl[n++] = (rl_flag){"--shard-tokens", NULL, RL_FLAG_STR, &shard, 0, 0};
    if (arith) fl[n++] = (rl_flag){"--digits", NULL, RL_FLAG_STR, &digits, 0, 0};
    if (arith) fl[n++] = (rl_flag){"--holdout", NULL, RL_FLAG_STR, &holdout, 0, 0};
    if (arith || synth) fl[n++] = (rl_flag){"--seed", NULL, RL_FLAG_STR, &seed, 0, 0};
    if (arith || synth) fl[n++] = (rl_flag){"--tokens", NULL, RL_FLAG_STR, &tokens, 0, 0};
    if (synth) fl[n++] = (rl_flag){"--vocab", NULL, RL_FLAG_STR, &vocab, 0, 0};
    if (recs) fl[n++] = (rl_flag){"--field", NULL, RL_FLAG_STR, &field, 0, 0};
    /* text, jsonl, parquet and decode take files */
    int rc = rl_flags_parse(PROG, argc, argv, 2, fl, n, text || decode ? a->files : NULL, argc, &a->nfiles);
    if (rc) return rc;
    if (out && !*out) return bad_flag("--out", "must not be empty");
    if (field && !*field) return bad_flag("--field", "must not be empty");
    if (a->split_on && !*a->split_on) return bad_flag("--split-on", "must not be empty");
    if (a->tokenizer && !*a->tokenizer) return bad_flag("--tokenizer", "must not be empty");
    if (a->eos && !a->tokenizer) return bad_flag("--eos", "needs --tokenizer (byte-level text ends documents with 256)");
    a->field = field ? field : "text";
    a->out = out;
    if ((valf && (rc = parse_num("--val-fraction", valf, 0, true, 1, false, &a->val_fraction))) ||
        (shard && (rc = parse_u64("--shard-tokens", shard, 1, RL_SHARD_MAX_TOKENS, &a->shard_tokens))) ||
        (digits && (rc = parse_u64("--digits", digits, 1, 4, &a->digits))) ||
        (holdout && (rc = parse_num("--holdout", holdout, 0, false, 1, false, &a->holdout))) ||
        (seed && (rc = parse_u64("--seed", seed, 0, UINT64_MAX, &a->seed))) ||
        (tokens && (rc = parse_u64("--tokens", tokens, 1, 1000000000000ull, &a->tokens))) ||
        (vocab && (rc = parse_u64("--vocab", vocab, 1, 1 << 20, &a->vocab))))
        return rc;
    a->tokens_set = tokens != NULL;
    if (!a->out && !decode) return bad_flag("--out", "required");
    if ((text || decode) && a->nfiles == 0) return bad_flag(a->mode, "needs at least one input FILE");
    if (!a->tokens_set) a->tokens = arith ? 2000000 : 10000000;
    return 0;
}

/* ---- text, jsonl and parquet: the split -------------------------------------------------- */

/* Sends the first `ntrain` tokens of the stream to train, the rest to val. */
typedef struct {
    rl_shard_writer *train, *val;
    uint64_t ntrain, seen;
} router;

static int route(router *r, const uint32_t *tok, size_t n, rl_err *e) {
    if (r->seen < r->ntrain) {
        uint64_t room = r->ntrain - r->seen;
        size_t k = (uint64_t)n < room ? n : (size_t)room;
        int rc = rl_shard_writer_add32(r->train, tok, k, e);
        if (rc) return rc;
        r->seen += k;
        tok += k;
        n -= k;
    }
    if (n == 0) return RL_OK;
    r->seen += n;
    return rl_shard_writer_add32(r->val, tok, n, e);
}

/* What each input file gave: dataset.json's sources. */
typedef struct {
    uint64_t bytes, docs;
} source;

/* Writes the stream `feed` routes (total tokens, known up front) to the
 * shards: the last --val-fraction of it to val. */
typedef int (*feed_fn)(router *r, void *ctx, rl_err *e);
static int write_split(const args *a, uint64_t total, int token_bytes, feed_fn feed, void *ctx, rl_err *e) {
    uint64_t nval = (uint64_t)floor((double)total * a->val_fraction);
    if (a->val_fraction > 0 && nval == 0)
        return rl_errf(e, RL_EINPUT,
                       "--val-fraction: %g of %llu tokens is no token at all; give more text or "
                       "a larger fraction (0 skips val)",
                       a->val_fraction, (unsigned long long)total);
    router r = {.ntrain = total - nval};
    int rc = rl_shard_writer_open(a->out, "train", a->shard_tokens, token_bytes, &r.train, e);
    if (!rc && nval > 0) rc = rl_shard_writer_open(a->out, "val", a->shard_tokens, token_bytes, &r.val, e);
    if (!rc) rc = feed(&r, ctx, e);
    if (!rc) {
        rc = rl_shard_writer_close(r.train, NULL, NULL, e);
        r.train = NULL;
    }
    if (!rc && r.val) {
        rc = rl_shard_writer_close(r.val, NULL, NULL, e);
        r.val = NULL;
    }
    /* No val split asked for: a val split from an earlier run in the same
     * directory would silently evaluate on other text. */
    for (int i = 0; !rc && nval == 0; i++) {
        char path[4200], esc[8400];
        snprintf(path, sizeof path, "%s/val_%06d.bin", a->out, i);
        if (unlink(path) != 0) break;
        rl_log(RL_LOG_WARN, "shard_stale_removed", "\"path\":\"%s\"",
               rl_json_escape(esc, sizeof esc, path));
    }
    rl_shard_writer_abort(r.train);
    rl_shard_writer_abort(r.val);
    return rc;
}

/* Each input is a regular, readable file; its size in sizes[i]. */
static int stat_inputs(const args *a, source *src, rl_err *e) {
    for (int i = 0; i < a->nfiles; i++) {
        struct stat st;
        if (stat(a->files[i], &st) != 0)
            return rl_errf(e, RL_EINPUT, "%s: cannot open: %s", a->files[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return rl_errf(e, RL_EINPUT, "%s: not a regular file", a->files[i]);
        if (access(a->files[i], R_OK) != 0)
            return rl_errf(e, RL_EINPUT, "%s: cannot read: %s", a->files[i], strerror(errno));
        src[i].bytes = (uint64_t)st.st_size;
    }
    return RL_OK;
}

/* ---- progress: a status line on a terminal, JSON lines otherwise ------------------ */

typedef struct {
    uint64_t total, done, docs; /* input bytes */
    double t0, last;
    bool tty;
} progress;

static void progress_show(progress *p, bool final) {
    double now = rl_now(), dt = now - p->t0;
    if (!final && now - p->last < (p->tty ? 0.25 : 10.0)) return;
    p->last = now;
    double rate = dt > 0 ? (double)p->done / dt : 0, eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    if (p->done >= p->total) eta = 0;
    if (p->tty) {
        fprintf(stderr, "\r%s: %.1f of %.1f MB, %llu docs, %.0f docs/s, %.1f MB/s, ETA %.0f s   %s", PROG,
                (double)p->done / 1e6, (double)p->total / 1e6, (unsigned long long)p->docs,
                dt > 0 ? (double)p->docs / dt : 0, rate / 1e6, eta, final ? "\n" : "");
        fflush(stderr);
    } else {
        rl_log(RL_LOG_INFO, "prepare_progress",
               "\"bytes\":%llu,\"total_bytes\":%llu,\"docs\":%llu,\"docs_per_s\":%.1f,\"bytes_per_s\":%.0f,"
               "\"eta_s\":%.0f",
               (unsigned long long)p->done, (unsigned long long)p->total, (unsigned long long)p->docs,
               dt > 0 ? (double)p->docs / dt : 0, rate, eta);
    }
}

/* ---- byte-level ------------------------------------------------------------------ */

/* Bytes as byte-level tokens (a byte is its own id), routed. */
static int route_bytes(router *r, const unsigned char *b, size_t n, rl_err *e) {
    static uint32_t tok[1 << 18];
    int rc = RL_OK;
    for (size_t off = 0, k; off < n && !rc; off += k) {
        k = n - off < sizeof tok / sizeof tok[0] ? n - off : sizeof tok / sizeof tok[0];
        for (size_t i = 0; i < k; i++) tok[i] = b[off + i];
        rc = route(r, tok, k, e);
    }
    return rc;
}

/* the byte-level frame: its tokens on each side of a document */
static uint64_t framing(const rl_doc_frame *fr) { return (uint64_t)fr->nbefore + (uint64_t)fr->nafter; }

static int text_file(router *r, const rl_doc_frame *fr, const char *path, uint64_t expect, rl_err *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rl_errf(e, RL_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    static unsigned char buf[1 << 20];
    int rc = route(r, fr->before, (size_t)fr->nbefore, e);
    uint64_t got = 0;
    while (!rc) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = rl_errf(e, RL_EIO, "%s: read: %s", path, strerror(errno));
            break;
        }
        if (n == 0) break;
        got += (uint64_t)n;
        /* The train/val split was computed from the sizes seen at start. */
        if (got > expect) break;
        rc = route_bytes(r, buf, (size_t)n, e);
    }
    close(fd);
    if (!rc) rc = route(r, fr->after, (size_t)fr->nafter, e);
    if (!rc && got != expect)
        rc = rl_errf(e, RL_EIO, "%s: changed size while being read (%llu bytes, expected %llu)",
                     path, (unsigned long long)got, (unsigned long long)expect);
    return rc;
}

/* jsonl, parquet and text --split-on: files of several documents */
static bool records(const args *a) { return strcmp(a->mode, "text") != 0 || a->split_on; }
static int docs_open(const args *a, const char *path, rl_docs **d, rl_err *e) {
    rl_docs_format f = !strcmp(a->mode, "parquet") ? RL_DOCS_PARQUET
                     : !strcmp(a->mode, "jsonl")   ? RL_DOCS_JSONL
                                                   : RL_DOCS_TEXT;
    return rl_docs_open(f, path, f == RL_DOCS_TEXT ? a->split_on : a->field, a->parquet_lib, d, e);
}

/* One file's documents, each its bytes in the frame: routed (r non-NULL)
 * or only counted. *tokens is the file's token count; with expect (the
 * first pass's count) a file that changed in between fails. */
static int records_file(router *r, const args *a, const rl_doc_frame *fr, const char *path, uint64_t expect,
                        uint64_t *tokens, uint64_t *docs, rl_err *e) {
    rl_docs *d;
    int rc = docs_open(a, path, &d, e);
    const char *text;
    size_t len;
    *tokens = 0, *docs = 0;
    while (!rc && !(rc = rl_docs_next(d, &text, &len, e)) && text) {
        *tokens += len + framing(fr);
        (*docs)++;
        if (r && !(rc = route(r, fr->before, (size_t)fr->nbefore, e)) &&
            !(rc = route_bytes(r, (const unsigned char *)text, len, e)))
            rc = route(r, fr->after, (size_t)fr->nafter, e);
    }
    rl_docs_close(d);
    if (!rc && r && *tokens != expect)
        rc = rl_errf(e, RL_EIO, "%s: changed while being read (%llu tokens, %llu on the first pass)", path,
                     (unsigned long long)*tokens, (unsigned long long)expect);
    return rc;
}

typedef struct {
    const args *a;
    const rl_doc_frame *fr;
    const source *src;
    const uint64_t *tokens; /* records: each file's count from the first pass */
} byte_feed;

static int feed_bytes(router *r, void *ctx, rl_err *e) {
    const byte_feed *f = ctx;
    int rc = RL_OK;
    uint64_t n, d;
    for (int i = 0; i < f->a->nfiles && !rc; i++)
        rc = records(f->a) ? records_file(r, f->a, f->fr, f->a->files[i], f->tokens[i], &n, &d, e)
                           : text_file(r, f->fr, f->a->files[i], f->src[i].bytes, e);
    return rc;
}

/* text: every file is one document; records: two passes, the first reads
 * every record (a bad one stops the run before any shard is written) and
 * counts the tokens the split needs. */
static int run_bytes(const args *a, const rl_doc_frame *fr, source *src, uint64_t *total, rl_err *e) {
    uint64_t *tokens = calloc((size_t)a->nfiles, sizeof *tokens);
    if (!tokens) return rl_errf(e, RL_ENOMEM, "out of memory");
    int rc = RL_OK;
    *total = 0;
    for (int i = 0; i < a->nfiles && !rc; i++) {
        if (records(a)) {
            rc = records_file(NULL, a, fr, a->files[i], 0, &tokens[i], &src[i].docs, e);
        } else {
            tokens[i] = src[i].bytes + framing(fr);
            src[i].docs = 1;
        }
        *total += tokens[i];
    }
    byte_feed f = {a, fr, src, tokens};
    if (!rc) rc = write_split(a, *total, 2, feed_bytes, &f, e);
    free(tokens);
    return rc;
}

/* ---- BPE: documents encoded on every core into a file of ids, then split -------- */

#define BATCH_BYTES ((size_t)32 << 20)
#define BATCH_DOCS 8192

typedef struct {
    const args *a;
    rl_bpe *t;
    const rl_doc_frame *fr;
    rl_bpe_enc **enc;
    int nenc;
    FILE *ids; /* the encoded stream, uint32 in host order, unlinked */
    uint64_t tokens;
    char **doc; /* the batch */
    size_t *len, n, bytes;
    rl_bpe_ids *out;
    progress pr;
} bpe_run;

/* Each document's frame (rl_bpe_frame), with --eos for a tokenizer that
 * adds none and has no single special token to take. */
static int bpe_frame(const args *a, const rl_bpe *t, rl_doc_frame *f, rl_err *e) {
    const uint32_t *pre, *post;
    int np, nq;
    rl_bpe_template(t, &pre, &np, &post, &nq);
    if (np + nq > 0 && a->eos)
        return rl_errf(e, RL_EINPUT, "--eos: %s frames documents itself (post_processor); drop --eos", a->tokenizer);
    int64_t id = a->eos ? rl_bpe_token_id(t, a->eos) : -1;
    if (id < 0 && a->eos) return rl_errf(e, RL_EINPUT, "--eos: \"%s\" is not a token of %s", a->eos, a->tokenizer);
    rl_bpe_frame(t, id, f);
    if (f->nbefore + f->nafter == 0)
        return rl_errf(e, RL_EINPUT, "--eos: %s adds no tokens around a document and has not exactly one special "
                                     "token; name the end-of-text token with --eos", a->tokenizer);
    return RL_OK;
}

static int bpe_write(bpe_run *b, const uint32_t *v, size_t n, rl_err *e) {
    if (n == 0) return RL_OK; /* an empty document's ids: no vector at all */
    if (fwrite(v, sizeof *v, n, b->ids) != n)
        return rl_errf(e, RL_EIO, "%s: writing the encoded stream: %s", b->a->out, strerror(errno));
    b->tokens += n;
    return RL_OK;
}

static int bpe_flush(bpe_run *b, rl_err *e) {
    int rc = rl_bpe_encode_many(b->enc, b->nenc, (const char *const *)b->doc, b->len, b->n, false, b->out, e);
    for (size_t i = 0; i < b->n && !rc; i++) {
        if (!(rc = bpe_write(b, b->fr->before, (size_t)b->fr->nbefore, e)) &&
            !(rc = bpe_write(b, b->out[i].v, b->out[i].n, e)))
            rc = bpe_write(b, b->fr->after, (size_t)b->fr->nafter, e);
    }
    for (size_t i = 0; i < b->n; i++) free(b->doc[i]);
    b->pr.docs += b->n;
    b->n = b->bytes = 0;
    progress_show(&b->pr, false);
    return rc;
}

/* Takes the document (malloc'ed) into the batch. */
static int bpe_add(bpe_run *b, char *text, size_t len, rl_err *e) {
    b->doc[b->n] = text, b->len[b->n++] = len, b->bytes += len;
    return b->n == BATCH_DOCS || b->bytes >= BATCH_BYTES ? bpe_flush(b, e) : RL_OK;
}

static int bpe_file(bpe_run *b, int i, source *src, rl_err *e) {
    const char *path = b->a->files[i];
    uint64_t done0 = b->pr.done;
    if (!records(b->a)) {
        char *text;
        size_t len;
        int rc = rl_read_file(path, &text, &len, e);
        if (rc) return rc;
        src[i].docs = 1;
        b->pr.done += len;
        return bpe_add(b, text, len, e);
    }
    rl_docs *d;
    int rc = docs_open(b->a, path, &d, e);
    const char *text;
    size_t len;
    while (!rc && !(rc = rl_docs_next(d, &text, &len, e)) && text) {
        char *copy = malloc(len + 1);
        if (!copy) rc = rl_errf(e, RL_ENOMEM, "%s: document %llu: out of memory", path,
                                (unsigned long long)src[i].docs + 1);
        else memcpy(copy, text, len), copy[len] = 0, rc = bpe_add(b, copy, len, e);
        src[i].docs++;
        b->pr.done = done0 + rl_docs_done(d, src[i].bytes);
    }
    rl_docs_close(d);
    return rc;
}

static int feed_ids(router *r, void *ctx, rl_err *e) {
    bpe_run *b = ctx;
    static uint32_t buf[1 << 18];
    rewind(b->ids);
    uint64_t left = b->tokens;
    int rc = RL_OK;
    while (left > 0 && !rc) {
        size_t k = left < sizeof buf / sizeof buf[0] ? (size_t)left : sizeof buf / sizeof buf[0];
        if (fread(buf, sizeof *buf, k, b->ids) != k)
            return rl_errf(e, RL_EIO, "%s: reading the encoded stream back: %s", b->a->out, strerror(errno));
        rc = route(r, buf, k, e);
        left -= k;
    }
    return rc;
}

static int run_bpe(const args *a, rl_bpe *t, const rl_doc_frame *fr, source *src, uint64_t *total, rl_err *e) {
    bpe_run b = {.a = a, .t = t, .fr = fr, .nenc = omp_get_max_threads(), .pr = {.t0 = rl_now(), .last = rl_now(), .tty = isatty(2)}};
    for (int i = 0; i < a->nfiles; i++) b.pr.total += src[i].bytes;
    b.doc = calloc(BATCH_DOCS, sizeof *b.doc);
    b.len = calloc(BATCH_DOCS, sizeof *b.len);
    b.out = calloc(BATCH_DOCS, sizeof *b.out);
    b.enc = calloc((size_t)b.nenc, sizeof *b.enc);
    int rc = !b.doc || !b.len || !b.out || !b.enc ? rl_errf(e, RL_ENOMEM, "out of memory") : RL_OK;
    for (int i = 0; i < b.nenc && !rc; i++) rc = rl_bpe_enc_new(t, &b.enc[i], e);
    if (!rc && !(rc = rl_mkdirs(a->out, 0755, e))) {
        /* beside the shards (the same filesystem), gone however the run ends */
        char path[4200];
        snprintf(path, sizeof path, "%s/.prepare-ids-XXXXXX", a->out);
        int fd = mkstemp(path);
        if (fd < 0 || !(b.ids = fdopen(fd, "w+b")))
            rc = rl_errf(e, RL_EIO, "%s: cannot create a temporary file: %s", a->out, strerror(errno));
        if (fd >= 0) unlink(path);
        if (fd >= 0 && !b.ids) close(fd);
    }
    for (int i = 0; i < a->nfiles && !rc; i++) rc = bpe_file(&b, i, src, e);
    if (!rc && b.n) rc = bpe_flush(&b, e);
    if (!rc) progress_show(&b.pr, true);
    if (!rc && fflush(b.ids) != 0) rc = rl_errf(e, RL_EIO, "%s: writing the encoded stream: %s", a->out, strerror(errno));
    *total = b.tokens;
    if (!rc) rc = write_split(a, b.tokens, rl_bpe_vocab_size(t) > 65536 ? 4 : 2, feed_ids, &b, e);
    for (size_t i = 0; i < b.n; i++) free(b.doc[i]);
    for (int i = 0; i < BATCH_DOCS && b.out; i++) rl_bpe_ids_free(&b.out[i]);
    for (int i = 0; i < b.nenc && b.enc; i++) rl_bpe_enc_free(b.enc[i]);
    if (b.ids) fclose(b.ids);
    free(b.doc), free(b.len), free(b.out), free(b.enc);
    return rc;
}

/* ---- dataset.json ------------------------------------------------------------------ */

/* What the shards hold and where they came from: what a trainer checks its
 * tokenizer against. */
static int write_dataset_json(const args *a, const rl_bpe *t, const rl_doc_frame *fr, const source *src, uint64_t tokens,
                              rl_err *e) {
    cJSON *d = cJSON_CreateObject(), *tk = cJSON_AddObjectToObject(d, "tokenizer"), *s = cJSON_AddArrayToObject(d, "sources");
    if (t) {
        cJSON_AddStringToObject(tk, "type", "bpe");
        cJSON_AddStringToObject(tk, "file", a->tokenizer);
        cJSON_AddStringToObject(tk, "sha256", rl_bpe_sha256(t));
        cJSON_AddNumberToObject(tk, "vocab_size", rl_bpe_vocab_size(t));
    } else {
        cJSON_AddStringToObject(tk, "type", "byte-level");
        cJSON_AddNumberToObject(tk, "vocab_size", RL_TOK_VOCAB);
    }
    cJSON_AddNumberToObject(d, "token_bytes", t && rl_bpe_vocab_size(t) > 65536 ? 4 : 2);
    cJSON *fb = cJSON_AddArrayToObject(d, "before_document"), *fa = cJSON_AddArrayToObject(d, "after_document");
    for (int i = 0; i < fr->nbefore; i++) cJSON_AddItemToArray(fb, cJSON_CreateNumber(fr->before[i]));
    for (int i = 0; i < fr->nafter; i++) cJSON_AddItemToArray(fa, cJSON_CreateNumber(fr->after[i]));
    if (fr->eos >= 0) cJSON_AddNumberToObject(d, "eos_id", (double)fr->eos);
    else cJSON_AddNullToObject(d, "eos_id");
    cJSON_AddNumberToObject(d, "tokens", (double)tokens);
    cJSON_AddNumberToObject(d, "val_fraction", a->val_fraction);
    for (int i = 0; i < a->nfiles; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", a->files[i]);
        cJSON_AddNumberToObject(o, "bytes", (double)src[i].bytes);
        cJSON_AddNumberToObject(o, "documents", (double)src[i].docs);
        cJSON_AddItemToArray(s, o);
    }
    char *json = cJSON_Print(d), path[4200];
    cJSON_Delete(d);
    if (!json) return rl_errf(e, RL_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/dataset.json", a->out);
    int rc = rl_write_file_atomic(path, json, strlen(json), e);
    free(json);
    return rc;
}

static int run_text(const args *a, rl_err *e) {
    source *src = calloc((size_t)a->nfiles, sizeof *src);
    if (!src) return rl_errf(e, RL_ENOMEM, "out of memory");
    rl_bpe *t = NULL;
    rl_doc_frame fr; /* byte-level unless a tokenizer is given */
    rl_eos_frame(RL_TOK_EOT, &fr);
    uint64_t total = 0;
    int rc = stat_inputs(a, src, e);
    if (!rc && a->tokenizer && !(rc = rl_bpe_load(a->tokenizer, &t, e))) rc = bpe_frame(a, t, &fr, e);
    if (!rc) rc = t ? run_bpe(a, t, &fr, src, &total, e) : run_bytes(a, &fr, src, &total, e);
    if (!rc) rc = write_dataset_json(a, t, &fr, src, total, e);
    rl_bpe_free(t);
    free(src);
    return rc;
}

/* ---- decode ------------------------------------------------------------------------ */

static int run_decode(const args *a, rl_err *e) {
    rl_bpe *t = NULL;
    rl_dataset *d = NULL;
    int rc = a->tokenizer ? rl_bpe_load(a->tokenizer, &t, e) : RL_OK;
    char pattern[16384] = "";
    for (int i = 0, o = 0; i < a->nfiles && !rc; i++) {
        o += snprintf(pattern + o, sizeof pattern - (size_t)o, "%s%s", i ? "," : "", a->files[i]);
        if (o >= (int)sizeof pattern) rc = rl_errf(e, RL_EINPUT, "decode: the FILEs' names pass %zu bytes: give a glob", sizeof pattern);
    }
    if (!rc) rc = rl_dataset_open(pattern, t ? (int)rl_bpe_vocab_size(t) : RL_TOK_VOCAB, &d, e);
    static int32_t tok[1 << 16];
    static uint32_t ids[1 << 16];
    char *text = NULL;
    size_t len, cap = 0;
    uint64_t n = rc ? 0 : rl_dataset_tokens(d);
    for (uint64_t off = 0; off < n && !rc; off += sizeof tok / sizeof tok[0]) {
        size_t k = n - off < sizeof tok / sizeof tok[0] ? (size_t)(n - off) : sizeof tok / sizeof tok[0];
        if ((rc = rl_dataset_read(d, off, k, tok, e))) break;
        len = 0;
        if (t) {
            for (size_t i = 0; i < k; i++) ids[i] = (uint32_t)tok[i];
            rc = rl_bpe_decode(t, ids, k, &text, &len, &cap, e);
        } else {
            if (cap < k + 1 && (free(text), !(text = malloc(cap = k + 1)))) rc = rl_errf(e, RL_ENOMEM, "out of memory");
            else len = rl_tok_decode(tok, k, text, k + 1);
        }
        if (!rc && fwrite(text, 1, len, stdout) != len) rc = rl_errf(e, RL_EIO, "stdout: %s", strerror(errno));
    }
    if (!rc && fflush(stdout) != 0) rc = rl_errf(e, RL_EIO, "stdout: %s", strerror(errno));
    free(text);
    rl_dataset_close(d);
    rl_bpe_free(t);
    return rc;
}

/* ---- synthetic ------------------------------------------------------------- */

static int write_random(const char *dir, const char *prefix, uint64_t n, uint64_t vocab,
                        uint64_t shard_tokens, rl_rng *rng, rl_err *e) {
    rl_shard_writer *w;
    /* llm.c's uint32 shards only where uint16 cannot hold the ids */
    int rc = rl_shard_writer_open(dir, prefix, shard_tokens, vocab > 65536 ? 4 : 2, &w, e);
    if (rc) return rc;
    static uint32_t buf[1 << 16];
    /* Multiply-shift maps 32 random bits onto [0, vocab); the bias is below
     * vocab / 2^32, irrelevant for throughput data. */
    while (n > 0 && !rc) {
        size_t k = n < sizeof buf / sizeof buf[0] ? (size_t)n : sizeof buf / sizeof buf[0];
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint32_t)(((rl_rng_u64(rng) >> 32) * vocab) >> 32);
        rc = rl_shard_writer_add32(w, buf, k, e);
        n -= k;
    }
    if (rc) {
        rl_shard_writer_abort(w);
        return rc;
    }
    return rl_shard_writer_close(w, NULL, NULL, e);
}

static int run_synthetic(const args *a, rl_err *e) {
    rl_rng rng;
    rl_rng_seed(&rng, a->seed);
    int rc = write_random(a->out, "train", a->tokens, a->vocab, a->shard_tokens, &rng, e);
    if (!rc)
        rc = write_random(a->out, "val", (a->tokens + 19) / 20, a->vocab, a->shard_tokens, &rng,
                          e);
    return rc;
}

/* ---- report ----------------------------------------------------------------- */

/* Re-opens what was written: the counts in the final log line are those a
 * trainer will see, and a broken write fails here rather than in training. */
static int summarize(const char *dir, const char *prefix, char *json, size_t n, rl_err *e) {
    char pattern[4200], esc[8400];
    snprintf(pattern, sizeof pattern, "%s/%s_*.bin", dir, prefix);
    rl_dataset *d;
    int rc = rl_dataset_open(pattern, 65536, &d, e);
    if (rc) return rc;
    snprintf(json, n, "{\"files\":\"%s\",\"shards\":%d,\"tokens\":%llu}",
             rl_json_escape(esc, sizeof esc, pattern), rl_dataset_nshards(d),
             (unsigned long long)rl_dataset_tokens(d));
    rl_dataset_close(d);
    return RL_OK;
}

/* The Parquet reader (make parquet) lives in ../lib/ringleader beside
 * this binary's directory: bin/ in a checkout, /usr/local/bin in the image. */
static void find_parquet_lib(args *a) {
    static char path[4200];
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) n = 0;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(path, sizeof path, "%s/../lib/ringleader/libringleader-parquet.so", slash ? self : ".");
    a->parquet_lib = path;
}

int main(int argc, char **argv) {
    rl_log_init(-1);
    args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc) {
        free(a.files);
        return prc < 0 ? 0 : prc;
    }
    find_parquet_lib(&a);
    double t0 = rl_now();
    rl_err e = {0};
    int rc;
    bool has_val = true;
    if (!strcmp(a.mode, "decode")) {
        rc = run_decode(&a, &e);
        free(a.files);
        if (rc) fprintf(stderr, PROG ": %s\n", e.msg);
        return rl_err_exit_status(rc);
    }
    if (!strcmp(a.mode, "text") || !strcmp(a.mode, "jsonl") || !strcmp(a.mode, "parquet")) {
        rc = run_text(&a, &e);
        has_val = a.val_fraction > 0;
    } else if (!strcmp(a.mode, "arith")) {
        rl_arith_opts o = {.digits = (int)a.digits,
                           .holdout = a.holdout,
                           .seed = a.seed,
                           .train_tokens = a.tokens};
        rc = rl_arith_generate(&o, a.out, &e);
    } else {
        rc = run_synthetic(&a, &e);
    }
    char train[8700] = "null", val[8700] = "null";
    if (!rc) rc = summarize(a.out, "train", train, sizeof train, &e);
    if (!rc && has_val) rc = summarize(a.out, "val", val, sizeof val, &e);
    free(a.files);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", e.msg);
        return rl_err_exit_status(rc);
    }
    char esc[8400];
    rl_log(RL_LOG_INFO, "prepare_done", "\"mode\":\"%s\",\"out\":\"%s\",\"train\":%s,\"val\":%s,"
           "\"seconds\":%.2f",
           a.mode, rl_json_escape(esc, sizeof esc, a.out), train, val, rl_now() - t0);
    return 0;
}
