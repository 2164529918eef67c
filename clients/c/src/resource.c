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
#define MINIMAL_ALLOCATION_BYTES (1LL << 20) /* levels.MINIMAL_ALLOCATION_BYTES */
#define FRACTION_MAX_AGE_NS 250000000LL      /* system.FRACTION_MAX_AGE */
#define NAME_LEN 128

struct instr {
	int level, enabled;
	int fd;           /* the JSONL file, or -1 */
	strap_session *s; /* or strapd */
	char session_id[160];
	char model_class[NAME_LEN];
	char activation[NAME_LEN];
	int session_open;
	long long step, forward, forwards, forward_start_ns;
	long long pass_flops;
	int layer;
	char component[NAME_LEN];
	long long mark_ns; /* the clock's last mark: an operation's duration runs from it */
	/* the last component ended (its end time, its last output) for the handoff */
	char ended[NAME_LEN];
	long long ended_ns;
	int64_t last_out_shape[16];
	llama_resource_tensor last_out;
	char last_out_dtype[32];
	double fraction;
	long long fraction_at;
	long long seq;
	long long clock_offset_ns; /* Unix time - monotonic time, read at init */
	/* counters of the summary */
	long long total_flops, component_flows, parameter_bytes;
	double total_compute_us;
	long long counts[5]; /* compute_execution, mlp_operation, memory_allocation, component_handoff, kv */
	lri_buf buf;
	size_t *ends; /* where each waiting event ends in buf */
	size_t n_ends, cap_ends;
	llama_resource_stats stats;
	strap_error err;
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

static int fail(struct instr *in, int code, const char *fmt, ...)
{
	if (in->err.code == STRAP_OK) {
		in->err.code = code;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(in->err.message, sizeof in->err.message, fmt, ap);
		va_end(ap);
	}
	return code;
}

static void copy_name(char *dst, const char *src)
{
	snprintf(dst, NAME_LEN, "%s", src ? src : "");
}

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

/* ----- output ----- */

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

/* Everything waiting goes out: one write, or RESOURCES messages (each event without its '\n'). */
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
		in->stats.events += in->n_ends;
		in->stats.bytes += in->buf.len;
	}
	in->buf.len = 0;
	in->n_ends = 0;
	return rc;
}

/* The events lri_event_* appended since `mark` are counted; sent when enough wait. */
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

static struct lri_ctx ctx_now(struct instr *in, long long end_mono)
{
	struct lri_ctx c = {in->session_id, (end_mono + in->clock_offset_ns) / 1000, ++in->seq, in->step, in->forward,
			    in->layer,      in->component[0] ? in->component : NULL};
	return c;
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

/* ----- lifecycle ----- */

static void free_locked(void);

static int init_locked(int level, const char *path, strap_session *s)
{
	free_locked();
	if (level < 0 || level > 3)
		return STRAP_E_INVALID;
	strap_error err = {0};
	int disabled;
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
	in->s = s;
	in->level = level;
	in->enabled = !disabled;
	in->layer = -1;
	in->forward = -1;
	in->fraction = -1;
	in->fraction_at = -FRACTION_MAX_AGE_NS - 1;
	in->clock_offset_ns = wall_ns() - mono_ns();
	in->mark_ns = mono_ns();
	copy_name(in->model_class, "llama.cpp");
	g = in;
	return STRAP_OK;
refuse:
	/* no instrumentation to hold the error: keep it in a static one */
	{
		static struct instr refused;
		memset(&refused, 0, sizeof refused);
		refused.err = err;
		refused.fd = -1;
		refused.enabled = 0;
		g = &refused;
		g->level = 0;
	}
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
	in->stats.self_ns += mono_ns() - t0;
	pthread_mutex_unlock(&mu);
	return rc;
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
	drain(in);
	if (in->fd >= 0)
		close(in->fd);
	free(in->buf.p);
	free(in->ends);
	free(in);
}

int llama_resource_instrumentation_free(void)
{
	pthread_mutex_lock(&mu);
	int rc = g && g->level ? g->err.code : STRAP_OK;
	free_locked();
	pthread_mutex_unlock(&mu);
	return rc;
}

/* ----- sessions ----- */

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

static int begin_session_locked(struct instr *in, const char *id)
{
	if (in->session_open)
		end_session_locked(in);
	if (id && *id) {
		snprintf(in->session_id, sizeof in->session_id, "%s", id);
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
	in->seq = 0;
	in->forwards = 0;
	in->total_flops = in->component_flows = in->parameter_bytes = 0;
	in->total_compute_us = 0;
	memset(in->counts, 0, sizeof in->counts);
	char iso[64];
	iso_now(iso, sizeof iso);
	size_t mark = in->buf.len;
	int n = lri_event_session_start(&in->buf, in->session_id, wall_ns() / 1000, iso, level_names[in->level],
					in->enabled, in->model_class, (long long)getpid());
	return took(in, mark, n);
}

static int end_session_locked(struct instr *in)
{
	if (!in->session_open)
		return STRAP_OK;
	in->session_open = 0;
	char iso[64];
	iso_now(iso, sizeof iso);
	struct lri_summary sm = {in->session_id,
				 iso,
				 level_names[in->level],
				 wall_ns() / 1000,
				 in->forwards,
				 in->parameter_bytes,
				 in->total_flops,
				 in->component_flows,
				 (long long)in->stats.self_ns,
				 peak_rss(),
				 (long long)(in->total_compute_us * 1000.0 + 0.5),
				 count_names,
				 in->counts,
				 N_COUNTS};
	size_t mark = in->buf.len;
	int rc = took(in, mark, lri_event_session_summary(&in->buf, &sm));
	int rd = drain(in);
	return rc ? rc : rd;
}

int llama_resource_begin_session(const char *session_id)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	return in ? leave(in, t0, begin_session_locked(in, session_id)) : STRAP_OK;
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
	copy_name(in->model_class, model_class ? model_class : "llama.cpp");
	return leave(in, t0, STRAP_OK);
}

int llama_resource_set_activation_function(const char *name)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	copy_name(in->activation, name);
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
	copy_name(in->component, component);
	in->mark_ns = t0;
	return leave(in, t0, STRAP_OK);
}

int llama_resource_end_component(const char *component)
{
	long long t0 = mono_ns();
	struct instr *in = enter();
	if (!in)
		return STRAP_OK;
	copy_name(in->ended, component);
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
	in->pass_flops = 0;
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
	int rc = STRAP_OK;
	if (in->enabled) {
		struct lri_ctx c = ctx_now(in, t0);
		c.layer = -1;
		c.component = "model";
		size_t mark = in->buf.len;
		rc = took(in, mark,
			  lri_event_forward(&in->buf, &c, in->pass_flops, t0 - in->forward_start_ns, "perf_counter",
					    read_rss()));
		if (rc == STRAP_OK)
			in->counts[C_COMPUTE]++;
		int rd = drain(in);
		rc = rc ? rc : rd;
	}
	return leave(in, t0, rc);
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
	if (!t || t->ndim < 0)
		return;
	in->last_out = *t;
	int n = t->ndim > 16 ? 16 : t->ndim;
	memcpy(in->last_out_shape, t->shape, (size_t)n * sizeof *t->shape);
	in->last_out.shape = in->last_out_shape;
	in->last_out.ndim = n;
	snprintf(in->last_out_dtype, sizeof in->last_out_dtype, "%s", t->dtype ? t->dtype : "");
	in->last_out.dtype = in->last_out_dtype;
	in->last_out.name = NULL;
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
	struct lri_ctx c = ctx_now(in, t0);
	long long flops = 0;
	size_t mark = in->buf.len;
	int n = lri_event_mul_mat(&in->buf, &c, name, weight, input, out, d, "perf_counter", mlp_op,
				  in->activation[0] ? in->activation : NULL, &flops);
	if (n == 2)
		in->seq++;
	int rc = took(in, mark, n);
	if (rc == STRAP_OK) {
		in->counts[C_COMPUTE]++;
		if (n == 2)
			in->counts[C_MLP]++;
		in->pass_flops += flops;
		in->total_flops += flops;
		in->stats.total_flops += flops;
		in->total_compute_us += (double)d / 1000.0;
	}
	remember_output(in, out);
	return rc;
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
	if (!in->enabled || op_level(operation) > in->level) {
		in->stats.filtered++;
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
		struct lri_ctx c = ctx_now(in, t0);
		/* outside a component a norm or an embedding is its own (sites.component_of) */
		if (!c.component && op_level(operation) == LLAMA_RESOURCE_DETAILED)
			c.component = strstr(operation, "norm")         ? "norm"
				      : !strcmp(operation, "embedding") ? "embedding"
									: NULL;
		long long flops = 0;
		size_t mark = in->buf.len;
		rc = took(in, mark,
			  lri_event_op(&in->buf, &c, name, operation, inputs, (int)n_inputs, output, d, "perf_counter",
				       &flops));
		if (rc == STRAP_OK) {
			in->counts[C_COMPUTE]++;
			in->pass_flops += flops;
			in->total_flops += flops;
			in->stats.total_flops += flops;
			in->total_compute_us += (double)d / 1000.0;
		}
		remember_output(in, output);
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
		in->stats.filtered++;
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
		in->stats.filtered++;
		return leave(in, t0, STRAP_OK);
	}
	struct lri_ctx c = ctx_now(in, t0);
	size_t mark = in->buf.len;
	int rc = took(in, mark, lri_event_alloc(&in->buf, &c, name, kind, tensor, read_rss()));
	if (rc == STRAP_OK) {
		in->counts[C_ALLOC]++;
		if (!strcmp(kind, "parameters"))
			in->parameter_bytes += (long long)tensor->nbytes;
	}
	return leave(in, t0, rc);
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
		in->stats.filtered++;
		return leave(in, t0, STRAP_OK);
	}
	/* the gap since `from` ended (0 when it has not: a handoff logged inside it) */
	long long d = !strcmp(in->ended, from) ? t0 - in->ended_ns : 0;
	if (t0 - in->fraction_at > FRACTION_MAX_AGE_NS) {
		in->fraction = read_fraction();
		in->fraction_at = t0;
	}
	/* at the start of `to`, as the Python client's handoff (the MLP's start); its module is the
	 * receiving block's ("model.layers.N.mlp") */
	struct lri_ctx c = ctx_now(in, t0);
	c.component = to;
	char module[NAME_LEN * 2];
	if (in->layer >= 0)
		snprintf(module, sizeof module, "model.layers.%d.%s", in->layer, to);
	else
		snprintf(module, sizeof module, "%s", to);
	size_t mark = in->buf.len;
	int rc = took(in, mark,
		      lri_event_handoff(&in->buf, &c, module, from, to, tensor ? tensor : &in->last_out, d,
					"perf_counter", in->fraction, "proc_meminfo_used_over_total"));
	if (rc == STRAP_OK) {
		in->counts[C_HANDOFF]++;
		in->component_flows++;
	}
	return leave(in, t0, rc);
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
	int rc = drain(in);
	return leave(in, t0, rc ? rc : in->err.code);
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
	if (g)
		*out = g->err;
	else
		memset(out, 0, sizeof *out);
	pthread_mutex_unlock(&mu);
}

llama_resource_stats llama_resource_get_stats(void)
{
	llama_resource_stats st;
	pthread_mutex_lock(&mu);
	if (g && g->level)
		st = g->stats;
	else
		memset(&st, 0, sizeof st);
	pthread_mutex_unlock(&mu);
	return st;
}
