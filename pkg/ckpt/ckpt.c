/* Writing a checkpoint (files, manifest, latest, pruning) and choosing and
 * verifying the one to resume from. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_internal.h"

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
 * checkpoint, never a "committed" one with files missing. spare (NULL:
 * none) names objects to leave, with the uploads in flight: the shards
 * other ranks are writing into this step now. */
static int delete_step(rl_ckpt_store *s, long long step, const char *spare, rl_err *e) {
    char dir[32], key[96];
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    int rc = rl_ckpt_del(s, key, e);
    if (rc) return rc;
    snprintf(key, sizeof key, "%s/", dir);
    rl_ckpt_list l;
    if ((rc = rl_ckpt_list_keys(s, key, &l, e))) return rc;
    for (size_t i = 0; i < l.n && !rc; i++)
        if (!spare || !strstr(l.keys[i], spare)) rc = rl_ckpt_del(s, l.keys[i], e);
    rl_ckpt_list_free(&l);
    /* and what a writer killed mid-object left half-uploaded there */
    return rc || spare ? rc : rl_ckpt_abort_uploads(s, key, e);
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
        if (!(rc = delete_step(s, c[i], NULL, e))) (*pruned)++;
    }
    /* only older ones: a newer directory without a manifest may be a save
     * in flight (with sharded state the other ranks write theirs while
     * rank 0 still commits this one) */
    for (int i = 0; i < nu && !rc; i++) {
        if (u[i] >= step) continue;
        rl_log(RL_LOG_INFO, "checkpoint_prune",
               "\"step\":%lld,\"why\":\"no manifest (a save that never finished)\"", u[i]);
        rc = delete_step(s, u[i], NULL, e);
    }
    free(c), free(u);
    return rc;
}

static int put_file(rl_ckpt_store *s, const char *dir, rl_ckpt_manifest *m, const char *fname,
                    const rl_ckpt_part *parts, int np, uint64_t *bytes, rl_err *e) {
    char key[128];
    snprintf(key, sizeof key, "%s/%s", dir, fname);
    int rc = rl_ckpt_manifest_add(m, fname, parts, np, e);
    if (rc) return rc;
    *bytes += m->files[m->nfiles - 1].size;
    return rl_ckpt_put(s, key, parts, np, e);
}

static int put_tokenizer(rl_ckpt_store *s, const char *dir, rl_ckpt_manifest *m, const rl_ckpt_tokenizer *tok,
                         int max_len, uint64_t *bytes, rl_err *e) {
    char *tc = rl_ckpt_tokenizer_config_json(tok, max_len), *st = rl_ckpt_special_tokens_json(tok);
    rl_ckpt_part pj = {tok->json, tok->len}, pc = {tc, tc ? strlen(tc) : 0}, ps = {st, st ? strlen(st) : 0};
    int rc = !tc || !st ? rl_errf(e, RL_ENOMEM, "checkpoint: out of memory") : RL_OK;
    if (!rc && !(rc = put_file(s, dir, m, "tokenizer.json", &pj, 1, bytes, e)) &&
        !(rc = put_file(s, dir, m, "tokenizer_config.json", &pc, 1, bytes, e)))
        rc = put_file(s, dir, m, "special_tokens_map.json", &ps, 1, bytes, e);
    free(tc), free(st);
    return rc;
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

void rl_ckpt_shard_name(char *dst, size_t n, int rank, int world, bool receipt) {
    snprintf(dst, n, "optimizer-%05d-of-%05d.%s", rank, world, receipt ? "receipt.json" : "safetensors");
}

/* A directory already here is stale (an unfinished save, or a damaged
 * checkpoint of an abandoned run): start clean -- but for the shards of
 * this world, which the other ranks may be writing right now (their
 * receipts carry the save's nonce, so an old one is never taken). */
static int clear_stale(rl_ckpt_store *s, const char *dir, long long step, int world, rl_err *e) {
    char key[64], mine[32];
    snprintf(key, sizeof key, "%s/", dir);
    snprintf(mine, sizeof mine, "-of-%05d.", world);
    const char *spare = world > 0 ? mine : NULL;
    rl_ckpt_list l;
    int rc = rl_ckpt_list_keys(s, key, &l, e);
    if (rc) return rc;
    size_t stale = 0;
    for (size_t i = 0; i < l.n; i++) stale += !spare || !strstr(l.keys[i], spare);
    rl_ckpt_list_free(&l);
    if (!stale) return RL_OK;
    rl_log(RL_LOG_WARN, "checkpoint_replace", "\"step\":%lld,\"objects\":%zu", step, stale);
    return delete_step(s, step, spare, e);
}

/* model.safetensors: Hugging Face names and shapes, our buffer's order */
static int put_model(rl_ckpt_store *s, const char *dir, const rl_ckpt_data *d, const char *stepstr,
                     rl_ckpt_manifest *m, uint64_t *bytes, rl_err *e) {
    int nt = rl_model_n_tensors(&d->model);
    rl_ckpt_st_entry *ent = calloc((size_t)nt, sizeof *ent);
    rl_ckpt_part *parts = calloc((size_t)nt + 1, sizeof *parts);
    char(*names)[RL_CKPT_ST_MAX_NAME] = calloc((size_t)nt, sizeof *names);
    char *hdr = NULL;
    size_t hl;
    int rc = ent && parts && names ? RL_OK : rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; !rc && i < nt; i++) {
        rl_tensor_info ti;
        rl_model_tensor(&d->model, i, &ti);
        ent[i] = (rl_ckpt_st_entry){.name = names[i], .dtype = "F32", .ndim = ti.ndim,
                                    .data = d->params + ti.offset, .bytes = ti.numel * sizeof(float)};
        snprintf(names[i], RL_CKPT_ST_MAX_NAME, "%s", ti.name);
        ent[i].shape[0] = ti.shape[0], ent[i].shape[1] = ti.shape[1];
    }
    const char *meta[] = {"format", "pt", "producer", "ringleader", "step", stepstr, NULL};
    if (!rc && !(rc = rl_ckpt_st_header(ent, nt, meta, &hdr, &hl, e))) {
        parts[0] = (rl_ckpt_part){hdr, hl};
        for (int i = 0; i < nt; i++) parts[i + 1] = (rl_ckpt_part){ent[i].data, ent[i].bytes};
        rc = put_file(s, dir, m, "model.safetensors", parts, nt + 1, bytes, e);
    }
    free(ent), free(parts), free(names), free(hdr);
    return rc;
}

/* optimizer.safetensors: per model tensor, its fp32 master copy and the
 * AdamW moments, under torch's state names */
static int put_optimizer(rl_ckpt_store *s, const char *dir, const rl_ckpt_data *d, const char *stepstr,
                         rl_ckpt_manifest *m, uint64_t *bytes, rl_err *e) {
    int nt = rl_model_n_tensors(&d->model);
    rl_ckpt_st_entry *ent = calloc((size_t)nt * 3, sizeof *ent);
    rl_ckpt_part *parts = calloc((size_t)nt * 3 + 1, sizeof *parts);
    char(*names)[RL_CKPT_ST_MAX_NAME] = calloc((size_t)nt * 3, sizeof *names);
    char *hdr = NULL;
    size_t hl;
    int rc = ent && parts && names ? RL_OK : rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    const float *src[3] = {d->params, d->m, d->v};
    for (int k = 0; !rc && k < 3; k++)
        for (int i = 0; i < nt; i++) {
            rl_tensor_info ti;
            rl_model_tensor(&d->model, i, &ti);
            rl_ckpt_st_entry *x = &ent[k * nt + i];
            snprintf(names[k * nt + i], RL_CKPT_ST_MAX_NAME, "%s%s", opt_prefix[k], ti.name);
            *x = (rl_ckpt_st_entry){.name = names[k * nt + i], .dtype = "F32", .ndim = ti.ndim,
                                    .data = src[k] + ti.offset, .bytes = ti.numel * sizeof(float)};
            x->shape[0] = ti.shape[0], x->shape[1] = ti.shape[1];
        }
    const char *meta[] = {"format", "pt", "producer", "ringleader", "optimizer", "adamw", "step", stepstr, NULL};
    if (!rc && !(rc = rl_ckpt_st_header(ent, 3 * nt, meta, &hdr, &hl, e))) {
        parts[0] = (rl_ckpt_part){hdr, hl};
        for (int i = 0; i < 3 * nt; i++) parts[i + 1] = (rl_ckpt_part){ent[i].data, ent[i].bytes};
        rc = put_file(s, dir, m, "optimizer.safetensors", parts, 3 * nt + 1, bytes, e);
    }
    free(ent), free(parts), free(names), free(hdr);
    return rc;
}

/* This rank's optimizer shard, then its receipt (the shard's manifest
 * entry and the save's nonce): the receipt exists only once the shard is
 * whole. */
static int put_shard(rl_ckpt_store *s, const char *dir, const rl_ckpt_data *d, const char *stepstr,
                     uint64_t *bytes, rl_err *e) {
    size_t k = (size_t)d->nranges, held = 0;
    for (size_t i = 0; i < k; i++) held += d->ranges[i].len;
    if (held != d->shard_total)
        return rl_errf(e, RL_EINTERNAL, "checkpoint: ranges of %zu elements for a shard of %zu", held, d->shard_total);
    int64_t *rg = malloc(2 * k * sizeof *rg + 1);
    if (!rg) return rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    for (size_t i = 0; i < k; i++) rg[2 * i] = (int64_t)d->ranges[i].off, rg[2 * i + 1] = (int64_t)d->ranges[i].len;
    size_t fb = d->shard_total * sizeof(float);
    rl_ckpt_st_entry ent[3] = {
        {.name = "exp_avg", .dtype = "F32", .ndim = 1, .shape = {(int64_t)d->shard_total}, .data = d->m, .bytes = fb},
        {.name = "exp_avg_sq", .dtype = "F32", .ndim = 1, .shape = {(int64_t)d->shard_total}, .data = d->v, .bytes = fb},
        {.name = "ranges", .dtype = "I64", .ndim = 2, .shape = {(int64_t)k, 2}, .data = rg, .bytes = 2 * k * sizeof *rg},
    };
    char rank[16], world[16], name[64], key[128];
    snprintf(rank, sizeof rank, "%d", d->shard_rank);
    snprintf(world, sizeof world, "%d", d->shard_world);
    const char *meta[] = {"format", "pt", "producer", "ringleader", "optimizer", "adamw", "step", stepstr,
                          "shard_rank", rank, "shard_world", world, NULL};
    char *hdr = NULL, *receipt = NULL;
    size_t hl;
    rl_ckpt_manifest r = {.version = RL_CKPT_FORMAT_VERSION, .step = d->state.step};
    snprintf(r.nonce, sizeof r.nonce, "%016llx", (unsigned long long)d->nonce);
    rl_ckpt_shard_name(name, sizeof name, d->shard_rank, d->shard_world, false);
    int rc = rl_ckpt_st_header(ent, 3, meta, &hdr, &hl, e);
    rl_ckpt_part parts[4] = {{hdr, hl}, {d->m, fb}, {d->v, fb}, {rg, ent[2].bytes}};
    if (!rc) rc = put_file(s, dir, &r, name, parts, 4, bytes, e);
    if (!rc && !(receipt = rl_ckpt_manifest_json(&r))) rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    if (!rc) {
        rl_ckpt_shard_name(name, sizeof name, d->shard_rank, d->shard_world, true);
        snprintf(key, sizeof key, "%s/%s", dir, name);
        rc = rl_ckpt_put(s, key, &(rl_ckpt_part){receipt, strlen(receipt)}, 1, e);
    }
    rl_ckpt_manifest_free(&r);
    free(rg), free(hdr), free(receipt);
    return rc;
}

/* rank's receipt of this save, if it is in: its one entry onto m */
static int take_receipt(rl_ckpt_store *s, const char *dir, const rl_ckpt_data *d, int rank, rl_ckpt_manifest *m,
                        bool *in, rl_err *e) {
    char name[64], rname[64], key[128], nonce[17];
    rl_ckpt_shard_name(name, sizeof name, rank, d->shard_world, false);
    rl_ckpt_shard_name(rname, sizeof rname, rank, d->shard_world, true);
    snprintf(key, sizeof key, "%s/%s", dir, rname);
    snprintf(nonce, sizeof nonce, "%016llx", (unsigned long long)d->nonce);
    bool found;
    uint64_t size;
    *in = false;
    int rc = rl_ckpt_exists(s, key, &found, &size, e);
    if (rc || !found || size > 65536) return rc;
    char *t;
    size_t tl;
    if ((rc = rl_ckpt_get(s, key, 0, 65536, (void **)&t, &tl, e))) return rc;
    rl_ckpt_manifest r;
    rl_err pe;
    /* another save's receipt (or none yet readable) is not this one's */
    if (!rl_ckpt_manifest_parse(t, tl, key, &r, &pe) && r.step == d->state.step && !strcmp(r.nonce, nonce) &&
        r.nfiles == 1 && !strcmp(r.files[0].name, name) && !(rc = rl_ckpt_manifest_put(m, &r.files[0], e)))
        *in = true;
    rl_ckpt_manifest_free(&r);
    free(t);
    return rc;
}

/* rank 0: every rank's receipt of this save, in rank order, onto m */
static int await_shards(rl_ckpt_store *s, const char *dir, const rl_ckpt_data *d, const rl_ckpt_write_opts *o,
                        rl_ckpt_manifest *m, rl_err *e) {
    double deadline = o->deadline > 0 ? o->deadline : rl_now() + (o->shard_wait_s > 0 ? o->shard_wait_s : 600);
    for (int r = 0; r < d->shard_world; r++) {
        bool in = false;
        for (double nap = 0.002; !in; nap = nap < 0.1 ? 2 * nap : nap) {
            int rc = take_receipt(s, dir, d, r, m, &in, e);
            if (rc) return rc;
            if (in) break;
            if (o->cancel && *o->cancel)
                return rl_errf(e, RL_EABORT, "checkpoint step %lld: given up waiting for rank %d's optimizer shard "
                               "(the round ended); not committed", d->state.step, r);
            if (rl_now() > deadline)
                return rl_errf(e, RL_ETIMEOUT, "checkpoint step %lld: rank %d's optimizer shard is not in by the "
                               "deadline (rank lost?); not committed", d->state.step, r);
            struct timespec ts = {0, (long)(nap * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    return RL_OK;
}

/* The commit: the manifest, then latest, then pruning. */
static int commit(rl_ckpt_store *s, const char *dir, long long step, const rl_ckpt_manifest *m, int keep,
                  bool *committed, int *pruned, rl_err *e) {
    char key[96], *man = rl_ckpt_manifest_json(m);
    if (!man) return rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    int rc = rl_ckpt_put(s, key, &(rl_ckpt_part){man, strlen(man)}, 1, e);
    free(man);
    if (rc) return rc;
    *committed = true;
    char latest[40];
    int ll = snprintf(latest, sizeof latest, "%s\n", dir);
    if ((rc = rl_ckpt_put(s, "latest", &(rl_ckpt_part){latest, (size_t)ll}, 1, e))) return rc;
    /* a failed prune leaves extra checkpoints, never fewer: report, go on */
    rl_err pe = {0};
    if (prune(s, step, keep > 0 ? keep : 1, pruned, &pe)) rl_log_msg(RL_LOG_WARN, "checkpoint_prune_failed", pe.msg);
    return RL_OK;
}

int rl_ckpt_write(rl_ckpt_store *s, const rl_ckpt_data *d, const rl_ckpt_write_opts *o,
                  rl_ckpt_write_info *info, rl_err *e) {
    double t0 = rl_now();
    long long step = d->state.step;
    char dir[32], stepstr[24];
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(stepstr, sizeof stepstr, "%lld", step);
    rl_param_layout lay;
    rl_param_layout_init(&lay, &d->model);
    if (lay.total != d->n)
        return rl_errf(e, RL_EINTERNAL, "checkpoint: %zu parameters given, the model has %zu", d->n, lay.total);
    bool sharded = d->shard_world > 0, committed = false;
    uint64_t bytes = 0;
    int rc, pruned = 0;
    /* a rank other than 0 writes its shard and is done: rank 0 commits */
    if (sharded && d->shard_rank != 0) {
        rc = put_shard(s, dir, d, stepstr, &bytes, e);
        if (!rc && info) *info = (rl_ckpt_write_info){.bytes = bytes, .seconds = rl_now() - t0};
        return write_failed(e, rc, step, false);
    }
    rl_ckpt_manifest m = {.version = RL_CKPT_FORMAT_VERSION, .step = step};
    char *cfg = NULL, *state = NULL;
    if ((rc = clear_stale(s, dir, step, d->shard_world, e)) || (rc = put_model(s, dir, d, stepstr, &m, &bytes, e)))
        goto out;
    if (sharded ? (rc = put_shard(s, dir, d, stepstr, &bytes, e)) : (rc = put_optimizer(s, dir, d, stepstr, &m, &bytes, e)))
        goto out;
    if ((rc = past(o->deadline, "config.json", step, e))) goto out;
    cfg = rl_ckpt_hf_config_json(&d->model, d->tok);
    state = rl_ckpt_state_json(&d->state, d->config_json);
    if (!cfg || !state) {
        rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    rl_ckpt_part pc = {cfg, strlen(cfg)}, ps = {state, strlen(state)};
    if ((rc = put_file(s, dir, &m, "config.json", &pc, 1, &bytes, e)) ||
        (rc = put_file(s, dir, &m, "trainer_state.json", &ps, 1, &bytes, e)) ||
        (d->tok && (rc = put_tokenizer(s, dir, &m, d->tok, d->model.max_position_embeddings, &bytes, e))) ||
        (sharded && (rc = await_shards(s, dir, d, o, &m, e))) || (rc = past(o->deadline, "manifest.json", step, e)))
        goto out;
    /* every shard of this save is whole now, so an upload still open here is
     * a dead writer's (a rank killed mid-shard in an earlier try of this
     * step, whose shards clear_stale spared): gone before the commit */
    char open_under[40];
    snprintf(open_under, sizeof open_under, "%s/", dir);
    if (sharded && (rc = rl_ckpt_abort_uploads(s, open_under, e))) goto out;
    if ((rc = commit(s, dir, step, &m, o->keep, &committed, &pruned, e))) goto out;
    if (info) *info = (rl_ckpt_write_info){.bytes = bytes, .seconds = rl_now() - t0, .pruned = pruned};
out:
    rl_ckpt_manifest_free(&m);
    free(cfg), free(state);
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

/* The optimizer shards a manifest lists: their world (0: none), each rank
 * 0..world-1 exactly once, nothing else named like one. */
static int shard_world(const rl_ckpt_manifest *m, const char *where, int *world, rl_err *e) {
    int count = 0, w = 0;
    *world = 0;
    for (int i = 0; i < m->nfiles; i++) {
        int r, fw, end = 0;
        if (strncmp(m->files[i].name, "optimizer-", 10)) continue;
        if (sscanf(m->files[i].name, "optimizer-%5d-of-%5d.safetensors%n", &r, &fw, &end) != 2 ||
            m->files[i].name[end] || fw < 1 || fw > RL_CKPT_MAX_SHARDS || r < 0 || r >= fw)
            return rl_errf(e, RL_EINPUT, "%s: %s is not an optimizer shard's name (optimizer-RRRRR-of-WWWWW.safetensors)",
                           where, m->files[i].name);
        char want[64];
        rl_ckpt_shard_name(want, sizeof want, r, fw, false);
        if (strcmp(want, m->files[i].name) || (w && fw != w))
            return rl_errf(e, RL_EINPUT, "%s: %s does not belong to the %d-shard set the manifest lists first", where,
                           m->files[i].name, w);
        w = fw, count++;
    }
    /* names are unique (the parser checked), so W distinct ranks below W are all of them */
    if (count != w)
        return rl_errf(e, RL_EINPUT, "%s: lists %d optimizer shards of a world of %d (shards missing from the "
                       "manifest)", where, count, w);
    *world = w;
    return RL_OK;
}

/* One verified shard file into the whole moments (mo, vo may be NULL),
 * marking what it covers. */
static int take_shard(const void *buf, size_t len, const char *where, size_t n, float *mo, float *vo,
                      unsigned char *covered, rl_err *e) {
    rl_ckpt_st *st;
    rl_ckpt_run *runs = NULL;
    size_t nr = 0;
    int rc = rl_ckpt_st_parse(buf, len, len, 3, where, &st, e);
    if (rc) return rc;
    const rl_ckpt_st_tensor *r = rl_ckpt_st_find(st, "ranges"); /* missing: shard_runs names it */
    rc = rl_ckpt_shard_runs(st, r ? (const char *)buf + st->data_start + r->begin : NULL, r ? r->end - r->begin : 0,
                            n, where, &runs, &nr, e);
    for (size_t i = 0; !rc && i < nr; i++) {
        const rl_ckpt_run *x = &runs[i];
        if (mo) memcpy(mo + x->off, (const char *)buf + x->m_at, x->len * sizeof(float));
        if (vo) memcpy(vo + x->off, (const char *)buf + x->v_at, x->len * sizeof(float));
        for (size_t k = x->off; k < x->off + x->len; k++) covered[k >> 3] |= (unsigned char)(1u << (k & 7));
    }
    free(runs);
    rl_ckpt_st_free(st);
    return rc;
}

/* Every model tensor under prefix (checked present) from a file into dst
 * (NULL: nothing). */
static void copy_tensors(const rl_model_config *c, const rl_ckpt_st *st, const void *file, const char *prefix,
                         float *dst) {
    for (int i = 0; dst && i < rl_model_n_tensors(c); i++) {
        rl_tensor_info ti;
        rl_model_tensor(c, i, &ti);
        char nm[RL_CKPT_ST_MAX_NAME + 1];
        snprintf(nm, sizeof nm, "%s%s", prefix, ti.name);
        const rl_ckpt_st_tensor *t = rl_ckpt_st_find(st, nm);
        memcpy(dst + ti.offset, (const char *)file + st->data_start + t->begin, ti.numel * sizeof(float));
    }
}

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
    rl_ckpt_manifest m = {0};
    rl_ckpt_st *st = NULL;
    unsigned char *covered = NULL;
    int world = 0, idx[4];
    rl_param_layout lay;
    rl_param_layout_init(&lay, want);
    /* another model's checkpoint is named by its config.json below; until
     * then the shards are only verified */
    bool fits = lay.total == n;
    int rc = rl_ckpt_get(s, key, 0, RL_CKPT_MANIFEST_MAX_BYTES, (void **)&mt, &ml, e);
    if (rc) return rc;
    rc = rl_ckpt_manifest_parse(mt, ml, where, &m, e);
    free(mt);
    if (!rc && m.step != step) rc = rl_errf(e, RL_EINPUT, "%s: says step %lld", where, m.step);
    if (!rc) rc = shard_world(&m, where, &world, e);
    /* the optimizer state is one file or the shards, not both */
    for (int r = 0; !rc && r < 4; r++) {
        idx[r] = -1;
        for (int i = 0; i < m.nfiles; i++)
            if (!strcmp(m.files[i].name, required[r])) idx[r] = i;
        if (r == 1 && world > 0 && idx[r] >= 0)
            rc = rl_errf(e, RL_EINPUT, "%s: lists optimizer.safetensors and %d optimizer shards", where, world);
        else if (idx[r] < 0 && !(r == 1 && world > 0))
            rc = rl_errf(e, RL_EINPUT, "%s: does not list %s", where, required[r]);
    }
    if (!rc && world > 0 && !(covered = calloc(n / 8 + 1, 1))) rc = rl_errf(e, RL_ENOMEM, "checkpoint: out of memory");
    if (rc) goto out;
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
        if (r < 4) {
            buf[r] = data, len[r] = dl;
            continue;
        }
        if (world > 0 && fits && !strncmp(m.files[i].name, "optimizer-", 10))
            rc = take_shard(data, dl, where, n, mo, vo, covered, e);
        free(data);
    }
    for (size_t x = 0; !rc && world > 0 && fits && x < n; x++)
        if (!(covered[x >> 3] >> (x & 7) & 1))
            rc = rl_errf(e, RL_EINPUT, "%s/%s: the %d optimizer shards leave element %zu of %zu uncovered", s->uri,
                         dir, world, x, n);
    if (rc) goto out;
    /* config.json: the job's model or nothing */
    snprintf(where, sizeof where, "%s/%s/config.json", s->uri, dir);
    if ((rc = rl_ckpt_hf_config_check(buf[2], len[2], where, want, e))) {
        *fatal = true;
        goto out;
    }
    if (!fits) {
        rc = rl_errf(e, RL_EINTERNAL, "checkpoint: buffer of %zu floats for a model of %zu", n, lay.total);
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
    /* the weights: the optimizer file's fp32 masters, or (sharded, no
     * masters) the model's, which are F32 from the same copy */
    if (world > 0) {
        copy_tensors(want, st, buf[0], "", params);
        goto state;
    }
    rl_ckpt_st_free(st), st = NULL;
    snprintf(where, sizeof where, "%s/%s/optimizer.safetensors", s->uri, dir);
    if ((rc = rl_ckpt_st_parse(buf[1], len[1], len[1], 3 * nt, where, &st, e)) ||
        (rc = check_tensors(st, want, 3, opt_prefix, where, e)))
        goto out;
    float *dst[3] = {params, mo, vo};
    for (int k = 0; k < 3; k++) copy_tensors(want, st, buf[1], opt_prefix[k], dst[k]);
state:
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
    rl_ckpt_manifest_free(&m);
    free(covered);
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

int rl_ckpt_model_config(rl_ckpt_store *s, long long step, rl_model_config *mc, int64_t *eos_id, rl_err *e) {
    char dir[32], key[96], where[RL_CKPT_URI_MAX + 96];
    char *t;
    size_t n;
    *eos_id = -1;
    rl_ckpt_step_name(dir, sizeof dir, step);
    snprintf(key, sizeof key, "%s/trainer_state.json", dir);
    snprintf(where, sizeof where, "%s/%s", s->uri, key);
    int rc = rl_ckpt_get(s, key, 0, UINT64_MAX, (void **)&t, &n, e);
    if (rc) return rc;
    cJSON *r = cJSON_ParseWithLength(t, n);
    free(t);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "config"), "model");
    rl_model_config_default(mc);
    rc = cJSON_IsObject(m) ? rl_model_config_from_json(m, where, mc, e)
                           : rl_errf(e, RL_EINPUT, "%s: no config.model (not a ringleader checkpoint?)", where);
    cJSON_Delete(r);
    if (rc) return rc;
    snprintf(key, sizeof key, "%s/config.json", dir);
    snprintf(where, sizeof where, "%s/%s", s->uri, key);
    if ((rc = rl_ckpt_get(s, key, 0, UINT64_MAX, (void **)&t, &n, e))) return rc;
    r = cJSON_ParseWithLength(t, n);
    free(t);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(r, "eos_token_id");
    if (cJSON_IsNumber(eos) && eos->valuedouble >= 0 && eos->valuedouble < mc->vocab_size) *eos_id = (int64_t)eos->valuedouble;
    else if (eos && !cJSON_IsNull(eos)) rc = rl_errf(e, RL_EINPUT, "%s: eos_token_id: not a token id of the model", where);
    cJSON_Delete(r);
    return rc;
}
