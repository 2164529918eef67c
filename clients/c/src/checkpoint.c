/* CHECKPOINT and the checkpoint file of docs/CHECKPOINTS.md 2-3: the request, the file written
 * once strapd has made every event durable (temp file, fsync, rename, directory fsync:
 * common/strap_checkpoint.c's sck_write_atomic, the Python client's too), and its reading and
 * checks on resume. */
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

/* ----- checkpoint files (docs/CHECKPOINTS.md 3; the bytes: common/strap_checkpoint.c) ----- */

/* The directory of path fsync'd (common/strap_checkpoint.c): 0, or -1 with errno. */
int ss_fsync_dir(const char *path)
{
	int r = sck_fsync_dir(path, NULL, 0);
	if (r) {
		errno = -r;
		return -1;
	}
	return 0;
}

static int write_checkpoint(strap_session *s, const sp_reply *c);

int ss_write_checkpoint(strap_session *s, uint64_t offset, uint64_t packets, uint64_t drops, uint64_t last_seq,
			uint64_t last_offset, uint64_t last_crc, uint64_t tokens)
{
	sp_reply r;
	memset(&r, 0, sizeof r);
	r.type = SP_CHECKPOINTED;
	r.u.checkpointed.offset = offset;
	r.u.checkpointed.packets = packets;
	r.u.checkpointed.drops = drops;
	r.u.checkpointed.seq = last_seq;
	r.u.checkpointed.last_offset = last_offset;
	r.u.checkpointed.last_crc = last_crc;
	r.u.checkpointed.tokens = tokens;
	return write_checkpoint(s, &r);
}

static int write_checkpoint(strap_session *s, const sp_reply *c)
{
	sck_checkpoint ck = {
		.stream_offset = c->u.checkpointed.offset,
		.packets = c->u.checkpointed.packets,
		.drops = c->u.checkpointed.drops,
		.last_seq = c->u.checkpointed.seq,
		.last_packet_offset = c->u.checkpointed.last_offset,
		.last_packet_crc = c->u.checkpointed.last_crc,
		.token_count = c->u.checkpointed.tokens,
		.forward_count = s->next_forward,
	};
	if (strlen(s->output_path) >= sizeof ck.stream || strlen(s->fingerprint) >= sizeof ck.fingerprint)
		return ss_fail(s, STRAP_E_TOO_LARGE, "checkpoint: the output path or the fingerprint is too long");
	strcpy(ck.stream, s->output_path);
	strcpy(ck.fingerprint, s->fingerprint);
	char created[64], why[1024];
	sck_rfc3339(created, sizeof created);
	sw_buf b = ss_out_buf(s); /* the send buffer is free between messages */
	if (sck_encode(&b, &ck, created, NULL, 0, NULL, 0, why, sizeof why))
		return ss_fail(s, b.overflow ? STRAP_E_TOO_LARGE : STRAP_E_PROTOCOL, "checkpoint %s: %s", s->ckpt_path,
			       why);
	/* temp file, fsync, rename, directory fsync: the Python client's own (sck_write_atomic) */
	if (sck_write_atomic(s->ckpt_path, b.p, b.n, 0640, why, sizeof why) != 0)
		return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: %s", s->ckpt_path, why);
	return STRAP_OK;
}

/* CHECKPOINT for every event so far and its CHECKPOINTED (the lock is held). */
static int exchange(strap_session *s, double timeout, sp_reply *r)
{
	int e = ss_check(s);
	if (e || (e = ss_publish_all(s, "CHECKPOINT")))
		return e;
	sw_buf b = ss_out_buf(s);
	sp_enc_checkpoint(&b, s->seq);
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		return e;
	if ((e = ss_expect(s, SP_CHECKPOINTED, timeout, r)))
		return e;
	if (r->u.checkpointed.seq != s->seq)
		return ss_fail(s, STRAP_E_PROTOCOL, "CHECKPOINTED for seq %llu, asked for %llu",
			       (unsigned long long)r->u.checkpointed.seq, (unsigned long long)s->seq);
	s->checkpoints++;
	return STRAP_OK;
}

int strap_session_checkpoint(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	sp_reply r;
	int e = exchange(s, s->stall_timeout, &r);
	if (!e && (e = write_checkpoint(s, &r)))
		s->checkpoints--; /* counted once its file is written */
	pthread_mutex_unlock(&s->mu);
	return e;
}

int strap__session_checkpoint_exchange(strap_session *s, double timeout, uint64_t out[7])
{
	if (!s || !out)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	sp_reply r;
	int e = exchange(s, timeout > 0 ? timeout : (s->stall_timeout > 60 ? s->stall_timeout : 60), &r);
	if (!e) {
		out[0] = r.u.checkpointed.seq;
		out[1] = r.u.checkpointed.offset;
		out[2] = r.u.checkpointed.packets;
		out[3] = r.u.checkpointed.drops;
		out[4] = r.u.checkpointed.tokens;
		out[5] = r.u.checkpointed.last_offset;
		out[6] = r.u.checkpointed.last_crc;
	}
	pthread_mutex_unlock(&s->mu);
	return e;
}

/* Read and check the checkpoint file (sck_parse) and that it is this capture's. */
int ss_load_checkpoint(strap_session *s, sck_checkpoint *out)
{
	int fd = open(s->ckpt_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: %s", s->ckpt_path, strerror(errno));
	/* libstrap writes no 1.3.1 token list, so its own checkpoints fit the message buffer */
	char *buf = s->sbuf;
	ssize_t n = read(fd, buf, SP_MAX_MESSAGE);
	close(fd);
	if (n < 0 || n >= SP_MAX_MESSAGE)
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s is not a file of at most %d bytes", s->ckpt_path,
			       SP_MAX_MESSAGE - 1);
	sck_checkpoint c;
	char why[256];
	if (sck_parse(buf, (size_t)n, &c, why, sizeof why))
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: %s", s->ckpt_path, why);
	c.created = c.tokens = (sj_val){NULL, 0}; /* spans into the buffer, reused next */
	if (strcmp(c.fingerprint, s->fingerprint) != 0)
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: fingerprint is not this capture's (\"%s\")",
			       s->ckpt_path, s->fingerprint);
	*out = c;
	return STRAP_OK;
}
