/* The local Kubernetes API stand-in (tests/k8s/standin.py) for test suites:
 * start it in a fresh temp dir, talk to its admin API, run the real kubectl
 * against it, stop it. The stand-in serves HTTPS with its own CA (ca_file)
 * and a bearer token (token_file); the kubeconfig points at both. */
#ifndef RL_TEST_STANDIN_H
#define RL_TEST_STANDIN_H

#include <stddef.h>

typedef struct rl_test_standin {
    int pid;                      /* the python process */
    char dir[256];                /* temp dir with ca.crt, token, kubeconfig, ready */
    char kubeconfig[320], token_file[320], ca_file[320];
    char host[64];                /* "127.0.0.1" */
    int port, admin_port;
} rl_test_standin;

/* Start python3 tests/k8s/standin.py in a fresh temp dir (extra_args may be NULL or
 * e.g. "--max-endpoints-per-slice 2") and wait (<= 15 s) for DIR/ready. 0 on success.
 * The script is found under $RL_TEST_ROOT, else relative to the current directory.
 * Its log (one JSON line per request) is DIR/standin.log. */
int rl_test_standin_start(rl_test_standin *s, const char *extra_args);
/* SIGTERM, wait, remove the dir. */
void rl_test_standin_stop(rl_test_standin *s);
/* One admin request; returns the HTTP status, response body into out[n] (may be NULL).
 * -1 when the admin port cannot be reached or does not answer within 10 s. */
int rl_test_standin_admin(const rl_test_standin *s, const char *method, const char *path,
                          const char *body, char *out, size_t n);
/* Run kubectl with KUBECONFIG pointing at the stand-in: args as one shell string,
 * stdin_text (may be NULL) fed to it; stdout+stderr into out[n]; returns exit status.
 * Bounded by 60 s (exit status 124 when it ran out). Discovery is cached in DIR/cache. */
int rl_test_kubectl(const rl_test_standin *s, const char *args, const char *stdin_text,
                    char *out, size_t n);

#endif
