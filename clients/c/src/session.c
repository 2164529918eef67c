/* One capture session (docs/PROTOCOL.md 1.3-1.4): the sealed memfd ring, the records written
 * into it, PUBLISH batching, RELEASE and backpressure, DROP, TOKEN, CHECKPOINT (and the
 * checkpoint file of docs/CHECKPOINTS.md 3), RESOURCES and CLOSE. The per-record path
 * (strap_session_write) computes a header, copies the payload and, once the unpublished bytes
 * reach publish_bytes, sends one PUBLISH: it never allocates. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef F_SEAL_SEAL
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_ADD_SEALS 1033
#endif

enum {
	POPULATE_CHUNK = 4 << 20,
	DEFAULT_MAX_RING = 1 << 30,
	MIN_RING = 4096 + 64 * 1024,
	LOCK_WAIT_S = 30,
};

struct strap_session {
	pthread_mutex_t mu;
	int sock;
	int ring_fd, out_fd, trace_fd, res_fd;
	uint8_t *ring;
	uint64_t ring_size, data_size;
	uint64_t head, tail, published_head, populated;
	uint64_t seq, last_tensor_seq;
	uint64_t step, forward, next_forward, tokens;
	uint64_t max_record, publish_bytes;
	uint64_t drops, drop_bytes, records, bytes_in, publishes, checkpoints;
	uint64_t session_id;
	int policy;
	double stall_timeout;
	bool failed, shut, closed;
	strap_error err;
	strap_resume_point resume;
	char *output_path; /* absolute */
	char *ckpt_path;
	char *fingerprint;
	char *sbuf;     /* one outgoing datagram */
	uint8_t *rbuf;  /* one incoming datagram */
	char meta[256]; /* scratch: the fingerprint read from a checkpoint file */
};

strap_session_params strap_default_session_params(void)
{
	strap_session_params p;
	memset(&p, 0, sizeof p);
	p.autostart = 1;
	p.start_timeout_s = 10.0;
	p.ring_size = 64ull << 20;
	p.codec = "none";
	p.codec_level = -1;
	p.policy = STRAP_POLICY_BLOCK;
	p.stall_timeout_s = 120.0;
	return p;
}

/* ----- errors ----- */

STRAP_PRINTF(3, 4) static int fail(strap_session *s, int code, const char *fmt, ...)
{
	s->err.code = code;
	s->err.daemon_code[0] = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err.message, sizeof s->err.message, fmt, ap);
	va_end(ap);
	/* Anything from the connection or the daemon ends the session; a bad argument does not. */
	if (code != STRAP_E_INVALID && code != STRAP_E_TOO_LARGE) {
		s->failed = true;
		s->err.fatal = 1;
	} else {
		s->err.fatal = 0;
	}
	return code;
}

static int check(strap_session *s)
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

static int send_buf(strap_session *s, const sw_buf *b, const int *fds, int nfds);

/* The daemon's last ERROR when it closed with one queued (it usually does): a peer closing
 * with our messages unread makes the next recv fail once with ECONNRESET, and what it sent
 * before closing is still queued behind that (PROTOCOL.md 1.4). */
static bool salvage(strap_session *s)
{
	bool found = false;
	for (int i = 0; i < 256; i++) {
		ssize_t n = sc_recv(s->sock, s->rbuf, SP_MAX_MESSAGE + 1, 0);
		if (n == -ECONNRESET)
			continue;
		if (n <= 0 || n > SP_MAX_MESSAGE)
			break;
		sp_reply r;
		char why[200];
		if (sp_decode_reply(s->rbuf, (size_t)n, &r, why, sizeof why) != STRAP_OK)
			break;
		if (r.type == SP_ERROR) {
			fail(s, STRAP_E_DAEMON, "strapd error %s: %s", r.u.error.code, r.u.error.message);
			snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "%s", r.u.error.code);
			found = true;
		}
	}
	return found;
}

static int dead(strap_session *s, const char *what, int e)
{
	if (salvage(s))
		return s->err.code;
	return fail(s, STRAP_E_CLOSED, "strapd connection %s%s%s", what, e ? ": " : "", e ? strerror(e) : "");
}

static int send_buf(strap_session *s, const sw_buf *b, const int *fds, int nfds)
{
	if (b->overflow)
		return fail(s, STRAP_E_TOO_LARGE, "message exceeds %d bytes", SP_MAX_MESSAGE);
	int r = sc_send(s->sock, b->p, b->n, fds, nfds);
	if (r == 0)
		return STRAP_OK;
	if (r == -EPIPE || r == -ECONNRESET)
		return dead(s, "closed by the daemon", -r);
	return dead(s, "failed sending", -r);
}

/* Receive one message: 1 when *r holds one, 0 when none came within timeout_ms, < 0 error. */
static int recv_reply(strap_session *s, int timeout_ms, sp_reply *r)
{
	ssize_t n = sc_recv(s->sock, s->rbuf, SP_MAX_MESSAGE + 1, timeout_ms);
	if (n == -EAGAIN)
		return 0;
	if (n == -ECONNRESET)
		return dead(s, "reset by the daemon", ECONNRESET);
	if (n < 0)
		return dead(s, "failed", (int)-n);
	if (n == 0)
		return dead(s, "closed by the daemon (EOF)", 0);
	if (n > SP_MAX_MESSAGE)
		return fail(s, STRAP_E_PROTOCOL, "message of %zd bytes from the daemon exceeds %d", n, SP_MAX_MESSAGE);
	char why[300];
	if (sp_decode_reply(s->rbuf, (size_t)n, r, why, sizeof why) != STRAP_OK)
		return fail(s, STRAP_E_PROTOCOL, "malformed message from strapd: %s", why);
	return 1;
}

static int daemon_error(strap_session *s, const sp_reply *r)
{
	fail(s, STRAP_E_DAEMON, "strapd error %s: %s", r->u.error.code, r->u.error.message);
	snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "%s", r->u.error.code);
	return STRAP_E_DAEMON;
}

/* A message during streaming: RELEASE gives space back; a fatal ERROR ends the session. */
static int handle(strap_session *s, const sp_reply *r)
{
	if (r->type == SP_RELEASE) {
		if (r->u.release.tail > s->head)
			return fail(s, STRAP_E_PROTOCOL, "release tail %llu is past head %llu",
				    (unsigned long long)r->u.release.tail, (unsigned long long)s->head);
		/* The daemon finished reading these bytes before it sent RELEASE (PROTOCOL.md 3);
		 * our later writes into them must not be hoisted above this receive. */
		atomic_thread_fence(memory_order_acquire);
		if (r->u.release.tail > s->tail)
			s->tail = r->u.release.tail;
		return STRAP_OK;
	}
	if (r->type == SP_ERROR) {
		if (r->u.error.fatal)
			return daemon_error(s, r);
		return STRAP_OK;
	}
	return fail(s, STRAP_E_PROTOCOL, "unexpected %s during a session", sp_type_name(r->type));
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
static int expect(strap_session *s, int want, double timeout, sp_reply *r)
{
	double deadline = sc_now() + timeout;
	for (;;) {
		double left = deadline - sc_now();
		if (left <= 0)
			return fail(s, STRAP_E_TIMEOUT, "strapd did not answer with %s within %.0fs",
				    sp_type_name(want), timeout);
		int got = recv_reply(s, (int)(left * 1000) + 1, r);
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
		return fail(s, STRAP_E_PROTOCOL, "expected %s, got %s", sp_type_name(want), sp_type_name(r->type));
	}
}

static sw_buf out_buf(strap_session *s)
{
	sw_buf b = {s->sbuf, 0, SP_MAX_MESSAGE, false};
	return b;
}

/* One PUBLISH for every record written since the last one. */
static int publish(strap_session *s)
{
	if (s->head == s->published_head)
		return STRAP_OK;
	int e = drain(s); /* a daemon ERROR surfaces here, once per publish */
	if (e)
		return e;
	/* Every byte of the records is written before the message that publishes them
	 * (PROTOCOL.md 3); sendmsg is a full barrier in practice, this states it in C11. */
	atomic_thread_fence(memory_order_release);
	sw_buf b = out_buf(s);
	sp_enc_publish(&b, s->head, s->last_tensor_seq);
	e = send_buf(s, &b, NULL, 0);
	if (e)
		return e;
	s->published_head = s->head;
	s->publishes++;
	return STRAP_OK;
}

static bool fits(const strap_session *s, uint64_t needed)
{
	return s->head - s->tail + needed <= s->data_size;
}

static uint64_t pad_for(const strap_session *s, uint64_t rec_len)
{
	uint64_t off = s->head % s->data_size;
	return off + rec_len > s->data_size ? s->data_size - off : 0;
}

static int wait_for(strap_session *s, uint64_t needed)
{
	int e = publish(s); /* the daemon releases only what it has seen */
	if (e)
		return e;
	double deadline = sc_now() + s->stall_timeout;
	while (!fits(s, needed)) {
		double left = deadline - sc_now();
		if (left <= 0)
			return fail(s, STRAP_E_TIMEOUT,
				    "strapd released no ring space for %.0fs (need %llu bytes, %llu of %llu in use)",
				    s->stall_timeout, (unsigned long long)needed,
				    (unsigned long long)(s->head - s->tail), (unsigned long long)s->data_size);
		sp_reply r;
		int got = recv_reply(s, left > 1 ? 1000 : (int)(left * 1000) + 1, &r);
		if (got < 0)
			return got;
		if (got && (e = handle(s, &r)))
			return e;
	}
	return STRAP_OK;
}

/* Populate the ring's pages before the first lap writes there: one madvise per 4 MiB costs
 * less than a page fault per page inside the copies. Only a speed-up. */
static void populate(strap_session *s, uint64_t end)
{
	if (end <= s->populated)
		return;
	uint64_t start = s->populated;
	uint64_t stop = end > start + POPULATE_CHUNK ? end : start + POPULATE_CHUNK;
	if (stop > s->data_size)
		stop = s->data_size;
	uint64_t first = (SR_HEADER_SIZE + start) & ~(uint64_t)4095;
	if (madvise(s->ring + first, SR_HEADER_SIZE + stop - first, MADV_POPULATE_WRITE) != 0)
		stop = s->data_size; /* not supported here: the writes fault pages in themselves */
	s->populated = stop < s->data_size ? stop : UINT64_MAX;
}

static int send_drop(strap_session *s, const char *name, size_t name_len, uint64_t bytes)
{
	int e = publish(s); /* the records before it come first in sequence order */
	if (e)
		return e;
	sw_buf b = out_buf(s);
	sp_enc_drop(&b, s->seq + 1, name, name_len, s->step, s->forward, bytes, "ring_full");
	if ((e = send_buf(s, &b, NULL, 0)))
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
			return fail(s, STRAP_E_TOO_LARGE,
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
			if ((e = wait_for(s, pad + rec_len)))
				return e;
			pad = pad_for(s, rec_len);
		}
		if (pad) {
			populate(s, s->head + pad);
			sr_encode_pad(s->ring + SR_HEADER_SIZE + s->head % s->data_size, pad);
			s->head += pad;
		}
		populate(s, s->head + rec_len);
		uint8_t *dst = s->ring + SR_HEADER_SIZE + s->head % s->data_size;
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
					return fail(s, STRAP_E_INVALID,
						    "%s: the copy function failed (%d); nothing written", name, rc);
				return fail(s, STRAP_E_SYSTEM,
					    "%s: the copy function failed (%d) at byte %llu of %llu; the session ends",
					    name, rc, (unsigned long long)off, (unsigned long long)nbytes);
			}
		} else if (plen) {
			memcpy(dst + hdr, from->data + off, plen);
		}
		s->seq = seq;
		s->last_tensor_seq = seq;
		s->head += rec_len;
		s->records++;
		s->bytes_in += plen;
		if (s->head - s->published_head >= s->publish_bytes && (e = publish(s)))
			return e;
	}
	return STRAP_OK;
}

/* Checks shared by both write entry points; the lock is held. */
static int check_record(strap_session *s, const char *name, size_t *name_len, size_t meta_len)
{
	if (!name || !(*name_len = strlen(name)) || *name_len > SR_MAX_NAME)
		return fail(s, STRAP_E_INVALID, "tensor name must be 1..%d bytes", SR_MAX_NAME);
	if (!sp_utf8_valid(name, *name_len))
		return fail(s, STRAP_E_INVALID, "tensor name is not valid UTF-8");
	if (meta_len > SR_MAX_META)
		return fail(s, STRAP_E_TOO_LARGE, "record meta of %zu bytes exceeds %d", meta_len, SR_MAX_META);
	return STRAP_OK;
}

static int write_common(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, const src *from,
			size_t nbytes, const char *meta_json)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (e)
		goto out;
	size_t name_len = 0, meta_len = meta_json ? strlen(meta_json) : 0;
	if ((e = check_record(s, name, &name_len, meta_len)))
		goto out;
	size_t esize = strap_dtype_size(dtype);
	if (!esize) {
		e = fail(s, STRAP_E_INVALID, "%s: unknown dtype %d", name, dtype);
		goto out;
	}
	if (ndim < 0 || ndim > SR_MAX_NDIM || (ndim && !shape)) {
		e = fail(s, STRAP_E_INVALID, "%s: ndim %d (allowed 0..%d)", name, ndim, SR_MAX_NDIM);
		goto out;
	}
	uint64_t shp[SR_MAX_NDIM], count = 1;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || (shape[i] && count > UINT64_MAX / (uint64_t)shape[i])) {
			e = fail(s, STRAP_E_INVALID, "%s: bad shape dimension %d", name, i);
			goto out;
		}
		shp[i] = (uint64_t)shape[i];
		count *= shp[i];
	}
	if (count > UINT64_MAX / esize || count * esize != nbytes || (nbytes && !from->data && !from->fn)) {
		e = fail(s, STRAP_E_INVALID, "%s: %zu bytes given, shape and dtype make %llu", name, nbytes,
			 (unsigned long long)(count * esize));
		goto out;
	}
	if (meta_len) {
		char why[128];
		/* an object, or the daemon ends the session with bad_record */
		if (!sj_validate(meta_json, meta_len, why, sizeof why) || meta_json[0] != '{') {
			e = fail(s, STRAP_E_INVALID, "%s: meta is not a JSON object", name);
			goto out;
		}
	}
	e = write_locked(s, name, name_len, dtype, shp, ndim, from, nbytes, meta_json, meta_len);
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap_session_write(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim, const void *data,
			size_t nbytes, const char *meta_json)
{
	src from = {data, NULL, NULL};
	return write_common(s, name, dtype, shape, ndim, &from, nbytes, meta_json);
}

int strap_session_write_with(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
			     size_t nbytes, const char *meta_json, strap_copy_fn fn, void *ctx)
{
	if (!fn)
		return strap_session_write(s, name, dtype, shape, ndim, NULL, nbytes, meta_json);
	src from = {NULL, fn, ctx};
	return write_common(s, name, dtype, shape, ndim, &from, nbytes, meta_json);
}

/* A ggml tensor as strap writes it (STREAM_FORMAT.md 4.1): dtype, C-order shape and, for a
 * quantized type, the raw-block meta (into meta, at least 256 bytes). */
static int ggml_layout(strap_session *s, const char *name, int ggml_type, const int64_t *ne, int n_dims, int *dtype,
		       int64_t *shape, char *meta, size_t metacap)
{
	int dt = sr_ggml_dtype(ggml_type);
	if (n_dims < 1 || n_dims > 4 || !ne || dt < 0) {
		pthread_mutex_lock(&s->mu);
		int e = dt < 0 ? fail(s, STRAP_E_INVALID, "%s: ggml type %d is not known to libstrap",
				      name ? name : "?", ggml_type)
			       : fail(s, STRAP_E_INVALID, "%s: ggml n_dims %d (allowed 1..4)", name ? name : "?",
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
		int e = fail(s, STRAP_E_INVALID, "%s: ne[0] = %lld is not a whole number of %s blocks",
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
	return write_common(s, name, dt, shape, n_dims, &from, nbytes, meta[0] ? meta : NULL);
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
	return write_common(s, name, dt, shape, n_dims, &from, nbytes, meta[0] ? meta : NULL);
}

int strap_session_flush(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (!e)
		e = publish(s);
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

int strap_session_token(strap_session *s, int64_t token_id, const char *text, size_t text_len, int64_t position)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (e)
		goto out;
	if (text_len && !text) {
		e = fail(s, STRAP_E_INVALID, "token text is NULL with length %zu", text_len);
		goto out;
	}
	if (!sp_utf8_valid(text, text_len)) {
		/* strapd refuses it (bad_message) and the session would end */
		e = fail(s, STRAP_E_INVALID, "token %llu text is not valid UTF-8", (unsigned long long)s->tokens);
		goto out;
	}
	if ((e = drain(s)) || (e = publish(s)))
		goto out;
	sw_buf b = out_buf(s);
	sp_enc_token(&b, s->seq + 1, s->tokens, token_id, text, text_len, position >= 0, position);
	if (b.overflow) {
		e = fail(s, STRAP_E_TOO_LARGE, "token %llu text of %zu bytes does not fit one message",
			 (unsigned long long)s->tokens, text_len);
		goto out;
	}
	if ((e = send_buf(s, &b, NULL, 0)))
		goto out;
	s->seq++;
	s->tokens++;
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* ----- checkpoint files (docs/CHECKPOINTS.md 3) ----- */

static void rfc3339(char *out, size_t cap)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, cap - n, ".%06ldZ", ts.tv_nsec / 1000);
}

static int fsync_dir(const char *path)
{
	char dir[4200];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = 0;
	else if (slash)
		*slash = 0;
	else
		strcpy(dir, ".");
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int r = fsync(fd);
	close(fd);
	return r;
}

static int write_checkpoint(strap_session *s, const sp_reply *c)
{
	char created[64];
	rfc3339(created, sizeof created);
	sw_buf b = out_buf(s); /* the send buffer is free between messages */
	sw_lit(&b, "{\"format\":\"strap-checkpoint\",\"version\":1,\"stream\":");
	sw_str(&b, s->output_path, strlen(s->output_path));
	sw_lit(&b, ",\"created\":\"");
	sw_lit(&b, created);
	sw_lit(&b, "\",\"fingerprint\":");
	sw_str(&b, s->fingerprint, strlen(s->fingerprint));
	sw_lit(&b, ",\"stream_offset\":");
	sw_u64(&b, c->u.checkpointed.offset);
	sw_lit(&b, ",\"packets\":");
	sw_u64(&b, c->u.checkpointed.packets);
	sw_lit(&b, ",\"drops\":");
	sw_u64(&b, c->u.checkpointed.drops);
	sw_lit(&b, ",\"last_seq\":");
	sw_u64(&b, c->u.checkpointed.seq);
	sw_lit(&b, ",\"last_packet_offset\":");
	sw_u64(&b, c->u.checkpointed.last_offset);
	sw_lit(&b, ",\"last_packet_crc\":");
	sw_u64(&b, c->u.checkpointed.last_crc);
	sw_lit(&b, ",\"token_count\":");
	sw_u64(&b, c->u.checkpointed.tokens);
	sw_lit(&b, ",\"forward_count\":");
	sw_u64(&b, s->next_forward);
	sw_lit(&b, "}\n");
	if (b.overflow)
		return fail(s, STRAP_E_TOO_LARGE, "checkpoint file exceeds %d bytes", SP_MAX_MESSAGE);
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", s->ckpt_path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return fail(s, STRAP_E_SYSTEM, "checkpoint %s: open: %s", tmp, strerror(errno));
	size_t done = 0;
	while (done < b.n) {
		ssize_t w = write(fd, b.p + done, b.n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			int er = errno;
			close(fd);
			unlink(tmp);
			return fail(s, STRAP_E_SYSTEM, "checkpoint %s: write: %s", tmp, strerror(er));
		}
		done += (size_t)w;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		int er = errno;
		unlink(tmp);
		return fail(s, STRAP_E_SYSTEM, "checkpoint %s: fsync: %s", tmp, strerror(er));
	}
	if (rename(tmp, s->ckpt_path) != 0) {
		int er = errno;
		unlink(tmp);
		return fail(s, STRAP_E_SYSTEM, "checkpoint %s: rename: %s", s->ckpt_path, strerror(er));
	}
	if (fsync_dir(s->ckpt_path) != 0)
		return fail(s, STRAP_E_SYSTEM, "checkpoint %s: fsync of its directory: %s", s->ckpt_path,
			    strerror(errno));
	return STRAP_OK;
}

int strap_session_checkpoint(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (e || (e = publish(s)))
		goto out;
	sw_buf b = out_buf(s);
	sp_enc_checkpoint(&b, s->seq);
	if ((e = send_buf(s, &b, NULL, 0)))
		goto out;
	sp_reply r;
	if ((e = expect(s, SP_CHECKPOINTED, s->stall_timeout > 60 ? s->stall_timeout : 60, &r)))
		goto out;
	if (r.u.checkpointed.seq != s->seq) {
		e = fail(s, STRAP_E_PROTOCOL, "CHECKPOINTED for seq %llu, asked for %llu",
			 (unsigned long long)r.u.checkpointed.seq, (unsigned long long)s->seq);
		goto out;
	}
	if ((e = write_checkpoint(s, &r)))
		goto out;
	s->checkpoints++;
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* ----- resources, close ----- */

int strap_session_resources(strap_session *s, const char *const *events, const size_t *lens, size_t n)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (e)
		goto out;
	if (s->res_fd < 0) {
		e = fail(s, STRAP_E_INVALID, "resource events need a session opened with params.resources");
		goto out;
	}
	if (n && (!events || !lens)) {
		e = fail(s, STRAP_E_INVALID, "events or lens is NULL");
		goto out;
	}
	for (size_t next = 0; next < n;) {
		sw_buf b = out_buf(s);
		char why[200];
		e = sp_pack_resources(&b, events, lens, n, &next, why, sizeof why);
		if (e) {
			fail(s, e, "%s", why);
			goto out;
		}
		if ((e = send_buf(s, &b, NULL, 0)))
			goto out;
	}
out:
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap_session_close(strap_session *s, strap_closed *out)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = check(s);
	if (e || (e = publish(s)))
		goto out;
	sw_buf b = out_buf(s);
	sp_enc_close(&b, s->seq, s->head, s->drops);
	if ((e = send_buf(s, &b, NULL, 0)))
		goto out;
	/* CLOSE counted every record up to here: nothing more may go into the ring. */
	s->shut = true;
	sp_reply r;
	if ((e = expect(s, SP_CLOSED, s->stall_timeout > 60 ? s->stall_timeout : 60, &r)))
		goto out;
	s->closed = true;
	if (out) {
		out->packets = r.u.closed.packets;
		out->drops = r.u.closed.drops;
		out->bytes_in = r.u.closed.bytes_in;
		out->bytes_out = r.u.closed.bytes_out;
		out->file_bytes = r.u.closed.file_bytes;
	}
	/* a clean finish: the checkpoint would only describe a prefix of a complete stream */
	if (unlink(s->ckpt_path) == 0)
		fsync_dir(s->ckpt_path);
out:
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
	st.ring_size = s->ring_size;
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

void strap_session_free(strap_session *s)
{
	if (!s)
		return;
	if (s->sock >= 0)
		close(s->sock);
	if (s->ring && s->ring != MAP_FAILED)
		munmap(s->ring, s->ring_size);
	int fds[] = {s->ring_fd, s->out_fd, s->trace_fd, s->res_fd};
	for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
	}
	free(s->output_path);
	free(s->ckpt_path);
	free(s->fingerprint);
	free(s->sbuf);
	free(s->rbuf);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* ----- open ----- */

static char *dupstr(const char *a, const char *b)
{
	size_t n = strlen(a), m = b ? strlen(b) : 0;
	char *p = malloc(n + m + 1);
	if (p) {
		memcpy(p, a, n);
		memcpy(p + n, b ? b : "", m + 1);
	}
	return p;
}

/* Read and check the checkpoint file (the rules of internal/checkpoint Parse). */
static int load_checkpoint(strap_session *s, uint64_t *offset, uint64_t *packets, uint64_t *last_seq,
			   uint64_t *last_crc, uint64_t *tokens, uint64_t *forwards)
{
	int fd = open(s->ckpt_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: %s", s->ckpt_path, strerror(errno));
	char *buf = s->sbuf;
	ssize_t n = read(fd, buf, SP_MAX_MESSAGE);
	close(fd);
	char why[128];
	if (n < 0 || n >= SP_MAX_MESSAGE || !sj_validate(buf, (size_t)n, why, sizeof why))
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s is not a JSON object of at most %d bytes",
			    s->ckpt_path, SP_MAX_MESSAGE - 1);
	sj_val doc = {buf, (size_t)n}, v;
	while (doc.n && *doc.p != '{')
		doc.p++, doc.n--;
	char str[256];
	bool full;
	if (!sj_get(doc, "format", &v) || !sj_str(v, str, sizeof str, NULL) || strcmp(str, "strap-checkpoint") != 0)
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: format is not \"strap-checkpoint\"", s->ckpt_path);
	uint64_t ver = 0, drops = 0, last_off = 0;
	if (!sj_get(doc, "version", &v) || !sj_u64(v, &ver) || ver != 1)
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: version is not 1", s->ckpt_path);
	struct {
		const char *k;
		uint64_t *dst;
	} f[] = {{"stream_offset", offset},         {"packets", packets},          {"last_seq", last_seq},
		 {"last_packet_offset", &last_off}, {"last_packet_crc", last_crc}, {"token_count", tokens}};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		if (!sj_get(doc, f[i].k, &v) || !sj_u64(v, f[i].dst))
			return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: %s missing or not an unsigned integer",
				    s->ckpt_path, f[i].k);
	}
	*forwards = 0;
	if (sj_get(doc, "forward_count", &v))
		sj_u64(v, forwards);
	if (sj_get(doc, "drops", &v))
		sj_u64(v, &drops);
	if (!sj_get(doc, "fingerprint", &v) || !sj_str(v, s->meta, sizeof s->meta, &full) || !full ||
	    strcmp(s->meta, s->fingerprint) != 0)
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: fingerprint is not this capture's (\"%s\")",
			    s->ckpt_path, s->fingerprint);
	if (*offset == 0 || (*packets == 0) != (*last_seq == 0) || *last_seq < *packets ||
	    (*packets && (last_off == 0 || last_off >= *offset)) || drops > *packets || *tokens > *packets ||
	    *last_crc > UINT32_MAX)
		return fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: inconsistent numbers", s->ckpt_path);
	return STRAP_OK;
}

static int lock_stream(strap_session *s)
{
	double deadline = sc_now() + LOCK_WAIT_S;
	for (;;) {
		if (flock(s->out_fd, LOCK_EX | LOCK_NB) == 0)
			return STRAP_OK;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return fail(s, STRAP_E_SYSTEM, "flock %s: %s", s->output_path, strerror(errno));
		if (sc_now() > deadline)
			return fail(
				s, STRAP_E_CHECKPOINT,
				"%s is in use by a live capture (its strapd session still holds the stream lock after "
				"%ds)",
				s->output_path, LOCK_WAIT_S);
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

static int open_side_file(strap_session *s, const char *suffix, bool append, int *fd)
{
	char path[4300];
	snprintf(path, sizeof path, "%s%s", s->output_path, suffix);
	*fd = open(path, (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC) | O_CREAT | O_CLOEXEC, 0644);
	if (*fd < 0)
		return fail(s, STRAP_E_SYSTEM, "open %s: %s", path, strerror(errno));
	return STRAP_OK;
}

static int make_ring(strap_session *s, uint64_t size)
{
	s->ring_size = size;
	s->data_size = size - SR_HEADER_SIZE;
	s->ring_fd = memfd_create("strap-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->ring_fd < 0)
		return fail(s, STRAP_E_SYSTEM, "memfd_create: %s", strerror(errno));
	if (ftruncate(s->ring_fd, (off_t)size) != 0)
		return fail(s, STRAP_E_SYSTEM, "ftruncate ring to %llu: %s", (unsigned long long)size, strerror(errno));
	s->ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->ring_fd, 0);
	if (s->ring == MAP_FAILED) {
		s->ring = NULL;
		return fail(s, STRAP_E_SYSTEM, "mmap ring: %s", strerror(errno));
	}
	sr_encode_ring_header(s->ring, size);
	/* without the shrink seal strapd would refuse the ring: a truncate could SIGBUS it */
	if (fcntl(s->ring_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
		return fail(s, STRAP_E_SYSTEM, "seal ring: %s", strerror(errno));
	return STRAP_OK;
}

/* OPEN's metadata: the library's members, then the caller's (a later repeat wins in Go). */
static int build_metadata(strap_session *s, const strap_session_params *p, const char *client, sw_buf *m)
{
	sw_lit(m, "{\"client\":{\"name\":");
	sw_str(m, client, strlen(client));
	sw_lit(m, ",\"pid\":");
	sw_i64(m, getpid());
	sw_lit(m, "},\"fingerprint\":");
	sw_str(m, s->fingerprint, strlen(s->fingerprint));
	sw_lit(m, ",\"output_path\":");
	sw_str(m, s->output_path, strlen(s->output_path));
	if (p->metadata_json) {
		size_t n = strlen(p->metadata_json);
		char why[128];
		if (!sj_validate(p->metadata_json, n, why, sizeof why))
			return fail(s, STRAP_E_INVALID, "metadata_json is not JSON: %s", why);
		const char *a = p->metadata_json, *z = a + n;
		while (a < z && *a != '{' && *a != '[' && *a != '"')
			a++;
		if (a == z || *a != '{')
			return fail(s, STRAP_E_INVALID, "metadata_json is not a JSON object");
		while (z > a && z[-1] != '}')
			z--;
		/* the members between the braces, if any */
		const char *in = a + 1, *end = z - 1;
		while (in < end && (*in == ' ' || *in == '\n' || *in == '\t' || *in == '\r'))
			in++;
		if (in < end) {
			sw_raw(m, ",", 1);
			sw_raw(m, in, (size_t)(end - in));
		}
	}
	sw_raw(m, "}", 1);
	if (m->overflow)
		return fail(s, STRAP_E_TOO_LARGE, "OPEN metadata exceeds the message size");
	return STRAP_OK;
}

static int open_session(strap_session *s, const strap_session_params *p)
{
	if (!p->output_path || !*p->output_path)
		return fail(s, STRAP_E_INVALID, "params.output_path is required");
	if (p->ring_size <= SR_HEADER_SIZE || (p->ring_size - SR_HEADER_SIZE) % 64)
		return fail(s, STRAP_E_INVALID, "ring_size %llu must be 4096 + a positive multiple of 64",
			    (unsigned long long)p->ring_size);
	if (p->policy != STRAP_POLICY_BLOCK && p->policy != STRAP_POLICY_DROP)
		return fail(s, STRAP_E_INVALID, "policy %d is not STRAP_POLICY_BLOCK or STRAP_POLICY_DROP",
			    (int)p->policy);
	if (!p->codec || !*p->codec)
		return fail(s, STRAP_E_INVALID, "params.codec is empty");
	s->policy = p->policy;
	s->stall_timeout = p->stall_timeout_s > 0 ? p->stall_timeout_s : 120.0;
	s->fingerprint = dupstr(p->fingerprint ? p->fingerprint : "", NULL);
	char client[200];
	snprintf(client, sizeof client, "%s",
		 p->client_name && *p->client_name ? p->client_name : "libstrap/" STRAP_VERSION_STRING);

	/* the output: opened, locked and (unless resumed) cut here; strapd only gets the fd */
	s->out_fd = open(p->output_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (s->out_fd < 0)
		return fail(s, STRAP_E_SYSTEM, "open %s: %s", p->output_path, strerror(errno));
	char abs[PATH_MAX];
	if (!realpath(p->output_path, abs))
		return fail(s, STRAP_E_SYSTEM, "realpath %s: %s", p->output_path, strerror(errno));
	s->output_path = dupstr(abs, NULL);
	s->ckpt_path = p->checkpoint_path && *p->checkpoint_path ? dupstr(p->checkpoint_path, NULL)
								 : dupstr(abs, ".ckpt.json");
	if (!s->fingerprint || !s->output_path || !s->ckpt_path)
		return fail(s, STRAP_E_NOMEM, "out of memory");
	int e = lock_stream(s);
	if (e)
		return e;

	bool have_ckpt = access(s->ckpt_path, F_OK) == 0;
	uint64_t off = 0, packets = 0, last_seq = 0, last_crc = 0, tokens = 0, forwards = 0;
	bool resuming = false;
	if (have_ckpt && !p->resume && !p->overwrite_checkpoint)
		return fail(s, STRAP_E_CHECKPOINT,
			    "a checkpoint of an earlier capture exists at %s: resume it (params.resume) or start over "
			    "(params.overwrite_checkpoint)",
			    s->ckpt_path);
	if (have_ckpt && p->resume) {
		if ((e = load_checkpoint(s, &off, &packets, &last_seq, &last_crc, &tokens, &forwards)))
			return e;
		struct stat st;
		if (fstat(s->out_fd, &st) != 0 || (uint64_t)st.st_size < off)
			return fail(s, STRAP_E_CHECKPOINT,
				    "stream %s holds %lld bytes, less than the checkpoint's %llu", s->output_path,
				    (long long)st.st_size, (unsigned long long)off);
		resuming = true;
	} else {
		if (have_ckpt && unlink(s->ckpt_path) != 0)
			return fail(s, STRAP_E_SYSTEM, "remove checkpoint %s: %s", s->ckpt_path, strerror(errno));
		if (ftruncate(s->out_fd, 0) != 0)
			return fail(s, STRAP_E_SYSTEM, "truncate %s: %s", s->output_path, strerror(errno));
	}
	if (p->trace && (e = open_side_file(s, ".trace.jsonl", resuming, &s->trace_fd)))
		return e;
	if (p->resources && (e = open_side_file(s, ".resources.jsonl", resuming, &s->res_fd)))
		return e;

	/* connect and shake hands */
	char path[4200];
	strap_error cerr = {0};
	s->sock = sc_connect(p->socket_path, p->autostart, p->strapd_bin, p->start_timeout_s, path, sizeof path, &cerr);
	if (s->sock < 0) {
		int code = s->sock;
		s->sock = -1;
		return fail(s, code, "%s", cerr.message);
	}
	sw_buf b = out_buf(s);
	sp_enc_hello(&b, client, getpid());
	if ((e = send_buf(s, &b, NULL, 0)))
		return e;
	sp_reply r;
	if ((e = expect(s, SP_WELCOME, 10, &r)))
		return e;
	if (r.u.welcome.protocol != SP_VERSION)
		return fail(s, STRAP_E_PROTOCOL, "daemon speaks protocol %lld, client speaks %d",
			    (long long)r.u.welcome.protocol, SP_VERSION);
	uint64_t limit = r.u.welcome.max_ring_size ? r.u.welcome.max_ring_size : DEFAULT_MAX_RING;
	uint64_t size = p->ring_size;
	if (size > limit) {
		size = limit / 4096 * 4096;
		if (size < MIN_RING)
			return fail(s, STRAP_E_DAEMON,
				    "strapd admits rings of at most %llu bytes (--max-ring-size), less "
				    "than the smallest usable ring (%d bytes)",
				    (unsigned long long)limit, MIN_RING);
	}
	if ((e = make_ring(s, size)))
		return e;
	s->max_record = (p->part_size ? p->part_size : s->data_size / 4) / 64 * 64;
	/* A record over half the region could need a PAD so long that PAD + record never fit,
	 * even in an empty ring (a PAD is needed only past offset data_size - record). */
	if (s->max_record > s->data_size / 2)
		s->max_record = s->data_size / 2 / 64 * 64;
	uint64_t pb = s->data_size / 8 < (4u << 20) ? s->data_size / 8 : (4u << 20);
	s->publish_bytes = p->publish_bytes ? p->publish_bytes : pb;
	if (s->publish_bytes < 64)
		s->publish_bytes = 64;

	/* OPEN, with the metadata built in the receive buffer (free until OPENED comes) */
	sw_buf meta = {(char *)s->rbuf, 0, SP_MAX_MESSAGE, false};
	if ((e = build_metadata(s, p, client, &meta)))
		return e;
	sp_open_body o = {.ring_size = size,
			  .codec = p->codec,
			  .has_codec_level = p->codec_level >= 0,
			  .codec_level = p->codec_level,
			  .policy = p->policy == STRAP_POLICY_DROP ? "drop" : "block",
			  .block_size = p->block_size,
			  .lossy_mode = p->lossy_mode,
			  .has_lossy_value = p->lossy_mode != NULL,
			  .lossy_value = p->lossy_value,
			  .memory_hint = p->memory_hint,
			  .metadata = meta.p,
			  .metadata_len = meta.n,
			  .resources = p->resources};
	if (resuming) {
		o.has_resume = 1;
		o.append_at = off;
		o.resume_last_seq = last_seq;
		o.resume_last_crc = last_crc;
		o.resume_packets = packets;
	}
	b = out_buf(s);
	sp_enc_open(&b, &o);
	int fds[4], nfds = 0;
	fds[nfds++] = s->ring_fd;
	fds[nfds++] = s->out_fd;
	if (s->trace_fd >= 0)
		fds[nfds++] = s->trace_fd;
	if (s->res_fd >= 0)
		fds[nfds++] = s->res_fd;
	if ((e = send_buf(s, &b, fds, nfds)))
		return e;
	if ((e = expect(s, SP_OPENED, 30, &r)))
		return e;
	s->session_id = r.u.opened.session;
	if (resuming) {
		s->seq = s->last_tensor_seq = last_seq;
		s->tokens = tokens;
		s->next_forward = forwards;
		s->resume = (strap_resume_point){1, tokens, forwards, last_seq, off};
	}
	return STRAP_OK;
}

int strap_session_open(const strap_session_params *params, strap_session **out, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	if (!out || !params) {
		se_set(err, STRAP_E_INVALID, "params and out are required");
		return STRAP_E_INVALID;
	}
	*out = NULL;
	strap_session *s = calloc(1, sizeof *s);
	if (!s) {
		se_set(err, STRAP_E_NOMEM, "out of memory");
		return STRAP_E_NOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	s->sock = s->ring_fd = s->out_fd = s->trace_fd = s->res_fd = -1;
	s->sbuf = malloc(SP_MAX_MESSAGE + 1);
	s->rbuf = malloc(SP_MAX_MESSAGE + 1);
	int e = !s->sbuf || !s->rbuf ? fail(s, STRAP_E_NOMEM, "out of memory") : open_session(s, params);
	if (e) {
		if (err) {
			*err = s->err;
			err->fatal = 1;
		}
		strap_session_free(s);
		return e;
	}
	*out = s;
	return STRAP_OK;
}

/* ----- status ----- */

int strap_status(const char *socket_path, char *buf, size_t len, size_t *needed, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	strap_session *s = calloc(1, sizeof *s);
	if (!s) {
		se_set(err, STRAP_E_NOMEM, "out of memory");
		return STRAP_E_NOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	s->sock = s->ring_fd = s->out_fd = s->trace_fd = s->res_fd = -1;
	s->sbuf = malloc(SP_MAX_MESSAGE + 1);
	s->rbuf = malloc(SP_MAX_MESSAGE + 1);
	int e;
	char path[4200];
	sp_reply r;
	if (!s->sbuf || !s->rbuf) {
		e = fail(s, STRAP_E_NOMEM, "out of memory");
		goto out;
	}
	s->sock = sc_connect(socket_path, 0, NULL, 0, path, sizeof path, &s->err);
	if (s->sock < 0) {
		e = s->sock;
		s->sock = -1;
		goto out;
	}
	sw_buf b = out_buf(s);
	sp_enc_hello(&b, "libstrap/" STRAP_VERSION_STRING, getpid());
	if ((e = send_buf(s, &b, NULL, 0)) || (e = expect(s, SP_WELCOME, 10, &r)))
		goto out;
	b = out_buf(s);
	sp_enc_status(&b);
	if ((e = send_buf(s, &b, NULL, 0)) || (e = expect(s, SP_STATUS_REPLY, 10, &r)))
		goto out;
	if (needed)
		*needed = r.body_len + 1;
	if (!buf || r.body_len + 1 > len) {
		e = fail(s, STRAP_E_TOO_LARGE, "STATUS_REPLY of %zu bytes does not fit %zu", r.body_len, len);
		goto out;
	}
	memcpy(buf, r.body, r.body_len);
	buf[r.body_len] = 0;
out:
	if (e && err)
		*err = s->err;
	strap_session_free(s);
	return e;
}
