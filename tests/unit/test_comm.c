/* comm: the tcp ring between real processes.
 *
 * Each multi-rank test hosts a rendezvous store in the test process, forks
 * one child per rank (each with its own store client and communicator), and
 * collects what the children saw through a shared memory page: a status, a
 * message, timings and a hash of every result buffer. Children check their
 * results against values computed locally; the parent checks that every
 * rank ended with bit-identical buffers and that nothing hung (children
 * that outlive their limit are killed and the test fails). Every test makes
 * its own store and key prefix, so tests are independent of each other and
 * of their order. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "comm/tcp_internal.h"
#include "children.h"

/* ---- harness -------------------------------------------------------------------- */

#define MAX_WORLD 4
#define MAX_CASES 160

typedef struct cres {
    int rc;   /* 0: the child's checks passed */
    int code; /* rl_err code of the error a fault test expected */
    double t0, t1;
    char msg[700];
    int ncase;
    uint64_t hash[MAX_CASES];
    atomic_int ready;
} cres;

typedef struct shared {
    cres r[MAX_WORLD];
    _Atomic double t_event; /* when the parent killed/stopped a rank */
} shared;

typedef struct tctx {
    int rank, world, port;
    const char *host;
    char prefix[128];
    double timeout;
    size_t chunk;
    int shm; /* comm opts.shm: 0 same-host links use shared memory, -1 TCP only */
    const char *secret; /* comm opts.secret (NULL: none) */
    rl_store *store;
    cres *res;
    shared *sh;
    const void *arg;
} tctx;

typedef int (*child_fn)(tctx *cx);
typedef void (*parent_fn)(pid_t *pids, shared *sh, const void *arg);

typedef struct group {
    int world;
    double timeout; /* comm timeout_s */
    size_t chunk;
    int shm; /* -1: force the TCP data path */
    child_fn fn;
    const void *arg;
    parent_fn parent; /* runs in the parent while the children run (optional) */
    const char *host; /* comm host (NULL: the default, 127.0.0.1) */
    const char *secret; /* every rank's comm secret (NULL: none) */
    double limit_s;   /* children still running after this are a hang */
} group;

static int failf(tctx *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(tctx *cx, const char *fmt, ...) {
    char tmp[sizeof cx->res->msg]; /* the arguments may point into res->msg */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(cx->res->msg, tmp, sizeof tmp);
    return 1;
}
#define FAILF(cx, ...) return failf(cx, __VA_ARGS__)
#define CHECK(cx, cond, ...)                                                            \
    do {                                                                                \
        if (!(cond)) FAILF(cx, __VA_ARGS__);                                            \
    } while (0)

static int tc_init_as(tctx *cx, int world, rl_comm **c, rl_err *e) {
    rl_comm_opts o = {.backend = "tcp", .rank = cx->rank, .world = world, .store = cx->store,
                      .prefix = cx->prefix, .host = cx->host, .timeout_s = cx->timeout,
                      .secret = cx->secret, .secret_len = cx->secret ? strlen(cx->secret) : 0,
                      .chunk_bytes = cx->chunk, .shm = cx->shm};
    return rl_comm_init(&o, c, e);
}

static int tc_init(tctx *cx, rl_comm **c) {
    rl_err e;
    int rc = tc_init_as(cx, cx->world, c, &e);
    if (rc) {
        snprintf(cx->res->msg, sizeof cx->res->msg, "init: %s", e.msg);
        return rc;
    }
    /* every rank runs on this host: each link uses shared memory unless
     * forced onto TCP (or /dev/shm is unusable here) */
    int links = rl_comm_tcp_shm_links(*c), want = cx->shm < 0 ? 0 : 3;
    if (cx->world > 1 && links != want && (want == 0 || access("/dev/shm", W_OK) == 0)) {
        snprintf(cx->res->msg, sizeof cx->res->msg, "shm links 0x%x, expected 0x%x", links, want);
        rl_comm_destroy(*c);
        *c = NULL;
        return 1;
    }
    return 0;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int group_counter;

/* Read the store's port from the parent (bounded: a parent that died must
 * not leave the child waiting). */
static int read_port(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int port = 0;
    if (poll(&p, 1, 20000) != 1 || read(fd, &port, sizeof port) != (ssize_t)sizeof port) return -1;
    return port;
}

/* Fork g->world ranks; returns the shared results (munmap by caller).
 *
 * The ranks are forked BEFORE the store server starts, and learn its port
 * through a pipe: fork() copies only the calling thread, and a child forked
 * while the server thread held an allocator lock (ASan's allocator has no
 * fork handlers) would deadlock at its next malloc. */
static shared *run_group(const group *g) {
    rl_err e;
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "test/%d/%d/comm", (int)getpid(), ++group_counter);
    pid_t pids[MAX_WORLD];
    int pipes[MAX_WORLD][2];
    for (int r = 0; r < g->world; r++) {
        sh->r[r].rc = -1;
        cr_assert_eq(pipe(pipes[r]), 0);
    }
    int r = rl_test_fork_n(g->world, pids);
    cr_assert(r != -2, "fork failed");
    if (r >= 0) {
        for (int k = 0; k < g->world; k++) {
            close(pipes[k][1]);
            if (k != r) close(pipes[k][0]);
        }
        int port = read_port(pipes[r][0]);
        if (port <= 0) _exit(1);
        tctx cx = {.rank = r, .world = g->world, .port = port, .host = g->host,
                   .secret = g->secret,
                   .timeout = g->timeout,
                   .chunk = g->chunk, .shm = g->shm, .res = &sh->r[r], .sh = sh, .arg = g->arg};
        snprintf(cx.prefix, sizeof cx.prefix, "%s", prefix);
        if (rl_store_connect("127.0.0.1", port, 10, &cx.store, &e)) {
            snprintf(cx.res->msg, sizeof cx.res->msg, "store connect: %s", e.msg);
            _exit(1);
        }
        int rc = g->fn(&cx);
        rl_store_close(cx.store);
        cx.res->rc = rc;
        _exit(rc ? 1 : 0);
    }
    for (int k = 0; k < g->world; k++) close(pipes[k][0]);
    rl_store_server *srv = NULL;
    int src = rl_store_server_start("127.0.0.1", 0, &srv, &e);
    int port = src ? -1 : rl_store_server_port(srv);
    for (int k = 0; k < g->world; k++) {
        if (write(pipes[k][1], &port, sizeof port) != (ssize_t)sizeof port) port = -1;
        close(pipes[k][1]);
    }
    cr_assert_eq(src, 0, "store: %s", e.msg);
    if (g->parent) g->parent(pids, sh, g->arg);
    int status[MAX_WORLD];
    rl_test_wait_n(pids, g->world, g->limit_s, status);
    rl_store_server_stop(srv);
    for (int k = 0; k < g->world; k++) {
        if (status[k] == -1) {
            snprintf(sh->r[k].msg, sizeof sh->r[k].msg, "rank %d still running after %.0f s "
                     "(hang): killed", k, g->limit_s);
            sh->r[k].rc = 99;
        } else if (WIFSIGNALED(status[k]) && sh->r[k].rc != 98) {
            snprintf(sh->r[k].msg, sizeof sh->r[k].msg, "rank %d died of signal %d", k,
                     WTERMSIG(status[k]));
            sh->r[k].rc = 97;
        } else if (WIFEXITED(status[k]) && WEXITSTATUS(status[k]) != 0 && sh->r[k].rc == 0) {
            sh->r[k].rc = WEXITSTATUS(status[k]);
        }
    }
    return sh;
}

/* Every rank's checks passed (ranks listed in `skip` are not checked). */
static void expect_all_ok(shared *sh, int world, int skip) {
    for (int r = 0; r < world; r++) {
        if (r == skip) continue;
        cr_expect_eq(sh->r[r].rc, 0, "rank %d: %s", r, sh->r[r].msg);
    }
}

/* Every rank recorded the same hashes: bit-identical results. */
static void expect_same_hashes(shared *sh, int world) {
    for (int r = 1; r < world; r++) {
        cr_expect_eq(sh->r[r].ncase, sh->r[0].ncase, "rank %d ran %d cases, rank 0 %d", r,
                     sh->r[r].ncase, sh->r[0].ncase);
        for (int k = 0; k < sh->r[0].ncase && k < sh->r[r].ncase; k++)
            cr_expect_eq(sh->r[r].hash[k], sh->r[0].hash[k],
                         "case %d: rank %d's result differs from rank 0's", k, r);
    }
}

/* ---- deterministic test data ------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hval(int seed, int rank, size_t i) {
    return mix(((uint64_t)seed << 40) ^ ((uint64_t)rank << 56) ^ (uint64_t)i);
}

static uint16_t bf16_of(float f) { /* exact for the small integers we use */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static uint16_t bf16_round(float f) { /* round to nearest even, finite inputs */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

/* Values whose sums over <= 4 ranks are exact in every dtype, so the
 * expectation does not depend on the order of additions. i64 uses the full
 * range and wraps, identically on both sides. */
static void gen(rl_dtype t, void *buf, size_t i, int rank, int seed) {
    uint64_t h = hval(seed, rank, i);
    switch (t) {
    case RL_F32: ((float *)buf)[i] = (float)((int)(h % 2001) - 1000) * 0.125f; break;
    case RL_F64: ((double *)buf)[i] = (double)((int64_t)(h % 2000001) - 1000000) / 1024.0; break;
    case RL_I64: ((uint64_t *)buf)[i] = h; break;
    case RL_BF16: ((uint16_t *)buf)[i] = bf16_of((float)((int)(h % 129) - 64)); break;
    }
}

static void fill(rl_dtype t, void *buf, size_t n, int rank, int seed) {
    for (size_t i = 0; i < n; i++) gen(t, buf, i, rank, seed);
}

/* Does element i of buf equal the reduction over `world` ranks of element
 * src_i's generated values? */
static bool expect_reduced(rl_dtype t, const void *buf, size_t i, size_t src_i, int world,
                           int seed, rl_redop op) {
    switch (t) {
    case RL_F32: {
        float s = 0;
        for (int r = 0; r < world; r++) s += (float)((int)(hval(seed, r, src_i) % 2001) - 1000) * 0.125f;
        if (op == RL_AVG) s /= (float)world;
        return memcmp(&s, (const float *)buf + i, 4) == 0;
    }
    case RL_F64: {
        double s = 0;
        for (int r = 0; r < world; r++)
            s += (double)((int64_t)(hval(seed, r, src_i) % 2000001) - 1000000) / 1024.0;
        if (op == RL_AVG) s /= (double)world;
        return memcmp(&s, (const double *)buf + i, 8) == 0;
    }
    case RL_I64: {
        uint64_t s = 0;
        for (int r = 0; r < world; r++) s += hval(seed, r, src_i);
        return s == ((const uint64_t *)buf)[i];
    }
    case RL_BF16: {
        float s = 0;
        for (int r = 0; r < world; r++) s += (float)((int)(hval(seed, r, src_i) % 129) - 64);
        uint16_t want = op == RL_AVG ? bf16_round(s / (float)world) : bf16_of(s);
        return want == ((const uint16_t *)buf)[i];
    }
    }
    return false;
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = mix(h ^ w);
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return mix(h ^ n);
}

static const char *dt_name(rl_dtype t) {
    static const char *n[] = {"f32", "f64", "bf16", "i64"};
    return n[t];
}

static void record(tctx *cx, const void *buf, size_t bytes) {
    if (cx->res->ncase < MAX_CASES) cx->res->hash[cx->res->ncase++] = hash_bytes(buf, bytes);
}

/* ---- children: collectives ------------------------------------------------------ */

typedef struct ar_args {
    bool big;      /* add a 64 MiB f32 allreduce */
    bool random;   /* add random (inexact) floats, checked by tolerance + hashes */
    bool only_random;
} ar_args;

static int child_allreduce(tctx *cx) {
    const ar_args *a = cx->arg;
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    rl_err e;
    int seed = 1;
    size_t counts[] = {0, 1, 7, 1000003};
    rl_dtype dts[] = {RL_F32, RL_F64, RL_I64, RL_BF16};
    for (size_t ci = 0; ci < 4 && !a->only_random; ci++) {
        for (int di = 0; di < 4; di++) {
            for (int op = RL_SUM; op <= RL_AVG; op++) {
                rl_dtype t = dts[di];
                if (t == RL_I64 && op == RL_AVG) continue;
                size_t n = counts[ci];
                void *buf = n ? malloc(n * rl_dtype_size(t)) : NULL;
                fill(t, buf, n, cx->rank, ++seed);
                int rc = rl_comm_allreduce(c, buf, n, t, (rl_redop)op, &e);
                CHECK(cx, rc == 0, "allreduce(%zu %s %s): %s", n, dt_name(t),
                      op ? "avg" : "sum", e.msg);
                for (size_t i = 0; i < n; i++)
                    CHECK(cx, expect_reduced(t, buf, i, i, cx->world, seed, (rl_redop)op),
                          "allreduce(%zu %s %s): element %zu wrong", n, dt_name(t),
                          op ? "avg" : "sum", i);
                record(cx, buf, n * rl_dtype_size(t));
                free(buf);
            }
        }
    }
    if (a->big) {
        size_t n = (64u << 20) / 4;
        float *buf = malloc(n * 4);
        CHECK(cx, buf, "out of memory");
        fill(RL_F32, buf, n, cx->rank, ++seed);
        int rc = rl_comm_allreduce(c, buf, n, RL_F32, RL_SUM, &e);
        CHECK(cx, rc == 0, "allreduce(64 MiB f32): %s", e.msg);
        for (size_t i = 0; i < n; i++)
            CHECK(cx, expect_reduced(RL_F32, buf, i, i, cx->world, seed, RL_SUM),
                  "allreduce(64 MiB f32): element %zu wrong", i);
        record(cx, buf, n * 4);
        free(buf);
    }
    if (a->random) {
        /* Inexact sums: the order of additions matters, so only the
         * algorithm's fixed order makes ranks (and runs) agree bit for bit. */
        size_t n = 1000003;
        float *buf = malloc(n * 4);
        CHECK(cx, buf, "out of memory");
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)((double)(hval(777, cx->rank, i) >> 11) / 9007199254740992.0 - 0.5);
        CHECK(cx, rl_comm_allreduce(c, buf, n, RL_F32, RL_AVG, &e) == 0, "random: %s", e.msg);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < cx->world; r++)
                want += (double)(float)((double)(hval(777, r, i) >> 11) / 9007199254740992.0 - 0.5);
            want /= cx->world;
            CHECK(cx, fabs((double)buf[i] - want) <= 1e-6, "random: element %zu is %g, want %g",
                  i, (double)buf[i], want);
        }
        record(cx, buf, n * 4);
        free(buf);
    }
    rl_comm_destroy(c);
    return 0;
}

static int child_collectives(tctx *cx) {
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    rl_err e;
    int W = cx->world, me = cx->rank, seed = 100;
    size_t counts[] = {0, 1, 7, 100003};
    rl_dtype dts[] = {RL_F32, RL_BF16, RL_I64};
    /* broadcast from every root */
    for (int root = 0; root < W; root++)
        for (size_t ci = 0; ci < 4; ci++)
            for (int di = 0; di < 3; di++) {
                rl_dtype t = dts[di];
                size_t n = counts[ci] + (size_t)root, es = rl_dtype_size(t);
                char *buf = malloc(n * es + 1);
                seed++;
                if (me == root) fill(t, buf, n, root, seed);
                else memset(buf, 0xab, n * es);
                CHECK(cx, rl_comm_broadcast(c, buf, n, t, root, &e) == 0,
                      "broadcast(%zu %s root %d): %s", n, dt_name(t), root, e.msg);
                char *want = malloc(n * es + 1);
                fill(t, want, n, root, seed);
                CHECK(cx, memcmp(buf, want, n * es) == 0, "broadcast(%zu %s root %d): wrong data",
                      n, dt_name(t), root);
                record(cx, buf, n * es);
                free(buf);
                free(want);
            }
    /* allgather, out of place and in place */
    for (size_t ci = 0; ci < 4; ci++)
        for (int di = 0; di < 3; di++)
            for (int inplace = 0; inplace < 2; inplace++) {
                rl_dtype t = dts[di];
                size_t n = counts[ci], es = rl_dtype_size(t);
                seed++;
                char *recv = malloc((size_t)W * n * es + 1), *send = malloc(n * es + 1);
                memset(recv, 0xcd, (size_t)W * n * es);
                char *src = inplace ? recv + (size_t)me * n * es : send;
                fill(t, src, n, me, seed);
                CHECK(cx, rl_comm_allgather(c, src, recv, n, t, &e) == 0,
                      "allgather(%zu %s%s): %s", n, dt_name(t), inplace ? " in place" : "", e.msg);
                for (int r = 0; r < W; r++) {
                    fill(t, send, n, r, seed);
                    CHECK(cx, memcmp(recv + (size_t)r * n * es, send, n * es) == 0,
                          "allgather(%zu %s): block %d wrong", n, dt_name(t), r);
                }
                record(cx, recv, (size_t)W * n * es);
                free(recv);
                free(send);
            }
    /* reduce_scatter: SUM/AVG, out of place and in place */
    rl_dtype rdts[] = {RL_F32, RL_F64, RL_BF16, RL_I64};
    for (size_t ci = 0; ci < 4; ci++)
        for (int di = 0; di < 4; di++)
            for (int op = RL_SUM; op <= RL_AVG; op++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    rl_dtype t = rdts[di];
                    if (t == RL_I64 && op == RL_AVG) continue;
                    size_t n = counts[ci], es = rl_dtype_size(t);
                    seed++;
                    char *send = malloc((size_t)W * n * es + 1), *out = malloc(n * es + 1);
                    fill(t, send, (size_t)W * n, me, seed);
                    char *recv = inplace ? send + (size_t)me * n * es : out;
                    CHECK(cx, rl_comm_reduce_scatter(c, send, recv, n, t, (rl_redop)op, &e) == 0,
                          "reduce_scatter(%zu %s %s%s): %s", n, dt_name(t), op ? "avg" : "sum",
                          inplace ? " in place" : "", e.msg);
                    for (size_t i = 0; i < n; i++)
                        CHECK(cx, expect_reduced(t, recv, i, (size_t)me * n + i, W, seed,
                                                 (rl_redop)op),
                              "reduce_scatter(%zu %s %s%s): element %zu wrong", n, dt_name(t),
                              op ? "avg" : "sum", inplace ? " in place" : "", i);
                    free(send);
                    free(out);
                }
    /* barrier: nobody leaves before the last one came */
    for (int k = 0; k < 3; k++) CHECK(cx, rl_comm_barrier(c, &e) == 0, "barrier: %s", e.msg);
    sleep_s(0.05 * me);
    cx->res->t0 = rl_now();
    CHECK(cx, rl_comm_barrier(c, &e) == 0, "barrier: %s", e.msg);
    cx->res->t1 = rl_now();
    CHECK(cx, rl_comm_wait(c, &e) == 0, "wait: %s", e.msg);
    rl_comm_destroy(c);
    return 0;
}

static void run_allreduce(int world, bool big, size_t chunk, int shm) {
    ar_args a = {.big = big, .random = true};
    group g = {.world = world, .timeout = 20, .chunk = chunk, .shm = shm, .fn = child_allreduce,
               .arg = &a, .limit_s = 50};
    shared *sh = run_group(&g);
    expect_all_ok(sh, world, -1);
    expect_same_hashes(sh, world);
    cr_expect_gt(sh->r[0].ncase, 0);
    munmap(sh, sizeof *sh);
}

static void run_collectives(int world, int shm) {
    group g = {.world = world, .timeout = 20, .shm = shm, .fn = child_collectives, .limit_s = 50};
    shared *sh = run_group(&g);
    expect_all_ok(sh, world, -1);
    expect_same_hashes(sh, world);
    double last_in = 0, first_out = 1e300;
    for (int r = 0; r < world; r++) {
        if (sh->r[r].t0 > last_in) last_in = sh->r[r].t0;
        if (sh->r[r].t1 < first_out) first_out = sh->r[r].t1;
    }
    cr_expect_geq(first_out, last_in, "a rank left the barrier %.3f s before the last arrived",
                  last_in - first_out);
    munmap(sh, sizeof *sh);
}

/* Every rank is on this host, so by default each link moves its data
 * through shared memory; the *_tcp variants force the TCP data path. */
Test(comm_allreduce, world2_incl_64MiB, .timeout = 60) { run_allreduce(2, true, 0, 0); }
Test(comm_allreduce, world3_odd_chunks, .timeout = 60) { run_allreduce(3, false, 1001, 0); }
Test(comm_allreduce, world4_incl_64MiB, .timeout = 60) { run_allreduce(4, true, 0, 0); }
Test(comm_allreduce, world2_incl_64MiB_tcp, .timeout = 60) { run_allreduce(2, true, 0, -1); }
Test(comm_allreduce, world3_odd_chunks_tcp, .timeout = 60) { run_allreduce(3, false, 1001, -1); }
Test(comm_allreduce, world4_odd_chunks_tcp, .timeout = 60) { run_allreduce(4, false, 4099, -1); }
Test(comm_collectives, world2, .timeout = 60) { run_collectives(2, 0); }
Test(comm_collectives, world3, .timeout = 60) { run_collectives(3, 0); }
Test(comm_collectives, world4, .timeout = 60) { run_collectives(4, 0); }
Test(comm_collectives, world2_tcp, .timeout = 60) { run_collectives(2, -1); }
Test(comm_collectives, world3_tcp, .timeout = 60) { run_collectives(3, -1); }

/* The pre-flight's link probe: every rank gets a rate for its left link
 * (t0 carries it to the parent), the op is in the flight recorder, the
 * ring stays in step for the op after it, and a size out of range is
 * refused before anything moves. */
static int child_link_probe(tctx *cx) {
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    rl_err e;
    double gbps = -1;
    if (rl_comm_link_probe(c, 0, &gbps, &e) != RL_EINPUT || !strstr(e.msg, "outside 1..1 GiB"))
        return failf(cx, "0 bytes: %s", e.msg);
    if (rl_comm_link_probe(c, (size_t)4 << 20, &gbps, &e)) return failf(cx, "probe: %s", e.msg);
    cx->res->t0 = gbps;
    int64_t one = 1;
    if (rl_comm_allreduce(c, &one, 1, RL_I64, RL_SUM, &e) || one != cx->world)
        return failf(cx, "the allreduce after it: %s (%lld)", e.msg, (long long)one);
    rl_comm_record rec[4];
    int n = rl_comm_records(c, rec, 4);
    if (n < 2 || strcmp(rec[n - 2].op, "link_probe") || rec[n - 2].bytes != (size_t)4 << 20)
        return failf(cx, "records: %d, the probe's not second to last", n);
    rl_comm_destroy(c);
    return 0;
}

static void run_link_probe(int world, int shm) {
    group g = {.world = world, .timeout = 20, .shm = shm, .fn = child_link_probe, .limit_s = 50};
    shared *sh = run_group(&g);
    expect_all_ok(sh, world, -1);
    for (int r = 0; r < world; r++)
        cr_expect(sh->r[r].t0 > 0.001 && sh->r[r].t0 < 1e4, "rank %d: %g GB/s", r, sh->r[r].t0);
    munmap(sh, sizeof *sh);
}
Test(comm_collectives, link_probe_tcp, .timeout = 60) { run_link_probe(3, -1); }
Test(comm_collectives, link_probe_shm, .timeout = 60) { run_link_probe(2, 0); }

/* RL_COMM_SHM=0 in the environment turns shared memory off too. */
static int child_env_off(tctx *cx) {
    setenv("RL_COMM_SHM", "0", 1);
    cx->shm = -1; /* what tc_init then checks: no shared-memory link */
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    rl_comm_destroy(c);
    return 0;
}

Test(comm_collectives, env_turns_shm_off, .timeout = 60) {
    group g = {.world = 2, .timeout = 20, .fn = child_env_off, .limit_s = 30};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 2, -1);
    munmap(sh, sizeof *sh);
}

/* A ring whose maker was killed before either side unlinked its name: the
 * next ring setup on the host removes it; a live maker's ring stays. */
Test(comm_collectives, stale_shm_rings_of_dead_ranks_are_swept, .timeout = 60) {
    pid_t dead = fork();
    cr_assert(dead >= 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char gone[96], live[96], path[128];
    snprintf(gone, sizeof gone, "/rl-comm-%d-0-00000000000000ab", (int)dead);
    snprintf(live, sizeof live, "/rl-comm-%d-0-00000000000000cd", (int)getpid());
    for (int k = 0; k < 2; k++) {
        int fd = shm_open(k ? live : gone, O_CREAT | O_RDWR, 0600);
        cr_assert(fd >= 0, "shm_open: %s", strerror(errno));
        close(fd);
    }
    cr_expect_geq(rl_comm_tcp_shm_sweep(), 1);
    snprintf(path, sizeof path, "/dev/shm%s", gone);
    cr_expect_neq(access(path, F_OK), 0, "%s survived its maker", path);
    snprintf(path, sizeof path, "/dev/shm%s", live);
    cr_expect_eq(access(path, F_OK), 0, "%s of a live maker was removed", path);
    shm_unlink(live);
    /* and a real 2-rank setup sweeps too: a stale name is gone after it */
    int fd = shm_open(gone, O_CREAT | O_RDWR, 0600);
    cr_assert(fd >= 0);
    close(fd);
    ar_args args = {0};
    group g = {.world = 2, .timeout = 20, .fn = child_allreduce, .arg = &args, .limit_s = 30};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 2, -1);
    munmap(sh, sizeof *sh);
    snprintf(path, sizeof path, "/dev/shm%s", gone);
    cr_expect_neq(access(path, F_OK), 0, "a ring setup left %s", path);
}

/* IPv6 hosts are published in brackets and parsed back. */
Test(comm_collectives, ipv6_loopback, .timeout = 60) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (!ok) cr_skip_test("no IPv6 loopback here");
    ar_args args = {.random = true, .only_random = true};
    group g = {.world = 3, .timeout = 20, .fn = child_allreduce, .arg = &args, .host = "::1",
               .limit_s = 50};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 3, -1);
    expect_same_hashes(sh, 3);
    munmap(sh, sizeof *sh);
}

/* The same inputs give the same bits whatever the chunk size (the chunking
 * changes the timing and the staging, never the order of additions). */
Test(comm_allreduce, deterministic_across_runs_and_chunks, .timeout = 60) {
    ar_args a = {.random = true, .only_random = true};
    uint64_t first = 0;
    size_t chunks[] = {0, 1000, 65536};
    for (int k = 0; k < 4; k++) {
        /* k == 3: the TCP data path gives the same bits as shared memory */
        group g = {.world = 3, .timeout = 20, .chunk = chunks[k % 3], .shm = k == 3 ? -1 : 0,
                   .fn = child_allreduce, .arg = &a, .limit_s = 50};
        shared *sh = run_group(&g);
        expect_all_ok(sh, 3, -1);
        expect_same_hashes(sh, 3);
        cr_assert_eq(sh->r[0].ncase, 1);
        if (k == 0) first = sh->r[0].hash[0];
        else cr_expect_eq(sh->r[0].hash[0], first, "chunk %zu%s gave other bits than the default",
                          chunks[k % 3], k == 3 ? " over TCP" : "");
        munmap(sh, sizeof *sh);
    }
}

/* ---- children: faults --------------------------------------------------------------- */

typedef struct fault_args {
    int victim;
    int sig; /* SIGKILL: dies (sockets close); SIGSTOP: silent but connected */
} fault_args;

/* Loop allreduces until one fails; report when and how. */
static int child_loop_until_error(tctx *cx) {
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    size_t n = 1 << 20;
    float *buf = calloc(n, 4);
    rl_err e = {0};
    int rc = 0;
    double t_end = rl_now() + 30;
    for (int it = 0; rl_now() < t_end; it++) {
        if (it == 2) atomic_store(&cx->res->ready, 1);
        rc = rl_comm_allreduce(c, buf, n, RL_F32, RL_SUM, &e);
        if (rc) break;
    }
    cx->res->t1 = rl_now();
    cx->res->code = rc;
    snprintf(cx->res->msg, sizeof cx->res->msg, "%s", rc ? e.msg : "no error within 30 s");
    if (!rc) return 1;
    /* dead now: the next op fails at once with the same code */
    double t = rl_now();
    rl_err e2;
    int rc2 = rl_comm_allreduce(c, buf, 1, RL_F32, RL_SUM, &e2);
    free(buf);
    rl_comm_destroy(c);
    if (rc2 != rc || rl_now() - t > 0.5)
        FAILF(cx, "second op after failure: rc %d (first %d), took %.3f s: %s", rc2, rc,
              rl_now() - t, e2.msg);
    return 0;
}

static void parent_hit_victim(pid_t *pids, shared *sh, const void *arg) {
    const fault_args *f = arg;
    double limit = rl_now() + 20;
    for (int r = 0; r < MAX_WORLD; r++)
        while (r < 3 && !atomic_load(&sh->r[r].ready) && rl_now() < limit) sleep_s(0.002);
    sleep_s(0.05);
    atomic_store(&sh->t_event, rl_now());
    kill(pids[f->victim], f->sig);
    if (f->sig == SIGSTOP) {
        /* keep it silent until the others gave up (or 10 s), then let it die */
        double until = rl_now() + 10;
        for (int r = 0; r < 3; r++)
            while (r != f->victim && sh->r[r].t1 == 0 && rl_now() < until) sleep_s(0.01);
        kill(pids[f->victim], SIGKILL);
    }
}

static void run_fault(int sig, double timeout, int shm) {
    fault_args f = {.victim = 1, .sig = sig};
    group g = {.world = 3, .timeout = timeout, .shm = shm, .fn = child_loop_until_error,
               .arg = &f, .parent = parent_hit_victim, .limit_s = 40};
    shared *sh = run_group(&g);
    double t_event = atomic_load(&sh->t_event);
    cr_assert_gt(t_event, 0, "the victim never became ready: %s / %s", sh->r[0].msg,
                 sh->r[2].msg);
    int timeouts = 0;
    for (int r = 0; r < 3; r++) {
        if (r == f.victim) continue;
        cres *x = &sh->r[r];
        cr_expect_eq(x->rc, 0, "rank %d: %s", r, x->msg);
        cr_expect(x->code == RL_EPEER || x->code == RL_ETIMEOUT, "rank %d: code %d (%s)", r,
                  x->code, x->msg);
        cr_expect(strstr(x->msg, "rank ") != NULL, "rank %d: message names no rank: %s", r,
                  x->msg);
        double dt = x->t1 - t_event;
        cr_expect_lt(dt, timeout + 2.0, "rank %d needed %.2f s to fail (timeout %.1f): %s", r,
                     dt, timeout, x->msg);
        if (x->code == RL_ETIMEOUT) timeouts++;
        cr_log_info("rank %d failed %.3f s after the fault: %s", r, dt, x->msg);
    }
    if (sig == SIGSTOP) cr_expect_gt(timeouts, 0, "a silent peer must be reported as a timeout");
    munmap(sh, sizeof *sh);
}

Test(comm_fault, killed_rank_fails_the_others, .timeout = 60) { run_fault(SIGKILL, 5.0, 0); }
Test(comm_fault, silent_rank_times_out, .timeout = 60) { run_fault(SIGSTOP, 1.5, 0); }
Test(comm_fault, killed_rank_fails_the_others_tcp, .timeout = 60) { run_fault(SIGKILL, 5.0, -1); }
Test(comm_fault, silent_rank_times_out_tcp, .timeout = 60) { run_fault(SIGSTOP, 1.5, -1); }

struct abort_ctx {
    rl_comm *c;
    double after;
};
static void *abort_later(void *p) {
    struct abort_ctx *a = p;
    sleep_s(a->after);
    rl_comm_abort(a->c);
    return NULL;
}

/* Rank 0 waits in an allreduce on a rank that is alive but never joins;
 * another thread aborts; rank 0 must return RL_EABORT promptly. Rank 1
 * joins later and must be told rank 0 went away. */
static int child_abort(tctx *cx) {
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    float buf[1000] = {0};
    rl_err e;
    if (cx->rank == 0) {
        struct abort_ctx a = {c, 0.3};
        pthread_t th;
        CHECK(cx, pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create");
        double t = rl_now();
        int rc = rl_comm_allreduce(c, buf, 1000, RL_F32, RL_SUM, &e);
        double dt = rl_now() - t;
        pthread_join(th, NULL);
        CHECK(cx, rc == RL_EABORT, "allreduce returned %d, want RL_EABORT: %s", rc,
              rc ? e.msg : "ok");
        CHECK(cx, dt < 2.0, "abort took %.2f s to unblock (timeout is 30 s)", dt);
        CHECK(cx, strstr(e.msg, "rank 0") && strstr(e.msg, "abort"), "message: %s", e.msg);
        rc = rl_comm_broadcast(c, buf, 10, RL_F32, 0, &e);
        CHECK(cx, rc == RL_EABORT, "op after abort returned %d: %s", rc, e.msg);
        rl_comm_abort(c); /* idempotent */
    } else {
        sleep_s(1.0);
        double t = rl_now();
        int rc = rl_comm_allreduce(c, buf, 1000, RL_F32, RL_SUM, &e);
        double dt = rl_now() - t;
        CHECK(cx, rc == RL_EPEER, "rank 1: allreduce after the peer aborted returned %d: %s",
              rc, rc ? e.msg : "ok");
        CHECK(cx, strstr(e.msg, "rank 0 (127.0.0.1:"), "rank 1: message names no peer: %s",
              e.msg);
        CHECK(cx, dt < 2.0, "rank 1 needed %.2f s to notice", dt);
    }
    rl_comm_destroy(c);
    return 0;
}

Test(comm_fault, abort_unblocks_a_waiting_rank, .timeout = 60) {
    for (int shm = 0; shm >= -1; shm--) {
        group g = {.world = 2, .timeout = 30, .shm = shm, .fn = child_abort, .limit_s = 20};
        shared *sh = run_group(&g);
        expect_all_ok(sh, 2, -1);
        munmap(sh, sizeof *sh);
    }
}

/* Ranks started with different world sizes: every rank fails, saying so. */
static int child_world_mismatch(tctx *cx) {
    const int *worlds = cx->arg;
    rl_comm *c = NULL;
    rl_err e;
    double t = rl_now();
    int rc = tc_init_as(cx, worlds[cx->rank], &c, &e);
    double dt = rl_now() - t;
    CHECK(cx, rc != 0, "init succeeded with world %d", worlds[cx->rank]);
    CHECK(cx, strstr(e.msg, "world size") && strstr(e.msg, "rank "), "unclear message: %s",
          e.msg);
    CHECK(cx, dt < 3.0, "took %.2f s to notice (timeout %.0f s)", dt, cx->timeout);
    snprintf(cx->res->msg, sizeof cx->res->msg, "%s", e.msg);
    return 0;
}

Test(comm_fault, world_size_mismatch, .timeout = 60) {
    static const int two[] = {2, 3}, three[] = {3, 2, 3};
    const int *cases[] = {two, three};
    int sizes[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        group g = {.world = sizes[k], .timeout = 10, .fn = child_world_mismatch,
                   .arg = cases[k], .limit_s = 20};
        shared *sh = run_group(&g);
        expect_all_ok(sh, sizes[k], -1);
        for (int r = 0; r < sizes[k]; r++) cr_log_info("rank %d: %s", r, sh->r[r].msg);
        munmap(sh, sizeof *sh);
    }
}

/* Ranks that issue different collectives get an error, not garbage. */
static int child_op_mismatch(tctx *cx) {
    rl_comm *c;
    if (tc_init(cx, &c)) return 1;
    float buf[5] = {1, 2, 3, 4, 5};
    rl_err e;
    int rc = cx->rank == 0 ? rl_comm_allreduce(c, buf, 5, RL_F32, RL_SUM, &e)
                           : rl_comm_broadcast(c, buf, 5, RL_F32, 0, &e);
    CHECK(cx, rc == RL_EINTERNAL, "rc %d: %s", rc, rc ? e.msg : "ok");
    CHECK(cx, strstr(e.msg, "collective mismatch") && strstr(e.msg, "allreduce") &&
                  strstr(e.msg, "broadcast") && strstr(e.msg, "rank "),
          "unclear message: %s", e.msg);
    rl_comm_destroy(c);
    return 0;
}

Test(comm_fault, different_collectives_are_detected, .timeout = 30) {
    for (int shm = 0; shm >= -1; shm--) {
        group g = {.world = 2, .timeout = 10, .shm = shm, .fn = child_op_mismatch,
                   .limit_s = 20};
        shared *sh = run_group(&g);
        expect_all_ok(sh, 2, -1);
        munmap(sh, sizeof *sh);
    }
}

/* ---- strangers and impostors during ring formation -------------------------------- */

/* A fake rank 1 beside a real rank 0 (world 2). As rank 0's left it
 * connects and says `out`; rank 0 must close that connection and go on
 * waiting, so its ring times out naming the refusal (a stranger cannot
 * fail the ring quickly; the real peer never came). As rank 0's right it
 * answers rank 0's hello with `reply`; rank 0 dialled the published
 * address, so it fails at once naming what it got. */
enum { SAY_HELLO, SAY_GARBAGE, SAY_V2, SAY_OTHER_ROUND, SAY_REJECT, SAY_NOTHING, SAY_FORGED,
       SAY_IMPOSTOR };
typedef struct fake_case {
    int out;   /* what the fake sends on its connection to rank 0 */
    int reply; /* how it answers rank 0's hello */
    bool fast; /* rank 0 must fail within 3 s (else: at its timeout) */
    bool rejected; /* the fake must get a REJECT on its own connection */
    const char *want[3]; /* substrings of rank 0's error */
} fake_case;

#define FAKE_SECRET "the job's secret"
#define FAKE_WRONG "not the job's secret"

static int wait_fd(int fd, short ev, double s) {
    struct pollfd p = {.fd = fd, .events = ev};
    return poll(&p, 1, (int)(s * 1000)) == 1;
}

/* Read one whole handshake frame (false: EOF, error or 5 s of silence). */
static bool read_frame(int fd, uint8_t in[RL_COMM_HELLO_BYTES]) {
    size_t got = 0;
    while (got < RL_COMM_HELLO_BYTES && wait_fd(fd, POLLIN, 5)) {
        ssize_t n = recv(fd, in + got, RL_COMM_HELLO_BYTES - got, 0);
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return got == RL_COMM_HELLO_BYTES;
}

static rl_comm_link fake_link(const char *prefix, const char *secret, uint32_t peer) {
    return (rl_comm_link){.secret = secret, .slen = secret ? strlen(secret) : 0,
                          .prefix = prefix, .world = 2, .rank = 1, .peer = peer};
}

/* What a forger without the secret sends after a challenge: a well-formed
 * PROOF with a mac under its own key. */
static void forge_proof(const rl_comm_link *l, const uint8_t cn[32], const uint8_t challenge[96],
                        uint8_t out[96]) {
    rl_comm_hello h = {.version = RL_COMM_HELLO_VERSION, .kind = RL_COMM_HELLO_PROOF,
                       .world = l->world, .rank = l->rank, .round = rl_comm_tcp_round(l->prefix)};
    memcpy(h.nonce, cn, 32);
    rl_comm_tcp_proof(l, false, l->peer, l->rank, cn, challenge + 32, h.mac);
    rl_comm_tcp_encode_hello(out, &h);
}

/* The fake as rank 0's left: `what` on a fresh connection to rank 0.
 * Returns the kind of rank 0's first answer, -1 for none. */
static int fake_connect(int what, const char *prefix, int port0) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port0),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (struct sockaddr *)&to, sizeof to) != 0) return close(s), -1;
    uint8_t out[RL_COMM_HELLO_BYTES], in[RL_COMM_HELLO_BYTES], cn[32] = {7};
    rl_comm_link l = fake_link(what == SAY_OTHER_ROUND ? "round/0/comm" : prefix,
                               what == SAY_FORGED ? FAKE_WRONG : FAKE_SECRET, 0);
    rl_comm_hs hs;
    rl_comm_tcp_hs_connect(&l, &hs, cn, out);
    size_t len = sizeof out;
    if (what == SAY_GARBAGE)
        len = (size_t)snprintf((char *)out, sizeof out, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    if (what == SAY_V2) rl_put_be16(out + 4, RL_COMM_HELLO_VERSION + 1);
    if (what == SAY_NOTHING) len = 0;
    if (len) (void)send(s, out, len, MSG_NOSIGNAL);
    int kind = -1;
    if (read_frame(s, in)) {
        kind = rl_get_be16(in + 6);
        /* a forger answers the challenge with a proof it cannot make */
        if (what == SAY_FORGED && kind == RL_COMM_HELLO_CHALLENGE) {
            forge_proof(&l, cn, in, out);
            (void)send(s, out, sizeof out, MSG_NOSIGNAL);
            if (read_frame(s, in)) kind = rl_get_be16(in + 6);
        }
    }
    /* linger until rank 0 gives up on us */
    while (wait_fd(s, POLLIN, 5) && recv(s, in, sizeof in, 0) > 0) {
    }
    close(s);
    return kind;
}

/* The fake as rank 0's right: answer rank 0's hello with `reply`. */
static void fake_answer(int reply, const char *prefix, int a) {
    uint8_t in[RL_COMM_HELLO_BYTES], out[RL_COMM_HELLO_BYTES], sn[32] = {9};
    if (!read_frame(a, in)) return;
    rl_comm_link l = fake_link(prefix, reply == SAY_IMPOSTOR ? FAKE_WRONG : FAKE_SECRET, 0);
    rl_comm_hs hs;
    rl_comm_tcp_hs_accept(&hs, sn);
    rl_err e;
    size_t ol = 0;
    if (reply == SAY_GARBAGE) {
        ol = (size_t)snprintf((char *)out, sizeof out, "HTTP/1.1 400 Bad Request\r\n\r\n");
    } else if (rl_comm_tcp_hs_step(&l, &hs, in, sizeof in, "rank 0", out, &ol, &e) != RL_HS_SEND) {
        return;
    } else if (reply == SAY_REJECT) {
        rl_put_be16(out + 6, RL_COMM_HELLO_REJECT);
        memset(out + 32, 0, 64);
    }
    (void)send(a, out, ol, MSG_NOSIGNAL);
    /* an honest answer goes on to accept rank 0's proof */
    if (reply == SAY_HELLO && read_frame(a, in) &&
        rl_comm_tcp_hs_step(&l, &hs, in, sizeof in, "rank 0", out, &ol, &e) == RL_HS_SEND_UP)
        (void)send(a, out, ol, MSG_NOSIGNAL);
}

static int child_fake(tctx *cx) {
    const fake_case *fc = cx->arg;
    rl_err e;
    if (cx->rank == 0) {
        rl_comm *c = NULL;
        double t = rl_now();
        int rc = tc_init(cx, &c);
        double dt = rl_now() - t;
        if (!rc) {
            rl_comm_destroy(c);
            FAILF(cx, "init accepted a broken peer");
        }
        /* tc_init put "init: <message>" into msg */
        for (int k = 0; k < 3 && fc->want[k]; k++)
            CHECK(cx, strstr(cx->res->msg, fc->want[k]), "message lacks \"%s\": %s", fc->want[k],
                  cx->res->msg);
        CHECK(cx, !strstr(cx->res->msg, FAKE_SECRET), "the secret is in: %s", cx->res->msg);
        if (fc->fast)
            CHECK(cx, dt < 3.0, "took %.2f s to refuse (timeout %.0f s)", dt, cx->timeout);
        else
            CHECK(cx, dt >= cx->timeout - 0.5, "gave up after %.2f s, before its timeout "
                  "(%.0f s): a stranger failed the ring", dt, cx->timeout);
        return 0;
    }
    /* the fake: listen, publish, then answer and connect like a rank would */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl))
        FAILF(cx, "fake: listen failed");
    char rec[64], key[200];
    snprintf(rec, sizeof rec, "127.0.0.1:%d 2", ntohs(sa.sin_port));
    snprintf(key, sizeof key, "%s/addr/1", cx->prefix);
    CHECK(cx, rl_store_set(cx->store, key, rec, strlen(rec), &e) == 0, "fake: %s", e.msg);
    void *val;
    size_t vlen;
    snprintf(key, sizeof key, "%s/addr/0", cx->prefix);
    CHECK(cx, rl_store_get(cx->store, key, 5, &val, &vlen, &e) == 0, "fake: %s", e.msg);
    int port0 = atoi(strrchr((char *)val, ':') + 1);
    free(val);
    int rc = 0;
    if (wait_fd(lfd, POLLIN, 5)) {
        int a = accept(lfd, NULL, NULL);
        fake_answer(fc->reply, cx->prefix, a);
        int kind = fake_connect(fc->out, cx->prefix, port0);
        if (fc->rejected && kind != RL_COMM_HELLO_REJECT)
            rc = failf(cx, "fake: rank 0 answered kind %d, expected a reject", kind);
        close(a);
    }
    close(lfd);
    return rc;
}

static void run_fake(const fake_case *fc) {
    /* secret in every rank's opts: tc_init_as passes cx->secret */
    group g = {.world = 2, .timeout = fc->fast ? 8 : 2.5, .fn = child_fake, .arg = fc,
               .limit_s = 25, .secret = FAKE_SECRET};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 2, -1);
    cr_log_info("rank 0: %s", sh->r[0].msg);
    munmap(sh, sizeof *sh);
}

Test(comm_hello_wire, garbage_instead_of_hello, .timeout = 30) {
    fake_case fc = {SAY_GARBAGE, SAY_HELLO, false, false,
                    {"timed out", "refused 1 other connection", "bad magic"}};
    run_fake(&fc);
}
Test(comm_hello_wire, other_protocol_version, .timeout = 30) {
    fake_case fc = {SAY_V2, SAY_HELLO, false, true,
                    {"timed out", "version 4", "speaks version 3"}};
    run_fake(&fc);
}
Test(comm_hello_wire, peer_of_another_round, .timeout = 30) {
    fake_case fc = {SAY_OTHER_ROUND, SAY_HELLO, false, true,
                    {"timed out", "another job or rendezvous round", "127.0.0.1:"}};
    run_fake(&fc);
}
Test(comm_hello_wire, forged_hello_without_the_secret, .timeout = 30) {
    fake_case fc = {SAY_FORGED, SAY_HELLO, false, true,
                    {"timed out", "did not prove the job's rendezvous secret", "127.0.0.1:"}};
    run_fake(&fc);
}
Test(comm_hello_wire, silent_connection, .timeout = 30) {
    fake_case fc = {SAY_NOTHING, SAY_HELLO, false, false,
                    {"timed out", "no handshake from rank 1", NULL}};
    run_fake(&fc);
}
Test(comm_hello_wire, garbage_answer_from_right_neighbour, .timeout = 30) {
    fake_case fc = {SAY_HELLO, SAY_GARBAGE, true, false,
                    {"bad magic", "rank 1 (127.0.0.1:", "rank 0"}};
    run_fake(&fc);
}
Test(comm_hello_wire, right_neighbour_rejects, .timeout = 30) {
    fake_case fc = {SAY_HELLO, SAY_REJECT, true, false,
                    {"rejected our hello", "rank 1 (127.0.0.1:", NULL}};
    run_fake(&fc);
}
Test(comm_hello_wire, impostor_at_the_right_neighbours_address, .timeout = 30) {
    fake_case fc = {SAY_HELLO, SAY_IMPOSTOR, true, false,
                    {"rank 1 (127.0.0.1:", "did not prove the job's rendezvous secret", NULL}};
    run_fake(&fc);
}

/* Junk, forged, idle and foreign-address connections on rank 0's port while
 * the ring forms leave the job unaffected: rank 2 of the group attacks,
 * ranks 0 and 1 form a ring of 2 once the attack is in place (more idle
 * connections than rank 0 has handshake slots, held open throughout) and
 * reduce correctly. */
static int child_attacked(tctx *cx) {
    rl_err e;
    if (cx->rank == 2) {
        char key[200];
        void *val;
        size_t vlen;
        snprintf(key, sizeof key, "%s/addr/0", cx->prefix);
        CHECK(cx, rl_store_get(cx->store, key, 10, &val, &vlen, &e) == 0, "attacker: %s", e.msg);
        int port0 = atoi(strrchr((char *)val, ':') + 1);
        free(val);
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port0),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int fds[20], nfd = 0;
        for (; nfd < 12; nfd++) { /* idle: connect and say nothing */
            fds[nfd] = socket(AF_INET, SOCK_STREAM, 0);
            CHECK(cx, connect(fds[nfd], (struct sockaddr *)&to, sizeof to) == 0, "connect");
        }
        /* a proper hello from another local address: refused unread */
        fds[nfd] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in from = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002)};
        if (bind(fds[nfd], (struct sockaddr *)&from, sizeof from) == 0 &&
            connect(fds[nfd], (struct sockaddr *)&to, sizeof to) == 0) {
            uint8_t out[RL_COMM_HELLO_BYTES], cn[32] = {1};
            rl_comm_link l = fake_link(cx->prefix, FAKE_SECRET, 0);
            rl_comm_hs hs;
            rl_comm_tcp_hs_connect(&l, &hs, cn, out);
            (void)send(fds[nfd], out, sizeof out, MSG_NOSIGNAL);
        }
        nfd++;
        atomic_store(&cx->res->ready, 1); /* rank 1 may come now */
        /* junk and a forger, while rank 1 forms the ring */
        (void)fake_connect(SAY_GARBAGE, cx->prefix, port0);
        (void)fake_connect(SAY_FORGED, cx->prefix, port0);
        for (double end = rl_now() + 20; rl_now() < end;) { /* hold until both are done */
            if (atomic_load(&cx->sh->r[0].ready) == 2 && atomic_load(&cx->sh->r[1].ready) == 2)
                break;
            sleep_s(0.01);
        }
        for (int i = 0; i < nfd; i++) close(fds[i]);
        return 0;
    }
    if (cx->rank == 1)
        for (double end = rl_now() + 10; !atomic_load(&cx->sh->r[2].ready) && rl_now() < end;)
            sleep_s(0.005);
    rl_comm *c = NULL;
    if (tc_init_as(cx, 2, &c, &e)) {
        atomic_store(&cx->res->ready, 2);
        FAILF(cx, "init under attack: %s", e.msg);
    }
    double v[64];
    for (int i = 0; i < 64; i++) v[i] = cx->rank + i;
    int rc = rl_comm_allreduce(c, v, 64, RL_F64, RL_SUM, &e);
    atomic_store(&cx->res->ready, 2);
    rl_comm_destroy(c);
    CHECK(cx, rc == 0, "allreduce under attack: %s", e.msg);
    for (int i = 0; i < 64; i++) CHECK(cx, v[i] == 1 + 2.0 * i, "v[%d] = %g", i, v[i]);
    return 0;
}

Test(comm_hello_wire, junk_forged_and_idle_connections_leave_the_ring_unaffected,
     .timeout = 40) {
    group g = {.world = 3, .timeout = 15, .fn = child_attacked, .limit_s = 30,
               .secret = FAKE_SECRET};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 3, -1);
    munmap(sh, sizeof *sh);
}

/* Ranks started with different secrets fail at once and neither message
 * holds a secret. The first to see a proof fail says why; the other may
 * instead see that rank leave (EOF or a reset, depending on timing). */
static int child_other_secret(tctx *cx) {
    if (cx->rank == 1) cx->secret = FAKE_WRONG;
    rl_comm *c = NULL;
    rl_err e;
    double t = rl_now();
    if (!tc_init_as(cx, 2, &c, &e)) {
        rl_comm_destroy(c);
        FAILF(cx, "a ring formed across different secrets");
    }
    CHECK(cx, rl_now() - t < cx->timeout - 1, "took the whole timeout: %s", e.msg);
    CHECK(cx, !strstr(e.msg, FAKE_SECRET) && !strstr(e.msg, FAKE_WRONG), "secret in: %s",
          e.msg);
    snprintf(cx->res->msg, sizeof cx->res->msg, "%s", e.msg);
    return 0;
}

Test(comm_hello_wire, ranks_with_different_secrets_fail_at_once, .timeout = 30) {
    group g = {.world = 2, .timeout = 8, .fn = child_other_secret, .limit_s = 20,
               .secret = FAKE_SECRET};
    shared *sh = run_group(&g);
    expect_all_ok(sh, 2, -1);
    cr_expect(strstr(sh->r[0].msg, "rendezvous secret") || strstr(sh->r[1].msg, "rendezvous secret"),
              "neither rank says why: %s | %s", sh->r[0].msg, sh->r[1].msg);
    munmap(sh, sizeof *sh);
}

/* ---- in-process: API, validation, world 1, hello parser ------------------------- */

Test(comm_api, dtype_sizes) {
    cr_expect_eq(rl_dtype_size(RL_F32), 4);
    cr_expect_eq(rl_dtype_size(RL_F64), 8);
    cr_expect_eq(rl_dtype_size(RL_BF16), 2);
    cr_expect_eq(rl_dtype_size(RL_I64), 8);
    cr_expect_eq(rl_dtype_size((rl_dtype)9), 0);
}

Test(comm_api, bad_options) {
    rl_comm *c = (rl_comm *)1;
    rl_err e;
    rl_comm_opts o = {.backend = "carrier-pigeon", .world = 1};
    cr_expect_eq(rl_comm_init(&o, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "carrier-pigeon"), "%s", e.msg);
    cr_expect_null(c);
    o = (rl_comm_opts){.backend = "tcp", .world = 0};
    cr_expect_eq(rl_comm_init(&o, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "world 0"), "%s", e.msg);
    o = (rl_comm_opts){.backend = "tcp", .world = 2, .rank = 2};
    cr_expect_eq(rl_comm_init(&o, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "rank 2"), "%s", e.msg);
    o = (rl_comm_opts){.backend = "tcp", .world = 2, .rank = 1, .prefix = "p"};
    cr_expect_eq(rl_comm_init(&o, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "store"), "%s", e.msg);
    o = (rl_comm_opts){.backend = "tcp", .world = 1, .timeout_s = NAN};
    cr_expect_eq(rl_comm_init(&o, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "timeout_s"), "%s", e.msg);
    cr_expect_eq(rl_comm_init(NULL, &c, &e), RL_EINPUT);
}

Test(comm_api, nccl_backend_availability) {
    rl_comm *c = NULL;
    rl_err e;
    rl_comm_opts o = {.backend = "nccl", .world = 1};
    int rc = rl_comm_init(&o, &c, &e);
#ifndef RL_CUDA
    cr_expect_eq(rc, RL_EINPUT);
    cr_expect(strstr(e.msg, "this build has no CUDA/NCCL"), "%s", e.msg);
#else
    /* A CUDA build: on a machine without a GPU init must fail cleanly. */
    if (rc == 0) rl_comm_destroy(c);
    else cr_log_info("nccl init without a usable GPU: %s", e.msg);
#endif
}

Test(comm_api, world1_is_local) {
    rl_comm *c;
    rl_err e;
    rl_comm_opts o = {.world = 1}; /* default backend tcp, no store needed */
    cr_assert_eq(rl_comm_init(&o, &c, &e), 0, "%s", e.msg);
    cr_expect_str_eq(rl_comm_backend(c), "tcp");
    cr_expect_eq(rl_comm_rank(c), 0);
    cr_expect_eq(rl_comm_world(c), 1);
    float x[7] = {1, 2, 3, 4, 5, 6, 7}, y[7] = {0};
    cr_expect_eq(rl_comm_allreduce(c, x, 7, RL_F32, RL_AVG, &e), 0);
    cr_expect_eq(x[6], 7.0f);
    cr_expect_eq(rl_comm_broadcast(c, x, 7, RL_F32, 0, &e), 0);
    cr_expect_eq(rl_comm_allgather(c, x, y, 7, RL_F32, &e), 0);
    cr_expect_arr_eq(x, y, sizeof x);
    memset(y, 0, sizeof y);
    cr_expect_eq(rl_comm_reduce_scatter(c, x, y, 7, RL_F32, RL_SUM, &e), 0);
    cr_expect_arr_eq(x, y, sizeof x);
    cr_expect_eq(rl_comm_allreduce(c, NULL, 0, RL_BF16, RL_SUM, &e), 0);
    cr_expect_eq(rl_comm_barrier(c, &e), 0);
    cr_expect_eq(rl_comm_wait(c, &e), 0);
    rl_comm_abort(c);
    cr_expect_eq(rl_comm_barrier(c, &e), RL_EABORT);
    cr_expect_eq(rl_comm_allreduce(c, x, 7, RL_F32, RL_SUM, &e), RL_EABORT);
    rl_comm_destroy(c);
}

/* The flight recorder: every op that reached the backend, numbered from 1,
 * oldest first, the last RL_COMM_RECORDS of them, each done with its
 * result; ops refused before the backend are not collectives and are not
 * numbered (the numbers must agree across ranks). */
Test(comm_api, the_flight_recorder_keeps_the_last_ops_in_order) {
    rl_comm *c;
    rl_err e;
    rl_comm_opts o = {.world = 1};
    cr_assert_eq(rl_comm_init(&o, &c, &e), 0, "%s", e.msg);
    rl_comm_record r[RL_COMM_RECORDS + 1];
    cr_expect_eq(rl_comm_records(c, r, RL_COMM_RECORDS), 0);
    float x[5] = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_comm_allreduce(c, x, 5, RL_F32, RL_SUM, &e), 0);
    cr_assert_eq(rl_comm_broadcast(c, x, 4, RL_F32, 0, &e), 0);
    cr_expect_eq(rl_comm_broadcast(c, x, 4, RL_F32, 3, &e), RL_EINPUT); /* refused: not a collective */
    cr_assert_eq(rl_comm_barrier(c, &e), 0);
    int n = rl_comm_records(c, r, RL_COMM_RECORDS);
    cr_assert_eq(n, 3);
    const char *ops[] = {"allreduce", "broadcast", "barrier"};
    size_t bytes[] = {20, 16, 0};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(r[i].seq, (uint64_t)i + 1);
        cr_expect_str_eq(r[i].op, ops[i]);
        cr_expect_eq(r[i].bytes, bytes[i]);
        cr_expect(r[i].t_issue >= t0 && r[i].t_done >= r[i].t_issue && r[i].rc == 0, "record %d", i);
    }
    for (int i = 0; i < 2 * RL_COMM_RECORDS; i++) cr_assert_eq(rl_comm_barrier(c, &e), 0);
    n = rl_comm_records(c, r, RL_COMM_RECORDS + 1);
    cr_expect_eq(n, RL_COMM_RECORDS);
    cr_expect_eq(r[0].seq, 3 + 2 * RL_COMM_RECORDS - RL_COMM_RECORDS + 1);
    cr_expect_eq(r[n - 1].seq, 3 + 2 * RL_COMM_RECORDS);
    cr_expect_eq(rl_comm_records(c, r, 2), 2);
    cr_expect_eq(r[1].seq, 3 + 2 * RL_COMM_RECORDS, "the newest come back when max is small");
    rl_comm_destroy(c);
}

Test(comm_api, argument_validation) {
    rl_comm *c;
    rl_err e;
    rl_comm_opts o = {.backend = "tcp", .world = 1};
    cr_assert_eq(rl_comm_init(&o, &c, &e), 0, "%s", e.msg);
    float x[4] = {0};
    cr_expect_eq(rl_comm_broadcast(c, x, 4, RL_F32, 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "root 1"), "%s", e.msg);
    cr_expect_eq(rl_comm_broadcast(c, x, 4, RL_F32, -1, &e), RL_EINPUT);
    cr_expect_eq(rl_comm_allreduce(c, NULL, 3, RL_F32, RL_SUM, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "NULL buffer"), "%s", e.msg);
    cr_expect_eq(rl_comm_allreduce(c, NULL, 0, RL_F32, RL_SUM, &e), 0);
    cr_expect_eq(rl_comm_allgather(c, NULL, NULL, 0, RL_F32, &e), 0);
    cr_expect_eq(rl_comm_allgather(c, x, NULL, 1, RL_F32, &e), RL_EINPUT);
    cr_expect_eq(rl_comm_allreduce(c, x, 4, RL_I64, RL_AVG, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "i64"), "%s", e.msg);
    cr_expect_eq(rl_comm_allreduce(c, x, 4, (rl_dtype)7, RL_SUM, &e), RL_EINPUT);
    cr_expect_eq(rl_comm_allreduce(c, x, 4, RL_F32, (rl_redop)5, &e), RL_EINPUT);
    cr_expect_eq(rl_comm_allreduce(c, x, SIZE_MAX / 2, RL_F32, RL_SUM, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "overflow"), "%s", e.msg);
    /* bad arguments do not kill the communicator */
    cr_expect_eq(rl_comm_allreduce(c, x, 4, RL_F32, RL_SUM, &e), 0);
    cr_expect_eq(rl_comm_allreduce(NULL, x, 4, RL_F32, RL_SUM, &e), RL_EINPUT);
    rl_comm_destroy(c);
    rl_comm_destroy(NULL);
}

Test(comm_api, bf16_arithmetic) {
    cr_expect_eq(rl_comm_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(rl_comm_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0) */
    cr_expect_eq(rl_comm_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_expect_eq(rl_comm_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    uint16_t nan = rl_comm_f32_to_bf16(NAN);
    cr_expect(isnan(rl_comm_bf16_to_f32(nan)));
    uint16_t a[3] = {0x3f80, 0x4000, 0xbf80}, b[3] = {0x3f80, 0x4000, 0x3f80}; /* 1,2,-1 */
    rl_comm_reduce_sum(a, a, b, 3, RL_BF16);
    cr_expect_eq(a[0], 0x4000); /* 2 */
    cr_expect_eq(a[1], 0x4080); /* 4 */
    cr_expect_eq(a[2], 0x0000); /* 0 */
    int64_t big[1] = {INT64_MAX}, one[1] = {1};
    rl_comm_reduce_sum(big, big, one, 1, RL_I64);
    cr_expect_eq(big[0], INT64_MIN); /* wraps, no UB */
}

static void hello_bytes(uint8_t *b, const rl_comm_hello *h) { rl_comm_tcp_encode_hello(b, h); }

Test(comm_hello, parse_roundtrip_and_errors) {
    rl_comm_hello h = {.version = RL_COMM_HELLO_VERSION, .kind = RL_COMM_HELLO_CHALLENGE,
                       .world = 4, .rank = 3, .round = 0x1122334455667788ull, .nonce = {1, 2},
                       .mac = {3}},
                  g;
    uint8_t b[RL_COMM_HELLO_BYTES + 1];
    rl_err e;
    hello_bytes(b, &h);
    cr_assert_eq(rl_comm_tcp_parse_hello(b, RL_COMM_HELLO_BYTES, "p:1", &g, &e), 0, "%s", e.msg);
    cr_expect(g.kind == h.kind && g.world == 4 && g.rank == 3 && g.round == h.round &&
              !memcmp(g.nonce, h.nonce, 32) && !memcmp(g.mac, h.mac, 32));
    cr_expect_eq(rl_comm_tcp_parse_hello(b, 3, "p:1", &g, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "truncated") && strstr(e.msg, "p:1"), "%s", e.msg);
    cr_expect_eq(rl_comm_tcp_parse_hello(b, RL_COMM_HELLO_BYTES - 1, "p:1", &g, &e), RL_EINPUT);
    cr_expect_eq(rl_comm_tcp_parse_hello(b, RL_COMM_HELLO_BYTES + 1, "p:1", &g, &e), RL_EINPUT);
    b[0] ^= 1;
    cr_expect_eq(rl_comm_tcp_parse_hello(b, 4, "p:1", &g, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "bad magic"), "%s", e.msg);
    b[0] ^= 1;
    b[5] = 9;
    cr_expect_eq(rl_comm_tcp_parse_hello(b, 6, "p:1", &g, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "version 9"), "%s", e.msg);
    struct {
        int off;
        uint8_t val;
        const char *want;
    } bad[] = {{7, 5, "kind"}, {11, 0, "world 0"}, {15, 4, "rank 4"}, {24, 0x55, "byte-order"},
               {31, 1, "reserved"}, {7, RL_COMM_HELLO_ACCEPT, "accept carries a nonce"},
               {7, RL_COMM_HELLO, "hello carries a mac"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        hello_bytes(b, &h);
        if (bad[k].off == 11) memset(b + 8, 0, 4);
        b[bad[k].off] = bad[k].val;
        cr_expect_eq(rl_comm_tcp_parse_hello(b, RL_COMM_HELLO_BYTES, "p:1", &g, &e), RL_EINPUT,
                     "case %zu", k);
        cr_expect(strstr(e.msg, bad[k].want), "case %zu: %s", k, e.msg);
    }
    cr_expect_eq(rl_comm_tcp_parse_hello(NULL, 0, NULL, &g, &e), RL_EINPUT);
}

Test(comm_hello, check_fields) {
    rl_comm_hello h = {.version = RL_COMM_HELLO_VERSION, .kind = 0, .world = 4, .rank = 1, .round = 42};
    rl_err e;
    cr_expect_eq(rl_comm_tcp_check_hello(&h, 4, 1, 42, "x:1", &e), 0);
    cr_expect_eq(rl_comm_tcp_check_hello(&h, 4, -1, 42, "x:1", &e), 0);
    cr_expect_eq(rl_comm_tcp_check_hello(&h, 4, 2, 42, "x:1", &e), RL_EPEER);
    cr_expect(strstr(e.msg, "says it is rank 1") && strstr(e.msg, "expected rank 2"), "%s", e.msg);
    cr_expect_eq(rl_comm_tcp_check_hello(&h, 3, 1, 42, "x:1", &e), RL_EPEER);
    cr_expect(strstr(e.msg, "world size 4") && strstr(e.msg, "x:1"), "%s", e.msg);
    cr_expect_eq(rl_comm_tcp_check_hello(&h, 4, 1, 43, "x:1", &e), RL_EPEER);
    cr_expect(strstr(e.msg, "another job or rendezvous round"), "%s", e.msg);
    cr_expect_neq(rl_comm_tcp_round("round/1/comm"), rl_comm_tcp_round("round/2/comm"));
}

/* Two ends of a link run against each other in memory: C is rank 2
 * connecting to its right neighbour A, rank 3, of a world of 4. */
typedef struct hs_run {
    rl_hs_action last_a, last_c;
    int frames;
    char why[1100];
} hs_run;

static hs_run run_handshake(const char *secret_a, const char *secret_c, const char *prefix_c,
                            uint32_t c_says) {
    rl_comm_link a = {.secret = secret_a, .slen = strlen(secret_a), .prefix = "round/7/comm",
                      .world = 4, .rank = 3, .peer = 2},
                 c = {.secret = secret_c, .slen = strlen(secret_c), .prefix = prefix_c,
                      .world = 4, .rank = c_says, .peer = 3};
    uint8_t cn[32], sn[32], buf[RL_COMM_HELLO_BYTES], out[RL_COMM_HELLO_BYTES];
    memset(cn, 0xc1, 32), memset(sn, 0x5e, 32);
    rl_comm_hs ha, hc;
    rl_comm_tcp_hs_accept(&ha, sn);
    rl_comm_tcp_hs_connect(&c, &hc, cn, buf);
    hs_run r = {.last_a = RL_HS_SEND, .last_c = RL_HS_SEND};
    rl_err e = {0};
    size_t ol;
    for (int turn = 0; turn < 6; turn++) {
        bool to_a = turn % 2 == 0;
        rl_hs_action act = to_a ? rl_comm_tcp_hs_step(&a, &ha, buf, sizeof buf, "C", out, &ol, &e)
                                : rl_comm_tcp_hs_step(&c, &hc, buf, sizeof buf, "A", out, &ol, &e);
        *(to_a ? &r.last_a : &r.last_c) = act;
        r.frames++;
        if (act == RL_HS_REFUSE) {
            snprintf(r.why, sizeof r.why, "%s", e.msg);
            /* the other end still reads the REJECT, if one was sent */
            if (ol) {
                rl_hs_action o = to_a
                    ? rl_comm_tcp_hs_step(&c, &hc, out, ol, "A", buf, &ol, &e)
                    : rl_comm_tcp_hs_step(&a, &ha, out, ol, "C", buf, &ol, &e);
                *(to_a ? &r.last_c : &r.last_a) = o;
                snprintf(r.why + strlen(r.why), sizeof r.why - strlen(r.why), " | %s", e.msg);
            }
            break;
        }
        if (act == RL_HS_UP) break;
        memcpy(buf, out, sizeof buf);
    }
    return r;
}

Test(comm_hello, handshake_proves_the_secret_both_ways) {
    hs_run r = run_handshake("s3cret", "s3cret", "round/7/comm", 2);
    cr_expect_eq(r.last_a, RL_HS_SEND_UP, "%s", r.why);
    cr_expect_eq(r.last_c, RL_HS_UP, "%s", r.why);
    cr_expect_eq(r.frames, 4);
    /* different secrets: C finds A's proof wrong first, and stops */
    r = run_handshake("s3cret", "guess", "round/7/comm", 2);
    cr_expect(r.last_c == RL_HS_REFUSE && r.frames == 2, "%s", r.why);
    cr_expect(strstr(r.why, "A did not prove the job's rendezvous secret") &&
              !strstr(r.why, "s3cret") && !strstr(r.why, "guess"), "%s", r.why);
    /* another round, or a rank that is not A's left: rejected at the hello */
    r = run_handshake("s3cret", "s3cret", "round/6/comm", 2);
    cr_expect(r.last_a == RL_HS_REFUSE && r.frames == 1 &&
              strstr(r.why, "another job or rendezvous round"), "%s", r.why);
    r = run_handshake("s3cret", "s3cret", "round/7/comm", 1);
    cr_expect(r.last_a == RL_HS_REFUSE && strstr(r.why, "says it is rank 1"), "%s", r.why);
}

Test(comm_hello, an_impostor_or_a_replayed_proof_is_refused) {
    rl_comm_link a = {.secret = "k", .slen = 1, .prefix = "p", .world = 2, .rank = 1, .peer = 0},
                 c = {.secret = "k", .slen = 1, .prefix = "p", .world = 2, .rank = 0, .peer = 1},
                 liar = a;
    liar.secret = "x";
    uint8_t cn[32] = {1}, sn1[32] = {2}, sn2[32] = {3}, hello[96], ch[96], proof[96], out[96],
        scratch[96];
    rl_comm_hs hc, ha;
    rl_err e;
    size_t ol;
    /* an impostor at A's address answers with a challenge it cannot prove */
    rl_comm_tcp_hs_connect(&c, &hc, cn, hello);
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_assert_eq(rl_comm_tcp_hs_step(&liar, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    cr_expect_eq(rl_comm_tcp_hs_step(&c, &hc, ch, 96, "rank 1 (h:1)", out, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "rank 1 (h:1) did not prove"), "%s", e.msg);
    /* a forger sends a proof under its own key: A refuses, with a REJECT
     * that tells an honest peer why */
    rl_comm_link forger = c;
    forger.secret = "x";
    rl_comm_tcp_hs_connect(&forger, &hc, cn, hello);
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_assert_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    forge_proof(&forger, cn, ch, proof);
    cr_expect_eq(rl_comm_tcp_hs_step(&a, &ha, proof, 96, "C", out, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "C did not prove the job's rendezvous secret"), "%s", e.msg);
    cr_expect(ol == 96 && rl_get_be16(out + 6) == RL_COMM_HELLO_REJECT);
    rl_comm_tcp_hs_connect(&c, &hc, cn, hello);
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_assert_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    cr_assert_eq(rl_comm_tcp_hs_step(&c, &hc, ch, 96, "A", proof, &ol, &e), RL_HS_SEND);
    cr_expect_eq(rl_comm_tcp_hs_step(&c, &hc, out, 96, "A", scratch, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "A refused our proof"), "%s", e.msg);
    /* a proof recorded from one handshake does not pass another (new nonce) */
    rl_comm_tcp_hs_connect(&c, &hc, cn, hello);
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_assert_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    cr_assert_eq(rl_comm_tcp_hs_step(&c, &hc, ch, 96, "A", proof, &ol, &e), RL_HS_SEND);
    rl_comm_tcp_hs_accept(&ha, sn2);
    cr_assert_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    cr_expect_eq(rl_comm_tcp_hs_step(&a, &ha, proof, 96, "C", out, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "did not prove"), "%s", e.msg);
    /* frames out of order: a proof first, a hello twice, a frame after the end */
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_expect_eq(rl_comm_tcp_hs_step(&a, &ha, proof, 96, "C", out, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "instead of a hello"), "%s", e.msg);
    rl_comm_tcp_hs_accept(&ha, sn1);
    cr_assert_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", ch, &ol, &e), RL_HS_SEND);
    cr_expect_eq(rl_comm_tcp_hs_step(&a, &ha, hello, 96, "C", out, &ol, &e), RL_HS_REFUSE);
    cr_expect(strstr(e.msg, "instead of its proof"), "%s", e.msg);
}

Test(comm_hello, address_records) {
    char host[64];
    int port, world;
    rl_err e;
    cr_assert_eq(rl_comm_tcp_parse_record("10.0.0.7:4242 8", "k", host, sizeof host, &port,
                                          &world, &e), 0, "%s", e.msg);
    cr_expect_str_eq(host, "10.0.0.7");
    cr_expect_eq(port, 4242);
    cr_expect_eq(world, 8);
    cr_assert_eq(rl_comm_tcp_parse_record("[fd00::1]:80 2", "k", host, sizeof host, &port,
                                          &world, &e), 0, "%s", e.msg);
    cr_expect_str_eq(host, "fd00::1");
    const char *bad[] = {"", "host:1", "host 2", ":1 2", "h:0 2", "h:70000 2", "h:1 0",
                         "h:1 x", "h:x 2", "[]:1 2", "a b:1 2", "h\n:1 2"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cr_expect_eq(rl_comm_tcp_parse_record(bad[k], "round/1/addr/3", host, sizeof host,
                                              &port, &world, &e), RL_EINPUT, "\"%s\"", bad[k]);
        cr_expect(strstr(e.msg, "round/1/addr/3"), "%s", e.msg);
    }
}
