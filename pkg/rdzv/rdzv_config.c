/* The "rdzv" section of the job config. */
#include <stdio.h>
#include <string.h>

#include "rdzv/rdzv.h"

static int rdzv_check(const void *obj, const char *w, rl_err *e) {
    const rl_rdzv_config *c = obj;
    if (c->max_nodes && c->max_nodes < c->min_nodes)
        return rl_errf(e, RL_EINPUT, "%s.max_nodes: %d is below min_nodes %d", w, c->max_nodes, c->min_nodes);
    if (c->renew_deadline_s >= c->lease_s)
        return rl_errf(e, RL_EINPUT, "%s.renew_deadline_s: %.3g must be below lease_s %.3g", w,
                       c->renew_deadline_s, c->lease_s);
    if (c->retry_s * 1.2 > c->renew_deadline_s)
        return rl_errf(e, RL_EINPUT, "%s.retry_s: %.3g must be at most renew_deadline_s / 1.2", w, c->retry_s);
    return RL_OK;
}

static const char *const backends[] = {"static", "k8s", "etcd", NULL};
/* The operator sets backend, job, the node range and the port from the
 * TrainingJob (replicas, elastic, rdzvPort), so spec.training leaves them
 * out; a config file run by hand may set them. */
#define OP .flags = RL_CFG_OPERATOR
#define F(f, ...) RL_CFG_FIELD(rl_rdzv_config, f, __VA_ARGS__)
static const rl_cfg_field rdzv_fields[] = {
    F(backend, OP, .choices = backends, .def_str = "static", .env = "RINGLEADER_RDZV",
      .doc = "static (torchrun/SLURM environment), k8s or etcd."),
    F(job, OP, .env = "RINGLEADER_JOB", .doc = "The job's name: its Service, Lease and etcd prefix."),
    F(min_nodes, OP, .min = 1, .max = 1 << 16, .def = 1),
    F(max_nodes, OP, .min = 0, .max = 1 << 16, .def = 0, .doc = "0: a fixed size of min_nodes."),
    F(port, OP, .min = 0, .max = 65535, .def = RL_STORE_DEFAULT_PORT, .doc = "The leader's store."),
    F(heartbeat_s, .min = 0.05, .max = 3600, .def = 5),
    F(heartbeat_misses, .min = 1, .max = 1000, .def = 3, .doc = "Heartbeats missed before a node counts as gone."),
    F(last_call_s, .min = 0, .max = 86400, .def = 10,
      .doc = "A round waits this long for more nodes once it can start."),
    F(max_restarts, .min = 0, .max = 1 << 20, .def = 3, .doc = "Rounds that fail on a crash before the job fails."),
    /* client-go's leader election timings */
    F(lease_s, .min = 1, .max = 3600, .def = 15),
    F(renew_deadline_s, .min = 0.1, .max = 3600, .def = 10, .doc = "Below lease_s."),
    F(retry_s, .min = 0.05, .max = 3600, .def = 2, .doc = "At most renew_deadline_s / 1.2."),
    F(stop_grace_s, .min = 0, .max = 3600, .def = 30,
      .doc = "At a graceful round change: trainers' SIGTERM to SIGKILL (in place: first the time to yield, 30 at least)."),
    F(bench_s, .min = 0, .max = 86400 * 7, .def = 600,
      .doc = "A node the pre-flight finds far below the median stays out of an elastic job's rounds this long, "
             "while the job keeps min_nodes (0: never left out)."),
    F(in_place, .def = 1,
      .doc = "When a node is lost, the others keep their processes and state and the next round resumes "
             "from a live replica, not from the last checkpoint."),
    F(etcd_endpoint, OP, .env = "RINGLEADER_ETCD_ENDPOINT", .doc = "http://host:port of etcd (backend etcd)."),
};
#undef F
#undef OP

const rl_cfg_section rl_rdzv_config_section = RL_CFG_SECTION(
    rdzv_fields, .check = rdzv_check,
    .doc = "Rendezvous timing. backend, job, min_nodes, max_nodes, port and etcd_endpoint are the "
           "TrainingJob's (replicas, elastic, rdzvPort) and are not accepted here.");

void rl_rdzv_config_default(rl_rdzv_config *c) { rl_cfg_defaults(&rl_rdzv_config_section, c); }
