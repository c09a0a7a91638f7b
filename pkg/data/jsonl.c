/* JSON Lines documents (data.h): one JSON object per line, the document's
 * text in one of its string fields -- what Hugging Face `datasets` exports
 * with to_json(). A line longer than max_line is refused as it is read, so
 * a file without newlines cannot make the reader hold more than that. */
#include "data/data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_LINE ((size_t)64 << 20)

struct rl_jsonl {
    FILE *f;
    char *path, *field;
    size_t max_line;
    long long line; /* of the document last returned */
    char *buf;      /* the current line */
    size_t cap;
    char *text;     /* the current document's text (owned) */
};

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

static const char *kind(const cJSON *v) {
    return cJSON_IsNumber(v) ? "a number" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsNull(v) ? "null"
         : cJSON_IsArray(v)  ? "an array" : cJSON_IsObject(v) ? "an object" : "not a string";
}

/* A \u0000 escape (an odd run of backslashes before "u0000"): cJSON's
 * strings end at a NUL, so the text would be cut there without a word. */
static bool nul_escape(const char *s, size_t n) {
    for (size_t i = 1; i + 5 <= n; i++) {
        if (memcmp(s + i, "u0000", 5) != 0) continue;
        size_t k = 0;
        while (k < i && s[i - 1 - k] == '\\') k++;
        if (k % 2) return true;
    }
    return false;
}

int rl_jsonl_parse_line(const char *line, size_t len, const char *field, const char *where, char **text,
                        size_t *tlen, rl_err *e) {
    *text = NULL, *tlen = 0;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(line, len, &end, false);
    if (!doc) {
        size_t at = end && end >= line && end <= line + len ? (size_t)(end - line) : 0;
        return rl_errf(e, RL_EINPUT, "%s: not JSON (at byte %zu of the line)", where, at);
    }
    int rc = RL_OK;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, field);
    size_t at = end ? (size_t)(end - line) : len;
    while (at < len && blank(line + at, 1)) at++;
    if (at < len)
        rc = rl_errf(e, RL_EINPUT, "%s: more than one JSON value on the line (at byte %zu)", where, at);
    else if (nul_escape(line, len))
        rc = rl_errf(e, RL_EINPUT, "%s: a \\u0000 (NUL) in a string, which this reader cannot keep", where);
    else if (!cJSON_IsObject(doc))
        rc = rl_errf(e, RL_EINPUT, "%s: %s, not an object with a \"%.64s\" field", where, kind(doc), field);
    else if (!v)
        rc = rl_errf(e, RL_EINPUT, "%s: no \"%.64s\" field", where, field);
    else if (!cJSON_IsString(v) || !v->valuestring)
        rc = rl_errf(e, RL_EINPUT, "%s: \"%.64s\" is %s, not a string", where, field, kind(v));
    else if (!(*text = strdup(v->valuestring)))
        rc = rl_errf(e, RL_ENOMEM, "%s: out of memory", where);
    else
        *tlen = strlen(*text);
    cJSON_Delete(doc);
    return rc;
}

int rl_jsonl_open(const char *path, const char *field, size_t max_line, rl_jsonl **out, rl_err *e) {
    *out = NULL;
    if (!field || !*field) return rl_errf(e, RL_EINPUT, "%s: no field name to read the text from", path);
    rl_jsonl *j = calloc(1, sizeof *j);
    if (!j || !(j->path = strdup(path)) || !(j->field = strdup(field))) {
        if (j) free(j->path), free(j);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory", path);
    }
    j->max_line = max_line ? max_line : DEFAULT_MAX_LINE;
    if (!(j->f = fopen(path, "rb"))) {
        int rc = rl_errf(e, RL_EINPUT, "%s: cannot open: %s", path, strerror(errno));
        rl_jsonl_close(j);
        return rc;
    }
    *out = j;
    return RL_OK;
}

/* The next line into j->buf (without its newline); *n = (size_t)-1 at the
 * end. A NUL byte cannot be in JSON text, and would hide the line's end
 * from the parser: refused. */
static int read_line(rl_jsonl *j, size_t *n, rl_err *e) {
    size_t len = 0;
    int c;
    *n = (size_t)-1;
    while ((c = getc_unlocked(j->f)) != EOF && c != '\n') {
        if (len == j->max_line)
            return rl_errf(e, RL_EINPUT, "%s:%lld: line longer than %zu bytes", j->path, j->line + 1, j->max_line);
        if (c == 0) return rl_errf(e, RL_EINPUT, "%s:%lld: a NUL byte in the line", j->path, j->line + 1);
        if (len + 1 >= j->cap) {
            size_t cap = j->cap ? 2 * j->cap : 1 << 16;
            if (cap > j->max_line + 1) cap = j->max_line + 1;
            char *b = realloc(j->buf, cap);
            if (!b) return rl_errf(e, RL_ENOMEM, "%s:%lld: out of memory", j->path, j->line + 1);
            j->buf = b, j->cap = cap;
        }
        j->buf[len++] = (char)c;
    }
    if (c == EOF && ferror(j->f)) return rl_errf(e, RL_EIO, "%s:%lld: read: %s", j->path, j->line + 1, strerror(errno));
    if (c != EOF || len > 0) *n = len; /* a last line without its newline counts */
    return RL_OK;
}

int rl_jsonl_next(rl_jsonl *j, const char **text, size_t *len, rl_err *e) {
    *text = NULL, *len = 0;
    free(j->text);
    j->text = NULL;
    for (;;) {
        size_t n;
        int rc = read_line(j, &n, e);
        if (rc || n == (size_t)-1) return rc;
        j->line++;
        if (blank(j->buf, n)) continue;
        char where[4200];
        snprintf(where, sizeof where, "%s:%lld", j->path, j->line);
        if ((rc = rl_jsonl_parse_line(j->buf, n, j->field, where, &j->text, len, e))) return rc;
        *text = j->text;
        return RL_OK;
    }
}

long long rl_jsonl_line(const rl_jsonl *j) { return j->line; }
long long rl_jsonl_offset(const rl_jsonl *j) { return (long long)ftello(j->f); }

void rl_jsonl_close(rl_jsonl *j) {
    if (!j) return;
    if (j->f) fclose(j->f);
    free(j->path), free(j->field), free(j->buf), free(j->text);
    free(j);
}
