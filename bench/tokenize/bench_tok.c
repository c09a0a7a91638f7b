/* Tokenizer throughput: a JSON Lines corpus encoded by pkg/tok on every
 * core (rl_bpe_encode_many, as ringleader-prepare does), reading and
 * writing excluded. bench_tok.py runs it beside Hugging Face tokenizers'
 * encode_batch on the same documents and cores.
 * Usage: bench_tok TOKENIZER.json DOCS.jsonl ROUNDS -> one JSON line per round */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"
#include "tok/tok.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench_tok TOKENIZER.json DOCS.jsonl ROUNDS\n");
        return 2;
    }
    rl_err e = {0};
    rl_bpe *t;
    rl_jsonl *j;
    if (rl_bpe_load(argv[1], &t, &e) || rl_jsonl_open(argv[2], "text", 0, &j, &e)) {
        fprintf(stderr, "bench_tok: %s\n", e.msg);
        return 1;
    }
    size_t n = 0, cap = 0, bytes = 0;
    char **docs = NULL;
    size_t *lens = NULL;
    const char *text;
    size_t len;
    while (!rl_jsonl_next(j, &text, &len, &e) && text) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            docs = realloc(docs, cap * sizeof *docs), lens = realloc(lens, cap * sizeof *lens);
        }
        docs[n] = strndup(text, len), lens[n++] = len, bytes += len;
    }
    rl_jsonl_close(j);
    int nt = omp_get_max_threads();
    rl_bpe_enc **enc = calloc((size_t)nt, sizeof *enc);
    for (int i = 0; i < nt; i++)
        if (rl_bpe_enc_new(t, &enc[i], &e)) return 1;
    rl_bpe_ids *out = calloc(n, sizeof *out);
    for (int r = 0; r < atoi(argv[3]); r++) {
        double t0 = rl_now();
        if (rl_bpe_encode_many(enc, nt, (const char *const *)docs, lens, n, false, out, &e)) {
            fprintf(stderr, "bench_tok: %s\n", e.msg);
            return 1;
        }
        double dt = rl_now() - t0;
        size_t tokens = 0;
        for (size_t i = 0; i < n; i++) tokens += out[i].n;
        printf("{\"bench\":\"tokenize\",\"impl\":\"ringleader\",\"docs\":%zu,\"bytes\":%zu,\"tokens\":%zu,"
               "\"threads\":%d,\"seconds\":%.4f,\"mb_per_s\":%.2f}\n",
               n, bytes, tokens, nt, dt, (double)bytes / dt / 1e6);
        fflush(stdout);
    }
    for (size_t i = 0; i < n; i++) free(docs[i]), rl_bpe_ids_free(&out[i]);
    for (int i = 0; i < nt; i++) rl_bpe_enc_free(enc[i]);
    free(docs), free(lens), free(out), free(enc);
    rl_bpe_free(t);
    return 0;
}
