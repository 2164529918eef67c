/*
 * strap_llama_resources.c — seed 003's resource events from llama.cpp's eval callback
 * (strap_llama.h, docs/LLAMA_CPP.md "Resource events"). The callback asks for the nodes the level
 * records (MINIMAL: every mul_mat and flash attention; DETAILED: + norms, activations, the token
 * embedding lookup and the attention→MLP handoff at ffn_norm-N; VERBOSE: every node), so ggml's
 * scheduler computes the graph up to each of them and calls back: an event's duration is the time
 * that piece of the graph took (the node and the unobserved nodes before it), measured on the
 * monotonic clock from the end of the previous piece. FLOPs come from the nodes' shapes
 * (mul_mat: 2·K·numel(out)). Names map to the Python client's module names (q_proj, ...).
 */
#define _POSIX_C_SOURCE 200809L
#include "strap_llama.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama-resource-instrumentation.h"

/* What module_of found for a weight, kept by the weight's address (weights live as long as the
 * model): sscanf and snprintf per node on the model's thread cost more than the record. */
#define WEIGHT_CACHE 1024
struct weight_entry {
	const struct ggml_tensor *w;
	char module[120];
	int layer, component;
	const char *mlp_op;
};

struct strap_llama_resources {
	struct weight_entry weights[WEIGHT_CACHE];
	int level;
	long long seg_start; /* the end of the last piece of graph computed (ns) */
	int layer;           /* the layer of the events going out (-1: none) */
	int component;       /* 0 none, 1 attention, 2 mlp, 3 lm_head */
	ggml_backend_sched_eval_callback prev;
	void *prev_data;
	int prev_wants;
	struct ggml_tensor *mine;
	strap_llama_resource_stats stats;
};

static long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int strap_llama_resources_new(const struct llama_model *model, strap_llama_resources **out, strap_error *err)
{
	(void)model;
	strap_llama_resources *r = calloc(1, sizeof *r);
	if (!r) {
		if (err) {
			err->code = STRAP_E_NOMEM;
			snprintf(err->message, sizeof err->message, "out of memory");
		}
		return STRAP_E_NOMEM;
	}
	r->layer = -1;
	*out = r;
	return STRAP_OK;
}

void strap_llama_resources_free(strap_llama_resources *r)
{
	free(r);
}

int strap_llama_resources_attach(strap_llama_resources *r, struct llama_context_params *cparams)
{
	r->prev = cparams->cb_eval;
	r->prev_data = cparams->cb_eval_user_data;
	cparams->cb_eval = strap_llama_resource_eval_callback;
	cparams->cb_eval_user_data = r;
	return STRAP_OK;
}

static void set_component(strap_llama_resources *r, int c)
{
	static const char *const names[] = {NULL, "attention", "mlp", "lm_head"};
	if (r->component == c)
		return;
	if (r->component)
		llama_resource_end_component(names[r->component]);
	if (c)
		llama_resource_begin_component(names[c]);
	r->component = c;
}

static void set_layer(strap_llama_resources *r, int layer)
{
	if (r->layer == layer)
		return;
	set_component(r, 0);
	if (r->layer >= 0)
		llama_resource_end_layer(r->layer);
	if (layer >= 0)
		llama_resource_begin_layer(layer);
	r->layer = layer;
}

int strap_llama_resources_begin_decode(strap_llama_resources *r, long long step)
{
	r->level = llama_resource_enabled() ? llama_resource_get_level() : 0;
	r->layer = -1;
	r->component = 0;
	int rc = llama_resource_begin_forward(step);
	r->seg_start = mono_ns();
	return rc;
}

int strap_llama_resources_end_decode(strap_llama_resources *r)
{
	set_layer(r, -1);
	return llama_resource_end_forward();
}

/* "name-N": N, else -1 */
static int layer_of_name(const char *name)
{
	const char *dash = strrchr(name, '-');
	if (!dash || !dash[1])
		return -1;
	for (const char *p = dash + 1; *p; p++)
		if (!isdigit((unsigned char)*p))
			return -1;
	return atoi(dash + 1);
}

static int starts(const char *s, const char *prefix)
{
	return !strncmp(s, prefix, strlen(prefix));
}

/* A weight "blk.N.attn_q.weight": N and its module name in the Python client's vocabulary
 * (docs/LLAMA_CPP.md); the component (1 attention, 2 mlp, 0 other) and the MLP operation. */
static void module_of(const struct ggml_tensor *t, char *module, size_t cap, int *layer, int *component,
		      const char **mlp_op)
{
	static const struct {
		const char *gguf, *hf;
		int component;
		const char *mlp;
	} map[] = {
		{"attn_q", "self_attn.q_proj", 1, NULL},     {"attn_k", "self_attn.k_proj", 1, NULL},
		{"attn_v", "self_attn.v_proj", 1, NULL},     {"attn_output", "self_attn.o_proj", 1, NULL},
		{"attn_qkv", "self_attn.qkv_proj", 1, NULL}, {"ffn_gate", "mlp.gate_proj", 2, "gate_proj"},
		{"ffn_up", "mlp.up_proj", 2, "up_proj"},     {"ffn_down", "mlp.down_proj", 2, "down_proj"},
	};
	const char *w = t->src[0] ? t->src[0]->name : "";
	*mlp_op = NULL;
	*component = 0;
	*layer = layer_of_name(t->name);
	int n = -1, off = 0;
	if (sscanf(w, "blk.%d.%n", &n, &off) == 1 && off > 0) {
		const char *rest = w + off;
		for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
			size_t l = strlen(map[i].gguf);
			if (!strncmp(rest, map[i].gguf, l) && !strcmp(rest + l, ".weight")) {
				snprintf(module, cap, "model.layers.%d.%s", n, map[i].hf);
				*layer = n;
				*component = map[i].component;
				*mlp_op = map[i].mlp;
				return;
			}
		}
	}
	/* the vocabulary projection: output.weight, or the token embeddings when they are tied */
	if (!strcmp(w, "output.weight") || !strcmp(t->name, "result_output")) {
		snprintf(module, cap, "lm_head");
		*layer = -1;
		*component = 3;
		return;
	}
	/* the attention's own products (kq-N, kqv-N) and anything else: under the node's name */
	char base[GGML_MAX_NAME];
	snprintf(base, sizeof base, "%s", t->name);
	char *dash = strrchr(base, '-');
	if (dash && *layer >= 0)
		*dash = 0;
	if (*layer >= 0 && (starts(base, "kq") || starts(base, "fattn"))) {
		snprintf(module, cap, "model.layers.%d.self_attn.%s", *layer, base);
		*component = 1;
	} else if (*layer >= 0) {
		snprintf(module, cap, "model.layers.%d.%s", *layer, base);
	} else {
		snprintf(module, cap, "%s", base);
	}
}

/* The level a node is recorded from, and its operation's name (0: never). */
static int wanted(const struct ggml_tensor *t, const char **op)
{
	switch (t->op) {
	case GGML_OP_MUL_MAT: *op = "mul_mat"; return LLAMA_RESOURCE_MINIMAL;
	case GGML_OP_FLASH_ATTN_EXT: *op = "flash_attn_ext"; return LLAMA_RESOURCE_MINIMAL;
	case GGML_OP_RMS_NORM: *op = "rms_norm"; return LLAMA_RESOURCE_DETAILED;
	case GGML_OP_NORM: *op = "norm"; return LLAMA_RESOURCE_DETAILED;
	case GGML_OP_GET_ROWS: /* the token embedding lookup; other row gathers (the output rows) are VERBOSE's */
		if (t->src[0] && !strcmp(t->src[0]->name, "token_embd.weight")) {
			*op = "embedding";
			return LLAMA_RESOURCE_DETAILED;
		}
		*op = "get_rows";
		return LLAMA_RESOURCE_VERBOSE;
	case GGML_OP_UNARY:
		switch (ggml_get_unary_op(t)) {
		case GGML_UNARY_OP_SILU: *op = "silu"; return LLAMA_RESOURCE_DETAILED;
		case GGML_UNARY_OP_GELU: *op = "gelu"; return LLAMA_RESOURCE_DETAILED;
		case GGML_UNARY_OP_RELU: *op = "relu"; return LLAMA_RESOURCE_DETAILED;
		default: *op = ggml_unary_op_name(ggml_get_unary_op(t)); return LLAMA_RESOURCE_VERBOSE;
		}
	case GGML_OP_GLU:
		switch (ggml_get_glu_op(t)) {
		case GGML_GLU_OP_SWIGLU: *op = "swiglu"; return LLAMA_RESOURCE_DETAILED;
		case GGML_GLU_OP_GEGLU: *op = "geglu"; return LLAMA_RESOURCE_DETAILED;
		case GGML_GLU_OP_REGLU: *op = "reglu"; return LLAMA_RESOURCE_DETAILED;
		default: *op = ggml_glu_op_name(ggml_get_glu_op(t)); return LLAMA_RESOURCE_VERBOSE;
		}
	case GGML_OP_NONE:
	case GGML_OP_VIEW:
	case GGML_OP_RESHAPE:
	case GGML_OP_PERMUTE:
	case GGML_OP_TRANSPOSE: return 0; /* no computation */
	default: *op = ggml_op_desc(t); return LLAMA_RESOURCE_VERBOSE;
	}
}

static int is_handoff(const struct ggml_tensor *t)
{
	return starts(t->name, "ffn_norm-");
}

static void lowercase(char *s)
{
	for (; *s; s++)
		*s = (char)tolower((unsigned char)*s);
}

static void record(strap_llama_resources *r, struct ggml_tensor *t, long long dur)
{
	const char *op = NULL;
	int lv = wanted(t, &op);
	int64_t shapes[3][GGML_MAX_DIMS];
	if (is_handoff(t) && r->level >= LLAMA_RESOURCE_DETAILED) {
		int layer = layer_of_name(t->name);
		set_layer(r, layer);
		if (r->component == 1)
			set_component(r, 0); /* the attention ended with its last event */
		llama_resource_tensor d = llama_resource_describe(t, shapes[0]);
		llama_resource_log_handoff("attention", "mlp", &d);
		set_component(r, 2);
		r->stats.handoffs++;
		if (!lv || lv > r->level)
			return;
	}
	if (t->op == GGML_OP_MUL_MAT) {
		/* a GGUF weight's names are the same every pass: found once (kq/kqv: src[0] is a view of
		 * the cache, looked up each time) */
		const struct ggml_tensor *w0 = t->src[0];
		int cacheable = w0 && w0->op == GGML_OP_NONE;
		size_t h = ((uintptr_t)w0 >> 4) * 0x9E3779B97F4A7C15ULL >> 54;
		struct weight_entry *e = &r->weights[h & (WEIGHT_CACHE - 1)];
		if (!cacheable || e->w != w0) {
			struct weight_entry fresh;
			module_of(t, fresh.module, sizeof fresh.module, &fresh.layer, &fresh.component, &fresh.mlp_op);
			fresh.w = cacheable ? w0 : NULL;
			*e = fresh;
		}
		const char *module = e->module;
		int layer = e->layer, component = e->component;
		const char *mlp_op = e->mlp_op;
		set_layer(r, layer);
		set_component(r, component);
		llama_resource_tensor w = llama_resource_describe(t->src[0], shapes[0]);
		llama_resource_tensor x = llama_resource_describe(t->src[1], shapes[1]);
		llama_resource_tensor o = llama_resource_describe(t, shapes[2]);
		if (mlp_op)
			llama_resource_log_mlp(mlp_op, &w, &x, &o, dur);
		else {
			llama_resource_tensor in[2] = {w, x};
			llama_resource_log_compute("mul_mat", module, in, 2, &o, dur);
		}
		/* o_proj ends the attention: the handoff's gap starts here */
		if (component == 1 && strstr(module, "o_proj"))
			set_component(r, 0);
		r->stats.mul_mats++;
		return;
	}
	char name[64];
	snprintf(name, sizeof name, "%s", op);
	lowercase(name);
	int layer = layer_of_name(t->name);
	char module[160];
	if (t->op == GGML_OP_FLASH_ATTN_EXT) {
		/* llama.cpp leaves it unnamed ("node_21"): the attention of the layer running */
		set_component(r, 1);
		layer = r->layer;
		snprintf(module, sizeof module, "model.layers.%d.self_attn", layer);
		if (layer < 0)
			snprintf(module, sizeof module, "self_attn");
	} else if (layer < 0 && starts(t->name, "node_")) {
		layer = r->layer; /* unnamed: stays in the layer running */
		snprintf(module, sizeof module, "%s", t->name);
	} else if (layer >= 0)
		snprintf(module, sizeof module, "model.layers.%d.%.*s", layer, (int)(strrchr(t->name, '-') - t->name),
			 t->name);
	else
		snprintf(module, sizeof module, "%s", t->name);
	set_layer(r, layer); /* a node without a layer (the final norm) is outside the blocks */
	llama_resource_tensor in[GGML_MAX_SRC];
	int64_t ishape[GGML_MAX_SRC][GGML_MAX_DIMS];
	int n = 0;
	for (int i = 0; i < GGML_MAX_SRC && t->src[i]; i++)
		in[n] = llama_resource_describe(t->src[i], ishape[n]), n++;
	llama_resource_tensor o = llama_resource_describe(t, shapes[2]);
	llama_resource_log_compute(name, module, in, (size_t)(n > 1 && t->op != GGML_OP_GET_ROWS ? n : 1), &o, dur);
	r->stats.others++;
}

bool strap_llama_resource_eval_callback(struct ggml_tensor *t, bool ask, void *user_data)
{
	strap_llama_resources *r = user_data;
	if (ask) {
		int prev = r->prev ? r->prev(t, true, r->prev_data) : 0;
		r->prev_wants = prev;
		r->mine = NULL;
		if (!r->level)
			return prev;
		const char *op = NULL;
		int lv = wanted(t, &op);
		if ((lv && lv <= r->level) || (r->level >= LLAMA_RESOURCE_DETAILED && is_handoff(t))) {
			r->mine = t;
			return true;
		}
		return prev;
	}
	long long end = mono_ns();
	int ok = 1;
	if (t == r->mine) {
		r->mine = NULL;
		record(r, t, end - r->seg_start);
	}
	if (r->prev && r->prev_wants && !r->prev(t, false, r->prev_data))
		ok = 0;
	/* the next piece of graph starts now: this callback's and the capture's work are not in it */
	r->seg_start = mono_ns();
	return ok;
}

strap_llama_resource_stats strap_llama_resources_get_stats(const strap_llama_resources *r)
{
	return r->stats;
}
