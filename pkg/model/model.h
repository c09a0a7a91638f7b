/* model: the Llama decoder of Hugging Face's LlamaForCausalLM.
 *
 *   tokens -> embed -> L x [ x += attn(rmsnorm(x)) ; x += mlp(rmsnorm(x)) ]
 *          -> rmsnorm -> lm_head (untied) -> cross-entropy
 *
 * attention: grouped-query (num_key_value_heads divides num_attention_heads),
 * RoPE in the rotate-half form, causal softmax; mlp: down(silu(gate) * up).
 * No biases. Weights are stored with Hugging Face's [out, in] shapes and
 * names, so a checkpoint is a straight copy of the buffer.
 *
 * All parameters live in one contiguous buffer and all gradients in another
 * with the same layout, in forward order: embed, layer 0..L-1, final norm,
 * lm_head. Backward produces gradients from the end of the buffer towards
 * the start, so "everything at or after offset o is final" is a single
 * watermark: the DDP layer cuts buckets as contiguous slices from the end
 * and launches each as the watermark passes it (rl_grad_ready_fn). */
#ifndef RL_MODEL_H
#define RL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/cfg.h"
#include "util/util.h"

struct cJSON;

typedef struct rl_model_config {
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int vocab_size;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    double initializer_range; /* std of the normal init (HF default 0.02) */
} rl_model_config;

/* The section's descriptor (util/cfg.h): fields, bounds, defaults. */
extern const rl_cfg_section rl_model_config_section;
/* A small default (the embedded arithmetic run). */
void rl_model_config_default(rl_model_config *c);
/* Read Hugging Face-named fields from a JSON object (unknown fields are an
 * error), then validate. `where` prefixes messages ("cfg.json: model"). */
int rl_model_config_from_json(const struct cJSON *obj, const char *where, rl_model_config *c,
                              rl_err *e);
int rl_model_config_validate(const rl_model_config *c, const char *where, rl_err *e);
static inline int rl_model_head_dim(const rl_model_config *c) {
    return c->hidden_size / c->num_attention_heads;
}

/* ---- parameter layout (element offsets into the one parameter buffer) ----- */
typedef struct rl_layer_offsets { /* relative to the layer's base */
    size_t ln1, wq, wk, wv, wo, ln2, wgate, wup, wdown;
} rl_layer_offsets;

typedef struct rl_param_layout {
    size_t embed;      /* [vocab, hidden] */
    size_t layers;     /* base of layer 0 */
    size_t layer_size; /* elements per layer; layer l at layers + l*layer_size */
    rl_layer_offsets in_layer;
    size_t final_norm; /* [hidden] */
    size_t lm_head;    /* [vocab, hidden] */
    size_t total;
} rl_param_layout;

void rl_param_layout_init(rl_param_layout *p, const rl_model_config *c);

/* A range of the flat layout one rank holds of sharded training state
 * (dist.shard: pkg/ddp makes them, checkpoints store them). A shared range
 * is held by every rank, which all update it identically. */
typedef struct rl_shard_range {
    size_t off, len;
    bool shared;
} rl_shard_range;

/* One named tensor, for checkpoints and tests. */
typedef struct rl_tensor_info {
    char name[80];  /* Hugging Face name */
    size_t offset;  /* elements */
    int ndim;
    int64_t shape[2];
    size_t numel;
    int decay;      /* 1: weight decay applies (matrices); 0: norms */
} rl_tensor_info;
/* Number of tensors: 2 + 9 * layers + 1. */
int rl_model_n_tensors(const rl_model_config *c);
void rl_model_tensor(const rl_model_config *c, int i, rl_tensor_info *t);

/* Normal(0, initializer_range) for matrices, ones for norms; deterministic. */
void rl_model_init_params(const rl_model_config *c, float *params, uint64_t seed);

/* Called during backward: gradients in [offset, total) are final. The
 * CPU model calls it first with offset = total (nothing is final yet:
 * backward begins and is about to write), then with falling offsets down
 * to 0 -- the first call lets a hook that scatters and clears gradients
 * between micro-steps (dist.shard gradients) wait for that before any is
 * written again. */
typedef void (*rl_grad_ready_fn)(void *ctx, size_t offset);

/* ---- the fp32 CPU model ----------------------------------------------------------
 * One allocation per kind of buffer: parameters, gradients, activations
 * (sized for B x T at creation), backward scratch. */
typedef struct rl_model {
    rl_model_config cfg;
    rl_param_layout lay;
    float *params;
    float *grads;
    float *acts;
    float *scratch;
    float *rope; /* [max_pos, head_dim/2] cos, then sin */
    size_t n_acts, n_scratch;
    int B, T;    /* activation capacity */
    int cur_B, cur_T;
    int32_t *batch;   /* last forward's tokens, then targets (2 x B*T) */
    int has_targets;
    float loss;       /* last forward's mean loss */
} rl_model;

int rl_model_create(rl_model *m, const rl_model_config *c, int B, int T, rl_err *e);
void rl_model_destroy(rl_model *m);
/* Forward over tokens[B*T] (B <= capacity, T <= capacity). With targets,
 * returns the mean cross-entropy in *loss (may be NULL otherwise). Logits
 * stay readable through rl_model_logits until the next backward. */
int rl_model_forward(rl_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                     float *loss, rl_err *e);
const float *rl_model_logits(const rl_model *m); /* [B*T, vocab] */
/* d(loss * loss_scale)/dparams into m->grads: added to them, or with
 * overwrite written over whatever the buffer holds (not read: a step's
 * first micro-batch needs no zero_grad before it). Call after a forward
 * with targets. hook may be NULL. */
void rl_model_backward(rl_model *m, float loss_scale, bool overwrite, rl_grad_ready_fn hook, void *hook_ctx);
void rl_model_zero_grad(rl_model *m);

/* The kernels the float model's GEMMs run on: "ringleader-avx512" (ours,
 * on a CPU with AVX-512), else the set OpenBLAS chose as it loaded
 * ("Haswell", ...: from the CPU, or OPENBLAS_CORETYPE). Logged at start
 * and in benchmarks, since it decides most of a CPU step's time. */
const char *rl_blas_kernels(void);

#endif
