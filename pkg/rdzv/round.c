/* Rendezvous rounds on the store: the leader's coordinator (a thread) and
 * the member side. The coordinator is the only writer of R/table and R/end,
 * so every member sees one decision per round; members only add their own
 * join, heartbeat and report keys. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdzv/round_internal.h"

#define MAX_NODES 4096
#define RL_ROUND_BENCH_MAX 64

/* ---- the table ---------------------------------------------------------------------- */
static int by_node_id(const void *a, const void *b) {
    return strcmp(((const rl_round_node *)a)->id, ((const rl_round_node *)b)->id);
}

void rl_round_table_free(rl_round_table *t) {
    if (!t) return;
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

static int int_of(const cJSON *o, const char *k, long long lo, long long hi, long long *out,
                  rl_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    /* range first: converting an out-of-range double is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != (double)(long long)v->valuedouble)
        return rl_errf(e, RL_EINPUT, "round table: \"%s\" must be an integer in [%lld, %lld]", k, lo, hi);
    *out = (long long)v->valuedouble;
    return RL_OK;
}

static int str_of(const cJSON *o, const char *k, char *out, size_t n, rl_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= n)
        return rl_errf(e, RL_EINPUT, "round table: \"%s\" must be a string of 1..%zu characters", k, n - 1);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return RL_OK;
}

/* "zone" and "rack" are optional: absent or "" is unknown. */
static int opt_str_of(const cJSON *o, const char *k, char *out, size_t n, rl_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    out[0] = '\0';
    if (!v) return RL_OK;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return rl_errf(e, RL_EINPUT, "round table: \"%s\" must be a string of 0..%zu characters", k, n - 1);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return RL_OK;
}

static int by_id_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The (zone, rack, id) order does not keep one id out of two zones; the agent
 * finds itself by id, so ids are unique. */
static int unique_ids(const rl_round_node *nodes, int n, rl_err *e) {
    const char **ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return rl_errf(e, RL_ENOMEM, "round table: out of memory");
    for (int i = 0; i < n; i++) ids[i] = nodes[i].id;
    qsort(ids, (size_t)n, sizeof *ids, by_id_ptr);
    int rc = RL_OK;
    for (int i = 1; i < n && !rc; i++)
        if (!strcmp(ids[i - 1], ids[i])) rc = rl_errf(e, RL_EINPUT, "round table: node id %.64s appears twice", ids[i]);
    free(ids);
    return rc;
}

int rl_round_table_parse(const char *json, size_t len, rl_round_table *t, rl_err *e) {
    memset(t, 0, sizeof *t);
    cJSON *r = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return rl_errf(e, RL_EINPUT, "round table: not a JSON object");
    }
    long long round = 0, world = 0, restarts = 0;
    int rc;
    if ((rc = int_of(r, "round", 0, 1ll << 53, &round, e)) ||
        (rc = int_of(r, "world", 1, 1 << 24, &world, e)) ||
        (rc = int_of(r, "restarts", 0, 1 << 30, &restarts, e))) {
        cJSON_Delete(r);
        return rc;
    }
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(r, "nodes");
    int n = cJSON_GetArraySize(nodes);
    if (!cJSON_IsArray(nodes) || n < 1 || n > MAX_NODES) {
        cJSON_Delete(r);
        return rl_errf(e, RL_EINPUT, "round table: \"nodes\" must be an array of 1..%d nodes", MAX_NODES);
    }
    t->nodes = calloc((size_t)n, sizeof *t->nodes);
    if (!t->nodes) {
        cJSON_Delete(r);
        return rl_errf(e, RL_ENOMEM, "round table: out of memory");
    }
    long long next = 0;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, nodes) {
        rl_round_node *d = &t->nodes[i];
        long long lw = 0, r0 = 0;
        if (!cJSON_IsObject(it)) rc = rl_errf(e, RL_EINPUT, "round table: node %d is not an object", i);
        else if (!(rc = str_of(it, "id", d->id, sizeof d->id, e)) &&
                 !(rc = str_of(it, "addr", d->addr, sizeof d->addr, e)) &&
                 !(rc = int_of(it, "local_world", 1, 1 << 16, &lw, e)) &&
                 !(rc = int_of(it, "rank0", 0, 1 << 24, &r0, e)) &&
                 !(rc = opt_str_of(it, "zone", d->zone, sizeof d->zone, e)) &&
                 !(rc = opt_str_of(it, "rack", d->rack, sizeof d->rack, e))) {
            d->local_world = (int)lw, d->rank0 = (int)r0;
            if (i > 0 && rl_round_node_cmp(&t->nodes[i - 1], d) >= 0)
                rc = rl_errf(e, RL_EINPUT, "round table: nodes not strictly sorted by zone, rack and id at %d", i);
            else if (r0 != next)
                rc = rl_errf(e, RL_EINPUT, "round table: node %d starts at rank %lld, expected %lld", i, r0, next);
            next += lw;
        }
        if (rc) break;
        i++;
    }
    cJSON_Delete(r);
    if (!rc && next != world)
        rc = rl_errf(e, RL_EINPUT, "round table: world %lld but the nodes hold %lld ranks", world, next);
    if (!rc) rc = unique_ids(t->nodes, n, e);
    if (rc) {
        rl_round_table_free(t);
        return rc;
    }
    t->round = round, t->world = (int)world, t->restarts = (int)restarts, t->nnodes = n;
    return RL_OK;
}

static char *table_json(long long round, int restarts, const rl_round_node *nodes, int n, int *world) {
    cJSON *r = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    int w = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", nodes[i].id);
        cJSON_AddStringToObject(o, "addr", nodes[i].addr);
        if (nodes[i].zone[0]) cJSON_AddStringToObject(o, "zone", nodes[i].zone);
        if (nodes[i].rack[0]) cJSON_AddStringToObject(o, "rack", nodes[i].rack);
        cJSON_AddNumberToObject(o, "local_world", nodes[i].local_world);
        cJSON_AddNumberToObject(o, "rank0", w);
        w += nodes[i].local_world;
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddNumberToObject(r, "round", (double)round);
    cJSON_AddNumberToObject(r, "world", w);
    cJSON_AddNumberToObject(r, "restarts", restarts);
    cJSON_AddItemToObject(r, "nodes", arr);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    *world = w;
    return s;
}

/* ---- keys ------------------------------------------------------------------------------ */
#define K(buf, ...) snprintf((buf), sizeof(buf), __VA_ARGS__)

static int get_opt(rl_store *s, const char *key, double wait_s, char **val, size_t *len, rl_err *e) {
    void *v = NULL;
    rl_err ge = {0};
    int rc = rl_store_get(s, key, wait_s, &v, len, &ge);
    if (rc == RL_ETIMEOUT) { /* absent (the connection stays good) */
        *val = NULL;
        return RL_OK;
    }
    if (rc) {
        if (e) *e = ge;
        return rc;
    }
    *val = v;
    return RL_OK;
}

/* ---- coordinator --------------------------------------------------------------------- */
struct rl_round_coord {
    rl_round_opts o;
    rl_store *s;
    rl_members *members;
    long long round;
    /* the first round's expected nodes (a new leader's last known table
     * minus the old leader); nexpect < 0: none, wait for the Service */
    rl_round_node *expect;
    int nexpect;
    pthread_t thread;
    volatile int stop;
    /* The job is over (complete or failed): the nodes of the last round,
     * each of which must read that before the store goes away -- a member
     * that finds the store closed instead takes it for a lost leader and
     * would lead a job of one. */
    volatile int over;
    rl_round_node *over_nodes;
    int n_over;
    long long over_round;
    /* After a round that lost a member: its members, their heartbeats
     * still watched while the next round gathers (rl_round_survivors_in) */
    rl_round_member *prev;
    int nprev;
    long long prev_round;
    /* nodes the pre-flight found degraded, out of the rounds for a while */
    rl_round_bench bench[RL_ROUND_BENCH_MAX];
    int nbench;
    rl_round_degraded degraded; /* the running round's pre-flight report, as last read */
};

/* The outcomes as R/end writes them (parse_end reads them back). */
static const char *outcome_name(rl_round_state st) {
    return st == RL_ROUND_COMPLETE ? "complete" : st == RL_ROUND_FAILED ? "failed" : "next";
}

static void log_end(long long round, const char *outcome, const char *reason) {
    char r[600];
    rl_log(RL_LOG_WARN, "round_end", "\"round\":%lld,\"outcome\":\"%s\",\"reason\":\"%s\"", round, outcome,
           rl_json_escape(r, sizeof r, reason));
}

static int end_round(rl_round_coord *c, rl_round_state st, bool graceful, rl_fail_class cls, const char *reason,
                     const rl_round_node *nodes, int n, rl_err *e) {
    char key[64], buf[32];
    const char *outcome = outcome_name(st);
    log_end(c->round, outcome, reason);
    if (st != RL_ROUND_NEXT) {
        c->over_nodes = calloc((size_t)(n > 0 ? n : 1), sizeof *c->over_nodes);
        if (c->over_nodes) memcpy(c->over_nodes, nodes, (size_t)n * sizeof *nodes), c->n_over = n;
        c->over_round = c->round;
        c->over = 1; /* before the end is written: whoever reads it finds this set */
    }
    if (st == RL_ROUND_NEXT) {
        /* the next round opens before the old one is declared over, so a
         * member that sees "next" finds it at once */
        K(buf, "%lld", c->round + 1);
        int rc = rl_store_set(c->s, "rdzv/round", buf, strlen(buf), e);
        if (rc) return rc;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", outcome);
    cJSON_AddStringToObject(o, "reason", reason);
    cJSON_AddBoolToObject(o, "graceful", graceful);
    if (st == RL_ROUND_FAILED) cJSON_AddStringToObject(o, "class", rl_fail_class_name(cls));
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    K(key, "rdzv/%lld/end", c->round);
    int rc = txt ? rl_store_set(c->s, key, txt, strlen(txt), e) : rl_errf(e, RL_ENOMEM, "round: out of memory");
    free(txt);
    if (!rc && st == RL_ROUND_NEXT) c->round++;
    return rc;
}

/* Joins of round R from index *seen on; later joins of an id replace earlier ones
 * (an agent that restarted). */
static int read_joins(rl_round_coord *c, int64_t *seen, rl_round_node *joined, int *nj, rl_err *e) {
    char key[96];
    int64_t total;
    K(key, "rdzv/%lld/nseq", c->round);
    int rc = rl_store_add(c->s, key, 0, &total, e);
    if (rc) return rc;
    for (; *seen < total; (*seen)++) {
        K(key, "rdzv/%lld/join/%lld", c->round, (long long)*seen + 1);
        char *v = NULL;
        size_t len;
        /* the joiner ADDs before it SETs: give it a moment */
        if ((rc = get_opt(c->s, key, 2.0, &v, &len, e))) return rc;
        if (!v) break;
        cJSON *j = cJSON_ParseWithLength(v, len);
        rl_round_node nd = {0};
        rl_err pe = {0};
        long long lw = 0;
        if (!cJSON_IsObject(j) || str_of(j, "id", nd.id, sizeof nd.id, &pe) ||
            str_of(j, "addr", nd.addr, sizeof nd.addr, &pe) || int_of(j, "local_world", 1, 1 << 16, &lw, &pe) ||
            opt_str_of(j, "rack", nd.rack, sizeof nd.rack, &pe)) {
            rl_log_msg(RL_LOG_WARN, "round_bad_join", pe.msg[0] ? pe.msg : "join is not a JSON object");
        } else {
            nd.local_world = (int)lw;
            int at = *nj;
            for (int i = 0; i < *nj; i++)
                if (strcmp(joined[i].id, nd.id) == 0) at = i;
            if (at == *nj && *nj < MAX_NODES) (*nj)++;
            if (at < MAX_NODES) joined[at] = nd;
            char a[300];
            rl_log(RL_LOG_INFO, "round_join", "\"round\":%lld,\"node\":\"%s\",\"joined\":%d", c->round,
                   rl_json_escape(a, sizeof a, nd.id), *nj);
        }
        cJSON_Delete(j);
        free(v);
    }
    return RL_OK;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* One round from open to end. Returns RL_OK after ending it (c->round then
 * names the next one) or when the job is over (*over). */
/* Gathering: joins until rl_round_gathered says the round closes. */
/* The last round's members that have not joined yet: has each heartbeat
 * moved (a survivor still winding its round down)? */
static int watch_prev(rl_round_coord *c, const rl_round_node *joined, int nj, rl_err *e) {
    char key[320];
    double now = rl_now();
    for (int i = 0; i < c->nprev; i++) {
        if (rl_round_has(joined, nj, c->prev[i].node.id)) continue;
        int64_t hb;
        K(key, "rdzv/%lld/hb/%s", c->prev_round, c->prev[i].node.id);
        int rc = rl_store_add(c->s, key, 0, &hb, e);
        if (rc) return rc;
        if (hb != c->prev[i].hb) c->prev[i].hb = hb, c->prev[i].hb_time = now;
    }
    return RL_OK;
}

static int gather(rl_round_coord *c, rl_round_node *joined, int *nj, int64_t *seen, rl_peer *peers,
                  rl_err *e) {
    double t_min = -1;
    for (;;) {
        if (c->stop) return RL_OK;
        int rc = read_joins(c, seen, joined, nj, e);
        if (!rc) rc = watch_prev(c, joined, *nj, e);
        if (rc) return rc;
        if (c->nprev && rl_round_survivors_in(&c->o, joined, *nj, c->prev, c->nprev, rl_now())) return RL_OK;
        uint64_t ver;
        bool synced;
        int np = rl_members_snapshot(c->members, peers, MAX_NODES, &ver, &synced);
        if (np > MAX_NODES) np = MAX_NODES;
        if (*nj >= c->o.min_nodes && t_min < 0) t_min = rl_now();
        if (rl_round_gathered(&c->o, joined, *nj, t_min < 0 ? -1 : rl_now() - t_min, peers, np, synced, c->expect,
                              c->nexpect))
            return RL_OK;
        sleep_s(0.05);
    }
}

/* The round's nodes with their zones from the Service (their racks came
 * with their joins), in ring order (rl_round_order), and the order in the
 * log: which edges cross zones and racks is what a slow ring would be
 * asked first. */
static void place_by_zone(rl_round_coord *c, rl_round_node *nodes, int n, rl_peer *peers) {
    uint64_t ver = 0;
    int np = rl_members_snapshot(c->members, peers, MAX_NODES, &ver, NULL);
    if (np > MAX_NODES) np = MAX_NODES;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < np; p++)
            if (!strcmp(peers[p].id, nodes[i].id)) snprintf(nodes[i].zone, sizeof nodes[i].zone, "%s", peers[p].zone);
    rl_round_order(nodes, n);
    char order[1024] = "", esc[2048];
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof order; i++) {
        int w = snprintf(order + used, sizeof order - used, "%s%s@%s%s%s", i ? "," : "", nodes[i].id,
                         nodes[i].zone[0] ? nodes[i].zone : "?", nodes[i].rack[0] ? "/" : "", nodes[i].rack);
        if (w > 0) used += (size_t)w;
    }
    rl_log(RL_LOG_INFO, "round_order", "\"round\":%lld,\"order\":\"%s\",\"zone_crossings\":%d,\"rack_crossings\":%d",
           c->round, rl_json_escape(esc, sizeof esc, order), rl_round_zone_crossings(nodes, n),
           rl_round_rack_crossings(nodes, n));
}

/* A member's failure report is "<class name>: <reason>" (rl_round_report). */
static rl_fail_class report_class(const char *report) {
    rl_fail_class cls;
    rl_fail_message_split(report, &cls);
    return cls;
}

/* One look at the running round: heartbeats, reports when their counter
 * moved, the Service, the joins. fail[i] holds member i's report. */
static int look_at(rl_round_coord *c, const rl_round_watch *w, rl_round_look *l, rl_round_look_member *lm,
                   char (*fail)[420], rl_peer *peers, rl_err *e) {
    char key[320];
    int rc;
    l->now = rl_now();
    for (int i = 0; i < w->nm; i++) {
        K(key, "rdzv/%lld/hb/%s", c->round, w->m[i].node.id);
        if ((rc = rl_store_add(c->s, key, 0, &lm[i].hb, e))) return rc;
        lm[i].fail = NULL, lm[i].done = false;
    }
    K(key, "rdzv/%lld/events", c->round);
    if ((rc = rl_store_add(c->s, key, 0, &l->events, e))) return rc;
    for (int i = 0; i < w->nm && l->events != w->events_seen; i++) {
        char *v = NULL;
        size_t len;
        K(key, "rdzv/%lld/fail/%s", c->round, w->m[i].node.id);
        if ((rc = get_opt(c->s, key, 0, &v, &len, e))) return rc;
        if (v) {
            snprintf(fail[i], sizeof fail[i], "%.400s", v), lm[i].fail = fail[i];
            lm[i].cls = report_class(fail[i]);
        }
        free(v);
        K(key, "rdzv/%lld/done/%s", c->round, w->m[i].node.id);
        if ((rc = get_opt(c->s, key, 0, &v, &len, e))) return rc;
        lm[i].done = v != NULL;
        free(v);
    }
    l->degraded = NULL;
    if (l->events != w->events_seen) {
        char *v = NULL;
        size_t len;
        rl_err pe = {0};
        K(key, "rdzv/%lld/degraded", c->round);
        if ((rc = get_opt(c->s, key, 0, &v, &len, e))) return rc;
        if (v && rl_round_degraded_parse(v, len, &c->degraded, &pe) == RL_OK) l->degraded = &c->degraded;
        else if (v) rl_log_msg(RL_LOG_WARN, "round_bad_degraded", pe.msg);
        free(v);
    }
    l->m = lm;
    l->ver = w->ver_seen;
    l->synced = false;
    l->np = rl_members_snapshot(c->members, peers, MAX_NODES, &l->ver, &l->synced);
    if (l->np > MAX_NODES) l->np = MAX_NODES;
    l->peers = peers;
    /* joins matter only while the job can grow */
    l->joins = w->joins;
    if (w->nm >= w->o->max_nodes) return RL_OK;
    K(key, "rdzv/%lld/nseq", c->round);
    return rl_store_add(c->s, key, 0, &l->joins, e);
}

/* The members the pre-flight's report left out go on the bench (expired
 * entries make room). */
static void bench(rl_round_coord *c, const rl_round_degraded *d) {
    double now = rl_now();
    int k = 0;
    for (int b = 0; b < c->nbench; b++)
        if (c->bench[b].until > now) c->bench[k++] = c->bench[b];
    c->nbench = k;
    for (int i = 0; i < d->n; i++) {
        int at = c->nbench;
        for (int b = 0; b < c->nbench; b++)
            if (!strcmp(c->bench[b].id, d->ids[i])) at = b;
        if (at == RL_ROUND_BENCH_MAX) break;
        if (at == c->nbench) c->nbench++;
        snprintf(c->bench[at].id, sizeof c->bench[at].id, "%s", d->ids[i]);
        c->bench[at].until = now + c->o.bench_s;
        char id[600];
        rl_log(RL_LOG_WARN, "round_bench", "\"round\":%lld,\"node\":\"%s\",\"seconds\":%.0f", c->round,
               rl_json_escape(id, sizeof id, d->ids[i]), c->o.bench_s);
    }
}

/* One round from open to end: gather, publish the table, watch it (look,
 * judge) until it ends. Returns RL_OK after ending it (c->round then names
 * the next one) or when the job is over (*over). */
static int run_round(rl_round_coord *c, bool *over, rl_err *e) {
    const rl_round_opts *o = &c->o;
    rl_round_node *joined = calloc(MAX_NODES, sizeof *joined);
    rl_peer *peers = calloc(MAX_NODES, sizeof *peers);
    rl_round_member *mem = NULL;
    rl_round_look_member *lm = NULL;
    char(*fail)[420] = NULL;
    int nj = 0, rc = RL_OK, nm = 0;
    int64_t seen = 0, crashes = 0;
    double t_open = rl_now();
    char key[320], reason[1024];
    if (!joined || !peers) {
        rc = rl_errf(e, RL_ENOMEM, "round: out of memory");
        goto out;
    }
    rl_log(RL_LOG_INFO, "round_open", "\"round\":%lld", c->round);
    rc = gather(c, joined, &nj, &seen, peers, e);
    free(c->prev);
    c->prev = NULL, c->nprev = 0;
    if (rc || c->stop) goto out;
    qsort(joined, (size_t)nj, sizeof *joined, by_node_id);
    c->nexpect = -1;
    int placed = rl_round_place(o, joined, nj, c->bench, c->nbench, rl_now());
    nm = placed < o->max_nodes ? placed : o->max_nodes;
    /* A crash or user error reported after its round had already ended (a
     * peer's report came first) is counted here, before anything restarts. */
    char *user = NULL;
    size_t ulen;
    if ((rc = rl_store_add(c->s, "rdzv/crashes", 0, &crashes, e)) ||
        (rc = get_opt(c->s, "rdzv/user_error", 0, &user, &ulen, e)))
        goto out;
    if (user || crashes > o->max_restarts) {
        if (user) K(reason, "%.1000s", user);
        else K(reason, "restart limit: %lld trainer crashes, at most %d allowed", (long long)crashes, o->max_restarts);
        rc = end_round(c, RL_ROUND_FAILED, false, user ? RL_FAIL_USER : RL_FAIL_CRASH, reason, joined, nj, e);
        free(user);
        *over = true;
        goto out;
    }
    place_by_zone(c, joined, nm, peers);
    int world;
    char *tj = table_json(c->round, (int)crashes, joined, nm, &world);
    K(key, "rdzv/%lld/table", c->round);
    rc = tj ? rl_store_set(c->s, key, tj, strlen(tj), e) : rl_errf(e, RL_ENOMEM, "round: out of memory");
    free(tj);
    if (rc) goto out;
    rl_log(RL_LOG_INFO, "round_closed", "\"round\":%lld,\"nodes\":%d,\"world\":%d,\"open_s\":%.3f", c->round,
           nm, world, rl_now() - t_open);

    /* ---- watch the running round: look, judge, until it ends ---- */
    mem = calloc((size_t)nm, sizeof *mem);
    lm = calloc((size_t)nm, sizeof *lm);
    fail = calloc((size_t)nm, sizeof *fail);
    if (!mem || !lm || !fail) {
        rc = rl_errf(e, RL_ENOMEM, "round: out of memory");
        goto out;
    }
    for (int i = 0; i < nm; i++) mem[i].node = joined[i], mem[i].hb = -1, mem[i].hb_time = rl_now();
    /* who waits on the bench this round, and until when */
    rl_round_bench standby[RL_ROUND_BENCH_MAX];
    int nstandby = 0;
    for (int i = placed; i < nj; i++)
        for (int b = 0; b < c->nbench && nstandby < RL_ROUND_BENCH_MAX; b++)
            if (!strcmp(c->bench[b].id, joined[i].id)) standby[nstandby++] = c->bench[b];
    rl_round_watch w = {.o = o, .m = mem, .nm = nm, .joins = seen, .standby = standby, .nstandby = nstandby};
    rl_members_snapshot(c->members, NULL, 0, &w.ver_seen, NULL);
    rl_round_state outcome = RL_ROUND_RUNNING;
    rl_fail_class cls = RL_FAIL_CRASH;
    bool graceful = false;
    while (outcome == RL_ROUND_RUNNING) {
        if (c->stop) goto out;
        rl_round_look l;
        if ((rc = look_at(c, &w, &l, lm, fail, peers, e))) goto out;
        outcome = rl_round_judge(&w, &l, &graceful, reason, sizeof reason);
        cls = outcome == RL_ROUND_FAILED ? RL_FAIL_USER : RL_FAIL_CRASH; /* judge fails a job for these only */
        if (outcome == RL_ROUND_NEXT && (rc = rl_store_add(c->s, "rdzv/crashes", 0, &crashes, e))) goto out;
        outcome = rl_round_limit(outcome, crashes, o->max_restarts, reason, sizeof reason);
        if (outcome == RL_ROUND_RUNNING) sleep_s(0.1);
    }
    bench(c, &w.benched);
    rc = end_round(c, outcome, graceful, cls, reason, joined, nm, e); /* joined[0..nm) are the members */
    if (outcome != RL_ROUND_NEXT) *over = true;
    /* a member lost or failed: the next round is this one's survivors */
    if (!rc && outcome == RL_ROUND_NEXT && !graceful) {
        c->prev = mem, c->nprev = nm, c->prev_round = c->round - 1;
        mem = NULL;
    }
out:
    free(joined);
    free(peers);
    free(mem);
    free(lm);
    free(fail);
    return rc;
}

/* After the job's end: wait until every node of the last round said it
 * read it (R/seen/<id>), at most as long as a member may stay silent
 * before it counts as lost. */
static void linger(rl_round_coord *c) {
    double until = rl_now() + c->o.heartbeat_s * c->o.heartbeat_misses;
    char key[320];
    for (int i = 0; i < c->n_over && rl_now() < until;) {
        char *v = NULL;
        size_t len;
        rl_err e = {0};
        K(key, "rdzv/%lld/seen/%s", c->over_round, c->over_nodes[i].id);
        if (get_opt(c->s, key, 0.2, &v, &len, &e) != RL_OK) return;
        if (v) i++;
        free(v);
    }
}

static void *coord_thread(void *arg) {
    rl_round_coord *c = arg;
    bool over = false;
    while (!c->stop && !over) {
        rl_err e = {0};
        if (run_round(c, &over, &e) != RL_OK) {
            /* our own store went away: the agent notices and steps aside */
            if (!c->stop) rl_log_msg(RL_LOG_ERROR, "round_coordinator_failed", e.msg);
            break;
        }
    }
    if (c->over) linger(c);
    return NULL;
}

int rl_round_coord_start(const char *host, int port, const void *secret, size_t slen,
                         const rl_round_opts *o, rl_members *members, long long first_round,
                         const rl_round_table *last, const char *gone_id, rl_round_coord **out,
                         rl_err *e) {
    *out = NULL;
    rl_round_coord *c = calloc(1, sizeof *c);
    if (!c) return rl_errf(e, RL_ENOMEM, "round: out of memory");
    c->o = *o;
    if (c->o.max_nodes < c->o.min_nodes) c->o.max_nodes = c->o.min_nodes;
    c->members = members;
    c->round = first_round > 0 ? first_round : 1;
    c->nexpect = -1;
    if (last && last->nnodes > 0) {
        c->expect = calloc((size_t)last->nnodes, sizeof *c->expect);
        if (!c->expect) {
            free(c);
            return rl_errf(e, RL_ENOMEM, "round: out of memory");
        }
        c->nexpect = 0;
        for (int i = 0; i < last->nnodes; i++)
            if (!gone_id || strcmp(last->nodes[i].id, gone_id) != 0) c->expect[c->nexpect++] = last->nodes[i];
    }
    int rc = rl_store_connect(host, port, 10, &c->s, e);
    if (!rc && slen) rc = rl_store_auth(c->s, "coordinator", secret, slen, e);
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", c->round);
    if (!rc) rc = rl_store_set(c->s, "rdzv/round", buf, strlen(buf), e);
    if (!rc && pthread_create(&c->thread, NULL, coord_thread, c) != 0)
        rc = rl_errf(e, RL_EINTERNAL, "round: cannot start the coordinator thread");
    if (rc) {
        rl_store_close(c->s);
        free(c->expect);
        free(c);
        return rc;
    }
    *out = c;
    return RL_OK;
}

void rl_round_coord_stop(rl_round_coord *c) {
    if (!c) return;
    if (!c->over) c->stop = 1; /* once the job is over, let it linger (bounded) */
    pthread_join(c->thread, NULL);
    rl_store_close(c->s);
    free(c->expect);
    free(c->over_nodes);
    free(c->prev);
    free(c);
}

/* ---- member side ------------------------------------------------------------------------ */
/* Tell the coordinator this node read the job's end (see linger). */
static int ack_over(rl_store *s, long long round, const char *id, rl_err *e) {
    char key[320];
    K(key, "rdzv/%lld/seen/%s", round, id);
    return rl_store_set(s, key, "1", 1, e);
}

static void parse_end(const char *v, size_t len, rl_round_end *end) {
    cJSON *j = cJSON_ParseWithLength(v, len);
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(j, "outcome");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "reason");
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(j, "class");
    end->graceful = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "graceful"));
    end->state = RL_ROUND_NEXT;
    end->cls = RL_FAIL_NONE;
    if (cJSON_IsString(oc) && strcmp(oc->valuestring, "complete") == 0) end->state = RL_ROUND_COMPLETE;
    if (cJSON_IsString(oc) && strcmp(oc->valuestring, "failed") == 0) {
        end->state = RL_ROUND_FAILED;
        end->cls = rl_fail_class_parse(cJSON_IsString(cl) ? cl->valuestring : NULL);
    }
    snprintf(end->reason, sizeof end->reason, "%s", cJSON_IsString(rs) ? rs->valuestring : "?");
    cJSON_Delete(j);
}

int rl_round_tick(rl_store *s, long long round, const char *id, double wait_s, rl_round_end *end, rl_err *e) {
    char key[320];
    int64_t hb;
    memset(end, 0, sizeof *end);
    K(key, "rdzv/%lld/hb/%s", round, id);
    int rc = rl_store_add(s, key, 1, &hb, e);
    if (rc) return rc;
    char *v = NULL;
    size_t len;
    K(key, "rdzv/%lld/end", round);
    if ((rc = get_opt(s, key, wait_s, &v, &len, e))) return rc;
    if (v) parse_end(v, len, end);
    free(v);
    if (end->state == RL_ROUND_COMPLETE || end->state == RL_ROUND_FAILED) return ack_over(s, round, id, e);
    return RL_OK;
}

int rl_round_report_degraded(rl_store *s, long long round, const rl_round_degraded *d, rl_err *e) {
    cJSON *o = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(o, "ids");
    for (int i = 0; i < d->n && i < RL_ROUND_DEGRADED_MAX; i++) cJSON_AddItemToArray(ids, cJSON_CreateString(d->ids[i]));
    cJSON_AddStringToObject(o, "why", d->why);
    char *txt = cJSON_PrintUnformatted(o), key[320];
    cJSON_Delete(o);
    if (!txt) return rl_errf(e, RL_ENOMEM, "round: out of memory");
    int64_t x;
    K(key, "rdzv/%lld/degraded", round);
    int rc = rl_store_set(s, key, txt, strlen(txt), e);
    free(txt);
    K(key, "rdzv/%lld/events", round);
    return rc ? rc : rl_store_add(s, key, 1, &x, e);
}

int rl_round_degraded_parse(const char *json, size_t len, rl_round_degraded *d, rl_err *e) {
    memset(d, 0, sizeof *d);
    cJSON *o = cJSON_ParseWithLength(json, len);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "ids"), *why = cJSON_GetObjectItemCaseSensitive(o, "why");
    int n = cJSON_GetArraySize(ids);
    int rc = RL_OK;
    if (!cJSON_IsObject(o) || !cJSON_IsArray(ids) || n < 1 || n > RL_ROUND_DEGRADED_MAX || !cJSON_IsString(why) ||
        strlen(why->valuestring) >= sizeof d->why)
        rc = rl_errf(e, RL_EINPUT, "degraded report: want {\"ids\":[1..%d node ids],\"why\":\"...\"}",
                     RL_ROUND_DEGRADED_MAX);
    for (const cJSON *x = rc ? NULL : ids->child; x; x = x->next) {
        if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) >= sizeof d->ids[0]) {
            rc = rl_errf(e, RL_EINPUT, "degraded report: ids[%d] is not a node id", d->n);
            break;
        }
        snprintf(d->ids[d->n++], sizeof d->ids[0], "%s", x->valuestring);
    }
    if (!rc) snprintf(d->why, sizeof d->why, "%s", why->valuestring);
    cJSON_Delete(o);
    if (rc) memset(d, 0, sizeof *d);
    return rc;
}

int rl_round_report(rl_store *s, long long round, const char *id, rl_fail_class cls, const char *reason,
                    rl_err *e) {
    char key[320], r[480];
    int64_t x;
    int rc = RL_OK;
    bool done = cls == RL_FAIL_NONE;
    if (done) K(r, "%s", "");
    else K(r, "%s: %.400s", rl_fail_class_name(cls), reason ? reason : "");
    if (cls == RL_FAIL_CRASH) rc = rl_store_add(s, "rdzv/crashes", 1, &x, e);
    if (!rc && cls == RL_FAIL_USER) rc = rl_store_set(s, "rdzv/user_error", r, strlen(r), e);
    K(key, "rdzv/%lld/%s/%s", round, done ? "done" : "fail", id);
    if (!rc) rc = rl_store_set(s, key, r, strlen(r), e);
    K(key, "rdzv/%lld/events", round);
    if (!rc) rc = rl_store_add(s, key, 1, &x, e);
    return rc;
}

int rl_round_join(rl_store *s, const char *id, const char *addr, const char *rack, int local_world,
                  double timeout_s, long long *joined_round, rl_round_table *t, rl_err *e) {
    memset(t, 0, sizeof *t);
    double end = rl_now() + timeout_s;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "addr", addr);
    if (rack && *rack) cJSON_AddStringToObject(j, "rack", rack);
    cJSON_AddNumberToObject(j, "local_world", local_world);
    char *info = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!info) return rl_errf(e, RL_ENOMEM, "round: out of memory");
    int rc = RL_OK;
    while (rc == RL_OK) {
        if (rl_now() > end) {
            rc = rl_errf(e, RL_ETIMEOUT, "no round table within %.3g s", timeout_s);
            break;
        }
        char *v = NULL;
        size_t len;
        if ((rc = get_opt(s, "rdzv/round", 0.5, &v, &len, e))) break;
        if (!v) continue;
        long long r = atoll(v);
        free(v);
        char key[320];
        if (r != *joined_round) {
            int64_t seq;
            K(key, "rdzv/%lld/nseq", r);
            if ((rc = rl_store_add(s, key, 1, &seq, e))) break;
            K(key, "rdzv/%lld/join/%lld", r, (long long)seq);
            if ((rc = rl_store_set(s, key, info, strlen(info), e))) break;
            *joined_round = r;
        }
        K(key, "rdzv/%lld/table", r);
        if ((rc = get_opt(s, key, 0.25, &v, &len, e))) break;
        if (v) {
            rc = rl_round_table_parse(v, len, t, e);
            free(v);
            if (rc) break;
            bool in = false;
            for (int i = 0; i < t->nnodes; i++) in |= strcmp(t->nodes[i].id, id) == 0;
            if (in) break;
            rl_round_table_free(t); /* a standby: wait for the next round */
        }
        K(key, "rdzv/%lld/end", r);
        if ((rc = get_opt(s, key, 0.25, &v, &len, e))) break;
        if (v) {
            rl_round_end over;
            parse_end(v, len, &over);
            free(v);
            if ((over.state == RL_ROUND_COMPLETE || over.state == RL_ROUND_FAILED) && (rc = ack_over(s, r, id, e)))
                break;
            if (over.state == RL_ROUND_COMPLETE) {
                t->round = -1;
                break;
            }
            if (over.state == RL_ROUND_FAILED) {
                free(info);
                return rl_errf(e, over.cls == RL_FAIL_USER ? RL_EINPUT : RL_EPEER, "the job failed: %.400s",
                               over.reason);
            }
        }
    }
    free(info);
    /* RL_EPEER means "the job failed" to the caller; a store that went
     * away (its leader stopping or dying) is only a lost leader: RL_EIO,
     * and the agent waits for the next one. */
    if (rc == RL_EPEER) {
        rl_round_table_free(t);
        if (e) {
            rl_err_wrap(e, "lost the rendezvous store");
            e->code = RL_EIO;
        }
        return RL_EIO;
    }
    return rc;
}
