/* libFuzzer target for an exec plugin's answer (rl_k8s_exec_credential_
 * parse): whatever the plugin prints on stdout. Contract: no crash, leak
 * or UB; success only with a non-empty printable token; on failure
 * RL_EINPUT (or RL_ENOMEM), one line, and -- the point -- never the
 * token: if the input holds a status.token string, the message does not
 * contain it. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The status.token the input carries, if it parses as JSON (malloc'd). */
static char *token_in(const uint8_t *data, size_t size) {
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "status"), "token");
    char *s = cJSON_IsString(t) && strlen(t->valuestring) >= 4 ? strdup(t->valuestring) : NULL;
    cJSON_Delete(j);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tok = NULL;
    double exp = -1;
    rl_err e = {0};
    int rc = rl_k8s_exec_credential_parse((const char *)data, size, "client.authentication.k8s.io/v1",
                                          "/fuzz/kc: users[name=u].user.exec", &tok, &exp, &e);
    if (rc == RL_OK) {
        if (!tok || !tok[0]) abort();
        for (const char *q = tok; *q; q++)
            if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e) abort();
        free(tok);
        return 0;
    }
    if (tok || (rc != RL_EINPUT && rc != RL_ENOMEM)) abort();
    if (!strstr(e.msg, "/fuzz/kc") || strchr(e.msg, '\n')) abort();
    /* a "token" that is a piece of our own fixed wording proves nothing */
    static const char fixed[] =
        "/fuzz/kc: users[name=u].user.exec: client.authentication.k8s.io/v1 the plugin's output is "
        "not an ExecCredential (JSON object) kind: must be ExecCredential apiVersion: not , which "
        "the kubeconfig asks for status: missing status.token: not a single printable token "
        "status.expirationTimestamp: not an RFC 3339 time status.clientCertificateData: client "
        "certificates from plugins are not supported (a token is) must be a string out of memory";
    char *secret = token_in(data, size);
    if (secret && !strstr(fixed, secret) && strstr(e.msg, secret)) abort();
    free(secret);
    return 0;
}
