/* libFuzzer target: a round message on a trainer's control channel
 * (agent.h, in-place recovery). Any bytes either parse into a place whose
 * own message parses back to the same values, or are refused with
 * RL_EINPUT and one line. */
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    rl_ctl_round r;
    rl_err e = {0};
    int rc = rl_ctl_round_parse((const char *)data, size, &r, &e);
    if (rc != RL_OK) {
        if (rc != RL_EINPUT || strchr(e.msg, '\n')) abort();
        return 0;
    }
    if (r.rank < 0 || r.rank >= r.world || r.master_port < 1 || r.master_port > 65535 || !r.prefix[0] ||
        !r.master_addr[0])
        abort();
    char m[512];
    int n = rl_ctl_round_format(&r, m, sizeof m);
    rl_ctl_round back;
    if (n < 0 || rl_ctl_round_parse(m, (size_t)n, &back, &e) != RL_OK || memcmp(&back, &r, sizeof r) != 0) abort();
    return 0;
}
