/* LIST + WATCH, the way client-go's reflector does it: a full list is a
 * snapshot the consumer replaces its state with; watch events follow from
 * the list's resourceVersion; the newest resourceVersion seen (bookmarks
 * included) is where the next watch resumes, so a stream that ends costs
 * no relist; only 410 Gone (the server forgot that version) forces one. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s_internal.h"

/* ---- one event ---------------------------------------------------------------------- */
void rl_k8s_event_free(rl_k8s_event *ev) {
    cJSON_Delete(ev->root);
    memset(ev, 0, sizeof *ev);
}

int rl_k8s_event_parse(const char *line, size_t len, rl_k8s_event *ev, rl_err *e) {
    memset(ev, 0, sizeof *ev);
    cJSON *root = cJSON_ParseWithLength(line, len);
    if (!root) return rl_errf(e, RL_EINPUT, "watch event: not JSON");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "type");
    cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, "object");
    int rc = RL_OK;
    if (!cJSON_IsString(type)) {
        rc = rl_errf(e, RL_EINPUT, "watch event: no \"type\"");
        goto bad;
    }
    static const struct {
        const char *name;
        rl_k8s_event_type t;
    } types[] = {{"ADDED", RL_K8S_ADDED}, {"MODIFIED", RL_K8S_MODIFIED},
                 {"DELETED", RL_K8S_DELETED}, {"BOOKMARK", RL_K8S_BOOKMARK},
                 {"ERROR", RL_K8S_ERROR}};
    bool known = false;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strcmp(type->valuestring, types[i].name) == 0) ev->type = types[i].t, known = true;
    if (!known) {
        char esc[64];
        rl_json_escape(esc, sizeof esc, type->valuestring);
        rc = rl_errf(e, RL_EINPUT, "watch event: unknown type \"%s\"", esc);
        goto bad;
    }
    if (!cJSON_IsObject(obj)) {
        rc = rl_errf(e, RL_EINPUT, "watch event %s: \"object\" missing or not an object",
                     type->valuestring);
        goto bad;
    }
    if (ev->type == RL_K8S_ERROR) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(obj, "code");
        const cJSON *reason = cJSON_GetObjectItemCaseSensitive(obj, "reason");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(obj, "message");
        if (cJSON_IsNumber(code) && code->valuedouble >= 0 && code->valuedouble < 1000)
            ev->code = (long)code->valuedouble;
        snprintf(ev->message, sizeof ev->message, "%s%s%s",
                 cJSON_IsString(reason) ? reason->valuestring : "",
                 cJSON_IsString(reason) && cJSON_IsString(msg) ? ": " : "",
                 cJSON_IsString(msg) ? msg->valuestring : "");
        for (char *q = ev->message; *q; q++)
            if (*q == '\n' || *q == '\r') *q = ' ';
    } else {
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
        const cJSON *rv = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "resourceVersion") : NULL;
        if (rv && !cJSON_IsString(rv)) {
            rc = rl_errf(e, RL_EINPUT, "watch event %s: metadata.resourceVersion is not a string",
                         type->valuestring);
            goto bad;
        }
        if (rv) {
            if (strlen(rv->valuestring) >= sizeof ev->resource_version) {
                rc = rl_errf(e, RL_EINPUT, "watch event: resourceVersion too long");
                goto bad;
            }
            strcpy(ev->resource_version, rv->valuestring);
        }
        if (ev->type == RL_K8S_BOOKMARK && !ev->resource_version[0]) {
            rc = rl_errf(e, RL_EINPUT, "watch event BOOKMARK: no resourceVersion");
            goto bad;
        }
    }
    ev->root = root;
    ev->object = obj;
    return RL_OK;
bad:
    cJSON_Delete(root);
    memset(ev, 0, sizeof *ev);
    return rc;
}

/* ---- LIST --------------------------------------------------------------------------- */
static int add_query(char *q, size_t n, const char *name, const char *value, rl_err *e) {
    char esc[2048];
    int rc = rl_http_query_escape(value, esc, sizeof esc, e);
    if (rc) return rl_err_wrap(e, "%s", name);
    size_t l = strlen(q);
    int w = snprintf(q + l, n - l, "%s%s=%s", strchr(q, '?') ? "&" : "?", name, esc);
    if (w < 0 || (size_t)w >= n - l) return rl_errf(e, RL_EINPUT, "API path with query too long");
    return RL_OK;
}

static int selectors(char *q, size_t n, const rl_k8s_watch_opts *o, rl_err *e) {
    int rc = RL_OK;
    if (o->label_selector && *o->label_selector)
        rc = add_query(q, n, "labelSelector", o->label_selector, e);
    if (!rc && o->field_selector && *o->field_selector)
        rc = add_query(q, n, "fieldSelector", o->field_selector, e);
    return rc;
}

/* All pages into one array; *rv the list's resourceVersion. */
static int list_all(rl_k8s *c, const rl_k8s_watch_opts *o, cJSON **items, char *rv, size_t rvn,
                    long *status, rl_err *e) {
    *items = cJSON_CreateArray();
    if (!*items) return rl_errf(e, RL_ENOMEM, "out of memory");
    char cont[4096] = "";
    rv[0] = '\0';
    for (;;) {
        char q[8192];
        snprintf(q, sizeof q, "%s", o->path);
        char lim[16];
        snprintf(lim, sizeof lim, "%d", o->page_limit > 0 ? o->page_limit : 500);
        int rc = selectors(q, sizeof q, o, e);
        if (!rc) rc = add_query(q, sizeof q, "limit", lim, e);
        if (!rc && cont[0]) rc = add_query(q, sizeof q, "continue", cont, e);
        cJSON *page = NULL;
        if (!rc) rc = rl_k8s__request(c, "GET", q, NULL, NULL, o->stop, status, &page, e);
        if (rc) {
            cJSON_Delete(page);
            cJSON_Delete(*items);
            *items = NULL;
            return rc;
        }
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(page, "metadata");
        const cJSON *prv = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "resourceVersion") : NULL;
        const cJSON *pc = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "continue") : NULL;
        cJSON *its = cJSON_DetachItemFromObjectCaseSensitive(page, "items");
        bool bad = (its && !cJSON_IsArray(its) && !cJSON_IsNull(its)) || !cJSON_IsString(prv) ||
                   strlen(prv->valuestring) >= rvn ||
                   (pc && !cJSON_IsNull(pc) && (!cJSON_IsString(pc) || strlen(pc->valuestring) >= sizeof cont));
        if (bad) {
            char sp[200];
            rl_k8s__short_path(o->path, sp, sizeof sp);
            cJSON_Delete(its);
            cJSON_Delete(page);
            cJSON_Delete(*items);
            *items = NULL;
            return rl_errf(e, RL_EPEER, "LIST %s: the answer is not a list (items, "
                                        "metadata.resourceVersion)", sp);
        }
        if (!rv[0]) strcpy(rv, prv->valuestring); /* every page is one snapshot */
        cJSON *it;
        while (cJSON_IsArray(its) && (it = cJSON_DetachItemViaPointer(its, its->child)) != NULL)
            cJSON_AddItemToArray(*items, it);
        cJSON_Delete(its);
        bool more = cJSON_IsString(pc) && pc->valuestring[0];
        if (more) strcpy(cont, pc->valuestring);
        cJSON_Delete(page);
        if (!more) return RL_OK;
    }
}

int rl_k8s_endpointslices_list(rl_k8s *c, const char *ns, const char *service, cJSON **items,
                               rl_err *e) {
    char path[600], sel[400], rv[128];
    int rc = rl_k8s_endpointslices_path(path, sizeof path, ns ? ns : rl_k8s_namespace(c), e);
    if (rc) return rc;
    snprintf(sel, sizeof sel, "kubernetes.io/service-name=%s", service);
    rl_k8s_watch_opts o = {.path = path, .label_selector = sel};
    long st;
    return list_all(c, &o, items, rv, sizeof rv, &st, e);
}

/* ---- WATCH -------------------------------------------------------------------------- */
typedef struct wstate {
    rl_k8s_watch_fn fn;
    void *ud;
    rl_http_lines lines;
    char rv[128];
    bool user_stop, gone, failed;
    long events;
    rl_err err; /* why the stream was cut, when failed */
} wstate;

static int on_line(void *ud, const char *line, size_t len) {
    wstate *w = ud;
    rl_k8s_event ev;
    if (rl_k8s_event_parse(line, len, &ev, &w->err) != RL_OK) {
        w->failed = true;
        return 1;
    }
    int stop = 0;
    switch (ev.type) {
    case RL_K8S_ERROR:
        if (ev.code == 410) {
            w->gone = true;
        } else {
            w->failed = true;
            rl_errf(&w->err, RL_EPEER, "watch ERROR event %ld: %s", ev.code, ev.message);
        }
        stop = 1;
        break;
    case RL_K8S_BOOKMARK: snprintf(w->rv, sizeof w->rv, "%s", ev.resource_version); break;
    default:
        if (ev.resource_version[0]) snprintf(w->rv, sizeof w->rv, "%s", ev.resource_version);
        w->events++;
        if (w->fn(w->ud, ev.type, ev.object) != 0) {
            w->user_stop = true;
            stop = 1;
        }
    }
    rl_k8s_event_free(&ev);
    return stop;
}

static int on_data(void *ud, const char *data, size_t n) {
    wstate *w = ud;
    int r = rl_http_lines_feed(&w->lines, data, n, on_line, w, &w->err);
    if (r && !w->user_stop && !w->gone) w->failed = true; /* over-long line, or parse error */
    return r != 0;
}

static bool stopped(const rl_k8s_watch_opts *o) { return o->stop && *o->stop; }

static void log_watch(const char *what, const rl_k8s_watch_opts *o, const char *msg, double delay) {
    char sp[200], esc[300], em[600];
    rl_k8s__short_path(o->path, sp, sizeof sp);
    rl_json_escape(esc, sizeof esc, sp);
    rl_json_escape(em, sizeof em, msg);
    rl_log(RL_LOG_WARN, what, "\"path\":\"%s\",\"error\":\"%s\",\"delay_s\":%.3f", esc, em, delay);
}

/* A status that retrying cannot fix: the caller must hear about it. */
static bool fatal_status(long st) { return st >= 400 && st < 500 && st != 410 && st != 429; }

int rl_k8s_list_watch(rl_k8s *c, const rl_k8s_watch_opts *o, rl_k8s_watch_fn fn, void *ud,
                      rl_err *e) {
    wstate w = {.fn = fn, .ud = ud};
    rl_http_lines_init(&w.lines, 0, "watch stream");
    bool need_list = true;
    int failures = 0;
    int wt = o->watch_timeout_s > 0 ? o->watch_timeout_s : 300;
    double idle = o->idle_timeout_s > 0 ? o->idle_timeout_s : 90;
    int rc = RL_OK;
    while (!stopped(o)) {
        long st = 0;
        if (need_list) {
            cJSON *items = NULL;
            rc = list_all(c, o, &items, w.rv, sizeof w.rv, &st, e);
            if (rc == RL_EABORT || stopped(o)) {
                cJSON_Delete(items);
                break;
            }
            if (rc) {
                if (fatal_status(st)) goto out;
                double d = rl_k8s__backoff(c, failures++, -1);
                log_watch("k8s_list_retry", o, e ? e->msg : "", d);
                if (rl_http_sleep(d, o->stop) != RL_OK) break;
                continue;
            }
            int r = fn(ud, RL_K8S_SYNC, items);
            cJSON_Delete(items);
            if (r) break;
            need_list = false;
            failures = 0;
        }
        char q[8192];
        snprintf(q, sizeof q, "%s", o->path);
        char tos[16];
        snprintf(tos, sizeof tos, "%d", wt);
        rc = selectors(q, sizeof q, o, e);
        if (!rc) rc = add_query(q, sizeof q, "watch", "1", e);
        if (!rc) rc = add_query(q, sizeof q, "resourceVersion", w.rv, e);
        if (!rc) rc = add_query(q, sizeof q, "allowWatchBookmarks", "true", e);
        if (!rc) rc = add_query(q, sizeof q, "timeoutSeconds", tos, e);
        if (rc) goto out;
        w.gone = w.failed = false;
        w.events = 0;
        w.lines.len = 0;
        bool cut = false;
        double t0 = rl_now();
        rc = rl_k8s__stream(c, q, on_data, &w, idle, 0, o->stop, &st, &cut, e);
        if (w.user_stop) {
            rc = RL_OK;
            break;
        }
        if (stopped(o) || rc == RL_EABORT) break;
        if (w.gone || st == 410) {
            /* the server no longer has our version: start again from a list */
            rl_log(RL_LOG_INFO, "k8s_relist", "\"reason\":\"410 Gone\"");
            need_list = true;
            rc = RL_OK;
            continue;
        }
        if (rc && fatal_status(st)) goto out;
        if (rc == RL_OK && !w.failed) {
            /* a normal end (timeoutSeconds): resume from the newest version;
             * one that ends at once with nothing in it counts as a failure,
             * so a misbehaving server cannot make us spin */
            if (w.events > 0 || rl_now() - t0 > 1.0) {
                failures = 0;
                continue;
            }
        }
        const char *why = w.failed ? w.err.msg : rc ? (e ? e->msg : "") : "stream ended at once";
        double d = rl_k8s__backoff(c, failures++, -1);
        log_watch("k8s_watch_retry", o, why, d);
        rc = RL_OK;
        if (rl_http_sleep(d, o->stop) != RL_OK) break;
    }
    rc = RL_OK;
out:
    rl_http_lines_free(&w.lines);
    return rc;
}

int rl_k8s_endpointslices_watch(rl_k8s *c, const char *ns, const char *service,
                                const volatile int *stop, rl_k8s_watch_fn fn, void *ud,
                                rl_err *e) {
    char path[600], sel[400];
    int rc = rl_k8s_endpointslices_path(path, sizeof path, ns ? ns : rl_k8s_namespace(c), e);
    if (rc) return rc;
    snprintf(sel, sizeof sel, "kubernetes.io/service-name=%s", service);
    rl_k8s_watch_opts o = {.path = path, .label_selector = sel, .stop = stop};
    return rl_k8s_list_watch(c, &o, fn, ud, e);
}
