/*
 * The resource instrumentation's writer thread: takes the model's thread's records in batches,
 * renders them into docs/RESOURCE_EVENTS.md events (resource_render.c) and sends them to strapd
 * as RESOURCES messages or appends them to the JSONL file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "resource_instr.h"

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
				lri_fail(in, rc, "sending resource events to strapd: %s", e.message);
			}
		}
	} else if (write_all(in->fd, in->buf.p, in->buf.len) < 0) {
		rc = lri_fail(in, STRAP_E_SYSTEM, "writing the resource log: %s", strerror(errno));
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
		return lri_fail(in, STRAP_E_NOMEM, "out of memory rendering a resource event");
	}
	size_t pos = mark;
	for (int i = 0; i < n_events; i++) {
		char *nl = memchr(in->buf.p + pos, '\n', in->buf.len - pos);
		if (!nl)
			return lri_fail(in, STRAP_E_SYSTEM, "a rendered resource event has no end");
		if (in->n_ends == in->cap_ends) {
			size_t cap = in->cap_ends ? in->cap_ends * 2 : 256;
			size_t *e = realloc(in->ends, cap * sizeof *e);
			if (!e)
				return lri_fail(in, STRAP_E_NOMEM, "out of memory queueing resource events");
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

void lri_iso_now(char *out, size_t cap)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char s[32];
	strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, cap, "%.20s.%06d+00:00", s, (int)(ts.tv_nsec / 1000));
}

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
		long long now = lri_mono_ns();
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
		lri_iso_now(iso, sizeof iso);
		struct lri_summary sm = {in->session_id,
					 iso,
					 lri_level_names[in->level],
					 lri_wall_ns() / 1000,
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

void *lri_writer_main(void *arg)
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
