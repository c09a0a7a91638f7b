/* Rendezvous timing (issue 4): node agents on loopback discovering each
 * other through the Kubernetes stand-in, with the production timing
 * (heartbeat 5 s x 3, lease 15 s / renew 10 s / retry 2 s, last call 10 s).
 *  - first round: from the last agent's start to rank 0 finishing step 1
 *    (which needs every rank's gradients), for 4 and 16 agents;
 *  - recovery: from SIGKILL of a follower, then of the leader, to rank 0
 *    finishing its first step of the new round, side by side with the
 *    survivors healed in place (rdzv.in_place, the default: live resume
 *    from a replica) and with their trainers restarted from the last
 *    checkpoint (in_place false); with the steps done again (the last step
 *    before the kill less the step resumed from) and the time until the job
 *    is past the step it had reached (regained_s);
 *  - growth: a new node's agent starts beside the two left; from then to
 *    rank 0's first step of the grown round, the pause in training (rank
 *    0's last step of the old round to its first of the new one) and the
 *    steps done again, in place (the trainers yield at an agreed step and
 *    the new rank takes their state live) against in_place false (SIGTERM,
 *    rank 0 checkpoints, new processes read it back).
 * One JSON line per measurement; targets: first round < 2 s, follower
 * < heartbeat timeout + 2 s (in place: < 5 s), leader < lease + 2 s. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/support/jobtest.h"
#include "util/util.h"


static rl_test_ev ev[16384];

/* The first "step" rank 0 logged after time t (its wall time), 0 if none yet. */
static double first_step_after(rl_test_job *j, double t) {
    int n = rl_test_job_events(j, "step", ev, 16384);
    double got = 0;
    for (int i = 0; i < n && !got; i++)
        if (ev[i].t > t) got = ev[i].t;
    rl_test_job_events_free(ev, n);
    return got;
}

static double wait_first_step_after(rl_test_job *j, double t, double timeout) {
    double end = rl_now() + timeout, got = 0;
    while (!(got = first_step_after(j, t)) && rl_now() < end) usleep(100000);
    return got;
}

/* When rank 0 first logged a step past `step` after time t (0: not yet):
 * the job has regained what it had before a failure at t. */
static double passed_after(rl_test_job *j, long long step, double t) {
    int n = rl_test_job_events(j, "step", ev, 16384);
    double got = 0;
    for (int i = 0; i < n && !got; i++)
        if (ev[i].t > t && rl_test_ev_num(&ev[i], "step") > (double)step) got = ev[i].t;
    rl_test_job_events_free(ev, n);
    return got;
}

/* The step the last resume after time t started from (-1: none). */
static long long resumed_after(rl_test_job *j, double t) {
    int n = rl_test_job_events(j, "resume", ev, 16384);
    long long k = -1;
    for (int i = 0; i < n; i++)
        if (ev[i].t > t && cJSON_IsTrue(cJSON_GetObjectItem(ev[i].j, "found")))
            k = (long long)rl_test_ev_num(&ev[i], "step");
    rl_test_job_events_free(ev, n);
    return k;
}

/* The time of the first `event` after time t whose `key` is `value` (0: none). */
static double event_after(rl_test_job *j, const char *event, double t, const char *key, double value) {
    int n = rl_test_job_events(j, event, ev, 16384);
    double got = 0;
    for (int i = 0; i < n && !got; i++)
        if (ev[i].t > t && (!key || rl_test_ev_num(&ev[i], key) == value)) got = ev[i].t;
    rl_test_job_events_free(ev, n);
    return got;
}

/* Bytes of the checkpoints rank 0 saved between times a and b. */
static double saved_between(rl_test_job *j, double a, double b) {
    int n = rl_test_job_events(j, "checkpoint_saved", ev, 16384);
    double bytes = 0;
    for (int i = 0; i < n; i++)
        if (ev[i].t > a && ev[i].t < b) bytes += rl_test_ev_num(&ev[i], "bytes");
    rl_test_job_events_free(ev, n);
    return bytes;
}

/* rank 0's last step logged before time t (-1: none). */
static long long step_before(rl_test_job *j, double t, double *when) {
    int n = rl_test_job_events(j, "step", ev, 16384);
    long long s = -1;
    for (int i = 0; i < n && ev[i].t < t; i++) s = (long long)rl_test_ev_num(&ev[i], "step"), *when = ev[i].t;
    rl_test_job_events_free(ev, n);
    return s;
}

/* A node arrives beside the `left` that trained alone: agent `id`'s pod
 * and process, the round that takes it in, the pause and the steps. The
 * killed nodes' pods go first (Kubernetes replaces a dead pod; here a
 * pod left in the Service would hold every round to its last call). */
static int grow(rl_test_job *j, int id, int left, bool in_place, const int *dead, int ndead) {
    char args[64], out[512];
    for (int i = 0; i < ndead; i++) {
        snprintf(args, sizeof args, "delete pod job-%d", dead[i]);
        if (rl_test_kubectl(&j->s, args, NULL, out, sizeof out)) fprintf(stderr, "bench rdzv: %s\n", out);
    }
    long long s0 = rl_test_job_last_step(j); /* the round of `left` settled first */
    while (rl_test_job_last_step(j) < s0 + 20) usleep(100000);
    double t_add = rl_wall_now();
    if (rl_test_job_start_agent(j, id, 1, "bench-secret", true)) return 1;
    double end = rl_now() + 120, t_round = 0, t_first = 0, t_last = 0;
    while (!(t_round = event_after(j, "round_end", t_add, NULL, 0)) && rl_now() < end) usleep(100000);
    double t_start = 0;
    while (t_round && !(t_start = event_after(j, "round_start", t_round, "world", left + 1)) && rl_now() < end)
        usleep(100000);
    if (t_start) t_first = wait_first_step_after(j, t_start, 120);
    /* the old round trains on past its end until its trainers stop (at a
     * step they agree on, in either mode) */
    long long last = t_start ? step_before(j, t_start, &t_last) : -1, k0 = resumed_after(j, t_round);
    printf("{\"bench\":\"rdzv_growth\",\"agents\":%d,\"mode\":\"%s\",\"seconds\":%.3f,\"pause_s\":%.3f,"
           "\"steps_lost\":%lld,\"checkpoint_bytes\":%.0f}\n",
           left + 1, in_place ? "in_place" : "checkpoint", t_first ? t_first - t_add : -1,
           t_first && last >= 0 ? t_first - t_last : -1, k0 >= 0 && last >= 0 ? last - k0 : -1,
           t_first ? saved_between(j, t_round, t_first) : -1);
    fflush(stdout);
    return t_first ? 0 : 1;
}

static int leader(rl_test_job *j) {
    int n = rl_test_job_events(j, "leader_elected", ev, 16384), who = -1;
    for (int i = 0; i < n; i++) who = atoi(cJSON_GetObjectItem(ev[i].j, "id")->valuestring + 4);
    rl_test_job_events_free(ev, n);
    return who;
}

static int run(int agents, bool recovery, bool in_place) {
    rl_test_job j;
    char why[1024];
    char rdzv[160];
    /* elastic 2..4 for the recovery runs, a fixed 16 for the large first round */
    snprintf(rdzv, sizeof rdzv, "\"min_nodes\":%d,\"max_nodes\":%d,\"stop_grace_s\":5,\"bench_s\":0,\"in_place\":%s",
             recovery ? 2 : agents, agents, in_place ? "true" : "false");
    if (rl_test_job_setup(&j, 60 + agents, false, 1000000, 20, rdzv, why, sizeof why)) {
        fprintf(stderr, "bench rdzv: %s\n", why);
        return 1;
    }
    /* 240 sequences: a whole accumulation count for 2, 3, 4 and 16 ranks */
    j.seqs = 240;
    rl_test_job_write_config(&j, j.cfg, j.ckpt, "k8s");
    rl_log_set_level(RL_LOG_WARN);
    /* the operator creates every pod before their agents run */
    for (int i = 0; i < agents; i++)
        if (rl_test_job_add_pod(&j, i)) return 1;
    for (int i = 0; i < agents; i++)
        if (rl_test_job_start_agent(&j, i, 1, "bench-secret", false)) return 1;
    double t_last = rl_wall_now();
    double t1 = wait_first_step_after(&j, 0, 120);
    printf("{\"bench\":\"rdzv_first_round\",\"agents\":%d,\"seconds\":%.3f,\"target_s\":2}\n", agents,
           t1 ? t1 - t_last : -1);
    fflush(stdout);
    int rc = t1 ? 0 : 1, dead[2];
    for (int k = 0; recovery && k < 2 && !rc; k++) {
        /* let a checkpoint exist, then kill a follower (k = 0) or the leader */
        while (rl_test_job_last_step(&j) < 45) usleep(100000);
        int l = leader(&j), victim = k == 0 ? (l == agents - 1 ? agents - 2 : agents - 1) : l;
        long long last = rl_test_job_last_step(&j);
        double t_kill = rl_wall_now();
        rl_test_job_kill(&j, victim);
        dead[k] = victim;
        double t = wait_first_step_after(&j, t_kill + 0.5, 120);
        long long k0 = resumed_after(&j, t_kill);
        double back = 0, until = rl_now() + 120;
        while (t && !(back = passed_after(&j, last, t_kill)) && rl_now() < until) usleep(100000);
        printf("{\"bench\":\"rdzv_recovery\",\"agents\":%d,\"killed\":\"%s\",\"mode\":\"%s\",\"seconds\":%.3f,"
               "\"steps_lost\":%lld,\"regained_s\":%.3f,\"target_s\":%d}\n",
               agents, k == 0 ? "follower" : "leader", in_place ? "in_place" : "checkpoint", t ? t - t_kill : -1,
               k0 >= 0 ? last - k0 : -1, back ? back - t_kill : -1, k == 0 && in_place ? 5 : 17);
        fflush(stdout);
        if (!t) rc = 1;
    }
    if (recovery && !rc) rc = grow(&j, agents, agents - 2, in_place, dead, 2);
    rl_test_job_teardown(&j);
    return rc;
}

int main(void) {
    if (getenv("RL_TEST_BIN") == NULL) setenv("RL_TEST_BIN", "bin", 1);
    int rc = run(4, true, true);
    if (!rc) rc = run(4, true, false);
    if (!rc) rc = run(16, false, true);
    return rc;
}
