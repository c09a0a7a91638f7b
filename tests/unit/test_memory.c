/* Memory accounting (pkg/train/memory.h): the bucket plan against ddp's
 * rule, the shards' arithmetic, hand values on a tiny model, and the cuda
 * figures against the GPU model's own allocation. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/gpu_layout.h"
#include "train/memory.h"

static const char *const modes[] = {"optimizer", "gradients"};
static const char *const devices[] = {"cpu", "cuda"};

/* the default model, buckets small enough for several, lengths not multiples of 2, 3, 4 */
static rl_job_config base(const char *device, const char *shard) {
    rl_job_config c;
    rl_job_config_default(&c);
    snprintf(c.train.device, sizeof c.train.device, "%s", device);
    snprintf(c.dist.shard, sizeof c.dist.shard, "%s", shard);
    c.dist.first_bucket_mb = 0.01, c.dist.bucket_mb = 0.05;
    return c;
}

/* the plan DDP gets from the agent for these settings */
static int plan_of(const rl_dist_config *d, size_t n, rl_train_bucket_plan *p, rl_err *e) {
    return rl_train_bucket_plan_of(n, rl_train_mib_bytes(d->first_bucket_mb), rl_train_mib_bytes(d->bucket_mb),
                                   d->min_buckets, p, e);
}

static rl_train_memory of(const rl_job_config *c, int world) {
    rl_train_memory m;
    rl_err e = {0};
    cr_assert_eq(rl_train_memory_of(c, world, 0, &m, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(m.total, m.weights + m.master + m.grads + m.moments + m.activations);
    return m;
}

Test(memory, bucket_plan_cuts_as_ddp_does) {
    rl_job_config c = base("cpu", "none");
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c.model);
    rl_train_bucket_plan p;
    rl_err e;
    cr_assert_eq(plan_of(&c.dist, lay.total, &p, &e), RL_OK);
    cr_assert_eq(p.first, (size_t)(0.01 * (1 << 20)) / 4);
    size_t sum = 0, largest = 0, b = 0;
    for (size_t len; (len = rl_train_bucket_len(&p, b)) > 0; b++) {
        sum += len, largest = len > largest ? len : largest;
        cr_assert(b == 0 || len <= p.rest);
    }
    cr_assert_eq(sum, lay.total);
    cr_assert_eq(b, p.count);
    cr_assert_eq(largest, p.largest);
    /* min_buckets caps every bucket at ceil(n / min_buckets) */
    c.dist.bucket_mb = c.dist.first_bucket_mb = 4096, c.dist.min_buckets = 8;
    cr_assert_eq(plan_of(&c.dist, 1001, &p, &e), RL_OK);
    cr_assert_eq(p.first, 126);
    cr_assert_eq(p.count, 8);
    cr_assert_eq(rl_train_bucket_len(&p, 7), 1001 - 7 * 126);
}

Test(memory, world_one_is_none_in_every_mode) {
    for (int d = 0; d < 2; d++) {
        rl_job_config none = base(devices[d], "none");
        rl_train_memory want = of(&none, 1);
        rl_param_layout lay;
        rl_param_layout_init(&lay, &none.model);
        cr_assert_eq(want.shard_elems, lay.total);
        for (int k = 0; k < 2; k++) {
            rl_job_config c = base(devices[d], modes[k]);
            rl_train_memory got = of(&c, 1);
            cr_assert(!memcmp(&got, &want, sizeof got), "%s %s", devices[d], modes[k]);
        }
    }
}

/* The tails and the longest bucket of a GPU's "gradients" buckets: its
 * gradient regions (gpu_layout.h), which DDP cuts by (opts.regions). */
static size_t region_tails(const rl_model_config *c, size_t world, size_t *largest) {
    size_t tails = 0, off, len;
    *largest = 0;
    for (int k = 0; k < rl_gpu_grad_regions(c, NULL); k++) {
        rl_gpu_grad_region(c, k, &off, &len);
        tails += len % world, *largest = len > *largest ? len : *largest;
    }
    return tails;
}

/* moments within one bucket of 1/world of none's; every rank holds the
 * same count, so the ranks' sum counts the blocks once and the tails world
 * times (the buckets: the size plan's, or a GPU's gradient regions) */
Test(memory, shards_are_a_world_th_plus_the_tails) {
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++)
            for (int world = 2; world <= 4; world++) {
                rl_job_config c = base(devices[d], modes[k]), none = base(devices[d], "none");
                rl_train_memory m = of(&c, world), full = of(&none, world);
                size_t n = full.shard_elems, tails, largest;
                rl_train_bucket_plan p;
                rl_err e;
                cr_assert_eq(plan_of(&c.dist, n, &p, &e), RL_OK);
                if (d == 1 && k == 1) {
                    tails = region_tails(&c.model, (size_t)world, &largest);
                } else {
                    cr_assert_eq(m.shard_elems, rl_train_shard_elems(&p, world, &tails));
                    largest = p.largest;
                }
                /* (the default model's regions divide evenly at some worlds; the tiny model's have tails) */
                cr_assert(tails > 0 || (d == 1 && k == 1), "a test that exercises no tail");
                cr_assert_eq((size_t)world * m.shard_elems, n + (size_t)(world - 1) * tails);
                double share = (double)full.moments / world, one = 8.0 * (double)largest;
                cr_assert(m.moments >= share && m.moments <= share + one, "%s %s world %d", devices[d],
                          modes[k], world);
                cr_assert_eq(m.weights, full.weights);
                cr_assert_eq(m.activations, full.activations);
            }
}

/* hidden 8, ffn 16, 1 layer, 2 heads (head dim 4), 1 kv head, vocab 64
 * (no GPU padding), max_pos 4; micro_batch 1 x seq_len 4.
 * n = embed 512 + layer (8 + 64 + 32 + 32 + 64 + 8 + 3 x 128 = 592) + norm 8 + lm_head 512 = 1624.
 * Buckets of 100 then 500 elements (min_buckets 1: no cap): 100, 500, 500, 500, 24. */
static rl_job_config tiny(const char *device, const char *shard) {
    rl_job_config c = base(device, shard);
    c.model.hidden_size = 8, c.model.intermediate_size = 16, c.model.num_hidden_layers = 1;
    c.model.num_attention_heads = 2, c.model.num_key_value_heads = 1, c.model.vocab_size = 64;
    c.model.max_position_embeddings = 4, c.train.micro_batch = 1, c.train.seq_len = 4;
    c.dist.first_bucket_mb = 400.0 / (1 << 20), c.dist.bucket_mb = 2000.0 / (1 << 20), c.dist.min_buckets = 1;
    return c;
}

Test(memory, hand_values_on_a_tiny_model) {
    rl_job_config c = tiny("cpu", "none");
    rl_train_memory m = of(&c, 3);
    cr_assert_eq(m.shard_elems, 1624);
    cr_assert_eq(m.weights, 1624 * 4);
    cr_assert_eq(m.master, 0);
    cr_assert_eq(m.grads, 1624 * 4);
    cr_assert_eq(m.moments, 2 * 1624 * 4);
    /* acts 784 floats, scratch 336, rope 16 (each rounded up to 64 bytes), tokens + targets 8 ints */
    cr_assert_eq(m.activations, 3136 + 1344 + 64 + 32);
    /* world 3: 100 -> 33 + tail 1; 500 -> 166 + tail 2 (x3); 24 -> 8 + tail 0 */
    c = tiny("cpu", "gradients");
    m = of(&c, 3);
    cr_assert_eq(m.shard_elems, 34 + 3 * 168 + 8);
    /* the shard's gradient, and in flight at most the whole buffer: here the
     * window (2 x 500), a stretch (the layer, 592), a bucket and 9 pages are more */
    cr_assert_eq(m.grads, 546 * 4 + 1624 * 4, "%zu bytes of gradients", m.grads);
    cr_assert_eq(m.moments, 2 * 546 * 4);
    c = tiny("cuda", "optimizer");
    m = of(&c, 3);
    cr_assert_eq(m.weights, 1624 * 2);
    cr_assert_eq(m.master, 546 * 4, "the GPU model's master is the shard's, as the moments");
    cr_assert_eq(m.grads, 1624 * 4);
    /* a GPU's "gradients" cuts at its regions: embed 512 -> 170 + tail 2;
     * the layer 592 -> 197 + 1; the head (norm + lm_head) 520 -> 173 + 1.
     * Gradients: 2 slots of the longest region (the layer; no vocabulary
     * padding at 64) and the shard's own. */
    c = tiny("cuda", "gradients");
    m = of(&c, 3);
    cr_assert_eq(m.shard_elems, 172 + 198 + 174);
    cr_assert_eq(m.master, 544 * 4);
    cr_assert_eq(m.grads, (2 * 592 + 544) * 4, "%zu bytes of gradients", m.grads);
    cr_assert_eq(m.moments, 2 * 544 * 4);
    /* offload layers: on the GPU the embedding and head (512 + 520) and a
     * ring of 3 layers; sharded, one layer more (the buffer each layer's
     * gather from the ranks goes through); the state on the host */
    c = tiny("cuda", "none");
    snprintf(c.train.offload, sizeof c.train.offload, "layers");
    m = of(&c, 3);
    cr_assert_eq(m.weights, (1032 + 3 * 592) * 2, "%zu bytes of weights", m.weights);
    cr_assert_eq(m.master, 0);
    snprintf(c.dist.shard, sizeof c.dist.shard, "gradients");
    m = of(&c, 3);
    cr_assert_eq(m.weights, (1032 + 4 * 592) * 2, "%zu bytes of weights, sharded", m.weights);
    cr_assert_eq(m.master + m.moments, 0);
}

/* "gradients" on the CPU where the flight is less than the buffer: hidden
 * 256, ffn 512, 4 layers, 4 heads (64), 2 kv heads, vocab 1024.
 * embed = lm_head = 262144; a layer = 2 x 256 + 2 x 65536 + 2 x 32768 + 3 x
 * 131072 = 590336; n = 2 x 262144 + 4 x 590336 + 256 = 2885888. Buckets
 * 65536, then 10 x 262144, then 198912 (12; min_buckets 1). World 4: the
 * shard 16384 + 10 x 65536 + 49728 = 721472 (no tails). In flight: the
 * window max(2 x 262144, the layer 590336), a stretch (the layer again), a
 * bucket, and 12 + 4 pages. */
Test(memory, scattered_gradients_by_hand) {
    rl_job_config c = base("cpu", "gradients");
    rl_model_config *m = &c.model;
    m->hidden_size = 256, m->intermediate_size = 512, m->num_hidden_layers = 4, m->num_attention_heads = 4;
    m->num_key_value_heads = 2, m->vocab_size = 1024;
    c.dist.first_bucket_mb = 0.25, c.dist.bucket_mb = 1, c.dist.min_buckets = 1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    rl_train_memory g = of(&c, 4);
    cr_assert_eq(g.shard_elems, 721472);
    cr_assert_eq(rl_train_stretch(m), 590336);
    cr_assert_eq(g.grads, 4 * (721472 + 590336 + 590336 + 262144) + 16 * page, "%zu", g.grads);
    snprintf(c.dist.shard, sizeof c.dist.shard, "optimizer");
    cr_assert_eq(of(&c, 4).grads, 4 * 2885888, "optimizer reduces as DDP: the buffer stays whole");
}

/* cuda at world 1 is what the GPU model allocates: rl_gpu_model_plan's
 * device_bytes (gpu_bench --plan --dq-atomic 0, the trainer's options) on
 * the benchmark configs, with and without recompute */
Test(memory, cuda_matches_the_gpu_model_plan) {
    static const struct {
        int V, D, F, L, H, K, B, T, recompute;
        size_t bytes;
    } cases[] = {
        {50000, 768, 3072, 12, 12, 3, 64, 512, 1, 14292056064u},
        {50000, 768, 3072, 12, 12, 3, 64, 512, 0, 17613944832u},
        {32000, 2048, 5632, 22, 32, 4, 8, 2048, 1, 39833592320u},
        {32000, 2048, 5632, 22, 32, 4, 8, 2048, 0, 46527701504u},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rl_job_config c = base("cuda", "none");
        rl_model_config *m = &c.model;
        m->vocab_size = cases[i].V, m->hidden_size = cases[i].D, m->intermediate_size = cases[i].F;
        m->num_hidden_layers = cases[i].L, m->num_attention_heads = cases[i].H;
        m->num_key_value_heads = cases[i].K, m->max_position_embeddings = cases[i].T;
        c.train.micro_batch = cases[i].B, c.train.seq_len = cases[i].T, c.train.recompute = cases[i].recompute;
        cr_assert_eq(of(&c, 1).total, cases[i].bytes, "case %zu", i);
    }
}

Test(memory, what_it_cannot_account_for_is_named) {
    rl_train_memory m;
    rl_err e;
    rl_job_config c = base("auto", "none");
    cr_assert_eq(rl_train_memory_of(&c, 2, 0, &m, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "train.device"), "%s", e.msg);
    c = base("cpu", "none");
    cr_assert_eq(rl_train_memory_of(&c, 0, 0, &m, &e), RL_EINPUT);
    /* the caller's parameter count wins over the layout's */
    cr_assert_eq(rl_train_memory_of(&c, 2, 1000, &m, &e), RL_OK);
    cr_assert_eq(m.weights, 4000);
}
