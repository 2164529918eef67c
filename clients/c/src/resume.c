/* The resume point of docs/CHECKPOINTS.md 4, as the Python client's checkpoint.resume_point finds
 * it: the checkpoint is the floor, and past it (from the first packet without one) the stream's
 * intact run of packets — each whole, its CRC32C right, a TENSOR, DROP or TOKEN packet with the
 * TOKENs numbered on — is kept up to its last TOKEN packet, or up to TOKEN limit - 1 (a job's
 * common point, docs/DISTRIBUTED.md D3). Reads the output only; open.c cuts nothing itself
 * (strapd cuts the stream at OPEN's append_at). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session.h"

/* ----- CRC32C (Castagnoli), as every stream packet carries it ----- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc_table[i] = c;
	}
}

/* Continue a CRC32C (start with 0) over n bytes. */
static uint32_t crc32c(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;
	crc = ~crc;
	while (n--)
		crc = crc_table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

enum { PKT_TENSOR = 1, PKT_DROP = 2, PKT_TOKEN = 3 };

/* One packet at off, whole and its CRC right: its fixed header in h, its length in *len. The
 * rest of the packet is read through s->sbuf (free while no message is being built). */
static bool read_packet(strap_session *s, uint64_t size, uint64_t off, uint8_t *h, uint64_t *len)
{
	if (off + SS_PKT_FIXED > size || !ss_pread_all(s->out_fd, h, SS_PKT_FIXED, off) || memcmp(h, "SPKT", 4) != 0)
		return false;
	uint64_t ndim = h[7], hlen = ss_le(h + 8, 4), name_len = ss_le(h + 12, 2), meta_len = ss_le(h + 16, 4),
		 stored = ss_le(h + 56, 8);
	if (ndim > 8 || hlen != SS_PKT_FIXED + 8 * ndim + name_len + meta_len || stored > size || off + hlen > size ||
	    off + hlen + stored > size || (h[15] & ~1u) != 0)
		return false;
	uint8_t fixed[SS_PKT_FIXED];
	memcpy(fixed, h, SS_PKT_FIXED);
	memset(fixed + 20, 0, 4); /* the CRC covers its own field as zero */
	uint32_t crc = crc32c(0, fixed, SS_PKT_FIXED);
	for (uint64_t at = off + SS_PKT_FIXED, end = off + hlen + stored; at < end;) {
		size_t n = end - at < SP_MAX_MESSAGE ? (size_t)(end - at) : SP_MAX_MESSAGE;
		if (!ss_pread_all(s->out_fd, s->sbuf, n, at))
			return false;
		crc = crc32c(crc, s->sbuf, n);
		at += n;
	}
	*len = hlen + stored;
	return crc == (uint32_t)ss_le(h + 20, 4);
}

/* The file header (STREAM_FORMAT.md 2): whole, its CRC right, its client metadata's fingerprint
 * this capture's; *first the first packet's offset. */
static int check_header(strap_session *s, uint64_t size, uint64_t *first)
{
	uint8_t h[24];
	if (size < 24 || !ss_pread_all(s->out_fd, h, 24, 0) || memcmp(h, "STRAPSTM", 8) != 0)
		return ss_fail(
			s, STRAP_E_CHECKPOINT,
			"%s is not a strap stream (no valid file header): there is nothing to resume, and it was "
			"left as it is",
			s->output_path);
	uint64_t meta_len = ss_le(h + 12, 4);
	if (24 + meta_len > size || ss_le(h + 20, 4) != 0)
		return ss_fail(s, STRAP_E_CHECKPOINT, "%s: its file header is cut or damaged", s->output_path);
	char *meta = malloc(meta_len + 1); /* open only: the header may hold a large metadata object */
	if (!meta)
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	int e = STRAP_OK;
	uint8_t zero[16];
	memcpy(zero, h, 16);
	if (!ss_pread_all(s->out_fd, meta, meta_len, 24) ||
	    crc32c(crc32c(0, zero, 16), meta, meta_len) != (uint32_t)ss_le(h + 16, 4)) {
		e = ss_fail(s, STRAP_E_CHECKPOINT, "%s: its file header fails its CRC32C check", s->output_path);
		goto out;
	}
	sj_val v = {meta, meta_len}, cm, fp;
	char got[1024], why[64];
	bool whole = false;
	if (!sj_validate(meta, meta_len, why, sizeof why) || !sj_get(v, "client_metadata", &cm) ||
	    !sj_get(cm, "fingerprint", &fp) || !sj_str(fp, got, sizeof got, &whole) || !whole)
		got[0] = 0, whole = false;
	if (!whole || strcmp(got, s->fingerprint) != 0)
		e = ss_fail(
			s, STRAP_E_CHECKPOINT,
			"fingerprint differs: stream header \"%s\", this capture \"%s\"; resume with the same model "
			"and capture config",
			whole ? got : "(none)", s->fingerprint);
	*first = (24 + meta_len + 7) / 8 * 8;
out:
	free(meta);
	return e;
}

/* Bytes of [from, to) freed after their upload (holes: SEEK_DATA lands past from). */
static bool freed_from(int fd, uint64_t from, uint64_t to)
{
	off_t d = lseek(fd, (off_t)from, SEEK_DATA);
	return from < to && d >= 0 && (uint64_t)d > from;
}

int ss_resume_point(strap_session *s, const sck_checkpoint *ck, int64_t limit, rs_point *pt, bool *keep)
{
	struct stat st;
	if (fstat(s->out_fd, &st) != 0)
		return ss_fail(s, STRAP_E_SYSTEM, "stat %s: %s", s->output_path, strerror(errno));
	uint64_t size = (uint64_t)st.st_size;
	memset(pt, 0, sizeof *pt);
	*keep = false;
	pthread_once(&crc_once, crc_init);
	if (!ck && size == 0) /* a client killed before strapd wrote the header: from token 0 */
		return STRAP_OK;
	uint64_t first = 0;
	int e = check_header(s, size, &first);
	if (e)
		return e;
	uint8_t h[SS_PKT_FIXED];
	uint64_t len;
	if (ck) {
		if (size < ck->stream_offset)
			return ss_fail(s, STRAP_E_CHECKPOINT,
				       "stream %s holds %llu bytes, less than the checkpoint's %llu", s->output_path,
				       (unsigned long long)size, (unsigned long long)ck->stream_offset);
		/* the checkpoint's last packet, whole and as it says, ends its prefix (strapd walks the
		 * whole prefix again at OPEN) */
		bool ok = ck->packets ? read_packet(s, size, ck->last_packet_offset, h, &len) &&
						ss_le(h + 24, 8) == ck->last_seq &&
						ss_le(h + 20, 4) == ck->last_packet_crc &&
						ck->last_packet_offset + len == ck->stream_offset
				      : ck->stream_offset == first;
		if (!ok)
			return ss_fail(
				s, STRAP_E_CHECKPOINT,
				"stream %s does not end the checkpoint's prefix as it says (last packet at %llu, seq "
				"%llu, ending at %llu)",
				s->output_path, (unsigned long long)ck->last_packet_offset,
				(unsigned long long)ck->last_seq, (unsigned long long)ck->stream_offset);
		*pt = (rs_point){.offset = ck->stream_offset,
				 .packets = ck->packets,
				 .drops = ck->drops,
				 .last_seq = ck->last_seq,
				 .last_crc = ck->last_packet_crc,
				 .last_offset = ck->last_packet_offset,
				 .tokens = ck->token_count,
				 .forwards = ck->forward_count};
		*keep = true;
	}
	if (!ck || (limit >= 0 && (uint64_t)limit < ck->token_count)) {
		/* from the first packet: none kept yet */
		if (freed_from(s->out_fd, first, ck ? ck->stream_offset : size))
			return ss_fail(s, STRAP_E_CHECKPOINT,
				       "%s: bytes of the stream's start were freed after their upload (strapd serve "
				       "--upload-free-local): %s",
				       s->output_path,
				       ck ? "the stream cannot be cut back into them (the job-wide resume point lies "
					    "before this checkpoint); resume from the checkpoint itself"
					  : "there is no checkpoint to resume from");
		memset(pt, 0, sizeof *pt);
		pt->offset = first;
		*keep = false;
	}
	/* the intact run past it, up to its last TOKEN packet */
	rs_point at = *pt;
	for (uint64_t off = pt->offset; !(limit >= 0 && at.tokens >= (uint64_t)limit);) {
		if (!read_packet(s, size, off, h, &len))
			break; /* torn, damaged or the end of the file */
		uint64_t type = ss_le(h + 4, 2), seq = ss_le(h + 24, 8), step = ss_le(h + 32, 8);
		if ((type != PKT_TENSOR && type != PKT_DROP && type != PKT_TOKEN) || seq == 0 ||
		    (type == PKT_TOKEN && step != at.tokens))
			break; /* the END/INDEX of the aborted session, or a token out of order */
		at.packets++;
		at.drops += type == PKT_DROP;
		at.last_seq = seq;
		at.last_crc = ss_le(h + 20, 4);
		at.last_offset = off;
		off += len;
		at.offset = off;
		if (type != PKT_TOKEN) {
			/* TOKEN packets carry no forward: the next pass is the one after the last with a packet */
			uint64_t f = ss_le(h + 40, 8) + 1;
			at.forwards = f > at.forwards ? f : at.forwards;
			continue;
		}
		at.tokens++;
		*pt = at;
		*keep = true;
	}
	pt->from_stream = !ck || pt->offset != ck->stream_offset;
	return STRAP_OK;
}

/* ----- the job's common point (docs/DISTRIBUTED.md D3), by files beside the streams ----- */

/* As _job_resume.py: under torchrun (TORCHELASTIC_RUN_ID naming this launch, not its default
 * "none", and TORCHELASTIC_RESTART_COUNT) with per-rank stream names, this start of the job. */
bool ss_job_start(const strap_session *s, char *start, size_t len)
{
	const char *run = getenv("TORCHELASTIC_RUN_ID"), *restart = getenv("TORCHELASTIC_RESTART_COUNT");
	if (s->rank.world_size < 2 || !s->rank.per_rank_paths || !run || !restart)
		return false;
	while (*run == ' ' || *run == '\t' || *run == '\n')
		run++;
	while (*restart == ' ' || *restart == '\t' || *restart == '\n')
		restart++;
	if (!*run || !*restart || strncmp(run, "none", 4) == 0)
		return false;
	snprintf(start, len, "%s/%s", run, restart);
	for (char *e = start + strlen(start); e > start && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\t');)
		*--e = 0;
	return true;
}

/* rank's exchange file: this rank's stream path with rank's marker instead of its own. */
static bool sibling_file(const strap_session *s, long long rank, char *out, size_t len)
{
	char mine[64], theirs[64];
	snprintf(mine, sizeof mine, ".rank%05lld-of-%05lld", s->rank.rank, s->rank.world_size);
	snprintf(theirs, sizeof theirs, ".rank%05lld-of-%05lld", rank, s->rank.world_size);
	const char *base = strrchr(s->output_path, '/');
	base = base ? base + 1 : s->output_path;
	const char *at = NULL;
	for (const char *p = strstr(base, mine); p; p = strstr(p + 1, mine))
		at = p;
	if (!at)
		return false;
	int n = snprintf(out, len, "%.*s%s%s.job-resume.json", (int)(at - s->output_path), s->output_path, theirs,
			 at + strlen(mine));
	return n > 0 && (size_t)n < len;
}

int ss_job_agree(strap_session *s, const char *start, int own_rc, uint64_t own, uint64_t *min)
{
	/* this rank's contribution: its count, or its error (so that no other rank waits for it) */
	char path[4400], tmp[4500];
	snprintf(path, sizeof path, "%s.job-resume.json", s->output_path);
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	sw_buf b = {s->sbuf, 0, SP_MAX_MESSAGE, false};
	sw_lit(&b, "{\"start\": ");
	sw_str(&b, start, strlen(start));
	sw_lit(&b, ", \"rank\": ");
	sw_i64(&b, s->rank.rank);
	sw_lit(&b, ", \"value\": ");
	if (own_rc) {
		char v[1200];
		snprintf(v, sizeof v, "%s: %s", strap_errstr(own_rc), s->err.message);
		sw_str(&b, v, strlen(v));
	} else {
		sw_u64(&b, own);
	}
	sw_lit(&b, "}");
	FILE *f = b.overflow ? NULL : fopen(tmp, "we");
	bool wrote = f && fwrite(b.p, 1, b.n, f) == b.n;
	if (f && (fflush(f) != 0 || fsync(fileno(f)) != 0))
		wrote = false;
	if (f && fclose(f) != 0)
		wrote = false;
	if (!wrote || rename(tmp, path) != 0) {
		unlink(tmp);
		return own_rc ? own_rc : ss_fail(s, STRAP_E_SYSTEM, "job resume point %s: %s", path, strerror(errno));
	}
	const char *w = getenv("STRAP_JOB_RESUME_WAIT");
	double wait = w && *w ? strtod(w, NULL) : 600.0;
	double deadline = sc_now() + wait;
	long long n = s->rank.world_size;
	uint64_t best = UINT64_MAX;
	char bad[900] = "";
	size_t nbad = 0;
	for (long long r = 0; r < n;) {
		char p[4400];
		bool got = false;
		if (!sibling_file(s, r, p, sizeof p))
			return ss_fail(s, STRAP_E_INVALID, "%s does not carry this rank's marker", s->output_path);
		FILE *g = fopen(p, "re");
		size_t len = g ? fread(s->sbuf, 1, SP_MAX_MESSAGE, g) : 0;
		if (g)
			fclose(g);
		sj_val v = {s->sbuf, len}, fs, fr, fv;
		char st[600];
		int64_t rank = -1;
		if (len && len < SP_MAX_MESSAGE && sj_validate(s->sbuf, len, NULL, 0) && sj_kind(v) == '{' &&
		    sj_get(v, "start", &fs) && sj_str(fs, st, sizeof st, NULL) && strcmp(st, start) == 0 &&
		    sj_get(v, "rank", &fr) && sj_i64(fr, &rank) && rank == r && sj_get(v, "value", &fv)) {
			uint64_t c;
			char text[600];
			got = true;
			if (sj_kind(fv) == 'n' && sj_u64(fv, &c)) {
				best = c < best ? c : best;
			} else {
				if (!sj_str(fv, text, sizeof text, NULL))
					snprintf(text, sizeof text,
						 "wrote a value that is neither a count nor an error");
				if (r != s->rank.rank) {
					size_t at = strlen(bad);
					snprintf(bad + at, sizeof bad - at, "%srank %lld: %s", nbad++ ? "; " : "", r,
						 text);
				}
			}
		}
		if (got) {
			r++;
			continue;
		}
		if (sc_now() >= deadline)
			return own_rc ? own_rc
				      : ss_fail(s, STRAP_E_CHECKPOINT,
						"rank %lld waited %gs for the resume point of rank %lld of this start "
						"of the "
						"job (%s) in %s: the ranks must share that directory "
						"(STRAP_JOB_RESUME_WAIT sets the wait)",
						s->rank.rank, wait, r, start, p);
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (own_rc)
		return own_rc; /* every rank has heard of it */
	if (nbad)
		return ss_fail(s, STRAP_E_CHECKPOINT,
			       "the job cannot resume: %s (rank %lld could keep %llu tokens and is left as it was)",
			       bad, s->rank.rank, (unsigned long long)own);
	*min = best;
	return STRAP_OK;
}
