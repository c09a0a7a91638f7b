/* The worker's environment (env.h): read once, parsed here. */
#include "env.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "rdzv/rdzv.h"

/* set and non-empty, else NULL */
static const char *var(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static const char *either(const char *a, const char *b) { return var(a) ? var(a) : var(b); }

void worker_env_read(worker_env *w) {
    static char host[256];
    if (!host[0] && gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    *w = (worker_env){
        .config = var("RINGLEADER_CONFIG"),
        .nnodes = var("RINGLEADER_NNODES"),
        .child = var(RL_ENV_CHILD) && *var(RL_ENV_CHILD) == '1',
        .master_port = either("PET_MASTER_PORT", "MASTER_PORT") != NULL,
        .secret = var(RL_ENV_RDZV_SECRET),
        .pod_name = var("POD_NAME") ? var("POD_NAME") : host,
        .node_name = var("NODE_NAME"),
        .rack = var("RINGLEADER_RACK"),
        .pod_ip = either("POD_IP", "RL_HOST_ADDR"),
        .ring_host = either("RL_HOST_ADDR", "POD_IP"),
        .pod_ns = var("POD_NAMESPACE"),
        .kubeconfig = var("KUBECONFIG"),
        .store_prefix = var(RL_ENV_STORE_PREFIX),
        .store_hosted = var(RL_ENV_STORE_HOSTED) && *var(RL_ENV_STORE_HOSTED) == '1',
        .stats_fd = var(RL_ENV_STATS_FD),
        .ctl_fd = var(RL_ENV_CTL_FD),
        .termination_log = var(RL_ENV_TERMINATION_LOG) ? var(RL_ENV_TERMINATION_LOG) : "/dev/termination-log",
        .progress_interval = var("RL_PROGRESS_INTERVAL_S"),
        .metrics_port = var("RINGLEADER_METRICS_PORT"),
        .metrics_addr = either("RINGLEADER_METRICS_ADDR", "POD_IP"),
        .peak_tflops = var("RINGLEADER_PEAK_TFLOPS"),
    };
}

int worker_set_nodes(rl_job_config *cfg, const char *text, const char *what, rl_err *e) {
    int lo, hi, rc = rl_parse_nodes(text, what, &lo, &hi, e);
    if (!rc) cfg->rdzv.min_nodes = lo, cfg->rdzv.max_nodes = hi;
    return rc;
}

int worker_env_config(const worker_env *w, rl_job_config *cfg, rl_err *e) {
    int rc = rl_cfg_from_env(&rl_job_config_section, cfg, getenv, e);
    if (!rc && w->nnodes) rc = worker_set_nodes(cfg, w->nnodes, "RINGLEADER_NNODES", e);
    return rc;
}

int worker_env_stats(const worker_env *w, int flag_port, rl_node_stats_opts *o, rl_err *e) {
    char *end;
    if (flag_port >= 0) {
        o->port = flag_port;
    } else if (w->metrics_port) {
        long p = strtol(w->metrics_port, &end, 10);
        if (*end || p < 0 || p > 65535)
            return rl_errf(e, RL_EINPUT, "RINGLEADER_METRICS_PORT: \"%.32s\" is not a port (0..65535, 0: off)",
                           w->metrics_port);
        o->port = (int)p;
    }
    /* the pod IP by default: the port then belongs to this pod's address
     * only (agents of a test share one host on 127.0.N.x addresses) */
    snprintf(o->addr, sizeof o->addr, "%s", w->metrics_addr ? w->metrics_addr : "");
    if (w->peak_tflops) {
        double p = strtod(w->peak_tflops, &end);
        if (*end || !(p > 0) || !isfinite(p))
            return rl_errf(e, RL_EINPUT,
                           "RINGLEADER_PEAK_TFLOPS: \"%.32s\" is not a positive number (TFLOP/s of one device)",
                           w->peak_tflops);
        o->peak_tflops = p;
    }
    return RL_OK;
}

int worker_env_elastic(const worker_env *w, rl_elastic_env *ee, rl_err *e) {
    *ee = (rl_elastic_env){.id = w->pod_name, .addr = w->pod_ip, .ns = w->pod_ns, .kubeconfig = w->kubeconfig,
                           .secret = w->secret, .rack = w->rack};
    /* a label value's limit: the round's join record holds no more */
    if (w->rack && strlen(w->rack) > 63)
        return rl_errf(e, RL_EINPUT, "RINGLEADER_RACK: %zu characters, over a label value's 63", strlen(w->rack));
    if (w->progress_interval) {
        char *end;
        double v = strtod(w->progress_interval, &end);
        if (*end || !(v > 0) || v > 86400)
            return rl_errf(e, RL_EINPUT, "RL_PROGRESS_INTERVAL_S: \"%.32s\" is not a number of seconds in (0, 86400]",
                           w->progress_interval);
        ee->progress_interval_s = v;
    }
    return RL_OK;
}
