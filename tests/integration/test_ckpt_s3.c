/* Checkpoints in a real S3 server (Ceph's radosgw, which checks every
 * signature): exact resume after kill -9 on one and on two processes, a
 * damaged object detected and skipped, bad settings and read-only stores
 * refused before training starts, and a store that fills up mid-run
 * (a real bucket quota) stopping the run without losing a committed
 * checkpoint. Each test runs its own radosgw (rgwtest.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "faultproxy.h"
#include "rgwtest.h"
#include "s3/s3.h"
#include "s3/s3_internal.h"
#include "testutil.h"
#include "train/train.h"
#include "util/util.h"

#define BUCKET "rl-ckpt"
#define STEPS 40

static rl_test_rgw g_rgw = {.mon_pid = -1, .osd_pid = -1, .rgw_pid = -1};

/* radosgw up, its keys in the environment the workers inherit, the bucket made */
static void rgw_up(void) {
    cr_assert_eq(rl_test_rgw_start(&g_rgw, 768), 0, "radosgw did not start");
    setenv("AWS_ACCESS_KEY_ID", g_rgw.access_key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", g_rgw.secret_key, 1);
    setenv("AWS_ENDPOINT_URL_S3", g_rgw.endpoint, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    unsetenv("AWS_SESSION_TOKEN"), unsetenv("AWS_ROLE_ARN"), unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE");
    rl_s3_config c = {0};
    rl_s3 *s3;
    rl_err e = {0};
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_s3_create_bucket(s3, BUCKET, &e), 0, "%s", e.msg);
    rl_s3_close(s3);
}

static void rgw_down(void) { rl_test_rgw_stop(&g_rgw); }

/* The reference: STEPS uninterrupted steps, no checkpoints. */
static void reference(const char *dir, double *losses) {
    char log[128], out[128];
    snprintf(log, sizeof log, "%s/ref.log", dir);
    snprintf(out, sizeof out, "%s/ref.bin", dir);
    rl_test_write_job(dir, STEPS, 4096, "", "");
    const char *args[] = {"--save-params", out, NULL};
    int st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, args), 120);
    cr_assert_eq(st, 0, "the reference run failed (%d): see %s", st, log);
    cr_assert_eq(rl_test_step_losses(log, losses, STEPS + 1), STEPS);
}

/* Train towards STEPS with a checkpoint every 5 steps and kill -9 the
 * process once it is past step 20: the run must really die mid-way. */
static void train_and_kill(const char *dir, const char *uri, int world) {
    char log[128];
    snprintf(log, sizeof log, "%s/killed%d.log", dir, world);
    unlink(log); /* an old log's steps must not be taken for this run's */
    rl_test_write_job(dir, STEPS, 4096, uri, ",\"every_steps\":5");
    int p = rl_test_spawn_worker(dir, log, -1, 1, 0, NULL);
    double t0 = rl_now();
    while (rl_test_last_step(log) < 20 && rl_now() - t0 < 120) usleep(2000);
    kill(p, SIGKILL);
    int st = rl_test_wait_status(p, 30);
    long long at = rl_test_last_step(log);
    cr_assert_eq(st, 128 + SIGKILL, "the run was not killed mid-way (status %d, last step %lld)", st, at);
    cr_assert(at >= 20 && at < STEPS, "killed at step %lld", at);
}

/* The step the log says it resumed from. */
static long long resumed_from(const char *log) {
    char *t;
    size_t len;
    rl_err e;
    cr_assert_eq(rl_read_file(log, &t, &len, &e), 0, "%s", e.msg);
    char *r = strstr(t, "\"event\":\"resume\"");
    char *s = r ? strstr(r, "\"step\":") : NULL;
    long long v = s && strstr(r, "\"found\":true") ? atoll(s + 7) : -1;
    free(t);
    return v;
}

Test(ckpt_s3, exact_resume_after_kill9_on_one_and_on_two_processes, .init = rgw_up, .fini = rgw_down,
     .timeout = 600) {
    char dir[64], uri[128], log[128], out[128], p[160];
    double ref[STEPS + 1] = {0}, got[STEPS + 1];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    reference(dir, ref);
    size_t n_ref, n_got;
    snprintf(p, sizeof p, "%s/ref.bin", dir);
    float *pref = rl_test_read_floats(p, &n_ref);
    for (int world = 1; world <= 2; world++) {
        snprintf(uri, sizeof uri, "s3://" BUCKET "/exact/w%d", world);
        train_and_kill(dir, uri, world);
        /* a fresh start resumes from the newest committed checkpoint in S3 */
        snprintf(log, sizeof log, "%s/resume%d.log", dir, world);
        snprintf(out, sizeof out, "%s/resume%d.bin", dir, world);
        /* world 1: this very process; world 2: the local launcher's two ranks */
        const char *args[] = {"--save-params", out, world == 2 ? "--nproc-per-node" : NULL, "2", NULL};
        int st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, args), 300);
        cr_assert_eq(st, 0, "the resumed run failed (%d): see %s", st, log);
        long long from = resumed_from(log);
        /* the save of step 20 may still have been uploading at the kill */
        cr_assert(from >= 5 && from % 5 == 0 && from < STEPS, "resumed from step %lld", from);
        for (int i = 0; i <= STEPS; i++) got[i] = NAN;
        cr_assert_eq(rl_test_step_losses(log, got, STEPS + 1), STEPS);
        float *pgot = rl_test_read_floats(out, &n_got);
        cr_assert_eq(n_got, n_ref);
        if (world == 1) {
            /* same world size: bit for bit */
            for (long long s = from + 1; s <= STEPS; s++)
                cr_expect(memcmp(&got[s], &ref[s], sizeof got[s]) == 0, "step %lld loss %.17g vs %.17g", s, got[s], ref[s]);
            cr_expect_eq(memcmp(pgot, pref, n_ref * 4), 0, "final parameters differ from the uninterrupted run");
        } else {
            /* another world size sums the same samples in another order */
            double worst = 0;
            for (long long s = from + 1; s <= STEPS; s++) worst = fmax(worst, fabs(got[s] - ref[s]) / fabs(ref[s]));
            double dn = 0, nn = 0;
            for (size_t i = 0; i < n_ref; i++)
                dn += ((double)pgot[i] - pref[i]) * ((double)pgot[i] - pref[i]), nn += (double)pref[i] * pref[i];
            cr_log_info("resumed on 2 processes from step %lld: losses within %.3g, parameters within %.3g relative",
                        from, worst, sqrt(dn / nn));
            cr_expect(worst < 1e-6, "losses differ by %.3g relative", worst);
            cr_expect(sqrt(dn / nn) < 1e-5, "parameters differ by %.3g relative", sqrt(dn / nn));
        }
        free(pgot);
    }
    free(pref);
    rl_test_rmdir(dir);
}

Test(ckpt_s3, a_flipped_byte_is_detected_and_the_previous_checkpoint_used, .init = rgw_up, .fini = rgw_down,
     .timeout = 300) {
    char dir[64], log[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    const char *uri = "s3://" BUCKET "/flip";
    rl_test_write_job(dir, 10, 512, uri, ",\"every_steps\":5");
    snprintf(log, sizeof log, "%s/first.log", dir);
    cr_assert_eq(rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 120), 0, "see %s", log);
    /* one byte of the newest model file, flipped in place on the server */
    rl_s3_config c = {0};
    rl_s3 *s3;
    rl_err e = {0};
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    const char *key = "flip/step-00000010/model.safetensors";
    void *buf;
    size_t n;
    cr_assert_eq(rl_s3_get(s3, BUCKET, key, 0, UINT64_MAX, &buf, &n, &e), 0, "%s", e.msg);
    ((unsigned char *)buf)[n - 3] ^= 0x40;
    cr_assert_eq(rl_s3_put(s3, BUCKET, key, &(rl_s3_part){buf, n}, 1, &e), 0, "%s", e.msg);
    free(buf);
    rl_s3_close(s3);
    snprintf(log, sizeof log, "%s/second.log", dir);
    cr_assert_eq(rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 120), 0, "see %s", log);
    cr_expect_eq(resumed_from(log), 5, "must resume from step 5, see %s", log);
    cr_expect(rl_test_file_has(log, "\"event\":\"checkpoint_fallback\"") && rl_test_file_has(log, "step-00000010/model.safetensors"),
              "the fallback must be logged naming the damaged file (%s)", log);
    rl_test_rmdir(dir);
}

Test(ckpt_s3, bad_bucket_and_bad_credentials_stop_before_training, .init = rgw_up, .fini = rgw_down,
     .timeout = 180) {
    char dir[64], log[128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    snprintf(log, sizeof log, "%s/log", dir);
    /* a bucket that does not exist */
    rl_test_write_job(dir, 10, 512, "s3://no-such-bucket/x", "");
    int st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60);
    cr_expect_eq(st, 2, "exit status %d", st);
    cr_expect(rl_test_file_has(log, "NoSuchBucket") && rl_test_file_has(log, "s3://no-such-bucket/x"), "see %s", log);
    cr_expect(!rl_test_file_has(log, "\"event\":\"step\""), "training must not start");
    /* a wrong secret: refused, and the secret never printed */
    rl_test_write_job(dir, 10, 512, "s3://" BUCKET "/x", "");
    setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789", 1);
    st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60);
    cr_expect_eq(st, 2, "exit status %d", st);
    cr_expect(rl_test_file_has(log, "SignatureDoesNotMatch"), "see %s", log);
    cr_expect(!rl_test_file_has(log, "not-the-secret") && !rl_test_file_has(log, g_rgw.secret_key), "a secret reached the log");
    cr_expect(!rl_test_file_has(log, "\"event\":\"step\""), "training must not start");
    rl_test_rmdir(dir);
}

/* The worker's last line ("ringleader-worker: error: ...") into out. */
static void last_error_line(const char *log, char *out, size_t n) {
    char *t;
    size_t len;
    rl_err e;
    out[0] = '\0';
    cr_assert_eq(rl_read_file(log, &t, &len, &e), 0, "%s", e.msg);
    for (char *l = strstr(t, "ringleader-worker: error: "); l; l = strstr(l + 1, "ringleader-worker: error: ")) {
        size_t ll = strcspn(l, "\n");
        snprintf(out, n, "%.*s", (int)ll, l);
    }
    free(t);
}

/* An S3 client as the worker would make it, from the environment. */
static rl_s3 *env_client(void) {
    rl_s3_config c = {0};
    rl_s3 *s3;
    rl_err e = {0};
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    return s3;
}

/* PutBucketPolicy is no call a trainer makes (the bucket is the user's),
 * so the test sends it itself, signed by our client like every other. */
static void put_bucket_policy(rl_s3 *s3, const char *bucket, const char *policy) {
    rl_s3_part p = {policy, strlen(policy)};
    rl_s3_call c = {.method = "PUT", .op = "PutBucketPolicy", .bucket = bucket, .query = "policy", .parts = &p,
                    .nparts = 1, .len = p.len};
    rl_http_resp r = {0};
    rl_err e = {0};
    cr_assert_eq(rl_s3_do(s3, s3->h, &c, &r, &e), 0, "%s", e.msg);
    rl_http_resp_free(&r);
}

static size_t count_keys(rl_s3 *s3, const char *bucket, const char *prefix) {
    rl_s3_list l;
    rl_err e = {0};
    cr_assert_eq(rl_s3_list_objects(s3, bucket, prefix, &l, &e), 0, "%s", e.msg);
    size_t n = l.n;
    rl_s3_list_free(&l);
    return n;
}

/* The worker against uri stops before training: exit 2, its last line
 * names the URI, the refused operation and the server's code, no step
 * ran, no secret was printed. */
static void expect_refused(const char *dir, const char *uri, const char *op, const char *code, const char *secret) {
    char log[128], line[1024];
    snprintf(log, sizeof log, "%s/refused.log", dir);
    unlink(log);
    rl_test_write_job(dir, 10, 512, uri, ",\"every_steps\":5");
    int st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60);
    cr_expect_eq(st, 2, "%s: exit status %d, see %s", uri, st, log);
    last_error_line(log, line, sizeof line);
    cr_log_info("%s", line);
    cr_expect(strstr(line, uri) && strstr(line, op) && strstr(line, code), "%s: want %s and %s in: %s", uri, op, code,
              line);
    cr_expect(!rl_test_file_has(log, "\"event\":\"step\"") && !rl_test_file_has(log, "\"event\":\"train_start\""),
              "%s: training must not start (%s)", uri, log);
    cr_expect(!rl_test_file_has(log, secret), "a secret reached the log (%s)", log);
}

Test(ckpt_s3, a_read_only_store_stops_before_training, .init = rgw_up, .fini = rgw_down, .timeout = 180) {
    char dir[64], rkey[32], rsecret[64];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    /* Read-only, as a user meets it: a second user whose credentials the
     * bucket's policy lets read and list only (an evaluation job's keys
     * given to a trainer); the owner under an explicit Deny of PutObject
     * on a prefix (a locked archive); and a prefix where writes work but
     * DeleteObject is denied (write-once), which the probe's delete must
     * catch. radosgw answers all three with 403 AccessDenied. */
    cr_assert_eq(rl_test_rgw_add_user(&g_rgw, "reader", rkey, rsecret), 0, "radosgw-admin user create failed");
    rl_s3 *owner = env_client();
    put_bucket_policy(owner, BUCKET,
                      "{\"Version\":\"2012-10-17\",\"Statement\":["
                      "{\"Effect\":\"Allow\",\"Principal\":{\"AWS\":[\"arn:aws:iam:::user/reader\"]},"
                      "\"Action\":[\"s3:GetObject\",\"s3:ListBucket\"],"
                      "\"Resource\":[\"arn:aws:s3:::" BUCKET "\",\"arn:aws:s3:::" BUCKET "/*\"]},"
                      "{\"Effect\":\"Deny\",\"Principal\":\"*\",\"Action\":[\"s3:PutObject\"],"
                      "\"Resource\":[\"arn:aws:s3:::" BUCKET "/locked/*\"]},"
                      "{\"Effect\":\"Deny\",\"Principal\":\"*\",\"Action\":[\"s3:DeleteObject\"],"
                      "\"Resource\":[\"arn:aws:s3:::" BUCKET "/worm/*\"]}]}");
    /* a checkpoint the reader could read: being able to resume is not enough */
    rl_err e = {0};
    cr_assert_eq(rl_s3_put(owner, BUCKET, "ro/latest", &(rl_s3_part){"step-00000005\n", 14}, 1, &e), 0, "%s", e.msg);

    setenv("AWS_ACCESS_KEY_ID", rkey, 1);
    setenv("AWS_SECRET_ACCESS_KEY", rsecret, 1);
    expect_refused(dir, "s3://" BUCKET "/ro", "PutObject", "403 AccessDenied", rsecret);
    setenv("AWS_ACCESS_KEY_ID", g_rgw.access_key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", g_rgw.secret_key, 1);
    expect_refused(dir, "s3://" BUCKET "/locked", "PutObject", "403 AccessDenied", g_rgw.secret_key);
    expect_refused(dir, "s3://" BUCKET "/worm", "DeleteObject", "403 AccessDenied", g_rgw.secret_key);
    char log[128];
    snprintf(log, sizeof log, "%s/refused.log", dir);
    cr_expect(rl_test_file_has(log, "deletes are refused"), "the delete refusal must be explained (%s)", log);
    /* nothing written, bar the probe object the write-once prefix keeps */
    cr_expect_eq(count_keys(owner, BUCKET, "ro/"), 1);
    cr_expect_eq(count_keys(owner, BUCKET, "locked/"), 0);
    cr_expect_eq(count_keys(owner, BUCKET, "worm/"), 1);
    rl_s3_close(owner);
    rl_test_rmdir(dir);
}

#define FULL "rl-full" /* as long as BUCKET: the calibration's trainer_state.json is the same size */

/* The model the test jobs train, as the worker reads it from DIR/job.json. */
static void job_model(const char *dir, rl_model_config *mc) {
    char p[128], *t;
    size_t len;
    rl_err e = {0};
    snprintf(p, sizeof p, "%s/job.json", dir);
    cr_assert_eq(rl_read_file(p, &t, &len, &e), 0, "%s", e.msg);
    rl_job_config *jc = calloc(1, sizeof *jc);
    rl_job_config_default(jc);
    cr_assert_eq(rl_job_config_parse(t, len, p, jc, &e), 0, "%s", e.msg);
    *mc = jc->model;
    free(jc), free(t);
}

/* Committed and uncommitted steps under uri; each committed one read back
 * and verified against its manifest (sizes, sha256, shapes). */
static void check_store(const char *uri, const rl_model_config *mc, const long long *want_c, int nwc, int want_u) {
    rl_ckpt_store *s;
    rl_err e = {0};
    cr_assert_eq(rl_ckpt_store_open(uri, &s, &e), 0, "%s", e.msg);
    long long *c, *u;
    int nc, nu;
    cr_assert_eq(rl_ckpt_steps(s, &c, &nc, &u, &nu, &e), 0, "%s", e.msg);
    char have[256] = "";
    for (int i = 0; i < nc; i++) snprintf(have + strlen(have), sizeof have - strlen(have), " %lld", c[i]);
    cr_expect_eq(nc, nwc, "%s: committed steps:%s", uri, have);
    for (int i = 0; i < nc && i < nwc; i++) cr_expect_eq(c[i], want_c[i], "%s: committed steps:%s", uri, have);
    cr_expect_eq(nu, want_u, "%s: %d step directories without a manifest", uri, nu);
    rl_param_layout lay;
    rl_param_layout_init(&lay, mc);
    for (int i = 0; i < nc; i++) {
        rl_ckpt_loaded ld = {0};
        cr_expect_eq(rl_ckpt_read_step(s, c[i], mc, lay.total, NULL, NULL, NULL, &ld, &e), 0, "step %lld: %s", c[i],
                     e.msg);
        rl_ckpt_loaded_free(&ld);
    }
    free(c), free(u);
    rl_ckpt_store_close(s);
}

Test(ckpt_s3, a_store_that_fills_mid_run_stops_it_and_keeps_every_committed_checkpoint, .init = rgw_up,
     .fini = rgw_down, .timeout = 240) {
    char dir[64], log[128], line[1024];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_model_config mc;
    rl_s3 *s3 = env_client();
    rl_err e = {0};
    cr_assert_eq(rl_s3_create_bucket(s3, FULL, &e), 0, "%s", e.msg);
    /* C, one checkpoint's bytes: one save of the same job elsewhere */
    const char *extra = ",\"every_steps\":5,\"keep\":2";
    rl_test_write_job(dir, 5, 512, "s3://" BUCKET "/full", extra);
    snprintf(log, sizeof log, "%s/calibrate.log", dir);
    cr_assert_eq(rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60), 0, "see %s", log);
    rl_s3_list l;
    cr_assert_eq(rl_s3_list_objects(s3, BUCKET, "full/step-00000005/", &l, &e), 0, "%s", e.msg);
    uint64_t C = 0;
    for (size_t i = 0; i < l.n; i++) C += l.sizes[i];
    rl_s3_list_free(&l);
    cr_assert(C > 100000, "a checkpoint of %llu bytes", (unsigned long long)C);

    /* Room for 2.5 checkpoints with keep 2: steps 5 and 10 commit; step
     * 15 needs a third before step 5 may go, and the server refuses its
     * optimizer file (the model file still fits). Deleting step 5 first
     * would have made room: the failure itself shows it was not done. */
    cr_assert_eq(rl_test_rgw_bucket_quota(&g_rgw, FULL, (long long)(2 * C + C / 2)), 0, "radosgw-admin quota failed");
    const char *uri = "s3://" FULL "/full";
    rl_test_write_job(dir, 30, 512, uri, extra);
    job_model(dir, &mc);
    snprintf(log, sizeof log, "%s/full.log", dir);
    int st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60);
    last_error_line(log, line, sizeof line);
    cr_log_info("%s", line);
    cr_expect_eq(st, 2, "exit status %d, see %s", st, log);
    cr_expect(strstr(line, FULL "/full/step-00000015/optimizer.safetensors") && strstr(line, "403 QuotaExceeded") &&
                  strstr(line, "step 15 not committed"),
              "want the object, the server's code and what it means in: %s", line);
    long long last = rl_test_last_step(log);
    cr_expect(last >= 15 && last < 30, "the run must stop soon after the failed save, not at step %lld", last);
    cr_expect(!rl_test_file_has(log, "\"event\":\"checkpoint_prune\""), "nothing may be pruned (%s)", log);
    /* every committed checkpoint is there and verifies; 15 is a manifest-less
     * leftover; latest still names 10 */
    check_store(uri, &mc, (long long[]){5, 10}, 2, 1);
    void *b;
    size_t n;
    cr_assert_eq(rl_s3_get(s3, FULL, "full/latest", 0, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 14 && !memcmp(b, "step-00000010\n", 14), "latest: %.*s", (int)n, (char *)b);
    free(b);

    /* Full before a start: the probe's own write is refused, and nothing trains. */
    cr_assert_eq(rl_test_rgw_bucket_quota(&g_rgw, FULL, (long long)(2 * C)), 0, "radosgw-admin quota failed");
    expect_refused(dir, uri, "PutObject", "403 QuotaExceeded", g_rgw.secret_key);

    /* Room for keep + 1 (the documented need) and a half: the restart
     * resumes from 10, not the leftover, replaces 15, and can finish only
     * if each older checkpoint is pruned after the newer one commits. */
    cr_assert_eq(rl_test_rgw_bucket_quota(&g_rgw, FULL, (long long)(3 * C + C / 2)), 0, "radosgw-admin quota failed");
    rl_test_write_job(dir, 30, 512, uri, extra);
    snprintf(log, sizeof log, "%s/resume.log", dir);
    st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, NULL), 60);
    cr_expect_eq(st, 0, "the resumed run failed (%d): see %s", st, log);
    cr_expect_eq(resumed_from(log), 10, "must resume from the last committed step (%s)", log);
    cr_expect_eq(rl_test_last_step(log), 30, "see %s", log);
    cr_expect(rl_test_file_has(log, "\"event\":\"checkpoint_replace\""), "the leftover of step 15 is replaced (%s)",
              log);
    check_store(uri, &mc, (long long[]){25, 30}, 2, 0);
    rl_s3_close(s3);
    rl_test_rmdir(dir);
}

/* What a rank killed mid-shard leaves in S3: an upload begun, a part sent,
 * never completed (its parts kept, and billed, until aborted), in a step
 * directory without a manifest. A sharded run's next commit prunes that
 * directory and aborts the upload: radosgw holds none afterwards. */
Test(ckpt_s3, a_killed_writers_unfinished_upload_is_aborted_by_the_next_commit, .init = rgw_up, .fini = rgw_down,
     .timeout = 240) {
    char dir[64], path[256], js[1536], cmd[1024], err[4096];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_s3_config c = {0};
    rl_s3 *s3;
    rl_err e = {0};
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    const char *key = "zero/step-00000012/optimizer-00001-of-00002.safetensors";
    cr_assert_eq(rl_s3_put(s3, BUCKET, "zero/step-00000012/model.safetensors", &(rl_s3_part){"partial", 7}, 1, &e), 0,
                 "%s", e.msg);
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    rl_s3_call create = {.method = "POST", .op = "CreateMultipartUpload", .bucket = BUCKET, .key = key,
                         .query = "uploads", .payload_sha256 = empty_sha, .collect = true};
    rl_http_resp r = {0};
    char id[1024], q[1200];
    cr_assert_eq(rl_s3_do(s3, s3->h, &create, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_s3_parse_upload_id(r.body, r.body_len, id, sizeof id, &e), 0, "%s", e.msg);
    rl_http_resp_free(&r);
    char *part = calloc(1, 5 << 20);
    snprintf(q, sizeof q, "partNumber=1&uploadId=%s", id);
    rl_s3_call up = {.method = "PUT", .op = "UploadPart", .bucket = BUCKET, .key = key, .query = q,
                     .parts = &(rl_s3_part){part, 5 << 20}, .nparts = 1, .len = 5 << 20};
    cr_assert_eq(rl_s3_do(s3, s3->h, &up, &r, &e), 0, "%s", e.msg);
    rl_http_resp_free(&r);
    free(part);
    rl_s3_uploads u;
    cr_assert_eq(rl_s3_list_uploads(s3, BUCKET, "zero/", &u, &e), 0, "%s", e.msg);
    cr_assert(u.n == 1 && !strcmp(u.keys[0], key) && !strcmp(u.ids[0], id), "%zu uploads before the run", u.n);
    rl_s3_uploads_free(&u);
    /* 2 ranks, ZeRO-2, checkpoints at 5, 10, 15: the commit of 15 prunes step 12 */
    snprintf(path, sizeof path, "%s/job.json", dir);
    snprintf(js, sizeof js,
             "{" RL_TEST_TINY_MODEL_JSON
             "\"train\":{\"steps\":15,\"warmup_steps\":2,\"seq_len\":32,\"micro_batch\":4,\"global_batch_tokens\":1024,"
             "\"eval_every\":0,\"eval_batches\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"timeout_s\":30,\"shard\":\"gradients\"},"
             "\"checkpoint\":{\"uri\":\"s3://" BUCKET "/zero\",\"every_steps\":5}}", dir);
    rl_test_write(path, js, strlen(js));
    snprintf(cmd, sizeof cmd, "(%s/ringleader-worker --config %s --nproc-per-node 2 2>%s/log >/dev/null; s=$?; "
             "tail -c 1500 %s/log >&2; exit $s)", rl_test_bindir(), path, dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/log", dir);
    cr_expect(rl_test_file_has(path, "\"event\":\"checkpoint_abort_upload\""), "no abort logged");
    cr_assert_eq(rl_s3_list_uploads(s3, BUCKET, "zero/", &u, &e), 0, "%s", e.msg);
    cr_expect_eq(u.n, 0, "%zu uploads left half-finished (first: %s)", u.n, u.n ? u.keys[0] : "");
    rl_s3_uploads_free(&u);
    rl_s3_list l;
    cr_assert_eq(rl_s3_list_objects(s3, BUCKET, "zero/step-00000015/", &l, &e), 0, "%s", e.msg);
    int shards = 0;
    for (size_t i = 0; i < l.n; i++) shards += strstr(l.keys[i], "-of-00002.safetensors") != NULL;
    cr_expect_eq(shards, 2, "step 15 holds %d optimizer shards", shards);
    rl_s3_list_free(&l);
    cr_assert_eq(rl_s3_list_objects(s3, BUCKET, "zero/step-00000012/", &l, &e), 0, "%s", e.msg);
    cr_expect_eq(l.n, 0, "step 12's partial save is still there");
    rl_s3_list_free(&l);
    rl_s3_close(s3);
    rl_test_rmdir(dir);
}

/* "latest"'s step, -1 when absent */
static long long latest_step(rl_s3 *s3, const char *prefix) {
    char key[128], text[64] = "";
    void *b = NULL;
    size_t n = 0;
    bool found = false;
    rl_err e = {0};
    snprintf(key, sizeof key, "%s/latest", prefix);
    cr_assert_eq(rl_s3_head(s3, BUCKET, key, &found, NULL, &e), 0, "%s", e.msg);
    if (!found) return -1;
    cr_assert_eq(rl_s3_get(s3, BUCKET, key, 0, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    memcpy(text, b, n < sizeof text - 1 ? n : sizeof text - 1);
    free(b);
    const char *d = strstr(text, "step-");
    return d ? atoll(d + 5) : -1;
}

static bool has_manifest(rl_s3 *s3, const char *prefix, long long step) {
    char key[128];
    bool found = false;
    rl_err e = {0};
    snprintf(key, sizeof key, "%s/step-%08lld/manifest.json", prefix, step);
    cr_assert_eq(rl_s3_head(s3, BUCKET, key, &found, NULL, &e), 0, "%s", e.msg);
    return found;
}

static size_t uploads_under(rl_s3 *s3, const char *prefix) {
    rl_s3_uploads u;
    rl_err e = {0};
    cr_assert_eq(rl_s3_list_uploads(s3, BUCKET, prefix, &u, &e), 0, "%s", e.msg);
    size_t n = u.n;
    rl_s3_uploads_free(&u);
    return n;
}

/* The rank killed mid-save, as processes: 2 ranks of ZeRO-2 save
 * every 5 steps through a proxy to radosgw, each rank's optimizer shard
 * (~6 MiB) in 5 MiB parts. At step 10 the proxy holds rank 1's second part
 * (its upload begun, a part in) and the test SIGKILLs rank 1 there. Rank
 * 0, waiting for that shard's receipt, never commits step 10: `latest` and
 * the newest manifest stay at step 5, and radosgw holds the unfinished
 * upload. A fresh start resumes from 5 and its commits abort the upload:
 * none is left. */
Test(ckpt_s3, a_rank_killed_while_writing_its_shard_leaves_the_previous_checkpoint_newest, .init = rgw_up,
     .fini = rgw_down, .timeout = 420) {
    char dir[64], path[256], js[2048], log[256], uri[64] = "s3://" BUCKET "/kill";
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_fault_proxy *px;
    cr_assert_eq(rl_fault_proxy_start("127.0.0.1", g_rgw.port, &px), 0);
    rl_fault_proxy_inject(px, RL_FAULT_HOLD, 1, "step-00000010/optimizer-00001-of-00002.safetensors?partNumber=2");
    /* 1.6M parameters: 0.8M a shard, 6.4 MB of moments, two parts */
    snprintf(path, sizeof path, "%s/job.json", dir);
    snprintf(js, sizeof js,
             "{\"model\":{\"hidden_size\":128,\"intermediate_size\":512,\"num_hidden_layers\":6,\"num_attention_heads\":4,"
             "\"max_position_embeddings\":64},"
             "\"train\":{\"steps\":15,\"warmup_steps\":2,\"seq_len\":32,\"micro_batch\":4,\"global_batch_tokens\":256,"
             "\"eval_every\":0,\"eval_batches\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"timeout_s\":30,\"shard\":\"gradients\"},"
             "\"checkpoint\":{\"uri\":\"%s\",\"every_steps\":5,\"preempt_budget_s\":5,"
             "\"s3\":{\"endpoint\":\"http://127.0.0.1:%d\",\"part_mb\":5}}}",
             dir, uri, rl_fault_proxy_port(px));
    rl_test_write(path, js, strlen(js));
    const char *two[] = {"--nproc-per-node", "2", NULL};
    snprintf(log, sizeof log, "%s/killed.log", dir);
    int p = rl_test_spawn_worker(dir, log, -1, 1, 0, two);
    double t0 = rl_now();
    while (rl_fault_proxy_injected(px) < 1 && rl_now() - t0 < 240) usleep(20000);
    cr_assert_eq(rl_fault_proxy_injected(px), 1, "rank 1 never sent step 10's second part: see %s", log);
    int child = rl_test_spawned_pid(log, 1);
    cr_assert(child > 0, "no spawned line for rank 1: see %s", log);
    kill(child, SIGKILL);
    int st = rl_test_wait_status(p, 120);
    cr_assert(st != 0 && st != -1, "the job must fail when rank 1 dies (status %d): see %s", st, log);

    rl_s3_config c = {0};
    rl_s3 *s3;
    rl_err e = {0};
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    cr_expect(has_manifest(s3, "kill", 5), "step 5 was committed");
    cr_expect(!has_manifest(s3, "kill", 10), "step 10 committed without rank 1's shard: see %s", log);
    cr_expect_eq(latest_step(s3, "kill"), 5, "latest moved past the last whole checkpoint: see %s", log);
    cr_expect_geq(uploads_under(s3, "kill/"), 1, "the kill did not land mid-upload");

    snprintf(log, sizeof log, "%s/resumed.log", dir);
    st = rl_test_wait_status(rl_test_spawn_worker(dir, log, -1, 1, 0, two), 240);
    cr_assert_eq(st, 0, "the restarted job failed (%d): see %s", st, log);
    cr_expect_eq(resumed_from(log), 5, "must resume from step 5: see %s", log);
    cr_expect(has_manifest(s3, "kill", 15));
    cr_expect_eq(latest_step(s3, "kill"), 15);
    cr_expect_eq(uploads_under(s3, "kill/"), 0, "an unfinished upload survived the next commits: see %s", log);
    rl_s3_close(s3);
    rl_fault_proxy_stop(px);
    rl_test_rmdir(dir);
}
