/* JSON-lines logging. Each line is formatted into one buffer and written
 * with a single write(2), so lines from threads and from sibling processes
 * sharing stderr never interleave mid-line. */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1;
static rl_log_level g_level = RL_LOG_INFO;

static const char *level_name(rl_log_level l) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    return names[l];
}

void rl_log_init(int rank) {
    g_rank = rank;
    const char *lv = getenv("RL_LOG_LEVEL");
    if (!lv) return;
    for (int i = 0; i <= RL_LOG_ERROR; i++)
        if (strcmp(lv, level_name((rl_log_level)i)) == 0) g_level = (rl_log_level)i;
}

void rl_log_rank(int rank) {
    g_level = RL_LOG_INFO;
    rl_log_init(rank);
    if (rank != 0) g_level = RL_LOG_WARN;
}

void rl_log_set_level(rl_log_level lvl) { g_level = lvl; }
bool rl_log_enabled(rl_log_level lvl) { return lvl >= g_level; }

char *rl_json_escape(char *dst, size_t n, const char *src) {
    size_t o = 0;
    if (n == 0) return dst;
    for (const unsigned char *p = (const unsigned char *)src; p && *p; p++) {
        char tmp[8];
        const char *rep = NULL;
        switch (*p) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", *p);
                rep = tmp;
            }
        }
        size_t need = rep ? strlen(rep) : 1;
        if (o + need >= n) break;
        if (rep) {
            memcpy(dst + o, rep, need);
        } else {
            dst[o] = (char)*p;
        }
        o += need;
    }
    dst[o] = '\0';
    return dst;
}

static void emit(rl_log_level lvl, const char *event, const char *fields) {
    char line[4096];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                     "\"event\":\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_name(lvl), event);
    if (g_rank >= 0 && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, ",\"rank\":%d", g_rank);
    if (fields && *fields && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, ",%s", fields);
    if (n > (int)sizeof line - 3) n = (int)sizeof line - 3; /* truncated: still close it */
    line[n++] = '}';
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w; /* nowhere left to report a failed log write */
}

void rl_log(rl_log_level lvl, const char *event, const char *fields, ...) {
    if (!rl_log_enabled(lvl)) return;
    char buf[3072];
    va_list ap;
    va_start(ap, fields);
    vsnprintf(buf, sizeof buf, fields, ap);
    va_end(ap);
    emit(lvl, event, buf);
}

void rl_log_msg(rl_log_level lvl, const char *event, const char *msg) {
    if (!rl_log_enabled(lvl)) return;
    char esc[2048], buf[2100];
    snprintf(buf, sizeof buf, "\"msg\":\"%s\"", rl_json_escape(esc, sizeof esc, msg));
    emit(lvl, event, buf);
}
