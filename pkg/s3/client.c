/* The S3 client: addressing, one signed request with retries, and the
 * object operations. Multipart uploads are in multipart.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "s3_internal.h"

int rl_s3_list_page_size = 0;

void rl_s3_amz_date(double unix_s, char out[17]) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *env_or(const char *a, const char *b) {
    const char *v = getenv(a);
    if (v && *v) return v;
    v = b ? getenv(b) : NULL;
    return v && *v ? v : NULL;
}

int rl_s3_open(const rl_s3_config *c, rl_s3 **out, rl_err *e) {
    *out = NULL;
    rl_s3 *s = calloc(1, sizeof *s);
    if (!s) {
        rl_s3_creds_free(c->creds);
        return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    }
    s->cfg = *c;
    s->creds = c->creds;
    s->cfg.creds = NULL;
    if (!s->cfg.region[0]) {
        const char *r = env_or("AWS_REGION", "AWS_DEFAULT_REGION");
        snprintf(s->cfg.region, sizeof s->cfg.region, "%s", r ? r : "us-east-1");
    }
    bool aws = false;
    if (!s->cfg.endpoint[0]) {
        const char *ep = env_or("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
        if (ep) snprintf(s->cfg.endpoint, sizeof s->cfg.endpoint, "%s", ep);
        else snprintf(s->cfg.endpoint, sizeof s->cfg.endpoint, "https://s3.%s.amazonaws.com", s->cfg.region);
        aws = !ep;
    }
    int rc = RL_OK;
    /* scheme://host[:port][/base]; messages show it without user info */
    const char *ep = s->cfg.endpoint, *hs = strstr(ep, "://");
    char shown[sizeof s->cfg.endpoint];
    rl_http_url_redact(ep, shown, sizeof shown);
    if (!hs || (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0)) {
        rc = rl_errf(e, RL_EINPUT, "s3: endpoint %s: must start with http:// or https://", shown);
        goto fail;
    }
    snprintf(s->scheme, sizeof s->scheme, "%.*s", (int)(hs - ep), ep);
    hs += 3;
    const char *slash = strchr(hs, '/');
    size_t hl = slash ? (size_t)(slash - hs) : strlen(hs);
    if (hl == 0 || hl >= sizeof s->host || strchr(hs, '@')) {
        rc = rl_errf(e, RL_EINPUT, "s3: endpoint %s: no host, or user info in it", shown);
        goto fail;
    }
    snprintf(s->host, sizeof s->host, "%.*s", (int)hl, hs);
    snprintf(s->base, sizeof s->base, "%s", slash ? slash : "");
    size_t bl = strlen(s->base);
    while (bl > 0 && s->base[bl - 1] == '/') s->base[--bl] = '\0';
    if (!strcmp(s->cfg.addressing, "virtual")) s->virtual_host = true;
    else if (!strcmp(s->cfg.addressing, "path")) s->virtual_host = false;
    else if (!s->cfg.addressing[0]) s->virtual_host = aws; /* AWS prefers virtual; other servers often lack DNS for it */
    else {
        rc = rl_errf(e, RL_EINPUT, "s3: addressing \"%s\" is neither \"path\" nor \"virtual\"", s->cfg.addressing);
        goto fail;
    }
    if (!s->cfg.part_size) s->cfg.part_size = 16u << 20;
    if (s->cfg.part_size < (5u << 20)) s->cfg.part_size = 5u << 20;
    if (!s->cfg.multipart_threshold) s->cfg.multipart_threshold = 64u << 20;
    if (s->cfg.parallel <= 0) s->cfg.parallel = 4;
    if (s->cfg.parallel > 64) s->cfg.parallel = 64;
    if (s->cfg.timeout_s <= 0) s->cfg.timeout_s = 300;
    if (c->ca_file) {
        snprintf(s->ca_file, sizeof s->ca_file, "%s", c->ca_file);
        s->tls.ca_file = s->ca_file;
    }
    s->cfg.ca_file = NULL;
    s->seed = rl_http_jitter_seed();
    if ((rc = rl_http_new(&s->h, e))) goto fail;
    if (!s->creds && (rc = rl_s3_creds_from_env(s->cfg.region, &s->tls, c->allow_http, &s->creds, e))) goto fail;
    /* a session token (STS, or AWS_SESSION_TOKEN) rides in a header */
    rl_s3_creds now;
    if ((rc = rl_s3_creds_get(s->creds, &now, e))) goto fail;
    if (now.token[0] &&
        (rc = rl_http_cleartext_check(s->cfg.endpoint, c->allow_http, "the session token", RL_S3_HTTP_OPTIN, e))) {
        rl_err_wrap(e, "s3: endpoint");
        goto fail;
    }
    *out = s;
    return RL_OK;
fail:
    rl_s3_close(s);
    return rc;
}

void rl_s3_close(rl_s3 *s) {
    if (!s) return;
    rl_http_free(s->h);
    rl_s3_creds_free(s->creds);
    free(s);
}

/* The decoded path to sign and the URL to send, for bucket/key. Dotted
 * bucket names cannot be virtual hosts under TLS (the certificate is for
 * one label), so those go path-style, as the AWS SDKs do. */
int rl_s3_locate(const rl_s3 *s, const char *bucket, const char *key, const char *query, char *path, size_t pn,
                  char *url, size_t un, char *host, size_t hn, rl_err *e) {
    bool vh = s->virtual_host && bucket && *bucket && !strchr(bucket, '.');
    int w = vh ? snprintf(path, pn, "%s/%s", s->base, key ? key : "")
               : snprintf(path, pn, "%s/%s%s%s", s->base, bucket ? bucket : "", key ? "/" : "", key ? key : "");
    if (w < 0 || (size_t)w >= pn) return rl_errf(e, RL_EINPUT, "s3: key too long: %s", key ? key : "");
    snprintf(host, hn, "%s%s%s", vh ? bucket : "", vh ? "." : "", s->host);
    char enc[4096];
    int rc = rl_s3_uri_encode(path, true, enc, sizeof enc, e);
    if (rc) return rc;
    w = snprintf(url, un, "%s://%s%s%s%s", s->scheme, host, enc, query && *query ? "?" : "", query ? query : "");
    if (w < 0 || (size_t)w >= un) return rl_errf(e, RL_EINPUT, "s3: URL too long for %s", key ? key : "");
    return RL_OK;
}

/* Body source: bytes [off, off+len) of the parts. */
typedef struct body_src {
    const rl_s3_part *parts;
    int nparts;
    uint64_t pos, end; /* absolute offsets across the parts */
} body_src;

static size_t body_read(void *ud, char *buf, size_t n) {
    body_src *b = ud;
    size_t done = 0;
    uint64_t base = 0;
    for (int i = 0; i < b->nparts && done < n && b->pos < b->end; i++) {
        uint64_t plen = b->parts[i].len;
        if (b->pos >= base + plen) {
            base += plen;
            continue;
        }
        uint64_t in = b->pos - base, avail = plen - in, left = b->end - b->pos;
        size_t take = (size_t)(avail < left ? avail : left);
        if (take > n - done) take = n - done;
        memcpy(buf + done, (const char *)b->parts[i].data + in, take);
        done += take, b->pos += take;
        base += plen;
    }
    return done;
}

void rl_s3_hash_range(const rl_s3_part *parts, int nparts, uint64_t off, uint64_t len, char hex[65], char b64[45]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    uint64_t base = 0, end = off + len;
    for (int i = 0; i < nparts; i++) {
        uint64_t a = base, b = base + parts[i].len;
        base = b;
        if (b <= off || a >= end) continue;
        uint64_t s0 = off > a ? off : a, s1 = end < b ? end : b;
        EVP_DigestUpdate(ctx, (const char *)parts[i].data + (s0 - a), (size_t)(s1 - s0));
    }
    unsigned char md[32];
    unsigned int ml = 0;
    EVP_DigestFinal_ex(ctx, md, &ml);
    EVP_MD_CTX_free(ctx);
    rl_s3_hex(md, 32, hex);
    char *b = rl_base64_encode(md, 32);
    snprintf(b64, 45, "%s", b ? b : "");
    free(b);
}

/* Streams a GET body into a growing buffer. */
typedef struct sink {
    char *buf;
    size_t len, cap;
    bool oom;
} sink;

static int sink_data(void *ud, const char *d, size_t n) {
    sink *k = ud;
    if (k->len + n + 1 > k->cap) {
        size_t cap = k->cap ? k->cap : 65536;
        while (cap < k->len + n + 1) cap *= 2;
        char *b = realloc(k->buf, cap);
        if (!b) {
            k->oom = true;
            return 1;
        }
        k->buf = b, k->cap = cap;
    }
    memcpy(k->buf + k->len, d, n);
    k->len += n;
    k->buf[k->len] = '\0';
    return 0;
}

static int status_code(long status) { return status >= 500 || status == 429 ? RL_EIO : RL_EINPUT; }

int rl_s3_do(rl_s3 *s, rl_http *h, const rl_s3_call *c, rl_http_resp *resp, rl_err *e) {
    char path[4096], url[8192], host[512], what[1300];
    snprintf(what, sizeof what, "s3 %s %s%s%s", c->op ? c->op : c->method, c->bucket ? c->bucket : "",
             c->key ? "/" : "", c->key ? c->key : "");
    int rc = rl_s3_locate(s, c->bucket, c->key, c->query, path, sizeof path, url, sizeof url, host, sizeof host, e);
    if (rc) return rc;
    /* the body is hashed once; each attempt is signed again (a fresh date) */
    char sha[65], b64[45];
    if (c->payload_sha256) snprintf(sha, sizeof sha, "%s", c->payload_sha256), b64[0] = '\0';
    else rl_s3_hash_range(c->parts, c->nparts, c->off, c->len, sha, b64);
    rl_http_backoff bo = s->cfg.retry;
    int attempts = bo.attempts > 0 ? bo.attempts : 8;
    sink k = {0};
    for (int attempt = 0;; attempt++) {
        rl_s3_creds cr;
        if ((rc = rl_s3_creds_get(s->creds, &cr, e))) return rc;
        char date[17], h_host[600], h_date[64], h_sha[128], h_tok[4200], h_sum[128], auth[1024];
        rl_s3_amz_date(unix_now() + s->clock_skew_s, date);
        snprintf(h_host, sizeof h_host, "Host: %s", host);
        snprintf(h_date, sizeof h_date, "x-amz-date: %s", date);
        snprintf(h_sha, sizeof h_sha, "x-amz-content-sha256: %s", sha);
        const char *sign_h[24];
        int n = 0;
        sign_h[n++] = h_host, sign_h[n++] = h_date, sign_h[n++] = h_sha;
        if (cr.token[0]) {
            snprintf(h_tok, sizeof h_tok, "x-amz-security-token: %s", cr.token);
            sign_h[n++] = h_tok;
        }
        if (c->checksum && b64[0]) {
            snprintf(h_sum, sizeof h_sum, "x-amz-checksum-sha256: %s", b64);
            sign_h[n++] = h_sum;
        }
        for (int i = 0; c->headers && c->headers[i] && n < 20; i++) sign_h[n++] = c->headers[i];
        sign_h[n] = NULL;
        rl_s3_sign_in in = {.method = c->method, .path = path, .query = c->query, .headers = sign_h,
                            .payload_sha256 = sha, .amz_date = date, .region = s->cfg.region};
        rc = rl_s3_sign(&in, &cr, auth + 15, sizeof auth - 15, NULL, 0, NULL, 0, e);
        OPENSSL_cleanse(&cr, sizeof cr);
        if (rc) return rc;
        memcpy(auth, "Authorization: ", 15);
        const char *hdrs[28];
        int m = 0;
        for (int i = 0; i < n; i++) hdrs[m++] = sign_h[i];
        hdrs[m++] = auth;
        /* no 100-continue round trip: a refusal costs one body, and we retry anyway */
        hdrs[m++] = "Expect:";
        hdrs[m] = NULL;
        body_src src = {c->parts, c->nparts, c->off, c->off + c->len};
        free(k.buf);
        k = (sink){0};
        if (c->sink_len_hint) {
            k.cap = c->sink_len_hint + 1;
            k.buf = malloc(k.cap);
        }
        rl_http_req req = {.method = c->method, .url = url, .headers = hdrs, .tls = &s->tls,
                           .timeout_s = s->cfg.timeout_s, .max_body = 1u << 20, .abort_flag = s->abort_flag};
        if (c->parts) req.body_read = body_read, req.body_ud = &src, req.body_read_len = (long long)c->len;
        else if (c->body) req.body = c->body, req.body_len = c->body_len;
        if (c->collect) req.on_data = sink_data, req.data_ud = &k;
        rl_http_resp_free(resp);
        rl_err he = {0};
        rc = rl_http_do(h, &req, resp, &he);
        OPENSSL_cleanse(auth, sizeof auth);
        if (k.oom) {
            free(k.buf);
            return rl_errf(e, RL_ENOMEM, "%s: out of memory for the body", what);
        }
        char code[128] = "", msg[400] = "";
        bool err_in_200 = rc == RL_OK && resp->status == 200 && c->error_in_200 &&
                          rl_s3_parse_error(resp->body, resp->body_len, code, sizeof code, msg, sizeof msg);
        bool ok = rc == RL_OK && resp->status >= 200 && resp->status < 300 && !err_in_200;
        if (ok || (rc == RL_OK && c->ok_404 && resp->status == 404)) {
            if (c->collect) {
                /* hand the streamed body over as the response's */
                free(resp->body);
                resp->body = k.buf, resp->body_len = k.len;
                if (!resp->body) resp->body = calloc(1, 1);
            } else {
                free(k.buf);
            }
            return RL_OK;
        }
        bool retry = err_in_200 || rl_http_retryable(rc, resp->status);
        if (retry && attempt + 1 < attempts) {
            double ra = -1;
            const char *rav = rl_http_resp_header(resp, "retry-after");
            if (rav) rl_http_parse_retry_after(rav, unix_now(), &ra);
            double d = rl_http_backoff_delay(&bo, attempt, ra, &s->seed);
            rl_log(RL_LOG_WARN, "s3_retry", "\"op\":\"%s\",\"attempt\":%d,\"status\":%ld,\"delay_s\":%.2f",
                   c->op ? c->op : c->method, attempt + 1, resp->status, d);
            if (rl_http_sleep(d, s->abort_flag) != RL_OK) {
                free(k.buf);
                return rl_errf(e, RL_EABORT, "%s: aborted", what);
            }
            continue;
        }
        free(k.buf);
        if (rc != RL_OK) return rl_errf(e, rc, "%s: %s (after %d attempts)", what, he.msg, attempt + 1);
        if (!err_in_200) rl_s3_parse_error(resp->body, resp->body_len, code, sizeof code, msg, sizeof msg);
        if (!code[0] && resp->status == 404) snprintf(code, sizeof code, "NotFound");
        return rl_errf(e, err_in_200 ? RL_EIO : status_code(resp->status), "%s: %ld %s%s%s%s", what, resp->status,
                       code[0] ? code : "(no error document)", msg[0] ? ": " : "", msg,
                       retry ? " (retries exhausted)" : "");
    }
}

/* ---- objects ------------------------------------------------------------------------- */
int rl_s3_put(rl_s3 *s, const char *bucket, const char *key, const rl_s3_part *parts, int nparts, rl_err *e) {
    uint64_t total = 0;
    for (int i = 0; i < nparts; i++) total += parts[i].len;
    if (total >= s->cfg.multipart_threshold && total > s->cfg.part_size)
        return rl_s3_put_multipart(s, bucket, key, parts, nparts, total, e);
    rl_s3_call c = {.method = "PUT", .op = "PutObject", .bucket = bucket, .key = key, .parts = parts,
                    .nparts = nparts, .off = 0, .len = total, .checksum = true};
    static const rl_s3_part none = {"", 0};
    if (nparts == 0) c.parts = &none, c.nparts = 1;
    rl_http_resp r = {0};
    int rc = rl_s3_do(s, s->h, &c, &r, e);
    rl_http_resp_free(&r);
    return rc;
}

int rl_s3_get(rl_s3 *s, const char *bucket, const char *key, uint64_t off, uint64_t len, void **out, size_t *n,
              rl_err *e) {
    *out = NULL, *n = 0;
    char range[96];
    const char *hdrs[2] = {NULL, NULL};
    if (len == 0) { /* an empty range is not expressible in HTTP: ask only that the object exists */
        bool found;
        uint64_t size;
        int rc = rl_s3_head(s, bucket, key, &found, &size, e);
        if (rc) return rc;
        if (!found) return rl_errf(e, RL_EINPUT, "s3 GetObject %s/%s: 404 NoSuchKey", bucket, key);
        *out = calloc(1, 1);
        return *out ? RL_OK : rl_errf(e, RL_ENOMEM, "s3: out of memory");
    }
    if (off > 0 || len != UINT64_MAX) {
        if (len == UINT64_MAX) snprintf(range, sizeof range, "Range: bytes=%llu-", (unsigned long long)off);
        else snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
        hdrs[0] = range;
    }
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    rl_s3_call c = {.method = "GET", .op = "GetObject", .bucket = bucket, .key = key, .headers = hdrs,
                    .payload_sha256 = empty_sha, .collect = true,
                    .sink_len_hint = len != UINT64_MAX && len < (1u << 30) ? (size_t)len : 0};
    rl_http_resp r = {0};
    int rc = rl_s3_do(s, s->h, &c, &r, e);
    if (!rc) {
        /* a range past the end of a shorter object: S3 sends what there is */
        *out = r.body, *n = r.body_len;
        r.body = NULL;
    }
    rl_http_resp_free(&r);
    return rc;
}

int rl_s3_head(rl_s3 *s, const char *bucket, const char *key, bool *found, uint64_t *size, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    rl_s3_call c = {.method = "HEAD", .op = "HeadObject", .bucket = bucket, .key = key, .payload_sha256 = empty_sha,
                    .ok_404 = true};
    rl_http_resp r = {0};
    *found = false;
    if (size) *size = 0;
    int rc = rl_s3_do(s, s->h, &c, &r, e);
    if (!rc && r.status != 404) {
        *found = true;
        const char *cl = rl_http_resp_header(&r, "content-length");
        if (size && cl) *size = strtoull(cl, NULL, 10);
    }
    rl_http_resp_free(&r);
    return rc;
}

typedef struct rl_s3_entry {
    char *key;
    uint64_t size;
} rl_s3_entry;

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const rl_s3_entry *)a)->key, ((const rl_s3_entry *)b)->key);
}

int rl_s3_list_objects(rl_s3 *s, const char *bucket, const char *prefix, rl_s3_list *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    char token[2048] = "", etok[6200], epre[4096], query[12000];
    int rc = rl_s3_uri_encode(prefix ? prefix : "", false, epre, sizeof epre, e);
    for (int page = 0; !rc; page++) {
        int w = snprintf(query, sizeof query, "list-type=2&prefix=%s", epre);
        if (rl_s3_list_page_size > 0) w += snprintf(query + w, sizeof query - (size_t)w, "&max-keys=%d", rl_s3_list_page_size);
        if (token[0]) {
            if ((rc = rl_s3_uri_encode(token, false, etok, sizeof etok, e))) break;
            snprintf(query + w, sizeof query - (size_t)w, "&continuation-token=%s", etok);
        }
        rl_s3_call c = {.method = "GET", .op = "ListObjectsV2", .bucket = bucket, .query = query,
                        .payload_sha256 = empty_sha, .collect = true};
        rl_http_resp r = {0};
        if ((rc = rl_s3_do(s, s->h, &c, &r, e))) {
            rl_http_resp_free(&r);
            break;
        }
        bool truncated;
        char prev[2048];
        snprintf(prev, sizeof prev, "%s", token);
        rc = rl_s3_parse_list(r.body, r.body_len, out, &truncated, token, sizeof token, e);
        rl_http_resp_free(&r);
        if (rc || !truncated) break;
        if (!strcmp(prev, token)) rc = rl_errf(e, RL_EIO, "s3 ListObjectsV2 %s: the continuation token repeats", bucket);
    }
    if (rc) {
        rl_s3_list_free(out);
        return rc;
    }
    /* sorted by key (S3 lists in UTF-8 binary order already; another server might not), sizes alongside */
    rl_s3_entry *v = malloc((out->n ? out->n : 1) * sizeof *v);
    if (!v) {
        rl_s3_list_free(out);
        return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    }
    for (size_t i = 0; i < out->n; i++) v[i].key = out->keys[i], v[i].size = out->sizes[i];
    qsort(v, out->n, sizeof *v, cmp_entry);
    for (size_t i = 0; i < out->n; i++) out->keys[i] = v[i].key, out->sizes[i] = v[i].size;
    free(v);
    return RL_OK;
}

void rl_s3_list_free(rl_s3_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys), free(l->sizes);
    memset(l, 0, sizeof *l);
}

int rl_s3_abort_upload(rl_s3 *s, const char *bucket, const char *key, const char *upload_id, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    char eid[3200], q[3300];
    int rc = rl_s3_uri_encode(upload_id, false, eid, sizeof eid, e);
    if (rc) return rc;
    snprintf(q, sizeof q, "uploadId=%s", eid);
    rl_s3_call c = {.method = "DELETE", .op = "AbortMultipartUpload", .bucket = bucket, .key = key, .query = q,
                    .payload_sha256 = empty_sha, .ok_404 = true};
    rl_http_resp r = {0};
    rc = rl_s3_do(s, s->h, &c, &r, e);
    rl_http_resp_free(&r);
    return rc;
}

void rl_s3_uploads_free(rl_s3_uploads *u) {
    for (size_t i = 0; i < u->n; i++) free(u->keys[i]), free(u->ids[i]);
    free(u->keys), free(u->ids);
    memset(u, 0, sizeof *u);
}

int rl_s3_list_uploads(rl_s3 *s, const char *bucket, const char *prefix, rl_s3_uploads *out, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    memset(out, 0, sizeof *out);
    char key[1100] = "", id[1100] = "", ek[3400], ei[3400], epre[4096], query[12000];
    int rc = rl_s3_uri_encode(prefix ? prefix : "", false, epre, sizeof epre, e);
    for (int page = 0; !rc; page++) {
        int w = snprintf(query, sizeof query, "uploads&prefix=%s", epre);
        if (key[0]) {
            if ((rc = rl_s3_uri_encode(key, false, ek, sizeof ek, e)) || (rc = rl_s3_uri_encode(id, false, ei, sizeof ei, e)))
                break;
            snprintf(query + w, sizeof query - (size_t)w, "&key-marker=%s&upload-id-marker=%s", ek, ei);
        }
        rl_s3_call c = {.method = "GET", .op = "ListMultipartUploads", .bucket = bucket, .query = query,
                        .payload_sha256 = empty_sha, .collect = true};
        rl_http_resp r = {0};
        if ((rc = rl_s3_do(s, s->h, &c, &r, e))) {
            rl_http_resp_free(&r);
            break;
        }
        bool truncated;
        char pk[1100], pi[1100];
        snprintf(pk, sizeof pk, "%s", key), snprintf(pi, sizeof pi, "%s", id);
        rc = rl_s3_parse_uploads(r.body, r.body_len, out, &truncated, key, sizeof key, id, sizeof id, e);
        rl_http_resp_free(&r);
        if (rc || !truncated) break;
        if (!strcmp(pk, key) && !strcmp(pi, id))
            rc = rl_errf(e, RL_EIO, "s3 ListMultipartUploads %s: the markers repeat", bucket);
    }
    if (rc) rl_s3_uploads_free(out);
    return rc;
}

int rl_s3_delete(rl_s3 *s, const char *bucket, const char *key, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    rl_s3_call c = {.method = "DELETE", .op = "DeleteObject", .bucket = bucket, .key = key,
                    .payload_sha256 = empty_sha, .ok_404 = true};
    rl_http_resp r = {0};
    int rc = rl_s3_do(s, s->h, &c, &r, e);
    rl_http_resp_free(&r);
    return rc;
}

int rl_s3_create_bucket(rl_s3 *s, const char *bucket, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    rl_s3_call c = {.method = "PUT", .op = "CreateBucket", .bucket = bucket, .payload_sha256 = empty_sha};
    rl_http_resp r = {0};
    int rc = rl_s3_do(s, s->h, &c, &r, e);
    rl_http_resp_free(&r);
    return rc;
}
