/* The registry and the Prometheus text format (version 0.0.4). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

typedef struct metric {
    rl_metric_kind kind;
    char name[256];  /* with its labels, as rendered */
    size_t base_len; /* the name without the labels */
    char help[256];
    double v;
    bool has;
} metric;

struct rl_metrics {
    pthread_mutex_t mu;
    metric m[RL_METRICS_MAX];
    int n;
};

int rl_metrics_new(rl_metrics **out, rl_err *e) {
    rl_metrics *m = calloc(1, sizeof *m);
    if (!m) return rl_errf(e, RL_ENOMEM, "metrics: out of memory");
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return RL_OK;
}

void rl_metrics_free(rl_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static bool name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

int rl_metrics_define(rl_metrics *m, rl_metric_kind kind, const char *name, const char *help, int *id,
                      rl_err *e) {
    size_t base = 0, len = strlen(name);
    while (base < len && name_char(name[base], base == 0)) base++;
    /* after the name only a label set "{...}" may follow, on one line */
    bool ok = base > 0 && len < sizeof m->m[0].name &&
              (base == len || (name[base] == '{' && name[len - 1] == '}' && !strpbrk(name, "\n\r")));
    if (!ok) return rl_errf(e, RL_EINPUT, "metrics: \"%.140s\" is not a Prometheus metric name", name);
    pthread_mutex_lock(&m->mu);
    int rc = RL_OK;
    for (int i = 0; i < m->n && !rc; i++)
        if (strcmp(m->m[i].name, name) == 0) rc = rl_errf(e, RL_EINPUT, "metrics: %s is defined twice", name);
    if (!rc && m->n >= RL_METRICS_MAX)
        rc = rl_errf(e, RL_ENOMEM, "metrics: more than %d metrics", RL_METRICS_MAX);
    if (!rc) {
        metric *x = &m->m[m->n];
        *x = (metric){.kind = kind, .base_len = base, .has = kind == RL_METRIC_COUNTER};
        snprintf(x->name, sizeof x->name, "%s", name);
        snprintf(x->help, sizeof x->help, "%s", help ? help : "");
        *id = m->n++;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int rl_metrics_relabel(rl_metrics *m, int id, const char *const *pairs, rl_err *e) {
    char labels[sizeof m->m[0].name];
    size_t at = 0;
    for (int i = 0; pairs && pairs[i] && pairs[i + 1] && at < sizeof labels; i += 2) {
        at += (size_t)snprintf(labels + at, sizeof labels - at, "%s%s=\"", i ? "," : "{", pairs[i]);
        /* the format's escapes in a label value: backslash, quote, newline */
        for (const char *c = pairs[i + 1]; *c && at + 2 < sizeof labels; c++) {
            if (*c == '\\' || *c == '"' || *c == '\n') labels[at++] = '\\';
            labels[at++] = *c == '\n' ? 'n' : *c;
        }
        if (at < sizeof labels) at += (size_t)snprintf(labels + at, sizeof labels - at, "\"");
    }
    if (at && at < sizeof labels) at += (size_t)snprintf(labels + at, sizeof labels - at, "}");
    pthread_mutex_lock(&m->mu);
    int rc = RL_OK;
    if (id < 0 || id >= m->n) rc = rl_errf(e, RL_EINPUT, "metrics: no metric %d", id);
    else if (at >= sizeof labels || m->m[id].base_len + at >= sizeof m->m[id].name)
        rc = rl_errf(e, RL_EINPUT, "metrics: the labels of %.*s are too long", (int)m->m[id].base_len, m->m[id].name);
    else
        snprintf(m->m[id].name + m->m[id].base_len, sizeof m->m[id].name - m->m[id].base_len, "%.*s", (int)at, labels);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void rl_metrics_set(rl_metrics *m, int id, double v) {
    if (!m || id < 0) return;
    pthread_mutex_lock(&m->mu);
    if (id < m->n) m->m[id].v = v, m->m[id].has = true;
    pthread_mutex_unlock(&m->mu);
}

void rl_metrics_inc(rl_metrics *m, int id, double dv) {
    if (!m || id < 0) return;
    pthread_mutex_lock(&m->mu);
    if (id < m->n) m->m[id].v = (m->m[id].has ? m->m[id].v : 0) + dv, m->m[id].has = true;
    pthread_mutex_unlock(&m->mu);
}

void rl_metrics_clear(rl_metrics *m, int id) {
    if (!m || id < 0) return;
    pthread_mutex_lock(&m->mu);
    if (id < m->n && m->m[id].kind != RL_METRIC_COUNTER) m->m[id].has = false;
    pthread_mutex_unlock(&m->mu);
}

bool rl_metrics_get(rl_metrics *m, int id, double *v) {
    bool has = false;
    if (!m || id < 0) return false;
    pthread_mutex_lock(&m->mu);
    if (id < m->n && m->m[id].has) *v = m->m[id].v, has = true;
    pthread_mutex_unlock(&m->mu);
    return has;
}

void rl_metrics_format_value(double v, char *out, size_t n) {
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    /* the shortest of %.15g..%.17g that reads back exactly: 0.1 stays 0.1,
     * and no value is ever rounded */
    for (int p = 15; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, v);
        if (strtod(out, NULL) == v) return;
    }
}

/* HELP text escapes: backslash and newline (the format's only two). */
static void put_help(char *dst, size_t n, const char *s) {
    size_t k = 0;
    for (; *s && k + 3 < n; s++) {
        if (*s == '\\') dst[k++] = '\\', dst[k++] = '\\';
        else if (*s == '\n') dst[k++] = '\\', dst[k++] = 'n';
        else dst[k++] = *s;
    }
    dst[k] = '\0';
}

char *rl_metrics_render(rl_metrics *m, double now_unix) {
    pthread_mutex_lock(&m->mu);
    int n = m->n;
    metric snap[RL_METRICS_MAX];
    memcpy(snap, m->m, sizeof(metric) * (size_t)n);
    pthread_mutex_unlock(&m->mu);

    size_t cap = 512 + (size_t)n * 1200, len = 0; /* the longest HELP, TYPE and sample lines fit */
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const metric *x = &snap[i];
        if (!x->has) continue;
        /* HELP and TYPE once per metric family (several label sets share one) */
        bool first = true;
        for (int k = 0; k < i && first; k++)
            if (snap[k].has && snap[k].base_len == x->base_len && !memcmp(snap[k].name, x->name, x->base_len))
                first = false;
        char help[520], val[40];
        double v = x->kind == RL_METRIC_AGE ? now_unix - x->v : x->v;
        if (x->kind == RL_METRIC_AGE && v < 0) v = 0; /* a clock step back is not a negative age */
        rl_metrics_format_value(v, val, sizeof val);
        if (first && x->help[0]) {
            put_help(help, sizeof help, x->help);
            len += (size_t)snprintf(out + len, cap - len, "# HELP %.*s %s\n", (int)x->base_len, x->name, help);
        }
        if (first)
            len += (size_t)snprintf(out + len, cap - len, "# TYPE %.*s %s\n", (int)x->base_len, x->name,
                                    x->kind == RL_METRIC_COUNTER ? "counter" : "gauge");
        len += (size_t)snprintf(out + len, cap - len, "%s %s\n", x->name, val);
    }
    return out;
}
