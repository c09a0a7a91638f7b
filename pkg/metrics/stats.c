/* The stats line: trainer -> node agent over a pipe. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics.h"

/* JSON has no NaN or Inf: a value that is not finite is sent as null
 * and read back as "unknown" */
static void num(char *dst, size_t n, double v) {
    if (isfinite(v)) snprintf(dst, n, "%.17g", v);
    else snprintf(dst, n, "null");
}

static double get_num(const cJSON *o, const char *k, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* a string member into dst ("" when absent or not a string) */
static void get_str(const cJSON *o, const char *k, char *dst, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(dst, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

/* {"ev":"pace","step":S,"why":"...","slow":[{"rank":2,"ratio":3.1,"pod":"p","node":"n"}]}, and the same
 * with "ev":"degraded" */
static size_t ranks_format(const char *ev, const rl_stats_msg *m, char *buf, size_t n) {
    char why[2 * sizeof m->why], pod[2 * sizeof m->slow[0].pod], node[2 * sizeof m->slow[0].node], r[32];
    size_t at = (size_t)snprintf(buf, n, "{\"ev\":\"%s\",\"step\":%lld,\"why\":\"%s\",\"slow\":[", ev, m->step,
                                 rl_json_escape(why, sizeof why, m->why));
    for (int i = 0; i < m->nslow && i < RL_STATS_SLOW_MAX && at < n; i++) {
        num(r, sizeof r, m->slow[i].ratio);
        at += (size_t)snprintf(buf + at, n - at, "%s{\"rank\":%d,\"ratio\":%s,\"pod\":\"%s\",\"node\":\"%s\"}",
                               i ? "," : "", m->slow[i].rank, r, rl_json_escape(pod, sizeof pod, m->slow[i].pod),
                               rl_json_escape(node, sizeof node, m->slow[i].node));
    }
    if (at < n) at += (size_t)snprintf(buf + at, n - at, "]}\n");
    return at < n ? at : 0;
}

static void ranks_parse(const cJSON *o, rl_stats_msg *m) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "slow");
    get_str(o, "why", m->why, sizeof m->why);
    for (const cJSON *x = cJSON_IsArray(a) ? a->child : NULL; x; x = x->next) {
        const cJSON *rank = cJSON_GetObjectItemCaseSensitive(x, "rank");
        if (m->nslow == RL_STATS_SLOW_MAX || !cJSON_IsNumber(rank) || !(rank->valuedouble >= 0) ||
            rank->valuedouble >= 1 << 24)
            continue;
        m->slow[m->nslow].rank = (int)rank->valuedouble;
        m->slow[m->nslow].ratio = get_num(x, "ratio", NAN);
        get_str(x, "pod", m->slow[m->nslow].pod, sizeof m->slow[0].pod);
        get_str(x, "node", m->slow[m->nslow].node, sizeof m->slow[0].node);
        m->nslow++;
    }
}

size_t rl_stats_format(const rl_stats_msg *m, char *buf, size_t n) {
    char a[9][32];
    int len;
    if (n > RL_STATS_LINE_MAX) n = RL_STATS_LINE_MAX;
    if (m->kind == RL_STATS_STEP) {
        const double v[] = {m->loss, m->lr, m->grad_norm, m->tokens_per_s, m->step_s, m->allreduce_s,
                            m->allreduce_busy_s, m->flops_per_token};
        for (int i = 0; i < 8; i++) num(a[i], sizeof a[i], v[i]);
        len = snprintf(buf, n,
                       "{\"ev\":\"step\",\"step\":%lld,\"steps\":%lld,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,"
                       "\"tps\":%s,\"step_s\":%s,\"ar_s\":%s,\"ar_busy_s\":%s,\"fpt\":%s,\"world\":%d}\n",
                       m->step, m->steps, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], m->world);
    } else if (m->kind == RL_STATS_CKPT) {
        char uri[2 * sizeof m->uri];
        num(a[0], sizeof a[0], m->ckpt_s);
        num(a[1], sizeof a[1], m->ckpt_unix);
        len = snprintf(buf, n, "{\"ev\":\"ckpt\",\"step\":%lld,\"s\":%s,\"unix\":%s,\"resumed\":%s,\"uri\":\"%s\"}\n",
                       m->step, a[0], a[1], m->resumed ? "true" : "false", rl_json_escape(uri, sizeof uri, m->uri));
    } else if (m->kind == RL_STATS_PACE || m->kind == RL_STATS_DEGRADED) {
        return ranks_format(m->kind == RL_STATS_PACE ? "pace" : "degraded", m, buf, n);
    } else if (m->kind == RL_STATS_HUNG) {
        char uri[2 * sizeof m->uri], why[2 * sizeof m->why];
        len = snprintf(buf, n, "{\"ev\":\"hung\",\"step\":%lld,\"why\":\"%s\",\"uri\":\"%s\"}\n", m->step,
                       rl_json_escape(why, sizeof why, m->why), rl_json_escape(uri, sizeof uri, m->uri));
    } else {
        return 0;
    }
    return len > 0 && (size_t)len < n ? (size_t)len : 0;
}

int rl_stats_parse(const char *line, size_t len, rl_stats_msg *m, rl_err *e) {
    memset(m, 0, sizeof *m);
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return rl_errf(e, RL_EINPUT, "stats line: not a JSON object");
    }
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "ev");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    int rc = RL_OK;
    if (!cJSON_IsString(ev) || !cJSON_IsNumber(step)) {
        rc = rl_errf(e, RL_EINPUT, "stats line: \"ev\" or \"step\" missing");
    } else if (strcmp(ev->valuestring, "step") == 0) {
        m->kind = RL_STATS_STEP;
        double steps = get_num(o, "steps", -1);
        m->steps = steps >= 0 && steps < 9e18 ? (long long)steps : -1; /* a cast out of range is UB */
        m->loss = get_num(o, "loss", NAN);
        m->lr = get_num(o, "lr", NAN);
        m->grad_norm = get_num(o, "grad_norm", NAN);
        m->tokens_per_s = get_num(o, "tps", NAN);
        m->step_s = get_num(o, "step_s", NAN);
        m->allreduce_s = get_num(o, "ar_s", -1);
        m->allreduce_busy_s = get_num(o, "ar_busy_s", -1);
        m->flops_per_token = get_num(o, "fpt", 0);
        double w = get_num(o, "world", 0);
        m->world = w >= 0 && w < 1 << 24 ? (int)w : 0;
    } else if (strcmp(ev->valuestring, "ckpt") == 0) {
        m->kind = RL_STATS_CKPT;
        m->ckpt_s = get_num(o, "s", -1);
        m->ckpt_unix = get_num(o, "unix", 0);
        m->resumed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "resumed"));
        get_str(o, "uri", m->uri, sizeof m->uri);
    } else if (strcmp(ev->valuestring, "pace") == 0) {
        m->kind = RL_STATS_PACE;
        ranks_parse(o, m);
    } else if (strcmp(ev->valuestring, "degraded") == 0) {
        m->kind = RL_STATS_DEGRADED;
        ranks_parse(o, m);
    } else if (strcmp(ev->valuestring, "hung") == 0) {
        m->kind = RL_STATS_HUNG;
        get_str(o, "uri", m->uri, sizeof m->uri);
        get_str(o, "why", m->why, sizeof m->why);
    } else {
        rc = rl_errf(e, RL_EINPUT, "stats line: unknown event");
    }
    if (!rc) {
        double s = step->valuedouble;
        m->step = s >= 0 && s < 9e18 ? (long long)s : 0;
    }
    cJSON_Delete(o);
    return rc;
}

void rl_stats_writer_open(rl_stats_writer *w, const char *v) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (!v || !*v) return;
    char *end;
    long fd = strtol(v, &end, 10);
    struct stat st;
    if (*end || fd < 3 || fd > 1 << 20 || fstat((int)fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        rl_log(RL_LOG_DEBUG, "stats_fd", "\"msg\":\"%s is not an open pipe: no stats to the agent\"", RL_ENV_STATS_FD);
        return;
    }
    int fl = fcntl((int)fd, F_GETFL);
    if (fl < 0 || fcntl((int)fd, F_SETFL, fl | O_NONBLOCK) != 0) return;
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    /* a write to a pipe whose reader is gone raises SIGPIPE, which would
     * kill a trainer over a metric; ignored, it is an EPIPE we drop */
    struct sigaction sa = {0};
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    w->fd = (int)fd;
}

bool rl_stats_send(rl_stats_writer *w, const rl_stats_msg *m) {
    if (!w || w->fd < 0) return false;
    char buf[RL_STATS_LINE_MAX];
    size_t n = rl_stats_format(m, buf, sizeof buf);
    /* one write of at most PIPE_BUF bytes on a non-blocking pipe: all of
     * it, or EAGAIN and nothing (never half a line, never a wait) */
    ssize_t k = n ? write(w->fd, buf, n) : -1;
    if (k == (ssize_t)n && n > 0) {
        w->sent++;
        return true;
    }
    if (w->dropped++ == 0)
        rl_log(RL_LOG_DEBUG, "stats_dropped", "\"msg\":\"the agent's stats pipe is full or gone: dropping lines\"");
    return false;
}

void rl_stats_reader_init(rl_stats_reader *r, int fd) {
    memset(r, 0, sizeof *r);
    r->fd = fd;
}

int rl_stats_read(rl_stats_reader *r, rl_stats_fn fn, void *ud) {
    int seen = 0;
    /* a pipe holds 64 KiB: 32 reads of up to 4 KiB empty it, and the
     * bound keeps a flooding trainer from holding the agent's loop */
    for (int round = 0; round < 32 && r->fd >= 0; round++) {
        ssize_t k = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        r->len += (size_t)k;
        size_t start = 0;
        for (size_t i = 0; i < r->len; i++) {
            if (r->buf[i] != '\n') continue;
            if (!r->skipping) {
                rl_stats_msg m;
                if (rl_stats_parse(r->buf + start, i - start, &m, NULL) == RL_OK) {
                    r->lines++, seen++;
                    if (fn) fn(ud, &m);
                } else {
                    r->bad++;
                }
            }
            r->skipping = false;
            start = i + 1;
        }
        memmove(r->buf, r->buf + start, r->len - start);
        r->len -= start;
        if (r->len == sizeof r->buf) { /* no newline in a whole buffer: not ours */
            r->skipping = true, r->len = 0, r->bad++;
        }
    }
    return seen;
}
