/* Checkpoints in a real S3 server (Ceph's radosgw, which checks every
 * signature): exact resume after kill -9 on one and on two processes, a
 * damaged object detected and skipped, and bad settings refused before
 * training starts. Each test runs its own radosgw (rgwtest.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "rgwtest.h"
#include "s3/s3.h"
#include "testutil.h"
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
