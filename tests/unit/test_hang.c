/* Hang diagnosis, the pure part (hang.h): the deadline, the stuck op, the
 * verdict that names the rank, and the heartbeat's wire format. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hang/hang.h"

Test(hang, the_deadline_is_k_medians_with_a_floor) {
    double steps[] = {0.2, 0.1, 0.3, 5.0 /* one slow step (a checkpoint) does not move the median */, 0.2};
    cr_expect_float_eq(rl_hang_deadline(steps, 5, 10, 1), 2.0, 1e-12);
    cr_expect_float_eq(rl_hang_deadline(steps, 5, 10, 3), 3.0, 1e-12, "the floor wins");
    cr_expect_eq(rl_hang_deadline(steps, 2, 10, 1), 0, "two steps are too few to judge");
    cr_expect_eq(rl_hang_deadline(steps, 5, 0, 1), 0, "factor 0: no watch");
    double odd[] = {NAN, -1, 0, 0.5, 0.5, 0.5};
    cr_expect_float_eq(rl_hang_deadline(odd, 6, 4, 0.1), 2.0, 1e-12, "NaN and non-positive steps are ignored");
    double few[] = {NAN, 0.5, 0.5};
    cr_expect_eq(rl_hang_deadline(few, 3, 4, 0.1), 0, "only two usable steps");
}

Test(hang, the_stuck_op_is_the_oldest_unfinished_past_the_deadline) {
    rl_comm_record r[] = {
        {.seq = 7, .op = "allreduce", .t_issue = 10, .t_done = 10.5},
        {.seq = 8, .op = "allreduce", .t_issue = 11, .t_done = 0},
        {.seq = 9, .op = "allreduce", .t_issue = 11.5, .t_done = 0},
    };
    cr_expect_null(rl_hang_stuck(r, 3, 13, 2.5), "8 ran 2 s of 2.5");
    const rl_comm_record *s = rl_hang_stuck(r, 3, 13.5, 2.5);
    cr_assert_not_null(s);
    cr_expect_eq(s->seq, 8);
    cr_expect_null(rl_hang_stuck(r, 3, 100, 0), "no deadline: no verdict");
    cr_expect_null(rl_hang_stuck(r, 1, 100, 1), "every op done");
}

static rl_hang_rank rank_at(int r, bool answered, uint64_t issued, const char *pod) {
    rl_hang_rank x = {.rank = r, .seen = true, .answered = answered, .issued = issued, .done = issued - 1,
                      .step = 40, .busy_s = 0.25, .unix_time = 1000};
    snprintf(x.op, sizeof x.op, "allreduce");
    snprintf(x.pod, sizeof x.pod, "%s", pod);
    snprintf(x.node, sizeof x.node, "node-%d", r);
    return x;
}

Test(hang, the_verdict_names_who_stopped_and_who_never_entered) {
    rl_hang_rank ranks[4] = {rank_at(0, true, 1580, "job-0"), rank_at(1, true, 1580, "job-1"),
                             rank_at(2, false, 1579, "job-2"), rank_at(3, true, 1579, "job-3")};
    char out[1024];
    int n = rl_hang_verdict(ranks, 4, 1580, "allreduce", 1002.5, out, sizeof out);
    cr_expect_eq(n, 2);
    cr_expect(strstr(out, "rank 2 (pod job-2, node node-2) stopped responding in allreduce #1580 "
                          "(last heartbeat 2.5 s ago, newest allreduce #1579)"),
              "%s", out);
    cr_expect(strstr(out, "rank 3 (pod job-3, node node-3) never entered allreduce #1580 (its newest is #1579)"), "%s",
              out);
    cr_expect(!strstr(out, "rank 1 "), "rank 1 only waits: %s", out);
    cr_expect(!strstr(out, "rank 0 "), "%s", out);
}

Test(hang, a_rank_without_any_heartbeat_and_a_fault_nobody_caused) {
    rl_hang_rank ranks[2] = {rank_at(0, true, 9, "a"), {.rank = 1}};
    char out[512];
    cr_expect_eq(rl_hang_verdict(ranks, 2, 9, "broadcast", 1000, out, sizeof out), 1);
    cr_expect(strstr(out, "rank 1 (pod ?, node ?) stopped responding in broadcast #9 (no heartbeat at all)"), "%s", out);
    ranks[1] = rank_at(1, true, 9, "b");
    cr_expect_eq(rl_hang_verdict(ranks, 2, 9, "broadcast", 1000, out, sizeof out), 0);
    cr_expect(strstr(out, "every rank of 2 entered broadcast #9 and none finished it"), "%s", out);
}

Test(hang, many_culprits_are_counted_not_listed) {
    rl_hang_rank ranks[10];
    for (int r = 0; r < 10; r++) ranks[r] = rank_at(r, true, r == 0 ? 50 : 49, "p");
    char out[2048];
    cr_expect_eq(rl_hang_verdict(ranks, 10, 50, "allreduce", 1000, out, sizeof out), 9);
    cr_expect(strstr(out, "; and 5 more"), "%s", out);
    char tiny[32];
    rl_hang_verdict(ranks, 10, 50, "allreduce", 1000, tiny, sizeof tiny);
    cr_expect_lt(strlen(tiny), sizeof tiny, "truncated, never overrun");
}

Test(hang, heartbeats_round_trip_and_garbage_is_refused) {
    rl_hang_rank r = rank_at(3, true, 1580, "llama-3");
    r.busy_total = 2.5, r.busy_steps = 10, r.rechecked = true;
    rl_comm_record rec[1] = {{.seq = 1580, .op = "allreduce", .bytes = 4096, .t_issue = 99, .t_done = 0}};
    char *j = rl_hang_rank_json(&r, rec, 1, 100, 5000);
    cr_assert_not_null(j);
    cr_expect(strstr(j, "\"running_s\":1") && strstr(j, "\"issued_unix\":4999"), "%s", j);
    rl_hang_rank back;
    rl_err e = {0};
    cr_assert_eq(rl_hang_rank_parse(j, strlen(j), "answer", &back, &e), RL_OK, "%s", e.msg);
    free(j);
    cr_expect_eq(back.rank, 3);
    cr_expect_eq(back.issued, 1580);
    cr_expect_eq(back.done, 1579);
    cr_expect_str_eq(back.pod, "llama-3");
    cr_expect_str_eq(back.node, "node-3");
    cr_expect_float_eq(back.busy_total, 2.5, 1e-12);
    cr_expect_float_eq(back.busy_steps, 10, 1e-12);
    cr_expect(back.rechecked && !back.net_pending);
    cr_expect_eq(back.busy_s, 0, "the pace is rank 0's to judge, not on the wire");
    cr_expect(back.seen && !back.answered, "answered is the reader's to say");
    const char *bad[] = {"", "[]", "{\"rank\":-1,\"issued\":1,\"done\":1,\"step\":1,\"unix\":1}",
                         "{\"rank\":1,\"issued\":1e300,\"done\":1,\"step\":1,\"unix\":1}",
                         "{\"rank\":1,\"issued\":1,\"done\":1,\"step\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(rl_hang_rank_parse(bad[i], strlen(bad[i]), "records/1", &back, &e), RL_EINPUT, "%s", bad[i]);
        cr_expect(strstr(e.msg, "records/1"), "names the key: %s", e.msg);
    }
}

Test(hang, the_straggler_is_the_rank_busy_longest) {
    rl_hang_rank ranks[4] = {rank_at(0, true, 9, "a"), rank_at(1, true, 9, "b"), rank_at(2, true, 9, "c"),
                             rank_at(3, true, 9, "d")};
    double busy[4] = {0.10, 0.12, 0.40, 0.11};
    for (int r = 0; r < 4; r++) ranks[r].busy_s = busy[r];
    rl_hang_slow slow[4];
    char out[512];
    cr_expect_eq(rl_hang_stragglers(ranks, 4, 1.5, slow, 4, out, sizeof out), 1);
    cr_expect_eq(slow[0].rank, 2);
    cr_expect_float_eq(slow[0].ratio, 0.40 / 0.115, 1e-9);
    cr_expect(strstr(out, "rank 2 (pod c, node node-2) is a straggler: 3.5x the median busy time per step "
                          "(0.400 s vs 0.115 s)"),
              "%s", out);
    cr_expect_eq(rl_hang_stragglers(ranks, 4, 4, slow, 4, out, sizeof out), 0, "under the factor");
    cr_expect_str_eq(out, "");
    ranks[3].busy_s = 0, ranks[1].busy_s = NAN;
    cr_expect_eq(rl_hang_stragglers(ranks, 4, 1.5, slow, 4, out, sizeof out), 0,
                 "two known paces: no median to stand out from");
}

Test(hang, stragglers_slowest_first_and_counted_past_max) {
    rl_hang_rank ranks[8];
    for (int r = 0; r < 8; r++) ranks[r] = rank_at(r, true, 9, "p"), ranks[r].busy_s = 0.1;
    ranks[5].busy_s = 0.5, ranks[6].busy_s = 0.9, ranks[7].busy_s = 0.3;
    rl_hang_slow slow[2];
    char out[1024];
    cr_expect_eq(rl_hang_stragglers(ranks, 8, 2, slow, 2, out, sizeof out), 3);
    cr_expect_eq(slow[0].rank, 6);
    cr_expect_eq(slow[1].rank, 5);
    cr_expect(strstr(out, "; and 1 more") && !strstr(out, "rank 7 "), "%s", out);
}

Test(hang, the_preflight_names_a_node_below_the_median) {
    rl_hang_rank ranks[4];
    for (int r = 0; r < 4; r++)
        ranks[r] = rank_at(r, true, 1, "p"), ranks[r].copy_gbps = 4.0, ranks[r].shm_bytes = 1024.0 * (1 << 20);
    char out[512];
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, NULL), 0);
    cr_expect_str_eq(out, "");
    ranks[2].copy_gbps = 1.2;
    ranks[3].shm_bytes = 64.0 * (1 << 20);
    double ratio[4];
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, ratio), 2);
    cr_expect_float_eq(ratio[2], 0.3, 1e-9);
    cr_expect_float_eq(ratio[3], 0.0625, 1e-9);
    cr_expect(ratio[0] == 1 && ratio[1] == 1, "ranks within range: %g %g", ratio[0], ratio[1]);
    cr_expect(strstr(out, "rank 2 (pod p, node node-2): copy 1.2 GB/s, 0.30x the median 4.0"), "%s", out);
    cr_expect(strstr(out, "rank 3 (pod p, node node-3): /dev/shm 64.0 MiB free, 0.06x the median 1024.0"), "%s", out);
    ranks[2].shm_bytes = 64.0 * (1 << 20);
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, NULL), 2, "two figures, one rank named once");
    cr_expect(strstr(out, "rank 2 (pod p, node node-2): copy 1.2 GB/s, 0.30x the median 4.0 GB/s: /dev/shm 64.0 "
                          "MiB free, 0.12x the median 544.0 MiB free; rank 3"),
              "%s", out);
    /* a recheck names only ranks the first figures named: rank 3's low
     * shm is not confirmed, and still counts in the median */
    ranks[3].passed_first = true;
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, ratio), 1, "%s", out);
    cr_expect(strstr(out, "rank 2 (pod p, node node-2): copy 1.2 GB/s, 0.30x the median 4.0 GB/s: /dev/shm 64.0 "
                          "MiB free, 0.12x the median 544.0 MiB free") && !strstr(out, "rank 3"),
              "%s", out);
    cr_expect(ratio[3] == 1, "%g", ratio[3]);
    ranks[2].passed_first = true;
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, NULL), 0, "%s", out);
    ranks[2].passed_first = ranks[3].passed_first = false;
    ranks[2].copy_gbps = 0, ranks[3].shm_bytes = NAN;
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0, out, sizeof out, NULL), 0, "ratio 0: no check");
    cr_expect_eq(rl_hang_preflight(ranks, 1, 0.5, out, sizeof out, NULL), 0, "one rank: nothing to compare");
}

/* The network figure is a node's. Three nodes of two ranks (the first
 * rank of each measures the link in from the node before); node 1's NIC
 * is slow, so the links into and out of it are: ranks 2 and 4 both
 * measure slow links, but only node 1 has no good one. */
Test(hang, the_preflight_names_the_node_whose_links_are_slow) {
    rl_hang_rank ranks[6];
    for (int r = 0; r < 6; r++)
        ranks[r] = rank_at(r, true, 1, "p"), ranks[r].copy_gbps = 4.0, ranks[r].shm_bytes = 1024.0 * (1 << 20);
    ranks[0].net_gbps = 10, ranks[2].net_gbps = 1.0, ranks[4].net_gbps = 1.1;
    double net[6];
    rl_hang_node_net(ranks, 6, net);
    cr_expect(net[0] == 10 && net[2] == 1.1 && net[4] == 10, "nodes: %g %g %g", net[0], net[2], net[4]);
    cr_expect(net[1] == 0 && net[3] == 0 && net[5] == 0, "ranks that measured nothing have nothing");
    char out[512];
    double ratio[6];
    cr_expect_eq(rl_hang_preflight(ranks, 6, 0.5, out, sizeof out, ratio), 1, "%s", out);
    cr_expect(strstr(out, "rank 2 (pod p, node node-2): network 1.1 GB/s, 0.11x the median 10.0 GB/s"), "%s", out);
    /* measured once, it stands in a recheck: the first figures may have
     * been judged before it arrived */
    ranks[2].passed_first = true;
    cr_expect_eq(rl_hang_preflight(ranks, 6, 0.5, out, sizeof out, NULL), 1, "%s", out);
    ranks[2].passed_first = false;
    cr_expect_float_eq(ratio[2], 0.11, 1e-9);
    cr_expect(ratio[0] == 1 && ratio[4] == 1, "the neighbours have a good link: %g %g", ratio[0], ratio[4]);
    /* two nodes: each link joins both, so neither can be told apart */
    rl_hang_node_net(ranks, 4, net);
    cr_expect(net[0] == 0 && net[2] == 0);
    cr_expect_eq(rl_hang_preflight(ranks, 4, 0.5, out, sizeof out, NULL), 0, "%s", out);
}
