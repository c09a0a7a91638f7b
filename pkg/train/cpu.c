/* The trainer on the CPU: the reference model of pkg/model behind the
 * device seam (device.h). The host state is the model's own, so there is
 * nothing to download or upload, and a checkpoint's snapshot is a copy in
 * the pause. */
#include <math.h>
#include <stdlib.h>

#include "device.h"

typedef struct cpu_dev {
    rl_model model;  /* its params are the device's host params */
    double loss_sum; /* this step's micro-batch losses, summed in double */
    bool fresh;      /* no backward since zero_grad: the next one overwrites */
} cpu_dev;

static cpu_dev *ctx(rl_train_device *d) { return d->impl; }

static int cpu_zero_grad(rl_train_device *d, rl_err *e) {
    (void)e;
    /* nothing to clear: the step's first backward writes over the buffer */
    ctx(d)->fresh = true, ctx(d)->loss_sum = 0;
    return RL_OK;
}

static int cpu_micro(rl_train_device *d, const int32_t *inputs, const int32_t *targets, float scale,
                     rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    const rl_train_config *t = &d->cfg->train;
    cpu_dev *c = ctx(d);
    float loss;
    int rc = rl_model_forward(&c->model, inputs, targets, t->micro_batch, t->seq_len, &loss, e);
    if (rc) return rc;
    /* a shard with its own gradient: every pass's reduction takes the
     * buffer's contents away (and gives its pages back), so each pass writes */
    rl_model_backward(&c->model, scale, c->fresh || (d->shard && d->shard->grad), hook, hook_ctx);
    c->fresh = false;
    c->loss_sum += loss;
    return RL_OK;
}

static int cpu_step_end(rl_train_device *d, const rl_train_update *u, double *loss, double *norm,
                        rl_err *e) {
    cpu_dev *c = ctx(d);
    double sq;
    *loss = c->loss_sum / d->micros;
    int rc = rl_train_host_grad_sq(d, u, c->model.grads, &sq, e);
    if (rc) return rc;
    *norm = sqrt(sq);
    if (!isfinite(*norm)) return RL_OK;
    rl_train_host_adamw(d, u, c->model.params, c->model.grads, rl_clip_factor(*norm, u->clip), 0, d->n);
    return d->shard ? u->gather(u->dist_ctx, c->model.params, false, e) : RL_OK;
}

static int cpu_eval(rl_train_device *d, const int32_t *inputs, const int32_t *targets, int B, int T,
                    float *loss, rl_err *e) {
    return rl_model_forward(&ctx(d)->model, inputs, targets, B, T, loss, e);
}

static float *cpu_grads(rl_train_device *d) { return ctx(d)->model.grads; }
static void *cpu_stream(rl_train_device *d) { return (void)d, NULL; }

static int cpu_take(rl_train_device *d, float *params, float *m, float *v, bool *later, rl_err *e) {
    (void)later, (void)e;
    rl_train_host_take(d, params, m, v);
    return RL_OK;
}

static int cpu_sync(rl_train_device *d, bool opt, rl_err *e) { return (void)d, (void)opt, (void)e, RL_OK; }

static void cpu_close(rl_train_device *d) {
    cpu_dev *c = ctx(d);
    if (!c) return;
    rl_model_destroy(&c->model);
    free(c);
    d->impl = NULL, d->params = NULL;
}

static const rl_train_device_ops cpu_ops = {
    .zero_grad = cpu_zero_grad,
    .micro = cpu_micro,
    .step_end = cpu_step_end,
    .eval = cpu_eval,
    .grads = cpu_grads,
    .stream = cpu_stream,
    .take = cpu_take,
    .download = cpu_sync,
    .upload = cpu_sync,
    .close = cpu_close,
};

int rl_train_cpu_open(rl_train_device *d, rl_err *e) {
    const rl_job_config *cfg = d->cfg;
    cpu_dev *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "trainer: out of memory");
    int rc = rl_model_create(&c->model, &cfg->model, cfg->train.micro_batch, cfg->train.seq_len, e);
    if (rc) {
        free(c);
        return rc;
    }
    d->ops = &cpu_ops, d->impl = c;
    d->n = c->model.lay.total;
    d->params = c->model.params;
    return RL_OK;
}
