/* The store's state (a chained hash table of binary keys) and the handling
 * of one request frame. No sockets here: store_server.c feeds bytes in and
 * sends what lands in `out`, and the fuzz target drives the same function. */
#include "store/store_db.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Charged per key on top of its bytes, so that a flood of empty keys is
 * bounded by max_bytes too. */
#define ENTRY_OVERHEAD 64

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    uint8_t *val;
    uint32_t vlen, klen;
    uint8_t key[];
} entry;

struct rl_store_db {
    entry **buckets;
    size_t nbuckets, count, bytes, max_bytes;
    uint64_t seed;
    uint8_t *secret; /* NULL: an open store (static rendezvous) */
    size_t slen;
};

/* ---- buffers ------------------------------------------------------------------- */
int rl_store_buf_reserve(rl_store_buf *b, size_t extra) {
    if (b->cap - b->len >= extra) return 0;
    /* Double small buffers; grow big ones (a 64 MiB value arriving in
     * chunks) by at most 8 MiB beyond the need, so a buffer never holds
     * nearly twice what it must. */
    size_t want = b->len + extra, cap = b->cap ? b->cap * 2 : 256;
    if (cap > want + (8u << 20)) cap = want + (8u << 20);
    if (cap < want) cap = want;
    uint8_t *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p, b->cap = cap;
    return 0;
}

void rl_store_buf_compact(rl_store_buf *b) {
    if (b->off == 0) return;
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off, b->off = 0;
    /* Give back a large buffer once it drained: one 64 MiB value should not
     * pin 64 MiB per connection for the rest of the job. */
    if (b->len == 0 && b->cap > (1u << 20)) {
        free(b->p);
        b->p = NULL, b->cap = 0;
    }
}

void rl_store_buf_free(rl_store_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int rl_store_buf_frame(rl_store_buf *b, uint16_t op, uint32_t status, const void *key,
                       uint32_t klen, const void *val, uint32_t vlen, const void *val2,
                       uint32_t v2len) {
    size_t n = RL_STORE_HEADER_BYTES + (size_t)klen + vlen + v2len;
    if (rl_store_buf_reserve(b, n) != 0) return -1;
    rl_store_frame f = {.version = RL_STORE_VERSION, .op = op, .status = status,
                        .klen = klen, .vlen = vlen, .v2len = v2len};
    uint8_t *p = b->p + b->len;
    rl_store_frame_encode(p, &f);
    p += RL_STORE_HEADER_BYTES;
    if (klen) memcpy(p, key, klen), p += klen;
    if (vlen) memcpy(p, val, vlen), p += vlen;
    if (v2len) memcpy(p, val2, v2len);
    b->len += n;
    return 0;
}

char *rl_store_key_desc(char *dst, size_t n, const void *key, size_t klen) {
    static const char hex[] = "0123456789abcdef";
    const uint8_t *k = key;
    size_t o = 0, limit = n < 84 ? n : 84;
    for (size_t i = 0; i < klen; i++) {
        uint8_t c = k[i];
        bool plain = c >= 0x20 && c < 0x7f && c != '\\' && c != '\'' && c != '"';
        size_t w = plain ? 1 : 4;
        if (o + w + 4 > limit) { /* room for "..." and NUL */
            if (o + 4 <= n) memcpy(dst + o, "...", 3), o += 3;
            break;
        }
        if (plain) {
            dst[o++] = (char)c;
        } else {
            dst[o++] = '\\', dst[o++] = 'x', dst[o++] = hex[c >> 4], dst[o++] = hex[c & 15];
        }
    }
    if (n) dst[o < n ? o : n - 1] = '\0';
    return dst;
}

/* ---- hash table ------------------------------------------------------------------ */
static uint64_t hash_key(const rl_store_db *db, const uint8_t *k, uint32_t klen) {
    uint64_t h = 1469598103934665603ull ^ db->seed; /* FNV-1a, then a mixer */
    for (uint32_t i = 0; i < klen; i++) h = (h ^ k[i]) * 1099511628211ull;
    return rl_hash64(h);
}

rl_store_db *rl_store_db_new(size_t max_bytes) {
    rl_store_db *db = calloc(1, sizeof *db);
    if (!db) return NULL;
    db->nbuckets = 64;
    db->buckets = calloc(db->nbuckets, sizeof *db->buckets);
    if (!db->buckets) {
        free(db);
        return NULL;
    }
    db->max_bytes = max_bytes;
    /* A per-process seed keeps a client from choosing colliding keys. */
    db->seed = rl_hash64((uint64_t)(rl_now() * 1e9) ^ (uint64_t)(uintptr_t)db);
    return db;
}

void rl_store_db_free(rl_store_db *db) {
    if (!db) return;
    for (size_t i = 0; i < db->nbuckets; i++) {
        for (entry *x = db->buckets[i], *nx; x; x = nx) {
            nx = x->next;
            free(x->val);
            free(x);
        }
    }
    free(db->buckets);
    if (db->secret) OPENSSL_cleanse(db->secret, db->slen);
    free(db->secret);
    free(db);
}

size_t rl_store_db_bytes(const rl_store_db *db) { return db->bytes; }
size_t rl_store_db_count(const rl_store_db *db) { return db->count; }

static entry **find(rl_store_db *db, const uint8_t *k, uint32_t klen, uint64_t h) {
    entry **pp = &db->buckets[h & (db->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->klen == klen && memcmp((*pp)->key, k, klen) == 0) break;
    return pp;
}

static void grow(rl_store_db *db) {
    size_t nb = db->nbuckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b) return; /* keep the old table: slower, still correct */
    for (size_t i = 0; i < db->nbuckets; i++) {
        for (entry *x = db->buckets[i], *nx; x; x = nx) {
            nx = x->next;
            x->next = b[x->hash & (nb - 1)];
            b[x->hash & (nb - 1)] = x;
        }
    }
    free(db->buckets);
    db->buckets = b, db->nbuckets = nb;
}

/* Set key to a copy of val. 0, or RL_STORE_EFULL, or -1 (out of memory). */
static int put(rl_store_db *db, const uint8_t *k, uint32_t klen, const uint8_t *v, uint32_t vlen) {
    uint64_t h = hash_key(db, k, klen);
    entry **pp = find(db, k, klen, h), *x = *pp;
    size_t old = x ? (size_t)x->vlen : 0;
    size_t add = x ? 0 : (size_t)klen + ENTRY_OVERHEAD;
    if (db->bytes - old + vlen + add > db->max_bytes) return RL_STORE_EFULL;
    uint8_t *nv = malloc(vlen ? vlen : 1);
    if (!nv) return -1;
    if (vlen) memcpy(nv, v, vlen);
    if (!x) {
        x = malloc(sizeof *x + klen);
        if (!x) {
            free(nv);
            return -1;
        }
        x->hash = h, x->klen = klen, x->val = NULL, x->vlen = 0;
        memcpy(x->key, k, klen);
        x->next = NULL;
        *pp = x;
        db->count++;
    }
    free(x->val);
    x->val = nv, x->vlen = vlen;
    db->bytes = db->bytes - old + vlen + add;
    if (db->count > db->nbuckets) grow(db);
    return 0;
}

int rl_store_db_set_secret(rl_store_db *db, const void *secret, size_t len) {
    uint8_t *c = malloc(len ? len : 1);
    if (!c) return -1;
    memcpy(c, secret, len);
    if (db->secret) OPENSSL_cleanse(db->secret, db->slen);
    free(db->secret);
    db->secret = c, db->slen = len;
    return 0;
}

/* ---- authentication ---------------------------------------------------------------- */
/* The labels keep a server proof from ever being replayed as a client proof
 * (and the reverse); the client's proof also covers its id, so an id in
 * the logs is one the secret holder claimed. */
static void proof(const void *secret, size_t slen, const char *label, const void *a, size_t alen,
                  const void *b, size_t blen, const void *c, size_t clen, uint8_t mac[32]) {
    uint8_t buf[16 + 1 + 2 * RL_STORE_NONCE_MAX + RL_STORE_MAX_KEY];
    size_t n = strlen(label) + 1;
    memcpy(buf, label, n);
    memcpy(buf + n, a, alen), n += alen;
    memcpy(buf + n, b, blen), n += blen;
    if (clen) memcpy(buf + n, c, clen), n += clen;
    unsigned int ml = 32;
    HMAC(EVP_sha256(), secret, (int)slen, buf, n, mac, &ml);
}

void rl_store_proof_server(const void *secret, size_t slen, const uint8_t *cn, size_t cnlen,
                           const uint8_t *sn, uint8_t mac[32]) {
    proof(secret, slen, "rl-store-server", cn, cnlen, sn, 32, NULL, 0, mac);
}

void rl_store_proof_client(const void *secret, size_t slen, const uint8_t *sn, const uint8_t *cn,
                           size_t cnlen, const void *id, size_t idlen, uint8_t mac[32]) {
    proof(secret, slen, "rl-store-client", sn, 32, cn, cnlen, id, idlen, mac);
}

rl_store_pre rl_store_judge_unauth(const rl_store_frame *f, const char *peer, rl_err *e) {
    const char *op = rl_store_op_name(f->op);
    if (!peer) peer = "?";
    if (f->op != RL_STORE_PING && f->op != RL_STORE_CHALLENGE && f->op != RL_STORE_AUTH) {
        rl_errf(e, RL_EINPUT, "store %s: %s before authentication (this store requires the job's "
                "rendezvous secret)", peer, op);
        return RL_STORE_PRE_REFUSED;
    }
    /* The exact shapes of rl_store_auth's frames and of the connect PING:
     * every length is bounded here, so nothing larger is ever read. */
    uint32_t kmin = f->op == RL_STORE_PING ? 0 : 1, kmax = f->op == RL_STORE_PING ? 0 : RL_STORE_MAX_KEY;
    uint32_t vmin = f->op == RL_STORE_PING ? 0 : f->op == RL_STORE_AUTH ? 32 : RL_STORE_NONCE_MIN;
    uint32_t vmax = f->op == RL_STORE_PING ? 0 : f->op == RL_STORE_AUTH ? 32 : RL_STORE_NONCE_MAX;
    const char *field = NULL;
    uint32_t got = 0, lo = 0, hi = 0;
    if (f->klen < kmin || f->klen > kmax) field = "key (client id)", got = f->klen, lo = kmin, hi = kmax;
    else if (f->vlen < vmin || f->vlen > vmax) field = "value", got = f->vlen, lo = vmin, hi = vmax;
    else if (f->v2len != 0) field = "value2", got = f->v2len;
    if (!field) return RL_STORE_PRE_OK;
    if (lo == hi)
        rl_errf(e, RL_EINPUT, "store %s: %s before authentication: %s is %u bytes, expected %u",
                peer, op, field, (unsigned)got, (unsigned)lo);
    else
        rl_errf(e, RL_EINPUT, "store %s: %s before authentication: %s is %u bytes, expected "
                "%u..%u", peer, op, field, (unsigned)got, (unsigned)lo, (unsigned)hi);
    return RL_STORE_PRE_MALFORMED;
}

static entry *get(rl_store_db *db, const uint8_t *k, uint32_t klen) {
    return *find(db, k, klen, hash_key(db, k, klen));
}

static void del(rl_store_db *db, const uint8_t *k, uint32_t klen) {
    entry **pp = find(db, k, klen, hash_key(db, k, klen)), *x = *pp;
    if (!x) return;
    *pp = x->next;
    db->bytes -= (size_t)x->vlen + x->klen + ENTRY_OVERHEAD;
    db->count--;
    free(x->val);
    free(x);
}

/* ---- requests -------------------------------------------------------------------- */
static rl_store_step_result proto_error(rl_store_buf *out, uint16_t op, rl_err *e) {
    /* The reason goes back as the value, so that the client can say what
     * the server disliked; then the server closes the connection. */
    uint32_t n = (uint32_t)strlen(e->msg);
    if (rl_store_buf_frame(out, op, RL_STORE_EPROTO, NULL, 0, e->msg, n, NULL, 0) != 0)
        return RL_STORE_STEP_NOMEM;
    return RL_STORE_STEP_ERROR;
}

static rl_store_step_result reply(rl_store_buf *out, uint16_t op, uint32_t status,
                                  const void *v, uint32_t vlen, rl_err *e) {
    if (rl_store_buf_frame(out, op, status, NULL, 0, v, vlen, NULL, 0) != 0) {
        rl_errf(e, RL_ENOMEM, "store: out of memory for a %u-byte response", (unsigned)vlen);
        return RL_STORE_STEP_NOMEM;
    }
    return RL_STORE_STEP_REPLY;
}

/* Refuse an unauthenticated request: the reason goes back with EAUTH, then
 * the connection is closed like after a protocol error. */
static rl_store_step_result deny(rl_store_buf *out, uint16_t op, rl_store_step *st, rl_err *e) {
    st->auth_failed = true;
    uint32_t n = (uint32_t)strlen(e->msg);
    if (rl_store_buf_frame(out, op, RL_STORE_EAUTH, NULL, 0, e->msg, n, NULL, 0) != 0)
        return RL_STORE_STEP_NOMEM;
    return RL_STORE_STEP_ERROR;
}

rl_store_step_result rl_store_db_step(rl_store_db *db, rl_store_session *sess,
                                      const uint8_t *in, size_t len, const char *peer,
                                      rl_store_buf *out, rl_store_step *st, rl_err *e) {
    rl_err local;
    if (!e) e = &local;
    memset(st, 0, sizeof *st);
    st->need = RL_STORE_HEADER_BYTES;
    if (len < RL_STORE_HEADER_BYTES) {
        /* Reject a foreign protocol as soon as its first bytes show it: an
         * HTTP client sending 18 bytes would otherwise wait on us forever. */
        static const uint8_t magic[4] = {0x52, 0x4c, 0x53, 0x54};
        if (len > 0 && memcmp(in, magic, len < 4 ? len : 4) != 0) {
            rl_errf(e, RL_EINPUT, "store %s: bad magic (not a ringleader store frame)",
                    peer ? peer : "?");
            return proto_error(out, RL_STORE_PING, e);
        }
        return RL_STORE_STEP_MORE;
    }
    rl_store_frame f;
    if (rl_store_frame_parse(in, len, peer, &f, e) != RL_OK) {
        unsigned raw = (unsigned)in[6] << 8 | in[7];
        return proto_error(out, raw >= RL_STORE_SET && raw <= RL_STORE_AUTH ? (uint16_t)raw
                                                                            : RL_STORE_PING, e);
    }
    const char *op = rl_store_op_name(f.op);
    if (f.status != RL_STORE_OK) {
        rl_errf(e, RL_EINPUT, "store %s: %s request with status %u, expected 0", peer, op,
                (unsigned)f.status);
        return proto_error(out, f.op, e);
    }
    /* Before authentication the header alone decides, so that a peer
     * without the secret never gets a body buffered (a 64 MiB SET would
     * otherwise be read whole before it is refused). */
    if (db->secret && !sess->authed) {
        rl_store_pre pre = rl_store_judge_unauth(&f, peer, e);
        if (pre == RL_STORE_PRE_REFUSED) return deny(out, f.op, st, e);
        if (pre == RL_STORE_PRE_MALFORMED) return proto_error(out, f.op, e);
    }
    size_t total = RL_STORE_HEADER_BYTES + (size_t)f.klen + f.vlen + f.v2len;
    if (len < total) {
        st->need = total;
        return RL_STORE_STEP_MORE;
    }
    const uint8_t *k = in + RL_STORE_HEADER_BYTES, *v = k + f.klen, *v2 = v + f.vlen;
    st->used = total, st->op = f.op, st->key = k, st->klen = f.klen;
    if (f.op == RL_STORE_PING) return reply(out, f.op, RL_STORE_OK, NULL, 0, e);
    if (f.klen == 0) {
        rl_errf(e, RL_EINPUT, "store %s: %s with an empty key", peer, op);
        return proto_error(out, f.op, e);
    }
    if (f.op != RL_STORE_CAS && f.v2len != 0) {
        rl_errf(e, RL_EINPUT, "store %s: %s carries a second value (%u bytes)", peer, op,
                (unsigned)f.v2len);
        return proto_error(out, f.op, e);
    }
    char idd[96];
    if (f.op == RL_STORE_CHALLENGE && (f.vlen < RL_STORE_NONCE_MIN || f.vlen > RL_STORE_NONCE_MAX)) {
        rl_errf(e, RL_EINPUT, "store %s: CHALLENGE nonce is %u bytes, expected %u..%u", peer,
                (unsigned)f.vlen, RL_STORE_NONCE_MIN, RL_STORE_NONCE_MAX);
        return proto_error(out, f.op, e);
    }
    uint32_t want = f.op == RL_STORE_GET ? 4 : f.op == RL_STORE_ADD ? 8 : f.op == RL_STORE_DEL ? 0
                  : f.op == RL_STORE_AUTH ? 32 : f.vlen;
    if (f.vlen != want) {
        rl_errf(e, RL_EINPUT, "store %s: %s value is %u bytes, expected %u", peer, op,
                (unsigned)f.vlen, (unsigned)want);
        return proto_error(out, f.op, e);
    }
    entry *x;
    int rc;
    switch (f.op) {
    case RL_STORE_SET:
        rc = put(db, k, f.klen, v, f.vlen);
        if (rc < 0) return reply(out, f.op, RL_STORE_EFULL, NULL, 0, e);
        st->wrote = rc == 0;
        return reply(out, f.op, rc == 0 ? RL_STORE_OK : RL_STORE_EFULL, NULL, 0, e);
    case RL_STORE_GET:
        x = get(db, k, f.klen);
        if (x) return reply(out, f.op, RL_STORE_OK, x->val, x->vlen, e);
        st->wait_ms = rl_get_be32(v);
        if (st->wait_ms == 0) return reply(out, f.op, RL_STORE_NOTFOUND, NULL, 0, e);
        return RL_STORE_STEP_WAIT;
    case RL_STORE_ADD: {
        x = get(db, k, f.klen);
        int64_t cur = 0, delta = (int64_t)rl_get_be64(v), sum;
        if (x && x->vlen != 8) return reply(out, f.op, RL_STORE_MISMATCH, NULL, 0, e);
        if (x) cur = (int64_t)rl_get_be64(x->val);
        /* A counter that overflows is a bug in the caller; wrapping would
         * make two barriers agree on nonsense. */
        if (__builtin_add_overflow(cur, delta, &sum))
            return reply(out, f.op, RL_STORE_MISMATCH, NULL, 0, e);
        uint8_t nb[8];
        rl_put_be64(nb, (uint64_t)sum);
        rc = put(db, k, f.klen, nb, 8);
        if (rc != 0) return reply(out, f.op, RL_STORE_EFULL, NULL, 0, e);
        st->wrote = true;
        return reply(out, f.op, RL_STORE_OK, nb, 8, e);
    }
    case RL_STORE_CAS:
        x = get(db, k, f.klen);
        /* Expected empty means "only if absent", so a present key never
         * matches an empty expectation (even when its value is empty). */
        if (x ? (f.vlen == 0 || x->vlen != f.vlen || memcmp(x->val, v, f.vlen) != 0)
              : f.vlen != 0) {
            return reply(out, f.op, RL_STORE_MISMATCH, x ? x->val : NULL, x ? x->vlen : 0, e);
        }
        rc = put(db, k, f.klen, v2, f.v2len);
        if (rc != 0) return reply(out, f.op, RL_STORE_EFULL, NULL, 0, e);
        st->wrote = true;
        return reply(out, f.op, RL_STORE_OK, v2, f.v2len, e);
    case RL_STORE_DEL:
        del(db, k, f.klen);
        return reply(out, f.op, RL_STORE_OK, NULL, 0, e);
    case RL_STORE_CHALLENGE: {
        if (!db->secret) return reply(out, f.op, RL_STORE_OK, NULL, 0, e); /* open store */
        uint8_t ans[64]; /* server nonce, then the server's proof */
        if (RAND_bytes(sess->snonce, sizeof sess->snonce) != 1) {
            rl_errf(e, RL_EINTERNAL, "store %s: no random bytes for a nonce", peer);
            return proto_error(out, f.op, e);
        }
        memcpy(sess->cnonce, v, f.vlen);
        sess->cnlen = f.vlen;
        sess->challenged = true;
        memcpy(ans, sess->snonce, 32);
        rl_store_proof_server(db->secret, db->slen, v, f.vlen, sess->snonce, ans + 32);
        return reply(out, f.op, RL_STORE_OK, ans, sizeof ans, e);
    }
    case RL_STORE_AUTH: {
        if (!db->secret) return reply(out, f.op, RL_STORE_OK, NULL, 0, e);
        rl_store_key_desc(idd, sizeof idd, k, f.klen);
        if (!sess->challenged) {
            rl_errf(e, RL_EINPUT, "store %s: AUTH as '%s' without a CHALLENGE first", peer, idd);
            return deny(out, f.op, st, e);
        }
        uint8_t mac[32];
        rl_store_proof_client(db->secret, db->slen, sess->snonce, sess->cnonce, sess->cnlen, k,
                              f.klen, mac);
        sess->challenged = false; /* one proof per nonce */
        if (CRYPTO_memcmp(mac, v, 32) != 0) {
            rl_errf(e, RL_EINPUT, "store %s: authentication as '%s' refused (wrong rendezvous "
                    "secret)", peer, idd);
            return deny(out, f.op, st, e);
        }
        sess->authed = true;
        return reply(out, f.op, RL_STORE_OK, NULL, 0, e);
    }
    default:
        break;
    }
    rl_errf(e, RL_EINTERNAL, "store %s: unhandled op %u", peer, (unsigned)f.op);
    return proto_error(out, f.op, e);
}

int rl_store_db_answer_get(rl_store_db *db, const uint8_t *key, uint32_t klen, bool expired,
                           rl_store_buf *out) {
    entry *x = get(db, key, klen);
    if (x) return rl_store_buf_frame(out, RL_STORE_GET, RL_STORE_OK, NULL, 0, x->val, x->vlen,
                                     NULL, 0) == 0 ? 1 : -1;
    if (!expired) return 0;
    return rl_store_buf_frame(out, RL_STORE_GET, RL_STORE_NOTFOUND, NULL, 0, NULL, 0, NULL, 0) == 0
               ? 0 : -1;
}
