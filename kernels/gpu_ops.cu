// Single kernels on host arrays, for tests/gpu: each call allocates its
// device buffers, uploads (rounding bf16 inputs to nearest even), poisons
// every output with NaN bits, runs the kernel on a private stream, waits,
// downloads and frees. Slow and simple on purpose: these exist to check the
// kernels against the CPU reference, not to be fast.
#include <stdlib.h>
#include <string.h>

#include "kernels/gpu_internal.cuh"

extern "C" {
#include "model/cpu.h"
}

// ---- host bf16 ----------------------------------------------------------------------------------
static uint16_t f2bf_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                           // nearest even
    return (uint16_t)(u >> 16);
}
static float bf_bits2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
extern "C" float rl_gpu_bf16_round(float x) { return bf_bits2f(f2bf_bits(x)); }

// ---- a call's resources, freed on every return path ---------------------------------------------
namespace {
struct op_ctx {
    cudaStream_t s = nullptr;
    void *bufs[24] = {};
    int n = 0;
    rl_gemm gemm; // owned here so that it outlives nothing it needs
    bool gemm_live = false;
    ~op_ctx() {
        if (s) cudaStreamSynchronize(s);
        if (gemm_live) rl_gemm_free(&gemm);
        for (int i = 0; i < n; i++) cudaFree(bufs[i]);
        if (s) cudaStreamDestroy(s);
    }
};
} // namespace

static int op_begin(op_ctx &c, rl_err *e) {
    RL_TRY(rl_gpu_kernels_init(e));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    return RL_OK;
}

template <class T> static int op_alloc(op_ctx &c, T **p, size_t n, rl_err *e) {
    *p = nullptr;
    if (c.n == (int)(sizeof c.bufs / sizeof c.bufs[0]))
        return rl_errf(e, RL_EINTERNAL, "gpu op: too many buffers");
    void *v = nullptr;
    CUDA_CHECK(cudaMalloc(&v, (n ? n : 1) * sizeof(T)));
    c.bufs[c.n++] = v;
    *p = (T *)v;
    return RL_OK;
}

// All-ones bytes: NaN in fp32 and in bf16, so an unwritten element fails
// any comparison.
template <class T> static int poison(op_ctx &c, T *d, size_t n, rl_err *e) {
    CUDA_CHECK(cudaMemsetAsync(d, 0xff, n * sizeof(T), c.s));
    return RL_OK;
}

static int up_f32(op_ctx &c, float *d, const float *h, size_t n, rl_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, c.s));
    CUDA_CHECK(cudaStreamSynchronize(c.s));
    return RL_OK;
}
static int up_i32(op_ctx &c, int32_t *d, const int32_t *h, size_t n, rl_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(d, h, n * sizeof(int32_t), cudaMemcpyHostToDevice, c.s));
    CUDA_CHECK(cudaStreamSynchronize(c.s));
    return RL_OK;
}
static int up_bf16(op_ctx &c, bf16 *d, const float *h, size_t n, rl_err *e) {
    uint16_t *t = (uint16_t *)malloc((n ? n : 1) * sizeof(uint16_t));
    if (!t) return rl_errf(e, RL_ENOMEM, "gpu op: host staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf_bits(h[i]);
    cudaError_t ce = cudaMemcpyAsync(d, t, n * sizeof(uint16_t), cudaMemcpyHostToDevice, c.s);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(c.s);
    free(t);
    CUDA_CHECK(ce);
    return RL_OK;
}
static int down_f32(op_ctx &c, float *h, const float *d, size_t n, rl_err *e) {
    CUDA_CHECK(cudaStreamSynchronize(c.s)); // surfaces a kernel fault here, with its name
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return RL_OK;
}
static int down_bf16(op_ctx &c, float *h, const bf16 *d, size_t n, rl_err *e) {
    CUDA_CHECK(cudaStreamSynchronize(c.s));
    uint16_t *t = (uint16_t *)malloc((n ? n : 1) * sizeof(uint16_t));
    if (!t) return rl_errf(e, RL_ENOMEM, "gpu op: host staging");
    cudaError_t ce = cudaMemcpy(t, d, n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess)
        for (size_t i = 0; i < n; i++) h[i] = bf_bits2f(t[i]);
    free(t);
    CUDA_CHECK(ce);
    return RL_OK;
}

// ---- the ops ------------------------------------------------------------------------------------
extern "C" int rl_gpu_op_embed_fwd(float *out, const float *emb, const int32_t *tok, int N, int V,
                                   int D, rl_err *e) {
    op_ctx c;
    float *d_out;
    bf16 *d_emb;
    int32_t *d_tok;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_out, (size_t)N * D, e));
    RL_TRY(op_alloc(c, &d_emb, (size_t)V * D, e));
    RL_TRY(op_alloc(c, &d_tok, (size_t)N, e));
    RL_TRY(up_bf16(c, d_emb, emb, (size_t)V * D, e));
    RL_TRY(up_i32(c, d_tok, tok, (size_t)N, e));
    RL_TRY(poison(c, d_out, (size_t)N * D, e));
    RL_TRY(rl_k_embed_fwd(d_out, d_emb, d_tok, N, D, c.s, e));
    return down_f32(c, out, d_out, (size_t)N * D, e);
}

extern "C" int rl_gpu_op_embed_bwd(float *demb, const float *dout, const int32_t *tok, int N, int V,
                                   int D, int accumulate, rl_err *e) {
    op_ctx c;
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * ((size_t)V + 1 + 3 * (size_t)N + 2));
    if (!h) return rl_errf(e, RL_ENOMEM, "gpu op: host staging");
    int32_t *cnt = h, *uniq = cnt + V + 1, *seg = uniq + N, *pos = seg + N + 1;
    pos[N] = rl_gpu_group_tokens(tok, N, V, cnt, uniq, seg, pos); // the count, after pos
    float *d_demb, *d_dout;
    int32_t *d_idx;
    int rc = op_begin(c, e);
    if (!rc) rc = op_alloc(c, &d_demb, (size_t)V * D, e);
    if (!rc) rc = op_alloc(c, &d_dout, (size_t)N * D, e);
    if (!rc) rc = op_alloc(c, &d_idx, 3 * (size_t)N + 2, e);
    if (!rc) rc = up_f32(c, d_demb, demb, (size_t)V * D, e);
    if (!rc) rc = up_f32(c, d_dout, dout, (size_t)N * D, e);
    // uniq, seg, pos and the count are contiguous; the grid has a block per
    // possible id, as the model's
    if (!rc) rc = up_i32(c, d_idx, uniq, 3 * (size_t)N + 2, e);
    free(h);
    RL_TRY(rc);
    RL_TRY(rl_k_embed_bwd(d_demb, d_dout, d_idx, d_idx + N, d_idx + 2 * N + 1, d_idx + 3 * N + 1,
                          N < V ? N : V, D, accumulate, c.s, e));
    return down_f32(c, demb, d_demb, (size_t)V * D, e);
}

extern "C" int rl_gpu_op_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N,
                                     int D, float eps, rl_err *e) {
    op_ctx c;
    float *d_x, *d_rstd;
    bf16 *d_out, *d_w;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_x, (size_t)N * D, e));
    RL_TRY(op_alloc(c, &d_w, (size_t)D, e));
    RL_TRY(op_alloc(c, &d_rstd, (size_t)N, e));
    RL_TRY(op_alloc(c, &d_out, (size_t)N * D, e));
    RL_TRY(up_f32(c, d_x, x, (size_t)N * D, e));
    RL_TRY(up_bf16(c, d_w, w, (size_t)D, e));
    RL_TRY(poison(c, d_out, (size_t)N * D, e));
    RL_TRY(poison(c, d_rstd, (size_t)N, e));
    RL_TRY(rl_k_rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, D, eps, c.s, e));
    RL_TRY(down_bf16(c, out, d_out, (size_t)N * D, e));
    return down_f32(c, rstd, d_rstd, (size_t)N, e);
}

extern "C" int rl_gpu_op_rmsnorm_bwd(float *dx, float *dx16, float *dw, float *y,
                                     const float *dout, const float *x, const float *w,
                                     const float *rstd, int N, int D, int accumulate,
                                     int accumulate_dw, rl_err *e) {
    op_ctx c;
    float *d_dx, *d_dw, *d_x, *d_rstd, *d_part;
    bf16 *d_dx16, *d_dout, *d_w, *d_y = NULL;
    size_t nd = (size_t)N * D;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_dx, nd, e));
    RL_TRY(op_alloc(c, &d_dx16, nd, e));
    if (y) {
        RL_TRY(op_alloc(c, &d_y, nd, e));
        RL_TRY(poison(c, d_y, nd, e));
    }
    RL_TRY(op_alloc(c, &d_dw, (size_t)D, e));
    RL_TRY(op_alloc(c, &d_dout, nd, e));
    RL_TRY(op_alloc(c, &d_x, nd, e));
    RL_TRY(op_alloc(c, &d_w, (size_t)D, e));
    RL_TRY(op_alloc(c, &d_rstd, (size_t)N, e));
    RL_TRY(op_alloc(c, &d_part, rl_k_rmsnorm_partial_floats(N, D), e));
    if (accumulate)
        RL_TRY(up_f32(c, d_dx, dx, nd, e));
    else
        RL_TRY(poison(c, d_dx, nd, e));
    RL_TRY(poison(c, d_dx16, nd, e));
    RL_TRY(poison(c, d_part, rl_k_rmsnorm_partial_floats(N, D), e));
    if (accumulate_dw)
        RL_TRY(up_f32(c, d_dw, dw, (size_t)D, e));
    else
        RL_TRY(poison(c, d_dw, (size_t)D, e));
    RL_TRY(up_bf16(c, d_dout, dout, nd, e));
    RL_TRY(up_f32(c, d_x, x, nd, e));
    RL_TRY(up_bf16(c, d_w, w, (size_t)D, e));
    RL_TRY(up_f32(c, d_rstd, rstd, (size_t)N, e));
    RL_TRY(rl_k_rmsnorm_bwd(d_dx, d_dx16, d_y, d_dw, d_part, d_dout, d_x, d_w, d_rstd, N, D,
                            accumulate, accumulate_dw, c.s, e));
    if (y) RL_TRY(down_bf16(c, y, d_y, nd, e));
    RL_TRY(down_f32(c, dx, d_dx, nd, e));
    RL_TRY(down_bf16(c, dx16, d_dx16, nd, e));
    return down_f32(c, dw, d_dw, (size_t)D, e);
}

// The model's RoPE table for cfg on the device ([P, hd/2] cos, then sin)
static int rope_table(op_ctx &c, float **d_tab, const rl_model_config *cfg, int T, rl_err *e) {
    int hd = rl_model_head_dim(cfg), P = cfg->max_position_embeddings;
    if (T > P) return rl_errf(e, RL_EINPUT, "rope: T %d above max_position_embeddings %d", T, P);
    size_t nt = (size_t)P * hd;
    float *tab = (float *)malloc(nt * sizeof(float));
    if (!tab) return rl_errf(e, RL_ENOMEM, "gpu op: rope table");
    rl_cpu_rope_table_f32(cfg, tab);
    int rc = op_alloc(c, d_tab, nt, e);
    if (!rc) rc = up_f32(c, *d_tab, tab, nt, e);
    free(tab);
    return rc;
}

extern "C" int rl_gpu_op_rope(float *x, const rl_model_config *cfg, int B, int T, int nh,
                              int inverse, rl_err *e) {
    op_ctx c;
    int hd = rl_model_head_dim(cfg);
    size_t n = (size_t)B * T * nh * hd;
    bf16 *d_x;
    float *d_tab;
    RL_TRY(op_begin(c, e));
    RL_TRY(rope_table(c, &d_tab, cfg, T, e));
    RL_TRY(op_alloc(c, &d_x, n, e));
    RL_TRY(up_bf16(c, d_x, x, n, e));
    RL_TRY(rl_k_rope(d_x, d_tab, B * T, T, nh, hd, nh * hd, cfg->max_position_embeddings, inverse,
                     c.s, e));
    return down_bf16(c, x, d_x, n, e);
}

// q [N, H hd], k, v [N, KV hd] -> the fused row layout [N, (H + 2 KV) hd]
static void pack_qkv(float *qkv, const float *q, const float *k, const float *v, int N, int qd,
                     int kvd) {
    size_t C3 = (size_t)qd + 2 * (size_t)kvd;
    for (int n = 0; n < N; n++) {
        memcpy(qkv + n * C3, q + (size_t)n * qd, sizeof(float) * qd);
        memcpy(qkv + n * C3 + qd, k + (size_t)n * kvd, sizeof(float) * kvd);
        memcpy(qkv + n * C3 + qd + kvd, v + (size_t)n * kvd, sizeof(float) * kvd);
    }
}

// The forward through our kernels (cudnn NULL) or the cuDNN backend,
// leaving its inputs and outputs on the device for the backward; *d_tab:
// rope's table, or NULL without rope.
static int attn_common(op_ctx &c, rl_cudnn_attn *cudnn, bf16 **d_qkv, bf16 **d_out, float **d_lse,
                       float **d_tab, const float *q, const float *k, const float *v,
                       const rl_model_config *rope, int B, int T, int H, int KV, int hd,
                       rl_err *e) {
    int N = B * T, qd = H * hd, kvd = KV * hd;
    size_t C3 = (size_t)qd + 2 * (size_t)kvd;
    *d_tab = NULL;
    if (rope && rl_model_head_dim(rope) != hd)
        return rl_errf(e, RL_EINPUT, "gpu op: attention head_dim %d, the RoPE config's %d", hd,
                       rl_model_head_dim(rope));
    if (rope) RL_TRY(rope_table(c, d_tab, rope, T, e));
    float *h = (float *)malloc(sizeof(float) * (size_t)N * C3);
    if (!h) return rl_errf(e, RL_ENOMEM, "gpu op: host staging");
    pack_qkv(h, q, k, v, N, qd, kvd);
    int rc = op_alloc(c, d_qkv, (size_t)N * C3, e);
    if (!rc) rc = up_bf16(c, *d_qkv, h, (size_t)N * C3, e);
    free(h);
    RL_TRY(rc);
    RL_TRY(op_alloc(c, d_out, (size_t)N * qd, e));
    RL_TRY(op_alloc(c, d_lse, (size_t)N * H, e));
    RL_TRY(poison(c, *d_out, (size_t)N * qd, e));
    RL_TRY(poison(c, *d_lse, (size_t)N * H, e));
    if (rope) // as the model does it: q and k rotated in place before attention
        RL_TRY(rl_k_rope(*d_qkv, *d_tab, N, T, H + KV, hd, (int)C3, rope->max_position_embeddings,
                         0, c.s, e));
    if (cudnn) return rl_k_attn_cudnn_fwd(cudnn, *d_out, *d_lse, *d_qkv, B, T, c.s, e);
    return rl_k_attn_fwd(*d_out, *d_lse, *d_qkv, B, T, H, KV, hd, c.s, e);
}

extern "C" int rl_gpu_op_attn_fwd(float *out, const float *q, const float *k, const float *v,
                                  const rl_model_config *rope, int B, int T, int H, int KV, int hd,
                                  rl_err *e) {
    op_ctx c;
    bf16 *d_qkv, *d_out;
    float *d_lse, *d_tab;
    RL_TRY(op_begin(c, e));
    RL_TRY(attn_common(c, NULL, &d_qkv, &d_out, &d_lse, &d_tab, q, k, v, rope, B, T, H, KV, hd, e));
    return down_bf16(c, out, d_out, (size_t)B * T * H * hd, e);
}

// The backward after attn_common's forward, on the same backend, into dq,
// dk, dv on the host (with rope: with respect to the un-rotated q, k).
static int attn_grads(op_ctx &c, rl_cudnn_attn *cudnn, float *dq, float *dk, float *dv,
                      const float *dout, const bf16 *d_qkv, const bf16 *d_out, const float *d_lse,
                      const float *d_tab, const rl_model_config *rope, int B, int T, int H, int KV,
                      int hd, int dq_atomic, rl_err *e) {
    bf16 *d_dout, *d_dqkv;
    float *d_dsum, *d_acc = NULL;
    int N = B * T, qd = H * hd, kvd = KV * hd;
    size_t C3 = (size_t)qd + 2 * (size_t)kvd;
    RL_TRY(op_alloc(c, &d_dout, (size_t)N * qd, e));
    RL_TRY(op_alloc(c, &d_dqkv, (size_t)N * C3, e));
    RL_TRY(op_alloc(c, &d_dsum, (size_t)N * H, e));
    RL_TRY(up_bf16(c, d_dout, dout, (size_t)N * qd, e));
    RL_TRY(poison(c, d_dqkv, (size_t)N * C3, e));
    RL_TRY(poison(c, d_dsum, (size_t)N * H, e));
    if (dq_atomic) { // poisoned: the backward must zero it itself
        RL_TRY(op_alloc(c, &d_acc, (size_t)N * qd, e));
        RL_TRY(poison(c, d_acc, (size_t)N * qd, e));
    }
    if (cudnn)
        RL_TRY(rl_k_attn_cudnn_bwd(cudnn, d_dqkv, d_dsum, d_dout, d_qkv, d_out, d_lse, B, T, c.s,
                                   e));
    else
        RL_TRY(rl_k_attn_bwd(d_dqkv, d_dsum, d_acc, d_dout, d_qkv, d_out, d_lse, B, T, H, KV, hd,
                             NULL, 0, c.s, e));
    if (rope) // dq, dk back to the un-rotated q, k
        RL_TRY(rl_k_rope(d_dqkv, d_tab, N, T, H + KV, hd, (int)C3, rope->max_position_embeddings,
                         1, c.s, e));
    float *h = (float *)malloc(sizeof(float) * (size_t)N * C3);
    if (!h) return rl_errf(e, RL_ENOMEM, "gpu op: host staging");
    int rc = down_bf16(c, h, d_dqkv, (size_t)N * C3, e);
    if (!rc)
        for (int n = 0; n < N; n++) {
            memcpy(dq + (size_t)n * qd, h + n * C3, sizeof(float) * qd);
            memcpy(dk + (size_t)n * kvd, h + n * C3 + qd, sizeof(float) * kvd);
            memcpy(dv + (size_t)n * kvd, h + n * C3 + qd + kvd, sizeof(float) * kvd);
        }
    free(h);
    return rc;
}

extern "C" int rl_gpu_op_attn_bwd(float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const rl_model_config *rope, int B, int T, int H, int KV, int hd,
                                  int dq_atomic, rl_err *e) {
    op_ctx c;
    bf16 *d_qkv, *d_out;
    float *d_lse, *d_tab;
    RL_TRY(op_begin(c, e));
    RL_TRY(attn_common(c, NULL, &d_qkv, &d_out, &d_lse, &d_tab, q, k, v, rope, B, T, H, KV, hd, e));
    return attn_grads(c, NULL, dq, dk, dv, dout, d_qkv, d_out, d_lse, d_tab, rope, B, T, H, KV, hd,
                      dq_atomic, e);
}

extern "C" int rl_gpu_op_swiglu_fwd(float *h, const float *gu, int N, int F, rl_err *e) {
    op_ctx c;
    bf16 *d_h, *d_gu;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_h, (size_t)N * F, e));
    RL_TRY(op_alloc(c, &d_gu, (size_t)N * 2 * F, e));
    RL_TRY(up_bf16(c, d_gu, gu, (size_t)N * 2 * F, e));
    RL_TRY(poison(c, d_h, (size_t)N * F, e));
    RL_TRY(rl_k_swiglu_fwd(d_h, d_gu, N, F, c.s, e));
    return down_bf16(c, h, d_h, (size_t)N * F, e);
}

extern "C" int rl_gpu_op_swiglu_bwd(float *dgu, float *h, const float *dh, const float *gu, int N,
                                    int F, rl_err *e) {
    op_ctx c;
    bf16 *d_dgu, *d_dh, *d_gu, *d_h = NULL;
    RL_TRY(op_begin(c, e));
    if (h) {
        RL_TRY(op_alloc(c, &d_h, (size_t)N * F, e));
        RL_TRY(poison(c, d_h, (size_t)N * F, e));
    }
    RL_TRY(op_alloc(c, &d_dgu, (size_t)N * 2 * F, e));
    RL_TRY(op_alloc(c, &d_dh, (size_t)N * F, e));
    RL_TRY(op_alloc(c, &d_gu, (size_t)N * 2 * F, e));
    RL_TRY(up_bf16(c, d_dh, dh, (size_t)N * F, e));
    RL_TRY(up_bf16(c, d_gu, gu, (size_t)N * 2 * F, e));
    RL_TRY(poison(c, d_dgu, (size_t)N * 2 * F, e));
    RL_TRY(rl_k_swiglu_bwd(d_dgu, d_h, d_dh, d_gu, N, F, c.s, e));
    if (h) RL_TRY(down_bf16(c, h, d_h, (size_t)N * F, e));
    return down_bf16(c, dgu, d_dgu, (size_t)N * 2 * F, e);
}

extern "C" int rl_gpu_op_xent(float *losses, float *lse, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, int ld, float scale,
                              rl_err *e) {
    op_ctx c;
    bf16 *d_l;
    float *d_loss, *d_lse = nullptr;
    int32_t *d_t;
    size_t nl = (size_t)N * ld;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_l, nl, e));
    RL_TRY(op_alloc(c, &d_loss, (size_t)N, e));
    RL_TRY(op_alloc(c, &d_t, (size_t)N, e));
    RL_TRY(up_bf16(c, d_l, logits, nl, e));
    RL_TRY(up_i32(c, d_t, targets, (size_t)N, e));
    RL_TRY(poison(c, d_loss, (size_t)N, e));
    if (lse) {
        RL_TRY(op_alloc(c, &d_lse, (size_t)N, e));
        RL_TRY(poison(c, d_lse, (size_t)N, e));
    }
    RL_TRY(rl_k_xent(d_l, d_loss, d_lse, d_t, N, V, ld, scale, dlogits != NULL, c.s, e));
    if (lse) RL_TRY(down_f32(c, lse, d_lse, (size_t)N, e));
    if (dlogits) RL_TRY(down_bf16(c, dlogits, d_l, nl, e));
    return down_f32(c, losses, d_loss, (size_t)N, e);
}

extern "C" int rl_gpu_op_loss_accum(float *acc, const float *losses, int n, float weight, int reset,
                                    rl_err *e) {
    op_ctx c;
    float *d_acc, *d_loss;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_acc, 1, e));
    RL_TRY(op_alloc(c, &d_loss, (size_t)n, e));
    RL_TRY(up_f32(c, d_loss, losses, (size_t)n, e));
    if (reset)
        RL_TRY(poison(c, d_acc, 1, e));
    else
        RL_TRY(up_f32(c, d_acc, acc, 1, e));
    RL_TRY(rl_k_loss_accum(d_acc, d_loss, n, weight, reset, c.s, e));
    return down_f32(c, acc, d_acc, 1, e);
}

extern "C" int rl_gpu_op_gemm(int kind, float *out, int out_f32, const float *a, const float *b,
                              const float *res, int M, int N, int K, rl_err *e) {
    op_ctx c;
    unsigned char *ws;
    bf16 *d_a, *d_b;
    float *d_res = nullptr;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &ws, RL_GEMM_WORKSPACE, e));
    c.gemm_live = true;
    RL_TRY(rl_gemm_init(&c.gemm, ws, RL_GEMM_WORKSPACE, e));
    rl_gemm &g = c.gemm;
    size_t na, nb, no;
    if (kind == RL_GPU_GEMM_FWD)
        na = (size_t)M * K, nb = (size_t)N * K, no = (size_t)M * N;
    else if (kind == RL_GPU_GEMM_BWD_DATA)
        na = (size_t)M * N, nb = (size_t)N * K, no = (size_t)M * K;
    else if (kind == RL_GPU_GEMM_BWD_W || kind == RL_GPU_GEMM_BWD_W_SET)
        na = (size_t)M * N, nb = (size_t)M * K, no = (size_t)N * K, out_f32 = 1;
    else
        return rl_errf(e, RL_EINTERNAL, "gpu op: gemm kind %d", kind);
    RL_TRY(op_alloc(c, &d_a, na, e));
    RL_TRY(op_alloc(c, &d_b, nb, e));
    RL_TRY(up_bf16(c, d_a, a, na, e));
    RL_TRY(up_bf16(c, d_b, b, nb, e));
    float *d_o32 = nullptr;
    bf16 *d_o16 = nullptr;
    if (out_f32)
        RL_TRY(op_alloc(c, &d_o32, no, e));
    else
        RL_TRY(op_alloc(c, &d_o16, no, e));
    if (kind == RL_GPU_GEMM_BWD_W)
        RL_TRY(up_f32(c, d_o32, out, no, e));
    else if (out_f32)
        RL_TRY(poison(c, d_o32, no, e));
    else
        RL_TRY(poison(c, d_o16, no, e));
    if (res && kind == RL_GPU_GEMM_FWD && out_f32) {
        RL_TRY(op_alloc(c, &d_res, no, e));
        RL_TRY(up_f32(c, d_res, res, no, e));
    }
    void *d_out = out_f32 ? (void *)d_o32 : (void *)d_o16;
    if (kind == RL_GPU_GEMM_FWD)
        RL_TRY(rl_gemm_fwd(&g, d_out, out_f32, d_a, d_b, d_res, M, N, K, c.s, e));
    else if (kind == RL_GPU_GEMM_BWD_DATA)
        RL_TRY(rl_gemm_bwd_data(&g, d_out, out_f32, d_a, d_b, M, N, K, c.s, e));
    else
        RL_TRY(rl_gemm_bwd_weight(&g, d_o32, d_a, d_b, M, N, K, kind == RL_GPU_GEMM_BWD_W, c.s, e));
    return out_f32 ? down_f32(c, out, d_o32, no, e) : down_bf16(c, out, d_o16, no, e);
}

extern "C" int rl_gpu_op_sumsq_norm(float *norm, const float *g, size_t n, rl_err *e) {
    op_ctx c;
    float *d_g, *d_part, *d_out;
    RL_TRY(op_begin(c, e));
    RL_TRY(op_alloc(c, &d_g, n, e));
    RL_TRY(op_alloc(c, &d_part, RL_K_NORM_BLOCKS, e));
    RL_TRY(op_alloc(c, &d_out, 1, e));
    RL_TRY(up_f32(c, d_g, g, n, e));
    RL_TRY(poison(c, d_out, 1, e));
    RL_TRY(rl_k_norm(d_out, d_part, d_g, n, c.s, e));
    return down_f32(c, norm, d_out, 1, e);
}

// The cuDNN backend (gpu_attn_cudnn.cu) on host arrays: forward, then with
// dout the backward, RoPE around them as for our kernels. Poisoned
// outputs, as the other attention ops.
extern "C" int rl_gpu_op_attn_cudnn(float *out, float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const rl_model_config *rope, int B, int T, int H, int KV,
                                    int hd, int deterministic, rl_err *e) {
    op_ctx c;
    bf16 *d_qkv, *d_out;
    float *d_lse, *d_tab;
    rl_cudnn_attn *a = NULL;
    RL_TRY(op_begin(c, e));
    int rc = rl_cudnn_attn_create(&a, B, T, H, KV, hd, deterministic, c.s, e);
    if (!rc)
        rc = attn_common(c, a, &d_qkv, &d_out, &d_lse, &d_tab, q, k, v, rope, B, T, H, KV, hd, e);
    if (!rc) rc = down_bf16(c, out, d_out, (size_t)B * T * H * hd, e);
    if (!rc && dout)
        rc = attn_grads(c, a, dq, dk, dv, dout, d_qkv, d_out, d_lse, d_tab, rope, B, T, H, KV, hd,
                        0, e);
    rl_cudnn_attn_free(a);
    return rc;
}
