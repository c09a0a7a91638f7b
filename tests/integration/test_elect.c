/* Leader election on a Lease through the Kubernetes stand-in: candidates
 * are separate processes (as node agents are), so they can be killed and
 * paused. Each candidate appends its transitions ("lead"/"follow" with the
 * wall time) to its own file; the Lease's write history from the stand-in
 * is the other witness. Timing is scaled down from client-go's defaults
 * (lease 4 s, renew deadline 2 s, retry 0.5 s) to keep the suite short. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "children.h"
#include "k8s/k8s.h"
#include "elect/elect.h"
#include "rdzv/rdzv.h"
#include "standin.h"

#define LEASE 4.0
#define DEADLINE 2.0
#define RETRY 0.5
#define MAXC 5

typedef struct cluster {
    rl_test_standin s;
    char dir[256];
    pid_t pid[MAXC];
    int n;
} cluster;

static void candidate(const cluster *c, int i) {
    char id[16], path[300];
    snprintf(id, sizeof id, "cand-%d", i);
    snprintf(path, sizeof path, "%s/%s", c->dir, id);
    rl_log_init(-1);
    rl_log_set_level(RL_LOG_ERROR);
    rl_elector_opts o = {.backend = "k8s", .id = id, .addr = "127.0.0.1", .port = 1000 + i,
                         .lease_s = LEASE, .renew_deadline_s = DEADLINE, .retry_s = RETRY,
                         .kubeconfig = c->s.kubeconfig, .lease_name = "job-leader"};
    rl_elector *el;
    rl_err e = {0};
    if (rl_elector_start(&o, &el, &e) != RL_OK) {
        fprintf(stderr, "candidate %d: %s\n", i, e.msg);
        _exit(3);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    rl_elect_state st = {0};
    bool was = false;
    for (;;) {
        uint64_t seen = st.gen;
        rl_elector_wait(el, seen, 1.0, &st);
        if (st.leading != was) {
            char line[128];
            int n = snprintf(line, sizeof line, "%.6f %s %s\n", rl_wall_now(),
                             st.leading ? "lead" : "follow", st.leader.id);
            if (write(fd, line, (size_t)n) != n) _exit(4);
            was = st.leading;
        }
        if (getppid() == 1) _exit(0);
    }
}

static void start(cluster *c, int n) {
    memset(c, 0, sizeof *c);
    cr_assert_eq(rl_test_standin_start(&c->s, NULL), 0);
    snprintf(c->dir, sizeof c->dir, "%s", c->s.dir);
    c->n = n;
    int i = rl_test_fork_n(n, c->pid);
    cr_assert(i != -2, "fork failed");
    if (i >= 0) candidate(c, i);
}

static void stop(cluster *c) {
    for (int i = 0; i < c->n; i++)
        if (c->pid[i] > 0) {
            kill(c->pid[i], SIGCONT);
            kill(c->pid[i], SIGKILL);
            waitpid(c->pid[i], NULL, 0);
        }
    rl_test_standin_stop(&c->s);
}

/* The Lease's writes, oldest first. */
static cJSON *history(cluster *c) {
    static char out[1 << 20];
    int st = rl_test_standin_admin(&c->s, "GET", "/history?resource=leases&namespace=default&name=job-leader",
                                   NULL, out, sizeof out);
    cr_assert_eq(st, 200, "%s", out);
    cJSON *h = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(h));
    return h;
}

static const char *spec_str(const cJSON *w, const char *f) {
    const cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(w, "object"), "spec");
    const cJSON *v = cJSON_GetObjectItem(sp, f);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Exactly one leader at a time, as the Lease history shows it: whenever the
 * holder changes to someone else, the new holder acquired no earlier than
 * a full lease duration after the previous holder's last renewal (or at
 * once after a release, which empties the holder). Returns the number of
 * holder changes. */
static int check_history(cluster *c, const char **last_holder) {
    cJSON *h = history(c);
    int changes = 0;
    char prev[64] = "";
    double prev_renew = 0;
    const cJSON *w;
    cJSON_ArrayForEach(w, h) {
        const char *holder = spec_str(w, "holderIdentity");
        double renew = 0, acquire = 0;
        rl_k8s_time_parse(spec_str(w, "renewTime"), &renew);
        rl_k8s_time_parse(spec_str(w, "acquireTime"), &acquire);
        if (holder[0] && prev[0] && strcmp(holder, prev) != 0) {
            cr_expect(acquire >= prev_renew + LEASE - 1e-3,
                      "%s acquired at %.3f while %s renewed at %.3f (lease %.0f s)", holder, acquire,
                      prev, prev_renew, LEASE);
            changes++;
        }
        snprintf(prev, sizeof prev, "%s", holder);
        prev_renew = renew;
    }
    static char keep[64];
    snprintf(keep, sizeof keep, "%s", prev);
    if (last_holder) *last_holder = keep;
    cJSON_Delete(h);
    return changes;
}

/* Who leads according to the candidates' own reports (-1: none, -2: more
 * than one), from their last lines. */
static int reported_leader(cluster *c) {
    int who = -1;
    for (int i = 0; i < c->n; i++) {
        char path[300], buf[8192] = "";
        snprintf(path, sizeof path, "%s/cand-%d", c->dir, i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *last = NULL;
        for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n")) last = l;
        if (last && strstr(last, " lead ") && c->pid[i] > 0) who = who == -1 ? i : -2;
    }
    return who;
}

static int wait_leader(cluster *c, double timeout, int not_this) {
    double end = rl_now() + timeout;
    while (rl_now() < end) {
        int w = reported_leader(c);
        if (w >= 0 && w != not_this) return w;
        usleep(50000);
    }
    return reported_leader(c);
}

/* Transition times of candidate i: kind "lead" or "follow". */
static int times_of(cluster *c, int i, const char *kind, double *t, int max) {
    char path[300], line[256];
    snprintf(path, sizeof path, "%s/cand-%d", c->dir, i);
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f) && n < max) {
        double x;
        char k[16];
        if (sscanf(line, "%lf %15s", &x, k) == 2 && strcmp(k, kind) == 0) t[n++] = x;
    }
    fclose(f);
    return n;
}

static void elect_and_kill(int n) {
    cluster c;
    start(&c, n);
    int l = wait_leader(&c, 10, -1);
    cr_assert(l >= 0, "no single leader among %d candidates (%d)", n, l);
    usleep(1500000); /* a few renewals, and nobody else takes over */
    cr_expect_eq(reported_leader(&c), l);
    double killed = rl_wall_now();
    kill(c.pid[l], SIGKILL);
    waitpid(c.pid[l], NULL, 0);
    c.pid[l] = -1;
    int l2 = wait_leader(&c, LEASE + RETRY + 3, l);
    cr_assert(l2 >= 0 && l2 != l, "no new leader after killing cand-%d (%d)", l, l2);
    double t[16];
    int k = times_of(&c, l2, "lead", t, 16);
    cr_assert(k > 0);
    /* within leaseDuration + retryPeriod of the kill (plus the API's and
     * the reporting's latency on a busy machine) */
    cr_expect(t[k - 1] - killed <= LEASE + RETRY + 0.75, "new leader after %.2f s",
              t[k - 1] - killed);
    const char *holder;
    cr_expect_eq(check_history(&c, &holder), 1);
    char want[16];
    snprintf(want, sizeof want, "cand-%d", l2);
    cr_expect_str_eq(holder, want);
    stop(&c);
}

Test(elect, two_candidates_one_leader_then_failover_after_sigkill, .timeout = 60) {
    elect_and_kill(2);
}

Test(elect, five_candidates_one_leader_then_failover_after_sigkill, .timeout = 60) {
    elect_and_kill(5);
}

Test(elect, paused_leader_steps_down_before_another_takes_over, .timeout = 60) {
    cluster c;
    start(&c, 3);
    int l = wait_leader(&c, 10, -1);
    cr_assert(l >= 0);
    /* past the renew deadline, short of the lease */
    kill(c.pid[l], SIGSTOP);
    usleep((useconds_t)((DEADLINE + 0.6) * 1e6));
    kill(c.pid[l], SIGCONT);
    int l2 = wait_leader(&c, LEASE + RETRY + 3, l);
    cr_assert(l2 >= 0 && l2 != l, "no other leader after the pause (%d)", l2);
    usleep(1500000);
    double down[16], up[16];
    int nd = times_of(&c, l, "follow", down, 16), nu = times_of(&c, l2, "lead", up, 16);
    cr_assert(nd > 0 && nu > 0);
    cr_expect(down[nd - 1] < up[nu - 1], "cand-%d stepped down at %.3f, cand-%d led from %.3f",
              l, down[nd - 1], l2, up[nu - 1]);
    cr_expect_eq(reported_leader(&c), l2, "the paused candidate resumes as a follower");
    cr_expect_eq(check_history(&c, NULL), 1);
    stop(&c);
}

Test(elect, api_outage_no_split_brain_and_recovery, .timeout = 60) {
    cluster c;
    start(&c, 3);
    int l = wait_leader(&c, 10, -1);
    cr_assert(l >= 0);
    char out[256];
    /* longer than the lease: the leader cannot renew, nobody can acquire */
    cr_assert_eq(rl_test_standin_admin(&c.s, "POST", "/outage", "{\"mode\":\"refuse\",\"seconds\":6}",
                                       out, sizeof out), 200, "%s", out);
    usleep((useconds_t)((DEADLINE + 1.5) * 1e6));
    cr_expect_eq(reported_leader(&c), -1, "the leader must stop leading when it cannot renew");
    int l2 = wait_leader(&c, 6 + LEASE + RETRY + 4, -1);
    cr_expect(l2 >= 0, "a leader after the API came back (%d)", l2);
    check_history(&c, NULL);
    stop(&c);
}

Test(elect, release_on_clean_exit_hands_over_at_once, .timeout = 60) {
    rl_test_standin s;
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0);
    rl_log_set_level(RL_LOG_ERROR);
    rl_elector_opts o = {.backend = "k8s", .id = "a", .addr = "10.0.0.1", .port = 29400,
                         .lease_s = LEASE, .renew_deadline_s = DEADLINE, .retry_s = RETRY,
                         .kubeconfig = s.kubeconfig, .lease_name = "rel"};
    rl_elector *a, *b;
    rl_err e = {0};
    cr_assert_eq(rl_elector_start(&o, &a, &e), RL_OK, "%s", e.msg);
    rl_elect_state st = {0};
    for (int i = 0; i < 50 && !st.leading; i++) rl_elector_wait(a, st.gen, 0.2, &st);
    cr_assert(st.leading);
    o.id = "b", o.addr = "10.0.0.2";
    cr_assert_eq(rl_elector_start(&o, &b, &e), RL_OK, "%s", e.msg);
    rl_elect_state sb = {0};
    for (int i = 0; i < 50 && strcmp(sb.leader.id, "a") != 0; i++) rl_elector_wait(b, sb.gen, 0.2, &sb);
    /* followers learn where the leader's store is */
    cr_expect_str_eq(sb.leader.addr, "10.0.0.1");
    cr_expect_eq(sb.leader.port, 29400);
    double t0 = rl_now();
    rl_elector_stop(a, true);
    while (!sb.leading && rl_now() - t0 < LEASE) rl_elector_wait(b, sb.gen, 0.2, &sb);
    cr_expect(sb.leading, "b did not take over after a's release");
    cr_expect(rl_now() - t0 < 2 * RETRY + 1.0, "took %.2f s", rl_now() - t0);
    rl_elector_stop(b, true);
    rl_test_standin_stop(&s);
}

/* A Lease edited by hand: a holder that is no candidate, garbage where the
 * leader's address should be. Followers see a leader they cannot use (port
 * 0: the agent keeps waiting), nothing crashes, and once the record stays
 * unchanged for its duration a candidate takes it over and rewrites it. */
Test(elect, hand_edited_lease_is_survived_then_taken_over, .timeout = 60) {
    rl_test_standin s;
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0);
    char out[4096];
    cr_assert_eq(rl_test_kubectl(&s, "apply -f -",
                                 "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\","
                                 "\"metadata\":{\"name\":\"junk\",\"annotations\":{\"ringleader.dev/leader-port\":"
                                 "\"not a port\",\"ringleader.dev/leader-addr\":\"\"}},"
                                 "\"spec\":{\"holderIdentity\":\"ghost\",\"leaseDurationSeconds\":3}}",
                                 out, sizeof out),
                 0, "%s", out);
    rl_log_set_level(RL_LOG_ERROR);
    rl_elector_opts o = {.backend = "k8s", .id = "a", .addr = "h", .port = 1, .lease_s = LEASE,
                         .renew_deadline_s = DEADLINE, .retry_s = RETRY, .kubeconfig = s.kubeconfig,
                         .lease_name = "junk"};
    rl_elector *a;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_elector_start(&o, &a, &e), RL_OK, "%s", e.msg);
    rl_elect_state st = {0};
    while (strcmp(st.leader.id, "ghost") != 0 && rl_now() - t0 < 2) rl_elector_wait(a, st.gen, 0.2, &st);
    cr_expect_str_eq(st.leader.id, "ghost");
    cr_expect_eq(st.leader.port, 0, "a port that is not a number reads as none");
    while (!st.leading && rl_now() - t0 < 3 + 3) rl_elector_wait(a, st.gen, 0.2, &st);
    cr_expect(st.leading, "the elector must take the abandoned Lease over");
    cr_expect(rl_now() - t0 >= 3 - 0.3, "but not before it stayed unchanged for its duration (%.2f s)",
              rl_now() - t0);
    rl_elector_stop(a, true);
    rl_test_standin_stop(&s);
}

/* A leader's renewal that goes wrong on the way back: the server applied it
 * but the answer was a 503 or a cut connection (so a retry would carry a
 * resourceVersion it had just made stale), or someone else wrote the Lease
 * between our read and our write (kubectl label). None of these is a rival
 * taking the lease: the leader must keep leading without a blip -- no
 * leader_lost, no change the elector publishes -- and go on renewing. The
 * stand-in's /faults make each happen on the next Lease PUT. */
Test(elect, lost_renewal_answers_and_conflicts_keep_the_leader, .timeout = 60) {
    rl_test_standin s;
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0);
    rl_log_set_level(RL_LOG_ERROR);
    rl_elector_opts o = {.backend = "k8s", .id = "a", .addr = "10.0.0.1", .port = 29400,
                         .lease_s = LEASE, .renew_deadline_s = DEADLINE, .retry_s = RETRY,
                         .kubeconfig = s.kubeconfig, .lease_name = "keep"};
    rl_elector *a;
    rl_err e = {0};
    cr_assert_eq(rl_elector_start(&o, &a, &e), RL_OK, "%s", e.msg);
    rl_elect_state st = {0};
    for (int i = 0; i < 50 && !st.leading; i++) rl_elector_wait(a, st.gen, 0.2, &st);
    cr_assert(st.leading);
    const char *faults[] = {"503", "drop", "conflict"};
    for (int f = 0; f < 3; f++) {
        char body[200], out[256], path[200];
        snprintf(body, sizeof body, "{\"method\":\"PUT\",\"resource\":\"leases\",\"count\":1,\"answer\":\"%s\"}",
                 faults[f]);
        cr_assert_eq(rl_test_standin_admin(&s, "POST", "/faults", body, out, sizeof out), 200, "%s", out);
        /* the faulty renewal, then ordinary ones (the deadline is 4 retries) */
        rl_elect_state now;
        rl_elector_wait(a, st.gen, 4 * RETRY + 0.5, &now);
        cr_expect(now.leading && now.gen == st.gen, "fault %s: the leader lost its lease (gen %llu -> %llu)",
                  faults[f], (unsigned long long)st.gen, (unsigned long long)now.gen);
        /* the faults were met (the stand-in applied and then lost the
         * writes, or made them conflict), and renewals went on after */
        static char hist[1 << 20];
        snprintf(path, sizeof path, "/history?resource=leases&namespace=default&name=keep");
        cr_assert_eq(rl_test_standin_admin(&s, "GET", path, NULL, hist, sizeof hist), 200);
        cJSON *h = cJSON_Parse(hist);
        int n = cJSON_GetArraySize(h);
        const cJSON *last = cJSON_GetObjectItem(cJSON_GetArrayItem(h, n - 1), "object");
        const cJSON *sp = cJSON_GetObjectItem(last, "spec");
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(sp, "holderIdentity")), "a");
        double renew = 0;
        rl_k8s_time_parse(cJSON_GetStringValue(cJSON_GetObjectItem(sp, "renewTime")), &renew);
        cr_expect(rl_wall_now() - renew < 2 * RETRY + 0.5, "fault %s: no renewal for %.2f s", faults[f],
                  rl_wall_now() - renew);
        cJSON_Delete(h);
        cr_assert_eq(rl_test_standin_admin(&s, "GET", "/faults", NULL, out, sizeof out), 200, "%s", out);
        cr_expect(strstr(out, "\"left\": 0") != NULL, "fault %s not met: %s", faults[f], out);
        st = now;
    }
    rl_elector_stop(a, true);
    rl_test_standin_stop(&s);
}
