/* Prefetching loader: one thread reads micro-batches into a ring of `depth`
 * slots while the trainer computes, so storage latency hides behind compute.
 *
 * Micro-batch k always lives in slot k % depth. `head` counts micro-batches
 * produced and `tail` those consumed; both only grow, and head - tail is the
 * number of filled slots. The producer writes slot head % depth only while
 * head - tail < depth, and the consumer copies slot tail % depth only while
 * tail < head, so the two never touch the same slot and the copies run
 * without the lock. A producer error is stored in its slot and ends the
 * thread; the consumer returns it when it reaches that slot, after every
 * good micro-batch before it. */
#include "data/data.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The producer wakes this often while the ring is full, only as a safety
 * net: close() broadcasts, so shutdown never waits for this. */
#define PRODUCER_WAKE_S 1.0

struct rl_loader {
    rl_dataset *d;
    rl_loader_opts o;
    rl_sampler s;
    int accum;       /* micro-batches per optimizer step on this rank */
    size_t slot_len; /* B * (T + 1) */
    int32_t *ring;   /* depth * slot_len */
    int *slot_rc;    /* 0 or the error that replaced this slot's data */
    rl_err *slot_err;

    pthread_mutex_t mu;
    pthread_cond_t filled; /* head advanced */
    pthread_cond_t freed;  /* tail advanced, or stop */
    uint64_t head, tail;
    bool stop;
    bool failed; /* the consumer has returned a producer error */
    rl_err fail;

    uint64_t digest_count, digest_sum; /* samples handed out (rl_loader_digest) */

    pthread_t thread;
    bool thread_started;
    bool mu_init, filled_init, freed_init;
};

static uint64_t sample_index(const rl_loader *l, uint64_t k, int j) {
    uint64_t step = k / (uint64_t)l->accum, m = k % (uint64_t)l->accum;
    return l->o.start + step * (uint64_t)l->o.global_batch + (uint64_t)l->o.rank_offset +
           m * (uint64_t)l->o.batch + (uint64_t)j;
}

static struct timespec deadline_after(double seconds) {
    /* Clamped so that absurd timeouts cannot overflow time_t arithmetic. */
    if (seconds > 1e8) seconds = 1e8;
    if (seconds < 0) seconds = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(seconds);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void *producer(void *arg) {
    rl_loader *l = arg;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        while (!l->stop && l->head - l->tail >= (uint64_t)l->o.depth) {
            struct timespec dl = deadline_after(PRODUCER_WAKE_S);
            pthread_cond_timedwait(&l->freed, &l->mu, &dl);
        }
        if (l->stop) {
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        uint64_t k = l->head;
        pthread_mutex_unlock(&l->mu);

        size_t slot = (size_t)(k % (uint64_t)l->o.depth);
        int32_t *dst = l->ring + slot * l->slot_len;
        size_t row = (size_t)l->o.seq_len + 1;
        int rc = RL_OK;
        rl_err err = {0};
        for (int j = 0; j < l->o.batch && !rc; j++) {
            uint64_t off = rl_sampler_offset(&l->s, sample_index(l, k, j));
            rc = rl_dataset_read(l->d, off, row, dst + (size_t)j * row, &err);
        }
        l->slot_rc[slot] = rc;
        if (rc) l->slot_err[slot] = err;

        pthread_mutex_lock(&l->mu);
        l->head = k + 1;
        pthread_cond_signal(&l->filled);
        pthread_mutex_unlock(&l->mu);
        if (rc) return NULL; /* nothing after a failed slot can be trusted */
    }
}

static int check_opts(const rl_loader_opts *o, rl_err *e) {
#define BAD(...) rl_errf(e, RL_EINPUT, "loader option " __VA_ARGS__)
    if (o->batch < 1) return BAD("batch: must be >= 1, got %d", o->batch);
    if (o->seq_len < 1) return BAD("seq_len: must be >= 1, got %d", o->seq_len);
    if (o->global_batch < 1) return BAD("global_batch: must be >= 1, got %d", o->global_batch);
    if (o->rank_count < 1) return BAD("rank_count: must be >= 1, got %d", o->rank_count);
    if (o->rank_count % o->batch != 0)
        return BAD("rank_count: %d is not a multiple of batch %d", o->rank_count, o->batch);
    if (o->rank_offset < 0) return BAD("rank_offset: must be >= 0, got %d", o->rank_offset);
    if (o->rank_offset > o->global_batch - o->rank_count)
        return BAD("rank_offset: rank_offset %d + rank_count %d exceeds global_batch %d",
                   o->rank_offset, o->rank_count, o->global_batch);
    if (o->depth < 1 || o->depth > 4096)
        return BAD("depth: must be in [1, 4096], got %d", o->depth);
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s))
        return BAD("timeout_s: must be a positive number of seconds, got %g", o->timeout_s);
    /* One slot, and the whole ring, must be addressable. */
    if ((size_t)o->batch > SIZE_MAX / sizeof(int32_t) / ((size_t)o->seq_len + 1) /
                               (size_t)o->depth)
        return BAD("batch: batch %d x (seq_len %d + 1) x depth %d is too large", o->batch,
                   o->seq_len, o->depth);
#undef BAD
    return RL_OK;
}

static int init_sync(rl_loader *l, rl_err *e) {
    pthread_condattr_t ca;
    if (pthread_mutex_init(&l->mu, NULL) != 0)
        return rl_errf(e, RL_EINTERNAL, "loader: pthread_mutex_init failed");
    l->mu_init = true;
    if (pthread_condattr_init(&ca) != 0)
        return rl_errf(e, RL_EINTERNAL, "loader: pthread_condattr_init failed");
    /* Waits are measured on the monotonic clock so a wall-clock step (NTP)
     * neither fires a timeout early nor stretches it. */
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!rc) {
        rc = pthread_cond_init(&l->filled, &ca);
        l->filled_init = rc == 0;
    }
    if (!rc) {
        rc = pthread_cond_init(&l->freed, &ca);
        l->freed_init = rc == 0;
    }
    pthread_condattr_destroy(&ca);
    if (rc) return rl_errf(e, RL_EINTERNAL, "loader: condition variable setup: %s", strerror(rc));
    return RL_OK;
}

int rl_loader_open(rl_dataset *d, const rl_loader_opts *o, rl_loader **out, rl_err *e) {
    *out = NULL;
    int rc = check_opts(o, e);
    if (rc) return rc;
    rl_loader *l = calloc(1, sizeof *l);
    if (!l) return rl_errf(e, RL_ENOMEM, "loader: out of memory");
    l->d = d;
    l->o = *o;
    l->accum = o->rank_count / o->batch;
    l->slot_len = (size_t)o->batch * ((size_t)o->seq_len + 1);
    rc = rl_sampler_init(&l->s, rl_dataset_tokens(d), o->seq_len, o->seed, o->shuffle, e);
    if (rc) {
        free(l);
        return rc;
    }
    l->ring = malloc((size_t)o->depth * l->slot_len * sizeof *l->ring);
    l->slot_rc = calloc((size_t)o->depth, sizeof *l->slot_rc);
    l->slot_err = calloc((size_t)o->depth, sizeof *l->slot_err);
    if (!l->ring || !l->slot_rc || !l->slot_err) {
        rl_loader_close(l);
        return rl_errf(e, RL_ENOMEM, "loader: out of memory for %d x %zu-token slots",
                       o->depth, l->slot_len);
    }
    rc = init_sync(l, e);
    if (rc) {
        rl_loader_close(l);
        return rc;
    }
    /* The prefetch thread blocks every asynchronous signal so SIGTERM and
     * friends reach the trainer's own thread (or its sigwait/signalfd) and
     * never land here, where nobody would act on them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&l->thread, NULL, producer, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        rl_loader_close(l);
        return rl_errf(e, prc == EAGAIN ? RL_ENOMEM : RL_EINTERNAL,
                       "loader: cannot start the prefetch thread: %s", strerror(prc));
    }
    l->thread_started = true;
    *out = l;
    return RL_OK;
}

int rl_loader_next(rl_loader *l, int32_t *inputs, int32_t *targets, rl_err *e) {
    if (l->failed) {
        if (!e) return l->fail.code;
        *e = l->fail;
        return rl_err_wrap(e, "loader stopped by an earlier error");
    }
    pthread_mutex_lock(&l->mu);
    struct timespec dl = deadline_after(l->o.timeout_s);
    while (l->head == l->tail) {
        int w = pthread_cond_timedwait(&l->filled, &l->mu, &dl);
        if (w == ETIMEDOUT && l->head == l->tail) {
            pthread_mutex_unlock(&l->mu);
            return rl_errf(e, RL_ETIMEOUT,
                           "loader: no micro-batch ready after %.3g s (timeout_s); storage "
                           "too slow or stalled",
                           l->o.timeout_s);
        }
    }
    uint64_t k = l->tail;
    pthread_mutex_unlock(&l->mu);

    size_t slot = (size_t)(k % (uint64_t)l->o.depth);
    if (l->slot_rc[slot]) {
        /* The failed slot is not consumed: the position stays at the batch
         * that could not be read, and later calls return the same error
         * (prefixed) instead of waiting for a thread that has exited. */
        l->failed = true;
        l->fail = l->slot_err[slot];
        l->fail.code = l->slot_rc[slot];
        if (e) *e = l->fail;
        return l->fail.code;
    }
    const int32_t *src = l->ring + slot * l->slot_len;
    size_t T = (size_t)l->o.seq_len;
    for (int b = 0; b < l->o.batch; b++) {
        const int32_t *row = src + (size_t)b * (T + 1);
        memcpy(inputs + (size_t)b * T, row, T * sizeof *row);
        memcpy(targets + (size_t)b * T, row + 1, T * sizeof *row);
        l->digest_sum += rl_hash64(sample_index(l, k, b));
    }
    l->digest_count += (uint64_t)l->o.batch;

    pthread_mutex_lock(&l->mu);
    l->tail = k + 1;
    pthread_cond_signal(&l->freed);
    pthread_mutex_unlock(&l->mu);
    return RL_OK;
}

/* tail is written only by the consumer thread, which is also the only
 * caller of this function, so the read needs no lock. */
uint64_t rl_loader_position(const rl_loader *l) { return sample_index(l, l->tail, 0); }

void rl_loader_close(rl_loader *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->freed);
        pthread_cond_broadcast(&l->filled);
        pthread_mutex_unlock(&l->mu);
        /* Prompt: the producer is either waiting on `freed` (woken above) or
         * inside one dataset read, bounded by one micro-batch of I/O. */
        pthread_join(l->thread, NULL);
    }
    if (l->freed_init) pthread_cond_destroy(&l->freed);
    if (l->filled_init) pthread_cond_destroy(&l->filled);
    if (l->mu_init) pthread_mutex_destroy(&l->mu);
    free(l->ring);
    free(l->slot_rc);
    free(l->slot_err);
    free(l);
}

void rl_loader_digest(const rl_loader *l, uint64_t *count, uint64_t *sum) {
    *count = l->digest_count;
    *sum = l->digest_sum;
}
