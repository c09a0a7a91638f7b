/* AWS Signature Version 4, computed here with OpenSSL.
 *
 * The canonical request is rebuilt from what will be sent: the path is
 * URI-encoded once (S3 does not double-encode), the query is decoded and
 * re-encoded so that "a b", "a%20b" and "a+b"-as-%2B all canonicalise the
 * way the server will, parameters are sorted by name then value, a
 * valueless parameter ("uploads") signs as "uploads=", and header values
 * are trimmed with inner runs of spaces collapsed. */
#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_internal.h"

void rl_s3_hex(const unsigned char *b, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = hx[b[i] >> 4], out[2 * i + 1] = hx[b[i] & 15];
    out[2 * n] = '\0';
}

void rl_s3_sha256_hex(const void *data, size_t len, char out[65]) {
    unsigned char md[32];
    unsigned int ml = 0;
    EVP_Digest(data, len, md, &ml, EVP_sha256(), NULL);
    rl_s3_hex(md, 32, out);
}

static void hmac(const void *key, size_t kl, const char *msg, unsigned char out[32]) {
    unsigned int ol = 32;
    HMAC(EVP_sha256(), key, (int)kl, (const unsigned char *)msg, strlen(msg), out, &ol);
}

static bool unreserved(unsigned char c) {
    return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

/* Encode len bytes of src, appending to out at *pos. */
static int enc(const char *src, size_t len, bool keep_slash, char *out, size_t n, size_t *pos) {
    static const char hx[] = "0123456789ABCDEF";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            if (*pos + 1 >= n) return -1;
            out[(*pos)++] = (char)c;
        } else {
            if (*pos + 3 >= n) return -1;
            out[(*pos)++] = '%', out[(*pos)++] = hx[c >> 4], out[(*pos)++] = hx[c & 15];
        }
    }
    out[*pos] = '\0';
    return 0;
}

int rl_s3_uri_encode(const char *src, bool keep_slash, char *out, size_t n, rl_err *e) {
    size_t pos = 0;
    if (n == 0 || enc(src, strlen(src), keep_slash, out, n, &pos) != 0)
        return rl_errf(e, RL_EINPUT, "s3: a name is too long to encode (%zu bytes)", strlen(src));
    return RL_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* %XX-decode [s, s+len) into a fresh string ('+' stays '+': we never send
 * form encoding, so a '+' in our queries is a literal plus). */
static char *decode(const char *s, size_t len) {
    char *o = malloc(len + 1);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%' && i + 2 < len && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            o[j++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        } else {
            o[j++] = s[i];
        }
    }
    o[j] = '\0';
    return o;
}

typedef struct kv {
    char *k, *v; /* encoded */
} kv;

static int cmp_kv(const void *a, const void *b) {
    const kv *x = a, *y = b;
    int c = strcmp(x->k, y->k);
    return c ? c : strcmp(x->v, y->v);
}

static int canonical_query(const char *q, char *out, size_t n, rl_err *e) {
    out[0] = '\0';
    if (!q || !*q) return RL_OK;
    size_t cnt = 1;
    for (const char *p = q; *p; p++) cnt += *p == '&';
    kv *v = calloc(cnt, sizeof *v);
    if (!v) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    size_t m = 0;
    int rc = RL_OK;
    for (const char *p = q; *p && rc == RL_OK;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > 0) {
            const char *eq = memchr(p, '=', len);
            size_t kl = eq ? (size_t)(eq - p) : len;
            char *k = decode(p, kl), *val = eq ? decode(eq + 1, len - kl - 1) : strdup("");
            size_t ks = k ? 3 * strlen(k) + 1 : 1, vs = val ? 3 * strlen(val) + 1 : 1;
            v[m].k = malloc(ks), v[m].v = malloc(vs);
            size_t a = 0, b = 0;
            if (!k || !val || !v[m].k || !v[m].v || enc(k, strlen(k), false, v[m].k, ks, &a) ||
                enc(val, strlen(val), false, v[m].v, vs, &b))
                rc = rl_errf(e, RL_ENOMEM, "s3: out of memory");
            free(k), free(val);
            m++;
        }
        p += len + (amp ? 1 : 0);
    }
    if (rc == RL_OK) {
        qsort(v, m, sizeof *v, cmp_kv);
        size_t pos = 0;
        for (size_t i = 0; i < m && rc == RL_OK; i++) {
            int w = snprintf(out + pos, n - pos, "%s%s=%s", i ? "&" : "", v[i].k, v[i].v);
            if (w < 0 || (size_t)w >= n - pos) rc = rl_errf(e, RL_EINPUT, "s3: query too long to sign");
            else pos += (size_t)w;
        }
    }
    for (size_t i = 0; i < m; i++) free(v[i].k), free(v[i].v);
    free(v);
    return rc;
}

typedef struct hdr {
    char name[128];
    char value[2048];
} hdr;

static int cmp_hdr(const void *a, const void *b) { return strcmp(((const hdr *)a)->name, ((const hdr *)b)->name); }

/* lowercased name; value trimmed, inner whitespace runs collapsed to one space */
static int parse_header(const char *line, hdr *h) {
    const char *colon = strchr(line, ':');
    if (!colon || colon == line || (size_t)(colon - line) >= sizeof h->name) return -1;
    size_t nl = (size_t)(colon - line);
    for (size_t i = 0; i < nl; i++) h->name[i] = (char)tolower((unsigned char)line[i]);
    h->name[nl] = '\0';
    size_t j = 0;
    bool space = false;
    for (const char *p = colon + 1; *p; p++) {
        if (isspace((unsigned char)*p)) {
            space = j > 0;
            continue;
        }
        if (space) {
            if (j + 1 >= sizeof h->value) return -1;
            h->value[j++] = ' ';
            space = false;
        }
        if (j + 1 >= sizeof h->value) return -1;
        h->value[j++] = *p;
    }
    h->value[j] = '\0';
    return 0;
}

int rl_s3_sign(const rl_s3_sign_in *in, const rl_s3_creds *c, char *authorization, size_t n,
               char *canonical, size_t cn, char *to_sign, size_t tn, rl_err *e) {
    enum { MAXH = 64 };
    hdr *h = calloc(MAXH, sizeof *h);
    char *path = malloc(8192), *query = malloc(16384), *creq = malloc(65536);
    int rc = RL_OK;
    if (!h || !path || !query || !creq) {
        rc = rl_errf(e, RL_ENOMEM, "s3: out of memory");
        goto out;
    }
    if (strlen(in->amz_date) != 16) {
        rc = rl_errf(e, RL_EINPUT, "s3: x-amz-date must look like 20130524T000000Z");
        goto out;
    }
    const char *p = in->path && *in->path ? in->path : "/";
    if ((rc = rl_s3_uri_encode(p, true, path, 8192, e)) || (rc = canonical_query(in->query, query, 16384, e)))
        goto out;
    int nh = 0;
    for (int i = 0; in->headers && in->headers[i]; i++) {
        if (nh == MAXH || parse_header(in->headers[i], &h[nh]) != 0) {
            rc = rl_errf(e, RL_EINPUT, "s3: a header to sign is malformed or too long (or too many)");
            goto out;
        }
        nh++;
    }
    qsort(h, (size_t)nh, sizeof *h, cmp_hdr);
    /* merge repeated names: values joined with ',' in the order given
     * (qsort is not stable, but we never send a header twice) */
    char chead[8192] = "", signed_h[1024] = "";
    size_t cp = 0, sp = 0;
    for (int i = 0; i < nh; i++) {
        bool same = i > 0 && strcmp(h[i].name, h[i - 1].name) == 0;
        int w = same ? snprintf(chead + cp - 1, sizeof chead - cp + 1, ",%s\n", h[i].value) - 1
                     : snprintf(chead + cp, sizeof chead - cp, "%s:%s\n", h[i].name, h[i].value);
        if (w < 0 || (size_t)w >= sizeof chead - cp) goto toolong;
        cp += (size_t)w;
        if (!same) {
            w = snprintf(signed_h + sp, sizeof signed_h - sp, "%s%s", sp ? ";" : "", h[i].name);
            if (w < 0 || (size_t)w >= sizeof signed_h - sp) goto toolong;
            sp += (size_t)w;
        }
    }
    int w = snprintf(creq, 65536, "%s\n%s\n%s\n%s\n%s\n%s", in->method, path, query, chead, signed_h,
                     in->payload_sha256);
    if (w < 0 || w >= 65536) goto toolong;
    char date[9], scope[200], chash[65], sts[400];
    memcpy(date, in->amz_date, 8), date[8] = '\0';
    const char *svc = in->service ? in->service : "s3";
    snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, in->region, svc);
    rl_s3_sha256_hex(creq, strlen(creq), chash);
    snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", in->amz_date, scope, chash);
    /* the signing key: secret -> date -> region -> service -> aws4_request */
    char k0[200];
    unsigned char k[32], sig[32];
    snprintf(k0, sizeof k0, "AWS4%s", c->secret_key);
    hmac(k0, strlen(k0), date, k);
    hmac(k, 32, in->region, k);
    hmac(k, 32, svc, k);
    hmac(k, 32, "aws4_request", k);
    hmac(k, 32, sts, sig);
    OPENSSL_cleanse(k0, sizeof k0), OPENSSL_cleanse(k, sizeof k);
    char sighex[65];
    rl_s3_hex(sig, 32, sighex);
    w = snprintf(authorization, n, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                 c->access_key, scope, signed_h, sighex);
    if (w < 0 || (size_t)w >= n) goto toolong;
    if (canonical && cn) snprintf(canonical, cn, "%s", creq);
    if (to_sign && tn) snprintf(to_sign, tn, "%s", sts);
    goto out;
toolong:
    rc = rl_errf(e, RL_EINPUT, "s3: request too large to sign");
out:
    free(h), free(path), free(query), free(creq);
    return rc;
}
