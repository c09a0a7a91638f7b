/* A dataset is its shards read as one token stream. Every header is checked
 * at open so a bad file fails the job before training starts; token values
 * are checked as they are read, because scanning terabytes up front would be
 * too slow. One descriptor per shard stays open and reads use pread(2), so
 * any number of threads can read concurrently without a shared file offset. */
#include "data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;
    int fd;
    uint64_t start; /* global offset of the shard's first token */
    uint64_t ntok;
    int tb; /* bytes a token: 2 or 4 */
} shard;

struct rl_dataset {
    shard *s;
    int n;
    uint64_t total;
    int vocab;
};

typedef struct {
    char **v;
    size_t n, cap;
} strvec;

static int strvec_push(strvec *sv, const char *s, rl_err *e) {
    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? 2 * sv->cap : 16;
        char **v = realloc(sv->v, cap * sizeof *v);
        if (!v) return rl_errf(e, RL_ENOMEM, "dataset: out of memory listing shards");
        sv->v = v;
        sv->cap = cap;
    }
    char *d = strdup(s);
    if (!d) return rl_errf(e, RL_ENOMEM, "dataset: out of memory listing shards");
    sv->v[sv->n++] = d;
    return RL_OK;
}

static void strvec_free(strvec *sv) {
    for (size_t i = 0; i < sv->n; i++) free(sv->v[i]);
    free(sv->v);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Expand one comma-separated item. A literal path is kept as is so that a
 * missing file is reported by open() with its errno ("No such file"), which
 * says more than "no match". */
static int expand_item(const char *item, strvec *out, rl_err *e) {
    if (!strpbrk(item, "*?[")) return strvec_push(out, item, e);
    glob_t g;
    /* no GLOB_ERR: a missing or unreadable directory is reported as "no
     * files match", which names the pattern the user wrote */
    int r = glob(item, 0, NULL, &g);
    if (r == GLOB_NOMATCH) {
        globfree(&g);
        return rl_errf(e, RL_EINPUT, "%s: no files match this pattern", item);
    }
    if (r != 0) {
        globfree(&g);
        return rl_errf(e, r == GLOB_NOSPACE ? RL_ENOMEM : RL_EINPUT,
                       "%s: cannot expand pattern (unreadable directory?)", item);
    }
    int rc = RL_OK;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++) rc = strvec_push(out, g.gl_pathv[i], e);
    globfree(&g);
    return rc;
}

static int open_shard(shard *s, rl_err *e) {
    s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        int err = errno;
        return rl_errf(e, err == EMFILE || err == ENFILE ? RL_EIO : RL_EINPUT,
                       "%s: cannot open: %s", s->path, strerror(err));
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return rl_errf(e, RL_EIO, "%s: stat: %s", s->path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return rl_errf(e, RL_EINPUT, "%s: not a regular file", s->path);
    unsigned char hdr[RL_SHARD_HEADER_BYTES];
    size_t got = 0;
    while (got < sizeof hdr) {
        ssize_t r = pread(s->fd, hdr + got, sizeof hdr - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return rl_errf(e, RL_EIO, "%s: read: %s", s->path, strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
    }
    return rl_shard_parse_header(hdr, got, (uint64_t)st.st_size, s->path, &s->ntok, &s->tb, e);
}

int rl_dataset_open(const char *pattern, int vocab_size, rl_dataset **out, rl_err *e) {
    *out = NULL;
    if (!pattern || !*pattern) return rl_errf(e, RL_EINPUT, "dataset: empty path or pattern");
    if (vocab_size < 1)
        return rl_errf(e, RL_EINPUT, "%s: vocab_size must be >= 1, got %d", pattern,
                       vocab_size);

    strvec paths = {0};
    char *list = strdup(pattern);
    if (!list) return rl_errf(e, RL_ENOMEM, "dataset: out of memory");
    int rc = RL_OK;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item && !rc;
         item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ' || *item == '\t') item++;
        size_t len = strlen(item);
        while (len > 0 && (item[len - 1] == ' ' || item[len - 1] == '\t')) item[--len] = '\0';
        if (len == 0) continue;
        rc = expand_item(item, &paths, e);
    }
    free(list);
    if (!rc && paths.n == 0) rc = rl_errf(e, RL_EINPUT, "'%s': names no files", pattern);
    if (rc) {
        strvec_free(&paths);
        return rc;
    }

    /* The stream order is the sorted path order whatever order the list was
     * written in, so "a,b" and "b,a" (and overlapping globs) name the same
     * dataset and the same sample order; a path listed twice counts once. */
    qsort(paths.v, paths.n, sizeof *paths.v, cmp_str);
    size_t uniq = 0;
    for (size_t i = 0; i < paths.n; i++) {
        if (uniq > 0 && strcmp(paths.v[uniq - 1], paths.v[i]) == 0) {
            free(paths.v[i]);
            continue;
        }
        paths.v[uniq++] = paths.v[i];
    }
    paths.n = uniq;
    if (paths.n > (size_t)INT32_MAX) {
        strvec_free(&paths);
        return rl_errf(e, RL_EINPUT, "%s: too many shards", pattern);
    }

    rl_dataset *d = calloc(1, sizeof *d);
    shard *s = d ? calloc(paths.n, sizeof *s) : NULL;
    if (!s) {
        free(d);
        strvec_free(&paths);
        return rl_errf(e, RL_ENOMEM, "dataset: out of memory");
    }
    d->s = s;
    d->vocab = vocab_size;
    for (size_t i = 0; i < paths.n; i++) {
        s[i].path = paths.v[i]; /* ownership moves to the dataset */
        s[i].fd = -1;
    }
    d->n = (int)paths.n;
    free(paths.v);

    for (int i = 0; i < d->n && !rc; i++) {
        rc = open_shard(&s[i], e);
        s[i].start = d->total;
        d->total += s[i].ntok;
    }
    if (!rc && d->total == 0)
        rc = rl_errf(e, RL_EINPUT, "%s: the dataset holds no tokens (%d empty shard%s)", pattern,
                     d->n, d->n == 1 ? "" : "s");
    if (rc) {
        rl_dataset_close(d);
        return rc;
    }
    *out = d;
    return RL_OK;
}

uint64_t rl_dataset_tokens(const rl_dataset *d) { return d->total; }
int rl_dataset_nshards(const rl_dataset *d) { return d->n; }

/* Index of the shard holding global token `off` (off < total). Empty shards
 * share a start with their successor; the search skips them because it
 * looks for the last shard whose start is <= off and that is non-empty. */
static int find_shard(const rl_dataset *d, uint64_t off) {
    int lo = 0, hi = d->n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (d->s[mid].start <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    while (d->s[lo].ntok == 0 || off - d->s[lo].start >= d->s[lo].ntok) lo++;
    return lo;
}

int rl_dataset_read(rl_dataset *d, uint64_t off, size_t n, int32_t *dst, rl_err *e) {
    if (off > d->total || n > d->total - off)
        return rl_errf(e, RL_EINTERNAL,
                       "dataset: read of %zu tokens at %llu is past the end (%llu tokens)", n,
                       (unsigned long long)off, (unsigned long long)d->total);
    if (n == 0) return RL_OK;
    int i = find_shard(d, off);
    unsigned char buf[8192];
    while (n > 0) {
        const shard *s = &d->s[i];
        uint64_t in = off - s->start; /* token index inside this shard */
        if (in >= s->ntok) {
            i++;
            continue;
        }
        uint64_t avail = s->ntok - in;
        size_t tb = (size_t)s->tb, k = sizeof buf / tb;
        if ((uint64_t)k > avail) k = (size_t)avail;
        if (k > n) k = n;
        size_t got = 0;
        off_t pos = (off_t)(RL_SHARD_HEADER_BYTES + tb * in);
        while (got < tb * k) {
            ssize_t r = pread(s->fd, buf + got, tb * k - got, pos + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0)
                return rl_errf(e, RL_EIO, "%s: read at token %llu: %s", s->path,
                               (unsigned long long)in, strerror(errno));
            if (r == 0)
                return rl_errf(e, RL_EIO, "%s: file shrank while open (short read at token %llu)",
                               s->path, (unsigned long long)in);
            got += (size_t)r;
        }
        for (size_t j = 0; j < k; j++) {
            uint32_t t = 0;
            for (size_t b = 0; b < tb; b++) t |= (uint32_t)buf[tb * j + b] << (8 * b);
            if (t >= (uint32_t)d->vocab)
                return rl_errf(e, RL_EINPUT, "%s: token %u at index %llu is >= vocab_size %d",
                               s->path, (unsigned)t, (unsigned long long)(in + j), d->vocab);
            dst[j] = (int32_t)t;
        }
        dst += k;
        off += k;
        n -= k;
    }
    return RL_OK;
}

void rl_dataset_close(rl_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        if (d->s[i].fd >= 0) close(d->s[i].fd);
        free(d->s[i].path);
    }
    free(d->s);
    free(d);
}

int rl_dataset_unigram_entropy(rl_dataset *d, uint64_t max_tokens, double *nats, rl_err *e) {
    uint64_t n = rl_dataset_tokens(d) < max_tokens ? rl_dataset_tokens(d) : max_tokens;
    enum { CHUNK = 1 << 16 };
    int32_t *buf = malloc(sizeof(int32_t) * CHUNK);
    uint64_t *count = calloc((size_t)d->vocab, sizeof(uint64_t));
    int rc = RL_OK;
    if (!buf || !count) {
        rc = rl_errf(e, RL_ENOMEM, "unigram entropy: out of memory");
        goto out;
    }
    for (uint64_t off = 0; off < n && !rc; off += CHUNK) {
        size_t k = n - off < CHUNK ? (size_t)(n - off) : CHUNK;
        if ((rc = rl_dataset_read(d, off, k, buf, e))) goto out;
        for (size_t i = 0; i < k; i++) count[buf[i]]++;
    }
    double h = 0;
    for (int v = 0; v < d->vocab; v++)
        if (count[v]) {
            double p = (double)count[v] / (double)n;
            h -= p * log(p);
        }
    *nats = h;
out:
    free(buf);
    free(count);
    return rc;
}
