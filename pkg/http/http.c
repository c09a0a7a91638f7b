/* The libcurl easy-handle wrapper. Each request starts from curl_easy_reset
 * so no option leaks from one request into the next, while the handle's
 * connection and TLS session caches survive (reset keeps them). */
#include "http.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct rl_http {
    CURL *curl;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;
static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int rl_http_new(rl_http **out, rl_err *e) {
    pthread_once(&g_once, global_init);
    if (g_init_rc != CURLE_OK)
        return rl_errf(e, RL_EINTERNAL, "libcurl initialisation failed: %s",
                       curl_easy_strerror(g_init_rc));
    rl_http *h = calloc(1, sizeof *h);
    if (!h) return rl_errf(e, RL_ENOMEM, "out of memory creating an HTTP handle");
    h->curl = curl_easy_init();
    if (!h->curl) {
        free(h);
        return rl_errf(e, RL_ENOMEM, "curl_easy_init failed");
    }
    *out = h;
    return RL_OK;
}

void rl_http_free(rl_http *h) {
    if (!h) return;
    curl_easy_cleanup(h->curl);
    free(h);
}

void rl_http_resp_free(rl_http_resp *r) {
    if (!r) return;
    free(r->body);
    free(r->hdrs);
    memset(r, 0, sizeof *r);
}

const char *rl_http_resp_header(const rl_http_resp *r, const char *name) {
    const char *found = NULL;
    size_t off = 0;
    while (r->hdrs && off < r->hdrs_len) {
        const char *k = r->hdrs + off;
        const char *v = k + strlen(k) + 1;
        if (strcasecmp(k, name) == 0) found = v;
        off = (size_t)(v - r->hdrs) + strlen(v) + 1;
    }
    return found;
}

void rl_http_url_redact(const char *url, char *out, size_t n) {
    if (n == 0) return;
    const char *p = url ? url : "";
    size_t o = 0;
    /* a value without a scheme ("user:pw@host") is an authority too */
    const char *scheme = strstr(p, "://");
    const char *auth = scheme ? scheme + 3 : p;
    for (const char *q = p; q < auth && o + 1 < n; q++) out[o++] = *q;
    /* user info ends at the last '@' before the path */
    const char *end = auth + strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *q = auth; q < end; q++)
        if (*q == '@') at = q;
    if (at) auth = at + 1;
    for (const char *q = auth; *q && *q != '?' && *q != '#' && o + 1 < n; q++) out[o++] = *q;
    out[o] = '\0';
}

bool rl_http_url_cleartext_remote(const char *url) {
    if (strncasecmp(url, "http://", 7) != 0) return false;
    char shown[512];
    rl_http_url_redact(url, shown, sizeof shown); /* drops the user info */
    const char *h = shown + 7;
    size_t n = h[0] == '[' ? strcspn(h, "]") + 1 : strcspn(h, ":/");
    if ((n == 9 && !strncasecmp(h, "localhost", 9)) || (n == 5 && !strncmp(h, "[::1]", 5))) return false;
    /* 127.a.b.c, digits and dots only */
    bool v4 = n >= 7 && !strncmp(h, "127.", 4);
    for (size_t i = 4; v4 && i < n; i++) v4 = (h[i] >= '0' && h[i] <= '9') || h[i] == '.';
    return !v4;
}

int rl_http_cleartext_check(const char *url, bool allowed, const char *what, const char *optin, rl_err *e) {
    if (allowed || !rl_http_url_cleartext_remote(url)) return RL_OK;
    char shown[512];
    rl_http_url_redact(url, shown, sizeof shown);
    return rl_errf(e, RL_EINPUT, "%s: http:// would send %s in clear (use https://, or set %s: true)", shown, what,
                   optin);
}

/* ---- callbacks ----------------------------------------------------------------- */
typedef struct xfer {
    CURL *curl;
    const rl_http_req *req;
    rl_http_resp *resp;
    size_t body_cap, max_body;
    size_t hdr_cap;
    bool too_big, stopped, read_failed, oom, idle;
    curl_off_t last_dn, last_un;
    double last_move;
} xfer;

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud) {
    xfer *x = ud;
    size_t len = size * nitems;
    rl_http_resp *r = x->resp;
    /* A status line starts a new response (after 100 Continue or a proxy's
     * CONNECT answer); only the last response's headers are kept. */
    if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
        r->hdrs_len = 0;
        return len;
    }
    const char *colon = memchr(buf, ':', len);
    if (!colon) return len; /* blank line or folded junk */
    size_t kl = (size_t)(colon - buf);
    const char *v = colon + 1, *end = buf + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t vl = (size_t)(end - v);
    if (memchr(buf, '\0', kl) || memchr(v, '\0', vl)) return len;
    size_t need = r->hdrs_len + kl + vl + 2;
    if (need > (1u << 20)) return len; /* absurd header block: keep what we have */
    if (need > x->hdr_cap) {
        size_t cap = x->hdr_cap ? x->hdr_cap : 1024;
        while (cap < need) cap *= 2;
        char *nb = realloc(r->hdrs, cap);
        if (!nb) {
            x->oom = true;
            return 0;
        }
        r->hdrs = nb;
        x->hdr_cap = cap;
    }
    memcpy(r->hdrs + r->hdrs_len, buf, kl);
    r->hdrs[r->hdrs_len + kl] = '\0';
    memcpy(r->hdrs + r->hdrs_len + kl + 1, v, vl);
    r->hdrs[r->hdrs_len + kl + 1 + vl] = '\0';
    r->hdrs_len = need;
    return len;
}

static size_t on_write(char *buf, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t len = size * nmemb;
    long st = 0;
    if (x->req->on_data) curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &st);
    if (x->req->on_data && st >= 200 && st <= 299) {
        if (x->req->on_data(x->req->data_ud, buf, len) != 0) {
            x->stopped = true;
            return 0; /* curl ends the transfer with CURLE_WRITE_ERROR */
        }
        return len;
    }
    rl_http_resp *r = x->resp;
    if (r->body_len + len > x->max_body) {
        x->too_big = true;
        return 0;
    }
    if (r->body_len + len + 1 > x->body_cap) {
        size_t cap = x->body_cap ? x->body_cap : 4096;
        while (cap < r->body_len + len + 1) cap *= 2;
        char *nb = realloc(r->body, cap);
        if (!nb) {
            x->oom = true;
            return 0;
        }
        r->body = nb;
        x->body_cap = cap;
    }
    memcpy(r->body + r->body_len, buf, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return len;
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *ud) {
    xfer *x = ud;
    size_t got = x->req->body_read(x->req->body_ud, buf, size * nitems);
    if (got == RL_HTTP_READ_ABORT || got > size * nitems) {
        x->read_failed = true;
        return CURL_READFUNC_ABORT;
    }
    return got;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)ut;
    xfer *x = ud;
    if (x->req->abort_flag && *x->req->abort_flag) return 1;
    /* Our own idle clock rather than CURLOPT_LOW_SPEED_*: curl averages
     * speed over a 5 s window, so a burst followed by silence would run
     * several seconds past the limit. */
    double now = rl_now();
    if (dn != x->last_dn || un != x->last_un) {
        x->last_dn = dn, x->last_un = un, x->last_move = now;
    } else if (x->req->idle_timeout_s > 0 && now - x->last_move > x->req->idle_timeout_s) {
        x->idle = true;
        return 1;
    }
    return 0;
}

/* ---- one request ---------------------------------------------------------------- */
static bool has_header(const char *const *hs, const char *name) {
    size_t nl = strlen(name);
    for (; hs && *hs; hs++)
        if (strncasecmp(*hs, name, nl) == 0 && (*hs)[nl] == ':') return true;
    return false;
}

static int map_curl_error(CURLcode cc, const xfer *x, const char *method, const char *url,
                          const char *detail, rl_err *e) {
    char u[512];
    rl_http_url_redact(url, u, sizeof u);
    const char *why = detail && *detail ? detail : curl_easy_strerror(cc);
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT:
        return rl_errf(e, RL_ETIMEOUT, "%s %s: timed out (%s)", method, u, why);
    case CURLE_ABORTED_BY_CALLBACK:
        if (x->read_failed)
            return rl_errf(e, RL_EIO, "%s %s: the request body source failed", method, u);
        if (x->idle)
            return rl_errf(e, RL_ETIMEOUT, "%s %s: no data for %g s", method, u,
                           x->req->idle_timeout_s);
        return rl_errf(e, RL_EABORT, "%s %s: cancelled", method, u);
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return rl_errf(e, RL_EPEER, "%s %s: connection failed: %s", method, u, why);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
        return rl_errf(e, RL_EIO, "%s %s: TLS verification failed (is the CA right?): %s",
                       method, u, why);
    case CURLE_SSL_CERTPROBLEM:
        return rl_errf(e, RL_EIO, "%s %s: client certificate or key unusable: %s", method,
                       u, why);
    case CURLE_WRITE_ERROR:
        if (x->too_big)
            return rl_errf(e, RL_EIO, "%s %s: response body over %zu bytes", method, u,
                           x->max_body);
        break;
    default: break;
    }
    if (x->oom) return rl_errf(e, RL_ENOMEM, "%s %s: out of memory", method, u);
    if (x->read_failed)
        return rl_errf(e, RL_EIO, "%s %s: the request body source failed", method, u);
    return rl_errf(e, RL_EIO, "%s %s: %s", method, u, why);
}

/* Each option set on the handle, or the reason it was refused. */
#define SET(opt, val)                                                                     \
    do {                                                                                  \
        if (curl_easy_setopt(c, opt, val) != CURLE_OK)                                    \
            return rl_errf(e, RL_EINTERNAL, "libcurl rejected option %s", #opt);          \
    } while (0)

/* What every request gets: verified TLS, http(s) only, no redirects,
 * timeouts, our callbacks. */
static int set_basics(CURL *c, const rl_http_req *req, xfer *x, char *errbuf, rl_err *e) {
    SET(CURLOPT_URL, req->url);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_ERRORBUFFER, errbuf);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_SSL_VERIFYPEER, 1L);
    SET(CURLOPT_SSL_VERIFYHOST, 2L);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    double ct = req->connect_timeout_s > 0 ? req->connect_timeout_s : 10.0;
    SET(CURLOPT_CONNECTTIMEOUT_MS, (long)(ct * 1000.0 + 0.5));
    if (req->timeout_s > 0) SET(CURLOPT_TIMEOUT_MS, (long)(req->timeout_s * 1000.0 + 0.5));
    SET(CURLOPT_NOPROGRESS, 0L);
    SET(CURLOPT_XFERINFOFUNCTION, on_progress);
    SET(CURLOPT_XFERINFODATA, x);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, x);
    SET(CURLOPT_WRITEFUNCTION, on_write);
    SET(CURLOPT_WRITEDATA, x);
    return RL_OK;
}

/* A given CA replaces the system store rather than adding to it: a cluster
 * CA must not be widened to every public CA. Client certificate and key
 * from memory or files. */
static int set_tls(CURL *c, const rl_http_tls *t, rl_err *e) {
    if (!t) return RL_OK;
    if (t->ca_pem && t->ca_pem_len) {
        struct curl_blob b = {(void *)t->ca_pem, t->ca_pem_len, CURL_BLOB_COPY};
        SET(CURLOPT_CAINFO_BLOB, &b);
        SET(CURLOPT_CAPATH, (char *)NULL);
    } else if (t->ca_file && *t->ca_file) {
        SET(CURLOPT_CAINFO, t->ca_file);
        SET(CURLOPT_CAPATH, (char *)NULL);
    }
    if (t->cert_pem && t->cert_pem_len) {
        struct curl_blob b = {(void *)t->cert_pem, t->cert_pem_len, CURL_BLOB_COPY};
        SET(CURLOPT_SSLCERT_BLOB, &b);
        SET(CURLOPT_SSLCERTTYPE, "PEM");
    } else if (t->cert_file && *t->cert_file) {
        SET(CURLOPT_SSLCERT, t->cert_file);
    }
    if (t->key_pem && t->key_pem_len) {
        struct curl_blob b = {(void *)t->key_pem, t->key_pem_len, CURL_BLOB_COPY};
        SET(CURLOPT_SSLKEY_BLOB, &b);
        SET(CURLOPT_SSLKEYTYPE, "PEM");
    } else if (t->key_file && *t->key_file) {
        SET(CURLOPT_SSLKEY, t->key_file);
    }
    return RL_OK;
}

/* The caller's headers, then no "Expect: 100-continue" round trip for big
 * bodies and no form content type invented by libcurl for POSTFIELDS.
 * *hl is the caller's to free, whatever the result. */
static int set_headers(CURL *c, const rl_http_req *req, struct curl_slist **hl, rl_err *e) {
    const char *extra[] = {"Expect:", has_header(req->headers, "Content-Type") ? NULL : "Content-Type:"};
    for (const char *const *p = req->headers; p && *p; p++) {
        struct curl_slist *n = curl_slist_append(*hl, *p);
        if (!n) return rl_errf(e, RL_ENOMEM, "out of memory building headers");
        *hl = n;
    }
    for (size_t i = 0; i < 2; i++) {
        if (!extra[i]) continue;
        struct curl_slist *n = curl_slist_append(*hl, extra[i]);
        if (!n) return rl_errf(e, RL_ENOMEM, "out of memory building headers");
        *hl = n;
    }
    SET(CURLOPT_HTTPHEADER, *hl);
    return RL_OK;
}

/* The method and its body: streamed from a callback, from memory, or none. */
static int set_body(CURL *c, const rl_http_req *req, const char *method, xfer *x, rl_err *e) {
    if (req->body_read) {
        SET(CURLOPT_UPLOAD, 1L);
        SET(CURLOPT_READFUNCTION, on_read);
        SET(CURLOPT_READDATA, x);
        if (req->body_read_len >= 0) SET(CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_read_len);
        SET(CURLOPT_CUSTOMREQUEST, method);
    } else if (req->body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
               strcmp(method, "PATCH") == 0) {
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        SET(CURLOPT_POSTFIELDS, req->body ? (const char *)req->body : "");
        SET(CURLOPT_CUSTOMREQUEST, method);
    } else if (strcmp(method, "HEAD") == 0) {
        SET(CURLOPT_NOBODY, 1L);
    } else if (strcmp(method, "GET") != 0) {
        SET(CURLOPT_CUSTOMREQUEST, method);
    }
    return RL_OK;
}
#undef SET

int rl_http_do(rl_http *h, const rl_http_req *req, rl_http_resp *resp, rl_err *e) {
    memset(resp, 0, sizeof *resp);
    const char *method = req->method ? req->method : "GET";
    if (!req->url || !*req->url) return rl_errf(e, RL_EINTERNAL, "%s: no URL given", method);
    if (req->abort_flag && *req->abort_flag) {
        char u[512];
        rl_http_url_redact(req->url, u, sizeof u);
        return rl_errf(e, RL_EABORT, "%s %s: cancelled", method, u);
    }
    CURL *c = h->curl;
    curl_easy_reset(c);
    xfer x = {.curl = c, .req = req, .resp = resp, .max_body = req->max_body ? req->max_body : 64u << 20};
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hl = NULL;
    int rc;
    if (!(rc = set_basics(c, req, &x, errbuf, e)) && !(rc = set_tls(c, req->tls, e)) &&
        !(rc = set_headers(c, req, &hl, e)) && !(rc = set_body(c, req, method, &x, e))) {
        x.last_move = rl_now();
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        resp->status = status;
        if (cc == CURLE_WRITE_ERROR && x.stopped) {
            resp->stopped = true;
            cc = CURLE_OK;
        }
        if (cc != CURLE_OK) rc = map_curl_error(cc, &x, method, req->url, errbuf, e);
    }
    curl_slist_free_all(hl);
    /* Drop our pointers from the handle: the slist and errbuf die here. */
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, (struct curl_slist *)NULL);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, (char *)NULL);
    return rc;
}
