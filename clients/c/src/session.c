/* One capture session once open (docs/PROTOCOL.md 1.4): the records written into the sealed
 * memfd ring, PUBLISH batching, RELEASE and backpressure, DROP, TOKEN, RESOURCES and CLOSE.
 * Opening is open.c, CHECKPOINT checkpoint.c. The per-record path (strap_session_write) computes
 * a header, copies the payload and, once the unpublished bytes reach publish_bytes, sends one
 * PUBLISH: it never allocates. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "session.h"

/* ----- errors ----- */

int ss_fail(strap_session *s, int code, const char *fmt, ...)
{
	s->err.code = code;
	s->err.daemon_code[0] = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err.message, sizeof s->err.message, fmt, ap);
	va_end(ap);
	/* Anything from the connection or the daemon ends the session; a bad argument does not. */
	if (code != STRAP_E_INVALID && code != STRAP_E_TOO_LARGE && code != STRAP_E_BUSY) {
		s->failed = true;
		s->err.fatal = 1;
	} else {
		s->err.fatal = 0;
	}
	return code;
}

int ss_check(strap_session *s)
{
	if (s->failed) /* the message of the failure stays */
		return STRAP_E_STATE;
	if (s->shut) {
		s->err.code = STRAP_E_STATE;
		s->err.fatal = 1;
		s->err.daemon_code[0] = 0;
		snprintf(s->err.message, sizeof s->err.message, "the session is closed (CLOSE was sent)");
		return STRAP_E_STATE;
	}
	return STRAP_OK;
}

/* ----- messages ----- */

int ss_send_buf(strap_session *s, const sw_buf *b, const int *fds, int nfds);

/* A datagram left on a connection the daemon closed: its ERROR is the session's failure. */
static void salvaged(const uint8_t *msg, size_t n, void *arg)
{
	strap_session *s = arg;
	sp_reply r;
	char why[200];
	if (sp_decode_reply(msg, n, &r, why, sizeof why) != STRAP_OK || r.type != SP_ERROR)
		return;
	ss_fail(s, STRAP_E_DAEMON, "strapd error %s: %s", r.u.error.code, r.u.error.message);
	snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "%s", r.u.error.code);
	s->has_fits_ring_size = r.u.error.has_fits_ring_size;
	s->fits_ring_size = r.u.error.fits_ring_size;
	s->salvaged = true;
}

/* The daemon's last ERROR when it closed with one queued (it usually does; common/strap_channel.h). */
static bool salvage(strap_session *s)
{
	s->salvaged = false;
	sch_salvage(s->sock, s->rbuf, SP_MAX_MESSAGE + 1, salvaged, s);
	return s->salvaged;
}

static int dead(strap_session *s, const char *what, int e)
{
	if (salvage(s))
		return s->err.code;
	return ss_fail(s, STRAP_E_CLOSED, "strapd connection %s%s%s", what, e ? ": " : "", e ? strerror(e) : "");
}

int ss_send_buf(strap_session *s, const sw_buf *b, const int *fds, int nfds)
{
	if (b->overflow)
		return ss_fail(s, STRAP_E_TOO_LARGE, "message exceeds %d bytes", SP_MAX_MESSAGE);
	int r = sch_send(s->sock, b->p, b->n, fds, nfds);
	if (r == 0)
		return STRAP_OK;
	if (r == -EPIPE || r == -ECONNRESET)
		return dead(s, "closed by the daemon", -r);
	return dead(s, "failed sending", -r);
}

/* Receive one message: 1 when *r holds one, 0 when none came within timeout_ms, < 0 error. */
static int recv_reply(strap_session *s, int timeout_ms, sp_reply *r)
{
	ssize_t n = sch_recv(s->sock, s->rbuf, SP_MAX_MESSAGE + 1, timeout_ms);
	if (n == -EAGAIN)
		return 0;
	if (n == -ECONNRESET)
		return dead(s, "reset by the daemon", ECONNRESET);
	if (n < 0)
		return dead(s, "failed", (int)-n);
	if (n == 0)
		return dead(s, "closed by the daemon (EOF)", 0);
	if (n > SP_MAX_MESSAGE)
		return ss_fail(s, STRAP_E_PROTOCOL, "message of %zd bytes from the daemon exceeds %d", n,
			       SP_MAX_MESSAGE);
	char why[300];
	if (sp_decode_reply(s->rbuf, (size_t)n, r, why, sizeof why) != STRAP_OK)
		return ss_fail(s, STRAP_E_PROTOCOL, "malformed message from strapd: %s", why);
	return 1;
}

/* recv_reply waiting up to left seconds; for an attached session whose caller may be
 * interrupted (a signal in Python), in waits of at most 50 ms, asking it before each. */
static int recv_wait(strap_session *s, double left, sp_reply *r)
{
	int ms = (int)(left * 1000) + 1;
	if (s->interrupted) {
		if (s->interrupted(s->interrupt_user))
			return ss_fail(s, STRAP_E_SYSTEM, "interrupted while waiting for strapd");
		if (ms > 50)
			ms = 50;
	}
	return recv_reply(s, ms, r);
}

static int daemon_error(strap_session *s, const sp_reply *r)
{
	ss_fail(s, STRAP_E_DAEMON, "strapd error %s: %s", r->u.error.code, r->u.error.message);
	snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "%s", r->u.error.code);
	s->has_fits_ring_size = r->u.error.has_fits_ring_size;
	s->fits_ring_size = r->u.error.fits_ring_size;
	return STRAP_E_DAEMON;
}

/* A message during streaming: RELEASE gives space back; a fatal ERROR ends the session. */
static int handle(strap_session *s, const sp_reply *r)
{
	if (r->type == SP_RELEASE) {
		char why[256];
		if (srb_release(s->rb, r->u.release.tail, why, sizeof why) != 0)
			return ss_fail(s, STRAP_E_PROTOCOL, "%s", why);
		return STRAP_OK;
	}
	if (r->type == SP_ERROR) {
		if (r->u.error.fatal)
			return daemon_error(s, r);
		return STRAP_OK;
	}
	return ss_fail(s, STRAP_E_PROTOCOL, "unexpected %s during a session", sp_type_name(r->type));
}

static int drain(strap_session *s)
{
	for (;;) {
		sp_reply r;
		int got = recv_reply(s, 0, &r);
		if (got <= 0)
			return got;
		int e = handle(s, &r);
		if (e)
			return e;
	}
}

/* Wait up to timeout for a message of type want (RELEASE handled on the way, ERROR raises). */
int ss_expect(strap_session *s, int want, double timeout, sp_reply *r)
{
	double deadline = sc_now() + timeout;
	for (;;) {
		double left = deadline - sc_now();
		if (left <= 0)
			return ss_fail(s, STRAP_E_TIMEOUT,
				       "strapd did not answer with %s within %gs (params.stall_timeout_s)",
				       sp_type_name(want), timeout);
		int got = recv_wait(s, left, r);
		if (got < 0)
			return got;
		if (got == 0)
			continue;
		if (r->type == want)
			return STRAP_OK;
		if (r->type == SP_ERROR)
			return daemon_error(s, r);
		if (r->type == SP_RELEASE) {
			int e = handle(s, r);
			if (e)
				return e;
			continue;
		}
		return ss_fail(s, STRAP_E_PROTOCOL, "expected %s, got %s", sp_type_name(want), sp_type_name(r->type));
	}
}

sw_buf ss_out_buf(strap_session *s)
{
	sw_buf b = {s->sbuf, 0, SP_MAX_MESSAGE, false};
	return b;
}

/* ----- reservations: the publish frontier ----- */

static ss_resv *resv_front(strap_session *s)
{
	return s->resv_n ? &s->resv[s->resv_first] : NULL;
}

static void resv_pop(strap_session *s)
{
	s->resv_first = (s->resv_first + 1) % s->resv_cap;
	s->resv_n--;
}

/* How far the ring holds only complete records: the head, or the start of the oldest
 * reservation not committed, or, for an attached session, the end of the caller's completed
 * copies (block: all of them waited for); *seq the last sequence number below it (a window of
 * PADs only is not checked against it). Committed reservations at the front leave the table. */
static int frontier(strap_session *s, bool block, uint64_t *to, uint64_t *seq)
{
	while (s->resv_n && resv_front(s)->state == RESV_COMMITTED)
		resv_pop(s);
	if (!s->resv_n) {
		*seq = s->last_tensor_seq;
		*to = s->rb->head;
	} else {
		*seq = resv_front(s)->seq - 1;
		*to = resv_front(s)->start;
	}
	if (!s->frontier_fn)
		return STRAP_OK;
	uint64_t h = 0, q = 0;
	int r = s->frontier_fn(s->frontier_user, block, &h, &q);
	if (r < 0)
		return ss_fail(s, STRAP_E_SYSTEM, "the caller's copies into the ring failed");
	if (r == 2) {
		*to = s->published_head; /* none complete: nothing new to name */
	} else if (r == 1 && h < *to) {
		*to = h;
		*seq = q;
	}
	return STRAP_OK;
}

static int publish_to(strap_session *s, uint64_t head, uint64_t seq)
{
	if (head == s->published_head)
		return STRAP_OK;
	int e = drain(s); /* a daemon ERROR surfaces here, once per publish */
	if (e)
		return e;
	/* Every byte of the records is written before the message that publishes them
	 * (PROTOCOL.md 3); sendmsg is a full barrier in practice, this states it in C11. */
	atomic_thread_fence(memory_order_release);
	sw_buf b = ss_out_buf(s);
	sp_enc_publish(&b, head, seq);
	e = ss_send_buf(s, &b, NULL, 0);
	if (e)
		return e;
	s->published_head = head;
	s->publishes++;
	s->deferred = false;
	s->unsent_tokens = 0;
	s->last_message = sc_now();
	return STRAP_OK;
}

/* An aborted reservation the frontier reached: everything before it is published, then a DROP
 * "aborted" takes its sequence number (the stream records the loss, in order). */
static int settle_aborted(strap_session *s, const ss_resv *r)
{
	int e = publish_to(s, r->start, r->seq - 1);
	if (e)
		return e;
	sw_buf b = ss_out_buf(s);
	sp_enc_drop(&b, r->seq, s->resv_names + (size_t)(r - s->resv) * SR_MAX_NAME, r->name_len, r->step, r->forward,
		    r->nbytes, "aborted");
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		return e;
	s->drops++;
	s->drop_bytes += r->nbytes;
	return STRAP_OK;
}

/* One PUBLISH for every record written since the last one, up to the frontier. */
static int publish(strap_session *s, bool block)
{
	uint64_t seq, to;
	int e = frontier(s, block, &to, &seq);
	while (!e && s->resv_n && resv_front(s)->state == RESV_ABORTED) {
		if ((e = settle_aborted(s, resv_front(s))))
			return e;
		resv_pop(s);
		e = frontier(s, block, &to, &seq);
	}
	return e ? e : publish_to(s, to, seq);
}

int ss_publish(strap_session *s)
{
	return publish(s, false);
}

int ss_publish_all(strap_session *s, const char *what)
{
	int e = publish(s, true);
	if (e || !s->resv_n)
		return e;
	uint32_t open = 0;
	for (uint32_t i = 0; i < s->resv_n; i++)
		open += s->resv[(s->resv_first + i) % s->resv_cap].state == RESV_OPEN;
	return ss_fail(s, STRAP_E_BUSY,
		       "%s must follow every record, and %u reservation%s not committed or aborted (the oldest: seq "
		       "%llu): commit or abort first",
		       what, open, open == 1 ? " is" : "s are", (unsigned long long)resv_front(s)->seq);
}

/* The end of a forward pass while generating, to a daemon that takes the published cursor:
 * store the cursor past the pass's records (a client killed before its next TOKEN still has
 * them in its stream: strapd takes them at EOF) and leave naming them to that TOKEN's head, so
 * strapd wakes once per token instead of twice. A second pass in a row without a TOKEN between
 * publishes by message: at most one pass waits. */
static int defer_publish(strap_session *s)
{
	uint64_t seq, to;
	int e = frontier(s, false, &to, &seq);
	if (e)
		return e;
	/* an aborted reservation's DROP goes by message, in order */
	if (s->deferred || (s->resv_n && resv_front(s)->state == RESV_ABORTED))
		return ss_publish(s);
	if (to == s->published_head)
		return STRAP_OK;
	/* Release: every byte below the cursor is written before the daemon can load it (a
	 * reservation's too: its commit came first, under the lock). */
	srb_store_published(s->rb, to);
	s->deferred = true;
	return STRAP_OK;
}

/* Ring tokens: name the records and tokens written so far by one PUBLISH once rt_every tokens
 * wait or rt_seconds passed since the last message; until then they lie below the published
 * cursor only, stored past every complete record (a client killed now still has them written:
 * strapd takes them at EOF). */
static int doorbell(strap_session *s)
{
	if (s->unsent_tokens >= s->rt_every || sc_now() - s->last_message >= s->rt_seconds)
		return ss_publish(s);
	uint64_t seq, to;
	int e = frontier(s, false, &to, &seq);
	if (e)
		return e;
	if (to > s->cursor_at) {
		srb_store_published(s->rb, to);
		s->cursor_at = to;
	}
	return STRAP_OK;
}

static bool fits(const strap_session *s, uint64_t needed)
{
	return srb_fits(s->rb, needed);
}

static uint64_t pad_for(const strap_session *s, uint64_t rec_len)
{
	return srb_pad_for(s->rb, rec_len);
}

static int wait_for(strap_session *s, uint64_t needed)
{
	int e = publish(s, true); /* the daemon releases only what it has seen */
	if (e)
		return e;
	/* strapd can release at most what was published: beyond that only a commit makes room,
	 * and the caller may be the one to make it (the copies it waits for are its own) */
	if (s->resv_n && s->rb->head - s->published_head + needed > s->rb->data_size)
		return ss_fail(s, STRAP_E_BUSY,
			       "the ring is full: %llu bytes needed, and %llu bytes wait behind %u reservation%s not "
			       "committed (the oldest: seq %llu): commit or abort first",
			       (unsigned long long)needed, (unsigned long long)(s->rb->head - s->published_head),
			       s->resv_n, s->resv_n == 1 ? "" : "s", (unsigned long long)resv_front(s)->seq);
	double deadline = sc_now() + s->stall_timeout;
	while (!fits(s, needed)) {
		double left = deadline - sc_now();
		if (left <= 0)
			return ss_fail(s, STRAP_E_TIMEOUT,
				       "strapd released no ring space for %.0fs (need %llu bytes, %llu of %llu in use)",
				       s->stall_timeout, (unsigned long long)needed,
				       (unsigned long long)(s->rb->head - s->rb->tail),
				       (unsigned long long)s->rb->data_size);
		sp_reply r;
		int got = recv_wait(s, left > 1 ? 1 : left, &r);
		if (got < 0)
			return got;
		if (got && (e = handle(s, &r)))
			return e;
	}
	return STRAP_OK;
}

/* The head made ready for a record of rec_len: the PAD of pad bytes that ends the region
 * first (pad 0: none), the pages populated. The space was made free by the caller. */
static void place_at_head(strap_session *s, uint64_t pad, uint64_t rec_len)
{
	srb_place(s->rb, pad, rec_len);
}

static int send_drop(strap_session *s, const char *name, size_t name_len, uint64_t bytes)
{
	/* the records before it come first in sequence order: an outstanding reservation
	 * among them keeps the DROP from being sent now */
	int e = ss_publish_all(s, "a DROP for a tensor that does not fit");
	if (e)
		return e;
	sw_buf b = ss_out_buf(s);
	sp_enc_drop(&b, s->seq + 1, name, name_len, s->step, s->forward, bytes, "ring_full");
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		return e;
	s->seq++;
	s->drops++;
	s->drop_bytes += bytes;
	return STRAP_DROPPED;
}

/* Where a record's payload comes from: a pointer, or the caller's copy function. */
typedef struct src {
	const uint8_t *data;
	strap_copy_fn fn;
	void *ctx;
} src;

static int write_locked(strap_session *s, const char *name, size_t name_len, int dtype, const uint64_t *shape, int ndim,
			const src *from, uint64_t nbytes, const char *meta, size_t meta_len)
{
	uint64_t hdr = sr_header_area(ndim, name_len, meta_len);
	uint64_t cap = nbytes, nparts = 1;
	if (sp_align64(hdr + nbytes) > s->max_record) {
		if (s->max_record <= hdr + 64)
			return ss_fail(s, STRAP_E_TOO_LARGE,
				       "ring too small: a record header of %llu bytes for %s leaves no payload room in "
				       "%llu-byte records",
				       (unsigned long long)hdr, name, (unsigned long long)s->max_record);
		cap = (s->max_record - hdr) / 64 * 64;
		nparts = (nbytes + cap - 1) / cap;
	}
	bool part = nparts > 1;
	uint64_t first_len = sp_align64(hdr + (cap < nbytes ? cap : nbytes));
	uint64_t needed = pad_for(s, first_len) + first_len;
	int e;
	if (!fits(s, needed) && (e = drain(s)))
		return e; /* RELEASEs received since the last publish free space */
	if (!fits(s, needed) && s->policy == STRAP_POLICY_DROP)
		return send_drop(s, name, name_len, nbytes);
	for (uint64_t i = 0, off = 0; i < nparts; i++, off += cap) {
		uint64_t plen = nbytes - off < cap ? nbytes - off : cap;
		uint64_t rec_len = sp_align64(hdr + plen);
		uint64_t pad = pad_for(s, rec_len);
		if (!fits(s, pad + rec_len)) {
			if ((e = wait_for(s, pad + rec_len))) {
				if (e == STRAP_E_BUSY && off) { /* a cut tensor in the stream otherwise */
					ss_fail(s, STRAP_E_BUSY,
						"%s: ring space for the PART record at byte %llu is held by "
						"uncommitted "
						"reservations; the session ends",
						name, (unsigned long long)off);
					s->failed = true;
					s->err.fatal = 1;
				}
				return e;
			}
			pad = pad_for(s, rec_len);
		}
		place_at_head(s, pad, rec_len);
		uint8_t *dst = s->rb->base + SR_HEADER_SIZE + s->rb->head % s->rb->data_size;
		uint64_t seq = s->seq + 1;
		sr_encode_record_header(dst, dtype, shape, ndim, seq, rec_len, s->step, s->forward, plen, name,
					name_len, meta, meta_len, part ? off : 0, part ? nbytes : plen, part);
		if (plen && from->fn) {
			int rc = from->fn(from->ctx, dst + hdr, (size_t)off, (size_t)plen);
			if (rc != 0) {
				/* Nothing of this record is counted. Before the first part nothing was
				 * written at all; after it the stream would hold a cut tensor, so the
				 * session ends (readers count the tensor incomplete). */
				if (off == 0)
					return ss_fail(s, STRAP_E_INVALID,
						       "%s: the copy function failed (%d); nothing written", name, rc);
				return ss_fail(
					s, STRAP_E_SYSTEM,
					"%s: the copy function failed (%d) at byte %llu of %llu; the session ends",
					name, rc, (unsigned long long)off, (unsigned long long)nbytes);
			}
		} else if (plen) {
			memcpy(dst + hdr, from->data + off, plen);
		}
		s->seq = seq;
		s->last_tensor_seq = seq;
		s->rb->head += rec_len;
		s->records++;
		s->bytes_in += plen;
		if (s->rb->head - s->published_head >= s->publish_bytes && (e = ss_publish(s)))
			return e;
	}
	return STRAP_OK;
}

/* Checks shared by both write entry points; the lock is held. */
static int check_record(strap_session *s, const char *name, size_t *name_len, size_t meta_len)
{
	if (!name || !(*name_len = strlen(name)) || *name_len > SR_MAX_NAME)
		return ss_fail(s, STRAP_E_INVALID, "tensor name must be 1..%d bytes", SR_MAX_NAME);
	if (!sp_utf8_valid(name, *name_len))
		return ss_fail(s, STRAP_E_INVALID, "tensor name is not valid UTF-8");
	if (meta_len > SR_MAX_META)
		return ss_fail(s, STRAP_E_TOO_LARGE, "record meta of %zu bytes exceeds %d", meta_len, SR_MAX_META);
	return STRAP_OK;
}

/* A tensor's description checked (the lock is held): name and meta lengths, the shape as u64. */
static int check_tensor(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, size_t nbytes,
			const char *meta_json, size_t *name_len, size_t *meta_len, uint64_t *shp)
{
	int e = ss_check(s);
	if (e)
		return e;
	*meta_len = meta_json ? strlen(meta_json) : 0;
	if ((e = check_record(s, name, name_len, *meta_len)))
		return e;
	size_t esize = strap_dtype_size(dtype);
	if (!esize)
		return ss_fail(s, STRAP_E_INVALID, "%s: unknown dtype %d", name, dtype);
	if (ndim < 0 || ndim > SR_MAX_NDIM || (ndim && !shape))
		return ss_fail(s, STRAP_E_INVALID, "%s: ndim %d (allowed 0..%d)", name, ndim, SR_MAX_NDIM);
	uint64_t count = 1;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || (shape[i] && count > UINT64_MAX / (uint64_t)shape[i]))
			return ss_fail(s, STRAP_E_INVALID, "%s: bad shape dimension %d", name, i);
		shp[i] = (uint64_t)shape[i];
		count *= shp[i];
	}
	if (count > UINT64_MAX / esize || count * esize != nbytes)
		return ss_fail(s, STRAP_E_INVALID, "%s: %zu bytes given, shape and dtype make %llu", name, nbytes,
			       (unsigned long long)(count * esize));
	if (*meta_len) {
		char why[128];
		/* an object, or the daemon ends the session with bad_record */
		if (!sj_validate(meta_json, *meta_len, why, sizeof why) || meta_json[0] != '{')
			return ss_fail(s, STRAP_E_INVALID, "%s: meta is not a JSON object", name);
	}
	return STRAP_OK;
}

/* pass: the record's step and forward pass (an attached session's caller's), NULL: the session's */
static int write_common(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, const src *from,
			size_t nbytes, const char *meta_json, const uint64_t *pass)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	if (pass) {
		s->step = pass[0];
		s->forward = pass[1];
	}
	size_t name_len = 0, meta_len = 0;
	uint64_t shp[SR_MAX_NDIM];
	int e = check_tensor(s, name, dtype, shape, ndim, nbytes, meta_json, &name_len, &meta_len, shp);
	if (!e && nbytes && !from->data && !from->fn)
		e = ss_fail(s, STRAP_E_INVALID, "%s: %zu bytes and no data", name, nbytes);
	if (!e)
		e = write_locked(s, name, name_len, dtype, shp, ndim, from, nbytes, meta_json, meta_len);
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* ----- reserve / commit / abort ----- */

static int reserve_locked(strap_session *s, const char *name, size_t name_len, int dtype, const uint64_t *shape,
			  int ndim, uint64_t nbytes, const char *meta, size_t meta_len, strap_reservation *out)
{
	uint64_t hdr = sr_header_area(ndim, name_len, meta_len);
	uint64_t rec_len = sp_align64(hdr + nbytes);
	if (rec_len > s->max_record)
		return ss_fail(s, STRAP_E_TOO_LARGE,
			       "%s: a reservation is one record, and %llu bytes with its header exceed the part size "
			       "%llu (params.part_size, at most half the data region)",
			       name, (unsigned long long)rec_len, (unsigned long long)s->max_record);
	if (s->resv_n == s->resv_cap)
		return ss_fail(s, STRAP_E_BUSY,
			       "%s: %u reservations are outstanding (params.max_reservations): commit or abort one "
			       "first",
			       name, s->resv_cap);
	uint64_t pad = pad_for(s, rec_len);
	int e;
	if (!fits(s, pad + rec_len) && (e = drain(s)))
		return e;
	if (!fits(s, pad + rec_len)) {
		if (s->policy == STRAP_POLICY_DROP)
			return send_drop(s, name, name_len, nbytes);
		if ((e = wait_for(s, pad + rec_len)))
			return e;
		pad = pad_for(s, rec_len);
	}
	place_at_head(s, pad, rec_len);
	uint64_t at = SR_HEADER_SIZE + s->rb->head % s->rb->data_size, seq = s->seq + 1;
	sr_encode_record_header(s->rb->base + at, dtype, shape, ndim, seq, rec_len, s->step, s->forward, nbytes, name,
				name_len, meta, meta_len, 0, nbytes, 0);
	uint32_t slot = (s->resv_first + s->resv_n) % s->resv_cap;
	s->resv[slot] =
		(ss_resv){.start = s->rb->head, .len = rec_len, .seq = seq, .nbytes = nbytes, .state = RESV_OPEN};
	s->resv_n++;
	out->data = s->rb->base + at + hdr;
	out->nbytes = (size_t)nbytes;
	out->ring_offset = at + hdr;
	out->seq = seq;
	out->slot = slot;
	s->seq = seq;
	s->last_tensor_seq = seq;
	s->rb->head += rec_len;
	return STRAP_OK;
}

int strap_session_reserve(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, size_t nbytes,
			  const char *meta_json, strap_reservation *out)
{
	if (!s || !out)
		return STRAP_E_INVALID;
	memset(out, 0, sizeof *out);
	pthread_mutex_lock(&s->mu);
	size_t name_len = 0, meta_len = 0;
	uint64_t shp[SR_MAX_NDIM];
	int e = check_tensor(s, name, dtype, shape, ndim, nbytes, meta_json, &name_len, &meta_len, shp);
	if (!e)
		e = reserve_locked(s, name, name_len, dtype, shp, ndim, nbytes, meta_json, meta_len, out);
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* The table entry of an outstanding reservation, or NULL (STRAP_E_INVALID recorded). */
static ss_resv *resv_find(strap_session *s, const strap_reservation *r, const char *what)
{
	if (r && r->slot < s->resv_cap && (r->slot + s->resv_cap - s->resv_first) % s->resv_cap < s->resv_n) {
		ss_resv *v = &s->resv[r->slot];
		if (v->seq == r->seq && v->state == RESV_OPEN)
			return v;
	}
	ss_fail(s, STRAP_E_INVALID,
		"%s: seq %llu is not an outstanding reservation of this session (committed or aborted already?)", what,
		r ? (unsigned long long)r->seq : 0ULL);
	return NULL;
}

int strap_session_commit(strap_session *s, const strap_reservation *r)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	ss_resv *v = e ? NULL : resv_find(s, r, "commit");
	if (!e && !v)
		e = STRAP_E_INVALID;
	if (v) {
		v->state = RESV_COMMITTED;
		s->records++;
		s->bytes_in += v->nbytes;
		uint64_t seq, to;
		e = frontier(s, false, &to, &seq);
		if (!e && to - s->published_head >= s->publish_bytes)
			e = ss_publish(s);
	}
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* Whether only outstanding reservations (and aborted ones, which hold no bytes) follow entry i
 * in the ring: aborting them first, newest first, makes i the newest record. */
static bool only_reservations_after(const strap_session *s, uint32_t i)
{
	const ss_resv *v = &s->resv[(s->resv_first + i) % s->resv_cap];
	uint64_t end = v->start + v->len;
	for (uint32_t k = i + 1; k < s->resv_n; k++) {
		v = &s->resv[(s->resv_first + k) % s->resv_cap];
		uint64_t off = end % s->rb->data_size; /* a PAD may lie before a record, to the region's end */
		if (v->state == RESV_COMMITTED ||
		    (v->start != end && (v->state == RESV_ABORTED || !off || v->start != end + s->rb->data_size - off)))
			return false;
		end = v->start + v->len;
	}
	return end == s->rb->head;
}

int strap_session_abort(strap_session *s, const strap_reservation *r)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	ss_resv *v = e ? NULL : resv_find(s, r, "abort");
	if (!e && !v)
		e = STRAP_E_INVALID;
	if (!v)
		goto out;
	uint32_t i = (r->slot + s->resv_cap - s->resv_first) % s->resv_cap;
	if (v->start + v->len != s->rb->head) {
		/* A record cannot be taken out of the middle of the ring: it would have to become a PAD,
		 * and a PAD only ever ends the region (PROTOCOL.md 2). */
		if (only_reservations_after(s, i)) {
			e = ss_fail(
				s, STRAP_E_BUSY,
				"abort seq %llu: newer reservations follow it in the ring: abort them first (newest "
				"first)",
				(unsigned long long)v->seq);
			goto out;
		}
		uint64_t seq = v->seq;
		e = ss_publish(s); /* what is complete before it stays in the stream */
		if (!e)
			e = ss_fail(
				s, STRAP_E_STATE,
				"abort seq %llu: records written after it follow it in the ring, and a record cannot "
				"be taken out of the middle of the ring; the session ends (the stream keeps the "
				"records before the oldest outstanding reservation)",
				(unsigned long long)seq);
		goto out;
	}
	/* The newest record: its bytes go back to the ring and its sequence number, kept, goes to
	 * a DROP "aborted" once every record before it is published (ss_publish). */
	uint8_t *rec = s->rb->base + SR_HEADER_SIZE + v->start % s->rb->data_size;
	v->name_len = (uint32_t)rec[56] | (uint32_t)rec[57] << 8;
	memcpy(s->resv_names + (size_t)r->slot * SR_MAX_NAME, rec + SR_RECORD_FIXED + 8 * (size_t)rec[7], v->name_len);
	v->step = sr_get_le64(rec + 24);
	v->forward = sr_get_le64(rec + 32);
	s->rb->head = v->start;
	v->len = 0;
	v->state = RESV_ABORTED;
	for (uint32_t k = i + 1; k < s->resv_n; k++) /* aborted after it: they held no bytes */
		s->resv[(s->resv_first + k) % s->resv_cap].start = v->start;
	s->aborts++;
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap_session_ring(const strap_session *s, void **addr, size_t *size)
{
	if (!s || !addr || !size)
		return STRAP_E_INVALID;
	*addr = s->rb->base; /* set once by open, unmapped by strap_session_free */
	*size = (size_t)s->rb->ring_size;
	return STRAP_OK;
}

int strap_session_write(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, const void *data,
			size_t nbytes, const char *meta_json)
{
	src from = {data, NULL, NULL};
	return write_common(s, name, dtype, shape, ndim, &from, nbytes, meta_json, NULL);
}

int strap_session_write_with(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
			     size_t nbytes, const char *meta_json, strap_copy_fn fn, void *ctx)
{
	if (!fn)
		return strap_session_write(s, name, dtype, shape, ndim, NULL, nbytes, meta_json);
	src from = {NULL, fn, ctx};
	return write_common(s, name, dtype, shape, ndim, &from, nbytes, meta_json, NULL);
}

/* A ggml tensor as strap writes it (STREAM_FORMAT.md 4.1): dtype, C-order shape and, for a
 * quantized type, the raw-block meta (into meta, at least 256 bytes). */
static int ggml_layout(strap_session *s, const char *name, int ggml_type, const int64_t *ne, int n_dims, int *dtype,
		       int64_t *shape, char *meta, size_t metacap)
{
	int dt = sr_ggml_dtype(ggml_type);
	if (n_dims < 1 || n_dims > 4 || !ne || dt < 0) {
		pthread_mutex_lock(&s->mu);
		int e = dt < 0 ? ss_fail(s, STRAP_E_INVALID, "%s: ggml type %d is not known to libstrap",
					 name ? name : "?", ggml_type)
			       : ss_fail(s, STRAP_E_INVALID, "%s: ggml n_dims %d (allowed 1..4)", name ? name : "?",
					 n_dims);
		pthread_mutex_unlock(&s->mu);
		return e;
	}
	for (int i = 0; i < n_dims; i++)
		shape[i] = ne[n_dims - 1 - i];
	meta[0] = 0;
	*dtype = dt;
	if (dt > 0)
		return STRAP_OK;
	/* Quantized: raw blocks, one row of ne[0] elements = row_size bytes. */
	size_t row = strap_ggml_row_size(ggml_type, ne[0]);
	if (!row) {
		pthread_mutex_lock(&s->mu);
		int e = ss_fail(s, STRAP_E_INVALID, "%s: ne[0] = %lld is not a whole number of %s blocks",
				name ? name : "?", (long long)ne[0], strap_ggml_type_name(ggml_type));
		pthread_mutex_unlock(&s->mu);
		return e;
	}
	/* built in the caller's (stack) buffer: another thread's ggml write cannot touch it */
	sw_buf m = {meta, 0, metacap - 1, false};
	sw_lit(&m, "{\"ggml_type\":\"");
	sw_lit(&m, strap_ggml_type_name(ggml_type));
	sw_lit(&m, "\",\"ggml_ne\":[");
	for (int i = 0; i < n_dims; i++) {
		if (i)
			sw_raw(&m, ",", 1);
		sw_i64(&m, ne[i]);
	}
	sw_lit(&m, "]}");
	meta[m.n] = 0;
	shape[n_dims - 1] = (int64_t)row;
	*dtype = STRAP_DTYPE_U8;
	return STRAP_OK;
}

int strap_session_write_ggml(strap_session *s, const char *name, int ggml_type, const int64_t *ne, int n_dims,
			     const void *data, size_t nbytes)
{
	if (!s)
		return STRAP_E_INVALID;
	int64_t shape[4];
	char meta[256];
	int dt, e = ggml_layout(s, name, ggml_type, ne, n_dims, &dt, shape, meta, sizeof meta);
	if (e)
		return e;
	src from = {data, NULL, NULL};
	return write_common(s, name, dt, shape, n_dims, &from, nbytes, meta[0] ? meta : NULL, NULL);
}

int strap_session_write_ggml_with(strap_session *s, const char *name, int ggml_type, const int64_t *ne, int n_dims,
				  size_t nbytes, strap_copy_fn fn, void *ctx)
{
	if (!s)
		return STRAP_E_INVALID;
	int64_t shape[4];
	char meta[256];
	int dt, e = ggml_layout(s, name, ggml_type, ne, n_dims, &dt, shape, meta, sizeof meta);
	if (e)
		return e;
	src from = {NULL, fn, ctx};
	return write_common(s, name, dt, shape, n_dims, &from, nbytes, meta[0] ? meta : NULL, NULL);
}

int strap_session_flush(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	/* Before the first token (prefill, a capture without tokens) each pass is published at
	 * once; while generating, its records wait below the cursor for the next TOKEN message, or
	 * with ring tokens for the PUBLISH that names several tokens' passes. */
	if (!e && s->ring_tokens && s->tokens)
		e = doorbell(s);
	else if (!e && s->cursor && s->tokens)
		e = defer_publish(s);
	else if (!e)
		e = ss_publish(s);
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap_session_begin_forward(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	s->step = s->tokens;
	s->forward = s->next_forward++;
	pthread_mutex_unlock(&s->mu);
	return STRAP_OK;
}

int strap_session_set_step(strap_session *s, uint64_t step, uint64_t forward)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	s->step = step;
	s->forward = forward;
	if (forward + 1 > s->next_forward)
		s->next_forward = forward + 1;
	pthread_mutex_unlock(&s->mu);
	return STRAP_OK;
}

/* One token (the lock is held): a TOKEN record at the head where the session keeps ring tokens
 * and it fits, else a TOKEN message naming the records before it. */
/* One TOKEN record at the head (the lock is held); where it does not fit, RELEASEs received since
 * the last publish may free the space. *put false: no room now, nothing written. */
static int put_ring_token(strap_session *s, uint64_t index, int64_t token_id, int64_t position, const char *text,
			  size_t text_len, bool *put)
{
	uint64_t seq = s->seq + 1;
	int e = STRAP_OK;
	*put = srb_put_token(s->rb, seq, index, token_id, position, text, text_len);
	if (!*put && !(e = drain(s)))
		*put = srb_put_token(s->rb, seq, index, token_id, position, text, text_len);
	if (e || !*put)
		return e;
	/* the last record of the window: a PUBLISH ending here names its seq */
	s->seq = s->last_tensor_seq = seq;
	s->tokens++;
	s->token_records++;
	s->unsent_tokens++;
	return STRAP_OK;
}

static int token_locked(strap_session *s, uint64_t index, int64_t token_id, const char *text, size_t text_len,
			int64_t position, uint64_t *seq_out)
{
	int e = ss_check(s);
	if (e)
		return e;
	if (text_len && !text)
		return ss_fail(s, STRAP_E_INVALID, "token text is NULL with length %zu", text_len);
	if (!sp_utf8_valid(text, text_len)) /* strapd refuses it (bad_message) and the session would end */
		return ss_fail(s, STRAP_E_INVALID, "token %llu text is not valid UTF-8", (unsigned long long)index);
	if (s->ring_tokens && position >= 0 && text_len <= SR_MAX_TOKEN_TEXT && !s->resv_n) {
		/* a TOKEN record at the head, else a message goes instead */
		bool put;
		if ((e = put_ring_token(s, index, token_id, position, text, text_len, &put)))
			return e;
		if (put) {
			*seq_out = s->seq;
			return doorbell(s);
		}
	}
	if ((e = drain(s)))
		return e;
	uint64_t fseq, to;
	if ((e = frontier(s, true, &to, &fseq))) /* committed reservations leave the table */
		return e;
	if (s->resv_n && (e = ss_publish_all(s, "TOKEN")))
		return e;
	/* With the cursor, one message: the records before the token (their last one's seq is
	 * the token's - 1), then the token. */
	int has_head = s->cursor && to != s->published_head;
	if (!s->cursor && (e = publish(s, true)))
		return e;
	if (has_head)
		atomic_thread_fence(memory_order_release); /* as before a PUBLISH (PROTOCOL.md 3) */
	sw_buf b = ss_out_buf(s);
	sp_enc_token(&b, s->seq + 1, index, token_id, text, text_len, position >= 0, position, has_head, to);
	if (b.overflow)
		return ss_fail(s, STRAP_E_TOO_LARGE, "token %llu text of %zu bytes does not fit one message",
			       (unsigned long long)index, text_len);
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		return e;
	if (has_head) {
		s->published_head = to;
		s->token_heads++;
	}
	s->token_messages++;
	s->deferred = false;
	s->unsent_tokens = 0;
	s->last_message = sc_now();
	s->seq++;
	s->tokens++;
	*seq_out = s->seq;
	return STRAP_OK;
}

int strap_session_token(strap_session *s, int64_t token_id, const char *text, size_t text_len, int64_t position)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	uint64_t seq;
	int e = token_locked(s, s->tokens, token_id, text, text_len, position, &seq);
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* ----- resources, close ----- */

int strap_session_resources(strap_session *s, const char *const *events, const size_t *lens, size_t n)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	if (e)
		goto out;
	if (s->res_fd < 0) {
		e = ss_fail(s, STRAP_E_INVALID, "resource events need a session opened with params.resources");
		goto out;
	}
	if (n && (!events || !lens)) {
		e = ss_fail(s, STRAP_E_INVALID, "events or lens is NULL");
		goto out;
	}
	for (size_t next = 0; next < n;) {
		sw_buf b = ss_out_buf(s);
		char why[200];
		e = sp_pack_resources(&b, events, lens, n, &next, why, sizeof why);
		if (e) {
			ss_fail(s, e, "%s", why);
			goto out;
		}
		if ((e = ss_send_buf(s, &b, NULL, 0)))
			goto out;
	}
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* CLOSE (the lock is held), with descriptors: the session takes no more records. */
static int close_send(strap_session *s, const int *fds, int nfds)
{
	int e = ss_check(s);
	if (e || (e = ss_publish_all(s, "CLOSE")))
		return e;
	sw_buf b = ss_out_buf(s);
	sp_enc_close(&b, s->seq, s->rb->head, s->drops);
	if ((e = ss_send_buf(s, &b, fds, nfds)))
		return e;
	/* CLOSE counted every record up to here: nothing more may go into the ring. */
	s->shut = true;
	return STRAP_OK;
}

/* CLOSED (the lock is held) after close_send. */
static int close_wait(strap_session *s, double timeout, strap_closed *out, char *upload, size_t upload_cap)
{
	if (s->failed)
		return STRAP_E_STATE;
	sp_reply r;
	int e = ss_expect(s, SP_CLOSED, timeout, &r);
	if (e)
		return e;
	s->closed = true;
	if (out) {
		out->packets = r.u.closed.packets;
		out->drops = r.u.closed.drops;
		out->bytes_in = r.u.closed.bytes_in;
		out->bytes_out = r.u.closed.bytes_out;
		out->file_bytes = r.u.closed.file_bytes;
	}
	if (upload && upload_cap)
		snprintf(upload, upload_cap, "%s", r.u.closed.upload);
	return STRAP_OK;
}

int strap_session_close(strap_session *s, strap_closed *out)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = close_send(s, NULL, 0);
	if (!e)
		e = close_wait(s, s->stall_timeout, out, NULL, 0);
	/* a clean finish: the checkpoint would only describe a prefix of a complete stream */
	if (!e && unlink(s->ckpt_path) == 0)
		ss_fsync_dir(s->ckpt_path);
	pthread_mutex_unlock(&s->mu);
	return e;
}

strap_session_stats strap_session_get_stats(strap_session *s)
{
	strap_session_stats st;
	memset(&st, 0, sizeof st);
	if (!s)
		return st;
	pthread_mutex_lock(&s->mu);
	st.records = s->records;
	st.tokens = s->tokens;
	st.drops = s->drops;
	st.drop_bytes = s->drop_bytes;
	st.bytes_in = s->bytes_in;
	st.publishes = s->publishes;
	st.checkpoints = s->checkpoints;
	st.session_id = s->session_id;
	st.ring_size = s->rb->ring_size;
	for (uint32_t i = 0; i < s->resv_n; i++)
		st.reserved += s->resv[(s->resv_first + i) % s->resv_cap].state == RESV_OPEN;
	st.aborts = s->aborts;
	st.token_records = s->token_records;
	pthread_mutex_unlock(&s->mu);
	return st;
}

void strap_session_last_error(strap_session *s, strap_error *out)
{
	if (!out)
		return;
	if (!s) {
		memset(out, 0, sizeof *out);
		return;
	}
	pthread_mutex_lock(&s->mu);
	*out = s->err;
	pthread_mutex_unlock(&s->mu);
}

strap_resume_point strap_session_resume_point(const strap_session *s)
{
	strap_resume_point p;
	memset(&p, 0, sizeof p);
	return s ? s->resume : p;
}

const char *strap_session_upload(const strap_session *s)
{
	return s ? s->upload : NULL; /* set once by open */
}

const char *strap_session_output_path(const strap_session *s)
{
	return s ? s->output_path : NULL; /* set once by open, freed by strap_session_free */
}

void strap_session_free(strap_session *s)
{
	if (!s)
		return;
	sl_unlock(s);
	if (s->sock >= 0 && !s->borrowed)
		close(s->sock);
	if (!s->borrowed)
		srb_destroy(s->rb);
	int fds[] = {s->out_fd, s->trace_fd, s->res_fd};
	for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
	}
	free(s->output_path);
	free(s->ckpt_path);
	free(s->fingerprint);
	free(s->upload);
	free(s->sbuf);
	free(s->rbuf);
	free(s->resv);
	free(s->resv_names);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* ----- attached sessions (attach.h): the Python client's ----- */

int strap__session_sock(const strap_session *s)
{
	return s->sock; /* set once, at open or attach */
}

int strap__session_claim(strap_session *s, uint64_t rec_len, int mode, const char *name, size_t name_len,
			 uint64_t nbytes, uint64_t step, uint64_t forward, uint64_t *seq)
{
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	if (e)
		goto out;
	uint64_t pad = pad_for(s, rec_len);
	if (!fits(s, pad + rec_len)) {
		if ((e = drain(s))) /* RELEASEs received since the last publish free space */
			goto out;
		pad = pad_for(s, rec_len);
	}
	if (!fits(s, pad + rec_len)) {
		if (mode == STRAP__CLAIM_NOW) {
			e = STRAP__NO_ROOM;
			goto out;
		}
		if (mode == STRAP__CLAIM_POLICY && s->policy == STRAP_POLICY_DROP) {
			s->step = step;
			s->forward = forward;
			e = send_drop(s, name, name_len, nbytes);
			goto out;
		}
		if ((e = wait_for(s, pad + rec_len)))
			goto out;
		pad = pad_for(s, rec_len);
	}
	place_at_head(s, pad, rec_len);
	*seq = s->seq + 1;
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_write(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
			 const void *data, strap_copy_fn fn, void *ctx, size_t nbytes, const char *meta_json,
			 uint64_t step, uint64_t forward)
{
	src from = {data, fn, ctx};
	uint64_t pass[2] = {step, forward};
	return write_common(s, name, dtype, shape, ndim, &from, nbytes, meta_json, pass);
}

int strap__session_advance(strap_session *s, uint64_t rec_len, uint64_t payload_len, bool publish_due)
{
	pthread_mutex_lock(&s->mu);
	s->seq++;
	s->last_tensor_seq = s->seq;
	s->rb->head += rec_len;
	s->records++;
	s->bytes_in += payload_len;
	int e = STRAP_OK;
	if (publish_due && s->rb->head - s->published_head >= s->publish_bytes)
		e = ss_publish(s);
	pthread_mutex_unlock(&s->mu);
	return e;
}

bool strap__session_ready(strap_session *s, uint64_t rec_len)
{
	return !s->shut && !s->failed && srb_ready(s->rb, rec_len);
}

uint64_t strap__session_next_seq(const strap_session *s)
{
	return s->seq + 1;
}

int strap__session_publish(strap_session *s, bool block, bool due_only)
{
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	if (!e && (!due_only || s->rb->head - s->published_head >= s->publish_bytes))
		e = publish(s, block);
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_drain(strap_session *s)
{
	pthread_mutex_lock(&s->mu);
	int e = s->failed ? STRAP_E_STATE : drain(s);
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_token_at(strap_session *s, uint64_t index, int64_t token_id, const char *text, size_t text_len,
			    int64_t position, uint64_t *seq)
{
	pthread_mutex_lock(&s->mu);
	int e = token_locked(s, index, token_id, text, text_len, position, seq);
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_tokens_to_ring(strap_session *s, const int64_t *positions, const int64_t *ids, size_t n,
				  size_t *done)
{
	*done = 0;
	pthread_mutex_lock(&s->mu);
	int e = STRAP_OK;
	if (!s->ring_tokens || s->shut || s->failed || s->resv_n)
		goto out;
	for (size_t i = 0; i < n; i++) {
		bool put;
		if ((e = put_ring_token(s, s->tokens, ids[i], positions[i], NULL, 0, &put)) || !put)
			break;
		(*done)++;
	}
	if (!e && *done)
		e = doorbell(s);
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_close_send(strap_session *s, const int *fds, int nfds)
{
	pthread_mutex_lock(&s->mu);
	int e = close_send(s, fds, nfds);
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_close_wait(strap_session *s, double timeout, strap_closed *out, char *upload, size_t upload_cap)
{
	pthread_mutex_lock(&s->mu);
	int e = close_wait(s, timeout > 0 ? timeout : (s->stall_timeout > 60 ? s->stall_timeout : 60), out, upload,
			   upload_cap);
	pthread_mutex_unlock(&s->mu);
	return e;
}

void strap__session_shut(strap_session *s)
{
	pthread_mutex_lock(&s->mu);
	s->shut = true;
	pthread_mutex_unlock(&s->mu);
}

void strap__session_state(strap_session *s, strap__state *out)
{
	pthread_mutex_lock(&s->mu);
	*out = (strap__state){
		.seq = s->seq,
		.last_tensor_seq = s->last_tensor_seq,
		.tokens = s->tokens,
		.records = s->records,
		.bytes_in = s->bytes_in,
		.drops = s->drops,
		.drop_bytes = s->drop_bytes,
		.published_head = s->published_head,
		.unsent_tokens = s->unsent_tokens,
		.cursor_at = s->cursor_at,
		.token_records = s->token_records,
		.publishes = s->publishes,
		.token_messages = s->token_messages,
		.token_heads = s->token_heads,
		.cursor = s->cursor,
		.ring_tokens = s->ring_tokens,
		.deferred = s->deferred,
		.shut = s->shut,
		.failed = s->failed,
	};
	pthread_mutex_unlock(&s->mu);
}

void strap__session_set_mode(strap_session *s, int cursor, int ring_tokens, int64_t seq)
{
	pthread_mutex_lock(&s->mu);
	if (cursor >= 0)
		s->cursor = cursor != 0;
	if (ring_tokens >= 0)
		s->ring_tokens = ring_tokens != 0 && s->cursor;
	if (seq >= 0)
		s->seq = s->last_tensor_seq = (uint64_t)seq;
	pthread_mutex_unlock(&s->mu);
}

void strap__session_set_ring_tokens(strap_session *s, uint32_t every, double seconds)
{
	pthread_mutex_lock(&s->mu);
	s->rt_every = every;
	s->rt_seconds = seconds;
	if (every <= 1)
		s->ring_tokens = false;
	pthread_mutex_unlock(&s->mu);
}
