/* comm internals shared by the dispatcher (comm.c) and the backends
 * (tcp.c, nccl.c). Not part of the public interface.
 *
 * comm.c owns everything backends have in common: argument validation,
 * the abort flag, and the "dead" state. A backend only moves data; when
 * one of its ops fails for any reason other than bad arguments the
 * dispatcher marks the communicator dead, so every later op fails fast with
 * the same error (a half-finished collective leaves the ranks out of step,
 * and continuing would hang or mix up data). */
#ifndef RL_COMM_INTERNAL_H
#define RL_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/comm.h"

#define RL_COMM_DEFAULT_TIMEOUT_S 60.0
#define RL_COMM_DEFAULT_CHUNK (1u << 20)
/* The hello frame carries world as u32; this bound only rejects nonsense. */
#define RL_COMM_MAX_WORLD (1 << 20)

typedef struct rl_comm_ops {
    /* Arguments are validated by comm.c: the communicator is alive, the
     * dtype/op/root are in range, count * world * size fits in size_t, and
     * buffers are non-NULL whenever count > 0. */
    int (*allreduce)(rl_comm *c, void *buf, size_t count, rl_dtype t, rl_redop op, rl_err *e);
    int (*broadcast)(rl_comm *c, void *buf, size_t count, rl_dtype t, int root, rl_err *e);
    int (*allgather)(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                     rl_err *e);
    int (*reduce_scatter)(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                          rl_redop op, rl_err *e);
    int (*barrier)(rl_comm *c, rl_err *e);
    /* rl_comm_link_probe with world > 1 (NULL: the backend cannot tell;
     * the call then returns 0 without a collective, on every rank alike) */
    int (*link_probe)(rl_comm *c, size_t bytes, double *in_gbps, rl_err *e);
    int (*wait)(rl_comm *c, rl_err *e);
    /* Called after a failed op (from the op thread): release what lets
     * peers keep waiting on us, so they fail promptly too. May be NULL. */
    void (*kill)(rl_comm *c);
    /* Called from any thread after c->aborted was set: wake blocked ops. */
    void (*abort)(rl_comm *c);
    void (*destroy)(rl_comm *c);
} rl_comm_ops;

struct rl_comm {
    const rl_comm_ops *ops;
    const char *backend; /* static string: "tcp" | "nccl" */
    int rank, world;
    double timeout_s;
    atomic_int aborted; /* set by rl_comm_abort from any thread */
    int dead;           /* 0, or the code of the error that killed it (op thread only) */
    rl_err dead_err;
    void *stream; /* nccl: the cudaStream_t ops are enqueued on; tcp: NULL */
    void *impl;
    /* The flight recorder (comm.h): the last RL_COMM_RECORDS ops, written
     * by the op thread, read by any (a dump on SIGUSR1, a heartbeat). */
    pthread_mutex_t rec_mu;
    rl_comm_record rec[RL_COMM_RECORDS];
    uint64_t rec_seq;  /* ops issued so far */
    int next_tag;      /* rl_comm_tag_next's tag + 1 for the next op (0: none); the issuing thread's */
    struct rl_comm *next_live; /* the process's live communicators (rl_comm_dump_all) */
};

/* A backend's word on when op seq ran on its device (0: not known yet),
 * seen at `seen` (rl_now()): each time is kept between the op's issue
 * and `seen`, which bounds a clock's drift; ignored once the record is
 * gone (another op took its slot). Thread-safe. */
void rl_comm_rec_ran(rl_comm *c, uint64_t seq, double t_start, double t_end, double seen);

/* Backend constructors: fill c->ops and c->impl (c->rank, world, timeout_s
 * are set; opts are validated and defaulted by comm.c). On failure they
 * release everything they made. */
int rl_comm_tcp_init(const rl_comm_opts *o, rl_comm *c, rl_err *e);
#ifdef RL_CUDA
int rl_comm_nccl_init(const rl_comm_opts *o, rl_comm *c, rl_err *e);
#endif

/* Element-wise helpers shared by the backends' world-1 paths and tests. */
/* dst[i] = a[i] + b[i] in the dtype's arithmetic (bf16 via f32, rounded to
 * nearest even; i64 wraps). dst may alias a or b. */
void rl_comm_reduce_sum(void *dst, const void *a, const void *b, size_t n, rl_dtype t);
/* x[i] /= div (f32/f64/bf16; bf16 via f32). */
void rl_comm_divide(void *x, size_t n, rl_dtype t, int div);

#endif
