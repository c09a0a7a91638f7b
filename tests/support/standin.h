/* The local Kubernetes API stand-in (tests/k8s/standin.py) for test suites:
 * start it in a fresh temp dir, talk to its admin API, run the real kubectl
 * against it, stop it. The stand-in serves HTTPS with its own CA (ca_file)
 * and a bearer token (token_file); the kubeconfig points at both. */
#ifndef RL_TEST_STANDIN_H
#define RL_TEST_STANDIN_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;
/* The member at a dotted path ("status.containerStatuses"), or NULL. */
const struct cJSON *rl_test_json_path(const struct cJSON *j, const char *dotted);

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

/* ---- pods run by the stand-in's kubelet ------------------------------------------- */

/* Start options. Any image mapping (or .kubelet) turns on the scheduler and
 * kubelet (tests/k8s/kubelet.py): bound pods' containers run as local
 * processes. An image matching no pattern fails to pull (ErrImagePull). */
typedef struct rl_test_standin_opts {
    const char *images[8];  /* "PATTERN=DIR[=ENTRYPOINT]": fnmatch on the image reference, DIR first
                             * on the container's PATH; e.g. "ringleader:*=" + rl_test_bindir() */
    bool kubelet;           /* run pods even without an image mapping */
    int max_pods;           /* pods the node takes; 0: no limit */
    double backoff_s;       /* first restart / image-pull back-off (0: the real 10 s; doubles to 300 s) */
    const char *env[8];     /* "RL_NAME=value" for the stand-in, whose RL_* containers inherit */
    const char *extra_args; /* more flags, as for rl_test_standin_start (may be NULL) */
} rl_test_standin_opts;

int rl_test_standin_start_opts(rl_test_standin *s, const rl_test_standin_opts *o);

/* One pod as the kubelet reports it (first container, or the one named). */
typedef struct rl_test_pod {
    bool exists;               /* false: no such pod (gone) */
    bool deleting;             /* deletionTimestamp set */
    char uid[64], phase[16], ip[32], node[64];
    char reason[32], message[512];              /* pod level: Evicted */
    int scheduled;                              /* PodScheduled: 1 True, 0 False, -1 absent */
    char sched_reason[32], sched_message[512];  /* Unschedulable, "0/1 nodes are available: ..." */
    bool ready, disruption;                     /* conditions Ready / DisruptionTarget True */
    char state[16];                             /* waiting | running | terminated | "" */
    char c_reason[64], c_message[8192];         /* the state's reason and message; room for a
                                                 * whole termination message (4096 bytes) */
    int exit_code;                              /* terminated.exitCode, else -1 */
    int restarts;
    int last_exit_code;                         /* lastState.terminated.exitCode, else -1 */
} rl_test_pod;

/* The pod's state through the admin API (no TLS); 0, or -1 when the admin
 * API did not answer. container may be NULL (the first one). */
int rl_test_standin_pod(const rl_test_standin *s, const char *ns, const char *name, const char *container,
                        rl_test_pod *p);
/* Poll (every 50 ms, <= timeout_s) until `want` holds: "gone", a phase
 * (Pending, Running, Succeeded, Failed), "Ready", a container reason
 * (ErrImagePull, ImagePullBackOff, CreateContainerConfigError,
 * CrashLoopBackOff, Completed, Error, StartError), a pod reason (Evicted) or
 * "Unschedulable". 0 when it did, -1 on timeout; *p holds the last state. */
int rl_test_standin_await_pod(const rl_test_standin *s, const char *ns, const char *name, const char *container,
                              const char *want, double timeout_s, rl_test_pod *p);
/* Kubelet eviction (node pressure): processes killed, phase Failed, reason
 * Evicted, DisruptionTarget. message may be NULL. Returns the HTTP status. */
int rl_test_standin_evict(const rl_test_standin *s, const char *ns, const char *name, const char *message);
/* The first node's pod capacity (n < 0: the kubelet's default, 110). Returns the HTTP status. */
int rl_test_standin_set_max_pods(const rl_test_standin *s, int n);
/* Nodes (--nodes N, --autoscaler MAX): how many Node objects there are, -1 when
 * the admin API did not answer. */
int rl_test_standin_node_count(const rl_test_standin *s);
/* A spot interruption of the node: cordoned and tainted now, its pods stopped
 * by the kubelet's graceful node shutdown, the node gone after notice_s
 * (tests/k8s/nodes.py). Returns the HTTP status (404: no such node). */
int rl_test_standin_reclaim(const rl_test_standin *s, const char *node, double notice_s);
/* A token of service account ns/sa (RBAC applies to it). 0 or -1. */
int rl_test_standin_sa_token(const rl_test_standin *s, const char *ns, const char *sa, char *tok, size_t n);
/* A kubeconfig at path for the stand-in with a bearer token (and a context
 * namespace; NULL: none), for a client that must not be the admin. 0 or -1. */
int rl_test_standin_write_kubeconfig(const rl_test_standin *s, const char *token, const char *ns, const char *path);

#endif
