/* Checkpoints: the safetensors reader and writer, the files of a step,
 * verification and fallback, pruning, the asynchronous saver, exact resume
 * (one process, and two processes from a one-process checkpoint), and
 * preemption by SIGTERM. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ddp/ddp.h"
#include "rdzv/rdzv.h"
#include "testutil.h"
#include "train/train.h"

/* ---- helpers ------------------------------------------------------------------------------ */
static void tmpdir(char *d, size_t n) {
    snprintf(d, n, "/tmp/rlckpt-XXXXXX");
    cr_assert(mkdtemp(d) != NULL);
}

/* A small model (two layers) so the pure ckpt tests stay fast. */
static void small_model(rl_model_config *c) {
    rl_model_config_default(c);
    c->hidden_size = 32, c->intermediate_size = 48, c->num_hidden_layers = 2;
    c->num_attention_heads = 4, c->num_key_value_heads = 2, c->vocab_size = 50;
    c->max_position_embeddings = 64;
}

typedef struct {
    rl_model_config mc;
    size_t n;
    float *p, *m, *v;
} fake_state;

static void fake_fill(fake_state *f, uint64_t seed) {
    small_model(&f->mc);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &f->mc);
    f->n = lay.total;
    f->p = malloc(f->n * sizeof(float)), f->m = malloc(f->n * sizeof(float)), f->v = malloc(f->n * sizeof(float));
    rl_rng r;
    rl_rng_seed(&r, seed);
    for (size_t i = 0; i < f->n; i++)
        f->p[i] = (float)rl_rng_normal(&r), f->m[i] = (float)rl_rng_normal(&r), f->v[i] = (float)rl_rng_uniform(&r);
}

static void fake_free(fake_state *f) { free(f->p), free(f->m), free(f->v); }

static rl_ckpt_data fake_data(const fake_state *f, long long step) {
    rl_ckpt_data d = {.model = f->mc, .n = f->n, .params = f->p, .m = f->m, .v = f->v,
                      .config_json = "{\"train\":{\"seed\":5}}"};
    d.state = (rl_ckpt_state){.step = step, .tokens_seen = (uint64_t)step * 1000, .sample_index = (uint64_t)step * 16,
                              .global_batch = 16, .data_seed = 5, .rng = {1, 2, 3, 0xffffffffffffffffull},
                              .lr = 0.5, .next_lr = 0.25, .world_size = 2};
    return d;
}

static void write_step(rl_ckpt_store *s, const fake_state *f, long long step, int keep) {
    rl_ckpt_data d = fake_data(f, step);
    rl_ckpt_write_opts o = {.keep = keep};
    rl_err e;
    cr_assert_eq(rl_ckpt_write(s, &d, &o, NULL, &e), 0, "%s", e.msg);
}

static void path_of(char *dst, size_t n, const char *root, long long step, const char *file) {
    snprintf(dst, n, "%s/step-%08lld/%s", root, step, file);
}

/* Capture this process's stderr (the JSON log) around a call. */
static int stderr_to(const char *path) {
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    dup2(fd, 2);
    close(fd);
    return saved;
}
static void stderr_back(int saved) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* ---- a store that wraps the file store: gates and injected faults ------------------------ */
typedef struct {
    rl_ckpt_store *inner;
    const char *fail_suffix;   /* puts of keys ending like this fail */
    const char *gate_suffix;   /* puts of keys ending like this wait for *gate_open */
    atomic_int *gate_counter;
    int gate_at;
} wrap_ctx;

static int w_put(void *ctx, const char *key, const rl_ckpt_part *parts, int np, rl_err *e) {
    wrap_ctx *w = ctx;
    size_t kl = strlen(key);
    if (w->fail_suffix && kl >= strlen(w->fail_suffix) && !strcmp(key + kl - strlen(w->fail_suffix), w->fail_suffix))
        return rl_errf(e, RL_EIO, "test store: injected failure writing %s", key);
    if (w->gate_suffix && kl >= strlen(w->gate_suffix) && !strcmp(key + kl - strlen(w->gate_suffix), w->gate_suffix)) {
        double t0 = rl_now();
        /* the save may go on only once the training loop has moved on: a
         * synchronous save would never get here in time */
        while (atomic_load(w->gate_counter) < w->gate_at)
            if (rl_now() - t0 > 60) return rl_errf(e, RL_ETIMEOUT, "test store: gate never opened for %s", key);
            else usleep(2000);
    }
    return rl_ckpt_put(w->inner, key, parts, np, e);
}
static int w_get(void *ctx, const char *k, uint64_t o, uint64_t l, void **out, size_t *n, rl_err *e) {
    return rl_ckpt_get(((wrap_ctx *)ctx)->inner, k, o, l, out, n, e);
}
static int w_list(void *ctx, const char *p, rl_ckpt_list *out, rl_err *e) {
    return rl_ckpt_list_keys(((wrap_ctx *)ctx)->inner, p, out, e);
}
static int w_del(void *ctx, const char *k, rl_err *e) { return rl_ckpt_del(((wrap_ctx *)ctx)->inner, k, e); }
static int w_exists(void *ctx, const char *k, bool *f, uint64_t *s, rl_err *e) {
    return rl_ckpt_exists(((wrap_ctx *)ctx)->inner, k, f, s, e);
}
static void w_close(void *ctx) {
    wrap_ctx *w = ctx;
    rl_ckpt_store_close(w->inner);
    free(w);
}
static const rl_ckpt_store_ops wrap_ops = {w_put, w_get, w_list, w_del, w_exists, w_close, NULL};

static rl_ckpt_store *wrap_store(const char *uri, wrap_ctx **ctx_out) {
    rl_err e;
    wrap_ctx *w = calloc(1, sizeof *w);
    cr_assert_eq(rl_ckpt_store_open(uri, &w->inner, &e), 0, "%s", e.msg);
    rl_ckpt_store *s = calloc(1, sizeof *s);
    s->ops = &wrap_ops, s->ctx = w;
    snprintf(s->uri, sizeof s->uri, "%s", w->inner->uri);
    *ctx_out = w;
    return s;
}

/* ---- safetensors ----------------------------------------------------------------------------- */
static char *st_file(const rl_ckpt_st_entry *t, int n, size_t *len) {
    char *hdr;
    size_t hl;
    rl_err e;
    const char *meta[] = {"format", "pt", NULL};
    cr_assert_eq(rl_ckpt_st_header(t, n, meta, &hdr, &hl, &e), 0, "%s", e.msg);
    size_t total = hl;
    for (int i = 0; i < n; i++) total += t[i].bytes;
    char *f = malloc(total);
    memcpy(f, hdr, hl);
    size_t at = hl;
    for (int i = 0; i < n; i++) memcpy(f + at, t[i].data, t[i].bytes), at += t[i].bytes;
    free(hdr);
    *len = total;
    return f;
}

/* Replace the JSON header of a file with `js` (padded), keeping no data. */
static char *with_header(const char *js, size_t data_len, size_t *len) {
    size_t jl = strlen(js);
    char *f = calloc(1, 8 + jl + data_len);
    for (int i = 0; i < 8; i++) f[i] = (char)(unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(f + 8, js, jl);
    *len = 8 + jl + data_len;
    return f;
}

#define EXPECT_ST_BAD(js, data_len, needle)                                                            \
    do {                                                                                               \
        size_t l_;                                                                                     \
        char *f_ = with_header(js, data_len, &l_);                                                     \
        rl_ckpt_st *s_ = NULL;                                                                         \
        rl_err e_ = {0};                                                                               \
        cr_expect_eq(rl_ckpt_st_parse(f_, l_, l_, 0, "x.safetensors", &s_, &e_), RL_EINPUT, "accepted %s", js); \
        cr_expect(strstr(e_.msg, needle) && strstr(e_.msg, "x.safetensors"), "'%s' lacks '%s'", e_.msg, needle); \
        cr_expect(s_ == NULL);                                                                         \
        free(f_);                                                                                      \
    } while (0)

Test(ckpt, safetensors_round_trip_and_strict_reader) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, -2, -3};
    rl_ckpt_st_entry t[2] = {
        {.name = "w", .dtype = "F32", .ndim = 2, .shape = {2, 3}, .data = a, .bytes = sizeof a},
        {.name = "b", .dtype = "F32", .ndim = 1, .shape = {3}, .data = b, .bytes = sizeof b},
    };
    size_t len;
    char *f = st_file(t, 2, &len);
    uint64_t hn;
    memcpy(&hn, f, 8);
    cr_expect_eq(hn % 8, 0, "header not padded to 8 bytes");
    rl_ckpt_st *st;
    rl_err e;
    cr_assert_eq(rl_ckpt_st_parse(f, len, len, 2, "ok.safetensors", &st, &e), 0, "%s", e.msg);
    cr_assert_eq(st->n, 2);
    const rl_ckpt_st_tensor *w = rl_ckpt_st_find(st, "w");
    cr_assert(w && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3 && !strcmp(w->dtype, "F32"));
    cr_expect_eq(memcmp(f + st->data_start + w->begin, a, sizeof a), 0);
    cr_expect_str_eq(rl_ckpt_st_meta(st, "format"), "pt");
    rl_ckpt_st_free(st);
    /* truncated by one byte: named, and said so */
    cr_expect_eq(rl_ckpt_st_parse(f, len - 1, len - 1, 0, "t.safetensors", &st, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "t.safetensors") && strstr(e.msg, "truncated"), "%s", e.msg);
    free(f);

    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, "gap");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "outside");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "\"a\"");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "twice");
    EXPECT_ST_BAD("{\"__metadata__\":{\"k\":1}}", 0, "strings");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "trailing");
    EXPECT_ST_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, "garbage");
    EXPECT_ST_BAD("[1]", 0, "'{'");
    /* an absurd header length is refused before anything is read */
    char huge[16] = {0};
    huge[5] = 0x10; /* 2^44 */
    cr_expect_eq(rl_ckpt_st_parse(huge, sizeof huge, sizeof huge, 0, "h.safetensors", &st, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "out of range"), "%s", e.msg);
}

/* A header of n entries, each `entry` with %d for its index, as a file with no data. */
static char *many_entries(const char *entry, long n, size_t *len) {
    size_t cap = (size_t)n * (strlen(entry) + 12) + 16, at = 0;
    char *js = malloc(cap);
    cr_assert(js);
    js[at++] = '{';
    for (long i = 0; i < n; i++) {
        if (i) js[at++] = ',';
        at += (size_t)snprintf(js + at, cap - at, entry, (int)i);
    }
    js[at++] = '}', js[at] = '\0';
    char *f = with_header(js, 0, len);
    free(js);
    return f;
}

static long max_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Hostile headers from a storage we do not control: 200k zero-size tensors
 * (took 129 s to refuse with a quadratic duplicate check) and 2M entries
 * (1.5 GB of parse tree and tensor table) are refused from a count of the
 * keys, before any parsing, in well under a second and with no memory to
 * speak of; a file that a model could hold still parses. */
Test(ckpt, safetensors_hostile_entry_counts_are_refused_at_once) {
    static const struct {
        const char *entry;
        long n;
    } files[] = {{"\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", 200000},
                 {"\"%d\":0", 2000000}};
    for (size_t k = 0; k < 2; k++) {
        size_t len;
        char *f = many_entries(files[k].entry, files[k].n, &len);
        long rss0 = max_rss_kb();
        double t0 = rl_now();
        rl_ckpt_st *st = NULL;
        rl_err e = {0};
        cr_expect_eq(rl_ckpt_st_parse(f, len, len, 291, "evil.safetensors", &st, &e), RL_EINPUT);
        double dt = rl_now() - t0;
        cr_expect(strstr(e.msg, "evil.safetensors: more than the 291 tensors"), "%s", e.msg);
        cr_expect_lt(dt, 1.0, "%ld entries took %.3f s to refuse", files[k].n, dt);
        cr_expect_lt(max_rss_kb() - rss0, 16 * 1024, "refusing %ld entries grew the peak RSS by %ld KiB", files[k].n,
                     max_rss_kb() - rss0);
        free(f);
    }
    /* duplicates among many are found in n log n (no cap given) */
    size_t len;
    char *f = many_entries("\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", 20000, &len);
    rl_ckpt_st *st = NULL;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_ckpt_st_parse(f, len, len, 0, "dup.safetensors", &st, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "\"t\" appears twice"), "%s", e.msg);
    cr_expect_lt(rl_now() - t0, 5.0);
    free(f);
}

/* ---- the tokenizer a step carries ------------------------------------------------------ */
Test(ckpt, a_tokenizer_goes_into_the_step_with_its_companions_and_config_names_bos_and_eos) {
    char dir[64], uri[128], p[256];
    tmpdir(dir, sizeof dir);
    snprintf(uri, sizeof uri, "file://%s/ck", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open(uri, &s, &e), 0, "%s", e.msg);
    fake_state f;
    fake_fill(&f, 1);
    static const char tj[] = "{\"model\":{\"type\":\"BPE\"}}"; /* carried byte for byte, not read */
    rl_ckpt_tokenizer tok = {.json = tj, .len = sizeof tj - 1, .bos = "<s>", .eos = "</s>", .bos_id = 1, .eos_id = 2};
    rl_ckpt_data d = fake_data(&f, 3);
    d.tok = &tok;
    cr_assert_eq(rl_ckpt_write(s, &d, &(rl_ckpt_write_opts){.keep = 1}, NULL, &e), 0, "%s", e.msg);
    path_of(p, sizeof p, uri + 7, 3, "tokenizer.json");
    cr_expect(rl_test_file_has(p, tj), "tokenizer.json is the job's file as it was");
    path_of(p, sizeof p, uri + 7, 3, "tokenizer_config.json");
    cr_expect(rl_test_file_has(p, "\"tokenizer_class\":\t\"PreTrainedTokenizerFast\""));
    cr_expect(rl_test_file_has(p, "\"bos_token\":\t\"<s>\"") && rl_test_file_has(p, "\"eos_token\":\t\"</s>\""));
    path_of(p, sizeof p, uri + 7, 3, "special_tokens_map.json");
    cr_expect(rl_test_file_has(p, "\"eos_token\":\t\"</s>\""));
    path_of(p, sizeof p, uri + 7, 3, "config.json");
    cr_expect(rl_test_file_has(p, "\"bos_token_id\":\t1") && rl_test_file_has(p, "\"eos_token_id\":\t2"));
    /* the manifest lists (and so a resume verifies) all seven */
    char *text;
    size_t len;
    rl_ckpt_manifest m;
    path_of(p, sizeof p, uri + 7, 3, "manifest.json");
    cr_assert_eq(rl_read_file(p, &text, &len, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_ckpt_manifest_parse(text, len, p, &m, &e), 0, "%s", e.msg);
    free(text);
    cr_expect_eq(m.nfiles, 7);
    rl_ckpt_manifest_free(&m);
    float *params = calloc(f.n, sizeof *params);
    rl_ckpt_loaded ld;
    cr_assert_eq(rl_ckpt_load_latest(s, &f.mc, f.n, params, NULL, NULL, &ld, &e), 0, "%s", e.msg);
    cr_expect(ld.found && ld.step == 3, "the step resumes with the extra files in its manifest");
    rl_ckpt_loaded_free(&ld);
    free(params);
    fake_free(&f);
    rl_ckpt_store_close(s);
}

Test(ckpt, a_read_only_open_creates_nothing_and_needs_the_directory) {
    char dir[64], uri[128];
    tmpdir(dir, sizeof dir);
    snprintf(uri, sizeof uri, "file://%s/absent", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open_read(uri, &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "absent"), "%s", e.msg);
    cr_expect_neq(access(uri + 7, F_OK), 0, "nothing was created");
}

/* ---- a step's files -------------------------------------------------------------------------- */
Test(ckpt, round_trip_of_every_file) {
    char dir[64], uri[128], p[256];
    tmpdir(dir, sizeof dir);
    snprintf(uri, sizeof uri, "file://%s/ck", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open(uri, &s, &e), 0, "%s", e.msg);
    fake_state f;
    fake_fill(&f, 1);
    write_step(s, &f, 7, 3);
    /* latest names it; the manifest lists four files with their sizes */
    snprintf(p, sizeof p, "%s/ck/latest", dir);
    cr_expect(rl_test_file_has(p, "step-00000007\n"));
    rl_ckpt_manifest m;
    char *text;
    size_t len;
    snprintf(p, sizeof p, "%s/ck/step-00000007/manifest.json", dir);
    cr_assert_eq(rl_read_file(p, &text, &len, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_ckpt_manifest_parse(text, len, p, &m, &e), 0, "%s", e.msg);
    free(text);
    cr_expect_eq(m.step, 7);
    cr_expect_eq(m.nfiles, 4);
    for (int i = 0; i < m.nfiles; i++) {
        struct stat sb;
        path_of(p, sizeof p, uri + 7, 7, m.files[i].name);
        cr_assert_eq(stat(p, &sb), 0, "%s missing", p);
        cr_expect_eq((uint64_t)sb.st_size, m.files[i].size, "%s size", p);
        /* the weights and optimizer state: no one outside the group reads them */
        mode_t um = umask(0);
        umask(um);
        cr_expect_eq(sb.st_mode & 07777, 0640 & ~um, "%s mode %o", p, sb.st_mode & 07777);
        cr_expect_eq(sb.st_mode & 007, 0, "%s is readable by others: %o", p, sb.st_mode & 07777);
    }
    rl_ckpt_manifest_free(&m);
    struct stat db;
    snprintf(p, sizeof p, "%s/ck/step-00000007", dir);
    cr_assert_eq(stat(p, &db), 0);
    cr_expect_eq(db.st_mode & 007, 0, "%s is open to others: %o", p, db.st_mode & 07777);
    snprintf(p, sizeof p, "%s/ck", dir);
    cr_assert_eq(stat(p, &db), 0);
    cr_expect_eq(db.st_mode & 007, 0, "%s is open to others: %o", p, db.st_mode & 07777);
    /* config.json: a LlamaConfig for this model */
    path_of(p, sizeof p, uri + 7, 7, "config.json");
    cr_assert_eq(rl_read_file(p, &text, &len, &e), 0);
    cr_expect(strstr(text, "\"LlamaForCausalLM\"") && strstr(text, "\"llama\"") &&
              strstr(text, "\"tie_word_embeddings\":\tfalse") && strstr(text, "\"torch_dtype\":\t\"float32\""), "%s", text);
    cr_expect_eq(rl_ckpt_hf_config_check(text, len, p, &f.mc, &e), 0, "%s", e.msg);
    rl_model_config other = f.mc;
    other.num_key_value_heads = 4;
    cr_expect_eq(rl_ckpt_hf_config_check(text, len, p, &other, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "num_key_value_heads") && strstr(e.msg, "config.json"), "%s", e.msg);
    free(text);
    /* model.safetensors: every HF name with its shape, the bytes of our buffer */
    path_of(p, sizeof p, uri + 7, 7, "model.safetensors");
    cr_assert_eq(rl_read_file(p, &text, &len, &e), 0);
    rl_ckpt_st *st;
    cr_assert_eq(rl_ckpt_st_parse(text, len, len, 0, p, &st, &e), 0, "%s", e.msg);
    cr_expect_eq(st->n, rl_model_n_tensors(&f.mc));
    for (int i = 0; i < rl_model_n_tensors(&f.mc); i++) {
        rl_tensor_info ti;
        rl_model_tensor(&f.mc, i, &ti);
        const rl_ckpt_st_tensor *t = rl_ckpt_st_find(st, ti.name);
        cr_assert(t, "%s missing", ti.name);
        cr_expect(t->ndim == ti.ndim && t->shape[0] == ti.shape[0], "%s shape", ti.name);
        cr_expect_eq(memcmp(text + st->data_start + t->begin, f.p + ti.offset, ti.numel * 4), 0, "%s data", ti.name);
    }
    cr_expect(rl_ckpt_st_find(st, "model.layers.1.self_attn.k_proj.weight")->shape[0] == 16);
    rl_ckpt_st_free(st);
    free(text);
    /* read back: buffers bit-identical, state equal */
    float *p2 = calloc(f.n, 4), *m2 = calloc(f.n, 4), *v2 = calloc(f.n, 4);
    rl_ckpt_loaded ld = {0};
    cr_assert_eq(rl_ckpt_read_step(s, 7, &f.mc, f.n, p2, m2, v2, &ld, &e), 0, "%s", e.msg);
    cr_expect(ld.found && ld.step == 7);
    cr_expect_eq(memcmp(p2, f.p, f.n * 4), 0);
    cr_expect_eq(memcmp(m2, f.m, f.n * 4), 0);
    cr_expect_eq(memcmp(v2, f.v, f.n * 4), 0);
    rl_ckpt_data want = fake_data(&f, 7);
    cr_expect_eq(ld.state.tokens_seen, want.state.tokens_seen);
    cr_expect_eq(ld.state.sample_index, want.state.sample_index);
    cr_expect_eq(memcmp(ld.state.rng, want.state.rng, sizeof want.state.rng), 0);
    cr_expect_eq(ld.state.world_size, 2);
    cr_expect(ld.state.lr == 0.5 && ld.state.next_lr == 0.25);
    cr_expect(ld.config_json && strstr(ld.config_json, "\"seed\":5"), "%s", ld.config_json);
    rl_ckpt_loaded_free(&ld);
    free(p2), free(m2), free(v2);
    fake_free(&f);
    rl_ckpt_store_close(s);
    rl_test_rmdir(dir);
}

/* ---- verification and fallback -------------------------------------------------------------- */
static void flip_byte(const char *path, long off) {
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp, "%s", path);
    fseek(fp, off, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, off, SEEK_SET);
    fputc(c ^ 0x10, fp);
    fclose(fp);
}

static long long load_step(rl_ckpt_store *s, const fake_state *f, rl_ckpt_loaded *ld, int *rc, rl_err *e) {
    float *buf = calloc(3 * f->n, 4);
    *rc = rl_ckpt_load_latest(s, &f->mc, f->n, buf, buf + f->n, buf + 2 * f->n, ld, e);
    free(buf);
    return ld->found ? ld->step : -1;
}

Test(ckpt, damage_falls_back_to_the_newest_good_checkpoint) {
    char dir[64], root[96], p[256], logp[128];
    tmpdir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/ck", dir);
    snprintf(logp, sizeof logp, "%s/log", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open(root, &s, &e), 0, "%s", e.msg);
    fake_state f;
    fake_fill(&f, 2);
    for (int st = 1; st <= 4; st++) write_step(s, &f, st, 10);
    rl_ckpt_loaded ld;
    int rc;
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), 4);
    rl_ckpt_loaded_free(&ld);

    /* a flipped byte in step 4's optimizer state -> step 3, logged */
    path_of(p, sizeof p, root, 4, "optimizer.safetensors");
    flip_byte(p, 5000);
    int saved = stderr_to(logp);
    long long got = load_step(s, &f, &ld, &rc, &e);
    stderr_back(saved);
    cr_expect_eq(rc, 0, "%s", e.msg);
    cr_expect_eq(got, 3);
    cr_expect(ld.n_skipped == 1 && strstr(ld.skipped[0], "step-00000004/optimizer.safetensors") &&
              strstr(ld.skipped[0], "sha256"), "%s", ld.skipped[0]);
    cr_expect(rl_test_file_has(logp, "\"event\":\"checkpoint_fallback\"") && rl_test_file_has(logp, "\"resumed_step\":3"),
              "no fallback log line");
    rl_ckpt_loaded_free(&ld);

    /* truncated model file in step 3 -> step 2 */
    path_of(p, sizeof p, root, 3, "model.safetensors");
    cr_assert_eq(truncate(p, 1000), 0);
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), 2);
    cr_expect(strstr(ld.skipped[1], "step-00000003/model.safetensors") && strstr(ld.skipped[1], "truncated"),
              "%s", ld.skipped[1]);
    rl_ckpt_loaded_free(&ld);

    /* a file missing from step 2 -> step 1 */
    path_of(p, sizeof p, root, 2, "trainer_state.json");
    cr_assert_eq(unlink(p), 0);
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), 1);
    cr_expect(strstr(ld.skipped[2], "trainer_state.json") && strstr(ld.skipped[2], "missing"), "%s", ld.skipped[2]);
    rl_ckpt_loaded_free(&ld);

    /* latest naming a step whose save never finished (no manifest) */
    rl_ckpt_part part = {"x", 1};
    cr_assert_eq(rl_ckpt_put(s, "step-00000009/model.safetensors", &part, 1, &e), 0);
    rl_ckpt_part lp = {"step-00000009\n", 14};
    cr_assert_eq(rl_ckpt_put(s, "latest", &lp, 1, &e), 0);
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), 1);
    cr_expect(strstr(ld.skipped[0], "latest names step-00000009") && strstr(ld.skipped[0], "no manifest"), "%s",
              ld.skipped[0]);
    rl_ckpt_loaded_free(&ld);

    /* a damaged manifest in the last good one: nothing usable -> an error naming it */
    path_of(p, sizeof p, root, 1, "manifest.json");
    rl_test_write(p, "{\"format\":", 10);
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), -1);
    cr_expect_eq(rc, RL_EINPUT);
    cr_expect(strstr(e.msg, "no usable checkpoint") && strstr(e.msg, "step-"), "%s", e.msg);
    fake_free(&f);
    rl_ckpt_store_close(s);
    rl_test_rmdir(dir);
}

Test(ckpt, uris_are_parsed_once_with_the_field_named) {
    rl_ckpt_uri u;
    rl_err e = {0};
    cr_assert_eq(rl_ckpt_uri_parse("s3://my-bucket/runs/a/", "x.uri", &u, &e), RL_OK, "%s", e.msg);
    cr_expect(u.s3);
    cr_expect_str_eq(u.bucket, "my-bucket");
    cr_expect_str_eq(u.prefix, "runs/a/");
    cr_assert_eq(rl_ckpt_uri_parse("s3://my-bucket", "x.uri", &u, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(u.prefix, "");
    cr_assert_eq(rl_ckpt_uri_parse("file:///var/ck", "x.uri", &u, &e), RL_OK, "%s", e.msg);
    cr_expect(!u.s3);
    cr_expect_str_eq(u.path, "/var/ck");
    cr_assert_eq(rl_ckpt_uri_parse("ck/run1", "x.uri", &u, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(u.path, "ck/run1");
    const struct {
        const char *uri, *says;
    } bad[] = {{"", "empty"},
               {"file://ck", "absolute path"},
               {"gs://b/x", "unknown scheme"},
               {"s3://AB/x", "bucket name"},
               {"s3://bucket//x", "empty path segment"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(rl_ckpt_uri_parse(bad[i].uri, "checkpoint.uri", &u, &e), RL_EINPUT, "%s", bad[i].uri);
        cr_expect(strstr(e.msg, "checkpoint.uri") && strstr(e.msg, bad[i].says) && !strchr(e.msg, '\n'),
                  "%s: %s", bad[i].uri, e.msg);
    }
}

Test(ckpt, bad_inputs_fail_with_one_line_naming_the_object) {
    char dir[64], p[256];
    tmpdir(dir, sizeof dir);
    rl_ckpt_store *s;
    rl_err e;
    /* parent missing, a file in the way, another scheme, a bad bucket name */
    snprintf(p, sizeof p, "%s/no/such/dir", dir);
    cr_expect_eq(rl_ckpt_store_open(p, &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "no/such/dir"), "%s", e.msg);
    snprintf(p, sizeof p, "%s/file", dir);
    rl_test_write(p, "x", 1);
    snprintf(p, sizeof p, "file://%s/file/ck", dir);
    cr_expect_eq(rl_ckpt_store_open(p, &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "file/ck"), "%s", e.msg);
    cr_expect_eq(rl_ckpt_store_open("s3://Bad_Bucket/x", &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "bucket name") && strstr(e.msg, "Bad_Bucket"), "%s", e.msg);
    cr_expect_eq(rl_ckpt_store_open("s3://bucket//x", &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "empty path segment"), "%s", e.msg);
    cr_expect_eq(rl_ckpt_store_open("gs://bucket/x", &s, &e), RL_EINPUT);
    cr_expect_eq(rl_ckpt_store_open("file://relative", &s, &e), RL_EINPUT);

    /* `latest` naming a step that is not there, and nothing else: error, not a fresh start */
    snprintf(p, sizeof p, "%s/ck", dir);
    cr_assert_eq(rl_ckpt_store_open(p, &s, &e), 0, "%s", e.msg);
    fake_state f;
    fake_fill(&f, 3);
    rl_ckpt_part lp = {"step-00000042\n", 14};
    cr_assert_eq(rl_ckpt_put(s, "latest", &lp, 1, &e), 0);
    rl_ckpt_loaded ld;
    int rc;
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), -1);
    cr_expect_eq(rc, RL_EINPUT);
    cr_expect(strstr(e.msg, "latest names step-00000042") && !strchr(e.msg, '\n'), "%s", e.msg);
    lp = (rl_ckpt_part){"garbage", 7};
    cr_assert_eq(rl_ckpt_put(s, "latest", &lp, 1, &e), 0);
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), -1);
    cr_expect(strstr(e.msg, "latest does not name a step"), "%s", e.msg);
    /* a checkpoint of another model: an error naming the field, no fallback */
    write_step(s, &f, 1, 3);
    write_step(s, &f, 2, 3);
    rl_model_config other = f.mc;
    other.hidden_size = 64, other.intermediate_size = 96;
    float *buf = calloc(3 * f.n, 4);
    rc = rl_ckpt_load_latest(s, &other, f.n, buf, buf + f.n, buf + 2 * f.n, &ld, &e);
    cr_expect_eq(rc, RL_EINPUT);
    cr_expect(strstr(e.msg, "hidden_size") && strstr(e.msg, "step-00000002/config.json"), "%s", e.msg);
    free(buf);
    rl_ckpt_store_close(s);

    /* the config section is strict */
    rl_job_config c;
    const char *bad[][2] = {
        {"{\"checkpoint\":{\"uri\":\"s3://b/p\"}}", "bucket name"},
        {"{\"checkpoint\":{\"s3\":{\"addressing\":\"sideways\"}}}", "s3.addressing"},
        {"{\"checkpoint\":{\"s3\":{\"part_mb\":3}}}", "s3.part_mb"},
        {"{\"checkpoint\":{\"s3\":{\"endpoint\":\"minio:9000\"}}}", "s3.endpoint"},
        {"{\"checkpoint\":{\"s3\":{\"regoin\":\"x\"}}}", "regoin"},
        {"{\"checkpoint\":{\"when_busy\":\"later\"}}", "when_busy"},
        {"{\"checkpoint\":{\"keep\":0}}", "keep"},
        {"{\"checkpoint\":{\"evry_steps\":5}}", "evry_steps"},
        {"{\"checkpoint\":{\"uri\":\"http://x/y\"}}", "uri"},
        {"{\"checkpoint\":{\"preempt_budget_s\":0}}", "preempt_budget_s"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rl_job_config_default(&c);
        cr_expect_eq(rl_job_config_parse(bad[i][0], strlen(bad[i][0]), "job.json", &c, &e), RL_EINPUT, "%s", bad[i][0]);
        cr_expect(strstr(e.msg, bad[i][1]) && strstr(e.msg, "job.json"), "%s: %s", bad[i][0], e.msg);
    }
    /* and round-trips */
    rl_job_config_default(&c);
    const char *good = "{\"checkpoint\":{\"uri\":\"file:///tmp/x\",\"every_steps\":5,\"every_minutes\":1.5,"
                       "\"keep\":2,\"when_busy\":\"skip\",\"resume\":false,\"preempt_budget_s\":12,"
                       "\"s3\":{\"endpoint\":\"http://127.0.0.1:7480\",\"region\":\"eu-west-1\",\"addressing\":\"path\","
                       "\"part_mb\":8,\"parallel\":3}}}";
    cr_assert_eq(rl_job_config_parse(good, strlen(good), "job.json", &c, &e), 0, "%s", e.msg);
    char *js = rl_job_config_to_json(&c);
    rl_job_config d;
    rl_job_config_default(&d);
    cr_assert_eq(rl_job_config_parse(js, strlen(js), "rt", &d, &e), 0, "%s", e.msg);
    cr_expect_eq(memcmp(&c.ckpt, &d.ckpt, sizeof c.ckpt), 0);
    cr_expect(d.ckpt.keep == 2 && !d.ckpt.resume && d.ckpt.every_minutes == 1.5 && !strcmp(d.ckpt.when_busy, "skip"));
    free(js);
    fake_free(&f);
    rl_test_rmdir(dir);
}

/* ---- pruning ------------------------------------------------------------------------------------ */
Test(ckpt, keep_k_prunes_only_after_a_newer_commit) {
    char dir[64], root[96];
    tmpdir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/ck", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open(root, &s, &e), 0, "%s", e.msg);
    fake_state f;
    fake_fill(&f, 4);
    write_step(s, &f, 1, 2);
    write_step(s, &f, 2, 2);
    /* an unfinished save older than the next commit: cleaned up by it */
    rl_ckpt_part part = {"x", 1};
    cr_assert_eq(rl_ckpt_put(s, "step-00000002/junk.tmp-1", &part, 1, &e), 0);
    cr_assert_eq(rl_ckpt_put(s, "step-00000000/model.safetensors", &part, 1, &e), 0);
    write_step(s, &f, 3, 2);
    long long *c, *u;
    int nc, nu;
    cr_assert_eq(rl_ckpt_steps(s, &c, &nc, &u, &nu, &e), 0);
    cr_expect(nc == 2 && c[0] == 2 && c[1] == 3, "committed: %d", nc);
    cr_expect_eq(nu, 0, "an unfinished directory survived");
    free(c), free(u);
    rl_ckpt_store_close(s);

    /* a save that fails before its manifest deletes nothing */
    wrap_ctx *w;
    s = wrap_store(root, &w);
    w->fail_suffix = "manifest.json";
    rl_ckpt_data d = fake_data(&f, 4);
    rl_ckpt_write_opts o = {.keep = 1};
    cr_expect_neq(rl_ckpt_write(s, &d, &o, NULL, &e), 0);
    cr_expect(strstr(e.msg, "manifest.json"), "%s", e.msg);
    cr_assert_eq(rl_ckpt_steps(s, &c, &nc, &u, &nu, &e), 0);
    cr_expect(nc == 2 && c[0] == 2 && c[1] == 3, "a committed checkpoint was deleted before a newer commit");
    cr_expect(nu == 1 && u[0] == 4);
    free(c), free(u);
    rl_ckpt_loaded ld;
    int rc;
    cr_expect_eq(load_step(s, &f, &ld, &rc, &e), 3, "the half-written step 4 was taken");
    rl_ckpt_loaded_free(&ld);
    /* the next good commit with keep 1 leaves only itself */
    w->fail_suffix = NULL;
    cr_assert_eq(rl_ckpt_write(s, &d, &o, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_ckpt_steps(s, &c, &nc, &u, &nu, &e), 0);
    cr_expect(nc == 1 && c[0] == 4 && nu == 0);
    free(c), free(u);
    fake_free(&f);
    rl_ckpt_store_close(s);
    rl_test_rmdir(dir);
}

/* ---- the trainer: async saves, exact resume ------------------------------------------------------- */
/* A tiny model and batch: these tests are about state, not learning, and
 * share two busy cores. */
static void tiny_model(rl_model_config *m) {
    rl_model_config_default(m);
    m->hidden_size = 32, m->intermediate_size = 64, m->num_hidden_layers = 2;
    m->num_attention_heads = 4, m->num_key_value_heads = 2, m->max_position_embeddings = 64;
}

static void job(rl_job_config *c, const char *data_dir, const char *ck, int steps) {
    omp_set_num_threads(1); /* a tiny model; spinning threads only slow a busy machine */
    rl_job_config_default(c);
    tiny_model(&c->model);
    c->train.seq_len = 32;
    c->train.micro_batch = 4;
    c->train.global_batch_tokens = 512;
    c->train.steps = steps;
    c->train.warmup_steps = 2;
    c->train.eval_every = 0;
    c->train.eval_batches = 0;
    c->train.log_every = 1;
    snprintf(c->data.train, sizeof c->data.train, "%s/train_*.bin", data_dir);
    c->data.val[0] = c->data.eval_task[0] = '\0';
    if (ck) snprintf(c->ckpt.uri, sizeof c->ckpt.uri, "%s", ck);
}

static void run_steps(rl_trainer *tr, int k, double *losses, double *t_end, atomic_int *counter) {
    rl_err e;
    for (int i = 0; i < k; i++) {
        rl_step_stats st;
        cr_assert_eq(rl_trainer_step(tr, &st, &e), 0, "%s", e.msg);
        if (losses) losses[rl_trainer_steps_done(tr) - 1] = st.loss;
        if (t_end) t_end[rl_trainer_steps_done(tr)] = rl_now();
        if (counter) atomic_store(counter, (int)rl_trainer_steps_done(tr));
        cr_assert_eq(rl_trainer_boundary(tr, &e), 0, "%s", e.msg);
    }
}

Test(ckpt, async_save_overlaps_training_steps, .timeout = 120) {
    char dir[64], ck[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(ck, sizeof ck, "file://%s/ck", dir);
    rl_job_config c;
    job(&c, dir, ck, 6);
    c.ckpt.every_steps = 2;
    rl_trainer *tr;
    rl_err e;
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    /* step 2's save may write its model file only after step 4 ended */
    atomic_int done = 0;
    wrap_ctx *w;
    rl_ckpt_store *s = wrap_store(ck, &w);
    w->gate_suffix = "00000002/model.safetensors", w->gate_counter = &done, w->gate_at = 4;
    cr_assert_eq(rl_trainer_use_store(tr, s, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_trainer_resume(tr, &e), 0, "%s", e.msg);
    double t_end[8] = {0};
    run_steps(tr, 6, NULL, t_end, &done);
    cr_assert_eq(rl_trainer_checkpoint(tr, 0, &e), 0, "%s", e.msg);
    rl_ckpt_save_info h[4];
    int n = rl_ckpt_saver_history(rl_trainer_saver(tr), h, 4);
    cr_assert_eq(n, 3, "saves: %d (want steps 2, 4 and the final 6)", n);
    cr_expect(h[0].step == 2 && h[1].step == 4 && h[2].step == 6);
    for (int i = 0; i < n; i++) cr_expect(h[i].done && h[i].rc == 0, "save %lld failed", h[i].step);
    /* the loop ran steps 3 and 4 while step 2's save was in flight */
    cr_expect(h[0].t_snap_end < t_end[3] && t_end[3] < t_end[4] && t_end[4] <= h[0].t_done,
              "steps did not overlap the save: snap end %.6f, step 3 end %.6f, save done %.6f", h[0].t_snap_end,
              t_end[3], h[0].t_done);
    /* when_busy=wait: step 4's save started only after step 2's committed */
    cr_expect(h[1].t_snap_begin >= h[0].t_done);
    double pause = h[0].t_snap_end - h[0].t_snap_begin, total = h[0].t_done - h[0].t_snap_begin;
    double pause6 = h[2].t_snap_end - h[2].t_snap_begin, total6 = h[2].t_done - h[2].t_snap_begin;
    cr_log_info("snapshot pause %.3f ms; ungated save of step 6: pause %.3f ms of %.1f ms in all (%llu bytes)",
                1e3 * pause, 1e3 * pause6, 1e3 * total6, (unsigned long long)h[2].bytes);
    cr_expect(pause < total && pause6 < total6);
    /* and what was written is what the trainer has */
    size_t np = rl_trainer_nparams(tr);
    float *buf = calloc(3 * np, 4);
    rl_ckpt_loaded ld;
    cr_assert_eq(rl_ckpt_load_latest(rl_trainer_store(tr), &rl_trainer_config(tr)->model, np, buf, buf + np,
                                     buf + 2 * np, &ld, &e), 0, "%s", e.msg);
    cr_expect_eq(ld.step, 6);
    cr_expect_eq(memcmp(buf, rl_trainer_params(tr), np * 4), 0);
    rl_ckpt_loaded_free(&ld);
    free(buf);
    rl_trainer_free(tr);
    rl_test_rmdir(dir);
}

Test(ckpt, when_busy_skip_and_background_failure, .timeout = 120) {
    char dir[64], ck[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(ck, sizeof ck, "file://%s/ck", dir);
    rl_job_config c;
    job(&c, dir, ck, 6);
    c.ckpt.every_steps = 2;
    snprintf(c.ckpt.when_busy, sizeof c.ckpt.when_busy, "skip");
    rl_trainer *tr;
    rl_err e;
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    atomic_int done = 0;
    wrap_ctx *w;
    rl_ckpt_store *s = wrap_store(ck, &w);
    w->gate_suffix = "00000002/model.safetensors", w->gate_counter = &done, w->gate_at = 5;
    cr_assert_eq(rl_trainer_use_store(tr, s, &e), 0, "%s", e.msg);
    run_steps(tr, 6, NULL, NULL, &done);
    cr_assert_eq(rl_trainer_checkpoint(tr, 0, &e), 0, "%s", e.msg);
    int started, skipped;
    rl_ckpt_saver_stats(rl_trainer_saver(tr), &started, &skipped, NULL);
    cr_expect(started == 2 && skipped == 1, "started %d, skipped %d", started, skipped);
    long long *cs;
    int nc;
    cr_assert_eq(rl_ckpt_steps(rl_trainer_store(tr), &cs, &nc, NULL, NULL, &e), 0);
    cr_expect(nc == 2 && cs[0] == 2 && cs[1] == 6);
    free(cs);
    rl_trainer_free(tr);

    /* a failing background save fails the run at the next step boundary */
    rl_test_rmdir(dir);
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(ck, sizeof ck, "file://%s/ck", dir);
    job(&c, dir, ck, 6);
    c.ckpt.every_steps = 2;
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    s = wrap_store(ck, &w);
    w->fail_suffix = "trainer_state.json";
    cr_assert_eq(rl_trainer_use_store(tr, s, &e), 0, "%s", e.msg);
    run_steps(tr, 2, NULL, NULL, NULL);
    double t0 = rl_now();
    while (rl_ckpt_saver_busy(rl_trainer_saver(tr)) && rl_now() - t0 < 60) usleep(2000);
    rl_step_stats st;
    cr_assert_eq(rl_trainer_step(tr, &st, &e), 0, "%s", e.msg);
    int rc = rl_trainer_boundary(tr, &e);
    cr_expect_neq(rc, 0, "the failed save went unnoticed");
    cr_expect(strstr(e.msg, "background checkpoint failed") && strstr(e.msg, "trainer_state.json"), "%s", e.msg);
    bool found;
    cr_assert_eq(rl_ckpt_exists(rl_trainer_store(tr), "latest", &found, NULL, &e), 0);
    cr_expect(!found, "latest written for a failed save");
    rl_trainer_free(tr);
    rl_test_rmdir(dir);
}

Test(ckpt, exact_resume_on_one_process, .timeout = 180) {
    char dir[64], ck[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(ck, sizeof ck, "%s/ck", dir); /* a plain path this time */
    rl_job_config c;
    rl_trainer *tr;
    rl_err e;
    double ref[10], got[10];
    /* uninterrupted: 10 steps */
    job(&c, dir, NULL, 10);
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    run_steps(tr, 10, ref, NULL, NULL);
    size_t n = rl_trainer_nparams(tr);
    float *pref = malloc(n * 4), *oref = malloc(2 * n * 4);
    memcpy(pref, rl_trainer_params(tr), n * 4);
    memcpy(oref, rl_trainer_opt(tr), 2 * n * 4);
    rl_trainer_free(tr);
    /* interrupted: 5 steps, a checkpoint, gone */
    job(&c, dir, ck, 10);
    c.ckpt.every_steps = 5;
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_trainer_resume(tr, &e), 0, "%s", e.msg);
    run_steps(tr, 5, got, NULL, NULL);
    cr_assert_eq(rl_ckpt_saver_wait(rl_trainer_saver(tr), 0, &e), 0, "%s", e.msg);
    rl_trainer_free(tr);
    /* a fresh process resumes from step 5 and runs to 10 */
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_trainer_resume(tr, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_trainer_steps_done(tr), 5);
    cr_expect_eq(rl_trainer_summary(tr)->resumed_from, 5);
    cr_expect_eq(rl_trainer_sample_index(tr), 5 * 16);
    run_steps(tr, 5, got, NULL, NULL);
    for (int i = 0; i < 10; i++)
        cr_expect(memcmp(&ref[i], &got[i], sizeof ref[i]) == 0, "step %d loss %.17g vs %.17g", i + 1, got[i], ref[i]);
    cr_expect_eq(memcmp(rl_trainer_params(tr), pref, n * 4), 0, "parameters differ after resume");
    cr_expect_eq(memcmp(rl_trainer_opt(tr), oref, 2 * n * 4), 0, "AdamW moments differ after resume");
    rl_trainer_free(tr);
    free(pref), free(oref);
    rl_test_rmdir(dir);
}

/* ---- through the binary: two processes from a one-process checkpoint; SIGTERM -------------------- */
Test(ckpt, two_processes_resume_a_one_process_checkpoint, .timeout = 300) {
    char dir[64], cmd[1024], err[8192], p[256];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 10, 512, NULL, ",\"every_steps\":5");
    /* the reference: one process, 10 steps (checkpoints at 5 and 10) */
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/ringleader-worker --config %s/job.json --save-params %s/p1.bin", rl_test_bindir(),
             dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    /* lose step 10 (latest still names it): resume must fall back to 5 */
    snprintf(cmd, sizeof cmd, "rm -rf %s/ck/step-00000010", dir);
    cr_assert_eq(system(cmd), 0);
    /* grouped, so rl_test_run's own redirect of stderr does not replace ours */
    snprintf(cmd, sizeof cmd, "(%s/ringleader-worker --config %s/job.json --save-params %s/p2.bin --nproc-per-node 2 2>%s/log2)",
             rl_test_bindir(), dir, dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(p, sizeof p, "%s/log2", dir);
    cr_expect(rl_test_file_has(p, "\"event\":\"resume\"") && rl_test_file_has(p, "\"found\":true,\"step\":5,") &&
              rl_test_file_has(p, "\"saved_world\":1,\"world\":2"),
              "no resume from step 5 in %s", p);
    cr_expect(rl_test_file_has(p, "latest names step-00000010"), "no fallback line");
    size_t n1, n2;
    snprintf(p, sizeof p, "%s/p1.bin", dir);
    float *a = rl_test_read_floats(p, &n1);
    snprintf(p, sizeof p, "%s/p2.bin", dir);
    float *b = rl_test_read_floats(p, &n2);
    cr_assert_eq(n1, n2);
    /* the DDP equivalence bound of test_ddp.c: 1e-5 relative over the vector */
    double dn = 0, nn = 0;
    for (size_t i = 0; i < n1; i++) dn += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), nn += (double)a[i] * a[i];
    double rel = sqrt(dn / nn);
    cr_log_info("2 processes resumed from a 1-process checkpoint: parameters differ by %.3g relative", rel);
    cr_expect(rel < 1e-5, "parameters differ by %.3g relative", rel);
    cr_expect(rel > 0 || memcmp(a, b, n1 * 4) == 0);
    free(a), free(b);
    /* and the 2-process run committed step 10 again */
    snprintf(p, sizeof p, "%s/ck/latest", dir);
    cr_expect(rl_test_file_has(p, "step-00000010"));
    rl_test_rmdir(dir);
}

static long long committed_latest(const char *dir) {
    char root[128];
    snprintf(root, sizeof root, "%s/ck", dir);
    rl_ckpt_store *s;
    rl_err e;
    cr_assert_eq(rl_ckpt_store_open(root, &s, &e), 0, "%s", e.msg);
    rl_model_config mc;
    tiny_model(&mc);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &mc);
    rl_ckpt_loaded ld;
    int rc = rl_ckpt_load_latest(s, &mc, lay.total, NULL, NULL, NULL, &ld, &e);
    cr_expect_eq(rc, 0, "%s", e.msg);
    long long st = ld.found ? ld.step : -1;
    rl_ckpt_loaded_free(&ld);
    rl_ckpt_store_close(s);
    return st;
}

Test(ckpt, sigterm_writes_a_checkpoint_and_exits_preempted, .timeout = 180) {
    char dir[64], log[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 100000, 512, NULL, ",\"preempt_budget_s\":15");
    snprintf(log, sizeof log, "%s/log", dir);
    pid_t p = rl_test_spawn_worker(dir, log, -1, 1, 0, NULL);
    double t0 = rl_now();
    while (rl_test_last_step(log) < 3 && rl_now() - t0 < 60) usleep(20000);
    long long at_signal = rl_test_last_step(log);
    if (at_signal < 3) {
        kill(p, SIGKILL), waitpid(p, NULL, 0);
        cr_assert_fail("training never started");
    }
    kill(p, SIGTERM);
    int st = rl_test_wait_status(p, 60);
    cr_expect_eq(st, RL_EXIT_PREEMPTED, "exit status %d, want %d", st, RL_EXIT_PREEMPTED);
    long long stopped = rl_test_last_step(log);
    /* the step under way finished, no further one started, and that is the checkpoint */
    cr_expect(stopped >= at_signal && stopped <= at_signal + 2, "stopped at %lld, signal after %lld", stopped, at_signal);
    cr_expect(rl_test_file_has(log, "\"event\":\"preempted\""), "no preempted line");
    cr_expect_eq(committed_latest(dir), stopped);
    rl_test_rmdir(dir);
}

Test(ckpt, sigterm_to_one_rank_stops_every_rank_at_the_same_step, .timeout = 180) {
    char dir[64], log[2][128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 100000, 512, NULL, "");
    rl_store_server *srv;
    rl_err e;
    cr_assert_eq(rl_store_server_start("127.0.0.1", 0, &srv, &e), 0, "%s", e.msg);
    int port = rl_store_server_port(srv);
    rl_store_server_stop(srv);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        snprintf(log[r], sizeof log[r], "%s/rank%d.log", dir, r);
        pid[r] = rl_test_spawn_worker(dir, log[r], r, 2, port, NULL);
    }
    double t0 = rl_now();
    while (rl_test_last_step(log[0]) < 3 && rl_now() - t0 < 90) usleep(20000);
    if (rl_test_last_step(log[0]) < 3) {
        for (int r = 0; r < 2; r++) kill(pid[r], SIGKILL), waitpid(pid[r], NULL, 0);
        cr_assert_fail("training never started");
    }
    /* only rank 1 hears it, as when one pod of several is evicted first */
    kill(pid[1], SIGTERM);
    int st0 = rl_test_wait_status(pid[0], 60), st1 = rl_test_wait_status(pid[1], 60);
    cr_expect(st0 == RL_EXIT_PREEMPTED && st1 == RL_EXIT_PREEMPTED, "exit statuses %d and %d", st0, st1);
    long long stopped = rl_test_last_step(log[0]);
    cr_expect(rl_test_file_has(log[0], "\"event\":\"preempted\""));
    cr_expect_eq(committed_latest(dir), stopped);
    rl_test_rmdir(dir);
}

/* ---- sharded optimizer state: one shard per rank, a commit only when all are in ---------------- */
#define SH_WORLD 4
typedef struct {
    rl_ckpt_store *store;
    rl_ckpt_data d;
    rl_ckpt_write_opts o;
    rl_shard_range r[8];
    float *m, *v;
    int rc;
    rl_err e;
} shard_writer;

/* rank's part of f over SH_WORLD ranks, cut as DDP cuts two buckets */
static void shard_of(const fake_state *f, int rank, long long step, uint64_t nonce, shard_writer *w) {
    size_t boff[2] = {f->n / 2, 0}, blen[2] = {f->n - f->n / 2, f->n / 2};
    int k = rl_ddp_shard_plan(boff, blen, 2, SH_WORLD, rank, w->r);
    size_t total = 0;
    for (int i = 0; i < k; i++) total += w->r[i].len;
    w->m = malloc(total * sizeof(float) + 1), w->v = malloc(total * sizeof(float) + 1);
    for (int i = 0, at = 0; i < k; at += (int)w->r[i].len, i++) {
        memcpy(w->m + at, f->m + w->r[i].off, w->r[i].len * sizeof(float));
        memcpy(w->v + at, f->v + w->r[i].off, w->r[i].len * sizeof(float));
    }
    w->d = fake_data(f, step);
    w->d.m = w->m, w->d.v = w->v, w->d.params = rank == 0 ? f->p : NULL;
    w->d.shard_rank = rank, w->d.shard_world = SH_WORLD, w->d.ranges = w->r, w->d.nranges = k;
    w->d.shard_total = total, w->d.nonce = nonce;
    w->o = (rl_ckpt_write_opts){.keep = 3, .shard_wait_s = 1.5};
}

static void *shard_write(void *arg) {
    shard_writer *w = arg;
    w->rc = rl_ckpt_write(w->store, &w->d, &w->o, NULL, &w->e);
    return NULL;
}

/* every rank of `ranks` (a bit set) writes its shard of step, rank 0 last to be joined; rank 0's result */
static int sharded_save(const char *uri, const fake_state *f, long long step, uint64_t nonce, unsigned ranks,
                        const char *fail_rank2, rl_err *e) {
    shard_writer w[SH_WORLD] = {0};
    pthread_t th[SH_WORLD];
    for (int r = 0; r < SH_WORLD; r++) {
        if (!(ranks >> r & 1)) continue;
        wrap_ctx *wc;
        w[r].store = wrap_store(uri, &wc);
        if (r == 2) wc->fail_suffix = fail_rank2; /* rank 2 dies between its shard and its receipt */
        shard_of(f, r, step, nonce, &w[r]);
        cr_assert_eq(pthread_create(&th[r], NULL, shard_write, &w[r]), 0);
    }
    for (int r = 0; r < SH_WORLD; r++) {
        if (!(ranks >> r & 1)) continue;
        pthread_join(th[r], NULL);
        rl_ckpt_store_close(w[r].store);
        free(w[r].m), free(w[r].v);
    }
    if (e) *e = w[0].e;
    return w[0].rc;
}

/* The checks at the store: a commit lists every shard and reads
 * back whole; a rank lost between its shard and its receipt, or a receipt
 * of another save, leaves the step uncommitted and the previous checkpoint
 * the newest; a manifest short of a shard, or a shard missing, is one line
 * naming it. */
Test(ckpt, sharded_optimizer_state_commits_only_when_every_shard_is_in, .timeout = 60) {
    char dir[64], uri[128], p[256];
    tmpdir(dir, sizeof dir);
    snprintf(uri, sizeof uri, "file://%s/ck", dir);
    fake_state f;
    fake_fill(&f, 3);
    rl_err e;
    cr_assert_eq(sharded_save(uri, &f, 5, 0x1234, 0xf, NULL, &e), 0, "%s", e.msg);
    rl_ckpt_store *s;
    cr_assert_eq(rl_ckpt_store_open(uri, &s, &e), 0, "%s", e.msg);
    float *buf = calloc(3 * f.n, sizeof(float));
    rl_ckpt_loaded ld;
    cr_assert_eq(rl_ckpt_load_latest(s, &f.mc, f.n, buf, buf + f.n, buf + 2 * f.n, &ld, &e), 0, "%s", e.msg);
    cr_expect_eq(ld.step, 5);
    cr_expect(!memcmp(buf, f.p, f.n * 4) && !memcmp(buf + f.n, f.m, f.n * 4) && !memcmp(buf + 2 * f.n, f.v, f.n * 4),
              "the shards do not read back as the whole state");
    rl_ckpt_loaded_free(&ld);
    /* step 6: rank 2's receipt never comes */
    double t0 = rl_now();
    cr_expect_eq(sharded_save(uri, &f, 6, 0x5678, 0xf, "receipt.json", &e), RL_ETIMEOUT);
    cr_expect(strstr(e.msg, "rank 2's optimizer shard is not in") && strstr(e.msg, "not committed"), "%s", e.msg);
    cr_expect_lt(rl_now() - t0, 10.0);
    /* step 7: rank 1's receipt is another save's (an older nonce) */
    cr_assert_eq(sharded_save(uri, &f, 7, 0x1111, 0x2, NULL, &e), 0, "%s", e.msg); /* rank 1 alone */
    cr_expect_eq(sharded_save(uri, &f, 7, 0x2222, 0xd, NULL, &e), RL_ETIMEOUT); /* 0, 2, 3 of the new save */
    cr_expect(strstr(e.msg, "rank 1's optimizer shard"), "%s", e.msg);
    long long *cs;
    int nc;
    cr_assert_eq(rl_ckpt_steps(s, &cs, &nc, NULL, NULL, &e), 0);
    cr_expect(nc == 1 && cs[0] == 5, "committed: %d, newest %lld", nc, nc ? cs[nc - 1] : -1);
    free(cs);
    snprintf(p, sizeof p, "%s/ck/latest", dir);
    cr_expect(rl_test_file_has(p, "step-00000005"));
    /* step 5's manifest short of rank 3's shard */
    char *text;
    size_t len;
    snprintf(p, sizeof p, "%s/ck/step-00000005/manifest.json", dir);
    cr_assert_eq(rl_read_file(p, &text, &len, &e), 0);
    rl_ckpt_manifest m;
    cr_assert_eq(rl_ckpt_manifest_parse(text, len, p, &m, &e), 0, "%s", e.msg);
    int k = 0;
    for (int i = 0; i < m.nfiles; i++)
        if (!strstr(m.files[i].name, "optimizer-00003-of-00004")) m.files[k++] = m.files[i];
    cr_assert_eq(m.nfiles - k, 1);
    m.nfiles = k;
    char *shorter = rl_ckpt_manifest_json(&m);
    rl_test_write(p, shorter, strlen(shorter));
    cr_expect_eq(rl_ckpt_load_latest(s, &f.mc, f.n, buf, buf + f.n, buf + 2 * f.n, &ld, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "step-00000005/manifest.json: lists 3 optimizer shards of a world of 4") &&
              !strchr(e.msg, '\n'), "%s", e.msg);
    /* the manifest whole again, a shard gone */
    rl_test_write(p, text, len);
    snprintf(p, sizeof p, "%s/ck/step-00000005/optimizer-00001-of-00004.safetensors", dir);
    cr_assert_eq(unlink(p), 0);
    cr_expect_eq(rl_ckpt_load_latest(s, &f.mc, f.n, buf, buf + f.n, buf + 2 * f.n, &ld, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "optimizer-00001-of-00004.safetensors: missing (listed in the manifest)"), "%s", e.msg);
    free(shorter), free(text), free(buf);
    rl_ckpt_manifest_free(&m);
    rl_ckpt_store_close(s);
    fake_free(&f);
    rl_test_rmdir(dir);
}

/* Through the binary: a checkpoint directory that cannot be, and a store
 * whose only checkpoint is damaged, end the run with exit 2 and one line
 * naming the object; nothing is trained or written. */
Test(ckpt, cli_bad_checkpoint_inputs_exit_2, .timeout = 120) {
    char dir[64], cmd[1024], err[8192], p[256];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(p, sizeof p, "%s/ck", dir);
    rl_test_write(p, "not a directory", 15);
    rl_test_write_job(dir, 4, 512, NULL, "");
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/ringleader-worker --config %s/job.json", rl_test_bindir(), dir);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "ringleader-worker: error:") && strstr(err, "/ck: exists and is not a directory"), "%s", err);
    cr_expect(!strstr(err, "\"event\":\"step\""), "trained anyway: %s", err);
    /* a good run, then its only checkpoint damaged */
    unlink(p);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(p, sizeof p, "%s/ck/step-00000004/model.safetensors", dir);
    cr_assert_eq(truncate(p, 100), 0);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "no usable checkpoint") && strstr(err, "step-00000004/model.safetensors") &&
              strstr(err, "truncated"), "%s", err);
    /* resume false over existing checkpoints: refused, naming the setting */
    rl_test_write_job(dir, 4, 512, NULL, ",\"resume\":false");
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "checkpoint.resume is false"), "%s", err);
    rl_test_rmdir(dir);
}
