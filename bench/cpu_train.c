/* CPU training throughput: whole optimizer steps (forward, backward,
 * clipping, AdamW, data loading) on the embedded default config and on a
 * ~10M-parameter config, with the share of time spent in GEMM. Prints one
 * JSON line per config on stdout. Data is synthetic uniform tokens written
 * to a temp dir, so the numbers measure compute, not a corpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <omp.h>

#include "model/cpu.h"
#include "train/train.h"

static int bench_config(const char *label, rl_job_config *c, int warmup, int steps, const char *dir) {
    rl_err e;
    snprintf(c->data.train, sizeof c->data.train, "%s/train_*.bin", dir);
    c->data.val[0] = c->data.eval_task[0] = '\0';
    c->train.steps = warmup + steps;
    c->train.warmup_steps = 1;
    rl_trainer *tr;
    if (rl_trainer_new(&tr, c, NULL, &e)) {
        fprintf(stderr, "bench: %s\n", e.msg);
        return 1;
    }
    rl_step_stats st;
    for (int i = 0; i < warmup; i++)
        if (rl_trainer_step(tr, &st, &e)) goto fail;
    rl_cpu_gemm_seconds_f32 = rl_cpu_gemm_flops_f32 = rl_cpu_attn_seconds_f32 = 0;
    double t0 = rl_now();
    for (int i = 0; i < steps; i++)
        if (rl_trainer_step(tr, &st, &e)) goto fail;
    double dt = rl_now() - t0;
    double tokens = (double)steps * (double)c->train.global_batch_tokens;
    /* 6 * params flops per token for the matmuls, the usual estimate */
    double model_flops = 6.0 * (double)rl_trainer_nparams(tr) * tokens;
    struct utsname u;
    uname(&u);
    printf("{\"bench\":\"cpu_train\",\"config\":\"%s\",\"params\":%zu,\"seq_len\":%d,"
           "\"micro_batch\":%d,\"global_batch_tokens\":%lld,\"steps\":%d,\"seconds\":%.3f,"
           "\"tokens_per_s\":%.1f,\"gemm_share\":%.3f,\"gemm_gflops\":%.2f,"
           "\"attention_share\":%.3f,\"model_gflops\":%.2f,\"threads\":%d,\"cpus\":%ld,\"machine\":\"%s\",\"blas\":\"%s\"}\n",
           label, rl_trainer_nparams(tr), c->train.seq_len, c->train.micro_batch,
           c->train.global_batch_tokens, steps, dt, tokens / dt, rl_cpu_gemm_seconds_f32 / dt,
           rl_cpu_gemm_flops_f32 / rl_cpu_gemm_seconds_f32 * 1e-9, rl_cpu_attn_seconds_f32 / dt, model_flops / dt * 1e-9,
           omp_get_max_threads(), sysconf(_SC_NPROCESSORS_ONLN), u.machine, rl_blas_kernels());
    fflush(stdout);
    rl_trainer_free(tr);
    return 0;
fail:
    fprintf(stderr, "bench: %s\n", e.msg);
    rl_trainer_free(tr);
    return 1;
}

/* no argument: both configs (make bench); "default" or "10m": that one,
 * with an optional step count (make bench-cpu-vs-torch alternates them
 * with PyTorch's) */
int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    int nsteps = argc > 2 ? atoi(argv[2]) : 0;
    if (only && strcmp(only, "default") && strcmp(only, "10m")) {
        fprintf(stderr, "usage: cpu_train [default|10m [STEPS]]\n");
        return 2;
    }
    char dir[] = "/tmp/rlbench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    rl_err e;
    rl_shard_writer *w;
    rl_rng r;
    rl_rng_seed(&r, 1);
    static uint16_t buf[1 << 16];
    if (rl_shard_writer_open(dir, "train", 100000000, 2, &w, &e)) goto fail;
    for (int k = 0; k < 32; k++) { /* 2M tokens */
        for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) buf[i] = (uint16_t)(rl_rng_u64(&r) % 257);
        if (rl_shard_writer_add(w, buf, sizeof buf / sizeof buf[0], &e)) goto fail;
    }
    if (rl_shard_writer_close(w, NULL, NULL, &e)) goto fail;
    rl_log_set_level(RL_LOG_WARN);

    rl_job_config c;
    int rc = 0;
    rl_job_config_default(&c);
    if (!only || !strcmp(only, "default")) rc = bench_config("default", &c, 3, nsteps > 0 ? nsteps : 30, dir);

    /* ~10M parameters: 6 layers of width 384, GQA 6 heads over 2, T = 256 */
    rl_job_config_default(&c);
    c.model.hidden_size = 384, c.model.intermediate_size = 1024, c.model.num_hidden_layers = 6;
    c.model.num_attention_heads = 6, c.model.num_key_value_heads = 2;
    c.model.max_position_embeddings = 256;
    c.train.seq_len = 256, c.train.micro_batch = 8, c.train.global_batch_tokens = 8 * 256;
    if (!only || !strcmp(only, "10m")) rc |= bench_config("10m", &c, 1, nsteps > 0 ? nsteps : 6, dir);

    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return rc;
fail:
    fprintf(stderr, "bench: %s\n", e.msg);
    return 1;
}
