/* comm dispatcher: picks the backend, validates arguments once for all
 * backends, and keeps the "dead after the first failure" rule in one place.
 * The reductions used by more than one backend (tcp's ring, every backend's
 * world-1 path) live here too. */
#include "comm/comm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t rl_dtype_size(rl_dtype t) {
    switch (t) {
    case RL_F32: return 4;
    case RL_F64: return 8;
    case RL_BF16: return 2;
    case RL_I64: return 8;
    }
    return 0;
}

static const char *dtype_name(rl_dtype t) {
    switch (t) {
    case RL_F32: return "f32";
    case RL_F64: return "f64";
    case RL_BF16: return "bf16";
    case RL_I64: return "i64";
    }
    return "?";
}

/* ---- element-wise arithmetic ---------------------------------------------- */

float rl_comm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t rl_comm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* NaN must stay NaN: rounding could carry the payload into the exponent
     * and produce infinity. Keep the sign, force a quiet-NaN mantissa bit. */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even (what PyTorch and NCCL do). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void rl_comm_reduce_sum(void *dst, const void *a, const void *b, size_t n, rl_dtype t) {
    /* No restrict: dst may alias a (in-place ring reduction). Same-index
     * aliasing still vectorises after gcc's runtime overlap check. */
    switch (t) {
    case RL_F32: {
        float *d = dst;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case RL_F64: {
        double *d = dst;
        const double *x = a, *y = b;
        for (size_t i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case RL_I64: {
        /* Unsigned arithmetic: overflow wraps (two's complement) instead of
         * being undefined behaviour, and wraps identically on every rank. */
        uint64_t *d = dst;
        const uint64_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case RL_BF16: {
        uint16_t *d = dst;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = rl_comm_f32_to_bf16(rl_comm_bf16_to_f32(x[i]) + rl_comm_bf16_to_f32(y[i]));
        break;
    }
    }
}

void rl_comm_divide(void *x, size_t n, rl_dtype t, int div) {
    switch (t) {
    case RL_F32: {
        float *p = x, d = (float)div;
        for (size_t i = 0; i < n; i++) p[i] /= d;
        break;
    }
    case RL_F64: {
        double *p = x, d = (double)div;
        for (size_t i = 0; i < n; i++) p[i] /= d;
        break;
    }
    case RL_BF16: {
        uint16_t *p = x;
        float d = (float)div;
        for (size_t i = 0; i < n; i++) p[i] = rl_comm_f32_to_bf16(rl_comm_bf16_to_f32(p[i]) / d);
        break;
    }
    case RL_I64: break; /* rejected by validation: AVG is SUM-only for integers */
    }
}

/* ---- the flight recorder ---------------------------------------------------- */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static rl_comm *live; /* this process's communicators, newest first */

static void live_add(rl_comm *c) {
    pthread_mutex_lock(&live_mu);
    c->next_live = live, live = c;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(rl_comm *c) {
    pthread_mutex_lock(&live_mu);
    for (rl_comm **p = &live; *p; p = &(*p)->next_live)
        if (*p == c) {
            *p = c->next_live;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

/* A new record for an op about to run; its seq. */
static uint64_t rec_begin(rl_comm *c, const char *op, size_t bytes) {
    pthread_mutex_lock(&c->rec_mu);
    uint64_t seq = ++c->rec_seq;
    c->rec[(seq - 1) % RL_COMM_RECORDS] =
        (rl_comm_record){.seq = seq, .op = op, .bytes = bytes, .t_issue = rl_now(), .tag = c->next_tag - 1};
    c->next_tag = 0;
    pthread_mutex_unlock(&c->rec_mu);
    return seq;
}

static int rec_end(rl_comm *c, uint64_t seq, int rc) {
    pthread_mutex_lock(&c->rec_mu);
    rl_comm_record *r = &c->rec[(seq - 1) % RL_COMM_RECORDS];
    if (r->seq == seq) r->t_done = rl_now(), r->rc = rc;
    pthread_mutex_unlock(&c->rec_mu);
    return rc;
}

static double within(double t, double lo, double hi) { return t <= 0 ? 0 : t < lo ? lo : t > hi ? hi : t; }

void rl_comm_rec_ran(rl_comm *c, uint64_t seq, double t_start, double t_end, double seen) {
    pthread_mutex_lock(&c->rec_mu);
    rl_comm_record *r = &c->rec[(seq - 1) % RL_COMM_RECORDS];
    if (r->seq == seq) {
        r->t_start = within(t_start, r->t_issue, seen);
        r->t_end = within(t_end, r->t_start > 0 ? r->t_start : r->t_issue, seen);
    }
    pthread_mutex_unlock(&c->rec_mu);
}

void rl_comm_tag_next(rl_comm *c, int tag) {
    if (c && tag >= 0) c->next_tag = tag + 1;
}

int rl_comm_records(rl_comm *c, rl_comm_record *out, int max) {
    if (!c || max <= 0) return 0;
    pthread_mutex_lock(&c->rec_mu);
    uint64_t have = c->rec_seq < RL_COMM_RECORDS ? c->rec_seq : RL_COMM_RECORDS;
    int n = have < (uint64_t)max ? (int)have : max;
    for (int i = 0; i < n; i++) out[i] = c->rec[(c->rec_seq - (uint64_t)n + (uint64_t)i) % RL_COMM_RECORDS];
    pthread_mutex_unlock(&c->rec_mu);
    return n;
}

void rl_comm_dump_all(void) {
    pthread_mutex_lock(&live_mu);
    if (!live)
        rl_log_msg(RL_LOG_WARN, "comm_records",
                   "no communicator in this process (an agent or launcher: signal its trainers)");
    double now = rl_now();
    for (rl_comm *c = live; c; c = c->next_live) {
        rl_comm_record r[RL_COMM_RECORDS];
        int n = rl_comm_records(c, r, RL_COMM_RECORDS);
        /* oldest first, DUMP_CHUNK to a line (a log line holds about 3 KB);
         * ages in seconds before now, so the dumps of several ranks compare */
        enum { DUMP_CHUNK = 11 };
        for (int first = 0; first == 0 || first < n; first += DUMP_CHUNK) {
            char line[DUMP_CHUNK * 240] = ""; /* a record is at most ~230 bytes */
            size_t at = 0;
            for (int i = first; i < n && i < first + DUMP_CHUNK && at < sizeof line; i++) {
                bool done = r[i].t_done > 0;
                char gpu[80] = "";
                if (r[i].t_start > 0)
                    snprintf(gpu, sizeof gpu, ",\"gpu_start_s_ago\":%.3f,\"gpu_end_s_ago\":%.3f", now - r[i].t_start,
                             r[i].t_end > 0 ? now - r[i].t_end : -1.0);
                at += (size_t)snprintf(line + at, sizeof line - at,
                                       "%s{\"seq\":%llu,\"op\":\"%s\",\"tag\":%d,\"bytes\":%zu,\"issued_s_ago\":%.3f,"
                                       "\"%s\":%.3f%s,\"rc\":%d}",
                                       i > first ? "," : "", (unsigned long long)r[i].seq, r[i].op, r[i].tag,
                                       r[i].bytes, now - r[i].t_issue, done ? "done_s_ago" : "running_s",
                                       now - (done ? r[i].t_done : r[i].t_issue), gpu, r[i].rc);
            }
            rl_log(RL_LOG_WARN, "comm_records", "\"rank\":%d,\"world\":%d,\"backend\":\"%s\",\"records\":[%s]",
                   c->rank, c->world, c->backend, line);
        }
    }
    pthread_mutex_unlock(&live_mu);
}

/* ---- init / dispatch ------------------------------------------------------ */

int rl_comm_init(const rl_comm_opts *o, rl_comm **out, rl_err *e) {
    if (!out) return rl_errf(e, RL_EINPUT, "comm init: out is NULL");
    *out = NULL;
    if (!o) return rl_errf(e, RL_EINPUT, "comm init: options are NULL");
    const char *backend = o->backend && *o->backend ? o->backend : "tcp";
    if (o->world < 1 || o->world > RL_COMM_MAX_WORLD)
        return rl_errf(e, RL_EINPUT, "comm init: world %d outside 1..%d", o->world,
                       RL_COMM_MAX_WORLD);
    if (o->rank < 0 || o->rank >= o->world)
        return rl_errf(e, RL_EINPUT, "comm init: rank %d outside 0..%d (world %d)", o->rank,
                       o->world - 1, o->world);
    if (!(o->timeout_s >= 0) || isinf(o->timeout_s))
        return rl_errf(e, RL_EINPUT, "comm init: timeout_s %g is not a finite number >= 0",
                       o->timeout_s);
    bool tcp = strcmp(backend, "tcp") == 0, nccl = strcmp(backend, "nccl") == 0;
    if (!tcp && !nccl)
        return rl_errf(e, RL_EINPUT, "comm init: unknown backend \"%.64s\" (want tcp or nccl)",
                       backend);
#ifndef RL_CUDA
    if (nccl)
        return rl_errf(e, RL_EINPUT,
                       "comm init: backend \"nccl\" requested but this build has no CUDA/NCCL "
                       "(rebuild with CUDA, or use backend tcp)");
#endif
    /* The store is how ranks find each other, so only world 1 can do
     * without it (tcp: no sockets at all; nccl: rank 0 keeps its own id). */
    if (o->world > 1 && !o->store)
        return rl_errf(e, RL_EINPUT, "comm init: rank %d of %d: no rendezvous store given",
                       o->rank, o->world);
    if (o->world > 1 && (!o->prefix || !*o->prefix))
        return rl_errf(e, RL_EINPUT, "comm init: rank %d of %d: empty key prefix", o->rank,
                       o->world);

    rl_comm *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "comm init: out of memory");
    c->rank = o->rank;
    c->world = o->world;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : RL_COMM_DEFAULT_TIMEOUT_S;
    atomic_init(&c->aborted, 0);
    int rc;
    if (tcp) {
        c->backend = "tcp";
        rc = rl_comm_tcp_init(o, c, e);
    } else {
#ifdef RL_CUDA
        c->backend = "nccl";
        rc = rl_comm_nccl_init(o, c, e);
#else
        rc = RL_EINTERNAL; /* unreachable: rejected above */
#endif
    }
    if (rc) {
        free(c);
        return rc;
    }
    pthread_mutex_init(&c->rec_mu, NULL);
    live_add(c);
    *out = c;
    return RL_OK;
}

int rl_comm_rank(const rl_comm *c) { return c ? c->rank : -1; }
int rl_comm_world(const rl_comm *c) { return c ? c->world : 0; }
const char *rl_comm_backend(const rl_comm *c) { return c ? c->backend : "none"; }
void *rl_comm_stream(const rl_comm *c) { return c ? c->stream : NULL; }

/* Common preamble of every op: fail fast when aborted or dead. */
static int check_alive(rl_comm *c, const char *what, rl_err *e) {
    if (!c) return rl_errf(e, RL_EINPUT, "comm %s: communicator is NULL", what);
    if (atomic_load(&c->aborted))
        return rl_errf(e, RL_EABORT, "rank %d: comm %s: communicator was aborted", c->rank,
                       what);
    if (c->dead) {
        if (e) {
            e->code = c->dead;
            snprintf(e->msg, sizeof e->msg, "rank %d: comm %s: communicator failed earlier: %.440s",
                     c->rank, what, c->dead_err.msg);
        }
        return c->dead;
    }
    return RL_OK;
}

static int check_args(rl_comm *c, const char *what, const void *a, const void *b, size_t count,
                      rl_dtype t, int redop, rl_err *e) {
    size_t es = rl_dtype_size(t);
    if (es == 0)
        return rl_errf(e, RL_EINPUT, "rank %d: comm %s: unknown dtype %d", c->rank, what,
                       (int)t);
    if (redop >= 0) {
        if (redop != RL_SUM && redop != RL_AVG)
            return rl_errf(e, RL_EINPUT, "rank %d: comm %s: unknown reduction op %d", c->rank,
                           what, redop);
        if (redop == RL_AVG && t == RL_I64)
            return rl_errf(e, RL_EINPUT, "rank %d: comm %s: AVG is not supported for i64 "
                           "(integers support SUM only)", c->rank, what);
    }
    if (count > SIZE_MAX / es / (size_t)c->world)
        return rl_errf(e, RL_EINPUT, "rank %d: comm %s: count %zu of %s overflows size_t",
                       c->rank, what, count, dtype_name(t));
    if (count > 0 && (!a || !b))
        return rl_errf(e, RL_EINPUT, "rank %d: comm %s: NULL buffer with count %zu", c->rank,
                       what, count);
    return RL_OK;
}

/* After a backend op: a failure leaves the ranks out of step, so the
 * communicator is dead from now on (see comm_internal.h). */
static int finish(rl_comm *c, int rc, rl_err *e) {
    if (rc == RL_OK) return RL_OK;
    if (!c->dead) {
        c->dead = rc;
        if (e) c->dead_err = *e;
        else rl_errf(&c->dead_err, rc, "operation failed (%s)", rl_err_name(rc));
        if (c->ops->kill) c->ops->kill(c);
    }
    return rc;
}

int rl_comm_allreduce(rl_comm *c, void *buf, size_t count, rl_dtype t, rl_redop op, rl_err *e) {
    int rc = check_alive(c, "allreduce", e);
    if (!rc) rc = check_args(c, "allreduce", buf, buf, count, t, (int)op, e);
    if (rc) return rc;
    uint64_t s = rec_begin(c, "allreduce", count * rl_dtype_size(t));
    return rec_end(c, s, finish(c, c->ops->allreduce(c, buf, count, t, op, e), e));
}

int rl_comm_broadcast(rl_comm *c, void *buf, size_t count, rl_dtype t, int root, rl_err *e) {
    int rc = check_alive(c, "broadcast", e);
    if (!rc) rc = check_args(c, "broadcast", buf, buf, count, t, -1, e);
    if (rc) return rc;
    if (root < 0 || root >= c->world)
        return rl_errf(e, RL_EINPUT, "rank %d: comm broadcast: root %d outside 0..%d", c->rank,
                       root, c->world - 1);
    uint64_t s = rec_begin(c, "broadcast", count * rl_dtype_size(t));
    return rec_end(c, s, finish(c, c->ops->broadcast(c, buf, count, t, root, e), e));
}

int rl_comm_allgather(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                      rl_err *e) {
    int rc = check_alive(c, "allgather", e);
    if (!rc) rc = check_args(c, "allgather", send, recv, count, t, -1, e);
    if (rc) return rc;
    uint64_t s = rec_begin(c, "allgather", count * rl_dtype_size(t));
    return rec_end(c, s, finish(c, c->ops->allgather(c, send, recv, count, t, e), e));
}

int rl_comm_reduce_scatter(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                           rl_redop op, rl_err *e) {
    int rc = check_alive(c, "reduce_scatter", e);
    if (!rc) rc = check_args(c, "reduce_scatter", send, recv, count, t, (int)op, e);
    if (rc) return rc;
    uint64_t s = rec_begin(c, "reduce_scatter", count * (size_t)c->world * rl_dtype_size(t));
    return rec_end(c, s, finish(c, c->ops->reduce_scatter(c, send, recv, count, t, op, e), e));
}

int rl_comm_barrier(rl_comm *c, rl_err *e) {
    int rc = check_alive(c, "barrier", e);
    if (rc) return rc;
    uint64_t s = rec_begin(c, "barrier", 0);
    return rec_end(c, s, finish(c, c->ops->barrier(c, e), e));
}

int rl_comm_link_probe(rl_comm *c, size_t bytes, double *in_gbps, rl_err *e) {
    int rc = check_alive(c, "link_probe", e);
    if (rc) return rc;
    if (!in_gbps || bytes < 1 || bytes > ((size_t)1 << 30))
        return rl_errf(e, RL_EINPUT, "rank %d: comm link_probe: %zu bytes outside 1..1 GiB, or no output", c->rank,
                       bytes);
    *in_gbps = 0;
    if (c->world == 1 || !c->ops->link_probe) return RL_OK;
    uint64_t s = rec_begin(c, "link_probe", bytes);
    return rec_end(c, s, finish(c, c->ops->link_probe(c, bytes, in_gbps, e), e));
}

int rl_comm_wait(rl_comm *c, rl_err *e) {
    int rc = check_alive(c, "wait", e);
    if (rc) return rc;
    uint64_t s = rec_begin(c, "wait", 0);
    return rec_end(c, s, finish(c, c->ops->wait(c, e), e));
}

void rl_comm_abort(rl_comm *c) {
    if (!c) return;
    /* Only the first call wakes the backend; repeated aborts are no-ops. */
    if (atomic_exchange(&c->aborted, 1)) return;
    if (c->ops->abort) c->ops->abort(c);
}

void rl_comm_destroy(rl_comm *c) {
    if (!c) return;
    live_remove(c);
    c->ops->destroy(c);
    pthread_mutex_destroy(&c->rec_mu);
    free(c);
}
