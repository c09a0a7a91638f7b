/* Token shards in llm.c's formats: a 1024-byte header of little-endian int32
 * words, then uint16 or uint32 tokens (data.h). The header parser sees
 * untrusted bytes (it is fuzzed), so it reads words byte by byte and never
 * trusts the count before checking it against the real file size.
 *
 * Writers never expose a half-written shard: tokens go to a temp file in the
 * same directory, the header is filled in last, and rename(2) publishes it. */
#include "data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int32_t le32(const unsigned char *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    int32_t s;
    memcpy(&s, &v, sizeof s); /* two's complement reinterpretation without UB */
    return s;
}

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

int rl_shard_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                          uint64_t *ntokens, int *token_bytes, rl_err *e) {
    const unsigned char *p = buf;
    if (!name) name = "shard";
    if (!p) len = 0;
    /* A short text file handed over by mistake should be called what it is,
     * so the magic is checked before the length whenever there is one. */
    int32_t m = len >= 4 ? le32(p) : RL_SHARD_MAGIC;
    if (m != RL_SHARD_MAGIC && m != RL_SHARD32_MAGIC)
        return rl_errf(e, RL_EINPUT,
                       "%s: not an llm.c token shard (magic %d / 0x%08x, expected %d or %d)", name,
                       (int)m, (unsigned)m, RL_SHARD_MAGIC, RL_SHARD32_MAGIC);
    if (len < RL_SHARD_HEADER_BYTES)
        return rl_errf(e, RL_EINPUT, "%s: truncated header: %zu bytes, a shard header is %d",
                       name, len, RL_SHARD_HEADER_BYTES);
    bool wide = m == RL_SHARD32_MAGIC;
    int32_t version = le32(p + 4), tb = wide ? 4 : 2;
    if (version != (wide ? RL_SHARD32_VERSION : RL_SHARD_VERSION))
        return rl_errf(e, RL_EINPUT,
                       "%s: unsupported shard version %d for magic %d (llm.c's formats: %d with "
                       "version %d, uint16 tokens; %d with version %d, uint32 tokens)",
                       name, (int)version, (int)m, RL_SHARD_MAGIC, RL_SHARD_VERSION, RL_SHARD32_MAGIC,
                       RL_SHARD32_VERSION);
    int32_t count = le32(p + 8);
    if (count < 0)
        return rl_errf(e, RL_EINPUT, "%s: header has a negative token count (%d)", name,
                       (int)count);
    if ((uint64_t)count > RL_SHARD_MAX_TOKENS)
        return rl_errf(e, RL_EINPUT, "%s: header token count %d exceeds the maximum %llu", name,
                       (int)count, (unsigned long long)RL_SHARD_MAX_TOKENS);
    uint64_t want = (uint64_t)RL_SHARD_HEADER_BYTES + (uint64_t)tb * (uint64_t)count;
    if (file_size < want)
        return rl_errf(e, RL_EINPUT,
                       "%s: truncated: header says %d tokens (%llu bytes) but file has %llu "
                       "bytes",
                       name, (int)count, (unsigned long long)want,
                       (unsigned long long)file_size);
    if (file_size > want)
        return rl_errf(e, RL_EINPUT, "%s: has %llu trailing bytes after its %d tokens", name,
                       (unsigned long long)(file_size - want), (int)count);
    if (ntokens) *ntokens = (uint64_t)count;
    if (token_bytes) *token_bytes = tb;
    return RL_OK;
}

static int write_all(int fd, const void *buf, size_t n, const char *path, rl_err *e) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return rl_errf(e, RL_EIO, "%s: write: %s", path,
                           w < 0 ? strerror(errno) : "wrote nothing");
        p += w;
        n -= (size_t)w;
    }
    return RL_OK;
}

/* ---- single-file writer: the building block of both public writers ------- */
typedef struct {
    int fd;
    int tb; /* bytes a token: 2 or 4 */
    char path[4096];
    char tmp[4200];
    uint64_t count;
} shard_file;

static int shard_file_open(shard_file *f, const char *path, int tb, rl_err *e) {
    /* Unique per process and per call, so concurrent writers never share a
     * temp file; O_EXCL makes a leftover from a crashed run an error rather
     * than something we silently append to. */
    static atomic_uint seq;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof f->path)
        return rl_errf(e, RL_EINPUT, "shard path '%.64s...' is empty or too long", path);
    memcpy(f->path, path, n + 1);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
             atomic_fetch_add(&seq, 1u));
    f->count = 0, f->tb = tb;
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) return rl_errf(e, RL_EIO, "%s: cannot create: %s", f->tmp, strerror(errno));
    /* Header placeholder; the count is only known at commit. */
    unsigned char hdr[RL_SHARD_HEADER_BYTES] = {0};
    int rc = write_all(f->fd, hdr, sizeof hdr, f->tmp, e);
    if (rc) {
        close(f->fd);
        unlink(f->tmp);
        f->fd = -1;
    }
    return rc;
}

static void shard_file_abort(shard_file *f) {
    if (f->fd < 0) return;
    close(f->fd);
    unlink(f->tmp);
    f->fd = -1;
}

/* n ids from tok (uint16_t with src 2, uint32_t with src 4), little-endian
 * at the shard's width */
static int shard_file_add(shard_file *f, const void *tok, int src, size_t n, rl_err *e) {
    if (n > RL_SHARD_MAX_TOKENS - f->count)
        return rl_errf(e, RL_EINPUT, "%s: more than %llu tokens in one shard", f->path,
                       (unsigned long long)RL_SHARD_MAX_TOKENS);
    unsigned char buf[1 << 16];
    size_t tb = (size_t)f->tb;
    while (n > 0) {
        size_t k = n < sizeof buf / tb ? n : sizeof buf / tb;
        for (size_t i = 0; i < k; i++) {
            uint32_t v = src == 4 ? ((const uint32_t *)tok)[i] : ((const uint16_t *)tok)[i];
            if (tb == 2 && v > 0xffff)
                return rl_errf(e, RL_EINPUT, "%s: token id %u does not fit a uint16 shard (a vocabulary "
                               "above 65536 needs uint32 shards)", f->path, (unsigned)v);
            for (size_t b = 0; b < tb; b++) buf[tb * i + b] = (unsigned char)(v >> (8 * b));
        }
        int rc = write_all(f->fd, buf, tb * k, f->tmp, e);
        if (rc) return rc;
        f->count += k;
        tok = (const char *)tok + (size_t)src * k;
        n -= k;
    }
    return RL_OK;
}

/* Fill in the header, make the bytes durable, then publish under the final
 * name. Always closes the file; on failure the temp file is removed. */
static int shard_file_commit(shard_file *f, rl_err *e) {
    unsigned char hdr[12];
    put_le32(hdr, f->tb == 4 ? RL_SHARD32_MAGIC : RL_SHARD_MAGIC);
    put_le32(hdr + 4, f->tb == 4 ? RL_SHARD32_VERSION : RL_SHARD_VERSION);
    put_le32(hdr + 8, (uint32_t)f->count);
    int rc = RL_OK;
    ssize_t w;
    do {
        w = pwrite(f->fd, hdr, sizeof hdr, 0);
    } while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof hdr)
        rc = rl_errf(e, RL_EIO, "%s: writing header: %s", f->tmp,
                     w < 0 ? strerror(errno) : "short write");
    if (!rc && fsync(f->fd) != 0)
        rc = rl_errf(e, RL_EIO, "%s: fsync: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && !rc) rc = rl_errf(e, RL_EIO, "%s: close: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (!rc && rename(f->tmp, f->path) != 0)
        rc = rl_errf(e, RL_EIO, "%s: rename from %s: %s", f->path, f->tmp, strerror(errno));
    if (rc) unlink(f->tmp);
    return rc;
}

int rl_shard_write(const char *path, const uint16_t *tokens, size_t n, rl_err *e) {
    if (n > RL_SHARD_MAX_TOKENS)
        return rl_errf(e, RL_EINPUT, "%s: %zu tokens exceed the shard maximum %llu", path, n,
                       (unsigned long long)RL_SHARD_MAX_TOKENS);
    shard_file f;
    int rc = shard_file_open(&f, path, 2, e);
    if (rc) return rc;
    rc = shard_file_add(&f, tokens, 2, n, e);
    if (rc) {
        shard_file_abort(&f);
        return rc;
    }
    return shard_file_commit(&f, e);
}

/* ---- rolling writer: <dir>/<prefix>_NNNNNN.bin ----------------------------- */
struct rl_shard_writer {
    char dir[4000];
    char prefix[64];
    uint64_t shard_tokens;
    int tb;
    shard_file cur;
    bool open;
    int nshards;     /* committed shards */
    uint64_t tokens; /* committed + current */
};

static void shard_name(char *dst, size_t n, const rl_shard_writer *w, int i) {
    snprintf(dst, n, "%s/%s_%06d.bin", w->dir, w->prefix, i);
}

int rl_shard_writer_open(const char *dir, const char *prefix, uint64_t shard_tokens, int token_bytes,
                         rl_shard_writer **out, rl_err *e) {
    *out = NULL;
    if (token_bytes != 2 && token_bytes != 4)
        return rl_errf(e, RL_EINTERNAL, "shard writer: %d bytes a token (2 or 4)", token_bytes);
    if (shard_tokens < 1 || shard_tokens > RL_SHARD_MAX_TOKENS)
        return rl_errf(e, RL_EINPUT, "shard_tokens: must be in [1, %llu], got %llu",
                       (unsigned long long)RL_SHARD_MAX_TOKENS,
                       (unsigned long long)shard_tokens);
    if (strlen(dir) >= sizeof((rl_shard_writer *)0)->dir || strlen(prefix) == 0 ||
        strlen(prefix) >= sizeof((rl_shard_writer *)0)->prefix || strchr(prefix, '/'))
        return rl_errf(e, RL_EINPUT, "%s: bad output directory or shard prefix '%s'", dir,
                       prefix);
    int rc = rl_mkdirs(dir, 0755, e);
    if (rc) return rc;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return rl_errf(e, RL_EINPUT, "%s: not a directory", dir);
    rl_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return rl_errf(e, RL_ENOMEM, "%s: out of memory", dir);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix);
    w->shard_tokens = shard_tokens;
    w->tb = token_bytes;
    w->cur.fd = -1;
    *out = w;
    return RL_OK;
}

static int writer_start(rl_shard_writer *w, rl_err *e) {
    char path[4200];
    shard_name(path, sizeof path, w, w->nshards);
    int rc = shard_file_open(&w->cur, path, w->tb, e);
    if (!rc) w->open = true;
    return rc;
}

static int writer_add(rl_shard_writer *w, const void *tok, int src, size_t n, rl_err *e) {
    while (n > 0) {
        if (!w->open) {
            int rc = writer_start(w, e);
            if (rc) return rc;
        }
        uint64_t room = w->shard_tokens - w->cur.count;
        size_t k = (uint64_t)n < room ? n : (size_t)room;
        int rc = shard_file_add(&w->cur, tok, src, k, e);
        if (rc) return rc;
        w->tokens += k;
        tok = (const char *)tok + (size_t)src * k;
        n -= k;
        if (w->cur.count == w->shard_tokens) {
            w->open = false;
            rc = shard_file_commit(&w->cur, e);
            if (rc) return rc;
            w->nshards++;
        }
    }
    return RL_OK;
}

int rl_shard_writer_add(rl_shard_writer *w, const uint16_t *tok, size_t n, rl_err *e) {
    return writer_add(w, tok, 2, n, e);
}

int rl_shard_writer_add32(rl_shard_writer *w, const uint32_t *tok, size_t n, rl_err *e) {
    return writer_add(w, tok, 4, n, e);
}

int rl_shard_writer_close(rl_shard_writer *w, int *nshards, uint64_t *ntokens, rl_err *e) {
    int rc = RL_OK;
    /* An empty split still gets one (empty) shard, so the file a config
     * names exists and opening it reports "no tokens" instead of "missing". */
    if (!w->open && w->nshards == 0) rc = writer_start(w, e);
    if (!rc && w->open) {
        w->open = false;
        rc = shard_file_commit(&w->cur, e);
        if (!rc) w->nshards++;
    }
    if (!rc) {
        /* Shards left over from an earlier, larger run under the same prefix
         * would otherwise be picked up by a "<prefix>_*.bin" glob. */
        for (int i = w->nshards;; i++) {
            char path[4200];
            shard_name(path, sizeof path, w, i);
            if (unlink(path) != 0) break;
            char esc[1024];
            rl_log(RL_LOG_WARN, "shard_stale_removed", "\"path\":\"%s\"",
                   rl_json_escape(esc, sizeof esc, path));
        }
        if (nshards) *nshards = w->nshards;
        if (ntokens) *ntokens = w->tokens;
    }
    if (w->open) shard_file_abort(&w->cur);
    free(w);
    return rc;
}

void rl_shard_writer_abort(rl_shard_writer *w) {
    if (!w) return;
    if (w->open) shard_file_abort(&w->cur);
    free(w);
}
