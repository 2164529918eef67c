/* Sessions for a caller that keeps its own connection and ring (the Python client: its
 * `_speedups.Session`, `_speedups_session.c`, which keeps rings across captures and registers them
 * with CUDA). The caller does what strap_session_open does before the connection (the output and
 * its lock, the resume decision, the side files); strap__session_open_attached then opens as
 * strap_session_open does — HELLO, the ring (the caller's, from a callback), OPEN, the budget's
 * retries — and from OPENED on the session is this library's: sequence numbers, PUBLISH batching
 * and the published cursor, RELEASE and backpressure, DROP, TOKEN messages and records,
 * CHECKPOINT and CLOSE (docs/PROTOCOL.md 1.4), with the functions libstrap's own sessions use.
 * strap__session_attach attaches to a connection and ring opened by hand (tests).
 *
 * Not part of the public API (no ABI promise): the Python extension compiles libstrap's sources
 * into itself. */
#ifndef STRAP_ATTACH_H
#define STRAP_ATTACH_H

#include <stdbool.h>
#include <stdint.h>

#include "strap.h"
#include "strap_ringbuf.h"
#include "strap_wire.h"

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

/* Opening a session for a caller that keeps its own connection and ring (the Python client):
 * libstrap's open (open.c), the same as strap_session_open's from the connection on — HELLO, the
 * ring clamped to WELCOME's max_ring_size, OPEN with its descriptors and the metadata's
 * "transport" ring facts, OPENED, and the retries of a default ring the daemon's memory budget
 * has no room for — with the connection and the ring made by the caller's callbacks. */
typedef struct strap__open {
	/* a connected socket to strapd (its connect and autostart), or < 0 with err set */
	int (*connect)(void *user, strap_error *err);
	/* a ring of size bytes (NULL with err set); ring_drop gives back one the open did not keep
	 * (a refused try, a failure) */
	srb_ring *(*ring)(void *user, uint64_t size, strap_error *err);
	void (*ring_drop)(void *user, srb_ring *ring);
	void *user;
	const char *client; /* HELLO's client */
	/* OPEN's fields; ring_size, metadata and policy are the open's, memory_hint (nonzero) follows
	 * a ring the budget shrank */
	sp_open_body body;
	/* a JSON object: the stream's client metadata, but "transport", which is the open's: the
	 * members of transport (a JSON object), then ring_size and ring_shrunk_by_budget_from */
	const char *metadata, *transport;
	uint64_t ring_size;
	/* the caller chose ring_size: a budget with no room for it is an error naming ring_setting */
	bool ring_explicit;
	const char *ring_setting;
	int out_fd, trace_fd, res_fd;      /* OPEN's descriptors (the caller's; < 0: none) */
	uint64_t part_size, publish_bytes; /* 0: a quarter of the region; an eighth, at most 4 MiB */
	bool defer;                        /* take the published cursor when OPENED offers it */
	/* the session's: policy, stall_timeout_s, seq, ring_tokens_every/seconds, frontier,
	 * interrupted (sock, ring, session_id, cursor, ring_tokens, max_record and publish_bytes are
	 * the open's) */
	strap__attach attach;
} strap__open;

/* What strap__session_open_attached opened. */
typedef struct strap__opened {
	int sock;       /* the connection (the caller's from now on) */
	srb_ring *ring; /* the ring sent (the caller's) */
	uint64_t session_id, block_size, max_record, publish_bytes;
	uint64_t max_ring_size;  /* WELCOME's (the daemon's default when it does not say) */
	uint64_t fitted_from;    /* the ring asked for, clamped to max_ring_size (0: not) */
	uint64_t shrunk_from;    /* the default ring the budget had no room for (0: none) */
	uint64_t fits_ring_size; /* a memory_budget failure: the ring that fits (0: none) */
	bool published_cursor, ring_tokens;
	char upload[4096]; /* OPENED's upload object ("" none) */
} strap__opened;

/* Open and attach: *out the session (socket and ring borrowed from the caller, as
 * strap__session_attach's); on failure the connection is closed, every ring given back. */
int strap__session_open_attached(const strap__open *o, strap__opened *opened, strap_session **out, strap_error *err);

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
/* The session's connection (the caller's RESOURCES go on it, beside the session's messages). */
int strap__session_sock(const strap_session *s);
/* Refuse records from now on (a closing or abandoned session). */
void strap__session_shut(strap_session *s);

/* The job's resume point by files beside the streams (docs/DISTRIBUTED.md D3: torchrun without a
 * process group, per-rank stream names): this rank's contribution — its token count own, or
 * own_error — written durably to <output_path>.job-resume.json with this start of the job, then
 * every rank's read from the files beside it (this rank's marker .rankNNNNN-of-MMMMM replaced by
 * each rank's), waited for up to wait_s. counts[r] (world_size entries) is rank r's count, or
 * UINT64_MAX with its error in texts + r * STRAP__JOB_TEXT. STRAP_E_CHECKPOINT when the wait ran
 * out, STRAP_E_INVALID without the marker, STRAP_E_SYSTEM when the file could not be written or
 * interrupted said stop; why says which. libstrap's open and the Python client share it. */
#define STRAP__JOB_TEXT 600
typedef struct strap__job {
	const char *output_path, *start, *own_error;
	long long rank, world_size;
	uint64_t own;
	double wait_s;
	int (*interrupted)(void *user);
	void *interrupt_user;
} strap__job;
int strap__job_exchange(const strap__job *j, uint64_t *counts, char *texts, char *why, size_t whylen);

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
