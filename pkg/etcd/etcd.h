/* etcd: a small etcd v3 client over etcd's JSON gateway
 * (the grpc-gateway under /v3/ of etcd 3.4), on pkg/http.
 *
 * The gateway speaks protobuf's JSON mapping: keys and values are base64,
 * int64 fields are JSON strings, and fields holding their default value (0,
 * false, empty, the first enum member) are left out. Every answer is parsed
 * strictly: a member of the wrong type or a malformed base64/int64 string is
 * RL_EIO naming the member and the call; members we do not use are ignored
 * (newer etcd versions add some).
 *
 * One rl_etcd owns one HTTP handle and is used by one thread at a time;
 * threads that talk to etcd concurrently each make their own. Every call is
 * bounded by the client's timeout (watch streams by their idle timeout and
 * the abort flag instead). Errors:
 *   RL_EPEER / RL_ETIMEOUT  etcd unreachable, refused, too slow, 5xx, or a
 *                           gateway "Unavailable" (worth retrying)
 *   RL_EINPUT               etcd rejected the request as invalid (ours or
 *                           the user's configuration is wrong)
 *   RL_EIO                  an answer we cannot make sense of
 *   RL_EABORT               the abort flag was set
 * Messages name the call and the endpoint; values are never put in them. */
#ifndef RL_RDZV_ETCD_INTERNAL_H
#define RL_RDZV_ETCD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"
#include "util/util.h"

typedef struct rl_etcd rl_etcd;

/* endpoint: "http://host:port" or "https://host:port" (no path; a trailing
 * '/' is tolerated). timeout_s bounds every unary call (0: 5 s). A bad
 * endpoint is RL_EINPUT naming it. No connection is made here. */
int rl_etcd_new(const char *endpoint, double timeout_s, rl_etcd **out, rl_err *e);
void rl_etcd_free(rl_etcd *c);
/* Checked about once a second while any call runs; set by another thread to
 * cancel it (RL_EABORT). NULL: none. */
void rl_etcd_set_abort(rl_etcd *c, const volatile int *flag);
void rl_etcd_set_timeout(rl_etcd *c, double timeout_s);
const char *rl_etcd_endpoint(const rl_etcd *c);

/* One key-value as etcd reports it. key and value are malloc'd and
 * NUL-terminated for convenience (the lengths do not count the NUL; both may
 * hold any bytes). */
typedef struct rl_etcd_kv {
    char *key, *value;
    size_t key_len, value_len;
    int64_t create_rev, mod_rev, version, lease;
} rl_etcd_kv;

/* A range answer (and the range parts of a txn answer). */
typedef struct rl_etcd_kvs {
    int64_t revision; /* the store revision the answer reflects (header) */
    rl_etcd_kv *kvs;
    int n;
    int64_t count; /* keys in the range on the server (may exceed n with a limit) */
    bool more;
} rl_etcd_kvs;
void rl_etcd_kvs_free(rl_etcd_kvs *r);

/* ---- leases ------------------------------------------------------------------------ */
/* Grant a lease of ttl_s seconds (>= 1); *id its id, *ttl_out (optional)
 * the TTL the server granted (it may raise it to its minimum). */
int rl_etcd_lease_grant(rl_etcd *c, int64_t ttl_s, int64_t *id, int64_t *ttl_out, rl_err *e);
/* One keepalive round trip: *ttl is the renewed TTL, 0 when the lease no
 * longer exists (expired or revoked) -- not an error. */
int rl_etcd_lease_keepalive(rl_etcd *c, int64_t id, int64_t *ttl, rl_err *e);
/* Seconds the lease has left (etcd rounds up), 0 when it no longer exists. */
int rl_etcd_lease_ttl(rl_etcd *c, int64_t id, int64_t *ttl, rl_err *e);
/* Revoke (every key bound to it is deleted). A lease that no longer exists
 * counts as revoked. */
int rl_etcd_lease_revoke(rl_etcd *c, int64_t id, rl_err *e);

/* ---- keys -------------------------------------------------------------------------- */
/* lease 0: not bound to a lease. *rev (optional): the revision of the put. */
int rl_etcd_put(rl_etcd *c, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev, rl_err *e);
/* The key (out->n 0 or 1), or with prefix every key starting with `key`
 * (range_end = key with its last byte incremented; an empty prefix or one
 * of 0xff bytes only means "every key"). out is reset first; free it with
 * rl_etcd_kvs_free whatever the result. */
int rl_etcd_range(rl_etcd *c, const char *key, bool prefix, rl_etcd_kvs *out, rl_err *e);
/* *deleted (optional): how many keys went. */
int rl_etcd_delete(rl_etcd *c, const char *key, bool prefix, int64_t *deleted, rl_err *e);

/* ---- transactions ---------------------------------------------------------------- */
enum { RL_ETCD_CMP_CREATE = 1, RL_ETCD_CMP_MOD, RL_ETCD_CMP_VALUE, RL_ETCD_CMP_VERSION };
/* "target(key) == operand": rev for CREATE/MOD/VERSION (create 0: the key
 * does not exist), value/value_len for VALUE. Only equality: it is all the
 * elector needs. */
typedef struct rl_etcd_cmp {
    int target;
    const char *key;
    int64_t rev;
    const void *value;
    size_t value_len;
} rl_etcd_cmp;

enum { RL_ETCD_OP_PUT = 1, RL_ETCD_OP_RANGE, RL_ETCD_OP_DELETE };
typedef struct rl_etcd_op {
    int type;
    const char *key; /* single keys only */
    const void *value;
    size_t value_len;
    int64_t lease; /* PUT */
} rl_etcd_op;

/* Run the success ops if every comparison holds, else the failure ops.
 * *succeeded says which; kvs (optional) collects the key-values of the RANGE
 * ops of the branch taken, in order, and its revision the txn's revision. */
int rl_etcd_txn(rl_etcd *c, const rl_etcd_cmp *cmp, int ncmp, const rl_etcd_op *ok_ops,
                int nok, const rl_etcd_op *fail_ops, int nfail, bool *succeeded,
                rl_etcd_kvs *kvs, rl_err *e);

/* ---- watch --------------------------------------------------------------------------- */
enum { RL_ETCD_EV_PUT = 0, RL_ETCD_EV_DELETE = 1 };
typedef struct rl_etcd_event {
    int type;
    rl_etcd_kv kv; /* DELETE: key and mod_rev only */
} rl_etcd_event;

/* One message of a watch stream ({"result":{...}}). A message with no
 * events and neither flag is a progress notification. */
typedef struct rl_etcd_watch_msg {
    int64_t revision, watch_id, compact_revision;
    bool created, canceled;
    char cancel_reason[160];
    rl_etcd_event *events;
    int n;
} rl_etcd_watch_msg;
void rl_etcd_watch_msg_free(rl_etcd_watch_msg *m);

/* Called for every message, in order; non-zero stops the watch (then
 * rl_etcd_watch returns RL_OK). */
typedef int (*rl_etcd_watch_fn)(void *ud, const rl_etcd_watch_msg *m);

/* Watch `key` (or the prefix) from start_rev (0: from now) until fn stops
 * it. progress_notify is requested, so a healthy stream is not silent for
 * longer than the server's progress interval (etcd's default is 10 min;
 * --experimental-watch-progress-notify-interval shortens it): no byte for
 * idle_timeout_s (0: 60 s) ends the watch with RL_ETIMEOUT. A stream that
 * ends, or a canceled watch (compaction: m->compact_revision > 0, after
 * fn saw it), is RL_EPEER; an unparseable line RL_EIO. */
int rl_etcd_watch(rl_etcd *c, const char *key, bool prefix, int64_t start_rev,
                  double idle_timeout_s, rl_etcd_watch_fn fn, void *ud, rl_err *e);

/* ---- parsers (exposed for the fuzz targets and tests) ------------------------------- */
/* `what` names the call in messages ("etcd range"). All RL_EIO on bad input. */
int rl_etcd_parse_range(const char *body, size_t len, const char *what, rl_etcd_kvs *out,
                        rl_err *e);
int rl_etcd_parse_txn(const char *body, size_t len, const char *what, bool *succeeded,
                      rl_etcd_kvs *kvs, rl_err *e);
/* Lease grant / keepalive answers (keepalive is wrapped in "result"). */
int rl_etcd_parse_grant(const char *body, size_t len, const char *what, int64_t *id,
                        int64_t *ttl, rl_err *e);
int rl_etcd_parse_keepalive(const char *body, size_t len, const char *what, int64_t *ttl,
                            rl_err *e);
/* One line of a watch stream (without its newline). m is reset first;
 * free it whatever the result. An {"error":...} line is RL_EPEER with
 * the gateway's message. */
int rl_etcd_parse_watch_msg(const char *line, size_t len, const char *what,
                            rl_etcd_watch_msg *m, rl_err *e);

/* Feeds watch-stream bytes through the line splitter (rl_http_lines, whose
 * `what` names the stream in errors), each non-blank line to the parser
 * and then to fn. Returns RL_OK to go on; *stop set when fn asked to stop
 * (later bytes are ignored); an error from a parser or a canceled watch
 * fills e. */
int rl_etcd_watch_feed(rl_http_lines *l, const char *data, size_t len, rl_etcd_watch_fn fn,
                       void *ud, bool *stop, rl_err *e);

/* Records kept as JSON objects in etcd values (untrusted: anyone with
 * etcdctl can edit them). rl_etcd_record parses one (NULL and RL_EIO
 * naming `key` when it is not an object; cJSON_Delete the result);
 * rl_etcd_record_str copies a string member into out (a missing required
 * one, a non-string, an empty required one or one of n bytes or more is
 * RL_EIO naming the key and member). Members nobody reads are ignored
 * (newer versions may add some). */
struct cJSON;
struct cJSON *rl_etcd_record(const char *key, const char *val, size_t len, rl_err *e);
int rl_etcd_record_str(const struct cJSON *j, const char *key, const char *name, bool required,
                       char *out, size_t n, rl_err *e);


#endif
