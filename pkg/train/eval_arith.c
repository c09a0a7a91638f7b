/* The evaluation a person can read: does the model add numbers it never
 * saw? Every line "a+b=c" of the val split (pairs held out of training)
 * becomes the prompt "\na+b=", completed greedily until a newline, and
 * scored by exact match with c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define GEN_MAX 8      /* answer digits + newline, with room to spare */
#define LINE_MAX_ 24
#define VAL_MAX_TOKENS (16u << 20)

typedef struct {
    char prompt[LINE_MAX_]; /* "a+b=" */
    char want[LINE_MAX_];   /* "c" */
} example;

/* Split the val text into examples; lines that are not "digits+digits=digits"
 * are skipped (a val split of another corpus simply yields none). */
static int parse_examples(const char *text, size_t n, example **out, int *count) {
    int cap = 0, k = 0;
    example *ex = NULL;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && text[j] != '\n') j++;
        size_t len = j - i;
        const char *line = text + i;
        const char *plus = memchr(line, '+', len), *eq = memchr(line, '=', len);
        bool ok = len > 0 && len < LINE_MAX_ && plus && eq && plus > line && eq > plus + 1 &&
                  (size_t)(eq - line) + 1 < len;
        for (size_t c = 0; ok && c < len; c++)
            ok = (line[c] >= '0' && line[c] <= '9') || line + c == plus || line + c == eq;
        if (ok) {
            if (k == cap) {
                cap = cap ? 2 * cap : 256;
                example *nx = realloc(ex, sizeof *ex * (size_t)cap);
                if (!nx) {
                    free(ex);
                    return RL_ENOMEM;
                }
                ex = nx;
            }
            size_t pl = (size_t)(eq - line) + 1;
            memcpy(ex[k].prompt, line, pl);
            ex[k].prompt[pl] = '\0';
            memcpy(ex[k].want, eq + 1, len - pl);
            ex[k].want[len - pl] = '\0';
            k++;
        }
        i = j + 1;
    }
    *out = ex;
    *count = k;
    return RL_OK;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int rl_eval_arith(rl_model *m, rl_dataset *val, int max_examples, rl_arith_result *r, rl_err *e) {
    memset(r, 0, sizeof *r);
    if (!val) return rl_errf(e, RL_EINPUT, "eval arith: no val split (data.val)");
    uint64_t nt = rl_dataset_tokens(val);
    if (nt > VAL_MAX_TOKENS) nt = VAL_MAX_TOKENS;
    int32_t *tok = malloc(sizeof(int32_t) * nt);
    char *text = malloc(nt + 1);
    example *ex = NULL;
    int nex = 0, rc;
    if (!tok || !text) {
        rc = rl_errf(e, RL_ENOMEM, "eval arith: out of memory");
        goto out;
    }
    if ((rc = rl_dataset_read(val, 0, nt, tok, e))) goto out;
    size_t tl = rl_tok_decode(tok, nt, text, nt + 1);
    if ((rc = parse_examples(text, tl, &ex, &nex))) {
        rc = rl_errf(e, RL_ENOMEM, "eval arith: out of memory");
        goto out;
    }
    if (nex == 0) {
        rc = rl_errf(e, RL_EINPUT, "eval arith: the val split holds no \"a+b=c\" lines");
        goto out;
    }
    if (max_examples > 0 && nex > max_examples) nex = max_examples;

    int Tn = LINE_MAX_ + GEN_MAX + 1;
    if (Tn > m->T) Tn = m->T;
    int nb = (m->B * m->T) / Tn;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)nb * Tn);
    int *len = malloc(sizeof(int) * (size_t)nb), *plen = malloc(sizeof(int) * (size_t)nb);
    bool *done = malloc(sizeof(bool) * (size_t)nb);
    if (!seq || !len || !plen || !done) {
        free(seq), free(len), free(plen), free(done);
        rc = rl_errf(e, RL_ENOMEM, "eval arith: out of memory");
        goto out;
    }
    for (int base = 0; base < nex && !rc; base += nb) {
        int b = nex - base < nb ? nex - base : nb;
        for (int i = 0; i < b; i++) {
            const char *p = ex[base + i].prompt;
            int32_t *s = seq + (size_t)i * Tn;
            s[0] = '\n';
            plen[i] = len[i] = 1 + (int)strlen(p);
            for (int c = 1; c < len[i]; c++) s[c] = (unsigned char)p[c - 1];
            done[i] = false;
        }
        for (int g = 0; g < GEN_MAX; g++) {
            int T = 0;
            for (int i = 0; i < b; i++)
                if (len[i] > T) T = len[i];
            if (T > Tn) break;
            /* pack rows of length T; causal attention makes the padding after
             * a shorter prompt irrelevant to its last position */
            int32_t *in = malloc(sizeof(int32_t) * (size_t)b * T);
            if (!in) {
                rc = rl_errf(e, RL_ENOMEM, "eval arith: out of memory");
                break;
            }
            for (int i = 0; i < b; i++)
                for (int c = 0; c < T; c++) in[(size_t)i * T + c] = c < len[i] ? seq[(size_t)i * Tn + c] : '\n';
            rc = rl_model_forward(m, in, NULL, b, T, NULL, e);
            free(in);
            if (rc) break;
            const float *logits = rl_model_logits(m);
            bool any = false;
            for (int i = 0; i < b; i++) {
                if (done[i]) continue;
                int next = argmax(logits + ((size_t)i * T + len[i] - 1) * m->cfg.vocab_size,
                                  m->cfg.vocab_size);
                if (next == '\n' || len[i] >= Tn) done[i] = true;
                else seq[(size_t)i * Tn + len[i]++] = next;
                any |= !done[i];
            }
            if (!any) break;
        }
        for (int i = 0; i < b && !rc; i++) {
            char got[GEN_MAX + 2];
            int gl = 0;
            for (int c = plen[i]; c < len[i] && gl < GEN_MAX; c++) {
                int32_t t = seq[(size_t)i * Tn + c];
                got[gl++] = t >= 32 && t < 127 ? (char)t : '?';
            }
            got[gl] = '\0';
            const example *x = &ex[base + i];
            bool ok = strcmp(got, x->want) == 0;
            r->correct += ok;
            r->total++;
            if (r->n_shown < 6) {
                if (ok) snprintf(r->shown[r->n_shown], sizeof r->shown[0], "%s%s ok", x->prompt, got);
                else snprintf(r->shown[r->n_shown], sizeof r->shown[0], "%s%s (want %s)", x->prompt, got, x->want);
                r->n_shown++;
            }
        }
    }
    free(seq), free(len), free(plen), free(done);
out:
    free(tok);
    free(text);
    free(ex);
    return rc;
}
