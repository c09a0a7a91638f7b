/* train.offload's host state, private or shared by a node's ranks (host_state.h).
 *
 * Why one mapping swapped in place rather than pointers handed around:
 * the device seam's params and opt, the trainer's views of them and the
 * model's host weights all point into this state from the start; a
 * shared object mapped with MAP_FIXED over the private pages (and a
 * private copy moved back with mremap) changes what is behind those
 * addresses and nothing else. */
#include "host_state.h" /* _GNU_SOURCE from the build: mremap */

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HS_MAGIC 0x726c2d7374617465ull /* "rl-state" */
_Static_assert(3 * sizeof(float) + sizeof(uint16_t) == RL_OFFLOAD_SHARED_BYTES, "the layout below is the accounting's");

typedef struct hs_hdr {
    uint64_t magic, cookie, len;
    int32_t world, nreg;
    _Atomic uint64_t done[]; /* per region: slices published since the share */
} hs_hdr;

/* rank 0's offer, broadcast (a multiple of 4 bytes) */
typedef struct hs_offer {
    uint32_t ok, pad;
    uint64_t cookie, len;
    char name[64];
    char host[136];
} hs_offer;

static size_t page_round(size_t b) {
    long ps = sysconf(_SC_PAGESIZE);
    size_t p = ps > 0 ? (size_t)ps : 4096;
    return (b + p - 1) / p * p;
}

static hs_hdr *hdr(const rl_host_state *s) { return (hs_hdr *)s->base; }

static void place(rl_host_state *s, size_t hdr_bytes, bool moments) {
    s->params = (float *)(s->base + hdr_bytes);
    s->opt = moments ? s->params + s->n : NULL;
    s->bf16 = (uint16_t *)(s->base + s->bf16_off);
}

int rl_host_state_alloc(rl_host_state *s, size_t n, int nreg, bool moments, rl_err *e) {
    memset(s, 0, sizeof *s);
    size_t h = page_round(sizeof(hs_hdr) + (size_t)nreg * sizeof(uint64_t));
    if (n > (SIZE_MAX - 2 * h) / 16) return rl_errf(e, RL_ENOMEM, "train.offload: %zu parameters' host state", n);
    s->n = n, s->nreg = nreg, s->rank = 0, s->world = 1;
    s->bf16_off = h + page_round((moments ? 3 : 1) * n * sizeof(float));
    s->len = s->bf16_off + page_round(n * sizeof(uint16_t));
    void *m = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        size_t len = s->len;
        memset(s, 0, sizeof *s);
        return rl_errf(e, RL_ENOMEM, "train.offload: %zu MiB of host memory for the master weights, %sbf16 "
                       "weights: %s", len >> 20, moments ? "moments and " : "", strerror(errno));
    }
    s->base = m;
    place(s, h, moments);
    return RL_OK;
}

void rl_host_state_free(rl_host_state *s) {
    if (s->base) munmap(s->base, s->len);
    memset(s, 0, sizeof *s);
}

/* rank 0: a new object holding this state, its counters at zero; *why on failure */
static int offer_make(rl_host_state *s, int world, hs_offer *o, char *why, size_t whyn) {
    o->cookie = rl_hash64(((uint64_t)getpid() << 32) ^ (uint64_t)(rl_now() * 1e9) ^ (uint64_t)(uintptr_t)s) | 1;
    snprintf(o->name, sizeof o->name, "/rl-comm-%d-state-%016llx", (int)getpid(), (unsigned long long)o->cookie);
    int fd = shm_open(o->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return snprintf(why, whyn, "shm_open in /dev/shm: %s", strerror(errno)), -1;
    /* the pages reserved now: a small /dev/shm fails here, not with SIGBUS mid-step */
    int err = posix_fallocate(fd, 0, (off_t)s->len);
    void *m = err ? MAP_FAILED : mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(why, whyn, "%zu MiB in /dev/shm (the TrainingJob's spec.shmSize): %s", s->len >> 20,
                 strerror(err ? err : errno));
        close(fd), shm_unlink(o->name);
        return -1;
    }
    memcpy(m, s->base, s->len);
    hs_hdr *h = m;
    h->magic = HS_MAGIC, h->cookie = o->cookie, h->len = s->len, h->world = world, h->nreg = s->nreg;
    for (int k = 0; k < s->nreg; k++) atomic_store(&h->done[k], 0);
    munmap(m, s->len);
    o->ok = 1, o->len = s->len;
    return fd;
}

/* another rank: rank 0's object, checked to be exactly what it offered */
static int offer_take(const rl_host_state *s, const hs_offer *o, const char *me, char *why, size_t whyn) {
    if (!o->ok) return snprintf(why, whyn, "rank 0 could not offer it"), -1;
    if (!me[0] || strncmp(o->host, me, sizeof o->host)) return snprintf(why, whyn, "the ranks are on more than one host"), -1;
    char name[sizeof o->name + 1] = "";
    memcpy(name, o->name, sizeof o->name);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return snprintf(why, whyn, "rank 0's object: %s (another /dev/shm)", strerror(errno)), -1;
    struct stat st;
    hs_hdr h;
    if (fstat(fd, &st) || (uint64_t)st.st_size != o->len || o->len != s->len ||
        pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != HS_MAGIC || h.cookie != o->cookie) {
        close(fd);
        return snprintf(why, whyn, "rank 0's object is not the one it offered"), -1;
    }
    return fd;
}

int rl_host_state_share(rl_host_state *s, const rl_train_dist *dist, bool *shared, char *why, size_t whyn,
                        rl_err *e) {
    *shared = false;
    if (dist->world < 2) return snprintf(why, whyn, "one rank"), RL_OK;
    if (rl_host_state_shared(s)) return rl_errf(e, RL_EINTERNAL, "train.offload: the host state is shared already");
    why[0] = '\0';
    char me[sizeof ((hs_offer *)0)->host] = "";
    rl_host_identity(me, sizeof me);
    hs_offer o = {0};
    int fd = -1;
    if (dist->rank == 0) {
        memcpy(o.host, me, sizeof o.host);
        fd = me[0] ? offer_make(s, dist->world, &o, why, whyn) : (snprintf(why, whyn, "this host's identity is unknown"), -1);
    }
    int rc = dist->broadcast(dist->ctx, 0, &o, sizeof o, e);
    if (!rc && dist->rank != 0) fd = offer_take(s, &o, me, why, whyn);
    double all = fd >= 0;
    if (!rc) rc = dist->average(dist->ctx, &all, 1, e);
    bool yes = !rc && all > 1 - 0.5 / dist->world;
    if (yes && mmap(s->base, s->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
        rc = rl_errf(e, RL_ENOMEM, "train.offload: mapping the node's shared host state: %s", strerror(errno));
    if (yes && !rc) { /* every rank mapped it: the name can go */
        double v = 1;
        rc = dist->average(dist->ctx, &v, 1, e);
    }
    if (fd >= 0) close(fd);
    if (dist->rank == 0 && o.ok) shm_unlink(o.name);
    if (rc || !yes) {
        if (!rc && !why[0]) snprintf(why, whyn, "a rank could not map it");
        return rc;
    }
    s->rank = dist->rank, s->world = dist->world;
    *shared = true;
    return RL_OK;
}

int rl_host_state_unshare(rl_host_state *s, rl_err *e) {
    if (!rl_host_state_shared(s)) return RL_OK;
    void *m = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return rl_errf(e, RL_ENOMEM, "train.offload: %zu MiB for a private copy of the host state: %s", s->len >> 20,
                       strerror(errno));
    memcpy(m, s->base, s->len);
    if (mremap(m, s->len, s->len, MREMAP_MAYMOVE | MREMAP_FIXED, s->base) == MAP_FAILED) {
        int err = errno;
        munmap(m, s->len);
        return rl_errf(e, RL_ENOMEM, "train.offload: moving the host state's private copy in place: %s", strerror(err));
    }
    s->rank = 0, s->world = 1;
    return RL_OK;
}

void rl_host_slice(const rl_host_state *s, size_t lo, size_t hi, size_t *a, size_t *b) {
    size_t blk = (hi - lo) / (size_t)s->world;
    *a = lo + (size_t)s->rank * blk;
    *b = s->rank == s->world - 1 ? hi : *a + blk;
}

void rl_host_state_publish(rl_host_state *s, int k) {
    if (rl_host_state_shared(s)) atomic_fetch_add_explicit(&hdr(s)->done[k], 1, memory_order_release);
}

bool rl_host_state_ready(const rl_host_state *s, int k, uint64_t gen) {
    return !rl_host_state_shared(s) ||
           atomic_load_explicit(&hdr(s)->done[k], memory_order_acquire) >= (uint64_t)s->world * gen;
}
