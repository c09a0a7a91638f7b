/* agent: the processes of a job on one node.
 *
 * rl_launch is the node agent of static rendezvous (torchrun --standalone
 * and --nnodes with a fixed master): node 0's agent hosts the store, each
 * agent forks nproc_per_node trainers with their rank environment,
 * forwards SIGINT/SIGTERM, and when one trainer dies stops the others and
 * reports which rank failed and how.
 *
 * rl_proc_run is one trainer process: from its rank environment (set by
 * rl_launch, torchrun or SLURM) to a finished run -- store, communicator,
 * DDP, trainer. With world size 1 and no environment the worker skips both
 * and trains in-process. */
#ifndef RL_AGENT_H
#define RL_AGENT_H

#include <sys/types.h>

#include "metrics/metrics.h"
#include "elect/elect.h"
#include "rdzv/rdzv.h"
#include "train/train.h"
#include "util/util.h"

/* ---- node stats and metrics --------------------------------------------------------------
 * What a node agent knows about its trainers and shows on /metrics. The
 * agent creates a pipe and hands its write end to local rank 0
 * (RINGLEADER_STATS_FD); that trainer writes one stats line per optimizer
 * step and, on global rank 0, per committed checkpoint (pkg/metrics). The
 * agent reads the lines in its loop (rl_node_stats_poll), keeps the latest
 * values (for the progress Lease) and sets the gauges:
 *   ringleader_step, _loss, _tokens_per_second, _grad_norm,
 *   _learning_rate, _step_seconds, _model_tflops, _mfu (only with a peak),
 *   _allreduce_seconds, _allreduce_busy_seconds, _checkpoint_seconds,
 *   _checkpoint_last_step, _checkpoint_age_seconds, _rdzv_round,
 *   _world_size, _straggler{rank,pod,node} (on rank 0's node),
 *   _recovery_seconds and _recovery_steps_lost (the last round change:
 *   from the last step this node saw before it to the first after it),
 *   and the counters _restarts_total, _rounds_total, _hangs_total.
 * Without an agent (one process, or a rank of torchrun) the trainer can
 * feed an in-process rl_node_stats directly (rl_stats_reporter). */
typedef struct rl_node_stats rl_node_stats;
typedef struct rl_node_stats_opts {
    int port;           /* 0: no HTTP server (values still kept); RL_METRICS_ANY_PORT: any free port */
    char addr[64];      /* listen address; "": 0.0.0.0 */
    double peak_tflops; /* one trainer's device peak, TFLOP/s; 0: unknown (no ringleader_mfu) */
    bool pipe;          /* create the trainer -> agent pipe */
} rl_node_stats_opts;
int rl_node_stats_start(const rl_node_stats_opts *o, rl_node_stats **out, rl_err *e);
void rl_node_stats_stop(rl_node_stats *ns);
/* The pipe's write end for local rank 0 (-1: none). */
int rl_node_stats_fd(const rl_node_stats *ns);
int rl_node_stats_port(const rl_node_stats *ns); /* 0: no server */
rl_metrics *rl_node_stats_registry(rl_node_stats *ns);
/* Read every complete line waiting on the pipe (never blocks). */
void rl_node_stats_poll(rl_node_stats *ns);
void rl_node_stats_apply(rl_node_stats *ns, const rl_stats_msg *m);
/* A round started (rounds_total + 1) / one of our trainers crashed. A
 * hung line (pkg/hang) counts ringleader_hangs_total and is kept in the
 * snapshot with the round it happened in. */
void rl_node_stats_round(rl_node_stats *ns, long long round, int world);
void rl_node_stats_crash(rl_node_stats *ns);

typedef struct rl_node_snapshot {
    long long step, steps; /* -1: no step reported yet */
    double loss, tokens_per_s;
    long long ckpt_step;   /* -1: no checkpoint known */
    double ckpt_unix;
    char ckpt_uri[1200];
    long long round;       /* -1: none */
    int world;
    /* the last hang rank 0 diagnosed here (pkg/hang): hung_why "" if none */
    char hung_why[512], hung_dump[1200];
    long long hung_round;
    double hung_unix;
    /* rank 0's stragglers (pkg/hang), "" none; pace_known: it judged */
    char stragglers[512];
    bool pace_known;
    /* this round's pre-flight (pkg/hang): the ranks below the median, "" none;
     * their pods (an elastic job may leave them out) and the round judged */
    char degraded[512];
    bool preflight_known;
    char degraded_pods[RL_STATS_SLOW_MAX][64];
    int ndegraded;
    long long degraded_round;
    /* the last round change this node saw (recovered: there was one): from
     * the last step before it to the first after, and the steps done again */
    bool recovered;
    long long recovery_round, steps_lost;
    double recovery_s;
} rl_node_snapshot;
void rl_node_stats_snapshot(rl_node_stats *ns, rl_node_snapshot *out);

/* Where a trainer's stats lines go: the pipe the agent gave (stats_fd:
 * RINGLEADER_STATS_FD's value, or NULL), else into `direct` (may be NULL:
 * then nowhere). One sink per sending thread (the writer's counters are
 * its own). */
typedef struct rl_stats_sink {
    rl_stats_writer w;
    rl_node_stats *direct;
} rl_stats_sink;
void rl_stats_sink_open(rl_stats_sink *s, rl_node_stats *direct, const char *stats_fd);
void rl_stats_sink_send(rl_stats_sink *s, const rl_stats_msg *m);

/* The trainer's side: reports steps and checkpoints to a sink, then calls
 * `also` (NULL: nothing; the hang watch's step clock). Sets the trainer's
 * observer; r must outlive the run. */
typedef struct rl_stats_reporter {
    rl_stats_sink sink;
    long long steps;
    int world;
    double flops_per_token;
    rl_train_observer also;
} rl_stats_reporter;
void rl_stats_reporter_attach(rl_stats_reporter *r, rl_trainer *tr, rl_node_stats *direct, const char *stats_fd,
                              const rl_train_observer *also);

/* ---- the progress Lease (<job>-progress) ----------------------------------------------------
 * The agent whose trainers include global rank 0 merge-patches the job's
 * progress onto the Lease <job>-progress as annotations (creating the
 * Lease when absent, holderIdentity = this pod): ringleader.dev/step,
 * /loss, /tokens-per-second, /last-checkpoint, /round, /updated (RFC 3339
 * UTC), /stragglers and /degraded once rank 0 judged ("" when none),
 * /recovery-seconds, /recovery-steps-lost and /recovery-round after a
 * round change, and after a hang
 * /hung (the verdict), /hung-round, /hung-dump, /hung-time (the
 * operator's Hung condition). From its own thread, when
 * something changed and at most every interval (a new hang at once, even
 * when rank 0 already left: its round is ending), with the client's
 * timeouts; a failing API is logged and retried at the next interval,
 * never waited for by the agent's loop. */
typedef struct rl_progress rl_progress;
typedef struct rl_progress_opts {
    const char *kubeconfig, *ns; /* NULL: in-cluster / the client's namespace */
    const char *job, *holder;    /* the Lease is <job>-progress; holder: this pod */
    double interval_s;           /* 0: 5 s */
    double timeout_s;            /* per API call, retries included; 0: 5 s */
} rl_progress_opts;
int rl_progress_start(const rl_progress_opts *o, rl_progress **out, rl_err *e);
/* The latest values; active: this agent holds global rank 0 now (only
 * then is anything written). */
void rl_progress_update(rl_progress *p, const rl_node_snapshot *s, bool active);
/* final: write the latest values once more (if active), bounded by the
 * call timeout; else stop at once, cancelling a
 * call in flight. NULL is fine. */
void rl_progress_stop(rl_progress *p, bool final);
/* The annotations for a snapshot, as a JSON object (tests; caller frees). */
struct cJSON *rl_progress_annotations(const rl_node_snapshot *s, double now_unix);

typedef struct rl_proc_opts {
    const rl_job_config *cfg;
    const rl_static_env *env;
    const char *save_params;   /* rank 0 writes the final parameters here (NULL: no) */
    const volatile int *stop;  /* set by a signal handler */
    volatile int *starting;    /* cleared just before the training loop (may be NULL) */
    rl_node_stats *stats;      /* in-process metrics (no agent), or NULL */
    /* What the launcher or agent handed down (cmd/ reads the environment):
     * the address peers dial for this process's ring (NULL: loopback),
     * whether the store is hosted already (else rank 0 hosts it on
     * MASTER_ADDR), the key prefix there (NULL: "static"), the job's
     * rendezvous secret (NULL: none) and the stats pipe (NULL: none). */
    const char *host, *store_prefix, *secret, *stats_fd;
    bool store_hosted;
    const char *ctl_fd;        /* RINGLEADER_CTL_FD: the agent parks this process on a lost peer (NULL: it exits) */
    const char *pod, *node;    /* where this process runs, for hang verdicts (NULL: unknown) */
} rl_proc_opts;

/* Runs the whole training; *summary is filled on rank 0 (the data digest
 * is summed over ranks, so it covers the whole job). */
int rl_proc_run(const rl_proc_opts *o, rl_run_summary *summary, rl_err *e);

typedef struct rl_launch_opts {
    rl_node_env node;     /* nnodes, node_rank, nproc_per_node, master */
    char *const *argv;    /* the trainer command (argv[0] is exec'd) */
    double grace_s;       /* SIGTERM -> SIGKILL delay when stopping trainers */
    const volatile int *stop; /* set by the caller's signal handler: forward it */
    volatile int *stop_sig;   /* which signal (SIGINT/SIGTERM) to forward */
    bool *preempted;          /* out (optional): a trainer stopped with a checkpoint */
    rl_node_stats_opts stats; /* metrics port, address, peak (the pipe is always made) */
    const char *secret;       /* RINGLEADER_RDZV_SECRET: the store authenticates its clients; NULL none */
} rl_launch_opts;

/* Returns RL_OK when every trainer exited 0; otherwise RL_EPEER with a
 * message naming the first rank that failed and its exit status or signal,
 * or RL_EABORT when stopped by a signal. */
int rl_launch(const rl_launch_opts *o, rl_err *e);

/* Environment variable a launched trainer sees: the store already runs. */
#define RL_ENV_STORE_HOSTED "RINGLEADER_STORE_HOSTED"
/* Set in trainers started by rl_launch, so they do not launch again. */
#define RL_ENV_CHILD "RINGLEADER_CHILD"
/* The key prefix of this round's trainers on the store ("static" when unset). */
#define RL_ENV_STORE_PREFIX "RINGLEADER_STORE_PREFIX"
/* Where a process writes why it ends ("<class name>: <message>", util.h):
 * unset, /dev/termination-log, the file Kubernetes reads into the
 * container's terminated state; an agent points each trainer at its own. */
#define RL_ENV_TERMINATION_LOG "RINGLEADER_TERMINATION_LOG"
/* The job's rendezvous secret (the operator fills it from a Secret); a store
 * client that has it authenticates, and never talks to a store that cannot. */
#define RL_ENV_RDZV_SECRET "RINGLEADER_RDZV_SECRET"

/* ---- in-place recovery: the agent <-> trainer control channel -----------------------------
 * An elastic agent gives each trainer one end of a socket pair
 * (RINGLEADER_CTL_FD). When the trainer's ring breaks (a peer lost) it
 * does not exit: it drops its round (communicator, DDP, hang watch, store
 * client), keeps its process, memory, device context and model state, says
 * "parked <step> <why>" and waits. At a round's end the agent says "park"
 * to trainers still in a collective (it aborts their communicator); at a
 * graceful end (every member alive: the job grows) it first says "yield",
 * the trainers agree on a step to leave after, keep their ring whole to
 * the end and say "yielded <step> <why>"; in the
 * next round it sends each its place, "round <rank> <world> <group_rank>
 * <master_port> <prefix> <master_addr>", and the trainer joins that world
 * and resumes live from the most advanced replica (rl_trainer_resume).
 * Closing the channel ends a parked trainer. One message per packet
 * (SOCK_SEQPACKET), at most 511 bytes. */
#define RL_ENV_CTL_FD "RINGLEADER_CTL_FD"
typedef struct rl_ctl_round {
    int rank, world, group_rank, master_port;
    char prefix[64], master_addr[256];
} rl_ctl_round;
/* "round ..." into dst; the length, -1 when it does not fit. */
int rl_ctl_round_format(const rl_ctl_round *r, char *dst, size_t n);
/* Strict parse (fuzzed): ranges, rank < world, tokens of [A-Za-z0-9._:/-]. */
int rl_ctl_round_parse(const char *msg, size_t len, rl_ctl_round *r, rl_err *e);

typedef struct rl_ctl rl_ctl;
struct rl_comm;
/* The trainer's end, from RINGLEADER_CTL_FD's value; a thread reads it. */
int rl_ctl_open(const char *fd_str, rl_ctl **out, rl_err *e);
/* What a "park" aborts from now on (NULL: nothing). false, with comm
 * aborted, when the round is already over (rl_ctl_cancel_flag). */
bool rl_ctl_arm(rl_ctl *c, struct rl_comm *comm);
/* Set once the round is over for this trainer -- a "park", or a "yield"
 * before its ring was whole -- until the next round message: the round's
 * store client and communicator init take it (rl_store_set_cancel,
 * rl_comm_opts.cancel), so a trainer still forming a round its peers have
 * left parks within 100 ms, not at the init's timeout. NULL for no channel. */
const volatile int *rl_ctl_cancel_flag(const rl_ctl *c);
/* The armed communicator's ring is whole (every rank passed a collective):
 * a "yield" now waits for the trainers' agreed step; before, it aborts. */
void rl_ctl_steady(rl_ctl *c);
/* Set from an agent's "yield" until the next round message (NULL for no
 * channel): the trainer's rl_trainer_set_yield. */
const volatile int *rl_ctl_yield_flag(const rl_ctl *c);
/* Say "parked" (or "yielded") and wait for the next round (RL_OK, *next)
 * or the end: the channel closed or *stop set (RL_EABORT). */
int rl_ctl_park(rl_ctl *c, long long step, bool yielded, const char *why, const volatile int *stop,
                rl_ctl_round *next, rl_err *e);
void rl_ctl_close(rl_ctl *c);

/* ---- a node's trainer processes ------------------------------------------------------ */
typedef struct rl_group_opts {
    char *const *argv;       /* the trainer command (argv[0] is exec'd) */
    int nproc;               /* local ranks */
    int rank0, world;        /* global rank of local rank 0, world size */
    int group_rank;          /* this node's index (GROUP_RANK) */
    const char *master_addr; /* the store the trainers use */
    int master_port;
    const char *const *env;  /* extra NAME, VALUE pairs, NULL-terminated (may be NULL) */
    int stats_fd;            /* > 2: the stats pipe's write end, given to local rank 0 only */
    bool ctl;                /* a control channel per trainer (in-place recovery) */
} rl_group_opts;
typedef struct rl_group rl_group;
/* Fork/exec nproc trainers with their rank environment (torchrun's names);
 * each dies with its agent (PR_SET_PDEATHSIG). */
int rl_group_spawn(const rl_group_opts *o, rl_group **out, rl_err *e);
/* Reap ended trainers without blocking. Returns 1 when one ended other
 * than with status 0, naming the most likely culprit (signals first, then
 * crashes and user errors, then the classes that are not the trainer's
 * fault: infrastructure, preemption). */
int rl_group_poll(rl_group *g, int *bad_local, int *bad_status);
int rl_group_left(const rl_group *g);
pid_t rl_group_pid(const rl_group *g, int local);
void rl_group_signal(rl_group *g, int sig);
/* SIGTERM, then SIGKILL after grace_s (0: at once); returns when all are reaped. */
void rl_group_stop(rl_group *g, double grace_s);
void rl_group_free(rl_group *g);
/* The control channel (rl_group_opts.ctl): how many trainers are parked
 * now (reads their messages without blocking; *step: the highest step a
 * parked one holds, why: the first one's words, may be NULL); "park" to
 * every trainer not parked; each its place in a new round (their ranks
 * follow rank0; RL_EIO if one is gone). A group without channels: 0, and
 * the rest do nothing. */
int rl_group_parked(rl_group *g, long long *step, char *why, size_t wn);
/* How many of the parked ones yielded (rl_group_yield) rather than lost
 * their ring: a yield is no failure. */
int rl_group_yielded(const rl_group *g);
void rl_group_park(rl_group *g);
/* "yield" to every trainer not parked. */
void rl_group_yield(rl_group *g);
int rl_group_rejoin(rl_group *g, const rl_ctl_round *first, rl_err *e);
int rl_group_size(const rl_group *g);
/* Is a trainer stopped (SIGSTOP, a debugger): one that cannot park? */
bool rl_group_any_stopped(const rl_group *g);
/* "exited with status 3" / "was killed by signal 9 (Killed)". */
void rl_group_describe(char *dst, size_t n, int status);
/* What local trainer i wrote to its termination message (its
 * RL_ENV_TERMINATION_LOG), as one line without the class prefix ("" when
 * nothing). */
void rl_group_message(const rl_group *g, int i, char *dst, size_t n);
/* A wait status as a shell's exit status: the code, or 128 + signal. */
int rl_wait_exit_status(int status);

/* ---- the elastic node agent (Kubernetes or etcd rendezvous) ---------------------------
 * In a pod: elect a leader (Lease or etcd), watch the job's members, host
 * the rendezvous store while leading, join rounds, run this node's
 * trainers for each round, and start over when the round changes (a lost
 * node, a new one, a new leader). See docs/DESIGN.md, "Rendezvous". */
typedef struct rl_elastic_opts {
    const char *backend;     /* "k8s" | "etcd" */
    const char *job;         /* names the Lease (<job>-leader) and Service (<job>) */
    const char *id;          /* this node (pod name) */
    const char *addr;        /* this node's address (pod IP) */
    const char *rack;        /* its rack or NVLink domain (NULL: unknown): the ring's order in a zone */
    int port;                /* the store's port while leading (29400) */
    int nproc;               /* trainers on this node */
    const void *secret;      /* the job's rendezvous secret */
    size_t secret_len;
    rl_round_opts round;     /* min/max nodes, heartbeats, last call, restarts */
    double lease_s, renew_deadline_s, retry_s;
    const char *kubeconfig, *ns; /* k8s (NULL: in-cluster) */
    const char *etcd_endpoint;   /* etcd */
    char *const *argv;       /* the trainer command */
    double grace_s;          /* SIGTERM -> SIGKILL for trainers at a round change */
    bool in_place;           /* keep trainers across a lost peer (rl_ctl; rdzv.in_place) */
    const volatile int *stop;
    volatile int *stop_sig;
    bool *preempted;         /* out: stopped by a signal, trainers checkpointed */
    rl_node_stats_opts stats;   /* metrics port, address, peak (the pipe is always made) */
    double progress_interval_s; /* the progress Lease (k8s): at most every this (0: 5 s) */
} rl_elastic_opts;
/* Returns RL_OK when the job completed; RL_EABORT when stopped by a
 * signal; RL_EINPUT when a user error failed the job, RL_EPEER when the
 * restart limit did, with the reason (so the agent exits 2 or 1). */
int rl_elastic_run(const rl_elastic_opts *o, rl_err *e);

/* The pod's side of the options, which cmd/ reads from the environment:
 * its name (POD_NAME), address (POD_IP), namespace, kubeconfig, the job's
 * rendezvous secret and how often the progress Lease may be written
 * (0: the default). Backend, job, node range and etcd endpoint are the
 * config's "rdzv" section, with the environment's and the flags'
 * overrides already applied (cmd/worker). The metrics options (o->stats)
 * are the caller's. o points into env and cfg: both outlive the run.
 * Checks that the global batch divides for every world size the job can
 * have. */
typedef struct rl_elastic_env {
    const char *id, *addr, *ns, *kubeconfig, *secret; /* ns, kubeconfig, secret may be NULL */
    const char *rack; /* RINGLEADER_RACK (NULL: unknown), at most 63 characters */
    double progress_interval_s;
} rl_elastic_env;
int rl_elastic_setup(const rl_job_config *cfg, int nproc, const rl_elastic_env *env, rl_elastic_opts *o,
                     rl_err *e);
/* "N" or "MIN:MAX" -> min, max (RL_EINPUT naming `what`). */
int rl_parse_nodes(const char *s, const char *what, int *min, int *max, rl_err *e);

#endif
