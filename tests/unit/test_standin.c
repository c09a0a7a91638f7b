/* standin: faithfulness of the local Kubernetes API stand-in (work in progress). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "standin.h"

Test(standin, contract_files_and_kubectl, .timeout = 60) {
    rl_test_standin s;
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0);
    struct stat sb;
    cr_assert_eq(stat(s.token_file, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0600);
    cr_assert_eq(access(s.ca_file, R_OK), 0);
    char out[8192];
    int rc = rl_test_kubectl(&s, "get ns default -o name", NULL, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "namespace/default\n");
    cr_assert_eq(rl_test_standin_admin(&s, "GET", "/state", NULL, out, sizeof out), 200);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", s.dir);
    int pid = s.pid;
    rl_test_standin_stop(&s);
    cr_assert_neq(kill(pid, 0), 0, "the server outlived stop");
    cr_assert_neq(access(dir, F_OK), 0, "the temp dir outlived stop");
}
