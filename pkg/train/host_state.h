/* train.offload's host state (internal to pkg/train): the fp32 master
 * weights, the AdamW moments and the bf16 copy of the weights, in one
 * page-aligned mapping of their own, so that the ranks of one node can
 * later put one shared-memory object in its place at the same addresses
 * (train.offload_share). Pointers into it (the device seam's params and
 * opt, the model's host weights) stay valid across that swap.
 *
 * Shared, each rank updates its slice of every region (rl_host_slice) and
 * publishes it; a region's weights are final for this step once every
 * rank published it (rl_host_state_ready), which the readers (the copies
 * up, the checkpoint) wait for. Nothing here blocks: the callers poll
 * with their own deadlines. */
#ifndef RL_TRAIN_HOST_STATE_H
#define RL_TRAIN_HOST_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train.h"

typedef struct rl_host_state {
    float *params;  /* n: the fp32 master */
    float *opt;     /* 2 x n: AdamW's m, then v; NULL: kept elsewhere (a rank's shard, dist.shard) */
    uint16_t *bf16; /* n: the weights as the GPU reads them */
    size_t n;
    int nreg;       /* regions with a progress counter */
    /* shared (world > 1) or private (world 1, and before any share) */
    int rank, world;
    char *base;     /* the mapping: a header page with the counters, then the arrays */
    size_t len;
    size_t bf16_off; /* bf16's offset in it (page-aligned) */
} rl_host_state;

/* Private memory for n parameters and nreg regions, zeroed; without
 * moments, the master and bf16 weights only (dist.shard: the device seam
 * keeps the shard's moments, and such a state is never shared). */
int rl_host_state_alloc(rl_host_state *s, size_t n, int nreg, bool moments, rl_err *e);
void rl_host_state_free(rl_host_state *s);

/* Every rank of dist's round calls it (a collective: dist's broadcast and
 * average), with its state identical to every other rank's: when all of
 * them run on this host and can map one object in /dev/shm, rank 0's
 * state becomes everyone's (*shared true, s->rank and s->world set);
 * otherwise nothing changes (*shared false, *why says what stood in the
 * way). The object is unlinked before this returns on every rank, so
 * nothing outlives the processes; it is named as the comm's rings are
 * ("/rl-comm-<pid>-..."), whose sweep takes one a killed rank 0 left. The
 * caller unregisters and registers the bf16 pages with CUDA around it. */
int rl_host_state_share(rl_host_state *s, const rl_train_dist *dist, bool *shared, char *why, size_t whyn,
                        rl_err *e);
/* Back to a private copy of what is there now (this rank alone). */
int rl_host_state_unshare(rl_host_state *s, rl_err *e);
static inline bool rl_host_state_shared(const rl_host_state *s) { return s->world > 1; }

/* This rank's slice of [lo, hi): the whole range when private; else its
 * block as rl_comm_reduce_scatter splits the range -- (hi - lo) / world
 * elements, block r rank r's -- the last rank's with the tail, so every
 * element is one rank's and a reduce-scatter of the region's gradients
 * (rl_train_dist's split) leaves each rank exactly its slice's average. */
void rl_host_slice(const rl_host_state *s, size_t lo, size_t hi, size_t *a, size_t *b);
/* This rank's slice of region k is updated for its gen-th step since the
 * share (gen counts from 1). */
void rl_host_state_publish(rl_host_state *s, int k);
/* Every rank's slice of region k is updated for step gen (private: true). */
bool rl_host_state_ready(const rl_host_state *s, int k, uint64_t gen);

#endif
