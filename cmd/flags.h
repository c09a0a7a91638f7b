/* The command line of the three binaries, parsed one way: "--name VALUE"
 * or "--name=VALUE", booleans as "--name" or "--name=true|false", -h and
 * --help, "--" before arguments that start with '-'. An unknown flag, a
 * missing value or a value out of range is one line on stderr naming the
 * flag, and exit status 2. */
#ifndef RL_CMD_FLAGS_H
#define RL_CMD_FLAGS_H

#include <stdbool.h>

typedef enum { RL_FLAG_STR, RL_FLAG_INT, RL_FLAG_NUM, RL_FLAG_BOOL, RL_FLAG_LIST } rl_flag_kind;

/* RL_FLAG_LIST: a flag that may be given several times (each value kept). */
#define RL_FLAG_LIST_MAX 64
typedef struct rl_flag_list {
    const char *v[RL_FLAG_LIST_MAX];
    int n;
} rl_flag_list;

typedef struct rl_flag {
    const char *name;  /* "--config" */
    const char *alias; /* "-f", or NULL */
    rl_flag_kind kind;
    void *dst;         /* STR: const char **; INT: long long *; NUM: double *; BOOL: bool *;
                          LIST: rl_flag_list * */
    double lo, hi;     /* INT and NUM: the inclusive range */
} rl_flag;

#define RL_FLAGS_HELP (-1)

/* Store one value as flag f would (0, or 2 after saying why): for a flag a
 * caller reads as a string first (--nproc-per-node auto or a number). */
int rl_flag_value(const char *prog, const rl_flag *f, const char *v);

/* Parse argv[first..argc) against flags[0..n). Arguments that are not
 * flags go to pos[0..maxpos) (*npos of them; more is an error, as is any
 * when pos is NULL). Returns 0, RL_FLAGS_HELP for -h/--help, or 2 after
 * saying what is wrong as "<prog>: error: ...". */
int rl_flags_parse(const char *prog, int argc, char **argv, int first, const rl_flag *flags, int n,
                   const char **pos, int maxpos, int *npos);

#endif
