/* The sampler maps a global sample index to a window without any state, so
 * every rank computes its own samples and a resumed run continues exactly
 * where it stopped, whatever the world size.
 *
 * The per-epoch shuffle is a keyed bijection on [0, n_windows): a balanced
 * Feistel network over the smallest domain 4^h >= n_windows (two h-bit
 * halves; a Feistel network is a permutation for any round function), with
 * cycle walking to stay inside [0, n_windows). Because 4^h < 4*n_windows
 * (for n_windows > 1), a walk takes fewer than four steps on average. Six
 * rounds with splitmix-derived keys are plenty for shuffling training data;
 * this is not a cryptographic PRP and does not need to be. */
#include "data/data.h"

#define FEISTEL_ROUNDS 6

int rl_sampler_init(rl_sampler *s, uint64_t dataset_tokens, int seq_len, uint64_t seed,
                    bool shuffle, rl_err *e) {
    if (seq_len < 1) return rl_errf(e, RL_EINPUT, "seq_len must be >= 1, got %d", seq_len);
    if (dataset_tokens < (uint64_t)seq_len + 1)
        return rl_errf(e, RL_EINPUT,
                       "dataset has %llu tokens, fewer than seq_len+1 = %d needed for one "
                       "sample",
                       (unsigned long long)dataset_tokens, seq_len + 1);
    s->n_windows = (dataset_tokens - 1) / (uint64_t)seq_len;
    s->seq_len = seq_len;
    s->seed = seed;
    s->shuffle = shuffle;
    return RL_OK;
}

/* Half width h >= 1 with 4^h >= n. h >= 1 keeps the network non-degenerate
 * for n = 1 (the walk then ends at 0 at once). */
static int half_bits(uint64_t n) {
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < n) h++;
    return h;
}

static uint64_t permute(uint64_t x, uint64_t n, uint64_t seed, uint64_t epoch) {
    int h = half_bits(n);
    uint64_t mask = (h == 32) ? 0xFFFFFFFFull : ((1ull << h) - 1);
    uint64_t key[FEISTEL_ROUNDS];
    uint64_t base = rl_hash64(rl_hash64(seed) ^ epoch);
    for (int r = 0; r < FEISTEL_ROUNDS; r++) key[r] = rl_hash64(base + (uint64_t)r);
    /* Terminates: x lies on a cycle of the domain permutation that contains
     * the starting point, which is < n. */
    do {
        uint64_t l = (x >> h) & mask, r = x & mask;
        for (int i = 0; i < FEISTEL_ROUNDS; i++) {
            uint64_t f = rl_hash64(r ^ key[i]) & mask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        x = (l << h) | r;
    } while (x >= n);
    return x;
}

uint64_t rl_sampler_offset(const rl_sampler *s, uint64_t g) {
    uint64_t n = s->n_windows;
    uint64_t epoch = g / n, w = g % n;
    if (s->shuffle) w = permute(w, n, s->seed, epoch);
    return w * (uint64_t)s->seq_len;
}
