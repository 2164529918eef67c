/* Opening a session (PROTOCOL.md 1.2-1.3): the output and its lock, the side files, the
 * checkpoint state, the connection and handshake, the sealed ring, OPEN; and STATUS. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
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

strap_session_params strap_default_session_params(void)
{
	strap_session_params p;
	memset(&p, 0, sizeof p);
	p.autostart = 1;
	p.start_timeout_s = 10.0;
	p.ring_size = 0; /* DEFAULT_RING, smaller when the daemon's budget is short */
	p.codec = "none";
	p.codec_level = -1;
	p.policy = STRAP_POLICY_BLOCK;
	p.stall_timeout_s = 120.0;
	p.resume_max_tokens = -1;
	return p;
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

static int open_side_file(strap_session *s, const char *suffix, bool append, int *fd)
{
	char path[4300];
	snprintf(path, sizeof path, "%s%s", s->output_path, suffix);
	*fd = open(path, (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC) | O_CREAT | O_CLOEXEC, 0640);
	if (*fd < 0)
		return ss_fail(s, STRAP_E_SYSTEM, "open %s: %s", path, strerror(errno));
	return STRAP_OK;
}

/* The members of the JSON object text obj (between its braces, trimmed: *in == *end when it has
 * none); -1 with why when obj is not a JSON object. */
static int json_members(const char *obj, const char **in, const char **end, char *why, size_t len)
{
	size_t n = strlen(obj);
	if (!sj_validate(obj, n, why, len))
		return -1;
	const char *a = obj, *z = a + n;
	while (a < z && *a != '{' && *a != '[' && *a != '"')
		a++;
	if (a == z || *a != '{') {
		snprintf(why, len, "not a JSON object");
		return -1;
	}
	while (z > a && z[-1] != '}')
		z--;
	const char *i = a + 1, *e = z - 1;
	while (i < e && (*i == ' ' || *i == '\n' || *i == '\t' || *i == '\r'))
		i++;
	while (e > i && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\t' || e[-1] == '\r'))
		e--;
	*in = i;
	*end = e;
	return 0;
}

/* OPEN's metadata of a libstrap session: the library's members, then the caller's (a later
 * repeat wins in Go); the transport is the open's (open_metadata). */
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
	if (s->rank.world_size) { /* the same object as the Python client's (DISTRIBUTED.md) */
		const sp_rank *r = &s->rank;
		sw_lit(m, ",\"distributed\":{\"rank\":");
		sw_i64(m, r->rank);
		sw_lit(m, ",\"world_size\":");
		sw_i64(m, r->world_size);
		sw_lit(m, ",\"local_rank\":");
		if (r->local_rank >= 0)
			sw_i64(m, r->local_rank);
		else
			sw_lit(m, "null");
		sw_lit(m, ",\"local_world_size\":");
		if (r->local_world_size >= 0)
			sw_i64(m, r->local_world_size);
		else
			sw_lit(m, "null");
		sw_lit(m, ",\"host\":");
		sw_str(m, r->host, strlen(r->host));
		sw_lit(m, ",\"source\":\"env\"");
		if (r->job_id[0]) {
			sw_lit(m, ",\"job_id\":");
			sw_str(m, r->job_id, strlen(r->job_id));
		}
		sw_raw(m, "}", 1);
	}
	if (p->metadata_json) {
		const char *in, *end;
		char why[128];
		if (json_members(p->metadata_json, &in, &end, why, sizeof why) != 0)
			return ss_fail(s, STRAP_E_INVALID, "metadata_json: %s", why);
		if (in < end) {
			sw_raw(m, ",", 1);
			sw_raw(m, in, (size_t)(end - in));
		}
	}
	sw_raw(m, "}", 1);
	if (m->overflow)
		return ss_fail(s, STRAP_E_TOO_LARGE, "OPEN metadata exceeds the message size");
	return STRAP_OK;
}

static int open_with_retries(strap_session *s, const strap__open *o, strap__opened *out);
static int own_connect(void *user, strap_error *err);
static int budget_fail(strap_session *s, const char *refused, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* An upload target by the rules of strapd (internal/upload/url.go) and the Python client
 * (check_upload_url): s3://bucket[/prefix], a bucket of 3..63 of [a-z0-9.-], no empty, "." or
 * ".." segment in the prefix (leading and trailing slashes aside). */
static bool upload_url_ok(const char *url, char *why, size_t len)
{
	if (strncmp(url, "s3://", 5) != 0) {
		snprintf(why, len, "params.upload \"%s\": expected an s3://bucket/prefix URL", url);
		return false;
	}
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t bl = slash ? (size_t)(slash - b) : strlen(b);
	bool ok = bl >= 3 && bl <= 63;
	for (size_t i = 0; ok && i < bl; i++)
		ok = (b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '.' || b[i] == '-';
	if (!ok) {
		snprintf(why, len,
			 "params.upload \"%s\": bucket name \"%.*s\" must be 3 to 63 characters of a-z, 0-9, '-' and "
			 "'.'",
			 url, (int)(bl > 100 ? 100 : bl), b);
		return false;
	}
	if (!slash)
		return true;
	const char *p = slash, *end = p + strlen(p);
	while (p < end && *p == '/')
		p++;
	while (end > p && end[-1] == '/')
		end--;
	while (p < end) {
		const char *q = memchr(p, '/', (size_t)(end - p));
		size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) {
			snprintf(why, len, "params.upload \"%s\": empty, '.' or '..' segment in the key prefix", url);
			return false;
		}
		p += n + (q != NULL);
	}
	return true;
}

/* The stream (and checkpoint) paths, one rank's own in a distributed job as the Python client
 * names them, and the output opened with flags: s->out_fd, s->output_path, s->ckpt_path. */
static int resolve_output(strap_session *s, const strap_session_params *p, int flags)
{
	char why[256];
	if (sp_rank_detect(&s->rank, why, sizeof why) != 0)
		return ss_fail(s, STRAP_E_INVALID, "%s", why);
	bool ranked = s->rank.world_size && s->rank.per_rank_paths;
	char *out = ranked ? sp_rank_path(p->output_path, &s->rank) : dupstr(p->output_path, NULL);
	char *ck = !(p->checkpoint_path && *p->checkpoint_path) ? NULL
		   : ranked                                     ? sp_rank_path(p->checkpoint_path, &s->rank)
								: dupstr(p->checkpoint_path, NULL);
	if (!out || (p->checkpoint_path && *p->checkpoint_path && !ck)) {
		free(out);
		free(ck);
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	}
	s->out_fd = open(out, flags | O_CLOEXEC, 0640);
	char abs[PATH_MAX];
	int open_errno = errno;
	bool missing = s->out_fd < 0 && open_errno == ENOENT && !(flags & O_CREAT);
	if (missing) { /* a probe of a capture never started: the path as it would be */
		char dir[PATH_MAX];
		snprintf(dir, sizeof dir, "%s", out);
		char *slash = strrchr(dir, '/');
		const char *base = slash ? slash + 1 : dir;
		if (slash)
			*slash = 0;
		if (!realpath(slash ? (*dir ? dir : "/") : ".", abs) || strlen(abs) + strlen(base) + 2 > sizeof abs)
			snprintf(abs, sizeof abs, "%s", out);
		else
			snprintf(abs + strlen(abs), sizeof abs - strlen(abs), "%s%s", strcmp(abs, "/") ? "/" : "",
				 base);
	} else if (s->out_fd < 0 || !realpath(out, abs)) {
		int e = ss_fail(s, STRAP_E_SYSTEM, "%s %s: %s", s->out_fd < 0 ? "open" : "realpath", out,
				strerror(s->out_fd < 0 ? open_errno : errno));
		free(out);
		free(ck);
		return e;
	}
	free(out);
	s->output_path = dupstr(abs, NULL);
	s->ckpt_path = ck ? ck : dupstr(abs, ".ckpt.json");
	if (!s->fingerprint || !s->output_path || !s->ckpt_path)
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	return STRAP_OK;
}

/* Where params.resume goes on (docs/CHECKPOINTS.md 4), changing nothing: the checkpoint (when
 * there is one, kept in s->resume_ck), then the stream's intact prefix; params.resume_max_tokens
 * the job's limit. *keep false: a new capture. A capture that finished (an END "complete" and no
 * checkpoint) is refused without a limit, or, with complete not NULL, reported there (a job
 * resumes every rank from the job's point: the caller decides with strap_resume_probe). */
static int find_resume_point(strap_session *s, bool have_ckpt, int64_t limit, rs_point *pt, bool *keep, bool *complete)
{
	int e;
	if (have_ckpt && (e = ss_load_checkpoint(s, &s->resume_ck)))
		return e;
	bool done = false;
	if ((e = ss_resume_point(s, have_ckpt ? &s->resume_ck : NULL, limit, !complete && limit < 0, pt, keep, &done)))
		return e;
	if (complete)
		*complete = done;
	return STRAP_OK;
}

static int open_session(strap_session *s, const strap_session_params *p)
{
	if (!p->output_path || !*p->output_path)
		return ss_fail(s, STRAP_E_INVALID, "params.output_path is required");
	if (p->ring_size && (p->ring_size <= SR_HEADER_SIZE || (p->ring_size - SR_HEADER_SIZE) % 64))
		return ss_fail(s, STRAP_E_INVALID, "ring_size %llu must be 4096 + a positive multiple of 64",
			       (unsigned long long)p->ring_size);
	if (p->policy != STRAP_POLICY_BLOCK && p->policy != STRAP_POLICY_DROP)
		return ss_fail(s, STRAP_E_INVALID, "policy %d is not STRAP_POLICY_BLOCK or STRAP_POLICY_DROP",
			       (int)p->policy);
	if (!p->codec || !*p->codec)
		return ss_fail(s, STRAP_E_INVALID, "params.codec is empty");
	char why_codec[160];
	if (sp_codec_check(p->codec, p->codec_level, p->lossy_mode, why_codec, sizeof why_codec) != 0)
		return ss_fail(s, STRAP_E_INVALID, "params: %s", why_codec);
	const char *upload = p->upload && *p->upload ? p->upload : NULL;
	char why_upload[5000];
	if (upload && (!sp_utf8_valid(upload, strlen(upload)) || !upload_url_ok(upload, why_upload, sizeof why_upload)))
		return ss_fail(s, STRAP_E_INVALID, "%s",
			       sp_utf8_valid(upload, strlen(upload)) ? why_upload : "params.upload is not UTF-8");
	s->policy = p->policy;
	s->stall_timeout = p->stall_timeout_s > 0 ? p->stall_timeout_s : 120.0;
	s->fingerprint = dupstr(p->fingerprint ? p->fingerprint : "", NULL);
	s->resume_token = p->resume_token;
	s->resume_token_user = p->resume_token_user;
	char client[200];
	snprintf(client, sizeof client, "%s",
		 p->client_name && *p->client_name ? p->client_name : "libstrap/" STRAP_VERSION_STRING);

	int e = resolve_output(s, p, O_RDWR | O_CREAT);
	if (e || (e = sl_lock(s, p->resume ? LOCK_WAIT_S : LOCK_WAIT_NEW_S)))
		return e;

	bool have_ckpt = access(s->ckpt_path, F_OK) == 0;
	rs_point pt = {0};
	bool resuming = false;
	if (have_ckpt && !p->resume && !p->overwrite_checkpoint)
		return ss_fail(
			s, STRAP_E_CHECKPOINT,
			"a checkpoint of an earlier capture exists at %s: resume it (params.resume) or start over "
			"(params.overwrite_checkpoint)",
			s->ckpt_path);
	char start[600];
	int job_agreed = 0;
	if (p->resume && p->resume_max_tokens < 0 && ss_job_start(s, start, sizeof start)) {
		/* one rank of a job under torchrun: the job's common point, agreed with the other ranks
		 * (a finished rank is cut back when another one holds fewer tokens) */
		bool complete = false;
		e = find_resume_point(s, have_ckpt, -1, &pt, &resuming, &complete);
		uint64_t own = resuming ? pt.tokens : 0, min = 0;
		if ((e = ss_job_agree(s, start, e, own, &min)))
			return e;
		if (complete && min >= own)
			return ss_fail(s, STRAP_E_CHECKPOINT, "%s", s->complete_why);
		if (min < own) {
			if ((e = find_resume_point(s, have_ckpt, (int64_t)min, &pt, &resuming, &complete)))
				return e;
			if (pt.tokens != min && (resuming || min))
				return ss_fail(
					s, STRAP_E_CHECKPOINT,
					"%s: the stream changed while the job agreed on its resume point (token %llu "
					"wanted, %llu found)",
					s->output_path, (unsigned long long)min, (unsigned long long)pt.tokens);
		}
		job_agreed = 1;
	} else if (p->resume) {
		if ((e = find_resume_point(s, have_ckpt, p->resume_max_tokens, &pt, &resuming, NULL)))
			return e;
	}
	if (p->resume) {
		/* a cut before the checkpoint (a job's common point) rewrites the checkpoint first: a
		 * process killed after the cut must not find one that describes bytes no longer there */
		sck_checkpoint *ck = &s->resume_ck;
		if (resuming && have_ckpt && pt.offset < ck->stream_offset) {
			s->next_forward = pt.forwards;
			if ((e = ss_write_checkpoint(s, pt.offset, pt.packets, pt.drops, pt.last_seq, pt.last_offset,
						     pt.last_crc, pt.tokens)))
				return e;
		}
		/* The client cuts the stream back to its point itself, as the Python client does:
		 * strapd refuses an append_at before an END "complete" (a finished capture it must not
		 * cut), which a capture stopped with its checkpoint kept has (docs/CHECKPOINTS.md 4). */
		if (resuming && (ftruncate(s->out_fd, (off_t)pt.offset) != 0 || fsync(s->out_fd) != 0))
			return ss_fail(s, STRAP_E_SYSTEM, "cut %s back to %llu bytes: %s", s->output_path,
				       (unsigned long long)pt.offset, strerror(errno));
	}
	if (!resuming) {
		if (have_ckpt && unlink(s->ckpt_path) != 0)
			return ss_fail(s, STRAP_E_SYSTEM, "remove checkpoint %s: %s", s->ckpt_path, strerror(errno));
		if (ftruncate(s->out_fd, 0) != 0)
			return ss_fail(s, STRAP_E_SYSTEM, "truncate %s: %s", s->output_path, strerror(errno));
	}
	if (p->trace && (e = open_side_file(s, ".trace.jsonl", resuming, &s->trace_fd)))
		return e;
	if (p->resources && (e = open_side_file(s, ".resources.jsonl", resuming, &s->res_fd)))
		return e;

	strap_resume_point rp = {0};
	if (resuming)
		rp = (strap_resume_point){.resumed = 1,
					  .token_count = pt.tokens,
					  .forward_count = pt.forwards,
					  .last_seq = pt.last_seq,
					  .stream_offset = pt.offset,
					  .from_stream = pt.from_stream};
	rp.job_agreed = s->resume.job_agreed = job_agreed;
	/* the connection and the ring: libstrap's own, the metadata built once */
	sw_buf meta = {malloc(SP_MAX_MESSAGE), 0, SP_MAX_MESSAGE, false};
	if (!meta.p)
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	if ((e = build_metadata(s, p, client, &meta))) {
		free(meta.p);
		return e;
	}
	char transport[200];
	int tn = snprintf(transport, sizeof transport, "{\"codec\":\"%.40s\"", p->codec);
	if (p->codec_level >= 0)
		tn += snprintf(transport + tn, sizeof transport - (size_t)tn, ",\"codec_level\":%lld",
			       (long long)p->codec_level);
	if (p->block_size)
		tn += snprintf(transport + tn, sizeof transport - (size_t)tn, ",\"block_size\":%llu",
			       (unsigned long long)p->block_size);
	snprintf(transport + tn, sizeof transport - (size_t)tn, "}");
	meta.p[meta.n] = 0;
	strap__open o = {
		.connect = own_connect,
		.user = (void *)p,
		.client = client,
		.body = {.codec = p->codec,
			 .has_codec_level = p->codec_level >= 0,
			 .codec_level = p->codec_level,
			 .block_size = p->block_size,
			 .lossy_mode = p->lossy_mode,
			 .has_lossy_value = p->lossy_mode != NULL,
			 .lossy_value = p->lossy_value,
			 .memory_hint = p->memory_hint,
			 .resources = p->resources,
			 .upload = upload,
			 .upload_free_local = p->upload_free_local},
		.metadata = meta.p,
		.transport = transport,
		.ring_size = p->ring_size ? p->ring_size : DEFAULT_RING,
		.ring_explicit = p->ring_size != 0,
		.ring_setting = "params.ring_size",
		.out_fd = s->out_fd,
		.trace_fd = s->trace_fd,
		.res_fd = s->res_fd,
		.part_size = p->part_size,
		.publish_bytes = p->publish_bytes,
		.defer = true,
		.attach = {.ring_tokens_every = p->ring_tokens_every ? p->ring_tokens_every : RING_TOKENS_EVERY,
			   .ring_tokens_seconds =
				   p->ring_tokens_seconds > 0 ? p->ring_tokens_seconds : RING_TOKENS_SECONDS},
	};
	if (resuming) {
		o.body.has_resume = 1;
		o.body.append_at = rp.stream_offset;
		o.body.resume_last_seq = rp.last_seq;
		o.body.resume_last_crc = pt.last_crc;
		o.body.resume_packets = pt.packets;
	}
	strap__opened *opened = malloc(sizeof *opened);
	e = opened ? open_with_retries(s, &o, opened) : ss_fail(s, STRAP_E_NOMEM, "out of memory");
	free(opened);
	free(meta.p);
	if (e)
		return e;
	if (resuming) {
		s->seq = s->last_tensor_seq = rp.last_seq;
		s->tokens = rp.token_count;
		s->next_forward = rp.forward_count;
		s->resume = rp;
	}
	return STRAP_OK;
}

static int own_connect(void *user, strap_error *err)
{
	const strap_session_params *p = user;
	char path[4200];
	return sc_connect(p->socket_path, p->autostart, p->strapd_bin, p->start_timeout_s, path, sizeof path, err);
}

/* The error of an OPEN refused for the daemon's memory budget that this session cannot retry:
 * the daemon's words, then what to do about them. */
static int budget_fail(strap_session *s, const char *refused, const char *fmt, ...)
{
	char advice[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(advice, sizeof advice, fmt, ap);
	va_end(ap);
	ss_fail(s, STRAP_E_DAEMON, "%s; %s", refused, advice);
	snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "memory_budget");
	return STRAP_E_DAEMON;
}

/* OPEN's metadata: the caller's object with "transport" (its members, then the ring's size and
 * the default ring the budget had no room for). */
static int open_metadata(strap_session *s, const strap__open *o, uint64_t size, sw_buf *m)
{
	const char *in = "", *end = in, *tin = "", *tend = tin;
	char why[128];
	if (o->metadata && json_members(o->metadata, &in, &end, why, sizeof why) != 0)
		return ss_fail(s, STRAP_E_INVALID, "OPEN metadata: %s", why);
	if (o->transport && json_members(o->transport, &tin, &tend, why, sizeof why) != 0)
		return ss_fail(s, STRAP_E_INVALID, "OPEN metadata's transport: %s", why);
	sw_raw(m, "{", 1);
	if (in < end) {
		sw_raw(m, in, (size_t)(end - in));
		sw_raw(m, ",", 1);
	}
	sw_lit(m, "\"transport\":{");
	if (tin < tend) {
		sw_raw(m, tin, (size_t)(tend - tin));
		sw_raw(m, ",", 1);
	}
	sw_lit(m, "\"ring_size\":");
	sw_u64(m, size);
	if (s->budget_shrunk_from) { /* the stream says its ring is smaller than the default, and why */
		sw_lit(m, ",\"ring_shrunk_by_budget_from\":");
		sw_u64(m, s->budget_shrunk_from);
	}
	sw_lit(m, "}}");
	if (m->overflow)
		return ss_fail(s, STRAP_E_TOO_LARGE, "OPEN metadata exceeds the message size");
	return STRAP_OK;
}

/* The connection and the ring of a try that did not open: closed, given back. */
static void open_release(strap_session *s, const strap__open *o)
{
	if (s->sock >= 0)
		close(s->sock);
	s->sock = -1;
	if (o->ring) {
		if (s->rb != &s->rb_own)
			o->ring_drop(o->user, s->rb);
		s->rb = &s->rb_own;
	} else {
		srb_destroy(s->rb);
	}
}

/* One try: connect, shake hands, the ring of size bytes (clamped to the daemon's max_ring_size),
 * OPEN on it, OPENED. */
static int open_try(strap_session *s, const strap__open *o, uint64_t size, strap__opened *out)
{
	int e;
	strap_error cerr = {0};
	s->sock = o->connect(o->user, &cerr);
	if (s->sock < 0) {
		int code = s->sock;
		s->sock = -1;
		return ss_fail(s, code, "%s", cerr.message);
	}
	sw_buf b = ss_out_buf(s);
	sp_enc_hello(&b, o->client, getpid());
	if ((e = ss_send_buf(s, &b, NULL, 0)))
		return e;
	sp_reply r;
	if ((e = ss_expect(s, SP_WELCOME, s->stall_timeout, &r)))
		return e;
	if (r.u.welcome.protocol != SP_VERSION)
		return ss_fail(s, STRAP_E_PROTOCOL, "daemon speaks protocol %lld, client speaks %d",
			       (long long)r.u.welcome.protocol, SP_VERSION);
	uint64_t limit = r.u.welcome.max_ring_size ? r.u.welcome.max_ring_size : DEFAULT_MAX_RING;
	if (size > limit) {
		out->fitted_from = size;
		size = limit / 4096 * 4096;
		if (size < MIN_RING) {
			ss_fail(s, STRAP_E_DAEMON,
				"strapd admits rings of at most %llu bytes (--max-ring-size), less than the "
				"smallest usable ring (%d bytes)",
				(unsigned long long)limit, MIN_RING);
			snprintf(s->err.daemon_code, sizeof s->err.daemon_code, "limit");
			return STRAP_E_DAEMON;
		}
	}
	out->max_ring_size = limit;
	if (o->ring) {
		strap_error rerr = {0};
		srb_ring *ring = o->ring(o->user, size, &rerr);
		if (!ring)
			return ss_fail(s, rerr.code ? rerr.code : STRAP_E_SYSTEM, "%s", rerr.message);
		s->rb = ring;
	} else {
		char why[256];
		if (srb_create(s->rb, size, why, sizeof why) != 0)
			return ss_fail(s, STRAP_E_SYSTEM, "%s", why);
	}
	s->max_record = (o->part_size ? o->part_size : s->rb->data_size / 4) / 64 * 64;
	/* A record over half the region could need a PAD so long that PAD + record never fit,
	 * even in an empty ring (a PAD is needed only past offset data_size - record). */
	if (s->max_record > s->rb->data_size / 2)
		s->max_record = s->rb->data_size / 2 / 64 * 64;
	uint64_t pb = s->rb->data_size / 8 < (4u << 20) ? s->rb->data_size / 8 : (4u << 20);
	s->publish_bytes = o->publish_bytes ? o->publish_bytes : pb;
	if (s->publish_bytes < 64)
		s->publish_bytes = 64;
	s->published_head = s->rb->head;

	/* OPEN, with the metadata built in the receive buffer (free until OPENED comes) */
	sw_buf meta = {(char *)s->rbuf, 0, SP_MAX_MESSAGE, false};
	if ((e = open_metadata(s, o, size, &meta)))
		return e;
	sp_open_body body = o->body;
	body.ring_size = size;
	body.policy = s->policy == STRAP_POLICY_DROP ? "drop" : "block";
	body.metadata = meta.p;
	body.metadata_len = meta.n;
	if (s->budget_shrunk_from && body.memory_hint)
		body.memory_hint = size;
	b = ss_out_buf(s);
	sp_enc_open(&b, &body);
	int fds[4], nfds = 0;
	fds[nfds++] = s->rb->fd;
	fds[nfds++] = o->out_fd;
	if (o->trace_fd >= 0)
		fds[nfds++] = o->trace_fd;
	if (o->res_fd >= 0)
		fds[nfds++] = o->res_fd;
	if ((e = ss_send_buf(s, &b, fds, nfds)))
		return e;
	if ((e = ss_expect(s, SP_OPENED, s->stall_timeout, &r)))
		return e;
	s->session_id = r.u.opened.session;
	s->cursor = o->defer && r.u.opened.published_cursor != 0;
	s->ring_tokens = s->cursor && r.u.opened.ring_tokens && o->trace_fd < 0 && s->rt_every > 1;
	s->last_message = sc_now();
	free(s->upload); /* a retried open (memory budget) answers again */
	s->upload = r.u.opened.upload[0] ? dupstr(r.u.opened.upload, NULL) : NULL;
	if (r.u.opened.upload[0] && !s->upload)
		return ss_fail(s, STRAP_E_NOMEM, "out of memory");
	out->sock = s->sock;
	out->ring = s->rb;
	out->session_id = s->session_id;
	out->block_size = r.u.opened.block_size;
	out->max_record = s->max_record;
	out->publish_bytes = s->publish_bytes;
	out->published_cursor = r.u.opened.published_cursor != 0;
	out->ring_tokens = r.u.opened.ring_tokens != 0;
	snprintf(out->upload, sizeof out->upload, "%s", r.u.opened.upload);
	return STRAP_OK;
}

/* open_try until it opens; a default ring the daemon's budget had no room for (ERROR
 * memory_budget with fits_ring_size) is tried again, on a new connection, as small as the room
 * left; one the caller chose is its error to fix. Nothing of a failed try is kept. */
static int open_with_retries(strap_session *s, const strap__open *o, strap__opened *out)
{
	memset(out, 0, sizeof *out);
	out->sock = -1;
	s->rt_every = o->attach.ring_tokens_every;
	s->rt_seconds = o->attach.ring_tokens_seconds;
	uint64_t size = o->ring_size;
	for (int attempt = 0;; attempt++) {
		s->has_fits_ring_size = false;
		int e = open_try(s, o, size, out);
		if (e == STRAP_OK)
			return e;
		uint64_t tried = s->rb != &s->rb_own || s->rb->base ? s->rb->ring_size : size;
		open_release(s, o);
		if (e != STRAP_E_DAEMON || strcmp(s->err.daemon_code, "memory_budget") != 0 || !s->has_fits_ring_size)
			return e;
		char refused[sizeof s->err.message];
		memcpy(refused, s->err.message, sizeof refused);
		uint64_t fits = s->fits_ring_size / 4096 * 4096;
		out->fits_ring_size = fits;
		if (o->ring_explicit)
			return budget_fail(s, refused,
					   "this capture asked for a %llu-byte ring (%s): ask for a smaller one, leave "
					   "%s unset for a ring that fits, or raise the daemon's budget (strapd serve "
					   "--memory-limit)",
					   (unsigned long long)o->ring_size, o->ring_setting, o->ring_setting);
		if (fits < MIN_RING)
			return budget_fail(s, refused,
					   "not even the smallest ring (%d bytes) fits: raise the daemon's "
					   "budget (strapd serve --memory-limit) or end other captures",
					   MIN_RING);
		if (attempt == BUDGET_RETRIES)
			return budget_fail(s, refused,
					   "the budget's room shrank %d times while this capture tried to "
					   "take it: raise the daemon's budget (strapd serve --memory-limit)",
					   BUDGET_RETRIES);
		s->budget_shrunk_from = out->shrunk_from = tried;
		s->failed = false;
		memset(&s->err, 0, sizeof s->err);
		size = fits;
	}
}

/* A session with nothing open yet (every descriptor -1): its message buffer, and with
 * replies its receive buffer too (a NULL buffer is the caller's out-of-memory to report);
 * NULL with err set when even the session cannot be allocated. */
static strap_session *bare_session(bool replies, strap_error *err)
{
	strap_session *s = calloc(1, sizeof *s);
	if (!s) {
		se_set(err, STRAP_E_NOMEM, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	s->rb = &s->rb_own;
	s->sock = s->rb->fd = s->out_fd = s->trace_fd = s->res_fd = -1;
	s->sbuf = malloc(SP_MAX_MESSAGE + 1);
	if (replies)
		s->rbuf = malloc(SP_MAX_MESSAGE + 1);
	return s;
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
	strap_session *s = bare_session(true, err);
	if (!s)
		return STRAP_E_NOMEM;
	/* the reservation table: the per-record path allocates nothing */
	s->resv_cap = params->max_reservations ? params->max_reservations : DEFAULT_RESERVATIONS;
	s->resv = params->max_reservations <= (1u << 20) ? calloc(s->resv_cap, sizeof *s->resv) : NULL;
	s->resv_names = s->resv ? malloc((size_t)s->resv_cap * SR_MAX_NAME) : NULL; /* touched only by aborts */
	int e = params->max_reservations > (1u << 20)    ? ss_fail(s, STRAP_E_INVALID, "max_reservations %u exceeds %u",
								   params->max_reservations, 1u << 20)
		: !s->sbuf || !s->rbuf || !s->resv_names ? ss_fail(s, STRAP_E_NOMEM, "out of memory")
							 : open_session(s, params);
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

/* ----- attached sessions (attach.h) ----- */

int strap__session_attach(const strap__attach *a, strap_session **out, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	if (!out || !a || a->sock < 0 || !a->ring || !a->ring->base || a->max_record < 64 ||
	    a->max_record > a->ring->data_size / 2 || a->max_record % 64 ||
	    (a->policy != STRAP_POLICY_BLOCK && a->policy != STRAP_POLICY_DROP)) {
		se_set(err, STRAP_E_INVALID,
		       "attach: a connection, an open ring, a record size of 64.."
		       "data_size/2 in 64-byte steps and a policy are required");
		return STRAP_E_INVALID;
	}
	*out = NULL;
	strap_session *s = bare_session(true, err);
	if (!s)
		return STRAP_E_NOMEM;
	s->borrowed = true;
	s->sock = a->sock;
	s->rb = a->ring;
	s->resv_cap = 1; /* the caller completes its own copies (frontier), reserving nothing */
	s->resv = calloc(s->resv_cap, sizeof *s->resv);
	if (!s->sbuf || !s->rbuf || !s->resv) {
		se_set(err, STRAP_E_NOMEM, "out of memory");
		strap_session_free(s);
		return STRAP_E_NOMEM;
	}
	s->policy = a->policy;
	s->stall_timeout = a->stall_timeout_s > 0 ? a->stall_timeout_s : 120.0;
	s->max_record = a->max_record;
	s->publish_bytes = a->publish_bytes < 64 ? 64 : a->publish_bytes;
	s->seq = s->last_tensor_seq = a->seq;
	s->session_id = a->session_id;
	s->published_head = a->ring->head;
	s->cursor = a->cursor;
	s->rt_every = a->ring_tokens_every;
	s->rt_seconds = a->ring_tokens_seconds;
	s->ring_tokens = a->cursor && a->ring_tokens && a->ring_tokens_every > 1;
	s->last_message = sc_now();
	s->frontier_fn = a->frontier;
	s->frontier_user = a->frontier_user;
	s->interrupted = a->interrupted;
	s->interrupt_user = a->interrupt_user;
	*out = s;
	return STRAP_OK;
}

int strap__session_open_attached(const strap__open *o, strap__opened *opened, strap_session **out, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	const strap__attach *a = o ? &o->attach : NULL;
	if (!out || !o || !opened || !o->connect || !o->ring || !o->ring_drop || !o->client || o->out_fd < 0 ||
	    (a->policy != STRAP_POLICY_BLOCK && a->policy != STRAP_POLICY_DROP) || !o->body.codec) {
		se_set(err, STRAP_E_INVALID,
		       "open: connect, ring and ring_drop callbacks, a client, a codec, an output and a "
		       "policy are required");
		return STRAP_E_INVALID;
	}
	*out = NULL;
	strap_session *s = bare_session(true, err);
	if (!s)
		return STRAP_E_NOMEM;
	s->borrowed = true;
	s->resv_cap = 1; /* the caller completes its own copies (frontier), reserving nothing */
	s->resv = calloc(s->resv_cap, sizeof *s->resv);
	s->policy = a->policy;
	s->stall_timeout = a->stall_timeout_s > 0 ? a->stall_timeout_s : 120.0;
	s->interrupted = a->interrupted;
	s->interrupt_user = a->interrupt_user;
	int e = !s->sbuf || !s->rbuf || !s->resv ? ss_fail(s, STRAP_E_NOMEM, "out of memory")
						 : open_with_retries(s, o, opened);
	if (e) {
		if (err) {
			*err = s->err;
			err->fatal = 1;
		}
		strap_session_free(s);
		return e;
	}
	s->seq = s->last_tensor_seq = a->seq;
	s->frontier_fn = a->frontier;
	s->frontier_user = a->frontier_user;
	*out = s;
	return STRAP_OK;
}

/* ----- resume probe ----- */

int strap_resume_probe(const strap_session_params *params, strap_resume_point *out, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	if (!params || !out || !params->output_path || !*params->output_path) {
		se_set(err, STRAP_E_INVALID, "params, params.output_path and out are required");
		return STRAP_E_INVALID;
	}
	memset(out, 0, sizeof *out);
	strap_session *s = bare_session(false, err);
	if (!s)
		return STRAP_E_NOMEM;
	s->fingerprint = dupstr(params->fingerprint ? params->fingerprint : "", NULL);
	s->resume_token = params->resume_token;
	s->resume_token_user = params->resume_token_user;
	int e = !s->sbuf || !s->fingerprint ? ss_fail(s, STRAP_E_NOMEM, "out of memory")
					    : resolve_output(s, params, O_RDONLY);
	bool have_ckpt = !e && access(s->ckpt_path, F_OK) == 0;
	if (!e && s->out_fd < 0 && have_ckpt)
		e = ss_fail(s, STRAP_E_CHECKPOINT, "checkpoint %s exists, but its stream %s does not", s->ckpt_path,
			    s->output_path);
	/* a capture still ending (its process gone, strapd writing its END) is waited for, as the
	 * open waits; a live one is STRAP_E_IN_USE */
	if (!e && s->out_fd >= 0)
		e = sl_lock(s, LOCK_WAIT_S);
	if (!e && s->out_fd >= 0) {
		rs_point pt;
		bool keep = false, complete = false;
		e = find_resume_point(s, have_ckpt, params->resume_max_tokens, &pt, &keep, &complete);
		if (!e && keep)
			*out = (strap_resume_point){.resumed = 1,
						    .token_count = pt.tokens,
						    .forward_count = pt.forwards,
						    .last_seq = pt.last_seq,
						    .stream_offset = pt.offset,
						    .from_stream = pt.from_stream};
		out->complete = complete;
	}
	if (e && err) {
		*err = s->err;
		err->fatal = 1;
	}
	strap_session_free(s);
	return e;
}

/* ----- status ----- */

int strap_status(const char *socket_path, char *buf, size_t len, size_t *needed, strap_error *err)
{
	if (err)
		memset(err, 0, sizeof *err);
	strap_session *s = bare_session(true, err);
	if (!s)
		return STRAP_E_NOMEM;
	int e;
	char path[4200];
	sp_reply r;
	if (!s->sbuf || !s->rbuf) {
		e = ss_fail(s, STRAP_E_NOMEM, "out of memory");
		goto out;
	}
	s->sock = sc_connect(socket_path, 0, NULL, 0, path, sizeof path, &s->err);
	if (s->sock < 0) {
		e = s->sock;
		s->sock = -1;
		goto out;
	}
	sw_buf b = ss_out_buf(s);
	sp_enc_hello(&b, "libstrap/" STRAP_VERSION_STRING, getpid());
	if ((e = ss_send_buf(s, &b, NULL, 0)) || (e = ss_expect(s, SP_WELCOME, 10, &r)))
		goto out;
	b = ss_out_buf(s);
	sp_enc_status(&b);
	if ((e = ss_send_buf(s, &b, NULL, 0)) || (e = ss_expect(s, SP_STATUS_REPLY, 10, &r)))
		goto out;
	if (needed)
		*needed = r.body_len + 1;
	if (!buf || r.body_len + 1 > len) {
		e = ss_fail(s, STRAP_E_TOO_LARGE, "STATUS_REPLY of %zu bytes does not fit %zu", r.body_len, len);
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
