/* The informer cache (cache.h): per kind, a flat array of objects keyed by
 * namespace and name. Linear scans are enough at the scale of training
 * jobs (hundreds of jobs, thousands of pods) and keep it obviously right. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator/cache.h"
#include "operator/operator.h"

typedef struct entry {
    char ns[254], name[254], job[64];
    cJSON *obj;
} entry;

typedef struct store {
    entry *v;
    int n, cap;
    int synced, watches; /* scopes listed so far / to wait for */
} store;

struct rl_op_cache {
    pthread_mutex_t mu;
    store s[RL_OPC_KINDS];
};

const char *rl_op_meta_str(const cJSON *o, const char *k) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    const cJSON *v = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

const char *rl_op_job_label(const cJSON *o) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    const cJSON *l = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "labels") : NULL;
    const cJSON *v = cJSON_IsObject(l) ? cJSON_GetObjectItemCaseSensitive(l, RL_OP_LABEL_JOB) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

rl_op_cache *rl_op_cache_new(void) {
    rl_op_cache *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->mu, NULL);
    return c;
}

void rl_op_cache_free(rl_op_cache *c) {
    if (!c) return;
    for (int k = 0; k < RL_OPC_KINDS; k++) {
        for (int i = 0; i < c->s[k].n; i++) cJSON_Delete(c->s[k].v[i].obj);
        free(c->s[k].v);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int find(const store *s, const char *ns, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].ns, ns) && !strcmp(s->v[i].name, name)) return i;
    return -1;
}

static void drop(store *s, int i) {
    cJSON_Delete(s->v[i].obj);
    s->v[i] = s->v[--s->n];
}

/* Insert or replace; an object that cannot be stored is left out (the next
 * SYNC or event brings it back, and reads fall back to absent). */
static void put(store *s, const cJSON *obj) {
    const char *ns = rl_op_meta_str(obj, "namespace"), *name = rl_op_meta_str(obj, "name");
    if (!*name || strlen(ns) >= sizeof s->v->ns || strlen(name) >= sizeof s->v->name) return;
    cJSON *copy = cJSON_Duplicate(obj, 1);
    if (!copy) return;
    int i = find(s, ns, name);
    if (i < 0) {
        if (s->n == s->cap) {
            int cap = s->cap ? 2 * s->cap : 64;
            entry *v = realloc(s->v, (size_t)cap * sizeof *v);
            if (!v) {
                cJSON_Delete(copy);
                return;
            }
            s->v = v, s->cap = cap;
        }
        i = s->n++;
        snprintf(s->v[i].ns, sizeof s->v[i].ns, "%s", ns);
        snprintf(s->v[i].name, sizeof s->v[i].name, "%s", name);
    } else {
        cJSON_Delete(s->v[i].obj);
    }
    snprintf(s->v[i].job, sizeof s->v[i].job, "%s", rl_op_job_label(obj));
    s->v[i].obj = copy;
}

void rl_op_cache_apply(rl_op_cache *c, rl_opc_kind k, const char *ns, rl_k8s_event_type type, const cJSON *obj) {
    pthread_mutex_lock(&c->mu);
    store *s = &c->s[k];
    if (type == RL_K8S_SYNC) {
        for (int i = s->n - 1; i >= 0; i--)
            if (!ns || !strcmp(s->v[i].ns, ns)) drop(s, i);
        for (const cJSON *it = obj->child; it; it = it->next) put(s, it);
        s->synced++; /* a relist after a 410 counts again: harmless, never fewer */
    } else if (type == RL_K8S_DELETED) {
        int i = find(s, rl_op_meta_str(obj, "namespace"), rl_op_meta_str(obj, "name"));
        if (i >= 0) drop(s, i);
    } else if (type == RL_K8S_ADDED || type == RL_K8S_MODIFIED) {
        put(s, obj);
    }
    pthread_mutex_unlock(&c->mu);
}

void rl_op_cache_expect(rl_op_cache *c, rl_opc_kind k, int watches) {
    pthread_mutex_lock(&c->mu);
    c->s[k].watches = watches;
    pthread_mutex_unlock(&c->mu);
}

bool rl_op_cache_synced(rl_op_cache *c, rl_opc_kind k) {
    pthread_mutex_lock(&c->mu);
    bool ok = c->s[k].watches > 0 && c->s[k].synced >= c->s[k].watches;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

cJSON *rl_op_cache_get(rl_op_cache *c, rl_opc_kind k, const char *ns, const char *name) {
    pthread_mutex_lock(&c->mu);
    int i = find(&c->s[k], ns, name);
    cJSON *o = i >= 0 ? cJSON_Duplicate(c->s[k].v[i].obj, 1) : NULL;
    pthread_mutex_unlock(&c->mu);
    return o;
}

cJSON *rl_op_cache_list(rl_op_cache *c, rl_opc_kind k, const char *ns, const char *job) {
    cJSON *out = cJSON_CreateArray();
    pthread_mutex_lock(&c->mu);
    const store *s = &c->s[k];
    for (int i = 0; i < s->n && out; i++)
        if (!strcmp(s->v[i].ns, ns) && !strcmp(s->v[i].job, job))
            cJSON_AddItemToArray(out, cJSON_Duplicate(s->v[i].obj, 1));
    pthread_mutex_unlock(&c->mu);
    return out;
}
