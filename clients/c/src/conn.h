/* The connection to strapd (conn.c): socket resolution, autostart (the datagrams: common/strap_channel.h). */
#ifndef STRAP_CONN_H
#define STRAP_CONN_H

#include <sys/types.h>

#include "internal.h"

#define sc_now strap__sc_now
#define sc_connect strap__sc_connect

/* Monotonic seconds. */
double sc_now(void);
/* Resolve the socket (into path), connect, start strapd when nobody answers and autostart is
 * set. Returns the connected socket, or a STRAP_E_* code with err set. */
int sc_connect(const char *explicit_path, int autostart, const char *bin, double timeout, char *path, size_t pathcap,
	       strap_error *err);
#endif
