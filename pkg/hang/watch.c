/* The hang watch: heartbeats, rank 0's judging, the gather, the dump,
 * the report and the abort (hang.h says the protocol). */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hang.h"
#include "metrics/metrics.h"
#include "store/store.h"

struct rl_hang_watch {
    rl_hang_watch_opts o;
    char host[256], prefix[64], pod[64], node[64], secret[256];
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, failed;               /* under mu */
    double steps[RL_HANG_STEPS];     /* under mu: recent step times, a ring */
    double busy_total, busy_steps;   /* under mu: running totals (hang.h, stragglers) */
    int nsteps;
    long long step;
    double last_step_end;            /* under mu: rl_now() of the previous step's end; 0 none */
    bool fired;                      /* under mu */
    double net_gbps;                 /* under mu: the pre-flight's network figure (0: none) */
    bool net_pending;                /* under mu: ... not measured yet */
    char why[512];
    /* the thread's own */
    rl_store *s;
    uint64_t answered;               /* the ask this rank answered */
    double next_beat, next_pace, preflight_by; /* preflight_by: 0 once judged */
    bool rechecked;                  /* it measured its node again (hang.h, the pre-flight) */
    enum { PF_FIGURES, PF_SUSPECT, PF_RECHECK } pf; /* rank 0: where its pre-flight is */
    long long suspect_step;          /* rank 0: its step when the first figures named ranks */
    bool *suspect;                   /* rank 0: ... and which (world of them) */
    uint64_t beat0;                  /* deputy: a hash of rank 0's last heartbeat */
    double beat0_changed;            /* ... and when it last changed (rl_now) */
    char pace[512];                  /* the stragglers last reported */
    double *mark[2];                 /* rank 0: each rank's busy totals, the last two pace periods: */
    int marks;                       /* [0] busy, [1] steps, world of each; marks taken so far */
};

/* Sleeps up to s; false once stopping. */
static bool nap(rl_hang_watch *w, double s) {
    pthread_mutex_lock(&w->mu);
    if (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + ts.tv_nsec / 1e9 + s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    bool go = !w->stop;
    pthread_mutex_unlock(&w->mu);
    return go;
}

static void key(const rl_hang_watch *w, char *dst, size_t n, const char *what, int rank) {
    if (rank >= 0) snprintf(dst, n, "%s/hang/%s/%d", w->prefix, what, rank);
    else snprintf(dst, n, "%s/hang/%s", w->prefix, what);
}

/* This rank as it stands now, with its records. */
static int snapshot(rl_hang_watch *w, rl_hang_rank *me, rl_comm_record *rec) {
    int n = rl_comm_records(w->o.comm, rec, RL_COMM_RECORDS);
    *me = (rl_hang_rank){.rank = w->o.rank, .seen = true, .answered = true, .unix_time = rl_wall_now()};
    pthread_mutex_lock(&w->mu);
    me->step = w->step;
    me->busy_total = w->busy_total, me->busy_steps = w->busy_steps;
    me->net_gbps = w->net_gbps, me->net_pending = w->net_pending;
    pthread_mutex_unlock(&w->mu);
    if (n > 0) {
        me->issued = rec[n - 1].seq;
        snprintf(me->op, sizeof me->op, "%s", rec[n - 1].op ? rec[n - 1].op : "");
    }
    for (int i = 0; i < n; i++)
        if (rec[i].t_done > 0 && rec[i].seq > me->done) me->done = rec[i].seq;
    me->shm_bytes = w->o.shm_bytes, me->copy_gbps = w->o.copy_gbps, me->rechecked = w->rechecked;
    snprintf(me->pod, sizeof me->pod, "%s", w->pod);
    snprintf(me->node, sizeof me->node, "%s", w->node);
    return n;
}

/* The heartbeat, or (with records) the answer to an ask. */
static int publish(rl_hang_watch *w, const char *what, bool records, rl_err *e) {
    rl_hang_rank me;
    rl_comm_record rec[RL_COMM_RECORDS];
    int n = snapshot(w, &me, rec);
    char *j = rl_hang_rank_json(&me, rec, records ? n : 0, rl_now(), me.unix_time);
    if (!j) return rl_errf(e, RL_ENOMEM, "hang watch: no memory for a heartbeat");
    char k[160];
    key(w, k, sizeof k, what, w->o.rank);
    int rc = rl_store_set(w->s, k, j, strlen(j), e);
    free(j);
    return rc;
}

/* True, with the next one scheduled, when a heartbeat is due. */
static bool beat_due(rl_hang_watch *w, double now) {
    if (now < w->next_beat) return false;
    w->next_beat = now + RL_HANG_BEAT_S;
    return true;
}

static void fire(rl_hang_watch *w, const char *why) {
    pthread_mutex_lock(&w->mu);
    w->fired = true;
    snprintf(w->why, sizeof w->why, "%s", why);
    pthread_mutex_unlock(&w->mu);
}

/* The pre-flight's second measurement, once, in the next heartbeat (hang.h
 * says why). */
static int remeasure(rl_hang_watch *w, rl_err *e) {
    if (w->rechecked) return RL_OK;
    rl_hang_measure(&w->o.shm_bytes, &w->o.copy_gbps);
    w->rechecked = true;
    return publish(w, "beat", false, e);
}

/* ---- every rank but 0: answer rank 0's ask, obey its abort ---------------------------------- */
/* *aborted once it aborted the communicator; *judging while a rank asks. */
static int follow(rl_hang_watch *w, bool *aborted, bool *judging, rl_err *e) {
    char k[160];
    void *v = NULL;
    size_t len;
    key(w, k, sizeof k, "state", -1);
    int rc = rl_store_get(w->s, k, 0, &v, &len, e);
    if (rc == RL_ETIMEOUT) return RL_OK; /* nothing asked */
    if (rc) return rc;
    unsigned long long seq = 0;
    char verb[8] = "";
    int by = 0;
    if (sscanf(v, "%7s %llu %d", verb, &seq, &by) != 3) seq = 0;
    free(v);
    if (!strcmp(verb, "recheck")) return remeasure(w, e); /* the pre-flight's, not an ask */
    *judging = true;
    if (by == w->o.rank) return RL_OK; /* this rank's own ask (the deputy) */
    if (!strcmp(verb, "ask") && seq && seq != w->answered) {
        w->answered = seq;
        rl_comm_dump_all(); /* into this rank's log too */
        return publish(w, "records", true, e);
    }
    if (strcmp(verb, "abort") != 0 || !seq) return RL_OK;
    char why[512];
    snprintf(why, sizeof why, "rank %d found a hang", by);
    key(w, k, sizeof k, "verdict", -1);
    if (rl_store_get(w->s, k, 0, &v, &len, e) == RL_OK) {
        snprintf(why, sizeof why, "rank %d found a hang: %.480s", by, (const char *)v);
        free(v);
    }
    fire(w, why);
    rl_comm_abort(w->o.comm);
    *aborted = true;
    return RL_OK;
}

/* ---- rank 0: judge, gather, name, dump, report, abort --------------------------------------- */
static double deadline_now(rl_hang_watch *w) {
    pthread_mutex_lock(&w->mu);
    double d = rl_hang_deadline(w->steps, w->nsteps < RL_HANG_STEPS ? w->nsteps : RL_HANG_STEPS, w->o.factor,
                                w->o.min_s);
    pthread_mutex_unlock(&w->mu);
    return d;
}

static void report(rl_hang_watch *w, rl_stats_msg *m) {
    pthread_mutex_lock(&w->mu);
    m->step = w->step;
    pthread_mutex_unlock(&w->mu);
    if (w->o.report) w->o.report(w->o.report_ud, m);
}

/* Rank r's last heartbeat into *out ({.rank = r}, not seen, where there
 * is none or it does not parse as rank r's); its text, malloc'd, for the
 * dump (NULL: none). */
static char *beat_of(rl_hang_watch *w, int r, rl_hang_rank *out) {
    rl_err e = {0};
    char k[160];
    void *v = NULL;
    size_t len;
    key(w, k, sizeof k, "beat", r);
    if (rl_store_get(w->s, k, 0, &v, &len, &e) != RL_OK || rl_hang_rank_parse(v, len, k, out, &e) != RL_OK ||
        out->rank != r)
        *out = (rl_hang_rank){.rank = r};
    return v;
}

/* Every rank's last heartbeat (ranks[r].seen false where none). */
static void read_beats(rl_hang_watch *w, rl_hang_rank *ranks) {
    for (int r = 0; r < w->o.world; r++) free(beat_of(w, r, &ranks[r]));
}

/* Each rank's pace over the last two pace periods: the difference of its
 * running totals against the mark taken two periods ago (hang.h). */
static void pace_window(rl_hang_watch *w, rl_hang_rank *ranks) {
    int world = w->o.world;
    double *old = w->mark[w->marks % 2];
    for (int r = 0; r < world; r++) {
        double db = ranks[r].busy_total - old[r], ds = ranks[r].busy_steps - old[world + r];
        ranks[r].busy_s = w->marks >= 2 && ranks[r].seen && ds >= RL_HANG_MIN_STEPS && db > 0 ? db / ds : 0;
        old[r] = ranks[r].busy_total, old[world + r] = ranks[r].busy_steps;
    }
    w->marks++;
}

/* Rank 0, every RL_HANG_PACE_S: the stragglers, reported when they change. */
static void pace(rl_hang_watch *w) {
    int world = w->o.world;
    rl_hang_rank *ranks = calloc((size_t)world, sizeof *ranks);
    if (!ranks) return;
    read_beats(w, ranks);
    pace_window(w, ranks);
    rl_hang_slow slow[RL_STATS_SLOW_MAX];
    rl_stats_msg m = {.kind = RL_STATS_PACE};
    int found = rl_hang_stragglers(ranks, world, w->o.straggler_factor, slow, RL_STATS_SLOW_MAX, m.why, sizeof m.why);
    if (strcmp(m.why, w->pace) != 0 && (found || w->pace[0])) {
        for (int i = 0; i < found && i < RL_STATS_SLOW_MAX; i++) {
            const rl_hang_rank *r = &ranks[slow[i].rank];
            m.slow[i].rank = slow[i].rank, m.slow[i].ratio = slow[i].ratio;
            snprintf(m.slow[i].pod, sizeof m.slow[i].pod, "%s", r->pod);
            snprintf(m.slow[i].node, sizeof m.slow[i].node, "%s", r->node);
        }
        m.nslow = found < RL_STATS_SLOW_MAX ? found : RL_STATS_SLOW_MAX;
        char j[1100];
        rl_log(found ? RL_LOG_WARN : RL_LOG_INFO, "stragglers", "\"count\":%d,\"msg\":\"%s\"", found,
               rl_json_escape(j, sizeof j, found ? m.why : "none now"));
        report(w, &m);
    }
    snprintf(w->pace, sizeof w->pace, "%s", m.why);
    free(ranks);
}

/* The nodes far below -- under half the ratio that names them, so a node a
 * busy moment slowed is named, not left out -- each once: an elastic job
 * may leave them out (rdzv.bench_s). */
static void far_below(const rl_hang_watch *w, const rl_hang_rank *ranks, const double *ratio, rl_stats_msg *m) {
    for (int r = 0; r < w->o.world && m->nslow < RL_STATS_SLOW_MAX; r++) {
        bool seen = false;
        for (int k = 0; k < m->nslow; k++) seen |= strcmp(m->slow[k].pod, ranks[r].pod) == 0;
        if (ratio[r] >= w->o.preflight_min_ratio / 2 || seen) continue;
        m->slow[m->nslow].rank = r, m->slow[m->nslow].ratio = ratio[r];
        snprintf(m->slow[m->nslow].pod, sizeof m->slow[0].pod, "%s", ranks[r].pod);
        snprintf(m->slow[m->nslow].node, sizeof m->slow[0].node, "%s", ranks[r].node);
        m->nslow++;
    }
}

/* The nodes' network figures as judged, "rank:GB/s,..." (the first 16). */
static void node_nets(const rl_hang_rank *ranks, int world, double *net, char *out, size_t n) {
    out[0] = 0;
    rl_hang_node_net(ranks, world, net);
    for (int r = 0, k = 0, at = 0; r < world && k < 16 && (size_t)at < n; r++)
        if (net[r] > 0) at += snprintf(out + at, n - (size_t)at, "%s%d:%.2f", k++ ? "," : "", r, net[r]);
}

static long long steps_done(rl_hang_watch *w) {
    pthread_mutex_lock(&w->mu);
    long long s = w->step;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Rank 0's pre-flight, in three phases (hang.h): the first figures; when
 * they name ranks, RL_HANG_RECHECK_STEPS steps (or RL_HANG_PREFLIGHT_S)
 * for every rank to reach the steps' rhythm; then every rank's second
 * figures. The last verdict is reported either way, so a round that
 * passes clears what an earlier one found. */
static void preflight(rl_hang_watch *w, double now) {
    char j[1100], k[160];
    rl_err e = {0};
    if (w->pf == PF_SUSPECT) {
        if (steps_done(w) < w->suspect_step + RL_HANG_RECHECK_STEPS && now < w->preflight_by) return;
        key(w, k, sizeof k, "state", -1);
        (void)rl_store_set(w->s, k, "recheck 1 0", strlen("recheck 1 0"), &e);
        (void)remeasure(w, &e);
        w->pf = PF_RECHECK, w->preflight_by = now + RL_HANG_RECHECK_S;
        return;
    }
    int world = w->o.world, have = 0;
    rl_hang_rank *ranks = calloc((size_t)world, sizeof *ranks);
    double *ratio = calloc((size_t)world, sizeof *ratio), *net = calloc((size_t)world, sizeof *net);
    if (!ranks || !ratio || !net) goto out;
    read_beats(w, ranks);
    bool pending = false;
    for (int r = 0; r < world; r++) {
        have += ranks[r].copy_gbps > 0 && (ranks[r].rechecked || w->pf == PF_FIGURES), pending |= ranks[r].net_pending;
        ranks[r].passed_first = w->pf == PF_RECHECK && !w->suspect[r];
    }
    rl_stats_msg m = {.kind = RL_STATS_DEGRADED};
    int bad = rl_hang_preflight(ranks, world, w->o.preflight_min_ratio, m.why, sizeof m.why, ratio);
    /* a link still being measured is waited for, unless a node is below
     * already: a starved node is slow to measure its links too */
    bool ready = have == world && (!pending || bad > 0);
    if (!ready && now < w->preflight_by) goto out;
    /* a rank with no figures by the deadline is a suspect too: a node
     * starved enough may not even report in time (a CI run under ASan
     * judged the other two ranks and passed a 1 %-CPU rank that way) */
    int missing = 0;
    for (int r = 0; r < world; r++) missing += !(ranks[r].copy_gbps > 0);
    if ((bad > 0 || missing > 0) && w->pf == PF_FIGURES && (w->suspect = calloc((size_t)world, sizeof *w->suspect))) {
        size_t at = strlen(m.why);
        for (int r = 0; r < world; r++) {
            w->suspect[r] = ratio[r] < 1 || !(ranks[r].copy_gbps > 0);
            if (!(ranks[r].copy_gbps > 0) && at < sizeof m.why)
                at += (size_t)snprintf(m.why + at, sizeof m.why - at, "%srank %d: no figures in %.0f s", at ? "; " : "",
                                       r, RL_HANG_PREFLIGHT_S);
        }
        rl_log(RL_LOG_INFO, "preflight_recheck", "\"below\":%d,\"missing\":%d,\"after_steps\":%d,\"msg\":\"%s\"",
               bad, missing, RL_HANG_RECHECK_STEPS, rl_json_escape(j, sizeof j, m.why));
        w->pf = PF_SUSPECT, w->suspect_step = steps_done(w), w->preflight_by = now + RL_HANG_PREFLIGHT_S;
        goto out;
    }
    w->preflight_by = 0;
    far_below(w, ranks, ratio, &m);
    char nets[400];
    node_nets(ranks, world, net, nets, sizeof nets);
    rl_log(bad ? RL_LOG_WARN : RL_LOG_INFO, "preflight", "\"ranks\":%d,\"below\":%d,\"net_gbps\":\"%s\",\"msg\":\"%s\"",
           have, bad, nets, rl_json_escape(j, sizeof j, bad ? m.why : "every rank within the median's range"));
    report(w, &m);
out:
    free(net);
    free(ratio);
    free(ranks);
}

/* What each rank said: answers (text kept for the dump) within the gather
 * window, else its last heartbeat. */
static void gather(rl_hang_watch *w, rl_hang_rank *ranks, char **texts) {
    int world = w->o.world, missing = world - 1;
    double end = rl_now() + RL_HANG_GATHER_S;
    rl_err e = {0};
    char k[160];
    for (;;) {
        for (int r = 0; r < world; r++) {
            if (ranks[r].answered) continue; /* this rank's own included */
            void *v = NULL;
            size_t len;
            key(w, k, sizeof k, "records", r);
            if (rl_store_get(w->s, k, 0, &v, &len, &e) != RL_OK) continue;
            if (rl_hang_rank_parse(v, len, k, &ranks[r], &e) == RL_OK && ranks[r].rank == r) {
                ranks[r].answered = true, texts[r] = v, missing--;
            } else {
                free(v);
                memset(&ranks[r], 0, sizeof ranks[r]);
            }
        }
        if (!missing || rl_now() >= end || !nap(w, 0.1)) break;
        if (beat_due(w, rl_now())) (void)publish(w, "beat", false, &e); /* alive: no deputy takes over */
    }
    for (int r = 0; r < world; r++)
        if (!ranks[r].answered) texts[r] = beat_of(w, r, &ranks[r]);
}

/* The dump: the stuck op, the verdict, and every rank's answer or heartbeat. */
static char *dump_json(const rl_hang_watch *w, const rl_comm_record *stuck, double deadline, const char *verdict,
                       const rl_hang_rank *ranks, char *const *texts) {
    cJSON *o = cJSON_CreateObject(), *a = o ? cJSON_AddArrayToObject(o, "ranks") : NULL;
    if (!a) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(o, "round", w->prefix);
    cJSON_AddStringToObject(o, "backend", rl_comm_backend(w->o.comm));
    cJSON_AddStringToObject(o, "op", stuck->op);
    cJSON_AddNumberToObject(o, "seq", (double)stuck->seq);
    cJSON_AddNumberToObject(o, "bytes", (double)stuck->bytes);
    cJSON_AddNumberToObject(o, "running_s", rl_now() - stuck->t_issue);
    cJSON_AddNumberToObject(o, "deadline_s", deadline);
    cJSON_AddNumberToObject(o, "detected_unix", rl_wall_now() - (rl_now() - stuck->t_issue - deadline));
    cJSON_AddNumberToObject(o, "dumped_unix", rl_wall_now());
    cJSON_AddStringToObject(o, "verdict", verdict);
    for (int r = 0; r < w->o.world; r++) {
        cJSON *x = texts[r] ? cJSON_Parse(texts[r]) : NULL;
        if (!cJSON_IsObject(x)) {
            cJSON_Delete(x);
            x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "rank", r);
        }
        cJSON_AddBoolToObject(x, "answered", ranks[r].answered);
        cJSON_AddItemToArray(a, x);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* Next to the checkpoints; the location in *where ("" when only logged). */
static void write_dump(const rl_hang_watch *w, const char *text, uint64_t seq, char *where, size_t n) {
    where[0] = '\0';
    if (!w->o.ckpt || !w->o.ckpt->uri[0]) {
        rl_log_msg(RL_LOG_WARN, "hang_dump", "no checkpoint.uri: every rank logged its comm_records instead");
        return;
    }
    rl_ckpt_store *cs = NULL;
    rl_err e = {0};
    char k[128];
    snprintf(k, sizeof k, "hangs/%s-seq%llu.json", w->prefix, (unsigned long long)seq);
    rl_ckpt_part part = {text, strlen(text)};
    if (rl_ckpt_store_open_cfg(w->o.ckpt, &cs, &e) || rl_ckpt_put(cs, k, &part, 1, &e)) {
        char j[700];
        rl_log(RL_LOG_ERROR, "hang_dump", "\"msg\":\"%s\"", rl_json_escape(j, sizeof j, e.msg));
    } else {
        snprintf(where, n, "%s/%s", cs->uri, k);
    }
    rl_ckpt_store_close(cs);
}

static void diagnose(rl_hang_watch *w, const rl_comm_record *stuck, double deadline) {
    int world = w->o.world;
    rl_hang_rank *ranks = calloc((size_t)world, sizeof *ranks);
    char **texts = calloc((size_t)world, sizeof *texts);
    rl_err e = {0};
    char k[160], state[64], verdict[512] = "", where[RL_CKPT_URI_MAX + 160] = "";
    if (!ranks || !texts) {
        snprintf(verdict, sizeof verdict, "%s #%llu ran past its deadline (no memory to gather records)", stuck->op,
                 (unsigned long long)stuck->seq);
        goto act;
    }
    int me = w->o.rank;
    key(w, k, sizeof k, "state", -1);
    snprintf(state, sizeof state, "ask %llu %d", (unsigned long long)stuck->seq, me);
    (void)rl_store_set(w->s, k, state, strlen(state), &e);
    rl_comm_record rec[RL_COMM_RECORDS];
    int n = snapshot(w, &ranks[me], rec);
    texts[me] = rl_hang_rank_json(&ranks[me], rec, n, rl_now(), ranks[me].unix_time);
    rl_comm_dump_all();
    gather(w, ranks, texts);
    rl_hang_verdict(ranks, world, stuck->seq, stuck->op, rl_wall_now(), verdict, sizeof verdict);
    char *dump = dump_json(w, stuck, deadline, verdict, ranks, texts);
    if (dump) write_dump(w, dump, stuck->seq, where, sizeof where);
    free(dump);
act:;
    char j[1200], u[2 * sizeof where];
    rl_log(RL_LOG_ERROR, "hang", "\"verdict\":\"%s\",\"deadline_s\":%.3f,\"dump\":\"%s\"",
           rl_json_escape(j, sizeof j, verdict), deadline, rl_json_escape(u, sizeof u, where));
    /* the agent: the progress Lease's annotations, the job's Hung condition */
    rl_stats_msg m = {.kind = RL_STATS_HUNG};
    snprintf(m.why, sizeof m.why, "%s", verdict);
    snprintf(m.uri, sizeof m.uri, "%s", where);
    report(w, &m);
    /* only now: everyone aborts */
    fire(w, verdict);
    key(w, k, sizeof k, "verdict", -1);
    (void)rl_store_set(w->s, k, verdict, strlen(verdict), &e);
    key(w, k, sizeof k, "state", -1);
    snprintf(state, sizeof state, "abort %llu %d", (unsigned long long)stuck->seq, w->o.rank);
    (void)rl_store_set(w->s, k, state, strlen(state), &e);
    /* a beat for every watch to read the abort and end its own ring with
     * the verdict, before this one's end (and, where this process hosts
     * the store, the store's) reaches them as a bare lost peer */
    (void)nap(w, RL_HANG_BEAT_S + 0.2);
    rl_comm_abort(w->o.comm);
    for (int r = 0; texts && r < world; r++) free(texts[r]);
    free(texts);
    free(ranks);
}

/* True once it diagnosed a hang (the communicator is aborted). */
static bool judge(rl_hang_watch *w) {
    double deadline = deadline_now(w);
    if (deadline <= 0) return false;
    rl_comm_record rec[RL_COMM_RECORDS];
    int n = rl_comm_records(w->o.comm, rec, RL_COMM_RECORDS);
    const rl_comm_record *stuck = rl_hang_stuck(rec, n, rl_now(), deadline);
    if (stuck) diagnose(w, stuck, deadline);
    return stuck != NULL;
}

/* The deputy: rank 0 cannot judge when it is the one that stopped. True
 * once it diagnosed a hang. */
static bool deputize(rl_hang_watch *w, double now) {
    char k[160];
    void *v = NULL;
    size_t len;
    rl_err e = {0};
    key(w, k, sizeof k, "beat", 0);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of rank 0's heartbeat: did it change? */
    if (rl_store_get(w->s, k, 0, &v, &len, &e) == RL_OK)
        for (size_t i = 0; i < len; i++) h = (h ^ ((const unsigned char *)v)[i]) * 1099511628211ull;
    free(v);
    if (h != w->beat0 || w->beat0_changed == 0) w->beat0 = h, w->beat0_changed = now;
    /* rank 0, alive, asks at its deadline: silent that long and a gather
     * more, with a second to spare on a loaded machine, it is not */
    double deadline = deadline_now(w);
    if (deadline <= 0 || now - w->beat0_changed < deadline + RL_HANG_GATHER_S + 1) return false;
    rl_comm_record rec[RL_COMM_RECORDS];
    int n = rl_comm_records(w->o.comm, rec, RL_COMM_RECORDS);
    const rl_comm_record *stuck = rl_hang_stuck(rec, n, now, deadline);
    if (stuck) diagnose(w, stuck, deadline);
    return stuck != NULL;
}

/* ---- the thread ----------------------------------------------------------------------------- */
static int connect_store(rl_hang_watch *w, rl_err *e) {
    /* small values only: a store that takes longer is gone */
    double t = w->o.timeout_s > 0 && w->o.timeout_s < 5 ? w->o.timeout_s : 5;
    int rc = rl_store_connect(w->host, w->o.store_port, t, &w->s, e);
    char id[48];
    snprintf(id, sizeof id, "rank-%d-hang", w->o.rank);
    if (!rc && w->secret[0]) rc = rl_store_auth(w->s, id, w->secret, strlen(w->secret), e);
    return rc;
}

static void *run(void *arg) {
    rl_hang_watch *w = arg;
    rl_err e = {0};
    int rc = connect_store(w, &e);
    double period = w->o.rank == 0 ? RL_HANG_TICK_S : RL_HANG_BEAT_S;
    bool aborted = false;
    while (!rc && !aborted && nap(w, period)) {
        double now = rl_now();
        if (beat_due(w, now)) {
            if ((rc = publish(w, "beat", false, &e))) break;
            if (w->o.rank == 0 && w->preflight_by > 0) preflight(w, now);
        }
        if (w->o.rank == 0 && w->o.straggler_factor > 0 && now >= w->next_pace) {
            w->next_pace = now + RL_HANG_PACE_S;
            pace(w);
        }
        bool judging = false;
        if (w->o.rank == 0) aborted = judge(w);
        else if (!(rc = follow(w, &aborted, &judging, &e)) && !aborted && !judging && w->o.deputy)
            aborted = deputize(w, now);
    }
    bool judging;
    if (!rc && !aborted && w->failed && w->o.rank != 0) rc = follow(w, &aborted, &judging, &e);
    if (rc) {
        char j[700];
        rl_log(RL_LOG_WARN, "hang_watch", "\"msg\":\"stopped: %s; hangs are left to dist.timeout_s\"",
               rl_json_escape(j, sizeof j, e.msg));
    }
    rl_store_close(w->s);
    w->s = NULL;
    return NULL;
}

static void watch_free(rl_hang_watch *w) {
    if (!w) return;
    free(w->suspect);
    free(w->mark[0]);
    free(w->mark[1]);
    free(w);
}

int rl_hang_watch_start(const rl_hang_watch_opts *o, rl_hang_watch **out, rl_err *e) {
    *out = NULL;
    if ((!(o->factor > 0) && !(o->straggler_factor > 0) && !(o->preflight_min_ratio > 0)) || o->world < 2)
        return RL_OK;
    if (!o->comm || !o->store_host || !o->prefix || o->rank < 0 || o->rank >= o->world)
        return rl_errf(e, RL_EINPUT, "hang watch: comm, store and prefix are required");
    if (o->secret && strlen(o->secret) >= sizeof ((rl_hang_watch *)0)->secret)
        return rl_errf(e, RL_EINPUT, "hang watch: the rendezvous secret is longer than %zu bytes",
                       sizeof ((rl_hang_watch *)0)->secret - 1);
    rl_hang_watch *w = calloc(1, sizeof *w);
    bool marks = w && o->rank == 0; /* only rank 0 judges the pace */
    if (!w || (marks && (!(w->mark[0] = calloc(2 * (size_t)o->world, sizeof(double))) ||
                         !(w->mark[1] = calloc(2 * (size_t)o->world, sizeof(double)))))) {
        watch_free(w);
        return rl_errf(e, RL_ENOMEM, "hang watch: no memory");
    }
    w->o = *o;
    w->net_pending = o->net_pending;
    if (o->preflight_min_ratio > 0) w->preflight_by = rl_now() + RL_HANG_PREFLIGHT_S;
    snprintf(w->host, sizeof w->host, "%s", o->store_host);
    snprintf(w->prefix, sizeof w->prefix, "%s", o->prefix);
    snprintf(w->pod, sizeof w->pod, "%s", o->pod ? o->pod : "");
    snprintf(w->node, sizeof w->node, "%s", o->node ? o->node : "");
    snprintf(w->secret, sizeof w->secret, "%s", o->secret ? o->secret : "");
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->th, NULL, run, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        watch_free(w);
        return rl_errf(e, RL_EIO, "hang watch: cannot start its thread");
    }
    *out = w;
    return RL_OK;
}

void rl_hang_watch_set_net(rl_hang_watch *w, double gbps) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->net_gbps = gbps, w->net_pending = false;
    pthread_mutex_unlock(&w->mu);
}

void rl_hang_watch_step(rl_hang_watch *w, long long step, double step_s, double wait_s) {
    if (!w) return;
    double now = rl_now();
    pthread_mutex_lock(&w->mu);
    /* busy: since the last step's end (the data, the optimizer, whatever
     * ran between steps included), less the wait for the reduction */
    double busy = w->last_step_end > 0 && wait_s >= 0 ? now - w->last_step_end - wait_s : 0;
    w->last_step_end = now;
    if (busy > 0) w->busy_total += busy, w->busy_steps++;
    w->steps[w->nsteps++ % RL_HANG_STEPS] = step_s;
    if (w->nsteps >= 2 * RL_HANG_STEPS) w->nsteps -= RL_HANG_STEPS; /* stays full, never overflows */
    w->step = step;
    pthread_mutex_unlock(&w->mu);
}

bool rl_hang_watch_stop(rl_hang_watch *w, bool failed, char *why, size_t n) {
    if (!w) return false;
    pthread_mutex_lock(&w->mu);
    w->stop = true, w->failed = failed;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    bool fired = w->fired;
    if (fired && n) snprintf(why, n, "%s", w->why);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    watch_free(w);
    return fired;
}
