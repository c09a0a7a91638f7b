/* Internal to pkg/elect: the seam between the generic elector thread
 * (elect.c) and its backends (k8s, etcd). */
#ifndef RL_ELECT_INTERNAL_H
#define RL_ELECT_INTERNAL_H

#include "elect/elect.h"

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
/* The leader key's record in etcd, {"id","addr","port"} (untrusted: a
 * missing or mistyped member is RL_EIO naming `key`). Fuzzed. */
int rl_elect_etcd_parse_leader(const char *key, const char *val, size_t len, rl_leader *out,
                               rl_err *e);
int rl_elect_etcd_new(const rl_elector_opts *o, const rl_elect_backend **vt, void **ctx, rl_err *e);

#endif
