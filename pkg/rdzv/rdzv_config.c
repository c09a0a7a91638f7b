/* The "rdzv" section of the job config. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "rdzv/rdzv.h"

void rl_rdzv_config_default(rl_rdzv_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "static");
    c->min_nodes = 1, c->max_nodes = 0;
    c->port = RL_STORE_DEFAULT_PORT;
    c->heartbeat_s = 5, c->heartbeat_misses = 3;
    c->last_call_s = 10;
    c->max_restarts = 3;
    c->lease_s = 15, c->renew_deadline_s = 10, c->retry_s = 2; /* client-go's */
    c->stop_grace_s = 30;
}

int rl_rdzv_config_from_json(const cJSON *o, const char *w, rl_rdzv_config *c, rl_err *e) {
    static const char *const keys[] = {"backend", "job", "min_nodes", "max_nodes", "port", "heartbeat_s",
                                       "heartbeat_misses", "last_call_s", "max_restarts", "lease_s",
                                       "renew_deadline_s", "retry_s", "stop_grace_s", "etcd_endpoint", NULL};
    long long mn = c->min_nodes, mx = c->max_nodes, port = c->port, misses = c->heartbeat_misses,
              restarts = c->max_restarts;
    int rc = rl_cfg_check_keys(o, w, keys, e);
    if (rc || (rc = rl_cfg_str(o, w, "backend", c->backend, sizeof c->backend, e)) ||
        (rc = rl_cfg_str(o, w, "job", c->job, sizeof c->job, e)) ||
        (rc = rl_cfg_int(o, w, "min_nodes", 1, 1 << 16, &mn, e)) ||
        (rc = rl_cfg_int(o, w, "max_nodes", 0, 1 << 16, &mx, e)) ||
        (rc = rl_cfg_int(o, w, "port", 0, 65535, &port, e)) ||
        (rc = rl_cfg_num(o, w, "heartbeat_s", 0.05, 3600, &c->heartbeat_s, e)) ||
        (rc = rl_cfg_int(o, w, "heartbeat_misses", 1, 1000, &misses, e)) ||
        (rc = rl_cfg_num(o, w, "last_call_s", 0, 86400, &c->last_call_s, e)) ||
        (rc = rl_cfg_int(o, w, "max_restarts", 0, 1 << 20, &restarts, e)) ||
        (rc = rl_cfg_num(o, w, "lease_s", 1, 3600, &c->lease_s, e)) ||
        (rc = rl_cfg_num(o, w, "renew_deadline_s", 0.1, 3600, &c->renew_deadline_s, e)) ||
        (rc = rl_cfg_num(o, w, "retry_s", 0.05, 3600, &c->retry_s, e)) ||
        (rc = rl_cfg_num(o, w, "stop_grace_s", 0, 3600, &c->stop_grace_s, e)) ||
        (rc = rl_cfg_str(o, w, "etcd_endpoint", c->etcd_endpoint, sizeof c->etcd_endpoint, e)))
        return rc;
    c->min_nodes = (int)mn, c->max_nodes = (int)mx, c->port = (int)port;
    c->heartbeat_misses = (int)misses, c->max_restarts = (int)restarts;
    char esc[64];
    if (strcmp(c->backend, "static") && strcmp(c->backend, "k8s") && strcmp(c->backend, "etcd"))
        return rl_errf(e, RL_EINPUT, "%s.backend: \"%s\" is not static, k8s or etcd", w,
                       rl_json_escape(esc, sizeof esc, c->backend));
    if (c->max_nodes && c->max_nodes < c->min_nodes)
        return rl_errf(e, RL_EINPUT, "%s.max_nodes: %d is below min_nodes %d", w, c->max_nodes, c->min_nodes);
    if (c->renew_deadline_s >= c->lease_s)
        return rl_errf(e, RL_EINPUT, "%s.renew_deadline_s: %.3g must be below lease_s %.3g", w,
                       c->renew_deadline_s, c->lease_s);
    if (c->retry_s * 1.2 > c->renew_deadline_s)
        return rl_errf(e, RL_EINPUT, "%s.retry_s: %.3g must be at most renew_deadline_s / 1.2", w, c->retry_s);
    return RL_OK;
}

void rl_rdzv_config_add_json(const rl_rdzv_config *c, cJSON *o) {
    cJSON_AddStringToObject(o, "backend", c->backend);
    cJSON_AddStringToObject(o, "job", c->job);
    cJSON_AddNumberToObject(o, "min_nodes", c->min_nodes);
    cJSON_AddNumberToObject(o, "max_nodes", c->max_nodes);
    cJSON_AddNumberToObject(o, "port", c->port);
    cJSON_AddNumberToObject(o, "heartbeat_s", c->heartbeat_s);
    cJSON_AddNumberToObject(o, "heartbeat_misses", c->heartbeat_misses);
    cJSON_AddNumberToObject(o, "last_call_s", c->last_call_s);
    cJSON_AddNumberToObject(o, "max_restarts", c->max_restarts);
    cJSON_AddNumberToObject(o, "lease_s", c->lease_s);
    cJSON_AddNumberToObject(o, "renew_deadline_s", c->renew_deadline_s);
    cJSON_AddNumberToObject(o, "retry_s", c->retry_s);
    cJSON_AddNumberToObject(o, "stop_grace_s", c->stop_grace_s);
    cJSON_AddStringToObject(o, "etcd_endpoint", c->etcd_endpoint);
}
