/* The connection to strapd (conn.c): socket resolution, autostart, datagrams with fds. */
#ifndef STRAP_CONN_H
#define STRAP_CONN_H

#include <sys/types.h>

#include "internal.h"

#define sc_now strap__sc_now
#define sc_connect strap__sc_connect
#define sc_send strap__sc_send
#define sc_recv strap__sc_recv

/* Monotonic seconds. */
double sc_now(void);
/* Resolve the socket (into path), connect, start strapd when nobody answers and autostart is
 * set. Returns the connected socket, or a STRAP_E_* code with err set. */
int sc_connect(const char *explicit_path, int autostart, const char *bin, double timeout, char *path, size_t pathcap,
	       strap_error *err);
/* Send one datagram with up to 4 descriptors; 0 or -errno. */
int sc_send(int fd, const void *data, size_t n, const int *fds, int nfds);
/* Receive one datagram, waiting up to timeout_ms (0: poll, -1: forever). Returns its full
 * length (may exceed cap: then it was truncated), 0 for EOF, -EAGAIN when nothing came, or
 * -errno. */
ssize_t sc_recv(int fd, uint8_t *buf, size_t cap, int timeout_ms);

#endif
