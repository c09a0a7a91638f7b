/* The float model's GEMM on CPUs with AVX-512: C = alpha op(A) op(B) + beta C,
 * row-major, on the calling thread. Elsewhere it is OpenBLAS's cblas_sgemm.
 *
 * Why our own: on an AVX-512 CPU OpenBLAS may still run its AVX2 kernels
 * (OPENBLAS_CORETYPE pins it, and some environments set it for every
 * process), and GEMMs are 80 % of a CPU step, so the step ran at half the
 * CPU's rate. What the kernel set is no longer decides that.
 *
 * The loops are the usual five around a register-blocked micro-kernel:
 * C by column panels of NC, K by blocks of KC (B's block packed into
 * slivers of NR columns, the whole panel for the next loop), C's rows by
 * blocks of MC (A's block packed into slivers of MR rows), then every
 * (MR x NR) tile of the block. A B sliver (KC x NR, 32 KB) stays in L1
 * while the A slivers stream past from L2. The micro-kernel holds the
 * MR x NR tile in 16 zmm accumulators: per k, two loads of B and eight
 * broadcasts of A feed sixteen FMAs.
 *
 * Results: every element of C sums its products in k order, one FMA per
 * product, KC of them into a register and the blocks added to C in order,
 * so a call gives the same bits whatever the threads, and the model keeps
 * its bit-identical reruns. They differ from OpenBLAS's in the last bits
 * (other blocking); the model's checks hold with either. */
#include "cpu.h"

#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

enum { MR = 8, NR = 32, KC = 256, MC = 128, NC = 1024 };

/* Packing buffers, one set per thread, allocated on the thread's first
 * call and freed when it exits: the model calls from its OpenMP threads
 * (which live as long as the process) and from whatever thread trains.
 * Without them (no key, no memory) a call runs on OpenBLAS instead. */
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static bool pack_key_ok;
static void pack_key_init(void) { pack_key_ok = pthread_key_create(&pack_key, free) == 0; }

static float *pack_buffers(void) {
    pthread_once(&pack_once, pack_key_init);
    if (!pack_key_ok) return NULL;
    float *p = pthread_getspecific(pack_key);
    if (!p) {
        p = aligned_alloc(64, sizeof(float) * ((size_t)MC * KC + (size_t)KC * NC));
        if (p && pthread_setspecific(pack_key, p)) free(p), p = NULL;
    }
    return p;
}

/* d[c * ld + r] = s[r * ls + c] for an 8 x 8 block: the packing's transposes
 * (rows of A into k-major slivers, and B's columns the same), by 8 at once
 * where the scalar copy took a sixth of a step (perf: 16.6 %). */
__attribute__((target("avx512f"))) static inline void tr8x8(const float *s, size_t ls, float *d, size_t ld) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * ls);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* rows i, i+1 interleaved, low pairs */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* ... high pairs */
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(d + i * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(d + (i + 4) * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* A[i0 .. i0+mc) x [p0 .. p0+kc) as slivers of MR rows: sliver s holds, for
 * each k, its MR rows' values (rows past mc are zeros). */
__attribute__((target("avx512f"))) static void pack_a(bool trans, const float *A, int lda, int i0, int mc, int p0, int kc, float *ap) {
    for (int s = 0; s < mc; s += MR, ap += (size_t)MR * kc) {
        int n = mc - s < MR ? mc - s : MR;
        if (trans) { /* A(i, k) = A[k * lda + i]: rows of a sliver are contiguous */
            for (int k = 0; k < kc; k++) {
                const float *src = A + (size_t)(p0 + k) * lda + i0 + s;
                for (int i = 0; i < n; i++) ap[k * MR + i] = src[i];
                for (int i = n; i < MR; i++) ap[k * MR + i] = 0;
            }
        } else {
            const float *src = A + (size_t)(i0 + s) * lda + p0;
            int k8 = n == MR ? kc / 8 * 8 : 0;
            for (int k = 0; k < k8; k += 8) tr8x8(src + k, lda, ap + k * MR, MR);
            for (int i = 0; i < n; i++)
                for (int k = k8; k < kc; k++) ap[k * MR + i] = src[(size_t)i * lda + k];
            for (int i = n; i < MR; i++)
                for (int k = 0; k < kc; k++) ap[k * MR + i] = 0;
        }
    }
}

/* lanes [0, n) of 16 */
static inline __mmask16 tail_mask(int n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* B[p0 .. p0+kc) x [j0 .. j0+nc) as slivers of NR columns, k-major inside. */
__attribute__((target("avx512f"))) static void pack_b(bool trans, const float *B, int ldb, int p0, int kc, int j0, int nc, float *bp) {
    for (int t = 0; t < nc; t += NR, bp += (size_t)NR * kc) {
        int n = nc - t < NR ? nc - t : NR;
        if (trans) { /* B(k, j) = B[j * ldb + k]: a column is contiguous */
            const float *src = B + (size_t)(j0 + t) * ldb + p0;
            int j8 = n / 8 * 8, k8 = kc / 8 * 8;
            for (int j = 0; j < j8; j += 8)
                for (int k = 0; k < k8; k += 8) tr8x8(src + (size_t)j * ldb + k, ldb, bp + k * NR + j, NR);
            for (int j = 0; j < n; j++)
                for (int k = j < j8 ? k8 : 0; k < kc; k++) bp[k * NR + j] = src[(size_t)j * ldb + k];
            for (int j = n; j < NR; j++)
                for (int k = 0; k < kc; k++) bp[k * NR + j] = 0;
        } else { /* a row of the sliver is contiguous: two masked loads (0 past n) */
            __mmask16 m0 = tail_mask(n), m1 = tail_mask(n - 16);
            for (int k = 0; k < kc; k++) {
                const float *src = B + (size_t)(p0 + k) * ldb + j0 + t;
                _mm512_store_ps(bp + k * NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(bp + k * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        }
    }
}

/* The MR x NR tile: c = alpha * (a-sliver . b-sliver) + beta * c on the first
 * K block (beta 0: c not read, BLAS's rule, so it may hold NaN), c += alpha *
 * (...) on the later ones (first = false). m x n of the tile is inside C.
 * Not instrumented by the sanitizers: it reads only the packed slivers
 * (ours, sized by the blocking) and writes C through masks the unit tests
 * check; instrumented, each of its loads cost more than the FMAs it feeds
 * and the sanitizer builds' training ran at a tenth of OpenBLAS's speed. */
__attribute__((target("avx512f"), no_sanitize("address", "undefined"))) static void tile(int kc, const float *a, const float *b, float *c,
                                                    int ldc, int m, int n, float alpha, float beta,
                                                    bool first) {
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++, a += MR, b += NR) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(first ? beta : 1.0f);
    bool add = !first || beta != 0;
    __mmask16 m0 = tail_mask(n), m1 = tail_mask(n - 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) { /* unrolled whole, so acc stays in registers */
        if (i >= m) break;
        float *ci = c + (size_t)i * ldc;
        __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
        if (add) {
            r0 = _mm512_add_ps(r0, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m0, ci)));
            r1 = _mm512_add_ps(r1, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m1, ci + 16)));
        }
        _mm512_mask_storeu_ps(ci, m0, r0);
        _mm512_mask_storeu_ps(ci + 16, m1, r1);
    }
}

static void scale_c(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * C[(size_t)i * ldc + j];
}

static bool own_kernel(void) { return __builtin_cpu_supports("avx512f"); }

const char *rl_cpu_sgemm_kernels(void) { return own_kernel() ? "ringleader-avx512" : NULL; }

void rl_cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    float *buf = own_kernel() ? pack_buffers() : NULL;
    if (!buf) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    float *ap = buf, *bp = buf + (size_t)MC * KC;
    bool at = ta != CblasNoTrans, bt = tb != CblasNoTrans;
    for (int j0 = 0; j0 < N; j0 += NC) {
        int nc = N - j0 < NC ? N - j0 : NC;
        for (int p0 = 0; p0 < K; p0 += KC) {
            int kc = K - p0 < KC ? K - p0 : KC;
            pack_b(bt, B, ldb, p0, kc, j0, nc, bp);
            for (int i0 = 0; i0 < M; i0 += MC) {
                int mc = M - i0 < MC ? M - i0 : MC;
                pack_a(at, A, lda, i0, mc, p0, kc, ap);
                for (int t = 0; t < nc; t += NR)
                    for (int s = 0; s < mc; s += MR)
                        tile(kc, ap + (size_t)s * kc, bp + (size_t)t * kc,
                             C + (size_t)(i0 + s) * ldc + j0 + t, ldc, mc - s < MR ? mc - s : MR,
                             nc - t < NR ? nc - t : NR, alpha, beta, p0 == 0);
            }
        }
    }
}
