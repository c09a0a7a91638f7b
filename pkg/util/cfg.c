/* Strict readers for JSON config objects. A typo in a config must never be
 * silently ignored (a misspelled "learning_rate" would train with the
 * default), so unknown keys are errors and every value is range-checked. */
#include "util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

int rl_cfg_check_keys(const cJSON *obj, const char *where, const char *const *allowed,
                      rl_err *e) {
    if (!cJSON_IsObject(obj)) return rl_errf(e, RL_EINPUT, "%s: must be a JSON object", where);
    for (const cJSON *it = obj->child; it; it = it->next) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (it->string && strcmp(it->string, *a) == 0) ok = true;
        if (!ok) {
            char esc[128];
            return rl_errf(e, RL_EINPUT, "%s: unknown field \"%s\"", where,
                           rl_json_escape(esc, sizeof esc, it->string ? it->string : ""));
        }
        /* cJSON keeps duplicate keys; a config with two values for one
         * field is ambiguous, so refuse it. */
        for (const cJSON *j = it->next; j; j = j->next)
            if (j->string && it->string && strcmp(j->string, it->string) == 0)
                return rl_errf(e, RL_EINPUT, "%s: field \"%s\" given twice", where, it->string);
    }
    return RL_OK;
}

static const cJSON *get(const cJSON *obj, const char *name) {
    return cJSON_GetObjectItemCaseSensitive(obj, name);
}

int rl_cfg_int(const cJSON *obj, const char *where, const char *name, long long min,
               long long max, long long *out, rl_err *e) {
    const cJSON *v = get(obj, name);
    if (!v) return RL_OK;
    if (!cJSON_IsNumber(v)) return rl_errf(e, RL_EINPUT, "%s.%s: must be a number", where, name);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return rl_errf(e, RL_EINPUT, "%s.%s: must be an integer", where, name);
    if (d < (double)min || d > (double)max)
        return rl_errf(e, RL_EINPUT, "%s.%s: %.17g is out of range [%lld, %lld]", where, name, d,
                       min, max);
    *out = (long long)d;
    return RL_OK;
}

int rl_cfg_num(const cJSON *obj, const char *where, const char *name, double min, double max,
               double *out, rl_err *e) {
    const cJSON *v = get(obj, name);
    if (!v) return RL_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return rl_errf(e, RL_EINPUT, "%s.%s: must be a finite number", where, name);
    if (v->valuedouble < min || v->valuedouble > max)
        return rl_errf(e, RL_EINPUT, "%s.%s: %g is out of range [%g, %g]", where, name,
                       v->valuedouble, min, max);
    *out = v->valuedouble;
    return RL_OK;
}

int rl_cfg_bool(const cJSON *obj, const char *where, const char *name, bool *out, rl_err *e) {
    const cJSON *v = get(obj, name);
    if (!v) return RL_OK;
    if (!cJSON_IsBool(v)) return rl_errf(e, RL_EINPUT, "%s.%s: must be true or false", where, name);
    *out = cJSON_IsTrue(v);
    return RL_OK;
}

int rl_cfg_str(const cJSON *obj, const char *where, const char *name, char *out, size_t n,
               rl_err *e) {
    const cJSON *v = get(obj, name);
    if (!v) return RL_OK;
    if (!cJSON_IsString(v)) return rl_errf(e, RL_EINPUT, "%s.%s: must be a string", where, name);
    size_t len = strlen(v->valuestring);
    if (len >= n)
        return rl_errf(e, RL_EINPUT, "%s.%s: longer than %zu characters", where, name, n - 1);
    memcpy(out, v->valuestring, len + 1);
    return RL_OK;
}

int rl_cfg_obj(const cJSON *obj, const char *where, const char *name, const cJSON **out,
               rl_err *e) {
    const cJSON *v = get(obj, name);
    *out = NULL;
    if (!v) return RL_OK;
    if (!cJSON_IsObject(v)) return rl_errf(e, RL_EINPUT, "%s.%s: must be an object", where, name);
    *out = v;
    return RL_OK;
}
