#define _GNU_SOURCE
/* A session attached to a connection and ring its caller opened (src/attach.h: the Python
 * client's), through a real strapd: the caller says HELLO, makes the ring and sends OPEN itself (as the
 * Python client once did); from OPENED on the records are claimed and advanced, the caller's copies
 * held back by its frontier (the Python client's CUDA copies: nothing past an unfinished copy is
 * published, a blocking publish waits for it), tokens go as messages with the caller's index and
 * as TOKEN records, a DROP comes under policy drop, CHECKPOINT and CLOSE end it; the stream holds exactly that
 * (readback.py, strapd verify). Then the open made for such a caller (strap__session_open_attached, the
 * Python client's): its connection and rings from callbacks, the ring fitted to the daemon's
 * max_ring_size, a default ring retried smaller for the memory budget (the refused ring given back),
 * a ring the caller chose refused naming its setting, a failed connect taking no ring, and the
 * transport's ring facts in the stream's metadata. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "attach.h"
#include "conn.h"
#include "harness.h"
#include "strap_channel.h"
#include "strap_ring.h"
#include "strap_wire.h"

/* The caller's copies: records at or past held_head are not complete until released. */
typedef struct copies {
	uint64_t held_head, held_seq; /* the complete prefix while held */
	int held, calls, blocking;
} copies;

static int frontier(void *user, int block, uint64_t *head, uint64_t *seq)
{
	copies *c = user;
	c->calls++;
	if (!c->held)
		return 0;
	if (block) { /* a blocking publish waits for every copy: here they complete at once */
		c->blocking++;
		c->held = 0;
		return 0;
	}
	*head = c->held_head;
	*seq = c->held_seq;
	return 1;
}

static int interrupted(void *user)
{
	(void)user;
	return 0;
}

static sp_reply reply;
static uint8_t rbuf[SP_MAX_MESSAGE + 1];

/* Send a datagram, read the reply of type want. */
static int exchange(int sock, const sw_buf *b, const int *fds, int nfds, int want)
{
	if (sch_send(sock, b->p, b->n, fds, nfds) != 0)
		return -1;
	ssize_t n = sch_recv(sock, rbuf, sizeof rbuf, 10000);
	char why[200];
	if (n <= 0 || sp_decode_reply(rbuf, (size_t)n, &reply, why, sizeof why) != SP_OK || reply.type != want) {
		fprintf(stderr, "no %s: %zd bytes, type %d\n", sp_type_name(want), n, reply.type);
		return -1;
	}
	return 0;
}

/* One record claimed at the head and written (payload bytes of value v). */
static void record(strap_session *s, srb_ring *rb, const char *name, size_t n, int mode, uint64_t step,
		   uint64_t forward, uint8_t v, th_expect *x, int *written, int *dropped)
{
	uint64_t shape[1] = {n};
	uint64_t hdr = sr_header_area(1, strlen(name), 0), rec_len = sr_align64(hdr + n), seq = 0;
	int rc = strap__session_claim(s, rec_len, mode, name, strlen(name), n, step, forward, &seq);
	if (rc == STRAP_DROPPED) {
		th_expect_drop(x, name, n);
		(*dropped)++;
		return;
	}
	CHECK(rc == STRAP_OK && seq, "claim %s: %d", name, rc);
	uint8_t *d = srb_at(rb, rb->head);
	sr_encode_record_header(d, STRAP_DTYPE_U8, shape, 1, seq, rec_len, step, forward, n, name, strlen(name), NULL,
				0, 0, n, 0);
	memset(d + hdr, v, n);
	CHECK_RC(s, strap__session_advance(s, rec_len, n, true), STRAP_OK);
	uint8_t data[4096];
	memset(data, v, n);
	th_expect_tensor(x, name, "uint8", (int64_t[]){(int64_t)n}, 1, step, forward, NULL, data, n, 1);
	(*written)++;
}

/* ----- strap__session_open_attached ----- */

typedef struct caller {
	const char *socket;
	int connects, fail_connect;
	srb_ring rings[8];
	int taken, dropped;
} caller;

static int caller_connect(void *user, strap_error *err)
{
	caller *c = user;
	c->connects++;
	if (c->fail_connect) {
		snprintf(err->message, sizeof err->message, "no daemon for this test");
		return STRAP_E_CONNECT;
	}
	char path[4200];
	return sc_connect(c->socket, 0, NULL, 0, path, sizeof path, err);
}

static srb_ring *caller_ring(void *user, uint64_t size, strap_error *err)
{
	caller *c = user;
	if (c->taken == 8 || srb_create(&c->rings[c->taken], size, err->message, sizeof err->message) != 0)
		return NULL;
	return &c->rings[c->taken++];
}

static void caller_ring_drop(void *user, srb_ring *ring)
{
	caller *c = user;
	c->dropped++;
	srb_destroy(ring);
}

static int open_as_caller(caller *c, const char *out, uint64_t ring_size, bool explicit_ring, strap__opened *op,
			  strap_session **s, strap_error *err)
{
	int fd = open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	strap__open o = {
		.connect = caller_connect,
		.ring = caller_ring,
		.ring_drop = caller_ring_drop,
		.user = c,
		.client = "test_attach/open",
		.body = {.codec = "none"},
		.metadata = "{\"model\": \"none\", \"n\": [1, 2]}",
		.transport = "{\"codec\":\"none\",\"note\":\"caller's\"}",
		.ring_size = ring_size,
		.ring_explicit = explicit_ring,
		.ring_setting = "the_ring_setting",
		.out_fd = fd,
		.trace_fd = -1,
		.res_fd = -1,
		.defer = true,
		.attach = {.policy = STRAP_POLICY_BLOCK,
			   .stall_timeout_s = 10,
			   .ring_tokens_every = 16,
			   .ring_tokens_seconds = 0.25,
			   .interrupted = interrupted},
	};
	int rc = strap__session_open_attached(&o, op, s, err);
	close(fd); /* strapd holds its own */
	return rc;
}

/* End an opened session and give its connection and ring back. */
static void close_as_caller(caller *c, strap_session *s, const strap__opened *op)
{
	CHECK_RC(s, strap__session_close_send(s, NULL, 0), STRAP_OK);
	strap_closed cl;
	char upload[16];
	CHECK_RC(s, strap__session_close_wait(s, 0, &cl, upload, sizeof upload), STRAP_OK);
	strap_session_free(s);
	close(op->sock);
	caller_ring_drop(c, op->ring);
}

static void check_open_attached(void)
{
	/* codec none reserves its ring only: 96 MiB hold one 80 MiB ring and leave 16 */
	const char *extra[] = {"--memory-limit", "96MiB", "--max-ring-size", "80MiB", NULL};
	th_daemon d;
	if (th_start_daemon(&d, extra) != 0) {
		CHECK(0, "strapd for the open");
		return;
	}
	caller c = {.socket = d.socket};
	char out[3][600];
	for (int i = 0; i < 3; i++)
		snprintf(out[i], sizeof out[i], "%s/open%d.strap", d.dir, i);
	strap__opened op[2];
	strap_session *s[2] = {NULL, NULL}, *none = NULL;
	strap_error err;
	/* 128 MiB asked: fitted to the daemon's 80 MiB */
	int rc = open_as_caller(&c, out[0], 128ull << 20, false, &op[0], &s[0], &err);
	CHECK(rc == STRAP_OK && op[0].fitted_from == 128ull << 20 && op[0].max_ring_size == 80ull << 20 &&
		      op[0].ring->ring_size == 80ull << 20 && op[0].shrunk_from == 0 && op[0].sock >= 0 &&
		      op[0].max_record == op[0].ring->data_size / 4 / 64 * 64,
	      "fitted open: %s (fitted from %llu, ring %llu)", err.message, (unsigned long long)op[0].fitted_from,
	      rc == STRAP_OK ? (unsigned long long)op[0].ring->ring_size : 0ull);
	/* a default 64 MiB ring with 16 MiB left: refused, given back, retried as small as the room */
	rc = open_as_caller(&c, out[1], 64ull << 20, false, &op[1], &s[1], &err);
	CHECK(rc == STRAP_OK && op[1].shrunk_from == 64ull << 20 && op[1].ring->ring_size < 64ull << 20 &&
		      c.dropped == 1 && c.connects == 3,
	      "budget retry: %s (shrunk from %llu, dropped %d, connects %d)", err.message,
	      (unsigned long long)op[1].shrunk_from, c.dropped, c.connects);
	/* a ring the caller chose, with the budget spent: refused naming its setting, no ring kept */
	strap__opened op2;
	int taken = c.taken, dropped = c.dropped;
	rc = open_as_caller(&c, out[2], 64ull << 20, true, &op2, &none, &err);
	CHECK(rc == STRAP_E_DAEMON && strcmp(err.daemon_code, "memory_budget") == 0 &&
		      strstr(err.message, "the_ring_setting") && strstr(err.message, "--memory-limit") && !none &&
		      c.taken - taken == c.dropped - dropped,
	      "explicit ring over the budget: %d %s: %s", rc, err.daemon_code, err.message);
	/* a connect that fails: its error, no ring taken */
	c.fail_connect = 1;
	taken = c.taken;
	rc = open_as_caller(&c, out[2], 1 << 20, false, &op2, &none, &err);
	CHECK(rc == STRAP_E_CONNECT && strstr(err.message, "no daemon for this test") && c.taken == taken && !none,
	      "failed connect: %d %s", rc, err.message);
	for (int i = 0; i < 2; i++) {
		if (s[i])
			close_as_caller(&c, s[i], &op[i]);
	}
	CHECK(c.taken == c.dropped, "rings taken %d, given back %d", c.taken, c.dropped);
	/* the transport's ring facts follow the caller's members in the stream's metadata */
	char cmd[2000], txt[1 << 16];
	snprintf(cmd, sizeof cmd, "'%s' inspect --json '%s' | tr -d ' \\n'", th_env("STRAPD_BIN"), out[1]);
	th_run(cmd, txt, sizeof txt);
	/* (strapd's inspect sorts the keys) */
	char want[200];
	snprintf(want, sizeof want,
		 "\"transport\":{\"codec\":\"none\",\"note\":\"caller's\",\"ring_shrunk_by_budget_from\":67108864,"
		 "\"ring_size\":%llu}",
		 s[1] ? (unsigned long long)op[1].ring->ring_size : 0ull);
	CHECK(strstr(txt, want) && strstr(txt, "\"model\":\"none\""), "metadata lacks %s: %.3000s", want, txt);
	th_stop_daemon(&d);
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600], path[4200];
	snprintf(out, sizeof out, "%s/attached.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_error err;
	int sock = sc_connect(d.socket, 0, NULL, 0, path, sizeof path, &err);
	CHECK(sock >= 0, "connect: %s", err.message);
	static char sbuf[SP_MAX_MESSAGE];
	sw_buf b = {sbuf, 0, sizeof sbuf, false};
	sp_enc_hello(&b, "test_attach", getpid());
	CHECK(exchange(sock, &b, NULL, 0, SP_WELCOME) == 0, "HELLO");
	srb_ring rb;
	char why[256];
	CHECK(srb_create(&rb, 4096 + (64 << 10), why, sizeof why) == 0, "ring: %s", why);
	int out_fd = open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	sp_open_body o = {.ring_size = rb.ring_size, .codec = "none", .policy = "drop"};
	b = (sw_buf){sbuf, 0, sizeof sbuf, false};
	sp_enc_open(&b, &o);
	CHECK(exchange(sock, &b, (int[]){rb.fd, out_fd}, 2, SP_OPENED) == 0, "OPEN");
	CHECK(reply.u.opened.published_cursor && reply.u.opened.ring_tokens,
	      "OPENED offers the cursor and ring tokens");

	copies c = {0};
	strap__attach a = {
		.sock = sock,
		.ring = &rb,
		.policy = STRAP_POLICY_DROP,
		.stall_timeout_s = 10,
		.max_record = rb.data_size / 4 / 64 * 64,
		.publish_bytes = 1 << 20, /* nothing published by size */
		.session_id = reply.u.opened.session,
		.cursor = true,
		.ring_tokens = true,
		.ring_tokens_every = 16,
		.ring_tokens_seconds = 1e9,
		.frontier = frontier,
		.frontier_user = &c,
		.interrupted = interrupted,
	};
	strap_session *s = NULL;
	CHECK(strap__session_attach(&a, &s, &err) == STRAP_OK && s, "attach: %s", err.message);
	a.max_record = 32; /* a bad argument is refused */
	strap_session *bad = NULL;
	CHECK(strap__session_attach(&a, &bad, &err) == STRAP_E_INVALID && !bad, "bad attach accepted");

	int written = 0, dropped = 0;
	strap__state st;
	/* prefill: two records, the second's copy held; the pass publishes only the first */
	record(s, &rb, "layer.0", 1000, STRAP__CLAIM_POLICY, 0, 0, 1, &x, &written, &dropped);
	c.held_head = rb.head;
	c.held_seq = 1;
	c.held = 1;
	record(s, &rb, "layer.1", 1000, STRAP__CLAIM_POLICY, 0, 0, 2, &x, &written, &dropped);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK);
	strap__session_state(s, &st);
	CHECK(st.published_head == c.held_head && st.publishes == 1 && st.seq == 2, "published %llu (held %llu), %llu",
	      (unsigned long long)st.published_head, (unsigned long long)c.held_head, (unsigned long long)st.publishes);
	/* a token message with the caller's index: a blocking frontier first, the rest named by it */
	uint64_t seq = 0;
	CHECK_RC(s, strap__session_token_at(s, 7, 42, "hi", 2, -1, &seq), STRAP_OK);
	th_expect_token(&x, 7, 42, "hi");
	strap__session_state(s, &st);
	CHECK(seq == 3 && c.blocking == 1 && st.token_messages == 1 && st.token_heads == 1 &&
		      st.published_head == rb.head,
	      "token seq %llu, blocking %d, messages %llu heads %llu", (unsigned long long)seq, c.blocking,
	      (unsigned long long)st.token_messages, (unsigned long long)st.token_heads);
	/* a token with a position: a TOKEN record, named by no message yet */
	CHECK_RC(s, strap__session_token_at(s, 8, 43, "yo", 2, 9, &seq), STRAP_OK);
	th_expect_token(&x, 8, 43, "yo");
	int64_t pos[2] = {10, 11}, ids[2] = {44, 45};
	size_t done = 0;
	CHECK_RC(s, strap__session_tokens_to_ring(s, pos, ids, 2, &done), STRAP_OK);
	th_expect_token(&x, 2, 44, ""); /* indices from the session's token count on */
	th_expect_token(&x, 3, 45, "");
	strap__session_state(s, &st);
	CHECK(done == 2 && st.token_records == 3 && st.unsent_tokens == 3 && st.token_messages == 1, "ring tokens");
	/* a pass that does not fit the 64 KiB ring under policy drop: the later records drop */
	for (int i = 0; i < 20; i++) {
		char name[32];
		snprintf(name, sizeof name, "big.%d", i);
		record(s, &rb, name, 4000, STRAP__CLAIM_POLICY, 4, 1, (uint8_t)(10 + i), &x, &written, &dropped);
	}
	CHECK(dropped > 0, "nothing dropped");
	/* claim now: no room, nothing done (the ring holds the unpublished pass) */
	uint64_t before = rb.head;
	int rc = strap__session_claim(s, rb.data_size / 4 / 64 * 64, STRAP__CLAIM_NOW, "x", 1, 1, 4, 1, &seq);
	CHECK(rc == STRAP__NO_ROOM || rc == STRAP_OK, "claim now: %d", rc);
	if (rc == STRAP_OK) { /* RELEASEs drained made room: give the claimed bytes a record */
		uint64_t n = rb.data_size / 4 / 64 * 64 - sr_align64(sr_header_area(1, 1, 0));
		uint8_t *dd = srb_at(&rb, rb.head);
		sr_encode_record_header(dd, STRAP_DTYPE_U8, (uint64_t[]){n}, 1, seq, rb.data_size / 4 / 64 * 64, 4, 1,
					n, "x", 1, NULL, 0, 0, n, 0);
		memset(dd + sr_align64(sr_header_area(1, 1, 0)), 0, n);
		CHECK_RC(s, strap__session_advance(s, rb.data_size / 4 / 64 * 64, n, true), STRAP_OK);
		static uint8_t zeros[1 << 16];
		th_expect_tensor(&x, "x", "uint8", (int64_t[]){(int64_t)n}, 1, 4, 1, NULL, zeros, n, 1);
		written++;
	} else {
		CHECK(rb.head == before, "a refused claim moved the head");
	}
	uint64_t ck[7];
	CHECK_RC(s, strap__session_checkpoint_exchange(s, 0, ck), STRAP_OK);
	strap__session_state(s, &st);
	CHECK(ck[0] == st.seq && ck[3] == st.drops && ck[4] == 4, "CHECKPOINTED seq %llu drops %llu tokens %llu",
	      (unsigned long long)ck[0], (unsigned long long)ck[3], (unsigned long long)ck[4]);
	/* CLOSE (descriptors go with it only for an uploaded session's tokens file: strapd refuses
	 * them otherwise) */
	CHECK_RC(s, strap__session_close_send(s, NULL, 0), STRAP_OK);
	CHECK(!strap__session_ready(s, 64), "records taken after CLOSE");
	strap_closed cl;
	char upload[64] = "x";
	CHECK_RC(s, strap__session_close_wait(s, 0, &cl, upload, sizeof upload), STRAP_OK);
	CHECK(cl.drops == (uint64_t)dropped && cl.packets == (uint64_t)(written + 4 + dropped) && upload[0] == 0,
	      "CLOSED packets %llu drops %llu (written %d dropped %d)", (unsigned long long)cl.packets,
	      (unsigned long long)cl.drops, written, dropped);
	strap_session_free(s); /* the connection and the ring are the caller's */
	CHECK(fcntl(sock, F_GETFD) >= 0 && fcntl(rb.fd, F_GETFD) >= 0, "an attached session closed the caller's fds");
	close(sock);
	close(out_fd);
	srb_destroy(&rb);
	th_expect_close(&x);
	th_check_stream(out, &x);
	th_stop_daemon(&d);
	check_open_attached();
	return th_done("attach");
}
