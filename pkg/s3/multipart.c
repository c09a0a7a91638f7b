/* Multipart upload: create, parts from `parallel` worker threads (each
 * with its own curl handle and connection), complete -- or abort on any
 * failure, so no orphaned parts are left to bill. Parts are byte ranges
 * of the caller's buffers, hashed and sent without a copy. The object
 * appears only when CompleteMultipartUpload succeeds: atomic. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_internal.h"

typedef struct part_rec {
    char etag[130];
    char b64[45];
} part_rec;

typedef struct job {
    rl_s3 *s;
    const char *bucket, *key;
    const rl_s3_part *parts;
    int nparts;
    uint64_t total, psize;
    int count;          /* parts */
    char upload_id[1024], eid[3200];
    pthread_mutex_t mu;
    int next;           /* next part to take (0-based) */
    int failed;         /* first error code, 0 while all is well */
    rl_err err;
    part_rec *rec;
} job;

static void *worker(void *arg) {
    job *j = arg;
    rl_http *h = NULL;
    rl_err e = {0};
    if (rl_http_new(&h, &e) != RL_OK) {
        pthread_mutex_lock(&j->mu);
        if (!j->failed) j->failed = e.code ? e.code : RL_ENOMEM, j->err = e;
        pthread_mutex_unlock(&j->mu);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->failed ? j->count : j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->count) break;
        uint64_t off = (uint64_t)i * j->psize, len = off + j->psize <= j->total ? j->psize : j->total - off;
        char q[3300];
        snprintf(q, sizeof q, "partNumber=%d&uploadId=%s", i + 1, j->eid);
        rl_s3_call c = {.method = "PUT", .op = "UploadPart", .bucket = j->bucket, .key = j->key, .query = q,
                        .parts = j->parts, .nparts = j->nparts, .off = off, .len = len, .checksum = true};
        rl_http_resp r = {0};
        int rc = rl_s3_do(j->s, h, &c, &r, &e);
        const char *etag = rc ? NULL : rl_http_resp_header(&r, "etag");
        if (!rc && (!etag || !*etag || strlen(etag) >= sizeof j->rec[i].etag))
            rc = rl_errf(&e, RL_EIO, "s3 UploadPart %s/%s part %d: no ETag in the answer", j->bucket, j->key, i + 1);
        if (!rc) {
            snprintf(j->rec[i].etag, sizeof j->rec[i].etag, "%s", etag);
            char hex[65];
            /* the checksum the part was sent with, for the completion list */
            rl_s3_hash_range(j->parts, j->nparts, off, len, hex, j->rec[i].b64);
        }
        rl_http_resp_free(&r);
        if (rc) {
            pthread_mutex_lock(&j->mu);
            if (!j->failed) j->failed = rc, j->err = e;
            pthread_mutex_unlock(&j->mu);
            break;
        }
    }
    rl_http_free(h);
    return NULL;
}

static void abort_upload(job *j) {
    rl_err e = {0};
    if (rl_s3_abort_upload(j->s, j->bucket, j->key, j->upload_id, &e) != RL_OK)
        rl_log_msg(RL_LOG_WARN, "s3_abort_failed", e.msg); /* a lifecycle rule must clean it; say so */
}

int rl_s3_put_multipart(rl_s3 *s, const char *bucket, const char *key, const rl_s3_part *parts, int nparts,
                        uint64_t total, rl_err *e) {
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    job *j = calloc(1, sizeof *j);
    if (!j) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    j->s = s, j->bucket = bucket, j->key = key, j->parts = parts, j->nparts = nparts, j->total = total;
    j->psize = s->cfg.part_size;
    /* S3 allows at most 10000 parts: grow them for huge objects */
    while ((total + j->psize - 1) / j->psize > 10000) j->psize *= 2;
    j->count = (int)((total + j->psize - 1) / j->psize);
    j->rec = calloc((size_t)j->count, sizeof *j->rec);
    pthread_mutex_init(&j->mu, NULL);
    int rc = RL_OK;
    char *xml = NULL;
    if (!j->rec) {
        rc = rl_errf(e, RL_ENOMEM, "s3: out of memory");
        goto out;
    }
    /* create */
    static const char *const create_h[] = {"x-amz-checksum-algorithm: SHA256", NULL};
    rl_s3_call c = {.method = "POST", .op = "CreateMultipartUpload", .bucket = bucket, .key = key, .query = "uploads",
                    .headers = create_h, .payload_sha256 = empty_sha, .collect = true};
    rl_http_resp r = {0};
    if ((rc = rl_s3_do(s, s->h, &c, &r, e)) ||
        (rc = rl_s3_parse_upload_id(r.body, r.body_len, j->upload_id, sizeof j->upload_id, e)) ||
        (rc = rl_s3_uri_encode(j->upload_id, false, j->eid, sizeof j->eid, e))) {
        rl_http_resp_free(&r);
        goto out;
    }
    rl_http_resp_free(&r);
    /* parts */
    int nw = s->cfg.parallel < j->count ? s->cfg.parallel : j->count;
    pthread_t th[64];
    int started = 0;
    for (; started < nw; started++)
        if (pthread_create(&th[started], NULL, worker, j) != 0) break;
    if (started == 0) {
        j->failed = RL_EINTERNAL;
        rl_errf(&j->err, RL_EINTERNAL, "s3 multipart %s/%s: cannot start a worker thread", bucket, key);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (j->failed) {
        rc = j->failed;
        *e = j->err;
        abort_upload(j);
        goto out;
    }
    /* complete: the part list with each part's ETag and checksum */
    size_t cap = (size_t)j->count * 320 + 128, pos = 0;
    xml = malloc(cap);
    if (!xml) {
        rc = rl_errf(e, RL_ENOMEM, "s3: out of memory");
        abort_upload(j);
        goto out;
    }
    pos += (size_t)snprintf(xml + pos, cap - pos, "<CompleteMultipartUpload>");
    for (int i = 0; i < j->count; i++)
        pos += (size_t)snprintf(xml + pos, cap - pos,
                                "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag><ChecksumSHA256>%s</ChecksumSHA256></Part>",
                                i + 1, j->rec[i].etag, j->rec[i].b64);
    pos += (size_t)snprintf(xml + pos, cap - pos, "</CompleteMultipartUpload>");
    char sha[65], q[3300];
    rl_s3_sha256_hex(xml, pos, sha);
    snprintf(q, sizeof q, "uploadId=%s", j->eid);
    rl_s3_call cc = {.method = "POST", .op = "CompleteMultipartUpload", .bucket = bucket, .key = key, .query = q,
                     .body = xml, .body_len = pos, .payload_sha256 = sha, .collect = true, .error_in_200 = true};
    r = (rl_http_resp){0};
    rc = rl_s3_do(s, s->h, &cc, &r, e);
    rl_http_resp_free(&r);
    if (rc) abort_upload(j);
out:
    free(xml);
    pthread_mutex_destroy(&j->mu);
    free(j->rec);
    free(j);
    return rc;
}
