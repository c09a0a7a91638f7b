/* Reading one rank's slice of a checkpoint's moments (ckpt.h,
 * rl_ckpt_read_moments): the optimizer files' headers tell where each
 * range of the flat layout lies in them; only the bytes that overlap the
 * rank's ranges are read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

typedef struct segs {
    rl_ckpt_run *v;
    size_t n, cap;
} segs;

static int seg_add(segs *s, rl_ckpt_run x, rl_err *e) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        rl_ckpt_run *p = realloc(s->v, cap * sizeof *p);
        if (!p) return rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
        s->v = p, s->cap = cap;
    }
    s->v[s->n++] = x;
    return RL_OK;
}

int rl_ckpt_shard_runs(const rl_ckpt_st *st, const void *ranges, size_t ranges_bytes, size_t n, const char *where,
                       rl_ckpt_run **runs, size_t *nruns, rl_err *e) {
    const rl_ckpt_st_tensor *m = rl_ckpt_st_find(st, "exp_avg"), *v = rl_ckpt_st_find(st, "exp_avg_sq"),
                            *r = rl_ckpt_st_find(st, "ranges");
    *runs = NULL, *nruns = 0;
    if (!m || !v || !r || strcmp(m->dtype, "F32") || strcmp(v->dtype, "F32") || strcmp(r->dtype, "I64") ||
        m->ndim != 1 || v->ndim != 1 || v->shape[0] != m->shape[0] || r->ndim != 2 || r->shape[1] != 2 ||
        ranges_bytes != r->end - r->begin)
        return rl_errf(e, RL_EINPUT, "%s: want exp_avg and exp_avg_sq (F32 [k]) and ranges (I64 [r, 2])", where);
    segs out = {0};
    uint64_t k = (uint64_t)m->shape[0], at = 0;
    int rc = RL_OK;
    for (size_t i = 0; !rc && i < ranges_bytes / 16; i++) {
        int64_t off, cnt;
        memcpy(&off, (const char *)ranges + 16 * i, 8);
        memcpy(&cnt, (const char *)ranges + 16 * i + 8, 8);
        if (off < 0 || cnt < 0 || (uint64_t)off > n || (uint64_t)cnt > n - (uint64_t)off || (uint64_t)cnt > k - at) {
            rc = rl_errf(e, RL_EINPUT, "%s: range %zu (offset %lld, %lld elements) is outside the model's %zu or "
                         "the shard's %llu", where, i, (long long)off, (long long)cnt, n, (unsigned long long)k);
            break;
        }
        rc = seg_add(&out, (rl_ckpt_run){.off = (size_t)off, .len = (size_t)cnt,
                                         .m_at = st->data_start + m->begin + at * sizeof(float),
                                         .v_at = st->data_start + v->begin + at * sizeof(float)}, e);
        at += (uint64_t)cnt;
    }
    if (!rc && at != k)
        rc = rl_errf(e, RL_EINPUT, "%s: ranges cover %llu elements, the moments hold %llu", where,
                     (unsigned long long)at, (unsigned long long)k);
    if (rc) free(out.v);
    else *runs = out.v, *nruns = out.n;
    return rc;
}

/* The header of key (file_size bytes): its first 8 bytes say how long */
static int read_header(rl_ckpt_store *s, const char *key, const char *where, uint64_t file_size, int max_tensors,
                       rl_ckpt_st **st, rl_err *e) {
    void *b;
    size_t bl;
    int rc = rl_ckpt_get(s, key, 0, 8, &b, &bl, e);
    if (rc) return rc;
    uint64_t hl = 0;
    for (int i = 0; i < 8 && bl == 8; i++) hl |= (uint64_t)((unsigned char *)b)[i] << (8 * i);
    free(b);
    if (bl != 8 || hl > RL_CKPT_ST_MAX_HEADER || hl + 8 > file_size)
        return rl_errf(e, RL_EINPUT, "%s: header length out of range", where);
    if ((rc = rl_ckpt_get(s, key, 0, 8 + hl, &b, &bl, e))) return rc;
    rc = rl_ckpt_st_parse(b, bl, file_size, max_tensors, where, st, e);
    free(b);
    return rc;
}

/* A shard file's runs, from its header and its "ranges" tensor */
static int shard_segs(rl_ckpt_store *s, const char *key, const char *where, uint64_t size, size_t n, segs *out,
                      rl_err *e) {
    rl_ckpt_st *st;
    int rc = read_header(s, key, where, size, 3, &st, e);
    if (rc) return rc;
    const rl_ckpt_st_tensor *r = rl_ckpt_st_find(st, "ranges");
    void *rg = NULL;
    size_t rl = 0;
    if (r) rc = rl_ckpt_get(s, key, st->data_start + r->begin, r->end - r->begin, &rg, &rl, e);
    if (!rc && !(rc = rl_ckpt_shard_runs(st, rg, rl, n, where, &out->v, &out->n, e))) out->cap = out->n;
    free(rg);
    rl_ckpt_st_free(st);
    return rc;
}

/* optimizer.safetensors' runs: one per model tensor */
static int whole_segs(rl_ckpt_store *s, const char *key, const char *where, uint64_t size, const rl_model_config *c,
                      segs *out, rl_err *e) {
    rl_ckpt_st *st;
    int nt = rl_model_n_tensors(c);
    int rc = read_header(s, key, where, size, 3 * nt, &st, e);
    for (int i = 0; !rc && i < nt; i++) {
        rl_tensor_info ti;
        rl_model_tensor(c, i, &ti);
        char nm[2][RL_CKPT_ST_MAX_NAME + 1];
        snprintf(nm[0], sizeof nm[0], "exp_avg.%s", ti.name);
        snprintf(nm[1], sizeof nm[1], "exp_avg_sq.%s", ti.name);
        const rl_ckpt_st_tensor *m = rl_ckpt_st_find(st, nm[0]), *v = rl_ckpt_st_find(st, nm[1]);
        if (!m || !v || m->end - m->begin != ti.numel * 4 || v->end - v->begin != ti.numel * 4)
            rc = rl_errf(e, RL_EINPUT, "%s: %s does not match the model", where, ti.name);
        else
            rc = seg_add(out, (rl_ckpt_run){.off = ti.offset, .len = ti.numel, .m_at = st->data_start + m->begin,
                                    .v_at = st->data_start + v->begin}, e);
    }
    if (st) rl_ckpt_st_free(st);
    return rc;
}

/* bytes [at, at + len) of key into dst */
static int read_into(rl_ckpt_store *s, const char *key, uint64_t at, size_t len, void *dst, rl_err *e) {
    void *b;
    size_t bl;
    int rc = rl_ckpt_get(s, key, at, len, &b, &bl, e);
    if (rc) return rc;
    if (bl != len) rc = rl_errf(e, RL_EINPUT, "%s: %zu bytes at %llu, %zu read (truncated)", key, len,
                                (unsigned long long)at, bl);
    else memcpy(dst, b, len);
    free(b);
    return rc;
}

/* The file's runs overlapping the wanted ranges, read into m and v (each
 * wanted element's position: its range's base plus its offset in it) */
static int read_overlaps(rl_ckpt_store *s, const char *key, const segs *sg, const rl_shard_range *r, int nr,
                         float *m, float *v, rl_err *e) {
    int rc = RL_OK;
    for (size_t i = 0; !rc && i < sg->n; i++) {
        const rl_ckpt_run *x = &sg->v[i];
        size_t base = 0;
        for (int k = 0; !rc && k < nr; base += r[k].len, k++) {
            size_t lo = x->off > r[k].off ? x->off : r[k].off;
            size_t hi = x->off + x->len < r[k].off + r[k].len ? x->off + x->len : r[k].off + r[k].len;
            if (lo >= hi) continue;
            size_t dst = base + (lo - r[k].off), bytes = (hi - lo) * sizeof(float);
            uint64_t skip = (uint64_t)(lo - x->off) * sizeof(float);
            if (!(rc = read_into(s, key, x->m_at + skip, bytes, m + dst, e)))
                rc = read_into(s, key, x->v_at + skip, bytes, v + dst, e);
        }
    }
    return rc;
}

int rl_ckpt_read_moments(rl_ckpt_store *s, long long step, const rl_model_config *want, size_t n,
                         const rl_shard_range *ranges, int nranges, float *m, float *v, rl_err *e) {
    char dir[32], key[128], where[RL_CKPT_URI_MAX + 160];
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    char *mt;
    size_t ml;
    rl_ckpt_manifest man;
    int rc = rl_ckpt_get(s, key, 0, RL_CKPT_MANIFEST_MAX_BYTES, (void **)&mt, &ml, e);
    if (rc) return rc;
    snprintf(where, sizeof where, "%s/%s", s->uri, key);
    rc = rl_ckpt_manifest_parse(mt, ml, where, &man, e);
    free(mt);
    /* every optimizer file the manifest lists: optimizer.safetensors or the shards */
    for (int i = 0; !rc && i < man.nfiles; i++) {
        const char *f = man.files[i].name;
        bool whole = !strcmp(f, "optimizer.safetensors");
        if (!whole && strncmp(f, "optimizer-", 10)) continue; /* a manifest lists shards, never receipts */
        snprintf(key, sizeof key, "%s/%s", dir, f);
        snprintf(where, sizeof where, "%s/%s", s->uri, key);
        segs sg = {0};
        rc = whole ? whole_segs(s, key, where, man.files[i].size, want, &sg, e)
                   : shard_segs(s, key, where, man.files[i].size, n, &sg, e);
        if (!rc) rc = read_overlaps(s, key, &sg, ranges, nranges, m, v, e);
        free(sg.v);
    }
    rl_ckpt_manifest_free(&man);
    return rc;
}
