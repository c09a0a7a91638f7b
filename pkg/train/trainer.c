/* The training loop: accumulate micro-batches to the fixed global batch,
 * reduce (when distributed), clip, AdamW; evaluate; log; checkpoints and
 * resume. Whatever depends on the device goes through the device seam
 * (device.h): the loop never asks where the model runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/gpu_layout.h" /* the GPU model's gradient regions */
#include "memory.h"
#include "train_gpu.h"
#include "trainer_internal.h"

static int rank_of(const rl_trainer *tr) { return tr->dist ? tr->dist->rank : 0; }
static int world_of(const rl_trainer *tr) { return tr->dist ? tr->dist->world : 1; }

/* Who writes checkpoints: rank 0, and with sharded state every rank (its
 * own optimizer shard). */
static bool saves(const rl_job_config *c, int rank, int world) {
    return c->ckpt.uri[0] && (rank == 0 || (world > 1 && rl_shard_mode_of(c->dist.shard) != RL_SHARD_NONE));
}

/* The loader reads this rank's slice of every global batch from tr->sample
 * on: a global index, so any world size continues with the same samples. */
static int open_loader(rl_trainer *tr, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    int world = world_of(tr), rank = rank_of(tr);
    long long seqs = t->global_batch_tokens / t->seq_len;
    if (tr->loader) rl_loader_close(tr->loader), tr->loader = NULL;
    rl_loader_opts lo = {
        .batch = t->micro_batch,
        .seq_len = t->seq_len,
        .global_batch = (int)seqs,
        .rank_count = (int)(seqs / world),
        .rank_offset = rank * (int)(seqs / world),
        .start = tr->sample,
        .seed = t->seed,
        .shuffle = true,
        .depth = 2 * tr->accum < 8 ? 2 * tr->accum : 8,
        .timeout_s = 120,
    };
    return rl_loader_open(tr->train_ds, &lo, &tr->loader, e);
}

/* Everything rl_trainer_new builds; on failure the caller frees what is
 * there (rl_trainer_free takes a half-built trainer). */
static int init(rl_trainer *tr, const rl_job_config *cfg, rl_train_dist *dist, rl_err *e) {
    tr->cfg = *cfg;
    tr->dist = dist;
    cfg = &tr->cfg; /* from here on the settled copy */
    const rl_train_config *t = &cfg->train;
    int world = world_of(tr), rank = rank_of(tr);
    int rc = rl_job_config_check_world(cfg, world, "config", e);
    if (rc || (rc = rl_train_pick_device(&tr->cfg, e))) return rc;
    long long seqs = t->global_batch_tokens / t->seq_len;
    tr->accum = (int)(seqs / world / t->micro_batch);
    int local_rank = tr->local_rank = dist ? dist->local_rank : 0;
    if ((rc = rl_train_dev_open(&tr->dev, cfg, local_rank, world, e))) return rc;
    tr->dev.dist = dist;
    size_t n = tr->dev.n;
    rl_model_init_params(&cfg->model, tr->dev.params, t->seed);
    if ((rc = rl_train_dev_upload(&tr->dev, false, e))) return rc;
    size_t bt = (size_t)t->micro_batch * t->seq_len;
    tr->inputs = malloc(bt * sizeof(int32_t));
    tr->targets = malloc(bt * sizeof(int32_t));
    if (!tr->inputs || !tr->targets) return rl_errf(e, RL_ENOMEM, "trainer: out of memory for a micro-batch");
    if ((rc = rl_train_tokenizer_open(tr, e)) ||
        (rc = rl_dataset_open(cfg->data.train, cfg->model.vocab_size, &tr->train_ds, e)) ||
        (cfg->data.val[0] && (rc = rl_dataset_open(cfg->data.val, cfg->model.vocab_size, &tr->val_ds, e))))
        return rc;
    /* The baseline a learning model must beat (first 4M tokens suffice). */
    if ((rc = rl_dataset_unigram_entropy(tr->train_ds, 1u << 22, &tr->summary.unigram_entropy, e)) ||
        (rc = open_loader(tr, e)))
        return rc;
    /* a stream of its own, apart from the parameter init's */
    rl_rng_seed(&tr->rng, t->seed ^ 0x7261696e6572ull);
    tr->committed_step = -1;
    tr->observed_ckpt = -1;
    tr->flops_per_token = rl_train_flops_per_token(&cfg->model, t->seq_len, n);
    tr->summary.resumed_from = -1;
    if (saves(cfg, rank, world)) {
        rl_ckpt_store *st;
        if ((rc = rl_ckpt_store_open_cfg(&cfg->ckpt, &st, e)) || (rc = rl_trainer_use_store(tr, st, e)))
            return rc;
    }
    rl_train_log_device(cfg, local_rank);
    tr->tty = rank == 0 && isatty(STDERR_FILENO) && !getenv("RL_NO_PROGRESS");
    tr->t_start = rl_now();
    tr->last_save_t = tr->t_start;
    return RL_OK;
}

int rl_trainer_new(rl_trainer **out, const rl_job_config *cfg, rl_train_dist *dist, rl_err *e) {
    *out = NULL;
    rl_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return rl_errf(e, RL_ENOMEM, "trainer: out of memory");
    int rc = init(tr, cfg, dist, e);
    if (rc) {
        rl_trainer_free(tr);
        return rc;
    }
    *out = tr;
    return RL_OK;
}

int rl_trainer_set_dist(rl_trainer *tr, rl_train_dist *dist, rl_err *e) {
    if (!tr->dist || !dist || dist->local_rank != tr->local_rank)
        return rl_errf(e, RL_EINTERNAL, "trainer: a new world keeps the process's device (local rank %d)",
                       tr->local_rank);
    if (tr->dev.shard && !tr->cfg.ckpt.uri[0])
        return rl_errf(e, RL_EINPUT, "dist.shard \"%s\": the AdamW state is sharded over the old round's ranks and "
                       "no checkpoint.uri keeps it, so this process cannot carry it into a new round", tr->cfg.dist.shard);
    /* a host state the old round's ranks shared: a copy of this rank's own */
    bool whole;
    int rc = rl_train_dev_unshare(&tr->dev, &whole, e);
    if (rc) return rc;
    if (!whole && !tr->cfg.ckpt.uri[0])
        return rl_errf(e, RL_EINPUT, "train.offload_share: a lost rank's part of the last update is missing from the "
                       "host state the ranks shared and no checkpoint.uri keeps one, so this process cannot carry it "
                       "into a new round");
    if ((rc = rl_job_config_check_world(&tr->cfg, dist->world, "config", e))) return rc;
    const rl_train_config *t = &tr->cfg.train;
    tr->dist = dist;
    tr->dev.dist = dist;
    tr->accum = (int)(t->global_batch_tokens / t->seq_len / dist->world / t->micro_batch);
    tr->resume_done = false;
    tr->stop_agreed = tr->yield_agreed = false;
    tr->summary.yielded = false;
    if (!whole) tr->live = false; /* the next resume reads the checkpoint, or a whole replica */
    /* the moments of the other ranks' shards left with the old round: the
     * next resume reads the checkpoint (the yield's, or the cadence's) */
    if (tr->dev.shard) {
        tr->live = false;
        rl_ckpt_saver_cancel(tr->saver); /* a save of the old round still waiting for its shards is not one */
    }
    /* the checkpoints go with rank 0, wherever it is now */
    bool saving = saves(&tr->cfg, dist->rank, dist->world);
    if (!saving && tr->store) {
        rl_ckpt_saver_destroy(tr->saver); /* waits for a running save */
        rl_ckpt_store_close(tr->store);
        tr->saver = NULL, tr->store = NULL;
    } else if (saving && !tr->store) {
        rl_ckpt_store *st;
        if ((rc = rl_ckpt_store_open_cfg(&tr->cfg.ckpt, &st, e)) || (rc = rl_trainer_use_store(tr, st, e))) return rc;
        tr->committed_step = -1;
    }
    tr->tty = dist->rank == 0 && isatty(STDERR_FILENO) && !getenv("RL_NO_PROGRESS");
    /* this rank's slice from the step in progress on (rl_trainer_resume
     * then adopts the root's position) */
    return open_loader(tr, e);
}

/* A saver for the store, sized for what this rank snapshots: everything,
 * or with a shard its moments (and on rank 0 the parameters). */
static int make_saver(rl_trainer *tr, rl_err *e) {
    rl_ckpt_saver_destroy(tr->saver);
    tr->saver = NULL;
    const rl_train_shard *sh = tr->dev.shard;
    rl_ckpt_saver_opts so = {.keep = tr->cfg.ckpt.keep,
                             .skip_when_busy = strcmp(tr->cfg.ckpt.when_busy, "skip") == 0,
                             .opt_n = sh ? sh->total : 0,
                             .no_params = sh && rank_of(tr) != 0};
    return rl_ckpt_saver_create(tr->store, tr->dev.n, &so, &tr->saver, e);
}

int rl_trainer_use_store(rl_trainer *tr, rl_ckpt_store *s, rl_err *e) {
    rl_ckpt_saver_destroy(tr->saver);
    tr->saver = NULL;
    rl_ckpt_store_close(tr->store);
    tr->store = s;
    return make_saver(tr, e);
}

void rl_trainer_free(rl_trainer *tr) {
    if (!tr) return;
    rl_ckpt_saver_cancel(tr->saver); /* a sharded save waiting for shards that will not come */
    rl_ckpt_saver_destroy(tr->saver); /* waits for a running save */
    rl_ckpt_store_close(tr->store);
    if (tr->loader) rl_loader_close(tr->loader);
    if (tr->train_ds) rl_dataset_close(tr->train_ds);
    if (tr->val_ds) rl_dataset_close(tr->val_ds);
    rl_train_dev_close(&tr->dev);
    rl_train_tokenizer_free(tr);
    free(tr->inputs);
    free(tr->targets);
    free(tr->regions);
    free(tr);
}

/* After a step: is a cadence checkpoint due? Rank 0's clock decides (the
 * step's average makes it every rank's: with sharded state all save);
 * the last step gets the synchronous final checkpoint instead. */
static bool save_due(const rl_trainer *tr) {
    const rl_ckpt_config *c = &tr->cfg.ckpt;
    if (!tr->saver || rank_of(tr) != 0 || tr->step >= tr->cfg.train.steps || tr->step == tr->committed_step)
        return false;
    return (c->every_steps > 0 && tr->step % c->every_steps == 0) ||
           (c->every_minutes > 0 && rl_now() - tr->last_save_t >= 60 * c->every_minutes);
}

int rl_trainer_step(rl_trainer *tr, rl_step_stats *st, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    if (tr->dist && tr->dist->shard && !tr->resume_done)
        return rl_errf(e, RL_EINTERNAL, "trainer: a sharded seam, but no rl_trainer_resume yet to shard the state");
    double t0 = rl_now();
    int rc = rl_train_dev_zero_grad(&tr->dev, e);
    if (rc) return rc;
    for (int k = 0; k < tr->accum; k++) {
        if ((rc = rl_loader_next(tr->loader, tr->inputs, tr->targets, e))) return rc;
        /* no_sync: only the last micro-step's backward triggers reduction
         * (every one's when the seam scatters the gradients away) */
        bool last = k == tr->accum - 1;
        rl_grad_ready_fn hook = tr->dist && (last || tr->dist->reduce_each_micro) ? tr->dist->grad_ready : NULL;
        void *hctx = tr->dist ? tr->dist->ctx : NULL;
        float scale = 1.0f / (float)tr->accum;
        if ((rc = rl_train_dev_micro(&tr->dev, tr->inputs, tr->targets, scale, hook, hctx, e))) return rc;
    }
    double loss, norm, lr = rl_lr_at(t, tr->step);
    double ar_exposed = -1, ar_busy = -1;
    if (tr->dist && (rc = tr->dist->finish(tr->dist->ctx, e))) return rc;
    /* the update follows the reduction (on a GPU queued behind it, and the
     * step's one wait returns its loss and norm); a non-finite norm leaves
     * the weights alone for the check below */
    rl_train_update u = {.lr = lr, .clip = t->grad_clip, .t = tr->step + 1};
    if (tr->dist) u.dist_ctx = tr->dist->ctx, u.sum = tr->dist->sum, u.gather = tr->dist->gather;
    if ((rc = rl_train_dev_step_end(&tr->dev, &u, &loss, &norm, e))) return rc;
    double stream_wait, host_wait;
    rl_train_dev_waits(&tr->dev, &stream_wait, &host_wait);
    /* The update is applied: this rank holds the next step whole, which a
     * peer lost in the average below cannot undo. Counted here, so a live
     * resume (rl_trainer_resume) takes the most advanced replica. */
    tr->step++;
    tr->sample += (uint64_t)(t->global_batch_tokens / t->seq_len);
    tr->tokens_seen += (uint64_t)t->global_batch_tokens;
    tr->live = true;
    /* A signal reaches ranks at different times; riding on the loss
     * average, "someone was asked to stop" becomes one decision that every
     * rank takes after the same step; so does "the agent asked us to yield". */
    double agreed[4] = {loss, tr->stop && *tr->stop ? 1.0 : 0.0, tr->yield && *tr->yield ? 1.0 : 0.0,
                        save_due(tr) ? 1.0 : 0.0};
    if (tr->dist) {
        if ((rc = tr->dist->average(tr->dist->ctx, agreed, 4, e))) return rc;
        /* after the average: on a GPU finish only queued the reduction, and
         * its timing events are complete once the average (behind it on the
         * communicator) is; the average itself is not a bucket */
        if (tr->dist->timing) tr->dist->timing(tr->dist->ctx, &ar_exposed, &ar_busy);
    }
    loss = agreed[0];
    tr->stop_agreed = agreed[1] > 0;
    tr->yield_agreed = agreed[2] > 0;
    tr->save_agreed = agreed[3] > 0;
    if (!isfinite(norm) || !isfinite(loss))
        return rl_errf(e, RL_EINTERNAL, "step %lld: loss %g, gradient norm %g are not finite "
                       "(lower train.lr?)", tr->step, loss, norm);
    double now = rl_now();
    *st = (rl_step_stats){
        .step = tr->step,
        .loss = loss,
        .lr = lr,
        .grad_norm = norm,
        .step_s = now - t0,
        .elapsed_s = now - tr->t_start,
        .tokens_per_s = (double)t->global_batch_tokens / (now - t0),
        .allreduce_s = ar_exposed,
        .allreduce_busy_s = ar_busy,
        .grad_resident = tr->dist && tr->dist->grad_resident ? tr->dist->grad_resident(tr->dist->ctx) : 0,
        .stream_wait_s = stream_wait,
        .host_wait_s = host_wait,
    };
    return RL_OK;
}

double rl_train_flops_per_token(const rl_model_config *m, int seq_len, size_t nparams) {
    double embed = (double)m->vocab_size * m->hidden_size;
    double n = (double)nparams > embed ? (double)nparams - embed : (double)nparams;
    double attn = 12.0 * m->num_hidden_layers * (double)m->num_attention_heads * rl_model_head_dim(m) * seq_len;
    return 6.0 * n + attn;
}

int rl_trainer_eval_loss(rl_trainer *tr, double *loss, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    if (!tr->val_ds || t->eval_batches == 0) {
        *loss = -1;
        return RL_OK;
    }
    rl_sampler s;
    int rc = rl_sampler_init(&s, rl_dataset_tokens(tr->val_ds), t->seq_len, 0, false, e);
    if (rc) return rl_err_wrap(e, "data.val %s", tr->cfg.data.val);
    int B = t->micro_batch, T = t->seq_len, world = world_of(tr), rank = rank_of(tr);
    /* a rank may get no batch below: what the device's next forward would
     * issue to the other ranks goes now, on each */
    if ((rc = rl_train_dev_settle(&tr->dev, e))) return rc;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(T + 1));
    if (!buf) return rl_errf(e, RL_ENOMEM, "eval: out of memory");
    /* Batch j goes to rank j % world; sum and count are averaged across
     * ranks, so their ratio is the mean over every evaluated sequence. */
    double acc[2] = {0, 0};
    for (int j = rank; j < t->eval_batches; j += world) {
        for (int b = 0; b < B; b++) {
            uint64_t g = (uint64_t)j * B + b;
            if ((rc = rl_dataset_read(tr->val_ds, rl_sampler_offset(&s, g), (size_t)T + 1, buf, e)))
                goto out;
            memcpy(tr->inputs + (size_t)b * T, buf, sizeof(int32_t) * T);
            memcpy(tr->targets + (size_t)b * T, buf + 1, sizeof(int32_t) * T);
        }
        float l;
        if ((rc = rl_train_dev_eval(&tr->dev, tr->inputs, tr->targets, B, T, &l, e))) goto out;
        acc[0] += l, acc[1] += 1;
    }
    if (tr->dist && (rc = tr->dist->average(tr->dist->ctx, acc, 2, e))) goto out;
    *loss = acc[1] > 0 ? acc[0] / acc[1] : -1;
out:
    free(buf);
    return rc;
}

/* ---- progress: JSON lines, or a one-line bar on a terminal ------------------------- */
static void fmt_duration(char *dst, size_t n, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    long v = (long)(s + 0.5);
    if (v >= 3600) snprintf(dst, n, "%ldh%02ldm", v / 3600, v / 60 % 60);
    else if (v >= 60) snprintf(dst, n, "%ldm%02lds", v / 60, v % 60);
    else snprintf(dst, n, "%lds", v);
}

static void progress(rl_trainer *tr, const rl_step_stats *st, double avg_tps) {
    long long total = tr->cfg.train.steps;
    char eta[32], el[32], bar[31];
    double left = (double)(total - st->step) * (double)tr->cfg.train.global_batch_tokens;
    fmt_duration(eta, sizeof eta, avg_tps > 0 ? left / avg_tps : 0);
    fmt_duration(el, sizeof el, st->elapsed_s);
    int fill = total > 0 ? (int)(30 * st->step / total) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    char line[256];
    int n = snprintf(line, sizeof line,
                     "\r\033[K[%s] step %lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  %s  ETA %s",
                     bar, st->step, total, st->loss, st->lr, st->grad_norm, avg_tps, el, eta);
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

static void clear_progress(rl_trainer *tr) {
    if (!tr->tty) return;
    ssize_t w = write(STDERR_FILENO, "\r\033[K", 4);
    (void)w;
}

static int evaluate(rl_trainer *tr, const char *event, rl_err *e) {
    double vl;
    int rc = rl_trainer_eval_loss(tr, &vl, e);
    if (rc) return rc;
    tr->summary.val_loss = vl;
    if (vl >= 0 && rank_of(tr) == 0) {
        clear_progress(tr);
        rl_log(RL_LOG_INFO, event, "\"step\":%lld,\"val_loss\":%.5f", tr->step, vl);
    }
    return RL_OK;
}

/* ---- checkpoints -------------------------------------------------------------------------- */
static rl_ckpt_data ckpt_data(rl_trainer *tr, char *config_json) {
    size_t n = tr->dev.n;
    const rl_train_config *t = &tr->cfg.train;
    /* the saver's snapshot comes from the device (on a GPU straight from
     * its memory), not from the host copy params/m/v point at */
    rl_ckpt_data d = {
        .model = tr->cfg.model,
        .tok = tr->tok.json ? &tr->tok : NULL,
        .n = n,
        .params = tr->dev.params,
        .m = tr->dev.opt,
        .v = tr->dev.opt + n,
        .config_json = config_json,
        .take = rl_train_dev_take,
        .fill = rl_train_dev_fill,
        .snap_ctx = &tr->dev,
    };
    d.state = (rl_ckpt_state){
        .step = tr->step,
        .tokens_seen = tr->tokens_seen,
        .sample_index = tr->sample,
        .global_batch = (uint64_t)(t->global_batch_tokens / t->seq_len),
        .data_seed = t->seed,
        .lr = tr->step > 0 ? rl_lr_at(t, tr->step - 1) : 0,
        .next_lr = rl_lr_at(t, tr->step),
        .world_size = world_of(tr),
        .saved_unix = rl_wall_now(),
    };
    memcpy(d.state.rng, tr->rng.s, sizeof d.state.rng);
    const rl_train_shard *sh = tr->dev.shard;
    if (sh) {
        d.shard_rank = rank_of(tr), d.shard_world = world_of(tr);
        d.ranges = sh->r, d.nranges = sh->n, d.shard_total = sh->total, d.nonce = tr->nonce;
        d.m = tr->dev.opt, d.v = tr->dev.opt + sh->total;
        if (d.shard_rank != 0) d.params = NULL;
    }
    return d;
}

static int save(rl_trainer *tr, bool sync, double deadline, rl_err *e) {
    char *cj = rl_job_config_to_json(&tr->cfg);
    rl_ckpt_data d = ckpt_data(tr, cj);
    bool started;
    int rc = rl_ckpt_saver_save(tr->saver, &d, sync, deadline, &started, e);
    free(cj);
    tr->last_save_t = rl_now();
    if (!rc && sync && started) tr->committed_step = tr->step;
    return rc;
}

static void ckpt_uri(const rl_trainer *tr, long long step, char *dst, size_t n) {
    char name[32];
    rl_ckpt_step_name(name, sizeof name, step);
    snprintf(dst, n, "%s/%s", tr->store ? tr->store->uri : tr->cfg.ckpt.uri, name);
}

/* Tell the observer about a save that committed since it last heard:
 * the saver's record of its last save says when (monotonic) and how long
 * it took from the snapshot on. */
static void observe_commit(rl_trainer *tr) {
    if (!tr->saver || !tr->observer.on_checkpoint) return;
    rl_ckpt_save_info last;
    rl_ckpt_saver_stats(tr->saver, NULL, NULL, &last);
    if (!last.done || last.rc != RL_OK || last.step <= tr->observed_ckpt) return;
    tr->observed_ckpt = last.step;
    rl_train_ckpt_event ev = {.step = last.step,
                              .seconds = last.t_done - last.t_snap_begin,
                              .unix_time = rl_wall_now() - (rl_now() - last.t_done)};
    ckpt_uri(tr, last.step, ev.uri, sizeof ev.uri);
    tr->observer.on_checkpoint(tr->observer.ud, &ev);
}

/* Has the save of the current step already committed (asynchronously)? */
static bool step_committed(rl_trainer *tr) {
    if (tr->committed_step == tr->step) return true;
    rl_ckpt_save_info last;
    rl_ckpt_saver_stats(tr->saver, NULL, NULL, &last);
    return last.done && last.rc == RL_OK && last.step == tr->step;
}

int rl_trainer_checkpoint(rl_trainer *tr, double deadline, rl_err *e) {
    if (!tr->saver) return RL_OK;
    /* the previous save must end first; its failure is reported, but a
     * newer checkpoint is still worth trying */
    rl_err we = {0};
    int rc = rl_ckpt_saver_wait(tr->saver, deadline, &we);
    if (rc == RL_ETIMEOUT) return rl_errf(e, rc, "%s", we.msg);
    if (rc) rl_log_msg(RL_LOG_ERROR, "checkpoint_failed", we.msg);
    if (step_committed(tr)) {
        tr->committed_step = tr->step;
        observe_commit(tr);
        return RL_OK;
    }
    rc = save(tr, true, deadline, e);
    observe_commit(tr);
    return rc;
}

int rl_trainer_boundary(rl_trainer *tr, rl_err *e) {
    if (!tr->saver) return RL_OK;
    /* a checkpoint we believe in but do not have is the worst outcome */
    int rc = rl_ckpt_saver_poll(tr->saver, e);
    if (rc) return rl_err_wrap(e, "background checkpoint failed");
    observe_commit(tr);
    return tr->save_agreed ? save(tr, false, 0, e) : RL_OK;
}

/* Fixed-size record of the state a resume adopts (broadcast first, so a
 * failure of its source reaches every rank instead of leaving them in a
 * collective). */
typedef struct {
    int64_t status; /* 0: nothing to resume, 1: resumed, -1: the source failed */
    int64_t step;
    uint64_t tokens, sample;
    uint64_t rng[4];
} resume_wire;

/* root's record, then (when it has state) its parameters and AdamW
 * moments, to every rank; rc: the root's own failure so far. */
static int spread(rl_trainer *tr, int root, resume_wire *w, int rc, rl_err *e) {
    if (world_of(tr) == 1) return rc;
    size_t n = tr->dev.n;
    rl_err be = {0};
    int brc = tr->dist->broadcast(tr->dist->ctx, root, w, sizeof *w, &be);
    if (brc && !rc) rc = brc, *e = be;
    if (!rc && w->status < 0) rc = rl_errf(e, RL_EPEER, "rank %d could not give its state (its log says why)", root);
    /* sharded moments are not spread: each rank reads its own (shard_moments) */
    if (!rc && w->status == 1 &&
        ((rc = tr->dist->broadcast(tr->dist->ctx, root, tr->dev.params, n * sizeof(float), e)) ||
         (!tr->dev.shard && (rc = tr->dist->broadcast(tr->dist->ctx, root, tr->dev.opt, 2 * n * sizeof(float), e)))))
        rc = rl_err_wrap(e, "broadcasting the resumed state");
    return rc;
}

/* Sharded: every rank reads its own ranges of the step's moments (rank 0
 * verified the step), and all learn whether every rank could. */
static int shard_moments(rl_trainer *tr, long long step, rl_err *e) {
    const rl_train_shard *sh = tr->dev.shard;
    int rc = rl_ckpt_read_moments(tr->store, step, &tr->cfg.model, tr->dev.n, sh->r, sh->n, tr->dev.opt,
                                  tr->dev.opt + sh->total, e);
    double failed = rc != RL_OK;
    rl_err ae = {0};
    int arc = tr->dist->average(tr->dist->ctx, &failed, 1, &ae);
    if (rc) return rl_err_wrap(e, "reading this rank's shard of the moments");
    if (arc) return *e = ae, arc;
    return failed > 0 ? rl_errf(e, RL_EPEER, "another rank could not read its shard of the moments (its log says why)")
                      : RL_OK;
}

/* Every rank takes the state in w (its host copy already in place). */
static int adopt(rl_trainer *tr, const resume_wire *w, rl_err *e) {
    if (rl_train_dev_upload(&tr->dev, true, e)) return rl_err_wrap(e, "uploading the resumed state to the device");
    tr->step = w->step;
    tr->tokens_seen = w->tokens;
    tr->sample = tr->start_sample = w->sample;
    memcpy(tr->rng.s, w->rng, sizeof w->rng);
    tr->summary.resumed_from = w->step;
    tr->live = true;
    tr->last_save_t = rl_now();
    return open_loader(tr, e);
}

/* After a round change the surviving processes still hold their replicas
 * (rl_trainer_set_dist). Every rank says how far its own state got (a
 * fresh process: nowhere); the lowest rank of the most advanced ones is the
 * root. A survivor may be one step behind another, when the peer was lost
 * between their optimizer updates. *root -1: nobody holds live state. */
static int live_root(rl_trainer *tr, int *root, rl_err *e) {
    long long best = -1;
    *root = -1;
    int world = world_of(tr);
    if (world == 1) return RL_OK;
    double *v = calloc((size_t)world, sizeof *v);
    if (!v) return rl_errf(e, RL_ENOMEM, "resume: out of memory");
    /* one-hot lanes: the average is each rank's value over world, exactly
     * recoverable for any step count below 2^50 */
    v[rank_of(tr)] = tr->live ? (double)tr->step + 1 : 0;
    int rc = tr->dist->average(tr->dist->ctx, v, world, e);
    for (int i = 0; !rc && i < world; i++) {
        long long s = llround(v[i] * world) - 1;
        if (s > best) best = s, *root = i;
    }
    free(v);
    return rc;
}

static int resume_live(rl_trainer *tr, int root, rl_err *e) {
    resume_wire w = {0};
    int rc = RL_OK;
    if (rank_of(tr) == root) {
        w = (resume_wire){.status = 1, .step = tr->step, .tokens = tr->tokens_seen, .sample = tr->sample};
        memcpy(w.rng, tr->rng.s, sizeof w.rng);
        /* on a GPU the host mirror of the moments is stale until asked */
        if ((rc = rl_train_dev_download(&tr->dev, true, e))) w.status = -1;
    }
    if ((rc = spread(tr, root, &w, rc, e)) || (rc = adopt(tr, &w, e))) return rc;
    if (rank_of(tr) == 0)
        rl_log(RL_LOG_INFO, "resume", "\"found\":true,\"live\":true,\"from_rank\":%d,\"step\":%lld,"
               "\"sample_index\":%llu,\"world\":%d", root, tr->step, (unsigned long long)tr->sample, world_of(tr));
    return RL_OK;
}

/* rank 0 loads the newest checkpoint that verifies (or refuses a store
 * that has some when resume is false). */
static int load_newest(rl_trainer *tr, resume_wire *w, rl_ckpt_loaded *ld, rl_err *e) {
    const rl_ckpt_config *c = &tr->cfg.ckpt;
    size_t n = tr->dev.n;
    int rc;
    if (!c->resume) {
        long long *cs;
        int nc;
        if ((rc = rl_ckpt_steps(tr->store, &cs, &nc, NULL, NULL, e))) return rc;
        if (nc > 0)
            rc = rl_errf(e, RL_EINPUT,
                         "checkpoint.resume is false but %s holds checkpoints (newest step %lld): "
                         "use another checkpoint.uri, delete them, or set resume to true",
                         tr->store->uri, cs[nc - 1]);
        free(cs);
        return rc;
    }
    /* sharded: the moments are verified here, read per rank after (shard_moments) */
    float *m = tr->dev.shard ? NULL : tr->dev.opt, *v = tr->dev.shard ? NULL : tr->dev.opt + n;
    if ((rc = rl_ckpt_load_latest(tr->store, &tr->cfg.model, n, tr->dev.params, m, v, ld,
                                  e)))
        return rc;
    if (ld->found) {
        *w = (resume_wire){.status = 1, .step = ld->step, .tokens = ld->state.tokens_seen,
                           .sample = ld->state.sample_index};
        memcpy(w->rng, ld->state.rng, sizeof w->rng);
    }
    return RL_OK;
}

/* What the state takes per rank, by the accounting (memory.h), once the
 * world is known. */
static void log_memory(const rl_trainer *tr) {
    rl_train_memory m;
    rl_err e;
    if (rank_of(tr) != 0) return;
    if (rl_train_memory_of(&tr->cfg, world_of(tr), tr->dev.n, &m, &e)) {
        rl_log_msg(RL_LOG_WARN, "memory", e.msg);
        return;
    }
    rl_log(RL_LOG_INFO, "memory",
           "\"shard\":\"%s\",\"offload\":\"%s\",\"world\":%d,\"weights\":%zu,\"master\":%zu,\"grads\":%zu,"
           "\"moments\":%zu,\"activations\":%zu,\"total\":%zu",
           world_of(tr) > 1 ? tr->cfg.dist.shard : "none", tr->cfg.train.offload, world_of(tr), m.weights, m.master,
           m.grads, m.moments, m.activations, m.total);
}

/* Sharded state, once the seam is whole (DDP attaches after the trainer is
 * built): the moments shrink to this rank's shard before anything fills
 * them, the saver to what this rank snapshots, and the round agrees on
 * the nonce its saves' shard receipts carry. */
static int shard_up(rl_trainer *tr, rl_err *e) {
    const rl_train_shard *s = tr->dist->shard;
    int rank = rank_of(tr);
    int rc = rl_train_dev_set_shard(&tr->dev, tr->dist, e);
    if (rc || (tr->store && (rc = make_saver(tr, e)))) return rc;
    rl_log(RL_LOG_INFO, "shard", "\"mode\":\"%s\",\"ranges\":%d,\"elements\":%zu,\"of\":%zu,\"moment_bytes\":%zu",
           tr->cfg.dist.shard, s->n, s->total, tr->dev.n, 2 * s->total * sizeof(float));
    uint64_t nonce = rank == 0 ? rl_hash64((uint64_t)(rl_wall_now() * 1e6) ^ (uint64_t)getpid() << 32 ^ tr->step) : 0;
    if (world_of(tr) > 1 && (rc = tr->dist->broadcast(tr->dist->ctx, 0, &nonce, sizeof nonce, e))) return rc;
    tr->nonce = nonce;
    return RL_OK;
}

static int resume_state(rl_trainer *tr, rl_err *e);

int rl_trainer_resume(rl_trainer *tr, rl_err *e) {
    if (tr->resume_done) return RL_OK;
    tr->resume_done = true;
    int world = world_of(tr), rc;
    if (world > 1 && (!tr->dist->broadcast || !tr->dist->average))
        return rl_errf(e, RL_EINTERNAL, "resume: %d ranks but the dist seam has no broadcast", world);
    if (tr->dist && tr->dist->shard && (rc = shard_up(tr, e))) return rc;
    log_memory(tr);
    if ((rc = resume_state(tr, e))) return rc;
    /* the ranks' host states are equal now: a node's may become one */
    return world > 1 ? rl_train_dev_share(&tr->dev, tr->dist, e) : RL_OK;
}

/* The live replica, a checkpoint, or rank 0's initial weights. */
static int resume_state(rl_trainer *tr, rl_err *e) {
    int rank = rank_of(tr), world = world_of(tr), root, rc;
    if ((rc = live_root(tr, &root, e))) return rc;
    if (root >= 0) return resume_live(tr, root, e);
    /* nothing to resume: rank 0's initial weights, whatever each rank's seed did */
    if (!tr->cfg.ckpt.uri[0]) return rl_trainer_broadcast_params(tr, e);
    resume_wire w = {0};
    rl_ckpt_loaded ld = {0};
    if (rank == 0 && tr->store && (rc = load_newest(tr, &w, &ld, e))) w.status = -1;
    if ((rc = spread(tr, 0, &w, rank == 0 ? rc : RL_OK, e)) || w.status != 1) {
        if (!rc && rank == 0 && tr->store)
            rl_log(RL_LOG_INFO, "resume", "\"found\":false,\"msg\":\"no checkpoint yet: starting from step 0\"");
        rl_ckpt_loaded_free(&ld);
        return rc ? rc : rl_trainer_broadcast_params(tr, e);
    }
    if ((tr->dev.shard && (rc = shard_moments(tr, w.step, e))) || (rc = adopt(tr, &w, e))) {
        rl_ckpt_loaded_free(&ld);
        return rc;
    }
    tr->committed_step = w.step;
    tr->observed_ckpt = w.step;
    /* the checkpoint resumed from is the job's last commit until the next
     * one: an agent that just took over rank 0 can report it at once */
    if (rank == 0 && tr->observer.on_checkpoint) {
        rl_train_ckpt_event ev = {.step = w.step, .seconds = -1, .unix_time = ld.state.saved_unix, .resumed = true};
        ckpt_uri(tr, w.step, ev.uri, sizeof ev.uri);
        tr->observer.on_checkpoint(tr->observer.ud, &ev);
    }
    if (rank == 0) {
        rl_log(RL_LOG_INFO, "resume",
               "\"found\":true,\"step\":%lld,\"sample_index\":%llu,\"tokens_seen\":%llu,\"saved_world\":%d,"
               "\"world\":%d,\"fallbacks\":%d",
               tr->step, (unsigned long long)tr->sample, (unsigned long long)tr->tokens_seen,
               ld.state.world_size, world, ld.n_skipped);
        if (ld.state.data_seed != tr->cfg.train.seed)
            rl_log(RL_LOG_WARN, "resume_seed_changed",
                   "\"saved\":%llu,\"now\":%llu,\"msg\":\"train.seed differs from the checkpoint's: the data "
                   "order from here on differs from the original run\"",
                   (unsigned long long)ld.state.data_seed, (unsigned long long)tr->cfg.train.seed);
    }
    rl_ckpt_loaded_free(&ld);
    return RL_OK;
}

/* Stopped by a signal at a step boundary: rank 0 commits this step within
 * the budget, and every rank learns whether it did. */
static int preempt(rl_trainer *tr, rl_err *e) {
    int rank = rank_of(tr), rc = RL_OK;
    double t0 = rl_now();
    tr->summary.preempted = true;
    if (!tr->cfg.ckpt.uri[0])
        return rl_errf(e, RL_EABORT, "stopped by signal after step %lld (no checkpoint.uri: nothing saved)",
                       tr->step);
    double saved = 0;
    if (tr->saver) { /* rank 0; with sharded state every rank, each its shard */
        rc = rl_trainer_checkpoint(tr, t0 + tr->cfg.ckpt.preempt_budget_s, e);
        saved = rank == 0 && rc == RL_OK;
        if (rc) rl_log_msg(RL_LOG_ERROR, "preempt_checkpoint_failed", e->msg);
    }
    if (world_of(tr) > 1) {
        double v = saved;
        rl_err ae = {0};
        int arc = tr->dist->average(tr->dist->ctx, &v, 1, &ae);
        if (arc && !rc) rc = arc, *e = ae;
        saved = v > 0;
    }
    if (rc) return rc;
    if (!saved) return rl_errf(e, RL_EPEER, "preempted after step %lld, but rank 0 did not commit a checkpoint",
                               tr->step);
    tr->summary.preempt_saved = true;
    if (rank == 0)
        rl_log(RL_LOG_WARN, "preempted", "\"step\":%lld,\"checkpoint_s\":%.3f,\"budget_s\":%.1f,\"exit_status\":%d",
               tr->step, rl_now() - t0, tr->cfg.ckpt.preempt_budget_s, RL_EXIT_PREEMPTED);
    return rl_errf(e, RL_EABORT, "preempted: stopped by signal after step %lld, checkpoint committed", tr->step);
}

/* The greedy completions run on a CPU model made for them from the host
 * copy of the current weights, whatever the device (eval tasks use small
 * models; the training model is the device's, busy with nothing else but
 * not necessarily on the CPU). */
static int eval_arith(rl_trainer *tr, rl_arith_result *r, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    rl_model cpu;
    /* every rank: with a sharded master the host copy is a gather */
    int rc = rl_trainer_sync_host(tr, false, e);
    if (rc || rank_of(tr) != 0) return rc;
    if ((rc = rl_model_create(&cpu, &tr->cfg.model, t->micro_batch, t->seq_len, e))) return rc;
    memcpy(cpu.params, tr->dev.params, tr->dev.n * sizeof(float));
    rc = rl_eval_arith(&cpu, tr->val_ds, tr->cfg.data.eval_examples, r, e);
    rl_model_destroy(&cpu);
    return rc;
}

int rl_trainer_run(rl_trainer *tr, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    int rc, rank = rank_of(tr);
    if (rank == 0)
        rl_log(RL_LOG_INFO, "train_start",
               "\"params\":%zu,\"device\":\"%s\",\"steps\":%lld,\"global_batch_tokens\":%lld,"
               "\"micro_batch\":%d,\"seq_len\":%d,\"accum\":%d,\"world\":%d,\"train_tokens\":%llu,"
               "\"unigram_entropy\":%.4f,\"blas\":\"%s\"",
               tr->dev.n, t->device, t->steps, t->global_batch_tokens, t->micro_batch, t->seq_len,
               tr->accum, world_of(tr), (unsigned long long)rl_dataset_tokens(tr->train_ds),
               tr->summary.unigram_entropy, rl_blas_kernels());
    if ((rc = rl_trainer_resume(tr, e))) return rc;
    double t0 = rl_now();
    long long first = tr->step;
    rl_step_stats st = {0};
    while (tr->step < t->steps) {
        /* one process needs no agreement: stop before even the first step */
        if (world_of(tr) == 1 && tr->stop && *tr->stop) {
            clear_progress(tr);
            return preempt(tr, e);
        }
        if ((rc = rl_trainer_step(tr, &st, e))) {
            clear_progress(tr);
            return rc;
        }
        double avg_tps = (double)(tr->step - first) * (double)t->global_batch_tokens / (rl_now() - t0);
        if (rank == 0) {
            if (tr->tty)
                progress(tr, &st, avg_tps);
            else if (st.step % t->log_every == 0 || st.step == t->steps || st.step == first + 1) {
                char res[48] = "", waits[96] = "";
                if (st.grad_resident) snprintf(res, sizeof res, ",\"grad_resident\":%zu", st.grad_resident);
                if (st.stream_wait_s >= 0) snprintf(waits, sizeof waits, ",\"stream_wait_s\":%.4f", st.stream_wait_s);
                if (st.host_wait_s >= 0)
                    snprintf(waits + strlen(waits), sizeof waits - strlen(waits), ",\"host_wait_s\":%.4f",
                             st.host_wait_s);
                rl_log(RL_LOG_INFO, "step",
                       /* the loss in full: resume tests compare it bit for bit */
                       "\"step\":%lld,\"loss\":%.17g,\"lr\":%.4e,\"grad_norm\":%.4f,"
                       "\"tokens_per_s\":%.0f,\"elapsed_s\":%.2f%s%s",
                       st.step, st.loss, st.lr, st.grad_norm, st.tokens_per_s, st.elapsed_s, res, waits);
            }
        }
        if (tr->observer.on_step) tr->observer.on_step(tr->observer.ud, &st);
        if (tr->stop_agreed) {
            clear_progress(tr);
            return preempt(tr, e);
        }
        if ((rc = rl_trainer_boundary(tr, e))) {
            clear_progress(tr);
            return rc;
        }
        /* the last step needs no yield: the run ends below as it would */
        if (tr->yield_agreed && tr->step < t->steps) {
            clear_progress(tr);
            /* sharded moments do not cross into the next round: a checkpoint carries them */
            if (tr->dev.shard && (rc = rl_trainer_checkpoint(tr, 0, e)))
                return rl_err_wrap(e, "checkpoint before yielding the round");
            tr->summary.yielded = true;
            return rl_errf(e, RL_EABORT, "yielded after step %lld: the round ended for the next one", tr->step);
        }
        if (t->eval_every > 0 && st.step % t->eval_every == 0 && st.step < t->steps &&
            (rc = evaluate(tr, "eval", e)))
            return rc;
        /* every rank, so that none waits in the next step's collectives
         * (a wait the hang watch would judge) while rank 0 samples */
        if (t->sample_every > 0 && st.step % t->sample_every == 0) {
            clear_progress(tr);
            if ((rc = rl_train_samples(tr, e))) return rc;
        }
    }
    clear_progress(tr);
    /* the final checkpoint, synchronous, before anything else can fail */
    if ((rc = rl_trainer_checkpoint(tr, 0, e))) return rl_err_wrap(e, "final checkpoint");
    rl_run_summary *s = &tr->summary;
    rl_loader_digest(tr->loader, &s->data_count, &s->data_sum);
    s->final_loss = st.loss;
    s->elapsed_s = rl_now() - t0;
    s->tokens_per_s = (double)(tr->step - first) * (double)t->global_batch_tokens / s->elapsed_s;
    if ((rc = evaluate(tr, "eval_final", e))) return rc;
    if (strcmp(tr->cfg.data.eval_task, "arith") == 0 && (rc = eval_arith(tr, &s->arith, e))) return rc;
    if (rank == 0 && strcmp(tr->cfg.data.eval_task, "arith") == 0) {
        s->has_arith = true;
        rl_log(RL_LOG_INFO, "eval_arith", "\"step\":%lld,\"correct\":%d,\"total\":%d,\"accuracy\":%.4f",
               tr->step, s->arith.correct, s->arith.total,
               s->arith.total ? (double)s->arith.correct / s->arith.total : 0.0);
    }
    if (rank == 0)
        rl_log(RL_LOG_INFO, "train_end",
               "\"steps\":%lld,\"final_loss\":%.5f,\"val_loss\":%.5f,\"tokens_per_s\":%.0f,"
               "\"elapsed_s\":%.2f",
               tr->step, s->final_loss, s->val_loss, s->tokens_per_s, s->elapsed_s);
    return RL_OK;
}

int rl_trainer_save_params(rl_trainer *tr, const char *path, rl_err *e) {
    int rc = rl_trainer_sync_host(tr, false, e);
    return rc || rank_of(tr) ? rc : rl_write_file_atomic(path, tr->dev.params, tr->dev.n * sizeof(float), e);
}

float *rl_trainer_grads(rl_trainer *tr) { return rl_train_dev_grads(&tr->dev); }
void *rl_trainer_stream(rl_trainer *tr) { return rl_train_dev_stream(&tr->dev); }

const size_t *rl_trainer_grad_regions(rl_trainer *tr, int *n) {
    *n = 0;
    /* train.offload takes its slots' gradients down itself, averaged in
     * the slots on several ranks */
    if (rl_train_dev_grads(&tr->dev) || (strcmp(tr->cfg.train.offload, "none") && world_of(tr) == 1)) return NULL;
    if (!tr->regions) {
        int k = rl_gpu_grad_regions(&tr->cfg.model, NULL);
        if (!(tr->regions = malloc((size_t)k * sizeof *tr->regions))) return NULL;
        rl_gpu_grad_regions(&tr->cfg.model, tr->regions);
        tr->nregions = k;
    }
    *n = tr->nregions;
    return tr->regions;
}

int rl_trainer_sync_host(rl_trainer *tr, bool opt, rl_err *e) { return rl_train_dev_download(&tr->dev, opt, e); }

int rl_trainer_broadcast_params(rl_trainer *tr, rl_err *e) {
    /* alone, the device has them already, unless a shard cut its master */
    if (world_of(tr) == 1) return tr->dev.shard ? rl_train_dev_upload(&tr->dev, false, e) : RL_OK;
    size_t bytes = tr->dev.n * sizeof(float);
    int rc = tr->dist->broadcast(tr->dist->ctx, 0, tr->dev.params, bytes, e);
    return rc ? rc : rl_train_dev_upload(&tr->dev, false, e);
}

/* ---- accessors (train.h) ------------------------------------------------------------- */
void rl_trainer_set_stop(rl_trainer *tr, const volatile int *stop) { tr->stop = stop; }
void rl_trainer_set_yield(rl_trainer *tr, const volatile int *yield) { tr->yield = yield; }
void rl_trainer_set_observer(rl_trainer *tr, const rl_train_observer *o) {
    tr->observer = o ? *o : (rl_train_observer){0};
}
const rl_job_config *rl_trainer_config(const rl_trainer *tr) { return &tr->cfg; }
int rl_trainer_world(const rl_trainer *tr) { return world_of(tr); }
long long rl_trainer_steps_done(const rl_trainer *tr) { return tr->step; }
uint64_t rl_trainer_sample_index(const rl_trainer *tr) { return tr->sample; }
uint64_t rl_trainer_tokens_seen(const rl_trainer *tr) { return tr->tokens_seen; }
double rl_trainer_flops_per_token(const rl_trainer *tr) { return tr->flops_per_token; }
const rl_run_summary *rl_trainer_summary(const rl_trainer *tr) { return &tr->summary; }
size_t rl_trainer_nparams(const rl_trainer *tr) { return tr->dev.n; }
float *rl_trainer_params(rl_trainer *tr) { return tr->dev.params; }
float *rl_trainer_opt(rl_trainer *tr) { return tr->dev.opt; }
rl_ckpt_store *rl_trainer_store(rl_trainer *tr) { return tr->store; }
rl_ckpt_saver *rl_trainer_saver(rl_trainer *tr) { return tr->saver; }
