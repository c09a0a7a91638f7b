/* The S3 and STS XML answers we read, with expat. Documents come from the
 * network, so: a size cap, a depth cap, a cap on each text value, no DTDs
 * (a DOCTYPE or an entity declaration stops the parse -- no entity
 * expansion), and namespaces ignored (S3 uses one default namespace). A
 * parser watches for a few element paths and copies their text out. */
#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_internal.h"

#define MAX_DOC (16u << 20)
#define MAX_DEPTH 16
#define MAX_TEXT 4096

typedef struct xp {
    XML_Parser p;
    char path[MAX_DEPTH][64]; /* element names from the root */
    int depth;
    char text[MAX_TEXT + 1];
    size_t tlen;
    bool overflow, bad;
    void (*on_end)(struct xp *x, void *ud); /* an element closed: x->text holds its text */
    void *ud;
} xp;

/* truncating copy (callers check lengths where truncation matters) */
static void copy(char *dst, size_t n, const char *src) {
    size_t l = strlen(src);
    if (l >= n) l = n - 1;
    memcpy(dst, src, l);
    dst[l] = '\0';
}

static const char *local(const char *name) {
    const char *c = strrchr(name, ':');
    return c ? c + 1 : name;
}

static void XMLCALL start(void *ud, const XML_Char *name, const XML_Char **attrs) {
    (void)attrs;
    xp *x = ud;
    if (x->depth >= MAX_DEPTH) {
        x->bad = true;
        XML_StopParser(x->p, XML_FALSE);
        return;
    }
    snprintf(x->path[x->depth++], sizeof x->path[0], "%s", local(name));
    x->tlen = 0, x->text[0] = '\0';
}

static void XMLCALL end(void *ud, const XML_Char *name) {
    (void)name;
    xp *x = ud;
    if (x->on_end) x->on_end(x, x->ud);
    if (x->depth > 0) x->depth--;
    x->tlen = 0, x->text[0] = '\0';
}

static void XMLCALL chars(void *ud, const XML_Char *s, int len) {
    xp *x = ud;
    if (len < 0) return;
    if (x->tlen + (size_t)len > MAX_TEXT) {
        x->overflow = true;
        len = (int)(MAX_TEXT - x->tlen);
    }
    memcpy(x->text + x->tlen, s, (size_t)len);
    x->tlen += (size_t)len;
    x->text[x->tlen] = '\0';
}

static void XMLCALL doctype(void *ud, const XML_Char *name, const XML_Char *sys, const XML_Char *pub, int internal) {
    (void)name, (void)sys, (void)pub, (void)internal;
    xp *x = ud;
    x->bad = true;
    XML_StopParser(x->p, XML_FALSE);
}

static void XMLCALL entity(void *ud, const XML_Char *n, int pe, const XML_Char *v, int vl, const XML_Char *b,
                           const XML_Char *s, const XML_Char *pub, const XML_Char *nn) {
    (void)n, (void)pe, (void)v, (void)vl, (void)b, (void)s, (void)pub, (void)nn;
    xp *x = ud;
    x->bad = true;
    XML_StopParser(x->p, XML_FALSE);
}

/* Is the current element at path a/b/c (names, from the root)? */
static bool at(const xp *x, const char *const *names, int n) {
    if (x->depth != n) return false;
    for (int i = 0; i < n; i++)
        if (strcmp(x->path[i], names[i]) != 0) return false;
    return true;
}

static int parse(const char *body, size_t len, void (*on_end)(xp *, void *), void *ud, const char *what,
                 rl_err *e) {
    if (len > MAX_DOC) return rl_errf(e, RL_EIO, "s3: %s: response larger than %u bytes", what, MAX_DOC);
    xp *x = calloc(1, sizeof *x);
    if (!x) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    x->p = XML_ParserCreate(NULL);
    if (!x->p) {
        free(x);
        return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    }
    x->on_end = on_end, x->ud = ud;
    XML_SetUserData(x->p, x);
    XML_SetElementHandler(x->p, start, end);
    XML_SetCharacterDataHandler(x->p, chars);
    XML_SetStartDoctypeDeclHandler(x->p, doctype);
    XML_SetEntityDeclHandler(x->p, entity);
    int ok = XML_Parse(x->p, body ? body : "", (int)len, XML_TRUE) == XML_STATUS_OK;
    int rc = RL_OK;
    if (x->bad) rc = rl_errf(e, RL_EIO, "s3: %s: response uses a DTD or nests too deeply", what);
    else if (!ok)
        rc = rl_errf(e, RL_EIO, "s3: %s: malformed XML response (line %lu: %s)", what,
                     (unsigned long)XML_GetCurrentLineNumber(x->p), XML_ErrorString(XML_GetErrorCode(x->p)));
    else if (x->overflow) rc = rl_errf(e, RL_EIO, "s3: %s: a value in the response is over %d bytes", what, MAX_TEXT);
    XML_ParserFree(x->p);
    free(x);
    return rc;
}

/* ---- <Error> -------------------------------------------------------------------------- */
typedef struct err_ud {
    char *code, *msg;
    size_t cn, mn;
    bool is_error;
} err_ud;

static void err_end(xp *x, void *ud) {
    err_ud *u = ud;
    static const char *const c[] = {"Error", "Code"}, *const m[] = {"Error", "Message"}, *const r[] = {"Error"};
    if (at(x, r, 1)) u->is_error = true;
    if (at(x, c, 2) && u->cn) copy(u->code, u->cn, x->text);
    if (at(x, m, 2) && u->mn) copy(u->msg, u->mn, x->text);
}

bool rl_s3_parse_error(const char *body, size_t len, char *code, size_t cn, char *msg, size_t mn) {
    if (cn) code[0] = '\0';
    if (mn) msg[0] = '\0';
    if (!body || len == 0 || !memmem(body, len, "<Error", 6)) return false;
    err_ud u = {code, msg, cn, mn, false};
    rl_err e = {0};
    if (parse(body, len, err_end, &u, "error document", &e) != RL_OK) return false;
    return u.is_error;
}

/* ---- ListObjectsV2 -------------------------------------------------------------------- */
typedef struct list_ud {
    rl_s3_list *out;
    bool *truncated;
    char *token;
    size_t tn;
    char key[1100];
    long long size;
    bool have_key, oom, bad_size, root;
} list_ud;

static void list_end(xp *x, void *ud) {
    list_ud *u = ud;
    static const char *const key[] = {"ListBucketResult", "Contents", "Key"},
                             *const size[] = {"ListBucketResult", "Contents", "Size"},
                             *const item[] = {"ListBucketResult", "Contents"},
                             *const tr[] = {"ListBucketResult", "IsTruncated"},
                             *const nt[] = {"ListBucketResult", "NextContinuationToken"},
                             *const root[] = {"ListBucketResult"};
    if (at(x, root, 1)) u->root = true;
    if (at(x, key, 3)) {
        copy(u->key, sizeof u->key, x->text);
        u->have_key = x->tlen > 0 && x->tlen < sizeof u->key;
    }
    if (at(x, size, 3)) {
        char *end;
        u->size = strtoll(x->text, &end, 10);
        if (x->tlen == 0 || *end || u->size < 0) u->bad_size = true;
    }
    if (at(x, tr, 2)) *u->truncated = strcmp(x->text, "true") == 0;
    if (at(x, nt, 2) && u->tn) copy(u->token, u->tn, x->text);
    if (at(x, item, 2)) {
        if (!u->have_key) {
            u->bad_size = true;
            return;
        }
        rl_s3_list *l = u->out;
        char **k = realloc(l->keys, (l->n + 1) * sizeof *k);
        if (k) l->keys = k;
        uint64_t *s = realloc(l->sizes, (l->n + 1) * sizeof *s);
        if (s) l->sizes = s;
        char *dup = strdup(u->key);
        if (!k || !s || !dup) {
            free(dup);
            u->oom = true;
            return;
        }
        l->keys[l->n] = dup, l->sizes[l->n] = (uint64_t)(u->size < 0 ? 0 : u->size), l->n++;
        u->have_key = false, u->size = 0;
    }
}

int rl_s3_parse_list(const char *body, size_t len, rl_s3_list *out, bool *truncated, char *next_token, size_t tn,
                     rl_err *e) {
    *truncated = false;
    if (tn) next_token[0] = '\0';
    list_ud u = {.out = out, .truncated = truncated, .token = next_token, .tn = tn};
    int rc = parse(body, len, list_end, &u, "ListObjectsV2", e);
    if (rc) return rc;
    if (u.oom) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    if (!u.root) return rl_errf(e, RL_EIO, "s3: ListObjectsV2: the response is not a ListBucketResult");
    if (u.bad_size) return rl_errf(e, RL_EIO, "s3: ListObjectsV2: an entry without a key or with a bad size");
    if (*truncated && (!tn || !next_token[0]))
        return rl_errf(e, RL_EIO, "s3: ListObjectsV2: truncated listing without a continuation token");
    return RL_OK;
}

/* ---- ListMultipartUploadsResult ------------------------------------------------------- */
typedef struct uploads_ud {
    rl_s3_uploads *out;
    bool *truncated;
    char *nkey, *nid;
    size_t kn, idn;
    char key[1100], id[1100];
    bool have_key, have_id, oom, bad, root;
} uploads_ud;

static void uploads_end(xp *x, void *ud) {
    uploads_ud *u = ud;
    static const char *const key[] = {"ListMultipartUploadsResult", "Upload", "Key"},
                             *const id[] = {"ListMultipartUploadsResult", "Upload", "UploadId"},
                             *const item[] = {"ListMultipartUploadsResult", "Upload"},
                             *const tr[] = {"ListMultipartUploadsResult", "IsTruncated"},
                             *const nk[] = {"ListMultipartUploadsResult", "NextKeyMarker"},
                             *const ni[] = {"ListMultipartUploadsResult", "NextUploadIdMarker"},
                             *const root[] = {"ListMultipartUploadsResult"};
    if (at(x, root, 1)) u->root = true;
    if (at(x, key, 3)) copy(u->key, sizeof u->key, x->text), u->have_key = x->tlen > 0 && x->tlen < sizeof u->key;
    if (at(x, id, 3)) copy(u->id, sizeof u->id, x->text), u->have_id = x->tlen > 0 && x->tlen < sizeof u->id;
    if (at(x, tr, 2)) *u->truncated = strcmp(x->text, "true") == 0;
    if (at(x, nk, 2) && u->kn) copy(u->nkey, u->kn, x->text);
    if (at(x, ni, 2) && u->idn) copy(u->nid, u->idn, x->text);
    if (!at(x, item, 2)) return;
    if (!u->have_key || !u->have_id) {
        u->bad = true;
        return;
    }
    rl_s3_uploads *l = u->out;
    char **k = realloc(l->keys, (l->n + 1) * sizeof *k);
    if (k) l->keys = k;
    char **i = realloc(l->ids, (l->n + 1) * sizeof *i);
    if (i) l->ids = i;
    char *dk = strdup(u->key), *di = strdup(u->id);
    if (!k || !i || !dk || !di) {
        free(dk), free(di);
        u->oom = true;
        return;
    }
    l->keys[l->n] = dk, l->ids[l->n] = di, l->n++;
    u->have_key = u->have_id = false;
}

int rl_s3_parse_uploads(const char *body, size_t len, rl_s3_uploads *out, bool *truncated, char *next_key,
                        size_t kn, char *next_id, size_t idn, rl_err *e) {
    *truncated = false;
    if (kn) next_key[0] = '\0';
    if (idn) next_id[0] = '\0';
    uploads_ud u = {.out = out, .truncated = truncated, .nkey = next_key, .nid = next_id, .kn = kn, .idn = idn};
    int rc = parse(body, len, uploads_end, &u, "ListMultipartUploads", e);
    if (rc) return rc;
    if (u.oom) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    if (!u.root) return rl_errf(e, RL_EIO, "s3: ListMultipartUploads: the response is not a ListMultipartUploadsResult");
    if (u.bad) return rl_errf(e, RL_EIO, "s3: ListMultipartUploads: an upload without a key or an upload id");
    if (*truncated && (!kn || !next_key[0]))
        return rl_errf(e, RL_EIO, "s3: ListMultipartUploads: truncated listing without a next key marker");
    return RL_OK;
}

/* ---- InitiateMultipartUploadResult ---------------------------------------------------- */
typedef struct up_ud {
    char *id;
    size_t n;
    bool found;
} up_ud;

static void up_end(xp *x, void *ud) {
    up_ud *u = ud;
    static const char *const p[] = {"InitiateMultipartUploadResult", "UploadId"};
    if (at(x, p, 2) && x->tlen > 0 && x->tlen < u->n) {
        copy(u->id, u->n, x->text);
        u->found = true;
    }
}

int rl_s3_parse_upload_id(const char *body, size_t len, char *upload_id, size_t n, rl_err *e) {
    up_ud u = {upload_id, n, false};
    if (n) upload_id[0] = '\0';
    int rc = parse(body, len, up_end, &u, "CreateMultipartUpload", e);
    if (rc) return rc;
    if (!u.found) return rl_errf(e, RL_EIO, "s3: CreateMultipartUpload: no UploadId in the response");
    return RL_OK;
}

/* ---- AssumeRoleWithWebIdentityResponse ------------------------------------------------ */
typedef struct sts_ud {
    rl_s3_creds *c;
    int have;
    bool bad;
} sts_ud;

static void sts_end(xp *x, void *ud) {
    sts_ud *u = ud;
    if (x->depth != 4 || strcmp(x->path[0], "AssumeRoleWithWebIdentityResponse") != 0 ||
        strcmp(x->path[1], "AssumeRoleWithWebIdentityResult") != 0 || strcmp(x->path[2], "Credentials") != 0)
        return;
    const char *n = x->path[3];
    rl_s3_creds *c = u->c;
    if (!strcmp(n, "AccessKeyId")) {
        if (x->tlen == 0 || x->tlen >= sizeof c->access_key) u->bad = true;
        copy(c->access_key, sizeof c->access_key, x->text), u->have |= 1;
    } else if (!strcmp(n, "SecretAccessKey")) {
        if (x->tlen == 0 || x->tlen >= sizeof c->secret_key) u->bad = true;
        copy(c->secret_key, sizeof c->secret_key, x->text), u->have |= 2;
    } else if (!strcmp(n, "SessionToken")) {
        if (x->tlen >= sizeof c->token) u->bad = true;
        copy(c->token, sizeof c->token, x->text), u->have |= 4;
    } else if (!strcmp(n, "Expiration")) {
        c->expires_unix = rl_s3_parse_iso8601(x->text);
        if (c->expires_unix < 0) u->bad = true;
        u->have |= 8;
    }
}

int rl_s3_parse_sts(const char *body, size_t len, rl_s3_creds *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    sts_ud u = {out, 0, false};
    int rc = parse(body, len, sts_end, &u, "AssumeRoleWithWebIdentity", e);
    if (!rc && (u.bad || u.have != 15))
        rc = rl_errf(e, RL_EIO, "s3: AssumeRoleWithWebIdentity: the response lacks or mangles the credentials");
    if (rc) memset(out, 0, sizeof *out); /* never half a credential */
    return rc;
}
