/* Start/stop a real radosgw for tests; see rgwtest.h. The settings come
 * from ../shared/notes/real-servers.md: without the crc/secure modes
 * radosgw waits for ever, without pool size 1 no PG goes active, and the
 * short paxos intervals take startup from ~13 s to ~2 s. */
#include "rgwtest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"
#include "http/http.h"
#include "util/util.h"

static void random_hex(char *out, size_t nhex) {
    static const char hx[] = "0123456789abcdef";
    unsigned char b[64] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, b, (nhex + 1) / 2) < 0) {
        for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)(rand() ^ getpid());
    }
    if (fd >= 0) close(fd);
    for (size_t i = 0; i < nhex; i++) out[i] = hx[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[nhex] = '\0';
}

static void uuid(char *out) { /* RFC 4122 layout, random (version 4) */
    char h[33];
    random_hex(h, 32);
    h[12] = '4', h[16] = "89ab"[h[16] % 4];
    snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16, h + 20);
}

/* argv with stdout+stderr appended to log, in dir; background: return
 * the pid at once (it dies with the test process), else wait at most
 * timeout_s and return the exit status (-1: killed at the deadline). */
static int spawn(char *const argv[], const char *log, bool background, double timeout_s, const char *dir) {
    rl_test_daemon_opts o = {.argv = argv, .log = log, .dir = dir, .death_signal = SIGKILL};
    return background ? rl_test_daemon_spawn(&o) : rl_test_daemon_run(&o, timeout_s);
}

static bool answers(void *ud) {
    const rl_test_rgw *r = ud;
    rl_http *h = NULL;
    if (rl_http_new(&h, NULL) != RL_OK) return false;
    rl_http_req req = {.method = "GET", .url = r->endpoint, .connect_timeout_s = 1, .timeout_s = 2};
    rl_http_resp resp = {0};
    bool ok = rl_http_do(h, &req, &resp, NULL) == RL_OK && resp.status == 200;
    rl_http_resp_free(&resp);
    rl_http_free(h);
    return ok;
}

static int launch(rl_test_rgw *r, size_t mem_mib) {
    int ports[2];
    if (rl_test_daemon_free_ports(ports, 2) != 0) return -1;
    r->port = ports[1];
    snprintf(r->endpoint, sizeof r->endpoint, "http://127.0.0.1:%d", r->port);
    char fsid[37], osd_uuid[37], conf[320], log[320], monmap[320], p[400];
    uuid(fsid), uuid(osd_uuid);
    snprintf(conf, sizeof conf, "%s/ceph.conf", r->dir);
    snprintf(log, sizeof log, "%s/setup.log", r->dir);
    snprintf(monmap, sizeof monmap, "%s/monmap", r->dir);
    FILE *f = fopen(conf, "w");
    if (!f) return -1;
    fprintf(f,
            "[global]\nfsid = %s\nmon host = v2:127.0.0.1:%d\n"
            "public addr = 127.0.0.1\ncluster addr = 127.0.0.1\nms bind msgr1 = false\n"
            "auth cluster required = none\nauth service required = none\nauth client required = none\n"
            "keyring = /dev/null\nms mon client mode = crc secure\nms client mode = crc secure\n"
            "osd pool default size = 1\nosd pool default min size = 1\n"
            "paxos propose interval = 0.05\npaxos min wait = 0.01\n"
            "run dir = %s/run\nadmin socket = %s/run/$name.asok\nlog file = %s/$name.log\n"
            "pid file = %s/run/$name.pid\nmon data = %s/mon/$name\nosd data = %s/osd/$name\n"
            "osd objectstore = memstore\nmemstore device bytes = %zu\n"
            "[client.rgw]\nrgw frontends = beast endpoint=127.0.0.1:%d\nrgw data = %s/rgw\n",
            fsid, ports[0], r->dir, r->dir, r->dir, r->dir, r->dir, r->dir, mem_mib << 20, r->port, r->dir);
    fclose(f);
    for (const char *sub = "run\0mon\0osd/osd.0\0rgw\0"; *sub; sub += strlen(sub) + 1) {
        snprintf(p, sizeof p, "mkdir -p '%s/%s'", r->dir, sub);
        if (system(p) != 0) return -1;
    }
    char addv[64], key_arg[64], sec_arg[96];
    snprintf(addv, sizeof addv, "[v2:127.0.0.1:%d]", ports[0]);
    char *mk_map[] = {"monmaptool", "--create", "--fsid", fsid, "--addv", "a", addv, monmap, "-c", conf, NULL};
    char *mk_mon[] = {"ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", monmap, NULL};
    char *run_mon[] = {"ceph-mon", "-c", conf, "-i", "a", "-f", NULL};
    char *new_osd[] = {"ceph", "-c", conf, "--connect-timeout", "20", "osd", "new", osd_uuid, NULL};
    char *mk_osd[] = {"ceph-osd", "-c", conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid, NULL};
    char *run_osd[] = {"ceph-osd", "-c", conf, "-i", "0", "-f", NULL};
    char *run_rgw[] = {"radosgw", "-c", conf, "-n", "client.rgw", "-f", NULL};
    random_hex(r->access_key, 20);
    random_hex(r->secret_key, 40);
    snprintf(key_arg, sizeof key_arg, "--access-key=%s", r->access_key);
    snprintf(sec_arg, sizeof sec_arg, "--secret-key=%s", r->secret_key);
    char *mk_user[] = {"radosgw-admin", "-c", conf, "-n", "client.rgw", "user", "create", "--uid=ci",
                       "--display-name=ci", key_arg, sec_arg, NULL};
    if (spawn(mk_map, log, false, 30, r->dir) != 0 || spawn(mk_mon, log, false, 30, r->dir) != 0) return -1;
    if ((r->mon_pid = spawn(run_mon, log, true, 0, r->dir)) < 0) return -1;
    if (spawn(new_osd, log, false, 30, r->dir) != 0 || spawn(mk_osd, log, false, 30, r->dir) != 0) return -1;
    if ((r->osd_pid = spawn(run_osd, log, true, 0, r->dir)) < 0) return -1;
    if ((r->rgw_pid = spawn(run_rgw, log, true, 0, r->dir)) < 0) return -1;
    if (rl_test_daemon_await(&r->rgw_pid, answers, r, 60, 0.1, NULL) != 0) return -1;
    return spawn(mk_user, log, false, 30, r->dir) == 0 ? 0 : -1;
}

static void rmrf(const char *dir) {
    if (strncmp(dir, "/tmp/rl-rgw-", 12) != 0) return; /* only what we made */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

int rl_test_rgw_start(rl_test_rgw *r, size_t mem_mib) {
    memset(r, 0, sizeof *r);
    r->mon_pid = r->osd_pid = r->rgw_pid = -1;
    if (mem_mib < 256) mem_mib = 256;
    /* a port picked free may be taken before a daemon binds it: two tries */
    for (int attempt = 0; attempt < 2; attempt++) {
        snprintf(r->dir, sizeof r->dir, "/tmp/rl-rgw-XXXXXX");
        if (!mkdtemp(r->dir)) {
            fprintf(stderr, "rgwtest: mkdtemp: %s\n", strerror(errno));
            r->dir[0] = '\0';
            return -1;
        }
        double t0 = rl_now();
        if (launch(r, mem_mib) == 0) {
            if (getenv("RL_TEST_VERBOSE")) fprintf(stderr, "rgwtest: radosgw ready in %.1f s\n", rl_now() - t0);
            return 0;
        }
        char p[400];
        for (const char *n = "setup.log\0mon.a.log\0osd.0.log\0client.rgw.log\0"; *n; n += strlen(n) + 1) {
            snprintf(p, sizeof p, "%s/%s", r->dir, n);
            rl_test_daemon_log_tail(p, 3000);
        }
        rl_test_rgw_stop(r);
    }
    fprintf(stderr, "rgwtest: radosgw did not start (packages radosgw ceph-mon ceph-osd ceph-common: "
                    "scripts/deps.sh test)\n");
    return -1;
}

int rl_test_rgw_admin(const rl_test_rgw *r, const char *const *args) {
    char conf[320], log[320];
    snprintf(conf, sizeof conf, "%s/ceph.conf", r->dir);
    snprintf(log, sizeof log, "%s/admin.log", r->dir);
    char *argv[24] = {"radosgw-admin", "-c", conf, "-n", "client.rgw"};
    int n = 5;
    for (int i = 0; args[i]; i++) {
        if (n + 1 >= (int)(sizeof argv / sizeof argv[0])) return -1;
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    return spawn(argv, log, false, 30, r->dir);
}

int rl_test_rgw_add_user(const rl_test_rgw *r, const char *uid, char *access_key, char *secret_key) {
    char u[96], key_arg[64], sec_arg[96];
    random_hex(access_key, 20);
    random_hex(secret_key, 40);
    snprintf(u, sizeof u, "--uid=%s", uid);
    snprintf(key_arg, sizeof key_arg, "--access-key=%s", access_key);
    snprintf(sec_arg, sizeof sec_arg, "--secret-key=%s", secret_key);
    const char *args[] = {"user", "create", u, "--display-name=test", key_arg, sec_arg, NULL};
    return rl_test_rgw_admin(r, args);
}

int rl_test_rgw_bucket_quota(const rl_test_rgw *r, const char *bucket, long long max_bytes) {
    char b[96], sz[48];
    snprintf(b, sizeof b, "--bucket=%s", bucket);
    snprintf(sz, sizeof sz, "--max-size=%lld", max_bytes);
    const char *set[] = {"quota", "set", "--quota-scope=bucket", b, sz, NULL};
    const char *on[] = {"quota", max_bytes < 0 ? "disable" : "enable", "--quota-scope=bucket", b, NULL};
    if (max_bytes >= 0 && rl_test_rgw_admin(r, set) != 0) return -1;
    return rl_test_rgw_admin(r, on) == 0 ? 0 : -1;
}

void rl_test_rgw_stop(rl_test_rgw *r) {
    rl_test_daemon_stop(&r->rgw_pid, 0);
    rl_test_daemon_stop(&r->osd_pid, 0);
    rl_test_daemon_stop(&r->mon_pid, 0);
    if (r->dir[0]) rmrf(r->dir);
    r->dir[0] = '\0';
}
