#define _GNU_SOURCE
/* Resume from the stream's intact prefix (docs/CHECKPOINTS.md 4) through a real strapd: a capture
 * process SIGKILLed after token 9 with its last checkpoint at token 7 resumes from token 10 (past
 * the checkpoint); one that never checkpointed resumes from the tokens its stream holds; a packet
 * damaged on disk ends the intact run before it, and one inside the checkpointed prefix is refused; the job-wide limit
 * (resume_max_tokens) cuts back before the checkpoint, rewriting it first, and 0 starts over; strap_resume_probe finds
 * each point without changing a byte and reports a finished capture; another fingerprint, or a file that is not a strap
 * stream, is refused and left as it is; an empty file starts from token 0. Two ranks of a job under torchrun agree on
 * the fewer tokens (files beside the streams, as the Python client does): both resume from there; a rank that cannot
 * resume fails the other one too, naming it, and changes nothing; a rank alone waits STRAP_JOB_RESUME_WAIT, then fails.
 * Every resumed stream equals the uninterrupted capture packet for packet. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

enum { N_TOKENS = 16, PER_TOKEN = 3 };

/* N_TOKENS tokens, each after a pass of PER_TOKEN records; a checkpoint every `interval` tokens
 * (0: none). kill_at: < 1000 SIGKILL before record kill_at; 1000 + k after token k's TOKEN (and
 * its checkpoint, when one follows it); 3000 + k after pass k's flush, before its TOKEN (its
 * records below the published cursor: in the stream); 5000 right after the open; -1 never. */
static int child(const char *sock, const char *out, int kill_at, int resume, const char *fp, int interval,
		 int64_t limit)
{
	strap_session_params p = strap_default_session_params();
	p.socket_path = sock;
	p.autostart = 0;
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	p.resume = resume;
	p.fingerprint = fp;
	p.resume_max_tokens = limit;
	strap_session *s;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	if (rc != STRAP_OK) {
		printf("open: %s: %s\n", strap_errstr(rc), e.message);
		return rc == STRAP_E_CHECKPOINT ? 3 : 1;
	}
	if (kill_at == 5000)
		raise(SIGKILL);
	strap_resume_point rp = strap_session_resume_point(s);
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
		if (strap_session_token(s, (int64_t)k * 7 + 1, text, (size_t)n, -1))
			goto fail;
		if (interval && (k + 1) % (uint64_t)interval == 0 && strap_session_checkpoint(s))
			goto fail;
		if (kill_at == 1000 + (int)k)
			raise(SIGKILL);
	}
	if (strap_session_close(s, NULL))
		goto fail;
	printf("done from token %llu forward %llu from_stream %d job %d\n", (unsigned long long)rp.token_count,
	       (unsigned long long)rp.forward_count, rp.from_stream, rp.job_agreed);
	strap_session_free(s);
	return 0;
fail:
	strap_session_last_error(s, &e);
	printf("capture: %s: %s\n", strap_errstr(e.code), e.message);
	strap_session_free(s);
	return 1;
}

static const char *self_exe;
static th_daemon d;

static int run(const char *out, int kill_at, int resume, const char *fp, int interval, int64_t limit, char *log,
	       size_t cap)
{
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "'%s' child '%s' '%s' %d %d %s %d %lld 2>&1", self_exe, d.socket, out, kill_at,
		 resume, fp, interval, (long long)limit);
	FILE *p = popen(cmd, "r");
	size_t n = fread(log, 1, cap - 1, p);
	log[n] = 0;
	int st = pclose(p);
	if (WIFSIGNALED(st))
		return -WTERMSIG(st);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1000;
}

/* strapd ends a killed client's stream (END aborted) once it sees the client gone. */
static void wait_ended(const char *out)
{
	char cmd[2000], log[4096];
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys, time\n"
		 "from llm_instrumentation import open_stream\n"
		 "for _ in range(200):\n"
		 "    with open_stream(sys.argv[1]) as r:\n"
		 "        if r.end() is not None: print(\"ended\"); break\n"
		 "    time.sleep(0.05)' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	int rc = th_run(cmd, log, sizeof log);
	CHECK(rc == 0 && strstr(log, "ended"), "%s did not end: %s", out, log);
}

static void killed(const char *out, int kill_at, int interval)
{
	char log[4096];
	int rc = run(out, kill_at, 0, "fp1", interval, -1, log, sizeof log);
	CHECK(rc == 128 + SIGKILL || rc == -SIGKILL, "kill %d: child ended %d: %s", kill_at, rc, log);
	wait_ended(out);
}

static strap_resume_point probe(const char *out, const char *fp, int64_t limit, int want_rc)
{
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.fingerprint = fp;
	p.resume_max_tokens = limit;
	strap_resume_point rp;
	strap_error e;
	struct stat a, b;
	int sa = stat(out, &a);
	int rc = strap_resume_probe(&p, &rp, &e);
	CHECK(rc == want_rc, "probe %s: rc %d (%s): %s", out, rc, strap_errstr(rc), e.message);
	CHECK(sa != 0 || (stat(out, &b) == 0 && a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
			  a.st_mtim.tv_nsec == b.st_mtim.tv_nsec),
	      "the probe changed %s", out);
	return rp;
}

/* Resume out to the end and compare it with the uninterrupted capture. */
static void resumed_equal(const char *ref, const char *out, int interval, int64_t limit, const char *want_log)
{
	char log[4096], cmd[2000], txt[1 << 14];
	int rc = run(out, -1, 1, "fp1", interval, limit, log, sizeof log);
	CHECK(rc == 0 && strstr(log, want_log), "resume %s: %d %s (want \"%s\")", out, rc, log, want_log);
	th_check_stream(out, NULL);
	snprintf(cmd, sizeof cmd, "'%s' '%s/compare_streams.py' '%s' '%s' 2>&1", th_env("STRAP_PYTHON"),
		 th_env("STRAP_TESTS"), ref, out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0, "%s: the resumed stream differs from the uninterrupted one:\n%s", out, txt);
}

int main(int argc, char **argv)
{
	if (argc == 9 && strcmp(argv[1], "child") == 0)
		return child(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6], atoi(argv[7]),
			     strtoll(argv[8], NULL, 10));
	char self[1024];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
	self[sl > 0 ? sl : 0] = 0;
	self_exe = self;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char ref[600], out[600], log[4096], cmd[2000], txt[4096];
	snprintf(ref, sizeof ref, "%s/ref.strap", d.dir);
	int rc = run(ref, -1, 0, "fp1", 4, -1, log, sizeof log);
	CHECK(rc == 0, "uninterrupted capture: %d %s", rc, log);

	/* past the checkpoint: killed after token 9, the checkpoint holds tokens 0..7 */
	snprintf(out, sizeof out, "%s/past.strap", d.dir);
	killed(out, 1000 + 9, 4);
	strap_resume_point rp = probe(out, "fp1", -1, STRAP_OK);
	CHECK(rp.resumed && rp.token_count == 10 && rp.forward_count == 10 && rp.from_stream && !rp.complete,
	      "past: probe %d tokens %llu forward %llu from_stream %d", rp.resumed, (unsigned long long)rp.token_count,
	      (unsigned long long)rp.forward_count, rp.from_stream);
	rp = probe(out, "fp2", -1, STRAP_E_CHECKPOINT); /* the checkpoint's fingerprint */
	resumed_equal(ref, out, 4, -1, "done from token 10 forward 10 from_stream 1");

	/* no checkpoint at all: killed after pass 6, before its token */
	snprintf(out, sizeof out, "%s/nockpt.strap", d.dir);
	killed(out, 3000 + 6, 0);
	snprintf(cmd, sizeof cmd, "%s.ckpt.json", out);
	CHECK(access(cmd, F_OK) != 0, "no checkpoint expected");
	/* pass 6's records are in the stream (below the cursor) but cut with it: the forward count
	 * is that of the packets up to the last token kept, as the Python client counts */
	rp = probe(out, "fp1", -1, STRAP_OK);
	CHECK(rp.token_count == 6 && rp.forward_count == 6, "nockpt: tokens %llu forward %llu",
	      (unsigned long long)rp.token_count, (unsigned long long)rp.forward_count);
	int r2 = run(out, -1, 1, "fp2", 0, -1, log, sizeof log); /* the stream header's fingerprint */
	CHECK(r2 == 3 && strstr(log, "fingerprint differs"), "nockpt, fp2: %d %s", r2, log);
	resumed_equal(ref, out, 0, -1, "done from token 6 forward 6 from_stream 1");

	/* a damaged packet: a byte of pass 5's first record flipped; tokens 0..4 stay */
	snprintf(out, sizeof out, "%s/damaged.strap", d.dir);
	killed(out, 1000 + 8, 0);
	snprintf(
		cmd, sizeof cmd,
		"'%s' -c 'import sys\n"
		"from llm_instrumentation import open_stream\n"
		"with open_stream(sys.argv[1]) as r:\n"
		"    off = next(p.payload_start for p in r.packets() if p.type_name == \"TENSOR\" and p.forward == 5)\n"
		"with open(sys.argv[1], \"r+b\") as f:\n"
		"    f.seek(off + 100); b = f.read(1); f.seek(off + 100); f.write(bytes([b[0] ^ 1]))\n"
		"print(\"flipped\", off + 100)' '%s' 2>&1",
		th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "flipped"), "flip: %s", txt);
	rp = probe(out, "fp1", -1, STRAP_OK);
	CHECK(rp.token_count == 5, "damaged: %llu tokens kept", (unsigned long long)rp.token_count);
	resumed_equal(ref, out, 0, -1, "done from token 5 forward 5 from_stream 1");

	/* a packet damaged inside the checkpointed prefix (pass 2; the checkpoint is at token 8): every
	 * packet of the prefix is CRC-checked, not only the checkpoint's last one, so the resume is
	 * refused and the stream left as it is */
	snprintf(out, sizeof out, "%s/damaged_prefix.strap", d.dir);
	killed(out, 1000 + 9, 4);
	snprintf(
		cmd, sizeof cmd,
		"'%s' -c 'import sys\n"
		"from llm_instrumentation import open_stream\n"
		"with open_stream(sys.argv[1]) as r:\n"
		"    off = next(p.payload_start for p in r.packets() if p.type_name == \"TENSOR\" and p.forward == 2)\n"
		"with open(sys.argv[1], \"r+b\") as f:\n"
		"    f.seek(off + 100); b = f.read(1); f.seek(off + 100); f.write(bytes([b[0] ^ 1]))\n"
		"print(\"flipped\", off + 100)' '%s' 2>&1",
		th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "flipped"), "flip in the prefix: %s", txt);
	probe(out, "fp1", -1, STRAP_E_CHECKPOINT);
	struct stat before;
	CHECK(stat(out, &before) == 0, "stat %s", out);
	rc = run(out, -1, 1, "fp1", 4, -1, log, sizeof log);
	CHECK(rc == 3 && strstr(log, "packet CRC mismatch") && strstr(log, "before the checkpointed offset"),
	      "damaged prefix: %d %s", rc, log);
	struct stat after;
	CHECK(stat(out, &after) == 0 && after.st_size == before.st_size, "damaged prefix: the stream was cut");

	/* the job's limit before the checkpoint (at token 11): rewritten to it before the cut */
	snprintf(out, sizeof out, "%s/job.strap", d.dir);
	killed(out, 1000 + 13, 4);
	rp = probe(out, "fp1", 6, STRAP_OK);
	CHECK(rp.token_count == 6 && rp.forward_count == 6 && rp.from_stream, "job: probe %llu tokens",
	      (unsigned long long)rp.token_count);
	rc = run(out, 5000, 1, "fp1", 4, 6, log, sizeof log); /* killed right after the open */
	CHECK(rc == 128 + SIGKILL || rc == -SIGKILL, "job: %d %s", rc, log);
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import json, sys; c = json.load(open(sys.argv[1] + \".ckpt.json\")); print(\"tokens\", "
		 "c[\"token_count\"], \"forwards\", c[\"forward_count\"])' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "tokens 6 forwards 6"), "job: the checkpoint was not rewritten: %s", txt);
	resumed_equal(ref, out, 4, -1, "done from token 6 forward 6 from_stream 0");
	snprintf(out, sizeof out, "%s/job0.strap", d.dir);
	killed(out, 1000 + 5, 4);
	resumed_equal(ref, out, 4, 0, "done from token 0 forward 0 from_stream 0");

	/* a finished capture: the probe says so (the open refuses it, test_resume_complete) */
	rp = probe(ref, "fp1", -1, STRAP_OK);
	CHECK(rp.complete && rp.token_count == N_TOKENS, "ref: complete %d tokens %llu", rp.complete,
	      (unsigned long long)rp.token_count);
	rp = probe(ref, "fp1", 3, STRAP_OK);
	CHECK(rp.complete && rp.token_count == 3, "ref, limit 3: complete %d tokens %llu", rp.complete,
	      (unsigned long long)rp.token_count);

	/* not a strap stream: refused, left as it is; an empty file: from token 0 */
	snprintf(out, sizeof out, "%s/notes.strap", d.dir);
	FILE *f = fopen(out, "w");
	fputs("my notes, not a capture\n", f);
	fclose(f);
	probe(out, "fp1", -1, STRAP_E_CHECKPOINT);
	rc = run(out, -1, 1, "fp1", 4, -1, log, sizeof log);
	CHECK(rc == 3 && strstr(log, "stream header is not valid"), "notes: %d %s", rc, log);
	struct stat st;
	CHECK(stat(out, &st) == 0 && st.st_size == 24, "notes: the file was changed");
	snprintf(out, sizeof out, "%s/empty.strap", d.dir);
	f = fopen(out, "w");
	fclose(f);
	rp = probe(out, "fp1", -1, STRAP_OK);
	CHECK(!rp.resumed && rp.token_count == 0, "empty: probe resumed %d", rp.resumed);
	resumed_equal(ref, out, 4, -1, "done from token 0 forward 0 from_stream 0");
	snprintf(out, sizeof out, "%s/never.strap", d.dir);
	rp = probe(out, "fp1", -1, STRAP_OK); /* nothing there at all */
	CHECK(!rp.resumed, "never: resumed %d", rp.resumed);

	/* two ranks of a job: rank 0 holds 10 tokens (its checkpoint 8), rank 1 holds 6 */
	char big[8192], jcmd[8192];
	snprintf(out, sizeof out, "%s/job2.strap", d.dir);
	for (int r = 0; r < 2; r++) {
		snprintf(cmd, sizeof cmd, "RANK=%d WORLD_SIZE=2 '%s' child '%s' '%s' %d 0 fp1 4 -1 2>&1", r, self,
			 d.socket, out, r ? 1000 + 5 : 1000 + 9);
		rc = th_run(cmd, log, sizeof log);
		CHECK(rc == 128 + SIGKILL || rc == -SIGKILL, "rank %d: %d %s", r, rc, log);
	}
	char r0[700], r1[700];
	snprintf(r0, sizeof r0, "%s/job2.rank00000-of-00002.strap", d.dir);
	snprintf(r1, sizeof r1, "%s/job2.rank00001-of-00002.strap", d.dir);
	wait_ended(r0);
	wait_ended(r1);
	const char *env = "TORCHELASTIC_RUN_ID=job39 TORCHELASTIC_RESTART_COUNT=1 WORLD_SIZE=2";
	snprintf(
		jcmd, sizeof jcmd,
		"cd '%s' && (RANK=0 %s '%s' child '%s' '%s' -1 1 fp1 4 -1 > r0.log 2>&1 &) ; RANK=1 %s '%s' child '%s' "
		"'%s' -1 1 fp1 4 -1 > r1.log 2>&1; for i in $(seq 600); do grep -Eq 'done|open:|capture:' r0.log && "
		"break; sleep 0.1; done; cat r0.log; echo ---; cat r1.log",
		d.dir, env, self, d.socket, out, env, self, d.socket, out);
	th_run(jcmd, big, sizeof big);
	CHECK(strstr(big, "done from token 6 forward 6 from_stream 1 job 1\n---\ndone from token 6 forward 6 "
			  "from_stream 1 job 1"),
	      "job: %s", big);
	for (int r = 0; r < 2; r++) {
		snprintf(cmd, sizeof cmd, "'%s' '%s/compare_streams.py' '%s' '%s' 2>&1", th_env("STRAP_PYTHON"),
			 th_env("STRAP_TESTS"), ref, r ? r1 : r0);
		rc = th_run(cmd, txt, sizeof txt);
		CHECK(rc == 0, "job rank %d differs from the uninterrupted capture:\n%s", r, txt);
	}

	/* a rank that cannot resume: the other one fails too, naming it, and changes nothing */
	snprintf(out, sizeof out, "%s/job3.strap", d.dir);
	snprintf(cmd, sizeof cmd, "RANK=0 WORLD_SIZE=2 '%s' child '%s' '%s' %d 0 fp1 4 -1 2>&1", self, d.socket, out,
		 1000 + 9);
	th_run(cmd, log, sizeof log);
	snprintf(r0, sizeof r0, "%s/job3.rank00000-of-00002.strap", d.dir);
	snprintf(r1, sizeof r1, "%s/job3.rank00001-of-00002.strap", d.dir);
	wait_ended(r0);
	f = fopen(r1, "w");
	fputs("my notes, not a capture\n", f);
	fclose(f);
	struct stat st0;
	stat(r0, &st0);
	snprintf(
		jcmd, sizeof jcmd,
		"cd '%s' && (RANK=1 %s '%s' child '%s' '%s' -1 1 fp1 4 -1 > r1.log 2>&1 &) ; RANK=0 %s '%s' child '%s' "
		"'%s' -1 1 fp1 4 -1 2>&1; for i in $(seq 600); do grep -q 'open:' r1.log && break; sleep 0.1; done; "
		"echo ---; cat r1.log",
		d.dir, env, self, d.socket, out, env, self, d.socket, out);
	th_run(jcmd, big, sizeof big);
	CHECK(strstr(big, "the job cannot resume: rank 1: ") && strstr(big, "stream header is not valid") &&
		      strstr(big, "rank 0 could keep 10 tokens"),
	      "job, rank 1 broken: %s", big);
	CHECK(stat(r0, &st) == 0 && st.st_size == st0.st_size, "job: rank 0's stream was changed");

	/* a rank alone: waits STRAP_JOB_RESUME_WAIT, then fails naming the missing rank */
	snprintf(cmd, sizeof cmd,
		 "RANK=0 STRAP_JOB_RESUME_WAIT=1 TORCHELASTIC_RUN_ID=job39 TORCHELASTIC_RESTART_COUNT=2 WORLD_SIZE=2 "
		 "'%s' child '%s' '%s' -1 1 fp1 4 -1 2>&1",
		 self, d.socket, out);
	rc = th_run(cmd, big, sizeof big);
	CHECK(rc == 3 && strstr(big, "for the resume point of rank 1") && strstr(big, "job39/2"), "job, alone: %d %s",
	      rc, big);
	th_stop_daemon(&d);
	return th_done("resume_stream");
}
