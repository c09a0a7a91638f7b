/* libFuzzer target: the job config parser (JSON from a user's file). Any
 * input must either parse into a config that passes validation or fail
 * with RL_EINPUT and a one-line message -- never crash, leak or hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    rl_job_config c;
    rl_job_config_default(&c);
    rl_err e = {0};
    int rc = rl_job_config_parse((const char *)data, size, "fuzz.json", &c, &e);
    if (rc != RL_OK && rc != RL_EINPUT) abort();
    if (rc != RL_OK && (strchr(e.msg, '\n') || strncmp(e.msg, "fuzz.json", 9) != 0)) abort();
    if (rc == RL_OK) {
        /* what parsed must round-trip through the writer */
        char *s = rl_job_config_to_json(&c);
        rl_job_config d;
        rl_job_config_default(&d);
        if (rl_job_config_parse(s, strlen(s), "rt", &d, &e) != RL_OK) abort();
        free(s);
    }
    return 0;
}
