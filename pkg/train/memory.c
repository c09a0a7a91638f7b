/* Memory accounting: per-rank bytes of the training state (memory.h). */
#include "memory.h"

#include <string.h>
#include <unistd.h> /* sysconf: the page size */

#include "kernels/gpu_layout.h" /* the GPU model's own buffer layout (host C) */
#include "model/cpu.h"          /* rl_act_layout_init, rl_scratch_layout_init: the CPU model's own sizing */

#define F32 sizeof(float)
#define BF16 sizeof(uint16_t)

/* ---- the bucket plan (pkg/ddp cuts its buckets with it) ------------------------------------ */
size_t rl_train_mib_bytes(double mib) { return (size_t)(mib * (1 << 20)); }

int rl_train_bucket_plan_of(size_t n, size_t first_bytes, size_t bucket_bytes, int min_buckets,
                            rl_train_bucket_plan *p, rl_err *e) {
    memset(p, 0, sizeof *p);
    size_t first = (first_bytes ? first_bytes : 1u << 20) / F32, rest = (bucket_bytes ? bucket_bytes : 25u << 20) / F32;
    if (first == 0 || rest == 0)
        return rl_errf(e, RL_EINPUT, "dist.bucket_mb, dist.first_bucket_mb: at least 4 bytes");
    size_t minb = min_buckets > 0 ? (size_t)min_buckets : 8, most = (n + minb - 1) / minb;
    if (most > 0 && first > most) first = most;
    if (most > 0 && rest > most) rest = most;
    p->n = n, p->first = n < first ? n : first, p->rest = rest;
    /* bucket 0, then (n - first) / rest full buckets, then what is left */
    size_t after = n - p->first;
    p->count = (n > 0) + after / rest + (after % rest > 0);
    size_t second = after < rest ? after : rest; /* bucket 1; the later ones are no longer */
    p->largest = p->first > second ? p->first : second;
    return RL_OK;
}

size_t rl_train_bucket_len(const rl_train_bucket_plan *p, size_t b) {
    if (b == 0 || p->rest == 0) return b == 0 ? p->first : 0; /* rest 0: a zeroed plan */
    size_t after = p->n - p->first, full = after / p->rest;
    return b <= full ? p->rest : b == full + 1 ? after % p->rest : 0;
}

/* closed form, not a loop over buckets: bucket_mb may make billions of them */
size_t rl_train_shard_elems(const rl_train_bucket_plan *p, int world, size_t *tails) {
    if (p->rest == 0) { /* a zeroed plan: nothing to split */
        if (tails) *tails = 0;
        return p->n;
    }
    size_t w = (size_t)(world > 0 ? world : 1), after = p->n - p->first, full = after / p->rest;
    size_t last = after % p->rest;
    size_t tail = p->first % w + full * (p->rest % w) + last % w;
    if (tails) *tails = tail;
    return p->first / w + full * (p->rest / w) + last / w + tail;
}

/* ---- activations on the CPU: what rl_model_create allocates besides params and grads -- */
static size_t floats64(size_t n) { return (n * F32 + 63) / 64 * 64; } /* alloc_floats' rounding */

static size_t cpu_activations(const rl_model_config *c, int B, int T) {
    rl_act_layout al;
    rl_scratch_layout sl;
    rl_act_layout_init(&al, c, B, T);
    rl_scratch_layout_init(&sl, c, B, T);
    size_t rope = (size_t)c->max_position_embeddings * (size_t)rl_model_head_dim(c);
    return floats64(al.total) + floats64(sl.total) + floats64(rope) + 2 * (size_t)B * T * sizeof(int32_t);
}

/* ---- the state, by device ------------------------------------------------------------- */
size_t rl_train_stretch(const rl_model_config *c) {
    rl_param_layout lay;
    rl_param_layout_init(&lay, c);
    size_t vd = (size_t)c->vocab_size * (size_t)c->hidden_size;
    return vd > lay.layer_size ? vd : lay.layer_size;
}

size_t rl_train_scatter_window(size_t stretch, const rl_train_bucket_plan *p) {
    return 2 * p->largest > stretch ? 2 * p->largest : stretch;
}

/* cpu: the fp32 params are the master; the flat gradient buffer is whole
 * but with "gradients" (p: its buckets), where it holds the shard's
 * reduced gradient and what is in flight (memory.h), never more than the
 * whole buffer and the shard. */
static void cpu_state(rl_train_memory *m, const rl_job_config *cfg, size_t n, const rl_train_bucket_plan *p) {
    m->weights = n * F32, m->master = 0, m->grads = n * F32;
    if (p) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE), s = rl_train_stretch(&cfg->model);
        size_t flight = (rl_train_scatter_window(s, p) + s + p->largest) * F32 + (p->count + 4) * page;
        m->grads = m->shard_elems * F32 + (flight < n * F32 ? flight : n * F32);
    }
    m->activations = cpu_activations(&cfg->model, cfg->train.micro_batch, cfg->train.seq_len);
}

/* cuda: bf16 compute copy and fp32 gradients, both with the vocabulary
 * padded to a multiple of 64 rows (as the model allocates them); the
 * gradients whole but with "gradients" (slotted), where the model's
 * gradient slots and the shard's own gradient (DDP's) hold them; the fp32
 * master sharded as the moments are (the forward reads only the bf16 copy;
 * llama_gpu.h), neither on the GPU with train.offload (whose gradients
 * leave through the slots too). */
static void gpu_state(rl_train_memory *m, const rl_job_config *cfg, size_t n, bool slotted) {
    const rl_train_config *t = &cfg->train;
    rl_gpu_layout l; /* options as the trainer sets them: no fp32 dQ accumulator, default chunks */
    rl_gpu_layout_of(&cfg->model, t->micro_batch, t->seq_len, t->recompute, 0, 0, &l);
    size_t pad = (size_t)(l.Vp - cfg->model.vocab_size) * (size_t)cfg->model.hidden_size;
    m->weights = (n + pad) * BF16;
    m->master = m->shard_elems * F32;
    m->grads = slotted ? (RL_GPU_GRAD_SLOTS * rl_gpu_grad_slot_len(&cfg->model) + m->shard_elems) * F32
                       : (n + pad) * F32;
    if (strcmp(t->offload, "none")) { /* the state in the host's memory, the gradients through slots */
        m->master = m->moments = 0;
        m->grads = RL_GPU_GRAD_SLOTS * rl_gpu_grad_slot_len(&cfg->model) * F32;
    }
    if (!strcmp(t->offload, "layers")) { /* the embedding and head, a ring of layers */
        rl_param_layout lay;
        rl_param_layout_init(&lay, &cfg->model);
        size_t layers = (size_t)cfg->model.num_hidden_layers * lay.layer_size;
        /* sharded, one layer more: the buffer its gather from the ranks goes through (offload.c) */
        size_t ring = RL_GPU_LAYER_RING + (m->shard_elems < n);
        m->weights = (n + pad - layers + ring * lay.layer_size) * BF16;
    }
    /* cuDNN's attention workspace (train.attention cudnn) is not counted */
    m->activations = l.acts + l.scratch;
}

/* A GPU's "gradients" buckets are its gradient regions (pkg/ddp's
 * opts.regions): each splits into world blocks and a shared tail. */
static size_t region_shard_elems(const rl_model_config *c, int world) {
    size_t w = (size_t)world, held = 0, off, len;
    for (int k = 0; k < rl_gpu_grad_regions(c, NULL); k++) {
        rl_gpu_grad_region(c, k, &off, &len);
        held += len / w + len % w;
    }
    return held;
}

static int check(const rl_job_config *cfg, int world, rl_err *e) {
    if (world < 1) return rl_errf(e, RL_EINPUT, "memory: world size %d must be at least 1", world);
    if (strcmp(cfg->train.device, "cpu") && strcmp(cfg->train.device, "cuda"))
        return rl_errf(e, RL_EINPUT, "train.device: \"%s\" is not cpu or cuda (settle auto first)",
                       cfg->train.device);
    if (cfg->train.micro_batch < 1 || cfg->train.seq_len < 1)
        return rl_errf(e, RL_EINPUT, "train.micro_batch, train.seq_len: must be positive");
    return rl_model_config_validate(&cfg->model, "model", e);
}

int rl_train_memory_of(const rl_job_config *cfg, int world, size_t nparams, rl_train_memory *out,
                       rl_err *e) {
    memset(out, 0, sizeof *out);
    int rc = check(cfg, world, e);
    if (rc) return rc;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &cfg->model);
    size_t n = nparams ? nparams : lay.total;
    rl_shard_mode mode = world > 1 ? rl_shard_mode_of(cfg->dist.shard) : RL_SHARD_NONE;
    const rl_dist_config *d = &cfg->dist;
    rl_train_bucket_plan p = {0};
    /* the GPU's regions are the buckets with "gradients" and with
     * train.offload (a count other than the model's: no regions to cut by) */
    bool cuda = !strcmp(cfg->train.device, "cuda"), off = strcmp(cfg->train.offload, "none") != 0;
    bool slotted = cuda && n == lay.total && (mode == RL_SHARD_GRADIENTS || (off && mode != RL_SHARD_NONE));
    if (mode != RL_SHARD_NONE && !slotted &&
        (rc = rl_train_bucket_plan_of(n, rl_train_mib_bytes(d->first_bucket_mb), rl_train_mib_bytes(d->bucket_mb),
                                      d->min_buckets, &p, e)))
        return rc;
    out->shard_elems = mode == RL_SHARD_NONE ? n
                       : slotted           ? region_shard_elems(&cfg->model, world)
                                           : rl_train_shard_elems(&p, world, NULL);
    out->moments = 2 * out->shard_elems * F32;
    if (cuda) gpu_state(out, cfg, n, slotted);
    else cpu_state(out, cfg, n, mode == RL_SHARD_GRADIENTS ? &p : NULL);
    out->total = out->weights + out->master + out->grads + out->moments + out->activations;
    return RL_OK;
}
