/* The agent <-> trainer control channel's round message (agent.h,
 * in-place recovery): what the agent writes the trainer reads back, and
 * anything else is refused naming the channel. The channel between real
 * agents and trainers is in test_elastic.c. */
#include <criterion/criterion.h>
#include <string.h>

#include "agent/agent.h"

Test(ctl, a_round_message_reads_back_as_written) {
    rl_ctl_round r = {.rank = 3, .world = 4, .group_rank = 2, .master_port = 29400}, back;
    strcpy(r.prefix, "r12");
    strcpy(r.master_addr, "10.1.2.3");
    char m[512];
    int n = rl_ctl_round_format(&r, m, sizeof m);
    cr_assert_gt(n, 0);
    cr_expect_str_eq(m, "round 3 4 2 29400 r12 10.1.2.3");
    rl_err e = {0};
    cr_assert_eq(rl_ctl_round_parse(m, (size_t)n, &back, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(memcmp(&r, &back, sizeof r), 0);
    cr_expect_eq(rl_ctl_round_format(&r, m, 10), -1, "a message that does not fit is refused, not cut");
}

Test(ctl, a_malformed_round_message_is_refused) {
    const char *bad[] = {
        "",
        "park",
        "round 4 4 0 29400 r1 10.0.0.1",     /* rank past the world */
        "round 0 4 0 0 r1 10.0.0.1",         /* no port */
        "round 0 4 0 70000 r1 10.0.0.1",     /* port out of range */
        "round 0 4 0 29400 r1",              /* no address */
        "round 0 4 0 29400 r1 10.0.0.1 x",   /* a word too many */
        "round 0 4 0 29400 r1 10.0.0.1 ",    /* trailing space */
        "round -1 4 0 29400 r1 10.0.0.1",    /* a sign */
        "round 0 4 0 29400 r;1 10.0.0.1",    /* a character outside the set */
        "round 0  4 0 29400 r1 10.0.0.1",    /* two spaces */
    };
    /* a NUL inside a word (found by fuzz_ctl_round) */
    rl_ctl_round z;
    cr_expect_eq(rl_ctl_round_parse("round 0 4 0 29400 r1 1.\0\0001", 28, &z, NULL), RL_EINPUT);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rl_ctl_round r;
        rl_err e = {0};
        cr_expect_eq(rl_ctl_round_parse(bad[i], strlen(bad[i]), &r, &e), RL_EINPUT, "accepted \"%s\"", bad[i]);
        cr_expect(strstr(e.msg, "control channel"), "%s", e.msg);
        cr_expect_eq(r.world, 0, "nothing half-filled");
    }
}
