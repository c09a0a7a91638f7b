/* The float instantiation of cpu_impl.inc: what the trainer runs, on our
 * own GEMM where the CPU has AVX-512 (sgemm.c). */
#include "cpu.h"
#define R float
#define FN(x) x##_f32
#define GEMM(order, ...) rl_cpu_sgemm(__VA_ARGS__) /* row-major, as every call is */
#include <stdint.h>
#include <string.h>

/* expf in plain arithmetic, so that the loops calling it vectorize (glibc's
 * expf is a call per element: a tenth of a step's time went there). e^x =
 * 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r by Cephes' expf
 * polynomial (about 1 ulp over the range; the f32 model's checks against
 * the f64 one and against transformers hold at their tolerances). n is
 * rounded by adding 1.5 * 2^23, so no float becomes an int (which NaN would
 * make undefined). x is clamped to [-87.33, 88], where 2^n stays a normal
 * float: below, e^x is 1.2e-38 instead of smaller (immaterial beside what it
 * is added to); above, never reached (softmax arguments are <= 0, and
 * silu's e^-x that large makes the gate 0 either way). NaN passes through. */
static inline float rl_cpu_expf(float x) {
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.3365447f ? -87.3365447f : x;
    float t = x * 1.44269504088896341f + 12582912.0f, n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits, sb;
    memcpy(&bits, &t, sizeof bits);
    sb = (bits - 0x4B400000u + 127u) << 23; /* t's low bits hold n */
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    return p * scale;
}
#define EXP rl_cpu_expf
#define HOT __attribute__((target_clones("default", "avx2", "avx512f")))
#include "cpu_impl.inc"
