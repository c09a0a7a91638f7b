/* The exit-status contract of util.h: the numbers the worker, its agent,
 * the round coordinator and the operator all read a failure class from. */
#include <criterion/criterion.h>
#include <signal.h>

#include "util/util.h"

Test(exit_class, each_status_has_its_class) {
    static const struct { int status; rl_fail_class cls; } t[] = {
        {0, RL_FAIL_NONE},
        {RL_EXIT_USER, RL_FAIL_USER},
        {RL_EXIT_PREEMPTED, RL_FAIL_PREEMPTION},
        {128 + SIGTERM, RL_FAIL_PREEMPTION},
        {128 + SIGINT, RL_FAIL_PREEMPTION},
        {RL_EXIT_PEER_LOST, RL_FAIL_INFRA},
        {RL_EXIT_INFRA, RL_FAIL_INFRA},
        {1, RL_FAIL_CRASH},
        {128 + SIGKILL, RL_FAIL_CRASH}, /* only the runtime knows an OOM kill (the operator reads OOMKilled) */
        {128 + SIGSEGV, RL_FAIL_CRASH},
        {128 + SIGABRT, RL_FAIL_CRASH},
        {127, RL_FAIL_CRASH},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        cr_expect_eq(rl_exit_class(t[i].status), t[i].cls, "status %d", t[i].status);
}

Test(exit_class, error_codes_pick_the_status_and_names_round_trip) {
    cr_expect_eq(rl_err_exit_status(RL_OK), 0);
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_EINPUT)), RL_FAIL_USER);
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_EIO)), RL_FAIL_INFRA);
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_ETIMEOUT)), RL_FAIL_INFRA);
    /* a process whose job failed (RL_EPEER at its top) or that could not
     * allocate is a crash: counted, so it cannot retry for ever */
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_EPEER)), RL_FAIL_CRASH);
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_ENOMEM)), RL_FAIL_CRASH);
    cr_expect_eq(rl_exit_class(rl_err_exit_status(RL_EINTERNAL)), RL_FAIL_CRASH);
    for (int c = RL_FAIL_USER; c <= RL_FAIL_CRASH; c++)
        cr_expect_eq(rl_fail_class_parse(rl_fail_class_name((rl_fail_class)c)), c);
    cr_expect_str_eq(rl_fail_class_name(RL_FAIL_USER), "UserError");
    cr_expect_eq(rl_fail_class_parse("Bogus"), RL_FAIL_CRASH);
    cr_expect_eq(rl_fail_class_parse(NULL), RL_FAIL_CRASH);
    rl_fail_class c;
    cr_expect_str_eq(rl_fail_message_split("UserError: data.train: none", &c), "data.train: none");
    cr_expect_eq(c, RL_FAIL_USER);
    cr_expect_str_eq(rl_fail_message_split("Crash: rank 1", &c), "rank 1");
    cr_expect_eq(c, RL_FAIL_CRASH);
    cr_expect_str_eq(rl_fail_message_split("node a: UserError: x", &c), "node a: UserError: x");
    cr_expect_eq(c, RL_FAIL_CRASH);
}
