/*
 * llama-resource-instrumentation.h — seed 003's resource instrumentation API on libstrap, from C
 * and C++ (docs/C_CLIENT.md "Resource events (seed 003's API)").
 *
 * The events are docs/RESOURCE_EVENTS.md's, with the fields and order the Python client writes:
 * their layouts are generated from the Python builders (clients/c/src/resource_layouts.h) and
 * their numbers formatted as the Python writer formats them. Durations are measured (monotonic
 * clock): an operation's is the time since the previous instrumentation call (a call marks the
 * clock: see "Durations" in docs/C_CLIENT.md), FLOPs are computed from shapes
 * ("flops_source": "computed_from_shapes"). Events go to strapd when a session is given
 * (llama_resource_instrumentation_init_session: RESOURCES messages, strapd writes
 * CAPTURE.resources.jsonl), else they are appended to the JSONL file given to init.
 *
 *   llama_resource_instrumentation_init(LLAMA_RESOURCE_DETAILED, "logs/resources.jsonl");
 *   LLAMA_RESOURCE_BEGIN_SESSION("inference_sess_1");
 *   LLAMA_RESOURCE_BEGIN_LAYER(il);
 *   LLAMA_RESOURCE_BEGIN_COMPONENT("attention");
 *   LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("mul_mat", "q_proj", inputs, 2, q);   // C: pointer + count
 *   LLAMA_RESOURCE_LOG_COMPUTE_OPERATION("mul_mat", "q_proj", {wq, cur}, q);    // C++: a braced list
 *   LLAMA_RESOURCE_END_COMPONENT("attention");
 *   LLAMA_RESOURCE_LOG_COMPONENT_HANDOFF("attention", "mlp");
 *   LLAMA_RESOURCE_END_LAYER(il);
 *   LLAMA_RESOURCE_END_SESSION();
 *
 * Environment (read by init, as the Python client reads it): STRAP_RESOURCE_LOG_LEVEL /
 * LLAMA_RESOURCE_LOG_LEVEL (the level when init is given 0), STRAP_RESOURCE_LOG_PATH /
 * LLAMA_RESOURCE_LOG_PATH (the file when init is given NULL), STRAP_RESOURCE_LOG_DISABLED /
 * LLAMA_RESOURCE_DISABLED (1/true/yes/on: nothing but the session start and summary). The
 * STRAP_ name wins when both are set; a bad value fails init naming the variable.
 *
 * The functions return STRAP_OK or a libstrap error code (llama_resource_last_error says why);
 * called before init (or after free) they do nothing and return STRAP_OK. They share one global
 * instrumentation (seed 003's g_resource_instr) and are thread-safe (one mutex).
 *
 * The ggml part (the LLAMA_RESOURCE_* macros and the llama_resource_*_ggml functions, which read
 * ggml_tensor fields) is inline here and needs <ggml.h>: define LLAMA_RESOURCE_NO_GGML before
 * including this header to use only the descriptor functions (libstrap itself has no ggml
 * dependency).
 */
#ifndef LLAMA_RESOURCE_INSTRUMENTATION_H
#define LLAMA_RESOURCE_INSTRUMENTATION_H

#include <stddef.h>
#include <stdint.h>

#include "strap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seed 003's levels (C names; C++ has llama_resource_level::MINIMAL ... below). 0: the
 * environment's level, else MINIMAL. */
enum {
	LLAMA_RESOURCE_MINIMAL = 1,  /* mul_mat / attention, MLP projections, passes, allocations > 1 MiB */
	LLAMA_RESOURCE_DETAILED = 2, /* + norms, activations, embeddings, handoffs, every allocation */
	LLAMA_RESOURCE_VERBOSE = 3,  /* + every other operation */
};

/* A tensor as the events describe it. */
typedef struct llama_resource_tensor {
	const char *name;     /* the graph name (NULL: "input" / "weight" where the event names them) */
	const int64_t *shape; /* outermost first (ggml's ne reversed); NULL with ndim -1: unknown */
	int ndim;
	const char *dtype; /* "float32", "float16", "bfloat16", "int32", or ggml's name ("q4_0") */
	uint64_t nbytes;   /* bytes of its data (ggml_nbytes: quantised blocks included) */
	uint64_t address;  /* its data pointer (memory_allocation) */
} llama_resource_tensor;

/* Start the instrumentation, writing to the JSONL file `path` (appended; NULL: the
 * environment's path). Replaces an instrumentation already running (which is freed first). */
STRAP_API int llama_resource_instrumentation_init(int level, const char *path);
/* The same, sending to strapd through `s` (opened with params.resources = 1; not owned: free the
 * instrumentation before closing it). */
STRAP_API int llama_resource_instrumentation_init_session(int level, strap_session *s);
/* Ends a session still open (its summary written), flushes and frees. */
STRAP_API int llama_resource_instrumentation_free(void);

/* resource_session_start; NULL: "resource_sess_<UTC time>_<pid>". model_class: what ran
 * ("llama.cpp" when NULL). */
STRAP_API int llama_resource_begin_session(const char *session_id);
STRAP_API int llama_resource_set_model_class(const char *model_class);
/* resource_session_summary, then everything is written (flush). */
STRAP_API int llama_resource_end_session(void);

/* The layer (layer_id) and component (component_type) of the events that follow. */
STRAP_API int llama_resource_begin_layer(int layer_id);
STRAP_API int llama_resource_end_layer(int layer_id);
STRAP_API int llama_resource_begin_component(const char *component);
STRAP_API int llama_resource_end_component(const char *component);

/* A forward pass (not in the seed; the Python client's model_forward): step and pass numbers of
 * the events that follow; end writes model_forward with the sum of the pass's FLOPs. */
STRAP_API int llama_resource_begin_forward(long long step);
STRAP_API int llama_resource_end_forward(void);

/* compute_execution of `operation` (ggml's op name: "mul_mat", "rms_norm", "silu", ...; "embedding"
 * for a token embedding lookup) named `name`. For mul_mat the inputs are ggml's order, {weight, input} (src[0],
 * src[1]); one input is taken as the input. duration_ns < 0: measured (time since the previous call). */
STRAP_API int llama_resource_log_compute(const char *operation, const char *name, const llama_resource_tensor *inputs,
					 size_t n_inputs, const llama_resource_tensor *output, long long duration_ns);
/* An MLP projection ("gate_proj", "up_proj", "down_proj"; ggml's "ffn_gate", "ffn_up",
 * "ffn_down" are mapped): its compute_execution (mul_mat) and mlp_operation events. */
STRAP_API int llama_resource_log_mlp(const char *mlp_operation, const llama_resource_tensor *weight,
				     const llama_resource_tensor *input, const llama_resource_tensor *output,
				     long long duration_ns);
/* memory_allocation of `tensor` named `name`; kind "parameters" or "module_output". At MINIMAL
 * only sizes > 1 MiB. */
STRAP_API int llama_resource_log_allocation(const llama_resource_tensor *tensor, const char *name, const char *kind);
/* component_handoff from `from` to `to` (DETAILED): duration = the gap since `from` ended, data =
 * the last output logged inside `from` (or `tensor` when not NULL). */
STRAP_API int llama_resource_log_handoff(const char *from, const char *to, const llama_resource_tensor *tensor);
/* activation_function of the MLP events (e.g. "silu"; NULL: null). */
STRAP_API int llama_resource_set_activation_function(const char *name);

/* Run-time control (seed 003's set_level / disable / flush, and enable). */
STRAP_API int llama_resource_set_level(int level);
STRAP_API int llama_resource_disable(void);
STRAP_API int llama_resource_enable(void);
STRAP_API int llama_resource_flush(void);
/* The level running (0: not initialised) and whether events are recorded. */
STRAP_API int llama_resource_get_level(void);
STRAP_API int llama_resource_enabled(void);
/* The first error since init. */
STRAP_API void llama_resource_last_error(strap_error *out);

typedef struct llama_resource_stats {
	uint64_t events;       /* events written or sent */
	uint64_t bytes;        /* their bytes */
	uint64_t filtered;     /* calls below the level (no event) */
	uint64_t self_ns;      /* time spent inside the instrumentation's calls */
	long long total_flops; /* FLOPs of the recorded operations */
} llama_resource_stats;
STRAP_API llama_resource_stats llama_resource_get_stats(void);

#ifdef __cplusplus
}
#endif

/* ----- ggml tensors (inline: the user's build has ggml.h) ----------------------------------- */
#ifndef LLAMA_RESOURCE_NO_GGML
#include <ggml.h>
#include <string.h>

/* The descriptor of a ggml tensor; shape must have room for GGML_MAX_DIMS values. Trailing
 * size-1 dimensions of ne are dropped (ggml's ne is always 4 long). */
static inline llama_resource_tensor llama_resource_describe(const struct ggml_tensor *t, int64_t *shape)
{
	llama_resource_tensor d;
	memset(&d, 0, sizeof d);
	if (!t) {
		d.ndim = -1;
		return d;
	}
	int n = ggml_n_dims(t);
	for (int i = 0; i < n; i++)
		shape[i] = t->ne[n - 1 - i];
	d.name = t->name[0] ? t->name : NULL;
	d.shape = shape;
	d.ndim = n;
	switch (t->type) {
	case GGML_TYPE_F32: d.dtype = "float32"; break;
	case GGML_TYPE_F16: d.dtype = "float16"; break;
	case GGML_TYPE_BF16: d.dtype = "bfloat16"; break;
	case GGML_TYPE_I32: d.dtype = "int32"; break;
	default: d.dtype = ggml_type_name(t->type);
	}
	d.nbytes = (uint64_t)ggml_nbytes(t);
	d.address = (uint64_t)(uintptr_t)t->data;
	return d;
}

static inline int llama_resource_log_compute_ggml(const char *operation, const char *name,
						  const struct ggml_tensor *const *inputs, size_t n_inputs,
						  const struct ggml_tensor *output)
{
	int64_t shapes[8][GGML_MAX_DIMS], oshape[GGML_MAX_DIMS];
	llama_resource_tensor in[8];
	if (n_inputs > 8)
		n_inputs = 8; /* the events list at most 8 inputs */
	for (size_t i = 0; i < n_inputs; i++)
		in[i] = llama_resource_describe(inputs[i], shapes[i]);
	llama_resource_tensor out = llama_resource_describe(output, oshape);
	return llama_resource_log_compute(operation, name, in, n_inputs, &out, -1);
}

static inline int llama_resource_log_mlp_ggml(const char *op, const struct ggml_tensor *weights,
					      const struct ggml_tensor *activations)
{
	int64_t ws[GGML_MAX_DIMS], as[GGML_MAX_DIMS];
	llama_resource_tensor w = llama_resource_describe(weights, ws), a = llama_resource_describe(activations, as);
	return llama_resource_log_mlp(op, &w, NULL, &a, -1);
}

static inline int llama_resource_log_allocation_ggml(const struct ggml_tensor *t, const char *name)
{
	int64_t s[GGML_MAX_DIMS];
	llama_resource_tensor d = llama_resource_describe(t, s);
	/* a tensor no op computes (a leaf: weights) is a parameter */
	return llama_resource_log_allocation(&d, name, t && t->op == GGML_OP_NONE ? "parameters" : "module_output");
}

#ifdef __cplusplus
#include <initializer_list>
#include <vector>

/* Seed 003's C++ spelling: llama_resource_level::DETAILED. */
enum class llama_resource_level : int { MINIMAL = 1, DETAILED = 2, VERBOSE = 3 };
static inline int llama_resource_instrumentation_init(llama_resource_level level, const char *path)
{
	return llama_resource_instrumentation_init(static_cast<int>(level), path);
}
static inline int llama_resource_set_level(llama_resource_level level)
{
	return llama_resource_set_level(static_cast<int>(level));
}
static inline int llama_resource_log_compute_cpp(const char *op, const char *name,
						 std::initializer_list<const ggml_tensor *> inputs,
						 const ggml_tensor *output)
{
	return llama_resource_log_compute_ggml(op, name, inputs.begin(), inputs.size(), output);
}
static inline int llama_resource_log_compute_cpp(const char *op, const char *name,
						 const std::vector<const ggml_tensor *> &inputs,
						 const ggml_tensor *output)
{
	return llama_resource_log_compute_ggml(op, name, inputs.data(), inputs.size(), output);
}
#if __cplusplus >= 201703L
/* Seed 003's run-time control object: g_resource_instr->set_level(llama_resource_level::VERBOSE),
 * ->disable(), ->enable(), ->flush() (the functions above; the instrumentation itself is global). */
struct llama_resource_instrumentation_control {
	int set_level(llama_resource_level level) const { return llama_resource_set_level(static_cast<int>(level)); }
	int disable() const { return llama_resource_disable(); }
	int enable() const { return llama_resource_enable(); }
	int flush() const { return llama_resource_flush(); }
};
inline const llama_resource_instrumentation_control g_resource_instr_control{};
inline const llama_resource_instrumentation_control *const g_resource_instr = &g_resource_instr_control;
#endif
#define LLAMA_RESOURCE_LOG_COMPUTE_OPERATION(op, name, ...) llama_resource_log_compute_cpp((op), (name), __VA_ARGS__)
#else
/* C: (op, name, inputs, n_inputs, output), inputs a `const struct ggml_tensor *const *`. */
#define LLAMA_RESOURCE_LOG_COMPUTE_OPERATION(op, name, ...) llama_resource_log_compute_ggml((op), (name), __VA_ARGS__)
#endif

#define LLAMA_RESOURCE_LOG_MLP_OPERATION(op, weights, activations)                                                     \
	llama_resource_log_mlp_ggml((op), (weights), (activations))
#define LLAMA_RESOURCE_LOG_MEMORY_ALLOCATION(tensor, name) llama_resource_log_allocation_ggml((tensor), (name))
#endif /* LLAMA_RESOURCE_NO_GGML */

#define LLAMA_RESOURCE_BEGIN_SESSION(id) llama_resource_begin_session(id)
#define LLAMA_RESOURCE_END_SESSION() llama_resource_end_session()
#define LLAMA_RESOURCE_BEGIN_LAYER(il) llama_resource_begin_layer(il)
#define LLAMA_RESOURCE_END_LAYER(il) llama_resource_end_layer(il)
#define LLAMA_RESOURCE_BEGIN_COMPONENT(name) llama_resource_begin_component(name)
#define LLAMA_RESOURCE_END_COMPONENT(name) llama_resource_end_component(name)
#define LLAMA_RESOURCE_LOG_COMPONENT_HANDOFF(from, to) llama_resource_log_handoff((from), (to), NULL)

#endif /* LLAMA_RESOURCE_INSTRUMENTATION_H */
