// Every GEMM of the model through cuBLASLt: bf16 operands, fp32 compute
// (CUBLAS_COMPUTE_32F: no reduced-precision accumulation), bf16 or fp32
// outputs; weight gradients either accumulated into (beta = 1) or written
// (beta = 0: the first micro-batch of a step, no zeroed buffer needed).
//
// Descriptors, layouts and the algorithm are built once per distinct call
// (shape, transposes, output type, whether C is read, pointer alignments)
// and kept in a small table: a training step repeats the same dozen-odd
// shapes, so after the first step a GEMM costs one table lookup and the
// cublasLtMatmul call. The workspace is the owner's, allocated once.
//
// The algorithm: the heuristic's top RL_GEMM_CANDIDATES are timed on the
// first call of a shape (two runs each on the caller's own operands, the
// output rewritten by the winner last) and the fastest kept; the heuristic's
// first choice is not always the fastest, least of all for odd shapes such
// as lm_head's. A product that adds into its own output (C == D, weight
// gradients after the first micro-batch) cannot run twice, so it takes the
// winner of its beta = 0 twin (same shape, output written: the first
// micro-batch's), which keeps the accumulated sum bit-equal to a sum of the
// written products. An SM count target (rl_gemm.sm_count, 0: all) leaves
// SMs to NCCL's kernels that overlap the backward.
//
// Row-major to column-major: a row-major [R, C] matrix is the column-major
// [C, R] matrix with the same bytes, so each row-major product is written as
// its transpose. With X^T meaning "the same bytes read column-major":
//   fwd        out = in . w^T    <=>  out^T (N x M) = op_T(w) . in^T
//   bwd data   din = dout . w    <=>  din^T (K x M) = w^T . dout^T
//   bwd weight dw += dout^T . in <=>  dw^T (K x N) += in^T . op_T(dout^T)   (or =)
// (fwd is cuBLAS's "TN" form, the one every library tunes best.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gpu_internal.cuh"

struct rl_gemm_plan {
    // key
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    cudaDataType_t ctype;
    int read_c;
    unsigned al_a, al_b, al_c, al_d;
    // cached
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t cand[RL_GEMM_CANDIDATES];
    int ncand, chosen; // chosen: algo is final (timed, adopted, or the only one)
};

#define RL_GEMM_PLANS 128

int rl_gpu_cublas_fail(rl_err *e, cublasStatus_t st, const char *call, const char *file, int line) {
    return rl_errf(e, st == CUBLAS_STATUS_ALLOC_FAILED ? RL_ENOMEM : RL_EIO, "%s:%d: %s: %s (%s)",
                   file, line, call, cublasLtGetStatusName(st), cublasLtGetStatusString(st));
}

int rl_gpu_cuda_fail(rl_err *e, cudaError_t err, const char *call, const char *file, int line) {
    return rl_errf(e, err == cudaErrorMemoryAllocation ? RL_ENOMEM : RL_EIO, "%s:%d: %s: %s (%s)",
                   file, line, call, cudaGetErrorName(err), cudaGetErrorString(err));
}

int rl_gemm_init(rl_gemm *g, void *ws, size_t ws_bytes, rl_err *e) {
    memset(g, 0, sizeof *g);
    g->ws = ws;
    g->ws_bytes = ws_bytes;
    g->plans = (rl_gemm_plan *)calloc(RL_GEMM_PLANS, sizeof(rl_gemm_plan));
    if (!g->plans) return rl_errf(e, RL_ENOMEM, "gemm: cannot allocate the plan table");
    g->cap = RL_GEMM_PLANS;
    CUBLAS_CHECK(cublasLtCreate(&g->lt));
    return RL_OK;
}

static void plan_destroy(rl_gemm_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void rl_gemm_free(rl_gemm *g) {
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) plan_destroy(&g->plans[i]);
    free(g->plans);
    if (g->lt) cublasLtDestroy(g->lt);
    memset(g, 0, sizeof *g);
}

// Largest power of two (up to 256) dividing the address: the heuristic must
// know it, or it may pick a kernel that needs 16-byte aligned rows.
static unsigned ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}

static int same_key(const rl_gemm_plan *p, const rl_gemm_plan *q) {
    return p->ta == q->ta && p->tb == q->tb && p->m == q->m && p->n == q->n && p->k == q->k &&
           p->lda == q->lda && p->ldb == q->ldb && p->ldc == q->ldc && p->ctype == q->ctype &&
           p->read_c == q->read_c && p->al_a == q->al_a && p->al_b == q->al_b &&
           p->al_c == q->al_c && p->al_d == q->al_d;
}

static int plan_build(rl_gemm *g, rl_gemm_plan *p, rl_err *e) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta, sizeof p->ta));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb, sizeof p->tb));
    if (g->sm_count > 0) {
        int32_t sms = g->sm_count;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                    &sms, sizeof sms));
    }
    // Layouts describe the stored matrices (before the op is applied).
    int ar = p->ta == CUBLAS_OP_N ? p->m : p->k, ac = p->ta == CUBLAS_OP_N ? p->k : p->m;
    int br = p->tb == CUBLAS_OP_N ? p->k : p->n, bc = p->tb == CUBLAS_OP_N ? p->n : p->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, ar, ac, p->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, br, bc, p->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, p->ctype, p->m, p->n, p->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = g->ws_bytes;
    // Split-K partial sums kept in a bf16 output would round every partial
    // to 8 bits of mantissa: allow only schemes that reduce in fp32 then.
    uint32_t red =
        p->ctype == CUDA_R_16BF
            ? (uint32_t)(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
            : (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *v;
        size_t n;
    } prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
        {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->al_a, sizeof p->al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->al_b, sizeof p->al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->al_c, sizeof p->al_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->al_d, sizeof p->al_d},
    };
    for (size_t i = 0; i < sizeof prefs / sizeof prefs[0] && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].v, prefs[i].n);
    cublasLtMatmulHeuristicResult_t res[RL_GEMM_CANDIDATES];
    int count = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref,
                                            RL_GEMM_CANDIDATES, res, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS)
        return rl_gpu_cublas_fail(e, st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (count < 1 || res[0].state != CUBLAS_STATUS_SUCCESS)
        return rl_errf(e, RL_EINTERNAL,
                       "gemm: cuBLASLt has no algorithm for m=%d n=%d k=%d (op %c%c, ld %d/%d/%d, "
                       "%s out, align %u/%u/%u/%u)",
                       p->m, p->n, p->k, p->ta == CUBLAS_OP_N ? 'N' : 'T',
                       p->tb == CUBLAS_OP_N ? 'N' : 'T', p->lda, p->ldb, p->ldc,
                       p->ctype == CUDA_R_32F ? "fp32" : "bf16", p->al_a, p->al_b, p->al_c,
                       p->al_d);
    for (int i = 0; i < count; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->ncand++] = res[i].algo;
    p->algo = p->cand[0];
    p->chosen = p->ncand == 1;
    return RL_OK;
}

static int run(rl_gemm *g, const rl_gemm_plan *p, const cublasLtMatmulAlgo_t *algo, const bf16 *A,
               const bf16 *B, const void *C, void *D, cudaStream_t s, rl_err *e) {
    const float alpha = 1.0f, beta = p->read_c ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(g->lt, p->op, &alpha, A, p->la, B, p->lb, &beta,
                                p->read_c ? C : D, p->lc, D, p->lc, algo, g->ws, g->ws_bytes, s));
    return RL_OK;
}

// Times each candidate twice on the stream (after what is queued there; the
// host waits, once per shape, on the first step) and keeps the fastest. A
// candidate that fails to run is skipped; the first one always runs.
static int tune(rl_gemm *g, rl_gemm_plan *p, const bf16 *A, const bf16 *B, const void *C, void *D,
                cudaStream_t s, rl_err *e) {
    cudaEvent_t ev[2];
    cudaError_t ce = cudaEventCreate(&ev[0]);
    if (ce == cudaSuccess && (ce = cudaEventCreate(&ev[1])) != cudaSuccess) cudaEventDestroy(ev[0]);
    if (ce != cudaSuccess) return rl_gpu_cuda_fail(e, ce, "cudaEventCreate", __FILE__, __LINE__);
    float best = -1;
    int rc = RL_OK;
    for (int i = 0; i < p->ncand && !rc; i++) {
        float ms = 0;
        ce = cudaEventRecord(ev[0], s);
        int bad = ce != cudaSuccess || run(g, p, &p->cand[i], A, B, C, D, s, e) ||
                  run(g, p, &p->cand[i], A, B, C, D, s, e);
        if (!bad) ce = cudaEventRecord(ev[1], s);
        if (!bad && ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
        if (!bad && ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (i == 0 && (bad || ce != cudaSuccess))
            rc = bad ? e->code : rl_gpu_cuda_fail(e, ce, "gemm tuning", __FILE__, __LINE__);
        else if (!bad && ce == cudaSuccess && (best < 0 || ms < best))
            best = ms, p->algo = p->cand[i];
        cudaGetLastError(); // a refused candidate leaves no sticky error behind
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    p->chosen = 1;
    return rc;
}

// The written (beta = 0) twin of an accumulating plan, if it has chosen.
static const rl_gemm_plan *twin(const rl_gemm *g, const rl_gemm_plan *p) {
    rl_gemm_plan k = *p;
    k.read_c = 0;
    k.al_c = k.al_d;
    for (int i = 0; i < g->n_plans; i++)
        if (same_key(&g->plans[i], &k) && g->plans[i].chosen) return &g->plans[i];
    return NULL;
}

// Column-major D[m,n] = opA(A) . opB(B) + beta C, with C read only when
// read_c (beta = 1) and C == D allowed.
static int gemm_lt(rl_gemm *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const bf16 *A, int lda, const bf16 *B, int ldb, const void *C, void *D, int ldc,
                   cudaDataType_t ctype, int read_c, cudaStream_t s, rl_err *e) {
    if (m < 1 || n < 1 || k < 1)
        return rl_errf(e, RL_EINTERNAL, "gemm: empty product m=%d n=%d k=%d", m, n, k);
    rl_gemm_plan key;
    memset(&key, 0, sizeof key);
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.ctype = ctype, key.read_c = read_c;
    key.al_a = ptr_align(A), key.al_b = ptr_align(B);
    key.al_c = ptr_align(read_c ? C : D), key.al_d = ptr_align(D);
    rl_gemm_plan *p = NULL;
    for (int i = 0; i < g->n_plans; i++)
        if (same_key(&g->plans[i], &key)) {
            p = &g->plans[i];
            break;
        }
    if (!p) {
        // A full table recycles its slots in turn: a process that walks
        // through many shapes (the tests) stays bounded; training never
        // gets here after its first step.
        int slot = g->n_plans < g->cap ? g->n_plans++ : (g->evict++ % g->cap);
        p = &g->plans[slot];
        plan_destroy(p);
        *p = key;
        int rc = plan_build(g, p, e);
        if (rc) {
            plan_destroy(p);
            // keep the table dense: a failed slot at the end is given back
            if (slot == g->n_plans - 1) g->n_plans--;
            return rc;
        }
    }
    if (!p->chosen && read_c && C == D) {
        const rl_gemm_plan *t = twin(g, p);
        if (t) p->algo = t->algo, p->chosen = 1;
    } else if (!p->chosen) {
        RL_TRY(tune(g, p, A, B, C, D, s, e));
    }
    return run(g, p, &p->algo, A, B, C, D, s, e);
}

int rl_gemm_fwd(rl_gemm *g, void *out, int out_f32, const bf16 *in, const bf16 *w, const float *res,
                int M, int N, int K, cudaStream_t s, rl_err *e) {
    if (res && !out_f32) return rl_errf(e, RL_EINTERNAL, "gemm: a residual needs an fp32 output");
    return gemm_lt(g, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, in, K, res, out, N,
                   out_f32 ? CUDA_R_32F : CUDA_R_16BF, res != NULL, s, e);
}

int rl_gemm_bwd_data(rl_gemm *g, void *din, int din_f32, const bf16 *dout, const bf16 *w, int M,
                     int N, int K, cudaStream_t s, rl_err *e) {
    return gemm_lt(g, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dout, N, NULL, din, K,
                   din_f32 ? CUDA_R_32F : CUDA_R_16BF, 0, s, e);
}

int rl_gemm_bwd_weight(rl_gemm *g, float *dw, const bf16 *dout, const bf16 *in, int M, int N, int K,
                       int accumulate, cudaStream_t s, rl_err *e) {
    return gemm_lt(g, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, in, K, dout, N, dw, dw, K, CUDA_R_32F,
                   accumulate != 0, s, e);
}

// bf16 operands read once (the tiles' re-reads hit L2), out written, C read
rl_k_cost rl_k_gemm_cost(int M, int N, int K, int out_bytes, int c_bytes) {
    rl_k_cost c;
    c.flops = 2.0 * M * N * K;
    c.bytes = 2.0 * ((double)M * K + (double)N * K) + (double)M * N * (out_bytes + c_bytes);
    c.launches = 1;
    return c;
}
