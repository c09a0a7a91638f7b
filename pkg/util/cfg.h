/* Config descriptors: one table per config section is the single source of
 * truth for its fields -- name, type, place in the struct, bounds, default,
 * allowed values and a one-line doc. From the table come the defaults, the
 * strict JSON reader, the JSON writer (`--print-config`, checkpoints) and
 * the OpenAPI schema the TrainingJob CRD embeds as spec.training
 * (`ringleader-worker --print-schema`; `make manifests` writes it into
 * manifests/crd.yaml, and the manifests test compares the two).
 *
 * A field's JSON name is its C member's name, and its type is read from the
 * member by RL_CFG_FIELD, so the table cannot disagree with the struct.
 * Rules across fields (min_lr <= lr) stay code: a section's `check` runs
 * after its fields are read. */
#ifndef RL_UTIL_CFG_H
#define RL_UTIL_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum {
    RL_CFG_INT,  /* int */
    RL_CFG_I64,  /* long long */
    RL_CFG_U64,  /* uint64_t (a JSON number: at most 2^53) */
    RL_CFG_NUM,  /* double, finite */
    RL_CFG_BOOL, /* bool */
    RL_CFG_STR,  /* char[size]: at most size - 1 bytes */
    RL_CFG_OBJ,  /* a nested section (field.sub) */
} rl_cfg_kind;

#define RL_CFG_KIND_OF(x)                                                                          \
    _Generic((x), int: RL_CFG_INT, long long: RL_CFG_I64, uint64_t: RL_CFG_U64, double: RL_CFG_NUM, \
             bool: RL_CFG_BOOL, char *: RL_CFG_STR, default: RL_CFG_OBJ)

enum {
    /* Not in spec.training: the operator sets it from the TrainingJob
     * (replicas, elastic, rdzvPort...); a config file may still set it. */
    RL_CFG_OPERATOR = 1u << 0,
    /* A string that is empty or starts with http:// or https://. */
    RL_CFG_URL = 1u << 1,
};

typedef struct rl_cfg_section rl_cfg_section;

typedef struct rl_cfg_field {
    const char *name;
    rl_cfg_kind kind;
    size_t off, size;
    double min, max;             /* numbers: the closed range */
    double def;                  /* numbers and bools */
    const char *def_str;         /* strings (NULL: "") */
    const char *const *choices;  /* strings: the allowed values, NULL-terminated; NULL: any */
    const char *doc;             /* one line */
    const char *env;             /* the environment variable that may set it (rl_cfg_from_env), or NULL */
    unsigned flags;              /* RL_CFG_OPERATOR, RL_CFG_URL */
    const rl_cfg_section *sub;   /* RL_CFG_OBJ */
} rl_cfg_field;

struct rl_cfg_section {
    const char *doc;
    const rl_cfg_field *fields;
    int n;
    /* Rules across fields, after every field of the section (and of its
     * nested sections) was read; `where` names the section. May be NULL. */
    int (*check)(const void *obj, const char *where, rl_err *e);
    /* The whole document: its sections are named "<where>: <section>"
     * ("job.json: train.lr") rather than "<where>.<section>". */
    bool top;
};

/* A table entry for member f of struct S; the rest are designated
 * initializers: RL_CFG_FIELD(rl_train_config, lr, .min = 0, .max = 10, ...). */
#define RL_CFG_FIELD(S, f, ...)                                                                        \
    {.name = #f, .kind = RL_CFG_KIND_OF(((S *)0)->f), .off = offsetof(S, f), .size = sizeof(((S *)0)->f), \
     __VA_ARGS__}
#define RL_CFG_SECTION(fields_, ...) {.fields = fields_, .n = (int)(sizeof fields_ / sizeof fields_[0]), __VA_ARGS__}

/* Every field (and nested section) to its default. */
void rl_cfg_defaults(const rl_cfg_section *s, void *obj);
/* Read a JSON object over *obj: unknown or repeated fields, wrong types,
 * out-of-range values and values outside `choices` are RL_EINPUT naming
 * "<where>.<field>"; absent fields keep their value. Then the section's
 * check. */
struct cJSON;
int rl_cfg_read(const struct cJSON *o, const char *where, const rl_cfg_section *s, void *obj, rl_err *e);
/* Overrides, for cmd/ (flags, then the environment, then the config file:
 * applied in the reverse order, then checked once with rl_cfg_check).
 * Values are text, read by the same rules as JSON (a number, true or
 * false, a string within its bounds and choices); RL_EINPUT names `label`
 * (the flag) or the variable.
 * rl_cfg_from_env: every field that names a variable set non-empty
 * through `lookup`. rl_cfg_set: the field at a dotted path
 * ("rdzv.backend"). */
int rl_cfg_from_env(const rl_cfg_section *s, void *obj, rl_env_lookup lookup, rl_err *e);
int rl_cfg_set(const rl_cfg_section *s, void *obj, const char *path, const char *text, const char *label,
               rl_err *e);
/* The field at a dotted path, and its offset from obj (NULL: none): a flag
 * takes its bounds from there. */
const rl_cfg_field *rl_cfg_field_at(const rl_cfg_section *s, const char *path, size_t *off);
/* Every section's check, innermost first, as rl_cfg_read runs them. */
int rl_cfg_check(const rl_cfg_section *s, const void *obj, const char *where, rl_err *e);
/* Every field of *obj into the object o. */
void rl_cfg_write(const rl_cfg_section *s, const void *obj, struct cJSON *o);
/* The OpenAPI v3 schema of the section (structural, as a CRD needs it):
 * types, int64 formats, ranges, lengths, enums, descriptions, no defaults
 * (the worker has its own). for_crd leaves out RL_CFG_OPERATOR fields.
 * NULL when out of memory (a few kilobytes, for --print-schema). */
struct cJSON *rl_cfg_schema(const rl_cfg_section *s, bool for_crd);

#endif
