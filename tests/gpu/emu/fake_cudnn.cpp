// cuDNN for the emulated build (make test-gpu-emu): the subset of the
// graph backend API kernels/gpu_attn_cudnn.cu calls, linked in place of
// dlopen("libcudnn.so.9").
//
// It validates what real cuDNN validates for these descriptors, so a graph
// that passes here is at least well-formed: each attribute's type and
// count for its descriptor type (an attribute it does not know:
// CUDNN_STATUS_NOT_SUPPORTED); no SetAttribute after Finalize; descriptors
// referenced by others finalized and of the right kind; tensors with data
// type, dims, strides (same count), uid and alignment, positive extents,
// by-value only for scalars; matmul, pointwise, reduction and reshape
// shapes consistent (batch dims broadcast by whole multiples, as GQA uses
// them); in a graph, uids unique across tensors, every virtual tensor made
// by exactly one operation, no cycle; heuristics, engine configs, plans and
// variant packs in order; at execution every non-virtual tensor bound to
// device memory (fake_cuda's allocations) aligned as declared.
//
// Execution interprets the graph on the host in fp32 (fp64 sums), rounding
// each tensor to its data type (bf16 intermediates as bf16): the SDPA
// graphs compute real attention, so `auto` compares and picks for real and
// the backend can be checked against our kernels and the CPU reference.
// The fake runtime is synchronous, so execution at the call is in stream
// order; on a capturing stream (cudnnSetStream's) the execution is
// recorded and runs at each replay of the graph, as a captured cuDNN
// kernel would.
//
// What real cuDNN gets wrong, where we know it, it gets wrong too: it
// reports 9.1, and cuDNN <= 9.15 computes an attention backward wrongly,
// with no error, when a sequence length is not a multiple of 128 and the
// graph has no padding mask (cudnn-frontend adds one with full lengths as
// its workaround; H200 showed the symptom) -- here a backward graph (one
// with a reshape: the transposes of P, dS, K) whose matmuls carry no M/N/K
// override and have an extent not a multiple of 128 writes NaN to every
// output.
//
// RL_EMU_CUDNN=absent: rl_emu_cudnn_present() says no (the loader reports
// libcudnn missing); RL_EMU_CUDNN=refuse: every execution plan's Finalize
// returns CUDNN_STATUS_NOT_SUPPORTED (a cuDNN whose engines refuse the
// graph); RL_EMU_CUDNN=bwd-wrong: every backward graph runs without error
// and writes NaN (a cuDNN that computes the backward wrong, as H200's
// did). Read at each call, so tests switch it between models.
#include <cuda_runtime.h>
#include <cudnn_graph.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "tests/gpu/emu/emu.h"

namespace {

typedef std::vector<int64_t> dims_t;

struct Attr {
    cudnnBackendAttributeType_t type;
    int64_t n;
    std::vector<char> bytes;
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    bool final = false;
    std::map<int, Attr> attrs;
    // tensor
    int64_t uid = 0, align = 0;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    dims_t dim, str;
    bool virt = false, byval = false;
    // operations (matmul: x = A, b = B, y = C) and their settings
    Desc *x = nullptr, *b = nullptr, *y = nullptr, *t = nullptr;
    Desc *ov[3] = {nullptr, nullptr, nullptr}; // matmul: M, N, K overrides
    int mode = 0;
    int64_t axis = -1;
    // graph, heuristics, engine config / engine, plan, variant pack
    std::vector<Desc *> ops;
    bool bwd = false, padded = false, odd = false; // graph features
    Desc *graph = nullptr, *cfg = nullptr;
    int engine = 0;
    std::map<int64_t, void *> ptr;
    void *ws = nullptr;
};

std::mutex mu;
std::set<Desc *> live;
std::set<void *> handles;
std::map<void *, cudaStream_t> streams; // cudnnSetStream's, per handle

const char *env_mode() {
    const char *m = getenv("RL_EMU_CUDNN");
    return m ? m : "";
}

size_t type_size(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_INT64: return 8;
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
    case CUDNN_TYPE_FLOAT: return 4;
    default: return 4; // the enum-valued types
    }
}

// (descriptor type, attribute) -> (attribute type, most elements)
struct Rule {
    int dtype, attr;
    cudnnBackendAttributeType_t type;
    int64_t max;
};
const Rule rules[] = {
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1},
    {CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_DESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_OPERATOR,
     CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
     1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_OPS,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 256},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
     1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
     256},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
     CUDNN_TYPE_VOID_PTR, 256},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
     1},
};

// The descriptor types each BACKEND_DESCRIPTOR attribute may point at
// (-1: any operation).
int wants(int attr) {
    switch (attr) {
    case CUDNN_ATTR_OPERATION_MATMUL_DESC: return CUDNN_BACKEND_MATMUL_DESCRIPTOR;
    case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR: return CUDNN_BACKEND_POINTWISE_DESCRIPTOR;
    case CUDNN_ATTR_OPERATION_REDUCTION_DESC: return CUDNN_BACKEND_REDUCTION_DESCRIPTOR;
    case CUDNN_ATTR_OPERATIONGRAPH_OPS: return -1;
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH: return CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR;
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: return CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
    default: return CUDNN_BACKEND_TENSOR_DESCRIPTOR;
    }
}
bool is_op(int t) {
    return t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

template <class T> const T *val(Desc *d, int a, int64_t *n = nullptr) {
    auto it = d->attrs.find(a);
    if (it == d->attrs.end()) return nullptr;
    if (n) *n = it->second.n;
    return (const T *)it->second.bytes.data();
}
Desc *ref(Desc *d, int a) {
    const void *const *p = val<void *>(d, a);
    return p ? (Desc *)*p : nullptr;
}
// an operation's input tensors (x, b, t, the matmul overrides), present or not
std::vector<Desc *> inputs(Desc *op) {
    return {op->x, op->b, op->t, op->ov[0], op->ov[1], op->ov[2]};
}
int64_t count(const dims_t &d) {
    int64_t n = 1;
    for (int64_t x : d) n *= x;
    return n;
}

cudnnStatus_t fin_tensor(Desc *d) {
    int64_t nd = 0, ns = 0;
    const cudnnDataType_t *dt = val<cudnnDataType_t>(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
    const int64_t *dim = val<int64_t>(d, CUDNN_ATTR_TENSOR_DIMENSIONS, &nd);
    const int64_t *str = val<int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES, &ns);
    const int64_t *uid = val<int64_t>(d, CUDNN_ATTR_TENSOR_UNIQUE_ID);
    const int64_t *al = val<int64_t>(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    if (!dt || !dim || !str || !uid || !al) return CUDNN_STATUS_BAD_PARAM;
    if (nd != ns || nd < 1) return CUDNN_STATUS_BAD_PARAM;
    d->dim.assign(dim, dim + nd), d->str.assign(str, str + ns);
    for (int i = 0; i < nd; i++)
        if (dim[i] < 1 || str[i] < 1) return CUDNN_STATUS_BAD_PARAM;
    if (*dt != CUDNN_DATA_FLOAT && *dt != CUDNN_DATA_BFLOAT16 && *dt != CUDNN_DATA_INT32 &&
        *dt != CUDNN_DATA_BOOLEAN)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    if (*al < 1 || (*al & (*al - 1))) return CUDNN_STATUS_BAD_PARAM;
    const bool *v = val<bool>(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL),
               *bv = val<bool>(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
    d->dt = *dt, d->uid = *uid, d->align = *al, d->virt = v && *v, d->byval = bv && *bv;
    if (d->virt && d->byval) return CUDNN_STATUS_BAD_PARAM;
    if (d->byval && (count(d->dim) != 1 || d->dt != CUDNN_DATA_FLOAT))
        return CUDNN_STATUS_NOT_SUPPORTED;
    return CUDNN_STATUS_SUCCESS;
}

// in broadcasts to out: every extent equal, 1, or (batch dims, fewer than
// 2 from the end) a divisor
bool bcast(const dims_t &in, const dims_t &out, bool groups) {
    if (in.size() != out.size()) return false;
    for (size_t i = 0; i < in.size(); i++) {
        bool batch = i + 2 < in.size();
        if (in[i] != out[i] && in[i] != 1 && !(groups && batch && out[i] % in[i] == 0))
            return false;
    }
    return true;
}

cudnnStatus_t fin_op(Desc *d) {
    switch (d->type) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        Desc *a = ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC),
             *b = ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
        Desc *c = ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC),
             *m = ref(d, CUDNN_ATTR_OPERATION_MATMUL_DESC);
        if (!a || !b || !c || !m) return CUDNN_STATUS_BAD_PARAM;
        size_t n = c->dim.size();
        if (n < 3 || a->dim.size() != n || b->dim.size() != n) return CUDNN_STATUS_BAD_PARAM;
        if (a->dim[n - 1] != b->dim[n - 2] || a->dim[n - 2] != c->dim[n - 2] ||
            b->dim[n - 1] != c->dim[n - 1])
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        dims_t ab(a->dim), bb(b->dim);
        ab[n - 1] = c->dim[n - 1], bb[n - 2] = c->dim[n - 2];
        if (!bcast(ab, c->dim, true) || !bcast(bb, c->dim, true))
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        if (a->dt == CUDNN_DATA_BOOLEAN || b->dt == CUDNN_DATA_BOOLEAN)
            return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
        // overrides: INT32 per-batch extents, [B, 1, ..., 1] under C's batch dims
        static const int ova[3] = {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
                                   CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                                   CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC};
        for (int i = 0; i < 3; i++) {
            Desc *o = d->ov[i] = ref(d, ova[i]);
            if (!o) continue;
            if (o->dt != CUDNN_DATA_INT32 || o->byval || o->dim.size() != n || o->dim[n - 1] != 1 ||
                o->dim[n - 2] != 1 || !bcast(o->dim, c->dim, false))
                return CUDNN_STATUS_BAD_PARAM;
        }
        d->x = a, d->b = b, d->y = c;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        Desc *p = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
        d->x = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC),
        d->b = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
        d->y = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC),
        d->t = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
        if (!p || !d->x || !d->y) return CUDNN_STATUS_BAD_PARAM;
        d->mode = p->mode, d->axis = p->axis;
        bool cmp = d->mode == CUDNN_POINTWISE_CMP_GE || d->mode == CUDNN_POINTWISE_CMP_LT ||
                   d->mode == CUDNN_POINTWISE_LOGICAL_AND;
        bool binary = d->mode == CUDNN_POINTWISE_ADD || d->mode == CUDNN_POINTWISE_MUL ||
                      d->mode == CUDNN_POINTWISE_SUB || d->mode == CUDNN_POINTWISE_DIV || cmp ||
                      d->mode == CUDNN_POINTWISE_BINARY_SELECT;
        if (binary != (d->b != nullptr)) return CUDNN_STATUS_BAD_PARAM;
        if ((d->mode == CUDNN_POINTWISE_BINARY_SELECT) != (d->t != nullptr))
            return CUDNN_STATUS_BAD_PARAM;
        if (d->t && d->t->dt != CUDNN_DATA_BOOLEAN) return CUDNN_STATUS_BAD_PARAM;
        if (cmp && d->y->dt != CUDNN_DATA_BOOLEAN) return CUDNN_STATUS_BAD_PARAM;
        if (d->mode == CUDNN_POINTWISE_GEN_INDEX &&
            (d->axis < 0 || d->axis >= (int64_t)d->y->dim.size() || d->x->dim != d->y->dim))
            return CUDNN_STATUS_BAD_PARAM;
        for (Desc *in : {d->x, d->b, d->t})
            if (in && !bcast(in->dim, d->y->dim, false))
                return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        Desc *r = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
        d->x = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC),
        d->y = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
        if (!r || !d->x || !d->y || d->x->dim.size() != d->y->dim.size())
            return CUDNN_STATUS_BAD_PARAM;
        d->mode = r->mode;
        for (size_t i = 0; i < d->x->dim.size(); i++) {
            int64_t xi = d->x->dim[i], yi = d->y->dim[i];
            bool group = yi > 1 && yi < xi && xi % yi == 0 && d->mode == CUDNN_REDUCE_TENSOR_ADD;
            if (yi != xi && yi != 1 && !group) return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
        d->x = ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC),
        d->y = ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
        // a cast may come with it (the frontend's fp32 P, dS to bf16 P^T, dS^T)
        if (!d->x || !d->y || count(d->x->dim) != count(d->y->dim))
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        auto span = [](Desc *t) {
            int64_t s = 1;
            for (size_t i = 0; i < t->dim.size(); i++) s += (t->dim[i] - 1) * t->str[i];
            return s;
        };
        return span(d->x) == span(d->y) ? CUDNN_STATUS_SUCCESS
                                        : CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    }
    default: return CUDNN_STATUS_BAD_PARAM;
    }
}

// What the fault models look at: a backward graph (a reshape in it), a
// padding mask (matmul overrides), an extent not a multiple of 128 among
// the matmuls'.
void features(Desc *g) {
    for (Desc *op : g->ops) {
        g->bwd |= op->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
        if (op->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) continue;
        size_t n = op->y->dim.size();
        g->padded |= op->ov[0] || op->ov[1] || op->ov[2];
        g->odd |= op->y->dim[n - 1] % 128 || op->y->dim[n - 2] % 128 || op->x->dim[n - 1] % 128;
    }
}

// uids unique across tensors; each virtual tensor made by one operation
// and read by one at least; an order exists (no cycle).
cudnnStatus_t fin_graph(Desc *g) {
    int64_t n = 0;
    Desc *const *ops = val<Desc *>(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, &n);
    if (!ops || n < 1) return CUDNN_STATUS_BAD_PARAM;
    g->ops.assign(ops, ops + n);
    std::map<int64_t, Desc *> byuid;
    std::map<Desc *, int> made, read;
    for (Desc *op : g->ops) {
        if (!is_op(op->type)) return CUDNN_STATUS_BAD_PARAM;
        std::vector<Desc *> ts = inputs(op);
        ts.push_back(op->y);
        for (Desc *t : ts) {
            if (!t) continue;
            auto it = byuid.find(t->uid);
            if (it != byuid.end() && it->second != t)
                return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
            byuid[t->uid] = t;
            if (t == op->y)
                made[t]++;
            else
                read[t]++;
        }
    }
    for (auto &kv : byuid) {
        Desc *t = kv.second;
        if (made[t] > 1) return CUDNN_STATUS_BAD_PARAM;
        if (t->virt && (made[t] != 1 || read[t] < 1)) return CUDNN_STATUS_BAD_PARAM;
        if (!t->virt && !made[t] && !read[t]) return CUDNN_STATUS_BAD_PARAM;
    }
    std::set<Desc *> ready;
    for (auto &kv : byuid)
        if (!made[kv.second]) ready.insert(kv.second);
    std::vector<Desc *> order, left(g->ops);
    while (!left.empty()) {
        size_t before = left.size();
        for (size_t i = 0; i < left.size();) {
            Desc *op = left[i];
            bool ok = true;
            for (Desc *t : inputs(op)) ok &= !t || ready.count(t);
            if (!ok) {
                i++;
                continue;
            }
            order.push_back(op), ready.insert(op->y), left.erase(left.begin() + i);
        }
        if (left.size() == before) return CUDNN_STATUS_BAD_PARAM; // a cycle
    }
    g->ops = order; // executed in this order
    features(g);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize(Desc *d) {
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return fin_tensor(d);
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: {
        const cudnnDataType_t *c = val<cudnnDataType_t>(d, CUDNN_ATTR_MATMUL_COMP_TYPE);
        if (!c) return CUDNN_STATUS_BAD_PARAM;
        return *c == CUDNN_DATA_FLOAT ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
    }
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
        const cudnnPointwiseMode_t *m = val<cudnnPointwiseMode_t>(d, CUDNN_ATTR_POINTWISE_MODE);
        const int64_t *ax = val<int64_t>(d, CUDNN_ATTR_POINTWISE_AXIS);
        if (!m) return CUDNN_STATUS_BAD_PARAM;
        static const int known[] = {
            CUDNN_POINTWISE_ADD,         CUDNN_POINTWISE_MUL,       CUDNN_POINTWISE_SUB,
            CUDNN_POINTWISE_DIV,         CUDNN_POINTWISE_EXP,       CUDNN_POINTWISE_LOG,
            CUDNN_POINTWISE_IDENTITY,    CUDNN_POINTWISE_CMP_GE,    CUDNN_POINTWISE_CMP_LT,
            CUDNN_POINTWISE_LOGICAL_AND, CUDNN_POINTWISE_GEN_INDEX, CUDNN_POINTWISE_BINARY_SELECT};
        bool ok = false;
        for (int k : known) ok |= *m == k;
        if (!ok) return CUDNN_STATUS_NOT_SUPPORTED;
        if (*m == CUDNN_POINTWISE_GEN_INDEX && !ax) return CUDNN_STATUS_BAD_PARAM;
        d->mode = *m, d->axis = ax ? *ax : -1;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
        const cudnnReduceTensorOp_t *r =
            val<cudnnReduceTensorOp_t>(d, CUDNN_ATTR_REDUCTION_OPERATOR);
        if (!r || !val<cudnnDataType_t>(d, CUDNN_ATTR_REDUCTION_COMP_TYPE))
            return CUDNN_STATUS_BAD_PARAM;
        if (*r != CUDNN_REDUCE_TENSOR_ADD && *r != CUDNN_REDUCE_TENSOR_MAX)
            return CUDNN_STATUS_NOT_SUPPORTED;
        d->mode = *r;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return fin_graph(d);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        const cudnnBackendHeurMode_t *m =
            val<cudnnBackendHeurMode_t>(d, CUDNN_ATTR_ENGINEHEUR_MODE);
        d->graph = ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        if (!m || !d->graph) return CUDNN_STATUS_BAD_PARAM;
        return *m == CUDNN_HEUR_MODE_A || *m == CUDNN_HEUR_MODE_FALLBACK
                   ? CUDNN_STATUS_SUCCESS
                   : CUDNN_STATUS_NOT_SUPPORTED;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        d->cfg = ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (!d->cfg || !val<void *>(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE))
            return CUDNN_STATUS_BAD_PARAM;
        if (!strcmp(env_mode(), "refuse")) return CUDNN_STATUS_NOT_SUPPORTED;
        d->graph = d->cfg->graph;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        int64_t nu = 0, np = 0;
        const int64_t *u = val<int64_t>(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &nu);
        void *const *p = val<void *>(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, &np);
        void *const *ws = val<void *>(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        if (!u || !p || nu != np) return CUDNN_STATUS_BAD_PARAM;
        for (int64_t i = 0; i < nu; i++)
            if (!d->ptr.emplace(u[i], p[i]).second)
                return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
        d->ws = ws ? *ws : nullptr;
        return CUDNN_STATUS_SUCCESS;
    }
    default: return is_op(d->type) ? fin_op(d) : CUDNN_STATUS_NOT_SUPPORTED;
    }
}

// ---- execution ----------------------------------------------------------------------------------
float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
float store_round(float v, cudnnDataType_t dt) {
    switch (dt) {
    case CUDNN_DATA_BFLOAT16: return bf16_round(v);
    case CUDNN_DATA_BOOLEAN: return v != 0.0f;
    case CUDNN_DATA_INT32: return (float)(int32_t)v;
    default: return v;
    }
}

typedef std::map<Desc *, std::vector<float>> values;

// Row-major index over dims -> element offset under strides
int64_t offset(const dims_t &dim, const dims_t &str, int64_t lin) {
    int64_t off = 0;
    for (int i = (int)dim.size() - 1; i >= 0; i--) off += (lin % dim[i]) * str[i], lin /= dim[i];
    return off;
}
// The index into `in` (dims broadcast or grouped into `out`'s) of out's
// element lin
int64_t bindex(const dims_t &in, const dims_t &out, int64_t lin) {
    int64_t idx = 0, mul = 1;
    for (int i = (int)out.size() - 1; i >= 0; i--) {
        int64_t o = lin % out[i];
        lin /= out[i];
        int64_t k = in[i] == out[i] ? o : in[i] == 1 ? 0 : o / (out[i] / in[i]);
        idx += k * mul, mul *= in[i];
    }
    return idx;
}

void load(Desc *t, void *p, std::vector<float> &v) {
    v.resize(count(t->dim));
    for (int64_t i = 0; i < (int64_t)v.size(); i++) {
        int64_t o = t->byval ? 0 : offset(t->dim, t->str, i);
        if (t->dt == CUDNN_DATA_BFLOAT16) {
            uint32_t u = (uint32_t)((const uint16_t *)p)[o] << 16;
            memcpy(&v[i], &u, 4);
        } else if (t->dt == CUDNN_DATA_INT32) {
            v[i] = (float)((const int32_t *)p)[o];
        } else {
            v[i] = ((const float *)p)[o];
        }
    }
}
void store(Desc *t, void *p, const std::vector<float> &v) {
    for (int64_t i = 0; i < (int64_t)v.size(); i++) {
        int64_t o = offset(t->dim, t->str, i);
        if (t->dt == CUDNN_DATA_BFLOAT16) {
            float f = bf16_round(v[i]);
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[o] = (uint16_t)(u >> 16);
        } else if (t->dt == CUDNN_DATA_INT32) {
            ((int32_t *)p)[o] = (int32_t)v[i];
        } else {
            ((float *)p)[o] = v[i];
        }
    }
}

// A matmul override's extent for C's batch z (none: full)
int64_t extent(Desc *ov, const dims_t &cb, int64_t z, int64_t full, values &V) {
    if (!ov) return full;
    dims_t ob(ov->dim.begin(), ov->dim.end() - 2);
    int64_t e = (int64_t)V[ov][bindex(ob, cb, z)];
    return e < full ? e : full;
}

// C = A B within the overrides' extents (rows and columns beyond: 0)
void run_matmul(Desc *op, values &V) {
    Desc *a = op->x, *b = op->b, *c = op->y;
    size_t n = c->dim.size();
    int64_t M = c->dim[n - 2], N = c->dim[n - 1], K = a->dim[n - 1],
            batches = count(c->dim) / (M * N);
    dims_t cb(c->dim.begin(), c->dim.end() - 2), ab(a->dim.begin(), a->dim.end() - 2),
        bb(b->dim.begin(), b->dim.end() - 2);
    const std::vector<float> &A = V[a], &B = V[b];
    std::vector<float> &C = V[c];
    C.assign(count(c->dim), 0.0f);
    for (int64_t z = 0; z < batches; z++) {
        const float *pa = &A[bindex(ab, cb, z) * M * K], *pb = &B[bindex(bb, cb, z) * K * N];
        int64_t m = extent(op->ov[0], cb, z, M, V), nn = extent(op->ov[1], cb, z, N, V),
                kk = extent(op->ov[2], cb, z, K, V);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < nn; j++) {
                double acc = 0;
                for (int64_t k = 0; k < kk; k++) acc += (double)pa[i * K + k] * pb[k * N + j];
                C[(z * M + i) * N + j] = store_round((float)acc, c->dt);
            }
    }
}

void run_pointwise(Desc *op, values &V) {
    Desc *y = op->y;
    int64_t n = count(y->dim);
    std::vector<float> &Y = V[y];
    Y.resize(n);
    const std::vector<float> *X = &V[op->x], *Bv = op->b ? &V[op->b] : nullptr,
                             *Tv = op->t ? &V[op->t] : nullptr;
    for (int64_t i = 0; i < n; i++) {
        float x = (*X)[bindex(op->x->dim, y->dim, i)],
              b = Bv ? (*Bv)[bindex(op->b->dim, y->dim, i)] : 0, r;
        switch (op->mode) {
        case CUDNN_POINTWISE_ADD: r = x + b; break;
        case CUDNN_POINTWISE_MUL: r = x * b; break;
        case CUDNN_POINTWISE_SUB: r = x - b; break;
        case CUDNN_POINTWISE_DIV: r = x / b; break;
        case CUDNN_POINTWISE_EXP: r = expf(x); break;
        case CUDNN_POINTWISE_LOG: r = logf(x); break;
        case CUDNN_POINTWISE_CMP_GE: r = x >= b; break;
        case CUDNN_POINTWISE_CMP_LT: r = x < b; break;
        case CUDNN_POINTWISE_LOGICAL_AND: r = x != 0 && b != 0; break;
        case CUDNN_POINTWISE_GEN_INDEX: {
            int64_t lin = i;
            for (int64_t k = (int64_t)y->dim.size() - 1; k > op->axis; k--) lin /= y->dim[k];
            r = (float)(lin % y->dim[op->axis]);
            break;
        }
        case CUDNN_POINTWISE_BINARY_SELECT:
            r = (*Tv)[bindex(op->t->dim, y->dim, i)] != 0 ? x : b;
            break;
        default: r = x; // IDENTITY
        }
        Y[i] = store_round(r, y->dt);
    }
}

void run_reduction(Desc *op, values &V) {
    Desc *x = op->x, *y = op->y;
    int64_t n = count(x->dim);
    bool mx = op->mode == CUDNN_REDUCE_TENSOR_MAX;
    std::vector<double> acc(count(y->dim), mx ? -INFINITY : 0.0);
    const std::vector<float> &X = V[x];
    for (int64_t i = 0; i < n; i++) {
        int64_t j = bindex(y->dim, x->dim, i); // x's element i lands in y's j
        acc[j] = mx ? fmax(acc[j], (double)X[i]) : acc[j] + X[i];
    }
    std::vector<float> &Y = V[y];
    Y.resize(acc.size());
    for (size_t j = 0; j < acc.size(); j++) Y[j] = store_round((float)acc[j], y->dt);
}

// y's view of x's memory: x laid out under its strides, read under y's
void run_reshape(Desc *op, values &V) {
    Desc *x = op->x, *y = op->y;
    const std::vector<float> &X = V[x];
    int64_t span = 1;
    for (size_t i = 0; i < x->dim.size(); i++) span += (x->dim[i] - 1) * x->str[i];
    std::vector<float> mem(span), &Y = V[y];
    for (int64_t i = 0; i < (int64_t)X.size(); i++) mem[offset(x->dim, x->str, i)] = X[i];
    Y.resize(X.size());
    for (int64_t i = 0; i < (int64_t)Y.size(); i++)
        Y[i] = store_round(mem[offset(y->dim, y->str, i)], y->dt);
}

// The fault models (the file's head): does this graph run wrong?
bool runs_wrong(Desc *g) {
    if (!g->bwd) return false;
    if (!strcmp(env_mode(), "bwd-wrong")) return true;
    return !g->padded && g->odd; // cuDNN <= 9.15's, which this one reports itself as
}

cudnnStatus_t execute(Desc *plan, Desc *vp) {
    Desc *g = plan->graph;
    values V;
    std::set<Desc *> outs;
    for (Desc *op : g->ops) outs.insert(op->y);
    // bind and check every non-virtual tensor
    std::map<Desc *, void *> bound;
    for (Desc *op : g->ops) {
        std::vector<Desc *> ts = inputs(op);
        ts.push_back(op->y);
        for (Desc *t : ts) {
            if (!t || t->virt || bound.count(t)) continue;
            auto it = vp->ptr.find(t->uid);
            if (it == vp->ptr.end() || !it->second) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
            if (!t->byval) {
                cudaPointerAttributes pa;
                if (cudaPointerGetAttributes(&pa, it->second) != cudaSuccess ||
                    pa.type != cudaMemoryTypeDevice)
                    return CUDNN_STATUS_BAD_PARAM; // host memory where a device pointer belongs
                if ((uintptr_t)it->second % (uintptr_t)t->align)
                    return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
            }
            bound[t] = it->second;
            if (!outs.count(t)) load(t, it->second, V[t]);
        }
    }
    bool wrong = runs_wrong(g);
    for (Desc *op : g->ops) {
        switch (op->type) {
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: run_matmul(op, V); break;
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: run_pointwise(op, V); break;
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: run_reduction(op, V); break;
        default: run_reshape(op, V);
        }
        if (!op->y->virt && wrong)
            store(op->y, bound[op->y], std::vector<float>(V[op->y].size(), NAN));
        else if (!op->y->virt)
            store(op->y, bound[op->y], V[op->y]);
    }
    return CUDNN_STATUS_SUCCESS;
}

Desc *live_desc(void *p) {
    Desc *d = (Desc *)p;
    return live.count(d) ? d : nullptr;
}

} // namespace

// ---- the API -----------------------------------------------------------------------------------
extern "C" int rl_emu_cudnn_present(void) { return strcmp(env_mode(), "absent") != 0; }

size_t cudnnGetVersion(void) { return 90100; } // as PyTorch's nvidia-cudnn-cu12 wheels ship
const char *cudnnGetErrorString(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES:
        return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    default: return "CUDNN_STATUS_INTERNAL_ERROR (emulated)";
    }
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    std::lock_guard<std::mutex> g(mu);
    *h = (cudnnHandle_t)malloc(16);
    handles.insert(*h);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    std::lock_guard<std::mutex> g(mu);
    if (!handles.erase(h)) return CUDNN_STATUS_BAD_PARAM;
    free(h);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    std::lock_guard<std::mutex> g(mu);
    if (!handles.count(h)) return CUDNN_STATUS_BAD_PARAM;
    streams[h] = s;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t,
                                           cudnnBackendDescriptor_t *d) {
    std::lock_guard<std::mutex> g(mu);
    Desc *p = new Desc();
    p->type = t;
    live.insert(p);
    *d = p;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    std::lock_guard<std::mutex> g(mu);
    Desc *p = live_desc(d);
    if (!p) return CUDNN_STATUS_BAD_PARAM;
    live.erase(p);
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    std::lock_guard<std::mutex> g(mu);
    Desc *p = live_desc(d);
    if (!p || !v || n < 1) return CUDNN_STATUS_BAD_PARAM;
    if (p->final) return CUDNN_STATUS_BAD_PARAM; // finalized descriptors are immutable
    const Rule *r = nullptr;
    for (const Rule &k : rules)
        if (k.dtype == p->type && k.attr == a) r = &k;
    if (!r) return CUDNN_STATUS_NOT_SUPPORTED;
    if (r->type != t) return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
    if (n > r->max) return CUDNN_STATUS_BAD_PARAM;
    if (t == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < n; i++) {
            Desc *q = live_desc(((void *const *)v)[i]);
            int want = wants(a);
            if (!q || (want >= 0 ? q->type != want : !is_op(q->type)))
                return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
            if (!q->final) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
        }
    if (t == CUDNN_TYPE_HANDLE && !handles.count(*(void *const *)v)) return CUDNN_STATUS_BAD_PARAM;
    Attr &at = p->attrs[a];
    at.type = t, at.n = n;
    at.bytes.assign((const char *)v, (const char *)v + n * type_size(t));
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
    std::lock_guard<std::mutex> g(mu);
    Desc *p = live_desc(d);
    if (!p || p->final) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t s = finalize(p);
    if (s == CUDNN_STATUS_SUCCESS) p->final = true;
    return s;
}

// Two engines for every graph: 0 noted non-deterministic (as split-K
// backward engines are), 1 not; a deterministic caller must pass over 0.
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d,
                                       cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                                       int64_t req, int64_t *n, void *out) {
    std::lock_guard<std::mutex> g(mu);
    Desc *p = live_desc(d);
    if (!p || !n) return CUDNN_STATUS_BAD_PARAM;
    if (!p->final) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    if (p->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && a == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (t != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
        int64_t k = req < 2 ? req : 2;
        for (int64_t i = 0; i < k; i++) {
            Desc *c = live_desc(((void **)out)[i]);
            if (!c || c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
                return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
            c->graph = p->graph, c->engine = (int)i, c->final = true;
        }
        *n = req ? k : 2;
        return CUDNN_STATUS_SUCCESS;
    }
    if (p->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && a == CUDNN_ATTR_ENGINECFG_ENGINE) {
        Desc *c =
            t == CUDNN_TYPE_BACKEND_DESCRIPTOR && req >= 1 ? live_desc(*(void **)out) : nullptr;
        if (!c || c->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
        c->graph = p->graph, c->engine = p->engine, c->final = true, *n = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (p->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && a == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        if (t != CUDNN_TYPE_NUMERICAL_NOTE) return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
        *n = p->engine == 0 ? 1 : 0;
        if (*n && req >= 1)
            ((cudnnBackendNumericalNote_t *)out)[0] = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        return CUDNN_STATUS_SUCCESS;
    }
    if (p->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
        a == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (t != CUDNN_TYPE_INT64 || req < 1) return CUDNN_STATUS_BAD_PARAM;
        *(int64_t *)out = 4096, *n = 1; // some, so that the caller's workspace is exercised
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t vp) {
    {
        // RL_EMU_DEFER: what the handle's stream queued before this call (its
        // inputs) runs first -- outside mu, which a queued replay takes
        cudaStream_t s0 = nullptr;
        {
            std::lock_guard<std::mutex> g(mu);
            if (streams.count(h)) s0 = streams[h];
        }
        if (s0) rl_emu_stream_run(s0);
    }
    std::lock_guard<std::mutex> g(mu);
    Desc *p = live_desc(plan), *v = live_desc(vp);
    if (!handles.count(h) || !p || !v || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
        v->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return CUDNN_STATUS_BAD_PARAM;
    if (!p->final || !v->final) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    if (!v->ws) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER; // the plan asked for 4096 bytes
    cudaStream_t s = streams.count(h) ? streams[h] : nullptr;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (s) cudaStreamIsCapturing(s, &cs);
    if (cs == cudaStreamCaptureStatusNone) return execute(p, v);
    // captured: as real captured kernels hold the pack's pointers and its
    // by-value scalars as they were at the call, the graph keeps a copy of
    // the pack and of those scalars (the caller may free both now); the
    // plan must outlive the graph. A failure at replay is a bug in the
    // emulated run, and stops it loudly.
    auto pack = std::make_shared<Desc>(*v);
    auto scalars = std::make_shared<std::deque<double>>(); // stable addresses
    for (Desc *op : p->graph->ops)
        for (Desc *t : inputs(op)) {
            auto it = t && t->byval ? pack->ptr.find(t->uid) : pack->ptr.end();
            if (it == pack->ptr.end() || !it->second) continue;
            scalars->push_back(0);
            memcpy(&scalars->back(), it->second, t->dt == CUDNN_DATA_DOUBLE ? 8 : 4);
            it->second = &scalars->back();
        }
    rl_emu_enqueue(s, [p, pack, scalars] {
        std::lock_guard<std::mutex> g2(mu);
        cudnnStatus_t st = execute(p, pack.get());
        if (st != CUDNN_STATUS_SUCCESS) {
            fprintf(stderr, "emu cudnnBackendExecute: a captured execution failed at replay (%d)\n",
                    (int)st);
            abort();
        }
    });
    return CUDNN_STATUS_SUCCESS;
}
