/* Rings and the daemon's memory budget (docs/DEPLOY.md): with the default ring_size (0), a
 * session the budget (strapd serve --memory-limit) has no room for gets a smaller ring, says so
 * in its stream's metadata and captures bit for bit; a ring_size set by the caller is refused
 * with STRAP_E_DAEMON "memory_budget" naming the budget setting and params.ring_size; with no
 * room left at all a default ring is refused naming the budget setting. Other sessions go on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static strap_session_params params(th_daemon *d, const char *out)
{
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.socket_path = d->socket;
	p.autostart = 0;
	return p;
}

/* Write three forward passes of two tensors and close; each one also goes to the manifest. */
static void capture(strap_session *s, th_expect *x, uint64_t seed)
{
	static float buf[2][4096];
	int64_t shape[2] = {16, 256};
	for (int fwd = 0; fwd < 3; fwd++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		for (int m = 0; m < 2; m++) {
			const char *name = m ? "model.layers.0.mlp" : "model.layers.0";
			th_fill(buf[m], sizeof buf[m], seed + (uint64_t)(fwd * 2 + m));
			CHECK_RC(s,
				 strap_session_write(s, name, STRAP_DTYPE_F32, shape, 2, buf[m], sizeof buf[m], NULL),
				 STRAP_OK);
			th_expect_tensor(x, name, "float32", shape, 2, 0, (uint64_t)fwd, NULL, buf[m], sizeof buf[m],
					 1);
		}
	}
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
}

int main(void)
{
	th_daemon d;
	/* codec none (the default) reserves only its ring: 96 MiB hold one default 64 MiB ring and
	 * leave 32 MiB, less any O_DIRECT staging the first session takes */
	const char *extra[] = {"--memory-limit", "96MiB", NULL};
	if (th_start_daemon(&d, extra) != 0)
		return 1;
	char out[4][600], exp_dir[2][600];
	for (int i = 0; i < 4; i++)
		snprintf(out[i], sizeof out[i], "%s/cap%d.strap", d.dir, i);
	th_expect x[2];
	for (int i = 0; i < 2; i++) {
		snprintf(exp_dir[i], sizeof exp_dir[i], "%s/expect%d", d.dir, i);
		th_expect_open(&x[i], exp_dir[i]);
	}

	strap_session_params p = params(&d, out[0]);
	strap_session *a = NULL, *b = NULL, *c = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &a, &e);
	CHECK(rc == STRAP_OK, "first default session: %s", e.message);
	CHECK(a && strap_session_get_stats(a).ring_size == 64ull << 20, "first session's ring %llu, want 64 MiB",
	      a ? (unsigned long long)strap_session_get_stats(a).ring_size : 0ull);

	/* the budget is short: a default ring shrinks to the room left */
	p = params(&d, out[1]);
	rc = strap_session_open(&p, &b, &e);
	CHECK(rc == STRAP_OK, "second default session, budget short: %s: %s", strap_errstr(rc), e.message);
	uint64_t ring_b = b ? strap_session_get_stats(b).ring_size : 0;
	CHECK(ring_b > 4096 + (64 << 10) && ring_b <= 32ull << 20 && ring_b % 4096 == 0,
	      "second session's ring %llu, want one within the 32 MiB left", (unsigned long long)ring_b);

	/* a ring the caller asked for is refused, naming the setting that fixes it */
	p = params(&d, out[2]);
	p.ring_size = 16ull << 20;
	rc = strap_session_open(&p, &c, &e);
	CHECK(rc == STRAP_E_DAEMON && strcmp(e.daemon_code, "memory_budget") == 0 &&
		      strstr(e.message, "strapd serve --memory-limit") && strstr(e.message, "params.ring_size"),
	      "explicit ring over the budget: %s (%s): %s", strap_errstr(rc), e.daemon_code, e.message);
	CHECK(c == NULL, "a refused open returned a session");

	/* no room at all: a default ring is refused too, naming the budget */
	p = params(&d, out[3]);
	rc = strap_session_open(&p, &c, &e);
	CHECK(rc == STRAP_E_DAEMON && strcmp(e.daemon_code, "memory_budget") == 0 &&
		      strstr(e.message, "strapd serve --memory-limit"),
	      "default ring with the budget spent: %s (%s): %s", strap_errstr(rc), e.daemon_code, e.message);

	/* the sessions that opened capture whole */
	if (a)
		capture(a, &x[0], 100);
	if (b)
		capture(b, &x[1], 200);
	strap_session_free(a);
	strap_session_free(b);
	for (int i = 0; i < 2; i++) {
		th_expect_close(&x[i]);
		th_check_stream(out[i], &x[i]);
	}
	char cmd[2000], txt[1 << 16];
	snprintf(cmd, sizeof cmd, "'%s' inspect --json '%s'", th_env("STRAPD_BIN"), out[1]);
	th_run(cmd, txt, sizeof txt);
	CHECK(strstr(txt, "\"ring_shrunk_by_budget_from\": 67108864") ||
		      strstr(txt, "\"ring_shrunk_by_budget_from\":67108864"),
	      "the shrunk session's metadata does not say so: %.2000s", txt);
	th_stop_daemon(&d);
	return th_done("budget");
}
