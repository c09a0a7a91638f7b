/* The coordinator's decisions (round_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/round_internal.h"

bool rl_round_has(const rl_round_node *nodes, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (strcmp(nodes[i].id, id) == 0) return true;
    return false;
}

bool rl_round_gathered(const rl_round_opts *o, const rl_round_node *joined, int nj, double waited_s,
                       const rl_peer *peers, int np, bool synced, const rl_round_node *expect,
                       int nexpect) {
    if (nj >= o->max_nodes) return true;
    if (nj < o->min_nodes || o->max_nodes <= o->min_nodes) return false;
    bool all_peers = synced && nj > 0;
    for (int i = 0; i < np && all_peers; i++)
        if (!peers[i].terminating && !rl_round_has(joined, nj, peers[i].id)) all_peers = false;
    if (nexpect >= 0) { /* a new leader's first round */
        all_peers = nj > 0;
        for (int i = 0; i < nexpect && all_peers; i++)
            if (!rl_round_has(joined, nj, expect[i].id)) all_peers = false;
    }
    return all_peers || (waited_s >= 0 && waited_s >= o->last_call_s);
}

bool rl_round_survivors_in(const rl_round_opts *o, const rl_round_node *joined, int nj,
                           const rl_round_member *prev, int nprev, double now) {
    if (nj < o->min_nodes) return false;
    for (int i = 0; i < nprev; i++)
        if (!rl_round_has(joined, nj, prev[i].node.id) && now - prev[i].hb_time < RL_ROUND_SILENT_S) return false;
    return true;
}

int rl_round_node_cmp(const rl_round_node *a, const rl_round_node *b) {
    int z = strcmp(a->zone, b->zone), r = strcmp(a->rack, b->rack);
    return z ? z : r ? r : strcmp(a->id, b->id);
}

static int node_cmp(const void *a, const void *b) { return rl_round_node_cmp(a, b); }

void rl_round_order(rl_round_node *nodes, int n) {
    if (n > 1) qsort(nodes, (size_t)n, sizeof *nodes, node_cmp);
}

int rl_round_zone_crossings(const rl_round_node *nodes, int n) {
    int x = 0;
    for (int i = 0; n > 1 && i < n; i++) x += strcmp(nodes[i].zone, nodes[(i + 1) % n].zone) != 0;
    return x;
}

int rl_round_rack_crossings(const rl_round_node *nodes, int n) {
    int x = 0;
    for (int i = 0; n > 1 && i < n; i++) {
        const rl_round_node *a = &nodes[i], *b = &nodes[(i + 1) % n];
        x += strcmp(a->zone, b->zone) != 0 || strcmp(a->rack, b->rack) != 0;
    }
    return x;
}

/* A member silent too long, a failure report, or every member done. */
static rl_round_state judge_members(rl_round_watch *w, const rl_round_look *l, char *reason, size_t rn) {
    double lost_after = w->o->heartbeat_s * w->o->heartbeat_misses;
    for (int i = 0; i < w->nm; i++) {
        rl_round_member *m = &w->m[i];
        if (l->m[i].hb != m->hb) {
            m->hb = l->m[i].hb, m->hb_time = l->now;
        } else if (l->now - m->hb_time > lost_after) {
            snprintf(reason, rn, "node %s lost: no heartbeat for %.1f s", m->node.id, l->now - m->hb_time);
            return RL_ROUND_NEXT;
        }
    }
    if (l->events == w->events_seen) return RL_ROUND_RUNNING;
    w->events_seen = l->events;
    int done = 0;
    for (int i = 0; i < w->nm; i++) {
        if (l->m[i].fail) {
            snprintf(reason, rn, "node %s: %.400s", w->m[i].node.id, l->m[i].fail);
            /* retrying cannot mend a bad config or data path */
            return l->m[i].cls == RL_FAIL_USER ? RL_ROUND_FAILED : RL_ROUND_NEXT;
        }
        done += l->m[i].done;
    }
    if (done == w->nm) {
        snprintf(reason, rn, "every node's trainers finished");
        return RL_ROUND_COMPLETE;
    }
    return RL_ROUND_RUNNING;
}

static bool standby_has(const rl_round_watch *w, const char *id) {
    for (int i = 0; i < w->nstandby; i++)
        if (strcmp(w->standby[i].id, id) == 0) return true;
    return false;
}

/* The pre-flight named members far below the median: leave them out while
 * the job keeps min_nodes (once per round; otherwise it only names them). */
static rl_round_state judge_degraded(rl_round_watch *w, const rl_round_look *l, char *reason, size_t rn) {
    if (w->degraded_judged || !l->degraded || l->degraded->n == 0) return RL_ROUND_RUNNING;
    w->degraded_judged = true;
    rl_round_degraded *b = &w->benched;
    b->n = 0;
    for (int k = 0; k < l->degraded->n; k++)
        for (int i = 0; i < w->nm; i++)
            if (strcmp(w->m[i].node.id, l->degraded->ids[k]) == 0 && b->n < RL_ROUND_DEGRADED_MAX)
                snprintf(b->ids[b->n++], sizeof b->ids[0], "%s", w->m[i].node.id);
    if (b->n == 0 || !(w->o->bench_s > 0) || w->nm - b->n < w->o->min_nodes) {
        b->n = 0;
        return RL_ROUND_RUNNING;
    }
    snprintf(b->why, sizeof b->why, "%.500s", l->degraded->why);
    snprintf(reason, rn, "node %s%s left out for %.0f s: the pre-flight found it below the median (%.300s)",
             b->ids[0], b->n > 1 ? " and others" : "", w->o->bench_s, l->degraded->why);
    return RL_ROUND_NEXT;
}

/* A standby's time on the bench is up: grow the job with it. */
static rl_round_state judge_bench(const rl_round_watch *w, const rl_round_look *l, bool *graceful, char *reason,
                                  size_t rn) {
    for (int i = 0; i < w->nstandby && w->nm < w->o->max_nodes; i++)
        if (l->now >= w->standby[i].until) {
            snprintf(reason, rn, "node %s is back from the bench: growing the job", w->standby[i].id);
            *graceful = true;
            return RL_ROUND_NEXT;
        }
    return RL_ROUND_RUNNING;
}

static bool on_bench(const rl_round_bench *bench, int nbench, const char *id, double now) {
    for (int b = 0; b < nbench; b++)
        if (bench[b].until > now && strcmp(bench[b].id, id) == 0) return true;
    return false;
}

int rl_round_place(const rl_round_opts *o, rl_round_node *joined, int nj, const rl_round_bench *bench, int nbench,
                   double now) {
    int placed = 0;
    for (int i = 0; i < nj; i++) placed += !on_bench(bench, nbench, joined[i].id, now);
    if (placed >= o->min_nodes || placed == nj) {
        /* stable: the placed ones first, in their order, then the benched */
        for (int i = 0, k = 0; i < nj && k < placed; i++) {
            if (on_bench(bench, nbench, joined[i].id, now)) continue;
            rl_round_node x = joined[i];
            memmove(&joined[k + 1], &joined[k], (size_t)(i - k) * sizeof *joined);
            joined[k++] = x;
        }
        return placed;
    }
    return nj;
}

/* The Service: a member leaving (terminating or gone), or -- on a change of
 * the set only, so a peer that was there at the close and did not join (a
 * dead pod past the last call) does not end every round -- a node that can
 * grow the job. */
static rl_round_state judge_service(rl_round_watch *w, const rl_round_look *l, bool *graceful, char *reason,
                                    size_t rn) {
    if (!l->synced) return RL_ROUND_RUNNING;
    for (int i = 0; i < w->nm; i++) {
        bool present = false, term = false;
        for (int p = 0; p < l->np; p++)
            if (strcmp(l->peers[p].id, w->m[i].node.id) == 0) present = true, term = l->peers[p].terminating;
        if (present) w->m[i].listed = true;
        if ((!present && w->m[i].listed) || term) {
            /* a terminating pod's trainers checkpoint on SIGTERM
             * themselves; the others stop where they are */
            snprintf(reason, rn, "node %s %s", w->m[i].node.id, term ? "is terminating" : "left the service");
            return RL_ROUND_NEXT;
        }
    }
    if (l->ver == w->ver_seen) return RL_ROUND_RUNNING;
    w->ver_seen = l->ver;
    for (int p = 0; p < l->np && w->nm < w->o->max_nodes; p++) {
        bool member = false;
        for (int i = 0; i < w->nm && !member; i++) member = strcmp(w->m[i].node.id, l->peers[p].id) == 0;
        if (!l->peers[p].terminating && !member && !standby_has(w, l->peers[p].id)) {
            snprintf(reason, rn, "node %s arrived: growing the job", l->peers[p].id);
            *graceful = true;
            return RL_ROUND_NEXT;
        }
    }
    return RL_ROUND_RUNNING;
}

rl_round_state rl_round_judge(rl_round_watch *w, const rl_round_look *l, bool *graceful, char *reason,
                              size_t rn) {
    *graceful = false;
    rl_round_state st = judge_members(w, l, reason, rn);
    if (st == RL_ROUND_RUNNING) st = judge_degraded(w, l, reason, rn);
    if (st == RL_ROUND_RUNNING) st = judge_service(w, l, graceful, reason, rn);
    if (st == RL_ROUND_RUNNING) st = judge_bench(w, l, graceful, reason, rn);
    /* an agent joining this round late (its endpoint may lag) */
    if (st == RL_ROUND_RUNNING && w->nm < w->o->max_nodes && l->joins > w->joins) {
        snprintf(reason, rn, "a node joined a running round: growing the job");
        *graceful = true;
        st = RL_ROUND_NEXT;
    }
    return st;
}

rl_round_state rl_round_limit(rl_round_state st, int64_t crashes, int max_restarts, char *reason, size_t rn) {
    if (st != RL_ROUND_NEXT || crashes <= max_restarts) return st;
    char last[420];
    snprintf(last, sizeof last, "%.400s", reason);
    snprintf(reason, rn, "restart limit: %lld trainer crashes, at most %d allowed (last: %s)", (long long)crashes,
             max_restarts, last);
    return RL_ROUND_FAILED;
}
