/* Time, file and CPU-set helpers. Writes go through a temp file + fsync + rename so
 * that a crash never leaves a half-written file under the final name. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double rl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rl_cond_wait_s(pthread_cond_t *cv, pthread_mutex_t *mu, double s) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = (double)dl.tv_sec + dl.tv_nsec * 1e-9 + (s > 0 ? s : 0);
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    pthread_cond_timedwait(cv, mu, &dl);
}

double rl_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int rl_read_file(const char *path, char **out, size_t *len, rl_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return rl_errf(e, RL_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return rl_errf(e, RL_EINPUT, "%s: not a regular file", path);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return rl_errf(e, RL_ENOMEM, "%s: out of memory reading %lld bytes", path,
                       (long long)st.st_size);
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n != (size_t)st.st_size) {
        free(buf);
        return rl_errf(e, RL_EIO, "%s: short read", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return RL_OK;
}

int rl_mkdirs(const char *path, mode_t mode, rl_err *e) {
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return rl_errf(e, RL_EINPUT, "bad directory path '%s'", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, mode) != 0 && errno != EEXIST)
            return rl_errf(e, RL_EIO, "%s: mkdir: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST)
        return rl_errf(e, RL_EIO, "%s: mkdir: %s", tmp, strerror(errno));
    return RL_OK;
}

int rl_write_file_atomic(const char *path, const void *data, size_t len, rl_err *e) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return rl_errf(e, RL_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = errno;
            close(fd);
            unlink(tmp);
            return rl_errf(e, RL_EIO, "%s: write: %s", tmp, strerror(err));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return rl_errf(e, RL_EIO, "%s: fsync/close: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return rl_errf(e, RL_EIO, "%s: rename: %s", path, strerror(err));
    }
    return RL_OK;
}

int rl_cpulist_parse(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    int n = 0;
    while (*s && *s != '\n') {
        unsigned long lo, hi;
        char *end;
        if (*s < '0' || *s > '9') return -1;
        lo = hi = strtoul(s, &end, 10);
        if (*end == '-') {
            if (end[1] < '0' || end[1] > '9') return -1;
            hi = strtoul(end + 1, &end, 10);
        }
        if (lo > hi || hi >= CPU_SETSIZE) return -1;
        for (unsigned long c = lo; c <= hi; c++) n += !CPU_ISSET(c, set), CPU_SET(c, set);
        if (*end == ',' && end[1] && end[1] != '\n') end++;
        else if (*end && *end != '\n') return -1;
        s = end;
    }
    return (*s == '\n' && s[1]) ? -1 : n;
}

int rl_cpuset_slice(const cpu_set_t *a, const cpu_set_t *b, int share, int index, cpu_set_t *out) {
    CPU_ZERO(out);
    cpu_set_t both;
    CPU_AND(&both, a, b);
    int n = CPU_COUNT(&both);
    if (share < 1 || index < 0 || index >= share) return 0;
    /* slice k is [k * n / share, (k + 1) * n / share) of the CPUs in order */
    int from = (int)((long long)index * n / share), to = (int)((long long)(index + 1) * n / share), k = 0, got = 0;
    for (int c = 0; c < CPU_SETSIZE && k < to; c++) {
        if (!CPU_ISSET(c, &both)) continue;
        if (k++ >= from) CPU_SET(c, out), got++;
    }
    return got;
}

/* "<boot_id>/<hostname>": equal on two ranks only when they run on one
 * booted kernel under one host name. Empty when either is unknown. */
void rl_host_identity(char *out, size_t n) {
    char boot[80] = "", hn[72] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (gethostname(hn, sizeof hn - 1) != 0) hn[0] = '\0';
    hn[sizeof hn - 1] = '\0';
    out[0] = '\0';
    if (boot[0] && hn[0]) snprintf(out, n, "%.63s/%.71s", boot, hn);
}
