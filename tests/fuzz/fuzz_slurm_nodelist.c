/* libFuzzer target for rl_slurm_first_host (SLURM_JOB_NODELIST comes from
 * the environment, so it is untrusted text). The first input byte picks
 * the output size (1..64), the rest is the list. Contract: on success the
 * host is non-empty, fits, and is made only of host characters from the
 * input; on failure the code is RL_EINPUT, the output is "" and the message
 * is one line about the node list. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/rdzv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t n = (size_t)(data[0] % 64) + 1;
    size_t len = size - 1;
    char *list = malloc(len + 1);
    char *out = malloc(n);
    if (!list || !out) abort();
    memcpy(list, data + 1, len);
    list[len] = '\0'; /* an embedded NUL just ends the list early */
    memset(out, 'Z', n);
    rl_err e = {0};
    int rc = rl_slurm_first_host(list, out, n, &e);
    if (rc == RL_OK) {
        size_t hl = strnlen(out, n);
        if (hl == 0 || hl >= n) abort();
        for (size_t i = 0; i < hl; i++) {
            char c = out[i];
            if (!(isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_')) abort();
            if (!strchr(list, c)) abort();
        }
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT || out[0] != '\0') abort();
        if (strncmp(e.msg, "SLURM node list", 15) != 0 || strchr(e.msg, '\n')) abort();
    }
    free(list);
    free(out);
    return 0;
}
