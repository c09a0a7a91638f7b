/* `ringleader-operator render`: the objects the operator would create for
 * a TrainingJob, without a cluster, as a YAML List -- for review, as
 * `helm template` is. They come from the same spec parser (so the same
 * refusals) and the same builders as a reconcile; what only a cluster can
 * give is a placeholder: the job's uid (owner references) and the
 * rendezvous secret, which the operator draws at creation. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator.h"

#define PLACEHOLDER_UID "00000000-0000-0000-0000-000000000000"
/* 64 hex digits, as the real one: the Secret validates the same */
#define PLACEHOLDER_SECRET "0000000000000000000000000000000000000000000000000000000000000000"

/* ---- YAML out: block style; strings double-quoted, so no value can be
 * misread as another type, with everything outside YAML's printable set
 * escaped (JSON's printer leaves DEL, C1 controls and U+FFFE/U+FFFF raw,
 * which a YAML reader refuses). ---------------------------------------- */
static bool plain_key(const char *k) {
    if (!*k) return false;
    for (const char *c = k; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.' || *c == '/'))
            return false;
    return true;
}

/* The code point of the UTF-8 sequence at s, and its length in *n; a
 * broken sequence (none should reach here: the input was checked) is one
 * byte of U+FFFD. */
static unsigned code_point(const unsigned char *s, int *n) {
    if (s[0] < 0x80) return *n = 1, s[0];
    int len = s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return *n = 1, 0xFFFD;
    if (s[0] < 0xE0) return *n = 2, (s[0] & 0x1Fu) << 6 | (s[1] & 0x3Fu);
    if (s[0] < 0xF0) return *n = 3, (s[0] & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
    return *n = 4, (s[0] & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
}

static void quoted(FILE *f, const char *str) {
    fputc('"', f);
    for (const unsigned char *s = (const unsigned char *)str; *s;) {
        int n;
        unsigned c = code_point(s, &n);
        if (c == '"' || c == '\\') fprintf(f, "\\%c", (int)c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
        else if ((c >= 0x80 && c <= 0x9F) || c == 0xFEFF || c == 0xFFFD || c == 0xFFFE || c == 0xFFFF)
            fprintf(f, "\\u%04X", c);
        else fwrite(s, 1, (size_t)n, f);
        s += n;
    }
    fputc('"', f);
}

static void scalar(FILE *f, const cJSON *v) {
    if (cJSON_IsString(v)) return quoted(f, v->valuestring);
    char *s = cJSON_PrintUnformatted(v); /* numbers as JSON has them, true, false, null */
    fputs(s ? s : "null", f);
    free(s);
}

static bool empty_container(const cJSON *v) {
    return (cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child;
}

static void value(FILE *f, const cJSON *v, int indent);
#define LONG_KEY 160

/* The members of an object, the first one's indentation already written
 * when `first_inline` (a sequence item's "- "). */
static void members(FILE *f, const cJSON *o, int indent, bool first_inline) {
    for (const cJSON *m = o->child; m; m = m->next) {
        if (m != o->child || !first_inline) fprintf(f, "%*s", indent, "");
        /* YAML allows an implicit key of at most 1024 characters; a longer
         * one (escaped, up to 6 per byte) is written as an explicit key */
        if (strlen(m->string) > LONG_KEY) {
            fputs("? ", f);
            quoted(f, m->string);
            fprintf(f, "\n%*s", indent, "");
        } else if (plain_key(m->string)) {
            fputs(m->string, f);
        } else {
            quoted(f, m->string);
        }
        fputc(':', f);
        value(f, m, indent);
    }
}

/* After "key:" or "-": the value and its newline. */
static void value(FILE *f, const cJSON *v, int indent) {
    if (empty_container(v) || !(cJSON_IsObject(v) || cJSON_IsArray(v))) {
        fputc(' ', f);
        if (empty_container(v)) fputs(cJSON_IsObject(v) ? "{}" : "[]", f);
        else scalar(f, v);
        fputc('\n', f);
    } else if (cJSON_IsObject(v)) {
        fputc('\n', f);
        members(f, v, indent + 2, false);
    } else {
        fputc('\n', f);
        for (const cJSON *it = v->child; it; it = it->next) {
            fprintf(f, "%*s-", indent, "");
            if (cJSON_IsObject(it) && it->child) {
                fputc(' ', f);
                members(f, it, indent + 2, true);
            } else {
                value(f, it, indent);
            }
        }
    }
}

/* ---- the objects --------------------------------------------------------- */
/* One TrainingJob's objects onto items. */
static int render_job(const cJSON *obj, const char *ns, const char *metrics_ns, cJSON *items, rl_err *e) {
    cJSON *copy = cJSON_Duplicate(obj, 1);
    cJSON *md = cJSON_GetObjectItemCaseSensitive(copy, "metadata");
    if (copy && cJSON_IsObject(md)) {
        /* as the API server would fill them in */
        if (ns && *ns && !cJSON_GetObjectItemCaseSensitive(md, "namespace"))
            cJSON_AddStringToObject(md, "namespace", ns);
        if (!cJSON_GetObjectItemCaseSensitive(md, "uid")) cJSON_AddStringToObject(md, "uid", PLACEHOLDER_UID);
        if (!cJSON_GetObjectItemCaseSensitive(md, "generation")) cJSON_AddNumberToObject(md, "generation", 1);
    }
    rl_op_job j;
    int rc = rl_op_job_parse(copy, &j, e);
    if (rc) {
        rl_op_job_free(&j); /* a refusal may leave the training config behind */
        cJSON_Delete(copy);
        return rc;
    }
    /* the order ensure_all and the pod loop create them in */
    cJSON_AddItemToArray(items, rl_op_service(&j));
    cJSON_AddItemToArray(items, rl_op_secret(&j, PLACEHOLDER_SECRET));
    cJSON_AddItemToArray(items, rl_op_service_account(&j));
    cJSON_AddItemToArray(items, rl_op_role(&j));
    cJSON_AddItemToArray(items, rl_op_role_binding(&j));
    cJSON_AddItemToArray(items, rl_op_pdb(&j));
    if (j.network_policy) cJSON_AddItemToArray(items, rl_op_network_policy(&j, metrics_ns));
    for (int i = 0; i < j.replicas; i++) cJSON_AddItemToArray(items, rl_op_pod(&j, i));
    rl_op_job_free(&j);
    cJSON_Delete(copy);
    return RL_OK;
}

/* The next YAML document of text[*at..len): up to a line "---" (which may
 * carry a comment) or the end. False when none is left. */
static bool next_document(const char *text, size_t len, size_t *at, size_t *start, size_t *end) {
    if (*at > len) return false;
    *start = *at;
    for (size_t i = *at; i <= len; i++) {
        bool bol = i == *at || text[i - 1] == '\n';
        if (i == len || (bol && len - i >= 3 && !strncmp(text + i, "---", 3) &&
                         (i + 3 == len || strchr(" \t\r\n#", text[i + 3])))) {
            *end = i;
            const char *nl = i < len ? memchr(text + i, '\n', len - i) : NULL;
            *at = nl ? (size_t)(nl - text) + 1 : len + 1;
            return true;
        }
    }
    return false;
}

/* The offset of the first byte that is not well-formed UTF-8 (no overlong
 * forms, surrogates or code points past U+10FFFF), or n. Manifests are
 * UTF-8 (JSON's, and the API server's, rule), and a string that is not
 * could not be printed back as YAML. */
static size_t utf8_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (k == 9 || (k && i + k >= n)) return i; /* a bad lead byte, or cut short */
        unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        for (size_t j = 1; j <= k; j++)
            if (s[i + j] < (j == 1 ? lo : 0x80) || s[i + j] > (j == 1 ? hi : 0xBF)) return i;
        i += k + 1;
    }
    return n;
}

/* Only blank lines and comments (what a leading or trailing "---" leaves). */
static bool blank_document(const char *s, size_t n) {
    bool comment = false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') comment = false;
        else if (s[i] == '#') comment = true;
        else if (!comment && !strchr(" \t\r", s[i])) return false;
    }
    return true;
}

int rl_op_render(const char *text, size_t len, const char *where, const char *ns, const char *metrics_ns, char **yaml,
                 rl_err *e) {
    *yaml = NULL;
    size_t bad = utf8_prefix((const unsigned char *)text, len);
    if (bad < len) {
        int line = 1;
        for (size_t i = 0; i < bad; i++) line += text[i] == '\n';
        return rl_errf(e, RL_EINPUT, "%s: line %d: not UTF-8", where, line);
    }
    cJSON *list = cJSON_CreateObject();
    cJSON_AddStringToObject(list, "apiVersion", "v1");
    cJSON_AddStringToObject(list, "kind", "List");
    cJSON *items = cJSON_AddArrayToObject(list, "items");
    int rc = RL_OK, jobs = 0, doc = 0;
    size_t at = 0, start, end;
    while (!rc && next_document(text, len, &at, &start, &end)) {
        doc++;
        char w[600];
        snprintf(w, sizeof w, doc > 1 || at <= len ? "%s (document %d)" : "%s", where, doc);
        cJSON *obj = NULL;
        if (blank_document(text + start, end - start)) continue;
        if ((rc = rl_k8s_yaml_parse_typed(text + start, end - start, w, &obj, e)) == RL_OK && obj) {
            const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "kind"));
            if (kind && !strcmp(kind, "TrainingJob")) {
                if ((rc = render_job(obj, ns, metrics_ns, items, e))) rl_err_wrap(e, "%s", w);
                jobs++;
            }
        }
        cJSON_Delete(obj);
    }
    if (!rc && !jobs) rc = rl_errf(e, RL_EINPUT, "%s: no TrainingJob (kind TrainingJob, " RL_OP_GV ") in it", where);
    size_t n = 0;
    FILE *f = rc ? NULL : open_memstream(yaml, &n);
    if (!rc && !f) rc = rl_errf(e, RL_ENOMEM, "out of memory");
    if (f) {
        members(f, list, 0, false);
        if (fclose(f) != 0) rc = rl_errf(e, RL_ENOMEM, "out of memory");
    }
    if (rc) {
        free(*yaml);
        *yaml = NULL;
    }
    cJSON_Delete(list);
    return rc;
}
