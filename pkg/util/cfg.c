/* Config sections driven by their descriptor tables (cfg.h). Reading is
 * strict: a typo in a config must never be silently ignored (a misspelled
 * "learning_rate" would train with the default), so unknown keys are errors
 * and every value is range-checked. */
#include "cfg.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(obj, f) ((char *)(obj) + (f)->off)
#define AT_C(obj, f) ((const char *)(obj) + (f)->off)

static int check_keys(const cJSON *o, const char *where, const rl_cfg_section *s, rl_err *e) {
    if (!cJSON_IsObject(o)) return rl_errf(e, RL_EINPUT, "%s: must be a JSON object", where);
    for (const cJSON *it = o->child; it; it = it->next) {
        bool ok = false;
        for (int i = 0; i < s->n && !ok; i++) ok = it->string && strcmp(it->string, s->fields[i].name) == 0;
        if (!ok) {
            char esc[128];
            return rl_errf(e, RL_EINPUT, "%s: unknown field \"%s\"", where,
                           rl_json_escape(esc, sizeof esc, it->string ? it->string : ""));
        }
        /* cJSON keeps duplicate keys; a config with two values for one
         * field is ambiguous, so refuse it. */
        for (const cJSON *j = it->next; j; j = j->next)
            if (j->string && strcmp(j->string, it->string) == 0)
                return rl_errf(e, RL_EINPUT, "%s: field \"%s\" given twice", where, it->string);
    }
    return RL_OK;
}

static int read_int(const cJSON *v, const char *what, const rl_cfg_field *f, long long *out, rl_err *e) {
    if (!cJSON_IsNumber(v)) return rl_errf(e, RL_EINPUT, "%s: must be a number", what);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return rl_errf(e, RL_EINPUT, "%s: must be an integer", what);
    if (d < f->min || d > f->max)
        return rl_errf(e, RL_EINPUT, "%s: %.17g is out of range [%lld, %lld]", what, d,
                       (long long)f->min, (long long)f->max);
    *out = (long long)d;
    return RL_OK;
}

static int read_str(const cJSON *v, const char *what, const rl_cfg_field *f, char *out, rl_err *e) {
    if (!cJSON_IsString(v)) return rl_errf(e, RL_EINPUT, "%s: must be a string", what);
    size_t len = strlen(v->valuestring);
    if (len >= f->size)
        return rl_errf(e, RL_EINPUT, "%s: longer than %zu characters", what, f->size - 1);
    char esc[128];
    if (f->choices) {
        const char *const *c = f->choices;
        while (*c && strcmp(*c, v->valuestring) != 0) c++;
        if (!*c) {
            char list[160] = "";
            for (c = f->choices; *c; c++) {
                const char *sep = c == f->choices ? "" : c[1] ? ", " : " or ";
                size_t at = strlen(list);
                snprintf(list + at, sizeof list - at, "%s%s", sep, **c ? *c : "\"\"");
            }
            return rl_errf(e, RL_EINPUT, "%s: unknown value \"%s\" (%s)", what,
                           rl_json_escape(esc, sizeof esc, v->valuestring), list);
        }
    }
    if ((f->flags & RL_CFG_URL) && len && strncmp(v->valuestring, "http://", 7) != 0 &&
        strncmp(v->valuestring, "https://", 8) != 0)
        return rl_errf(e, RL_EINPUT, "%s: \"%s\" must start with http:// or https://", what,
                       rl_json_escape(esc, sizeof esc, v->valuestring));
    memcpy(out, v->valuestring, len + 1);
    return RL_OK;
}

static int read_field(const cJSON *v, const char *what, const rl_cfg_field *f, void *obj, rl_err *e) {
    long long i = 0;
    int rc = RL_OK;
    switch (f->kind) {
    case RL_CFG_INT:
        if (!(rc = read_int(v, what, f, &i, e))) *(int *)AT(obj, f) = (int)i;
        return rc;
    case RL_CFG_I64:
        return read_int(v, what, f, (long long *)AT(obj, f), e);
    case RL_CFG_U64:
        if (!(rc = read_int(v, what, f, &i, e))) *(uint64_t *)AT(obj, f) = (uint64_t)i;
        return rc;
    case RL_CFG_NUM:
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return rl_errf(e, RL_EINPUT, "%s: must be a finite number", what);
        if (v->valuedouble < f->min || v->valuedouble > f->max)
            return rl_errf(e, RL_EINPUT, "%s: %g is out of range [%g, %g]", what, v->valuedouble,
                           f->min, f->max);
        *(double *)AT(obj, f) = v->valuedouble;
        return RL_OK;
    case RL_CFG_BOOL:
        if (!cJSON_IsBool(v)) return rl_errf(e, RL_EINPUT, "%s: must be true or false", what);
        *(bool *)AT(obj, f) = cJSON_IsTrue(v);
        return RL_OK;
    case RL_CFG_STR:
        return read_str(v, what, f, AT(obj, f), e);
    case RL_CFG_OBJ: {
        if (!cJSON_IsObject(v)) return rl_errf(e, RL_EINPUT, "%s: must be an object", what);
        return rl_cfg_read(v, what, f->sub, AT(obj, f), e);
    }
    }
    return rl_errf(e, RL_EINTERNAL, "%s: bad descriptor", what);
}

int rl_cfg_read(const cJSON *o, const char *where, const rl_cfg_section *s, void *obj, rl_err *e) {
    int rc = check_keys(o, where, s, e);
    for (int i = 0; !rc && i < s->n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, s->fields[i].name);
        char what[600];
        snprintf(what, sizeof what, "%s%s%s", where, s->top ? ": " : ".", s->fields[i].name);
        if (v) rc = read_field(v, what, &s->fields[i], obj, e);
    }
    return rc || !s->check ? rc : s->check(obj, where, e);
}

/* A variable's or a flag's text as the JSON value the field's kind reads. */
static cJSON *env_value(const rl_cfg_field *f, const char *v) {
    if (f->kind == RL_CFG_STR) return cJSON_CreateString(v);
    if (f->kind == RL_CFG_BOOL && !strcmp(v, "true")) return cJSON_CreateTrue();
    if (f->kind == RL_CFG_BOOL && !strcmp(v, "false")) return cJSON_CreateFalse();
    if (f->kind == RL_CFG_BOOL) return cJSON_CreateString(v); /* "must be true or false" */
    char *end;
    double d = strtod(v, &end);
    return *end || end == v ? cJSON_CreateString(v) : cJSON_CreateNumber(d);
}

/* text as the field's kind reads it, into the field at obj; label names it */
static int set_text(const rl_cfg_field *f, void *obj, const char *text, const char *label, rl_err *e) {
    if (f->kind == RL_CFG_OBJ) return rl_errf(e, RL_EINPUT, "%s: a section, not a value", label);
    cJSON *j = env_value(f, text);
    if (!j) return rl_errf(e, RL_ENOMEM, "%s: out of memory", label);
    int rc = read_field(j, label, f, obj, e);
    cJSON_Delete(j);
    return rc;
}

int rl_cfg_from_env(const rl_cfg_section *s, void *obj, rl_env_lookup lookup, rl_err *e) {
    for (int i = 0; i < s->n; i++) {
        const rl_cfg_field *f = &s->fields[i];
        int rc;
        if (f->kind == RL_CFG_OBJ && (rc = rl_cfg_from_env(f->sub, AT(obj, f), lookup, e))) return rc;
        const char *v = f->env ? lookup(f->env) : NULL;
        if (v && *v && (rc = set_text(f, obj, v, f->env, e))) return rc;
    }
    return RL_OK;
}

const rl_cfg_field *rl_cfg_field_at(const rl_cfg_section *s, const char *path, size_t *off) {
    size_t base = 0;
    for (;;) {
        size_t len = strcspn(path, ".");
        const rl_cfg_field *f = NULL;
        for (int i = 0; i < s->n && !f; i++)
            if (strlen(s->fields[i].name) == len && !strncmp(s->fields[i].name, path, len)) f = &s->fields[i];
        if (!f) return NULL;
        base += f->off;
        if (!path[len]) {
            if (off) *off = base;
            return f;
        }
        if (f->kind != RL_CFG_OBJ) return NULL;
        s = f->sub, path += len + 1;
    }
}

int rl_cfg_set(const rl_cfg_section *s, void *obj, const char *path, const char *text, const char *label,
               rl_err *e) {
    size_t off;
    const rl_cfg_field *f = rl_cfg_field_at(s, path, &off);
    if (!f) return rl_errf(e, RL_EINTERNAL, "%s: no config field %s", label, path);
    /* set_text addresses obj + f->off: point it at the field's own struct */
    return set_text(f, (char *)obj + off - f->off, text, label, e);
}

int rl_cfg_check(const rl_cfg_section *s, const void *obj, const char *where, rl_err *e) {
    for (int i = 0; i < s->n; i++) {
        const rl_cfg_field *f = &s->fields[i];
        if (f->kind != RL_CFG_OBJ) continue;
        char sub[600];
        snprintf(sub, sizeof sub, "%s%s%s", where, s->top ? ": " : ".", f->name);
        int rc = rl_cfg_check(f->sub, AT_C(obj, f), sub, e);
        if (rc) return rc;
    }
    return s->check ? s->check(obj, where, e) : RL_OK;
}

void rl_cfg_defaults(const rl_cfg_section *s, void *obj) {
    for (int i = 0; i < s->n; i++) {
        const rl_cfg_field *f = &s->fields[i];
        switch (f->kind) {
        case RL_CFG_INT: *(int *)AT(obj, f) = (int)f->def; break;
        case RL_CFG_I64: *(long long *)AT(obj, f) = (long long)f->def; break;
        case RL_CFG_U64: *(uint64_t *)AT(obj, f) = (uint64_t)f->def; break;
        case RL_CFG_NUM: *(double *)AT(obj, f) = f->def; break;
        case RL_CFG_BOOL: *(bool *)AT(obj, f) = f->def != 0; break;
        case RL_CFG_STR: snprintf(AT(obj, f), f->size, "%s", f->def_str ? f->def_str : ""); break;
        case RL_CFG_OBJ: rl_cfg_defaults(f->sub, AT(obj, f)); break;
        }
    }
}

/* Integers as their digits: cJSON prints numbers with 15 significant
 * digits when that reads back within an epsilon, which turns 2^53 into
 * 9.00719925474099e+15. */
static void add_int(cJSON *o, const char *name, long long v, bool is_unsigned) {
    char b[24];
    if (is_unsigned) snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    else snprintf(b, sizeof b, "%lld", v);
    cJSON_AddRawToObject(o, name, b);
}

void rl_cfg_write(const rl_cfg_section *s, const void *obj, cJSON *o) {
    for (int i = 0; i < s->n; i++) {
        const rl_cfg_field *f = &s->fields[i];
        const char *p = AT_C(obj, f);
        switch (f->kind) {
        case RL_CFG_INT: add_int(o, f->name, *(const int *)p, false); break;
        case RL_CFG_I64: add_int(o, f->name, *(const long long *)p, false); break;
        case RL_CFG_U64: add_int(o, f->name, (long long)*(const uint64_t *)p, true); break;
        case RL_CFG_NUM: cJSON_AddNumberToObject(o, f->name, *(const double *)p); break;
        case RL_CFG_BOOL: cJSON_AddBoolToObject(o, f->name, *(const bool *)p); break;
        case RL_CFG_STR: cJSON_AddStringToObject(o, f->name, p); break;
        case RL_CFG_OBJ: rl_cfg_write(f->sub, p, cJSON_AddObjectToObject(o, f->name)); break;
        }
    }
}

static void field_schema(const rl_cfg_field *f, bool for_crd, cJSON *p) {
    static const char *const types[] = {
        [RL_CFG_INT] = "integer", [RL_CFG_I64] = "integer", [RL_CFG_U64] = "integer", [RL_CFG_NUM] = "number",
        [RL_CFG_BOOL] = "boolean", [RL_CFG_STR] = "string", [RL_CFG_OBJ] = "object"};
    cJSON_AddStringToObject(p, "type", types[f->kind]);
    if (f->kind == RL_CFG_I64 || f->kind == RL_CFG_U64) cJSON_AddStringToObject(p, "format", "int64");
    const char *doc = f->doc ? f->doc : f->sub ? f->sub->doc : NULL;
    if (doc) cJSON_AddStringToObject(p, "description", doc);
    if (f->kind < RL_CFG_NUM) {
        add_int(p, "minimum", (long long)f->min, false);
        add_int(p, "maximum", (long long)f->max, false);
    } else if (f->kind == RL_CFG_NUM) {
        cJSON_AddNumberToObject(p, "minimum", f->min);
        cJSON_AddNumberToObject(p, "maximum", f->max);
    }
    if (f->kind == RL_CFG_STR && f->choices) {
        cJSON *en = cJSON_AddArrayToObject(p, "enum");
        for (const char *const *c = f->choices; *c; c++) cJSON_AddItemToArray(en, cJSON_CreateString(*c));
    } else if (f->kind == RL_CFG_STR) {
        cJSON_AddNumberToObject(p, "maxLength", (double)(f->size - 1));
        if (f->flags & RL_CFG_URL) cJSON_AddStringToObject(p, "pattern", "^(https?://.*)?$");
    }
    if (f->kind == RL_CFG_OBJ) {
        cJSON *sub = rl_cfg_schema(f->sub, for_crd);
        cJSON_AddItemToObject(p, "properties", cJSON_DetachItemFromObject(sub, "properties"));
        cJSON_Delete(sub);
    }
}

cJSON *rl_cfg_schema(const rl_cfg_section *s, bool for_crd) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", "object");
    if (s->doc) cJSON_AddStringToObject(o, "description", s->doc);
    cJSON *props = cJSON_AddObjectToObject(o, "properties");
    for (int i = 0; i < s->n; i++) {
        if (for_crd && (s->fields[i].flags & RL_CFG_OPERATOR)) continue;
        field_schema(&s->fields[i], for_crd, cJSON_AddObjectToObject(props, s->fields[i].name));
    }
    return o;
}
