/* The s3:// checkpoint store: the rl_ckpt_store_ops over pkg/s3.
 *
 * Keys live under the URI's prefix ("s3://b/runs/a" + "latest" ->
 * object "runs/a/latest"). The object model is S3's own, so the mapping
 * is direct: a put is one PutObject or one multipart upload (atomic on
 * completion, aborted on failure), get is a ranged GetObject, list is
 * ListObjectsV2 over every page, exists is HeadObject. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "s3/s3.h"

typedef struct s3_ctx {
    rl_s3 *s3;
    char bucket[64];
    char prefix[RL_CKPT_URI_MAX]; /* "" or "runs/a/" (with the slash) */
} s3_ctx;

static int full_key(const s3_ctx *c, const char *key, char *out, size_t n, rl_err *e) {
    if ((size_t)snprintf(out, n, "%s%s", c->prefix, key) >= n)
        return rl_errf(e, RL_EINPUT, "checkpoint store: key too long: %s", key);
    return RL_OK;
}

static int s3_put(void *ctx, const char *key, const rl_ckpt_part *parts, int nparts, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    int rc = full_key(c, key, k, sizeof k, e);
    if (rc) return rc;
    /* rl_ckpt_part and rl_s3_part are the same shape; convert anyway
     * rather than cast across packages */
    rl_s3_part *sp = calloc((size_t)(nparts > 0 ? nparts : 1), sizeof *sp);
    if (!sp) return rl_errf(e, RL_ENOMEM, "checkpoint store: out of memory");
    for (int i = 0; i < nparts; i++) sp[i].data = parts[i].data, sp[i].len = parts[i].len;
    rc = rl_s3_put(c->s3, c->bucket, k, sp, nparts, e);
    free(sp);
    return rc;
}

static int s3_get(void *ctx, const char *key, uint64_t off, uint64_t len, void **out, size_t *n, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    int rc = full_key(c, key, k, sizeof k, e);
    return rc ? rc : rl_s3_get(c->s3, c->bucket, k, off, len, out, n, e);
}

static int s3_list(void *ctx, const char *prefix, rl_ckpt_list *out, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    int rc = full_key(c, prefix, k, sizeof k, e);
    if (rc) return rc;
    rl_s3_list l = {0};
    memset(out, 0, sizeof *out);
    if ((rc = rl_s3_list_objects(c->s3, c->bucket, k, &l, e))) return rc;
    out->keys = calloc(l.n ? l.n : 1, sizeof *out->keys);
    if (!out->keys) {
        rl_s3_list_free(&l);
        return rl_errf(e, RL_ENOMEM, "checkpoint store: out of memory");
    }
    size_t pl = strlen(c->prefix);
    for (size_t i = 0; i < l.n; i++) {
        /* the listing is sorted by full key, so it stays sorted without the prefix */
        if (strncmp(l.keys[i], c->prefix, pl) != 0) continue;
        if (!(out->keys[out->n] = strdup(l.keys[i] + pl))) {
            rl_s3_list_free(&l);
            rl_ckpt_list_free(out);
            return rl_errf(e, RL_ENOMEM, "checkpoint store: out of memory");
        }
        out->n++;
    }
    rl_s3_list_free(&l);
    return RL_OK;
}

static int s3_del(void *ctx, const char *key, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    int rc = full_key(c, key, k, sizeof k, e);
    return rc ? rc : rl_s3_delete(c->s3, c->bucket, k, e);
}

static int s3_exists(void *ctx, const char *key, bool *found, uint64_t *size, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    int rc = full_key(c, key, k, sizeof k, e);
    return rc ? rc : rl_s3_head(c->s3, c->bucket, k, found, size, e);
}

/* Every upload begun under prefix and never finished: a writer killed mid-object. */
static int s3_abort_uploads(void *ctx, const char *prefix, rl_err *e) {
    s3_ctx *c = ctx;
    char k[RL_CKPT_URI_MAX + 256];
    rl_s3_uploads u;
    int rc = full_key(c, prefix, k, sizeof k, e);
    if (rc || (rc = rl_s3_list_uploads(c->s3, c->bucket, k, &u, e))) return rc;
    for (size_t i = 0; i < u.n && !rc; i++) {
        rl_log(RL_LOG_INFO, "checkpoint_abort_upload", "\"key\":\"%.300s\"", u.keys[i]);
        rc = rl_s3_abort_upload(c->s3, c->bucket, u.keys[i], u.ids[i], e);
    }
    rl_s3_uploads_free(&u);
    return rc;
}

static void s3_close(void *ctx) {
    s3_ctx *c = ctx;
    if (!c) return;
    if (c->s3) rl_s3_close(c->s3);
    free(c);
}

static const rl_ckpt_store_ops s3_ops = {s3_put, s3_get, s3_list, s3_del, s3_exists, s3_close, s3_abort_uploads};

int rl_ckpt_store_open_s3(const rl_ckpt_config *cfg, const rl_ckpt_uri *u, bool readonly, rl_ckpt_store **out,
                          rl_err *e) {
    *out = NULL;
    s3_ctx *c = calloc(1, sizeof *c);
    rl_ckpt_store *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c), free(s);
        return rl_errf(e, RL_ENOMEM, "checkpoint store: out of memory");
    }
    snprintf(c->bucket, sizeof c->bucket, "%s", u->bucket);
    snprintf(c->prefix, sizeof c->prefix, "%s", u->prefix);
    int rc = RL_OK;
    rl_s3_config sc = {0};
    snprintf(sc.endpoint, sizeof sc.endpoint, "%s", cfg->s3.endpoint);
    snprintf(sc.region, sizeof sc.region, "%s", cfg->s3.region);
    snprintf(sc.addressing, sizeof sc.addressing, "%s", cfg->s3.addressing);
    sc.part_size = (size_t)cfg->s3.part_mb << 20;
    /* a part size set in the job means: anything bigger goes in parts */
    sc.multipart_threshold = sc.part_size;
    sc.parallel = (int)cfg->s3.parallel;
    sc.allow_http = cfg->s3.allow_http;
    if (!rc) rc = rl_s3_open(&sc, &c->s3, e);
    snprintf(s->uri, sizeof s->uri, "s3://%s/%.*s", c->bucket, (int)(strlen(c->prefix) ? strlen(c->prefix) - 1 : 0),
             c->prefix);
    s->ops = &s3_ops, s->ctx = c;
    /* Probe: a wrong bucket, credential, endpoint or clock, or a store that
     * refuses writes, must stop the job now rather than at the first save
     * hours later. Deletes are probed too: keep-K pruning needs them, and a
     * store that only grows fills up mid-run. The probe object is the
     * store's own, named per process. */
    char probe[64];
    snprintf(probe, sizeof probe, ".rl-probe.%ld", (long)getpid());
    const char *why = "";
    if (!rc && !readonly) {
        if ((rc = s3_put(c, probe, &(rl_ckpt_part){"probe", 5}, 1, e))) why = "cannot write there: ";
        else if ((rc = s3_del(c, probe, e)))
            why = "writes work but deletes are refused (old checkpoints could never be pruned; the probe "
                  "object is left behind): ";
    }
    if (rc) {
        rl_err pe = *e;
        rl_errf(e, rc, "checkpoint.uri %s: %s%s", s->uri, why, pe.msg);
        rl_ckpt_store_close(s);
        return rc;
    }
    *out = s;
    return RL_OK;
}
