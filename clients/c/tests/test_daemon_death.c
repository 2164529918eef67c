/* strapd SIGKILLed mid-capture: the C client's next call that talks to it fails with
 * STRAP_E_CLOSED naming the connection (no crash, no hang, no SIGPIPE); a new strapd then
 * resumes the capture from its checkpoint, and the result equals, packet for packet, a capture
 * that was never interrupted (as clients/python/tests/test_resume.py checks for Python). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

enum { N_TOKENS = 12, INTERVAL = 4 };

/* Tokens [from, N_TOKENS) of a deterministic capture; kill_after >= 0: SIGKILL strapd right after
 * that token and return the first failing call's code. */
static int capture(strap_session *s, uint64_t from, int kill_after, th_daemon *d)
{
	static float buf[1024];
	for (uint64_t k = from; k < N_TOKENS; k++) {
		int rc;
		if ((rc = strap_session_begin_forward(s)))
			return rc;
		for (int i = 0; i < 2; i++) {
			th_fill(buf, sizeof buf, k * 10 + (uint64_t)i);
			char name[32];
			snprintf(name, sizeof name, "model.layers.%d", i);
			if ((rc = strap_session_write(s, name, STRAP_DTYPE_F32, (int64_t[]){2, 512}, 2, buf, sizeof buf,
						      NULL)))
				return rc;
		}
		if ((rc = strap_session_flush(s)) || (rc = strap_session_token(s, (int64_t)k, "w", 1, -1)))
			return rc;
		if ((k + 1) % INTERVAL == 0 && (rc = strap_session_checkpoint(s)))
			return rc;
		if ((int)k == kill_after) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			d->pid = 0;
		}
	}
	return strap_session_close(s, NULL);
}

int main(void)
{
	th_daemon a, b, c;
	if (th_start_daemon(&a, NULL) != 0 || th_start_daemon(&b, NULL) != 0)
		return 1;
	char ref[600], out[600];
	snprintf(ref, sizeof ref, "%s/ref.strap", a.dir);
	snprintf(out, sizeof out, "%s/killed.strap", b.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = ref;
	p.fingerprint = "fp";
	strap_session *s = th_open(&a, &p);
	CHECK_RC(s, capture(s, 0, -1, &a), STRAP_OK);
	strap_session_free(s);

	p = strap_default_session_params();
	p.output_path = out;
	p.fingerprint = "fp";
	s = th_open(&b, &p);
	int rc = capture(s, 0, 5, &b); /* checkpoints after tokens 3 (and 7); strapd dies after 5 */
	strap_error e;
	strap_session_last_error(s, &e);
	CHECK(rc == STRAP_E_CLOSED && e.fatal && strstr(e.message, "strapd connection"),
	      "after strapd died: rc %d (%s): %s", rc, strap_errstr(rc), e.message);
	CHECK_RC(s, strap_session_token(s, 99, "x", 1, -1), STRAP_E_STATE);
	strap_session_free(s);

	if (th_start_daemon(&c, NULL) != 0)
		return 1;
	p.resume = 1;
	s = th_open(&c, &p);
	strap_resume_point rp = strap_session_resume_point(s);
	CHECK(rp.resumed && rp.token_count == 4 && rp.forward_count == 4,
	      "resume point: resumed %d, token %llu, forward %llu", rp.resumed, (unsigned long long)rp.token_count,
	      (unsigned long long)rp.forward_count);
	CHECK_RC(s, capture(s, rp.token_count, -1, &c), STRAP_OK);
	strap_session_free(s);
	th_check_stream(out, NULL);
	char cmd[2000], txt[8192];
	snprintf(cmd, sizeof cmd, "'%s' '%s/compare_streams.py' '%s' '%s' 2>&1", th_env("STRAP_PYTHON"),
		 th_env("STRAP_TESTS"), ref, out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0, "resumed stream differs from the uninterrupted one:\n%s", txt);
	th_stop_daemon(&a);
	th_stop_daemon(&b); /* already dead: its directory */
	th_stop_daemon(&c);
	return th_done("daemon_death");
}
