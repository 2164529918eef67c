/* strap_session_reserve / _commit / _abort through a real strapd (the asynchronous copy of a
 * CUDA tensor, here filled by other threads): sequence numbers are taken at reserve in ring
 * order; nothing at or after the oldest uncommitted reservation is published; TOKEN,
 * CHECKPOINT and CLOSE refuse (STRAP_E_BUSY, not fatal) while one is outstanding; an aborted
 * one becomes a DROP "aborted" in its place; a reservation that needs space only commits can
 * free returns STRAP_E_BUSY at once; policy drop drops a reservation that does not fit; a
 * client killed with a reservation outstanding leaves the records before it (the published
 * cursor stops there). Four threads reserving, filling and committing out of order end in a
 * stream that reads back bit for bit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ----- a copy finished on another thread ----- */

typedef struct filler {
	strap_session *s;
	strap_reservation r;
	const void *src;
	int rc;
} filler;

static void *fill_and_commit(void *arg)
{
	filler *f = arg;
	memcpy(f->r.data, f->src, f->r.nbytes);
	f->rc = strap_session_commit(f->s, &f->r);
	return NULL;
}

/* ----- four threads ----- */

enum { THREADS = 4, PER_THREAD = 60, HOLD = 3 };

typedef struct event {
	char name[32];
	size_t n;
	int done;
} event;

typedef struct stress {
	strap_session *s;
	uint64_t base; /* the last seq before the threads start */
	pthread_mutex_t mu;
	event ev[THREADS * PER_THREAD];
	int busy, errors;
} stress;

typedef struct worker {
	stress *st;
	int id;
} worker;

static uint8_t payload_of(uint64_t seq, size_t i)
{
	return (uint8_t)(seq * 131 + i * 7);
}

/* Commit the held reservations, newest first. */
static void settle(worker *w, strap_reservation *held, int *n)
{
	stress *st = w->st;
	for (int k = *n - 1; k >= 0; k--) {
		strap_reservation *r = &held[k];
		for (size_t i = 0; i < r->nbytes; i++)
			((uint8_t *)r->data)[i] = payload_of(r->seq, i);
		int rc = strap_session_commit(st->s, r);
		pthread_mutex_lock(&st->mu);
		if (rc != STRAP_OK)
			st->errors++;
		event *e = &st->ev[r->seq - st->base - 1];
		e->done = 1;
		pthread_mutex_unlock(&st->mu);
	}
	*n = 0;
}

static void *work(void *arg)
{
	worker *w = arg;
	stress *st = w->st;
	strap_reservation held[HOLD];
	int n = 0;
	uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->id + 1);
	for (int i = 0; i < PER_THREAD;) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t nbytes = 1 + x % 6000;
		char name[32];
		snprintf(name, sizeof name, "w%d.%d", w->id, i);
		int rc = strap_session_reserve(st->s, name, STRAP_DTYPE_U8, (int64_t[]){(int64_t)nbytes}, 1, nbytes,
					       NULL, &held[n]);
		if (rc == STRAP_E_BUSY) { /* the room is behind reservations: ours, maybe */
			pthread_mutex_lock(&st->mu);
			st->busy++;
			pthread_mutex_unlock(&st->mu);
			settle(w, held, &n);
			struct timespec ts = {0, 200000};
			nanosleep(&ts, NULL); /* another thread's, maybe: let it commit */
			continue;
		}
		pthread_mutex_lock(&st->mu);
		if (rc != STRAP_OK || held[n].seq <= st->base || held[n].seq > st->base + THREADS * PER_THREAD) {
			st->errors++;
			pthread_mutex_unlock(&st->mu);
			break;
		}
		event *e = &st->ev[held[n].seq - st->base - 1];
		snprintf(e->name, sizeof e->name, "%s", name);
		e->n = nbytes;
		pthread_mutex_unlock(&st->mu);
		i++;
		if (++n == HOLD || x % 3 == 0)
			settle(w, held, &n);
	}
	settle(w, held, &n);
	return NULL;
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600];
	snprintf(out, sizeof out, "%s/reserve.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	p.stall_timeout_s = 60;
	strap_session *s = th_open(&d, &p);
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);

	/* several outstanding: seq numbers in ring order, plain writes among them */
	static float a[4 * 8];
	static uint8_t b[16], c[40];
	th_fill(a, sizeof a, 1);
	th_fill(b, sizeof b, 2);
	th_fill(c, sizeof c, 3);
	strap_reservation ra, rb, rd;
	CHECK_RC(s, strap_session_reserve(s, "a", STRAP_DTYPE_F32, (int64_t[]){4, 8}, 2, sizeof a, NULL, &ra),
		 STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "b", STRAP_DTYPE_U8, (int64_t[]){16}, 1, 16, "{\"k\":1}", &rb), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "c", STRAP_DTYPE_U8, (int64_t[]){40}, 1, c, sizeof c, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "d", STRAP_DTYPE_U8, (int64_t[]){100}, 1, 100, NULL, &rd), STRAP_OK);
	CHECK(ra.seq == 1 && rb.seq == 2 && rd.seq == 4, "seqs %llu %llu %llu", (unsigned long long)ra.seq,
	      (unsigned long long)rb.seq, (unsigned long long)rd.seq);
	void *ring;
	size_t ring_len;
	CHECK_RC(s, strap_session_ring(s, &ring, &ring_len), STRAP_OK);
	CHECK(ring_len == p.ring_size && (uint8_t *)ring + ra.ring_offset == ra.data &&
		      (uint8_t *)ring + rd.ring_offset == rd.data && ra.ring_offset % 64 == 0 && ra.nbytes == sizeof a,
	      "ring %p+%zu, a at %llu -> %p", ring, ring_len, (unsigned long long)ra.ring_offset, ra.data);
	CHECK(strap_session_get_stats(s).reserved == 3, "reserved %llu",
	      (unsigned long long)strap_session_get_stats(s).reserved);

	/* b committed before a: nothing is published while a is outstanding */
	memcpy(rb.data, b, sizeof b);
	CHECK_RC(s, strap_session_commit(s, &rb), STRAP_OK);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK);
	CHECK(strap_session_get_stats(s).publishes == 0, "published past an uncommitted reservation");
	strap_error e;
	CHECK_RC(s, strap_session_token(s, 7, "x", 1, -1), STRAP_E_BUSY);
	CHECK_RC(s, strap_session_checkpoint(s), STRAP_E_BUSY);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_E_BUSY);
	strap_session_last_error(s, &e);
	CHECK(!e.fatal && strstr(e.message, "CLOSE") && strstr(e.message, "seq 1"), "close: %s", e.message);
	CHECK(strcmp(strap_errstr(STRAP_E_BUSY), "unknown error code") != 0, "errstr");

	/* a filled and committed by another thread, as a copy's completion would be */
	filler f = {s, ra, a, -1};
	pthread_t th;
	pthread_create(&th, NULL, fill_and_commit, &f);
	pthread_join(th, NULL);
	CHECK(f.rc == STRAP_OK, "commit from a thread: %d", f.rc);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK);
	CHECK(strap_session_get_stats(s).publishes == 1, "publishes %llu",
	      (unsigned long long)strap_session_get_stats(s).publishes);

	/* d aborted; a reservation no longer outstanding is refused and changes nothing */
	CHECK_RC(s, strap_session_abort(s, &rd), STRAP_OK);
	CHECK_RC(s, strap_session_commit(s, &rd), STRAP_E_INVALID);
	CHECK_RC(s, strap_session_commit(s, &ra), STRAP_E_INVALID);
	CHECK_RC(s, strap_session_abort(s, &rb), STRAP_E_INVALID);
	strap_session_stats st = strap_session_get_stats(s);
	CHECK(st.aborts == 1 && st.reserved == 0 && st.records == 3, "aborts %llu reserved %llu records %llu",
	      (unsigned long long)st.aborts, (unsigned long long)st.reserved, (unsigned long long)st.records);
	CHECK_RC(s, strap_session_token(s, 7, "x", 1, -1), STRAP_OK); /* d's DROP goes first */
	CHECK(strap_session_get_stats(s).drops == 1, "drops %llu",
	      (unsigned long long)strap_session_get_stats(s).drops);
	th_expect_tensor(&x, "a", "float32", (int64_t[]){4, 8}, 2, 0, 0, NULL, a, sizeof a, 1);
	th_expect_tensor(&x, "b", "uint8", (int64_t[]){16}, 1, 0, 0, "{\"k\":1}", b, sizeof b, 1);
	th_expect_tensor(&x, "c", "uint8", (int64_t[]){40}, 1, 0, 0, NULL, c, sizeof c, 1);
	th_expect_drop(&x, "d", 100);
	th_expect_token(&x, 0, 7, "x");

	/* limits: one record only; the table's size */
	CHECK_RC(s, strap_session_reserve(s, "huge", STRAP_DTYPE_U8, (int64_t[]){100 << 10}, 1, 100 << 10, NULL, &rd),
		 STRAP_E_TOO_LARGE);
	CHECK(rd.data == NULL, "a refused reservation has no data");

	/* backpressure: reservations fill the ring; the next one fails at once, not after the
	 * stall timeout; commits let it through */
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	static strap_reservation fillr[8];
	static uint8_t chunk[60 << 10];
	th_fill(chunk, sizeof chunk, 9);
	for (int i = 0; i < 4; i++) {
		char name[16];
		snprintf(name, sizeof name, "fill%d", i);
		CHECK_RC(s,
			 strap_session_reserve(s, name, STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, sizeof chunk,
					       NULL, &fillr[i]),
			 STRAP_OK);
		memcpy(fillr[i].data, chunk, sizeof chunk);
	}
	double t0 = now();
	CHECK_RC(s,
		 strap_session_reserve(s, "fill4", STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, sizeof chunk, NULL,
				       &fillr[4]),
		 STRAP_E_BUSY);
	CHECK(now() - t0 < 5, "a reservation that cannot get space waited %.1fs", now() - t0);
	CHECK_RC(s,
		 strap_session_write(s, "w", STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, chunk, sizeof chunk, NULL),
		 STRAP_E_BUSY);
	strap_session_last_error(s, &e);
	CHECK(!e.fatal && strstr(e.message, "commit or abort"), "busy: %s", e.message);
	for (int i = 0; i < 4; i++) {
		char name[16];
		snprintf(name, sizeof name, "fill%d", i);
		CHECK_RC(s, strap_session_commit(s, &fillr[i]), STRAP_OK);
		th_expect_tensor(&x, name, "uint8", (int64_t[]){sizeof chunk}, 1, 1, 1, NULL, chunk, sizeof chunk, 1);
	}
	CHECK_RC(s,
		 strap_session_reserve(s, "fill4", STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, sizeof chunk, NULL,
				       &fillr[4]),
		 STRAP_OK); /* waits for strapd's RELEASE */
	memcpy(fillr[4].data, chunk, sizeof chunk);
	CHECK_RC(s, strap_session_commit(s, &fillr[4]), STRAP_OK);
	th_expect_tensor(&x, "fill4", "uint8", (int64_t[]){sizeof chunk}, 1, 1, 1, NULL, chunk, sizeof chunk, 1);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK);

	/* four threads, reservations committed out of order, some aborted */
	static stress sx;
	sx.s = s;
	pthread_mutex_init(&sx.mu, NULL);
	CHECK_RC(s, strap_session_set_step(s, 2, 5), STRAP_OK);
	strap_reservation probe;
	CHECK_RC(s, strap_session_reserve(s, "probe", STRAP_DTYPE_U8, (int64_t[]){1}, 1, 1, NULL, &probe), STRAP_OK);
	uint8_t v42 = 42;
	*(uint8_t *)probe.data = v42;
	CHECK_RC(s, strap_session_commit(s, &probe), STRAP_OK);
	th_expect_tensor(&x, "probe", "uint8", (int64_t[]){1}, 1, 2, 5, NULL, &v42, 1, 1);
	sx.base = probe.seq;
	pthread_t ths[THREADS];
	worker ws[THREADS];
	for (int i = 0; i < THREADS; i++) {
		ws[i] = (worker){&sx, i};
		pthread_create(&ths[i], NULL, work, &ws[i]);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(ths[i], NULL);
	CHECK(sx.errors == 0, "%d reserve/commit errors in the threads", sx.errors);
	static uint8_t buf[6000];
	for (int i = 0; i < THREADS * PER_THREAD; i++) {
		event *ev = &sx.ev[i];
		CHECK(ev->done, "seq %llu never settled", (unsigned long long)(sx.base + 1 + (uint64_t)i));
		for (size_t k = 0; k < ev->n; k++)
			buf[k] = payload_of(sx.base + 1 + (uint64_t)i, k);
		th_expect_tensor(&x, ev->name, "uint8", (int64_t[]){(int64_t)ev->n}, 1, 2, 5, NULL, buf, ev->n, 1);
	}
	fprintf(stderr, "threads: %d reservations, %d STRAP_E_BUSY retries\n", THREADS * PER_THREAD, sx.busy);

	/* aborts: only the newest record can be taken out (newest first); its seq goes to a DROP
	 * "aborted" once the reservations before it are committed, and later records go where it was */
	strap_reservation q[4];
	for (int k = 0; k < 4; k++) {
		char name[16];
		snprintf(name, sizeof name, "q%d", k);
		CHECK_RC(s, strap_session_reserve(s, name, STRAP_DTYPE_U8, (int64_t[]){64}, 1, 64, NULL, &q[k]),
			 STRAP_OK);
	}
	CHECK_RC(s, strap_session_abort(s, &q[1]), STRAP_E_BUSY); /* q2, q3 follow it */
	strap_session_last_error(s, &e);
	CHECK(!e.fatal && strstr(e.message, "newest first"), "abort q1: %s", e.message);
	CHECK_RC(s, strap_session_abort(s, &q[3]), STRAP_OK);
	CHECK_RC(s, strap_session_abort(s, &q[2]), STRAP_OK);
	CHECK_RC(s, strap_session_abort(s, &q[1]), STRAP_OK);
	uint64_t aborted = 3;
	CHECK_RC(s, strap_session_write(s, "q4", STRAP_DTYPE_U8, (int64_t[]){40}, 1, c, sizeof c, NULL), STRAP_OK);
	CHECK(strap_session_get_stats(s).drops == 1, "the DROPs wait for q0");
	memset(q[0].data, 5, 64);
	CHECK_RC(s, strap_session_commit(s, &q[0]), STRAP_OK);
	uint8_t fives[64];
	memset(fives, 5, sizeof fives);
	th_expect_tensor(&x, "q0", "uint8", (int64_t[]){64}, 1, 2, 5, NULL, fives, 64, 1);
	th_expect_drop(&x, "q1", 64);
	th_expect_drop(&x, "q2", 64);
	th_expect_drop(&x, "q3", 64);
	th_expect_tensor(&x, "q4", "uint8", (int64_t[]){40}, 1, 2, 5, NULL, c, sizeof c, 1);

	strap_closed closed;
	CHECK_RC(s, strap_session_close(s, &closed), STRAP_OK);
	CHECK(closed.drops == 1 + aborted, "CLOSED drops %llu, want %llu", (unsigned long long)closed.drops,
	      (unsigned long long)(1 + aborted));
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);
	char cmd[2000], txt[4096];
	snprintf(
		cmd, sizeof cmd,
		"'%s' -c 'import sys; from llm_instrumentation import open_stream\n"
		"r = open_stream(sys.argv[1])\n"
		"print(sorted(set(p.meta.get(\"reason\") for p in r.packets() if p.type_name == \"DROP\")))' '%s' 2>&1",
		th_env("STRAP_PYTHON"), out);
	int rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "['aborted']"), "DROP reasons: %s", txt);

	/* policy drop: a reservation that does not fit is dropped when none is outstanding (nothing
	 * is published before the flush, so nothing is released), refused while one is */
	snprintf(out, sizeof out, "%s/drop.strap", d.dir);
	p.output_path = out;
	p.policy = STRAP_POLICY_DROP;
	p.publish_bytes = 1 << 30;
	p.max_reservations = 2;
	s = th_open(&d, &p);
	strap_reservation r3[3];
	CHECK_RC(s, strap_session_reserve(s, "r0", STRAP_DTYPE_U8, (int64_t[]){8}, 1, 8, NULL, &r3[0]), STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "r1", STRAP_DTYPE_U8, (int64_t[]){8}, 1, 8, NULL, &r3[1]), STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "r2", STRAP_DTYPE_U8, (int64_t[]){8}, 1, 8, NULL, &r3[2]), STRAP_E_BUSY);
	strap_session_last_error(s, &e);
	CHECK(strstr(e.message, "max_reservations"), "table full: %s", e.message);
	CHECK_RC(s, strap_session_commit(s, &r3[0]), STRAP_OK);
	int i = 0, got;
	while ((got = strap_session_write(s, "w", STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, chunk, sizeof chunk,
					  NULL)) == STRAP_OK)
		i++;
	CHECK(got == STRAP_E_BUSY && i == 4, "policy drop, r1 outstanding: %d after %d writes", got, i);
	CHECK_RC(s, strap_session_commit(s, &r3[1]), STRAP_OK);
	CHECK_RC(s,
		 strap_session_reserve(s, "r2", STRAP_DTYPE_U8, (int64_t[]){sizeof chunk}, 1, sizeof chunk, NULL,
				       &r3[2]),
		 STRAP_DROPPED);
	CHECK(r3[2].data == NULL && strap_session_get_stats(s).drops == 1, "dropped reservation");
	CHECK_RC(s, strap_session_close(s, &closed), STRAP_OK);
	CHECK(closed.drops == 1 && closed.packets == 7, "drop session: packets %llu drops %llu",
	      (unsigned long long)closed.packets, (unsigned long long)closed.drops);
	strap_session_free(s);

	/* a client killed with a reservation outstanding: the published cursor stops before it,
	 * so its stream keeps what was complete before it and nothing after */
	snprintf(out, sizeof out, "%s/killed.strap", d.dir);
	p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	s = th_open(&d, &p);
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "prefill", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK);
	CHECK_RC(s, strap_session_token(s, 1, "t", 1, -1), STRAP_OK);
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "kept", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "inflight", STRAP_DTYPE_U8, (int64_t[]){8}, 1, 8, NULL, &ra), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "after", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_flush(s), STRAP_OK); /* deferred: the cursor at "inflight" */
	st = strap_session_get_stats(s);
	CHECK(st.publishes == 1, "the pass was published by message (%llu publishes)",
	      (unsigned long long)st.publishes);
	strap_session_free(s);
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys,time; from llm_instrumentation import open_stream\n"
		 "for _ in range(100):\n"
		 "    r = open_stream(sys.argv[1])\n"
		 "    if r.end() is not None: break\n"
		 "    r.close(); time.sleep(0.05)\n"
		 "print([t.name for t in r], r.end().meta[\"status\"])' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "['prefill', 'kept'] aborted"), "killed: %s", txt);

	/* an abort with a record written after it ends the session (a record cannot be taken out of
	 * the middle of the ring); what was complete before it stays */
	snprintf(out, sizeof out, "%s/abort-mid.strap", d.dir);
	p.output_path = out;
	s = th_open(&d, &p);
	CHECK_RC(s, strap_session_write(s, "before", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_reserve(s, "mid", STRAP_DTYPE_U8, (int64_t[]){8}, 1, 8, NULL, &ra), STRAP_OK);
	CHECK_RC(s, strap_session_write(s, "later", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_OK);
	CHECK_RC(s, strap_session_abort(s, &ra), STRAP_E_STATE);
	strap_session_last_error(s, &e);
	CHECK(e.fatal && strstr(e.message, "the session ends"), "abort mid: %s", e.message);
	CHECK_RC(s, strap_session_write(s, "no", STRAP_DTYPE_U8, (int64_t[]){8}, 1, c, 8, NULL), STRAP_E_STATE);
	strap_session_free(s);
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys,time; from llm_instrumentation import open_stream\n"
		 "for _ in range(100):\n"
		 "    r = open_stream(sys.argv[1])\n"
		 "    if r.end() is not None: break\n"
		 "    r.close(); time.sleep(0.05)\n"
		 "print([t.name for t in r], r.end().meta[\"status\"])' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "['before'] aborted"), "abort mid: %s", txt);
	th_stop_daemon(&d);
	return th_done("reserve");
}
