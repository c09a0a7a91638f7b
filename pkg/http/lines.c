/* Streamed bodies split into lines (http.h): the one splitter the
 * Kubernetes and etcd watch streams share. */
#include "http.h"

#include <stdlib.h>
#include <string.h>

void rl_http_lines_init(rl_http_lines *l, size_t max_line, const char *what) {
    memset(l, 0, sizeof *l);
    l->max_line = max_line ? max_line : 16u << 20;
    l->what = what ? what : "stream";
}

void rl_http_lines_free(rl_http_lines *l) {
    free(l->buf);
    l->buf = NULL;
    l->len = l->cap = 0;
}

static int emit(const char *p, size_t n, rl_http_line_fn fn, void *ud) {
    if (n && p[n - 1] == '\r') n--;
    if (n == 0) return 0; /* blank lines carry nothing */
    return fn(ud, p, n);
}

int rl_http_lines_feed(rl_http_lines *l, const char *data, size_t n, rl_http_line_fn fn, void *ud,
                       rl_err *e) {
    while (n) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        if (l->len + take > l->max_line)
            return rl_errf(e, RL_EIO, "%s: a line is longer than %zu bytes", l->what, l->max_line);
        if (nl && l->len == 0) {
            /* the common case: a whole line inside this read, no copy */
            int r = emit(data, take, fn, ud);
            if (r) return r;
        } else {
            if (l->len + take + 1 > l->cap) {
                size_t cap = l->cap ? l->cap : 4096;
                while (cap < l->len + take + 1) cap *= 2;
                char *nb = realloc(l->buf, cap);
                if (!nb) return rl_errf(e, RL_ENOMEM, "%s: out of memory", l->what);
                l->buf = nb;
                l->cap = cap;
            }
            memcpy(l->buf + l->len, data, take);
            l->len += take;
            if (nl) {
                size_t len = l->len;
                l->len = 0;
                int r = emit(l->buf, len, fn, ud);
                if (r) return r;
            }
        }
        if (!nl) break;
        data += take + 1;
        n -= take + 1;
    }
    return RL_OK;
}
