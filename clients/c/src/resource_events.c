/*
 * The resource instrumentation on the model's thread: seed 003's LOG_* calls become plain
 * records (copies, no formatting), handed to the writer thread in batches (resource_writer.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "resource_instr.h"

/* ----- the model's thread: records ----- */

/* A new record at the end of the queue (NULL: out of memory, reported). */
struct rec *lri_push(struct instr *in, enum rec_kind kind, long long now)
{
	if (in->q.n == in->q.cap) {
		size_t cap = in->q.cap ? in->q.cap * 2 : 256;
		struct rec *r = realloc(in->q.r, cap * sizeof *r);
		if (!r) {
			lri_fail(in, STRAP_E_NOMEM, "out of memory recording a resource event");
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

void lri_keep(struct rtensor *dst, const llama_resource_tensor *t)
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
void lri_hand_over(struct instr *in, int wait)
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
					lri_fail(in, STRAP_E_NOMEM, "out of memory handing resource events over");
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

void lri_queued(struct instr *in)
{
	if (in->q.n >= HANDOFF_RECORDS)
		lri_hand_over(in, 0);
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
		lri_keep(&in->last_out, t);
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
	struct rec *r = lri_push(in, R_MUL_MAT, t0);
	if (!r)
		return STRAP_E_NOMEM;
	COPY(r->module, name);
	COPY(r->mlp_op, mlp_op);
	COPY(r->activation, in->activation);
	r->has_weight = weight != NULL;
	r->has_input = input != NULL;
	lri_keep(&r->weight, weight);
	lri_keep(&r->input, input);
	lri_keep(&r->out, out);
	r->duration_ns = d;
	remember_output(in, out);
	lri_queued(in);
	return STRAP_OK;
}

int llama_resource_log_compute(const char *operation, const char *name, const llama_resource_tensor *inputs,
			       size_t n_inputs, const llama_resource_tensor *output, long long duration_ns)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (!operation || (n_inputs && !inputs)) {
		in->mark_ns = t0;
		return lri_leave(in, t0, lri_fail(in, STRAP_E_INVALID, "log_compute: operation or inputs NULL"));
	}
	int lv = op_level(operation);
	if (!in->enabled || lv > in->level) {
		in->filtered++;
		in->mark_ns = t0;
		remember_output(in, output);
		return lri_leave(in, t0, STRAP_OK);
	}
	int rc;
	if (!strcmp(operation, "mul_mat")) {
		const llama_resource_tensor *w = n_inputs >= 2 ? &inputs[0] : NULL;
		const llama_resource_tensor *x = n_inputs >= 2 ? &inputs[1] : n_inputs == 1 ? &inputs[0] : NULL;
		rc = log_mul_mat(in, t0, name, w, x, output, duration_ns, NULL);
	} else {
		long long d = took_ns(in, t0, duration_ns);
		struct rec *r = lri_push(in, R_OP, t0);
		if (!r)
			return lri_leave(in, t0, STRAP_E_NOMEM);
		/* outside a component a norm or an embedding is its own (sites.component_of) */
		if (!r->component[0] && lv == LLAMA_RESOURCE_DETAILED)
			COPY(r->component, strstr(operation, "norm")         ? "norm"
					   : !strcmp(operation, "embedding") ? "embedding"
									     : "");
		COPY(r->module, name);
		COPY(r->op, operation);
		r->n_in = n_inputs > MAX_INPUTS ? MAX_INPUTS : (int)n_inputs;
		for (int i = 0; i < r->n_in; i++)
			lri_keep(&r->in[i], &inputs[i]);
		lri_keep(&r->out, output);
		r->duration_ns = d;
		remember_output(in, output);
		lri_queued(in);
		rc = STRAP_OK;
	}
	return lri_leave(in, t0, rc);
}

int llama_resource_log_mlp(const char *mlp_operation, const llama_resource_tensor *weight,
			   const llama_resource_tensor *input, const llama_resource_tensor *output,
			   long long duration_ns)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	const char *op = mlp_name(mlp_operation);
	if (!op || !output) {
		in->mark_ns = t0;
		return lri_leave(in, t0,
				 lri_fail(in, STRAP_E_INVALID,
					  "log_mlp: '%s' is not gate_proj/up_proj/down_proj, or no output",
					  mlp_operation ? mlp_operation : "(null)"));
	}
	if (!in->enabled) {
		in->filtered++;
		in->mark_ns = t0;
		return lri_leave(in, t0, STRAP_OK);
	}
	/* the projection's module in the Python client's names: model.layers.N.mlp.gate_proj */
	char module[NAME_LEN];
	if (in->layer >= 0)
		snprintf(module, sizeof module, "model.layers.%d.mlp.%s", in->layer, op);
	else
		snprintf(module, sizeof module, "mlp.%s", op);
	return lri_leave(in, t0, log_mul_mat(in, t0, module, weight, input, output, duration_ns, op));
}

int llama_resource_log_allocation(const llama_resource_tensor *tensor, const char *name, const char *kind)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (!tensor || !kind) {
		in->mark_ns = t0;
		return lri_leave(in, t0, lri_fail(in, STRAP_E_INVALID, "log_allocation: tensor or kind NULL"));
	}
	if (!in->enabled ||
	    (in->level == LLAMA_RESOURCE_MINIMAL && (long long)tensor->nbytes <= MINIMAL_ALLOCATION_BYTES)) {
		in->filtered++;
		return lri_leave(in, t0, STRAP_OK);
	}
	struct rec *r = lri_push(in, R_ALLOC, t0);
	if (!r)
		return lri_leave(in, t0, STRAP_E_NOMEM);
	COPY(r->module, name);
	COPY(r->kind_word, kind);
	lri_keep(&r->out, tensor);
	lri_queued(in);
	return lri_leave(in, t0, STRAP_OK);
}

int llama_resource_log_handoff(const char *from, const char *to, const llama_resource_tensor *tensor)
{
	long long t0 = lri_mono_ns();
	struct instr *in = lri_enter();
	if (!in)
		return STRAP_OK;
	if (!from || !to) {
		in->mark_ns = t0;
		return lri_leave(in, t0, lri_fail(in, STRAP_E_INVALID, "log_handoff: from or to NULL"));
	}
	if (!in->enabled || in->level < LLAMA_RESOURCE_DETAILED) {
		in->filtered++;
		return lri_leave(in, t0, STRAP_OK);
	}
	struct rec *r = lri_push(in, R_HANDOFF, t0);
	if (!r)
		return lri_leave(in, t0, STRAP_E_NOMEM);
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
		lri_keep(&r->out, tensor);
	else
		r->out = in->last_out;
	lri_queued(in);
	return lri_leave(in, t0, STRAP_OK);
}
