/* Error values: one struct, filled once at the point of failure and wrapped
 * with context on the way up. */
#include "util.h"

#include <signal.h>
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

void rl_err_one_line(rl_err *e) {
    for (char *p = e ? e->msg : NULL; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
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

int rl_err_exit_status(int code) {
    switch (code) {
    case RL_OK: return 0;
    case RL_EINPUT: return RL_EXIT_USER;
    case RL_EIO:
    case RL_ETIMEOUT: return RL_EXIT_INFRA;
    default: return 1;
    }
}

rl_fail_class rl_exit_class(int status) {
    switch (status) {
    case 0: return RL_FAIL_NONE;
    case RL_EXIT_USER: return RL_FAIL_USER;
    case RL_EXIT_PREEMPTED:
    case 128 + SIGTERM:
    case 128 + SIGINT: return RL_FAIL_PREEMPTION;
    case RL_EXIT_PEER_LOST:
    case RL_EXIT_INFRA: return RL_FAIL_INFRA;
    default: return RL_FAIL_CRASH;
    }
}

static const char *const class_names[] = {"", "UserError", "Infrastructure", "Preemption", "Crash"};

const char *rl_fail_class_name(rl_fail_class c) {
    return (unsigned)c < sizeof class_names / sizeof class_names[0] ? class_names[c] : "Crash";
}

const char *rl_fail_message_split(const char *msg, rl_fail_class *cls) {
    *cls = RL_FAIL_CRASH;
    for (unsigned i = 1; i < sizeof class_names / sizeof class_names[0]; i++) {
        size_t n = strlen(class_names[i]);
        if (!strncmp(msg, class_names[i], n) && msg[n] == ':' && msg[n + 1] == ' ') {
            *cls = (rl_fail_class)i;
            return msg + n + 2;
        }
    }
    return msg;
}

rl_fail_class rl_fail_class_parse(const char *name) {
    for (unsigned i = 1; name && i < sizeof class_names / sizeof class_names[0]; i++)
        if (!strcmp(name, class_names[i])) return (rl_fail_class)i;
    return RL_FAIL_CRASH;
}
