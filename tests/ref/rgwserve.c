/* Holds a radosgw (tests/support/rgwtest.c) for the Python reference checks:
 * prints one JSON line {"endpoint","access_key","secret_key"} on stdout
 * (throw-away keys of a throw-away server), then keeps the server until
 * its stdin closes, and stops it. Usage: rgwserve [MEM_MIB] */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/support/rgwtest.h"

int main(int argc, char **argv) {
    rl_test_rgw r;
    size_t mem = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    if (rl_test_rgw_start(&r, mem) != 0) {
        fprintf(stderr, "rgwserve: radosgw did not start\n");
        return 1;
    }
    printf("{\"endpoint\":\"%s\",\"access_key\":\"%s\",\"secret_key\":\"%s\"}\n", r.endpoint, r.access_key,
           r.secret_key);
    fflush(stdout);
    char buf[256];
    while (read(0, buf, sizeof buf) > 0) {
    }
    rl_test_rgw_stop(&r);
    return 0;
}
