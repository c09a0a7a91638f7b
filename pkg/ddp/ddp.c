/* Gradient buckets reduced on a communication thread, overlapping backward. */
#include "ddp.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef RL_CUDA
#include <cuda_runtime_api.h>

#include "kernels/llama_gpu.h"
#endif

/* A unit of work for the communication thread. Buckets are jobs too, so
 * the order of ops on the communicator is the same on every rank. */
typedef enum { JOB_BUCKET, JOB_AVG_F64, JOB_SUM_F64, JOB_SUM_U64, JOB_BCAST_F32, JOB_GATHER } job_kind;
typedef struct {
    job_kind kind;
    void *buf;
    size_t count;
    int bucket; /* JOB_BUCKET, JOB_GATHER */
    rl_dtype dt; /* JOB_GATHER */
    int root;   /* JOB_BCAST_F32 */
    bool dev;   /* on the GPU, ordered by streams: the thread queues it and does not wait */
    bool first; /* JOB_BUCKET with scatter: the step's first pass (acc = rather than +=) */
} job;

#define QCAP 1024

struct rl_ddp {
    rl_comm *comm;
    float *grads;
    size_t n;
    rl_ddp_opts o;
    int nb;
    size_t *boff, *blen; /* bucket b covers [boff[b], boff[b] + blen[b]) */
    rl_ddp_event *ev;
    int next_launch;     /* next bucket to hand over this step */
    double t_backward_end;
    /* device gradients: per bucket, ready on the backward's stream, start
     * and done on the communicator's (timing events) */
    void *gs;
    int device;
    void **ev_ready, **ev_start, **ev_done;
    void *ev_fence; /* orders a sharded step's sum and gather between the two streams */
    /* a device gather: bucket b's blocks are in once ev_gath[b] (comm
     * stream) is; the backward's stream has waited for buckets above
     * gath_next and waits for the rest as the model reads them
     * (rl_ddp_gathered) or before the next device collective (gath_close) */
    void **ev_gath;
    int gath_next; /* -1: no gather open */
    /* reduce_bf16: one bucket's bf16 copy (host, or device with gs) */
    bool bf16;
    void *half;
    /* sharded state (opts.shard): this rank's ranges */
    rl_shard_range *sr;
    rl_train_shard shard;
    /* "gradients" on the host: every micro-step's buckets scattered into
     * acc (the shard's gradient, compact) and cleared; see ddp.h */
    bool scatter;
    float *acc;
    size_t *acc_at;  /* bucket b's block's place in acc; its tail follows */
    size_t window;   /* elements the backward may leave unreduced before it waits */
    size_t pend;     /* elements of buckets handed over and not yet cleared */
    int passes;      /* backward passes this step (a begin call each) */
    size_t peak, last_peak; /* resident bytes of grads, this step's and the last's */
    /* slots (grads NULL; ddp.h): where bucket b's gradients are this pass,
     * the job number that reduces it (done once done_jobs reaches it), and
     * per slot the bucket that used it last (-1: none); acc and acc_at as
     * scatter's, on the device */
    bool slotted, keep; /* keep: "gradients", each reduced block added into acc */
    /* slots averaged in place whose reader takes only its block (a node's
     * ranks sharing train.offload's host state): each bucket reduce-
     * scattered as "gradients" does, from the next step on (rl_ddp_split) */
    bool split;
    float **slot_of;
    uint64_t *bucket_seq;
    float *slot_buf[8];
    int slot_last[8], nslots;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job q[QCAP];
    int qhead, qtail;    /* enqueued jobs [qtail, qhead) */
    uint64_t done_jobs, sent_jobs;
    bool stop;
    int rc;              /* first error; later jobs are skipped */
    rl_err err;
};

/* comm thread: one bucket's average over ranks, in place: the whole of it,
 * or with "gradients" this rank's block (a reduce-scatter) and the tail */
static int reduce(rl_ddp *d, void *buf, size_t n, rl_dtype t, rl_err *e) {
    if (d->o.shard != RL_SHARD_GRADIENTS && !d->split) return rl_comm_allreduce(d->comm, buf, n, t, RL_AVG, e);
    size_t w = (size_t)rl_comm_world(d->comm), r = (size_t)rl_comm_rank(d->comm);
    size_t blk = n / w, es = rl_dtype_size(t);
    char *p = buf;
    int rc = rl_comm_reduce_scatter(d->comm, p, p + r * blk * es, blk, t, RL_AVG, e);
    if (!rc && n % w) rc = rl_comm_allreduce(d->comm, p + w * blk * es, n % w, t, RL_AVG, e);
    return rc;
}

/* ---- device gradients: CUDA events order the two streams ----------------- */
#ifdef RL_CUDA
static int cuda_fail(cudaError_t ce, const char *what, rl_err *e) {
    return rl_errf(e, RL_EIO, "ddp: %s: %s", what, cudaGetErrorString(ce));
}
/* the bucket events, and the bf16 scratch when reducing in bf16 */
static int dev_create(rl_ddp *d, size_t most, rl_err *e) {
    cudaError_t ce = cudaGetDevice(&d->device);
    if (ce != cudaSuccess) return cuda_fail(ce, "cudaGetDevice", e);
    if (d->bf16 && (ce = cudaMalloc(&d->half, most * sizeof(uint16_t))) != cudaSuccess)
        return cuda_fail(ce, "cudaMalloc (bf16 bucket)", e);
    void **sets[3] = {d->ev_ready, d->ev_start, d->ev_done};
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < d->nb; b++)
            if ((ce = cudaEventCreate((cudaEvent_t *)&sets[k][b])) != cudaSuccess)
                return cuda_fail(ce, "cudaEventCreate", e);
    if ((ce = cudaEventCreateWithFlags((cudaEvent_t *)&d->ev_fence, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(ce, "cudaEventCreate", e);
    for (int b = 0; b < d->nb; b++)
        if ((ce = cudaEventCreateWithFlags((cudaEvent_t *)&d->ev_gath[b], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_fail(ce, "cudaEventCreate", e);
    if (d->keep && (ce = cudaMalloc((void **)&d->acc, (d->shard.total ? d->shard.total : 1) * sizeof(float))) != cudaSuccess)
        return cuda_fail(ce, "cudaMalloc (the shard's gradient)", e);
    return RL_OK;
}
static void dev_destroy(rl_ddp *d) {
    void **sets[3] = {d->ev_ready, d->ev_start, d->ev_done};
    for (int k = 0; k < 3; k++)
        for (int b = 0; sets[k] && b < d->nb; b++)
            if (sets[k][b]) cudaEventDestroy((cudaEvent_t)sets[k][b]);
    if (d->ev_fence) cudaEventDestroy((cudaEvent_t)d->ev_fence);
    for (int b = 0; d->ev_gath && b < d->nb; b++)
        if (d->ev_gath[b]) cudaEventDestroy((cudaEvent_t)d->ev_gath[b]);
    if (d->half) cudaFree(d->half);
    if (d->keep && d->acc) cudaFree(d->acc);
    d->half = NULL;
    if (d->keep) d->acc = NULL;
}
/* training thread: bucket b's gradients are the kernels queued so far */
static int dev_mark_ready(rl_ddp *d, int b, rl_err *e) {
    cudaError_t ce = cudaEventRecord((cudaEvent_t)d->ev_ready[b], (cudaStream_t)d->gs);
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "cudaEventRecord (bucket ready)", e);
}
/* comm thread, slots: bucket b's reduced block and tail into acc (= on the
 * step's first pass, += after), on the communicator's stream */
static int dev_keep(rl_ddp *d, int b, bool first, const float *g, rl_err *e) {
    cudaStream_t cs = (cudaStream_t)rl_comm_stream(d->comm);
    size_t w = (size_t)rl_comm_world(d->comm), r = (size_t)rl_comm_rank(d->comm), blk = d->blen[b] / w;
    float *a = d->acc + d->acc_at[b];
    int rc = rl_gpu_accum_f32(a, g + r * blk, blk, !first, cs, e);
    return rc ? rc : rl_gpu_accum_f32(a + blk, g + w * blk, d->blen[b] % w, !first, cs, e);
}
/* comm thread: the allreduce of bucket b, queued behind its readiness */
static int dev_bucket(rl_ddp *d, int b, bool first, rl_err *e) {
    cudaStream_t cs = (cudaStream_t)rl_comm_stream(d->comm);
    cudaError_t ce = cudaSetDevice(d->device);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(cs, (cudaEvent_t)d->ev_ready[b], 0);
    if (ce == cudaSuccess) ce = cudaEventRecord((cudaEvent_t)d->ev_start[b], cs);
    if (ce != cudaSuccess) return cuda_fail(ce, "ordering a bucket after its gradients", e);
    float *g = d->slotted ? d->slot_of[b] : d->grads + d->boff[b];
    size_t n = d->blen[b];
    int rc;
    if (!d->bf16) {
        rc = reduce(d, g, n, RL_F32, e);
    } else { /* one scratch serves every bucket: the stream runs them in turn */
        rc = rl_gpu_cast_f32_to_bf16(d->half, g, n, cs, e);
        if (!rc) rc = reduce(d, d->half, n, RL_BF16, e);
        if (!rc) rc = rl_gpu_cast_bf16_to_f32(g, d->half, n, cs, e);
    }
    if (!rc && d->keep) rc = dev_keep(d, b, first, g, e);
    if (!rc && (ce = cudaEventRecord((cudaEvent_t)d->ev_done[b], cs)) != cudaSuccess)
        rc = cuda_fail(ce, "cudaEventRecord (bucket done)", e);
    return rc;
}
/* training thread, at finish: later work on the backward's stream (the
 * optimizer) waits on the GPU for the last bucket, not the host */
static int dev_join(rl_ddp *d, rl_err *e) {
    cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)d->gs, (cudaEvent_t)d->ev_done[d->nb - 1], 0);
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "ordering the optimizer after the last bucket", e);
}
/* training thread, no job in flight: with into, the comm stream's next
 * work waits for what the backward's stream has queued; else the other way
 * round. A sharded step's sum and gather run between the two. */
static int dev_fence(rl_ddp *d, bool into, rl_err *e) {
    cudaStream_t cs = (cudaStream_t)rl_comm_stream(d->comm), gs = (cudaStream_t)d->gs;
    cudaError_t ce = cudaEventRecord((cudaEvent_t)d->ev_fence, into ? gs : cs);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(into ? cs : gs, (cudaEvent_t)d->ev_fence, 0);
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "ordering the sharded step's collectives", e);
}
/* comm thread: bucket b's gather is queued */
static int dev_gathered(rl_ddp *d, int b, rl_err *e) {
    cudaError_t ce = cudaEventRecord((cudaEvent_t)d->ev_gath[b], (cudaStream_t)rl_comm_stream(d->comm));
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "cudaEventRecord (bucket gathered)", e);
}
/* training thread, slots: `stream` waits for bucket b's reduction (queued
 * by now: the caller waited for the comm thread) */
static int dev_after(rl_ddp *d, int b, void *stream, rl_err *e) {
    cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)d->ev_done[b], 0);
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "ordering a gradient slot after its last reduction", e);
}
/* training thread: the backward's stream waits for the open gather's
 * buckets below upto (elements) */
static int dev_gath_wait(rl_ddp *d, size_t upto, rl_err *e) {
    cudaError_t ce = cudaSuccess;
    for (; d->gath_next >= 0 && d->boff[d->gath_next] < upto && ce == cudaSuccess; d->gath_next--)
        ce = cudaStreamWaitEvent((cudaStream_t)d->gs, (cudaEvent_t)d->ev_gath[d->gath_next], 0);
    return ce == cudaSuccess ? RL_OK : cuda_fail(ce, "ordering a read after a bucket's gather", e);
}
static double dev_elapsed(void *a, void *b) {
    float ms = 0;
    return cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess ? ms / 1e3 : 0;
}
#else
static int no_cuda(rl_err *e) { return rl_errf(e, RL_EINTERNAL, "ddp: device gradients in a build without CUDA"); }
static int dev_create(rl_ddp *d, size_t most, rl_err *e) { return (void)d, (void)most, no_cuda(e); }
static void dev_destroy(rl_ddp *d) { (void)d; }
static int dev_mark_ready(rl_ddp *d, int b, rl_err *e) { return (void)d, (void)b, no_cuda(e); }
static int dev_bucket(rl_ddp *d, int b, bool first, rl_err *e) { return (void)d, (void)b, (void)first, no_cuda(e); }
static int dev_after(rl_ddp *d, int b, void *stream, rl_err *e) { return (void)d, (void)b, (void)stream, no_cuda(e); }
static int dev_join(rl_ddp *d, rl_err *e) { return (void)d, no_cuda(e); }
static int dev_fence(rl_ddp *d, bool into, rl_err *e) { return (void)d, (void)into, no_cuda(e); }
static int dev_gathered(rl_ddp *d, int b, rl_err *e) { return (void)d, (void)b, no_cuda(e); }
static int dev_gath_wait(rl_ddp *d, size_t upto, rl_err *e) { return (void)d, (void)upto, no_cuda(e); }
static double dev_elapsed(void *a, void *b) { return (void)a, (void)b, 0; }
#endif

/* Whatever an open gather still holds back, the backward's stream waits
 * for before the next device collective: nothing queued after it on that
 * stream can overtake a gather its model did not ask for (rl_ddp_gathered). */
static int gath_close(rl_ddp *d, rl_err *e) { return d->gath_next >= 0 ? dev_gath_wait(d, SIZE_MAX, e) : RL_OK; }

/* comm thread, scatter: bucket b's reduced block and tail into acc (=
 * on the step's first pass, += after), then the whole bucket cleared:
 * its pages go back to the kernel and read zero for the next pass. */
static void scatter_keep(rl_ddp *d, int b, bool first) {
    size_t w = (size_t)rl_comm_world(d->comm), r = (size_t)rl_comm_rank(d->comm);
    size_t len = d->blen[b], blk = len / w;
    float *g = d->grads + d->boff[b], *a = d->acc + d->acc_at[b];
    const float *src[2] = {g + r * blk, g + w * blk};
    size_t cnt[2] = {blk, len % w};
    for (int k = 0; k < 2; a += cnt[k], k++)
        if (first) memcpy(a, src[k], cnt[k] * sizeof(float));
        else
            for (size_t i = 0; i < cnt[k]; i++) a[i] += src[k][i];
    rl_mem_zero_release(g, len * sizeof(float));
}

/* comm thread: one bucket of host gradients */
static int host_bucket(rl_ddp *d, int b, rl_err *e) {
    float *g = d->grads + d->boff[b];
    size_t n = d->blen[b];
    if (!d->bf16) return reduce(d, g, n, RL_F32, e);
    uint16_t *h = d->half;
    for (size_t i = 0; i < n; i++) h[i] = rl_comm_f32_to_bf16(g[i]);
    int rc = reduce(d, h, n, RL_BF16, e);
    if (!rc) rc = rl_comm_wait(d->comm, e);
    for (size_t i = 0; !rc && i < n; i++) g[i] = rl_comm_bf16_to_f32(h[i]);
    return rc;
}

static void *comm_thread(void *arg) {
    rl_ddp *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->qhead == d->qtail && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
        if (d->qhead == d->qtail && d->stop) break;
        job j = d->q[d->qtail % QCAP];
        d->qtail++;
        int failed = d->rc;
        pthread_mutex_unlock(&d->mu);

        int rc = 0;
        rl_err e = {0};
        if (!failed) {
            double t0 = rl_now();
            switch (j.kind) {
            case JOB_BUCKET:
                d->ev[j.bucket].t_start = t0;
                rl_comm_tag_next(d->comm, j.bucket); /* the flight recorder names the bucket */
                rc = d->gs ? dev_bucket(d, j.bucket, j.first, &e) : host_bucket(d, j.bucket, &e);
                if (!rc && d->scatter && !(rc = rl_comm_wait(d->comm, &e))) scatter_keep(d, j.bucket, j.first);
                d->ev[j.bucket].t_done = rl_now();
                break;
            case JOB_AVG_F64: rc = rl_comm_allreduce(d->comm, j.buf, j.count, RL_F64, RL_AVG, &e); break;
            case JOB_SUM_F64: rc = rl_comm_allreduce(d->comm, j.buf, j.count, RL_F64, RL_SUM, &e); break;
            case JOB_SUM_U64: rc = rl_comm_allreduce(d->comm, j.buf, j.count, RL_I64, RL_SUM, &e); break;
            case JOB_BCAST_F32: rc = rl_comm_broadcast(d->comm, j.buf, j.count, RL_F32, j.root, &e); break;
            case JOB_GATHER: { /* a bucket's blocks, in place; its tail is every rank's */
                size_t w = (size_t)rl_comm_world(d->comm), blk = j.count / w, es = rl_dtype_size(j.dt);
                char *p = j.buf;
                rl_comm_tag_next(d->comm, j.bucket);
                rc = rl_comm_allgather(d->comm, p + (size_t)rl_comm_rank(d->comm) * blk * es, p, blk, j.dt, &e);
                if (!rc && j.dev) rc = dev_gathered(d, j.bucket, &e);
                break;
            }
            }
            /* device jobs are stream-ordered: queued is enough here,
             * finish (or the sharded step's fence, or the gather's events)
             * orders the stream after them */
            if (!rc && !j.dev) rc = rl_comm_wait(d->comm, &e);
        }
        pthread_mutex_lock(&d->mu);
        if (rc && !d->rc) d->rc = rc, d->err = e;
        if (j.kind == JOB_BUCKET && d->scatter) d->pend -= j.count; /* cleared, or the step failed */
        d->done_jobs++;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Caller holds no lock. The queue is far deeper than the bucket count, so
 * a full queue means a logic error, not load. */
static void submit(rl_ddp *d, job j) {
    pthread_mutex_lock(&d->mu);
    if (d->qhead - d->qtail < QCAP) {
        d->q[d->qhead % QCAP] = j;
        d->qhead++;
        d->sent_jobs++;
        if (j.kind == JOB_BUCKET && d->scatter) d->pend += j.count;
        if (j.kind == JOB_BUCKET && d->slotted) d->bucket_seq[j.bucket] = d->sent_jobs;
    } else if (!d->rc) {
        d->rc = rl_errf(&d->err, RL_EINTERNAL, "ddp: job queue overflow");
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Wait (bounded) until the first `jobs` submitted jobs are done (UINT64_MAX:
 * every one submitted), and at most `most` elements of scattered buckets
 * are not yet cleared; then report the first error. */
static int await(rl_ddp *d, uint64_t jobs, size_t most, rl_err *e) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)d->o.timeout_s;
    pthread_mutex_lock(&d->mu);
    int w = 0;
    bool late;
    uint64_t upto = jobs < d->sent_jobs ? jobs : d->sent_jobs;
    while ((late = d->done_jobs < upto || d->pend > most) && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&d->cv, &d->mu, &dl);
    int rc = d->rc;
    if (rc && e) *e = d->err;
    pthread_mutex_unlock(&d->mu);
    if (!rc && late) {
        rl_comm_abort(d->comm);
        return rl_errf(e, RL_ETIMEOUT, "ddp: gradient reduction not done after %.0f s", d->o.timeout_s);
    }
    return rc;
}
static int drain(rl_ddp *d, rl_err *e) { return await(d, UINT64_MAX, SIZE_MAX, e); }

/* The hook cannot return an error: the step's finish reports the first. */
static void keep_error(rl_ddp *d, int rc, const rl_err *me) {
    pthread_mutex_lock(&d->mu);
    if (!d->rc) d->rc = rc ? rc : RL_EIO, d->err = *me;
    pthread_mutex_unlock(&d->mu);
}

/* scatter: acc and where each bucket's part of the shard sits in it (the
 * shard plan's order: from the start of the buffer); the buffer cleared,
 * as every step leaves it (the model zeroed it by writing). */
static int scatter_create(rl_ddp *d, rl_err *e) {
    d->acc = malloc((d->shard.total ? d->shard.total : 1) * sizeof(float));
    d->acc_at = calloc((size_t)d->nb, sizeof(size_t));
    if (!d->acc || !d->acc_at) return rl_errf(e, RL_ENOMEM, "ddp: out of memory for the shard's gradient");
    size_t w = (size_t)rl_comm_world(d->comm), at = 0;
    for (int b = d->nb - 1; b >= 0; b--) d->acc_at[b] = at, at += d->blen[b] / w + d->blen[b] % w;
    if (at != d->shard.total)
        return rl_errf(e, RL_EINTERNAL, "ddp: buckets give %zu shard elements, the plan %zu", at, d->shard.total);
    d->shard.grad = d->acc;
    rl_mem_zero_release(d->grads, d->n * sizeof(float));
    return RL_OK;
}

/* The buckets given as regions (opts.regions): checked, counted in plan
 * (its count and largest; the rest stays zero) */
static int region_plan(const rl_ddp_opts *o, size_t n, rl_train_bucket_plan *plan, rl_err *e) {
    *plan = (rl_train_bucket_plan){.n = n, .count = (size_t)o->nregions};
    for (int k = 0; k < o->nregions; k++) {
        size_t end = k + 1 < o->nregions ? o->regions[k + 1] : n;
        if ((k == 0 && o->regions[0] != 0) || o->regions[k] >= end)
            return rl_errf(e, RL_EINTERNAL, "ddp: region %d starts at %zu, the next at %zu (of %zu)", k,
                           o->regions[k], end, n);
        if (end - o->regions[k] > plan->largest) plan->largest = end - o->regions[k];
    }
    return RL_OK;
}

int rl_ddp_create(rl_comm *comm, float *grads, size_t n, const rl_ddp_opts *o, rl_ddp **out,
                  rl_err *e) {
    rl_ddp *d = calloc(1, sizeof *d);
    if (!d) return rl_errf(e, RL_ENOMEM, "ddp: out of memory");
    d->comm = comm, d->grads = grads, d->n = n;
    d->o.timeout_s = o && o->timeout_s > 0 ? o->timeout_s : 300;
    bool regions = o && o->regions && o->nregions > 0;
    /* no gradients and no regions: a device that keeps its gradients to
     * itself (train.offload "layers"), on one rank: no buckets at all */
    bool none = !grads && !regions && rl_comm_world(comm) == 1;
    rl_train_bucket_plan plan;
    int rc = regions ? region_plan(o, n, &plan, e)
                     : rl_train_bucket_plan_of(none ? 0 : n, o ? o->first_bucket_bytes : 0, o ? o->bucket_bytes : 0,
                                               o ? o->min_buckets : 0, &plan, e);
    if (!rc && !grads && !none &&
        (!regions || !o->grad_stream || (o->shard == RL_SHARD_OPTIMIZER && !o->host_update)))
        rc = rl_errf(e, RL_EINTERNAL, "ddp: gradients in slots (no buffer) need their regions, a device stream "
                     "and dist.shard \"gradients\" or \"none\" (or a host update)");
    if (rc || plan.count > (size_t)INT_MAX / 2) {
        free(d);
        return rc ? rc : rl_errf(e, RL_EINPUT, "ddp: %zu buckets are too many", plan.count);
    }
    int nb = d->nb = (int)plan.count;
    d->slotted = !grads && !none;
    d->keep = d->slotted && o->shard == RL_SHARD_GRADIENTS && !o->host_update;
    d->split = d->slotted && o->shard != RL_SHARD_NONE && o->host_update; /* the blocks are the shard's */
    d->boff = calloc((size_t)nb + 1, sizeof(size_t));
    d->blen = calloc((size_t)nb + 1, sizeof(size_t));
    d->ev = calloc((size_t)nb + 1, sizeof(rl_ddp_event));
    d->gs = o ? o->grad_stream : NULL;
    d->gath_next = -1;
    if (d->gs) {
        d->ev_ready = calloc((size_t)nb + 1, sizeof(void *)); /* (+ 1: none at all is fine) */
        d->ev_start = calloc((size_t)nb + 1, sizeof(void *));
        d->ev_done = calloc((size_t)nb + 1, sizeof(void *));
        d->ev_gath = calloc((size_t)nb + 1, sizeof(void *));
    }
    if (!d->boff || !d->blen || !d->ev ||
        (d->gs && (!d->ev_ready || !d->ev_start || !d->ev_done || !d->ev_gath))) {
        rl_ddp_destroy(d);
        return rl_errf(e, RL_ENOMEM, "ddp: out of memory");
    }
    if (d->slotted) {
        d->slot_of = calloc((size_t)nb, sizeof *d->slot_of);
        d->bucket_seq = calloc((size_t)nb, sizeof *d->bucket_seq);
        d->acc_at = calloc((size_t)nb, sizeof *d->acc_at);
        for (int k = 0; k < 8; k++) d->slot_last[k] = -1;
        if (!d->slot_of || !d->bucket_seq || !d->acc_at) {
            rl_ddp_destroy(d);
            return rl_errf(e, RL_ENOMEM, "ddp: out of memory");
        }
    }
    /* from the end of the buffer */
    size_t left = n;
    for (int b = 0; b < nb; b++) {
        size_t len = regions ? left - o->regions[nb - 1 - b] : rl_train_bucket_len(&plan, (size_t)b);
        left -= len;
        d->boff[b] = left, d->blen[b] = len;
        d->ev[b].off = left, d->ev[b].len = len;
    }
    if (d->gs && !rl_comm_stream(comm)) {
        rl_ddp_destroy(d);
        return rl_errf(e, RL_EINPUT, "ddp: gradients on a GPU need a communicator with a stream "
                       "(the nccl backend), not %s", rl_comm_backend(comm));
    }
    d->bf16 = o && o->reduce_bf16;
    d->o.shard = o ? o->shard : RL_SHARD_NONE;
    if (d->o.shard != RL_SHARD_NONE) {
        if (!(d->sr = calloc(2 * (size_t)nb + 1, sizeof *d->sr))) {
            rl_ddp_destroy(d);
            return rl_errf(e, RL_ENOMEM, "ddp: out of memory");
        }
        d->shard.r = d->sr;
        d->shard.n = rl_ddp_shard_plan(d->boff, d->blen, nb, rl_comm_world(comm), rl_comm_rank(comm), d->sr);
        for (int k = 0; k < d->shard.n; k++) d->shard.total += d->sr[k].len;
    }
    if (d->keep) { /* the shard's gradient: each bucket's block then tail, from the buffer's start */
        size_t w = (size_t)rl_comm_world(comm), at = 0;
        for (int b = nb - 1; b >= 0; b--) d->acc_at[b] = at, at += d->blen[b] / w + d->blen[b] % w;
    }
    size_t widest = plan.largest;
    d->scatter = d->o.shard == RL_SHARD_GRADIENTS && !d->gs && nb > 0;
    d->window = rl_train_scatter_window(o ? o->stretch : 0, &plan);
    rc = d->gs ? dev_create(d, widest, e) : d->scatter ? scatter_create(d, e) : RL_OK;
    if (!rc && d->keep) d->shard.grad = d->acc;
    if (!rc && d->bf16 && !d->gs && !(d->half = malloc(widest * sizeof(uint16_t))))
        rc = rl_errf(e, RL_ENOMEM, "ddp: out of memory for the bf16 bucket");
    if (rc) {
        rl_ddp_destroy(d);
        return rc;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (pthread_create(&d->thread, NULL, comm_thread, d) != 0) {
        rl_ddp_destroy(d);
        return rl_errf(e, RL_EINTERNAL, "ddp: cannot start the communication thread");
    }
    d->thread_started = true;
    *out = d;
    return RL_OK;
}

int rl_ddp_nbuckets(const rl_ddp *d) { return d->nb; }

int rl_ddp_broadcast(rl_ddp *d, int root, float *params, size_t n, rl_err *e) {
    submit(d, (job){.kind = JOB_BCAST_F32, .buf = params, .count = n, .root = root});
    return drain(d, e);
}

int rl_ddp_broadcast_bytes(void *ctx, int root, void *buf, size_t bytes, rl_err *e) {
    rl_ddp *d = ctx;
    if (bytes % sizeof(float))
        return rl_errf(e, RL_EINTERNAL, "ddp: byte broadcast of %zu bytes (not a multiple of 4)", bytes);
    /* as f32 lanes: a broadcast moves bytes and never does arithmetic */
    return rl_ddp_broadcast(d, root, buf, bytes / sizeof(float), e);
}

/* A backward pass begins (the hook's offset = the buffer's length): with
 * scatter, the last pass's buckets must be cleared before it writes. */
static void begin_pass(rl_ddp *d) {
    rl_err me = {0};
    int rc = d->scatter ? await(d, 0, 0, &me) : RL_OK;
    if (rc) keep_error(d, rc, &me);
    d->next_launch = 0;
    d->passes++;
}

void rl_ddp_grad_ready(void *ctx, size_t off) {
    rl_ddp *d = ctx;
    if (off >= d->n) return begin_pass(d);
    double now = rl_now();
    rl_err me = {0};
    if (!d->gs) { /* host gradients: what the buffer holds now, before anything is handed over */
        size_t res = rl_mem_resident(d->grads, d->n * sizeof(float));
        if (res > d->peak) d->peak = res;
    }
    if (d->scatter && d->next_launch == d->nb) /* a pass whose begin was not called */
        keep_error(d, rl_errf(&me, RL_EINTERNAL, "ddp: a backward pass began without saying so (model.h's hook "
                              "contract)"), &me);
    if (off == 0 && d->next_launch < d->nb) d->t_backward_end = now;
    while (d->next_launch < d->nb && d->boff[d->next_launch] >= off) {
        int b = d->next_launch++;
        d->ev[b].t_ready = now;
        int rc = d->gs ? gath_close(d, &me) : RL_OK;
        if (!rc && d->gs) rc = dev_mark_ready(d, b, &me);
        if (rc) keep_error(d, rc, &me);
        submit(d, (job){.kind = JOB_BUCKET, .buf = d->slotted ? NULL : d->grads + d->boff[b], .count = d->blen[b], .bucket = b,
                        .dev = d->gs != NULL, .first = d->passes <= 1});
    }
    /* scatter: no more than the window unreduced while backward goes on */
    int rc = d->scatter ? await(d, 0, d->window, &me) : RL_OK;
    if (rc) keep_error(d, rc, &me);
}

/* stream waits for bucket b's last reduction: once the comm thread has
 * queued it (a short, bounded host wait: it only queues), on the GPU */
static int after(rl_ddp *d, int b, void *stream, rl_err *e) {
    int rc = await(d, d->bucket_seq[b], SIZE_MAX, e);
    return rc ? rc : dev_after(d, b, stream, e);
}

/* The slot's last bucket must be reduced before backward writes it again:
 * once the comm thread has queued that reduction (a short host wait: it
 * only queues), the stream waits for its event on the GPU. */
void rl_ddp_grad_slot(void *ctx, size_t off, float *slot) {
    rl_ddp *d = ctx;
    rl_err me = {0};
    int b = 0, k = 0, rc = RL_OK;
    while (b < d->nb && d->boff[b] != off) b++;
    while (k < d->nslots && d->slot_buf[k] != slot) k++;
    if (b == d->nb || !d->slotted)
        rc = rl_errf(&me, RL_EINTERNAL, "ddp: a gradient slot for offset %zu, where no region starts", off);
    else if (k == 8)
        rc = rl_errf(&me, RL_EINTERNAL, "ddp: more than 8 gradient slots");
    if (!rc && k == d->nslots) d->slot_buf[d->nslots++] = slot;
    int prev = rc ? -1 : d->slot_last[k];
    if (prev >= 0) rc = after(d, prev, d->gs, &me);
    if (!rc) d->slot_last[k] = b, d->slot_of[b] = slot;
    if (rc) keep_error(d, rc, &me);
}

void rl_ddp_reduced(void *ctx, size_t off, void *stream) {
    rl_ddp *d = ctx;
    rl_err me = {0};
    int b = 0, rc = RL_OK;
    while (b < d->nb && d->boff[b] != off) b++;
    if (b == d->nb || !d->slotted || d->keep)
        rc = rl_errf(&me, RL_EINTERNAL, "ddp: no reduction in place for offset %zu", off);
    else if (d->next_launch <= b)
        rc = rl_errf(&me, RL_EINTERNAL, "ddp: the region at %zu is not handed over yet", off);
    if (!rc) rc = after(d, b, stream, &me);
    if (rc) keep_error(d, rc, &me);
}

/* training thread, between steps (no job in flight; the next submit's
 * lock hands the flag to the comm thread) */
void rl_ddp_split(void *ctx) { ((rl_ddp *)ctx)->split = true; }

int rl_ddp_finish(void *ctx, rl_err *e) {
    rl_ddp *d = ctx;
    /* a backward that never reported some range (it always reports 0 at the
     * end) still gets every bucket reduced */
    if (d->next_launch < d->nb) rl_ddp_grad_ready(d, 0);
    d->next_launch = 0, d->passes = 0;
    int rc = drain(d, e);
    if (!rc && d->gs) rc = gath_close(d, e);
    /* scatter: every bucket is cleared; the pages astride two buckets are
     * zero and can go back too */
    if (!rc && d->scatter) rl_mem_zero_release(d->grads, d->n * sizeof(float));
    d->last_peak = d->peak + (d->scatter ? d->shard.total * sizeof(float) : 0), d->peak = 0;
    return !rc && d->gs && d->nb > 0 ? dev_join(d, e) : rc;
}

size_t rl_ddp_grad_resident(void *ctx) { return ((rl_ddp *)ctx)->last_peak; }

int rl_ddp_average(void *ctx, double *v, int n, rl_err *e) {
    rl_ddp *d = ctx;
    submit(d, (job){.kind = JOB_AVG_F64, .buf = v, .count = (size_t)n});
    return drain(d, e);
}

int rl_ddp_sum_u64(rl_ddp *d, uint64_t *v, int n, rl_err *e) {
    /* Sent as 32-bit halves in int64 lanes: the sums cannot overflow a
     * signed lane for any realistic world size, and recombining them gives
     * the wrapping 64-bit sum exactly. */
    int64_t *h = malloc(sizeof(int64_t) * 2 * (size_t)n);
    if (!h) return rl_errf(e, RL_ENOMEM, "ddp: out of memory");
    for (int i = 0; i < n; i++) h[2 * i] = (int64_t)(v[i] & 0xffffffffu), h[2 * i + 1] = (int64_t)(v[i] >> 32);
    submit(d, (job){.kind = JOB_SUM_U64, .buf = h, .count = 2 * (size_t)n});
    int rc = drain(d, e);
    for (int i = 0; !rc && i < n; i++) v[i] = (uint64_t)h[2 * i] + ((uint64_t)h[2 * i + 1] << 32);
    free(h);
    return rc;
}

void rl_ddp_attach(rl_ddp *d, rl_train_dist *dist) {
    dist->rank = rl_comm_rank(d->comm);
    dist->world = rl_comm_world(d->comm);
    dist->ctx = d;
    dist->grad_ready = rl_ddp_grad_ready;
    dist->finish = rl_ddp_finish;
    dist->average = rl_ddp_average;
    dist->broadcast = rl_ddp_broadcast_bytes;
    dist->timing = rl_ddp_timing;
    bool sharded = rl_ddp_shard(d) != NULL;
    dist->shard = sharded ? &d->shard : NULL;
    dist->sum = sharded ? rl_ddp_sum : NULL;
    dist->gather = sharded ? rl_ddp_gather : NULL;
    dist->gathered = sharded && d->gs ? rl_ddp_gathered : NULL;
    dist->reduce_each_micro = d->scatter || d->slotted;
    dist->grad_slot = d->slotted ? rl_ddp_grad_slot : NULL;
    dist->reduced = d->slotted && !d->keep ? rl_ddp_reduced : NULL;
    dist->split = d->slotted && !d->keep ? rl_ddp_split : NULL;
    dist->gather_region = sharded ? rl_ddp_gather_region : NULL;
    dist->grad_resident = d->gs ? NULL : rl_ddp_grad_resident;
}

int rl_ddp_shard_plan(const size_t *boff, const size_t *blen, int nb, int world, int rank, rl_shard_range *out) {
    int k = 0;
    size_t w = (size_t)world, r = (size_t)rank;
    for (int b = nb - 1; b >= 0; b--) { /* the last bucket starts the buffer */
        size_t blk = blen[b] / w, tail = blen[b] % w;
        if (blk) out[k++] = (rl_shard_range){.off = boff[b] + r * blk, .len = blk};
        if (tail) out[k++] = (rl_shard_range){.off = boff[b] + w * blk, .len = tail, .shared = true};
    }
    return k;
}

/* no buckets (a device that keeps its gradients to itself, alone): nothing
 * to shard along, the device keeps its state whole */
const rl_train_shard *rl_ddp_shard(const rl_ddp *d) {
    return d->o.shard != RL_SHARD_NONE && d->nb > 0 ? &d->shard : NULL;
}

/* The sharded step's collectives. Host buffers: waited for. Device buffers
 * (gradients on a GPU): queued on the comm stream between two fences, so
 * they follow what the backward's stream holds and it follows them, and
 * nothing waits on the host. */
static int sharded_begin(rl_ddp *d, rl_err *e) {
    int rc = d->gs ? gath_close(d, e) : RL_OK;
    return !rc && d->gs ? dev_fence(d, true, e) : rc;
}
static int sharded_end(rl_ddp *d, rl_err *e) {
    int rc = drain(d, e);
    return !rc && d->gs ? dev_fence(d, false, e) : rc;
}

int rl_ddp_sum(void *ctx, double *v, int n, rl_err *e) {
    rl_ddp *d = ctx;
    int rc = sharded_begin(d, e);
    if (rc) return rc;
    submit(d, (job){.kind = JOB_SUM_F64, .buf = v, .count = (size_t)n, .dev = d->gs != NULL});
    return sharded_end(d, e);
}

/* In the order a forward reads the buffer (from its start: the last
 * bucket first). On a device no fence follows: each bucket's event is
 * recorded behind its all-gather, and the backward's stream waits for a
 * bucket only when the model is about to read it (rl_ddp_gathered), so
 * the next forward's first layers run while later buckets still arrive. */
int rl_ddp_gather(void *ctx, void *params, bool bf16, rl_err *e) {
    rl_ddp *d = ctx;
    int rc = sharded_begin(d, e);
    if (rc) return rc;
    rl_dtype dt = bf16 ? RL_BF16 : RL_F32;
    for (int b = d->nb - 1; b >= 0; b--)
        submit(d, (job){.kind = JOB_GATHER, .buf = (char *)params + d->boff[b] * rl_dtype_size(dt),
                        .count = d->blen[b], .bucket = b, .dt = dt, .dev = d->gs != NULL});
    if (!d->gs) return sharded_end(d, e);
    if ((rc = drain(d, e))) return rc; /* every event recorded: waiting on them is safe */
    d->gath_next = d->nb - 1;
    return RL_OK;
}

int rl_ddp_gather_region(void *ctx, void *buf, size_t off, size_t len, bool bf16, rl_err *e) {
    rl_ddp *d = ctx;
    size_t es = bf16 ? 2 : 4;
    for (int b = 0; b < d->nb; b++) {
        size_t lo = d->boff[b], hi = lo + d->blen[b];
        if (hi > off && lo < off + len && (lo < off || hi > off + len))
            return rl_errf(e, RL_EINTERNAL, "ddp: bucket [%zu, %zu) crosses the gathered window [%zu, +%zu)", lo, hi,
                           off, len);
    }
    int rc = sharded_begin(d, e);
    if (rc) return rc;
    for (int b = d->nb - 1; b >= 0; b--)
        if (d->boff[b] >= off && d->boff[b] < off + len)
            submit(d, (job){.kind = JOB_GATHER, .buf = (char *)buf + (d->boff[b] - off) * es, .count = d->blen[b],
                            .bucket = b, .dt = bf16 ? RL_BF16 : RL_F32, .dev = d->gs != NULL});
    return sharded_end(d, e);
}

void rl_ddp_gathered(void *ctx, size_t upto) {
    rl_ddp *d = ctx;
    rl_err me = {0};
    int rc = d->gs ? dev_gath_wait(d, upto, &me) : RL_OK;
    if (rc) keep_error(d, rc, &me);
}

const rl_ddp_event *rl_ddp_events(const rl_ddp *d, double *t_backward_end) {
    if (t_backward_end) *t_backward_end = d->t_backward_end;
    return d->ev;
}

void rl_ddp_step_timing(const rl_ddp *d, double *exposed_s, double *busy_s) {
    if (d->gs && d->nb > 0) {
        /* GPU time: the host queues backward long before the GPU runs it,
         * so host clocks would count backward as waiting. The last bucket
         * is readied when backward ends and completes after every other. */
        double busy = 0;
        for (int b = 0; b < d->nb; b++) busy += dev_elapsed(d->ev_start[b], d->ev_done[b]);
        double exposed = dev_elapsed(d->ev_ready[d->nb - 1], d->ev_done[d->nb - 1]);
        if (exposed_s) *exposed_s = exposed > 0 ? exposed : 0;
        if (busy_s) *busy_s = busy;
        return;
    }
    /* read after finish: the comm thread's writes of t_start/t_done
     * happened before drain saw their jobs done, under the mutex */
    double last = 0, busy = 0;
    for (int b = 0; b < d->nb; b++) {
        if (d->ev[b].t_done > last) last = d->ev[b].t_done;
        if (d->ev[b].t_done > d->ev[b].t_start) busy += d->ev[b].t_done - d->ev[b].t_start;
    }
    double exposed = d->t_backward_end > 0 && last > d->t_backward_end ? last - d->t_backward_end : 0;
    if (exposed_s) *exposed_s = exposed;
    if (busy_s) *busy_s = busy;
}

void rl_ddp_timing(void *ctx, double *exposed_s, double *busy_s) { rl_ddp_step_timing(ctx, exposed_s, busy_s); }

void rl_ddp_abort(rl_ddp *d) { rl_comm_abort(d->comm); }

void rl_ddp_destroy(rl_ddp *d) {
    if (!d) return;
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_broadcast(&d->cv);
        bool pending = d->done_jobs < d->sent_jobs;
        pthread_mutex_unlock(&d->mu);
        /* a job blocked in the communicator is released by abort */
        if (pending) rl_comm_abort(d->comm);
        pthread_join(d->thread, NULL);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    if (d->gs) dev_destroy(d);
    else free(d->half);
    free(d->ev_ready);
    free(d->ev_start);
    free(d->ev_done);
    free(d->ev_gath);
    free(d->boff);
    free(d->blen);
    free(d->ev);
    free(d->sr);
    if (!d->slotted) free(d->acc);
    free(d->acc_at);
    free(d->slot_of);
    free(d->bucket_seq);
    free(d);
}
