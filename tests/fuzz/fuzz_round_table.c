/* libFuzzer target: the rendezvous round table, which members read from the
 * leader's store (so from the network). Any input must parse into a table
 * that keeps the invariants the agent relies on (nodes sorted by zone and
 * id, ids unique, ranks contiguous, world = the sum) or fail with RL_EINPUT
 * (or RL_ENOMEM) and one line. The same bytes as a pre-flight report
 * (rdzv/R/degraded, which the coordinator reads): 1..4 non-empty ids and a
 * why, or RL_EINPUT with nothing half-filled. */
#include <stdlib.h>
#include <string.h>

#include "rdzv/round_internal.h"

static void degraded(const unsigned char *data, size_t size) {
    rl_round_degraded d;
    rl_err e = {0};
    if (rl_round_degraded_parse((const char *)data, size, &d, &e) != RL_OK) {
        if (d.n || strchr(e.msg, '\n') || strncmp(e.msg, "degraded report: ", 17) != 0) abort();
        return;
    }
    if (d.n < 1 || d.n > RL_ROUND_DEGRADED_MAX) abort();
    for (int i = 0; i < d.n; i++)
        if (!d.ids[i][0]) abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    degraded(data, size);
    rl_round_table t;
    rl_err e = {0};
    int rc = rl_round_table_parse((const char *)data, size, &t, &e);
    if (rc != RL_OK) {
        if ((rc != RL_EINPUT && rc != RL_ENOMEM) || strchr(e.msg, '\n') || strncmp(e.msg, "round table: ", 13) != 0) abort();
        if (t.nodes) abort();
        return 0;
    }
    int next = 0;
    for (int i = 0; i < t.nnodes; i++) {
        if (t.nodes[i].rank0 != next || t.nodes[i].local_world < 1) abort();
        if (i && rl_round_node_cmp(&t.nodes[i - 1], &t.nodes[i]) >= 0) abort();
        for (int k = 0; k < i; k++)
            if (!strcmp(t.nodes[k].id, t.nodes[i].id)) abort();
        if (!t.nodes[i].id[0] || !t.nodes[i].addr[0]) abort();
        next += t.nodes[i].local_world;
    }
    if (next != t.world || t.nnodes < 1) abort();
    rl_round_table_free(&t);
    return 0;
}
