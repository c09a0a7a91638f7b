/* dataset.json (data.h): what ringleader-prepare says it wrote, checked
 * against the job before a step runs -- a model trained on ids from
 * another tokenizer than the one its checkpoints carry would look fine and
 * generate garbage. */
#include "data/data.h"

#include <cjson/cJSON.h>
#include <string.h>

int rl_dataset_meta_check(const char *json, size_t len, const char *name, const char *sha256,
                          const char *tokenizer, int model_vocab, int64_t *eos_id, rl_err *e) {
    cJSON *d = cJSON_ParseWithLength(json, len);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(d, "eos_id");
    *eos_id = -1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "tokenizer");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *sha = cJSON_GetObjectItemCaseSensitive(t, "sha256"),
                *file = cJSON_GetObjectItemCaseSensitive(t, "file"), *vocab = cJSON_GetObjectItemCaseSensitive(t, "vocab_size");
    bool bpe = cJSON_IsString(type) && !strcmp(type->valuestring, "bpe");
    int rc = RL_OK;
    if (!cJSON_IsObject(d) || !cJSON_IsObject(t))
        rc = rl_errf(e, RL_EINPUT, "%s: not a dataset.json (an object with a \"tokenizer\" object)", name);
    else if (!cJSON_IsString(type) || (!bpe && strcmp(type->valuestring, "byte-level")))
        rc = rl_errf(e, RL_EINPUT, "%s: tokenizer.type: must be \"bpe\" or \"byte-level\"", name);
    else if (bpe && (!cJSON_IsString(sha) || strlen(sha->valuestring) != 64 ||
                     strspn(sha->valuestring, "0123456789abcdef") != 64))
        rc = rl_errf(e, RL_EINPUT, "%s: tokenizer.sha256: must be 64 hex digits", name);
    else if (!cJSON_IsNumber(vocab) || vocab->valuedouble < 1 || vocab->valuedouble > (double)INT32_MAX)
        rc = rl_errf(e, RL_EINPUT, "%s: tokenizer.vocab_size: must be a positive integer", name);
    else if (bpe && !sha256)
        rc = rl_errf(e, RL_EINPUT, "data.tokenizer: unset, but %s was tokenized by %.200s (sha256 %.12s...); set "
                     "data.tokenizer to that file", name, cJSON_IsString(file) ? file->valuestring : "a BPE tokenizer",
                     sha->valuestring);
    else if (!bpe && sha256)
        rc = rl_errf(e, RL_EINPUT, "data.tokenizer: %s, but %s holds byte-level tokens (ringleader-prepare without "
                     "--tokenizer)", tokenizer, name);
    else if (bpe && strcmp(sha->valuestring, sha256))
        rc = rl_errf(e, RL_EINPUT, "data.tokenizer: %s (sha256 %.12s...) is not the tokenizer %s names: %.200s "
                     "(sha256 %.12s...)", tokenizer, sha256, name, cJSON_IsString(file) ? file->valuestring : "?",
                     sha->valuestring);
    else if (vocab->valuedouble > model_vocab)
        rc = rl_errf(e, RL_EINPUT, "model.vocab_size: %d is smaller than the %.0f ids of the tokenizer %s names",
                     model_vocab, vocab->valuedouble, name);
    else if (eos && !cJSON_IsNull(eos) &&
             (!cJSON_IsNumber(eos) || eos->valuedouble < 0 || eos->valuedouble >= vocab->valuedouble ||
              eos->valuedouble != (double)(int64_t)eos->valuedouble))
        rc = rl_errf(e, RL_EINPUT, "%s: eos_id: must be null or a token id below tokenizer.vocab_size", name);
    else if (cJSON_IsNumber(eos))
        *eos_id = (int64_t)eos->valuedouble;
    cJSON_Delete(d);
    /* the file's strings are quoted: one line stays one line */
    if (rc) rl_err_one_line(e);
    return rc;
}
