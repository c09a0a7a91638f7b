// Attention through cuDNN 9's graph backend API (issue 13): the causal GQA
// SDPA forward and backward as operation graphs of matmuls, pointwise ops
// and reductions -- the pattern cuDNN's fused flash-attention engines take
// -- beside our own kernels (gpu_attention.cu); the model picks one at
// creation (rl_gpu_attn_select, train.attention auto|cudnn|own).
//
// Why a graph and not the SDPA operation descriptor: the 9.x headers'
// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR has no causal mask, and the
// cuDNN that PyTorch's wheels ship predates it; the composed graph is what
// every cuDNN 9 runs.
//
// Layout. qkv rows are [q heads | k heads | v heads], un-rotated. cuDNN does
// not apply our RoPE, so q and k are rotated into `qk` (rows of (H + KV) hd)
// first; V is read in place from qkv. Tensors are BHSD in logical dims with
// the strides of the packed rows, so nothing else is copied: O goes straight
// into out [B*T, H*hd], dQ|dK|dV straight into dqkv, then dq and dk are
// rotated back (the inverse rotation is the transpose: the chain rule
// through an orthogonal map). Stats (the softmax's log-sum-exp, natural log,
// scale included) go into the model's lse buffer [B*H, T]: the same size as
// our kernels' log2 lse, read only by the same backend's backward.
//
// libcudnn.so.9 is dlopen'ed, so a machine without cuDNN still runs (our
// kernels); the emulated build links tests/gpu/emu/fake_cudnn.cpp instead.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <vector>

#include <cudnn_graph.h>

#ifndef RL_KERNEL_EMU
#include <dlfcn.h>
#endif

#include "kernels/gpu_internal.cuh"

// ---- the library --------------------------------------------------------------------------------
#define RL_CUDNN_API(X)                                                                            \
    X(cudnnGetVersion)                                                                             \
    X(cudnnGetErrorString)                                                                         \
    X(cudnnCreate)                                                                                 \
    X(cudnnDestroy)                                                                                \
    X(cudnnSetStream)                                                                              \
    X(cudnnBackendCreateDescriptor)                                                                \
    X(cudnnBackendDestroyDescriptor)                                                               \
    X(cudnnBackendSetAttribute)                                                                    \
    X(cudnnBackendGetAttribute)                                                                    \
    X(cudnnBackendFinalize)                                                                        \
    X(cudnnBackendExecute)

struct cudnn_api {
#define RL_CUDNN_FIELD(f) decltype(&::f) f;
    RL_CUDNN_API(RL_CUDNN_FIELD)
#undef RL_CUDNN_FIELD
};
static cudnn_api dnn;

#ifdef RL_KERNEL_EMU
// The fake (tests/gpu/emu/fake_cudnn.cpp) is linked in; RL_EMU_CUDNN=absent
// makes it answer as a machine without libcudnn would. Asked every time, so
// a test can switch it between models.
extern "C" int rl_emu_cudnn_present(void);
static int cudnn_load(rl_err *e) {
    if (!rl_emu_cudnn_present())
        return rl_errf(e, RL_EIO, "cuDNN: dlopen(libcudnn.so.9): not found (emulated)");
#define RL_CUDNN_SET(f) dnn.f = &::f;
    RL_CUDNN_API(RL_CUDNN_SET)
#undef RL_CUDNN_SET
    return RL_OK;
}
#else
// Once per process; every later call gets the same answer.
static std::once_flag dnn_once;
static char dnn_load_fail[256];
static void cudnn_open(void) {
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dnn_load_fail, sizeof dnn_load_fail, "cuDNN: dlopen(libcudnn.so.9): %s",
                 dlerror());
        return;
    }
#define RL_CUDNN_SYM(f)                                                                            \
    if (!(dnn.f = (decltype(&::f))dlsym(h, #f))) {                                                 \
        snprintf(dnn_load_fail, sizeof dnn_load_fail, "cuDNN: libcudnn.so.9 has no %s", #f);       \
        return;                                                                                    \
    }
    RL_CUDNN_API(RL_CUDNN_SYM)
#undef RL_CUDNN_SYM
    size_t v = dnn.cudnnGetVersion();
    if (v < 90000) // the backend graph of these attributes is cuDNN 9's
        snprintf(dnn_load_fail, sizeof dnn_load_fail,
                 "cuDNN: libcudnn.so.9 reports version %zu, need 9.x", v);
}
static int cudnn_load(rl_err *e) {
    std::call_once(dnn_once, cudnn_open);
    if (dnn_load_fail[0]) return rl_errf(e, RL_EIO, "%s", dnn_load_fail);
    return RL_OK;
}
#endif

// ---- graph building -----------------------------------------------------------------------------
typedef cudnnBackendDescriptor_t desc_t;
typedef std::vector<int64_t> dims_t;

// Collects descriptors (all destroyed with the plan that needs them) and
// the first failing call, so a graph reads as a list of operations and is
// checked once at the end.
struct graph_b {
    std::vector<desc_t> keep, ops;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    const char *failed = "";
    char failed_buf[64];
    int64_t vuid = 1000; // virtual tensors' ids, above the variant pack's

    desc_t make(cudnnBackendDescriptorType_t t) {
        desc_t d = NULL;
        if (st) return NULL;
        if ((st = dnn.cudnnBackendCreateDescriptor(t, &d))) {
            failed = "cudnnBackendCreateDescriptor";
            return NULL;
        }
        keep.push_back(d);
        return d;
    }
    void set(desc_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
             const void *v) {
        if (!st && (st = dnn.cudnnBackendSetAttribute(d, a, t, n, v))) {
            snprintf(failed_buf, sizeof failed_buf, "cudnnBackendSetAttribute(attribute %d)", (int)a);
            failed = failed_buf;
        }
    }
    void setd(desc_t d, cudnnBackendAttributeName_t a, desc_t v) {
        set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
    }
    void fin(desc_t d) {
        if (!st && (st = dnn.cudnnBackendFinalize(d))) failed = "cudnnBackendFinalize";
    }
    desc_t tensor(int64_t uid, cudnnDataType_t dt, const dims_t &dim, const dims_t &str,
                  bool virt = false, bool by_value = false) {
        desc_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        int64_t align = 16;
        set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
        set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dim.size(), dim.data());
        set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)str.size(), str.data());
        set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
        if (virt) set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
        if (by_value) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
        fin(d);
        return d;
    }
    // A virtual intermediate, packed row-major (strides are a layout hint
    // cuDNN may replace).
    desc_t virt(cudnnDataType_t dt, const dims_t &dim) {
        dims_t str(dim.size(), 1);
        for (int i = (int)dim.size() - 2; i >= 0; i--) str[i] = str[i + 1] * dim[i + 1];
        return tensor(vuid++, dt, dim, str, true);
    }
    void matmul(desc_t a, desc_t b, desc_t c) {
        desc_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        fin(m);
        desc_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
        fin(op);
        ops.push_back(op);
    }
    // y = mode(x[, b]); t: BINARY_SELECT's condition; axis: GEN_INDEX's.
    void pw(cudnnPointwiseMode_t mode, desc_t x, desc_t b, desc_t y, desc_t t = NULL,
            int64_t axis = -1) {
        desc_t p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        set(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
        if (axis >= 0) set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        fin(p);
        desc_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
        if (b) setd(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
        if (t) setd(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
        fin(op);
        ops.push_back(op);
    }
    // y = op over the dims where y's extent is smaller (1, or H -> KV: the
    // sum over a GQA group of consecutive heads)
    void reduce(cudnnReduceTensorOp_t r, desc_t x, desc_t y) {
        desc_t d = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
        set(d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        fin(d);
        desc_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, d);
        fin(op);
        ops.push_back(op);
    }
    // y: x's elements under other dims/strides (a transpose of a virtual)
    void reshape(desc_t x, desc_t y) {
        desc_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
        fin(op);
        ops.push_back(op);
    }
    void destroy() {
        for (desc_t d : keep) dnn.cudnnBackendDestroyDescriptor(d);
        keep.clear(), ops.clear();
    }
};

// Variant-pack ids: a tensor's uid is its slot in the pointer array
// (transposed views of one buffer have their own uid and the same pointer).
enum {
    U_Q = 1,
    U_KT,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_NEG, // forward
    U_K,
    U_VT,
    U_DO,
    U_DSUM,
    U_DQ,
    U_DK,
    U_DV, // backward (+ the above)
    U_N
};

struct attn_shape {
    int64_t B, T, H, KV, hd, ldq, ldv; // ldq: rotated q|k rows; ldv: qkv rows
};
// [b, h, t, d] of a head block in rows of ld elements
static dims_t bhsd(const attn_shape &s, int64_t ld) { return {s.T * ld, s.hd, ld, 1}; }

// S = scale Q K^T with the causal mask: the part forward and backward
// share. *scale: the by-value scale tensor, for the backward's dS.
static desc_t scores(graph_b &g, const attn_shape &s, desc_t q, desc_t kt, desc_t *scale_out) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T}, one = {1, 1, 1, 1};
    desc_t scale = g.tensor(U_SCALE, CUDNN_DATA_FLOAT, one, one, false, true);
    *scale_out = scale;
    desc_t neg = g.tensor(U_NEG, CUDNN_DATA_FLOAT, one, one, false, true);
    desc_t s0 = g.virt(CUDNN_DATA_FLOAT, bhtt), s1 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t row = g.virt(CUDNN_DATA_INT32, bhtt), col = g.virt(CUDNN_DATA_INT32, bhtt);
    desc_t keep = g.virt(CUDNN_DATA_BOOLEAN, bhtt), s2 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.matmul(q, kt, s0);
    g.pw(CUDNN_POINTWISE_MUL, s0, scale, s1);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, s1, NULL, row, NULL, 2);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, s1, NULL, col, NULL, 3);
    g.pw(CUDNN_POINTWISE_CMP_GE, row, col, keep); // key position <= query position
    g.pw(CUDNN_POINTWISE_BINARY_SELECT, s1, neg, s2, keep);
    return s2;
}

static void fwd_graph(graph_b &g, const attn_shape &s) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T}, bht1 = {s.B, s.H, s.T, 1};
    desc_t q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.hd}, bhsd(s, s.ldq));
    desc_t kt =
        g.tensor(U_KT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, {s.T * s.ldq, s.hd, 1, s.ldq});
    desc_t v = g.tensor(U_V, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.T, s.hd}, bhsd(s, s.ldv));
    desc_t o = g.tensor(U_O, CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.hd},
                        {s.T * s.H * s.hd, s.hd, s.H * s.hd, 1});
    desc_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, bht1, {s.H * s.T, s.T, 1, 1});
    desc_t scale;
    desc_t sm = scores(g, s, q, kt, &scale);
    desc_t mx = g.virt(CUDNN_DATA_FLOAT, bht1), d = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t ex = g.virt(CUDNN_DATA_FLOAT, bhtt), z = g.virt(CUDNN_DATA_FLOAT, bht1);
    desc_t lz = g.virt(CUDNN_DATA_FLOAT, bht1), p = g.virt(CUDNN_DATA_BFLOAT16, bhtt);
    g.reduce(CUDNN_REDUCE_TENSOR_MAX, sm, mx);
    g.pw(CUDNN_POINTWISE_SUB, sm, mx, d);
    g.pw(CUDNN_POINTWISE_EXP, d, NULL, ex);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, ex, z);
    g.pw(CUDNN_POINTWISE_LOG, z, NULL, lz);
    g.pw(CUDNN_POINTWISE_ADD, mx, lz, stats); // lse = max + log(sum exp(s - max))
    g.pw(CUDNN_POINTWISE_DIV, ex, z, p);      // P in bf16 for P V, as our kernels round it
    g.matmul(p, v, o);
}

// dP = dO V^T, D = rowsum(dO o O), dS = scale P (dP - D); dQ = dS K,
// dK = dS^T Q, dV = P^T dO, each of dK, dV summed over the GQA group
// (a reduction H -> KV) when H > KV.
static void bwd_graph(graph_b &g, const attn_shape &s) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T}, bhts = bhtt, bht1 = {s.B, s.H, s.T, 1};
    const dims_t bhtd = {s.B, s.H, s.T, s.hd}, bktd = {s.B, s.KV, s.T, s.hd};
    const int64_t ldo = s.H * s.hd;
    desc_t q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, bhtd, bhsd(s, s.ldq));
    desc_t kt =
        g.tensor(U_KT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, {s.T * s.ldq, s.hd, 1, s.ldq});
    desc_t k = g.tensor(U_K, CUDNN_DATA_BFLOAT16, bktd, bhsd(s, s.ldq));
    desc_t vt =
        g.tensor(U_VT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, {s.T * s.ldv, s.hd, 1, s.ldv});
    desc_t o = g.tensor(U_O, CUDNN_DATA_BFLOAT16, bhtd, {s.T * ldo, s.hd, ldo, 1});
    desc_t dO = g.tensor(U_DO, CUDNN_DATA_BFLOAT16, bhtd, {s.T * ldo, s.hd, ldo, 1});
    desc_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, bht1, {s.H * s.T, s.T, 1, 1});
    desc_t dsum = g.tensor(U_DSUM, CUDNN_DATA_FLOAT, bht1, {s.H * s.T, s.T, 1, 1});
    desc_t dq = g.tensor(U_DQ, CUDNN_DATA_BFLOAT16, bhtd, bhsd(s, s.ldv));
    desc_t dk = g.tensor(U_DK, CUDNN_DATA_BFLOAT16, bktd, bhsd(s, s.ldv));
    desc_t dv = g.tensor(U_DV, CUDNN_DATA_BFLOAT16, bktd, bhsd(s, s.ldv));
    desc_t sc;
    desc_t sm = scores(g, s, q, kt, &sc);
    desc_t d0 = g.virt(CUDNN_DATA_FLOAT, bhtt), p = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t pb = g.virt(CUDNN_DATA_BFLOAT16, bhtt);
    desc_t pt =
        g.tensor(g.vuid++, CUDNN_DATA_BFLOAT16, bhts, {s.H * s.T * s.T, s.T * s.T, 1, s.T}, true);
    g.pw(CUDNN_POINTWISE_SUB, sm, stats, d0);
    g.pw(CUDNN_POINTWISE_EXP, d0, NULL, p); // the forward's P, from its lse
    g.pw(CUDNN_POINTWISE_IDENTITY, p, NULL, pb);
    g.reshape(pb, pt);
    bool group = s.H != s.KV; // dK, dV per query head first, then summed per group
    desc_t dvh = group ? g.virt(CUDNN_DATA_FLOAT, bhtd) : dv;
    g.matmul(pt, dO, dvh);
    if (group) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
    desc_t dp = g.virt(CUDNN_DATA_FLOAT, bhtt), oo = g.virt(CUDNN_DATA_FLOAT, bhtd);
    g.matmul(dO, vt, dp);
    g.pw(CUDNN_POINTWISE_MUL, dO, o, oo);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, oo, dsum);
    desc_t t0 = g.virt(CUDNN_DATA_FLOAT, bhtt), t1 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t ds = g.virt(CUDNN_DATA_BFLOAT16, bhtt);
    g.pw(CUDNN_POINTWISE_SUB, dp, dsum, t0);
    g.pw(CUDNN_POINTWISE_MUL, p, t0, t1);
    g.pw(CUDNN_POINTWISE_MUL, t1, sc, ds);
    g.matmul(ds, k, dq);
    desc_t dst =
        g.tensor(g.vuid++, CUDNN_DATA_BFLOAT16, bhts, {s.H * s.T * s.T, s.T * s.T, 1, s.T}, true);
    g.reshape(ds, dst);
    desc_t dkh = group ? g.virt(CUDNN_DATA_FLOAT, bhtd) : dk;
    g.matmul(dst, q, dkh);
    if (group) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
}

// ---- plans --------------------------------------------------------------------------------------
static int dnn_fail(rl_err *e, cudnnStatus_t st, const char *call, const char *what) {
    return rl_errf(e, RL_EIO, "cuDNN: %s (%s): %s (%d)", call, what, dnn.cudnnGetErrorString(st),
                   (int)st);
}

// The heuristic's (CUDNN_HEUR_MODE_A) engine configurations in its order;
// the first whose plan finalizes is kept. deterministic: engines noted
// CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are passed over (the backward's
// split-K dQ accumulates with atomics in some engines; our training is
// bit-reproducible and stays so).
static int finish_plan(graph_b &g, cudnnHandle_t h, bool deterministic, const char *what,
                       desc_t *plan, int64_t *ws, rl_err *e) {
    desc_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          (int64_t)g.ops.size(), g.ops.data());
    g.fin(graph);
    desc_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    g.setd(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    g.fin(heur);
    if (g.st) return dnn_fail(e, g.st, g.failed, what);
    int64_t n = 0;
    cudnnStatus_t st = dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL);
    if (st) return dnn_fail(e, st, "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)", what);
    if (n > 16) n = 16;
    desc_t cfg[16];
    for (int64_t i = 0; i < n; i++) cfg[i] = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g.st) return dnn_fail(e, g.st, g.failed, what);
    st = dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, cfg);
    if (st) return dnn_fail(e, st, "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)", what);
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < n; i++) {
        if (deterministic) {
            desc_t eng = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
            cudnnBackendNumericalNote_t notes[16];
            int64_t nn = 0;
            if (g.st) return dnn_fail(e, g.st, g.failed, what);
            st = dnn.cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &nn, &eng);
            if (!st)
                st = dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                                  CUDNN_TYPE_NUMERICAL_NOTE, 16, &nn, notes);
            if (st) return dnn_fail(e, st, "cudnnBackendGetAttribute(ENGINE_NUMERICAL_NOTE)", what);
            bool nondet = false;
            for (int64_t k = 0; k < nn; k++)
                nondet |= notes[k] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
            if (nondet) continue;
        }
        desc_t p = g.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        g.set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        g.setd(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
        if (g.st) return dnn_fail(e, g.st, g.failed, what);
        if ((last = dnn.cudnnBackendFinalize(p))) continue; // this engine refuses the graph
        int64_t got = 0;
        st = dnn.cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &got, ws);
        if (st)
            return dnn_fail(e, st, "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)", what);
        *plan = p;
        return RL_OK;
    }
    return rl_errf(e, RL_EIO,
                   "cuDNN: no engine of %lld from CUDNN_HEUR_MODE_A finalizes the %s graph%s: %s",
                   (long long)n, what, deterministic ? " (deterministic ones only)" : "",
                   dnn.cudnnGetErrorString(last));
}

struct cudnn_plan {
    int B, T;
    desc_t fwd, bwd;
    graph_b gf, gb; // own the descriptors the plans were made from
};

#define RL_CUDNN_MAX_PLANS 8
struct rl_cudnn_attn {
    int B, T, H, KV, hd; // capacity and heads
    cudnnHandle_t h;
    cudaStream_t s; // the handle's stream
    bf16 *qk;       // rotated q|k rows [B*T, (H + KV) hd]
    void *ws;       // the plans' workspace, the largest of them
    size_t ws_bytes, bytes;
    int n_plans;
    cudnn_plan *plans[RL_CUDNN_MAX_PLANS];
};

static int plan_for(rl_cudnn_attn *a, int B, int T, cudnn_plan **out, rl_err *e) {
    for (int i = 0; i < a->n_plans; i++)
        if (a->plans[i]->B == B && a->plans[i]->T == T) return *out = a->plans[i], RL_OK;
    if (a->n_plans == RL_CUDNN_MAX_PLANS)
        return rl_errf(e, RL_EINPUT, "cuDNN attention: more than %d batch shapes (B=%d T=%d)",
                       RL_CUDNN_MAX_PLANS, B, T);
    cudnn_plan *p = new cudnn_plan();
    p->B = B, p->T = T;
    attn_shape sh = {B,
                     T,
                     a->H,
                     a->KV,
                     a->hd,
                     (int64_t)(a->H + a->KV) * a->hd,
                     (int64_t)(a->H + 2 * a->KV) * a->hd};
    char what[96];
    int64_t wf = 0, wb = 0;
    snprintf(what, sizeof what, "attention forward B=%d T=%d H=%d KV=%d hd=%d", B, T, a->H, a->KV,
             a->hd);
    fwd_graph(p->gf, sh);
    int rc = finish_plan(p->gf, a->h, false, what, &p->fwd, &wf, e);
    if (!rc) {
        snprintf(what, sizeof what, "attention backward B=%d T=%d H=%d KV=%d hd=%d", B, T, a->H,
                 a->KV, a->hd);
        bwd_graph(p->gb, sh);
        rc = finish_plan(p->gb, a->h, true, what, &p->bwd, &wb, e);
    }
    size_t need = (size_t)(wf > wb ? wf : wb);
    if (!rc && need > a->ws_bytes) { // a later, larger shape: grow once, nothing queued uses it
        cudaError_t ce = cudaStreamSynchronize(a->s);
        if (ce == cudaSuccess) ce = cudaFree(a->ws);
        a->ws = NULL, a->bytes -= a->ws_bytes, a->ws_bytes = 0;
        if (ce == cudaSuccess) ce = cudaMalloc(&a->ws, need);
        if (ce != cudaSuccess)
            rc = rl_gpu_cuda_fail(e, ce, "cudaMalloc(cuDNN workspace)", __FILE__, __LINE__);
        else
            a->ws_bytes = need, a->bytes += need;
    }
    if (rc) {
        p->gf.destroy(), p->gb.destroy();
        delete p;
        return rc;
    }
    a->plans[a->n_plans++] = p;
    *out = p;
    return RL_OK;
}

void rl_cudnn_attn_free(rl_cudnn_attn *a) {
    if (!a) return;
    if (a->s || a->qk) cudaStreamSynchronize(a->s);
    for (int i = 0; i < a->n_plans; i++) {
        a->plans[i]->gf.destroy(), a->plans[i]->gb.destroy();
        delete a->plans[i];
    }
    if (a->h) dnn.cudnnDestroy(a->h);
    cudaFree(a->qk);
    cudaFree(a->ws);
    free(a);
}

int rl_cudnn_attn_create(rl_cudnn_attn **out, int B, int T, int H, int KV, int hd, cudaStream_t s,
                         rl_err *e) {
    *out = NULL;
    RL_TRY(cudnn_load(e));
    if (B < 1 || T < 1 || H < 1 || KV < 1 || H % KV || hd < 2 || hd % 2)
        return rl_errf(e, RL_EINPUT,
                       "cuDNN attention: unsupported shape B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV,
                       hd);
    // cuDNN's fused attention engines take head dims that are a multiple of
    // 8, and our packed rows are 16-byte aligned only then
    if (hd % 8)
        return rl_errf(e, RL_EINPUT, "cuDNN attention: head_dim %d is not a multiple of 8", hd);
    rl_cudnn_attn *a = (rl_cudnn_attn *)calloc(1, sizeof *a);
    if (!a) return rl_errf(e, RL_ENOMEM, "cuDNN attention: out of host memory");
    a->B = B, a->T = T, a->H = H, a->KV = KV, a->hd = hd, a->s = s;
    cudnn_plan *p;
    size_t nqk = (size_t)B * T * (H + KV) * hd * sizeof(bf16);
    cudnnStatus_t st = dnn.cudnnCreate(&a->h);
    int rc = st ? dnn_fail(e, st, "cudnnCreate", "attention") : RL_OK;
    if (!rc && (st = dnn.cudnnSetStream(a->h, s)))
        rc = dnn_fail(e, st, "cudnnSetStream", "attention");
    cudaError_t ce = rc ? cudaSuccess : cudaMalloc(&a->qk, nqk);
    if (ce != cudaSuccess)
        rc = rl_gpu_cuda_fail(e, ce, "cudaMalloc(cuDNN q|k)", __FILE__, __LINE__);
    a->bytes = nqk;
    if (!rc) rc = plan_for(a, B, T, &p, e);
    if (rc) {
        rl_cudnn_attn_free(a);
        return rc;
    }
    *out = a;
    return RL_OK;
}

size_t rl_cudnn_attn_device_bytes(const rl_cudnn_attn *a) { return a ? a->bytes : 0; }

// ---- launches ----------------------------------------------------------------------------------
// dst rows [(H + KV) hd] = RoPE(q|k columns of the qkv rows), rotate-half on
// pairs (i, i + hd/2) as rope_kernel does; cs == NULL copies.
static __global__ void rope_pack_kernel(bf16 *dst, const bf16 *qkv, const float *cs,
                                        const float *sn, int N, int T, int nh, int hd, int ld) {
    int half = hd / 2;
    size_t total = (size_t)N * nh * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rest = idx / half;
        int hh = (int)(rest % nh), n = (int)(rest / nh), t = n % T;
        const bf16 *x = qkv + (size_t)n * ld + (size_t)hh * hd;
        bf16 *y = dst + ((size_t)n * nh + hh) * hd;
        float x1 = bf2f(x[i]), x2 = bf2f(x[i + half]);
        if (!cs) {
            y[i] = x[i], y[i + half] = x[i + half];
            continue;
        }
        float c = cs[(size_t)t * half + i], sv = sn[(size_t)t * half + i];
        y[i] = f2bf(x1 * c - x2 * sv);
        y[i + half] = f2bf(x2 * c + x1 * sv);
    }
}

static int rope_pack(rl_cudnn_attn *a, const bf16 *qkv, const float *rope, int max_pos, int N,
                     int T, cudaStream_t s, rl_err *e) {
    int nh = a->H + a->KV, half = a->hd / 2;
    size_t total = (size_t)N * nh * half;
    unsigned blocks = rl_cdiv(total, 256);
    if (blocks > 65535u * 16) blocks = 65535u * 16;
    const float *sn = rope ? rope + (size_t)max_pos * half : NULL;
    RL_LAUNCH(rope_pack_kernel, blocks, 256, 0, s, a->qk, qkv, rope, sn, N, T, nh, a->hd,
              (a->H + 2 * a->KV) * a->hd);
    LAUNCH_CHECK();
    return RL_OK;
}

static int check_call(rl_cudnn_attn *a, const float *rope, int max_pos, int B, int T,
                      cudaStream_t s, rl_err *e) {
    if (B < 1 || T < 1 || B * T > a->B * a->T)
        return rl_errf(e, RL_EINPUT,
                       "cuDNN attention: B=%d T=%d beyond the %d x %d it was made for", B, T, a->B,
                       a->T);
    if (rope && T > max_pos)
        return rl_errf(e, RL_EINPUT, "attention: sequence length %d exceeds the RoPE table's %d", T,
                       max_pos);
    if (s != a->s) {
        cudnnStatus_t st = dnn.cudnnSetStream(a->h, s);
        if (st) return dnn_fail(e, st, "cudnnSetStream", "attention");
        a->s = s;
    }
    return RL_OK;
}

static int execute(rl_cudnn_attn *a, desc_t plan, void *const ptr[U_N], const char *what,
                   rl_err *e) {
    int64_t uids[U_N];
    void *ptrs[U_N];
    int n = 0;
    for (int u = 1; u < U_N; u++)
        if (ptr[u]) uids[n] = u, ptrs[n++] = ptr[u];
    graph_b g;
    desc_t vp = g.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &a->ws);
    g.fin(vp);
    cudnnStatus_t st = g.st ? g.st : dnn.cudnnBackendExecute(a->h, plan, vp);
    const char *call = g.st ? g.failed : "cudnnBackendExecute";
    g.destroy();
    return st ? dnn_fail(e, st, call, what) : RL_OK;
}

int rl_k_attn_cudnn_fwd(rl_cudnn_attn *a, bf16 *out, float *stats, const bf16 *qkv,
                        const float *rope, int max_pos, int B, int T, cudaStream_t s, rl_err *e) {
    cudnn_plan *p;
    RL_TRY(check_call(a, rope, max_pos, B, T, s, e));
    RL_TRY(plan_for(a, B, T, &p, e));
    RL_TRY(rope_pack(a, qkv, rope, max_pos, B * T, T, s, e));
    float scale = 1.0f / sqrtf((float)a->hd), neg = -1e30f; // masked scores: exp() gives 0
    void *ptr[U_N] = {0};
    ptr[U_Q] = a->qk, ptr[U_KT] = a->qk + (size_t)a->H * a->hd;
    ptr[U_V] = (void *)(qkv + (size_t)(a->H + a->KV) * a->hd);
    ptr[U_O] = out, ptr[U_STATS] = stats, ptr[U_SCALE] = &scale, ptr[U_NEG] = &neg;
    return execute(a, p->fwd, ptr, "attention forward", e);
}

int rl_k_attn_cudnn_bwd(rl_cudnn_attn *a, bf16 *dqkv, float *dsum, const bf16 *dout,
                        const bf16 *qkv, const bf16 *out, const float *stats, const float *rope,
                        int max_pos, int B, int T, cudaStream_t s, rl_err *e) {
    cudnn_plan *p;
    RL_TRY(check_call(a, rope, max_pos, B, T, s, e));
    RL_TRY(plan_for(a, B, T, &p, e));
    RL_TRY(rope_pack(a, qkv, rope, max_pos, B * T, T, s, e)); // the forward's, recomputed
    float scale = 1.0f / sqrtf((float)a->hd), neg = -1e30f;
    size_t qd = (size_t)a->H * a->hd, kvd = (size_t)a->KV * a->hd;
    void *ptr[U_N] = {0};
    ptr[U_Q] = a->qk, ptr[U_KT] = ptr[U_K] = a->qk + qd;
    ptr[U_VT] = (void *)(qkv + qd + kvd);
    ptr[U_O] = (void *)out, ptr[U_DO] = (void *)dout, ptr[U_STATS] = (void *)stats;
    ptr[U_DSUM] = dsum, ptr[U_SCALE] = &scale, ptr[U_NEG] = &neg;
    ptr[U_DQ] = dqkv, ptr[U_DK] = dqkv + qd, ptr[U_DV] = dqkv + qd + kvd;
    RL_TRY(execute(a, p->bwd, ptr, "attention backward", e));
    if (!rope) return RL_OK;
    // dq, dk back to the un-rotated q, k: the transposed rotation
    return rl_k_rope(dqkv, rope, B * T, T, a->H + a->KV, a->hd, (int)(qd + 2 * kvd), max_pos, 1, s,
                     e);
}

// The rotation pass: q|k read from qkv, written rotated (6 FLOPs a pair).
static rl_k_cost pack_cost(int B, int T, int H, int KV, int hd) {
    double n = (double)B * T * (H + KV) * hd;
    return rl_k_cost{3.0 * n, 4.0 * n, 1};
}

// Forward: the rotation, then the attention's FLOPs counted as our
// kernels' (FlashAttention's causal count; cuDNN's masked tiles on the
// diagonal are left out) and its bytes: q|k, v, out, stats.
rl_k_cost rl_k_attn_cudnn_fwd_cost(int B, int T, int H, int KV, int hd) {
    rl_k_cost c = pack_cost(B, T, H, KV, hd), f = rl_k_attn_fwd_cost(B, T, H, KV, hd);
    c.flops += f.flops, c.bytes += f.bytes, c.launches += 1;
    return c;
}

// Backward: the rotation again (not kept from the forward: L x q|k of
// memory), five products over the causal half (2.5 x the forward's), D, and
// the inverse rotation of dq|dk in place.
rl_k_cost rl_k_attn_cudnn_bwd_cost(int B, int T, int H, int KV, int hd) {
    double N = (double)B * T, causal = (double)T * (T + 1) / 2, qd = (double)H * hd;
    double qkv = N * (H + 2.0 * KV) * hd * 2;
    rl_k_cost c = pack_cost(B, T, H, KV, hd), r = rl_k_rope_cost(B * T, H + KV, hd);
    c.flops += 2.5 * 4.0 * B * H * hd * causal + 2 * N * qd + r.flops;
    c.bytes += (N * qd * 4 + N * H * 4) + (2 * qkv + N * qd * 2 + N * H * 8) + r.bytes;
    c.launches += 1 + r.launches;
    return c;
}

// ---- the choice (train.attention) ---------------------------------------------------------------
// auto: both backends on probe inputs of the model's shapes must agree --
// max |difference| / max |own output| at most RL_ATTN_AGREE_FWD for out,
// RL_ATTN_AGREE_BWD for dq|dk|dv. bf16 outputs carry 2^-9 relative
// rounding; the backends differ in summation order and in where P and dS
// are rounded to bf16 (test-gpu sees ~2e-3 between our kernels and an f64
// reference), so 1e-2 and 3e-2 leave room for that and none for a wrong
// mask, layout or scale, which errs by O(1).
#define RL_ATTN_AGREE_FWD 1e-2
#define RL_ATTN_AGREE_BWD 3e-2
#define RL_ATTN_REPS 3

struct probe_bufs {
    bf16 *qkv, *out[2], *dout, *dqkv[2];
    float *lse[2], *dsum;
};

static double max_rel_diff(const bf16 *d_a, const bf16 *d_b, size_t n, rl_err *e, int *rc) {
    std::vector<bf16> a(n), b(n);
    cudaError_t ce = cudaMemcpy(a.data(), d_a, n * sizeof(bf16), cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(b.data(), d_b, n * sizeof(bf16), cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess)
        return *rc = rl_gpu_cuda_fail(e, ce, "cudaMemcpy(probe)", __FILE__, __LINE__), 0;
    double dmax = 0, amax = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
        if (!isfinite(x) || !isfinite(y)) return INFINITY; // disagrees with any bound
        if (fabs(x - y) > dmax) dmax = fabs(x - y);
        if (fabs(x) > amax) amax = fabs(x);
    }
    return dmax / (amax > 0 ? amax : 1);
}

// One forward and backward of backend k (0 own, 1 cuDNN) into its buffers.
static int run_one(int k, rl_cudnn_attn *a, probe_bufs *p, const float *rope, int max_pos,
                   cudaStream_t s, rl_err *e) {
    int B = a->B, T = a->T, H = a->H, KV = a->KV, hd = a->hd;
    if (k == 0) {
        RL_TRY(rl_k_attn_fwd(p->out[0], p->lse[0], p->qkv, rope, max_pos, B, T, H, KV, hd, s, e));
        return rl_k_attn_bwd(p->dqkv[0], p->dsum, NULL, p->dout, p->qkv, p->out[0], p->lse[0], rope,
                             max_pos, B, T, H, KV, hd, s, e);
    }
    RL_TRY(rl_k_attn_cudnn_fwd(a, p->out[1], p->lse[1], p->qkv, rope, max_pos, B, T, s, e));
    return rl_k_attn_cudnn_bwd(a, p->dqkv[1], p->dsum, p->dout, p->qkv, p->out[1], p->lse[1], rope,
                               max_pos, B, T, s, e);
}

// Milliseconds per forward + backward of backend k, RL_ATTN_REPS timed.
static int time_one(int k, rl_cudnn_attn *a, probe_bufs *p, const float *rope, int max_pos,
                    cudaStream_t s, float *ms, rl_err *e) {
    cudaEvent_t ev[2];
    CUDA_CHECK(cudaEventCreate(&ev[0]));
    CUDA_CHECK(cudaEventCreate(&ev[1]));
    int rc = RL_OK;
    cudaError_t ce = cudaEventRecord(ev[0], s);
    for (int r = 0; r < RL_ATTN_REPS && !rc && ce == cudaSuccess; r++)
        rc = run_one(k, a, p, rope, max_pos, s, e);
    if (!rc && ce == cudaSuccess) ce = cudaEventRecord(ev[1], s);
    if (!rc && ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
    if (!rc && ce == cudaSuccess) ce = cudaEventElapsedTime(ms, ev[0], ev[1]);
    cudaEventDestroy(ev[0]), cudaEventDestroy(ev[1]);
    if (!rc && ce != cudaSuccess) rc = rl_gpu_cuda_fail(e, ce, "probe timing", __FILE__, __LINE__);
    *ms /= RL_ATTN_REPS;
    return rc;
}

// Probe inputs: q, k, v, dO uniform in [-2, 2) from a fixed hash (the same
// bits every run), uploaded once.
static int probe_alloc(probe_bufs *p, int N, int H, int KV, int hd, cudaStream_t s, rl_err *e) {
    size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, n = (size_t)N * C3;
    CUDA_CHECK(cudaMalloc(&p->qkv, n * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&p->dout, (size_t)N * qd * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&p->dsum, (size_t)N * H * sizeof(float)));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMalloc(&p->out[k], (size_t)N * qd * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&p->dqkv[k], n * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&p->lse[k], (size_t)N * H * sizeof(float)));
    }
    std::vector<bf16> h((n > (size_t)N * qd ? n : (size_t)N * qd) + 7);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < h.size(); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = __float2bfloat16((float)((x >> 11) * 0x1.0p-53 * 4.0 - 2.0));
    }
    CUDA_CHECK(cudaMemcpyAsync(p->qkv, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(p->dout, h.data() + 7, (size_t)N * qd * sizeof(bf16),
                               cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s)); // h is pageable and goes out of scope
    return RL_OK;
}

static void probe_free(probe_bufs *p) {
    void *ptrs[] = {p->qkv,     p->dout,    p->dsum,   p->out[0], p->out[1],
                    p->dqkv[0], p->dqkv[1], p->lse[0], p->lse[1]};
    for (void *q : ptrs) cudaFree(q);
}

// auto's measurement: agreement, then the time of each. *pick 1: cuDNN.
static int probe(rl_cudnn_attn *a, const float *rope, int max_pos, cudaStream_t s, int *pick,
                 rl_err *e) {
    probe_bufs p;
    memset(&p, 0, sizeof p);
    int N = a->B * a->T, rc = probe_alloc(&p, N, a->H, a->KV, a->hd, s, e);
    size_t C3 = (size_t)(a->H + 2 * a->KV) * a->hd, qd = (size_t)a->H * a->hd;
    float ms[2] = {0, 0};
    double df = 0, db = 0;
    for (int k = 0; k < 2 && !rc; k++) rc = run_one(k, a, &p, rope, max_pos, s, e);
    if (!rc) df = max_rel_diff(p.out[0], p.out[1], (size_t)N * qd, e, &rc);
    if (!rc) db = max_rel_diff(p.dqkv[0], p.dqkv[1], (size_t)N * C3, e, &rc);
    for (int k = 0; k < 2 && !rc; k++) rc = time_one(k, a, &p, rope, max_pos, s, &ms[k], e);
    probe_free(&p);
    if (rc) return rc;
    bool agree = df <= RL_ATTN_AGREE_FWD && db <= RL_ATTN_AGREE_BWD;
    *pick = agree && ms[1] < ms[0]; // a tie keeps our kernels
    rl_log(RL_LOG_INFO, "attention_backend",
           "\"requested\":\"auto\",\"choice\":\"%s\",\"own_ms\":%.3f,\"cudnn_ms\":%.3f,"
           "\"fwd_diff\":%.2e,\"bwd_diff\":%.2e,\"agree\":%s,\"B\":%d,\"T\":%d",
           *pick ? "cudnn" : "own", ms[0], ms[1], df, db, agree ? "true" : "false", a->B, a->T);
    return RL_OK;
}

// auto without cuDNN (absent, refusing the graphs, failing to run them):
// our kernels, and one line saying why.
static int fall_back(const rl_err *why) {
    char msg[600];
    rl_log(RL_LOG_INFO, "attention_backend",
           "\"requested\":\"auto\",\"choice\":\"own\",\"reason\":\"%s\"",
           rl_json_escape(msg, sizeof msg, why->msg));
    return RL_OK;
}

int rl_gpu_attn_select(rl_cudnn_attn **out, int mode, int B, int T, int H, int KV, int hd,
                       const float *rope, int max_pos, cudaStream_t s, rl_err *e) {
    *out = NULL;
    if (mode == RL_GPU_ATTN_OWN) return RL_OK;
    if (mode != RL_GPU_ATTN_AUTO && mode != RL_GPU_ATTN_CUDNN)
        return rl_errf(e, RL_EINPUT, "train.attention: unknown backend %d", mode);
    rl_err ce = {0, {0}};
    rl_cudnn_attn *a;
    int rc = rl_cudnn_attn_create(&a, B, T, H, KV, hd, s, &ce);
    if (rc && mode == RL_GPU_ATTN_CUDNN)
        return rl_errf(e, rc, "train.attention cudnn: %s (auto or own run without it)", ce.msg);
    if (rc) return fall_back(&ce); // auto without a usable cuDNN
    if (mode == RL_GPU_ATTN_CUDNN) {
        rl_log(RL_LOG_INFO, "attention_backend", "\"requested\":\"cudnn\",\"choice\":\"cudnn\"");
        *out = a;
        return RL_OK;
    }
    int pick = 0;
    if ((rc = probe(a, rope, max_pos, s, &pick, &ce))) {
        // a CUDA error in our own kernels is the model's to report; a
        // refusal at execution is cuDNN's: fall back
        rl_cudnn_attn_free(a);
        if (strncmp(ce.msg, "cuDNN", 5) != 0) return rl_errf(e, rc, "%s", ce.msg);
        return fall_back(&ce);
    }
    if (pick)
        *out = a;
    else
        rl_cudnn_attn_free(a);
    return RL_OK;
}
