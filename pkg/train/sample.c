/* Text from a model: a prompt continued token by token, greedy or sampled
 * (train.h), on the CPU model or a GPU's (rl_lm_gpu, gpu.c). No KV cache:
 * each new token reruns the window's forward, which is what a sample every
 * few hundred steps or one `generate` call can afford, and keeps the one
 * forward the tests check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "train_gpu.h"

/* The next token from one position's logits: argmax at temperature 0, else
 * a draw from softmax(logits / temperature) over the top_k largest (all
 * when 0). Ties go to the lowest id, so greedy output is reproducible. */
static int32_t pick(const float *logits, int V, const rl_sample_opts *o, rl_rng *rng, float *p, int32_t *idx) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (o->temperature <= 0) return best;
    int k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    /* the k largest by partial selection (k is small, or all of them) */
    for (int i = 0; i < V; i++) idx[i] = i;
    for (int i = 0; i < k && k < V; i++) {
        int m = i;
        for (int j = i + 1; j < V; j++)
            if (logits[idx[j]] > logits[idx[m]]) m = j;
        int32_t t = idx[i];
        idx[i] = idx[m], idx[m] = t;
    }
    double sum = 0;
    for (int i = 0; i < k; i++) sum += p[i] = (float)exp((logits[idx[i]] - logits[best]) / o->temperature);
    double u = rl_rng_uniform(rng) * sum;
    for (int i = 0; i < k; i++)
        if ((u -= p[i]) < 0) return idx[i];
    return idx[k - 1];
}

static int cpu_last_logits(rl_lm *lm, const int32_t *tok, int T, const float **logits, rl_err *e) {
    rl_model *m = lm->impl;
    int rc = rl_model_forward(m, tok, NULL, 1, T, NULL, e);
    *logits = rc ? NULL : rl_model_logits(m) + (size_t)(T - 1) * lm->vocab;
    return rc;
}

void rl_lm_cpu(rl_model *m, rl_lm *out) {
    *out = (rl_lm){.vocab = m->cfg.vocab_size, .window = m->T, .last_logits = cpu_last_logits, .impl = m};
}

void rl_lm_close(rl_lm *lm) {
    if (lm && lm->close) lm->close(lm);
}

int rl_sample(rl_lm *lm, const int32_t *prompt, int n, const rl_sample_opts *o, int32_t **out, int *nout,
              rl_err *e) {
    int V = lm->vocab, W = lm->window, total = n + o->max_new_tokens;
    *out = NULL, *nout = 0;
    if (n < 1) return rl_errf(e, RL_EINPUT, "sample: the prompt encodes to no token (give some text)");
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return rl_errf(e, RL_EINPUT, "sample: prompt token %d is outside the model's vocabulary (%d)", prompt[i], V);
    int32_t *seq = malloc(sizeof *seq * (size_t)total), *idx = malloc(sizeof *idx * (size_t)V);
    float *p = malloc(sizeof *p * (size_t)V);
    if (!seq || !idx || !p) {
        free(seq), free(idx), free(p);
        return rl_errf(e, RL_ENOMEM, "sample: out of memory");
    }
    memcpy(seq, prompt, sizeof *seq * (size_t)n);
    rl_rng rng;
    rl_rng_seed(&rng, o->seed);
    int len = n, rc = RL_OK;
    while (len < total) {
        /* the newest W tokens: a longer text slides past the model's window */
        int T = len < W ? len : W;
        const float *logits;
        if ((rc = lm->last_logits(lm, seq + len - T, T, &logits, e))) break;
        int32_t next = pick(logits, V, o, &rng, p, idx);
        seq[len++] = next;
        if (o->eos_id >= 0 && next == o->eos_id) break;
    }
    free(idx), free(p);
    if (rc) {
        free(seq);
        return rc;
    }
    *out = seq, *nout = len;
    return RL_OK;
}

int rl_sample_text(rl_lm *lm, const rl_bpe *bpe, const rl_doc_frame *fr, const char *prompt,
                   const rl_sample_opts *o, char **text, size_t *len, rl_err *e) {
    size_t pl = strlen(prompt), n = 0;
    /* a document boundary of the training stream: the one before's end, this one's start */
    int nbefore = fr->nafter + fr->nbefore;
    rl_bpe_ids ids = {0};
    rl_bpe_enc *enc = NULL;
    *text = NULL, *len = 0;
    int rc = RL_OK;
    if (bpe && !(rc = rl_bpe_enc_new(bpe, &enc, e))) rc = rl_bpe_encode(enc, prompt, pl, true, &ids, e);
    rl_bpe_enc_free(enc);
    size_t np = bpe ? ids.n : pl;
    int32_t *in = rc ? NULL : malloc(sizeof *in * (nbefore + np + 1)), *seq = NULL;
    if (!rc && !in) rc = rl_errf(e, RL_ENOMEM, "sample: out of memory");
    for (int i = 0; !rc && i < fr->nafter; i++) in[n++] = (int32_t)fr->after[i];
    for (int i = 0; !rc && i < fr->nbefore; i++) in[n++] = (int32_t)fr->before[i];
    for (size_t i = 0; !rc && i < np; i++) in[n++] = bpe ? (int32_t)ids.v[i] : (unsigned char)prompt[i];
    rl_bpe_ids_free(&ids);
    int ns = 0;
    if (!rc && n > (size_t)INT32_MAX / 2) rc = rl_errf(e, RL_EINPUT, "sample: the prompt is too long");
    if (!rc) rc = rl_sample(lm, in, (int)n, o, &seq, &ns, e);
    /* the text after the frame; an end-of-text token that stopped it is not text */
    int end = ns > (int)n && o->eos_id >= 0 && seq[ns - 1] == o->eos_id ? ns - 1 : ns;
    if (!rc && bpe) {
        size_t cap = 0;
        uint32_t *u = malloc(sizeof *u * (size_t)(end - nbefore + 1));
        for (int i = nbefore; u && i < end; i++) u[i - nbefore] = (uint32_t)seq[i];
        rc = u ? rl_bpe_decode(bpe, u, (size_t)(end - nbefore), text, len, &cap, e) : rl_errf(e, RL_ENOMEM, "sample: out of memory");
        free(u);
    } else if (!rc) {
        if (!(*text = malloc((size_t)(end - nbefore) + 1))) rc = rl_errf(e, RL_ENOMEM, "sample: out of memory");
        else *len = rl_tok_decode(seq + nbefore, (size_t)(end - nbefore), *text, (size_t)(end - nbefore) + 1);
    }
    free(in), free(seq);
    if (rc) free(*text), *text = NULL, *len = 0;
    return rc;
}

/* The checkpoint's tokenizer.json, if it carries one. */
static int load_tokenizer(rl_ckpt_store *s, long long step, rl_bpe **bpe, rl_err *e) {
    char dir[32], key[96], where[RL_CKPT_URI_MAX + 96];
    bool found;
    uint64_t size;
    *bpe = NULL;
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/tokenizer.json", dir);
    int rc = rl_ckpt_exists(s, key, &found, &size, e);
    if (rc || !found) return rc;
    char *t;
    size_t n;
    if ((rc = rl_ckpt_get(s, key, 0, UINT64_MAX, (void **)&t, &n, e))) return rc;
    snprintf(where, sizeof where, "%s/%s", s->uri, key);
    rc = rl_bpe_parse(t, n, where, bpe, e);
    free(t);
    return rc;
}

int rl_generate(const char *uri, long long step, const char *device, const char *prompt, const rl_sample_opts *opts,
                char **text, size_t *len, rl_err *e) {
    rl_ckpt_store *s = NULL;
    rl_bpe *bpe = NULL;
    rl_model m = {0};
    bool made = false;
    long long *steps = NULL;
    int nsteps = 0;
    int rc = rl_ckpt_store_open_read(uri, &s, e);
    if (!rc) rc = rl_ckpt_steps(s, &steps, &nsteps, NULL, NULL, e);
    if (!rc && nsteps == 0) rc = rl_errf(e, RL_EINPUT, "%s: no committed checkpoint there", uri);
    bool have = step < 0;
    for (int i = 0; !rc && i < nsteps; i++) have |= steps[i] == step;
    if (!rc && !have) rc = rl_errf(e, RL_EINPUT, "--step: %s holds no committed step %lld", uri, step);
    if (!rc && step < 0) step = steps[nsteps - 1];
    free(steps);
    rl_model_config mc;
    rl_sample_opts o = *opts;
    rl_ckpt_loaded ld = {0};
    if (!rc) rc = rl_ckpt_model_config(s, step, &mc, &o.eos_id, e);
    int ngpu = strcmp(device, "cpu") ? rl_train_gpu_count(NULL, 0) : 0;
    bool gpu = !strcmp(device, "cuda") || ngpu > 0;
#ifdef RL_CUDA
    if (!rc && gpu && ngpu == 0) rc = rl_errf(e, RL_EINPUT, "--device cuda: no GPU is visible to this process");
#endif
    /* the weights: into the CPU model that samples, or a host buffer the
     * GPU model takes and that goes once uploaded (no activations, no
     * gradients on the host) */
    rl_param_layout lay;
    float *host = NULL;
    if (!rc && (rc = rl_model_config_validate(&mc, "config.json", e)) == RL_OK) rl_param_layout_init(&lay, &mc);
    if (!rc && !gpu && !(rc = rl_model_create(&m, &mc, 1, mc.max_position_embeddings, e))) made = true, host = m.params;
    if (!rc && gpu && !(host = malloc(lay.total * sizeof(float))))
        rc = rl_errf(e, RL_ENOMEM, "generate: out of memory for %zu MiB of weights", lay.total * sizeof(float) >> 20);
    if (!rc) rc = rl_ckpt_read_step(s, step, &mc, lay.total, host, NULL, NULL, &ld, e);
    rl_ckpt_loaded_free(&ld);
    if (!rc) rc = load_tokenizer(s, step, &bpe, e);
    if (!rc && bpe && rl_bpe_vocab_size(bpe) > (uint32_t)mc.vocab_size)
        rc = rl_errf(e, RL_EINPUT, "%s: step %lld: its tokenizer has %u ids, its model %d", uri, step,
                     rl_bpe_vocab_size(bpe), mc.vocab_size);
    /* what training put before each document; bytes: the end of text */
    rl_doc_frame fr;
    if (!rc && bpe) rl_bpe_frame(bpe, o.eos_id, &fr);
    else rl_eos_frame(o.eos_id, &fr);
    rl_lm lm = {0};
    if (!rc && gpu) rc = rl_lm_gpu(&mc, host, mc.max_position_embeddings, &lm, e);
    else if (!rc) rl_lm_cpu(&m, &lm);
    if (gpu) free(host); /* uploaded (or never used) */
    if (!rc) rc = rl_sample_text(&lm, bpe, &fr, prompt, &o, text, len, e);
    rl_lm_close(&lm);
    if (made) rl_model_destroy(&m);
    rl_bpe_free(bpe);
    rl_ckpt_store_close(s);
    return rc;
}
