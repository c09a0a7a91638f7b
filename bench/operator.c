/* The operator's request budget (issue 14): ringleader-operator against the
 * Kubernetes stand-in, its requests counted in the stand-in's log by the
 * operator's own user.
 *  - operator_scale: JOBS TrainingJobs (default 200) created at once; this
 *    bench plays the kubelet (each pod marked ready as it appears); per job
 *    the time from its create to its status saying Running (p50, p99), and
 *    the operator's requests until all are Running;
 *  - operator_requests: then all jobs idle and Running for IDLE_S seconds
 *    (default 60): the operator's requests per idle job per minute (goal
 *    <= 1: reads come from its watch caches, owned objects are looked up
 *    again only every 10 minutes, the resync is 10 minutes).
 * One JSON line each. Environment: BENCH_JOBS, BENCH_IDLE_S, RL_TEST_BIN
 * (where ringleader-operator is; default bin/). */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tests/support/standin.h"
#include "k8s/k8s.h"
#include "util/util.h"

#define TOKEN "bench-operator-token"
#define USER "bench-operator"
#define MAXJ 2000

static rl_test_standin s;
static pid_t op = -1;

static void die(const char *what) {
    fprintf(stderr, "bench operator: %s\n", what);
    if (op > 0) kill(op, SIGKILL);
    rl_test_standin_stop(&s);
    exit(1);
}

/* Requests the operator made so far (lines of the stand-in's log with its user). */
static long operator_requests(void) {
    char p[400], line[4096];
    snprintf(p, sizeof p, "%s/standin.log", s.dir);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    long n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"user\": \"" USER "\"")) n++;
    fclose(f);
    return n;
}

static void start_operator(void) {
    char body[256], path[400], bin[1200], log[400];
    snprintf(body, sizeof body, "{\"token\":\"" TOKEN "\",\"user\":\"" USER "\"}");
    if (rl_test_standin_admin(&s, "POST", "/tokens", body, NULL, 0) != 200) die("cannot register a token");
    snprintf(path, sizeof path, "%s/operator.kubeconfig", s.dir);
    if (rl_test_standin_write_kubeconfig(&s, TOKEN, NULL, path) != 0) die("cannot write a kubeconfig");
    const char *b = getenv("RL_TEST_BIN");
    snprintf(bin, sizeof bin, "%s/ringleader-operator", b && *b ? b : "bin");
    snprintf(log, sizeof log, "%s/operator.log", s.dir);
    op = fork();
    if (op < 0) die("fork");
    if (op == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "--kubeconfig", path, "--leader-elect=false", "--metrics-port", "0", "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The kubelet's report of a started, ready worker: phase Running, Ready,
 * the container running. */
static void set_running(cJSON *pod) {
    char ts[64];
    rl_k8s_microtime_format(rl_wall_now(), ts, sizeof ts);
    ts[19] = 'Z', ts[20] = '\0'; /* RFC 3339 seconds */
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "phase", "Running");
    cJSON *c = cJSON_AddArrayToObject(st, "conditions"), *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "Ready");
    cJSON_AddStringToObject(r, "status", "True");
    cJSON_AddItemToArray(c, r);
    cJSON *cs = cJSON_AddArrayToObject(st, "containerStatuses"), *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "name", "worker");
    cJSON_AddBoolToObject(w, "ready", true);
    cJSON_AddNumberToObject(w, "restartCount", 0);
    cJSON_AddStringToObject(w, "image", "ringleader:bench");
    cJSON_AddStringToObject(w, "imageID", "");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(w, "state"), "running"), "startedAt", ts);
    cJSON_AddItemToArray(cs, w);
    cJSON_ReplaceItemInObject(pod, "status", st);
}

/* Report every pod not yet reported as running and ready (the kubelet's
 * part); returns how many pods exist. */
static int play_kubelet(rl_k8s *k, char ready[][64], int *nready) {
    cJSON *list = NULL;
    long code = 0;
    rl_err e = {0};
    if (rl_k8s_get(k, "/api/v1/namespaces/default/pods", &code, &list, &e) != RL_OK) die(e.msg);
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(list, "items")) {
        n++;
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(it, "metadata"), "name"));
        bool seen = false;
        for (int i = 0; i < *nready && !seen; i++) seen = !strcmp(ready[i], name);
        if (seen || !name || *nready >= MAXJ) continue;
        char path[300];
        snprintf(path, sizeof path, "/api/v1/namespaces/default/pods/%s/status", name);
        cJSON *pod = cJSON_Duplicate(it, 1);
        set_running(pod);
        if (rl_k8s_replace(k, path, pod, &code, NULL, &e) == RL_OK) snprintf(ready[(*nready)++], 64, "%s", name);
        cJSON_Delete(pod);
    }
    cJSON_Delete(list);
    return n;
}

int main(void) {
    int jobs = getenv("BENCH_JOBS") ? atoi(getenv("BENCH_JOBS")) : 200;
    double idle_s = getenv("BENCH_IDLE_S") ? atof(getenv("BENCH_IDLE_S")) : 60;
    if (jobs < 1 || jobs > MAXJ || idle_s < 1) die("BENCH_JOBS 1..2000, BENCH_IDLE_S >= 1");
    rl_log_init(-1);
    rl_log_set_level(RL_LOG_ERROR);
    if (rl_test_standin_start(&s, NULL) != 0) die("the stand-in did not start");
    char out[4096];
    if (rl_test_kubectl(&s, "apply -f manifests/crd.yaml", NULL, out, sizeof out) != 0) die(out);
    start_operator();
    rl_k8s *k;
    rl_err e = {0};
    if (rl_k8s_connect(s.kubeconfig, NULL, &k, &e) != RL_OK) die(e.msg);

    static double created[MAXJ], running[MAXJ];
    static char ready[MAXJ][64];
    int nready = 0;
    long before = operator_requests();
    double t0 = rl_now();
    for (int i = 0; i < jobs; i++) {
        char y[1024];
        snprintf(y, sizeof y,
                 "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"j%d\"},"
                 "\"spec\":{\"image\":\"ringleader:bench\",\"replicas\":1,\"metricsPort\":0,"
                 "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}",
                 i);
        cJSON *obj = cJSON_Parse(y);
        long code = 0;
        if (rl_k8s_create(k, "/apis/ringleader.dev/v1alpha1/namespaces/default/trainingjobs", obj, &code, NULL, &e))
            die(e.msg);
        cJSON_Delete(obj);
        created[i] = rl_now();
    }
    /* until every job says Running (bounded) */
    int done = 0;
    while (done < jobs && rl_now() - t0 < 600) {
        play_kubelet(k, ready, &nready);
        cJSON *list = NULL;
        long code = 0;
        if (rl_k8s_get(k, "/apis/ringleader.dev/v1alpha1/namespaces/default/trainingjobs", &code, &list, &e))
            die(e.msg);
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(list, "items")) {
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(it, "metadata"), "name"));
            const char *phase = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(it, "status"), "phase"));
            int i = name && name[0] == 'j' ? atoi(name + 1) : -1;
            if (i >= 0 && i < jobs && !running[i] && phase && !strcmp(phase, "Running")) {
                running[i] = rl_now() - created[i];
                done++;
            }
        }
        cJSON_Delete(list);
        usleep(100000);
    }
    if (done < jobs) die("not every job reached Running in 600 s");
    long scale_requests = operator_requests() - before;
    qsort(running, (size_t)jobs, sizeof running[0], cmp_double);
    printf("{\"bench\":\"operator_scale\",\"jobs\":%d,\"create_to_running_p50_s\":%.3f,"
           "\"create_to_running_p99_s\":%.3f,\"all_running_s\":%.3f,\"operator_requests\":%ld}\n",
           jobs, running[jobs / 2], running[(jobs * 99) / 100 < jobs ? (jobs * 99) / 100 : jobs - 1],
           rl_now() - t0, scale_requests);
    fflush(stdout);

    /* idle: nothing changes; what does the operator still ask? */
    sleep(2); /* the last status writes' echoes settle */
    long idle0 = operator_requests();
    usleep((useconds_t)(idle_s * 1e6));
    long idle = operator_requests() - idle0;
    printf("{\"bench\":\"operator_requests\",\"jobs\":%d,\"idle_s\":%.0f,\"requests\":%ld,"
           "\"requests_per_job_minute\":%.4f}\n",
           jobs, idle_s, idle, (double)idle / jobs / (idle_s / 60));
    rl_k8s_free(k);
    kill(op, SIGTERM);
    waitpid(op, NULL, 0);
    rl_test_standin_stop(&s);
    return 0;
}
