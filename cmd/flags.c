/* One command-line parser for the three binaries (flags.h). */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *prog, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: error: %s (see --help)\n", prog, msg);
    return 2;
}

/* The flag argv[*i] names ("--name", "--name=v", or the alias), with
 * *val its inline value (NULL: none). */
static const rl_flag *lookup(const char *a, const rl_flag *flags, int n, const char **val) {
    for (int k = 0; k < n; k++) {
        size_t l = strlen(flags[k].name);
        if (!strncmp(a, flags[k].name, l) && (a[l] == '\0' || a[l] == '=')) {
            *val = a[l] == '=' ? a + l + 1 : NULL;
            return &flags[k];
        }
        if (flags[k].alias && !strcmp(a, flags[k].alias)) {
            *val = NULL;
            return &flags[k];
        }
    }
    return NULL;
}

int rl_flag_value(const char *prog, const rl_flag *f, const char *v) {
    char *end;
    errno = 0;
    switch (f->kind) {
    case RL_FLAG_STR:
        *(const char **)f->dst = v;
        return 0;
    case RL_FLAG_LIST: {
        rl_flag_list *l = f->dst;
        if (l->n == RL_FLAG_LIST_MAX) return bad(prog, "%s: given more than %d times", f->name, RL_FLAG_LIST_MAX);
        l->v[l->n++] = v;
        return 0;
    }
    case RL_FLAG_BOOL:
        if (strcmp(v, "true") && strcmp(v, "false")) return bad(prog, "%s: must be true or false", f->name);
        *(bool *)f->dst = !strcmp(v, "true");
        return 0;
    case RL_FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || (double)x < f->lo || (double)x > f->hi)
            return bad(prog, "%s: must be an integer in [%.0f, %.0f]", f->name, f->lo, f->hi);
        *(long long *)f->dst = x;
        return 0;
    }
    case RL_FLAG_NUM: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < f->lo || x > f->hi)
            return bad(prog, "%s: must be a number in [%g, %g]", f->name, f->lo, f->hi);
        *(double *)f->dst = x;
        return 0;
    }
    }
    return 2;
}

int rl_flags_parse(const char *prog, int argc, char **argv, int first, const rl_flag *flags, int n,
                   const char **pos, int maxpos, int *npos) {
    bool only_args = false;
    if (npos) *npos = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!only_args && (!strcmp(a, "-h") || !strcmp(a, "--help"))) return RL_FLAGS_HELP;
        if (!only_args && !strcmp(a, "--")) {
            only_args = true;
            continue;
        }
        if (only_args || a[0] != '-' || !strcmp(a, "-")) {
            if (!pos || !npos || *npos >= maxpos) return bad(prog, "unexpected argument '%s'", a);
            pos[(*npos)++] = a;
            continue;
        }
        const rl_flag *f = lookup(a, flags, n, &v);
        if (!f) return bad(prog, "unknown flag '%s'", a);
        if (!v && f->kind == RL_FLAG_BOOL) v = "true";
        if (!v && i + 1 >= argc) return bad(prog, "%s needs a value", f->name);
        if (!v) v = argv[++i];
        int rc = rl_flag_value(prog, f, v);
        if (rc) return rc;
    }
    return 0;
}
