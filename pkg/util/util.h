/* util: errors, JSON-lines logging, time, deterministic RNG; config
 * descriptors in cfg.h. Everything else in pkg/ builds on these, so they
 * stay small and dependency-free (cJSON only for the config tables). */
#ifndef RL_UTIL_H
#define RL_UTIL_H

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- errors --------------------------------------------------------------
 * Every fallible function returns 0 or one of these codes and, on failure,
 * fills an rl_err with one line a user can act on (naming the field or file).
 * RL_EINPUT means "the user gave us something wrong"; the code picks the
 * exit status and so the failure class (below). */
enum {
    RL_OK = 0,
    RL_EINPUT = 2,   /* bad config, bad file, bad flag: exit 2 */
    RL_EIO = 3,      /* I/O failed on something that was valid */
    RL_ENOMEM = 4,
    RL_ETIMEOUT = 5, /* a bounded wait ran out */
    RL_EPEER = 6,    /* a peer failed or went away */
    RL_EABORT = 7,   /* stopped on request (signal, round change) */
    RL_EINTERNAL = 8,
};

typedef struct rl_err {
    int code;
    char msg[512];
} rl_err;

/* Fill *e (if non-NULL) and return code, so callers can write
 * `return rl_errf(e, RL_EINPUT, "...")`. */
int rl_errf(rl_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepend context ("reading x: " + old message), keeping the code. */
int rl_err_wrap(rl_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *rl_err_name(int code);
/* Control characters (and DEL) in the message become '?': for messages
 * that quote an untrusted file's strings, which must stay one line. */
void rl_err_one_line(rl_err *e);

/* ---- why a process ended: exit statuses and their failure classes --------
 * The worker says why it ends in its exit status (and its termination
 * message, "<class name>: <message>"); its node agent, the round
 * coordinator and the operator read the class from the status alone, so
 * these numbers are the one contract between them:
 *   0   done: the whole job finished
 *   2   user error: bad config, data or code path; retrying cannot help, so
 *       the job fails at once (never retried)
 *   75  preempted: stopped on SIGTERM with a committed checkpoint (75 is
 *       EX_TEMPFAIL of sysexits.h); 128+SIGTERM and 128+SIGINT are stops too
 *   76  a peer failed (a collective broke or timed out): that peer's own
 *       status says why; infrastructure here
 *   77  infrastructure on this node: the network, storage or the device
 *       failed on something valid (I/O errors, CUDA faults, timeouts)
 * anything else (1, a signal: a bug, an assertion, out of memory inside
 * the process) is a crash: retried, counted against the restart limit. The
 * operator adds what only Kubernetes sees: OOMKilled (the kernel's OOM
 * killer, often a neighbour's fault on a shared node) is infrastructure,
 * an eviction or node shutdown a preemption. Allocation failures the
 * process sees itself (RL_ENOMEM: a model or batch too big for the device)
 * stay crashes, so a job that cannot fit runs out of restarts instead of
 * retrying for ever. */
#define RL_EXIT_USER 2
#define RL_EXIT_PREEMPTED 75
#define RL_EXIT_PEER_LOST 76
#define RL_EXIT_INFRA 77

/* How often the waits that take a cancel flag (a const volatile int * set
 * by another thread: rl_store_set_cancel, rl_comm_opts.cancel) look at it. */
#define RL_CANCEL_SLICE_S 0.1
typedef enum {
    RL_FAIL_NONE = 0,   /* exit 0 */
    RL_FAIL_USER,       /* fail the job now */
    RL_FAIL_INFRA,      /* replace, do not count */
    RL_FAIL_PREEMPTION, /* replace, do not count */
    RL_FAIL_CRASH,      /* replace, count against the restart limit */
} rl_fail_class;
/* Exit status for a cmd/ main from an error code: 0, 2 (RL_EINPUT), 77
 * (RL_EIO, RL_ETIMEOUT), else 1. RL_EPEER stays 1: at the top of a process
 * it means the job failed (a trainer crashed, the restart limit ran out);
 * a trainer whose peer failed says 76 itself (cmd/worker). */
int rl_err_exit_status(int code);
/* The class of an exit status (0..255; a death by signal N is 128 + N). */
rl_fail_class rl_exit_class(int status);
/* "UserError", "Infrastructure", "Preemption", "Crash" ("" for NONE): the
 * termination message's prefix, the operator's condition reasons. */
const char *rl_fail_class_name(rl_fail_class c);
/* The inverse (RL_FAIL_CRASH for a name it does not know). */
rl_fail_class rl_fail_class_parse(const char *name);
/* A message "<class name>: <why>": *cls gets its class and the result
 * points at <why>; without a known class prefix, RL_FAIL_CRASH and msg. */
const char *rl_fail_message_split(const char *msg, rl_fail_class *cls);

/* ---- logging (JSON lines on stderr) ---------------------------------------- */
typedef enum { RL_LOG_DEBUG = 0, RL_LOG_INFO, RL_LOG_WARN, RL_LOG_ERROR } rl_log_level;

/* rank < 0: no rank field. Reads RL_LOG_LEVEL (debug|info|warn|error). */
void rl_log_init(int rank);
/* A trainer's logging as rank `rank`: rl_log_init, and warnings and errors
 * only unless it is rank 0 (progress and metrics come from rank 0 alone).
 * Again when a parked trainer takes another rank. */
void rl_log_rank(int rank);
void rl_log_set_level(rl_log_level lvl);
bool rl_log_enabled(rl_log_level lvl);
/* fields: printf format producing zero or more JSON members without braces,
 * e.g. "\"step\":%d,\"loss\":%.4f". Strings must be escaped by the caller
 * (rl_json_escape) or passed through rl_log_msg. One write() per line. */
void rl_log(rl_log_level lvl, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));
void rl_log_msg(rl_log_level lvl, const char *event, const char *msg);
/* Escape src as the inside of a JSON string into dst (always terminated;
 * truncated if needed). Returns dst. */
char *rl_json_escape(char *dst, size_t n, const char *src);

/* ---- time ------------------------------------------------------------------ */
double rl_now(void);      /* monotonic seconds */
double rl_wall_now(void); /* unix seconds */
/* pthread_cond_timedwait for up to s seconds (spurious wake-ups possible:
 * callers loop on their condition and their own deadline). */
void rl_cond_wait_s(pthread_cond_t *cv, pthread_mutex_t *mu, double s);

/* ---- deterministic RNG (xoshiro256**, seeded by splitmix64) --------------- */
typedef struct rl_rng {
    uint64_t s[4];
} rl_rng;
void rl_rng_seed(rl_rng *r, uint64_t seed);
uint64_t rl_rng_u64(rl_rng *r);
double rl_rng_uniform(rl_rng *r); /* [0, 1) */
double rl_rng_normal(rl_rng *r);  /* N(0, 1) */
uint64_t rl_splitmix64(uint64_t *state);
uint64_t rl_hash64(uint64_t x); /* a good 64-bit mixer (stateless) */

/* ---- big-endian wire integers (store frames, ring headers) --------------- */
static inline void rl_put_be16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v; }
static inline void rl_put_be32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static inline void rl_put_be64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static inline uint16_t rl_get_be16(const uint8_t *p) { return (uint16_t)((unsigned)p[0] << 8 | p[1]); }
static inline uint32_t rl_get_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static inline uint64_t rl_get_be64(const uint8_t *p) {
    return (uint64_t)rl_get_be32(p) << 32 | rl_get_be32(p + 4);
}

/* ---- base64 (standard alphabet, padded) ------------------------------------ */
/* malloc'd, NUL-terminated; NULL when out of memory. */
char *rl_base64_encode(const void *data, size_t n);
/* Strict: length a multiple of 4, padding only at the end, the unused bits
 * of the last group zero (the one form encoders write). skip_space ignores
 * ASCII whitespace first (kubeconfig data may be wrapped). *out is malloc'd
 * and NUL-terminated. 0, or -1 (not base64, or out of memory). */
int rl_base64_decode(const char *s, size_t n, bool skip_space, char **out, size_t *out_len);

/* ---- the environment --------------------------------------------------------
 * Packages that parse environment variables (torchrun's RANK, ...) take
 * the lookup from cmd/, the one reader of the process environment: getenv,
 * or a table in tests. NULL from it: not set. */
typedef char *(*rl_env_lookup)(const char *name); /* getenv's type */

/* ---- memory pages ---------------------------------------------------------- */
/* Zero [p, p + bytes) of private anonymous memory (malloc'd or mmap'd) and
 * give the whole pages inside it back to the kernel (madvise
 * MADV_DONTNEED: they read zero and take no memory until written again);
 * the partial pages at its ends are memset, so bytes beside the span are
 * untouched and may be in use by other threads. */
void rl_mem_zero_release(void *p, size_t bytes);
/* Bytes of the pages overlapping [p, p + bytes) that are resident in
 * memory now (mincore), whole pages; 0 for an empty span. */
size_t rl_mem_resident(const void *p, size_t bytes);

/* ---- this host ------------------------------------------------------------- */
/* "<boot_id>/<hostname>" into out (n >= 136 holds any): equal in two
 * processes only when they run on one booted kernel under one host name
 * (one pod, or one machine); "" when either is unknown. */
void rl_host_identity(char *out, size_t n);

/* ---- CPUs ------------------------------------------------------------------ */
/* CPU sets (sched.h's cpu_set_t). A Linux cpulist -- "0-3,8,10-11", as
 * sysfs writes a NUMA node's, a newline after it -- into *set: the number
 * of CPUs (0 for an empty list), or -1 for anything else, a CPU beyond
 * CPU_SETSIZE included. */
int rl_cpulist_parse(const char *s, cpu_set_t *set);
/* Slice `index` of `share` slices, in CPU order and as near equal as the
 * count allows, of the CPUs in both a and b into *out: its count, 0 where
 * none is left for it. */
int rl_cpuset_slice(const cpu_set_t *a, const cpu_set_t *b, int share, int index, cpu_set_t *out);

/* ---- files ----------------------------------------------------------------- */
/* Read a whole file (NUL-terminated for convenience). */
int rl_read_file(const char *path, char **out, size_t *len, rl_err *e);

/* Write atomically: temp file in the same directory, fsync, rename. */
int rl_write_file_atomic(const char *path, const void *data, size_t len, rl_err *e);
/* Every missing directory of path, with mode (less the umask). */
int rl_mkdirs(const char *path, mode_t mode, rl_err *e);

#endif
