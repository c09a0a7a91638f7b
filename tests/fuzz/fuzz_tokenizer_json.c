/* libFuzzer target for rl_bpe_parse, which reads a Hugging Face
 * tokenizer.json that a job names (ringleader-prepare --tokenizer), and
 * for the encoder and decoder it builds. The input is the file's bytes (a
 * heap copy of exactly them, no terminator, so ASan sees any over-read).
 * It checks the contract: on failure RL_EINPUT (or RL_ENOMEM), no
 * tokenizer, and one line that starts with the file name; on success,
 * every text encodes (special tokens on and off) to ids below the
 * vocabulary size, the same ids a second time (the word cache), and those
 * ids decode (and rl_utf8_lossy makes the bytes a C string). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const texts[] = {
    "Hello, world! It's 2024: the quick brown fox   jumps.\n\n\tdone",
    "Grüße, 東京の天気は晴れ 🙂 — naïve café, Привет мир, مرحبا",
    "\xff\xfe\x80 bad \xc3 utf8 \xed\xa0\x80 \xf4\x90\x80\x80 end\xe2\x82",
    "a document<|endoftext|>another one <|endoftext|><|endoftext|>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab                                              x",
};

static void encode_all(const rl_bpe *t, rl_bpe_enc *enc) {
    uint32_t nv = rl_bpe_vocab_size(t);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int special = 0; special < 2; special++) {
            rl_bpe_ids ids = {0}, again = {0};
            rl_err e = {0};
            int rc = rl_bpe_encode(enc, texts[i], strlen(texts[i]), special, &ids, &e);
            if (rc != RL_OK) {
                /* a pattern past PCRE2's limits fails the text, as a user's error */
                if (rc != RL_EINPUT && rc != RL_ENOMEM) abort();
                if (strchr(e.msg, '\n')) abort();
                rl_bpe_ids_free(&ids);
                continue;
            }
            for (size_t k = 0; k < ids.n; k++)
                if (ids.v[k] >= nv) abort();
            if (rl_bpe_encode(enc, texts[i], strlen(texts[i]), special, &again, &e) != RL_OK) abort();
            if (again.n != ids.n || (ids.n && memcmp(again.v, ids.v, ids.n * sizeof *ids.v))) abort();
            char *buf = NULL;
            size_t len = 0, cap = 0;
            if (rl_bpe_decode(t, ids.v, ids.n, &buf, &len, &cap, &e) != RL_OK) abort();
            if (len && (!buf || buf[len] != 0)) abort();
            /* what a sample log line holds: a C string, every byte accounted for */
            size_t cl = 0;
            char *clean = rl_utf8_lossy(buf ? buf : "", len, &cl);
            if (!clean || strlen(clean) != cl || cl < len) abort();
            free(clean);
            free(buf);
            rl_bpe_ids_free(&ids);
            rl_bpe_ids_free(&again);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = malloc(size ? size : 1);
    if (!json) return 0;
    if (size) memcpy(json, data, size);
    rl_bpe *t = (rl_bpe *)1;
    rl_err e = {0};
    int rc = rl_bpe_parse(json, size, "fuzz.json", &t, &e);
    if (rc != RL_OK) {
        if ((rc != RL_EINPUT && rc != RL_ENOMEM) || e.code != rc || t) abort();
        if (rc == RL_EINPUT && strncmp(e.msg, "fuzz.json: ", 11) != 0) abort();
        if (strchr(e.msg, '\n')) abort();
    } else {
        if (!t || strlen(rl_bpe_sha256(t)) != 64) abort();
        const uint32_t *pre, *suf;
        int np, ns;
        rl_bpe_template(t, &pre, &np, &suf, &ns);
        for (int i = 0; i < np; i++)
            if (pre[i] >= rl_bpe_vocab_size(t)) abort();
        for (int i = 0; i < ns; i++)
            if (suf[i] >= rl_bpe_vocab_size(t)) abort();
        rl_bpe_enc *enc = NULL;
        if (rl_bpe_enc_new(t, &enc, &e) == RL_OK) {
            encode_all(t, enc);
            rl_bpe_enc_free(enc);
        }
        rl_bpe_free(t);
    }
    free(json);
    return 0;
}
