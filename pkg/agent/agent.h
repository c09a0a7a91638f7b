/* agent: the processes of a job on one node.
 *
 * rl_launch is the node agent of static rendezvous (torchrun --standalone
 * and --nnodes with a fixed master): node 0's agent hosts the store, each
 * agent forks nproc_per_node trainers with their rank environment,
 * forwards SIGINT/SIGTERM, and when one trainer dies stops the others and
 * reports which rank failed and how.
 *
 * rl_proc_run is one trainer process: from its rank environment (set by
 * rl_launch, torchrun or SLURM) to a finished run -- store, communicator,
 * DDP, trainer. With world size 1 and no environment the worker skips both
 * and trains in-process. */
#ifndef RL_AGENT_H
#define RL_AGENT_H

#include "rdzv/rdzv.h"
#include "train/train.h"
#include "util/util.h"

typedef struct rl_proc_opts {
    const rl_job_config *cfg;
    const rl_static_env *env;
    const char *save_params;   /* rank 0 writes the final parameters here (NULL: no) */
    const volatile int *stop;  /* set by a signal handler */
} rl_proc_opts;

/* Runs the whole training; *summary is filled on rank 0 (the data digest
 * is summed over ranks, so it covers the whole job). */
int rl_proc_run(const rl_proc_opts *o, rl_run_summary *summary, rl_err *e);

typedef struct rl_launch_opts {
    rl_node_env node;     /* nnodes, node_rank, nproc_per_node, master */
    char *const *argv;    /* the trainer command (argv[0] is exec'd) */
    double grace_s;       /* SIGTERM -> SIGKILL delay when stopping trainers */
    const volatile int *stop; /* set by the caller's signal handler: forward it */
    volatile int *stop_sig;   /* which signal (SIGINT/SIGTERM) to forward */
} rl_launch_opts;

/* Returns RL_OK when every trainer exited 0; otherwise RL_EPEER with a
 * message naming the first rank that failed and its exit status or signal,
 * or RL_EABORT when stopped by a signal. */
int rl_launch(const rl_launch_opts *o, rl_err *e);

/* Environment variable a launched trainer sees: the store already runs. */
#define RL_ENV_STORE_HOSTED "RINGLEADER_STORE_HOSTED"
/* Set in trainers started by rl_launch, so they do not launch again. */
#define RL_ENV_CHILD "RINGLEADER_CHILD"

#endif
