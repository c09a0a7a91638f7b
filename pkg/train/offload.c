/* train.offload "optimizer" and "layers": the host's update pipeline (offload.h).
 *
 * Why a thread: AdamW over the fp32 master on the CPU takes about as long
 * as a forward for a large model. Done inline, the GPU would idle through
 * it; on a thread of its own it runs region by region in the order the
 * next forward reads the weights, each region's bf16 weights queued up on a
 * copy stream behind it, while the training thread queues the forward and
 * blocks only where a layer's weights are not yet updated (rl_offload_wait,
 * the model's params-wait callback). */
#include <ctype.h>
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h" /* rl_comm_f32_to_bf16 */
#include "host_state.h"
#include "offload.h"

#ifdef RL_CUDA
#include <cuda_runtime_api.h>

/* A part of a region this rank updates: elements [off, off + len), at
 * `at` in the compact gradient buffers; shared: a shard's tail, which
 * every rank updates alike and only rank 0 counts in the norm. */
typedef struct slice {
    size_t off, len, at;
    bool shared;
} slice;

struct rl_offload {
    rl_train_device *d;
    void *params_dev;    /* the model's bf16 weights */
    cudaStream_t model;  /* the model's stream: waits for a region's copy */
    cudaStream_t copy;   /* the uploads */
    int device;          /* the training thread's GPU: the worker's too */
    /* pinned: the step's reduced gradients, and a later micro-batch's
     * staging, of this rank's slices of each region only (all of it unless
     * the state is shared or sharded): region k's are sl[sl_first[k] ..
     * sl_first[k + 1]), held elements in all */
    float *grads, *stage;
    slice *sl;
    int *sl_first;
    size_t held;
    const rl_train_dist *sdist; /* the seam the state is shared or sharded over: the norm's sum */
    /* the master, the moments and the bf16 weights (d->params and d->opt
     * point into it), shared by the node's ranks or this one's alone; its
     * bf16 pages registered (pinned) for the copies up */
    rl_host_state hs;
    bool registered;
    uint64_t gen;        /* updates handed over since the state was shared */
    atomic_bool cancel;  /* a round ends: stop waiting for the other ranks */
    int nreg;
    size_t *reg_end;     /* region k is [reg_end[k-1], reg_end[k]), forward order */
    cudaEvent_t *up;     /* region k's upload queued (copy stream) */
    double timeout_s;
    /* layers: the decoder layers' weights stay on the host (skip elements
     * between the resident embedding and head) */
    bool layers;
    size_t skip;
    /* layers, sharded: a streamed layer's gather on the GPU (device, a
     * layer's bf16), and the last one's way back into the host copy, which
     * the next update must not overtake */
    uint16_t *gbuf;
    cudaEvent_t gbuf_down;
    /* the gradients come down region by region: the D2H stream, an event
     * for "the region's kernels are queued", a later micro-batch's staging,
     * the model's slots (each one's last copy down) and the slot each
     * region was written to */
    cudaStream_t down;
    cudaEvent_t kern;
    float *slot_buf[8];
    cudaEvent_t slot_down[8];
    bool slot_busy[8];
    int nslots;
    float **reg_slot;
    int pass;      /* backward passes this step */
    bool staged;   /* a later pass's gradients in the staging, not yet added */
    /* several ranks: the seam's (rl_train_dist) for this micro-batch --
     * its gradient slot and hook called first, and each region copied down
     * once `reduced` says its average is in the slot; NULL: alone */
    void (*dslot)(void *, size_t, float *);
    rl_grad_ready_fn dhook;
    void (*reduced)(void *, size_t, void *);
    void *dctx;

    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy, stop;     /* a step handed over and not finished; shutting down */
    rl_train_update u;   /* the step's (no callbacks are called: no shard) */
    double scale;
    double host_wait_s;  /* the training thread blocked on this pipeline, since the last read */
    int done;            /* regions updated (by every rank sharing them) and queued this step */
    int waited;          /* regions the model's stream waits for already */
    int rc;
    rl_err err;
};

static int cuda_err(cudaError_t ce, const char *what, rl_err *e) {
    return rl_errf(e, RL_EIO, "train.offload: %s: %s", what, cudaGetErrorString(ce));
}

static size_t region_start(const rl_offload *o, int k) { return k ? o->reg_end[k - 1] : 0; }
/* dist.shard (the device seam's shard, set while the worker is idle): this
 * rank's slices are the shard's ranges, and the other ranks' parts of the
 * bf16 weights come by the seam's gather on the GPU (d->gather_region) */
static bool sharded(const rl_offload *o) { return o->d->shard != NULL; }
/* region k's bf16 weights live on the GPU (all of them, or with layers the
 * embedding and the head, the head right after the embedding there) */
static bool resident(const rl_offload *o, int k) { return !o->layers || k == 0 || k == o->nreg - 1; }
static size_t dev_shift(const rl_offload *o, int k) { return o->layers && k == o->nreg - 1 ? o->skip : 0; }

/* the region starting at off, or -1 */
static int region_at(const rl_offload *o, size_t off) {
    for (int k = 0; k < o->nreg; k++)
        if (region_start(o, k) == off) return k;
    return -1;
}

/* Nothing on the GPU reads the bf16 pages (they are about to change under
 * their addresses): the copies up and the model's ring copies are done. */
static int quiet_bf16(rl_offload *o, rl_err *e) {
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce == cudaSuccess && o->registered) ce = cudaHostUnregister(o->hs.bf16);
    if (ce != cudaSuccess) return cuda_err(ce, "releasing the bf16 weights' pages", e);
    o->registered = false;
    return RL_OK;
}

static int pin_bf16(rl_offload *o, rl_err *e) {
    cudaError_t ce = cudaHostRegister(o->hs.bf16, o->d->n * sizeof(uint16_t), cudaHostRegisterDefault);
    if (ce != cudaSuccess) return cuda_err(ce, "registering the bf16 weights' pages", e);
    o->registered = true;
    return RL_OK;
}

/* *p: pinned host memory for held floats (this rank's slices), or a failure naming what */
static int pin_slices(float **p, size_t held, const char *what, rl_err *e) {
    size_t bytes = (held ? held : 1) * sizeof(float);
    cudaError_t ce = cudaMallocHost((void **)p, bytes);
    if (ce == cudaSuccess) return RL_OK;
    *p = NULL;
    return rl_errf(e, RL_ENOMEM, "train.offload: %zu MiB of pinned host memory for %s: %s", bytes >> 20, what,
                   cudaGetErrorString(ce));
}

static void add_slice(rl_offload *o, int *i, size_t off, size_t len, bool shared) {
    if (len) o->sl[(*i)++] = (slice){.off = off, .len = len, .at = o->held, .shared = shared};
    o->held += len;
}

/* This rank's slices of each region and its gradients' buffers, sized for
 * them: all of every region alone; 1/N of them when N ranks share the
 * state (host_state.h's slice); with a shard its ranges (pkg/ddp's plan:
 * a region is a bucket, its block then the tail every rank holds), whose
 * moments the device seam keeps in the same order. Between steps. */
static int slice_grads(rl_offload *o, rl_err *e) {
    const rl_train_shard *sh = o->d->shard;
    int i = 0, j = 0;
    o->held = 0;
    for (int k = 0; k < o->nreg; k++) {
        size_t lo = region_start(o, k), hi = o->reg_end[k], a, b;
        o->sl_first[k] = i;
        for (; sh && j < sh->n && sh->r[j].off < hi; j++) {
            if (sh->r[j].off < lo || sh->r[j].off + sh->r[j].len > hi)
                return rl_errf(e, RL_EINTERNAL, "train.offload: shard range [%zu, +%zu) across region %d",
                               sh->r[j].off, sh->r[j].len, k);
            add_slice(o, &i, sh->r[j].off, sh->r[j].len, sh->r[j].shared);
        }
        if (!sh) rl_host_slice(&o->hs, lo, hi, &a, &b), add_slice(o, &i, a, b - a, false);
    }
    o->sl_first[o->nreg] = i;
    if (sh && (j != sh->n || o->held != sh->total))
        return rl_errf(e, RL_EINTERNAL, "train.offload: a shard of %zu elements in %d ranges, %zu in the regions",
                       sh->total, sh->n, o->held);
    if (o->grads) cudaFreeHost(o->grads);
    if (o->stage) cudaFreeHost(o->stage); /* made again by the first step of several micro-batches */
    o->grads = o->stage = NULL;
    return pin_slices(&o->grads, o->held, "the gradients", e);
}

/* params [lo, hi) rounded into the host's bf16 copy */
static void round_bf16(rl_offload *o, size_t lo, size_t hi) {
    const float *p = o->d->params;
    uint16_t *b = o->hs.bf16;
#pragma omp parallel for schedule(static)
    for (size_t i = lo; i < hi; i++) b[i] = rl_comm_f32_to_bf16(p[i]);
}

/* this rank's slices of region k (all of it, unless the node's ranks share
 * the state or it is sharded) updated on the host and published (the
 * moments: the device seam's, the shard's where it has one) */
static void update_region(rl_offload *o, int k) {
    for (const slice *s = o->sl + o->sl_first[k]; s < o->sl + o->sl_first[k + 1]; s++) {
        rl_train_host_adamw(o->d, &o->u, o->d->params, o->grads + s->at, o->scale, s->off, s->off + s->len);
        round_bf16(o, s->off, s->off + s->len);
    }
    rl_host_state_publish(&o->hs, k);
}

/* region k, updated by every rank that shares it, queued up (with layers a
 * decoder layer's stay on the host: the model copies them itself; sharded,
 * this rank's slices only: gather_in brings the rest) */
static int queue_region(rl_offload *o, int k, rl_err *e) {
    size_t lo = region_start(o, k), hi = o->reg_end[k], shift = dev_shift(o, k);
    uint16_t *dev = o->params_dev;
    cudaError_t ce = cudaSuccess;
    for (const slice *s = o->sl + o->sl_first[k];
         resident(o, k) && sharded(o) && s < o->sl + o->sl_first[k + 1] && ce == cudaSuccess; s++)
        ce = cudaMemcpyAsync(dev + (s->off - shift), o->hs.bf16 + s->off, s->len * sizeof(uint16_t),
                             cudaMemcpyHostToDevice, o->copy);
    if (resident(o, k) && !sharded(o))
        ce = cudaMemcpyAsync(dev + (lo - shift), o->hs.bf16 + lo, (hi - lo) * sizeof(uint16_t),
                             cudaMemcpyHostToDevice, o->copy);
    if (ce == cudaSuccess) ce = cudaEventRecord(o->up[k], o->copy);
    return ce == cudaSuccess ? RL_OK : cuda_err(ce, "queueing the weights' copy to the GPU", e);
}

/* Regions up to `upto` whose every slice is in queued, in order (done);
 * with wait, polling the other ranks' progress until the deadline. */
static int queue_ready(rl_offload *o, int upto, double deadline, rl_err *e) {
    for (int spins = 0; o->done <= upto;) {
        if (!rl_host_state_ready(&o->hs, o->done, o->gen)) {
            if (deadline <= 0) return RL_OK;
            if (atomic_load(&o->cancel)) return rl_errf(e, RL_EABORT, "train.offload: the round ended");
            if (rl_now() > deadline)
                return rl_errf(e, RL_ETIMEOUT, "train.offload: the node's other ranks have not updated their "
                               "slices of region %d after %.0f s", o->done, o->timeout_s);
            if (++spins > 64) {
                struct timespec ts = {0, 20000}; /* 20 us: a region takes milliseconds at least */
                nanosleep(&ts, NULL);
            }
            continue;
        }
        int rc = queue_region(o, o->done, e);
        if (rc) return rc;
        pthread_mutex_lock(&o->mu);
        o->done++;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
    }
    return RL_OK;
}

/* A GPU's NUMA node from sysfs (its PCI device's numa_node), or -1: none
 * known (one socket, or no PCI device behind it). */
static int gpu_node(int dev) {
    char bus[32], path[96], *txt = NULL;
    size_t len;
    rl_err e;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) return (void)cudaGetLastError(), -1;
    for (char *p = bus; *p; p++) *p = (char)tolower((unsigned char)*p); /* sysfs spells it in lower case */
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    int node = rl_read_file(path, &txt, &len, &e) ? -1 : atoi(txt);
    free(txt);
    return node;
}

/* The update's threads (this one and the OpenMP team its AdamW forks) on
 * the CPUs of the GPU's NUMA node, next to its PCIe root and the pinned
 * buffers the copies read, within the CPUs this process may use; each
 * GPU of that node that the process sees takes its own slice (a process
 * per GPU that sees them all, as torchrun's, then shares the node without
 * oversubscribing it; a pod sees its own). Without a node the threads stay
 * as they are. Said once in the log, whichever way. */
static void pin_near_gpu(int device) {
    int node = gpu_node(device), gpus = 0, share = 0, index = 0, n = 0;
    char path[96], *txt = NULL;
    size_t len;
    rl_err e;
    cpu_set_t cpus, allowed, mine;
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    bool known = node >= 0 && !rl_read_file(path, &txt, &len, &e) && rl_cpulist_parse(txt, &cpus) > 0 &&
                 !sched_getaffinity(0, sizeof allowed, &allowed);
    free(txt);
    if (known && cudaGetDeviceCount(&gpus) == cudaSuccess) {
        for (int d = 0; d < gpus; d++)
            if (gpu_node(d) == node) index += d < device, share++;
        n = rl_cpuset_slice(&cpus, &allowed, share, index, &mine);
    }
    if (n > 0 && pthread_setaffinity_np(pthread_self(), sizeof mine, &mine) == 0) {
        omp_set_num_threads(n);
        rl_log(RL_LOG_INFO, "offload_threads", "\"gpu\":%d,\"numa_node\":%d,\"gpus_on_node\":%d,\"threads\":%d",
               device, node, share, n);
    } else {
        rl_log(RL_LOG_INFO, "offload_threads", "\"gpu\":%d,\"numa_node\":%d,\"pinned\":false", device, node);
    }
}

static void *worker(void *arg) {
    rl_offload *o = arg;
    cudaError_t dev = cudaSetDevice(o->device); /* a new thread starts on device 0 */
    if (dev == cudaSuccess) pin_near_gpu(o->device);
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->busy && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        pthread_mutex_unlock(&o->mu);
        rl_err e = {0};
        int rc = dev == cudaSuccess ? RL_OK : cuda_err(dev, "cudaSetDevice on the update thread", &e);
        /* the last gather's whole layer (stale in this rank's ranges) lands before they are written */
        cudaError_t ce = !rc && o->gbuf ? cudaEventSynchronize(o->gbuf_down) : cudaSuccess;
        if (ce != cudaSuccess) rc = cuda_err(ce, "waiting for a streamed layer's gather to reach the host", &e);
        /* each region's slice, then whatever every rank has finished goes up */
        for (int k = 0; k < o->nreg && !rc; k++) {
            update_region(o, k);
            rc = queue_ready(o, k, 0, &e);
        }
        if (!rc) rc = queue_ready(o, o->nreg - 1, rl_now() + o->timeout_s, &e);
        pthread_mutex_lock(&o->mu);
        if (rc && !o->rc) o->rc = rc, o->err = e;
        o->busy = false;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int rl_offload_new(rl_train_device *d, void *params_dev, void *model_stream, double timeout_s, bool layers,
                   rl_offload **out, rl_err *e) {
    rl_offload *o = calloc(1, sizeof *o);
    if (!o) return rl_errf(e, RL_ENOMEM, "train.offload: out of memory");
    *out = o;
    o->d = d, o->params_dev = params_dev, o->model = model_stream, o->timeout_s = timeout_s;
    const rl_model_config *c = &d->cfg->model;
    cudaError_t ce = cudaGetDevice(&o->device);
    if (ce != cudaSuccess) return cuda_err(ce, "cudaGetDevice", e);
    rl_param_layout lay;
    rl_param_layout_init(&lay, c);
    /* the embedding, each layer, then the final norm and lm_head */
    o->nreg = c->num_hidden_layers + 2;
    o->reg_end = calloc((size_t)o->nreg, sizeof *o->reg_end);
    o->up = calloc((size_t)o->nreg, sizeof *o->up);
    if (!o->reg_end || !o->up) return rl_errf(e, RL_ENOMEM, "train.offload: out of memory");
    o->reg_end[0] = lay.layers;
    for (int l = 0; l < c->num_hidden_layers; l++) o->reg_end[l + 1] = lay.layers + (size_t)(l + 1) * lay.layer_size;
    o->reg_end[o->nreg - 1] = lay.total;
    o->layers = layers, o->skip = lay.final_norm - lay.layers;
    o->reg_slot = calloc((size_t)o->nreg, sizeof *o->reg_slot);
    o->sl = calloc(2 * (size_t)o->nreg, sizeof *o->sl); /* a block and a tail each at most */
    o->sl_first = calloc((size_t)o->nreg + 1, sizeof *o->sl_first);
    if (!o->reg_slot || !o->sl || !o->sl_first) return rl_errf(e, RL_ENOMEM, "train.offload: out of memory");
    ce = cudaStreamCreateWithFlags(&o->down, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&o->kern, cudaEventDisableTiming);
    for (int k = 0; k < 8 && ce == cudaSuccess; k++) ce = cudaEventCreateWithFlags(&o->slot_down[k], cudaEventDisableTiming);
    if (ce != cudaSuccess) return cuda_err(ce, "the gradients' way down (stream, events)", e);
    /* with dist.shard the moments are the device seam's, sized to the shard */
    bool moments = rl_shard_mode_of(d->cfg->dist.shard) == RL_SHARD_NONE;
    int rc = rl_host_state_alloc(&o->hs, d->n, o->nreg, moments, e);
    if (rc || (rc = slice_grads(o, e)) || (rc = pin_bf16(o, e))) return rc;
    d->params = o->hs.params, d->opt = o->hs.opt;
    if ((ce = cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_err(ce, "cudaStreamCreate", e);
    for (int k = 0; k < o->nreg; k++)
        if ((ce = cudaEventCreateWithFlags(&o->up[k], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_err(ce, "cudaEventCreate", e);
    o->waited = o->nreg; /* nothing to wait for before the first step */
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, worker, o) != 0)
        return rl_errf(e, RL_EINTERNAL, "train.offload: cannot start the update thread");
    o->started = true;
    return RL_OK;
}

/* The worker idle within timeout_s (its own slices take seconds at most);
 * false: still busy. Caller holds mu. */
static bool idle_locked(rl_offload *o) {
    for (double end = rl_now() + o->timeout_s; o->busy && rl_now() < end;) rl_cond_wait_s(&o->cv, &o->mu, 0.05);
    return !o->busy;
}

void rl_offload_free(rl_offload *o) {
    if (!o) return;
    if (o->started) {
        atomic_store(&o->cancel, true); /* no more waiting for the other ranks' slices */
        pthread_mutex_lock(&o->mu);
        /* a thread stuck past the timeout (in a CUDA call on a hung GPU)
         * keeps the state it works on: left to the process's end, not freed
         * under it */
        if (!idle_locked(o)) {
            pthread_mutex_unlock(&o->mu);
            rl_log(RL_LOG_ERROR, "offload_stuck", "\"timeout_s\":%.0f,\"what\":\"the host's AdamW thread did not "
                   "stop; its host state is not freed\"", o->timeout_s);
            return;
        }
        o->stop = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->cv);
    }
    if (o->copy) cudaStreamSynchronize(o->copy);
    if (o->down) cudaStreamSynchronize(o->down);
    for (int k = 0; o->up && k < o->nreg; k++)
        if (o->up[k]) cudaEventDestroy(o->up[k]);
    for (int k = 0; k < 8; k++)
        if (o->slot_down[k]) cudaEventDestroy(o->slot_down[k]);
    if (o->kern) cudaEventDestroy(o->kern);
    if (o->copy) cudaStreamDestroy(o->copy);
    if (o->down) cudaStreamDestroy(o->down);
    if (o->stage) cudaFreeHost(o->stage);
    if (o->gbuf) cudaFree(o->gbuf), cudaEventDestroy(o->gbuf_down);
    free(o->reg_slot), free(o->sl), free(o->sl_first);
    if (o->grads) cudaFreeHost(o->grads);
    if (o->registered) cudaHostUnregister(o->hs.bf16);
    rl_host_state_free(&o->hs);
    free(o->reg_end), free(o->up);
    free(o);
}

int rl_offload_grad_sq(rl_offload *o, double *sq, rl_err *e) {
    *sq = sharded(o) ? 0 : rl_grad_sq(o->grads, o->held);
    for (const slice *s = o->sl; sharded(o) && s < o->sl + o->sl_first[o->nreg]; s++)
        if (!s->shared || o->d->rank == 0) *sq += rl_grad_sq(o->grads + s->at, s->len); /* a tail: once */
    if (!o->sdist) return RL_OK;
    /* the slices' sums over the ranks: an average times the world */
    int rc = o->sdist->average(o->sdist->ctx, sq, 1, e);
    *sq *= o->sdist->world;
    return rc;
}

/* Bounded: the worker's regions end, or the step fails by name. Caller
 * holds mu. */
static int wait_done_locked(rl_offload *o, int regions, rl_err *e) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)o->timeout_s;
    int w = 0;
    double t0 = rl_now();
    while (o->busy && o->done < regions && !o->rc && w != ETIMEDOUT) w = pthread_cond_timedwait(&o->cv, &o->mu, &dl);
    o->host_wait_s += rl_now() - t0;
    if (o->rc) return *e = o->err, o->rc;
    if (o->busy && o->done < regions)
        return rl_errf(e, RL_ETIMEOUT, "train.offload: the host's AdamW not done after %.0f s", o->timeout_s);
    return RL_OK;
}

/* the gradients' copies down done (training thread) */
static cudaError_t down_sync(rl_offload *o) {
    double t0 = rl_now();
    cudaError_t ce = cudaStreamSynchronize(o->down);
    o->host_wait_s += rl_now() - t0;
    return ce;
}

/* The gradients' copies down done and a later micro-batch's, staged,
 * added to the step's (training thread). The add waits not for its
 * micro-batch's end but until the staging is needed again -- the next
 * backward's start, the forward of that micro-batch already queued, so
 * the GPU runs it meanwhile -- or the step's gradients are read
 * (rl_offload_join). */
static int settle_down(rl_offload *o, rl_err *e) {
    cudaError_t ce = o->down ? down_sync(o) : cudaSuccess;
    if (ce != cudaSuccess) return cuda_err(ce, "the gradients' copy to the host", e);
    if (!o->staged) return RL_OK;
    o->staged = false;
    float *g = o->grads;
    const float *s = o->stage;
    size_t n = o->held;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] += s[i];
    return RL_OK;
}

double rl_offload_host_wait(rl_offload *o) {
    double s = o->host_wait_s;
    o->host_wait_s = 0;
    return s;
}

int rl_offload_step(rl_offload *o, const rl_train_update *u, double scale, rl_err *e) {
    int rc = rl_offload_join(o, e);
    if (rc) return rc;
    pthread_mutex_lock(&o->mu);
    o->u = *u, o->u.sum = NULL, o->u.gather = NULL, o->u.dist_ctx = NULL;
    o->scale = scale, o->done = 0, o->waited = 0, o->busy = true, o->gen++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return RL_OK;
}

int rl_offload_join(rl_offload *o, rl_err *e) {
    pthread_mutex_lock(&o->mu);
    int rc = wait_done_locked(o, o->nreg, e);
    pthread_mutex_unlock(&o->mu);
    if (!rc) rc = settle_down(o, e);
    /* the model's stream takes every region's copy, waited for or not */
    if (!rc) rl_offload_wait(o, SIZE_MAX);
    pthread_mutex_lock(&o->mu);
    if (!rc && o->rc) rc = o->rc, *e = o->err;
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* regions holding any element below upto */
static int regions_below(const rl_offload *o, size_t upto) {
    int need = 0;
    while (need < o->nreg && (need == 0 || o->reg_end[need - 1] < upto)) need++;
    return need;
}

/* Region k of a host array (the fp32 master, or with bf16 the weights'
 * copy) made whole through dev, a device buffer of the region: this rank's
 * slices up, the other ranks' gathered in (the seam's collective), all of
 * it down, queued on the model's stream. *ce: a CUDA call's failure. */
static int whole_region(rl_offload *o, int k, void *host, void *dev, bool bf16, cudaError_t *ce, rl_err *e) {
    size_t lo = region_start(o, k), len = o->reg_end[k] - lo, es = bf16 ? sizeof(uint16_t) : sizeof(float);
    char *h = host, *d = dev;
    *ce = cudaSuccess;
    for (const slice *s = o->sl + o->sl_first[k]; s < o->sl + o->sl_first[k + 1] && *ce == cudaSuccess; s++)
        *ce = cudaMemcpyAsync(d + (s->off - lo) * es, h + s->off * es, s->len * es, cudaMemcpyHostToDevice, o->model);
    int rc = *ce == cudaSuccess ? o->d->gather_region(o->d->gather_ctx, dev, lo, len, bf16, e) : RL_OK;
    if (!rc && *ce == cudaSuccess) *ce = cudaMemcpyAsync(h + lo * es, dev, len * es, cudaMemcpyDeviceToHost, o->model);
    return rc;
}

/* Sharded: the other ranks' parts of region k, behind this rank's (the
 * seam's collectives follow the model's stream): on the GPU where the
 * region lives there; a streamed layer into the host's bf16 copy that the
 * model's ring reads (whole_region through gbuf), behind which the ring's
 * copy of the layer is queued. */
static int gather_in(rl_offload *o, int k, rl_err *e) {
    size_t lo = region_start(o, k), len = o->reg_end[k] - lo;
    if (resident(o, k))
        return o->d->gather_region(o->d->gather_ctx, (uint16_t *)o->params_dev + (lo - dev_shift(o, k)), lo, len,
                                   true, e);
    if (!o->gbuf) return rl_errf(e, RL_EINTERNAL, "train.offload: a streamed layer's gather without its buffer");
    cudaError_t ce;
    int rc = whole_region(o, k, o->hs.bf16, o->gbuf, true, &ce, e);
    if (!rc && ce == cudaSuccess) ce = cudaEventRecord(o->gbuf_down, o->model);
    return !rc && ce != cudaSuccess ? cuda_err(ce, "gathering a streamed layer's weights from every rank", e) : rc;
}

/* The model's stream behind the copies up of the regions below upto and,
 * sharded, their gathers issued: by the training thread, region by region
 * in the forward's order, the same order on every rank. */
void rl_offload_wait(void *ctx, size_t upto) {
    rl_offload *o = ctx;
    pthread_mutex_lock(&o->mu);
    int need = regions_below(o, upto);
    rl_err e = {0};
    int rc = o->waited < need ? wait_done_locked(o, need, &e) : RL_OK;
    for (; !rc && o->waited < need && o->waited < o->done; o->waited++) {
        int k = o->waited;
        cudaError_t ce = cudaStreamWaitEvent(o->model, o->up[k], 0);
        if (ce != cudaSuccess) rc = cuda_err(ce, "ordering the forward after the weights' copy", &e);
        if (!rc && sharded(o)) rc = gather_in(o, k, &e);
    }
    if (rc && !o->rc) o->rc = rc, o->err = e;
    pthread_mutex_unlock(&o->mu);
}
/* ---- layers: the weights' host copy -------------------------------------- */
const uint16_t *rl_offload_bf16(rl_offload *o) { return o->hs.bf16; }

void rl_offload_set_bf16(rl_offload *o) { round_bf16(o, 0, o->d->n); }

/* host-side: the copy about to read [0, upto) of the weights' host copy
 * sees the update's values (the step's regions are written in order);
 * sharded, the other ranks' parts too: the copy is queued behind their
 * gather's way down */
void rl_offload_ready(void *ctx, size_t upto) {
    rl_offload *o = ctx;
    if (sharded(o)) return rl_offload_wait(o, upto);
    pthread_mutex_lock(&o->mu);
    int need = regions_below(o, upto);
    rl_err e = {0};
    int rc = wait_done_locked(o, need, &e);
    if (rc && !o->rc) o->rc = rc, o->err = e;
    pthread_mutex_unlock(&o->mu);
}

/* ---- the gradients' way down ---------------------------------------------- */
static void keep(rl_offload *o, int rc, const rl_err *e) {
    pthread_mutex_lock(&o->mu);
    if (rc && !o->rc) o->rc = rc, o->err = *e;
    pthread_mutex_unlock(&o->mu);
}

static int slot_index(const rl_offload *o, const float *slot) {
    for (int k = 0; k < o->nslots; k++)
        if (o->slot_buf[k] == slot) return k;
    return -1;
}

/* the model is about to write region off's gradients into slot: its
 * stream waits until the slot's last copy down is done */
void rl_offload_grad_slot(void *ctx, size_t off, float *slot) {
    rl_offload *o = ctx;
    rl_err e = {0};
    int r = region_at(o, off), k = slot_index(o, slot), rc = RL_OK;
    if (r < 0) rc = rl_errf(&e, RL_EINTERNAL, "train.offload: a gradient slot for offset %zu", off);
    else if (k < 0 && o->nslots == 8) rc = rl_errf(&e, RL_EINTERNAL, "train.offload: more than 8 gradient slots");
    if (!rc && k < 0) k = o->nslots, o->slot_buf[o->nslots++] = slot;
    if (!rc && o->dslot) o->dslot(o->dctx, off, slot); /* the seam knows where the region is */
    cudaError_t ce = !rc && o->slot_busy[k] ? cudaStreamWaitEvent(o->model, o->slot_down[k], 0) : cudaSuccess;
    if (ce != cudaSuccess) rc = cuda_err(ce, "ordering a gradient slot after its copy down", &e);
    if (!rc) o->reg_slot[r] = slot;
    keep(o, rc, &e);
}

/* The staging of a step's later micro-batches, as big as the gradients:
 * made when a step first has a second backward (training thread, once),
 * so a run of one micro-batch a step never pins it. A failure is kept. */
static void stage_alloc(rl_offload *o) {
    rl_err e = {0};
    int rc = pin_slices(&o->stage, o->held, "a later micro-batch's gradients", &e);
    keep(o, rc, &e);
}

/* hook: a backward pass begins (the buffer's length), or region off's
 * gradients are queued: copied down behind them, the step's first pass
 * into the gradients (the update reading them is done by now: the forward
 * waited for every region), a later one's into the staging copy */
void rl_offload_grad_ready(void *ctx, size_t off) {
    rl_offload *o = ctx;
    if (o->dhook) o->dhook(o->dctx, off); /* the region's average queued */
    if (off >= o->d->n) {
        o->pass++;
        if (o->pass == 2 && !o->stage) stage_alloc(o);
        rl_err e = {0};
        int rc = o->staged ? settle_down(o, &e) : RL_OK; /* the last pass's, before this one's come down over them */
        keep(o, rc, &e);
        return;
    }
    int r = region_at(o, off);
    if (r < 0) return; /* lm_head's watermark, inside the head's region */
    rl_err e = {0};
    int rc = RL_OK, k = slot_index(o, o->reg_slot[r]);
    if (o->pass <= 1) {
        pthread_mutex_lock(&o->mu);
        rc = wait_done_locked(o, o->nreg, &e);
        pthread_mutex_unlock(&o->mu);
    }
    /* this rank's slices of it: all of it unless the state is shared or sharded */
    float *buf = o->pass <= 1 ? o->grads : o->stage;
    cudaError_t ce = cudaSuccess;
    if (!rc && k < 0) rc = rl_errf(&e, RL_EINTERNAL, "train.offload: region %d's gradients in no slot", r);
    if (!rc && !buf) rc = rl_errf(&e, RL_ENOMEM, "train.offload: no staging for a later micro-batch's gradients");
    if (!rc && o->reduced) { /* behind the average, itself behind the region's kernels */
        o->reduced(o->dctx, off, o->down);
    } else if (!rc) {
        ce = cudaEventRecord(o->kern, o->model);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent(o->down, o->kern, 0);
    }
    for (const slice *s = o->sl + o->sl_first[r]; !rc && ce == cudaSuccess && s < o->sl + o->sl_first[r + 1]; s++)
        ce = cudaMemcpyAsync(buf + s->at, o->reg_slot[r] + (s->off - off), s->len * sizeof(float),
                             cudaMemcpyDeviceToHost, o->down);
    if (!rc && ce == cudaSuccess) ce = cudaEventRecord(o->slot_down[k], o->down);
    if (!rc && ce == cudaSuccess) o->slot_busy[k] = true;
    if (ce != cudaSuccess) rc = cuda_err(ce, "a region's gradients' copy to the host", &e);
    keep(o, rc, &e);
}

void rl_offload_zero(rl_offload *o) { o->pass = 0, o->staged = false; }

int rl_offload_set_dist(rl_offload *o, const rl_train_dist *dist, rl_grad_ready_fn hook, rl_err *e) {
    bool reduce = dist && dist->reduced;
    if (reduce && (!dist->grad_slot || !hook))
        return rl_errf(e, RL_EINTERNAL, "train.offload: a seam that reduces in slots without its slot or hook");
    if (!reduce && dist && dist->world > 1)
        return rl_errf(e, RL_EINTERNAL, "train.offload on %d ranks: the seam does not average the "
                       "gradients in their slots (DDP created without the model's regions?)", dist->world);
    o->dslot = reduce ? dist->grad_slot : NULL;
    o->dhook = reduce ? hook : NULL;
    o->reduced = reduce ? dist->reduced : NULL;
    o->dctx = reduce ? dist->ctx : NULL;
    return RL_OK;
}

int rl_offload_micro_end(rl_offload *o, rl_err *e) {
    pthread_mutex_lock(&o->mu);
    int rc = o->rc;
    if (rc) *e = o->err;
    pthread_mutex_unlock(&o->mu);
    if (!rc && o->pass > 1) o->staged = true;
    return rc;
}

/* ---- a node's ranks sharing the host state -------------------------------- */
/* After the state changed hands (or failed to; rc the swap's, kept first):
 * the counters from zero (the object's start there), with reslice this
 * rank's slices and gradient buffers for sdist's ranks (NULL: alone), and
 * the bf16 pages pinned again. */
static int rebind(rl_offload *o, int rc, bool reslice, const rl_train_dist *sdist, rl_err *e) {
    o->gen = 0, o->sdist = sdist;
    if (!rc && reslice) rc = slice_grads(o, e);
    int rc2 = o->registered ? RL_OK : pin_bf16(o, rc ? &(rl_err){0} : e);
    return rc ? rc : rc2;
}

int rl_offload_share(rl_offload *o, const rl_train_dist *dist, bool *shared, char *why, size_t whyn, rl_err *e) {
    *shared = false;
    if (!o->hs.opt) return snprintf(why, whyn, "dist.shard: each rank keeps its shard of the moments"), RL_OK;
    int rc = rl_offload_join(o, e);
    if (!rc) rc = quiet_bf16(o, e);
    if (!rc) rc = rl_host_state_share(&o->hs, dist, shared, why, whyn, e);
    rc = rebind(o, rc, *shared, *shared ? dist : NULL, e);
    /* each rank now takes only its slice of a region down, and the slices
     * are the seam's reduce-scatter blocks: half the bytes reduced */
    if (!rc && *shared && dist->split) dist->split(dist->ctx);
    return rc;
}

static bool state_whole(const rl_offload *o) {
    for (int k = 0; k < o->nreg; k++)
        if (!rl_host_state_ready(&o->hs, k, o->gen)) return false;
    return true;
}

/* A round is over, the state this rank's own: the worker idle (before a
 * new round's shard replaces the moments it writes) and the model's stream
 * behind every region's copy up. A sharded step's gathers not yet issued
 * are dropped: the round that would answer them is gone, the next resume
 * uploads the whole weights, and issued in the new round they would be a
 * collective only some of its ranks call. */
static int round_over(rl_offload *o, rl_err *e) {
    pthread_mutex_lock(&o->mu);
    int rc = idle_locked(o) ? RL_OK
                            : rl_errf(e, RL_ETIMEOUT, "train.offload: the host's AdamW not done after %.0f s",
                                      o->timeout_s);
    cudaError_t ce = cudaSuccess;
    for (; !rc && ce == cudaSuccess && o->waited < o->done; o->waited++)
        ce = cudaStreamWaitEvent(o->model, o->up[o->waited], 0);
    pthread_mutex_unlock(&o->mu);
    return !rc && ce != cudaSuccess ? cuda_err(ce, "ordering the forward after the weights' copy", e) : rc;
}

int rl_offload_unshare(rl_offload *o, bool *whole, rl_err *e) {
    *whole = true;
    if (!rl_host_state_shared(&o->hs)) return round_over(o, e);
    /* whole once every rank's slices of the last update are in: at once when
     * the round ended gracefully, never when a rank died in its update --
     * then, after the peer timeout, the update stops waiting for it */
    bool all = false;
    for (double end = rl_now() + o->timeout_s; !(all = state_whole(o)) && rl_now() < end;) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (!all) atomic_store(&o->cancel, true);
    pthread_mutex_lock(&o->mu);
    int rc = RL_OK;
    if (!idle_locked(o))
        rc = rl_errf(e, RL_ETIMEOUT, "train.offload: the host's AdamW not done after %.0f s", o->timeout_s);
    if (o->rc == RL_EABORT) o->rc = RL_OK, o->err = (rl_err){0}; /* the cancel's, not a failure */
    pthread_mutex_unlock(&o->mu);
    atomic_store(&o->cancel, false);
    *whole = state_whole(o);
    if (!rc && *whole) rc = queue_ready(o, o->nreg - 1, 0, e); /* copies up the cancel cut short */
    if (!rc) rc = quiet_bf16(o, e);
    if (!rc) rc = rl_host_state_unshare(&o->hs, e);
    return rebind(o, rc, true, NULL, e);
}

/* ---- dist.shard ------------------------------------------------------------ */
int rl_offload_set_shard(rl_offload *o, rl_err *e) {
    rl_train_device *d = o->d;
    int rc = rl_offload_join(o, e);
    if (rc) return rc;
    if (d->shard && (!d->gather_region || !d->dist))
        return rl_errf(e, RL_EINTERNAL, "train.offload: a shard without the seam's gather");
    if (d->shard && rl_host_state_shared(&o->hs))
        return rl_errf(e, RL_EINTERNAL, "train.offload: a shard of a host state the node's ranks share");
    o->sdist = d->shard ? d->dist : NULL;
    if (d->shard && o->layers && !o->gbuf) { /* a decoder layer's bf16, the same size for every layer */
        size_t layer = o->reg_end[1] - o->reg_end[0];
        cudaError_t ce = cudaMalloc((void **)&o->gbuf, layer * sizeof(uint16_t));
        if (ce == cudaSuccess && (ce = cudaEventCreateWithFlags(&o->gbuf_down, cudaEventDisableTiming)) != cudaSuccess)
            cudaFree(o->gbuf);
        if (ce != cudaSuccess)
            return o->gbuf = NULL, rl_errf(e, RL_ENOMEM, "train.offload: %zu MiB of GPU memory to gather a streamed "
                                           "layer's weights: %s", layer * sizeof(uint16_t) >> 20, cudaGetErrorString(ce));
    }
    return slice_grads(o, e);
}

/* Region by region through a device buffer: this rank's slices up, the
 * others' gathered in, all of it down into the host's master. */
int rl_offload_master(rl_offload *o, rl_err *e) {
    int rc = rl_offload_join(o, e);
    if (rc || !sharded(o)) return rc;
    size_t most = 0;
    for (int k = 0; k < o->nreg; k++)
        if (o->reg_end[k] - region_start(o, k) > most) most = o->reg_end[k] - region_start(o, k);
    float *buf = NULL, *p = o->d->params;
    cudaError_t ce = cudaMalloc((void **)&buf, most * sizeof(float));
    for (int k = 0; k < o->nreg && !rc && ce == cudaSuccess; k++) {
        rc = whole_region(o, k, p, buf, false, &ce, e);
        if (!rc && ce == cudaSuccess) ce = cudaStreamSynchronize(o->model); /* the buffer is the next region's */
    }
    if (buf) cudaFree(buf);
    return !rc && ce != cudaSuccess ? cuda_err(ce, "gathering the master weights of every rank's shard", e) : rc;
}
#endif
