/* libFuzzer target for the kubeconfig reader (rl_k8s_config_parse, which
 * runs the YAML-subset parser): a kubeconfig is a file a user hands us.
 * Contract: no crash, leak or UB; on failure the code is RL_EINPUT (or
 * RL_ENOMEM), the message is one line naming the kubeconfig, and the config
 * is left zeroed; on success the server is an http(s) URL and the namespace
 * is non-empty. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rl_k8s_config c;
    rl_err e = {0};
    int rc = rl_k8s_config_parse((const char *)data, size, "/fuzz/kubeconfig", NULL, &c, &e);
    if (rc == RL_OK) {
        if (strncmp(c.server, "https://", 8) != 0 && strncmp(c.server, "http://", 7) != 0) abort();
        if (!c.ns[0]) abort();
        if ((c.ca_pem == NULL) != (c.ca_pem_len == 0) && c.ca_pem_len) abort();
        rl_k8s_config_free(&c);
    } else {
        if (rc != RL_EINPUT && rc != RL_ENOMEM) abort();
        if (!strstr(e.msg, "/fuzz/kubeconfig") || strchr(e.msg, '\n')) abort();
        if (c.server[0] || c.ca_pem || c.token) abort();
    }
    return 0;
}
