/* libFuzzer target: a NUMA node's cpulist as sysfs writes it (read by
 * offload.c to pin its update threads). Any bytes either parse into a set
 * whose count is the returned number and which, written out again as a
 * list, parses back to the same set, or are refused with -1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    cpu_set_t set, back;
    int n = rl_cpulist_parse(s, &set);
    free(s);
    if (n < 0) {
        if (n != -1) abort();
        return 0;
    }
    if (n != CPU_COUNT(&set)) abort();
    /* one CPU per item: at most CPU_SETSIZE items of 5 characters */
    static char out[CPU_SETSIZE * 6 + 2];
    size_t at = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) at += (size_t)snprintf(out + at, sizeof out - at, "%s%d", at ? "," : "", c);
    snprintf(out + at, sizeof out - at, "\n");
    if (rl_cpulist_parse(out, &back) != n || !CPU_EQUAL(&set, &back)) abort();
    return 0;
}
