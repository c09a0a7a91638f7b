/* What ringleader-worker takes from its environment, read here and
 * nowhere else below cmd/ (DESIGN.md lists the few process-wide knobs
 * that stay where they act). One precedence for every setting: flags,
 * then the environment, then the config file, then the defaults. */
#ifndef RL_CMD_WORKER_ENV_H
#define RL_CMD_WORKER_ENV_H

#include <stdbool.h>

#include "agent/agent.h"
#include "train/train.h"

typedef struct worker_env {
    const char *config;      /* RINGLEADER_CONFIG: the config's JSON (the operator's spec.training) */
    const char *nnodes;      /* RINGLEADER_NNODES: "N" or "MIN:MAX" of an elastic job */
    bool child;              /* RINGLEADER_CHILD=1: a trainer an agent or the launcher started */
    bool master_port;        /* PET_MASTER_PORT or MASTER_PORT is set */
    const char *secret;      /* RINGLEADER_RDZV_SECRET (never logged) */
    const char *pod_name;    /* POD_NAME, else the host name */
    const char *node_name;   /* NODE_NAME (the operator's downward API: spec.nodeName), else NULL */
    const char *rack;        /* RINGLEADER_RACK (the operator's downward API: the pod's copy of its
                                node's spec.rackLabel), else NULL */
    const char *pod_ip;      /* POD_IP, else RL_HOST_ADDR: the agent's address */
    const char *ring_host;   /* RL_HOST_ADDR, else POD_IP: where peers reach a trainer's ring */
    const char *pod_ns;      /* POD_NAMESPACE */
    const char *kubeconfig;  /* KUBECONFIG */
    const char *store_prefix; /* RINGLEADER_STORE_PREFIX: a trainer's keys on its agent's store */
    bool store_hosted;       /* RINGLEADER_STORE_HOSTED=1: the agent hosts the store */
    const char *stats_fd;    /* RINGLEADER_STATS_FD: the pipe to the agent */
    const char *ctl_fd;      /* RINGLEADER_CTL_FD: the agent's control channel (in-place recovery) */
    const char *termination_log; /* RINGLEADER_TERMINATION_LOG, else /dev/termination-log */
    const char *progress_interval; /* RL_PROGRESS_INTERVAL_S (tests: progress Lease writes) */
    const char *metrics_port, *metrics_addr, *peak_tflops; /* RINGLEADER_METRICS_PORT, _ADDR, _PEAK_TFLOPS */
} worker_env;

/* Reads every variable above (the strings are the environment's). */
void worker_env_read(worker_env *w);
/* The config tables' own variables (RINGLEADER_RDZV, RINGLEADER_JOB,
 * RINGLEADER_ETCD_ENDPOINT) and RINGLEADER_NNODES over the config. */
int worker_env_config(const worker_env *w, rl_job_config *cfg, rl_err *e);
/* The metrics options: flag_port (--metrics-port) when >= 0, else
 * RINGLEADER_METRICS_PORT; RINGLEADER_METRICS_ADDR, else POD_IP, else
 * 0.0.0.0; RINGLEADER_PEAK_TFLOPS. RL_EINPUT naming the variable. */
int worker_env_stats(const worker_env *w, int flag_port, rl_node_stats_opts *o, rl_err *e);
/* The pod's side of an elastic agent. */
int worker_env_elastic(const worker_env *w, rl_elastic_env *ee, rl_err *e);
/* "N" or "MIN:MAX" (from --nnodes or RINGLEADER_NNODES, named by `what`)
 * into the config's rdzv.min_nodes / max_nodes. */
int worker_set_nodes(rl_job_config *cfg, const char *text, const char *what, rl_err *e);

#endif
