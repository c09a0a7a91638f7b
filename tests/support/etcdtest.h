/* A real etcd (Debian's etcd-server, /usr/bin/etcd) for test suites: started
 * on loopback in a fresh temp dir with free ports, stopped by its PID. */
#ifndef RL_TEST_ETCDTEST_H
#define RL_TEST_ETCDTEST_H

typedef struct rl_test_etcd {
    int pid;               /* -1 when not running */
    char dir[256];         /* temp dir: data/ and etcd.log */
    char endpoint[64];     /* "http://127.0.0.1:PORT" */
    int client_port, peer_port;
} rl_test_etcd;

/* Start etcd (binary: $RL_TEST_ETCD, else /usr/bin/etcd, else etcd on the
 * PATH) and wait (<= 15 s) until its v3 gateway answers a range. 0 on
 * success; on failure the log's tail goes to stderr and nothing is left
 * behind. Watch progress notifications come every second, so idle watch
 * streams still carry bytes. The process dies with the test process. */
int rl_test_etcd_start(rl_test_etcd *t);
/* SIGKILL it (a crash: no clean shutdown), keeping its data dir and ports. */
void rl_test_etcd_kill(rl_test_etcd *t);
/* Start it again on the same ports and data dir (after rl_test_etcd_kill). */
int rl_test_etcd_restart(rl_test_etcd *t);
/* Kill it if running and remove the temp dir. Safe to call twice. */
void rl_test_etcd_stop(rl_test_etcd *t);

#endif
