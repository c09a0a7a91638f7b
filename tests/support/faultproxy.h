/* A fault-injecting HTTP/1.1 proxy for tests: listens on 127.0.0.1, passes
 * requests to an upstream server (radosgw) and their answers back, and can
 * be told to answer the next requests itself with a fault instead. It
 * understands request and response framing (Content-Length and chunked
 * answers, HEAD, 204/304), so keep-alive connections keep working. Client
 * requests must carry Content-Length (no chunked uploads, no Expect). */
#ifndef RL_TEST_FAULTPROXY_H
#define RL_TEST_FAULTPROXY_H

typedef enum {
    RL_FAULT_SLOWDOWN = 1, /* 503 with S3's <Error><Code>SlowDown</Code> (after reading the whole request) */
    RL_FAULT_INTERNAL,     /* 500 InternalError */
    RL_FAULT_ERROR_IN_200, /* 200 whose body is an <Error> InternalError */
    RL_FAULT_DROP,         /* close the connection after reading the request head: no answer at all */
    RL_FAULT_HOLD,         /* read the whole request, then answer nothing until the client goes (or stop) */
} rl_fault;

typedef struct rl_fault_proxy rl_fault_proxy;
/* 0 on success. */
int rl_fault_proxy_start(const char *up_host, int up_port, rl_fault_proxy **out);
int rl_fault_proxy_port(const rl_fault_proxy *p);
/* The next n requests (whose request line contains `match`, or any when
 * match is NULL) get `kind` instead of an answer from upstream. */
void rl_fault_proxy_inject(rl_fault_proxy *p, rl_fault kind, int n, const char *match);
int rl_fault_proxy_requests(rl_fault_proxy *p); /* requests seen */
int rl_fault_proxy_injected(rl_fault_proxy *p); /* faults delivered */
void rl_fault_proxy_stop(rl_fault_proxy *p);

#endif
