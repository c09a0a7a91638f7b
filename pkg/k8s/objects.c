/* Typed views of the objects the rendezvous uses (Lease, EndpointSlice) and
 * Kubernetes time stamps. Objects stay cJSON; these read and build the few
 * fields we need, strictly: a field of the wrong type is an error naming
 * it, never a silent default. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k8s_internal.h"

void rl_k8s_microtime_format(double unix_s, char *out, size_t n) {
    double fl = floor(unix_s);
    time_t t = (time_t)fl;
    long us = lround((unix_s - fl) * 1e6);
    if (us > 999999) us = 999999;
    struct tm tm;
    gmtime_r(&t, &tm);
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, us);
    snprintf(out, n, "%s", tmp);
}

static const char *digits(const char *p, int n, int *v) {
    int x = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return NULL;
        x = x * 10 + (p[i] - '0');
    }
    *v = x;
    return p + n;
}

int rl_k8s_time_parse(const char *s, double *unix_s) {
    struct tm tm = {0};
    int y, mo, d, h, mi, se;
    const char *p = s;
    if (!p || !(p = digits(p, 4, &y)) || *p++ != '-' || !(p = digits(p, 2, &mo)) || *p++ != '-' ||
        !(p = digits(p, 2, &d)) || (*p != 'T' && *p != 't') || !(p = digits(p + 1, 2, &h)) ||
        *p++ != ':' || !(p = digits(p, 2, &mi)) || *p++ != ':' || !(p = digits(p, 2, &se)))
        return RL_EINPUT;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return RL_EINPUT;
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        p++;
        int nd = 0;
        while (*p >= '0' && *p <= '9') {
            if (++nd > 9) return RL_EINPUT;
            frac += (*p++ - '0') * scale;
            scale /= 10;
        }
        if (nd == 0) return RL_EINPUT;
    }
    int off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om, sign = *p == '-' ? -1 : 1;
        if (!(p = digits(p + 1, 2, &oh)) || *p++ != ':' || !(p = digits(p, 2, &om)) || oh > 23 ||
            om > 59)
            return RL_EINPUT;
        off = sign * (oh * 3600 + om * 60);
    } else {
        return RL_EINPUT;
    }
    if (*p) return RL_EINPUT;
    tm.tm_year = y - 1900, tm.tm_mon = mo - 1, tm.tm_mday = d;
    tm.tm_hour = h, tm.tm_min = mi, tm.tm_sec = se;
    *unix_s = (double)timegm(&tm) - off + frac;
    return RL_OK;
}

/* ---- Lease ------------------------------------------------------------------------ */
static int str_field(const cJSON *o, const char *key, char *dst, size_t n, const char *what,
                     const char *field, rl_err *e) {
    dst[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return rl_errf(e, RL_EINPUT, "%s: %s: must be a string of at most %zu bytes", what, field,
                       n - 1);
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return RL_OK;
}

static int int_field(const cJSON *o, const char *key, long *out, const char *what,
                     const char *field, rl_err *e) {
    *out = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 2147483647.0)
        return rl_errf(e, RL_EINPUT, "%s: %s: must be a non-negative integer", what, field);
    *out = (long)v->valuedouble;
    return RL_OK;
}

static int time_field(const cJSON *o, const char *key, double *out, const char *what,
                      const char *field, rl_err *e) {
    *out = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsString(v) || rl_k8s_time_parse(v->valuestring, out) != RL_OK)
        return rl_errf(e, RL_EINPUT, "%s: %s: must be a time like 2006-01-02T15:04:05.000000Z",
                       what, field);
    return RL_OK;
}

int rl_k8s_lease_read(const cJSON *obj, rl_k8s_lease *l, rl_err *e) {
    memset(l, 0, sizeof *l);
    l->duration_s = l->transitions = -1;
    l->acquire_time = l->renew_time = -1;
    if (!cJSON_IsObject(obj)) return rl_errf(e, RL_EINPUT, "Lease: not a JSON object");
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(obj, "spec");
    if (!cJSON_IsObject(md)) return rl_errf(e, RL_EINPUT, "Lease: metadata missing");
    int rc;
    if ((rc = str_field(md, "name", l->name, sizeof l->name, "Lease", "metadata.name", e)))
        return rc;
    char what[300];
    snprintf(what, sizeof what, "Lease %s", l->name);
    if ((rc = str_field(md, "resourceVersion", l->resource_version, sizeof l->resource_version,
                        what, "metadata.resourceVersion", e)))
        return rc;
    if (sp && !cJSON_IsNull(sp) && !cJSON_IsObject(sp))
        return rl_errf(e, RL_EINPUT, "%s: spec: must be an object", what);
    if (!cJSON_IsObject(sp)) return RL_OK;
    if ((rc = str_field(sp, "holderIdentity", l->holder, sizeof l->holder, what,
                        "spec.holderIdentity", e)) ||
        (rc = int_field(sp, "leaseDurationSeconds", &l->duration_s, what,
                        "spec.leaseDurationSeconds", e)) ||
        (rc = int_field(sp, "leaseTransitions", &l->transitions, what, "spec.leaseTransitions",
                        e)) ||
        (rc = time_field(sp, "acquireTime", &l->acquire_time, what, "spec.acquireTime", e)) ||
        (rc = time_field(sp, "renewTime", &l->renew_time, what, "spec.renewTime", e)))
        return rc;
    return RL_OK;
}

cJSON *rl_k8s_lease_build(const char *ns, const rl_k8s_lease *l) {
    cJSON *o = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    cJSON *sp = cJSON_AddObjectToObject(o, "spec");
    bool ok = o && md && sp && cJSON_AddStringToObject(o, "apiVersion", "coordination.k8s.io/v1") &&
              cJSON_AddStringToObject(o, "kind", "Lease") &&
              cJSON_AddStringToObject(md, "name", l->name) &&
              (!ns || cJSON_AddStringToObject(md, "namespace", ns)) &&
              (!l->resource_version[0] ||
               cJSON_AddStringToObject(md, "resourceVersion", l->resource_version)) &&
              cJSON_AddStringToObject(sp, "holderIdentity", l->holder) &&
              (l->duration_s < 0 ||
               cJSON_AddNumberToObject(sp, "leaseDurationSeconds", (double)l->duration_s)) &&
              (l->transitions < 0 ||
               cJSON_AddNumberToObject(sp, "leaseTransitions", (double)l->transitions));
    char ts[40];
    if (ok && l->acquire_time >= 0) {
        rl_k8s_microtime_format(l->acquire_time, ts, sizeof ts);
        ok = cJSON_AddStringToObject(sp, "acquireTime", ts) != NULL;
    }
    if (ok && l->renew_time >= 0) {
        rl_k8s_microtime_format(l->renew_time, ts, sizeof ts);
        ok = cJSON_AddStringToObject(sp, "renewTime", ts) != NULL;
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int lease_result(cJSON *obj, rl_k8s_lease *out, rl_err *e) {
    int rc = out ? rl_k8s_lease_read(obj, out, e) : RL_OK;
    return rc;
}

int rl_k8s_lease_get(rl_k8s *c, const char *ns, const char *name, rl_k8s_lease *out,
                     cJSON **obj, long *http_status, rl_err *e) {
    char path[600];
    int rc = rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", ns ? ns : rl_k8s_namespace(c),
                         "leases", name, e);
    if (rc) return rc;
    cJSON *o = NULL;
    rc = rl_k8s_get(c, path, http_status, &o, e);
    if (rc == RL_OK) rc = lease_result(o, out, e);
    if (obj && rc == RL_OK) *obj = o;
    else cJSON_Delete(o);
    return rc;
}

static int lease_write(rl_k8s *c, const char *ns, const rl_k8s_lease *l, bool update,
                       rl_k8s_lease *out, long *http_status, rl_err *e) {
    if (!ns) ns = rl_k8s_namespace(c);
    if (update && !l->resource_version[0])
        return rl_errf(e, RL_EINPUT, "Lease %s: an update needs the resourceVersion it read",
                       l->name);
    char path[600];
    /* the item path validates the name even when we POST to the collection */
    int rc = rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", ns, "leases", l->name, e);
    if (rc) return rc;
    if (!update) *strrchr(path, '/') = '\0';
    cJSON *body = rl_k8s_lease_build(ns, l);
    if (!body) return rl_errf(e, RL_ENOMEM, "out of memory building Lease %s", l->name);
    cJSON *o = NULL;
    rc = update ? rl_k8s_replace(c, path, body, http_status, &o, e)
                : rl_k8s_create(c, path, body, http_status, &o, e);
    cJSON_Delete(body);
    if (rc == RL_OK) rc = lease_result(o, out, e);
    cJSON_Delete(o);
    return rc;
}

int rl_k8s_lease_create(rl_k8s *c, const char *ns, const rl_k8s_lease *l, rl_k8s_lease *out,
                        long *http_status, rl_err *e) {
    return lease_write(c, ns, l, false, out, http_status, e);
}
int rl_k8s_lease_update(rl_k8s *c, const char *ns, const rl_k8s_lease *l, rl_k8s_lease *out,
                        long *http_status, rl_err *e) {
    return lease_write(c, ns, l, true, out, http_status, e);
}

/* ---- EndpointSlice ------------------------------------------------------------------ */
int rl_k8s_endpointslices_path(char *out, size_t n, const char *ns, rl_err *e) {
    return rl_k8s_path(out, n, "discovery.k8s.io/v1", ns, "endpointslices", NULL, e);
}

static int cond(const cJSON *conds, const char *key, bool dflt, bool *out, const char *what,
                rl_err *e) {
    *out = dflt;
    const cJSON *v = conds ? cJSON_GetObjectItemCaseSensitive(conds, key) : NULL;
    if (!v || cJSON_IsNull(v)) return RL_OK;
    if (!cJSON_IsBool(v))
        return rl_errf(e, RL_EINPUT, "%s: conditions.%s: must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return RL_OK;
}

int rl_k8s_endpointslice_endpoints(const cJSON *slice, rl_k8s_endpoint *out, int max, int *n,
                                   rl_err *e) {
    *n = 0;
    char name[254] = "";
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(slice, "metadata");
    if (cJSON_IsObject(md)) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(md, "name");
        if (cJSON_IsString(nm)) snprintf(name, sizeof name, "%s", nm->valuestring);
    }
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(slice, "endpoints");
    if (!eps || cJSON_IsNull(eps)) return RL_OK; /* an empty slice omits the list */
    if (!cJSON_IsArray(eps))
        return rl_errf(e, RL_EINPUT, "EndpointSlice %s: endpoints: must be a list", name);
    int i = -1;
    const cJSON *ep;
    cJSON_ArrayForEach(ep, eps) {
        i++;
        char what[320];
        snprintf(what, sizeof what, "EndpointSlice %s: endpoints[%d]", name, i);
        if (!cJSON_IsObject(ep)) return rl_errf(e, RL_EINPUT, "%s: must be an object", what);
        rl_k8s_endpoint x = {0};
        const cJSON *addrs = cJSON_GetObjectItemCaseSensitive(ep, "addresses");
        if (addrs && !cJSON_IsArray(addrs))
            return rl_errf(e, RL_EINPUT, "%s: addresses: must be a list", what);
        const cJSON *a0 = addrs ? cJSON_GetArrayItem(addrs, 0) : NULL;
        if (!a0) continue;
        if (!cJSON_IsString(a0) || strlen(a0->valuestring) >= sizeof x.address)
            return rl_errf(e, RL_EINPUT, "%s: addresses[0]: must be an address string", what);
        strcpy(x.address, a0->valuestring);
        int rc;
        if ((rc = str_field(ep, "hostname", x.hostname, sizeof x.hostname, what, "hostname", e)) ||
            (rc = str_field(ep, "zone", x.zone, sizeof x.zone, what, "zone", e)))
            return rc;
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(ep, "targetRef");
        if (tr && !cJSON_IsNull(tr)) {
            if (!cJSON_IsObject(tr)) return rl_errf(e, RL_EINPUT, "%s: targetRef: must be an object", what);
            if ((rc = str_field(tr, "name", x.target, sizeof x.target, what, "targetRef.name", e)))
                return rc;
        }
        const cJSON *conds = cJSON_GetObjectItemCaseSensitive(ep, "conditions");
        if (conds && !cJSON_IsNull(conds) && !cJSON_IsObject(conds))
            return rl_errf(e, RL_EINPUT, "%s: conditions: must be an object", what);
        if (!cJSON_IsObject(conds)) conds = NULL;
        /* Kubernetes' documented defaults: unknown readiness counts as ready. */
        if ((rc = cond(conds, "ready", true, &x.ready, what, e)) ||
            (rc = cond(conds, "serving", true, &x.serving, what, e)) ||
            (rc = cond(conds, "terminating", false, &x.terminating, what, e)))
            return rc;
        if (*n < max) out[*n] = x;
        (*n)++;
    }
    return RL_OK;
}
