/* tokenizer.json documents for tests: a string builder and the byte-level
 * alphabet (GPT-2's bytes_to_unicode) that token strings are spelled in. */
#ifndef RL_TEST_TOKJSON_H
#define RL_TEST_TOKJSON_H

#include <stddef.h>

typedef struct {
    char *s;
    size_t n, cap;
} rl_sb;

/* printf onto the buffer (aborts when out of memory) */
void rl_sb_add(rl_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* n raw bytes spelled in the byte-level alphabet, as JSON string content */
void rl_sb_bytelevel(rl_sb *b, const char *raw, size_t n);

/* A GPT-2-layout tokenizer.json (ByteLevel pre-tokenizer with its pattern,
 * ByteLevel decoder, no template): the 256 byte tokens with id = the byte,
 * each merge's product (merges: raw-byte pairs, flat, NULL-terminated) from
 * id 256 in order, then the special tokens (NULL-terminated) as added
 * tokens. malloc'ed. */
char *rl_test_tokenizer_json(const char *const *merges, const char *const *specials);
/* The same written to path. */
void rl_test_write_tokenizer_json(const char *path, const char *const *merges, const char *const *specials);

#endif
