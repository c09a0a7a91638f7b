/* Internal to pkg/ckpt: what the writer and reader (ckpt.c) share with
 * the ranged reader of a rank's slice (slice.c). */
#ifndef RL_CKPT_INTERNAL_H
#define RL_CKPT_INTERNAL_H

#include "ckpt.h"

/* A run of the flat layout stored contiguously in an optimizer file:
 * elements [off, off + len) at byte m_at (exp_avg) and v_at (exp_avg_sq)
 * of the file. */
typedef struct rl_ckpt_run {
    size_t off, len;
    uint64_t m_at, v_at;
} rl_ckpt_run;

/* An optimizer shard's runs (malloc'd, *nruns of them), from its parsed
 * header and the bytes of its "ranges" tensor: exp_avg and exp_avg_sq F32
 * [k], ranges I64 [r, 2]; each range inside the model's n elements, one
 * after the other in the moments, together exactly k. RL_EINPUT naming
 * `where` otherwise. */
int rl_ckpt_shard_runs(const rl_ckpt_st *st, const void *ranges, size_t ranges_bytes, size_t n, const char *where,
                       rl_ckpt_run **runs, size_t *nruns, rl_err *e);

#endif
