/* Storage: URI dispatch and the file:// backend.
 *
 * The interface is the S3 object model (put whole objects, ranged get,
 * prefix list, delete, head), so the s3:// backend slots in without the
 * checkpoint code noticing. For files that means: a put is temp file +
 * fsync + rename + fsync of the directory (the rename is the atomic step,
 * the directory fsync makes it durable), directories are created on put
 * and removed when their last object is deleted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"

int rl_ckpt_put(rl_ckpt_store *s, const char *key, const rl_ckpt_part *parts, int nparts, rl_err *e) {
    return s->ops->put(s->ctx, key, parts, nparts, e);
}
int rl_ckpt_get(rl_ckpt_store *s, const char *key, uint64_t off, uint64_t len, void **out,
                size_t *n, rl_err *e) {
    return s->ops->get(s->ctx, key, off, len, out, n, e);
}
int rl_ckpt_list_keys(rl_ckpt_store *s, const char *prefix, rl_ckpt_list *out, rl_err *e) {
    return s->ops->list(s->ctx, prefix, out, e);
}
int rl_ckpt_del(rl_ckpt_store *s, const char *key, rl_err *e) { return s->ops->del(s->ctx, key, e); }
int rl_ckpt_exists(rl_ckpt_store *s, const char *key, bool *found, uint64_t *size, rl_err *e) {
    return s->ops->exists(s->ctx, key, found, size, e);
}
int rl_ckpt_abort_uploads(rl_ckpt_store *s, const char *prefix, rl_err *e) {
    return s->ops->abort_uploads ? s->ops->abort_uploads(s->ctx, prefix, e) : RL_OK;
}

void rl_ckpt_store_close(rl_ckpt_store *s) {
    if (!s) return;
    if (s->ops && s->ops->close) s->ops->close(s->ctx);
    free(s);
}

void rl_ckpt_list_free(rl_ckpt_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys);
    l->keys = NULL, l->n = 0;
}

/* ---- file:// ------------------------------------------------------------------------- */
typedef struct {
    char root[RL_CKPT_URI_MAX];
    char uri[RL_CKPT_URI_MAX + 16];
} file_ctx;

static atomic_uint tmp_counter;

/* Keys come from our own code or from `latest`/listings (validated), but a
 * key that could leave the root is refused anyway. */
static int file_path(const file_ctx *c, const char *key, char *dst, size_t n, rl_err *e) {
    if (!key[0] || key[0] == '/' || strstr(key, "..") || strstr(key, "//"))
        return rl_errf(e, RL_EINTERNAL, "%s: refusing object key \"%.80s\"", c->uri, key);
    if ((size_t)snprintf(dst, n, "%s/%s", c->root, key) >= n)
        return rl_errf(e, RL_EINPUT, "%s/%s: path too long", c->uri, key);
    return RL_OK;
}

static void fsync_dir_of(const char *path) {
    char d[RL_CKPT_URI_MAX + 256];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash) return;
    *slash = '\0';
    int fd = open(d[0] ? d : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static int file_put(void *ctx, const char *key, const rl_ckpt_part *parts, int nparts, rl_err *e) {
    file_ctx *c = ctx;
    char path[RL_CKPT_URI_MAX + 256], tmp[RL_CKPT_URI_MAX + 320];
    int rc = file_path(c, key, path, sizeof path, e);
    if (rc) return rc;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    if (strcmp(path, c->root) != 0 && (rc = rl_mkdirs(path, RL_CKPT_DIR_MODE, e))) return rc;
    *slash = '/';
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, RL_CKPT_FILE_MODE);
    if (fd < 0) return rl_errf(e, RL_EIO, "%s/%s: cannot create: %s", c->uri, key, strerror(errno));
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i].data;
        size_t left = parts[i].len;
        while (left > 0) {
            ssize_t w = write(fd, p, left > (1u << 30) ? (1u << 30) : left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int err = w < 0 ? errno : ENOSPC;
                close(fd);
                unlink(tmp);
                return rl_errf(e, RL_EIO, "%s/%s: write: %s", c->uri, key, strerror(err));
            }
            p += w, left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        int err = errno;
        close(fd);
        unlink(tmp);
        return rl_errf(e, RL_EIO, "%s/%s: fsync: %s", c->uri, key, strerror(err));
    }
    if (close(fd) != 0) {
        int err = errno;
        unlink(tmp);
        return rl_errf(e, RL_EIO, "%s/%s: close: %s", c->uri, key, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return rl_errf(e, RL_EIO, "%s/%s: rename: %s", c->uri, key, strerror(err));
    }
    fsync_dir_of(path);
    return RL_OK;
}

static int file_get(void *ctx, const char *key, uint64_t off, uint64_t len, void **out, size_t *n,
                    rl_err *e) {
    file_ctx *c = ctx;
    char path[RL_CKPT_URI_MAX + 256];
    int rc = file_path(c, key, path, sizeof path, e);
    if (rc) return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rl_errf(e, errno == ENOENT ? RL_EINPUT : RL_EIO, "%s/%s: %s", c->uri, key,
                       errno == ENOENT ? "does not exist" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return rl_errf(e, RL_EINPUT, "%s/%s: not a regular file", c->uri, key);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (off > size) {
        close(fd);
        return rl_errf(e, RL_EINPUT, "%s/%s: range starts at %llu, beyond its %llu bytes", c->uri, key,
                       (unsigned long long)off, (unsigned long long)size);
    }
    uint64_t want = len == UINT64_MAX || len > size - off ? size - off : len;
    char *buf = malloc((size_t)want + 1);
    if (!buf) {
        close(fd);
        return rl_errf(e, RL_ENOMEM, "%s/%s: out of memory for %llu bytes", c->uri, key,
                       (unsigned long long)want);
    }
    uint64_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, (size_t)(want - got), (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return rl_errf(e, RL_EIO, "%s/%s: read: %s", c->uri, key, err ? strerror(err) : "file shrank");
        }
        got += (uint64_t)r;
    }
    close(fd);
    buf[want] = '\0';
    *out = buf;
    *n = (size_t)want;
    return RL_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int list_add(rl_ckpt_list *l, size_t *cap, const char *k) {
    if (l->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        char **nk = realloc(l->keys, nc * sizeof *nk);
        if (!nk) return -1;
        l->keys = nk, *cap = nc;
    }
    if (!(l->keys[l->n] = strdup(k))) return -1;
    l->n++;
    return 0;
}

/* Two levels are all the layout has (step-N/file); deeper is not ours. */
static int walk(file_ctx *c, const char *rel, int depth, const char *prefix, rl_ckpt_list *l,
                size_t *cap, rl_err *e) {
    char dir[RL_CKPT_URI_MAX + 256];
    snprintf(dir, sizeof dir, "%s%s%s", c->root, rel[0] ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT && rel[0]) return RL_OK; /* deleted meanwhile */
        return rl_errf(e, RL_EIO, "%s%s%s: cannot list: %s", c->uri, rel[0] ? "/" : "", rel, strerror(errno));
    }
    struct dirent *de;
    int rc = RL_OK;
    while (!rc && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strncmp(de->d_name, ".rl-probe", 9))
            continue;
        char k[RL_CKPT_URI_MAX];
        if ((size_t)snprintf(k, sizeof k, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) >= sizeof k) continue;
        char full[2 * RL_CKPT_URI_MAX + 8];
        snprintf(full, sizeof full, "%s/%s", c->root, k);
        struct stat st;
        if (lstat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            if (depth < 3) rc = walk(c, k, depth + 1, prefix, l, cap, e);
        } else if (S_ISREG(st.st_mode) && strncmp(k, prefix, strlen(prefix)) == 0) {
            if (list_add(l, cap, k)) rc = rl_errf(e, RL_ENOMEM, "%s: out of memory listing", c->uri);
        }
    }
    closedir(d);
    return rc;
}

static int file_list(void *ctx, const char *prefix, rl_ckpt_list *out, rl_err *e) {
    file_ctx *c = ctx;
    size_t cap = 0;
    out->keys = NULL, out->n = 0;
    int rc = walk(c, "", 0, prefix, out, &cap, e);
    if (rc) {
        rl_ckpt_list_free(out);
        return rc;
    }
    if (out->n) qsort(out->keys, out->n, sizeof *out->keys, cmp_str);
    return RL_OK;
}

static int file_del(void *ctx, const char *key, rl_err *e) {
    file_ctx *c = ctx;
    char path[RL_CKPT_URI_MAX + 256];
    int rc = file_path(c, key, path, sizeof path, e);
    if (rc) return rc;
    if (unlink(path) != 0 && errno != ENOENT)
        return rl_errf(e, RL_EIO, "%s/%s: delete: %s", c->uri, key, strerror(errno));
    /* like S3, a "directory" exists only while it holds objects */
    char *slash = strrchr(path, '/');
    *slash = '\0';
    if (strcmp(path, c->root) != 0) (void)rmdir(path);
    return RL_OK;
}

static int file_exists(void *ctx, const char *key, bool *found, uint64_t *size, rl_err *e) {
    file_ctx *c = ctx;
    char path[RL_CKPT_URI_MAX + 256];
    int rc = file_path(c, key, path, sizeof path, e);
    if (rc) return rc;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            return rl_errf(e, RL_EIO, "%s/%s: stat: %s", c->uri, key, strerror(errno));
        *found = false;
        if (size) *size = 0;
        return RL_OK;
    }
    *found = S_ISREG(st.st_mode);
    if (size) *size = (uint64_t)st.st_size;
    return RL_OK;
}

static void file_close(void *ctx) { free(ctx); }

static const rl_ckpt_store_ops file_ops = {
    .put = file_put, .get = file_get, .list = file_list,
    .del = file_del, .exists = file_exists, .close = file_close,
};

static int open_file(const char *path, bool readonly, rl_ckpt_store **out, rl_err *e) {
    file_ctx *c = calloc(1, sizeof *c);
    rl_ckpt_store *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c), free(s);
        return rl_errf(e, RL_ENOMEM, "checkpoint store: out of memory");
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    if (n == 0 || n >= sizeof c->root - 64) {
        free(c), free(s);
        return rl_errf(e, RL_EINPUT, "checkpoint.uri: empty or too long path");
    }
    memcpy(c->root, path, n);
    c->root[n] = '\0';
    snprintf(c->uri, sizeof c->uri, "%s%s", c->root[0] == '/' ? "file://" : "", c->root);
    int rc = RL_OK;
    struct stat st;
    if (readonly && stat(c->root, &st) != 0) {
        rc = rl_errf(e, RL_EINPUT, "checkpoint %s: %s", c->uri, strerror(errno));
        goto fail;
    }
    if (stat(c->root, &st) != 0) {
        /* EEXIST: another rank of the job made it first (sharded state: every rank saves) */
        if (mkdir(c->root, RL_CKPT_DIR_MODE) != 0 && !(errno == EEXIST && stat(c->root, &st) == 0)) {
            /* the parent must exist: a typo in the path should not grow a tree */
            rc = rl_errf(e, RL_EINPUT, "checkpoint.uri %s: cannot create the directory: %s", c->uri,
                         strerror(errno));
            goto fail;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        rc = rl_errf(e, RL_EINPUT, "checkpoint.uri %s: exists and is not a directory", c->uri);
        goto fail;
    }
    char probe[RL_CKPT_URI_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.rl-probe.%ld", c->root, (long)getpid());
    int fd = readonly ? -2 : open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, RL_CKPT_FILE_MODE);
    if (fd == -1) {
        rc = rl_errf(e, RL_EINPUT, "checkpoint.uri %s: directory is not writable: %s", c->uri,
                     strerror(errno));
        goto fail;
    }
    if (fd >= 0) close(fd), unlink(probe);
    s->ops = &file_ops, s->ctx = c;
    snprintf(s->uri, sizeof s->uri, "%.1000s", c->uri);
    *out = s;
    return RL_OK;
fail:
    free(c), free(s);
    return rc;
}

static int open_cfg(const rl_ckpt_config *c, bool readonly, rl_ckpt_store **out, rl_err *e) {
    *out = NULL;
    rl_ckpt_uri u;
    int rc = rl_ckpt_uri_parse(c->uri, "checkpoint.uri", &u, e);
    if (rc) return rc;
    return u.s3 ? rl_ckpt_store_open_s3(c, &u, readonly, out, e) : open_file(u.path, readonly, out, e);
}

int rl_ckpt_store_open_cfg(const rl_ckpt_config *c, rl_ckpt_store **out, rl_err *e) { return open_cfg(c, false, out, e); }

static int open_uri(const char *uri, bool readonly, rl_ckpt_store **out, rl_err *e) {
    rl_ckpt_config c;
    rl_ckpt_config_default(&c);
    *out = NULL;
    if (uri && strlen(uri) >= sizeof c.uri)
        return rl_errf(e, RL_EINPUT, "checkpoint.uri: longer than %zu bytes", sizeof c.uri - 1);
    snprintf(c.uri, sizeof c.uri, "%s", uri ? uri : "");
    return open_cfg(&c, readonly, out, e);
}

int rl_ckpt_store_open(const char *uri, rl_ckpt_store **out, rl_err *e) { return open_uri(uri, false, out, e); }
int rl_ckpt_store_open_read(const char *uri, rl_ckpt_store **out, rl_err *e) { return open_uri(uri, true, out, e); }
