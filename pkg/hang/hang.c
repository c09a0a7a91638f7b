/* Hang diagnosis, the pure part: deadlines, the stuck op, the verdict, and
 * the heartbeat's JSON. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hang.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..k) (k > 0), which it sorts. */
static double median_of(double *v, int k) {
    qsort(v, (size_t)k, sizeof v[0], cmp_double);
    return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

static bool usable(double s) { return s > 0 && isfinite(s); }

double rl_hang_deadline(const double *steps, int n, double factor, double min_s) {
    if (!(factor > 0) || n <= 0) return 0;
    double v[RL_HANG_STEPS];
    int k = 0;
    for (int i = 0; i < n && k < RL_HANG_STEPS; i++)
        if (usable(steps[i])) v[k++] = steps[i];
    if (k < RL_HANG_MIN_STEPS) return 0;
    double d = factor * median_of(v, k);
    return d > min_s ? d : min_s;
}

const rl_comm_record *rl_hang_stuck(const rl_comm_record *r, int n, double now, double deadline) {
    if (!(deadline > 0)) return NULL;
    for (int i = 0; i < n; i++) /* oldest first */
        if (r[i].seq && r[i].t_done <= 0 && now - r[i].t_issue >= deadline) return &r[i];
    return NULL;
}

/* ---- the verdict ---------------------------------------------------------------------------- */
static bool blamed(const rl_hang_rank *r, uint64_t seq) {
    return !r->answered || r->issued < seq;
}

/* "rank 1 (pod p, node n)": how every sentence here names a rank */
static const char *name_rank(const rl_hang_rank *r, int rank, char *dst, size_t n) {
    snprintf(dst, n, "rank %d (pod %s, node %s)", rank, r->pod[0] ? r->pod : "?", r->node[0] ? r->node : "?");
    return dst;
}

/* "rank 1 (pod p, node n) never entered allreduce #9" or "... stopped
 * responding in allreduce #9 (last heartbeat 2.1 s ago, newest broadcast #8)" */
static void blame_one(const rl_hang_rank *r, uint64_t seq, const char *op, double now_unix, char *dst, size_t n) {
    char who[160];
    name_rank(r, r->rank, who, sizeof who);
    if (r->answered) {
        char newest[48] = "it issued none";
        if (r->issued) snprintf(newest, sizeof newest, "its newest is #%llu", (unsigned long long)r->issued);
        snprintf(dst, n, "%s never entered %s #%llu (%s)", who, op, (unsigned long long)seq, newest);
    } else if (!r->seen) {
        snprintf(dst, n, "%s stopped responding in %s #%llu (no heartbeat at all)", who, op,
                 (unsigned long long)seq);
    } else {
        char newest[64] = "";
        if (r->issued < seq)
            snprintf(newest, sizeof newest, ", newest %s #%llu", r->op[0] ? r->op : "op",
                     (unsigned long long)r->issued);
        snprintf(dst, n, "%s stopped responding in %s #%llu (last heartbeat %.1f s ago%s)", who, op,
                 (unsigned long long)seq, now_unix - r->unix_time, newest);
    }
}

int rl_hang_verdict(const rl_hang_rank *ranks, int world, uint64_t seq, const char *op, double now_unix,
                    char *out, size_t n) {
    enum { NAMED = 4 };
    int blames = 0;
    size_t at = 0;
    if (n) out[0] = '\0';
    for (int i = 0; i < world; i++) {
        if (!blamed(&ranks[i], seq)) continue;
        if (blames++ >= NAMED) continue;
        char one[400];
        blame_one(&ranks[i], seq, op, now_unix, one, sizeof one);
        if (at < n) at += (size_t)snprintf(out + at, n - at, "%s%s", blames > 1 ? "; " : "", one);
    }
    if (blames > NAMED && at < n) snprintf(out + at, n - at, "; and %d more", blames - NAMED);
    if (!blames)
        snprintf(out, n, "every rank of %d entered %s #%llu and none finished it (a network or backend fault)",
                 world, op, (unsigned long long)seq);
    return blames;
}

static int cmp_slow(const void *a, const void *b) {
    double x = ((const rl_hang_slow *)a)->ratio, y = ((const rl_hang_slow *)b)->ratio;
    return (x < y) - (x > y); /* slowest first */
}

/* The median of one figure (a double at offset off of rl_hang_rank) over
 * the ranks that have it, and how many do (*k); 0 when none. */
static double figure_median(const rl_hang_rank *ranks, int world, size_t off, int *k) {
    double *v = world > 0 ? malloc((size_t)world * sizeof *v) : NULL, m = 0;
    *k = 0;
    for (int i = 0; v && i < world; i++) {
        double x = *(const double *)((const char *)&ranks[i] + off);
        if (usable(x)) v[(*k)++] = x;
    }
    if (*k) m = median_of(v, *k);
    free(v);
    return m;
}

int rl_hang_stragglers(const rl_hang_rank *ranks, int world, double factor, rl_hang_slow *slow, int max, char *out,
                       size_t n) {
    if (n) out[0] = '\0';
    rl_hang_slow *all = world > 0 ? malloc((size_t)world * sizeof *all) : NULL;
    int k, found = 0;
    double median = figure_median(ranks, world, offsetof(rl_hang_rank, busy_s), &k);
    if (k < 3 || !(factor > 0)) median = 0;
    for (int i = 0; all && median > 0 && i < world; i++)
        if (usable(ranks[i].busy_s) && ranks[i].busy_s > factor * median)
            all[found++] = (rl_hang_slow){.rank = i, .ratio = ranks[i].busy_s / median};
    if (found) qsort(all, (size_t)found, sizeof all[0], cmp_slow);
    size_t at = 0;
    for (int i = 0; i < found && i < max; i++) {
        const rl_hang_rank *r = &ranks[all[i].rank];
        char who[160];
        slow[i] = all[i];
        if (at < n)
            at += (size_t)snprintf(out + at, n - at,
                                   "%s%s is a straggler: %.1fx the median busy time per step (%.3f s vs %.3f s)",
                                   i ? "; " : "", name_rank(r, all[i].rank, who, sizeof who), all[i].ratio,
                                   r->busy_s, median);
    }
    if (found > max && at < n) snprintf(out + at, n - at, "; and %d more", found - max);
    free(all);
    return found;
}

void rl_hang_node_net(const rl_hang_rank *ranks, int world, double *net) {
    int measured = 0;
    for (int i = 0; i < world; i++) measured += usable(ranks[i].net_gbps), net[i] = 0;
    if (measured < 3) return;
    for (int i = 0; i < world; i++) {
        if (!usable(ranks[i].net_gbps)) continue;
        int k = (i + 1) % world;
        while (!usable(ranks[k].net_gbps)) k = (k + 1) % world;
        net[i] = fmax(ranks[i].net_gbps, ranks[k].net_gbps);
    }
}

int rl_hang_preflight(const rl_hang_rank *ranks, int world, double min_ratio, char *out, size_t n, double *ratio) {
    /* again: measured again by a recheck (the network once: a collective) */
    static const struct { size_t off; const char *what, *unit; double scale; bool again; } fig[] = {
        {offsetof(rl_hang_rank, copy_gbps), "copy", "GB/s", 1, true},
        {offsetof(rl_hang_rank, shm_bytes), "/dev/shm", "MiB free", 1.0 / (1 << 20), true},
        {offsetof(rl_hang_rank, net_gbps), "network", "GB/s", 1, false},
    };
    enum { NFIG = sizeof fig / sizeof fig[0] };
    if (n) out[0] = '\0';
    for (int i = 0; ratio && i < world; i++) ratio[i] = 1;
    if (!(min_ratio > 0) || world < 2) return 0;
    /* judged on a copy whose network figure is its node's */
    rl_hang_rank *r = malloc((size_t)world * sizeof *r);
    double *net = malloc((size_t)world * sizeof *net);
    if (!r || !net) {
        free(r), free(net);
        return 0;
    }
    memcpy(r, ranks, (size_t)world * sizeof *r);
    rl_hang_node_net(ranks, world, net);
    for (int i = 0; i < world; i++) r[i].net_gbps = net[i];
    free(net);
    double med[NFIG];
    int k;
    for (int f = 0; f < NFIG; f++) med[f] = figure_median(r, world, fig[f].off, &k);
    int bad = 0;
    size_t at = 0;
    for (int i = 0; i < world; i++) {
        bool named = false;
        for (int f = 0; f < NFIG; f++) {
            double x = *(const double *)((const char *)&r[i] + fig[f].off);
            if ((r[i].passed_first && fig[f].again) || !usable(x) || !(med[f] > 0) || x >= min_ratio * med[f])
                continue;
            if (ratio && x / med[f] < ratio[i]) ratio[i] = x / med[f];
            char who[160];
            if (!named && bad < RL_HANG_SLOW_MAX && at < n)
                at += (size_t)snprintf(out + at, n - at, "%s%s", bad ? "; " : "", name_rank(&r[i], i, who, sizeof who));
            if (bad < RL_HANG_SLOW_MAX && at < n)
                at += (size_t)snprintf(out + at, n - at, ": %s %.1f %s, %.2fx the median %.1f %s", fig[f].what,
                                       x * fig[f].scale, fig[f].unit, x / med[f], med[f] * fig[f].scale, fig[f].unit);
            bad += !named, named = true;
        }
    }
    if (bad > RL_HANG_SLOW_MAX && at < n) snprintf(out + at, n - at, "; and %d more", bad - RL_HANG_SLOW_MAX);
    free(r);
    return bad;
}

/* ---- the wire ------------------------------------------------------------------------------- */
char *rl_hang_rank_json(const rl_hang_rank *r, const rl_comm_record *rec, int n, double now, double now_unix) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "rank", r->rank);
    cJSON_AddNumberToObject(o, "issued", (double)r->issued);
    cJSON_AddNumberToObject(o, "done", (double)r->done);
    cJSON_AddStringToObject(o, "op", r->op);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "busy_total", r->busy_total);
    cJSON_AddNumberToObject(o, "busy_steps", r->busy_steps);
    if (usable(r->shm_bytes)) cJSON_AddNumberToObject(o, "shm_bytes", r->shm_bytes);
    if (usable(r->copy_gbps)) cJSON_AddNumberToObject(o, "copy_gbps", r->copy_gbps);
    if (usable(r->net_gbps)) cJSON_AddNumberToObject(o, "net_gbps", r->net_gbps);
    if (r->net_pending) cJSON_AddBoolToObject(o, "net_pending", true);
    if (r->rechecked) cJSON_AddBoolToObject(o, "rechecked", true);
    cJSON_AddNumberToObject(o, "unix", r->unix_time);
    cJSON_AddStringToObject(o, "pod", r->pod);
    cJSON_AddStringToObject(o, "node", r->node);
    if (n > 0) {
        cJSON *a = cJSON_AddArrayToObject(o, "records");
        for (int i = 0; a && i < n; i++) {
            cJSON *x = cJSON_CreateObject();
            if (!x) break;
            cJSON_AddItemToArray(a, x);
            cJSON_AddNumberToObject(x, "seq", (double)rec[i].seq);
            cJSON_AddStringToObject(x, "op", rec[i].op ? rec[i].op : "");
            cJSON_AddNumberToObject(x, "bytes", (double)rec[i].bytes);
            if (rec[i].tag >= 0) cJSON_AddNumberToObject(x, "tag", rec[i].tag);
            cJSON_AddNumberToObject(x, "issued_unix", now_unix - (now - rec[i].t_issue));
            if (rec[i].t_done > 0) {
                cJSON_AddNumberToObject(x, "done_unix", now_unix - (now - rec[i].t_done));
                cJSON_AddNumberToObject(x, "rc", rec[i].rc);
            } else {
                cJSON_AddNumberToObject(x, "running_s", now - rec[i].t_issue);
            }
            /* nccl: when the GPU reached it and finished it (an op issued,
             * not started, waits behind earlier work on the stream) */
            if (rec[i].t_start > 0) cJSON_AddNumberToObject(x, "gpu_start_unix", now_unix - (now - rec[i].t_start));
            if (rec[i].t_end > 0) cJSON_AddNumberToObject(x, "gpu_end_unix", now_unix - (now - rec[i].t_end));
        }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* a count that fits: 0 <= v < 2^53 (a double holds such integers exactly) */
static bool count_of(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 9007199254740992.0)) return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

/* a positive finite number, else 0 (unknown) */
static double positive(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) && usable(v->valuedouble) ? v->valuedouble : 0;
}

static void copy_str(const cJSON *o, const char *k, char *dst, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(dst, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

int rl_hang_rank_parse(const char *text, size_t len, const char *what, rl_hang_rank *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_ParseWithLength(text, len);
    uint64_t rank, issued, done, step;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "unix");
    bool ok = cJSON_IsObject(o) && count_of(cJSON_GetObjectItemCaseSensitive(o, "rank"), &rank) &&
              rank < (1u << 24) && count_of(cJSON_GetObjectItemCaseSensitive(o, "issued"), &issued) &&
              count_of(cJSON_GetObjectItemCaseSensitive(o, "done"), &done) &&
              count_of(cJSON_GetObjectItemCaseSensitive(o, "step"), &step) && cJSON_IsNumber(t) &&
              isfinite(t->valuedouble);
    if (ok) {
        *out = (rl_hang_rank){.rank = (int)rank, .seen = true, .issued = issued, .done = done,
                              .step = (long long)step, .unix_time = t->valuedouble};
        out->busy_total = positive(o, "busy_total");
        out->busy_steps = positive(o, "busy_steps");
        out->shm_bytes = positive(o, "shm_bytes");
        out->copy_gbps = positive(o, "copy_gbps");
        out->net_gbps = positive(o, "net_gbps");
        out->net_pending = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "net_pending"));
        out->rechecked = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "rechecked"));
        copy_str(o, "op", out->op, sizeof out->op);
        copy_str(o, "pod", out->pod, sizeof out->pod);
        copy_str(o, "node", out->node, sizeof out->node);
    }
    cJSON_Delete(o);
    return ok ? RL_OK : rl_errf(e, RL_EINPUT, "%s: not a heartbeat (rank, issued, done, step, unix)", what);
}
