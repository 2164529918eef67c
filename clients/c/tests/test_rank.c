/* One rank of a distributed job (docs/DISTRIBUTED.md, as the Python client): under RANK and
 * WORLD_SIZE > 1 the session writes {stem}.rank{RANK:05d}-of-{WORLD:05d}{ext}, never the path as
 * given, and an explicit checkpoint path gets the same marker; the stream header's
 * client_metadata carries the `distributed` object strapd labels the session with (rank,
 * world_size, local_rank, host, job_id from TORCHELASTIC_RUN_ID); a path that already carries
 * the marker is kept; STRAP_RANK_STREAMS=0 keeps the path as given; bad values are refused with
 * STRAP_E_INVALID and a message, and a single process keeps its path. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strap_rank.h"

/* Open, write one tensor, close; returns the session's output path (malloc'd) or NULL. */
static char *capture(th_daemon *d, const char *out, const char *ckpt)
{
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.checkpoint_path = ckpt;
	p.ring_size = 4096 + (1 << 20);
	p.socket_path = d->socket;
	p.autostart = 0;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_OK, "open %s: %s: %s", out, strap_errstr(rc), e.message);
	if (rc != STRAP_OK)
		return NULL;
	float buf[64] = {1, 2, 3};
	int64_t shape[1] = {64};
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "model.layers.0", STRAP_DTYPE_F32, shape, 1, buf, sizeof buf, NULL),
		 STRAP_OK);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	char *path = strdup(strap_session_output_path(s));
	strap_session_free(s);
	return path;
}

static void want_path(th_daemon *d, const char *given, const char *want)
{
	char out[400], exp[400];
	snprintf(out, sizeof out, "%s/%s", d->dir, given);
	snprintf(exp, sizeof exp, "%s/%s", d->dir, want);
	char *got = capture(d, out, NULL);
	CHECK(got && strcmp(got, exp) == 0, "%s: wrote %s, want %s", given, got ? got : "(none)", exp);
	CHECK(access(exp, F_OK) == 0, "%s does not exist", exp);
	if (strcmp(given, want) != 0)
		CHECK(access(out, F_OK) != 0, "%s was written as given", out);
	free(got);
}

static void want_refused(th_daemon *d, const char *needle)
{
	char out[400];
	snprintf(out, sizeof out, "%s/refused.strap", d->dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.socket_path = d->socket;
	p.autostart = 0;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_E_INVALID && !s && strstr(e.message, needle), "rc %d message '%s', want '%s'", rc, e.message,
	      needle);
	CHECK(access(out, F_OK) != 0, "%s was created by a refused open", out);
	if (s)
		strap_session_free(s);
}

/* The naming rule itself (common/strap_rank.h), the cases clients/python/tests/test_distributed.py
 * gives Python's rank_path (which binds the same). */
static void naming(void)
{
	static const char *cases[][2] = {
		{"/r/cap.strap", "/r/cap.rank00001-of-00002.strap"},
		{"/r/gen.stream", "/r/gen.rank00001-of-00002.stream"},
		{"/r/cap", "/r/cap.rank00001-of-00002"},
		{"/r/.strap", "/r/.strap.rank00001-of-00002"},
		{"/r/..strap", "/r/..strap.rank00001-of-00002"},
		{"/r/a.", "/r/a.rank00001-of-00002."},
		{"/r.d/cap", "/r.d/cap.rank00001-of-00002"},
		{"cap.strap", "cap.rank00001-of-00002.strap"},
		{"/r/a.b.strap", "/r/a.b.rank00001-of-00002.strap"},
		{"/r/cap.rank00001-of-00002.strap", "/r/cap.rank00001-of-00002.strap"},
		{"/r/cap.rank000001-of-000002.strap", "/r/cap.rank000001-of-000002.strap"},
		{"/r/cap.rank0001-of-00002.strap", "/r/cap.rank0001-of-00002.rank00001-of-00002.strap"},
		{"/r/cap.rank00000-of-00002.strap", "/r/cap.rank00000-of-00002.rank00001-of-00002.strap"},
		{"/r/cap.rank99999999999999999999999-of-00002.strap",
		 "/r/cap.rank99999999999999999999999-of-00002.rank00001-of-00002.strap"},
		{"/r/run.ckpt.json", "/r/run.ckpt.rank00001-of-00002.json"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char out[200];
		size_t n = srk_rank_path(cases[i][0], 1, 2, out, sizeof out);
		CHECK(n == strlen(cases[i][1]) && strcmp(out, cases[i][1]) == 0, "%s: %s, want %s", cases[i][0], out,
		      cases[i][1]);
		char small[8];
		/* volatile: a length gcc can see makes -O2's -Wformat-truncation refuse the (intended) cut */
		volatile size_t small_len = sizeof small;
		CHECK(srk_rank_path(cases[i][0], 1, 2, small, small_len) == n && strlen(small) == sizeof small - 1,
		      "%s: cut short wrongly", cases[i][0]);
	}
	char out[64];
	srk_rank_path("/r/cap.strap", 11999, 12000, out, sizeof out);
	CHECK(strcmp(out, "/r/cap.rank11999-of-12000.strap") == 0, "%s", out);
}

int main(void)
{
	naming();
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	const char *bin = th_env("STRAPD_BIN");

	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("LOCAL_RANK", "1", 1);
	unsetenv("LOCAL_WORLD_SIZE");
	setenv("TORCHELASTIC_RUN_ID", "job7", 1);
	unsetenv("STRAP_RANK_STREAMS");
	want_path(&d, "cap.strap", "cap.rank00001-of-00002.strap");
	want_path(&d, "gen", "gen.rank00001-of-00002");
	want_path(&d, ".strap", ".strap.rank00001-of-00002");
	want_path(&d, "x.tar.gz", "x.tar.rank00001-of-00002.gz");
	want_path(&d, "kept.rank00001-of-00002.strap", "kept.rank00001-of-00002.strap"); /* given back */

	/* the header: strapd inspect --json shows the distributed object */
	char cmd[900], got[1 << 16];
	snprintf(cmd, sizeof cmd, "%s inspect --json %s/cap.rank00001-of-00002.strap", bin, d.dir);
	CHECK(th_run(cmd, got, sizeof got) == 0, "inspect failed: %s", got);
	char host[256] = {0}, want_host[300];
	gethostname(host, sizeof host - 1);
	snprintf(want_host, sizeof want_host, "\"host\": \"%s\"", host);
	CHECK(strstr(got, "\"distributed\"") && strstr(got, "\"rank\": 1") && strstr(got, "\"world_size\": 2") &&
		      strstr(got, "\"local_rank\": 1") && strstr(got, "\"local_world_size\": null") &&
		      strstr(got, "\"job_id\": \"job7\"") && strstr(got, "\"source\": \"env\"") &&
		      strstr(got, want_host),
	      "inspect lacks the rank: %.3000s", got);

	/* an explicit checkpoint path gets the marker too (before its extension) */
	char out[400], ck[400], ck_want[400];
	snprintf(out, sizeof out, "%s/ck.strap", d.dir);
	snprintf(ck, sizeof ck, "%s/run.ckpt.json", d.dir);
	snprintf(ck_want, sizeof ck_want, "%s/run.ckpt.rank00001-of-00002.json", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.checkpoint_path = ck;
	p.ring_size = 4096 + (1 << 20);
	strap_session *s = th_open(&d, &p);
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	CHECK_RC(s, strap_session_token(s, 5, "<5>", 3, -1), STRAP_OK);
	CHECK_RC(s, strap_session_checkpoint(s), STRAP_OK);
	CHECK(access(ck_want, F_OK) == 0 && access(ck, F_OK) != 0, "checkpoint not at %s", ck_want);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);

	/* the opt-out keeps the path; the rank is still in the header */
	setenv("STRAP_RANK_STREAMS", "0", 1);
	want_path(&d, "plain.strap", "plain.strap");
	snprintf(cmd, sizeof cmd, "%s inspect --json %s/plain.strap", bin, d.dir);
	CHECK(th_run(cmd, got, sizeof got) == 0 && strstr(got, "\"distributed\""), "opt-out lost the rank");

	/* bad values: refused before any file is made */
	setenv("STRAP_RANK_STREAMS", "maybe", 1);
	want_refused(&d, "STRAP_RANK_STREAMS=maybe");
	unsetenv("STRAP_RANK_STREAMS");
	setenv("RANK", "two", 1);
	want_refused(&d, "RANK=two is not an integer");
	setenv("RANK", "2", 1);
	want_refused(&d, "rank 2 is outside a world of 2 processes");

	/* a world of one, or no launcher: the path as given, no rank in the header */
	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "1", 1);
	want_path(&d, "one.strap", "one.strap");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	want_path(&d, "alone.strap", "alone.strap");
	snprintf(cmd, sizeof cmd, "%s inspect --json %s/alone.strap", bin, d.dir);
	CHECK(th_run(cmd, got, sizeof got) == 0 && !strstr(got, "\"distributed\""), "a single process has a rank");
	/* a lone RANK (no WORLD_SIZE) may mean something else: not parsed, a single process (as in
	 * Python's detect) */
	setenv("RANK", "two", 1);
	want_path(&d, "lone.strap", "lone.strap");
	/* white space around the values is stripped, as Python's str.strip() does */
	setenv("RANK", " 1\n", 1);
	setenv("WORLD_SIZE", "2\r\n", 1);
	setenv("STRAP_RANK_STREAMS", " Off\n", 1);
	want_path(&d, "spaced.strap", "spaced.strap");
	unsetenv("STRAP_RANK_STREAMS");
	want_path(&d, "spaced2.strap", "spaced2.rank00001-of-00002.strap");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");

	th_stop_daemon(&d);
	return th_done("test_rank");
}
