/* Internal to pkg/store (and its tests and fuzz targets): the store's state
 * and its request handling as a pure function over bytes, so that the
 * protocol logic can be unit-tested and fuzzed without sockets. The server
 * (store_server.c) only moves bytes and parks GETs. */
#ifndef RL_RDZV_STORE_DB_H
#define RL_RDZV_STORE_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* A growable byte buffer; `off` is how much of it was consumed (sent). */
typedef struct rl_store_buf {
    uint8_t *p;
    size_t len, cap, off;
} rl_store_buf;
/* Make room for `extra` more bytes after len. 0 or -1 (out of memory). */
int rl_store_buf_reserve(rl_store_buf *b, size_t extra);
/* Drop the consumed prefix (off) so that the buffer does not grow forever. */
void rl_store_buf_compact(rl_store_buf *b);
void rl_store_buf_free(rl_store_buf *b);
/* Append one frame: header + key + value + value2 (any may be empty). */
int rl_store_buf_frame(rl_store_buf *b, uint16_t op, uint32_t status, const void *key,
                       uint32_t klen, const void *val, uint32_t vlen, const void *val2,
                       uint32_t v2len);

typedef struct rl_store_db rl_store_db;
/* max_bytes bounds keys + values + a per-key overhead. NULL: out of memory. */
rl_store_db *rl_store_db_new(size_t max_bytes);
/* Require CHALLENGE + AUTH on every connection (len > 0; copied). 0 or -1. */
int rl_store_db_set_secret(rl_store_db *db, const void *secret, size_t len);

/* One connection's authentication state (zeroed when it is accepted). */
typedef struct rl_store_session {
    bool authed;
    bool challenged;          /* a CHALLENGE was answered: snonce/cnonce hold */
    uint8_t snonce[32];
    uint8_t cnonce[64];
    uint32_t cnlen;
} rl_store_session;

#define RL_STORE_NONCE_MIN 16u
#define RL_STORE_NONCE_MAX 64u
/* The two proofs of rl_store_auth (HMAC-SHA256, 32 bytes into mac). */
void rl_store_proof_server(const void *secret, size_t slen, const uint8_t *cn, size_t cnlen,
                           const uint8_t *sn, uint8_t mac[32]);
void rl_store_proof_client(const void *secret, size_t slen, const uint8_t *sn, const uint8_t *cn,
                           size_t cnlen, const void *id, size_t idlen, uint8_t mac[32]);
/* The largest frame a connection may send before it authenticated (a
 * CHALLENGE with the longest id and nonce): all a server ever buffers for
 * a peer that has not proved it knows the secret. */
#define RL_STORE_HANDSHAKE_MAX (RL_STORE_HEADER_BYTES + RL_STORE_MAX_KEY + RL_STORE_NONCE_MAX)

typedef enum {
    RL_STORE_PRE_OK = 0,    /* a handshake frame of its exact shape */
    RL_STORE_PRE_REFUSED,   /* an op that needs authentication: EAUTH */
    RL_STORE_PRE_MALFORMED, /* a handshake op with the wrong lengths: EPROTO */
} rl_store_pre;
/* Judge a parsed request header from a connection that has not
 * authenticated to a store that wants it, from the 24 header bytes alone
 * (before any body is read): PING is the header alone, CHALLENGE an id of
 * 1..RL_STORE_MAX_KEY bytes and a nonce of RL_STORE_NONCE_MIN..MAX, AUTH
 * an id and a 32-byte proof, none with a second value; every other op is
 * refused. So an unauthenticated peer can never make the server hold more
 * than RL_STORE_HANDSHAKE_MAX bytes. e (not for OK) names the client, the
 * op and the field. Pure; fuzzed. */
rl_store_pre rl_store_judge_unauth(const rl_store_frame *f, const char *peer, rl_err *e);
/* "SET", "GET", ... for messages. */
const char *rl_store_op_name(unsigned op);
void rl_store_db_free(rl_store_db *db);
size_t rl_store_db_bytes(const rl_store_db *db);
size_t rl_store_db_count(const rl_store_db *db);

typedef enum {
    RL_STORE_STEP_MORE = 0, /* incomplete frame: st->need is the size it will have */
    RL_STORE_STEP_REPLY,    /* a response frame was appended to out */
    RL_STORE_STEP_WAIT,     /* GET of an absent key with a wait: park it (st->key, st->wait_ms) */
    RL_STORE_STEP_ERROR,    /* protocol error: an EPROTO frame was appended; close after it */
    RL_STORE_STEP_NOMEM,    /* could not grow out: drop the connection */
} rl_store_step_result;

typedef struct rl_store_step {
    size_t used;        /* bytes of `in` the request took (0 for MORE) */
    size_t need;        /* MORE: total frame bytes needed (24 until the header is in) */
    uint16_t op;        /* the request's op (REPLY/WAIT) */
    uint32_t wait_ms;   /* WAIT */
    const uint8_t *key; /* REPLY/WAIT: the request's key (points into `in`) */
    uint32_t klen;
    bool wrote;         /* REPLY: the key now has a (new) value: wake its waiters */
    bool auth_failed;   /* ERROR after a refused CHALLENGE/AUTH or an op before AUTH
                           (e names the client): log it as an authentication failure */
} rl_store_step;

/* Handle the first request in in[0..len). `peer` names the client in
 * protocol errors (e is filled for ERROR and NOMEM only). */
rl_store_step_result rl_store_db_step(rl_store_db *db, rl_store_session *sess,
                                      const uint8_t *in, size_t len, const char *peer,
                                      rl_store_buf *out, rl_store_step *st, rl_err *e);
/* Answer a parked GET: appends OK + value and returns 1 if the key exists;
 * otherwise appends NOTFOUND if `expired` and returns 0; -1 on no memory. */
int rl_store_db_answer_get(rl_store_db *db, const uint8_t *key, uint32_t klen, bool expired,
                           rl_store_buf *out);

/* The server's limits on connections (store_server.c says why each
 * default is what it is): tests shorten the clocks. */
typedef struct rl_store_limits {
    double handshake_s;   /* accept to authenticated (no secret: to the first answer) */
    double idle_s;        /* nothing pending this long: closed */
    double evict_after_s; /* a newcomer over a cap displaces handshakes older than this */
    int unauth_max;       /* handshaking connections in all */
    int unauth_per_addr;  /* ... from one source address */
} rl_store_limits;
void rl_store_limits_default(rl_store_limits *l);
/* rl_store_server_start_auth with limits (NULL: the defaults). */
int rl_store_server_start_limits(const char *host, int port, const void *secret, size_t slen,
                                 const rl_store_limits *lim, rl_store_server **out, rl_err *e);

/* Printable form of a (possibly binary) key for messages: at most ~80
 * characters, non-printables as \xNN. Returns dst. */
char *rl_store_key_desc(char *dst, size_t n, const void *key, size_t klen);

#endif
