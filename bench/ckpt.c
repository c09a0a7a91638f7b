/* Checkpoint costs, as JSON lines:
 *  - the training pause per checkpoint (the host snapshot, the only part
 *    the step waits for) next to the step time, on the embedded default
 *    config, and the snapshot alone for a 124M-parameter model;
 *  - the upload of a 1 GiB object to radosgw on loopback by pkg/s3
 *    (multipart, parts in parallel, every byte hashed) next to curl
 *    uploading the same bytes to the same server, alternating, in one run;
 *  - a whole checkpoint of a 34M-parameter model to radosgw from one rank
 *    (DDP: optimizer.safetensors) and from four (dist.shard: each rank its
 *    optimizer shard, in parallel, rank 0 committing), alternating, twice
 *    each: the save time and the optimizer bytes' rate.
 * The S3 half needs radosgw (scripts/deps.sh test); without it that half
 * says so and the bench fails. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "data/data.h"
#include "ddp/ddp.h"
#include "s3/s3.h"
#include "tests/support/rgwtest.h"
#include "train/train.h"

static int fail(const char *what, const rl_err *e) {
    fprintf(stderr, "bench ckpt: %s: %s\n", what, e->msg);
    return 1;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n ? v[n / 2] : 0;
}

/* Default config: steps 1..12, a checkpoint after every 4th. */
static int pause_default(const char *dir) {
    rl_err e = {0};
    rl_arith_opts ao = {.digits = 2, .holdout = 0.1, .seed = 7, .train_tokens = 400000};
    if (rl_arith_generate(&ao, dir, &e)) return fail("data", &e);
    rl_job_config c;
    rl_job_config_default(&c);
    snprintf(c.data.train, sizeof c.data.train, "%s/train_*.bin", dir);
    c.data.val[0] = c.data.eval_task[0] = '\0';
    snprintf(c.ckpt.uri, sizeof c.ckpt.uri, "file://%s/ck", dir);
    c.ckpt.every_steps = 4;
    c.train.steps = 12;
    rl_trainer *tr;
    if (rl_trainer_new(&tr, &c, NULL, &e) || rl_trainer_resume(tr, &e)) return fail("trainer", &e);
    double steps[12];
    int ns = 0;
    for (int i = 0; i < 12; i++) {
        rl_step_stats st;
        double t0 = rl_now();
        if (rl_trainer_step(tr, &st, &e)) return fail("step", &e);
        if (i > 0) steps[ns++] = rl_now() - t0; /* the first step warms caches */
        if (rl_trainer_boundary(tr, &e)) return fail("boundary", &e);
    }
    if (rl_ckpt_saver_wait(rl_trainer_saver(tr), 0, &e)) return fail("save", &e);
    rl_ckpt_save_info h[3];
    int nh = rl_ckpt_saver_history(rl_trainer_saver(tr), h, 3);
    double pauses[3];
    for (int i = 0; i < nh; i++) pauses[i] = h[i].t_snap_end - h[i].t_snap_begin;
    double p = median(pauses, nh), s = median(steps, ns);
    printf("{\"bench\":\"ckpt_pause\",\"config\":\"default\",\"params\":%zu,\"saves\":%d,\"pause_ms\":%.3f,"
           "\"step_ms\":%.2f,\"pause_share_of_step\":%.4f,\"bytes\":%llu}\n",
           rl_trainer_nparams(tr), nh, p * 1e3, s * 1e3, p / s, (unsigned long long)h[nh - 1].bytes);
    fflush(stdout);
    rl_trainer_free(tr);
    return 0;
}

/* 124M parameters (vocab 25600, hidden 768, 12 layers, SwiGLU ffn 2048,
 * 12 heads, untied head): the snapshot copies weights and both AdamW
 * moments, 12 bytes a parameter. */
static int pause_124m(const char *dir) {
    rl_err e = {0};
    rl_model_config mc;
    rl_model_config_default(&mc);
    mc.vocab_size = 25600, mc.hidden_size = 768, mc.num_hidden_layers = 12, mc.intermediate_size = 2048;
    mc.num_attention_heads = 12, mc.num_key_value_heads = 12, mc.max_position_embeddings = 1024;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &mc);
    size_t n = lay.total;
    float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    if (!p || !m || !v) return fprintf(stderr, "bench ckpt: out of memory\n"), 1;
    for (size_t i = 0; i < n; i++) p[i] = (float)(i % 97) * 1e-3f, m[i] = 0, v[i] = 0;
    char uri[600];
    snprintf(uri, sizeof uri, "file://%s/ck124", dir);
    rl_ckpt_store *st;
    rl_ckpt_saver *sv;
    rl_ckpt_saver_opts so = {.keep = 1};
    if (rl_ckpt_store_open(uri, &st, &e) || rl_ckpt_saver_create(st, n, &so, &sv, &e)) return fail("saver", &e);
    rl_ckpt_data d = {.model = mc, .n = n, .params = p, .m = m, .v = v, .config_json = "{}"};
    d.state.world_size = 1;
    double pauses[3];
    for (int i = 0; i < 3; i++) {
        bool started;
        d.state.step = i + 1;
        if (rl_ckpt_saver_save(sv, &d, false, 0, &started, &e) || rl_ckpt_saver_wait(sv, 0, &e)) return fail("save", &e);
        rl_ckpt_save_info last;
        rl_ckpt_saver_stats(sv, NULL, NULL, &last);
        pauses[i] = last.t_snap_end - last.t_snap_begin;
    }
    printf("{\"bench\":\"ckpt_pause\",\"config\":\"124m\",\"params\":%zu,\"saves\":3,\"pause_ms\":%.1f,"
           "\"snapshot_bytes\":%zu}\n", n, median(pauses, 3) * 1e3, 3 * n * 4);
    fflush(stdout);
    rl_ckpt_saver_destroy(sv);
    rl_ckpt_store_close(st);
    free(p), free(m), free(v);
    return 0;
}

/* ---- a checkpoint from 1 rank vs its shards from 4 ------------------------------------------ */
enum { SHARDS = 4 };
typedef struct {
    rl_ckpt_store *st;
    rl_ckpt_data d;
    rl_shard_range r[64];
    int rc;
    rl_err e;
    double s;
} shard_job;

static void *shard_save(void *arg) {
    shard_job *j = arg;
    rl_ckpt_write_opts o = {.keep = 1};
    double t0 = rl_now();
    j->rc = rl_ckpt_write(j->st, &j->d, &o, NULL, &j->e);
    j->s = rl_now() - t0;
    return NULL;
}

/* One save of step at world 1 (shards 0) or SHARDS: the wall time, rank 0's
 * commit included. The moments are the same buffers cut as DDP's buckets cut them. */
static int save_once(const rl_ckpt_data *whole, int world, long long step, const char *uri, double *secs,
                     rl_err *e) {
    shard_job j[SHARDS] = {0};
    pthread_t th[SHARDS];
    rl_train_bucket_plan plan;
    int rc = rl_train_bucket_plan_of(whole->n, 0, 0, 8, &plan, e);
    size_t boff[64], blen[64], left = whole->n;
    for (size_t b = 0; !rc && b < plan.count && b < 32; b++) blen[b] = rl_train_bucket_len(&plan, b), left -= blen[b], boff[b] = left;
    double t0 = rl_now();
    for (int r = 0; !rc && r < (world > 1 ? world : 1); r++) {
        if ((rc = rl_ckpt_store_open(uri, &j[r].st, e))) break;
        j[r].d = *whole;
        j[r].d.state.step = step;
        if (world > 1) { /* the moments' shard: its own copy, as a rank's would be */
            int k = rl_ddp_shard_plan(boff, blen, (int)plan.count, world, r, j[r].r);
            size_t held = 0;
            for (int i = 0; i < k; i++) held += j[r].r[i].len;
            float *m = malloc(2 * held * sizeof(float) + 1);
            for (int i = 0, at = 0; m && i < k; at += (int)j[r].r[i].len, i++) {
                memcpy(m + at, whole->m + j[r].r[i].off, j[r].r[i].len * 4);
                memcpy(m + held + at, whole->v + j[r].r[i].off, j[r].r[i].len * 4);
            }
            j[r].d.m = m, j[r].d.v = m + held, j[r].d.params = r == 0 ? whole->params : NULL;
            j[r].d.shard_rank = r, j[r].d.shard_world = world, j[r].d.ranges = j[r].r, j[r].d.nranges = k;
            j[r].d.shard_total = held, j[r].d.nonce = (uint64_t)step * 7919;
        }
    }
    if (!rc) t0 = rl_now();
    for (int r = 0; !rc && r < (world > 1 ? world : 1); r++) pthread_create(&th[r], NULL, shard_save, &j[r]);
    for (int r = 0; !rc && r < (world > 1 ? world : 1); r++) {
        pthread_join(th[r], NULL);
        if (j[r].rc && !rc) rc = j[r].rc, *e = j[r].e;
    }
    *secs = rl_now() - t0;
    for (int r = 0; r < SHARDS; r++) {
        if (world > 1) free((float *)j[r].d.m);
        rl_ckpt_store_close(j[r].st);
    }
    return rc;
}

static int sharded_saves(const rl_test_rgw *r, rl_s3 *s3) {
    rl_err e = {0};
    setenv("AWS_ACCESS_KEY_ID", r->access_key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", r->secret_key, 1);
    setenv("AWS_ENDPOINT_URL_S3", r->endpoint, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    rl_model_config mc;
    rl_model_config_default(&mc);
    mc.vocab_size = 16384, mc.hidden_size = 384, mc.num_hidden_layers = 12, mc.intermediate_size = 1024;
    mc.num_attention_heads = 8, mc.num_key_value_heads = 8, mc.max_position_embeddings = 1024;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &mc);
    size_t n = lay.total;
    float *p = malloc(3 * n * 4);
    if (!p) return fprintf(stderr, "bench ckpt: out of memory\n"), 1;
    for (size_t i = 0; i < 3 * n; i++) p[i] = (float)(i % 101) * 1e-3f;
    rl_ckpt_data d = {.model = mc, .n = n, .params = p, .m = p + n, .v = p + 2 * n, .config_json = "{}"};
    d.state.world_size = 1;
    double t1[2], t4[2];
    for (int k = 0; k < 2; k++) {
        if (save_once(&d, 1, 10 + k, "s3://bench/one", &t1[k], &e) ||
            save_once(&d, SHARDS, 10 + k, "s3://bench/four", &t4[k], &e)) {
            free(p);
            return fail("sharded save", &e);
        }
    }
    double a = t1[0] < t1[1] ? t1[0] : t1[1], b = t4[0] < t4[1] ? t4[0] : t4[1];
    /* the optimizer's bytes: 12 a parameter in one file (master, m, v), 8 in the shards (m, v) */
    /* radosgw's memory is the 1 GiB uploads' next */
    for (int k = 0; k < 2; k++) {
        rl_s3_list l;
        if (rl_s3_list_objects(s3, "bench", k ? "four/" : "one/", &l, &e) == RL_OK) {
            for (size_t i = 0; i < l.n; i++) rl_s3_delete(s3, "bench", l.keys[i], &e);
            rl_s3_list_free(&l);
        }
    }
    printf("{\"bench\":\"ckpt_sharded_save\",\"server\":\"radosgw loopback\",\"params\":%zu,\"ranks\":[1,%d],"
           "\"save_s\":[%.2f,%.2f],\"runs_1\":[%.2f,%.2f],\"runs_%d\":[%.2f,%.2f],\"speedup\":%.2f,"
           "\"optimizer_mib_s\":[%.1f,%.1f]}\n",
           n, SHARDS, a, b, t1[0], t1[1], SHARDS, t4[0], t4[1], a / b, 12.0 * n / a / 1048576, 8.0 * n / b / 1048576);
    fflush(stdout);
    free(p);
    return 0;
}

/* 1 GiB to radosgw: ours, then curl, twice each, alternating. */
static int upload(const char *dir) {
    const size_t size = (size_t)1 << 30;
    rl_test_rgw r;
    if (rl_test_rgw_start(&r, 6144) != 0) return fprintf(stderr, "bench ckpt: radosgw did not start\n"), 1;
    rl_err e = {0};
    int rc = 1;
    char *buf = malloc(size), file[600], cmd[2048];
    rl_s3 *s3 = NULL;
    rl_s3_cred_provider *cp = NULL;
    if (!buf) goto out;
    for (size_t i = 0; i < size; i += 8) *(uint64_t *)(buf + i) = i * 0x9E3779B97F4A7C15ull;
    snprintf(file, sizeof file, "%s/blob", dir);
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(buf, 1, size, f) != size || fclose(f) != 0) goto out;
    rl_s3_config c = {0};
    snprintf(c.endpoint, sizeof c.endpoint, "%s", r.endpoint);
    snprintf(c.region, sizeof c.region, "us-east-1");
    if (rl_s3_creds_static(r.access_key, r.secret_key, NULL, &cp, &e)) goto err;
    c.creds = cp, cp = NULL;
    if (rl_s3_open(&c, &s3, &e) || rl_s3_create_bucket(s3, "bench", &e)) goto err;
    if (sharded_saves(&r, s3)) goto out;
    double ours[2], theirs[2];
    for (int k = 0; k < 2; k++) {
        double t0 = rl_now();
        if (rl_s3_put(s3, "bench", "ours", &(rl_s3_part){buf, size}, 1, &e)) goto err;
        ours[k] = rl_now() - t0;
        /* curl signs with UNSIGNED-PAYLOAD: it hashes nothing, one stream */
        snprintf(cmd, sizeof cmd,
                 "curl -sS -f -o /dev/null -T %s --aws-sigv4 aws:amz:us-east-1:s3 --user %s:%s "
                 "-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' %s/bench/curl",
                 file, r.access_key, r.secret_key, r.endpoint);
        t0 = rl_now();
        if (system(cmd) != 0) {
            fprintf(stderr, "bench ckpt: curl upload failed\n");
            goto out;
        }
        theirs[k] = rl_now() - t0;
    }
    double o = ours[0] < ours[1] ? ours[0] : ours[1], t = theirs[0] < theirs[1] ? theirs[0] : theirs[1];
    printf("{\"bench\":\"s3_upload\",\"bytes\":%zu,\"server\":\"radosgw loopback\",\"ours_mib_s\":%.1f,"
           "\"curl_mib_s\":%.1f,\"ratio\":%.3f,\"ours_s\":[%.2f,%.2f],\"curl_s\":[%.2f,%.2f]}\n",
           size, size / o / 1048576, size / t / 1048576, t / o, ours[0], ours[1], theirs[0], theirs[1]);
    fflush(stdout);
    rc = 0;
    goto out;
err:
    fail("s3", &e);
out:
    if (s3) rl_s3_close(s3);
    rl_s3_creds_free(cp);
    free(buf);
    rl_test_rgw_stop(&r);
    return rc;
}

int main(void) {
    char dir[] = "/tmp/rlbench-ckpt-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    rl_log_set_level(RL_LOG_WARN);
    int rc = pause_default(dir);
    rc |= pause_124m(dir);
    rc |= upload(dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
