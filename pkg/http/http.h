/* http: the one libcurl wrapper, shared by the Kubernetes client, the etcd
 * client and the S3 client.
 *
 * One rl_http owns one curl easy handle and is used by one thread at a time;
 * reusing it across requests keeps its connection cache (keep-alive, TLS
 * sessions). A client that several threads share keeps a small pool of them
 * (pkg/k8s does). Creating one is cheap (no connection is made until a
 * request).
 *
 * TLS is always verified (peer and host name) against the given CA, or the
 * system store when none is given; there is deliberately no way to turn that
 * off. Plain http:// works too (etcd on loopback).
 *
 * Transport failures map to error codes callers can act on:
 *   RL_ETIMEOUT  connect timeout, total timeout, or the low-speed limit hit
 *   RL_EPEER     connection refused / reset / closed early, name resolution
 *   RL_EABORT    the abort flag was set
 *   RL_EIO       anything else (TLS verification failure included)
 * A response with any HTTP status is RL_OK here: the status is the caller's
 * to judge. Messages name the method and the URL without its query string
 * or user info (query strings carry signatures and tokens). */
#ifndef RL_HTTP_H
#define RL_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* TLS material; every member optional. A PEM blob wins over a file of the
 * same kind. Blobs are copied by libcurl for the duration of the request. */
typedef struct rl_http_tls {
    const char *ca_file;
    const char *ca_pem;
    size_t ca_pem_len;
    const char *cert_file, *key_file; /* client certificate (mutual TLS) */
    const char *cert_pem, *key_pem;
    size_t cert_pem_len, key_pem_len;
} rl_http_tls;

/* Streamed response body: return 0 to go on, non-zero to stop the transfer
 * (rl_http_do then returns RL_OK with resp->stopped set). */
typedef int (*rl_http_data_fn)(void *ud, const char *data, size_t len);
/* Request body source: fill up to n bytes, return the count; 0 ends the
 * body; RL_HTTP_READ_ABORT fails the request (RL_EIO). */
typedef size_t (*rl_http_read_fn)(void *ud, char *buf, size_t n);
#define RL_HTTP_READ_ABORT ((size_t)-1)

typedef struct rl_http_req {
    const char *method; /* "GET", "PUT", ... */
    const char *url;
    const char *const *headers; /* NULL-terminated "Name: value" lines, or NULL */
    /* Body from memory ... */
    const void *body;
    size_t body_len;
    /* ... or through a callback (body_read non-NULL); body_read_len is the
     * Content-Length, or -1 to send chunked. */
    rl_http_read_fn body_read;
    void *body_ud;
    long long body_read_len;
    const rl_http_tls *tls;
    double connect_timeout_s; /* 0: 10 s */
    double timeout_s;         /* whole transfer; 0: none (then set a low-speed limit) */
    /* Fail with RL_ETIMEOUT when no byte moves in either direction for this
     * long (0: off); noticed within about a second. A watch stream whose
     * bookmarks stop arriving ends this way instead of hanging. */
    double idle_timeout_s;
    /* Checked at least about once a second while the request runs (from
     * curl's progress callback) and before it starts; set by another thread
     * to cancel: the request then fails with RL_EABORT. */
    const volatile int *abort_flag;
    /* Stream a 2xx response's body here instead of collecting it
     * (resp->body stays NULL). Any other status's body is collected as
     * usual: it is an error document the caller wants whole. */
    rl_http_data_fn on_data;
    void *data_ud;
    size_t max_body; /* cap on a collected body; 0: 64 MiB. Over it: RL_EIO. */
} rl_http_req;

typedef struct rl_http_resp {
    long status;      /* 0 when no response arrived */
    char *body;       /* collected body, NUL-terminated (NULL when streamed or empty) */
    size_t body_len;
    bool stopped;     /* the on_data callback stopped the transfer */
    char *hdrs;       /* the final response's headers: "name\0value\0" pairs */
    size_t hdrs_len;
} rl_http_resp;

typedef struct rl_http rl_http;

/* curl_global_init runs once per process (pthread_once), on first use. */
int rl_http_new(rl_http **out, rl_err *e);
void rl_http_free(rl_http *h);
/* Run one request. resp is reset first; free it with rl_http_resp_free
 * whatever the result (a failed request may still carry a status). */
int rl_http_do(rl_http *h, const rl_http_req *req, rl_http_resp *resp, rl_err *e);
void rl_http_resp_free(rl_http_resp *r);
/* Value of the response header `name` (case-insensitive; the last one when
 * repeated), or NULL. Points into resp. */
const char *rl_http_resp_header(const rl_http_resp *r, const char *name);

/* The URL as it may appear in messages: no user info, no query, no
 * fragment; truncated to fit. */
void rl_http_url_redact(const char *url, char *out, size_t n);

/* Whether an http:// URL would carry a secret in clear past this machine:
 * http:// to a host other than localhost, 127.0.0.0/8 or [::1]. Secrets
 * bound for such a URL need an explicit opt-in (RL_EINPUT otherwise, with
 * `what` naming the secret and `optin` the setting that allows it). */
bool rl_http_url_cleartext_remote(const char *url);
int rl_http_cleartext_check(const char *url, bool allowed, const char *what, const char *optin, rl_err *e);

/* ---- retry policy (shared by k8s, etcd and s3) ---------------------------------
 * Exponential backoff with full jitter: attempt k (0-based) waits a uniform
 * time in [0, min(cap, base * 2^k)). A Retry-After the server sent replaces
 * the jittered delay (never below it; callers stop when it passes their
 * deadline). */
typedef struct rl_http_backoff {
    double base_s;  /* 0: 0.2 s */
    double cap_s;   /* 0: 30 s */
    int attempts;   /* total tries including the first; 0: 8 */
} rl_http_backoff;

/* Delay before retry number `attempt` (0 = after the first failure).
 * retry_after_s < 0 means none was given. rng_state: any caller-owned
 * seed (e.g. from rl_http_jitter_seed()). */
double rl_http_backoff_delay(const rl_http_backoff *b, int attempt, double retry_after_s,
                             uint64_t *rng_state);
uint64_t rl_http_jitter_seed(void);
/* Whether an outcome is worth another try: transport timeouts and
 * connection failures (rc RL_ETIMEOUT / RL_EPEER), and responses 429, 500,
 * 502, 503, 504 (and other 5xx except 501 Not Implemented and 505). */
bool rl_http_retryable(int rc, long status);
/* Parse a Retry-After value: delta seconds ("120") or an HTTP date (IMF
 * fixdate "Sun, 06 Nov 1994 08:49:37 GMT", RFC 850, asctime), relative to
 * now_unix. A date in the past gives 0. RL_EINPUT if unparseable. */
int rl_http_parse_retry_after(const char *value, double now_unix, double *out_s);
/* Sleep for s seconds in short slices, returning RL_EABORT early when
 * *abort_flag becomes non-zero (NULL: plain sleep). */
int rl_http_sleep(double s, const volatile int *abort_flag);

/* A streamed body split into lines as its bytes arrive (the watch streams
 * of the Kubernetes API and of etcd): on_line gets each complete line
 * without its '\n', a trailing '\r' removed; empty lines are skipped. A
 * line longer than max_line (0: 16 MiB) is RL_EIO naming `what`, so a
 * stream cannot grow memory without bound; on_line returning non-zero
 * stops and that value is returned. Fuzzed through both watch targets. */
typedef struct rl_http_lines {
    char *buf;
    size_t len, cap, max_line;
    const char *what;
} rl_http_lines;
typedef int (*rl_http_line_fn)(void *ud, const char *line, size_t len);
void rl_http_lines_init(rl_http_lines *l, size_t max_line, const char *what);
int rl_http_lines_feed(rl_http_lines *l, const char *data, size_t n, rl_http_line_fn on_line,
                       void *ud, rl_err *e);
void rl_http_lines_free(rl_http_lines *l);

/* Percent-encode src for a URL query value (RFC 3986 unreserved kept). */
int rl_http_query_escape(const char *src, char *out, size_t n, rl_err *e);

#endif
