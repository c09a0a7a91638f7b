/* libFuzzer target for what a tcp ring peer (or a stranger on its port)
 * controls: a 96-byte handshake frame (rl_comm_tcp_parse_hello, then
 * rl_comm_tcp_check_hello); when the first byte is 'A' or 'C', a whole
 * exchange: the rest, cut into frames, is what the accepting or the
 * connecting end of a link receives (rl_comm_tcp_hs_step); when it is
 * 'R', the address record a rank publishes in the store
 * (rl_comm_tcp_parse_record).
 *
 * Besides memory safety it checks the contract: a frame that parses
 * re-encodes to exactly the input bytes (no field is ignored) and has
 * rank < world; a failure is RL_EINPUT with one line naming the peer and
 * leaves the output untouched; neither end of a link ever comes up without
 * the secret (which the input cannot know), each answer is a frame of ours
 * and each refusal one line naming the peer; a record that parses has a
 * port in 1..65535, a world >= 1 and a non-empty host of printable
 * characters that fits. */
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

/* The frames an end of a link receives, 96 bytes at a time (the last may
 * be short), until it refuses. */
static void fuzz_exchange(bool accepting, const uint8_t *data, size_t size) {
    rl_comm_link l = {.secret = "fuzz secret", .slen = 11, .prefix = "round/3/comm",
                      .world = 4, .rank = 2, .peer = accepting ? 1 : 3};
    uint8_t nonce[RL_COMM_NONCE_BYTES] = {0x42}, out[RL_COMM_HELLO_BYTES];
    rl_comm_hs hs;
    if (accepting) rl_comm_tcp_hs_accept(&hs, nonce);
    else rl_comm_tcp_hs_connect(&l, &hs, nonce, out);
    while (size > 0) {
        size_t n = size < RL_COMM_HELLO_BYTES ? size : RL_COMM_HELLO_BYTES;
        uint8_t *frame = malloc(n); /* exact size: ASan sees any over-read */
        if (!frame) return;
        memcpy(frame, data, n);
        data += n, size -= n;
        rl_err e = {0};
        size_t outlen = 99;
        rl_hs_action a = rl_comm_tcp_hs_step(&l, &hs, frame, n, "10.0.0.9:4711", out, &outlen, &e);
        free(frame);
        if (a == RL_HS_UP || a == RL_HS_SEND_UP) abort(); /* up without the secret */
        if (outlen != 0 && outlen != RL_COMM_HELLO_BYTES) abort();
        rl_comm_hello h;
        if (outlen && rl_comm_tcp_parse_hello(out, outlen, "self", &h, &e)) abort();
        if (a == RL_HS_REFUSE) {
            if (e.code != RL_EINPUT && e.code != RL_EPEER) abort();
            one_line(&e, "10.0.0.9:4711");
            return;
        }
        if (a != RL_HS_SEND || !outlen) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'R') {
        fuzz_record(data + 1, size - 1);
        return 0;
    }
    if (size > 0 && (data[0] == 'A' || data[0] == 'C')) {
        fuzz_exchange(data[0] == 'A', data + 1, size - 1);
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
