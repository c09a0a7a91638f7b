/* The tcp ring's link handshake (tcp_internal.h has the frames and the
 * exchange): parsing and encoding frames, and each end's decisions as a
 * pure function of what it received. tcp.c moves the bytes. */
#include "comm/comm_internal.h"
#include "comm/tcp_internal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

enum { WANT_HELLO, WANT_PROOF, WANT_CHALLENGE, WANT_ACCEPT, FINISHED };

static const char *kind_name(unsigned k) {
    static const char *const n[] = {"hello", "accept", "reject", "challenge", "proof"};
    return k < sizeof n / sizeof n[0] ? n[k] : "?";
}

/* Kinds without a nonce or a mac carry zeros there. */
static bool has_nonce(unsigned k) {
    return k == RL_COMM_HELLO || k == RL_COMM_HELLO_CHALLENGE || k == RL_COMM_HELLO_PROOF;
}
static bool has_mac(unsigned k) {
    return k == RL_COMM_HELLO_CHALLENGE || k == RL_COMM_HELLO_PROOF;
}

static bool all_zero(const uint8_t *p, size_t n) {
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) acc |= p[i];
    return acc == 0;
}

uint64_t rl_comm_tcp_round(const char *prefix) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = prefix ? prefix : ""; *p; p++) {
        h ^= (uint8_t)*p;
        h *= 0x100000001b3ull;
    }
    return rl_hash64(h);
}

void rl_comm_tcp_encode_hello(void *buf, const rl_comm_hello *h) {
    uint8_t *p = buf;
    rl_put_be32(p, RL_COMM_HELLO_MAGIC);
    rl_put_be16(p + 4, h->version);
    rl_put_be16(p + 6, h->kind);
    rl_put_be32(p + 8, h->world);
    rl_put_be32(p + 12, h->rank);
    rl_put_be64(p + 16, h->round);
    uint32_t probe = RL_COMM_HELLO_PROBE; /* native order on purpose */
    memcpy(p + 24, &probe, 4);
    rl_put_be32(p + 28, 0);
    memcpy(p + 32, h->nonce, RL_COMM_NONCE_BYTES);
    memcpy(p + 64, h->mac, 32);
}

bool rl_comm_tcp_hello_complete(const uint8_t *buf, size_t got) {
    return got >= RL_COMM_HELLO_BYTES || (got >= 4 && rl_get_be32(buf) != RL_COMM_HELLO_MAGIC) ||
           (got >= 6 && rl_get_be16(buf + 4) != RL_COMM_HELLO_VERSION);
}

int rl_comm_tcp_parse_hello(const void *buf, size_t len, const char *peer, rl_comm_hello *h,
                            rl_err *e) {
    const uint8_t *p = buf;
    if (!peer) peer = "peer";
    if (!p && len) return rl_errf(e, RL_EINPUT, "hello from %s: NULL buffer", peer);
    if (len < 4)
        return rl_errf(e, RL_EINPUT, "hello from %s: truncated (%zu of %d bytes)", peer, len,
                       RL_COMM_HELLO_BYTES);
    uint32_t magic = rl_get_be32(p);
    if (magic != RL_COMM_HELLO_MAGIC)
        return rl_errf(e, RL_EINPUT,
                       "hello from %s: bad magic 0x%08x, expected 0x%08x: not a ringleader "
                       "comm peer (another service on this port?)",
                       peer, magic, RL_COMM_HELLO_MAGIC);
    if (len < 6)
        return rl_errf(e, RL_EINPUT, "hello from %s: truncated (%zu of %d bytes)", peer, len,
                       RL_COMM_HELLO_BYTES);
    uint16_t version = rl_get_be16(p + 4);
    if (version != RL_COMM_HELLO_VERSION)
        return rl_errf(e, RL_EINPUT,
                       "hello from %s: comm protocol version %u, this build speaks version %d "
                       "(different ringleader versions in one job?)",
                       peer, version, RL_COMM_HELLO_VERSION);
    if (len != RL_COMM_HELLO_BYTES)
        return rl_errf(e, RL_EINPUT, "hello from %s: %zu bytes, expected %d", peer, len,
                       RL_COMM_HELLO_BYTES);
    uint16_t kind = rl_get_be16(p + 6);
    if (kind > RL_COMM_HELLO_PROOF)
        return rl_errf(e, RL_EINPUT, "hello from %s: unknown kind %u", peer, kind);
    uint32_t world = rl_get_be32(p + 8), rank = rl_get_be32(p + 12);
    if (world < 1 || world > RL_COMM_MAX_WORLD)
        return rl_errf(e, RL_EINPUT, "hello from %s: world %u outside 1..%d", peer, world,
                       RL_COMM_MAX_WORLD);
    if (rank >= world)
        return rl_errf(e, RL_EINPUT, "hello from %s: rank %u outside 0..%u", peer, rank,
                       world - 1);
    uint32_t probe;
    memcpy(&probe, p + 24, 4);
    if (probe != RL_COMM_HELLO_PROBE)
        return rl_errf(e, RL_EINPUT,
                       "hello from %s: byte-order probe 0x%08x: the peer stores numbers in "
                       "another byte order, the ring cannot mix architectures",
                       peer, probe);
    if (rl_get_be32(p + 28) != 0)
        return rl_errf(e, RL_EINPUT, "hello from %s: reserved field is 0x%08x, expected 0",
                       peer, rl_get_be32(p + 28));
    if (!has_nonce(kind) && !all_zero(p + 32, RL_COMM_NONCE_BYTES))
        return rl_errf(e, RL_EINPUT, "hello from %s: a %s carries a nonce", peer,
                       kind_name(kind));
    if (!has_mac(kind) && !all_zero(p + 64, 32))
        return rl_errf(e, RL_EINPUT, "hello from %s: a %s carries a mac", peer, kind_name(kind));
    if (h) {
        h->version = version;
        h->kind = kind;
        h->world = world;
        h->rank = rank;
        h->round = rl_get_be64(p + 16);
        memcpy(h->nonce, p + 32, RL_COMM_NONCE_BYTES);
        memcpy(h->mac, p + 64, 32);
    }
    return RL_OK;
}

int rl_comm_tcp_check_hello(const rl_comm_hello *h, uint32_t world, int expect_rank,
                            uint64_t round, const char *peer, rl_err *e) {
    if (!peer) peer = "peer";
    /* The round first: a peer of another round usually differs in world
     * too, and "another round" is the real cause. */
    if (h->round != round)
        return rl_errf(e, RL_EPEER,
                       "%s belongs to another job or rendezvous round (round %016llx, ours "
                       "%016llx)",
                       peer, (unsigned long long)h->round, (unsigned long long)round);
    if (h->world != world)
        return rl_errf(e, RL_EPEER, "%s has world size %u, this rank has %u", peer, h->world,
                       world);
    if (expect_rank >= 0 && h->rank != (uint32_t)expect_rank)
        return rl_errf(e, RL_EPEER, "%s says it is rank %u, expected rank %d", peer, h->rank,
                       expect_rank);
    return RL_OK;
}

void rl_comm_tcp_proof(const rl_comm_link *l, bool accepting, uint32_t a, uint32_t c,
                       const uint8_t cn[RL_COMM_NONCE_BYTES],
                       const uint8_t sn[RL_COMM_NONCE_BYTES], uint8_t mac[32]) {
    /* Prefixes are store keys, so RL_STORE_MAX_KEY bounds them. */
    uint8_t buf[16 + RL_STORE_MAX_KEY + 1 + 12 + 2 * RL_COMM_NONCE_BYTES];
    const char *label = accepting ? "rl-comm-accept" : "rl-comm-connect";
    const char *prefix = l->prefix ? l->prefix : "";
    size_t n = strlen(label) + 1, pl = strnlen(prefix, RL_STORE_MAX_KEY);
    memcpy(buf, label, n);
    memcpy(buf + n, prefix, pl), n += pl;
    buf[n++] = 0;
    rl_put_be32(buf + n, l->world), n += 4;
    rl_put_be32(buf + n, a), n += 4;
    rl_put_be32(buf + n, c), n += 4;
    memcpy(buf + n, cn, RL_COMM_NONCE_BYTES), n += RL_COMM_NONCE_BYTES;
    memcpy(buf + n, sn, RL_COMM_NONCE_BYTES), n += RL_COMM_NONCE_BYTES;
    static const uint8_t none[1];
    unsigned int ml = 32;
    HMAC(EVP_sha256(), l->slen ? l->secret : none, (int)l->slen, buf, n, mac, &ml);
}

/* A frame of ours from this end: kind, nonce, mac (NULL: zeros). */
static void frame(const rl_comm_link *l, unsigned kind, const uint8_t *nonce, const uint8_t *mac,
                  uint8_t out[RL_COMM_HELLO_BYTES]) {
    rl_comm_hello h = {.version = RL_COMM_HELLO_VERSION, .kind = (uint16_t)kind,
                       .world = l->world, .rank = l->rank, .round = rl_comm_tcp_round(l->prefix)};
    if (nonce) memcpy(h.nonce, nonce, RL_COMM_NONCE_BYTES);
    if (mac) memcpy(h.mac, mac, 32);
    rl_comm_tcp_encode_hello(out, &h);
}

void rl_comm_tcp_hs_connect(const rl_comm_link *l, rl_comm_hs *hs,
                            const uint8_t cn[RL_COMM_NONCE_BYTES],
                            uint8_t out[RL_COMM_HELLO_BYTES]) {
    memset(hs, 0, sizeof *hs);
    hs->state = WANT_CHALLENGE;
    hs->peer_rank = l->peer;
    memcpy(hs->cn, cn, RL_COMM_NONCE_BYTES);
    frame(l, RL_COMM_HELLO, cn, NULL, out);
}

void rl_comm_tcp_hs_accept(rl_comm_hs *hs, const uint8_t sn[RL_COMM_NONCE_BYTES]) {
    memset(hs, 0, sizeof *hs);
    hs->accepting = true;
    hs->state = WANT_HELLO;
    memcpy(hs->sn, sn, RL_COMM_NONCE_BYTES);
}

static bool proof_ok(const rl_comm_link *l, const rl_comm_hs *hs, bool accepting,
                     const uint8_t mac[32]) {
    uint8_t want[32];
    uint32_t a = hs->accepting ? l->rank : l->peer, c = hs->accepting ? l->peer : l->rank;
    rl_comm_tcp_proof(l, accepting, a, c, hs->cn, hs->sn, want);
    return CRYPTO_memcmp(want, mac, 32) == 0;
}

/* The accepting end (A). A REJECT tells an honest peer what is wrong so it
 * fails at once; a stranger learns only what the store records say. */
static rl_hs_action accept_step(const rl_comm_link *l, rl_comm_hs *hs, const rl_comm_hello *h,
                                const char *peer, uint8_t *out, size_t *outlen, rl_err *e) {
    uint64_t round = rl_comm_tcp_round(l->prefix);
    if (hs->state == WANT_HELLO) {
        if (h->kind != RL_COMM_HELLO) {
            rl_errf(e, RL_EPEER, "%s sent a %s instead of a hello", peer, kind_name(h->kind));
            return RL_HS_REFUSE;
        }
        if (rl_comm_tcp_check_hello(h, l->world, (int)l->peer, round, peer, e)) {
            frame(l, RL_COMM_HELLO_REJECT, NULL, NULL, out), *outlen = RL_COMM_HELLO_BYTES;
            return RL_HS_REFUSE;
        }
        memcpy(hs->cn, h->nonce, RL_COMM_NONCE_BYTES);
        uint8_t mac[32];
        rl_comm_tcp_proof(l, true, l->rank, l->peer, hs->cn, hs->sn, mac);
        frame(l, RL_COMM_HELLO_CHALLENGE, hs->sn, mac, out), *outlen = RL_COMM_HELLO_BYTES;
        hs->state = WANT_PROOF;
        return RL_HS_SEND;
    }
    /* WANT_PROOF: the same peer, its own nonce back, and the proof */
    if (h->kind != RL_COMM_HELLO_PROOF) {
        rl_errf(e, RL_EPEER, "%s sent a %s instead of its proof", peer, kind_name(h->kind));
        return RL_HS_REFUSE;
    }
    if (rl_comm_tcp_check_hello(h, l->world, (int)l->peer, round, peer, e)) return RL_HS_REFUSE;
    if (memcmp(h->nonce, hs->cn, RL_COMM_NONCE_BYTES) != 0) {
        rl_errf(e, RL_EPEER, "%s changed its nonce between hello and proof", peer);
        return RL_HS_REFUSE;
    }
    if (!proof_ok(l, hs, false, h->mac)) {
        rl_errf(e, RL_EPEER, "%s did not prove the job's rendezvous secret", peer);
        frame(l, RL_COMM_HELLO_REJECT, NULL, NULL, out), *outlen = RL_COMM_HELLO_BYTES;
        return RL_HS_REFUSE;
    }
    frame(l, RL_COMM_HELLO_ACCEPT, NULL, NULL, out), *outlen = RL_COMM_HELLO_BYTES;
    hs->state = FINISHED;
    return RL_HS_SEND_UP;
}

/* The connecting end (C): it dialled the published address of l->peer, so
 * anything wrong there fails the ring. */
static rl_hs_action connect_step(const rl_comm_link *l, rl_comm_hs *hs, const rl_comm_hello *h,
                                 const char *peer, uint8_t *out, size_t *outlen, rl_err *e) {
    uint64_t round = rl_comm_tcp_round(l->prefix);
    if (h->kind == RL_COMM_HELLO_REJECT) {
        if (!rl_comm_tcp_check_hello(h, l->world, (int)l->peer, round, peer, e))
            rl_errf(e, RL_EPEER,
                    hs->state == WANT_ACCEPT
                        ? "%s refused our proof: do all ranks have the same rendezvous secret?"
                        : "%s rejected our hello",
                    peer);
        return RL_HS_REFUSE;
    }
    unsigned want = hs->state == WANT_CHALLENGE ? RL_COMM_HELLO_CHALLENGE : RL_COMM_HELLO_ACCEPT;
    if (h->kind != want) {
        rl_errf(e, RL_EPEER, "%s answered with a %s, expected a %s", peer, kind_name(h->kind),
                kind_name(want));
        return RL_HS_REFUSE;
    }
    if (rl_comm_tcp_check_hello(h, l->world, (int)l->peer, round, peer, e)) return RL_HS_REFUSE;
    if (hs->state == WANT_ACCEPT) {
        hs->state = FINISHED;
        return RL_HS_UP;
    }
    memcpy(hs->sn, h->nonce, RL_COMM_NONCE_BYTES);
    if (!proof_ok(l, hs, true, h->mac)) {
        rl_errf(e, RL_EPEER, "%s did not prove the job's rendezvous secret (a process that is "
                "not this job's, or ranks started with different secrets)", peer);
        return RL_HS_REFUSE;
    }
    uint8_t mac[32];
    rl_comm_tcp_proof(l, false, l->peer, l->rank, hs->cn, hs->sn, mac);
    frame(l, RL_COMM_HELLO_PROOF, hs->cn, mac, out), *outlen = RL_COMM_HELLO_BYTES;
    hs->state = WANT_ACCEPT;
    return RL_HS_SEND;
}

rl_hs_action rl_comm_tcp_hs_step(const rl_comm_link *l, rl_comm_hs *hs, const uint8_t *in,
                                 size_t len, const char *peer, uint8_t out[RL_COMM_HELLO_BYTES],
                                 size_t *outlen, rl_err *e) {
    *outlen = 0;
    if (hs->state == FINISHED) {
        rl_errf(e, RL_EPEER, "%s: a frame after the handshake ended", peer);
        return RL_HS_REFUSE;
    }
    rl_comm_hello h;
    if (rl_comm_tcp_parse_hello(in, len, peer, &h, e)) {
        /* a ringleader of another version: tell it ours */
        if (hs->accepting && len >= 6 && rl_get_be32(in) == RL_COMM_HELLO_MAGIC &&
            rl_get_be16(in + 4) != RL_COMM_HELLO_VERSION)
            frame(l, RL_COMM_HELLO_REJECT, NULL, NULL, out), *outlen = RL_COMM_HELLO_BYTES;
        return RL_HS_REFUSE;
    }
    return hs->accepting ? accept_step(l, hs, &h, peer, out, outlen, e)
                         : connect_step(l, hs, &h, peer, out, outlen, e);
}
