/* s3: an S3 REST client of our own over pkg/http.
 *
 * Requests are signed with AWS Signature V4 computed here (OpenSSL
 * HMAC-SHA256), not by libcurl (its CURLOPT_AWS_SIGV4 in Debian 12 signs
 * the query verbatim and never hashes bodies). Every attempt is signed
 * afresh (a retry gets a new date). Bodies are always hashed: uploads carry
 * x-amz-content-sha256 and x-amz-checksum-sha256.
 *
 * Errors: an S3 <Error> document (also one inside a 200, which
 * CompleteMultipartUpload may send) becomes one message naming the
 * operation, bucket/key and the server's Code and Message, mapped to:
 *   RL_EINPUT  NoSuchKey, NoSuchBucket, AccessDenied, InvalidAccessKeyId,
 *              SignatureDoesNotMatch, RequestTimeTooSkewed, QuotaExceeded
 *              (radosgw's 403 for a full bucket or user), any other 4xx
 *              (a setting, a credential or the store is wrong: retrying
 *              won't help)
 *   RL_EIO     5xx after the retries ran out, a malformed response
 *   RL_ETIMEOUT/RL_EPEER  transport failures after the retries ran out
 * Secrets (secret key, session token, web identity token, signatures)
 * never appear in messages or logs. */
#ifndef RL_S3_H
#define RL_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"
#include "util/util.h"

/* ---- credentials -------------------------------------------------------------------- */
typedef struct rl_s3_creds {
    char access_key[129];
    char secret_key[129];
    char token[4097];     /* session token; "" when none */
    double expires_unix;  /* 0: never (static keys) */
} rl_s3_creds;

/* Where credentials come from, resolved once at open:
 *   AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), or
 *   AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE: STS
 *   AssumeRoleWithWebIdentity (endpoint AWS_ENDPOINT_URL_STS, else
 *   https://sts.<region>.amazonaws.com), the token file re-read and the
 *   credentials renewed when less than 5 minutes of them remain.
 * Thread-safe: the multipart workers share one provider. */
typedef struct rl_s3_cred_provider rl_s3_cred_provider;
/* allow_http: the web identity token may go to an http:// STS endpoint
 * that is not loopback (else refused: it would travel in clear). */
int rl_s3_creds_from_env(const char *region, const rl_http_tls *tls, bool allow_http, rl_s3_cred_provider **out,
                         rl_err *e);
/* Fixed keys (tests, benches). */
int rl_s3_creds_static(const char *access_key, const char *secret_key, const char *token,
                       rl_s3_cred_provider **out, rl_err *e);
/* Current credentials, refreshed first when near expiry. */
int rl_s3_creds_get(rl_s3_cred_provider *p, rl_s3_creds *out, rl_err *e);
void rl_s3_creds_free(rl_s3_cred_provider *p);

/* ---- Signature V4 ------------------------------------------------------------------- */
typedef struct rl_s3_sign_in {
    const char *method;       /* "GET" */
    const char *path;         /* decoded path, e.g. "/bucket/a b/c~d"; encoded here */
    const char *query;        /* raw query as it will be sent ("" or NULL: none); canonicalised here */
    const char *const *headers; /* "Name: value" lines to sign, Host included; NULL-terminated */
    const char *payload_sha256; /* lowercase hex, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;     /* "20130524T000000Z" */
    const char *region;
    const char *service;      /* "s3" (NULL: "s3") */
} rl_s3_sign_in;

/* Fills `authorization` with the Authorization header's value
 * ("AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...").
 * The canonical request and string to sign are written to the optional
 * debug buffers (tests compare them with AWS's examples). */
int rl_s3_sign(const rl_s3_sign_in *in, const rl_s3_creds *c, char *authorization, size_t n,
               char *canonical, size_t cn, char *to_sign, size_t tn, rl_err *e);
/* URI-encode per SigV4: unreserved kept, everything else %XX (uppercase),
 * '/' kept when keep_slash. */
int rl_s3_uri_encode(const char *src, bool keep_slash, char *out, size_t n, rl_err *e);

/* ---- the client --------------------------------------------------------------------- */
typedef struct rl_s3_config {
    /* "" -> AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then
     * https://s3.<region>.amazonaws.com */
    char endpoint[512];
    char region[64];      /* "" -> AWS_REGION, AWS_DEFAULT_REGION, then us-east-1 */
    char addressing[16];  /* "path" | "virtual" | "" (auto: virtual on AWS, path on a custom endpoint) */
    size_t part_size;     /* multipart part size; 0: 16 MiB (at least 5 MiB) */
    size_t multipart_threshold; /* objects this big or bigger go multipart; 0: 64 MiB */
    int parallel;         /* parts in flight at once; 0: 4 */
    double timeout_s;     /* per attempt, per request; 0: 300 s (a part at a slow link) */
    rl_http_backoff retry;/* zeroes: the pkg/http defaults */
    const char *ca_file;  /* NULL: system store */
    rl_s3_cred_provider *creds; /* NULL: rl_s3_creds_from_env at open; owned by the client either way */
    /* Session and web identity tokens are sent as they are (SigV4 protects
     * only the secret key): to an http:// endpoint off this machine only
     * with this set (checkpoint.s3.allow_http). */
    bool allow_http;
} rl_s3_config;

typedef struct rl_s3 rl_s3;
int rl_s3_open(const rl_s3_config *c, rl_s3 **out, rl_err *e);
void rl_s3_close(rl_s3 *s);

/* The object is the concatenation of the parts; one PutObject below the
 * multipart threshold, else a multipart upload (`parallel` parts in
 * flight), aborted on failure so no part is left behind. Atomic either
 * way: readers see the old object or the whole new one. */
typedef struct rl_s3_part {
    const void *data;
    size_t len;
} rl_s3_part;
int rl_s3_put(rl_s3 *s, const char *bucket, const char *key, const rl_s3_part *parts, int nparts,
              rl_err *e);
/* Bytes [off, off+len) (len UINT64_MAX: to the end); *out malloc'd and
 * NUL-terminated, *n its length. A missing key: RL_EINPUT "... NoSuchKey". */
int rl_s3_get(rl_s3 *s, const char *bucket, const char *key, uint64_t off, uint64_t len, void **out,
              size_t *n, rl_err *e);
/* *found false (RL_OK) for a missing key. */
int rl_s3_head(rl_s3 *s, const char *bucket, const char *key, bool *found, uint64_t *size, rl_err *e);
/* Every key under prefix, through all ListObjectsV2 pages; sorted. */
typedef struct rl_s3_list {
    char **keys;
    uint64_t *sizes;
    size_t n;
} rl_s3_list;
int rl_s3_list_objects(rl_s3 *s, const char *bucket, const char *prefix, rl_s3_list *out, rl_err *e);
void rl_s3_list_free(rl_s3_list *l);
/* Multipart uploads begun under prefix and neither completed nor aborted
 * (ListMultipartUploads, every page): a writer killed mid-upload leaves
 * one, whose parts the store keeps (and bills) until aborted. */
typedef struct rl_s3_uploads {
    char **keys, **ids;
    size_t n;
} rl_s3_uploads;
int rl_s3_list_uploads(rl_s3 *s, const char *bucket, const char *prefix, rl_s3_uploads *out, rl_err *e);
void rl_s3_uploads_free(rl_s3_uploads *u);
/* AbortMultipartUpload; one already gone is RL_OK. */
int rl_s3_abort_upload(rl_s3 *s, const char *bucket, const char *key, const char *upload_id, rl_err *e);
/* Deleting a missing key is RL_OK (S3 answers 204 either way). */
int rl_s3_delete(rl_s3 *s, const char *bucket, const char *key, rl_err *e);
/* CreateBucket (tests and benches; a job's bucket is the user's). */
int rl_s3_create_bucket(rl_s3 *s, const char *bucket, rl_err *e);

/* ---- parsing (exposed for tests and fuzzing) ------------------------------------------ */
/* An <Error> document: code and message copied out (truncated to fit).
 * Returns true when body is one. */
bool rl_s3_parse_error(const char *body, size_t len, char *code, size_t cn, char *msg, size_t mn);
/* One ListObjectsV2 page: keys and sizes appended to out; *truncated and
 * next_token (for the next page) filled. RL_EIO on a malformed document. */
int rl_s3_parse_list(const char *body, size_t len, rl_s3_list *out, bool *truncated, char *next_token,
                     size_t tn, rl_err *e);
/* One ListMultipartUploadsResult page: uploads appended to out; *truncated
 * and the next page's markers filled. RL_EIO on a malformed document. */
int rl_s3_parse_uploads(const char *body, size_t len, rl_s3_uploads *out, bool *truncated, char *next_key,
                        size_t kn, char *next_id, size_t idn, rl_err *e);
/* InitiateMultipartUploadResult's UploadId. */
int rl_s3_parse_upload_id(const char *body, size_t len, char *upload_id, size_t n, rl_err *e);
/* AssumeRoleWithWebIdentityResponse's credentials. */
int rl_s3_parse_sts(const char *body, size_t len, rl_s3_creds *out, rl_err *e);

#endif
