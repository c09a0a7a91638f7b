/* libFuzzer target: the safetensors header reader (checkpoint files come
 * from storage we do not control), and on what parses, the decoding of an
 * optimizer shard's ranges. Any input must either parse into tensors that
 * tile the data exactly, or fail with RL_EINPUT and a one-line message
 * naming the file -- never crash, leak, hang or read out of bounds; the
 * runs of a shard lie inside the model and the file and add up to its
 * moments. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

/* a shard's runs, for a model of n elements */
static void shard_runs(const unsigned char *data, const rl_ckpt_st *st, size_t n) {
    const rl_ckpt_st_tensor *r = rl_ckpt_st_find(st, "ranges"), *m = rl_ckpt_st_find(st, "exp_avg");
    rl_ckpt_run *runs;
    size_t nr, total = 0;
    rl_err e = {0};
    int rc = rl_ckpt_shard_runs(st, r ? data + st->data_start + r->begin : NULL, r ? r->end - r->begin : 0, n,
                                "fuzz.safetensors", &runs, &nr, &e);
    if (rc != RL_OK && rc != RL_EINPUT && rc != RL_ENOMEM) abort();
    if (rc != RL_OK) {
        if (runs || strchr(e.msg, '\n') || strncmp(e.msg, "fuzz.safetensors", 16) != 0) abort();
        return;
    }
    for (size_t i = 0; i < nr; i++) {
        if (runs[i].off > n || runs[i].len > n - runs[i].off) abort();
        if (runs[i].m_at + runs[i].len * 4 > st->data_start + st->data_len) abort();
        total += runs[i].len;
    }
    if (!m || total != (size_t)m->shape[0]) abort();
    free(runs);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    rl_ckpt_st *st = NULL;
    rl_err e = {0};
    int max = (int)(size % 5) * 2; /* 0: no cap; else the early count of the keys */
    int rc = rl_ckpt_st_parse(data, size, size, max, "fuzz.safetensors", &st, &e);
    if (rc != RL_OK && rc != RL_EINPUT && rc != RL_ENOMEM) abort();
    if (rc != RL_OK) {
        if (st || strchr(e.msg, '\n') || strncmp(e.msg, "fuzz.safetensors", 16) != 0) abort();
        return 0;
    }
    /* what the reader promises: contiguous from 0 to the end of the file */
    uint64_t at = 0;
    for (int i = 0; i < st->n; i++) {
        if (st->t[i].begin != at || st->t[i].end < st->t[i].begin) abort();
        at = st->t[i].end;
        if (rl_ckpt_st_find(st, st->t[i].name) == NULL) abort();
    }
    if (at != st->data_len || st->data_start + st->data_len != size) abort();
    if (max > 0 && st->n > max) abort();
    (void)rl_ckpt_st_meta(st, "format");
    shard_runs(data, st, size % 97 * 1000);
    rl_ckpt_st_free(st);
    return 0;
}
