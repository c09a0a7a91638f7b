/* rdzv_attack: the rendezvous store under the attacks of issue 15, item 1,
 * each performed for real on loopback against a store hosted by a forked
 * process, so that its memory and descriptors are that process's alone:
 *  - 16 connections that never authenticate, each sending a 64 MiB SET:
 *    the host's peak RSS grows by less than 64 MiB;
 *  - thousands of silent sockets while the host runs under `ulimit -n
 *    1024`: a real client still connects, authenticates and works within
 *    2 s, the host can still open files, and a real two-rank training job
 *    through the store finishes afterwards;
 *  - a store filled with clients up to its descriptor budget: the host
 *    keeps descriptors for the rest of the process, and accept failures
 *    (EMFILE) are logged at a bounded rate;
 * and the clocks (handshake deadline, idle timeout that spares a parked
 * GET) with shortened limits. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/agent.h"
#include "store/store.h"
#include "store/store_db.h"
#include "testutil.h"

#define SECRET "attack-test-secret"

/* ---- a store in its own process --------------------------------------------------- */
typedef struct host {
    pid_t pid;
    int port;
    int cmd, ans;  /* pipes to and from it */
    char log[96];  /* its stderr */
} host;

/* How many of n descriptors the process can still open (all released). */
static int open_spare(int n) {
    int fds[256], got = 0;
    while (got < n && got < 256 && (fds[got] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) got++;
    for (int i = 0; i < got; i++) close(fds[i]);
    return got;
}

/* Take every free descriptor for `secs`, as the rest of a process would
 * (its Kubernetes calls, trainer pipes); returns how many it took. */
static int hog_all(double secs) {
    int cap = 1 << 16, got = 0;
    int *fds = malloc(sizeof *fds * (size_t)cap);
    if (!fds) return -1;
    while (got < cap && (fds[got] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) got++;
    usleep((useconds_t)(secs * 1e6));
    for (int i = 0; i < got; i++) close(fds[i]);
    free(fds);
    return got;
}

static void host_main(int cmd, int ans, const char *secret, rlim_t nofile, const char *log) {
    int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (lfd >= 0) dup2(lfd, STDERR_FILENO);
    if (nofile) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = nofile < rl.rlim_max ? nofile : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    rl_log_set_level(RL_LOG_WARN);
    rl_store_server *srv = NULL;
    rl_err e = {0};
    int port = -1;
    if (rl_store_server_start_auth("127.0.0.1", 0, secret, secret ? strlen(secret) : 0, &srv, &e) == RL_OK)
        port = rl_store_server_port(srv);
    if (write(ans, &port, sizeof port) != sizeof port || port < 0) _exit(1);
    for (;;) {
        struct pollfd p = {.fd = cmd, .events = POLLIN};
        if (poll(&p, 1, 120000) <= 0) break; /* a parent that vanished: do not linger */
        char c;
        if (read(cmd, &c, 1) != 1 || c == 'q') break;
        int r = -1;
        if (c == 'f') r = open_spare(64);
        if (c == 'x') r = hog_all(1.5);
        if (c == 'h') { /* the peak RSS from now on is the store's own */
            int fd = open("/proc/self/clear_refs", O_WRONLY);
            r = fd >= 0 && write(fd, "5", 1) == 1;
            if (fd >= 0) close(fd);
        }
        if (write(ans, &r, sizeof r) != sizeof r) break;
    }
    rl_store_server_stop(srv);
    _exit(0);
}

/* A store with `secret` (NULL: open) in a child process whose descriptor
 * limit is `nofile` (0: inherited). */
static void host_start(host *h, const char *secret, rlim_t nofile) {
    int c[2], a[2];
    cr_assert(pipe2(c, O_CLOEXEC) == 0 && pipe2(a, O_CLOEXEC) == 0);
    snprintf(h->log, sizeof h->log, "/tmp/rl-attack-%d-%d.log", (int)getpid(), rand());
    fflush(NULL);
    h->pid = fork();
    cr_assert(h->pid >= 0);
    if (h->pid == 0) {
        close(c[1]), close(a[0]);
        host_main(c[0], a[1], secret, nofile, h->log);
    }
    close(c[0]), close(a[1]);
    h->cmd = c[1], h->ans = a[0];
    struct pollfd p = {.fd = h->ans, .events = POLLIN};
    cr_assert(poll(&p, 1, 10000) == 1 && read(h->ans, &h->port, sizeof h->port) == sizeof h->port &&
              h->port > 0, "the store host did not start");
}

/* Ask the host something ('f', 'x', 'h'), then take its answer (-2: none in 10 s). */
static bool host_send(host *h, char what) { return write(h->cmd, &what, 1) == 1; }

static int host_answer(host *h) {
    struct pollfd p = {.fd = h->ans, .events = POLLIN};
    int r;
    if (poll(&p, 1, 10000) != 1 || read(h->ans, &r, sizeof r) != sizeof r) return -2;
    return r;
}

static int host_ask(host *h, char what) { return host_send(h, what) ? host_answer(h) : -2; }

static void host_stop(host *h) {
    char q = 'q';
    if (write(h->cmd, &q, 1) != 1) kill(h->pid, SIGKILL);
    int st = rl_test_wait_status(h->pid, 10);
    close(h->cmd), close(h->ans);
    unlink(h->log);
    cr_expect_eq(st, 0, "the store host exited with %d", st);
}

/* A "VmRSS:"-style field of /proc/PID/status in KiB (-1: unreadable). */
static long proc_kib(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0) v = strtol(line + n, NULL, 10);
    if (f) fclose(f);
    return v;
}

static int count_lines_with(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    return n;
}

/* ---- clients ---------------------------------------------------------------------- */
/* A real client's whole session: connect, authenticate, PING (in
 * connect), SET, GET. RL_OK or the first error. */
static int real_session(int port, const char *secret, double timeout_s, const char *key, rl_err *e) {
    rl_store *c = NULL;
    int rc = rl_store_connect("127.0.0.1", port, timeout_s, &c, e);
    if (!rc && secret) rc = rl_store_auth(c, "real-client", secret, strlen(secret), e);
    if (!rc) rc = rl_store_set(c, key, "v", 1, e);
    void *v = NULL;
    size_t n = 0;
    if (!rc) rc = rl_store_get(c, key, 0, &v, &n, e);
    if (!rc && (n != 1 || memcmp(v, "v", 1) != 0)) rc = rl_errf(e, RL_EPEER, "GET '%s': wrong value", key);
    free(v);
    rl_store_close(c);
    return rc;
}

/* A non-blocking socket from 127.0.0.<src> connecting to the store. */
static int connect_from(int port, int src) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
#ifdef IP_BIND_ADDRESS_NO_PORT
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#endif
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)src - 1);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Raise our own descriptor limit as far as allowed; returns it. */
static rlim_t raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur;
}

/* ---- attack 1: 64 MiB SETs before authentication -------------------------------- */
typedef struct sender {
    int fd;
    size_t sent;
    bool closed;
} sender;

/* Push the SET frame on s as far as the socket takes it now. */
static void push_set(sender *s, const uint8_t *hdr, const uint8_t *zeros, size_t zn, size_t total) {
    while (s->sent < total) {
        const uint8_t *p = s->sent < 25 ? hdr + s->sent : zeros;
        size_t n = s->sent < 25 ? 25 - s->sent : total - s->sent < zn ? total - s->sent : zn;
        ssize_t w = send(s->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            s->sent += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) return;
        s->closed = true; /* EPIPE, ECONNRESET: the store closed it */
        return;
    }
}

/* Read what comes back; EOF or a reset closes. */
static void take_answer(sender *s) {
    uint8_t b[4096];
    ssize_t r;
    while ((r = recv(s->fd, b, sizeof b, 0)) > 0) {
    }
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) s->closed = true;
}

/* n connections, each sending a SET of a 64 MiB value as fast as the
 * store takes it, until the store closed each or limit_s passed. Returns
 * the host's largest VmRSS seen meanwhile (KiB); *bytes what was sent. */
static long attack_big_sets(const host *h, int n, double limit_s, size_t *bytes) {
    enum { N = 64 };
    static uint8_t zeros[1 << 20];
    sender ss[N];
    struct pollfd pf[N];
    uint8_t hdr[25];
    rl_store_frame f = {.version = RL_STORE_VERSION, .op = RL_STORE_SET, .klen = 1, .vlen = RL_STORE_MAX_VALUE};
    rl_store_frame_encode(hdr, &f);
    hdr[24] = 'k';
    size_t total = sizeof hdr + RL_STORE_MAX_VALUE;
    for (int i = 0; i < n && i < N; i++) ss[i] = (sender){.fd = connect_from(h->port, 1)};
    long peak = 0;
    double end = rl_now() + limit_s;
    for (int open = n; open > 0 && rl_now() < end;) {
        open = 0;
        for (int i = 0; i < n; i++) {
            bool live = ss[i].fd >= 0 && !ss[i].closed;
            pf[i] = (struct pollfd){.fd = live ? ss[i].fd : -1,
                                    .events = (short)(POLLIN | (ss[i].sent < total ? POLLOUT : 0))};
            open += live;
        }
        poll(pf, (nfds_t)n, 20);
        for (int i = 0; i < n; i++) {
            if (pf[i].revents & POLLOUT) push_set(&ss[i], hdr, zeros, sizeof zeros, total);
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) take_answer(&ss[i]);
        }
        long rss = proc_kib(h->pid, "VmRSS:");
        if (rss > peak) peak = rss;
    }
    *bytes = 0;
    for (int i = 0; i < n; i++) {
        *bytes += ss[i].sent;
        if (ss[i].fd >= 0) close(ss[i].fd);
    }
    return peak;
}

Test(rdzv_attack, unauthenticated_64mib_sets_do_not_grow_the_store, .timeout = 90) {
    host h;
    host_start(&h, SECRET, 0);
    rl_err e = {0};
    cr_assert_eq(real_session(h.port, SECRET, 5, "warm", &e), RL_OK, "%s", e.msg);
    bool hwm = host_ask(&h, 'h') == 1;
    long base = proc_kib(h.pid, "VmRSS:");
    size_t bytes = 0;
    long peak = attack_big_sets(&h, 16, 15, &bytes);
    long hwm_kib = hwm ? proc_kib(h.pid, "VmHWM:") : -1;
    if (hwm_kib > peak) peak = hwm_kib;
    fprintf(stderr, "rdzv_attack: 16 x 64 MiB SET before auth: %.1f MiB sent, store host RSS %.1f MiB "
            "before, peak %.1f MiB (growth %.1f MiB)\n", bytes / 1048576.0, base / 1024.0, peak / 1024.0,
            (peak - base) / 1024.0);
    cr_expect(base > 0 && peak > 0);
    cr_expect_lt(peak - base, 64 * 1024, "the store host grew by %ld KiB", peak - base);
    /* and it still serves */
    cr_expect_eq(real_session(h.port, SECRET, 5, "after", &e), RL_OK, "%s", e.msg);
    host_stop(&h);
}

/* ---- attack 2: thousands of silent sockets under ulimit -n 1024 ------------------ */
/* n sockets from 127.0.0.1..nsrc (the real client's address among them)
 * that never send a byte. Waits until every connect completed (or failed,
 * or limit_s passed); *ready says how many did. */
static int *attack_silent(int port, int n, int nsrc, double limit_s, int *ready) {
    int *fds = malloc(sizeof *fds * (size_t)n);
    struct pollfd *pf = malloc(sizeof *pf * (size_t)n);
    cr_assert(fds && pf);
    for (int i = 0; i < n; i++) fds[i] = connect_from(port, 1 + i % nsrc);
    double end = rl_now() + limit_s;
    int pending;
    do {
        pending = 0;
        for (int i = 0; i < n; i++) pf[i] = (struct pollfd){.fd = fds[i], .events = POLLOUT};
        poll(pf, (nfds_t)n, 50);
        for (int i = 0; i < n; i++) pending += fds[i] >= 0 && !(pf[i].revents & (POLLOUT | POLLERR | POLLHUP));
    } while (pending > 0 && rl_now() < end);
    *ready = n - pending;
    free(pf);
    return fds;
}

/* A real two-rank training job (bin/ringleader-worker, 3 steps) that
 * rendezvouses through the store: authenticates, claims its ranks, forms
 * its ring there. Returns the statuses and the last step of each. */
static void run_job(int port, int st[2], long long steps[2]) {
    char dir[64], log[2][160];
    rl_test_arith_dir(dir, sizeof dir, 100000);
    rl_test_write_job(dir, 3, 256, "", "");
    setenv(RL_ENV_STORE_HOSTED, "1", 1);
    setenv(RL_ENV_RDZV_SECRET, SECRET, 1);
    setenv(RL_ENV_STORE_PREFIX, "job", 1);
    int pid[2];
    for (int r = 0; r < 2; r++) {
        snprintf(log[r], sizeof log[r], "%s/rank%d.log", dir, r);
        pid[r] = rl_test_spawn_worker(dir, log[r], r, 2, port, NULL);
    }
    for (int r = 0; r < 2; r++) st[r] = rl_test_wait_status(pid[r], 60);
    for (int r = 0; r < 2; r++) steps[r] = rl_test_last_step(log[r]); /* rank 0 logs them */
    if (st[0] || st[1]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "tail -n 5 %s %s >&2", log[0], log[1]);
        if (system(cmd) != 0) fprintf(stderr, "(no logs)\n");
    }
    unsetenv(RL_ENV_STORE_HOSTED);
    unsetenv(RL_ENV_RDZV_SECRET);
    unsetenv(RL_ENV_STORE_PREFIX);
    rl_test_rmdir(dir);
}

/* Whether the job went through this store: its ranks' claims are there. */
static int job_claims(int port, rl_err *e) {
    rl_store *c = NULL;
    void *v = NULL;
    size_t n = 0;
    int rc = rl_store_connect("127.0.0.1", port, 5, &c, e);
    if (!rc) rc = rl_store_auth(c, "check", SECRET, strlen(SECRET), e);
    if (!rc) rc = rl_store_get(c, "job/rank/1", 0, &v, &n, e);
    free(v);
    rl_store_close(c);
    return rc;
}

Test(rdzv_attack, thousands_of_silent_sockets_leave_room_for_a_real_client, .timeout = 120) {
    rlim_t mine = raise_nofile();
    /* as many as this machine lets us hold, up to the 4200 of the report
     * (more than the store's 4096 connections), against the report's
     * `ulimit -n 1024` (half our own limit where that is lower), so that
     * the attack is more than the host's descriptors */
    int n = mine > 4500 ? 4200 : (int)mine - 200;
    rlim_t theirs = mine >= 2048 ? 1024 : mine / 2;
    cr_assert(n > (int)theirs + 64, "RLIMIT_NOFILE %llu is too small for this test", (unsigned long long)mine);
    host h;
    host_start(&h, SECRET, theirs);
    int ready = 0;
    double t0 = rl_now();
    int *fds = attack_silent(h.port, n, 4, 20, &ready);
    double t_attack = rl_now() - t0;
    /* the join gets its 2 s only now that every attack socket is in */
    t0 = rl_now();
    rl_err e = {0};
    int rc = real_session(h.port, SECRET, 2.0, "joined", &e);
    double t_join = rl_now() - t0;
    int spare = host_ask(&h, 'f');
    fprintf(stderr, "rdzv_attack: %d silent sockets (%d connected in %.2f s), store host at ulimit -n %llu: "
            "real client joined in %.3f s (%s), host could open %d of 64 files\n", n, ready, t_attack,
            (unsigned long long)theirs, t_join, rc ? e.msg : "ok", spare);
    cr_expect_eq(ready, n, "only %d of %d attack sockets connected in 20 s", ready, n);
    cr_expect_eq(rc, RL_OK, "%s", e.msg);
    cr_expect_lt(t_join, 2.0, "the real client needed %.3f s", t_join);
    cr_expect_eq(spare, 64, "the store's process could open only %d more files", spare);
    /* the attack goes on (its sockets stay open) while a job runs through the store */
    int st[2];
    long long steps[2];
    t0 = rl_now();
    run_job(h.port, st, steps);
    fprintf(stderr, "rdzv_attack: then a 2-rank job through the store: exit %d/%d, %lld steps, in %.2f s\n",
            st[0], st[1], steps[0], rl_now() - t0);
    cr_expect(st[0] == 0 && st[1] == 0, "the job's ranks exited %d and %d", st[0], st[1]);
    cr_expect_eq(steps[0], 3, "rank 0 ended at step %lld", steps[0]);
    cr_expect_eq(job_claims(h.port, &e), RL_OK, "the job did not go through this store: %s", e.msg);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    cr_expect_eq(real_session(h.port, SECRET, 5, "after", &e), RL_OK, "%s", e.msg);
    host_stop(&h);
}

/* ---- attack 3: the store's descriptors against its process's ----------------------- */
/* Open connections that each PING and wait for the answer, one at a time
 * from one address (so the handshake caps are not what stops them), until
 * one gets no answer within wait_s (the store is at its budget) or max.
 * Returns how many were answered; fds[] holds every one opened. */
static int fill_with_clients(int port, int *fds, int max, double wait_s, int *opened) {
    uint8_t ping[RL_STORE_HEADER_BYTES], ans[RL_STORE_HEADER_BYTES];
    rl_store_frame f = {.version = RL_STORE_VERSION, .op = RL_STORE_PING};
    rl_store_frame_encode(ping, &f);
    int answered = 0;
    *opened = 0;
    while (*opened < max) {
        int fd = connect_from(port, 1);
        if (fd < 0) break;
        fds[(*opened)++] = fd;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, (int)(wait_s * 1000)) != 1 || send(fd, ping, sizeof ping, MSG_NOSIGNAL) != sizeof ping)
            break;
        p.events = POLLIN;
        if (poll(&p, 1, (int)(wait_s * 1000)) != 1 || recv(fd, ans, sizeof ans, MSG_WAITALL) != sizeof ans) break;
        answered++;
    }
    return answered;
}

Test(rdzv_attack, the_store_leaves_descriptors_to_its_process, .timeout = 90) {
    rlim_t mine = raise_nofile();
    cr_assert(mine >= 1024, "RLIMIT_NOFILE %llu", (unsigned long long)mine);
    host h;
    /* an open store: a PING is all it takes to be a client */
    host_start(&h, NULL, 512);
    int fds[600], opened = 0;
    int answered = fill_with_clients(h.port, fds, 600, 0.5, &opened);
    int spare = host_ask(&h, 'f');
    fprintf(stderr, "rdzv_attack: store host at ulimit -n 512 took %d clients, then could open %d of 64 files\n",
            answered, spare);
    /* its budget: 512, less a quarter kept for the process, less its own three */
    cr_expect(answered >= 300 && answered <= 512 - 128 - 3, "%d clients answered", answered);
    cr_expect_eq(spare, 64, "the store's process could open only %d more files", spare);
    /* the rest of the process takes every descriptor while clients knock:
     * the store's accept fails (EMFILE), and says so a bounded number of times */
    for (int i = 0; i < 100 && opened > 0; i++) close(fds[--opened]);
    usleep(100000);
    cr_assert(host_send(&h, 'x'));
    usleep(300000); /* knock while the host holds every descriptor */
    int knock[20];
    for (int i = 0; i < 20; i++) knock[i] = connect_from(h.port, 2);
    int hogged = host_answer(&h);
    int failures = count_lines_with(h.log, "store_accept_failed");
    fprintf(stderr, "rdzv_attack: with %d descriptors taken for 1.5 s, %d store_accept_failed lines\n", hogged,
            failures);
    cr_expect(hogged > 0);
    cr_expect(failures >= 1 && failures <= 5, "%d accept failures logged in 1.5 s", failures);
    for (int i = 0; i < 20; i++)
        if (knock[i] >= 0) close(knock[i]);
    while (opened > 0) close(fds[--opened]);
    rl_err e = {0};
    cr_expect_eq(real_session(h.port, NULL, 5, "after", &e), RL_OK, "%s", e.msg);
    host_stop(&h);
}

Test(rdzv_attack, a_store_at_its_budget_still_takes_a_real_client, .timeout = 60) {
    rlim_t mine = raise_nofile();
    cr_assert(mine >= 1024, "RLIMIT_NOFILE %llu", (unsigned long long)mine);
    host h;
    host_start(&h, NULL, 256); /* room for 256 - 64 - 3 = 189 connections */
    int fds[160], opened = 0;
    int answered = fill_with_clients(h.port, fds, 160, 1.0, &opened);
    cr_expect_eq(answered, 160);
    /* silent sockets take the rest of the budget */
    int ready = 0;
    int *silent = attack_silent(h.port, 40, 2, 10, &ready);
    double t0 = rl_now();
    rl_err e = {0};
    int rc = real_session(h.port, NULL, 2.0, "joined", &e);
    double t_join = rl_now() - t0;
    fprintf(stderr, "rdzv_attack: store at its budget (160 clients + %d silent sockets): real client joined in "
            "%.3f s (%s)\n", ready, t_join, rc ? e.msg : "ok");
    cr_expect_eq(rc, RL_OK, "%s", e.msg);
    cr_expect_lt(t_join, 2.0);
    for (int i = 0; i < 40; i++)
        if (silent[i] >= 0) close(silent[i]);
    free(silent);
    while (opened > 0) close(fds[--opened]);
    host_stop(&h);
}

/* ---- the clocks, shortened --------------------------------------------------------- */
static rl_store_server *start_limited(const rl_store_limits *lim, int *port) {
    rl_store_server *s = NULL;
    rl_err e = {0};
    rl_log_set_level(RL_LOG_ERROR);
    cr_assert_eq(rl_store_server_start_limits("127.0.0.1", 0, SECRET, strlen(SECRET), lim, &s, &e), RL_OK,
                 "%s", e.msg);
    *port = rl_store_server_port(s);
    return s;
}

/* Seconds until the store closes a socket that never sends (-1: not in limit_s). */
static double time_to_close(int fd, double limit_s) {
    double t0 = rl_now();
    char b[64];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((t0 + limit_s - rl_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) != 1) return -1;
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN)) return rl_now() - t0;
    }
}

Test(rdzv_attack, a_silent_connection_is_closed_at_the_handshake_deadline, .timeout = 30) {
    rl_store_limits lim;
    rl_store_limits_default(&lim);
    lim.handshake_s = 0.3;
    int port;
    rl_store_server *srv = start_limited(&lim, &port);
    int fd = connect_from(port, 1);
    cr_assert(fd >= 0);
    double t = time_to_close(fd, 10);
    cr_expect(t >= 0.25 && t < 5, "closed after %.3f s", t);
    close(fd);
    /* the deadline is for the handshake: a real client is not hurried */
    rl_err e = {0};
    rl_store *c = NULL;
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_auth(c, "pod", SECRET, strlen(SECRET), &e), RL_OK, "%s", e.msg);
    usleep(600000);
    cr_expect_eq(rl_store_set(c, "k", "v", 1, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    /* a client closed before it authenticated (here: too slow; under a
     * flood: displaced) connects again inside rl_store_auth */
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5, &c, &e), RL_OK, "%s", e.msg);
    usleep(600000);
    cr_expect_eq(rl_store_auth(c, "late", SECRET, strlen(SECRET), &e), RL_OK, "%s", e.msg);
    cr_expect_eq(rl_store_set(c, "k2", "v", 1, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_attack, idle_clients_are_closed_but_never_a_parked_get, .timeout = 30) {
    rl_store_limits lim;
    rl_store_limits_default(&lim);
    lim.idle_s = 1.0;
    int port;
    rl_store_server *srv = start_limited(&lim, &port);
    rl_err e = {0};
    rl_store *idle = NULL, *waiter = NULL, *busy = NULL;
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5, &idle, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_auth(idle, "idle", SECRET, strlen(SECRET), &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5, &waiter, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_auth(waiter, "waiter", SECRET, strlen(SECRET), &e), RL_OK, "%s", e.msg);
    /* a GET that waits twice the idle timeout, then times out as asked */
    void *v = NULL;
    size_t n;
    double t0 = rl_now();
    cr_expect_eq(rl_store_get(waiter, "never", 2.0, &v, &n, &e), RL_ETIMEOUT, "%s", e.msg);
    cr_expect(rl_now() - t0 >= 1.9, "the parked GET ended after %.3f s", rl_now() - t0);
    /* ... and its connection is still good right after */
    cr_expect_eq(rl_store_set(waiter, "w", "1", 1, &e), RL_OK, "%s", e.msg);
    /* a client that keeps talking more often than the timeout is never cut */
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5, &busy, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_auth(busy, "busy", SECRET, strlen(SECRET), &e), RL_OK, "%s", e.msg);
    int64_t r;
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(rl_store_add(busy, "n", 1, &r, &e), RL_OK, "%s", e.msg);
        usleep(200000);
    }
    /* the one that said nothing for over 3.5 s was closed */
    int rc = rl_store_set(idle, "k", "v", 1, &e);
    cr_expect_eq(rc, RL_EPEER, "%d: %s", rc, e.msg);
    cr_expect(strstr(e.msg, "closed the connection") || strstr(e.msg, "connection lost"), "%s", e.msg);
    rl_store_close(idle);
    rl_store_close(waiter);
    rl_store_close(busy);
    rl_store_server_stop(srv);
}
