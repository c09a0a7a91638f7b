/* What the store's two ends share beyond the wire format (store_db.h). */
#ifndef RL_STORE_INTERNAL_H
#define RL_STORE_INTERNAL_H

/* Socket options for a store connection, client or server side: no Nagle
 * delay, no SIGPIPE, and TCP keepalive after 10 s idle (5 s apart, 3
 * probes), so a peer whose host vanished without a FIN is found out in
 * about 25 s -- a client's long GET fails, and a server's parked GET (its
 * idle clock stopped) gives its place back -- not after the kernel's two
 * hours. */
void rl_store__tune_socket(int fd);

#endif
