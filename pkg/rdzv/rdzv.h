/* rdzv: how processes find each other.
 *
 * The store is a small TCP key-value service hosted by one process (node 0
 * in static mode, the elected leader later). Everything that must be agreed
 * between ranks -- ring addresses, the ncclUniqueId, round membership --
 * goes through it. The static mode reads torchrun's (and SLURM's)
 * environment. The Kubernetes and etcd electors of later issues feed the
 * same store.
 *
 * Wire protocol: every message is one frame,
 *   u32 magic 'RLST' (0x524c5354) | u16 version (1) | u16 op | u32 status |
 *   u32 key length | u32 value length | u32 value2 length | key | value | value2
 * all integers big-endian; key <= 1 KiB, each value <= 64 MiB. A request
 * (status 0) gets exactly one response frame with the same op. Anything
 * else (bad magic, other version, oversize lengths, unknown op, a request
 * body that does not fit its op) is a protocol error: the server answers
 * with status RL_STORE_EPROTO, its one-line reason as the value, and
 * closes the connection; the client reports it naming the peer. Counters
 * (ADD) are stored as the 8-byte big-endian value, so a GET of a counter
 * key returns those 8 bytes. The server keeps at most RL_STORE_MAX_TOTAL
 * bytes of keys and values; a write beyond that is answered EFULL. */
#ifndef RL_RDZV_H
#define RL_RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define RL_STORE_MAGIC 0x524c5354u
#define RL_STORE_VERSION 1
#define RL_STORE_HEADER_BYTES 24
#define RL_STORE_MAX_KEY 1024u
#define RL_STORE_MAX_VALUE (64u << 20)
#define RL_STORE_MAX_TOTAL (1024u << 20)
#define RL_STORE_DEFAULT_PORT 29400

enum rl_store_op {
    RL_STORE_SET = 1,  /* key, value -> ok */
    RL_STORE_GET = 2,  /* key, value = u32 wait_ms -> value, or status NOTFOUND after wait_ms */
    RL_STORE_ADD = 3,  /* key, value = i64 delta -> value = i64 new (missing key counts as 0;
                          a value that is not 8 bytes, or overflow: MISMATCH, unchanged) */
    RL_STORE_CAS = 4,  /* key, value = expected, value2 = desired -> status OK (swapped) or
                          MISMATCH, value = current. expected empty: only if key absent. */
    RL_STORE_DEL = 5,  /* key -> ok (absent key is ok too) */
    RL_STORE_PING = 6, /* -> ok (liveness, version check) */
    /* Mutual authentication with the job's rendezvous secret (see
     * rl_store_auth): */
    RL_STORE_CHALLENGE = 7, /* key = client id, value = client nonce (16..64 bytes) ->
                               value = server nonce (32) + server proof (32); empty when
                               the server has no secret */
    RL_STORE_AUTH = 8,      /* key = client id, value = client proof -> ok, or EAUTH and close */
};

enum rl_store_status {
    RL_STORE_OK = 0,
    RL_STORE_NOTFOUND = 1,
    RL_STORE_MISMATCH = 2,
    RL_STORE_EPROTO = 3,
    RL_STORE_EFULL = 4, /* the write would take the store over RL_STORE_MAX_TOTAL */
    RL_STORE_EAUTH = 5, /* not authenticated, or a wrong proof: the server closes */
};

/* A parsed frame header (the key and values follow it on the wire). */
typedef struct rl_store_frame {
    uint16_t version, op;
    uint32_t status, klen, vlen, v2len;
} rl_store_frame;

/* Parse and validate a 24-byte header; `peer` names the other end in
 * messages ("127.0.0.1:29400" -> "store 127.0.0.1:29400: protocol version 2,
 * expected 1"). RL_EINPUT (protocol error) on anything malformed; *f is
 * untouched then. Fuzzed. Encode writes all fields as given (set version
 * to RL_STORE_VERSION) into 24 bytes. */
int rl_store_frame_parse(const void *buf, size_t len, const char *peer, rl_store_frame *f,
                         rl_err *e);
void rl_store_frame_encode(void *buf, const rl_store_frame *f);

/* ---- server ------------------------------------------------------------------------ */
typedef struct rl_store_server rl_store_server;
/* Listen on host:port (port 0 = any free port; host NULL = 0.0.0.0) and
 * serve from a background thread (one thread, poll() over all clients; it
 * blocks all signals). A port in use is RL_EINPUT naming it. Protocol
 * errors are logged (warn) naming the client; values are never logged.
 * The sockets are close-on-exec: host the store in a process that execs
 * its children (a fork()ed child without exec keeps the listening socket).
 * Stop closes every client connection, so clients blocked in a GET fail
 * promptly (RL_EPEER); it returns within milliseconds. NULL is a no-op. */
int rl_store_server_start(const char *host, int port, rl_store_server **out, rl_err *e);
/* The same with a rendezvous secret (len > 0): every connection must pass
 * CHALLENGE + AUTH before any other op but PING; a wrong proof is answered
 * EAUTH, logged (warn, naming the client address and claimed id, never the
 * secret) and the connection closed. Other clients are unaffected.
 * Before it authenticated a connection may send only the handshake frames
 * (connect's PING, CHALLENGE, AUTH) of their exact sizes, judged from the
 * header before any body is read, and must be through within 5 s; such
 * connections are capped in all and per source address. Either way an
 * authenticated (no secret: answered) connection with nothing pending for
 * 10 minutes is closed, and the store keeps a quarter of RLIMIT_NOFILE
 * (at least 64) free for the rest of its process (store_server.c's
 * limits say why). */
int rl_store_server_start_auth(const char *host, int port, const void *secret, size_t len,
                               rl_store_server **out, rl_err *e);
int rl_store_server_port(const rl_store_server *s);
void rl_store_server_stop(rl_store_server *s);

/* ---- client ------------------------------------------------------------------------ */
typedef struct rl_store rl_store;
/* Connect, retrying until timeout_s (the server may start later than its
 * clients), then PING to check that the peer is a store of our version.
 * Every later call is bounded by the same timeout unless it takes its own.
 * Errors: an unreachable store after the timeout is RL_ETIMEOUT naming
 * host:port; a peer speaking another protocol or version, or one that
 * rejects a request, is RL_EINPUT (misconfiguration, not retried); a lost
 * connection is RL_EPEER. After a transport failure (no answer in time, a
 * lost connection) the client is unusable: every later call fails fast
 * naming the first cause; close it and connect again. (A GET whose key is
 * not set in time is not such a failure.) Not thread-safe: one client per
 * thread. */
int rl_store_connect(const char *host, int port, double timeout_s, rl_store **out, rl_err *e);
int rl_store_set(rl_store *s, const char *key, const void *val, size_t len, rl_err *e);
/* Wait up to timeout_s for the key to exist (0: look once); *val is
 * malloc'd (NUL-terminated for convenience, not counted in *len).
 * RL_ETIMEOUT names the key. The wait happens in the server, so a GET costs
 * one round trip however long it waits. */
int rl_store_get(rl_store *s, const char *key, double timeout_s, void **val, size_t *len,
                 rl_err *e);
/* Atomic counter (delta 0 reads it). A key holding something else, or an
 * overflow, is RL_EINPUT. */
int rl_store_add(rl_store *s, const char *key, int64_t delta, int64_t *result, rl_err *e);
/* Compare-and-set; expected NULL/0 means "only if absent". *swapped tells
 * the outcome; current (optional, malloc'd) receives the value after. */
int rl_store_cas(rl_store *s, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, bool *swapped, void **current, size_t *clen,
                 rl_err *e);
int rl_store_delete(rl_store *s, const char *key, rl_err *e);
void rl_store_close(rl_store *s);
/* Authenticate this connection as `id` with the job's secret, both ways:
 *   client -> CHALLENGE(id, cn)         cn: 32 random bytes
 *   server -> sn, HMAC-SHA256(secret, "rl-store-server" 0 cn sn)
 *   client -> AUTH(id, HMAC-SHA256(secret, "rl-store-client" 0 sn cn id))
 *   server -> OK | EAUTH (and closes)
 * then the client checks the server's proof, so a store that does not know
 * the secret (an impostor at the leader's address) is refused too. The
 * nonces make every proof single-use. A wrong secret on either side is
 * RL_EINPUT "... rendezvous secret ..."; a server without a secret is
 * RL_EINPUT too (a client that has a secret never talks to an open store).
 * A store that closes the connection during the handshake (its places for
 * unauthenticated clients full) is connected to again and asked again,
 * within the client's timeout. */
int rl_store_auth(rl_store *s, const char *id, const void *secret, size_t len, rl_err *e);

/* Wait until `count` processes have called this with the same key prefix
 * (an ADD counter then a GET of a release key): a barrier through the store.
 * Uses the keys "<key>/count" and "<key>/release"; each key is good for one
 * barrier (put the round or a sequence number in it). A timeout says how
 * many arrived. */
int rl_store_barrier(rl_store *s, const char *key, int count, double timeout_s, rl_err *e);

/* ---- static rendezvous: torchrun / Kubeflow / SLURM environment ------------------
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
int rl_static_env_read(rl_static_env *env, bool *found, rl_err *e);

/* torchrun's --nproc-per-node auto / gpu: one trainer per visible GPU (one
 * on a machine without), settled by the launcher (rl_train_visible_gpus). */
#define RL_NPROC_AUTO (-2)

typedef struct rl_node_env {
    int nnodes, node_rank, nproc_per_node; /* nproc_per_node 0: not given; RL_NPROC_AUTO */
    char master_addr[256];
    int master_port;
} rl_node_env;
/* Defaults: 1 node, rank 0, master 127.0.0.1:29400. Same error rules. */
int rl_node_env_read(rl_node_env *env, rl_err *e);

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

/* ---- leader election ---------------------------------------------------------------
 * One elector per node agent, on a background thread. Backends: "k8s" (a
 * coordination.k8s.io/v1 Lease with client-go's semantics) and "etcd" (an
 * etcd v3 lease + a transaction on the leader key). The leader publishes
 * where its rendezvous store listens; followers read it from the record.
 *
 * Timing (client-go's defaults): lease 15 s, renew deadline 10 s, retry
 * 2 s. A candidate tries every retry period; a leader that has not renewed
 * successfully for the renew deadline stops leading at once (also after
 * its process was paused), before the lease can expire for the others. */
typedef struct rl_leader {
    char id[254];   /* holder identity (pod name); "" when nobody leads */
    char addr[256]; /* the leader's rendezvous store host */
    int port;
} rl_leader;

typedef struct rl_elector_opts {
    const char *backend;         /* "k8s" | "etcd" */
    const char *id;              /* this candidate, unique in the job (the pod name) */
    const char *addr;            /* published while leading */
    int port;
    double lease_s, renew_deadline_s, retry_s; /* 0: 15, 10, 2 */
    /* k8s: kubeconfig NULL = in-cluster (or $KUBECONFIG); the Lease ns/name */
    const char *kubeconfig, *ns, *lease_name;
    /* etcd: "http://host:port" and the leader key ("/ringleader/<job>/leader") */
    const char *etcd_endpoint, *etcd_key;
} rl_elector_opts;

typedef struct rl_elect_state {
    bool leading;     /* this candidate leads now */
    rl_leader leader; /* the holder as last observed ("" id: none or unknown) */
    uint64_t gen;     /* changes whenever leading or leader changes */
    int errors;       /* consecutive failed attempts (API unreachable, 403, ...) */
    char last_error[512];
} rl_elect_state;

typedef struct rl_elector rl_elector;
/* Bad options are RL_EINPUT naming the field; the first attempt happens on
 * the thread, so an unreachable backend is not an error here (it shows in
 * state.errors and in warn logs, and the elector keeps trying). */
int rl_elector_start(const rl_elector_opts *o, rl_elector **out, rl_err *e);
void rl_elector_state(rl_elector *el, rl_elect_state *st);
/* Wait up to timeout_s for state.gen to differ from `seen`; fills *st. */
void rl_elector_wait(rl_elector *el, uint64_t seen, double timeout_s, rl_elect_state *st);
/* Stop the thread; release = give the lease up if held (client-go's
 * ReleaseOnCancel: an empty holder, so others take over at once). */
void rl_elector_stop(rl_elector *el, bool release);

/* ---- membership ---------------------------------------------------------------------
 * Who the job's nodes are, watched on a background thread. "k8s": the
 * endpoints of the job's headless Service, from its EndpointSlices (label
 * kubernetes.io/service-name, several slices merged), terminating endpoints
 * flagged; "etcd": keys under a prefix, each bound to its node's etcd lease
 * (this node's own key is kept alive while it runs). */
typedef struct rl_peer {
    char id[254];  /* pod name (targetRef, else hostname) / the etcd node id */
    char addr[64];
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
 *   R/events, R/done/<id>, R/fail/<id>   members' reports (a counter to watch, then the report)
 *   crashes            trainer crashes so far (the restart limit counts these)
 *   R/end              {"outcome":"next"|"complete"|"failed","reason"}
 * Ranks follow the sorted node ids. A new leader's store starts empty; its
 * first round number continues from the last round its own agent saw. */
typedef struct rl_round_opts {
    int min_nodes, max_nodes; /* max 0: equal to min (a fixed-size job) */
    double last_call_s;       /* elastic: wait this long for more after min joined (10) */
    double heartbeat_s;       /* 5 */
    int heartbeat_misses;     /* lost after this many (3) */
    int max_restarts;         /* trainer crashes the job survives (3) */
} rl_round_opts;

typedef struct rl_round_node {
    char id[254];
    char addr[64];
    int local_world, rank0;
} rl_round_node;

typedef struct rl_round_table {
    long long round;
    int world, restarts, nnodes;
    rl_round_node *nodes; /* sorted by id */
} rl_round_table;

/* Strict parse of a published table (fuzzed): every field present and
 * typed, ranks contiguous from 0 in id order, world = sum of local_world. */
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
 * coordinator's reason when the job failed (and only then: a store that
 * closed or stopped answering is RL_EIO, a lost leader, not a failed job);
 * RL_OK with t->round < 0 when the job completed. */
int rl_round_join(rl_store *s, const char *id, const char *addr, int local_world, double timeout_s,
                  long long *joined_round, rl_round_table *t, rl_err *e);
typedef enum { RL_ROUND_RUNNING = 0, RL_ROUND_NEXT, RL_ROUND_COMPLETE, RL_ROUND_FAILED } rl_round_state;
/* RL_ROUND_NEXT with *graceful: the round ended with every member alive
 * (the job grows), so trainers get time to stop at a step boundary and
 * checkpoint; otherwise their collectives are broken and waiting is waste. */
/* Heartbeat, then look at R/end (waiting up to wait_s for it). reason gets
 * the coordinator's words when the round is over. */
int rl_round_tick(rl_store *s, long long round, const char *id, double wait_s,
                  rl_round_state *state, bool *graceful, char *reason, size_t rn, rl_err *e);
/* Report this node's trainers: done (all exited 0) or failed (crash: it
 * counts against the restart limit). */
int rl_round_report(rl_store *s, long long round, const char *id, bool done, bool crash,
                    const char *reason, rl_err *e);

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
    double stop_grace_s;             /* trainers' SIGTERM -> SIGKILL at a graceful round change (30) */
    char etcd_endpoint[256];
} rl_rdzv_config;
void rl_rdzv_config_default(rl_rdzv_config *c);
struct cJSON;
/* Strict like the other sections: unknown fields and out-of-range values
 * are RL_EINPUT naming "<where>.<field>". */
int rl_rdzv_config_from_json(const struct cJSON *o, const char *where, rl_rdzv_config *c, rl_err *e);
void rl_rdzv_config_add_json(const rl_rdzv_config *c, struct cJSON *o);

#endif
