/* The agent <-> trainer control channel's round message (agent.h,
 * in-place recovery): what the agent writes the trainer reads back, and
 * anything else is refused naming the channel; what "yield" does to the
 * trainer's side. The channel between real agents and trainers is in
 * test_elastic.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "comm/comm.h"

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

/* The barrier fails (the communicator aborted) within 2 s: true. */
static bool aborted_soon(rl_comm *c) {
    for (int i = 0; i < 200; i++) {
        rl_err e = {0};
        if (rl_comm_barrier(c, &e) == RL_EABORT) return true;
        usleep(10000);
    }
    return false;
}

static void say(int fd, const char *m) { cr_assert_eq(send(fd, m, strlen(m), 0), (ssize_t)strlen(m)); }

/* *flag reads v within 2 s */
static bool soon(const volatile int *flag, int v) {
    for (int i = 0; i < 200 && *flag != v; i++) usleep(10000);
    return *flag == v;
}

static rl_comm *world_of_one(void) {
    rl_comm_opts o = {.backend = "tcp", .rank = 0, .world = 1, .timeout_s = 5};
    rl_comm *c = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_comm_init(&o, &c, &e), RL_OK, "%s", e.msg);
    return c;
}

/* A graceful round end: "yield" sets the flag the trainer agrees on at its
 * steps and leaves a whole ring (steady) alone; a round still forming --
 * waiting on the store, its ring, or a ring not yet steady -- is over:
 * the cancel flag its store client and comm init watch is set and an
 * armed ring is aborted. "park" ends any. A round message clears all. */
Test(ctl, a_yield_waits_for_a_whole_ring_and_ends_one_still_forming) {
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", sv[1]);
    rl_ctl *c = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_ctl_open(fd, &c, &e), RL_OK, "%s", e.msg);
    const volatile int *yield = rl_ctl_yield_flag(c), *over = rl_ctl_cancel_flag(c);
    cr_assert(yield && over && !*yield && !*over);
    const char *round = "round 0 1 0 29400 r2 127.0.0.1";

    rl_comm *steady = world_of_one();
    cr_assert(rl_ctl_arm(c, steady));
    rl_ctl_steady(c);
    say(sv[0], "yield");
    cr_expect(soon(yield, 1), "the yield never reached the flag");
    cr_expect(!*over, "a yield ended a whole ring's round");
    cr_expect_eq(rl_comm_barrier(steady, &e), RL_OK, "a whole ring was aborted: %s", e.msg);
    rl_ctl_arm(c, NULL);
    rl_comm_destroy(steady);
    say(sv[0], round);
    cr_expect(soon(yield, 0), "a round message left the yield set");

    /* forming, nothing armed yet (the trainer waits on the store) */
    say(sv[0], "yield");
    cr_expect(soon(over, 1), "a yield left a forming round waiting");
    rl_comm *late = world_of_one();
    cr_expect(!rl_ctl_arm(c, late), "a ring armed after its round was over was let start");
    cr_expect(aborted_soon(late));
    rl_comm_destroy(late);
    say(sv[0], round);
    cr_expect(soon(over, 0), "a round message left the round over");

    /* armed, not yet steady */
    rl_comm *forming = world_of_one();
    cr_assert(rl_ctl_arm(c, forming));
    say(sv[0], "yield");
    cr_expect(aborted_soon(forming), "a yield left a ring that was still forming waiting");
    rl_ctl_arm(c, NULL);
    rl_comm_destroy(forming);
    say(sv[0], round);
    cr_assert(soon(over, 0));

    /* park ends even a steady ring */
    rl_comm *parked = world_of_one();
    cr_assert(rl_ctl_arm(c, parked));
    rl_ctl_steady(c);
    say(sv[0], "park");
    cr_expect(aborted_soon(parked), "a park left a steady ring alone");
    cr_expect(*over);
    rl_ctl_arm(c, NULL);
    rl_comm_destroy(parked);
    close(sv[0]);
    rl_ctl_close(c);
}
