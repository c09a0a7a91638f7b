/* libFuzzer target for the store's wire handling: the frame header parser
 * and, through the same pure function the server uses (rl_store_db_step),
 * a whole connection's worth of requests against a small store. Checks,
 * besides memory safety:
 *  - parse: on success the header re-encodes to the same 24 bytes; on
 *    failure the code is RL_EINPUT, the output is untouched and the message
 *    is one line naming the peer;
 *  - requests: every step consumes a whole frame or asks for more, every
 *    answer is exactly one valid frame with the request's op, a protocol
 *    error ends the connection with an EPROTO frame, the store never holds
 *    more than its bound, and a SET that answered OK is visible to a GET
 *    of the same key with the same bytes;
 *  - before authentication (rl_store_judge_unauth, and the same streams
 *    through db_step): a header the judge lets through is PING, CHALLENGE
 *    or AUTH of its exact shape and at most RL_STORE_HANDSHAKE_MAX bytes
 *    in all; anything else is refused from the header alone, so the
 *    server is never asked to wait for a bigger frame. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/store_db.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_BYTES (64u << 10) /* small, so that EFULL is reachable */

static void check_parse(const uint8_t *data, size_t size) {
    size_t len = size < RL_STORE_HEADER_BYTES + 8 ? size : RL_STORE_HEADER_BYTES + 8;
    uint8_t *buf = malloc(len ? len : 1); /* exact size: ASan sees over-reads */
    if (!buf) return;
    if (len) memcpy(buf, data, len);
    rl_store_frame f, sentinel;
    memset(&f, 0xa5, sizeof f);
    sentinel = f;
    rl_err e = {0};
    int rc = rl_store_frame_parse(buf, len, "fuzz", &f, &e);
    if (rc == RL_OK) {
        uint8_t back[RL_STORE_HEADER_BYTES];
        rl_store_frame_encode(back, &f);
        if (len < RL_STORE_HEADER_BYTES || memcmp(back, buf, sizeof back) != 0) abort();
        if (f.klen > RL_STORE_MAX_KEY || f.vlen > RL_STORE_MAX_VALUE ||
            f.v2len > RL_STORE_MAX_VALUE || f.version != RL_STORE_VERSION)
            abort();
    } else {
        if (rc != RL_EINPUT || e.code != RL_EINPUT || memcmp(&f, &sentinel, sizeof f) != 0) abort();
        if (strncmp(e.msg, "store fuzz: ", 12) != 0 || strchr(e.msg, '\n')) abort();
    }
    free(buf);
}

/* The pre-authentication judge on the first 24 bytes. */
static void check_judge(const uint8_t *data, size_t size) {
    rl_store_frame f;
    rl_err e = {0};
    if (size < RL_STORE_HEADER_BYTES || rl_store_frame_parse(data, size, "fuzz", &f, &e) != RL_OK) return;
    rl_store_pre pre = rl_store_judge_unauth(&f, "fuzz", &e);
    size_t total = RL_STORE_HEADER_BYTES + (size_t)f.klen + f.vlen + f.v2len;
    bool shaped = (f.op == RL_STORE_PING && f.klen == 0 && f.vlen == 0) ||
                  (f.op == RL_STORE_CHALLENGE && f.klen >= 1 && f.vlen >= RL_STORE_NONCE_MIN &&
                   f.vlen <= RL_STORE_NONCE_MAX) ||
                  (f.op == RL_STORE_AUTH && f.klen >= 1 && f.vlen == 32);
    shaped = shaped && f.v2len == 0;
    if ((pre == RL_STORE_PRE_OK) != shaped) abort();
    if (pre == RL_STORE_PRE_OK && total > RL_STORE_HANDSHAKE_MAX) abort();
    if (pre == RL_STORE_PRE_REFUSED &&
        (f.op == RL_STORE_PING || f.op == RL_STORE_CHALLENGE || f.op == RL_STORE_AUTH))
        abort();
    if (pre != RL_STORE_PRE_OK && (strncmp(e.msg, "store fuzz: ", 12) != 0 || strchr(e.msg, '\n') ||
                                   !strstr(e.msg, "before authentication")))
        abort();
}

/* A store that wants a secret, before AUTH, seeing only the header of the
 * next frame: either it refuses now, or what it waits for is no bigger
 * than a handshake frame. */
static void check_header_only(rl_store_db *db, rl_store_session *sess, const uint8_t *in, size_t len) {
    if (sess->authed || len < RL_STORE_HEADER_BYTES) return;
    rl_store_session copy = *sess;
    rl_store_buf out = {0};
    rl_store_step st;
    rl_err e = {0};
    rl_store_step_result r = rl_store_db_step(db, &copy, in, RL_STORE_HEADER_BYTES, "fuzz", &out, &st, &e);
    if (r == RL_STORE_STEP_MORE && st.need > RL_STORE_HANDSHAKE_MAX) abort();
    if (r == RL_STORE_STEP_WAIT || (r == RL_STORE_STEP_REPLY && st.op != RL_STORE_PING)) abort();
    rl_store_buf_free(&out);
}

/* out must hold exactly one frame with this op; returns its header. */
static rl_store_frame one_frame(const rl_store_buf *out, uint16_t op) {
    rl_store_frame f;
    rl_err e;
    if (rl_store_frame_parse(out->p, out->len, "srv", &f, &e) != RL_OK) abort();
    if (out->len != RL_STORE_HEADER_BYTES + (size_t)f.klen + f.vlen + f.v2len) abort();
    if (op && f.op != op) abort();
    return f;
}

static void check_stream(const uint8_t *data, size_t size) {
    uint8_t *in = malloc(size ? size : 1);
    if (!in) return;
    if (size) memcpy(in, data, size);
    rl_store_db *db = rl_store_db_new(FUZZ_MAX_BYTES);
    if (!db) abort();
    /* The input's length picks the store's mode, so that the same streams
     * also run against a store that demands authentication (unauthenticated,
     * or as if a good AUTH had passed). */
    rl_store_session sess = {0};
    if (size % 3 != 0 && rl_store_db_set_secret(db, "fuzz-secret", 11) != 0) abort();
    if (size % 3 == 2) sess.authed = true;
    rl_store_buf out = {0}, chk = {0};
    size_t pos = 0;
    for (int guard = 0; guard < 100000; guard++) {
        rl_store_step st;
        rl_err e = {0};
        out.len = out.off = 0;
        if (size % 3 == 1) check_header_only(db, &sess, in + pos, size - pos);
        bool was_authed = sess.authed;
        rl_store_step_result r = rl_store_db_step(db, &sess, in + pos, size - pos, "fuzz", &out, &st, &e);
        if (rl_store_db_bytes(db) > FUZZ_MAX_BYTES) abort();
        if (r == RL_STORE_STEP_MORE) {
            if (out.len != 0 || st.need <= size - pos || st.need < RL_STORE_HEADER_BYTES) abort();
            /* before AUTH nothing bigger than a handshake frame is waited for */
            if (size % 3 == 1 && !was_authed && st.need > RL_STORE_HANDSHAKE_MAX) abort();
            break;
        }
        if (r == RL_STORE_STEP_NOMEM) break;
        if (r == RL_STORE_STEP_ERROR) {
            rl_store_frame f = one_frame(&out, 0);
            if ((f.status != RL_STORE_EPROTO && f.status != RL_STORE_EAUTH) || e.code == RL_OK ||
                strchr(e.msg, '\n'))
                abort();
            if ((f.status == RL_STORE_EAUTH) != st.auth_failed) abort();
            if (st.auth_failed && size % 3 == 0) abort(); /* an open store never refuses */
            break; /* the server closes the connection */
        }
        if (st.used < RL_STORE_HEADER_BYTES || st.used > size - pos) abort();
        if (size % 3 == 1 && !was_authed && st.used > RL_STORE_HANDSHAKE_MAX) abort();
        if (r == RL_STORE_STEP_WAIT) {
            if (out.len != 0 || st.op != RL_STORE_GET || st.wait_ms == 0) abort();
            /* what the server does at the deadline */
            if (rl_store_db_answer_get(db, st.key, st.klen, true, &out) != 0) abort();
            if (one_frame(&out, RL_STORE_GET).status != RL_STORE_NOTFOUND) abort();
        } else {
            rl_store_frame f = one_frame(&out, st.op);
            if (f.status == RL_STORE_EPROTO || f.status == RL_STORE_EAUTH) abort();
            /* a store with a secret never answers a data op before AUTH */
            if (size % 3 == 1 && st.op != RL_STORE_PING && st.op != RL_STORE_CHALLENGE &&
                st.op != RL_STORE_AUTH && !sess.authed)
                abort();
            if (st.op == RL_STORE_SET && f.status == RL_STORE_OK) {
                /* oracle: the value just set is what a GET returns */
                const uint8_t *v = st.key + st.klen;
                uint32_t vlen = (uint32_t)(st.used - RL_STORE_HEADER_BYTES - st.klen);
                chk.len = chk.off = 0;
                if (rl_store_db_answer_get(db, st.key, st.klen, false, &chk) != 1) abort();
                rl_store_frame g = one_frame(&chk, RL_STORE_GET);
                if (g.vlen != vlen || memcmp(chk.p + RL_STORE_HEADER_BYTES, v, vlen) != 0) abort();
            }
        }
        pos += st.used;
    }
    rl_store_buf_free(&out);
    rl_store_buf_free(&chk);
    rl_store_db_free(db);
    free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_parse(data, size);
    check_judge(data, size);
    check_stream(data, size);
    return 0;
}
