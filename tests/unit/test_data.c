/* pkg/data: shards, datasets, sampler, loader, tokenizer, arithmetic corpus.
 * Every test works in its own mkdtemp directory (removed by the suite's
 * fini), so tests run in any order and in parallel. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"

static char g_dir[256];

static void tmp_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/rl_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp failed");
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void tmp_teardown(void) {
    if (g_dir[0]) nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int i;
    char *p = buf[i++ % 4];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A header as llm.c writes it, followed by `ntok` little-endian tokens. */
static size_t make_shard_bytes(unsigned char *buf, int32_t magic, int32_t version,
                               int32_t count, const uint16_t *tok, size_t ntok) {
    memset(buf, 0, RL_SHARD_HEADER_BYTES);
    int32_t w[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) buf[4 * i + b] = (unsigned char)((uint32_t)w[i] >> (8 * b));
    for (size_t i = 0; i < ntok; i++) {
        buf[RL_SHARD_HEADER_BYTES + 2 * i] = (unsigned char)tok[i];
        buf[RL_SHARD_HEADER_BYTES + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    return RL_SHARD_HEADER_BYTES + 2 * ntok;
}

static void write_seq_shard(const char *path, uint16_t first, size_t n) {
    uint16_t *t = calloc(n + 1, sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(first + i);
    rl_err e = {0};
    cr_assert_eq(rl_shard_write(path, t, n, &e), 0, "%s", e.msg);
    free(t);
}

/* Expect opening `pattern` to fail with RL_EINPUT and a message holding
 * both `name` and `phrase`. */
static void expect_open_fails(const char *pattern, const char *name, const char *phrase) {
    rl_dataset *d = NULL;
    rl_err e = {0};
    int rc = rl_dataset_open(pattern, 65536, &d, &e);
    cr_assert_eq(rc, RL_EINPUT, "open %s: rc %d (%s)", pattern, rc, e.msg);
    cr_assert_null(d);
    cr_assert_not_null(strstr(e.msg, name), "message '%s' does not name '%s'", e.msg, name);
    cr_assert_not_null(strstr(e.msg, phrase), "message '%s' lacks '%s'", e.msg, phrase);
    cr_assert_null(strchr(e.msg, '\n'), "message is not one line: %s", e.msg);
}

/* ---- shards and datasets ------------------------------------------------------ */
TestSuite(data_shard, .init = tmp_setup, .fini = tmp_teardown);

Test(data_shard, round_trip_across_shard_boundaries) {
    /* Sizes include an empty shard in the middle; values continue across
     * shards so every token's global position is known. */
    const size_t sizes[] = {5, 0, 7, 1, 3};
    char names[5][64];
    uint16_t next = 100;
    for (int i = 0; i < 5; i++) {
        snprintf(names[i], sizeof names[i], "s_%d.bin", i);
        write_seq_shard(tpath(names[i]), next, sizes[i]);
        next = (uint16_t)(next + sizes[i]);
    }
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(tpath("s_*.bin"), 1000, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_nshards(d), 5);
    cr_assert_eq(rl_dataset_tokens(d), 16);
    int32_t buf[16];
    for (uint64_t off = 0; off <= 16; off++) {
        for (size_t n = 0; off + n <= 16; n++) {
            memset(buf, 0xff, sizeof buf);
            cr_assert_eq(rl_dataset_read(d, off, n, buf, &e), 0, "off %llu n %zu: %s",
                         (unsigned long long)off, n, e.msg);
            for (size_t j = 0; j < n; j++) cr_assert_eq(buf[j], (int32_t)(100 + off + j));
        }
    }
    cr_assert_neq(rl_dataset_read(d, 10, 7, buf, &e), 0, "read past the end must fail");
    rl_dataset_close(d);
}

Test(data_shard, comma_list_is_sorted_and_deduplicated) {
    write_seq_shard(tpath("b.bin"), 10, 3);
    write_seq_shard(tpath("a.bin"), 0, 2);
    char pat[1200];
    snprintf(pat, sizeof pat, "%s, %s,%s", tpath("b.bin"), tpath("a.bin"), tpath("*.bin"));
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(pat, 100, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_nshards(d), 2);
    int32_t buf[5];
    cr_assert_eq(rl_dataset_read(d, 0, 5, buf, &e), 0, "%s", e.msg);
    const int32_t want[5] = {0, 1, 10, 11, 12};
    cr_assert_arr_eq(buf, want, sizeof want);
    rl_dataset_close(d);
}

Test(data_shard, file_bytes_match_llmc_layout) {
    const uint16_t tok[3] = {1, 0x1234, 65535};
    rl_err e = {0};
    cr_assert_eq(rl_shard_write(tpath("x.bin"), tok, 3, &e), 0, "%s", e.msg);
    unsigned char want[RL_SHARD_HEADER_BYTES + 6], got[sizeof want + 1];
    size_t n = make_shard_bytes(want, RL_SHARD_MAGIC, RL_SHARD_VERSION, 3, tok, 3);
    FILE *f = fopen(tpath("x.bin"), "rb");
    cr_assert_not_null(f);
    size_t r = fread(got, 1, sizeof got, f);
    fclose(f);
    cr_assert_eq(r, n);
    cr_assert_arr_eq(got, want, n);
}

Test(data_shard, rejects_wrong_magic) {
    unsigned char buf[RL_SHARD_HEADER_BYTES + 4];
    const uint16_t tok[2] = {1, 2};
    size_t n = make_shard_bytes(buf, 12345, 1, 2, tok, 2);
    write_raw(tpath("m.bin"), buf, n);
    expect_open_fails(tpath("m.bin"), tpath("m.bin"), "not an llm.c token shard");
    expect_open_fails(tpath("m.bin"), tpath("m.bin"), "12345");
    /* A short non-shard is called what it is, not "truncated". */
    write_raw(tpath("t.txt"), "hello world\n", 12);
    expect_open_fails(tpath("t.txt"), tpath("t.txt"), "not an llm.c token shard");
}

Test(data_shard, rejects_wrong_version) {
    unsigned char buf[RL_SHARD_HEADER_BYTES + 4];
    const uint16_t tok[2] = {1, 2};
    size_t n = make_shard_bytes(buf, RL_SHARD_MAGIC, 2, 2, tok, 2);
    write_raw(tpath("v.bin"), buf, n);
    expect_open_fails(tpath("v.bin"), tpath("v.bin"), "version 2");
}

Test(data_shard, rejects_truncated_and_trailing) {
    unsigned char buf[RL_SHARD_HEADER_BYTES + 20];
    const uint16_t tok[10] = {0};
    size_t n = make_shard_bytes(buf, RL_SHARD_MAGIC, 1, 10, tok, 10);
    write_raw(tpath("tr.bin"), buf, n - 3);
    expect_open_fails(tpath("tr.bin"), tpath("tr.bin"),
                      "truncated: header says 10 tokens (1044 bytes) but file has 1041 bytes");
    make_shard_bytes(buf, RL_SHARD_MAGIC, 1, 8, tok, 10);
    write_raw(tpath("tl.bin"), buf, n);
    expect_open_fails(tpath("tl.bin"), tpath("tl.bin"), "has 4 trailing bytes");
}

Test(data_shard, rejects_short_header_and_negative_count) {
    unsigned char buf[RL_SHARD_HEADER_BYTES];
    make_shard_bytes(buf, RL_SHARD_MAGIC, 1, 0, NULL, 0);
    write_raw(tpath("h.bin"), buf, 600);
    expect_open_fails(tpath("h.bin"), tpath("h.bin"), "truncated header");
    write_raw(tpath("e.bin"), buf, 0);
    expect_open_fails(tpath("e.bin"), tpath("e.bin"), "truncated header");

    make_shard_bytes(buf, RL_SHARD_MAGIC, 1, -5, NULL, 0);
    rl_err e = {0};
    uint64_t nt = 99;
    cr_assert_eq(rl_shard_parse_header(buf, sizeof buf, sizeof buf, "neg.bin", &nt, NULL, &e),
                 RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "neg.bin"), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "negative"), "%s", e.msg);
    cr_assert_eq(nt, 99, "output must be untouched on error");
}

Test(data_shard, empty_dataset_is_an_error) {
    write_seq_shard(tpath("z.bin"), 0, 0);
    expect_open_fails(tpath("z.bin"), tpath("z.bin"), "no tokens");
}

Test(data_shard, token_above_vocab_names_file_and_index) {
    const uint16_t tok[4] = {1, 2, 300, 4};
    rl_err e = {0};
    cr_assert_eq(rl_shard_write(tpath("v.bin"), tok, 4, &e), 0, "%s", e.msg);
    rl_dataset *d;
    cr_assert_eq(rl_dataset_open(tpath("v.bin"), 257, &d, &e), 0, "%s", e.msg);
    int32_t buf[4];
    cr_assert_eq(rl_dataset_read(d, 0, 2, buf, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_read(d, 1, 3, buf, &e), RL_EINPUT);
    char want[700];
    snprintf(want, sizeof want, "%s: token 300 at index 2 is >= vocab_size 257", tpath("v.bin"));
    cr_assert_str_eq(e.msg, want);
    rl_dataset_close(d);
    /* The bound is exclusive: vocab_size itself is out, vocab_size-1 is in. */
    cr_assert_eq(rl_dataset_open(tpath("v.bin"), 300, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_read(d, 0, 4, buf, &e), RL_EINPUT);
    rl_dataset_close(d);
    cr_assert_eq(rl_dataset_open(tpath("v.bin"), 301, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_read(d, 0, 4, buf, &e), 0, "%s", e.msg);
    cr_assert_eq(buf[2], 300);
    rl_dataset_close(d);
}

Test(data_shard, unreadable_path_and_unmatched_glob) {
    expect_open_fails(tpath("missing.bin"), tpath("missing.bin"), "cannot open");
    expect_open_fails(g_dir, g_dir, "not a regular file");
    expect_open_fails(tpath("*.nope"), tpath("*.nope"), "no files match");
    /* One bad item fails the whole list, naming that item. */
    write_seq_shard(tpath("ok.bin"), 0, 4);
    char pat[1200];
    snprintf(pat, sizeof pat, "%s,%s", tpath("ok.bin"), tpath("gone_*.bin"));
    expect_open_fails(pat, tpath("gone_*.bin"), "no files match");
}

Test(data_shard, rolling_writer_splits_and_removes_stale) {
    write_seq_shard(tpath("train_000005.bin"), 0, 1); /* not contiguous: kept */
    write_seq_shard(tpath("train_000003.bin"), 0, 1); /* stale from a bigger run */
    write_seq_shard(tpath("train_000002.bin"), 0, 1);
    rl_shard_writer *w;
    rl_err e = {0};
    cr_assert_eq(rl_shard_writer_open(g_dir, "train", 4, 2, &w, &e), 0, "%s", e.msg);
    uint16_t t[10];
    for (int i = 0; i < 10; i++) t[i] = (uint16_t)i;
    cr_assert_eq(rl_shard_writer_add(w, t, 3, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_shard_writer_add(w, t + 3, 7, &e), 0, "%s", e.msg);
    int ns = 0;
    uint64_t nt = 0;
    cr_assert_eq(rl_shard_writer_close(w, &ns, &nt, &e), 0, "%s", e.msg);
    cr_assert_eq(ns, 3);
    cr_assert_eq(nt, 10);
    cr_assert_eq(access(tpath("train_000003.bin"), F_OK), -1);
    cr_assert_eq(access(tpath("train_000005.bin"), F_OK), 0);
    unlink(tpath("train_000005.bin"));
    rl_dataset *d;
    cr_assert_eq(rl_dataset_open(tpath("train_*.bin"), 100, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_nshards(d), 3);
    int32_t buf[10];
    cr_assert_eq(rl_dataset_read(d, 0, 10, buf, &e), 0, "%s", e.msg);
    for (int i = 0; i < 10; i++) cr_assert_eq(buf[i], i);
    rl_dataset_close(d);
}

/* ---- sampler ------------------------------------------------------------------ */
TestSuite(data_sampler);

static void check_epoch_is_permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
    const int T = 3;
    rl_sampler s;
    rl_err e = {0};
    cr_assert_eq(rl_sampler_init(&s, n * (uint64_t)T + 1, T, seed, true, &e), 0, "%s", e.msg);
    cr_assert_eq(s.n_windows, n);
    unsigned char *seen = calloc(n, 1);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = rl_sampler_offset(&s, epoch * n + i);
        cr_assert_eq(off % T, 0);
        uint64_t w = off / T;
        cr_assert_lt(w, n, "n=%llu: window %llu out of range", (unsigned long long)n,
                     (unsigned long long)w);
        cr_assert_eq(seen[w], 0, "n=%llu epoch %llu: window %llu twice", (unsigned long long)n,
                     (unsigned long long)epoch, (unsigned long long)w);
        seen[w] = 1;
    }
    free(seen);
}

Test(data_sampler, every_epoch_is_a_permutation) {
    const uint64_t sizes[] = {1, 2, 7, 1000, 4097};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (uint64_t epoch = 0; epoch < 3; epoch++)
            for (uint64_t seed = 1; seed <= 2; seed++)
                check_epoch_is_permutation(sizes[i], seed, epoch);
}

static int orders_differ(uint64_t n, uint64_t seed_a, uint64_t ep_a, uint64_t seed_b,
                         uint64_t ep_b) {
    rl_sampler a, b;
    rl_err e = {0};
    cr_assert_eq(rl_sampler_init(&a, n * 4 + 1, 4, seed_a, true, &e), 0);
    cr_assert_eq(rl_sampler_init(&b, n * 4 + 1, 4, seed_b, true, &e), 0);
    int diff = 0;
    for (uint64_t i = 0; i < n; i++)
        diff += rl_sampler_offset(&a, ep_a * n + i) != rl_sampler_offset(&b, ep_b * n + i);
    return diff;
}

Test(data_sampler, epochs_and_seeds_change_the_order) {
    const uint64_t sizes[] = {7, 1000, 4097};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_gt(orders_differ(sizes[i], 1, 0, 1, 1), 0, "epochs 0 and 1 equal");
        cr_assert_gt(orders_differ(sizes[i], 1, 1, 1, 2), 0, "epochs 1 and 2 equal");
        cr_assert_gt(orders_differ(sizes[i], 1, 0, 2, 0), 0, "seeds 1 and 2 equal");
        cr_assert_eq(orders_differ(sizes[i], 5, 3, 5, 3), 0, "not deterministic");
    }
    /* A shuffle, not a rotation: most of 1000 positions move. */
    rl_sampler s;
    rl_err e = {0};
    cr_assert_eq(rl_sampler_init(&s, 1000 * 4 + 1, 4, 9, true, &e), 0);
    int fixed = 0;
    for (uint64_t i = 0; i < 1000; i++) fixed += rl_sampler_offset(&s, i) == i * 4;
    cr_assert_lt(fixed, 20);
}

Test(data_sampler, no_shuffle_is_identity) {
    rl_sampler s;
    rl_err e = {0};
    cr_assert_eq(rl_sampler_init(&s, 100, 8, 3, false, &e), 0);
    cr_assert_eq(s.n_windows, 12); /* (100 - 1) / 8 */
    for (uint64_t g = 0; g < 50; g++) cr_assert_eq(rl_sampler_offset(&s, g), (g % 12) * 8);
}

Test(data_sampler, too_few_tokens) {
    rl_sampler s;
    rl_err e = {0};
    cr_assert_eq(rl_sampler_init(&s, 8, 8, 3, true, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "seq_len"), "%s", e.msg);
    cr_assert_eq(rl_sampler_init(&s, 9, 8, 3, true, &e), 0);
    cr_assert_eq(s.n_windows, 1);
}

/* ---- loader ------------------------------------------------------------------- */
TestSuite(data_loader, .init = tmp_setup, .fini = tmp_teardown);

/* Token i of the dataset is i, so a sample is identified by its first token
 * (its offset) and the shifted-target property is checkable directly. The
 * data is split over three shards so windows straddle shard boundaries. */
#define LD_TOKENS 3001
static rl_dataset *open_seq_dataset(void) {
    write_seq_shard(tpath("d_0.bin"), 0, 1000);
    write_seq_shard(tpath("d_1.bin"), 1000, 1333);
    write_seq_shard(tpath("d_2.bin"), 2333, LD_TOKENS - 2333);
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(tpath("d_*.bin"), 65536, &d, &e), 0, "%s", e.msg);
    return d;
}

static rl_loader_opts base_opts(void) {
    rl_loader_opts o = {.batch = 2,
                        .seq_len = 8,
                        .global_batch = 8,
                        .rank_offset = 0,
                        .rank_count = 8,
                        .start = 0,
                        .seed = 42,
                        .shuffle = true,
                        .depth = 3,
                        .timeout_s = 5};
    return o;
}

/* Reads `nmb` micro-batches; records each sample's offset in out[] and
 * checks that inputs are consecutive tokens and targets are inputs + 1. */
static void read_offsets(rl_loader *l, const rl_loader_opts *o, int nmb, int64_t *out) {
    int B = o->batch, T = o->seq_len;
    int32_t *in = malloc(sizeof *in * (size_t)(B * T)), *tg = malloc(sizeof *tg * (size_t)(B * T));
    rl_err e = {0};
    for (int k = 0; k < nmb; k++) {
        cr_assert_eq(rl_loader_next(l, in, tg, &e), 0, "micro-batch %d: %s", k, e.msg);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                cr_assert_eq(in[b * T + t], in[b * T] + t);
                cr_assert_eq(tg[b * T + t], in[b * T + t] + 1, "targets are not shifted inputs");
            }
            cr_assert_eq(in[b * T] % T, 0, "window not aligned to seq_len");
            out[k * B + b] = in[b * T];
        }
    }
    free(in);
    free(tg);
}

Test(data_loader, ranks_partition_the_single_rank_stream) {
    rl_dataset *d = open_seq_dataset();
    const int steps = 50; /* 400 samples: crosses the 375-window epoch */
    rl_loader_opts o1 = base_opts();
    int64_t *ref = malloc(sizeof *ref * (size_t)(steps * 8));
    rl_loader *l;
    rl_err e = {0};
    cr_assert_eq(rl_loader_open(d, &o1, &l, &e), 0, "%s", e.msg);
    read_offsets(l, &o1, steps * 8 / o1.batch, ref);
    rl_loader_close(l);

    int64_t *got = malloc(sizeof *got * (size_t)(steps * 8));
    int64_t *mine = malloc(sizeof *mine * (size_t)(steps * 8));
    const int worlds[] = {1, 2, 4};
    for (int wi = 0; wi < 3; wi++) {
        int W = worlds[wi];
        for (int i = 0; i < steps * 8; i++) got[i] = -1;
        for (int r = 0; r < W; r++) {
            rl_loader_opts o = base_opts();
            o.rank_count = 8 / W;
            o.rank_offset = r * o.rank_count;
            int accum = o.rank_count / o.batch, nmb = steps * accum;
            cr_assert_eq(rl_loader_open(d, &o, &l, &e), 0, "%s", e.msg);
            read_offsets(l, &o, nmb, mine);
            rl_loader_close(l);
            /* Place each sample at its global index per data.h's formula. */
            for (int k = 0; k < nmb; k++)
                for (int j = 0; j < o.batch; j++) {
                    int g = (k / accum) * o.global_batch + o.rank_offset + (k % accum) * o.batch + j;
                    cr_assert_eq(got[g], -1, "world %d: sample %d read by two ranks", W, g);
                    got[g] = mine[k * o.batch + j];
                }
        }
        for (int g = 0; g < steps * 8; g++)
            cr_assert_eq(got[g], ref[g], "world %d: sample %d differs from 1 rank", W, g);
    }
    /* Sanity on the reference: one epoch of 375 windows has no repeats. */
    for (int a = 0; a < 375; a++)
        for (int b = a + 1; b < 375; b++) cr_assert_neq(ref[a], ref[b]);
    free(ref);
    free(got);
    free(mine);
    rl_dataset_close(d);
}

Test(data_loader, resumes_exactly_from_position) {
    rl_dataset *d = open_seq_dataset();
    rl_loader_opts o = base_opts();
    rl_loader *a, *b;
    rl_err e = {0};
    cr_assert_eq(rl_loader_open(d, &o, &a, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_loader_position(a), 0);
    int64_t first[24], rest_a[32], rest_b[32];
    read_offsets(a, &o, 12, first); /* 3 optimizer steps of 4 micro-batches */
    uint64_t pos = rl_loader_position(a);
    cr_assert_eq(pos, 3 * 8);
    read_offsets(a, &o, 16, rest_a);
    rl_loader_close(a);

    o.start = pos;
    o.depth = 1;
    cr_assert_eq(rl_loader_open(d, &o, &b, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_loader_position(b), pos);
    read_offsets(b, &o, 16, rest_b);
    rl_loader_close(b);
    cr_assert_arr_eq(rest_a, rest_b, sizeof rest_a);

    /* Mid-step positions follow the micro-batch formula. */
    rl_loader_opts o2 = base_opts();
    o2.rank_offset = 4;
    o2.rank_count = 4;
    cr_assert_eq(rl_loader_open(d, &o2, &a, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_loader_position(a), 4);
    read_offsets(a, &o2, 1, first);
    cr_assert_eq(rl_loader_position(a), 6);
    read_offsets(a, &o2, 1, first);
    cr_assert_eq(rl_loader_position(a), 12);
    rl_loader_close(a);
    rl_dataset_close(d);
}

Test(data_loader, close_with_full_ring_is_prompt) {
    rl_dataset *d = open_seq_dataset();
    rl_loader_opts o = base_opts();
    o.depth = 1;
    rl_loader *l;
    rl_err e = {0};
    cr_assert_eq(rl_loader_open(d, &o, &l, &e), 0, "%s", e.msg);
    /* Let the producer fill its one slot and block waiting for room. */
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    double t0 = rl_now();
    rl_loader_close(l);
    double dt = rl_now() - t0;
    cr_assert_lt(dt, 0.25, "close took %.3f s", dt);
    rl_dataset_close(d);
}

Test(data_loader, bad_token_surfaces_from_next) {
    uint16_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (uint16_t)(i % 10);
    tok[9] = 77; /* in window 2 (tokens 8..12) of seq_len 4 */
    rl_err e = {0};
    cr_assert_eq(rl_shard_write(tpath("bad.bin"), tok, 40, &e), 0, "%s", e.msg);
    rl_dataset *d;
    cr_assert_eq(rl_dataset_open(tpath("bad.bin"), 10, &d, &e), 0, "%s", e.msg);
    rl_loader_opts o = base_opts();
    o.batch = 1;
    o.seq_len = 4;
    o.global_batch = 1;
    o.rank_count = 1;
    o.shuffle = false;
    rl_loader *l;
    cr_assert_eq(rl_loader_open(d, &o, &l, &e), 0, "%s", e.msg);
    int32_t in[4], tg[4];
    cr_assert_eq(rl_loader_next(l, in, tg, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_loader_next(l, in, tg, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_loader_next(l, in, tg, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, tpath("bad.bin")), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "token 77 at index 9"), "%s", e.msg);
    cr_assert_eq(rl_loader_position(l), 2, "the failed micro-batch must not be consumed");
    /* Later calls fail the same way at once instead of waiting. */
    double t0 = rl_now();
    cr_assert_eq(rl_loader_next(l, in, tg, &e), RL_EINPUT);
    cr_assert_lt(rl_now() - t0, 0.5);
    rl_loader_close(l);
    rl_dataset_close(d);
}

Test(data_loader, rejects_bad_options_by_name) {
    rl_dataset *d = open_seq_dataset();
    struct {
        const char *name;
        rl_loader_opts o;
    } cases[9];
    for (int i = 0; i < 9; i++) cases[i].o = base_opts();
    cases[0].name = "batch", cases[0].o.batch = 0;
    cases[1].name = "seq_len", cases[1].o.seq_len = 0;
    cases[2].name = "global_batch", cases[2].o.global_batch = 0;
    cases[3].name = "rank_count", cases[3].o.rank_count = 3;
    cases[4].name = "rank_offset", cases[4].o.rank_offset = -2;
    cases[5].name = "rank_offset", cases[5].o.rank_offset = 2;
    cases[6].name = "depth", cases[6].o.depth = 0;
    cases[7].name = "timeout_s", cases[7].o.timeout_s = 0;
    cases[8].name = "seq_len", cases[8].o.seq_len = 5000; /* longer than the data */
    for (int i = 0; i < 9; i++) {
        rl_loader *l = (rl_loader *)1;
        rl_err e = {0};
        cr_assert_eq(rl_loader_open(d, &cases[i].o, &l, &e), RL_EINPUT, "case %d", i);
        cr_assert_null(l);
        cr_assert_not_null(strstr(e.msg, cases[i].name), "case %d: '%s'", i, e.msg);
    }
    rl_dataset_close(d);
}

/* ---- tokenizer ------------------------------------------------------------------ */
Test(data_tok, round_trip_all_bytes) {
    unsigned char src[256];
    for (int i = 0; i < 256; i++) src[i] = (unsigned char)(255 - i);
    uint16_t t16[256];
    rl_tok_encode(src, 256, t16);
    int32_t t32[258];
    t32[0] = RL_TOK_EOT;
    for (int i = 0; i < 256; i++) t32[i + 1] = t16[i];
    t32[257] = 5000; /* not a byte: skipped */
    char out[300];
    cr_assert_eq(rl_tok_decode(t32, 258, out, sizeof out), 256);
    cr_assert_arr_eq(out, src, 256);
    cr_assert_eq(out[256], '\0');
    /* Truncation keeps room for the terminator. */
    cr_assert_eq(rl_tok_decode(t32, 258, out, 4), 3);
    cr_assert_eq(out[3], '\0');
    cr_assert_eq(rl_tok_decode(t32, 258, out, 0), 0);
}

/* ---- arithmetic corpus ---------------------------------------------------------- */
TestSuite(data_arith, .init = tmp_setup, .fini = tmp_teardown);

static char *read_split(const char *pattern, uint64_t *ntok) {
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(pattern, RL_TOK_VOCAB, &d, &e), 0, "%s", e.msg);
    uint64_t n = rl_dataset_tokens(d);
    int32_t *t = malloc(sizeof *t * n);
    cr_assert_eq(rl_dataset_read(d, 0, n, t, &e), 0, "%s", e.msg);
    char *s = malloc(n + 1);
    cr_assert_eq(rl_tok_decode(t, n, s, n + 1), n, "corpus holds non-byte tokens");
    free(t);
    rl_dataset_close(d);
    *ntok = n;
    return s;
}

Test(data_arith, heldout_split_and_correct_sums) {
    const rl_arith_opts o = {.digits = 2, .holdout = 0.2, .seed = 7, .train_tokens = 30000};
    rl_err e = {0};
    cr_assert_eq(rl_arith_generate(&o, g_dir, &e), 0, "%s", e.msg);
    int held[100][100] = {{0}}, nheld = 0;
    for (int a = 0; a < 100; a++)
        for (int b = 0; b < 100; b++) nheld += held[a][b] = rl_arith_is_heldout(&o, a, b);
    cr_assert(nheld > 1500 && nheld < 2500, "held-out fraction off: %d of 10000", nheld);

    uint64_t ntrain, nval;
    char *train = read_split(tpath("train_*.bin"), &ntrain);
    char *val = read_split(tpath("val_*.bin"), &nval);
    cr_assert_geq(ntrain, o.train_tokens);
    cr_assert_lt(ntrain, o.train_tokens + 9, "at most one line beyond train_tokens");

    int seen_val[100][100] = {{0}};
    for (int split = 0; split < 2; split++) {
        char *s = split ? val : train;
        int lines = 0;
        for (char *save = NULL, *ln = strtok_r(s, "\n", &save); ln;
             ln = strtok_r(NULL, "\n", &save), lines++) {
            int a, b, c, used = 0;
            cr_assert_eq(sscanf(ln, "%d+%d=%d%n", &a, &b, &c, &used), 3, "bad line '%s'", ln);
            cr_assert_eq((size_t)used, strlen(ln), "junk in line '%s'", ln);
            cr_assert(a >= 0 && a < 100 && b >= 0 && b < 100, "'%s' out of range", ln);
            cr_assert_eq(a + b, c, "wrong sum '%s'", ln);
            if (split == 0) {
                cr_assert(!held[a][b], "held-out pair %d+%d in train", a, b);
            } else {
                cr_assert(held[a][b], "train pair %d+%d in val", a, b);
                cr_assert_eq(seen_val[a][b]++, 0, "pair %d+%d twice in val", a, b);
            }
        }
        if (split == 1) cr_assert_eq(lines, nheld, "val must hold every held-out pair");
    }
    free(train);
    free(val);
}

Test(data_arith, deterministic_and_validated) {
    rl_arith_opts o = {.digits = 1, .holdout = 0.3, .seed = 3, .train_tokens = 500};
    rl_err e = {0};
    char d1[600], d2[600];
    snprintf(d1, sizeof d1, "%s/one", g_dir);
    snprintf(d2, sizeof d2, "%s/two", g_dir);
    cr_assert_eq(rl_arith_generate(&o, d1, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_arith_generate(&o, d2, &e), 0, "%s", e.msg);
    const char *names[] = {"train_000000.bin", "val_000000.bin"};
    for (int i = 0; i < 2; i++) {
        char p1[700], p2[700], *b1, *b2;
        size_t n1, n2;
        snprintf(p1, sizeof p1, "%s/%s", d1, names[i]);
        snprintf(p2, sizeof p2, "%s/%s", d2, names[i]);
        cr_assert_eq(rl_read_file(p1, &b1, &n1, &e), 0, "%s", e.msg);
        cr_assert_eq(rl_read_file(p2, &b2, &n2, &e), 0, "%s", e.msg);
        cr_assert_eq(n1, n2);
        cr_assert_arr_eq(b1, b2, n1, "%s differs between identical runs", names[i]);
        free(b1);
        free(b2);
    }
    rl_arith_opts bad = o;
    bad.digits = 5;
    cr_assert_eq(rl_arith_generate(&bad, d1, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "digits"), "%s", e.msg);
    bad = o;
    bad.holdout = 1.0;
    cr_assert_eq(rl_arith_generate(&bad, d1, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "holdout"), "%s", e.msg);
    bad = o;
    bad.train_tokens = 0;
    cr_assert_eq(rl_arith_generate(&bad, d1, &e), RL_EINPUT);
    cr_assert_not_null(strstr(e.msg, "train_tokens"), "%s", e.msg);
}

/* llm.c's uint32 format (magic 20240801, version 7: Llama 3's 128k
 * vocabulary). The rolling writer at 4 bytes a token writes it; ids above
 * 65535 read back intact and are checked against vocab_size as uint16 ones
 * are; a uint16 writer refuses an id that does not fit and publishes
 * nothing; a header mixing the two formats is refused. */
Test(data_shard, uint32_shards_hold_ids_above_65535) {
    rl_err e = {0};
    rl_shard_writer *w;
    const uint32_t t[8] = {0, 65535, 65536, 128255, 7, 100000, 3, 128000};
    cr_assert_eq(rl_shard_writer_open(tpath("w32"), "train", 5, 4, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_shard_writer_add32(w, t, 8, &e), 0, "%s", e.msg);
    int ns = 0;
    uint64_t nt = 0;
    cr_assert_eq(rl_shard_writer_close(w, &ns, &nt, &e), 0, "%s", e.msg);
    cr_assert(ns == 2 && nt == 8, "%d shards, %llu tokens", ns, (unsigned long long)nt);
    unsigned char h[12];
    FILE *f = fopen(tpath("w32/train_000000.bin"), "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(h, 1, 12, f), 12);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    uint32_t hw[3];
    for (int i = 0; i < 3; i++) hw[i] = h[4 * i] | h[4 * i + 1] << 8 | h[4 * i + 2] << 16 | (uint32_t)h[4 * i + 3] << 24;
    cr_assert(hw[0] == RL_SHARD32_MAGIC && hw[1] == RL_SHARD32_VERSION && hw[2] == 5 && size == 1024 + 4 * 5,
              "header %u %u %u, %ld bytes", hw[0], hw[1], hw[2], size);

    rl_dataset *d;
    int32_t got[8];
    cr_assert_eq(rl_dataset_open(tpath("w32/train_*.bin"), 128256, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_tokens(d), 8);
    cr_assert_eq(rl_dataset_read(d, 0, 8, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 8; i++) cr_expect_eq((uint32_t)got[i], t[i], "token %d: %d", i, got[i]);
    rl_dataset_close(d);
    cr_assert_eq(rl_dataset_open(tpath("w32/train_*.bin"), 100000, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_read(d, 0, 8, got, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "train_000000.bin: token 128255 at index 3 is >= vocab_size 100000"), "%s", e.msg);
    rl_dataset_close(d);

    const uint32_t big[2] = {1, 70000};
    cr_assert_eq(rl_shard_writer_open(tpath("w16"), "train", 100, 2, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_shard_writer_add32(w, big, 2, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "token id 70000 does not fit a uint16 shard"), "%s", e.msg);
    rl_shard_writer_abort(w);
    cr_expect_neq(access(tpath("w16/train_000000.bin"), F_OK), 0, "a refused shard was published");

    unsigned char buf[RL_SHARD_HEADER_BYTES + 8];
    const uint16_t tok[4] = {1, 2, 3, 4};
    size_t n = make_shard_bytes(buf, RL_SHARD32_MAGIC, 1, 2, tok, 4);
    write_raw(tpath("mix.bin"), buf, n);
    expect_open_fails(tpath("mix.bin"), tpath("mix.bin"), "unsupported shard version 1 for magic 20240801");
    make_shard_bytes(buf, RL_SHARD32_MAGIC, RL_SHARD32_VERSION, 4, tok, 4); /* 8 bytes: 2 uint32 tokens */
    write_raw(tpath("short32.bin"), buf, n);
    expect_open_fails(tpath("short32.bin"), tpath("short32.bin"),
                      "truncated: header says 4 tokens (1040 bytes) but file has 1032 bytes");
}

/* JSON Lines: documents in order with their lines; blank lines skipped; a
 * last line without its newline counts; escapes decoded to UTF-8. Bad
 * lines name the file and line: too long (before more is read), a raw NUL,
 * a missing file. */
Test(data_jsonl, reads_documents_and_names_bad_lines) {
    const char *good = "{\"text\":\"one\"}\n\n{\"id\":1,\"text\":\"t\\u00e9\"}\n{\"text\":\"end\"}";
    write_raw(tpath("a.jsonl"), good, strlen(good));
    rl_jsonl *j;
    rl_err e = {0};
    cr_assert_eq(rl_jsonl_open(tpath("a.jsonl"), "text", 0, &j, &e), 0, "%s", e.msg);
    const char *want[3] = {"one", "t\xc3\xa9", "end"};
    const long long lines[3] = {1, 3, 4};
    const char *t;
    size_t n;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rl_jsonl_next(j, &t, &n, &e), 0, "%s", e.msg);
        cr_assert(t && n == strlen(want[i]) && !memcmp(t, want[i], n), "document %d: %s", i, t ? t : "(end)");
        cr_expect_eq(rl_jsonl_line(j), lines[i]);
    }
    cr_assert_eq(rl_jsonl_next(j, &t, &n, &e), 0, "%s", e.msg);
    cr_assert_null(t);
    rl_jsonl_close(j);

    const char *longl = "{\"text\":\"ok\"}\n{\"text\":\"a line too long\"}\n";
    write_raw(tpath("b.jsonl"), longl, strlen(longl));
    cr_assert_eq(rl_jsonl_open(tpath("b.jsonl"), "text", 16, &j, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_jsonl_next(j, &t, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_jsonl_next(j, &t, &n, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "b.jsonl:2: line longer than 16 bytes"), "%s", e.msg);
    rl_jsonl_close(j);

    write_raw(tpath("c.jsonl"), "{\"text\":\"a\0b\"}\n", 15);
    cr_assert_eq(rl_jsonl_open(tpath("c.jsonl"), "text", 0, &j, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_jsonl_next(j, &t, &n, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "c.jsonl:1: a NUL byte in the line"), "%s", e.msg);
    rl_jsonl_close(j);

    cr_assert_eq(rl_jsonl_open(tpath("gone.jsonl"), "text", 0, &j, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "gone.jsonl: cannot open"), "%s", e.msg);
}

/* Text cut at a separator, read in 1 MiB blocks: over 3 MiB of documents
 * of random lengths (some longer than a block), separators put astride
 * each block boundary, two in a row, one first and one last: the
 * documents are what cutting the whole text in memory gives, empty ones
 * skipped, for a one-byte and a long separator. */
Test(data_docs, text_cut_at_a_separator_across_block_boundaries) {
    static const char *const seps[] = {"\x1e", "\n<|endoftext|>\n"};
    for (int s = 0; s < 2; s++) {
        const char *sep = seps[s];
        size_t ns = strlen(sep), cap = (size_t)4 << 20, len = 0;
        char *text = malloc(cap);
        uint64_t x = 12345;
        memcpy(text, sep, ns), len = ns; /* one first */
        while (len < ((size_t)3 << 20) + 100) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t doc = (x >> 33) % 300 == 0 ? (x >> 40) % 1500000 : (x >> 40) % 3000;
            size_t block = (len / (1 << 20) + 1) << 20; /* the next block boundary */
            if ((x >> 20) % 3 == 0 && block > len + ns && block - len - 1 < 3000) doc = block - len - 1; /* astride */
            for (size_t i = 0; i < doc && len < cap - 2 * ns; i++, len++) text[len] = (char)('a' + (i * 7 + len) % 26);
            memcpy(text + len, sep, ns), len += ns;
            if ((x >> 50) % 7 == 0) memcpy(text + len, sep, ns), len += ns; /* two in a row */
        }
        write_raw(tpath("split.txt"), text, len);
        rl_docs *d;
        rl_err e = {0};
        cr_assert_eq(rl_docs_open(RL_DOCS_TEXT, tpath("split.txt"), sep, NULL, &d, &e), 0, "%s", e.msg);
        size_t at = 0, longest = 0;
        int ndocs = 0;
        for (;;) {
            /* the next document by a plain scan of the whole text */
            while (at + ns <= len && !memcmp(text + at, sep, ns)) at += ns;
            const char *hit = at < len ? memmem(text + at, len - at, sep, ns) : NULL;
            size_t end = hit ? (size_t)(hit - text) : len;
            const char *t;
            size_t n;
            cr_assert_eq(rl_docs_next(d, &t, &n, &e), 0, "%s", e.msg);
            if (at >= len) {
                cr_assert_null(t, "a document after the last one");
                break;
            }
            cr_assert(t && n == end - at && !memcmp(t, text + at, n), "separator %d, document %d at %zu: %zu bytes, want %zu",
                      s, ndocs, at, t ? n : 0, end - at);
            cr_expect_eq(rl_docs_done(d, len), (uint64_t)(hit ? end + ns : len), "progress after document %d", ndocs);
            ndocs++, at = end, longest = n > longest ? n : longest;
        }
        cr_expect(ndocs > 300 && longest > (1u << 20), "%d documents, the longest %zu bytes", ndocs, longest);
        rl_docs_close(d);
        free(text);
    }
    /* an empty separator finds nothing to cut at: refused, not a loop */
    rl_docs *d = NULL;
    rl_err e = {0};
    cr_expect_eq(rl_docs_open(RL_DOCS_TEXT, tpath("split.txt"), "", NULL, &d, &e), RL_EINPUT);
    cr_expect(d == NULL && strstr(e.msg, "split.txt") && strstr(e.msg, "empty separator"), "%s", e.msg);
}

/* dataset.json against the job: the tokenizer's identity, its vocabulary
 * against the model's, and the EOS it names. */
Test(data_meta, dataset_json_must_name_the_jobs_tokenizer_and_fit_the_model) {
    static const char sha_a[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    static const char sha_b[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    char bpe[400];
    snprintf(bpe, sizeof bpe,
             "{\"tokenizer\":{\"type\":\"bpe\",\"file\":\"a/tokenizer.json\",\"sha256\":\"%s\",\"vocab_size\":300},"
             "\"eos_id\":0}", sha_a);
    static const char bytes[] = "{\"tokenizer\":{\"type\":\"byte-level\",\"vocab_size\":257},\"eos_id\":256}";
    rl_err e = {0};
    int64_t eos;
    cr_assert_eq(rl_dataset_meta_check(bpe, strlen(bpe), "d/dataset.json", sha_a, "t.json", 300, &eos, &e), 0, "%s", e.msg);
    cr_expect_eq(eos, 0);
    cr_assert_eq(rl_dataset_meta_check(bytes, strlen(bytes), "d/dataset.json", NULL, "", 257, &eos, &e), 0, "%s", e.msg);
    cr_expect_eq(eos, 256);
    /* another tokenizer: both named */
    cr_assert_eq(rl_dataset_meta_check(bpe, strlen(bpe), "d/dataset.json", sha_b, "b.json", 300, &eos, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "b.json") && strstr(e.msg, "a/tokenizer.json") && strstr(e.msg, "bbbbbbbbbbbb") &&
              strstr(e.msg, "aaaaaaaaaaaa"), "%s", e.msg);
    /* BPE shards, no data.tokenizer; byte shards with one */
    cr_assert_eq(rl_dataset_meta_check(bpe, strlen(bpe), "d/dataset.json", NULL, "", 300, &eos, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "data.tokenizer: unset") && strstr(e.msg, "a/tokenizer.json"), "%s", e.msg);
    cr_assert_eq(rl_dataset_meta_check(bytes, strlen(bytes), "d/dataset.json", sha_a, "t.json", 300, &eos, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "byte-level"), "%s", e.msg);
    /* a model too small for the ids */
    cr_assert_eq(rl_dataset_meta_check(bpe, strlen(bpe), "d/dataset.json", sha_a, "t.json", 299, &eos, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "model.vocab_size: 299") && strstr(e.msg, "300"), "%s", e.msg);
    /* not a dataset.json, an EOS outside the vocabulary */
    cr_assert_eq(rl_dataset_meta_check("[1]", 3, "d/dataset.json", NULL, "", 300, &eos, &e), RL_EINPUT);
    cr_expect(!strncmp(e.msg, "d/dataset.json: ", 16), "%s", e.msg);
    static const char far[] = "{\"tokenizer\":{\"type\":\"byte-level\",\"vocab_size\":257},\"eos_id\":257}";
    cr_assert_eq(rl_dataset_meta_check(far, strlen(far), "d/dataset.json", NULL, "", 300, &eos, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "eos_id"), "%s", e.msg);
}
