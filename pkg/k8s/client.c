/* Requests to the API server: auth, retries, Status errors.
 *
 * Thread safety: the mutex guards the token cache, the handle pool and the
 * jitter state; it is never held during network I/O or a plugin's run.
 * exec_mu lets one thread at a time run an exec plugin; the others that
 * need its token wait for it (lock order: exec_mu, then mu). */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s_internal.h"

#define POOL_MAX 8

struct rl_k8s {
    rl_k8s_config cfg;
    rl_k8s_opts opts;
    rl_http_tls tls;
    pthread_mutex_t mu, exec_mu;
    char *token;          /* current bearer token (may be NULL: anonymous) */
    double token_read_at; /* rl_now() of the last file read */
    double token_expiry;  /* exec: unix seconds it expires (0: when refused) */
    unsigned token_gen;   /* bumped by every new exec token */
    double tokens, tokens_at; /* the rate limit's bucket, and when it was filled (rl_now) */
    rl_http *pool[POOL_MAX];
    int npool;
    uint64_t rng;
};

static char *dup_mem(const char *p, size_t n) {
    if (!p) return NULL;
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

/* Read the token file; trailing whitespace dropped. */
static int read_token(const char *path, char **out, rl_err *e) {
    char *t = NULL;
    size_t n = 0;
    int rc = rl_read_file(path, &t, &n, e);
    if (rc) return rl_errf(e, RL_EINPUT, "bearer token file %s: cannot read it", path);
    while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
        t[--n] = '\0';
    if (n == 0) {
        free(t);
        return rl_errf(e, RL_EINPUT, "bearer token file %s: empty", path);
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] < 0x21 || (unsigned char)t[i] > 0x7e) {
            memset(t, 0, n);
            free(t);
            return rl_errf(e, RL_EINPUT, "bearer token file %s: not a single printable token", path);
        }
    *out = t;
    return RL_OK;
}

static void free_token(char *t) {
    if (!t) return;
    memset(t, 0, strlen(t));
    free(t);
}

int rl_k8s_new(const rl_k8s_config *cfg, const rl_k8s_opts *opts, rl_k8s **out, rl_err *e) {
    if (!cfg->server[0]) return rl_errf(e, RL_EINPUT, "%s: no API server address", cfg->source);
    rl_k8s *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "out of memory creating the Kubernetes client");
    c->cfg = *cfg;
    c->cfg.ca_pem = dup_mem(cfg->ca_pem, cfg->ca_pem_len);
    c->cfg.cert_pem = dup_mem(cfg->cert_pem, cfg->cert_pem_len);
    c->cfg.key_pem = dup_mem(cfg->key_pem, cfg->key_pem_len);
    c->cfg.token = cfg->token ? strdup(cfg->token) : NULL;
    c->cfg.exec = rl_k8s__exec_dup(cfg->exec);
    if ((cfg->ca_pem && !c->cfg.ca_pem) || (cfg->cert_pem && !c->cfg.cert_pem) ||
        (cfg->key_pem && !c->cfg.key_pem) || (cfg->token && !c->cfg.token) ||
        (cfg->exec && !c->cfg.exec)) {
        rl_k8s_config_free(&c->cfg);
        free(c);
        return rl_errf(e, RL_ENOMEM, "out of memory creating the Kubernetes client");
    }
    if (opts) c->opts = *opts;
    if (c->opts.timeout_s <= 0) c->opts.timeout_s = 30;
    if (c->opts.connect_timeout_s <= 0) c->opts.connect_timeout_s = 5;
    if (c->opts.token_refresh_s <= 0) c->opts.token_refresh_s = 60;
    if (c->opts.exec_timeout_s <= 0) c->opts.exec_timeout_s = 30;
    c->tls = (rl_http_tls){
        .ca_file = c->cfg.ca_file[0] ? c->cfg.ca_file : NULL,
        .ca_pem = c->cfg.ca_pem, .ca_pem_len = c->cfg.ca_pem_len,
        .cert_file = c->cfg.cert_file[0] ? c->cfg.cert_file : NULL,
        .key_file = c->cfg.key_file[0] ? c->cfg.key_file : NULL,
        .cert_pem = c->cfg.cert_pem, .cert_pem_len = c->cfg.cert_pem_len,
        .key_pem = c->cfg.key_pem, .key_pem_len = c->cfg.key_pem_len,
    };
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->exec_mu, NULL);
    c->rng = rl_http_jitter_seed();
    if (c->cfg.token_file[0]) {
        int rc = read_token(c->cfg.token_file, &c->token, e);
        if (rc) {
            rl_k8s_free(c);
            return rc;
        }
        c->token_read_at = rl_now();
    } else if (c->cfg.token) {
        c->token = strdup(c->cfg.token);
    }
    *out = c;
    return RL_OK;
}

void rl_k8s_free(rl_k8s *c) {
    if (!c) return;
    for (int i = 0; i < c->npool; i++) rl_http_free(c->pool[i]);
    free_token(c->token);
    rl_k8s_config_free(&c->cfg);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->exec_mu);
    free(c);
}

const char *rl_k8s_namespace(const rl_k8s *c) { return c->cfg.ns; }

/* The exec plugin runs (client-go's rule) when there is no token yet, when
 * it has expired, or when the server refused it -- force, with the
 * generation the refused request carried, so that requests refused
 * together run the plugin once. Its failure fails the request. */
static int exec_refresh(rl_k8s *c, bool force, unsigned refused_gen, rl_err *e) {
    pthread_mutex_lock(&c->exec_mu);
    pthread_mutex_lock(&c->mu);
    bool stale = !c->token || (c->token_expiry > 0 && rl_wall_now() >= c->token_expiry) ||
                 (force && c->token_gen == refused_gen);
    pthread_mutex_unlock(&c->mu);
    int rc = RL_OK;
    if (stale) {
        char *t = NULL;
        double exp = 0;
        rc = rl_k8s_exec_token(&c->cfg, c->opts.exec_timeout_s, &t, &exp, e);
        if (rc == RL_OK) {
            pthread_mutex_lock(&c->mu);
            free_token(c->token);
            c->token = t;
            c->token_expiry = exp;
            c->token_gen++;
            pthread_mutex_unlock(&c->mu);
            rl_log(RL_LOG_DEBUG, "k8s_exec_token", "\"expires_in_s\":%.0f",
                   exp > 0 ? exp - rl_wall_now() : -1.0);
        }
    }
    pthread_mutex_unlock(&c->exec_mu);
    return rc;
}

/* "Authorization: Bearer ..." for this request (*out malloc'd), or NULL
 * when anonymous; *gen gets the token's generation (in: the refused one
 * when forced). A token file is re-read when stale or when forced (after
 * a 401); if the re-read fails the previous token is kept. */
static int auth_header(rl_k8s *c, bool force, unsigned *gen, char **out, rl_err *e) {
    *out = NULL;
    if (c->cfg.exec) {
        int rc = exec_refresh(c, force, *gen, e);
        if (rc) return rc;
    }
    pthread_mutex_lock(&c->mu);
    if (c->cfg.token_file[0] &&
        (force || rl_now() - c->token_read_at >= c->opts.token_refresh_s)) {
        char *t = NULL;
        rl_err e2 = {0};
        if (read_token(c->cfg.token_file, &t, &e2) == RL_OK) {
            free_token(c->token);
            c->token = t;
        } else {
            rl_log_msg(RL_LOG_WARN, "k8s_token_reread_failed", e2.msg);
        }
        c->token_read_at = rl_now();
    }
    if (c->token) {
        size_t n = strlen(c->token) + 32;
        if ((*out = malloc(n))) snprintf(*out, n, "Authorization: Bearer %s", c->token);
    }
    *gen = c->token_gen;
    bool oom = c->token && !*out;
    pthread_mutex_unlock(&c->mu);
    return oom ? rl_errf(e, RL_ENOMEM, "out of memory") : RL_OK;
}

/* A 401 is worth one more try when the credential can change under us. */
static bool token_can_change(const rl_k8s *c) { return c->cfg.token_file[0] || c->cfg.exec; }

static rl_http *take_handle(rl_k8s *c, rl_err *e) {
    rl_http *h = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->npool > 0) h = c->pool[--c->npool];
    pthread_mutex_unlock(&c->mu);
    if (!h && rl_http_new(&h, e) != RL_OK) return NULL;
    return h;
}

static void give_handle(rl_k8s *c, rl_http *h) {
    pthread_mutex_lock(&c->mu);
    if (c->npool < POOL_MAX) {
        c->pool[c->npool++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    rl_http_free(h);
}

double rl_k8s__backoff(rl_k8s *c, int attempt, double retry_after_s) {
    pthread_mutex_lock(&c->mu);
    double d = rl_http_backoff_delay(&c->opts.backoff, attempt, retry_after_s, &c->rng);
    pthread_mutex_unlock(&c->mu);
    return d;
}

void rl_k8s__short_path(const char *path, char *out, size_t n) {
    const char *p = path;
    const char *ns = strstr(path, "/namespaces/");
    if (ns) {
        const char *after = strchr(ns + 12, '/');
        if (after && after[1]) p = after + 1;
    }
    size_t l = strcspn(p, "?");
    if (l >= n) l = n - 1;
    memcpy(out, p, l);
    out[l] = '\0';
}

static const char *reason_phrase(long code) {
    switch (code) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
    }
}

void rl_k8s_status_message(const char *method, const char *path, long code,
                           const cJSON *status, char *out, size_t n) {
    char sp[200];
    rl_k8s__short_path(path, sp, sizeof sp);
    const char *msg = NULL, *reason = NULL;
    if (cJSON_IsObject(status)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(status, "message");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(status, "reason");
        if (cJSON_IsString(m) && m->valuestring[0]) msg = m->valuestring;
        if (cJSON_IsString(r) && r->valuestring[0]) reason = r->valuestring;
    }
    const char *rp = reason_phrase(code);
    int w = snprintf(out, n, "%s %s: %ld%s%s", method, sp, code, *rp ? " " : "", rp);
    if (w < 0 || (size_t)w >= n) return;
    if (msg) w += snprintf(out + w, n - (size_t)w, ": %.300s", msg);
    if (w < 0 || (size_t)w >= n) return;
    if (reason) snprintf(out + w, n - (size_t)w, " (reason %.60s)", reason);
    /* one line, whatever the server put in the message */
    for (char *q = out; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
}

/* One HTTP exchange. The credential comes first: when it cannot be had
 * (an exec plugin failed) the request is not sent, nor retried (client-go
 * does neither); *auth_failed tells the caller. */
static int attempt(rl_k8s *c, const char *method, const char *path, const char *ctype,
                   const char *body, double timeout_s, double idle_s, rl_http_data_fn fn,
                   void *ud, const volatile int *abort_flag, bool force_token, unsigned *gen,
                   bool *auth_failed, rl_http_resp *resp, rl_err *e) {
    memset(resp, 0, sizeof *resp);
    char *auth = NULL;
    int rc = auth_header(c, force_token, gen, &auth, e);
    if ((*auth_failed = rc != RL_OK)) return rc;
    size_t ul = strlen(c->cfg.server) + strlen(path) + 1;
    char *url = malloc(ul);
    if (!url) {
        free_token(auth);
        return rl_errf(e, RL_ENOMEM, "out of memory");
    }
    snprintf(url, ul, "%s%s", c->cfg.server, path);
    char ct[128];
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
    const char *hdrs[5];
    int nh = 0;
    hdrs[nh++] = "Accept: application/json";
    hdrs[nh++] = "User-Agent: ringleader";
    if (body) hdrs[nh++] = ct;
    if (auth) hdrs[nh++] = auth;
    hdrs[nh] = NULL;
    rl_http_req rq = {
        .method = method, .url = url, .headers = hdrs, .body = body,
        .body_len = body ? strlen(body) : 0, .tls = &c->tls,
        .connect_timeout_s = c->opts.connect_timeout_s, .timeout_s = timeout_s,
        .idle_timeout_s = idle_s, .abort_flag = abort_flag, .on_data = fn, .data_ud = ud,
    };
    rl_http *h = take_handle(c, e);
    if (!h) {
        rc = e ? e->code : RL_ENOMEM;
    } else {
        rc = rl_http_do(h, &rq, resp, e);
        give_handle(c, h);
    }
    free_token(auth);
    free(url);
    return rc;
}

/* Turn a non-2xx answer into the error; *out gets the Status if wanted. */
static int status_error(const char *method, const char *path, rl_http_resp *resp, cJSON **out,
                        rl_err *e) {
    cJSON *st = resp->body ? cJSON_ParseWithLength(resp->body, resp->body_len) : NULL;
    char msg[480];
    rl_k8s_status_message(method, path, resp->status, st, msg, sizeof msg);
    if (out) *out = st;
    else cJSON_Delete(st);
    int code = resp->status >= 400 && resp->status < 500 && resp->status != 429 ? RL_EINPUT
                                                                                : RL_EPEER;
    return rl_errf(e, code, "%s", msg);
}

static void log_retry(const char *method, const char *path, long status, const char *why,
                      double delay) {
    char sp[200], esc[400], ew[600];
    rl_k8s__short_path(path, sp, sizeof sp);
    rl_json_escape(esc, sizeof esc, sp);
    rl_json_escape(ew, sizeof ew, why);
    rl_log(RL_LOG_WARN, "k8s_retry", "\"method\":\"%s\",\"path\":\"%s\",\"status\":%ld,"
           "\"error\":\"%s\",\"delay_s\":%.3f", method, esc, status, ew, delay);
}

int rl_k8s_request(rl_k8s *c, const char *method, const char *path, const char *content_type,
                   const char *body, long *http_status, cJSON **out, rl_err *e) {
    return rl_k8s__request(c, method, path, content_type, body, c->opts.abort_flag, http_status,
                           out, e);
}

/* Wait for the rate limit's next token (opts.qps): tokens refill at qps up
 * to burst, and a request takes one, reserving it ahead when none is left.
 * A wait that would end past the call's deadline fails at once. */
static int rate_wait(rl_k8s *c, const char *method, const char *path, double deadline,
                     const volatile int *abort_flag, rl_err *e) {
    double qps = c->opts.qps;
    if (qps <= 0) return RL_OK;
    double burst = c->opts.burst > 0 ? c->opts.burst : (qps > 1 ? qps : 1);
    pthread_mutex_lock(&c->mu);
    double now = rl_now();
    if (c->tokens_at == 0) c->tokens = burst; /* a new client starts full */
    else c->tokens += (now - c->tokens_at) * qps;
    if (c->tokens > burst) c->tokens = burst;
    c->tokens_at = now;
    double wait = c->tokens >= 1 ? 0 : (1 - c->tokens) / qps;
    bool late = now + wait > deadline;
    if (!late) c->tokens -= 1;
    pthread_mutex_unlock(&c->mu);
    char sp[200];
    if (late) {
        rl_k8s__short_path(path, sp, sizeof sp);
        return rl_errf(e, RL_ETIMEOUT, "%s %s: the client-side rate limit (%.3g requests/s) would hold it past "
                       "its deadline", method, sp, qps);
    }
    if (wait > 0 && rl_http_sleep(wait, abort_flag) != RL_OK) {
        rl_k8s__short_path(path, sp, sizeof sp);
        return rl_errf(e, RL_EABORT, "%s %s: cancelled", method, sp);
    }
    return RL_OK;
}

/* attempts <= 0: the client's retry policy */
static int request_n(rl_k8s *c, const char *method, const char *path, const char *content_type, const char *body,
                     const volatile int *abort_flag, int attempts, long *http_status, cJSON **out, rl_err *e);

int rl_k8s__request(rl_k8s *c, const char *method, const char *path, const char *content_type,
                    const char *body, const volatile int *abort_flag, long *http_status,
                    cJSON **out, rl_err *e) {
    return request_n(c, method, path, content_type, body, abort_flag, 0, http_status, out, e);
}

static int request_n(rl_k8s *c, const char *method, const char *path, const char *content_type, const char *body,
                     const volatile int *abort_flag, int attempts, long *http_status, cJSON **out, rl_err *e) {
    long dummy;
    if (!http_status) http_status = &dummy;
    *http_status = 0;
    if (out) *out = NULL;
    if (!path || path[0] != '/') return rl_errf(e, RL_EINTERNAL, "API path must start with '/'");
    double deadline = rl_now() + c->opts.timeout_s;
    if (attempts <= 0) attempts = c->opts.backoff.attempts > 0 ? c->opts.backoff.attempts : 8;
    bool token_retried = false, force_token = false, auth_failed;
    unsigned gen = 0;
    rl_http_resp resp;
    int rc;
    for (int k = 0;; k++) {
        if ((rc = rate_wait(c, method, path, deadline, abort_flag, e))) return rc;
        double left = deadline - rl_now();
        if (left < 0.05) left = 0.05;
        rc = attempt(c, method, path, content_type, body, left, 0, NULL, NULL, abort_flag,
                     force_token, &gen, &auth_failed, &resp, e);
        force_token = false;
        if (auth_failed) return rc; /* *http_status: the 401 that led here, if any */
        *http_status = resp.status;
        if (rc == RL_OK && resp.status >= 200 && resp.status <= 299) {
            if (out && resp.body_len) {
                *out = cJSON_ParseWithLength(resp.body, resp.body_len);
                if (!*out) {
                    char sp[200];
                    rl_k8s__short_path(path, sp, sizeof sp);
                    rl_http_resp_free(&resp);
                    return rl_errf(e, RL_EPEER, "%s %s: %ld answer is not JSON", method, sp,
                                   *http_status);
                }
            }
            rl_http_resp_free(&resp);
            return RL_OK;
        }
        if (rc == RL_OK && resp.status == 401 && !token_retried && token_can_change(c)) {
            /* client-go: the token may have rotated under us (file) or
             * been revoked (exec): re-read or re-run, retry once */
            token_retried = force_token = true;
            rl_http_resp_free(&resp);
            continue;
        }
        bool again = rl_http_retryable(rc, resp.status) && k + 1 < attempts;
        if (!again) break;
        double ra = -1;
        const char *rah = rl_http_resp_header(&resp, "Retry-After");
        if (rah && rl_http_parse_retry_after(rah, rl_wall_now(), &ra) != RL_OK) ra = -1;
        double d = rl_k8s__backoff(c, k, ra);
        if (rl_now() + d >= deadline) break;
        char why[480];
        if (rc == RL_OK) rl_k8s_status_message(method, path, resp.status, NULL, why, sizeof why);
        else snprintf(why, sizeof why, "%.470s", e ? e->msg : "transport error");
        log_retry(method, path, resp.status, why, d);
        rl_http_resp_free(&resp);
        if (rl_http_sleep(d, abort_flag) != RL_OK) {
            char sp[200];
            rl_k8s__short_path(path, sp, sizeof sp);
            return rl_errf(e, RL_EABORT, "%s %s: cancelled", method, sp);
        }
    }
    if (rc == RL_OK) rc = status_error(method, path, &resp, out, e);
    rl_http_resp_free(&resp);
    return rc;
}

int rl_k8s__stream(rl_k8s *c, const char *path, rl_http_data_fn fn, void *ud, double idle_s,
                   double timeout_s, const volatile int *stop, long *http_status, bool *stopped,
                   rl_err *e) {
    rl_http_resp resp;
    *stopped = false;
    int rc = RL_OK;
    unsigned gen = 0;
    bool auth_failed;
    for (int k = 0; k < 2; k++) {
        /* a stream with no overall timeout (0) waits for its token as long as it takes */
        if ((rc = rate_wait(c, "WATCH", path, rl_now() + (timeout_s > 0 ? timeout_s : 1e9), stop, e))) {
            *http_status = 0;
            return rc;
        }
        rc = attempt(c, "GET", path, NULL, NULL, timeout_s, idle_s, fn, ud, stop, k > 0, &gen,
                     &auth_failed, &resp, e);
        if (auth_failed) return rc;
        *http_status = resp.status;
        if (rc == RL_OK && resp.status == 401 && k == 0 && token_can_change(c)) {
            rl_http_resp_free(&resp);
            continue;
        }
        break;
    }
    *stopped = resp.stopped;
    if (rc == RL_OK && (resp.status < 200 || resp.status > 299))
        rc = status_error("WATCH", path, &resp, NULL, e);
    rl_http_resp_free(&resp);
    return rc;
}

int rl_k8s_get(rl_k8s *c, const char *path, long *http_status, cJSON **out, rl_err *e) {
    return rl_k8s_request(c, "GET", path, NULL, NULL, http_status, out, e);
}

static int with_body(rl_k8s *c, const char *method, const char *ctype, const char *path, const cJSON *obj,
                     int attempts, long *http_status, cJSON **out, rl_err *e) {
    char *body = cJSON_PrintUnformatted(obj);
    if (!body) return rl_errf(e, RL_ENOMEM, "out of memory encoding a request body");
    int rc = request_n(c, method, path, ctype, body, c->opts.abort_flag, attempts, http_status, out, e);
    free(body);
    return rc;
}

int rl_k8s_create(rl_k8s *c, const char *path, const cJSON *obj, long *http_status,
                  cJSON **out, rl_err *e) {
    return with_body(c, "POST", "application/json", path, obj, 0, http_status, out, e);
}
int rl_k8s_create_once(rl_k8s *c, const char *path, const cJSON *obj, long *http_status, cJSON **out, rl_err *e) {
    return with_body(c, "POST", "application/json", path, obj, 1, http_status, out, e);
}

int rl_k8s_replace(rl_k8s *c, const char *path, const cJSON *obj, long *http_status,
                   cJSON **out, rl_err *e) {
    return with_body(c, "PUT", "application/json", path, obj, 0, http_status, out, e);
}
int rl_k8s_merge_patch(rl_k8s *c, const char *path, const cJSON *patch, long *http_status,
                       cJSON **out, rl_err *e) {
    return with_body(c, "PATCH", "application/merge-patch+json", path, patch, 0, http_status, out,
                     e);
}
int rl_k8s_delete(rl_k8s *c, const char *path, long *http_status, rl_err *e) {
    return rl_k8s_request(c, "DELETE", path, NULL, NULL, http_status, NULL, e);
}

static bool dns_label_ok(const char *s) {
    if (!s || !*s || strlen(s) > 253) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
            return false;
    return s[0] != '-' && s[0] != '.' && strcmp(s, "..") != 0;
}

int rl_k8s_path(char *out, size_t n, const char *group_version, const char *ns,
                const char *resource, const char *name, rl_err *e) {
    if (!group_version || !*group_version || strstr(group_version, "..") ||
        strspn(group_version, "abcdefghijklmnopqrstuvwxyz0123456789-./") != strlen(group_version))
        return rl_errf(e, RL_EINPUT, "API group/version \"%.60s\" is not valid",
                       group_version ? group_version : "");
    if (!dns_label_ok(resource))
        return rl_errf(e, RL_EINPUT, "resource \"%.60s\" is not valid", resource ? resource : "");
    if (ns && !dns_label_ok(ns))
        return rl_errf(e, RL_EINPUT, "namespace \"%.80s\" is not a valid name", ns);
    if (name && !dns_label_ok(name))
        return rl_errf(e, RL_EINPUT, "%s name \"%.80s\" is not a valid name", resource, name);
    bool core = strchr(group_version, '/') == NULL;
    int w = snprintf(out, n, "/%s/%s%s%s%s/%s%s%s", core ? "api" : "apis", group_version,
                     ns ? "/namespaces/" : "", ns ? ns : "", "", resource, name ? "/" : "",
                     name ? name : "");
    if (w < 0 || (size_t)w >= n) return rl_errf(e, RL_EINPUT, "API path too long");
    return RL_OK;
}
