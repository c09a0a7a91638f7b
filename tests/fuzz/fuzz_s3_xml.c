/* libFuzzer target: the XML answers of S3 and STS (errors, listings,
 * multipart upload ids, web-identity credentials), which come from the
 * network. The first byte picks the parser. Any input must parse or fail
 * with a one-line message -- never crash, leak or hang -- and what parses
 * must be consistent (terminated strings, counts that match). */
#include <stdlib.h>
#include <string.h>

#include "s3/s3.h"

static void check_msg(int rc, const rl_err *e) {
    if (rc != RL_OK && rc != RL_EIO && rc != RL_ENOMEM) abort();
    if (rc != RL_OK && (strchr(e->msg, '\n') || !e->msg[0])) abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    rl_err e = {0};
    switch (data[0] % 5) {
    case 0: {
        char code[64], msg[256];
        bool is = rl_s3_parse_error(body, len, code, sizeof code, msg, sizeof msg);
        if (strnlen(code, sizeof code) == sizeof code || strnlen(msg, sizeof msg) == sizeof msg) abort();
        (void)is;
        break;
    }
    case 1: {
        rl_s3_list l = {0};
        bool tr;
        char tok[128];
        int rc = rl_s3_parse_list(body, len, &l, &tr, tok, sizeof tok, &e);
        check_msg(rc, &e);
        for (size_t i = 0; i < l.n; i++)
            if (!l.keys[i] || !l.keys[i][0]) abort();
        if (rc == RL_OK && tr && !tok[0]) abort();
        rl_s3_list_free(&l);
        break;
    }
    case 2: {
        char id[256];
        int rc = rl_s3_parse_upload_id(body, len, id, sizeof id, &e);
        check_msg(rc, &e);
        if (rc == RL_OK && (!id[0] || strnlen(id, sizeof id) == sizeof id)) abort();
        break;
    }
    case 4: {
        rl_s3_uploads u = {0};
        bool tr;
        char k[128], id[128];
        int rc = rl_s3_parse_uploads(body, len, &u, &tr, k, sizeof k, id, sizeof id, &e);
        check_msg(rc, &e);
        for (size_t i = 0; i < u.n; i++)
            if (!u.keys[i] || !u.keys[i][0] || !u.ids[i] || !u.ids[i][0]) abort();
        if (rc == RL_OK && tr && !k[0]) abort();
        rl_s3_uploads_free(&u);
        break;
    }
    default: {
        rl_s3_creds c;
        int rc = rl_s3_parse_sts(body, len, &c, &e);
        check_msg(rc, &e);
        if (rc == RL_OK && (!c.access_key[0] || !c.secret_key[0] || c.expires_unix <= 0)) abort();
        if (rc != RL_OK && (c.access_key[0] || c.secret_key[0])) abort();
        break;
    }
    }
    return 0;
}
