/* The job config: one JSON object with "model" (Hugging Face LlamaConfig
 * names), "train" and "data" sections, read strictly over the embedded
 * defaults. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "train_gpu.h"

void rl_job_config_default(rl_job_config *c) {
    memset(c, 0, sizeof *c);
    rl_model_config_default(&c->model);
    c->train = (rl_train_config){
        .seed = 1337,
        .steps = 800,
        .seq_len = 64,
        .micro_batch = 16,
        .global_batch_tokens = 2048,
        .lr = 3e-3,
        .min_lr = 3e-4,
        .warmup_steps = 50,
        .weight_decay = 0.1,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1e-8,
        .grad_clip = 1.0,
        .eval_every = 200,
        .eval_batches = 8,
        .log_every = 10,
    };
    snprintf(c->data.train, sizeof c->data.train, "data/arith/train_*.bin");
    snprintf(c->data.val, sizeof c->data.val, "data/arith/val_*.bin");
    snprintf(c->data.eval_task, sizeof c->data.eval_task, "arith");
    snprintf(c->train.device, sizeof c->train.device, "auto");
    snprintf(c->train.attention, sizeof c->train.attention, "auto");
    snprintf(c->dist.backend, sizeof c->dist.backend, "auto");
    c->dist.timeout_s = 60;
    c->dist.bucket_mb = 25, c->dist.first_bucket_mb = 1; /* PyTorch DDP's defaults */
    c->dist.min_buckets = 8; /* lets small models overlap too (see ddp.h) */
    snprintf(c->dist.reduce_dtype, sizeof c->dist.reduce_dtype, "fp32"); /* why: ddp.h */
    rl_ckpt_config_default(&c->ckpt);
    rl_rdzv_config_default(&c->rdzv);
}

static int parse_dist(const cJSON *o, const char *w, rl_dist_config *d, rl_err *e) {
    static const char *const keys[] = {"backend", "timeout_s", "bucket_mb", "first_bucket_mb", "min_buckets",
                                       "reduce_dtype", NULL};
    int rc = rl_cfg_check_keys(o, w, keys, e);
    if (rc || (rc = rl_cfg_str(o, w, "backend", d->backend, sizeof d->backend, e)) ||
        (rc = rl_cfg_num(o, w, "timeout_s", 0.1, 86400, &d->timeout_s, e)) ||
        (rc = rl_cfg_num(o, w, "bucket_mb", 1e-6, 4096, &d->bucket_mb, e)) ||
        (rc = rl_cfg_num(o, w, "first_bucket_mb", 1e-6, 4096, &d->first_bucket_mb, e)) ||
        (rc = rl_cfg_str(o, w, "reduce_dtype", d->reduce_dtype, sizeof d->reduce_dtype, e)))
        return rc;
    if (strcmp(d->reduce_dtype, "fp32") != 0 && strcmp(d->reduce_dtype, "bf16") != 0) {
        char esc[64];
        return rl_errf(e, RL_EINPUT, "%s.reduce_dtype: \"%s\" (fp32 or bf16)", w,
                       rl_json_escape(esc, sizeof esc, d->reduce_dtype));
    }
    long long mb = d->min_buckets;
    if ((rc = rl_cfg_int(o, w, "min_buckets", 1, 1 << 16, &mb, e))) return rc;
    d->min_buckets = (int)mb;
    if (strcmp(d->backend, "auto") != 0 && strcmp(d->backend, "tcp") != 0 &&
        strcmp(d->backend, "nccl") != 0) {
        char esc[64];
        return rl_errf(e, RL_EINPUT, "%s.backend: unknown backend \"%s\" (auto, tcp or nccl)", w,
                       rl_json_escape(esc, sizeof esc, d->backend));
    }
    return RL_OK;
}

static int parse_train(const cJSON *o, const char *w, rl_train_config *t, rl_err *e) {
    static const char *const keys[] = {
        "seed", "steps", "seq_len", "micro_batch", "global_batch_tokens", "lr", "min_lr",
        "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "eval_every",
        "eval_batches", "log_every", "device", "attention", NULL};
    int rc = rl_cfg_check_keys(o, w, keys, e);
    if (rc) return rc;
    long long seed = (long long)t->seed, seq = t->seq_len, mb = t->micro_batch, eb = t->eval_batches;
    if ((rc = rl_cfg_int(o, w, "seed", 0, (1ll << 53), &seed, e)) ||
        (rc = rl_cfg_int(o, w, "steps", 0, 1ll << 40, &t->steps, e)) ||
        (rc = rl_cfg_int(o, w, "seq_len", 1, 1 << 20, &seq, e)) ||
        (rc = rl_cfg_int(o, w, "micro_batch", 1, 1 << 20, &mb, e)) ||
        (rc = rl_cfg_int(o, w, "global_batch_tokens", 1, 1ll << 40, &t->global_batch_tokens, e)) ||
        (rc = rl_cfg_num(o, w, "lr", 0, 10, &t->lr, e)) ||
        (rc = rl_cfg_num(o, w, "min_lr", 0, 10, &t->min_lr, e)) ||
        (rc = rl_cfg_int(o, w, "warmup_steps", 0, 1ll << 40, &t->warmup_steps, e)) ||
        (rc = rl_cfg_num(o, w, "weight_decay", 0, 10, &t->weight_decay, e)) ||
        (rc = rl_cfg_num(o, w, "beta1", 0, 0.999999, &t->beta1, e)) ||
        (rc = rl_cfg_num(o, w, "beta2", 0, 0.999999999, &t->beta2, e)) ||
        (rc = rl_cfg_num(o, w, "eps", 1e-30, 1, &t->eps, e)) ||
        (rc = rl_cfg_num(o, w, "grad_clip", 0, 1e9, &t->grad_clip, e)) ||
        (rc = rl_cfg_int(o, w, "eval_every", 0, 1ll << 40, &t->eval_every, e)) ||
        (rc = rl_cfg_int(o, w, "eval_batches", 0, 1 << 20, &eb, e)) ||
        (rc = rl_cfg_int(o, w, "log_every", 1, 1ll << 40, &t->log_every, e)) ||
        (rc = rl_cfg_str(o, w, "device", t->device, sizeof t->device, e)) ||
        (rc = rl_cfg_str(o, w, "attention", t->attention, sizeof t->attention, e)))
        return rc;
    if (strcmp(t->device, "auto") != 0 && strcmp(t->device, "cpu") != 0 && strcmp(t->device, "cuda") != 0) {
        char esc[64];
        return rl_errf(e, RL_EINPUT, "%s.device: unknown device \"%s\" (auto, cpu or cuda)", w,
                       rl_json_escape(esc, sizeof esc, t->device));
    }
    if (strcmp(t->attention, "auto") != 0 && strcmp(t->attention, "cudnn") != 0 &&
        strcmp(t->attention, "own") != 0) {
        char esc[64];
        return rl_errf(e, RL_EINPUT, "%s.attention: unknown backend \"%s\" (auto, cudnn or own)", w,
                       rl_json_escape(esc, sizeof esc, t->attention));
    }
    t->seed = (uint64_t)seed, t->seq_len = (int)seq, t->micro_batch = (int)mb, t->eval_batches = (int)eb;
    return RL_OK;
}

static int parse_data(const cJSON *o, const char *w, rl_data_config *d, rl_err *e) {
    static const char *const keys[] = {"train", "val", "eval_task", "eval_examples", NULL};
    int rc = rl_cfg_check_keys(o, w, keys, e);
    if (rc) return rc;
    long long ex = d->eval_examples;
    if ((rc = rl_cfg_str(o, w, "train", d->train, sizeof d->train, e)) ||
        (rc = rl_cfg_str(o, w, "val", d->val, sizeof d->val, e)) ||
        (rc = rl_cfg_str(o, w, "eval_task", d->eval_task, sizeof d->eval_task, e)) ||
        (rc = rl_cfg_int(o, w, "eval_examples", 0, 1 << 30, &ex, e)))
        return rc;
    d->eval_examples = (int)ex;
    return RL_OK;
}

/* the tcp ring reduces host buffers, NCCL device buffers */
int rl_train_check_pair(const char *dev, const char *be, rl_err *e) {
    if ((!strcmp(dev, "cpu") && !strcmp(be, "nccl")) || (!strcmp(dev, "cuda") && !strcmp(be, "tcp")))
        return rl_errf(e, RL_EINPUT, "dist.backend \"%s\" cannot reduce gradients on train.device \"%s\" "
                       "(cpu takes tcp, cuda takes nccl; auto picks)", be, dev);
    return RL_OK;
}

static int check(const rl_job_config *c, const char *name, rl_err *e) {
    const rl_train_config *t = &c->train;
    int rc = rl_model_config_validate(&c->model, name, e);
    if (rc) return rc;
    if (t->seq_len > c->model.max_position_embeddings)
        return rl_errf(e, RL_EINPUT, "%s: train.seq_len %d exceeds model.max_position_embeddings %d",
                       name, t->seq_len, c->model.max_position_embeddings);
    if ((rc = rl_train_check_pair(t->device, c->dist.backend, e))) return rl_err_wrap(e, "%s", name);
    if (t->global_batch_tokens % t->seq_len != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s: train.global_batch_tokens %lld is not a multiple of train.seq_len %d",
                       name, t->global_batch_tokens, t->seq_len);
    long long seqs = t->global_batch_tokens / t->seq_len;
    if (seqs % t->micro_batch != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s: train.global_batch_tokens %lld (%lld sequences) is not divisible by "
                       "train.micro_batch %d",
                       name, t->global_batch_tokens, seqs, t->micro_batch);
    if (seqs > (1ll << 30))
        return rl_errf(e, RL_EINPUT, "%s: train.global_batch_tokens: %lld sequences per step is too many",
                       name, seqs);
    if (t->min_lr > t->lr)
        return rl_errf(e, RL_EINPUT, "%s: train.min_lr %g is above train.lr %g", name, t->min_lr, t->lr);
    if (t->warmup_steps > t->steps)
        return rl_errf(e, RL_EINPUT, "%s: train.warmup_steps %lld exceeds train.steps %lld", name,
                       t->warmup_steps, t->steps);
    if (c->data.train[0] == '\0') return rl_errf(e, RL_EINPUT, "%s: data.train: must be set", name);
    if (c->data.eval_task[0] && strcmp(c->data.eval_task, "arith") != 0) {
        char esc[128]; /* user text: escaped, so the message stays one line */
        return rl_errf(e, RL_EINPUT, "%s: data.eval_task: unknown task \"%s\" (known: arith)", name,
                       rl_json_escape(esc, sizeof esc, c->data.eval_task));
    }
    if (c->data.eval_task[0] && !c->data.val[0])
        return rl_errf(e, RL_EINPUT, "%s: data.eval_task needs data.val", name);
    return RL_OK;
}

int rl_job_config_check_world(const rl_job_config *c, int world, const char *name, rl_err *e) {
    long long seqs = c->train.global_batch_tokens / c->train.seq_len;
    long long per = (long long)c->train.micro_batch * world;
    if (world < 1 || seqs % per != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s: train.global_batch_tokens %lld (%lld sequences) is not divisible by "
                       "micro_batch %d x world size %d",
                       name, c->train.global_batch_tokens, seqs, c->train.micro_batch, world);
    return RL_OK;
}

int rl_job_config_parse(const char *text, size_t len, const char *name, rl_job_config *c,
                        rl_err *e) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        size_t line = 1;
        for (size_t i = 0; i < off && i < len; i++) line += text[i] == '\n';
        return rl_errf(e, RL_EINPUT, "%s: invalid JSON near line %zu (byte %zu)", name, line, off);
    }
    static const char *const keys[] = {"model", "train", "data", "dist", "checkpoint", "rdzv", NULL};
    char where[RL_PATH_MAX + 16];
    int rc = rl_cfg_check_keys(root, name, keys, e);
    const cJSON *sec;
    if (!rc && !(rc = rl_cfg_obj(root, name, "model", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: model", name);
        rc = rl_model_config_from_json(sec, where, &c->model, e);
    }
    if (!rc && !(rc = rl_cfg_obj(root, name, "train", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: train", name);
        rc = parse_train(sec, where, &c->train, e);
    }
    if (!rc && !(rc = rl_cfg_obj(root, name, "data", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: data", name);
        rc = parse_data(sec, where, &c->data, e);
    }
    if (!rc && !(rc = rl_cfg_obj(root, name, "dist", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: dist", name);
        rc = parse_dist(sec, where, &c->dist, e);
    }
    if (!rc && !(rc = rl_cfg_obj(root, name, "checkpoint", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: checkpoint", name);
        rc = rl_ckpt_config_from_json(sec, where, &c->ckpt, e);
    }
    if (!rc && !(rc = rl_cfg_obj(root, name, "rdzv", &sec, e)) && sec) {
        snprintf(where, sizeof where, "%s: rdzv", name);
        rc = rl_rdzv_config_from_json(sec, where, &c->rdzv, e);
    }
    cJSON_Delete(root);
    return rc ? rc : check(c, name, e);
}

char *rl_job_config_to_json(const rl_job_config *c) {
    cJSON *r = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(r, "model");
    const rl_model_config *mc = &c->model;
    cJSON_AddNumberToObject(m, "hidden_size", mc->hidden_size);
    cJSON_AddNumberToObject(m, "intermediate_size", mc->intermediate_size);
    cJSON_AddNumberToObject(m, "num_hidden_layers", mc->num_hidden_layers);
    cJSON_AddNumberToObject(m, "num_attention_heads", mc->num_attention_heads);
    cJSON_AddNumberToObject(m, "num_key_value_heads", mc->num_key_value_heads);
    cJSON_AddNumberToObject(m, "vocab_size", mc->vocab_size);
    cJSON_AddNumberToObject(m, "max_position_embeddings", mc->max_position_embeddings);
    cJSON_AddNumberToObject(m, "rms_norm_eps", mc->rms_norm_eps);
    cJSON_AddNumberToObject(m, "rope_theta", mc->rope_theta);
    cJSON_AddNumberToObject(m, "initializer_range", mc->initializer_range);
    const rl_train_config *t = &c->train;
    cJSON *tr = cJSON_AddObjectToObject(r, "train");
    cJSON_AddNumberToObject(tr, "seed", (double)t->seed);
    cJSON_AddStringToObject(tr, "device", t->device);
    cJSON_AddStringToObject(tr, "attention", t->attention);
    cJSON_AddNumberToObject(tr, "steps", (double)t->steps);
    cJSON_AddNumberToObject(tr, "seq_len", t->seq_len);
    cJSON_AddNumberToObject(tr, "micro_batch", t->micro_batch);
    cJSON_AddNumberToObject(tr, "global_batch_tokens", (double)t->global_batch_tokens);
    cJSON_AddNumberToObject(tr, "lr", t->lr);
    cJSON_AddNumberToObject(tr, "min_lr", t->min_lr);
    cJSON_AddNumberToObject(tr, "warmup_steps", (double)t->warmup_steps);
    cJSON_AddNumberToObject(tr, "weight_decay", t->weight_decay);
    cJSON_AddNumberToObject(tr, "beta1", t->beta1);
    cJSON_AddNumberToObject(tr, "beta2", t->beta2);
    cJSON_AddNumberToObject(tr, "eps", t->eps);
    cJSON_AddNumberToObject(tr, "grad_clip", t->grad_clip);
    cJSON_AddNumberToObject(tr, "eval_every", (double)t->eval_every);
    cJSON_AddNumberToObject(tr, "eval_batches", t->eval_batches);
    cJSON_AddNumberToObject(tr, "log_every", (double)t->log_every);
    cJSON *d = cJSON_AddObjectToObject(r, "data");
    cJSON_AddStringToObject(d, "train", c->data.train);
    cJSON_AddStringToObject(d, "val", c->data.val);
    cJSON_AddStringToObject(d, "eval_task", c->data.eval_task);
    cJSON_AddNumberToObject(d, "eval_examples", c->data.eval_examples);
    cJSON *ds = cJSON_AddObjectToObject(r, "dist");
    cJSON_AddStringToObject(ds, "backend", c->dist.backend);
    cJSON_AddNumberToObject(ds, "timeout_s", c->dist.timeout_s);
    cJSON_AddNumberToObject(ds, "bucket_mb", c->dist.bucket_mb);
    cJSON_AddNumberToObject(ds, "first_bucket_mb", c->dist.first_bucket_mb);
    cJSON_AddNumberToObject(ds, "min_buckets", c->dist.min_buckets);
    cJSON_AddStringToObject(ds, "reduce_dtype", c->dist.reduce_dtype);
    rl_ckpt_config_add_json(&c->ckpt, cJSON_AddObjectToObject(r, "checkpoint"));
    rl_rdzv_config_add_json(&c->rdzv, cJSON_AddObjectToObject(r, "rdzv"));
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
