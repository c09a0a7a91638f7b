/* GET /metrics and GET /healthz on libmicrohttpd.
 *
 * We bind the listening socket ourselves and hand it to MHD: MHD's own
 * bind failure is a NULL daemon with no reason, and "port in use" must be
 * an error naming the port. One internal polling thread serves every
 * connection (no thread per scraper), at most MAX_CONN at once, each
 * closed after IDLE_S without traffic, so a stuck client costs a slot for
 * seconds, never a thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics.h"

#define MAX_CONN 16
#define IDLE_S 10

struct rl_metrics_server {
    struct MHD_Daemon *d;
    rl_metrics *m;
    int port;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *ctype, char *body, size_t len,
                             bool owned) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (owned) free(body);
        return MHD_NO; /* out of memory: MHD closes the connection */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result q = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return q;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload, (void)upload_size, (void)state;
    rl_metrics_server *s = cls;
    static char text_plain[] = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char msg[] = "only GET and HEAD\n";
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text_plain, msg, sizeof msg - 1, false);
    }
    if (strcmp(url, "/metrics") == 0) {
        char *body = rl_metrics_render(s->m, rl_wall_now());
        if (!body) return MHD_NO;
        return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, strlen(body), true);
    }
    if (strcmp(url, "/healthz") == 0) {
        /* the agent's loop is not consulted: alive enough to answer is the
         * liveness a kubelet probe can act on without killing a busy agent */
        static char ok[] = "ok\n";
        return reply(c, MHD_HTTP_OK, text_plain, ok, sizeof ok - 1, false);
    }
    static char nf[] = "not found: try /metrics or /healthz\n";
    return reply(c, MHD_HTTP_NOT_FOUND, text_plain, nf, sizeof nf - 1, false);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[400], b[800];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    rl_log(RL_LOG_WARN, "metrics_http", "\"msg\":\"%s\"", rl_json_escape(b, sizeof b, msg));
}

int rl_metrics_start(int port, const char *addr, rl_metrics *m, rl_metrics_server **out, rl_err *e) {
    *out = NULL;
    if (port == 0) return RL_OK;
    if (port < RL_METRICS_ANY_PORT || port > 65535)
        return rl_errf(e, RL_EINPUT, "metrics port %d: must be 0 (off) or 1..65535", port);
    const char *host = addr && *addr ? addr : "0.0.0.0";
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    uint16_t p = (uint16_t)(port < 0 ? 0 : port);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET, v4->sin_port = htons(p), sl = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6, v6->sin6_port = htons(p), sl = sizeof *v6;
    } else {
        return rl_errf(e, RL_EINPUT, "metrics: \"%.64s\" is not an IP address to listen on", host);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return rl_errf(e, RL_EIO, "metrics: socket: %s", strerror(errno));
    /* a restarted agent may rebind while old connections sit in
     * TIME_WAIT; a port another process listens on still fails */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        close(fd);
        return rl_errf(e, RL_EINPUT, "metrics port %d on %s: cannot listen: %s (--metrics-port / RINGLEADER_METRICS_PORT)",
                       port < 0 ? 0 : port, host, strerror(err));
    }
    rl_metrics_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return rl_errf(e, RL_ENOMEM, "metrics: out of memory");
    }
    s->m = m;
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &gl);
    s->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                              : ((struct sockaddr_in *)&got)->sin_port);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONN,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_S,
                            MHD_OPTION_END);
    if (!s->d) {
        /* whether MHD already closed the socket on this path is not
         * documented: leave it rather than risk closing a reused number */
        int bound = s->port;
        free(s);
        return rl_errf(e, RL_EIO, "metrics port %d on %s: the HTTP server did not start", bound, host);
    }
    *out = s;
    return RL_OK;
}

int rl_metrics_server_port(const rl_metrics_server *s) { return s ? s->port : 0; }

void rl_metrics_stop(rl_metrics_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->d); /* joins its thread, closes the listening socket */
    free(s);
}
