/* Pre-flight: what this node offers (hang.h, rl_hang_preflight judges). */
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "hang.h"

void rl_hang_measure(double *shm_bytes, double *copy_gbps) {
    struct statvfs v;
    *shm_bytes = statvfs("/dev/shm", &v) == 0 ? (double)v.f_bavail * (double)v.f_frsize : 0;
    /* the best of a few copies of 32 MiB: larger than any cache, so it is
     * the memory's bandwidth, and the best, so one preemption by the
     * scheduler does not count against the node */
    enum { BYTES = 32 << 20, TRIES = 4 };
    char *a = malloc(BYTES), *b = malloc(BYTES);
    double best = 0;
    if (a && b) {
        memset(a, 1, BYTES), memset(b, 2, BYTES); /* touched: no page faults in the timing */
        for (int i = 0; i < TRIES; i++) {
            double t = rl_now();
            memcpy(i % 2 ? a : b, i % 2 ? b : a, BYTES);
            double dt = rl_now() - t;
            if (dt > 0 && BYTES / dt / 1e9 > best) best = BYTES / dt / 1e9;
        }
    }
    free(a);
    free(b);
    *copy_gbps = best;
}
