/* Shared between the files of pkg/k8s; not part of the public API. */
#ifndef RL_K8S_INTERNAL_H
#define RL_K8S_INTERNAL_H

#include "k8s.h"

/* One GET whose 2xx body is streamed to fn (a watch). Handles the one
 * token re-read after a 401 and nothing else: the caller owns retries.
 * A non-2xx answer returns its error (as rl_k8s_request does) with
 * *http_status set. resp->stopped tells whether fn ended it. */
int rl_k8s__stream(rl_k8s *c, const char *path, rl_http_data_fn fn, void *ud, double idle_s,
                   double timeout_s, const volatile int *stop, long *http_status, bool *stopped,
                   rl_err *e);
/* rl_k8s_request with its own abort flag (a watch loop's stop flag). */
int rl_k8s__request(rl_k8s *c, const char *method, const char *path, const char *content_type,
                    const char *body, const volatile int *abort_flag, long *http_status,
                    struct cJSON **out, rl_err *e);
/* The client's backoff settings and jitter state (thread-safe draw). */
double rl_k8s__backoff(rl_k8s *c, int attempt, double retry_after_s);
/* "leases/x" from "/apis/.../namespaces/ns/leases/x?..." for messages. */
void rl_k8s__short_path(const char *path, char *out, size_t n);

/* Text from a file or a plugin as it may appear in a one-line message:
 * control characters become '?', truncated to n - 1 bytes. Returns out. */
const char *rl_k8s__printable(const char *s, char *out, size_t n);

/* Exec plugin configs (exec.c): a deep copy (NULL on out of memory, or
 * when x is NULL) and its release (NULL is fine). */
rl_k8s_exec *rl_k8s__exec_dup(const rl_k8s_exec *x);
void rl_k8s__exec_free(rl_k8s_exec *x);

#endif
