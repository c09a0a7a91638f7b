/* The GPU model's buffer layout (gpu_layout.h). */
#include "kernels/gpu_layout.h"

#include <stdint.h>
#include <string.h>

#define F32 sizeof(float)
#define BF16 sizeof(uint16_t)

int rl_gpu_rms_rows_per_block(int N) {
    int r = (N + 1023) / 1024;
    return r < 8 ? 8 : r;
}

int rl_gpu_rms_blocks(int N) {
    int r = rl_gpu_rms_rows_per_block(N);
    return (N + r - 1) / r;
}

/* the vocabulary padded to a multiple of 64 rows (the lm_head GEMMs' rows aligned) */
static int vocab_padded(const rl_model_config *c) { return (c->vocab_size + 63) / 64 * 64; }

void rl_gpu_grad_region(const rl_model_config *c, int k, size_t *off, size_t *len) {
    rl_param_layout p;
    rl_param_layout_init(&p, c);
    int L = c->num_hidden_layers;
    *off = k == 0 ? p.embed : k <= L ? p.layers + (size_t)(k - 1) * p.layer_size : p.final_norm;
    *len = k == 0 ? p.layers - p.embed : k <= L ? p.layer_size : p.total - p.final_norm;
}

int rl_gpu_grad_regions(const rl_model_config *c, size_t *cuts) {
    size_t len;
    for (int k = 0; cuts && k < c->num_hidden_layers + 2; k++) rl_gpu_grad_region(c, k, &cuts[k], &len);
    return c->num_hidden_layers + 2;
}

size_t rl_gpu_grad_slot_len(const rl_model_config *c) {
    rl_param_layout p;
    rl_param_layout_init(&p, c);
    size_t D = (size_t)c->hidden_size, V = (size_t)c->vocab_size, Vp = (size_t)vocab_padded(c);
    size_t head = p.total - p.final_norm + (Vp - V) * D, most = head > p.layer_size ? head : p.layer_size;
    return most > p.layers - p.embed ? most : p.layers - p.embed;
}

/* 256-byte alignment for every sub-buffer: the 16-byte vector paths and
 * cuBLASLt's fastest kernels want at least that, and it costs nothing. */
static size_t carve(size_t *off, size_t bytes) {
    size_t o = *off;
    *off = o + (bytes + 255) / 256 * 256;
    return o;
}

void rl_gpu_layout_of(const rl_model_config *c, int B, int T, int recompute, int dq_atomic,
                      int classifier_rows, rl_gpu_layout *o) {
    memset(o, 0, sizeof *o);
    size_t N = (size_t)B * T, L = (size_t)c->num_hidden_layers, D = (size_t)c->hidden_size;
    size_t F = (size_t)c->intermediate_size, H = (size_t)c->num_attention_heads;
    size_t hd = (size_t)rl_model_head_dim(c), qd = H * hd, C3 = qd + 2 * (size_t)c->num_key_value_heads * hd;
    o->Vp = vocab_padded(c);
    /* chunks of equal size, rows a multiple of 128 (GEMM tiles) unless one
     * chunk holds the whole batch */
    size_t nch = (N * (size_t)o->Vp * BF16 + RL_CLS_CHUNK_BYTES - 1) / RL_CLS_CHUNK_BYTES;
    size_t rows = (N + nch - 1) / nch;
    if (nch > 1) rows = (rows + 127) / 128 * 128;
    if (classifier_rows > 0) rows = (size_t)classifier_rows;
    o->crows = (int)(rows < N ? rows : N);
    o->io_ints = 5 * N + 2;

    o->s_btd = N * D, o->s_bt = N, o->s_qkv = N * C3, o->s_att = N * qd, o->s_gu = N * 2 * F;
    /* recompute: one layer's norm outputs and SwiGLU product, rebuilt by
     * the backward kernels, instead of every layer's */
    o->s_ln = recompute ? 0 : N * D, o->s_hm = recompute ? 0 : N * F;
    /* each layer's lse 256-byte aligned: cuDNN's stats tensor is declared
     * 16-byte aligned (gpu_attn_cudnn.cu), and N x heads floats need not be */
    o->s_bh = (N * H + 63) / 64 * 64;
    size_t keep = recompute ? 1 : L, off = 0;
    o->res = carve(&off, (L + 1) * N * D * F32);
    o->res_mid = carve(&off, L * N * D * F32);
    o->ln1 = carve(&off, keep * N * D * BF16);
    o->rstd1 = carve(&off, L * N * F32);
    o->qkv = carve(&off, L * N * C3 * BF16);
    o->att_lse = carve(&off, L * o->s_bh * F32);
    o->atty = carve(&off, L * N * qd * BF16);
    o->ln2 = carve(&off, keep * N * D * BF16);
    o->rstd2 = carve(&off, L * N * F32);
    o->gu = carve(&off, L * N * 2 * F * BF16);
    o->hm = carve(&off, keep * N * F * BF16);
    o->lnf = carve(&off, N * D * BF16);
    o->rstdf = carve(&off, N * F32);
    o->logits = carve(&off, (size_t)o->crows * (size_t)o->Vp * BF16);
    o->lse_cls = carve(&off, N * F32);
    o->losses = carve(&off, N * F32);
    o->rope = carve(&off, (size_t)c->max_position_embeddings * hd * F32);
    o->acts = off;

    off = 0;
    o->dres = carve(&off, N * D * F32);
    o->dres16 = carve(&off, N * D * BF16);
    o->dln = carve(&off, N * D * BF16);
    o->datty = carve(&off, N * qd * BF16);
    o->dqkv = carve(&off, N * C3 * BF16);
    o->dh = carve(&off, N * F * BF16);
    o->dgu = carve(&off, N * 2 * F * BF16);
    o->dsum = carve(&off, N * H * F32);
    if (dq_atomic) o->dq_acc = carve(&off, N * qd * F32);
    o->rms_partial = carve(&off, (size_t)rl_gpu_rms_blocks((int)N) * D * F32);
    o->norm_partial = carve(&off, RL_K_NORM_BLOCKS * F32);
    o->cls_tiles = (o->Vp + RL_CLS_TILE - 1) / RL_CLS_TILE;
    o->cls_stats = carve(&off, (size_t)o->crows * (3 * (size_t)o->cls_tiles + 1) * F32);
    o->scalars = carve(&off, 4 * F32);
    o->io = carve(&off, o->io_ints * sizeof(int32_t));
    o->ws = carve(&off, RL_GEMM_WORKSPACE);
    o->scratch = off;
}
