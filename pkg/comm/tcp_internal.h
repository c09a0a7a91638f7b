/* tcp ring internals exposed for tests and the fuzz target: the hello
 * frame two neighbours exchange when the ring is formed, and the per-op
 * header that precedes each collective on the wire.
 *
 * Hello frame, 32 bytes, integers big-endian:
 *   u32 magic 'RLCM' | u16 version | u16 kind | u32 world | u32 rank |
 *   u64 nonce | u32 byte-order probe | u32 reserved (0)
 * kind: 0 = hello (from the connecting rank to its right neighbour),
 *       1 = accept (the neighbour's answer), 2 = reject (the neighbour's
 *       answer when it refuses us; it carries its own world/rank/nonce so
 *       the connecting side can say what differs).
 * nonce: a hash of the key prefix, i.e. of the job and round, so a stale
 *       process of an earlier round that reaches a reused port is refused.
 * byte-order probe: 0x01020304 written in the sender's native order; the
 *       ring moves raw native numbers, so both ends must agree.
 * Version 2: after the hellos each link exchanges a 256-byte shared-memory
 * offer (sender to receiver) and an 8-byte answer (see tcp.c, "Same-host
 * links"). */
#ifndef RL_COMM_TCP_INTERNAL_H
#define RL_COMM_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define RL_COMM_HELLO_MAGIC 0x524c434du /* 'RLCM' */
#define RL_COMM_HELLO_VERSION 2 /* 2: the link setup frames follow the hello */
#define RL_COMM_HELLO_BYTES 32
#define RL_COMM_HELLO_PROBE 0x01020304u

enum { RL_COMM_HELLO = 0, RL_COMM_HELLO_ACCEPT = 1, RL_COMM_HELLO_REJECT = 2 };

typedef struct rl_comm_hello {
    uint16_t version, kind;
    uint32_t world, rank;
    uint64_t nonce;
} rl_comm_hello;

/* Parse a received hello (len bytes, normally 32). RL_EINPUT, naming
 * `peer`, when it is not a well-formed hello of our version: too short or
 * long, wrong magic (not a ringleader peer), another protocol version,
 * unknown kind, world outside 1..2^20, rank >= world, a byte-order probe
 * of another architecture, nonzero reserved bits. A prefix shorter than 32
 * bytes reports the first bad field it holds (magic from 4 bytes, version
 * from 6), so a garbage sender is refused without waiting for 32 bytes.
 * Fuzzed (tests/fuzz/fuzz_comm_hello.c). */
int rl_comm_tcp_parse_hello(const void *buf, size_t len, const char *peer, rl_comm_hello *h,
                            rl_err *e);
void rl_comm_tcp_encode_hello(void *buf, const rl_comm_hello *h);
/* Does a parsed hello come from who we expect? RL_EPEER naming `peer` and
 * the differing field (world, rank, round nonce). expect_rank < 0: any. */
int rl_comm_tcp_check_hello(const rl_comm_hello *h, uint32_t world, int expect_rank,
                            uint64_t nonce, const char *peer, rl_err *e);
/* The round nonce of a key prefix (FNV-1a, then mixed). */
uint64_t rl_comm_tcp_nonce(const char *prefix);

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
