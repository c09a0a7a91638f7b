/* safetensors: header writer and a strict header reader.
 *
 * The reader applies the reference implementation's rules (offsets
 * contiguous from 0, covering the data exactly, sizes matching shapes) and
 * a few of its own (no duplicate names, bounded names and ranks), because a
 * checkpoint that parses wrongly is worse than one that fails to load. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

static const struct {
    const char *name;
    int size;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"I64", 8},  {"U64", 8}, {"F64", 8},
};

static int dtype_size(const char *s) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(s, dtypes[i].name) == 0) return dtypes[i].size;
    return 0;
}

void rl_ckpt_st_free(rl_ckpt_st *st) {
    if (!st) return;
    free(st->t);
    free(st->meta);
    free(st);
}

static int cmp_begin(const void *a, const void *b) {
    const rl_ckpt_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    /* zero-sized tensors share a begin with their neighbour: order by end */
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const rl_ckpt_st_tensor *)a)->name, ((const rl_ckpt_st_tensor *)b)->name);
}

/* The keys of the top-level object of JSON text h[0..n), counted without
 * parsing (a string at depth 1 right after '{' or ','); stops counting
 * past `stop`. Malformed text gives some count: cJSON refuses it after. */
static long top_level_keys(const char *h, size_t n, long stop) {
    int depth = 0;
    bool in_str = false, esc = false, want_key = false;
    long keys = 0;
    for (size_t i = 0; i < n && keys <= stop; i++) {
        char c = h[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
            if (depth == 1 && want_key) keys++;
            want_key = false;
        } else if (c == '{' || c == '[') {
            want_key = ++depth == 1;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',') {
            want_key = depth == 1;
        }
    }
    return keys;
}

/* A JSON number that is a non-negative integer exactly representable. */
static bool as_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

int rl_ckpt_st_parse(const void *buf, size_t len, uint64_t file_size, int max_tensors, const char *name,
                     rl_ckpt_st **out, rl_err *e) {
    const unsigned char *p = buf;
    *out = NULL;
    if (len < 8 || file_size < 8)
        return rl_errf(e, RL_EINPUT, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
                       name, (unsigned long long)file_size);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | p[i];
    if (hn < 2 || hn > RL_CKPT_ST_MAX_HEADER)
        return rl_errf(e, RL_EINPUT, "%s: header length %llu is out of range (2..%llu): not a safetensors file?",
                       name, (unsigned long long)hn, RL_CKPT_ST_MAX_HEADER);
    if (8 + hn > file_size)
        return rl_errf(e, RL_EINPUT, "%s: truncated: header says %llu bytes but the file has %llu",
                       name, (unsigned long long)hn, (unsigned long long)(file_size - 8));
    if (8 + hn > len)
        return rl_errf(e, RL_EINPUT, "%s: only %zu of the %llu header bytes given", name, len,
                       (unsigned long long)(8 + hn));
    const char *h = (const char *)p + 8;
    if (h[0] != '{') return rl_errf(e, RL_EINPUT, "%s: header does not start with '{'", name);
    /* + 1: __metadata__ is a key too */
    if (max_tensors > 0 && top_level_keys(h, (size_t)hn, (long)max_tensors + 1) > (long)max_tensors + 1)
        return rl_errf(e, RL_EINPUT, "%s: more than the %d tensors this model has", name, max_tensors);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hn, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rl_errf(e, RL_EINPUT, "%s: header is not a JSON object", name);
    }
    /* the reference writer pads with spaces; anything else after the object is damage */
    for (const char *q = end; q < h + hn; q++)
        if (*q != ' ') {
            cJSON_Delete(root);
            return rl_errf(e, RL_EINPUT, "%s: garbage after the JSON header (byte %zu)", name,
                           (size_t)(q - h) + 8);
        }
    rl_ckpt_st *st = calloc(1, sizeof *st);
    int count = cJSON_GetArraySize(root), rc = RL_OK;
    char esc[RL_CKPT_ST_MAX_NAME + 64];
    if (!st || !(st->t = calloc((size_t)count + 1, sizeof *st->t))) {
        rc = rl_errf(e, RL_ENOMEM, "%s: out of memory for %d header entries", name, count);
        goto out;
    }
    st->data_start = 8 + hn;
    st->data_len = file_size - st->data_start;
    bool seen_meta = false;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string;
        size_t kl = strlen(k);
        if (strcmp(k, "__metadata__") == 0) {
            if (seen_meta || !cJSON_IsObject(it)) {
                rc = rl_errf(e, RL_EINPUT, "%s: __metadata__ must appear once, as an object", name);
                goto out;
            }
            seen_meta = true;
            int nm = cJSON_GetArraySize(it);
            if (nm > 0 && !(st->meta = calloc((size_t)nm, sizeof *st->meta))) {
                rc = rl_errf(e, RL_ENOMEM, "%s: out of memory", name);
                goto out;
            }
            for (const cJSON *m = it->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    rc = rl_errf(e, RL_EINPUT, "%s: __metadata__.%s: values must be strings", name,
                                 rl_json_escape(esc, 128, m->string));
                    goto out;
                }
                /* long metadata is legal but of no use to us: keep what fits */
                snprintf(st->meta[st->n_meta][0], 256, "%s", m->string);
                snprintf(st->meta[st->n_meta][1], 256, "%s", m->valuestring);
                st->n_meta++;
            }
            continue;
        }
        rl_json_escape(esc, sizeof esc, k);
        if (kl == 0 || kl > RL_CKPT_ST_MAX_NAME) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor name of %zu bytes (1..%d allowed)", name, kl,
                         RL_CKPT_ST_MAX_NAME);
            goto out;
        }
        if (!cJSON_IsObject(it)) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": entry is not an object", name, esc);
            goto out;
        }
        rl_ckpt_st_tensor *t = &st->t[st->n];
        memcpy(t->name, k, kl + 1);
        for (const cJSON *f = it->child; f; f = f->next)
            if (strcmp(f->string, "dtype") && strcmp(f->string, "shape") && strcmp(f->string, "data_offsets")) {
                char fe[64];
                rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": unknown field \"%s\"", name, esc,
                             rl_json_escape(fe, sizeof fe, f->string));
                goto out;
            }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        int dsz = cJSON_IsString(dt) ? dtype_size(dt->valuestring) : 0;
        if (!dsz) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": missing or unknown dtype", name, esc);
            goto out;
        }
        snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > RL_CKPT_ST_MAX_DIMS) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": shape must be an array of at most %d integers",
                         name, esc, RL_CKPT_ST_MAX_DIMS);
            goto out;
        }
        /* numel in 128 bits' worth of care: stop as soon as it exceeds the file */
        uint64_t numel = 1;
        bool too_big = false;
        for (const cJSON *d = sh->child; d; d = d->next) {
            uint64_t v;
            if (!as_u64(d, &v)) {
                rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": shape entries must be non-negative integers",
                             name, esc);
                goto out;
            }
            t->shape[t->ndim++] = (int64_t)v;
            if (v != 0 && numel > UINT64_MAX / v) too_big = true;
            else numel *= v;
        }
        if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !as_u64(of->child, &t->begin) ||
            !as_u64(of->child->next, &t->end)) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": data_offsets must be [begin, end]", name, esc);
            goto out;
        }
        if (t->begin > t->end || t->end > st->data_len) {
            rc = rl_errf(e, RL_EINPUT,
                         "%s: tensor \"%s\": data_offsets [%llu, %llu] outside the %llu data bytes%s",
                         name, esc, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)st->data_len, t->begin <= t->end ? " (truncated file?)" : "");
            goto out;
        }
        bool zero = false;
        for (int d = 0; d < t->ndim; d++) zero |= t->shape[d] == 0;
        if (zero) numel = 0, too_big = false;
        if (too_big || numel > UINT64_MAX / (uint64_t)dsz || numel * (uint64_t)dsz != t->end - t->begin) {
            rc = rl_errf(e, RL_EINPUT,
                         "%s: tensor \"%s\": shape needs %s bytes of %s but data_offsets give %llu",
                         name, esc, too_big ? "too many" : "a different number of", t->dtype,
                         (unsigned long long)(t->end - t->begin));
            goto out;
        }
        st->n++;
    }
    /* duplicates side by side once sorted by name: n log n, not n^2 */
    qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_name);
    for (int i = 1; i < st->n; i++)
        if (strcmp(st->t[i - 1].name, st->t[i].name) == 0) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\" appears twice", name,
                         rl_json_escape(esc, sizeof esc, st->t[i].name));
            goto out;
        }
    qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < st->n; i++) {
        if (st->t[i].begin != at) {
            rc = rl_errf(e, RL_EINPUT, "%s: tensor \"%s\": data starts at %llu, expected %llu (%s)", name,
                         rl_json_escape(esc, sizeof esc, st->t[i].name), (unsigned long long)st->t[i].begin,
                         (unsigned long long)at, st->t[i].begin < at ? "overlaps the previous tensor" : "gap");
            goto out;
        }
        at = st->t[i].end;
    }
    if (at != st->data_len) {
        rc = rl_errf(e, RL_EINPUT, "%s: tensors cover %llu data bytes but the file has %llu (%s)", name,
                     (unsigned long long)at, (unsigned long long)st->data_len,
                     at < st->data_len ? "trailing bytes" : "truncated");
        goto out;
    }
out:
    cJSON_Delete(root);
    if (rc) {
        rl_ckpt_st_free(st);
        return rc;
    }
    *out = st;
    return RL_OK;
}

const rl_ckpt_st_tensor *rl_ckpt_st_find(const rl_ckpt_st *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

const char *rl_ckpt_st_meta(const rl_ckpt_st *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i][0], key) == 0) return st->meta[i][1];
    return NULL;
}

int rl_ckpt_st_header(const rl_ckpt_st_entry *t, int n, const char *const *meta, char **hdr,
                      size_t *hdr_len, rl_err *e) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return rl_errf(e, RL_ENOMEM, "safetensors: out of memory");
    if (meta && meta[0]) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta[i] && meta[i + 1]; i += 2) cJSON_AddStringToObject(m, meta[i], meta[i + 1]);
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        int dsz = dtype_size(t[i].dtype);
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
        if (!dsz || t[i].ndim > RL_CKPT_ST_MAX_DIMS || numel * (uint64_t)dsz != t[i].bytes) {
            cJSON_Delete(root);
            return rl_errf(e, RL_EINTERNAL, "safetensors: tensor %s: %zu bytes do not match its shape",
                           t[i].name, t[i].bytes);
        }
        cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(o, "dtype", t[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(at + t[i].bytes)));
        at += t[i].bytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js) return rl_errf(e, RL_ENOMEM, "safetensors: out of memory");
    /* offsets are written as integers by cJSON only below 2^53: fine for any
     * checkpoint we can hold in memory */
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    char *h = malloc(8 + padded);
    if (!h) {
        free(js);
        return rl_errf(e, RL_ENOMEM, "safetensors: out of memory");
    }
    for (int i = 0; i < 8; i++) h[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, js, jl);
    memset(h + 8 + jl, ' ', padded - jl);
    free(js);
    *hdr = h;
    *hdr_len = 8 + padded;
    return RL_OK;
}
