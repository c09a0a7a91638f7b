/* The store's wire frame: a fixed 24-byte big-endian header. The parser is
 * the first thing that touches bytes from the network on both ends, so it
 * validates everything it can before anyone allocates for the lengths it
 * claims (and it is fuzzed). */
#include <string.h>

#include "rdzv/rdzv.h"

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)((unsigned)p[0] << 8 | p[1]); }
static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v; }

int rl_store_frame_parse(const void *buf, size_t len, const char *peer, rl_store_frame *f,
                         rl_err *e) {
    const uint8_t *p = buf;
    if (!peer) peer = "?";
    if (len < RL_STORE_HEADER_BYTES)
        return rl_errf(e, RL_EINPUT, "store %s: short frame header (%zu bytes, need %d)", peer,
                       len, RL_STORE_HEADER_BYTES);
    uint32_t magic = get32(p);
    /* Magic first: a peer speaking another protocol (HTTP, TLS, ...) should
     * be told so, not that its "version" is odd. */
    if (magic != RL_STORE_MAGIC)
        return rl_errf(e, RL_EINPUT,
                       "store %s: bad magic 0x%08x (not a ringleader store frame)", peer,
                       (unsigned)magic);
    rl_store_frame h = {
        .version = get16(p + 4),
        .op = get16(p + 6),
        .status = get32(p + 8),
        .klen = get32(p + 12),
        .vlen = get32(p + 16),
        .v2len = get32(p + 20),
    };
    if (h.version != RL_STORE_VERSION)
        return rl_errf(e, RL_EINPUT, "store %s: protocol version %u, expected %d", peer,
                       (unsigned)h.version, RL_STORE_VERSION);
    if (h.op < RL_STORE_SET || h.op > RL_STORE_PING)
        return rl_errf(e, RL_EINPUT, "store %s: unknown op %u", peer, (unsigned)h.op);
    if (h.status > RL_STORE_EFULL)
        return rl_errf(e, RL_EINPUT, "store %s: unknown status %u", peer, (unsigned)h.status);
    if (h.klen > RL_STORE_MAX_KEY)
        return rl_errf(e, RL_EINPUT, "store %s: key length %u exceeds %u", peer,
                       (unsigned)h.klen, RL_STORE_MAX_KEY);
    if (h.vlen > RL_STORE_MAX_VALUE)
        return rl_errf(e, RL_EINPUT, "store %s: value length %u exceeds %u", peer,
                       (unsigned)h.vlen, RL_STORE_MAX_VALUE);
    if (h.v2len > RL_STORE_MAX_VALUE)
        return rl_errf(e, RL_EINPUT, "store %s: value2 length %u exceeds %u", peer,
                       (unsigned)h.v2len, RL_STORE_MAX_VALUE);
    *f = h;
    return RL_OK;
}

void rl_store_frame_encode(void *buf, const rl_store_frame *f) {
    uint8_t *p = buf;
    put32(p, RL_STORE_MAGIC);
    put16(p + 4, f->version);
    put16(p + 6, f->op);
    put32(p + 8, f->status);
    put32(p + 12, f->klen);
    put32(p + 16, f->vlen);
    put32(p + 20, f->v2len);
}
