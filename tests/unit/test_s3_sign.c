/* SigV4 and the S3 XML parsers, without a server: AWS's published
 * example signature, canonicalisation cases, and the answers we parse. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3/s3.h"
#include "s3/s3_internal.h"

static const rl_s3_creds aws_example = {.access_key = "AKIAIOSFODNN7EXAMPLE",
                                        .secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* "GET Object" from AWS's SigV4 documentation for S3 (header-based auth) */
Test(s3_sign, aws_published_example) {
    const char *h[] = {"Host: examplebucket.s3.amazonaws.com", "Range: bytes=0-9", "x-amz-content-sha256: " EMPTY_SHA,
                       "x-amz-date: 20130524T000000Z", NULL};
    rl_s3_sign_in in = {.method = "GET", .path = "/test.txt", .headers = h, .payload_sha256 = EMPTY_SHA,
                        .amz_date = "20130524T000000Z", .region = "us-east-1"};
    char auth[512], canon[2048], sts[512];
    rl_err e = {0};
    cr_assert_eq(rl_s3_sign(&in, &aws_example, auth, sizeof auth, canon, sizeof canon, sts, sizeof sts, &e), 0, "%s",
                 e.msg);
    cr_expect_str_eq(canon, "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
                            "x-amz-content-sha256:" EMPTY_SHA "\nx-amz-date:20130524T000000Z\n\n"
                            "host;range;x-amz-content-sha256;x-amz-date\n" EMPTY_SHA);
    cr_expect_str_eq(sts, "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                          "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
    cr_expect_str_eq(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                           "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                           "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    /* and a signature can fail: one character of the secret changes it */
    rl_s3_creds other = aws_example;
    other.secret_key[0] = 'X';
    char auth2[512];
    cr_assert_eq(rl_s3_sign(&in, &other, auth2, sizeof auth2, NULL, 0, NULL, 0, &e), 0);
    cr_expect_str_neq(auth, auth2);
}

/* The canonical request's path and query lines for a path and raw query. */
static void canon_lines(const char *path, const char *query, char *pl, char *ql) {
    const char *h[] = {"Host: h", NULL};
    rl_s3_sign_in in = {.method = "GET", .path = path, .query = query, .headers = h, .payload_sha256 = EMPTY_SHA,
                        .amz_date = "20130524T000000Z", .region = "us-east-1"};
    char auth[512], canon[4096];
    rl_err e = {0};
    cr_assert_eq(rl_s3_sign(&in, &aws_example, auth, sizeof auth, canon, sizeof canon, NULL, 0, &e), 0, "%s", e.msg);
    char *a = strchr(canon, '\n') + 1, *b = strchr(a, '\n'), *c = strchr(b + 1, '\n');
    memcpy(pl, a, (size_t)(b - a)), pl[b - a] = '\0';
    memcpy(ql, b + 1, (size_t)(c - b - 1)), ql[c - b - 1] = '\0';
}

Test(s3_sign, canonical_paths_and_queries) {
    char p[1024], q[1024];
    /* spaces are %20 (never '+'), '+' is %2B, '/' stays in paths, '~' is unreserved */
    canon_lines("/bucket/a b+c/d~e", NULL, p, q);
    cr_expect_str_eq(p, "/bucket/a%20b%2Bc/d~e");
    cr_expect_str_eq(q, "");
    /* UTF-8 keys: every byte encoded, uppercase hex */
    canon_lines("/b/\xc3\xa9t\xc3\xa9/\xe2\x82\xac", NULL, p, q);
    cr_expect_str_eq(p, "/b/%C3%A9t%C3%A9/%E2%82%AC");
    /* sorted by name; valueless "uploads" signs as "uploads="; empty values kept;
     * '/' encoded inside query values; already-encoded input is not double-encoded */
    canon_lines("/b/k", "uploads", p, q);
    cr_expect_str_eq(q, "uploads=");
    canon_lines("/b", "prefix=a/b c&list-type=2&continuation-token=x%2By%3D&delimiter=", p, q);
    cr_expect_str_eq(q, "continuation-token=x%2By%3D&delimiter=&list-type=2&prefix=a%2Fb%20c");
    canon_lines("/b/k", "uploadId=A~b.c_d-e&partNumber=10", p, q);
    cr_expect_str_eq(q, "partNumber=10&uploadId=A~b.c_d-e");
    /* same name twice: ordered by value */
    canon_lines("/b", "x=2&x=1", p, q);
    cr_expect_str_eq(q, "x=1&x=2");
    /* a literal '+' in a query we send means plus, so it signs as %2B */
    canon_lines("/b", "prefix=a+b", p, q);
    cr_expect_str_eq(q, "prefix=a%2Bb");
}

Test(s3_sign, header_values_are_trimmed_and_sorted) {
    const char *h[] = {"X-Amz-Meta-B:   two   words  ", "Host: h", "x-amz-meta-a:one", NULL};
    rl_s3_sign_in in = {.method = "PUT", .path = "/b/k", .headers = h, .payload_sha256 = EMPTY_SHA,
                        .amz_date = "20130524T000000Z", .region = "eu-west-1"};
    char auth[512], canon[4096];
    rl_err e = {0};
    cr_assert_eq(rl_s3_sign(&in, &aws_example, auth, sizeof auth, canon, sizeof canon, NULL, 0, &e), 0);
    cr_expect(strstr(canon, "\nhost:h\nx-amz-meta-a:one\nx-amz-meta-b:two words\n\nhost;x-amz-meta-a;x-amz-meta-b\n"),
              "%s", canon);
    cr_expect(strstr(auth, "/eu-west-1/s3/aws4_request"), "%s", auth);
    const char *bad[] = {"no colon here", NULL};
    in.headers = bad;
    cr_expect_eq(rl_s3_sign(&in, &aws_example, auth, sizeof auth, NULL, 0, NULL, 0, &e), RL_EINPUT);
}

Test(s3_sign, xml_answers) {
    char code[64], msg[128];
    const char *err = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
                      "<Message>Please reduce your request rate.</Message><RequestId>1</RequestId></Error>";
    cr_expect(rl_s3_parse_error(err, strlen(err), code, sizeof code, msg, sizeof msg));
    cr_expect_str_eq(code, "SlowDown");
    cr_expect_str_eq(msg, "Please reduce your request rate.");
    const char *ok = "<CompleteMultipartUploadResult><ETag>\"x\"</ETag></CompleteMultipartUploadResult>";
    cr_expect(!rl_s3_parse_error(ok, strlen(ok), code, sizeof code, msg, sizeof msg));
    /* a DTD is refused, not expanded */
    const char *bomb = "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><Error><Code>&a;</Code></Error>";
    cr_expect(!rl_s3_parse_error(bomb, strlen(bomb), code, sizeof code, msg, sizeof msg));

    const char *page = "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
                       "<IsTruncated>true</IsTruncated><NextContinuationToken>tok/1+</NextContinuationToken>"
                       "<Contents><Key>a/2</Key><Size>12</Size></Contents><Contents><Key>a/1</Key><Size>0</Size>"
                       "</Contents></ListBucketResult>";
    rl_s3_list l = {0};
    bool tr;
    char tok[64];
    rl_err e = {0};
    cr_assert_eq(rl_s3_parse_list(page, strlen(page), &l, &tr, tok, sizeof tok, &e), 0, "%s", e.msg);
    cr_expect(tr);
    cr_expect_str_eq(tok, "tok/1+");
    cr_assert_eq(l.n, 2);
    cr_expect_str_eq(l.keys[0], "a/2");
    cr_expect_eq(l.sizes[0], 12);
    rl_s3_list_free(&l);
    const char *lie = "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
    cr_expect_eq(rl_s3_parse_list(lie, strlen(lie), &l, &tr, tok, sizeof tok, &e), RL_EIO);
    rl_s3_list_free(&l);
    const char *badsize = "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>";
    cr_expect_eq(rl_s3_parse_list(badsize, strlen(badsize), &l, &tr, tok, sizeof tok, &e), RL_EIO);
    rl_s3_list_free(&l);

    char id[64];
    const char *up = "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>2~abc</UploadId>"
                     "</InitiateMultipartUploadResult>";
    cr_assert_eq(rl_s3_parse_upload_id(up, strlen(up), id, sizeof id, &e), 0);
    cr_expect_str_eq(id, "2~abc");
    cr_expect_eq(rl_s3_parse_upload_id("<x/>", 4, id, sizeof id, &e), RL_EIO);

    const char *sts = "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                      "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAX</AccessKeyId>"
                      "<SecretAccessKey>sek</SecretAccessKey><SessionToken>tok</SessionToken>"
                      "<Expiration>2026-11-23T12:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
                      "</AssumeRoleWithWebIdentityResponse>";
    rl_s3_creds c;
    cr_assert_eq(rl_s3_parse_sts(sts, strlen(sts), &c, &e), 0, "%s", e.msg);
    cr_expect_str_eq(c.access_key, "ASIAX");
    cr_expect_str_eq(c.token, "tok");
    cr_expect_eq(c.expires_unix, 1795435200.0);
    /* half a credential is none */
    const char *half = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
                       "<AccessKeyId>A</AccessKeyId></Credentials></AssumeRoleWithWebIdentityResult>"
                       "</AssumeRoleWithWebIdentityResponse>";
    cr_expect_eq(rl_s3_parse_sts(half, strlen(half), &c, &e), RL_EIO);
    cr_expect_str_eq(c.access_key, "");
}

Test(s3_sign, credentials_from_the_environment) {
    rl_s3_cred_provider *p;
    rl_err e = {0};
    unsetenv("AWS_ROLE_ARN"), unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE"), unsetenv("AWS_SESSION_TOKEN");
    setenv("AWS_ACCESS_KEY_ID", "AK", 1);
    unsetenv("AWS_SECRET_ACCESS_KEY");
    cr_expect_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "AWS_SECRET_ACCESS_KEY"), "%s", e.msg);
    setenv("AWS_SECRET_ACCESS_KEY", "very-secret", 1);
    setenv("AWS_SESSION_TOKEN", "session", 1);
    cr_assert_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), 0, "%s", e.msg);
    rl_s3_creds c;
    cr_assert_eq(rl_s3_creds_get(p, &c, &e), 0);
    cr_expect_str_eq(c.secret_key, "very-secret");
    cr_expect_str_eq(c.token, "session");
    rl_s3_creds_free(p);
    unsetenv("AWS_ACCESS_KEY_ID"), unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_ROLE_ARN", "arn:aws:iam::1:role/r", 1);
    cr_expect_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "AWS_WEB_IDENTITY_TOKEN_FILE"), "%s", e.msg);
    unsetenv("AWS_ROLE_ARN");
    cr_expect_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "no credentials"), "%s", e.msg);
}

/* ---- web identity against an STS stand-in --------------------------------------------
 * No STS can run here, so a thread plays one: it answers each POST with
 * the documented AssumeRoleWithWebIdentityResponse and keeps the request
 * bodies for the test to inspect. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct sts_stub {
    int lfd, port, served;
    char bodies[4][8192];
    double expires_in[4]; /* seconds from now for each answer */
} sts_stub;

static void *sts_serve(void *arg) {
    sts_stub *s = arg;
    for (int k = 0; k < 4; k++) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) return NULL;
        char req[16384];
        size_t have = 0;
        char *body = NULL;
        long clen = -1;
        while (have < sizeof req - 1) {
            ssize_t r = recv(fd, req + have, sizeof req - 1 - have, 0);
            if (r <= 0) break;
            have += (size_t)r, req[have] = '\0';
            char *end = strstr(req, "\r\n\r\n");
            if (end && clen < 0) {
                char *cl = strcasestr(req, "content-length:");
                clen = cl ? atol(cl + 15) : 0;
                body = end + 4;
            }
            if (body && (long)(have - (size_t)(body - req)) >= clen) break;
        }
        if (body) snprintf(s->bodies[k], sizeof s->bodies[k], "%s", body);
        time_t t = time(NULL) + (time_t)s->expires_in[k];
        struct tm tm;
        gmtime_r(&t, &tm);
        char exp[32], xml[1024], resp[1400];
        strftime(exp, sizeof exp, "%Y-%m-%dT%H:%M:%SZ", &tm);
        int n = snprintf(xml, sizeof xml,
                         "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                         "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIA%d</AccessKeyId>"
                         "<SecretAccessKey>secret%d</SecretAccessKey><SessionToken>session%d</SessionToken>"
                         "<Expiration>%s</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
                         "</AssumeRoleWithWebIdentityResponse>", k, k, k, exp);
        int m = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: %d\r\n"
                         "Connection: close\r\n\r\n%s", n, xml);
        /* counted before the answer goes out: the client may check the
         * count as soon as it has read the answer */
        __atomic_add_fetch(&s->served, 1, __ATOMIC_SEQ_CST);
        ssize_t w = send(fd, resp, (size_t)m, MSG_NOSIGNAL);
        (void)w;
        close(fd);
    }
    return NULL;
}

Test(s3_sign, web_identity_through_sts_renewed_before_expiry) {
    static sts_stub s = {.expires_in = {120, 3600, 3600, 3600}}; /* the first lasts under 5 minutes */
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    cr_assert(bind(s.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(s.lfd, 4) == 0 &&
              getsockname(s.lfd, (struct sockaddr *)&sa, &sl) == 0);
    pthread_t th;
    pthread_create(&th, NULL, sts_serve, &s);
    char url[64], tf[] = "/tmp/rl-wit-XXXXXX";
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", ntohs(sa.sin_port));
    int fd = mkstemp(tf);
    cr_assert(fd >= 0 && write(fd, "token/one+1\n", 12) == 12);
    close(fd);
    unsetenv("AWS_ACCESS_KEY_ID"), unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer", 1);
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", tf, 1);
    setenv("AWS_ENDPOINT_URL_STS", url, 1);
    rl_s3_cred_provider *p;
    rl_err e = {0};
    cr_assert_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), 0, "%s", e.msg);
    cr_expect(strstr(s.bodies[0], "Action=AssumeRoleWithWebIdentity") &&
                  strstr(s.bodies[0], "RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Ftrainer") &&
                  strstr(s.bodies[0], "WebIdentityToken=token%2Fone%2B1") && strstr(s.bodies[0], "Version=2011-06-15"),
              "%s", s.bodies[0]);
    /* the first credentials expire within 5 minutes: the next use renews them, re-reading the rotated token */
    fd = open(tf, O_WRONLY | O_TRUNC);
    cr_assert(fd >= 0 && write(fd, "token-two", 9) == 9);
    close(fd);
    rl_s3_creds c;
    cr_assert_eq(rl_s3_creds_get(p, &c, &e), 0, "%s", e.msg);
    cr_expect_str_eq(c.access_key, "ASIA1");
    cr_expect_str_eq(c.token, "session1");
    cr_expect(strstr(s.bodies[1], "WebIdentityToken=token-two"), "%s", s.bodies[1]);
    /* an hour left: no further call */
    cr_assert_eq(rl_s3_creds_get(p, &c, &e), 0, "%s", e.msg);
    cr_expect_str_eq(c.access_key, "ASIA1");
    cr_expect_eq(__atomic_load_n(&s.served, __ATOMIC_SEQ_CST), 2);
    rl_s3_creds_free(p);
    /* the web identity token never goes to an http:// STS off this machine */
    setenv("AWS_ENDPOINT_URL_STS", "http://sts.example:8080/", 1);
    cr_expect_eq(rl_s3_creds_from_env("us-east-1", NULL, false, &p, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "AWS_ENDPOINT_URL_STS: http://sts.example:8080/: http:// would send the web identity token"),
              "%s", e.msg);
    cr_expect_eq(__atomic_load_n(&s.served, __ATOMIC_SEQ_CST), 2, "the stub was called");
    unsetenv("AWS_ROLE_ARN"), unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE"), unsetenv("AWS_ENDPOINT_URL_STS");
    unlink(tf);
    shutdown(s.lfd, SHUT_RDWR);
    close(s.lfd);
    pthread_join(th, NULL);
}

/* Addressing: virtual-hosted on AWS (and when asked), path-style on custom
 * endpoints, dotted buckets always path-style; endpoint variables in order. */
Test(s3_sign, addressing_and_endpoints) {
    rl_err e = {0};
    char path[512], url[1024], host[256];
    struct {
        const char *endpoint, *addressing, *env_s3, *env_any, *bucket, *want_url, *want_host, *want_path;
    } cases[] = {
        {"", "", NULL, NULL, "bkt", "https://bkt.s3.eu-west-1.amazonaws.com/a%20b/c", "bkt.s3.eu-west-1.amazonaws.com", "/a b/c"},
        {"", "", NULL, NULL, "my.bkt", "https://s3.eu-west-1.amazonaws.com/my.bkt/a%20b/c", "s3.eu-west-1.amazonaws.com", "/my.bkt/a b/c"},
        {"http://minio:9000/", "", NULL, NULL, "bkt", "http://minio:9000/bkt/a%20b/c", "minio:9000", "/bkt/a b/c"},
        {"http://minio:9000", "virtual", NULL, NULL, "bkt", "http://bkt.minio:9000/a%20b/c", "bkt.minio:9000", "/a b/c"},
        {"", "", "http://s3only:1", "http://any:2", "bkt", "http://s3only:1/bkt/a%20b/c", "s3only:1", "/bkt/a b/c"},
        {"", "", NULL, "http://any:2/base", "bkt", "http://any:2/base/bkt/a%20b/c", "any:2", "/base/bkt/a b/c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].env_s3) setenv("AWS_ENDPOINT_URL_S3", cases[i].env_s3, 1);
        else unsetenv("AWS_ENDPOINT_URL_S3");
        if (cases[i].env_any) setenv("AWS_ENDPOINT_URL", cases[i].env_any, 1);
        else unsetenv("AWS_ENDPOINT_URL");
        rl_s3_config c = {0};
        snprintf(c.endpoint, sizeof c.endpoint, "%s", cases[i].endpoint);
        snprintf(c.addressing, sizeof c.addressing, "%s", cases[i].addressing);
        snprintf(c.region, sizeof c.region, "eu-west-1");
        cr_assert_eq(rl_s3_creds_static("AK", "SK", NULL, &c.creds, &e), 0);
        rl_s3 *s;
        cr_assert_eq(rl_s3_open(&c, &s, &e), 0, "%s", e.msg);
        cr_assert_eq(rl_s3_locate(s, cases[i].bucket, "a b/c", NULL, path, sizeof path, url, sizeof url, host,
                                  sizeof host, &e), 0, "%s", e.msg);
        cr_expect_str_eq(url, cases[i].want_url, "case %zu", i);
        cr_expect_str_eq(host, cases[i].want_host, "case %zu", i);
        cr_expect_str_eq(path, cases[i].want_path, "case %zu", i);
        rl_s3_close(s);
    }
    unsetenv("AWS_ENDPOINT_URL_S3"), unsetenv("AWS_ENDPOINT_URL");
    rl_s3_config bad = {.endpoint = "ftp://x"};
    cr_assert_eq(rl_s3_creds_static("AK", "SK", NULL, &bad.creds, &e), 0);
    rl_s3 *s;
    cr_expect_eq(rl_s3_open(&bad, &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "ftp://x"), "%s", e.msg);
    /* a session token goes to an http:// endpoint off this machine only when allowed */
    static const struct {
        const char *endpoint, *token;
        bool allow, ok;
    } clear[] = {{"http://rgw.storage:7480", "session", false, false}, {"http://rgw.storage:7480", "session", true, true},
                 {"http://rgw.storage:7480", NULL, false, true},       {"http://127.0.0.1:7480", "session", false, true},
                 {"https://rgw.storage", "session", false, true}};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) {
        rl_s3_config u = {.allow_http = clear[i].allow};
        snprintf(u.endpoint, sizeof u.endpoint, "%s", clear[i].endpoint);
        cr_assert_eq(rl_s3_creds_static("AK", "SK", clear[i].token, &u.creds, &e), 0);
        int rc = rl_s3_open(&u, &s, &e);
        cr_expect_eq(rc, clear[i].ok ? RL_OK : RL_EINPUT, "case %zu: %s", i, e.msg);
        if (rc == RL_OK) rl_s3_close(s);
        else cr_expect(strstr(e.msg, "the session token in clear") && strstr(e.msg, "checkpoint.s3.allow_http"), "%s",
                       e.msg);
    }
    /* an endpoint with user info is refused without echoing the password */
    static const char *const secretive[] = {"http://user:hunter2@rgw:7480", "ftp://user:hunter2@rgw", "user:hunter2@rgw:7480"};
    for (size_t i = 0; i < sizeof secretive / sizeof secretive[0]; i++) {
        rl_s3_config u = {0};
        snprintf(u.endpoint, sizeof u.endpoint, "%s", secretive[i]);
        cr_assert_eq(rl_s3_creds_static("AK", "SK", NULL, &u.creds, &e), 0);
        cr_expect_eq(rl_s3_open(&u, &s, &e), RL_EINPUT, "%s", secretive[i]);
        cr_expect(strstr(e.msg, "rgw") && !strstr(e.msg, "hunter2"), "%s", e.msg);
    }
}
