/* The resume point of docs/CHECKPOINTS.md 4, found by the shared scan (common/strap_resume.c, the
 * Python client's too): the checkpoint is the floor, every packet of its prefix read whole and
 * CRC-checked, and past it (from the first packet without one) the stream's intact run is kept up to
 * its last TOKEN packet, or up to TOKEN limit - 1 (a job's common point, docs/DISTRIBUTED.md D3).
 * Reads the output only; open.c cuts the stream back to the point before OPEN, as the Python client
 * does. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "session.h"
#include "strap_resume.h"

typedef struct tokens_to {
	strap_session *s;
	int rc;
} tokens_to;

static int give_token(void *user, const srs_token *t)
{
	tokens_to *to = user;
	strap_session *s = to->s;
	return to->rc = s->resume_token(s->resume_token_user, t->index, t->id_is_int ? t->id_int : INT64_MIN,
					t->text ? t->text : "", t->text ? t->text_len : 0,
					t->position_is_int ? t->position_int : INT64_MIN);
}

int ss_resume_point(strap_session *s, const sck_checkpoint *ck, int64_t limit, bool refuse_complete, rs_point *pt,
		    bool *keep, bool *complete)
{
	memset(pt, 0, sizeof *pt);
	*keep = false;
	if (complete)
		*complete = false;
	tokens_to to = {s, 0};
	srs_params p = {.fd = s->out_fd,
			.path = s->output_path,
			.ck = ck,
			.ck_path = ck ? s->ckpt_path : NULL,
			.want_fingerprint = s->fingerprint,
			.limit = limit,
			.refuse_complete = refuse_complete,
			.on_token = s->resume_token ? give_token : NULL,
			.user = &to};
	srs_result r;
	char why[sizeof s->err.message];
	int e = srs_resume_point(&p, &r, why, sizeof why);
	switch (e) {
	case SRS_OK: break;
	case SRS_NOMEM: return ss_fail(s, STRAP_E_NOMEM, "%s", why);
	case SRS_IO: return ss_fail(s, STRAP_E_SYSTEM, "%s", why);
	case SRS_STOPPED:
		return ss_fail(s, STRAP_E_CHECKPOINT,
			       "%s: params.resume_token returned %d for a token of the resumed prefix", s->output_path,
			       to.rc);
	default: /* refused, or a finished capture */ return ss_fail(s, STRAP_E_CHECKPOINT, "%s", why);
	}
	if (complete)
		*complete = r.complete;
	if (r.complete)
		snprintf(s->complete_why, sizeof s->complete_why, "%s", why);
	*pt = (rs_point){.offset = r.stream_offset,
			 .packets = r.packets,
			 .drops = r.drops,
			 .last_seq = r.last_seq,
			 .last_crc = r.last_packet_crc,
			 .last_offset = r.last_packet_offset,
			 .tokens = r.token_count,
			 .forwards = r.forward_count,
			 .from_stream = !ck || r.stream_offset != ck->stream_offset};
	/* nothing to keep (an empty file; no checkpoint kept and no token intact): a new capture */
	*keep = r.source == SRS_CHECKPOINT || (r.source == SRS_STREAM && r.token_count > 0);
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

/* rank's exchange file: the stream path with rank's marker instead of this rank's own. */
static bool sibling_file(const char *output_path, long long mine_rank, long long world, long long rank, char *out,
			 size_t len)
{
	char mine[64], theirs[64];
	snprintf(mine, sizeof mine, ".rank%05lld-of-%05lld", mine_rank, world);
	snprintf(theirs, sizeof theirs, ".rank%05lld-of-%05lld", rank, world);
	const char *base = strrchr(output_path, '/');
	base = base ? base + 1 : output_path;
	const char *at = NULL;
	for (const char *p = strstr(base, mine); p; p = strstr(p + 1, mine))
		at = p;
	if (!at)
		return false;
	int n = snprintf(out, len, "%.*s%s%s.job-resume.json", (int)(at - output_path), output_path, theirs,
			 at + strlen(mine));
	return n > 0 && (size_t)n < len;
}

int strap__job_exchange(const strap__job *j, uint64_t *counts, char *texts, char *why, size_t whylen)
{
	/* this rank's contribution: its count, or its error (so that no other rank waits for it) */
	char path[4400], *buf = malloc(SP_MAX_MESSAGE);
	if (!buf) {
		snprintf(why, whylen, "out of memory");
		return STRAP_E_NOMEM;
	}
	snprintf(path, sizeof path, "%s.job-resume.json", j->output_path);
	sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
	sw_lit(&b, "{\"start\": ");
	sw_str(&b, j->start, strlen(j->start));
	sw_lit(&b, ", \"rank\": ");
	sw_i64(&b, j->rank);
	sw_lit(&b, ", \"value\": ");
	if (j->own_error)
		sw_str(&b, j->own_error, strlen(j->own_error));
	else
		sw_u64(&b, j->own);
	sw_lit(&b, "}");
	int e = STRAP_OK;
	char werr[1024] = "the message buffer is too small";
	/* replaced atomically and durably (sck_write_atomic) */
	if (b.overflow || sck_write_atomic(path, b.p, b.n, 0640, werr, sizeof werr) != 0) {
		snprintf(why, whylen, "job resume point %s: %s", path, werr);
		free(buf);
		return STRAP_E_SYSTEM;
	}
	double deadline = sc_now() + j->wait_s;
	for (long long r = 0; r < j->world_size;) {
		char p[4400];
		if (!sibling_file(j->output_path, j->rank, j->world_size, r, p, sizeof p)) {
			snprintf(why, whylen, "%s does not carry rank %lld's marker .rank%05lld-of-%05lld",
				 j->output_path, j->rank, j->rank, j->world_size);
			e = STRAP_E_INVALID;
			break;
		}
		FILE *g = fopen(p, "re");
		size_t len = g ? fread(buf, 1, SP_MAX_MESSAGE, g) : 0;
		if (g)
			fclose(g);
		sj_val v = {buf, len}, fs, fr, fv;
		char st[600];
		int64_t rank = -1;
		/* not written yet, or of an earlier start: waited for (a rename makes it whole) */
		if (len && len < SP_MAX_MESSAGE && sj_validate(buf, len, NULL, 0) && sj_kind(v) == '{' &&
		    sj_get(v, "start", &fs) && sj_str(fs, st, sizeof st, NULL) && strcmp(st, j->start) == 0 &&
		    sj_get(v, "rank", &fr) && sj_i64(fr, &rank) && rank == r && sj_get(v, "value", &fv)) {
			char *text = texts + (size_t)r * STRAP__JOB_TEXT;
			counts[r] = UINT64_MAX;
			if (sj_kind(fv) == 'n' && sj_u64(fv, &counts[r]) && counts[r] != UINT64_MAX)
				text[0] = 0;
			else if (!sj_str(fv, text, STRAP__JOB_TEXT, NULL))
				snprintf(text, STRAP__JOB_TEXT, "wrote a value that is neither a count nor an error");
			r++;
			continue;
		}
		if (sc_now() >= deadline) {
			snprintf(why, whylen,
				 "rank %lld waited %gs for the resume point of rank %lld of this start of the job (%s) "
				 "in %s: the ranks must share that directory, or initialise a torch.distributed "
				 "process group before the capture (STRAP_JOB_RESUME_WAIT sets the wait)",
				 j->rank, j->wait_s, r, j->start, p);
			e = STRAP_E_CHECKPOINT;
			break;
		}
		if (j->interrupted && j->interrupted(j->interrupt_user)) {
			snprintf(why, whylen, "interrupted while waiting for the job's resume point");
			e = STRAP_E_SYSTEM;
			break;
		}
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	free(buf);
	return e;
}

int ss_job_agree(strap_session *s, const char *start, int own_rc, uint64_t own, uint64_t *min)
{
	char own_error[1200], why[sizeof s->err.message];
	if (own_rc)
		snprintf(own_error, sizeof own_error, "%s: %s", strap_errstr(own_rc), s->err.message);
	const char *w = getenv("STRAP_JOB_RESUME_WAIT");
	strap__job j = {.output_path = s->output_path,
			.rank = s->rank.rank,
			.world_size = s->rank.world_size,
			.start = start,
			.own_error = own_rc ? own_error : NULL,
			.own = own,
			.wait_s = w && *w ? strtod(w, NULL) : 600.0};
	uint64_t *counts = calloc((size_t)j.world_size, sizeof *counts);
	char *texts = calloc((size_t)j.world_size, STRAP__JOB_TEXT);
	int e = counts && texts ? strap__job_exchange(&j, counts, texts, why, sizeof why) : STRAP_E_NOMEM;
	if (e == STRAP_E_NOMEM && (!counts || !texts))
		snprintf(why, sizeof why, "out of memory");
	char bad[900] = "";
	size_t nbad = 0;
	uint64_t best = UINT64_MAX;
	for (long long r = 0; !e && r < j.world_size; r++) {
		if (counts[r] != UINT64_MAX) {
			best = counts[r] < best ? counts[r] : best;
		} else if (r != j.rank) {
			size_t at = strlen(bad);
			snprintf(bad + at, sizeof bad - at, "%srank %lld: %s", nbad++ ? "; " : "", r,
				 texts + (size_t)r * STRAP__JOB_TEXT);
		}
	}
	free(counts);
	free(texts);
	if (own_rc)
		return own_rc; /* every rank has heard of it (or could not: its own error comes first) */
	if (e)
		return ss_fail(s, e, "%s", why);
	if (nbad)
		return ss_fail(s, STRAP_E_CHECKPOINT,
			       "the job cannot resume: %s (rank %lld could keep %llu tokens and is left as it was)",
			       bad, s->rank.rank, (unsigned long long)own);
	*min = best;
	return STRAP_OK;
}
