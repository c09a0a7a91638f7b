/* Writing a checkpoint (files, manifest, latest, pruning) and choosing and
 * verifying the one to resume from. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

static const char *const opt_prefix[3] = {"master.", "exp_avg.", "exp_avg_sq."};

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int rl_ckpt_steps(rl_ckpt_store *s, long long **committed, int *nc, long long **uncommitted,
                  int *nu, rl_err *e) {
    rl_ckpt_list l;
    int rc = rl_ckpt_list_keys(s, "step-", &l, e);
    if (rc) return rc;
    long long *all = calloc(l.n + 1, sizeof *all);
    bool *man = calloc(l.n + 1, sizeof *man);
    int na = 0;
    if (!all || !man) {
        free(all), free(man);
        rl_ckpt_list_free(&l);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory listing", s->uri);
    }
    for (size_t i = 0; i < l.n; i++) {
        const char *k = l.keys[i], *slash = strchr(k, '/');
        if (!slash) continue;
        long long st = rl_ckpt_parse_step_name(k, (size_t)(slash - k));
        if (st < 0) continue;
        int j = 0;
        while (j < na && all[j] != st) j++;
        if (j == na) all[na++] = st;
        if (!strcmp(slash + 1, "manifest.json")) man[j] = true;
    }
    rl_ckpt_list_free(&l);
    long long *c = calloc((size_t)na + 1, sizeof *c), *u = calloc((size_t)na + 1, sizeof *u);
    int ncc = 0, nuu = 0;
    if (!c || !u) {
        free(all), free(man), free(c), free(u);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory listing", s->uri);
    }
    for (int j = 0; j < na; j++) {
        if (man[j]) c[ncc++] = all[j];
        else u[nuu++] = all[j];
    }
    free(all), free(man);
    qsort(c, (size_t)ncc, sizeof *c, cmp_ll);
    qsort(u, (size_t)nuu, sizeof *u, cmp_ll);
    *committed = c, *nc = ncc;
    if (uncommitted) *uncommitted = u, *nu = nuu;
    else free(u);
    return RL_OK;
}

/* Manifest first: a crash half-way leaves a directory that is not a
 * checkpoint, never a "committed" one with files missing. */
static int delete_step(rl_ckpt_store *s, long long step, rl_err *e) {
    char dir[32], key[96];
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    int rc = rl_ckpt_del(s, key, e);
    if (rc) return rc;
    snprintf(key, sizeof key, "%s/", dir);
    rl_ckpt_list l;
    if ((rc = rl_ckpt_list_keys(s, key, &l, e))) return rc;
    for (size_t i = 0; i < l.n && !rc; i++) rc = rl_ckpt_del(s, l.keys[i], e);
    rl_ckpt_list_free(&l);
    return rc;
}

static int prune(rl_ckpt_store *s, long long step, int keep, int *pruned, rl_err *e) {
    long long *c, *u;
    int nc, nu, rc = rl_ckpt_steps(s, &c, &nc, &u, &nu, e);
    if (rc) return rc;
    int kept = 0;
    for (int i = nc - 1; i >= 0 && !rc; i--) {
        const char *why = NULL;
        if (c[i] > step) why = "newer than the step just committed: left by a run this one resumed "
                               "before, and skipped at resume because it did not verify";
        else if (c[i] == step || kept < keep) kept++;
        else why = "keep";
        if (!why) continue;
        char name[32];
        rl_ckpt_step_name(name, sizeof name, c[i]);
        rl_log(RL_LOG_INFO, "checkpoint_prune", "\"step\":%lld,\"dir\":\"%s\",\"why\":\"%s\"", c[i], name,
               why);
        if (!(rc = delete_step(s, c[i], e))) (*pruned)++;
    }
    for (int i = 0; i < nu && !rc; i++) {
        if (u[i] == step) continue;
        rl_log(RL_LOG_INFO, "checkpoint_prune",
               "\"step\":%lld,\"why\":\"no manifest (a save that never finished)\"", u[i]);
        rc = delete_step(s, u[i], e);
    }
    free(c), free(u);
    return rc;
}

static int put_file(rl_ckpt_store *s, const char *dir, rl_ckpt_manifest *m, const char *fname,
                    const rl_ckpt_part *parts, int np, uint64_t *bytes, rl_err *e) {
    char key[96];
    snprintf(key, sizeof key, "%s/%s", dir, fname);
    int i = m->nfiles++;
    snprintf(m->files[i].name, sizeof m->files[i].name, "%s", fname);
    m->files[i].size = 0;
    for (int k = 0; k < np; k++) m->files[i].size += parts[k].len;
    rl_ckpt_sha256_hex(parts, np, m->files[i].sha256);
    *bytes += m->files[i].size;
    return rl_ckpt_put(s, key, parts, np, e);
}

static int past(double deadline, const char *what, long long step, rl_err *e) {
    if (deadline > 0 && rl_now() > deadline)
        return rl_errf(e, RL_ETIMEOUT,
                       "checkpoint step %lld: out of time before %s; abandoned without a manifest "
                       "(not committed, never resumed from)",
                       step, what);
    return RL_OK;
}

/* A store error alone names an object (".../optimizer.safetensors: 403
 * QuotaExceeded"); say what it means for the run. Nothing older is ever
 * touched before the commit (pruning follows it), so a full or read-only
 * store costs this checkpoint only. */
static int write_failed(rl_err *e, int rc, long long step, bool committed) {
    /* past() says it already; out of memory or a bug is not the store's */
    if (!rc || rc == RL_ENOMEM || rc == RL_EINTERNAL || (e && !strncmp(e->msg, "checkpoint step ", 16))) return rc;
    if (committed)
        rl_err_wrap(e, "checkpoint step %lld committed, but latest not updated (a resume still takes the "
                    "newest manifest)", step);
    else
        rl_err_wrap(e, "checkpoint step %lld not committed, older checkpoints untouched", step);
    return rc;
}

int rl_ckpt_write(rl_ckpt_store *s, const rl_ckpt_data *d, const rl_ckpt_write_opts *o,
                  rl_ckpt_write_info *info, rl_err *e) {
    double t0 = rl_now();
    long long step = d->state.step;
    char dir[32], key[96];
    rl_ckpt_step_name(dir, sizeof dir, step);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &d->model);
    if (lay.total != d->n)
        return rl_errf(e, RL_EINTERNAL, "checkpoint: %zu parameters given, the model has %zu", d->n, lay.total);
    /* A directory already here is stale (an unfinished save, or a damaged
     * checkpoint of an abandoned run): start clean. */
    snprintf(key, sizeof key, "%s/", dir);
    rl_ckpt_list l;
    int rc = rl_ckpt_list_keys(s, key, &l, e);
    if (rc) return write_failed(e, rc, step, false);
    size_t stale = l.n;
    rl_ckpt_list_free(&l);
    if (stale) {
        rl_log(RL_LOG_WARN, "checkpoint_replace", "\"step\":%lld,\"objects\":%zu", step, stale);
        if ((rc = delete_step(s, step, e))) return write_failed(e, rc, step, false);
    }

    int nt = rl_model_n_tensors(&d->model);
    rl_ckpt_st_entry *ent = calloc((size_t)nt * 3, sizeof *ent);
    rl_ckpt_part *parts = calloc((size_t)nt * 3 + 1, sizeof *parts);
    char (*names)[RL_CKPT_ST_MAX_NAME] = calloc((size_t)nt * 3, sizeof *names);
    char *hdr = NULL, *cfg = NULL, *state = NULL, *man = NULL;
    size_t hl;
    uint64_t bytes = 0;
    rl_ckpt_manifest m = {.version = RL_CKPT_FORMAT_VERSION, .step = step};
    bool committed = false;
    if (!ent || !parts || !names) {
        rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    char stepstr[24];
    snprintf(stepstr, sizeof stepstr, "%lld", step);
    /* model.safetensors: Hugging Face names and shapes, our buffer's order */
    for (int i = 0; i < nt; i++) {
        rl_tensor_info ti;
        rl_model_tensor(&d->model, i, &ti);
        ent[i] = (rl_ckpt_st_entry){.name = names[i], .dtype = "F32", .ndim = ti.ndim,
                                    .data = d->params + ti.offset, .bytes = ti.numel * sizeof(float)};
        snprintf(names[i], RL_CKPT_ST_MAX_NAME, "%s", ti.name);
        ent[i].shape[0] = ti.shape[0], ent[i].shape[1] = ti.shape[1];
    }
    const char *meta_model[] = {"format", "pt", "producer", "ringleader", "step", stepstr, NULL};
    if ((rc = rl_ckpt_st_header(ent, nt, meta_model, &hdr, &hl, e))) goto out;
    parts[0] = (rl_ckpt_part){hdr, hl};
    for (int i = 0; i < nt; i++) parts[i + 1] = (rl_ckpt_part){ent[i].data, ent[i].bytes};
    if ((rc = put_file(s, dir, &m, "model.safetensors", parts, nt + 1, &bytes, e)) ||
        (rc = past(o->deadline, "optimizer.safetensors", step, e)))
        goto out;
    free(hdr), hdr = NULL;

    /* optimizer.safetensors: per model tensor, its fp32 master copy and the
     * AdamW moments, under torch's state names */
    const float *src[3] = {d->params, d->m, d->v};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&d->model, i, &ti);
            rl_ckpt_st_entry *x = &ent[k * nt + i];
            snprintf(names[k * nt + i], RL_CKPT_ST_MAX_NAME, "%s%s", opt_prefix[k], ti.name);
            *x = (rl_ckpt_st_entry){.name = names[k * nt + i], .dtype = "F32", .ndim = ti.ndim,
                                    .data = src[k] + ti.offset, .bytes = ti.numel * sizeof(float)};
            x->shape[0] = ti.shape[0], x->shape[1] = ti.shape[1];
        }
    const char *meta_opt[] = {"format", "pt", "producer", "ringleader", "optimizer", "adamw",
                              "step", stepstr, NULL};
    if ((rc = rl_ckpt_st_header(ent, 3 * nt, meta_opt, &hdr, &hl, e))) goto out;
    parts[0] = (rl_ckpt_part){hdr, hl};
    for (int i = 0; i < 3 * nt; i++) parts[i + 1] = (rl_ckpt_part){ent[i].data, ent[i].bytes};
    if ((rc = put_file(s, dir, &m, "optimizer.safetensors", parts, 3 * nt + 1, &bytes, e)) ||
        (rc = past(o->deadline, "config.json", step, e)))
        goto out;

    cfg = rl_ckpt_hf_config_json(&d->model);
    state = rl_ckpt_state_json(&d->state, d->config_json);
    if (!cfg || !state) {
        rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    rl_ckpt_part pc = {cfg, strlen(cfg)}, ps = {state, strlen(state)};
    if ((rc = put_file(s, dir, &m, "config.json", &pc, 1, &bytes, e)) ||
        (rc = put_file(s, dir, &m, "trainer_state.json", &ps, 1, &bytes, e)) ||
        (rc = past(o->deadline, "manifest.json", step, e)))
        goto out;

    /* the commit */
    man = rl_ckpt_manifest_json(&m);
    if (!man) {
        rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    rl_ckpt_part pm = {man, strlen(man)};
    if ((rc = rl_ckpt_put(s, key, &pm, 1, e))) goto out;
    committed = true;
    char latest[40];
    int ll = snprintf(latest, sizeof latest, "%s\n", dir);
    rl_ckpt_part plt = {latest, (size_t)ll};
    if ((rc = rl_ckpt_put(s, "latest", &plt, 1, e))) goto out;
    int pruned = 0;
    /* a failed prune leaves extra checkpoints, never fewer: report, go on */
    rl_err pe = {0};
    if (prune(s, step, o->keep > 0 ? o->keep : 1, &pruned, &pe))
        rl_log_msg(RL_LOG_WARN, "checkpoint_prune_failed", pe.msg);
    if (info) *info = (rl_ckpt_write_info){.bytes = bytes, .seconds = rl_now() - t0, .pruned = pruned};
out:
    free(ent), free(parts), free(names), free(hdr), free(cfg), free(state), free(man);
    return write_failed(e, rc, step, committed);
}

/* ---- reading ---------------------------------------------------------------------------- */
void rl_ckpt_loaded_free(rl_ckpt_loaded *l) {
    free(l->config_json);
    l->config_json = NULL;
}

/* Every model tensor under `prefix` present with its shape, F32, nothing else. */
static int check_tensors(const rl_ckpt_st *st, const rl_model_config *c, int nprefix,
                         const char *const *prefixes, const char *where, rl_err *e) {
    int nt = rl_model_n_tensors(c);
    if (st->n != nt * nprefix)
        return rl_errf(e, RL_EINPUT, "%s: %d tensors, expected %d for this model", where, st->n, nt * nprefix);
    for (int k = 0; k < nprefix; k++)
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(c, i, &ti);
            char nm[RL_CKPT_ST_MAX_NAME + 1];
            snprintf(nm, sizeof nm, "%s%s", prefixes[k], ti.name);
            const rl_ckpt_st_tensor *t = rl_ckpt_st_find(st, nm);
            if (!t) return rl_errf(e, RL_EINPUT, "%s: tensor %s is missing", where, nm);
            if (strcmp(t->dtype, "F32") != 0)
                return rl_errf(e, RL_EINPUT, "%s: tensor %s is %s, expected F32", where, nm, t->dtype);
            bool ok = t->ndim == ti.ndim;
            for (int d = 0; ok && d < ti.ndim; d++) ok = t->shape[d] == ti.shape[d];
            if (!ok)
                return rl_errf(e, RL_EINPUT, "%s: tensor %s has shape [%lld%s%lld], expected [%lld%s%lld]",
                               where, nm, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                               t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)ti.shape[0],
                               ti.ndim > 1 ? ", " : "", ti.ndim > 1 ? (long long)ti.shape[1] : 0LL);
        }
    return RL_OK;
}

static const char *const required[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                                       "trainer_state.json"};

/* *fatal: the checkpoint is intact but cannot serve this job (model
 * mismatch) -- falling back would not help. */
static int read_step(rl_ckpt_store *s, long long step, const rl_model_config *want, size_t n, float *params,
                     float *mo, float *vo, rl_ckpt_loaded *out, bool *fatal, rl_err *e) {
    char dir[32], key[96], where[RL_CKPT_URI_MAX + 128];
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    snprintf(where, sizeof where, "%s/%s", s->uri, key);
    void *buf[4] = {0};
    size_t len[4] = {0};
    char *mt = NULL;
    size_t ml;
    rl_ckpt_manifest m;
    rl_ckpt_st *st = NULL;
    int rc = rl_ckpt_get(s, key, 0, 1 << 20, (void **)&mt, &ml, e);
    if (rc) return rc;
    rc = rl_ckpt_manifest_parse(mt, ml, where, &m, e);
    free(mt);
    if (rc) return rc;
    if (m.step != step) return rl_errf(e, RL_EINPUT, "%s: says step %lld", where, m.step);
    int idx[4];
    for (int r = 0; r < 4; r++) {
        idx[r] = -1;
        for (int i = 0; i < m.nfiles; i++)
            if (!strcmp(m.files[i].name, required[r])) idx[r] = i;
        if (idx[r] < 0) return rl_errf(e, RL_EINPUT, "%s: does not list %s", where, required[r]);
    }
    /* every file the manifest lists: size first (cheap), then the hash */
    for (int i = 0; i < m.nfiles && !rc; i++) {
        snprintf(key, sizeof key, "%s/%s", dir, m.files[i].name);
        snprintf(where, sizeof where, "%s/%s", s->uri, key);
        bool found;
        uint64_t size;
        if ((rc = rl_ckpt_exists(s, key, &found, &size, e))) break;
        if (!found) {
            rc = rl_errf(e, RL_EINPUT, "%s: missing (listed in the manifest)", where);
            break;
        }
        if (size != m.files[i].size) {
            rc = rl_errf(e, RL_EINPUT, "%s: %llu bytes, the manifest says %llu (%s)", where,
                         (unsigned long long)size, (unsigned long long)m.files[i].size,
                         size < m.files[i].size ? "truncated" : "grown");
            break;
        }
        void *data;
        size_t dl;
        if ((rc = rl_ckpt_get(s, key, 0, UINT64_MAX, &data, &dl, e))) break;
        char h[65];
        rl_ckpt_part p = {data, dl};
        rl_ckpt_sha256_hex(&p, 1, h);
        if (dl != m.files[i].size || strcmp(h, m.files[i].sha256) != 0) {
            free(data);
            rc = rl_errf(e, RL_EINPUT, "%s: sha256 %.12s... does not match the manifest's %.12s... (damaged)",
                         where, h, m.files[i].sha256);
            break;
        }
        int r = 0;
        while (r < 4 && idx[r] != i) r++;
        if (r < 4) buf[r] = data, len[r] = dl;
        else free(data);
    }
    if (rc) goto out;
    /* config.json: the job's model or nothing */
    snprintf(where, sizeof where, "%s/%s/config.json", s->uri, dir);
    if ((rc = rl_ckpt_hf_config_check(buf[2], len[2], where, want, e))) {
        *fatal = true;
        goto out;
    }
    snprintf(where, sizeof where, "%s/%s/trainer_state.json", s->uri, dir);
    if ((rc = rl_ckpt_state_parse(buf[3], len[3], where, &out->state, e))) goto out;
    if (out->state.step != step) {
        rc = rl_errf(e, RL_EINPUT, "%s: step %lld, directory says %lld", where, out->state.step, step);
        goto out;
    }
    snprintf(where, sizeof where, "%s/%s/model.safetensors", s->uri, dir);
    static const char *const none[] = {""};
    int nt = rl_model_n_tensors(want);
    if ((rc = rl_ckpt_st_parse(buf[0], len[0], len[0], nt, where, &st, e)) ||
        (rc = check_tensors(st, want, 1, none, where, e)))
        goto out;
    rl_ckpt_st_free(st), st = NULL;
    snprintf(where, sizeof where, "%s/%s/optimizer.safetensors", s->uri, dir);
    if ((rc = rl_ckpt_st_parse(buf[1], len[1], len[1], 3 * nt, where, &st, e)) ||
        (rc = check_tensors(st, want, 3, opt_prefix, where, e)))
        goto out;
    rl_param_layout lay;
    rl_param_layout_init(&lay, want);
    if (lay.total != n) {
        rc = rl_errf(e, RL_EINTERNAL, "checkpoint: buffer of %zu floats for a model of %zu", n, lay.total);
        goto out;
    }
    float *dst[3] = {params, mo, vo};
    for (int k = 0; k < 3; k++) {
        if (!dst[k]) continue;
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(want, i, &ti);
            char nm[RL_CKPT_ST_MAX_NAME + 1];
            snprintf(nm, sizeof nm, "%s%s", opt_prefix[k], ti.name);
            const rl_ckpt_st_tensor *t = rl_ckpt_st_find(st, nm);
            memcpy(dst[k] + ti.offset, (const char *)buf[1] + st->data_start + t->begin, ti.numel * sizeof(float));
        }
    }
    /* keep the job config the checkpoint was written with, for comparisons */
    free(out->config_json);
    out->config_json = NULL;
    cJSON *sj = cJSON_ParseWithLength(buf[3], len[3]);
    const cJSON *cj = cJSON_GetObjectItemCaseSensitive(sj, "config");
    if (cJSON_IsObject(cj)) out->config_json = cJSON_PrintUnformatted(cj);
    cJSON_Delete(sj);
    out->found = true;
    out->step = step;
out:
    rl_ckpt_st_free(st);
    for (int r = 0; r < 4; r++) free(buf[r]);
    return rc;
}

int rl_ckpt_read_step(rl_ckpt_store *s, long long step, const rl_model_config *want, size_t n,
                      float *params, float *m, float *v, rl_ckpt_loaded *out, rl_err *e) {
    bool fatal = false;
    return read_step(s, step, want, n, params, m, v, out, &fatal, e);
}

int rl_ckpt_load_latest(rl_ckpt_store *s, const rl_model_config *want, size_t n, float *params,
                        float *m, float *v, rl_ckpt_loaded *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    bool has_latest;
    uint64_t lsize;
    long long latest = -1;
    char note[RL_CKPT_URI_MAX + 200] = "";
    int rc = rl_ckpt_exists(s, "latest", &has_latest, &lsize, e);
    if (rc) return rc;
    if (has_latest) {
        char *t;
        size_t tl;
        if ((rc = rl_ckpt_get(s, "latest", 0, 64, (void **)&t, &tl, e))) return rc;
        while (tl > 0 && (t[tl - 1] == '\n' || t[tl - 1] == ' ' || t[tl - 1] == '\r')) tl--;
        latest = rl_ckpt_parse_step_name(t, tl);
        free(t);
        if (latest < 0) snprintf(note, sizeof note, "%s/latest does not name a step (step-NNNNNNNN)", s->uri);
    }
    long long *c;
    int nc;
    if ((rc = rl_ckpt_steps(s, &c, &nc, NULL, NULL, e))) return rc;
    bool latest_committed = false;
    for (int i = 0; i < nc; i++) latest_committed |= c[i] == latest;
    if (latest >= 0 && !latest_committed)
        snprintf(note, sizeof note, "%s/latest names step-%08lld, which has no manifest (a save that never "
                 "finished, or deleted)", s->uri, latest);
    if (note[0]) {
        snprintf(out->skipped[out->n_skipped++], sizeof out->skipped[0], "%.500s", note);
        rl_log_msg(RL_LOG_WARN, "checkpoint_skipped", note);
    }
    if (latest >= 0 && nc > 0 && c[nc - 1] > latest)
        rl_log(RL_LOG_WARN, "checkpoint_newer_than_latest",
               "\"latest\":%lld,\"newest_committed\":%lld,\"msg\":\"a manifest was written but latest was "
               "not updated (interrupted?): trying the newest first\"", latest, c[nc - 1]);
    char first_err[512] = "";
    for (int i = nc - 1; i >= 0; i--) {
        bool fatal = false;
        rl_err le = {0};
        rc = read_step(s, c[i], want, n, params, m, v, out, &fatal, &le);
        if (!rc) break;
        if (fatal || rc == RL_ENOMEM || rc == RL_EINTERNAL) {
            free(c);
            if (e) *e = le;
            return rc;
        }
        if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", le.msg);
        rl_log_msg(RL_LOG_WARN, "checkpoint_skipped", le.msg);
        if (out->n_skipped < 4) snprintf(out->skipped[out->n_skipped++], sizeof out->skipped[0], "%.500s", le.msg);
    }
    free(c);
    if (out->found) {
        if (out->n_skipped > 0) {
            char from[32] = "none";
            if (latest >= 0) rl_ckpt_step_name(from, sizeof from, latest);
            char why[700];
            rl_log(RL_LOG_WARN, "checkpoint_fallback", "\"latest\":\"%s\",\"resumed_step\":%lld,\"skipped\":%d,\"why\":\"%s\"",
                   from, out->step, out->n_skipped, rl_json_escape(why, sizeof why, out->skipped[0]));
        }
        return RL_OK;
    }
    if (nc == 0 && !has_latest) return RL_OK; /* nothing here: a fresh start */
    rl_ckpt_loaded_free(out);
    return rl_errf(e, RL_EINPUT, "no usable checkpoint under %s (refusing to start from scratch over it): %s",
                   s->uri, first_err[0] ? first_err : note[0] ? note : "?");
}
