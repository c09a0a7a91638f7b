/* metrics: Prometheus exposition and the trainer -> agent stats line.
 *
 * A registry of named gauges and counters (doubles under one mutex, so
 * any thread may update them while the HTTP thread renders), rendered in
 * the Prometheus text format 0.0.4, and a small HTTP server on
 * libmicrohttpd serving GET /metrics and GET /healthz from one internal
 * polling thread, with a connection limit and an idle timeout, so a slow
 * or stuck scraper can neither pile up threads nor hold the agent.
 *
 * The stats line is how a trainer process tells its node agent about
 * each optimizer step and checkpoint: one short JSON object per line on a
 * pipe the agent created (RINGLEADER_STATS_FD). Writes are non-blocking
 * and at most PIPE_BUF bytes, hence atomic: a full pipe drops the line,
 * never delays training, and never leaves half a line. */
#ifndef RL_METRICS_H
#define RL_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "util/util.h"

/* ---- the registry ------------------------------------------------------------------- */
typedef enum {
    RL_METRIC_GAUGE,   /* absent until first set */
    RL_METRIC_COUNTER, /* starts at 0 (a counter that exists reads 0, not "unknown") */
    /* A gauge whose stored value is a unix time and which renders as the
     * seconds since then, computed at scrape time (an age that keeps
     * growing between updates, e.g. since the last checkpoint). */
    RL_METRIC_AGE,
} rl_metric_kind;

#define RL_METRICS_MAX 64

typedef struct rl_metrics rl_metrics;

int rl_metrics_new(rl_metrics **out, rl_err *e);
void rl_metrics_free(rl_metrics *m);
/* Register a metric; *id is its handle. Names follow Prometheus
 * ([a-zA-Z_:][a-zA-Z0-9_:]*); an optional constant label set may follow
 * in braces ("x_info{version=\"1\"}"). RL_EINPUT for a bad or duplicate
 * name, RL_ENOMEM past RL_METRICS_MAX. Rendered in registration order. */
int rl_metrics_define(rl_metrics *m, rl_metric_kind kind, const char *name, const char *help, int *id,
                      rl_err *e);
/* Replace a metric's label set with pairs (name, value, ..., NULL; values
 * escaped as the format wants; NULL or none: no labels): a fixed number
 * of slots, defined together, rendered as one family, serves a label set
 * only known at run time (ringleader_straggler{rank,pod,node}). RL_EINPUT
 * when it would not fit. Label names are the caller's constants. */
int rl_metrics_relabel(rl_metrics *m, int id, const char *const *pairs, rl_err *e);
/* Updates (ignored for an invalid id). set on a counter is allowed (a
 * counter mirrored from elsewhere); inc adds, and makes a gauge present. */
void rl_metrics_set(rl_metrics *m, int id, double v);
void rl_metrics_inc(rl_metrics *m, int id, double dv);
/* A gauge back to absent (the sample disappears from the exposition). */
void rl_metrics_clear(rl_metrics *m, int id);
/* The stored value; false when absent. */
bool rl_metrics_get(rl_metrics *m, int id, double *v);
/* The exposition text (malloc'd, NUL-terminated), AGE metrics computed
 * against now_unix (rl_wall_now() for a scrape). Metrics without a value
 * are left out entirely. NULL when out of memory. */
char *rl_metrics_render(rl_metrics *m, double now_unix);
/* A sample value as Prometheus writes it: the shortest text that reads
 * back as the same double, "NaN", "+Inf", "-Inf". */
void rl_metrics_format_value(double v, char *out, size_t n);

/* ---- the HTTP server -------------------------------------------------------------------- */
typedef struct rl_metrics_server rl_metrics_server;

/* Listen on addr:port (addr NULL or "": 0.0.0.0; IPv4 or IPv6 literal)
 * and serve m. port 0: disabled -- *out is NULL and the call succeeds.
 * RL_METRICS_ANY_PORT: a free port chosen by the kernel (tests; see
 * rl_metrics_server_port). A port that cannot be bound is RL_EINPUT
 * naming the address, the port and why ("address already in use"). */
#define RL_METRICS_ANY_PORT (-1)
int rl_metrics_start(int port, const char *addr, rl_metrics *m, rl_metrics_server **out, rl_err *e);
int rl_metrics_server_port(const rl_metrics_server *s);
/* Stops the thread and closes every connection (NULL is fine). */
void rl_metrics_stop(rl_metrics_server *s);

/* ---- the stats line (trainer -> agent) ---------------------------------------------------- */
#define RL_ENV_STATS_FD "RINGLEADER_STATS_FD"
/* At most this many bytes per line, newline included (PIPE_BUF on Linux:
 * the largest write the kernel keeps whole). */
#define RL_STATS_LINE_MAX 4096

typedef enum {
    RL_STATS_STEP = 1, RL_STATS_CKPT = 2, RL_STATS_HUNG = 3, RL_STATS_PACE = 4, RL_STATS_DEGRADED = 5
} rl_stats_kind;
#define RL_STATS_SLOW_MAX 4
typedef struct rl_stats_msg {
    rl_stats_kind kind;
    long long step;        /* optimizer steps done / the checkpoint's step */
    /* RL_STATS_STEP */
    long long steps;       /* the job's total */
    double loss, lr, grad_norm;
    double tokens_per_s;   /* tokens of this step (all ranks) / its wall time */
    double step_s;
    double allreduce_s;    /* exposed gradient reduction after backward; < 0: none (one process) */
    double allreduce_busy_s; /* the reduction's whole busy time; < 0: none */
    double flops_per_token; /* model FLOPs of one trained token (forward + backward) */
    int world;
    /* RL_STATS_CKPT */
    double ckpt_s;         /* snapshot to commit; < 0: unknown (a resumed checkpoint) */
    double ckpt_unix;      /* when it was committed */
    bool resumed;          /* the checkpoint this run resumed from, not a new save */
    char uri[1200];        /* the checkpoint's location: <checkpoint.uri>/step-NNNNNNNN;
                              RL_STATS_HUNG: the dump's ("": only logged) */
    /* RL_STATS_HUNG (pkg/hang): rank 0 diagnosed a stuck collective */
    char why[512];         /* the verdict, naming the rank(s); RL_STATS_PACE: the stragglers ("" none);
                              RL_STATS_DEGRADED: the ranks below the pre-flight's median */
    /* RL_STATS_PACE (pkg/hang): rank 0's straggler judgement changed; RL_STATS_DEGRADED: the ranks
     * below the pre-flight's median (ratio: the lower of their figures over the median's) */
    int nslow;
    struct {
        int rank;
        double ratio;      /* its busy time per step / the median rank's */
        char pod[64], node[64];
    } slow[RL_STATS_SLOW_MAX];
} rl_stats_msg;

/* One line, '\n' included; returns its length, or 0 when it does not fit
 * in n (or RL_STATS_LINE_MAX). */
size_t rl_stats_format(const rl_stats_msg *m, char *buf, size_t n);
/* One line (without or with its '\n'). Unknown members are ignored, so
 * trainer and agent of different builds still talk. RL_EINPUT when it
 * is not a stats line. Fuzzable. */
int rl_stats_parse(const char *line, size_t len, rl_stats_msg *m, rl_err *e);

/* The trainer's end. fd < 0: not connected (every send is a no-op). */
typedef struct rl_stats_writer {
    int fd;
    long long sent, dropped;
} rl_stats_writer;
/* fd_text: the value of RINGLEADER_STATS_FD the agent gave (cmd/ reads
 * it; NULL: none). Connected when it names an open pipe or socket; the fd
 * is made non-blocking and close-on-exec, and SIGPIPE is ignored (a
 * vanished agent must not kill the trainer; its own EPIPE is just a
 * dropped line). Malformed values are ignored (logged at debug). */
void rl_stats_writer_open(rl_stats_writer *w, const char *fd_text);
/* Never blocks: true when the line went out whole, false when dropped. */
bool rl_stats_send(rl_stats_writer *w, const rl_stats_msg *m);

/* The agent's end: lines from a non-blocking fd. */
typedef struct rl_stats_reader {
    int fd;
    char buf[RL_STATS_LINE_MAX];
    size_t len;
    bool skipping; /* inside an over-long line: drop up to its newline */
    long long lines, bad;
} rl_stats_reader;
void rl_stats_reader_init(rl_stats_reader *r, int fd);
/* Read what is there now (never blocks) and call fn for each parsed
 * line; unparsable lines are counted and skipped. Returns lines seen. */
typedef void (*rl_stats_fn)(void *ud, const rl_stats_msg *m);
int rl_stats_read(rl_stats_reader *r, rl_stats_fn fn, void *ud);

#endif
