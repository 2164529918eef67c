/* Autostart without a race (PROTOCOL.md 1, issue 37): 16 processes call strap_session_open at
 * the same instant (a pipe they all read until the parent closes it), and with them 4 Python
 * clients connecting through llm_instrumentation, no daemon running and a stale socket file on
 * the path: every one succeeds, one strapd serves them all (the flock on strapd.sock.lock beside
 * the socket makes C and Python clients take turns), every stream verifies. First, a lock held
 * by another process (its pid written in it) past the wait gives an error naming the lock file
 * and that pid, and starts no daemon. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NC 16 /* C processes */
#define NPY 4 /* Python processes */

static const char PY_CLIENT[] = "import os, sys\n"
				"from llm_instrumentation import _daemon as D\n"
				"os.write(1, b'r')\n"
				"sys.stdin.buffer.read()\n" /* the barrier: EOF when the parent closes the pipe */
				"D.connect().close()\n"
				"D.status()\n"; /* HELLO and STATUS answered */

static char dir[] = "/tmp/strap-race-XXXXXX";
static char sock[200];

/* One C process: open a session once the barrier opens, write one record, close. */
static int c_child(int i, int ready, int go)
{
	char out[300], b;
	snprintf(out, sizeof out, "%s/cap.%d.strap", dir, i);
	strap_session_params p = strap_default_session_params();
	p.output_path = out; /* the socket: $STRAPD_SOCKET, as for the Python clients */
	p.ring_size = 1 << 20;
	if (write(ready, "r", 1) != 1 || read(go, &b, 1) != 0)
		return 3;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	if (rc != STRAP_OK) {
		fprintf(stderr, "process %d: strap_session_open: %d %s\n", i, rc, e.message);
		return 1;
	}
	int32_t v = i;
	rc = strap_session_write(s, "x", STRAP_DTYPE_I32, NULL, 0, &v, sizeof v, NULL);
	int rc2 = strap_session_close(s, NULL);
	if (rc != STRAP_OK || rc2 != STRAP_OK) {
		strap_session_last_error(s, &e);
		fprintf(stderr, "process %d: write %d close %d: %s\n", i, rc, rc2, e.message);
	}
	strap_session_free(s);
	return rc == STRAP_OK && rc2 == STRAP_OK ? 0 : 1;
}

/* Count the lines of the daemon log (beside the socket, shared by every autostarted daemon)
 * holding needle. */
static int log_lines(const char *needle)
{
	char cmd[600], out[64];
	snprintf(cmd, sizeof cmd, "grep -c '%s' '%s/strapd.log'", needle, dir);
	th_run(cmd, out, sizeof out);
	return atoi(out);
}

static void stale_socket(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	CHECK(n < sizeof a.sun_path, "socket path %s too long", path);
	if (n >= sizeof a.sun_path)
		return;
	memcpy(a.sun_path, path, n + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "stale socket %s", path);
	close(fd);
}

/* SIGTERM the daemon answering on path (its pid from STATUS) and wait for it to go. */
static void stop_daemon(const char *path)
{
	static char status[1 << 16];
	strap_error e;
	int rc = strap_status(path, status, sizeof status, NULL, &e);
	CHECK(rc == STRAP_OK, "status: %s", e.message);
	const char *pid = rc == STRAP_OK ? strstr(status, "\"pid\":") : NULL;
	int dpid = pid ? atoi(pid + 6) : 0;
	if (dpid <= 1 || dpid == getpid())
		return;
	kill(dpid, SIGTERM);
	for (int i = 0; i < 200 && kill(dpid, 0) == 0; i++) {
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

int main(void)
{
	alarm(300); /* a client that never reaches the barrier fails the test instead of hanging it */
	const char *py = th_env("STRAP_PYTHON");
	th_env("STRAPD_BIN");
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof sock, "%s/strapd.sock", dir);
	setenv("STRAPD_SOCKET", sock, 1);
	setenv("STRAPD_EXIT_IDLE", "30s", 1);
	unsetenv("STRAPD_SCHED_IDLE");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	char held[220], lock[230], cmd[700];
	snprintf(held, sizeof held, "%s/held", dir);
	CHECK(mkdir(held, 0700) == 0, "mkdir %s", held);
	snprintf(held, sizeof held, "%s/held/strapd.sock", dir);
	snprintf(lock, sizeof lock, "%s.lock", held);

	/* Another process holds the lock (flock(2), as the Python client takes it) past the wait. */
	int lk = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	CHECK(lk >= 0 && flock(lk, LOCK_EX) == 0, "take %s", lock);
	char me[32];
	int n = snprintf(me, sizeof me, "%d\n", (int)getpid());
	CHECK(pwrite(lk, me, (size_t)n, 0) == n, "write the holder's pid");
	strap_session_params p = strap_default_session_params();
	char out0[300];
	snprintf(out0, sizeof out0, "%s/held.strap", dir);
	p.output_path = out0;
	p.socket_path = held;
	p.start_timeout_s = 0.2; /* the lock is waited for 3 times the start time-out */
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	snprintf(me, sizeof me, "(pid %d)", (int)getpid());
	CHECK(rc == STRAP_E_CONNECT && strstr(e.message, lock) && strstr(e.message, me) &&
		      strstr(e.message, "`strapd serve --socket "),
	      "held lock: %d %s", rc, e.message);
	snprintf(cmd, sizeof cmd, "%s/held/strapd.log", dir);
	CHECK(access(cmd, F_OK) != 0, "a daemon was started past a held lock");
	if (rc == STRAP_OK) {
		strap_session_close(s, NULL);
		strap_session_free(s);
		stop_daemon(held);
	}
	close(lk);

	/* The race. */
	stale_socket(sock);
	int ready[2], go[2];
	if (pipe(ready) != 0 || pipe(go) != 0)
		return 1;
	pid_t pids[NC + NPY];
	for (int i = 0; i < NC + NPY; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("fork");
			return 1;
		}
		if (pids[i] > 0)
			continue;
		close(ready[0]);
		close(go[1]);
		if (i < NC)
			_exit(c_child(i, ready[1], go[0]));
		dup2(go[0], 0);
		dup2(ready[1], 1);
		execl(py, py, "-c", PY_CLIENT, (char *)NULL);
		_exit(127);
	}
	close(ready[1]);
	close(go[0]);
	char r[NC + NPY];
	ssize_t got = 0, k;
	while (got < NC + NPY && (k = read(ready[0], r, sizeof r)) > 0)
		got += k;
	CHECK(got == NC + NPY, "%zd of %d processes ready", got, NC + NPY);
	close(go[1]); /* all go */
	for (int i = 0; i < NC + NPY; i++) {
		int st = 0;
		waitpid(pids[i], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s process %d: status %d", i < NC ? "C" : "Python", i,
		      st);
	}
	close(ready[0]);
	/* one daemon started (a second one would log that it lost the socket) and served */
	int serving = log_lines("\"msg\":\"serving\""), lost = log_lines("another strapd");
	CHECK(serving == 1 && lost == 0, "%d daemons served, %d more started (want 1, 0); log %s/strapd.log", serving,
	      lost, dir);
	for (int i = 0; i < NC; i++) {
		snprintf(cmd, sizeof cmd, "'%s' verify '%s/cap.%d.strap' >/dev/null", th_env("STRAPD_BIN"), dir, i);
		CHECK(th_run(cmd, NULL, 0) == 0, "verify %s/cap.%d.strap", dir, i);
	}

	stop_daemon(sock);
	if (th_failures == 0) {
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			perror("rm");
	}
	return th_done("autostart_race");
}
