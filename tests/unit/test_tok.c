/* pkg/tok: tokenizer.json byte-level BPE. Every test builds its own small
 * tokenizer.json (the 256 byte tokens with id = the byte's value, then the
 * merges' products from id 256 in merge order, then extra words), so the
 * expected ids are known by construction rather than read back from the
 * code under test. */
#include <criterion/criterion.h>

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "tokjson.h"
#include "tok/tok.h"

/* ---- building tokenizer.json ------------------------------------------------ */

typedef struct {
    const char *const *merges; /* raw-byte pairs, flat, NULL-terminated: "a", "b", "ab", "c", NULL */
    bool pair_merges;          /* written ["a", "b"] rather than "a b" */
    const char *const *words;  /* more vocab tokens (raw bytes) that no merge makes, NULL-terminated */
    const char *omit_bytes;    /* bytes left out of the vocabulary */
    const char *vocab_more;    /* raw JSON members appended to model.vocab */
    const char *merges_more;   /* raw JSON elements appended to model.merges */
    const char *model_type;    /* NULL: "BPE" */
    const char *model_more;    /* raw JSON members, each followed by a comma, put early in model */
    const char *normalizer;    /* NULL: null */
    const char *pre;           /* NULL: ByteLevel, GPT-2's pattern, no prefix space */
    const char *post;          /* NULL: null */
    const char *decoder;       /* NULL: ByteLevel; "": no decoder key at all */
    const char *added;         /* NULL: [] */
} spec;

/* The tokens above the bytes, raw: id 256 + index. */
typedef struct {
    char *tok[4096];
    int n;
} vocab_t;

static void vocab_free(vocab_t *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    v->n = 0;
}

static int64_t vid(const vocab_t *v, const char *raw) {
    if (strlen(raw) == 1) return (unsigned char)raw[0];
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->tok[i], raw)) return 256 + i;
    return -1;
}

static void vocab_put(vocab_t *v, const char *raw) {
    if (vid(v, raw) >= 0) return; /* two merges may make the same token */
    cr_assert_lt(v->n, 4096);
    v->tok[v->n++] = strdup(raw);
}

static const char *gpt2_pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
                              "\"use_regex\":true}";

/* Llama 3's pre-tokenizer: its Split pattern, then ByteLevel without one */
#define LLAMA3_PRE                                                                                            \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"                   \
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}" \
    "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","          \
    "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"             \
    "\"use_regex\":false}]}"

/* A malloc'ed tokenizer.json for s; the merged and extra tokens in *v. */
static char *make_doc(const spec *s, vocab_t *v) {
    vocab_t local = {.n = 0};
    if (!v) v = &local;
    v->n = 0;
    for (int i = 0; s->merges && s->merges[i]; i += 2) {
        char cat[256];
        snprintf(cat, sizeof cat, "%s%s", s->merges[i], s->merges[i + 1]);
        vocab_put(v, cat);
    }
    for (int i = 0; s->words && s->words[i]; i++) vocab_put(v, s->words[i]);

    rl_sb b = {0};
    rl_sb_add(&b, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":%s,",
           s->added ? s->added : "[]");
    rl_sb_add(&b, "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":%s,", s->normalizer ? s->normalizer : "null",
           s->pre ? s->pre : gpt2_pre, s->post ? s->post : "null");
    if (!s->decoder) rl_sb_add(&b, "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
                                "\"use_regex\":true},");
    else if (*s->decoder) rl_sb_add(&b, "\"decoder\":%s,", s->decoder);
    /* model_more first: cJSON answers a repeated key with its first value */
    rl_sb_add(&b, "\"model\":{\"type\":\"%s\",%s\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
               "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"vocab\":{",
           s->model_type ? s->model_type : "BPE", s->model_more ? s->model_more : "");
    bool first = true;
    for (int c = 0; c < 256; c++) {
        if (s->omit_bytes && c && strchr(s->omit_bytes, c)) continue;
        char raw = (char)c;
        rl_sb_add(&b, "%s\"", first ? "" : ",");
        rl_sb_bytelevel(&b, &raw, 1);
        rl_sb_add(&b, "\":%d", c);
        first = false;
    }
    for (int i = 0; i < v->n; i++) {
        rl_sb_add(&b, ",\"");
        rl_sb_bytelevel(&b, v->tok[i], strlen(v->tok[i]));
        rl_sb_add(&b, "\":%d", 256 + i);
    }
    if (s->vocab_more) rl_sb_add(&b, ",%s", s->vocab_more);
    rl_sb_add(&b, "},\"merges\":[");
    first = true;
    for (int i = 0; s->merges && s->merges[i]; i += 2) {
        const char *l = s->merges[i], *r = s->merges[i + 1];
        rl_sb_add(&b, "%s%s\"", first ? "" : ",", s->pair_merges ? "[" : "");
        rl_sb_bytelevel(&b, l, strlen(l));
        rl_sb_add(&b, "%s", s->pair_merges ? "\",\"" : " ");
        rl_sb_bytelevel(&b, r, strlen(r));
        rl_sb_add(&b, "\"%s", s->pair_merges ? "]" : "");
        first = false;
    }
    if (s->merges_more) rl_sb_add(&b, "%s%s", first ? "" : ",", s->merges_more);
    rl_sb_add(&b, "]}}");
    vocab_free(&local);
    return b.s;
}

static rl_bpe *parse_ok(const spec *s, vocab_t *v) {
    char *js = make_doc(s, v);
    rl_bpe *t = NULL;
    rl_err e = {0};
    int rc = rl_bpe_parse(js, strlen(js), "tok.json", &t, &e);
    cr_assert_eq(rc, RL_OK, "parse: rc %d: %s", rc, e.msg);
    cr_assert_not_null(t);
    free(js);
    return t;
}

/* Parsing must fail with RL_EINPUT and one line that starts with the file
 * name and holds `field` (and `also`, when given). */
static void expect_bad(const spec *s, const char *field, const char *also) {
    char *js = make_doc(s, NULL);
    rl_bpe *t = (rl_bpe *)1;
    rl_err e = {0};
    int rc = rl_bpe_parse(js, strlen(js), "tok.json", &t, &e);
    cr_assert_eq(rc, RL_EINPUT, "rc %d (%s) for %s", rc, e.msg, js);
    cr_assert_null(t);
    cr_assert_eq(strncmp(e.msg, "tok.json: ", 10), 0, "message '%s' does not start with the file", e.msg);
    cr_assert_not_null(strstr(e.msg, field), "message '%s' does not name '%s'", e.msg, field);
    if (also) cr_assert_not_null(strstr(e.msg, also), "message '%s' does not say '%s'", e.msg, also);
    cr_assert_null(strchr(e.msg, '\n'), "message '%s' is not one line", e.msg);
    free(js);
}

/* ---- encoding helpers -------------------------------------------------------------- */

static rl_bpe_ids encode(rl_bpe *t, const char *text, size_t n, bool special) {
    rl_bpe_enc *enc = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_enc_new(t, &enc, &e), RL_OK, "%s", e.msg);
    rl_bpe_ids ids = {0};
    int rc = rl_bpe_encode(enc, text, n, special, &ids, &e);
    cr_assert_eq(rc, RL_OK, "encode: rc %d: %s", rc, e.msg);
    rl_bpe_enc_free(enc);
    return ids;
}

static void fmt_ids(char *out, size_t cap, const uint32_t *v, size_t n) {
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 12 < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%s%u", i ? " " : "", v[i]);
}

static void expect_ids(rl_bpe *t, const char *text, bool special, const uint32_t *want, size_t nwant) {
    rl_bpe_ids got = encode(t, text, strlen(text), special);
    char g[512], w[512];
    fmt_ids(g, sizeof g, got.v, got.n);
    fmt_ids(w, sizeof w, want, nwant);
    cr_assert(got.n == nwant && !memcmp(got.v, want, nwant * sizeof *want), "\"%s\" (special %d): got [%s], want [%s]",
              text, special, g, w);
    rl_bpe_ids_free(&got);
}
#define EXPECT_IDS(t, text, special, ...)                                                                             \
    expect_ids(t, text, special, (const uint32_t[]){__VA_ARGS__},                                                     \
               sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

/* decode(ids) as a malloc'ed buffer of *len bytes */
static char *decode(rl_bpe *t, const rl_bpe_ids *ids, size_t *len) {
    char *buf = NULL;
    size_t cap = 0;
    rl_err e = {0};
    *len = 0;
    int rc = rl_bpe_decode(t, ids->v, ids->n, &buf, len, &cap, &e);
    cr_assert_eq(rc, RL_OK, "decode: rc %d: %s", rc, e.msg);
    return buf;
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random text, NULs and invalid UTF-8 included, built from pieces the
 * merges below act on so that decoding has merged tokens to undo. */
static size_t random_text(uint64_t *rng, char *out, size_t max) {
    static const char *const piece[] = {"a",  "b",  "ab",  " ",          " a",           "\n",
                                        "\n\n", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "1",
                                        "234", "'s", "!?",  "\t",         "  ",            "<|endoftext|>", "Q"};
    static const size_t npiece = sizeof piece / sizeof *piece;
    size_t n = 0, want = rng_next(rng) % max;
    while (n < want) {
        uint64_t r = rng_next(rng) % (npiece + 6);
        if (r < npiece) {
            size_t k = strlen(piece[r]);
            if (n + k > max) break;
            memcpy(out + n, piece[r], k), n += k;
        } else if (r == npiece) {
            out[n++] = 0;
        } else if (r == npiece + 1) {
            out[n++] = (char)0xff; /* never valid in UTF-8 */
        } else if (r == npiece + 2) {
            out[n++] = (char)0x80; /* a lone continuation byte */
        } else if (r == npiece + 3) {
            out[n++] = (char)0xc3; /* a truncated sequence */
        } else {
            out[n++] = (char)rng_next(rng);
        }
    }
    return n;
}

static const char *const roundtrip_merges[] = {"a",    "b",    "ab", "a",  " ", "a", "\xc3",
                                               "\xa9", "\n", "\n", "2", "3", NULL};

/* For each of n random texts, decode(encode(x)) must be prefix + x; the
 * merges must have been used (fewer ids than bytes), or the check proves
 * little. */
static void check_roundtrip(rl_bpe *t, const char *prefix, int n, uint64_t seed) {
    uint64_t rng = seed;
    size_t bytes = 0, ids_total = 0;
    char *x = malloc(600), *want = malloc(601);
    rl_bpe_enc *enc = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_enc_new(t, &enc, &e), RL_OK, "%s", e.msg);
    for (int i = 0; i < n; i++) {
        size_t len = random_text(&rng, x, 600);
        if (*prefix && len && x[0] == ' ') x[0] = 'Q'; /* a text that starts with a space gets none added */
        size_t wl = strlen(prefix);
        memcpy(want, prefix, wl);
        memcpy(want + wl, x, len);
        if (!len) wl = 0; /* nothing to encode, nothing to prefix */
        rl_bpe_ids ids = {0};
        cr_assert_eq(rl_bpe_encode(enc, x, len, false, &ids, &e), RL_OK, "%s", e.msg);
        size_t dl;
        char *d = decode(t, &ids, &dl);
        cr_assert(dl == wl + len && (!dl || !memcmp(d, want, dl)), "text %d (%zu bytes): decoded %zu bytes, not %zu", i,
                  len, dl, wl + len);
        bytes += len, ids_total += ids.n;
        free(d);
        rl_bpe_ids_free(&ids);
    }
    cr_assert_lt(ids_total, bytes, "no merge was used: %zu ids for %zu bytes", ids_total, bytes);
    rl_bpe_enc_free(enc);
    free(x), free(want);
}

/* ---- merges ----------------------------------------------------------------------------- */

/* "abc": b+c has rank 0, a+b rank 1. By rank: a, bc. Left to right (or
 * a greedy scan) would take ab first and end with ab, c. */
Test(tok, merges_apply_lowest_rank_first_not_left_to_right) {
    static const char *const m[] = {"b", "c", "a", "b", NULL}; /* bc = 256, ab = 257 */
    rl_bpe *t = parse_ok(&(spec){.merges = m}, NULL);
    EXPECT_IDS(t, "abc", false, 'a', 256);
    EXPECT_IDS(t, "ab", false, 257);
    EXPECT_IDS(t, "abcab", false, 'a', 256, 257);
    rl_bpe_free(t);
}

/* "aaa" holds the pair a+a twice, overlapping, at one rank: the leftmost
 * merges and the right a is left over (tokenizers' heap order). */
Test(tok, merges_take_the_leftmost_pair_on_a_rank_tie) {
    static const char *const m[] = {"a", "a", NULL}; /* aa = 256 */
    rl_bpe *t = parse_ok(&(spec){.merges = m, .pair_merges = true}, NULL);
    EXPECT_IDS(t, "aaa", false, 256, 'a');
    EXPECT_IDS(t, "aaaaa", false, 256, 256, 'a');
    rl_bpe_free(t);
}

/* A merge's product forms new pairs, ranked with the rest: in "abcd", b+c
 * (rank 0) takes the c that c+d (rank 2) wanted, then the new pair a+bc
 * (rank 1) merges, and d is left alone. */
Test(tok, a_merged_token_joins_new_pairs_ranked_against_the_rest) {
    static const char *const m[] = {"b", "c", "a", "bc", "c", "d", NULL}; /* bc 256, abc 257, cd 258 */
    rl_bpe *t = parse_ok(&(spec){.merges = m}, NULL);
    EXPECT_IDS(t, "abcd", false, 257, 'd');
    EXPECT_IDS(t, "bcd", false, 256, 'd');
    EXPECT_IDS(t, "acd", false, 'a', 258);
    rl_bpe_free(t);
}

/* The reference: merge the adjacent pair of lowest rank, leftmost on a tie,
 * until none is left, by scanning every pair each step. */
static size_t naive_bpe(const char *const *merges, const vocab_t *v, const char *w, uint32_t *out) {
    size_t n = strlen(w), ns = n, start[128], len[128];
    cr_assert_lt(n, 128);
    for (size_t i = 0; i < n; i++) start[i] = i, len[i] = 1;
    for (;;) {
        size_t best = SIZE_MAX, at = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            for (size_t r = 0; merges[2 * r] && r < best; r++) {
                const char *l = merges[2 * r], *rt = merges[2 * r + 1];
                if (strlen(l) == len[i] && strlen(rt) == len[i + 1] && !memcmp(l, w + start[i], len[i]) &&
                    !memcmp(rt, w + start[i + 1], len[i + 1])) {
                    best = r, at = i;
                    break;
                }
            }
        }
        if (best == SIZE_MAX) break;
        len[at] += len[at + 1];
        memmove(start + at + 1, start + at + 2, (ns - at - 2) * sizeof *start);
        memmove(len + at + 1, len + at + 2, (ns - at - 2) * sizeof *len);
        ns--;
    }
    for (size_t i = 0; i < ns; i++) {
        char tok[128];
        memcpy(tok, w + start[i], len[i]);
        tok[len[i]] = 0;
        int64_t id = vid(v, tok);
        cr_assert_geq(id, 0, "no id for '%s'", tok);
        out[i] = (uint32_t)id;
    }
    return ns;
}

/* Random merges over {a, b, c} (some making the same token twice) and
 * random words, short (cached) and long: the heap-based encoder must give
 * exactly the reference's ids, every time. */
Test(tok, merges_match_a_naive_lowest_rank_leftmost_reference_on_random_words) {
    uint64_t rng = 12345;
    char pool[64][16] = {"a", "b", "c"};
    int npool = 3, nm = 0;
    const char *merges[2 * 60 + 1];
    while (nm < 60) {
        const char *l = pool[rng_next(&rng) % (uint64_t)npool], *r = pool[rng_next(&rng) % (uint64_t)npool];
        if (strlen(l) + strlen(r) > 8) continue;
        bool dup = false;
        for (int i = 0; i < nm && !dup; i++) dup = !strcmp(merges[2 * i], l) && !strcmp(merges[2 * i + 1], r);
        if (dup) continue;
        merges[2 * nm] = l, merges[2 * nm + 1] = r, nm++;
        char cat[40];
        snprintf(cat, sizeof cat, "%s%s", l, r);
        bool have = false;
        for (int i = 0; i < npool && !have; i++) have = !strcmp(pool[i], cat);
        if (!have && npool < 64) memcpy(pool[npool++], cat, strlen(cat) + 1); /* at most 8 bytes */
    }
    merges[2 * nm] = NULL;
    vocab_t v = {.n = 0};
    rl_bpe *t = parse_ok(&(spec){.merges = merges}, &v);
    rl_bpe_enc *enc = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_enc_new(t, &enc, &e), RL_OK);
    int merged = 0;
    for (int k = 0; k < 600; k++) {
        char w[128];
        size_t n = 1 + rng_next(&rng) % (k % 3 ? 20 : 100);
        for (size_t i = 0; i < n; i++) w[i] = (char)('a' + rng_next(&rng) % 3);
        w[n] = 0;
        uint32_t want[128];
        size_t nw = naive_bpe(merges, &v, w, want);
        rl_bpe_ids got = {0};
        cr_assert_eq(rl_bpe_encode(enc, w, n, false, &got, &e), RL_OK, "%s", e.msg);
        char g[512], ws[512];
        fmt_ids(g, sizeof g, got.v, got.n);
        fmt_ids(ws, sizeof ws, want, nw);
        cr_assert(got.n == nw && !memcmp(got.v, want, nw * sizeof *want), "word %s: got [%s], want [%s]", w, g, ws);
        merged += nw < n;
        rl_bpe_ids_free(&got);
    }
    cr_assert_gt(merged, 300, "the merges rarely applied (%d words): the comparison proves little", merged);
    rl_bpe_enc_free(enc);
    rl_bpe_free(t);
    vocab_free(&v);
}

/* "hello" is in the vocabulary but no merge chain reaches it (only h+e):
 * with ignore_merges it is one token, without it the merges decide. */
Test(tok, ignore_merges_takes_a_word_whole_from_the_vocab) {
    static const char *const m[] = {"h", "e", NULL}; /* he 256 */
    static const char *const words[] = {"hello", NULL}; /* 257 */
    rl_bpe *t = parse_ok(&(spec){.merges = m, .words = words, .model_more = "\"ignore_merges\":true,"}, NULL);
    EXPECT_IDS(t, "hello", false, 257);
    EXPECT_IDS(t, "help", false, 256, 'l', 'p'); /* not in the vocab: merged as usual */
    rl_bpe_free(t);
    t = parse_ok(&(spec){.merges = m, .words = words, .model_more = "\"ignore_merges\":false,"}, NULL);
    EXPECT_IDS(t, "hello", false, 256, 'l', 'l', 'o');
    rl_bpe_free(t);
}

/* A byte the vocabulary lacks is the unk token, one per byte, or one per
 * run with fuse_unk; without unk_token it is dropped. */
Test(tok, bytes_missing_from_the_vocab_become_unk_fused_in_runs_with_fuse_unk) {
    static const char *const words[] = {"<unk>", NULL}; /* 256 */
    rl_bpe *t = parse_ok(&(spec){.words = words, .omit_bytes = "xy", .model_more = "\"unk_token\":\"<unk>\","}, NULL);
    EXPECT_IDS(t, "axyb", false, 'a', 256, 256, 'b');
    rl_bpe_free(t);
    t = parse_ok(
        &(spec){.words = words, .omit_bytes = "xy", .model_more = "\"unk_token\":\"<unk>\",\"fuse_unk\":true,"}, NULL);
    EXPECT_IDS(t, "axyb", false, 'a', 256, 'b');
    rl_bpe_free(t);
    t = parse_ok(&(spec){.omit_bytes = "xy"}, NULL);
    /* first, on a fresh encoder, a word of nothing but missing bytes: no
     * ids at all (the output vector never allocated) */
    rl_bpe_ids none = encode(t, "xy", 2, false);
    cr_assert_eq(none.n, 0);
    rl_bpe_ids_free(&none);
    EXPECT_IDS(t, "axyb", false, 'a', 'b');
    rl_bpe_free(t);
}

/* ---- added tokens ------------------------------------------------------------------------- */

#define ADDED(id, content, special)                                                                                 \
    "{\"id\":" #id ",\"content\":\"" content "\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"         \
    "\"normalized\":false,\"special\":" #special "}"

/* <|s|> is special: only encode(special = true) sees it; otherwise it is
 * text, split by GPT-2's pattern into <|, s and |>. */
Test(tok, a_special_added_token_is_matched_only_when_special_is_true) {
    rl_bpe *t = parse_ok(&(spec){.added = "[" ADDED(1000, "<|s|>", true) "]"}, NULL);
    EXPECT_IDS(t, "x<|s|>y", true, 'x', 1000, 'y');
    EXPECT_IDS(t, "x<|s|>y", false, 'x', '<', '|', 's', '|', '>', 'y');
    cr_assert_eq(rl_bpe_token_id(t, "<|s|>"), 1000);
    rl_bpe_free(t);
}

Test(tok, a_non_special_added_token_is_matched_whatever_special_says) {
    rl_bpe *t = parse_ok(&(spec){.added = "[" ADDED(1000, "<n>", false) "]"}, NULL);
    EXPECT_IDS(t, "x<n>y", true, 'x', 1000, 'y');
    EXPECT_IDS(t, "x<n>y", false, 'x', 1000, 'y');
    rl_bpe_free(t);
}

/* <a> and <a><b> start at the same place: the longer wins. a><b> is longer
 * than <a> but starts later: the leftmost wins, <b> is then plain text. */
Test(tok, added_tokens_match_leftmost_then_longest_in_order_among_text_ids) {
    rl_bpe *t = parse_ok(&(spec){.added = "[" ADDED(1001, "<a>", false) "," ADDED(1002, "<a><b>", false) "]"}, NULL);
    EXPECT_IDS(t, "<a><b>", false, 1002);
    EXPECT_IDS(t, "hi<a>yo<a><b>!<a", false, 'h', 'i', 1001, 'y', 'o', 1002, '!', '<', 'a');
    rl_bpe_free(t);
    t = parse_ok(&(spec){.added = "[" ADDED(1003, "a><b>", false) "," ADDED(1001, "<a>", false) "]"}, NULL);
    EXPECT_IDS(t, "<a><b>", false, 1001, '<', 'b', '>');
    rl_bpe_free(t);
}

/* No template: EOS is the one special added token (GPT-2's
 * <|endoftext|>); a non-special one does not count, and with two special
 * ones there is none to name. */
Test(tok, without_a_template_eos_is_the_only_special_added_token) {
    int64_t bos = 0, eos = 0;
    rl_bpe *t =
        parse_ok(&(spec){.added = "[" ADDED(1000, "<n>", false) "," ADDED(1001, "<|endoftext|>", true) "]"}, NULL);
    rl_bpe_special_ids(t, &bos, &eos);
    cr_assert(bos == -1 && eos == 1001, "bos %lld, eos %lld", (long long)bos, (long long)eos);
    rl_bpe_free(t);
    t = parse_ok(&(spec){.added = "[" ADDED(1000, "<s>", true) "," ADDED(1001, "</s>", true) "]"}, NULL);
    rl_bpe_special_ids(t, &bos, &eos);
    cr_assert(bos == -1 && eos == -1, "bos %lld, eos %lld", (long long)bos, (long long)eos);
    rl_bpe_free(t);
}

Test(tok, token_id_and_added_content_look_up_added_and_vocab_tokens) {
    rl_bpe *t = parse_ok(&(spec){.added = "[" ADDED(1000, "<s>", true) "," ADDED(1001, "</s>", true) "]"}, NULL);
    cr_assert_eq(rl_bpe_token_id(t, "</s>"), 1001);
    cr_assert_eq(rl_bpe_token_id(t, "\xc4\xa0"), ' '); /* a vocab token by its byte-level spelling, U+0120 */
    cr_assert_eq(rl_bpe_token_id(t, " "), -1);        /* ... not by its bytes */
    cr_assert_eq(rl_bpe_token_id(t, "nope"), -1);
    cr_assert_str_eq(rl_bpe_added_content(t, 1001), "</s>");
    cr_assert_null(rl_bpe_added_content(t, 'a')); /* a vocab token, not an added one */
    rl_bpe_free(t);
}

/* ---- post-processor -------------------------------------------------------------------------- */

#define TEMPLATE                                                                                                    \
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<bos>\",\"type_id\":0}},"            \
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"<eos>\",\"type_id\":0}}],"            \
    "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"            \
    "\"special_tokens\":{\"<bos>\":{\"id\":\"<bos>\",\"ids\":[2000],\"tokens\":[\"<bos>\"]},"                       \
    "\"<eos>\":{\"id\":\"<eos>\",\"ids\":[2001,2002],\"tokens\":[\"<eos>\",\"<eos2>\"]}}}"

static void expect_template(rl_bpe *t) {
    const uint32_t *pre, *suf;
    int np, ns;
    rl_bpe_template(t, &pre, &np, &suf, &ns);
    cr_assert_eq(np, 1);
    cr_assert_eq(pre[0], 2000);
    cr_assert_eq(ns, 2);
    cr_assert(suf[0] == 2001 && suf[1] == 2002, "suffix %u %u", suf[0], suf[1]);
    /* the template's ids count in the vocabulary size, as no token names them */
    cr_assert_eq(rl_bpe_vocab_size(t), 2003);
}

Test(tok, template_processing_gives_the_ids_around_one_sequence) {
    rl_bpe *t = parse_ok(&(spec){.post = TEMPLATE}, NULL);
    expect_template(t);
    rl_bpe_free(t);
}

Test(tok, a_sequence_of_byte_level_and_template_post_processors_gives_the_template) {
    rl_bpe *t = parse_ok(&(spec){.post = "{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\","
                                         "\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},"
                                         TEMPLATE "]}"},
                         NULL);
    expect_template(t);
    rl_bpe_free(t);
}

/* Llama 3: the template puts one BOS before the text and nothing after;
 * its special <|end_of_text|> is not taken for EOS, as the file does not
 * say it ends a sequence. */
Test(tok, with_a_template_bos_is_its_one_prefix_token) {
    rl_bpe *t = parse_ok(
        &(spec){.added = "[" ADDED(2000, "<|begin_of_text|>", true) "," ADDED(2001, "<|end_of_text|>", true) "]",
                .post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\","
                        "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{"
                        "\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\",\"ids\":[2000],"
                        "\"tokens\":[\"<|begin_of_text|>\"]}}}"},
        NULL);
    int64_t bos = 0, eos = 0;
    rl_bpe_special_ids(t, &bos, &eos);
    cr_assert(bos == 2000 && eos == -1, "bos %lld, eos %lld", (long long)bos, (long long)eos);
    rl_bpe_free(t);
    t = parse_ok(&(spec){.post = TEMPLATE}, NULL); /* two ids after: no one EOS */
    rl_bpe_special_ids(t, &bos, &eos);
    cr_assert(bos == 2000 && eos == -1, "bos %lld, eos %lld", (long long)bos, (long long)eos);
    rl_bpe_free(t);
}

/* The document frame (rl_bpe_frame): the template when there is one,
 * whatever eos says; else the given eos, else the one special token,
 * before each document; else nothing. */
Test(tok, the_document_frame_is_the_template_else_eos_before_each) {
    rl_doc_frame f;
    rl_bpe *t = parse_ok(&(spec){.post = TEMPLATE}, NULL);
    rl_bpe_frame(t, 7, &f);
    cr_assert(f.nbefore == 1 && f.before[0] == 2000 && f.nafter == 2 && f.after[0] == 2001 && f.after[1] == 2002,
              "%d before, %d after", f.nbefore, f.nafter);
    cr_assert_eq(f.eos, -1); /* two ids after a sequence: no one end-of-text token */
    rl_bpe_free(t);
    t = parse_ok(&(spec){.added = "[" ADDED(1000, "<n>", false) "," ADDED(1001, "<|endoftext|>", true) "]"}, NULL);
    rl_bpe_frame(t, -1, &f);
    cr_assert(f.nbefore == 1 && f.before[0] == 1001 && f.nafter == 0 && f.eos == 1001);
    rl_bpe_frame(t, 1000, &f);
    cr_assert(f.nbefore == 1 && f.before[0] == 1000 && f.eos == 1000);
    rl_bpe_free(t);
    t = parse_ok(&(spec){.added = "[" ADDED(1000, "<s>", true) "," ADDED(1001, "</s>", true) "]"}, NULL);
    rl_bpe_frame(t, -1, &f);
    cr_assert(f.nbefore == 0 && f.nafter == 0 && f.eos == -1);
    rl_bpe_free(t);
}

Test(tok, a_template_of_more_than_16_ids_a_side_is_refused) {
    char post[2048] = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<b>\","
                      "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{"
                      "\"<b>\":{\"id\":\"<b>\",\"ids\":[";
    for (int i = 0; i < RL_BPE_FRAME_MAX + 1; i++) snprintf(post + strlen(post), 16, "%s%d", i ? "," : "", 2000 + i);
    strcat(post, "]}}}");
    expect_bad(&(spec){.post = post}, "post_processor.special_tokens", "more than 16 ids");
}

Test(tok, a_byte_level_post_processor_adds_no_template) {
    rl_bpe *t = parse_ok(&(spec){.post = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,"
                                         "\"use_regex\":true}"},
                         NULL);
    const uint32_t *pre, *suf;
    int np = -1, ns = -1;
    rl_bpe_template(t, &pre, &np, &suf, &ns);
    cr_assert(np == 0 && ns == 0, "prefix %d, suffix %d", np, ns);
    cr_assert_eq(rl_bpe_vocab_size(t), 256);
    rl_bpe_free(t);
}

/* ---- round trips ------------------------------------------------------------------------- */

Test(tok, decode_of_encode_is_the_bytes_with_gpt2_pattern) {
    rl_bpe *t = parse_ok(&(spec){.merges = roundtrip_merges}, NULL);
    check_roundtrip(t, "", 300, 1);
    rl_bpe_free(t);
}

Test(tok, decode_of_encode_is_the_bytes_with_a_split_then_byte_level_without_regex) {
    rl_bpe *t = parse_ok(&(spec){.merges = roundtrip_merges, .pre = LLAMA3_PRE, .pair_merges = true}, NULL);
    check_roundtrip(t, "", 300, 2);
    rl_bpe_free(t);
}

/* add_prefix_space puts one space before the text (not before one that
 * already starts with a space) */
Test(tok, add_prefix_space_decodes_to_a_space_then_the_text) {
    rl_bpe *t = parse_ok(&(spec){.merges = roundtrip_merges,
                                 .pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
                                        "\"use_regex\":true}"},
                         NULL);
    check_roundtrip(t, " ", 300, 3);
    rl_bpe_ids ids = encode(t, " a", 2, false);
    size_t n;
    char *d = decode(t, &ids, &n);
    cr_assert(n == 2 && !memcmp(d, " a", 2), "' a' decoded to '%.*s'", (int)n, d);
    cr_assert_eq(ids.n, 1); /* the " a" merge: no second space was added */
    free(d);
    rl_bpe_ids_free(&ids);
    rl_bpe_free(t);
}

/* ---- many documents ---------------------------------------------------------------------------- */

Test(tok, encode_many_on_three_encoders_equals_encoding_one_by_one) {
    rl_bpe *t = parse_ok(&(spec){.merges = roundtrip_merges,
                                 .pre = LLAMA3_PRE,
                                 .added = "[" ADDED(1000, "<|endoftext|>", true) "]"},
                         NULL);
    enum { N = 200 };
    char *docs[N];
    size_t lens[N];
    uint64_t rng = 99;
    for (int i = 0; i < N; i++) {
        docs[i] = malloc(600);
        lens[i] = random_text(&rng, docs[i], 600);
    }
    rl_bpe_enc *encs[3];
    rl_err e = {0};
    for (int i = 0; i < 3; i++) cr_assert_eq(rl_bpe_enc_new(t, &encs[i], &e), RL_OK);
    rl_bpe_ids outs[N] = {{0}};
    cr_assert_eq(rl_bpe_encode_many(encs, 3, (const char *const *)docs, lens, N, true, outs, &e), RL_OK, "%s", e.msg);
    int specials = 0;
    for (int i = 0; i < N; i++) {
        rl_bpe_ids one = encode(t, docs[i], lens[i], true);
        cr_assert(one.n == outs[i].n && (!one.n || !memcmp(one.v, outs[i].v, one.n * sizeof *one.v)),
                  "document %d: %zu ids from encode_many, %zu one by one", i, outs[i].n, one.n);
        for (size_t k = 0; k < one.n; k++) specials += one.v[k] == 1000;
        rl_bpe_ids_free(&one);
        rl_bpe_ids_free(&outs[i]);
        free(docs[i]);
    }
    cr_assert_gt(specials, 0, "no document held the special token");
    for (int i = 0; i < 3; i++) rl_bpe_enc_free(encs[i]);
    rl_bpe_free(t);
}

/* ---- decoding ----------------------------------------------------------------------------------- */

/* 700 lies below the vocabulary size (an added token has id 1000) but no
 * token has it; 1001 lies past the end. */
Test(tok, decode_of_an_id_no_token_has_is_einput_naming_the_id) {
    rl_bpe *t = parse_ok(&(spec){.added = "[" ADDED(1000, "<s>", true) "]"}, NULL);
    cr_assert_eq(rl_bpe_vocab_size(t), 1001);
    static const uint32_t gap[] = {'a', 700}, past[] = {1001}, ok[] = {'h', 'i', 1000};
    char *buf = NULL;
    size_t len = 0, cap = 0;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_decode(t, gap, 2, &buf, &len, &cap, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "700"), "%s", e.msg);
    len = 0;
    cr_assert_eq(rl_bpe_decode(t, past, 1, &buf, &len, &cap, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "1001"), "%s", e.msg);
    len = 0;
    cr_assert_eq(rl_bpe_decode(t, ok, 3, &buf, &len, &cap, &e), RL_OK, "%s", e.msg);
    cr_assert(len == 5 && !strcmp(buf, "hi<s>"), "decoded '%s'", buf);
    free(buf);
    rl_bpe_free(t);
}

/* ---- rl_utf8_lossy ----------------------------------------------------------------------------- */

/* One U+FFFD per maximal invalid subpart, as Python's decode("utf-8",
 * "replace") and Rust's from_utf8_lossy (tokenizers' decode): a truncated
 * sequence is one replacement, a byte that can start nothing is one each;
 * NUL is replaced too (the result is a C string); valid text is kept. */
Test(tok, utf8_lossy_replaces_each_maximal_invalid_subpart_as_python_does) {
#define R "\xef\xbf\xbd"
#define S(lit) lit, sizeof lit - 1 /* a literal and its length, NULs included */
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } c[] = {
        {S("a\xe6\x97x"), "a" R "x"}, /* a 3-byte sequence cut after 2 */
        {S("\xf0\x90\x80W"), R "W"}, /* a 4-byte one cut after 3 */
        {S("\xed\xa0\x80"), R R R}, /* a surrogate: ED takes only 80..9F next */
        {S("\xe0\x80\x80"), R R R}, /* overlong: E0 takes only A0..BF next */
        {S("\xf4\x90\x80\x80"), R R R R}, /* past U+10FFFF */
        {S("\xc0\x80"), R R}, /* C0 starts nothing */
        {S("x\0y\xc3"), "x" R "y" R}, /* NUL; a lead byte at the end */
        {S("Gr\xc3\xbc\xc3\x9f \xe6\x9d\xb1 \xf0\x9f\x99\x82"), "Gr\xc3\xbc\xc3\x9f \xe6\x9d\xb1 \xf0\x9f\x99\x82"},
    };
#undef R
#undef S
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        size_t n = 0;
        char *out = rl_utf8_lossy(c[i].in, c[i].n, &n);
        cr_assert_not_null(out);
        cr_assert(n == strlen(c[i].want) && !strcmp(out, c[i].want), "case %zu: got %zu bytes '%s', want '%s'", i, n,
                  out, c[i].want);
        free(out);
    }
}

/* ---- refused files ----------------------------------------------------------------------------- */

Test(tok, text_that_is_not_json_is_refused) {
    static const char js[] = "{\"model\": {\"type\": \"BPE\",";
    rl_bpe *t = (rl_bpe *)1;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_parse(js, sizeof js - 1, "tok.json", &t, &e), RL_EINPUT);
    cr_assert_null(t);
    cr_assert_eq(strncmp(e.msg, "tok.json: ", 10), 0, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "JSON"), "%s", e.msg);
}

Test(tok, a_normalizer_other_than_nfc_is_refused) {
    expect_bad(&(spec){.normalizer = "{\"type\":\"NFKC\"}"}, "normalizer", "NFKC");
    expect_bad(&(spec){.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
                                     "{\"type\":\"Lowercase\"}]}"},
               "normalizer", "Sequence");
}

/* NFC (Qwen2's normalizer): a decomposed e + U+0301 encodes as the
 * precomposed U+00E9 does, and decodes to it; bytes that start no valid
 * character stay as they are (and a mark after one has nothing to compose
 * with); a one-item Sequence is the same normalizer. */
Test(tok, nfc_encodes_decomposed_text_as_its_composed_form) {
    static const char *const merges[] = {"\xc3", "\xa9", NULL}; /* U+00E9 whole: 256 */
    const char *nfc_seq = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}";
    for (int seq = 0; seq < 2; seq++) {
        rl_bpe *t = parse_ok(&(spec){.merges = merges, .normalizer = seq ? nfc_seq : "{\"type\":\"NFC\"}"}, NULL);
        const uint32_t want[] = {'c', 'a', 'f', 256};
        expect_ids(t, "caf\xc3\xa9", false, want, 4);
        expect_ids(t, "cafe\xcc\x81", false, want, 4);
        const uint32_t raw[] = {'x', 0xff, 0xcc, 0x81};
        expect_ids(t, "x\xff\xcc\x81", false, raw, 4);
        rl_bpe_ids ids = encode(t, "cafe\xcc\x81", 6, false);
        char *text = NULL;
        size_t len = 0, cap = 0;
        rl_err e = {0};
        cr_assert_eq(rl_bpe_decode(t, ids.v, ids.n, &text, &len, &cap, &e), 0, "%s", e.msg);
        cr_assert(len == 5 && !memcmp(text, "caf\xc3\xa9", 5), "%.*s", (int)len, text);
        free(text);
        rl_bpe_ids_free(&ids);
        rl_bpe_free(t);
    }
}

/* With a normalizer, an added token marked normalized is matched in the
 * normalized text (so the decomposed spelling finds it), one that is not
 * only in the text as given. */
Test(tok, nfc_matches_normalized_added_tokens_after_normalizing_and_the_others_before) {
    const char *added = "[{\"id\":1000,\"content\":\"\xc3\xa9!\",\"single_word\":false,\"lstrip\":false,"
                        "\"rstrip\":false,\"normalized\":true,\"special\":false},"
                        "{\"id\":1001,\"content\":\"\xc3\xa8?\",\"single_word\":false,\"lstrip\":false,"
                        "\"rstrip\":false,\"normalized\":false,\"special\":false}]";
    rl_bpe *t = parse_ok(&(spec){.normalizer = "{\"type\":\"NFC\"}", .added = added}, NULL);
    const uint32_t a[] = {1000}, b[] = {1001}, c[] = {0xc3, 0xa8, '?'};
    expect_ids(t, "e\xcc\x81!", false, a, 1);     /* decomposed, normalized: matched */
    expect_ids(t, "\xc3\xa8?", false, b, 1);      /* composed as given: matched */
    expect_ids(t, "e\xcc\x80?", false, c, 3);     /* decomposed, not normalized: its bytes after NFC */
    rl_bpe_free(t);
}

Test(tok, a_wordpiece_model_is_refused) { expect_bad(&(spec){.model_type = "WordPiece"}, "model.type", "WordPiece"); }

Test(tok, a_merge_of_a_token_not_in_the_vocab_is_refused) {
    expect_bad(&(spec){.merges_more = "\"zq a\""}, "model.merges[0]", "\"zq\" is not in model.vocab");
}

/* both halves exist, their concatenation does not */
Test(tok, a_merge_whose_product_is_not_in_the_vocab_is_refused) {
    static const char *const m[] = {"a", "b", NULL};
    expect_bad(&(spec){.merges = m, .merges_more = "[\"c\",\"d\"]"}, "model.merges[1]", "not in model.vocab");
}

Test(tok, a_merge_string_without_a_space_is_refused) {
    expect_bad(&(spec){.merges_more = "\"ab\""}, "model.merges[0]", "one space");
}

/* {"Regex": null, "String": "b"}: the String is the pattern, matched as
 * written; "ab" is then never one word, so its merge cannot apply */
Test(tok, a_split_pattern_with_a_null_regex_uses_its_string) {
    static const char *const m[] = {"a", "b", NULL};
    rl_bpe *t = parse_ok(&(spec){.merges = m,
                                 .pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                                        "{\"Regex\":null,\"String\":\"b\"},\"behavior\":\"Isolated\",\"invert\":false},"
                                        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"},
                         NULL);
    expect_ids(t, "abc", false, (const uint32_t[]){'a', 'b', 'c'}, 3);
    rl_bpe_free(t);
    t = parse_ok(&(spec){.merges = m}, NULL); /* GPT-2's pattern: "abc" is one word */
    expect_ids(t, "abc", false, (const uint32_t[]){256, 'c'}, 2);
    rl_bpe_free(t);
}

Test(tok, a_split_with_behavior_removed_is_refused) {
    expect_bad(&(spec){.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":"
                              "\" \"},\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"ByteLevel\","
                              "\"add_prefix_space\":false,\"use_regex\":false}]}"},
               "pre_tokenizer.pretokenizers[0].behavior", "Removed");
}

Test(tok, an_added_token_with_lstrip_is_refused) {
    expect_bad(&(spec){.added = "[{\"id\":1000,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":true,"
                                "\"rstrip\":false,\"normalized\":false,\"special\":true}]"},
               "added_tokens[0].lstrip", NULL);
}

Test(tok, a_negative_vocab_id_is_refused) {
    expect_bad(&(spec){.vocab_more = "\"zq\":-1"}, "model.vocab[\"zq\"]", "id");
}

/* RL_BPE_MAX_VOCAB - 1 is the largest id there may be */
Test(tok, a_vocab_id_at_the_id_space_limit_is_refused_one_below_it_is_taken) {
    char more[64];
    snprintf(more, sizeof more, "\"zq\":%u", RL_BPE_MAX_VOCAB);
    expect_bad(&(spec){.vocab_more = more}, "model.vocab[\"zq\"]", "id");
    snprintf(more, sizeof more, "\"zq\":%u", RL_BPE_MAX_VOCAB - 1);
    rl_bpe *t = parse_ok(&(spec){.vocab_more = more}, NULL);
    cr_assert_eq(rl_bpe_vocab_size(t), RL_BPE_MAX_VOCAB);
    cr_assert_eq(rl_bpe_token_id(t, "zq"), RL_BPE_MAX_VOCAB - 1);
    rl_bpe_free(t);
}

Test(tok, a_null_pre_tokenizer_is_refused) { expect_bad(&(spec){.pre = "null"}, "pre_tokenizer", "ByteLevel"); }

Test(tok, a_missing_decoder_is_refused) { expect_bad(&(spec){.decoder = ""}, "decoder", NULL); }

Test(tok, a_split_regex_pcre2_cannot_compile_is_refused_naming_its_field) {
    expect_bad(&(spec){.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                              "\"(a\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                              "\"add_prefix_space\":false,\"use_regex\":false}]}"},
               "pre_tokenizer.pretokenizers[0].pattern.Regex", "PCRE2");
}

/* A message quotes the file's strings; one holding a newline must not
 * break the message's one line. */
Test(tok, a_refusal_quoting_a_newline_stays_one_line) {
    expect_bad(&(spec){.vocab_more = "\"z\\nq\":-1"}, "model.vocab[", NULL);
    expect_bad(&(spec){.model_type = "Word\\nPiece"}, "model.type", NULL);
}

/* ---- encoding failures -------------------------------------------------------------------------- */

/* (a+)+$ backtracks exponentially on a run of a's that ends in b; PCRE2's
 * match limit makes it an error in well under the timeout. */
Test(tok, a_catastrophic_split_pattern_fails_the_text_instead_of_hanging, .timeout = 60) {
    rl_bpe *t = parse_ok(&(spec){.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
                                        "\"Regex\":\"(a+)+$\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":"
                                        "\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"},
                         NULL);
    char text[64];
    memset(text, 'a', 48);
    text[48] = 'b';
    rl_bpe_enc *enc = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_enc_new(t, &enc, &e), RL_OK);
    rl_bpe_ids ids = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = rl_bpe_encode(enc, text, 49, false, &ids, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(rc, RL_EINPUT, "rc %d", rc);
    cr_assert_not_null(strstr(e.msg, "pattern"), "%s", e.msg);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_assert_lt(s, 5.0, "took %.1f s", s); /* about 0.03 s: PCRE2 stops at 10M steps */
    /* the same encoder still encodes a text the pattern handles */
    ids.n = 0;
    cr_assert_eq(rl_bpe_encode(enc, "aaa", 3, false, &ids, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(ids.n, 3);
    rl_bpe_ids_free(&ids);
    rl_bpe_enc_free(enc);
    rl_bpe_free(t);
}

/* ---- files ------------------------------------------------------------------------------------------ */

static char g_dir[256];

static void tmp_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/rl_test_tok_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}

static void tmp_teardown(void) {
    if (g_dir[0]) rl_test_rmdir(g_dir);
}

Test(tok, load_of_a_missing_file_names_the_path, .init = tmp_setup, .fini = tmp_teardown) {
    char path[300];
    snprintf(path, sizeof path, "%s/missing-tokenizer.json", g_dir);
    rl_bpe *t = (rl_bpe *)1;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_load(path, &t, &e), RL_EINPUT, "%s", e.msg);
    cr_assert_null(t);
    cr_assert_not_null(strstr(e.msg, path), "'%s' does not name %s", e.msg, path);
}

/* The path leads a bad file's message; a good file loads, and its sha256
 * is that of the file's bytes. */
Test(tok, load_names_the_path_in_a_refusal_and_hashes_a_good_file, .init = tmp_setup, .fini = tmp_teardown) {
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    char *js = make_doc(&(spec){.model_type = "Unigram"}, NULL);
    rl_test_write(path, js, strlen(js));
    free(js);
    rl_bpe *t = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_bpe_load(path, &t, &e), RL_EINPUT);
    char lead[320];
    snprintf(lead, sizeof lead, "%s: model.type", path);
    cr_assert_eq(strncmp(e.msg, lead, strlen(lead)), 0, "'%s' does not start with '%s'", e.msg, lead);

    js = make_doc(&(spec){0}, NULL);
    rl_test_write(path, js, strlen(js));
    cr_assert_eq(rl_bpe_load(path, &t, &e), RL_OK, "%s", e.msg);
    unsigned char md[32];
    unsigned int mdl = 0;
    cr_assert(EVP_Digest(js, strlen(js), md, &mdl, EVP_sha256(), NULL));
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    cr_assert_str_eq(rl_bpe_sha256(t), hex);
    free(js);
    rl_bpe_free(t);
}
