/* Finding strapd and talking to it: the socket resolution of PROTOCOL.md 1; the connect, with
 * the detached `strapd serve` started when nobody answers, by one process at a time, is
 * common/strap_connect.h (the Python client's _daemon.py connects with it too). The datagrams
 * are common/strap_channel.h's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "strap_connect.h"

#define ROOT_SOCKET "/run/strapd/strapd.sock"

int strap_resolve_socket_path(const char *explicit_path, char *buf, size_t len)
{
	const char *p = explicit_path && *explicit_path ? explicit_path : NULL;
	char tmp[4200];
	if (!p) {
		const char *env = getenv("STRAPD_SOCKET");
		if (env && *env) {
			p = env;
		} else if (access(ROOT_SOCKET, F_OK) == 0) {
			p = ROOT_SOCKET;
		} else {
			const char *xdg = getenv("XDG_RUNTIME_DIR");
			if (xdg && *xdg)
				snprintf(tmp, sizeof tmp, "%s/strapd/strapd.sock", xdg);
			else
				snprintf(tmp, sizeof tmp, "/tmp/strapd-%u/strapd.sock", (unsigned)getuid());
			p = tmp;
		}
	}
	size_t n = strlen(p);
	if (!buf || n + 1 > len)
		return STRAP_E_TOO_LARGE;
	memcpy(buf, p, n + 1);
	return STRAP_OK;
}

double sc_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int sc_connect(const char *explicit_path, int autostart, const char *bin_given, double timeout, char *path,
	       size_t pathcap, strap_error *err)
{
	if (strap_resolve_socket_path(explicit_path, path, pathcap) != STRAP_OK) {
		se_set(err, STRAP_E_INVALID, "socket path too long");
		return STRAP_E_INVALID;
	}
	sk_options o = {
		.binary = bin_given,
		.timeout = timeout,
		.lock_timeout = -1,
		.autostart_hint = "set params.autostart",
		.socket_hint = "STRAPD_SOCKET or params.socket_path",
		.binary_hint = "set STRAPD_BIN, put strapd on PATH, or start `strapd serve` yourself",
	};
	sk_result r; /* 12 KiB on the stack: once per session open, never per record */
	int fd = sk_connect(path, autostart, &o, &r);
	if (fd < 0) {
		se_set(err, STRAP_E_CONNECT, "%s", r.msg);
		return STRAP_E_CONNECT;
	}
	return fd;
}
