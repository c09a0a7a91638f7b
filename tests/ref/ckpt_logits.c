/* ckpt_logits: the C half of tests/ref/check_ckpt.py.
 *
 * Loads the newest checkpoint under a URI the way a resuming trainer does
 * (rl_ckpt_load_latest: manifest, sizes, hashes, tensor table), builds our
 * model from it and writes its logits on fixed random tokens, so the
 * Python side can compare them with transformers' LlamaForCausalLM loaded
 * from the same checkpoint directory.
 *
 * usage: ckpt_logits CKPT_URI OUTDIR [--batch 2 --seq 16 --seed 3]
 * Writes OUTDIR/meta.json (batch, seq, vocab, step, dir), tokens.i32 and
 * logits.f32 (raw little-endian). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "model/model.h"
#include "util/util.h"

static int die(const char *what, const rl_err *e) {
    fprintf(stderr, "ckpt_logits: %s: %s\n", what, e ? e->msg : "");
    return 1;
}

/* The model config the latest checkpoint was written with. */
static int model_config(rl_ckpt_store *s, long long *step, rl_model_config *mc, rl_err *e) {
    char *t;
    size_t n;
    int64_t eos;
    int rc = rl_ckpt_get(s, "latest", 0, 64, (void **)&t, &n, e);
    if (rc) return rc;
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == ' ')) n--;
    *step = rl_ckpt_parse_step_name(t, n);
    free(t);
    if (*step < 0) return rl_errf(e, RL_EINPUT, "%s/latest does not name a step", s->uri);
    return rl_ckpt_model_config(s, *step, mc, &eos, e);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: ckpt_logits CKPT_URI OUTDIR [--batch B --seq T --seed S]\n");
        return 2;
    }
    int B = 2, T = 16;
    uint64_t seed = 3;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "ckpt_logits: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    rl_log_init(-1);
    rl_err e = {0};
    rl_ckpt_store *s;
    if (rl_ckpt_store_open_read(argv[1], &s, &e)) return die(argv[1], &e);
    rl_model_config mc;
    long long latest;
    if (model_config(s, &latest, &mc, &e)) return die("config", &e);
    if (T > mc.max_position_embeddings || B < 1 || T < 1) return die("--seq/--batch out of range", NULL);
    rl_model m;
    if (rl_model_create(&m, &mc, B, T, &e)) return die("model", &e);
    rl_ckpt_loaded ld;
    if (rl_ckpt_load_latest(s, &mc, m.lay.total, m.params, NULL, NULL, &ld, &e)) return die("load", &e);
    if (!ld.found) return die("no checkpoint", NULL);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T);
    rl_rng r;
    rl_rng_seed(&r, seed);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(rl_rng_u64(&r) % (uint64_t)mc.vocab_size);
    if (rl_model_forward(&m, tok, NULL, B, T, NULL, &e)) return die("forward", &e);
    char p[4096];
    snprintf(p, sizeof p, "%s/tokens.i32", argv[2]);
    if (rl_write_file_atomic(p, tok, sizeof(int32_t) * (size_t)B * T, &e)) return die(p, &e);
    snprintf(p, sizeof p, "%s/logits.f32", argv[2]);
    if (rl_write_file_atomic(p, rl_model_logits(&m), sizeof(float) * (size_t)B * T * mc.vocab_size, &e))
        return die(p, &e);
    char meta[256];
    int n = snprintf(meta, sizeof meta, "{\"batch\":%d,\"seq\":%d,\"vocab\":%d,\"step\":%lld,\"dir\":\"step-%08lld\"}\n",
                     B, T, mc.vocab_size, ld.step, ld.step);
    snprintf(p, sizeof p, "%s/meta.json", argv[2]);
    if (rl_write_file_atomic(p, meta, (size_t)n, &e)) return die(p, &e);
    rl_ckpt_loaded_free(&ld);
    rl_model_destroy(&m);
    free(tok);
    rl_ckpt_store_close(s);
    return 0;
}
