/* tok's shared state: the tokenizer as the parser (json.c) builds it and
 * the encoder (bpe.c) reads it. */
#ifndef RL_TOK_INTERNAL_H
#define RL_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tok/tok.h"

#define RL_BPE_NONE UINT32_MAX

/* A model vocabulary entry: its bytes in the arena. */
typedef struct {
    uint32_t off, len, id;
} rl_bpe_entry;

typedef struct {
    char *s; /* the content, NUL-terminated */
    size_t n;
    uint32_t id;
    bool special;
    bool normalized; /* matched after the normalizer (tokenizers' default: not special) */
} rl_bpe_added;

struct rl_bpe {
    uint32_t n_vocab;
    char *arena; /* every token's bytes */
    size_t arena_len, arena_cap;
    /* decoding: the bytes of id i at arena + dec_off[i] (dec_len[i] ==
     * RL_BPE_NONE: no token has that id) */
    uint32_t *dec_off, *dec_len;
    /* encoding: the model vocabulary by bytes (open addressing; a slot holds
     * entry index + 1, 0 is empty) */
    rl_bpe_entry *ent;
    uint32_t nent, *vmap, vmask;
    uint32_t byte_id[256]; /* the one-byte tokens, RL_BPE_NONE if missing */
    /* merges: (left id, right id) -> rank and merged id; key ~0 is empty */
    uint64_t *mkey;
    uint32_t *mrank, *mnew, mmask;
    /* added tokens sorted by first byte, then longest first; those starting
     * with byte c are added[afirst[c] .. afirst[c+1]) */
    rl_bpe_added *added;
    int nadded, afirst[257];
    /* pre-tokenizer: the Split patterns in order, then ByteLevel */
    pcre2_code **splits;
    int nsplits;
    bool prefix_space;
    pcre2_code *bl_re; /* GPT-2's pattern (use_regex), or NULL */
    /* post-processor template */
    uint32_t *prefix, *suffix;
    int nprefix, nsuffix;
    uint32_t unk; /* RL_BPE_NONE: unknown symbols are dropped */
    bool fuse_unk, ignore_merges;
    bool nfc; /* normalizer NFC */
    char sha256[65];
};

/* Lookups shared by the parser and the encoder. */
uint32_t rl_bpe_lookup(const rl_bpe *t, const char *s, size_t n); /* vocab id or RL_BPE_NONE */
static inline uint64_t rl_bpe_pair(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }
static inline uint64_t rl_bpe_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}
/* A token's bytes hashed (FNV-1a, then mixed): the vocabulary's and the
 * word cache's slots. */
static inline uint64_t rl_bpe_hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return rl_bpe_hash(h);
}

#endif
