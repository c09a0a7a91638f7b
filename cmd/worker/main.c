/* ringleader-worker: trains the model described by a job config (or the
 * embedded default). Thin: flags -> config -> pkg/train. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "comm/comm.h"
#include "cmd/flags.h"
#include "env.h"
#include "rdzv/rdzv.h"
#include "train/train.h"
#include "util/util.h"
#ifdef RL_CUDA
#include "kernels/gpu.h"
#endif

#define PROG "ringleader-worker"

static volatile int g_stop, g_stop_sig, g_starting;
static void on_signal(int sig) {
    /* A trainer told to stop while it is still starting (connecting to
     * peers that may be gone, reading the checkpoint) has nothing to save:
     * leave at once instead of blocking in setup until the agent's grace
     * runs out. RL_EXIT_PREEMPTED: stopped, and no work lost. */
    if (g_starting) {
        static const char m[] = "ringleader-worker: stopped by signal while starting (nothing to save)\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        _exit(RL_EXIT_PREEMPTED);
    }
    g_stop_sig = sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ringleader-worker [--config FILE] [--steps N] [--seed N] [--print-config]\n"
            "                         [--print-schema]\n"
            "                         [--save-params FILE]\n"
            "       ringleader-worker generate --checkpoint URI --prompt TEXT (see generate --help)\n"
            "                         [--nproc-per-node N [--nnodes N --node-rank I\n"
            "                          --master-addr HOST --master-port PORT]]\n"
            "                         [--rdzv k8s|etcd --job NAME [--nnodes MIN:MAX]]\n"
            "                         [--metrics-port PORT]\n"
            "  Trains a Llama-architecture model. With no --config, the job config is the\n"
            "  JSON in RINGLEADER_CONFIG when set (the operator passes spec.training so),\n"
            "  else the embedded default: a small model on the arithmetic corpus that\n"
            "  `ringleader-prepare arith --out data/arith` writes (see `make run`).\n"
            "  --nproc-per-node N forks N trainer processes (data parallel, like torchrun;\n"
            "  auto or gpu: one per visible GPU, one without);\n"
            "  a process started with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun)\n"
            "  or SLURM_PROCID/SLURM_NTASKS (srun) joins that job. PET_NNODES,\n"
            "  PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT are read too.\n"
            "  --save-params FILE: rank 0 writes the final fp32 parameters (raw).\n"
            "  --print-config: the config this would run, as JSON; --print-schema: the\n"
            "  OpenAPI schema of the config that the TrainingJob CRD embeds as spec.training.\n"
            "  --rdzv k8s|etcd: an elastic node agent (in a pod): peers from the job's\n"
            "  headless Service (or etcd), a leader elected on a Lease (or etcd), rounds\n"
            "  that re-form when nodes come and go; POD_NAME, POD_IP and\n"
            "  RINGLEADER_RDZV_SECRET come from the pod (see README, Kubernetes).\n"
            "  --metrics-port PORT (or RINGLEADER_METRICS_PORT): Prometheus GET /metrics and\n"
            "  GET /healthz from the node agent (or the single process); 0, the default: off.\n"
            "  Bound on RINGLEADER_METRICS_ADDR, else POD_IP, else 0.0.0.0. ringleader_mfu\n"
            "  needs RINGLEADER_PEAK_TFLOPS (one device's peak).\n");
}

/* SIGUSR1: this process's collective records into the log (py-spy dump's
 * role: which collective each rank is in). The signal is blocked in every
 * thread and taken by this one, so the dump runs outside a handler; the
 * trainers an agent execs inherit the mask and start their own. */
static void *dump_on_usr1(void *arg) {
    const sigset_t *set = arg;
    for (;;) {
        int sig;
        if (sigwait(set, &sig) == 0) rl_comm_dump_all();
    }
    return NULL;
}

/* Before any other thread exists, so that all of them inherit the mask. */
static void start_dump_thread(void) {
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_t t;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) == 0 && pthread_create(&t, NULL, dump_on_usr1, &set) == 0)
        pthread_detach(t);
}

/* Why this process ends, for its termination message (say_why). */
static char g_why[600];

static int fail(const char *what, const rl_err *e) {
    snprintf(g_why, sizeof g_why, "%s%s%s", what, what[0] ? ": " : "", e->msg);
    fprintf(stderr, "ringleader-worker: error: %s\n", g_why);
    return rl_err_exit_status(e->code);
}

/* Stopped on SIGTERM with a committed checkpoint: nothing lost. */
static int preempted_exit(const rl_err *e) {
    snprintf(g_why, sizeof g_why, "%s", e->msg);
    fprintf(stderr, "ringleader-worker: %s (exit %d)\n", e->msg, RL_EXIT_PREEMPTED);
    return RL_EXIT_PREEMPTED;
}

/* A failure found here, not in pkg/: said like fail()'s. */
static int failf(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof g_why, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ringleader-worker: error: %s\n", g_why);
    return status;
}

/* The termination message, "<class>: <why>" (util.h), where Kubernetes
 * (or this process's agent) reads it. Never created here: the kubelet
 * provides /dev/termination-log and an agent its own file, so a run by
 * hand leaves nothing behind. */
static void say_why(const char *path, int status) {
    if (status == 0 || !path) return;
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return;
    char msg[700];
    int n = snprintf(msg, sizeof msg, "%s: %s\n", rl_fail_class_name(rl_exit_class(status)),
                     g_why[0] ? g_why : "see the log");
    ssize_t w = write(fd, msg, n > 0 && (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)w;
    close(fd);
}

/* Agents re-exec this binary as their trainers: point argv[0] at it. */
static int exec_self(char **argv) {
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        return failf(1, "cannot find own executable");
    }
    self[n] = '\0';
    argv[0] = self;
    return 0;
}

/* with_data: also the digest of the samples consumed (tests compare it) */
static void print_summary(const rl_run_summary *s, long long steps, bool with_data) {
    printf("trained %lld steps in %.1f s (%.0f tokens/s): final loss %.4f (unigram entropy %.4f)",
           steps, s->elapsed_s, s->tokens_per_s, s->final_loss, s->unigram_entropy);
    if (s->val_loss >= 0) printf(", val loss %.4f", s->val_loss);
    printf("\n");
    if (s->has_arith) {
        printf("held-out sums answered exactly: %d of %d (%.1f%%)\n", s->arith.correct,
               s->arith.total, 100.0 * s->arith.correct / (s->arith.total ? s->arith.total : 1));
        for (int i = 0; i < s->arith.n_shown; i++) printf("  %s\n", s->arith.shown[i]);
    }
    if (with_data)
        printf("data: %llu samples, digest %016llx\n", (unsigned long long)s->data_count,
               (unsigned long long)s->data_sum);
    fflush(stdout);
}

/* Metrics served by this process itself (no agent): the single process,
 * or local rank 0 of a job torchrun or srun started. */
static int own_metrics(const rl_node_stats_opts *so, rl_node_stats **ns) {
    rl_err e = {0};
    *ns = NULL;
    if (so->port == 0) return 0;
    return rl_node_stats_start(so, ns, &e) ? fail("", &e) : 0;
}

/* One trainer in this process (world size 1). */
static int run_single(const rl_job_config *cfg, const char *config_path, const char *save_params,
                      rl_node_stats *ns, const char *stats_fd) {
    rl_err e = {0};
    int rc;
    rl_trainer *tr;
    if ((rc = rl_trainer_new(&tr, cfg, NULL, &e))) {
        if (!config_path && rc == RL_EINPUT)
            return failf(RL_EXIT_USER, "%s (the embedded default reads the corpus that `make run` writes: "
                         "ringleader-prepare arith --out data/arith)", e.msg);
        return fail("", &e);
    }
    rl_trainer_set_stop(tr, &g_stop);
    /* to our agent's pipe when it launched us, else to own metrics */
    rl_stats_reporter reporter;
    rl_stats_reporter_attach(&reporter, tr, ns, stats_fd, NULL);
    rc = rl_trainer_run(tr, &e);
    if (!rc && save_params) rc = rl_trainer_save_params(tr, save_params, &e);
    if (rc) {
        bool preempted = rl_trainer_summary(tr)->preempt_saved;
        rl_trainer_free(tr);
        return preempted ? preempted_exit(&e) : fail("", &e);
    }
    print_summary(rl_trainer_summary(tr), rl_trainer_steps_done(tr), save_params != NULL);
    rl_trainer_free(tr);
    return 0;
}

/* --nproc-per-node auto / gpu (or PET_NPROC_PER_NODE=auto): one trainer per
 * visible GPU, as torchrun; one on a machine without, where OpenMP already
 * uses every core. Other values pass through. */
static int procs_per_node(int n) {
    if (n != RL_NPROC_AUTO) return n;
    int g = rl_train_visible_gpus();
    rl_log(RL_LOG_INFO, "nproc_per_node", "\"auto\":%d,\"gpus\":%d", g > 0 ? g : 1, g);
    return g > 0 ? g : 1;
}

/* What the command line says. -1 / NULL: not given. */
typedef struct flags {
    const char *config_path, *save_params, *maddr, *rdzv, *job, *nodes;
    long long steps, seed, nproc, node_rank, mport, metrics_port;
    bool print_config, print_schema;
} flags;

/* 0: parsed; -1: --help printed; else the exit status of a bad command
 * line (said so). */
static int parse_flags(int argc, char **argv, flags *f) {
    *f = (flags){.steps = -1, .seed = -1, .nproc = -1, .node_rank = -1, .mport = -1, .metrics_port = -1};
    const char *nproc = NULL;
    /* the config's own bounds (its table) */
    const rl_cfg_field *steps = rl_cfg_field_at(&rl_job_config_section, "train.steps", NULL),
                       *seed = rl_cfg_field_at(&rl_job_config_section, "train.seed", NULL);
    const rl_flag fl[] = {
        {"--config", NULL, RL_FLAG_STR, &f->config_path, 0, 0},
        {"--save-params", NULL, RL_FLAG_STR, &f->save_params, 0, 0},
        {"--master-addr", NULL, RL_FLAG_STR, &f->maddr, 0, 0},
        {"--nnodes", NULL, RL_FLAG_STR, &f->nodes, 0, 0},
        {"--rdzv", NULL, RL_FLAG_STR, &f->rdzv, 0, 0},
        {"--job", NULL, RL_FLAG_STR, &f->job, 0, 0},
        {"--nproc-per-node", NULL, RL_FLAG_STR, &nproc, 0, 0},
        {"--steps", NULL, RL_FLAG_INT, &f->steps, steps->min, steps->max},
        {"--seed", NULL, RL_FLAG_INT, &f->seed, seed->min, seed->max},
        {"--node-rank", NULL, RL_FLAG_INT, &f->node_rank, 0, 1 << 20},
        {"--master-port", NULL, RL_FLAG_INT, &f->mport, 0, 65535},
        {"--metrics-port", NULL, RL_FLAG_INT, &f->metrics_port, 0, 65535},
        {"--print-config", NULL, RL_FLAG_BOOL, &f->print_config, 0, 0},
        {"--print-schema", NULL, RL_FLAG_BOOL, &f->print_schema, 0, 0},
    };
    int rc = rl_flags_parse(PROG, argc, argv, 1, fl, (int)(sizeof fl / sizeof fl[0]), NULL, 0, NULL);
    if (rc == RL_FLAGS_HELP) usage(stdout);
    if (rc || !nproc) return rc;
    /* torchrun's auto / gpu, or a count */
    if (!strcmp(nproc, "auto") || !strcmp(nproc, "gpu")) {
        f->nproc = RL_NPROC_AUTO;
        return 0;
    }
    const rl_flag n = {"--nproc-per-node", NULL, RL_FLAG_INT, &f->nproc, 1, 1024};
    return rl_flag_value(PROG, &n, nproc);
}

/* The job config: --config FILE, else RINGLEADER_CONFIG (the operator hands
 * spec.training over so; trainers re-exec'd by an agent inherit it), else
 * the embedded default; over it the environment's variables, then the
 * flags; then its checks, once. *config_path names where it came from in
 * later messages (NULL: the default). */
static int load_config(const flags *f, const worker_env *w, rl_job_config *cfg, const char **config_path) {
    rl_err e = {0};
    int rc;
    const char *config_env = w->config;
    rl_job_config_default(cfg);
    *config_path = f->config_path;
    if (f->config_path) {
        char *text;
        size_t len;
        if ((rc = rl_read_file(f->config_path, &text, &len, &e))) return fail("--config", &e);
        rc = rl_job_config_parse(text, len, f->config_path, cfg, &e);
        free(text);
        if (rc) return fail("", &e);
    } else if (config_env) {
        if ((rc = rl_job_config_parse(config_env, strlen(config_env), "RINGLEADER_CONFIG", cfg, &e)))
            return fail("", &e);
        *config_path = "RINGLEADER_CONFIG";
    }
    const rl_cfg_section *s = &rl_job_config_section;
    if ((rc = worker_env_config(w, cfg, &e)) ||
        (f->rdzv && (rc = rl_cfg_set(s, cfg, "rdzv.backend", f->rdzv, "--rdzv", &e))) ||
        (f->job && (rc = rl_cfg_set(s, cfg, "rdzv.job", f->job, "--job", &e))) ||
        (f->nodes && (rc = worker_set_nodes(cfg, f->nodes, "--nnodes", &e))))
        return fail("", &e);
    if (f->steps >= 0) {
        cfg->train.steps = f->steps;
        if (cfg->train.warmup_steps > f->steps) cfg->train.warmup_steps = f->steps;
    }
    if (f->seed >= 0) cfg->train.seed = (uint64_t)f->seed;
    if ((rc = rl_cfg_check(s, cfg, *config_path ? *config_path : "config", &e))) return fail("", &e);
    return 0;
}

/* The elastic node agent (--rdzv k8s|etcd, or RINGLEADER_RDZV). */
static int run_agent(const rl_job_config *cfg, const flags *f, const worker_env *w, char **argv,
                     rl_node_stats_opts so) {
    rl_err e = {0};
    int rc;
    rl_log_init(-1);
    if (exec_self(argv)) return 1;
    rl_node_env ne;
    rl_elastic_env ee;
    rl_elastic_opts eo;
    if ((rc = rl_node_env_read(getenv, &ne, &e)) || (rc = worker_env_elastic(w, &ee, &e)) ||
        (rc = rl_elastic_setup(cfg, procs_per_node(f->nproc != -1 ? (int)f->nproc : ne.nproc_per_node), &ee, &eo, &e)))
        return fail("", &e);
    bool preempted = false;
    eo.argv = argv, eo.stop = &g_stop, eo.stop_sig = &g_stop_sig, eo.preempted = &preempted;
    eo.stats = so;
    rc = rl_elastic_run(&eo, &e);
    if (rc && preempted) return preempted_exit(&e);
    /* stopped by SIGTERM/SIGINT before anything was worth saving: say
     * so the shell way (128 + signal), which the operator and kubelet
     * read as "stopped", not as a failure of this pod */
    if (rc == RL_EABORT && g_stop_sig) {
        fail("", &e);
        return 128 + g_stop_sig;
    }
    return rc ? fail("", &e) : 0;
}

/* The local launcher (--nproc-per-node, PET_*): forks this node's trainers. */
static int run_launcher(const rl_job_config *cfg, const char *config_path, rl_node_env node, const flags *f,
                        const worker_env *w, char **argv, rl_node_stats_opts so) {
    rl_err e = {0};
    int rc, world = node.nnodes * node.nproc_per_node;
    if ((rc = rl_job_config_check_world(cfg, world, config_path ? config_path : "config", &e))) return fail("", &e);
    /* standalone: one node and no port asked for -> any free port */
    if (node.nnodes == 1 && f->mport < 0 && !w->master_port)
        node.master_port = 0;
    rl_log_init(-1);
    if (exec_self(argv)) return 1;
    /* SIGTERM -> SIGKILL must leave rank 0 its preemption checkpoint */
    double grace = cfg->ckpt.uri[0] && cfg->ckpt.preempt_budget_s + 5 > 10 ? cfg->ckpt.preempt_budget_s + 5 : 10;
    bool preempted = false;
    rl_launch_opts lo = {.node = node, .argv = argv, .grace_s = grace, .stop = &g_stop,
                         .secret = w->secret,
                         .stop_sig = &g_stop_sig, .preempted = &preempted, .stats = so};
    if ((rc = rl_launch(&lo, &e))) return preempted ? preempted_exit(&e) : fail("", &e);
    return 0;
}

/* One rank of a job torchrun, srun or our launcher started, or alone. */
static int run_rank(const rl_job_config *cfg, const char *config_path, const char *save_params, const worker_env *w,
                    const rl_node_stats_opts *so) {
    bool is_child = w->child;
    rl_err e = {0};
    int rc;
    rl_static_env env;
    bool found = false;
    if ((rc = rl_static_env_read(getenv, &env, &found, &e))) return fail("", &e);
    rl_node_stats *ns = NULL;
    if (!found || env.world == 1) {
        rl_log_init(-1);
        if ((rc = own_metrics(so, &ns))) return rc;
        rc = run_single(cfg, config_path, save_params, ns, w->stats_fd);
        rl_node_stats_stop(ns);
        return rc;
    }
    rl_log_rank(env.rank);
    /* started by torchrun or srun: local rank 0 stands in for the agent */
    if (!is_child && env.local_rank == 0 && (rc = own_metrics(so, &ns))) return rc;
    rl_run_summary sum = {0};
    rl_proc_opts po = {.cfg = cfg, .env = &env, .save_params = save_params, .stop = &g_stop,
                       .starting = &g_starting, .stats = ns, .host = w->ring_host, .store_prefix = w->store_prefix,
                       .secret = w->secret, .stats_fd = w->stats_fd, .store_hosted = w->store_hosted,
                       .ctl_fd = w->ctl_fd, .pod = w->pod_name, .node = w->node_name};
    rc = rl_proc_run(&po, &sum, &e);
    rl_node_stats_stop(ns);
    if (rc) {
        if (sum.preempt_saved) return preempted_exit(&e); /* stopped on SIGTERM, checkpoint committed */
        /* a peer went away or stopped answering: its own agent reports why */
        if (is_child && (rc == RL_EPEER || rc == RL_ETIMEOUT)) {
            fail("", &e);
            return RL_EXIT_PEER_LOST;
        }
        return fail("", &e);
    }
    if (env.rank == 0) print_summary(&sum, cfg->train.steps, save_params != NULL);
    return 0;
}

/* --print-config / --print-schema */
static int print_json(const rl_job_config *cfg, bool schema) {
    char *s = NULL;
    if (!schema) {
        s = rl_job_config_to_json(cfg);
    } else {
        cJSON *o = rl_cfg_schema(&rl_job_config_section, true);
        s = o ? cJSON_Print(o) : NULL;
        cJSON_Delete(o);
    }
    if (!s || printf("%s\n", s) < 0 || fflush(stdout) != 0) {
        free(s);
        fprintf(stderr, "ringleader-worker: error: cannot print the %s\n", schema ? "schema" : "config");
        return 1;
    }
    free(s);
    return 0;
}

/* `ringleader-worker generate`: text from a checkpoint, on stdout. */
static int generate(int argc, char **argv) {
    const char *uri = NULL, *prompt = NULL, *device = "auto";
    long long step = -1, tokens = 64, top_k = 0, seed = 1337;
    double temp = 0;
    const rl_flag fl[] = {
        {"--checkpoint", NULL, RL_FLAG_STR, &uri, 0, 0},
        {"--prompt", NULL, RL_FLAG_STR, &prompt, 0, 0},
        {"--step", NULL, RL_FLAG_INT, &step, 0, 1e15},
        {"--max-new-tokens", NULL, RL_FLAG_INT, &tokens, 1, 1 << 20},
        {"--temperature", NULL, RL_FLAG_NUM, &temp, 0, 100},
        {"--top-k", NULL, RL_FLAG_INT, &top_k, 0, 1 << 24},
        {"--seed", NULL, RL_FLAG_INT, &seed, 0, 9e15},
        {"--device", NULL, RL_FLAG_STR, &device, 0, 0},
    };
    int rc = rl_flags_parse(PROG " generate", argc, argv, 2, fl, (int)(sizeof fl / sizeof fl[0]), NULL, 0, NULL);
    if (rc == RL_FLAGS_HELP) {
        printf("usage: " PROG " generate --checkpoint URI --prompt TEXT [--step N] [--max-new-tokens 64]\n"
               "                         [--temperature 0] [--top-k 0] [--seed 1337] [--device auto]\n"
               "  Continues TEXT with the model of a checkpoint (file path, file:// or s3:// URI as in\n"
               "  checkpoint.uri; the newest committed step unless --step), on --device cpu, cuda\n"
               "  (GPU 0, bf16 as training computes) or auto (a GPU when one is visible), through the\n"
               "  tokenizer it carries (bytes when none), and prints the text. Temperature 0 is\n"
               "  greedy; above it, draws among the top-k likeliest (0: all). Stops at the\n"
               "  checkpoint's end-of-text token or after --max-new-tokens.\n");
        return 0;
    }
    if (rc) return rc;
    if (!uri || !*uri) return failf(RL_EXIT_USER, "--checkpoint: required (a checkpoint URI)");
    if (!prompt) return failf(RL_EXIT_USER, "--prompt: required");
    if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "auto"))
        return failf(RL_EXIT_USER, "--device: \"%s\" is not cpu, cuda or auto", device);
    rl_sample_opts o = {.max_new_tokens = (int)tokens, .temperature = temp, .top_k = (int)top_k, .seed = (uint64_t)seed};
    rl_err e = {0};
    char *text;
    size_t len;
    if ((rc = rl_generate(uri, step, device, prompt, &o, &text, &len, &e))) return fail("generate", &e);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    free(text);
    return fflush(stdout) ? failf(RL_EXIT_INFRA, "stdout: write failed") : 0;
}

static int run(int argc, char **argv, const worker_env *wp) {
    rl_err e = {0};
    if (argc > 1 && !strcmp(argv[1], "generate")) return generate(argc, argv);
    flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc) return rc < 0 ? 0 : rc;
    worker_env w = *wp;
    rl_job_config cfg;
    const char *config_path;
    if ((rc = load_config(&f, &w, &cfg, &config_path))) return rc;
    if (f.print_config || f.print_schema) return print_json(&cfg, f.print_schema);
    start_dump_thread();

    /* Which role: a node agent (launcher), one rank of a job, or alone. */
    bool is_child = w.child;
    g_starting = is_child;
    /* Metrics belong to the node agent (or a process without one); a
     * trainer an agent started inherits the port settings and ignores them. */
    rl_node_stats_opts so = {0};
    if (!is_child && (rc = worker_env_stats(&w, (int)f.metrics_port, &so, &e))) return fail("", &e);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!is_child && strcmp(cfg.rdzv.backend, "static") != 0) return run_agent(&cfg, &f, &w, argv, so);
    int nmin = cfg.rdzv.min_nodes, nmax = cfg.rdzv.max_nodes;
    if (f.nodes && nmin != nmax) {
        return failf(RL_EXIT_USER, "--nnodes %s: an elastic range needs --rdzv k8s or etcd", f.nodes);
    }
    if (!is_child) {
        rl_node_env node;
        if ((rc = rl_node_env_read(getenv, &node, &e))) return fail("", &e);
        if (f.nproc != -1) node.nproc_per_node = (int)f.nproc;
        node.nproc_per_node = procs_per_node(node.nproc_per_node);
        if (f.nodes) node.nnodes = nmin;
        if (f.node_rank >= 0) node.node_rank = (int)f.node_rank;
        if (f.mport >= 0) node.master_port = (int)f.mport;
        if (f.maddr) snprintf(node.master_addr, sizeof node.master_addr, "%s", f.maddr);
        if (node.node_rank >= node.nnodes) {
            return failf(RL_EXIT_USER, "--node-rank %d is not below --nnodes %d", node.node_rank, node.nnodes);
        }
        if (node.nproc_per_node > 0) return run_launcher(&cfg, config_path, node, &f, &w, argv, so);
    }
    return run_rank(&cfg, config_path, f.save_params, &w, &so);
}

int main(int argc, char **argv) {
    worker_env w;
    worker_env_read(&w);
    int rc = run(argc, argv, &w);
    say_why(w.termination_log, rc);
    return rc;
}
