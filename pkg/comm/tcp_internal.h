/* tcp ring internals exposed for tests and the fuzz targets: the handshake
 * two neighbours run when the ring is formed, and the address records.
 *
 * Handshake frames, 96 bytes each, integers big-endian:
 *   u32 magic 'RLCM' | u16 version | u16 kind | u32 world | u32 rank |
 *   u64 round | u32 byte-order probe | u32 reserved (0) |
 *   32 bytes nonce | 32 bytes mac
 * world, rank and round are always the sender's own. round is a hash of the
 * key prefix (rl_comm_tcp_round), so a process of another round that
 * reaches a reused port is told so; the byte-order probe is 0x01020304
 * written in the sender's native order (the ring moves raw native numbers,
 * so both ends must agree).
 *
 * The connecting rank C (to its right neighbour A) and A exchange
 *   C -> A  HELLO      nonce cn (fresh random), mac 0
 *   A -> C  CHALLENGE  nonce sn (fresh random), mac = A's proof
 *   C -> A  PROOF      nonce cn again,          mac = C's proof
 *   A -> C  ACCEPT     nonce 0, mac 0
 * where a proof is HMAC-SHA256(secret, label 0 prefix 0 world A C cn sn)
 * (world and ranks as u32 big-endian; label "rl-comm-accept" for A,
 * "rl-comm-connect" for C, so neither proof can stand for the other). The
 * secret is the job's rendezvous secret: each side proves it knows it over
 * nonces the other just chose, so nothing recorded can be replayed and an
 * impostor at either end is refused. Without a secret the key is empty
 * and the proofs only bind the frames to the round. A may answer REJECT
 * (nonce and mac 0) instead of CHALLENGE or ACCEPT; it carries A's world,
 * rank and round so C can say what differs.
 * Version 3: the challenge and proofs (2 had a 32-byte hello and accept).
 * After the handshake each link exchanges a 256-byte shared-memory offer
 * and an 8-byte answer (see tcp.c, "Same-host links"). */
#ifndef RL_COMM_TCP_INTERNAL_H
#define RL_COMM_TCP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define RL_COMM_HELLO_MAGIC 0x524c434du /* 'RLCM' */
#define RL_COMM_HELLO_VERSION 3
#define RL_COMM_HELLO_BYTES 96
#define RL_COMM_HELLO_PROBE 0x01020304u
#define RL_COMM_NONCE_BYTES 32

enum {
    RL_COMM_HELLO = 0,
    RL_COMM_HELLO_ACCEPT = 1,
    RL_COMM_HELLO_REJECT = 2,
    RL_COMM_HELLO_CHALLENGE = 3,
    RL_COMM_HELLO_PROOF = 4,
};

typedef struct rl_comm_hello {
    uint16_t version, kind;
    uint32_t world, rank;
    uint64_t round;
    uint8_t nonce[RL_COMM_NONCE_BYTES], mac[32];
} rl_comm_hello;

/* Parse a received frame (len bytes, normally 96). RL_EINPUT, naming
 * `peer`, when it is not a well-formed frame of our version: too short or
 * long, wrong magic (not a ringleader peer), another protocol version,
 * unknown kind, world outside 1..2^20, rank >= world, a byte-order probe
 * of another architecture, nonzero reserved bits, or a nonce or mac where
 * the kind has none. A prefix shorter than 96 bytes reports the first bad
 * field it holds (magic from 4 bytes, version from 6), so a garbage sender
 * is refused without waiting for 96 bytes (rl_comm_tcp_hello_complete
 * says when to stop reading). Fuzzed (tests/fuzz/fuzz_comm_hello.c). */
int rl_comm_tcp_parse_hello(const void *buf, size_t len, const char *peer, rl_comm_hello *h,
                            rl_err *e);
void rl_comm_tcp_encode_hello(void *buf, const rl_comm_hello *h);
/* Enough of a frame arrived to judge it: all of it, or a prefix whose
 * magic or version is already wrong. */
bool rl_comm_tcp_hello_complete(const uint8_t *buf, size_t got);
/* Does a parsed frame come from who we expect? RL_EPEER naming `peer` and
 * the differing field (round, world, rank). expect_rank < 0: any. */
int rl_comm_tcp_check_hello(const rl_comm_hello *h, uint32_t world, int expect_rank,
                            uint64_t round, const char *peer, rl_err *e);
/* The round hash of a key prefix (FNV-1a, then mixed). */
uint64_t rl_comm_tcp_round(const char *prefix);

/* What one end of a link knows: the secret (slen 0: none), the round's key
 * prefix, world size, its own rank and the rank it expects at the other
 * end. */
typedef struct rl_comm_link {
    const void *secret;
    size_t slen;
    const char *prefix;
    uint32_t world, rank, peer;
} rl_comm_link;

/* A proof of the handshake above into mac: `accepting` picks A's label.
 * a and c are the accepting and connecting ranks. */
void rl_comm_tcp_proof(const rl_comm_link *l, bool accepting, uint32_t a, uint32_t c,
                       const uint8_t cn[RL_COMM_NONCE_BYTES],
                       const uint8_t sn[RL_COMM_NONCE_BYTES], uint8_t mac[32]);

/* One end's handshake as a pure function of the frames it receives: the
 * caller moves bytes, this decides. Start with rl_comm_tcp_hs_connect
 * (which writes the HELLO to send) or rl_comm_tcp_hs_accept; then give
 * each frame to rl_comm_tcp_hs_step as soon as rl_comm_tcp_hello_complete
 * says so. The nonces are the caller's fresh random bytes. */
typedef enum {
    RL_HS_SEND,      /* send out[0..96), then read the next frame */
    RL_HS_SEND_UP,   /* send out[0..96); then the link is up (A's ACCEPT) */
    RL_HS_UP,        /* the link is up (C read the ACCEPT) */
    RL_HS_REFUSE,    /* e says why; send out (a REJECT) if *outlen, then close */
} rl_hs_action;

typedef struct rl_comm_hs {
    bool accepting;
    int state; /* what the next frame must be */
    uint32_t peer_rank;
    uint8_t cn[RL_COMM_NONCE_BYTES], sn[RL_COMM_NONCE_BYTES];
} rl_comm_hs;

void rl_comm_tcp_hs_connect(const rl_comm_link *l, rl_comm_hs *hs,
                            const uint8_t cn[RL_COMM_NONCE_BYTES],
                            uint8_t out[RL_COMM_HELLO_BYTES]);
void rl_comm_tcp_hs_accept(rl_comm_hs *hs, const uint8_t sn[RL_COMM_NONCE_BYTES]);
/* Judge one received frame (len bytes: 96, or a prefix that is already
 * wrong). The accepting end refuses anything but a HELLO from l->peer of
 * this round followed by a PROOF that verifies; the connecting end refuses
 * anything but a CHALLENGE that verifies followed by an ACCEPT. A refusal is
 * RL_EINPUT (not a frame of ours) or RL_EPEER (a frame of ours from the
 * wrong peer, round or secret) naming `peer`. */
rl_hs_action rl_comm_tcp_hs_step(const rl_comm_link *l, rl_comm_hs *hs, const uint8_t *in,
                                 size_t len, const char *peer, uint8_t out[RL_COMM_HELLO_BYTES],
                                 size_t *outlen, rl_err *e);

/* Address records published in the store under <prefix>/addr/<rank>:
 * "<host>:<port> <world>" (IPv6 hosts in brackets). Parsed into host
 * (brackets removed), port and world; RL_EINPUT naming `key` if malformed. */
int rl_comm_tcp_parse_record(const char *rec, const char *key, char *host, size_t hostn,
                             int *port, int *world, rl_err *e);

/* Which links of a tcp communicator use shared memory: bit 0 the link to
 * the right (we send), bit 1 the link from the left (we receive). 0 for
 * world 1, another backend, or TCP-only links. */
struct rl_comm;
int rl_comm_tcp_shm_links(const struct rl_comm *c);

/* Unlink the ring names (/dev/shm/rl-comm-<pid>-...) whose creating pid is
 * gone: a rank killed between making a ring and both sides unlinking its
 * name would otherwise leave its memory in /dev/shm until the pod ends.
 * Run before each ring setup; returns how many it removed. */
int rl_comm_tcp_shm_sweep(void);

#endif
