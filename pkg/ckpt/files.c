/* The JSON files of a checkpoint (config.json, trainer_state.json,
 * manifest.json), the "checkpoint" config section, step names, hashing. */
#include <cjson/cJSON.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "data/data.h"

/* ---- config section ------------------------------------------------------------------- */
static int s3_check(const void *obj, const char *where, rl_err *e) {
    const rl_ckpt_s3_config *k = obj;
    /* S3 refuses parts under 5 MiB (all but the last) */
    if (k->part_mb > 0 && k->part_mb < 5)
        return rl_errf(e, RL_EINPUT, "%s.part_mb: %lld is below S3's 5 MiB minimum part size (0: default)", where,
                       k->part_mb);
    return RL_OK;
}

static const char *const addressing[] = {"", "path", "virtual", NULL};
#define F(f, ...) RL_CFG_FIELD(rl_ckpt_s3_config, f, __VA_ARGS__)
static const rl_cfg_field s3_fields[] = {
    F(endpoint, .flags = RL_CFG_URL,
      .doc = "https://host:port of an S3-compatible server; \"\": AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or AWS."),
    F(region, .doc = "\"\": AWS_REGION, else us-east-1."),
    F(addressing, .choices = addressing, .doc = "path, virtual, or \"\" (virtual on AWS, path elsewhere)."),
    F(part_mb, .min = 0, .max = 5120, .doc = "Multipart part size in MiB: 0 (default, 16) or at least 5."),
    F(parallel, .min = 0, .max = 64, .doc = "Parts in flight; 0: the default."),
    F(allow_http, .doc = "Send session or web-identity tokens to an http:// endpoint off this machine."),
};
#undef F
static const rl_cfg_section s3_section = RL_CFG_SECTION(
    s3_fields, .doc = "Per-config S3 settings; spec.s3 sets the pods' environment instead.", .check = s3_check);

static int ckpt_check(const void *obj, const char *where, rl_err *e) {
    const rl_ckpt_config *c = obj;
    char w[300];
    snprintf(w, sizeof w, "%s.uri", where);
    rl_ckpt_uri u;
    return c->uri[0] ? rl_ckpt_uri_parse(c->uri, w, &u, e) : RL_OK;
}

static const char *const when_busy[] = {"wait", "skip", NULL};
#define F(f, ...) RL_CFG_FIELD(rl_ckpt_config, f, __VA_ARGS__)
static const rl_cfg_field ckpt_fields[] = {
    F(uri, .doc = "s3://bucket/prefix, file:///absolute/path or a plain path; \"\" disables."),
    F(every_steps, .min = 0, .max = 1ll << 40, .doc = "Save every this many steps; 0: no step cadence."),
    F(every_minutes, .min = 0, .max = 1e6, .doc = "Save when this many minutes passed; 0: no time cadence."),
    F(keep, .min = 1, .max = 1 << 20, .def = 3, .doc = "Committed checkpoints kept."),
    F(when_busy, .choices = when_busy, .def_str = "wait", .doc = "A save due while one runs: wait for it, or skip."),
    F(resume, .def = 1, .doc = "Start from the newest good checkpoint."),
    /* below Kubernetes' default terminationGracePeriodSeconds of 30 */
    F(preempt_budget_s, .min = 0.1, .max = 86400, .def = 20,
      .doc = "SIGTERM to a committed checkpoint within this; must fit in terminationGracePeriodSeconds."),
    F(s3, .sub = &s3_section),
};
#undef F
const rl_cfg_section rl_ckpt_config_section = RL_CFG_SECTION(ckpt_fields, .check = ckpt_check);

void rl_ckpt_config_default(rl_ckpt_config *c) { rl_cfg_defaults(&rl_ckpt_config_section, c); }

static int s3_uri_parse(const char *uri, const char *where, rl_ckpt_uri *out, rl_err *e) {
    char esc[160];
    const char *b = uri + 5, *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    bool ok = blen >= 3 && blen <= 63;
    for (size_t i = 0; ok && i < blen; i++) {
        char ch = b[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        ok = alnum || ((ch == '.' || ch == '-') && i > 0 && i + 1 < blen);
    }
    if (!ok)
        return rl_errf(e, RL_EINPUT,
                       "%s: %s: the bucket name must be 3-63 characters of a-z, 0-9, '.' and '-', "
                       "starting and ending with a letter or digit",
                       where, rl_json_escape(esc, sizeof esc, uri));
    const char *p = slash ? slash + 1 : "";
    size_t plen = strlen(p);
    while (plen > 0 && p[plen - 1] == '/') plen--;
    if (p[0] == '/' || strstr(p, "//"))
        return rl_errf(e, RL_EINPUT, "%s: %s: empty path segment in the prefix", where,
                       rl_json_escape(esc, sizeof esc, uri));
    if (plen > 512) return rl_errf(e, RL_EINPUT, "%s: the prefix is longer than 512 bytes", where);
    out->s3 = true;
    snprintf(out->bucket, sizeof out->bucket, "%.*s", (int)blen, b);
    snprintf(out->prefix, sizeof out->prefix, "%.*s%s", (int)plen, p, plen ? "/" : "");
    return RL_OK;
}

int rl_ckpt_uri_parse(const char *uri, const char *where, rl_ckpt_uri *out, rl_err *e) {
    char esc[160];
    memset(out, 0, sizeof *out);
    if (!uri || !uri[0]) return rl_errf(e, RL_EINPUT, "%s: empty", where);
    if (strlen(uri) >= sizeof out->path)
        return rl_errf(e, RL_EINPUT, "%s: longer than %zu bytes", where, sizeof out->path - 1);
    if (!strncmp(uri, "s3://", 5)) return s3_uri_parse(uri, where, out, e);
    const char *path = uri;
    if (!strncmp(uri, "file://", 7)) {
        if (uri[7] != '/')
            return rl_errf(e, RL_EINPUT, "%s: %s: file:// URIs need an absolute path (file:///dir)", where,
                           rl_json_escape(esc, sizeof esc, uri));
        path = uri + 7;
    } else if (strstr(uri, "://")) {
        return rl_errf(e, RL_EINPUT, "%s: %s: unknown scheme: use s3://bucket/prefix, file:///absolute/path or "
                       "a plain path", where, rl_json_escape(esc, sizeof esc, uri));
    }
    snprintf(out->path, sizeof out->path, "%s", path);
    return RL_OK;
}

/* ---- names, hashes ---------------------------------------------------------------------- */
void rl_ckpt_step_name(char *dst, size_t n, long long step) { snprintf(dst, n, "step-%08lld", step); }

long long rl_ckpt_parse_step_name(const char *s, size_t len) {
    if (len < 13 || len > 23 || strncmp(s, "step-", 5) != 0) return -1;
    long long v = 0;
    for (size_t i = 5; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

void rl_ckpt_sha256_hex(const rl_ckpt_part *parts, int nparts, char out[65]) {
    unsigned char md[32];
    unsigned int mdl = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (int i = 0; i < nparts; i++) EVP_DigestUpdate(ctx, parts[i].data, parts[i].len);
    EVP_DigestFinal_ex(ctx, md, &mdl);
    EVP_MD_CTX_free(ctx);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* ---- config.json (Hugging Face LlamaConfig) ---------------------------------------------- */
char *rl_ckpt_hf_config_json(const rl_model_config *c, const rl_ckpt_tokenizer *tok) {
    cJSON *r = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(r, "model_type", "llama");
    cJSON_AddNumberToObject(r, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(r, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(r, "head_dim", rl_model_head_dim(c));
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
    cJSON_AddNullToObject(r, "rope_scaling");
    cJSON_AddNumberToObject(r, "initializer_range", c->initializer_range);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddBoolToObject(r, "attention_bias", 0);
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(r, "mlp_bias", 0);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", 0);
    cJSON_AddStringToObject(r, "torch_dtype", "float32");
    cJSON_AddBoolToObject(r, "use_cache", 1);
    /* The byte tokenizer has no BOS; its end-of-text token ends documents.
     * A vocabulary without that id (custom corpora) gets null. */
    int64_t bos = tok ? tok->bos_id : -1, eos = tok ? tok->eos_id : c->vocab_size > RL_TOK_EOT ? RL_TOK_EOT : -1;
    if (bos >= 0) cJSON_AddNumberToObject(r, "bos_token_id", (double)bos);
    else cJSON_AddNullToObject(r, "bos_token_id");
    if (eos >= 0) cJSON_AddNumberToObject(r, "eos_token_id", (double)eos);
    else cJSON_AddNullToObject(r, "eos_token_id");
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

/* ---- the tokenizer's companions (transformers' PreTrainedTokenizerFast) ------------------- */
static void add_token(cJSON *r, const char *k, const char *text) {
    if (text) cJSON_AddStringToObject(r, k, text);
    else cJSON_AddNullToObject(r, k);
}

char *rl_ckpt_tokenizer_config_json(const rl_ckpt_tokenizer *tok, int max_len) {
    cJSON *r = cJSON_CreateObject();
    /* tokenizer.json holds the whole tokenizer; this class reads it as it is */
    cJSON_AddStringToObject(r, "tokenizer_class", "PreTrainedTokenizerFast");
    add_token(r, "bos_token", tok->bos);
    add_token(r, "eos_token", tok->eos);
    cJSON_AddNumberToObject(r, "model_max_length", max_len);
    cJSON_AddBoolToObject(r, "clean_up_tokenization_spaces", 0);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

char *rl_ckpt_special_tokens_json(const rl_ckpt_tokenizer *tok) {
    cJSON *r = cJSON_CreateObject();
    if (tok->bos) cJSON_AddStringToObject(r, "bos_token", tok->bos);
    if (tok->eos) cJSON_AddStringToObject(r, "eos_token", tok->eos);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

int rl_ckpt_hf_config_check(const char *text, size_t len, const char *name,
                            const rl_model_config *want, rl_err *e) {
    cJSON *r = cJSON_ParseWithLength(text, len);
    if (!r || !cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return rl_errf(e, RL_EINPUT, "%s: not a JSON object", name);
    }
    const struct {
        const char *k;
        double v;
    } f[] = {
        {"hidden_size", want->hidden_size},
        {"intermediate_size", want->intermediate_size},
        {"num_hidden_layers", want->num_hidden_layers},
        {"num_attention_heads", want->num_attention_heads},
        {"num_key_value_heads", want->num_key_value_heads},
        {"vocab_size", want->vocab_size},
        {"max_position_embeddings", want->max_position_embeddings},
        {"rms_norm_eps", want->rms_norm_eps},
        {"rope_theta", want->rope_theta},
    };
    int rc = RL_OK;
    for (size_t i = 0; i < sizeof f / sizeof f[0] && !rc; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(r, f[i].k);
        if (!cJSON_IsNumber(j))
            rc = rl_errf(e, RL_EINPUT, "%s: %s missing or not a number", name, f[i].k);
        else if (j->valuedouble != f[i].v)
            rc = rl_errf(e, RL_EINPUT,
                         "%s: model.%s is %.17g in the checkpoint but %.17g in the job config "
                         "(a checkpoint resumes only the model it was written for)",
                         name, f[i].k, j->valuedouble, f[i].v);
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(r, "tie_word_embeddings");
    if (!rc && cJSON_IsTrue(tie))
        rc = rl_errf(e, RL_EINPUT, "%s: tie_word_embeddings is true; this trainer has an untied lm_head", name);
    cJSON_Delete(r);
    return rc;
}

/* ---- trainer_state.json ------------------------------------------------------------------- */
/* 64-bit values as decimal strings: JSON numbers lose them above 2^53. */
static void add_u64(cJSON *o, const char *k, uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    cJSON_AddStringToObject(o, k, b);
}

char *rl_ckpt_state_json(const rl_ckpt_state *s, const char *config_json) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "format", "ringleader-trainer-state");
    cJSON_AddNumberToObject(r, "version", RL_CKPT_FORMAT_VERSION);
    cJSON_AddNumberToObject(r, "step", (double)s->step);
    add_u64(r, "tokens_seen", s->tokens_seen);
    cJSON *d = cJSON_AddObjectToObject(r, "data");
    add_u64(d, "sample_index", s->sample_index);
    add_u64(d, "global_batch", s->global_batch);
    add_u64(d, "seed", s->data_seed);
    cJSON *g = cJSON_AddObjectToObject(r, "rng");
    cJSON_AddStringToObject(g, "algorithm", "xoshiro256**");
    cJSON *st = cJSON_AddArrayToObject(g, "state");
    for (int i = 0; i < 4; i++) {
        char b[24];
        snprintf(b, sizeof b, "%llu", (unsigned long long)s->rng[i]);
        cJSON_AddItemToArray(st, cJSON_CreateString(b));
    }
    cJSON *sc = cJSON_AddObjectToObject(r, "schedule");
    cJSON_AddStringToObject(sc, "kind", "linear_warmup_cosine");
    cJSON_AddNumberToObject(sc, "last_lr", s->lr);
    cJSON_AddNumberToObject(sc, "next_lr", s->next_lr);
    cJSON_AddNumberToObject(r, "world_size", s->world_size);
    cJSON_AddNumberToObject(r, "saved_unix", s->saved_unix);
    cJSON *cfg = config_json ? cJSON_Parse(config_json) : NULL;
    if (cfg) cJSON_AddItemToObject(r, "config", cfg);
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

static bool dec_u64(const cJSON *j, uint64_t *v) {
    char *end = NULL;
    if (!cJSON_IsString(j) || !j->valuestring[0] || j->valuestring[0] < '0' || j->valuestring[0] > '9' ||
        strlen(j->valuestring) > 20)
        return false;
    unsigned long long x = strtoull(j->valuestring, &end, 10);
    if (*end) return false;
    *v = x;
    return true;
}

static int get_u64s(const cJSON *o, const char *k, const char *name, uint64_t *v, rl_err *e) {
    if (!dec_u64(cJSON_GetObjectItemCaseSensitive(o, k), v))
        return rl_errf(e, RL_EINPUT, "%s: %s must be a decimal string", name, k);
    return RL_OK;
}

/* The header both ringleader JSON files carry: a format name and version. */
static int check_format(const cJSON *r, const char *format, const char *name, rl_err *e) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(r, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(r, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, format) != 0)
        return rl_errf(e, RL_EINPUT, "%s: format is not \"%s\"", name, format);
    if (!cJSON_IsNumber(ver) || ver->valuedouble != RL_CKPT_FORMAT_VERSION)
        return rl_errf(e, RL_EINPUT, "%s: unsupported version (this build reads %d)", name, RL_CKPT_FORMAT_VERSION);
    return RL_OK;
}

int rl_ckpt_state_parse(const char *text, size_t len, const char *name, rl_ckpt_state *s,
                        rl_err *e) {
    memset(s, 0, sizeof *s);
    cJSON *r = cJSON_ParseWithLength(text, len);
    int rc = RL_OK;
    if (!r || !cJSON_IsObject(r)) {
        rc = rl_errf(e, RL_EINPUT, "%s: not a JSON object", name);
        goto out;
    }
    if ((rc = check_format(r, "ringleader-trainer-state", name, e))) goto out;
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(r, "step");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(r, "world_size");
    if (!cJSON_IsNumber(step) || !(step->valuedouble >= 0) || step->valuedouble > 1e15 ||
        step->valuedouble != floor(step->valuedouble)) {
        rc = rl_errf(e, RL_EINPUT, "%s: step must be a non-negative integer", name);
        goto out;
    }
    s->step = (long long)step->valuedouble;
    if (!cJSON_IsNumber(ws) || !(ws->valuedouble >= 1) || ws->valuedouble > 1 << 24) {
        rc = rl_errf(e, RL_EINPUT, "%s: world_size must be a positive integer", name);
        goto out;
    }
    s->world_size = (int)ws->valuedouble;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(r, "data");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "rng");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(r, "schedule");
    if (!cJSON_IsObject(d) || !cJSON_IsObject(g) || !cJSON_IsObject(sc)) {
        rc = rl_errf(e, RL_EINPUT, "%s: data, rng and schedule must be objects", name);
        goto out;
    }
    if ((rc = get_u64s(r, "tokens_seen", name, &s->tokens_seen, e)) ||
        (rc = get_u64s(d, "sample_index", name, &s->sample_index, e)) ||
        (rc = get_u64s(d, "global_batch", name, &s->global_batch, e)) ||
        (rc = get_u64s(d, "seed", name, &s->data_seed, e)))
        goto out;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(g, "state");
    if (!cJSON_IsArray(st) || cJSON_GetArraySize(st) != 4) {
        rc = rl_errf(e, RL_EINPUT, "%s: rng.state must be 4 decimal strings", name);
        goto out;
    }
    int i = 0;
    for (const cJSON *x = st->child; x; x = x->next, i++)
        if (!dec_u64(x, &s->rng[i])) {
            rc = rl_errf(e, RL_EINPUT, "%s: rng.state[%d] must be a decimal string", name, i);
            goto out;
        }
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(sc, "last_lr");
    const cJSON *nlr = cJSON_GetObjectItemCaseSensitive(sc, "next_lr");
    if (!cJSON_IsNumber(lr) || !cJSON_IsNumber(nlr)) {
        rc = rl_errf(e, RL_EINPUT, "%s: schedule.last_lr and next_lr must be numbers", name);
        goto out;
    }
    s->lr = lr->valuedouble, s->next_lr = nlr->valuedouble;
    const cJSON *su = cJSON_GetObjectItemCaseSensitive(r, "saved_unix");
    if (cJSON_IsNumber(su)) s->saved_unix = su->valuedouble;
out:
    cJSON_Delete(r);
    return rc;
}

/* ---- manifest.json --------------------------------------------------------------------------- */
static int manifest_slot(rl_ckpt_manifest *m, rl_err *e) {
    if (m->nfiles >= RL_CKPT_MAX_FILES)
        return rl_errf(e, RL_EINTERNAL, "checkpoint manifest: more than %d files", RL_CKPT_MAX_FILES);
    if (m->nfiles == m->cap) {
        int cap = m->cap ? 2 * m->cap : 8;
        rl_ckpt_manifest_file *f = realloc(m->files, (size_t)cap * sizeof *f);
        if (!f) return rl_errf(e, RL_ENOMEM, "checkpoint manifest: out of memory");
        m->files = f, m->cap = cap;
    }
    return RL_OK;
}

int rl_ckpt_manifest_add(rl_ckpt_manifest *m, const char *name, const rl_ckpt_part *parts, int nparts,
                         rl_err *e) {
    rl_ckpt_manifest_file f = {0};
    snprintf(f.name, sizeof f.name, "%s", name);
    for (int k = 0; k < nparts; k++) f.size += parts[k].len;
    rl_ckpt_sha256_hex(parts, nparts, f.sha256);
    return rl_ckpt_manifest_put(m, &f, e);
}

int rl_ckpt_manifest_put(rl_ckpt_manifest *m, const rl_ckpt_manifest_file *f, rl_err *e) {
    int rc = manifest_slot(m, e);
    if (!rc) m->files[m->nfiles++] = *f;
    return rc;
}

void rl_ckpt_manifest_free(rl_ckpt_manifest *m) {
    free(m->files);
    m->files = NULL, m->nfiles = m->cap = 0;
}

char *rl_ckpt_manifest_json(const rl_ckpt_manifest *m) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "format", "ringleader-checkpoint");
    cJSON_AddNumberToObject(r, "version", m->version);
    cJSON_AddNumberToObject(r, "step", (double)m->step);
    if (m->nonce[0]) cJSON_AddStringToObject(r, "nonce", m->nonce);
    cJSON *fs = cJSON_AddArrayToObject(r, "files");
    for (int i = 0; i < m->nfiles; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", m->files[i].name);
        cJSON_AddNumberToObject(f, "size", (double)m->files[i].size);
        cJSON_AddStringToObject(f, "sha256", m->files[i].sha256);
        cJSON_AddItemToArray(fs, f);
    }
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

static bool hex_of(const cJSON *j, size_t digits) {
    bool ok = cJSON_IsString(j) && strlen(j->valuestring) == digits;
    for (const char *c = ok ? j->valuestring : ""; *c; c++) ok &= (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f');
    return ok;
}

static bool plain_name(const char *s, size_t max) {
    bool ok = s[0] && strlen(s) < max && strcmp(s, ".") && strcmp(s, "..") && strcmp(s, "manifest.json");
    for (const char *c = s; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
             *c == '_' || *c == '-';
    return ok;
}

static int file_entry(const cJSON *f, int i, const char *name, rl_ckpt_manifest_file *out, rl_err *e) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(f, "size");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(f, "sha256");
    if (!cJSON_IsString(fn) || !plain_name(fn->valuestring, sizeof out->name))
        return rl_errf(e, RL_EINPUT, "%s: files[%d].name must be a plain file name", name, i);
    if (!cJSON_IsNumber(sz) || !(sz->valuedouble >= 0) || sz->valuedouble > 9007199254740992.0 ||
        sz->valuedouble != floor(sz->valuedouble))
        return rl_errf(e, RL_EINPUT, "%s: %s: size must be a non-negative integer", name, fn->valuestring);
    if (!hex_of(h, 64))
        return rl_errf(e, RL_EINPUT, "%s: %s: sha256 must be 64 lowercase hex digits", name, fn->valuestring);
    snprintf(out->name, sizeof out->name, "%s", fn->valuestring);
    out->size = (uint64_t)sz->valuedouble;
    memcpy(out->sha256, h->valuestring, 65);
    return RL_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const rl_ckpt_manifest_file *)a)->name, ((const rl_ckpt_manifest_file *)b)->name);
}

/* each name once: sorted copies, neighbours compared (a listing of
 * thousands of shards stays linearithmic) */
static int check_unique(const rl_ckpt_manifest *m, const char *name, rl_err *e) {
    rl_ckpt_manifest_file *s = malloc((size_t)m->nfiles * sizeof *s);
    if (!s) return rl_errf(e, RL_ENOMEM, "%s: out of memory", name);
    memcpy(s, m->files, (size_t)m->nfiles * sizeof *s);
    qsort(s, (size_t)m->nfiles, sizeof *s, by_name);
    int rc = RL_OK;
    for (int i = 1; i < m->nfiles && !rc; i++)
        if (!strcmp(s[i].name, s[i - 1].name)) rc = rl_errf(e, RL_EINPUT, "%s: file %s listed twice", name, s[i].name);
    free(s);
    return rc;
}

int rl_ckpt_manifest_parse(const char *text, size_t len, const char *name, rl_ckpt_manifest *m,
                           rl_err *e) {
    memset(m, 0, sizeof *m);
    cJSON *r = cJSON_ParseWithLength(text, len);
    int rc = RL_OK;
    if (!r || !cJSON_IsObject(r)) {
        rc = rl_errf(e, RL_EINPUT, "%s: not a JSON object", name);
        goto out;
    }
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(r, "step");
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(r, "files");
    const cJSON *nonce = cJSON_GetObjectItemCaseSensitive(r, "nonce");
    if ((rc = check_format(r, "ringleader-checkpoint", name, e))) goto out;
    m->version = RL_CKPT_FORMAT_VERSION;
    if (!cJSON_IsNumber(step) || !(step->valuedouble >= 0) || step->valuedouble > 1e15 ||
        step->valuedouble != floor(step->valuedouble)) {
        rc = rl_errf(e, RL_EINPUT, "%s: step must be a non-negative integer", name);
        goto out;
    }
    m->step = (long long)step->valuedouble;
    if (nonce && !hex_of(nonce, 16)) {
        rc = rl_errf(e, RL_EINPUT, "%s: nonce must be 16 lowercase hex digits", name);
        goto out;
    }
    if (nonce) memcpy(m->nonce, nonce->valuestring, 17);
    int nf = cJSON_GetArraySize(fs);
    if (!cJSON_IsArray(fs) || nf < 1 || nf > RL_CKPT_MAX_FILES) {
        rc = rl_errf(e, RL_EINPUT, "%s: files must be an array of 1..%d entries", name, RL_CKPT_MAX_FILES);
        goto out;
    }
    for (const cJSON *f = fs->child; f && !rc; f = f->next)
        if (!(rc = manifest_slot(m, e)) && !(rc = file_entry(f, m->nfiles, name, &m->files[m->nfiles], e)))
            m->nfiles++;
    if (!rc) rc = check_unique(m, name, e);
out:
    cJSON_Delete(r);
    return rc;
}
