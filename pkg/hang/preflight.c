/* Pre-flight: what this node offers (hang.h, rl_hang_preflight judges). */
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "hang.h"

void rl_hang_measure(double *shm_bytes, double *copy_gbps) {
    struct statvfs v;
    *shm_bytes = statvfs("/dev/shm", &v) == 0 ? (double)v.f_bavail * (double)v.f_frsize : 0;
    /* the median of five copies of 32 MiB: larger than any cache, so it is
     * the memory's bandwidth, and the median, so two preemptions by the
     * scheduler do not count against a node, while a node that is slow
     * (or throttled) most of the time shows */
    enum { BYTES = 32 << 20, TRIES = 5 };
    char *a = malloc(BYTES), *b = malloc(BYTES);
    double gbps[TRIES] = {0};
    if (a && b) {
        memset(a, 1, BYTES), memset(b, 2, BYTES); /* touched: no page faults in the timing */
        for (int i = 0; i < TRIES; i++) {
            double t = rl_now();
            memcpy(i % 2 ? a : b, i % 2 ? b : a, BYTES);
            double dt = rl_now() - t;
            gbps[i] = dt > 0 ? BYTES / dt / 1e9 : 0;
        }
    }
    free(a);
    free(b);
    for (int i = 1; i < TRIES; i++) /* insertion sort: five numbers */
        for (int j = i; j > 0 && gbps[j - 1] > gbps[j]; j--) {
            double x = gbps[j];
            gbps[j] = gbps[j - 1], gbps[j - 1] = x;
        }
    *copy_gbps = gbps[TRIES / 2];
}
