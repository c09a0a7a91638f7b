/* libFuzzer target: the stats line a trainer writes to its node agent's
 * pipe. Any bytes either parse into a message that formats back into a
 * line that parses to the same kind and step, or are refused with
 * RL_EINPUT and one line. */
#include <stdlib.h>
#include <string.h>

#include "metrics/metrics.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    rl_stats_msg m;
    rl_err e = {0};
    int rc = rl_stats_parse((const char *)data, size, &m, &e);
    if (rc != RL_OK) {
        if (rc != RL_EINPUT || strchr(e.msg, '\n')) abort();
        return 0;
    }
    if (m.kind < RL_STATS_STEP || m.kind > RL_STATS_DEGRADED) abort();
    char buf[RL_STATS_LINE_MAX];
    size_t n = rl_stats_format(&m, buf, sizeof buf);
    if (n == 0) return 0; /* a uri too long for one line: the writer drops it */
    rl_stats_msg back;
    if (rl_stats_parse(buf, n, &back, &e) != RL_OK || back.kind != m.kind || back.step != m.step) abort();
    return 0;
}
