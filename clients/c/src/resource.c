/*
 * Seed 003's resource instrumentation (llama-resource-instrumentation.h) on libstrap: one global
 * instrumentation, its context (session, step, pass, layer, component), the monotonic clock the
 * durations are measured on, and the output — RESOURCES messages through a libstrap session, or
 * lines appended to a JSONL file. The events themselves are made by resource_render.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define LLAMA_RESOURCE_NO_GGML
#include "llama-resource-instrumentation.h"
#include "resource_render.h"

/* Events are sent or written once this many bytes wait (and at a pass's end, flush, end). */
#define FLUSH_BYTES (48 * 1024)
/* The model's thread hands its records to the writer at a pass's end, or when this many wait. */
#define HANDOFF_RECORDS 512
#define MINIMAL_ALLOCATION_BYTES (1LL << 20) /* levels.MINIMAL_ALLOCATION_BYTES */
#define FRACTION_MAX_AGE_NS 250000000LL      /* system.FRACTION_MAX_AGE */
#define NAME_LEN 128
#define MAX_INPUTS 8

/* A tensor as a record keeps it: copies, the caller's memory may be gone by the time the writer
 * renders it. */
struct rtensor {
	char name[64];
	char dtype[24];
	int64_t shape[8];
	int ndim; /* -1: none */
	uint64_t nbytes, address;
};

enum rec_kind { R_MUL_MAT, R_OP, R_ALLOC, R_HANDOFF, R_FORWARD, R_LINE, R_SUMMARY };

/* What the model's thread records of one call: plain copies, no formatting (the writer thread
 * makes the events, as the Python client's writer does). */
struct rec {
	enum rec_kind kind;
	long long ts, step, forward, duration_ns;
	int layer, n_in, has_weight, has_input;
	char component[32], module[NAME_LEN], op[32], mlp_op[16], activation[NAME_LEN / 2], kind_word[16];
	char from[32], to[32];
	struct rtensor in[MAX_INPUTS], weight, input, out;
	char *line; /* R_LINE: a prebuilt event (the session start), malloc'd */
};

struct queue {
	struct rec *r;
	size_t n, cap;
};

struct instr {
	int level, enabled;
	int fd;           /* the JSONL file, or -1 */
	strap_session *s; /* or strapd */
	char session_id[160];
	char model_class[NAME_LEN];
	char activation[NAME_LEN / 2];
	int session_open;
	long long step, forward, forwards, forward_start_ns;
	int layer;
	char component[32];
	long long mark_ns; /* the clock's last mark: an operation's duration runs from it */
	/* the last component ended (its end time, its last output) for the handoff */
	char ended[32];
	long long ended_ns;
	struct rtensor last_out;
	long long clock_offset_ns; /* Unix time - monotonic time, read at init */
	long long self_ns;         /* time inside the API's calls (the model's thread) */
	uint64_t filtered;
	struct queue q; /* the model's thread's records, not handed over yet */

	/* the writer thread and what it owns (wmu guards the hand-over and the counters read by
	 * get_stats) */
	pthread_t thread;
	pthread_mutex_t wmu;
	pthread_cond_t wake, idle;
	struct queue wq; /* handed over, waiting for the writer */
	int writer_busy, stop;
	long long seq;
	long long pass_flops, total_flops, component_flows, parameter_bytes, total_compute_ns;
	long long counts[4]; /* compute_execution, mlp_operation, memory_allocation, component_handoff */
	double fraction;
	long long fraction_at;
	lri_buf buf;
	size_t *ends; /* where each waiting event ends in buf */
	size_t n_ends, cap_ends;
	uint64_t events, bytes;
	long long pub_flops; /* total_flops as of the writer's last batch (under wmu) */
	strap_error err;     /* the first error (model's thread: under mu; writer: under wmu) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct instr *g; /* seed 003's g_resource_instr */

static long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The first error is kept (the model's thread and the writer both report: under wmu). */
static int fail(struct instr *in, int code, const char *fmt, ...)
{
	pthread_mutex_lock(&in->wmu);
	if (in->err.code == STRAP_OK) {
		in->err.code = code;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(in->err.message, sizeof in->err.message, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&in->wmu);
	return code;
}

/* src into dst (truncated to cap - 1 bytes): on the model's thread, so no snprintf */
static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;
	memcpy(dst, src ? src : "", n);
	dst[n] = 0;
}
#define COPY(dst, src) copy_str((dst), sizeof(dst), (src))

/* ----- environment (levels.py) ----- */

static const char *env2(const char *a, const char *b, const char **which)
{
	const char *names[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		const char *v = getenv(names[i]);
		if (v) {
			while (*v == ' ' || *v == '\t')
				v++;
			if (*v) {
				*which = names[i];
				return v;
			}
		}
	}
	return NULL;
}

static int word_eq(const char *v, const char *w)
{
	size_t n = strlen(w);
	if (strncasecmp(v, w, n))
		return 0;
	for (v += n; *v; v++)
		if (*v != ' ' && *v != '\t' && *v != '\n')
			return 0;
	return 1;
}

static int parse_level(const char *v)
{
	static const char *const names[] = {"MINIMAL", "DETAILED", "VERBOSE"};
	for (int i = 0; i < 3; i++)
		if (word_eq(v, names[i]))
			return i + 1;
	if (word_eq(v, "1") || word_eq(v, "2") || word_eq(v, "3"))
		return v[0] - '0';
	return 0;
}

/* *level (when 0 in), *path (when NULL in), *disabled; an error names the variable. */
static int read_env(int *level, const char **path, int *disabled, strap_error *err)
{
	const char *which = NULL;
	const char *v = env2("STRAP_RESOURCE_LOG_LEVEL", "LLAMA_RESOURCE_LOG_LEVEL", &which);
	if (v) {
		int l = parse_level(v);
		if (!l) {
			err->code = STRAP_E_INVALID;
			snprintf(err->message, sizeof err->message,
				 "%s: resource level must be one of MINIMAL, DETAILED, VERBOSE, got '%s'", which, v);
			return STRAP_E_INVALID;
		}
		if (*level == 0)
			*level = l;
	}
	if (*level == 0)
		*level = LLAMA_RESOURCE_MINIMAL;
	v = env2("STRAP_RESOURCE_LOG_PATH", "LLAMA_RESOURCE_LOG_PATH", &which);
	if (!*path)
		*path = v;
	*disabled = 0;
	v = env2("STRAP_RESOURCE_LOG_DISABLED", "LLAMA_RESOURCE_DISABLED", &which);
	if (v) {
		if (word_eq(v, "1") || word_eq(v, "true") || word_eq(v, "yes") || word_eq(v, "on")) {
			*disabled = 1;
		} else if (!(word_eq(v, "0") || word_eq(v, "false") || word_eq(v, "no") || word_eq(v, "off"))) {
			err->code = STRAP_E_INVALID;
			snprintf(err->message, sizeof err->message,
				 "%s must be 1/0, true/false, yes/no or on/off, got '%s'", which, v);
			return STRAP_E_INVALID;
		}
	}
	return STRAP_OK;
}

/* ----- the writer's output ----- */

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Everything rendered goes out: one write, or RESOURCES messages (each event without its '\n').
 * Writer thread (or the model's thread once the writer is gone). */
static int drain(struct instr *in)
{
	if (in->n_ends == 0)
		return STRAP_OK;
	int rc = STRAP_OK;
	if (in->s) {
		const char *evs[256];
		size_t lens[256];
		size_t start = 0;
		for (size_t i = 0; i < in->n_ends && rc == STRAP_OK;) {
			size_t k = 0;
			for (; k < 256 && i < in->n_ends; k++, i++) {
				evs[k] = in->buf.p + start;
				lens[k] = in->ends[i] - start - 1;
				start = in->ends[i];
			}
			rc = strap_session_resources(in->s, evs, lens, k);
			if (rc != STRAP_OK) {
				strap_error e;
				strap_session_last_error(in->s, &e);
				fail(in, rc, "sending resource events to strapd: %s", e.message);
			}
		}
	} else if (write_all(in->fd, in->buf.p, in->buf.len) < 0) {
		rc = fail(in, STRAP_E_SYSTEM, "writing the resource log: %s", strerror(errno));
	}
	if (rc == STRAP_OK) {
		pthread_mutex_lock(&in->wmu);
		in->events += in->n_ends;
		in->bytes += in->buf.len;
		pthread_mutex_unlock(&in->wmu);
	}
	in->buf.len = 0;
	in->n_ends = 0;
	return rc;
}

/* The events rendered since `mark` are queued for output; n_events < 0: rendering failed. */
static int took(struct instr *in, size_t mark, int n_events)
{
	if (n_events < 0) {
		in->buf.len = mark;
		return fail(in, STRAP_E_NOMEM, "out of memory rendering a resource event");
	}
	size_t pos = mark;
	for (int i = 0; i < n_events; i++) {
		char *nl = memchr(in->buf.p + pos, '\n', in->buf.len - pos);
		if (!nl)
			return fail(in, STRAP_E_SYSTEM, "a rendered resource event has no end");
		if (in->n_ends == in->cap_ends) {
			size_t cap = in->cap_ends ? in->cap_ends * 2 : 256;
			size_t *e = realloc(in->ends, cap * sizeof *e);
			if (!e)
				return fail(in, STRAP_E_NOMEM, "out of memory queueing resource events");
			in->ends = e;
			in->cap_ends = cap;
		}
		pos = (size_t)(nl - in->buf.p) + 1;
		in->ends[in->n_ends++] = pos;
	}
	return in->buf.len >= FLUSH_BYTES ? drain(in) : STRAP_OK;
}

/* The process's resident set (MemoryReader.read): -1 when /proc cannot say. */
static long long read_rss(void)
{
	int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char s[128];
	ssize_t n = read(fd, s, sizeof s - 1);
	close(fd);
	if (n <= 0)
		return -1;
	s[n] = 0;
	long long size, res;
	if (sscanf(s, "%lld %lld", &size, &res) != 2)
		return -1;
	return res * sysconf(_SC_PAGESIZE);
}

/* 1 - MemAvailable/MemTotal (system.host_memory_fraction), -1 when unknown. */
static double read_fraction(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return -1;
	char line[256];
	long long total = -1, avail = -1;
	while (fgets(line, sizeof line, f) && (total < 0 || avail < 0)) {
		if (!strncmp(line, "MemTotal:", 9))
			total = atoll(line + 9);
		else if (!strncmp(line, "MemAvailable:", 13))
			avail = atoll(line + 13);
	}
	fclose(f);
	if (total <= 0 || avail < 0)
		return -1;
	return 1.0 - (double)avail / (double)total;
}

static long long peak_rss(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return -1;
	char line[256];
	long long kb = -1;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = atoll(line + 6);
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

static void iso_now(char *out, size_t cap)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char s[32];
	strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, cap, "%.20s.%06d+00:00", s, (int)(ts.tv_nsec / 1000));
}

static const char *const level_names[] = {"", "MINIMAL", "DETAILED", "VERBOSE"};
static const char *const count_names[] = {"compute_execution", "mlp_operation", "memory_allocation",
					  "component_handoff"};
enum { C_COMPUTE, C_MLP, C_ALLOC, C_HANDOFF, N_COUNTS };

/* ----- the writer: records to events ----- */

static llama_resource_tensor view(const struct rtensor *t)
{
	llama_resource_tensor d = {t->name[0] ? t->name : NULL,
				   t->ndim >= 0 ? t->shape : NULL,
				   t->ndim,
				   t->dtype[0] ? t->dtype : NULL,
				   t->nbytes,
				   t->address};
	return d;
}

static void add_flops(struct instr *in, long long flops, long long ns)
{
	in->pass_flops += flops;
	in->total_flops += flops;
	in->total_compute_ns += ns;
}

static void render(struct instr *in, struct rec *r)
{
	struct lri_ctx c = {
		in->session_id, r->ts, ++in->seq, r->step, r->forward, r->layer, r->component[0] ? r->component : NULL};
	size_t mark = in->buf.len;
	long long flops = 0;
	int n = 0;
	switch (r->kind) {
	case R_MUL_MAT: {
		llama_resource_tensor w = view(&r->weight), x = view(&r->input), o = view(&r->out);
		n = lri_event_mul_mat(&in->buf, &c, r->module, r->has_weight ? &w : NULL, r->has_input ? &x : NULL, &o,
				      r->duration_ns, "perf_counter", r->mlp_op[0] ? r->mlp_op : NULL,
				      r->activation[0] ? r->activation : NULL, &flops);
		if (n == 2)
			in->seq++;
		if (n > 0) {
			in->counts[C_COMPUTE]++;
			in->counts[C_MLP] += n - 1;
			add_flops(in, flops, r->duration_ns);
		}
		break;
	}
	case R_OP: {
		llama_resource_tensor ins[MAX_INPUTS], o = view(&r->out);
		for (int i = 0; i < r->n_in; i++)
			ins[i] = view(&r->in[i]);
		n = lri_event_op(&in->buf, &c, r->module, r->op, ins, r->n_in, &o, r->duration_ns, "perf_counter",
				 &flops);
		if (n > 0) {
			in->counts[C_COMPUTE]++;
			add_flops(in, flops, r->duration_ns);
		}
		break;
	}
	case R_ALLOC: {
		llama_resource_tensor t = view(&r->out);
		n = lri_event_alloc(&in->buf, &c, r->module, r->kind_word, &t, read_rss());
		if (n > 0) {
			in->counts[C_ALLOC]++;
			if (!strcmp(r->kind_word, "parameters"))
				in->parameter_bytes += (long long)r->out.nbytes;
		}
		break;
	}
	case R_HANDOFF: {
		/* the machine's memory use, read by the writer at most every 0.25 s (system.py) */
		long long now = mono_ns();
		if (now - in->fraction_at > FRACTION_MAX_AGE_NS) {
			in->fraction = read_fraction();
			in->fraction_at = now;
		}
		llama_resource_tensor t = view(&r->out);
		n = lri_event_handoff(&in->buf, &c, r->module, r->from, r->to, &t, r->duration_ns, "perf_counter",
				      in->fraction, "proc_meminfo_used_over_total");
		if (n > 0) {
			in->counts[C_HANDOFF]++;
			in->component_flows++;
		}
		break;
	}
	case R_FORWARD:
		/* the pass's FLOPs: the sum of its recorded ops, all rendered before this one */
		n = lri_event_forward(&in->buf, &c, in->pass_flops, r->duration_ns, "perf_counter", read_rss());
		if (n > 0)
			in->counts[C_COMPUTE]++;
		in->pass_flops = 0;
		break;
	case R_LINE: /* a session start: not numbered, and the session's counters start again */
		n = lri_put(&in->buf, r->line, strlen(r->line)) < 0 ? -1 : 1;
		free(r->line);
		r->line = NULL;
		in->seq = 0;
		in->pass_flops = in->total_flops = in->component_flows = in->parameter_bytes = 0;
		in->total_compute_ns = 0;
		memset(in->counts, 0, sizeof in->counts);
		break;
	case R_SUMMARY: {
		in->seq--;
		char iso[64];
		iso_now(iso, sizeof iso);
		struct lri_summary sm = {in->session_id,
					 iso,
					 level_names[in->level],
					 wall_ns() / 1000,
					 r->forward, /* the session's pass count */
					 in->parameter_bytes,
					 in->total_flops,
					 in->component_flows,
					 r->duration_ns, /* the API's own time */
					 peak_rss(),
					 in->total_compute_ns,
					 count_names,
					 in->counts,
					 N_COUNTS};
		n = lri_event_session_summary(&in->buf, &sm);
		break;
	}
	}
	took(in, mark, n);
}

static void *writer_main(void *arg)
{
	struct instr *in = arg;
	struct queue mine = {0};
	pthread_mutex_lock(&in->wmu);
	for (;;) {
		while (!in->wq.n && !in->stop)
			pthread_cond_wait(&in->wake, &in->wmu);
		if (!in->wq.n && in->stop)
			break;
		struct queue t = in->wq; /* take the batch, leave an empty array */
		in->wq = mine;
		mine = t;
		in->writer_busy = 1;
		pthread_mutex_unlock(&in->wmu);
		for (size_t i = 0; i < mine.n; i++)
			render(in, &mine.r[i]);
		drain(in);
		mine.n = 0;
		pthread_mutex_lock(&in->wmu);
		in->pub_flops = in->total_flops;
		in->writer_busy = 0;
		pthread_cond_broadcast(&in->idle);
	}
	pthread_mutex_unlock(&in->wmu);
	free(mine.r);
	return NULL;
}

/* ----- the model's thread: records ----- */

/* A new record at the end of the queue (NULL: out of memory, reported). */
static struct rec *push(struct instr *in, enum rec_kind kind, long long now)
{
	if (in->q.n == in->q.cap) {
		size_t cap = in->q.cap ? in->q.cap * 2 : 256;
		struct rec *r = realloc(in->q.r, cap * sizeof *r);
		if (!r) {
			fail(in, STRAP_E_NOMEM, "out of memory recording a resource event");
			return NULL;
		}
		in->q.r = r;
		in->q.cap = cap;
	}
	struct rec *r = &in->q.r[in->q.n++];
	r->kind = kind;
	r->ts = (now + in->clock_offset_ns) / 1000;
	r->step = in->step;
	r->forward = in->forward;
	r->layer = in->layer;
	COPY(r->component, in->component);
	r->module[0] = r->op[0] = r->mlp_op[0] = r->activation[0] = r->kind_word[0] = 0;
	r->line = NULL;
	r->n_in = r->has_weight = r->has_input = 0;
	r->out.ndim = -1;
	return r;
}

static void keep(struct rtensor *dst, const llama_resource_tensor *t)
{
	if (!t || t->ndim < 0) {
		dst->ndim = -1;
		dst->name[0] = dst->dtype[0] = 0;
		dst->nbytes = dst->address = 0;
		return;
	}
	COPY(dst->name, t->name);
	COPY(dst->dtype, t->dtype);
	dst->ndim = t->ndim > 8 ? 8 : t->ndim;
	if (dst->ndim)
		memcpy(dst->shape, t->shape, (size_t)dst->ndim * sizeof *t->shape);
	dst->nbytes = t->nbytes;
	dst->address = t->address;
}

/* The records so far go to the writer (wait: until it has written them). */
static void hand_over(struct instr *in, int wait)
{
	pthread_mutex_lock(&in->wmu);
	if (in->q.n) {
		if (in->wq.n == 0) { /* swap arrays: no copy */
			struct queue t = in->wq;
			in->wq = in->q;
			in->q = t;
		} else { /* the writer has not taken the last batch yet: append to it */
			size_t need = in->wq.n + in->q.n;
			if (need > in->wq.cap) {
				struct rec *r = realloc(in->wq.r, need * sizeof *r);
				if (!r) {
					pthread_mutex_unlock(&in->wmu);
					fail(in, STRAP_E_NOMEM, "out of memory handing resource events over");
					return;
				}
				in->wq.r = r;
				in->wq.cap = need;
			}
			memcpy(in->wq.r + in->wq.n, in->q.r, in->q.n * sizeof *in->q.r);
			in->wq.n = need;
			in->q.n = 0;
		}
		pthread_cond_signal(&in->wake);
	}
	while (wait && (in->wq.n || in->writer_busy))
		pthread_cond_wait(&in->idle, &in->wmu);
	pthread_mutex_unlock(&in->wmu);
}

static void queued(struct instr *in)
{
	if (in->q.n >= HANDOFF_RECORDS)
		hand_over(in, 0);
}

/* ----- lifecycle ----- */

static void free_locked(void);

static int init_locked(int level, const char *path, strap_session *s)
{
	free_locked();
	static struct instr refused; /* holds the error of a refused init */
	strap_error err = {0};
	int disabled;
	if (level < 0 || level > 3) {
		err.code = STRAP_E_INVALID;
		snprintf(err.message, sizeof err.message, "resource level must be 0-3, got %d", level);
		goto refuse;
	}
	if (read_env(&level, &path, &disabled, &err) != STRAP_OK)
		goto refuse;
	if (!s && !path) {
		err.code = STRAP_E_INVALID;
		snprintf(err.message, sizeof err.message,
			 "resource instrumentation needs a path (or STRAP_RESOURCE_LOG_PATH) or a session");
		goto refuse;
	}
	struct instr *in = calloc(1, sizeof *in);
	if (!in)
		return STRAP_E_NOMEM;
	in->fd = -1;
	if (!s) {
		in->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (in->fd < 0) {
			err.code = STRAP_E_SYSTEM;
			snprintf(err.message, sizeof err.message, "%s: %s", path, strerror(errno));
			free(in);
			goto refuse;
		}
	}
	pthread_mutex_init(&in->wmu, NULL);
	pthread_cond_init(&in->wake, NULL);
	pthread_cond_init(&in->idle, NULL);
	if (pthread_create(&in->thread, NULL, writer_main, in) != 0) {
		err.code = STRAP_E_SYSTEM;
		snprintf(err.message, sizeof err.message, "starting the resource writer thread: %s", strerror(errno));
		if (in->fd >= 0)
			close(in->fd);
		free(in);
		goto refuse;
	}
	in->s = s;
	in->level = level;
	in->enabled = !disabled;
	in->layer = -1;
	in->forward = -1;
	in->fraction = -1;
	in->fraction_at = -FRACTION_MAX_AGE_NS - 1;
	in->clock_offset_ns = wall_ns() - mono_ns();
	in->mark_ns = mono_ns();
	COPY(in->model_class, "llama.cpp");
	g = in;
	return STRAP_OK;
refuse:
	memset(&refused, 0, sizeof refused);
	refused.err = err;
	refused.fd = -1;
	g = &refused;
	return err.code;
}

int llama_resource_instrumentation_init(int level, const char *path)
{
	pthread_mutex_lock(&mu);
	int rc = init_locked(level, path, NULL);
	pthread_mutex_unlock(&mu);
	return rc;
}

int llama_resource_instrumentation_init_session(int level, strap_session *s)
{
	if (!s)
		return STRAP_E_INVALID;
	pthread_mutex_lock(&mu);
	int rc = init_locked(level, NULL, s);
	pthread_mutex_unlock(&mu);
	return rc;
}

/* The instrumentation, when one runs (level > 0), with the mutex held; else NULL, unlocked. */
static struct instr *enter(void)
{
	pthread_mutex_lock(&mu);
	if (!g || g->level == 0) {
		pthread_mutex_unlock(&mu);
		return NULL;
	}
	return g;
}

static int leave(struct instr *in, long long t0, int rc)
{
	in->self_ns += mono_ns() - t0;
	pthread_mutex_unlock(&mu);
	return rc;
}

static int err_code(struct instr *in)
{
	pthread_mutex_lock(&in->wmu);
	int e = in->err.code;
	pthread_mutex_unlock(&in->wmu);
	return e;
}

static int end_session_locked(struct instr *in);

static void free_locked(void)
{
	struct instr *in = g;
	g = NULL;
	if (!in || in->level == 0)
		return;
	if (in->session_open)
		end_session_locked(in);
	hand_over(in, 1);
	pthread_mutex_lock(&in->wmu);
	in->stop = 1;
	pthread_cond_signal(&in->wake);
	pthread_mutex_unlock(&in->wmu);
	pthread_join(in->thread, NULL);
	if (in->fd >= 0)
		close(in->fd);
	for (size_t i = 0; i < in->q.n; i++)
		free(in->q.r[i].line);
	free(in->q.r);
	free(in->wq.r);
	free(in->buf.p);
	free(in->ends);
	pthread_cond_destroy(&in->wake);
	pthread_cond_destroy(&in->idle);
	pthread_mutex_destroy(&in->wmu);
	free(in);
}

int llama_resource_instrumentation_free(void)
{
	pthread_mutex_lock(&mu);
	struct instr *in = g;
	int rc = STRAP_OK;
	if (in && in->level) {
		if (in->session_open)
			end_session_locked(in);
		hand_over(in, 1);
		rc = err_code(in);
	}
	free_locked();
	pthread_mutex_unlock(&mu);
	return rc;
}

/* ----- sessions ----- */

static int begin_session_locked(struct instr *in, const char *id, long long t0)
{
	if (in->session_open)
		end_session_locked(in);
	hand_over(in, 1); /* the writer renders with the session's id: none of the old one waits */
	if (id && *id) {
		COPY(in->session_id, id);
	} else {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		struct tm tm;
		gmtime_r(&ts.tv_sec, &tm);
		char t[32];
		strftime(t, sizeof t, "%Y%m%d_%H%M%S", &tm);
		snprintf(in->session_id, sizeof in->session_id, "resource_sess_%.20s_%06d_%ld", t,
			 (int)(ts.tv_nsec / 1000), (long)getpid());
	}
	in->session_open = 1;
	in->forwards = 0;
	in->self_ns = 0;
	char iso[64];
	iso_now(iso, sizeof iso);
	lri_buf b = {0};
	if (lri_event_session_start(&b, in->session_id, wall_ns() / 1000, iso, level_names[in->level], in->enabled,
				    in->model_class, (long long)getpid()) < 0 ||
	    lri_put(&b, "", 1) < 0) { /* its NUL */
		free(b.p);
		return fail(in, STRAP_E_NOMEM, "out of memory rendering the session start");
	}
	struct rec *r = push(in, R_LINE, t0);
	if (!r) {
		free(b.p);
		return STRAP_E_NOMEM;
	}
	r->line = b.p;
	return STRAP_OK;
}

static int end_session_locked(struct instr *in)
{
	if (!in->session_open)
		return STRAP_OK;
	in->session_open = 0;
	struct rec *r = push(in, R_SUMMARY, mono_ns());
	if (r) {
		r->forward = in->forwards;
		r->duration_ns = in->self_ns;
	}
	hand_over(in, 1);
	return err_code(in);
}

int llama_resource_begin_session(const char *session_id)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	return in ? leave(in, t0, begin_session_locked(in, session_id, t0)) : STRAP_OK;
}

int llama_resource_end_session(void)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	return in ? leave(in, t0, end_session_locked(in)) : STRAP_OK;
}

int llama_resource_set_model_class(const char *model_class)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	COPY(in->model_class, model_class ? model_class : "llama.cpp");
	return leave(in, t0, STRAP_OK);
}

int llama_resource_set_activation_function(const char *name)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	COPY(in->activation, name);
	return leave(in, t0, STRAP_OK);
}
/* ----- context ----- */

int llama_resource_begin_layer(int layer_id)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	in->layer = layer_id < 0 ? -1 : layer_id;
	in->mark_ns = t0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_end_layer(int layer_id)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (in->layer == layer_id)
		in->layer = -1;
	in->component[0] = 0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_begin_component(const char *component)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	COPY(in->component, component);
	in->mark_ns = t0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_end_component(const char *component)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	COPY(in->ended, component);
	in->ended_ns = t0;
	in->component[0] = 0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_begin_forward(long long step)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	in->step = step;
	in->forward++;
	in->forwards++;
	in->forward_start_ns = t0;
	in->mark_ns = t0;
	in->layer = -1;
	in->component[0] = 0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_end_forward(void)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (in->enabled) {
		struct rec *r = push(in, R_FORWARD, t0);
		if (r) {
			r->layer = -1;
			COPY(r->component, "model");
			r->duration_ns = t0 - in->forward_start_ns;
		}
	}
	/* the pass's records go to the writer, which makes and writes them while the next pass runs */
	hand_over(in, 0);
	return leave(in, t0, err_code(in));
}

/* ----- events ----- */

/* The duration of an operation ending now: given, or since the clock's last mark. */
static long long took_ns(struct instr *in, long long now, long long given)
{
	long long d = given >= 0 ? given : now - in->mark_ns;
	in->mark_ns = now;
	return d;
}

static void remember_output(struct instr *in, const llama_resource_tensor *t)
{
	if (t && t->ndim >= 0) {
		keep(&in->last_out, t);
		in->last_out.name[0] = 0;
	}
}

static const char *mlp_name(const char *op)
{
	if (!op)
		return NULL;
	if (!strcmp(op, "ffn_gate") || !strcmp(op, "gate_proj"))
		return "gate_proj";
	if (!strcmp(op, "ffn_up") || !strcmp(op, "up_proj"))
		return "up_proj";
	if (!strcmp(op, "ffn_down") || !strcmp(op, "down_proj"))
		return "down_proj";
	return NULL;
}

/* The level an operation is recorded from (levels.py, RESOURCE_EVENTS.md "Levels"). */
static int op_level(const char *op)
{
	if (!strcmp(op, "mul_mat") || !strcmp(op, "attention") || !strcmp(op, "flash_attn_ext"))
		return LLAMA_RESOURCE_MINIMAL;
	if (!strcmp(op, "rms_norm") || !strcmp(op, "norm") || !strcmp(op, "layer_norm") || !strcmp(op, "silu") ||
	    !strcmp(op, "gelu") || !strcmp(op, "relu") || !strcmp(op, "swiglu") || !strcmp(op, "geglu") ||
	    !strcmp(op, "reglu") || !strcmp(op, "embedding"))
		return LLAMA_RESOURCE_DETAILED;
	return LLAMA_RESOURCE_VERBOSE;
}

static int log_mul_mat(struct instr *in, long long t0, const char *name, const llama_resource_tensor *weight,
		       const llama_resource_tensor *input, const llama_resource_tensor *out, long long duration_ns,
		       const char *mlp_op)
{
	long long d = took_ns(in, t0, duration_ns);
	struct rec *r = push(in, R_MUL_MAT, t0);
	if (!r)
		return STRAP_E_NOMEM;
	COPY(r->module, name);
	COPY(r->mlp_op, mlp_op);
	COPY(r->activation, in->activation);
	r->has_weight = weight != NULL;
	r->has_input = input != NULL;
	keep(&r->weight, weight);
	keep(&r->input, input);
	keep(&r->out, out);
	r->duration_ns = d;
	remember_output(in, out);
	queued(in);
	return STRAP_OK;
}

int llama_resource_log_compute(const char *operation, const char *name, const llama_resource_tensor *inputs,
			       size_t n_inputs, const llama_resource_tensor *output, long long duration_ns)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (!operation || (n_inputs && !inputs)) {
		in->mark_ns = t0;
		return leave(in, t0, fail(in, STRAP_E_INVALID, "log_compute: operation or inputs NULL"));
	}
	int lv = op_level(operation);
	if (!in->enabled || lv > in->level) {
		in->filtered++;
		in->mark_ns = t0;
		remember_output(in, output);
		return leave(in, t0, STRAP_OK);
	}
	int rc;
	if (!strcmp(operation, "mul_mat")) {
		const llama_resource_tensor *w = n_inputs >= 2 ? &inputs[0] : NULL;
		const llama_resource_tensor *x = n_inputs >= 2 ? &inputs[1] : n_inputs == 1 ? &inputs[0] : NULL;
		rc = log_mul_mat(in, t0, name, w, x, output, duration_ns, NULL);
	} else {
		long long d = took_ns(in, t0, duration_ns);
		struct rec *r = push(in, R_OP, t0);
		if (!r)
			return leave(in, t0, STRAP_E_NOMEM);
		/* outside a component a norm or an embedding is its own (sites.component_of) */
		if (!r->component[0] && lv == LLAMA_RESOURCE_DETAILED)
			COPY(r->component, strstr(operation, "norm")         ? "norm"
					   : !strcmp(operation, "embedding") ? "embedding"
									     : "");
		COPY(r->module, name);
		COPY(r->op, operation);
		r->n_in = n_inputs > MAX_INPUTS ? MAX_INPUTS : (int)n_inputs;
		for (int i = 0; i < r->n_in; i++)
			keep(&r->in[i], &inputs[i]);
		keep(&r->out, output);
		r->duration_ns = d;
		remember_output(in, output);
		queued(in);
		rc = STRAP_OK;
	}
	return leave(in, t0, rc);
}

int llama_resource_log_mlp(const char *mlp_operation, const llama_resource_tensor *weight,
			   const llama_resource_tensor *input, const llama_resource_tensor *output,
			   long long duration_ns)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	const char *op = mlp_name(mlp_operation);
	if (!op || !output) {
		in->mark_ns = t0;
		return leave(in, t0,
			     fail(in, STRAP_E_INVALID, "log_mlp: '%s' is not gate_proj/up_proj/down_proj, or no output",
				  mlp_operation ? mlp_operation : "(null)"));
	}
	if (!in->enabled) {
		in->filtered++;
		in->mark_ns = t0;
		return leave(in, t0, STRAP_OK);
	}
	/* the projection's module in the Python client's names: model.layers.N.mlp.gate_proj */
	char module[NAME_LEN];
	if (in->layer >= 0)
		snprintf(module, sizeof module, "model.layers.%d.mlp.%s", in->layer, op);
	else
		snprintf(module, sizeof module, "mlp.%s", op);
	return leave(in, t0, log_mul_mat(in, t0, module, weight, input, output, duration_ns, op));
}

int llama_resource_log_allocation(const llama_resource_tensor *tensor, const char *name, const char *kind)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (!tensor || !kind) {
		in->mark_ns = t0;
		return leave(in, t0, fail(in, STRAP_E_INVALID, "log_allocation: tensor or kind NULL"));
	}
	if (!in->enabled ||
	    (in->level == LLAMA_RESOURCE_MINIMAL && (long long)tensor->nbytes <= MINIMAL_ALLOCATION_BYTES)) {
		in->filtered++;
		return leave(in, t0, STRAP_OK);
	}
	struct rec *r = push(in, R_ALLOC, t0);
	if (!r)
		return leave(in, t0, STRAP_E_NOMEM);
	COPY(r->module, name);
	COPY(r->kind_word, kind);
	keep(&r->out, tensor);
	queued(in);
	return leave(in, t0, STRAP_OK);
}

int llama_resource_log_handoff(const char *from, const char *to, const llama_resource_tensor *tensor)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (!from || !to) {
		in->mark_ns = t0;
		return leave(in, t0, fail(in, STRAP_E_INVALID, "log_handoff: from or to NULL"));
	}
	if (!in->enabled || in->level < LLAMA_RESOURCE_DETAILED) {
		in->filtered++;
		return leave(in, t0, STRAP_OK);
	}
	struct rec *r = push(in, R_HANDOFF, t0);
	if (!r)
		return leave(in, t0, STRAP_E_NOMEM);
	/* at the start of `to`, as the Python client's handoff (the MLP's start); its module is the
	 * receiving block's ("model.layers.N.mlp"); the gap runs since `from` ended (0 when it has
	 * not: a handoff logged inside it) */
	COPY(r->component, to);
	if (in->layer >= 0)
		snprintf(r->module, sizeof r->module, "model.layers.%d.%s", in->layer, to);
	else
		COPY(r->module, to);
	COPY(r->from, from);
	COPY(r->to, to);
	r->duration_ns = !strcmp(in->ended, from) ? t0 - in->ended_ns : 0;
	if (tensor)
		keep(&r->out, tensor);
	else
		r->out = in->last_out;
	queued(in);
	return leave(in, t0, STRAP_OK);
}

/* ----- control ----- */

int llama_resource_set_level(int level)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	if (level < 1 || level > 3)
		return leave(in, t0,
			     fail(in, STRAP_E_INVALID, "resource level must be 1-3 (MINIMAL, DETAILED, VERBOSE)"));
	in->level = level;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_disable(void)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	in->enabled = 0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_enable(void)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	in->enabled = 1;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_flush(void)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	hand_over(in, 1);
	return leave(in, t0, err_code(in));
}

int llama_resource_get_level(void)
{
	pthread_mutex_lock(&mu);
	int l = g ? g->level : 0;
	pthread_mutex_unlock(&mu);
	return l;
}

int llama_resource_enabled(void)
{
	pthread_mutex_lock(&mu);
	int e = g && g->level ? g->enabled : 0;
	pthread_mutex_unlock(&mu);
	return e;
}

void llama_resource_last_error(strap_error *out)
{
	pthread_mutex_lock(&mu);
	if (g && g->level) {
		pthread_mutex_lock(&g->wmu);
		*out = g->err;
		pthread_mutex_unlock(&g->wmu);
	} else if (g) {
		*out = g->err;
	} else {
		memset(out, 0, sizeof *out);
	}
	pthread_mutex_unlock(&mu);
}

llama_resource_stats llama_resource_get_stats(void)
{
	llama_resource_stats st;
	memset(&st, 0, sizeof st);
	pthread_mutex_lock(&mu);
	if (g && g->level) {
		pthread_mutex_lock(&g->wmu);
		st.events = g->events;
		st.bytes = g->bytes;
		st.total_flops = g->pub_flops;
		pthread_mutex_unlock(&g->wmu);
		st.filtered = g->filtered;
		st.self_ns = (uint64_t)g->self_ns;
	}
	pthread_mutex_unlock(&mu);
	return st;
}
