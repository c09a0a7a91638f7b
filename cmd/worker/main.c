/* ringleader-worker: trains the model described by a job config (or the
 * embedded default). Thin: flags -> config -> pkg/train. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"
#include "util/util.h"
#ifdef RL_CUDA
#include "kernels/gpu.h"
#endif

static volatile int g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ringleader-worker [--config FILE] [--steps N] [--seed N] [--print-config]\n"
            "  Trains a Llama-architecture model on the CPU. With no --config, trains the\n"
            "  embedded default: a small model on the arithmetic corpus that\n"
            "  `ringleader-prepare arith --out data/arith` writes (see `make run`).\n");
}

static int fail(const char *what, const rl_err *e) {
    fprintf(stderr, "ringleader-worker: error: %s%s%s\n", what, what[0] ? ": " : "", e->msg);
    return rl_err_exit_status(e->code);
}

static int parse_ll(const char *flag, const char *v, long long lo, long long hi, long long *out,
                    rl_err *e) {
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *v == '\0' || *end != '\0' || x < lo || x > hi)
        return rl_errf(e, RL_EINPUT, "%s: must be an integer in [%lld, %lld]", flag, lo, hi);
    *out = x;
    return RL_OK;
}

int main(int argc, char **argv) {
    rl_err e = {0};
    rl_job_config cfg;
    rl_job_config_default(&cfg);
    const char *config_path = NULL;
    long long steps = -1, seed = -1;
    int print_config = 0, rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--config") && v) {
            config_path = v, i++;
        } else if (!strcmp(a, "--steps")) {
            if ((rc = parse_ll("--steps", v, 0, 1ll << 40, &steps, &e))) return fail("", &e);
            i++;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = parse_ll("--seed", v, 0, 1ll << 53, &seed, &e))) return fail("", &e);
            i++;
        } else if (!strcmp(a, "--print-config")) {
            print_config = 1;
        } else {
            fprintf(stderr, "ringleader-worker: unknown or incomplete flag '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (config_path) {
        char *text;
        size_t len;
        if ((rc = rl_read_file(config_path, &text, &len, &e))) return fail("--config", &e);
        rc = rl_job_config_parse(text, len, config_path, &cfg, &e);
        free(text);
        if (rc) return fail("", &e);
    }
    if (steps >= 0) {
        cfg.train.steps = steps;
        if (cfg.train.warmup_steps > steps) cfg.train.warmup_steps = steps;
    }
    if (seed >= 0) cfg.train.seed = (uint64_t)seed;
    if (print_config) {
        char *s = rl_job_config_to_json(&cfg);
        printf("%s\n", s);
        free(s);
        return 0;
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* Everything a user can get wrong is checked before the first log line,
     * so a bad input ends with exactly one line. */
    rl_log_init(-1);
    rl_trainer tr;
    if ((rc = rl_trainer_init(&tr, &cfg, NULL, &e))) {
        if (!config_path && rc == RL_EINPUT)
            fprintf(stderr, "ringleader-worker: error: %s (the embedded default reads the corpus "
                    "that `make run` writes: ringleader-prepare arith --out data/arith)\n", e.msg);
        return config_path || rc != RL_EINPUT ? fail("", &e) : 2;
    }
#ifdef RL_CUDA
    char gpu[128] = "";
    int ngpu = rl_gpu_device_count(gpu, sizeof gpu);
    if (ngpu == 0)
        rl_log_msg(RL_LOG_INFO, "device", "CUDA build, but no GPU is visible: training on the CPU");
    else
        rl_log(RL_LOG_INFO, "device",
               "\"gpus\":%d,\"msg\":\"GPU present; this build trains on the CPU path\"", ngpu);
#endif
    tr.stop = &g_stop;
    rc = rl_trainer_run(&tr, &e);
    if (rc) {
        rl_trainer_free(&tr);
        return fail("", &e);
    }
    const rl_run_summary *s = &tr.summary;
    printf("trained %lld steps in %.1f s (%.0f tokens/s): final loss %.4f (unigram entropy %.4f)",
           tr.step, s->elapsed_s, s->tokens_per_s, s->final_loss, s->unigram_entropy);
    if (s->val_loss >= 0) printf(", val loss %.4f", s->val_loss);
    printf("\n");
    if (s->has_arith) {
        printf("held-out sums answered exactly: %d of %d (%.1f%%)\n", s->arith.correct,
               s->arith.total, 100.0 * s->arith.correct / (s->arith.total ? s->arith.total : 1));
        for (int i = 0; i < s->arith.n_shown; i++) printf("  %s\n", s->arith.shown[i]);
    }
    rl_trainer_free(&tr);
    return 0;
}
