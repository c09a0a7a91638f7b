/* libFuzzer target: a hang heartbeat or answer, read by rank 0 from the
 * round's store (hang.h). Any bytes either parse into a rank whose own
 * JSON parses back to the same values, or are refused with RL_EINPUT and
 * one line; a verdict over what parsed fits its buffer. */
#include <stdlib.h>
#include <string.h>

#include "hang/hang.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    rl_hang_rank r;
    rl_err e = {0};
    int rc = rl_hang_rank_parse((const char *)data, size, "beat", &r, &e);
    if (rc != RL_OK) {
        if (rc != RL_EINPUT || strchr(e.msg, '\n')) abort();
        return 0;
    }
    if (!r.seen || r.rank < 0) abort();
    char *j = rl_hang_rank_json(&r, NULL, 0, 0, 0);
    if (!j) return 0;
    rl_hang_rank back;
    if (rl_hang_rank_parse(j, strlen(j), "again", &back, &e) != RL_OK || back.rank != r.rank ||
        back.issued != r.issued || back.done != r.done || back.step != r.step || strcmp(back.pod, r.pod) != 0 ||
        strcmp(back.node, r.node) != 0 || strcmp(back.op, r.op) != 0 || back.net_gbps != r.net_gbps ||
        back.net_pending != r.net_pending || back.rechecked != r.rechecked)
        abort();
    free(j);
    rl_hang_rank two[2] = {r, r};
    two[0].rank = 0, two[1].rank = 1;
    char out[256];
    rl_hang_verdict(two, 2, r.issued + 1, r.op[0] ? r.op : "allreduce", r.unix_time + 1, out, sizeof out);
    if (strlen(out) >= sizeof out) abort();
    /* the pre-flight over four such ranks, one link figure each changed */
    rl_hang_rank four[4] = {r, r, r, r};
    double ratio[4];
    for (int i = 0; i < 4; i++) four[i].rank = i, four[i].net_gbps = r.net_gbps * (i + 1) / 4;
    rl_hang_preflight(four, 4, 0.5, out, sizeof out, ratio);
    if (strlen(out) >= sizeof out) abort();
    for (int i = 0; i < 4; i++)
        if (!(ratio[i] >= 0 && ratio[i] <= 1)) abort();
    return 0;
}
