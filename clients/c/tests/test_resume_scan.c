/* The resume point's scan (common/strap_resume.c), the one both clients use, on files alone (no
 * strapd): Go's golden stream with checkpoints after n of its packets — the prefix and its token
 * given back, every packet of it CRC-checked (a byte flipped before the checkpoint's last packet
 * is refused, which libstrap's own scan, reading the last packet only, let through), each count
 * and field of the checkpoint held to the stream, a finished capture refused without a checkpoint
 * and resumed with one, the intact run past an older checkpoint, the job's limit, an empty file;
 * then a stream built here whose start is freed (a hole punched, as strapd's
 * --upload-free-local does): its tokens from 1.3.1's list or the token log, each refused when it
 * does not hold what the checkpoint says. The messages are the Python client's
 * (clients/python/tests/test_resume_prefix.py, test_upload_free.py match the same words). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strap_resume.h"

static char dir[] = "/tmp/strap-resume-scan-XXXXXX";
static uint32_t table[256];
static const char *want_fp = "abcdef"; /* this capture's fingerprint */

static uint32_t crc32c(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;
	crc = ~crc;
	while (n--)
		crc = table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

typedef struct buf {
	uint8_t *p;
	size_t n;
} buf;

static void write_file(const char *path, const buf *b)
{
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(b->p, 1, b->n, f) == b->n && fclose(f) == 0, "write %s", path);
}

/* The packets of a stream: offsets, ends, types. */
typedef struct pk {
	uint64_t off, end, seq, type, crc;
} pk;

static int packets(const buf *b, pk *out, int max)
{
	uint64_t off = (24 + get_le(b->p + 12, 4) + 7) / 8 * 8;
	int n = 0;
	while (off + 96 <= b->n && n < max) {
		const uint8_t *h = b->p + off;
		uint64_t end = off + get_le(h + 8, 4) + get_le(h + 56, 8);
		out[n++] = (pk){off, end, get_le(h + 24, 8), get_le(h + 4, 2), get_le(h + 20, 4)};
		off = end;
	}
	return n;
}

/* A checkpoint after the first n packets. */
static sck_checkpoint after(const buf *b, int n, const char *fp)
{
	pk p[64];
	int all = packets(b, p, 64);
	CHECK(n >= 1 && n <= all, "checkpoint after %d of %d packets", n, all);
	sck_checkpoint c = {0};
	snprintf(c.fingerprint, sizeof c.fingerprint, "%s", fp);
	c.stream_offset = p[n - 1].end;
	c.packets = (uint64_t)n;
	c.last_seq = p[n - 1].seq;
	c.last_packet_offset = p[n - 1].off;
	c.last_packet_crc = p[n - 1].crc;
	for (int i = 0; i < n; i++)
		c.token_count += p[i].type == 3, c.drops += p[i].type == 2;
	return c;
}

typedef struct toks {
	int n;
	int64_t id[64];
	char text[64][16];
	bool listed;
} toks;

static int keep(void *user, const srs_token *t)
{
	toks *k = user;
	if (t->index != (uint64_t)k->n || k->n >= 64)
		return 1;
	k->id[k->n] = t->id_is_int ? t->id_int : -1;
	snprintf(k->text[k->n], sizeof k->text[0], "%.*s", (int)t->text_len, t->text ? t->text : "");
	k->listed = t->listed;
	k->n++;
	return 0;
}

/* srs_resume_point on path; the result, the tokens and the message. */
static int run(const char *path, const sck_checkpoint *ck, const char *ck_path, const char *list, int64_t limit,
	       bool refuse, srs_result *r, toks *k, char *why, size_t whylen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0, "open %s", path);
	memset(k, 0, sizeof *k);
	srs_params p = {.fd = fd,
			.path = path,
			.ck = ck,
			.ck_path = ck_path,
			.tokens131 = list,
			.tokens131_len = list ? strlen(list) : 0,
			.want_fingerprint = want_fp,
			.limit = limit,
			.refuse_complete = refuse,
			.on_token = keep,
			.user = k};
	int e = srs_resume_point(&p, r, why, whylen);
	close(fd);
	return e;
}

static void refused(const char *what, const char *path, const sck_checkpoint *ck, const char *ck_path, const char *list,
		    int64_t limit, const char *want)
{
	srs_result r;
	toks k;
	char why[2048];
	int e = run(path, ck, ck_path, list, limit, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_REFUSED && strstr(why, want), "%s: rc %d, \"%s\" (want \"%s\")", what, e, why, want);
}

/* Go's golden stream with the fingerprint "abcdef" in its client metadata (same length: every
 * packet keeps its offset), as clients/python/tests/test_resume_prefix.py makes it. */
static buf golden(void)
{
	char path[600];
	snprintf(path, sizeof path, "%s/testdata/stream/none_basic.strap", th_env("STRAP_REPO"));
	FILE *f = fopen(path, "rb");
	CHECK(f != NULL, "open %s", path);
	buf b = {malloc(1 << 16), 0};
	b.n = fread(b.p, 1, 1 << 16, f);
	fclose(f);
	uint64_t meta_len = get_le(b.p + 12, 4);
	char *at = memmem(b.p + 24, meta_len, "\"client\":\"golden-test\"", 22);
	CHECK(at != NULL, "the golden stream's client metadata changed");
	memcpy(at, "\"fingerprint\":\"abcdef\"", 22);
	put_le(b.p + 16, crc32c(crc32c(0, b.p, 16), b.p + 24, meta_len), 4);
	return b;
}

static void golden_cases(void)
{
	char path[700], cut[700], empty[700], why[2048];
	snprintf(path, sizeof path, "%s/golden.strap", dir);
	snprintf(cut, sizeof cut, "%s/unfinished.strap", dir);
	snprintf(empty, sizeof empty, "%s/empty.strap", dir);
	buf g = golden();
	write_file(path, &g);
	srs_result r;
	toks k;

	/* four TENSOR packets, then TOKEN 0: kept with its token; the capture finished, but its
	 * checkpoint is beside it (stopped by an error): it resumes at the checkpoint */
	sck_checkpoint c5 = after(&g, 5, "abcdef");
	int e = run(path, &c5, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.source == SRS_CHECKPOINT && r.stream_offset == 978 && !r.complete,
	      "checkpoint 5: rc %d source %d offset %" PRIu64 ": %s", e, r.source, r.stream_offset, why);
	CHECK(k.n == 1 && k.id[0] == 42 && strcmp(k.text[0], "hi") == 0 && !k.listed, "checkpoint 5: tokens %d", k.n);

	/* each field held to the stream */
	sck_checkpoint c = c5;
	c.stream_offset -= 8;
	refused("offset inside a packet", path, &c, NULL, NULL, -1, "not the end of a packet");
	c = c5, c.packets++;
	refused("packets", path, &c, NULL, NULL, -1, "5 packets before the offset, checkpoint says 6");
	c = c5, c.packets = 5, c.last_packet_crc ^= 1;
	refused("crc", path, &c, NULL, NULL, -1, "last packet CRC");
	c = c5, c.last_seq++;
	refused("seq", path, &c, NULL, NULL, -1, "last packet has seq");
	c = c5, c.token_count = 0;
	refused("tokens", path, &c, NULL, NULL, -1, "1 tokens before the offset, checkpoint says 0");
	c = c5, snprintf(c.fingerprint, sizeof c.fingerprint, "other");
	refused("fingerprint", path, &c, NULL, NULL, -1,
		"fingerprint differs: checkpoint 'other', stream header 'abcdef'");
	c = c5, c.stream_offset = (uint64_t)1 << 40;
	refused("shorter", path, &c, NULL, NULL, -1, "shorter than the checkpointed offset");

	/* no checkpoint: a finished capture is refused, naming the cut; reported when not refused */
	e = run(path, NULL, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_COMPLETE && strstr(why, "is a complete capture") && strstr(why, "Nothing was changed") &&
		      strstr(why, "back to token 1") && r.cut_bytes == g.n - 978,
	      "complete: rc %d cut %" PRIu64 ": %s", e, r.cut_bytes, why);
	e = run(path, NULL, NULL, NULL, -1, false, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.complete && r.token_count == 1 && k.n == 1, "complete, reported: rc %d %d", e,
	      r.complete);

	/* a byte flipped inside the second packet: a prefix before it is kept, one across it is
	 * refused (every packet is CRC-checked, not only the last) */
	buf d = {malloc(g.n), g.n};
	memcpy(d.p, g.p, g.n);
	d.p[442 + 100] ^= 0xff;
	write_file(path, &d);
	sck_checkpoint c1 = after(&g, 1, "abcdef");
	e = run(path, &c1, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.stream_offset == c1.stream_offset && k.n == 0, "damaged after checkpoint 1: %d %s", e,
	      why);
	refused("damaged inside the prefix", path, &c5, NULL, NULL, -1,
		"no valid packet at offset 442 (before the checkpointed offset 978)");
	refused("damaged inside the prefix", path, &c5, NULL, NULL, -1, "packet CRC mismatch");

	/* without END: the intact run up to the last TOKEN, past an older checkpoint */
	buf u = {g.p, 0};
	pk p[64];
	int n = packets(&g, p, 64);
	for (int i = 0; i < n; i++)
		if (p[i].type == 5)
			u.n = p[i].off;
	CHECK(u.n > 978, "no END in the golden stream");
	write_file(cut, &u);
	e = run(cut, NULL, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.source == SRS_STREAM && r.stream_offset == 978 && r.packets == 5 && r.last_seq == 5 &&
		      r.token_count == 1 && r.forward_count == 1 && r.last_packet_offset == 842 && k.n == 1,
	      "unfinished: rc %d offset %" PRIu64 " packets %" PRIu64 ": %s", e, r.stream_offset, r.packets, why);
	sck_checkpoint c2 = after(&g, 2, "abcdef");
	e = run(cut, &c2, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.source == SRS_STREAM && r.stream_offset == 978 && k.n == 1 && k.id[0] == 42,
	      "past checkpoint 2: rc %d source %d: %s", e, r.source, why);
	/* the job's limit 0, before the checkpoint: the first packet, no token given */
	e = run(cut, &c5, NULL, NULL, 0, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.stream_offset == 288 && r.token_count == 0 && r.packets == 0 && k.n == 0,
	      "limit 0: rc %d offset %" PRIu64 ": %s", e, r.stream_offset, why);
	want_fp = "other";
	refused("another capture", cut, NULL, NULL, NULL, -1,
		"fingerprint differs: stream header 'abcdef', this capture (config + model) 'other'");
	want_fp = "abcdef";

	/* an empty file and no checkpoint: a capture from token 0; with one, refused */
	buf z = {g.p, 0};
	write_file(empty, &z);
	e = run(empty, NULL, NULL, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.source == SRS_EMPTY && r.stream_offset == 0, "empty: rc %d source %d", e, r.source);
	refused("empty with a checkpoint", empty, &c5, NULL, NULL, -1, "shorter than the checkpointed offset");
	buf notes = {(uint8_t *)"my notes, not a capture\n", 24};
	write_file(empty, &notes);
	refused("not a stream", empty, NULL, NULL, NULL, -1,
		"there is no checkpoint and the stream header is not valid either");
	free(g.p);
	free(d.p);
}

/* ----- a stream built here, its start freed ----- */

static void add_packet(buf *b, int type, uint64_t seq, uint64_t step, uint64_t fwd, const char *meta, size_t payload)
{
	size_t ml = strlen(meta), ndim = type == 1 ? 1 : 0, name_len = type == 1 ? 1 : 0;
	size_t hl = 96 + 8 * ndim + name_len + ml;
	uint8_t *h = b->p + b->n;
	memset(h, 0, hl + payload);
	memcpy(h, "SPKT", 4);
	put_le(h + 4, (uint64_t)type, 2);
	h[6] = type == 1 ? 6 : 0; /* uint8 */
	h[7] = (uint8_t)ndim;
	put_le(h + 8, hl, 4);
	put_le(h + 12, name_len, 2);
	put_le(h + 16, ml, 4);
	put_le(h + 24, seq, 8);
	put_le(h + 32, step, 8);
	put_le(h + 40, fwd, 8);
	put_le(h + 48, payload, 8);
	put_le(h + 56, payload, 8);
	put_le(h + 72, payload, 8);
	if (ndim)
		put_le(h + 96, payload, 8), h[104] = 'm';
	memcpy(h + 96 + 8 * ndim + name_len, meta, ml);
	for (size_t i = 0; i < payload; i++)
		h[hl + i] = (uint8_t)(i * 7 + seq);
	put_le(h + 20, crc32c(0, h, hl + payload), 4);
	b->n += hl + payload;
}

static void freed_cases(void)
{
	char path[700], ckp[700], log[800], why[2048];
	snprintf(path, sizeof path, "%s/freed.strap", dir);
	snprintf(ckp, sizeof ckp, "%s/freed.strap.ckpt.json", dir);
	snprintf(log, sizeof log, "%s.tokens.jsonl", ckp);
	buf b = {calloc(1, 1 << 20), 0};
	const char *meta = "{\"client_metadata\":{\"fingerprint\":\"abcdef\"}}";
	size_t ml = strlen(meta);
	memcpy(b.p, "STRAPSTM", 8);
	put_le(b.p + 8, 2, 2);
	put_le(b.p + 12, ml, 4);
	memcpy(b.p + 24, meta, ml);
	put_le(b.p + 16, crc32c(crc32c(0, b.p, 16), b.p + 24, ml), 4);
	b.n = (24 + ml + 7) / 8 * 8;
	uint64_t seq = 1;
	char tm[128];
	for (int t = 0; t < 4; t++) {
		add_packet(&b, 1, seq++, (uint64_t)t, (uint64_t)t, "", 16 << 10);
		snprintf(tm, sizeof tm, "{\"token_id\":%d,\"text\":\"t%d\"}", 500 + t, t);
		add_packet(&b, 3, seq++, (uint64_t)t, 0, tm, 0);
	}
	write_file(path, &b);
	sck_checkpoint c = after(&b, 8, "abcdef");
	int fd = open(path, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0, "open %s", path);
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 32 << 10) != 0) {
		printf("resume_scan: no hole punching on %s: the freed cases are skipped\n", dir);
		close(fd);
		free(b.p);
		return;
	}
	uint64_t from = 0, to = 0;
	CHECK(srs_freed_range(fd, 0, b.n, &from, &to) == 1 && from == 4096 && to == (32 << 10) + 4096,
	      "freed range [%" PRIu64 ", %" PRIu64 ")", from, to);
	close(fd);
	const char *list = "[{\"token_index\":0,\"token_id\":500,\"token_text\":\"t0\",\"position\":0},"
			   "{\"token_index\":1,\"token_id\":501,\"token_text\":\"t1\"},"
			   "{\"token_index\":2,\"token_id\":502,\"token_text\":\"t2\"},"
			   "{\"token_index\":3,\"token_id\":503,\"token_text\":\"t3\"}]";
	srs_result r;
	toks k;
	int e = run(path, &c, NULL, list, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && r.freed && r.freed_from == 4096 && k.n == 4 && k.listed && k.id[3] == 503 &&
		      strcmp(k.text[2], "t2") == 0 && r.token_count == 4,
	      "freed, 1.3.1 list: rc %d, %d tokens: %s", e, k.n, why);
	refused("freed, nothing listed", path, &c, NULL, NULL, -1, "neither a token log nor 1.3.1's 'tokens' list");
	refused("freed, job limit", path, &c, NULL, list, 2, "job-wide resume point (2 tokens)");
	const char *other =
		"[{\"token_index\":0,\"token_id\":500},{\"token_index\":1,\"token_id\":501},"
		"{\"token_index\":2,\"token_id\":502},{\"token_index\":3,\"token_id\":9,\"token_text\":\"t3\"}]";
	refused("freed, another last token", path, &c, NULL, other, -1, "is not the checkpoint's last token");
	refused("freed, list numbering", path, &c, NULL, "[{\"token_index\":1}]", -1, "is not numbered 0..n-1");
	refused("freed, list count", path, &c, NULL, "[{\"token_index\":0,\"token_id\":500}]", -1,
		"holds 1 tokens, its token_count says 4");

	/* the token log: its first bytes vouched for by their CRC32C */
	char lines[512];
	size_t ln = 0;
	for (int t = 0; t < 4; t++)
		ln += (size_t)snprintf(
			lines + ln, sizeof lines - ln,
			"{\"token_index\": %d, \"token_id\": %d, \"token_text\": \"t%d\", \"position\": %d}\n", t,
			500 + t, t, t);
	buf lb = {(uint8_t *)lines, ln};
	write_file(log, &lb);
	c.has_token_log = true;
	c.log_tokens = 4;
	c.log_bytes = ln;
	c.log_crc32c = crc32c(0, lines, ln);
	e = run(path, &c, ckp, NULL, -1, true, &r, &k, why, sizeof why);
	CHECK(e == SRS_OK && k.n == 4 && k.listed && k.id[1] == 501 && strcmp(k.text[3], "t3") == 0,
	      "freed, token log: rc %d, %d tokens: %s", e, k.n, why);
	/* the log alone (srs_token_log, Python's checkpoint.read_token_log): the same tokens; bytes
	 * past log_bytes are not read; a damaged log is refused before any token is given */
	toks only = {0};
	srs_params lp = {.fd = -1, .path = path, .ck = &c, .ck_path = ckp, .on_token = keep, .user = &only};
	e = srs_token_log(&lp, why, sizeof why);
	CHECK(e == SRS_OK && only.n == 4 && only.listed && only.id[2] == 502 && strcmp(only.text[0], "t0") == 0,
	      "token log alone: rc %d, %d tokens: %s", e, only.n, why);
	sck_checkpoint fewer = c;
	fewer.log_tokens = 3, fewer.log_bytes = (size_t)(strstr(lines, "{\"token_index\": 3") - lines);
	fewer.log_crc32c = crc32c(0, lines, fewer.log_bytes);
	only = (toks){0}, lp.ck = &fewer;
	e = srs_token_log(&lp, why, sizeof why);
	CHECK(e == SRS_OK && only.n == 3, "token log, a prefix of it: rc %d, %d tokens: %s", e, only.n, why);
	fewer.log_crc32c ^= 1;
	only = (toks){0};
	e = srs_token_log(&lp, why, sizeof why);
	CHECK(e == SRS_REFUSED && only.n == 0 && strstr(why, "CRC32C"), "token log crc alone: rc %d %d: %s", e, only.n,
	      why);
	lp.ck = NULL;
	e = srs_token_log(&lp, why, sizeof why);
	CHECK(e == SRS_REFUSED && strstr(why, "has no token log"), "no checkpoint: rc %d: %s", e, why);
	sck_checkpoint bad = c;
	bad.log_crc32c ^= 1;
	refused("token log crc", path, &bad, ckp, NULL, -1, "CRC32C");
	bad = c, bad.log_bytes += 10;
	refused("token log short", path, &bad, ckp, NULL, -1, "vouches for");
	bad = c, bad.log_tokens = 3;
	refused("token log lines", path, &bad, ckp, NULL, -1, "holds 4 lines");
	refused("no token log", path, &c, NULL, NULL, -1, "the checkpoint has no token log");
	/* freed bytes up to the checkpoint's last packet: nothing can be checked */
	fd = open(path, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, c.last_packet_offset) == 0,
	      "punch up to the last packet");
	close(fd);
	refused("freed up to the last packet", path, &c, ckp, NULL, -1, "up to or past the checkpoint's last packet");
	refused("freed, no checkpoint", path, NULL, NULL, NULL, -1, "there is no checkpoint to resume from");
	free(b.p);
}

int main(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		table[i] = c;
	}
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	golden_cases();
	freed_cases();
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	th_run(cmd, NULL, 0);
	return th_done("resume_scan");
}
