/* See jobtest.h. */
#include "jobtest.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"
#include "util/util.h"

char *rl_test_slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = n > 0 ? fread(b, 1, (size_t)n, f) : 0;
    b[got] = '\0';
    fclose(f);
    return b;
}

void rl_test_job_write_config(const rl_test_job *j, const char *path, const char *ckpt, const char *backend) {
    char buf[4096], etcd[128] = "";
    if (j->use_etcd) snprintf(etcd, sizeof etcd, ",\"etcd_endpoint\":\"%s\"", j->etcd.endpoint);
    /* 120 sequences per step by default: a whole accumulation count for
     * every world size from 1 to 6, 8, 10 and 12 */
    int n = snprintf(buf, sizeof buf,
             "{\"model\":{\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":257,\"max_position_embeddings\":64},"
             "\"train\":{\"seed\":7,\"steps\":%d,\"seq_len\":16,\"micro_batch\":1,\"global_batch_tokens\":%d,"
             "\"lr\":3e-3,\"min_lr\":3e-4,\"warmup_steps\":5,\"eval_every\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"backend\":\"tcp\",\"timeout_s\":10},"
             "\"checkpoint\":{\"uri\":\"%s\",\"every_steps\":%d,\"keep\":1000},"
             "\"rdzv\":{\"backend\":\"%s\",\"job\":\"job\"%s%s%s}}",
             j->steps, 16 * j->seqs, j->dir, ckpt, j->every, backend, etcd, j->rdzv[0] ? "," : "", j->rdzv);
    FILE *f = fopen(path, "w");
    if (f) {
        fwrite(buf, 1, (size_t)n, f);
        fclose(f);
    }
}

static int kubectl(rl_test_job *j, const char *args, const char *in, char *why, size_t wn) {
    char out[8192];
    int st = rl_test_kubectl(&j->s, args, in, out, sizeof out);
    if (st != 0) snprintf(why, wn, "kubectl %.200s: %.300s", args, out);
    return st == 0 ? 0 : -1;
}

int rl_test_job_setup(rl_test_job *j, int net, bool use_etcd, int steps, int every, const char *rdzv,
                      char *why, size_t wn) {
    memset(j, 0, sizeof *j);
    j->net = net, j->use_etcd = use_etcd, j->steps = steps, j->every = every, j->seqs = 120;
    snprintf(j->rdzv, sizeof j->rdzv, "%s", rdzv ? rdzv : "");
    const char *b = getenv("RL_TEST_BIN");
    if (!realpath(b && *b ? b : "bin", j->bindir)) {
        snprintf(why, wn, "binaries not found (RL_TEST_BIN or bin/)");
        return -1;
    }
    snprintf(j->dir, sizeof j->dir, "/tmp/rljob-XXXXXX");
    rl_err e = {0};
    rl_arith_opts ao = {.digits = 2, .holdout = 0.1, .seed = 7, .train_tokens = 200000};
    if (!mkdtemp(j->dir) || rl_arith_generate(&ao, j->dir, &e) != RL_OK) {
        snprintf(why, wn, "test data: %s", e.msg);
        return -1;
    }
    snprintf(j->cfg, sizeof j->cfg, "%s/job.json", j->dir);
    snprintf(j->ckpt, sizeof j->ckpt, "%s/ckpt", j->dir);
    if (use_etcd) {
        if (rl_test_etcd_start(&j->etcd) != 0) {
            snprintf(why, wn, "etcd did not start");
            return -1;
        }
    } else {
        if (rl_test_standin_start(&j->s, NULL) != 0) {
            snprintf(why, wn, "the Kubernetes stand-in did not start");
            return -1;
        }
        if (kubectl(j, "apply -f -",
                    "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"job\"},"
                    "\"spec\":{\"clusterIP\":\"None\",\"publishNotReadyAddresses\":true,"
                    "\"selector\":{\"app\":\"job\"},\"ports\":[{\"name\":\"rdzv\",\"port\":29400}]}}",
                    why, wn))
            return -1;
    }
    rl_test_job_write_config(j, j->cfg, j->ckpt, use_etcd ? "etcd" : "k8s");
    return 0;
}

int rl_test_job_add_pod(rl_test_job *j, int i) {
    char y[1024], args[256], why[512];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"job-%d\",\"labels\":{\"app\":\"job\"}},"
             "\"spec\":{\"hostname\":\"job-%d\",\"subdomain\":\"job\",\"containers\":[{\"name\":\"w\",\"image\":\"x\"}]}}",
             i, i);
    snprintf(args, sizeof args,
             "patch pod job-%d --subresource=status --type=merge -p '{\"status\":{\"podIP\":\"127.0.%d.%d\"}}'", i,
             j->net, 10 + i);
    if (kubectl(j, "apply -f -", y, why, sizeof why) || kubectl(j, args, NULL, why, sizeof why)) {
        fprintf(stderr, "jobtest: %s\n", why);
        return -1;
    }
    return 0;
}

int rl_test_job_start_agent(rl_test_job *j, int i, int nproc, const char *secret, bool make_pod) {
    if (!j->use_etcd && make_pod && rl_test_job_add_pod(j, i) != 0) return -1;
    snprintf(j->log[i], sizeof j->log[i], "%s/agent-%d.log", j->dir, i);
    char bin[4200], np[16], name[32], ip[32];
    snprintf(bin, sizeof bin, "%s/ringleader-worker", j->bindir);
    snprintf(np, sizeof np, "%d", nproc);
    snprintf(name, sizeof name, "job-%d", i);
    snprintf(ip, sizeof ip, "127.0.%d.%d", j->net, 10 + i);
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        /* an agent must not outlive a failed test (it would hold its
         * address and port for the next one) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(j->log[i], O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1), dup2(fd, 2);
        setenv("POD_NAME", name, 1);
        setenv("POD_IP", ip, 1);
        setenv("RINGLEADER_RDZV_SECRET", secret, 1);
        setenv("OMP_NUM_THREADS", "1", 1);
        setenv("RL_NO_PROGRESS", "1", 1);
        if (!j->use_etcd) setenv("KUBECONFIG", j->s.kubeconfig, 1);
        unsetenv("RANK"), unsetenv("WORLD_SIZE"), unsetenv("RINGLEADER_CHILD");
        execl(bin, bin, "--config", j->cfg, "--nproc-per-node", np, (char *)NULL);
        _exit(127);
    }
    j->pid[i] = p;
    return 0;
}

void rl_test_job_kill(rl_test_job *j, int i) {
    if (j->pid[i] <= 0) return;
    kill(j->pid[i], SIGKILL);
    waitpid(j->pid[i], NULL, 0);
    j->pid[i] = 0;
}

int rl_test_job_wait(rl_test_job *j, int i, double timeout) {
    double end = rl_now() + timeout;
    int st = -1;
    while (j->pid[i] > 0) { /* looks at least once, even with timeout 0 */
        pid_t r = waitpid(j->pid[i], &st, WNOHANG);
        if (r == j->pid[i]) {
            j->pid[i] = 0;
            return st;
        }
        if (rl_now() >= end) break;
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    return -1;
}

void rl_test_job_teardown(rl_test_job *j) {
    for (int i = 0; i < RL_TEST_MAXA; i++) rl_test_job_kill(j, i);
    if (j->use_etcd) rl_test_etcd_stop(&j->etcd);
    else rl_test_standin_stop(&j->s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", j->dir);
    if (getenv("RL_TEST_KEEP_JOB")) fprintf(stderr, "jobtest: kept %s\n", j->dir);
    else if (j->dir[0] && system(cmd) != 0) fprintf(stderr, "jobtest: could not remove %s\n", j->dir);
}

static int cmp_ev(const void *a, const void *b) {
    const rl_test_ev *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* "2026-11-23T17:23:22.076Z" -> unix seconds */
static double iso_time(const char *s) {
    struct tm tm = {0};
    int ms = 0;
    if (sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &ms) < 6)
        return 0;
    tm.tm_year -= 1900, tm.tm_mon -= 1;
    return (double)timegm(&tm) + ms / 1000.0;
}

int rl_test_job_events(const rl_test_job *j, const char *event, rl_test_ev *out, int max) {
    int n = 0;
    for (int i = 0; i < RL_TEST_MAXA; i++) {
        if (!j->log[i][0]) continue;
        char *b = rl_test_slurp(j->log[i]), *save = NULL;
        for (char *l = strtok_r(b, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            if (l[0] != '{' || !strstr(l, event)) continue;
            cJSON *x = cJSON_Parse(l);
            const cJSON *evn = cJSON_GetObjectItem(x, "event"), *ts = cJSON_GetObjectItem(x, "ts");
            if (n < max && cJSON_IsString(evn) && strcmp(evn->valuestring, event) == 0 && cJSON_IsString(ts)) {
                snprintf(out[n].ts, sizeof out[n].ts, "%s", ts->valuestring);
                out[n].t = iso_time(ts->valuestring);
                out[n++].j = x;
            } else {
                cJSON_Delete(x);
            }
        }
        free(b);
    }
    qsort(out, (size_t)n, sizeof *out, cmp_ev);
    return n;
}

void rl_test_job_events_free(rl_test_ev *e, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(e[i].j);
}

double rl_test_ev_num(const rl_test_ev *e, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(e->j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

int rl_test_job_last_step(const rl_test_job *j) {
    static rl_test_ev ev[16384];
    int n = rl_test_job_events(j, "step", ev, 16384), best = 0;
    for (int i = 0; i < n; i++)
        if (rl_test_ev_num(&ev[i], "step") > best) best = (int)rl_test_ev_num(&ev[i], "step");
    rl_test_job_events_free(ev, n);
    return best;
}
