/* Exec credential plugins (gke-gcloud-auth-plugin, aws eks get-token,
 * kubelogin), run as client-go runs them: no shell, our environment plus
 * the kubeconfig's env, stdin /dev/null (never a terminal), and
 * KUBERNETES_EXEC_INFO holding the ExecCredential request. The plugin gets
 * its own process group so a timeout kills whatever it started too; its
 * stdout is bounded, its stderr kept only for the message of a failure.
 * The token it prints is secret: no message quotes its stdout, not even
 * a field that should hold no secret (a confused plugin may put it
 * anywhere). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "k8s_internal.h"

extern char **environ;

#define MAX_STDOUT (1 << 20) /* an ExecCredential is a few KiB */
#define ERR_TAIL 2048        /* the end of stderr, for the message */

/* ---- the config ---------------------------------------------------------------------- */
static void strv_free(char **v) {
    for (char **p = v; p && *p; p++) free(*p);
    free(v);
}

static char **strv_dup(char *const *v) {
    size_t n = 0;
    while (v && v[n]) n++;
    char **d = calloc(n + 1, sizeof *d);
    for (size_t i = 0; d && i < n; i++)
        if (!(d[i] = strdup(v[i]))) {
            strv_free(d);
            return NULL;
        }
    return d;
}

void rl_k8s__exec_free(rl_k8s_exec *x) {
    if (!x) return;
    strv_free(x->argv);
    strv_free(x->env);
    free(x->install_hint);
    free(x->cluster_config);
    free(x);
}

rl_k8s_exec *rl_k8s__exec_dup(const rl_k8s_exec *x) {
    if (!x) return NULL;
    rl_k8s_exec *d = malloc(sizeof *d);
    if (!d) return NULL;
    *d = *x;
    d->argv = strv_dup(x->argv);
    d->env = strv_dup(x->env);
    d->install_hint = x->install_hint ? strdup(x->install_hint) : NULL;
    d->cluster_config = x->cluster_config ? strdup(x->cluster_config) : NULL;
    if (!d->argv || !d->env || (x->install_hint && !d->install_hint) ||
        (x->cluster_config && !d->cluster_config)) {
        rl_k8s__exec_free(d);
        return NULL;
    }
    return d;
}

/* ---- the request: KUBERNETES_EXEC_INFO ------------------------------------------------ */
/* spec.cluster (provideClusterInfo): the server, the CA as base64 (read
 * from its file now when the kubeconfig names a file), the extension. */
static int cluster_info(const rl_k8s_config *c, cJSON *spec, rl_err *e) {
    const rl_k8s_exec *x = c->exec;
    cJSON *cl = cJSON_AddObjectToObject(spec, "cluster");
    if (!cl || !cJSON_AddStringToObject(cl, "server", c->server))
        return rl_errf(e, RL_ENOMEM, "out of memory");
    char *pem = c->ca_pem, *b64 = NULL;
    size_t pem_len = c->ca_pem_len;
    if (!pem && c->ca_file[0] && rl_read_file(c->ca_file, &pem, &pem_len, e))
        return rl_err_wrap(e, "%s: provideClusterInfo: certificate-authority", x->where);
    if (pem) b64 = rl_base64_encode(pem, pem_len);
    if (pem != c->ca_pem) free(pem);
    if (pem_len && !b64) return rl_errf(e, RL_ENOMEM, "out of memory");
    bool ok = !b64 || cJSON_AddStringToObject(cl, "certificate-authority-data", b64);
    free(b64);
    if (ok && x->cluster_config) {
        cJSON *cfg = cJSON_Parse(x->cluster_config);
        ok = cfg && cJSON_AddItemToObject(cl, "config", cfg);
        if (!ok) cJSON_Delete(cfg);
    }
    return ok ? RL_OK : rl_errf(e, RL_ENOMEM, "out of memory");
}

static int exec_info(const rl_k8s_config *c, char **out, rl_err *e) {
    cJSON *r = cJSON_CreateObject(), *spec = NULL;
    int rc = RL_OK;
    if (!r || !cJSON_AddStringToObject(r, "apiVersion", c->exec->api_version) ||
        !cJSON_AddStringToObject(r, "kind", "ExecCredential") ||
        !(spec = cJSON_AddObjectToObject(r, "spec")) || !cJSON_AddFalseToObject(spec, "interactive"))
        rc = rl_errf(e, RL_ENOMEM, "out of memory");
    if (rc == RL_OK && c->exec->provide_cluster_info) rc = cluster_info(c, spec, e);
    if (rc == RL_OK && !(*out = cJSON_PrintUnformatted(r)))
        rc = rl_errf(e, RL_ENOMEM, "out of memory");
    cJSON_Delete(r);
    return rc;
}

/* Ours, less what the kubeconfig sets, plus the kubeconfig's env and the
 * request. Pointers into environ and x->env; only the array is malloc'd. */
static char **plugin_env(const rl_k8s_exec *x, char *info_kv) {
    size_t n = 0, m = 0;
    while (environ && environ[n]) n++;
    while (x->env && x->env[m]) m++;
    char **v = calloc(n + m + 2, sizeof *v);
    if (!v) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strcspn(environ[i], "=");
        bool replaced = !strncmp(environ[i], "KUBERNETES_EXEC_INFO=", 21);
        for (size_t j = 0; j < m && !replaced; j++)
            replaced = !strncmp(environ[i], x->env[j], nl + 1);
        if (!replaced) v[o++] = environ[i];
    }
    for (size_t j = 0; j < m; j++) v[o++] = x->env[j];
    v[o++] = info_kv;
    return v;
}

/* ---- running it ------------------------------------------------------------------------- */
typedef struct run {
    pid_t pid;
    int out_fd, err_fd;
    char *out;
    size_t out_len;
    char err[ERR_TAIL + 1];
    size_t err_len;
    bool too_big;
} run;

static int spawn(const rl_k8s_exec *x, char **envp, run *r, rl_err *e) {
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        int err = errno;
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0) close(po[i]);
            if (pe[i] >= 0) close(pe[i]);
        }
        return rl_errf(e, RL_EIO, "%s: pipe: %s", x->where, strerror(err));
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    /* its own group: a timeout kills what it started as well */
    posix_spawnattr_setpgroup(&at, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    int err = posix_spawnp(&r->pid, x->argv[0], &fa, &at, x->argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(po[1]);
    close(pe[1]);
    r->out_fd = po[0];
    r->err_fd = pe[0];
    if (err == 0) return RL_OK;
    close(po[0]);
    close(pe[0]);
    char cmd[160];
    rl_k8s__printable(x->argv[0], cmd, sizeof cmd);
    if (err == ENOENT || err == EACCES || err == ENOEXEC) {
        char hint[200] = "";
        if (x->install_hint) rl_k8s__printable(x->install_hint, hint, sizeof hint);
        return rl_errf(e, RL_EINPUT, "%s: cannot run %s: %s%s%s", x->where, cmd, strerror(err),
                       hint[0] ? "; " : "", hint);
    }
    return rl_errf(e, RL_EIO, "%s: cannot run %s: %s", x->where, cmd, strerror(err));
}

/* Keep the last ERR_TAIL bytes of stderr. */
static void keep_tail(run *r, const char *b, size_t n) {
    if (n > ERR_TAIL) b += n - ERR_TAIL, n = ERR_TAIL;
    if (r->err_len + n > ERR_TAIL) {
        size_t drop = r->err_len + n - ERR_TAIL;
        memmove(r->err, r->err + drop, r->err_len - drop);
        r->err_len -= drop;
    }
    memcpy(r->err + r->err_len, b, n);
    r->err_len += n;
    r->err[r->err_len] = '\0';
}

/* One read from fd; false at its end (or when stdout outgrows the bound). */
static bool drain(run *r, int fd) {
    char b[8192];
    ssize_t n = read(fd, b, sizeof b);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return false;
    if (fd == r->err_fd) {
        keep_tail(r, b, (size_t)n);
        return true;
    }
    if (r->out_len + (size_t)n > MAX_STDOUT) return r->too_big = true, false;
    char *o = realloc(r->out, r->out_len + (size_t)n + 1);
    if (!o) return r->too_big = true, false;
    memcpy(o + r->out_len, b, (size_t)n);
    r->out = o;
    r->out_len += (size_t)n;
    o[r->out_len] = '\0';
    return true;
}

/* Read both pipes until both end or the deadline passes. */
static bool collect(run *r, double deadline) {
    bool open_out = true, open_err = true;
    while (open_out || open_err) {
        double left = deadline - rl_now();
        if (left <= 0) return false;
        struct pollfd p[2] = {{.fd = open_out ? r->out_fd : -1, .events = POLLIN},
                              {.fd = open_err ? r->err_fd : -1, .events = POLLIN}};
        int n = poll(p, 2, (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR) return false;
        if (n <= 0) continue;
        if (open_out && p[0].revents && !drain(r, r->out_fd)) open_out = false;
        if (r->too_big) return false;
        if (open_err && p[1].revents && !drain(r, r->err_fd)) open_err = false;
    }
    return true;
}

/* Wait for its exit until the deadline; 0 with *status, or -1. */
static int reap(pid_t pid, double deadline, int *status) {
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid) return 0;
        if (w < 0 && errno != EINTR) return -1;
        if (rl_now() >= deadline) return -1;
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
}

/* The last non-empty line of stderr, printable, for the message. */
static void last_line(const run *r, char *out, size_t n) {
    size_t end = r->err_len;
    while (end && (r->err[end - 1] == '\n' || r->err[end - 1] == '\r' || r->err[end - 1] == ' '))
        end--;
    size_t start = end;
    while (start && r->err[start - 1] != '\n') start--;
    char line[ERR_TAIL + 1];
    memcpy(line, r->err + start, end - start);
    line[end - start] = '\0';
    rl_k8s__printable(line, out, n);
}

/* What ended the run, as an error, or RL_OK for a clean exit 0. */
static int outcome(const rl_k8s_exec *x, run *r, bool finished, int status, double timeout_s,
                   rl_err *e) {
    char cmd[160], tail[200];
    rl_k8s__printable(x->argv[0], cmd, sizeof cmd);
    last_line(r, tail, sizeof tail);
    const char *sep = tail[0] ? ": " : "";
    if (r->too_big)
        return rl_errf(e, RL_EINPUT, "%s: %s printed more than %d bytes (killed)", x->where, cmd,
                       MAX_STDOUT);
    if (!finished)
        return rl_errf(e, RL_ETIMEOUT, "%s: %s did not finish within %.0f s (killed)%s%s",
                       x->where, cmd, timeout_s, sep, tail);
    if (WIFSIGNALED(status))
        return rl_errf(e, RL_EINPUT, "%s: %s was killed by signal %d%s%s", x->where, cmd,
                       WTERMSIG(status), sep, tail);
    if (WEXITSTATUS(status) != 0)
        return rl_errf(e, RL_EINPUT, "%s: %s exited with status %d%s%s", x->where, cmd,
                       WEXITSTATUS(status), sep, tail);
    return RL_OK;
}

int rl_k8s_exec_token(const rl_k8s_config *c, double timeout_s, char **token, double *expiry,
                      rl_err *e) {
    *token = NULL;
    *expiry = 0;
    const rl_k8s_exec *x = c->exec;
    if (!x || !x->argv || !x->argv[0])
        return rl_errf(e, RL_EINTERNAL, "%s: no exec plugin configured", c->source);
    if (timeout_s <= 0) timeout_s = 30;
    char *info = NULL, *info_kv = NULL, **envp = NULL;
    int rc = exec_info(c, &info, e);
    if (rc == RL_OK) {
        size_t l = strlen(info) + 32;
        if ((info_kv = malloc(l))) snprintf(info_kv, l, "KUBERNETES_EXEC_INFO=%s", info);
        if (!info_kv || !(envp = plugin_env(x, info_kv))) rc = rl_errf(e, RL_ENOMEM, "out of memory");
    }
    run r = {.pid = -1, .out_fd = -1, .err_fd = -1};
    if (rc == RL_OK) rc = spawn(x, envp, &r, e);
    if (rc == RL_OK) {
        double deadline = rl_now() + timeout_s;
        int status = 0;
        bool finished = collect(&r, deadline) && reap(r.pid, deadline, &status) == 0;
        if (!finished) {
            kill(-r.pid, SIGKILL);
            reap(r.pid, rl_now() + 2, &status);
        }
        close(r.out_fd);
        close(r.err_fd);
        rc = outcome(x, &r, finished, status, timeout_s, e);
        if (rc == RL_OK)
            rc = rl_k8s_exec_credential_parse(r.out ? r.out : "", r.out_len, x->api_version,
                                              x->where, token, expiry, e);
    }
    if (r.out) memset(r.out, 0, r.out_len);
    free(r.out);
    free(envp);
    free(info_kv);
    free(info);
    return rc;
}

/* ---- its answer ------------------------------------------------------------------------- */
static int answer_str(const cJSON *o, const char *key, const char *where, const char *field,
                      const char **out, rl_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsString(v))
        return rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: %s: must be a string",
                       where, field);
    *out = v->valuestring;
    return RL_OK;
}

static bool token_ok(const char *t) {
    if (!*t) return false;
    for (; *t; t++)
        if ((unsigned char)*t < 0x21 || (unsigned char)*t > 0x7e) return false;
    return true;
}

static int read_status(const cJSON *st, const char *where, char **token, double *expiry,
                       rl_err *e) {
    const char *tok, *exp, *cert, *key;
    int rc;
    if ((rc = answer_str(st, "token", where, "status.token", &tok, e)) ||
        (rc = answer_str(st, "expirationTimestamp", where, "status.expirationTimestamp", &exp, e)) ||
        (rc = answer_str(st, "clientCertificateData", where, "status.clientCertificateData", &cert, e)) ||
        (rc = answer_str(st, "clientKeyData", where, "status.clientKeyData", &key, e)))
        return rc;
    if ((cert && *cert) || (key && *key))
        return rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: status.clientCertificateData: "
                       "client certificates from plugins are not supported (a token is)", where);
    if (!tok || !*tok)
        return rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: status.token: missing", where);
    if (!token_ok(tok))
        return rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: status.token: not a single "
                       "printable token", where);
    if (exp && *exp && rl_k8s_time_parse(exp, expiry) != RL_OK)
        return rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: status.expirationTimestamp: "
                       "not an RFC 3339 time", where);
    if (!(*token = strdup(tok))) return rl_errf(e, RL_ENOMEM, "out of memory");
    return RL_OK;
}

int rl_k8s_exec_credential_parse(const char *text, size_t len, const char *api_version,
                                 const char *where, char **token, double *expiry, rl_err *e) {
    *token = NULL;
    *expiry = 0;
    cJSON *j = cJSON_ParseWithLength(text, len);
    const char *api = NULL, *kind = NULL;
    int rc = RL_OK;
    if (!cJSON_IsObject(j))
        rc = rl_errf(e, RL_EINPUT, "%s: the plugin's output is not an ExecCredential (JSON object)",
                     where);
    if (rc == RL_OK && !(rc = answer_str(j, "apiVersion", where, "apiVersion", &api, e)) &&
        !(rc = answer_str(j, "kind", where, "kind", &kind, e))) {
        if (!kind || strcmp(kind, "ExecCredential"))
            rc = rl_errf(e, RL_EINPUT, "%s: the plugin's output: kind: must be ExecCredential", where);
        else if (!api || strcmp(api, api_version))
            rc = rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: apiVersion: not %s, which "
                         "the kubeconfig asks for", where, api_version);
    }
    const cJSON *st = rc == RL_OK ? cJSON_GetObjectItemCaseSensitive(j, "status") : NULL;
    if (rc == RL_OK && !cJSON_IsObject(st))
        rc = rl_errf(e, RL_EINPUT, "%s: the plugin's ExecCredential: status: missing", where);
    if (rc == RL_OK) rc = read_status(st, where, token, expiry, e);
    /* the token's copy in the tree is secret too */
    cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "status"), "token");
    if (cJSON_IsString(t)) memset(t->valuestring, 0, strlen(t->valuestring));
    cJSON_Delete(j);
    return rc;
}
