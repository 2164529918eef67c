/* params.upload and params.upload_free_local (PROTOCOL.md 1.3, docs/OBJECT_STORAGE.md) (OPEN's
 * bytes are this library's for the Python client too, whose session is libstrap's); a real strapd with no object
 * storage refuses a session's target (upload_refused) and upload_free_local without any upload (bad_message), so both
 * reach it; a malformed target is refused by the library before the output is touched. With a real S3 server
 * (VersityGW, where `make versitygw` built one: else that part says it is skipped), OPENED's object is
 * strap_session_upload's, the object equals the local stream once STATUS says the upload is
 * complete, and with upload_free_local strapd frees uploaded bytes on the local disk while the
 * capture runs (STATUS freed_bytes) and the object still verifies. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

/* ----- refusals ----- */

static void check_refused(th_daemon *d, const char *upload, int free_local, int want, const char *says)
{
	char out[600];
	snprintf(out, sizeof out, "%s/refused.strap", d->dir);
	unlink(out);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.socket_path = d->socket;
	p.autostart = 0;
	p.ring_size = 4096 + (64 << 10);
	p.upload = upload;
	p.upload_free_local = free_local;
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == want && s == NULL && (strstr(e.message, says) || strcmp(e.daemon_code, says) == 0),
	      "upload %s free_local %d: rc %d (%s) [%s] %s", upload ? upload : "(none)", free_local, rc,
	      strap_errstr(rc), e.daemon_code, e.message);
	if (want == STRAP_E_INVALID)
		CHECK(access(out, F_OK) != 0, "a refused target created %s", out);
	strap_session_free(s);
}

/* ----- a real S3 server ----- */

static pid_t start_versitygw(const char *bin, const char *root, char *endpoint, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &al))
		return -1;
	close(fd);
	int port = ntohs(a.sin_port);
	snprintf(endpoint, len, "http://127.0.0.1:%d", port);
	char addr[64], data[500], log[500];
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	snprintf(data, sizeof data, "%s/data", root);
	snprintf(log, sizeof log, "%s/versitygw.log", root);
	mkdir(data, 0700);
	pid_t pid = fork();
	if (pid == 0) {
		FILE *f = freopen(log, "a", stdout);
		(void)f;
		dup2(1, 2);
		execl(bin, bin, "--access", "strapkey", "--secret", "strapsecret12345", "--port", addr, "--quiet",
		      "posix", data, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 600; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		a.sin_port = htons((uint16_t)port);
		int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* Wait for STATUS to show obj's upload complete; its final_size and freed_bytes into out. */
static int wait_upload(th_daemon *d, const char *obj, const char *state, char *out, size_t cap)
{
	char cmd[3000];
	snprintf(
		cmd, sizeof cmd,
		"'%s' -c 'import json, subprocess, sys, time\n"
		"u = []\n"
		"for _ in range(1200):\n"
		"    st = json.loads(subprocess.run([sys.argv[1], \"status\", \"--json\", \"--socket\", sys.argv[2]],\n"
		"                                   capture_output=True, text=True).stdout)\n"
		"    u = [u for u in st.get(\"uploads\") or [] if u[\"object\"] == sys.argv[3]]\n"
		"    if u and (u[-1][\"state\"] == sys.argv[4] or (sys.argv[4] == \"freed\" and "
		"u[-1].get(\"freed_bytes\"))):\n"
		"        print(\"state\", u[-1][\"state\"], \"final\", u[-1].get(\"final_size\"), \"freed\", "
		"u[-1].get(\"freed_bytes\", 0)); sys.exit(0)\n"
		"    time.sleep(0.1)\n"
		"print(\"timed out:\", u); sys.exit(1)' '%s' '%s' '%s' '%s' 2>&1",
		th_env("STRAP_PYTHON"), th_env("STRAPD_BIN"), d->socket, obj, state);
	return th_run(cmd, out, cap);
}

static void write_mib(strap_session *s, int mib, int checkpoint_every)
{
	static float chunk[64 << 10]; /* 256 KiB */
	for (int i = 0; i < mib * 4; i++) {
		th_fill(chunk, sizeof chunk, (uint64_t)i);
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		CHECK_RC(s,
			 strap_session_write(s, "model.layers.0", STRAP_DTYPE_F32, (int64_t[]){256, 256}, 2, chunk,
					     sizeof chunk, NULL),
			 STRAP_OK);
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		if (checkpoint_every && (i + 1) % (checkpoint_every * 4) == 0)
			CHECK_RC(s, strap_session_checkpoint(s), STRAP_OK);
	}
}

static void check_s3(const char *vgw)
{
	char root[] = "/tmp/strap-vgw-XXXXXX", endpoint[64];
	if (!mkdtemp(root)) {
		CHECK(0, "mkdtemp");
		return;
	}
	pid_t vpid = start_versitygw(vgw, root, endpoint, sizeof endpoint);
	CHECK(vpid > 0, "versitygw %s did not start (log in %s)", vgw, root);
	if (vpid <= 0)
		return;
	setenv("AWS_ACCESS_KEY_ID", "strapkey", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "strapsecret12345", 1);
	setenv("AWS_DEFAULT_REGION", "us-east-1", 1);
	char cmd[2000], txt[4096], state[600];
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import boto3, sys\n"
		 "boto3.client(\"s3\", endpoint_url=sys.argv[1], "
		 "region_name=\"us-east-1\").create_bucket(Bucket=\"bkt\")\n"
		 "print(\"bucket\")' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), endpoint);
	int rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "bucket"), "create bucket: %s", txt);
	snprintf(state, sizeof state, "%s/upload-state", root);
	const char *extra[] = {"--no-probes", "--s3-endpoint",      endpoint, "--upload-part-size",
			       "5MiB",        "--upload-state-dir", state,    NULL};
	th_daemon d;
	if (th_start_daemon(&d, extra) != 0) {
		CHECK(0, "strapd with --s3-endpoint did not start");
		kill(vpid, SIGTERM);
		waitpid(vpid, NULL, 0);
		return;
	}

	/* the session's own target: the object is the local stream */
	char out[600], obj[600];
	snprintf(out, sizeof out, "%s/up.strap", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (8 << 20);
	p.upload = "s3://bkt/c1/";
	strap_session *s = th_open(&d, &p);
	const char *got = strap_session_upload(s);
	CHECK(got && strcmp(got, "s3://bkt/c1/up.strap") == 0, "OPENED upload %s", got ? got : "(none)");
	write_mib(s, 8, 3);
	strap_closed closed;
	CHECK_RC(s, strap_session_close(s, &closed), STRAP_OK);
	strap_session_free(s);
	rc = wait_upload(&d, "s3://bkt/c1/up.strap", "complete", txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "freed 0"), "upload c1: %s", txt);
	snprintf(cmd, sizeof cmd, "cmp '%s' '%s/data/bkt/c1/up.strap' 2>&1", out, root);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0, "the object differs from the local stream: %s", txt);

	/* upload_free_local: uploaded bytes freed locally while the capture runs */
	snprintf(out, sizeof out, "%s/free.strap", d.dir);
	p.output_path = out;
	p.upload = "s3://bkt/c2";
	p.upload_free_local = 1;
	s = th_open(&d, &p);
	snprintf(obj, sizeof obj, "s3://bkt/c2/free.strap");
	got = strap_session_upload(s);
	CHECK(got && strcmp(got, obj) == 0, "OPENED upload %s", got ? got : "(none)");
	write_mib(s, 24, 3);
	rc = wait_upload(&d, obj, "freed", txt, sizeof txt);
	CHECK(rc == 0 && !strstr(txt, "freed 0"), "nothing freed locally while capturing: %s", txt);
	fprintf(stderr, "upload_free_local, while capturing: %s", txt);
	CHECK_RC(s, strap_session_close(s, &closed), STRAP_OK);
	strap_session_free(s);
	rc = wait_upload(&d, obj, "complete", txt, sizeof txt);
	CHECK(rc == 0, "upload c2: %s", txt);
	fprintf(stderr, "upload_free_local, after close: %s", txt);
	snprintf(cmd, sizeof cmd, "'%s' verify '%s/data/bkt/c2/free.strap' 2>&1", th_env("STRAPD_BIN"), root);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0, "strapd verify of the uploaded object: %s", txt);
	th_stop_daemon(&d);
	kill(vpid, SIGTERM);
	waitpid(vpid, NULL, 0);
	if (!th_failures) {
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", root);
	}
}

int main(void)
{
	/* an upload state directory it cannot make: strapd runs with uploads unavailable */
	const char *no_uploads[] = {"--upload-state-dir", "/dev/null/none", NULL};
	th_daemon d;
	if (th_start_daemon(&d, no_uploads) != 0)
		return 1;
	check_refused(&d, "s3://bkt/x", 0, STRAP_E_DAEMON, "upload_refused");
	check_refused(&d, NULL, 1, STRAP_E_DAEMON, "bad_message");
	check_refused(&d, "caps/run", 0, STRAP_E_INVALID, "s3://bucket/prefix");
	check_refused(&d, "s3://Caps/run", 0, STRAP_E_INVALID, "bucket name");
	check_refused(&d, "s3://bkt/a//b", 0, STRAP_E_INVALID, "segment");
	check_refused(&d, "s3://bkt/a/../b", 0, STRAP_E_INVALID, "segment");
	check_refused(&d, "s3://bkt/\xff", 0, STRAP_E_INVALID, "UTF-8");
	th_stop_daemon(&d);

	const char *vgw = getenv("STRAP_VERSITYGW");
	if (!vgw || !*vgw)
		vgw = getenv("VERSITYGW");
	char def[600];
	if (!vgw || !*vgw) {
		snprintf(def, sizeof def, "%s/.cache/strap-llm/versitygw-1.8.0/versitygw",
			 getenv("HOME") ? getenv("HOME") : "");
		vgw = def;
	}
	if (access(vgw, X_OK) == 0)
		check_s3(vgw);
	else
		fprintf(stderr, "upload: the S3 part is skipped: no VersityGW at %s (make versitygw)\n", vgw);
	return th_done("upload");
}
