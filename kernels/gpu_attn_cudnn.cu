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
// Layout. qkv rows are [q heads | k heads | v heads], q and k already
// rotated by the model's RoPE pass (rl_k_rope, in place, before attention;
// it rotates dq|dk back after the backward), so cuDNN sees plain attention.
// Tensors are BHSD in logical dims with the strides of the packed rows, so
// nothing is copied: Q, K and V are read from qkv in place, O goes straight
// into out [B*T, H*hd], dQ|dK|dV straight into dqkv. Stats (the softmax's
// log-sum-exp, natural log, scale included) go into the model's lse buffer
// [B*H, T]: the same size as our kernels' log2 lse, read only by the same
// backend's backward.
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
    int64_t vuid = 1000;       // virtual tensors' ids, above the variant pack's
    std::vector<int64_t> uids; // the non-virtual tensors': exactly the variant pack's

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
            snprintf(failed_buf, sizeof failed_buf, "cudnnBackendSetAttribute(attribute %d)",
                     (int)a);
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
        if (!virt) uids.push_back(uid);
        return d;
    }
    // A virtual intermediate, packed row-major (strides are a layout hint
    // cuDNN may replace).
    desc_t virt(cudnnDataType_t dt, const dims_t &dim) {
        dims_t str(dim.size(), 1);
        for (int i = (int)dim.size() - 2; i >= 0; i--) str[i] = str[i + 1] * dim[i + 1];
        return tensor(vuid++, dt, dim, str, true);
    }
    // C = A B; m, n, k: optional per-batch extents (INT32 [B,1,1,1]) that
    // the SDPA engines read as the sequence lengths of a padding mask
    void matmul(desc_t a, desc_t b, desc_t c, desc_t m_ov = NULL, desc_t n_ov = NULL,
                desc_t k_ov = NULL) {
        desc_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        fin(m);
        desc_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
        if (m_ov) setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_ov);
        if (n_ov) setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_ov);
        if (k_ov) setd(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_ov);
        fin(op);
        ops.push_back(op);
    }
    // y = mode(x[, b]); t: BINARY_SELECT's condition; axis: GEN_INDEX's;
    // f: the math precision (the frontend's: INT32 for a padding mask's
    // indices, BOOLEAN for comparisons and AND)
    void pw(cudnnPointwiseMode_t mode, desc_t x, desc_t b, desc_t y, desc_t t = NULL,
            int64_t axis = -1, cudnnDataType_t f = CUDNN_DATA_FLOAT) {
        desc_t p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
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
        keep.clear(), ops.clear(), uids.clear();
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
    U_VT,
    U_DO,
    U_DSUM,
    U_ONE,
    U_SEQQ,
    U_SEQKV,
    U_DQ,
    U_DK,
    U_DV, // backward (+ the above)
    U_N
};

struct attn_shape {
    int64_t B, T, H, KV, hd, ld; // ld: qkv's rows, (H + 2 KV) hd
};
// [b, h, t, d] of a head block in qkv's (or dqkv's) rows
static dims_t bhsd(const attn_shape &s) { return {s.T * s.ld, s.hd, s.ld, 1}; }
// [b, h, d, t]: K^T (V^T) read from the same rows
static dims_t bhds(const attn_shape &s) { return {s.T * s.ld, s.hd, 1, s.ld}; }

// The row (query) and column (key) positions of the [B, H, T, T] scores
// x, GEN_INDEX in math precision f.
static void positions(graph_b &g, const dims_t &bhtt, desc_t x, cudnnDataType_t f, desc_t *row,
                      desc_t *col) {
    *row = g.virt(CUDNN_DATA_INT32, bhtt), *col = g.virt(CUDNN_DATA_INT32, bhtt);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, *row, NULL, 2, f);
    g.pw(CUDNN_POINTWISE_GEN_INDEX, x, NULL, *col, NULL, 3, f);
}

// x where key position <= query position, else neg. cmp: the comparison's
// math precision -- FLOAT in the forward, BOOLEAN (the frontend's) in the
// backward, each as it agreed with our kernels on the H200.
static desc_t causal_mask(graph_b &g, const dims_t &bhtt, desc_t x, desc_t neg,
                          cudnnDataType_t cmp) {
    desc_t row, col;
    positions(g, bhtt, x, CUDNN_DATA_FLOAT, &row, &col);
    desc_t keep = g.virt(CUDNN_DATA_BOOLEAN, bhtt), y = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pw(CUDNN_POINTWISE_CMP_GE, row, col, keep, NULL, -1, cmp);
    g.pw(CUDNN_POINTWISE_BINARY_SELECT, x, neg, y, keep);
    return y;
}

// S = scale Q K^T with the causal mask: the forward's.
// *scale: the by-value scale tensor.
static desc_t scores(graph_b &g, const attn_shape &s, desc_t q, desc_t kt, desc_t *scale_out) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T}, one = {1, 1, 1, 1};
    desc_t scale = g.tensor(U_SCALE, CUDNN_DATA_FLOAT, one, one, false, true);
    *scale_out = scale;
    desc_t neg = g.tensor(U_NEG, CUDNN_DATA_FLOAT, one, one, false, true);
    desc_t s0 = g.virt(CUDNN_DATA_FLOAT, bhtt), s1 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.matmul(q, kt, s0);
    g.pw(CUDNN_POINTWISE_MUL, s0, scale, s1);
    return causal_mask(g, bhtt, s1, neg, CUDNN_DATA_FLOAT);
}

static void fwd_graph(graph_b &g, const attn_shape &s) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T}, bht1 = {s.B, s.H, s.T, 1};
    desc_t q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.hd}, bhsd(s));
    desc_t kt = g.tensor(U_KT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, bhds(s));
    desc_t v = g.tensor(U_V, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.T, s.hd}, bhsd(s));
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

// ---- the backward -------------------------------------------------------------------------------
// cuDNN's fused SDPA backward engines recognise the graph cudnn-frontend
// composes, and nothing else we tried: on H200 (CUDA 13) a graph of the
// same maths in another arrangement finalized and ran without error but
// gave wrong dQ, dK (and, with GQA, uninitialised dK, dV), and two more
// (D = rowsum(dO o O) by a kernel of ours, read by the graph; that split
// into a dQ graph and a dK dV graph) got no engine at all from cuDNN 9.19.
// So the backward follows the frontend's composition: op order, operand
// order, D inside the graph (into the non-virtual dsum, through a multiply
// by 1 as the frontend has it), P and dS kept in fp32 and cast to bf16 by
// the reshapes that transpose them, K as a reshape of the K^T input, dQ
// straight from dS K (the frontend's deterministic form), per-query-head
// dK/dV as bf16 before the GQA sum (a reduction H -> KV), and -- the
// frontend's workaround for cuDNN <= 9.15, whose backward is wrong when
// the key length is not a multiple of 128 without one -- a padding mask
// with every sequence full (seq_len tensors = T, also the matmuls' M/N/K
// overrides).
struct bwd_in {
    desc_t q, kt, vt, o, dO, stats, scale, neg, one, seqq, seqkv;
};

// The tensors the backward graph reads
static bwd_in bwd_inputs(graph_b &g, const attn_shape &s) {
    const dims_t bht1 = {s.B, s.H, s.T, 1}, bhtd = {s.B, s.H, s.T, s.hd}, one = {1, 1, 1, 1};
    const dims_t b111 = {s.B, 1, 1, 1}, ldo = {s.T * s.H * s.hd, s.hd, s.H * s.hd, 1};
    bwd_in in;
    in.q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, bhtd, bhsd(s));
    in.kt = g.tensor(U_KT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, bhds(s));
    in.vt = g.tensor(U_VT, CUDNN_DATA_BFLOAT16, {s.B, s.KV, s.hd, s.T}, bhds(s));
    in.o = g.tensor(U_O, CUDNN_DATA_BFLOAT16, bhtd, ldo);
    in.dO = g.tensor(U_DO, CUDNN_DATA_BFLOAT16, bhtd, ldo);
    in.stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, bht1, {s.H * s.T, s.T, 1, 1});
    in.scale = g.tensor(U_SCALE, CUDNN_DATA_FLOAT, one, one, false, true);
    in.neg = g.tensor(U_NEG, CUDNN_DATA_FLOAT, one, one, false, true);
    in.one = g.tensor(U_ONE, CUDNN_DATA_FLOAT, one, one, false, true);
    in.seqq = g.tensor(U_SEQQ, CUDNN_DATA_INT32, b111, one);
    in.seqkv = g.tensor(U_SEQKV, CUDNN_DATA_INT32, b111, one);
    return in;
}

// D = rowsum(dO o O) (x 1: where the frontend scales by dropout) into the
// non-virtual dsum [B, H, T]: the frontend's first operations.
static desc_t graph_dsum(graph_b &g, const attn_shape &s, const bwd_in &in) {
    const dims_t bht1 = {s.B, s.H, s.T, 1};
    // dO o O with the strides the frontend gives it (those of dO's rows, as
    // if [B, T, H, hd]: a hint for a virtual, kept as the engines saw it)
    desc_t oo = g.tensor(g.vuid++, CUDNN_DATA_FLOAT, {s.B, s.H, s.T, s.hd},
                         {s.H * s.T * s.hd, s.T * s.hd, s.H * s.hd, 1}, true);
    desc_t r = g.virt(CUDNN_DATA_FLOAT, bht1);
    desc_t d = g.tensor(U_DSUM, CUDNN_DATA_FLOAT, bht1, {s.H * s.T, s.T, 1, 1});
    g.pw(CUDNN_POINTWISE_MUL, in.dO, in.o, oo);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, oo, r);
    g.pw(CUDNN_POINTWISE_MUL, r, in.one, d);
    return d;
}

// x where row < seq_len_q and column < seq_len_kv, else neg
static desc_t padding_mask(graph_b &g, const attn_shape &s, const bwd_in &in, desc_t x) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T};
    desc_t row, col;
    positions(g, bhtt, x, CUDNN_DATA_INT32, &row, &col);
    desc_t rk = g.virt(CUDNN_DATA_BOOLEAN, bhtt), ck = g.virt(CUDNN_DATA_BOOLEAN, bhtt);
    desc_t keep = g.virt(CUDNN_DATA_BOOLEAN, bhtt), y = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pw(CUDNN_POINTWISE_CMP_LT, row, in.seqq, rk, NULL, -1, CUDNN_DATA_BOOLEAN);
    g.pw(CUDNN_POINTWISE_CMP_LT, col, in.seqkv, ck, NULL, -1, CUDNN_DATA_BOOLEAN);
    g.pw(CUDNN_POINTWISE_LOGICAL_AND, rk, ck, keep, NULL, -1, CUDNN_DATA_BOOLEAN);
    g.pw(CUDNN_POINTWISE_BINARY_SELECT, x, in.neg, y, keep);
    return y;
}

// P = exp(mask(scale Q K^T) - stats), fp32: the forward's, from its lse.
// The causal mask goes after the subtraction, where the frontend puts it
// (and, for 9.0 <= cuDNN < 9.10, the padding mask a second time there).
static desc_t bwd_probs(graph_b &g, const attn_shape &s, const bwd_in &in, size_t version) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T};
    desc_t s0 = g.virt(CUDNN_DATA_FLOAT, bhtt), s1 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t s3 = g.virt(CUDNN_DATA_FLOAT, bhtt), p = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.matmul(in.q, in.kt, s0, in.seqq, in.seqkv);
    g.pw(CUDNN_POINTWISE_MUL, s0, in.scale, s1);
    desc_t s2 = padding_mask(g, s, in, s1);
    g.pw(CUDNN_POINTWISE_SUB, s2, in.stats, s3);
    if (version >= 90000 && version < 91000) s3 = padding_mask(g, s, in, s3);
    g.pw(CUDNN_POINTWISE_EXP, causal_mask(g, bhtt, s3, in.neg, CUDNN_DATA_BOOLEAN), NULL, p);
    return p;
}

// dS = (dO V^T - D) o P o scale, fp32
static desc_t bwd_ds(graph_b &g, const attn_shape &s, const bwd_in &in, desc_t dsum, desc_t p) {
    const dims_t bhtt = {s.B, s.H, s.T, s.T};
    desc_t dp = g.virt(CUDNN_DATA_FLOAT, bhtt), t0 = g.virt(CUDNN_DATA_FLOAT, bhtt);
    desc_t t1 = g.virt(CUDNN_DATA_FLOAT, bhtt), ds = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.matmul(in.dO, in.vt, dp, in.seqq, in.seqkv);
    g.pw(CUDNN_POINTWISE_SUB, dp, dsum, t0);
    g.pw(CUDNN_POINTWISE_MUL, t0, p, t1);
    g.pw(CUDNN_POINTWISE_MUL, t1, in.scale, ds);
    return ds;
}

// x^T in bf16: a [T, T] matrix read key-major, the cast in the reshape
static desc_t transposed(graph_b &g, const attn_shape &s, desc_t x) {
    desc_t y = g.tensor(g.vuid++, CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.T},
                        {s.H * s.T * s.T, s.T * s.T, 1, s.T}, true);
    g.reshape(x, y);
    return y;
}

// out = at b over the query positions: dV (at = P^T, b = dO) or dK
// (dS^T, Q). With GQA, per query head into a bf16 virtual and a reduction
// H -> KV; else directly.
static void kv_grad(graph_b &g, const attn_shape &s, const bwd_in &in, desc_t at, desc_t b,
                    desc_t out) {
    if (s.H == s.KV) return g.matmul(at, b, out, in.seqkv, NULL, in.seqq);
    desc_t full = g.virt(CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.hd});
    g.matmul(at, b, full, in.seqkv, NULL, in.seqq);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

// The backward graph, in the frontend's order: D, P, dV, dS, dK, dQ
static void bwd_graph(graph_b &g, const attn_shape &s, size_t version) {
    const dims_t bhtd = {s.B, s.H, s.T, s.hd}, bktd = {s.B, s.KV, s.T, s.hd};
    bwd_in in = bwd_inputs(g, s);
    desc_t dsum = graph_dsum(g, s, in);
    desc_t p = bwd_probs(g, s, in, version);
    desc_t dv = g.tensor(U_DV, CUDNN_DATA_BFLOAT16, bktd, bhsd(s));
    kv_grad(g, s, in, transposed(g, s, p), in.dO, dv);
    desc_t ds = bwd_ds(g, s, in, dsum, p);
    desc_t dk = g.tensor(U_DK, CUDNN_DATA_BFLOAT16, bktd, bhsd(s));
    kv_grad(g, s, in, transposed(g, s, ds), in.q, dk);
    desc_t k = g.tensor(g.vuid++, CUDNN_DATA_BFLOAT16, bktd, bhsd(s), true);
    desc_t dq = g.tensor(U_DQ, CUDNN_DATA_BFLOAT16, bhtd, bhsd(s));
    g.reshape(in.kt, k);
    g.matmul(ds, k, dq, in.seqq, NULL, in.seqkv);
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
    int *seqlen;    // [B] of T: the padding mask's sequence lengths
};

#define RL_CUDNN_MAX_PLANS 8
struct rl_cudnn_attn {
    int B, T, H, KV, hd; // capacity and heads
    bool deterministic;  // the backward's engines
    cudnnHandle_t h;
    cudaStream_t s; // the handle's stream
    void *ws;       // the plans' workspace, the largest of them
    size_t ws_bytes;
    int n_plans;
    cudnn_plan *plans[RL_CUDNN_MAX_PLANS];
};

static void plan_free(cudnn_plan *p) {
    p->gf.destroy(), p->gb.destroy();
    cudaFree(p->seqlen);
    delete p;
}

// The forward's and the backward's plans for B x T
static int make_plans(rl_cudnn_attn *a, cudnn_plan *p, int64_t *ws, rl_err *e) {
    attn_shape sh = {p->B, p->T, a->H, a->KV, a->hd, (int64_t)(a->H + 2 * a->KV) * a->hd};
    char what[128];
    int64_t w[2] = {0, 0};
    snprintf(what, sizeof what, "attention forward B=%d T=%d H=%d KV=%d hd=%d", p->B, p->T, a->H,
             a->KV, a->hd);
    fwd_graph(p->gf, sh);
    RL_TRY(finish_plan(p->gf, a->h, false, what, &p->fwd, &w[0], e));
    snprintf(what, sizeof what, "attention backward B=%d T=%d H=%d KV=%d hd=%d", p->B, p->T, a->H,
             a->KV, a->hd);
    bwd_graph(p->gb, sh, dnn.cudnnGetVersion());
    RL_TRY(finish_plan(p->gb, a->h, a->deterministic, what, &p->bwd, &w[1], e));
    *ws = w[0] > w[1] ? w[0] : w[1];
    // the padding mask's lengths: every sequence full
    std::vector<int> len(p->B, p->T);
    CUDA_CHECK(cudaMalloc(&p->seqlen, len.size() * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(p->seqlen, len.data(), len.size() * sizeof(int), cudaMemcpyHostToDevice));
    return RL_OK;
}

static int plan_for(rl_cudnn_attn *a, int B, int T, cudnn_plan **out, rl_err *e) {
    for (int i = 0; i < a->n_plans; i++)
        if (a->plans[i]->B == B && a->plans[i]->T == T) return *out = a->plans[i], RL_OK;
    if (a->n_plans == RL_CUDNN_MAX_PLANS)
        return rl_errf(e, RL_EINPUT, "cuDNN attention: more than %d batch shapes (B=%d T=%d)",
                       RL_CUDNN_MAX_PLANS, B, T);
    cudnn_plan *p = new cudnn_plan();
    p->B = B, p->T = T;
    int64_t wsn = 0;
    int rc = make_plans(a, p, &wsn, e);
    size_t need = (size_t)wsn;
    if (!rc && need > a->ws_bytes) { // a later, larger shape: grow once, nothing queued uses it
        cudaError_t ce = cudaStreamSynchronize(a->s);
        if (ce == cudaSuccess) ce = cudaFree(a->ws);
        a->ws = NULL, a->ws_bytes = 0;
        if (ce == cudaSuccess) ce = cudaMalloc(&a->ws, need);
        if (ce != cudaSuccess)
            rc = rl_gpu_cuda_fail(e, ce, "cudaMalloc(cuDNN workspace)", __FILE__, __LINE__);
        else
            a->ws_bytes = need;
    }
    if (rc) {
        plan_free(p);
        return rc;
    }
    a->plans[a->n_plans++] = p;
    *out = p;
    return RL_OK;
}

void rl_cudnn_attn_free(rl_cudnn_attn *a) {
    if (!a) return;
    cudaStreamSynchronize(a->s); // nothing queued may still use the plans or the workspace
    for (int i = 0; i < a->n_plans; i++) plan_free(a->plans[i]);
    if (a->h) dnn.cudnnDestroy(a->h);
    cudaFree(a->ws);
    free(a);
}

int rl_cudnn_attn_create(rl_cudnn_attn **out, int B, int T, int H, int KV, int hd,
                         int deterministic, cudaStream_t s, rl_err *e) {
    *out = NULL;
    RL_TRY(cudnn_load(e));
    if (B < 1 || T < 1 || H < 1 || KV < 1 || H % KV || hd < 2 || hd % 2)
        return rl_errf(e, RL_EINPUT,
                       "cuDNN attention: unsupported shape B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV,
                       hd);
    // cuDNN's fused attention engines take head dims that are a multiple of
    // 8, and our packed rows' heads are 16-byte aligned only then
    if (hd % 8)
        return rl_errf(e, RL_EINPUT, "cuDNN attention: head_dim %d is not a multiple of 8", hd);
    rl_cudnn_attn *a = (rl_cudnn_attn *)calloc(1, sizeof *a);
    if (!a) return rl_errf(e, RL_ENOMEM, "cuDNN attention: out of host memory");
    a->B = B, a->T = T, a->H = H, a->KV = KV, a->hd = hd, a->s = s;
    a->deterministic = deterministic;
    cudnn_plan *p;
    cudnnStatus_t st = dnn.cudnnCreate(&a->h);
    int rc = st ? dnn_fail(e, st, "cudnnCreate", "attention") : RL_OK;
    if (!rc && (st = dnn.cudnnSetStream(a->h, s)))
        rc = dnn_fail(e, st, "cudnnSetStream", "attention");
    if (!rc) rc = plan_for(a, B, T, &p, e);
    if (rc) {
        rl_cudnn_attn_free(a);
        return rc;
    }
    *out = a;
    return RL_OK;
}

size_t rl_cudnn_attn_device_bytes(const rl_cudnn_attn *a) { return a ? a->ws_bytes : 0; }

// ---- launches ----------------------------------------------------------------------------------
static int check_call(rl_cudnn_attn *a, int B, int T, cudaStream_t s, rl_err *e) {
    if (B < 1 || T < 1 || B * T > a->B * a->T)
        return rl_errf(e, RL_EINPUT,
                       "cuDNN attention: B=%d T=%d beyond the %d x %d it was made for", B, T, a->B,
                       a->T);
    if (s != a->s) {
        cudnnStatus_t st = dnn.cudnnSetStream(a->h, s);
        if (st) return dnn_fail(e, st, "cudnnSetStream", "attention");
        a->s = s;
    }
    return RL_OK;
}

// Binds the graph's non-virtual tensors (gb.uids: exactly those, as the
// frontend's variant packs have them) to ptr[uid] and runs the plan.
static int execute(rl_cudnn_attn *a, desc_t plan, const graph_b &gb, void *const ptr[U_N],
                   const char *what, rl_err *e) {
    int64_t uids[U_N];
    void *ptrs[U_N];
    int n = 0;
    for (int64_t u : gb.uids) {
        if (u <= 0 || u >= U_N || !ptr[u])
            return rl_errf(e, RL_EINPUT, "cuDNN: %s: no pointer for tensor uid %lld", what,
                           (long long)u);
        uids[n] = u, ptrs[n++] = ptr[u];
    }
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

int rl_k_attn_cudnn_fwd(rl_cudnn_attn *a, bf16 *out, float *stats, const bf16 *qkv, int B, int T,
                        cudaStream_t s, rl_err *e) {
    cudnn_plan *p;
    RL_TRY(check_call(a, B, T, s, e));
    RL_TRY(plan_for(a, B, T, &p, e));
    float scale = 1.0f / sqrtf((float)a->hd), neg = -1e30f; // masked scores: exp() gives 0
    void *ptr[U_N] = {0};
    ptr[U_Q] = (void *)qkv, ptr[U_KT] = (void *)(qkv + (size_t)a->H * a->hd);
    ptr[U_V] = (void *)(qkv + (size_t)(a->H + a->KV) * a->hd);
    ptr[U_O] = out, ptr[U_STATS] = stats, ptr[U_SCALE] = &scale, ptr[U_NEG] = &neg;
    return execute(a, p->fwd, p->gf, ptr, "attention forward", e);
}

int rl_k_attn_cudnn_bwd(rl_cudnn_attn *a, bf16 *dqkv, float *dsum, const bf16 *dout,
                        const bf16 *qkv, const bf16 *out, const float *stats, int B, int T,
                        cudaStream_t s, rl_err *e) {
    cudnn_plan *p;
    RL_TRY(check_call(a, B, T, s, e));
    RL_TRY(plan_for(a, B, T, &p, e));
    // masked scores: -inf from cuDNN 9.10, the lowest float before (the frontend's values)
    float scale = 1.0f / sqrtf((float)a->hd), one = 1.0f;
    float neg = dnn.cudnnGetVersion() < 91000 ? -3.402823466e38f : -INFINITY;
    size_t qd = (size_t)a->H * a->hd, kvd = (size_t)a->KV * a->hd;
    void *ptr[U_N] = {0};
    ptr[U_Q] = (void *)qkv, ptr[U_KT] = (void *)(qkv + qd), ptr[U_VT] = (void *)(qkv + qd + kvd);
    ptr[U_O] = (void *)out, ptr[U_DO] = (void *)dout, ptr[U_STATS] = (void *)stats;
    ptr[U_DSUM] = dsum, ptr[U_SCALE] = &scale, ptr[U_NEG] = &neg, ptr[U_ONE] = &one;
    ptr[U_SEQQ] = ptr[U_SEQKV] = p->seqlen;
    ptr[U_DQ] = dqkv, ptr[U_DK] = dqkv + qd, ptr[U_DV] = dqkv + qd + kvd;
    return execute(a, p->bwd, p->gb, ptr, "attention backward", e);
}

// Forward: counted as our kernels' (FlashAttention's causal FLOPs, cuDNN's
// masked tiles on the diagonal left out; q|k|v, out and stats read and
// written once), one graph.
rl_k_cost rl_k_attn_cudnn_fwd_cost(int B, int T, int H, int KV, int hd) {
    return rl_k_attn_fwd_cost(B, T, H, KV, hd);
}

// Backward: our kernels' with dQ from the dK/dV pass -- five products
// over the causal half (2.5 x the forward's), D, and the bytes of dO and O
// for D, q|k|v, dq|dk|dv, dO, stats and D -- without the fp32 dQ
// accumulator's traffic, in one graph.
rl_k_cost rl_k_attn_cudnn_bwd_cost(int B, int T, int H, int KV, int hd) {
    rl_k_cost c = rl_k_attn_bwd_cost(B, T, H, KV, hd, 1);
    c.bytes -= (double)B * T * H * hd * 8; // the accumulator zeroed, then read back
    c.launches = 1;
    return c;
}

// ---- the choice (train.attention) ---------------------------------------------------------------
// auto and cudnn alike: both backends on probe inputs of the model's shapes
// must agree -- max |difference| / max |own output| at most
// RL_ATTN_AGREE_FWD for out, RL_ATTN_AGREE_BWD for dq|dk|dv. bf16 outputs
// carry 2^-9 relative rounding; the backends differ in summation order and
// in where P and dS are rounded to bf16 (test-gpu sees ~2e-3 between our
// kernels and an f64 reference), so 1e-2 and 3e-2 leave room for that and
// none for a wrong mask, layout or scale, which errs by O(1). A cuDNN that
// finalizes a graph and runs it may still compute it wrong (H200, cuDNN 9:
// dQ, dK off by 1e2, GQA's dK, dV uninitialised, no error), so cudnn
// without agreement fails rather than train on wrong gradients.
#define RL_ATTN_AGREE_FWD 1e-2
#define RL_ATTN_AGREE_BWD 3e-2
#define RL_ATTN_REPS 3

struct probe_bufs {
    int B, T, H, KV, hd;
    bool deterministic; // else our dQ by atomics, into dq_acc, as the model runs it
    bf16 *qkv, *out[2], *dout, *dqkv[2];
    float *lse[2], *dsum, *dq_acc;
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

// One forward and backward of backend k (0 own, 1 cuDNN a) into its
// buffers. RoPE is the model's own pass around attention, for either
// backend: not part of what is compared.
static int run_one(int k, rl_cudnn_attn *a, probe_bufs *p, cudaStream_t s, rl_err *e) {
    int B = p->B, T = p->T, H = p->H, KV = p->KV, hd = p->hd;
    if (k == 0) {
        RL_TRY(rl_k_attn_fwd(p->out[0], p->lse[0], p->qkv, B, T, H, KV, hd, s, e));
        return rl_k_attn_bwd(p->dqkv[0], p->dsum, p->dq_acc, p->dout, p->qkv, p->out[0],
                             p->lse[0], B, T, H, KV, hd, NULL, 0, s, e);
    }
    RL_TRY(rl_k_attn_cudnn_fwd(a, p->out[1], p->lse[1], p->qkv, B, T, s, e));
    return rl_k_attn_cudnn_bwd(a, p->dqkv[1], p->dsum, p->dout, p->qkv, p->out[1], p->lse[1], B, T,
                               s, e);
}

// Milliseconds per forward + backward of backend k, RL_ATTN_REPS timed.
static int time_one(int k, rl_cudnn_attn *a, probe_bufs *p, cudaStream_t s, float *ms, rl_err *e) {
    cudaEvent_t ev[2];
    CUDA_CHECK(cudaEventCreate(&ev[0]));
    CUDA_CHECK(cudaEventCreate(&ev[1]));
    int rc = RL_OK;
    cudaError_t ce = cudaEventRecord(ev[0], s);
    for (int r = 0; r < RL_ATTN_REPS && !rc && ce == cudaSuccess; r++) rc = run_one(k, a, p, s, e);
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
static int probe_alloc(probe_bufs *p, cudaStream_t s, rl_err *e) {
    int N = p->B * p->T;
    size_t C3 = (size_t)(p->H + 2 * p->KV) * p->hd, qd = (size_t)p->H * p->hd, n = (size_t)N * C3;
    CUDA_CHECK(cudaMalloc(&p->qkv, n * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&p->dout, (size_t)N * qd * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&p->dsum, (size_t)N * p->H * sizeof(float)));
    if (!p->deterministic) CUDA_CHECK(cudaMalloc(&p->dq_acc, (size_t)N * qd * sizeof(float)));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMalloc(&p->out[k], (size_t)N * qd * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&p->dqkv[k], n * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&p->lse[k], (size_t)N * p->H * sizeof(float)));
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
                    p->dqkv[0], p->dqkv[1], p->lse[0], p->lse[1], p->dq_acc};
    for (void *q : ptrs) cudaFree(q);
}

// Both backends on the probe inputs: *a the cuDNN backend when its out and
// dq|dk|dv agree with ours, else NULL and `why` says why not (cuDNN's
// refusal or failure, or the differences). An error returned is a CUDA
// one, the model's to report.
static int agreeing(rl_cudnn_attn **a, probe_bufs *p, cudaStream_t s, double diff[2], char *why,
                    size_t nwhy, rl_err *e) {
    int N = p->B * p->T, rc;
    size_t C3 = (size_t)(p->H + 2 * p->KV) * p->hd, qd = (size_t)p->H * p->hd;
    rl_err ce = {0, {0}};
    rl_cudnn_attn *c = NULL;
    *a = NULL;
    diff[0] = diff[1] = INFINITY;
    RL_TRY(run_one(0, NULL, p, s, e));
    rc = rl_cudnn_attn_create(&c, p->B, p->T, p->H, p->KV, p->hd, p->deterministic, s, &ce);
    if (!rc) rc = run_one(1, c, p, s, &ce);
    if (!rc) diff[0] = max_rel_diff(p->out[0], p->out[1], (size_t)N * qd, &ce, &rc);
    if (!rc) diff[1] = max_rel_diff(p->dqkv[0], p->dqkv[1], (size_t)N * C3, &ce, &rc);
    if (rc && strncmp(ce.msg, "cuDNN", 5) != 0) {
        rl_cudnn_attn_free(c);
        return rl_errf(e, rc, "%s", ce.msg);
    }
    if (!rc && diff[0] <= RL_ATTN_AGREE_FWD && diff[1] <= RL_ATTN_AGREE_BWD) return *a = c, RL_OK;
    if (rc)
        snprintf(why, nwhy, "%s", ce.msg);
    else
        snprintf(why, nwhy, "cuDNN disagrees with our kernels: fwd_diff %.2e bwd_diff %.2e",
                 diff[0], diff[1]);
    rl_cudnn_attn_free(c);
    return RL_OK;
}

// auto without cuDNN (absent, refusing the graphs, failing to run them or
// running them wrong): our kernels, and one line saying why.
static int fall_back(const char *why) {
    char msg[1100];
    rl_log(RL_LOG_INFO, "attention_backend",
           "\"requested\":\"auto\",\"choice\":\"own\",\"reason\":\"%s\"",
           rl_json_escape(msg, sizeof msg, why));
    return RL_OK;
}

// One line for cuDNN's agreement (auto: pick says whether it also ran
// faster than ours)
static void log_choice(int mode, const rl_cudnn_attn *a, int pick, const float ms[2],
                       const double diff[2]) {
    char t[96] = "";
    if (mode == RL_GPU_ATTN_AUTO)
        snprintf(t, sizeof t, ",\"own_ms\":%.3f,\"cudnn_ms\":%.3f", ms[0], ms[1]);
    rl_log(RL_LOG_INFO, "attention_backend",
           "\"requested\":\"%s\",\"choice\":\"%s\",\"cudnn_version\":%zu%s,"
           "\"fwd_diff\":%.2e,\"bwd_diff\":%.2e,\"agree\":true,\"deterministic\":%s,"
           "\"cudnn_workspace_mib\":%.1f,\"B\":%d,\"T\":%d",
           mode == RL_GPU_ATTN_AUTO ? "auto" : "cudnn", pick ? "cudnn" : "own",
           dnn.cudnnGetVersion(), t, diff[0], diff[1], a->deterministic ? "true" : "false",
           a->ws_bytes / 1048576.0, a->B, a->T);
}

int rl_gpu_attn_select(rl_cudnn_attn **out, int mode, int B, int T, int H, int KV, int hd,
                       int deterministic, cudaStream_t s, rl_err *e) {
    *out = NULL;
    if (mode == RL_GPU_ATTN_OWN) return RL_OK;
    if (mode != RL_GPU_ATTN_AUTO && mode != RL_GPU_ATTN_CUDNN)
        return rl_errf(e, RL_EINPUT, "train.attention: unknown backend %d", mode);
    bool forced = mode == RL_GPU_ATTN_CUDNN;
    rl_err ce = {0, {0}};
    if (cudnn_load(&ce)) {
        if (forced)
            return rl_errf(e, ce.code, "train.attention cudnn: %s (auto or own run without it)",
                           ce.msg);
        return fall_back(ce.msg);
    }
    probe_bufs p;
    memset(&p, 0, sizeof p);
    p.B = B, p.T = T, p.H = H, p.KV = KV, p.hd = hd, p.deterministic = deterministic;
    rl_cudnn_attn *a = NULL;
    char why[sizeof ce.msg];
    double diff[2] = {0, 0};
    float ms[2] = {0, 0};
    int rc = probe_alloc(&p, s, e);
    if (!rc) rc = agreeing(&a, &p, s, diff, why, sizeof why, e);
    if (!rc && a && !forced)
        for (int k = 0; k < 2 && !rc; k++) rc = time_one(k, a, &p, s, &ms[k], e);
    probe_free(&p);
    if (rc || !a) {
        rl_cudnn_attn_free(a);
        if (rc) return rc;
        if (forced)
            return rl_errf(e, RL_EIO, "train.attention cudnn: %s (auto or own run without it)",
                           why);
        return fall_back(why);
    }
    int pick = forced || ms[1] < ms[0]; // a tie keeps our kernels
    log_choice(mode, a, pick, ms, diff);
    if (pick)
        *out = a;
    else
        rl_cudnn_attn_free(a);
    return RL_OK;
}
