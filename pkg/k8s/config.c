/* Where the API server is and how to prove who we are: in-cluster (the
 * service-account mount) or kubeconfigs (one file or a KUBECONFIG list,
 * merged as kubectl merges it). Parsing reads no file other than the
 * kubeconfigs themselves; referenced files (CA, token, client certificate)
 * are read by the client when it is created, and an exec plugin is run
 * when a token is needed, so the parser can be fuzzed. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k8s_internal.h"

void rl_k8s_config_free(rl_k8s_config *c) {
    if (!c) return;
    rl_k8s__exec_free(c->exec);
    free(c->ca_pem);
    free(c->cert_pem);
    free(c->key_pem);
    if (c->token) {
        memset(c->token, 0, strlen(c->token));
        free(c->token);
    }
    memset(c, 0, sizeof *c);
}

static int copy_field(char *dst, size_t n, const char *src, const char *where,
                      const char *field, rl_err *e) {
    size_t l = strlen(src);
    if (l >= n) return rl_errf(e, RL_EINPUT, "%s: %s: too long (%zu bytes)", where, field, l);
    memcpy(dst, src, l + 1);
    return RL_OK;
}

/* ---- in-cluster ------------------------------------------------------------------- */
int rl_k8s_config_in_cluster(rl_k8s_config *c, rl_err *e) {
    memset(c, 0, sizeof *c);
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port)
        return rl_errf(e, RL_EINPUT,
                       "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                       "must be set (not running in a pod? use a kubeconfig)");
    for (const char *q = port; *q; q++)
        if (*q < '0' || *q > '9')
            return rl_errf(e, RL_EINPUT, "in-cluster config: KUBERNETES_SERVICE_PORT \"%.20s\" "
                                         "is not a port number", port);
    bool v6 = strchr(host, ':') != NULL;
    int w = snprintf(c->server, sizeof c->server, "https://%s%s%s:%s", v6 ? "[" : "", host,
                     v6 ? "]" : "", port);
    if (w < 0 || (size_t)w >= sizeof c->server)
        return rl_errf(e, RL_EINPUT, "in-cluster config: KUBERNETES_SERVICE_HOST too long");
    const char *dir = getenv("RL_K8S_SA_DIR");
    if (!dir || !*dir) dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    snprintf(c->source, sizeof c->source, "in-cluster config (%s)", dir);
    if ((size_t)snprintf(c->token_file, sizeof c->token_file, "%s/token", dir) >=
            sizeof c->token_file ||
        (size_t)snprintf(c->ca_file, sizeof c->ca_file, "%s/ca.crt", dir) >= sizeof c->ca_file)
        return rl_errf(e, RL_EINPUT, "in-cluster config: RL_K8S_SA_DIR too long");
    struct stat st;
    if (stat(c->token_file, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
        return rl_errf(e, RL_EINPUT, "in-cluster config: service-account token %s missing or empty",
                       c->token_file);
    if (stat(c->ca_file, &st) != 0 || !S_ISREG(st.st_mode))
        return rl_errf(e, RL_EINPUT, "in-cluster config: CA certificate %s missing", c->ca_file);
    char nsfile[1100];
    snprintf(nsfile, sizeof nsfile, "%s/namespace", dir);
    char *ns = NULL;
    size_t nl = 0;
    strcpy(c->ns, "default");
    if (access(nsfile, F_OK) == 0) {
        if (rl_read_file(nsfile, &ns, &nl, e) != RL_OK) return e ? e->code : RL_EINPUT;
        while (nl && (ns[nl - 1] == '\n' || ns[nl - 1] == '\r' || ns[nl - 1] == ' ')) ns[--nl] = 0;
        int rc = nl ? copy_field(c->ns, sizeof c->ns, ns, nsfile, "namespace", e) : RL_OK;
        free(ns);
        if (rc) return rc;
    }
    return RL_OK;
}

/* ---- kubeconfig ------------------------------------------------------------------ */
#define MAX_FILES 64 /* a KUBECONFIG list longer than this is a mistake */

typedef struct kfile {
    const char *path;
    char dir[1024]; /* anchors its relative references */
    cJSON *root;
} kfile;

typedef struct kc {
    const kfile *f; /* the list, first file first */
    int n;
    const char *path; /* the file being read now, for messages */
    const char *dir;
    char list[600];   /* every path, for messages about the whole list */
    rl_err *e;
} kc;

/* Read entries of file f from now on (messages name it, paths resolve in it). */
static void use_file(kc *k, const kfile *f) {
    k->path = f->path;
    k->dir = f->dir;
}

/* A string member: absent or null -> *out NULL; anything else not a string
 * is an error naming field. */
static int get_str(kc *k, const cJSON *obj, const char *key, const char *field,
                   const char **out) {
    *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsString(v))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.%s: must be a string", k->path,
                       field, key);
    *out = v->valuestring;
    return RL_OK;
}

static int get_bool(kc *k, const cJSON *obj, const char *key, const char *field, bool *out) {
    *out = false;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return RL_OK;
    }
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        const char *t[] = {"true", "yes", "on"}, *f[] = {"false", "no", "off"};
        for (int i = 0; i < 3; i++) {
            if (!strcasecmp(s, t[i])) return *out = true, RL_OK;
            if (!strcasecmp(s, f[i])) return RL_OK;
        }
    }
    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.%s: must be true or false", k->path,
                   field, key);
}

const char *rl_k8s__printable(const char *s, char *out, size_t n) {
    size_t o = 0;
    for (; *s && o + 1 < n; s++) out[o++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    out[o] = '\0';
    return out;
}

/* What kubectl refuses when it loads a file, before any entry is used: a
 * top that is not a mapping, lists that are not lists of mappings, a name
 * given twice in one list. */
static int check_file(kc *k, const kfile *f) {
    use_file(k, f);
    if (!cJSON_IsObject(f->root))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: not a mapping at the top", k->path);
    const char *cur;
    int rc = get_str(k, f->root, "current-context", "(top)", &cur);
    if (rc) return rc;
    static const char *lists[] = {"clusters", "contexts", "users"};
    for (int l = 0; l < 3; l++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(f->root, lists[l]);
        if (!arr || cJSON_IsNull(arr)) continue;
        if (!cJSON_IsArray(arr))
            return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a list", k->path, lists[l]);
        int i = 0;
        for (const cJSON *it = arr->child; it; it = it->next, i++) {
            if (!cJSON_IsObject(it))
                return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s[%d]: must be a mapping", k->path,
                               lists[l], i);
            const char *name;
            char field[32], pn[201];
            snprintf(field, sizeof field, "%s[%d]", lists[l], i);
            if ((rc = get_str(k, it, "name", field, &name))) return rc;
            for (const cJSON *prev = arr->child; name && prev != it; prev = prev->next) {
                const cJSON *pname = cJSON_GetObjectItemCaseSensitive(prev, "name");
                if (cJSON_IsString(pname) && strcmp(pname->valuestring, name) == 0)
                    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: duplicate name \"%s\"",
                                   k->path, lists[l], rl_k8s__printable(name, pn, sizeof pn));
            }
        }
    }
    return RL_OK;
}

/* The `inner` object of the list entry named `name` (kubeconfig's
 * "clusters: - name: x\n  cluster: {...}" shape), from the first file of
 * the list that has one -- kubectl's merge -- which is then the file read. */
static int find_named(kc *k, const char *list, const char *inner, const char *name,
                      const cJSON **out, char *field, size_t fn) {
    *out = NULL;
    char pn[201];
    rl_k8s__printable(name, pn, sizeof pn);
    snprintf(field, fn, "%s[name=%s].%s", list, pn, inner);
    for (int i = 0; i < k->n; i++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(k->f[i].root, list)) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (!cJSON_IsString(n) || strcmp(n->valuestring, name) != 0) continue;
            use_file(k, &k->f[i]);
            const cJSON *in = cJSON_GetObjectItemCaseSensitive(it, inner);
            if (in && !cJSON_IsNull(in) && !cJSON_IsObject(in))
                return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a mapping", k->path,
                               field);
            static const cJSON empty = {0};
            *out = in && cJSON_IsObject(in) ? in : &empty;
            return RL_OK;
        }
    }
    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: no entry named \"%s\"", k->list, list, pn);
}

static int resolve(kc *k, const char *ref, char *dst, size_t n, const char *field) {
    int w = ref[0] == '/' || !k->dir[0] ? snprintf(dst, n, "%s", ref)
                                        : snprintf(dst, n, "%s/%s", k->dir, ref);
    if (w < 0 || (size_t)w >= n)
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: path too long", k->path, field);
    return RL_OK;
}

/* Standard base64 with padding (what kubectl writes); line breaks allowed. */
static int b64_decode(kc *k, const char *s, const char *field, char **out, size_t *outlen) {
    if (rl_base64_decode(s, strlen(s), true, out, outlen) == 0 && *outlen > 0) return RL_OK;
    free(*out);
    *out = NULL;
    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: not valid base64", k->path, field);
}

/* One file reference: inline data (base64) wins over a path, as in kubectl. */
static int file_or_data(kc *k, const char *field, const char *name, const char *path,
                        const char *data, char *file, size_t fn, char **pem, size_t *pem_len) {
    char f2[460];
    if (data && *data) {
        snprintf(f2, sizeof f2, "%s.%s-data", field, name);
        return b64_decode(k, data, f2, pem, pem_len);
    }
    if (!path || !*path) return RL_OK;
    snprintf(f2, sizeof f2, "%s.%s", field, name);
    return resolve(k, path, file, fn, f2);
}

/* The first current-context set in the list. */
static int current_context(kc *k, const char **out) {
    *out = NULL;
    for (int i = 0; i < k->n && !(*out && **out); i++) {
        use_file(k, &k->f[i]);
        int rc = get_str(k, k->f[i].root, "current-context", "(top)", out);
        if (rc) return rc;
    }
    if (!*out || !**out)
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: current-context is not set (name a context)",
                       k->list);
    return RL_OK;
}

static int read_cluster(kc *k, const char *name, rl_k8s_config *c, const cJSON **cl) {
    rl_err *e = k->e;
    char field[320], f2[400];
    int rc = find_named(k, "clusters", "cluster", name, cl, field, sizeof field);
    if (rc) return rc;
    const char *server, *ca, *cadata;
    bool insecure;
    if ((rc = get_str(k, *cl, "server", field, &server)) ||
        (rc = get_str(k, *cl, "certificate-authority", field, &ca)) ||
        (rc = get_str(k, *cl, "certificate-authority-data", field, &cadata)) ||
        (rc = get_bool(k, *cl, "insecure-skip-tls-verify", field, &insecure)))
        return rc;
    if (insecure)
        return rl_errf(e, RL_EINPUT,
                       "kubeconfig %s: %s.insecure-skip-tls-verify: refused: TLS is always verified; "
                       "give certificate-authority or certificate-authority-data instead",
                       k->path, field);
    if (!server || !*server)
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s.server: missing", k->path, field);
    if (strncmp(server, "https://", 8) != 0 && strncmp(server, "http://", 7) != 0)
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s.server: must start with https://",
                       k->path, field);
    snprintf(f2, sizeof f2, "%s.server", field);
    if ((rc = copy_field(c->server, sizeof c->server, server, k->path, f2, e))) return rc;
    size_t sl = strlen(c->server);
    while (sl > 8 && c->server[sl - 1] == '/') c->server[--sl] = '\0';
    return file_or_data(k, field, "certificate-authority", ca, cadata, c->ca_file,
                        sizeof c->ca_file, &c->ca_pem, &c->ca_pem_len);
}

/* ---- exec credentials ---- */

/* A NULL-terminated list of strings: one more slot, zeroed. */
static int strv_push(kc *k, char ***v, int *n, const char *s) {
    char **nv = realloc(*v, (size_t)(*n + 2) * sizeof *nv);
    if (!nv) return rl_errf(k->e, RL_ENOMEM, "out of memory");
    *v = nv;
    if (!(nv[*n] = strdup(s))) return rl_errf(k->e, RL_ENOMEM, "out of memory");
    nv[++*n] = NULL;
    return RL_OK;
}

static int exec_args(kc *k, const cJSON *x, const char *f, rl_k8s_exec *ex, int *argc) {
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(x, "args");
    if (!args || cJSON_IsNull(args)) return RL_OK;
    if (!cJSON_IsArray(args))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.args: must be a list", k->path, f);
    int i = 0, rc;
    for (const cJSON *a = args->child; a; a = a->next, i++) {
        if (!cJSON_IsString(a))
            return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.args[%d]: must be a string",
                           k->path, f, i);
        if ((rc = strv_push(k, &ex->argv, argc, a->valuestring))) return rc;
    }
    return RL_OK;
}

static int exec_env(kc *k, const cJSON *x, const char *f, rl_k8s_exec *ex) {
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(x, "env");
    if (!env || cJSON_IsNull(env)) return RL_OK;
    if (!cJSON_IsArray(env))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.env: must be a list", k->path, f);
    int i = 0, n = 0, rc;
    for (const cJSON *v = env->child; v; v = v->next, i++) {
        char fi[440];
        snprintf(fi, sizeof fi, "%s.env[%d]", f, i);
        const char *name, *value;
        if (!cJSON_IsObject(v))
            return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a mapping", k->path, fi);
        if ((rc = get_str(k, v, "name", fi, &name)) || (rc = get_str(k, v, "value", fi, &value)))
            return rc;
        if (!name || !*name || strchr(name, '='))
            return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.name: must be a variable name",
                           k->path, fi);
        size_t l = strlen(name) + (value ? strlen(value) : 0) + 2;
        char *kv = malloc(l);
        if (!kv) return rl_errf(k->e, RL_ENOMEM, "out of memory");
        snprintf(kv, l, "%s=%s", name, value ? value : "");
        rc = strv_push(k, &ex->env, &n, kv);
        free(kv);
        if (rc) return rc;
    }
    return RL_OK;
}

/* interactiveMode: client-go asks v1 to name it and defaults v1beta1 to
 * IfAvailable; we never have a terminal, so Always can never work. */
static int exec_mode(kc *k, const cJSON *x, const char *f, bool v1) {
    const char *mode;
    int rc = get_str(k, x, "interactiveMode", f, &mode);
    if (rc) return rc;
    if ((!mode || !*mode) && v1)
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.interactiveMode: missing (Never or "
                       "IfAvailable; client.authentication.k8s.io/v1 requires it)", k->path, f);
    if (!mode || !*mode || !strcmp(mode, "Never") || !strcmp(mode, "IfAvailable")) return RL_OK;
    if (!strcmp(mode, "Always"))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.interactiveMode: Always needs a "
                       "terminal, and the plugin runs without one (use IfAvailable or Never)",
                       k->path, f);
    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.interactiveMode: must be Never, "
                   "IfAvailable or Always", k->path, f);
}

/* The cluster's client.authentication.k8s.io/exec extension, passed to the
 * plugin as spec.cluster.config. */
static int exec_cluster_config(kc *k, const cJSON *cl, rl_k8s_exec *ex) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(cl, "extensions")) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(it, "extension");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, "client.authentication.k8s.io/exec") ||
            !x)
            continue;
        if (!(ex->cluster_config = cJSON_PrintUnformatted(x)))
            return rl_errf(k->e, RL_ENOMEM, "out of memory");
        break;
    }
    return RL_OK;
}

static int read_exec(kc *k, const cJSON *x, const char *field, const cJSON *cl, rl_k8s_config *c) {
    char f[360];
    snprintf(f, sizeof f, "%s.exec", field);
    if (!cJSON_IsObject(x))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a mapping", k->path, f);
    rl_k8s_exec *ex = c->exec = calloc(1, sizeof *ex);
    if (!ex) return rl_errf(k->e, RL_ENOMEM, "out of memory");
    snprintf(ex->where, sizeof ex->where, "kubeconfig %s: %s", k->path, f);
    const char *api, *cmd, *hint;
    int rc, argc = 0;
    if ((rc = get_str(k, x, "apiVersion", f, &api)) || (rc = get_str(k, x, "command", f, &cmd)) ||
        (rc = get_str(k, x, "installHint", f, &hint)) ||
        (rc = get_bool(k, x, "provideClusterInfo", f, &ex->provide_cluster_info)))
        return rc;
    bool v1 = api && !strcmp(api, "client.authentication.k8s.io/v1");
    if (!v1 && (!api || strcmp(api, "client.authentication.k8s.io/v1beta1")))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.apiVersion: must be "
                       "client.authentication.k8s.io/v1 or v1beta1", k->path, f);
    snprintf(ex->api_version, sizeof ex->api_version, "%s", api);
    if (!cmd || !*cmd)
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s.command: missing", k->path, f);
    char path[1024], fc[380];
    snprintf(fc, sizeof fc, "%s.command", f);
    /* kubectl: a command with a '/' is a file relative to the kubeconfig,
     * a bare name is looked up in PATH */
    if (strchr(cmd, '/') && (rc = resolve(k, cmd, path, sizeof path, fc))) return rc;
    if ((rc = strv_push(k, &ex->argv, &argc, strchr(cmd, '/') ? path : cmd)) ||
        (rc = exec_args(k, x, f, ex, &argc)) || (rc = exec_env(k, x, f, ex)) ||
        (rc = exec_mode(k, x, f, v1)))
        return rc;
    if (hint && *hint && !(ex->install_hint = strdup(hint)))
        return rl_errf(k->e, RL_ENOMEM, "out of memory");
    return ex->provide_cluster_info ? exec_cluster_config(k, cl, ex) : RL_OK;
}

static int read_user(kc *k, const char *name, const cJSON *cl, rl_k8s_config *c) {
    rl_err *e = k->e;
    char field[320];
    const cJSON *us;
    int rc = find_named(k, "users", "user", name, &us, field, sizeof field);
    if (rc) return rc;
    static const char *unsupported[] = {"auth-provider", "username", "password", "as",
                                        "as-groups", NULL};
    for (int i = 0; unsupported[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(us, unsupported[i]);
        if (v && !cJSON_IsNull(v))
            return rl_errf(e, RL_EINPUT,
                           "kubeconfig %s: %s.%s: not supported (use a token, tokenFile, exec or a "
                           "client certificate)",
                           k->path, field, unsupported[i]);
    }
    const char *tok, *tokfile, *cert, *certdata, *key, *keydata;
    if ((rc = get_str(k, us, "token", field, &tok)) ||
        (rc = get_str(k, us, "tokenFile", field, &tokfile)) ||
        (rc = get_str(k, us, "client-certificate", field, &cert)) ||
        (rc = get_str(k, us, "client-certificate-data", field, &certdata)) ||
        (rc = get_str(k, us, "client-key", field, &key)) ||
        (rc = get_str(k, us, "client-key-data", field, &keydata)))
        return rc;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(us, "exec");
    if (x && !cJSON_IsNull(x)) {
        if ((tok && *tok) || (tokfile && *tokfile))
            return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s.exec: cannot be combined with token "
                           "or tokenFile", k->path, field);
        if ((rc = read_exec(k, x, field, cl, c))) return rc;
    }
    if (tok && *tok) {
        c->token = strdup(tok);
        if (!c->token) return rl_errf(e, RL_ENOMEM, "out of memory");
    } else if (tokfile && *tokfile) {
        char f2[360];
        snprintf(f2, sizeof f2, "%s.tokenFile", field);
        if ((rc = resolve(k, tokfile, c->token_file, sizeof c->token_file, f2))) return rc;
    }
    bool has_cert = (cert && *cert) || (certdata && *certdata);
    bool has_key = (key && *key) || (keydata && *keydata);
    if (has_cert != has_key)
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s: %s given without %s", k->path, field,
                       has_cert ? "client-certificate" : "client-key",
                       has_cert ? "client-key" : "client-certificate");
    if ((rc = file_or_data(k, field, "client-certificate", cert, certdata, c->cert_file,
                           sizeof c->cert_file, &c->cert_pem, &c->cert_pem_len)))
        return rc;
    return file_or_data(k, field, "client-key", key, keydata, c->key_file, sizeof c->key_file,
                        &c->key_pem, &c->key_pem_len);
}

static int parse_merged(kc *k, const char *context, rl_k8s_config *c) {
    rl_err *e = k->e;
    int rc;
    const char *ctx = context;
    if ((!ctx || !*ctx) && (rc = current_context(k, &ctx))) return rc;
    char field[320];
    const cJSON *cx, *cl;
    if ((rc = find_named(k, "contexts", "context", ctx, &cx, field, sizeof field))) return rc;
    const char *cluster, *user, *ns;
    if ((rc = get_str(k, cx, "cluster", field, &cluster)) || (rc = get_str(k, cx, "user", field, &user)) ||
        (rc = get_str(k, cx, "namespace", field, &ns)))
        return rc;
    if (!cluster || !*cluster)
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s.cluster: missing", k->path, field);
    char pc[201];
    snprintf(c->source, sizeof c->source, "kubeconfig %s (context %s)", k->path,
             rl_k8s__printable(ctx, pc, sizeof pc));
    snprintf(c->ns, sizeof c->ns, "default");
    if (ns && *ns && (rc = copy_field(c->ns, sizeof c->ns, ns, k->path, "namespace", e))) return rc;
    if ((rc = read_cluster(k, cluster, c, &cl))) return rc;
    return user && *user ? read_user(k, user, cl, c) : RL_OK;
}

static void set_dir(kfile *f) {
    const char *slash = strrchr(f->path, '/');
    if (slash && (size_t)(slash - f->path) < sizeof f->dir) {
        memcpy(f->dir, f->path, (size_t)(slash - f->path));
        f->dir[slash - f->path] = '\0';
        if (slash == f->path) strcpy(f->dir, "/");
    }
}

int rl_k8s_config_parse_list(int n, const char *const *texts, const size_t *lens,
                             const char *const *paths, const char *context, rl_k8s_config *c,
                             rl_err *e) {
    memset(c, 0, sizeof *c);
    if (n < 1 || n > MAX_FILES)
        return rl_errf(e, RL_EINPUT, "kubeconfig: %d files (1 to %d)", n, MAX_FILES);
    kfile *f = calloc((size_t)n, sizeof *f);
    if (!f) return rl_errf(e, RL_ENOMEM, "out of memory");
    kc k = {.f = f, .n = n, .e = e};
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        f[i].path = paths && paths[i] ? paths[i] : "(memory)";
        set_dir(&f[i]);
        int w = snprintf(k.list + o, sizeof k.list - o, "%s%s", i ? ":" : "", f[i].path);
        o = w > 0 && (size_t)w < sizeof k.list - o ? o + (size_t)w : sizeof k.list - 1;
    }
    int rc = RL_OK;
    for (int i = 0; i < n && rc == RL_OK; i++) {
        char where[1100];
        snprintf(where, sizeof where, "kubeconfig %s", f[i].path);
        rc = rl_k8s_yaml_parse(texts[i], lens[i], where, &f[i].root, e);
        if (rc == RL_OK) rc = check_file(&k, &f[i]);
    }
    if (rc == RL_OK) rc = parse_merged(&k, context, c);
    for (int i = 0; i < n; i++) cJSON_Delete(f[i].root);
    free(f);
    if (rc) rl_k8s_config_free(c);
    return rc;
}

int rl_k8s_config_parse(const char *text, size_t len, const char *path, const char *context,
                        rl_k8s_config *c, rl_err *e) {
    return rl_k8s_config_parse_list(1, &text, &len, &path, context, c, e);
}

/* The files of a KUBECONFIG-style list, in order, each once (kubectl
 * drops repeats and empty entries). */
static int split_list(const char *list, char (*out)[1024], int *n, rl_err *e) {
    *n = 0;
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ":");
        if (l >= sizeof out[0]) return rl_errf(e, RL_EINPUT, "kubeconfig %.200s: path too long", p);
        if (l) {
            if (*n == MAX_FILES)
                return rl_errf(e, RL_EINPUT, "kubeconfig: more than %d files in the list", MAX_FILES);
            memcpy(out[*n], p, l);
            out[*n][l] = '\0';
            bool seen = false;
            for (int i = 0; i < *n && !seen; i++) seen = !strcmp(out[i], out[*n]);
            if (!seen) ++*n;
        }
        p += l + (p[l] == ':');
    }
    if (*n == 0) return rl_errf(e, RL_EINPUT, "kubeconfig: no file named");
    return RL_OK;
}

/* Read the list's files; of a list, the missing ones are skipped. */
static int read_list(char (*paths)[1024], int *n, char **texts, size_t *lens, rl_err *e) {
    int kept = 0, total = *n;
    for (int i = 0; i < total; i++) {
        struct stat st;
        if (total > 1 && stat(paths[i], &st) != 0 && errno == ENOENT) continue;
        if (rl_read_file(paths[i], &texts[kept], &lens[kept], e))
            return *n = kept, rl_err_wrap(e, "kubeconfig");
        if (kept != i) memcpy(paths[kept], paths[i], sizeof paths[0]);
        kept++;
    }
    *n = kept;
    if (kept == 0) return rl_errf(e, RL_EINPUT, "kubeconfig: none of the %d files of the list exists", total);
    return RL_OK;
}

int rl_k8s_config_kubeconfig(const char *path, const char *context, rl_k8s_config *c,
                             rl_err *e) {
    char home[1100];
    memset(c, 0, sizeof *c);
    if (!path || !*path) {
        path = getenv("KUBECONFIG");
        if (!path || !*path) {
            const char *h = getenv("HOME");
            if (!h || !*h)
                return rl_errf(e, RL_EINPUT, "no kubeconfig: KUBECONFIG and HOME are unset");
            snprintf(home, sizeof home, "%s/.kube/config", h);
            path = home;
        }
    }
    char(*paths)[1024] = calloc(MAX_FILES, sizeof *paths);
    char **texts = calloc(MAX_FILES, sizeof *texts);
    size_t *lens = calloc(MAX_FILES, sizeof *lens);
    const char *names[MAX_FILES];
    int n = 0, rc = !paths || !texts || !lens ? rl_errf(e, RL_ENOMEM, "out of memory") : RL_OK;
    if (rc == RL_OK) rc = split_list(path, paths, &n, e);
    if (rc == RL_OK) rc = read_list(paths, &n, texts, lens, e);
    for (int i = 0; i < n; i++) names[i] = paths[i];
    if (rc == RL_OK)
        rc = rl_k8s_config_parse_list(n, (const char *const *)texts, lens, names, context, c, e);
    for (int i = 0; texts && i < MAX_FILES; i++) free(texts[i]);
    free(texts);
    free(lens);
    free(paths);
    return rc;
}

int rl_k8s_config_auto(rl_k8s_config *c, rl_err *e) {
    const char *h = getenv("KUBERNETES_SERVICE_HOST");
    if (h && *h) return rl_k8s_config_in_cluster(c, e);
    return rl_k8s_config_kubeconfig(NULL, NULL, c, e);
}

int rl_k8s_connect(const char *kubeconfig, const rl_k8s_opts *opts, rl_k8s **out, rl_err *e) {
    rl_k8s_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = kubeconfig && *kubeconfig ? rl_k8s_config_kubeconfig(kubeconfig, NULL, &cfg, e)
                                       : rl_k8s_config_auto(&cfg, e);
    if (rc == RL_OK) rc = rl_k8s_new(&cfg, opts, out, e);
    rl_k8s_config_free(&cfg);
    return rc;
}
