/* The trainer's text: data.tokenizer read once at start, checked against
 * the shards' dataset.json and carried into every checkpoint, and the
 * samples rank 0 logs every train.sample_every steps (trainer_internal.h). */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer_internal.h"

/* The dataset.json beside the first shard data.train names, if any; it
 * may name the EOS the tokenizer alone does not. */
static int check_dataset(rl_trainer *tr, const char *sha256, rl_err *e) {
    const rl_job_config *c = &tr->cfg;
    char first[RL_PATH_MAX], path[RL_PATH_MAX + 16];
    snprintf(first, sizeof first, "%s", c->data.train);
    first[strcspn(first, ",")] = 0;
    snprintf(path, sizeof path, "%s/dataset.json", dirname(first));
    if (access(path, F_OK) != 0) return RL_OK; /* shards from elsewhere (llm.c's) carry none */
    char *buf;
    size_t len;
    int rc = rl_read_file(path, &buf, &len, e);
    if (rc) return rc;
    int64_t eos;
    rc = rl_dataset_meta_check(buf, len, path, sha256, c->data.tokenizer, c->model.vocab_size, &eos, e);
    free(buf);
    /* GPT-2's layout: no template, the token prepare put before each
     * document is the end of the one before (its --eos) */
    if (!rc && tr->bpe && tr->tok.eos_id < 0 && eos >= 0) {
        tr->tok.eos_id = eos;
        tr->tok.eos = rl_bpe_added_content(tr->bpe, (uint32_t)eos);
    }
    return rc;
}

/* The tokens training put around each document, which a sample starts
 * with: rl_bpe_frame's, or bytes' end-of-text token where the model has it. */
static void set_frame(rl_trainer *tr) {
    if (tr->bpe) rl_bpe_frame(tr->bpe, tr->tok.eos_id, &tr->frame);
    else rl_eos_frame(tr->cfg.model.vocab_size > RL_TOK_EOT ? RL_TOK_EOT : -1, &tr->frame);
}

/* Every prompt must give the model at least one token: said at start,
 * not at the first sample hours later. */
static int check_prompts(rl_trainer *tr, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    if (t->sample_every == 0 || tr->frame.nbefore + tr->frame.nafter > 0) return RL_OK;
    for (const char *p = t->sample_prompts;; p++) {
        if (*p == '\n' || *p == '\0')
            return rl_errf(e, RL_EINPUT, "train.sample_prompts: an empty prompt gives this model no token to "
                                         "start from (its tokenizer puts none before a document): write some text");
        const char *nl = strchr(p, '\n');
        if (!nl) return RL_OK;
        p = nl;
    }
}

int rl_train_tokenizer_open(rl_trainer *tr, rl_err *e) {
    const rl_job_config *c = &tr->cfg;
    int rc = RL_OK;
    if (!c->data.tokenizer[0]) {
        if (!(rc = check_dataset(tr, NULL, e))) set_frame(tr);
        return rc ? rc : check_prompts(tr, e);
    }
    rc = rl_read_file(c->data.tokenizer, &tr->tok_json, &tr->tok.len, e);
    if (!rc) rc = rl_bpe_parse(tr->tok_json, tr->tok.len, c->data.tokenizer, &tr->bpe, e);
    if (rc) return rl_err_wrap(e, "data.tokenizer");
    if (rl_bpe_vocab_size(tr->bpe) > (uint32_t)c->model.vocab_size)
        return rl_errf(e, RL_EINPUT, "model.vocab_size: %d is smaller than the %u ids of data.tokenizer %s",
                       c->model.vocab_size, rl_bpe_vocab_size(tr->bpe), c->data.tokenizer);
    tr->tok.json = tr->tok_json;
    rl_bpe_special_ids(tr->bpe, &tr->tok.bos_id, &tr->tok.eos_id);
    tr->tok.bos = tr->tok.bos_id >= 0 ? rl_bpe_added_content(tr->bpe, (uint32_t)tr->tok.bos_id) : NULL;
    tr->tok.eos = tr->tok.eos_id >= 0 ? rl_bpe_added_content(tr->bpe, (uint32_t)tr->tok.eos_id) : NULL;
    if ((rc = check_dataset(tr, rl_bpe_sha256(tr->bpe), e))) return rc;
    set_frame(tr);
    return check_prompts(tr, e);
}

/* On a CPU model from the host copy of the weights, as the arithmetic
 * evaluation (whatever the device; samples use the training window). Every
 * rank computes the same samples (the weights are replicas, the draws
 * seeded alike); rank 0 logs them. */
int rl_train_samples(rl_trainer *tr, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    rl_model cpu;
    int rc = rl_trainer_sync_host(tr, false, e);
    if (rc || (rc = rl_model_create(&cpu, &tr->cfg.model, 1, t->seq_len, e))) return rc;
    memcpy(cpu.params, tr->dev.params, tr->dev.n * sizeof(float));
    rl_sample_opts o = {.max_new_tokens = t->sample_tokens, .temperature = t->sample_temperature,
                        .top_k = t->sample_top_k, .seed = (uint64_t)t->seed ^ (uint64_t)tr->step,
                        .eos_id = tr->bpe ? tr->tok.eos_id : tr->frame.eos};
    char prompt[sizeof t->sample_prompts];
    for (const char *p = t->sample_prompts; !rc; p++) {
        size_t n = strcspn(p, "\n");
        memcpy(prompt, p, n), prompt[n] = 0;
        char *text, *clean = NULL, pe[sizeof prompt * 2 + 1], *te = NULL;
        size_t len, cl;
        rl_lm lm;
        rl_lm_cpu(&cpu, &lm);
        if (!(rc = rl_sample_text(&lm, tr->bpe, &tr->frame, prompt, &o, &text, &len, e))) {
            /* a log line is JSON: invalid UTF-8 from a half-learned model is U+FFFD */
            clean = rl_utf8_lossy(text, len, &cl);
            te = clean ? malloc(cl * 6 + 1) : NULL;
            if (te && (!tr->dist || tr->dist->rank == 0))
                rl_log(RL_LOG_INFO, "sample", "\"step\":%lld,\"prompt\":\"%s\",\"text\":\"%s\"", tr->step,
                       rl_json_escape(pe, sizeof pe, prompt), rl_json_escape(te, cl * 6 + 1, clean));
            else
                rc = rl_errf(e, RL_ENOMEM, "sample: out of memory");
            free(text), free(clean), free(te);
        }
        if (!p[n]) break;
        p += n;
    }
    rl_model_destroy(&cpu);
    return rc;
}

void rl_train_tokenizer_free(rl_trainer *tr) {
    rl_bpe_free(tr->bpe);
    free(tr->tok_json);
}
