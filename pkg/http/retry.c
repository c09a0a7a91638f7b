/* The retry policy every client over pkg/http shares: which outcomes are
 * worth another try, how long to wait (full jitter, so many clients failing
 * together do not retry in lockstep), and Retry-After. */
#include "http.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

uint64_t rl_http_jitter_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    return rl_hash64(s ^ (uint64_t)(uintptr_t)&ts);
}

double rl_http_backoff_delay(const rl_http_backoff *b, int attempt, double retry_after_s,
                             uint64_t *rng_state) {
    double base = b && b->base_s > 0 ? b->base_s : 0.2;
    double cap = b && b->cap_s > 0 ? b->cap_s : 30.0;
    if (attempt < 0) attempt = 0;
    double ceil_s = base;
    for (int i = 0; i < attempt && ceil_s < cap; i++) ceil_s *= 2;
    if (ceil_s > cap) ceil_s = cap;
    uint64_t r = rl_splitmix64(rng_state);
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
    double d = u * ceil_s;
    /* The server knows its load better than our schedule does. */
    if (retry_after_s >= 0 && retry_after_s > d) d = retry_after_s;
    return d;
}

bool rl_http_retryable(int rc, long status) {
    if (rc == RL_ETIMEOUT || rc == RL_EPEER) return true;
    if (rc != RL_OK) return false;
    if (status == 429) return true;
    /* 501 and 505 say the server will never do this; retrying cannot help. */
    return status >= 500 && status <= 599 && status != 501 && status != 505;
}

static int month_index(const char *s) {
    static const char *m[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    for (int i = 0; i < 12; i++)
        if (strncmp(s, m[i], 3) == 0) return i;
    return -1;
}

/* Read exactly `digits` decimal digits (1..4) into *v. */
static const char *num(const char *p, int mind, int maxd, int *v) {
    int n = 0, x = 0;
    while (n < maxd && isdigit((unsigned char)p[n])) x = x * 10 + (p[n++] - '0');
    if (n < mind) return NULL;
    *v = x;
    return p + n;
}

static const char *hms(const char *p, struct tm *tm) {
    if (!(p = num(p, 2, 2, &tm->tm_hour)) || *p++ != ':') return NULL;
    if (!(p = num(p, 2, 2, &tm->tm_min)) || *p++ != ':') return NULL;
    if (!(p = num(p, 2, 2, &tm->tm_sec))) return NULL;
    return p;
}

static int parse_http_date(const char *s, time_t *out) {
    struct tm tm = {0};
    const char *p = s;
    const char *comma = strchr(s, ',');
    int mon;
    if (comma) {
        p = comma + 1;
        while (*p == ' ') p++;
        if (!(p = num(p, 1, 2, &tm.tm_mday))) return -1;
        char sep = *p;
        if (sep != ' ' && sep != '-') return -1;
        p++;
        if ((mon = month_index(p)) < 0) return -1;
        p += 3;
        if (*p++ != sep) return -1;
        int year;
        const char *q = num(p, 2, 4, &year);
        if (!q) return -1;
        if (q - p == 2) year += year < 70 ? 2000 : 1900; /* RFC 850's two-digit years */
        else if (q - p != 4) return -1;
        p = q;
        if (*p++ != ' ') return -1;
        if (!(p = hms(p, &tm))) return -1;
        if (strcmp(p, " GMT") != 0) return -1;
        tm.tm_year = year - 1900;
    } else { /* asctime: "Sun Nov  6 08:49:37 1994" */
        if (strlen(p) < 4 || p[3] != ' ') return -1;
        p += 4;
        if ((mon = month_index(p)) < 0 || p[3] != ' ') return -1;
        p += 4;
        if (*p == ' ') p++;
        if (!(p = num(p, 1, 2, &tm.tm_mday)) || *p++ != ' ') return -1;
        if (!(p = hms(p, &tm)) || *p++ != ' ') return -1;
        int year;
        if (!(p = num(p, 4, 4, &year)) || *p) return -1;
        tm.tm_year = year - 1900;
    }
    tm.tm_mon = mon;
    if (tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
        tm.tm_sec > 60)
        return -1;
    *out = timegm(&tm);
    return 0;
}

int rl_http_parse_retry_after(const char *value, double now_unix, double *out_s) {
    if (!value) return rl_errf(NULL, RL_EINPUT, "no value");
    const char *p = value;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    char buf[64];
    if (n == 0 || n >= sizeof buf) return RL_EINPUT;
    memcpy(buf, p, n);
    buf[n] = '\0';
    bool digits = true;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)buf[i])) digits = false;
    if (digits) {
        if (n > 9) return RL_EINPUT; /* over 30 years: nonsense, not a wait */
        *out_s = (double)strtol(buf, NULL, 10);
        return RL_OK;
    }
    time_t t;
    if (parse_http_date(buf, &t) != 0) return RL_EINPUT;
    double d = (double)t - now_unix;
    *out_s = d > 0 ? d : 0;
    return RL_OK;
}

int rl_http_sleep(double s, const volatile int *abort_flag) {
    double end = rl_now() + s;
    for (;;) {
        if (abort_flag && *abort_flag) return RL_EABORT;
        double left = end - rl_now();
        if (left <= 0) return RL_OK;
        if (left > 0.05) left = 0.05; /* bounds how late a cancel is seen */
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
}

int rl_http_query_escape(const char *src, char *out, size_t n, rl_err *e) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        bool keep = isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~';
        size_t need = keep ? 1 : 3;
        if (o + need >= n)
            return rl_errf(e, RL_EINPUT, "query value too long (over %zu bytes escaped)", n - 1);
        if (keep) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    if (n) out[o] = '\0';
    return RL_OK;
}
