/* Memory accounting (issue 18): the bytes one rank's training state takes,
 * by category, for each dist.shard mode, from the config alone -- no model
 * is built, so a job can be sized (and the README's table printed,
 * bench/memory_table.c) on a machine that could never hold it.
 *
 * Every rank of a job holds the same amounts (each keeps one block of every
 * bucket plus the same tails), so the figures are per rank, any rank. They
 * count the rank's device: host memory on train.device "cpu", GPU memory on
 * "cuda". Not counted: the CUDA context and NCCL's buffers, the GPU
 * trainer's host mirror, cuDNN's attention workspace (train.attention
 * cudnn), the optional on-GPU checkpoint staging copy (12 bytes a parameter
 * where it fits, else checkpoints go through the host), the data loader. */
#ifndef RL_TRAIN_MEMORY_H
#define RL_TRAIN_MEMORY_H

#include <stddef.h>

#include "train/train.h"
#include "util/util.h"

typedef struct rl_train_memory {
    size_t weights;     /* the compute copy: fp32 on cpu (also the master), bf16 on cuda (with
                         * train.offload "layers": the embedding, the head and a ring of layers) */
    size_t master;      /* fp32 master weights: 0 on cpu (the weights are), whole on cuda */
    size_t grads;       /* fp32 gradients: whole, but for "gradients" (cpu: below; cuda: the
                         * model's gradient slots and the shard's own gradient) */
    size_t moments;     /* AdamW m and v, fp32, whole or this rank's shard */
    size_t activations; /* activations, backward scratch, RoPE table, token ids (and the
                         * cuBLASLt workspace on cuda): sized for micro_batch x seq_len */
    size_t total;       /* the five above */
    size_t shard_elems; /* elements of sharded state this rank holds (nparams when none) */
} rl_train_memory;

/* The gradient buckets of pkg/ddp (rl_ddp_create) as a pure plan: cut from the END of the flat buffer, bucket 0 first_bucket_mb, the others
 * bucket_mb, none above ceil(n / min_buckets) elements. ZeRO shards follow
 * the buckets, so the shard sizes come from here. */
typedef struct rl_train_bucket_plan {
    size_t n;       /* elements in all */
    size_t first;   /* bucket 0's length (the end of the buffer) */
    size_t rest;    /* the capacity of every later bucket */
    size_t count;   /* buckets */
    size_t largest; /* the longest bucket's length */
} rl_train_bucket_plan;
/* Bucket sizes of 0 bytes take DDP's defaults (1 and 25 MiB); below 4 bytes
 * is RL_EINPUT. rl_ddp_create cuts its buckets by this plan. */
int rl_train_bucket_plan_of(size_t n, size_t first_bytes, size_t bucket_bytes, int min_buckets,
                            rl_train_bucket_plan *p, rl_err *e);
/* dist.bucket_mb and first_bucket_mb in bytes (what the agent gives DDP). */
size_t rl_train_mib_bytes(double mib);
/* Length of bucket b (0: the one at the end of the buffer; 0 past the last). */
size_t rl_train_bucket_len(const rl_train_bucket_plan *p, size_t b);
/* Elements one rank holds of state sharded over world ranks along the
 * buckets: each bucket of len splits into world blocks of len / world and a
 * tail of len % world that every rank holds. *tails (may be NULL) gets the
 * tails' sum, so world x result = n + (world - 1) x tails. */
size_t rl_train_shard_elems(const rl_train_bucket_plan *p, int world, size_t *tails);

/* "gradients" on the CPU (pkg/ddp's scatter) holds, besides the shard's
 * reduced gradient: at most the window of gradients handed to the comm
 * thread and not yet cleared, what backward writes between two watermarks
 * (the classifier, a decoder layer or the embedding: rl_train_stretch), up
 * to a bucket written but not yet whole, and a page where two buckets meet.
 * The window is the larger of two buckets and a stretch, so backward
 * waits for the reduction only when it falls behind by more than that. */
size_t rl_train_stretch(const rl_model_config *c);
size_t rl_train_scatter_window(size_t stretch, const rl_train_bucket_plan *p);

/* The per-rank bytes of training cfg on world ranks, by category, for
 * cfg->dist.shard and cfg->train.device ("cpu" or "cuda": settle "auto"
 * with rl_train_pick_device first). nparams 0: the model's layout total.
 * At world 1 every mode is "none" (nothing to shard, nothing to scatter).
 * Pure: allocates nothing. RL_EINPUT names a field it cannot account for. */
int rl_train_memory_of(const rl_job_config *cfg, int world, size_t nparams, rl_train_memory *out,
                       rl_err *e);

#endif
