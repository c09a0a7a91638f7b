/* A ringleader job of elastic node agents for tests and benchmarks: the
 * real ringleader-worker binary, one process per "pod" on its own
 * 127.0.<net>.(10+i) address, discovering its peers through the
 * Kubernetes stand-in (or a real etcd), each agent's output in its own
 * log. No Criterion here, so bench/ can use it too. */
#ifndef RL_TEST_JOBTEST_H
#define RL_TEST_JOBTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "etcdtest.h"
#include "standin.h"

#define RL_TEST_MAXA 20

typedef struct rl_test_job {
    rl_test_standin s;
    rl_test_etcd etcd;
    bool use_etcd;
    int net, steps, every;
    int seqs;                       /* sequences per optimizer step (120) */
    char rdzv[512];                 /* the config's "rdzv" members after backend/job/etcd */
    char dir[64], cfg[128], ckpt[128], bindir[4096];
    pid_t pid[RL_TEST_MAXA];
    char log[RL_TEST_MAXA][128];
} rl_test_job;

/* Data, config, and the stand-in with the job's headless Service (or etcd).
 * rdzv: JSON members for the "rdzv" section (timing, nodes). 0 or -1 with
 * why[]. */
int rl_test_job_setup(rl_test_job *j, int net, bool use_etcd, int steps, int every, const char *rdzv,
                      char *why, size_t wn);
/* The job config with another checkpoint URI and rdzv backend ("static"
 * for a torchrun-style reference run). */
void rl_test_job_write_config(const rl_test_job *j, const char *path, const char *ckpt, const char *backend);
/* Create pod i of the job with its address (what the scheduler and the
 * kubelet would leave), as the operator does before the agent runs. */
int rl_test_job_add_pod(rl_test_job *j, int i);
/* Start agent i (make_pod: create its pod first; an outsider has none). */
int rl_test_job_start_agent(rl_test_job *j, int i, int nproc, const char *secret, bool make_pod);
void rl_test_job_kill(rl_test_job *j, int i);
/* Wait up to timeout for agent i to exit; its wait status, -1 if it did not. */
int rl_test_job_wait(rl_test_job *j, int i, double timeout);
/* Kills what runs and removes the dir (kept when RL_TEST_KEEP_JOB is set). */
void rl_test_job_teardown(rl_test_job *j);

/* JSON log lines with "event": event from every agent log, by time. */
typedef struct rl_test_ev {
    char ts[32];
    double t; /* unix seconds */
    struct cJSON *j;
} rl_test_ev;
int rl_test_job_events(const rl_test_job *j, const char *event, rl_test_ev *out, int max);
void rl_test_job_events_free(rl_test_ev *e, int n);
double rl_test_ev_num(const rl_test_ev *e, const char *key); /* -1 if absent */
/* The highest training step rank 0 logged. */
int rl_test_job_last_step(const rl_test_job *j);
/* The whole file (malloc'd, "" when missing). */
char *rl_test_slurp(const char *path);

#endif
