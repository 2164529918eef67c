/* Socket resolution (PROTOCOL.md 1) and autostart (the Python client's rules): no daemon on a
 * fresh socket path, autostart on, STRAPD_BIN set -> strapd is started detached, with its log
 * beside the socket, with STRAPD_EXIT_IDLE and STRAPD_SCHED_IDLE passed on, and the capture goes
 * through; autostart off -> a clear error; a binary that cannot run -> a clear error. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

int main(void)
{
	char buf[600];
	unsetenv("STRAPD_SOCKET");
	CHECK(strap_resolve_socket_path("/x/y.sock", buf, sizeof buf) == STRAP_OK && strcmp(buf, "/x/y.sock") == 0,
	      "explicit");
	setenv("STRAPD_SOCKET", "/env/s.sock", 1);
	CHECK(strap_resolve_socket_path(NULL, buf, sizeof buf) == STRAP_OK && strcmp(buf, "/env/s.sock") == 0,
	      "env: %s", buf);
	CHECK(strap_resolve_socket_path(NULL, buf, 5) == STRAP_E_TOO_LARGE, "small buffer");
	unsetenv("STRAPD_SOCKET");
	struct stat st;
	if (stat("/run/strapd/strapd.sock", &st) != 0) { /* a root daemon's socket wins when it exists */
		setenv("XDG_RUNTIME_DIR", "/xdg", 1);
		CHECK(strap_resolve_socket_path(NULL, buf, sizeof buf) == STRAP_OK &&
			      strcmp(buf, "/xdg/strapd/strapd.sock") == 0,
		      "xdg: %s", buf);
		unsetenv("XDG_RUNTIME_DIR");
		char want[100];
		snprintf(want, sizeof want, "/tmp/strapd-%u/strapd.sock", (unsigned)getuid());
		CHECK(strap_resolve_socket_path(NULL, buf, sizeof buf) == STRAP_OK && strcmp(buf, want) == 0, "tmp: %s",
		      buf);
	} else {
		printf("autostart: /run/strapd/strapd.sock exists, its precedence over XDG_RUNTIME_DIR not checked\n");
	}

	char dir[] = "/tmp/strap-autostart-XXXXXX";
	if (!mkdtemp(dir))
		return 1;
	char sock[200], out[200];
	snprintf(sock, sizeof sock, "%s/run/strapd/strapd.sock", dir); /* parent dirs do not exist yet */
	snprintf(out, sizeof out, "%s/auto.strap", dir);
	strap_session_params p = strap_default_session_params();
	p.socket_path = sock;
	p.output_path = out;
	p.autostart = 0;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_E_CONNECT && strstr(e.message, "no strapd answers on"), "autostart off: %d %s", rc,
	      e.message);

	p.autostart = 1;
	p.strapd_bin = "/nonexistent/strapd";
	rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_E_CONNECT && strstr(e.message, "not executable: /nonexistent/strapd"), "bad binary: %d %s",
	      rc, e.message);
	p.strapd_bin = "/bin/false"; /* starts and exits at once */
	rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_E_CONNECT && strstr(e.message, "exited at start-up"), "exiting binary: %d %s", rc, e.message);

	/* a descriptor of the host without O_CLOEXEC must not reach the detached daemon */
	char marker[300];
	snprintf(marker, sizeof marker, "%s/host-only-marker", dir);
	int leak = open(marker, O_WRONLY | O_CREAT, 0600);
	CHECK(leak >= 0, "open marker");
	p.strapd_bin = NULL; /* $STRAPD_BIN, as set by the test environment */
	setenv("STRAPD_EXIT_IDLE", "30s", 1);
	setenv("STRAPD_SCHED_IDLE", "1", 1);   /* passed on as --sched-idle, as by the Python client */
	setenv("STRAPD_IDLE_WORKERS", "0", 1); /* "0" is off */
	rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_OK, "autostart: %d %s", rc, e.message);
	if (rc == STRAP_OK) {
		CHECK_RC(s, strap_session_write(s, "x", STRAP_DTYPE_I32, NULL, 0, "\1\0\0\0", 4, NULL), STRAP_OK);
		CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
		strap_session_free(s);
	}
	char log[300];
	snprintf(log, sizeof log, "%s/run/strapd/strapd.log", dir);
	CHECK(stat(log, &st) == 0 && st.st_size > 0, "no daemon log at %s", log);
	/* the daemon outlives the session; find it through STATUS and stop it */
	static char status[1 << 16];
	rc = strap_status(sock, status, sizeof status, NULL, &e);
	CHECK(rc == STRAP_OK, "status: %s", e.message);
	const char *pid = strstr(status, "\"pid\":");
	if (pid) {
		int dpid = atoi(pid + 6);
		CHECK(dpid > 1 && dpid != getpid(), "daemon pid %d", dpid);
		char fds[64], cmd0[600], found[4096];
		snprintf(fds, sizeof fds, "/proc/%d/fd", dpid);
		snprintf(cmd0, sizeof cmd0, "ls -l %s 2>&1 | grep -c host-only-marker", fds);
		th_run(cmd0, found, sizeof found);
		CHECK(atoi(found) == 0, "the daemon holds the host's descriptor: %s", found);
		snprintf(cmd0, sizeof cmd0, "tr '\\0' ' ' < /proc/%d/cmdline", dpid);
		th_run(cmd0, found, sizeof found);
		CHECK(strstr(found, " serve --socket ") && strstr(found, " --exit-idle 30s --sched-idle") &&
			      !strstr(found, "--idle-workers"),
		      "the daemon's command line: %s", found);
		if (dpid > 1)
			kill(dpid, SIGTERM);
	}
	char cmd[400];
	snprintf(cmd, sizeof cmd, "'%s' verify '%s' >/dev/null", th_env("STRAPD_BIN"), out);
	CHECK(th_run(cmd, NULL, 0) == 0, "verify %s", out);
	close(leak);
	sleep(1);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		perror("rm");
	return th_done("autostart");
}
