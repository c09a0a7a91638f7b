/* ringleader-prepare parquet through the real binary and the Arrow reader
 * it loads (make parquet): a Parquet file's string column gives the same
 * shards as the same documents in JSON Lines, byte-level and BPE; bad
 * files name the file (and row), exit 2 and write nothing; a damaged file
 * is refused, never crashes; without the reader the mode says how to
 * build it. The fixtures come from pyarrow (tests/support/make_parquet.py,
 * in the venv make parquet made: $RL_TEST_ARROW_VENV or .venv-arrow). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "testutil.h"
#include "tokjson.h"

static void fixtures(char *dir) {
    cr_assert_not_null(mkdtemp(dir));
    const char *v = getenv("RL_TEST_ARROW_VENV");
    char cmd[1024], err[4096];
    snprintf(cmd, sizeof cmd, "%s/bin/python tests/support/make_parquet.py %s", v && *v ? v : ".venv-arrow", dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "pyarrow (make parquet makes its venv): %s", err);
}

static char *slurp(const char *path, size_t *n) {
    char *b;
    rl_err e = {0};
    cr_assert_eq(rl_read_file(path, &b, n, &e), 0, "%s", e.msg);
    return b;
}

static void same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    cr_expect(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x), free(y);
}

static int prepare(const char *args, char *err, size_t n) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare %s", rl_test_bindir(), args);
    return rl_test_run(cmd, err, n);
}

Test(parquet, a_string_column_gives_the_shards_jsonl_gives, .timeout = 120) {
    char dir[64] = "/tmp/rl_pq_XXXXXX", args[1024], err[4096], a[320], b[320];
    fixtures(dir);
    static const char *const merges[] = {"a", "b", "ab", " ", "o", "c", NULL};
    static const char *const specials[] = {"<|endoftext|>", NULL};
    snprintf(a, sizeof a, "%s/tokenizer.json", dir);
    rl_test_write_tokenizer_json(a, merges, specials);
    for (int bpe = 0; bpe < 2; bpe++) {
        char tok[400] = "";
        if (bpe) snprintf(tok, sizeof tok, "--tokenizer %s/tokenizer.json", dir);
        snprintf(args, sizeof args, "parquet %s --val-fraction 0.1 --shard-tokens 300 --out %s/pq%d %s/a.parquet %s/b.parquet",
                 tok, dir, bpe, dir, dir);
        cr_assert_eq(prepare(args, err, sizeof err), 0, "%s", err);
        snprintf(args, sizeof args, "jsonl %s --val-fraction 0.1 --shard-tokens 300 --out %s/js%d %s/docs.jsonl", tok,
                 dir, bpe, dir);
        cr_assert_eq(prepare(args, err, sizeof err), 0, "%s", err);
        int shards = 0;
        for (int i = 0;; i++, shards++) {
            snprintf(a, sizeof a, "%s/pq%d/train_%06d.bin", dir, bpe, i);
            snprintf(b, sizeof b, "%s/js%d/train_%06d.bin", dir, bpe, i);
            if (access(b, F_OK) != 0) break;
            same_file(a, b);
        }
        cr_expect_gt(shards, 1, "the split over shards is part of the comparison");
        snprintf(a, sizeof a, "%s/pq%d/val_000000.bin", dir, bpe);
        snprintf(b, sizeof b, "%s/js%d/val_000000.bin", dir, bpe);
        same_file(a, b);
        snprintf(a, sizeof a, "%s/pq%d/dataset.json", dir, bpe);
        cr_expect(rl_test_file_has(a, "a.parquet") && rl_test_file_has(a, "\"documents\":\t33"), "%s", a);
    }
    rl_test_rmdir(dir);
}

Test(parquet, bad_files_are_named_with_the_row_and_write_nothing, .timeout = 120) {
    char dir[64] = "/tmp/rl_pq_XXXXXX", args[1024], err[4096], out[200];
    fixtures(dir);
    static const struct {
        const char *file, *field, *says;
    } bad[] = {
        {"null.parquet", "text", "null.parquet: row 1: \"text\" is null, not a string"},
        {"int.parquet", "text", "int.parquet: column \"text\" is int64, not a string"},
        {"nofield.parquet", "text", "nofield.parquet: no column \"text\" (columns: body, id)"},
        {"nested.parquet", "text", "nested.parquet: column \"text\" is struct<a: string>, not a string"},
        {"notparquet.parquet", "text", "notparquet.parquet: "},
        {"a.parquet", "id", "a.parquet: column \"id\" is int64, not a string"},
    };
    snprintf(out, sizeof out, "%s/out", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* a good file first: nothing is written for it either */
        snprintf(args, sizeof args, "parquet --field %s --out %s %s/a.parquet %s/%s", bad[i].field, out, dir, dir,
                 bad[i].file);
        cr_expect_eq(prepare(args, err, sizeof err), 2, "%s: %s", bad[i].file, err);
        cr_expect(strstr(err, bad[i].says) && strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
        cr_expect_neq(access(out, F_OK), 0, "%s: something was written", bad[i].file);
    }
    rl_test_rmdir(dir);
}

/* Every prefix of a real file and a sweep of flipped bytes through the
 * reader in this process (under ASan in make asan): each ends in the
 * documents or one line of RL_EINPUT, nothing else. The parsing itself is
 * Arrow's (fuzzed upstream by OSS-Fuzz); this holds the seam to that. */
Test(parquet, a_damaged_file_is_refused_not_crashed_on, .timeout = 300) {
    char dir[64] = "/tmp/rl_pq_XXXXXX", path[200], lib[4200], cut[200];
    fixtures(dir);
    snprintf(path, sizeof path, "%s/a.parquet", dir);
    snprintf(lib, sizeof lib, "%s/../lib/ringleader/libringleader-parquet.so", rl_test_bindir());
    snprintf(cut, sizeof cut, "%s/cut.parquet", dir);
    size_t n;
    char *good = slurp(path, &n);
    int refused = 0, read = 0;
    for (size_t k = 0; k < n + 2 * n; k += 3) {
        char *b = malloc(n);
        memcpy(b, good, n);
        size_t len = n;
        if (k < n) len = k;                               /* a prefix */
        else b[(k - n) / 2] ^= (char)(1 + (k & 0x7f));    /* one byte flipped */
        rl_test_write(cut, b, len);
        free(b);
        rl_parquet *p;
        rl_err e = {0};
        int rc = rl_parquet_open(lib, cut, "text", &p, &e);
        const char *t;
        size_t tl;
        while (!rc && !(rc = rl_parquet_next(p, &t, &tl, &e)) && t) {}
        if (!rc) rl_parquet_close(p);
        if (!rc) read++;
        else refused++;
        cr_assert(rc == 0 || rc == RL_EINPUT, "cut at %zu: rc %d: %s", k, rc, e.msg);
        cr_assert(rc == 0 || (strstr(e.msg, cut) == e.msg && !strchr(e.msg, '\n')), "%s", e.msg);
        if (rc && p) rl_parquet_close(p);
    }
    cr_expect_gt(refused, (int)n / 3, "the prefixes are refused");
    cr_expect_gt(read, 0, "some flipped bytes only change the text");
    free(good);
    rl_test_rmdir(dir);
}

Test(parquet, without_the_reader_the_mode_says_how_to_build_it) {
    char dir[64] = "/tmp/rl_pq_XXXXXX", cmd[1024], err[4096];
    fixtures(dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/bin && cp %s/ringleader-prepare %s/bin/ && %s/bin/ringleader-prepare "
                              "parquet --out %s/out %s/a.parquet", dir, rl_test_bindir(), dir, dir, dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "make parquet builds it") && strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
    snprintf(cmd, sizeof cmd, "%s/out", dir);
    cr_expect_neq(access(cmd, F_OK), 0);
    rl_test_rmdir(dir);
}
