/* pkg/util's CPU sets: sysfs cpulists and the slices offload.c pins its
 * update threads to. */
#include <criterion/criterion.h>

#include "util/util.h"

Test(cpus, cpulists_parse_or_are_refused_whole) {
    cpu_set_t s;
    cr_expect_eq(rl_cpulist_parse("0-3,8,10-11\n", &s), 7);
    cr_expect(CPU_ISSET(0, &s) && CPU_ISSET(3, &s) && !CPU_ISSET(4, &s) && CPU_ISSET(8, &s) && CPU_ISSET(11, &s));
    cr_expect_eq(rl_cpulist_parse("5", &s), 1);
    cr_expect(CPU_ISSET(5, &s) && CPU_COUNT(&s) == 1);
    cr_expect_eq(rl_cpulist_parse("\n", &s), 0, "a memoryless node's empty list");
    cr_expect_eq(rl_cpulist_parse("", &s), 0);
    cr_expect_eq(rl_cpulist_parse("0-3,2-5", &s), 6, "overlaps counted once");
    const char *bad[] = {"3-1", "1-", "-1", "0,,1", "0,", "a", "0 1", "1\n2", "0-99999", "4294967297"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(rl_cpulist_parse(bad[i], &s), -1, "\"%s\" accepted", bad[i]);
}

Test(cpus, slices_split_the_common_cpus_in_order) {
    cpu_set_t node, allowed, out;
    rl_cpulist_parse("0-7", &node);
    rl_cpulist_parse("2-9", &allowed); /* a cpuset's limits: the common CPUs are 2-7 */
    int got[3], seen = 0;
    for (int k = 0; k < 3; k++) {
        got[k] = rl_cpuset_slice(&node, &allowed, 3, k, &out);
        cr_expect_eq(got[k], 2, "slice %d", k);
        cr_expect(CPU_ISSET(2 + 2 * k, &out) && CPU_ISSET(3 + 2 * k, &out), "slice %d in CPU order", k);
        for (int c = 0; c < 16; c++) seen += CPU_ISSET(c, &out);
    }
    cr_expect_eq(seen, 6, "the slices cover the common CPUs once");
    cr_expect_eq(rl_cpuset_slice(&node, &allowed, 4, 3, &out), 2, "6 into 4: 1, 2, 1, 2");
    cr_expect_eq(rl_cpuset_slice(&node, &allowed, 8, 0, &out), 0, "more slices than CPUs leave some empty");
    cr_expect_eq(rl_cpuset_slice(&node, &allowed, 2, 2, &out), 0, "no such slice");
}
