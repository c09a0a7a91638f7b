/* The YAML subset that kubectl writes for kubeconfigs, read into cJSON.
 *
 * Line-oriented: the text is cut into lines with their indentation, and a
 * recursive descent walks them. A sequence item's inline content ("- key:
 * v") is handled by rewriting that line in place as if it started at the
 * item's content column, so "- " items and nested mappings share one code
 * path. Anything outside the subset is refused with the line number rather
 * than guessed at: a misread credential file is worse than a clear error. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s.h"

#define MAX_DEPTH 64

typedef struct yline {
    int indent, lineno;
    char *text; /* content after the indentation, NUL-terminated, right-trimmed */
} yline;

typedef struct yp {
    yline *ln;
    int n, i;
    const char *where;
    rl_err *e;
} yp;

static int fail(yp *p, int lineno, const char *what) {
    return rl_errf(p->e, RL_EINPUT, "%s: line %d: %s", p->where, lineno, what);
}

static bool is_seq_item(const char *t) { return t[0] == '-' && (t[1] == ' ' || t[1] == '\0'); }

/* A value that is empty or only a comment. */
static bool is_empty(const char *t) {
    while (*t == ' ') t++;
    return *t == '\0' || *t == '#';
}

static void put_utf8(char **o, unsigned long cp) {
    unsigned char *q = (unsigned char *)*o;
    if (cp < 0x80) {
        *q++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *q++ = (unsigned char)(0xC0 | (cp >> 6));
        *q++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *q++ = (unsigned char)(0xE0 | (cp >> 12));
        *q++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *q++ = (unsigned char)(0xF0 | (cp >> 18));
        *q++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *q++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    *o = (char *)q;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Parse a quoted scalar at t (t[0] is the quote). On success *out is a
 * malloc'd string and *end points just past the closing quote. */
static int parse_quoted(yp *p, int lineno, const char *t, char **out, const char **end) {
    char q = t[0];
    size_t n = strlen(t);
    char *buf = malloc(n + 1), *o = buf;
    if (!buf) return rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
    const char *s = t + 1;
    for (;;) {
        if (*s == '\0') {
            free(buf);
            return fail(p, lineno, "unterminated quoted string (multi-line quoted scalars are not supported)");
        }
        if (*s == q) {
            if (q == '\'' && s[1] == '\'') { /* '' is a literal quote */
                *o++ = '\'';
                s += 2;
                continue;
            }
            s++;
            break;
        }
        if (q == '"' && *s == '\\') {
            char c = s[1];
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
            if (digits) {
                unsigned long cp = 0;
                for (int k = 0; k < digits; k++) {
                    int h = hexval(s[2 + k]);
                    if (h < 0) {
                        free(buf);
                        return fail(p, lineno, "bad hex escape in a double-quoted string");
                    }
                    cp = cp * 16 + (unsigned long)h;
                }
                if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                    free(buf);
                    return fail(p, lineno, "escape is not a usable character");
                }
                put_utf8(&o, cp);
                s += 2 + digits;
                continue;
            }
            char r;
            switch (c) {
            case '\\': r = '\\'; break;
            case '"': r = '"'; break;
            case '/': r = '/'; break;
            case 'n': r = '\n'; break;
            case 't': r = '\t'; break;
            case 'r': r = '\r'; break;
            case 'b': r = '\b'; break;
            case 'f': r = '\f'; break;
            case ' ': r = ' '; break;
            default:
                free(buf);
                return fail(p, lineno, "unknown escape in a double-quoted string");
            }
            *o++ = r;
            s += 2;
            continue;
        }
        *o++ = *s++;
    }
    *o = '\0';
    *out = buf;
    *end = s;
    return RL_OK;
}

/* An inline value: quoted, {} / [], or plain (to a " #" comment). */
static int parse_scalar(yp *p, int lineno, const char *t, cJSON **out) {
    while (*t == ' ') t++;
    if (*t == '"' || *t == '\'') {
        char *s;
        const char *end;
        int rc = parse_quoted(p, lineno, t, &s, &end);
        if (rc) return rc;
        if (!is_empty(end) || (*end && *end != ' ')) {
            free(s);
            return fail(p, lineno, "text after a quoted string");
        }
        *out = cJSON_CreateString(s);
        free(s);
        return *out ? RL_OK : rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
    }
    if (*t == '{' || *t == '[') {
        bool obj = *t == '{';
        const char *r = t + 1;
        while (*r == ' ') r++;
        if (*r != (obj ? '}' : ']') || !is_empty(r + 1) || (r[1] && r[1] != ' '))
            return fail(p, lineno, "flow collections other than {} and [] are not supported");
        *out = obj ? cJSON_CreateObject() : cJSON_CreateArray();
        return *out ? RL_OK : rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
    }
    if (strchr("&*!|>%@`?", *t) && *t)
        return fail(p, lineno,
                    "anchors, aliases, tags, block scalars and complex keys are not supported");
    size_t len = strlen(t);
    const char *hash = t;
    while ((hash = strchr(hash, '#')) != NULL) {
        if (hash == t || hash[-1] == ' ' || hash[-1] == '\t') {
            len = (size_t)(hash - t);
            break;
        }
        hash++;
    }
    while (len && (t[len - 1] == ' ' || t[len - 1] == '\t')) len--;
    if (len == 0 || (len == 1 && t[0] == '~') ||
        (len == 4 && (!strncmp(t, "null", 4) || !strncmp(t, "Null", 4) || !strncmp(t, "NULL", 4)))) {
        *out = cJSON_CreateNull();
    } else {
        char *s = malloc(len + 1);
        if (!s) return rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
        memcpy(s, t, len);
        s[len] = '\0';
        *out = cJSON_CreateString(s);
        free(s);
    }
    return *out ? RL_OK : rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
}

/* Where the key of a "key: value" line ends: the ':' followed by a space
 * or the end; NULL when the line is not a mapping entry. */
static const char *plain_key_colon(const char *t) {
    for (const char *c = t; *c; c++) {
        if (*c == ':' && (c[1] == ' ' || c[1] == '\0')) return c;
        if (*c == '#' && c > t && c[-1] == ' ') return NULL;
    }
    return NULL;
}

static bool is_map_entry(const char *t) {
    if (*t == '"' || *t == '\'') {
        /* a quoted key: find the matching quote, then ':' */
        char q = *t;
        const char *s = t + 1;
        while (*s) {
            if (*s == '\\' && q == '"' && s[1]) {
                s += 2;
                continue;
            }
            if (*s == q) {
                if (q == '\'' && s[1] == '\'') {
                    s += 2;
                    continue;
                }
                break;
            }
            s++;
        }
        if (*s != q) return false;
        s++;
        while (*s == ' ') s++;
        return *s == ':' && (s[1] == ' ' || s[1] == '\0');
    }
    return plain_key_colon(t) != NULL;
}

static int parse_block(yp *p, int indent, int depth, cJSON **out);
static int parse_seq(yp *p, int indent, int depth, cJSON **out);

static int parse_map(yp *p, int indent, int depth, cJSON **out) {
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
    int rc = RL_OK;
    while (p->i < p->n && p->ln[p->i].indent >= indent) {
        yline *l = &p->ln[p->i];
        if (l->indent > indent) {
            rc = fail(p, l->lineno, "unexpected indentation");
            goto bad;
        }
        const char *t = l->text, *rest;
        char *key = NULL;
        if (is_seq_item(t)) {
            rc = fail(p, l->lineno, "a sequence item where a mapping key was expected");
            goto bad;
        }
        if (*t == '"' || *t == '\'') {
            const char *end;
            if ((rc = parse_quoted(p, l->lineno, t, &key, &end))) goto bad;
            while (*end == ' ') end++;
            if (*end != ':' || (end[1] != ' ' && end[1] != '\0')) {
                free(key);
                rc = fail(p, l->lineno, "expected ':' after a quoted key");
                goto bad;
            }
            rest = end + 1;
        } else {
            const char *colon = plain_key_colon(t);
            if (!colon) {
                rc = fail(p, l->lineno, "expected 'key: value'");
                goto bad;
            }
            if (strchr("&*!|>%@`?{[", *t)) {
                rc = fail(p, l->lineno, "this kind of mapping key is not supported");
                goto bad;
            }
            size_t kl = (size_t)(colon - t);
            while (kl && t[kl - 1] == ' ') kl--;
            key = malloc(kl + 1);
            if (!key) {
                rc = rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
                goto bad;
            }
            memcpy(key, t, kl);
            key[kl] = '\0';
            rest = colon + 1;
        }
        int lineno = l->lineno;
        if (cJSON_GetObjectItemCaseSensitive(obj, key)) {
            char msg[160];
            snprintf(msg, sizeof msg, "duplicate key \"%.100s\"", key);
            for (char *q = msg; *q; q++)
                if ((unsigned char)*q < 0x20) *q = '?';
            free(key);
            rc = fail(p, lineno, msg);
            goto bad;
        }
        cJSON *child = NULL;
        p->i++;
        if (is_empty(rest)) {
            if (p->i < p->n && p->ln[p->i].indent > indent) {
                rc = parse_block(p, p->ln[p->i].indent, depth + 1, &child);
            } else if (p->i < p->n && p->ln[p->i].indent == indent &&
                       is_seq_item(p->ln[p->i].text)) {
                /* kubectl writes "key:\n- item" with the dash at the key's column */
                rc = parse_seq(p, indent, depth + 1, &child);
            } else {
                child = cJSON_CreateNull();
                if (!child) rc = rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
            }
        } else {
            rc = parse_scalar(p, lineno, rest, &child);
            if (!rc && p->i < p->n && p->ln[p->i].indent > indent) {
                cJSON_Delete(child);
                child = NULL;
                rc = fail(p, p->ln[p->i].lineno,
                          "unexpected indentation (multi-line scalars are not supported)");
            }
        }
        if (rc) {
            free(key);
            goto bad;
        }
        cJSON_AddItemToObject(obj, key, child);
        free(key);
    }
    *out = obj;
    return RL_OK;
bad:
    cJSON_Delete(obj);
    return rc;
}

static int parse_seq(yp *p, int indent, int depth, cJSON **out) {
    if (depth > MAX_DEPTH) return fail(p, p->ln[p->i].lineno, "nested too deeply");
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
    int rc = RL_OK;
    while (p->i < p->n && p->ln[p->i].indent >= indent) {
        yline *l = &p->ln[p->i];
        if (l->indent > indent) {
            rc = fail(p, l->lineno, "unexpected indentation");
            goto bad;
        }
        if (!is_seq_item(l->text)) break; /* the parent mapping's next key */
        char *rest = l->text + 1;
        int k = 0;
        while (rest[k] == ' ') k++;
        cJSON *child = NULL;
        if (is_empty(rest)) {
            p->i++;
            if (p->i < p->n && p->ln[p->i].indent > indent) {
                rc = parse_block(p, p->ln[p->i].indent, depth + 1, &child);
            } else {
                child = cJSON_CreateNull();
                if (!child) rc = rl_errf(p->e, RL_ENOMEM, "%s: out of memory", p->where);
            }
        } else {
            /* The item's content becomes a line of its own at its column. */
            l->indent = indent + 1 + k;
            l->text = rest + k;
            rc = parse_block(p, l->indent, depth + 1, &child);
        }
        if (rc) goto bad;
        cJSON_AddItemToArray(arr, child);
    }
    *out = arr;
    return RL_OK;
bad:
    cJSON_Delete(arr);
    return rc;
}

static int parse_block(yp *p, int indent, int depth, cJSON **out) {
    yline *l = &p->ln[p->i];
    if (depth > MAX_DEPTH) return fail(p, l->lineno, "nested too deeply");
    if (is_seq_item(l->text)) return parse_seq(p, indent, depth, out);
    if (is_map_entry(l->text)) return parse_map(p, indent, depth, out);
    int rc = parse_scalar(p, l->lineno, l->text, out);
    if (rc) return rc;
    p->i++;
    if (p->i < p->n && p->ln[p->i].indent > indent) {
        cJSON_Delete(*out);
        *out = NULL;
        return fail(p, p->ln[p->i].lineno, "unexpected indentation (multi-line scalars are not supported)");
    }
    return RL_OK;
}

int rl_k8s_yaml_parse(const char *text, size_t len, const char *where, cJSON **out, rl_err *e) {
    *out = NULL;
    if (!where) where = "yaml";
    if (memchr(text, '\0', len)) return rl_errf(e, RL_EINPUT, "%s: contains a NUL byte", where);
    size_t s = 0;
    while (s < len && (text[s] == ' ' || text[s] == '\t' || text[s] == '\r' || text[s] == '\n'))
        s++;
    if (s < len && text[s] == '{') {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
        if (!j)
            return rl_errf(e, RL_EINPUT, "%s: not valid JSON (near byte %zu)", where,
                           end ? (size_t)(end - text) : 0);
        *out = j;
        return RL_OK;
    }
    char *buf = malloc(len + 1);
    if (!buf) return rl_errf(e, RL_ENOMEM, "%s: out of memory", where);
    memcpy(buf, text, len);
    buf[len] = '\0';
    size_t maxlines = 1;
    for (size_t i = 0; i < len; i++) maxlines += buf[i] == '\n';
    yline *ln = calloc(maxlines, sizeof *ln);
    if (!ln) {
        free(buf);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory", where);
    }
    yp p = {.ln = ln, .where = where, .e = e};
    int rc = RL_OK, lineno = 0;
    bool seen_content = false;
    for (char *line = buf; line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        lineno++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t'))
            line[--l] = '\0';
        int ind = 0;
        while (line[ind] == ' ') ind++;
        char *t = line + ind;
        if (*t == '\t') {
            rc = fail(&p, lineno, "tab in indentation");
            goto out;
        }
        bool skip = *t == '\0' || *t == '#';
        if (ind == 0 && (!strcmp(t, "---") || !strncmp(t, "--- ", 4))) {
            if (seen_content) {
                rc = fail(&p, lineno, "only one YAML document is supported");
                goto out;
            }
            skip = true;
        }
        if (ind == 0 && !strcmp(t, "...")) skip = true;
        if (ind == 0 && *t == '%' && !seen_content) skip = true; /* %YAML directive */
        if (!skip) {
            ln[p.n++] = (yline){.indent = ind, .lineno = lineno, .text = t};
            seen_content = true;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (p.n == 0) {
        rc = rl_errf(e, RL_EINPUT, "%s: empty document", where);
        goto out;
    }
    rc = parse_block(&p, ln[0].indent, 0, out);
    if (!rc && p.i < p.n) {
        cJSON_Delete(*out);
        *out = NULL;
        rc = fail(&p, ln[p.i].lineno, "unexpected indentation");
    }
out:
    free(ln);
    free(buf);
    return rc;
}
