/* A real S3 server for test suites: Ceph's RADOS Gateway from Debian
 * (packages radosgw ceph-mon ceph-osd ceph-common), one ceph-mon and one
 * memstore ceph-osd under a fresh temp dir, cephx off, radosgw's beast
 * frontend on 127.0.0.1 with a free port, and one S3 user. It checks SigV4
 * signatures for real. Stopped by its PIDs only. */
#ifndef RL_TEST_RGWTEST_H
#define RL_TEST_RGWTEST_H

#include <stddef.h>

typedef struct rl_test_rgw {
    int mon_pid, osd_pid, rgw_pid; /* -1 when not running */
    char dir[256];                 /* temp dir: ceph.conf, daemon data, logs */
    char endpoint[64];             /* "http://127.0.0.1:PORT" */
    int port;
    char access_key[32], secret_key[64]; /* the user's keys (fresh per start) */
} rl_test_rgw;

/* Start the three daemons and create the user; memstore sized for
 * mem_mib MiB of objects (memstore holds about twice what is written: pass
 * at least 2x the test's data plus room). 0 when radosgw answers
 * anonymous GET / with 200 (waits at most 60 s); on failure the logs'
 * tails go to stderr and nothing is left behind. The daemons die with the
 * test process. */
int rl_test_rgw_start(rl_test_rgw *r, size_t mem_mib);
/* Stop the daemons (SIGKILL by PID) and remove the temp dir. Safe twice. */
void rl_test_rgw_stop(rl_test_rgw *r);

/* radosgw-admin against this server with the given arguments
 * (NULL-terminated), its output appended to DIR/admin.log; its exit
 * status (-1 when it hung for 30 s). */
int rl_test_rgw_admin(const rl_test_rgw *r, const char *const *args);
/* Another S3 user with fresh keys (access_key >= 21, secret_key >= 41
 * bytes); 0 on success. It owns nothing and may do nothing in the
 * first user's buckets until a bucket policy lets it. */
int rl_test_rgw_add_user(const rl_test_rgw *r, const char *uid, char *access_key, char *secret_key);
/* A size quota on one bucket, enforced from the next request on (this
 * radosgw keeps the bucket's usage exact for its own writes and deletes,
 * measured: no stats sync needed); max_bytes < 0 lifts it. The server
 * answers a PUT past it with 403 QuotaExceeded. 0 on success. */
int rl_test_rgw_bucket_quota(const rl_test_rgw *r, const char *bucket, long long max_bytes);

#endif
