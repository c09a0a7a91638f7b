/* The agent <-> trainer control channel for in-place recovery (agent.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "comm/comm.h"

/* ---- the wire: one short text message per packet ---------------------------------------- */
int rl_ctl_round_format(const rl_ctl_round *r, char *dst, size_t n) {
    int w = snprintf(dst, n, "round %d %d %d %d %s %s", r->rank, r->world, r->group_rank, r->master_port, r->prefix,
                     r->master_addr);
    return w > 0 && (size_t)w < n ? w : -1;
}

/* A decimal in [lo, hi] followed by one space (or the end, when last). */
static const char *num(const char *p, const char *end, int lo, int hi, int *out) {
    long v = 0;
    const char *s = p;
    while (p < end && *p >= '0' && *p <= '9' && p - s < 9) v = v * 10 + (*p++ - '0');
    if (p == s || v < lo || v > hi || p >= end || *p != ' ') return NULL;
    *out = (int)v;
    return p + 1;
}

/* A token of [A-Za-z0-9._:/-] up to a space or the end, into dst. */
static const char *word(const char *p, const char *end, char *dst, size_t n, bool last) {
    size_t k = 0;
    while (p < end && *p != ' ') {
        char c = *p++;
        /* c && ...: strchr finds a NUL too */
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  (c && strchr("._:/-", c));
        if (!ok || k + 1 >= n) return NULL;
        dst[k++] = c;
    }
    dst[k] = 0;
    if (!k || (last ? p != end : (p >= end || *p != ' '))) return NULL;
    return last ? p : p + 1;
}

int rl_ctl_round_parse(const char *msg, size_t len, rl_ctl_round *r, rl_err *e) {
    const char *end = msg + len, *p = msg;
    memset(r, 0, sizeof *r);
    if (len < 6 || memcmp(p, "round ", 6) != 0) goto bad;
    p += 6;
    if (!(p = num(p, end, 0, 1 << 20, &r->rank)) || !(p = num(p, end, 1, 1 << 20, &r->world)) ||
        !(p = num(p, end, 0, 1 << 16, &r->group_rank)) || !(p = num(p, end, 1, 65535, &r->master_port)) ||
        !(p = word(p, end, r->prefix, sizeof r->prefix, false)) ||
        !word(p, end, r->master_addr, sizeof r->master_addr, true) || r->rank >= r->world)
        goto bad;
    return RL_OK;
bad:
    memset(r, 0, sizeof *r);
    return rl_errf(e, RL_EINPUT, "control channel: a malformed round message (%zu bytes)", len);
}

/* ---- the trainer's side -------------------------------------------------------------------- */
struct rl_ctl {
    int fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rl_comm *comm;      /* what a "park" aborts (NULL: between rounds) */
    bool park_asked;    /* since the last round message */
    volatile int yield; /* "yield" since the last round message (the trainer reads it at its steps) */
    volatile int over;  /* the round is over for this trainer: what forms it gives up (rl_ctl_cancel_flag) */
    bool steady;        /* the round's ring is whole (rl_ctl_steady) since the last arm or round message */
    bool have_round, closed;
    volatile int stop;
    rl_ctl_round next;
};

/* The round is over for this trainer (mu held): the op its ring waits in
 * ends now, and so does any wait of its forming (store, ring, NCCL init). */
static void end_round(rl_ctl *c) {
    c->over = 1;
    if (c->comm) rl_comm_abort(c->comm);
}

static void on_message(rl_ctl *c, const char *m, size_t len) {
    pthread_mutex_lock(&c->mu);
    if (len == 4 && memcmp(m, "park", 4) == 0) {
        c->park_asked = true;
        end_round(c); /* the ring may wait on a peer that is gone */
    } else if (len == 5 && memcmp(m, "yield", 5) == 0) {
        /* a whole ring agrees on a step to leave after; one still forming
         * may wait for a peer that has moved on, and holds no step of this
         * round to lose: end it as a park does */
        c->yield = 1;
        if (!c->steady) end_round(c);
    } else {
        rl_err e = {0};
        if (rl_ctl_round_parse(m, len, &c->next, &e) == RL_OK)
            c->have_round = true, c->park_asked = false, c->yield = 0, c->over = 0, c->steady = false;
        else rl_log_msg(RL_LOG_ERROR, "ctl_bad_message", e.msg);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *ctl_thread(void *arg) {
    rl_ctl *c = arg;
    char m[512];
    while (!c->stop) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int r = poll(&p, 1, 200);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) continue;
        ssize_t n = r > 0 ? recv(c->fd, m, sizeof m, MSG_DONTWAIT) : -1;
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) break; /* the agent closed it (or is gone): no more rounds */
        on_message(c, m, (size_t)n);
    }
    pthread_mutex_lock(&c->mu);
    c->closed = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int rl_ctl_open(const char *fd_str, rl_ctl **out, rl_err *e) {
    *out = NULL;
    char *end;
    long fd = fd_str ? strtol(fd_str, &end, 10) : -1;
    if (!fd_str || end == fd_str || *end || fd < 3 || fd > 1 << 20)
        return rl_errf(e, RL_EINPUT, "%s: \"%.20s\" is not a file descriptor", RL_ENV_CTL_FD, fd_str ? fd_str : "");
    rl_ctl *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "control channel: out of memory");
    c->fd = (int)fd;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->thread, NULL, ctl_thread, c) != 0) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return rl_errf(e, RL_EINTERNAL, "control channel: cannot start its thread");
    }
    *out = c;
    return RL_OK;
}

bool rl_ctl_arm(rl_ctl *c, rl_comm *comm) {
    if (!c) return true;
    pthread_mutex_lock(&c->mu);
    c->comm = comm;
    c->steady = false;
    bool ok = !c->over || !comm;
    if (!ok) rl_comm_abort(comm);
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void rl_ctl_steady(rl_ctl *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->steady = true;
    pthread_mutex_unlock(&c->mu);
}

const volatile int *rl_ctl_yield_flag(const rl_ctl *c) { return c ? &c->yield : NULL; }
const volatile int *rl_ctl_cancel_flag(const rl_ctl *c) { return c ? &c->over : NULL; }

int rl_ctl_park(rl_ctl *c, long long step, bool yielded, const char *why, const volatile int *stop,
                rl_ctl_round *next, rl_err *e) {
    char m[512];
    int w = snprintf(m, sizeof m, "%s %lld %.400s", yielded ? "yielded" : "parked", step, why);
    pthread_mutex_lock(&c->mu);
    c->comm = NULL;
    c->have_round = false;
    pthread_mutex_unlock(&c->mu);
    if (send(c->fd, m, (size_t)(w < (int)sizeof m ? w : (int)sizeof m - 1), MSG_NOSIGNAL) < 0)
        return rl_errf(e, RL_EABORT, "control channel: the agent is gone");
    pthread_mutex_lock(&c->mu);
    /* no deadline: the agent decides (a new round, or closing the channel,
     * which it does before it stops) and dies with us (PR_SET_PDEATHSIG) */
    while (!c->have_round && !c->closed && !(stop && *stop)) rl_cond_wait_s(&c->cv, &c->mu, 0.2);
    bool got = c->have_round;
    if (got) *next = c->next, c->have_round = false;
    pthread_mutex_unlock(&c->mu);
    return got ? RL_OK : rl_errf(e, RL_EABORT, "parked after step %lld, and the agent ended it", step);
}

void rl_ctl_close(rl_ctl *c) {
    if (!c) return;
    c->stop = true;
    pthread_join(c->thread, NULL);
    close(c->fd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
