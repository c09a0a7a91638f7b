/* Documents of a record file (data.h): JSON Lines or Parquet behind one
 * loop, so ringleader-prepare reads both the same way. */
#include "data/data.h"

#include <stdlib.h>
#include <string.h>

struct rl_docs {
    rl_jsonl *j;
    rl_parquet *p;
};

int rl_docs_open(rl_docs_format f, const char *path, const char *field, const char *parquet_lib, rl_docs **out,
                 rl_err *e) {
    *out = NULL;
    rl_docs *d = calloc(1, sizeof *d);
    if (!d) return rl_errf(e, RL_ENOMEM, "%s: out of memory", path);
    int rc = f == RL_DOCS_PARQUET ? rl_parquet_open(parquet_lib, path, field, &d->p, e)
                                  : rl_jsonl_open(path, field, 0, &d->j, e);
    if (rc) free(d);
    else *out = d;
    return rc;
}

int rl_docs_next(rl_docs *d, const char **text, size_t *len, rl_err *e) {
    return d->p ? rl_parquet_next(d->p, text, len, e) : rl_jsonl_next(d->j, text, len, e);
}

uint64_t rl_docs_done(const rl_docs *d, uint64_t size) {
    if (d->j) return (uint64_t)rl_jsonl_offset(d->j);
    long long rows = rl_parquet_rows(d->p), row = rl_parquet_row(d->p) + 1;
    return rows > 0 ? (uint64_t)((double)size * (double)row / (double)rows) : size;
}

void rl_docs_close(rl_docs *d) {
    if (!d) return;
    rl_jsonl_close(d->j);
    rl_parquet_close(d->p);
    free(d);
}
