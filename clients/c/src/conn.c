/* Finding strapd and talking to it: the socket resolution of PROTOCOL.md 1; the connect, with
 * the detached `strapd serve` started when nobody answers, by one process at a time, is
 * common/strap_connect.h (the Python client's _daemon.py connects with it too); and the
 * SOCK_SEQPACKET datagrams with SCM_RIGHTS descriptors. */
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

int sc_send(int fd, const void *data, size_t n, const int *fds, int nfds)
{
	struct iovec iov = {(void *)data, n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	if (nfds > 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	for (;;) {
		ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
		if (r >= 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

ssize_t sc_recv(int fd, uint8_t *buf, size_t cap, int timeout_ms)
{
	if (timeout_ms != 0) {
		struct pollfd p = {fd, POLLIN, 0};
		int r;
		while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
			;
		if (r == 0)
			return -EAGAIN;
	}
	for (;;) {
		/* MSG_TRUNC: the real datagram length, so an oversized one is caught */
		ssize_t r = recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
		if (r >= 0)
			return r;
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	}
}
