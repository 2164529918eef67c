#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int th_failures;

const char *th_env(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v) {
		fprintf(stderr, "%s is not set (run through `make test-c` or ctest)\n", name);
		exit(2);
	}
	return v;
}

static int can_connect(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

int th_start_daemon(th_daemon *d, const char *const *extra)
{
	memset(d, 0, sizeof *d);
	snprintf(d->dir, sizeof d->dir, "/tmp/strap-ctest-XXXXXX");
	if (!mkdtemp(d->dir)) {
		perror("mkdtemp");
		return -1;
	}
	snprintf(d->socket, sizeof d->socket, "%s/strapd.sock", d->dir);
	const char *bin = th_env("STRAPD_BIN");
	char log[400];
	snprintf(log, sizeof log, "%s/strapd.log", d->dir);
	const char *argv[32] = {bin, "serve", "--socket", d->socket, NULL};
	int n = 4;
	for (int i = 0; extra && extra[i] && n < 30; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	d->pid = fork();
	if (d->pid == 0) {
		FILE *f = freopen(log, "a", stdout);
		(void)f;
		dup2(1, 2);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 400; i++) {
		if (can_connect(d->socket))
			return 0;
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			fprintf(stderr, "strapd exited at start-up (status %d); log %s\n", st, log);
			char cmd[500];
			snprintf(cmd, sizeof cmd, "cat %s >&2", log);
			if (system(cmd) < 0)
				perror("system");
			return -1;
		}
		struct timespec ts = {0, 25 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "strapd did not accept on %s within 10 s\n", d->socket);
	return -1;
}

/* The daemon's directory goes too, unless a check failed (then it is kept to look at). */
static void remove_dir(th_daemon *d)
{
	if (th_failures || !d->dir[0])
		return;
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
	d->dir[0] = 0;
}

void th_stop_daemon(th_daemon *d)
{
	if (d->pid <= 0) {
		remove_dir(d);
		return;
	}
	kill(d->pid, SIGTERM);
	for (int i = 0; i < 800; i++) {
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			remove_dir(d);
			return;
		}
		struct timespec ts = {0, 25 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
	remove_dir(d);
}

int th_run(const char *cmd, char *out, size_t cap)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	size_t n = 0;
	char tmp[4096];
	size_t r;
	while ((r = fread(tmp, 1, sizeof tmp, p)) > 0) {
		if (out && n + 1 < cap) {
			size_t k = r < cap - 1 - n ? r : cap - 1 - n;
			memcpy(out + n, tmp, k);
			n += k;
		}
	}
	if (out && cap)
		out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void th_fill(void *buf, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

int th_done(const char *name)
{
	if (th_failures) {
		fprintf(stderr, "%s: %d check(s) failed\n", name, th_failures);
		return 1;
	}
	printf("%s: ok\n", name);
	return 0;
}

strap_session *th_open(th_daemon *d, strap_session_params *p)
{
	p->socket_path = d->socket;
	p->autostart = 0;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(p, &s, &e);
	if (rc != STRAP_OK) {
		fprintf(stderr, "strap_session_open: %s: %s\n", strap_errstr(rc), e.message);
		th_stop_daemon(d);
		exit(1);
	}
	return s;
}

void th_expect_open(th_expect *x, const char *dir)
{
	snprintf(x->dir, sizeof x->dir, "%s", dir);
	mkdir(dir, 0755);
	char path[500];
	snprintf(path, sizeof path, "%s/manifest.jsonl", dir);
	x->manifest = fopen(path, "w");
	x->n = 0;
}

void th_expect_tensor(th_expect *x, const char *name, const char *dtype, const int64_t *shape, int ndim, uint64_t step,
		      uint64_t forward, const char *meta, const void *data, size_t n, int parts)
{
	char file[600];
	snprintf(file, sizeof file, "%s/%d.bin", x->dir, x->n);
	FILE *f = fopen(file, "wb");
	if (n)
		fwrite(data, 1, n, f);
	fclose(f);
	fprintf(x->manifest, "{\"kind\":\"tensor\",\"name\":\"%s\",\"dtype\":\"%s\",\"shape\":[", name, dtype);
	for (int i = 0; i < ndim; i++)
		fprintf(x->manifest, "%s%lld", i ? "," : "", (long long)shape[i]);
	fprintf(x->manifest, "],\"step\":%llu,\"forward\":%llu,\"meta\":%s,\"file\":\"%d.bin\",\"parts\":%d}\n",
		(unsigned long long)step, (unsigned long long)forward, meta ? meta : "{}", x->n, parts);
	x->n++;
}

void th_expect_token(th_expect *x, uint64_t index, int64_t token_id, const char *text)
{
	fprintf(x->manifest, "{\"kind\":\"token\",\"index\":%llu,\"token_id\":%lld,\"text\":\"%s\"}\n",
		(unsigned long long)index, (long long)token_id, text);
}

void th_expect_drop(th_expect *x, const char *name, size_t bytes)
{
	fprintf(x->manifest, "{\"kind\":\"drop\",\"name\":\"%s\",\"bytes\":%zu}\n", name, bytes);
}

void th_expect_close(th_expect *x)
{
	if (x->manifest)
		fclose(x->manifest);
	x->manifest = NULL;
}

void th_check_stream(const char *stream, th_expect *x)
{
	char cmd[2000], out[1 << 16];
	snprintf(cmd, sizeof cmd, "'%s' verify '%s' 2>&1", th_env("STRAPD_BIN"), stream);
	int rc = th_run(cmd, out, sizeof out);
	CHECK(rc == 0, "strapd verify %s exited %d:\n%s", stream, rc, out);
	snprintf(cmd, sizeof cmd, "'%s' inspect --json '%s' 2>&1", th_env("STRAPD_BIN"), stream);
	rc = th_run(cmd, out, sizeof out);
	CHECK(rc == 0, "strapd inspect %s exited %d:\n%s", stream, rc, out);
	if (x) {
		snprintf(cmd, sizeof cmd, "'%s' '%s/readback.py' '%s' '%s' 2>&1", th_env("STRAP_PYTHON"),
			 th_env("STRAP_TESTS"), stream, x->dir);
		rc = th_run(cmd, out, sizeof out);
		CHECK(rc == 0, "readback.py (Python open_stream) of %s exited %d:\n%s", stream, rc, out);
	}
}
