/* The GPU model's activation and scratch buffers, sized and placed from the
 * shapes alone: one source for the model, which carves its two allocations
 * by it (gpu_model.cu), and for the memory accounting (pkg/train/memory.c),
 * which builds without CUDA. Plain host C. */
#ifndef RL_KERNELS_GPU_LAYOUT_H
#define RL_KERNELS_GPU_LAYOUT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "model/model.h" /* C headers: inside extern "C" for the .cu files */

/* The gradient norm's block partials (rl_k_norm). */
#define RL_K_NORM_BLOCKS 1024
/* cuBLASLt's workspace: what cuBLAS asks for on Hopper. */
#define RL_GEMM_WORKSPACE (32u << 20)
/* Logits are made and consumed in chunks of rows of at most this many bytes
 * (bf16): 1 GiB keeps config a's classifier at 4 chunks (each chunk re-reads
 * and re-writes the fp32 lm_head gradient, 154 MB there) for a quarter of
 * the whole-batch logits' memory. */
#define RL_CLS_CHUNK_BYTES ((size_t)1 << 30)

/* The fused classifier's column tile (gemm_kernels.cuh): its forward keeps
 * per row and tile of this many logits the tile's max and sum of exps,
 * [crows][cdiv(Vp, RL_CLS_TILE)] each, and the backward's factors beside
 * them. */
#define RL_CLS_TILE 128

/* RMSNorm backward: rows per block (at least 8, at most 1024 blocks) and
 * blocks for N rows; its dw partials are blocks x D floats. */
int rl_gpu_rms_rows_per_block(int N);
int rl_gpu_rms_blocks(int N);

typedef struct rl_gpu_layout {
    int Vp;         /* the vocabulary padded to a multiple of 64 */
    int crows;      /* classifier rows per chunk */
    size_t io_ints; /* tokens, targets, the embedding backward's uniq, seg (cap + 1), pos, distinct count */
    /* per-layer strides of the per-layer buffers, in elements (0: one layer kept, recompute) */
    size_t s_btd, s_bt, s_qkv, s_att, s_bh, s_gu, s_ln, s_hm;
    /* byte offsets in the activation allocation, then its size */
    size_t res, res_mid, ln1, rstd1, qkv, att_lse, atty, ln2, rstd2, gu, hm, lnf, rstdf, logits, lse_cls,
        losses, rope, acts;
    /* the fused classifier's per-tile statistics (max, sum, factor: ntiles
     * floats each per chunk row) and each row's target logit */
    int cls_tiles;
    /* byte offsets in the scratch allocation (dq_acc only with dq_atomic), then its size */
    size_t dres, dres16, dln, datty, dqkv, dh, dgu, dsum, dq_acc, rms_partial, norm_partial, cls_stats,
        scalars, io, ws, scratch;
} rl_gpu_layout;

/* The gradient's regions, in the order of the layout: the embedding, each
 * decoder layer, and the head (final norm + lm_head); backward writes each
 * whole between two of its watermarks. cuts (may be NULL) gets their
 * starts, ascending (the next one's start, or the layout's total, ends
 * each); the count is L + 2. With rl_gpu_options.grad_slots the model
 * writes a region into one slot of RL_GPU_GRAD_SLOTS, each the longest
 * region's length plus the padded vocabulary's rows (rl_gpu_grad_slot_len),
 * instead of a whole gradient buffer. */
#define RL_GPU_GRAD_SLOTS 2
/* Layer buffers of a model that streams its decoder layers' weights
 * (rl_gpu_options.stream_layers): the layer being read, the one before it
 * (its kernels may still run) and the next one arriving. */
#define RL_GPU_LAYER_RING 3
int rl_gpu_grad_regions(const rl_model_config *c, size_t *cuts);
/* Region k's start and length (0 <= k < L + 2). */
void rl_gpu_grad_region(const rl_model_config *c, int k, size_t *off, size_t *len);
size_t rl_gpu_grad_slot_len(const rl_model_config *c);

/* The layout for c (validated) at B x T tokens per forward, with
 * rl_gpu_options' recompute, attn_dq_atomic and classifier_rows. Every
 * buffer starts 256-byte aligned. */
void rl_gpu_layout_of(const rl_model_config *c, int B, int T, int recompute, int dq_atomic,
                      int classifier_rows, rl_gpu_layout *out);

#ifdef __cplusplus
}
#endif
#endif
