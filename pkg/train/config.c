/* The job config: one JSON object with "model" (Hugging Face LlamaConfig
 * names), "train" and "data" sections, read strictly over the embedded
 * defaults. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "train_gpu.h"

static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const attention[] = {"auto", "cudnn", "own", NULL};
static const char *const fused[] = {"auto", "on", "off", NULL};
static const char *const offloads[] = {"none", "optimizer", "layers", NULL};
#define F(f, ...) RL_CFG_FIELD(rl_train_config, f, __VA_ARGS__)
static const rl_cfg_field train_fields[] = {
    F(seed, .min = 0, .max = 1ll << 53, .def = 1337),
    F(device, .choices = devices, .def_str = "auto",
      .doc = "auto (the pod's GPU when it has one, else the CPU), cpu or cuda."),
    F(attention, .choices = attention, .def_str = "auto",
      .doc = "On cuda: auto (cuDNN when the image has libcudnn.so.9, it agrees with ringleader's kernels and is "
             "faster; else those), cudnn (an error without it) or own."),
    F(fused_gemm, .choices = fused, .def_str = "auto",
      .doc = "On cuda: auto (ringleader's GEMMs with SwiGLU and the classifier's softmax in them where that is "
             "faster on the GPU, else cuBLASLt and separate kernels), on or off. The same values up to rounding."),
    F(recompute, .def = 1,
      .doc = "On cuda: rebuild each layer's norm outputs and SwiGLU product in the backward instead of keeping "
             "them (a third less activation memory for under 1% of a step; the same results)."),
    F(offload, .choices = offloads, .def_str = "none",
      .doc = "On cuda: none, optimizer (the fp32 master weights and AdamW moments stay in the host's memory and "
             "AdamW runs on the CPU: 12 bytes a parameter off the GPU for a copy of the gradients down and of the "
             "bf16 weights up every step), or layers (also the decoder layers' bf16 weights and the gradients: "
             "each layer's weights are copied up as the forward and the backward reach it and its gradients "
             "down as they are made, averaged over the ranks on their way)."),
    F(offload_share, .def = 1,
      .doc = "With offload on several ranks in one pod: one copy of the host state (14 bytes a parameter, in "
             "/dev/shm: spec.shmSize must hold it) for all of them, AdamW split across them; else, or on false, "
             "a copy per rank. With dist.shard each rank keeps its shard's moments instead, across pods: 6 bytes a "
             "parameter and 12/world (no shared copy)."),
    F(steps, .min = 0, .max = 1ll << 40, .def = 800, .doc = "Optimizer steps."),
    F(seq_len, .min = 1, .max = 1 << 20, .def = 64, .doc = "Tokens per sequence."),
    F(micro_batch, .min = 1, .max = 1 << 20, .def = 16, .doc = "Sequences per forward, per rank."),
    F(global_batch_tokens, .min = 1, .max = 1ll << 40, .def = 2048,
      .doc = "Tokens per optimizer step across all ranks; must divide into whole micro-batches on every world "
             "size the job can have."),
    F(lr, .min = 0, .max = 10, .def = 3e-3, .doc = "Peak learning rate."),
    F(min_lr, .min = 0, .max = 10, .def = 3e-4, .doc = "Floor of the cosine decay."),
    F(warmup_steps, .min = 0, .max = 1ll << 40, .def = 50),
    F(weight_decay, .min = 0, .max = 10, .def = 0.1),
    F(beta1, .min = 0, .max = 0.999999, .def = 0.9),
    F(beta2, .min = 0, .max = 0.999999999, .def = 0.95),
    F(eps, .min = 1e-30, .max = 1, .def = 1e-8),
    F(grad_clip, .min = 0, .max = 1e9, .def = 1.0, .doc = "Max global gradient norm; 0 disables."),
    F(eval_every, .min = 0, .max = 1ll << 40, .def = 200, .doc = "Steps between evaluations; 0: only at the end."),
    F(eval_batches, .min = 0, .max = 1 << 20, .def = 8, .doc = "Micro-batches of the val split per evaluation."),
    F(log_every, .min = 1, .max = 1ll << 40, .def = 10),
    F(sample_every, .min = 0, .max = 1ll << 40, .def = 0,
      .doc = "Steps between samples: rank 0 logs each prompt continued (event sample); 0: never."),
    F(sample_prompts, .def_str = "",
      .doc = "One prompt per line (\"\": one empty prompt, the document start alone), through data.tokenizer."),
    F(sample_tokens, .min = 1, .max = 1 << 16, .def = 64, .doc = "Tokens generated per sample."),
    F(sample_temperature, .min = 0, .max = 100, .def = 0, .doc = "0: greedy; else softmax temperature."),
    F(sample_top_k, .min = 0, .max = 1 << 24, .def = 0, .doc = "With a temperature: draw among the k likeliest; 0: all."),
};
#undef F

static const char *const tasks[] = {"", "arith", NULL};
#define F(f, ...) RL_CFG_FIELD(rl_data_config, f, __VA_ARGS__)
static const rl_cfg_field data_fields[] = {
    F(train, .def_str = "data/arith/train_*.bin",
      .doc = "Shard file, glob or comma list (llm.c format), as the pods see them."),
    F(val, .def_str = "data/arith/val_*.bin", .doc = "Like train; \"\": no eval loss."),
    F(eval_task, .choices = tasks, .def_str = "arith", .doc = "\"\" or arith: exact-match on held-out sums."),
    F(eval_examples, .min = 0, .max = 1 << 30, .doc = "For eval_task; 0: all."),
    F(tokenizer, .def_str = "",
      .doc = "The tokenizer.json (byte-level BPE) the shards were made with, as the pods see it: checked against "
             "the shards' dataset.json and written into every checkpoint. \"\": byte-level."),
};
#undef F

static const char *const backends[] = {"auto", "tcp", "nccl", NULL};
static const char *const dtypes[] = {"fp32", "bf16", NULL}; /* why: ddp.h */
static const char *const shards[] = {"none", "optimizer", "gradients", NULL};
#define F(f, ...) RL_CFG_FIELD(rl_dist_config, f, __VA_ARGS__)
static const rl_cfg_field dist_fields[] = {
    F(backend, .choices = backends, .def_str = "auto",
      .doc = "auto (nccl on a GPU, tcp on the CPU), tcp or nccl (not tcp when gpusPerNode > 0)."),
    F(timeout_s, .min = 0.1, .max = 86400, .def = 60, .doc = "Every collective and peer wait."),
    /* PyTorch DDP's defaults */
    F(bucket_mb, .min = 1e-6, .max = 4096, .def = 25),
    F(first_bucket_mb, .min = 1e-6, .max = 4096, .def = 1),
    /* lets small models overlap too (see ddp.h) */
    F(min_buckets, .min = 1, .max = 1 << 16, .def = 8, .doc = "No bucket above 1/min_buckets of the gradients."),
    F(reduce_dtype, .choices = dtypes, .def_str = "fp32",
      .doc = "fp32 (exact average, the default) or bf16 (half the bytes on the wire)."),
    F(shard, .choices = shards, .def_str = "none",
      .doc = "none (DDP), optimizer (ZeRO-1: each rank keeps and updates 1/world of the AdamW state) or "
             "gradients (ZeRO-2: gradients reduce-scattered as well). Same results as none. With "
             "train.offload (optimizer or layers) both shard the host's AdamW state and reduce-scatter."),
    F(hang_factor, .min = 0, .max = 1e6, .def = 10,
      .doc = "A collective still running after this many median step times is a hang: the job names the "
             "rank that stopped, dumps every rank's records and recovers. 0: no hang watch."),
    F(hang_min_s, .min = 0.1, .max = 86400, .def = 5,
      .doc = "The hang deadline is never shorter than this (first steps, noisy machines)."),
    F(straggler_factor, .min = 0, .max = 1e6, .def = 1.5,
      .doc = "A rank whose busy time per step (its step less its wait for the others) is this many times "
             "the median rank's is named as a straggler in the job's status and metrics. 0: never."),
    F(preflight_min_ratio, .min = 0, .max = 1, .def = 0.5,
      .doc = "Each round, every rank measures its node (free /dev/shm, memory copy bandwidth, on tcp the network "
             "link into it); a rank below this fraction of the median is named in the job's Degraded condition. "
             "0: no check."),
};
#undef F

static const rl_cfg_section train_section = RL_CFG_SECTION(train_fields, .doc = NULL);
static const rl_cfg_section data_section = RL_CFG_SECTION(data_fields, .doc = NULL);
static const rl_cfg_section dist_section = RL_CFG_SECTION(dist_fields, .doc = NULL);

static int job_check(const void *c, const char *name, rl_err *e);
#define F(f, ...) RL_CFG_FIELD(rl_job_config, f, __VA_ARGS__)
static const rl_cfg_field job_fields[] = {
    F(model, .sub = &rl_model_config_section),
    F(train, .sub = &train_section),
    F(data, .sub = &data_section),
    F(dist, .sub = &dist_section),
    {.name = "checkpoint", .kind = RL_CFG_OBJ, .off = offsetof(rl_job_config, ckpt), .sub = &rl_ckpt_config_section},
    F(rdzv, .sub = &rl_rdzv_config_section),
};
#undef F

const rl_cfg_section rl_job_config_section = RL_CFG_SECTION(
    job_fields, .check = job_check, .top = true,
    .doc = "The worker's job config (README \"Training your own data\"), field for field: a config that runs "
           "with `ringleader-worker --config job.json` pastes in unchanged. Absent fields take the worker's "
           "defaults. The operator checks the whole section with the worker's parser before any pod exists.");

void rl_job_config_default(rl_job_config *c) {
    memset(c, 0, sizeof *c);
    rl_cfg_defaults(&rl_job_config_section, c);
}

rl_shard_mode rl_shard_mode_of(const char *name) {
    for (int i = 0; shards[i]; i++)
        if (!strcmp(name, shards[i])) return (rl_shard_mode)i;
    return RL_SHARD_NONE; /* the parser admits only the names above */
}

/* the tcp ring reduces host buffers, NCCL device buffers */
int rl_train_check_pair(const rl_job_config *c, rl_err *e) {
    const char *dev = c->train.device, *be = c->dist.backend, *off = c->train.offload;
    if ((!strcmp(dev, "cpu") && !strcmp(be, "nccl")) || (!strcmp(dev, "cuda") && !strcmp(be, "tcp")))
        return rl_errf(e, RL_EINPUT, "dist.backend \"%s\" cannot reduce gradients on train.device \"%s\" "
                       "(cpu takes tcp, cuda takes nccl; auto picks)", be, dev);
    if (strcmp(off, "none") && !strcmp(dev, "cpu"))
        return rl_errf(e, RL_EINPUT, "train.offload \"%s\" needs a GPU (train.device is cpu%s)", off,
                       c->train.device_picked ? ": auto found none" : "");
    return RL_OK;
}

/* Rules across sections, once every field is read. */
static int job_check(const void *obj, const char *name, rl_err *e) {
    const rl_job_config *c = obj;
    const rl_train_config *t = &c->train;
    int rc;
    if (t->seq_len > c->model.max_position_embeddings)
        return rl_errf(e, RL_EINPUT, "%s: train.seq_len %d exceeds model.max_position_embeddings %d",
                       name, t->seq_len, c->model.max_position_embeddings);
    if ((rc = rl_train_check_pair(c, e))) return rl_err_wrap(e, "%s", name);
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
    if (c->data.eval_task[0] && !c->data.val[0])
        return rl_errf(e, RL_EINPUT, "%s: data.eval_task needs data.val", name);
    /* every rank saves its shard of the same step: none may skip one */
    if (strcmp(c->dist.shard, "none") != 0 && !strcmp(c->ckpt.when_busy, "skip"))
        return rl_errf(e, RL_EINPUT, "%s: checkpoint.when_busy \"skip\" cannot go with dist.shard \"%s\" (every rank "
                       "must save the same steps): use \"wait\"", name, c->dist.shard);
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
    int rc = rl_cfg_read(root, name, &rl_job_config_section, c, e);
    cJSON_Delete(root);
    return rc;
}

char *rl_job_config_to_json(const rl_job_config *c) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    rl_cfg_write(&rl_job_config_section, c, r);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
