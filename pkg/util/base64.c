/* Base64 for kubeconfig data (certificate-authority-data, ...) and the
 * etcd gateway's keys and values. */
#include <stdint.h>
#include <stdlib.h>

#include "util/util.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *rl_base64_encode(const void *data, size_t n) {
    const unsigned char *p = data;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        out[o++] = B64[v >> 18 & 63];
        out[o++] = B64[v >> 12 & 63];
        out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int rl_base64_decode(const char *src, size_t len, bool skip_space, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    char *s = malloc(len + 1);
    if (!s) return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (!(skip_space && (src[i] == ' ' || src[i] == '\n' || src[i] == '\r' || src[i] == '\t'))) s[n++] = src[i];
    char *buf = n % 4 ? NULL : malloc(n / 4 * 3 + 1);
    if (!buf) {
        free(s);
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad || (v[k] = b64_val(c)) < 0) goto bad;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff))) goto bad;
        buf[o++] = (char)(w >> 16);
        if (pad < 2) buf[o++] = (char)(w >> 8 & 0xff);
        if (pad < 1) buf[o++] = (char)(w & 0xff);
    }
    buf[o] = '\0';
    free(s);
    *out = buf;
    *out_len = o;
    return 0;
bad:
    free(buf);
    free(s);
    return -1;
}
