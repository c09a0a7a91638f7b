/* Start/stop a real etcd for tests; see etcdtest.h. */
#include "etcdtest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"
#include "http/http.h"

static const char *etcd_bin(void) {
    const char *env = getenv("RL_TEST_ETCD");
    if (env && *env) return env;
    if (access("/usr/bin/etcd", X_OK) == 0) return "/usr/bin/etcd";
    return "etcd";
}

static void dump_log(const rl_test_etcd *t) {
    char p[400];
    snprintf(p, sizeof p, "%s/etcd.log", t->dir);
    rl_test_daemon_log_tail(p, 4000); /* the tail is where the reason is */
}

static bool answers(void *ud) {
    const rl_test_etcd *t = ud;
    rl_http *h = NULL;
    if (rl_http_new(&h, NULL) != RL_OK) return false;
    char url[128];
    snprintf(url, sizeof url, "%s/v3/kv/range", t->endpoint);
    static const char body[] = "{\"key\":\"AA==\"}";
    rl_http_req req = {.method = "POST", .url = url, .body = body, .body_len = sizeof body - 1,
                       .connect_timeout_s = 1, .timeout_s = 2};
    rl_http_resp r = {0};
    int rc = rl_http_do(h, &req, &r, NULL);
    bool ok = rc == RL_OK && r.status == 200 && r.body && strstr(r.body, "\"header\"");
    rl_http_resp_free(&r);
    rl_http_free(h);
    return ok;
}

/* fork/exec etcd on t's ports and dir; wait until it answers. */
static int launch(rl_test_etcd *t) {
    char client[64], peer[64], data[320], logp[320];
    snprintf(client, sizeof client, "http://127.0.0.1:%d", t->client_port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", t->peer_port);
    char cluster[96];
    snprintf(cluster, sizeof cluster, "default=%s", peer);
    snprintf(data, sizeof data, "%s/data", t->dir);
    snprintf(logp, sizeof logp, "%s/etcd.log", t->dir);
    snprintf(t->endpoint, sizeof t->endpoint, "%s", client);
    const char *bin = etcd_bin();
    char *argv[] = {(char *)bin, "--name", "default", "--data-dir", data,
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", cluster,
                    /* idle watch streams still carry a progress message every second */
                    "--experimental-watch-progress-notify-interval", "1s",
                    "--logger", "zap", "--log-outputs", "stderr", NULL};
    rl_test_daemon_opts o = {.argv = argv, .log = logp, .death_signal = SIGKILL};
    t->pid = rl_test_daemon_spawn(&o);
    if (t->pid < 0) return -1;
    int rc = rl_test_daemon_await(&t->pid, answers, t, 15.0, 0.05, NULL);
    if (rc == -2) rl_test_etcd_kill(t);
    return rc == 0 ? 0 : -1;
}

static void rmrf(const char *dir) {
    if (strncmp(dir, "/tmp/rl-etcd-", 13) != 0) return; /* only what we made */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

int rl_test_etcd_start(rl_test_etcd *t) {
    memset(t, 0, sizeof *t);
    t->pid = -1;
    /* a port picked free may be taken before etcd binds it: a few tries */
    for (int attempt = 0; attempt < 3; attempt++) {
        snprintf(t->dir, sizeof t->dir, "/tmp/rl-etcd-XXXXXX");
        if (!mkdtemp(t->dir)) {
            fprintf(stderr, "etcdtest: mkdtemp: %s\n", strerror(errno));
            t->dir[0] = '\0';
            return -1;
        }
        int ports[2];
        bool got = rl_test_daemon_free_ports(ports, 2) == 0;
        if (got) t->client_port = ports[0], t->peer_port = ports[1];
        if (got && launch(t) == 0) return 0;
        dump_log(t);
        rmrf(t->dir);
        t->dir[0] = '\0';
    }
    fprintf(stderr, "etcdtest: etcd (%s) did not start\n", etcd_bin());
    return -1;
}

void rl_test_etcd_kill(rl_test_etcd *t) { rl_test_daemon_stop(&t->pid, 0); }

int rl_test_etcd_restart(rl_test_etcd *t) {
    rl_test_etcd_kill(t);
    /* the ports were just released by our own process: they are usually
     * free at once, but give a late TIME_WAIT or a slow exit a few tries */
    for (int attempt = 0; attempt < 5; attempt++) {
        if (launch(t) == 0) return 0;
        usleep(200 * 1000);
    }
    dump_log(t);
    return -1;
}

void rl_test_etcd_stop(rl_test_etcd *t) {
    rl_test_etcd_kill(t);
    if (t->dir[0]) rmrf(t->dir);
    t->dir[0] = '\0';
}
