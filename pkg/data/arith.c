/* The arithmetic corpus: "a+b=c\n" lines, byte-tokenized. It is the default
 * training task because it is tiny, needs no download, and has a sharp
 * generalisation test: the held-out pairs never occur in train, so a model
 * that gets them right has learned addition rather than a lookup table.
 *
 * Everything is a pure function of the options: which pairs are held out
 * (a keyed hash per pair), the train stream (an rl_rng seeded from `seed`)
 * and the val order (a second stream derived from `seed`). */
#include "data/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Shards are split at this many tokens, as llm.c's preprocessors do; small
 * enough to copy and checksum comfortably, large enough to keep file counts
 * low. */
#define ARITH_SHARD_TOKENS 100000000ull

static const long pow10_tab[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};

bool rl_arith_is_heldout(const rl_arith_opts *o, long a, long b) {
    if (o->digits < 1 || o->digits > 4) return false;
    /* Unsigned arithmetic: out-of-range arguments wrap instead of
     * overflowing a signed long. */
    uint64_t key = (uint64_t)a * (uint64_t)pow10_tab[o->digits] + (uint64_t)b;
    uint64_t h = rl_hash64(o->seed ^ key);
    return (double)(h >> 11) * 0x1.0p-53 < o->holdout;
}

/* Unbiased draw in [0, n): reject the few values that would make the
 * modulo favour small results. */
static uint64_t uniform_below(rl_rng *r, uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = rl_rng_u64(r);
        if (x >= threshold) return x % n;
    }
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
} u32vec;

static int u32vec_push(u32vec *a, uint32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        uint32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Lines are batched into a token buffer so the writer sees large appends. */
typedef struct {
    rl_shard_writer *w;
    uint16_t buf[1 << 15];
    size_t n;
    uint64_t total;
} line_out;

static int emit_line(line_out *lo, const rl_arith_opts *o, uint32_t key, rl_err *e) {
    long base = pow10_tab[o->digits];
    long a = (long)key / base, b = (long)key % base;
    char line[48];
    int len = snprintf(line, sizeof line, "%ld+%ld=%ld\n", a, b, a + b);
    if (lo->n + (size_t)len > sizeof lo->buf / sizeof lo->buf[0]) {
        int rc = rl_shard_writer_add(lo->w, lo->buf, lo->n, e);
        if (rc) return rc;
        lo->n = 0;
    }
    rl_tok_encode((const unsigned char *)line, (size_t)len, lo->buf + lo->n);
    lo->n += (size_t)len;
    lo->total += (uint64_t)len;
    return RL_OK;
}

static int finish(line_out *lo, rl_err *e) {
    int rc = rl_shard_writer_add(lo->w, lo->buf, lo->n, e);
    lo->n = 0;
    rl_shard_writer *w = lo->w;
    lo->w = NULL;
    if (rc) {
        rl_shard_writer_abort(w);
        return rc;
    }
    return rl_shard_writer_close(w, NULL, NULL, e);
}

static int check_opts(const rl_arith_opts *o, rl_err *e) {
    if (o->digits < 1 || o->digits > 4)
        return rl_errf(e, RL_EINPUT, "arith option digits: must be in [1, 4], got %d",
                       o->digits);
    if (!(o->holdout > 0 && o->holdout < 1))
        return rl_errf(e, RL_EINPUT, "arith option holdout: must be in (0, 1), got %g",
                       o->holdout);
    if (o->train_tokens < 1)
        return rl_errf(e, RL_EINPUT, "arith option train_tokens: must be >= 1");
    return RL_OK;
}

/* Train: pairs drawn uniformly (with replacement) from the non-held-out
 * set, whole lines only, until at least train_tokens tokens are written, so
 * the result exceeds train_tokens by less than one line (at most 15 tokens
 * at 4 digits). When most pairs are held out the train keys are listed and
 * drawn from directly; otherwise rejection sampling needs under two tries a
 * line on average and no memory. */
static int write_train(const rl_arith_opts *o, const char *dir, uint64_t npairs,
                       uint64_t ntrain, rl_err *e) {
    uint32_t *keys = NULL;
    if (2 * ntrain < npairs) {
        keys = malloc(ntrain * sizeof *keys);
        if (!keys) return rl_errf(e, RL_ENOMEM, "arith: out of memory listing train pairs");
        size_t k = 0;
        for (uint64_t key = 0; key < npairs; key++) {
            long base = pow10_tab[o->digits];
            if (!rl_arith_is_heldout(o, (long)key / base, (long)key % base))
                keys[k++] = (uint32_t)key;
        }
    }
    line_out *lo = calloc(1, sizeof *lo);
    if (!lo) {
        free(keys);
        return rl_errf(e, RL_ENOMEM, "arith: out of memory");
    }
    int rc = rl_shard_writer_open(dir, "train", ARITH_SHARD_TOKENS, 2, &lo->w, e);
    rl_rng rng;
    rl_rng_seed(&rng, o->seed);
    long base = pow10_tab[o->digits];
    while (!rc && lo->total < o->train_tokens) {
        uint32_t key;
        if (keys) {
            key = keys[uniform_below(&rng, ntrain)];
        } else {
            do {
                key = (uint32_t)uniform_below(&rng, npairs);
            } while (rl_arith_is_heldout(o, (long)key / base, (long)key % base));
        }
        rc = emit_line(lo, o, key, e);
    }
    if (!rc) {
        rc = finish(lo, e);
    } else {
        rl_shard_writer_abort(lo->w);
    }
    free(lo);
    free(keys);
    return rc;
}

/* Val: every held-out pair exactly once, in an order shuffled by a stream
 * independent of train's, so a val prefix is a fair sample. */
static int write_val(const rl_arith_opts *o, const char *dir, u32vec *held, rl_err *e) {
    rl_rng rng;
    rl_rng_seed(&rng, rl_hash64(o->seed ^ 0x76616c5f6f726465ull)); /* "val_orde" */
    for (size_t i = held->n; i > 1; i--) {
        size_t j = (size_t)uniform_below(&rng, i);
        uint32_t t = held->v[i - 1];
        held->v[i - 1] = held->v[j];
        held->v[j] = t;
    }
    line_out *lo = calloc(1, sizeof *lo);
    if (!lo) return rl_errf(e, RL_ENOMEM, "arith: out of memory");
    int rc = rl_shard_writer_open(dir, "val", ARITH_SHARD_TOKENS, 2, &lo->w, e);
    for (size_t i = 0; !rc && i < held->n; i++) rc = emit_line(lo, o, held->v[i], e);
    if (!rc) {
        rc = finish(lo, e);
    } else {
        rl_shard_writer_abort(lo->w);
    }
    free(lo);
    return rc;
}

int rl_arith_generate(const rl_arith_opts *o, const char *dir, rl_err *e) {
    int rc = check_opts(o, e);
    if (rc) return rc;
    long base = pow10_tab[o->digits];
    uint64_t npairs = (uint64_t)base * (uint64_t)base;
    u32vec held = {0};
    for (uint64_t key = 0; key < npairs; key++) {
        if (rl_arith_is_heldout(o, (long)key / base, (long)key % base) &&
            u32vec_push(&held, (uint32_t)key) != 0) {
            free(held.v);
            return rl_errf(e, RL_ENOMEM, "arith: out of memory listing held-out pairs");
        }
    }
    uint64_t ntrain = npairs - held.n;
    if (held.n == 0)
        rc = rl_errf(e, RL_EINPUT,
                     "arith option holdout: %g holds out none of the %llu pairs at digits=%d; "
                     "raise it or use more digits",
                     o->holdout, (unsigned long long)npairs, o->digits);
    else if (ntrain == 0)
        rc = rl_errf(e, RL_EINPUT,
                     "arith option holdout: %g holds out all %llu pairs at digits=%d; lower it",
                     o->holdout, (unsigned long long)npairs, o->digits);
    if (!rc) rc = write_train(o, dir, npairs, ntrain, e);
    if (!rc) rc = write_val(o, dir, &held, e);
    free(held.v);
    return rc;
}
