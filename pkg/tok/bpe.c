/* Byte-level BPE encoding and decoding (tok.h): added tokens cut out,
 * pre-tokenizer patterns applied piece by piece, then each piece (a "word")
 * merged by rank. The merge loop keeps the symbols in a linked list and the
 * candidate pairs in a min-heap of (rank, position), so a word of n bytes
 * costs O(n log n) however long (a run of 100k spaces is one word). */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* PCRE2's backtracking bound per match, far above what the tokenizers'
 * patterns need (they are linear), low enough that a hostile pattern in a
 * tokenizer.json fails a document instead of stalling. */
#define MATCH_LIMIT 10000000u
/* words up to this many bytes are cached per encoder */
#define CACHE_WORD 24
#define CACHE_SLOTS 4096
#define CACHE_IDS 8

typedef struct {
    uint8_t len, nids; /* len 0: empty slot */
    char w[CACHE_WORD];
    uint32_t ids[CACHE_IDS];
} cache_slot;

struct rl_bpe_enc {
    const rl_bpe *t;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    char *tmp; /* a piece with its prefix space */
    size_t tmp_cap;
    /* the merge loop's scratch, per word */
    uint32_t *id;
    int32_t *prev, *next;
    uint64_t *heap;
    size_t cap;
    cache_slot *cache;
};

void rl_bpe_ids_free(rl_bpe_ids *ids) {
    free(ids->v);
    *ids = (rl_bpe_ids){0};
}

static int push_id(rl_bpe_ids *o, uint32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        uint32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) return RL_ENOMEM;
        o->v = v, o->cap = cap;
    }
    o->v[o->n++] = id;
    return RL_OK;
}

int rl_bpe_enc_new(const rl_bpe *t, rl_bpe_enc **out, rl_err *e) {
    rl_bpe_enc *enc = calloc(1, sizeof *enc);
    if (enc) {
        enc->t = t;
        enc->md = pcre2_match_data_create(1, NULL);
        enc->mc = pcre2_match_context_create(NULL);
        enc->cache = calloc(CACHE_SLOTS, sizeof *enc->cache);
    }
    if (!enc || !enc->md || !enc->mc || !enc->cache) {
        rl_bpe_enc_free(enc);
        return rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
    }
    pcre2_set_match_limit(enc->mc, MATCH_LIMIT);
    *out = enc;
    return RL_OK;
}

void rl_bpe_enc_free(rl_bpe_enc *enc) {
    if (!enc) return;
    pcre2_match_data_free(enc->md);
    pcre2_match_context_free(enc->mc);
    free(enc->tmp), free(enc->id), free(enc->prev), free(enc->next), free(enc->heap), free(enc->cache);
    free(enc);
}

/* ---- one word ------------------------------------------------------------------- */

static bool merge_of(const rl_bpe *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id) {
    if (a == RL_BPE_NONE || b == RL_BPE_NONE) return false;
    uint64_t key = rl_bpe_pair(a, b);
    for (uint32_t i = (uint32_t)rl_bpe_hash(key) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == key) return *rank = t->mrank[i], *id = t->mnew[i], true;
        if (t->mkey[i] == UINT64_MAX) return false;
    }
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c], i = c;
    }
    h[i] = v;
    return top;
}

static int grow(rl_bpe_enc *enc, size_t n) {
    if (n <= enc->cap) return RL_OK;
    size_t cap = enc->cap ? enc->cap : 64;
    while (cap < n) cap *= 2;
    uint32_t *id = realloc(enc->id, cap * sizeof *id);
    if (id) enc->id = id;
    int32_t *p = realloc(enc->prev, cap * sizeof *p);
    if (p) enc->prev = p;
    int32_t *q = realloc(enc->next, cap * sizeof *q);
    if (q) enc->next = q;
    uint64_t *h = realloc(enc->heap, 2 * cap * sizeof *h); /* each merge pushes at most two */
    if (h) enc->heap = h;
    if (!id || !p || !q || !h || cap > INT32_MAX) return RL_ENOMEM;
    enc->cap = cap;
    return RL_OK;
}

/* Appends the final symbols: an unknown byte is the unk token (runs of them
 * fused into one with fuse_unk) or nothing. */
static int emit(const rl_bpe *t, const uint32_t *id, const int32_t *next, rl_bpe_ids *o) {
    bool last_unk = false;
    for (int32_t i = 0; i >= 0; i = next[i]) {
        uint32_t v = id[i];
        if (v == RL_BPE_NONE) {
            if (t->unk == RL_BPE_NONE || (t->fuse_unk && last_unk)) continue;
            last_unk = true;
            v = t->unk;
        } else {
            last_unk = false;
        }
        if (push_id(o, v)) return RL_ENOMEM;
    }
    return RL_OK;
}

static int merge_word(rl_bpe_enc *enc, const unsigned char *w, size_t n, rl_bpe_ids *o) {
    const rl_bpe *t = enc->t;
    if (grow(enc, n)) return RL_ENOMEM;
    uint32_t *id = enc->id, rank, nid;
    int32_t *prev = enc->prev, *next = enc->next;
    uint64_t *heap = enc->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_id[w[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        if (i > 0 && merge_of(t, id[i - 1], id[i], &rank, &nid)) heap_push(heap, &nh, (uint64_t)rank << 32 | (i - 1));
    }
    while (nh > 0) {
        uint64_t top = heap_pop(heap, &nh);
        int32_t pos = (int32_t)(uint32_t)top, r = next[pos];
        /* stale: pos was absorbed by its left neighbour, or its pair changed */
        if (id[pos] == RL_BPE_NONE || r < 0 || !merge_of(t, id[pos], id[r], &rank, &nid) || rank != top >> 32)
            continue;
        id[pos] = nid;
        id[r] = RL_BPE_NONE; /* gone: unlinked below, never visited again */
        next[pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = pos;
        if (prev[pos] >= 0 && merge_of(t, id[prev[pos]], id[pos], &rank, &nid))
            heap_push(heap, &nh, (uint64_t)rank << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && merge_of(t, id[pos], id[next[pos]], &rank, &nid))
            heap_push(heap, &nh, (uint64_t)rank << 32 | (uint32_t)pos);
    }
    return emit(t, id, next, o);
}

/* A word: the whole of it when ignore_merges finds it in the vocabulary,
 * the cache's answer for a short one seen before, else the merge loop. */
static int encode_word(rl_bpe_enc *enc, const char *w, size_t n, rl_bpe_ids *o) {
    const rl_bpe *t = enc->t;
    if (n == 0) return RL_OK;
    if (t->ignore_merges) {
        uint32_t id = rl_bpe_lookup(t, w, n);
        if (id != RL_BPE_NONE) return push_id(o, id);
    }
    if (n == 1 && t->byte_id[(unsigned char)w[0]] != RL_BPE_NONE) return push_id(o, t->byte_id[(unsigned char)w[0]]);
    cache_slot *s = NULL;
    if (n <= CACHE_WORD) {
        s = &enc->cache[rl_bpe_hash_bytes(w, n) % CACHE_SLOTS];
        if (s->len == n && !memcmp(s->w, w, n)) {
            for (int i = 0; i < s->nids; i++)
                if (push_id(o, s->ids[i])) return RL_ENOMEM;
            return RL_OK;
        }
    }
    size_t before = o->n;
    int rc = merge_word(enc, (const unsigned char *)w, n, o);
    if (!rc && s && o->n - before <= CACHE_IDS) {
        s->len = (uint8_t)n, s->nids = (uint8_t)(o->n - before);
        memcpy(s->w, w, n);
        if (o->n > before) memcpy(s->ids, o->v + before, (o->n - before) * sizeof *o->v); /* o->v may be NULL */
    }
    return rc;
}

/* ---- pre-tokenization ------------------------------------------------------------ */

typedef int (*piece_fn)(rl_bpe_enc *enc, int stage, const char *s, size_t n, rl_bpe_ids *o, rl_err *e);

/* Cuts s into the pattern's matches and the gaps between them (tokenizers'
 * Isolated), handing each non-empty piece to fn at stage + 1. An empty
 * match still cuts there, then the search moves on one character. */
static int split(rl_bpe_enc *enc, const pcre2_code *re, int stage, const char *s, size_t n, piece_fn fn,
                 rl_bpe_ids *o, rl_err *e) {
    size_t last = 0, start = 0;
    int rc = RL_OK;
    while (start <= n && !rc) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, start, 0, enc->md, enc->mc);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            char msg[120];
            pcre2_get_error_message(m, (PCRE2_UCHAR *)msg, sizeof msg);
            return rl_errf(e, RL_EINPUT, "tokenizer: a pre_tokenizer pattern failed on this text: %s", msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(enc->md);
        size_t a = ov[0], b = ov[1];
        if (a > last) rc = fn(enc, stage + 1, s + last, a - last, o, e);
        if (!rc && b > a) rc = fn(enc, stage + 1, s + a, b - a, o, e);
        last = b;
        start = b;
        if (a == b) { /* past one character (or one invalid byte) */
            if (start >= n) break;
            start++;
            while (start < n && ((unsigned char)s[start] & 0xc0) == 0x80) start++;
        }
    }
    if (!rc && last < n) rc = fn(enc, stage + 1, s + last, n - last, o, e);
    return rc;
}

static int bpe_piece(rl_bpe_enc *enc, int stage, const char *s, size_t n, rl_bpe_ids *o, rl_err *e) {
    (void)stage;
    return encode_word(enc, s, n, o) ? rl_errf(e, RL_ENOMEM, "tokenizer: out of memory") : RL_OK;
}

/* Stage k < nsplits: Split pattern k; stage nsplits: ByteLevel (a prefix
 * space, then GPT-2's pattern when use_regex), whose pieces are words. */
static int pre_piece(rl_bpe_enc *enc, int stage, const char *s, size_t n, rl_bpe_ids *o, rl_err *e) {
    const rl_bpe *t = enc->t;
    if (stage < t->nsplits) return split(enc, t->splits[stage], stage, s, n, pre_piece, o, e);
    if (t->prefix_space && s[0] != ' ') {
        if (n + 1 > enc->tmp_cap) {
            char *p = realloc(enc->tmp, n + 1);
            if (!p) return rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
            enc->tmp = p, enc->tmp_cap = n + 1;
        }
        enc->tmp[0] = ' ';
        memcpy(enc->tmp + 1, s, n);
        s = enc->tmp, n++;
    }
    if (t->bl_re) return split(enc, t->bl_re, stage, s, n, bpe_piece, o, e);
    return bpe_piece(enc, stage, s, n, o, e);
}

/* Which added tokens a pass over the text matches: all of them (no
 * normalizer), or, with one, those matched on the text as given and then
 * those matched on its normalized pieces. */
enum { ADDED_ALL, ADDED_RAW, ADDED_NORMALIZED };

/* The added token starting at s (leftmost-longest: the caller tries each
 * position in order, the longest candidate first), or NULL. */
static const rl_bpe_added *added_at(const rl_bpe *t, const char *s, size_t n, bool special, int pass) {
    unsigned char c = (unsigned char)s[0];
    for (int k = t->afirst[c]; k < t->afirst[c + 1]; k++) {
        const rl_bpe_added *a = &t->added[k];
        if (pass != ADDED_ALL && a->normalized != (pass == ADDED_NORMALIZED)) continue;
        if ((special || !a->special) && a->n <= n && !memcmp(a->s, s, a->n)) return a;
    }
    return NULL;
}

/* NFC of s into a malloc'ed *out: each maximal run of valid UTF-8
 * normalized, other bytes kept as they are (the tokenizers library only
 * ever sees valid text; here any bytes encode). */
static int nfc(const char *s, size_t n, char **out, size_t *outn, rl_err *e) {
    char *o = malloc(n * 3 + 1); /* NFC grows a string at most 3x (UAX #15) */
    size_t k = 0;
    if (!o) return rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n;) {
        size_t j = i;
        utf8proc_int32_t cp;
        utf8proc_ssize_t step;
        while (j < n && (step = utf8proc_iterate((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(n - j), &cp)) > 0)
            j += (size_t)step;
        if (j > i) {
            utf8proc_uint8_t *m = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &m,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0 || k + (size_t)r > n * 3) {
                free(m), free(o);
                return rl_errf(e, r == UTF8PROC_ERROR_NOMEM ? RL_ENOMEM : RL_EINTERNAL, "tokenizer: NFC: %s",
                               r < 0 ? utf8proc_errmsg(r) : "longer than 3x");
            }
            memcpy(o + k, m, (size_t)r), k += (size_t)r;
            free(m);
        }
        if (j < n) o[k++] = s[j++]; /* one byte that starts no valid character */
        i = j;
    }
    o[k] = 0;
    *out = o, *outn = k;
    return RL_OK;
}

static bool ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* Text between added tokens: to the pre-tokenizers, or, in the raw pass
 * of a normalizing tokenizer, normalized first and split again on the
 * normalized added tokens. */
static int added_pass(rl_bpe_enc *enc, const char *text, size_t len, bool special, int pass, rl_bpe_ids *out,
                      rl_err *e);
static int between(rl_bpe_enc *enc, const char *s, size_t n, bool special, int pass, rl_bpe_ids *out, rl_err *e) {
    if (pass != ADDED_RAW) return pre_piece(enc, 0, s, n, out, e);
    if (ascii(s, n)) return added_pass(enc, s, n, special, ADDED_NORMALIZED, out, e); /* NFC leaves ASCII alone */
    char *norm = NULL;
    size_t nn = 0;
    int rc = nfc(s, n, &norm, &nn, e);
    if (!rc) rc = added_pass(enc, norm, nn, special, ADDED_NORMALIZED, out, e);
    free(norm);
    return rc;
}

static int added_pass(rl_bpe_enc *enc, const char *text, size_t len, bool special, int pass, rl_bpe_ids *out,
                      rl_err *e) {
    const rl_bpe *t = enc->t;
    size_t last = 0;
    int rc = RL_OK;
    for (size_t i = 0; i < len && !rc && t->nadded; i++) {
        unsigned char c = (unsigned char)text[i];
        if (t->afirst[c] == t->afirst[c + 1]) continue;
        const rl_bpe_added *a = added_at(t, text + i, len - i, special, pass);
        if (!a) continue;
        if (i > last) rc = between(enc, text + last, i - last, special, pass, out, e);
        if (!rc && push_id(out, a->id)) rc = rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
        last = i + a->n;
        i = last - 1;
    }
    if (!rc && len > last) rc = between(enc, text + last, len - last, special, pass, out, e);
    return rc;
}

int rl_bpe_encode(rl_bpe_enc *enc, const char *text, size_t len, bool special, rl_bpe_ids *out, rl_err *e) {
    return added_pass(enc, text, len, special, enc->t->nfc ? ADDED_RAW : ADDED_ALL, out, e);
}

int rl_bpe_decode(const rl_bpe *t, const uint32_t *ids, size_t n, char **buf, size_t *len, size_t *cap, rl_err *e) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->n_vocab || t->dec_len[ids[i]] == RL_BPE_NONE)
            return rl_errf(e, RL_EINPUT, "tokenizer: token id %u is not in the vocabulary (%u ids)", ids[i], t->n_vocab);
        size_t k = t->dec_len[ids[i]];
        if (*len + k + 1 > *cap) {
            size_t c = *cap ? *cap : 256;
            while (c < *len + k + 1) c *= 2;
            char *b = realloc(*buf, c);
            if (!b) return rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
            *buf = b, *cap = c;
        }
        memcpy(*buf + *len, t->arena + t->dec_off[ids[i]], k);
        *len += k;
        (*buf)[*len] = 0;
    }
    return RL_OK;
}
