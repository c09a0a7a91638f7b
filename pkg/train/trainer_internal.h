/* The trainer's state, internal to pkg/train: users hold an opaque
 * rl_trainer (train.h) and reach it through accessors, so the loop's state
 * and what runs on which device can change without touching them. The
 * device's own state (model, streams, staging buffers) is behind the
 * device seam (device.h), not here. */
#ifndef RL_TRAINER_INTERNAL_H
#define RL_TRAINER_INTERNAL_H

#include "device.h"
#include "train.h"

struct rl_trainer {
    rl_job_config cfg;  /* device and backend settled (rl_train_pick_device) */
    rl_train_device dev; /* the model, where it runs; dev.params / dev.opt: the host state */
    rl_dataset *train_ds, *val_ds;
    rl_loader *loader;
    int32_t *inputs, *targets;
    size_t *regions; /* rl_trainer_grad_regions' answer, made on first call */
    int nregions;
    int accum;             /* micro-steps per optimizer step on this rank */
    long long step;        /* optimizer steps done */
    uint64_t start_sample; /* global sample index of the first step run here */
    rl_train_dist *dist;   /* NULL: single process */
    int local_rank;        /* the device's, fixed for the process */
    double t_start;
    bool tty;
    const volatile int *stop; /* set asynchronously (signal): stop at the next step */
    bool stop_agreed;         /* some rank saw *stop: every rank stops after this step */
    const volatile int *yield; /* set by the agent (a round ends gracefully): leave the round, keep the state */
    bool yield_agreed;        /* some rank saw *yield: every rank leaves after this step */
    rl_run_summary summary;
    /* checkpoint state */
    uint64_t sample;          /* global sample index of the next step's first sample */
    uint64_t tokens_seen;
    rl_rng rng;               /* saved and restored; nothing on the CPU path draws from it yet */
    rl_ckpt_store *store;     /* rank 0 (every rank with dist.shard) with checkpoint.uri set; else NULL */
    rl_ckpt_saver *saver;
    bool save_agreed;         /* the step's average carried rank 0's "a cadence checkpoint is due" */
    uint64_t nonce;           /* sharded: this round's, agreed at resume; tells its saves' shard receipts apart */
    bool resume_done;
    bool live;                /* the state is a whole step's (done or resumed here): a replica to share */
    long long committed_step; /* newest step known committed by this run (-1: none) */
    double last_save_t;
    rl_train_observer observer; /* zero: none; set after construction */
    long long observed_ckpt;    /* the newest save reported to the observer (-1: none) */
    double flops_per_token;
    /* data.tokenizer (tokenizer.c): NULL / zero when byte-level */
    rl_bpe *bpe;
    char *tok_json;
    rl_ckpt_tokenizer tok; /* what checkpoints carry; .json NULL: nothing */
    rl_doc_frame frame;    /* the tokens around each document (samples start with them) */
};

/* Reads and checks data.tokenizer, and the train shards' dataset.json
 * against it (also with no tokenizer: the shards must then be byte-level). */
int rl_train_tokenizer_open(rl_trainer *tr, rl_err *e);
void rl_train_tokenizer_free(rl_trainer *tr);
/* Every line of train.sample_prompts continued; rank 0 logs them (event sample). */
int rl_train_samples(rl_trainer *tr, rl_err *e);

#endif
