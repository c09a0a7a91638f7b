/* store: the rendezvous key-value store.
 *
 * A small TCP key-value service hosted by one process (node 0 or rank 0
 * in static mode, the elected leader in elastic mode). Everything that
 * must be agreed between ranks -- ring addresses, the ncclUniqueId, round
 * membership -- goes through it. The server is store_db.c's pure function
 * over bytes behind a poll loop (store_server.c); store_client.c is the
 * client.
 *
 * Wire protocol: every message is one frame,
 *   u32 magic 'RLST' (0x524c5354) | u16 version (1) | u16 op | u32 status |
 *   u32 key length | u32 value length | u32 value2 length | key | value | value2
 * all integers big-endian; key <= 1 KiB, each value <= 64 MiB. A request
 * (status 0) gets exactly one response frame with the same op. Anything
 * else (bad magic, other version, oversize lengths, unknown op, a request
 * body that does not fit its op) is a protocol error: the server answers
 * with status RL_STORE_EPROTO, its one-line reason as the value, and
 * closes the connection; the client reports it naming the peer. Counters
 * (ADD) are stored as the 8-byte big-endian value, so a GET of a counter
 * key returns those 8 bytes. The server keeps at most RL_STORE_MAX_TOTAL
 * bytes of keys and values; a write beyond that is answered EFULL. */
#ifndef RL_STORE_H
#define RL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define RL_STORE_MAGIC 0x524c5354u
#define RL_STORE_VERSION 1
#define RL_STORE_HEADER_BYTES 24
#define RL_STORE_MAX_KEY 1024u
#define RL_STORE_MAX_VALUE (64u << 20)
#define RL_STORE_MAX_TOTAL (1024u << 20)
#define RL_STORE_DEFAULT_PORT 29400

enum rl_store_op {
    RL_STORE_SET = 1,  /* key, value -> ok */
    RL_STORE_GET = 2,  /* key, value = u32 wait_ms -> value, or status NOTFOUND after wait_ms */
    RL_STORE_ADD = 3,  /* key, value = i64 delta -> value = i64 new (missing key counts as 0;
                          a value that is not 8 bytes, or overflow: MISMATCH, unchanged) */
    RL_STORE_CAS = 4,  /* key, value = expected, value2 = desired -> status OK (swapped) or
                          MISMATCH, value = current. expected empty: only if key absent. */
    RL_STORE_DEL = 5,  /* key -> ok (absent key is ok too) */
    RL_STORE_PING = 6, /* -> ok (liveness, version check) */
    /* Mutual authentication with the job's rendezvous secret (see
     * rl_store_auth): */
    RL_STORE_CHALLENGE = 7, /* key = client id, value = client nonce (16..64 bytes) ->
                               value = server nonce (32) + server proof (32); empty when
                               the server has no secret */
    RL_STORE_AUTH = 8,      /* key = client id, value = client proof -> ok, or EAUTH and close */
};

enum rl_store_status {
    RL_STORE_OK = 0,
    RL_STORE_NOTFOUND = 1,
    RL_STORE_MISMATCH = 2,
    RL_STORE_EPROTO = 3,
    RL_STORE_EFULL = 4, /* the write would take the store over RL_STORE_MAX_TOTAL */
    RL_STORE_EAUTH = 5, /* not authenticated, or a wrong proof: the server closes */
};

/* A parsed frame header (the key and values follow it on the wire). */
typedef struct rl_store_frame {
    uint16_t version, op;
    uint32_t status, klen, vlen, v2len;
} rl_store_frame;

/* Parse and validate a 24-byte header; `peer` names the other end in
 * messages ("127.0.0.1:29400" -> "store 127.0.0.1:29400: protocol version 2,
 * expected 1"). RL_EINPUT (protocol error) on anything malformed; *f is
 * untouched then. Fuzzed. Encode writes all fields as given (set version
 * to RL_STORE_VERSION) into 24 bytes. */
int rl_store_frame_parse(const void *buf, size_t len, const char *peer, rl_store_frame *f,
                         rl_err *e);
void rl_store_frame_encode(void *buf, const rl_store_frame *f);

/* ---- server ------------------------------------------------------------------------ */
typedef struct rl_store_server rl_store_server;
/* Listen on host:port (port 0 = any free port; host NULL = 0.0.0.0) and
 * serve from a background thread (one thread, poll() over all clients; it
 * blocks all signals). A port in use is RL_EINPUT naming it. Protocol
 * errors are logged (warn) naming the client; values are never logged.
 * The sockets are close-on-exec: host the store in a process that execs
 * its children (a fork()ed child without exec keeps the listening socket).
 * Stop closes every client connection, so clients blocked in a GET fail
 * promptly (RL_EPEER); it returns within milliseconds. NULL is a no-op. */
int rl_store_server_start(const char *host, int port, rl_store_server **out, rl_err *e);
/* The same with a rendezvous secret (len > 0): every connection must pass
 * CHALLENGE + AUTH before any other op but PING; a wrong proof is answered
 * EAUTH, logged (warn, naming the client address and claimed id, never the
 * secret) and the connection closed. Other clients are unaffected.
 * Before it authenticated a connection may send only the handshake frames
 * (connect's PING, CHALLENGE, AUTH) of their exact sizes, judged from the
 * header before any body is read, and must be through within 5 s; such
 * connections are capped in all and per source address. Either way an
 * authenticated (no secret: answered) connection with nothing pending for
 * 10 minutes is closed, and the store keeps a quarter of RLIMIT_NOFILE
 * (at least 64) free for the rest of its process (store_server.c's
 * limits say why). */
int rl_store_server_start_auth(const char *host, int port, const void *secret, size_t len,
                               rl_store_server **out, rl_err *e);
int rl_store_server_port(const rl_store_server *s);
void rl_store_server_stop(rl_store_server *s);

/* ---- client ------------------------------------------------------------------------ */
typedef struct rl_store rl_store;
/* Connect, retrying until timeout_s (the server may start later than its
 * clients), then PING to check that the peer is a store of our version.
 * Every later call is bounded by the same timeout unless it takes its own.
 * Errors: an unreachable store after the timeout is RL_ETIMEOUT naming
 * host:port; a peer speaking another protocol or version, or one that
 * rejects a request, is RL_EINPUT (misconfiguration, not retried); a lost
 * connection is RL_EPEER. After a transport failure (no answer in time, a
 * lost connection) the client is unusable: every later call fails fast
 * naming the first cause; close it and connect again. (A GET whose key is
 * not set in time is not such a failure.) Not thread-safe: one client per
 * thread. */
int rl_store_connect(const char *host, int port, double timeout_s, rl_store **out, rl_err *e);
int rl_store_set(rl_store *s, const char *key, const void *val, size_t len, rl_err *e);
/* Wait up to timeout_s for the key to exist (0: look once); *val is
 * malloc'd (NUL-terminated for convenience, not counted in *len).
 * RL_ETIMEOUT names the key. The wait happens in the server, so a GET costs
 * one round trip however long it waits. */
int rl_store_get(rl_store *s, const char *key, double timeout_s, void **val, size_t *len,
                 rl_err *e);
/* Atomic counter (delta 0 reads it). A key holding something else, or an
 * overflow, is RL_EINPUT. */
int rl_store_add(rl_store *s, const char *key, int64_t delta, int64_t *result, rl_err *e);
/* Compare-and-set; expected NULL/0 means "only if absent". *swapped tells
 * the outcome; current (optional, malloc'd) receives the value after. */
int rl_store_cas(rl_store *s, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, bool *swapped, void **current, size_t *clen,
                 rl_err *e);
int rl_store_delete(rl_store *s, const char *key, rl_err *e);
void rl_store_close(rl_store *s);
/* A flag another thread may set (NULL: none): a call waiting on the store
 * then gives up within 100 ms with RL_EABORT, and the client is unusable
 * from then on (a request may be half-exchanged). The flag must outlive
 * the client or be unset first. */
void rl_store_set_cancel(rl_store *s, const volatile int *cancel);
/* Authenticate this connection as `id` with the job's secret, both ways:
 *   client -> CHALLENGE(id, cn)         cn: 32 random bytes
 *   server -> sn, HMAC-SHA256(secret, "rl-store-server" 0 cn sn)
 *   client -> AUTH(id, HMAC-SHA256(secret, "rl-store-client" 0 sn cn id))
 *   server -> OK | EAUTH (and closes)
 * then the client checks the server's proof, so a store that does not know
 * the secret (an impostor at the leader's address) is refused too. The
 * nonces make every proof single-use. A wrong secret on either side is
 * RL_EINPUT "... rendezvous secret ..."; a server without a secret is
 * RL_EINPUT too (a client that has a secret never talks to an open store).
 * A store that closes the connection during the handshake (its places for
 * unauthenticated clients full) is connected to again and asked again,
 * within the client's timeout. */
int rl_store_auth(rl_store *s, const char *id, const void *secret, size_t len, rl_err *e);

/* Wait until `count` processes have called this with the same key prefix
 * (an ADD counter then a GET of a release key): a barrier through the store.
 * Uses the keys "<key>/count" and "<key>/release"; each key is good for one
 * barrier (put the round or a sequence number in it). A timeout says how
 * many arrived. */
int rl_store_barrier(rl_store *s, const char *key, int count, double timeout_s, rl_err *e);

#endif
