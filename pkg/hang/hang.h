/* hang: a stuck collective found within k x the median step, the rank
 * that stopped named, every rank's records kept, then recovery.
 *
 * Each trainer of a distributed run starts a watch: a thread with its own
 * connection to the round's store. Every RL_HANG_BEAT_S it publishes a
 * heartbeat, <prefix>/hang/beat/<rank>: the newest collective it issued
 * and the newest it completed (comm.h's seq: the same number is the same
 * collective on every rank), its step, pod and node. Rank 0's watch also
 * judges. When one of its collectives has run longer than
 *     deadline = max(dist.hang_min_s, dist.hang_factor x median step)
 * (the median of this run's last RL_HANG_STEPS step times; no verdict
 * before RL_HANG_MIN_STEPS steps, so loading, compiling and resuming are
 * never hangs), it
 *   1. asks every rank for its records (<prefix>/hang/state = "ask <seq>"),
 *   2. waits up to RL_HANG_GATHER_S for the answers
 *      (<prefix>/hang/records/<rank>: the heartbeat plus the records),
 *   3. names the ranks that never entered the stuck collective or stopped
 *      answering, with their pod and node (rl_hang_verdict),
 *   4. writes one JSON dump of every rank's records next to the
 *      checkpoints (<checkpoint.uri>/hangs/r<round>-seq<N>.json; without a
 *      checkpoint store, to the log),
 *   5. tells its agent on the stats pipe (a "hung" line: the progress
 *      Lease's hung annotations, the TrainingJob's Hung condition),
 *   6. and only then sets the state to "abort <seq>", which every watch
 *      answers by aborting its communicator: each trainer's collective
 *      fails at once and the trainer ends as infrastructure (peer lost),
 *      long before dist.timeout_s.
 * (The state's third verb, "recheck", is the pre-flight's: see below.)
 * A rank whose whole process stopped (SIGSTOP, a wedged driver) answers
 * nothing: its last heartbeat speaks for it. When that rank is rank 0,
 * the deputy judges instead -- the first rank of the second node (rank 1
 * on one node), whose agent also writes to the progress Lease -- once its
 * own collective is past its own deadline and rank 0's heartbeat has not
 * changed for that long plus RL_HANG_GATHER_S + 1 s (a live rank 0 asks
 * first; judged on the deputy's own clock, so clock skew between nodes
 * does not matter); the protocol is the same, with the deputy asking.
 * The store must outlive rank 0: it does under an agent or the launcher,
 * not when rank 0 hosts it itself (a torchrun-style launch by hand). Every RL_HANG_PACE_S rank 0
 * also reads every heartbeat's pace and, when the stragglers change,
 * logs them and tells its agent (a "pace" line: ringleader_straggler
 * {rank,pod,node}, the progress Lease, status.stragglers). Judging from rank 0 alone is
 * enough: every collective includes rank 0, so a stuck one stalls it too.
 *
 * The deciding (deadline, stuck op, verdict) and the wire format are pure
 * functions below; the watch (watch.c) is the I/O around them. */
#ifndef RL_HANG_H
#define RL_HANG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "comm/comm.h"
#include "metrics/metrics.h"
#include "util/util.h"

#define RL_HANG_BEAT_S 0.5    /* heartbeat period; also how often a watch looks at the state */
#define RL_HANG_TICK_S 0.1    /* rank 0's judging period */
#define RL_HANG_GATHER_S 1.5  /* rank 0 waits this long for every rank's records */
#define RL_HANG_STEPS 32      /* the median is over this many recent steps */
#define RL_HANG_MIN_STEPS 3   /* ... and needs this many */
#define RL_HANG_PACE_S 5.0    /* rank 0 looks for stragglers this often */
#define RL_HANG_SLOW_MAX 4    /* stragglers named at most (the rest counted) */

/* ---- deciding (pure) ---------------------------------------------------------------------- */
/* The deadline for steps[0..n) (seconds, any order; non-positive and NaN
 * ignored): max(min_s, factor x median); 0 when there are fewer than
 * RL_HANG_MIN_STEPS usable steps or factor is 0 (no judging). */
double rl_hang_deadline(const double *steps, int n, double factor, double min_s);
/* The oldest record not yet done that was issued deadline or more before
 * now; NULL when none (or deadline <= 0). */
const rl_comm_record *rl_hang_stuck(const rl_comm_record *r, int n, double now, double deadline);

/* What one rank said about itself: its heartbeat, or its answer to "ask". */
typedef struct rl_hang_rank {
    int rank;
    bool seen;          /* a heartbeat arrived */
    bool answered;      /* it answered the ask (its records are current) */
    uint64_t issued;    /* newest seq issued (0: none) */
    uint64_t done;      /* newest seq returned */
    char op[16];        /* the op of `issued` */
    long long step;     /* optimizer steps done */
    double busy_total;  /* busy seconds over its busy_steps steps so far (see stragglers) */
    double busy_steps;
    double busy_s;      /* its pace, as rank 0 judges it (not on the wire); <= 0 unknown */
    double shm_bytes;   /* pre-flight: free bytes of its /dev/shm; <= 0 unknown */
    double copy_gbps;   /* pre-flight: its memory copy bandwidth, GB/s; <= 0 unknown */
    double net_gbps;    /* pre-flight: how fast the network brought data into its node, GB/s, from
                           the first rank of each node (rl_comm_link_probe); <= 0 unknown */
    bool net_pending;   /* ... still measuring it (the judge may wait for it) */
    bool rechecked;     /* shm and copy are its second measurement, asked for by rank 0 */
    bool passed_first;  /* rank 0's first figures did not name it: its recheck does not either by
                           copy or shm (not on the wire; they still count in the medians) */
    double unix_time;   /* when it said so */
    char pod[64], node[64];
} rl_hang_rank;

/* Who is to blame for seq: the ranks that never entered it (answered,
 * issued < seq) and those that stopped answering, each with pod, node and
 * what they last said; the others are waiting in it. One sentence, e.g.
 *   rank 1 (pod llama-1, node gpu-12) stopped responding in allreduce #1580
 *   (last heartbeat 2.1 s ago)
 * (at most 4 ranks named, then "and N more"), or, when every rank entered
 * it, that none finished (a network or backend fault). Returns the number
 * of ranks blamed. ranks[i] is rank i; now_unix judges heartbeat ages. */
int rl_hang_verdict(const rl_hang_rank *ranks, int world, uint64_t seq, const char *op, double now_unix,
                    char *out, size_t n);

/* Stragglers. In data parallelism every rank's step takes as long as the
 * slowest rank's: the others wait for it in the collectives. So a rank's
 * pace is its busy time per step -- the wall time from its previous step's
 * end to this one's, less what the step waited for the gradient reduction
 * after backward -- as a mean over the last two RL_HANG_PACE_S periods
 * (heartbeats carry running totals; rank 0 takes differences). A mean over
 * time, not a median over steps: a CPU quota stalls a rank for tens of
 * milliseconds in some steps and not others, which a median would not
 * see, while one slow step (a checkpoint) is small against 10 s. A
 * straggler's pace is above factor x the median pace of all ranks that
 * have one (at least 3 of them: with two, neither is "the median").
 * Fills slow[] (ranks, slowest first, at most max) and one sentence
 * ("rank 2 (pod p, node n) is a straggler: 3.1x the median busy time per
 * step (0.412 s vs 0.133 s)"; "" when none); returns how many there are. */
typedef struct rl_hang_slow {
    int rank;
    double ratio; /* its pace / the median pace */
} rl_hang_slow;
int rl_hang_stragglers(const rl_hang_rank *ranks, int world, double factor, rl_hang_slow *slow, int max, char *out,
                       size_t n);

/* Pre-flight. Before its first step every rank measures its node (see
 * rl_hang_measure): the free bytes of /dev/shm, where same-host ring links
 * move their data, and its memory copy bandwidth; and the first rank of
 * each node its network link in (net_gbps). They travel in its
 * heartbeats; once every rank has sent them (or RL_HANG_PREFLIGHT_S has
 * passed), rank 0 names the ranks below min_ratio x the median of any
 * ("rank 2 (pod p, node n): copy 1.2 GB/s, 0.30x the median 4.0 GB/s";
 * "" when none) and returns how many. Ranks of one node share /dev/shm,
 * so the size mostly tells nodes apart; a 2-rank job compares with the
 * mean of the two. The network figure is a node's: a slow NIC slows the
 * link into its node and the one out of it, which the next node measured,
 * while each neighbour has one good link; so a node counts the better of
 * its two links (rl_hang_node_net), and a slow node is below while its
 * neighbours are not. ratio (world of them, may be NULL): each rank's
 * lowest figure over its median (1 when none is below).
 * A verdict that names a rank, or that lacks a rank's figures at its
 * deadline (RL_HANG_PREFLIGHT_S: a starved node may not report in
 * time), is confirmed before it is reported; such a rank is a suspect as
 * one named. Rank 0
 * logs preflight_recheck and waits RL_HANG_RECHECK_STEPS steps (at most
 * RL_HANG_PREFLIGHT_S): by then a rank that came late has caught up and
 * every rank is in the steps' rhythm, so all are under the same load.
 * It then sets <prefix>/hang/state to "recheck 1 0", every rank measures
 * its node again (`rechecked` in its heartbeats), and rank 0 judges
 * those second figures (waiting at most RL_HANG_RECHECK_S for them):
 * copy and /dev/shm name only ranks the first figures named too
 * (passed_first); the network figure, measured once (a collective),
 * is judged as it stands, also when it arrived after the first. A copy
 * is wall-clock time: a node starved for a moment (the round's processes
 * starting beside it on a loaded host) once measured 0.19x the median
 * and was benched for 10 minutes, and on an oversubscribed host any
 * one measurement can be low; a node that is slow or throttled is slow
 * twice. */
#define RL_HANG_PREFLIGHT_S 10.0
#define RL_HANG_RECHECK_STEPS 3
#define RL_HANG_RECHECK_S 5.0
int rl_hang_preflight(const rl_hang_rank *ranks, int world, double min_ratio, char *out, size_t n, double *ratio);
/* net[r]: the better of the link into rank r's node (its own net_gbps)
 * and the link out of it (the next measuring rank's, around the ring);
 * 0 for a rank that measured nothing, and for all when fewer than 3 nodes
 * measured (with 2, both links join both nodes: neither can be told). */
void rl_hang_node_net(const rl_hang_rank *ranks, int world, double *net);
/* This node's pre-flight numbers (a statvfs and ~0.1 s of copying). */
void rl_hang_measure(double *shm_bytes, double *copy_gbps);

/* ---- the wire (store values; parsers take untrusted bytes) --------------------------------- */
/* A heartbeat, or with records (n > 0, records' times are rl_now() of this
 * process, written as unix times) an answer; malloc'd JSON, NULL on no
 * memory. */
char *rl_hang_rank_json(const rl_hang_rank *r, const rl_comm_record *rec, int n, double now, double now_unix);
/* Reads the heartbeat fields of either (RL_EINPUT naming `what` when it is
 * not one); the records stay in the text, for the dump. */
int rl_hang_rank_parse(const char *text, size_t len, const char *what, rl_hang_rank *out, rl_err *e);

/* ---- the watch (watch.c) ------------------------------------------------------------------ */
typedef struct rl_hang_watch rl_hang_watch;
typedef struct rl_hang_watch_opts {
    rl_comm *comm;            /* the communicator it watches and aborts */
    int rank, world;
    const char *store_host;   /* the round's store */
    int store_port;
    const char *secret;       /* the job's rendezvous secret (NULL: none) */
    const char *prefix;       /* the round's key prefix ("r3") */
    const char *pod, *node;   /* where this rank runs (NULL: unknown) */
    double factor, min_s;     /* dist.hang_factor, dist.hang_min_s */
    double straggler_factor;  /* dist.straggler_factor (0: no straggler judging) */
    double preflight_min_ratio; /* dist.preflight_min_ratio (0: no pre-flight judging) */
    double shm_bytes, copy_gbps; /* this rank's pre-flight (rl_hang_measure; 0: unknown) */
    bool net_pending;         /* this rank measures the network into its node after the watch
                                 starts (rl_hang_watch_set_net) */
    double timeout_s;         /* the store client's bound (at most 5 s is used) */
    bool deputy;              /* judges when rank 0 stopped (see above) */
    const rl_ckpt_config *ckpt; /* rank 0 / deputy: where the dump goes (NULL or uri "": the log) */
    /* rank 0: a hung or pace stats line for its agent (called from the
     * watch's thread; NULL: only logged) */
    void (*report)(void *ud, const rl_stats_msg *m);
    void *report_ud;
} rl_hang_watch_opts;
/* Starts the thread (it connects on its own; a store it cannot reach is
 * logged and the watch idles: hangs are then left to dist.timeout_s).
 * Both factors 0, or world 1: *out is NULL, nothing runs. */
int rl_hang_watch_start(const rl_hang_watch_opts *o, rl_hang_watch **out, rl_err *e);
/* A step finished (the training thread, via its observer): its wall time
 * and how long it waited for the gradient reduction after backward
 * (< 0: unknown). NULL is fine. */
void rl_hang_watch_step(rl_hang_watch *w, long long step, double step_s, double wait_s);
/* The pre-flight's network figure, once measured (0: none came); the
 * heartbeats carry it from then on. NULL w: nothing. */
void rl_hang_watch_set_net(rl_hang_watch *w, double gbps);
/* Stops and joins the thread (a dump in progress finishes, bounded by the
 * store's and the checkpoint store's timeouts). failed: the run failed,
 * so a rank but 0 looks at the state once more first (a peer's abort
 * reaches its ring before its next look). True when the watch aborted the
 * communicator, with the verdict in why. NULL is fine (false). */
bool rl_hang_watch_stop(rl_hang_watch *w, bool failed, char *why, size_t n);

#endif
