/* libFuzzer target for rl_jsonl_parse_line, the parser every line of a
 * JSON Lines corpus goes through (ringleader-prepare jsonl). The input is
 * one line's bytes. Besides memory safety (a heap copy of exactly the
 * line, no terminator, so ASan sees any over-read), it checks the
 * contract: on success a NUL-terminated text of the stated length; on
 * failure RL_EINPUT, no text, and one line naming where. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *line = malloc(size ? size : 1);
    if (!line) return 0;
    if (size) memcpy(line, data, size);
    char *text = (char *)1;
    size_t len = 7;
    rl_err e = {0};
    int rc = rl_jsonl_parse_line(line, size, "text", "fuzz.jsonl:1", &text, &len, &e);
    if (rc == RL_OK) {
        if (!text || strlen(text) != len) abort();
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT || text || len) abort();
        if (strncmp(e.msg, "fuzz.jsonl:1: ", 14) != 0 || strchr(e.msg, '\n')) abort();
    }
    free(text);
    free(line);
    return 0;
}
