/* libFuzzer target for the watch stream: the line splitter and the event
 * parser together, on arbitrary bytes split at arbitrary points (a watch
 * body is whatever the network delivers). The first input byte seeds the
 * split points and the line cap. Contract: the same lines come out however
 * the bytes are split; every line is at most the cap and has no '\n';
 * parsed events carry an object and a short resourceVersion; errors are
 * RL_EINPUT (event) or RL_EIO (over-long line) with a one-line message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct acc {
    uint64_t hash;
    size_t lines, cap;
} acc;

static int on_line(void *ud, const char *line, size_t len) {
    acc *a = ud;
    if (len == 0 || len > a->cap || memchr(line, '\n', len)) abort();
    for (size_t i = 0; i < len; i++) a->hash = (a->hash ^ (uint8_t)line[i]) * 1099511628211ull;
    a->hash = (a->hash ^ 0x100) * 1099511628211ull;
    a->lines++;
    rl_k8s_event ev;
    rl_err e = {0};
    int rc = rl_k8s_event_parse(line, len, &ev, &e);
    if (rc == RL_OK) {
        if (!ev.object || !ev.root || strlen(ev.resource_version) >= sizeof ev.resource_version)
            abort();
        if (ev.type == RL_K8S_BOOKMARK && !ev.resource_version[0]) abort();
        rl_k8s_event_free(&ev);
    } else if (rc != RL_EINPUT || strchr(e.msg, '\n') || ev.root) {
        abort();
    }
    return 0;
}

/* Feed everything in pieces chosen by seed; returns the feed result. */
static int run(const uint8_t *d, size_t n, uint64_t seed, size_t cap, acc *a) {
    rl_http_lines l;
    rl_http_lines_init(&l, cap, "watch stream");
    *a = (acc){.hash = 1469598103934665603ull, .cap = cap};
    rl_err e = {0};
    int rc = RL_OK;
    size_t off = 0;
    while (off < n && rc == RL_OK) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = 1 + (size_t)((seed >> 33) % 64);
        if (k > n - off) k = n - off;
        rc = rl_http_lines_feed(&l, (const char *)d + off, k, on_line, a, &e);
        off += k;
    }
    if (rc != RL_OK && (rc != RL_EIO || strchr(e.msg, '\n'))) abort();
    rl_http_lines_free(&l);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t cap = 16 + (size_t)(data[0] % 128) * 8;
    acc a1, a2;
    int r1 = run(data + 1, size - 1, data[0], cap, &a1);
    int r2 = run(data + 1, size - 1, (uint64_t)data[0] * 7919 + 13, cap, &a2);
    /* the split must not change what comes out */
    if (r1 != r2 || (r1 == RL_OK && (a1.hash != a2.hash || a1.lines != a2.lines))) abort();
    return 0;
}
