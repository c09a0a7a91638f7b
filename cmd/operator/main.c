/* ringleader-operator: the TrainingJob controller. Thin: flags -> pkg/operator. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/flags.h"
#include "operator/operator.h"
#include "util/util.h"

#define PROG "ringleader-operator"

static volatile int g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ringleader-operator [--kubeconfig FILE] [--namespace NS[,NS...]]...\n"
            "                           [--leader-elect[=true|false]] [--lease-name NAME]\n"
            "                           [--lease-namespace NS] [--metrics-port PORT]\n"
            "                           [--log-level debug|info|warn|error] [--resync-seconds S]\n"
            "                           [--leader-elect-lease-duration S] [--leader-elect-renew-deadline S]\n"
            "                           [--leader-elect-retry-period S] [--stuck-terminating-seconds S]\n"
            "                           [--kube-api-qps 20] [--kube-api-burst 30]\n"
            "                           [--metrics-namespace-label KEY=VALUE]\n"
            "       ringleader-operator render -f FILE [--namespace NS]   (see render --help)\n"
            "  Reconciles TrainingJobs (ringleader.dev/v1alpha1) into pods, a headless Service,\n"
            "  RBAC and a rendezvous Secret. In a pod it uses the service account; elsewhere the\n"
            "  kubeconfig. --namespace limits it to those namespaces (default: all). Only the\n"
            "  holder of the Lease (POD_NAMESPACE/ringleader-operator) acts. A pod still there S\n"
            "  seconds (60) after its grace period shows in its job's status as stuck. Its API\n"
            "  requests are rate-limited client-side (--kube-api-qps/-burst, as client-go's).\n"
            "  Each job's NetworkPolicy opens its pods' metrics port to the namespaces with that\n"
            "  label (default " RL_OP_METRICS_NS_DEFAULT "; \"\": any namespace).\n");
}

static int bad(const char *flag, const char *why) {
    fprintf(stderr, PROG ": error: %s: %s\n", flag, why);
    return 2;
}

/* ringleader-operator render -f FILE [--namespace NS]: the objects the
 * operator would create for that TrainingJob, as a YAML List on stdout. */
static int render_main(int argc, char **argv) {
    const char *file = NULL, *ns = "default", *metrics_ns = RL_OP_METRICS_NS_DEFAULT;
    const rl_flag fl[] = {
        {"--filename", "-f", RL_FLAG_STR, &file, 0, 0},
        {"--namespace", "-n", RL_FLAG_STR, &ns, 0, 0},
        {"--metrics-namespace-label", NULL, RL_FLAG_STR, &metrics_ns, 0, 0},
    };
    int prc = rl_flags_parse(PROG " render", argc, argv, 1, fl, (int)(sizeof fl / sizeof fl[0]), NULL, 0, NULL);
    if (prc == RL_FLAGS_HELP) {
        printf("usage: ringleader-operator render -f FILE [--namespace NS] [--metrics-namespace-label KEY=VALUE]\n"
               "  Prints, as a YAML List, the objects the operator would create for the TrainingJob\n"
               "  in FILE (YAML or JSON), without a cluster: its uid and rendezvous secret are\n"
               "  placeholders. NS (default: default) where the job names none.\n");
        return 0;
    }
    if (prc) return prc;
    if (!file) {
        fprintf(stderr, "ringleader-operator render: error: -f FILE is required\n");
        return 2;
    }
    rl_err e = {0};
    char *text = NULL, *yaml = NULL;
    size_t len = 0;
    int rc = rl_op_check_label_pair(metrics_ns, "--metrics-namespace-label", &e);
    if (!rc) rc = rl_read_file(file, &text, &len, &e);
    if (!rc) rc = rl_op_render(text, len, file, ns, metrics_ns, &yaml, &e);
    if (!rc) fputs(yaml, stdout);
    else fprintf(stderr, "ringleader-operator render: error: %s\n", e.msg);
    free(text);
    free(yaml);
    return rl_err_exit_status(rc);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "render")) return render_main(argc - 1, argv + 1);
    const char *kubeconfig = NULL, *lease_name = "ringleader-operator", *lease_ns = getenv("POD_NAMESPACE");
    const char *level = NULL, *metrics_ns = RL_OP_METRICS_NS_DEFAULT;
    bool elect = true;
    double metrics_port = 8080, resync = 600, lease_s = 15, renew_s = 10, retry_s = 2, stuck = 60, qps = 20, burst = 30;
    rl_flag_list nslist = {.n = 0};
    const rl_flag fl[] = {
        {"--metrics-port", NULL, RL_FLAG_NUM, &metrics_port, 0, 65535},
        {"--resync-seconds", NULL, RL_FLAG_NUM, &resync, 0.1, 3600},
        {"--stuck-terminating-seconds", NULL, RL_FLAG_NUM, &stuck, 1, 86400},
        {"--kube-api-qps", NULL, RL_FLAG_NUM, &qps, 0.1, 10000},
        {"--kube-api-burst", NULL, RL_FLAG_NUM, &burst, 1, 10000},
        {"--leader-elect-lease-duration", NULL, RL_FLAG_NUM, &lease_s, 1, 3600},
        {"--leader-elect-renew-deadline", NULL, RL_FLAG_NUM, &renew_s, 0.5, 3600},
        {"--leader-elect-retry-period", NULL, RL_FLAG_NUM, &retry_s, 0.1, 3600},
        {"--kubeconfig", NULL, RL_FLAG_STR, &kubeconfig, 0, 0},
        {"--namespace", NULL, RL_FLAG_LIST, &nslist, 0, 0},
        {"--leader-elect", NULL, RL_FLAG_BOOL, &elect, 0, 0},
        {"--lease-name", NULL, RL_FLAG_STR, &lease_name, 0, 0},
        {"--lease-namespace", NULL, RL_FLAG_STR, &lease_ns, 0, 0},
        {"--log-level", NULL, RL_FLAG_STR, &level, 0, 0},
        {"--metrics-namespace-label", NULL, RL_FLAG_STR, &metrics_ns, 0, 0},
    };
    int prc = rl_flags_parse(PROG, argc, argv, 1, fl, (int)(sizeof fl / sizeof fl[0]), NULL, 0, NULL);
    if (prc == RL_FLAGS_HELP) usage(stdout);
    if (prc) return prc == RL_FLAGS_HELP ? 0 : prc;
    /* each --namespace may list several, comma-separated */
    char *nsbuf[64];
    int nns = 0;
    for (int k = 0; k < nslist.n; k++) {
        char *copy = strdup(nslist.v[k]), *save = NULL; /* lives until exit */
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (nns == 63) return bad("--namespace", "at most 63 namespaces");
            nsbuf[nns++] = t;
        }
    }
    nsbuf[nns] = NULL;
    if (level) {
        if (strcmp(level, "debug") && strcmp(level, "info") && strcmp(level, "warn") && strcmp(level, "error"))
            return bad("--log-level", "must be debug, info, warn or error");
        setenv("RL_LOG_LEVEL", level, 1);
    }
    rl_log_init(-1);
    rl_err e = {0};
    if (rl_op_check_label_pair(metrics_ns, "--metrics-namespace-label", &e)) {
        fprintf(stderr, "ringleader-operator: error: %s\n", e.msg);
        return 2;
    }
    if (elect && (!lease_ns || !*lease_ns))
        return bad("--lease-namespace", "needed for leader election (or POD_NAMESPACE from the downward API)");
    char host[256] = "", id[300];
    gethostname(host, sizeof host - 1);
    const char *pod = getenv("POD_NAME");
    snprintf(id, sizeof id, "%s", pod && *pod ? pod : host);

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    rl_op_opts o = {.kubeconfig = kubeconfig, .namespaces = (const char *const *)nsbuf, .leader_elect = elect,
                    .lease_name = lease_name, .lease_ns = lease_ns, .id = id, .resync_s = resync, .stuck_s = stuck,
                    .qps = qps, .burst = (int)burst,
                    .lease_s = lease_s, .renew_deadline_s = renew_s, .retry_s = retry_s,
                    .metrics_port = (int)metrics_port, .metrics_ns = metrics_ns, .stop = &g_stop};
    int rc = rl_op_run(&o, &e);
    if (rc) {
        fprintf(stderr, "ringleader-operator: error: %s\n", e.msg);
        return rl_err_exit_status(rc);
    }
    return 0;
}
