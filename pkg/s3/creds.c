/* Credentials: static keys from the environment, or web identity (the
 * pod's projected service-account token exchanged at STS for temporary
 * keys, as IRSA and its equivalents do), renewed when less than 5 minutes
 * remain. STS AssumeRoleWithWebIdentity needs no signature: the token is
 * the proof. The provider is shared by the multipart workers, hence the
 * mutex; a refresh happens under it, so workers wait rather than race. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "s3_internal.h"

#define REFRESH_BEFORE_S 300

struct rl_s3_cred_provider {
    pthread_mutex_t mu;
    rl_s3_creds cur;
    bool web;                /* web identity: cur is renewed from STS */
    char role_arn[2048], token_file[1024], session[64], sts_url[512];
    rl_http_tls tls;
    char ca_file[1024];
};

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double rl_s3_parse_iso8601(const char *s) {
    int y, mo, d, h, mi;
    double sec;
    char tail[16] = "";
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%lf%15s", &y, &mo, &d, &h, &mi, &sec, tail) < 6) return -1;
    if (tail[0] && strcmp(tail, "Z") != 0 && strcmp(tail, "+00:00") != 0) return -1;
    if (y < 1970 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec < 0 || sec >= 61)
        return -1;
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi};
    return (double)timegm(&tm) + sec;
}

static int provider_new(rl_s3_cred_provider **out, rl_err *e) {
    rl_s3_cred_provider *p = calloc(1, sizeof *p);
    if (!p) return rl_errf(e, RL_ENOMEM, "s3: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return RL_OK;
}

int rl_s3_creds_static(const char *access_key, const char *secret_key, const char *token, rl_s3_cred_provider **out,
                       rl_err *e) {
    *out = NULL;
    if (!access_key || !*access_key || strlen(access_key) >= sizeof((rl_s3_creds *)0)->access_key)
        return rl_errf(e, RL_EINPUT, "s3: the access key is empty or too long");
    if (!secret_key || !*secret_key || strlen(secret_key) >= sizeof((rl_s3_creds *)0)->secret_key)
        return rl_errf(e, RL_EINPUT, "s3: the secret key is empty or too long");
    if (token && strlen(token) >= sizeof((rl_s3_creds *)0)->token)
        return rl_errf(e, RL_EINPUT, "s3: the session token is too long");
    int rc = provider_new(out, e);
    if (rc) return rc;
    rl_s3_creds *c = &(*out)->cur;
    snprintf(c->access_key, sizeof c->access_key, "%s", access_key);
    snprintf(c->secret_key, sizeof c->secret_key, "%s", secret_key);
    snprintf(c->token, sizeof c->token, "%s", token ? token : "");
    return RL_OK;
}

/* One AssumeRoleWithWebIdentity call; p->mu held. */
static int sts_refresh(rl_s3_cred_provider *p, rl_err *e) {
    char *tok = NULL;
    size_t tl = 0;
    rl_err fe = {0};
    if (rl_read_file(p->token_file, &tok, &tl, &fe) != RL_OK)
        return rl_errf(e, RL_EINPUT, "s3: AWS_WEB_IDENTITY_TOKEN_FILE %s: cannot read it", p->token_file);
    while (tl > 0 && (tok[tl - 1] == '\n' || tok[tl - 1] == '\r' || tok[tl - 1] == ' ')) tok[--tl] = '\0';
    size_t qn = 3 * (tl + strlen(p->role_arn) + strlen(p->session)) + 256;
    char *q = malloc(qn), *etok = malloc(3 * tl + 1), earn[6200], esess[200];
    int rc = RL_OK;
    if (!q || !etok) {
        rc = rl_errf(e, RL_ENOMEM, "s3: out of memory");
        goto out;
    }
    if ((rc = rl_s3_uri_encode(tok, false, etok, 3 * tl + 1, e)) ||
        (rc = rl_s3_uri_encode(p->role_arn, false, earn, sizeof earn, e)) ||
        (rc = rl_s3_uri_encode(p->session, false, esess, sizeof esess, e)))
        goto out;
    /* POSTed as a form, so the token never lands in a URL (or a log of one) */
    int w = snprintf(q, qn, "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=%s&RoleSessionName=%s"
                     "&WebIdentityToken=%s", earn, esess, etok);
    rl_http *h = NULL;
    if ((rc = rl_http_new(&h, e))) goto out;
    const char *hdrs[] = {"Content-Type: application/x-www-form-urlencoded", "Accept: application/xml", NULL};
    rl_http_backoff bo = {0};
    uint64_t seed = rl_http_jitter_seed();
    for (int attempt = 0;; attempt++) {
        rl_http_req req = {.method = "POST", .url = p->sts_url, .headers = hdrs, .body = q, .body_len = (size_t)w,
                           .tls = &p->tls, .timeout_s = 30};
        rl_http_resp r = {0};
        rl_err he = {0};
        rc = rl_http_do(h, &req, &r, &he);
        if (rc == RL_OK && r.status == 200) {
            rl_s3_creds c;
            rc = rl_s3_parse_sts(r.body, r.body_len, &c, e);
            if (!rc) {
                p->cur = c;
                OPENSSL_cleanse(&c, sizeof c);
                rl_log(RL_LOG_INFO, "s3_credentials", "\"source\":\"web identity\",\"expires_in_s\":%.0f",
                       p->cur.expires_unix - unix_now());
            }
            rl_http_resp_free(&r);
            break;
        }
        if (attempt + 1 < 4 && rl_http_retryable(rc, r.status)) {
            rl_http_resp_free(&r);
            rl_http_sleep(rl_http_backoff_delay(&bo, attempt, -1, &seed), NULL);
            continue;
        }
        char code[128] = "", msg[300] = "";
        if (rc == RL_OK) {
            rl_s3_parse_error(r.body, r.body_len, code, sizeof code, msg, sizeof msg);
            rc = r.status >= 500 ? RL_EIO : RL_EINPUT;
            rl_errf(e, rc, "s3: STS AssumeRoleWithWebIdentity for %s: %ld %s%s%s", p->role_arn, r.status,
                    code[0] ? code : "", msg[0] ? ": " : "", msg);
        } else {
            rl_errf(e, rc, "s3: STS AssumeRoleWithWebIdentity: %s", he.msg);
        }
        rl_http_resp_free(&r);
        break;
    }
    rl_http_free(h);
out:
    if (tok) OPENSSL_cleanse(tok, tl);
    if (etok) OPENSSL_cleanse(etok, strlen(etok));
    if (q) OPENSSL_cleanse(q, strlen(q));
    free(tok), free(etok), free(q);
    return rc;
}

int rl_s3_creds_from_env(const char *region, const rl_http_tls *tls, bool allow_http, rl_s3_cred_provider **out,
                         rl_err *e) {
    *out = NULL;
    const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
    const char *arn = getenv("AWS_ROLE_ARN"), *tf = getenv("AWS_WEB_IDENTITY_TOKEN_FILE");
    if (ak && *ak) {
        if (!sk || !*sk)
            return rl_errf(e, RL_EINPUT, "s3: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is empty");
        return rl_s3_creds_static(ak, sk, getenv("AWS_SESSION_TOKEN"), out, e);
    }
    if (sk && *sk) return rl_errf(e, RL_EINPUT, "s3: AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is empty");
    if ((arn && *arn) != (tf && *tf))
        return rl_errf(e, RL_EINPUT, "s3: web identity needs both AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE (%s is empty)",
                       arn && *arn ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN");
    if (!arn || !*arn)
        return rl_errf(e, RL_EINPUT, "s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                                     "AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE");
    rl_s3_cred_provider *p = NULL;
    int rc = provider_new(&p, e);
    if (rc) return rc;
    p->web = true;
    snprintf(p->role_arn, sizeof p->role_arn, "%s", arn);
    snprintf(p->token_file, sizeof p->token_file, "%s", tf);
    const char *sess = getenv("AWS_ROLE_SESSION_NAME");
    snprintf(p->session, sizeof p->session, "%s", sess && *sess ? sess : "ringleader");
    const char *sts = getenv("AWS_ENDPOINT_URL_STS");
    if (sts && *sts) snprintf(p->sts_url, sizeof p->sts_url, "%s", sts);
    else snprintf(p->sts_url, sizeof p->sts_url, "https://sts.%s.amazonaws.com/", region && *region ? region : "us-east-1");
    if ((rc = rl_http_cleartext_check(p->sts_url, allow_http, "the web identity token", RL_S3_HTTP_OPTIN, e))) {
        rl_s3_creds_free(p);
        return rl_err_wrap(e, "s3: AWS_ENDPOINT_URL_STS");
    }
    if (tls && tls->ca_file) {
        snprintf(p->ca_file, sizeof p->ca_file, "%s", tls->ca_file);
        p->tls.ca_file = p->ca_file;
    }
    pthread_mutex_lock(&p->mu);
    rc = sts_refresh(p, e);
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        rl_s3_creds_free(p);
        return rc;
    }
    *out = p;
    return RL_OK;
}

int rl_s3_creds_get(rl_s3_cred_provider *p, rl_s3_creds *out, rl_err *e) {
    pthread_mutex_lock(&p->mu);
    int rc = RL_OK;
    if (p->web && p->cur.expires_unix - unix_now() < REFRESH_BEFORE_S) rc = sts_refresh(p, e);
    if (!rc) *out = p->cur;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void rl_s3_creds_free(rl_s3_cred_provider *p) {
    if (!p) return;
    OPENSSL_cleanse(&p->cur, sizeof p->cur);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
