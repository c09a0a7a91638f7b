/* tcp ring allreduce throughput over loopback, next to the machine's memcpy
 * bandwidth measured in the same run.
 *
 * For world 2 and 4 it forks one process per rank (a store hosted here,
 * ranks on 127.0.0.1), and times f32 SUM allreduces of 4 MiB and 64 MiB:
 * a few warmup rounds, then several timed rounds, each started by a
 * barrier and measured as the slowest rank's time; the median is
 * reported. Bus bandwidth = 2(N-1)/N * bytes / time (what each rank's
 * links carry, NCCL's convention), so it can be compared with memcpy:
 * over loopback every byte on the ring costs a kernel copy on each side,
 * plus the reduction. One JSON line per measurement on stdout.
 *
 * All ranks share this host, so each ring link moves its data through
 * shared memory ("shm":true); RL_COMM_SHM=0 forces the TCP data path
 * ("shm":false), whose two kernel copies per byte bound it lower.
 *
 * RL_BENCH_CHUNK=<bytes> and RL_BENCH_SOCKBUF=<bytes> override the comm's
 * chunk_bytes and sockbuf_bytes (tuning); RL_BENCH_WORLDS=2 (or 4) runs
 * one world size only. */
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/tcp_internal.h"

#define MAX_ITERS 16
#define MAX_WORLD 4

typedef struct result {
    int rc;
    int shm_links; /* rl_comm_tcp_shm_links of this rank */
    char msg[600];
    double t[2][MAX_ITERS]; /* per size, per timed iteration: this rank's seconds */
} result;

static const size_t sizes[2] = {4u << 20, 64u << 20};
static const int iters[2] = {12, 6};
static const int warmup = 2;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double memcpy_gbs(size_t bytes) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) return 0;
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double t[7];
    for (int i = 0; i < 7; i++) {
        double t0 = rl_now();
        memcpy(b, a, bytes);
        t[i] = rl_now() - t0;
        a[i] = b[bytes - 1 - (size_t)i]; /* keep the copies observable */
    }
    free(a);
    free(b);
    return (double)bytes / median(t, 7) / 1e9;
}

static size_t sockbuf;

static int rank_main(int rank, int world, int port, size_t chunk, result *res) {
    rl_err e;
    rl_store *st = NULL;
    if (rl_store_connect("127.0.0.1", port, 30, &st, &e)) {
        snprintf(res->msg, sizeof res->msg, "store: %s", e.msg);
        return 1;
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "bench/%d/comm", world);
    rl_comm_opts o = {.backend = "tcp", .rank = rank, .world = world, .store = st,
                      .prefix = prefix, .timeout_s = 60, .chunk_bytes = chunk,
                      .sockbuf_bytes = sockbuf};
    rl_comm *c = NULL;
    if (rl_comm_init(&o, &c, &e)) {
        snprintf(res->msg, sizeof res->msg, "init: %s", e.msg);
        rl_store_close(st);
        return 1;
    }
    res->shm_links = rl_comm_tcp_shm_links(c);
    int rc = 0;
    for (int s = 0; s < 2 && !rc; s++) {
        size_t n = sizes[s] / 4;
        float *buf = malloc(sizes[s]);
        if (!buf) {
            snprintf(res->msg, sizeof res->msg, "out of memory");
            rc = 1;
            break;
        }
        for (size_t i = 0; i < n; i++) buf[i] = (float)((i + (size_t)rank) % 97) * 0.01f;
        for (int it = 0; it < warmup + iters[s] && !rc; it++) {
            double t0 = 0;
            if ((rc = rl_comm_barrier(c, &e)) == 0) {
                t0 = rl_now();
                rc = rl_comm_allreduce(c, buf, n, RL_F32, RL_SUM, &e);
            }
            if (rc) snprintf(res->msg, sizeof res->msg, "%s", e.msg);
            else if (it >= warmup) res->t[s][it - warmup] = rl_now() - t0;
        }
        free(buf);
    }
    rl_comm_destroy(c);
    rl_store_close(st);
    return rc ? 1 : 0;
}

static int run_world(int world, size_t chunk, double mcpy) {
    result *res = mmap(NULL, sizeof(result) * MAX_WORLD, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof(result) * MAX_WORLD);
    pid_t pids[MAX_WORLD];
    int pipes[MAX_WORLD][2];
    fflush(NULL);
    /* Fork before the store's thread exists (fork copies one thread only),
     * then hand the children the store's port through a pipe. */
    for (int r = 0; r < world; r++) {
        if (pipe(pipes[r]) != 0) return 1;
        pids[r] = fork();
        if (pids[r] < 0) return 1;
        if (pids[r] == 0) {
            for (int k = 0; k <= r; k++) close(pipes[k][1]);
            int port = 0;
            struct pollfd p = {.fd = pipes[r][0], .events = POLLIN};
            if (poll(&p, 1, 30000) != 1 || read(pipes[r][0], &port, sizeof port) != sizeof port ||
                port <= 0)
                _exit(1);
            res[r].rc = rank_main(r, world, port, chunk, &res[r]);
            _exit(res[r].rc);
        }
        close(pipes[r][0]);
    }
    rl_err e;
    rl_store_server *srv = NULL;
    int port = rl_store_server_start("127.0.0.1", 0, &srv, &e) ? -1 : rl_store_server_port(srv);
    if (port < 0) fprintf(stderr, "comm_allreduce bench: store: %s\n", e.msg);
    for (int r = 0; r < world; r++) {
        if (write(pipes[r][1], &port, sizeof port) != sizeof port) port = -1;
        close(pipes[r][1]);
    }
    int bad = port < 0;
    for (int r = 0; r < world; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "comm_allreduce bench: rank %d failed: %s\n", r, res[r].msg);
            bad = 1;
        }
    }
    if (srv) rl_store_server_stop(srv);
    for (int s = 0; s < 2 && !bad; s++) {
        double t[MAX_ITERS];
        for (int it = 0; it < iters[s]; it++) {
            t[it] = 0;
            for (int r = 0; r < world; r++)
                if (res[r].t[s][it] > t[it]) t[it] = res[r].t[s][it];
        }
        double sec = median(t, iters[s]);
        bool shm = true;
        for (int r = 0; r < world; r++) shm = shm && res[r].shm_links == 3;
        double bus = 2.0 * (world - 1) / world * (double)sizes[s] / sec / 1e9;
        printf("{\"bench\":\"allreduce_tcp\",\"world\":%d,\"bytes\":%zu,\"dtype\":\"f32\","
               "\"iters\":%d,\"chunk_bytes\":%zu,\"sockbuf_bytes\":%zu,\"seconds\":%.6f,\"algbw_gbs\":%.3f,"
               "\"busbw_gbs\":%.3f,\"memcpy_gbs\":%.3f,\"ratio_to_memcpy\":%.3f,\"shm\":%s,"
               "\"cpus\":%ld}\n",
               world, sizes[s], iters[s], chunk ? chunk : (size_t)1 << 20, sockbuf, sec,
               (double)sizes[s] / sec / 1e9, bus, mcpy, mcpy > 0 ? bus / mcpy : 0.0,
               shm ? "true" : "false", sysconf(_SC_NPROCESSORS_ONLN));
        fflush(stdout);
    }
    munmap(res, sizeof(result) * MAX_WORLD);
    return bad;
}

int main(void) {
    rl_log_init(-1);
    rl_log_set_level(RL_LOG_WARN); /* the store's info lines are noise here */
    const char *ch = getenv("RL_BENCH_CHUNK");
    size_t chunk = ch ? (size_t)strtoull(ch, NULL, 10) : 0;
    const char *sb = getenv("RL_BENCH_SOCKBUF");
    sockbuf = sb ? (size_t)strtoull(sb, NULL, 10) : 0;
    double mcpy = memcpy_gbs(64u << 20);
    const char *ws = getenv("RL_BENCH_WORLDS");
    int only = ws ? atoi(ws) : 0;
    int worlds[2] = {2, 4}, bad = 0;
    for (int w = 0; w < 2; w++)
        if (!only || only == worlds[w]) bad |= run_world(worlds[w], chunk, mcpy);
    return bad;
}
