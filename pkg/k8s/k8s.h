/* k8s: a small Kubernetes API client over pkg/http.
 *
 * Config comes from inside a pod (service-account token, CA and namespace)
 * or from kubeconfig files (YAML read by libyaml, or JSON; a KUBECONFIG
 * list merged as kubectl merges it). TLS is always verified; a kubeconfig
 * asking for insecure-skip-tls-verify is refused.
 *
 * The client is thread-safe: several threads may issue requests and run
 * watches on one rl_k8s at once (each request takes an HTTP handle from a
 * small pool, so connections are reused without being shared mid-request).
 *
 * Bearer tokens follow client-go: the token file is re-read every 60 s and
 * right after a 401, and the request is then retried once. An exec
 * credential plugin (GKE, EKS, AKS) is run when a token is first needed,
 * its token kept until its expirationTimestamp, and the plugin run again
 * after a 401 (then the request is retried once). Tokens never appear in
 * logs or error messages.
 *
 * Requests return RL_OK only for a 2xx answer. Any other answer sets
 * *http_status so callers can branch (404, 409 and 410 are ordinary
 * outcomes for an elector) and returns RL_EINPUT for 4xx, RL_EPEER for 5xx
 * and 429 (after the retries), with a message such as
 *   PUT leases/x: 409 Conflict: Operation cannot be fulfilled ... (reason Conflict)
 * *http_status is 0 when no answer arrived at all (RL_ETIMEOUT, RL_EPEER,
 * RL_EIO: TLS failure, RL_EABORT). 429 and 5xx (and transport timeouts and
 * connection failures) are retried with full-jitter backoff honouring
 * Retry-After, within the call's deadline; 401 (after the one token re-read)
 * and 403 never are. A retried POST can meet its own earlier success as 409
 * AlreadyExists. */
#ifndef RL_K8S_H
#define RL_K8S_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http.h"
#include "util/util.h"

struct cJSON;

/* ---- configuration -------------------------------------------------------------- */
/* A user's `exec` credential plugin (client.authentication.k8s.io/v1 or
 * v1beta1), as kubectl runs it: no shell, our environment plus env,
 * stdin not a terminal, KUBERNETES_EXEC_INFO describing the request. */
typedef struct rl_k8s_exec {
    char where[400];        /* "kubeconfig F: users[name=U].user.exec", for messages */
    char api_version[48];   /* client.authentication.k8s.io/v1 or .../v1beta1 */
    char **argv;            /* command (resolved against the kubeconfig's directory when
                             * it contains a '/', else looked up in PATH), then args;
                             * NULL-terminated */
    char **env;             /* "NAME=value" set for the plugin; NULL-terminated */
    char *install_hint;     /* installHint, or NULL */
    bool provide_cluster_info;
    char *cluster_config;   /* JSON of the cluster's client.authentication.k8s.io/exec
                             * extension (sent when provide_cluster_info), or NULL */
} rl_k8s_exec;

typedef struct rl_k8s_config {
    char server[512];     /* "https://host:port" (no trailing slash) */
    char ns[254];         /* namespace; "default" when none is given */
    char source[1100];    /* where this came from, for messages */
    /* CA: a PEM blob (certificate-authority-data) or a file. */
    char *ca_pem;
    size_t ca_pem_len;
    char ca_file[1024];
    /* Bearer token: a file (re-read as it rotates) or a fixed string. */
    char token_file[1024];
    char *token;
    /* Client certificate (mutual TLS): PEM blobs or files. */
    char *cert_pem, *key_pem;
    size_t cert_pem_len, key_pem_len;
    char cert_file[1024], key_file[1024];
    /* Exec credential plugin (instead of a token), or NULL. */
    rl_k8s_exec *exec;
} rl_k8s_config;

/* Inside a pod: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and the
 * service-account directory (RL_K8S_SA_DIR overrides
 * /var/run/secrets/kubernetes.io/serviceaccount, for tests). The token
 * file must exist and be non-empty; ca.crt must exist; a missing
 * namespace file means "default". RL_EINPUT naming the variable or file. */
int rl_k8s_config_in_cluster(rl_k8s_config *c, rl_err *e);
/* From kubeconfigs: path is one file or a list of files separated by ':'
 * (as KUBECONFIG is); NULL means $KUBECONFIG or ~/.kube/config. context
 * NULL means current-context. A list is merged as kubectl merges it: the
 * first file naming a cluster, context or user wins that name, the first
 * file setting current-context wins it, files of the list that do not
 * exist are skipped (a single named file must exist), and every file must
 * parse. Relative file references (certificate-authority, client-
 * certificate, client-key, tokenFile, an exec command containing '/') are
 * relative to the directory of the file that holds them. */
int rl_k8s_config_kubeconfig(const char *path, const char *context, rl_k8s_config *c,
                             rl_err *e);
/* The same from one text already in memory (`path` names it in messages
 * and anchors relative paths). Reads no other file. Fuzzed. */
int rl_k8s_config_parse(const char *text, size_t len, const char *path, const char *context,
                        rl_k8s_config *c, rl_err *e);
/* The same from n texts (a KUBECONFIG list in memory, in its order). */
int rl_k8s_config_parse_list(int n, const char *const *texts, const size_t *lens,
                             const char *const *paths, const char *context, rl_k8s_config *c,
                             rl_err *e);
/* In-cluster when KUBERNETES_SERVICE_HOST is set, else the kubeconfig. */
int rl_k8s_config_auto(rl_k8s_config *c, rl_err *e);
void rl_k8s_config_free(rl_k8s_config *c);

/* One YAML document (libyaml: block and flow style, block scalars, quoted
 * scalars and keys, comments, anchors and aliases) as JSON. Scalars become
 * strings, except the plain null forms (empty, ~, null) which become JSON
 * null. Refused, with the line: several documents, merge keys (<<),
 * non-scalar or duplicate keys, tags other than YAML's own (!!str ...),
 * nesting deeper than 64, aliases copying more than 100000 nodes, an
 * empty document. Text that is valid JSON keeps JSON's types. Messages
 * name `where` and the line. Fuzzed (through the kubeconfig reader). */
int rl_k8s_yaml_parse(const char *text, size_t len, const char *where, struct cJSON **out,
                      rl_err *e);
/* The same, plain scalars typed by YAML 1.2's core schema as kubectl types a
 * manifest: true/false, integers (decimal, 0o, 0x) and floats become JSON
 * booleans and numbers; quoted scalars and everything else stay strings. */
int rl_k8s_yaml_parse_typed(const char *text, size_t len, const char *where, struct cJSON **out,
                            rl_err *e);

/* Run the config's exec plugin once (c->exec must be set): *token gets
 * status.token (malloc'd), *expiry its expirationTimestamp in unix seconds
 * (0: none given). Killed after timeout_s (RL_ETIMEOUT); a plugin that
 * fails, is missing or prints something else is RL_EINPUT. Messages name
 * the user entry and the command, never the token; the plugin's stderr
 * is not passed through, its last line ends the message of a failure. */
int rl_k8s_exec_token(const rl_k8s_config *c, double timeout_s, char **token, double *expiry,
                      rl_err *e);
/* The plugin's stdout: an ExecCredential of api_version with status.token
 * (and optionally status.expirationTimestamp, RFC 3339). A client
 * certificate instead of a token is refused. `where` prefixes messages,
 * which never contain the token. Fuzzed. */
int rl_k8s_exec_credential_parse(const char *text, size_t len, const char *api_version,
                                 const char *where, char **token, double *expiry, rl_err *e);

/* ---- the client ------------------------------------------------------------------------ */
typedef struct rl_k8s_opts {
    double timeout_s;         /* per call, retries included; 0: 30 s */
    double connect_timeout_s; /* 0: 5 s */
    rl_http_backoff backoff;  /* retries of 429/5xx/transport failures; {0}: defaults */
    double token_refresh_s;   /* 0: 60 s */
    double exec_timeout_s;    /* an exec credential plugin's run; 0: 30 s */
    const volatile int *abort_flag; /* optional: cancels every call of this client */
    /* client-side rate limit, client-go's token bucket: qps requests per
     * second on average, bursts of up to burst (each try of a request and
     * each watch start takes a token). qps 0: none; burst 0: max(1, qps). */
    double qps;
    int burst;
} rl_k8s_opts;

typedef struct rl_k8s rl_k8s;

/* Copies cfg (the caller may free it). opts may be NULL. Reads the token
 * file once now so a missing file fails here. */
int rl_k8s_new(const rl_k8s_config *cfg, const rl_k8s_opts *opts, rl_k8s **out, rl_err *e);
void rl_k8s_free(rl_k8s *c);
/* Config (the kubeconfig file if given, else rl_k8s_config_auto) and a
 * client on it (opts may be NULL). */
int rl_k8s_connect(const char *kubeconfig, const rl_k8s_opts *opts, rl_k8s **out, rl_err *e);
const char *rl_k8s_namespace(const rl_k8s *c);

/* The core: `path` is the absolute API path with any query
 * ("/api/v1/namespaces/ns/pods?limit=5"); body (may be NULL) is sent with
 * content_type. *out (optional) receives the parsed JSON body of any
 * answer that has one -- the object on success, the Status otherwise. */
int rl_k8s_request(rl_k8s *c, const char *method, const char *path, const char *content_type,
                   const char *body, long *http_status, struct cJSON **out, rl_err *e);
int rl_k8s_get(rl_k8s *c, const char *path, long *http_status, struct cJSON **out, rl_err *e);
/* POST (create), PUT (replace: obj carries metadata.resourceVersion for an
 * optimistic update, 409 if stale), PATCH with application/merge-patch+json. */
int rl_k8s_create(rl_k8s *c, const char *path, const struct cJSON *obj, long *http_status,
                  struct cJSON **out, rl_err *e);
/* POST sent once: a create whose answer is lost is not resent (its retry
 * would meet itself as 409 AlreadyExists); the caller decides. */
int rl_k8s_create_once(rl_k8s *c, const char *path, const struct cJSON *obj, long *http_status,
                       struct cJSON **out, rl_err *e);
int rl_k8s_replace(rl_k8s *c, const char *path, const struct cJSON *obj, long *http_status,
                   struct cJSON **out, rl_err *e);
int rl_k8s_merge_patch(rl_k8s *c, const char *path, const struct cJSON *patch,
                       long *http_status, struct cJSON **out, rl_err *e);
int rl_k8s_delete(rl_k8s *c, const char *path, long *http_status, rl_err *e);

/* API paths. group_version "v1" -> /api/v1, "coordination.k8s.io/v1" ->
 * /apis/coordination.k8s.io/v1; ns NULL for cluster-scoped; name NULL for
 * the collection. Names and namespaces are checked (lowercase RFC 1123
 * characters), so nothing can escape the path. */
int rl_k8s_path(char *out, size_t n, const char *group_version, const char *ns,
                const char *resource, const char *name, rl_err *e);

/* A non-2xx answer as one line: "<verb> <what>: <code> <text>: <message>
 * (reason <reason>)"; status may be NULL (no JSON body). Public for tests. */
void rl_k8s_status_message(const char *method, const char *path, long code,
                           const struct cJSON *status, char *out, size_t n);

/* ---- LIST + WATCH ------------------------------------------------------------------------
 * A reflector: LIST (paginated), hand the whole set to the callback as a
 * SYNC, then WATCH from the list's resourceVersion with bookmarks, deliver
 * ADDED/MODIFIED/DELETED, keep the newest resourceVersion (bookmarks
 * included), re-watch when a stream ends, relist on 410 Gone (HTTP status
 * or an ERROR event with code 410). Other failures back off and retry,
 * except 401/403/404 and other 4xx, which end the loop with their error. */
typedef enum {
    RL_K8S_SYNC = 0, /* obj is a JSON array of every item: replace your state */
    RL_K8S_ADDED,
    RL_K8S_MODIFIED,
    RL_K8S_DELETED,
    RL_K8S_BOOKMARK, /* only from the parser; the loop does not deliver these */
    RL_K8S_ERROR,    /* only from the parser */
} rl_k8s_event_type;

/* Return 0 to go on, non-zero to end the loop (rl_k8s_list_watch returns RL_OK). */
typedef int (*rl_k8s_watch_fn)(void *ud, rl_k8s_event_type type, const struct cJSON *obj);

typedef struct rl_k8s_watch_opts {
    const char *path;            /* collection path, no query */
    const char *label_selector;  /* optional */
    const char *field_selector;  /* optional */
    int page_limit;              /* LIST page size; 0: 500 */
    int watch_timeout_s;         /* server-side timeoutSeconds per watch; 0: 300 */
    double idle_timeout_s;       /* no byte for this long ends a watch; 0: 90 s */
    const volatile int *stop;    /* set it to end the loop (seen within ~1 s) */
} rl_k8s_watch_opts;

/* Runs on the caller's thread until *stop, the callback asks, or an error
 * that retrying cannot fix. RL_OK when stopped. */
int rl_k8s_list_watch(rl_k8s *c, const rl_k8s_watch_opts *o, rl_k8s_watch_fn fn, void *ud,
                      rl_err *e);

/* The stream pieces, public for tests and fuzzing: the body is split into
 * lines by rl_http_lines (http.h), each line parsed here. */

typedef struct rl_k8s_event {
    rl_k8s_event_type type;
    struct cJSON *root;          /* owns everything below */
    struct cJSON *object;        /* the "object" member */
    char resource_version[128];  /* object's metadata.resourceVersion ("" if none) */
    long code;                   /* ERROR: the Status code (410: expired) */
    char message[256];           /* ERROR: Status reason and message */
} rl_k8s_event;
/* Parse one watch line. RL_EINPUT for anything malformed (not JSON, no
 * type, unknown type, object missing or not an object). Fuzzed. */
int rl_k8s_event_parse(const char *line, size_t len, rl_k8s_event *ev, rl_err *e);
void rl_k8s_event_free(rl_k8s_event *ev);

/* ---- objects ------------------------------------------------------------------------------ */
/* Kubernetes MicroTime "2006-01-02T15:04:05.000000Z" (UTC). Parsing accepts
 * 0-9 fraction digits and a Z or +hh:mm offset (RFC 3339). */
void rl_k8s_microtime_format(double unix_s, char *out, size_t n);
int rl_k8s_time_parse(const char *s, double *unix_s);

/* coordination.k8s.io/v1 Lease fields (absent ones: "" / -1). */
typedef struct rl_k8s_lease {
    char name[254];
    char resource_version[128];
    char holder[254];        /* spec.holderIdentity */
    long duration_s;         /* spec.leaseDurationSeconds */
    double acquire_time;     /* unix seconds */
    double renew_time;
    long transitions;        /* spec.leaseTransitions */
} rl_k8s_lease;
/* Read a Lease object; fields of the wrong type are RL_EINPUT naming them
 * (a Lease edited by hand into nonsense). */
int rl_k8s_lease_read(const struct cJSON *obj, rl_k8s_lease *out, rl_err *e);
/* A Lease object from l (resource_version "" leaves it out; negative
 * numbers and times leave those fields out). NULL on out of memory. */
struct cJSON *rl_k8s_lease_build(const char *ns, const rl_k8s_lease *l);
/* GET / POST / PUT of namespaces/<ns>/leases/<name> (ns NULL: the
 * client's). Outcomes through *http_status: 404 on get when absent, 409
 * on create when it exists and on update when resource_version is stale. */
int rl_k8s_lease_get(rl_k8s *c, const char *ns, const char *name, rl_k8s_lease *out,
                     struct cJSON **obj, long *http_status, rl_err *e);
int rl_k8s_lease_create(rl_k8s *c, const char *ns, const rl_k8s_lease *l, rl_k8s_lease *out,
                        long *http_status, rl_err *e);
int rl_k8s_lease_update(rl_k8s *c, const char *ns, const rl_k8s_lease *l, rl_k8s_lease *out,
                        long *http_status, rl_err *e);

/* discovery.k8s.io/v1 EndpointSlices of a Service: label
 * kubernetes.io/service-name=<service>. */
int rl_k8s_endpointslices_path(char *out, size_t n, const char *ns, rl_err *e);
int rl_k8s_endpointslices_list(rl_k8s *c, const char *ns, const char *service,
                               struct cJSON **items, rl_err *e);
int rl_k8s_endpointslices_watch(rl_k8s *c, const char *ns, const char *service,
                                const volatile int *stop, rl_k8s_watch_fn fn, void *ud,
                                rl_err *e);

/* One endpoint of a slice, with Kubernetes' defaults applied: ready and
 * serving absent mean true, terminating absent means false. */
typedef struct rl_k8s_endpoint {
    char address[64];        /* addresses[0] */
    char hostname[64];       /* "" when absent */
    char target[254];        /* targetRef.name ("" when absent) */
    char zone[64];           /* its node's topology.kubernetes.io/zone, which the
                                EndpointSlice controller copies ("" when absent) */
    bool ready, serving, terminating;
} rl_k8s_endpoint;
/* Fills up to max endpoints; *n gets how many the slice has usable (an
 * endpoint without an address is skipped) -- more than max means only the
 * first max were written. RL_EINPUT names a field of the
 * wrong type. */
int rl_k8s_endpointslice_endpoints(const struct cJSON *slice, rl_k8s_endpoint *out, int max,
                                   int *n, rl_err *e);

#endif
