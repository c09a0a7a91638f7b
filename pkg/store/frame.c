/* The store's wire frame: a fixed 24-byte big-endian header. The parser is
 * the first thing that touches bytes from the network on both ends, so it
 * validates everything it can before anyone allocates for the lengths it
 * claims (and it is fuzzed). */
#include <string.h>

#include "store/store.h"
#include "store/store_db.h"

int rl_store_frame_parse(const void *buf, size_t len, const char *peer, rl_store_frame *f,
                         rl_err *e) {
    const uint8_t *p = buf;
    if (!peer) peer = "?";
    if (len < RL_STORE_HEADER_BYTES)
        return rl_errf(e, RL_EINPUT, "store %s: short frame header (%zu bytes, need %d)", peer,
                       len, RL_STORE_HEADER_BYTES);
    uint32_t magic = rl_get_be32(p);
    /* Magic first: a peer speaking another protocol (HTTP, TLS, ...) should
     * be told so, not that its "version" is odd. */
    if (magic != RL_STORE_MAGIC)
        return rl_errf(e, RL_EINPUT,
                       "store %s: bad magic 0x%08x (not a ringleader store frame)", peer,
                       (unsigned)magic);
    rl_store_frame h = {
        .version = rl_get_be16(p + 4),
        .op = rl_get_be16(p + 6),
        .status = rl_get_be32(p + 8),
        .klen = rl_get_be32(p + 12),
        .vlen = rl_get_be32(p + 16),
        .v2len = rl_get_be32(p + 20),
    };
    if (h.version != RL_STORE_VERSION)
        return rl_errf(e, RL_EINPUT, "store %s: protocol version %u, expected %d", peer,
                       (unsigned)h.version, RL_STORE_VERSION);
    if (h.op < RL_STORE_SET || h.op > RL_STORE_AUTH)
        return rl_errf(e, RL_EINPUT, "store %s: unknown op %u", peer, (unsigned)h.op);
    if (h.status > RL_STORE_EAUTH)
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

const char *rl_store_op_name(unsigned op) {
    static const char *names[] = {"?", "SET", "GET", "ADD", "CAS", "DEL", "PING", "CHALLENGE", "AUTH"};
    return op <= RL_STORE_AUTH ? names[op] : "?";
}

void rl_store_frame_encode(void *buf, const rl_store_frame *f) {
    uint8_t *p = buf;
    rl_put_be32(p, RL_STORE_MAGIC);
    rl_put_be16(p + 4, f->version);
    rl_put_be16(p + 6, f->op);
    rl_put_be32(p + 8, f->status);
    rl_put_be32(p + 12, f->klen);
    rl_put_be32(p + 16, f->vlen);
    rl_put_be32(p + 20, f->v2len);
}
