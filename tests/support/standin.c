/* Start/stop the Kubernetes stand-in for tests; see standin.h. Plain POSIX
 * (fork/exec, a raw socket for the admin API) so any suite can use it
 * without touching the code under test. */
#include "standin.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int find_script(char *path, size_t n) {
    const char *root = getenv("RL_TEST_ROOT");
    if (root && *root) {
        snprintf(path, n, "%s/tests/k8s/standin.py", root);
        if (access(path, R_OK) == 0) return 0;
    }
    snprintf(path, n, "tests/k8s/standin.py");
    if (access(path, R_OK) == 0) {
        char abs[4096];
        if (realpath(path, abs) && strlen(abs) < n) memcpy(path, abs, strlen(abs) + 1);
        return 0;
    }
    return -1;
}

static void dump_log(const rl_test_standin *s) {
    char p[400];
    snprintf(p, sizeof p, "%s/standin.log", s->dir);
    FILE *f = fopen(p, "r");
    if (!f) return;
    char line[1024];
    int lines = 0;
    fprintf(stderr, "---- %s (first lines)\n", p);
    while (lines++ < 40 && fgets(line, sizeof line, f)) fputs(line, stderr);
    fclose(f);
}

static void rmrf(const char *dir) {
    if (!dir[0] || strncmp(dir, "/tmp/", 5) != 0) return; /* only what we made */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

/* Parse DIR/ready ({"port","admin_port","pid"}); 0 when complete. */
static int read_ready(rl_test_standin *s) {
    char p[400];
    snprintf(p, sizeof p, "%s/ready", s->dir);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    char buf[512];
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) return -1;
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(j, "port");
    const cJSON *admin = cJSON_GetObjectItemCaseSensitive(j, "admin_port");
    int ok = cJSON_IsNumber(port) && cJSON_IsNumber(admin) && port->valueint > 0 && admin->valueint > 0;
    if (ok) {
        s->port = port->valueint;
        s->admin_port = admin->valueint;
    }
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

static bool ready(void *ud) { return read_ready(ud) == 0; }

int rl_test_standin_start(rl_test_standin *s, const char *extra_args) {
    rl_test_standin_opts o = {.extra_args = extra_args};
    return rl_test_standin_start_opts(s, &o);
}

int rl_test_standin_start_opts(rl_test_standin *s, const rl_test_standin_opts *o) {
    memset(s, 0, sizeof *s);
    s->pid = -1;
    char script[1024];
    if (find_script(script, sizeof script) != 0) {
        fprintf(stderr, "standin: tests/k8s/standin.py not found (run from the repository root or "
                        "set RL_TEST_ROOT)\n");
        return -1;
    }
    snprintf(s->dir, sizeof s->dir, "/tmp/rl-standin-XXXXXX");
    if (!mkdtemp(s->dir)) {
        fprintf(stderr, "standin: mkdtemp: %s\n", strerror(errno));
        s->dir[0] = '\0';
        return -1;
    }
    snprintf(s->kubeconfig, sizeof s->kubeconfig, "%s/kubeconfig", s->dir);
    snprintf(s->token_file, sizeof s->token_file, "%s/token", s->dir);
    snprintf(s->ca_file, sizeof s->ca_file, "%s/ca.crt", s->dir);
    snprintf(s->host, sizeof s->host, "127.0.0.1");

    char extra[4096] = "", maxp[16], backoff[32];
    if (o->extra_args) snprintf(extra, sizeof extra, "%s", o->extra_args);
    char *argv[80];
    int argc = 0;
    argv[argc++] = "python3";
    argv[argc++] = script;
    argv[argc++] = "--dir";
    argv[argc++] = s->dir;
    argv[argc++] = "--host";
    argv[argc++] = s->host;
    for (int i = 0; i < 8 && o->images[i]; i++) {
        argv[argc++] = "--image";
        argv[argc++] = (char *)o->images[i];
    }
    if (o->kubelet) argv[argc++] = "--kubelet";
    if (o->max_pods > 0) {
        snprintf(maxp, sizeof maxp, "%d", o->max_pods);
        argv[argc++] = "--max-pods";
        argv[argc++] = maxp;
    }
    if (o->backoff_s > 0) {
        snprintf(backoff, sizeof backoff, "%g", o->backoff_s);
        argv[argc++] = "--backoff";
        argv[argc++] = backoff;
    }
    for (char *save = NULL, *tok = strtok_r(extra, " \t", &save); tok && argc < 78;
         tok = strtok_r(NULL, " \t", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;

    char logp[400];
    snprintf(logp, sizeof logp, "%s/standin.log", s->dir);
    const char *env[9] = {0}; /* o->env has room for 8, NULL-terminated only when fewer */
    for (int i = 0; i < 8 && o->env[i]; i++) env[i] = o->env[i];
    rl_test_daemon_opts d = {.argv = argv, .log = logp, .env = env, .death_signal = SIGTERM};
    s->pid = rl_test_daemon_spawn(&d);
    if (s->pid < 0) {
        fprintf(stderr, "standin: fork: %s\n", strerror(errno));
        rmrf(s->dir);
        return -1;
    }
    int st = 0, rc = rl_test_daemon_await(&s->pid, ready, s, 15.0, 0.02, &st);
    if (rc == 0) return 0;
    if (rc == -1) {
        fprintf(stderr, "standin: the server exited before it was ready (status %d)\n", st);
        dump_log(s);
        rmrf(s->dir);
        return -1;
    }
    fprintf(stderr, "standin: no %s/ready within 15 s\n", s->dir);
    dump_log(s);
    rl_test_standin_stop(s);
    return -1;
}

void rl_test_standin_stop(rl_test_standin *s) {
    rl_test_daemon_stop(&s->pid, 5.0);
    if (!getenv("RL_TEST_KEEP_STANDIN")) rmrf(s->dir);
    s->dir[0] = '\0';
}

int rl_test_standin_admin(const rl_test_standin *s, const char *method, const char *path,
                          const char *body, char *out, size_t n) {
    if (out && n) out[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->admin_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    size_t blen = body ? strlen(body) : 0;
    size_t cap = 512 + blen;
    char *req = malloc(cap);
    if (!req) {
        close(fd);
        return -1;
    }
    int hl = snprintf(req, cap,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    if (hl < 0 || (size_t)hl + blen >= cap) {
        free(req);
        close(fd);
        return -1;
    }
    if (blen) memcpy(req + hl, body, blen);
    size_t len = (size_t)hl + blen, sent = 0;
    while (sent < len) {
        ssize_t w = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    free(req);
    if (sent < len) {
        close(fd);
        return -1;
    }
    size_t rcap = 1 << 16, got = 0;
    char *resp = malloc(rcap);
    if (!resp) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (got + 1 >= rcap) {
            char *bigger = realloc(resp, rcap * 2);
            if (!bigger) break;
            resp = bigger;
            rcap *= 2;
        }
        ssize_t r = recv(fd, resp + got, rcap - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    resp[got] = '\0';
    int code = -1;
    if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1) code = -1;
    const char *b = strstr(resp, "\r\n\r\n");
    if (out && n && b) snprintf(out, n, "%s", b + 4);
    free(resp);
    return code;
}

int rl_test_kubectl(const rl_test_standin *s, const char *args, const char *stdin_text,
                    char *out, size_t n) {
    if (out && n) out[0] = '\0';
    char in[400] = "/dev/null";
    if (stdin_text) {
        snprintf(in, sizeof in, "%s/stdin-XXXXXX", s->dir);
        int fd = mkstemp(in);
        if (fd < 0) return -1;
        size_t len = strlen(stdin_text), off = 0;
        while (off < len) {
            ssize_t w = write(fd, stdin_text + off, len - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        close(fd);
    }
    size_t cap = strlen(args) + 2048;
    char *cmd = malloc(cap);
    if (!cmd) return -1;
    snprintf(cmd, cap,
             "KUBECONFIG='%s' KUBECACHEDIR='%s/cache' timeout 60 kubectl %s <'%s' 2>&1",
             s->kubeconfig, s->dir, args, in);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p) {
        if (stdin_text) unlink(in);
        return -1;
    }
    size_t got = 0;
    char buf[4096];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, p)) > 0) {
        if (out && n && got + 1 < n) {
            size_t take = r < n - 1 - got ? r : n - 1 - got;
            memcpy(out + got, buf, take);
            got += take;
            out[got] = '\0';
        }
    }
    int st = pclose(p);
    if (stdin_text) unlink(in);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- pods ---------------------------------------------------------------------------- */
const cJSON *rl_test_json_path(const cJSON *j, const char *dotted) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", dotted);
    const cJSON *cur = j;
    for (char *save = NULL, *t = strtok_r(buf, ".", &save); t && cur; t = strtok_r(NULL, ".", &save))
        cur = cJSON_GetObjectItemCaseSensitive(cur, t);
    return cur;
}

static void jcopy(char *dst, size_t n, const cJSON *j, const char *dotted) {
    const cJSON *v = rl_test_json_path(j, dotted);
    snprintf(dst, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int jint(const cJSON *j, const char *dotted, int dflt) {
    const cJSON *v = rl_test_json_path(j, dotted);
    return cJSON_IsNumber(v) ? v->valueint : dflt;
}

int rl_test_standin_pod(const rl_test_standin *s, const char *ns, const char *name, const char *container,
                        rl_test_pod *p) {
    memset(p, 0, sizeof *p);
    p->scheduled = -1;
    p->exit_code = p->last_exit_code = -1;
    char path[512];
    snprintf(path, sizeof path, "/pods/%s/%s", ns ? ns : "default", name);
    size_t cap = 1 << 18;
    char *out = malloc(cap);
    if (!out) return -1;
    int code = rl_test_standin_admin(s, "GET", path, NULL, out, cap);
    if (code == 404) {
        free(out);
        return 0;
    }
    cJSON *j = code == 200 ? cJSON_Parse(out) : NULL;
    free(out);
    if (!j) return -1;
    p->exists = true;
    p->deleting = rl_test_json_path(j, "metadata.deletionTimestamp") != NULL;
    jcopy(p->uid, sizeof p->uid, j, "metadata.uid");
    jcopy(p->phase, sizeof p->phase, j, "status.phase");
    jcopy(p->ip, sizeof p->ip, j, "status.podIP");
    jcopy(p->node, sizeof p->node, j, "spec.nodeName");
    jcopy(p->reason, sizeof p->reason, j, "status.reason");
    jcopy(p->message, sizeof p->message, j, "status.message");
    const cJSON *c;
    cJSON_ArrayForEach(c, rl_test_json_path(j, "status.conditions")) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(c, "status");
        if (!cJSON_IsString(ty) || !cJSON_IsString(st)) continue;
        bool yes = !strcmp(st->valuestring, "True");
        if (!strcmp(ty->valuestring, "PodScheduled")) {
            p->scheduled = yes;
            jcopy(p->sched_reason, sizeof p->sched_reason, c, "reason");
            jcopy(p->sched_message, sizeof p->sched_message, c, "message");
        } else if (!strcmp(ty->valuestring, "Ready")) {
            p->ready = yes;
        } else if (!strcmp(ty->valuestring, "DisruptionTarget")) {
            p->disruption = yes;
        }
    }
    const cJSON *cs = NULL, *it;
    cJSON_ArrayForEach(it, rl_test_json_path(j, "status.containerStatuses")) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
        if (!container || (cJSON_IsString(nm) && !strcmp(nm->valuestring, container))) {
            cs = it;
            break;
        }
    }
    if (cs) {
        p->restarts = jint(cs, "restartCount", 0);
        p->last_exit_code = jint(cs, "lastState.terminated.exitCode", -1);
        static const char *states[] = {"waiting", "running", "terminated"};
        for (int i = 0; i < 3; i++) {
            const cJSON *st = rl_test_json_path(cs, "state");
            const cJSON *one = cJSON_GetObjectItemCaseSensitive(st, states[i]);
            if (!one) continue;
            snprintf(p->state, sizeof p->state, "%s", states[i]);
            jcopy(p->c_reason, sizeof p->c_reason, one, "reason");
            jcopy(p->c_message, sizeof p->c_message, one, "message");
            p->exit_code = jint(one, "exitCode", -1);
        }
    }
    cJSON_Delete(j);
    return 0;
}

static bool pod_is(const rl_test_pod *p, const char *want) {
    if (!strcmp(want, "gone")) return !p->exists;
    if (!p->exists) return false;
    if (!strcmp(want, "Ready")) return p->ready;
    if (!strcmp(want, "Unschedulable")) return p->scheduled == 0 && !strcmp(p->sched_reason, want);
    return !strcmp(p->phase, want) || !strcmp(p->c_reason, want) || !strcmp(p->reason, want);
}

int rl_test_standin_await_pod(const rl_test_standin *s, const char *ns, const char *name, const char *container,
                              const char *want, double timeout_s, rl_test_pod *p) {
    double end = now_s() + timeout_s;
    for (;;) {
        if (rl_test_standin_pod(s, ns, name, container, p) == 0 && pod_is(p, want)) return 0;
        if (now_s() >= end) return -1;
        usleep(50000);
    }
}

int rl_test_standin_evict(const rl_test_standin *s, const char *ns, const char *name, const char *message) {
    char path[512], body[1024] = "{}";
    snprintf(path, sizeof path, "/pods/%s/%s/evict", ns ? ns : "default", name);
    if (message) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "message", message);
        char *txt = cJSON_PrintUnformatted(b);
        snprintf(body, sizeof body, "%s", txt ? txt : "{}");
        free(txt);
        cJSON_Delete(b);
    }
    return rl_test_standin_admin(s, "POST", path, body, NULL, 0);
}

int rl_test_standin_set_max_pods(const rl_test_standin *s, int n) {
    char body[64];
    if (n < 0) snprintf(body, sizeof body, "{\"maxPods\":null}");
    else snprintf(body, sizeof body, "{\"maxPods\":%d}", n);
    return rl_test_standin_admin(s, "POST", "/node", body, NULL, 0);
}

int rl_test_standin_node_count(const rl_test_standin *s) {
    size_t cap = 1 << 18;
    char *out = malloc(cap);
    if (!out) return -1;
    int code = rl_test_standin_admin(s, "GET", "/nodes", NULL, out, cap);
    cJSON *j = code == 200 ? cJSON_Parse(out) : NULL;
    free(out);
    const cJSON *nodes = rl_test_json_path(j, "nodes");
    int n = cJSON_IsArray(nodes) ? cJSON_GetArraySize(nodes) : -1;
    cJSON_Delete(j);
    return n;
}

int rl_test_standin_reclaim(const rl_test_standin *s, const char *node, double notice_s) {
    char path[256], body[64];
    snprintf(path, sizeof path, "/nodes/%s/reclaim", node);
    snprintf(body, sizeof body, "{\"notice\":%g}", notice_s);
    return rl_test_standin_admin(s, "POST", path, body, NULL, 0);
}

int rl_test_standin_sa_token(const rl_test_standin *s, const char *ns, const char *sa, char *tok, size_t n) {
    char body[512], out[1024];
    snprintf(body, sizeof body, "{\"namespace\":\"%s\",\"name\":\"%s\"}", ns ? ns : "default", sa);
    if (rl_test_standin_admin(s, "POST", "/tokens/serviceaccount", body, out, sizeof out) != 200) return -1;
    cJSON *j = cJSON_Parse(out);
    const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, "token") : NULL;
    int rc = cJSON_IsString(t) && strlen(t->valuestring) < n ? 0 : -1;
    if (rc == 0) memcpy(tok, t->valuestring, strlen(t->valuestring) + 1);
    cJSON_Delete(j);
    return rc;
}

int rl_test_standin_write_kubeconfig(const rl_test_standin *s, const char *token, const char *ns, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int n = fprintf(f,
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    certificate-authority: %s\n"
                    "    server: https://%s:%d\ncontexts:\n- name: op\n  context:\n    cluster: standin\n    user: op\n"
                    "%s%s%scurrent-context: op\nusers:\n- name: op\n  user:\n    token: %s\n",
                    s->ca_file, s->host, s->port, ns ? "    namespace: " : "", ns ? ns : "", ns ? "\n" : "", token);
    return fclose(f) == 0 && n > 0 ? 0 : -1;
}
