/* libFuzzer target for rl_dataset_meta_check, the reader of the
 * dataset.json a trainer finds beside its shards. The input is the file's
 * bytes (a heap copy of exactly them, no terminator). Checked against a
 * BPE job and a byte-level one: on success the EOS it hands back is -1 or
 * a non-negative id; on failure RL_EINPUT and one line with no newline. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    static const char sha[] = "506b36d50330e1a45c3c3a8b3e4f0c6f2a8b5d1e9c7f3a2b1d0e9f8a7b6c5d4e";
    for (int k = 0; k < 2; k++) {
        rl_err e = {0};
        int64_t eos = 7;
        int rc = rl_dataset_meta_check(buf, size, "fuzz/dataset.json", k ? sha : NULL, "tok.json", 50000, &eos, &e);
        if (rc == RL_OK) {
            if (eos < -1) abort();
        } else if (rc != RL_EINPUT || e.code != RL_EINPUT || strchr(e.msg, '\n') || !e.msg[0]) {
            abort();
        }
    }
    free(buf);
    return 0;
}
