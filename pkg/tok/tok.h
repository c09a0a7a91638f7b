/* tok: Hugging Face tokenizer.json, byte-level BPE (the GPT-2, Llama 3 and
 * Qwen family), encode and decode.
 *
 * What a file may hold (anything else is refused with one line naming the
 * field, never approximated):
 *   model            type BPE; vocab; merges ("a b" strings or [a, b]
 *                    pairs); ignore_merges; unk_token / fuse_unk; no
 *                    dropout, byte_fallback, subword prefix or suffix
 *   normalizer       none, or NFC (Qwen2's; alone or as a one-item Sequence)
 *   pre_tokenizer    ByteLevel (add_prefix_space, use_regex: GPT-2's
 *                    split pattern), or a Sequence of Split (a Regex or
 *                    String pattern, behavior Isolated, not inverted) ending
 *                    in one ByteLevel
 *   decoder          ByteLevel
 *   post_processor   none, ByteLevel, TemplateProcessing (its `single`
 *                    template: special tokens around the one sequence), or
 *                    a Sequence of those
 *   added_tokens     id, content, special, normalized; single_word, lstrip
 *                    and rstrip false
 * truncation and padding are ignored: a trainer wants neither.
 *
 * Encoding follows the tokenizers library: added tokens are cut out of the
 * text first (leftmost, then longest; with NFC, those not `normalized` from
 * the text as given, then each piece between them normalized, by utf8proc,
 * and the `normalized` ones cut out of that); every pre-tokenizer splits each piece
 * on its own (a pattern sees the piece as its whole subject); ByteLevel maps
 * each byte to one symbol; BPE merges the adjacent pair of lowest merge rank,
 * leftmost first, until none is left. Patterns run in PCRE2 (UTF and Unicode
 * properties, invalid UTF-8 allowed: bytes no pattern matches become pieces
 * of their own, so any byte string encodes and decodes back exactly).
 * Decoding is the tokens' bytes concatenated (no U+FFFD replacement): the
 * text back exactly, or its NFC form with that normalizer. */
#ifndef RL_TOK_H
#define RL_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* Token ids are below this: the id space is allocated whole. */
#define RL_BPE_MAX_VOCAB (1u << 20)

typedef struct rl_bpe rl_bpe;

/* Parse tokenizer.json's bytes; `name` (the file) leads every message.
 * RL_EINPUT for anything malformed or unsupported. Fuzzed. */
int rl_bpe_parse(const char *json, size_t len, const char *name, rl_bpe **out, rl_err *e);
int rl_bpe_load(const char *path, rl_bpe **out, rl_err *e);
void rl_bpe_free(rl_bpe *t);

/* One more than the largest id the file names (vocab, added tokens, the
 * post-processor's). */
uint32_t rl_bpe_vocab_size(const rl_bpe *t);
/* The id of a token by its text: an added token's content, or a vocabulary
 * entry (byte-level spelling); -1 if none. */
int64_t rl_bpe_token_id(const rl_bpe *t, const char *text);
/* The beginning- and end-of-text tokens, -1 where the file does not say:
 * BOS is the one token the template puts before a sequence (Llama 3's
 * <|begin_of_text|>); EOS the one it puts after, or, with no template,
 * the only special added token (GPT-2's <|endoftext|>). */
void rl_bpe_special_ids(const rl_bpe *t, int64_t *bos, int64_t *eos);
/* An added token's content by id, NULL if the id is not an added token. */
const char *rl_bpe_added_content(const rl_bpe *t, uint32_t id);
/* The post-processor's template for one sequence: ids before and after it
 * (what `encode(text)` adds with add_special_tokens, e.g. Llama 3's BOS). */
void rl_bpe_template(const rl_bpe *t, const uint32_t **prefix, int *nprefix, const uint32_t **suffix,
                     int *nsuffix);
/* The tokens around each document of training data: one decision for
 * ringleader-prepare (which writes them), dataset.json, training's samples
 * and generate. The post-processor's template when it adds any (Llama 3:
 * BOS before), else `eos` before each document as llm.c's GPT-2 data
 * (eos < 0: the tokenizer's only special token, if it has exactly one).
 * eos in the frame: the end-of-text id (the template's one token after a
 * sequence, else the one before each document), -1 if none. A frame with
 * no token at all means the file says nothing and `eos` was not given. */
#define RL_BPE_FRAME_MAX 16 /* ids on a side of the template; the reader refuses more */
typedef struct {
    uint32_t before[RL_BPE_FRAME_MAX], after[RL_BPE_FRAME_MAX];
    int nbefore, nafter;
    int64_t eos;
} rl_doc_frame;
void rl_bpe_frame(const rl_bpe *t, int64_t eos, rl_doc_frame *f);
/* `eos` before each document, nothing else (eos < 0: no token at all): a
 * template-less tokenizer's frame, and byte-level data's with the bytes'
 * end of text (RL_TOK_EOT, where the model has that id). */
void rl_eos_frame(int64_t eos, rl_doc_frame *f);
/* sha256 of the file's bytes, lowercase hex: the tokenizer's identity. */
const char *rl_bpe_sha256(const rl_bpe *t);

/* A growable id vector; encode appends. */
typedef struct rl_bpe_ids {
    uint32_t *v;
    size_t n, cap;
} rl_bpe_ids;
void rl_bpe_ids_free(rl_bpe_ids *ids);

/* Per-thread encoding state (PCRE2 match data, scratch, a word cache):
 * one rl_bpe is shared read-only by any number of encoders. */
typedef struct rl_bpe_enc rl_bpe_enc;
int rl_bpe_enc_new(const rl_bpe *t, rl_bpe_enc **out, rl_err *e);
void rl_bpe_enc_free(rl_bpe_enc *enc);

/* Encode `len` bytes (any bytes; UTF-8 expected), appending ids, without
 * the post-processor's template. `special`: special added tokens written
 * in the text are those tokens (tokenizers' encode); false: they are plain
 * text (tiktoken's encode_ordinary, what a training corpus wants: a web
 * page quoting "<|endoftext|>" must not end its document). Added tokens
 * that are not special are always matched. Errors: RL_ENOMEM, RL_EINPUT
 * when a pattern exceeds PCRE2's match limit on this text. */
int rl_bpe_encode(rl_bpe_enc *enc, const char *text, size_t len, bool special, rl_bpe_ids *out, rl_err *e);

/* Documents docs[i] (lens[i] bytes) on nenc encoders in parallel (one
 * thread each): outs[i] is emptied, then gets document i's ids. The first
 * failure in document order is returned. */
int rl_bpe_encode_many(rl_bpe_enc *const *encs, int nenc, const char *const *docs, const size_t *lens, size_t n,
                       bool special, rl_bpe_ids *outs, rl_err *e);

/* in[0..n) with every byte that is not part of valid UTF-8 replaced by
 * U+FFFD (as tokenizers' decode): malloc'ed, NUL-terminated, *out_len. */
char *rl_utf8_lossy(const char *in, size_t n, size_t *out_len);

/* Append the bytes of `n` ids to *buf (malloc'ed, grown, *len updated, NUL
 * kept after the bytes). An id no token has is RL_EINPUT naming it. */
int rl_bpe_decode(const rl_bpe *t, const uint32_t *ids, size_t n, char **buf, size_t *len, size_t *cap,
                  rl_err *e);

#endif
