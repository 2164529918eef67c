/* The C client's resource events, rendered as the Python writer renders them
 * (docs/RESOURCE_EVENTS.md): the keys and their order come from the Python builders
 * (resource_layouts.h, generated), the formatting of numbers from the Python writer's C filling
 * (_render_core.h: Python's repr of a double, µs from integer ns). Internal to libstrap. */
#ifndef STRAP_RESOURCE_RENDER_H
#define STRAP_RESOURCE_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "resource_layouts.h"

#define lri_render strap__lri_render
#define lri_put strap__lri_put
#define lri_short_dtype strap__lri_short_dtype
#define lri_event_mul_mat strap__lri_event_mul_mat
#define lri_event_op strap__lri_event_op
#define lri_event_alloc strap__lri_event_alloc
#define lri_event_handoff strap__lri_event_handoff
#define lri_event_forward strap__lri_event_forward
#define lri_event_session_start strap__lri_event_session_start
#define lri_event_session_summary strap__lri_event_session_summary

/* A tensor as an event describes it: shape in C order (ndim -1: null), dtype as the Python
 * client names it ("float32", "float16", "bfloat16", "int32", or ggml's name "q4_0"). */
struct lri_tensor {
	const char *name;
	const int64_t *shape;
	int ndim;
	const char *dtype;
};

/* The values of one event; each layout reads the fields it has. Negative rss / fraction:
 * none (the key is left out / null, as the builders do). */
struct lri_values {
	const char *device; /* "cpu" */
	const char *word;   /* resource_id's kind: compute, mlp, memory, flow */
	const char *leaf;   /* resource_id's name part */
	const char *session_id;
	long long ts, seq, step, forward;
	int layer; /* -1: null */
	const char *component, *module;
	/* compute_execution */
	const char *operation;
	const struct lri_tensor *inputs;
	int n_inputs;
	struct lri_tensor out;
	long long flops, bytes_accessed, duration_ns, flops_per_element;
	const char *duration_source, *activation;
	/* mlp_operation */
	const char *mlp_operation;
	struct lri_tensor weight;
	long long intermediate_dim, intermediate_bytes, peak_bytes, compute_seq;
	/* memory_allocation (tensor: out) */
	const char *allocation_kind, *memory_type, *precision;
	long long size_bytes, rss;
	uint64_t address;
	/* component_handoff (tensor: out) */
	const char *from, *to, *fraction_source;
	long long data_bytes;
	double fraction;
};

typedef struct lri_buf {
	char *p;
	size_t len, cap;
} lri_buf;

/* The event of `layout` with `v`, as one JSON line ending in '\n', appended to b. 0, or -1 when
 * memory ran out. */
int lri_render(lri_buf *b, enum lri_layout layout, const struct lri_values *v);

/* Where an event happens: its session, time (Unix µs), number, step, pass, layer (-1: none)
 * and component. */
struct lri_ctx {
	const char *session_id;
	long long ts, seq, step, forward;
	int layer;
	const char *component;
};

struct llama_resource_tensor;

/* The events, each figure computed here once (as events.py computes it). Each appends its
 * line(s) to b and returns the number of events (or -1: memory ran out).
 * mul_mat: compute_execution of module (FLOPs 2·K·numel(out), K = the input's innermost
 * dimension); with mlp_op also its mlp_operation (numbered ctx->seq + 1), activation its
 * activation_function. *flops gets the FLOPs. */
int lri_event_mul_mat(lri_buf *b, const struct lri_ctx *c, const char *module,
		      const struct llama_resource_tensor *weight, const struct llama_resource_tensor *input,
		      const struct llama_resource_tensor *out, long long duration_ns, const char *duration_source,
		      const char *mlp_op, const char *activation, long long *flops);
/* Any other operation: a norm ("norm", "rms_norm", "layer_norm") or an activation ("silu",
 * "gelu", "relu", "swiglu", "activation") gets FLOPs per element; others are not counted. */
int lri_event_op(lri_buf *b, const struct lri_ctx *c, const char *module, const char *operation,
		 const struct llama_resource_tensor *inputs, int n_inputs, const struct llama_resource_tensor *out,
		 long long duration_ns, const char *duration_source, long long *flops);
int lri_event_alloc(lri_buf *b, const struct lri_ctx *c, const char *module, const char *kind,
		    const struct llama_resource_tensor *t, long long rss);
int lri_event_handoff(lri_buf *b, const struct lri_ctx *c, const char *module, const char *from, const char *to,
		      const struct llama_resource_tensor *t, long long duration_ns, const char *duration_source,
		      double fraction, const char *fraction_source);
int lri_event_forward(lri_buf *b, const struct lri_ctx *c, long long flops, long long duration_ns,
		      const char *duration_source, long long rss);

/* resource_session_start and resource_session_summary: monitor.py builds them as dicts, not
 * through a builder; their keys follow its order without the torch-only ones (torch_version,
 * monitor_writer_cpu_us). counts: the events per type, names[i] with counts[i] > 0. */
int lri_event_session_start(lri_buf *b, const char *session_id, long long ts, const char *iso, const char *level,
			    int enabled, const char *model_class, long long pid);
struct lri_summary {
	const char *session_id, *iso, *level;
	long long ts, forwards, parameter_bytes, total_flops, component_flows, hook_ns, peak_rss;
	long long total_compute_ns;
	const char *const *count_names;
	const long long *counts;
	int n_counts;
};
int lri_event_session_summary(lri_buf *b, const struct lri_summary *s);

/* n bytes appended to b: 0, or -1 when memory ran out. */
int lri_put(lri_buf *b, const char *s, size_t n);

/* events.short_dtype: "float32" -> "f32", ...; other names as they are. */
const char *lri_short_dtype(const char *dtype);

#endif
