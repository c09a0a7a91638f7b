/* comm: collectives over the ranks of one rendezvous round.
 *
 * One interface, two backends chosen at run time:
 *   "tcp"  -- CPU buffers, a ring over TCP between processes. Ring
 *             allreduce = reduce-scatter + allgather in chunks, pipelined,
 *             so each rank sends and receives ~2(N-1)/N of the buffer
 *             whatever N is.
 *   "nccl" -- device buffers, NCCL; built only with CUDA (RL_CUDA).
 *
 * Semantics are stream-ordered, as NCCL's: an op may return once it is
 * enqueued; rl_comm_wait() returns when every op issued so far completed
 * (tcp: every op is complete on return, so wait is immediate). Every
 * blocking step is bounded by opts.timeout_s; on timeout, peer failure or
 * rl_comm_abort() the op returns an error and the communicator is dead
 * (every later op fails fast with the same error). A dead peer therefore
 * produces an error on every other rank within the timeout, never a hang.
 *
 * Threads: ops must be issued from one thread at a time (DDP's
 * communication thread); rl_comm_abort may be called from any thread or a
 * signal-safe context's thread and makes blocked ops return promptly. */
#ifndef RL_COMM_H
#define RL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "util/util.h"

typedef enum { RL_F32 = 0, RL_F64 = 1, RL_BF16 = 2, RL_I64 = 3 } rl_dtype;
typedef enum { RL_SUM = 0, RL_AVG = 1 } rl_redop;
size_t rl_dtype_size(rl_dtype t);
/* bf16 as the backends compute it: round to nearest even (NaN kept NaN),
 * and back (exact). */
uint16_t rl_comm_f32_to_bf16(float f);
float rl_comm_bf16_to_f32(uint16_t h);

typedef struct rl_comm_opts {
    const char *backend; /* "tcp" | "nccl" */
    int rank, world;
    rl_store *store;     /* to exchange addresses / the ncclUniqueId */
    const void *secret;  /* tcp: the job's rendezvous secret; each ring link proves it
                            both ways (NULL: links prove nothing but the round) */
    size_t secret_len;
    const char *prefix;  /* key namespace, unique per round: "round/3/comm" */
    const char *host;    /* tcp: address peers should connect to (default 127.0.0.1) */
    double timeout_s;    /* bound on every blocking step (default 60); tcp: on the time
                            without progress, so large buffers may take longer in all */
    size_t chunk_bytes;  /* tcp: pipelining unit (default 1 MiB) */
    size_t sockbuf_bytes; /* tcp: SO_SNDBUF/SO_RCVBUF request; 0 (default) leaves the
                             kernel's autotuning on, which can grow past net.core.rmem_max */
    int shm;             /* tcp: 0 (default): a link between two ranks on one host moves its
                            data through shared memory (TCP stays the doorbell and liveness
                            channel); < 0: TCP only. RL_COMM_SHM=0 in the environment also
                            turns it off. */
    int device;          /* nccl: CUDA device (LOCAL_RANK) */
    void *stream;        /* nccl: cudaStream_t ops are enqueued on (NULL: create one) */
    const volatile int *cancel; /* set by another thread: init gives up within 100 ms
                                   (RL_EABORT; the store's waits follow the store's own
                                   flag, rl_store_set_cancel). NULL: none. */
} rl_comm_opts;

typedef struct rl_comm rl_comm;

/* Collective: every rank calls it with the same prefix, world and backend.
 * Establishes all connections before returning (or fails naming the rank
 * it could not reach). A protocol/version mismatch between peers is an
 * error naming the peer. */
int rl_comm_init(const rl_comm_opts *o, rl_comm **out, rl_err *e);
int rl_comm_rank(const rl_comm *c);
int rl_comm_world(const rl_comm *c);
const char *rl_comm_backend(const rl_comm *c);
/* nccl: the cudaStream_t every op is enqueued on (work that must happen
 * before an op is ordered by making this stream wait for it); tcp: NULL. */
void *rl_comm_stream(const rl_comm *c);

/* In place; count elements of dtype. AVG divides by world after summing
 * (RL_I64 supports SUM only). nccl: a host buffer (the metric averages,
 * the resume broadcast) is staged through device memory and the op
 * completes before it returns; device buffers are stream-ordered. */
int rl_comm_allreduce(rl_comm *c, void *buf, size_t count, rl_dtype t, rl_redop op, rl_err *e);
int rl_comm_broadcast(rl_comm *c, void *buf, size_t count, rl_dtype t, int root, rl_err *e);
/* recv holds world * count elements, rank r's contribution at r * count. */
int rl_comm_allgather(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                      rl_err *e);
/* send holds world * count elements; recv gets the reduction of block `rank`. */
int rl_comm_reduce_scatter(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                           rl_redop op, rl_err *e);
int rl_comm_barrier(rl_comm *c, rl_err *e);
/* The pre-flight's link figure: every rank sends `bytes` (1..1 GiB) to its
 * right neighbour while it receives as many from its left, and *in_gbps
 * is how fast its left link delivered them, GB/s. A rank whose left
 * neighbour is on another node measures the network into its node. 0 (no
 * figure, no data moved) at world 1. tcp times the bytes from the first in
 * to the last; nccl the whole send/recv group, on the GPU (comm/nccl.c). */
int rl_comm_link_probe(rl_comm *c, size_t bytes, double *in_gbps, rl_err *e);
/* Complete every op issued so far (bounded by timeout_s). */
int rl_comm_wait(rl_comm *c, rl_err *e);
/* ---- the flight recorder ------------------------------------------------------------
 * Each communicator keeps its last RL_COMM_RECORDS ops. seq counts a
 * communicator's collectives from 1, so the same seq on every rank is the
 * same collective (all ranks issue them in one order): the rank whose
 * newest record is below a seq the others have entered never entered it.
 * t_done is when the op returned (0: it has not): for tcp when its data
 * moved, for nccl when it was enqueued on the stream (the GPU finishes it
 * later; rl_comm_wait, an op of its own, returns once it has). t_start
 * and t_end: when it ran on the GPU (nccl: CUDA events around it on the
 * stream, known once each completed and the op thread looked -- before the
 * next op, while it waits; 0 until then, and always on tcp, whose ops run
 * between t_issue and t_done). Times are rl_now() (monotonic seconds). */
#define RL_COMM_RECORDS 64
typedef struct rl_comm_record {
    uint64_t seq;
    const char *op;  /* "allreduce", "broadcast", ... (static) */
    size_t bytes;    /* this rank's buffer */
    double t_issue, t_done;
    double t_start, t_end; /* on the GPU (nccl; 0: not known) */
    int rc;          /* the op's result once done */
    int tag;         /* the caller's label (rl_comm_tag_next: DDP's bucket); -1 none */
} rl_comm_record;
/* Label the next op this thread issues (ops come from one thread at a
 * time, so the label cannot land on another thread's op). tag >= 0. */
void rl_comm_tag_next(rl_comm *c, int tag);
/* Up to max records, oldest first; the count. Thread-safe. */
int rl_comm_records(rl_comm *c, rl_comm_record *out, int max);
/* Every live communicator of this process into the log, one JSON line
 * each ("comm_records"): what SIGUSR1 asks a worker for (py-spy dump's
 * role). Thread-safe; not async-signal-safe (call it from a thread that
 * waits for the signal). */
void rl_comm_dump_all(void);

/* Make every blocked and future op fail promptly (RL_EABORT). Thread-safe. */
void rl_comm_abort(rl_comm *c);
void rl_comm_destroy(rl_comm *c);

#endif
