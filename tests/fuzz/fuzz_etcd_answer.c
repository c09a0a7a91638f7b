/* libFuzzer target: etcd's JSON-gateway answers (range, txn, lease grant,
 * keepalive) and the rendezvous records kept in etcd values (leader,
 * member), all of which come from the network or from anyone with etcdctl.
 * The first byte picks the parser. Any input must parse or fail with RL_EIO
 * and a one-line message -- never crash, leak or hang -- and what parses
 * must be internally consistent. */
#include <stdlib.h>
#include <string.h>

#include "elect/elect_internal.h"
#include "etcd/etcd.h"
#include "rdzv/members_internal.h"

static void check_msg(int rc, const rl_err *e) {
    if (rc != RL_OK && rc != RL_EIO && rc != RL_EPEER) abort();
    if (rc != RL_OK && (strchr(e->msg, '\n') || !e->msg[0])) abort();
}

static void check_kvs(const rl_etcd_kvs *r) {
    if (r->n < 0 || (r->n > 0 && !r->kvs)) abort();
    for (int i = 0; i < r->n; i++) {
        const rl_etcd_kv *kv = &r->kvs[i];
        if (!kv->key || !kv->value || kv->key[kv->key_len] || kv->value[kv->value_len]) abort();
        if (kv->create_rev < 0 || kv->mod_rev < 0 || kv->version < 0 || kv->lease < 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    rl_err e = {0};
    int rc;
    switch (data[0] % 6) {
    case 0: {
        rl_etcd_kvs r;
        rc = rl_etcd_parse_range(body, len, "fuzz range", &r, &e);
        check_msg(rc, &e);
        if (rc == RL_OK) check_kvs(&r);
        else if (r.n || r.kvs) abort();
        rl_etcd_kvs_free(&r);
        break;
    }
    case 1: {
        rl_etcd_kvs r;
        bool ok;
        rc = rl_etcd_parse_txn(body, len, "fuzz txn", &ok, &r, &e);
        check_msg(rc, &e);
        if (rc == RL_OK) check_kvs(&r);
        rl_etcd_kvs_free(&r);
        rc = rl_etcd_parse_txn(body, len, "fuzz txn", &ok, NULL, &e);
        check_msg(rc, &e);
        break;
    }
    case 2: {
        int64_t id = 0, ttl = 0;
        rc = rl_etcd_parse_grant(body, len, "fuzz grant", &id, &ttl, &e);
        check_msg(rc, &e);
        if (rc == RL_OK && (id == 0 || ttl <= 0)) abort();
        break;
    }
    case 3: {
        int64_t ttl = -1;
        rc = rl_etcd_parse_keepalive(body, len, "fuzz keepalive", &ttl, &e);
        check_msg(rc, &e);
        if (ttl < 0) abort();
        break;
    }
    case 4: {
        rl_leader l;
        rc = rl_elect_etcd_parse_leader("/k", body, len, &l, &e);
        check_msg(rc, &e);
        if (rc == RL_OK && (!l.id[0] || !l.addr[0] || l.port < 0 || l.port > 65535)) abort();
        if (rc != RL_OK && !strstr(e.msg, "'/k'")) abort();
        break;
    }
    default: {
        rl_peer p;
        rc = rl_members_etcd_parse("/m/node-1", "/m/", body, len, &p, &e);
        check_msg(rc, &e);
        if (rc == RL_OK && (strcmp(p.id, "node-1") || !p.addr[0] || !p.ready)) abort();
        break;
    }
    }
    return 0;
}
