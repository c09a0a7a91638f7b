/* train.offload "optimizer" and "layers" (internal to pkg/train): the host's update of a
 * GPU whose fp32 master and AdamW moments stay in the host's memory (the
 * device seam's params and opt; gpu.c's offload ops drive it).
 *
 * A step: the model writes its gradients region by region into slots
 * this takes down into pinned host memory as the backward makes them (below);
 * the trainer's step_end computes the norm and clipping from them and
 * hands the update over (rl_offload_step). A thread then runs AdamW region by region in the
 * order the forward reads the weights -- the embedding, each layer, the
 * final norm with lm_head -- rounds each region to bf16 and queues its
 * copy to the GPU on a stream of its own, behind an event. The model's
 * params-wait callback (rl_offload_wait, set with
 * rl_gpu_model_set_params_wait) blocks the training thread until a
 * region is updated and makes the model's stream wait for its copy, so
 * the next forward starts while later layers are still being updated.
 *
 * Anything else that reads or writes the host state or the GPU's weights
 * joins first (rl_offload_join: the checkpoint's take, a download, an
 * upload, the next step's copy of the gradients). Every wait is bounded;
 * the first failure is kept and every later call returns it. */
#ifndef RL_TRAIN_OFFLOAD_H
#define RL_TRAIN_OFFLOAD_H

#include "device.h"

typedef struct rl_offload rl_offload;

/* On the training thread's current GPU: params_dev the model's bf16
 * weights (d->n; with layers its resident part: the embedding, then the
 * head), model_stream the model's cudaStream_t. On failure *out is still
 * to be freed.
 *
 * The gradients: the model (built with rl_gpu_options.grad_slots) writes
 * them region by region into slots this takes down (rl_offload_grad_slot
 * as the model's gradient sink, rl_offload_grad_ready as its hook on every
 * micro-batch): a step's first micro-batch's regions straight into
 * the step's gradients, a later one's into a staging copy added there
 * once the next backward begins (its forward queued and running on the GPU
 * meanwhile) or the step ends (rl_offload_micro_end marks it). So no whole
 * gradient buffer is on the GPU, and the copies down overlap the backward.
 *
 * layers (train.offload "layers"): the model also streams its decoder
 * layers from rl_offload_bf16 (rl_gpu_model_set_host_weights with
 * rl_offload_ready); only the embedding's and the head's weights are
 * copied up after an update. */
int rl_offload_new(rl_train_device *d, void *params_dev, void *model_stream, double timeout_s, bool layers,
                   rl_offload **out, rl_err *e);
/* Waits for a running update; NULL is fine. */
void rl_offload_free(rl_offload *o);
/* The squared norm of the step's gradients (once joined): of this rank's
 * slices, summed over the ranks that share the state. */
int rl_offload_grad_sq(rl_offload *o, double *sq, rl_err *e);
/* Hand over the step's update (joins the last one first): AdamW on the
 * host state with every gradient times scale (clipping). */
int rl_offload_step(rl_offload *o, const rl_train_update *u, double scale, rl_err *e);
/* The update done and every region's copy ordered before the model's
 * stream's next work. */
int rl_offload_join(rl_offload *o, rl_err *e);
/* Seconds the training thread stood blocked on this pipeline (the
 * update's regions, the gradients' copies down) since the last call. */
double rl_offload_host_wait(rl_offload *o);
/* The model's params-wait callback (ctx: the rl_offload): params [0,
 * upto) are about to be read. Errors are kept for the next join. */
void rl_offload_wait(void *ctx, size_t upto);

/* ---- layers -------------------------------------------------------------- */
/* Pinned host bf16 weights (d->n): the update writes them, the model's
 * copies read them. */
const uint16_t *rl_offload_bf16(rl_offload *o);
/* d->params rounded into them (an upload: before the first step, a resume). */
void rl_offload_set_bf16(rl_offload *o);
/* The model's host-weights ready callback: elements [0, upto) updated. */
void rl_offload_ready(void *ctx, size_t upto);

/* ---- the gradients' way down ---------------------------------------------- */
/* The gradient sink and hook (llama_gpu.h's rl_gpu_slot_fn, model.h's
 * rl_grad_ready_fn), and a step's start and a micro-batch's end. */
void rl_offload_grad_slot(void *ctx, size_t off, float *slot);
void rl_offload_grad_ready(void *ctx, size_t off);
void rl_offload_zero(rl_offload *o);
int rl_offload_micro_end(rl_offload *o, rl_err *e);
/* Before a micro-batch: on several ranks the seam (its grad_slot, the
 * hook the trainer passes, its reduced) averages each region in its slot
 * before it goes down, as it leaves the GPU: a later micro-batch's
 * averages are added on the host, a sum of averages being the average of
 * the sums. Alone (dist NULL, or a seam that reduces nothing on one rank)
 * the regions go down as they are. */
int rl_offload_set_dist(rl_offload *o, const rl_train_dist *dist, rl_grad_ready_fn hook, rl_err *e);

/* ---- a node's ranks sharing one host state (train.offload_share) ---------- *
 * The host state (the master, the moments, the bf16 weights: d->params and
 * d->opt point into it) is host_state.h's. rl_offload_share: every rank of
 * dist's round, its state equal to the others' (after the resume); when
 * they all run on this host, rank 0's state becomes everyone's, and from
 * then on each rank updates its slice of every region (rl_host_slice) and
 * a region goes up, or counts as updated for the model's copies and the
 * joins, once every rank's slice is in. *shared false (and *why) when it
 * did not happen: every rank then keeps updating its own copy whole.
 * rl_offload_unshare, before a new round: a private copy again, once
 * every rank's slices of the last update are in (at once after a graceful
 * end of the round); *whole false when they were not within the peer
 * timeout (a rank died in its update: that copy is no replica to continue
 * from). A state of its own (not shared, or sharded) waits for its update
 * to end, and a shard's gathers not yet issued are dropped (the resume
 * uploads the whole weights). */
int rl_offload_share(rl_offload *o, const rl_train_dist *dist, bool *shared, char *why, size_t whyn, rl_err *e);
int rl_offload_unshare(rl_offload *o, bool *whole, rl_err *e);

/* ---- dist.shard across pods (ZeRO-Offload) ----------------------------------- *
 * The device seam has set its shard (d->shard, pkg/ddp's plan over the
 * regions, and the moments d->opt of its ranges; NULL: none): from the
 * next step this rank takes down, updates and copies up only its ranges
 * of each region -- the blocks the seam's reduce-scatter leaves averaged
 * (rl_ddp_opts.host_update) and the tails every rank holds -- its norm is
 * summed over the ranks, and the rest of each region's bf16 weights comes
 * from the other ranks by the seam's gather on the GPU, issued from
 * rl_offload_wait as the forward reaches the region (so every rank issues
 * them in one order, and each join issues the rest). The host keeps the
 * whole fp32 master, current only in this rank's ranges:
 * rl_offload_master gathers the others' (a collective: every rank calls
 * it at the same point) for a checkpoint or a download. Such a host state
 * has no moments of its own and is never shared. */
int rl_offload_set_shard(rl_offload *o, rl_err *e);
int rl_offload_master(rl_offload *o, rl_err *e);

#endif
