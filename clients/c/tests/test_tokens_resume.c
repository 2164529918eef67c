#define _GNU_SOURCE
/* Tokens, checkpoints and resume through a real strapd: a capture process SIGKILLed at several
 * points (mid forward pass before the first checkpoint, mid pass after one, between a TOKEN and
 * its checkpoint, right after a checkpoint) and resumed from its checkpoint file gives a stream
 * equal packet for packet to an uninterrupted capture; the C-written checkpoint file is read by
 * `strapd resume`; a leftover checkpoint is never ignored silently; another fingerprint is
 * refused; params.resume_token gives back every kept token as it was written. While generating, a pass's records are
 * named by the next TOKEN (the published cursor, PROTOCOL.md 1.4): a capture killed between a pass and its TOKEN still
 * has that pass's records in its stream. All of it twice: with TOKEN messages (tokens without a position), and with
 * TOKEN records in the ring (PROTOCOL.md 1.4, "TOKEN records": tokens with a position, one PUBLISH per 16 of them),
 * whose killed captures keep every token below the published cursor. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

enum { N_TOKENS = 16, INTERVAL = 4, PER_TOKEN = 3 };

/* The capture: N_TOKENS tokens, each after a forward pass of PER_TOKEN records; a checkpoint
 * every INTERVAL tokens. kill_at: < 1000 SIGKILL before record kill_at; 1000 + k after token
 * k's TOKEN (before its checkpoint); 2000 + k after token k's checkpoint; 3000 + k after pass
 * k's strap_session_flush, before its TOKEN (from k = 1 the pass is deferred); -1 never. */
/* params.resume_token: the tokens given back must be the ones written below, in order. */
typedef struct got_tokens {
	uint64_t n, bad;
} got_tokens;

static int keep_token(void *user, uint64_t index, int64_t token_id, const char *text, size_t text_len, int64_t position)
{
	got_tokens *g = user;
	char want[16];
	int n = snprintf(want, sizeof want, " w%llu", (unsigned long long)index);
	if (index == 0)
		g->n = g->bad = 0;
	g->bad += index != g->n || token_id != (int64_t)index * 7 + 1 || text_len != (size_t)n ||
		  memcmp(text, want, text_len) != 0 || position != (int64_t)index;
	g->n++;
	return 0;
}

static int child(const char *sock, const char *out, int kill_at, int resume, const char *fingerprint)
{
	strap_session_params p = strap_default_session_params();
	p.socket_path = sock;
	p.autostart = 0;
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	p.resume = resume;
	p.fingerprint = fingerprint;
	got_tokens got = {0, 0};
	p.resume_token = keep_token;
	p.resume_token_user = &got;
	strap_session *s;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	if (rc != STRAP_OK) {
		printf("open: %s: %s\n", strap_errstr(rc), e.message);
		return rc == STRAP_E_CHECKPOINT ? 3 : 1;
	}
	strap_resume_point rp = strap_session_resume_point(s);
	if (got.n != rp.token_count || got.bad) {
		printf("resume_token: %llu tokens given back (%llu not as written), the resume point has %llu\n",
		       (unsigned long long)got.n, (unsigned long long)got.bad, (unsigned long long)rp.token_count);
		return 1;
	}
	static float buf[2048];
	int64_t shape[2] = {4, 512};
	for (uint64_t k = rp.token_count; k < N_TOKENS; k++) {
		if (strap_session_begin_forward(s))
			goto fail;
		for (int i = 0; i < PER_TOKEN; i++) {
			if ((int)(k * PER_TOKEN) + i == kill_at)
				raise(SIGKILL);
			th_fill(buf, sizeof buf, k * 10 + (uint64_t)i);
			char name[64];
			snprintf(name, sizeof name, "model.layers.%d", i);
			if (strap_session_write(s, name, STRAP_DTYPE_F32, shape, 2, buf, sizeof buf, NULL))
				goto fail;
		}
		if (strap_session_flush(s))
			goto fail;
		if (kill_at == 3000 + (int)k)
			raise(SIGKILL);
		char text[16];
		int n = snprintf(text, sizeof text, " w%llu", (unsigned long long)k);
		/* a position makes the token a TOKEN record (STRAP_TEST_RING_TOKENS set by main) */
		int64_t pos = getenv("STRAP_TEST_RING_TOKENS") ? (int64_t)k : -1;
		if (strap_session_token(s, (int64_t)k * 7 + 1, text, (size_t)n, pos))
			goto fail;
		if (kill_at == 1000 + (int)k)
			raise(SIGKILL);
		if ((k + 1) % INTERVAL == 0 && strap_session_checkpoint(s))
			goto fail;
		if (kill_at == 2000 + (int)k)
			raise(SIGKILL);
	}
	if (strap_session_close(s, NULL))
		goto fail;
	strap_session_stats st = strap_session_get_stats(s);
	printf("done from token %llu, %llu PUBLISH, %llu TOKEN records\n", (unsigned long long)rp.token_count,
	       (unsigned long long)st.publishes, (unsigned long long)st.token_records);
	strap_session_free(s);
	return 0;
fail:
	strap_session_last_error(s, &e);
	printf("capture: %s: %s\n", strap_errstr(e.code), e.message);
	strap_session_free(s);
	return 1;
}

static int run_child(const char *self, const char *sock, const char *out, int kill_at, int resume, const char *fp,
		     char *log, size_t cap)
{
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "'%s' child '%s' '%s' %d %d %s 2>&1", self, sock, out, kill_at, resume, fp);
	FILE *p = popen(cmd, "r");
	size_t n = fread(log, 1, cap - 1, p);
	log[n] = 0;
	int st = pclose(p);
	if (WIFSIGNALED(st))
		return -WTERMSIG(st);
	/* popen runs sh -c: a child killed by a signal shows as 128 + signal */
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1000;
}

/* The uninterrupted capture and every kill point, resumed; ring: tokens with a position (TOKEN records). */
static void run_matrix(const char *self, th_daemon *d, int ring)
{
	if (ring)
		setenv("STRAP_TEST_RING_TOKENS", "1", 1);
	else
		unsetenv("STRAP_TEST_RING_TOKENS");
	char ref[600], log[8192], cmd[3000], out[1 << 14];
	snprintf(ref, sizeof ref, "%s/ref%s.strap", d->dir, ring ? "-ring" : "");
	int rc = run_child(self, d->socket, ref, -1, 0, "fp1", log, sizeof log);
	CHECK(rc == 0, "uninterrupted capture: %d %s", rc, log);
	th_check_stream(ref, NULL);
	/* strapd takes the published cursor: the first pass (before any token) is the only one
	 * published by a PUBLISH of its own, every later pass by its token's head; with ring tokens
	 * every token is a record, named by the PUBLISH of every 16 tokens or 0.25 s, and the
	 * checkpoints' */
	if (!ring)
		CHECK(strstr(log, "done from token 0, 1 PUBLISH, 0 TOKEN records\n") != NULL,
		      "uninterrupted capture: %s", log);
	else
		CHECK(strstr(log, "done from token 0, ") && strstr(log, " PUBLISH, 16 TOKEN records\n"),
		      "uninterrupted capture with ring tokens: %s", log);
	snprintf(cmd, sizeof cmd, "test ! -e '%s.ckpt.json'", ref);
	CHECK(th_run(cmd, NULL, 0) == 0, "checkpoint file left after a clean close");

	/* Seven fixed points; STRAP_KILL_CLIENT_RUNS=N (make test-long-c) adds N random ones, of
	 * every kind, replayable with STRAP_KILL_SEED. */
	int kills[7 + 200] = {2, 13, 1000 + 7, 2000 + 11, 40, 3000 + 2, 3000 + 9};
	size_t n_kills = 7;
	const char *runs = getenv("STRAP_KILL_CLIENT_RUNS");
	if (runs && atoi(runs) > 0) {
		const char *seed_env = getenv("STRAP_KILL_SEED");
		unsigned seed = seed_env && *seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
		printf("random kill points: %s, STRAP_KILL_SEED=%u\n", runs, seed);
		srand(seed);
		for (int r = 0; r < atoi(runs) && n_kills < sizeof kills / sizeof *kills; r++) {
			int k = rand() % N_TOKENS;
			switch (rand() % 4) {
			case 0: kills[n_kills++] = k * PER_TOKEN + rand() % PER_TOKEN; break; /* mid pass */
			case 1: kills[n_kills++] = 1000 + k; break;                           /* after TOKEN */
			case 2: kills[n_kills++] = 3000 + k; break;                           /* pass, no TOKEN */
			default: kills[n_kills++] = 2000 + k; break;                          /* after CHECKPOINT */
			}
		}
	}
	for (size_t i = 0; i < n_kills; i++) {
		char path[600];
		snprintf(path, sizeof path, "%s/kill%zu-%d%s.strap", d->dir, i, kills[i], ring ? "-ring" : "");
		rc = run_child(self, d->socket, path, kills[i], 0, "fp1", log, sizeof log);
		CHECK(rc == 128 + SIGKILL || rc == -SIGKILL, "kill %d%s: child ended %d: %s", kills[i],
		      ring ? " (ring tokens)" : "", rc, log);
		char ck[700];
		snprintf(ck, sizeof ck, "%s.ckpt.json", path);
		struct stat st;
		int have_ckpt = stat(ck, &st) == 0;
		/* the first checkpoint follows token 3 (INTERVAL tokens): before it there is none */
		int k0 = kills[i] >= 1000 ? kills[i] % 1000 : -1;
		int after_first = kills[i] >= 3000   ? k0 >= INTERVAL
				  : kills[i] >= 2000 ? k0 >= INTERVAL - 1
				  : kills[i] >= 1000 ? k0 >= INTERVAL
						     : kills[i] >= INTERVAL * PER_TOKEN;
		if (kills[i] >= 3000) {
			/* the killed stream holds every record of passes 0..k0 (pass k0's only below the
			 * cursor when k0 > 0) and tokens 0..k0-1, as the uninterrupted one does */
			snprintf(cmd, sizeof cmd, "'%s' '%s/compare_streams.py' --killed '%s' '%s' %d %d 2>&1",
				 th_env("STRAP_PYTHON"), th_env("STRAP_TESTS"), ref, path, (k0 + 1) * PER_TOKEN, k0);
			int r = th_run(cmd, out, sizeof out);
			CHECK(r == 0, "kill %d%s: the killed stream lost records:\n%s", kills[i],
			      ring ? " (ring tokens)" : "", out);
		}
		CHECK(have_ckpt == after_first, "kill %d%s: checkpoint file %s", kills[i], ring ? " (ring tokens)" : "",
		      have_ckpt ? "exists" : "missing");
		if (have_ckpt) {
			/* Go reads the C-written checkpoint and finds the stream resumable */
			snprintf(cmd, sizeof cmd, "'%s' resume --json '%s' 2>&1", th_env("STRAPD_BIN"), path);
			int r = th_run(cmd, out, sizeof out);
			CHECK(r == 0 && strstr(out, "\"resumable\": true"), "kill %d%s: strapd resume exited %d:\n%s",
			      kills[i], ring ? " (ring tokens)" : "", r, out);
			/* a capture that ignores the checkpoint is refused, naming it */
			r = run_child(self, d->socket, path, -1, 0, "fp1", log, sizeof log);
			CHECK(r == 3 && strstr(log, "checkpoint of an earlier capture exists"),
			      "kill %d%s: fresh over ckpt: %d %s", kills[i], ring ? " (ring tokens)" : "", r, log);
			r = run_child(self, d->socket, path, -1, 1, "fp2", log, sizeof log);
			CHECK(r == 3 && strstr(log, "fingerprint"), "kill %d%s: other fingerprint: %d %s", kills[i],
			      ring ? " (ring tokens)" : "", r, log);
		}
		rc = run_child(self, d->socket, path, -1, 1, "fp1", log, sizeof log);
		CHECK(rc == 0, "kill %d%s: resume: %d %s", kills[i], ring ? " (ring tokens)" : "", rc, log);
		if (have_ckpt)
			CHECK(strstr(log, "done from token 0") == NULL, "kill %d%s: resumed from token 0: %s", kills[i],
			      ring ? " (ring tokens)" : "", log);
		th_check_stream(path, NULL);
		snprintf(cmd, sizeof cmd, "'%s' '%s/compare_streams.py' '%s' '%s' 2>&1", th_env("STRAP_PYTHON"),
			 th_env("STRAP_TESTS"), ref, path);
		int r = th_run(cmd, out, sizeof out);
		CHECK(r == 0, "kill %d%s: resumed stream differs from the uninterrupted one:\n%s", kills[i],
		      ring ? " (ring tokens)" : "", out);
		printf("kill %d%s: %s", kills[i], ring ? " (ring tokens)" : "", log);
	}
}

int main(int argc, char **argv)
{
	if (argc == 7 && strcmp(argv[1], "child") == 0)
		return child(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
	char self[1024];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
	self[sl > 0 ? sl : 0] = 0;
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	run_matrix(self, &d, 0);
	run_matrix(self, &d, 1);
	th_stop_daemon(&d);
	return th_done("tokens_resume");
}
