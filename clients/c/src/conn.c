/* Finding strapd and talking to it: the socket resolution of PROTOCOL.md 1, the detached
 * `strapd serve` started when nobody answers, by one process at a time (the flock on
 * strapd.sock.lock beside the socket, shared with the Python client's _daemon.py), and the
 * SOCK_SEQPACKET connection with SCM_RIGHTS descriptors. */
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

/* Connect; returns the socket or -errno. */
static int try_connect(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof a.sun_path)
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* The console script pip writes for `strapd` runs the Python client's finder; finding it must
 * not count as finding the daemon (as in _daemon.py). */
static bool is_shim(const char *path)
{
	char head[1024];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, head, sizeof head - 1);
	close(fd);
	if (n < 2)
		return false;
	head[n] = 0;
	return head[0] == '#' && head[1] == '!' && strstr(head, "llm_instrumentation._strapd_cli");
}

static bool executable(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0 && !is_shim(path);
}

/* params.strapd_bin, $STRAPD_BIN, then `strapd` on PATH. */
static bool find_binary(const char *given, char *out, size_t cap)
{
	const char *env = getenv("STRAPD_BIN");
	const char *first = given && *given ? given : (env && *env ? env : NULL);
	if (first) {
		snprintf(out, cap, "%s", first);
		return access(first, X_OK) == 0;
	}
	const char *path = getenv("PATH");
	if (!path)
		path = "/usr/local/bin:/usr/bin:/bin";
	while (*path) {
		const char *c = strchr(path, ':');
		size_t n = c ? (size_t)(c - path) : strlen(path);
		snprintf(out, cap, "%.*s/strapd", (int)n, n ? path : ".");
		if (executable(out))
			return true;
		path += n + (c ? 1 : 0);
	}
	out[0] = 0;
	return false;
}

static void log_tail(const char *log, char *out, size_t cap)
{
	out[0] = 0;
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(out, cap, "(no log)");
		return;
	}
	off_t size = lseek(fd, 0, SEEK_END);
	off_t from = size > (off_t)(cap - 1) ? size - (off_t)(cap - 1) : 0;
	ssize_t n = pread(fd, out, cap - 1, from);
	close(fd);
	out[n > 0 ? n : 0] = 0;
}

static int mkdirs(char *dir)
{
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		int r = mkdir(dir, 0700);
		*p = '/';
		if (r != 0 && errno != EEXIST)
			return -1;
	}
	return mkdir(dir, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* Start `strapd serve --socket path --exit-idle ...` detached (its own session, log beside
 * the socket) by a double fork, so it is never left as this process's zombie; returns its pid
 * (>0) or a STRAP_E_* code with err set. Between fork and exec only async-signal-safe calls. */
/* An environment switch as the Python client reads one: set, and neither empty nor "0". */
static bool env_on(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0;
}

static pid_t spawn_daemon(const char *bin, const char *sock, char *log, size_t logcap, strap_error *err)
{
	char dir[4200];
	snprintf(dir, sizeof dir, "%s", sock);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdirs(dir) != 0) {
			se_set(err, STRAP_E_CONNECT, "cannot create the socket directory %s: %s", dir, strerror(errno));
			return STRAP_E_CONNECT;
		}
	} else {
		snprintf(dir, sizeof dir, ".");
	}
	snprintf(log, logcap, "%s/strapd.log", dir);
	const char *idle = getenv("STRAPD_EXIT_IDLE");
	char *argv[9] = {(char *)bin,  "serve",       "--socket",
			 (char *)sock, "--exit-idle", (char *)(idle && *idle ? idle : "15m")};
	int argc = 6;
	/* as the Python client: the model's threads preempt the daemon (DEPLOY.md, CPU priority) */
	if (env_on("STRAPD_SCHED_IDLE"))
		argv[argc++] = "--sched-idle";
	if (env_on("STRAPD_IDLE_WORKERS"))
		argv[argc++] = "--idle-workers";
	argv[argc] = NULL;
	int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (logfd < 0) {
		se_set(err, STRAP_E_CONNECT, "cannot open the daemon log %s: %s", log, strerror(errno));
		return STRAP_E_CONNECT;
	}
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		close(logfd);
		se_set(err, STRAP_E_SYSTEM, "pipe2: %s", strerror(errno));
		return STRAP_E_SYSTEM;
	}
	pid_t child = fork();
	if (child < 0) {
		int e = errno;
		close(logfd), close(pfd[0]), close(pfd[1]);
		se_set(err, STRAP_E_SYSTEM, "fork: %s", strerror(e));
		return STRAP_E_SYSTEM;
	}
	if (child == 0) {
		pid_t g = fork();
		if (g != 0) {
			int32_t v = (int32_t)g;
			if (write(pfd[1], &v, sizeof v) < 0)
				_exit(1);
			_exit(0);
		}
		setsid();
		int nul = open("/dev/null", O_RDONLY);
		if (nul >= 0)
			dup2(nul, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		/* the pipe becomes fd 3 (closed by exec); every other descriptor of the host process
		 * stays out of the daemon */
		if (pfd[1] != 3) {
			dup2(pfd[1], 3);
			pfd[1] = 3;
		}
		fcntl(3, F_SETFD, FD_CLOEXEC);
#ifdef SYS_close_range
		if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
#endif
		{
			for (int fd = 4; fd < 65536; fd++)
				close(fd);
		}
		signal(SIGPIPE, SIG_DFL);
		execv(bin, argv);
		int32_t e = errno;
		if (write(pfd[1], &e, sizeof e) < 0)
			_exit(127);
		_exit(127);
	}
	close(pfd[1]);
	close(logfd);
	int st;
	while (waitpid(child, &st, 0) < 0 && errno == EINTR)
		;
	int32_t v[2] = {0, 0};
	ssize_t got = 0, r;
	while (got < (ssize_t)sizeof v && (r = read(pfd[0], (char *)v + got, sizeof v - (size_t)got)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		got += r;
	}
	close(pfd[0]);
	if (got < 4) {
		se_set(err, STRAP_E_CONNECT, "could not start %s (fork of the daemon failed)", bin);
		return STRAP_E_CONNECT;
	}
	if (got >= 8) {
		se_set(err, STRAP_E_CONNECT, "could not start %s: exec: %s", bin, strerror(v[1]));
		return STRAP_E_CONNECT;
	}
	return (pid_t)v[0];
}

/* Open the autostart lock (PROTOCOL.md 1): read-write so its holder can write its pid,
 * read-only when the file is another user's in a shared socket directory (flock needs no
 * more). Returns the descriptor or STRAP_E_CONNECT with err set. */
static int open_lock(const char *lock, const char *sock, strap_error *err)
{
	int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 && errno == EACCES)
		fd = open(lock, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		se_set(err, STRAP_E_CONNECT,
		       "cannot open the autostart lock %s: %s (set STRAPD_SOCKET to a path in a directory you can "
		       "write, or start `strapd serve --socket %s` yourself)",
		       lock, strerror(errno), sock);
		return STRAP_E_CONNECT;
	}
	return fd;
}

/* " (pid N)" of the lock's holder, as it wrote it, or "" */
static void lock_holder(int fd, char *out, size_t cap)
{
	char b[24];
	ssize_t n = pread(fd, b, sizeof b - 1, 0);
	int pid = 0;
	out[0] = 0;
	if (n > 0) {
		b[n] = 0;
		pid = atoi(b);
	}
	if (pid > 0)
		snprintf(out, cap, " (pid %d)", pid);
}

/* With the lock held and still nobody answering: start the daemon and wait until it accepts.
 * A daemon that exits at start-up may have found another one serving (it exits 0 then): one
 * more connect tells. */
static int start_and_wait(const char *path, const char *bin_given, double timeout, strap_error *err)
{
	char bin[4200];
	if (!find_binary(bin_given, bin, sizeof bin)) {
		se_set(err, STRAP_E_CONNECT,
		       "no strapd answers on %s and no strapd binary was found%s%s (set STRAPD_BIN, put strapd "
		       "on PATH, or start `strapd serve` yourself)",
		       path, bin[0] ? ": not executable: " : "", bin);
		return STRAP_E_CONNECT;
	}
	char log[4300];
	pid_t pid = spawn_daemon(bin, path, log, sizeof log, err);
	if (pid < 0)
		return pid;
	double deadline = sc_now() + timeout;
	for (;;) {
		bool exited = kill(pid, 0) != 0 && errno == ESRCH;
		int fd = try_connect(path);
		if (fd >= 0)
			return fd;
		char tail[600];
		if (exited) {
			log_tail(log, tail, sizeof tail);
			se_set(err, STRAP_E_CONNECT,
			       "strapd (pid %d) exited at start-up; log %s:\n%s\n(fix what the log says; run `%s serve "
			       "--socket %s` to see it happen; or point STRAPD_BIN at a working strapd)",
			       (int)pid, log, tail, bin, path);
			return STRAP_E_CONNECT;
		}
		if (sc_now() > deadline) {
			log_tail(log, tail, sizeof tail);
			se_set(err, STRAP_E_CONNECT,
			       "strapd (pid %d) did not accept connections on %s within %.0fs; log %s:\n%s\n(check "
			       "`strapd status --socket %s`; start `strapd serve --socket %s` yourself; or set "
			       "STRAPD_SOCKET to another path)",
			       (int)pid, path, timeout, log, tail, path, path);
			return STRAP_E_CONNECT;
		}
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

int sc_connect(const char *explicit_path, int autostart, const char *bin_given, double timeout, char *path,
	       size_t pathcap, strap_error *err)
{
	if (strap_resolve_socket_path(explicit_path, path, pathcap) != STRAP_OK) {
		se_set(err, STRAP_E_INVALID, "socket path too long");
		return STRAP_E_INVALID;
	}
	int fd = try_connect(path);
	if (fd >= 0)
		return fd;
	if (fd != -ENOENT && fd != -ECONNREFUSED) {
		se_set(err, STRAP_E_CONNECT,
		       "cannot connect to strapd on %s: %s (check that STRAPD_SOCKET or params.socket_path names "
		       "strapd's socket; `strapd status --socket %s`)",
		       path, strerror(-fd), path);
		return STRAP_E_CONNECT;
	}
	if (!autostart) {
		se_set(err, STRAP_E_CONNECT,
		       "no strapd answers on %s: %s (start `strapd serve --socket %s` first, or set params.autostart)",
		       path, strerror(-fd), path);
		return STRAP_E_CONNECT;
	}
	/* Of the processes finding no daemon at once, the one holding the lock starts it and keeps
	 * the lock until it accepts; the others connect as soon as it does (PROTOCOL.md 1). */
	char dir[4200], lock[4210];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdirs(dir) != 0) {
			se_set(err, STRAP_E_CONNECT,
			       "cannot create the socket directory %s: %s (set STRAPD_SOCKET to a path in a directory "
			       "you can write)",
			       dir, strerror(errno));
			return STRAP_E_CONNECT;
		}
	}
	snprintf(lock, sizeof lock, "%s.lock", path);
	int lk = open_lock(lock, path, err);
	if (lk < 0)
		return lk;
	double start = timeout > 0 ? timeout : 10.0;
	double deadline = sc_now() + 3 * start;
	for (;;) {
		if (flock(lk, LOCK_EX | LOCK_NB) == 0)
			break;
		if (errno != EWOULDBLOCK && errno != EINTR) {
			se_set(err, STRAP_E_CONNECT,
			       "flock %s: %s (start `strapd serve --socket %s` yourself, or set STRAPD_SOCKET "
			       "to a path on a local file system)",
			       lock, strerror(errno), path);
			close(lk);
			return STRAP_E_CONNECT;
		}
		if ((fd = try_connect(path)) >= 0) { /* the holder's daemon answers */
			close(lk);
			return fd;
		}
		if (sc_now() > deadline) {
			char holder[32];
			lock_holder(lk, holder, sizeof holder);
			se_set(err, STRAP_E_CONNECT,
			       "no strapd answers on %s after waiting %.0fs for the autostart lock %s, held by another "
			       "process starting strapd%s; if that process is stuck, end it (the lock goes with it), "
			       "or start `strapd serve --socket %s` yourself",
			       path, 3 * start, lock, holder, path);
			close(lk);
			return STRAP_E_CONNECT;
		}
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	/* a daemon started while this process waited for the lock */
	fd = try_connect(path);
	if (fd < 0) {
		char me[24];
		int n = snprintf(me, sizeof me, "%d\n", (int)getpid());
		/* may fail (read-only): the pid only names the holder in others' errors */
		bool wrote = ftruncate(lk, 0) == 0 && pwrite(lk, me, (size_t)n, 0) == n;
		(void)wrote;
		fd = start_and_wait(path, bin_given, start, err);
	}
	close(lk); /* releases the flock */
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
