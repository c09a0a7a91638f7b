/* s3: what the package's files share. */
#ifndef RL_S3_INTERNAL_H
#define RL_S3_INTERNAL_H

#include "s3/s3.h"

/* The setting that lets a token go to an http:// endpoint (named in the refusal). */
#define RL_S3_HTTP_OPTIN "checkpoint.s3.allow_http"

void rl_s3_hex(const unsigned char *b, size_t n, char *out);
void rl_s3_sha256_hex(const void *data, size_t len, char out[65]);
/* "20130524T000000Z" for the given Unix time. */
void rl_s3_amz_date(double unix_s, char out[17]);
/* ISO 8601 "2026-11-23T10:00:00Z" (fractions allowed) -> Unix seconds; -1 if malformed. */
double rl_s3_parse_iso8601(const char *s);
struct rl_s3 {
    rl_s3_config cfg;       /* resolved: endpoint, region, sizes */
    rl_s3_cred_provider *creds;
    rl_http *h;             /* the caller's thread; multipart workers have their own */
    char scheme[8], host[256], base[256];
    bool virtual_host;
    rl_http_tls tls;
    char ca_file[1024];
    uint64_t seed;          /* backoff jitter */
    double clock_skew_s;    /* test knob: added to the signing clock */
    const volatile int *abort_flag;
};

/* One S3 request, signed afresh and retried per the client's policy. */
typedef struct rl_s3_call {
    const char *method, *op;       /* op names it in messages ("PutObject") */
    const char *bucket, *key;      /* key NULL: the bucket itself */
    const char *query;             /* already encoded, as sent */
    const char *const *headers;    /* more "Name: value" lines to sign and send */
    const rl_s3_part *parts;       /* body: bytes [off, off+len) of the parts ... */
    int nparts;
    uint64_t off, len;
    const void *body;              /* ... or from memory (payload_sha256 then required) */
    size_t body_len;
    const char *payload_sha256;    /* NULL: hashed from the parts */
    bool checksum;                 /* send x-amz-checksum-sha256 (needs parts) */
    bool collect;                  /* stream the body into resp->body (any size) */
    size_t sink_len_hint;
    bool ok_404;                   /* a 404 is an answer, not an error */
    bool error_in_200;             /* a 200 may carry an <Error> (CompleteMultipartUpload) */
} rl_s3_call;

/* The decoded path to sign, the URL to send and the Host for bucket/key. */
int rl_s3_locate(const rl_s3 *s, const char *bucket, const char *key, const char *query, char *path, size_t pn,
                 char *url, size_t un, char *host, size_t hn, rl_err *e);
int rl_s3_do(rl_s3 *s, rl_http *h, const rl_s3_call *c, rl_http_resp *resp, rl_err *e);
/* sha256 of bytes [off, off+len) of the parts: hex and base64. */
void rl_s3_hash_range(const rl_s3_part *parts, int nparts, uint64_t off, uint64_t len, char hex[65], char b64[45]);
int rl_s3_put_multipart(rl_s3 *s, const char *bucket, const char *key, const rl_s3_part *parts, int nparts,
                        uint64_t total, rl_err *e);

/* Test knob: ListObjectsV2 page size (0: the server's default, 1000). */
extern int rl_s3_list_page_size;

#endif
