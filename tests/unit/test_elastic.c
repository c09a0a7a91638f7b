/* The elastic rendezvous end to end: node agents (the real
 * ringleader-worker binary, one process per "pod", each on its own
 * 127.0.N.x address) find each other only through the Kubernetes
 * stand-in's EndpointSlices and a Lease, train a small model with the tcp
 * backend, and re-form when agents are killed or added. Every run is then
 * checked against an uninterrupted static run from the checkpoint the last
 * round resumed from: the loss curves must agree. Timing is scaled down
 * (heartbeat 1 s x 5, lease 3 s) so the suite stays short. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcdtest.h"
#include "standin.h"
#include "testutil.h"
#include "util/util.h"

#define MAXA 6
#define STEPS 160
#define EVERY 20

typedef struct job {
    rl_test_standin s;
    rl_test_etcd etcd;
    bool use_etcd;
    char dir[64], cfg[128], ckpt[128];
    int net; /* agents live on 127.0.<net>.(10+i) */
    pid_t pid[MAXA];
    char log[MAXA][128];
} job;

static void write_config(job *j, const char *path, const char *ckpt, const char *backend) {
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"model\":{\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":257,\"max_position_embeddings\":64},"
             "\"train\":{\"seed\":7,\"steps\":%d,\"seq_len\":16,\"micro_batch\":1,\"global_batch_tokens\":1920,"
             "\"lr\":3e-3,\"min_lr\":3e-4,\"warmup_steps\":5,\"eval_every\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"backend\":\"tcp\",\"timeout_s\":10},"
             "\"checkpoint\":{\"uri\":\"%s\",\"every_steps\":%d,\"keep\":100},"
             "\"rdzv\":{\"backend\":\"%s\",\"job\":\"job\",\"min_nodes\":2,\"max_nodes\":5,\"heartbeat_s\":1,"
             "\"heartbeat_misses\":5,\"last_call_s\":2,\"lease_s\":3,\"renew_deadline_s\":2,\"retry_s\":0.5,"
             "\"stop_grace_s\":5,\"max_restarts\":3%s%s%s}}",
             STEPS, j->dir, ckpt, EVERY, backend, j->use_etcd ? ",\"etcd_endpoint\":\"" : "",
             j->use_etcd ? j->etcd.endpoint : "", j->use_etcd ? "\"" : "");
    rl_test_write(path, buf, strlen(buf));
}

static void kubectl_ok(job *j, const char *args, const char *in) {
    char out[8192];
    int st = rl_test_kubectl(&j->s, args, in, out, sizeof out);
    cr_assert_eq(st, 0, "kubectl %s: %s", args, out);
}

/* A pod of the job with its address, as the scheduler and kubelet would
 * leave it (the agent itself runs as a local process). */
static void add_pod(job *j, int i) {
    char y[1024], args[256];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"job-%d\",\"labels\":{\"app\":\"job\"}},"
             "\"spec\":{\"hostname\":\"job-%d\",\"subdomain\":\"job\",\"containers\":[{\"name\":\"w\",\"image\":\"x\"}]}}",
             i, i);
    kubectl_ok(j, "apply -f -", y);
    snprintf(args, sizeof args,
             "patch pod job-%d --subresource=status --type=merge -p '{\"status\":{\"podIP\":\"127.0.%d.%d\"}}'", i,
             j->net, 10 + i);
    kubectl_ok(j, args, NULL);
}

static void setup(job *j, int net, bool use_etcd) {
    memset(j, 0, sizeof *j);
    j->net = net;
    j->use_etcd = use_etcd;
    rl_test_arith_dir(j->dir, sizeof j->dir, 200000);
    snprintf(j->cfg, sizeof j->cfg, "%s/job.json", j->dir);
    snprintf(j->ckpt, sizeof j->ckpt, "%s/ckpt", j->dir);
    if (use_etcd) {
        cr_assert_eq(rl_test_etcd_start(&j->etcd), 0);
    } else {
        cr_assert_eq(rl_test_standin_start(&j->s, NULL), 0);
        kubectl_ok(j, "apply -f -",
                   "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"job\"},"
                   "\"spec\":{\"clusterIP\":\"None\",\"publishNotReadyAddresses\":true,"
                   "\"selector\":{\"app\":\"job\"},\"ports\":[{\"name\":\"rdzv\",\"port\":29400}]}}");
    }
    write_config(j, j->cfg, j->ckpt, use_etcd ? "etcd" : "k8s");
}

static void start_agent(job *j, int i, int nproc, const char *secret) {
    /* an agent with the wrong secret is an outsider: it has no pod of the job */
    if (!j->use_etcd && !strcmp(secret, "s3cret")) add_pod(j, i);
    snprintf(j->log[i], sizeof j->log[i], "%s/agent-%d.log", j->dir, i);
    char bin[4200], np[16], name[32], ip[32];
    snprintf(bin, sizeof bin, "%s/ringleader-worker", rl_test_bindir());
    snprintf(np, sizeof np, "%d", nproc);
    snprintf(name, sizeof name, "job-%d", i);
    snprintf(ip, sizeof ip, "127.0.%d.%d", j->net, 10 + i);
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) {
        int fd = open(j->log[i], O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1), dup2(fd, 2);
        setenv("POD_NAME", name, 1);
        setenv("POD_IP", ip, 1);
        setenv("RINGLEADER_RDZV_SECRET", secret, 1);
        setenv("OMP_NUM_THREADS", "1", 1);
        if (!j->use_etcd) setenv("KUBECONFIG", j->s.kubeconfig, 1);
        unsetenv("RANK"), unsetenv("WORLD_SIZE"), unsetenv("RINGLEADER_CHILD");
        execl(bin, bin, "--config", j->cfg, "--nproc-per-node", np, (char *)NULL);
        _exit(127);
    }
    j->pid[i] = p;
}

static void teardown(job *j) {
    for (int i = 0; i < MAXA; i++)
        if (j->pid[i] > 0) {
            kill(j->pid[i], SIGKILL);
            waitpid(j->pid[i], NULL, 0);
        }
    if (j->use_etcd) rl_test_etcd_stop(&j->etcd);
    else rl_test_standin_stop(&j->s);
    rl_test_rmdir(j->dir);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = '\0';
    fclose(f);
    return b;
}

/* JSON log lines of every agent log with this event, in time order. */
typedef struct ev {
    char ts[32];
    cJSON *j;
} ev;
static int cmp_ev(const void *a, const void *b) { return strcmp(((const ev *)a)->ts, ((const ev *)b)->ts); }

static int events(job *j, const char *event, ev *out, int max) {
    int n = 0;
    for (int i = 0; i < MAXA; i++) {
        if (!j->log[i][0]) continue;
        char *b = slurp(j->log[i]);
        for (char *l = strtok(b, "\n"); l; l = strtok(NULL, "\n")) {
            if (l[0] != '{' || !strstr(l, event)) continue;
            cJSON *x = cJSON_Parse(l);
            const cJSON *evn = cJSON_GetObjectItem(x, "event"), *ts = cJSON_GetObjectItem(x, "ts");
            if (n < max && cJSON_IsString(evn) && strcmp(evn->valuestring, event) == 0 && cJSON_IsString(ts)) {
                snprintf(out[n].ts, sizeof out[n].ts, "%s", ts->valuestring);
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

static void free_events(ev *e, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(e[i].j);
}

static double num(const ev *e, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(e->j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static ev g_ev[8192];

/* The highest step rank 0 has logged so far. */
static int last_step(job *j) {
    int n = events(j, "step", g_ev, 8192), best = 0;
    for (int i = 0; i < n; i++)
        if (num(&g_ev[i], "step") > best) best = (int)num(&g_ev[i], "step");
    free_events(g_ev, n);
    return best;
}

static void wait_step(job *j, int step, double timeout) {
    double end = rl_now() + timeout;
    while (last_step(j) < step && rl_now() < end) usleep(200000);
    cr_assert(last_step(j) >= step, "training did not reach step %d in %.0f s", step, timeout);
}

static int count_event(job *j, const char *event) {
    int n = events(j, event, g_ev, 8192);
    free_events(g_ev, n);
    return n;
}

/* Wait for every live agent to exit; all must exit 0. */
static void wait_done(job *j, double timeout) {
    double end = rl_now() + timeout;
    for (int i = 0; i < MAXA; i++) {
        if (j->pid[i] <= 0) continue;
        int st = -1;
        while (waitpid(j->pid[i], &st, WNOHANG) == 0 && rl_now() < end) usleep(100000);
        char *b = slurp(j->log[i]);
        size_t n = strlen(b);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "agent %d did not finish cleanly (%d); log tail:\n%s", i,
                  st, b + (n > 3000 ? n - 3000 : 0));
        free(b);
        j->pid[i] = 0;
    }
}

/* The losses of the last round against a static run of the same world
 * size from the checkpoint that round resumed from. */
static void check_resumed_curve(job *j, int want_min_round) {
    ev *e = g_ev;
    int n = events(j, "resume", e, 8192);
    int k = -1;
    double world = 0, ts_idx = -1;
    char ts[32] = "";
    for (int i = 0; i < n; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItem(e[i].j, "found")))
            k = (int)num(&e[i], "step"), world = num(&e[i], "world"), snprintf(ts, sizeof ts, "%s", e[i].ts), ts_idx = i;
    free_events(e, n);
    cr_assert(k > 0, "the last round did not resume from a checkpoint");
    (void)ts_idx;
    int rounds = count_event(j, "round_start");
    cr_expect(rounds >= want_min_round, "only %d round starts logged", rounds);
    /* the elastic run's losses after that resume */
    static double got[STEPS + 1];
    for (int s = 0; s <= STEPS; s++) got[s] = -1;
    n = events(j, "step", e, 8192);
    for (int i = 0; i < n; i++)
        if (strcmp(e[i].ts, ts) > 0) got[(int)num(&e[i], "step")] = num(&e[i], "loss");
    free_events(e, n);
    /* the reference: a fresh checkpoint dir holding only step k */
    char ref[160], cmd[1024], cfg[160], logp[160];
    snprintf(ref, sizeof ref, "%s/refckpt", j->dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp -r %s/step-%08d %s/ && printf 'step-%08d\\n' > %s/latest", ref, j->ckpt,
             k, ref, k, ref);
    cr_assert_eq(system(cmd), 0);
    snprintf(cfg, sizeof cfg, "%s/ref.json", j->dir);
    write_config(j, cfg, ref, "static");
    snprintf(logp, sizeof logp, "%s/ref.log", j->dir);
    snprintf(cmd, sizeof cmd, "cd %s && OMP_NUM_THREADS=1 RL_NO_PROGRESS=1 %s/ringleader-worker --config %s --nproc-per-node %d >%s 2>&1",
             j->dir, rl_test_bindir(), cfg, (int)world, logp);
    cr_assert_eq(system(cmd), 0, "the reference run failed: see %s", logp);
    char *b = slurp(logp);
    int compared = 0;
    for (char *l = strtok(b, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *x = cJSON_Parse(l);
        const cJSON *evn = cJSON_GetObjectItem(x, "event");
        if (cJSON_IsString(evn) && !strcmp(evn->valuestring, "step")) {
            int s = cJSON_GetObjectItem(x, "step")->valueint;
            double loss = cJSON_GetObjectItem(x, "loss")->valuedouble;
            if (s > k && s <= STEPS && got[s] >= 0) {
                cr_expect(fabs(got[s] - loss) <= 2e-4, "step %d: elastic loss %.5f, reference %.5f", s, got[s], loss);
                compared++;
            }
        }
        cJSON_Delete(x);
    }
    free(b);
    cr_expect(compared >= (STEPS - k) * 9 / 10, "compared only %d steps after step %d", compared, k);
    cr_log_info("resumed from step %d with world %.0f; %d steps match the reference", k, world, compared);
}

static void kill_agent(job *j, int i) {
    kill(j->pid[i], SIGKILL);
    waitpid(j->pid[i], NULL, 0);
    j->pid[i] = 0;
}

static int leader_index(job *j) {
    int n = events(j, "leader_elected", g_ev, 8192), who = -1;
    for (int i = 0; i < n; i++) {
        const char *id = cJSON_GetObjectItem(g_ev[i].j, "id")->valuestring;
        who = atoi(id + 4);
    }
    free_events(g_ev, n);
    return who;
}

static void kill_and_recover(int net, bool kill_leader, bool use_etcd) {
    job j;
    setup(&j, net, use_etcd);
    int nproc[4] = {2, 1, 1, 1};
    for (int i = 0; i < 4; i++) start_agent(&j, i, nproc[i], "s3cret");
    wait_step(&j, EVERY + 10, 120);
    int l = leader_index(&j), victim = kill_leader ? l : (l == 3 ? 2 : 3);
    cr_assert(l >= 0, "no leader elected");
    kill_agent(&j, victim);
    wait_done(&j, 180);
    check_resumed_curve(&j, 2);
    teardown(&j);
}

Test(elastic, follower_killed_others_reform_and_continue, .timeout = 300) { kill_and_recover(31, false, false); }

Test(elastic, leader_killed_others_reform_and_continue, .timeout = 300) { kill_and_recover(32, true, false); }

Test(elastic, fifth_agent_joins_at_the_next_round, .timeout = 300) {
    job j;
    setup(&j, 33, false);
    for (int i = 0; i < 4; i++) start_agent(&j, i, 1, "s3cret");
    wait_step(&j, EVERY + 5, 120);
    start_agent(&j, 4, 1, "s3cret");
    wait_done(&j, 180);
    /* the last round has five nodes */
    int n = events(&j, "round_closed", g_ev, 8192);
    cr_assert(n > 0);
    cr_expect_eq(num(&g_ev[n - 1], "nodes"), 5);
    free_events(g_ev, n);
    check_resumed_curve(&j, 2);
    teardown(&j);
}

Test(elastic, wrong_secret_is_refused_and_the_round_goes_on, .timeout = 300) {
    job j;
    setup(&j, 34, false);
    for (int i = 0; i < 3; i++) start_agent(&j, i, 1, "s3cret");
    wait_step(&j, 10, 120);
    /* the three may have needed two rounds to gather (elastic: min 2) */
    wait_step(&j, last_step(&j) + 3, 60);
    int rounds = count_event(&j, "round_closed");
    start_agent(&j, 3, 1, "not-the-secret");
    int st = -1;
    double end = rl_now() + 60;
    while (waitpid(j.pid[3], &st, WNOHANG) == 0 && rl_now() < end) usleep(100000);
    j.pid[3] = 0;
    char *b = slurp(j.log[3]);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "the impostor should exit 2, got %d: %s", st, b);
    cr_expect(strstr(b, "wrong rendezvous secret") && !strstr(b, "s3cret"), "%s", b);
    free(b);
    cr_expect(count_event(&j, "store_auth_refused") >= 1, "the leader must log the refusal");
    wait_done(&j, 180);
    cr_expect_eq(count_event(&j, "round_closed"), rounds, "the round must not be disturbed");
    teardown(&j);
}

Test(elastic, etcd_rendezvous_follower_killed, .timeout = 300) { kill_and_recover(35, false, true); }
