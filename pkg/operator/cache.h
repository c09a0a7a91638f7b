/* The controller's informer cache: what its LIST+WATCHes of TrainingJobs,
 * their pods and their progress Leases last said, so a reconcile reads
 * from memory instead of asking the API server (an idle job then costs no
 * requests between resyncs). It may lag the server by a watch event: a
 * reconcile's writes are guarded by the job's resourceVersion (a stale
 * read meets 409 and is retried once the cache caught up), creates of
 * what exists meet 409 and deletes of what is gone 404, both harmless.
 * Thread-safe: the watch threads write, the reconcile thread reads. */
#ifndef RL_OPERATOR_CACHE_H
#define RL_OPERATOR_CACHE_H

#include <stdbool.h>

#include "k8s/k8s.h"

struct cJSON;

typedef enum { RL_OPC_JOBS = 0, RL_OPC_PODS, RL_OPC_LEASES, RL_OPC_KINDS } rl_opc_kind;

typedef struct rl_op_cache rl_op_cache;

rl_op_cache *rl_op_cache_new(void);
void rl_op_cache_free(rl_op_cache *c);

/* One watch event of kind k for namespace ns (NULL: a watch of every
 * namespace): SYNC (obj an array of every item) replaces that scope. */
void rl_op_cache_apply(rl_op_cache *c, rl_opc_kind k, const char *ns, rl_k8s_event_type type,
                       const struct cJSON *obj);

/* Whether every watch of kind k has delivered its first LIST. */
bool rl_op_cache_synced(rl_op_cache *c, rl_opc_kind k);
void rl_op_cache_expect(rl_op_cache *c, rl_opc_kind k, int watches); /* how many scopes to wait for */

/* metadata.<k> of an object as a string ("" when absent). */
const char *rl_op_meta_str(const struct cJSON *obj, const char *k);
/* The job an object belongs to: its label ringleader.dev/job ("" none). */
const char *rl_op_job_label(const struct cJSON *obj);

/* A copy of ns/name (caller frees), or NULL when absent. */
struct cJSON *rl_op_cache_get(rl_op_cache *c, rl_opc_kind k, const char *ns, const char *name);
/* A copy of every object of ns labelled ringleader.dev/job=job, as a JSON
 * array (caller frees). */
struct cJSON *rl_op_cache_list(rl_op_cache *c, rl_opc_kind k, const char *ns, const char *job);

/* Reconciles read through c from now on, each kind once it is synced (the
 * cache outlives the rl_op). */
typedef struct rl_op rl_op;
void rl_op_use_cache(rl_op *op, rl_op_cache *c);
/* Seconds after which the job last reconciled wants another look though
 * no event may come (a pod's grace running out); 0: none. */
double rl_op_requeue_after(const rl_op *op);

#endif
