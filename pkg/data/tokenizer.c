/* Byte-level tokenizer: a byte is its own token and 256 separates documents.
 * Trivial on purpose; it lets the whole pipeline run on any text with no
 * vocabulary file, and a real BPE can sit behind the same shard format. */
#include "data/data.h"

void rl_tok_encode(const unsigned char *src, size_t n, uint16_t *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

size_t rl_tok_decode(const int32_t *tok, size_t n, char *dst, size_t cap) {
    if (cap == 0) return 0;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++)
        if (tok[i] >= 0 && tok[i] <= 255) dst[o++] = (char)(unsigned char)tok[i];
    dst[o] = '\0';
    return o;
}
