/* Per-GPU memory of training Llama shapes in each dist.shard mode, from
 * rl_train_memory_of (pkg/train/memory.h): no GPU, no allocation.
 *
 *   memory_table [--md] [--world 8] [--budget-gb 80]
 *
 * For each model (the public Hugging Face configs of Llama-3.2-1B and 3B,
 * Llama-3-8B, Llama-2-13B and Llama-3-70B) and each batch shape (the GPU
 * benchmark's configs a, 64 x 512, and b, 8 x 2048, and micro_batch 1 at
 * 2048), on cuda at --world ranks with the trainer's defaults (recompute on,
 * 1/25 MiB buckets, min_buckets 8): the GiB per GPU in none, optimizer and
 * gradients, and whether each fits --budget-gb (10^9 bytes; the CUDA
 * context and NCCL's buffers, a few GiB more, are not counted). One JSON
 * line per model and shape (what make bench collects); --md prints a
 * Markdown table and the largest model that fits per mode and shape.
 *
 * --offload: the same for train.offload none, optimizer and layers on one
 * GPU (--world 1 unless given; the host then holds the fp32 master, the
 * moments, the gradients, their staging and a bf16 copy: about 22 bytes a
 * parameter per rank, or per pod where its ranks share it
 * (train.offload_share), not counted here) -- the largest model one GPU
 * trains when the host has the memory.
 *
 * rl_model_config has no tied embeddings: the 3.2 models (tied in Hugging
 * Face) are counted with a separate lm_head, as this trainer builds them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/memory.h"

typedef struct shape {
    const char *name;
    int hidden, ffn, layers, heads, kv, vocab, max_pos;
} shape;
static const shape models[] = {
    {"Llama-3.2-1B", 2048, 8192, 16, 32, 8, 128256, 131072},
    {"Llama-3.2-3B", 3072, 8192, 28, 24, 8, 128256, 131072},
    {"Llama-3-8B", 4096, 14336, 32, 32, 8, 128256, 8192},
    {"Llama-2-13B", 5120, 13824, 40, 40, 40, 32000, 4096},
    {"Llama-3-70B", 8192, 28672, 80, 64, 8, 128256, 8192},
};
enum { NMODELS = sizeof models / sizeof models[0], NMODES = 3 };

typedef struct batch {
    const char *name;
    int micro_batch, seq_len;
} batch;
static const batch batches[] = {{"a", 64, 512}, {"b", 8, 2048}, {"b1", 1, 2048}};
enum { NBATCHES = sizeof batches / sizeof batches[0] };
static const char *const shards[NMODES] = {"none", "optimizer", "gradients"};
static const char *const offloads[NMODES] = {"none", "optimizer", "layers"};
static const char *const *modes = shards; /* --offload: offloads */

static int account(const shape *s, const batch *b, const char *mode, int world, rl_train_memory *m) {
    rl_job_config c;
    rl_job_config_default(&c);
    rl_model_config *mc = &c.model;
    mc->hidden_size = s->hidden, mc->intermediate_size = s->ffn, mc->num_hidden_layers = s->layers;
    mc->num_attention_heads = s->heads, mc->num_key_value_heads = s->kv, mc->vocab_size = s->vocab;
    mc->max_position_embeddings = s->max_pos;
    c.train.micro_batch = b->micro_batch, c.train.seq_len = b->seq_len;
    snprintf(c.train.device, sizeof c.train.device, "cuda");
    if (modes == offloads) snprintf(c.train.offload, sizeof c.train.offload, "%s", mode);
    else snprintf(c.dist.shard, sizeof c.dist.shard, "%s", mode);
    rl_err e;
    if (rl_train_memory_of(&c, world, 0, m, &e)) {
        fprintf(stderr, "memory_table: %s: %s\n", s->name, e.msg);
        return 1;
    }
    return 0;
}

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

static void json_line(const shape *s, const batch *b, const rl_train_memory m[NMODES], int world, double budget) {
    printf("{\"bench\":\"memory\",\"model\":\"%s\",\"params\":%zu,\"config\":\"%s\",\"micro_batch\":%d,"
           "\"seq_len\":%d,\"world\":%d,\"device\":\"cuda\",\"modes\":\"%s\"",
           s->name, m[0].shard_elems, b->name, b->micro_batch, b->seq_len, world,
           modes == offloads ? "train.offload" : "dist.shard");
    for (int k = 0; k < NMODES; k++)
        printf(",\"%s\":{\"weights\":%zu,\"master\":%zu,\"grads\":%zu,\"moments\":%zu,\"activations\":%zu,"
               "\"total\":%zu,\"fits\":%s}",
               modes[k], m[k].weights, m[k].master, m[k].grads, m[k].moments, m[k].activations,
               m[k].total, (double)m[k].total <= budget ? "true" : "false");
    printf("}\n");
}

static void md_row(const shape *s, const batch *b, const rl_train_memory m[NMODES], double budget) {
    printf("| %s | %.2fB | %s (%d x %d) | %.1f |", s->name, (double)m[0].shard_elems / 1e9, b->name,
           b->micro_batch, b->seq_len, gib(m[0].activations));
    for (int k = 0; k < NMODES; k++)
        printf(" %.1f %s |", gib(m[k].total), (double)m[k].total <= budget ? "yes" : "no");
    printf("\n");
}

int main(int argc, char **argv) {
    int md = 0, world = 0;
    double budget_gb = 80;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--md")) md = 1;
        else if (!strcmp(argv[i], "--offload")) modes = offloads;
        else if (!strcmp(argv[i], "--world") && i + 1 < argc) world = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budget-gb") && i + 1 < argc) budget_gb = atof(argv[++i]);
        else return fprintf(stderr, "usage: memory_table [--md] [--offload] [--world N] [--budget-gb G]\n"), 2;
    }
    if (world < 1) world = modes == offloads ? 1 : 8;
    double budget = budget_gb * 1e9;
    const char *largest[NBATCHES][NMODES] = {{0}};
    if (md)
        printf("| model | params | config (B x T) | activations GiB | %s GiB, fits | %s GiB, fits "
               "| %s GiB, fits |\n|---|---|---|---|---|---|---|\n", modes[0], modes[1], modes[2]);
    for (int j = 0; j < NBATCHES; j++)
        for (int i = 0; i < NMODELS; i++) {
            rl_train_memory m[NMODES];
            for (int k = 0; k < NMODES; k++) {
                if (account(&models[i], &batches[j], modes[k], world, &m[k])) return 1;
                if ((double)m[k].total <= budget) largest[j][k] = models[i].name; /* ascending sizes */
            }
            if (md) md_row(&models[i], &batches[j], m, budget);
            else json_line(&models[i], &batches[j], m, world, budget);
        }
    if (!md) return 0;
    printf("\nLargest that fits %.0f GB per GPU at world %d:\n\n| config | %s | %s | %s |\n"
           "|---|---|---|---|\n", budget_gb, world, modes[0], modes[1], modes[2]);
    for (int j = 0; j < NBATCHES; j++) {
        printf("| %s |", batches[j].name);
        for (int k = 0; k < NMODES; k++) printf(" %s |", largest[j][k] ? largest[j][k] : "none of these");
        printf("\n");
    }
    return 0;
}
