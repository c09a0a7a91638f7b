/* libFuzzer target: an etcd watch stream (newline-separated JSON messages
 * from the gateway) cut into arbitrary chunks. The first two bytes choose
 * the chunk size, so the line reassembly is exercised at every boundary.
 * Any stream must be consumed or rejected with one error line -- never a
 * crash, a leak, or an over-long line kept in memory. */
#include <stdlib.h>
#include <string.h>

#include "etcd/etcd.h"

typedef struct seen {
    int msgs;
    int64_t last_rev;
} seen;

static int on_msg(void *ud, const rl_etcd_watch_msg *m) {
    seen *s = ud;
    s->msgs++;
    if (m->n < 0 || (m->n > 0 && !m->events)) abort();
    for (int i = 0; i < m->n; i++) {
        const rl_etcd_event *ev = &m->events[i];
        if (ev->type != RL_ETCD_EV_PUT && ev->type != RL_ETCD_EV_DELETE) abort();
        if (!ev->kv.key || ev->kv.key[ev->kv.key_len]) abort();
    }
    if (strchr(m->cancel_reason, '\n')) abort();
    s->last_rev = m->revision;
    return s->msgs >= 1000; /* a consumer may stop at any message */
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 2) return 0;
    size_t chunk = (size_t)(data[0] | data[1] << 8) % 97 + 1;
    const char *p = (const char *)data + 2;
    size_t n = size - 2;
    rl_http_lines lb;
    rl_http_lines_init(&lb, 4096, "fuzz watch");
    seen s = {0};
    bool stop = false;
    rl_err e = {0};
    for (size_t off = 0; off < n && !stop; off += chunk) {
        size_t take = n - off < chunk ? n - off : chunk;
        int rc = rl_etcd_watch_feed(&lb, p + off, take, on_msg, &s, &stop, &e);
        if (rc == RL_OK) continue;
        if (rc != RL_EIO && rc != RL_EPEER) abort();
        if (!e.msg[0] || strchr(e.msg, '\n')) abort();
        break;
    }
    if (lb.len > lb.max_line) abort();
    rl_http_lines_free(&lb);
    return 0;
}
