/* libFuzzer target for the text reader behind ringleader-prepare text
 * --split-on SEP (rl_docs_open(RL_DOCS_TEXT, ...) / rl_docs_next, text_next
 * in pkg/data/docs.c), which cuts a file we do not control into
 * documents while reading it in blocks. Differential: the documents it
 * hands out must be, in order and byte for byte, what a plain in-memory
 * scan of the same bytes gives -- cut at every occurrence of the
 * separator found left to right (a match resumes the scan after it, so
 * "aa" in "aaa" is one separator and an "a"), the separator in no
 * document, empty documents (two separators in a row, one first or last)
 * skipped, the text after the last separator a document of its own --
 * and rl_docs_done must stand just past each document's separator (the
 * end of the file after the last one). The reader may fail nowhere: the
 * file is there and readable, so any error aborts, with its message.
 *
 * Input: byte 0, bits 0-3: the separator's length - 1 (1..16 bytes);
 * bit 7: pad (below), and then byte 1 is k; bits 4-6 unused. Then the separator's bytes, then the
 * text. A separator holding a NUL is skipped: the API takes a C string
 * and the CLI's argv cannot carry one. Nor is one ever empty, which the
 * CLI refuses too (rl_docs_open takes "", and text_next then never
 * returns).
 *
 * Block boundaries: docs.c's TEXT_BLOCK is a private 1 MiB constant, and
 * the first read of a file fills an empty buffer with exactly one block,
 * so it ends at offset 1 MiB. With pad, the file is 1 MiB - k bytes of
 * NUL and then the text: its first k bytes come in the first read, the
 * rest in the second, so the fuzzer can lay a separator (or the start of
 * one) astride the boundary. NUL can never be part of a separator, so
 * the filler matches nothing -- and the model scans the very bytes the
 * file holds anyway. Later boundaries (a partial document moved to the
 * front, then the next block after it) and documents longer than a block
 * are left to tests/unit/test_data.c's 3 MiB file (text_cut_at_a_
 * separator_across_block_boundaries): MiBs per input cost too many runs.
 *
 * Two temp files per process, made once with mkstemp under /tmp: one
 * for plain inputs, rewritten each time, and one for padded ones, whose
 * first 1 MiB - 255 bytes of NUL are written once and only the rest
 * rewritten (an input is then a few KiB of I/O, not a MiB). Their names
 * are unlinked at once and the reader opens them as /proc/self/fd/N, so
 * nothing is left behind even when an input aborts (where /proc is
 * missing, the names stay until exit). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"

#define BLOCK ((size_t)1 << 20) /* TEXT_BLOCK in pkg/data/docs.c */
#define ZEROS (BLOCK - 255)     /* the pad is BLOCK - k, 0 <= k <= 255 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    int fd;
    char path[64], name[64]; /* name: still to unlink at exit */
} tmp_file;
static tmp_file tmp_plain = {.fd = -1}, tmp_pad = {.fd = -1};
/* the padded file's bytes: ZEROS of NUL that stay, then the rest */
static uint8_t *pbuf;
static size_t pcap;

static void die(const char *what) {
    perror(what);
    abort();
}

static void remove_tmp(void) {
    if (tmp_plain.name[0]) unlink(tmp_plain.name);
    if (tmp_pad.name[0]) unlink(tmp_pad.name);
}

static void tmp_open(tmp_file *t) {
    strcpy(t->name, "/tmp/fuzz_docs_split.XXXXXX");
    if ((t->fd = mkstemp(t->name)) < 0) die("fuzz_docs_split: mkstemp");
    snprintf(t->path, sizeof t->path, "/proc/self/fd/%d", t->fd);
    if (access(t->path, R_OK) == 0) {
        unlink(t->name);
        t->name[0] = 0;
    } else {
        strcpy(t->path, t->name);
    }
}

/* The file becomes p[0, n), of which [0, from) it holds already. */
static void tmp_put(tmp_file *t, const uint8_t *p, size_t from, size_t n) {
    for (size_t at = from; at < n;) {
        ssize_t w = pwrite(t->fd, p + at, n - at, (off_t)at);
        if (w <= 0) die("fuzz_docs_split: pwrite");
        at += (size_t)w;
    }
    if (ftruncate(t->fd, (off_t)n) != 0) die("fuzz_docs_split: ftruncate");
}

static void tmp_setup(void) {
    tmp_open(&tmp_plain);
    tmp_open(&tmp_pad);
    if (tmp_plain.name[0] || tmp_pad.name[0]) atexit(remove_tmp);
    pcap = BLOCK + 4096;
    if (!(pbuf = calloc(1, pcap))) die("fuzz_docs_split: calloc");
    tmp_put(&tmp_pad, pbuf, 0, ZEROS);
}

/* the separator, for messages */
static const uint8_t *g_sep;
static size_t g_nsep;

static void fail(const char *fmt, ...) {
    fprintf(stderr, "fuzz_docs_split: separator (%zu bytes) ", g_nsep);
    for (size_t i = 0; i < g_nsep; i++) fprintf(stderr, "%02x", g_sep[i]);
    fprintf(stderr, ": ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* The model: the whole text in memory, every position tried from the
 * front (memchr hops to the next one holding the separator's first byte). */
typedef struct {
    const uint8_t *s, *sep;
    size_t len, nsep;
    size_t pos;  /* where the scan is */
    size_t from; /* where the current document began */
} naive;

static bool sep_at(const naive *m, size_t i) {
    if (m->len - i < m->nsep) return false;
    for (size_t j = 0; j < m->nsep; j++)
        if (m->s[i + j] != m->sep[j]) return false;
    return true;
}

/* The next non-empty document: [*off, *off + *n), and *after, the offset
 * just past the separator that ends it (the text's end for the last). */
static bool naive_next(naive *m, size_t *off, size_t *n, size_t *after) {
    while (m->pos < m->len) {
        if (!sep_at(m, m->pos)) {
            /* (a byte-by-byte loop, under the fuzzer's comparison
             * tracing, took most of the time over the pad's MiB) */
            const uint8_t *c = memchr(m->s + m->pos + 1, m->sep[0], m->len - m->pos - 1);
            m->pos = c ? (size_t)(c - m->s) : m->len;
            continue;
        }
        size_t from = m->from, end = m->pos;
        m->pos = m->from = end + m->nsep;
        if (end > from) {
            *off = from, *n = end - from, *after = m->pos;
            return true;
        }
    }
    if (m->from < m->len) {
        *off = m->from, *n = m->len - m->from, *after = m->len;
        m->from = m->len;
        return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t nsep = (size_t)(data[0] & 15) + 1, at = 1, pad = 0;
    if (data[0] & 0x80) {
        if (size < 2) return 0;
        pad = BLOCK - data[1], at = 2;
    }
    if (size - at < nsep) return 0;
    const uint8_t *sepb = data + at;
    if (memchr(sepb, 0, nsep)) return 0;
    at += nsep;
    if (tmp_plain.fd < 0) tmp_setup();

    char sep[17];
    memcpy(sep, sepb, nsep), sep[nsep] = 0;
    g_sep = sepb, g_nsep = nsep;
    size_t tlen = size - at, len = pad + tlen;
    const uint8_t *file = data + at; /* the file's bytes, for the model */
    tmp_file *tf = &tmp_plain;
    if (pad) {
        if (len > pcap) {
            uint8_t *b = realloc(pbuf, len); /* keeps the NULs */
            if (!b) return 0;
            pbuf = b, pcap = len;
        }
        memset(pbuf + ZEROS, 0, pad - ZEROS);
        memcpy(pbuf + pad, data + at, tlen);
        file = pbuf, tf = &tmp_pad;
        tmp_put(tf, pbuf, ZEROS, len);
    } else {
        tmp_put(tf, file, 0, len);
    }

    rl_docs *d = NULL;
    rl_err e = {0};
    int rc = rl_docs_open(RL_DOCS_TEXT, tf->path, sep, NULL, &d, &e);
    if (rc != RL_OK || !d) fail("rl_docs_open: rc %d: %s", rc, e.msg[0] ? e.msg : "(no message)");
    if (rl_docs_done(d, len) != 0)
        fail("rl_docs_done %llu before the first document", (unsigned long long)rl_docs_done(d, len));

    naive m = {.s = file, .len = len, .sep = sepb, .nsep = nsep};
    for (int k = 0;; k++) {
        const char *t = (const char *)file; /* neither NULL nor 0: next must set both */
        size_t n = 7;
        rc = rl_docs_next(d, &t, &n, &e);
        if (rc != RL_OK)
            fail("rl_docs_next, document %d of a %zu-byte file (pad %zu): rc %d: %s", k, len, pad, rc,
                 e.msg[0] ? e.msg : "(no message)");
        size_t off, want, after;
        if (!naive_next(&m, &off, &want, &after)) {
            if (t || n) fail("document %d: %zu bytes after the last one (the file is %zu bytes)", k, n, len);
            if (rl_docs_done(d, len) != len)
                fail("rl_docs_done %llu at the end of a %zu-byte file", (unsigned long long)rl_docs_done(d, len), len);
            break;
        }
        if (!t) fail("the end after %d documents; want one more, %zu bytes at offset %zu (pad %zu)", k, want, off, pad);
        if (n != want) fail("document %d at offset %zu (pad %zu): %zu bytes, want %zu", k, off, pad, n, want);
        if (memcmp(t, file + off, n) != 0) fail("document %d at offset %zu (pad %zu): other bytes", k, off, pad);
        uint64_t done = rl_docs_done(d, len);
        if (done != after)
            fail("document %d at offset %zu: rl_docs_done %llu, want %zu", k, off, (unsigned long long)done, after);
    }
    rl_docs_close(d);
    return 0;
}
