/* Internal to pkg/rdzv: the seam between the generic membership thread
 * (members.c) and its backends (k8s, etcd). */
#ifndef RL_RDZV_MEMBERS_INTERNAL_H
#define RL_RDZV_MEMBERS_INTERNAL_H

#include "rdzv/rdzv.h"

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
/* A member key's record in etcd, {"id","addr"}, whose id must equal the
 * key's suffix after `prefix` (untrusted: RL_EIO naming `key`). Fuzzed. */
int rl_members_etcd_parse(const char *key, const char *prefix, const char *val, size_t len,
                          rl_peer *out, rl_err *e);
int rl_members_etcd_new(const rl_members_opts *o, const rl_members_backend **vt, void **ctx,
                        rl_err *e);


/* Replace the published set (copied, sorted by id; version bumped only when
 * it differs) and mark it synced. */
void rl_members_set(rl_members *m, const rl_peer *peers, int n);

#endif
