/* Internal to pkg/rdzv (and its tests): the coordinator's decisions as
 * pure functions. round.c observes the store and the Service, these
 * decide, round.c acts (writes the table or the end). Nothing here does
 * I/O or reads a clock. */
#ifndef RL_RDZV_ROUND_INTERNAL_H
#define RL_RDZV_ROUND_INTERNAL_H

#include "rdzv/rdzv.h"

/* Is id among nodes[0..n)? */
bool rl_round_has(const rl_round_node *nodes, int n, const char *id);

/* Gathering: close the open round now? nj nodes joined (sorted or not);
 * waited_s: how long at least min_nodes have been in (< 0: not yet).
 * expect/nexpect: a new leader's first round waits for exactly these
 * (nexpect < 0: for every live peer of the Service instead). */
bool rl_round_gathered(const rl_round_opts *o, const rl_round_node *joined, int nj, double waited_s,
                       const rl_peer *peers, int np, bool synced, const rl_round_node *expect,
                       int nexpect);

/* Topology: ranks follow nodes in (zone, rack, id) order, so the ring
 * enters and leaves each zone once, and each rack within it once -- the
 * fewest crossing edges a ring can have at both levels (none with one
 * zone, k with k > 1). Unknown zones and racks ("") sort first. */
int rl_round_node_cmp(const rl_round_node *a, const rl_round_node *b);
void rl_round_order(rl_round_node *nodes, int n);
/* Ring edges (i -> i+1, the last back to the first) between zones, and
 * between racks (a different zone or rack: leaving a rack). */
int rl_round_zone_crossings(const rl_round_node *nodes, int n);
int rl_round_rack_crossings(const rl_round_node *nodes, int n);

/* What the coordinator keeps about a running round between looks. */
typedef struct rl_round_member {
    rl_round_node node;
    int64_t hb;     /* last heartbeat counter seen */
    double hb_time; /* when it last changed */
    bool listed;    /* seen in the Service during this round: only then can it
                       leave (a pod's endpoint may lag its join) */
} rl_round_member;

/* A node the pre-flight found degraded, out of the rounds until `until`. */
typedef struct rl_round_bench {
    char id[254];
    double until;
} rl_round_bench;

/* The joined nodes a round places, in place at the front of joined: those
 * not on the bench (until > now), unless that leaves fewer than
 * min_nodes -- the job's size comes first, and then nobody is left out.
 * The benched ones follow, as standbys; returns how many are placed. */
int rl_round_place(const rl_round_opts *o, rl_round_node *joined, int nj, const rl_round_bench *bench, int nbench,
                   double now);

typedef struct rl_round_watch {
    const rl_round_opts *o;
    rl_round_member *m; /* the round's members, by node id */
    int nm;
    /* benched nodes waiting as standbys (not growth until their time is up) */
    const rl_round_bench *standby;
    int nstandby;
    bool degraded_judged;        /* this round's pre-flight report was judged */
    rl_round_degraded benched;   /* out: the members a NEXT leaves out (n 0: none) */
    int64_t joins;       /* joins the table was made from */
    int64_t events_seen; /* the members' report counter, as last read */
    uint64_t ver_seen;   /* the Service's version, as last judged */
} rl_round_watch;

/* After a round that lost a member (not a graceful one): close the next
 * as soon as min_nodes joined and every member of the last round either
 * joined or has been silent -- its heartbeat on the last round unchanged --
 * for RL_ROUND_SILENT_S. A dead node's pod can stay in the Service (or
 * its etcd key alive) for many seconds; waiting the last call for it is
 * what made a lost node cost 10 s. A survivor slower than that joins late
 * and grows the job at the next round. prev: the last round's members with
 * their heartbeats; now: the clock of prev's hb_time. */
#define RL_ROUND_SILENT_S 2.0
bool rl_round_survivors_in(const rl_round_opts *o, const rl_round_node *joined, int nj,
                           const rl_round_member *prev, int nprev, double now);

/* One look at a running round: each member's heartbeat counter and, when
 * the report counter moved (events != events_seen), each member's failure
 * report (NULL: none) and whether it finished; the Service; the joins. */
typedef struct rl_round_look_member {
    int64_t hb;
    const char *fail;  /* "<class name>: <reason>" */
    rl_fail_class cls; /* fail's class */
    bool done;
} rl_round_look_member;

typedef struct rl_round_look {
    double now;
    const rl_round_look_member *m; /* nm of them */
    int64_t events;
    const rl_peer *peers;
    int np;
    bool synced;
    uint64_t ver;
    int64_t joins;
    const rl_round_degraded *degraded; /* the pre-flight's report (NULL: none yet) */
} rl_round_look;

/* RUNNING, or how the round ends: NEXT (a member lost, failed or leaving,
 * or a node that can grow the job: *graceful then), COMPLETE, or FAILED --
 * only for a member's user error -- with the reason. Updates w (heartbeat
 * times, who was listed, what was seen). */
rl_round_state rl_round_judge(rl_round_watch *w, const rl_round_look *l, bool *graceful, char *reason,
                              size_t rn);
/* A NEXT when the job's trainer crashes exceed the limit is FAILED; the
 * reason then says so and keeps the last one. */
rl_round_state rl_round_limit(rl_round_state st, int64_t crashes, int max_restarts, char *reason, size_t rn);

#endif
