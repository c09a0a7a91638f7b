/* The device dispatcher (device.h): picks the implementation, checks each
 * call's arguments and the order of a step once for every device, and
 * owns the host's AdamW moments, which every device keeps alike.
 *
 * A failed check is RL_EINTERNAL: the trainer is the only caller, so a bad
 * argument is a bug in it, reported instead of handed to a kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

static int check_open(const rl_train_device *d, const char *op, rl_err *e) {
    if (!d || !d->ops) return rl_errf(e, RL_EINTERNAL, "train device: %s on a device that is not open", op);
    return RL_OK;
}

int rl_train_dev_open(rl_train_device *d, const rl_job_config *cfg, int local_rank, int world, rl_err *e) {
    memset(d, 0, sizeof *d);
    d->cfg = cfg, d->world = world;
    /* the one place the device's name is read: rl_train_pick_device left
     * "cpu" or "cuda" */
    int rc = strcmp(cfg->train.device, "cuda") == 0 ? rl_train_gpu_open(d, local_rank, e)
                                                    : rl_train_cpu_open(d, e);
    if (rc) {
        memset(d, 0, sizeof *d);
        return rc;
    }
    d->impl_opt = d->opt != NULL;
    if (!d->opt) d->opt = calloc(2 * d->n, sizeof(float));
    if (!d->opt) {
        rl_train_dev_close(d);
        return rl_errf(e, RL_ENOMEM, "trainer: out of memory for optimizer state (%zu MiB)",
                       2 * d->n * sizeof(float) >> 20);
    }
    return RL_OK;
}

void rl_train_dev_close(rl_train_device *d) {
    if (!d) return;
    if (d->ops) d->ops->close(d);
    free(d->ranges);
    free(d->opt);
    memset(d, 0, sizeof *d);
}

int rl_train_dev_zero_grad(rl_train_device *d, rl_err *e) {
    int rc = check_open(d, "zero_grad", e);
    if (rc) return rc;
    d->micros = 0;
    return d->ops->zero_grad(d, e);
}

int rl_train_dev_micro(rl_train_device *d, const int32_t *inputs, const int32_t *targets,
                       float scale, rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    int rc = check_open(d, "micro", e);
    if (rc) return rc;
    if (!inputs || !targets || !(scale > 0) || !isfinite(scale))
        return rl_errf(e, RL_EINTERNAL, "train device: micro-batch without tokens or with scale %g",
                       (double)scale);
    if ((rc = d->ops->micro(d, inputs, targets, scale, hook, hook_ctx, e))) return rc;
    d->micros++;
    return RL_OK;
}

int rl_train_dev_step_end(rl_train_device *d, const rl_train_update *u, double *loss,
                          double *norm, rl_err *e) {
    int rc = check_open(d, "step_end", e);
    if (rc) return rc;
    if (d->micros < 1)
        return rl_errf(e, RL_EINTERNAL, "train device: step end without a micro-batch since zero_grad");
    if (!u || !loss || !norm || u->t < 1 || !(u->lr >= 0) || !isfinite(u->lr))
        return rl_errf(e, RL_EINTERNAL, "train device: step end with AdamW step %lld, lr %g",
                       u ? u->t : 0, u ? u->lr : 0.0);
    if (d->shard && (!u->sum || !u->gather))
        return rl_errf(e, RL_EINTERNAL, "train device: a sharded step end without the seam's sum and gather");
    return d->ops->step_end(d, u, loss, norm, e);
}

int rl_train_dev_eval(rl_train_device *d, const int32_t *inputs, const int32_t *targets, int B,
                      int T, float *loss, rl_err *e) {
    int rc = check_open(d, "eval", e);
    if (rc) return rc;
    const rl_train_config *t = &d->cfg->train;
    if (!inputs || !targets || !loss || B < 1 || B > t->micro_batch || T < 1 || T > t->seq_len)
        return rl_errf(e, RL_EINTERNAL, "train device: eval of %d x %d beyond the model's %d x %d", B,
                       T, t->micro_batch, t->seq_len);
    return d->ops->eval(d, inputs, targets, B, T, loss, e);
}

float *rl_train_dev_grads(rl_train_device *d) { return d && d->ops ? d->ops->grads(d) : NULL; }
void *rl_train_dev_stream(rl_train_device *d) { return d && d->ops ? d->ops->stream(d) : NULL; }

/* take and fill run for the saver (fill on its thread); ctx is the device */
int rl_train_dev_take(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e) {
    rl_train_device *d = ctx;
    int rc = check_open(d, "checkpoint take", e);
    if (rc) return rc;
    if ((!params && !d->shard) || !m || !v || !later)
        return rl_errf(e, RL_EINTERNAL, "train device: checkpoint take without a snapshot buffer");
    *later = false;
    return d->ops->take(d, params, m, v, later, e);
}

int rl_train_dev_fill(void *ctx, float *params, float *m, float *v, rl_err *e) {
    rl_train_device *d = ctx;
    int rc = check_open(d, "checkpoint fill", e);
    if (rc) return rc;
    if ((!params && !d->shard) || !m || !v)
        return rl_errf(e, RL_EINTERNAL, "train device: checkpoint fill without a snapshot buffer");
    if (!d->ops->fill) return rl_errf(e, RL_EINTERNAL, "train device: checkpoint fill without a staged take");
    return d->ops->fill(d, params, m, v, e);
}

int rl_train_dev_set_shard(rl_train_device *d, const rl_train_dist *dist, rl_err *e) {
    int rc = check_open(d, "set_shard", e);
    if (rc) return rc;
    const rl_train_shard *shard = dist ? dist->shard : NULL;
    size_t held = shard ? shard->total : d->n;
    if (d->impl_opt) return rl_errf(e, RL_EINTERNAL, "train device: a shard of moments the implementation keeps");
    if (shard && (shard->n < 0 || held > d->n || (held > 0 && !shard->r) || !dist->gather))
        return rl_errf(e, RL_EINTERNAL, "train device: a shard of %zu elements of %zu (or no gather)", held, d->n);
    /* the device's own copy of the ranges: the seam's go with its round */
    float *opt = calloc(2 * held > 0 ? 2 * held : 1, sizeof(float));
    rl_shard_range *r = shard ? malloc(((size_t)shard->n + 1) * sizeof *r) : NULL;
    if (!opt || (shard && !r)) {
        free(opt), free(r);
        return rl_errf(e, RL_ENOMEM, "trainer: out of memory for optimizer state (%zu MiB)",
                       2 * held * sizeof(float) >> 20);
    }
    if (shard) memcpy(r, shard->r, (size_t)shard->n * sizeof *r);
    free(d->opt), free(d->ranges);
    d->opt = opt, d->ranges = r, d->rank = shard ? dist->rank : 0;
    d->gather = shard ? dist->gather : NULL, d->gather_ctx = shard ? dist->ctx : NULL;
    d->gathered = shard ? dist->gathered : NULL;
    d->gather_region = shard ? dist->gather_region : NULL;
    d->grad_slot = shard ? dist->grad_slot : NULL;
    /* the seam's gradient (if it has one) is its round's too: a new round sets the shard again */
    d->own_shard = shard ? (rl_train_shard){.n = shard->n, .r = r, .total = shard->total, .grad = shard->grad}
                         : (rl_train_shard){0};
    d->shard = shard ? &d->own_shard : NULL;
    return d->ops->set_shard ? d->ops->set_shard(d, e) : RL_OK;
}

void rl_train_dev_waits(rl_train_device *d, double *stream_s, double *host_s) {
    *stream_s = *host_s = -1;
    if (d->ops && d->ops->waits) d->ops->waits(d, stream_s, host_s);
}

int rl_train_dev_download(rl_train_device *d, bool opt, rl_err *e) {
    int rc = check_open(d, "download", e);
    return rc ? rc : d->ops->download(d, opt, e);
}

int rl_train_dev_upload(rl_train_device *d, bool opt, rl_err *e) {
    int rc = check_open(d, "upload", e);
    return rc ? rc : d->ops->upload(d, opt, e);
}

int rl_train_dev_settle(rl_train_device *d, rl_err *e) {
    int rc = check_open(d, "settle", e);
    return rc || !d->ops->settle ? rc : d->ops->settle(d, e);
}

int rl_train_dev_share(rl_train_device *d, const rl_train_dist *dist, rl_err *e) {
    int rc = check_open(d, "share", e);
    if (!rc && !dist) rc = rl_errf(e, RL_EINTERNAL, "train device: share without a seam");
    return rc || !d->ops->share ? rc : d->ops->share(d, dist, e);
}

int rl_train_dev_unshare(rl_train_device *d, bool *whole, rl_err *e) {
    *whole = true;
    int rc = check_open(d, "unshare", e);
    return rc || !d->ops->unshare ? rc : d->ops->unshare(d, whole, e);
}

/* ---- the host's optimizer (cpu.c, and a GPU whose state stays on the host) ---- */
/* Tensor by tensor within each range, as weight decay applies to some
 * tensors only. A range's moments follow the previous range's in opt, and
 * so does its gradient where the shard has its own (shard.grad). */
void rl_train_host_adamw(rl_train_device *d, const rl_train_update *u, float *params, const float *grads,
                         double grad_scale, size_t from, size_t to) {
    const rl_train_config *t = &d->cfg->train;
    const rl_shard_range whole = {.off = 0, .len = d->n};
    const rl_shard_range *r = d->shard ? d->shard->r : &whole;
    int nr = d->shard ? d->shard->n : 1, nt = rl_model_n_tensors(&d->cfg->model);
    size_t held = d->shard ? d->shard->total : d->n, base = 0;
    float *mom = d->opt, *var = d->opt + held;
    const float *own = d->shard ? d->shard->grad : NULL;
    for (int k = 0; k < nr; base += r[k].len, k++)
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&d->cfg->model, i, &ti);
            size_t lo = ti.offset > r[k].off ? ti.offset : r[k].off;
            size_t hi = ti.offset + ti.numel < r[k].off + r[k].len ? ti.offset + ti.numel : r[k].off + r[k].len;
            lo = lo > from ? lo : from, hi = hi < to ? hi : to;
            if (lo >= hi) continue;
            size_t at = base + (lo - r[k].off);
            rl_adamw_update(params + lo, own ? own + at : grads + (lo - from), mom + at, var + at, hi - lo, u->lr, t->beta1,
                            t->beta2, t->eps, ti.decay ? t->weight_decay : 0.0, u->t, grad_scale);
        }
}

void rl_train_host_take(const rl_train_device *d, float *params, float *m, float *v) {
    size_t held = d->shard ? d->shard->total : d->n;
    if (params) memcpy(params, d->params, d->n * sizeof(float));
    memcpy(m, d->opt, held * sizeof(float));
    memcpy(v, d->opt + held, held * sizeof(float));
}

int rl_train_host_grad_sq(rl_train_device *d, const rl_train_update *u, const float *g, double *sq, rl_err *e) {
    if (!d->shard) return *sq = rl_grad_sq(g, d->n), RL_OK;
    *sq = 0;
    const float *own = d->shard->grad;
    for (size_t k = 0, at = 0; k < (size_t)d->shard->n; at += d->shard->r[k].len, k++) {
        const rl_shard_range *r = &d->shard->r[k];
        if (!r->shared || d->rank == 0) *sq += rl_grad_sq(own ? own + at : g + r->off, r->len);
    }
    return u->sum(u->dist_ctx, sq, 1, e);
}
