/* operator: the TrainingJob controller (docs/trainingjob.md is the API).
 *
 * Level-triggered: every reconcile of a job reads the TrainingJob and the
 * objects it owns from the API server and moves the world one step toward
 * the spec, so the process can be killed and restarted at any moment.
 * The one piece of memory that must survive a restart -- which ended pods
 * were already counted (as restarts, preemptions or infrastructure
 * failures) -- lives in the job's status (countedPods), written before the
 * pod is deleted.
 *
 * The pure parts (spec parsing, the objects a job wants, how a pod ended,
 * the phase) are public for tests; rl_op_run is the whole controller. */
#ifndef RL_OPERATOR_H
#define RL_OPERATOR_H

#include <stdbool.h>
#include <stddef.h>

#include "k8s/k8s.h"
#include "util/util.h"

struct cJSON;

#define RL_OP_GROUP "ringleader.dev"
#define RL_OP_VERSION "v1alpha1"
#define RL_OP_GV RL_OP_GROUP "/" RL_OP_VERSION
#define RL_OP_LABEL_JOB "ringleader.dev/job"
#define RL_OP_LABEL_INDEX "ringleader.dev/index"
/* Keys under this prefix, on labels and annotations, are the operator's:
 * spec.podMetadata may not set them. */
#define RL_OP_KEY_PREFIX RL_OP_GROUP "/"
#define RL_OP_LABEL_MANAGED_BY "app.kubernetes.io/managed-by"
/* What cluster-autoscaler and Karpenter read before they move a pod; set
 * from spec.disruptible, so spec.podMetadata may not set them either. */
#define RL_OP_ANN_SAFE_TO_EVICT "cluster-autoscaler.kubernetes.io/safe-to-evict"
#define RL_OP_ANN_DO_NOT_DISRUPT "karpenter.sh/do-not-disrupt"

/* ---- the spec, validated ---------------------------------------------------------- */
typedef struct rl_op_job {
    char ns[254], name[64], uid[128];
    long long generation;
    char image[1024], pull_policy[16], clean_policy[16];
    int replicas;            /* clamped into [min, max] */
    int min_nodes, max_nodes;
    bool elastic;
    int nproc, gpus;
    int restart_limit;
    long long grace_s;
    bool suspend;
    bool disruptible;        /* spec.disruptible: autoscalers may evict the pods to move them */
    bool network_policy;     /* spec.networkPolicy (default true): the job's NetworkPolicy */
    int metrics_port, rdzv_port;
    char *training_json;     /* spec.training with rdzv.port set: RINGLEADER_CONFIG */
    /* spec.s3 */
    char s3_endpoint[512], s3_region[64], s3_addressing[16];
    char s3_secret[254], s3_key_id[254], s3_key_secret[254], s3_key_token[254];
    char shm_size[32];       /* spec.shmSize: sizeLimit of the /dev/shm emptyDir ("" none) */
    char rack_label[320];    /* spec.rackLabel: the node label naming a rack or NVLink domain ("" none) */
    /* the object's spec (borrowed): fields passed through to the pods as
     * written -- podMetadata, affinity, topologySpreadConstraints, ... */
    const struct cJSON *spec;
} rl_op_job;

/* The memory-backed emptyDir every worker pod gets at /dev/shm: NCCL's
 * intra-node transport and the tcp backend's same-host links live there,
 * and a container runtime's default /dev/shm is 64 MiB. */
#define RL_OP_SHM_VOLUME "ringleader-shm"
#define RL_OP_SHM_PATH "/dev/shm"

/* The pods pass the "restricted" Pod Security Standard, with a read-only
 * root filesystem: the one writable place besides /dev/shm is an emptyDir
 * at /tmp (temp files; checkpoints go to S3 or to the user's volumes).
 * The user and group are the image's (Dockerfile: USER 65532:65532). */
#define RL_OP_TMP_VOLUME "ringleader-tmp"
#define RL_OP_TMP_PATH "/tmp"
#define RL_OP_WORKER_UID 65532

/* The worker's container. The kubelet sorts containerStatuses by name and
 * service meshes inject their own containers (istio-proxy, linkerd-proxy),
 * so it is always found by this name, never by position. */
#define RL_OP_CONTAINER "worker"

/* Reads and checks a TrainingJob object. Whatever the CRD schema cannot
 * say (min <= max, the training config, the global batch dividing every
 * world size the job can have) is RL_EINPUT with a message naming the
 * field ("spec.elastic.maxReplicas: 1 is below minReplicas 2"). Defaults
 * are applied here too, so an object stored without the schema's defaults
 * still works. */
int rl_op_job_parse(const struct cJSON *obj, rl_op_job *j, rl_err *e);
void rl_op_job_free(rl_op_job *j);

/* ---- the objects a job owns (all with a controller owner reference) ---------------- */
struct cJSON *rl_op_service(const rl_op_job *j);
struct cJSON *rl_op_secret(const rl_op_job *j, const char *secret_hex);
struct cJSON *rl_op_service_account(const rl_op_job *j);
struct cJSON *rl_op_role(const rl_op_job *j);
struct cJSON *rl_op_role_binding(const rl_op_job *j);
struct cJSON *rl_op_pod(const rl_op_job *j, int index);
/* Voluntary disruptions (a drain by the cluster autoscaler or Karpenter, a
 * node upgrade) may take pods only down to the elastic minimum, and none
 * of a fixed-size job's. */
struct cJSON *rl_op_pdb(const rl_op_job *j);
/* Only the job's own pods reach its pods (the rendezvous store, the ring
 * and NCCL, whose ports are dynamic), and the metrics port is open to the
 * namespaces labelled metrics_ns ("key=value"; "" any namespace). */
#define RL_OP_METRICS_NS_DEFAULT "kubernetes.io/metadata.name=monitoring"
struct cJSON *rl_op_network_policy(const rl_op_job *j, const char *metrics_ns);
/* metrics_ns as the operator's flag gives it: "" or key=value, a label
 * key and value the API would take. RL_EINPUT naming `where`. */
int rl_op_check_label_pair(const char *kv, const char *where, rl_err *e);

/* ---- how a pod stands ---------------------------------------------------------------- */
typedef enum {
    RL_POD_PENDING = 0,  /* not running yet: waiting (reason says why) or unscheduled */
    RL_POD_RUNNING,
    RL_POD_TERMINATING,  /* deletionTimestamp set */
    RL_POD_SUCCEEDED,    /* exit 0: the job is complete */
    /* the endings (rl_pod_ended); util.h says which exit status is which */
    RL_POD_PREEMPTED,    /* stopped, not its fault: replace, counted in status.preemptions */
    RL_POD_FAILED,       /* crashed: replace, counts against restartLimit */
    RL_POD_INFRA_FAILED, /* its node failed it (OOM killer, network, storage, device, a lost
                          * peer): replace, counted in status.infrastructureFailures only */
    RL_POD_USER_ERROR,   /* bad config, data or code path: the job fails now, no retry */
} rl_pod_state;
#define RL_POD_STATE_LAST RL_POD_USER_ERROR

/* Ended without completing the job: to be counted, then replaced or the
 * job failed (SUCCEEDED is the job's completion, never replaced). */
static inline bool rl_pod_ended(rl_pod_state s) {
    return s == RL_POD_PREEMPTED || s == RL_POD_FAILED || s == RL_POD_INFRA_FAILED || s == RL_POD_USER_ERROR;
}

typedef struct rl_pod_info {
    rl_pod_state state;
    int index;           /* from the label; -1 if missing or bad */
    bool ready;
    char name[254], uid[128];
    char reason[64];     /* Evicted, Error, OOMKilled, UserError, ErrImagePull, Unschedulable, ... */
    char message[512];
    double deleting_s;   /* terminating: seconds since the delete was asked for */
    double overdue_s;    /* terminating: seconds past its deletionTimestamp (grace over) */
} rl_pod_info;

void rl_op_pod_classify(const struct cJSON *pod, rl_pod_info *p);
const char *rl_pod_state_name(rl_pod_state s);

/* ---- the controller ---------------------------------------------------------------------- */
typedef struct rl_op_opts {
    const char *kubeconfig;      /* NULL: in-cluster, else $KUBECONFIG / ~/.kube/config */
    const char *const *namespaces; /* NULL-terminated; NULL or empty: every namespace */
    bool leader_elect;
    const char *lease_name, *lease_ns; /* the operator's own Lease */
    const char *id;              /* this replica (POD_NAME) */
    double resync_s;             /* every job reconciled at least this often (600) */
    double stuck_s;              /* a pod this long past its deletionTimestamp is stuck (60) */
    double qps;                  /* its API client's rate limit: requests/s (20), */
    int burst;                   /* in bursts of up to (30) */
    double lease_s, renew_deadline_s, retry_s; /* 15, 10, 2 */
    int metrics_port;            /* /metrics and /healthz; 0: none */
    const char *metrics_ns;      /* who may scrape the jobs' pods (RL_OP_METRICS_NS_DEFAULT) */
    const volatile int *stop;
} rl_op_opts;

/* Runs until *stop (RL_OK) or until leadership is lost (RL_EPEER: the
 * process should exit and be restarted, as client-go operators do). */
int rl_op_run(const rl_op_opts *o, rl_err *e);

/* One reconcile of ns/name against the API (public for tests). */
typedef struct rl_op rl_op;
int rl_op_new(rl_k8s *k, rl_op **out, rl_err *e);
/* When a terminating pod counts as stuck (default 60 s past its grace). */
void rl_op_set_stuck_after(rl_op *op, double seconds);
/* The namespaces (key=value, checked) the jobs' NetworkPolicies let scrape metrics. */
void rl_op_set_metrics_ns(rl_op *op, const char *kv);

/* `ringleader-operator render`: the objects a reconcile would create for
 * each TrainingJob in text (YAML or JSON, documents split by "---"; other
 * kinds skipped; namespace ns where a job names none), as one YAML List
 * (*yaml, malloc'd), without a cluster; each job's uid and rendezvous
 * secret are placeholders. Refuses what the running operator refuses,
 * naming `where` and the field. */
int rl_op_render(const char *text, size_t len, const char *where, const char *ns, const char *metrics_ns, char **yaml,
                 rl_err *e);
int rl_op_reconcile(rl_op *op, const char *ns, const char *name, rl_err *e);
void rl_op_free(rl_op *op);

#endif
