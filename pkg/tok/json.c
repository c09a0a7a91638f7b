/* tokenizer.json -> rl_bpe (tok.h): every field the encoder depends on is
 * checked here, once; what the encoder does not implement is refused by
 * name. Token strings arrive in the byte-level alphabet (GPT-2's
 * bytes_to_unicode: printable Latin-1 stands for itself, the other 68 bytes
 * for U+0100..U+0143) and are stored as the bytes they stand for. */
#include "tok/tok_internal.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizers' ByteLevel pattern (use_regex: true) */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- the byte-level alphabet ------------------------------------------------ */

/* codepoint -> byte, -1 outside the alphabet (it ends at U+0143) */
static int16_t alpha_byte[0x144];

static void alpha_init(void) {
    static bool done; /* idempotent: racing initializers write the same values */
    if (done) return;
    for (int c = 0; c < 0x144; c++) alpha_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        alpha_byte[self ? b : 256 + extra++] = (int16_t)b;
    }
    done = true;
}

/* One UTF-8 codepoint at s[0..n) (n >= 1): its length, or 0 if invalid. */
static int utf8_cp(const unsigned char *s, size_t n, uint32_t *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    int len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
    if (!len || (size_t)len > n || s[0] > 0xf4) return 0;
    uint32_t c = s[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
    return *cp = c, len;
}

/* How many bytes of s[0..n), not valid UTF-8 there, one U+FFFD stands for:
 * a lead byte and the continuation bytes that could still follow it
 * (Unicode's maximal subpart, as Rust's from_utf8_lossy and Python do:
 * "\xe6\x97x" is one U+FFFD and x), else the one byte. */
static size_t invalid_run(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 1, k = 1;
    for (; k < len && k < n; k++) {
        /* the second byte's range is narrower after E0, ED, F0 and F4 */
        unsigned lo = k == 1 && c == 0xe0 ? 0xa0 : k == 1 && c == 0xf0 ? 0x90 : 0x80;
        unsigned hi = k == 1 && c == 0xed ? 0x9f : k == 1 && c == 0xf4 ? 0x8f : 0xbf;
        if (s[k] < lo || s[k] > hi) break;
    }
    return k;
}

char *rl_utf8_lossy(const char *in, size_t n, size_t *out_len) {
    char *out = malloc(3 * n + 1);
    size_t o = 0;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_cp((const unsigned char *)in + i, n - i, &cp);
        if (k > 0 && cp != 0) memcpy(out + o, in + i, (size_t)k), o += (size_t)k, i += (size_t)k;
        else /* NUL too: the result is a C string */
            memcpy(out + o, "\xef\xbf\xbd", 3), o += 3, i += k > 0 ? 1 : invalid_run((const unsigned char *)in + i, n - i);
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

/* Appends a token's bytes to the arena: its string read through the
 * alphabet, or (a character outside it, as tokenizers' ByteLevel decoder
 * does) the string's own bytes, *in_alpha false. */
static int arena_add(rl_bpe *t, const char *s, uint32_t *off, uint32_t *len, bool *in_alpha) {
    size_t n = strlen(s);
    if (t->arena_len + n + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_len + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return RL_ENOMEM;
        char *a = realloc(t->arena, cap);
        if (!a) return RL_ENOMEM;
        t->arena = a, t->arena_cap = cap;
    }
    char *dst = t->arena + t->arena_len;
    size_t o = 0;
    *in_alpha = true;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_cp((const unsigned char *)s + i, n - i, &cp);
        if (!k || cp >= 0x144 || alpha_byte[cp] < 0) {
            *in_alpha = false;
            break;
        }
        dst[o++] = (char)alpha_byte[cp];
        i += (size_t)k;
    }
    if (!*in_alpha) memcpy(dst, s, o = n);
    dst[o] = 0;
    *off = (uint32_t)t->arena_len, *len = (uint32_t)o;
    t->arena_len += o + 1;
    return RL_OK;
}

uint32_t rl_bpe_lookup(const rl_bpe *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)rl_bpe_hash_bytes(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t k = t->vmap[i];
        if (!k) return RL_BPE_NONE;
        const rl_bpe_entry *en = &t->ent[k - 1];
        if (en->len == n && !memcmp(t->arena + en->off, s, n)) return en->id;
    }
}

/* Inserts entry k; a later entry with the same bytes replaces an earlier
 * one (a JSON object's last duplicate key wins, as in serde's map). */
static void vmap_put(rl_bpe *t, uint32_t k) {
    const rl_bpe_entry *en = &t->ent[k];
    for (uint32_t i = (uint32_t)rl_bpe_hash_bytes(t->arena + en->off, en->len) & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t o = t->vmap[i];
        if (o && (t->ent[o - 1].len != en->len || memcmp(t->arena + t->ent[o - 1].off, t->arena + en->off, en->len)))
            continue;
        t->vmap[i] = k + 1;
        return;
    }
}

/* ---- field helpers ------------------------------------------------------------ */

typedef struct {
    const char *name; /* the file */
    rl_err *e;
} ctx;

#define BAD(c, ...) bad(c, __VA_ARGS__)
__attribute__((format(printf, 2, 3))) static int bad(ctx *c, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    rl_errf(c->e, RL_EINPUT, "%s: %s", c->name, m);
    /* the file's own strings are quoted: a control character in one (a JSON
     * "\n") must not break the message's one line */
    rl_err_one_line(c->e);
    return RL_EINPUT;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A boolean field: absent is `dflt`; anything but a boolean is refused. */
static int get_bool(ctx *c, const cJSON *o, const char *where, const char *k, bool dflt, bool *out) {
    const cJSON *v = get(o, k);
    *out = dflt;
    if (absent(v)) return RL_OK;
    if (!cJSON_IsBool(v)) return BAD(c, "%s.%s: must be true or false", where, k);
    *out = cJSON_IsTrue(v);
    return RL_OK;
}

/* A field that must be absent, null, false or "" (a feature not implemented). */
static int unsupported(ctx *c, const cJSON *o, const char *where, const char *k, const char *what) {
    const cJSON *v = get(o, k);
    if (absent(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !*v->valuestring) ||
        (cJSON_IsNumber(v) && v->valuedouble == 0))
        return RL_OK;
    return BAD(c, "%s.%s: %s is not supported (byte-level BPE only)", where, k, what);
}

static const char *type_of(const cJSON *o) {
    const cJSON *v = get(o, "type");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int get_id(ctx *c, const cJSON *v, const char *where, uint32_t *id) {
    *id = 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= RL_BPE_MAX_VOCAB ||
        v->valuedouble != (double)(uint32_t)v->valuedouble)
        return BAD(c, "%s: must be a token id, an integer in [0, %u)", where, RL_BPE_MAX_VOCAB);
    *id = (uint32_t)v->valuedouble;
    return RL_OK;
}

/* ---- model ------------------------------------------------------------------------- */

static int parse_vocab(ctx *c, rl_bpe *t, const cJSON *vocab) {
    if (!cJSON_IsObject(vocab)) return BAD(c, "model.vocab: must be an object of token -> id");
    uint32_t n = 0;
    for (const cJSON *v = vocab->child; v; v = v->next) n++;
    if (n == 0) return BAD(c, "model.vocab: is empty");
    if (n > RL_BPE_MAX_VOCAB) return BAD(c, "model.vocab: more than %u tokens", RL_BPE_MAX_VOCAB);
    uint32_t slots = 1;
    while (slots < 2 * n) slots *= 2;
    t->ent = calloc(n, sizeof *t->ent);
    t->vmap = calloc(slots, sizeof *t->vmap);
    if (!t->ent || !t->vmap) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    t->vmask = slots - 1;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        char where[120];
        snprintf(where, sizeof where, "model.vocab[\"%.60s\"]", v->string);
        rl_bpe_entry *en = &t->ent[t->nent];
        bool in_alpha;
        int rc = get_id(c, v, where, &en->id);
        if (!rc && !*v->string) rc = BAD(c, "%s: a token must not be empty", where);
        if (!rc && arena_add(t, v->string, &en->off, &en->len, &in_alpha))
            rc = rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
        if (rc) return rc;
        if (en->id >= t->n_vocab) t->n_vocab = en->id + 1;
        /* spelled outside the alphabet: no text can reach it; it still decodes */
        if (in_alpha) vmap_put(t, t->nent);
        t->nent++;
    }
    for (int b = 0; b < 256; b++) {
        char s = (char)b;
        t->byte_id[b] = rl_bpe_lookup(t, &s, 1);
    }
    return RL_OK;
}

/* "a b" (tokenizers' older format) or ["a", "b"] */
static int merge_parts(ctx *c, const cJSON *m, int i, char **a, char **b) {
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = strdup(m->child->valuestring), *b = strdup(m->child->next->valuestring);
    } else if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return BAD(c, "model.merges[%d]: \"%.60s\" is not two tokens separated by one space", i, m->valuestring);
        *a = strndup(m->valuestring, (size_t)(sp - m->valuestring)), *b = strdup(sp + 1);
    } else {
        return BAD(c, "model.merges[%d]: must be a string \"a b\" or a pair [\"a\", \"b\"]", i);
    }
    if (!*a || !*b) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    return RL_OK;
}

static void merge_put(rl_bpe *t, uint64_t key, uint32_t rank, uint32_t id) {
    uint32_t i = (uint32_t)rl_bpe_hash(key) & t->mmask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key) i = (i + 1) & t->mmask;
    t->mkey[i] = key, t->mrank[i] = rank, t->mnew[i] = id; /* a repeated pair: the later rank, as tokenizers */
}

static int parse_merges(ctx *c, rl_bpe *t, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) return BAD(c, "model.merges: must be an array");
    int n = cJSON_GetArraySize(merges);
    uint32_t slots = 2;
    while (slots < 2 * (uint32_t)n + 2) slots *= 2;
    t->mkey = malloc(slots * sizeof *t->mkey);
    t->mrank = malloc(slots * sizeof *t->mrank);
    t->mnew = malloc(slots * sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    memset(t->mkey, 0xff, slots * sizeof *t->mkey);
    t->mmask = slots - 1;
    /* a scratch token: the pair's bytes concatenated */
    rl_bpe scratch_owner = {0};
    int i = 0, rc = RL_OK;
    for (const cJSON *m = merges->child; m && !rc; m = m->next, i++) {
        char *a = NULL, *b = NULL;
        rc = merge_parts(c, m, i, &a, &b);
        uint32_t ia = RL_BPE_NONE, ib = RL_BPE_NONE, oa, la, ob, lb;
        bool alpha_a = false, alpha_b = false;
        if (!rc && (arena_add(&scratch_owner, a, &oa, &la, &alpha_a) ||
                    arena_add(&scratch_owner, b, &ob, &lb, &alpha_b)))
            rc = rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
        if (!rc) {
            if (alpha_a) ia = rl_bpe_lookup(t, scratch_owner.arena + oa, la);
            if (alpha_b) ib = rl_bpe_lookup(t, scratch_owner.arena + ob, lb);
            if (ia == RL_BPE_NONE || ib == RL_BPE_NONE)
                rc = BAD(c, "model.merges[%d]: \"%.40s\" is not in model.vocab", i, ia == RL_BPE_NONE ? a : b);
        }
        if (!rc) {
            /* the merged token: both halves' bytes side by side (b follows a in the scratch arena) */
            memmove(scratch_owner.arena + oa + la, scratch_owner.arena + ob, lb);
            uint32_t id = rl_bpe_lookup(t, scratch_owner.arena + oa, la + lb);
            if (id == RL_BPE_NONE)
                rc = BAD(c, "model.merges[%d]: \"%.30s\" + \"%.30s\" is not in model.vocab", i, a, b);
            else
                merge_put(t, rl_bpe_pair(ia, ib), (uint32_t)i, id);
        }
        scratch_owner.arena_len = 0;
        free(a);
        free(b);
    }
    free(scratch_owner.arena);
    return rc;
}

static int parse_model(ctx *c, rl_bpe *t, const cJSON *m) {
    if (!cJSON_IsObject(m)) return BAD(c, "model: must be an object");
    const char *ty = type_of(m);
    if (!ty || strcmp(ty, "BPE"))
        return BAD(c, "model.type: \"%.40s\" is not supported (byte-level BPE only)", ty ? ty : "(none)");
    int rc;
    if ((rc = unsupported(c, m, "model", "dropout", "BPE dropout")) ||
        (rc = unsupported(c, m, "model", "continuing_subword_prefix", "a subword prefix")) ||
        (rc = unsupported(c, m, "model", "end_of_word_suffix", "an end-of-word suffix")) ||
        (rc = unsupported(c, m, "model", "byte_fallback", "byte fallback")) ||
        (rc = get_bool(c, m, "model", "fuse_unk", false, &t->fuse_unk)) ||
        (rc = get_bool(c, m, "model", "ignore_merges", false, &t->ignore_merges)) ||
        (rc = parse_vocab(c, t, get(m, "vocab"))) || (rc = parse_merges(c, t, get(m, "merges"))))
        return rc;
    const cJSON *unk = get(m, "unk_token");
    t->unk = RL_BPE_NONE;
    if (!absent(unk)) {
        if (!cJSON_IsString(unk)) return BAD(c, "model.unk_token: must be a string or null");
        t->unk = rl_bpe_token_id(t, unk->valuestring) < 0 ? RL_BPE_NONE : (uint32_t)rl_bpe_token_id(t, unk->valuestring);
        if (t->unk == RL_BPE_NONE) return BAD(c, "model.unk_token: \"%.40s\" is not in model.vocab", unk->valuestring);
    }
    return RL_OK;
}

/* ---- added tokens ------------------------------------------------------------ */

static int cmp_added(const void *x, const void *y) {
    const rl_bpe_added *a = x, *b = y;
    unsigned char fa = (unsigned char)a->s[0], fb = (unsigned char)b->s[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    return a->n > b->n ? -1 : a->n < b->n ? 1 : 0; /* longest first */
}

static int parse_added(ctx *c, rl_bpe *t, const cJSON *arr) {
    if (absent(arr)) arr = NULL;
    else if (!cJSON_IsArray(arr)) return BAD(c, "added_tokens: must be an array");
    int n = arr ? cJSON_GetArraySize(arr) : 0;
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    int i = 0, rc = RL_OK;
    for (const cJSON *a = arr ? arr->child : NULL; a && !rc; a = a->next, i++) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%d]", i);
        rl_bpe_added *ad = &t->added[t->nadded];
        const cJSON *content = get(a, "content");
        bool flag;
        if (!cJSON_IsObject(a)) return BAD(c, "%s: must be an object", where);
        if (!cJSON_IsString(content) || !*content->valuestring)
            return BAD(c, "%s.content: must be a non-empty string", where);
        snprintf(where + strlen(where), sizeof where - strlen(where), ".id");
        if ((rc = get_id(c, get(a, "id"), where, &ad->id))) return rc;
        where[strlen(where) - 3] = 0;
        for (const char *k = "single_word\0lstrip\0rstrip\0"; *k; k += strlen(k) + 1) {
            if ((rc = get_bool(c, a, where, k, false, &flag))) return rc;
            if (flag) return BAD(c, "%s.%s: true is not supported", where, k);
        }
        if ((rc = get_bool(c, a, where, "special", false, &ad->special)) ||
            (rc = get_bool(c, a, where, "normalized", !ad->special, &ad->normalized)))
            return rc;
        if (!(ad->s = strdup(content->valuestring))) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
        ad->n = strlen(ad->s);
        if (ad->id >= t->n_vocab) t->n_vocab = ad->id + 1;
        t->nadded++;
    }
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, cmp_added);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->nadded && (unsigned char)t->added[k].s[0] < b) k++;
        t->afirst[b] = k;
    }
    return RL_OK;
}

/* ---- pre-tokenizer ---------------------------------------------------------------- */

static int compile(ctx *c, const char *where, const char *pat, bool literal, pcre2_code **out) {
    int err;
    PCRE2_SIZE at;
    /* PCRE2_LITERAL refuses PCRE2_UCP (a literal has no classes to widen) */
    uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &err, &at, NULL);
    if (!*out) {
        char msg[160];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        return BAD(c, "%s: PCRE2 refuses the pattern at offset %zu: %s", where, (size_t)at, msg);
    }
    /* JIT where the platform has it; the interpreter gives the same matches */
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return RL_OK;
}

static int parse_byte_level(ctx *c, rl_bpe *t, const cJSON *p, const char *where) {
    bool use_regex;
    int rc;
    if ((rc = get_bool(c, p, where, "add_prefix_space", true, &t->prefix_space)) ||
        (rc = get_bool(c, p, where, "use_regex", true, &use_regex)))
        return rc;
    char w[120];
    snprintf(w, sizeof w, "%s (GPT-2's pattern)", where);
    return use_regex ? compile(c, w, gpt2_pattern, false, &t->bl_re) : RL_OK;
}

static int parse_split(ctx *c, rl_bpe *t, const cJSON *p, const char *where) {
    const cJSON *pat = get(p, "pattern"), *beh = get(p, "behavior");
    bool invert;
    int rc = get_bool(c, p, where, "invert", false, &invert);
    if (rc) return rc;
    if (invert) return BAD(c, "%s.invert: true is not supported", where);
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
        return BAD(c, "%s.behavior: \"%.30s\" is not supported (Isolated only)", where,
                   cJSON_IsString(beh) ? beh->valuestring : "(none)");
    const cJSON *re = get(pat, "Regex"), *lit = get(pat, "String");
    if (!cJSON_IsObject(pat) || cJSON_IsString(re) == cJSON_IsString(lit))
        return BAD(c, "%s.pattern: must be {\"Regex\": ...} or {\"String\": ...}", where);
    char w[120];
    /* the one that is a string (the other absent or null) */
    bool regex = cJSON_IsString(re);
    snprintf(w, sizeof w, "%s.pattern.%s", where, regex ? "Regex" : "String");
    return compile(c, w, (regex ? re : lit)->valuestring, !regex, &t->splits[t->nsplits++]);
}

static int parse_pre(ctx *c, rl_bpe *t, const cJSON *p) {
    if (absent(p)) return BAD(c, "pre_tokenizer: none is not supported (byte-level BPE needs ByteLevel)");
    const char *ty = type_of(p);
    if (ty && !strcmp(ty, "ByteLevel")) return parse_byte_level(c, t, p, "pre_tokenizer");
    if (!ty || strcmp(ty, "Sequence"))
        return BAD(c, "pre_tokenizer.type: \"%.40s\" is not supported (ByteLevel, or a Sequence of Split "
                      "and ByteLevel)", ty ? ty : "(none)");
    const cJSON *seq = get(p, "pretokenizers");
    int n = cJSON_IsArray(seq) ? cJSON_GetArraySize(seq) : 0;
    if (n == 0) return BAD(c, "pre_tokenizer.pretokenizers: must be a non-empty array");
    if (!(t->splits = calloc((size_t)n, sizeof *t->splits)))
        return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    int i = 0, rc = RL_OK;
    for (const cJSON *s = seq->child; s && !rc; s = s->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", i);
        const char *st = type_of(s);
        if (st && !strcmp(st, "Split") && i < n - 1) rc = parse_split(c, t, s, where);
        else if (st && !strcmp(st, "ByteLevel") && i == n - 1) rc = parse_byte_level(c, t, s, where);
        else
            rc = BAD(c, "%s.type: \"%.40s\" is not supported here (Split patterns, then one ByteLevel last)",
                     where, st ? st : "(none)");
    }
    return rc;
}

/* ---- post-processor and decoder ------------------------------------------------------ */

static int add_ids(ctx *c, rl_bpe *t, const cJSON *st, const char *name, bool before) {
    const cJSON *tok = get(st, name), *ids = get(tok, "ids");
    if (!cJSON_IsArray(ids)) return BAD(c, "post_processor.special_tokens[\"%.40s\"].ids: must be an array", name);
    for (const cJSON *v = ids->child; v; v = v->next) {
        uint32_t id, **arr = before ? &t->prefix : &t->suffix;
        int *n = before ? &t->nprefix : &t->nsuffix, rc = get_id(c, v, "post_processor.special_tokens ids", &id);
        if (rc) return rc;
        if (*n == RL_BPE_FRAME_MAX)
            return BAD(c, "post_processor.special_tokens: more than %d ids on one side of a sequence", RL_BPE_FRAME_MAX);
        uint32_t *a = realloc(*arr, ((size_t)*n + 1) * sizeof *a);
        if (!a) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
        a[(*n)++] = id, *arr = a;
        if (id >= t->n_vocab) t->n_vocab = id + 1;
    }
    return RL_OK;
}

static int parse_template(ctx *c, rl_bpe *t, const cJSON *p, const char *where) {
    const cJSON *single = get(p, "single"), *st = get(p, "special_tokens");
    if (!cJSON_IsArray(single)) return BAD(c, "%s.single: must be an array", where);
    bool seen_seq = false;
    int rc = RL_OK;
    for (const cJSON *it = single->child; it && !rc; it = it->next) {
        const cJSON *sp = get(it, "SpecialToken"), *sq = get(it, "Sequence");
        if (cJSON_IsObject(sq) && !seen_seq) {
            seen_seq = true;
        } else if (cJSON_IsObject(sp) && cJSON_IsString(get(sp, "id"))) {
            rc = add_ids(c, t, st, get(sp, "id")->valuestring, !seen_seq);
        } else {
            return BAD(c, "%s.single: each piece must be a SpecialToken or the one Sequence", where);
        }
    }
    if (!rc && !seen_seq) return BAD(c, "%s.single: holds no Sequence", where);
    return rc;
}

static int parse_post(ctx *c, rl_bpe *t, const cJSON *p, const char *where, bool nested) {
    if (absent(p)) return RL_OK;
    const char *ty = type_of(p);
    if (ty && !strcmp(ty, "ByteLevel")) return RL_OK; /* offsets only */
    if (ty && !strcmp(ty, "TemplateProcessing")) return parse_template(c, t, p, where);
    if (ty && !strcmp(ty, "Sequence") && !nested) {
        const cJSON *seq = get(p, "processors");
        if (!cJSON_IsArray(seq)) return BAD(c, "%s.processors: must be an array", where);
        int i = 0, rc = RL_OK;
        for (const cJSON *s = seq->child; s && !rc; s = s->next, i++) {
            char w[64];
            snprintf(w, sizeof w, "%s.processors[%d]", where, i);
            rc = parse_post(c, t, s, w, true);
        }
        return rc;
    }
    return BAD(c, "%s.type: \"%.40s\" is not supported (ByteLevel, TemplateProcessing or a Sequence of them)",
               where, ty ? ty : "(none)");
}

/* ---- normalizer ---------------------------------------------------------------------------- */

/* NFC (Qwen2's), alone or the one item of a Sequence; nothing else. */
static int parse_normalizer(ctx *c, rl_bpe *t, const cJSON *n) {
    if (absent(n)) return RL_OK;
    const char *type = type_of(n);
    const cJSON *items = get(n, "normalizers");
    if (type && !strcmp(type, "Sequence") && cJSON_IsArray(items) && cJSON_GetArraySize(items) == 1) {
        n = items->child;
        type = type_of(n);
    }
    if (!type || strcmp(type, "NFC"))
        return BAD(c, "normalizer.type: \"%.40s\" is not supported (none or NFC)", type ? type : "(none)");
    t->nfc = true;
    return RL_OK;
}

/* ---- the file ----------------------------------------------------------------------------- */

static int parse_doc(ctx *c, rl_bpe *t, const cJSON *doc) {
    if (!cJSON_IsObject(doc)) return BAD(c, "not a JSON object (a Hugging Face tokenizer.json)");
    const cJSON *norm = get(doc, "normalizer"), *dec = get(doc, "decoder");
    int rc = parse_model(c, t, get(doc, "model")); /* first: what the file is */
    if (rc) return rc;
    if ((rc = parse_normalizer(c, t, norm))) return rc;
    if (!type_of(dec) || strcmp(type_of(dec), "ByteLevel"))
        return BAD(c, "decoder.type: \"%.40s\" is not supported (ByteLevel only)", type_of(dec) ? type_of(dec) : "(none)");
    if ((rc = parse_added(c, t, get(doc, "added_tokens"))) ||
        (rc = parse_pre(c, t, get(doc, "pre_tokenizer"))) ||
        (rc = parse_post(c, t, get(doc, "post_processor"), "post_processor", false)))
        return rc;
    /* the decoding table: the vocabulary, then added tokens (which win, as
     * tokenizers looks them up first), spelled through the alphabet too */
    t->dec_off = malloc(t->n_vocab * sizeof *t->dec_off);
    t->dec_len = malloc(t->n_vocab * sizeof *t->dec_len);
    if (!t->dec_off || !t->dec_len) return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    memset(t->dec_len, 0xff, t->n_vocab * sizeof *t->dec_len);
    for (uint32_t i = 0; i < t->nent; i++)
        t->dec_off[t->ent[i].id] = t->ent[i].off, t->dec_len[t->ent[i].id] = t->ent[i].len;
    for (int i = 0; i < t->nadded; i++) {
        bool in_alpha;
        if (arena_add(t, t->added[i].s, &t->dec_off[t->added[i].id], &t->dec_len[t->added[i].id], &in_alpha))
            return rl_errf(c->e, RL_ENOMEM, "%s: out of memory", c->name);
    }
    return RL_OK;
}

int rl_bpe_parse(const char *json, size_t len, const char *name, rl_bpe **out, rl_err *e) {
    *out = NULL;
    alpha_init();
    ctx c = {name, e};
    cJSON *doc = cJSON_ParseWithLength(json, len);
    if (!doc) return BAD(&c, "not valid JSON");
    rl_bpe *t = calloc(1, sizeof *t);
    int rc = t ? parse_doc(&c, t, doc) : rl_errf(e, RL_ENOMEM, "%s: out of memory", name);
    cJSON_Delete(doc);
    if (!rc) {
        unsigned char md[32];
        unsigned int mdl = 0;
        if (!EVP_Digest(json, len, md, &mdl, EVP_sha256(), NULL)) rc = rl_errf(e, RL_EINTERNAL, "%s: sha256 failed", name);
        for (int i = 0; i < 32; i++) snprintf(t->sha256 + 2 * i, 3, "%02x", md[i]);
    }
    if (rc) {
        rl_bpe_free(t);
        return rc;
    }
    *out = t;
    return RL_OK;
}

int rl_bpe_load(const char *path, rl_bpe **out, rl_err *e) {
    char *buf;
    size_t len;
    *out = NULL;
    int rc = rl_read_file(path, &buf, &len, e);
    if (rc) return rc;
    rc = rl_bpe_parse(buf, len, path, out, e);
    free(buf);
    return rc;
}

void rl_bpe_free(rl_bpe *t) {
    if (!t) return;
    for (int i = 0; i < t->nadded; i++) free(t->added[i].s);
    for (int i = 0; i < t->nsplits; i++) pcre2_code_free(t->splits[i]);
    pcre2_code_free(t->bl_re);
    free(t->added), free(t->splits), free(t->prefix), free(t->suffix), free(t->arena), free(t->dec_off);
    free(t->dec_len), free(t->ent), free(t->vmap), free(t->mkey), free(t->mrank), free(t->mnew);
    free(t);
}

uint32_t rl_bpe_vocab_size(const rl_bpe *t) { return t->n_vocab; }
const char *rl_bpe_sha256(const rl_bpe *t) { return t->sha256; }

void rl_bpe_template(const rl_bpe *t, const uint32_t **prefix, int *nprefix, const uint32_t **suffix, int *nsuffix) {
    *prefix = t->prefix, *nprefix = t->nprefix, *suffix = t->suffix, *nsuffix = t->nsuffix;
}

int64_t rl_bpe_token_id(const rl_bpe *t, const char *text) {
    for (int i = 0; i < t->nadded; i++)
        if (!strcmp(t->added[i].s, text)) return t->added[i].id;
    rl_bpe tmp = {0};
    uint32_t off, len, id = RL_BPE_NONE;
    bool in_alpha;
    if (!arena_add(&tmp, text, &off, &len, &in_alpha) && in_alpha) id = rl_bpe_lookup(t, tmp.arena + off, len);
    free(tmp.arena);
    return id == RL_BPE_NONE ? -1 : (int64_t)id;
}

void rl_bpe_frame(const rl_bpe *t, int64_t eos, rl_doc_frame *f) {
    int64_t bos;
    memset(f, 0, sizeof *f);
    rl_bpe_special_ids(t, &bos, &f->eos);
    if (t->nprefix + t->nsuffix > 0) {
        memcpy(f->before, t->prefix, (size_t)t->nprefix * sizeof *t->prefix);
        memcpy(f->after, t->suffix, (size_t)t->nsuffix * sizeof *t->suffix);
        f->nbefore = t->nprefix, f->nafter = t->nsuffix;
        return;
    }
    rl_eos_frame(eos >= 0 ? eos : f->eos, f);
}

void rl_eos_frame(int64_t eos, rl_doc_frame *f) {
    memset(f, 0, sizeof *f);
    f->eos = eos;
    if (eos >= 0) f->before[0] = (uint32_t)eos, f->nbefore = 1;
}

void rl_bpe_special_ids(const rl_bpe *t, int64_t *bos, int64_t *eos) {
    *bos = t->nprefix == 1 ? (int64_t)t->prefix[0] : -1;
    *eos = t->nsuffix == 1 ? (int64_t)t->suffix[0] : -1;
    if (t->nprefix + t->nsuffix > 0) return;
    for (int i = 0; i < t->nadded; i++) {
        if (!t->added[i].special) continue;
        if (*eos >= 0) {
            *eos = -1;
            return;
        }
        *eos = t->added[i].id;
    }
}

const char *rl_bpe_added_content(const rl_bpe *t, uint32_t id) {
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id == id) return t->added[i].s;
    return NULL;
}
