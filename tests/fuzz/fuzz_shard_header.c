/* libFuzzer target for rl_shard_parse_header, the one parser in pkg/data
 * that sees raw file bytes. Input layout: 8 bytes of little-endian claimed
 * file size, then the header bytes. Inputs shorter than 8 bytes are used
 * whole as the header with file_size = len, so tiny inputs still reach the
 * short-header paths. Besides memory safety, it checks the contract: on
 * success the size matches the count at the format's token width exactly; on failure the code is
 * RL_EINPUT, the output is untouched and the message is one line naming the
 * file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t file_size = size;
    const uint8_t *hdr = data;
    size_t len = size;
    if (size >= 8) {
        file_size = 0;
        for (int i = 0; i < 8; i++) file_size |= (uint64_t)data[i] << (8 * i);
        hdr = data + 8;
        len = size - 8;
    }
    /* A heap copy of exactly len bytes lets ASan catch any over-read. */
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return 0;
    if (len) memcpy(buf, hdr, len);
    rl_err e = {0};
    uint64_t ntok = UINT64_MAX;
    int tb = -1;
    int rc = rl_shard_parse_header(buf, len, file_size, "fuzz.bin", &ntok, &tb, &e);
    if (rc == RL_OK) {
        if (ntok > RL_SHARD_MAX_TOKENS || (tb != 2 && tb != 4) ||
            file_size != RL_SHARD_HEADER_BYTES + (uint64_t)tb * ntok || len < RL_SHARD_HEADER_BYTES)
            abort();
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT || ntok != UINT64_MAX || tb != -1) abort();
        if (strncmp(e.msg, "fuzz.bin: ", 10) != 0 || strchr(e.msg, '\n')) abort();
    }
    free(buf);
    return 0;
}
