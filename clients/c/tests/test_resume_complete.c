/* Issue 41, with a real strapd: a resume (params.resume) of a capture that finished — its
 * stream ends with END "complete" — is refused with STRAP_E_CHECKPOINT and keeps every byte,
 * with no checkpoint left (a resume would otherwise start from token 0 and empty the file) and
 * with a stale one beside it (strapd would otherwise cut it back to the checkpoint); and the
 * files the library creates (stream, checkpoint, resource log) are never readable by other
 * users: 0640 under a umask of 0, in a setgid directory with the directory's group. */
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
	CHECK(strstr(e.message, "is a complete capture") && strstr(e.message, "nothing was changed") &&
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

	/* no checkpoint: a resume would start from token 0 (emptying the file) */
	resume_refused(&d, out, "no checkpoint");
	/* a stale checkpoint beside the finished stream: strapd would cut back to it */
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "cp '%s' '%s'", saved, ck);
	CHECK(th_run(cmd, NULL, 0) == 0, "%s", cmd);
	resume_refused(&d, out, "stale checkpoint");
	/* the stream is still the whole capture */
	snprintf(cmd, sizeof cmd, "'%s' verify '%s' >/dev/null", th_env("STRAPD_BIN"), out);
	CHECK(th_run(cmd, NULL, 0) == 0, "strapd verify of the kept stream failed");

	th_stop_daemon(&d);
	return th_done("resume_complete");
}
