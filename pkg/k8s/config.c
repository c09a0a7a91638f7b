/* Where the API server is and how to prove who we are: in-cluster (the
 * service-account mount) or a kubeconfig. Parsing reads no file other than
 * the kubeconfig itself; referenced files (CA, token, client certificate)
 * are read by the client when it is created, so the parser can be fuzzed. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k8s.h"

void rl_k8s_config_free(rl_k8s_config *c) {
    if (!c) return;
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
typedef struct kc {
    const char *path; /* for messages */
    char dir[1024];   /* anchors relative references */
    rl_err *e;
} kc;

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

/* A name from the file as it may appear in a one-line message. */
static const char *printable(const char *s, char *out, size_t n) {
    size_t o = 0;
    for (; *s && o + 1 < n; s++) out[o++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    out[o] = '\0';
    return out;
}

/* The `inner` object of the list entry named `name` (kubeconfig's
 * "clusters: - name: x\n  cluster: {...}" shape). */
static int find_named(kc *k, const cJSON *root, const char *list, const char *inner,
                      const char *name, const cJSON **out, char *field, size_t fn) {
    *out = NULL;
    char pn[201];
    printable(name, pn, sizeof pn);
    snprintf(field, fn, "%s[name=%s].%s", list, pn, inner);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, list);
    if (arr && !cJSON_IsNull(arr) && !cJSON_IsArray(arr))
        return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a list", k->path, list);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsObject(it)) continue;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, name) != 0) continue;
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(it, inner);
        if (in && !cJSON_IsNull(in) && !cJSON_IsObject(in))
            return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: must be a mapping", k->path,
                           field);
        static const cJSON empty = {0};
        *out = in && cJSON_IsObject(in) ? in : &empty;
        return RL_OK;
    }
    return rl_errf(k->e, RL_EINPUT, "kubeconfig %s: %s: no entry named \"%s\"", k->path, list, pn);
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

static int parse_root(kc *k, const cJSON *root, const char *context, rl_k8s_config *c) {
    rl_err *e = k->e;
    int rc;
    if (!cJSON_IsObject(root))
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: not a mapping at the top", k->path);
    const char *ctx = context;
    if (!ctx || !*ctx) {
        if ((rc = get_str(k, root, "current-context", "(top)", &ctx))) return rc;
        if (!ctx || !*ctx)
            return rl_errf(e, RL_EINPUT, "kubeconfig %s: current-context is not set (name a context)",
                           k->path);
    }
    char field[320], f2[400];
    const cJSON *cx, *cl, *us = NULL;
    if ((rc = find_named(k, root, "contexts", "context", ctx, &cx, field, sizeof field))) return rc;
    const char *cluster, *user, *ns;
    if ((rc = get_str(k, cx, "cluster", field, &cluster)) || (rc = get_str(k, cx, "user", field, &user)) ||
        (rc = get_str(k, cx, "namespace", field, &ns)))
        return rc;
    if (!cluster || !*cluster)
        return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s.cluster: missing", k->path, field);
    char pc[201];
    snprintf(c->source, sizeof c->source, "kubeconfig %s (context %s)", k->path,
             printable(ctx, pc, sizeof pc));
    snprintf(c->ns, sizeof c->ns, "default");
    if (ns && *ns && (rc = copy_field(c->ns, sizeof c->ns, ns, k->path, "namespace", e))) return rc;

    if ((rc = find_named(k, root, "clusters", "cluster", cluster, &cl, field, sizeof field)))
        return rc;
    const char *server, *ca, *cadata;
    bool insecure;
    if ((rc = get_str(k, cl, "server", field, &server)) ||
        (rc = get_str(k, cl, "certificate-authority", field, &ca)) ||
        (rc = get_str(k, cl, "certificate-authority-data", field, &cadata)) ||
        (rc = get_bool(k, cl, "insecure-skip-tls-verify", field, &insecure)))
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
    if (cadata && *cadata) {
        snprintf(f2, sizeof f2, "%s.certificate-authority-data", field);
        if ((rc = b64_decode(k, cadata, f2, &c->ca_pem, &c->ca_pem_len))) return rc;
    } else if (ca && *ca) {
        snprintf(f2, sizeof f2, "%s.certificate-authority", field);
        if ((rc = resolve(k, ca, c->ca_file, sizeof c->ca_file, f2))) return rc;
    }

    if (user && *user) {
        if ((rc = find_named(k, root, "users", "user", user, &us, field, sizeof field))) return rc;
        static const char *unsupported[] = {"exec", "auth-provider", "username", "password",
                                            "as", "as-groups", NULL};
        for (int i = 0; unsupported[i]; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(us, unsupported[i]);
            if (v && !cJSON_IsNull(v))
                return rl_errf(e, RL_EINPUT,
                               "kubeconfig %s: %s.%s: not supported (use a token, tokenFile or a "
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
        if (tok && *tok) {
            c->token = strdup(tok);
            if (!c->token) return rl_errf(e, RL_ENOMEM, "out of memory");
        } else if (tokfile && *tokfile) {
            snprintf(f2, sizeof f2, "%s.tokenFile", field);
            if ((rc = resolve(k, tokfile, c->token_file, sizeof c->token_file, f2))) return rc;
        }
        bool has_cert = (cert && *cert) || (certdata && *certdata);
        bool has_key = (key && *key) || (keydata && *keydata);
        if (has_cert != has_key)
            return rl_errf(e, RL_EINPUT, "kubeconfig %s: %s: %s given without %s", k->path, field,
                           has_cert ? "client-certificate" : "client-key",
                           has_cert ? "client-key" : "client-certificate");
        if (certdata && *certdata) {
            snprintf(f2, sizeof f2, "%s.client-certificate-data", field);
            if ((rc = b64_decode(k, certdata, f2, &c->cert_pem, &c->cert_pem_len))) return rc;
        } else if (cert && *cert) {
            snprintf(f2, sizeof f2, "%s.client-certificate", field);
            if ((rc = resolve(k, cert, c->cert_file, sizeof c->cert_file, f2))) return rc;
        }
        if (keydata && *keydata) {
            snprintf(f2, sizeof f2, "%s.client-key-data", field);
            if ((rc = b64_decode(k, keydata, f2, &c->key_pem, &c->key_pem_len))) return rc;
        } else if (key && *key) {
            snprintf(f2, sizeof f2, "%s.client-key", field);
            if ((rc = resolve(k, key, c->key_file, sizeof c->key_file, f2))) return rc;
        }
    }
    return RL_OK;
}

int rl_k8s_config_parse(const char *text, size_t len, const char *path, const char *context,
                        rl_k8s_config *c, rl_err *e) {
    memset(c, 0, sizeof *c);
    kc k = {.path = path ? path : "(memory)", .e = e};
    if (path) {
        const char *slash = strrchr(path, '/');
        if (slash && (size_t)(slash - path) < sizeof k.dir) {
            memcpy(k.dir, path, (size_t)(slash - path));
            k.dir[slash - path] = '\0';
            if (slash == path) strcpy(k.dir, "/");
        }
    }
    char where[1100];
    snprintf(where, sizeof where, "kubeconfig %s", k.path);
    cJSON *root = NULL;
    int rc = rl_k8s_yaml_parse(text, len, where, &root, e);
    if (rc) return rc;
    rc = parse_root(&k, root, context, c);
    cJSON_Delete(root);
    if (rc) rl_k8s_config_free(c);
    return rc;
}

int rl_k8s_config_kubeconfig(const char *path, const char *context, rl_k8s_config *c,
                             rl_err *e) {
    char buf[1024];
    memset(c, 0, sizeof *c);
    if (!path || !*path) {
        const char *env = getenv("KUBECONFIG");
        if (env && *env) {
            size_t l = strcspn(env, ":");
            if (l >= sizeof buf) return rl_errf(e, RL_EINPUT, "KUBECONFIG: path too long");
            memcpy(buf, env, l);
            buf[l] = '\0';
        } else {
            const char *home = getenv("HOME");
            if (!home || !*home)
                return rl_errf(e, RL_EINPUT, "no kubeconfig: KUBECONFIG and HOME are unset");
            snprintf(buf, sizeof buf, "%s/.kube/config", home);
        }
        path = buf;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = rl_read_file(path, &text, &len, e);
    if (rc) return rl_err_wrap(e, "kubeconfig");
    rc = rl_k8s_config_parse(text, len, path, context, c, e);
    free(text);
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
