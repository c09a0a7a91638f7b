/* The rendezvous coordinator's decisions as a table (round_internal.h):
 * when a round closes and how a running one ends, with no store, no
 * Service and no clock. The same rounds between real agents are in
 * test_elastic.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "rdzv/round_internal.h"

static rl_round_opts opts(int min, int max) {
    return (rl_round_opts){.min_nodes = min, .max_nodes = max, .last_call_s = 10, .heartbeat_s = 5,
                           .heartbeat_misses = 3, .max_restarts = 3};
}

static rl_round_node node(const char *id) {
    rl_round_node n = {.local_world = 1};
    snprintf(n.id, sizeof n.id, "%s", id);
    return n;
}

static rl_peer peer(const char *id, bool terminating) {
    rl_peer p = {.ready = true, .terminating = terminating};
    snprintf(p.id, sizeof p.id, "%s", id);
    return p;
}

Test(round_decide, a_round_closes_when_full_or_every_peer_joined_or_the_last_call_passed) {
    rl_round_opts fixed = opts(2, 2), elastic = opts(2, 4);
    rl_round_node j[] = {node("a"), node("b"), node("c")};
    rl_peer peers[] = {peer("a", false), peer("b", false), peer("c", false), peer("x", true)};
    /* fixed size: only when full */
    cr_expect(!rl_round_gathered(&fixed, j, 1, -1, peers, 3, true, NULL, -1));
    cr_expect(rl_round_gathered(&fixed, j, 2, 0, peers, 3, true, NULL, -1));
    /* elastic: every live peer in (a terminating one is not waited for) ... */
    cr_expect(rl_round_gathered(&elastic, j, 3, 0, peers, 4, true, NULL, -1));
    /* ... not while one is missing or the Service is not listed yet ... */
    cr_expect(!rl_round_gathered(&elastic, j, 2, 3, peers, 3, true, NULL, -1));
    cr_expect(!rl_round_gathered(&elastic, j, 3, 3, peers, 3, false, NULL, -1));
    /* ... or at the last call, from min_nodes on */
    cr_expect(rl_round_gathered(&elastic, j, 2, 10, peers, 3, true, NULL, -1));
    cr_expect(!rl_round_gathered(&elastic, j, 1, 99, peers, 3, true, NULL, -1));
    /* a new leader's first round waits for the last round's nodes only */
    rl_round_node expect[] = {node("a"), node("b")};
    cr_expect(rl_round_gathered(&elastic, j, 2, 0, peers, 3, true, expect, 2));
    cr_expect(!rl_round_gathered(&elastic, j, 1, -1, peers, 3, true, expect, 2));
}

typedef struct fixture {
    rl_round_opts o;
    rl_round_member m[3];
    rl_round_look_member lm[3];
    rl_peer peers[4];
    rl_round_watch w;
    rl_round_look l;
    char reason[1024];
    bool graceful;
} fixture;

/* Three members a, b, c at t = 0, each with heartbeat 1, all listed. */
static void setup(fixture *f, int max) {
    memset(f, 0, sizeof *f);
    f->o = opts(2, max);
    const char *ids[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        f->m[i] = (rl_round_member){.node = node(ids[i]), .hb = 1, .hb_time = 0, .listed = true};
        f->lm[i] = (rl_round_look_member){.hb = 1};
        f->peers[i] = peer(ids[i], false);
    }
    f->w = (rl_round_watch){.o = &f->o, .m = f->m, .nm = 3, .joins = 3, .ver_seen = 7};
    f->l = (rl_round_look){.now = 1, .m = f->lm, .peers = f->peers, .np = 3, .synced = true, .ver = 7,
                           .joins = 3};
}

static rl_round_state judge(fixture *f) {
    return rl_round_judge(&f->w, &f->l, &f->graceful, f->reason, sizeof f->reason);
}

Test(round_decide, a_quiet_healthy_round_runs_on) {
    fixture f;
    setup(&f, 3);
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    f.l.now = 100, f.lm[0].hb = f.lm[1].hb = f.lm[2].hb = 40; /* heartbeats moved */
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    cr_expect_eq(f.m[1].hb_time, 100);
}

Test(round_decide, a_silent_member_is_lost_after_its_misses) {
    fixture f;
    setup(&f, 3);
    f.l.now = 15; /* 5 s x 3 misses: not yet */
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    f.l.now = 15.5;
    f.lm[0].hb = 2, f.lm[2].hb = 2; /* b is silent */
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect_str_eq(f.reason, "node b lost: no heartbeat for 15.5 s");
    cr_expect(!f.graceful);
}

Test(round_decide, a_failure_report_ends_the_round_and_all_done_completes_the_job) {
    fixture f;
    setup(&f, 3);
    f.l.events = 1;
    f.lm[0].done = true, f.lm[2].fail = "trainer exited 1";
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect_str_eq(f.reason, "node c: trainer exited 1");
    /* reports are read only when their counter moved */
    setup(&f, 3);
    f.lm[0].done = f.lm[1].done = f.lm[2].done = true;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    f.l.events = 3;
    cr_expect_eq(judge(&f), RL_ROUND_COMPLETE);
    cr_expect_str_eq(f.reason, "every node's trainers finished");
}

/* The class decides: a user error fails the job at once, whatever the
 * restart limit; a crash or the infrastructure only ends the round (the
 * coordinator counts crashes, rl_round_limit below). */
Test(round_decide, a_user_error_fails_the_job_other_classes_end_the_round) {
    static const struct { rl_fail_class cls; rl_round_state want; } t[] = {
        {RL_FAIL_USER, RL_ROUND_FAILED},   {RL_FAIL_CRASH, RL_ROUND_NEXT},
        {RL_FAIL_INFRA, RL_ROUND_NEXT},    {RL_FAIL_PREEMPTION, RL_ROUND_NEXT},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fixture f;
        setup(&f, 3);
        f.l.events = 1;
        f.lm[1].fail = "UserError: rank 1 (pid 9) exited with status 2: data.train: no files match";
        f.lm[1].cls = t[i].cls;
        cr_expect_eq(judge(&f), t[i].want, "class %s", rl_fail_class_name(t[i].cls));
        cr_expect_str_eq(f.reason, "node b: UserError: rank 1 (pid 9) exited with status 2: data.train: no files match");
    }
}

Test(round_decide, leaving_members_end_the_round_new_nodes_grow_it_gracefully) {
    fixture f;
    setup(&f, 4);
    f.peers[1].terminating = true;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect_str_eq(f.reason, "node b is terminating");
    cr_expect(!f.graceful);
    /* gone from the Service */
    setup(&f, 4);
    f.l.np = 2;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect_str_eq(f.reason, "node c left the service");
    /* one never listed yet (its endpoint lags its join) is not gone */
    setup(&f, 4);
    f.m[2].listed = false, f.l.np = 2;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    /* a new peer grows the job, only on a change of the set */
    setup(&f, 4);
    f.peers[3] = peer("d", false), f.l.np = 4;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING); /* the same version: it was there at the close */
    f.l.ver = 8;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect(f.graceful);
    cr_expect_str_eq(f.reason, "node d arrived: growing the job");
    /* a full job does not grow; a late join grows one that is not */
    setup(&f, 3);
    f.peers[3] = peer("d", false), f.l.np = 4, f.l.ver = 8, f.l.joins = 4;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    setup(&f, 4);
    f.l.joins = 4;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect(f.graceful);
}

/* Topology: zones contiguous in the ring (each entered and left once), ids
 * within a zone; the table that carries the order parses back, and a table
 * out of that order does not. */
Test(round_decide, ranks_follow_zones_then_ids) {
    const char *ids[] = {"job-0", "job-1", "job-2", "job-3", "job-4"}, *zones[] = {"b", "a", "b", "a", "c"};
    rl_round_node n[5];
    for (int i = 0; i < 5; i++) {
        n[i] = node(ids[i]);
        snprintf(n[i].zone, sizeof n[i].zone, "%s", zones[i]);
    }
    cr_expect_eq(rl_round_zone_crossings(n, 5), 5, "the id order crosses zones at every edge");
    rl_round_order(n, 5);
    const char *want[] = {"job-1", "job-3", "job-0", "job-2", "job-4"};
    for (int i = 0; i < 5; i++) cr_expect_str_eq(n[i].id, want[i], "rank position %d", i);
    cr_expect_eq(rl_round_zone_crossings(n, 5), 3, "three zones: three crossing edges, the fewest");
    cr_expect_eq(rl_round_zone_crossings(n, 1), 0);
    /* no zones known: the id order, no crossings */
    for (int i = 0; i < 5; i++) n[i] = node(ids[4 - i]);
    rl_round_order(n, 5);
    cr_expect_str_eq(n[0].id, "job-0");
    cr_expect_eq(rl_round_zone_crossings(n, 5), 0);

    rl_round_table t;
    rl_err e = {0};
    const char *ok = "{\"round\":4,\"world\":3,\"restarts\":0,\"nodes\":["
                     "{\"id\":\"job-1\",\"addr\":\"h\",\"zone\":\"a\",\"local_world\":1,\"rank0\":0},"
                     "{\"id\":\"job-0\",\"addr\":\"h\",\"zone\":\"b\",\"local_world\":2,\"rank0\":1}]}";
    cr_assert_eq(rl_round_table_parse(ok, strlen(ok), &t, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(t.nodes[0].zone, "a");
    cr_expect_str_eq(t.nodes[1].id, "job-0");
    rl_round_table_free(&t);
    const char *bad = "{\"round\":4,\"world\":2,\"restarts\":0,\"nodes\":["
                      "{\"id\":\"job-1\",\"addr\":\"h\",\"zone\":\"b\",\"local_world\":1,\"rank0\":0},"
                      "{\"id\":\"job-0\",\"addr\":\"h\",\"zone\":\"a\",\"local_world\":1,\"rank0\":1}]}";
    cr_expect_eq(rl_round_table_parse(bad, strlen(bad), &t, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "not strictly sorted by zone, rack and id at 1"), "%s", e.msg);
}

/* Racks within zones: each (zone, rack) contiguous, so the ring leaves
 * each rack once; a node whose rack is unknown comes first in its zone.
 * The table carries the racks and refuses them out of order. */
Test(round_decide, ranks_follow_racks_within_zones) {
    const char *ids[] = {"n-0", "n-1", "n-2", "n-3", "n-4", "n-5"};
    const char *zones[] = {"a", "b", "a", "b", "a", "b"}, *racks[] = {"r2", "r1", "r1", "r2", "r2", ""};
    rl_round_node n[6];
    for (int i = 0; i < 6; i++) {
        n[i] = node(ids[i]);
        snprintf(n[i].zone, sizeof n[i].zone, "%s", zones[i]);
        snprintf(n[i].rack, sizeof n[i].rack, "%s", racks[i]);
    }
    cr_expect_eq(rl_round_rack_crossings(n, 6), 6, "the id order leaves a rack at every edge");
    rl_round_order(n, 6);
    const char *want[] = {"n-2", "n-0", "n-4", "n-5", "n-1", "n-3"};
    for (int i = 0; i < 6; i++) cr_expect_str_eq(n[i].id, want[i], "rank position %d", i);
    cr_expect_eq(rl_round_zone_crossings(n, 6), 2);
    cr_expect_eq(rl_round_rack_crossings(n, 6), 5, "a/r1, a/r2, b/?, b/r1, b/r2: five groups, five edges");

    rl_round_table t;
    rl_err e = {0};
    const char *ok = "{\"round\":1,\"world\":2,\"restarts\":0,\"nodes\":["
                     "{\"id\":\"n-2\",\"addr\":\"h\",\"zone\":\"a\",\"rack\":\"r1\",\"local_world\":1,\"rank0\":0},"
                     "{\"id\":\"n-0\",\"addr\":\"h\",\"zone\":\"a\",\"rack\":\"r2\",\"local_world\":1,\"rank0\":1}]}";
    cr_assert_eq(rl_round_table_parse(ok, strlen(ok), &t, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(t.nodes[1].rack, "r2");
    rl_round_table_free(&t);
    const char *bad = "{\"round\":1,\"world\":2,\"restarts\":0,\"nodes\":["
                      "{\"id\":\"n-0\",\"addr\":\"h\",\"zone\":\"a\",\"rack\":\"r2\",\"local_world\":1,\"rank0\":0},"
                      "{\"id\":\"n-2\",\"addr\":\"h\",\"zone\":\"a\",\"rack\":\"r1\",\"local_world\":1,\"rank0\":1}]}";
    cr_expect_eq(rl_round_table_parse(bad, strlen(bad), &t, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "not strictly sorted by zone, rack and id at 1"), "%s", e.msg);
    const char *typed = "{\"round\":1,\"world\":1,\"restarts\":0,\"nodes\":["
                        "{\"id\":\"n-0\",\"addr\":\"h\",\"rack\":7,\"local_world\":1,\"rank0\":0}]}";
    cr_expect_eq(rl_round_table_parse(typed, strlen(typed), &t, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "\"rack\" must be a string"), "%s", e.msg);
}

Test(round_decide, past_the_restart_limit_a_next_round_is_a_failed_job) {
    char reason[1024] = "node c: trainer exited 1";
    cr_expect_eq(rl_round_limit(RL_ROUND_NEXT, 3, 3, reason, sizeof reason), RL_ROUND_NEXT);
    cr_expect_eq(rl_round_limit(RL_ROUND_COMPLETE, 9, 3, reason, sizeof reason), RL_ROUND_COMPLETE);
    cr_expect_eq(rl_round_limit(RL_ROUND_NEXT, 4, 3, reason, sizeof reason), RL_ROUND_FAILED);
    cr_expect_str_eq(reason, "restart limit: 4 trainer crashes, at most 3 allowed (last: node c: trainer exited 1)");
}

/* After a round lost a member, the next closes once the survivors joined
 * and the lost one has been silent RL_ROUND_SILENT_S -- not after the last
 * call -- and a survivor still winding down (its heartbeat moving) is
 * waited for. */
Test(round_decide, after_a_loss_the_survivors_close_the_round_once_the_lost_one_is_silent) {
    rl_round_opts o = opts(2, 4);
    rl_round_member prev[3] = {{.node = node("a"), .hb_time = 100}, {.node = node("b"), .hb_time = 100},
                               {.node = node("c"), .hb_time = 100}};
    rl_round_node j[] = {node("a"), node("c")};
    /* b stopped at 100: silent for less than the threshold, then past it */
    cr_expect(!rl_round_survivors_in(&o, j, 2, prev, 3, 100 + RL_ROUND_SILENT_S - 0.1));
    cr_expect(rl_round_survivors_in(&o, j, 2, prev, 3, 100 + RL_ROUND_SILENT_S));
    /* b's heartbeat moved at 101.5: it is alive, wait for it */
    prev[1].hb_time = 101.5;
    cr_expect(!rl_round_survivors_in(&o, j, 2, prev, 3, 100 + RL_ROUND_SILENT_S));
    rl_round_node all[] = {node("a"), node("b"), node("c")};
    cr_expect(rl_round_survivors_in(&o, all, 3, prev, 3, 101.6));
    /* never below min_nodes, however silent the rest */
    rl_round_node one[] = {node("a")};
    cr_expect(!rl_round_survivors_in(&o, one, 1, prev, 3, 1000));
}

/* The pre-flight named b: b is left out while the job keeps min_nodes 2,
 * once a round; a report naming no member, a job at its minimum or a
 * bench of 0 s only names it. */
Test(round_decide, a_degraded_member_is_left_out_while_the_job_keeps_its_minimum) {
    fixture f;
    setup(&f, 4);
    f.o.bench_s = 600;
    rl_round_degraded d = {.n = 1, .ids = {"b"}, .why = "rank 1 (pod b, node n): copy 0.2 GB/s, 0.05x the median"};
    f.l.degraded = &d;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect(!f.graceful, "in place: the trainers park, nothing checkpoints");
    cr_expect_eq(f.w.benched.n, 1);
    cr_expect_str_eq(f.w.benched.ids[0], "b");
    cr_expect(strstr(f.reason, "node b left out for 600 s: the pre-flight found it below the median (rank 1"), "%s",
              f.reason);
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING, "judged once a round");
    setup(&f, 4);
    f.o.bench_s = 600;
    f.o.min_nodes = 3;
    f.l.degraded = &d;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING, "at the minimum it is only named");
    cr_expect_eq(f.w.benched.n, 0);
    setup(&f, 4);
    f.l.degraded = &d; /* bench_s 0 */
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING);
    setup(&f, 4);
    f.o.bench_s = 600;
    rl_round_degraded x = {.n = 1, .ids = {"z"}, .why = "?"};
    f.l.degraded = &x;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING, "not a member");
}

/* Benched nodes that joined wait as standbys, not growth; when their time
 * is up the job grows with them (gracefully). A new peer in the Service
 * that is benched does not grow the job either. */
Test(round_decide, a_benched_standby_returns_when_its_time_is_up) {
    fixture f;
    setup(&f, 4);
    rl_round_bench sb[] = {{.id = "d", .until = 50}};
    f.w.standby = sb, f.w.nstandby = 1;
    f.peers[3] = peer("d", false), f.l.np = 4, f.l.ver = 8;
    cr_expect_eq(judge(&f), RL_ROUND_RUNNING, "a standby is not growth");
    f.l.now = 50;
    f.lm[0].hb = f.lm[1].hb = f.lm[2].hb = 2;
    cr_expect_eq(judge(&f), RL_ROUND_NEXT);
    cr_expect(f.graceful);
    cr_expect_str_eq(f.reason, "node d is back from the bench: growing the job");
}

/* What a round places: joined nodes off the bench first, the benched ones
 * after as standbys -- unless that leaves fewer than min_nodes. */
Test(round_decide, a_round_places_the_nodes_off_the_bench) {
    rl_round_opts o = opts(2, 4);
    rl_round_node j[] = {node("a"), node("b"), node("c")};
    rl_round_bench b[] = {{.id = "b", .until = 100}, {.id = "c", .until = 10}};
    cr_expect_eq(rl_round_place(&o, j, 3, b, 2, 50), 2, "c's time is up");
    cr_expect_str_eq(j[0].id, "a");
    cr_expect_str_eq(j[1].id, "c");
    cr_expect_str_eq(j[2].id, "b", "the standby after the placed");
    rl_round_node k[] = {node("a"), node("b")};
    cr_expect_eq(rl_round_place(&o, k, 2, b, 2, 50), 2, "min_nodes first: nobody is left out");
    cr_expect_str_eq(k[1].id, "b");
}
