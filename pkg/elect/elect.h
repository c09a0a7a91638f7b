/* elect: leader election among a job's node agents (and the operator's
 * replicas), on a background thread, through a Kubernetes Lease or etcd. */
#ifndef RL_ELECT_H
#define RL_ELECT_H

#include <stdbool.h>
#include <stdint.h>

#include "util/util.h"

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

#endif
