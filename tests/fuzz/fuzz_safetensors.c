/* libFuzzer target: the safetensors header reader (checkpoint files come
 * from storage we do not control). Any input must either parse into tensors
 * that tile the data exactly, or fail with RL_EINPUT and a one-line message
 * naming the file -- never crash, leak, hang or read out of bounds. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

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
    rl_ckpt_st_free(st);
    return 0;
}
