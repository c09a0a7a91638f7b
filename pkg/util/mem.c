/* Memory pages: giving zeroed memory back, and counting what is resident. */
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uintptr_t page_size(void) {
    static uintptr_t ps;
    if (!ps) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (uintptr_t)v : 4096;
    }
    return ps;
}

void rl_mem_zero_release(void *p, size_t bytes) {
    if (!bytes) return;
    uintptr_t ps = page_size(), a = (uintptr_t)p, end = a + bytes;
    uintptr_t lo = (a + ps - 1) & ~(ps - 1), hi = end & ~(ps - 1);
    /* no whole page inside, or the kernel refused (locked pages): memset,
     * which zeroes just as well and keeps the pages */
    if (lo >= hi || madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) {
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, lo - a);
    memset((void *)hi, 0, end - hi);
}

size_t rl_mem_resident(const void *p, size_t bytes) {
    if (!bytes) return 0;
    uintptr_t ps = page_size(), lo = (uintptr_t)p & ~(ps - 1), end = (uintptr_t)p + bytes;
    size_t pages = (end - lo + ps - 1) / ps, n = 0;
    unsigned char vec[4096];
    /* in slices: one vector byte a page, on the stack */
    for (size_t at = 0; at < pages; at += sizeof vec) {
        size_t k = pages - at < sizeof vec ? pages - at : sizeof vec;
        if (mincore((void *)(lo + at * ps), k * ps, vec) != 0) continue;
        for (size_t i = 0; i < k; i++) n += vec[i] & 1;
    }
    return n * ps;
}
