/* Optimizer pieces against hand-computed values, config validation,
 * gradient accumulation, determinism and learning of the whole trainer. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train.h"
#include "testutil.h"

/* ---- schedule, clipping, AdamW ---------------------------------------------------- */
Test(train_optim, lr_schedule_hand_values) {
    rl_train_config t = {.lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .steps = 110};
    /* warmup: lr * (step + 1) / warmup */
    cr_expect_float_eq(rl_lr_at(&t, 0), 0.1, 1e-12);
    cr_expect_float_eq(rl_lr_at(&t, 4), 0.5, 1e-12);
    cr_expect_float_eq(rl_lr_at(&t, 9), 1.0, 1e-12);
    /* cosine from lr at the end of warmup to min_lr at `steps` */
    cr_expect_float_eq(rl_lr_at(&t, 10), 1.0, 1e-12);
    cr_expect_float_eq(rl_lr_at(&t, 60), 0.55, 1e-12); /* half way: 0.1 + 0.5 * 0.9 */
    cr_expect_float_eq(rl_lr_at(&t, 109), 0.10022204783542078, 1e-12);
    cr_expect_float_eq(rl_lr_at(&t, 110), 0.1, 1e-12);
    cr_expect_float_eq(rl_lr_at(&t, 500), 0.1, 1e-12);
}

Test(train_optim, clipping_hand_values) {
    float g[2] = {3, 4};
    cr_expect_float_eq(rl_grad_norm(g, 2), 5.0, 1e-12);
    cr_expect_float_eq(rl_clip_factor(5.0, 1.0), 1.0 / (5.0 + 1e-6), 1e-15);
    cr_expect_float_eq(rl_clip_factor(0.5, 1.0), 1.0, 0);
    cr_expect_float_eq(rl_clip_factor(50.0, 0.0), 1.0, 0); /* disabled */
}

Test(train_optim, grad_norm_independent_of_threads) {
    size_t n = 100003;
    float *g = malloc(n * sizeof *g);
    double ref = 0;
    for (size_t i = 0; i < n; i++) g[i] = (float)sin((double)i) * 1e-3f, ref += (double)g[i] * g[i];
    omp_set_num_threads(1);
    double a = rl_grad_norm(g, n);
    omp_set_num_threads(3);
    double b = rl_grad_norm(g, n);
    cr_expect(memcmp(&a, &b, sizeof a) == 0, "norm differs with thread count: %.17g vs %.17g", a, b);
    cr_expect_float_eq(a, sqrt(ref), 1e-12 * sqrt(ref));
    free(g);
}

Test(train_optim, adamw_hand_values) {
    /* PyTorch AdamW, computed by hand: lr 0.1, betas (0.9, 0.999), eps 1e-8,
     * weight_decay 0.01, p = 1, gradients 0.5 then -0.25. */
    float p = 1, m = 0, v = 0, g = 0.5f;
    rl_adamw_update(&p, &g, &m, &v, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 1, 1.0);
    /* fp32 state: relative tolerance of a few ulps */
    cr_expect_float_eq(m, 0.05f, 0.05 * 1e-6);
    cr_expect_float_eq(v, 0.00025f, 0.00025 * 1e-6);
    cr_expect_float_eq(p, 0.899000002f, 1e-6);
    g = -0.5f; /* with grad_scale 0.5: the clipped gradient is -0.25 */
    rl_adamw_update(&p, &g, &m, &v, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 2, 0.5);
    cr_expect_float_eq(m, 0.02f, 0.02 * 1e-6);
    cr_expect_float_eq(v, 0.00031225f, 0.00031225 * 1e-6);
    cr_expect_float_eq(p, 0.8714672987f, 1e-6);
    /* no decay: a zero gradient leaves p alone when wd = 0 ... */
    float q = 2, mq = 0, vq = 0, z = 0;
    rl_adamw_update(&q, &z, &mq, &vq, 1, 0.1, 0.9, 0.999, 1e-8, 0.0, 1, 1.0);
    cr_expect_float_eq(q, 2.0f, 0);
    /* ... and decays it by exactly lr * wd otherwise */
    rl_adamw_update(&q, &z, &mq, &vq, 1, 0.1, 0.9, 0.999, 1e-8, 0.5, 2, 1.0);
    cr_expect_float_eq(q, 2.0f * 0.95f, 1e-7);
}

/* ---- config ---------------------------------------------------------------------------- */
static int parse(const char *json, rl_err *e) {
    rl_job_config c;
    rl_job_config_default(&c);
    return rl_job_config_parse(json, strlen(json), "job.json", &c, e);
}

#define EXPECT_BAD(json, needle)                                                           \
    do {                                                                                   \
        rl_err e_ = {0};                                                                   \
        cr_expect_eq(parse(json, &e_), RL_EINPUT, "accepted: %s", json);                   \
        cr_expect(strstr(e_.msg, needle) != NULL, "message '%s' lacks '%s'", e_.msg, needle); \
        cr_expect(strstr(e_.msg, "job.json") != NULL, "message '%s' lacks the file", e_.msg); \
        cr_expect(strchr(e_.msg, '\n') == NULL, "message is not one line: %s", e_.msg);     \
    } while (0)

Test(train_config, rejects_bad_configs_naming_the_field) {
    EXPECT_BAD("{\"train\":{\"learning_rate\":1}}", "learning_rate");
    EXPECT_BAD("{\"modle\":{}}", "modle");
    EXPECT_BAD("{\"model\":{\"hidden_size\":100,\"num_attention_heads\":3}}", "num_attention_heads");
    EXPECT_BAD("{\"model\":{\"num_attention_heads\":4,\"num_key_value_heads\":3}}", "num_key_value_heads");
    EXPECT_BAD("{\"train\":{\"global_batch_tokens\":2000}}", "global_batch_tokens");
    EXPECT_BAD("{\"train\":{\"micro_batch\":3}}", "micro_batch");
    EXPECT_BAD("{\"train\":{\"seq_len\":65}}", "max_position_embeddings");
    EXPECT_BAD("{\"train\":{\"lr\":\"fast\"}}", "train.lr");
    EXPECT_BAD("{\"train\":{\"steps\":1.5}}", "train.steps");
    EXPECT_BAD("{\"train\":{\"steps\":-1}}", "train.steps");
    EXPECT_BAD("{\"train\":{\"seed\":1,\"seed\":2}}", "seed");
    EXPECT_BAD("{\"model\":{\"hidden_size\":0}}", "hidden_size");
    EXPECT_BAD("{\"data\":{\"eval_task\":\"poetry\"}}", "eval_task");
    EXPECT_BAD("{\"train\":{\"min_lr\":1}}", "min_lr");
    EXPECT_BAD("[1,2]", "object");
    EXPECT_BAD("{\"train\": {\"steps\": 10,}", "invalid JSON");
    EXPECT_BAD("{\"train\":{\"device\":\"tpu\"}}", "train.device");
    EXPECT_BAD("{\"train\":{\"attention\":\"flash\"}}", "train.attention");
    EXPECT_BAD("{\"train\":{\"attention\":\"flashattention\"}}", "train.attention");
    EXPECT_BAD("{\"train\":{\"attention\":1}}", "train.attention");
    EXPECT_BAD("{\"train\":{\"fused_gemm\":\"yes\"}}", "train.fused_gemm");
    EXPECT_BAD("{\"train\":{\"fused_gemm\":true}}", "train.fused_gemm");
    EXPECT_BAD("{\"dist\":{\"backend\":\"mpi\"}}", "dist.backend");
    EXPECT_BAD("{\"dist\":{\"reduce_dtype\":\"fp8\"}}", "dist.reduce_dtype");
    EXPECT_BAD("{\"dist\":{\"shard\":\"parameters\"}}", "dist.shard");
    EXPECT_BAD("{\"dist\":{\"shard\":\"optimizer\"},\"checkpoint\":{\"when_busy\":\"skip\"}}", "when_busy");
    EXPECT_BAD("{\"train\":{\"device\":\"cpu\"},\"dist\":{\"backend\":\"nccl\"}}", "train.device");
    EXPECT_BAD("{\"train\":{\"device\":\"cuda\"},\"dist\":{\"backend\":\"tcp\"}}", "dist.backend");
    EXPECT_BAD("{\"train\":{\"offload\":\"everything\"}}", "train.offload");
    EXPECT_BAD("{\"train\":{\"device\":\"cpu\",\"offload\":\"layers\"}}", "train.offload");
    EXPECT_BAD("{\"train\":{\"device\":\"cpu\",\"offload\":\"optimizer\"}}", "train.offload");
    /* either offload shards its host state */
    const char *ok[2] = {"{\"train\":{\"device\":\"cuda\",\"offload\":\"optimizer\"},\"dist\":{\"shard\":\"gradients\"}}",
                         "{\"train\":{\"device\":\"cuda\",\"offload\":\"layers\"},\"dist\":{\"shard\":\"optimizer\"}}"};
    for (int i = 0; i < 2; i++) {
        rl_job_config c;
        rl_err e;
        rl_job_config_default(&c);
        cr_expect_eq(rl_job_config_parse(ok[i], strlen(ok[i]), "x", &c, &e), 0, "%s", e.msg);
    }
}

/* "auto" settles to what this process can use: without a visible GPU (the
 * machines make test runs on) the CPU and the tcp ring; "cuda" there is a
 * clear error naming train.device, never a crash or a silent CPU run. */
Test(train_config, device_auto_settles_and_cuda_without_gpu_is_refused) {
    rl_job_config c;
    rl_err e;
    rl_job_config_default(&c);
    cr_expect_str_eq(c.train.device, "auto");
    cr_expect_str_eq(c.dist.backend, "auto");
    cr_assert_eq(rl_train_pick_device(&c, &e), 0, "%s", e.msg);
    if (getenv("CUDA_VISIBLE_DEVICES") || strcmp(c.train.device, "cuda") == 0) return; /* a GPU host */
    cr_expect_str_eq(c.train.device, "cpu");
    cr_expect_str_eq(c.dist.backend, "tcp");
    cr_expect(c.train.device_picked);
    rl_job_config_default(&c);
    snprintf(c.train.device, sizeof c.train.device, "cuda");
    cr_expect_eq(rl_train_pick_device(&c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "train.device") != NULL, "%s", e.msg);
    /* offloading needs a GPU: auto settling on the CPU refuses it by name */
    rl_job_config_default(&c);
    snprintf(c.train.offload, sizeof c.train.offload, "optimizer");
    cr_expect_eq(rl_train_pick_device(&c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "train.offload") && strstr(e.msg, "needs a GPU"), "%s", e.msg);
}

Test(train_config, accepts_and_round_trips) {
    rl_job_config a, b;
    rl_err e;
    rl_job_config_default(&a);
    const char *js = "{\"model\":{\"hidden_size\":64,\"num_attention_heads\":8,\"num_key_value_heads\":2},"
                     "\"train\":{\"steps\":7,\"warmup_steps\":2,\"lr\":0.01}}";
    cr_assert_eq(rl_job_config_parse(js, strlen(js), "x", &a, &e), 0, "%s", e.msg);
    cr_expect_eq(a.model.hidden_size, 64);
    cr_expect_eq(a.train.steps, 7);
    cr_expect_str_eq(a.train.attention, "auto"); /* the default */
    cr_expect_str_eq(a.train.fused_gemm, "auto");
    const char *js2 = "{\"train\":{\"attention\":\"cudnn\"}}";
    cr_assert_eq(rl_job_config_parse(js2, strlen(js2), "x", &a, &e), 0, "%s", e.msg);
    cr_expect_str_eq(a.train.attention, "cudnn");
    char *s = rl_job_config_to_json(&a);
    rl_job_config_default(&b);
    cr_assert_eq(rl_job_config_parse(s, strlen(s), "x", &b, &e), 0, "%s", e.msg);
    cr_expect(memcmp(&a.model, &b.model, sizeof a.model) == 0);
    cr_expect(memcmp(&a.train, &b.train, sizeof a.train) == 0);
    free(s);
}

Test(train_config, world_size_must_divide) {
    rl_job_config c;
    rl_err e;
    rl_job_config_default(&c); /* 32 sequences per step, micro batch 16 */
    cr_expect_eq(rl_job_config_check_world(&c, 2, "x", &e), 0);
    cr_expect_eq(rl_job_config_check_world(&c, 3, "x", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "world size 3") != NULL, "%s", e.msg);
    /* streamed layers are data parallel too */
    snprintf(c.train.offload, sizeof c.train.offload, "layers");
    cr_expect_eq(rl_job_config_check_world(&c, 2, "x", &e), 0);
}

/* ---- the trainer ------------------------------------------------------------------------- */
static void small_job(rl_job_config *c, const char *dir) {
    rl_job_config_default(c);
    snprintf(c->data.train, sizeof c->data.train, "%s/train_*.bin", dir);
    snprintf(c->data.val, sizeof c->data.val, "%s/val_*.bin", dir);
    c->data.eval_task[0] = '\0';
    c->train.eval_every = 0;
    c->train.eval_batches = 2;
}

static double *run_losses(const rl_job_config *c, int steps) {
    rl_trainer *tr;
    rl_err e;
    cr_assert_eq(rl_trainer_new(&tr, c, NULL, &e), 0, "%s", e.msg);
    double *l = malloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < steps; i++) {
        rl_step_stats st;
        cr_assert_eq(rl_trainer_step(tr, &st, &e), 0, "%s", e.msg);
        l[i] = st.loss;
    }
    rl_trainer_free(tr);
    return l;
}

Test(train, same_seed_bit_identical_losses) {
    char dir[64];
    rl_test_arith_dir(dir, sizeof dir, 200000);
    rl_job_config c;
    small_job(&c, dir);
    double *a = run_losses(&c, 6), *b = run_losses(&c, 6);
    for (int i = 0; i < 6; i++)
        cr_expect(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "step %d: %.17g vs %.17g", i + 1, a[i], b[i]);
    c.train.seed = 99; /* and a different seed really differs */
    double *d = run_losses(&c, 6);
    cr_expect(memcmp(a, d, 6 * sizeof *a) != 0);
    free(a), free(b), free(d);
    rl_test_rmdir(dir);
}

/* The global batch fixes the optimisation: 2 micro-steps of 8 sequences
 * must follow the same path as 1 of 16 (up to float rounding). This is
 * also what lets a job resume on a different number of ranks. */
Test(train, accumulation_matches_one_big_batch) {
    char dir[64];
    rl_test_arith_dir(dir, sizeof dir, 200000);
    rl_job_config c;
    small_job(&c, dir);
    c.train.global_batch_tokens = 16 * 64;
    c.train.micro_batch = 16;
    double *big = run_losses(&c, 5);
    c.train.micro_batch = 8;
    double *acc = run_losses(&c, 5);
    c.train.micro_batch = 2;
    double *acc8 = run_losses(&c, 5);
    for (int i = 0; i < 5; i++) {
        cr_expect(fabs(big[i] - acc[i]) < 1e-5 * big[i], "step %d: %.8f vs %.8f", i + 1, big[i], acc[i]);
        cr_expect(fabs(big[i] - acc8[i]) < 1e-5 * big[i], "step %d: %.8f vs %.8f", i + 1, big[i], acc8[i]);
    }
    free(big), free(acc), free(acc8);
    rl_test_rmdir(dir);
}
