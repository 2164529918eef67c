/*
 * Seed 003's resource instrumentation (llama-resource-instrumentation.h) on libstrap: one global
 * instrumentation, its life cycle, its context (session, step, pass, layer, component), the
 * environment and the monotonic clock the durations are measured on. The model's thread's
 * records are in resource_events.c, the writer thread in resource_writer.c
 * (resource_instr.h says how they fit together).
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

#include "resource_instr.h"

const char *const lri_level_names[4] = {"", "MINIMAL", "DETAILED", "VERBOSE"};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct instr *g; /* seed 003's g_resource_instr */

long long lri_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

long long lri_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The first error is kept (the model's thread and the writer both report: under wmu). */
int lri_fail(struct instr *in, int code, const char *fmt, ...)
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
		in->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
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
	if (pthread_create(&in->thread, NULL, lri_writer_main, in) != 0) {
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
	in->clock_offset_ns = lri_wall_ns() - lri_mono_ns();
	in->mark_ns = lri_mono_ns();
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
struct instr *lri_enter(void)
{
	pthread_mutex_lock(&mu);
	if (!g || g->level == 0) {
		pthread_mutex_unlock(&mu);
		return NULL;
	}
	return g;
}

int lri_leave(struct instr *in, long long t0, int rc)
{
	in->self_ns += lri_mono_ns() - t0;
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
	lri_hand_over(in, 1);
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
		lri_hand_over(in, 1);
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
	lri_hand_over(in, 1); /* the writer renders with the session's id: none of the old one waits */
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
	lri_iso_now(iso, sizeof iso);
	lri_buf b = {0};
	if (lri_event_session_start(&b, in->session_id, lri_wall_ns() / 1000, iso, lri_level_names[in->level],
				    in->enabled, in->model_class, (long long)getpid()) < 0 ||
	    lri_put(&b, "", 1) < 0) { /* its NUL */
		free(b.p);
		return lri_fail(in, STRAP_E_NOMEM, "out of memory rendering the session start");
	}
	struct rec *r = lri_push(in, R_LINE, t0);
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
	struct rec *r = lri_push(in, R_SUMMARY, lri_mono_ns());
	if (r) {
		r->forward = in->forwards;
		r->duration_ns = in->self_ns;
	}
	lri_hand_over(in, 1);
	return err_code(in);
}

int llama_resource_begin_session(const char *session_id)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	return in ? lri_leave(in, t0, begin_session_locked(in, session_id, t0)) : STRAP_OK;
}

int llama_resource_end_session(void)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	return in ? lri_leave(in, t0, end_session_locked(in)) : STRAP_OK;
}

int llama_resource_set_model_class(const char *model_class)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	COPY(in->model_class, model_class ? model_class : "llama.cpp");
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_set_activation_function(const char *name)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	COPY(in->activation, name);
	return lri_leave(in, t0, STRAP_OK);
}
/* ----- context ----- */

int llama_resource_begin_layer(int layer_id)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	in->layer = layer_id < 0 ? -1 : layer_id;
	in->mark_ns = t0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_end_layer(int layer_id)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (in->layer == layer_id)
		in->layer = -1;
	in->component[0] = 0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_begin_component(const char *component)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	COPY(in->component, component);
	in->mark_ns = t0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_end_component(const char *component)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	COPY(in->ended, component);
	in->ended_ns = t0;
	in->component[0] = 0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_begin_forward(long long step)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	in->step = step;
	in->forward++;
	in->forwards++;
	in->forward_start_ns = t0;
	in->mark_ns = t0;
	in->layer = -1;
	in->component[0] = 0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_end_forward(void)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (in->enabled) {
		struct rec *r = lri_push(in, R_FORWARD, t0);
		if (r) {
			r->layer = -1;
			COPY(r->component, "model");
			r->duration_ns = t0 - in->forward_start_ns;
		}
	}
	/* the pass's records go to the writer, which makes and writes them while the next pass runs */
	lri_hand_over(in, 0);
	return lri_leave(in, t0, err_code(in));
}

/* ----- control ----- */

int llama_resource_set_level(int level)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (level < 1 || level > 3)
		return lri_leave(
			in, t0,
			lri_fail(in, STRAP_E_INVALID, "resource level must be 1-3 (MINIMAL, DETAILED, VERBOSE)"));
	in->level = level;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_disable(void)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	in->enabled = 0;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_enable(void)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	in->enabled = 1;
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_flush(void)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	lri_hand_over(in, 1);
	return lri_leave(in, t0, err_code(in));
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
