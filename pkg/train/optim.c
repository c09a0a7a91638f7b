/* AdamW, the learning-rate schedule and gradient clipping: small pure
 * functions, each checked against hand-computed values in the tests. */
#include <math.h>

#include "train.h"

double rl_lr_at(const rl_train_config *t, long long step) {
    if (step < t->warmup_steps) return t->lr * (double)(step + 1) / (double)t->warmup_steps;
    if (step >= t->steps) return t->min_lr;
    long long span = t->steps - t->warmup_steps;
    double ratio = span > 0 ? (double)(step - t->warmup_steps) / (double)span : 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return t->min_lr + coeff * (t->lr - t->min_lr);
}

/* The chunk count is fixed (not the thread count), and the partial sums are
 * added in chunk order: the same bits on 1 thread or 64. */
#define NORM_CHUNKS 64
double rl_grad_sq(const float *g, size_t n) {
    double part[NORM_CHUNKS];
    size_t per = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < NORM_CHUNKS; c++) {
        size_t lo = (size_t)c * per, hi = lo + per < n ? lo + per : n;
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += (double)g[i] * g[i];
        part[c] = s;
    }
    double total = 0;
    for (int c = 0; c < NORM_CHUNKS; c++) total += part[c];
    return total;
}

double rl_grad_norm(const float *g, size_t n) { return sqrt(rl_grad_sq(g, n)); }

double rl_clip_factor(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0;
    double f = max_norm / (norm + 1e-6);
    return f < 1.0 ? f : 1.0;
}

/* Cloned for AVX2 and AVX-512 (picked at load; the same rounding: no FMA
 * contraction in C11 mode, and vector sqrt and div are exact as scalar
 * ones); optim.o is built with -fno-math-errno so sqrtf vectorizes. */
__attribute__((target_clones("default", "avx2", "avx512f")))
void rl_adamw_update(float *p, const float *g, float *m, float *v, size_t n, double lr,
                     double beta1, double beta2, double eps, double wd, long long t,
                     double grad_scale) {
    double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    /* 1 - beta in double, then rounded: 1.0f - 0.999f is 1.00005e-3, a
     * 5e-5 relative error in every second-moment update (PyTorch also
     * rounds the double 1 - beta2). */
    float b1 = (float)beta1, b2 = (float)beta2, gs = (float)grad_scale;
    float c1 = (float)(1.0 - beta1), c2 = (float)(1.0 - beta2);
    float step = (float)(lr / bc1), decay = (float)(1.0 - lr * wd);
    float sbc2 = (float)sqrt(bc2), feps = (float)eps;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi, v[i] = vi;
        /* PyTorch's order: decay first, then p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) */
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) / sbc2 + feps);
    }
}
