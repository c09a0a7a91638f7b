#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "children.h"
#include "data/data.h"
#include "util/util.h"

void rl_test_arith_dir(char *dir, size_t n, uint64_t tokens) {
    snprintf(dir, n, "/tmp/rltest-XXXXXX");
    cr_assert(mkdtemp(dir) != NULL);
    rl_arith_opts o = {.digits = 2, .holdout = 0.1, .seed = 7, .train_tokens = tokens};
    rl_err e;
    cr_assert_eq(rl_arith_generate(&o, dir, &e), 0, "%s", e.msg);
}

void rl_test_rmdir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

const char *rl_test_bindir(void) {
    static char abs[4096];
    const char *b = getenv("RL_TEST_BIN");
    if (!realpath(b && *b ? b : "bin", abs)) cr_assert_fail("binaries not found: build them first");
    return abs;
}

int rl_test_run(const char *cmd, char *err, size_t n) {
    char errfile[] = "/tmp/rltest-err-XXXXXX";
    int fd = mkstemp(errfile);
    cr_assert(fd >= 0);
    close(fd);
    char full[4096];
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, errfile);
    int st = system(full);
    FILE *f = fopen(errfile, "r");
    size_t got = f ? fread(err, 1, n - 1, f) : 0;
    err[got] = '\0';
    if (f) fclose(f);
    unlink(errfile);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void rl_test_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

int rl_test_spawn_worker(const char *dir, const char *log, int rank, int world, int port,
                         const char *const *extra_args) {
    pid_t pid = fork();
    if (pid == 0) {
        if (rank >= 0) {
            char v[32];
            snprintf(v, sizeof v, "%d", rank), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", world), setenv("WORLD_SIZE", v, 1), setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
        }
        /* spinning OpenMP threads crawl on two cores shared with other tests */
        setenv("OMP_NUM_THREADS", "1", 1);
        char cfg[256], exe[4200];
        snprintf(cfg, sizeof cfg, "%s/job.json", dir);
        snprintf(exe, sizeof exe, "%s/ringleader-worker", rl_test_bindir());
        const char *argv[32] = {exe, "--config", cfg};
        int n = 3;
        for (int i = 0; extra_args && extra_args[i] && n < 31; i++) argv[n++] = extra_args[i];
        argv[n] = NULL;
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(126);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int rl_test_wait_status(int p, double limit_s) {
    pid_t pid = p;
    int st;
    rl_test_wait_n(&pid, 1, limit_s, &st);
    return rl_test_exit_code(st);
}

/* Walks the "step" events of a log: the highest step, and each step's loss. */
static long long each_step(const char *log, double *losses, int max) {
    char *t;
    size_t len;
    rl_err e;
    if (rl_read_file(log, &t, &len, &e)) return -1;
    long long hi = -1;
    /* rank 0 of a distributed run puts "rank" between the event and the step */
    for (char *q = t; (q = strstr(q, "\"event\":\"step\",")); q++) {
        char *v = strstr(q, "\"step\":"), *l = strstr(q, "\"loss\":");
        if (!v) continue;
        long long s = atoll(v + 7);
        if (s > hi) hi = s;
        if (losses && l && s >= 0 && s < max) losses[s] = strtod(l + 7, NULL);
    }
    free(t);
    return hi;
}

long long rl_test_last_step(const char *log) { return each_step(log, NULL, 0); }

long long rl_test_step_losses(const char *log, double *losses, int max) { return each_step(log, losses, max); }

void rl_test_write_job(const char *dir, long long steps, int global_tokens, const char *ckpt_uri,
                       const char *extra_ckpt) {
    char path[256], uri[600], js[4096];
    snprintf(path, sizeof path, "%s/job.json", dir);
    if (ckpt_uri) snprintf(uri, sizeof uri, "%s", ckpt_uri);
    else snprintf(uri, sizeof uri, "file://%s/ck", dir);
    snprintf(js, sizeof js,
             "{" RL_TEST_TINY_MODEL_JSON
             "\"train\":{\"steps\":%lld,\"warmup_steps\":2,\"seq_len\":32,\"micro_batch\":4,\"global_batch_tokens\":%d,"
             "\"eval_every\":0,\"eval_batches\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"timeout_s\":30,\"first_bucket_mb\":0.05,\"bucket_mb\":0.25},"
             "\"checkpoint\":{\"uri\":\"%s\"%s}}",
             steps, global_tokens, dir, uri, extra_ckpt);
    rl_test_write(path, js, strlen(js));
}

int rl_test_spawned_pid(const char *log, int rank) {
    char *text, want[64];
    size_t len;
    rl_err e;
    if (rl_read_file(log, &text, &len, &e)) return -1;
    snprintf(want, sizeof want, "\"event\":\"spawned\",\"rank\":%d,", rank);
    const char *sp = strstr(text, want), *pid = sp ? strstr(sp, "\"pid\":") : NULL;
    int r = pid ? atoi(pid + 6) : -1;
    free(text);
    return r > 0 ? r : -1;
}

bool rl_test_file_has(const char *path, const char *needle) {
    char *text;
    size_t len;
    rl_err e;
    if (rl_read_file(path, &text, &len, &e)) return false;
    bool r = strstr(text, needle) != NULL;
    free(text);
    return r;
}

float *rl_test_read_floats(const char *path, size_t *n) {
    char *t;
    size_t len;
    rl_err e;
    cr_assert_eq(rl_read_file(path, &t, &len, &e), 0, "%s", e.msg);
    *n = len / 4;
    return (float *)t;
}
