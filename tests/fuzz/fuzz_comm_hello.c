/* libFuzzer target for what a tcp ring peer (or a stranger on its port)
 * controls: the 32-byte hello frame (rl_comm_tcp_parse_hello, then
 * rl_comm_tcp_check_hello) and, when the first byte is 'R', the address
 * record a rank publishes in the store (rl_comm_tcp_parse_record).
 *
 * Besides memory safety it checks the contract: a hello that parses
 * re-encodes to exactly the input bytes (no field is ignored) and has
 * rank < world; a failure is RL_EINPUT with one line naming the peer and
 * leaves the output untouched; a record that parses has a port in 1..65535,
 * a world >= 1 and a non-empty host of printable characters that fits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(const rl_err *e, const char *must) {
    if (strchr(e->msg, '\n') || !strstr(e->msg, must)) abort();
}

static void fuzz_record(const uint8_t *data, size_t size) {
    char *rec = malloc(size + 1);
    if (!rec) return;
    memcpy(rec, data, size);
    rec[size] = '\0';
    char host[64];
    memset(host, 0x5a, sizeof host);
    int port = -7, world = -7;
    rl_err e = {0};
    int rc = rl_comm_tcp_parse_record(rec, "fuzz/addr/1", host, sizeof host, &port, &world, &e);
    if (rc == RL_OK) {
        size_t hl = strnlen(host, sizeof host);
        if (hl == 0 || hl >= sizeof host || port < 1 || port > 65535 || world < 1) abort();
        for (size_t i = 0; i < hl; i++)
            if (host[i] <= ' ' || host[i] >= 0x7f) abort(); /* safe to print in messages */
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT || port != -7 || world != -7) abort();
        one_line(&e, "fuzz/addr/1");
    }
    free(rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'R') {
        fuzz_record(data + 1, size - 1);
        return 0;
    }
    /* A heap copy of exactly size bytes lets ASan catch any over-read. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    rl_comm_hello h, untouched;
    memset(&h, 0xa5, sizeof h);
    memcpy(&untouched, &h, sizeof h);
    rl_err e = {0};
    int rc = rl_comm_tcp_parse_hello(buf, size, "10.0.0.9:4711", &h, &e);
    if (rc == RL_OK) {
        if (size != RL_COMM_HELLO_BYTES || h.rank >= h.world || h.version != RL_COMM_HELLO_VERSION)
            abort();
        uint8_t again[RL_COMM_HELLO_BYTES];
        rl_comm_tcp_encode_hello(again, &h);
        if (memcmp(again, buf, RL_COMM_HELLO_BYTES) != 0) abort();
        /* checking against expectations never fails any other way */
        rc = rl_comm_tcp_check_hello(&h, 4, 1, 0x0123456789abcdefull, "10.0.0.9:4711", &e);
        if (rc != RL_OK && (rc != RL_EPEER || e.code != RL_EPEER)) abort();
        if (rc) one_line(&e, "10.0.0.9:4711");
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT) abort();
        if (memcmp(&h, &untouched, sizeof h) != 0) abort();
        one_line(&e, "hello from 10.0.0.9:4711");
    }
    free(buf);
    return 0;
}
