/*
 * strap_llama.h — llama.cpp capture through its public eval callback (docs/LLAMA_CPP.md).
 *
 * libstrap_llama observes the nodes of llama.cpp's compute graph through
 * llama_context_params.cb_eval (no patch to llama.cpp) and writes the ones asked for into a
 * libstrap session (strap.h), labelled with their rows' sequence and position. It is compiled
 * against llama.h and ggml's headers; libstrap itself knows nothing of llama.cpp.
 *
 * Use (one context, one thread calling llama_decode):
 *   strap_llama_params lp = strap_llama_default_params();
 *   lp.tensors = (const char *[]){"l_out", "attn_out"}; lp.n_tensors = 2;
 *   strap_llama_new(session, model, &lp, &h, &err);
 *   llama_context_params cp = llama_context_default_params();
 *   strap_llama_attach(h, &cp, &err);             // sets cb_eval, chaining one already there
 *   ctx = llama_init_from_model(model, cp);
 *   for each batch:
 *     strap_llama_begin_decode(h, &batch, pos0);  // rows → (seq, pos); starts a forward pass
 *     llama_decode(ctx, batch);
 *     strap_llama_end_decode(h);                  // publishes; the pass's first capture error
 *     ... sample, strap_session_token(session, ...)
 *
 * Thread-safety: a strap_llama belongs to one context; begin/end_decode and the callback run in
 * the thread that calls llama_decode (ggml's scheduler calls the callback there). Different
 * handles are independent. The session may be shared with other writers (libstrap serializes).
 */
#ifndef STRAP_LLAMA_H
#define STRAP_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include <strap.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;
struct llama_model;
struct llama_context;
struct llama_context_params;
struct llama_batch;

typedef struct strap_llama strap_llama;

/* Called after each tensor is written (for logging and tests): the node as ggml has it, the
 * record's name, shape (C order) and meta (JSON) and the session's return code for the write. Runs in the
 * callback: it may read the tensor (ggml_backend_tensor_get) but must not call llama_decode. */
typedef void (*strap_llama_record_fn)(void *user_data, struct ggml_tensor *t, const char *record_name,
				      const int64_t *shape, int ndim, const char *meta_json, int rc);

typedef struct strap_llama_params {
	/* Node names to capture: a graph name without its layer ("l_out": every layer) or with it
	 * ("l_out-3": that layer only), or a name without a layer ("result_norm"). NULL / 0:
	 * "l_out" (every layer's output, the residual stream). At most 64 entries. In GGUF
	 * architectures qwen2 and qwen3, whose graphs name no attn_out node, "attn_out" ("attn_out-N")
	 * takes the MUL_MAT by the weight blk.N.attn_output.weight (docs/LLAMA_CPP.md, "Name table"). */
	const char *const *tensors;
	int n_tensors;
	/* 1: record under the graph name ("l_out-3"); 0 (default): under the module name of the
	 * Python client where the architecture has a table (docs/LLAMA_CPP.md), else the graph
	 * name. */
	int raw_names;
	/* The most rows a batch given to strap_llama_begin_decode may have (its (seq, pos)
	 * arrays are allocated once, here). Default 4096. */
	int n_batch_max;
	/* Optional observer of every written record (see strap_llama_record_fn). */
	strap_llama_record_fn on_record;
	void *on_record_data;
} strap_llama_params;

/* The defaults above. Thread-safe. */
strap_llama_params strap_llama_default_params(void);

/* A capture of `model`'s graph into `s` (not owned: the caller closes and frees it after
 * strap_llama_free). Fails (STRAP_E_INVALID, err says why) for a bad name or parameter. */
int strap_llama_new(strap_session *s, const struct llama_model *model, const strap_llama_params *p, strap_llama **out,
		    strap_error *err);
void strap_llama_free(strap_llama *h);

/* One call: points cparams->cb_eval / cb_eval_user_data at h, keeping a callback that was
 * already there: it is still asked about every node and called for those it wants. Refuses
 * (STRAP_E_INVALID, nothing changed) parameters under which llama.cpp does not keep a batch's
 * row order in its ubatches: n_seq_max > 1 without kv_unified (it then splits batches per
 * sequence). Call it on the parameters given to llama_init_from_model. */
int strap_llama_attach(strap_llama *h, struct llama_context_params *cparams, strap_error *err);

/* The eval callback itself, for callers that install it themselves (user_data = the handle). */
bool strap_llama_eval_callback(struct ggml_tensor *t, bool ask, void *user_data);

/* Before each llama_decode: copies the batch's rows' (seq_id[0], pos, logits) and starts a
 * forward pass (strap_session_begin_forward). A batch with pos == NULL is numbered from
 * `next_pos`, as llama.cpp does for llama_batch_get_one; a batch without logits flags asks
 * for the last row only, as llama.cpp does. */
int strap_llama_begin_decode(strap_llama *h, const struct llama_batch *batch, int32_t next_pos);

/* After llama_decode: publishes the pass (strap_session_flush) and returns the first capture
 * error of the pass (the session's code, or STRAP_E_INVALID for rows that could not be
 * labelled), STRAP_OK otherwise. After an error the callback stopped observing: the pass's
 * later nodes were computed but not captured, and llama_decode may have returned 0 regardless
 * (ggml's scheduler does not report a callback's refusal). */
int strap_llama_end_decode(strap_llama *h);

/* The first error (code STRAP_OK when none) with its message. */
void strap_llama_last_error(const strap_llama *h, strap_error *out);

typedef struct strap_llama_stats {
	uint64_t records;     /* tensors written */
	uint64_t bytes;       /* their payload bytes */
	uint64_t duplicates;  /* nodes skipped because a node of the same name was taken in the same ubatch */
	uint64_t ubatches;    /* ubatches seen */
	uint64_t nodes_asked; /* ask calls */
} strap_llama_stats;
strap_llama_stats strap_llama_get_stats(const strap_llama *h);

/* ----- resource events (seed 003's API, llama-resource-instrumentation.h) ---------------------
 * A second eval callback that writes the resource events of docs/RESOURCE_EVENTS.md through the
 * running instrumentation (llama_resource_instrumentation_init or _init_session first): per node
 * the level records, compute_execution (mul_mat: FLOPs from the shapes, the projection's module
 * name), mlp_operation, the attention→MLP component_handoff (DETAILED), per layer the layer and
 * component context, and one model_forward per llama_decode. Durations: the time ggml took for
 * the piece of graph ending at the node (docs/LLAMA_CPP.md "Resource events"). Same threading as
 * strap_llama: one context, the thread that calls llama_decode. */
typedef struct strap_llama_resources strap_llama_resources;
typedef struct strap_llama_resource_stats {
	uint64_t mul_mats, others, handoffs; /* nodes recorded */
} strap_llama_resource_stats;

int strap_llama_resources_new(const struct llama_model *model, strap_llama_resources **out, strap_error *err);
void strap_llama_resources_free(strap_llama_resources *r);
/* Points cparams->cb_eval at the resource callback, chaining the one already there (the
 * capture's, when strap_llama_attach ran first: attach the capture first, so that the resource
 * callback sees the end of every piece of graph and leaves the capture's writes out of the
 * durations). */
int strap_llama_resources_attach(strap_llama_resources *r, struct llama_context_params *cparams);
bool strap_llama_resource_eval_callback(struct ggml_tensor *t, bool ask, void *user_data);
/* Around each llama_decode (after strap_llama_begin_decode, before strap_llama_end_decode):
 * begin reads the level and starts a forward pass (step = the token index); end closes the last
 * layer and writes model_forward. */
int strap_llama_resources_begin_decode(strap_llama_resources *r, long long step);
int strap_llama_resources_end_decode(strap_llama_resources *r);
strap_llama_resource_stats strap_llama_resources_get_stats(const strap_llama_resources *r);

#ifdef __cplusplus
}
#endif

#endif /* STRAP_LLAMA_H */
