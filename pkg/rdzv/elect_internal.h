/* Internal to pkg/rdzv: the seams between the generic elector / membership
 * threads (elect.c, members.c) and their backends (k8s, etcd). */
#ifndef RL_RDZV_ELECT_INTERNAL_H
#define RL_RDZV_ELECT_INTERNAL_H

#include <pthread.h>

#include "rdzv/rdzv.h"

/* pthread_cond_timedwait for up to s seconds (spurious wake-ups possible). */
void rl_rdzv_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double s);

/* An elector backend. elect.c calls attempt() once at start and then every
 * retry period, from its thread only, and owns the renew deadline: when a
 * leader's last successful attempt is older than renew_deadline it calls
 * step_down() and reports "not leading" without asking the backend. */
typedef struct rl_elect_backend {
    /* Try to acquire or renew. On RL_OK the backend was reached: *leading
     * says whether this candidate holds the lease after the call and
     * *leader who holds it as observed. An error (unreachable, 403, a
     * record that makes no sense) leaves both untouched and is retried. */
    int (*attempt)(void *ctx, bool *leading, rl_leader *leader, rl_err *e);
    /* Stop acting as leader without being able to tell the backend (the
     * renew deadline passed): never renew the lease we held again; treat
     * it like anyone else's until it expires. */
    void (*step_down)(void *ctx);
    /* Give the lease up if held (clean exit). */
    int (*release)(void *ctx, rl_err *e);
    void (*destroy)(void *ctx);
    /* Optional: the monotonic time at which the lease seen held by someone
     * else expires (0: unknown), so a candidate tries right then rather
     * than up to a retry period later. */
    double (*expires_at)(void *ctx);
} rl_elect_backend;

int rl_elect_k8s_new(const rl_elector_opts *o, const rl_elect_backend **vt, void **ctx, rl_err *e);
int rl_elect_etcd_new(const rl_elector_opts *o, const rl_elect_backend **vt, void **ctx, rl_err *e);

/* A membership backend: run() lives on the membership thread until *stop
 * is set (it must notice within about a second), publishing the whole set
 * with rl_members_set() after every change, and returns RL_OK then; an
 * error it cannot retry past (bad options) ends it early. */
typedef struct rl_members_backend {
    int (*run)(void *ctx, rl_members *m, const volatile int *stop, rl_err *e);
    void (*destroy)(void *ctx);
} rl_members_backend;

int rl_members_k8s_new(const rl_members_opts *o, const rl_members_backend **vt, void **ctx,
                       rl_err *e);
int rl_members_etcd_new(const rl_members_opts *o, const rl_members_backend **vt, void **ctx,
                        rl_err *e);


/* Replace the published set (copied, sorted by id; version bumped only when
 * it differs) and mark it synced. */
void rl_members_set(rl_members *m, const rl_peer *peers, int n);

#endif
