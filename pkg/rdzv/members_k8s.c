/* Membership from the job's headless Service: its EndpointSlices (label
 * kubernetes.io/service-name), watched. A Service's endpoints may be spread
 * over several slices, and during an update one pod can briefly appear in
 * two; the set is rebuilt from every slice on each event, keyed by pod
 * name, a terminating copy yielding to a live one. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "rdzv/members_internal.h"

#define MAX_EP_PER_SLICE 1000 /* the API's own cap on a slice */

typedef struct slice {
    char name[254];
    rl_k8s_endpoint *eps;
    int n;
} slice;

typedef struct k8s_mem {
    rl_k8s *c;
    char ns[254], service[254];
    slice *s;
    int ns_count, cap;
    rl_members *m;
} k8s_mem;

static void drop_all(k8s_mem *k) {
    for (int i = 0; i < k->ns_count; i++) free(k->s[i].eps);
    k->ns_count = 0;
}

static void drop(k8s_mem *k, const char *name) {
    for (int i = 0; i < k->ns_count; i++)
        if (strcmp(k->s[i].name, name) == 0) {
            free(k->s[i].eps);
            k->s[i] = k->s[--k->ns_count];
            return;
        }
}

static const char *slice_name(const cJSON *obj) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *n = md ? cJSON_GetObjectItemCaseSensitive(md, "name") : NULL;
    return cJSON_IsString(n) ? n->valuestring : NULL;
}

/* A slice with fields of the wrong type is skipped with a warning: one odd
 * object must not blind the whole job to its peers. */
static void put(k8s_mem *k, const cJSON *obj) {
    const char *name = slice_name(obj);
    if (!name) {
        rl_log_msg(RL_LOG_WARN, "endpointslice_invalid", "an EndpointSlice without metadata.name");
        return;
    }
    rl_k8s_endpoint *eps = malloc(sizeof *eps * MAX_EP_PER_SLICE);
    int n = 0;
    rl_err e = {0};
    if (!eps) return;
    if (rl_k8s_endpointslice_endpoints(obj, eps, MAX_EP_PER_SLICE, &n, &e) != RL_OK) {
        rl_log_msg(RL_LOG_WARN, "endpointslice_invalid", e.msg);
        free(eps);
        return;
    }
    if (n > MAX_EP_PER_SLICE) n = MAX_EP_PER_SLICE;
    drop(k, name);
    if (k->ns_count == k->cap) {
        int nc = k->cap ? 2 * k->cap : 8;
        slice *ns = realloc(k->s, sizeof *ns * (size_t)nc);
        if (!ns) {
            free(eps);
            return;
        }
        k->s = ns, k->cap = nc;
    }
    slice *s = &k->s[k->ns_count++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->eps = eps, s->n = n;
}

static void publish(k8s_mem *k) {
    int total = 0;
    for (int i = 0; i < k->ns_count; i++) total += k->s[i].n;
    rl_peer *p = calloc((size_t)(total > 0 ? total : 1), sizeof *p);
    if (!p) return;
    int n = 0;
    for (int i = 0; i < k->ns_count; i++)
        for (int j = 0; j < k->s[i].n; j++) {
            const rl_k8s_endpoint *ep = &k->s[i].eps[j];
            const char *id = ep->target[0] ? ep->target : ep->hostname[0] ? ep->hostname : ep->address;
            int at = -1;
            for (int q = 0; q < n; q++)
                if (strcmp(p[q].id, id) == 0) at = q;
            if (at >= 0 && !p[at].terminating) continue;
            if (at < 0) at = n++;
            memset(&p[at], 0, sizeof p[at]);
            snprintf(p[at].id, sizeof p[at].id, "%s", id);
            snprintf(p[at].addr, sizeof p[at].addr, "%s", ep->address);
            snprintf(p[at].zone, sizeof p[at].zone, "%s", ep->zone);
            p[at].ready = ep->ready;
            p[at].terminating = ep->terminating;
        }
    rl_members_set(k->m, p, n);
    free(p);
}

static int on_event(void *ud, rl_k8s_event_type type, const cJSON *obj) {
    k8s_mem *k = ud;
    if (type == RL_K8S_SYNC) {
        drop_all(k);
        const cJSON *it;
        cJSON_ArrayForEach(it, obj) put(k, it);
    } else if (type == RL_K8S_ADDED || type == RL_K8S_MODIFIED) {
        put(k, obj);
    } else if (type == RL_K8S_DELETED) {
        const char *name = slice_name(obj);
        if (name) drop(k, name);
    } else {
        return 0;
    }
    publish(k);
    return 0;
}

static int run(void *ctx, rl_members *m, const volatile int *stop, rl_err *e) {
    k8s_mem *k = ctx;
    k->m = m;
    int failures = 0;
    uint64_t seed = rl_http_jitter_seed();
    rl_http_backoff b = {.base_s = 0.5, .cap_s = 5};
    while (!*stop) {
        rl_err we = {0};
        int rc = rl_k8s_endpointslices_watch(k->c, k->ns, k->service, stop, on_event, k, &we);
        if (*stop) break;
        /* 401/403/404 end the watch loop; RBAC or the Service may be fixed
         * while we run, so keep trying, slower, saying why. */
        failures++;
        if (failures == 1 || failures % 10 == 0)
            rl_log(RL_LOG_WARN, "members_watch_failed", "\"failures\":%d,\"code\":\"%s\",\"msg\":\"%s\"",
                   failures, rl_err_name(rc), rl_json_escape((char[600]){0}, 600, we.msg));
        rl_http_sleep(rl_http_backoff_delay(&b, failures < 6 ? failures : 6, -1, &seed) + 0.2, stop);
    }
    (void)e;
    return RL_OK;
}

static void destroy(void *ctx) {
    k8s_mem *k = ctx;
    drop_all(k);
    free(k->s);
    rl_k8s_free(k->c);
    free(k);
}

static const rl_members_backend k8s_backend = {run, destroy};

int rl_members_k8s_new(const rl_members_opts *o, const rl_members_backend **vt, void **ctx, rl_err *e) {
    if (!o->service || !*o->service) return rl_errf(e, RL_EINPUT, "members: the Service name is missing");
    k8s_mem *k = calloc(1, sizeof *k);
    if (!k) return rl_errf(e, RL_ENOMEM, "members: out of memory");
    rl_k8s_opts ko = {.timeout_s = 10, .connect_timeout_s = 5};
    int rc = rl_k8s_connect(o->kubeconfig, &ko, &k->c, e);
    if (rc) {
        free(k);
        return rc;
    }
    snprintf(k->ns, sizeof k->ns, "%s", o->ns && *o->ns ? o->ns : rl_k8s_namespace(k->c));
    snprintf(k->service, sizeof k->service, "%s", o->service);
    *vt = &k8s_backend;
    *ctx = k;
    return RL_OK;
}
