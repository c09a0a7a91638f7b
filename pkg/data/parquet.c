/* Parquet documents (data.h) through the Arrow shim (parquet_arrow.cc),
 * loaded with dlopen the first time a Parquet file is opened: the only part
 * of the project that needs Arrow's libraries, so a build or an image
 * without them still does everything else and this mode names what is
 * missing. The shim's messages are Arrow's, passed on as one line after the
 * file's name. */
#include "data/data.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RLPQ_ABI 1

typedef struct {
    int (*abi)(void);
    void *(*open)(const char *path, const char *column, char *err, size_t errlen);
    int (*next)(void *h, const char **s, size_t *n, char *err, size_t errlen);
    long long (*rows)(void *h);
    void (*close)(void *h);
} shim;

struct rl_parquet {
    shim f;
    void *h;
    char *path, *field;
    long long row; /* of the document last returned, from 0 */
};

/* The library stays loaded for the process (RTLD_NODELETE): Arrow keeps
 * global state that an unload would leave dangling. */
static int load(const char *lib, shim *f, rl_err *e) {
    void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!dl) {
        rl_errf(e, RL_EINPUT, "parquet: cannot load the Arrow Parquet reader (make parquet builds it): %s", dlerror());
        rl_err_one_line(e);
        return e->code;
    }
    *(void **)&f->abi = dlsym(dl, "rlpq_abi");
    *(void **)&f->open = dlsym(dl, "rlpq_open");
    *(void **)&f->next = dlsym(dl, "rlpq_next");
    *(void **)&f->rows = dlsym(dl, "rlpq_rows");
    *(void **)&f->close = dlsym(dl, "rlpq_close");
    if (!f->abi || !f->open || !f->next || !f->rows || !f->close || f->abi() != RLPQ_ABI)
        return rl_errf(e, RL_EINPUT, "%s: not ringleader's Parquet reader of this version (rebuild: make parquet)", lib);
    return RL_OK;
}

static int shim_err(rl_err *e, int code, const char *where, const char *msg) {
    rl_errf(e, code, "%s: %s", where, *msg ? msg : "the Parquet reader failed without a message");
    rl_err_one_line(e);
    return code;
}

int rl_parquet_open(const char *lib, const char *path, const char *field, rl_parquet **out, rl_err *e) {
    *out = NULL;
    if (!field || !*field) return rl_errf(e, RL_EINPUT, "%s: no column name to read the text from", path);
    rl_parquet *p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path)) || !(p->field = strdup(field))) {
        if (p) free(p->path), free(p);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory", path);
    }
    p->row = -1;
    char msg[512] = "";
    int rc = load(lib, &p->f, e);
    if (!rc && !(p->h = p->f.open(path, field, msg, sizeof msg))) rc = shim_err(e, RL_EINPUT, path, msg);
    if (rc) {
        rl_parquet_close(p);
        return rc;
    }
    *out = p;
    return RL_OK;
}

int rl_parquet_next(rl_parquet *p, const char **text, size_t *len, rl_err *e) {
    *text = NULL, *len = 0;
    const char *s;
    size_t n;
    char msg[512] = "";
    int r = p->f.next(p->h, &s, &n, msg, sizeof msg);
    if (r == 0) return RL_OK;
    p->row++;
    if (r < 0) {
        char where[4200];
        snprintf(where, sizeof where, "%s: row %lld", p->path, p->row);
        return shim_err(e, RL_EINPUT, where, msg);
    }
    if (r == 2) return rl_errf(e, RL_EINPUT, "%s: row %lld: \"%.64s\" is null, not a string", p->path, p->row, p->field);
    *text = s, *len = n;
    return RL_OK;
}

long long rl_parquet_row(const rl_parquet *p) { return p->row; }
long long rl_parquet_rows(const rl_parquet *p) { return p->f.rows(p->h); }

void rl_parquet_close(rl_parquet *p) {
    if (!p) return;
    if (p->h) p->f.close(p->h);
    free(p->path), free(p->field);
    free(p);
}
