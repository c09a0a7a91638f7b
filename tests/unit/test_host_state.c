/* train.offload's host state (pkg/train/host_state.c): the private
 * mapping, a node's ranks sharing one object in /dev/shm, the slices they
 * update and the progress counters, and the private copy back. Two
 * threads stand for two ranks of one host, through a seam whose broadcast
 * and average meet at a barrier (the real seam is DDP's over a comm). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
#include <sys/mman.h>

#include "train/host_state.h"

#define RANKS 2
#define N 1000 /* parameters: regions of 301, 399 and 300 */

typedef struct seam {
    pthread_barrier_t bar;
    unsigned char buf[4096];
    double sum[RANKS];
    const char *refuse_host; /* rank 1's answer when set: "elsewhere" */
} seam;

typedef struct rank_ctx {
    seam *s;
    int rank;
} rank_ctx;

static int bcast(void *ctx, int root, void *buf, size_t bytes, rl_err *e) {
    (void)e;
    rank_ctx *r = ctx;
    if (r->rank == root) memcpy(r->s->buf, buf, bytes);
    pthread_barrier_wait(&r->s->bar);
    if (r->rank != root) memcpy(buf, r->s->buf, bytes);
    /* rank 1 on another host: its copy of the offer names another */
    if (r->rank != root && r->s->refuse_host && bytes > 200) strcpy((char *)buf + 88, r->s->refuse_host);
    pthread_barrier_wait(&r->s->bar);
    return RL_OK;
}

static int avg(void *ctx, double *v, int n, rl_err *e) {
    (void)e, (void)n;
    rank_ctx *r = ctx;
    r->s->sum[r->rank] = v[0];
    pthread_barrier_wait(&r->s->bar);
    double t = 0;
    for (int k = 0; k < RANKS; k++) t += r->s->sum[k];
    pthread_barrier_wait(&r->s->bar);
    v[0] = t / RANKS;
    return RL_OK;
}

typedef struct run {
    rank_ctx ctx;
    rl_host_state st;
    bool shared;
    char why[160];
    int rc;
    size_t a[3], b[3]; /* slices of the regions */
} run;

static const size_t reg[4] = {0, 301, 700, N};

/* this process's state objects still named in /dev/shm */
static int left_in_dev_shm(void) {
    char pre[64];
    snprintf(pre, sizeof pre, "rl-comm-%d-state-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += !strncmp(de->d_name, pre, strlen(pre));
    if (d) closedir(d);
    return n;
}

static void *rank_main(void *arg) {
    run *r = arg;
    rl_err e = {0};
    rl_train_dist dist = {.rank = r->ctx.rank, .world = RANKS, .ctx = &r->ctx, .broadcast = bcast, .average = avg};
    for (size_t i = 0; i < N; i++) r->st.params[i] = (float)i; /* equal on both ranks, as after the resume */
    r->rc = rl_host_state_share(&r->st, &dist, &r->shared, r->why, sizeof r->why, &e);
    if (r->rc || !r->shared) return NULL;
    /* one step: each rank writes its slice of each region and publishes it */
    for (int k = 0; k < 3; k++) {
        rl_host_slice(&r->st, reg[k], reg[k + 1], &r->a[k], &r->b[k]);
        for (size_t i = r->a[k]; i < r->b[k]; i++) r->st.params[i] = -(float)i, r->st.opt[i] = (float)(r->ctx.rank + 1);
        rl_host_state_publish(&r->st, k);
    }
    return NULL;
}

static void two_ranks(seam *s, run r[RANKS]) {
    pthread_barrier_init(&s->bar, NULL, RANKS);
    pthread_t t[RANKS];
    for (int k = 0; k < RANKS; k++) {
        rl_err e = {0};
        r[k].ctx = (rank_ctx){.s = s, .rank = k};
        cr_assert_eq(rl_host_state_alloc(&r[k].st, N, 3, true, &e), RL_OK, "%s", e.msg);
        pthread_create(&t[k], NULL, rank_main, &r[k]);
    }
    for (int k = 0; k < RANKS; k++) pthread_join(t[k], NULL);
    pthread_barrier_destroy(&s->bar);
}

Test(host_state, private_state_is_zeroed_and_bf16_page_aligned) {
    rl_host_state st;
    rl_err e = {0};
    cr_assert_eq(rl_host_state_alloc(&st, N, 3, true, &e), RL_OK);
    cr_expect(!rl_host_state_shared(&st));
    cr_expect_eq((uintptr_t)st.bf16 % 4096, 0);
    cr_expect(st.opt == st.params + N && (char *)st.bf16 >= (char *)(st.opt + 2 * N));
    size_t zero = 0;
    for (size_t i = 0; i < 3 * N; i++) zero += st.params[i] == 0;
    cr_expect_eq(zero, 3 * N);
    size_t a, b;
    rl_host_slice(&st, 300, 700, &a, &b);
    cr_expect(a == 300 && b == 700, "alone: the whole region");
    cr_expect(rl_host_state_ready(&st, 2, 99), "alone: always ready");
    rl_host_state_free(&st);
}

/* Both ranks map one object: what one writes the other reads, the slices
 * are a reduce-scatter's blocks of each region (len / 2 each, an odd
 * length's last element rank 1's), a region is ready once both
 * published it, and unsharing leaves each rank a private copy of it. */
Test(host_state, two_ranks_share_one_state_and_split_it) {
    seam s = {0};
    run r[RANKS] = {0};
    two_ranks(&s, r);
    for (int k = 0; k < RANKS; k++) cr_assert(r[k].rc == RL_OK && r[k].shared, "rank %d: %s", k, r[k].why);
    cr_expect_eq(left_in_dev_shm(), 0, "the object's name is gone once both mapped it");
    for (int k = 0; k < 3; k++) {
        cr_expect(r[0].a[k] == reg[k] && r[0].b[k] == r[1].a[k] && r[1].b[k] == reg[k + 1], "region %d covered once", k);
        size_t blk = (reg[k + 1] - reg[k]) / 2;
        cr_expect(r[0].b[k] == reg[k] + blk && r[1].a[k] == reg[k] + blk, "region %d: the cut at %zu, not %zu", k,
                  r[0].b[k], reg[k] + blk);
        cr_expect(rl_host_state_ready(&r[0].st, k, 1) && !rl_host_state_ready(&r[0].st, k, 2),
                  "region %d: both halves of step 1 in, step 2 not", k);
    }
    size_t same = 0;
    for (size_t i = 0; i < N; i++)
        same += r[0].st.params[i] == -(float)i && r[1].st.params[i] == -(float)i &&
                r[0].st.opt[i] == r[1].st.opt[i] && r[0].st.opt[i] == (i < r[0].b[0] || (i >= 301 && i < r[0].b[1]) ||
                                                                     (i >= 700 && i < r[0].b[2]) ? 1.0f : 2.0f);
    cr_expect_eq(same, N, "each rank sees every slice, each written by its owner");
    /* a private copy each: writes no longer cross */
    rl_err e = {0};
    for (int k = 0; k < RANKS; k++) cr_assert_eq(rl_host_state_unshare(&r[k].st, &e), RL_OK, "%s", e.msg);
    r[0].st.params[5] = 42;
    cr_expect(r[1].st.params[5] == -5.0f && !rl_host_state_shared(&r[1].st));
    size_t a, b;
    rl_host_slice(&r[1].st, 300, 700, &a, &b);
    cr_expect(a == 300 && b == 700);
    for (int k = 0; k < RANKS; k++) rl_host_state_free(&r[k].st);
}

/* ---- two processes: the deployment's shape (one per GPU of a pod) ---- */
/* the seam of two processes over a socketpair: root writes, the other reads */
static int fd_io(int fd, void *buf, size_t n, bool out) {
    for (size_t at = 0; at < n;) {
        ssize_t k = out ? write(fd, (char *)buf + at, n - at) : read(fd, (char *)buf + at, n - at);
        if (k <= 0) return -1;
        at += (size_t)k;
    }
    return 0;
}
typedef struct { int fd, rank; } proc_ctx;
static int p_bcast(void *ctx, int root, void *buf, size_t bytes, rl_err *e) {
    proc_ctx *p = ctx;
    return fd_io(p->fd, buf, bytes, p->rank == root) ? rl_errf(e, RL_EIO, "seam") : RL_OK;
}
static int p_avg(void *ctx, double *v, int n, rl_err *e) {
    proc_ctx *p = ctx;
    double other[8];
    if (n > 8 || fd_io(p->fd, v, (size_t)n * sizeof *v, true) || fd_io(p->fd, other, (size_t)n * sizeof *v, false))
        return rl_errf(e, RL_EIO, "seam");
    for (int i = 0; i < n; i++) v[i] = (v[i] + other[i]) / 2;
    return RL_OK;
}

/* one process's part: share, write its slices, wait (bounded) for the
 * other's, check every element; 0 when all held */
static int proc_rank(int fd, int rank) {
    rl_host_state st;
    rl_err e = {0};
    bool shared;
    char why[160];
    proc_ctx ctx = {.fd = fd, .rank = rank};
    rl_train_dist dist = {.rank = rank, .world = 2, .ctx = &ctx, .broadcast = p_bcast, .average = p_avg};
    if (rl_host_state_alloc(&st, N, 3, true, &e)) return 10;
    for (size_t i = 0; i < N; i++) st.params[i] = (float)i;
    if (rl_host_state_share(&st, &dist, &shared, why, sizeof why, &e) || !shared) return 11;
    for (int k = 0; k < 3; k++) {
        size_t a, b;
        rl_host_slice(&st, reg[k], reg[k + 1], &a, &b);
        for (size_t i = a; i < b; i++) st.params[i] = -(float)i, st.bf16[i] = (uint16_t)(rank + 1);
        rl_host_state_publish(&st, k);
    }
    for (int k = 0; k < 3; k++)
        for (int spins = 0; !rl_host_state_ready(&st, k, 1); spins++) {
            if (spins > 20000) return 12; /* 20 s */
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
    size_t ok = 0, mine = 0;
    for (size_t i = 0; i < N; i++) ok += st.params[i] == -(float)i, mine += st.bf16[i] == (uint16_t)(rank + 1);
    rl_host_state_free(&st);
    return ok == N && mine > N / 4 && mine < 3 * N / 4 ? 0 : 13;
}

/* Two processes, as the trainers of a pod: what each writes into its
 * slices the other reads through the object, each owns about half, and
 * the counters carry "done" across the processes. */
Test(host_state, two_processes_share_one_state) {
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(proc_rank(sv[1], 1));
    }
    close(sv[1]);
    int mine = proc_rank(sv[0], 0), st = 0;
    close(sv[0]);
    waitpid(pid, &st, 0);
    cr_expect_eq(mine, 0, "rank 0 (the parent): %d", mine);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 (the child): status %d", st);
    cr_expect_eq(left_in_dev_shm(), 0);
}

/* A rank on another host (its identity differs from the offer's) refuses:
 * nobody shares, every rank keeps its own state, nothing is left in
 * /dev/shm. */
Test(host_state, ranks_on_two_hosts_keep_a_copy_each) {
    seam s = {.refuse_host = "another-boot-id/another-host"};
    run r[RANKS] = {0};
    two_ranks(&s, r);
    for (int k = 0; k < RANKS; k++) {
        cr_expect(r[k].rc == RL_OK && !r[k].shared && !rl_host_state_shared(&r[k].st), "rank %d", k);
        cr_expect_eq(r[k].st.params[7], 7.0f, "rank %d's own state unchanged", k);
    }
    cr_expect(strstr(r[1].why, "more than one host"), "rank 1: %s", r[1].why);
    cr_expect(r[0].why[0], "rank 0 says why too");
    cr_expect_eq(left_in_dev_shm(), 0, "rank 0's offer removed");
    r[0].st.params[7] = 1;
    cr_expect_eq(r[1].st.params[7], 7.0f, "not shared");
    for (int k = 0; k < RANKS; k++) rl_host_state_free(&r[k].st);
}
