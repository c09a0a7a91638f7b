/* Internal to pkg/operator (and its tests): one reconcile's decisions as
 * pure functions. reconcile.c observes (the job, its pods, its owned
 * objects, the progress Lease), asks rl_op_decide what to do, and applies
 * the plan's steps in order; after the pods the plan created it asks
 * rl_op_decide_phase for the rest. Nothing here does I/O or reads a clock:
 * `now` comes in with what was seen, so the decisions are table-tested
 * without a stand-in (tests/unit/test_operator.c, "decide").
 *
 * The one ordering the plan guarantees: a pod that ended is counted in a
 * WRITE step before its DELETE step, so a crash between the two neither
 * loses nor doubles a count (the status keeps counted uids until the pods
 * are gone). */
#ifndef RL_OP_DECIDE_H
#define RL_OP_DECIDE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <string.h>

#include "operator/operator.h"

/* ---- the status as JSON: small helpers shared with reconcile.c ---------------------------- */
static inline const char *rl_op_jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}
static inline cJSON *rl_op_jobj(cJSON *o, const char *k) {
    cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsObject(v) ? v : NULL;
}
static inline void rl_op_jset(cJSON *o, const char *k, cJSON *v) {
    if (cJSON_GetObjectItemCaseSensitive(o, k)) cJSON_ReplaceItemInObjectCaseSensitive(o, k, v);
    else cJSON_AddItemToObject(o, k, v);
}
/* Set a condition; lastTransitionTime (now) moves only when the status
 * flips. True when status or reason changed: the moment worth an Event. */
bool rl_op_set_condition(cJSON *st, const char *type, bool on, const char *reason, const char *msg,
                         const char *now);
bool rl_op_condition_on(const cJSON *st, const char *type);
bool rl_op_terminal(const char *phase);

/* ---- what one pass saw -------------------------------------------------------------------- */
typedef struct rl_op_seen {
    const rl_op_job *job;
    rl_pod_info *pods; /* decide marks those it deletes TERMINATING, as the API will */
    int n;
    const char *conflict;   /* an owned object that is someone else's ("": none) */
    const cJSON *progress;  /* the annotations of <job>-progress (NULL: none seen) */
    double stuck_s;         /* a pod this long past its grace period is stuck */
    const char *now;        /* RFC 3339 */
} rl_op_seen;

/* ---- the plan ------------------------------------------------------------------------------ */
typedef enum {
    RL_OP_EVENT,  /* queue an Event (posted once the next WRITE succeeds) */
    RL_OP_WRITE,  /* write `status` (unchanged from what was read: no write) */
    RL_OP_DELETE, /* delete pod `pod` */
    RL_OP_CREATE, /* create the pod of `index` (admission may refuse it) */
} rl_op_step_kind;

typedef struct rl_op_step {
    rl_op_step_kind kind;
    cJSON *status; /* WRITE: owned */
    char pod[254]; /* DELETE */
    int index;     /* CREATE */
    bool warning;  /* EVENT */
    char reason[64], msg[1024];
} rl_op_step;

typedef struct rl_op_plan {
    rl_op_step *steps;
    int n, cap;
    cJSON *status;    /* the status as decided so far (owned) */
    bool then_phase;  /* after the creates: rl_op_decide_phase */
    double requeue_s; /* > 0: look at the job again within this */
    bool nomem;       /* a step could not be added: do not apply the plan */
} rl_op_plan;

/* A job that is not yet over, or one that is over (cleanup only). status
 * is the status after its owned objects were ensured; it is copied. */
void rl_op_decide(const rl_op_seen *s, const cJSON *status, rl_op_plan *p);
/* After the plan's creates: how many pods were created, and the first
 * admission refusal ("": none). Appends the phase, the conditions and the
 * final WRITE to p. */
void rl_op_decide_phase(const rl_op_seen *s, int created, const char *refused, rl_op_plan *p);
void rl_op_plan_free(rl_op_plan *p);

#endif
