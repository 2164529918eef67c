/* The client against a fake daemon that answers garbage (each case a clear error naming what is
 * wrong, never a crash or a hang: run under ASan/UBSan), and the client-side checks that refuse
 * what strapd would end a session for (the hostile-client cases of the Python tests that the C
 * API can express). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

enum behaviour {
	B_GARBAGE,
	B_NOT_JSON,
	B_VERSION2,
	B_VERSION_ERROR,
	B_CLOSE,
	B_EMPTY,
	B_HUGE,
	B_BAD_OPENED,
	B_WRONG_REPLY,
	B_TINY_RING,
	B_RELEASE_PAST_HEAD,
	B_NO_RELEASE,
	B_WRITE_ERROR,
	B_ERROR_AND_CLOSE,
	B_NO_WELCOME,
	B_SLOW_WELCOME,
	B_NO_OPENED,
	B_NO_CLOSED,
	B_RELEASE_BACKWARDS,
	B_GOOD,
};

static int listen_fd;
static volatile int behaviour;
static char sock_path[100];

static void send_msg(int fd, int type, int version, const char *body)
{
	uint8_t d[SP_MAX_MESSAGE];
	size_t n = strlen(body);
	memcpy(d, "STRP", 4);
	d[4] = (uint8_t)version, d[5] = 0, d[6] = (uint8_t)type, d[7] = 0;
	d[8] = (uint8_t)n, d[9] = (uint8_t)(n >> 8), d[10] = (uint8_t)(n >> 16), d[11] = 0;
	memcpy(d + 12, body, n);
	if (send(fd, d, 12 + n, MSG_NOSIGNAL) < 0)
		perror("fake send");
}

/* One message from the client (its descriptors closed); its type, 0 at EOF. */
static int recv_msg(int fd, char *body, size_t cap)
{
	uint8_t d[SP_MAX_MESSAGE];
	char ctl[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = {d, sizeof d};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
	ssize_t n = recvmsg(fd, &m, 0);
	if (n <= 0)
		return 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_type == SCM_RIGHTS) {
			int nf = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int fds[4];
			memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)nf);
			for (int i = 0; i < nf; i++)
				close(fds[i]);
		}
	}
	size_t bl = (size_t)n - 12 < cap - 1 ? (size_t)n - 12 : cap - 1;
	memcpy(body, d + 12, bl);
	body[bl] = 0;
	return d[6];
}

static const char welcome[] = "{\"protocol\":1,\"daemon\":\"fake\",\"pid\":1,\"max_message\":65536}";

static void *fake_daemon(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(listen_fd, NULL, NULL);
		if (c < 0)
			return NULL;
		char body[SP_MAX_MESSAGE];
		int t = recv_msg(c, body, sizeof body); /* HELLO */
		int b = behaviour;
		if (t != SP_HELLO) {
			close(c);
			continue;
		}
		switch (b) {
		case B_GARBAGE: send(c, "garbage!garbage!", 16, MSG_NOSIGNAL); break;
		case B_NOT_JSON: send_msg(c, SP_WELCOME, 1, "{\"protocol\":1"); break;
		case B_VERSION2: send_msg(c, SP_WELCOME, 2, welcome); break;
		case B_VERSION_ERROR:
			send_msg(c, SP_ERROR, 1,
				 "{\"code\":\"protocol_version\",\"message\":\"client speaks protocol 1, strapd speaks "
				 "protocol "
				 "2\",\"fatal\":true}");
			break;
		case B_CLOSE: break;
		case B_NO_WELCOME: /* silent until the client gives up and hangs up */
			while (recv_msg(c, body, sizeof body) != 0)
				;
			break;
		case B_EMPTY: send(c, "", 0, MSG_NOSIGNAL); break;
		case B_HUGE: {
			static char big[70000];
			memset(big, ' ', sizeof big);
			memcpy(big, "STRP", 4);
			send(c, big, sizeof big, MSG_NOSIGNAL);
			break;
		}
		case B_TINY_RING:
			send_msg(c, SP_WELCOME, 1,
				 "{\"protocol\":1,\"daemon\":\"fake\",\"pid\":1,\"max_message\":65536,\"max_ring_"
				 "size\":1000}");
			break;
		default:
			if (b == B_SLOW_WELCOME)
				usleep(10500000); /* longer than the wait libstrap once fixed at 10 s */
			send_msg(c, SP_WELCOME, 1, welcome);
			recv_msg(c, body, sizeof body); /* OPEN */
			if (b == B_NO_OPENED) {
				while (recv_msg(c, body, sizeof body) != 0)
					;
				break;
			}
			if (b == B_BAD_OPENED) {
				send_msg(c, SP_OPENED, 1, "{\"session\":\"x\",\"block_size\":1}");
				break;
			}
			if (b == B_WRONG_REPLY) {
				send_msg(c, SP_CLOSED, 1,
					 "{\"packets\":0,\"drops\":0,\"bytes_in\":0,\"bytes_out\":0,\"file_bytes\":0}");
				break;
			}
			send_msg(c, SP_OPENED, 1, "{\"session\":9,\"block_size\":1048576}");
			if (b == B_ERROR_AND_CLOSE) {
				send_msg(c, SP_ERROR, 1,
					 "{\"code\":\"torn_record\",\"message\":\"expected seq 1, found "
					 "5\",\"fatal\":true}");
				break;
			}
			int publishes = 0;
			while ((t = recv_msg(c, body, sizeof body)) != 0) {
				if (t == SP_PUBLISH) {
					publishes++;
					sp_reply r;
					char why[100], head[40];
					const char *h = strstr(body, "\"head\":");
					snprintf(head, sizeof head, "%s", h ? h + 7 : "0");
					head[strcspn(head, ",}")] = 0;
					(void)r, (void)why;
					char rel[100];
					if (b == B_RELEASE_PAST_HEAD)
						snprintf(rel, sizeof rel, "{\"tail\":%s999}", head);
					else if (b == B_RELEASE_BACKWARDS && publishes == 2)
						snprintf(rel, sizeof rel, "{\"tail\":0}");
					else
						snprintf(rel, sizeof rel, "{\"tail\":%s}", head);
					if (b == B_WRITE_ERROR)
						send_msg(c, SP_ERROR, 1,
							 "{\"code\":\"write_error\",\"message\":\"stream \\\"/x\\\": "
							 "no space left on device "
							 "(0 bytes free of 1 on the stream's file "
							 "system)\",\"fatal\":true}");
					else if (b != B_NO_RELEASE)
						send_msg(c, SP_RELEASE, 1, rel);
				} else if (t == SP_CLOSE && b != B_NO_CLOSED) {
					send_msg(c, SP_CLOSED, 1,
						 "{\"packets\":1,\"drops\":0,\"bytes_in\":4,\"bytes_out\":4,\"file_"
						 "bytes\":400}");
				}
			}
		}
		/* let the client read what was sent before it sees the close */
		usleep(20000);
		close(c);
	}
}

static strap_session_params params(const char *out)
{
	strap_session_params p = strap_default_session_params();
	p.socket_path = sock_path;
	p.autostart = 0;
	p.output_path = out;
	p.ring_size = 4096 + 64 * 1024;
	p.stall_timeout_s = 0.5;
	return p;
}

static void open_fails(int b, const char *out, int want, const char *msg)
{
	behaviour = b;
	strap_session_params p = params(out);
	strap_session *s = (strap_session *)1;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == want && s == NULL && strstr(e.message, msg) && e.code == want,
	      "behaviour %d: open rc %d (%s), message \"%s\", want %d with \"%s\"", b, rc, strap_errstr(rc), e.message,
	      want, msg);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A daemon that does not answer: the open (or close) fails with STRAP_E_TIMEOUT after the
 * session's stall_timeout_s, not after a wait of libstrap's own (once 10, 30 and 60 s). */
static void waits_follow_stall_timeout(const char *out)
{
	struct {
		int b;
		const char *want;
	} cases[] = {{B_NO_WELCOME, "WELCOME within 1.5s"}, {B_NO_OPENED, "OPENED within 1.5s"}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		behaviour = cases[i].b;
		strap_session_params p = params(out);
		p.stall_timeout_s = 1.5;
		strap_session *s = NULL;
		strap_error e;
		double t0 = now();
		int rc = strap_session_open(&p, &s, &e);
		double took = now() - t0;
		CHECK(rc == STRAP_E_TIMEOUT && s == NULL && strstr(e.message, cases[i].want) &&
			      strstr(e.message, "stall_timeout_s"),
		      "behaviour %d: rc %d (%s) \"%s\", want a timeout naming \"%s\"", cases[i].b, rc, strap_errstr(rc),
		      e.message, cases[i].want);
		CHECK(took >= 1.4 && took < 5, "behaviour %d: gave up after %.1fs, stall_timeout_s is 1.5", cases[i].b,
		      took);
	}
	behaviour = B_NO_CLOSED;
	strap_session_params p = params(out);
	p.stall_timeout_s = 1.5;
	strap_session *s = NULL;
	strap_error e;
	CHECK(strap_session_open(&p, &s, &e) == STRAP_OK, "open: %s", e.message);
	if (s) {
		double t0 = now();
		CHECK_RC(s, strap_session_close(s, NULL), STRAP_E_TIMEOUT);
		double took = now() - t0;
		CHECK(took >= 1.4 && took < 5, "close gave up after %.1fs, stall_timeout_s is 1.5", took);
		strap_session_free(s);
	}
	/* and a longer stall_timeout_s is waited out in full: WELCOME after 10.5 s */
	behaviour = B_SLOW_WELCOME;
	p = params(out);
	p.stall_timeout_s = 20;
	s = NULL;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_OK, "WELCOME after 10.5 s with stall_timeout_s 20: rc %d (%s): %s", rc, strap_errstr(rc),
	      e.message);
	if (s) {
		CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
		strap_session_free(s);
	}
}

static strap_session *open_ok(int b, const char *out)
{
	behaviour = b;
	strap_session_params p = params(out);
	strap_session *s = NULL;
	strap_error e;
	int rc = strap_session_open(&p, &s, &e);
	CHECK(rc == STRAP_OK, "behaviour %d: open: %s", b, e.message);
	return s;
}

static void last_error_has(strap_session *s, const char *msg, const char *code)
{
	strap_error e;
	strap_session_last_error(s, &e);
	CHECK(strstr(e.message, msg) && (!code || strcmp(e.daemon_code, code) == 0),
	      "error \"%s\" (code %s), want \"%s\"", e.message, e.daemon_code, msg);
}

int main(void)
{
	char dir[] = "/tmp/strap-hostile-XXXXXX";
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock_path, sizeof sock_path, "%s/fake.sock", dir);
	listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
	if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) || listen(listen_fd, 8))
		return 1;
	pthread_t th;
	pthread_create(&th, NULL, fake_daemon, NULL);
	char out[400];
	snprintf(out, sizeof out, "%s/out.strap", dir);

	open_fails(B_GARBAGE, out, STRAP_E_PROTOCOL, "bad message magic");
	open_fails(B_NOT_JSON, out, STRAP_E_PROTOCOL, "WELCOME body is not JSON");
	open_fails(B_VERSION2, out, STRAP_E_PROTOCOL, "daemon speaks protocol 2");
	open_fails(B_VERSION_ERROR, out, STRAP_E_DAEMON, "protocol_version: client speaks protocol 1");
	open_fails(B_CLOSE, out, STRAP_E_CLOSED, "closed by the daemon (EOF)");
	open_fails(B_EMPTY, out, STRAP_E_CLOSED, "closed by the daemon (EOF)");
	open_fails(B_HUGE, out, STRAP_E_PROTOCOL, "exceeds 65536");
	open_fails(B_BAD_OPENED, out, STRAP_E_PROTOCOL, "OPENED.session is \"x\", expected an integer >= 0");
	open_fails(B_WRONG_REPLY, out, STRAP_E_PROTOCOL, "expected OPENED, got CLOSED");
	open_fails(B_TINY_RING, out, STRAP_E_DAEMON, "admits rings of at most 1000 bytes");

	static uint8_t data[16 << 10];
	int64_t shape[1] = {4096};

	/* a RELEASE past the head ends the session; every later call says so */
	strap_session *s = open_ok(B_RELEASE_PAST_HEAD, out);
	if (s) {
		/* 16 KiB > publish_bytes: the write publishes; the RELEASE comes back at once */
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL), STRAP_OK);
		usleep(50000);
		CHECK_RC(s, strap_session_token(s, 1, "a", 1, -1), STRAP_E_PROTOCOL);
		last_error_has(s, "past the head", NULL);
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL),
			 STRAP_E_STATE);
		strap_session_free(s);
	}

	/* a RELEASE that moves the tail backwards ends the session at once with a protocol error */
	s = open_ok(B_RELEASE_BACKWARDS, out);
	if (s) {
		int rc = STRAP_OK;
		for (int i = 0; i < 4 && rc == STRAP_OK; i++) {
			rc = strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL);
			usleep(50000);
		}
		if (rc == STRAP_OK)
			rc = strap_session_flush(s);
		CHECK(rc == STRAP_E_PROTOCOL, "backwards release: rc %d (%s)", rc, strap_errstr(rc));
		last_error_has(s, "moved the ring's tail backwards", NULL);
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL),
			 STRAP_E_STATE);
		strap_session_free(s);
	}

	waits_follow_stall_timeout(out);

	/* a daemon that never releases: the writer waits stall_timeout_s, then says so */
	s = open_ok(B_NO_RELEASE, out);
	if (s) {
		int rc = STRAP_OK;
		for (int i = 0; i < 20 && rc == STRAP_OK; i++)
			rc = strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL);
		CHECK(rc == STRAP_E_TIMEOUT, "no release: rc %d", rc);
		last_error_has(s, "released no ring space", NULL);
		strap_session_free(s);
	}

	/* a fatal ERROR (write_error) reaches the caller with its code */
	s = open_ok(B_WRITE_ERROR, out);
	if (s) {
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL), STRAP_OK);
		/* the write published (16 KiB > publish_bytes); the ERROR surfaces at the next call
		 * that reads the socket */
		usleep(50000);
		CHECK_RC(s, strap_session_token(s, 1, "a", 1, -1), STRAP_E_DAEMON);
		last_error_has(s, "no space left on device", "write_error");
		CHECK_RC(s, strap_session_flush(s), STRAP_E_STATE);
		strap_session_free(s);
	}

	/* ERROR then close, with the client's messages unread: the ERROR, not a bare EOF/EPIPE */
	s = open_ok(B_ERROR_AND_CLOSE, out);
	if (s) {
		usleep(100000);
		int rc = strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL);
		if (rc == STRAP_OK)
			rc = strap_session_flush(s);
		CHECK(rc == STRAP_E_DAEMON, "error then close: rc %d", rc);
		last_error_has(s, "expected seq 1, found 5", "torn_record");
		strap_session_free(s);
	}

	/* client-side refusals: each a clear STRAP_E_INVALID that leaves the session usable */
	s = open_ok(B_GOOD, out);
	if (s) {
		char longname[5000];
		memset(longname, 'n', sizeof longname - 1);
		longname[4097] = 0;
		int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[1] = {-1};
		struct {
			const char *name, *meta;
			int dtype, ndim;
			const int64_t *shape;
			size_t n;
			const char *msg;
		} bad[] = {
			{"", NULL, STRAP_DTYPE_F32, 1, shape, sizeof data, "name must be 1..4096"},
			{longname, NULL, STRAP_DTYPE_F32, 1, shape, sizeof data, "name must be 1..4096"},
			{"bad\xff", NULL, STRAP_DTYPE_F32, 1, shape, sizeof data, "not valid UTF-8"},
			{"lone\xed\xa0\x80", NULL, STRAP_DTYPE_F32, 1, shape, sizeof data, "not valid UTF-8"},
			{"m", "[1]", STRAP_DTYPE_F32, 1, shape, sizeof data, "meta is not a JSON object"},
			{"m", "{\"a\":", STRAP_DTYPE_F32, 1, shape, sizeof data, "meta is not a JSON object"},
			{"m", "{\"a\":\"\\udc00\"}", STRAP_DTYPE_F32, 1, shape, sizeof data,
			 "meta is not a JSON object"},
			{"m", NULL, 0, 1, shape, sizeof data, "unknown dtype 0"},
			{"m", NULL, 13, 1, shape, sizeof data, "unknown dtype 13"},
			{"m", NULL, STRAP_DTYPE_F32, 9, nine, 4, "ndim 9"},
			{"m", NULL, STRAP_DTYPE_F32, 1, neg, 4, "bad shape"},
			{"m", NULL, STRAP_DTYPE_F32, 1, shape, 100, "100 bytes given, shape and dtype make 16384"},
		};
		for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
			CHECK_RC(s,
				 strap_session_write(s, bad[i].name, bad[i].dtype, bad[i].shape, bad[i].ndim, data,
						     bad[i].n, bad[i].meta),
				 STRAP_E_INVALID);
			last_error_has(s, bad[i].msg, NULL);
		}
		CHECK_RC(s, strap_session_token(s, 1, "\xed\xa0\x80", 3, -1), STRAP_E_INVALID);
		last_error_has(s, "not valid UTF-8", NULL);
		CHECK_RC(s, strap_session_write_ggml(s, "q", STRAP_GGML_Q4_0, (int64_t[]){33, 2}, 2, data, 100),
			 STRAP_E_INVALID);
		last_error_has(s, "not a whole number of q4_0 blocks", NULL);
		CHECK_RC(s, strap_session_write_ggml(s, "q", 31, (int64_t[]){32, 2}, 2, data, 100), STRAP_E_INVALID);
		const char *ev = "{\"event\":\"x\"}";
		size_t evl = strlen(ev);
		CHECK_RC(s, strap_session_resources(s, &ev, &evl, 1), STRAP_E_INVALID);
		last_error_has(s, "params.resources", NULL);
		/* still usable */
		CHECK_RC(s, strap_session_write(s, "m", STRAP_DTYPE_F32, shape, 1, data, sizeof data, NULL), STRAP_OK);
		CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
		strap_session_free(s);
	}
	shutdown(listen_fd, SHUT_RDWR);
	close(listen_fd);
	pthread_join(th, NULL);
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		perror("rm");
	return th_done("hostile");
}
