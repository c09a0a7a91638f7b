/* libFuzzer target for the kubeconfig reader (rl_k8s_config_parse_list,
 * which runs libyaml through our YAML-to-JSON builder, merges a KUBECONFIG
 * list and reads exec sections): a kubeconfig is a file a user hands us.
 * The input is up to four files separated by NUL bytes (a NUL inside a
 * kubeconfig is refused anyway), read as the list /fuzz/0:/fuzz/1:...
 * Contract: no crash, leak or UB; on failure the code is RL_EINPUT (or
 * RL_ENOMEM), the message is one line naming one of the files, and the
 * config is left zeroed; on success the server is an http(s) URL, the
 * namespace is non-empty, and an exec plugin has a command. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *texts[4], *paths[4] = {"/fuzz/0", "/fuzz/1", "/fuzz/2", "/fuzz/3"};
    size_t lens[4];
    int n = 0;
    const char *p = (const char *)data, *end = p + size;
    while (n < 4) {
        const char *z = n < 3 ? memchr(p, '\0', (size_t)(end - p)) : NULL;
        texts[n] = p;
        lens[n] = (size_t)((z ? z : end) - p);
        n++;
        if (!z) break;
        p = z + 1;
    }
    rl_k8s_config c;
    rl_err e = {0};
    int rc = rl_k8s_config_parse_list(n, texts, lens, paths, NULL, &c, &e);
    if (rc == RL_OK) {
        if (strncmp(c.server, "https://", 8) != 0 && strncmp(c.server, "http://", 7) != 0) abort();
        if (!c.ns[0]) abort();
        if ((c.ca_pem == NULL) != (c.ca_pem_len == 0) && c.ca_pem_len) abort();
        if (c.exec && (!c.exec->argv || !c.exec->argv[0] || !c.exec->argv[0][0])) abort();
        rl_k8s_config_free(&c);
    } else {
        if (rc != RL_EINPUT && rc != RL_ENOMEM) abort();
        if (!strstr(e.msg, "/fuzz/") || strchr(e.msg, '\n')) abort();
        if (c.server[0] || c.ca_pem || c.token || c.exec) abort();
    }
    return 0;
}
