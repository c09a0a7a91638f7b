/* Bad input through the real binaries: exit code 2, one line naming the
 * file or field, nothing written. And the learning bound of the default. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "testutil.h"
#include "tokjson.h"
#include "train/train.h"

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert(d != NULL);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Run the worker on a config in a fresh directory holding the given shard
 * bytes; expect exit 2 and exactly one stderr line containing every needle. */
static void expect_rejected(const char *config_json, const void *shard, size_t shard_len,
                            const char *needle1, const char *needle2) {
    char dir[] = "/tmp/rlcli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256], cmd[1024], err[4096];
    snprintf(path, sizeof path, "%s/job.json", dir);
    rl_test_write(path, config_json, strlen(config_json));
    if (shard) {
        snprintf(path, sizeof path, "%s/shard.bin", dir);
        rl_test_write(path, shard, shard_len);
    }
    int before = dir_entries(dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s/ringleader-worker --config job.json", dir, rl_test_bindir());
    int st = rl_test_run(cmd, err, sizeof err);
    cr_expect_eq(st, 2, "exit status %d, stderr: %s", st, err);
    cr_expect_eq(count_lines(err), 1, "expected one line, got: %s", err);
    cr_expect(strstr(err, needle1) != NULL, "'%s' not in: %s", needle1, err);
    if (needle2) cr_expect(strstr(err, needle2) != NULL, "'%s' not in: %s", needle2, err);
    cr_expect_eq(dir_entries(dir), before, "the failed run wrote files");
    rl_test_rmdir(dir);
}

static size_t make_shard(unsigned char *buf, int32_t magic, int32_t version, int32_t count,
                         int ntok, uint16_t tok) {
    memset(buf, 0, RL_SHARD_HEADER_BYTES);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    for (int i = 0; i < ntok; i++) memcpy(buf + RL_SHARD_HEADER_BYTES + 2 * i, &tok, 2);
    return RL_SHARD_HEADER_BYTES + 2 * (size_t)ntok;
}

#define SHARD_CFG "{\"data\":{\"train\":\"shard.bin\",\"val\":\"\",\"eval_task\":\"\"},\"train\":{\"steps\":2,\"warmup_steps\":1}}"

Test(cli, config_errors_name_the_field) {
    expect_rejected("{\"train\":{\"learning_rate\":0.1}}", NULL, 0, "job.json", "learning_rate");
    expect_rejected("{\"model\":{\"num_attention_heads\":3}}", NULL, 0, "job.json", "num_attention_heads");
    expect_rejected("{\"model\":{\"num_key_value_heads\":3}}", NULL, 0, "job.json", "num_key_value_heads");
    expect_rejected("{\"train\":{\"micro_batch\":5}}", NULL, 0, "job.json", "micro_batch");
    expect_rejected("{\"train\": ", NULL, 0, "job.json", "invalid JSON");
}

Test(cli, bad_shards_name_the_file) {
    static unsigned char buf[RL_SHARD_HEADER_BYTES + 2 * 4096];
    size_t n = make_shard(buf, 12345, 1, 4096, 4096, 65);
    expect_rejected(SHARD_CFG, buf, n, "shard.bin", "magic");
    n = make_shard(buf, RL_SHARD_MAGIC, 1, 4096, 4000, 65); /* header promises more */
    expect_rejected(SHARD_CFG, buf, n, "shard.bin", "truncated");
    n = make_shard(buf, RL_SHARD_MAGIC, 7, 4096, 4096, 65);
    expect_rejected(SHARD_CFG, buf, n, "shard.bin", "version");
    n = make_shard(buf, RL_SHARD_MAGIC, 1, 4096, 4096, 300); /* vocab is 257 */
    expect_rejected(SHARD_CFG, buf, n, "shard.bin", "vocab_size");
}

/* The three binaries read their command lines one way (cmd/flags.c). */
Test(cli, every_binary_refuses_a_bad_command_line_the_same_way) {
    const char *bins[] = {"ringleader-worker", "ringleader-operator", "ringleader-prepare arith"};
    const struct {
        const char *args, *says;
    } bad[] = {{"--no-such-flag", "unknown flag '--no-such-flag'"}, {"--out", "needs a value"}};
    char cmd[512], err[2048];
    for (size_t b = 0; b < 3; b++) {
        snprintf(cmd, sizeof cmd, "%s/%s --help >/dev/null", rl_test_bindir(), bins[b]);
        cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s --help: %s", bins[b], err);
        snprintf(cmd, sizeof cmd, "%s/%s %s", rl_test_bindir(), bins[b], bad[0].args);
        cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s: %s", bins[b], err);
        cr_expect(strstr(err, bad[0].says) && strstr(err, "error:") && count_lines(err) == 1, "%s: %s", bins[b],
                  err);
    }
    /* a value missing at the end, and --name=value */
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare arith %s", rl_test_bindir(), bad[1].args);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--out needs a value") && count_lines(err) == 1, "%s", err);
    snprintf(cmd, sizeof cmd, "%s/ringleader-worker --steps=-1", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--steps: must be an integer in [0, ") && count_lines(err) == 1, "%s", err);
    snprintf(cmd, sizeof cmd, "%s/ringleader-operator --leader-elect=maybe", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--leader-elect: must be true or false"), "%s", err);
}

/* The rdzv settings the worker prints with --print-config, run in dir with
 * the environment `env` ("" none) and the flags `flags`. */
static int printed_rdzv(const char *dir, const char *env, const char *flags, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd %s && { env -u RINGLEADER_RDZV -u RINGLEADER_JOB -u RINGLEADER_NNODES %s %s/ringleader-worker "
             "--config job.json --print-config %s 1>&2; }", /* stdout too, into rl_test_run's capture */
             dir, env, rl_test_bindir(), flags);
    int st = rl_test_run(cmd, out, n);
    char *r = strstr(out, "\"rdzv\":");
    if (r) memmove(out, r, strlen(r) + 1);
    return st;
}

/* One precedence for every setting: flags, then the environment, then the
 * config file, then the defaults; a bad value names the flag or variable. */
Test(cli, flags_beat_the_environment_which_beats_the_config_file) {
    char dir[] = "/tmp/rlcli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256], out[8192];
    snprintf(path, sizeof path, "%s/job.json", dir);
    const char *cfg = "{\"rdzv\":{\"backend\":\"etcd\",\"job\":\"file\",\"min_nodes\":1,\"max_nodes\":1}}";
    rl_test_write(path, cfg, strlen(cfg));
    cr_assert_eq(printed_rdzv(dir, "", "", out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "\"backend\":\"etcd\",\"job\":\"file\",\"min_nodes\":1,\"max_nodes\":1"), "%s", out);
    cr_assert_eq(printed_rdzv(dir, "RINGLEADER_RDZV=k8s RINGLEADER_JOB=env RINGLEADER_NNODES=2:4", "", out, sizeof out),
                 0, "%s", out);
    cr_expect(strstr(out, "\"backend\":\"k8s\",\"job\":\"env\",\"min_nodes\":2,\"max_nodes\":4"), "%s", out);
    cr_assert_eq(printed_rdzv(dir, "RINGLEADER_RDZV=k8s RINGLEADER_JOB=env RINGLEADER_NNODES=2:4",
                              "--rdzv static --job flag --nnodes 3", out, sizeof out),
                 0, "%s", out);
    cr_expect(strstr(out, "\"backend\":\"static\",\"job\":\"flag\",\"min_nodes\":3,\"max_nodes\":3"), "%s",
              out);
    cr_expect_eq(printed_rdzv(dir, "RINGLEADER_RDZV=slurm", "", out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "RINGLEADER_RDZV: unknown value \"slurm\" (static, k8s or etcd)") && count_lines(out) == 1,
              "%s", out);
    cr_expect_eq(printed_rdzv(dir, "", "--rdzv slurm", out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "--rdzv: unknown value \"slurm\"") && count_lines(out) == 1, "%s", out);
    cr_expect_eq(printed_rdzv(dir, "RINGLEADER_NNODES=4:2", "", out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "RINGLEADER_NNODES") && count_lines(out) == 1, "%s", out);
    rl_test_rmdir(dir);
}

Test(cli, unreadable_paths) {
    char err[2048];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/ringleader-worker --config /nonexistent/job.json", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "/nonexistent/job.json") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
    expect_rejected("{\"data\":{\"train\":\"missing.bin\",\"val\":\"\",\"eval_task\":\"\"}}", NULL, 0,
                    "missing.bin", NULL);
    snprintf(cmd, sizeof cmd, "%s/ringleader-worker --steps many", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--steps") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare arith --out /tmp/x --digits 9", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--digits") != NULL, "%s", err);
}

/* The device line: a CUDA build on a machine without a GPU says so once
 * and trains on the CPU (the start line names the device); asking for
 * "cuda" there is one error line naming train.device. A build without CUDA
 * says nothing about GPUs. */
Test(cli, no_gpu_says_so_once_and_trains_on_cpu) {
    char dir[64], path[128], cmd[512], out[16384];
    rl_test_arith_dir(dir, sizeof dir, 20000);
    snprintf(path, sizeof path, "%s/job.json", dir);
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"train\":{\"steps\":2,\"warmup_steps\":1}}", dir);
    rl_test_write(path, cfg, strlen(cfg));
    snprintf(cmd, sizeof cmd, "RL_NO_PROGRESS=1 %s/ringleader-worker --config %s", rl_test_bindir(), path);
    int st = rl_test_run(cmd, out, sizeof out);
    cr_assert_eq(st, 0, "%s", out);
    if (strstr(out, "\"device\":\"cuda\"")) { /* a GPU host: make test-gpu covers it */
        rl_test_rmdir(dir);
        return;
    }
    int n = 0;
    for (const char *p = out; (p = strstr(p, "\"event\":\"device\"")); p++) n++;
#ifdef RL_CUDA
    cr_expect_eq(n, 1, "expected one device line: %s", out);
    cr_expect(strstr(out, "no GPU is visible") != NULL, "%s", out);
#else
    cr_expect_eq(n, 0, "a build without CUDA has nothing to say about GPUs: %s", out);
#endif
    cr_expect(strstr(out, "\"device\":\"cpu\"") != NULL, "train_start names the device: %s", out);
    /* torchrun's --nproc-per-node auto: one trainer per GPU, one without */
    snprintf(cmd, sizeof cmd, "RL_NO_PROGRESS=1 %s/ringleader-worker --config %s --nproc-per-node auto",
             rl_test_bindir(), path);
    st = rl_test_run(cmd, out, sizeof out);
    cr_expect_eq(st, 0, "%s", out);
    cr_expect(strstr(out, "\"event\":\"nproc_per_node\",\"auto\":1,\"gpus\":0") != NULL, "%s", out);
    cr_expect(strstr(out, "\"world\":1") != NULL, "%s", out);
    snprintf(cfg, sizeof cfg,
             "{\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"train\":{\"steps\":2,\"warmup_steps\":1,\"device\":\"cuda\"}}", dir);
    rl_test_write(path, cfg, strlen(cfg));
    snprintf(cmd, sizeof cmd, "%s/ringleader-worker --config %s", rl_test_bindir(), path);
    st = rl_test_run(cmd, out, sizeof out);
    cr_expect_eq(st, 2, "%s", out);
    cr_expect_eq(count_lines(out), 1, "%s", out);
    cr_expect(strstr(out, "train.device") != NULL, "%s", out);
    rl_test_rmdir(dir);
}

/* The embedded default learns: after 150 of its 800 steps (same schedule as
 * `make run`) the training loss is below 1.75 nats, and at least 0.5 below
 * the corpus's unigram entropy (2.52): the model uses context. At step 0
 * it is log(257) = 5.55. Measured on the 2-core dev machine: 1.56 at step
 * 150 and 1.07 at step 800; the floor set by the random operands is ~0.99. */
Test(learning, default_config_loss_falls, .timeout = 900) {
    char dir[64];
    rl_test_arith_dir(dir, sizeof dir, 2000000);
    rl_job_config c;
    rl_job_config_default(&c);
    snprintf(c.data.train, sizeof c.data.train, "%s/train_*.bin", dir);
    snprintf(c.data.val, sizeof c.data.val, "%s/val_*.bin", dir);
    rl_trainer *tr;
    rl_err e;
    cr_assert_eq(rl_trainer_new(&tr, &c, NULL, &e), 0, "%s", e.msg);
    rl_step_stats st;
    double first = 0, sum = 0;
    for (int i = 0; i < 150; i++) {
        cr_assert_eq(rl_trainer_step(tr, &st, &e), 0, "%s", e.msg);
        if (i == 0) first = st.loss;
        if (i >= 140) sum += st.loss; /* mean of the last 10: less noise */
    }
    double last = sum / 10, h = rl_trainer_summary(tr)->unigram_entropy;
    cr_log_info("loss: step 1 %.4f, steps 141-150 %.4f; unigram entropy %.4f", first, last, h);
    cr_expect(fabs(first - log(257.0)) < 0.2, "initial loss %.4f, expected ~log(257)", first);
    cr_expect(h > 2.2 && h < 2.8, "unigram entropy %.4f out of the expected range", h);
    cr_expect(last < 1.75, "loss after 150 steps %.4f >= 1.75", last);
    cr_expect(last < h - 0.5, "loss %.4f not 0.5 below the unigram entropy %.4f", last, h);
    rl_trainer_free(tr);
    rl_test_rmdir(dir);
}

/* Llama 3's vocabulary end to end: ringleader-prepare synthetic writes
 * llm.c's uint32 shards for a vocabulary above 65536, and the worker
 * trains on them (ids up to 128255 reach the model; a model whose
 * vocab_size is smaller names the file and the token). */
Test(cli, a_llama3_sized_vocabulary_trains_from_uint32_shards, .timeout = 300) {
    char dir[64] = "/tmp/rl_u32_XXXXXX", path[160], cmd[768], out[16384], cfg[768];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare synthetic --vocab 128256 --tokens 40000 --out %s",
             rl_test_bindir(), dir);
    cr_assert_eq(rl_test_run(cmd, out, sizeof out), 0, "%s", out);
    unsigned char h[8];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(h, 1, 8, f), 8);
    fclose(f);
    uint32_t magic = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24, version = h[4];
    cr_assert(magic == RL_SHARD32_MAGIC && version == RL_SHARD32_VERSION, "header %u %u", magic, version);
    for (int small = 0; small < 2; small++) {
        snprintf(path, sizeof path, "%s/job%d.json", dir, small);
        snprintf(cfg, sizeof cfg,
                 "{\"model\":{\"vocab_size\":%d,\"hidden_size\":16,\"intermediate_size\":32,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":2,\"max_position_embeddings\":32},"
                 "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"%s/val_*.bin\",\"eval_task\":\"\"},"
                 "\"train\":{\"steps\":2,\"warmup_steps\":1,\"seq_len\":16,\"micro_batch\":2,"
                 "\"global_batch_tokens\":32,\"eval_every\":0,\"eval_batches\":1,\"device\":\"cpu\"}}",
                 small ? 65536 : 128256, dir, dir);
        rl_test_write(path, cfg, strlen(cfg));
        snprintf(cmd, sizeof cmd, "RL_NO_PROGRESS=1 %s/ringleader-worker --config %s", rl_test_bindir(), path);
        int st = rl_test_run(cmd, out, sizeof out);
        if (!small) {
            cr_expect_eq(st, 0, "%s", out);
            cr_expect(strstr(out, "\"event\":\"train_end\",\"steps\":2") != NULL, "%s", out);
        } else {
            cr_expect_eq(st, 2, "a vocabulary too small for the data must stop the run: %s", out);
            cr_expect(strstr(out, "is >= vocab_size 65536") != NULL && strstr(out, ".bin: token ") != NULL, "%s", out);
        }
    }
    rl_test_rmdir(dir);
}

/* ringleader-prepare jsonl: each document's text (its "body" field here),
 * byte-level after an end-of-text token, in file and line order; a bad
 * line anywhere stops it before any shard is written, with one line
 * naming the file and line. */
Test(cli, prepare_jsonl_tokenizes_documents_and_names_a_bad_line) {
    char dir[64] = "/tmp/rl_jsonl_XXXXXX", a[128], b[128], out[128], cmd[1024], err[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    const char *ja = "{\"body\":\"hi\",\"n\":1}\n{\"body\":\"\\u00e9\"}\n", *jb = "{\"body\":\"x\"}\n";
    rl_test_write(a, ja, strlen(ja));
    rl_test_write(b, jb, strlen(jb));
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare jsonl --field body --val-fraction 0 --out %s %s %s",
             rl_test_bindir(), out, a, b);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    char pat[160];
    snprintf(pat, sizeof pat, "%s/train_*.bin", out);
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(pat, RL_TOK_VOCAB, &d, &e), 0, "%s", e.msg);
    const int32_t want[] = {256, 'h', 'i', 256, 0xc3, 0xa9, 256, 'x'};
    int32_t got[8];
    cr_assert_eq(rl_dataset_tokens(d), 8);
    cr_assert_eq(rl_dataset_read(d, 0, 8, got, &e), 0, "%s", e.msg);
    cr_expect_arr_eq(got, want, sizeof want);
    rl_dataset_close(d);

    const char *bad = "{\"body\":\"x\"}\n{\"body\":\"y\"}\n{\"text\":\"z\"}\n";
    rl_test_write(b, bad, strlen(bad));
    snprintf(out, sizeof out, "%s/out2", dir);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare jsonl --field body --out %s %s %s", rl_test_bindir(), out, a, b);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "b.jsonl:3: no \"body\" field") != NULL && count_lines(err) == 1, "%s", err);
    snprintf(pat, sizeof pat, "%s/train_000000.bin", out);
    cr_expect_neq(access(pat, F_OK), 0, "a shard was written before the bad line was found");
    rl_test_rmdir(dir);
}

/* A Hugging Face tokenizer.json end to end: prepare encodes documents with
 * it (ids known from the merges' construction), writes dataset.json and
 * decodes the shard back; a model trained on it with data.tokenizer saves
 * checkpoints that `generate` continues text from; a job naming another
 * tokenizer than dataset.json's is refused, as is a WordPiece file (one
 * line, exit 2, nothing written). */
Test(cli, prepare_with_a_tokenizer_json_then_train_and_generate, .timeout = 300) {
    char dir[64] = "/tmp/rl_bpe_XXXXXX", tok[128], tok2[128], docs[128], out[128], cmd[2048], err[8192];
    cr_assert_not_null(mkdtemp(dir));
    /* "a"+"b" -> 256, "ab"+"c" -> 257, " "+"t" -> 258; <|endoftext|> is 259 */
    static const char *const merges[] = {"a", "b", "ab", "c", " ", "t", NULL};
    static const char *const specials[] = {"<|endoftext|>", NULL};
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    rl_test_write_tokenizer_json(tok, merges, specials);
    static const char *const other[] = {" ", "t", "a", "b", NULL};
    snprintf(tok2, sizeof tok2, "%s/other.json", dir);
    rl_test_write_tokenizer_json(tok2, other, specials); /* another tokenizer: other ids */
    snprintf(docs, sizeof docs, "%s/docs.jsonl", dir);
    FILE *f = fopen(docs, "w");
    cr_assert_not_null(f);
    fputs("{\"text\":\"abc t\"}\n", f);
    for (int i = 0; i < 300; i++) fputs("{\"text\":\"ab abc tab cab\"}\n", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/data", dir);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare jsonl --tokenizer %s --val-fraction 0 --out %s %s",
             rl_test_bindir(), tok, out, docs);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    char pat[192];
    snprintf(pat, sizeof pat, "%s/train_*.bin", out);
    rl_dataset *d;
    rl_err e = {0};
    cr_assert_eq(rl_dataset_open(pat, 260, &d, &e), 0, "%s", e.msg);
    /* the first document: EOT, "abc" (256 then 257), " t" (258) */
    const int32_t want[] = {259, 257, 258, 259};
    int32_t got[4];
    cr_assert_eq(rl_dataset_read(d, 0, 4, got, &e), 0, "%s", e.msg);
    cr_expect_arr_eq(got, want, sizeof want);
    rl_dataset_close(d);
    char meta[192];
    snprintf(meta, sizeof meta, "%s/dataset.json", out);
    cr_expect(rl_test_file_has(meta, "\"eos_id\":\t259") && rl_test_file_has(meta, "\"vocab_size\":\t260"));
    /* decode gives the documents back, each after its end-of-text token */
    char text[256];
    snprintf(cmd, sizeof cmd, "(%s/ringleader-prepare decode --tokenizer %s %s/train_000000.bin | head -c 80 > %s/text)",
             rl_test_bindir(), tok, out, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(text, sizeof text, "%s/text", dir);
    cr_expect(rl_test_file_has(text, "<|endoftext|>abc t<|endoftext|>ab abc tab cab<|endoftext|>"));

    /* train on it; the checkpoint carries the tokenizer; generate reads it */
    char job[192];
    snprintf(job, sizeof job, "%s/job.json", dir);
    f = fopen(job, "w");
    cr_assert_not_null(f);
    fprintf(f, "{\"model\":{\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"max_position_embeddings\":64,\"vocab_size\":260},\"train\":{\"steps\":3,\"warmup_steps\":1,\"seq_len\":16,\"micro_batch\":2,"
               "\"global_batch_tokens\":32,\"eval_every\":0,\"sample_every\":3,\"sample_prompts\":\"ab\"},"
               "\"data\":{\"train\":\"%s\",\"val\":\"\",\"eval_task\":\"\",\"tokenizer\":\"%s\"},"
               "\"checkpoint\":{\"uri\":\"file://%s/ck\"}}", pat, tok, dir);
    fclose(f);
    snprintf(cmd, sizeof cmd, "RL_NO_PROGRESS=1 %s/ringleader-worker --config %s", rl_test_bindir(), job);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    cr_expect(strstr(err, "\"event\":\"sample\",\"step\":3,\"prompt\":\"ab\",\"text\":\"ab") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "(%s/ringleader-worker generate --checkpoint %s/ck --prompt abc --max-new-tokens 4 "
             "> %s/gen)", rl_test_bindir(), dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(text, sizeof text, "%s/gen", dir);
    cr_expect(rl_test_file_has(text, "abc"), "generate prints the prompt and its continuation");
    /* --device cpu gives the same greedy text as auto does on this machine
     * (no GPU here: auto is the CPU); a bad --device is one line, exit 2 */
    snprintf(cmd, sizeof cmd, "(%s/ringleader-worker generate --device cpu --checkpoint %s/ck --prompt abc "
             "--max-new-tokens 4 > %s/gen-cpu) && cmp %s/gen %s/gen-cpu", rl_test_bindir(), dir, dir, dir, dir);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s/ringleader-worker generate --device tpu --checkpoint %s/ck --prompt abc",
             rl_test_bindir(), dir);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--device: \"tpu\"") && strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
    snprintf(text, sizeof text, "%s/ck/step-00000003/tokenizer.json", dir);
    cr_expect_eq(access(text, F_OK), 0, "the checkpoint carries tokenizer.json");

    /* the shards were made with another tokenizer than the job's */
    char *jt;
    size_t jl;
    cr_assert_eq(rl_read_file(job, &jt, &jl, &e), 0, "%s", e.msg);
    char *at = strstr(jt, tok);
    cr_assert_not_null(at);
    f = fopen(job, "w");
    fprintf(f, "%.*s%s%s", (int)(at - jt), jt, tok2, at + strlen(tok));
    fclose(f);
    free(jt);
    snprintf(cmd, sizeof cmd, "RL_NO_PROGRESS=1 %s/ringleader-worker --config %s", rl_test_bindir(), job);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "other.json") && strstr(err, "dataset.json"), "%s", err);

    /* a tokenizer this reader does not implement: nothing written */
    const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}},\"decoder\":null}";
    rl_test_write(tok2, wp, strlen(wp));
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare jsonl --tokenizer %s --out %s/none %s", rl_test_bindir(), tok2,
             dir, docs);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "model.type") && count_lines(err) == 1, "%s", err);
    snprintf(text, sizeof text, "%s/none", dir);
    cr_expect_neq(access(text, F_OK), 0, "nothing written for a refused tokenizer");
    rl_test_rmdir(dir);
}

/* ringleader-prepare text: each file one document, after the end-of-text
 * token -- byte-level (256) or, with --tokenizer, its ids; the split takes
 * the last --val-fraction of the stream. */
Test(cli, prepare_text_makes_each_file_a_document_bytes_or_bpe) {
    char dir[64] = "/tmp/rl_text_XXXXXX", a[128], b[128], tok[128], out[128], cmd[1024], err[4096], pat[320];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/a.txt", dir);
    snprintf(b, sizeof b, "%s/b.txt", dir);
    rl_test_write(a, "abc\n", 4);
    rl_test_write(b, "ab", 2);
    snprintf(out, sizeof out, "%s/bytes", dir);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare text --val-fraction 0.25 --out %s %s %s", rl_test_bindir(), out,
             a, b);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    /* 8 tokens: 6 to train, the last 2 (val-fraction 0.25) to val */
    const int32_t want[] = {256, 'a', 'b', 'c', '\n', 256, 'a', 'b'};
    int32_t got[8];
    rl_dataset *d;
    rl_err e = {0};
    snprintf(pat, sizeof pat, "%s/train_*.bin,%s/val_*.bin", out, out);
    cr_assert_eq(rl_dataset_open(pat, RL_TOK_VOCAB, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_tokens(d), 8);
    cr_assert_eq(rl_dataset_read(d, 0, 8, got, &e), 0, "%s", e.msg);
    cr_expect_arr_eq(got, want, sizeof want);
    rl_dataset_close(d);
    snprintf(pat, sizeof pat, "%s/val_000000.bin", out);
    cr_assert_eq(rl_dataset_open(pat, RL_TOK_VOCAB, &d, &e), 0, "%s", e.msg);
    cr_expect_eq(rl_dataset_tokens(d), 2);
    rl_dataset_close(d);
    snprintf(pat, sizeof pat, "%s/dataset.json", out);
    cr_expect(rl_test_file_has(pat, "\"byte-level\"") && rl_test_file_has(pat, "\"eos_id\":\t256"));

    static const char *const merges[] = {"a", "b", "ab", "c", NULL};
    static const char *const specials[] = {"<|endoftext|>", NULL};
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    rl_test_write_tokenizer_json(tok, merges, specials);
    snprintf(out, sizeof out, "%s/bpe", dir);
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare text --tokenizer %s --val-fraction 0 --out %s %s %s",
             rl_test_bindir(), tok, out, a, b);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    /* "abc" is 257 ("ab" 256 + "c"), "\n" its byte, "ab" 256; EOT is 258 */
    const int32_t bw[] = {258, 257, '\n', 258, 256};
    int32_t bg[5];
    snprintf(pat, sizeof pat, "%s/train_*.bin", out);
    cr_assert_eq(rl_dataset_open(pat, 259, &d, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_dataset_tokens(d), 5);
    cr_assert_eq(rl_dataset_read(d, 0, 5, bg, &e), 0, "%s", e.msg);
    cr_expect_arr_eq(bg, bw, sizeof bw);
    rl_dataset_close(d);
    rl_test_rmdir(dir);
}

/* text --split-on: documents inside one file, cut at the separator, give
 * the shards (and dataset.json's count) that the same documents as JSON
 * Lines give, byte-level and with a tokenizer; an empty separator is a bad
 * flag. */
Test(cli, prepare_text_split_on_gives_the_shards_jsonl_gives) {
    char dir[64] = "/tmp/rl_split_XXXXXX", txt[128], jl[128], tok[128], cmd[2048], err[4096], a[160], b[160];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(txt, sizeof txt, "%s/docs.txt", dir);
    snprintf(jl, sizeof jl, "%s/docs.jsonl", dir);
    FILE *ft = fopen(txt, "w"), *fj = fopen(jl, "w");
    cr_assert(ft && fj);
    fputs("<|endoftext|>", ft); /* one first: no empty document */
    for (int i = 0; i < 200; i++) {
        char doc[256];
        snprintf(doc, sizeof doc, "story %d: abc\nab \xc3\xa9t\xc3\xa9 %s", i, i % 3 ? "cab tab" : "\"q\"");
        fprintf(ft, "%s<|endoftext|>%s", doc, i % 50 ? "" : "<|endoftext|>");
        fputs("{\"text\":\"", fj);
        for (const char *p = doc; *p; p++) fputs(*p == '\n' ? "\\n" : *p == '"' ? "\\\"" : (char[2]){*p, 0}, fj);
        fputs("\"}\n", fj);
    }
    fclose(ft), fclose(fj);
    static const char *const merges[] = {"a", "b", "ab", "c", " ", "t", NULL};
    static const char *const specials[] = {"<|endoftext|>", NULL};
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    rl_test_write_tokenizer_json(tok, merges, specials);
    for (int bpe = 0; bpe < 2; bpe++) {
        char t[200] = "";
        if (bpe) snprintf(t, sizeof t, "--tokenizer %s", tok);
        snprintf(cmd, sizeof cmd, "(%s/ringleader-prepare text %s --split-on '<|endoftext|>' --out %s/t%d %s && "
                 "%s/ringleader-prepare jsonl %s --out %s/j%d %s)", rl_test_bindir(), t, dir, bpe, txt,
                 rl_test_bindir(), t, dir, bpe, jl);
        cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
        for (const char *const *f = (const char *const[]){"train_000000.bin", "val_000000.bin", NULL}; *f; f++) {
            snprintf(a, sizeof a, "%s/t%d/%s", dir, bpe, *f);
            snprintf(b, sizeof b, "%s/j%d/%s", dir, bpe, *f);
            snprintf(cmd, sizeof cmd, "cmp %s %s", a, b);
            cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
        }
        snprintf(a, sizeof a, "%s/t%d/dataset.json", dir, bpe);
        cr_expect(rl_test_file_has(a, "\"documents\":\t200"), "%s", a);
    }
    snprintf(cmd, sizeof cmd, "%s/ringleader-prepare text --split-on '' --out %s/x %s", rl_test_bindir(), dir, txt);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--split-on"), "%s", err);
    rl_test_rmdir(dir);
}
