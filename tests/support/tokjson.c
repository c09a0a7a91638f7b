/* tokjson.h */
#include "tokjson.h"

#include "testutil.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rl_sb_add(rl_sb *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = 2 * (b->n + (size_t)k + 1);
        if (!(b->s = realloc(b->s, b->cap))) abort();
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* printable Latin-1 stands for itself, the other 68 bytes are U+0100.. in byte order */
static bool self_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }
static unsigned bl_cp(unsigned char b) {
    if (self_byte(b)) return b;
    unsigned k = 0;
    for (int c = 0; c < b; c++) k += !self_byte(c);
    return 256 + k;
}

void rl_sb_bytelevel(rl_sb *b, const char *raw, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned cp = bl_cp((unsigned char)raw[i]);
        if (cp == '"' || cp == '\\') rl_sb_add(b, "\\%c", (char)cp);
        else if (cp < 0x80) rl_sb_add(b, "%c", (char)cp);
        else rl_sb_add(b, "%c%c", (char)(0xc0 | cp >> 6), (char)(0x80 | (cp & 0x3f)));
    }
}

char *rl_test_tokenizer_json(const char *const *merges, const char *const *specials) {
    rl_sb b = {0};
    int id = 256;
    for (int i = 0; merges && merges[i]; i += 2) id++;
    rl_sb_add(&b, "{\"version\":\"1.0\",\"added_tokens\":[");
    for (int i = 0; specials && specials[i]; i++)
        rl_sb_add(&b, "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                      "\"normalized\":false,\"special\":true}", i ? "," : "", id + i, specials[i]);
    rl_sb_add(&b, "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                  "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
                  "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int c = 0; c < 256; c++) {
        char raw = (char)c;
        rl_sb_add(&b, "%s\"", c ? "," : "");
        rl_sb_bytelevel(&b, &raw, 1);
        rl_sb_add(&b, "\":%d", c);
    }
    id = 256;
    for (int i = 0; merges && merges[i]; i += 2, id++) {
        rl_sb_add(&b, ",\"");
        rl_sb_bytelevel(&b, merges[i], strlen(merges[i]));
        rl_sb_bytelevel(&b, merges[i + 1], strlen(merges[i + 1]));
        rl_sb_add(&b, "\":%d", id);
    }
    for (int i = 0; specials && specials[i]; i++) rl_sb_add(&b, ",\"%s\":%d", specials[i], id + i);
    rl_sb_add(&b, "},\"merges\":[");
    for (int i = 0; merges && merges[i]; i += 2) {
        rl_sb_add(&b, "%s\"", i ? "," : "");
        rl_sb_bytelevel(&b, merges[i], strlen(merges[i]));
        rl_sb_add(&b, " ");
        rl_sb_bytelevel(&b, merges[i + 1], strlen(merges[i + 1]));
        rl_sb_add(&b, "\"");
    }
    rl_sb_add(&b, "]}}");
    return b.s;
}

void rl_test_write_tokenizer_json(const char *path, const char *const *merges, const char *const *specials) {
    char *js = rl_test_tokenizer_json(merges, specials);
    rl_test_write(path, js, strlen(js));
    free(js);
}
