/* A TrainingJob's spec read and checked, with the defaults of the CRD
 * applied again (an object stored before a default existed, or written
 * with the schema bypassed, must not crash or mislead the operator). The
 * training section is checked by the worker's own config parser, so the
 * operator refuses exactly what the worker would refuse -- before any pod
 * exists, with the field named. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator.h"
#include "train/train.h"

static const cJSON *member(const cJSON *o, const char *k) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static int get_int(const cJSON *o, const char *where, const char *k, long long lo, long long hi,
                   long long def, long long *out, rl_err *e) {
    const cJSON *v = member(o, k);
    *out = def;
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return rl_errf(e, RL_EINPUT, "%s.%s: must be an integer", where, k);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return rl_errf(e, RL_EINPUT, "%s.%s: %.0f is out of range [%lld, %lld]", where, k,
                       v->valuedouble, lo, hi);
    *out = (long long)v->valuedouble;
    return RL_OK;
}

static int get_str(const cJSON *o, const char *where, const char *k, const char *def, char *out,
                   size_t n, rl_err *e) {
    const cJSON *v = member(o, k);
    snprintf(out, n, "%s", def);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsString(v)) return rl_errf(e, RL_EINPUT, "%s.%s: must be a string", where, k);
    if (strlen(v->valuestring) >= n)
        return rl_errf(e, RL_EINPUT, "%s.%s: longer than %zu characters", where, k, n - 1);
    snprintf(out, n, "%s", v->valuestring);
    return RL_OK;
}

static int one_of(const char *v, const char *where, const char *k, const char *const *allowed,
                  rl_err *e) {
    for (const char *const *a = allowed; *a; a++)
        if (!strcmp(v, *a)) return RL_OK;
    char esc[96];
    return rl_errf(e, RL_EINPUT, "%s.%s: \"%s\" is not one of the allowed values", where, k,
                   rl_json_escape(esc, sizeof esc, v));
}

/* A DNS-1123 label: what a pod's hostname (<job>-<i>) and the Service name
 * must be. Names longer than 56 leave room for "-<index>" and "-progress". */
static int check_job_name(const char *name, rl_err *e) {
    size_t n = strlen(name);
    bool ok = n > 0 && n <= 56 && name[0] >= 'a' && name[0] <= 'z' && name[n - 1] != '-';
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '-';
    if (!ok) {
        char esc[96];
        return rl_errf(e, RL_EINPUT, "metadata.name: \"%s\" must be a DNS-1123 label of at most 56 "
                       "characters starting with a letter (pods are named <name>-<index>)",
                       rl_json_escape(esc, sizeof esc, name));
    }
    return RL_OK;
}

static int parse_s3(const cJSON *spec, rl_op_job *j, rl_err *e) {
    const cJSON *s3 = member(spec, "s3");
    if (!s3 || cJSON_IsNull(s3)) return RL_OK;
    if (!cJSON_IsObject(s3)) return rl_errf(e, RL_EINPUT, "spec.s3: must be an object");
    static const char *const addr[] = {"", "path", "virtual", NULL};
    int rc;
    if ((rc = get_str(s3, "spec.s3", "endpoint", "", j->s3_endpoint, sizeof j->s3_endpoint, e)) ||
        (rc = get_str(s3, "spec.s3", "region", "", j->s3_region, sizeof j->s3_region, e)) ||
        (rc = get_str(s3, "spec.s3", "addressing", "", j->s3_addressing, sizeof j->s3_addressing, e)) ||
        (rc = one_of(j->s3_addressing, "spec.s3", "addressing", addr, e)))
        return rc;
    if (j->s3_endpoint[0] && strncmp(j->s3_endpoint, "http://", 7) && strncmp(j->s3_endpoint, "https://", 8))
        return rl_errf(e, RL_EINPUT, "spec.s3.endpoint: must start with http:// or https://");
    const cJSON *cs = member(s3, "credentialsSecret");
    if (!cs || cJSON_IsNull(cs)) return RL_OK;
    const char *w = "spec.s3.credentialsSecret";
    if ((rc = get_str(cs, w, "name", "", j->s3_secret, sizeof j->s3_secret, e)) ||
        (rc = get_str(cs, w, "accessKeyIdKey", "AWS_ACCESS_KEY_ID", j->s3_key_id, sizeof j->s3_key_id, e)) ||
        (rc = get_str(cs, w, "secretAccessKeyKey", "AWS_SECRET_ACCESS_KEY", j->s3_key_secret,
                      sizeof j->s3_key_secret, e)) ||
        (rc = get_str(cs, w, "sessionTokenKey", "", j->s3_key_token, sizeof j->s3_key_token, e)))
        return rc;
    if (!j->s3_secret[0]) return rl_errf(e, RL_EINPUT, "%s.name: required", w);
    return RL_OK;
}

/* spec.volumes (core Volumes, passed through: the API server validates the
 * pod) and spec.volumeMounts for the worker container: what the schema
 * cannot say is checked here -- a mount names a volume of the list, and
 * neither takes one of the operator's own (/dev/shm, and /tmp, the one
 * writable place of a read-only root filesystem). */
typedef struct own_vol {
    const char *name, *path, *hint;
} own_vol;

/* The volumes every worker pod gets from the operator (objects.c). */
static const own_vol own_volumes[] = {
    {RL_OP_SHM_VOLUME, RL_OP_SHM_PATH, " (size it with spec.shmSize)"},
    {RL_OP_TMP_VOLUME, RL_OP_TMP_PATH, ""},
};

/* The operator's volume of that name, or mounted at that path; NULL if none. */
static const own_vol *own_volume(const char *name, const char *path) {
    for (size_t i = 0; i < sizeof own_volumes / sizeof own_volumes[0]; i++)
        if ((name && !strcmp(name, own_volumes[i].name)) || (path && !strcmp(path, own_volumes[i].path)))
            return &own_volumes[i];
    return NULL;
}

/* The volume sources a TrainingJob may use: storage and configuration of
 * its own namespace. hostPath (the node's files), nfs/iscsi (any server the
 * node reaches) and the rest would hand whoever may create a TrainingJob
 * more than a worker pod needs. */
static const char *const volume_sources[] = {"persistentVolumeClaim", "configMap", "secret", "emptyDir",
                                             "csi", "ephemeral", "projected", NULL};

/* Whether the job may read Secret `name`: the S3 credentials Secret or one
 * listed in spec.secretRefs. Anything else in the namespace stays out of
 * reach of whoever can create a TrainingJob but not read Secrets. */
static int check_secret_ref(const cJSON *spec, const rl_op_job *j, const cJSON *name, const char *where,
                            rl_err *e) {
    if (!cJSON_IsString(name)) return rl_errf(e, RL_EINPUT, "%s: must be a Secret's name", where);
    if (j->s3_secret[0] && !strcmp(name->valuestring, j->s3_secret)) return RL_OK;
    const cJSON *refs = member(spec, "secretRefs");
    for (const cJSON *r = cJSON_IsArray(refs) ? refs->child : NULL; r; r = r->next) {
        const cJSON *n = member(r, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name->valuestring)) return RL_OK;
    }
    char esc[96];
    return rl_errf(e, RL_EINPUT, "%s: Secret \"%s\" is not in spec.secretRefs (nor spec.s3.credentialsSecret)", where,
                   rl_json_escape(esc, sizeof esc, name->valuestring));
}

/* spec.secretRefs: [{name}], the Secrets env and volumes may use. */
static int parse_secret_refs(const cJSON *spec, rl_err *e) {
    const cJSON *refs = member(spec, "secretRefs");
    if (!refs || cJSON_IsNull(refs)) return RL_OK;
    if (!cJSON_IsArray(refs)) return rl_errf(e, RL_EINPUT, "spec.secretRefs: must be a list");
    int i = 0;
    for (const cJSON *r = refs->child; r; r = r->next, i++) {
        const cJSON *n = member(r, "name");
        if (!cJSON_IsString(n) || !n->valuestring[0])
            return rl_errf(e, RL_EINPUT, "spec.secretRefs[%d].name: required", i);
    }
    return RL_OK;
}

/* One volume: exactly one source of the allowed ones, and the Secrets it
 * names (secret, csi's nodePublishSecretRef, projected sources) allowed. */
static int check_volume_source(const cJSON *spec, const rl_op_job *j, const cJSON *v, int i, rl_err *e) {
    char where[128], esc[64];
    int sources = 0, rc;
    for (const cJSON *f = v->child; f; f = f->next) {
        if (!strcmp(f->string, "name")) continue;
        const char *const *ok = volume_sources;
        while (*ok && strcmp(*ok, f->string)) ok++;
        if (!*ok)
            return rl_errf(e, RL_EINPUT, "spec.volumes[%d].%s: not an allowed volume source (persistentVolumeClaim, "
                           "configMap, secret, emptyDir, csi, ephemeral, projected)", i,
                           rl_json_escape(esc, sizeof esc, f->string));
        sources++;
    }
    if (sources != 1) return rl_errf(e, RL_EINPUT, "spec.volumes[%d]: needs exactly one volume source", i);
    const cJSON *sec = member(v, "secret"), *csi = member(v, "csi"), *proj = member(v, "projected");
    if (sec) {
        snprintf(where, sizeof where, "spec.volumes[%d].secret.secretName", i);
        if ((rc = check_secret_ref(spec, j, member(sec, "secretName"), where, e))) return rc;
    }
    const cJSON *npsr = member(csi, "nodePublishSecretRef");
    if (npsr) {
        snprintf(where, sizeof where, "spec.volumes[%d].csi.nodePublishSecretRef.name", i);
        if ((rc = check_secret_ref(spec, j, member(npsr, "name"), where, e))) return rc;
    }
    const cJSON *srcs = member(proj, "sources");
    int k = 0;
    for (const cJSON *s = cJSON_IsArray(srcs) ? srcs->child : NULL; s; s = s->next, k++) {
        const cJSON *ps = member(s, "secret");
        if (!ps) continue;
        snprintf(where, sizeof where, "spec.volumes[%d].projected.sources[%d].secret.name", i, k);
        if ((rc = check_secret_ref(spec, j, member(ps, "name"), where, e))) return rc;
    }
    return RL_OK;
}

/* spec.env: a secretKeyRef only to an allowed Secret. */
static int check_env_secrets(const cJSON *spec, const rl_op_job *j, rl_err *e) {
    const cJSON *env = member(spec, "env");
    int i = 0, rc;
    for (const cJSON *v = cJSON_IsArray(env) ? env->child : NULL; v; v = v->next, i++) {
        const cJSON *ref = member(member(v, "valueFrom"), "secretKeyRef");
        if (!ref) continue;
        char where[96];
        snprintf(where, sizeof where, "spec.env[%d].valueFrom.secretKeyRef.name", i);
        if ((rc = check_secret_ref(spec, j, member(ref, "name"), where, e))) return rc;
    }
    return RL_OK;
}

/* A quantity in bytes: digits, then an optional binary or decimal suffix
 * (the CRD's pattern); *bytes its value. false: not one. */
static bool quantity_bytes(const char *q, double *bytes) {
    static const char *const sfx[] = {"", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T", NULL};
    static const double mul[] = {1, 0x1p10, 0x1p20, 0x1p30, 0x1p40, 1e3, 1e6, 1e9, 1e12};
    size_t nd = strspn(q, "0123456789");
    for (int i = 0; nd > 0 && sfx[i]; i++)
        if (!strcmp(q + nd, sfx[i])) return *bytes = strtod(q, NULL) * mul[i], true;
    return false;
}

static int parse_volumes(const cJSON *spec, rl_op_job *j, rl_err *e) {
    int rc = get_str(spec, "spec", "shmSize", "", j->shm_size, sizeof j->shm_size, e);
    if (rc) return rc;
    const char *q = j->shm_size;
    double bytes;
    if (q[0] && !quantity_bytes(q, &bytes))
        return rl_errf(e, RL_EINPUT, "spec.shmSize: \"%s\" is not a byte quantity (e.g. 16Gi)", q);
    const cJSON *vols = member(spec, "volumes"), *mounts = member(spec, "volumeMounts");
    if (vols && !cJSON_IsNull(vols) && !cJSON_IsArray(vols))
        return rl_errf(e, RL_EINPUT, "spec.volumes: must be a list");
    if (mounts && !cJSON_IsNull(mounts) && !cJSON_IsArray(mounts))
        return rl_errf(e, RL_EINPUT, "spec.volumeMounts: must be a list");
    int i = 0;
    for (const cJSON *v = cJSON_IsArray(vols) ? vols->child : NULL; v; v = v->next, i++) {
        const cJSON *n = member(v, "name");
        if (!cJSON_IsString(n) || !n->valuestring[0])
            return rl_errf(e, RL_EINPUT, "spec.volumes[%d].name: required", i);
        const own_vol *own = own_volume(n->valuestring, NULL);
        if (own)
            return rl_errf(e, RL_EINPUT, "spec.volumes[%d].name: \"%s\" is the operator's own %s volume%s", i,
                           own->name, own->path, own->hint);
        if ((rc = check_volume_source(spec, j, v, i, e))) return rc;
    }
    i = 0;
    for (const cJSON *m = cJSON_IsArray(mounts) ? mounts->child : NULL; m; m = m->next, i++) {
        const cJSON *n = member(m, "name"), *p = member(m, "mountPath");
        if (!cJSON_IsString(n) || !cJSON_IsString(p) || !p->valuestring[0])
            return rl_errf(e, RL_EINPUT, "spec.volumeMounts[%d]: name and mountPath are required", i);
        const own_vol *own = own_volume(NULL, p->valuestring);
        if (own)
            return rl_errf(e, RL_EINPUT, "spec.volumeMounts[%d].mountPath: %s is mounted by the operator%s", i,
                           own->path, own->hint);
        bool found = false;
        for (const cJSON *v = cJSON_IsArray(vols) ? vols->child : NULL; v && !found; v = v->next)
            found = !strcmp(member(v, "name")->valuestring, n->valuestring);
        if (!found)
            return rl_errf(e, RL_EINPUT, "spec.volumeMounts[%d].name: no volume \"%.64s\" in spec.volumes", i,
                           n->valuestring);
    }
    return RL_OK;
}

/* A Kubernetes name part: at most 63 characters, alphanumeric at both
 * ends, '-', '_' and '.' inside (a label value may also be empty). */
static bool name_part_ok(const char *s, size_t n) {
    if (n == 0 || n > 63 || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1])) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i])) return false;
    return true;
}

/* A label or annotation key: [DNS-1123 subdomain "/"] name part. */
static bool qualified_name_ok(const char *k) {
    const char *slash = strchr(k, '/');
    const char *name = slash ? slash + 1 : k;
    if (slash) {
        size_t n = (size_t)(slash - k);
        bool ok = n > 0 && n <= 253 && isalnum((unsigned char)k[0]) && isalnum((unsigned char)k[n - 1]);
        for (size_t i = 0; ok && i < n; i++)
            ok = islower((unsigned char)k[i]) || isdigit((unsigned char)k[i]) || k[i] == '-' || k[i] == '.';
        if (!ok) return false;
    }
    return name_part_ok(name, strlen(name));
}

int rl_op_check_label_pair(const char *kv, const char *where, rl_err *e) {
    if (!kv[0]) return RL_OK;
    const char *eq = strchr(kv, '=');
    char key[320], esc[96];
    bool ok = eq && (size_t)(eq - kv) < sizeof key;
    if (ok) {
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        ok = qualified_name_ok(key) && (!eq[1] || name_part_ok(eq + 1, strlen(eq + 1)));
    }
    if (!ok)
        return rl_errf(e, RL_EINPUT, "%s: \"%s\" is not key=value with a label key and value", where,
                       rl_json_escape(esc, sizeof esc, kv));
    return RL_OK;
}

/* The keys the operator writes itself: the selectors of the Service, the
 * PDB and the operator's own caches depend on its labels, and
 * spec.disruptible is the one switch for the autoscalers' annotations. */
static const char *owned_key(const char *k, bool label) {
    if (!strncmp(k, RL_OP_KEY_PREFIX, strlen(RL_OP_KEY_PREFIX))) return "set by the operator";
    if (label && !strcmp(k, RL_OP_LABEL_MANAGED_BY)) return "set by the operator";
    if (!label && (!strcmp(k, RL_OP_ANN_SAFE_TO_EVICT) || !strcmp(k, RL_OP_ANN_DO_NOT_DISRUPT)))
        return "set by the operator from spec.disruptible";
    return NULL;
}

/* spec.podMetadata.{labels,annotations}: string maps for every worker pod,
 * checked as the API server checks a pod's metadata, so a bad key is
 * refused here (and by `render`) rather than at each pod create. */
static int parse_pod_map(const cJSON *pm, const char *field, bool label, rl_err *e) {
    const cJSON *m = member(pm, field);
    if (!m || cJSON_IsNull(m)) return RL_OK;
    if (!cJSON_IsObject(m)) return rl_errf(e, RL_EINPUT, "spec.podMetadata.%s: must be an object", field);
    size_t total = 0;
    char esc[96];
    for (const cJSON *it = m->child; it; it = it->next) {
        const char *k = it->string, *why = owned_key(k, label);
        if (!qualified_name_ok(k))
            return rl_errf(e, RL_EINPUT, "spec.podMetadata.%s: key \"%s\" is not a qualified name "
                           "([prefix/]name, name at most 63 characters)", field, rl_json_escape(esc, sizeof esc, k));
        if (why) return rl_errf(e, RL_EINPUT, "spec.podMetadata.%s.%s: %s", field, k, why);
        if (!cJSON_IsString(it)) return rl_errf(e, RL_EINPUT, "spec.podMetadata.%s.%s: must be a string", field, k);
        size_t n = strlen(it->valuestring);
        if (label && n && !name_part_ok(it->valuestring, n))
            return rl_errf(e, RL_EINPUT, "spec.podMetadata.labels.%s: \"%s\" is not a label value (at most 63 "
                           "characters, alphanumeric at both ends)", k, rl_json_escape(esc, sizeof esc, it->valuestring));
        total += strlen(k) + n;
    }
    /* the API server's limit on a pod's annotations, keys and values together */
    if (!label && total > 256 * 1024)
        return rl_errf(e, RL_EINPUT, "spec.podMetadata.annotations: %zu bytes, over the 262144 a pod may carry", total);
    return RL_OK;
}

/* spec.rackLabel: a label key, put into a downward-API field path
 * (metadata.labels['<key>']), so it must be one the API server takes, and
 * a qualified name never holds the quote that would end the path. */
static int parse_rack_label(const cJSON *spec, rl_op_job *j, rl_err *e) {
    int rc = get_str(spec, "spec", "rackLabel", "", j->rack_label, sizeof j->rack_label, e);
    char esc[96];
    if (!rc && j->rack_label[0] && !qualified_name_ok(j->rack_label))
        rc = rl_errf(e, RL_EINPUT, "spec.rackLabel: \"%s\" is not a label key ([prefix/]name, name at most 63 "
                     "characters)", rl_json_escape(esc, sizeof esc, j->rack_label));
    return rc;
}

/* What the schema leaves to the API server is checked when the pod is made
 * (a refused create is the PodCreateFailed condition); the shapes are
 * checked here so the pod builder can copy them without looking. */
static int parse_pod_passthrough(const cJSON *spec, rl_err *e) {
    const cJSON *pm = member(spec, "podMetadata"), *aff = member(spec, "affinity"),
                *tsc = member(spec, "topologySpreadConstraints");
    int rc;
    if (pm && !cJSON_IsNull(pm) && !cJSON_IsObject(pm))
        return rl_errf(e, RL_EINPUT, "spec.podMetadata: must be an object");
    if ((rc = parse_pod_map(pm, "labels", true, e)) || (rc = parse_pod_map(pm, "annotations", false, e)))
        return rc;
    if (aff && !cJSON_IsNull(aff) && !cJSON_IsObject(aff)) return rl_errf(e, RL_EINPUT, "spec.affinity: must be an object");
    if (tsc && !cJSON_IsNull(tsc) && !cJSON_IsArray(tsc))
        return rl_errf(e, RL_EINPUT, "spec.topologySpreadConstraints: must be a list");
    int i = 0;
    for (const cJSON *c = cJSON_IsArray(tsc) ? tsc->child : NULL; c; c = c->next, i++)
        if (!cJSON_IsObject(c)) return rl_errf(e, RL_EINPUT, "spec.topologySpreadConstraints[%d]: must be an object", i);
    return RL_OK;
}

/* Several trainers of a pod with train.offload share their host state in
 * /dev/shm (train.offload_share): a shmSize that cannot hold it would make
 * every trainer keep a copy of its own instead, nprocPerNode times the
 * memory, so it is refused here by name. With dist.shard each keeps its
 * shard and nothing is shared. */
static int check_shm_room(const rl_op_job *j, const rl_job_config *jc, rl_err *e) {
    if (j->nproc < 2 || !strcmp(jc->train.offload, "none") || !jc->train.offload_share || !j->shm_size[0] ||
        strcmp(jc->dist.shard, "none"))
        return RL_OK;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &jc->model);
    double need = (double)RL_OFFLOAD_SHARED_BYTES * (double)lay.total, have = 0;
    if (quantity_bytes(j->shm_size, &have) && have >= need) return RL_OK; /* parse_volumes checked its form */
    return rl_errf(e, RL_EINPUT, "spec.shmSize: %s cannot hold the host state the %d trainers of a pod share with "
                   "train.offload \"%s\" (%d bytes x %zu parameters = %.1f %s): raise it, leave it empty, or set "
                   "spec.training.train.offload_share to false", j->shm_size, j->nproc, jc->train.offload,
                   RL_OFFLOAD_SHARED_BYTES, lay.total, need >= 0x1p30 ? need / 0x1p30 : need / 0x1p20,
                   need >= 0x1p30 ? "GiB" : "MiB");
}

/* spec.training -> the worker's config JSON, with the job's rendezvous port
 * folded in, checked by the worker's own parser for every world size. */
static int parse_training(const cJSON *spec, rl_op_job *j, rl_err *e) {
    const cJSON *tr = member(spec, "training");
    cJSON *cfg = tr && !cJSON_IsNull(tr) ? cJSON_Duplicate(tr, 1) : cJSON_CreateObject();
    if (!cfg) return rl_errf(e, RL_ENOMEM, "out of memory");
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return rl_errf(e, RL_EINPUT, "spec.training: must be an object");
    }
    cJSON *rdzv = cJSON_GetObjectItemCaseSensitive(cfg, "rdzv");
    if (!rdzv) rdzv = cJSON_AddObjectToObject(cfg, "rdzv");
    if (!cJSON_IsObject(rdzv)) {
        cJSON_Delete(cfg);
        return rl_errf(e, RL_EINPUT, "spec.training.rdzv: must be an object");
    }
    /* these belong to the TrainingJob, not to the training config (the
     * table marks them; the CRD's schema leaves them out) */
    const rl_cfg_section *rs = &rl_rdzv_config_section;
    for (int i = 0; i < rs->n; i++) {
        const char *k = rs->fields[i].name;
        if (!(rs->fields[i].flags & RL_CFG_OPERATOR) || !cJSON_GetObjectItemCaseSensitive(rdzv, k)) continue;
        cJSON_Delete(cfg);
        return rl_errf(e, RL_EINPUT, "spec.training.rdzv.%s: set by the TrainingJob (%s), not here", k,
                       !strcmp(k, "port")            ? "spec.rdzvPort"
                       : !strcmp(k, "etcd_endpoint") ? "its rendezvous is the Kubernetes API"
                                                     : "spec.replicas / spec.elastic");
    }
    cJSON_AddNumberToObject(rdzv, "port", j->rdzv_port);
    j->training_json = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    if (!j->training_json) return rl_errf(e, RL_ENOMEM, "out of memory");

    rl_job_config jc;
    rl_job_config_default(&jc);
    int rc = rl_job_config_parse(j->training_json, strlen(j->training_json), "spec.training", &jc, e);
    if (rc) return rc;
    /* a GPU pod trains and reduces on its GPUs: the CPU and its ring cannot */
    if (j->gpus > 0 && !strcmp(jc.dist.backend, "tcp"))
        return rl_errf(e, RL_EINPUT, "spec.training.dist.backend: \"tcp\" on a job with gpusPerNode %d "
                       "(use auto, or nccl)", j->gpus);
    if (j->gpus > 0 && !strcmp(jc.train.device, "cpu"))
        return rl_errf(e, RL_EINPUT, "spec.training.train.device: \"cpu\" on a job with gpusPerNode %d "
                       "(use auto, or cuda)", j->gpus);
    for (int n = j->min_nodes; n <= j->max_nodes; n++)
        if ((rc = rl_job_config_check_world(&jc, n * j->nproc, "spec.training", e))) {
            return rl_err_wrap(e, "with %d node%s x %d process%s", n, n == 1 ? "" : "s", j->nproc,
                               j->nproc == 1 ? "" : "es");
        }
    return check_shm_room(j, &jc, e);
}

/* spec.<field>: a boolean, absent or null false. */
static int get_flag(const cJSON *spec, const char *field, bool *out, rl_err *e) {
    const cJSON *s = member(spec, field);
    if (s && !cJSON_IsNull(s) && !cJSON_IsBool(s)) return rl_errf(e, RL_EINPUT, "spec.%s: must be a boolean", field);
    *out = cJSON_IsTrue(s);
    return RL_OK;
}

int rl_op_job_parse(const cJSON *obj, rl_op_job *j, rl_err *e) {
    memset(j, 0, sizeof *j);
    const cJSON *md = member(obj, "metadata");
    int rc;
    if ((rc = get_str(md, "metadata", "name", "", j->name, sizeof j->name, e)) ||
        (rc = get_str(md, "metadata", "namespace", "default", j->ns, sizeof j->ns, e)) ||
        (rc = get_str(md, "metadata", "uid", "", j->uid, sizeof j->uid, e)) ||
        (rc = get_int(md, "metadata", "generation", 0, 1ll << 53, 0, &j->generation, e)) ||
        (rc = check_job_name(j->name, e)))
        return rc;
    const cJSON *spec = member(obj, "spec");
    if (!cJSON_IsObject(spec)) return rl_errf(e, RL_EINPUT, "spec: required, must be an object");
    j->spec = spec;
    static const char *const pulls[] = {"Always", "IfNotPresent", "Never", NULL};
    static const char *const cleans[] = {"All", "Running", "None", NULL};
    long long replicas, nproc, gpus, limit, mport, rport;
    if ((rc = get_str(spec, "spec", "image", "", j->image, sizeof j->image, e)))
        return rc;
    if (!j->image[0]) return rl_errf(e, RL_EINPUT, "spec.image: required");
    if ((rc = get_str(spec, "spec", "imagePullPolicy", "IfNotPresent", j->pull_policy, sizeof j->pull_policy, e)) ||
        (rc = one_of(j->pull_policy, "spec", "imagePullPolicy", pulls, e)) ||
        (rc = get_str(spec, "spec", "cleanPodPolicy", "All", j->clean_policy, sizeof j->clean_policy, e)) ||
        (rc = one_of(j->clean_policy, "spec", "cleanPodPolicy", cleans, e)) ||
        (rc = get_int(spec, "spec", "replicas", 0, 10000, 1, &replicas, e)) ||
        (rc = get_int(spec, "spec", "nprocPerNode", 1, 1024, 1, &nproc, e)) ||
        (rc = get_int(spec, "spec", "gpusPerNode", 0, 1024, 0, &gpus, e)) ||
        (rc = get_int(spec, "spec", "restartLimit", 0, 1000, 3, &limit, e)) ||
        (rc = get_int(spec, "spec", "terminationGracePeriodSeconds", 0, 86400, 60, &j->grace_s, e)) ||
        (rc = get_int(spec, "spec", "metricsPort", 0, 65535, 9090, &mport, e)) ||
        (rc = get_int(spec, "spec", "rdzvPort", 1, 65535, 29400, &rport, e)))
        return rc;
    j->replicas = (int)replicas, j->nproc = (int)nproc, j->gpus = (int)gpus;
    j->restart_limit = (int)limit, j->metrics_port = (int)mport, j->rdzv_port = (int)rport;
    if (mport == rport) return rl_errf(e, RL_EINPUT, "spec.metricsPort: %lld is also spec.rdzvPort", mport);
    /* one trainer per GPU (LOCAL_RANK picks it): more processes than GPUs
     * would leave some without a device */
    if (gpus > 0 && nproc > gpus)
        return rl_errf(e, RL_EINPUT, "spec.nprocPerNode: %lld trainer processes but gpusPerNode %lld "
                       "(one process per GPU)", nproc, gpus);
    if ((rc = get_flag(spec, "suspend", &j->suspend, e)) || (rc = get_flag(spec, "disruptible", &j->disruptible, e)) ||
        (rc = get_flag(spec, "networkPolicy", &j->network_policy, e)))
        return rc;
    /* networkPolicy defaults to true: only an explicit false turns it off */
    j->network_policy = !cJSON_IsFalse(member(spec, "networkPolicy"));

    /* nodes: a fixed-size job is min = max = replicas; an elastic one keeps
     * replicas (what `kubectl scale` sets) inside its range. */
    const cJSON *el = member(spec, "elastic");
    if (el && !cJSON_IsNull(el)) {
        long long mn, mx;
        if (!cJSON_IsObject(el)) return rl_errf(e, RL_EINPUT, "spec.elastic: must be an object");
        if ((rc = get_int(el, "spec.elastic", "minReplicas", 1, 10000, 1, &mn, e)) ||
            (rc = get_int(el, "spec.elastic", "maxReplicas", 1, 10000, mn > replicas ? mn : replicas, &mx, e)))
            return rc;
        if (mx < mn)
            return rl_errf(e, RL_EINPUT, "spec.elastic.maxReplicas: %lld is below minReplicas %lld", mx, mn);
        j->elastic = true, j->min_nodes = (int)mn, j->max_nodes = (int)mx;
        if (j->replicas < j->min_nodes) j->replicas = j->min_nodes;
        if (j->replicas > j->max_nodes) j->replicas = j->max_nodes;
    } else {
        if (replicas < 1) return rl_errf(e, RL_EINPUT, "spec.replicas: a job needs at least 1 node");
        j->min_nodes = j->max_nodes = j->replicas;
    }
    if ((rc = parse_s3(spec, j, e)) || (rc = parse_secret_refs(spec, e)) || (rc = parse_volumes(spec, j, e)) ||
        (rc = check_env_secrets(spec, j, e)) || (rc = parse_pod_passthrough(spec, e)) ||
        (rc = parse_rack_label(spec, j, e)))
        return rc;
    return parse_training(spec, j, e);
}

void rl_op_job_free(rl_op_job *j) {
    free(j->training_json);
    j->training_json = NULL;
}
