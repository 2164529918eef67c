/* libFuzzer target: the resume point's scan (srs_resume_point, common/strap_resume.c), which
 * libstrap and the Python client both find their resume points with, over a stream file of the
 * fuzzer's bytes (a memfd). Whatever the bytes, the scan ends with a point inside the file or a
 * reason; a point it finds is one it accepts back as a checkpoint (the same point, the same
 * tokens); a job's limit below it keeps exactly that many tokens; a checkpoint with one of the
 * fields the scan holds to the stream changed is refused. Seeds: the golden streams of testdata/stream. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "strap_resume.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct count {
	uint64_t n;
	uint64_t sum; /* of the token ids, to compare two scans' tokens */
} count;

static int counted(void *user, const srs_token *t)
{
	count *c = user;
	if (t->index != c->n)
		__builtin_trap(); /* tokens come in order from 0 */
	if (t->text_json.p && t->text == NULL && sj_kind(t->text_json) == '"')
		__builtin_trap(); /* a string the scan could not unescape */
	c->n++;
	c->sum = c->sum * 31 + (t->id_is_int ? (uint64_t)t->id_int : 7);
	return 0;
}

static int scan(int fd, const sck_checkpoint *ck, const char *fp, int64_t limit, bool prefix_only, srs_result *r,
		count *c)
{
	char why[1024];
	memset(c, 0, sizeof *c);
	srs_params p = {.fd = fd,
			.path = "fuzz.strap",
			.ck = ck,
			.want_fingerprint = fp,
			.limit = limit,
			.prefix_only = prefix_only,
			.on_token = counted,
			.user = c};
	int e = srs_resume_point(&p, r, why, sizeof why);
	if (e != SRS_OK && (!why[0] || e == SRS_IO || e == SRS_NOMEM || e == SRS_STOPPED))
		__builtin_trap(); /* every refusal says why; a memfd never fails to read */
	if (e == SRS_OK && (r->stream_offset > r->size || r->token_count != c->n || r->packets < r->token_count))
		__builtin_trap();
	return e;
}

/* The stream header's fingerprint, so that the scan gets past it (without one: ""). */
static void header_fingerprint(const uint8_t *data, size_t size, char *fp, size_t cap)
{
	fp[0] = 0;
	if (size < 24)
		return;
	uint64_t n = (uint64_t)data[12] | (uint64_t)data[13] << 8 | (uint64_t)data[14] << 16 | (uint64_t)data[15] << 24;
	sj_val m = {(const char *)data + 24, (size_t)n}, cm, v;
	bool full = false;
	if (n > size - 24 || !sj_validate(m.p, m.n, NULL, 0) || !sj_get(m, "client_metadata", &cm) ||
	    !sj_get(cm, "fingerprint", &v) || !sj_str(v, fp, cap, &full) || !full)
		fp[0] = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz_resume", MFD_CLOEXEC);
	if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size))
		abort();
	char fp[1024];
	header_fingerprint(data, size, fp, sizeof fp);
	srs_result r, r2;
	count c, c2;
	int e = scan(fd, NULL, fp, -1, false, &r, &c);
	if (e != SRS_OK || r.source == SRS_EMPTY)
		goto out;
	/* the point found, as a checkpoint: accepted, the same point and tokens */
	sck_checkpoint ck = {0};
	snprintf(ck.fingerprint, sizeof ck.fingerprint, "%s", fp);
	ck.stream_offset = r.stream_offset;
	ck.packets = r.packets;
	ck.drops = r.drops;
	ck.last_seq = r.last_seq;
	ck.last_packet_offset = r.last_packet_offset;
	ck.last_packet_crc = r.last_packet_crc;
	ck.token_count = r.token_count;
	ck.forward_count = r.forward_count;
	if (scan(fd, &ck, fp, -1, false, &r2, &c2) != SRS_OK || r2.stream_offset != r.stream_offset ||
	    r2.token_count != r.token_count || c2.sum != c.sum || r2.source != SRS_CHECKPOINT)
		__builtin_trap();
	if (scan(fd, &ck, NULL, -1, true, &r2, &c2) != SRS_OK || c2.n != c.n || c2.sum != c.sum)
		__builtin_trap();
	/* a job's limit below it: exactly that many tokens, walked again from the first packet */
	if (r.token_count) {
		int64_t lim = (int64_t)(r.token_count / 2);
		if (scan(fd, &ck, fp, lim, false, &r2, &c2) != SRS_OK || r2.token_count != (uint64_t)lim ||
		    r2.stream_offset > r.stream_offset)
			__builtin_trap();
	}
	/* one field the scan holds to the stream changed (the first six; the last packet's only when
	 * there is one): refused */
	uint8_t pick = size ? data[size - 1] : 0;
	uint64_t *fields[] = {&ck.stream_offset,   &ck.packets,     &ck.last_seq,      &ck.last_packet_offset,
			      &ck.last_packet_crc, &ck.token_count, &ck.forward_count, &ck.drops};
	*fields[pick % 8] ^= 1 + (pick >> 3);
	e = scan(fd, &ck, fp, -1, false, &r2, &c2);
	if (e == SRS_OK && pick % 8 < 6 && r.packets > 0)
		__builtin_trap();
out:
	close(fd);
	return 0;
}
