/* Issue 41, with a real strapd: a resume (params.resume) of a capture that finished — its
 * stream ends with END "complete" and no checkpoint is left — is refused with STRAP_E_CHECKPOINT
 * and keeps every byte (a resume would otherwise cut it back to its last token). With a checkpoint
 * still beside it (a process that ended between its END and the checkpoint's removal, or, in the
 * Python client, a capture stopped by an error) the capture resumes, as the Python client's does
 * (one rule, common/strap_resume.c): the stream is cut back to its last intact token, the tokens
 * come back through params.resume_token, and the finished stream verifies again. The files the
 * library creates (stream, checkpoint, resource log) are never readable by other users: 0640
 * under a umask of 0, in a setgid directory with the directory's group. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)len + 1);
	*n = b ? fread(b, 1, (size_t)len, f) : 0;
	fclose(f);
	return b;
}

static void check_mode(const char *path, gid_t gid, int check_gid)
{
	struct stat st;
	CHECK(stat(path, &st) == 0, "stat %s", path);
	CHECK((st.st_mode & 07777) == 0640, "%s created %#o under umask 0, want 0640", path,
	      (unsigned)(st.st_mode & 07777));
	CHECK(!check_gid || st.st_gid == gid, "%s has group %u, want the setgid directory's %u", path,
	      (unsigned)st.st_gid, (unsigned)gid);
}

typedef struct got_tokens {
	int n, bad;
} got_tokens;

/* params.resume_token: the tokens written below (ids 100 + k, text "t", no position). */
static int keep_token(void *user, uint64_t index, int64_t token_id, const char *text, size_t text_len, int64_t position)
{
	got_tokens *g = user;
	if (index == 0)
		g->n = 0, g->bad = 0;
	g->bad += index != (uint64_t)g->n || token_id != 100 + (int64_t)index || text_len != 1 || text[0] != 't' ||
		  position != (int64_t)index;
	g->n++;
	return 0;
}

static strap_session_params params(const char *out)
{
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (1 << 20);
	p.fingerprint = "sha256:complete";
	p.resources = 1;
	return p;
}

static void resume_refused(th_daemon *d, const char *out, const char *why)
{
	size_t n0 = 0, n1 = 0;
	char *before = slurp(out, &n0);
	strap_session_params p = params(out);
	p.resume = 1;
	p.socket_path = d->socket;
	p.autostart = 0;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_E_CHECKPOINT && s == NULL, "%s: resume of a complete capture: rc %d (%s): %s", why, rc,
	      strap_errstr(rc), e.message);
	CHECK(strstr(e.message, "is a complete capture") && strstr(e.message, "Nothing was changed") &&
		      strstr(e.message, "would cut"),
	      "%s: message \"%s\"", why, e.message);
	char *after = slurp(out, &n1);
	CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0,
	      "%s: the refused resume changed the stream (%zu bytes, were %zu)", why, n1, n0);
	free(before);
	free(after);
	if (s)
		strap_session_free(s);
}

int main(void)
{
	umask(0);
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char dir[300], out[400], ck[500], res[500], saved[500];
	snprintf(dir, sizeof dir, "%s/shared", d.dir);
	CHECK(mkdir(dir, 0770) == 0, "mkdir %s", dir);
	const gid_t gid = 4242;
	int root = geteuid() == 0;
	if (root) {
		CHECK(chown(dir, (uid_t)-1, gid) == 0 && chmod(dir, 02770) == 0, "setgid %s", dir);
	}
	snprintf(out, sizeof out, "%s/cap.strap", dir);
	snprintf(ck, sizeof ck, "%s.ckpt.json", out);
	snprintf(res, sizeof res, "%s.resources.jsonl", out);
	snprintf(saved, sizeof saved, "%s/saved.ckpt.json", d.dir);

	strap_session_params p = params(out);
	strap_session *s = th_open(&d, &p);
	static uint8_t buf[8 << 10];
	int64_t shape[1] = {(int64_t)(sizeof buf / 4)};
	for (int k = 0; k < 4; k++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		th_fill(buf, sizeof buf, (uint64_t)k + 1);
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, buf, sizeof buf, NULL), STRAP_OK);
		CHECK_RC(s, strap_session_token(s, 100 + k, "t", 1, -1), STRAP_OK);
		if (k == 1) {
			CHECK_RC(s, strap_session_checkpoint(s), STRAP_OK);
			check_mode(ck, gid, root);
			size_t n = 0;
			char *c = slurp(ck, &n);
			FILE *f = fopen(saved, "wb");
			CHECK(c && f && fwrite(c, 1, n, f) == n, "save the checkpoint");
			if (f)
				fclose(f);
			free(c);
		}
	}
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);
	check_mode(out, gid, root);
	check_mode(res, gid, root);
	CHECK(access(ck, F_OK) != 0, "checkpoint left after a clean close");

	/* no checkpoint: a resume would cut the END and INDEX of a finished capture */
	resume_refused(&d, out, "no checkpoint");
	/* a checkpoint beside the finished stream (from token 2): the capture resumes after its last
	 * intact token (4), its END and INDEX cut, the tokens given back */
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "cp '%s' '%s'", saved, ck);
	CHECK(th_run(cmd, NULL, 0) == 0, "%s", cmd);
	size_t n0 = 0;
	char *before = slurp(out, &n0);
	p = params(out);
	p.resume = 1;
	p.socket_path = d.socket;
	p.autostart = 0;
	strap_resume_point rp;
	strap_error e;
	CHECK(strap_resume_probe(&p, &rp, &e) == STRAP_OK && !rp.complete && rp.token_count == 4 && rp.from_stream,
	      "probe with the checkpoint: complete %d tokens %llu from_stream %d: %s", rp.complete,
	      (unsigned long long)rp.token_count, rp.from_stream, e.message);
	got_tokens g = {0};
	p.resume_token = keep_token;
	p.resume_token_user = &g;
	s = th_open(&d, &p);
	rp = strap_session_resume_point(s);
	CHECK(rp.resumed && rp.token_count == 4 && rp.from_stream && rp.forward_count == 4,
	      "resume beside the checkpoint: resumed %d tokens %llu forwards %llu", rp.resumed,
	      (unsigned long long)rp.token_count, (unsigned long long)rp.forward_count);
	CHECK(g.n == 4 && g.bad == 0, "resume_token: %d tokens, %d not as written", g.n, g.bad);
	struct stat st;
	CHECK(stat(out, &st) == 0 && (uint64_t)st.st_size == rp.stream_offset && rp.stream_offset < n0,
	      "the stream was not cut back to %llu bytes (%lld, was %zu)", (unsigned long long)rp.stream_offset,
	      (long long)st.st_size, n0);
	size_t n1 = 0;
	char *cut = slurp(out, &n1);
	CHECK(before && cut && n1 == rp.stream_offset && memcmp(before, cut, n1) == 0, "the kept prefix changed");
	free(before);
	free(cut);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);
	/* the stream is a whole capture again */
	snprintf(cmd, sizeof cmd, "'%s' verify '%s' >/dev/null", th_env("STRAPD_BIN"), out);
	CHECK(th_run(cmd, NULL, 0) == 0, "strapd verify of the resumed stream failed");
	resume_refused(&d, out, "finished again");

	th_stop_daemon(&d);
	return th_done("resume_complete");
}
