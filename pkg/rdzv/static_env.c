/* Static rendezvous: the job's shape read from the environment that
 * torchrun, Kubeflow's PyTorchJob and SLURM already provide. Every message
 * names the variable, because a wrong launcher setting is the usual cause
 * and the variable is what the user will grep for. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/rdzv.h"

/* Value quoted in messages: bounded, one line. */
static const char *shown(const char *v, char *buf, size_t n) {
    size_t o = 0, max = n - 4; /* room for "..." and the NUL (n is always >= 8) */
    for (; *v && o < max; v++) buf[o++] = isprint((unsigned char)*v) ? *v : '?';
    if (*v) memcpy(buf + o, "...", 3), o += 3;
    buf[o] = '\0';
    return buf;
}

/* Strict decimal integer in [lo, hi]: no spaces, no trailing junk. */
static int parse_int(const char *name, const char *v, long lo, long hi, int *out, rl_err *e) {
    char b[64];
    errno = 0;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (!*v || isspace((unsigned char)*v) || *end || errno == ERANGE)
        return rl_errf(e, RL_EINPUT, "%s: '%s' is not an integer", name, shown(v, b, sizeof b));
    if (x < lo || x > hi)
        return rl_errf(e, RL_EINPUT, "%s=%ld is outside %ld..%ld", name, x, lo, hi);
    *out = (int)x;
    return RL_OK;
}

static int copy_host(const char *name, const char *v, char *out, size_t n, rl_err *e) {
    char b[64];
    size_t len = strlen(v);
    if (len == 0) return rl_errf(e, RL_EINPUT, "%s is empty", name);
    if (len >= n)
        return rl_errf(e, RL_EINPUT, "%s: '%s' is longer than %zu characters", name,
                       shown(v, b, sizeof b), n - 1);
    for (size_t i = 0; i < len; i++)
        if (!isgraph((unsigned char)v[i]))
            return rl_errf(e, RL_EINPUT, "%s: '%s' is not a host name", name,
                           shown(v, b, sizeof b));
    memcpy(out, v, len + 1);
    return RL_OK;
}

static bool loopback_only(const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0) return false; /* the bind will say why */
    bool loop = true;
    for (const struct addrinfo *a = ai; a && loop; a = a->ai_next) {
        if (a->ai_family == AF_INET)
            loop = (ntohl(((const struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            loop = IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
    }
    freeaddrinfo(ai);
    return loop;
}

bool rl_static_store_host(const char *master_addr, bool one_node, char *out, size_t n) {
    bool every = !one_node && loopback_only(master_addr);
    snprintf(out, n, "%s", one_node ? "127.0.0.1" : every ? "0.0.0.0" : master_addr);
    return every;
}

/* ---- SLURM node lists ---------------------------------------------------------------- */
static int nodelist_err(rl_err *e, const char *list, const char *why) {
    char b[80];
    return rl_errf(e, RL_EINPUT, "SLURM node list '%s': %s", shown(list, b, sizeof b), why);
}

static bool host_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_'; }

/* Checks "01-04,7" up to the closing bracket; on success *first_lo/len
 * is the first number as written (zero padding kept) and *end the ']'. */
static int check_range(const char *list, const char *p, const char **end, const char **first,
                       size_t *flen, rl_err *e) {
    *first = NULL;
    for (;;) {
        const char *a = p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == a) return nodelist_err(e, list, "a range needs a number after '[' or ','");
        if (!*first) *first = a, *flen = (size_t)(p - a);
        if (*p == '-') {
            const char *b = ++p;
            while (isdigit((unsigned char)*p)) p++;
            if (p == b) return nodelist_err(e, list, "a range needs a number after '-'");
            /* Compare as numbers without overflow: strip zeros, then by length. */
            const char *x = a, *y = b;
            while (*x == '0' && isdigit((unsigned char)x[1])) x++;
            while (*y == '0' && isdigit((unsigned char)y[1])) y++;
            size_t xl = strspn(x, "0123456789"), yl = strspn(y, "0123456789");
            if (xl > yl || (xl == yl && memcmp(x, y, xl) > 0))
                return nodelist_err(e, list, "a range runs backwards");
        }
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']') break;
        if (*p == '[') return nodelist_err(e, list, "nested '['");
        if (!*p) return nodelist_err(e, list, "unbalanced '['");
        return nodelist_err(e, list, "unexpected character in a range");
    }
    *end = p;
    return RL_OK;
}

int rl_slurm_first_host(const char *nodelist, char *out, size_t n, rl_err *e) {
    if (n) out[0] = '\0';
    if (!nodelist || !*nodelist) return rl_errf(e, RL_EINPUT, "SLURM node list is empty");
    /* Validate the whole list (so that garbage is never half-accepted) and
     * build the first host: literal parts plus the first number of each
     * bracket group of the first item ("rack[1-2]-n[01-04]" -> "rack1-n01"). */
    char host[256];
    size_t hl = 0;
    bool first_item = true, item_empty = true, too_long = false;
    for (const char *p = nodelist;; p++) {
        if (*p == ',' || *p == '\0') {
            if (item_empty) return nodelist_err(e, nodelist, "empty host name");
            if (*p == '\0') break;
            first_item = false, item_empty = true;
            continue;
        }
        if (*p == ']') return nodelist_err(e, nodelist, "unbalanced ']'");
        if (*p == '[') {
            const char *end = p, *num = p;
            size_t nl = 0;
            int rc = check_range(nodelist, p + 1, &end, &num, &nl, e);
            if (rc != RL_OK) return rc;
            if (first_item) {
                if (hl + nl >= sizeof host) too_long = true;
                else memcpy(host + hl, num, nl), hl += nl;
            }
            p = end;
            item_empty = false;
            continue;
        }
        if (!host_char(*p)) return nodelist_err(e, nodelist, "unexpected character");
        if (first_item) {
            if (hl + 1 >= sizeof host) too_long = true;
            else host[hl++] = *p;
        }
        item_empty = false;
    }
    if (too_long || hl >= n) return nodelist_err(e, nodelist, "first host name is too long");
    memcpy(out, host, hl);
    out[hl] = '\0';
    return RL_OK;
}

/* ---- trainer environment ------------------------------------------------------------- */
static int need(rl_env_lookup L, const char *name, const char *because, const char **v, rl_err *e) {
    *v = L(name);
    if (!*v) return rl_errf(e, RL_EINPUT, "%s is not set (%s)", name, because);
    return RL_OK;
}

/* The first count of SLURM_TASKS_PER_NODE ("4(x2),3" -> 4), or the count
 * of this node (SLURM_NODEID) when that is known. */
static int tasks_per_node(const char *v, int node, int *out, rl_err *e) {
    const char *name = "SLURM_TASKS_PER_NODE";
    char b[64];
    const char *p = v;
    int idx = 0;
    for (;;) {
        char *end;
        errno = 0;
        long c = strtol(p, &end, 10);
        if (end == p || !isdigit((unsigned char)*p) || errno == ERANGE || c < 1 || c > INT_MAX)
            break;
        long rep = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') break;
            const char *q = p + 2;
            errno = 0;
            rep = strtol(q, &end, 10);
            if (end == q || !isdigit((unsigned char)*q) || errno == ERANGE || rep < 1 || *end != ')')
                break;
            p = end + 1;
        }
        if (node >= idx && (long)(node - idx) < rep) {
            *out = (int)c;
            return RL_OK;
        }
        idx += rep > INT_MAX - idx ? INT_MAX - idx : (int)rep;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\0')
            return rl_errf(e, RL_EINPUT, "%s='%s' has no entry for SLURM_NODEID=%d", name,
                           shown(v, b, sizeof b), node);
        break;
    }
    return rl_errf(e, RL_EINPUT, "%s: '%s' is not a task count list like '4(x2),3'", name,
                   shown(v, b, sizeof b));
}

static int check_consistent(const rl_static_env *x, const char *rank_n, const char *world_n,
                            const char *lrank_n, const char *lworld_n, rl_err *e) {
    if (x->rank >= x->world)
        return rl_errf(e, RL_EINPUT, "%s=%d is not below %s=%d", rank_n, x->rank, world_n,
                       x->world);
    if (x->local_rank >= x->local_world)
        return rl_errf(e, RL_EINPUT, "%s=%d is not below %s=%d", lrank_n, x->local_rank,
                       lworld_n, x->local_world);
    if (x->local_world > x->world)
        return rl_errf(e, RL_EINPUT, "%s=%d is above %s=%d", lworld_n, x->local_world, world_n,
                       x->world);
    return RL_OK;
}

static int read_torchrun(rl_env_lookup L, rl_static_env *x, rl_err *e) {
    static const char *why = "the torchrun form needs RANK, WORLD_SIZE, LOCAL_RANK, "
                             "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT";
    const char *v;
    int rc;
    if ((rc = need(L, "RANK", why, &v, e)) || (rc = parse_int("RANK", v, 0, INT_MAX, &x->rank, e)))
        return rc;
    if ((rc = need(L, "WORLD_SIZE", why, &v, e)) ||
        (rc = parse_int("WORLD_SIZE", v, 1, INT_MAX, &x->world, e)))
        return rc;
    if ((rc = need(L, "LOCAL_RANK", why, &v, e)) ||
        (rc = parse_int("LOCAL_RANK", v, 0, INT_MAX, &x->local_rank, e)))
        return rc;
    if ((rc = need(L, "LOCAL_WORLD_SIZE", why, &v, e)) ||
        (rc = parse_int("LOCAL_WORLD_SIZE", v, 1, INT_MAX, &x->local_world, e)))
        return rc;
    if ((rc = need(L, "MASTER_ADDR", why, &v, e)) ||
        (rc = copy_host("MASTER_ADDR", v, x->master_addr, sizeof x->master_addr, e)))
        return rc;
    if ((rc = need(L, "MASTER_PORT", why, &v, e)) ||
        (rc = parse_int("MASTER_PORT", v, 1, 65535, &x->master_port, e)))
        return rc;
    snprintf(x->source, sizeof x->source, "torchrun");
    return check_consistent(x, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", e);
}

static int read_slurm(rl_env_lookup L, rl_static_env *x, rl_err *e) {
    static const char *why = "the SLURM form needs SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, "
                             "tasks per node and a node list";
    const char *v;
    int rc;
    if ((rc = need(L, "SLURM_PROCID", why, &v, e)) ||
        (rc = parse_int("SLURM_PROCID", v, 0, INT_MAX, &x->rank, e)))
        return rc;
    if ((rc = need(L, "SLURM_NTASKS", why, &v, e)) ||
        (rc = parse_int("SLURM_NTASKS", v, 1, INT_MAX, &x->world, e)))
        return rc;
    if ((rc = need(L, "SLURM_LOCALID", why, &v, e)) ||
        (rc = parse_int("SLURM_LOCALID", v, 0, INT_MAX, &x->local_rank, e)))
        return rc;
    const char *lw_name = "SLURM_NTASKS_PER_NODE";
    if ((v = L(lw_name))) {
        if ((rc = parse_int(lw_name, v, 1, INT_MAX, &x->local_world, e))) return rc;
    } else if ((v = L("SLURM_TASKS_PER_NODE"))) {
        lw_name = "SLURM_TASKS_PER_NODE";
        int node = 0;
        const char *nid = L("SLURM_NODEID");
        if (nid && (rc = parse_int("SLURM_NODEID", nid, 0, INT_MAX, &node, e))) return rc;
        if ((rc = tasks_per_node(v, node, &x->local_world, e))) return rc;
    } else {
        return rl_errf(e, RL_EINPUT, "SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE are not "
                                     "set (%s)", why);
    }
    /* An explicit MASTER_ADDR wins (batch scripts commonly export one);
     * otherwise the first node of the allocation hosts the store. */
    if ((v = L("MASTER_ADDR"))) {
        if ((rc = copy_host("MASTER_ADDR", v, x->master_addr, sizeof x->master_addr, e)))
            return rc;
    } else {
        const char *ln = "SLURM_JOB_NODELIST";
        if (!(v = L(ln))) v = L(ln = "SLURM_NODELIST");
        if (!v)
            return rl_errf(e, RL_EINPUT, "SLURM_JOB_NODELIST and SLURM_NODELIST are not set "
                                         "(%s; or set MASTER_ADDR)", why);
        if ((rc = rl_slurm_first_host(v, x->master_addr, sizeof x->master_addr, e)))
            return rl_err_wrap(e, "%s", ln);
    }
    x->master_port = RL_STORE_DEFAULT_PORT;
    if ((v = L("MASTER_PORT")) && (rc = parse_int("MASTER_PORT", v, 1, 65535, &x->master_port, e)))
        return rc;
    snprintf(x->source, sizeof x->source, "slurm");
    return check_consistent(x, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", lw_name, e);
}

int rl_static_env_read(rl_env_lookup L, rl_static_env *env_out, bool *found, rl_err *e) {
    *found = false;
    rl_static_env x;
    memset(&x, 0, sizeof x);
    int rc;
    /* torchrun first: torchrun started inside a SLURM allocation inherits
     * SLURM's variables, and its own describe the trainer. */
    if (L("RANK") || L("WORLD_SIZE") || L("LOCAL_RANK") || L("LOCAL_WORLD_SIZE"))
        rc = read_torchrun(L, &x, e);
    else if (L("SLURM_PROCID"))
        rc = read_slurm(L, &x, e);
    else
        return RL_OK;
    if (rc != RL_OK) return rc;
    *env_out = x;
    *found = true;
    return RL_OK;
}

/* ---- node agent environment ---------------------------------------------------------- */
/* PET_<name>, then <name>: which one was used is what messages name. */
static const char *pet(rl_env_lookup L, const char *name, char *used, size_t n) {
    snprintf(used, n, "PET_%s", name);
    const char *v = L(used);
    if (v) return v;
    snprintf(used, n, "%s", name);
    return L(name);
}

int rl_node_env_read(rl_env_lookup L, rl_node_env *out, rl_err *e) {
    rl_node_env x = {.nnodes = 1, .node_rank = 0, .nproc_per_node = 0,
                     .master_addr = "127.0.0.1", .master_port = RL_STORE_DEFAULT_PORT};
    char nn_name[32], nr_name[32], np_name[32], ma_name[32], mp_name[32];
    char b[64];
    int rc;
    const char *v = pet(L, "NNODES", nn_name, sizeof nn_name);
    if (v) {
        /* torchrun also takes "MIN:MAX"; a static job has one size. */
        const char *colon = strchr(v, ':');
        if (colon) {
            char lo[32];
            size_t l = (size_t)(colon - v);
            if (l >= sizeof lo || strcmp(colon + 1, "") == 0 || strncmp(v, colon + 1, l) != 0 ||
                colon[1 + l] != '\0')
                return rl_errf(e, RL_EINPUT,
                               "%s: '%s' is an elastic range; static rendezvous needs one node "
                               "count", nn_name, shown(v, b, sizeof b));
            memcpy(lo, v, l);
            lo[l] = '\0';
            if ((rc = parse_int(nn_name, lo, 1, INT_MAX, &x.nnodes, e))) return rc;
        } else if ((rc = parse_int(nn_name, v, 1, INT_MAX, &x.nnodes, e))) {
            return rc;
        }
    }
    if ((v = pet(L, "NODE_RANK", nr_name, sizeof nr_name)) &&
        (rc = parse_int(nr_name, v, 0, INT_MAX, &x.node_rank, e)))
        return rc;
    if ((v = pet(L, "NPROC_PER_NODE", np_name, sizeof np_name))) {
        /* torchrun's "auto"/"gpu": one per local GPU, decided by the caller. */
        if (strcmp(v, "auto") == 0 || strcmp(v, "gpu") == 0) x.nproc_per_node = RL_NPROC_AUTO;
        else if ((rc = parse_int(np_name, v, 1, INT_MAX, &x.nproc_per_node, e))) return rc;
    }
    if ((v = pet(L, "MASTER_ADDR", ma_name, sizeof ma_name)) &&
        (rc = copy_host(ma_name, v, x.master_addr, sizeof x.master_addr, e)))
        return rc;
    if ((v = pet(L, "MASTER_PORT", mp_name, sizeof mp_name)) &&
        (rc = parse_int(mp_name, v, 1, 65535, &x.master_port, e)))
        return rc;
    if (x.node_rank >= x.nnodes) {
        return rl_errf(e, RL_EINPUT, "%s=%d is not below %s=%d", nr_name, x.node_rank, nn_name,
                       x.nnodes);
    }
    *out = x;
    return RL_OK;
}
