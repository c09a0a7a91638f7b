/* Metrics and progress: the Prometheus text of the registry, the HTTP
 * server (a free port, a port in use), the trainer -> agent stats pipe
 * (a full or abandoned pipe never holds a trainer up), gauges that move
 * while `--nproc-per-node 2` trains, the job config from
 * RINGLEADER_CONFIG, and the <job>-progress Lease written by the elastic
 * agent holding rank 0, read back from the Kubernetes stand-in. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/agent.h"
#include "jobtest.h"
#include "k8s/k8s.h"
#include "metrics/metrics.h"
#include "testutil.h"
#include "util/util.h"

/* ---- helpers ---------------------------------------------------------------------------- */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

/* One HTTP/1.1 request with Connection: close; the whole answer into
 * out[n]. Returns the status code, or -1 (no answer within 5 s). */
static int http(const char *host, int port, const char *method, const char *path, char *out, size_t n) {
    out[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int k = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", method, path, host);
    if (write(fd, req, (size_t)k) != k) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd, out + got, n - 1 - got)) > 0) got += (size_t)r;
    out[got] = '\0';
    close(fd);
    int code = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1) return -1;
    return code;
}

static const char *body_of(const char *resp) {
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* A sample's value in an exposition ("name value" at a line start); NAN if absent. */
static double sample(const char *text, const char *name) {
    size_t nl = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, nl) && p[nl] == ' ') return strtod(p + nl + 1, NULL);
    return NAN;
}

/* ---- the registry's text ----------------------------------------------------------------- */
Test(metrics, exposition_text_is_exact) {
    rl_metrics *m;
    rl_err e;
    int step, loss, restarts, age, mfu, info, tiny;
    cr_assert_eq(rl_metrics_new(&m, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "ringleader_step", "Optimizer steps completed.", &step, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "ringleader_loss", "Loss with a \\ and a\nnewline.", &loss, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_COUNTER, "ringleader_restarts_total", "Crashes.", &restarts, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_AGE, "ringleader_checkpoint_age_seconds", "Age.", &age, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "ringleader_mfu", "Never set: absent.", &mfu, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "x_info{version=\"1\"}", "Labels.", &info, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "x_small", "", &tiny, &e), 0);
    /* bad and duplicate names are refused, naming them */
    int dummy;
    cr_expect_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "9lives", "", &dummy, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "9lives"), "%s", e.msg);
    cr_expect_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "ringleader_step", "", &dummy, &e), RL_EINPUT);
    cr_expect_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "a b", "", &dummy, &e), RL_EINPUT);

    rl_metrics_set(m, step, 40);
    rl_metrics_set(m, loss, 0.1);
    rl_metrics_inc(m, restarts, 1);
    rl_metrics_inc(m, restarts, 2);
    rl_metrics_set(m, age, 1000.0);
    rl_metrics_set(m, info, 1);
    rl_metrics_set(m, tiny, 1.0 / 3);
    char *t = rl_metrics_render(m, 1012.5);
    const char *want =
        "# HELP ringleader_step Optimizer steps completed.\n"
        "# TYPE ringleader_step gauge\n"
        "ringleader_step 40\n"
        "# HELP ringleader_loss Loss with a \\\\ and a\\nnewline.\n"
        "# TYPE ringleader_loss gauge\n"
        "ringleader_loss 0.1\n"
        "# HELP ringleader_restarts_total Crashes.\n"
        "# TYPE ringleader_restarts_total counter\n"
        "ringleader_restarts_total 3\n"
        "# HELP ringleader_checkpoint_age_seconds Age.\n"
        "# TYPE ringleader_checkpoint_age_seconds gauge\n"
        "ringleader_checkpoint_age_seconds 12.5\n"
        "# HELP x_info Labels.\n"
        "# TYPE x_info gauge\n"
        "x_info{version=\"1\"} 1\n"
        "# TYPE x_small gauge\n"
        "x_small 0.3333333333333333\n";
    cr_expect_str_eq(t, want);
    free(t);
    /* a counter exists from the start; a cleared gauge disappears */
    rl_metrics_clear(m, step);
    rl_metrics_set(m, loss, NAN);
    t = rl_metrics_render(m, 1012.5);
    cr_expect(!strstr(t, "ringleader_step"), "%s", t);
    cr_expect(strstr(t, "ringleader_loss NaN\n"), "%s", t);
    free(t);
    char v[40];
    rl_metrics_format_value(INFINITY, v, sizeof v);
    cr_expect_str_eq(v, "+Inf");
    rl_metrics_format_value(-INFINITY, v, sizeof v);
    cr_expect_str_eq(v, "-Inf");
    rl_metrics_format_value(1e21, v, sizeof v);
    cr_expect_str_eq(v, "1e+21");
    rl_metrics_free(m);
}

/* Slots relabelled at run time (ringleader_straggler{rank,pod,node}): one
 * family, values escaped, a label set too long refused, the old one kept. */
Test(metrics, relabelled_slots_render_as_one_family) {
    rl_metrics *m;
    rl_err e = {0};
    int a, b;
    cr_assert_eq(rl_metrics_new(&m, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "x_slow{slot=\"0\"}", "Slow.", &a, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "x_slow{slot=\"1\"}", "Slow.", &b, &e), 0);
    const char *la[] = {"rank", "2", "pod", "p\"q\\", "node", "n\n1", NULL}, *lb[] = {"rank", "5", NULL};
    cr_expect_eq(rl_metrics_relabel(m, a, la, &e), 0, "%s", e.msg);
    cr_expect_eq(rl_metrics_relabel(m, b, lb, &e), 0, "%s", e.msg);
    rl_metrics_set(m, a, 3.5);
    rl_metrics_set(m, b, 2);
    char *t = rl_metrics_render(m, 0);
    cr_expect_str_eq(t, "# HELP x_slow Slow.\n# TYPE x_slow gauge\n"
                        "x_slow{rank=\"2\",pod=\"p\\\"q\\\\\",node=\"n\\n1\"} 3.5\n"
                        "x_slow{rank=\"5\"} 2\n");
    free(t);
    char big[300];
    memset(big, 'x', sizeof big - 1), big[sizeof big - 1] = '\0';
    const char *lc[] = {"pod", big, NULL};
    cr_expect_eq(rl_metrics_relabel(m, b, lc, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "x_slow"), "%s", e.msg);
    rl_metrics_clear(m, b);
    t = rl_metrics_render(m, 0);
    cr_expect(!strstr(t, "rank=\"5\""), "a cleared slot is gone: %s", t);
    free(t);
    rl_metrics_free(m);
}

Test(metrics, stats_line_round_trip) {
    rl_stats_msg a = {.kind = RL_STATS_STEP, .step = 12, .steps = 100, .loss = 2.5, .lr = 1e-3, .grad_norm = 0.75,
                      .tokens_per_s = 12345.5, .step_s = 0.25, .allreduce_s = 0.01, .allreduce_busy_s = 0.02,
                      .flops_per_token = 6e6, .world = 4},
                 b;
    char buf[RL_STATS_LINE_MAX];
    size_t n = rl_stats_format(&a, buf, sizeof buf);
    cr_assert(n > 0 && buf[n - 1] == '\n');
    rl_err e;
    cr_assert_eq(rl_stats_parse(buf, n, &b, &e), 0, "%s", e.msg);
    cr_expect(b.kind == RL_STATS_STEP && b.step == 12 && b.steps == 100 && b.loss == 2.5 && b.lr == 1e-3 &&
              b.grad_norm == 0.75 && b.tokens_per_s == 12345.5 && b.step_s == 0.25 && b.allreduce_s == 0.01 &&
              b.allreduce_busy_s == 0.02 && b.flops_per_token == 6e6 && b.world == 4);
    rl_stats_msg c = {.kind = RL_STATS_CKPT, .step = 40, .ckpt_s = 1.5, .ckpt_unix = 1.7e9, .resumed = true};
    snprintf(c.uri, sizeof c.uri, "s3://b/p \"q\"/step-00000040");
    n = rl_stats_format(&c, buf, sizeof buf);
    cr_assert_eq(rl_stats_parse(buf, n, &b, &e), 0, "%s", e.msg);
    cr_expect(b.kind == RL_STATS_CKPT && b.step == 40 && b.ckpt_s == 1.5 && b.ckpt_unix == 1.7e9 && b.resumed);
    cr_expect_str_eq(b.uri, c.uri);
    /* the pre-flight's verdict carries the nodes far below (an elastic job may leave them out) */
    rl_stats_msg d = {.kind = RL_STATS_DEGRADED, .step = 0, .nslow = 1,
                      .slow = {{.rank = 2, .ratio = 0.02, .pod = "job-2", .node = "n"}}};
    snprintf(d.why, sizeof d.why, "rank 2 (pod job-2, node n): copy 0.1 GB/s");
    n = rl_stats_format(&d, buf, sizeof buf);
    cr_assert_eq(rl_stats_parse(buf, n, &b, &e), 0, "%s", e.msg);
    cr_expect(b.kind == RL_STATS_DEGRADED && b.nslow == 1 && b.slow[0].rank == 2 && b.slow[0].ratio == 0.02);
    cr_expect_str_eq(b.slow[0].pod, "job-2");
    cr_expect_str_eq(b.why, d.why);
    /* a newer trainer's extra members are ignored; garbage is refused */
    const char *x = "{\"ev\":\"step\",\"step\":3,\"new_thing\":[1,2]}";
    cr_expect_eq(rl_stats_parse(x, strlen(x), &b, &e), 0);
    cr_expect(b.step == 3 && b.allreduce_s < 0 && isnan(b.loss));
    const char *bad[] = {"", "nope", "[]", "{\"ev\":\"step\"}", "{\"ev\":\"other\",\"step\":1}", "{\"step\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(rl_stats_parse(bad[i], strlen(bad[i]), &b, &e), RL_EINPUT, "accepted %s", bad[i]);
    /* a line that cannot fit in one atomic pipe write is not formatted */
    memset(c.uri, 'a', sizeof c.uri - 1);
    c.uri[sizeof c.uri - 1] = '\0';
    cr_expect(rl_stats_format(&c, buf, 200) == 0);
}

Test(metrics, progress_annotations) {
    rl_node_snapshot s = {.step = 40, .steps = 100, .loss = 2.3125, .tokens_per_s = 81234.4, .ckpt_step = 40,
                          .round = 3, .world = 4};
    snprintf(s.ckpt_uri, sizeof s.ckpt_uri, "s3://b/p/step-00000040");
    cJSON *a = rl_progress_annotations(&s, 1700000000.9);
    char *t = cJSON_PrintUnformatted(a);
    cr_expect_str_eq(t, "{\"ringleader.dev/step\":\"40\",\"ringleader.dev/loss\":\"2.3125\","
                        "\"ringleader.dev/tokens-per-second\":\"81234\","
                        "\"ringleader.dev/last-checkpoint\":\"s3://b/p/step-00000040\",\"ringleader.dev/round\":\"3\","
                        "\"ringleader.dev/updated\":\"2023-11-14T22:13:20Z\"}");
    free(t);
    cJSON_Delete(a);
    /* nothing known yet: only the round and the time (a merge patch keeps the rest) */
    rl_node_snapshot none = {.step = -1, .loss = NAN, .tokens_per_s = NAN, .ckpt_step = -1, .round = 0};
    a = rl_progress_annotations(&none, 0);
    t = cJSON_PrintUnformatted(a);
    cr_expect_str_eq(t, "{\"ringleader.dev/round\":\"0\",\"ringleader.dev/updated\":\"1970-01-01T00:00:00Z\"}");
    free(t);
    cJSON_Delete(a);
}

/* ---- the server ------------------------------------------------------------------------------ */
Test(metrics, server_serves_metrics_and_healthz) {
    rl_metrics *m;
    rl_metrics_server *s = NULL;
    rl_err e;
    int id;
    cr_assert_eq(rl_metrics_new(&m, &e), 0);
    cr_assert_eq(rl_metrics_define(m, RL_METRIC_GAUGE, "ringleader_step", "Steps.", &id, &e), 0);
    rl_metrics_set(m, id, 7);
    /* port 0 is "off": no server, no error */
    cr_assert_eq(rl_metrics_start(0, "127.0.0.1", m, &s, &e), 0);
    cr_assert_null(s);
    cr_assert_eq(rl_metrics_start(RL_METRICS_ANY_PORT, "127.0.0.1", m, &s, &e), 0, "%s", e.msg);
    int port = rl_metrics_server_port(s);
    cr_assert(port > 0);
    static char r[65536];
    cr_assert_eq(http("127.0.0.1", port, "GET", "/metrics", r, sizeof r), 200, "%s", r);
    cr_expect(strcasestr(r, "Content-Type: text/plain; version=0.0.4"), "%s", r);
    cr_expect_str_eq(body_of(r), "# HELP ringleader_step Steps.\n# TYPE ringleader_step gauge\nringleader_step 7\n");
    rl_metrics_set(m, id, 8); /* from this thread while the server's renders */
    cr_assert_eq(http("127.0.0.1", port, "GET", "/metrics", r, sizeof r), 200);
    cr_expect(sample(body_of(r), "ringleader_step") == 8);
    cr_assert_eq(http("127.0.0.1", port, "GET", "/healthz", r, sizeof r), 200);
    cr_expect_str_eq(body_of(r), "ok\n");
    cr_expect_eq(http("127.0.0.1", port, "GET", "/nope", r, sizeof r), 404);
    cr_expect_eq(http("127.0.0.1", port, "POST", "/metrics", r, sizeof r), 405);
    /* a client that connects and says nothing does not hold the others up */
    int idle = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(idle, (struct sockaddr *)&a, sizeof a), 0);
    double t0 = rl_now();
    cr_expect_eq(http("127.0.0.1", port, "GET", "/healthz", r, sizeof r), 200);
    cr_expect(rl_now() - t0 < 1.0);
    close(idle);
    rl_metrics_stop(s);
    cr_expect_eq(http("127.0.0.1", port, "GET", "/healthz", r, sizeof r), -1, "still serving after stop");
    rl_metrics_free(m);
}

Test(metrics, port_in_use_is_a_clear_error) {
    int port = free_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 1), 0);
    rl_metrics *m;
    rl_metrics_server *s = NULL;
    rl_err e;
    char want[32];
    snprintf(want, sizeof want, "port %d", port);
    cr_assert_eq(rl_metrics_new(&m, &e), 0);
    cr_expect_eq(rl_metrics_start(port, "127.0.0.1", m, &s, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, want) && strstr(e.msg, "in use"), "%s", e.msg);
    cr_expect_eq(rl_metrics_start(port, "not-an-ip", m, &s, &e), RL_EINPUT);
    rl_metrics_free(m);
    /* and through the worker: exit 2, one line naming the port, before training */
    char dir[64], cmd[4600], err[4096], ports[16];
    rl_test_arith_dir(dir, sizeof dir, 100000);
    rl_test_write_job(dir, 5, 256, "", "");
    snprintf(ports, sizeof ports, "%d", port);
    const char *modes[] = {"", "--nproc-per-node 2"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "POD_IP=127.0.0.1 %s/ringleader-worker --config %s/job.json %s --metrics-port %s",
                 rl_test_bindir(), dir, modes[i], ports);
        cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
        cr_expect(strstr(err, want) && strstr(err, "in use") && strchr(err, '\n') == err + strlen(err) - 1,
                  "expected one line naming %s: %s", want, err);
    }
    snprintf(cmd, sizeof cmd, "RINGLEADER_METRICS_PORT=http %s/ringleader-worker --config %s/job.json",
             rl_test_bindir(), dir);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "RINGLEADER_METRICS_PORT"), "%s", err);
    close(fd);
    rl_test_rmdir(dir);
}

/* ---- the stats pipe ----------------------------------------------------------------------------- */
Test(metrics, full_or_abandoned_pipe_never_blocks) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    char v[16];
    snprintf(v, sizeof v, "%d", p[1]);
    rl_stats_writer w;
    rl_stats_writer_open(&w, v);
    cr_assert_eq(w.fd, p[1], "the writer did not take the pipe");
    rl_stats_msg m = {.kind = RL_STATS_STEP, .step = 1, .loss = 1, .world = 1};
    /* nobody reads: the pipe fills, then every send returns at once */
    double t0 = rl_now();
    for (int i = 0; i < 20000; i++) m.step = i + 1, rl_stats_send(&w, &m);
    double dt = rl_now() - t0;
    cr_expect(w.sent > 0 && w.dropped > 0, "sent %lld dropped %lld", w.sent, w.dropped);
    cr_expect(dt < 2.0, "20000 sends took %.2f s", dt);
    /* what did go through are whole lines, in order */
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    rl_stats_reader r;
    rl_stats_reader_init(&r, p[0]);
    long long got = 0;
    while (rl_stats_read(&r, NULL, NULL) > 0) {
    }
    got = r.lines;
    cr_expect_eq(got, w.sent);
    cr_expect_eq(r.bad, 0);
    /* the reader gone: EPIPE, not SIGPIPE (the writer ignores it) */
    close(p[0]);
    cr_expect(!rl_stats_send(&w, &m));
    close(p[1]);
    /* a value that is not a pipe leaves the writer unconnected */
    rl_stats_writer_open(&w, "1");
    cr_expect_eq(w.fd, -1);
}

/* A whole trainer given a pipe that is already full and never read:
 * it trains to the end as if nobody listened. */
Test(metrics, trainer_with_a_full_pipe_finishes, .timeout = 120) {
    char dir[64], log[128];
    rl_test_arith_dir(dir, sizeof dir, 200000);
    rl_test_write_job(dir, 200, 256, NULL, ",\"every_steps\":50");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    char fill[4096] = {0};
    while (write(p[1], fill, sizeof fill) > 0) {
    }
    char v[16];
    snprintf(v, sizeof v, "%d", p[1]);
    setenv(RL_ENV_STATS_FD, v, 1);
    setenv("RL_LOG_LEVEL", "debug", 1); /* to see that it did try the pipe */
    snprintf(log, sizeof log, "%s/w.log", dir);
    int pid = rl_test_spawn_worker(dir, log, -1, 1, 0, NULL);
    unsetenv(RL_ENV_STATS_FD);
    int st = rl_test_wait_status(pid, 90);
    cr_expect_eq(st, 0, "worker exit %d", st);
    cr_expect_eq(rl_test_last_step(log), 200);
    cr_expect(rl_test_file_has(log, "\"stats_dropped\""), "the trainer never wrote to the pipe");
    close(p[0]);
    close(p[1]);
    rl_test_rmdir(dir);
}

/* ---- gauges that move while two trainers train ------------------------------------------------ */
Test(metrics, values_move_under_nproc_per_node_2, .timeout = 120) {
    char dir[64], log[128], ports[16];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 100000, 256, NULL, ",\"every_steps\":20");
    int port = free_port();
    snprintf(ports, sizeof ports, "%d", port);
    snprintf(log, sizeof log, "%s/w.log", dir);
    setenv("POD_IP", "127.0.0.1", 1);
    setenv("RINGLEADER_PEAK_TFLOPS", "0.5", 1);
    const char *args[] = {"--nproc-per-node", "2", "--metrics-port", ports, NULL};
    int pid = rl_test_spawn_worker(dir, log, -1, 1, 0, args);
    static char r[65536];
    double s1 = NAN, s2 = NAN, end = rl_now() + 60;
    const char *b = "";
    while (rl_now() < end) {
        if (http("127.0.0.1", port, "GET", "/metrics", r, sizeof r) == 200) {
            b = body_of(r);
            double s = sample(b, "ringleader_step"), c = sample(b, "ringleader_checkpoint_last_step");
            if (isnan(s1) && s > 0) s1 = s;
            else if (!isnan(s1) && s > s1 && c >= 20) {
                s2 = s;
                break;
            }
        }
        usleep(200000);
    }
    cr_expect(s1 > 0 && s2 > s1, "step did not move between scrapes (%g, %g); last scrape:\n%s", s1, s2, b);
    cr_expect(sample(b, "ringleader_loss") > 0 && sample(b, "ringleader_loss") < 6);
    cr_expect(sample(b, "ringleader_tokens_per_second") > 0);
    cr_expect(sample(b, "ringleader_grad_norm") > 0);
    cr_expect(sample(b, "ringleader_learning_rate") > 0);
    cr_expect(sample(b, "ringleader_step_seconds") > 0);
    cr_expect(sample(b, "ringleader_model_tflops") > 0);
    double mfu = sample(b, "ringleader_mfu");
    cr_expect(fabs(mfu - sample(b, "ringleader_model_tflops") / (0.5 * 2)) < 1e-9, "mfu %g", mfu);
    cr_expect(sample(b, "ringleader_allreduce_seconds") >= 0);
    cr_expect(sample(b, "ringleader_allreduce_busy_seconds") > 0);
    cr_expect(sample(b, "ringleader_world_size") == 2);
    cr_expect(sample(b, "ringleader_checkpoint_seconds") > 0);
    cr_expect(sample(b, "ringleader_checkpoint_age_seconds") >= 0);
    cr_expect(sample(b, "ringleader_restarts_total") == 0);
    cr_expect(sample(b, "ringleader_rounds_total") == 1);
    /* SIGTERM: the trainers checkpoint and the launcher exits 75 */
    kill(pid, SIGTERM);
    int st = rl_test_wait_status(pid, 60);
    cr_expect_eq(st, RL_EXIT_PREEMPTED, "launcher exit %d", st);
    rl_test_rmdir(dir);
}

/* ---- RINGLEADER_CONFIG -------------------------------------------------------------------------- */
static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

Test(metrics, config_from_ringleader_config, .timeout = 120) {
    char dir[64], cmd[8192], err[8192], js[2048];
    rl_test_arith_dir(dir, sizeof dir, 100000);
    /* a bad field: exit 2, one line naming the variable and the field */
    snprintf(cmd, sizeof cmd, "RINGLEADER_CONFIG='{\"train\":{\"learning_rate\":0.1}}' %s/ringleader-worker",
             rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "RINGLEADER_CONFIG") && strstr(err, "learning_rate") && count_lines(err) == 1, "%s", err);
    snprintf(cmd, sizeof cmd, "RINGLEADER_CONFIG='{\"train\": ' %s/ringleader-worker --nproc-per-node 2", rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "RINGLEADER_CONFIG") && strstr(err, "invalid JSON") && count_lines(err) == 1, "%s", err);
    /* a good one trains, in the launcher's trainers too (they inherit it) */
    snprintf(js, sizeof js,
             "{" RL_TEST_TINY_MODEL_JSON
             "\"train\":{\"steps\":7,\"warmup_steps\":2,\"seq_len\":32,\"micro_batch\":4,\"global_batch_tokens\":256,"
             "\"eval_every\":0,\"eval_batches\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"}}",
             dir);
    snprintf(cmd, sizeof cmd, "cd %s && OMP_NUM_THREADS=1 RINGLEADER_CONFIG='%s' %s/ringleader-worker --nproc-per-node 2",
             dir, js, rl_test_bindir());
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    cr_expect(strstr(err, "\"event\":\"train_end\",\"rank\":0,\"steps\":7"), "%s", err);
    /* --config wins over the variable */
    rl_test_write_job(dir, 3, 256, "", "");
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 RINGLEADER_CONFIG='%s' %s/ringleader-worker --config %s/job.json", js,
             rl_test_bindir(), dir);
    cr_expect_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    cr_expect(strstr(err, "\"event\":\"train_end\",\"steps\":3"), "%s", err);
    rl_test_rmdir(dir);
}

/* ---- the progress Lease -------------------------------------------------------------------------- */
static const char *ann(const cJSON *lease, const char *key) {
    const cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(lease, "metadata"), "annotations");
    const cJSON *v = cJSON_GetObjectItem(a, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

#define PSTEPS 300
Test(metrics, progress_lease_follows_rank_0, .timeout = 240) {
    rl_test_job j;
    char why[1024] = "";
    cr_assert_eq(rl_test_job_setup(&j, 41, false, PSTEPS, 100,
                                   "\"min_nodes\":2,\"max_nodes\":2,\"heartbeat_s\":1,\"heartbeat_misses\":5,"
                                   "\"last_call_s\":2,\"lease_s\":3,\"renew_deadline_s\":2,\"retry_s\":0.5,"
                                   "\"stop_grace_s\":5,\"max_restarts\":1",
                                   why, sizeof why),
                 0, "%s", why);
    /* the agents inherit these: fast progress writes, metrics on each pod's address */
    int mport = free_port();
    char ports[16];
    snprintf(ports, sizeof ports, "%d", mport);
    setenv("RL_PROGRESS_INTERVAL_S", "0.3", 1);
    setenv("RINGLEADER_METRICS_PORT", ports, 1);
    double t_begin = rl_now();
    for (int i = 0; i < 2; i++) cr_assert_eq(rl_test_job_start_agent(&j, i, 1, "s3cret", true), 0);

    rl_k8s_config kc;
    rl_k8s *c;
    rl_err e;
    cr_assert_eq(rl_k8s_config_kubeconfig(j.s.kubeconfig, NULL, &kc, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_k8s_new(&kc, NULL, &c, &e), 0, "%s", e.msg);
    rl_k8s_config_free(&kc);
    char path[512];
    cr_assert_eq(rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", rl_k8s_namespace(c), "leases", "job-progress", &e), 0);
    long seen[PSTEPS + 2];
    int nseen = 0, status[2] = {-1, -1};
    bool scraped[2] = {false, false};
    static char r[65536];
    double end = rl_now() + 150;
    while (rl_now() < end && (j.pid[0] > 0 || j.pid[1] > 0)) {
        cJSON *l = NULL;
        long code = 0;
        if (rl_k8s_get(c, path, &code, &l, &e) == RL_OK) {
            const char *s = ann(l, "ringleader.dev/step");
            if (s && (nseen == 0 || atol(s) != seen[nseen - 1]) && nseen < PSTEPS + 2) seen[nseen++] = atol(s);
        }
        cJSON_Delete(l);
        /* each agent's /metrics on its own pod address, while it trains */
        for (int i = 0; i < 2 && nseen > 0; i++) {
            char host[32];
            snprintf(host, sizeof host, "127.0.%d.%d", j.net, 10 + i);
            if (!scraped[i] && http(host, mport, "GET", "/metrics", r, sizeof r) == 200)
                scraped[i] = sample(body_of(r), "ringleader_rounds_total") >= 1;
        }
        for (int i = 0; i < 2; i++)
            if (j.pid[i] > 0) status[i] = rl_test_job_wait(&j, i, 0);
        usleep(150000);
    }
    for (int i = 0; i < 2; i++)
        cr_expect(status[i] >= 0 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0, "agent %d: status %d", i,
                  status[i]);
    cr_expect(scraped[0] && scraped[1], "the agents' /metrics did not answer on their pod addresses");
    cr_assert(nseen >= 2, "the step annotation did not move (%d values seen)", nseen);
    for (int i = 1; i < nseen; i++) cr_expect(seen[i] > seen[i - 1], "step went %ld -> %ld", seen[i - 1], seen[i]);
    /* the job's end: the final step, its checkpoint, the round, a time, the holder */
    cJSON *l = NULL;
    long code = 0;
    cr_assert_eq(rl_k8s_get(c, path, &code, &l, &e), RL_OK, "%s", e.msg);
    char *txt = cJSON_PrintUnformatted(l);
    char want_step[16], want_ckpt[160];
    snprintf(want_step, sizeof want_step, "%d", PSTEPS);
    snprintf(want_ckpt, sizeof want_ckpt, "/step-%08d", PSTEPS);
    const char *step = ann(l, "ringleader.dev/step"), *ck = ann(l, "ringleader.dev/last-checkpoint");
    cr_expect(step && !strcmp(step, want_step), "final step: %s", txt);
    cr_expect(ck && strstr(ck, j.ckpt) && strstr(ck, want_ckpt), "last checkpoint: %s", txt);
    cr_expect(ann(l, "ringleader.dev/round") && ann(l, "ringleader.dev/loss") &&
                  ann(l, "ringleader.dev/tokens-per-second"), "%s", txt);
    double t;
    const char *up = ann(l, "ringleader.dev/updated");
    cr_expect(up && strlen(up) == 20 && up[19] == 'Z' && rl_k8s_time_parse(up, &t) == 0 && fabs(t - rl_wall_now()) < 60,
              "updated: %s", txt);
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetObjectItem(l, "spec"), "holderIdentity");
    cr_expect(cJSON_IsString(h) && !strncmp(h->valuestring, "job-", 4), "%s", txt);
    free(txt);
    cJSON_Delete(l);
    /* every write, from the stand-in's record: created once, then merge
     * patches; the step never goes back; no more often than the interval */
    static char hist[1 << 21];
    cr_assert_eq(rl_test_standin_admin(&j.s, "GET", "/history?resource=leases&namespace=default&name=job-progress",
                                       NULL, hist, sizeof hist),
                 200, "%s", hist);
    cJSON *hs = cJSON_Parse(hist);
    int nw = cJSON_GetArraySize(hs);
    long prev = -1;
    for (int i = 0; i < nw; i++) {
        const cJSON *w = cJSON_GetArrayItem(hs, i);
        const char *ty = cJSON_GetObjectItem(w, "type")->valuestring, *st = ann(cJSON_GetObjectItem(w, "object"), "ringleader.dev/step");
        cr_expect_str_eq(ty, i == 0 ? "ADDED" : "MODIFIED");
        if (st) {
            cr_expect(atol(st) >= prev, "write %d: step %s after %ld", i, st, prev);
            prev = atol(st);
        }
    }
    double span = rl_now() - t_begin;
    cr_expect(nw >= 2 && nw <= span / 0.3 + 3, "%d writes in %.1f s at most every 0.3 s", nw, span);
    cr_log_info("progress: %d writes in %.1f s, %d step values seen while polling", nw, span, nseen);
    cJSON_Delete(hs);
    for (int i = 0; i < 2; i++) {
        char *b = rl_test_slurp(j.log[i]);
        cr_expect(strstr(b, "\"event\":\"job_complete\""), "agent %d did not complete", i);
        cr_expect(!strstr(b, "progress_failed"), "agent %d: a progress write failed", i);
        free(b);
    }
    rl_k8s_free(c);
    rl_test_job_teardown(&j);
}

/* The API refuses every write of the progress Lease (403 on PATCH, which
 * the elector never uses): the job trains to its end regardless, the
 * failure is logged -- the first and then one in ten, not every
 * interval -- and the final write at completion does not hold the agent. */
Test(metrics, progress_failures_never_stall_the_job, .timeout = 240) {
    rl_test_job j;
    char why[1024] = "";
    cr_assert_eq(rl_test_job_setup(&j, 42, false, 150, 50,
                                   "\"min_nodes\":2,\"max_nodes\":2,\"heartbeat_s\":1,\"heartbeat_misses\":5,"
                                   "\"last_call_s\":2,\"lease_s\":3,\"renew_deadline_s\":2,\"retry_s\":0.5,"
                                   "\"stop_grace_s\":5,\"max_restarts\":1",
                                   why, sizeof why),
                 0, "%s", why);
    /* the agents' kubeconfig now carries a token that may not PATCH leases */
    char out[512];
    cr_assert_eq(rl_test_standin_admin(&j.s, "POST", "/tokens", "{\"token\":\"no-lease-patch\",\"deny\":[\"leases:patch\"]}",
                                       out, sizeof out),
                 200, "%s", out);
    char *kc = rl_test_slurp(j.s.kubeconfig), *t = strstr(kc, "token: ");
    cr_assert(t != NULL);
    *t = '\0';
    FILE *f = fopen(j.s.kubeconfig, "w");
    cr_assert(f != NULL);
    fprintf(f, "%stoken: no-lease-patch\n", kc);
    fclose(f);
    free(kc);
    setenv("RL_PROGRESS_INTERVAL_S", "0.3", 1);
    unsetenv("RINGLEADER_METRICS_PORT");
    double t0 = rl_now();
    for (int i = 0; i < 2; i++) cr_assert_eq(rl_test_job_start_agent(&j, i, 1, "s3cret", true), 0);
    int failed_lines = 0;
    for (int i = 0; i < 2; i++) {
        int st = rl_test_job_wait(&j, i, 150);
        char *b = rl_test_slurp(j.log[i]);
        cr_expect(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "agent %d: status %d", i, st);
        cr_expect(strstr(b, "\"event\":\"job_complete\""), "agent %d did not complete", i);
        for (const char *p = b; (p = strstr(p, "\"event\":\"progress_failed\"")); p++) failed_lines++;
        if (strstr(b, "progress_failed")) cr_expect(strstr(b, "403"), "agent %d: not the 403 we caused", i);
        free(b);
    }
    double span = rl_now() - t0;
    cr_expect(rl_test_job_last_step(&j) == 150, "the job did not reach its last step");
    cr_expect(failed_lines >= 1, "the refused writes were not logged");
    cr_expect(failed_lines <= span / 0.3 / 10 + 2, "%d progress_failed lines in %.1f s: one in ten expected",
              failed_lines, span);
    cr_log_info("progress refused: %d warnings in %.1f s", failed_lines, span);
    rl_test_job_teardown(&j);
}

/* Issue 17's straggler proof: rank 2 of 3 throttled from outside as a
 * CPU quota throttles (stopped 60 ms of every 100: a few steps run at full
 * speed, then one stalls -- at the tiny model's ~6 ms steps most steps
 * never notice, so only a mean over time shows it) is named by rank 0 --
 * in its log and as ringleader_straggler{rank="2",...} on the launcher's
 * /metrics -- and no other rank is; once the throttle ends the name goes
 * (the pace is over the last 10 s). */
Test(metrics, a_throttled_rank_is_named_the_straggler, .timeout = 400) {
    char dir[64], log[128], ports[16];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 100000, 384, NULL, "");
    int port = free_port();
    snprintf(ports, sizeof ports, "%d", port);
    snprintf(log, sizeof log, "%s/w.log", dir);
    setenv("POD_IP", "127.0.0.1", 1);
    const char *args[] = {"--nproc-per-node", "3", "--metrics-port", ports, NULL};
    int pid = rl_test_spawn_worker(dir, log, -1, 1, 0, args);
    double end = rl_now() + 60;
    while (rl_test_last_step(log) < 5 && rl_now() < end) usleep(100000);
    cr_assert(rl_test_last_step(log) >= 5, "no steps: see %s", log);
    int slow = rl_test_spawned_pid(log, 2);
    cr_assert_gt(slow, 0, "no spawned line for rank 2: see %s", log);
    static char r[65536];
    const char *b = "";
    bool named = false;
    for (end = rl_now() + 180; !named && rl_now() < end;) {
        for (int i = 0; i < 10; i++) kill(slow, SIGSTOP), usleep(60000), kill(slow, SIGCONT), usleep(40000);
        if (http("127.0.0.1", port, "GET", "/metrics", r, sizeof r) == 200) b = body_of(r);
        named = strstr(b, "ringleader_straggler{rank=\"2\",") != NULL;
    }
    cr_expect(named, "rank 2 not named on /metrics:\n%s", b);
    cr_expect(!strstr(b, "ringleader_straggler{rank=\"0\"") && !strstr(b, "ringleader_straggler{rank=\"1\""),
              "a rank that only waited was named:\n%s", b);
    cr_expect(rl_test_file_has(log, "rank 2 (pod ") && rl_test_file_has(log, "is a straggler"),
              "no stragglers line naming rank 2: see %s", log);
    /* unthrottled, its pace comes back within the window of 32 steps */
    bool gone = false;
    for (end = rl_now() + 180; named && !gone && rl_now() < end; usleep(500000))
        if (http("127.0.0.1", port, "GET", "/metrics", r, sizeof r) == 200)
            gone = !strstr(body_of(r), "ringleader_straggler{");
    cr_expect(!named || gone, "rank 2 still named 180 s after the throttle ended:\n%s", body_of(r));
    kill(pid, SIGKILL);
    rl_test_wait_status(pid, 30);
    rl_test_rmdir(dir);
}

/* Three ranks started as torchrun would, rank 2 starved from its fork
 * (running 1 ms of every 100: shorter than one 32 MiB copy of its
 * measurement, ~3 ms on this machine -- a 5 ms window let three of five
 * copies finish inside one and hid the rank in a CI run -- so every copy
 * spans a stop: at most ~0.3 GB/s, where a loaded 2-core machine still
 * copies at 1 GB/s or more) until rank 0's first verdict (its recheck
 * line, or its pre-flight line without one); then free, or starved harder
 * to the end (1 ms of every 500: its second figure is taken in training,
 * where the loaded peers copy slower than before their first step -- in a
 * CI run under ASan a 1 % rank's came out above half their median); the
 * text of rank 0's pre-flight line (malloc'd; NULL: none in 180 s) and
 * of its recheck line. */
static char *starved_preflight(bool then_free, char **recheck) {
    char dir[64], log[3][128];
    rl_test_arith_dir(dir, sizeof dir, 300000);
    rl_test_write_job(dir, 100000, 384, NULL, "");
    int port = free_port(), pid[3];
    for (int r = 2; r >= 0; r--) {
        snprintf(log[r], sizeof log[r], "%s/rank%d.log", dir, r);
        pid[r] = rl_test_spawn_worker(dir, log[r], r, 3, port, NULL);
        if (r == 2) kill(pid[2], SIGSTOP);
    }
    double end = rl_now() + 180;
    while (!rl_test_file_has(log[0], "\"event\":\"preflight") && rl_now() < end)
        kill(pid[2], SIGCONT), usleep(1000), kill(pid[2], SIGSTOP), usleep(99000);
    while (!rl_test_file_has(log[0], "\"event\":\"preflight\"") && rl_now() < end)
        if (then_free) kill(pid[2], SIGCONT), usleep(100000);
        else kill(pid[2], SIGCONT), usleep(1000), kill(pid[2], SIGSTOP), usleep(499000);
    kill(pid[2], SIGCONT);
    char *text = NULL, *line, *out = NULL;
    size_t len;
    rl_err e;
    *recheck = NULL;
    if (rl_read_file(log[0], &text, &len, &e) == RL_OK) {
        if ((line = strstr(text, "\"event\":\"preflight\""))) out = strndup(line, strcspn(line, "\n"));
        if ((line = strstr(text, "\"event\":\"preflight_recheck\""))) *recheck = strndup(line, strcspn(line, "\n"));
    }
    free(text);
    for (int r = 0; r < 3; r++) kill(pid[r], SIGKILL), rl_test_wait_status(pid[r], 30);
    rl_test_rmdir(dir);
    return out;
}

/* The pre-flight: rank 2, starved to the end, is named by rank 0 as below
 * the median's copy bandwidth, after measuring again; the others are not. */
Test(metrics, a_starved_rank_fails_the_preflight, .timeout = 240) {
    char *recheck, *line = starved_preflight(false, &recheck);
    /* named, or without figures at the first deadline (starved, it may not report in time) */
    cr_expect(recheck && strstr(recheck, "rank 2"), "no recheck first: %.300s", recheck ? recheck : "(none)");
    cr_expect(line && strstr(line, "\"below\":1,") && strstr(line, "rank 2 (pod ") && strstr(line, "copy "),
              "rank 2 not named below the median: %.300s", line ? line : "(no preflight line)");
    free(recheck), free(line);
}

/* ... but starved only until rank 0 first judged (the round's start on a
 * loaded host), it measures again at full speed and is not named: one
 * moment does not leave a node out for rdzv.bench_s. Mutation (no
 * recheck, the first verdict reported): rank 2 named, FAIL. */
Test(metrics, a_rank_starved_only_at_its_start_passes_the_preflight, .timeout = 240) {
    char *recheck, *line = starved_preflight(true, &recheck);
    cr_expect(recheck && strstr(recheck, "rank 2 (pod ") && strstr(recheck, "copy "),
              "rank 2 was not below at first: %.300s", recheck ? recheck : "(no preflight_recheck line)");
    cr_expect(line && strstr(line, "\"below\":0,"), "named after its recheck: %.300s",
              line ? line : "(no preflight line)");
    free(recheck), free(line);
}
