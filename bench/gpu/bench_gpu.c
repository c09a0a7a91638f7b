/* ringleader's GPU training step, timed: one JSON line per run, with the
 * same fields and FLOP formula as ../shared/bench/torch_baseline.py so the
 * two can be put side by side (bench/gpu/run.sh runs both).
 *
 *   gpu_bench --config a|b [--batch N] [--seq T] [--steps 30] [--warmup 10]
 *             [--recompute 1] [--profile-steps 5] [--ddp-rounds 2] [--plan] [--accum 1] [--eager]
 *             [--dq-atomic 1 (0: the deterministic dQ kernel)]
 *             [--attention auto|own|cudnn]  (train.attention; auto, the trainer's default)
 *             [--fused auto|on|off]  (train.fused_gemm; auto, the trainer's default)
 *             [--offload optimizer|layers]  (the trainer's train.offload beside none; below)
 *             [--vocab V --hidden D --ffn F --layers L --heads H --kv-heads K]
 *
 * --recompute 1 (the trainer's default, train.recompute): one layer's norm
 * outputs and SwiGLU product kept, rebuilt in the backward
 * (rl_gpu_options.recompute); 0 keeps every layer's (impl "ringleader-keep").
 *
 * --eager launches every kernel of every step (no CUDA graphs): the
 * difference graphs make, on the same model (impl "ringleader-eager").
 *
 * --plan needs no GPU: one JSON line with the step's plan from the model's
 * own launch list (rl_gpu_model_plan): FLOPs, bytes and launches per kernel
 * category, host syncs in the step, the model's device memory, and the
 * roofline step time at H100 SXM figures (989.4 TFLOP/s dense bf16, 3.35
 * TB/s; RL_PEAK_TFLOPS / RL_PEAK_TBPS override), each launch costing the
 * larger of its FLOPs and its bytes at those rates. memory_bound_bytes is
 * what the kernels that are neither GEMMs nor attention move.
 * per_gpu_bytes_world8: the accounting's bytes per GPU at world 8 in each
 * dist.shard mode (pkg/train/memory.h: the plan's device bytes for that
 * mode's model, plus DDP's shard gradient with "gradients").
 *
 * A step is what the baseline's step is: forward with the loss, backward,
 * global gradient norm and clipping at 1.0, fused AdamW (lr 3e-4, betas
 * 0.9/0.95, weight decay 0.1); the same batch every step, random tokens.
 *
 * Model FLOPs per token (the baseline's formula, kept identical on purpose):
 * 6 x parameters (all of them, embedding included) + 6 x layers x seq x
 * hidden (attention scores and values, forward and backward, halved for the
 * causal mask). MFU divides by the GPU's dense bf16 peak (datasheet, by
 * device name; RL_PEAK_TFLOPS overrides). Memory: the model's own device
 * allocations (fixed at creation: parameters, master, moments, gradients,
 * activations, scratch, cuBLASLt workspace) as peak_mem_gib, and what the
 * device lost in free memory over the run (CUDA context and library state
 * included) as device_used_gib.
 *
 * After the timed steps, --profile-steps more (default 5, 0: none) run with
 * the model's per-category kernel timing on (rl_gpu_model_profile) and the
 * line gains ms_<category> per step and the attention kernels' achieved
 * TFLOP/s: forward 4 B H hd T(T+1)/2 per layer (the causal half, as
 * FlashAttention's benchmarks count it), backward 2.5 x that (their
 * convention; these kernels do 3.5 x, recomputing P for dQ).
 *
 * Then the cost of DDP at world size 1 (--ddp-rounds, default 2; 0: none):
 * the same step with and without pkg/ddp over the nccl backend (buckets
 * and their CUDA events, the communication thread, ncclAllReduce of every
 * bucket on the communicator's stream, the optimizer ordered after the last
 * bucket), alternating `rounds` blocks of --steps steps of each so drift in
 * the GPU's clocks hits both alike; a ringleader-ddp line with both step
 * times and the overhead -- and the step time of each dist.shard mode
 * (ZeRO-1 and -2 at world 1: the sharded step's norm sum, range-list
 * AdamW, gather and bf16 copy, on the same rounds). Then a
 * ringleader-ddp-slots line: "gradients" as the trainer runs it at world
 * > 1 -- no gradient buffer, each region in one of two slots reduce-
 * scattered into the shard's gradient (rl_gpu_options.grad_slots) -- on
 * a model of its own built after the first is freed: its step time (the
 * same rounds, run after the others) and device bytes beside the flat
 * model's.
 *
 * --offload optimizer|layers (issue 20) times train.offload through the
 * whole trainer instead (pkg/train: the host's AdamW thread, the copies
 * up and down, streamed layers), beside "none" on the same model and
 * batch, alternating --ddp-rounds runs of --warmup + --steps steps each
 * (the warm-up steps untimed); random tokens from a temporary shard. One
 * ringleader-offload line: tokens/s of each and their ratio, the timed
 * steps' exposed waits in ms per step (stream: the compute stream on
 * copies, host: the training thread on the host's pipeline), and the
 * accounting's device bytes of each. A "none" that does not fit the GPU
 * reads null: the line then says what the mode makes trainable at all. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/gpu.h"
#include "kernels/gpu_layout.h"
#include "kernels/llama_gpu.h"
#include "util/util.h"
#include "comm/comm.h"
#include "ddp/ddp.h"
#include "data/data.h"
#include "model/model.h"
#include "train/memory.h"
#include "train/train.h"

static double env_or(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

static double peak_tflops(const char *name) {
    double env = env_or("RL_PEAK_TFLOPS", NAN); /* set: taken as it is */
    if (!isnan(env)) return env;
    /* dense bf16 tensor-core peaks from the datasheets (no sparsity) */
    if (strstr(name, "H100") && (strstr(name, "PCIe") || strstr(name, "PCIE"))) return 756.0;
    if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800") ||
        strstr(name, "GH200"))
        return 989.4;
    if (strstr(name, "A100") || strstr(name, "A800")) return 312.0;
    if (strstr(name, "L40S")) return 362.05;
    if (strstr(name, "B200")) return 2250.0;
    return 0.0; /* unknown: mfu reported as null */
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "gpu_bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(ce_));                                                      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* `steps` training steps queued back to back (the host never waits inside),
 * timed by events on the model's stream; with ddp, every gradient bucket is
 * reduced as a trainer's DDP step does it, and with a sharded ddp the step
 * ends as pkg/train/gpu.c ends it (the norm's partial summed over ranks,
 * AdamW over the shard, the bf16 weights gathered). */
static int timed_steps(rl_gpu_model *m, rl_ddp *ddp, const int32_t *x, const int32_t *y, int B,
                       int T, rl_gpu_adamw *a, int steps, double *ms, rl_err *e) {
    cudaStream_t s = rl_gpu_model_stream(m);
    cudaEvent_t t0, t1;
    int rc = cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess;
    if (rc) return rl_errf(e, RL_EIO, "cudaEventCreate failed");
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaEventRecord(t0, s) != cudaSuccess)
        rc = rl_errf(e, RL_EIO, "timing events failed");
    for (int it = 0; it < steps && !rc; it++) {
        a->t++;
        rc = rl_gpu_model_zero_grad(m, e) ||
             rl_gpu_model_train_micro(m, x, y, B, T, 1.0f, ddp ? rl_ddp_grad_ready : NULL, ddp, e);
        if (!rc && ddp) rc = rl_ddp_finish(ddp, e);
        double *sq;
        if (!rc && ddp && rl_ddp_shard(ddp))
            rc = rl_gpu_model_shard_sq(m, &sq, e) || rl_ddp_sum(ddp, sq, 1, e) || rl_gpu_model_shard_norm(m, e) ||
                 rl_gpu_model_adamw(m, a, e) || rl_ddp_gather(ddp, rl_gpu_model_params(m), true, e) ||
                 rl_gpu_model_step_end(m, e);
        else if (!rc)
            rc = rl_gpu_model_grad_norm(m, NULL, e) || rl_gpu_model_adamw(m, a, e) ||
                 rl_gpu_model_step_end(m, e);
    }
    float f = 0;
    if (!rc && (cudaEventRecord(t1, s) != cudaSuccess || cudaEventSynchronize(t1) != cudaSuccess ||
                cudaEventElapsedTime(&f, t0, t1) != cudaSuccess))
        rc = rl_errf(e, RL_EIO, "timing events failed");
    *ms = f;
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return rc ? (e->code ? e->code : RL_EIO) : RL_OK;
}

/* A shard's master and moments (s NULL: whole), over weights drawn again:
 * a master cut from a shard cannot be made whole again (the moments start
 * at zero, the weights are the init's: no matter to a timing). */
static int use_shard(rl_gpu_model *m, rl_ddp *ddp, rl_err *e) {
    const rl_train_shard *s = ddp ? rl_ddp_shard(ddp) : NULL;
    rl_gpu_model_set_params_wait(m, s ? rl_ddp_gathered : NULL, ddp); /* the forward waits for the gather */
    int rc = rl_gpu_model_set_shard(m, NULL, 0, 0, e);
    if (!rc) rc = rl_gpu_model_init_random(m, 1337, 0.02f, e);
    return rc || !s ? rc : rl_gpu_model_set_shard(m, s->r, s->n, 0, e);
}

/* ZeRO-2 as the trainer runs it at world > 1 (rl_gpu_options.grad_slots):
 * no gradient buffer, each region written into a slot that DDP reduce-
 * scatters and adds into the shard's gradient, the bf16 weights gathered
 * -- its own model (built after the flat one is freed), over the same
 * communicator kind at world 1; ms per step and its device bytes out. */
static int slots_overhead(const rl_model_config *c, int B, int T, const rl_gpu_options *base, const int32_t *x,
                          const int32_t *y, rl_gpu_adamw *a, int steps, int rounds, double *ms, size_t *bytes,
                          rl_err *e) {
    rl_gpu_options opt = *base;
    opt.grad_slots = RL_GPU_GRAD_SLOTS;
    int nr = rl_gpu_grad_regions(c, NULL);
    size_t *regions = malloc((size_t)nr * sizeof *regions);
    cudaStream_t s = NULL;
    rl_gpu_model *m = NULL;
    rl_comm *comm = NULL;
    rl_ddp *ddp = NULL;
    rl_comm_opts co = {.backend = "nccl", .rank = 0, .world = 1, .prefix = "bench-slots", .timeout_s = 60};
    int rc = regions ? RL_OK : rl_errf(e, RL_ENOMEM, "out of memory");
    if (!rc && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        rc = rl_errf(e, RL_EIO, "cudaStreamCreate failed");
    if (!rc) rl_gpu_grad_regions(c, regions), rc = rl_gpu_model_create(&m, c, B, T, &opt, s, e);
    if (!rc) rc = rl_comm_init(&co, &comm, e);
    if (!rc) {
        rl_ddp_opts o = {.grad_stream = s, .shard = RL_SHARD_GRADIENTS, .regions = regions, .nregions = nr};
        rc = rl_ddp_create(comm, NULL, rl_gpu_model_layout(m)->total, &o, &ddp, e);
    }
    float *host = rc ? NULL : malloc(rl_gpu_model_layout(m)->total * sizeof(float));
    if (!rc && !host) rc = rl_errf(e, RL_ENOMEM, "out of memory for the weights");
    if (!rc) { /* as the trainer: the shard first, then the weights uploaded into it region by region */
        const rl_train_shard *sh = rl_ddp_shard(ddp);
        rl_gpu_model_set_params_wait(m, rl_ddp_gathered, ddp);
        rl_gpu_model_set_grad_sink(m, rl_ddp_grad_slot, ddp);
        rl_gpu_model_set_shard_grads(m, sh->grad);
        rl_model_init_params(c, host, 1337);
        rc = rl_gpu_model_set_shard(m, sh->r, sh->n, 0, e) || rl_gpu_model_upload_params(m, host, e);
    }
    free(host);
    double t;
    *ms = 0;
    for (int r = -1; r < rounds && !rc; r++) /* round -1 untimed */
        if (!(rc = timed_steps(m, ddp, x, y, B, T, a, r < 0 ? 1 : steps, &t, e)) && r >= 0) *ms += t / (steps * rounds);
    *bytes = m ? rl_gpu_model_device_bytes(m) : 0;
    rl_ddp_destroy(ddp);
    rl_comm_destroy(comm);
    rl_gpu_model_free(m);
    if (s) cudaStreamDestroy(s);
    free(regions);
    return rc;
}

static int ddp_overhead(rl_gpu_model *m, const char *config, const int32_t *x, const int32_t *y,
                        int B, int T, rl_gpu_adamw *a, int steps, int rounds, rl_err *e) {
    rl_comm *comm = NULL;
    rl_ddp *ddp[3] = {NULL}; /* dist.shard none, optimizer, gradients */
    rl_comm_opts co = {.backend = "nccl", .rank = 0, .world = 1, .prefix = "bench", .timeout_s = 60};
    int rc = rl_comm_init(&co, &comm, e);
    for (int k = 0; k < 3 && !rc; k++) {
        rl_ddp_opts o = {.grad_stream = rl_gpu_model_stream(m), .shard = (rl_shard_mode)k};
        rc = rl_ddp_create(comm, rl_gpu_model_grads(m), rl_gpu_model_layout(m)->total, &o, &ddp[k], e);
    }
    /* the model's state follows the variant that runs (use_shard) */
    double off = 0, on[3] = {0}, ms;
    for (int r = -1; r < rounds && !rc; r++) { /* round -1 untimed: each communicator's first launch */
        if (r >= 0 && !(rc = use_shard(m, NULL, e)) && !(rc = timed_steps(m, NULL, x, y, B, T, a, steps, &ms, e)))
            off += ms;
        for (int k = 0; k < 3 && !rc; k++) {
            rc = use_shard(m, ddp[k], e);
            if (!rc && !(rc = timed_steps(m, ddp[k], x, y, B, T, a, r < 0 ? 1 : steps, &ms, e)) && r >= 0) on[k] += ms;
        }
    }
    double exposed = 0, busy = 0;
    if (!rc) rl_ddp_step_timing(ddp[0], &exposed, &busy);
    if (!rc) {
        int n = steps * rounds;
        printf("{\"impl\":\"ringleader-ddp\",\"config\":\"%s\",\"world\":1,\"backend\":\"nccl\","
               "\"buckets\":%d,\"steps\":%d,\"ms_per_step_off\":%.3f,\"ms_per_step_on\":%.3f,"
               "\"overhead\":%.4f,\"ms_allreduce_busy\":%.3f,\"ms_allreduce_exposed\":%.3f,"
               "\"ms_per_step_shard_optimizer\":%.3f,\"ms_per_step_shard_gradients\":%.3f}\n",
               config, rl_ddp_nbuckets(ddp[0]), n, off / n, on[0] / n, on[0] / off - 1, busy * 1e3,
               exposed * 1e3, on[1] / n, on[2] / n);
    }
    for (int k = 0; k < 3; k++) rl_ddp_destroy(ddp[k]);
    rl_comm_destroy(comm);
    return rc ? rc : use_shard(m, NULL, e);
}

/* ---- --offload: the trainer's train.offload beside "none" ---- */
typedef struct {
    int warm, n;                 /* steps still untimed in this run; timed */
    double s, stream_s, host_s;  /* the timed steps' seconds and exposed waits */
} off_obs;

static void off_step(void *ud, const rl_step_stats *st) {
    off_obs *o = ud;
    if (o->warm-- > 0) return;
    o->n++, o->s += st->step_s;
    o->stream_s += fmax(st->stream_wait_s, 0), o->host_s += fmax(st->host_wait_s, 0);
}

/* one run of the trainer in `mode`, its timed steps added into *o */
static int off_run(const rl_job_config *j, const char *mode, int warmup, off_obs *o, rl_err *e) {
    rl_job_config c = *j;
    snprintf(c.train.offload, sizeof c.train.offload, "%s", mode);
    rl_trainer *tr = NULL;
    off_obs r = {.warm = warmup};
    int rc = rl_trainer_new(&tr, &c, NULL, e);
    if (!rc) {
        rl_trainer_set_observer(tr, &(rl_train_observer){.ud = &r, .on_step = off_step});
        rc = rl_trainer_run(tr, e);
    }
    rl_trainer_free(tr);
    if (!rc) o->n += r.n, o->s += r.s, o->stream_s += r.stream_s, o->host_s += r.host_s;
    return rc;
}

static void off_json(const char *key, const off_obs *o, double tokens) {
    if (o->n) printf(",\"%s\":%.0f", key, tokens * o->n / o->s);
    else printf(",\"%s\":null", key);
}

static int offload_bench(const char *config, const rl_model_config *c, int B, int T, const char *mode,
                         const rl_gpu_options *opt, int steps, int warmup, int rounds) {
    char dir[] = "/tmp/rl-offload-bench-XXXXXX", path[64], gpu[256] = "";
    rl_err e = {0};
    if (c->vocab_size > 65536) return fprintf(stderr, "gpu_bench: --offload: vocab above 65536\n"), 2;
    size_t ntok = (size_t)(warmup + steps + 2) * (size_t)B * (size_t)(T + 1);
    uint16_t *tok = malloc(ntok * sizeof *tok);
    rl_rng rng;
    rl_rng_seed(&rng, 42);
    for (size_t i = 0; tok && i < ntok; i++) tok[i] = (uint16_t)(rl_rng_u64(&rng) % (uint64_t)c->vocab_size);
    snprintf(path, sizeof path, "%s/train_000000.bin", mkdtemp(dir) ? dir : "/nonexistent");
    int rc = !tok ? rl_errf(&e, RL_ENOMEM, "out of memory for the tokens") : rl_shard_write(path, tok, ntok, &e);
    free(tok);
    rl_job_config j;
    rl_job_config_default(&j);
    j.model = *c;
    rl_train_config *t = &j.train;
    t->micro_batch = B, t->seq_len = T, t->global_batch_tokens = (long long)B * T;
    t->steps = warmup + steps, t->warmup_steps = 1, t->eval_every = 0, t->eval_batches = 0, t->log_every = 1 << 30;
    t->recompute = opt->recompute;
    snprintf(t->attention, sizeof t->attention, "%s", opt->attention == RL_GPU_ATTN_OWN     ? "own"
                                                     : opt->attention == RL_GPU_ATTN_CUDNN ? "cudnn"
                                                                                           : "auto");
    snprintf(t->device, sizeof t->device, "cuda");
    snprintf(j.data.train, sizeof j.data.train, "%s/train_*.bin", dir);
    j.data.val[0] = '\0', j.data.eval_task[0] = '\0';
    off_obs on = {0}, none = {0};
    bool none_fits = true;
    for (int r = 0; r < rounds && !rc; r++) {
        rl_err en = {0};
        if (none_fits && off_run(&j, "none", warmup, &none, &en)) { /* too big for the GPU, most likely: say so */
            none_fits = false, none.n = 0;
            fprintf(stderr, "gpu_bench: --offload: \"none\" did not run: %s\n", en.msg);
        }
        rc = off_run(&j, mode, warmup, &on, &e);
    }
    remove(path), rmdir(dir);
    if (rc) return fprintf(stderr, "gpu_bench: --offload %s: %s\n", mode, e.msg), 1;
    rl_train_memory mem[2];
    const char *modes[2] = {"none", mode};
    for (int k = 0; k < 2; k++) {
        snprintf(t->offload, sizeof t->offload, "%s", modes[k]);
        if (rl_train_memory_of(&j, 1, 0, &mem[k], &e)) mem[k].total = 0;
    }
    rl_param_layout lay;
    rl_param_layout_init(&lay, c);
    rl_gpu_device_count(gpu, sizeof gpu);
    double tokens = (double)B * T;
    printf("{\"impl\":\"ringleader-offload\",\"config\":\"%s\",\"mode\":\"%s\",\"gpu\":\"%s\",\"params\":%zu,"
           "\"batch\":%d,\"seq\":%d,\"steps\":%d", config, mode, gpu, lay.total, B, T, on.n);
    off_json("tokens_per_s", &on, tokens);
    off_json("tokens_per_s_none", &none, tokens);
    if (none.n) printf(",\"vs_none\":%.4f", (none.s / none.n) / (on.s / on.n));
    else printf(",\"vs_none\":null");
    printf(",\"ms_stream_wait\":%.3f,\"ms_host_wait\":%.3f", on.n ? on.stream_s / on.n * 1e3 : 0.0,
           on.n ? on.host_s / on.n * 1e3 : 0.0);
    printf(",\"device_bytes\":%zu,\"device_bytes_none\":%zu}\n", mem[1].total, mem[0].total);
    return 0;
}

/* --plan: the step as rl_gpu_model_plan counts it; no CUDA call is made */
static int print_plan(const char *config, const rl_model_config *c, int B, int T,
                      const rl_gpu_options *opt, int accum) {
    double tf = env_or("RL_PEAK_TFLOPS", 989.4), tb = env_or("RL_PEAK_TBPS", 3.35);
    rl_gpu_plan p;
    rl_err e = {0};
    if (rl_gpu_model_plan(c, B, T, opt, accum, tf * 1e12, tb * 1e12, &p, &e)) {
        fprintf(stderr, "gpu_bench: %s\n", e.msg);
        return 1;
    }
    double flops = 0, membound = 0, roof = 0;
    int launches = 0;
    for (int k = 0; k < RL_GPU_PROF_N; k++) {
        flops += p.flops[k], roof += p.roof_s[k], launches += p.launches[k];
        if (k != RL_GPU_PROF_GEMM && k != RL_GPU_PROF_ATTN_FWD && k != RL_GPU_PROF_ATTN_BWD)
            membound += p.bytes[k];
    }
    printf("{\"impl\":\"ringleader-plan\",\"config\":\"%s\",\"batch\":%d,\"seq\":%d,\"accum\":%d,"
           "\"flops_per_step\":%.6g,\"memory_bound_bytes\":%.6g,\"launches_per_step\":%d,"
           "\"host_syncs_per_step\":%d,\"peak_device_bytes\":%zu,\"roofline_ms\":%.3f,"
           "\"peak_tflops\":%.1f,\"peak_tbps\":%.2f",
           config, B, T, accum, flops, membound, launches, p.host_syncs, p.device_bytes,
           roof * 1e3, tf, tb);
    for (int k = 0; k < RL_GPU_PROF_N; k++)
        printf(",\"%s\":{\"flops\":%.6g,\"bytes\":%.6g,\"launches\":%d,\"roofline_ms\":%.3f}",
               rl_gpu_prof_name(k), p.flops[k], p.bytes[k], p.launches[k], p.roof_s[k] * 1e3);
    /* per dist.shard mode at 8 GPUs, the trainer's own sizing of this model */
    rl_job_config j;
    rl_job_config_default(&j);
    j.model = *c, j.train.micro_batch = B, j.train.seq_len = T, j.train.recompute = opt->recompute;
    snprintf(j.train.device, sizeof j.train.device, "cuda");
    const char *modes[3] = {"none", "optimizer", "gradients"};
    for (int k = 0; k < 3; k++) {
        rl_train_memory mem;
        snprintf(j.dist.shard, sizeof j.dist.shard, "%s", modes[k]);
        if (rl_train_memory_of(&j, 8, 0, &mem, &e)) mem.total = 0;
        printf("%s\"%s\":%zu%s", k ? "," : ",\"per_gpu_bytes_world8\":{", modes[k], mem.total, k == 2 ? "}" : "");
    }
    printf("}\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *config = "a", *offload = NULL;
    int batch = -1, seq = -1, steps = 30, warmup = 10, recompute = 1, prof_steps = 5;
    int ddp_rounds = 2, plan = 0, accum = 1, attention = RL_GPU_ATTN_AUTO, eager = 0;
    int fused = RL_GPU_FUSED_AUTO;
    int dq_atomic = 1; /* our attention's dQ by atomics, as PyTorch's flash backward */
    int vocab = -1, hidden = -1, ffn = -1, layers = -1, heads = -1, kv = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INTARG(flag, var)                                                                          \
    if (!strcmp(a, flag) && v) {                                                                   \
        var = atoi(v);                                                                             \
        i++;                                                                                       \
        continue;                                                                                  \
    }
        if (!strcmp(a, "--config") && v) {
            config = v, i++;
            continue;
        }
        if (!strcmp(a, "--attention") && v) {
            attention = !strcmp(v, "cudnn") ? RL_GPU_ATTN_CUDNN
                        : !strcmp(v, "auto") ? RL_GPU_ATTN_AUTO
                        : !strcmp(v, "own")  ? RL_GPU_ATTN_OWN
                                             : -1;
            if (attention < 0) {
                fprintf(stderr, "gpu_bench: --attention is auto, own or cudnn, not %s\n", v);
                return 2;
            }
            i++;
            continue;
        }
        if (!strcmp(a, "--fused") && v) {
            fused = !strcmp(v, "auto")  ? RL_GPU_FUSED_AUTO
                    : !strcmp(v, "on")  ? RL_GPU_FUSED_ON
                    : !strcmp(v, "off") ? RL_GPU_FUSED_OFF
                                        : -1;
            if (fused < 0) {
                fprintf(stderr, "gpu_bench: --fused is auto, on or off, not %s\n", v);
                return 2;
            }
            i++;
            continue;
        }
        if (!strcmp(a, "--offload") && v) {
            if (strcmp(v, "optimizer") && strcmp(v, "layers")) {
                fprintf(stderr, "gpu_bench: --offload is optimizer or layers, not %s\n", v);
                return 2;
            }
            offload = v, i++;
            continue;
        }
        if (!strcmp(a, "--eager")) {
            eager = 1;
            continue;
        }
        if (!strcmp(a, "--plan")) {
            plan = 1;
            continue;
        }
        INTARG("--batch", batch)
        INTARG("--seq", seq) INTARG("--steps", steps) INTARG("--warmup", warmup)
            INTARG("--vocab", vocab) INTARG("--hidden", hidden) INTARG("--ffn", ffn)
                INTARG("--layers", layers) INTARG("--heads", heads) INTARG("--kv-heads", kv)
                    INTARG("--profile-steps", prof_steps) INTARG("--ddp-rounds", ddp_rounds)
                        INTARG("--accum", accum) INTARG("--dq-atomic", dq_atomic)
                            INTARG("--recompute", recompute)
                        fprintf(stderr,
                                "gpu_bench: unknown argument %s (see the comment at the top of "
                                "bench/gpu/bench_gpu.c)\n",
                                a);
        return 2;
    }
    rl_model_config c;
    rl_model_config_default(&c);
    int B, T;
    if (!strcmp(config, "a")) {
        c.vocab_size = 50000, c.hidden_size = 768, c.intermediate_size = 3072;
        c.num_hidden_layers = 12, c.num_attention_heads = 12, c.num_key_value_heads = 3;
        B = 64, T = 512;
    } else if (!strcmp(config, "b")) {
        c.vocab_size = 32000, c.hidden_size = 2048, c.intermediate_size = 5632;
        c.num_hidden_layers = 22, c.num_attention_heads = 32, c.num_key_value_heads = 4;
        B = 8, T = 2048;
    } else {
        fprintf(stderr, "gpu_bench: --config is a or b\n");
        return 2;
    }
    if (vocab > 0) c.vocab_size = vocab;
    if (hidden > 0) c.hidden_size = hidden;
    if (ffn > 0) c.intermediate_size = ffn;
    if (layers > 0) c.num_hidden_layers = layers;
    if (heads > 0) c.num_attention_heads = heads;
    if (kv > 0) c.num_key_value_heads = kv;
    if (batch > 0) B = batch;
    if (seq > 0) T = seq;
    c.max_position_embeddings = T;
    c.rms_norm_eps = 1e-5, c.rope_theta = 10000.0, c.initializer_range = 0.02;

    rl_gpu_options opt = {
        .recompute = recompute, .attention = attention, .attn_dq_atomic = dq_atomic,
        .fused_gemm = fused};
    if (plan) return print_plan(config, &c, B, T, &opt, accum);
    char gpu[256] = "";
    if (rl_gpu_device_count(gpu, sizeof gpu) == 0) {
        printf("{\"impl\":\"ringleader\",\"config\":\"%s\",\"skipped\":\"no GPU visible\"}\n",
               config);
        return 0;
    }
    if (offload) return offload_bench(config, &c, B, T, offload, &opt, steps, warmup, ddp_rounds > 0 ? ddp_rounds : 1);
    rl_err e = {0};
    size_t free0, free1, total;
    CK(cudaSetDevice(0));
    CK(cudaFree(NULL)); /* create the context before the first reading */
    CK(cudaMemGetInfo(&free0, &total));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    rl_gpu_model *m = NULL;
    if (rl_gpu_model_create(&m, &c, B, T, &opt, s, &e) ||
        rl_gpu_model_init_random(m, 1337, 0.02f, &e)) {
        fprintf(stderr, "gpu_bench: %s\n", e.msg);
        rl_gpu_model_free(m);
        return 1;
    }
    rl_gpu_model_graphs(m, !eager);
    int N = B * T;
    int32_t *x = malloc(sizeof(int32_t) * N), *y = malloc(sizeof(int32_t) * N);
    rl_rng rng;
    rl_rng_seed(&rng, 42);
    for (int i = 0; i < N; i++) {
        x[i] = (int32_t)(rl_rng_u64(&rng) % (uint64_t)c.vocab_size);
        y[i] = (int32_t)(rl_rng_u64(&rng) % (uint64_t)c.vocab_size);
    }
    rl_gpu_adamw a = {.lr = 3e-4,
                      .beta1 = 0.9,
                      .beta2 = 0.95,
                      .eps = 1e-8,
                      .weight_decay = 0.1,
                      .grad_scale = 1.0,
                      .clip_max_norm = 1.0};
    /* events around each phase of each timed step, read after the run (no
     * synchronisation inside the timed loop: the host queues ahead as a
     * trainer does), so a tuning session sees where the step goes */
    cudaEvent_t *ev = malloc(sizeof(cudaEvent_t) * 3 * (size_t)steps), t0, t1;
    for (int k = 0; k < 3 * steps; k++) CK(cudaEventCreate(&ev[k]));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    float loss = 0;
    int rc = 0;
    for (int it = 0; it < warmup + steps && !rc; it++) {
        cudaEvent_t *E = it >= warmup ? ev + 3 * (it - warmup) : NULL;
        if (it == warmup) {
            CK(cudaStreamSynchronize(s));
            CK(cudaEventRecord(t0, s));
        }
        a.t = it + 1;
        if (E) CK(cudaEventRecord(E[0], s));
        rc = rl_gpu_model_zero_grad(m, &e) ||
             rl_gpu_model_train_micro(m, x, y, B, T, 1.0f, NULL, NULL, &e);
        if (!rc && E) CK(cudaEventRecord(E[1], s));
        if (!rc)
            rc = rl_gpu_model_grad_norm(m, NULL, &e) || rl_gpu_model_adamw(m, &a, &e) ||
                 rl_gpu_model_step_end(m, &e);
        if (!rc && E) CK(cudaEventRecord(E[2], s));
    }
    if (!rc) {
        CK(cudaEventRecord(t1, s));
        CK(cudaEventSynchronize(t1));
        float norm;
        rc = rl_gpu_model_step_stats(m, 0, &loss, &norm, &e);
    }
    if (rc) {
        fprintf(stderr, "gpu_bench: %s\n", e.msg);
        rl_gpu_model_free(m);
        return 1;
    }
    /* the profiled steps, after the timed ones */
    double prof[RL_GPU_PROF_N] = {0};
    if (prof_steps > 0) {
        double ms;
        rc = rl_gpu_model_profile(m, 1, &e);
        if (!rc) rc = timed_steps(m, NULL, x, y, B, T, &a, prof_steps, &ms, &e);
        if (!rc) rc = rl_gpu_model_profile_read(m, prof, NULL, &e) || rl_gpu_model_profile(m, 0, &e);
        if (rc) {
            fprintf(stderr, "gpu_bench: %s\n", e.msg);
            rl_gpu_model_free(m);
            return 1;
        }
    }
    double ph[2] = {0, 0};
    for (int it = 0; it < steps; it++)
        for (int k = 0; k < 2; k++) {
            float ms;
            CK(cudaEventElapsedTime(&ms, ev[3 * it + k], ev[3 * it + k + 1]));
            ph[k] += ms;
        }
    float ms_total;
    CK(cudaEventElapsedTime(&ms_total, t0, t1));
    CK(cudaMemGetInfo(&free1, &total));
    double dt = ms_total / 1e3 / steps;
    size_t nparams = rl_gpu_model_layout(m)->total;
    double flops_tok =
        6.0 * (double)nparams + 6.0 * c.num_hidden_layers * (double)T * c.hidden_size;
    double tflops = flops_tok * N / dt / 1e12, peak = peak_tflops(gpu);
    char mfu[32];
    if (peak > 0)
        snprintf(mfu, sizeof mfu, "%.4f", tflops / peak);
    else
        snprintf(mfu, sizeof mfu, "null");
    int drv = 0, rtv = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rtv);
    /* which attention ran (auto's choice): summary.py names the row by it */
    const char *attn = rl_gpu_model_attention(m) == RL_GPU_ATTN_CUDNN ? "cudnn" : "own";
    /* and the sites that ran our fused GEMMs (auto's choice per site) */
    static const char *const site[RL_GPU_SITES] = {"swiglu_fwd", "swiglu_bwd", "classifier"};
    char sw[64] = "";
    for (int k = 0; k < RL_GPU_SITES; k++)
        if (rl_gpu_model_fused(m, k))
            snprintf(sw + strlen(sw), sizeof sw - strlen(sw), "%s%s", *sw ? "," : "", site[k]);
    printf("{\"impl\":\"ringleader%s\",\"config\":\"%s\",\"attn\":\"%s\",\"fused\":\"%s\",\"recompute\":%d,\"gpu\":\"%s\",\"cuda_driver\":%d,\"cuda_"
           "runtime\":%d,"
           "\"params\":%zu,\"batch\":%d,\"seq\":%d,\"tokens_per_step\":%d,\"ms_per_step\":%.2f,"
           "\"tokens_per_s\":%.0f,\"model_tflops\":%.1f,\"peak_tflops\":%.1f,\"mfu\":%s,"
           "\"peak_mem_gib\":%.2f,\"device_used_gib\":%.2f,\"final_loss\":%.4f,"
           "\"ms_forward_backward\":%.2f,\"ms_optimizer\":%.2f,\"graph_replays\":%lld}\n",
           eager ? "-eager" : recompute ? "" : "-keep", config, attn, sw, recompute, gpu, drv, rtv, nparams, B, T, N, dt * 1e3, N / dt,
           tflops, peak, mfu, rl_gpu_model_device_bytes(m) / 1073741824.0,
           (double)(free0 - free1) / 1073741824.0, loss, ph[0] / steps, ph[1] / steps,
           rl_gpu_model_graph_replays(m));
    if (prof_steps > 0) {
        int hd = c.hidden_size / c.num_attention_heads;
        double attn_fwd =
            4.0 * B * c.num_attention_heads * hd * ((double)T * (T + 1) / 2) * c.num_hidden_layers;
        printf("{\"impl\":\"ringleader-profile\",\"config\":\"%s\",\"attn\":\"%s\",\"profile_steps\":%d",
               config, attn, prof_steps);
        for (int k = 0; k < RL_GPU_PROF_N; k++)
            printf(",\"ms_%s\":%.3f", rl_gpu_prof_name(k), prof[k] / prof_steps);
        double tf = prof[RL_GPU_PROF_ATTN_FWD] / prof_steps,
               tb = prof[RL_GPU_PROF_ATTN_BWD] / prof_steps;
        double tg = prof[RL_GPU_PROF_GEMM] / prof_steps;
        printf(",\"attn_fwd_tflops\":%.1f,\"attn_bwd_tflops\":%.1f,\"gemm_tflops\":%.1f}\n",
               tf > 0 ? attn_fwd / (tf / 1e3) / 1e12 : 0.0,
               tb > 0 ? 2.5 * attn_fwd / (tb / 1e3) / 1e12 : 0.0,
               /* GEMM work: 6 x (parameters but the embedding table, a lookup) x tokens */
               tg > 0 ? 6.0 * (double)(nparams - (size_t)c.vocab_size * c.hidden_size) * N /
                            (tg / 1e3) / 1e12
                      : 0.0);
    }
    if (ddp_rounds > 0) {
        fflush(stdout);
        rl_gpu_adamw ad = a;
        if (ddp_overhead(m, config, x, y, B, T, &ad, steps, ddp_rounds, &e)) {
            fprintf(stderr, "gpu_bench: ddp: %s\n", e.msg);
            rl_gpu_model_free(m);
            return 1;
        }
    }
    size_t flat = rl_gpu_model_device_bytes(m), slotted = 0;
    rl_gpu_model_free(m);
    cudaStreamDestroy(s);
    double ms_slots = 0;
    if (ddp_rounds > 0) { /* after the flat model is gone: both need not fit at once */
        rl_gpu_adamw ad = a;
        if (slots_overhead(&c, B, T, &opt, x, y, &ad, steps, ddp_rounds, &ms_slots, &slotted, &e)) {
            fprintf(stderr, "gpu_bench: ddp slots: %s\n", e.msg);
            return 1;
        }
        printf("{\"impl\":\"ringleader-ddp-slots\",\"config\":\"%s\",\"world\":1,\"backend\":\"nccl\",\"steps\":%d,"
               "\"ms_per_step_shard_gradients_slots\":%.3f,\"device_bytes\":%zu,\"device_bytes_flat\":%zu}\n",
               config, steps * ddp_rounds, ms_slots, slotted, flat);
    }
    free(x), free(y), free(ev);
    return 0;
}
