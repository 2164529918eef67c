/* CHECKPOINT and the checkpoint file of docs/CHECKPOINTS.md 2-3: the request, the file written
 * once strapd has made every event durable (temp file, fsync, rename, directory fsync), and
 * its reading and checks on resume. */
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

int ss_fsync_dir(const char *path)
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
	char created[64];
	rfc3339(created, sizeof created);
	sw_buf b = ss_out_buf(s); /* the send buffer is free between messages */
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
		return ss_fail(s, STRAP_E_TOO_LARGE, "checkpoint file exceeds %d bytes", SP_MAX_MESSAGE);
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", s->ckpt_path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0)
		return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: open: %s", tmp, strerror(errno));
	size_t done = 0;
	while (done < b.n) {
		ssize_t w = write(fd, b.p + done, b.n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			int er = errno;
			close(fd);
			unlink(tmp);
			return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: write: %s", tmp, strerror(er));
		}
		done += (size_t)w;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		int er = errno;
		unlink(tmp);
		return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: fsync: %s", tmp, strerror(er));
	}
	if (rename(tmp, s->ckpt_path) != 0) {
		int er = errno;
		unlink(tmp);
		return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: rename: %s", s->ckpt_path, strerror(er));
	}
	if (ss_fsync_dir(s->ckpt_path) != 0)
		return ss_fail(s, STRAP_E_SYSTEM, "checkpoint %s: fsync of its directory: %s", s->ckpt_path,
			       strerror(errno));
	return STRAP_OK;
}

int strap_session_checkpoint(strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&s->mu);
	int e = ss_check(s);
	if (e || (e = ss_publish_all(s, "CHECKPOINT")))
		goto out;
	sw_buf b = ss_out_buf(s);
	sp_enc_checkpoint(&b, s->seq);
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		goto out;
	sp_reply r;
	if ((e = ss_expect(s, SP_CHECKPOINTED, s->stall_timeout, &r)))
		goto out;
	if (r.u.checkpointed.seq != s->seq) {
		e = ss_fail(s, STRAP_E_PROTOCOL, "CHECKPOINTED for seq %llu, asked for %llu",
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

static int why_fail(char *why, size_t whylen, const char *fmt, const char *arg)
{
	if (why && whylen)
		snprintf(why, whylen, fmt, arg);
	return STRAP_E_CHECKPOINT;
}

/* The rules of internal/checkpoint Parse and checkpoint.py's Checkpoint.parse; the golden
 * files in testdata/checkpoint hold all three to the same facts (tests/test_checkpoint_golden.c). */
int sc_parse_checkpoint(const char *buf, size_t n, sc_checkpoint *c, char *why, size_t whylen)
{
	memset(c, 0, sizeof *c);
	c->listed_tokens = -1;
	char err[128];
	if (n > SC_MAX_SIZE)
		return why_fail(why, whylen, "%s", "larger than a checkpoint may be (64 MiB)");
	if (!sj_validate(buf, n, err, sizeof err))
		return why_fail(why, whylen, "not JSON: %s", err);
	sj_val doc = {buf, n}, v;
	while (doc.n && (*doc.p == ' ' || *doc.p == '\t' || *doc.p == '\n' || *doc.p == '\r'))
		doc.p++, doc.n--;
	if (sj_kind(doc) != '{')
		return why_fail(why, whylen, "%s", "not a JSON object");
	static const char *const required[] = {"format",     "version",  "fingerprint",        "stream_offset",
					       "packets",    "last_seq", "last_packet_offset", "last_packet_crc",
					       "token_count"};
	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
		if (!sj_get(doc, required[i], &v) || sj_kind(v) == 'z')
			return why_fail(why, whylen, "missing field \"%s\"", required[i]);
	char str[64];
	bool full;
	sj_get(doc, "format", &v);
	if (!sj_str(v, str, sizeof str, &full) || !full || strcmp(str, "strap-checkpoint") != 0)
		return why_fail(why, whylen, "%s", "format is not \"strap-checkpoint\"");
	uint64_t ver;
	sj_get(doc, "version", &v);
	if (!sj_u64(v, &ver) || ver != 1)
		return why_fail(why, whylen, "%s", "version is not 1");
	sj_get(doc, "fingerprint", &v);
	if (!sj_str(v, c->fingerprint, sizeof c->fingerprint, &full) || !full)
		return why_fail(why, whylen, "%s", "fingerprint is not a string (of at most 1023 bytes)");
	if (sj_get(doc, "created", &v) && sj_kind(v) != 'z' && sj_kind(v) != '"')
		return why_fail(why, whylen, "%s", "created is not a string");
	if (sj_get(doc, "stream", &v) && sj_kind(v) != 'z' && (!sj_str(v, c->stream, sizeof c->stream, &full) || !full))
		return why_fail(why, whylen, "%s", "stream is not a string (of at most 4095 bytes)");
	struct {
		const char *k;
		uint64_t *dst;
		uint64_t max;
		bool required;
	} f[] = {{"stream_offset", &c->stream_offset, INT64_MAX, true},
		 {"packets", &c->packets, UINT64_MAX, true},
		 {"drops", &c->drops, UINT64_MAX, false},
		 {"last_seq", &c->last_seq, UINT64_MAX, true},
		 {"last_packet_offset", &c->last_packet_offset, INT64_MAX, true},
		 {"last_packet_crc", &c->last_packet_crc, UINT32_MAX, true},
		 {"token_count", &c->token_count, UINT64_MAX, true},
		 {"forward_count", &c->forward_count, UINT64_MAX, false}};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		if (!sj_get(doc, f[i].k, &v) || (!f[i].required && sj_kind(v) == 'z'))
			continue;
		if (!sj_u64(v, f[i].dst) || *f[i].dst > f[i].max)
			return why_fail(why, whylen, "%s is not an unsigned integer in range", f[i].k);
	}
	if (c->stream_offset == 0 || (c->packets == 0) != (c->last_seq == 0) || c->last_seq < c->packets ||
	    (c->packets && (c->last_packet_offset == 0 || c->last_packet_offset >= c->stream_offset)) ||
	    c->drops > c->packets || c->token_count > c->packets)
		return why_fail(why, whylen, "%s", "inconsistent numbers");
	if (sj_get(doc, "token_log", &v) && sj_kind(v) != 'z') {
		sj_val t;
		uint64_t *dst[] = {&c->log_tokens, &c->log_bytes, &c->log_crc32c};
		static const char *const keys[] = {"tokens", "bytes", "crc32c"};
		if (sj_kind(v) != '{')
			return why_fail(why, whylen, "%s", "token_log is not an object");
		for (int i = 0; i < 3; i++)
			if (!sj_get(v, keys[i], &t) || !sj_u64(t, dst[i]))
				return why_fail(why, whylen, "token_log.%s is not an unsigned integer", keys[i]);
		if (c->log_tokens != c->token_count || c->log_bytes > INT64_MAX || c->log_bytes < c->log_tokens ||
		    (c->log_tokens == 0) != (c->log_bytes == 0) || c->log_crc32c > UINT32_MAX)
			return why_fail(why, whylen, "%s", "token_log does not fit token_count");
		c->has_token_log = true;
	}
	if (sj_get(doc, "tokens", &v) && sj_kind(v) == '[') {
		const char *it = v.p;
		sj_val e;
		c->listed_tokens = 0;
		while (sj_array_next(v, &it, &e))
			c->listed_tokens++;
	}
	return STRAP_OK;
}

/* Read and check the checkpoint file (sc_parse_checkpoint) and that it is this capture's. */
int ss_load_checkpoint(strap_session *s, sc_checkpoint *out)
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
	sc_checkpoint c;
	char why[128];
	if (sc_parse_checkpoint(buf, (size_t)n, &c, why, sizeof why))
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: %s", s->ckpt_path, why);
	if (strcmp(c.fingerprint, s->fingerprint) != 0)
		return ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s: fingerprint is not this capture's (\"%s\")",
			       s->ckpt_path, s->fingerprint);
	*out = c;
	return STRAP_OK;
}

/* ----- a complete stream is never resumed (docs/CHECKPOINTS.md 4) ----- */

uint64_t ss_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

bool ss_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		done += (size_t)r;
	}
	return true;
}

int ss_refuse_complete(strap_session *s, uint64_t from, bool *complete)
{
	if (complete)
		*complete = false;
	struct stat st;
	if (fstat(s->out_fd, &st) != 0)
		return ss_fail(s, STRAP_E_SYSTEM, "stat %s: %s", s->output_path, strerror(errno));
	uint64_t size = (uint64_t)st.st_size, off = from;
	uint8_t h[SS_PKT_FIXED];
	if (off == 0) { /* the first packet follows the file header (STREAM_FORMAT.md 2) */
		if (size < 24 || !ss_pread_all(s->out_fd, h, 24, 0) || memcmp(h, "STRAPSTM", 8) != 0)
			return STRAP_OK; /* no strap stream: nothing of a capture to keep */
		off = (24 + ss_le(h + 12, 4) + 7) / 8 * 8;
	}
	/* Packet headers only (no payload is read), up to the END: a torn or unknown packet
	 * ends the walk, as does an INDEX before any END. */
	uint64_t packets = 0;
	while (off + sizeof h <= size && ss_pread_all(s->out_fd, h, sizeof h, off) && memcmp(h, "SPKT", 4) == 0) {
		uint64_t type = ss_le(h + 4, 2), ndim = h[7], hlen = ss_le(h + 8, 4), name_len = ss_le(h + 12, 2),
			 meta_len = ss_le(h + 16, 4), stored = ss_le(h + 56, 8);
		if (hlen != SS_PKT_FIXED + 8 * ndim + name_len + meta_len || stored > size ||
		    off + hlen + stored > size)
			return STRAP_OK;
		if (type == 4)
			return STRAP_OK;
		if (type == 5) {
			if (meta_len >= SP_MAX_MESSAGE ||
			    !ss_pread_all(s->out_fd, s->sbuf, meta_len, off + hlen - meta_len))
				return STRAP_OK;
			char why[64], status[32];
			sj_val v;
			if (!sj_validate(s->sbuf, meta_len, why, sizeof why) ||
			    !sj_get((sj_val){s->sbuf, meta_len}, "status", &v) ||
			    !sj_str(v, status, sizeof status, NULL) || strcmp(status, "complete") != 0)
				return STRAP_OK;
			if (complete) {
				*complete = true;
				return STRAP_OK;
			}
			return ss_fail(
				s, STRAP_E_CHECKPOINT,
				"%s is a complete capture (its stream ends with END, status complete, at offset %llu): "
				"there is nothing to resume, and resuming would cut %llu bytes of it (%llu packets, "
				"the "
				"END and INDEX); nothing was changed: capture again to a new output_path",
				s->output_path, (unsigned long long)off, (unsigned long long)(size - from),
				(unsigned long long)packets);
		}
		packets++;
		off += hlen + stored;
	}
	return STRAP_OK;
}
