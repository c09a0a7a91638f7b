/* Deterministic randomness. xoshiro256** for streams, splitmix64 for seeding
 * and as a stateless mixer: every random choice in training derives from
 * the job seed, so two runs with one seed are bit-identical. */
#include "util.h"

#include <math.h>

uint64_t rl_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t rl_hash64(uint64_t x) {
    uint64_t s = x;
    return rl_splitmix64(&s);
}

void rl_rng_seed(rl_rng *r, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < 4; i++) r->s[i] = rl_splitmix64(&s);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rl_rng_u64(rl_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double rl_rng_uniform(rl_rng *r) { return (double)(rl_rng_u64(r) >> 11) * 0x1.0p-53; }

double rl_rng_normal(rl_rng *r) {
    /* Box-Muller; the second value is dropped so the stream position depends
     * only on how many normals were drawn, not on cached state. */
    double u1 = rl_rng_uniform(r), u2 = rl_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
