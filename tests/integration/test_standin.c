/* standin: faithfulness of the local Kubernetes API stand-in (tests/k8s/standin.py).
 * Every other Kubernetes test is worth what this stand-in is worth, so each real API
 * behaviour it reproduces is checked here, with the real kubectl 1.32 where a client's
 * view matters and with libcurl (verifying the stand-in's own CA) for the wire details.
 *
 * Real API behaviour reproduced                                   Checked by
 * ------------------------------------------------------------------------------------------
 * ca.crt/token(0600)/kubeconfig/ready contract; SIGTERM cleanup    contract_files_and_kubectl
 * discovery (/api, /apis, group/version lists, shortNames,
 *   x/status and x/scale entries) enough for kubectl get/apply     kubectl_apply_get_scale_delete,
 *                                                                  discovery_lists
 * OpenAPI v3 index + fieldValidation param (kubectl's validation)  kubectl_apply_get_scale_delete
 * client-side apply: POST then GET + patch (SMP built-in,
 *   merge patch for CRs); generation 1 -> 2 on spec change        kubectl_apply_get_scale_delete
 * CRD makes group/version/plural served; printer columns as a
 *   Table (`kubectl get tj`); short names; deleting it unserves   kubectl_apply_get_scale_delete
 * /scale of a CR through specReplicasPath (`kubectl scale`)      kubectl_apply_get_scale_delete
 * kubectl delete waits until gone; GC of owned objects           kubectl_apply_get_scale_delete
 * 401 Unauthorized Status without / with an unknown token          http_errors_are_status_bodies
 * 404 NotFound, 409 AlreadyExists, 409 Conflict (stale RV, the
 *   real message), 400 namespace mismatch, 422 missing name,
 *   415 strategic merge patch of a CR, SMP of a built-in works     http_errors_are_status_bodies
 * resourceVersion: one global increasing counter, on every write  http_errors_are_status_bodies
 * Lease fields typed as the real decoder: MicroTime with exactly
 *   6 fractional digits (400 otherwise), written back in UTC;
 *   leaseDurationSeconds int32 > 0 (400 / 422)                    http_errors_are_status_bodies
 * pod spec immutable except images etc. (422, the real message)   status_and_scale_subresources
 * DELETE answers: 200 (202 only with orphanDependents=false);
 *   Status Success for an immediate delete (object for pods);
 *   the object, marked, while finalizers or grace keep it          delete_finalizers_preconditions
 * /status: main PUT ignores status, /status changes only status;
 *   generation untouched by status; Scale of a Deployment          status_and_scale_subresources
 * finalizers keep a deleted object (deletionTimestamp) until
 *   removed; preconditions.uid mismatch -> 409                     delete_finalizers_preconditions
 * graceful pod deletion (deletionTimestamp, grace seconds), gone
 *   after the grace period or at once with gracePeriodSeconds=0   endpointslices_merge_conditions
 * LIST: label selectors (=, ==, !=, in, notin, key, !key),
 *   fieldSelector metadata.name (others 400), limit+continue,
 *   list resourceVersion, all-namespaces list                     list_selectors_and_paging
 * WATCH: chunked, one JSON event per line, ADDED/MODIFIED/DELETED
 *   in order; selector exit -> DELETED, entry -> ADDED            watch_live_in_order
 * WATCH from an RV replays every later change; BOOKMARKs carry
 *   only kind/apiVersion/metadata.resourceVersion; timeoutSeconds
 *   ends the stream cleanly; old /watch/ paths; sendInitialEvents
 *   (initial ADDED + BOOKMARK k8s.io/initial-events-end)           watch_replay_bookmarks_timeout
 * RV left the window (compaction, --history): watch -> 200 + one
 *   ERROR event Status 410 Expired; Exact LIST -> 410              watch_and_list_410_expired
 * EndpointSlices: <svc>-<rand5>, labels, ownerReference, several
 *   slices at max-endpoints 2, ready/serving/terminating rule,
 *   hostname only when subdomain == service; removed with svc     endpointslices_merge_conditions
 * outages: refuse (connection refused, watches dropped, same
 *   port back), 503 + Retry-After + Status body, early end         outage_modes
 * 403 Forbidden with the real RBAC message; revoked token -> 401  tokens_forbidden_and_revoked
 * write history of one object, in order (admin /history)          tokens_forbidden_and_revoked
 * lost answers (admin /faults): a write applied, then its answer a
 *   503 or a cut connection; another writer's change just before a
 *   PUT, which meets the real 409                                   elect::lost_renewal_answers_and_
 *                                                                    conflicts_keep_the_leader
 * admission refusing creates (admin /admission): a ResourceQuota's
 *   403 "exceeded quota: ...", a validating webhook's 400 "admission
 *   webhook ... denied the request: ..."                            job_status::refused_pods_reach_
 *                                                                    the_status_as_one_event
 * kubelet (--kubelet, implied by --image PATTERN=DIR): bound pods'
 *   containers run as local processes: command replaces the
 *   entrypoint, args, $(VAR) expansion ($$ escapes, unknown kept);
 *   env value/fieldRef/secretKeyRef/configMapKeyRef (optional);
 *   KUBERNETES_SERVICE_HOST/PORT, HOSTNAME, the image dir first on
 *   PATH, RL_* of the stand-in only; token/ca.crt/namespace files
 *   (RL_K8S_SA_DIR; none with automount false), the token is the
 *   pod's service account under RBAC and 401 once the pod is gone;
 *   status: Succeeded, terminated exit 0 Completed, podIP 127.R.x.y,
 *   nodeName; kubectl logs; STATUS column as the real printer        kubelet_env_status_logs
 * missing Secret / key: waiting CreateContainerConfigError with the
 *   kubelet's messages, retried; starts once the key exists          kubelet_secret_missing_then_created
 * unmapped image: ErrImagePull then ImagePullBackOff (containerd's
 *   and the kubelet's messages), Pending with an address; logs 400;
 *   a never-started pod's delete is immediate                        kubelet_image_pull_backoff
 * restartPolicy Never/OnFailure: Succeeded/Failed with exitCode and
 *   reason (Completed, Error, StartError 128 for a missing command),
 *   FallbackToLogsOnError: the log's tail as terminated.message;
 *   restarts with CrashLoopBackOff back-off (immediate first, then
 *   doubling), lastState, logs --previous; the scheduler's and
 *   kubelet's Events (Scheduled, Pulled, Created, Started, BackOff,
 *   Failed as Warning; repeats counted on one Event)                 kubelet_exit_codes_and_restarts,
 *                                                                  kubelet_image_pull_backoff
 * termination-message file (fresh per instance, its host path in
 *   RINGLEADER_TERMINATION_LOG for the default terminationMessagePath):
 *   terminated.message at any exit status, ahead of the log's tail
 *   (FallbackToLogsOnError only for an empty file and a status not 0);
 *   the last 4096 bytes; 12 KiB per pod, shared by its containers      kubelet_termination_message_file
 * limits.memory: over it the container's whole process group is
 *   killed, terminated OOMKilled with exit code 137 (phase Failed for
 *   restartPolicy Never, restarted with lastState OOMKilled under
 *   OnFailure), the group's processes summed; STATUS OOMKilled; a
 *   container under its limit completes                             kubelet_oom_killed_over_memory_limit
 * graceful delete: deletionTimestamp while running, SIGTERM to the
 *   main process when it handles it (a container's PID 1 ignores
 *   unhandled signals), pod gone when it exits; ignored: SIGKILL to
 *   the whole group after the grace period; Ready while running      kubelet_graceful_delete
 * kubelet eviction (admin): phase Failed, reason Evicted, message,
 *   DisruptionTarget True TerminationByKubelet, exit 137, object kept kubelet_eviction
 * scheduler: bound in a separate write (PodScheduled True); over
 *   --max-pods or a nodeSelector the node lacks: Pending, PodScheduled
 *   False Unschedulable with the real message; bound when room frees  kubelet_unschedulable
 * nodes (--nodes N): Node objects standin-node, standin-node-1, ...;
 *   kubectl get nodes (-o wide: STATUS, VERSION, INTERNAL-IP), labels
 *   hostname and zone (--zones), allocatable pods 110, Ready; kubectl
 *   cordon (Ready,SchedulingDisabled, the node lifecycle controller's
 *   unschedulable taint), uncordon, taint; each node its own hostIP   nodes_scheduler_across_nodes
 * scheduler across nodes: a node's reason is its first failing filter
 *   (unschedulable, untolerated NoSchedule taint, nodeSelector/required
 *   node affinity In/NotIn, pods, DoNotSchedule topology spread over
 *   zones, required pod affinity/anti-affinity); the Unschedulable
 *   message counts nodes per reason, then the preemption verdict per
 *   node; among fitting nodes the fewest pods, then the name           nodes_scheduler_across_nodes
 * spot reclaim (admin): cordoned, tainted, NotReady at once; graceful
 *   node shutdown: SIGTERM, Failed, reason Terminated with the kubelet's
 *   message, DisruptionTarget TerminationByKubelet; the Node deleted
 *   after the notice; PodGC: a gone node's pods (processes killed)
 *   Failed with DisruptionTarget DeletionByPodGC, then deleted          nodes_spot_reclaim_and_podgc
 * disruption controller: PDB status (observedGeneration, expectedPods,
 *   currentHealthy, desiredHealthy, disruptionsAllowed, DisruptionAllowed
 *   SufficientPods/InsufficientPods) for minAvailable, and maxUnavailable
 *   "50%" of the controller's /scale rounded up (following a scale
 *   change); kubectl get pdb columns                                    eviction_api_and_pdb_status
 * eviction (POST pods/NAME/eviction; RBAC pods/eviction create; the
 *   discovery entry): 201 Status Success, a graceful delete with the
 *   deleteOptions' or the pod's grace, DisruptionTarget
 *   EvictionByEvictionAPI; over the budget 429 TooManyRequests with the
 *   real message and DisruptionBudget cause; an unready pod under
 *   IfHealthyBudget and AlwaysAllow; two PDBs over a pod: 500            eviction_api_and_pdb_status
 * the real kubectl drain: cordon, pods by spec.nodeName, protobuf
 *   Evictions retried on 429 until --timeout (the PDB's message);
 *   drained once the budget allows                                      kubectl_drain_honours_pdbs
 * cluster autoscaler (--autoscaler): scale-up after --scale-up-delay,
 *   TriggeredScaleUp from cluster-autoscaler; NotTriggerScaleUp at the
 *   maximum; an idle node removed after --scale-down-unneeded, not one
 *   running a safe-to-evict "false" or a karpenter.sh/do-not-disrupt pod
 *   (admin /nodes says why) nor a --nodes one; a node with a pod that can
 *   move drained through the eviction API (ScaleDown Events), removed   autoscaler_scale_up_and_down
 * no process outlives the stand-in: stop kills them; after a SIGKILL
 *   PR_SET_PDEATHSIG takes the main process and a reaper the group   kubelet_no_orphans
 * RBAC for service accounts: Role/ClusterRole rules via RoleBinding/
 *   ClusterRoleBinding (ServiceAccount and Group subjects), verbs '*',
 *   subresources (pods/log), resourceNames (never create nor a plain
 *   list), the missing-role reason; tokens die with their account;
 *   TokenRequest (kubectl create token), SelfSubjectAccessReview
 *   (kubectl auth can-i), impersonation (--as); ServiceAccount
 *   admission (403 for a missing account), "default" per namespace   rbac_service_accounts
 * CRD structural schemas: v1 requires one; pruning (kubectl's Strict
 *   -> 400 strict decoding error, Warn -> Warning header), nulls,
 *   defaults (top-down), validation (type, int-or-string, enum, min/
 *   max, lengths, items, required, additionalProperties) with the
 *   real 422 message, [a, b] for several, one cause each; /status
 *   validated, main endpoint ignores status; scale through
 *   specReplicasPath/statusReplicasPath/labelSelectorPath obeys the
 *   schema; printer columns; ratcheting; CEL rules logged, not run   crd_schema_prune_default_validate
 * PodSecurity admission: namespace label pod-security.kubernetes.io/
 *   enforce (restricted, baseline; privileged or none: no checks;
 *   -version, default latest) refuses a violating pod create with
 *   the real 403 and message, each failed check in the plugin's
 *   order (allowPrivilegeEscalation, capabilities, host namespaces,
 *   hostPath, hostPort, privileged, volume types, runAsNonRoot,
 *   runAsUser=0, seccompProfile); a compliant pod is admitted; warn
 *   admits with a Warning; checked after the mutating admission     pod_security_admission
 * Istio's sidecar injector: namespace label istio-injection=enabled
 *   adds the istio-proxy container (it passes restricted; CNI mode,
 *   no istio-init), pod label sidecar.istio.io/inject=false opts out;
 *   the kubelet sorts containerStatuses by name; a plain sidecar keeps
 *   the pod Running (READY 1/2, STATUS Error) after the main one ended, and
 *   stops on SIGTERM when the pod is deleted                         sidecar_injection_and_sorted_statuses
 * native sidecars (initContainers with restartPolicy Always; Istio's
 *   annotation sidecar.istio.io/nativeSidecar): started before the
 *   other containers, in initContainerStatuses and READY, SIGTERM once
 *   the others ended, so the pod completes with their phase           native_sidecar_stopped_after_the_worker
 *
 * Deliberately not reproduced: protobuf request bodies beyond the kinds kubectl's typed commands
 * need (Secret, ConfigMap, Namespace, ServiceAccount, Role/ClusterRole and their bindings,
 * TokenRequest, SelfSubjectAccessReview: others 415, use apply or create -f); namespace deletion
 * removes the content at once (no Terminating phase); generation exists only where 1.32 sets it
 * (Deployments, PodDisruptionBudgets, CRDs, custom resources); OpenAPI schemas of built-ins
 * (fieldValidation matters for custom resources only); in CRD schemas: x-kubernetes-validations
 * (CEL: a warning in the log), allOf/anyOf/oneOf/not, string formats, list-type/map-keys (lists
 * are atomic), embedded resources (integer formats are not range-checked, as by the real server);
 * structural-schema checks of a CRD beyond "schemas are required" and types present; server-side
 * apply field ownership (apply-patch is a merge patch) and managedFields; PDBs: the disruption
 * controller finds pods' controllers through /scale only (Deployments, custom resources with a
 * scale subresource: a ReplicaSet, StatefulSet or ReplicationController owner is not found, so a
 * maxUnavailable or percentage PDB over its pods fails its sync), no PDB validation (both
 * minAvailable and maxUnavailable are accepted); the eviction's retries on conflicts; admission
 * other than ServiceAccount, PodSecurity (pod creates only: not pod updates, workload resources,
 * exemptions or audit; no AppArmor, SELinux, procMount, sysctls or Windows checks) and the Istio
 * injection above; RBAC nonResourceURLs (allowed to anyone authenticated), aggregationRule,
 * escalation checks, bootstrap roles (the admin token is system:masters; everyone may create
 * SelfSubjectAccessReviews); service-account tokens are opaque (not JWTs) and no kube-root-ca.crt
 * ConfigMap is published; "default" service accounts appear with their namespace, not moments
 * later; conversion between CRD versions; built-in Tables beyond simplified columns for pods,
 * services, nodes, PDBs, leases and endpointslices (Name/Age for the rest); controllers other than
 * EndpointSlice, garbage collector, scheduler, kubelet, disruption, node lifecycle (taints by
 * condition only: no NoExecute taint-based eviction, no Lease or heartbeat: node conditions are
 * written once), PodGC (orphans only, after 1 s instead of the 40 s quarantine) and cluster
 * autoscaler (deployments never get pods, evicted pods are not replaced); HTTP/2, aggregated
 * discovery (the plain form is served, as by an older server); LIST "continue" is consistent only
 * while its RV is in the history window; a watch cache per resource (one global history window
 * instead).
 * Without --kubelet (the default) pods are bound to standin-node at creation and nothing runs
 * them: tests set status.podIP with PATCH .../status and Ready through the admin API. With it, the
 * deviations of the nodes: all are this machine (a Node deleted is never re-registered); the
 * scheduler filters on what tests/k8s/scheduler.py lists (pods, nvidia.com/gpu, not cpu/memory,
 * host ports or volumes), does not score (fewest pods, then the name; ScheduleAnyway spread only
 * breaks ties) and never preempts (the message says no victims were found); the autoscaler
 * (tests/k8s/autoscaler.py) has one node group, loops every 0.5 s, measures utilization by pods
 * (GPUs on GPU nodes), not cpu/memory, ignores local storage, has no delay after a scale-up before
 * a scale-down, gives up a drain at the first refused eviction (the real one retries for 2 min)
 * and honours Karpenter's do-not-disrupt; containers share the host's filesystem, users and PID
 * namespace (a process group stands for the container; securityContext is admitted but not
 * applied: runAsUser, readOnlyRootFilesystem, capabilities and seccomp change nothing, so
 * PodSecurity is checked at admission only), get no volumes but the service-account files (in
 * RL_K8S_SA_DIR instead of /var/run/secrets/kubernetes.io/serviceaccount), no cpu limits (a memory
 * limit is a poll of the group's anonymous resident memory every 100 ms, not a cgroup), a
 * per-pod dir as cwd and HOME (workingDir when set); images have no ENTRYPOINT/CMD unless --image
 * PATTERN=DIR=ENTRYPOINT (the mesh proxy's docker.io/istio/proxyv2 is built in); only the
 * kubernetes service's variables are injected (no other service links); RL_*, the sanitizers'
 * *_OPTIONS and --pass-env names pass from the stand-in; no probes (Ready = running), no init
 * containers but native sidecars (their startup order is start-then-next, without startupProbe;
 * their Events name spec.containers), no ephemeral containers, activeDeadlineSeconds or image
 * changes of a running pod, no termination-message file at a terminationMessagePath other than
 * the default (nothing is mounted: the file's host path is in RINGLEADER_TERMINATION_LOG); a missing Secret/ConfigMap is retried every 2 s (or the back-off,
 * if shorter); the crash back-off is not reset after a long run; back-offs scale with --backoff;
 * terminated.signal is not set (the real kubelet leaves it empty too); pod addresses come from a
 * 127.R.0.0/16 reserved per stand-in. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

/* ---- helpers ------------------------------------------------------------------------ */
typedef struct membuf {
    char *buf;
    size_t len;
    pthread_mutex_t mu;
    volatile int stop;
} membuf;

static size_t on_data(char *p, size_t sz, size_t nm, void *u) {
    membuf *m = u;
    size_t n = sz * nm;
    pthread_mutex_lock(&m->mu);
    char *b = realloc(m->buf, m->len + n + 1);
    if (b) {
        memcpy(b + m->len, p, n);
        m->buf = b;
        m->len += n;
        b[m->len] = '\0';
    }
    pthread_mutex_unlock(&m->mu);
    return b ? n : 0;
}

static int on_progress(void *u, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)a, (void)b, (void)c, (void)d;
    return ((membuf *)u)->stop ? 1 : 0;
}

static void mb_init(membuf *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->buf = calloc(1, 1);
}

static void mb_free(membuf *m) {
    free(m->buf);
    pthread_mutex_destroy(&m->mu);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void admin_token(const rl_test_standin *s, char *tok, size_t n) {
    FILE *f = fopen(s->token_file, "r");
    cr_assert(f != NULL);
    size_t got = fread(tok, 1, n - 1, f);
    fclose(f);
    tok[got] = '\0';
}

/* One API request. tok: NULL = the admin token, "" = no Authorization header.
 * Returns the HTTP status (0 when no response: *curl_rc tells why). */
typedef struct reqopt {
    const char *tok, *ctype, *accept;
    char *hdrs; /* response headers, if wanted */
    size_t hdrs_n;
    int *curl_rc;
    long timeout_s;
} reqopt;

static size_t on_hdr(char *p, size_t sz, size_t nm, void *u) {
    reqopt *o = u;
    size_t n = sz * nm, have = strlen(o->hdrs);
    if (have + n + 1 < o->hdrs_n) {
        memcpy(o->hdrs + have, p, n);
        o->hdrs[have + n] = '\0';
    }
    return n;
}

static long api_opt(const rl_test_standin *s, const char *method, const char *path, const char *body,
                    membuf *out, reqopt o) {
    CURL *c = curl_easy_init();
    cr_assert(c != NULL);
    char url[1024], auth[512], tok[256];
    snprintf(url, sizeof url, "https://%s:%d%s", s->host, s->port, path);
    struct curl_slist *h = NULL;
    if (!o.tok) {
        admin_token(s, tok, sizeof tok);
        o.tok = tok;
    }
    if (o.tok[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.tok);
        h = curl_slist_append(h, auth);
    }
    char ct[256], ac[256];
    snprintf(ct, sizeof ct, "Content-Type: %s", o.ctype ? o.ctype : "application/json");
    h = curl_slist_append(h, ct);
    if (o.accept) {
        snprintf(ac, sizeof ac, "Accept: %s", o.accept);
        h = curl_slist_append(h, ac);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CAINFO, s->ca_file);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, o.timeout_s ? o.timeout_s : 15L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, out);
    if (o.hdrs) {
        o.hdrs[0] = '\0';
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_hdr);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &o);
    }
    CURLcode rc = curl_easy_perform(c);
    if (o.curl_rc) *o.curl_rc = (int)rc;
    long code = 0;
    if (rc == CURLE_OK || rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_PARTIAL_FILE ||
        rc == CURLE_RECV_ERROR || rc == CURLE_OPERATION_TIMEDOUT)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return code;
}

/* Plain request: returns the status, the body parsed as JSON into *j (may be NULL). */
static long api(const rl_test_standin *s, const char *method, const char *path, const char *ctype,
                const char *body, cJSON **j) {
    membuf m;
    mb_init(&m);
    long code = api_opt(s, method, path, body, &m, (reqopt){.ctype = ctype});
    if (j) {
        *j = cJSON_Parse(m.buf);
        cr_assert(*j != NULL, "%s %s -> %ld, not JSON: %.300s", method, path, code, m.buf);
    }
    mb_free(&m);
    return code;
}

static const char *jstr(const cJSON *j, const char *dotted) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", dotted);
    const cJSON *cur = j;
    for (char *save = NULL, *t = strtok_r(buf, ".", &save); t && cur; t = strtok_r(NULL, ".", &save))
        cur = cJSON_GetObjectItemCaseSensitive(cur, t);
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static double jnum(const cJSON *j, const char *dotted) {
    const cJSON *v = rl_test_json_path(j, dotted);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const cJSON *jget(const cJSON *j, const char *dotted) { return rl_test_json_path(j, dotted); }

static void assert_status(const cJSON *j, int code, const char *reason) {
    cr_assert_str_eq(jstr(j, "kind"), "Status");
    cr_assert_str_eq(jstr(j, "status"), "Failure");
    cr_assert_eq((int)jnum(j, "code"), code);
    cr_assert_str_eq(jstr(j, "reason"), reason);
    cr_assert(jstr(j, "message") && *jstr(j, "message"));
}

static long long rv_of(const cJSON *j) {
    const char *rv = jstr(j, "metadata.resourceVersion");
    cr_assert(rv != NULL);
    return atoll(rv);
}

/* A watch on its own thread, collecting the stream until stopped or ended. */
typedef struct watcher {
    const rl_test_standin *s;
    char path[768];
    membuf m;
    long code;
    int curl_rc;
    pthread_t th;
    volatile int done;
} watcher;

static void *watch_main(void *u) {
    watcher *w = u;
    w->code = api_opt(w->s, "GET", w->path, NULL, &w->m, (reqopt){.curl_rc = &w->curl_rc, .timeout_s = 30});
    w->done = 1;
    return NULL;
}

static void watch_start(watcher *w, const rl_test_standin *s, const char *path) {
    memset(w, 0, sizeof *w);
    w->s = s;
    snprintf(w->path, sizeof w->path, "%s", path);
    mb_init(&w->m);
    cr_assert_eq(pthread_create(&w->th, NULL, watch_main, w), 0);
}

/* Await a substring in the stream (bounded). */
static int watch_await(watcher *w, const char *needle, double secs) {
    double end = now_s() + secs;
    while (now_s() < end) {
        pthread_mutex_lock(&w->m.mu);
        int hit = strstr(w->m.buf, needle) != NULL;
        pthread_mutex_unlock(&w->m.mu);
        if (hit) return 1;
        if (w->done) return 0;
        usleep(10000);
    }
    return 0;
}

static void watch_stop(watcher *w) {
    w->m.stop = 1;
    pthread_join(w->th, NULL);
}

/* The event lines of a stream: types into types[i] ("ADDED", ...), object names into names[i]. */
static int events(const char *stream, char types[][16], char names[][64], int max) {
    int n = 0;
    const char *p = stream;
    while (*p && n < max) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        cJSON *e = cJSON_Parse(line);
        free(line);
        cr_assert(e != NULL, "watch line is not JSON: %.200s", p);
        snprintf(types[n], 16, "%s", jstr(e, "type") ? jstr(e, "type") : "?");
        const char *nm = jstr(e, "object.metadata.name");
        snprintf(names[n], 64, "%s", nm ? nm : "");
        cJSON_Delete(e);
        n++;
        if (!nl) break;
        p = nl + 1;
    }
    return n;
}

/* The server of the running test, stopped by the suite's fini even when an
 * assertion ends the test early (no stray process or temp dir). */
static rl_test_standin *g_live;

static void start(rl_test_standin *s, const char *args) {
    cr_assert_eq(rl_test_standin_start(s, args), 0, "the stand-in did not start");
    g_live = s;
}

/* The "image" of the kubelet tests: a temp dir with a script, put first on
 * the containers' PATH by --image busybox:*=DIR. */
static char g_img[64];

static void fini(void) {
    if (g_live && g_live->pid > 0) rl_test_standin_stop(g_live);
    g_live = NULL;
    if (g_img[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_img);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_img);
        g_img[0] = '\0';
    }
}

static void kubectl_ok(rl_test_standin *s, const char *args, const char *in, char *out, size_t n) {
    int rc = rl_test_kubectl(s, args, in, out, n);
    cr_assert_eq(rc, 0, "kubectl %s -> %d: %s", args, rc, out);
}

/* Poll a GET until its status is `want` (bounded). */
static int await_code(rl_test_standin *s, const char *path, long want, double secs) {
    double end = now_s() + secs;
    while (now_s() < end) {
        if (api(s, "GET", path, NULL, NULL, NULL) == want) return 1;
        usleep(20000);
    }
    return 0;
}

static void init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

TestSuite(standin, .init = init, .fini = fini);

/* ---- the contract ----------------------------------------------------------------------- */
Test(standin, contract_files_and_kubectl, .timeout = 60) {
    static rl_test_standin s;
    start(&s, NULL);
    struct stat sb;
    cr_assert_eq(stat(s.token_file, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0600, "the token file must be 0600");
    cr_assert_eq(access(s.ca_file, R_OK), 0);
    char out[8192], want[512];
    FILE *f = fopen(s.kubeconfig, "r");
    cr_assert(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    fclose(f);
    out[got] = '\0';
    snprintf(want, sizeof want, "certificate-authority: %s", s.ca_file);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(want, sizeof want, "server: https://127.0.0.1:%d", s.port);
    cr_assert(strstr(out, want), "%s", out);
    cr_assert(strstr(out, "namespace: default") && strstr(out, "current-context:"));
    kubectl_ok(&s, "get ns default -o name", NULL, out, sizeof out);
    cr_assert_str_eq(out, "namespace/default\n");
    kubectl_ok(&s, "config view --minify -o jsonpath='{.contexts[0].context.namespace}'", NULL, out,
               sizeof out);
    cr_assert_str_eq(out, "default");
    /* The token never reaches the log. */
    char tok[256], logp[400];
    admin_token(&s, tok, sizeof tok);
    snprintf(logp, sizeof logp, "%s/standin.log", s.dir);
    f = fopen(logp, "r");
    cr_assert(f);
    static char logbuf[1 << 16];
    got = fread(logbuf, 1, sizeof logbuf - 1, f);
    fclose(f);
    logbuf[got] = '\0';
    cr_assert(strstr(logbuf, "\"code\": 200"), "requests are logged");
    cr_assert_null(strstr(logbuf, tok), "the token leaked into the log");
    char dir[256];
    snprintf(dir, sizeof dir, "%s", s.dir);
    int pid = s.pid;
    rl_test_standin_stop(&s);
    cr_assert_neq(kill(pid, 0), 0, "the server outlived stop");
    cr_assert_neq(access(dir, F_OK), 0, "the temp dir outlived stop");
}

static const char *MANIFESTS =
    "apiVersion: v1\nkind: Service\nmetadata: {name: job, labels: {app: job}}\n"
    "spec:\n  clusterIP: None\n  publishNotReadyAddresses: true\n  selector: {app: job}\n"
    "  ports: [{name: rdzv, port: 29400}]\n"
    "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p0, labels: {app: job}}\n"
    "spec:\n  containers: [{name: c, image: busybox:1.36, command: [sleep, '1000']}]\n"
    "---\napiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: lead}\n"
    "spec: {holderIdentity: a, leaseDurationSeconds: 15}\n"
    "---\napiVersion: v1\nkind: Secret\nmetadata: {name: rdzv-secret}\nstringData: {secret: hunter2}\n"
    "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
    "metadata: {name: trainingjobs.ringleader.dev}\n"
    "spec:\n  group: ringleader.dev\n  scope: Namespaced\n"
    "  names: {plural: trainingjobs, singular: trainingjob, kind: TrainingJob, shortNames: [tj]}\n"
    "  versions:\n  - name: v1\n    served: true\n    storage: true\n"
    "    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n"
    "    subresources:\n      status: {}\n"
    "      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, "
    "labelSelectorPath: .status.selector}\n"
    "    additionalPrinterColumns:\n"
    "    - {name: Replicas, type: integer, jsonPath: .spec.replicas}\n"
    "    - {name: Phase, type: string, jsonPath: .status.phase}\n"
    "    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}\n";

static const char *TJ = "apiVersion: ringleader.dev/v1\nkind: TrainingJob\nmetadata: {name: tj1}\n"
                        "spec: {replicas: 2, image: img-a}\n";
static const char *TJ2 = "apiVersion: ringleader.dev/v1\nkind: TrainingJob\nmetadata: {name: tj1}\n"
                         "spec: {replicas: 2, image: img-b}\n";

/* ---- kubectl end to end ----------------------------------------------------------------- */
Test(standin, kubectl_apply_get_scale_delete, .timeout = 90) {
    static rl_test_standin s;
    start(&s, NULL);
    static char out[65536];
    kubectl_ok(&s, "apply -f -", MANIFESTS, out, sizeof out);
    cr_assert(strstr(out, "service/job created") && strstr(out, "pod/p0 created") &&
                  strstr(out, "lease.coordination.k8s.io/lead created") &&
                  strstr(out, "secret/rdzv-secret created") &&
                  strstr(out, "customresourcedefinition.apiextensions.k8s.io/trainingjobs.ringleader.dev created"),
              "%s", out);
    kubectl_ok(&s, "apply -f -", TJ, out, sizeof out);
    cr_assert(strstr(out, "trainingjob.ringleader.dev/tj1 created"), "%s", out);

    /* get -o json shows what was applied, with server-set metadata */
    kubectl_ok(&s, "get lease lead -o json", NULL, out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_str_eq(jstr(j, "spec.holderIdentity"), "a");
    cr_assert(jstr(j, "metadata.uid") && jstr(j, "metadata.creationTimestamp") &&
              jstr(j, "metadata.resourceVersion"));
    cJSON_Delete(j);
    kubectl_ok(&s, "get secret rdzv-secret -o jsonpath={.data.secret}", NULL, out, sizeof out);
    cr_assert_str_eq(out, "aHVudGVyMg==", "stringData becomes base64 data");
    kubectl_ok(&s, "get tj tj1 -o json", NULL, out, sizeof out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_str_eq(jstr(j, "spec.image"), "img-a");
    cr_assert_eq((int)jnum(j, "metadata.generation"), 1);
    cJSON_Delete(j);

    /* client-side apply of a change: a merge patch for the CR -> generation 2 */
    kubectl_ok(&s, "apply -f -", TJ2, out, sizeof out);
    cr_assert(strstr(out, "trainingjob.ringleader.dev/tj1 configured"), "%s", out);
    kubectl_ok(&s, "get trainingjob tj1 -o jsonpath={.metadata.generation}/{.spec.image}", NULL, out,
               sizeof out);
    cr_assert_str_eq(out, "2/img-b");
    /* ... and a strategic merge patch for a built-in (the Lease) */
    kubectl_ok(&s, "apply -f -",
               "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: lead}\n"
               "spec: {holderIdentity: b, leaseDurationSeconds: 15}\n",
               out, sizeof out);
    cr_assert(strstr(out, "configured"), "%s", out);
    kubectl_ok(&s, "get leases.coordination.k8s.io lead -o jsonpath={.spec.holderIdentity}", NULL, out,
               sizeof out);
    cr_assert_str_eq(out, "b");
    /* applying the same again changes nothing: "unchanged" */
    kubectl_ok(&s, "apply -f -", TJ2, out, sizeof out);
    cr_assert(strstr(out, "unchanged"), "%s", out);

    /* printer columns through the Table form, by short name */
    kubectl_ok(&s, "get tj", NULL, out, sizeof out);
    cr_assert(strstr(out, "NAME") && strstr(out, "REPLICAS") && strstr(out, "PHASE") && strstr(out, "AGE"),
              "%s", out);
    cr_assert(strstr(out, "tj1") && strstr(out, " 2 "), "%s", out);
    kubectl_ok(&s, "get svc,po,lease -o name", NULL, out, sizeof out);
    cr_assert(strstr(out, "service/job") && strstr(out, "pod/p0") &&
                  strstr(out, "lease.coordination.k8s.io/lead"),
              "%s", out);

    /* kubectl scale through the /scale subresource */
    kubectl_ok(&s, "scale tj tj1 --replicas=5", NULL, out, sizeof out);
    cr_assert(strstr(out, "scaled"), "%s", out);
    kubectl_ok(&s, "get tj tj1 -o jsonpath={.spec.replicas}/{.metadata.generation}", NULL, out, sizeof out);
    cr_assert_str_eq(out, "5/3");

    /* delete cascades to an object the CR owns */
    kubectl_ok(&s, "get tj tj1 -o jsonpath={.metadata.uid}", NULL, out, sizeof out);
    char cm[1024], uid[64];
    snprintf(uid, sizeof uid, "%.63s", out);
    snprintf(cm, sizeof cm,
             "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  ownerReferences:\n"
             "  - {apiVersion: ringleader.dev/v1, kind: TrainingJob, name: tj1, uid: %s}\n"
             "data: {a: b}\n",
             uid);
    kubectl_ok(&s, "apply -f -", cm, out, sizeof out);
    kubectl_ok(&s, "delete tj tj1", NULL, out, sizeof out);
    cr_assert(strstr(out, "trainingjob.ringleader.dev \"tj1\" deleted"), "%s", out);
    cr_assert(await_code(&s, "/api/v1/namespaces/default/configmaps/owned", 404, 5.0),
              "the owned ConfigMap was not garbage-collected");
    int rc = rl_test_kubectl(&s, "get tj tj1", NULL, out, sizeof out);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(out, "NotFound") || strstr(out, "not found"), "%s", out);
    /* pods: graceful delete, kubectl waits until it is gone */
    kubectl_ok(&s, "delete pod p0 --grace-period=1", NULL, out, sizeof out);
    cr_assert(strstr(out, "pod \"p0\" deleted"), "%s", out);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/p0", NULL, NULL, NULL), 404);

    /* deleting the CRD stops serving its resource */
    kubectl_ok(&s, "delete crd trainingjobs.ringleader.dev", NULL, out, sizeof out);
    cr_assert(await_code(&s, "/apis/ringleader.dev/v1/namespaces/default/trainingjobs", 404, 5.0));
    rc = rl_test_kubectl(&s, "get tj", NULL, out, sizeof out);
    cr_assert_neq(rc, 0, "%s", out);
    rl_test_standin_stop(&s);
}

Test(standin, discovery_lists, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    cr_assert_eq(api(&s, "GET", "/api", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "kind"), "APIVersions");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "kind"), "APIGroupList");
    char *txt = cJSON_PrintUnformatted(j);
    cr_assert(strstr(txt, "\"coordination.k8s.io\"") && strstr(txt, "\"discovery.k8s.io\"") &&
              strstr(txt, "\"apiextensions.k8s.io\""));
    free(txt);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis/coordination.k8s.io", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "preferredVersion.groupVersion"), "coordination.k8s.io/v1");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "kind"), "APIResourceList");
    int pods = 0, pod_status = 0, ns_cluster = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "resources")) {
        const char *n = jstr(r, "name");
        if (!strcmp(n, "pods")) {
            const cJSON *sn = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "shortNames"), 0);
            pods = cJSON_IsTrue(cJSON_GetObjectItem(r, "namespaced")) && !strcmp(jstr(r, "kind"), "Pod") &&
                   !strcmp(jstr(r, "singularName"), "pod") && cJSON_IsString(sn) &&
                   !strcmp(sn->valuestring, "po");
        }
        if (!strcmp(n, "pods/status")) pod_status = 1;
        if (!strcmp(n, "namespaces")) ns_cluster = cJSON_IsFalse(cJSON_GetObjectItem(r, "namespaced"));
    }
    cr_assert(pods && pod_status && ns_cluster);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis/apps/v1", NULL, NULL, &j), 200);
    txt = cJSON_PrintUnformatted(j);
    cr_assert(strstr(txt, "\"deployments/scale\"") && strstr(txt, "\"autoscaling\""), "%s", txt);
    free(txt);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis/nope.example/v1", NULL, NULL, &j), 404);
    assert_status(j, 404, "NotFound");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/version", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "major"), "1");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* ---- wire-level errors ------------------------------------------------------------------ */
#define LEASES "/apis/coordination.k8s.io/v1/namespaces/default/leases"
/* a CRD version's schema that keeps whatever it is given */
#define PRESERVE "\"schema\":{\"openAPIV3Schema\":{\"type\":\"object\",\"x-kubernetes-preserve-unknown-fields\":true}}"

Test(standin, http_errors_are_status_bodies, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    membuf m;
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", "/api/v1/namespaces/default/pods", NULL, &m, (reqopt){.tok = ""}), 401);
    cJSON *j = cJSON_Parse(m.buf);
    assert_status(j, 401, "Unauthorized");
    cJSON_Delete(j);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", "/api/v1/namespaces/default/pods", NULL, &m, (reqopt){.tok = "nope"}),
                 401);
    mb_free(&m);

    const char *lease = "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\","
                        "\"metadata\":{\"name\":\"x\"},\"spec\":{\"holderIdentity\":\"a\"}}";
    cr_assert_eq(api(&s, "POST", LEASES, NULL, lease, &j), 201);
    long long rv1 = rv_of(j);
    char stale[512];
    snprintf(stale, sizeof stale,
             "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":\"x\","
             "\"resourceVersion\":\"%lld\"},\"spec\":{\"holderIdentity\":\"b\"}}",
             rv1);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL, lease, &j), 409);
    assert_status(j, 409, "AlreadyExists");
    cr_assert_str_eq(jstr(j, "message"), "leases.coordination.k8s.io \"x\" already exists");
    cJSON_Delete(j);
    /* the first PUT with the current RV wins and bumps the RV; the same body again is stale */
    cr_assert_eq(api(&s, "PUT", LEASES "/x", NULL, stale, &j), 200);
    cr_assert_gt(rv_of(j), rv1, "resourceVersion must increase on every write");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PUT", LEASES "/x", NULL, stale, &j), 409);
    assert_status(j, 409, "Conflict");
    cr_assert_str_eq(jstr(j, "message"),
                     "Operation cannot be fulfilled on leases.coordination.k8s.io \"x\": the object has "
                     "been modified; please apply your changes to the latest version and try again");
    cr_assert_str_eq(jstr(j, "details.name"), "x");
    cr_assert_str_eq(jstr(j, "details.group"), "coordination.k8s.io");
    cr_assert_str_eq(jstr(j, "details.kind"), "leases");
    cJSON_Delete(j);
    /* a merge patch carrying a stale RV is a conflict too */
    snprintf(stale, sizeof stale, "{\"metadata\":{\"resourceVersion\":\"%lld\"},\"spec\":{\"holderIdentity\":\"c\"}}",
             rv1);
    cr_assert_eq(api(&s, "PATCH", LEASES "/x", "application/merge-patch+json", stale, &j), 409);
    cJSON_Delete(j);
    /* resourceVersion is one global counter: a write elsewhere moves it too */
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/configmaps", NULL,
                     "{\"metadata\":{\"name\":\"c1\"},\"data\":{}}", &j),
                 201);
    long long rv_cm = rv_of(j);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", LEASES "/x", NULL, NULL, &j), 200);
    cr_assert_gt(rv_cm, rv_of(j));
    cJSON_Delete(j);

    cr_assert_eq(api(&s, "GET", LEASES "/nope", NULL, NULL, &j), 404);
    assert_status(j, 404, "NotFound");
    cr_assert_str_eq(jstr(j, "message"), "leases.coordination.k8s.io \"nope\" not found");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/nope/pods/x", NULL, NULL, &j), 404);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/nope/configmaps", NULL,
                     "{\"metadata\":{\"name\":\"c\"}}", &j),
                 404);
    cr_assert_str_eq(jstr(j, "message"), "namespaces \"nope\" not found");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL,
                     "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":"
                     "{\"name\":\"y\",\"namespace\":\"other\"}}",
                     &j),
                 400);
    assert_status(j, 400, "BadRequest");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"y\"}}",
                     &j),
                 400);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PUT", LEASES "/x", NULL,
                     "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":\"z\"}}", &j),
                 400);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{}}", &j), 422);
    assert_status(j, 422, "Invalid");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{not json", &j), 400);
    cJSON_Delete(j);
    /* Lease fields are typed as by the real decoder: MicroTime has exactly 6 fractional digits */
    cr_assert_eq(api(&s, "POST", LEASES, NULL,
                     "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"renewTime\":\"2024-01-01T00:00:00Z\"}}", &j),
                 400);
    assert_status(j, 400, "BadRequest");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL,
                     "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"leaseDurationSeconds\":1.5}}", &j),
                 400);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL,
                     "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"leaseDurationSeconds\":0}}", &j),
                 422);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL,
                     "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"holderIdentity\":\"h\",\"leaseDurationSeconds\":15,"
                     "\"acquireTime\":\"2024-01-01T00:00:00.000000Z\",\"renewTime\":\"2024-01-01T02:00:01.123456+02:00\"}}",
                     &j),
                 201);
    cr_assert_str_eq(jstr(j, "spec.renewTime"), "2024-01-01T00:00:01.123456Z", "MicroTime is written back in UTC");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", LEASES "/t1", "application/merge-patch+json",
                     "{\"spec\":{\"renewTime\":\"2024-01-01T00:00:02.5Z\"}}", &j),
                 400);
    cJSON_Delete(j);
    /* generateName */
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{\"generateName\":\"gen-\"}}", &j), 201);
    cr_assert(strncmp(jstr(j, "metadata.name"), "gen-", 4) == 0 && strlen(jstr(j, "metadata.name")) == 9);
    cJSON_Delete(j);

    /* strategic merge patch: fine for a built-in, 415 for a custom resource */
    cr_assert_eq(api(&s, "PATCH", LEASES "/x", "application/strategic-merge-patch+json",
                     "{\"spec\":{\"holderIdentity\":\"smp\"}}", &j),
                 200);
    cr_assert_str_eq(jstr(j, "spec.holderIdentity"), "smp");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", NULL,
                     "{\"metadata\":{\"name\":\"foos.ex.io\"},\"spec\":{\"group\":\"ex.io\",\"scope\":"
                     "\"Namespaced\",\"names\":{\"plural\":\"foos\",\"kind\":\"Foo\"},\"versions\":[{\"name\":"
                     "\"v1\",\"served\":true,\"storage\":true," PRESERVE "}]}}",
                     &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", "/apis/ex.io/v1/namespaces/default/foos", NULL,
                     "{\"apiVersion\":\"ex.io/v1\",\"kind\":\"Foo\",\"metadata\":{\"name\":\"f\"},\"spec\":{\"a\":1}}",
                     &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/apis/ex.io/v1/namespaces/default/foos/f",
                     "application/strategic-merge-patch+json", "{\"spec\":{\"a\":2}}", &j),
                 415);
    assert_status(j, 415, "UnsupportedMediaType");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/apis/ex.io/v1/namespaces/default/foos/f", "application/json-patch+json",
                     "[{\"op\":\"replace\",\"path\":\"/spec/a\",\"value\":3}]", &j),
                 200);
    cr_assert_eq((int)jnum(j, "spec.a"), 3);
    cr_assert_eq((int)jnum(j, "metadata.generation"), 2);
    cJSON_Delete(j);
    /* a CR PUT without resourceVersion is refused, as the real server does */
    cr_assert_eq(api(&s, "PUT", "/apis/ex.io/v1/namespaces/default/foos/f", NULL,
                     "{\"apiVersion\":\"ex.io/v1\",\"kind\":\"Foo\",\"metadata\":{\"name\":\"f\"},\"spec\":{}}", &j),
                 422);
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

Test(standin, status_and_scale_subresources, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    cr_assert_eq(api(&s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", NULL,
                     "{\"metadata\":{\"name\":\"tjs.ex.io\"},\"spec\":{\"group\":\"ex.io\",\"scope\":"
                     "\"Namespaced\",\"names\":{\"plural\":\"tjs\",\"kind\":\"TJ\"},\"versions\":[{\"name\":"
                     "\"v1\",\"served\":true,\"storage\":true," PRESERVE ",\"subresources\":{\"status\":{},\"scale\":{"
                     "\"specReplicasPath\":\".spec.replicas\",\"statusReplicasPath\":\".status.replicas\","
                     "\"labelSelectorPath\":\".status.selector\"}}}]}}",
                     &j),
                 201);
    cJSON_Delete(j);
    const char *base = "/apis/ex.io/v1/namespaces/default/tjs";
    cr_assert_eq(api(&s, "POST", base, NULL,
                     "{\"apiVersion\":\"ex.io/v1\",\"kind\":\"TJ\",\"metadata\":{\"name\":\"t\"},"
                     "\"spec\":{\"replicas\":2},\"status\":{\"phase\":\"ignored\"}}",
                     &j),
                 201);
    cr_assert_null(jget(j, "status"), "status is dropped on create when /status exists");
    cr_assert_eq((int)jnum(j, "metadata.generation"), 1);
    cJSON_Delete(j);
    /* the main resource ignores status */
    cr_assert_eq(api(&s, "PATCH", "/apis/ex.io/v1/namespaces/default/tjs/t", "application/merge-patch+json",
                     "{\"status\":{\"phase\":\"Running\"}}", &j),
                 200);
    cr_assert_null(jget(j, "status"));
    cJSON_Delete(j);
    /* /status changes status only, without a generation bump */
    cr_assert_eq(api(&s, "PATCH", "/apis/ex.io/v1/namespaces/default/tjs/t/status",
                     "application/merge-patch+json",
                     "{\"spec\":{\"replicas\":9},\"status\":{\"phase\":\"Running\",\"replicas\":2,"
                     "\"selector\":\"job=t\"}}",
                     &j),
                 200);
    cr_assert_str_eq(jstr(j, "status.phase"), "Running");
    cr_assert_eq((int)jnum(j, "spec.replicas"), 2);
    cr_assert_eq((int)jnum(j, "metadata.generation"), 1);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis/ex.io/v1/namespaces/default/tjs/t/scale", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "kind"), "Scale");
    cr_assert_str_eq(jstr(j, "apiVersion"), "autoscaling/v1");
    cr_assert_eq((int)jnum(j, "spec.replicas"), 2);
    cr_assert_eq((int)jnum(j, "status.replicas"), 2);
    cr_assert_str_eq(jstr(j, "status.selector"), "job=t");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PUT", "/apis/ex.io/v1/namespaces/default/tjs/t/scale", NULL,
                     "{\"kind\":\"Scale\",\"apiVersion\":\"autoscaling/v1\",\"metadata\":{\"name\":\"t\"},"
                     "\"spec\":{\"replicas\":4}}",
                     &j),
                 200);
    cr_assert_eq((int)jnum(j, "spec.replicas"), 4);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/apis/ex.io/v1/namespaces/default/tjs/t", NULL, NULL, &j), 200);
    cr_assert_eq((int)jnum(j, "spec.replicas"), 4);
    cr_assert_eq((int)jnum(j, "metadata.generation"), 2);
    cJSON_Delete(j);
    /* pods: /status sets podIP and conditions; main updates keep them */
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/pods", NULL,
                     "{\"metadata\":{\"name\":\"p\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}", &j),
                 201);
    cr_assert_str_eq(jstr(j, "status.phase"), "Pending");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/pods/p/status", "application/merge-patch+json",
                     "{\"status\":{\"podIP\":\"127.0.0.9\",\"phase\":\"Running\"}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/pods/p", "application/strategic-merge-patch+json",
                     "{\"metadata\":{\"labels\":{\"a\":\"b\"}},\"status\":{\"podIP\":\"1.2.3.4\"}}", &j),
                 200);
    cr_assert_str_eq(jstr(j, "status.podIP"), "127.0.0.9");
    cr_assert_str_eq(jstr(j, "metadata.labels.a"), "b");
    cJSON_Delete(j);
    /* pod specs are immutable except images (and a few more), as in the real registry */
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/pods/p", "application/strategic-merge-patch+json",
                     "{\"spec\":{\"containers\":[{\"name\":\"c\",\"command\":[\"x\"]}]}}", &j),
                 422);
    assert_status(j, 422, "Invalid");
    cr_assert(strstr(jstr(j, "message"), "pod updates may not change fields other than"));
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/pods/p", "application/strategic-merge-patch+json",
                     "{\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i2\"}]}}", &j),
                 200);
    cr_assert_str_eq(jstr(cJSON_GetArrayItem(jget(j, "spec.containers"), 0), "image"), "i2");
    cJSON_Delete(j);
    /* deployments: Scale with the selector from spec.selector */
    cr_assert_eq(api(&s, "POST", "/apis/apps/v1/namespaces/default/deployments", NULL,
                     "{\"metadata\":{\"name\":\"d\"},\"spec\":{\"replicas\":1,\"selector\":{\"matchLabels\":"
                     "{\"app\":\"d\"}},\"template\":{\"metadata\":{\"labels\":{\"app\":\"d\"}},\"spec\":{"
                     "\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}}}",
                     &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/apis/apps/v1/namespaces/default/deployments/d/scale",
                     "application/merge-patch+json", "{\"spec\":{\"replicas\":3}}", &j),
                 200);
    cr_assert_eq((int)jnum(j, "spec.replicas"), 3);
    cr_assert_str_eq(jstr(j, "status.selector"), "app=d");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

Test(standin, delete_finalizers_preconditions, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    const char *cms = "/api/v1/namespaces/default/configmaps";
    cr_assert_eq(api(&s, "POST", cms, NULL,
                     "{\"metadata\":{\"name\":\"f\",\"finalizers\":[\"ex.io/hold\"]},\"data\":{}}", &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/configmaps/f", NULL,
                     "{\"preconditions\":{\"uid\":\"00000000-0000-0000-0000-000000000000\"}}", &j),
                 409);
    assert_status(j, 409, "Conflict");
    cr_assert(strstr(jstr(j, "message"), "Precondition failed: UID in precondition"));
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/configmaps/f", NULL,
                     "{\"propagationPolicy\":\"Foreground\"}", &j),
                 200);
    cr_assert(jstr(j, "metadata.deletionTimestamp"), "a pending delete answers with the object");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/configmaps/f", NULL, NULL, &j), 200);
    cr_assert(jstr(j, "metadata.deletionTimestamp"), "a finalizer keeps the object, marked");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/configmaps/f", "application/merge-patch+json",
                     "{\"metadata\":{\"finalizers\":null}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/configmaps/f", NULL, NULL, &j), 404);
    cJSON_Delete(j);
    /* an immediate delete answers with a Status Success naming the object */
    cr_assert_eq(api(&s, "POST", cms, NULL, "{\"metadata\":{\"name\":\"g\"}}", &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/configmaps/g", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "kind"), "Status");
    cr_assert_str_eq(jstr(j, "status"), "Success");
    cr_assert_str_eq(jstr(j, "details.name"), "g");
    cr_assert_str_eq(jstr(j, "details.kind"), "configmaps");
    cJSON_Delete(j);
    /* gracePeriodSeconds=0 deletes a pod at once; a plain delete leaves it terminating */
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/pods", NULL,
                     "{\"metadata\":{\"name\":\"p\"},\"spec\":{\"terminationGracePeriodSeconds\":20,"
                     "\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}",
                     &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/p", NULL, NULL, &j), 200);
    cr_assert(jstr(j, "metadata.deletionTimestamp"));
    cr_assert_eq((int)jnum(j, "metadata.deletionGracePeriodSeconds"), 20);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/p", NULL, NULL, NULL), 200);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/p", NULL, "{\"gracePeriodSeconds\":0}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/p", NULL, NULL, NULL), 404);
    rl_test_standin_stop(&s);
}

/* ---- list ------------------------------------------------------------------------------- */
static int list_names(rl_test_standin *s, const char *path, char *names, size_t n, cJSON **keep) {
    cJSON *j;
    long code = api(s, "GET", path, NULL, NULL, &j);
    names[0] = '\0';
    if (code != 200) {
        cJSON_Delete(j);
        return (int)code;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "items")) {
        strncat(names, jstr(it, "metadata.name"), n - strlen(names) - 2);
        strncat(names, " ", n - strlen(names) - 1);
    }
    if (keep)
        *keep = j;
    else
        cJSON_Delete(j);
    return 200;
}

Test(standin, list_selectors_and_paging, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    const char *labels[] = {"{\"app\":\"a\",\"tier\":\"x\"}", "{\"app\":\"b\",\"tier\":\"y\"}",
                            "{\"app\":\"a\"}", "{\"app\":\"c\",\"tier\":\"x\"}", "{}"};
    cJSON *j;
    for (int i = 0; i < 5; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"metadata\":{\"name\":\"cm%d\",\"labels\":%s},\"data\":{}}", i, labels[i]);
        cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/configmaps", NULL, body, &j), 201);
        cJSON_Delete(j);
    }
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces", NULL, "{\"metadata\":{\"name\":\"other\"}}", &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/other/configmaps", NULL,
                     "{\"metadata\":{\"name\":\"cmo\",\"labels\":{\"app\":\"a\"}}}", &j),
                 201);
    cJSON_Delete(j);
    char names[512];
    struct {
        const char *q, *want;
    } cases[] = {
        {"app=a", "cm0 cm2 "},
        {"app%3D%3Da", "cm0 cm2 "},
        {"app!%3Da", "cm1 cm3 cm4 "},
        {"app%20in%20(a,c)", "cm0 cm2 cm3 "},
        {"app%20notin%20(a,c)", "cm1 cm4 "},
        {"tier", "cm0 cm1 cm3 "},
        {"!tier", "cm2 cm4 "},
        {"app=a,tier=x", "cm0 "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "/api/v1/namespaces/default/configmaps?labelSelector=%s", cases[i].q);
        cr_assert_eq(list_names(&s, path, names, sizeof names, NULL), 200, "%s", path);
        cr_assert_str_eq(names, cases[i].want, "selector %s", cases[i].q);
    }
    cr_assert_eq(list_names(&s, "/api/v1/configmaps?labelSelector=app=a", names, sizeof names, NULL), 200);
    cr_assert_str_eq(names, "cm0 cm2 cmo ", "an all-namespaces list");
    cr_assert_eq(list_names(&s, "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dcm3", names,
                            sizeof names, NULL),
                 200);
    cr_assert_str_eq(names, "cm3 ");
    cr_assert_eq(list_names(&s, "/api/v1/namespaces/default/configmaps?fieldSelector=data.x%3Dy", names,
                            sizeof names, NULL),
                 400);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20b", NULL, NULL, &j),
                 400);
    cJSON_Delete(j);
    /* limit + continue: pages of 2 cover everything once, at the list's resourceVersion */
    cJSON *page;
    cr_assert_eq(list_names(&s, "/api/v1/namespaces/default/configmaps?limit=2", names, sizeof names, &page), 200);
    cr_assert_str_eq(names, "cm0 cm1 ");
    cr_assert_eq((int)jnum(page, "metadata.remainingItemCount"), 3);
    const char *rv = jstr(page, "metadata.resourceVersion");
    cr_assert(rv && atoll(rv) > 0);
    char all[512] = "cm0 cm1 ";
    for (int guard = 0; guard < 5 && jstr(page, "metadata.continue"); guard++) {
        char path[1024], *esc = curl_easy_escape(NULL, jstr(page, "metadata.continue"), 0);
        snprintf(path, sizeof path, "/api/v1/namespaces/default/configmaps?limit=2&continue=%s", esc);
        curl_free(esc);
        cJSON_Delete(page);
        cr_assert_eq(list_names(&s, path, names, sizeof names, &page), 200);
        strncat(all, names, sizeof all - strlen(all) - 1);
    }
    cr_assert_null(jstr(page, "metadata.continue"));
    cJSON_Delete(page);
    cr_assert_str_eq(all, "cm0 cm1 cm2 cm3 cm4 ");
    rl_test_standin_stop(&s);
}

/* ---- watch ------------------------------------------------------------------------------ */
#define CMS "/api/v1/namespaces/default/configmaps"

Test(standin, watch_live_in_order, .timeout = 40) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"pre\",\"labels\":{\"w\":\"1\"}}}", &j), 201);
    cJSON_Delete(j);
    watcher w;
    watch_start(&w, &s, CMS "?watch=true&labelSelector=w%3D1");
    cr_assert(watch_await(&w, "\"pre\"", 10), "no synthetic ADDED for the existing object");
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"c\",\"labels\":{\"w\":\"1\"}}}", &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", CMS "/c", "application/merge-patch+json", "{\"data\":{\"k\":\"v\"}}", &j), 200);
    cJSON_Delete(j);
    /* leaves the selector -> DELETED; comes back -> ADDED; then the real delete */
    cr_assert_eq(api(&s, "PATCH", CMS "/c", "application/merge-patch+json",
                     "{\"metadata\":{\"labels\":{\"w\":\"0\"}}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"unwatched\"}}", &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", CMS "/c", "application/merge-patch+json",
                     "{\"metadata\":{\"labels\":{\"w\":\"1\"}}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", CMS "/c", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    /* wait for the last of the 6 events */
    double end = now_s() + 10;
    char types[16][16], names[16][64];
    int n = 0;
    while (now_s() < end) {
        pthread_mutex_lock(&w.m.mu);
        char *copy = strdup(w.m.buf);
        pthread_mutex_unlock(&w.m.mu);
        n = events(copy, types, names, 16);
        free(copy);
        if (n >= 6) break;
        usleep(10000);
    }
    watch_stop(&w);
    cr_assert_eq(w.code, 200);
    const char *want[][2] = {{"ADDED", "pre"},   {"ADDED", "c"}, {"MODIFIED", "c"},
                             {"DELETED", "c"},   {"ADDED", "c"}, {"DELETED", "c"}};
    cr_assert_eq(n, 6, "got %d events: %s", n, w.m.buf);
    for (int i = 0; i < 6; i++) {
        cr_assert_str_eq(types[i], want[i][0], "event %d", i);
        cr_assert_str_eq(names[i], want[i][1], "event %d", i);
    }
    mb_free(&w.m);
    rl_test_standin_stop(&s);
}

Test(standin, watch_replay_bookmarks_timeout, .timeout = 40) {
    static rl_test_standin s;
    start(&s, "--bookmark-interval 0.2");
    cJSON *j;
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{\"name\":\"l\"},\"spec\":{}}", &j), 201);
    long long rv0 = rv_of(j);
    cJSON_Delete(j);
    for (int i = 0; i < 3; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"spec\":{\"leaseTransitions\":%d}}", i + 1);
        cr_assert_eq(api(&s, "PATCH", LEASES "/l", "application/merge-patch+json", body, &j), 200);
        cJSON_Delete(j);
    }
    cr_assert_eq(api(&s, "DELETE", LEASES "/l", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    /* from rv0: exactly the later changes, in order; the stream then idles with
     * bookmarks and ends by itself after timeoutSeconds */
    char path[256];
    snprintf(path, sizeof path, LEASES "?watch=1&resourceVersion=%lld&allowWatchBookmarks=true&timeoutSeconds=1",
             rv0);
    membuf m;
    mb_init(&m);
    int crc = -1;
    double t0 = now_s();
    cr_assert_eq(api_opt(&s, "GET", path, NULL, &m, (reqopt){.curl_rc = &crc, .timeout_s = 10}), 200);
    double took = now_s() - t0;
    cr_assert_eq(crc, CURLE_OK, "the stream must end cleanly (chunked terminator), curl %d", crc);
    cr_assert(took > 0.8 && took < 5.0, "timeoutSeconds=1 took %.2f s", took);
    char types[32][16], names[32][64];
    int n = events(m.buf, types, names, 32);
    cr_assert(n >= 5, "%s", m.buf);
    cr_assert_str_eq(types[0], "MODIFIED");
    cr_assert_str_eq(types[1], "MODIFIED");
    cr_assert_str_eq(types[2], "MODIFIED");
    cr_assert_str_eq(types[3], "DELETED");
    int bookmarks = 0;
    long long last_rv = 0;
    const char *p = m.buf;
    for (int i = 0; i < n; i++) {
        const char *nl = strchr(p, '\n');
        char *line = strndup(p, (size_t)(nl - p));
        cJSON *e = cJSON_Parse(line);
        free(line);
        long long rv = atoll(jstr(e, "object.metadata.resourceVersion"));
        cr_assert_geq(rv, last_rv, "resourceVersions go forward in a stream");
        last_rv = rv;
        if (!strcmp(types[i], "BOOKMARK")) {
            bookmarks++;
            const cJSON *obj = cJSON_GetObjectItem(e, "object");
            cr_assert_eq(cJSON_GetArraySize(obj), 3, "a BOOKMARK carries kind, apiVersion, metadata only");
            cr_assert_str_eq(jstr(obj, "kind"), "Lease");
            cr_assert_str_eq(jstr(obj, "apiVersion"), "coordination.k8s.io/v1");
            cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(obj, "metadata")), 1);
        } else {
            cr_assert_lt(i, 4, "only the 4 changes and bookmarks: %s", m.buf);
        }
        cJSON_Delete(e);
        p = nl + 1;
    }
    cr_assert_geq(bookmarks, 2, "bookmarks every 0.2 s over 1 s: %s", m.buf);
    mb_free(&m);
    /* the old /watch/ path form, and a single-object watch by name */
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{\"name\":\"k\"},\"spec\":{}}", &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{\"name\":\"k2\"},\"spec\":{}}", &j), 201);
    cJSON_Delete(j);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", "/apis/coordination.k8s.io/v1/watch/namespaces/default/leases/k?timeoutSeconds=1",
                         NULL, &m, (reqopt){.timeout_s = 10}),
                 200);
    n = events(m.buf, types, names, 32);
    cr_assert_eq(n, 1, "%s", m.buf);
    cr_assert_str_eq(types[0], "ADDED");
    cr_assert_str_eq(names[0], "k");
    mb_free(&m);
    /* sendInitialEvents (client-go's watch-list): current objects, then a BOOKMARK
     * annotated k8s.io/initial-events-end */
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET",
                         LEASES "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
                                "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
                         NULL, &m, (reqopt){.timeout_s = 10}),
                 200);
    n = events(m.buf, types, names, 32);
    cr_assert(n >= 3, "%s", m.buf);
    cr_assert_str_eq(types[0], "ADDED");
    cr_assert_str_eq(types[1], "ADDED");
    cr_assert_str_eq(types[2], "BOOKMARK");
    cr_assert(strstr(m.buf, "\"k8s.io/initial-events-end\": \"true\""), "%s", m.buf);
    mb_free(&m);
    rl_test_standin_stop(&s);
}

Test(standin, watch_and_list_410_expired, .timeout = 40) {
    static rl_test_standin s;
    start(&s, "--history 5");
    cJSON *j;
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"a\"}}", &j), 201);
    long long rv_a = rv_of(j);
    cJSON_Delete(j);
    /* inside the window: an Exact list at rv_a sees the state then (only "a") */
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"b\"}}", &j), 201);
    cJSON_Delete(j);
    char path[256], names[256];
    snprintf(path, sizeof path, CMS "?resourceVersion=%lld&resourceVersionMatch=Exact", rv_a);
    cr_assert_eq(list_names(&s, path, names, sizeof names, NULL), 200);
    cr_assert_str_eq(names, "a ");
    cr_assert_eq(list_names(&s, CMS "?resourceVersion=0", names, sizeof names, NULL), 200);
    cr_assert_str_eq(names, "a b ");
    /* compaction: the old RV is gone for watches and exact lists */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/compact", "{}", NULL, 0), 200);
    snprintf(path, sizeof path, CMS "?watch=1&resourceVersion=%lld", rv_a);
    membuf m;
    mb_init(&m);
    int crc = -1;
    cr_assert_eq(api_opt(&s, "GET", path, NULL, &m, (reqopt){.curl_rc = &crc, .timeout_s = 10}), 200);
    cr_assert_eq(crc, CURLE_OK, "the stream closes after the ERROR event");
    char types[8][16], nm[8][64];
    cr_assert_eq(events(m.buf, types, nm, 8), 1, "%s", m.buf);
    cJSON *e = cJSON_Parse(m.buf);
    cr_assert_str_eq(jstr(e, "type"), "ERROR");
    const cJSON *st = cJSON_GetObjectItem(e, "object");
    assert_status(st, 410, "Expired");
    char want[64];
    snprintf(want, sizeof want, "too old resource version: %lld (", rv_a);
    cr_assert(strstr(jstr(st, "message"), want), "%s", jstr(st, "message"));
    cJSON_Delete(e);
    mb_free(&m);
    snprintf(path, sizeof path, CMS "?resourceVersion=%lld&resourceVersionMatch=Exact", rv_a);
    cr_assert_eq(api(&s, "GET", path, NULL, NULL, &j), 410);
    assert_status(j, 410, "Expired");
    cJSON_Delete(j);
    /* a watch from "now" still works after compaction */
    cr_assert_eq(api(&s, "GET", CMS, NULL, NULL, &j), 200);
    long long rv_now = rv_of(j);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"c\"}}", &j), 201);
    cJSON_Delete(j);
    snprintf(path, sizeof path, CMS "?watch=1&resourceVersion=%lld&timeoutSeconds=1", rv_now);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", path, NULL, &m, (reqopt){.timeout_s = 10}), 200);
    cr_assert_eq(events(m.buf, types, nm, 8), 1, "%s", m.buf);
    cr_assert_str_eq(types[0], "ADDED");
    cr_assert_str_eq(nm[0], "c");
    mb_free(&m);
    /* the history window (--history 5): more writes push rv_now out of it */
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(api(&s, "PATCH", CMS "/c", "application/merge-patch+json",
                         i % 2 ? "{\"data\":{\"k\":\"1\"}}" : "{\"data\":{\"k\":\"2\"}}", &j),
                     200);
        cJSON_Delete(j);
    }
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", path, NULL, &m, (reqopt){.timeout_s = 10}), 200);
    cr_assert(strstr(m.buf, "\"ERROR\"") && strstr(m.buf, "\"code\": 410"), "%s", m.buf);
    mb_free(&m);
    rl_test_standin_stop(&s);
}

/* ---- EndpointSlices ------------------------------------------------------------------- */
static void make_pod(rl_test_standin *s, const char *name, const char *ip, const char *hostname,
                     const char *subdomain, int ready) {
    char body[1024], path[256];
    snprintf(body, sizeof body,
             "{\"metadata\":{\"name\":\"%s\",\"labels\":{\"job\":\"j\"}},\"spec\":{%s%s%s%s%s%s"
             "\"terminationGracePeriodSeconds\":30,\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}",
             name, hostname ? "\"hostname\":\"" : "", hostname ? hostname : "", hostname ? "\"," : "",
             subdomain ? "\"subdomain\":\"" : "", subdomain ? subdomain : "", subdomain ? "\"," : "");
    cJSON *j;
    cr_assert_eq(api(s, "POST", "/api/v1/namespaces/default/pods", NULL, body, &j), 201);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/api/v1/namespaces/default/pods/%s/status", name);
    snprintf(body, sizeof body, "{\"status\":{\"phase\":\"Running\",\"podIP\":\"%s\"}}", ip);
    cr_assert_eq(api(s, "PATCH", path, "application/merge-patch+json", body, &j), 200);
    cJSON_Delete(j);
    if (ready) {
        snprintf(path, sizeof path, "/pods/default/%s/ready", name);
        cr_assert_eq(rl_test_standin_admin(s, "POST", path, "{\"ready\":true}", NULL, 0), 200);
    }
}

/* Merge all slices of service `svc`; returns the number of slices, fills a
 * per-pod summary "name:ip:ready/serving/terminating:hostname;" sorted by name. */
static int merged_slices(rl_test_standin *s, const char *svc, char *summary, size_t n, cJSON **keep) {
    char path[256];
    snprintf(path, sizeof path,
             "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io/"
             "service-name%%3D%s",
             svc);
    cJSON *j;
    cr_assert_eq(api(s, "GET", path, NULL, NULL, &j), 200);
    char lines[16][160];
    int nl = 0, slices = 0;
    const cJSON *sl, *ep;
    cJSON_ArrayForEach(sl, cJSON_GetObjectItem(j, "items")) {
        slices++;
        cJSON_ArrayForEach(ep, cJSON_GetObjectItem(sl, "endpoints")) {
            if (nl >= 16) break;
            const cJSON *c = cJSON_GetObjectItem(ep, "conditions");
            const char *pod = jstr(ep, "targetRef.name");
            const cJSON *addr = cJSON_GetArrayItem(cJSON_GetObjectItem(ep, "addresses"), 0);
            cr_assert(pod && cJSON_IsString(addr), "endpoint without targetRef.name or address");
            snprintf(lines[nl++], 160, "%s:%s:%d/%d/%d:%s;", pod, addr->valuestring,
                     cJSON_IsTrue(cJSON_GetObjectItem(c, "ready")), cJSON_IsTrue(cJSON_GetObjectItem(c, "serving")),
                     cJSON_IsTrue(cJSON_GetObjectItem(c, "terminating")),
                     jstr(ep, "hostname") ? jstr(ep, "hostname") : "-");
        }
    }
    for (int a = 0; a < nl; a++)
        for (int b = a + 1; b < nl; b++)
            if (strcmp(lines[a], lines[b]) > 0) {
                char t[160];
                memcpy(t, lines[a], 160);
                memcpy(lines[a], lines[b], 160);
                memcpy(lines[b], t, 160);
            }
    summary[0] = '\0';
    for (int a = 0; a < nl; a++) strncat(summary, lines[a], n - strlen(summary) - 1);
    if (keep)
        *keep = j;
    else
        cJSON_Delete(j);
    return slices;
}

static int await_slices(rl_test_standin *s, const char *svc, const char *want, int want_slices, char *got,
                        size_t n) {
    double end = now_s() + 5.0;
    while (now_s() < end) {
        int k = merged_slices(s, svc, got, n, NULL);
        if (!strcmp(got, want) && (want_slices < 0 || k == want_slices)) return 1;
        usleep(20000);
    }
    return 0;
}

Test(standin, endpointslices_merge_conditions, .timeout = 60) {
    static rl_test_standin s;
    start(&s, "--max-endpoints-per-slice 2");
    cJSON *j;
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/services", NULL,
                     "{\"metadata\":{\"name\":\"j\",\"labels\":{\"team\":\"ml\"}},\"spec\":{\"clusterIP\":\"None\","
                     "\"selector\":{\"job\":\"j\"},\"ports\":[{\"name\":\"rdzv\",\"port\":29400}]}}",
                     &j),
                 201);
    const char *svc_uid = strdup(jstr(j, "metadata.uid"));
    cJSON_Delete(j);
    char got[2048];
    /* no pods yet: one placeholder slice without endpoints */
    cr_assert(await_slices(&s, "j", "", 1, got, sizeof got), "placeholder slice: %s", got);
    make_pod(&s, "p0", "127.0.0.10", "p0", "j", 1);     /* hostname: subdomain matches */
    make_pod(&s, "p1", "127.0.0.11", "p1", "other", 1); /* no hostname: subdomain differs */
    make_pod(&s, "p2", "127.0.0.12", NULL, NULL, 0);    /* not ready */
    make_pod(&s, "p3", "127.0.0.13", NULL, NULL, 1);
    make_pod(&s, "p4", "127.0.0.14", NULL, NULL, 1);
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/pods", NULL,
                     "{\"metadata\":{\"name\":\"noip\",\"labels\":{\"job\":\"j\"}},\"spec\":{\"containers\":"
                     "[{\"name\":\"c\",\"image\":\"i\"}]}}",
                     &j),
                 201);
    cJSON_Delete(j);
    const char *want = "p0:127.0.0.10:1/1/0:p0;p1:127.0.0.11:1/1/0:-;p2:127.0.0.12:0/0/0:-;"
                       "p3:127.0.0.13:1/1/0:-;p4:127.0.0.14:1/1/0:-;";
    cr_assert(await_slices(&s, "j", want, 3, got, sizeof got), "got %s", got);
    /* slice shape */
    cJSON *all;
    merged_slices(&s, "j", got, sizeof got, &all);
    const cJSON *sl;
    cJSON_ArrayForEach(sl, cJSON_GetObjectItem(all, "items")) {
        const char *name = jstr(sl, "metadata.name");
        cr_assert(strncmp(name, "j-", 2) == 0 && strlen(name) == 7, "slice name %s", name);
        cr_assert_str_eq(jstr(sl, "addressType"), "IPv4");
        const cJSON *lb = jget(sl, "metadata.labels");
        cr_assert_str_eq(cJSON_GetObjectItem(lb, "endpointslice.kubernetes.io/managed-by")->valuestring,
                         "endpointslice-controller.k8s.io");
        cr_assert_str_eq(cJSON_GetObjectItem(lb, "kubernetes.io/service-name")->valuestring, "j");
        const cJSON *own = cJSON_GetArrayItem(jget(sl, "metadata.ownerReferences"), 0);
        cr_assert_str_eq(jstr(own, "kind"), "Service");
        cr_assert_str_eq(jstr(own, "uid"), svc_uid);
        const cJSON *port = cJSON_GetArrayItem(cJSON_GetObjectItem(sl, "ports"), 0);
        cr_assert_str_eq(jstr(port, "name"), "rdzv");
        cr_assert_eq((int)jnum(port, "port"), 29400);
        cr_assert_str_eq(jstr(port, "protocol"), "TCP");
        cr_assert_leq(cJSON_GetArraySize(cJSON_GetObjectItem(sl, "endpoints")), 2);
        const cJSON *ep = cJSON_GetArrayItem(cJSON_GetObjectItem(sl, "endpoints"), 0);
        cr_assert_str_eq(jstr(ep, "targetRef.kind"), "Pod");
        cr_assert_str_eq(jstr(ep, "nodeName"), "standin-node");
    }
    cJSON_Delete(all);
    /* graceful delete: terminating, not ready, still serving while the pod is Ready */
    double t0 = now_s();
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/p3", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    want = "p0:127.0.0.10:1/1/0:p0;p1:127.0.0.11:1/1/0:-;p2:127.0.0.12:0/0/0:-;"
           "p3:127.0.0.13:0/1/1:-;p4:127.0.0.14:1/1/0:-;";
    cr_assert(await_slices(&s, "j", want, -1, got, sizeof got), "got %s", got);
    cr_assert_lt(now_s() - t0, 1.0, "slices must follow pod changes promptly");
    /* readiness change through the admin API */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/pods/default/p2/ready", "{\"ready\":true}", NULL, 0), 200);
    want = "p0:127.0.0.10:1/1/0:p0;p1:127.0.0.11:1/1/0:-;p2:127.0.0.12:1/1/0:-;"
           "p3:127.0.0.13:0/1/1:-;p4:127.0.0.14:1/1/0:-;";
    cr_assert(await_slices(&s, "j", want, -1, got, sizeof got), "got %s", got);
    /* publishNotReadyAddresses: ready regardless of readiness and termination */
    cr_assert_eq(api(&s, "PATCH", "/api/v1/namespaces/default/services/j", "application/merge-patch+json",
                     "{\"spec\":{\"publishNotReadyAddresses\":true}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/pods/default/p4/ready", "{\"ready\":false}", NULL, 0), 200);
    want = "p0:127.0.0.10:1/1/0:p0;p1:127.0.0.11:1/1/0:-;p2:127.0.0.12:1/1/0:-;"
           "p3:127.0.0.13:1/1/1:-;p4:127.0.0.14:1/0/0:-;";
    cr_assert(await_slices(&s, "j", want, -1, got, sizeof got), "got %s", got);
    /* a pod gone at once (grace 0) leaves the slices; fewer pods, fewer slices */
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/p0?gracePeriodSeconds=0", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/p1", NULL, "{\"gracePeriodSeconds\":0}", &j),
                 200);
    cJSON_Delete(j);
    want = "p2:127.0.0.12:1/1/0:-;p3:127.0.0.13:1/1/1:-;p4:127.0.0.14:1/0/0:-;";
    cr_assert(await_slices(&s, "j", want, 2, got, sizeof got), "got %s", got);
    /* the service goes: its slices go with it */
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/services/j", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    double end = now_s() + 5.0;
    int left = -1;
    while (now_s() < end && (left = merged_slices(&s, "j", got, sizeof got, NULL)) != 0) usleep(20000);
    cr_assert_eq(left, 0, "slices outlived their service");
    free((void *)svc_uid);
    rl_test_standin_stop(&s);
}

/* ---- outages, tokens, history -------------------------------------------------------- */
Test(standin, outage_modes, .timeout = 40) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    watcher w;
    watch_start(&w, &s, CMS "?watch=1");
    cr_assert_eq(api(&s, "POST", CMS, NULL, "{\"metadata\":{\"name\":\"x\"}}", &j), 201);
    cJSON_Delete(j);
    cr_assert(watch_await(&w, "ADDED", 10));
    double t0 = now_s();
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"refuse\",\"seconds\":1.5}", NULL, 0), 200);
    /* the open watch is dropped without the chunked terminator */
    double end = now_s() + 5;
    while (!w.done && now_s() < end) usleep(10000);
    cr_assert(w.done, "the watch survived the outage");
    cr_assert_neq(w.curl_rc, CURLE_OK, "a dropped watch must not look like a clean end");
    pthread_join(w.th, NULL);
    mb_free(&w.m);
    membuf m;
    mb_init(&m);
    int crc = 0;
    long code = api_opt(&s, "GET", CMS, NULL, &m, (reqopt){.curl_rc = &crc});
    mb_free(&m);
    cr_assert_eq(code, 0);
    cr_assert_eq(crc, CURLE_COULDNT_CONNECT, "connection refused expected, curl %d", crc);
    cr_assert(await_code(&s, CMS, 200, 10), "the API did not come back on the same port");
    cr_assert_geq(now_s() - t0, 1.3, "the outage ended early");
    /* refuse can be ended early */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"refuse\",\"seconds\":60}", NULL, 0), 200);
    cr_assert_eq(api(&s, "GET", CMS, NULL, NULL, NULL), 0);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"none\"}", NULL, 0), 200);
    cr_assert(await_code(&s, CMS, 200, 5));
    /* 503 with Retry-After and a Status body, then ended early */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"503\",\"seconds\":60}", NULL, 0), 200);
    char hdrs[4096];
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", CMS, NULL, &m, (reqopt){.hdrs = hdrs, .hdrs_n = sizeof hdrs}), 503);
    cr_assert(strstr(hdrs, "Retry-After: 1"), "%s", hdrs);
    j = cJSON_Parse(m.buf);
    assert_status(j, 503, "ServiceUnavailable");
    cJSON_Delete(j);
    mb_free(&m);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"none\"}", NULL, 0), 200);
    cr_assert_eq(api(&s, "GET", CMS, NULL, NULL, NULL), 200);
    /* a short 503 outage ends by itself */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/outage", "{\"mode\":\"503\",\"seconds\":0.5}", NULL, 0), 200);
    cr_assert_eq(api(&s, "GET", CMS, NULL, NULL, NULL), 503);
    cr_assert(await_code(&s, CMS, 200, 5));
    rl_test_standin_stop(&s);
}

Test(standin, tokens_forbidden_and_revoked, .timeout = 30) {
    static rl_test_standin s;
    start(&s, NULL);
    cJSON *j;
    cr_assert_eq(api(&s, "POST", LEASES, NULL, "{\"metadata\":{\"name\":\"x\"},\"spec\":{\"holderIdentity\":\"a\"}}", &j),
                 201);
    cJSON_Delete(j);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/tokens",
                                       "{\"token\":\"t-ro\",\"deny\":[\"leases:update\",\"endpointslices\"]}", NULL, 0),
                 200);
    membuf m;
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/x", NULL, &m, (reqopt){.tok = "t-ro"}), 200);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "PUT", LEASES "/x",
                         "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":\"x\"},"
                         "\"spec\":{\"holderIdentity\":\"b\"}}",
                         &m, (reqopt){.tok = "t-ro"}),
                 403);
    j = cJSON_Parse(m.buf);
    assert_status(j, 403, "Forbidden");
    cr_assert_str_eq(jstr(j, "message"),
                     "leases.coordination.k8s.io \"x\" is forbidden: User \"system:serviceaccount:default:test\" "
                     "cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace "
                     "\"default\"");
    cJSON_Delete(j);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?watch=1", NULL, &m,
                         (reqopt){.tok = "t-ro"}),
                 403);
    j = cJSON_Parse(m.buf);
    cr_assert_str_eq(jstr(j, "message"),
                     "endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:default:test\" "
                     "cannot watch resource \"endpointslices\" in API group \"discovery.k8s.io\" in the "
                     "namespace \"default\"");
    cJSON_Delete(j);
    mb_free(&m);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/tokens/revoke", "{\"token\":\"t-ro\"}", NULL, 0), 200);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/x", NULL, &m, (reqopt){.tok = "t-ro"}), 401);
    mb_free(&m);

    /* the write history of one object, in order */
    cr_assert_eq(api(&s, "PATCH", LEASES "/x", "application/merge-patch+json", "{\"spec\":{\"holderIdentity\":\"b\"}}",
                     &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "DELETE", LEASES "/x", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    static char out[65536];
    cr_assert_eq(rl_test_standin_admin(&s, "GET", "/history?resource=leases&namespace=default&name=x", NULL, out,
                                       sizeof out),
                 200);
    j = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(j), "%s", out);
    cr_assert_eq(cJSON_GetArraySize(j), 3, "%s", out);
    const char *types[] = {"ADDED", "MODIFIED", "DELETED"}, *holders[] = {"a", "b", "b"};
    long long last = 0;
    for (int i = 0; i < 3; i++) {
        const cJSON *h = cJSON_GetArrayItem(j, i);
        cr_assert_str_eq(jstr(h, "type"), types[i]);
        cr_assert_str_eq(jstr(h, "object.spec.holderIdentity"), holders[i]);
        cr_assert_gt(atoll(jstr(h, "rv")), last);
        last = atoll(jstr(h, "rv"));
    }
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* ---- the kubelet: pods as local processes ---------------------------------------------- */
static char g_env_out[128], g_env_mark[] = "RL_TEST_MARK=42", g_env_leak[] = "NOT_RL_LEAK=1";
static char g_image[128];

/* A stand-in whose kubelet runs image busybox:* from a fresh dir holding
 * `greet` (args and environment into $RL_TEST_OUT); extra: more flags. */
static void start_kubelet_with(rl_test_standin *s, int max_pods, const char *extra) {
    snprintf(g_img, sizeof g_img, "/tmp/rl-img-XXXXXX");
    cr_assert(mkdtemp(g_img));
    char path[128];
    snprintf(path, sizeof path, "%s/greet", g_img);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("#!/bin/sh\necho \"args=$1|$2|$3|$4\"\nenv | sort > \"$RL_TEST_OUT/env-$HOSTNAME\"\n"
          "test -s \"$RL_K8S_SA_DIR/token\" && test -s \"$RL_K8S_SA_DIR/ca.crt\" && "
          "echo \"sa-ns=$(cat \"$RL_K8S_SA_DIR/namespace\")\"\necho \"sa=${RL_K8S_SA_DIR:-none}\"\n",
          f);
    fclose(f);
    chmod(path, 0755);
    snprintf(g_env_out, sizeof g_env_out, "RL_TEST_OUT=%s", g_img);
    snprintf(g_image, sizeof g_image, "busybox:*=%s", g_img);
    rl_test_standin_opts o = {.images = {g_image}, .max_pods = max_pods, .backoff_s = 0.3,
                              .env = {g_env_out, g_env_mark, g_env_leak}, .extra_args = extra};
    cr_assert_eq(rl_test_standin_start_opts(s, &o), 0, "the stand-in did not start");
    g_live = s;
}

static void start_kubelet(rl_test_standin *s, int max_pods) { start_kubelet_with(s, max_pods, NULL); }

static void slurp(const char *path, char *buf, size_t n) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = '\0';
}

/* A process that exists and is not a zombie. */
static int alive(int pid) {
    if (pid <= 0 || kill(pid, 0) != 0) return 0;
    char p[64], st[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    slurp(p, st, sizeof st);
    const char *close = strrchr(st, ')');
    return !(close && close[1] == ' ' && close[2] == 'Z');
}

/* "key=N" in a pod's log (the container printed its pids), polled. */
static int logged_int(rl_test_standin *s, const char *pod, const char *key, double secs) {
    char args[256], out[4096], pat[64];
    snprintf(args, sizeof args, "logs %s", pod);
    snprintf(pat, sizeof pat, "%s=", key);
    double end = now_s() + secs;
    while (now_s() < end) {
        if (rl_test_kubectl(s, args, NULL, out, sizeof out) == 0) {
            const char *at = strstr(out, pat);
            if (at) return atoi(at + strlen(pat));
        }
        usleep(50000);
    }
    return -1;
}

static void await_pod(rl_test_standin *s, const char *name, const char *want, double secs, rl_test_pod *p) {
    int rc = rl_test_standin_await_pod(s, "default", name, NULL, want, secs, p);
    cr_assert_eq(rc, 0, "pod %s never %s: phase %s, container %s %s (%s), pod reason %s, scheduled %d %s", name,
                 want, p->phase, p->state, p->c_reason, p->c_message, p->reason, p->scheduled, p->sched_message);
}

static const char *ENV_PODS =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm1}\ndata: {ck: cval}\n---\n"
    "apiVersion: v1\nkind: Secret\nmetadata: {name: s1}\nstringData: {k: sekrit}\n---\n"
    "apiVersion: v1\nkind: Pod\nmetadata: {name: envp, labels: {app: demo}, annotations: {note: hi}}\n"
    "spec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: busybox:1.36\n"
    "    command: [greet]\n    args: ['$(POD_NAME)', '$$(POD_NAME)', '$(NOPE)', '$(X)']\n    env:\n"
    "    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}\n"
    "    - {name: POD_NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}\n"
    "    - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}\n"
    "    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n"
    "    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}\n"
    "    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n"
    "    - {name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}\n"
    "    - {name: LBL, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}}\n"
    "    - {name: ANN, valueFrom: {fieldRef: {fieldPath: \"metadata.annotations['note']\"}}}\n"
    "    - {name: SEC, valueFrom: {secretKeyRef: {name: s1, key: k}}}\n"
    "    - {name: CMV, valueFrom: {configMapKeyRef: {name: cm1, key: ck}}}\n"
    "    - {name: OPT, valueFrom: {secretKeyRef: {name: nope, key: k, optional: true}}}\n"
    "    - {name: X, value: 'x-$(POD_NAME)-$(SEC)'}\n"
    "    envFrom: [{configMapRef: {name: cm1}, prefix: CM_}, {secretRef: {name: s1}}]\n---\n"
    "apiVersion: v1\nkind: Pod\nmetadata: {name: nosa}\n"
    "spec:\n  restartPolicy: Never\n  automountServiceAccountToken: false\n"
    "  containers: [{name: main, image: busybox:1.36, command: [greet]}]\n";

/* command/args with $(VAR) expansion, env from fieldRef/secretKeyRef/
 * configMapKeyRef, the injected environment, the service-account files and
 * their token, status as the kubelet writes it, kubectl logs. */
Test(standin, kubelet_env_status_logs, .timeout = 60) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[65536];
    kubectl_ok(&s, "apply -f -", ENV_PODS, out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "envp", "Succeeded", 10, &p);
    cr_assert_str_eq(p.state, "terminated");
    cr_assert_eq(p.exit_code, 0);
    cr_assert_str_eq(p.c_reason, "Completed");
    cr_assert_str_eq(p.node, "standin-node");
    cr_assert(!strncmp(p.ip, "127.", 4) && strcmp(p.ip, "127.0.0.1"), "pod IP %s", p.ip);
    cr_assert(!p.ready);
    kubectl_ok(&s, "logs envp", NULL, out, sizeof out);
    cr_assert(strstr(out, "args=envp|$(POD_NAME)|$(NOPE)|x-envp-sekrit\n"), "%s", out);
    cr_assert(strstr(out, "sa-ns=default\n"), "%s", out);
    kubectl_ok(&s, "logs envp --tail=1 -c main", NULL, out, sizeof out);
    cr_assert(!strncmp(out, "sa=/", 4) && !strchr(out, '\n')[1], "tailLines: %s", out);
    char path[256], env[16384], want[512];
    snprintf(path, sizeof path, "%s/env-envp", g_img);
    slurp(path, env, sizeof env);
    const char *lines[] = {"POD_NAME=envp\n", "POD_NS=default\n", "HOST_IP=127.0.0.1\n", "NODE=standin-node\n",
                           "SA=default\n", "LBL=demo\n", "ANN=hi\n", "SEC=sekrit\n", "CMV=cval\n",
                           "X=x-envp-sekrit\n", "HOSTNAME=envp\n", "RL_TEST_MARK=42\n", "CM_ck=cval\n", "k=sekrit\n",
                           "KUBERNETES_SERVICE_HOST=127.0.0.1\n"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert(strstr(env, lines[i]), "no %s in\n%s", lines[i], env);
    snprintf(want, sizeof want, "POD_IP=%s\n", p.ip);
    cr_assert(strstr(env, want), "%s not in\n%s", want, env);
    snprintf(want, sizeof want, "POD_UID=%s\n", p.uid);
    cr_assert(strstr(env, want));
    snprintf(want, sizeof want, "KUBERNETES_SERVICE_PORT=%d\n", s.port);
    cr_assert(strstr(env, want), "%s", env);
    snprintf(want, sizeof want, "PATH=%s:", g_img);
    cr_assert(strstr(env, want), "the image dir comes first on PATH: %s", env);
    cr_assert_null(strstr(env, "OPT="), "an optional missing secret sets nothing");
    cr_assert_null(strstr(env, "NOT_RL_LEAK"), "only RL_* of the stand-in reaches containers");
    /* the service-account token: the pod's identity, RBAC applies */
    const char *sa = strstr(env, "RL_K8S_SA_DIR=");
    cr_assert(sa);
    char tokp[512], tok[512];
    snprintf(tokp, sizeof tokp, "%.*s/token", (int)(strchr(sa, '\n') - sa - 14), sa + 14);
    slurp(tokp, tok, sizeof tok);
    cr_assert(tok[0]);
    char args[1024];
    snprintf(args, sizeof args, "--token=%s get pods", tok);
    cr_assert_neq(rl_test_kubectl(&s, args, NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "pods is forbidden: User \"system:serviceaccount:default:default\" cannot list resource "
                          "\"pods\" in API group \"\" in the namespace \"default\""),
              "%s", out);
    /* automountServiceAccountToken: false -> no files, no RL_K8S_SA_DIR */
    await_pod(&s, "nosa", "Succeeded", 10, &p);
    kubectl_ok(&s, "logs nosa", NULL, out, sizeof out);
    cr_assert(strstr(out, "sa=none"), "%s", out);
    /* kubectl's view: STATUS Completed, the pod's IP with -o wide */
    kubectl_ok(&s, "get pod envp -o wide", NULL, out, sizeof out);
    cr_assert(strstr(out, "Completed") && strstr(out, "standin-node"), "%s", out);
    /* a bound token dies with its pod */
    kubectl_ok(&s, "delete pod envp", NULL, out, sizeof out);
    cr_assert_neq(rl_test_kubectl(&s, args, NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "Unauthorized"), "%s", out);
    rl_test_standin_stop(&s);
}

/* A Secret that is missing, then lacks the key, then is complete: the
 * container waits with the kubelet's messages and starts once it can. */
Test(standin, kubelet_secret_missing_then_created, .timeout = 40) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[8192];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: waits}\nspec:\n  restartPolicy: Never\n"
               "  containers:\n  - name: main\n    image: busybox:1.36\n    command: [sh, -c, 'echo got=$S']\n"
               "    env: [{name: S, valueFrom: {secretKeyRef: {name: later, key: k}}}]\n",
               out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "waits", "CreateContainerConfigError", 10, &p);
    cr_assert_str_eq(p.c_message, "secret \"later\" not found");
    cr_assert_str_eq(p.phase, "Pending");
    kubectl_ok(&s, "get pod waits", NULL, out, sizeof out);
    cr_assert(strstr(out, "CreateContainerConfigError"), "%s", out);
    kubectl_ok(&s, "apply -f -", "apiVersion: v1\nkind: Secret\nmetadata: {name: later}\nstringData: {other: x}\n",
               out, sizeof out);
    double end = now_s() + 10;
    while (now_s() < end && rl_test_standin_pod(&s, "default", "waits", NULL, &p) == 0 &&
           strstr(p.c_message, "not found"))
        usleep(50000);
    cr_assert_str_eq(p.c_message, "couldn't find key k in Secret default/later");
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Secret\nmetadata: {name: later}\nstringData: {other: x, k: finally}\n", out,
               sizeof out);
    await_pod(&s, "waits", "Succeeded", 10, &p);
    kubectl_ok(&s, "logs waits", NULL, out, sizeof out);
    cr_assert_str_eq(out, "got=finally\n");
    rl_test_standin_stop(&s);
}

/* An image no --image pattern maps: ErrImagePull, then ImagePullBackOff,
 * Pending; logs refuse; deleting it is immediate. */
Test(standin, kubelet_image_pull_backoff, .timeout = 40) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[8192];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: nopull}\n"
               "spec: {containers: [{name: main, image: 'nope.example/img:1', command: [sh]}]}\n",
               out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "nopull", "ErrImagePull", 10, &p);
    cr_assert_str_eq(p.phase, "Pending");
    cr_assert(p.ip[0], "the sandbox (and its address) exists while the image is pulled");
    cr_assert(strstr(p.c_message, "failed to pull and unpack image \"nope.example/img:1\""), "%s", p.c_message);
    await_pod(&s, "nopull", "ImagePullBackOff", 10, &p);
    cr_assert(strstr(p.c_message, "Back-off pulling image \"nope.example/img:1\""), "%s", p.c_message);
    cr_assert_str_eq(p.phase, "Pending");
    kubectl_ok(&s, "get pod nopull", NULL, out, sizeof out);
    cr_assert(strstr(out, "ImagePullBackOff") || strstr(out, "ErrImagePull"), "%s", out);
    kubectl_ok(&s, "get events --field-selector involvedObject.name=nopull -o jsonpath={.items[*].message}", NULL, out,
               sizeof out);
    cr_assert(strstr(out, "Error: ErrImagePull") && strstr(out, "Back-off pulling image \"nope.example/img:1\""), "%s",
              out);
    cr_assert_neq(rl_test_kubectl(&s, "logs nopull", NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "container \"main\" in pod \"nopull\" is waiting to start: trying and failing to pull image"),
              "%s", out);
    double t0 = now_s();
    kubectl_ok(&s, "delete pod nopull", NULL, out, sizeof out);
    cr_assert_lt(now_s() - t0, 3.0, "a pod that never started goes at once");
    rl_test_standin_stop(&s);
}

/* Exit codes and restartPolicy: Succeeded/Failed with terminated.exitCode,
 * StartError for a missing executable, OnFailure restarts with
 * CrashLoopBackOff and keeps the previous instance's log. */
Test(standin, kubelet_exit_codes_and_restarts, .timeout = 60) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[16384];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, 'exit 0']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError,\n"
               "                command: [sh, -c, 'echo first; echo it broke; exit 3']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: noexe}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, command: [no-such-cmd]}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: crash}\nspec:\n  restartPolicy: OnFailure\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, 'echo run; exit 2']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: onfok}\nspec:\n  restartPolicy: OnFailure\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, 'exit 0']}]\n",
               out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "ok", "Succeeded", 10, &p);
    cr_assert_eq(p.exit_code, 0);
    cr_assert_str_eq(p.c_reason, "Completed");
    await_pod(&s, "bad", "Failed", 10, &p);
    cr_assert_eq(p.exit_code, 3);
    cr_assert_str_eq(p.c_reason, "Error");
    cr_assert_str_eq(p.c_message, "first\nit broke\n", "FallbackToLogsOnError: the log's tail");
    cr_assert_eq(p.restarts, 0);
    await_pod(&s, "noexe", "Failed", 10, &p);
    cr_assert_eq(p.exit_code, 128);
    cr_assert_str_eq(p.c_reason, "StartError");
    cr_assert(strstr(p.c_message, "exec: \"no-such-cmd\": executable file not found in $PATH"), "%s", p.c_message);
    await_pod(&s, "onfok", "Succeeded", 10, &p);
    await_pod(&s, "crash", "CrashLoopBackOff", 15, &p);
    cr_assert_geq(p.restarts, 1);
    cr_assert_eq(p.last_exit_code, 2);
    cr_assert_str_eq(p.phase, "Running", "OnFailure: restarting, not Failed");
    cr_assert(strstr(p.c_message, "back-off ") && strstr(p.c_message, "restarting failed container=main pod=crash_default("),
              "%s", p.c_message);
    kubectl_ok(&s, "logs crash --previous", NULL, out, sizeof out);
    cr_assert_str_eq(out, "run\n");
    /* the scheduler's and the kubelet's Events */
    kubectl_ok(&s, "get events --field-selector involvedObject.name=crash -o jsonpath={.items[*].reason}", NULL, out,
               sizeof out);
    cr_assert(strstr(out, "Scheduled") && strstr(out, "Pulled") && strstr(out, "Created") && strstr(out, "Started") &&
                  strstr(out, "BackOff"),
              "%s", out);
    kubectl_ok(&s, "get events --field-selector involvedObject.name=noexe,reason=Failed -o jsonpath={.items[*].type}",
               NULL, out, sizeof out);
    cr_assert_str_eq(out, "Warning");
    kubectl_ok(&s, "get pods", NULL, out, sizeof out);
    cr_assert(strstr(out, "Completed") && strstr(out, "Error") && strstr(out, "StartError"), "%s", out);
    rl_test_standin_stop(&s);
}

/* The termination-message file: what a container writes to it becomes its
 * terminated.message whatever the exit status, ahead of the log's tail
 * (FallbackToLogsOnError falls back only when the file is empty and the
 * status not 0); the kubelet keeps the last 4096 bytes, a pod's containers
 * share 12 KiB, and every instance starts from an empty file. */
Test(standin, kubelet_termination_message_file, .timeout = 90) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[16384];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: filemsg}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError,\n"
               "                command: [sh, -c, 'echo to-the-log; printf \"from the file\" > "
               "\"$RINGLEADER_TERMINATION_LOG\"; exit 3']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: filemsg0}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36,\n"
               "                command: [sh, -c, 'printf \"all done\" > \"$RINGLEADER_TERMINATION_LOG\"']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: logmsg}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError,\n"
               "                command: [sh, -c, 'echo only the log; exit 1']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: bigmsg}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, '{ echo HEAD; "
               "head -c 6000 /dev/zero | tr \"\\0\" x; echo; echo TAIL; } > \"$RINGLEADER_TERMINATION_LOG\"']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: elsewhere}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, terminationMessagePath: /tmp/rl-elsewhere-log,\n"
               "                terminationMessagePolicy: FallbackToLogsOnError,\n"
               "                command: [sh, -c, 'echo var=${RINGLEADER_TERMINATION_LOG:-none}; exit 2']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: fresh}\nspec:\n  restartPolicy: OnFailure\n"
               "  containers: [{name: main, image: busybox:1.36,\n"
               "                command: [sh, -c, 'printf inst >> \"$RINGLEADER_TERMINATION_LOG\"; exit 4']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: four}\nspec:\n  restartPolicy: Never\n  containers:\n"
               "  - {name: c1, image: busybox:1.36, command: [sh, -c, 'head -c 4000 /dev/zero | tr \"\\0\" y > "
               "\"$RINGLEADER_TERMINATION_LOG\"']}\n"
               "  - {name: c2, image: busybox:1.36, command: [sh, -c, 'exit 0']}\n"
               "  - {name: c3, image: busybox:1.36, command: [sh, -c, 'exit 0']}\n"
               "  - {name: c4, image: busybox:1.36, command: [sh, -c, 'exit 0']}\n",
               out, sizeof out);
    rl_test_pod p;
    /* the file wins over the log, even with FallbackToLogsOnError */
    await_pod(&s, "filemsg", "Failed", 15, &p);
    cr_assert_eq(p.exit_code, 3);
    cr_assert_str_eq(p.c_reason, "Error");
    cr_assert_str_eq(p.c_message, "from the file");
    /* read at exit 0 too: the Completed state carries it */
    await_pod(&s, "filemsg0", "Succeeded", 15, &p);
    cr_assert_str_eq(p.c_reason, "Completed");
    cr_assert_str_eq(p.c_message, "all done");
    /* an empty file, FallbackToLogsOnError, status 1: the log's tail */
    await_pod(&s, "logmsg", "Failed", 15, &p);
    cr_assert_str_eq(p.c_message, "only the log\n");
    /* 6011 bytes written: the last 4096 kept (tail.ReadAtMost), HEAD gone */
    await_pod(&s, "bigmsg", "Succeeded", 15, &p);
    size_t n = strlen(p.c_message);
    cr_assert_eq(n, 4096, "message of %zu bytes", n);
    cr_assert_eq(p.c_message[0], 'x');
    cr_assert_str_eq(p.c_message + n - 8, "xx\nTAIL\n");
    /* another path cannot be mounted here: no variable, no file, so the
     * fallback's log tail (which shows the variable was unset) */
    await_pod(&s, "elsewhere", "Failed", 15, &p);
    cr_assert_str_eq(p.c_message, "var=none\n");
    /* each instance appends to its own fresh file: the restarted one's
     * message (lastState once it is backing off) is one "inst", not two */
    await_pod(&s, "fresh", "CrashLoopBackOff", 20, &p);
    cr_assert_geq(p.restarts, 1);
    cr_assert_eq(p.last_exit_code, 4);
    kubectl_ok(&s, "get pod fresh -o jsonpath={.status.containerStatuses[0].lastState.terminated.message}", NULL, out,
               sizeof out);
    cr_assert_str_eq(out, "inst");
    /* four containers share 12 KiB: each message is cut to 3072 bytes */
    await_pod(&s, "four", "Succeeded", 15, &p);
    rl_test_standin_pod(&s, "default", "four", "c1", &p);
    cr_assert_eq(strlen(p.c_message), 3072, "message of %zu bytes", strlen(p.c_message));
    cr_assert_eq(p.c_message[0], 'y');
    rl_test_standin_stop(&s);
}

/* limits.memory: the runtime's cgroup OOM-kills a container whose memory
 * goes over it. The stand-in polls the process group's memory instead; the
 * outcome must be the real one: the whole group killed, terminated reason
 * OOMKilled with exit code 137, then restartPolicy as for any exit. The
 * containers run python3 (Debian's, in /usr/bin on the containers' PATH)
 * to hold a known amount of memory; each sleeps 30 s after allocating, far
 * past the waits below, so only a kill can end them in time. */
Test(standin, kubelet_oom_killed_over_memory_limit, .timeout = 120) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[16384];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: hog}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, resources: {limits: {memory: 20Mi}},\n"
               "                command: [sh, -c, 'sleep 1000 & echo bg=$!; "
               "python3 -c \"x = bytearray(200 << 20); import time; time.sleep(30)\"']}]\n---\n"
               /* two processes of ~37 MiB each: under 48Mi alone, over it together */
               "apiVersion: v1\nkind: Pod\nmetadata: {name: pair}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, resources: {limits: {memory: 48Mi}},\n"
               "                env: [{name: A, value: 'x = bytearray(30 << 20); import time; time.sleep(30)'}],\n"
               "                command: [sh, -c, 'python3 -c \"$A\" & python3 -c \"$A\"; wait']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: again}\nspec:\n  restartPolicy: OnFailure\n"
               "  containers: [{name: main, image: busybox:1.36, resources: {limits: {memory: 20Mi}},\n"
               "                command: [python3, -c, 'x = bytearray(64 << 20); import time; time.sleep(30)']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: fits}\nspec:\n  restartPolicy: Never\n"
               "  containers: [{name: main, image: busybox:1.36, resources: {limits: {memory: 500Mi}},\n"
               "                command: [sh, -c, 'sleep 1; exit 0']}]\n",
               out, sizeof out);
    rl_test_pod p;
    int bg = logged_int(&s, "hog", "bg", 20);
    cr_assert_gt(bg, 0, "hog never printed its background pid");
    await_pod(&s, "hog", "Failed", 20, &p);
    cr_assert_str_eq(p.state, "terminated");
    cr_assert_str_eq(p.c_reason, "OOMKilled");
    cr_assert_eq(p.exit_code, 137);
    cr_assert_eq(p.restarts, 0);
    /* memory.oom.group: the background process went with the rest (the
     * kernel kills the group at once, but a loaded machine may reap the
     * pod's main process before that one is gone: a bounded wait) */
    for (double end = now_s() + 5; now_s() < end && alive(bg);) usleep(20000);
    cr_assert(!alive(bg), "the group's other process %d survived", bg);
    /* the group's processes are summed, not judged one by one */
    await_pod(&s, "pair", "Failed", 20, &p);
    cr_assert_str_eq(p.c_reason, "OOMKilled");
    cr_assert_eq(p.exit_code, 137);
    /* OnFailure: restarted, and the killed instance is lastState */
    await_pod(&s, "again", "CrashLoopBackOff", 30, &p);
    cr_assert_geq(p.restarts, 1);
    cr_assert_eq(p.last_exit_code, 137);
    kubectl_ok(&s, "get pod again -o jsonpath={.status.containerStatuses[0].lastState.terminated.reason}", NULL, out,
               sizeof out);
    cr_assert_str_eq(out, "OOMKilled");
    /* under its limit: measured, never killed */
    await_pod(&s, "fits", "Succeeded", 20, &p);
    cr_assert_str_eq(p.c_reason, "Completed");
    cr_assert_eq(p.exit_code, 0);
    /* kubectl's view: the printer's STATUS is the terminated reason */
    kubectl_ok(&s, "get pod hog", NULL, out, sizeof out);
    cr_assert(strstr(out, "OOMKilled"), "%s", out);
    rl_test_standin_stop(&s);
}

/* Graceful deletion: SIGTERM to a container that handles it, which exits,
 * and the pod goes then; one that ignores it is SIGKILLed (with the rest of
 * its process group) after the grace period. */
Test(standin, kubelet_graceful_delete, .timeout = 40) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[8192];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: term}\nspec:\n  terminationGracePeriodSeconds: 10\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, "
               "'trap \"echo got-TERM; exit 0\" TERM; echo pid=$$$$; while :; do sleep 0.1; done']}]\n---\n"
               "apiVersion: v1\nkind: Pod\nmetadata: {name: stubborn}\nspec:\n  terminationGracePeriodSeconds: 1\n"
               "  containers: [{name: main, image: busybox:1.36, command: [sh, -c, "
               "'trap \"\" TERM; sleep 1000 & echo bg=$!; echo pid=$$$$; while :; do sleep 0.1; done']}]\n",
               out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "term", "Running", 10, &p);
    cr_assert(p.ready, "Ready while running (no probes)");
    char uid[64], logp[512], log[4096];
    snprintf(uid, sizeof uid, "%s", p.uid);
    int pid = logged_int(&s, "term", "pid", 5);
    cr_assert_gt(pid, 0);
    double t0 = now_s();
    kubectl_ok(&s, "delete pod term", NULL, out, sizeof out);
    cr_assert_lt(now_s() - t0, 5.0, "gone when its process exits, not after the 10 s grace");
    cr_assert(!alive(pid));
    snprintf(logp, sizeof logp, "%s/pods/default_term_%s/logs/main/0.log", s.dir, uid);
    slurp(logp, log, sizeof log);
    cr_assert(strstr(log, "got-TERM"), "SIGTERM was not seen: %s", log);

    await_pod(&s, "stubborn", "Running", 10, &p);
    int bg = logged_int(&s, "stubborn", "bg", 5), main_pid = logged_int(&s, "stubborn", "pid", 5);
    cr_assert(bg > 0 && main_pid > 0);
    cJSON *j;
    t0 = now_s();
    cr_assert_eq(api(&s, "DELETE", "/api/v1/namespaces/default/pods/stubborn", NULL, NULL, &j), 200);
    cr_assert(jstr(j, "metadata.deletionTimestamp"));
    cJSON_Delete(j);
    cr_assert_eq(rl_test_standin_pod(&s, "default", "stubborn", NULL, &p), 0);
    cr_assert(p.exists && p.deleting && !strcmp(p.state, "running"), "terminating, still running");
    await_pod(&s, "stubborn", "gone", 6, &p);
    double took = now_s() - t0;
    cr_assert(took > 0.9 && took < 4.0, "SIGKILL after the 1 s grace, took %.2f s", took);
    cr_assert(!alive(main_pid) && !alive(bg), "the container's processes outlived it");
    rl_test_standin_stop(&s);
}

/* Kubelet eviction (node pressure): processes killed, Failed/Evicted with
 * DisruptionTarget, the pod object stays. */
Test(standin, kubelet_eviction, .timeout = 30) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[8192];
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: ev}\n"
               "spec: {containers: [{name: main, image: busybox:1.36, command: [sh, -c, "
               "'echo pid=$$$$; while :; do sleep 0.1; done']}]}\n",
               out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "ev", "Running", 10, &p);
    int pid = logged_int(&s, "ev", "pid", 5);
    cr_assert_gt(pid, 0);
    const char *msg = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 20Mi. ";
    cr_assert_eq(rl_test_standin_evict(&s, "default", "ev", msg), 200);
    await_pod(&s, "ev", "Evicted", 10, &p);
    cr_assert_str_eq(p.phase, "Failed", "Failed from the eviction's first status write on");
    await_pod(&s, "ev", "Error", 10, &p); /* then the container's end */
    cr_assert_str_eq(p.reason, "Evicted");
    cr_assert_str_eq(p.message, msg);
    cr_assert(p.disruption, "condition DisruptionTarget (TerminationByKubelet)");
    cr_assert_str_eq(p.state, "terminated");
    cr_assert_eq(p.exit_code, 137);
    cr_assert(!alive(pid));
    cJSON *j;
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/ev", NULL, NULL, &j), 200);
    const cJSON *c;
    int dt = 0;
    cJSON_ArrayForEach(c, jget(j, "status.conditions")) if (!strcmp(jstr(c, "type"), "DisruptionTarget")) {
        cr_assert_str_eq(jstr(c, "reason"), "TerminationByKubelet");
        dt = 1;
    }
    cr_assert(dt);
    cJSON_Delete(j);
    cr_assert_eq(rl_test_standin_evict(&s, "default", "ev", NULL), 409, "evicting a finished pod");
    rl_test_standin_stop(&s);
}

/* The node's capacity: a pod beyond --max-pods stays Pending, Unschedulable
 * with the scheduler's message, and is bound when room frees up; a
 * nodeSelector the node cannot meet. */
Test(standin, kubelet_unschedulable, .timeout = 40) {
    static rl_test_standin s;
    start_kubelet(&s, 1);
    static char out[8192];
    const char *pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\n"
                      "spec: {containers: [{name: main, image: busybox:1.36, command: [sh, -c, "
                      "'trap \"exit 0\" TERM; while :; do sleep 0.1; done']}]}\n";
    char y[512];
    snprintf(y, sizeof y, pod, "first");
    kubectl_ok(&s, "apply -f -", y, out, sizeof out);
    rl_test_pod p;
    await_pod(&s, "first", "Running", 10, &p);
    snprintf(y, sizeof y, pod, "second");
    kubectl_ok(&s, "apply -f -", y, out, sizeof out);
    await_pod(&s, "second", "Unschedulable", 10, &p);
    cr_assert_str_eq(p.sched_message, "0/1 nodes are available: 1 Too many pods. preemption: 0/1 nodes are available: "
                                      "1 No preemption victims found for incoming pod.");
    cr_assert_str_eq(p.phase, "Pending");
    cr_assert_str_eq(p.node, "");
    kubectl_ok(&s, "delete pod first", NULL, out, sizeof out);
    await_pod(&s, "second", "Running", 10, &p);
    cr_assert_str_eq(p.node, "standin-node");
    cr_assert_eq(p.scheduled, 1);
    cr_assert_eq(rl_test_standin_set_max_pods(&s, -1), 200);
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: gpu}\n"
               "spec: {nodeSelector: {pool: gpu}, containers: [{name: main, image: busybox:1.36, command: [sh]}]}\n",
               out, sizeof out);
    await_pod(&s, "gpu", "Unschedulable", 10, &p);
    cr_assert_str_eq(p.sched_message, "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
                                      "preemption: 0/1 nodes are available: 1 Preemption is not helpful for "
                                      "scheduling.");
    double t0 = now_s();
    kubectl_ok(&s, "delete pod gpu", NULL, out, sizeof out);
    cr_assert_lt(now_s() - t0, 3.0, "an unscheduled pod goes at once");
    rl_test_standin_stop(&s);
}

/* No container outlives the stand-in: stopped, it kills them; SIGKILLed,
 * PR_SET_PDEATHSIG takes the main process and the reaper its group. */
Test(standin, kubelet_no_orphans, .timeout = 40) {
    static rl_test_standin s;
    static char out[8192];
    const char *y = "apiVersion: v1\nkind: Pod\nmetadata: {name: o}\n"
                    "spec: {containers: [{name: main, image: busybox:1.36, command: [sh, -c, "
                    "'sleep 1000 & echo bg=$!; echo pid=$$$$; while :; do sleep 0.1; done']}]}\n";
    for (int round = 0; round < 2; round++) {
        start_kubelet(&s, 0);
        kubectl_ok(&s, "apply -f -", y, out, sizeof out);
        rl_test_pod p;
        await_pod(&s, "o", "Running", 10, &p);
        int bg = logged_int(&s, "o", "bg", 5), pid = logged_int(&s, "o", "pid", 5);
        cr_assert(bg > 0 && pid > 0);
        if (round == 0) {
            rl_test_standin_stop(&s);
        } else {
            kill(s.pid, SIGKILL);
            waitpid(s.pid, NULL, 0);
            s.pid = -1;
        }
        double end = now_s() + 5;
        while (now_s() < end && (alive(pid) || alive(bg))) usleep(20000);
        cr_assert(!alive(pid) && !alive(bg), "round %d: pod processes outlived the stand-in", round);
        if (round == 1) rl_test_standin_stop(&s); /* the dir */
        fini();
    }
}

/* ---- Pod Security admission -------------------------------------------------------- */
#define PSA_BARE "apiVersion: v1\nkind: Pod\nmetadata: {name: bare}\nspec: {containers: [{name: c, image: i}]}\n"
#define PSA_OK                                                                                                  \
    "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec:\n"                                                \
    "  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}\n"      \
    "  volumes: [{name: t, emptyDir: {}}]\n"                                                                    \
    "  containers: [{name: c, image: i, volumeMounts: [{name: t, mountPath: /tmp}], securityContext:\n"        \
    "    {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true,\n"                                      \
    "     capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}}]\n"
#define PSA_HOSTILE                                                                                              \
    "apiVersion: v1\nkind: Pod\nmetadata: {name: hostile}\nspec:\n  hostNetwork: true\n  hostPID: true\n"      \
    "  securityContext: {runAsUser: 0, seccompProfile: {type: Unconfined}}\n"                                   \
    "  volumes: [{name: h, hostPath: {path: /}}, {name: nf, nfs: {server: nfs, path: /}}]\n"                     \
    "  containers:\n  - {name: a, image: i, ports: [{containerPort: 80, hostPort: 80}], securityContext:\n"    \
    "      {privileged: true, runAsNonRoot: false, capabilities: {add: [NET_ADMIN, CHOWN]}}}\n"                   \
    "  - {name: b, image: i, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}\n"

/* The 403 of a pod create in namespace ns (kubectl apply prints the API's message). */
static void psa_refused(rl_test_standin *s, const char *ns, const char *yaml, const char *want) {
    char args[128];
    static char out[8192];
    snprintf(args, sizeof args, "apply -n %s -f -", ns);
    cr_assert_neq(rl_test_kubectl(s, args, yaml, out, sizeof out), 0, "admitted in %s: %s", ns, out);
    cr_assert(strstr(out, "Error from server (Forbidden)") && strstr(out, want), "in %s:\n%s\nwant:\n%s", ns, out,
              want);
}

static void psa_admitted(rl_test_standin *s, const char *ns, const char *yaml) {
    char args[128];
    static char out[8192];
    snprintf(args, sizeof args, "apply -n %s -f -", ns);
    kubectl_ok(s, args, yaml, out, sizeof out);
    cr_assert_null(strstr(out, "Warning"), "%s", out);
}

/* PodSecurity at enforce=restricted / baseline / privileged and warn: the
 * real 403 messages, check by check in the plugin's order; a compliant
 * pod (the operator's securityContext) admitted. */
Test(standin, pod_security_admission, .timeout = 60) {
    static rl_test_standin s;
    start(&s, NULL);
    static char out[8192];
    kubectl_ok(&s, "create ns r", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns r pod-security.kubernetes.io/enforce=restricted", NULL, out, sizeof out);
    psa_refused(&s, "r", PSA_BARE,
                "pods \"bare\" is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != "
                "false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), unrestricted "
                "capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != "
                "true (pod or container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or "
                "container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")\n");
    psa_refused(&s, "r", PSA_HOSTILE,
                "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"a\" must "
                "set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"a\" must "
                "set securityContext.capabilities.drop=[\"ALL\"]; container \"a\" must not include \"NET_ADMIN\", "
                "\"CHOWN\" in securityContext.capabilities.add), host namespaces (hostNetwork=true, hostPID=true), "
                "hostPath volumes (volume \"h\"), hostPort (container \"a\" uses hostPort 80), privileged (container "
                "\"a\" must not set securityContext.privileged=true), restricted volume types (volumes \"h\", \"nf\" "
                "use restricted volume types \"hostPath\", \"nfs\"), runAsNonRoot != true (container \"a\" must not set "
                "securityContext.runAsNonRoot=false; pod or container \"b\" must set securityContext.runAsNonRoot=true), "
                "runAsUser=0 (pod must not set runAsUser=0), seccompProfile (pod "
                "must not set securityContext.seccompProfile.type to \"Unconfined\")\n");
    psa_admitted(&s, "r", PSA_OK);
    /* the wire: 403 Forbidden Status naming the pod */
    cJSON *j;
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/r/pods", NULL,
                     "{\"metadata\":{\"name\":\"raw\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}", &j),
                 403);
    assert_status(j, 403, "Forbidden");
    cr_assert_str_eq(jstr(j, "details.name"), "raw");
    cr_assert_str_eq(jstr(j, "details.kind"), "pods");
    cJSON_Delete(j);
    /* a pinned version names it; baseline allows what restricted adds */
    kubectl_ok(&s, "create ns b", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns b pod-security.kubernetes.io/enforce=baseline pod-security.kubernetes.io/enforce-version=v1.30",
               NULL, out, sizeof out);
    psa_admitted(&s, "b", PSA_BARE);
    psa_refused(&s, "b", PSA_HOSTILE,
                "pods \"hostile\" is forbidden: violates PodSecurity \"baseline:v1.30\": non-default capabilities "
                "(container \"a\" must not include \"NET_ADMIN\" in securityContext.capabilities.add), host namespaces "
                "(hostNetwork=true, hostPID=true), hostPath volumes (volume \"h\"), hostPort (container \"a\" uses "
                "hostPort 80), privileged (container \"a\" must not set securityContext.privileged=true), seccompProfile "
                "(pod must not set securityContext.seccompProfile.type to \"Unconfined\")\n");
    /* privileged, and no label at all: no checks */
    kubectl_ok(&s, "create ns p", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns p pod-security.kubernetes.io/enforce=privileged", NULL, out, sizeof out);
    psa_admitted(&s, "p", PSA_HOSTILE);
    psa_admitted(&s, "default", PSA_HOSTILE);
    /* warn: admitted, with kubectl's Warning line */
    kubectl_ok(&s, "create ns w", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns w pod-security.kubernetes.io/warn=restricted", NULL, out, sizeof out);
    kubectl_ok(&s, "apply -n w -f -", PSA_BARE, out, sizeof out);
    cr_assert(strstr(out, "Warning: would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false"),
              "%s", out);
    cr_assert(strstr(out, "pod/bare created"), "%s", out);
    /* a label added later applies to the next create */
    kubectl_ok(&s, "label ns w pod-security.kubernetes.io/enforce=restricted", NULL, out, sizeof out);
    psa_refused(&s, "w", "apiVersion: v1\nkind: Pod\nmetadata: {name: late}\nspec: {containers: [{name: c, image: i}]}\n",
                "pods \"late\" is forbidden: violates PodSecurity \"restricted:latest\"");
    rl_test_standin_stop(&s);
}

/* ---- sidecars: Istio's injection, statuses sorted by name ----------------------------- */
#define MESHED(name, labels, cmd)                                                                                \
    "apiVersion: v1\nkind: Pod\nmetadata: {name: " name ", labels: {" labels "}}\nspec:\n"                     \
    "  restartPolicy: Never\n"                                                                                  \
    "  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}\n"      \
    "  containers: [{name: worker, image: busybox:1.36, command: [sh, -c, '" cmd "'], securityContext:\n"      \
    "    {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}]\n"

static void pod_jsonpath(rl_test_standin *s, const char *ns, const char *pod, const char *path, char *out, size_t n) {
    char args[512];
    snprintf(args, sizeof args, "get pod %s -n %s -o jsonpath='%s'", pod, ns, path);
    kubectl_ok(s, args, NULL, out, n);
}

/* A namespace labelled istio-injection=enabled: pods get the istio-proxy
 * container (it passes restricted), unless they opt out; the kubelet runs
 * it (a built-in image that waits for SIGTERM) and sorts containerStatuses
 * by name, so istio-proxy comes before worker; the worker's exit leaves the
 * pod Running while the proxy runs; a delete stops both. */
Test(standin, sidecar_injection_and_sorted_statuses, .timeout = 90) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[16384];
    kubectl_ok(&s, "create ns mesh", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns mesh istio-injection=enabled pod-security.kubernetes.io/enforce=restricted", NULL, out,
               sizeof out);
    kubectl_ok(&s, "apply -n mesh -f -", MESHED("meshed", "app: x", "sleep 1; exit 3"), out, sizeof out);
    kubectl_ok(&s, "apply -n mesh -f -", MESHED("optout", "sidecar.istio.io/inject: 'false'", "exit 0"), out,
               sizeof out);
    kubectl_ok(&s, "apply -f -", MESHED("plain", "app: x", "exit 0"), out, sizeof out);
    pod_jsonpath(&s, "mesh", "meshed", "{.spec.containers[*].name}", out, sizeof out);
    cr_assert_str_eq(out, "worker istio-proxy");
    pod_jsonpath(&s, "mesh", "meshed", "{.metadata.annotations.sidecar\\.istio\\.io/status}", out, sizeof out);
    cr_assert(strstr(out, "\"containers\":[\"istio-proxy\"]"), "%s", out);
    pod_jsonpath(&s, "mesh", "optout", "{.spec.containers[*].name}", out, sizeof out);
    cr_assert_str_eq(out, "worker");
    pod_jsonpath(&s, "default", "plain", "{.spec.containers[*].name}", out, sizeof out);
    cr_assert_str_eq(out, "worker");
    /* the worker ends, the proxy runs on: the pod stays Running */
    rl_test_pod p;
    int rc = rl_test_standin_await_pod(&s, "mesh", "meshed", "worker", "Error", 30, &p);
    cr_assert_eq(rc, 0, "worker never ended: %s %s", p.state, p.c_reason);
    cr_assert_eq(p.exit_code, 3);
    cr_assert_str_eq(p.phase, "Running");
    cr_assert(!p.ready);
    cr_assert_eq(rl_test_standin_pod(&s, "mesh", "meshed", "istio-proxy", &p), 0);
    cr_assert_str_eq(p.state, "running");
    pod_jsonpath(&s, "mesh", "meshed", "{.status.containerStatuses[*].name}", out, sizeof out);
    cr_assert_str_eq(out, "istio-proxy worker", "sorted by name as the kubelet does");
    kubectl_ok(&s, "get pod meshed -n mesh", NULL, out, sizeof out);
    cr_assert(strstr(out, "1/2") && strstr(out, "Error"), "the printer shows the ended container: %s", out);
    /* deleted: SIGTERM to the proxy, which exits 0, and the pod goes */
    kubectl_ok(&s, "delete pod meshed -n mesh --wait=false", NULL, out, sizeof out);
    rc = rl_test_standin_await_pod(&s, "mesh", "meshed", NULL, "gone", 30, &p);
    cr_assert_eq(rc, 0, "the proxy kept the pod: %s %s", p.phase, p.state);
    rl_test_standin_stop(&s);
}

/* Istio's native-sidecar mode (annotation sidecar.istio.io/nativeSidecar):
 * istio-proxy is an init container with restartPolicy Always; the kubelet
 * starts it first, reports it in initContainerStatuses, counts it in
 * READY, and stops it once the worker ended, so the pod completes with the
 * worker's phase. */
Test(standin, native_sidecar_stopped_after_the_worker, .timeout = 90) {
    static rl_test_standin s;
    start_kubelet(&s, 0);
    static char out[16384];
    kubectl_ok(&s, "create ns mesh", NULL, out, sizeof out);
    kubectl_ok(&s, "label ns mesh istio-injection=enabled", NULL, out, sizeof out);
    kubectl_ok(&s, "apply -n mesh -f -",
               "apiVersion: v1\nkind: Pod\nmetadata: {name: native, annotations: {sidecar.istio.io/nativeSidecar: 'true'}}\n"
               "spec:\n  restartPolicy: Never\n"
               "  containers: [{name: worker, image: busybox:1.36, command: [sh, -c, 'sleep 2; exit 0']}]\n",
               out, sizeof out);
    pod_jsonpath(&s, "mesh", "native", "{.spec.containers[*].name} {.spec.initContainers[0].name} "
                 "{.spec.initContainers[0].restartPolicy}", out, sizeof out);
    cr_assert_str_eq(out, "worker istio-proxy Always");
    rl_test_pod p;
    int rc = rl_test_standin_await_pod(&s, "mesh", "native", "worker", "Running", 30, &p);
    cr_assert_eq(rc, 0, "never Running: %s %s", p.phase, p.c_reason);
    pod_jsonpath(&s, "mesh", "native", "{.status.initContainerStatuses[0].name} {.status.initContainerStatuses[0].started}",
                 out, sizeof out);
    cr_assert_str_eq(out, "istio-proxy true");
    rc = rl_test_standin_await_pod(&s, "mesh", "native", "worker", "Succeeded", 30, &p);
    cr_assert_eq(rc, 0, "the sidecar kept the pod from completing: %s %s", p.phase, p.state);
    cr_assert_eq(p.exit_code, 0);
    /* the phase follows the regular containers, as the kubelet computes it:
     * the sidecar's stop is reported a moment later (a loaded machine saw
     * Succeeded before it) */
    for (int i = 0; i < 150; i++) {
        pod_jsonpath(&s, "mesh", "native", "{.status.initContainerStatuses[0].state.terminated.exitCode}", out,
                     sizeof out);
        if (*out) break;
        usleep(200000);
    }
    cr_assert_str_eq(out, "0", "the proxy got SIGTERM and exited 0");
    kubectl_ok(&s, "get pod native -n mesh", NULL, out, sizeof out);
    cr_assert(strstr(out, "0/2") && strstr(out, "Completed"), "%s", out);
    rl_test_standin_stop(&s);
}

/* ---- RBAC for service accounts --------------------------------------------------------- */
static const char *RBAC =
    "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: w}\n---\n"
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: w}\nrules:\n"
    "- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, update, patch,\n"
    "   create], resourceNames: [job-leader]}\n"
    "- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: ['*']}\n---\n"
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: w}\n"
    "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: w}\n"
    "subjects: [{kind: ServiceAccount, name: w}]\n---\n"
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: logs}\nrules:\n"
    "- {apiGroups: [''], resources: [pods/log], verbs: [get]}\n---\n"
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: logs}\n"
    "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: logs}\n"
    "subjects: [{kind: Group, name: 'system:serviceaccounts:default'}]\n---\n"
    "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: job-leader}\nspec: {holderIdentity: a}\n---\n"
    "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: other}\nspec: {holderIdentity: a}\n";

Test(standin, rbac_service_accounts, .timeout = 60) {
    static rl_test_standin s;
    start(&s, NULL);
    static char out[16384];
    kubectl_ok(&s, "apply -f -", RBAC, out, sizeof out);
    char tok[512], args[1024];
    cr_assert_eq(rl_test_standin_sa_token(&s, "default", "w", tok, sizeof tok), 0);
    membuf m;
    /* resourceNames: the named Lease only */
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/job-leader", NULL, &m, (reqopt){.tok = tok}), 200, "%s", m.buf);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "PATCH", LEASES "/job-leader", "{\"spec\":{\"holderIdentity\":\"w\"}}", &m,
                         (reqopt){.tok = tok, .ctype = "application/merge-patch+json"}),
                 200, "%s", m.buf);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/other", NULL, &m, (reqopt){.tok = tok}), 403);
    cJSON *j = cJSON_Parse(m.buf);
    assert_status(j, 403, "Forbidden");
    cr_assert_str_eq(jstr(j, "message"),
                     "leases.coordination.k8s.io \"other\" is forbidden: User \"system:serviceaccount:default:w\" "
                     "cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\"");
    cJSON_Delete(j);
    mb_free(&m);
    /* a list carries no name: refused; narrowed by fieldSelector metadata.name it carries one */
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES, NULL, &m, (reqopt){.tok = tok}), 403);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "?fieldSelector=metadata.name%3Djob-leader", NULL, &m, (reqopt){.tok = tok}),
                 200, "%s", m.buf);
    mb_free(&m);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3Dother", NULL, &m,
                         (reqopt){.tok = tok}),
                 403);
    mb_free(&m);
    /* create carries no name either: a rule with resourceNames never allows it,
     * even for a name it lists */
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "POST", LEASES, "{\"metadata\":{\"name\":\"job-leader\"}}", &m, (reqopt){.tok = tok}), 403);
    j = cJSON_Parse(m.buf);
    cr_assert_str_eq(jstr(j, "message"),
                     "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:default:w\" cannot create "
                     "resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\"");
    cJSON_Delete(j);
    mb_free(&m);
    /* verbs '*' */
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?watch=1&timeoutSeconds=1",
                         NULL, &m, (reqopt){.tok = tok}),
                 200);
    mb_free(&m);
    /* the same through kubectl: --token, and auth can-i (SelfSubjectAccessReview) as the account */
    snprintf(args, sizeof args, "--token=%s get lease job-leader -o name", tok);
    kubectl_ok(&s, args, NULL, out, sizeof out);
    cr_assert_str_eq(out, "lease.coordination.k8s.io/job-leader\n");
    snprintf(args, sizeof args, "--token=%s delete lease other", tok);
    cr_assert_neq(rl_test_kubectl(&s, args, NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "cannot delete resource \"leases\""), "%s", out);
    struct {
        const char *q, *want;
    } can[] = {{"update lease/job-leader", "yes"}, {"update lease/other", "no"}, {"create leases", "no"},
               {"list endpointslices.discovery.k8s.io", "yes"}, {"get pods --subresource=log", "yes"},
               {"get pods", "no"}};
    for (size_t i = 0; i < sizeof can / sizeof can[0]; i++) {
        snprintf(args, sizeof args, "auth can-i %s --as=system:serviceaccount:default:w", can[i].q);
        rl_test_kubectl(&s, args, NULL, out, sizeof out);
        cr_assert(!strncmp(out, can[i].want, strlen(can[i].want)), "can-i %s: %s", can[i].q, out);
    }
    /* kubectl create token (TokenRequest) gives a working token too */
    kubectl_ok(&s, "create token w", NULL, out, sizeof out);
    out[strcspn(out, "\n")] = '\0';
    cr_assert_lt(strlen(out), 512);
    snprintf(args, sizeof args, "--token=%.512s get lease job-leader -o name", out);
    kubectl_ok(&s, args, NULL, out, sizeof out);
    /* a rule without resourceNames is what allows create */
    kubectl_ok(&s, "apply -f -",
               "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: w}\nrules:\n"
               "- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, update, patch],\n"
               "   resourceNames: [job-leader]}\n"
               "- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}\n",
               out, sizeof out);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "POST", LEASES, "{\"metadata\":{\"name\":\"new\"}}", &m, (reqopt){.tok = tok}), 201, "%s",
                 m.buf);
    mb_free(&m);
    /* a binding to a missing role: refused, and the reason says so */
    kubectl_ok(&s, "apply -f -",
               "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: lost}\n---\n"
               "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: lost}\n"
               "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: nope}\n"
               "subjects: [{kind: ServiceAccount, name: lost}]\n",
               out, sizeof out);
    cr_assert_eq(rl_test_standin_sa_token(&s, "default", "lost", tok, sizeof tok), 0);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/other", NULL, &m, (reqopt){.tok = tok}), 403);
    cr_assert(strstr(m.buf, ": RBAC: role.rbac.authorization.k8s.io \\\"nope\\\" not found"), "%s", m.buf);
    mb_free(&m);
    /* deleting the service account invalidates its tokens */
    kubectl_ok(&s, "delete sa lost", NULL, out, sizeof out);
    mb_init(&m);
    cr_assert_eq(api_opt(&s, "GET", LEASES "/other", NULL, &m, (reqopt){.tok = tok}), 401);
    mb_free(&m);
    /* a pod needs its service account to exist (admission) */
    cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/pods", NULL,
                     "{\"metadata\":{\"name\":\"p\"},\"spec\":{\"serviceAccountName\":\"ghost\",\"containers\":"
                     "[{\"name\":\"c\",\"image\":\"i\"}]}}",
                     &j),
                 403);
    cr_assert_str_eq(jstr(j, "message"), "pods \"p\" is forbidden: error looking up service account default/ghost: "
                                         "serviceaccount \"ghost\" not found");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* ---- CRD structural schemas ------------------------------------------------------------ */
static const char *SCHEMA_CRD =
    "{\"apiVersion\":\"apiextensions.k8s.io/v1\",\"kind\":\"CustomResourceDefinition\","
    "\"metadata\":{\"name\":\"trainingjobs.ringleader.dev\"},\"spec\":{\"group\":\"ringleader.dev\","
    "\"scope\":\"Namespaced\",\"names\":{\"plural\":\"trainingjobs\",\"singular\":\"trainingjob\","
    "\"kind\":\"TrainingJob\",\"shortNames\":[\"tj\"]},\"versions\":[{\"name\":\"v1\",\"served\":true,"
    "\"storage\":true,\"schema\":{\"openAPIV3Schema\":{\"type\":\"object\",\"properties\":{"
    "\"spec\":{\"type\":\"object\",\"required\":[\"image\"],\"properties\":{"
    "\"image\":{\"type\":\"string\",\"minLength\":1},"
    "\"replicas\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":8,\"default\":1},"
    "\"cleanPodPolicy\":{\"type\":\"string\",\"enum\":[\"All\",\"Running\",\"None\"],\"default\":\"All\"},"
    "\"env\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"type\":\"object\",\"required\":[\"name\"],"
    "\"properties\":{\"name\":{\"type\":\"string\"},\"value\":{\"type\":\"string\"}}}},"
    "\"elastic\":{\"type\":\"object\",\"default\":{},\"properties\":{\"minReplicas\":{\"type\":\"integer\","
    "\"default\":1}}},"
    "\"port\":{\"x-kubernetes-int-or-string\":true},"
    "\"labels\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
    "\"training\":{\"type\":\"object\",\"x-kubernetes-preserve-unknown-fields\":true}}},"
    "\"status\":{\"type\":\"object\",\"properties\":{\"phase\":{\"type\":\"string\",\"enum\":[\"Pending\","
    "\"Running\"]},\"replicas\":{\"type\":\"integer\"},\"selector\":{\"type\":\"string\"}}}}}},"
    "\"subresources\":{\"status\":{},\"scale\":{\"specReplicasPath\":\".spec.replicas\","
    "\"statusReplicasPath\":\".status.replicas\",\"labelSelectorPath\":\".status.selector\"}},"
    "\"additionalPrinterColumns\":[{\"name\":\"Desired\",\"type\":\"integer\",\"jsonPath\":\".spec.replicas\"},"
    "{\"name\":\"Phase\",\"type\":\"string\",\"jsonPath\":\".status.phase\"}]}]}}";

#define TJS "/apis/ringleader.dev/v1/namespaces/default/trainingjobs"

Test(standin, crd_schema_prune_default_validate, .timeout = 60) {
    static rl_test_standin s;
    start(&s, NULL);
    static char out[16384];
    cJSON *j;
    /* a CRD without a schema is refused, as v1 requires one */
    cr_assert_eq(api(&s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", NULL,
                     "{\"metadata\":{\"name\":\"nos.ex.io\"},\"spec\":{\"group\":\"ex.io\",\"scope\":\"Namespaced\","
                     "\"names\":{\"plural\":\"nos\",\"kind\":\"No\"},\"versions\":[{\"name\":\"v1\",\"served\":true,"
                     "\"storage\":true}]}}",
                     &j),
                 422);
    cr_assert_str_eq(jstr(j, "message"), "CustomResourceDefinition.apiextensions.k8s.io \"nos.ex.io\" is invalid: "
                                         "spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required");
    cJSON_Delete(j);
    kubectl_ok(&s, "apply -f -", SCHEMA_CRD, out, sizeof out);
    cr_assert(await_code(&s, TJS, 200, 5));
    /* one error: the real message and cause */
    cr_assert_eq(api(&s, "POST", TJS, NULL,
                     "{\"apiVersion\":\"ringleader.dev/v1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"x\"},"
                     "\"spec\":{\"image\":\"a\",\"replicas\":-1}}",
                     &j),
                 422);
    assert_status(j, 422, "Invalid");
    cr_assert_str_eq(jstr(j, "message"), "TrainingJob.ringleader.dev \"x\" is invalid: spec.replicas: Invalid value: -1: "
                                         "spec.replicas in body should be greater than or equal to 0");
    cr_assert_str_eq(jstr(j, "details.kind"), "TrainingJob");
    cr_assert_str_eq(jstr(j, "details.group"), "ringleader.dev");
    const cJSON *cause = cJSON_GetArrayItem(jget(j, "details.causes"), 0);
    cr_assert_str_eq(jstr(cause, "reason"), "FieldValueInvalid");
    cr_assert_str_eq(jstr(cause, "field"), "spec.replicas");
    cr_assert_str_eq(jstr(cause, "message"), "Invalid value: -1: spec.replicas in body should be greater than or equal to 0");
    cJSON_Delete(j);
    /* several: [a, b, ...], one cause each */
    cr_assert_eq(api(&s, "POST", TJS, NULL,
                     "{\"apiVersion\":\"ringleader.dev/v1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"x\"},"
                     "\"spec\":{\"replicas\":9,\"cleanPodPolicy\":\"Bad\",\"env\":[{\"value\":1},{\"name\":\"a\"},"
                     "{\"name\":\"b\"}],\"labels\":{\"k\":true},\"port\":1.5}}",
                     &j),
                 422);
    const char *msg = jstr(j, "message");
    const char *head = "TrainingJob.ringleader.dev \"x\" is invalid: [";
    cr_assert(!strncmp(msg, head, strlen(head)) && msg[strlen(msg) - 1] == ']', "%s", msg);
    const char *parts[] = {
        "spec.image: Required value",
        "spec.replicas: Invalid value: 9: spec.replicas in body should be less than or equal to 8",
        "spec.cleanPodPolicy: Unsupported value: \"Bad\": supported values: \"All\", \"Running\", \"None\"",
        "spec.env: Too many: 3: must have at most 2 items",
        "spec.env[0].name: Required value",
        "spec.env[0].value: Invalid value: \"integer\": spec.env[0].value in body must be of type string: \"integer\"",
        "spec.labels.k: Invalid value: \"boolean\": spec.labels.k in body must be of type string: \"boolean\"",
        "spec.port: Invalid value: \"number\": spec.port in body must be of type integer,string: \"number\""};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) cr_assert(strstr(msg, parts[i]), "no [%s] in %s", parts[i], msg);
    cr_assert_eq(cJSON_GetArraySize(jget(j, "details.causes")), 8);
    cJSON_Delete(j);
    /* kubectl shows it the same way */
    cr_assert_neq(rl_test_kubectl(&s, "apply -f -",
                                  "apiVersion: ringleader.dev/v1\nkind: TrainingJob\nmetadata: {name: x}\n"
                                  "spec: {image: a, replicas: -1}\n",
                                  out, sizeof out),
                  0);
    cr_assert(strstr(out, "The TrainingJob \"x\" is invalid: spec.replicas: Invalid value: -1: spec.replicas in body "
                          "should be greater than or equal to 0"),
              "%s", out);
    /* kubectl validates strictly by default: an unknown field is a 400 */
    const char *unknown = "apiVersion: ringleader.dev/v1\nkind: TrainingJob\nmetadata: {name: x}\nextra: 1\n"
                          "spec: {image: a, foo: 1, training: {anything: {x: 1}}, labels: {k: v}}\n";
    cr_assert_neq(rl_test_kubectl(&s, "apply -f -", unknown, out, sizeof out), 0);
    cr_assert(strstr(out, "TrainingJob in version \"v1\" cannot be handled as a TrainingJob: strict decoding error: "
                          "unknown field \"extra\", unknown field \"spec.foo\""),
              "%s", out);
    /* warn: pruned, with warnings */
    kubectl_ok(&s, "apply --validate=warn -f -", unknown, out, sizeof out);
    cr_assert(strstr(out, "Warning: unknown field \"spec.foo\"") && strstr(out, "created"), "%s", out);
    /* pruned and defaulted, preserve-unknown-fields kept */
    kubectl_ok(&s, "get tj x -o json", NULL, out, sizeof out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_null(jget(j, "extra"));
    cr_assert_null(jget(j, "spec.foo"));
    cr_assert_eq((int)jnum(j, "spec.replicas"), 1);
    cr_assert_str_eq(jstr(j, "spec.cleanPodPolicy"), "All");
    cr_assert_eq((int)jnum(j, "spec.elastic.minReplicas"), 1, "a defaulted parent gets its children's defaults");
    cr_assert_eq((int)jnum(j, "spec.training.anything.x"), 1);
    cr_assert_str_eq(jstr(j, "spec.labels.k"), "v");
    cJSON_Delete(j);
    /* the status subresource validates status; the main endpoint ignores it */
    cr_assert_eq(api(&s, "PATCH", TJS "/x/status", "application/merge-patch+json", "{\"status\":{\"phase\":\"Bogus\"}}",
                     &j),
                 422);
    cr_assert_str_eq(jstr(j, "message"), "TrainingJob.ringleader.dev \"x\" is invalid: status.phase: Unsupported value: "
                                         "\"Bogus\": supported values: \"Pending\", \"Running\"");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", TJS "/x/status", "application/merge-patch+json",
                     "{\"status\":{\"phase\":\"Running\",\"replicas\":1,\"selector\":\"job=x\"}}", &j),
                 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", TJS "/x", "application/merge-patch+json", "{\"status\":{\"phase\":\"Pending\"}}", &j),
                 200);
    cr_assert_str_eq(jstr(j, "status.phase"), "Running");
    cJSON_Delete(j);
    /* scale through specReplicasPath: generation bumps, the schema's maximum holds */
    kubectl_ok(&s, "get tj x -o jsonpath={.metadata.generation}", NULL, out, sizeof out);
    int gen = atoi(out);
    kubectl_ok(&s, "scale tj x --replicas=3", NULL, out, sizeof out);
    kubectl_ok(&s, "get tj x -o jsonpath={.spec.replicas}/{.metadata.generation}", NULL, out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "3/%d", gen + 1);
    cr_assert_str_eq(out, want);
    cr_assert_neq(rl_test_kubectl(&s, "scale tj x --replicas=9", NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "spec.replicas in body should be less than or equal to 8"), "%s", out);
    cr_assert_eq(api(&s, "GET", TJS "/x/scale", NULL, NULL, &j), 200);
    cr_assert_eq((int)jnum(j, "status.replicas"), 1);
    cr_assert_str_eq(jstr(j, "status.selector"), "job=x");
    cJSON_Delete(j);
    /* CEL rules cannot be evaluated here: the CRD is served, with a warning in the log */
    cr_assert_eq(api(&s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", NULL,
                     "{\"metadata\":{\"name\":\"cels.ex.io\"},\"spec\":{\"group\":\"ex.io\",\"scope\":\"Namespaced\","
                     "\"names\":{\"plural\":\"cels\",\"kind\":\"Cel\"},\"versions\":[{\"name\":\"v1\",\"served\":true,"
                     "\"storage\":true,\"schema\":{\"openAPIV3Schema\":{\"type\":\"object\",\"x-kubernetes-validations\":"
                     "[{\"rule\":\"self.spec.a < 3\"}],\"properties\":{\"spec\":{\"type\":\"object\"}}}}}]}}",
                     &j),
                 201);
    cJSON_Delete(j);
    char logp[400];
    snprintf(logp, sizeof logp, "%s/standin.log", s.dir);
    static char logbuf[1 << 18];
    slurp(logp, logbuf, sizeof logbuf);
    cr_assert(strstr(logbuf, "x-kubernetes-validations (CEL) are not evaluated"), "no warning in the log");
    /* printer columns */
    kubectl_ok(&s, "get tj", NULL, out, sizeof out);
    cr_assert(strstr(out, "DESIRED") && strstr(out, "PHASE") && strstr(out, "Running") && strstr(out, " 3 "), "%s", out);
    /* ratcheting (on by default since 1.30): a stricter schema does not fail
     * updates that leave the now-invalid value alone, only ones that touch it */
    char crd2[8192];
    snprintf(crd2, sizeof crd2, "%s", SCHEMA_CRD);
    char *min = strstr(crd2, "\"minLength\":1");
    cr_assert(min);
    memcpy(min, "\"maxLength\":0", 13); /* image: at most 0 chars now */
    kubectl_ok(&s, "apply -f -", crd2, out, sizeof out);
    cr_assert_eq(api(&s, "PATCH", TJS "/x", "application/merge-patch+json", "{\"spec\":{\"replicas\":2}}", &j), 200);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "PATCH", TJS "/x", "application/merge-patch+json", "{\"spec\":{\"image\":\"b\"}}", &j), 422);
    cr_assert_str_eq(jstr(j, "message"), "TrainingJob.ringleader.dev \"x\" is invalid: spec.image: Too long: may not be "
                                         "more than 0 bytes");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* ---- nodes: the scheduler across them, evictions, PDBs, the autoscaler ------------------ */
#define LABEL_X "  labels: {app: x}\n"
#define ANTI_X                                                                                                 \
    "  affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: {matchLabels: " \
    "{app: x}}, topologyKey: kubernetes.io/hostname}]}}\n"
/* a controller the drain and the autoscaler count as replicated (no such object: nothing here needs it) */
#define RS_OWNER                                                                                               \
    "  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d9c, "                             \
    "uid: 6b0c5a8e-0d7e-4c59-9e76-3f1f0e7b2a10, controller: true}]\n"

/* A pod that runs until SIGTERM, then exits 0 (grace 5 s): more metadata and
 * spec lines as YAML, two-space indented (NULL: none). */
static void apply_pod(rl_test_standin *s, const char *name, const char *meta, const char *spec) {
    char y[4096];
    static char out[8192];
    snprintf(y, sizeof y,
             "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n%sspec:\n  terminationGracePeriodSeconds: 5\n%s"
             "  containers: [{name: c, image: busybox:1.36, command: [sh, -c, 'trap \"exit 0\" TERM; "
             "echo pid=$$$$; sleep 1000 & wait']}]\n",
             name, meta ? meta : "", spec ? spec : "");
    kubectl_ok(s, "apply -f -", y, out, sizeof out);
}

/* Poll until the pod's PodScheduled False message is `want` (it may pass through others). */
static void await_unschedulable(rl_test_standin *s, const char *name, const char *want, double secs) {
    rl_test_pod p;
    double end = now_s() + secs;
    do {
        if (rl_test_standin_pod(s, "default", name, NULL, &p) == 0 && p.scheduled == 0 &&
            !strcmp(p.sched_message, want))
            return;
        usleep(50000);
    } while (now_s() < end);
    cr_assert_fail("pod %s: PodScheduled %d \"%s\"\nwant \"%s\"", name, p.scheduled, p.sched_message, want);
}

static cJSON *get_node(rl_test_standin *s, const char *name) {
    char path[256];
    cJSON *j;
    snprintf(path, sizeof path, "/api/v1/nodes/%s", name);
    cr_assert_eq(api(s, "GET", path, NULL, NULL, &j), 200, "node %s", name);
    return j;
}

static const char *label_of(const cJSON *o, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(jget(o, "metadata.labels"), key));
}

/* The entry of a list (conditions, taints) whose `field` is `value`, or NULL. */
static const cJSON *item_with(const cJSON *list, const char *field, const char *value) {
    const cJSON *it;
    cJSON_ArrayForEach(it, list) if (jstr(it, field) && !strcmp(jstr(it, field), value)) return it;
    return NULL;
}

static int has_taint(rl_test_standin *s, const char *node, const char *key) {
    cJSON *j = get_node(s, node);
    int yes = item_with(jget(j, "spec.taints"), "key", key) != NULL;
    cJSON_Delete(j);
    return yes;
}

/* Several nodes: required anti-affinity, cordon, topology spread over zones,
 * node affinity, taints and tolerations, pod affinity; the Unschedulable
 * messages with a count per reason, as the real scheduler writes them. */
Test(standin, nodes_scheduler_across_nodes, .timeout = 90) {
    static rl_test_standin s;
    start_kubelet_with(&s, 0, "--nodes 3 --zones a,b");
    static char out[16384];
    kubectl_ok(&s, "get nodes -o wide", NULL, out, sizeof out);
    cr_assert(strstr(out, "standin-node ") && strstr(out, "standin-node-1 ") && strstr(out, "standin-node-2 "), "%s",
              out);
    cr_assert(strstr(out, "127.0.0.1") && strstr(out, "127.0.0.2") && strstr(out, "127.0.0.3"), "%s", out);
    int ready = 0;
    for (const char *at = out; (at = strstr(at, " Ready ")); at++) ready++;
    cr_assert_eq(ready, 3, "%s", out);
    cJSON *j = get_node(&s, "standin-node-1");
    cr_assert_str_eq(jstr(j, "status.allocatable.pods"), "110");
    cr_assert_str_eq(label_of(j, "kubernetes.io/hostname"), "standin-node-1");
    cr_assert_str_eq(label_of(j, "topology.kubernetes.io/zone"), "b");
    cr_assert_str_eq(jstr(item_with(jget(j, "status.conditions"), "type", "Ready"), "status"), "True");
    cJSON_Delete(j);

    /* required anti-affinity: one per node, a fourth nowhere */
    const char *xs[] = {"a1", "a2", "a3", "a4"};
    for (int i = 0; i < 4; i++) apply_pod(&s, xs[i], LABEL_X, ANTI_X);
    rl_test_pod p;
    const char *where[] = {"standin-node", "standin-node-1", "standin-node-2"};
    for (int i = 0; i < 3; i++) {
        await_pod(&s, xs[i], "Running", 20, &p);
        cr_assert_str_eq(p.node, where[i], "fewest pods first, then the name");
    }
    await_unschedulable(&s, "a4",
                        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. preemption: 0/3 "
                        "nodes are available: 3 No preemption victims found for incoming pod.",
                        15);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/a2", NULL, NULL, &j), 200);
    cr_assert_str_eq(jstr(j, "status.hostIP"), "127.0.0.2", "each node its own host IP");
    cJSON_Delete(j);

    /* cordon: unschedulable, and the node lifecycle controller's taint */
    kubectl_ok(&s, "cordon standin-node-1", NULL, out, sizeof out);
    cr_assert(strstr(out, "node/standin-node-1 cordoned"), "%s", out);
    kubectl_ok(&s, "get node standin-node-1", NULL, out, sizeof out);
    cr_assert(strstr(out, "Ready,SchedulingDisabled"), "%s", out);
    double end = now_s() + 10;
    while (now_s() < end && !has_taint(&s, "standin-node-1", "node.kubernetes.io/unschedulable")) usleep(50000);
    cr_assert(has_taint(&s, "standin-node-1", "node.kubernetes.io/unschedulable"));

    /* topology spread over the zones (a: standin-node and -2, b: -1): the
     * second pod must go to b, which is cordoned */
    const char *spread = "  topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, "
                         "whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: z}}}]\n";
    apply_pod(&s, "z1", "  labels: {app: z}\n", spread);
    await_pod(&s, "z1", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node");
    apply_pod(&s, "z2", "  labels: {app: z, nth: two}\n", spread);
    await_unschedulable(&s, "z2",
                        "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match pod topology "
                        "spread constraints. preemption: 0/3 nodes are available: 1 Preemption is not helpful for "
                        "scheduling, 2 No preemption victims found for incoming pod.",
                        15);
    kubectl_ok(&s, "uncordon standin-node-1", NULL, out, sizeof out);
    await_pod(&s, "z2", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node-1");

    /* required node affinity (In, NotIn) against a tainted node; a toleration */
    kubectl_ok(&s, "taint node standin-node-2 dedicated=gpu:NoSchedule", NULL, out, sizeof out);
    const char *aff = "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: "
                      "[{matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [a]}, "
                      "{key: kubernetes.io/hostname, operator: NotIn, values: [standin-node]}]}]}}}\n";
    apply_pod(&s, "n1", NULL, aff);
    await_unschedulable(&s, "n1",
                        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 node(s) didn't "
                        "match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is "
                        "not helpful for scheduling.",
                        15);
    char spec[1024];
    snprintf(spec, sizeof spec, "%s  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]\n",
             aff);
    apply_pod(&s, "n2", NULL, spec);
    await_pod(&s, "n2", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node-2");

    /* required pod affinity: where the pod labelled nth=two runs */
    apply_pod(&s, "pa", NULL,
              "  affinity: {podAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: "
              "{matchLabels: {nth: two}}, topologyKey: kubernetes.io/hostname}]}}\n");
    await_pod(&s, "pa", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node-1");
    rl_test_standin_stop(&s);
}

/* A spot interruption (admin reclaim): the node cordoned, tainted and
 * NotReady at once, its pods stopped by the kubelet's graceful node
 * shutdown (SIGTERM; Failed, Terminated, DisruptionTarget), the Node gone
 * after the notice and its pods with it (PodGC). A Node deleted under a
 * running pod: PodGC marks it Failed (DeletionByPodGC) and deletes it. */
Test(standin, nodes_spot_reclaim_and_podgc, .timeout = 60) {
    static rl_test_standin s;
    start_kubelet_with(&s, 0, "--nodes 3");
    static char out[16384];
    char spec[128];
    const char *names[] = {"stay", "spot", "orphan"};
    for (int i = 0; i < 3; i++) {
        snprintf(spec, sizeof spec, "  nodeSelector: {kubernetes.io/hostname: %s}\n",
                 i == 0 ? "standin-node" : i == 1 ? "standin-node-1" : "standin-node-2");
        apply_pod(&s, names[i], NULL, spec);
    }
    rl_test_pod p;
    for (int i = 0; i < 3; i++) await_pod(&s, names[i], "Running", 20, &p);
    int pid = logged_int(&s, "spot", "pid", 10), orphan = logged_int(&s, "orphan", "pid", 10);
    cr_assert(pid > 0 && orphan > 0);

    double t0 = now_s();
    cr_assert_eq(rl_test_standin_reclaim(&s, "standin-node-1", 4), 200);
    cr_assert_eq(rl_test_standin_reclaim(&s, "no-such-node", 1), 404);
    cJSON *j = get_node(&s, "standin-node-1");
    cr_assert(cJSON_IsTrue(jget(j, "spec.unschedulable")), "cordoned at once");
    cr_assert(item_with(jget(j, "spec.taints"), "key", "karpenter.sh/disrupted"));
    const cJSON *rc = item_with(jget(j, "status.conditions"), "type", "Ready");
    cr_assert_str_eq(jstr(rc, "status"), "False");
    cr_assert_str_eq(jstr(rc, "message"), "node is shutting down");
    cJSON_Delete(j);
    kubectl_ok(&s, "get node standin-node-1", NULL, out, sizeof out);
    cr_assert(strstr(out, "NotReady,SchedulingDisabled"), "%s", out);

    /* the kubelet's graceful node shutdown */
    await_pod(&s, "spot", "Completed", 10, &p); /* the container's own exit on SIGTERM */
    cr_assert_str_eq(p.phase, "Failed");
    cr_assert_str_eq(p.reason, "Terminated");
    cr_assert_str_eq(p.message, "Pod was terminated in response to imminent node shutdown.");
    cr_assert(p.disruption);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/spot", NULL, NULL, &j), 200);
    const cJSON *dt = item_with(jget(j, "status.conditions"), "type", "DisruptionTarget");
    cr_assert_str_eq(jstr(dt, "reason"), "TerminationByKubelet");
    cJSON_Delete(j);
    double end = now_s() + 5;
    while (now_s() < end && alive(pid)) usleep(20000);
    cr_assert(!alive(pid));

    /* after the notice: no node, and PodGC took its pod */
    end = now_s() + 15;
    while (now_s() < end && rl_test_standin_node_count(&s) != 2) usleep(50000);
    cr_assert_eq(rl_test_standin_node_count(&s), 2);
    cr_assert_geq(now_s() - t0, 3.8, "the node went before the notice ran out");
    cr_assert_neq(rl_test_kubectl(&s, "get node standin-node-1", NULL, out, sizeof out), 0);
    cr_assert(strstr(out, "NotFound"), "%s", out);
    await_pod(&s, "spot", "gone", 10, &p);
    await_pod(&s, "stay", "Running", 1, &p);

    /* the machine of a running pod lost: its processes die, PodGC fails and deletes it */
    kubectl_ok(&s, "delete node standin-node-2", NULL, out, sizeof out);
    await_pod(&s, "orphan", "gone", 10, &p);
    end = now_s() + 5;
    while (now_s() < end && alive(orphan)) usleep(20000);
    cr_assert(!alive(orphan), "a deleted node's processes outlived it");
    static char hist[1 << 16];
    cr_assert_eq(rl_test_standin_admin(&s, "GET", "/history?resource=pods&namespace=default&name=orphan", NULL, hist,
                                       sizeof hist),
                 200);
    j = cJSON_Parse(hist);
    int n = cJSON_GetArraySize(j);
    cr_assert_geq(n, 2);
    cr_assert_str_eq(jstr(cJSON_GetArrayItem(j, n - 1), "type"), "DELETED");
    const cJSON *last = jget(cJSON_GetArrayItem(j, n - 2), "object");
    cr_assert_str_eq(jstr(last, "status.phase"), "Failed");
    dt = item_with(jget(last, "status.conditions"), "type", "DisruptionTarget");
    cr_assert_str_eq(jstr(dt, "reason"), "DeletionByPodGC");
    cr_assert_str_eq(jstr(dt, "message"), "PodGC: node no longer exists");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* Running and Ready, as a kubelet would report it (no kubelet here). */
static void pod_running_ready(rl_test_standin *s, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/namespaces/default/pods/%s/status", name);
    cr_assert_eq(api(s, "PATCH", path, "application/merge-patch+json",
                     "{\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}",
                     NULL),
                 200);
}

/* The PDB once the disruption controller's status says these numbers (polled). */
static cJSON *await_pdb(rl_test_standin *s, const char *name, int gen, int expected, int healthy, int desired,
                        int allowed, double secs) {
    char path[256];
    snprintf(path, sizeof path, "/apis/policy/v1/namespaces/default/poddisruptionbudgets/%s", name);
    double end = now_s() + secs;
    cJSON *j = NULL;
    do {
        cJSON_Delete(j);
        cr_assert_eq(api(s, "GET", path, NULL, NULL, &j), 200);
        if (jnum(j, "status.observedGeneration") == gen && jnum(j, "status.expectedPods") == expected &&
            jnum(j, "status.currentHealthy") == healthy && jnum(j, "status.desiredHealthy") == desired &&
            jnum(j, "status.disruptionsAllowed") == allowed)
            return j;
        usleep(50000);
    } while (now_s() < end);
    char *txt = cJSON_PrintUnformatted(jget(j, "status"));
    cr_assert_fail("pdb %s status %s, want generation %d expected %d healthy %d desired %d allowed %d", name, txt, gen,
                   expected, healthy, desired, allowed);
    return NULL;
}

/* POST pods/NAME/eviction (grace < 0: no deleteOptions) with a token (NULL: the admin's). */
static long evict_pod(rl_test_standin *s, const char *name, const char *tok, int grace, cJSON **j) {
    char path[256], body[512], opts[96] = "";
    snprintf(path, sizeof path, "/api/v1/namespaces/default/pods/%s/eviction", name);
    if (grace >= 0) snprintf(opts, sizeof opts, ",\"deleteOptions\":{\"gracePeriodSeconds\":%d}", grace);
    snprintf(body, sizeof body,
             "{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{\"name\":\"%s\",\"namespace\":"
             "\"default\"}%s}",
             name, opts);
    membuf m;
    mb_init(&m);
    long code = api_opt(s, "POST", path, body, &m, (reqopt){.tok = tok});
    *j = cJSON_Parse(m.buf);
    cr_assert(*j != NULL, "eviction of %s -> %ld: %s", name, code, m.buf);
    mb_free(&m);
    return code;
}

static void assert_budget_refusal(const cJSON *j, const char *cause) {
    assert_status(j, 429, "TooManyRequests");
    cr_assert_str_eq(jstr(j, "message"), "Cannot evict pod as it would violate the pod's disruption budget.");
    const cJSON *c = cJSON_GetArrayItem(jget(j, "details.causes"), 0);
    cr_assert_str_eq(jstr(c, "reason"), "DisruptionBudget");
    cr_assert_str_eq(jstr(c, "message"), cause);
}

/* The disruption controller's PDB status (minAvailable, maxUnavailable as a
 * percentage of the controller's scale) and the eviction subresource: RBAC
 * pods/eviction, 201 and a graceful delete with DisruptionTarget, the real
 * 429, an unready pod under IfHealthyBudget and AlwaysAllow, two PDBs: 500. */
Test(standin, eviction_api_and_pdb_status, .timeout = 60) {
    static rl_test_standin s;
    start(&s, NULL);
    static char out[8192];
    cJSON *j;
    cr_assert_eq(api(&s, "POST", "/apis/apps/v1/namespaces/default/deployments", NULL,
                     "{\"metadata\":{\"name\":\"db\"},\"spec\":{\"replicas\":3,\"selector\":{\"matchLabels\":{\"app\":"
                     "\"db\"}},\"template\":{\"metadata\":{\"labels\":{\"app\":\"db\"}},\"spec\":{\"containers\":[{"
                     "\"name\":\"c\",\"image\":\"i\"}]}}}}",
                     &j),
                 201);
    char uid[64], body[1024], name[16];
    snprintf(uid, sizeof uid, "%s", jstr(j, "metadata.uid"));
    cJSON_Delete(j);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "db-%d", i);
        snprintf(body, sizeof body,
                 "{\"metadata\":{\"name\":\"%s\",\"labels\":{\"app\":\"db\"},\"ownerReferences\":[{\"apiVersion\":"
                 "\"apps/v1\",\"kind\":\"Deployment\",\"name\":\"db\",\"uid\":\"%s\",\"controller\":true}]},"
                 "\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}",
                 name, uid);
        cr_assert_eq(api(&s, "POST", "/api/v1/namespaces/default/pods", NULL, body, NULL), 201);
        pod_running_ready(&s, name);
    }
    kubectl_ok(&s, "apply -f -",
               "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: db}\n"
               "spec: {minAvailable: 2, selector: {matchLabels: {app: db}}}\n",
               out, sizeof out);
    j = await_pdb(&s, "db", 1, 3, 3, 2, 1, 10);
    const cJSON *c = item_with(jget(j, "status.conditions"), "type", "DisruptionAllowed");
    cr_assert_str_eq(jstr(c, "status"), "True");
    cr_assert_str_eq(jstr(c, "reason"), "SufficientPods");
    cr_assert_eq(jnum(c, "observedGeneration"), 1);
    cJSON_Delete(j);
    kubectl_ok(&s, "get pdb db", NULL, out, sizeof out);
    cr_assert(strstr(out, "MIN AVAILABLE") && strstr(out, "ALLOWED DISRUPTIONS") && strstr(out, "N/A"), "%s", out);

    /* RBAC: the subresource pods/eviction, verb create */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/tokens", "{\"token\":\"evictor\",\"user\":\"evictor\",\"rbac\":true}",
                                       NULL, 0),
                 200);
    cr_assert_eq(evict_pod(&s, "db-0", "evictor", 60, &j), 403);
    cr_assert_str_eq(jstr(j, "message"), "pods \"db-0\" is forbidden: User \"evictor\" cannot create resource "
                                         "\"pods/eviction\" in API group \"\" in the namespace \"default\"");
    cJSON_Delete(j);
    kubectl_ok(&s, "apply -f -",
               "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: evict}\n"
               "rules: [{apiGroups: [''], resources: [pods/eviction], verbs: [create]}]\n---\n"
               "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: evict}\n"
               "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: evict}\n"
               "subjects: [{kind: User, name: evictor}]\n",
               out, sizeof out);

    /* within the budget: 201 Success, a graceful delete with the Eviction's grace period */
    cr_assert_eq(evict_pod(&s, "db-0", "evictor", 60, &j), 201);
    cr_assert_str_eq(jstr(j, "kind"), "Status");
    cr_assert_str_eq(jstr(j, "status"), "Success");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/db-0", NULL, NULL, &j), 200);
    cr_assert(jstr(j, "metadata.deletionTimestamp"));
    cr_assert_eq(jnum(j, "metadata.deletionGracePeriodSeconds"), 60);
    c = item_with(jget(j, "status.conditions"), "type", "DisruptionTarget");
    cr_assert_str_eq(jstr(c, "status"), "True");
    cr_assert_str_eq(jstr(c, "reason"), "EvictionByEvictionAPI");
    cr_assert_str_eq(jstr(c, "message"), "Eviction API: evicting");
    cJSON_Delete(j);
    j = await_pdb(&s, "db", 1, 3, 2, 2, 0, 10);
    c = item_with(jget(j, "status.conditions"), "type", "DisruptionAllowed");
    cr_assert_str_eq(jstr(c, "status"), "False");
    cr_assert_str_eq(jstr(c, "reason"), "InsufficientPods");
    cJSON_Delete(j);

    /* over it: the real 429 */
    cr_assert_eq(evict_pod(&s, "db-1", NULL, -1, &j), 429);
    assert_budget_refusal(j, "The disruption budget db needs 2 healthy pods and has 2 currently");
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/db-1", NULL, NULL, &j), 200);
    cr_assert_null(jget(j, "metadata.deletionTimestamp"));
    cJSON_Delete(j);

    /* an unready pod: refused while the budget is short (IfHealthyBudget), let go with AlwaysAllow */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/pods/default/db-2/ready", "{\"ready\":false}", NULL, 0), 200);
    cJSON_Delete(await_pdb(&s, "db", 1, 3, 1, 2, 0, 10));
    cr_assert_eq(evict_pod(&s, "db-2", NULL, -1, &j), 429);
    assert_budget_refusal(j, "The disruption budget db needs 2 healthy pods and has 1 currently");
    cJSON_Delete(j);
    kubectl_ok(&s, "patch pdb db --type=merge -p '{\"spec\":{\"unhealthyPodEvictionPolicy\":\"AlwaysAllow\"}}'", NULL,
               out, sizeof out);
    cJSON_Delete(await_pdb(&s, "db", 2, 3, 1, 2, 0, 10));
    cr_assert_eq(evict_pod(&s, "db-2", NULL, -1, &j), 201);
    cJSON_Delete(j);
    cr_assert_eq(api(&s, "GET", "/api/v1/namespaces/default/pods/db-2", NULL, NULL, &j), 200);
    cr_assert_eq(jnum(j, "metadata.deletionGracePeriodSeconds"), 30, "the pod's own grace period");
    cJSON_Delete(j);

    /* maxUnavailable 50% of the controller's scale, rounded up; it follows the scale */
    kubectl_ok(&s, "apply -f -",
               "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: pct}\n"
               "spec: {maxUnavailable: 50%, selector: {matchLabels: {app: db}}}\n",
               out, sizeof out);
    cJSON_Delete(await_pdb(&s, "pct", 1, 3, 1, 1, 0, 10));
    cr_assert_eq(api(&s, "PATCH", "/apis/apps/v1/namespaces/default/deployments/db", "application/merge-patch+json",
                     "{\"spec\":{\"replicas\":4}}", NULL),
                 200);
    cJSON_Delete(await_pdb(&s, "pct", 1, 4, 1, 2, 0, 10));

    /* two budgets over one pod */
    cr_assert_eq(evict_pod(&s, "db-1", NULL, -1, &j), 500);
    assert_status(j, 500, "InternalError");
    cr_assert_str_eq(jstr(j, "message"), "Internal error occurred: This pod has more than one PodDisruptionBudget, "
                                         "which the eviction subresource does not support.");
    cJSON_Delete(j);

    /* the discovery entry kubectl drain looks for */
    cr_assert_eq(api(&s, "GET", "/api/v1", NULL, NULL, &j), 200);
    const cJSON *ev = item_with(jget(j, "resources"), "name", "pods/eviction");
    cr_assert(ev);
    cr_assert_str_eq(jstr(ev, "group"), "policy");
    cr_assert_str_eq(jstr(ev, "version"), "v1");
    cr_assert_str_eq(jstr(ev, "kind"), "Eviction");
    cJSON_Delete(j);
    rl_test_standin_stop(&s);
}

/* The real kubectl drain: cordon, list by spec.nodeName, evictions (protobuf)
 * retried on 429 until its timeout; with room in the budget, drained. */
Test(standin, kubectl_drain_honours_pdbs, .timeout = 90) {
    static rl_test_standin s;
    start_kubelet_with(&s, 0, "--nodes 2");
    static char out[16384];
    const char *on1 = "  nodeSelector: {kubernetes.io/hostname: standin-node-1}\n";
    apply_pod(&s, "w1", "  labels: {app: web}\n" RS_OWNER, on1);
    apply_pod(&s, "w2", "  labels: {app: web}\n" RS_OWNER, on1);
    apply_pod(&s, "k", NULL, "  nodeSelector: {kubernetes.io/hostname: standin-node}\n");
    kubectl_ok(&s, "apply -f -",
               "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web}\n"
               "spec: {minAvailable: 2, selector: {matchLabels: {app: web}}}\n",
               out, sizeof out);
    rl_test_pod p;
    const char *names[] = {"w1", "w2", "k"};
    for (int i = 0; i < 3; i++) await_pod(&s, names[i], "Running", 20, &p);
    cJSON_Delete(await_pdb(&s, "web", 1, 2, 2, 2, 0, 10));

    int rc = rl_test_kubectl(&s, "drain standin-node-1 --ignore-daemonsets --delete-emptydir-data --timeout=2s", NULL,
                             out, sizeof out);
    cr_assert_neq(rc, 0, "%s", out);
    cr_assert(strstr(out, "node/standin-node-1 cordoned"), "%s", out);
    cr_assert(strstr(out, "Cannot evict pod as it would violate the pod's disruption budget."), "%s", out);
    cr_assert(strstr(out, "global timeout reached: 2s"), "%s", out);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(rl_test_standin_pod(&s, "default", names[i], NULL, &p), 0);
        cr_assert(!strcmp(p.phase, "Running") && !p.deleting, "%s evicted against its budget", names[i]);
    }
    kubectl_ok(&s, "get node standin-node-1", NULL, out, sizeof out);
    cr_assert(strstr(out, "SchedulingDisabled"), "%s", out);

    kubectl_ok(&s, "patch pdb web --type=merge -p '{\"spec\":{\"minAvailable\":0}}'", NULL, out, sizeof out);
    cJSON_Delete(await_pdb(&s, "web", 2, 2, 2, 0, 2, 10));
    kubectl_ok(&s, "drain standin-node-1 --ignore-daemonsets --delete-emptydir-data --timeout=60s", NULL, out,
               sizeof out);
    cr_assert(strstr(out, "pod/w1 evicted") && strstr(out, "pod/w2 evicted") && strstr(out, "node/standin-node-1 drained"),
              "%s", out);
    await_pod(&s, "w1", "gone", 1, &p);
    await_pod(&s, "w2", "gone", 1, &p);
    await_pod(&s, "k", "Running", 1, &p);
    rl_test_standin_stop(&s);
}

/* The number of Events about a pod with this reason and message. */
static int count_events(rl_test_standin *s, const char *pod, const char *reason, const char *want) {
    char args[256];
    static char out[16384];
    snprintf(args, sizeof args,
             "get events --field-selector involvedObject.name=%s,reason=%s "
             "-o jsonpath='{range .items[*]}{.source.component}|{.message}{\"\\n\"}{end}'",
             pod, reason);
    if (rl_test_kubectl(s, args, NULL, out, sizeof out) != 0) return 0;
    int n = 0;
    for (const char *at = out; (at = strstr(at, want)); at++) n++;
    return n;
}

static void await_event(rl_test_standin *s, const char *pod, const char *reason, const char *want, double secs) {
    double end = now_s() + secs;
    while (now_s() < end && !count_events(s, pod, reason, want)) usleep(100000);
    cr_assert(count_events(s, pod, reason, want), "no %s Event \"%s\" for %s", reason, want, pod);
}

/* When the first Event about the pod with this reason was recorded (unix seconds; -1: none). */
static long event_time(rl_test_standin *s, const char *pod, const char *reason) {
    char args[256], out[4096];
    snprintf(args, sizeof args,
             "get events --field-selector involvedObject.name=%s,reason=%s -o jsonpath='{.items[0].firstTimestamp}'",
             pod, reason);
    struct tm tm = {0};
    if (rl_test_kubectl(s, args, NULL, out, sizeof out) != 0 || !strptime(out, "%Y-%m-%dT%H:%M:%SZ", &tm)) return -1;
    return (long)timegm(&tm);
}

static const cJSON *admin_node(const cJSON *nodes, const char *name) {
    return item_with(jget(nodes, "nodes"), "name", name);
}

/* The cluster autoscaler: pods Unschedulable for --scale-up-delay bin-packed
 * onto new nodes (TriggeredScaleUp), NotTriggerScaleUp at the maximum; an
 * idle node removed after --scale-down-unneeded, never one with a
 * safe-to-evict "false" or do-not-disrupt pod, a node with a pod that can
 * move drained through the eviction API; never below --nodes. */
Test(standin, autoscaler_scale_up_and_down, .timeout = 120) {
    static rl_test_standin s;
    start_kubelet_with(&s, 4, "--autoscaler 3 --scale-up-delay 2 --scale-down-unneeded 1.5");
    static char out[65536];
    apply_pod(&s, "a", LABEL_X RS_OWNER, ANTI_X);
    apply_pod(&s, "b", LABEL_X RS_OWNER "  annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: 'false'}\n",
              ANTI_X);
    apply_pod(&s, "c", LABEL_X RS_OWNER "  annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: 'true'}\n",
              ANTI_X);
    rl_test_pod p, pb, pc;
    await_pod(&s, "a", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node");
    await_unschedulable(&s, "b",
                        "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules. preemption: 0/1 "
                        "nodes are available: 1 No preemption victims found for incoming pod.",
                        15);
    cr_assert_eq(rl_test_standin_node_count(&s), 1);
    await_pod(&s, "b", "Running", 20, &pb);
    /* by the server's clock (whole seconds): the scale-up came --scale-up-delay after */
    cr_assert_geq(event_time(&s, "b", "TriggeredScaleUp") - event_time(&s, "b", "FailedScheduling"), 1,
                  "scaled up before --scale-up-delay");
    await_pod(&s, "c", "Running", 20, &pc);
    cr_assert_eq(rl_test_standin_node_count(&s), 3);
    cr_assert(strcmp(pb.node, pc.node) && strcmp(pb.node, "standin-node") && strcmp(pc.node, "standin-node"));
    /* one scale-up to 3 when b and c came due in the same loop, else 1->2 then 2->3 */
    cr_assert_eq(count_events(&s, "b", "TriggeredScaleUp", "cluster-autoscaler|pod triggered scale-up: [{standin-pool 1->") +
                     count_events(&s, "c", "TriggeredScaleUp", "->3 (max: 3)}]"),
                 2);
    kubectl_ok(&s, "get nodes", NULL, out, sizeof out);
    cr_assert(strstr(out, pb.node) && strstr(out, pc.node), "%s", out);

    /* at the maximum */
    apply_pod(&s, "d", LABEL_X RS_OWNER, ANTI_X);
    await_event(&s, "d", "NotTriggerScaleUp", "cluster-autoscaler|pod didn't trigger scale-up: 1 max node group size reached",
                15);
    kubectl_ok(&s, "delete pod d", NULL, out, sizeof out);

    /* scale-down: c's node once idle; not b's (safe-to-evict "false") nor the first (--nodes) */
    kubectl_ok(&s, "delete pod c", NULL, out, sizeof out);
    double end = now_s() + 20;
    while (now_s() < end && rl_test_standin_node_count(&s) != 2) usleep(100000);
    cr_assert_eq(rl_test_standin_node_count(&s), 2);
    char path[256];
    snprintf(path, sizeof path, "/api/v1/nodes/%s", pc.node);
    cr_assert(await_code(&s, path, 404, 5));
    usleep(2000000); /* more than --scale-down-unneeded */
    cr_assert_eq(rl_test_standin_admin(&s, "GET", "/nodes", NULL, out, sizeof out), 200);
    cJSON *j = cJSON_Parse(out);
    cr_assert_eq(cJSON_GetArraySize(jget(j, "nodes")), 2, "%s", out);
    cr_assert_str_eq(jstr(admin_node(j, pb.node), "autoscaler.unremovable"),
                     "pod annotated as not safe to evict present: default/b");
    cr_assert(strstr(jstr(admin_node(j, "standin-node"), "autoscaler.unremovable"), "scale-down-disabled"));
    cJSON_Delete(j);

    /* Karpenter's do-not-disrupt holds a node too; without it, the pod can
     * move elsewhere: the node is drained through the eviction API, then removed */
    apply_pod(&s, "e", "  annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: 'true'}\n", NULL);
    await_pod(&s, "e", "Running", 20, &p);
    cr_assert_str_eq(p.node, "standin-node");
    apply_pod(&s, "f",
              "  annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: 'true', karpenter.sh/do-not-disrupt: "
              "'true'}\n",
              NULL);
    await_pod(&s, "f", "Running", 20, &p);
    cr_assert_str_eq(p.node, pb.node);
    kubectl_ok(&s, "delete pod b", NULL, out, sizeof out);
    end = now_s() + 10;
    int held = 0;
    do {
        usleep(100000);
        cr_assert_eq(rl_test_standin_admin(&s, "GET", "/nodes", NULL, out, sizeof out), 200);
        j = cJSON_Parse(out);
        const char *why = jstr(admin_node(j, pb.node), "autoscaler.unremovable");
        held = why && !strcmp(why, "pod annotated as not safe to evict present: default/f");
        cJSON_Delete(j);
    } while (!held && now_s() < end);
    cr_assert(held, "%s", out);
    cr_assert_eq(rl_test_standin_node_count(&s), 2, "removed under a do-not-disrupt pod");
    kubectl_ok(&s, "annotate pod f karpenter.sh/do-not-disrupt-", NULL, out, sizeof out);
    end = now_s() + 30;
    while (now_s() < end && rl_test_standin_node_count(&s) != 1) usleep(100000);
    cr_assert_eq(rl_test_standin_node_count(&s), 1, "never below --nodes, down to it");
    await_pod(&s, "f", "gone", 5, &p);
    cr_assert_eq(count_events(&s, "f", "ScaleDown", "cluster-autoscaler|deleting pod for node scale down"), 1);
    await_pod(&s, "e", "Running", 1, &p);
    await_pod(&s, "a", "Running", 1, &p);
    rl_test_standin_stop(&s);
}
