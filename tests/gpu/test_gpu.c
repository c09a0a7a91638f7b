/* make test-gpu: every GPU kernel against the CPU reference of pkg/model,
 * then whole training steps of the GPU model against the CPU fp32 model.
 *
 * Without a visible GPU it prints one line and exits 0 (nothing counted).
 * Otherwise each check prints one line, and the last line is
 * "test-gpu: N passed, M failed" (exit 1 if M > 0).
 *
 *   build/tests/gpu_test [substring]   run only the checks whose name contains it
 *   RL_TEST_SEED=n                     repeat a run's random inputs (printed at start)
 *
 * How kernels are compared. Inputs are drawn fresh for every check and
 * rounded to bf16 on the host wherever the kernel reads bf16, so the CPU
 * reference (the double instantiation of pkg/model's code) sees exactly the
 * values the GPU sees; the difference is then the GPU's own arithmetic and
 * output rounding. The metric is the relative L2 error ||gpu - ref|| / ||ref||
 * over the whole output (METHOD.md's measure); any NaN fails (the op
 * wrappers poison every output with NaN before the kernel runs, so an
 * unwritten element fails too). Tolerances, and why:
 *   - fp32 outputs of fp32 arithmetic (rstd, fp32 GEMM outputs, norm
 *     backward, losses, grad norm): rounding ~1e-7 per op, growing slowly
 *     with reduction length; 1e-5 (1e-4 where a difference cancels).
 *   - bf16 outputs of fp32 arithmetic (norm, RoPE, SwiGLU, bf16 GEMMs,
 *     dlogits): bf16 keeps 8 significant bits, so round-to-nearest is off by
 *     at most 2^-8 = 3.9e-3 relative per element (~1.7e-3 RMS, as measured),
 *     which bounds the relative L2 error of the whole output too; 4e-3.
 *   - attention forward: additionally the probabilities are rounded to bf16
 *     before P.V (2^-8 per term, random signs); ~2e-3 measured in the
 *     emulator (make test-gpu-emu); 1e-2.
 *   - attention backward: dS = P (dP - D) cancels when dP ~ D, and dS, P
 *     and O (inside D) are bf16-rounded before their products; 2e-2.
 * Whole model (the bar): loss within 1% of the CPU fp32 model and a
 * cosine similarity above 0.999 between GPU and CPU gradients per tensor. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/gpu.h"
#include "kernels/gpu_layout.h"
#include "kernels/llama_gpu.h"
#include "model/cpu.h"
#include "model/model.h"
#include "train/train.h"
#include "tests/gpu/check.h"

static int n_pass, n_fail;
static const char *filter;
static uint64_t seed_base, check_seed;
static rl_rng rng;

/* A fresh stream of random numbers for each check, from the run's seed and
 * the check's name: a run repeated with RL_TEST_SEED and a name filter sees
 * the same inputs as the full run did. */
void reseed(const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    check_seed = seed_base * 1000003ull ^ h;
    rl_rng_seed(&rng, check_seed);
}

int selected(const char *name) { return !filter || strstr(name, filter); }

void report(const char *name, int ok, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%-4s %-44s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

void fail_err(const char *name, const rl_err *e) { report(name, 0, "error: %s", e->msg); }

/* ---- data ------------------------------------------------------------------ */
static float *randn(size_t n, double std) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(rl_rng_normal(&rng) * std);
    return x;
}
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rl_gpu_bf16_round(x[i]);
}
static float *randn_bf16(size_t n, double std) {
    float *x = randn(n, std);
    round_bf16(x, n);
    return x;
}
static double *to_d(const float *x, size_t n) {
    double *d = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static int32_t *rand_tokens(int n, int V) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rl_rng_u64(&rng) % (uint64_t)V);
    return t;
}

/* ||got - ref|| / ||ref|| (0/0 = 0); nan counts non-finite values of got. */
typedef struct {
    double rel, max_abs;
    size_t nan;
} cmp_t;
static cmp_t compare(const float *got, const double *ref, size_t n) {
    cmp_t c = {0, 0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            c.nan++;
            continue;
        }
        double d = got[i] - ref[i];
        num += d * d, den += ref[i] * ref[i];
        if (fabs(d) > c.max_abs) c.max_abs = fabs(d);
    }
    c.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return c;
}
static int check_cmp(const char *name, const float *got, const double *ref, size_t n, double tol) {
    cmp_t c = compare(got, ref, n);
    int ok = c.nan == 0 && c.rel <= tol;
    report(name, ok, "rel %.2e (tol %.0e) max|d| %.2e%s", c.rel, tol, c.max_abs,
           c.nan ? " NON-FINITE VALUES" : "");
    return ok;
}

/* ---- kernels ----------------------------------------------------------------- */
static void test_embed(void) {
    int N = 129, V = 13, D = 60; /* few ids: many repeats */
    char name[64];
    snprintf(name, sizeof name, "embed fwd N=%d V=%d D=%d", N, V, D);
    if (selected(name)) {
        reseed(name);
        rl_err e = {0};
        float *emb = randn_bf16((size_t)V * D, 1), *out = malloc(sizeof(float) * N * D);
        int32_t *tok = rand_tokens(N, V);
        if (rl_gpu_op_embed_fwd(out, emb, tok, N, V, D, &e))
            fail_err(name, &e);
        else {
            size_t bad = 0;
            for (int i = 0; i < N; i++)
                bad +=
                    memcmp(out + (size_t)i * D, emb + (size_t)tok[i] * D, sizeof(float) * D) != 0;
            report(name, bad == 0, "%zu rows differ (exact copy expected)", bad);
        }
        free(emb), free(out), free(tok);
    }
    for (int acc = 0; acc < 2; acc++) {
        snprintf(name, sizeof name, "embed bwd N=%d V=%d D=%d%s", N, V, D,
                 acc ? " accumulate" : "");
        if (!selected(name)) continue;
        reseed(name);
        rl_err e = {0};
        float *demb = randn((size_t)V * D, 1), *dout = randn((size_t)N * D, 1);
        int32_t *tok = rand_tokens(N, V);
        double *ref = to_d(demb, (size_t)V * D);
        /* without accumulate the batch's rows are written, not read: NaN
         * there must not show; the other rows stay as they are */
        for (int i = 0; !acc && i < N; i++)
            for (int j = 0; j < D; j++)
                demb[(size_t)tok[i] * D + j] = NAN, ref[(size_t)tok[i] * D + j] = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < D; j++) ref[(size_t)tok[i] * D + j] += dout[(size_t)i * D + j];
        if (rl_gpu_op_embed_bwd(demb, dout, tok, N, V, D, acc, &e))
            fail_err(name, &e);
        else
            check_cmp(name, demb, ref, (size_t)V * D, 1e-6);
        free(demb), free(dout), free(tok), free(ref);
    }
}

static void test_rmsnorm(void) {
    static const int shapes[][2] = {{1, 60}, {7, 96}, {129, 770}, {300, 2048}, {33, 13000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], D = shapes[si][1];
        size_t nd = (size_t)N * D;
        char name[64];
        snprintf(name, sizeof name, "rmsnorm fwd N=%d D=%d", N, D);
        if (selected(name)) {
            reseed(name);
            rl_err e = {0};
            float *x = randn(nd, 2), *w = randn((size_t)D, 0.2), *out = malloc(nd * sizeof(float));
            float *rstd = malloc(N * sizeof(float));
            for (int j = 0; j < D; j++) w[j] = rl_gpu_bf16_round(w[j] + 1.0f); /* the bf16 copy's */
            double *xd = to_d(x, nd), *wd = to_d(w, D), *ro = malloc(nd * sizeof(double)),
                   *rr = malloc(N * sizeof(double));
            rl_cpu_rmsnorm_fwd_f64(ro, rr, xd, wd, N, D, 1e-5);
            if (rl_gpu_op_rmsnorm_fwd(out, rstd, x, w, N, D, 1e-5f, &e))
                fail_err(name, &e);
            else if (check_cmp(name, out, ro, nd, 4e-3))
                check_cmp("  rstd", rstd, rr, (size_t)N, 1e-5);
            free(x), free(w), free(out), free(rstd), free(xd), free(wd), free(ro), free(rr);
        }
        /* dx accumulated and dw written, then the other way round: each flag
         * both ways, and a swap of the two would fail both */
        for (int acc = 0; acc < 2; acc++) {
            int acc_dw = !acc;
            snprintf(name, sizeof name, "rmsnorm bwd N=%d D=%d%s", N, D,
                     acc ? " accumulate dx" : " accumulate dw");
            if (!selected(name)) continue;
            reseed(name);
            rl_err e = {0};
            /* dout is bf16 on the device (the GEMM before writes it so) */
            float *x = randn(nd, 2), *w = randn((size_t)D, 0.2), *dout = randn_bf16(nd, 1);
            float *dx = randn(nd, 1), *dw = randn((size_t)D, 1), *dx16 = malloc(nd * sizeof(float));
            for (int j = 0; j < D; j++) w[j] = rl_gpu_bf16_round(w[j] + 1.0f);
            double *xd = to_d(x, nd), *wd = to_d(w, D), *gd = to_d(dout, nd);
            double *dxr = acc ? to_d(dx, nd) : calloc(nd, sizeof(double));
            double *dwr = acc_dw ? to_d(dw, D) : calloc(D, sizeof(double));
            double *rd = malloc(N * sizeof(double));
            /* the GPU forward's rstd, and its output: the backward rebuilds
             * that output (recompute) on the second round, bit for bit */
            float *rstd = malloc(N * sizeof(float)), *out = malloc(nd * sizeof(float)),
                  *y = acc ? malloc(nd * sizeof(float)) : NULL;
            if (rl_gpu_op_rmsnorm_fwd(out, rstd, x, w, N, D, 1e-5f, &e)) {
                fail_err(name, &e);
                goto rms_done;
            }
            for (int i = 0; i < N; i++) rd[i] = rstd[i];
            rl_cpu_rmsnorm_bwd_f64(dxr, dwr, gd, xd, wd, rd, N, D, 1);
            if (rl_gpu_op_rmsnorm_bwd(dx, dx16, dw, y, dout, x, w, rstd, N, D, acc, acc_dw, &e))
                fail_err(name, &e);
            else if (check_cmp(name, dx, dxr, nd, 1e-4) &&
                     check_cmp("  dx bf16 copy", dx16, dxr, nd, 4e-3) &&
                     check_cmp("  dw", dw, dwr, (size_t)D, 1e-4) && y)
                report("  the forward's output rebuilt, bit for bit",
                       !memcmp(y, out, nd * sizeof(float)), "%s",
                       memcmp(y, out, nd * sizeof(float)) ? "DIFFERS" : "same");
        rms_done:
            free(x), free(w), free(dout), free(dx), free(dw), free(dx16), free(xd), free(wd),
                free(gd);
            free(dxr), free(dwr), free(rd), free(rstd), free(out), free(y);
        }
    }
}

static void base_cfg(rl_model_config *c, int hidden, int heads, int kv, int max_pos) {
    rl_model_config_default(c);
    c->hidden_size = hidden, c->num_attention_heads = heads, c->num_key_value_heads = kv;
    c->max_position_embeddings = max_pos;
}

static void test_rope(void) {
    static const int shapes[][4] = {
        /* B, T, hidden, heads */ {2, 1, 96, 3}, {2, 7, 60, 3}, {1, 129, 128, 2}, {3, 33, 512, 4}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int B = shapes[si][0], T = shapes[si][1];
        rl_model_config c;
        base_cfg(&c, shapes[si][2], shapes[si][3], 1, 256);
        int hd = rl_model_head_dim(&c), nh = c.num_attention_heads + 1;
        size_t n = (size_t)B * T * nh * hd;
        double *tab = malloc(sizeof(double) * 256 * hd);
        rl_cpu_rope_table_f64(&c, tab);
        for (int inv = 0; inv < 2; inv++) {
            char name[64];
            snprintf(name, sizeof name, "rope %s B=%d T=%d heads=%d hd=%d", inv ? "bwd" : "fwd", B,
                     T, nh, hd);
            if (!selected(name)) continue;
            reseed(name);
            rl_err e = {0};
            float *x = randn_bf16(n, 1);
            double *ref = to_d(x, n);
            if (inv)
                rl_cpu_rope_bwd_f64(ref, tab, B, T, nh, hd, 256);
            else
                rl_cpu_rope_fwd_f64(ref, tab, B, T, nh, hd, 256);
            if (rl_gpu_op_rope(x, &c, B, T, nh, inv, &e))
                fail_err(name, &e);
            else
                check_cmp(name, x, ref, n, 4e-3);
            free(x), free(ref);
        }
        free(tab);
    }
}

static const int attn_shapes[][5] = {
    /* B, T, H, KV, hd */
    {1, 1, 3, 1, 32},  {2, 7, 3, 1, 20},    {1, 64, 2, 2, 64},  {1, 129, 4, 2, 64},
    {2, 65, 6, 3, 40}, {1, 200, 2, 1, 128}, {2, 130, 4, 1, 96}, {1, 300, 12, 3, 64},
};

/* One shape, forward or backward (bwd 2: dQ by atomics), RoPE inside the kernels or not. The
 * reference with RoPE: the CPU model's rotation of q and k, then attention;
 * for the backward its dq, dk rotated back (the chain rule through the
 * orthogonal rotation), which is what the kernels return. */
static void attn_case(const int *shape, int use_rope, int bwd) {
    int B = shape[0], T = shape[1], H = shape[2], KV = shape[3], hd = shape[4], P = T + 5;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    char name[96];
    snprintf(name, sizeof name, "attention %s B=%d T=%d H=%d KV=%d hd=%d%s",
             bwd == 2 ? "bwd dq-atomic" : bwd ? "bwd" : "fwd", B, T, H, KV, hd,
             use_rope ? " rope" : "");
    if (!selected(name)) return;
    reseed(name);
    rl_err e = {0};
    rl_model_config c; /* the table's rows beyond T: its sin half starts at P, not T */
    base_cfg(&c, H * hd, H, KV, P);
    const rl_model_config *rope = use_rope ? &c : NULL;
    double *tab = malloc(sizeof(double) * P * hd);
    rl_cpu_rope_table_f64(&c, tab);
    float *q = randn_bf16(nq, 1), *k = randn_bf16(nk, 1), *v = randn_bf16(nk, 1);
    double *qd = to_d(q, nq), *kd = to_d(k, nk), *vd = to_d(v, nk);
    if (rope) {
        rl_cpu_rope_fwd_f64(qd, tab, B, T, H, hd, P);
        rl_cpu_rope_fwd_f64(kd, tab, B, T, KV, hd, P);
    }
    double *outr = malloc(nq * sizeof(double));
    double *att = malloc((size_t)B * H * T * T * sizeof(double));
    rl_cpu_attn_fwd_f64(outr, att, qd, kd, vd, B, T, H, KV, hd);
    if (!bwd) {
        float *out = malloc(nq * sizeof(float));
        if (rl_gpu_op_attn_fwd(out, q, k, v, rope, B, T, H, KV, hd, &e))
            fail_err(name, &e);
        else
            check_cmp(name, out, outr, nq, 1e-2);
        free(out);
    } else {
        float *dout = randn_bf16(nq, 1);
        double *dod = to_d(dout, nq), *dqr = malloc(nq * sizeof(double));
        double *dkr = malloc(nk * sizeof(double)), *dvr = malloc(nk * sizeof(double));
        double *scr = malloc((size_t)B * KV * T * T * sizeof(double));
        rl_cpu_attn_bwd_f64(dqr, dkr, dvr, scr, dod, att, qd, kd, vd, B, T, H, KV, hd);
        if (rope) {
            rl_cpu_rope_bwd_f64(dqr, tab, B, T, H, hd, P);
            rl_cpu_rope_bwd_f64(dkr, tab, B, T, KV, hd, P);
        }
        float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)),
              *dv = malloc(nk * sizeof(float));
        if (rl_gpu_op_attn_bwd(dq, dk, dv, dout, q, k, v, rope, B, T, H, KV, hd, bwd == 2, &e))
            fail_err(name, &e);
        else if (check_cmp(name, dq, dqr, nq, 2e-2) && check_cmp("  dk", dk, dkr, nk, 2e-2))
            check_cmp("  dv", dv, dvr, nk, 2e-2);
        free(dout), free(dod), free(dqr), free(dkr), free(dvr), free(scr), free(dq), free(dk),
            free(dv);
    }
    free(tab), free(q), free(k), free(v), free(qd), free(kd), free(vd), free(outr), free(att);
}

static void test_attention(void) {
    for (size_t si = 0; si < sizeof attn_shapes / sizeof attn_shapes[0]; si++)
        for (int rope = 0; rope < 2; rope++)
            for (int bwd = 0; bwd < 3; bwd++) attn_case(attn_shapes[si], rope, bwd);
}

/* ---- attention through cuDNN (train.attention) -------------------------------- */
/* The cuDNN backend against the CPU reference and against our kernels, at
 * the tolerances of attn_case, RoPE on (the op rotates q, k before it and
 * dq, dk back after, as the model does). Head dims multiples of 8: cuDNN's.
 * With a deterministic backward engine (the trainer's) and with any
 * (attn_dq_atomic's, gpu_bench's). */
static void attn_cudnn_case(const int *shape, int det) {
    int B = shape[0], T = shape[1], H = shape[2], KV = shape[3], hd = shape[4], P = T + 5;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    char name[96], sub[120];
    snprintf(name, sizeof name, "attention cudnn B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd,
             det ? "" : " any engine");
    if (!selected(name)) return;
    reseed(name);
    rl_err e = {0};
    rl_model_config c;
    base_cfg(&c, H * hd, H, KV, P);
    double *tab = malloc(sizeof(double) * P * hd);
    rl_cpu_rope_table_f64(&c, tab);
    float *q = randn_bf16(nq, 1), *k = randn_bf16(nk, 1), *v = randn_bf16(nk, 1);
    float *dout = randn_bf16(nq, 1);
    double *qd = to_d(q, nq), *kd = to_d(k, nk), *vd = to_d(v, nk), *dod = to_d(dout, nq);
    rl_cpu_rope_fwd_f64(qd, tab, B, T, H, hd, P);
    rl_cpu_rope_fwd_f64(kd, tab, B, T, KV, hd, P);
    double *outr = malloc(nq * sizeof(double)), *dqr = malloc(nq * sizeof(double));
    double *att = malloc((size_t)B * H * T * T * sizeof(double));
    double *dkr = malloc(nk * sizeof(double)), *dvr = malloc(nk * sizeof(double));
    double *scr = malloc((size_t)B * KV * T * T * sizeof(double));
    rl_cpu_attn_fwd_f64(outr, att, qd, kd, vd, B, T, H, KV, hd);
    rl_cpu_attn_bwd_f64(dqr, dkr, dvr, scr, dod, att, qd, kd, vd, B, T, H, KV, hd);
    rl_cpu_rope_bwd_f64(dqr, tab, B, T, H, hd, P);
    rl_cpu_rope_bwd_f64(dkr, tab, B, T, KV, hd, P);
    float *o[2], *dq[2], *dk[2], *dv[2];
    for (int i = 0; i < 2; i++)
        o[i] = malloc(nq * sizeof(float)), dq[i] = malloc(nq * sizeof(float)),
        dk[i] = malloc(nk * sizeof(float)), dv[i] = malloc(nk * sizeof(float));
    int rc = rl_gpu_op_attn_cudnn(o[0], dq[0], dk[0], dv[0], dout, q, k, v, &c, B, T, H, KV, hd,
                                  det, &e);
    if (rc || rl_gpu_op_attn_fwd(o[1], q, k, v, &c, B, T, H, KV, hd, &e) ||
        rl_gpu_op_attn_bwd(dq[1], dk[1], dv[1], dout, q, k, v, &c, B, T, H, KV, hd, 0, &e)) {
        fail_err(name, &e);
    } else {
        const float *got[4] = {o[0], dq[0], dk[0], dv[0]}, *own[4] = {o[1], dq[1], dk[1], dv[1]};
        const double *ref[4] = {outr, dqr, dkr, dvr};
        const char *what[4] = {"out", "dq", "dk", "dv"};
        size_t n[4] = {nq, nq, nk, nk};
        for (int i = 0; i < 4; i++) {
            double tol = i ? 2e-2 : 1e-2, *ownd = to_d(own[i], n[i]), rn = 0;
            snprintf(sub, sizeof sub, "%s %s vs reference", i ? "  " : name, what[i]);
            check_cmp(sub, got[i], ref[i], n[i], tol);
            /* an exactly-zero gradient (dq, dk at T = 1: softmax over one
             * key) is rounding noise in both backends: the reference
             * check above bounds it, a relative comparison cannot */
            for (size_t j = 0; j < n[i]; j++) rn += ref[i][j] * ref[i][j];
            snprintf(sub, sizeof sub, "  %s vs our kernels", what[i]);
            if (rn > 0) check_cmp(sub, got[i], ownd, n[i], tol);
            free(ownd);
        }
    }
    for (int i = 0; i < 2; i++) free(o[i]), free(dq[i]), free(dk[i]), free(dv[i]);
    free(tab), free(q), free(k), free(v), free(dout), free(qd), free(kd), free(vd), free(dod);
    free(outr), free(dqr), free(att), free(dkr), free(dvr), free(scr);
}

static void test_attention_cudnn(void) {
    static const int shapes[][5] = {
        {1, 1, 3, 1, 32}, {2, 7, 3, 1, 32}, {1, 64, 2, 2, 64}, {2, 65, 6, 3, 40}, {1, 129, 4, 2, 64},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int det = 1; det >= 0; det--) attn_cudnn_case(shapes[si], det);
}

static void test_swiglu(void) {
    static const int shapes[][2] = {{1, 100}, {7, 352}, {129, 1000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], F = shapes[si][1];
        size_t nf = (size_t)N * F;
        for (int bwd = 0; bwd < 2; bwd++) {
            char name[64];
            snprintf(name, sizeof name, "swiglu %s N=%d F=%d", bwd ? "bwd" : "fwd", N, F);
            if (!selected(name)) continue;
            reseed(name);
            rl_err e = {0};
            float *gu = randn_bf16(2 * nf, 2);
            double *g = malloc(nf * sizeof(double)), *u = malloc(nf * sizeof(double));
            for (int n = 0; n < N; n++)
                for (int j = 0; j < F; j++)
                    g[(size_t)n * F + j] = gu[(size_t)n * 2 * F + j],
                                      u[(size_t)n * F + j] = gu[(size_t)n * 2 * F + F + j];
            if (!bwd) {
                double *hr = malloc(nf * sizeof(double));
                rl_cpu_swiglu_fwd_f64(hr, g, u, nf);
                float *h = malloc(nf * sizeof(float));
                if (rl_gpu_op_swiglu_fwd(h, gu, N, F, &e))
                    fail_err(name, &e);
                else
                    check_cmp(name, h, hr, nf, 4e-3);
                free(hr), free(h);
            } else {
                float *dh = randn_bf16(nf, 1), *dgu = malloc(2 * nf * sizeof(float));
                double *dhd = to_d(dh, nf), *dg = malloc(nf * sizeof(double)),
                       *du = malloc(nf * sizeof(double));
                rl_cpu_swiglu_bwd_f64(dg, du, dhd, g, u, nf);
                double *ref = malloc(2 * nf * sizeof(double));
                for (int n = 0; n < N; n++)
                    for (int j = 0; j < F; j++)
                        ref[(size_t)n * 2 * F + j] = dg[(size_t)n * F + j],
                                                ref[(size_t)n * 2 * F + F + j] =
                                                    du[(size_t)n * F + j];
                /* and the product rebuilt (recompute), bit for bit the forward's */
                float *h = malloc(nf * sizeof(float)), *h2 = malloc(nf * sizeof(float));
                if (rl_gpu_op_swiglu_bwd(dgu, h2, dh, gu, N, F, &e) ||
                    rl_gpu_op_swiglu_fwd(h, gu, N, F, &e))
                    fail_err(name, &e);
                else if (check_cmp(name, dgu, ref, 2 * nf, 4e-3))
                    report("  the forward's product rebuilt, bit for bit",
                           !memcmp(h, h2, nf * sizeof(float)), "%s",
                           memcmp(h, h2, nf * sizeof(float)) ? "DIFFERS" : "same");
                free(dh), free(dgu), free(dhd), free(dg), free(du), free(ref), free(h), free(h2);
            }
            free(gu), free(g), free(u);
        }
    }
}

/* A reduction to one value: within tol of the f64 reference and the same
 * bits on a second run. */
static void report_scalar(const char *name, float a, float b, double ref, double tol) {
    double rel = fabs(a - ref) / ref;
    report(name, isfinite(a) && rel <= tol && memcmp(&a, &b, sizeof a) == 0,
           "rel %.2e (tol %.0e), two runs %s", rel, tol,
           memcmp(&a, &b, sizeof a) ? "DIFFER" : "bit-identical");
}

/* The fused classifier on rows of ld >= V columns: V = ld on both paths,
 * padding off the 16-byte path (ld % 8 != 0), and the model's padding to a
 * multiple of 64 with V % 8 == 0 and != 0 (50257: GPT-2's vocabulary). The
 * padding holds values that would dominate the softmax (1e4) or poison it
 * (NaN) if it were read as vocabulary. Each shape also without the gradient,
 * and with a NaN logit at column V - 1 of one row (the last, partial vector;
 * in the scalar path of V = 257 a thread whose only value is that NaN): that
 * row's loss and gradient must be NaN, the others untouched. Then the
 * device-side loss accumulation. */
static void test_xent(void) {
    static const int shapes[][3] = {/* N, V, ld */
                                    {1, 257, 257},       {7, 1000, 1000},   {5, 1000, 1003},
                                    {129, 50000, 50048}, {3, 50257, 50304}, {3, 32001, 32064}};
    static const char *modes[] = {"", " loss only", " NaN logit"};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int mode = 0; mode < 3; mode++) {
            int N = shapes[si][0], V = shapes[si][1], ld = shapes[si][2];
            size_t nl = (size_t)N * ld, nv = (size_t)N * V;
            if (mode && nl > 1000000) continue; /* the big shape once: slow when emulated */
            char name[80];
            snprintf(name, sizeof name, "classifier%s N=%d V=%d ld=%d", modes[mode], N, V, ld);
            if (!selected(name)) continue;
            reseed(name);
            rl_err e = {0};
            float *logits = randn_bf16(nl, 2);
            for (int n = 0; n < N; n++)
                for (int j = V; j < ld; j++) logits[(size_t)n * ld + j] = j == V ? NAN : 1e4f;
            int bad = mode == 2 ? N / 2 : -1;
            if (bad >= 0) logits[(size_t)bad * ld + V - 1] = NAN;
            int32_t *tgt = rand_tokens(N, V);
            double *ref = malloc(nv * sizeof(double)), *lr = malloc(N * sizeof(double)),
                   *lser = malloc(N * sizeof(double));
            for (int n = 0; n < N; n++)
                for (int j = 0; j < V; j++) ref[(size_t)n * V + j] = logits[(size_t)n * ld + j];
            float scale = 1.0f / (float)N;
            rl_cpu_xent_fwd_f64(lr, ref, tgt, N, V);
            for (int n = 0; n < N; n++) lser[n] = lr[n] + ref[(size_t)n * V + tgt[n]];
            rl_cpu_xent_bwd_f64(ref, tgt, N, V, scale);
            float *losses = malloc(N * sizeof(float)), *lse = malloc(N * sizeof(float));
            float *dl = mode == 1 ? NULL : malloc(nl * sizeof(float));
            if (rl_gpu_op_xent(losses, lse, dl, logits, tgt, N, V, ld, scale, &e)) {
                fail_err(name, &e);
            } else {
                /* the NaN row checked apart; the rest (all rows otherwise)
                 * compacted to [rows, V] against the reference */
                size_t bad_nan = 0, pad_bad = 0;
                int rows = 0;
                float *gl = malloc(N * sizeof(float)), *gs = malloc(N * sizeof(float)),
                      *gd = malloc(nv * sizeof(float));
                double *rl = malloc(N * sizeof(double)), *rs = malloc(N * sizeof(double)),
                       *rd = malloc(nv * sizeof(double));
                for (int n = 0; n < N; n++) {
                    for (int j = V; dl && j < ld; j++) pad_bad += dl[(size_t)n * ld + j] != 0.0f;
                    if (n == bad) {
                        bad_nan += !isnan(losses[n]) + !isnan(lse[n]);
                        for (int j = 0; dl && j < V; j++) bad_nan += !isnan(dl[(size_t)n * ld + j]);
                        continue;
                    }
                    gl[rows] = losses[n], gs[rows] = lse[n], rl[rows] = lr[n], rs[rows] = lser[n];
                    for (int j = 0; dl && j < V; j++) {
                        gd[(size_t)rows * V + j] = dl[(size_t)n * ld + j];
                        rd[(size_t)rows * V + j] = ref[(size_t)n * V + j];
                    }
                    rows++;
                }
                if (check_cmp(name, gl, rl, (size_t)rows, 1e-5) &&
                    check_cmp("  lse", gs, rs, (size_t)rows, 1e-5) &&
                    (!dl || check_cmp("  dlogits", gd, rd, (size_t)rows * V, 4e-3))) {
                    if (dl && ld > V)
                        report("  padding columns", pad_bad == 0, "%zu of %zu not exactly 0",
                               pad_bad, (size_t)N * (ld - V));
                    if (bad >= 0)
                        report("  the NaN row", bad_nan == 0,
                               "%zu of loss, lse and %d gradients not NaN", bad_nan, dl ? V : 0);
                }
                free(gl), free(gs), free(gd), free(rl), free(rs), free(rd);
            }
            free(logits), free(tgt), free(ref), free(lr), free(lser), free(losses), free(lse),
                free(dl);
        }

    static const int counts[] = {1, 1000, 100003};
    for (size_t si = 0; si < sizeof counts / sizeof counts[0]; si++)
        for (int reset = 0; reset < 2; reset++) {
            int n = counts[si];
            char name[64];
            snprintf(name, sizeof name, "loss accum n=%d%s", n, reset ? " reset" : "");
            if (!selected(name)) continue;
            reseed(name);
            rl_err e = {0};
            float *x = randn((size_t)n, 3);
            for (int i = 0; i < n; i++) x[i] = fabsf(x[i]);
            double m = 0;
            for (int i = 0; i < n; i++) m += x[i];
            float a = 0.75f, b = 0.75f, weight = 0.25f;
            double ref = (reset ? 0.0 : (double)a) + weight * (m / n);
            if (rl_gpu_op_loss_accum(&a, x, n, weight, reset, &e) ||
                rl_gpu_op_loss_accum(&b, x, n, weight, reset, &e))
                fail_err(name, &e);
            else
                report_scalar(name, a, b, ref, 1e-6);
            free(x);
        }
}

/* out = a . b with a [M, K] and b given by element accessors: plain double loops. */
static void test_gemm(void) {
    static const int shapes[][3] = {
        /* M, N, K */ {1, 7, 16}, {7, 129, 60}, {129, 96, 770}, {300, 257, 64}, {64, 2560, 512}};
    static const char *kinds[] = {"fwd", "bwd-data", "bwd-weight", "bwd-weight-set"};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int kind = 0; kind < 4; kind++)
            for (int f32 = 0; f32 < 2; f32++) {
                int bwd_w = kind == RL_GPU_GEMM_BWD_W || kind == RL_GPU_GEMM_BWD_W_SET;
                if (bwd_w && !f32) continue; /* always fp32 */
                for (int res = 0; res < (kind == RL_GPU_GEMM_FWD && f32 ? 2 : 1); res++) {
                    int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    char name[80];
                    snprintf(name, sizeof name, "gemm %s %s%s M=%d N=%d K=%d", kinds[kind],
                             f32 ? "fp32" : "bf16", res ? "+residual" : "", M, N, K);
                    if (!selected(name)) continue;
                    reseed(name);
                    rl_err e = {0};
                    size_t na, nb, no;
                    if (kind == RL_GPU_GEMM_FWD)
                        na = (size_t)M * K, nb = (size_t)N * K, no = (size_t)M * N;
                    else if (kind == RL_GPU_GEMM_BWD_DATA)
                        na = (size_t)M * N, nb = (size_t)N * K, no = (size_t)M * K;
                    else
                        na = (size_t)M * N, nb = (size_t)M * K, no = (size_t)N * K;
                    float *a = randn_bf16(na, 1), *b = randn_bf16(nb, 1);
                    float *out = randn(no, 1), *r = res ? randn(no, 1) : NULL;
                    double *ref = calloc(no, sizeof(double));
                    if (kind == RL_GPU_GEMM_FWD)
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < N; j++) {
                                double s = r ? r[(size_t)i * N + j] : 0;
                                for (int kk = 0; kk < K; kk++)
                                    s += (double)a[(size_t)i * K + kk] * b[(size_t)j * K + kk];
                                ref[(size_t)i * N + j] = s;
                            }
                    else if (kind == RL_GPU_GEMM_BWD_DATA)
                        for (int i = 0; i < M; i++)
                            for (int kk = 0; kk < K; kk++) {
                                double s = 0;
                                for (int j = 0; j < N; j++)
                                    s += (double)a[(size_t)i * N + j] * b[(size_t)j * K + kk];
                                ref[(size_t)i * K + kk] = s;
                            }
                    else
                        for (int j = 0; j < N; j++)
                            for (int kk = 0; kk < K; kk++) {
                                /* BWD_W_SET: out is not read (NaN on the device) */
                                double s = kind == RL_GPU_GEMM_BWD_W ? out[(size_t)j * K + kk] : 0;
                                for (int i = 0; i < M; i++)
                                    s += (double)a[(size_t)i * N + j] * b[(size_t)i * K + kk];
                                ref[(size_t)j * K + kk] = s;
                            }
                    if (rl_gpu_op_gemm(kind, out, f32, a, b, r, M, N, K, &e))
                        fail_err(name, &e);
                    else
                        check_cmp(name, out, ref, no, f32 ? 1e-5 : 4e-3);
                    free(a), free(b), free(out), free(r), free(ref);
                }
            }
}

static void test_norm(void) {
    static const size_t sizes[] = {1, 1000, 3333333};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        char name[64];
        snprintf(name, sizeof name, "grad norm n=%zu", n);
        if (!selected(name)) continue;
        reseed(name);
        rl_err e = {0};
        float *g = randn(n, 1e-3);
        double ref = 0;
        for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
        ref = sqrt(ref);
        float a, b;
        if (rl_gpu_op_sumsq_norm(&a, g, n, &e) || rl_gpu_op_sumsq_norm(&b, g, n, &e))
            fail_err(name, &e);
        else
            report_scalar(name, a, b, ref, 1e-5);
        free(g);
    }
}

/* ---- the model ------------------------------------------------------------------- */
typedef struct {
    const char *label;
    int vocab, hidden, ffn, layers, heads, kv, B, T;
} model_case;

static void case_cfg(const model_case *mc, rl_model_config *c) {
    rl_model_config_default(c);
    c->vocab_size = mc->vocab, c->hidden_size = mc->hidden, c->intermediate_size = mc->ffn;
    c->num_hidden_layers = mc->layers, c->num_attention_heads = mc->heads;
    c->num_key_value_heads = mc->kv, c->max_position_embeddings = mc->T < 256 ? 256 : mc->T;
    /* larger than HF's 0.02 so that attention and the MLP are far from
     * linear at init: the comparison then exercises the nonlinear paths */
    c->initializer_range = 0.08;
}

static double cosine(const float *a, const float *b, size_t n, double *na, double *nb) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++)
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    *na = sqrt(aa), *nb = sqrt(bb);
    if (aa == 0 && bb == 0) return 1.0;
    return ab / (sqrt(aa) * sqrt(bb) + 1e-300);
}

/* One forward + backward on CPU fp32 and GPU from the same parameters and
 * batch: loss within 1%, every tensor's gradient cosine > 0.999. Then the
 * GPU alone: the training call's loss is the forward's, bit-identical on a
 * repeat, exactly twice the gradients after a second accumulated
 * micro-step, and zero_grad (which clears nothing, the next micro-batch
 * writing instead of adding) gives the first gradients again. crows > 0
 * splits the classifier into chunks of that many rows (the logits are then
 * not kept, and not compared). fused: our fused GEMMs (rl_gpu_options.
 * fused_gemm on): the training loss then comes from the fused classifier's
 * statistics, the forward's from the logits, equal up to rounding order. */
static void test_step(const model_case *mc, int recompute, int crows, int dq_atomic, int fused) {
    char name[96];
    snprintf(name, sizeof name, "step %s B=%d T=%d%s%s%s%s", mc->label, mc->B, mc->T,
             recompute ? " recompute" : "", crows ? " chunked" : "",
             dq_atomic ? " dq-atomic" : "", fused ? " fused" : "");
    if (!selected(name)) return;
    reseed(name);
    rl_model_config c;
    case_cfg(mc, &c);
    rl_err e = {0};
    rl_model cpu;
    rl_gpu_model *gpu = NULL;
    int B = mc->B, T = mc->T, N = B * T;
    if (rl_model_create(&cpu, &c, B, T, &e)) {
        fail_err(name, &e);
        return;
    }
    size_t P = cpu.lay.total;
    rl_model_init_params(&c, cpu.params, check_seed);
    int32_t *tok = rand_tokens(N, c.vocab_size), *tgt = rand_tokens(N, c.vocab_size);
    float *g1 = malloc(P * sizeof(float)), *g2 = malloc(P * sizeof(float));
    float *logits = malloc((size_t)N * c.vocab_size * sizeof(float));
    float lc, lg, lt, lg2, norm;
    rl_gpu_options opt = {.recompute = recompute,
                          .classifier_rows = crows,
                          .attn_dq_atomic = dq_atomic,
                          .fused_gemm = fused ? RL_GPU_FUSED_ON : RL_GPU_FUSED_OFF};
    if (rl_model_forward(&cpu, tok, tgt, B, T, &lc, &e)) goto err;
    memcpy(logits, rl_model_logits(&cpu), (size_t)N * c.vocab_size * sizeof(float));
    rl_model_zero_grad(&cpu);
    rl_model_backward(&cpu, 1.0f, false, NULL, NULL);
    if (rl_gpu_model_create(&gpu, &c, B, T, &opt, 0, &e) ||
        rl_gpu_model_upload_params(gpu, cpu.params, &e) ||
        rl_gpu_model_forward(gpu, tok, tgt, B, T, &lg, &e))
        goto err;
    if (!crows) {
        float *gl = malloc((size_t)N * c.vocab_size * sizeof(float));
        double *ld = to_d(logits, (size_t)N * c.vocab_size);
        int rc = rl_gpu_model_download_logits(gpu, gl, &e);
        if (!rc) {
            char sub[120];
            snprintf(sub, sizeof sub, "  %s logits", name);
            check_cmp(sub, gl, ld, (size_t)N * c.vocab_size, 3e-2);
        }
        free(gl), free(ld);
        if (rc) goto err;
    }
    if (rl_gpu_model_zero_grad(gpu, &e) ||
        rl_gpu_model_train_micro(gpu, tok, tgt, B, T, 1.0f, NULL, NULL, &e) ||
        rl_gpu_model_step_end(gpu, &e) || rl_gpu_model_step_stats(gpu, 0, &lt, &norm, &e) ||
        rl_gpu_model_download_grads(gpu, g1, &e))
        goto err;
    if (fused)
        report("  training loss == forward loss (1e-6)", fabs(lt - lg) <= 1e-6 * fabs(lg),
               "train_micro %.9g, forward %.9g", lt, lg);
    else
        report("  training loss == forward loss", memcmp(&lt, &lg, sizeof lt) == 0,
               "train_micro %.9g, forward %.9g", lt, lg);
    double rel = fabs(lg - lc) / fabs(lc);
    report(name, isfinite(lg) && rel <= 0.01, "loss gpu %.6f cpu %.6f rel %.2e (tol 1e-02)", lg, lc,
           rel);
    {
        /* A tensor whose exact gradient is zero (q and k projections at
         * T = 1: softmax over one key) has no direction to compare: the CPU
         * gets exact zeros, the GPU rounding noise (dP - D does not cancel
         * bit for bit). There the GPU's gradient must be negligible against
         * the whole gradient instead: below 1e-4 of its norm. */
        int nt = rl_model_n_tensors(&c), bad = 0, zero = 0;
        double worst = 2, total = 0;
        char worst_name[80] = "";
        for (size_t i = 0; i < P; i++) total += (double)cpu.grads[i] * cpu.grads[i];
        total = sqrt(total);
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            double na, nb, cs = cosine(g1 + ti.offset, cpu.grads + ti.offset, ti.numel, &na, &nb);
            if (nb <= 1e-9 * total) {
                zero++;
                if (!(na <= 1e-4 * total)) {
                    bad++;
                    printf("       %s: exact gradient ~0 (|cpu| %.3e) but |gpu| %.3e\n", ti.name,
                           nb, na);
                }
                continue;
            }
            if (!(cs > 0.999)) {
                bad++;
                printf("       %s: cosine %.6f |gpu| %.3e |cpu| %.3e\n", ti.name, cs, na, nb);
            }
            if (cs < worst) worst = cs, snprintf(worst_name, sizeof worst_name, "%s", ti.name);
        }
        report("  gradients, cosine per tensor", bad == 0,
               "%d of %d tensors below 0.999; lowest %.6f (%s)%s", bad, nt, worst, worst_name,
               zero ? "; tensors with a zero exact gradient: negligible on the GPU too" : "");
    }
    if (dq_atomic) goto done; /* dQ's atomics: no exact repeat or sum on a GPU */
    /* determinism and accumulation */
    if (rl_gpu_model_zero_grad(gpu, &e) ||
        rl_gpu_model_train_micro(gpu, tok, tgt, B, T, 1.0f, NULL, NULL, &e) ||
        rl_gpu_model_step_end(gpu, &e) || rl_gpu_model_step_stats(gpu, 0, &lg2, &norm, &e) ||
        rl_gpu_model_download_grads(gpu, g2, &e))
        goto err;
    /* against the first training loss (lt): fused, the forward's (lg) is
     * another path's, equal only up to rounding order */
    report("  repeat is bit-identical",
           memcmp(&lt, &lg2, sizeof lt) == 0 && memcmp(g1, g2, P * sizeof(float)) == 0,
           "loss %s, gradients %s", memcmp(&lt, &lg2, sizeof lt) ? "differ" : "same",
           memcmp(g1, g2, P * sizeof(float)) ? "differ" : "same");
    if (rl_gpu_model_train_micro(gpu, tok, tgt, B, T, 1.0f, NULL, NULL, &e) ||
        rl_gpu_model_download_grads(gpu, g2, &e))
        goto err;
    {
        /* exact, but for lm_head in chunks: its gradient is a sum over the
         * chunks, so the second micro-step's is ((g + c1) + c2) + ..., not
         * 2 (c1 + c2 + ...) bit for bit -- there within 1e-6 of the
         * tensor's largest value */
        size_t off = 0, lm = cpu.lay.lm_head;
        double mx = 0;
        for (size_t i = lm; i < P; i++) mx = fmax(mx, fabs(2.0 * g1[i]));
        for (size_t i = 0; i < P; i++)
            off += crows && i >= lm ? !(fabs(g2[i] - 2.0 * g1[i]) <= 1e-6 * mx)
                                    : g2[i] != 2.0f * g1[i];
        report("  second micro-step accumulates", off == 0,
               "%zu of %zu gradients != 2x the first (exactly%s)", off, P,
               crows ? "; lm_head in chunks: within 1e-6 of its largest" : "");
    }
    if (rl_gpu_model_zero_grad(gpu, &e) ||
        rl_gpu_model_train_micro(gpu, tok, tgt, B, T, 1.0f, NULL, NULL, &e) ||
        rl_gpu_model_download_grads(gpu, g2, &e))
        goto err;
    report("  zero_grad: the next micro-step writes, stale sums ignored",
           memcmp(g1, g2, P * sizeof(float)) == 0, "gradients %s the first step's",
           memcmp(g1, g2, P * sizeof(float)) ? "differ from" : "equal");
    goto done;
err:
    fail_err(name, &e);
done:
    rl_gpu_model_free(gpu);
    rl_model_destroy(&cpu);
    free(tok), free(tgt), free(g1), free(g2), free(logits);
}

/* AdamW on the GPU against rl_adamw_update per tensor (decay on matrices
 * only), the bf16 copy = the rounded master, and the device-side clip. */
static void test_adamw(void) {
    const char *name = "adamw vs rl_adamw_update";
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"adamw", 101, 96, 200, 2, 3, 1, 1, 8};
    rl_model_config c;
    case_cfg(&mc, &c);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    float *p = malloc(P * sizeof(float)), *g = randn(P, 1e-2), *mv = malloc(2 * P * sizeof(float));
    rl_model_init_params(&c, p, check_seed);
    for (size_t i = 0; i < P; i++)
        mv[i] = (float)(rl_rng_normal(&rng) * 1e-3),
        mv[P + i] = (float)(fabs(rl_rng_normal(&rng)) * 1e-5);
    float *cp = malloc(P * sizeof(float)), *cmv = malloc(2 * P * sizeof(float));
    float *gp = malloc(P * sizeof(float)), *gmv = malloc(2 * P * sizeof(float)),
          *g16 = malloc(P * sizeof(float));
    rl_err e = {0};
    rl_gpu_model *m = NULL;
    for (int clip = 0; clip < 2; clip++) {
        const char *sub = clip ? "  with device-side clipping" : name;
        memcpy(cp, p, P * sizeof(float)), memcpy(cmv, mv, 2 * P * sizeof(float));
        double lr = 3e-3, wd = 0.1, max_norm = 0.05, scale = 0.7;
        double norm = rl_grad_norm(g, P),
               gs = scale * (clip ? rl_clip_factor(norm, max_norm) : 1.0);
        int nt = rl_model_n_tensors(&c);
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            rl_adamw_update(cp + ti.offset, g + ti.offset, cmv + ti.offset, cmv + P + ti.offset,
                            ti.numel, lr, 0.9, 0.95, 1e-8, ti.decay ? wd : 0.0, 3, gs);
        }
        rl_gpu_adamw a = {.lr = lr,
                          .beta1 = 0.9,
                          .beta2 = 0.95,
                          .eps = 1e-8,
                          .weight_decay = wd,
                          .t = 3,
                          .grad_scale = scale,
                          .clip_max_norm = clip ? max_norm : 0};
        float gnorm = 0;
        if ((!m && rl_gpu_model_create(&m, &c, 1, 8, NULL, 0, &e)) ||
            rl_gpu_model_upload_params(m, p, &e) || rl_gpu_model_upload_grads(m, g, &e) ||
            rl_gpu_model_upload_opt(m, mv, &e) || rl_gpu_model_grad_norm(m, &gnorm, &e) ||
            rl_gpu_model_adamw(m, &a, &e) || rl_gpu_model_download_params(m, gp, &e) ||
            rl_gpu_model_download_opt(m, gmv, &e) ||
            rl_gpu_model_download_params_bf16(m, g16, &e)) {
            fail_err(sub, &e);
            break;
        }
        /* fp32 on both sides, but the kernel may contract into FMAs and,
         * with clipping, scales by a factor from its own fp32 norm (the
         * CPU's is double): a few ulps relative to each value, plus an
         * absolute term scaled to the array's magnitude for values that
         * cancel towards zero (m = b1 m + (1 - b1) g can). */
        size_t bad = 0, bad16 = 0;
        double worst = 0, rtol = clip ? 1e-5 : 1e-6, atol = clip ? 1e-6 : 1e-7;
        const float *cpu_arr[3] = {cp, cmv, cmv + P}, *gpu_arr[3] = {gp, gmv, gmv + P};
        for (int k = 0; k < 3; k++) {
            double mx = 0;
            for (size_t i = 0; i < P; i++) mx = fmax(mx, fabs(cpu_arr[k][i]));
            for (size_t i = 0; i < P; i++) {
                double d = fabs(gpu_arr[k][i] - cpu_arr[k][i]);
                if (!(d <= rtol * fabs(cpu_arr[k][i]) + atol * mx)) bad++;
                if (k == 0 && d > worst) worst = d;
            }
        }
        for (size_t i = 0; i < P; i++)
            if (g16[i] != rl_gpu_bf16_round(gp[i])) bad16++;
        report(sub, bad == 0 && bad16 == 0 && fabs(gnorm - norm) <= 1e-5 * norm,
               "%zu values outside tolerance (max|d| %.2e), %zu bf16 copies != round(master), norm "
               "%.6g vs %.6g",
               bad, worst, bad16, gnorm, norm);
    }
    /* a NaN gradient: the norm is NaN and the step changes nothing */
    if (m) {
        const char *sub = "  a non-finite norm leaves weights and moments";
        rl_gpu_adamw a = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .t = 4,
                          .grad_scale = 1.0, .clip_max_norm = 1.0};
        float gnorm = 0;
        g[P / 2] = NAN;
        if (rl_gpu_model_upload_params(m, p, &e) || rl_gpu_model_upload_grads(m, g, &e) ||
            rl_gpu_model_upload_opt(m, mv, &e) || rl_gpu_model_grad_norm(m, &gnorm, &e) ||
            rl_gpu_model_adamw(m, &a, &e) || rl_gpu_model_download_params(m, gp, &e) ||
            rl_gpu_model_download_opt(m, gmv, &e))
            fail_err(sub, &e);
        else
            report(sub,
                   isnan(gnorm) && !memcmp(gp, p, P * sizeof(float)) &&
                       !memcmp(gmv, mv, 2 * P * sizeof(float)),
                   "norm %g; parameters %s, moments %s", gnorm,
                   memcmp(gp, p, P * sizeof(float)) ? "changed" : "unchanged",
                   memcmp(gmv, mv, 2 * P * sizeof(float)) ? "changed" : "unchanged");
    }
    rl_gpu_model_free(m);
    free(p), free(g), free(mv), free(cp), free(cmv), free(gp), free(gmv), free(g16);
}

/* 50 optimizer steps on CPU fp32 and GPU bf16 from the same init on the
 * same learnable data (each sequence counts upward mod V from a random
 * start, so the next token is predictable). Band: every step's loss within
 * max(0.05 nats, 5%) of the CPU's, the last within 3%; both must learn. */
static void test_train_curve(void) {
    const char *name = "50 steps track the CPU loss curve";
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"curve", 101, 96, 200, 2, 3, 1, 4, 32};
    rl_model_config c;
    case_cfg(&mc, &c);
    c.initializer_range = 0.02;
    int B = mc.B, T = mc.T, N = B * T, steps = 50;
    rl_err e = {0};
    rl_model cpu;
    rl_gpu_model *gpu = NULL;
    if (rl_model_create(&cpu, &c, B, T, &e)) {
        fail_err(name, &e);
        return;
    }
    size_t P = cpu.lay.total;
    rl_model_init_params(&c, cpu.params, check_seed);
    float *mv = calloc(2 * P, sizeof(float));
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    double worst = 0, first_c = 0, last_c = 0, last_g = 0;
    int bad = 0;
    if (rl_gpu_model_create(&gpu, &c, B, T, NULL, 0, &e) ||
        rl_gpu_model_upload_params(gpu, cpu.params, &e))
        goto err;
    for (int s = 1; s <= steps; s++) {
        for (int b = 0; b < B; b++) {
            int start = (int)(rl_rng_u64(&rng) % (uint64_t)c.vocab_size);
            for (int t = 0; t < T; t++) {
                tok[b * T + t] = (start + t) % c.vocab_size;
                tgt[b * T + t] = (start + t + 1) % c.vocab_size;
            }
        }
        float lc, lg;
        rl_model_zero_grad(&cpu);
        if (rl_model_forward(&cpu, tok, tgt, B, T, &lc, &e)) goto err;
        rl_model_backward(&cpu, 1.0f, false, NULL, NULL);
        double norm = rl_grad_norm(cpu.grads, P), clip = rl_clip_factor(norm, 1.0);
        int nt = rl_model_n_tensors(&c);
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            rl_adamw_update(cpu.params + ti.offset, cpu.grads + ti.offset, mv + ti.offset,
                            mv + P + ti.offset, ti.numel, 3e-3, 0.9, 0.95, 1e-8,
                            ti.decay ? 0.1 : 0.0, s, clip);
        }
        rl_gpu_adamw a = {.lr = 3e-3,
                          .beta1 = 0.9,
                          .beta2 = 0.95,
                          .eps = 1e-8,
                          .weight_decay = 0.1,
                          .t = s,
                          .grad_scale = 1.0,
                          .clip_max_norm = 1.0};
        float gn;
        if (rl_gpu_model_zero_grad(gpu, &e) ||
            rl_gpu_model_train_micro(gpu, tok, tgt, B, T, 1.0f, NULL, NULL, &e) ||
            rl_gpu_model_grad_norm(gpu, NULL, &e) || rl_gpu_model_adamw(gpu, &a, &e) ||
            rl_gpu_model_step_end(gpu, &e) || rl_gpu_model_step_stats(gpu, 0, &lg, &gn, &e))
            goto err;
        double d = fabs(lg - lc), band = fmax(0.05, 0.05 * lc);
        if (!(d <= band)) bad++;
        if (d / lc > worst) worst = d / lc;
        if (s == 1) first_c = lc;
        last_c = lc, last_g = lg;
    }
    {
        double last_rel = fabs(last_g - last_c) / last_c;
        report(name,
               bad == 0 && last_rel <= 0.03 && last_c < 0.5 * first_c && last_g < 0.5 * first_c,
               "cpu %.4f -> %.4f, gpu -> %.4f; %d steps outside the band, worst rel %.3f, last rel "
               "%.3f",
               first_c, last_c, last_g, bad, worst, last_rel);
    }
    goto done;
err:
    fail_err(name, &e);
done:
    rl_gpu_model_free(gpu);
    rl_model_destroy(&cpu);
    free(mv), free(tok), free(tgt);
}

/* K steps of one model through train_micro (a new batch per micro-batch,
 * two per step, the learning rate changing every step) from a start
 * state; losses[K], then the parameters and moments in p and mv. */
static int graph_run(rl_gpu_model *m, int graphs, const float *p0, const int32_t *tok,
                     const int32_t *tgt, int B, int T, int K, float *losses, float *p, float *mv,
                     rl_err *e) {
    size_t P = rl_gpu_model_layout(m)->total, N = (size_t)B * T;
    memset(mv, 0, 2 * P * sizeof(float));
    rl_gpu_model_graphs(m, graphs);
    int rc = rl_gpu_model_upload_params(m, p0, e) || rl_gpu_model_upload_opt(m, mv, e);
    for (int s = 1; s <= K && !rc; s++) {
        rl_gpu_adamw a = {.lr = 1e-3 * s, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                          .weight_decay = 0.1, .t = s, .grad_scale = 1.0, .clip_max_norm = 1.0};
        float norm;
        rc = rl_gpu_model_zero_grad(m, e);
        for (int k = 0; k < 2 && !rc; k++) {
            size_t at = (size_t)(2 * (s - 1) + k) * N;
            rc = rl_gpu_model_train_micro(m, tok + at, tgt + at, B, T, 0.5f, NULL, NULL, e);
        }
        if (!rc)
            rc = rl_gpu_model_grad_norm(m, NULL, e) || rl_gpu_model_adamw(m, &a, e) ||
                 rl_gpu_model_step_end(m, e) ||
                 rl_gpu_model_step_stats(m, 0, &losses[s - 1], &norm, e);
    }
    if (!rc) rc = rl_gpu_model_download_params(m, p, e) || rl_gpu_model_download_opt(m, mv, e);
    return rc;
}

/* CUDA graphs change nothing but the launching: the same steps with every
 * kernel launched and with the micro-batches replayed from graphs give
 * bit-identical losses, parameters and moments (one model: the same GEMM
 * algorithms), and the graphs did run -- every micro-batch but each
 * variant's first (a step's first micro-batch and the later one). With
 * each attention backend: cuDNN's executions are captured too. */
static void test_graphs(int attention) {
    char name[96];
    snprintf(name, sizeof name, "cuda graphs: replayed steps = launched steps (%s attention)",
             attention == RL_GPU_ATTN_CUDNN ? "cudnn" : "own");
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"graphs", 101, 96, 200, 2, 3, 1, 2, 33};
    rl_model_config c;
    case_cfg(&mc, &c);
    enum { K = 4 };
    int B = mc.B, T = mc.T, N = B * T;
    rl_err e = {0};
    rl_gpu_model *m = NULL;
    cudaStream_t s = NULL;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    float *p0 = malloc(P * sizeof(float)), *pa = malloc(P * sizeof(float)),
          *pb = malloc(P * sizeof(float)), *ma = malloc(2 * P * sizeof(float)),
          *mb = malloc(2 * P * sizeof(float)), la[K], lb[K];
    int32_t *tok = rand_tokens(2 * K * N, c.vocab_size), *tgt = rand_tokens(2 * K * N, c.vocab_size);
    rl_model_init_params(&c, p0, check_seed);
    long long before = 0, replays = 0;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        report(name, 0, "cudaStreamCreateWithFlags failed");
        goto done;
    }
    rl_gpu_options opt = {.attention = attention};
    if (rl_gpu_model_create(&m, &c, B, T, &opt, s, &e) ||
        graph_run(m, 0, p0, tok, tgt, B, T, K, la, pa, ma, &e))
        goto err;
    before = rl_gpu_model_graph_replays(m);
    if (graph_run(m, 1, p0, tok, tgt, B, T, K, lb, pb, mb, &e)) goto err;
    replays = rl_gpu_model_graph_replays(m) - before;
    report(name,
           before == 0 && replays == 2 * K - 2 && !memcmp(la, lb, sizeof la) &&
               !memcmp(pa, pb, P * sizeof(float)) && !memcmp(ma, mb, 2 * P * sizeof(float)),
           "%lld of %d micro-batches replayed (want %d, and none while off); losses %s, "
           "parameters %s, moments %s",
           replays, 2 * K, 2 * K - 2, memcmp(la, lb, sizeof la) ? "differ" : "same",
           memcmp(pa, pb, P * sizeof(float)) ? "differ" : "same",
           memcmp(ma, mb, 2 * P * sizeof(float)) ? "differ" : "same");
    goto done;
err:
    fail_err(name, &e);
done:
    rl_gpu_model_free(m);
    if (s) cudaStreamDestroy(s);
    free(p0), free(pa), free(pb), free(ma), free(mb), free(tok), free(tgt);
}

/* The plan (rl_gpu_model_plan) against a real step of the same model: the
 * same launcher calls (a profiled step times each), the same device
 * memory, no host sync inside the step, and GEMM FLOPs equal to six times
 * the matrix parameters (lm_head padded) per token, counted here from the
 * shapes alone. */
/* ---- train.attention at the model level ------------------------------------------ */
/* Defined by the emulated build's fake cuDNN (tests/gpu/emu/fake_cudnn.cpp),
 * absent on hardware: the absent/refusing cases need the fake's switch. */
extern int rl_emu_cudnn_present(void) __attribute__((weak));

/* stderr (the JSON log lines) captured from begin to end into log[n], and
 * still printed to the test's output */
typedef struct {
    FILE *tmp;
    int saved;
} err_capture;
static void capture_begin(err_capture *k) {
    fflush(stderr);
    k->tmp = tmpfile();
    k->saved = dup(2);
    if (k->tmp) dup2(fileno(k->tmp), 2);
}
static void capture_end(err_capture *k, char *log, size_t n) {
    fflush(stderr);
    log[0] = 0;
    if (k->tmp) {
        dup2(k->saved, 2);
        rewind(k->tmp);
        size_t got = fread(log, 1, n - 1, k->tmp);
        log[got] = 0;
        fclose(k->tmp);
        fputs(log, stdout);
    }
    close(k->saved);
}

/* rl_gpu_model_create with attention `mode`, its log lines into log[n]. */
static int create_logged(rl_gpu_model **m, const rl_model_config *c, int B, int T, int mode,
                         char *log, size_t n, rl_err *e) {
    rl_gpu_options opt = {.attention = mode};
    err_capture k;
    capture_begin(&k);
    int rc = rl_gpu_model_create(m, c, B, T, &opt, 0, e);
    capture_end(&k, log, n);
    return rc;
}

/* One micro-step on a model with options opt from params: loss and
 * gradients; the attention backend used, the sites that ran fused (a mask
 * of RL_GPU_SITE_* bits, or'ed into *sites) and the log lines of the whole
 * step (creation included) into log[n]. */
static int step_with(const rl_model_config *c, const rl_gpu_options *opt, const float *params,
                     const int32_t *tok, const int32_t *tgt, int B, int T, float *loss,
                     float *grads, int *used, char *log, size_t n, int *sites, rl_err *e) {
    rl_gpu_model *m = NULL;
    err_capture k;
    capture_begin(&k);
    int rc = rl_gpu_model_create(&m, c, B, T, opt, 0, e);
    if (!rc) *used = rl_gpu_model_attention(m);
    if (!rc) rc = rl_gpu_model_upload_params(m, params, e);
    if (!rc) rc = rl_gpu_model_zero_grad(m, e);
    if (!rc) rc = rl_gpu_model_train_micro(m, tok, tgt, B, T, 1.0f, NULL, NULL, e);
    if (!rc) rc = rl_gpu_model_step_end(m, e);
    float norm;
    if (!rc) rc = rl_gpu_model_step_stats(m, 0, loss, &norm, e);
    if (!rc) rc = rl_gpu_model_download_grads(m, grads, e);
    for (int k2 = 0; !rc && k2 < RL_GPU_SITES; k2++) *sites |= rl_gpu_model_fused(m, k2) << k2;
    capture_end(&k, log, n);
    rl_gpu_model_free(m);
    return rc;
}

/* A whole step with attention cudnn against own: loss within 1e-3
 * relative, every tensor's gradient cosine > 0.999 (the step tests' bound
 * against the CPU), the backend actually used as asked. */
static void test_step_cudnn(const model_case *mc) {
    char name[96];
    snprintf(name, sizeof name, "attention cudnn step %s B=%d T=%d", mc->label, mc->B, mc->T);
    if (!selected(name)) return;
    reseed(name);
    rl_model_config c;
    case_cfg(mc, &c);
    rl_err e = {0};
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    int N = mc->B * mc->T, used[2] = {-1, -1};
    float *params = malloc(P * sizeof(float)), *g[2], loss[2];
    g[0] = malloc(P * sizeof(float)), g[1] = malloc(P * sizeof(float));
    rl_model_init_params(&c, params, check_seed);
    int32_t *tok = rand_tokens(N, c.vocab_size), *tgt = rand_tokens(N, c.vocab_size);
    rl_gpu_options cudnn = {.attention = RL_GPU_ATTN_CUDNN}, own = {.attention = RL_GPU_ATTN_OWN};
    char log[4096];
    int sites = 0;
    if (step_with(&c, &cudnn, params, tok, tgt, mc->B, mc->T, &loss[0], g[0], &used[0], log,
                  sizeof log, &sites, &e) ||
        step_with(&c, &own, params, tok, tgt, mc->B, mc->T, &loss[1], g[1], &used[1], log,
                  sizeof log, &sites, &e)) {
        fail_err(name, &e);
    } else {
        report("  backends used", used[0] == RL_GPU_ATTN_CUDNN && used[1] == RL_GPU_ATTN_OWN,
               "cudnn model runs %d, own model %d", used[0], used[1]);
        double rel = fabs(loss[0] - loss[1]) / fabs(loss[1]), worst = 2;
        report(name, isfinite(loss[0]) && rel <= 1e-3, "loss cudnn %.6f own %.6f rel %.2e (tol 1e-03)",
               loss[0], loss[1], rel);
        int nt = rl_model_n_tensors(&c), bad = 0;
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            double na, nb, cs = cosine(g[0] + ti.offset, g[1] + ti.offset, ti.numel, &na, &nb);
            if (nb == 0 && na == 0) continue;
            if (cs < worst) worst = cs;
            if (!(cs > 0.999)) bad++, printf("       %s: cosine %.6f\n", ti.name, cs);
        }
        report("  gradients cudnn vs own", bad == 0, "worst tensor cosine %.6f (> 0.999)", worst);
    }
    free(params), free(g[0]), free(g[1]), free(tok), free(tgt);
}

/* Our fused GEMMs (SwiGLU's two sites and the classifier) against cuBLASLt
 * and the separate kernels (rl_gpu_options.fused_gemm): one step's loss
 * within 1e-3 relative and every tensor's gradient cosine > 0.999 (the
 * step tests' bounds against the CPU); on reports every site fused, off
 * none; auto times both ways at each site's first use and logs one choice
 * per site; where the fused kernels do not take the shapes (the odd case:
 * hidden 66, ffn 90) on runs the separate path, with the same result. */
static void test_fused_gemm(const model_case *mc) {
    char name[96];
    snprintf(name, sizeof name, "fused gemm step %s B=%d T=%d", mc->label, mc->B, mc->T);
    if (!selected(name)) return;
    reseed(name);
    rl_model_config c;
    case_cfg(mc, &c);
    rl_err e = {0};
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    int N = mc->B * mc->T, used[3], sites[3] = {0, 0, 0};
    int takes = c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0;
    float *params = malloc(P * sizeof(float)), *g[3], loss[3];
    for (int k = 0; k < 3; k++) g[k] = malloc(P * sizeof(float));
    rl_model_init_params(&c, params, check_seed);
    int32_t *tok = rand_tokens(N, c.vocab_size), *tgt = rand_tokens(N, c.vocab_size);
    const int mode[3] = {RL_GPU_FUSED_ON, RL_GPU_FUSED_OFF, RL_GPU_FUSED_AUTO};
    char log[3][8192];
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        rl_gpu_options opt = {.fused_gemm = mode[k]};
        rc = step_with(&c, &opt, params, tok, tgt, mc->B, mc->T, &loss[k], g[k], &used[k], log[k],
                       sizeof log[k], &sites[k], &e);
    }
    if (rc) {
        fail_err(name, &e);
    } else {
        double rel = fabs(loss[0] - loss[1]) / fabs(loss[1]), worst = 2;
        report(name, isfinite(loss[0]) && rel <= 1e-3,
               "loss fused %.6f separate %.6f rel %.2e (tol 1e-03)", loss[0], loss[1], rel);
        report("  sites fused", sites[0] == (takes ? 7 : 0) && sites[1] == 0,
               "on: mask %d (want %d), off: %d (want 0)", sites[0], takes ? 7 : 0, sites[1]);
        int nt = rl_model_n_tensors(&c), bad = 0;
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            double na, nb, cs = cosine(g[0] + ti.offset, g[1] + ti.offset, ti.numel, &na, &nb);
            if (nb == 0 && na == 0) continue;
            if (cs < worst) worst = cs;
            if (!(cs > 0.999)) bad++, printf("       %s: cosine %.6f\n", ti.name, cs);
        }
        report("  gradients fused vs separate", bad == 0, "worst tensor cosine %.6f (> 0.999)",
               worst);
        int lines = 0;
        for (const char *p = log[2]; (p = strstr(p, "\"fused_gemm\"")); p++) lines++;
        if (takes)
            report("  auto times both ways, one line per site",
                   lines == 3 && strstr(log[2], "\"site\":\"swiglu_fwd\"") &&
                       strstr(log[2], "\"site\":\"swiglu_bwd\"") &&
                       strstr(log[2], "\"site\":\"classifier\"") &&
                       strstr(log[2], "\"fused_ms\"") && !strstr(log[0], "\"fused_gemm\""),
                   "%d fused_gemm lines under auto (want 3), %s under on", lines,
                   strstr(log[0], "\"fused_gemm\"") ? "some" : "none");
        else
            report("  shapes the fused kernels do not take: separate, nothing timed",
                   lines == 0 && memcmp(g[0], g[1], P * sizeof(float)) == 0 && loss[0] == loss[1],
                   "%d fused_gemm lines under auto; on and off %s", lines,
                   memcmp(g[0], g[1], P * sizeof(float)) ? "DIFFER" : "identical");
    }
    free(params), free(tok), free(tgt);
    for (int k = 0; k < 3; k++) free(g[k]);
}

/* auto picks one backend and says so in one line, with the cuDNN version
 * it checked; cudnn checks agreement the same way. Without a usable cuDNN
 * (emulated: RL_EMU_CUDNN=absent, a library that is not there; =refuse,
 * engines that refuse the graphs; =bwd-wrong, a backward that runs and
 * computes garbage) auto falls back to ours with a reason and cudnn fails
 * naming train.attention. */
static void test_attention_select(void) {
    const char *name = "attention select";
    if (!selected(name)) return;
    model_case mc = {"gqa-hd32", 101, 96, 200, 1, 3, 1, 2, 7};
    rl_model_config c;
    case_cfg(&mc, &c);
    char log[8192];
    rl_err e = {0};
    rl_gpu_model *m = NULL;
    int rc = create_logged(&m, &c, mc.B, mc.T, RL_GPU_ATTN_AUTO, log, sizeof log, &e);
    int got = rc ? -1 : rl_gpu_model_attention(m);
    rl_gpu_model_free(m), m = NULL;
    report("attention auto picks and logs",
           !rc && (got == RL_GPU_ATTN_OWN || got == RL_GPU_ATTN_CUDNN) &&
               strstr(log, "\"attention_backend\"") && strstr(log, "\"requested\":\"auto\""),
           "rc %d (%s), backend %d, log %s", rc, rc ? e.msg : "", got,
           strstr(log, "attention_backend") ? "has the line" : "LACKS the attention_backend line");
    if (!rc && rl_emu_cudnn_present) /* emulated: both ran, so times and differences are there */
        report("  auto compared both", strstr(log, "\"own_ms\"") && strstr(log, "\"bwd_diff\"") &&
                                           strstr(log, "\"agree\":true") &&
                                           strstr(log, "\"cudnn_version\""),
               "%s", log);
    rc = create_logged(&m, &c, mc.B, mc.T, RL_GPU_ATTN_CUDNN, log, sizeof log, &e);
    got = rc ? -1 : rl_gpu_model_attention(m);
    rl_gpu_model_free(m), m = NULL;
    report("  cudnn checks agreement and logs it",
           !rc && got == RL_GPU_ATTN_CUDNN && strstr(log, "\"requested\":\"cudnn\"") &&
               strstr(log, "\"cudnn_version\"") && strstr(log, "\"agree\":true"),
           "rc %d (%s), backend %d", rc, rc ? e.msg : "", got);
    if (!rl_emu_cudnn_present) {
        printf("  (hardware: the absent/refusing cuDNN cases need the emulated build)\n");
        return;
    }
    static const char *const how[] = {"absent", "refuse", "bwd-wrong"};
    for (int i = 0; i < 3; i++) {
        char sub[96];
        setenv("RL_EMU_CUDNN", how[i], 1);
        rc = create_logged(&m, &c, mc.B, mc.T, RL_GPU_ATTN_AUTO, log, sizeof log, &e);
        got = rc ? -1 : rl_gpu_model_attention(m);
        rl_gpu_model_free(m), m = NULL;
        snprintf(sub, sizeof sub, "  cuDNN %s: auto falls back to ours", how[i]);
        report(sub, !rc && got == RL_GPU_ATTN_OWN && strstr(log, "\"choice\":\"own\"") &&
                        strstr(log, "\"reason\""),
               "rc %d (%s), backend %d", rc, rc ? e.msg : "", got);
        memset(&e, 0, sizeof e);
        rc = create_logged(&m, &c, mc.B, mc.T, RL_GPU_ATTN_CUDNN, log, sizeof log, &e);
        rl_gpu_model_free(m), m = NULL;
        snprintf(sub, sizeof sub, "  cuDNN %s: cudnn fails naming train.attention", how[i]);
        report(sub, rc != 0 && strstr(e.msg, "train.attention") && !strchr(e.msg, '\n'),
               "rc %d: %s", rc, e.msg);
        unsetenv("RL_EMU_CUDNN");
    }
}

static void test_plan(int fused) {
    char name[64];
    snprintf(name, sizeof name, "plan matches a real step (fused gemm %s)",
             fused == RL_GPU_FUSED_ON ? "on" : "off");
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"plan", 1000, 128, 352, 3, 2, 1, 2, 40};
    rl_model_config c;
    case_cfg(&mc, &c);
    int B = mc.B, T = mc.T, N = B * T, accum = 2;
    rl_gpu_options opt = {.classifier_rows = 32, .gemm_sm_count = 100, .attn_dq_atomic = 1,
                          .fused_gemm = fused};
    rl_gpu_plan p;
    rl_gpu_model *m = NULL;
    rl_err e = {0};
    int32_t *tok = rand_tokens(N, c.vocab_size), *tgt = rand_tokens(N, c.vocab_size);
    double ms[RL_GPU_PROF_N];
    int calls = 0;
    rl_gpu_adamw a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                      .t = 1, .grad_scale = 1.0, .clip_max_norm = 1.0};
    int rc = rl_gpu_model_plan(&c, B, T, &opt, accum, 989e12, 3.35e12, &p, &e) ||
             rl_gpu_model_create(&m, &c, B, T, &opt, 0, &e) ||
             rl_gpu_model_profile(m, 1, &e) || rl_gpu_model_zero_grad(m, &e);
    for (int k = 0; k < accum && !rc; k++)
        rc = rl_gpu_model_train_micro(m, tok, tgt, B, T, 0.5f, NULL, NULL, &e);
    if (!rc)
        rc = rl_gpu_model_grad_norm(m, NULL, &e) || rl_gpu_model_adamw(m, &a, &e) ||
             rl_gpu_model_step_end(m, &e) || rl_gpu_model_profile_read(m, ms, &calls, &e);
    if (rc) {
        fail_err(name, &e);
    } else {
        int hd = c.hidden_size / c.num_attention_heads, D = c.hidden_size,
            F = c.intermediate_size, Vp = (c.vocab_size + 63) / 64 * 64;
        int C3 = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd;
        double mat = (double)c.num_hidden_layers *
                         ((double)D * C3 + (double)c.num_attention_heads * hd * D + 3.0 * F * D) +
                     (double)Vp * D;
        double want = 6.0 * mat * N * accum, got = p.flops[RL_GPU_PROF_GEMM];
        report(name,
               p.calls == calls && p.device_bytes == rl_gpu_model_device_bytes(m) &&
                   p.host_syncs == 0 && fabs(got - want) <= 1e-9 * want,
               "calls plan %d, real %d; device bytes plan %zu, real %zu; host syncs %d; GEMM "
               "FLOPs %.6g, from the shapes %.6g",
               p.calls, calls, p.device_bytes, rl_gpu_model_device_bytes(m), p.host_syncs, got,
               want);
    }
    rl_gpu_model_free(m);
    free(tok), free(tgt);
}

/* Parameters and moments survive a round trip bit for bit: a checkpoint
 * written from the GPU model resumes on the CPU and back. */
static void test_roundtrip(void) {
    const char *name = "params/opt round trip is exact";
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"rt", 257, 60, 100, 2, 3, 3, 1, 4};
    rl_model_config c;
    case_cfg(&mc, &c);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    float *p = randn(P, 1), *o = randn(2 * P, 1), *p2 = malloc(P * sizeof(float)),
          *o2 = malloc(2 * P * sizeof(float));
    rl_err e = {0};
    rl_gpu_model *m = NULL;
    if (rl_gpu_model_create(&m, &c, 1, 4, NULL, 0, &e) || rl_gpu_model_upload_params(m, p, &e) ||
        rl_gpu_model_upload_opt(m, o, &e) || rl_gpu_model_download_params(m, p2, &e) ||
        rl_gpu_model_download_opt(m, o2, &e))
        fail_err(name, &e);
    else
        report(name, !memcmp(p, p2, P * sizeof(float)) && !memcmp(o, o2, 2 * P * sizeof(float)),
               "%zu params", P);
    rl_gpu_model_free(m);
    free(p), free(o), free(p2), free(o2);
}

/* What the model asks of a sharded step's gather (set_params_wait): the
 * embedding's end, each layer's end in order, then everything (the final
 * norm and lm_head) -- each before the forward reads that layer, so the
 * forward overlaps the gather's later buckets -- and everything again
 * before an upload or an update writes the weights. */
typedef struct {
    size_t upto[64];
    int n;
} waits;
static void record_wait(void *ctx, size_t upto) {
    waits *w = ctx;
    if (w->n < 64) w->upto[w->n] = upto;
    w->n++;
}
static void test_params_wait(void) {
    const char *name = "forward waits for each layer's gathered weights in order (set_params_wait)";
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"pw", 257, 60, 100, 3, 3, 3, 1, 4};
    rl_model_config c;
    case_cfg(&mc, &c);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total, want[8];
    int nw = 0;
    want[nw++] = lay.embed + (size_t)c.vocab_size * c.hidden_size;
    for (int l = 0; l < c.num_hidden_layers; l++) want[nw++] = lay.layers + (size_t)(l + 1) * lay.layer_size;
    want[nw++] = SIZE_MAX, want[nw++] = SIZE_MAX;
    float *p = randn(P, 0.05), loss = 0;
    int32_t *tok = rand_tokens(4, c.vocab_size);
    waits w = {0};
    rl_err e = {0};
    rl_gpu_model *m = NULL;
    int rc = rl_gpu_model_create(&m, &c, 1, 4, NULL, 0, &e);
    if (!rc) rl_gpu_model_set_params_wait(m, record_wait, &w);
    if (!rc) rc = rl_gpu_model_forward(m, tok, tok, 1, 4, &loss, &e) || rl_gpu_model_upload_params(m, p, &e);
    if (rc) fail_err(name, &e);
    else report(name, w.n == nw && !memcmp(w.upto, want, (size_t)nw * sizeof(size_t)),
                "%d waits (want %d): first %zu, layer 0 up to %zu, last %zu", w.n, nw, w.upto[0], w.upto[1],
                w.upto[w.n > 0 ? (w.n - 1) % 64 : 0]);
    rl_gpu_model_free(m);
    free(p), free(tok);
}

/* train.offload "layers"' GPU half (rl_gpu_options.stream_layers): a model
 * that streams its decoder layers' bf16 weights from the host's memory
 * through a ring of RL_GPU_LAYER_RING buffers computes the resident model's
 * micro-batches bit for bit -- both micro-batches' gradients summed and the
 * loss -- and, after the host's weights change, the new forward's loss
 * (every forward copies anew: a ring that kept the last layers would run
 * them stale), while holding (L - ring) layers' weights less. Each copy
 * asks the host first (ready): at least once per layer per forward. */
static void ready_hook(void *ctx, size_t upto) { (void)upto, ++*(int *)ctx; }
static void test_stream_layers(void) {
    const char *name = "streamed layers: layer weights copied from the host through a ring = resident ones";
    if (!selected(name)) return;
    reseed(name);
    model_case mc = {"sl", 257, 64, 96, 5, 4, 2, 2, 8};
    rl_model_config c;
    case_cfg(&mc, &c);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total, N = (size_t)mc.B * mc.T;
    float *p = randn(P, 0.05), *gr = malloc(P * sizeof(float)), *gs = malloc(P * sizeof(float)), lr[2], ls[2];
    round_bf16(p, P);
    int32_t *tok = rand_tokens(3 * (int)N + 1, c.vocab_size); /* three batches, the last one's targets one on */
    uint16_t *hw = NULL;
    int ready = 0, rc;
    rl_err e = {0};
    rl_gpu_model *mr = NULL, *ms = NULL;
    rl_gpu_options ro = {.host_state = 1}, so = {.host_state = 1, .stream_layers = 1};
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    rc = cudaMallocHost((void **)&hw, P * sizeof(uint16_t)) != cudaSuccess;
    for (size_t i = 0; !rc && i < P; i++) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof u);
        hw[i] = (uint16_t)(u >> 16); /* exact: p is bf16-rounded */
    }
    if (!rc) rc = rl_gpu_model_create(&mr, &c, mc.B, mc.T, &ro, s, &e) || rl_gpu_model_create(&ms, &c, mc.B, mc.T, &so, s, &e);
    if (!rc) rl_gpu_model_set_host_weights(ms, hw, ready_hook, &ready);
    rl_gpu_model *both[2] = {mr, ms};
    float *g[2] = {gr, gs}, *loss[2] = {lr, ls};
    for (int k = 0; k < 2 && !rc; k++) {
        rl_gpu_model *m = both[k];
        float norm;
        rc = rl_gpu_model_upload_params(m, p, &e) || rl_gpu_model_zero_grad(m, &e);
        for (int j = 0; j < 2 && !rc; j++)
            rc = rl_gpu_model_train_micro(m, tok + j * N, tok + j * N + 1, mc.B, mc.T, 0.5f, NULL, NULL, &e);
        if (!rc) rc = rl_gpu_model_step_end(m, &e) || rl_gpu_model_step_stats(m, 0, &loss[k][0], &norm, &e) ||
                      rl_gpu_model_download_grads(m, g[k], &e);
    }
    int per_step = ready;
    /* new weights on the host (and in the resident model): the next forward must read them */
    for (size_t i = 0; i < P; i++) p[i] = rl_gpu_bf16_round(p[i] * 0.5f);
    for (size_t i = 0; i < P; i++) hw[i] = (uint16_t)(hw[i] - (hw[i] & 0x7f80 ? 0x80 : 0)); /* x 0.5, exact */
    for (int k = 0; k < 2 && !rc; k++)
        rc = rl_gpu_model_upload_params(both[k], p, &e) ||
             rl_gpu_model_forward(both[k], tok + 2 * N, tok + 2 * N + 1, mc.B, mc.T, &loss[k][1], &e);
    if (rc) {
        fail_err(name, &e);
    } else {
        size_t differ = 0, less = rl_gpu_model_device_bytes(mr) - rl_gpu_model_device_bytes(ms);
        for (size_t i = 0; i < P; i++) differ += memcmp(&gr[i], &gs[i], sizeof(float)) != 0;
        size_t want = (size_t)(c.num_hidden_layers - RL_GPU_LAYER_RING) * lay.layer_size * sizeof(uint16_t);
        report(name,
               differ == 0 && !memcmp(lr, ls, sizeof lr) && less == want && per_step >= 2 * c.num_hidden_layers,
               "%zu of %zu gradients differ; losses %.9g / %.9g, after new weights %.9g / %.9g; %zu bytes less "
               "(want %zu: %d layers, a ring of %d); %d host waits for a step of 2 micro-batches",
               differ, P, lr[0], ls[0], lr[1], ls[1], less, want, c.num_hidden_layers, RL_GPU_LAYER_RING, per_step);
    }
    rl_gpu_model_free(mr), rl_gpu_model_free(ms);
    if (hw) cudaFreeHost(hw);
    cudaStreamDestroy(s);
    free(p), free(gr), free(gs), free(tok);
}

int main(int argc, char **argv) {
    char dev[256] = "";
    int ndev = rl_gpu_device_count(dev, sizeof dev);
    if (ndev == 0) {
        printf("test-gpu: skipped: no GPU visible (no CUDA device or driver); nothing was run "
               "(make test-gpu-emu checks the kernels on the CPU)\n");
        return 0;
    }
    filter = argc > 1 ? argv[1] : NULL;
    const char *s = getenv("RL_TEST_SEED");
    seed_base = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("test-gpu: %s; seed %llu (RL_TEST_SEED=%llu repeats this run)%s%s\n", dev,
           (unsigned long long)seed_base, (unsigned long long)seed_base, filter ? "; only " : "",
           filter ? filter : "");

    test_embed();
    test_rmsnorm();
    test_rope();
    test_attention();
    test_attention_cudnn();
    test_swiglu();
    test_xent();
    test_gemm();
    test_norm();
    test_adamw();
    test_roundtrip();
    test_params_wait();
    test_stream_layers();
    test_graphs(RL_GPU_ATTN_OWN);
    test_graphs(RL_GPU_ATTN_CUDNN);
    static const model_case cases[] = {
        {"gqa-hd32", 101, 96, 200, 2, 3, 1, 2, 1},
        {"gqa-hd32", 101, 96, 200, 2, 3, 1, 2, 7},
        {"gqa-hd32", 101, 96, 200, 2, 3, 1, 2, 129},
        {"mha-hd20", 257, 60, 100, 2, 3, 3, 3, 33},
        {"gqa-hd64", 1000, 128, 352, 3, 2, 1, 2, 130},
        /* every shape off the vector paths: head_dim 22 (attention's scalar
         * tile loads), hidden 66 (RMSNorm), ffn 90 (SwiGLU), vocab 101
         * (classifier), parameter regions not on multiples of 4 (AdamW) */
        {"odd-hd22", 101, 66, 90, 2, 3, 1, 2, 19},
        /* small, for make test-gpu-emu to run under every emulated
         * architecture: the head dims whose attention tiles fit differently */
        {"arch-hd64", 101, 128, 96, 1, 2, 1, 1, 65},
        {"arch-hd128", 101, 256, 96, 1, 2, 1, 1, 65},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_step(&cases[i], 0, 0, 0, 0);
    test_step(&cases[2], 1, 0, 0, 0);
    test_step(&cases[2], 0, 64, 0, 0); /* 258 rows: chunks of 64 and a ragged 2 */
    test_step(&cases[5], 0, 16, 0, 0); /* odd shapes, 38 rows: 16 + 16 + 6 */
    /* our fused GEMMs against the CPU: tiny (memcheck's case on a GPU), two
     * row tiles with recompute, chunks (the lm_head gradient written, then
     * added), head dim 64 */
    test_step(&cases[1], 0, 0, 0, 1);
    test_step(&cases[2], 1, 0, 0, 1);
    test_step(&cases[2], 0, 64, 0, 1);
    test_step(&cases[4], 0, 0, 0, 1);
    /* dQ by the dK/dV kernel's atomics: three key blocks, T not a multiple
     * of 64; and under each emulated architecture (head dims 64, 128) */
    test_step(&cases[2], 0, 0, 1, 0);
    test_step(&cases[6], 0, 0, 1, 0);
    test_step(&cases[7], 0, 0, 1, 0);
    test_attention_select();
    test_step_cudnn(&cases[1]); /* gqa-hd32 T=7 */
    test_step_cudnn(&cases[6]); /* arch-hd64 T=65 */
    test_fused_gemm(&cases[2]); /* gqa-hd32 T=129: partial row and column tiles */
    test_fused_gemm(&cases[5]); /* odd-hd22: shapes the fused kernels do not take */
    test_plan(RL_GPU_FUSED_OFF);
    test_plan(RL_GPU_FUSED_ON);
    test_train_curve();
    test_gpu_train();

    printf("test-gpu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
