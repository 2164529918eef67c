/* Shared helpers of the test programs: checks, a real strapd started as a separate process
 * with its own socket directory, commands run and their output read, deterministic data. */
#ifndef STRAP_TEST_HARNESS_H
#define STRAP_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "strap.h"

extern int th_failures;

#define CHECK(cond, ...)                                                                                               \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			th_failures++;                                                                                 \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                       \
			fprintf(stderr, __VA_ARGS__);                                                                  \
			fprintf(stderr, "\n");                                                                         \
		}                                                                                                      \
	} while (0)

/* CHECK that a libstrap call returned want, printing the session's error otherwise. */
#define CHECK_RC(s, call, want)                                                                                        \
	do {                                                                                                           \
		int rc_ = (call);                                                                                      \
		if (rc_ != (want)) {                                                                                   \
			strap_error e_;                                                                                \
			strap_session_last_error((s), &e_);                                                            \
			th_failures++;                                                                                 \
			fprintf(stderr, "%s:%d: %s = %d (%s), want %d: %s\n", __FILE__, __LINE__, #call, rc_,          \
				strap_errstr(rc_), (want), e_.message);                                                \
		}                                                                                                      \
	} while (0)

typedef struct th_daemon {
	pid_t pid;
	char dir[64]; /* a fresh temp dir: socket, log, captures */
	char socket[96];
} th_daemon;

/* The environment variable, or exit with a message when it is not set. */
const char *th_env(const char *name);
/* Start bin/strapd serve on a fresh socket dir (extra args appended); wait until it accepts. */
int th_start_daemon(th_daemon *d, const char *const *extra);
/* SIGTERM and wait (SIGKILL after 20 s); its directory is removed unless a check failed. */
void th_stop_daemon(th_daemon *d);
/* Run a shell command; its stdout (up to cap-1 bytes) into out (may be NULL). Returns the exit
 * status (or -1). */
int th_run(const char *cmd, char *out, size_t cap);
/* Fill buf with bytes from a xorshift generator seeded with seed. */
void th_fill(void *buf, size_t n, uint64_t seed);
/* Print the summary and return the exit code for main. */
int th_done(const char *name);
/* Open a session with the defaults for this daemon and the given output; exits on failure. */
strap_session *th_open(th_daemon *d, strap_session_params *p);

/* The manifest readback.py compares a stream against (one JSON line per event). */
typedef struct th_expect {
	char dir[400];
	FILE *manifest;
	int n;
} th_expect;
void th_expect_open(th_expect *x, const char *dir);
void th_expect_tensor(th_expect *x, const char *name, const char *dtype, const int64_t *shape, int ndim, uint64_t step,
		      uint64_t forward, const char *meta, const void *data, size_t n, int parts);
void th_expect_token(th_expect *x, uint64_t index, int64_t token_id, const char *text);
void th_expect_drop(th_expect *x, const char *name, size_t bytes);
void th_expect_close(th_expect *x);
/* Run readback.py, strapd verify and strapd inspect on a stream; CHECKs each. */
void th_check_stream(const char *stream, th_expect *x);
#endif
