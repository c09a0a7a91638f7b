/* YAML into cJSON, read by libyaml: kubeconfigs as gcloud, aws, az and
 * kubectl write them (block and flow style, block scalars, comments,
 * quoted keys, anchors and aliases).
 *
 * libyaml's event parser drives a small builder: a stack of open
 * collections, each mapping remembering the key whose value comes next.
 * Every scalar stays a string (the kubeconfig reader decides what a field
 * means), except the plain null forms. What a kubeconfig never needs and
 * a misreading would hide is refused with the line: several documents,
 * merge keys, non-scalar keys, duplicate keys, application tags. Aliases
 * are copies, bounded so that a "billion laughs" file fails instead of
 * eating memory; depth is bounded too. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "k8s_internal.h"

#define MAX_DEPTH 64
#define MAX_ANCHORS 256
#define MAX_ALIAS_NODES 100000 /* nodes all aliases together may copy */

typedef struct anchor {
    char *name;
    cJSON *node;     /* owned by the tree */
    long nodes;      /* its size once complete; -1 while still open */
    long start;      /* yb.nodes when it opened */
} anchor;

typedef struct frame {
    cJSON *node;
    char *key;       /* a mapping's pending key (NULL: a key comes next) */
    int anchor;      /* index into yb.an, or -1 */
} frame;

typedef struct yb {
    const char *where;
    rl_err *e;
    frame st[MAX_DEPTH];
    int depth;
    anchor an[MAX_ANCHORS];
    int nan;
    long nodes, copied;
    cJSON *root;
    int docs;
    bool typed; /* plain scalars resolved to JSON types (rl_k8s_yaml_parse_typed) */
} yb;

static int fail(yb *b, const yaml_event_t *ev, const char *what) {
    return rl_errf(b->e, RL_EINPUT, "%s: line %zu: %s", b->where, ev->start_mark.line + 1, what);
}

static int oom(yb *b) { return rl_errf(b->e, RL_ENOMEM, "%s: out of memory", b->where); }


/* Standard tags only: "!!str" and friends change nothing here (every
 * scalar is a string), an application's "!thing" would need its meaning. */
static int check_tag(yb *b, const yaml_event_t *ev, const yaml_char_t *tag) {
    if (!tag) return RL_OK;
    const char *t = (const char *)tag;
    if (strncmp(t, "tag:yaml.org,2002:", 18) == 0 && strcmp(t + 18, "binary") != 0) return RL_OK;
    char msg[160], pt[80];
    rl_k8s__printable(t, pt, sizeof pt);
    snprintf(msg, sizeof msg, "tag %s is not supported", pt);
    return fail(b, ev, msg);
}

static int open_anchor(yb *b, const yaml_event_t *ev, const yaml_char_t *name, cJSON *node,
                       int *idx) {
    *idx = -1;
    if (!name) return RL_OK;
    if (b->nan == MAX_ANCHORS) return fail(b, ev, "too many anchors");
    char *n = strdup((const char *)name);
    if (!n) return oom(b);
    /* a later anchor of the same name shadows the earlier one (YAML 1.1) */
    b->an[b->nan] = (anchor){.name = n, .node = node, .nodes = -1, .start = b->nodes};
    *idx = b->nan++;
    return RL_OK;
}

static void close_anchor(yb *b, int idx) {
    if (idx >= 0) b->an[idx].nodes = b->nodes - b->an[idx].start + 1;
}

/* Hang a finished node under the open collection (or make it the root).
 * Takes ownership of v in every case. */
static int attach(yb *b, const yaml_event_t *ev, cJSON *v) {
    if (b->depth == 0) {
        b->root = v;
        return RL_OK;
    }
    frame *f = &b->st[b->depth - 1];
    if (cJSON_IsArray(f->node)) {
        cJSON_AddItemToArray(f->node, v);
        return RL_OK;
    }
    if (!f->key) {
        cJSON_Delete(v);
        return fail(b, ev, "a mapping key must be a plain or quoted scalar");
    }
    cJSON_AddItemToObject(f->node, f->key, v);
    free(f->key);
    f->key = NULL;
    return RL_OK;
}

/* A scalar where a mapping expects its key. */
static int take_key(yb *b, const yaml_event_t *ev, const char *s) {
    frame *f = &b->st[b->depth - 1];
    char pk[120], msg[200];
    if (ev->data.scalar.plain_implicit && strcmp(s, "<<") == 0)
        return fail(b, ev, "merge keys (<<) are not supported");
    if (cJSON_GetObjectItemCaseSensitive(f->node, s)) {
        rl_k8s__printable(s, pk, sizeof pk);
        snprintf(msg, sizeof msg, "duplicate key \"%s\"", pk);
        return fail(b, ev, msg);
    }
    if (!(f->key = strdup(s))) return oom(b);
    return RL_OK;
}

static bool expects_key(const yb *b) {
    return b->depth > 0 && cJSON_IsObject(b->st[b->depth - 1].node) && !b->st[b->depth - 1].key;
}

/* A plain scalar by YAML 1.2's core schema, as kubectl turns manifests
 * into JSON: true/false, integers (decimal, 0o, 0x), floats; anything
 * else (.inf and .nan included, which JSON cannot hold) a string. */
static cJSON *core_scalar(const char *s) {
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) return cJSON_CreateTrue();
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) return cJSON_CreateFalse();
    const char *d = s + (*s == '-' || *s == '+');
    char *end = NULL;
    if (d == s && d[0] == '0' && (d[1] == 'o' || d[1] == 'x') && isxdigit((unsigned char)d[2])) {
        unsigned long long v = strtoull(d + 2, &end, d[1] == 'o' ? 8 : 16); /* 0o17, 0x1F */
        if (!*end) return cJSON_CreateNumber((double)v);
    } else if ((*d >= '0' && *d <= '9') || (*d == '.' && d[1] >= '0' && d[1] <= '9')) {
        double v = strtod(s, &end); /* which also reads hex floats, inf, nan: not the core schema's */
        if (!*end && !strpbrk(s, "xXnNiI")) return cJSON_CreateNumber(v);
    }
    return cJSON_CreateString(s);
}

static int on_scalar(yb *b, const yaml_event_t *ev) {
    const char *s = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    int rc = check_tag(b, ev, ev->data.scalar.tag);
    if (rc) return rc;
    if (strlen(s) != len) return fail(b, ev, "a NUL character in a string");
    if (expects_key(b)) {
        if (ev->data.scalar.anchor) return fail(b, ev, "anchors on mapping keys are not supported");
        return take_key(b, ev, s);
    }
    const char *tag = (const char *)ev->data.scalar.tag;
    bool null = (tag && strcmp(tag, "tag:yaml.org,2002:null") == 0) ||
                (ev->data.scalar.plain_implicit &&
                 (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
                  !strcmp(s, "NULL")));
    cJSON *v = null                                               ? cJSON_CreateNull()
               : b->typed && ev->data.scalar.plain_implicit && !tag ? core_scalar(s)
                                                                    : cJSON_CreateString(s);
    if (!v) return oom(b);
    b->nodes++;
    int idx;
    if ((rc = open_anchor(b, ev, ev->data.scalar.anchor, v, &idx))) {
        cJSON_Delete(v);
        return rc;
    }
    close_anchor(b, idx);
    return attach(b, ev, v);
}

static int on_open(yb *b, const yaml_event_t *ev, bool map) {
    const yaml_char_t *tag = map ? ev->data.mapping_start.tag : ev->data.sequence_start.tag;
    const yaml_char_t *an = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
    int rc = check_tag(b, ev, tag);
    if (rc) return rc;
    if (expects_key(b)) return fail(b, ev, "a mapping key must be a plain or quoted scalar");
    if (b->depth == MAX_DEPTH) return fail(b, ev, "nested too deeply");
    cJSON *v = map ? cJSON_CreateObject() : cJSON_CreateArray();
    if (!v) return oom(b);
    b->nodes++;
    int idx;
    if ((rc = open_anchor(b, ev, an, v, &idx))) {
        cJSON_Delete(v);
        return rc;
    }
    b->st[b->depth++] = (frame){.node = v, .anchor = idx};
    return RL_OK;
}

static int on_close(yb *b, const yaml_event_t *ev) {
    frame f = b->st[--b->depth];
    free(f.key); /* libyaml pairs every key with a value; defensive */
    close_anchor(b, f.anchor);
    return attach(b, ev, f.node);
}

static int on_alias(yb *b, const yaml_event_t *ev) {
    if (expects_key(b)) return fail(b, ev, "aliases as mapping keys are not supported");
    const char *name = (const char *)ev->data.alias.anchor;
    for (int i = b->nan - 1; i >= 0; i--) {
        if (strcmp(b->an[i].name, name) != 0) continue;
        if (b->an[i].nodes < 0) return fail(b, ev, "an alias inside the node it names");
        if (b->copied + b->an[i].nodes > MAX_ALIAS_NODES)
            return fail(b, ev, "aliases expand to too many nodes");
        cJSON *v = cJSON_Duplicate(b->an[i].node, true);
        if (!v) return oom(b);
        b->copied += b->an[i].nodes;
        b->nodes += b->an[i].nodes;
        return attach(b, ev, v);
    }
    char pn[80], msg[160];
    rl_k8s__printable(name, pn, sizeof pn);
    snprintf(msg, sizeof msg, "alias *%s names no anchor before it", pn);
    return fail(b, ev, msg);
}

static int on_event(yb *b, const yaml_event_t *ev) {
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->docs > 1) return fail(b, ev, "only one YAML document is supported");
        return RL_OK;
    case YAML_SCALAR_EVENT: return on_scalar(b, ev);
    case YAML_SEQUENCE_START_EVENT: return on_open(b, ev, false);
    case YAML_MAPPING_START_EVENT: return on_open(b, ev, true);
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: return on_close(b, ev);
    case YAML_ALIAS_EVENT: return on_alias(b, ev);
    default: return RL_OK;
    }
}

static int parser_error(yb *b, const yaml_parser_t *p) {
    if (p->error == YAML_MEMORY_ERROR) return oom(b);
    const yaml_mark_t *m = p->problem ? &p->problem_mark : &p->context_mark;
    return rl_errf(b->e, RL_EINPUT, "%s: line %zu: %s%s%s", b->where, m->line + 1,
                   p->problem ? p->problem : "not valid YAML", p->context ? " " : "",
                   p->context ? p->context : "");
}

static void builder_free(yb *b) {
    for (int i = 0; i < b->nan; i++) free(b->an[i].name);
    /* open collections are attached to their parents only when they close */
    for (int i = 0; i < b->depth; i++) {
        free(b->st[i].key);
        cJSON_Delete(b->st[i].node);
    }
    cJSON_Delete(b->root);
}

static int parse_yaml(const char *text, size_t len, yb *b) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return oom(b);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int rc = RL_OK;
    for (bool done = false; !done && rc == RL_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = parser_error(b, &p);
            break;
        }
        done = ev.type == YAML_STREAM_END_EVENT;
        rc = on_event(b, &ev);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

static int yaml_parse(const char *text, size_t len, const char *where, bool typed, cJSON **out, rl_err *e) {
    *out = NULL;
    if (!where) where = "yaml";
    if (memchr(text, '\0', len)) return rl_errf(e, RL_EINPUT, "%s: contains a NUL byte", where);
    /* JSON (what `kubectl config view -o json` writes) keeps its types;
     * anything cJSON refuses gets libyaml's reading and line numbers. */
    size_t s = 0;
    while (s < len && (text[s] == ' ' || text[s] == '\t' || text[s] == '\r' || text[s] == '\n'))
        s++;
    if (s < len && text[s] == '{') {
        cJSON *j = cJSON_ParseWithLength(text, len);
        if (j) {
            *out = j;
            return RL_OK;
        }
    }
    yb *b = calloc(1, sizeof *b);
    if (!b) return rl_errf(e, RL_ENOMEM, "%s: out of memory", where);
    b->where = where;
    b->e = e;
    b->typed = typed;
    int rc = parse_yaml(text, len, b);
    if (rc == RL_OK && (!b->root || cJSON_IsNull(b->root)))
        rc = rl_errf(e, RL_EINPUT, "%s: empty document", where);
    if (rc == RL_OK) {
        *out = b->root;
        b->root = NULL;
    }
    builder_free(b);
    free(b);
    return rc;
}

int rl_k8s_yaml_parse(const char *text, size_t len, const char *where, cJSON **out, rl_err *e) {
    return yaml_parse(text, len, where, false, out, e);
}

int rl_k8s_yaml_parse_typed(const char *text, size_t len, const char *where, cJSON **out, rl_err *e) {
    return yaml_parse(text, len, where, true, out, e);
}
