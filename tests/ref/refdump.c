/* refdump: the C half of the Hugging Face reference test (tests/ref/check_llama.py).
 *
 * The unit tests prove the float model matches our own double model; they
 * cannot catch a shared misreading of Llama (RoPE pairing, RMSNorm eps
 * placement, GQA head mapping). So this program dumps everything PyTorch needs
 * to recompute the same step independently: the config under Hugging Face's
 * field names, the tensor table, the parameters, the batch, and our logits,
 * loss and gradients. Norm weights are perturbed away from 1 and the init is
 * wide, because all-ones norms and near-uniform logits hide whole classes of
 * bugs (a swapped norm, a missing scale).
 *
 * usage: refdump OUTDIR [--layers N --hidden N --heads N --kv-heads N --inter N
 *                        --vocab N --seq N --batch N --theta X --eps X
 *                        --init-range X --seed N]
 * Files are raw little-endian; see write_all() for the list. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "refdump writes raw buffers and promises little-endian files"
#endif

#define PROG "refdump"

static const char usage[] =
    "usage: " PROG " OUTDIR [--layers 2 --hidden 64 --heads 8 --kv-heads 2 --inter 176\n"
    "                        --vocab 97 --seq 16 --batch 3 --theta 10000 --eps 1e-5\n"
    "                        --init-range 0.1 --seed 5]\n"
    "Writes config.json, tensors.json, meta.json, params.f32, grads.f32, tokens.i32,\n"
    "targets.i32 and logits.f32 into OUTDIR for tests/ref/check_llama.py.\n";

typedef struct {
    const char *out;
    long long layers, hidden, heads, kv_heads, inter, vocab, seq, batch, seed;
    double theta, eps, init_range;
} args;

static int bad(const char *flag, const char *what) {
    fprintf(stderr, PROG ": %s: %s\n%s", flag, what, usage);
    return 2;
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || errno || *end || v < lo || v > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be an integer in [%lld, %lld]", lo, hi);
        return bad(flag, what);
    }
    *out = v;
    return 0;
}

static int parse_pos(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || errno || *end || !isfinite(v) || v <= 0) return bad(flag, "must be a positive number");
    *out = v;
    return 0;
}

/* Returns 0, 2 on a bad command line, or -1 after --help. */
static int parse_args(int argc, char **argv, args *a) {
    *a = (args){.layers = 2, .hidden = 64, .heads = 8, .kv_heads = 2, .inter = 176,
                .vocab = 97, .seq = 16, .batch = 3, .seed = 5,
                .theta = 10000, .eps = 1e-5, .init_range = 0.1};
    struct {
        const char *name;
        long long *dst, lo, hi;
    } ints[] = {
        {"--layers", &a->layers, 1, 64},      {"--hidden", &a->hidden, 2, 8192},
        {"--heads", &a->heads, 1, 256},       {"--kv-heads", &a->kv_heads, 1, 256},
        {"--inter", &a->inter, 1, 32768},     {"--vocab", &a->vocab, 1, 1 << 20},
        {"--seq", &a->seq, 1, 4096},          {"--batch", &a->batch, 1, 1024},
        {"--seed", &a->seed, 0, (1LL << 62)},
    };
    struct {
        const char *name;
        double *dst;
    } nums[] = {{"--theta", &a->theta}, {"--eps", &a->eps}, {"--init-range", &a->init_range}};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            fputs(usage, stdout);
            return -1;
        }
        if (arg[0] != '-') {
            if (a->out) return bad(arg, "only one OUTDIR");
            a->out = arg;
            continue;
        }
        if (i + 1 >= argc) return bad(arg, "needs a value (or is unknown)");
        const char *v = argv[++i];
        int found = 0, rc = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !found; k++)
            if (!strcmp(arg, ints[k].name))
                found = 1, rc = parse_int(arg, v, ints[k].lo, ints[k].hi, ints[k].dst);
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !found; k++)
            if (!strcmp(arg, nums[k].name)) found = 1, rc = parse_pos(arg, v, nums[k].dst);
        if (!found) return bad(arg, "unknown flag");
        if (rc) return rc;
    }
    if (!a->out || !*a->out) return bad("OUTDIR", "required");
    return 0;
}

/* ---- output ------------------------------------------------------------------ */

static int write_raw(const char *dir, const char *name, const void *p, size_t bytes, rl_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return rl_write_file_atomic(path, p, bytes, e);
}

/* Takes ownership of j. */
static int write_json(const char *dir, const char *name, cJSON *j, rl_err *e) {
    char *s = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!s) return rl_errf(e, RL_ENOMEM, "%s: cannot build JSON", name);
    int rc = write_raw(dir, name, s, strlen(s), e);
    free(s);
    return rc;
}

/* The LlamaConfig fields transformers needs to build the same model. */
static cJSON *config_json(const rl_model_config *c) {
    cJSON *j = cJSON_CreateObject();
    const char *arch = "LlamaForCausalLM";
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "initializer_range", c->initializer_range);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 0);
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddBoolToObject(j, "mlp_bias", 0);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static cJSON *tensors_json(const rl_model_config *c) {
    cJSON *arr = cJSON_CreateArray();
    int n = rl_model_n_tensors(c);
    for (int i = 0; i < n; i++) {
        rl_tensor_info t;
        rl_model_tensor(c, i, &t);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t.name);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t.ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t.shape[d]));
        cJSON_AddNumberToObject(o, "offset", (double)t.offset);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static cJSON *meta_json(int B, int T, float loss, long long seed) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "batch", B);
    cJSON_AddNumberToObject(j, "seq", T);
    cJSON_AddNumberToObject(j, "loss", (double)loss);
    cJSON_AddNumberToObject(j, "seed", (double)seed);
    return j;
}

static int run(const args *a, rl_err *e) {
    rl_model_config c;
    rl_model_config_default(&c);
    c.num_hidden_layers = (int)a->layers;
    c.hidden_size = (int)a->hidden;
    c.num_attention_heads = (int)a->heads;
    c.num_key_value_heads = (int)a->kv_heads;
    c.intermediate_size = (int)a->inter;
    c.vocab_size = (int)a->vocab;
    /* Longer than the batch's sequences, so a rope table indexed with the
     * wrong stride shows up. */
    c.max_position_embeddings = 2 * (int)a->seq;
    c.rope_theta = a->theta;
    c.rms_norm_eps = a->eps;
    c.initializer_range = a->init_range;
    int B = (int)a->batch, T = (int)a->seq, V = c.vocab_size;
    size_t N = (size_t)B * T;

    rl_model m;
    int rc = rl_model_create(&m, &c, B, T, e);
    if (rc) return rc;
    rl_model_init_params(&c, m.params, (uint64_t)a->seed);

    rl_rng rng;
    rl_rng_seed(&rng, rl_hash64((uint64_t)a->seed));
    for (int i = 0; i < rl_model_n_tensors(&c); i++) {
        rl_tensor_info t;
        rl_model_tensor(&c, i, &t);
        if (t.ndim != 1) continue;
        for (size_t j = 0; j < t.numel; j++)
            m.params[t.offset + j] = (float)(1.0 + 0.1 * rl_rng_normal(&rng));
    }
    int32_t *tokens = malloc(2 * N * sizeof(int32_t)), *targets = tokens + N;
    float *logits = malloc(N * (size_t)V * sizeof(float));
    if (!tokens || !logits) {
        free(tokens), free(logits), rl_model_destroy(&m);
        return rl_errf(e, RL_ENOMEM, "cannot allocate the batch");
    }
    for (size_t i = 0; i < 2 * N; i++) tokens[i] = (int32_t)(rl_rng_u64(&rng) % (uint64_t)V);

    float loss = 0;
    rc = rl_model_forward(&m, tokens, targets, B, T, &loss, e);
    if (!rc) {
        /* The backward reuses the logits buffer for their gradient. */
        memcpy(logits, rl_model_logits(&m), N * (size_t)V * sizeof(float));
        rl_model_zero_grad(&m);
        rl_model_backward(&m, 1.0f, false, NULL, NULL);
    }

    size_t P = m.lay.total;
    if (!rc) rc = rl_mkdirs(a->out, 0755, e);
    if (!rc) rc = write_json(a->out, "config.json", config_json(&c), e);
    if (!rc) rc = write_json(a->out, "tensors.json", tensors_json(&c), e);
    if (!rc) rc = write_json(a->out, "meta.json", meta_json(B, T, loss, a->seed), e);
    if (!rc) rc = write_raw(a->out, "params.f32", m.params, P * sizeof(float), e);
    if (!rc) rc = write_raw(a->out, "grads.f32", m.grads, P * sizeof(float), e);
    if (!rc) rc = write_raw(a->out, "tokens.i32", tokens, N * sizeof(int32_t), e);
    if (!rc) rc = write_raw(a->out, "targets.i32", targets, N * sizeof(int32_t), e);
    if (!rc) rc = write_raw(a->out, "logits.f32", logits, N * (size_t)V * sizeof(float), e);
    free(tokens);
    free(logits);
    rl_model_destroy(&m);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    rl_err e = {0};
    rc = run(&a, &e);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", e.msg);
        return rl_err_exit_status(rc);
    }
    return 0;
}
