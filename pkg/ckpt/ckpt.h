/* ckpt: checkpoints -- safetensors, manifests, storage backends, the
 * asynchronous saver and the choice of what to resume from.
 *
 * Layout under a checkpoint URI (keys are '/'-separated, relative to it):
 *   step-NNNNNNNN/model.safetensors      F32 weights, Hugging Face Llama names
 *   step-NNNNNNNN/config.json            Hugging Face LlamaConfig
 *   step-NNNNNNNN/optimizer.safetensors  "master.<name>", "exp_avg.<name>",
 *                                        "exp_avg_sq.<name>" (F32, one per
 *                                        model tensor, same shape)
 *   step-NNNNNNNN/trainer_state.json     step, tokens, data position, RNG,
 *                                        schedule, world size, the job config
 *   step-NNNNNNNN/tokenizer.json,        with data.tokenizer only: the job's
 *     tokenizer_config.json,             tokenizer as given, and what
 *     special_tokens_map.json            AutoTokenizer needs beside it
 *   step-NNNNNNNN/manifest.json          size + sha256 of each file above;
 *                                        written LAST: it is the commit
 *
 * Sharded optimizer state (dist.shard) replaces optimizer.safetensors with
 * one file per rank of the world that saved it, written by that rank in
 * parallel with the others:
 *   step-NNNNNNNN/optimizer-RRRRR-of-WWWWW.safetensors
 *       "exp_avg", "exp_avg_sq" (F32 [k]): the rank's ranges of the flat
 *       layout, one after the other; "ranges" (I64 [r, 2]): each range's
 *       offset and length (shared ranges appear in every rank's file)
 *   step-NNNNNNNN/optimizer-RRRRR-of-WWWWW.receipt.json
 *       the shard's size and sha256 (a manifest of one file) and the save's
 *       nonce: the rank writes it once its shard is stored, and rank 0
 *       writes the step's manifest (listing every shard) only when all
 *       receipts of this save are in. A rank lost mid-save leaves no
 *       manifest, so the step is not a checkpoint.
 * Reading assembles the whole moments from the shards, so a checkpoint
 * resumes at any world size and in any mode.
 *   latest                               "step-NNNNNNNN\n", written after
 *                                        that step's manifest
 *
 * Every object is written atomically (a reader sees all of it or none).
 * A step directory without a manifest is never a checkpoint. Resuming
 * verifies sizes and hashes of every file and falls back to the newest
 * earlier checkpoint that verifies.
 *
 * This package knows nothing of the trainer: it takes buffers and a
 * state record, so the GPU path can feed it host copies the same way. */
#ifndef RL_CKPT_H
#define RL_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "util/cfg.h"
#include "util/util.h"

struct cJSON;

#define RL_CKPT_FORMAT_VERSION 1
#define RL_CKPT_URI_MAX 1024
/* The safetensors reference implementation refuses headers above 100 MB. */
#define RL_CKPT_ST_MAX_HEADER 100000000ull
#define RL_CKPT_ST_MAX_NAME 256
#define RL_CKPT_ST_MAX_DIMS 8
/* A file:// checkpoint holds the model and the training state: the owner
 * writes, its group (the pods' fsGroup on a shared volume) reads, others
 * nothing. The process umask can only take more away. */
#define RL_CKPT_FILE_MODE 0640
#define RL_CKPT_DIR_MODE 0750

/* ---- job config section "checkpoint" ------------------------------------------ */
/* "checkpoint.s3": where an s3:// URI's server is and how to talk to it.
 * Empty strings and zeroes defer to the AWS environment variables and
 * pkg/s3's defaults (see s3.h); credentials only ever come from the
 * environment (the operator fills it from a Secret), never from here. */
typedef struct rl_ckpt_s3_config {
    char endpoint[512];  /* "https://minio.local:9000"; "": AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS */
    char region[64];
    char addressing[16]; /* "path" | "virtual" | "" (auto) */
    long long part_mb;   /* multipart part size, MiB (>= 5); 0: default */
    long long parallel;  /* parts in flight; 0: default */
    bool allow_http;     /* session / web identity tokens to an http:// endpoint off this machine */
} rl_ckpt_s3_config;

typedef struct rl_ckpt_config {
    char uri[RL_CKPT_URI_MAX]; /* "" disables; "file:///abs", a plain path, or "s3://bucket/prefix" */
    long long every_steps;     /* 0: no step cadence */
    double every_minutes;      /* 0: no time cadence */
    int keep;                  /* committed checkpoints kept (>= 1) */
    char when_busy[8];         /* "wait" | "skip": a save due while one runs */
    bool resume;               /* start from the newest good checkpoint */
    double preempt_budget_s;   /* SIGTERM -> checkpoint written within this */
    rl_ckpt_s3_config s3;
} rl_ckpt_config;

/* The section's descriptor (util/cfg.h); its check parses the URI. */
extern const rl_cfg_section rl_ckpt_config_section;
void rl_ckpt_config_default(rl_ckpt_config *c);

/* ---- storage: the interface an s3:// backend implements unchanged ---------------- */
typedef struct rl_ckpt_part {
    const void *data;
    size_t len;
} rl_ckpt_part;

typedef struct rl_ckpt_list {
    char **keys; /* sorted */
    size_t n;
} rl_ckpt_list;
void rl_ckpt_list_free(rl_ckpt_list *l);

/* All functions are thread-compatible: one caller at a time per store
 * (the saver thread and the trainer never use a store concurrently).
 * A missing key is RL_EINPUT from get and del-tolerant (del of a missing key
 * is OK); exists() is the way to ask without an error. */
typedef struct rl_ckpt_store_ops {
    /* The concatenation of parts becomes the object, atomically. */
    int (*put)(void *ctx, const char *key, const rl_ckpt_part *parts, int nparts, rl_err *e);
    /* Bytes [off, off+len) (len UINT64_MAX: to the end); *out malloc'd, NUL-terminated. */
    int (*get)(void *ctx, const char *key, uint64_t off, uint64_t len, void **out, size_t *n,
               rl_err *e);
    /* Every key starting with prefix ("" = all). */
    int (*list)(void *ctx, const char *prefix, rl_ckpt_list *out, rl_err *e);
    int (*del)(void *ctx, const char *key, rl_err *e);
    int (*exists)(void *ctx, const char *key, bool *found, uint64_t *size, rl_err *e);
    void (*close)(void *ctx);
    /* Optional (NULL: a store without partial objects): abort the uploads
     * begun under prefix and never finished -- a writer killed mid-object
     * leaves one, with parts the store keeps until then. */
    int (*abort_uploads)(void *ctx, const char *prefix, rl_err *e);
} rl_ckpt_store_ops;

typedef struct rl_ckpt_store {
    const rl_ckpt_store_ops *ops;
    void *ctx;
    char uri[RL_CKPT_URI_MAX]; /* normalised, no trailing '/': used in messages */
} rl_ckpt_store;

/* file:///abs/dir or a plain path: the directory is created if missing
 * (its parent must exist). s3://bucket[/prefix]: objects under the prefix,
 * through pkg/s3 with credentials from the environment. Either way the
 * store must be writable: probed now (a file, or an object put and
 * deleted), so a wrong path, bucket, credential or clock fails before
 * training, not at the first save. Other schemes are RL_EINPUT. */
int rl_ckpt_store_open(const char *uri, rl_ckpt_store **out, rl_err *e);
/* The same with the config's s3 settings (rl_ckpt_store_open uses the
 * defaults). */
int rl_ckpt_store_open_cfg(const rl_ckpt_config *c, rl_ckpt_store **out, rl_err *e);
/* For reading only (generate): nothing is created or probed, and a file
 * store's directory must exist. */
int rl_ckpt_store_open_read(const char *uri, rl_ckpt_store **out, rl_err *e);
/* A checkpoint location, parsed once: s3://bucket[/prefix] (bucket: 3-63
 * of a-z 0-9 . -, starting and ending with a letter or digit; no empty
 * path segment), file:///absolute/path, or a plain path. An empty URI,
 * another scheme or a relative file:// path is RL_EINPUT naming `where`. */
typedef struct rl_ckpt_uri {
    bool s3;
    char path[RL_CKPT_URI_MAX]; /* file: the directory */
    char bucket[64];
    char prefix[RL_CKPT_URI_MAX]; /* s3: "" or "runs/a/" (with the slash) */
} rl_ckpt_uri;
int rl_ckpt_uri_parse(const char *uri, const char *where, rl_ckpt_uri *out, rl_err *e);
int rl_ckpt_store_open_s3(const rl_ckpt_config *c, const rl_ckpt_uri *u, bool readonly, rl_ckpt_store **out,
                          rl_err *e); /* store_s3.c */
void rl_ckpt_store_close(rl_ckpt_store *s);
int rl_ckpt_put(rl_ckpt_store *s, const char *key, const rl_ckpt_part *parts, int nparts, rl_err *e);
int rl_ckpt_get(rl_ckpt_store *s, const char *key, uint64_t off, uint64_t len, void **out,
                size_t *n, rl_err *e);
int rl_ckpt_list_keys(rl_ckpt_store *s, const char *prefix, rl_ckpt_list *out, rl_err *e);
int rl_ckpt_del(rl_ckpt_store *s, const char *key, rl_err *e);
int rl_ckpt_exists(rl_ckpt_store *s, const char *key, bool *found, uint64_t *size, rl_err *e);
int rl_ckpt_abort_uploads(rl_ckpt_store *s, const char *prefix, rl_err *e);

/* ---- safetensors ----------------------------------------------------------------
 * File: u64 little-endian header length N, N bytes of JSON (padded with
 * spaces to a multiple of 8 by our writer), then the data. Each tensor
 * entry is {"dtype", "shape", "data_offsets": [begin, end]} relative to the
 * data start; "__metadata__" maps strings to strings. */
typedef struct rl_ckpt_st_tensor {
    char name[RL_CKPT_ST_MAX_NAME + 1];
    char dtype[8];
    int ndim;
    int64_t shape[RL_CKPT_ST_MAX_DIMS];
    uint64_t begin, end; /* relative to the data start */
} rl_ckpt_st_tensor;

typedef struct rl_ckpt_st {
    uint64_t data_start; /* 8 + N */
    uint64_t data_len;
    int n;
    rl_ckpt_st_tensor *t; /* sorted by begin */
    int n_meta;
    char (*meta)[2][256]; /* key, value */
} rl_ckpt_st;

/* Parse and validate a header. buf holds at least the first 8 + N bytes
 * (or the whole file); file_size is the size of the whole file. Checks:
 * N bounded and inside the file, JSON object (trailing spaces only), known
 * dtypes, shapes of non-negative integers, offsets in range, contiguous from
 * 0 to the end of the file with no gap or overlap, numel x dtype size equal
 * to each byte range, no duplicate names, metadata values strings. Errors
 * are RL_EINPUT naming `name` (the file) and the tensor. Fuzzed.
 * max_tensors > 0: more entries than that (what the model has) are refused
 * from a count of the header's keys, before its JSON is parsed -- a hostile
 * header of millions of empty tensors costs neither time nor memory. */
int rl_ckpt_st_parse(const void *buf, size_t len, uint64_t file_size, int max_tensors, const char *name,
                     rl_ckpt_st **out, rl_err *e);
const rl_ckpt_st_tensor *rl_ckpt_st_find(const rl_ckpt_st *st, const char *name);
const char *rl_ckpt_st_meta(const rl_ckpt_st *st, const char *key);
void rl_ckpt_st_free(rl_ckpt_st *st);

typedef struct rl_ckpt_st_entry {
    const char *name;
    const char *dtype; /* "F32", "BF16", ... */
    int ndim;
    int64_t shape[RL_CKPT_ST_MAX_DIMS];
    const void *data;
    size_t bytes;
} rl_ckpt_st_entry;
/* The 8-byte length and the padded JSON header for tensors laid out in the
 * given order; the file is this header followed by each entry's bytes.
 * meta: NULL-terminated key, value, key, value... (may be NULL). */
int rl_ckpt_st_header(const rl_ckpt_st_entry *t, int n, const char *const *meta, char **hdr,
                      size_t *hdr_len, rl_err *e);

/* ---- checkpoint contents -------------------------------------------------------------- */
typedef struct rl_ckpt_state {
    long long step;          /* optimizer steps done */
    uint64_t tokens_seen;
    uint64_t sample_index;   /* global sample index of the next step's first sample */
    uint64_t global_batch;   /* sequences per step when saved (informational) */
    uint64_t data_seed;      /* the sampler's shuffle seed */
    uint64_t rng[4];         /* the trainer's RNG (xoshiro256** state) */
    double lr, next_lr;      /* schedule: lr of the last step and of the next */
    int world_size;          /* when saved */
    double saved_unix;
} rl_ckpt_state;

/* The job's tokenizer (data.tokenizer): its file goes into every step
 * directory with tokenizer_config.json and special_tokens_map.json, and
 * config.json names its BOS/EOS ids, so that transformers' AutoTokenizer
 * and pipeline load a checkpoint as it is. The caller keeps it alive for
 * as long as the saver. */
typedef struct rl_ckpt_tokenizer {
    const char *json; /* tokenizer.json's bytes, as given */
    size_t len;
    const char *bos, *eos; /* the tokens' text, NULL: none */
    int64_t bos_id, eos_id; /* -1: none */
} rl_ckpt_tokenizer;

/* One checkpoint's data. params, m, v hold n floats in the model's layout
 * (pkg/model); config_json is the job config as JSON (object text). */
typedef struct rl_ckpt_data {
    rl_model_config model;
    const rl_ckpt_tokenizer *tok; /* NULL: the byte-level tokenizer */
    size_t n;
    const float *params, *m, *v;
    rl_ckpt_state state;
    const char *config_json;
    /* Optional, for the saver: the snapshot from somewhere else than
     * params/m/v (a GPU). take() runs in the pause: it either fills the
     * host snapshot (n floats each) itself, or stages the state privately
     * (a copy within the GPU, milliseconds) and sets *later, and then
     * fill() completes the host snapshot on the saver's thread, off the
     * training loop's path. The saver calls take() only when idle, so a
     * staging area is never overwritten while fill() reads it. */
    int (*take)(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e);
    int (*fill)(void *ctx, float *params, float *m, float *v, rl_err *e);
    void *snap_ctx;
    /* Sharded optimizer state (shard_world 0: none; m and v hold n floats
     * each). Else m and v hold this rank's ranges only, one after the
     * other (shard_total floats each): rank shard_rank writes its shard
     * and receipt, and rank 0 also everything else (params needed there
     * only, NULL elsewhere) and commits once every receipt carrying this
     * save's nonce is in (the same nonce on every rank). */
    int shard_rank, shard_world;
    const rl_shard_range *ranges;
    int nranges;
    size_t shard_total;
    uint64_t nonce;
} rl_ckpt_data;

/* "optimizer-00003-of-00008.safetensors", or its ".receipt.json". */
void rl_ckpt_shard_name(char *dst, size_t n, int rank, int world, bool receipt);

/* "step-00000005" */
void rl_ckpt_step_name(char *dst, size_t n, long long step);
/* Strictly "step-" + 8..18 digits; -1 otherwise. */
long long rl_ckpt_parse_step_name(const char *s, size_t len);

/* File writers/readers of the JSON files (pure; fuzzed readers). */
char *rl_ckpt_hf_config_json(const rl_model_config *c, const rl_ckpt_tokenizer *tok);
/* tokenizer_config.json and special_tokens_map.json for tok. */
char *rl_ckpt_tokenizer_config_json(const rl_ckpt_tokenizer *tok, int max_len);
char *rl_ckpt_special_tokens_json(const rl_ckpt_tokenizer *tok);
char *rl_ckpt_state_json(const rl_ckpt_state *s, const char *config_json);
int rl_ckpt_state_parse(const char *text, size_t len, const char *name, rl_ckpt_state *s,
                        rl_err *e);
/* Compare a checkpoint's config.json with the job's model: RL_EINPUT naming
 * the first field that differs. */
int rl_ckpt_hf_config_check(const char *text, size_t len, const char *name,
                            const rl_model_config *want, rl_err *e);

/* A manifest lists the four files and, for sharded optimizer state, one
 * optimizer shard per rank of the world that saved it. */
#define RL_CKPT_MAX_SHARDS 16384
#define RL_CKPT_MAX_FILES (4 + RL_CKPT_MAX_SHARDS)
#define RL_CKPT_MANIFEST_MAX_BYTES (4u << 20)
typedef struct rl_ckpt_manifest_file {
    char name[64];
    uint64_t size;
    char sha256[65]; /* lowercase hex */
} rl_ckpt_manifest_file;
typedef struct rl_ckpt_manifest {
    int version;
    long long step;
    /* A shard's receipt (the same format, one file): the save it belongs
     * to, 16 hex digits; "" in a step's manifest. */
    char nonce[17];
    int nfiles, cap;
    rl_ckpt_manifest_file *files; /* rl_ckpt_manifest_free */
} rl_ckpt_manifest;
/* Append a file of these parts (its size and sha256). RL_ENOMEM, or
 * RL_EINTERNAL past RL_CKPT_MAX_FILES. */
int rl_ckpt_manifest_add(rl_ckpt_manifest *m, const char *name, const rl_ckpt_part *parts, int nparts,
                         rl_err *e);
/* Append a copy of an entry (a shard's, from its receipt). */
int rl_ckpt_manifest_put(rl_ckpt_manifest *m, const rl_ckpt_manifest_file *f, rl_err *e);
void rl_ckpt_manifest_free(rl_ckpt_manifest *m);
char *rl_ckpt_manifest_json(const rl_ckpt_manifest *m);
/* Validates names (plain file names, each once), sizes, 64-hex hashes,
 * version, the nonce if present. Fuzzed. The caller frees m (also on
 * failure). */
int rl_ckpt_manifest_parse(const char *text, size_t len, const char *name, rl_ckpt_manifest *m,
                           rl_err *e);
void rl_ckpt_sha256_hex(const rl_ckpt_part *parts, int nparts, char out[65]);

/* ---- write / verify / load ------------------------------------------------------------- */
typedef struct rl_ckpt_write_opts {
    int keep;        /* committed checkpoints kept, >= 1 */
    double deadline; /* rl_now() by which it must be committed; 0: none */
    /* Sharded, rank 0: how long to wait for the other ranks' receipts
     * without a deadline (0: 600 s), and a flag that ends the wait at
     * once (RL_EABORT; NULL: none). Neither commits a partial step. */
    double shard_wait_s;
    const volatile int *cancel;
} rl_ckpt_write_opts;

typedef struct rl_ckpt_write_info {
    uint64_t bytes;
    double seconds;
    int pruned;      /* checkpoints deleted after the commit */
} rl_ckpt_write_info;

/* Write every file of d.state.step, the manifest, then `latest`; then keep
 * the newest `keep` committed checkpoints at or below this step and delete
 * the rest, plus any manifest-less directory older than this step and any
 * checkpoint newer than it (a timeline abandoned by a resume: such a step
 * would have been resumed from had it verified). A deadline that passes
 * between files abandons the write (RL_ETIMEOUT) before its manifest.
 * Nothing older is deleted before this step's manifest and `latest` are
 * written, so a store that fills up or turns read-only mid-run loses
 * only this checkpoint (and needs room for keep + 1 of them); the error
 * says whether the step committed and names the object the store refused
 * with the server's code ("... optimizer.safetensors: 403 QuotaExceeded"). */
int rl_ckpt_write(rl_ckpt_store *s, const rl_ckpt_data *d, const rl_ckpt_write_opts *o,
                  rl_ckpt_write_info *info, rl_err *e);

/* Steps under the store that have a manifest (committed), ascending;
 * *uncommitted (optional) gets the step directories without one. Caller frees. */
int rl_ckpt_steps(rl_ckpt_store *s, long long **committed, int *nc, long long **uncommitted,
                  int *nu, rl_err *e);

/* A verified checkpoint read into memory. */
typedef struct rl_ckpt_loaded {
    bool found;
    long long step;
    rl_ckpt_state state;
    char *config_json; /* trainer_state.json's "config", text (may be NULL) */
    int n_skipped;     /* newer checkpoints that failed verification */
    char skipped[4][512]; /* why (the first few) */
} rl_ckpt_loaded;
void rl_ckpt_loaded_free(rl_ckpt_loaded *l);

/* The model a step was trained as (its trainer_state.json's job config:
 * config.json carries Hugging Face extras the strict reader refuses), and
 * the end-of-text id its config.json names (-1: none). */
int rl_ckpt_model_config(rl_ckpt_store *s, long long step, rl_model_config *mc, int64_t *eos_id, rl_err *e);

/* Read `step`, verify it against its manifest and the job's model, and
 * fill params/m/v (n floats each, may be NULL to only verify). Errors name
 * the object at fault. */
int rl_ckpt_read_step(rl_ckpt_store *s, long long step, const rl_model_config *want, size_t n,
                      float *params, float *m, float *v, rl_ckpt_loaded *out, rl_err *e);

/* One rank's slice of a committed step's AdamW moments, read with ranged
 * reads (each file's header, then only the bytes that overlap): for each
 * of `ranges` (ascending, within the model's n), its elements of m and v,
 * one range after the other. The step's optimizer state may be one
 * optimizer.safetensors or shards of any world. The caller verified the
 * step first (rl_ckpt_read_step or rl_ckpt_load_latest, moments NULL: one
 * rank, one file at a time); this trusts what it read there. So a resume
 * holds a rank's shard of the moments, never the whole of them. */
int rl_ckpt_read_moments(rl_ckpt_store *s, long long step, const rl_model_config *want, size_t n,
                         const rl_shard_range *ranges, int nranges, float *m, float *v, rl_err *e);

/* The resume choice: `latest` first, then every committed step, newest
 * first; the first that verifies is loaded (and each one skipped is logged
 * with the reason). A store with no checkpoint at all: RL_OK, found false.
 * Checkpoints present but none usable: RL_EINPUT naming the newest one's
 * fault (training never starts from damaged state, nor silently from
 * scratch). A model config mismatch is RL_EINPUT at once (no fallback:
 * the older ones were written by the same job). */
int rl_ckpt_load_latest(rl_ckpt_store *s, const rl_model_config *want, size_t n, float *params,
                        float *m, float *v, rl_ckpt_loaded *out, rl_err *e);

/* ---- the asynchronous saver ------------------------------------------------------------
 * save() copies params/m/v into host snapshot buffers (the only pause of
 * the training loop) and hands the rest -- serialising, hashing, writing,
 * committing, pruning -- to a background thread. */
typedef struct rl_ckpt_saver rl_ckpt_saver;

typedef struct rl_ckpt_saver_opts {
    int keep;
    bool skip_when_busy;  /* false: wait for the running save */
    double busy_timeout_s; /* bound on that wait (default 1800) */
    /* Sharded state: elements of each moment this rank snapshots (0: n),
     * and whether it snapshots no parameters (a rank other than 0). */
    size_t opt_n;
    bool no_params;
} rl_ckpt_saver_opts;

/* One save's timeline (rl_now() values) for logs and tests. */
typedef struct rl_ckpt_save_info {
    long long step;
    double t_snap_begin, t_snap_end; /* the pause */
    double t_done;                   /* committed (or failed) */
    uint64_t bytes;
    int rc;                          /* RL_OK once committed */
    bool done;
} rl_ckpt_save_info;

int rl_ckpt_saver_create(rl_ckpt_store *store, size_t n, const rl_ckpt_saver_opts *o,
                         rl_ckpt_saver **out, rl_err *e);
/* Snapshot and start a save. Busy: wait (bounded) or skip, logging either;
 * *started tells which. sync: also wait for the commit, with d->... deadline
 * (0: none) bounding the write. A background failure of an earlier save is
 * returned here first. */
int rl_ckpt_saver_save(rl_ckpt_saver *s, const rl_ckpt_data *d, bool sync, double deadline,
                       bool *started, rl_err *e);
/* The error of a finished background save (once), else RL_OK. Non-blocking. */
int rl_ckpt_saver_poll(rl_ckpt_saver *s, rl_err *e);
/* Wait for a running save, until `deadline` (rl_now(); 0: busy_timeout_s). */
int rl_ckpt_saver_wait(rl_ckpt_saver *s, double deadline, rl_err *e);
bool rl_ckpt_saver_busy(rl_ckpt_saver *s);
/* Saves started and skipped so far; the last started save's record. */
void rl_ckpt_saver_stats(rl_ckpt_saver *s, int *started, int *skipped, rl_ckpt_save_info *last);
/* The last n records (oldest first); returns how many were copied. */
int rl_ckpt_saver_history(rl_ckpt_saver *s, rl_ckpt_save_info *out, int n);
/* Waits (bounded by busy_timeout_s) for a running save, then stops. */
void rl_ckpt_saver_destroy(rl_ckpt_saver *s);
/* A running sharded save of rank 0 stops waiting for the other ranks'
 * shards now, uncommitted (the round it belonged to is over). */
void rl_ckpt_saver_cancel(rl_ckpt_saver *s);

#endif
