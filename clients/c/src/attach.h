/* A session attached to a connection and ring its caller opened (the Python client: its
 * `_speedups.Session`, `_speedups_session.c`). The caller did what strap_session_open does before
 * OPENED (the output and its lock, the resume decision, the side files, HELLO, the ring, OPEN);
 * from OPENED on the session is this library's: sequence numbers, PUBLISH batching and the
 * published cursor, RELEASE and backpressure, DROP, TOKEN messages and records, CHECKPOINT and
 * CLOSE (docs/PROTOCOL.md 1.4), with the functions libstrap's own sessions use.
 *
 * Not part of the public API (no ABI promise): the Python extension compiles libstrap's sources
 * into itself. */
#ifndef STRAP_ATTACH_H
#define STRAP_ATTACH_H

#include <stdbool.h>
#include <stdint.h>

#include "strap.h"
#include "strap_ringbuf.h"

/* The caller's completion of records it copies itself (the Python client's CUDA copies): the
 * head and last sequence number below which every record is complete. block: wait for every
 * copy first. Returns 0 (every record complete: the session's head), 1 (*head, *seq: a prefix),
 * 2 (none of the pending copies is complete: publish nothing), < 0 an error (the session fails
 * with STRAP_E_SYSTEM; the caller keeps its own account of it). */
typedef int (*strap__frontier_fn)(void *user, int block, uint64_t *head, uint64_t *seq);

typedef struct strap__attach {
	int sock;       /* the control connection after OPENED (not closed by strap_session_free) */
	srb_ring *ring; /* the ring sent with OPEN (not unmapped by strap_session_free) */
	int policy;     /* STRAP_POLICY_* */
	double stall_timeout_s;
	uint64_t max_record, publish_bytes;
	uint64_t seq; /* the last sequence number taken (a resumed stream's), 0 for a new one */
	uint64_t session_id;
	bool cursor;      /* OPENED published_cursor, and the caller defers */
	bool ring_tokens; /* OPENED ring_tokens, the cursor, no trace file */
	uint32_t ring_tokens_every;
	double ring_tokens_seconds;
	strap__frontier_fn frontier;
	void *frontier_user;
	/* asked between waits of at most 50 ms: nonzero ends the wait, the session fails */
	int (*interrupted)(void *user);
	void *interrupt_user;
} strap__attach;

/* Claim modes (strap__session_claim). */
enum {
	STRAP__CLAIM_NOW = 0,    /* room now (RELEASEs drained) or nothing: STRAP__NO_ROOM */
	STRAP__CLAIM_POLICY = 1, /* a tensor's first record: no room drops it (policy drop) or waits */
	STRAP__CLAIM_WAIT = 2,   /* a later PART record: waits */
};
#define STRAP__NO_ROOM 2 /* a positive notice, as STRAP_DROPPED */

/* The session; *out NULL and err set on failure (out of memory, a bad argument). */
int strap__session_attach(const strap__attach *a, strap_session **out, strap_error *err);
/* Room at the head for one record of rec_len bytes: a PAD placed first where the region ends too
 * soon, the pages populated; *seq the record's sequence number. STRAP_DROPPED: no room under
 * policy drop, a DROP for the tensor (name, nbytes, step, forward) sent instead; STRAP__NO_ROOM
 * (mode NOW): no room now, nothing done. The caller writes the record and calls _advance. */
int strap__session_claim(strap_session *s, uint64_t rec_len, int mode, const char *name, size_t name_len,
			 uint64_t nbytes, uint64_t step, uint64_t forward, uint64_t *seq);
/* strap_session_write_with (data NULL) or strap_session_write at the caller's step and forward
 * pass: one record, or PART records; STRAP_DROPPED under policy drop. */
int strap__session_write(strap_session *s, const char *name, int dtype, const int64_t *shape, int ndim,
			 const void *data, strap_copy_fn fn, void *ctx, size_t nbytes, const char *meta_json,
			 uint64_t step, uint64_t forward);
/* The record claimed (or written by strap__session_put) is complete in the ring up to its
 * copy: its seq taken, the head moved rec_len on, payload bytes counted; with publish, a PUBLISH
 * once the unpublished bytes reach publish_bytes. */
int strap__session_advance(strap_session *s, uint64_t rec_len, uint64_t payload_len, bool publish);
/* Whether the session takes records (not closed, not failed), and the record fits at the head
 * with nothing first (srb_ready): the fast path's test. */
bool strap__session_ready(strap_session *s, uint64_t rec_len);
/* The next record's sequence number. */
uint64_t strap__session_next_seq(const strap_session *s);
/* One PUBLISH up to the frontier (block: every pending copy waited for first); none when
 * nothing is new. due_only: only when the unpublished bytes reach publish_bytes. */
int strap__session_publish(strap_session *s, bool block, bool due_only);
/* Handle every message pending (RELEASE, ERROR) without waiting. */
int strap__session_drain(strap_session *s);
/* strap_session_token with the caller's token index; *seq the token's sequence number. */
int strap__session_token_at(strap_session *s, uint64_t index, int64_t token_id, const char *text, size_t text_len,
			    int64_t position, uint64_t *seq);
/* TOKEN records for n tokens (positions, ids; indices from the session's token count on; no text)
 * under one lock, one doorbell after them; *done how many (a prefix) were written: fewer when
 * the ring has no room now, 0 without ring tokens. */
int strap__session_tokens_to_ring(strap_session *s, const int64_t *positions, const int64_t *ids, size_t n,
				  size_t *done);
/* CHECKPOINT for every event so far and its CHECKPOINTED (timeout <= 0: the stall timeout, at
 * least 60 s); the caller writes its checkpoint file. */
int strap__session_checkpoint_exchange(strap_session *s, double timeout, uint64_t out[7]);
/* CLOSE with descriptors (the tokens file of an uploaded session); the session takes no more
 * records. Then _close_wait for CLOSED (timeout <= 0: as the checkpoint's); *upload the
 * object strapd uploads the stream into ("" none), upload_cap bytes. */
int strap__session_close_send(strap_session *s, const int *fds, int nfds);
int strap__session_close_wait(strap_session *s, double timeout, strap_closed *out, char *upload, size_t upload_cap);
/* Refuse records from now on (a closing or abandoned session). */
void strap__session_shut(strap_session *s);

/* The session's state, read together (the Python client's counters and tests). */
typedef struct strap__state {
	uint64_t seq, last_tensor_seq, tokens, records, bytes_in, drops, drop_bytes, published_head, unsent_tokens,
		cursor_at, token_records, publishes, token_messages, token_heads;
	bool cursor, ring_tokens, deferred, shut, failed;
} strap__state;
void strap__session_state(strap_session *s, strap__state *out);
/* Ring tokens' doorbell: a PUBLISH once every tokens wait or seconds passed (every <= 1: ring
 * tokens off, a TOKEN message per token). */
void strap__session_set_ring_tokens(strap_session *s, uint32_t every, double seconds);
/* The message flow chosen at OPENED changed (cursor, ring_tokens: 0 or 1, -1 kept; ring tokens
 * need the cursor), and the last sequence number taken (seq >= 0; before any record): the
 * tests' comparisons of one flow with another. */
void strap__session_set_mode(strap_session *s, int cursor, int ring_tokens, int64_t seq);

#endif
