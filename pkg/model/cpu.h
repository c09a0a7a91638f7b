/* Internal to pkg/model (and its tests): the CPU compute, generated twice
 * from cpu_impl.inc -- once in float (the trainer) and once in double (the
 * gradient checks, so finite differences are exact enough to test the very
 * same code at a tolerance of 1e-6 rather than guessing an fp32 one). */
#ifndef RL_MODEL_CPU_H
#define RL_MODEL_CPU_H

#include "model.h"

/* Activation layout (element offsets), for a given B x T. */
typedef struct rl_act_layout {
    size_t res;      /* (L+1) x [BT, D] residual stream entering each layer + final */
    size_t res_mid;  /* L x [BT, D] after attention */
    size_t ln1, rstd1, q, k, v, att, atty, ln2, rstd2, gate, up, hmlp; /* per layer bases */
    size_t lnf, rstdf, logits, losses;
    size_t total;
    /* per-layer strides */
    size_t s_btd, s_bt, s_btkv, s_att, s_btf;
} rl_act_layout;

typedef struct rl_scratch_layout {
    size_t dres, dtmp, dq, dk, dv, dgate, dup, dh, datt;
    size_t total;
} rl_scratch_layout;

void rl_act_layout_init(rl_act_layout *a, const rl_model_config *c, int B, int T);
void rl_scratch_layout_init(rl_scratch_layout *s, const rl_model_config *c, int B, int T);

/* Time and work spent in GEMM by each instantiation (for benchmarks; the
 * trainer is single-threaded at this level, so plain doubles suffice). */
extern double rl_cpu_gemm_seconds_f32, rl_cpu_gemm_flops_f32, rl_cpu_attn_seconds_f32;
extern double rl_cpu_gemm_seconds_f64, rl_cpu_gemm_flops_f64, rl_cpu_attn_seconds_f64;

#define RL_CPU_DECLARE(R, S)                                                                   \
    void rl_cpu_rope_table_##S(const rl_model_config *c, R *rope);                             \
    void rl_cpu_matmul_fwd_##S(R *out, const R *in, const R *w, int M, int N, int K);          \
    void rl_cpu_matmul_bwd_##S(R *din, R *dw, const R *dout, const R *in, const R *w, int M,   \
                               int N, int K, R din_beta, R dw_beta);                           \
    void rl_cpu_rmsnorm_fwd_##S(R *out, R *rstd, const R *x, const R *w, int N, int D,         \
                                double eps);                                                   \
    void rl_cpu_rmsnorm_bwd_##S(R *dx, R *dw, const R *dout, const R *x, const R *w,           \
                                const R *rstd, int N, int D, R dw_beta);                       \
    void rl_cpu_rope_fwd_##S(R *x, const R *rope, int B, int T, int nh, int hd, int max_pos);  \
    void rl_cpu_rope_bwd_##S(R *dx, const R *rope, int B, int T, int nh, int hd, int max_pos); \
    void rl_cpu_attn_fwd_##S(R *out, R *att, const R *q, const R *k, const R *v, int B, int T, \
                             int H, int KV, int hd);                                           \
    void rl_cpu_attn_bwd_##S(R *dq, R *dk, R *dv, R *scratch, const R *dout, const R *att,     \
                             const R *q, const R *k, const R *v, int B, int T, int H, int KV,  \
                             int hd);                                                          \
    void rl_cpu_swiglu_fwd_##S(R *h, const R *gate, const R *up, size_t n);                    \
    void rl_cpu_swiglu_bwd_##S(R *dgate, R *dup, const R *dh, const R *gate, const R *up,      \
                               size_t n);                                                      \
    double rl_cpu_xent_fwd_##S(R *losses, const R *logits, const int32_t *targets, int N, int V);         \
    void rl_cpu_xent_bwd_##S(R *dlogits, const int32_t *targets, int N, int V, R scale);       \
    double rl_cpu_forward_##S(const rl_model_config *c, const rl_param_layout *p,              \
                              const R *params, R *acts, const R *rope, const int32_t *tokens,  \
                              const int32_t *targets, int B, int T);                           \
    void rl_cpu_backward_##S(const rl_model_config *c, const rl_param_layout *p,               \
                             const R *params, R *grads, R *acts, R *scratch, const R *rope,    \
                             const int32_t *tokens, const int32_t *targets, int B, int T,      \
                             R loss_scale, bool overwrite, rl_grad_ready_fn hook,              \
                             void *hook_ctx);

RL_CPU_DECLARE(float, f32)
RL_CPU_DECLARE(double, f64)

/* The float model's GEMM (sgemm.c): cblas_sgemm's row-major contract, on the
 * calling thread only; our AVX-512 kernel where the CPU has it, else
 * OpenBLAS. rl_cpu_sgemm_kernels names ours when it runs, else NULL. */
#include <cblas.h>
void rl_cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
const char *rl_cpu_sgemm_kernels(void);

#endif
