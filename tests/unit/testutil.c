#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/data.h"

void rl_test_arith_dir(char *dir, size_t n, uint64_t tokens) {
    snprintf(dir, n, "/tmp/rltest-XXXXXX");
    cr_assert(mkdtemp(dir) != NULL);
    rl_arith_opts o = {.digits = 2, .holdout = 0.1, .seed = 7, .train_tokens = tokens};
    rl_err e;
    cr_assert_eq(rl_arith_generate(&o, dir, &e), 0, "%s", e.msg);
}

void rl_test_rmdir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

const char *rl_test_bindir(void) {
    static char abs[4096];
    const char *b = getenv("RL_TEST_BIN");
    if (!realpath(b && *b ? b : "bin", abs)) cr_assert_fail("binaries not found: build them first");
    return abs;
}

int rl_test_run(const char *cmd, char *err, size_t n) {
    char errfile[] = "/tmp/rltest-err-XXXXXX";
    int fd = mkstemp(errfile);
    cr_assert(fd >= 0);
    close(fd);
    char full[4096];
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, errfile);
    int st = system(full);
    FILE *f = fopen(errfile, "r");
    size_t got = f ? fread(err, 1, n - 1, f) : 0;
    err[got] = '\0';
    if (f) fclose(f);
    unlink(errfile);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void rl_test_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}
