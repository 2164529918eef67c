/*
 * The control connection's datagrams (docs/PROTOCOL.md 1), written once for the client side:
 * one SOCK_SEQPACKET datagram sent with its descriptors (SCM_RIGHTS), one received with a
 * timeout, and the daemon's last ERROR salvaged from a connection it closed. libstrap's
 * sessions (src/session.c, src/open.c; the Python client's are libstrap's) talk to strapd with
 * them, and the Python tests' peers through _speedups_channel.c; the bodies are strap_wire.h's.
 */
#ifndef STRAP_CHANNEL_H
#define STRAP_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Internal symbols carry libstrap's prefix: a static libstrap.a shares one namespace with its
 * host program. */
#define sch_send strap__sch_send
#define sch_recv strap__sch_recv
#define sch_salvage strap__sch_salvage

enum {
    /* Descriptors one datagram carries at most (OPEN: ring, output, trace, resource log). */
    SCH_MAX_FDS = 4,
};

/* Send one datagram with up to SCH_MAX_FDS descriptors (MSG_NOSIGNAL: a closed peer is EPIPE,
 * not a signal). 0, or -errno. */
int sch_send(int fd, const void *data, size_t n, const int *fds, int nfds);
/* Receive one datagram into buf, waiting up to timeout_ms (0: poll, -1: forever). Returns its
 * full length (more than cap: it was truncated to cap, a message too long), 0 at EOF, -EAGAIN
 * when nothing came in time (or a wait was interrupted by a signal: the caller runs its handlers
 * and calls again), or -errno. */
ssize_t sch_recv(int fd, uint8_t *buf, size_t cap, int timeout_ms);
/* What a daemon sent before it closed the connection: every datagram still queued is read
 * into buf and handed to each (a peer closing with our messages unread makes one recv fail with
 * ECONNRESET, then what it sent before closing is still there: its last ERROR, usually,
 * PROTOCOL.md 1.4). Returns how many were handed over. */
int sch_salvage(int fd, uint8_t *buf, size_t cap, void (*each)(const uint8_t *msg, size_t n, void *arg), void *arg);

#endif
