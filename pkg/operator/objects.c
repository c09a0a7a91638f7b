/* The objects a TrainingJob owns, built from its spec (docs/trainingjob.md,
 * "What the operator creates"). Each carries a controller owner reference,
 * so deleting the job lets the garbage collector remove them all, and the
 * job's label, so one selector finds them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator.h"

static void put_str(cJSON *o, const char *k, const char *v) { cJSON_AddStringToObject(o, k, v); }

/* metadata with name, namespace, labels, owner reference */
static cJSON *object(const rl_op_job *j, const char *api_version, const char *kind, const char *name) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "apiVersion", api_version);
    put_str(o, "kind", kind);
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    put_str(md, "name", name);
    put_str(md, "namespace", j->ns);
    cJSON *labels = cJSON_AddObjectToObject(md, "labels");
    put_str(labels, RL_OP_LABEL_JOB, j->name);
    put_str(labels, RL_OP_LABEL_MANAGED_BY, "ringleader-operator");
    cJSON *refs = cJSON_AddArrayToObject(md, "ownerReferences");
    cJSON *ref = cJSON_CreateObject();
    put_str(ref, "apiVersion", RL_OP_GV);
    put_str(ref, "kind", "TrainingJob");
    put_str(ref, "name", j->name);
    put_str(ref, "uid", j->uid);
    cJSON_AddBoolToObject(ref, "controller", 1);
    cJSON_AddBoolToObject(ref, "blockOwnerDeletion", 1);
    cJSON_AddItemToArray(refs, ref);
    return o;
}

static cJSON *port(const char *name, int p) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "name", name);
    cJSON_AddNumberToObject(o, "port", p);
    cJSON_AddNumberToObject(o, "targetPort", p);
    put_str(o, "protocol", "TCP");
    return o;
}

cJSON *rl_op_service(const rl_op_job *j) {
    cJSON *o = object(j, "v1", "Service", j->name);
    cJSON *spec = cJSON_AddObjectToObject(o, "spec");
    /* headless, and not-ready pods published: peers must find each other
     * while they start, before any readiness exists */
    put_str(spec, "clusterIP", "None");
    cJSON_AddBoolToObject(spec, "publishNotReadyAddresses", 1);
    cJSON *sel = cJSON_AddObjectToObject(spec, "selector");
    put_str(sel, RL_OP_LABEL_JOB, j->name);
    cJSON *ports = cJSON_AddArrayToObject(spec, "ports");
    cJSON_AddItemToArray(ports, port("rdzv", j->rdzv_port));
    if (j->metrics_port > 0) cJSON_AddItemToArray(ports, port("metrics", j->metrics_port));
    return o;
}

static void suffixed(char *out, size_t n, const rl_op_job *j, const char *suffix) {
    snprintf(out, n, "%s%s", j->name, suffix);
}

cJSON *rl_op_secret(const rl_op_job *j, const char *secret_hex) {
    char name[128];
    suffixed(name, sizeof name, j, "-rdzv");
    cJSON *o = object(j, "v1", "Secret", name);
    put_str(o, "type", "Opaque");
    char *b64 = rl_base64_encode(secret_hex, strlen(secret_hex));
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    if (b64) put_str(data, "secret", b64);
    free(b64);
    return o;
}

cJSON *rl_op_service_account(const rl_op_job *j) {
    char name[128];
    suffixed(name, sizeof name, j, "-worker");
    return object(j, "v1", "ServiceAccount", name);
}

static cJSON *rule(const char *group, const char *resource, const char *const *names,
                   const char *const *verbs) {
    cJSON *r = cJSON_CreateObject();
    cJSON *g = cJSON_AddArrayToObject(r, "apiGroups");
    cJSON_AddItemToArray(g, cJSON_CreateString(group));
    cJSON *res = cJSON_AddArrayToObject(r, "resources");
    cJSON_AddItemToArray(res, cJSON_CreateString(resource));
    if (names) {
        cJSON *rn = cJSON_AddArrayToObject(r, "resourceNames");
        for (; *names; names++) cJSON_AddItemToArray(rn, cJSON_CreateString(*names));
    }
    cJSON *v = cJSON_AddArrayToObject(r, "verbs");
    for (; *verbs; verbs++) cJSON_AddItemToArray(v, cJSON_CreateString(*verbs));
    return r;
}

/* Least privilege for the workers: their own two Leases by name, creating
 * Leases (RBAC cannot limit create by name: a create request carries no
 * name to check), and reading the EndpointSlices of their namespace. */
cJSON *rl_op_role(const rl_op_job *j) {
    char name[128], leader[128], progress[128];
    suffixed(name, sizeof name, j, "-worker");
    suffixed(leader, sizeof leader, j, "-leader");
    suffixed(progress, sizeof progress, j, "-progress");
    cJSON *o = object(j, "rbac.authorization.k8s.io/v1", "Role", name);
    cJSON *rules = cJSON_AddArrayToObject(o, "rules");
    const char *const names[] = {leader, progress, NULL};
    const char *const rw[] = {"get", "update", "patch", NULL};
    const char *const create[] = {"create", NULL};
    const char *const read[] = {"get", "list", "watch", NULL};
    cJSON_AddItemToArray(rules, rule("coordination.k8s.io", "leases", names, rw));
    cJSON_AddItemToArray(rules, rule("coordination.k8s.io", "leases", NULL, create));
    cJSON_AddItemToArray(rules, rule("discovery.k8s.io", "endpointslices", NULL, read));
    return o;
}

cJSON *rl_op_pdb(const rl_op_job *j) {
    cJSON *o = object(j, "policy/v1", "PodDisruptionBudget", j->name);
    cJSON *spec = cJSON_AddObjectToObject(o, "spec");
    /* maxUnavailable 0, not minAvailable = replicas: stays right when the
     * job is scaled */
    if (j->elastic) cJSON_AddNumberToObject(spec, "minAvailable", j->min_nodes);
    else cJSON_AddNumberToObject(spec, "maxUnavailable", 0);
    put_str(cJSON_AddObjectToObject(cJSON_AddObjectToObject(spec, "selector"), "matchLabels"), RL_OP_LABEL_JOB,
            j->name);
    /* a pod that is not ready (crash-looping, pulling) must not block a
     * drain: evicting it loses nothing */
    put_str(spec, "unhealthyPodEvictionPolicy", "AlwaysAllow");
    return o;
}

cJSON *rl_op_network_policy(const rl_op_job *j, const char *metrics_ns) {
    cJSON *o = object(j, "networking.k8s.io/v1", "NetworkPolicy", j->name);
    cJSON *spec = cJSON_AddObjectToObject(o, "spec");
    put_str(cJSON_AddObjectToObject(cJSON_AddObjectToObject(spec, "podSelector"), "matchLabels"), RL_OP_LABEL_JOB,
            j->name);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "policyTypes"), cJSON_CreateString("Ingress"));
    cJSON *ingress = cJSON_AddArrayToObject(spec, "ingress");
    /* peers: every port, since the ring's and NCCL's are chosen at run time */
    cJSON *peers = cJSON_CreateObject(), *from = cJSON_CreateObject();
    put_str(cJSON_AddObjectToObject(cJSON_AddObjectToObject(from, "podSelector"), "matchLabels"), RL_OP_LABEL_JOB,
            j->name);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(peers, "from"), from);
    cJSON_AddItemToArray(ingress, peers);
    if (j->metrics_port > 0) {
        cJSON *scrape = cJSON_CreateObject(), *ns = cJSON_CreateObject();
        cJSON *sel = cJSON_AddObjectToObject(ns, "namespaceSelector");
        const char *eq = metrics_ns ? strchr(metrics_ns, '=') : NULL;
        if (eq) {
            char key[320];
            snprintf(key, sizeof key, "%.*s", (int)(eq - metrics_ns), metrics_ns);
            put_str(cJSON_AddObjectToObject(sel, "matchLabels"), key, eq + 1);
        }
        cJSON_AddItemToArray(cJSON_AddArrayToObject(scrape, "from"), ns);
        cJSON *port = cJSON_CreateObject();
        put_str(port, "protocol", "TCP");
        cJSON_AddNumberToObject(port, "port", j->metrics_port);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(scrape, "ports"), port);
        cJSON_AddItemToArray(ingress, scrape);
    }
    return o;
}

cJSON *rl_op_role_binding(const rl_op_job *j) {
    char name[128];
    suffixed(name, sizeof name, j, "-worker");
    cJSON *o = object(j, "rbac.authorization.k8s.io/v1", "RoleBinding", name);
    cJSON *ref = cJSON_AddObjectToObject(o, "roleRef");
    put_str(ref, "apiGroup", "rbac.authorization.k8s.io");
    put_str(ref, "kind", "Role");
    put_str(ref, "name", name);
    cJSON *subs = cJSON_AddArrayToObject(o, "subjects");
    cJSON *s = cJSON_CreateObject();
    put_str(s, "kind", "ServiceAccount");
    put_str(s, "name", name);
    put_str(s, "namespace", j->ns);
    cJSON_AddItemToArray(subs, s);
    return o;
}

/* ---- the pod --------------------------------------------------------------------------- */
static cJSON *env_value(const char *name, const char *value) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "name", name);
    put_str(o, "value", value);
    return o;
}

static cJSON *env_field(const char *name, const char *path) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "name", name);
    cJSON *f = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "valueFrom"), "fieldRef");
    put_str(f, "apiVersion", "v1");
    put_str(f, "fieldPath", path);
    return o;
}

static cJSON *env_secret(const char *name, const char *secret, const char *key) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "name", name);
    cJSON *r = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "valueFrom"), "secretKeyRef");
    put_str(r, "name", secret);
    put_str(r, "key", key);
    return o;
}

static cJSON *container_port(const char *name, int p) {
    cJSON *o = cJSON_CreateObject();
    put_str(o, "name", name);
    cJSON_AddNumberToObject(o, "containerPort", p);
    put_str(o, "protocol", "TCP");
    return o;
}

/* spec fields copied as the user wrote them (the schema typed them) */
static void copy_field(cJSON *dst, const char *dst_key, const cJSON *spec, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, key);
    if (!v || cJSON_IsNull(v)) return;
    if (cJSON_IsString(v) && !v->valuestring[0]) return;
    cJSON_AddItemToObject(dst, dst_key, cJSON_Duplicate(v, 1));
}

/* every string entry of src (an object, or NULL) into dst */
static void copy_entries(cJSON *dst, const cJSON *src) {
    for (const cJSON *it = cJSON_IsObject(src) ? src->child : NULL; it; it = it->next)
        if (cJSON_IsString(it)) put_str(dst, it->string, it->valuestring);
}

/* The "restricted" Pod Security Standard (kubernetes.io, Pod Security
 * Standards), as the operator's own Deployment has it: namespaces that
 * enforce it admit the pods, and nothing in them runs as root. */
static void pod_security(cJSON *spec) {
    cJSON *sc = cJSON_AddObjectToObject(spec, "securityContext");
    cJSON_AddBoolToObject(sc, "runAsNonRoot", 1);
    cJSON_AddNumberToObject(sc, "runAsUser", RL_OP_WORKER_UID);
    cJSON_AddNumberToObject(sc, "runAsGroup", RL_OP_WORKER_UID);
    /* emptyDirs and the user's volumes writable by the worker's group */
    cJSON_AddNumberToObject(sc, "fsGroup", RL_OP_WORKER_UID);
    put_str(cJSON_AddObjectToObject(sc, "seccompProfile"), "type", "RuntimeDefault");
}

static void container_security(cJSON *c) {
    cJSON *sc = cJSON_AddObjectToObject(c, "securityContext");
    cJSON_AddBoolToObject(sc, "allowPrivilegeEscalation", 0);
    cJSON *drop = cJSON_AddArrayToObject(cJSON_AddObjectToObject(sc, "capabilities"), "drop");
    cJSON_AddItemToArray(drop, cJSON_CreateString("ALL"));
    cJSON_AddBoolToObject(sc, "readOnlyRootFilesystem", 1);
}

/* An emptyDir volume (medium "" or Memory, size_limit "" for none) and its mount. */
static void empty_dir(cJSON *vols, cJSON *mounts, const char *name, const char *path, const char *medium,
                      const char *size_limit) {
    cJSON *v = cJSON_CreateObject(), *ed = cJSON_CreateObject();
    put_str(v, "name", name);
    if (medium[0]) put_str(ed, "medium", medium);
    if (size_limit[0]) put_str(ed, "sizeLimit", size_limit);
    cJSON_AddItemToObject(v, "emptyDir", ed);
    cJSON_AddItemToArray(vols, v);
    cJSON *m = cJSON_CreateObject();
    put_str(m, "name", name);
    put_str(m, "mountPath", path);
    cJSON_AddItemToArray(mounts, m);
}

/* The worker container's environment: the downward API, the job's own
 * variables, S3, then spec.env as written. */
static void pod_env(cJSON *env, const rl_op_job *j, const char *secret) {
    char buf[64];
    cJSON_AddItemToArray(env, env_field("POD_NAME", "metadata.name"));
    cJSON_AddItemToArray(env, env_field("POD_NAMESPACE", "metadata.namespace"));
    cJSON_AddItemToArray(env, env_field("POD_IP", "status.podIP"));
    /* names the node in hang verdicts (pkg/hang) */
    cJSON_AddItemToArray(env, env_field("NODE_NAME", "spec.nodeName"));
    /* the ring's order within a zone: the node's rack as the pod carries it
     * (a node label reaches a pod's labels at binding only where the
     * cluster copies it: the PodTopologyLabels admission plugin with this
     * key configured, Kubernetes 1.35; else the value is "", unknown) */
    if (j->rack_label[0]) {
        char path[sizeof j->rack_label + 20];
        snprintf(path, sizeof path, "metadata.labels['%s']", j->rack_label);
        cJSON_AddItemToArray(env, env_field("RINGLEADER_RACK", path));
    }
    cJSON_AddItemToArray(env, env_value("RINGLEADER_RDZV", "k8s"));
    cJSON_AddItemToArray(env, env_value("RINGLEADER_JOB", j->name));
    snprintf(buf, sizeof buf, "%d:%d", j->min_nodes, j->max_nodes);
    cJSON_AddItemToArray(env, env_value("RINGLEADER_NNODES", buf));
    cJSON_AddItemToArray(env, env_secret("RINGLEADER_RDZV_SECRET", secret, "secret"));
    cJSON_AddItemToArray(env, env_value("RINGLEADER_CONFIG", j->training_json));
    snprintf(buf, sizeof buf, "%d", j->metrics_port);
    cJSON_AddItemToArray(env, env_value("RINGLEADER_METRICS_PORT", buf));
    if (j->s3_endpoint[0]) cJSON_AddItemToArray(env, env_value("AWS_ENDPOINT_URL_S3", j->s3_endpoint));
    if (j->s3_region[0]) cJSON_AddItemToArray(env, env_value("AWS_REGION", j->s3_region));
    if (j->s3_secret[0]) {
        cJSON_AddItemToArray(env, env_secret("AWS_ACCESS_KEY_ID", j->s3_secret, j->s3_key_id));
        cJSON_AddItemToArray(env, env_secret("AWS_SECRET_ACCESS_KEY", j->s3_secret, j->s3_key_secret));
        if (j->s3_key_token[0])
            cJSON_AddItemToArray(env, env_secret("AWS_SESSION_TOKEN", j->s3_secret, j->s3_key_token));
    }
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(j->spec, "env");
    if (cJSON_IsArray(extra))
        for (const cJSON *it = extra->child; it; it = it->next) cJSON_AddItemToArray(env, cJSON_Duplicate(it, 1));
}

cJSON *rl_op_pod(const rl_op_job *j, int index) {
    char name[128], idx[16], buf[64], secret[128], sa[128];
    snprintf(name, sizeof name, "%s-%d", j->name, index);
    snprintf(idx, sizeof idx, "%d", index);
    suffixed(secret, sizeof secret, j, "-rdzv");
    suffixed(sa, sizeof sa, j, "-worker");
    cJSON *o = object(j, "v1", "Pod", name);
    cJSON *md = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    put_str(cJSON_GetObjectItemCaseSensitive(md, "labels"), RL_OP_LABEL_INDEX, idx);
    cJSON *ann = cJSON_AddObjectToObject(md, "annotations");
    /* the user's (Kueue's pod-group keys, cost labels); spec.c refused the
     * operator's own keys, so nothing below is overwritten */
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(j->spec, "podMetadata");
    copy_entries(cJSON_GetObjectItemCaseSensitive(md, "labels"), cJSON_GetObjectItemCaseSensitive(pm, "labels"));
    copy_entries(ann, cJSON_GetObjectItemCaseSensitive(pm, "annotations"));
    snprintf(buf, sizeof buf, "%lld", j->generation);
    put_str(ann, RL_OP_KEY_PREFIX "generation", buf);
    if (!j->disruptible) {
        /* a node scale-down would kill a training round for a few idle
         * CPU cycles: the cluster autoscaler and Karpenter leave the node
         * (spot reclaims and the operator's own replacement still work) */
        put_str(ann, RL_OP_ANN_SAFE_TO_EVICT, "false");
        put_str(ann, RL_OP_ANN_DO_NOT_DISRUPT, "true");
    }

    cJSON *spec = cJSON_AddObjectToObject(o, "spec");
    put_str(spec, "hostname", name);
    put_str(spec, "subdomain", j->name);
    put_str(spec, "serviceAccountName", sa);
    /* Never: the operator replaces a pod that ended, so it sees every
     * ending and can tell a failure from a preemption (restarts in place
     * would hide them in a restartCount). */
    put_str(spec, "restartPolicy", "Never");
    cJSON_AddNumberToObject(spec, "terminationGracePeriodSeconds", (double)j->grace_s);
    copy_field(spec, "nodeSelector", j->spec, "nodeSelector");
    copy_field(spec, "tolerations", j->spec, "tolerations");
    copy_field(spec, "priorityClassName", j->spec, "priorityClassName");
    copy_field(spec, "schedulerName", j->spec, "schedulerName");
    copy_field(spec, "imagePullSecrets", j->spec, "imagePullSecrets");
    /* one pod per node, one zone for NCCL: the scheduler's own terms */
    copy_field(spec, "affinity", j->spec, "affinity");
    copy_field(spec, "topologySpreadConstraints", j->spec, "topologySpreadConstraints");
    pod_security(spec);

    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "containers"), c);
    put_str(c, "name", RL_OP_CONTAINER);
    put_str(c, "image", j->image);
    put_str(c, "imagePullPolicy", j->pull_policy);
    /* a failed worker's last log lines become its termination message,
     * which the operator quotes in the PodFailed event */
    put_str(c, "terminationMessagePolicy", "FallbackToLogsOnError");
    cJSON *cmd = cJSON_AddArrayToObject(c, "command");
    cJSON_AddItemToArray(cmd, cJSON_CreateString("ringleader-worker"));
    cJSON *args = cJSON_AddArrayToObject(c, "args");
    snprintf(buf, sizeof buf, "%d", j->nproc);
    const char *const argv[] = {"--rdzv", "k8s", "--nproc-per-node", buf, NULL};
    for (const char *const *a = argv; *a; a++) cJSON_AddItemToArray(args, cJSON_CreateString(*a));
    cJSON *ports = cJSON_AddArrayToObject(c, "ports");
    cJSON_AddItemToArray(ports, container_port("rdzv", j->rdzv_port));
    if (j->metrics_port > 0) cJSON_AddItemToArray(ports, container_port("metrics", j->metrics_port));

    pod_env(cJSON_AddArrayToObject(c, "env"), j, secret);

    /* resources as given, plus the GPU limit */
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(j->spec, "resources");
    cJSON *r = cJSON_IsObject(res) ? cJSON_Duplicate(res, 1) : cJSON_CreateObject();
    if (j->gpus > 0) {
        cJSON *lim = cJSON_GetObjectItemCaseSensitive(r, "limits");
        if (!cJSON_IsObject(lim)) {
            cJSON_DeleteItemFromObjectCaseSensitive(r, "limits");
            lim = cJSON_AddObjectToObject(r, "limits");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(lim, "nvidia.com/gpu");
        snprintf(buf, sizeof buf, "%d", j->gpus);
        put_str(lim, "nvidia.com/gpu", buf);
    }
    cJSON_AddItemToObject(c, "resources", r);
    container_security(c);

    /* the user's volumes and mounts, then the memory-backed /dev/shm and
     * /tmp (the root filesystem is read-only) */
    cJSON *vols = cJSON_AddArrayToObject(spec, "volumes"), *mounts = cJSON_AddArrayToObject(c, "volumeMounts");
    const cJSON *uv = cJSON_GetObjectItemCaseSensitive(j->spec, "volumes"),
                *um = cJSON_GetObjectItemCaseSensitive(j->spec, "volumeMounts");
    for (const cJSON *it = cJSON_IsArray(uv) ? uv->child : NULL; it; it = it->next)
        cJSON_AddItemToArray(vols, cJSON_Duplicate(it, 1));
    for (const cJSON *it = cJSON_IsArray(um) ? um->child : NULL; it; it = it->next)
        cJSON_AddItemToArray(mounts, cJSON_Duplicate(it, 1));
    empty_dir(vols, mounts, RL_OP_SHM_VOLUME, RL_OP_SHM_PATH, "Memory", j->shm_size);
    empty_dir(vols, mounts, RL_OP_TMP_VOLUME, RL_OP_TMP_PATH, "", "");
    return o;
}
