/* The session's state and the helpers its files share (session.c: messages, records, tokens,
 * resources, close; checkpoint.c: CHECKPOINT and the checkpoint file; open.c: opening a
 * session and STATUS). Private to the library. */
#ifndef STRAP_SESSION_H
#define STRAP_SESSION_H

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

#include "attach.h"
#include "conn.h"
#include "internal.h"
#include "strap_channel.h"
#include "strap_checkpoint.h"
#include "strap_ringbuf.h"

enum {
	DEFAULT_MAX_RING = 1 << 30,
	MIN_RING = 4096 + 64 * 1024,
	DEFAULT_RING = 64 << 20, /* params.ring_size 0 */
	BUDGET_RETRIES = 3,      /* times a default ring is made smaller for the daemon's budget */
	LOCK_WAIT_S = 30,        /* a resume waits this long for a gone holder's lock (CHECKPOINTS.md 5) */
	LOCK_WAIT_NEW_S = 10,    /* a new capture, this long */
	DEFAULT_RESERVATIONS = 64,
	RING_TOKENS_EVERY = 16, /* params.ring_tokens_every 0 */
};
#define RING_TOKENS_SECONDS 0.25 /* params.ring_tokens_seconds 0 */

/* One reservation (strap_session_reserve) not yet published, in ring order: its record's ring
 * position and sequence number. Committed ones stay until the publish frontier passes them. An
 * aborted one gave its ring bytes back (len 0) and waits, its name kept in resv_names, for the
 * frontier: then its sequence number goes to a DROP "aborted". */
enum { RESV_OPEN = 0, RESV_COMMITTED = 1, RESV_ABORTED = 2 };
typedef struct ss_resv {
	uint64_t start, len, seq, nbytes, step, forward;
	uint32_t name_len;
	int state;
} ss_resv;

struct strap_session {
	pthread_mutex_t mu;
	int sock;
	int out_fd, trace_fd, res_fd;
	/* the ring, its head and the tail strapd released (common/strap_ringbuf.h): rb_own, or an
	 * attached session's caller's (strap__session_attach) */
	srb_ring *rb;
	srb_ring rb_own;
	/* attached (strap__session_attach): the socket and the ring are the caller's, not closed or
	 * unmapped by strap_session_free */
	bool borrowed;
	/* attached: the caller's completion of records this library did not copy (the Python
	 * client's CUDA copies); NULL: every record below the head is complete */
	strap__frontier_fn frontier_fn;
	void *frontier_user;
	/* attached: asked between waits of at most 50 ms; nonzero ends the wait (the session fails) */
	int (*interrupted)(void *user);
	void *interrupt_user;
	uint64_t published_head;
	uint64_t seq, last_tensor_seq;
	uint64_t step, forward, next_forward, tokens;
	uint64_t max_record, publish_bytes;
	uint64_t drops, drop_bytes, records, bytes_in, publishes, checkpoints;
	uint64_t session_id;
	int policy;
	double stall_timeout;
	bool failed, shut, closed;
	/* the daemon takes the published cursor (OPENED): once a token was recorded a pass's
	 * records are named by the next TOKEN's head, not a PUBLISH of their own (PROTOCOL.md 1.4) */
	bool cursor;
	bool deferred; /* a pass's records lie below the cursor, not yet named by a message */
	/* ring tokens (OPENED ring_tokens, the cursor, no trace file, params.ring_tokens_every > 1):
	 * tokens go into the ring as TOKEN records, one PUBLISH per rt_every of them or rt_seconds */
	bool ring_tokens;
	uint32_t rt_every;
	double rt_seconds;
	uint64_t unsent_tokens;               /* TOKEN records no message has named yet */
	uint64_t token_records;               /* TOKEN records written */
	uint64_t token_messages, token_heads; /* TOKEN messages sent, those naming a head */
	uint64_t cursor_at;                   /* the published cursor last stored */
	double last_message;                  /* sc_now() of the last PUBLISH or TOKEN message sent */
	/* reservations in ring order: a circular table of resv_cap entries from resv_first; no
	 * record at or past the first one not committed is published */
	ss_resv *resv;
	char *resv_names; /* SR_MAX_NAME bytes per entry: an aborted reservation's name */
	uint32_t resv_cap, resv_first, resv_n;
	uint64_t aborts;
	strap_error err;
	bool salvaged; /* salvage() found the daemon's last ERROR */
	/* the last memory_budget ERROR's fits_ring_size (open.c retries a default ring with it) */
	bool has_fits_ring_size;
	uint64_t fits_ring_size;
	uint64_t budget_shrunk_from; /* the default ring the budget had no room for (0: none) */
	strap_resume_point resume;
	sck_checkpoint resume_ck; /* open: the checkpoint file resumed from */
	/* params.resume_token: each token of the kept prefix, while the resume point is found */
	int (*resume_token)(void *user, uint64_t index, int64_t token_id, const char *text, size_t text_len,
			    int64_t position);
	void *resume_token_user;
	char complete_why[1024]; /* ss_resume_point: why a finished capture is not resumed */
	sp_rank rank;            /* this process's rank in a distributed job (world_size 0: none) */
	char *output_path;       /* absolute */
	char *ckpt_path;
	char *fingerprint;
	char *upload;   /* OPENED's object, NULL when the stream is not uploaded */
	char *sbuf;     /* one outgoing datagram */
	uint8_t *rbuf;  /* one incoming datagram */
	char meta[256]; /* scratch: the fingerprint read from a checkpoint file */
	/* the stream lock (streamlock.c): the output's file, marked as this process's live
	 * capture of it from sl_lock until sl_unlock */
	dev_t lock_dev;
	ino_t lock_ino;
	bool lock_live;
};

/* Internal symbols carry the library's prefix (a static libstrap.a shares one namespace with
 * its host). */
#define ss_fail strap__ss_fail
#define ss_check strap__ss_check
#define ss_publish strap__ss_publish
#define ss_publish_all strap__ss_publish_all
#define ss_out_buf strap__ss_out_buf
#define ss_send_buf strap__ss_send_buf
#define ss_expect strap__ss_expect
#define ss_fsync_dir strap__ss_fsync_dir
#define ss_load_checkpoint strap__ss_load_checkpoint
#define ss_write_checkpoint strap__ss_write_checkpoint
#define ss_resume_point strap__ss_resume_point
#define ss_job_start strap__ss_job_start
#define ss_job_agree strap__ss_job_agree
#define sl_lock strap__sl_lock
#define sl_unlock strap__sl_unlock

/* Take the output's stream lock (s->out_fd, s->output_path set): STRAP_E_IN_USE at once when
 * a live capture holds it, waiting up to wait_s seconds for one whose process is gone. */
int sl_lock(strap_session *s, double wait_s);
/* The session no longer counts as this process's live capture of its output (it is freed). */
void sl_unlock(strap_session *s);
/* Record a failure in s->err; anything but a bad argument ends the session. Returns code. */
int ss_fail(strap_session *s, int code, const char *fmt, ...) STRAP_PRINTF(3, 4);
/* STRAP_E_STATE when the session failed or was closed (the lock is held). */
int ss_check(strap_session *s);
/* One PUBLISH for every record written since the last one, up to the first reservation not
 * committed (an aborted one before it becomes a PAD and a DROP "aborted" first). */
int ss_publish(strap_session *s);
/* ss_publish, then STRAP_E_BUSY (not fatal) when a reservation is still outstanding: what
 * follows (`what`: TOKEN, CHECKPOINT, CLOSE) must come after every record in sequence order. */
int ss_publish_all(strap_session *s, const char *what);
/* The session's outgoing datagram buffer, empty. */
sw_buf ss_out_buf(strap_session *s);
/* Send one datagram with descriptors; a dead connection reports the daemon's last ERROR. */
int ss_send_buf(strap_session *s, const sw_buf *b, const int *fds, int nfds);
/* Wait up to timeout for a message of type want (RELEASE handled, ERROR raised). */
int ss_expect(strap_session *s, int want, double timeout, sp_reply *r);
/* fsync the directory holding path. */
int ss_fsync_dir(const char *path);
/* Read and check the checkpoint file (sck_parse) and its fingerprint. */
int ss_load_checkpoint(strap_session *s, sck_checkpoint *c);
/* Write the checkpoint file for a stream prefix (temp file, fsync, rename, directory fsync);
 * forward_count is s->next_forward. */
int ss_write_checkpoint(strap_session *s, uint64_t offset, uint64_t packets, uint64_t drops, uint64_t last_seq,
			uint64_t last_offset, uint64_t last_crc, uint64_t tokens);
/* A stream prefix a resume keeps (resume.c): up to offset, its packet and DROP counts, its last
 * packet's seq, CRC and offset, tokens and forward passes in it. */
typedef struct rs_point {
	uint64_t offset, packets, drops, last_seq, last_crc, last_offset, tokens, forwards;
	bool from_stream; /* past the checkpoint (or without one): found by walking the stream */
} rs_point;
/* The resume point of s->out_fd (docs/CHECKPOINTS.md 4, common/strap_resume.c): ck (NULL: none)
 * is the floor, every packet of its prefix checked, then the intact run of packets up to its last
 * TOKEN; limit >= 0 keeps at most that many tokens (before the checkpoint too). Each kept token goes
 * to s->resume_token. *keep false: nothing to keep (an empty file; no checkpoint and no token
 * intact): a new capture. *complete (may be NULL): no checkpoint and an END "complete" follows the
 * point, a finished capture (s->complete_why says so); refused (STRAP_E_CHECKPOINT, nothing changed)
 * when refuse_complete. STRAP_E_CHECKPOINT: the checkpoint's prefix is not what it says, the header
 * is not a strap stream's or names another fingerprint, freed bytes stand in the way. */
int ss_resume_point(strap_session *s, const sck_checkpoint *ck, int64_t limit, bool refuse_complete, rs_point *pt,
		    bool *keep, bool *complete);
/* One rank of a job under torchrun (TORCHELASTIC_RUN_ID other than "none",
 * TORCHELASTIC_RESTART_COUNT, per-rank stream names): this start of the job into start. */
bool ss_job_start(const strap_session *s, char *start, size_t len);
/* The job's common resume point, agreed by files beside the streams as the Python client does
 * (_job_resume.py; the ranks share the directory): this rank writes its count (or, own_rc set,
 * its error) to "{stream}.job-resume.json" and waits up to $STRAP_JOB_RESUME_WAIT (600) seconds
 * for every rank's of the same start; *min the fewest tokens. Returns own_rc when set (every
 * other rank has heard of it), STRAP_E_CHECKPOINT naming the ranks that cannot resume, or the
 * wait's end. */
int ss_job_agree(strap_session *s, const char *start, int own_rc, uint64_t own, uint64_t *min);

#endif
