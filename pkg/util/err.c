/* Error values: one struct, filled once at the point of failure and wrapped
 * with context on the way up. */
#include "util.h"

#include <stdio.h>
#include <string.h>

int rl_errf(rl_err *e, int code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

int rl_err_wrap(rl_err *e, const char *fmt, ...) {
    if (!e) return RL_EINTERNAL;
    char prefix[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    /* Truncation is acceptable: the start of the message says the most. */
    size_t n = strlen(prefix);
    if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
    memcpy(e->msg, prefix, n);
    memcpy(e->msg + n, ": ", 2);
    size_t rest = sizeof e->msg - n - 3;
    size_t ol = strnlen(old, rest);
    memcpy(e->msg + n + 2, old, ol);
    e->msg[n + 2 + ol] = '\0';
    return e->code;
}

const char *rl_err_name(int code) {
    switch (code) {
    case RL_OK: return "ok";
    case RL_EINPUT: return "input";
    case RL_EIO: return "io";
    case RL_ENOMEM: return "nomem";
    case RL_ETIMEOUT: return "timeout";
    case RL_EPEER: return "peer";
    case RL_EABORT: return "abort";
    default: return "internal";
    }
}

int rl_err_exit_status(int code) { return code == RL_OK ? 0 : code == RL_EINPUT ? 2 : 1; }
