/* Documents of a file (data.h): JSON Lines, Parquet, or text cut at a
 * separator, behind one loop, so ringleader-prepare reads them all the same
 * way. */
#include "data/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_BLOCK ((size_t)1 << 20)

/* text cut at `sep`: read in blocks; buf[start, len) is what no document
 * has taken yet, and no separator begins before `scanned` */
typedef struct {
    FILE *f;
    char *path, *sep;
    size_t nsep;
    char *buf;
    size_t start, len, cap, scanned;
    uint64_t consumed; /* bytes of the file before buf[0] */
    bool eof;
} text_docs;

struct rl_docs {
    rl_jsonl *j;
    rl_parquet *p;
    text_docs *t;
};

static void text_close(text_docs *t) {
    if (!t) return;
    if (t->f) fclose(t->f);
    free(t->path), free(t->sep), free(t->buf);
    free(t);
}

static int text_open(const char *path, const char *sep, text_docs **out, rl_err *e) {
    /* nothing to find: every byte would "end" a document and none be taken */
    if (!*sep) return rl_errf(e, RL_EINPUT, "%s: an empty separator cuts no documents", path);
    text_docs *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path)) || !(t->sep = strdup(sep))) {
        text_close(t);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory", path);
    }
    t->nsep = strlen(sep);
    if (!(t->f = fopen(path, "rb"))) {
        int rc = rl_errf(e, RL_EINPUT, "%s: cannot open: %s", path, strerror(errno));
        text_close(t);
        return rc;
    }
    *out = t;
    return RL_OK;
}

/* Moves the untaken bytes to the front and reads a block after them. */
static int text_fill(text_docs *t, rl_err *e) {
    if (t->start) memmove(t->buf, t->buf + t->start, t->len - t->start);
    t->consumed += t->start;
    t->len -= t->start, t->scanned -= t->start, t->start = 0;
    if (t->cap - t->len < TEXT_BLOCK) {
        char *b = realloc(t->buf, t->len + TEXT_BLOCK);
        if (!b) return rl_errf(e, RL_ENOMEM, "%s: out of memory (a document of %zu bytes so far)", t->path, t->len);
        t->buf = b, t->cap = t->len + TEXT_BLOCK;
    }
    size_t n = fread(t->buf + t->len, 1, t->cap - t->len, t->f);
    if (n == 0 && ferror(t->f)) return rl_errf(e, RL_EIO, "%s: read: %s", t->path, strerror(errno));
    t->len += n;
    t->eof = n == 0;
    return RL_OK;
}

/* The next non-empty document: the bytes before the next separator, or
 * before the end of the file. */
static int text_next(text_docs *t, const char **text, size_t *len, rl_err *e) {
    *text = NULL, *len = 0;
    for (;;) {
        const char *hit = t->len - t->scanned >= t->nsep
                              ? memmem(t->buf + t->scanned, t->len - t->scanned, t->sep, t->nsep) : NULL;
        size_t end = hit ? (size_t)(hit - t->buf) : t->eof ? t->len : (size_t)-1;
        if (end != (size_t)-1) {
            size_t from = t->start;
            t->start = t->scanned = hit ? end + t->nsep : end;
            if (end == from) {
                if (!hit) return RL_OK; /* the end of the file */
                continue;                /* two separators in a row, or one first */
            }
            *text = t->buf + from, *len = end - from;
            return RL_OK;
        }
        /* a separator may straddle what is read so far */
        t->scanned = t->len - t->start >= t->nsep ? t->len - t->nsep + 1 : t->start;
        int rc = text_fill(t, e);
        if (rc) return rc;
    }
}

int rl_docs_open(rl_docs_format f, const char *path, const char *field, const char *parquet_lib, rl_docs **out,
                 rl_err *e) {
    *out = NULL;
    rl_docs *d = calloc(1, sizeof *d);
    if (!d) return rl_errf(e, RL_ENOMEM, "%s: out of memory", path);
    int rc = f == RL_DOCS_PARQUET ? rl_parquet_open(parquet_lib, path, field, &d->p, e)
           : f == RL_DOCS_TEXT    ? text_open(path, field, &d->t, e)
                                  : rl_jsonl_open(path, field, 0, &d->j, e);
    if (rc) free(d);
    else *out = d;
    return rc;
}

int rl_docs_next(rl_docs *d, const char **text, size_t *len, rl_err *e) {
    return d->p ? rl_parquet_next(d->p, text, len, e) : d->t ? text_next(d->t, text, len, e)
                                                              : rl_jsonl_next(d->j, text, len, e);
}

uint64_t rl_docs_done(const rl_docs *d, uint64_t size) {
    if (d->j) return (uint64_t)rl_jsonl_offset(d->j);
    if (d->t) return d->t->consumed + d->t->start;
    long long rows = rl_parquet_rows(d->p), row = rl_parquet_row(d->p) + 1;
    return rows > 0 ? (uint64_t)((double)size * (double)row / (double)rows) : size;
}

void rl_docs_close(rl_docs *d) {
    if (!d) return;
    rl_jsonl_close(d->j);
    rl_parquet_close(d->p);
    text_close(d->t);
    free(d);
}
