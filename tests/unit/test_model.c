/* Gradient checks. Each layer's backward, and the whole model's, is compared
 * with central finite differences -- in double precision, on the double
 * instantiation of the very same source (cpu_impl.inc), so the tolerance
 * can be tight: with h = 1e-5 the truncation error is O(h^2) ~ 1e-10 and
 * the rounding error O(eps/h) ~ 1e-11, far below the 1e-6 bound used. The
 * float instantiation is then checked against the double one. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/cpu.h"
#include "model/model.h"

#define H_FD 1e-5
#define TOL_NORM 1e-6 /* ||analytic - numeric|| / ||numeric|| */
#define TOL_ELEM 1e-4 /* per element where |numeric| > 1e-6 */

static double *randv(size_t n, uint64_t seed, double scale) {
    rl_rng r;
    rl_rng_seed(&r, seed);
    double *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = rl_rng_normal(&r) * scale;
    return v;
}

static double dotv(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void check_grad(const char *what, const double *analytic, const double *numeric, size_t n) {
    double dn = 0, nn = 0, worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double d = analytic[i] - numeric[i];
        dn += d * d, nn += numeric[i] * numeric[i];
        if (fabs(numeric[i]) > 1e-6) {
            double rel = fabs(d) / fabs(numeric[i]);
            if (rel > worst) worst = rel, worst_i = i;
        }
    }
    double rel = sqrt(dn) / (sqrt(nn) + 1e-30);
    cr_assert(nn > 0, "%s: numeric gradient is all zero (test would prove nothing)", what);
    cr_expect(rel < TOL_NORM, "%s: relative error %.3g >= %g", what, rel, TOL_NORM);
    cr_expect(worst < TOL_ELEM, "%s: element %zu relative error %.3g (analytic %.9g numeric %.9g)",
              what, worst_i, worst, analytic[worst_i], numeric[worst_i]);
}

/* A layer under test: fill out[] from the inputs. The loss is <out, G>. */
typedef void (*fwd_fn)(void *ctx, double *out);
static void fd_check(const char *what, fwd_fn f, void *ctx, double *x, size_t nx, size_t nout,
                     const double *G, const double *analytic) {
    double *out = malloc(nout * sizeof *out), *num = malloc(nx * sizeof *num);
    for (size_t i = 0; i < nx; i++) {
        double keep = x[i];
        x[i] = keep + H_FD;
        f(ctx, out);
        double lp = dotv(out, G, nout);
        x[i] = keep - H_FD;
        f(ctx, out);
        double lm = dotv(out, G, nout);
        x[i] = keep;
        num[i] = (lp - lm) / (2 * H_FD);
    }
    check_grad(what, analytic, num, nx);
    free(out);
    free(num);
}

/* ---- matmul ------------------------------------------------------------------------ */
typedef struct { double *in, *w; int M, N, K; } mm_ctx;
static void mm_f(void *c, double *out) {
    mm_ctx *m = c;
    rl_cpu_matmul_fwd_f64(out, m->in, m->w, m->M, m->N, m->K);
}
Test(model_grad, matmul) {
    mm_ctx c = {.M = 5, .N = 3, .K = 7};
    c.in = randv(35, 1, 1), c.w = randv(21, 2, 1);
    double *G = randv(15, 3, 1), *din = calloc(35, 8), *dw = calloc(21, 8);
    rl_cpu_matmul_bwd_f64(din, dw, G, c.in, c.w, 5, 3, 7, 0, 1);
    fd_check("matmul din", mm_f, &c, c.in, 35, 15, G, din);
    fd_check("matmul dw", mm_f, &c, c.w, 21, 15, G, dw);
    free(c.in), free(c.w), free(G), free(din), free(dw);
}

/* ---- rmsnorm ------------------------------------------------------------------------- */
typedef struct { double *x, *w, *rstd; int N, D; } rn_ctx;
static void rn_f(void *c, double *out) {
    rn_ctx *r = c;
    rl_cpu_rmsnorm_fwd_f64(out, r->rstd, r->x, r->w, r->N, r->D, 1e-5);
}
Test(model_grad, rmsnorm) {
    rn_ctx c = {.N = 4, .D = 6};
    c.x = randv(24, 4, 1), c.w = randv(6, 5, 1), c.rstd = malloc(4 * 8);
    double *G = randv(24, 6, 1), *out = malloc(24 * 8);
    /* dx and dw accumulate (+=): start them non-zero to prove that too */
    double *dx = randv(24, 7, 1), *dw = randv(6, 8, 1), *dx0 = malloc(24 * 8), *dw0 = malloc(6 * 8);
    memcpy(dx0, dx, 24 * 8), memcpy(dw0, dw, 6 * 8);
    rn_f(&c, out);
    rl_cpu_rmsnorm_bwd_f64(dx, dw, G, c.x, c.w, c.rstd, 4, 6, 1);
    for (int i = 0; i < 24; i++) dx[i] -= dx0[i];
    for (int i = 0; i < 6; i++) dw[i] -= dw0[i];
    fd_check("rmsnorm dx", rn_f, &c, c.x, 24, 24, G, dx);
    fd_check("rmsnorm dw", rn_f, &c, c.w, 6, 24, G, dw);
    free(c.x), free(c.w), free(c.rstd), free(G), free(out), free(dx), free(dw), free(dx0), free(dw0);
}

/* ---- rope -------------------------------------------------------------------------------- */
typedef struct { double *x, *rope; int B, T, nh, hd, P; } rp_ctx;
static void rp_f(void *c, double *out) {
    rp_ctx *r = c;
    size_t n = (size_t)r->B * r->T * r->nh * r->hd;
    memcpy(out, r->x, n * 8);
    rl_cpu_rope_fwd_f64(out, r->rope, r->B, r->T, r->nh, r->hd, r->P);
}
Test(model_grad, rope) {
    rl_model_config mc;
    rl_model_config_default(&mc);
    mc.hidden_size = 24, mc.num_attention_heads = 3, mc.num_key_value_heads = 3;
    mc.max_position_embeddings = 9, mc.rope_theta = 500;
    rp_ctx c = {.B = 2, .T = 5, .nh = 3, .hd = 8, .P = 9};
    c.rope = malloc(9 * 8 * 8);
    rl_cpu_rope_table_f64(&mc, c.rope);
    size_t n = 2 * 5 * 3 * 8;
    c.x = randv(n, 9, 1);
    double *G = randv(n, 10, 1), *dx = malloc(n * 8);
    memcpy(dx, G, n * 8);
    rl_cpu_rope_bwd_f64(dx, c.rope, 2, 5, 3, 8, 9);
    fd_check("rope dx", rp_f, &c, c.x, n, n, G, dx);
    /* position 0 is the identity; later positions must actually rotate */
    double y[8], x0[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    memcpy(y, x0, sizeof y);
    rl_cpu_rope_fwd_f64(y, c.rope, 1, 1, 1, 8, 9);
    for (int i = 0; i < 8; i++) cr_expect(y[i] == x0[i], "rope at position 0 changed element %d", i);
    free(c.x), free(c.rope), free(G), free(dx);
}

/* ---- attention (GQA: 4 query heads over 2 kv heads) -------------------------------------- */
typedef struct { double *q, *k, *v, *att; int B, T, H, KV, hd; } at_ctx;
static void at_f(void *c, double *out) {
    at_ctx *a = c;
    rl_cpu_attn_fwd_f64(out, a->att, a->q, a->k, a->v, a->B, a->T, a->H, a->KV, a->hd);
}
Test(model_grad, attention_gqa) {
    at_ctx c = {.B = 2, .T = 5, .H = 4, .KV = 2, .hd = 3};
    size_t nq = 2 * 5 * 4 * 3, nk = 2 * 5 * 2 * 3;
    c.q = randv(nq, 11, 1), c.k = randv(nk, 12, 1), c.v = randv(nk, 13, 1);
    c.att = malloc(2 * 4 * 5 * 5 * 8);
    double *G = randv(nq, 14, 1), *out = malloc(nq * 8);
    double *dq = malloc(nq * 8), *dk = malloc(nk * 8), *dv = malloc(nk * 8), *scr = malloc(2 * 2 * 5 * 5 * 8);
    at_f(&c, out);
    rl_cpu_attn_bwd_f64(dq, dk, dv, scr, G, c.att, c.q, c.k, c.v, 2, 5, 4, 2, 3);
    fd_check("attention dq", at_f, &c, c.q, nq, nq, G, dq);
    fd_check("attention dk", at_f, &c, c.k, nk, nq, G, dk);
    fd_check("attention dv", at_f, &c, c.v, nk, nq, G, dv);
    /* causality: output at t must not depend on inputs at s > t */
    double *o2 = malloc(nq * 8);
    c.v[(size_t)(0 * 5 + 4) * 6 + 0] += 1.0; /* batch 0, position 4, kv head 0 */
    at_f(&c, o2);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 12; i++)
            cr_expect(o2[t * 12 + i] == out[t * 12 + i], "position %d saw the future", t);
    free(c.q), free(c.k), free(c.v), free(c.att), free(G), free(out), free(o2);
    free(dq), free(dk), free(dv), free(scr);
}

/* Past one causal block (the kernels work on blocks of 64 query rows):
 * T = 135 is two whole blocks and a part. The probability and scratch
 * buffers start as NaN, so reading anything the blocks do not write shows
 * in the outputs and gradients. */
Test(model_grad, attention_past_one_causal_block) {
    enum { B = 1, T = 135, H = 2, KV = 1, HD = 4 };
    at_ctx c = {.B = B, .T = T, .H = H, .KV = KV, .hd = HD};
    size_t nq = (size_t)B * T * H * HD, nk = (size_t)B * T * KV * HD, natt = (size_t)B * H * T * T;
    c.q = randv(nq, 21, 1), c.k = randv(nk, 22, 1), c.v = randv(nk, 23, 1);
    c.att = malloc(natt * 8);
    double *G = randv(nq, 24, 1), *out = malloc(nq * 8), *dq = malloc(nq * 8), *dk = malloc(nk * 8),
           *dv = malloc(nk * 8), *scr = malloc((size_t)B * KV * T * T * 8);
    memset(c.att, 0xff, natt * 8), memset(scr, 0xff, (size_t)B * KV * T * T * 8);
    at_f(&c, out);
    rl_cpu_attn_bwd_f64(dq, dk, dv, scr, G, c.att, c.q, c.k, c.v, B, T, H, KV, HD);
    fd_check("attention dq (3 blocks)", at_f, &c, c.q, nq, nq, G, dq);
    fd_check("attention dk (3 blocks)", at_f, &c, c.k, nk, nq, G, dk);
    fd_check("attention dv (3 blocks)", at_f, &c, c.v, nk, nq, G, dv);
    /* the last position attends to every key, uniformly when all scores tie */
    for (size_t i = 0; i < nk; i++) c.k[i] = 0;
    at_f(&c, out);
    for (int d = 0; d < HD; d++) {
        double mean = 0;
        for (int s = 0; s < T; s++) mean += c.v[(size_t)s * HD + d] / T;
        cr_expect(fabs(out[(size_t)(T - 1) * H * HD + d] - mean) < 1e-12, "position %d: %g, mean of v %g", T - 1,
                  out[(size_t)(T - 1) * H * HD + d], mean);
    }
    free(c.q), free(c.k), free(c.v), free(c.att), free(G), free(out), free(dq), free(dk), free(dv), free(scr);
}

/* ---- swiglu ------------------------------------------------------------------------------ */
typedef struct { double *g, *u; size_t n; } sw_ctx;
static void sw_f(void *c, double *out) {
    sw_ctx *s = c;
    rl_cpu_swiglu_fwd_f64(out, s->g, s->u, s->n);
}
Test(model_grad, swiglu) {
    sw_ctx c = {.n = 20};
    c.g = randv(20, 15, 2), c.u = randv(20, 16, 1);
    double *G = randv(20, 17, 1), *dg = malloc(160), *du = malloc(160);
    rl_cpu_swiglu_bwd_f64(dg, du, G, c.g, c.u, 20);
    fd_check("swiglu dgate", sw_f, &c, c.g, 20, 20, G, dg);
    fd_check("swiglu dup", sw_f, &c, c.u, 20, 20, G, du);
    free(c.g), free(c.u), free(G), free(dg), free(du);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */
typedef struct { double *l, *losses; int32_t *t; int N, V; } xe_ctx;
static void xe_f(void *c, double *out) {
    xe_ctx *x = c;
    out[0] = rl_cpu_xent_fwd_f64(x->losses, x->l, x->t, x->N, x->V);
}
Test(model_grad, cross_entropy) {
    int32_t t[4] = {0, 3, 6, 3};
    xe_ctx c = {.N = 4, .V = 7, .t = t};
    c.l = randv(28, 18, 3), c.losses = malloc(4 * 8);
    double one = 1, *d = malloc(28 * 8);
    memcpy(d, c.l, 28 * 8);
    rl_cpu_xent_bwd_f64(d, t, 4, 7, 1.0 / 4);
    fd_check("cross-entropy dlogits", xe_f, &c, c.l, 28, 1, &one, d);
    /* hand value: uniform logits give log(V) */
    double z[7] = {0};
    int32_t t0 = 2;
    cr_expect(fabs(rl_cpu_xent_fwd_f64(c.losses, z, &t0, 1, 7) - log(7.0)) < 1e-12);
    free(c.l), free(c.losses), free(d);
}

/* ---- whole model, 2 layers, GQA ------------------------------------------------------------ */
static void tiny_config(rl_model_config *c) {
    rl_model_config_default(c);
    c->hidden_size = 8, c->intermediate_size = 12, c->num_hidden_layers = 2;
    c->num_attention_heads = 4, c->num_key_value_heads = 2, c->vocab_size = 11;
    c->max_position_embeddings = 8, c->rope_theta = 100, c->initializer_range = 0.3;
}

typedef struct {
    rl_model_config c;
    rl_param_layout p;
    double *params, *acts, *rope, *scratch, *grads;
    int32_t tok[12], tgt[12];
    int B, T;
} whole;

static void whole_init(whole *w) {
    tiny_config(&w->c);
    rl_param_layout_init(&w->p, &w->c);
    w->B = 2, w->T = 6;
    rl_act_layout al;
    rl_act_layout_init(&al, &w->c, w->B, w->T);
    rl_scratch_layout sl;
    rl_scratch_layout_init(&sl, &w->c, w->B, w->T);
    w->acts = malloc(al.total * 8), w->scratch = malloc(sl.total * 8);
    w->rope = malloc((size_t)8 * 2 * 8);
    rl_cpu_rope_table_f64(&w->c, w->rope);
    float *pf = malloc(w->p.total * sizeof(float));
    rl_model_init_params(&w->c, pf, 42);
    w->params = malloc(w->p.total * 8), w->grads = calloc(w->p.total, 8);
    /* norms are initialised to exactly 1; perturb them so their gradients
     * are exercised away from the identity */
    rl_rng r;
    rl_rng_seed(&r, 7);
    for (size_t i = 0; i < w->p.total; i++) w->params[i] = pf[i] + 0.1 * rl_rng_normal(&r);
    free(pf);
    for (int i = 0; i < 12; i++) w->tok[i] = (int32_t)(rl_rng_u64(&r) % 11), w->tgt[i] = (int32_t)(rl_rng_u64(&r) % 11);
}

static void whole_free(whole *w) {
    free(w->acts), free(w->scratch), free(w->rope), free(w->params), free(w->grads);
}

static double whole_loss(whole *w) {
    return rl_cpu_forward_f64(&w->c, &w->p, w->params, w->acts, w->rope, w->tok, w->tgt, w->B, w->T);
}

typedef struct { size_t first, last; int calls; int monotone; } hook_log;
static void record_hook(void *ctx, size_t off) {
    hook_log *h = ctx;
    if (h->calls > 0 && off >= h->last) h->monotone = 0;
    if (h->calls == 0) h->first = off;
    h->last = off;
    h->calls++;
}

Test(model_grad, whole_model_2layer_gqa) {
    whole w;
    whole_init(&w);
    whole_loss(&w);
    hook_log hl = {.monotone = 1};
    rl_cpu_backward_f64(&w.c, &w.p, w.params, w.grads, w.acts, w.scratch, w.rope, w.tok, w.tgt,
                        w.B, w.T, 1.0, false, record_hook, &hl);
    /* backward begins (the total), lm_head, final norm, each layer, the embedding */
    cr_expect(hl.monotone && hl.first == w.p.total && hl.last == 0 && hl.calls == w.c.num_hidden_layers + 4,
              "grad-ready watermarks: %d calls, first %zu of %zu, last %zu, monotone %d", hl.calls, hl.first,
              w.p.total, hl.last, hl.monotone);
    double *num = malloc(w.p.total * 8);
    for (size_t i = 0; i < w.p.total; i++) {
        double keep = w.params[i];
        w.params[i] = keep + H_FD;
        double lp = whole_loss(&w);
        w.params[i] = keep - H_FD;
        double lm = whole_loss(&w);
        w.params[i] = keep;
        num[i] = (lp - lm) / (2 * H_FD);
    }
    /* per tensor, so a failure names the tensor */
    for (int t = 0; t < rl_model_n_tensors(&w.c); t++) {
        rl_tensor_info ti;
        rl_model_tensor(&w.c, t, &ti);
        check_grad(ti.name, w.grads + ti.offset, num + ti.offset, ti.numel);
    }
    free(num);
    whole_free(&w);
}

/* The float model (what trains) against the double reference on the same weights. */
Test(model_grad, f32_matches_f64) {
    whole w;
    whole_init(&w);
    double l64 = whole_loss(&w);
    rl_cpu_backward_f64(&w.c, &w.p, w.params, w.grads, w.acts, w.scratch, w.rope, w.tok, w.tgt,
                        w.B, w.T, 1.0, false, NULL, NULL);
    rl_model m;
    rl_err e;
    cr_assert_eq(rl_model_create(&m, &w.c, w.B, w.T, &e), 0, "%s", e.msg);
    for (size_t i = 0; i < w.p.total; i++) m.params[i] = (float)w.params[i];
    float l32;
    cr_assert_eq(rl_model_forward(&m, w.tok, w.tgt, w.B, w.T, &l32, &e), 0, "%s", e.msg);
    rl_model_backward(&m, 1.0f, false, NULL, NULL);
    cr_expect(fabs(l32 - l64) / l64 < 1e-6, "f32 loss %.9g vs f64 %.9g", l32, l64);
    for (int t = 0; t < rl_model_n_tensors(&w.c); t++) {
        rl_tensor_info ti;
        rl_model_tensor(&w.c, t, &ti);
        double dn = 0, nn = 0;
        for (size_t i = 0; i < ti.numel; i++) {
            double d = m.grads[ti.offset + i] - w.grads[ti.offset + i];
            dn += d * d, nn += w.grads[ti.offset + i] * w.grads[ti.offset + i];
        }
        /* fp32 has ~6e-8 unit roundoff; a few dozen operations deep, 1e-5 is ample */
        cr_expect(sqrt(dn / nn) < 1e-5, "%s: f32 vs f64 gradient rel error %.3g", ti.name, sqrt(dn / nn));
    }
    rl_model_destroy(&m);
    whole_free(&w);
}

/* At each grad-ready callback, everything from the offset on must already
 * hold its final value: DDP will start reducing those bytes right then. */
typedef struct { rl_model *m; float *snap; } snap_ctx;
static void snap_hook(void *ctx, size_t off) {
    snap_ctx *s = ctx;
    memcpy(s->snap + off, s->m->grads + off, (s->m->lay.total - off) * sizeof(float));
}
Test(model, grad_ready_hook_promises_final_values) {
    rl_model_config c;
    tiny_config(&c);
    rl_model m;
    rl_err e;
    cr_assert_eq(rl_model_create(&m, &c, 2, 6, &e), 0);
    rl_model_init_params(&c, m.params, 3);
    int32_t tok[12], tgt[12];
    for (int i = 0; i < 12; i++) tok[i] = i % 11, tgt[i] = (i * 7 + 1) % 11;
    float *snap = calloc(m.lay.total, sizeof(float));
    snap_ctx s = {&m, snap};
    cr_assert_eq(rl_model_forward(&m, tok, tgt, 2, 6, NULL, &e), 0);
    rl_model_backward(&m, 1.0f, false, snap_hook, &s);
    /* snapshots taken early (at high offsets) must equal the final grads */
    cr_expect(memcmp(snap, m.grads, m.lay.total * sizeof(float)) == 0);
    free(snap);
    rl_model_destroy(&m);
}

/* two default models for 4 x 32 tokens with the same weights */
static void twin_models(rl_model *a, rl_model *b, uint64_t seed) {
    rl_model_config c;
    rl_model_config_default(&c);
    rl_err e;
    cr_assert_eq(rl_model_create(a, &c, 4, 32, &e), 0);
    cr_assert_eq(rl_model_create(b, &c, 4, 32, &e), 0);
    rl_model_init_params(&c, a->params, seed);
    rl_model_init_params(&c, b->params, seed);
}

/* A backward that overwrites (a step's first micro-batch, no zero_grad
 * before it) writes every gradient element without reading the old one:
 * from a buffer of NaN it gives bit for bit what adding to zeros gives, and
 * a second pass then adds as before. */
Test(model, an_overwriting_backward_writes_every_gradient) {
    rl_model a, b;
    rl_err e;
    twin_models(&a, &b, 12);
    int32_t tok[128], tgt[128];
    for (int i = 0; i < 128; i++) tok[i] = (i * 29) % 200, tgt[i] = (i * 13 + 3) % 257; /* 57 rows unseen */
    size_t n = a.lay.total;
    for (size_t i = 0; i < n; i++) a.grads[i] = NAN;
    rl_model_zero_grad(&b);
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(rl_model_forward(&a, tok, tgt, 4, 32, NULL, &e), 0);
        cr_assert_eq(rl_model_forward(&b, tok, tgt, 4, 32, NULL, &e), 0);
        rl_model_backward(&a, 0.5f, pass == 0, NULL, NULL);
        rl_model_backward(&b, 0.5f, false, NULL, NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(&a.grads[i], &b.grads[i], sizeof(float)) != 0;
        cr_expect(bad == 0, "pass %d: %zu of %zu gradients differ from the accumulating backward's", pass,
                  bad, n);
    }
    rl_model_destroy(&a);
    rl_model_destroy(&b);
}

Test(model, forward_backward_bit_identical) {
    rl_model a, b;
    rl_err e;
    twin_models(&a, &b, 11);
    int32_t tok[128], tgt[128];
    for (int i = 0; i < 128; i++) tok[i] = (i * 31) % 257, tgt[i] = (i * 17 + 5) % 257;
    float la, lb;
    rl_model_forward(&a, tok, tgt, 4, 32, &la, &e);
    rl_model_forward(&b, tok, tgt, 4, 32, &lb, &e);
    rl_model_backward(&a, 1.0f, false, NULL, NULL);
    rl_model_backward(&b, 1.0f, false, NULL, NULL);
    cr_expect(memcmp(&la, &lb, sizeof la) == 0);
    cr_expect(memcmp(a.grads, b.grads, a.lay.total * sizeof(float)) == 0);
    /* a fresh model at init predicts roughly uniformly: loss ~ log(V) */
    cr_expect(fabs(la - log(257.0)) < 0.1, "initial loss %.4f vs log(257) %.4f", la, log(257.0));
    rl_model_destroy(&a);
    rl_model_destroy(&b);
}

Test(model, config_validation_names_the_field) {
    rl_model_config c;
    rl_model_config_default(&c);
    rl_err e;
    c.num_attention_heads = 3;
    cr_expect_eq(rl_model_config_validate(&c, "cfg.json: model", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "num_attention_heads") != NULL, "%s", e.msg);
    rl_model_config_default(&c);
    c.num_key_value_heads = 3;
    cr_expect_eq(rl_model_config_validate(&c, "cfg.json: model", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "num_key_value_heads") != NULL, "%s", e.msg);
}

Test(model, tensor_table_covers_buffer_exactly) {
    rl_model_config c;
    tiny_config(&c);
    rl_param_layout p;
    rl_param_layout_init(&p, &c);
    size_t next = 0;
    for (int i = 0; i < rl_model_n_tensors(&c); i++) {
        rl_tensor_info t;
        rl_model_tensor(&c, i, &t);
        cr_expect_eq(t.offset, next, "%s at %zu, expected %zu", t.name, t.offset, next);
        next = t.offset + t.numel;
    }
    cr_expect_eq(next, p.total);
}

/* ---- the float model's GEMM (sgemm.c) ----------------------------------------------
 * Checked against a double-precision reference over every transpose pair,
 * with shapes past each blocking edge (K past KC = 256, M past MC = 128, N
 * past NC = 1024, and sizes that are no multiple of the 8 x 32 tile), leading
 * dimensions wider than the matrices (the columns between stay untouched),
 * alpha != 1, and beta 0 over a C of NaN (not read, BLAS's rule). Whichever
 * kernel this CPU runs is the one checked; the log says which. */
typedef struct gemm_case {
    int M, N, K;
} gemm_case;

static float *randf(size_t n, uint64_t seed) {
    rl_rng r;
    rl_rng_seed(&r, seed);
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)rl_rng_normal(&r);
    return v;
}

/* op(X)(i, k) for a row-major X with leading dimension ld */
static double at(const float *X, int ld, bool trans, int i, int k) {
    return trans ? X[(size_t)k * ld + i] : X[(size_t)i * ld + k];
}

static int gemm_check(const gemm_case *g, bool ta, bool tb, float alpha, float beta) {
    int M = g->M, N = g->N, K = g->K, pad = 3;
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    float *A = randf((size_t)(ta ? K : M) * lda, 1), *B = randf((size_t)(tb ? N : K) * ldb, 2);
    float *C = randf((size_t)M * ldc, 3), *C0 = malloc(sizeof(float) * M * ldc);
    if (beta == 0)
        for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = NAN;
    memcpy(C0, C, sizeof(float) * M * ldc);
    rl_cpu_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                 ldb, beta, C, ldc);
    int bad = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
            float got = C[(size_t)i * ldc + j], old = C0[(size_t)i * ldc + j];
            if (j >= N) { /* past the matrix: must be left alone */
                bad += memcmp(&got, &old, sizeof got) != 0;
                continue;
            }
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = at(A, lda, ta, i, k) * at(B, ldb, tb, k, j);
                ref += p, mag += fabs(p);
            }
            double cb = beta == 0 ? 0 : (double)beta * old;
            ref = alpha * ref + cb, mag = fabs(alpha) * mag + fabs(cb);
            /* float sums of K products: each step rounds by at most eps */
            if (!(fabs(got - ref) <= 2.0 * (K + 2) * FLT_EPSILON * mag + 1e-30) && bad++ < 3)
                cr_log_error("%dx%dx%d %c%c alpha %g beta %g: C[%d][%d] = %.9g, reference %.9g", M, N, K,
                             ta ? 'T' : 'N', tb ? 'T' : 'N', alpha, beta, i, j, got, ref);
        }
    }
    free(A), free(B), free(C), free(C0);
    return bad;
}

Test(model, sgemm_matches_a_double_reference) {
    const char *own = rl_cpu_sgemm_kernels();
    cr_log_info("sgemm: %s", own ? own : "OpenBLAS (no AVX-512 on this CPU)");
    const gemm_case cases[] = {{1, 1, 1}, {7, 33, 5}, {8, 32, 256}, {37, 70, 300}, {130, 1030, 17}, {64, 64, 513}, {5, 63, 9}};
    const float alphas[] = {1, 0.125f}, betas[] = {0, 1, -0.5f};
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 4; t++)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++) bad += gemm_check(&cases[c], t & 1, t & 2, alphas[a], betas[b]);
    cr_expect(bad == 0, "%d elements wrong", bad);
}

/* The model splits C's rows or columns between its threads (gemm_threads in
 * cpu_impl.inc) and promises results independent of how: rows, or columns,
 * computed in two calls must be the very bits of one call. */
Test(model, sgemm_results_do_not_depend_on_the_split) {
    int M = 50, N = 70, K = 300, cut = 13, cutc = 40;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = ta ? M : K, ldb = tb ? K : N;
        float *A = randf((size_t)M * K, 4), *B = randf((size_t)N * K, 5);
        float *one = calloc((size_t)M * N, sizeof(float)), *two = calloc((size_t)M * N, sizeof(float));
        enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
        rl_cpu_sgemm(TA, TB, M, N, K, 1, A, lda, B, ldb, 0, one, N);
        rl_cpu_sgemm(TA, TB, cut, N, K, 1, A, lda, B, ldb, 0, two, N);
        rl_cpu_sgemm(TA, TB, M - cut, N, K, 1, ta ? A + cut : A + (size_t)cut * lda, lda, B, ldb, 0,
                     two + (size_t)cut * N, N);
        cr_expect(memcmp(one, two, sizeof(float) * M * N) == 0, "%c%c: rows differ when split at %d",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', cut);
        rl_cpu_sgemm(TA, TB, M, cutc, K, 1, A, lda, B, ldb, 0, two, N);
        rl_cpu_sgemm(TA, TB, M, N - cutc, K, 1, A, lda, tb ? B + (size_t)cutc * ldb : B + cutc, ldb, 0,
                     two + cutc, N);
        cr_expect(memcmp(one, two, sizeof(float) * M * N) == 0, "%c%c: columns differ when split at %d",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', cutc);
        free(A), free(B), free(one), free(two);
    }
}
