/* ringleader-prepare: turn text into token shards, or generate the synthetic
 * corpora (arithmetic, uniform random tokens). A thin layer over pkg/data:
 * parse flags, call the library, report what was written. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/flags.h"
#include "data/data.h"
#include "util/util.h"

#define PROG "ringleader-prepare"
#define DEFAULT_SHARD_TOKENS 100000000ull

static const char usage[] =
    "usage: " PROG " <mode> --out DIR [options]\n"
    "\n"
    "Writes llm.c-format token shards: DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin.\n"
    "\n"
    "modes:\n"
    "  text FILE...      byte-level tokens (0..255), an end-of-text token (256) before\n"
    "                    each file; the last --val-fraction of the stream becomes val\n"
    "      --val-fraction F   fraction of tokens for val, in [0, 1) (default 0.05;\n"
    "                         0 writes no val split)\n"
    "      --shard-tokens N   tokens per shard (default 100000000)\n"
    "  jsonl FILE...     JSON Lines (one object per line, as datasets' to_json writes):\n"
    "                    each document's text, byte-level, after an end-of-text token;\n"
    "                    every line is read before any shard is written\n"
    "      --field NAME       the string field holding the text (default \"text\")\n"
    "      --val-fraction F, --shard-tokens N   as for text\n"
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
    "Ends with one JSON log line (event prepare_done) naming what was written.\n";

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
    bool jsonl = !strcmp(a->mode, "jsonl"), text = jsonl || !strcmp(a->mode, "text"),
         arith = !strcmp(a->mode, "arith"), synth = !strcmp(a->mode, "synthetic");
    if (!text && !arith && !synth) {
        fprintf(stderr, PROG ": %s: unknown mode (text, jsonl, arith or synthetic; see --help)\n",
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
    rl_flag fl[9];
    int n = 0;
    fl[n++] = (rl_flag){"--out", NULL, RL_FLAG_STR, &out, 0, 0};
    if (text) fl[n++] = (rl_flag){"--val-fraction", NULL, RL_FLAG_STR, &valf, 0, 0};
    if (text || synth) fl[n++] = (rl_flag){"--shard-tokens", NULL, RL_FLAG_STR, &shard, 0, 0};
    if (arith) fl[n++] = (rl_flag){"--digits", NULL, RL_FLAG_STR, &digits, 0, 0};
    if (arith) fl[n++] = (rl_flag){"--holdout", NULL, RL_FLAG_STR, &holdout, 0, 0};
    if (arith || synth) fl[n++] = (rl_flag){"--seed", NULL, RL_FLAG_STR, &seed, 0, 0};
    if (arith || synth) fl[n++] = (rl_flag){"--tokens", NULL, RL_FLAG_STR, &tokens, 0, 0};
    if (synth) fl[n++] = (rl_flag){"--vocab", NULL, RL_FLAG_STR, &vocab, 0, 0};
    if (jsonl) fl[n++] = (rl_flag){"--field", NULL, RL_FLAG_STR, &field, 0, 0};
    /* only text takes files */
    int rc = rl_flags_parse(PROG, argc, argv, 2, fl, n, text ? a->files : NULL, argc, &a->nfiles);
    if (rc) return rc;
    if (out && !*out) return bad_flag("--out", "must not be empty");
    if (field && !*field) return bad_flag("--field", "must not be empty");
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
    if (!a->out) return bad_flag("--out", "required");
    if (text && a->nfiles == 0) return bad_flag(a->mode, "needs at least one input FILE");
    if (!a->tokens_set) a->tokens = arith ? 2000000 : 10000000;
    return 0;
}

/* ---- text ------------------------------------------------------------------- */

/* Sends the first `ntrain` tokens of the stream to train, the rest to val. */
typedef struct {
    rl_shard_writer *train, *val;
    uint64_t ntrain, seen;
} router;

static int route(router *r, const uint16_t *tok, size_t n, rl_err *e) {
    if (r->seen < r->ntrain) {
        uint64_t room = r->ntrain - r->seen;
        size_t k = (uint64_t)n < room ? n : (size_t)room;
        int rc = rl_shard_writer_add(r->train, tok, k, e);
        if (rc) return rc;
        r->seen += k;
        tok += k;
        n -= k;
    }
    if (n == 0) return RL_OK;
    r->seen += n;
    return rl_shard_writer_add(r->val, tok, n, e);
}

/* Bytes as byte-level tokens, routed. */
static int route_bytes(router *r, const unsigned char *b, size_t n, rl_err *e) {
    static uint16_t tok[1 << 20];
    int rc = RL_OK;
    for (size_t off = 0, k; off < n && !rc; off += k) {
        k = n - off < sizeof tok / sizeof tok[0] ? n - off : sizeof tok / sizeof tok[0];
        rl_tok_encode(b + off, k, tok);
        rc = route(r, tok, k, e);
    }
    return rc;
}

static int text_file(router *r, const char *path, uint64_t expect, rl_err *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rl_errf(e, RL_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    static unsigned char buf[1 << 20];
    const uint16_t eot = RL_TOK_EOT;
    int rc = route(r, &eot, 1, e);
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
    if (!rc && got != expect)
        rc = rl_errf(e, RL_EIO, "%s: changed size while being read (%llu bytes, expected %llu)",
                     path, (unsigned long long)got, (unsigned long long)expect);
    return rc;
}

/* Writes the stream `feed` routes (total tokens, known up front) to the
 * shards: the last --val-fraction of it to val. */
typedef int (*feed_fn)(router *r, const args *a, const uint64_t *sizes, rl_err *e);
static int write_split(const args *a, uint64_t total, feed_fn feed, const uint64_t *sizes, rl_err *e) {
    uint64_t nval = (uint64_t)floor((double)total * a->val_fraction);
    if (a->val_fraction > 0 && nval == 0)
        return rl_errf(e, RL_EINPUT,
                       "--val-fraction: %g of %llu tokens is no token at all; give more text or "
                       "a larger fraction (0 skips val)",
                       a->val_fraction, (unsigned long long)total);
    router r = {.ntrain = total - nval};
    int rc = rl_shard_writer_open(a->out, "train", a->shard_tokens, 2, &r.train, e);
    if (!rc && nval > 0) rc = rl_shard_writer_open(a->out, "val", a->shard_tokens, 2, &r.val, e);
    if (!rc) rc = feed(&r, a, sizes, e);
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

static int feed_text(router *r, const args *a, const uint64_t *sizes, rl_err *e) {
    int rc = RL_OK;
    for (int i = 0; i < a->nfiles && !rc; i++) rc = text_file(r, a->files[i], sizes[i], e);
    return rc;
}

static int run_text(const args *a, rl_err *e) {
    uint64_t *sizes = calloc((size_t)a->nfiles, sizeof *sizes);
    if (!sizes) return rl_errf(e, RL_ENOMEM, "out of memory");
    uint64_t total = 0;
    int rc = RL_OK;
    for (int i = 0; i < a->nfiles && !rc; i++) {
        struct stat st;
        if (stat(a->files[i], &st) != 0)
            rc = rl_errf(e, RL_EINPUT, "%s: cannot open: %s", a->files[i], strerror(errno));
        else if (!S_ISREG(st.st_mode))
            rc = rl_errf(e, RL_EINPUT, "%s: not a regular file", a->files[i]);
        else if (access(a->files[i], R_OK) != 0)
            rc = rl_errf(e, RL_EINPUT, "%s: cannot read: %s", a->files[i], strerror(errno));
        else {
            sizes[i] = (uint64_t)st.st_size;
            total += sizes[i] + 1; /* + its end-of-text token */
        }
    }
    if (!rc) rc = write_split(a, total, feed_text, sizes, e);
    free(sizes);
    return rc;
}

/* ---- jsonl ------------------------------------------------------------------- */

/* One file's documents, each an end-of-text token then its bytes: routed
 * (r non-NULL) or only counted. *tokens is the file's token count; with
 * expect (the first pass's count) a file that changed in between fails. */
static int jsonl_file(router *r, const args *a, const char *path, uint64_t expect, uint64_t *tokens, rl_err *e) {
    rl_jsonl *j;
    int rc = rl_jsonl_open(path, a->field, 0, &j, e);
    const uint16_t eot = RL_TOK_EOT;
    const char *text;
    size_t len;
    *tokens = 0;
    while (!rc && !(rc = rl_jsonl_next(j, &text, &len, e)) && text) {
        *tokens += len + 1;
        if (r && !(rc = route(r, &eot, 1, e))) rc = route_bytes(r, (const unsigned char *)text, len, e);
    }
    rl_jsonl_close(j);
    if (!rc && r && *tokens != expect)
        rc = rl_errf(e, RL_EIO, "%s: changed while being read (%llu tokens, %llu on the first pass)", path,
                     (unsigned long long)*tokens, (unsigned long long)expect);
    return rc;
}

static int feed_jsonl(router *r, const args *a, const uint64_t *sizes, rl_err *e) {
    int rc = RL_OK;
    uint64_t n;
    for (int i = 0; i < a->nfiles && !rc; i++) rc = jsonl_file(r, a, a->files[i], sizes[i], &n, e);
    return rc;
}

/* Two passes: the first reads every line (a bad one stops the run before
 * any shard is written) and counts the tokens the split needs. */
static int run_jsonl(const args *a, rl_err *e) {
    uint64_t *sizes = calloc((size_t)a->nfiles, sizeof *sizes), total = 0;
    if (!sizes) return rl_errf(e, RL_ENOMEM, "out of memory");
    int rc = RL_OK;
    for (int i = 0; i < a->nfiles && !rc; i++) {
        rc = jsonl_file(NULL, a, a->files[i], 0, &sizes[i], e);
        total += sizes[i];
    }
    if (!rc) rc = write_split(a, total, feed_jsonl, sizes, e);
    free(sizes);
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

int main(int argc, char **argv) {
    rl_log_init(-1);
    args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc) {
        free(a.files);
        return prc < 0 ? 0 : prc;
    }
    double t0 = rl_now();
    rl_err e = {0};
    int rc;
    bool has_val = true;
    if (!strcmp(a.mode, "text") || !strcmp(a.mode, "jsonl")) {
        rc = !strcmp(a.mode, "text") ? run_text(&a, &e) : run_jsonl(&a, &e);
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
