/* rdzv: how a job's processes find each other and agree on rounds.
 *
 * The static mode reads torchrun's (and SLURM's) environment; the elastic
 * mode watches the job's members (Kubernetes EndpointSlices or etcd keys)
 * and runs rounds on the elected leader's store (pkg/store, pkg/elect).
 * The job config's "rdzv" section is parsed here. */
#ifndef RL_RDZV_H
#define RL_RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "util/cfg.h"
#include "util/util.h"

/* ---- static rendezvous: torchrun / Kubeflow / SLURM environment ------------------
 * Read through `lookup` (cmd/ passes getenv; tests may pass a table), so
 * the process environment is read in cmd/ only.
 *
 * Two levels, as with torchrun:
 *  - a trainer process reads its place in the job (rl_static_env_read):
 *    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 *    MASTER_PORT (what torchrun and our launcher give each trainer), or
 *    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or
 *    the count of SLURM_TASKS_PER_NODE, e.g. "4(x2)", for this node's
 *    SLURM_NODEID, the first when unset), with MASTER_ADDR if set, else the
 *    first host of SLURM_JOB_NODELIST / SLURM_NODELIST, as master and
 *    MASTER_PORT or 29400 as port. torchrun's form wins when both are
 *    present (torchrun inside a SLURM allocation);
 *  - a node agent reads the node's place (rl_node_env_read): PET_NNODES,
 *    PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT
 *    (Kubeflow's PyTorchJob sets these for torchrun), each falling back to
 *    the unprefixed name (NNODES, NODE_RANK, ...), then MASTER_ADDR/PORT.
 *    NNODES may be "N" or "N:N" (an elastic "MIN:MAX" is an error here);
 *    NPROC_PER_NODE "auto" or "gpu" reads as 0 (not given). */
typedef struct rl_static_env {
    int rank, world;             /* global */
    int local_rank, local_world; /* on this node */
    char master_addr[256];
    int master_port;
    char source[16];             /* "torchrun" or "slurm" (for logs) */
} rl_static_env;

/* RL_EINPUT naming the variable when one is missing (once any is set), not
 * an integer, out of range or inconsistent (rank >= world, local_rank >=
 * local_world, local_world > world, a port outside 1..65535). The torchrun
 * form is present when any of RANK, WORLD_SIZE, LOCAL_RANK or
 * LOCAL_WORLD_SIZE is set (MASTER_ADDR alone is not a trainer), the SLURM
 * form when SLURM_PROCID is. *found = false (and RL_OK) when neither form
 * is present. */
int rl_static_env_read(rl_env_lookup lookup, rl_static_env *env, bool *found, rl_err *e);

/* torchrun's --nproc-per-node auto / gpu: one trainer per visible GPU (one
 * on a machine without), settled by the launcher (rl_train_visible_gpus). */
#define RL_NPROC_AUTO (-2)

typedef struct rl_node_env {
    int nnodes, node_rank, nproc_per_node; /* nproc_per_node 0: not given; RL_NPROC_AUTO */
    char master_addr[256];
    int master_port;
} rl_node_env;
/* Defaults: 1 node, rank 0, master 127.0.0.1:29400. Same error rules. */
int rl_node_env_read(rl_env_lookup lookup, rl_node_env *env, rl_err *e);

/* Where a static job's store listens (out: a host for rl_store_server_start):
 * loopback when the job is one node (nothing off the machine needs it),
 * else MASTER_ADDR's own interface -- except when MASTER_ADDR resolves to
 * a loopback address here (Debian maps the host name to 127.0.1.1), which
 * other nodes could not reach: then every interface, and the result is
 * true so the caller can say so. */
bool rl_static_store_host(const char *master_addr, bool one_node, char *out, size_t n);

/* First host of a SLURM node list: "node[01-04,7],gpu2" -> "node01",
 * "n[1-2]-ib,x" -> "n1-ib", "rack[1-2]-n[01-04]" -> "rack1-n01" (zero
 * padding kept). The whole list is validated: nested or unbalanced
 * brackets, empty items, backward ranges, characters outside
 * [A-Za-z0-9._-] and a host longer than n-1 are RL_EINPUT ("SLURM node list
 * '...': why"), with out = "". Fuzzed. */
int rl_slurm_first_host(const char *nodelist, char *out, size_t n, rl_err *e);

/* ---- membership ---------------------------------------------------------------------
 * Who the job's nodes are, watched on a background thread. "k8s": the
 * endpoints of the job's headless Service, from its EndpointSlices (label
 * kubernetes.io/service-name, several slices merged), terminating endpoints
 * flagged; "etcd": keys under a prefix, each bound to its node's etcd lease
 * (this node's own key is kept alive while it runs). */
typedef struct rl_peer {
    char id[254];  /* pod name (targetRef, else hostname) / the etcd node id */
    char addr[64];
    char zone[64]; /* k8s: the node's zone from the EndpointSlice ("" unknown; etcd: "") */
    bool ready, terminating;
} rl_peer;

typedef struct rl_members_opts {
    const char *backend; /* "k8s" | "etcd" */
    const char *kubeconfig, *ns, *service;   /* k8s */
    const char *etcd_endpoint, *etcd_prefix; /* etcd: "/ringleader/<job>/members/" */
    const char *self_id, *self_addr;         /* etcd: this node's own key */
    double ttl_s;                            /* etcd: its lease TTL (0: 15) */
} rl_members_opts;

typedef struct rl_members rl_members;
int rl_members_start(const rl_members_opts *o, rl_members **out, rl_err *e);
/* Copy up to cap peers, sorted by id, into peers; returns how many there
 * are (may exceed cap). *version changes with every change of the set;
 * *synced is false until the first complete listing arrived. */
int rl_members_snapshot(rl_members *m, rl_peer *peers, int cap, uint64_t *version, bool *synced);
/* Wait up to timeout_s for the version to differ from `seen`. */
void rl_members_wait(rl_members *m, uint64_t seen, double timeout_s);
void rl_members_stop(rl_members *m);

/* ---- rounds ---------------------------------------------------------------------------
 * On the leader's store (authenticated), a round is one membership of the
 * job: nodes join it, the leader's coordinator closes it and publishes the
 * rank table, members heartbeat while their trainers run, and the
 * coordinator ends it when a member is lost, fails, a node arrives with
 * room to grow, or the job completes. Keys ("rdzv/" prefix):
 *   round              the open or running round R (decimal)
 *   R/nseq, R/join/<k> joins: a counter, then {"id","addr","local_world"}
 *   R/table            {"round","world","restarts","nodes":[{"id","addr","local_world","rank0"}]}
 *   R/hb/<id>          heartbeat counters (ADD)
 *   R/events, R/done/<id>, R/fail/<id>   members' reports (a counter to watch, then the
 *                      report: "<class name>: <reason>", util.h's failure classes)
 *   crashes            trainer crashes so far (the restart limit counts these)
 *   user_error         the first user error reported (it fails the job, even
 *                      when its round had already ended for another reason)
 *   R/end              {"outcome":"next"|"complete"|"failed","reason","graceful","class"}
 * Ranks follow the nodes sorted by zone, then id (one ring edge into and
 * one out of each zone, the fewest a ring can have). A new leader's store starts empty; its
 * first round number continues from the last round its own agent saw. */
typedef struct rl_round_opts {
    int min_nodes, max_nodes; /* max 0: equal to min (a fixed-size job) */
    double last_call_s;       /* elastic: wait this long for more after min joined (10) */
    double heartbeat_s;       /* 5 */
    int heartbeat_misses;     /* lost after this many (3) */
    double bench_s;           /* a node the pre-flight found degraded stays out this long (600; 0: never) */
    int max_restarts;         /* trainer crashes the job survives (3); other
                                 failure classes are not counted, a user
                                 error fails the job at once */
} rl_round_opts;

typedef struct rl_round_node {
    char id[254];
    char addr[64];
    char zone[64]; /* its peer's zone ("" unknown) */
    char rack[64]; /* the rack or NVLink domain its join named ("" unknown) */
    int local_world, rank0;
} rl_round_node;

typedef struct rl_round_table {
    long long round;
    int world, restarts, nnodes;
    rl_round_node *nodes; /* sorted by id */
} rl_round_table;

/* Strict parse of a published table (fuzzed): every field present and
 * typed (zone and rack optional), nodes strictly sorted by (zone, rack,
 * id), ranks
 * contiguous from 0 in that order, world = sum of local_world. */
int rl_round_table_parse(const char *json, size_t len, rl_round_table *t, rl_err *e);
void rl_round_table_free(rl_round_table *t);

/* The leader's coordinator: a thread with its own store client. */
typedef struct rl_round_coord rl_round_coord;
/* A new leader's first round: `last` (may be NULL) is the last table its
 * agent ran, gone_id (may be NULL) the previous leader, whose lease expired.
 * That round closes as soon as every node of `last` but gone_id joined
 * (at least min_nodes): peers of the Service that were not in the last
 * round -- dead earlier, or new -- are not waited for; a new one that
 * joins later grows the job at the next round. */
int rl_round_coord_start(const char *host, int port, const void *secret, size_t slen,
                         const rl_round_opts *o, rl_members *members, long long first_round,
                         const rl_round_table *last, const char *gone_id, rl_round_coord **out,
                         rl_err *e);
/* Stops the coordinator. Once it has ended the job (complete or failed)
 * it first waits -- at most heartbeat_s * heartbeat_misses -- until every
 * node of the last round has read that end, so none of them mistakes the
 * closed store for a lost leader. */
void rl_round_coord_stop(rl_round_coord *c);

/* Member side. Join the current round and wait up to timeout_s for its
 * table (RL_OK: this node is in it; RL_ETIMEOUT: not yet, call again --
 * *joined_round, 0 at first, remembers the round already joined so a call
 * again does not join twice). A round that ends without us (we came late,
 * or it filled up) is followed into the next one. RL_EPEER with the
 * coordinator's reason when the job failed -- RL_EINPUT when a user error
 * failed it -- (and only then: a store that closed or stopped answering is
 * RL_EIO, a lost leader, not a failed job); RL_OK with t->round < 0 when
 * the job completed. */
/* rack: this node's rack or NVLink domain (NULL or "": unknown), which
 * orders the ring within a zone. */
int rl_round_join(rl_store *s, const char *id, const char *addr, const char *rack, int local_world,
                  double timeout_s, long long *joined_round, rl_round_table *t, rl_err *e);
typedef enum { RL_ROUND_RUNNING = 0, RL_ROUND_NEXT, RL_ROUND_COMPLETE, RL_ROUND_FAILED } rl_round_state;
/* How a round ended, as a member reads R/end. NEXT with graceful: the
 * round ended with every member alive (the job grows), so trainers get time
 * to stop at a step boundary and checkpoint; otherwise their collectives
 * are broken and waiting is waste. FAILED: cls says why (USER: a user
 * error, CRASH: the restart limit). */
typedef struct rl_round_end {
    rl_round_state state;
    bool graceful;
    rl_fail_class cls;
    char reason[512]; /* the coordinator's words */
} rl_round_end;
/* Heartbeat, then look at R/end (waiting up to wait_s for it). */
int rl_round_tick(rl_store *s, long long round, const char *id, double wait_s, rl_round_end *end, rl_err *e);
/* The pre-flight of this round (pkg/hang, judged by rank 0) found these
 * nodes far below the median: the coordinator leaves them out of the
 * job's rounds for bench_s when the job stays at min_nodes or more. */
#define RL_ROUND_DEGRADED_MAX 4
typedef struct rl_round_degraded {
    int n;
    char ids[RL_ROUND_DEGRADED_MAX][254];
    char why[512];
} rl_round_degraded;
int rl_round_report_degraded(rl_store *s, long long round, const rl_round_degraded *d, rl_err *e);
/* Strict parse of what that wrote (fuzzed): {"ids":[1..4 strings],"why":string}. */
int rl_round_degraded_parse(const char *json, size_t len, rl_round_degraded *d, rl_err *e);
/* Report this node's trainers: RL_FAIL_NONE, done (all exited 0); else
 * failed, and how: a crash counts against the restart limit, a user error
 * fails the job, the others only end the round. */
int rl_round_report(rl_store *s, long long round, const char *id, rl_fail_class cls, const char *reason,
                    rl_err *e);

/* ---- the job config's "rdzv" section --------------------------------------------------
 * backend "static" (torchrun/SLURM environment, the default), "k8s" or
 * "etcd". The operator writes the rest; environment variables override
 * (see cmd/worker). nodes: min_nodes..max_nodes (max 0 = fixed size). */
typedef struct rl_rdzv_config {
    char backend[16];
    char job[64];
    int min_nodes, max_nodes;
    int port;                        /* the leader's store (29400) */
    double heartbeat_s;              /* 5 */
    int heartbeat_misses;            /* 3 */
    double last_call_s;              /* 10 */
    int max_restarts;                /* 3 */
    double lease_s, renew_deadline_s, retry_s; /* 15, 10, 2 */
    double stop_grace_s;             /* graceful round change: SIGTERM -> SIGKILL; in place, the yield's wait (30) */
    bool in_place;                   /* survivors of a lost node keep their processes and state (true) */
    double bench_s;                  /* a degraded node stays out of the rounds this long (600; 0: never) */
    char etcd_endpoint[256];
} rl_rdzv_config;
/* The section's descriptor (util/cfg.h). */
extern const rl_cfg_section rl_rdzv_config_section;
void rl_rdzv_config_default(rl_rdzv_config *c);

#endif
