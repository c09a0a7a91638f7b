/* Model configuration, parameter layout and the fp32 model object. */
#include "model.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define F(f, ...) RL_CFG_FIELD(rl_model_config, f, __VA_ARGS__)
/* Sized for the embedded arithmetic run: learns two-digit sums in a few
 * minutes on two cores. */
static const rl_cfg_field model_fields[] = {
    F(hidden_size, .min = 1, .max = 1 << 16, .def = 128, .doc = "Width of the residual stream."),
    F(intermediate_size, .min = 1, .max = 1 << 18, .def = 352, .doc = "Width of the SwiGLU MLP."),
    F(num_hidden_layers, .min = 1, .max = 1024, .def = 4, .doc = "Transformer blocks."),
    F(num_attention_heads, .min = 1, .max = 1024, .def = 4, .doc = "Query heads; must divide hidden_size."),
    F(num_key_value_heads, .min = 1, .max = 1024, .def = 2,
      .doc = "Key/value heads (grouped-query attention); must divide num_attention_heads."),
    F(vocab_size, .min = 1, .max = 1 << 20, .def = 257, .doc = "Token ids the data may hold."),
    F(max_position_embeddings, .min = 1, .max = 1 << 20, .def = 64, .doc = "Longest sequence (train.seq_len)."),
    F(rms_norm_eps, .min = 1e-12, .max = 1, .def = 1e-5),
    F(rope_theta, .min = 1, .max = 1e12, .def = 10000),
    F(initializer_range, .min = 0, .max = 10, .def = 0.02, .doc = "Std of the normal initialisation."),
};
#undef F

static int model_check(const void *c, const char *where, rl_err *e) { return rl_model_config_validate(c, where, e); }

const rl_cfg_section rl_model_config_section =
    RL_CFG_SECTION(model_fields, .doc = "Hugging Face LlamaConfig names.", .check = model_check);

void rl_model_config_default(rl_model_config *c) { rl_cfg_defaults(&rl_model_config_section, c); }

int rl_model_config_validate(const rl_model_config *c, const char *where, rl_err *e) {
    if (c->hidden_size % c->num_attention_heads != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s.num_attention_heads: %d does not divide hidden_size %d", where,
                       c->num_attention_heads, c->hidden_size);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s.num_key_value_heads: %d does not divide num_attention_heads %d", where,
                       c->num_key_value_heads, c->num_attention_heads);
    if (rl_model_head_dim(c) % 2 != 0)
        return rl_errf(e, RL_EINPUT,
                       "%s.num_attention_heads: head dim %d (hidden_size / heads) must be even for RoPE",
                       where, rl_model_head_dim(c));
    return RL_OK;
}

int rl_model_config_from_json(const cJSON *obj, const char *where, rl_model_config *c, rl_err *e) {
    return rl_cfg_read(obj, where, &rl_model_config_section, c, e);
}

void rl_param_layout_init(rl_param_layout *p, const rl_model_config *c) {
    size_t D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    size_t V = (size_t)c->vocab_size, hd = (size_t)rl_model_head_dim(c);
    size_t qd = (size_t)c->num_attention_heads * hd, kvd = (size_t)c->num_key_value_heads * hd;
    rl_layer_offsets *o = &p->in_layer;
    size_t off = 0;
    o->ln1 = off, off += D;
    o->wq = off, off += qd * D;
    o->wk = off, off += kvd * D;
    o->wv = off, off += kvd * D;
    o->wo = off, off += D * qd;
    o->ln2 = off, off += D;
    o->wgate = off, off += F * D;
    o->wup = off, off += F * D;
    o->wdown = off, off += D * F;
    p->layer_size = off;
    p->embed = 0;
    p->layers = V * D;
    p->final_norm = p->layers + (size_t)c->num_hidden_layers * p->layer_size;
    p->lm_head = p->final_norm + D;
    p->total = p->lm_head + V * D;
}

int rl_model_n_tensors(const rl_model_config *c) { return 3 + 9 * c->num_hidden_layers; }

void rl_model_tensor(const rl_model_config *c, int i, rl_tensor_info *t) {
    rl_param_layout p;
    rl_param_layout_init(&p, c);
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t hd = rl_model_head_dim(c), qd = c->num_attention_heads * hd,
            kvd = c->num_key_value_heads * hd;
    memset(t, 0, sizeof *t);
    int last = rl_model_n_tensors(c) - 1;
    if (i == 0 || i == last) {
        snprintf(t->name, sizeof t->name, i == 0 ? "model.embed_tokens.weight" : "lm_head.weight");
        t->offset = i == 0 ? p.embed : p.lm_head;
        t->ndim = 2, t->shape[0] = V, t->shape[1] = D, t->decay = 1;
    } else if (i == last - 1) {
        snprintf(t->name, sizeof t->name, "model.norm.weight");
        t->offset = p.final_norm;
        t->ndim = 1, t->shape[0] = D;
    } else {
        int l = (i - 1) / 9, k = (i - 1) % 9;
        static const char *const names[9] = {
            "input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        const rl_layer_offsets *o = &p.in_layer;
        size_t rel[9] = {o->ln1, o->wq, o->wk, o->wv, o->wo, o->ln2, o->wgate, o->wup, o->wdown};
        int64_t shapes[9][2] = {{D, 0}, {qd, D}, {kvd, D}, {kvd, D}, {D, qd},
                                {D, 0}, {F, D},  {F, D},   {D, F}};
        snprintf(t->name, sizeof t->name, "model.layers.%d.%s.weight", l, names[k]);
        t->offset = p.layers + (size_t)l * p.layer_size + rel[k];
        t->shape[0] = shapes[k][0], t->shape[1] = shapes[k][1];
        t->ndim = shapes[k][1] ? 2 : 1;
        t->decay = t->ndim == 2;
    }
    t->numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
}

void rl_model_init_params(const rl_model_config *c, float *params, uint64_t seed) {
    rl_rng rng;
    rl_rng_seed(&rng, seed);
    int n = rl_model_n_tensors(c);
    for (int i = 0; i < n; i++) {
        rl_tensor_info t;
        rl_model_tensor(c, i, &t);
        float *w = params + t.offset;
        for (size_t j = 0; j < t.numel; j++)
            w[j] = t.ndim == 1 ? 1.0f : (float)(rl_rng_normal(&rng) * c->initializer_range);
    }
}

/* ---- activation and scratch layouts ---------------------------------------------- */
void rl_act_layout_init(rl_act_layout *a, const rl_model_config *c, int B, int T) {
    size_t L = (size_t)c->num_hidden_layers, N = (size_t)B * T, D = (size_t)c->hidden_size;
    size_t hd = (size_t)rl_model_head_dim(c);
    a->s_btd = N * D;
    a->s_bt = N;
    a->s_btkv = N * (size_t)c->num_key_value_heads * hd;
    a->s_att = (size_t)B * c->num_attention_heads * (size_t)T * T;
    a->s_btf = N * (size_t)c->intermediate_size;
    size_t off = 0;
    a->res = off, off += (L + 1) * a->s_btd;
    a->res_mid = off, off += L * a->s_btd;
    a->ln1 = off, off += L * a->s_btd;
    a->rstd1 = off, off += L * a->s_bt;
    a->q = off, off += L * a->s_btd;
    a->k = off, off += L * a->s_btkv;
    a->v = off, off += L * a->s_btkv;
    a->att = off, off += L * a->s_att;
    a->atty = off, off += L * a->s_btd;
    a->ln2 = off, off += L * a->s_btd;
    a->rstd2 = off, off += L * a->s_bt;
    a->gate = off, off += L * a->s_btf;
    a->up = off, off += L * a->s_btf;
    a->hmlp = off, off += L * a->s_btf;
    a->lnf = off, off += a->s_btd;
    a->rstdf = off, off += N;
    a->logits = off, off += N * (size_t)c->vocab_size;
    a->losses = off, off += N;
    a->total = off;
}

void rl_scratch_layout_init(rl_scratch_layout *s, const rl_model_config *c, int B, int T) {
    size_t N = (size_t)B * T, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    size_t kvd = (size_t)c->num_key_value_heads * rl_model_head_dim(c);
    size_t off = 0;
    s->dres = off, off += N * D;
    s->dtmp = off, off += N * D;
    s->dq = off, off += N * D;
    s->dk = off, off += N * kvd;
    s->dv = off, off += N * kvd;
    s->dgate = off, off += N * F;
    s->dup = off, off += N * F;
    s->dh = off, off += N * F;
    s->datt = off, off += (size_t)B * c->num_key_value_heads * T * T;
    s->total = off;
}

/* ---- the fp32 model object --------------------------------------------------------- */
static void *alloc_floats(size_t n) {
    /* 64-byte alignment: whole cache lines, and what AVX-512 loads like. */
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

const char *rl_blas_kernels(void) {
    const char *own = rl_cpu_sgemm_kernels();
    return own ? own : openblas_get_corename();
}

int rl_model_create(rl_model *m, const rl_model_config *c, int B, int T, rl_err *e) {
    memset(m, 0, sizeof *m);
    int rc = rl_model_config_validate(c, "model", e);
    if (rc) return rc;
    if (B < 1 || T < 1)
        return rl_errf(e, RL_EINPUT, "model: batch %d x sequence %d must be positive", B, T);
    if (T > c->max_position_embeddings)
        return rl_errf(e, RL_EINPUT, "seq_len %d exceeds model.max_position_embeddings %d", T,
                       c->max_position_embeddings);
    m->cfg = *c;
    openblas_set_num_threads(1); /* we thread GEMMs ourselves (cpu_impl.inc) */
    rl_param_layout_init(&m->lay, c);
    rl_act_layout al;
    rl_act_layout_init(&al, c, B, T);
    rl_scratch_layout sl;
    rl_scratch_layout_init(&sl, c, B, T);
    m->B = B, m->T = T;
    m->n_acts = al.total, m->n_scratch = sl.total;
    size_t nrope = (size_t)c->max_position_embeddings * rl_model_head_dim(c);
    m->params = alloc_floats(m->lay.total);
    m->grads = alloc_floats(m->lay.total);
    m->acts = alloc_floats(m->n_acts);
    m->scratch = alloc_floats(m->n_scratch);
    m->rope = alloc_floats(nrope);
    m->batch = malloc(sizeof(int32_t) * 2 * (size_t)B * T);
    if (!m->params || !m->grads || !m->acts || !m->scratch || !m->rope || !m->batch) {
        size_t mb = (2 * m->lay.total + m->n_acts + m->n_scratch) * sizeof(float) >> 20;
        rl_model_destroy(m);
        return rl_errf(e, RL_ENOMEM, "model: cannot allocate %zu MiB for B=%d T=%d", mb, B, T);
    }
    memset(m->grads, 0, m->lay.total * sizeof(float));
    memset(m->params, 0, m->lay.total * sizeof(float));
    rl_cpu_rope_table_f32(c, m->rope);
    return RL_OK;
}

void rl_model_destroy(rl_model *m) {
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->scratch);
    free(m->rope);
    free(m->batch);
    memset(m, 0, sizeof *m);
}

int rl_model_forward(rl_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                     float *loss, rl_err *e) {
    if (B < 1 || T < 1 || B * T > m->B * m->T || T > m->T)
        return rl_errf(e, RL_EINTERNAL, "model: forward of %dx%d exceeds capacity %dx%d", B, T,
                       m->B, m->T);
    int V = m->cfg.vocab_size;
    size_t N = (size_t)B * T;
    for (size_t i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            return rl_errf(e, RL_EINPUT, "model: token id %d at position %zu is outside [0, %d)",
                           tokens[i] < 0 || tokens[i] >= V ? tokens[i] : targets[i], i, V);
    /* Keep the batch for the backward (embedding scatter, classifier). */
    int32_t *tok = m->batch, *tgt = m->batch + (size_t)m->B * m->T;
    memcpy(tok, tokens, N * sizeof(int32_t));
    if (targets) memcpy(tgt, targets, N * sizeof(int32_t));
    m->cur_B = B, m->cur_T = T;
    double l = rl_cpu_forward_f32(&m->cfg, &m->lay, m->params, m->acts, m->rope, tok,
                                  targets ? tgt : NULL, B, T);
    m->loss = (float)l;
    m->has_targets = targets != NULL;
    if (loss) *loss = (float)l;
    return RL_OK;
}

const float *rl_model_logits(const rl_model *m) {
    rl_act_layout al;
    rl_act_layout_init(&al, &m->cfg, m->cur_B, m->cur_T);
    return m->acts + al.logits;
}

void rl_model_backward(rl_model *m, float loss_scale, bool overwrite, rl_grad_ready_fn hook, void *hook_ctx) {
    size_t cap = (size_t)m->B * m->T;
    rl_cpu_backward_f32(&m->cfg, &m->lay, m->params, m->grads, m->acts, m->scratch, m->rope,
                        m->batch, m->batch + cap, m->cur_B, m->cur_T, loss_scale, overwrite, hook,
                        hook_ctx);
}

void rl_model_zero_grad(rl_model *m) { memset(m->grads, 0, m->lay.total * sizeof(float)); }
