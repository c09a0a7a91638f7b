/* etcd v3 client over the JSON gateway; see etcd_internal.h. */
#include "etcd/etcd.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

struct rl_etcd {
    char endpoint[256];
    double timeout_s;
    const volatile int *abort_flag;
    rl_http *http;
};


/* ---- strict field readers -------------------------------------------------------- */
static cJSON *parse_doc(const char *body, size_t len) {
    if (!body || !len) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!j) return NULL;
    /* trailing bytes after the document: not an answer etcd would send */
    for (const char *p = end; p && p < body + len; p++)
        if (!isspace((unsigned char)*p) && *p != '\0') {
            cJSON_Delete(j);
            return NULL;
        }
    return j;
}

/* int64 members are decimal strings in protobuf's JSON mapping; absent
 * means 0. min bounds the value (revisions and TTLs are never negative). */
static int get_i64(const cJSON *obj, const char *name, const char *what, int64_t min, int64_t *out,
                   rl_err *e) {
    *out = 0;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!it || cJSON_IsNull(it)) return RL_OK;
    if (!cJSON_IsString(it))
        return rl_errf(e, RL_EIO, "%s: member '%s' is not an int64 string", what, name);
    const char *s = it->valuestring;
    const char *p = s[0] == '-' ? s + 1 : s;
    if (!*p || strlen(p) > 19) return rl_errf(e, RL_EIO, "%s: member '%s' is not an int64", what, name);
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return rl_errf(e, RL_EIO, "%s: member '%s' is not an int64", what, name);
    errno = 0;
    char *endp = NULL;
    long long v = strtoll(s, &endp, 10);
    if (errno || *endp || v < min)
        return rl_errf(e, RL_EIO, "%s: member '%s' is out of range", what, name);
    *out = (int64_t)v;
    return RL_OK;
}

static int get_bool(const cJSON *obj, const char *name, const char *what, bool *out, rl_err *e) {
    *out = false;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!it || cJSON_IsNull(it)) return RL_OK;
    if (!cJSON_IsBool(it)) return rl_errf(e, RL_EIO, "%s: member '%s' is not a boolean", what, name);
    *out = cJSON_IsTrue(it);
    return RL_OK;
}

/* Absent (or null) is NULL; a member of another type is an error. */
static int get_typed(const cJSON *obj, const char *name, const char *what, int type,
                     const cJSON **out, rl_err *e) {
    *out = NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!it || cJSON_IsNull(it)) return RL_OK;
    if ((it->type & 0xff) != type)
        return rl_errf(e, RL_EIO, "%s: member '%s' is not %s", what, name,
                       type == cJSON_Object ? "an object" : type == cJSON_Array ? "an array" : "a string");
    *out = it;
    return RL_OK;
}

static int get_bytes(const cJSON *obj, const char *name, const char *what, char **out,
                     size_t *len, rl_err *e) {
    const cJSON *it;
    int rc = get_typed(obj, name, what, cJSON_String, &it, e);
    if (rc) return rc;
    if (!it) {
        *out = calloc(1, 1);
        *len = 0;
        return *out ? RL_OK : rl_errf(e, RL_ENOMEM, "%s: out of memory", what);
    }
    if (rl_base64_decode(it->valuestring, strlen(it->valuestring), false, out, len) != 0)
        return rl_errf(e, RL_EIO, "%s: member '%s' is not valid base64", what, name);
    return RL_OK;
}

static int parse_header_rev(const cJSON *obj, const char *what, int64_t *rev, rl_err *e) {
    const cJSON *h;
    int rc = get_typed(obj, "header", what, cJSON_Object, &h, e);
    if (rc) return rc;
    *rev = 0;
    if (!h) return RL_OK;
    return get_i64(h, "revision", what, 0, rev, e);
}

static void kv_free(rl_etcd_kv *kv) {
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

static int parse_kv(const cJSON *j, const char *what, rl_etcd_kv *kv, rl_err *e) {
    memset(kv, 0, sizeof *kv);
    if (!cJSON_IsObject(j)) return rl_errf(e, RL_EIO, "%s: a key-value is not an object", what);
    int rc;
    if ((rc = get_bytes(j, "key", what, &kv->key, &kv->key_len, e)) ||
        (rc = get_bytes(j, "value", what, &kv->value, &kv->value_len, e)) ||
        (rc = get_i64(j, "create_revision", what, 0, &kv->create_rev, e)) ||
        (rc = get_i64(j, "mod_revision", what, 0, &kv->mod_rev, e)) ||
        (rc = get_i64(j, "version", what, 0, &kv->version, e)) ||
        (rc = get_i64(j, "lease", what, 0, &kv->lease, e))) {
        kv_free(kv);
        return rc;
    }
    return RL_OK;
}

void rl_etcd_kvs_free(rl_etcd_kvs *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) kv_free(&r->kvs[i]);
    free(r->kvs);
    memset(r, 0, sizeof *r);
}

/* Append the "kvs" array of a range answer to out. */
static int append_kvs(const cJSON *obj, const char *what, rl_etcd_kvs *out, rl_err *e) {
    const cJSON *arr;
    int rc = get_typed(obj, "kvs", what, cJSON_Array, &arr, e);
    if (rc || !arr) return rc;
    int n = cJSON_GetArraySize(arr);
    if (n <= 0) return RL_OK;
    rl_etcd_kv *nk = realloc(out->kvs, (size_t)(out->n + n) * sizeof *nk);
    if (!nk) return rl_errf(e, RL_ENOMEM, "%s: out of memory", what);
    out->kvs = nk;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if ((rc = parse_kv(it, what, &out->kvs[out->n], e))) return rc;
        out->n++;
    }
    return RL_OK;
}

int rl_etcd_parse_range(const char *body, size_t len, const char *what, rl_etcd_kvs *out,
                        rl_err *e) {
    memset(out, 0, sizeof *out);
    cJSON *j = parse_doc(body, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rl_errf(e, RL_EIO, "%s: the answer is not a JSON object", what);
    }
    int64_t count = 0;
    int rc;
    if ((rc = parse_header_rev(j, what, &out->revision, e)) ||
        (rc = get_i64(j, "count", what, 0, &count, e)) ||
        (rc = get_bool(j, "more", what, &out->more, e)) || (rc = append_kvs(j, what, out, e))) {
        rl_etcd_kvs_free(out);
        cJSON_Delete(j);
        return rc;
    }
    out->count = count;
    cJSON_Delete(j);
    return RL_OK;
}

int rl_etcd_parse_txn(const char *body, size_t len, const char *what, bool *succeeded,
                      rl_etcd_kvs *kvs, rl_err *e) {
    rl_etcd_kvs tmp;
    rl_etcd_kvs *out = kvs ? kvs : &tmp;
    memset(out, 0, sizeof *out);
    *succeeded = false;
    cJSON *j = parse_doc(body, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rl_errf(e, RL_EIO, "%s: the answer is not a JSON object", what);
    }
    const cJSON *resps = NULL, *r;
    int rc;
    if ((rc = parse_header_rev(j, what, &out->revision, e)) ||
        (rc = get_bool(j, "succeeded", what, succeeded, e)) ||
        (rc = get_typed(j, "responses", what, cJSON_Array, &resps, e)))
        goto done;
    cJSON_ArrayForEach(r, resps) {
        if (!cJSON_IsObject(r)) {
            rc = rl_errf(e, RL_EIO, "%s: a member of 'responses' is not an object", what);
            goto done;
        }
        const cJSON *rr;
        if ((rc = get_typed(r, "response_range", what, cJSON_Object, &rr, e))) goto done;
        if (rr && (rc = append_kvs(rr, what, out, e))) goto done;
    }
done:
    if (rc || !kvs) rl_etcd_kvs_free(out);
    cJSON_Delete(j);
    return rc;
}

/* Untrusted server text in our one-line messages: printable ASCII only. */
static void clean_text(char *dst, size_t n, const char *src) {
    size_t o = 0;
    for (; src && *src && o + 1 < n; src++) dst[o++] = (*src >= 0x20 && *src < 0x7f) ? *src : '?';
    dst[o] = '\0';
}

int rl_etcd_parse_grant(const char *body, size_t len, const char *what, int64_t *id,
                        int64_t *ttl, rl_err *e) {
    cJSON *j = parse_doc(body, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rl_errf(e, RL_EIO, "%s: the answer is not a JSON object", what);
    }
    const cJSON *err;
    int rc = get_typed(j, "error", what, cJSON_String, &err, e);
    if (!rc && err && err->valuestring[0])
        rc = rl_errf(e, RL_EIO, "%s: etcd refused the lease: %.160s", what, err->valuestring);
    if (!rc) rc = get_i64(j, "ID", what, 0, id, e);
    if (!rc) rc = get_i64(j, "TTL", what, 0, ttl, e);
    if (!rc && (*id == 0 || *ttl <= 0))
        rc = rl_errf(e, RL_EIO, "%s: the answer has no lease ID or TTL", what);
    cJSON_Delete(j);
    return rc;
}

int rl_etcd_parse_keepalive(const char *body, size_t len, const char *what, int64_t *ttl,
                            rl_err *e) {
    *ttl = 0;
    cJSON *j = parse_doc(body, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rl_errf(e, RL_EIO, "%s: the answer is not a JSON object", what);
    }
    const cJSON *res, *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    int rc = get_typed(j, "result", what, cJSON_Object, &res, e);
    if (!rc && !res && cJSON_IsObject(err)) {
        /* a streaming call's failure (no leader, shutting down): worth a retry */
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        char clean[160];
        clean_text(clean, sizeof clean, cJSON_IsString(msg) ? msg->valuestring : "(no message)");
        rc = rl_errf(e, RL_EPEER, "%s: etcd failed the call: %s", what, clean);
    }
    if (!rc && !res) rc = rl_errf(e, RL_EIO, "%s: the answer has no 'result'", what);
    int64_t v = 0;
    if (!rc) rc = get_i64(res, "TTL", what, 0, &v, e);
    if (!rc) *ttl = v;
    cJSON_Delete(j);
    return rc;
}

void rl_etcd_watch_msg_free(rl_etcd_watch_msg *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) kv_free(&m->events[i].kv);
    free(m->events);
    memset(m, 0, sizeof *m);
}

int rl_etcd_parse_watch_msg(const char *line, size_t len, const char *what,
                            rl_etcd_watch_msg *m, rl_err *e) {
    memset(m, 0, sizeof *m);
    cJSON *j = parse_doc(line, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rl_errf(e, RL_EIO, "%s: a stream line is not a JSON object", what);
    }
    int rc;
    const cJSON *res, *err;
    /* grpc-gateway ends a failed stream with {"error":{...,"message":...}} */
    if ((rc = get_typed(j, "error", what, cJSON_Object, &err, e))) goto done;
    if (err) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        char clean[160];
        clean_text(clean, sizeof clean, cJSON_IsString(msg) ? msg->valuestring : "(no message)");
        rc = rl_errf(e, RL_EPEER, "%s: etcd ended the stream: %s", what, clean);
        goto done;
    }
    if ((rc = get_typed(j, "result", what, cJSON_Object, &res, e))) goto done;
    if (!res) {
        rc = rl_errf(e, RL_EIO, "%s: a stream line has no 'result'", what);
        goto done;
    }
    const cJSON *reason, *evs, *ev;
    if ((rc = parse_header_rev(res, what, &m->revision, e)) ||
        (rc = get_i64(res, "watch_id", what, 0, &m->watch_id, e)) ||
        (rc = get_i64(res, "compact_revision", what, 0, &m->compact_revision, e)) ||
        (rc = get_bool(res, "created", what, &m->created, e)) ||
        (rc = get_bool(res, "canceled", what, &m->canceled, e)) ||
        (rc = get_typed(res, "cancel_reason", what, cJSON_String, &reason, e)) ||
        (rc = get_typed(res, "events", what, cJSON_Array, &evs, e)))
        goto done;
    if (reason) clean_text(m->cancel_reason, sizeof m->cancel_reason, reason->valuestring);
    int n = evs ? cJSON_GetArraySize(evs) : 0;
    if (n > 0) {
        m->events = calloc((size_t)n, sizeof *m->events);
        if (!m->events) {
            rc = rl_errf(e, RL_ENOMEM, "%s: out of memory", what);
            goto done;
        }
    }
    cJSON_ArrayForEach(ev, evs) {
        if (!cJSON_IsObject(ev)) {
            rc = rl_errf(e, RL_EIO, "%s: an event is not an object", what);
            goto done;
        }
        const cJSON *type, *kv;
        if ((rc = get_typed(ev, "type", what, cJSON_String, &type, e)) ||
            (rc = get_typed(ev, "kv", what, cJSON_Object, &kv, e)))
            goto done;
        rl_etcd_event *out = &m->events[m->n];
        /* PUT is the enum's zero value, which the gateway leaves out */
        if (!type || strcmp(type->valuestring, "PUT") == 0)
            out->type = RL_ETCD_EV_PUT;
        else if (strcmp(type->valuestring, "DELETE") == 0)
            out->type = RL_ETCD_EV_DELETE;
        else {
            rc = rl_errf(e, RL_EIO, "%s: an event has an unknown 'type'", what);
            goto done;
        }
        if (!kv) {
            rc = rl_errf(e, RL_EIO, "%s: an event has no 'kv'", what);
            goto done;
        }
        if ((rc = parse_kv(kv, what, &out->kv, e))) goto done;
        m->n++;
    }
done:
    if (rc) rl_etcd_watch_msg_free(m);
    cJSON_Delete(j);
    return rc;
}

/* ---- line splitting of the watch stream ----------------------------------------------- */
static int handle_line(const char *line, size_t n, const char *what, rl_etcd_watch_fn fn,
                       void *ud, bool *stop, rl_err *e) {
    size_t a = 0;
    while (a < n && isspace((unsigned char)line[a])) a++;
    if (a == n) return RL_OK;
    rl_etcd_watch_msg m;
    int rc = rl_etcd_parse_watch_msg(line, n, what, &m, e);
    if (rc) return rc;
    if (fn && fn(ud, &m) != 0) *stop = true;
    if (!*stop && m.canceled) {
        if (m.compact_revision > 0)
            rc = rl_errf(e, RL_EPEER, "%s: etcd canceled the watch: revision compacted (now %" PRId64 ")",
                         what, m.compact_revision);
        else
            rc = rl_errf(e, RL_EPEER, "%s: etcd canceled the watch: %s", what,
                         m.cancel_reason[0] ? m.cancel_reason : "no reason given");
    }
    rl_etcd_watch_msg_free(&m);
    return rc;
}

/* rl_http_lines hands each line here; STOP ends the feed without error. */
#define STOP (-1)
typedef struct feed {
    const char *what;
    rl_etcd_watch_fn fn;
    void *ud;
    bool *stop;
    rl_err *e;
} feed;

static int feed_line(void *ud, const char *line, size_t n) {
    feed *f = ud;
    int rc = handle_line(line, n, f->what, f->fn, f->ud, f->stop, f->e);
    return rc ? rc : *f->stop ? STOP : 0;
}

int rl_etcd_watch_feed(rl_http_lines *l, const char *data, size_t len, rl_etcd_watch_fn fn,
                       void *ud, bool *stop, rl_err *e) {
    if (*stop) return RL_OK;
    feed f = {.what = l->what, .fn = fn, .ud = ud, .stop = stop, .e = e};
    int rc = rl_http_lines_feed(l, data, len, feed_line, &f, e);
    return rc == STOP ? RL_OK : rc;
}

/* ---- the client ---------------------------------------------------------------------- */
int rl_etcd_new(const char *endpoint, double timeout_s, rl_etcd **out, rl_err *e) {
    *out = NULL;
    if (!endpoint || !*endpoint)
        return rl_errf(e, RL_EINPUT, "etcd endpoint: empty (want http://host:port)");
    char red[256];
    rl_http_url_redact(endpoint, red, sizeof red);
    size_t n = strlen(endpoint);
    bool scheme = strncmp(endpoint, "http://", 7) == 0 || strncmp(endpoint, "https://", 8) == 0;
    const char *hostpart = scheme ? strstr(endpoint, "://") + 3 : endpoint;
    const char *slash = strchr(hostpart, '/');
    if (!scheme || !*hostpart || (slash && slash[1] != '\0') || n >= 200 ||
        strpbrk(endpoint, " \t\r\n?#@"))
        return rl_errf(e, RL_EINPUT, "etcd endpoint '%s': want http://host:port or https://host:port",
                       red);
    rl_etcd *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "etcd client: out of memory");
    memcpy(c->endpoint, endpoint, n + 1);
    if (c->endpoint[n - 1] == '/') c->endpoint[n - 1] = '\0';
    c->timeout_s = timeout_s > 0 ? timeout_s : 5.0;
    int rc = rl_http_new(&c->http, e);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return RL_OK;
}

void rl_etcd_free(rl_etcd *c) {
    if (!c) return;
    rl_http_free(c->http);
    free(c);
}

void rl_etcd_set_abort(rl_etcd *c, const volatile int *flag) { c->abort_flag = flag; }
void rl_etcd_set_timeout(rl_etcd *c, double timeout_s) { c->timeout_s = timeout_s > 0 ? timeout_s : 5.0; }
const char *rl_etcd_endpoint(const rl_etcd *c) { return c->endpoint; }

/* The gateway's error document: {"error":"...","message":"...","code":N}
 * with a gRPC status code. */
static int status_error(const rl_etcd *c, const char *path, const rl_http_resp *r, rl_err *e) {
    char msg[160] = "";
    int code = -1;
    cJSON *j = r->body ? parse_doc(r->body, r->body_len) : NULL;
    if (cJSON_IsObject(j)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "message");
        const cJSON *cd = cJSON_GetObjectItemCaseSensitive(j, "code");
        if (cJSON_IsString(m)) clean_text(msg, sizeof msg, m->valuestring);
        if (cJSON_IsNumber(cd)) code = cd->valueint;
    }
    cJSON_Delete(j);
    /* gRPC codes: 3 InvalidArgument, 9 FailedPrecondition, 11 OutOfRange
     * are the caller's fault; 14 Unavailable, 4 DeadlineExceeded and any 5xx
     * pass with time; the rest we cannot act on. */
    int rc = RL_EIO;
    if (code == 3 || code == 9 || code == 11 || r->status == 400)
        rc = RL_EINPUT;
    else if (code == 14 || code == 4 || r->status >= 500)
        rc = RL_EPEER;
    return rl_errf(e, rc, "etcd %s at %s: HTTP %ld%s%s", path, c->endpoint, r->status,
                   msg[0] ? ": " : "", msg);
}

/* POST a JSON body to endpoint+path; on RL_OK resp holds a 200 answer. A 404
 * is handed back too when accept_404 (a lease that is already gone). */
static int post(rl_etcd *c, const char *path, const char *json, rl_http_resp *resp,
                bool accept_404, rl_err *e) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", c->endpoint, path);
    static const char *const hdrs[] = {"Content-Type: application/json", NULL};
    rl_http_req req = {
        .method = "POST",
        .url = url,
        .headers = hdrs,
        .body = json,
        .body_len = strlen(json),
        .connect_timeout_s = c->timeout_s < 3 ? c->timeout_s : 3,
        .timeout_s = c->timeout_s,
        .abort_flag = c->abort_flag,
        .max_body = 64u << 20,
    };
    int rc = rl_http_do(c->http, &req, resp, e);
    if (rc) return rl_err_wrap(e, "etcd %s", path);
    if (resp->status == 200 || (accept_404 && resp->status == 404)) return RL_OK;
    return status_error(c, path, resp, e);
}

/* range_end for a prefix: the prefix with its last byte below 0xff
 * incremented and what follows cut; "\0" (every key) when there is none. */
static char *prefix_end_b64(const char *key) {
    size_t n = strlen(key);
    char *end = malloc(n + 1);
    if (!end) return NULL;
    memcpy(end, key, n + 1);
    while (n > 0 && (unsigned char)end[n - 1] == 0xff) n--;
    char *b;
    if (n == 0) {
        b = rl_base64_encode("", 1); /* "\0": every key from `key` on */
    } else {
        end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
        b = rl_base64_encode(end, n);
    }
    free(end);
    return b;
}

/* cJSON object -> string helpers with all allocation failures folded into
 * one NULL check at the end. */
static void add_b64(cJSON *o, const char *name, const void *data, size_t n) {
    char *b = rl_base64_encode(data, n);
    if (b) cJSON_AddStringToObject(o, name, b);
    free(b);
}
static void add_i64(cJSON *o, const char *name, int64_t v) {
    char s[32];
    snprintf(s, sizeof s, "%" PRId64, v);
    cJSON_AddStringToObject(o, name, s);
}

static int post_obj(rl_etcd *c, const char *path, cJSON *o, rl_http_resp *resp, bool accept_404,
                    rl_err *e) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return rl_errf(e, RL_ENOMEM, "etcd %s: out of memory", path);
    int rc = post(c, path, s, resp, accept_404, e);
    free(s);
    return rc;
}

int rl_etcd_lease_grant(rl_etcd *c, int64_t ttl_s, int64_t *id, int64_t *ttl_out, rl_err *e) {
    if (ttl_s < 1) return rl_errf(e, RL_EINPUT, "etcd lease grant: TTL %" PRId64 " s, want >= 1", ttl_s);
    cJSON *o = cJSON_CreateObject();
    if (o) add_i64(o, "TTL", ttl_s);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/lease/grant", o, &r, false, e);
    int64_t lid = 0, ttl = 0;
    if (!rc) rc = rl_etcd_parse_grant(r.body, r.body_len, "etcd /v3/lease/grant", &lid, &ttl, e);
    rl_http_resp_free(&r);
    if (rc) return rc;
    *id = lid;
    if (ttl_out) *ttl_out = ttl;
    return RL_OK;
}

int rl_etcd_lease_keepalive(rl_etcd *c, int64_t id, int64_t *ttl, rl_err *e) {
    cJSON *o = cJSON_CreateObject();
    if (o) add_i64(o, "ID", id);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/lease/keepalive", o, &r, false, e);
    int64_t t = 0;
    if (!rc) rc = rl_etcd_parse_keepalive(r.body, r.body_len, "etcd /v3/lease/keepalive", &t, e);
    rl_http_resp_free(&r);
    if (!rc) *ttl = t;
    return rc;
}

int rl_etcd_lease_ttl(rl_etcd *c, int64_t id, int64_t *ttl, rl_err *e) {
    cJSON *o = cJSON_CreateObject();
    if (o) add_i64(o, "ID", id);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/lease/timetolive", o, &r, false, e);
    int64_t t = 0;
    if (!rc) {
        cJSON *j = parse_doc(r.body, r.body_len);
        if (!cJSON_IsObject(j))
            rc = rl_errf(e, RL_EIO, "etcd /v3/lease/timetolive: the answer is not a JSON object");
        else /* -1: the lease is gone */
            rc = get_i64(j, "TTL", "etcd /v3/lease/timetolive", -1, &t, e);
        cJSON_Delete(j);
    }
    rl_http_resp_free(&r);
    if (!rc) *ttl = t > 0 ? t : 0;
    return rc;
}

int rl_etcd_lease_revoke(rl_etcd *c, int64_t id, rl_err *e) {
    cJSON *o = cJSON_CreateObject();
    if (o) add_i64(o, "ID", id);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/lease/revoke", o, &r, true, e); /* 404: already gone */
    rl_http_resp_free(&r);
    return rc;
}

int rl_etcd_put(rl_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev, rl_err *e) {
    cJSON *o = cJSON_CreateObject();
    if (o) {
        add_b64(o, "key", key, strlen(key));
        add_b64(o, "value", val, len);
        if (lease) add_i64(o, "lease", lease);
    }
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/kv/put", o, &r, false, e);
    if (!rc && rev) {
        rl_etcd_kvs tmp;
        rc = rl_etcd_parse_range(r.body, r.body_len, "etcd /v3/kv/put", &tmp, e);
        *rev = tmp.revision;
        rl_etcd_kvs_free(&tmp);
    }
    rl_http_resp_free(&r);
    return rc;
}

static cJSON *key_obj(const char *key, bool prefix) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    add_b64(o, "key", key, strlen(key));
    if (prefix) {
        char *end = prefix_end_b64(key);
        if (!end) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddStringToObject(o, "range_end", end);
        free(end);
    }
    return o;
}

int rl_etcd_range(rl_etcd *c, const char *key, bool prefix, rl_etcd_kvs *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/kv/range", key_obj(key, prefix), &r, false, e);
    if (!rc) rc = rl_etcd_parse_range(r.body, r.body_len, "etcd /v3/kv/range", out, e);
    rl_http_resp_free(&r);
    return rc;
}

int rl_etcd_delete(rl_etcd *c, const char *key, bool prefix, int64_t *deleted, rl_err *e) {
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/kv/deleterange", key_obj(key, prefix), &r, false, e);
    if (!rc && deleted) {
        cJSON *j = parse_doc(r.body, r.body_len);
        if (!cJSON_IsObject(j))
            rc = rl_errf(e, RL_EIO, "etcd /v3/kv/deleterange: the answer is not a JSON object");
        else
            rc = get_i64(j, "deleted", "etcd /v3/kv/deleterange", 0, deleted, e);
        cJSON_Delete(j);
    }
    rl_http_resp_free(&r);
    return rc;
}

static cJSON *ops_array(const rl_etcd_op *ops, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        cJSON *w = cJSON_CreateObject(), *op = cJSON_CreateObject();
        if (!w || !op) {
            cJSON_Delete(w);
            cJSON_Delete(op);
            cJSON_Delete(arr);
            return NULL;
        }
        add_b64(op, "key", ops[i].key, strlen(ops[i].key));
        const char *name = "requestRange";
        if (ops[i].type == RL_ETCD_OP_PUT) {
            name = "requestPut";
            add_b64(op, "value", ops[i].value, ops[i].value_len);
            if (ops[i].lease) add_i64(op, "lease", ops[i].lease);
        } else if (ops[i].type == RL_ETCD_OP_DELETE) {
            name = "requestDeleteRange";
        }
        cJSON_AddItemToObject(w, name, op);
        cJSON_AddItemToArray(arr, w);
    }
    return arr;
}

int rl_etcd_txn(rl_etcd *c, const rl_etcd_cmp *cmp, int ncmp, const rl_etcd_op *ok_ops,
                int nok, const rl_etcd_op *fail_ops, int nfail, bool *succeeded,
                rl_etcd_kvs *kvs, rl_err *e) {
    if (kvs) memset(kvs, 0, sizeof *kvs);
    cJSON *o = cJSON_CreateObject(), *ca = cJSON_CreateArray();
    for (int i = 0; o && ca && i < ncmp; i++) {
        cJSON *x = cJSON_CreateObject();
        if (!x) break;
        add_b64(x, "key", cmp[i].key, strlen(cmp[i].key));
        cJSON_AddStringToObject(x, "result", "EQUAL");
        switch (cmp[i].target) {
        case RL_ETCD_CMP_CREATE:
            cJSON_AddStringToObject(x, "target", "CREATE");
            add_i64(x, "create_revision", cmp[i].rev);
            break;
        case RL_ETCD_CMP_MOD:
            cJSON_AddStringToObject(x, "target", "MOD");
            add_i64(x, "mod_revision", cmp[i].rev);
            break;
        case RL_ETCD_CMP_VERSION:
            cJSON_AddStringToObject(x, "target", "VERSION");
            add_i64(x, "version", cmp[i].rev);
            break;
        default:
            cJSON_AddStringToObject(x, "target", "VALUE");
            add_b64(x, "value", cmp[i].value, cmp[i].value_len);
        }
        cJSON_AddItemToArray(ca, x);
    }
    if (o && ca) {
        cJSON_AddItemToObject(o, "compare", ca);
        ca = NULL;
        cJSON *s = ops_array(ok_ops, nok), *f = ops_array(fail_ops, nfail);
        if (s) cJSON_AddItemToObject(o, "success", s);
        if (f) cJSON_AddItemToObject(o, "failure", f);
        if (!s || !f) {
            cJSON_Delete(o);
            o = NULL;
        }
    }
    cJSON_Delete(ca);
    rl_http_resp r = {0};
    int rc = post_obj(c, "/v3/kv/txn", o, &r, false, e);
    bool ok = false;
    if (!rc) rc = rl_etcd_parse_txn(r.body, r.body_len, "etcd /v3/kv/txn", &ok, kvs, e);
    rl_http_resp_free(&r);
    if (!rc) *succeeded = ok;
    return rc;
}

/* ---- watch ---------------------------------------------------------------------------- */
typedef struct watch_ctx {
    rl_http_lines lines;
    rl_etcd_watch_fn fn;
    void *ud;
    bool stop;
    int rc;
    rl_err err;
    const char *what;
} watch_ctx;

static int on_watch_data(void *ud, const char *data, size_t len) {
    watch_ctx *w = ud;
    w->rc = rl_etcd_watch_feed(&w->lines, data, len, w->fn, w->ud, &w->stop, &w->err);
    return w->rc || w->stop;
}

int rl_etcd_watch(rl_etcd *c, const char *key, bool prefix, int64_t start_rev,
                  double idle_timeout_s, rl_etcd_watch_fn fn, void *ud, rl_err *e) {
    cJSON *o = cJSON_CreateObject(), *cr = key_obj(key, prefix);
    if (!o || !cr) {
        cJSON_Delete(o);
        cJSON_Delete(cr);
        return rl_errf(e, RL_ENOMEM, "etcd /v3/watch: out of memory");
    }
    if (start_rev > 0) add_i64(cr, "start_revision", start_rev);
    cJSON_AddBoolToObject(cr, "progress_notify", 1);
    cJSON_AddItemToObject(o, "create_request", cr);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) return rl_errf(e, RL_ENOMEM, "etcd /v3/watch: out of memory");

    char url[512];
    snprintf(url, sizeof url, "%s/v3/watch", c->endpoint);
    static const char *const hdrs[] = {"Content-Type: application/json", NULL};
    watch_ctx w = {.fn = fn, .ud = ud, .what = "etcd /v3/watch"};
    rl_http_lines_init(&w.lines, 0, w.what);
    rl_http_req req = {
        .method = "POST",
        .url = url,
        .headers = hdrs,
        .body = body,
        .body_len = strlen(body),
        .connect_timeout_s = c->timeout_s < 3 ? c->timeout_s : 3,
        .idle_timeout_s = idle_timeout_s > 0 ? idle_timeout_s : 60,
        .abort_flag = c->abort_flag,
        .on_data = on_watch_data,
        .data_ud = &w,
    };
    rl_http_resp r = {0};
    int rc = rl_http_do(c->http, &req, &r, e);
    free(body);
    if (rc) {
        rl_err_wrap(e, "etcd /v3/watch");
    } else if (w.rc) {
        rc = w.rc;
        if (e) *e = w.err;
    } else if (w.stop) {
        rc = RL_OK;
    } else if (r.status != 200) {
        rc = status_error(c, "/v3/watch", &r, e);
    } else {
        rc = rl_errf(e, RL_EPEER, "etcd /v3/watch at %s: the stream ended", c->endpoint);
    }
    rl_http_resp_free(&r);
    rl_http_lines_free(&w.lines);
    return rc;
}

/* ---- JSON records in values (etcd.h) ----------------------------------------------- */
int rl_etcd_record_str(const cJSON *j, const char *key, const char *name, bool required,
                       char *out, size_t n, rl_err *e) {
    char where[96];
    rl_json_escape(where, sizeof where, key);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!it) {
        if (!required) return RL_OK;
        return rl_errf(e, RL_EIO, "etcd key '%s': the record has no '%s'", where, name);
    }
    if (!cJSON_IsString(it))
        return rl_errf(e, RL_EIO, "etcd key '%s': the record's '%s' is not a string", where, name);
    size_t l = strlen(it->valuestring);
    if ((required && l == 0) || l >= n)
        return rl_errf(e, RL_EIO, "etcd key '%s': the record's '%s' is empty or longer than %zu bytes",
                       where, name, n - 1);
    memcpy(out, it->valuestring, l + 1);
    return RL_OK;
}

cJSON *rl_etcd_record(const char *key, const char *val, size_t len, rl_err *e) {
    cJSON *j = parse_doc(val, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        char where[96];
        rl_json_escape(where, sizeof where, key);
        rl_errf(e, RL_EIO, "etcd key '%s': the value is not a JSON object (edited by hand? delete it "
                           "and the owner writes it again)", where);
        return NULL;
    }
    return j;
}
