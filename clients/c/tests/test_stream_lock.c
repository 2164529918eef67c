/* The stream lock (CHECKPOINTS.md 5, issue 25): a second session on the output a live session
 * writes — in this process or another — fails at once with STRAP_E_IN_USE naming the file and
 * the holder's pid, and changes nothing in the file; the live session's stream ends complete
 * and reads back bit for bit. Once the first session is freed the file can be captured again. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long long file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* Try a second session on out; CHECK it is refused with STRAP_E_IN_USE naming out and want. */
static void want_in_use(th_daemon *d, const char *out, const char *want)
{
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.socket_path = d->socket;
	p.autostart = 0;
	p.ring_size = 4096 + (1 << 20);
	strap_session *s = NULL;
	strap_error e;
	double t0 = now();
	int rc = strap_session_open(&p, &s, &e);
	double took = now() - t0;
	CHECK(rc == STRAP_E_IN_USE && s == NULL, "second open: rc %d (%s): %s", rc, strap_errstr(rc), e.message);
	CHECK(strstr(e.message, out) && strstr(e.message, want), "message %s lacks %s or %s", e.message, out, want);
	CHECK(took < 5, "refused after %.1fs: a live holder must not be waited for", took);
	if (s)
		strap_session_free(s);
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600];
	snprintf(out, sizeof out, "%s/cap.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (1 << 20);
	strap_session *s = th_open(&d, &p);

	static uint8_t buf[16 << 10];
	int64_t shape[1] = {(int64_t)(sizeof buf / 4)};
	uint64_t seed = 1;
	for (int fwd = 0; fwd < 4; fwd++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		th_fill(buf, sizeof buf, seed++);
		CHECK_RC(s,
			 strap_session_write(s, "model.layers.0.mlp", STRAP_DTYPE_F32, shape, 1, buf, sizeof buf, NULL),
			 STRAP_OK);
		th_expect_tensor(&x, "model.layers.0.mlp", "float32", shape, 1, 0, (uint64_t)fwd, NULL, buf, sizeof buf,
				 1);
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		if (fwd == 1) {
			long long before = file_size(out);
			char self[64];
			snprintf(self, sizeof self, "this process (pid %d)", (int)getpid());
			want_in_use(&d, out, self);
			/* another process: its pid is not ours, the holder it names is us */
			snprintf(self, sizeof self, "process %d", (int)getpid());
			fflush(NULL);
			pid_t child = fork();
			if (child == 0) {
				want_in_use(&d, out, self);
				_exit(th_failures ? 1 : 0);
			}
			int st = 0;
			waitpid(child, &st, 0);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other process's checks failed (status %d)",
			      st);
			CHECK(file_size(out) >= before, "the live stream was cut: %lld < %lld bytes", file_size(out),
			      before);
		}
	}
	strap_closed c;
	CHECK_RC(s, strap_session_close(s, &c), STRAP_OK);
	/* closed but not freed: the session still holds its output */
	char self[64];
	snprintf(self, sizeof self, "this process (pid %d)", (int)getpid());
	want_in_use(&d, out, self);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);

	/* freed: the same file can be captured again (and is replaced) */
	strap_session *s2 = th_open(&d, &p);
	th_fill(buf, sizeof buf, 77);
	CHECK_RC(s2, strap_session_write(s2, "after", STRAP_DTYPE_F32, shape, 1, buf, sizeof buf, NULL), STRAP_OK);
	CHECK_RC(s2, strap_session_close(s2, NULL), STRAP_OK);
	strap_session_free(s2);
	th_expect y;
	snprintf(exp_dir, sizeof exp_dir, "%s/expect2", d.dir);
	th_expect_open(&y, exp_dir);
	th_expect_tensor(&y, "after", "float32", shape, 1, 0, 0, NULL, buf, sizeof buf, 1);
	th_expect_close(&y);
	th_check_stream(out, &y);

	th_stop_daemon(&d);
	return th_done("stream_lock");
}
