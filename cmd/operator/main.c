/* ringleader-operator: the TrainingJob controller. Thin: flags -> pkg/operator. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "operator/operator.h"
#include "util/util.h"

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
    fprintf(stderr, "ringleader-operator: error: %s: %s\n", flag, why);
    return 2;
}

static int parse_num(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        char why[96];
        snprintf(why, sizeof why, "must be a number in [%g, %g]", lo, hi);
        return bad(flag, why);
    }
    *out = x;
    return 0;
}

/* ringleader-operator render -f FILE [--namespace NS]: the objects the
 * operator would create for that TrainingJob, as a YAML List on stdout. */
static int render_main(int argc, char **argv) {
    const char *file = NULL, *ns = "default", *metrics_ns = RL_OP_METRICS_NS_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-f") || !strcmp(a, "--filename")) && v) file = v, i++;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--namespace")) && v) ns = v, i++;
        else if (!strcmp(a, "--metrics-namespace-label") && v) metrics_ns = v, i++;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: ringleader-operator render -f FILE [--namespace NS] [--metrics-namespace-label KEY=VALUE]\n"
                   "  Prints, as a YAML List, the objects the operator would create for the TrainingJob\n"
                   "  in FILE (YAML or JSON), without a cluster: its uid and rendezvous secret are\n"
                   "  placeholders. NS (default: default) where the job names none.\n");
            return 0;
        } else {
            fprintf(stderr, "ringleader-operator render: error: unknown or incomplete flag '%s' (see --help)\n", a);
            return 2;
        }
    }
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
    char *nsbuf[64];
    int nns = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        struct { const char *flag; double lo, hi, *dst; } nums[] = {
            {"--metrics-port", 0, 65535, &metrics_port},
            {"--resync-seconds", 0.1, 3600, &resync},
            {"--stuck-terminating-seconds", 1, 86400, &stuck},
            {"--kube-api-qps", 0.1, 10000, &qps},
            {"--kube-api-burst", 1, 10000, &burst},
            {"--leader-elect-lease-duration", 1, 3600, &lease_s},
            {"--leader-elect-renew-deadline", 0.5, 3600, &renew_s},
            {"--leader-elect-retry-period", 0.1, 3600, &retry_s},
        };
        bool matched = false;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !matched; k++)
            if (!strcmp(a, nums[k].flag)) {
                if (parse_num(a, v, nums[k].lo, nums[k].hi, nums[k].dst)) return 2;
                matched = true, i++;
            }
        if (matched) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--kubeconfig") && v) {
            kubeconfig = v, i++;
        } else if (!strcmp(a, "--namespace") && v) {
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (nns == 63) return bad(a, "at most 63 namespaces");
                nsbuf[nns++] = t; /* copy lives until exit */
            }
            i++;
        } else if (!strcmp(a, "--leader-elect") || !strcmp(a, "--leader-elect=true")) {
            elect = true;
        } else if (!strcmp(a, "--leader-elect=false")) {
            elect = false;
        } else if (!strcmp(a, "--lease-name") && v) {
            lease_name = v, i++;
        } else if (!strcmp(a, "--lease-namespace") && v) {
            lease_ns = v, i++;
        } else if (!strcmp(a, "--log-level") && v) {
            level = v, i++;
        } else if (!strcmp(a, "--metrics-namespace-label") && v) {
            metrics_ns = v, i++;
        } else {
            fprintf(stderr, "ringleader-operator: error: unknown or incomplete flag '%s' (see --help)\n", a);
            return 2;
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
