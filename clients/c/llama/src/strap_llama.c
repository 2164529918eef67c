/*
 * strap_llama.c — llama.cpp's eval callback writing graph nodes into a libstrap session
 * (strap_llama.h, docs/LLAMA_CPP.md). The scheduler asks about every node (ask = true), then
 * calls back (ask = false) for each node someone said yes to, once its data is final; this file
 * decides per node, labels each tensor's rows with the batch's (seq, pos) and copies it straight
 * from its backend buffer into the ring.
 */
#include "strap_llama.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQ 64
#define BASE_MAX 64
#define META_MAX 65536
#define NAME_MAX_LEN 256

/* Which record names a graph name gets (docs/LLAMA_CPP.md, "Name table"): Hugging Face module
 * names for the decoders built like LlamaForCausalLM (GGUF architectures llama, qwen2, qwen3),
 * graph names for the others. */
enum name_table { TABLE_NONE, TABLE_DECODER };

struct request {
	char base[BASE_MAX]; /* graph name without "-N" */
	int layer;           /* the layer asked for; -1: every layer (or a name without one) */
};

struct strap_llama {
	strap_session *s;
	int n_layer;
	enum name_table table;
	/* qwen2, qwen3: no node is named attn_out-N; the attention output is the MUL_MAT by the
	 * weight blk.N.attn_output.weight, found by that weight (attn_output_layer) */
	int attn_out_by_weight;
	int raw_names;
	struct request req[MAX_REQ];
	int n_req;
	/* taken[r * (n_layer + 1) + layer + 1]: a node of request r's name was written in this
	 * ubatch (trap 1: names repeat; the first node in graph order is the one taken) */
	unsigned char *taken;

	/* the batch of the current llama_decode (strap_llama_begin_decode) */
	int n_batch_max;
	int32_t *seq, *pos;
	unsigned char *logits;
	int n_rows, rows_done, in_decode;
	/* the current ubatch: rows [ub_start, ub_start + ub_rows) of the batch; its output rows
	 * (those asking for logits, in order) are out_rows[0..ub_outputs) */
	int ub_start, ub_rows, ub_outputs, have_ubatch;
	int32_t *out_rows, *row_tmp;

	ggml_backend_sched_eval_callback prev;
	void *prev_data;
	struct ggml_tensor *pending; /* the node we said yes to, until its ask = false */
	int pending_by_weight;       /* it is an attention output found by its weight ... */
	int pending_layer;           /* ... of this layer */
	int prev_wants;

	strap_llama_record_fn on_record;
	void *on_record_data;
	char *meta; /* META_MAX bytes, for each record's meta */
	strap_error err;
	strap_llama_stats stats;
};

static int fail(strap_llama *h, int code, const char *fmt, ...)
{
	if (h->err.code != STRAP_OK)
		return h->err.code; /* the first error is the one reported */
	h->err.code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(h->err.message, sizeof h->err.message, fmt, ap);
	va_end(ap);
	return code;
}

static int fail_to(strap_error *err, int code, const char *fmt, ...)
{
	if (err) {
		memset(err, 0, sizeof *err);
		err->code = code;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof err->message, fmt, ap);
		va_end(ap);
	}
	return code;
}

strap_llama_params strap_llama_default_params(void)
{
	strap_llama_params p;
	memset(&p, 0, sizeof p);
	p.n_batch_max = 4096;
	return p;
}

/* "l_out-12" → base "l_out", layer 12; "result_norm" → layer -1. 0 when the base is too long. */
static int split_name(const char *name, char *base, int *layer)
{
	size_t n = strlen(name);
	size_t i = n;
	while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
		i--;
	*layer = -1;
	if (i > 1 && i < n && name[i - 1] == '-' && n - i <= 6) {
		*layer = atoi(name + i);
		n = i - 1;
	}
	if (n == 0 || n >= BASE_MAX)
		return 0;
	memcpy(base, name, n);
	base[n] = 0;
	return 1;
}

int strap_llama_new(strap_session *s, const struct llama_model *model, const strap_llama_params *p, strap_llama **out,
		    strap_error *err)
{
	*out = NULL;
	if (!s || !model)
		return fail_to(err, STRAP_E_INVALID, "strap_llama_new: session and model are required");
	strap_llama_params d = strap_llama_default_params();
	if (!p)
		p = &d;
	static const char *const default_tensors[] = {"l_out"};
	const char *const *names = p->tensors ? p->tensors : default_tensors;
	int n_names = p->tensors ? p->n_tensors : 1;
	if (n_names < 1 || n_names > MAX_REQ)
		return fail_to(err, STRAP_E_INVALID, "strap_llama_new: %d tensor names (1..%d)", n_names, MAX_REQ);
	if (p->n_batch_max < 1)
		return fail_to(err, STRAP_E_INVALID, "strap_llama_new: n_batch_max %d", p->n_batch_max);
	int n_layer = llama_model_n_layer(model);

	strap_llama *h = calloc(1, sizeof *h);
	if (!h)
		return fail_to(err, STRAP_E_NOMEM, "strap_llama_new: out of memory");
	h->s = s;
	h->n_layer = n_layer;
	h->raw_names = p->raw_names;
	h->on_record = p->on_record;
	h->on_record_data = p->on_record_data;
	for (int i = 0; i < n_names; i++) {
		struct request *r = &h->req[i];
		if (!names[i] || !split_name(names[i], r->base, &r->layer) || r->layer >= n_layer) {
			free(h);
			return fail_to(err, STRAP_E_INVALID,
				       "strap_llama_new: tensor name %d (\"%s\") is not a graph name or names a layer "
				       "past the model's %d",
				       i, names[i] ? names[i] : "(null)", n_layer);
		}
		for (int j = 0; j < i; j++)
			if (!strcmp(h->req[j].base, r->base) && (h->req[j].layer == r->layer || h->req[j].layer < 0)) {
				free(h);
				return fail_to(err, STRAP_E_INVALID, "strap_llama_new: tensor name \"%s\" given twice",
					       names[i]);
			}
	}
	h->n_req = n_names;
	char arch[64] = "";
	llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
	int qwen = !strcmp(arch, "qwen2") || !strcmp(arch, "qwen3");
	h->table = !strcmp(arch, "llama") || qwen ? TABLE_DECODER : TABLE_NONE;
	for (int i = 0; i < n_names; i++)
		if (qwen && !strcmp(h->req[i].base, "attn_out"))
			h->attn_out_by_weight = 1;

	h->n_batch_max = p->n_batch_max;
	size_t nb = (size_t)p->n_batch_max;
	h->taken = calloc((size_t)n_names * (size_t)(n_layer + 1), 1);
	h->seq = malloc(nb * sizeof *h->seq);
	h->pos = malloc(nb * sizeof *h->pos);
	h->logits = malloc(nb);
	h->out_rows = malloc(nb * sizeof *h->out_rows);
	h->row_tmp = malloc(nb * sizeof *h->row_tmp);
	h->meta = malloc(META_MAX);
	if (!h->taken || !h->seq || !h->pos || !h->logits || !h->out_rows || !h->row_tmp || !h->meta) {
		strap_llama_free(h);
		return fail_to(err, STRAP_E_NOMEM, "strap_llama_new: out of memory");
	}
	*out = h;
	return STRAP_OK;
}

void strap_llama_free(strap_llama *h)
{
	if (!h)
		return;
	free(h->taken);
	free(h->seq);
	free(h->pos);
	free(h->logits);
	free(h->out_rows);
	free(h->row_tmp);
	free(h->meta);
	free(h);
}

int strap_llama_attach(strap_llama *h, struct llama_context_params *cparams, strap_error *err)
{
	if (!h || !cparams)
		return fail_to(err, STRAP_E_INVALID, "strap_llama_attach: handle and parameters are required");
	if (cparams->n_seq_max > 1 && !cparams->kv_unified)
		return fail_to(err, STRAP_E_INVALID,
			       "strap_llama_attach: n_seq_max %u without kv_unified: llama.cpp would split each batch "
			       "per sequence (split_equal), so ubatch rows would not follow the batch; set kv_unified",
			       cparams->n_seq_max);
	if (cparams->cb_eval != strap_llama_eval_callback) {
		h->prev = cparams->cb_eval;
		h->prev_data = cparams->cb_eval_user_data;
	}
	cparams->cb_eval = strap_llama_eval_callback;
	cparams->cb_eval_user_data = h;
	return STRAP_OK;
}

int strap_llama_begin_decode(strap_llama *h, const struct llama_batch *batch, int32_t next_pos)
{
	if (h->err.code != STRAP_OK)
		return h->err.code;
	if (!batch || batch->n_tokens < 1 || batch->n_tokens > h->n_batch_max)
		return fail(h, STRAP_E_INVALID, "strap_llama_begin_decode: a batch of %d rows (1..%d, n_batch_max)",
			    batch ? batch->n_tokens : 0, h->n_batch_max);
	int n = batch->n_tokens;
	for (int i = 0; i < n; i++) {
		h->seq[i] = batch->seq_id && batch->n_seq_id && batch->n_seq_id[i] > 0 ? batch->seq_id[i][0] : 0;
		h->pos[i] = batch->pos ? batch->pos[i] : next_pos + i;
		/* llama.cpp: no logits array means the last row only */
		h->logits[i] = batch->logits ? batch->logits[i] != 0 : i == n - 1;
	}
	h->n_rows = n;
	h->rows_done = 0;
	h->have_ubatch = 0;
	h->in_decode = 1;
	h->pending = NULL;
	int e = strap_session_begin_forward(h->s);
	if (e < 0) {
		strap_error se;
		strap_session_last_error(h->s, &se);
		return fail(h, e, "strap_session_begin_forward: %s", se.message);
	}
	return STRAP_OK;
}

int strap_llama_end_decode(strap_llama *h)
{
	h->in_decode = 0;
	if (h->err.code != STRAP_OK)
		return h->err.code;
	if (h->rows_done != h->n_rows)
		return fail(h, STRAP_E_INVALID,
			    "strap_llama_end_decode: the graph covered %d of the batch's %d rows (no token-embedding "
			    "lookup seen per ubatch: an embeddings batch, or llama_decode failed)",
			    h->rows_done, h->n_rows);
	int e = strap_session_flush(h->s);
	if (e < 0) {
		strap_error se;
		strap_session_last_error(h->s, &se);
		return fail(h, e, "strap_session_flush: %s", se.message);
	}
	return STRAP_OK;
}

/* A new ubatch starts at its token-embedding lookup, the first node of the graph: a GET_ROWS
 * of the token-embedding matrix ("token_embd.weight") at the input "inp_tokens", whose length
 * is the ubatch's row count. (The graph's "inp_embd" is the input of the other path, embeddings
 * given by the caller, not a node.) Its rows are the next ones of the batch: split_simple keeps
 * the batch's order, and strap_llama_attach refuses the configurations where it is not used. */
static int is_token_lookup(const struct ggml_tensor *t)
{
	return t->op == GGML_OP_GET_ROWS && t->src[0] && t->src[1] && !strcmp(t->src[1]->name, "inp_tokens") &&
	       !strcmp(t->src[0]->name, "token_embd.weight");
}

static void start_ubatch(strap_llama *h, const struct ggml_tensor *t)
{
	int rows = (int)t->src[1]->ne[0];
	if (rows < 1 || h->rows_done + rows > h->n_rows) {
		fail(h, STRAP_E_INVALID, "a ubatch of %d rows after %d of the batch's %d", rows, h->rows_done,
		     h->n_rows);
		h->have_ubatch = 0;
		return;
	}
	h->ub_start = h->rows_done;
	h->rows_done += rows;
	h->ub_rows = rows;
	h->ub_outputs = 0;
	for (int i = 0; i < rows; i++)
		if (h->logits[h->ub_start + i])
			h->out_rows[h->ub_outputs++] = h->ub_start + i;
	h->have_ubatch = 1;
	memset(h->taken, 0, (size_t)h->n_req * (size_t)(h->n_layer + 1));
	h->stats.ubatches++;
}

/* The layer N of an attention output found by its weight: a MUL_MAT whose first operand is the
 * model's weight "blk.N.attn_output.weight" (o_proj), or -1. In qwen2 and qwen3 (src/models/
 * qwen2.cpp, qwen3.cpp) it is build_attn's product by wo, unnamed (ggml names it "node_K", its
 * index in the graph), before the last layer's rows are pruned; without a bias (these models have
 * none on o_proj) or LoRA adapter on wo it is the attention's output, HF's o_proj output. */
static int attn_output_layer(const struct ggml_tensor *t)
{
	if (t->op != GGML_OP_MUL_MAT || !t->src[0])
		return -1;
	const char *w = t->src[0]->name;
	if (strncmp(w, "blk.", 4) != 0)
		return -1;
	const char *p = w + 4;
	int layer = 0, digits = 0;
	for (; *p >= '0' && *p <= '9' && digits < 6; p++, digits++)
		layer = layer * 10 + (*p - '0');
	if (digits == 0 || strcmp(p, ".attn_output.weight") != 0)
		return -1;
	return layer;
}

/* The request a node answers, or -1. */
static int match(const strap_llama *h, const char *base, int layer)
{
	for (int i = 0; i < h->n_req; i++)
		if (!strcmp(h->req[i].base, base) && (h->req[i].layer < 0 || h->req[i].layer == layer))
			return i;
	return -1;
}

static void record_name(const strap_llama *h, const char *graph_name, const char *base, int layer, char *out,
			size_t len)
{
	const char *m = NULL;
	if (!h->raw_names && h->table == TABLE_DECODER) {
		if (layer >= 0) {
			if (!strcmp(base, "l_out"))
				m = "";
			else if (!strcmp(base, "attn_out"))
				m = ".self_attn";
			else if (!strcmp(base, "ffn_out"))
				m = ".mlp";
			else if (!strcmp(base, "attn_norm"))
				m = ".input_layernorm";
			else if (!strcmp(base, "ffn_norm"))
				m = ".post_attention_layernorm";
			if (m) {
				snprintf(out, len, "model.layers.%d%s", layer, m);
				return;
			}
		} else {
			m = !strcmp(base, "embd")            ? "model.embed_tokens"
			    : !strcmp(base, "result_norm")   ? "model.norm"
			    : !strcmp(base, "result_output") ? "lm_head"
							     : NULL;
			if (m) {
				snprintf(out, len, "%s", m);
				return;
			}
		}
	}
	snprintf(out, len, "%s", graph_name);
}

static int dtype_of(enum ggml_type t)
{
	switch (t) {
	case GGML_TYPE_F32: return STRAP_DTYPE_F32;
	case GGML_TYPE_F16: return STRAP_DTYPE_F16;
	case GGML_TYPE_BF16: return STRAP_DTYPE_BF16;
	case GGML_TYPE_F64: return STRAP_DTYPE_F64;
	case GGML_TYPE_I8: return STRAP_DTYPE_I8;
	case GGML_TYPE_I16: return STRAP_DTYPE_I16;
	case GGML_TYPE_I32: return STRAP_DTYPE_I32;
	case GGML_TYPE_I64: return STRAP_DTYPE_I64;
	default: return 0; /* quantized: raw blocks */
	}
}

/* Copies bytes [off, off + len) of t's C-order payload from its backend buffer (host or device)
 * into the ring: one ggml_backend_tensor_get for a contiguous tensor, one per row span for a
 * strided view with contiguous rows, one per element otherwise. */
static int copy_tensor(void *ctx, void *dst, size_t off, size_t len)
{
	struct ggml_tensor *t = ctx;
	if (len == 0)
		return 0;
	if (ggml_is_contiguous(t)) {
		ggml_backend_tensor_get(t, dst, off, len);
		return 0;
	}
	size_t es = ggml_type_size(t->type);
	if (ggml_blck_size(t->type) != 1)
		return -1; /* a strided quantized view has no element to gather */
	size_t row = (size_t)t->ne[0] * es;
	char *d = dst;
	while (len > 0) {
		size_t r = off / row, in = off % row;
		size_t i1 = r % (size_t)t->ne[1], i2 = r / (size_t)t->ne[1] % (size_t)t->ne[2],
		       i3 = r / (size_t)t->ne[1] / (size_t)t->ne[2];
		size_t base = i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
		size_t n = row - in < len ? row - in : len;
		if (t->nb[0] == es) {
			ggml_backend_tensor_get(t, d, base + in, n);
		} else {
			if (in % es || n % es)
				return -1;
			for (size_t k = 0; k < n / es; k++)
				ggml_backend_tensor_get(t, d + k * es, base + (in / es + k) * t->nb[0], es);
		}
		d += n;
		off += n;
		len -= n;
	}
	return 0;
}

/* Appends to the meta buffer; 0 when it does not fit. */
static int put(char *buf, size_t *n, const char *fmt, ...)
{
	if (*n >= META_MAX)
		return 0;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(buf + *n, META_MAX - *n, fmt, ap);
	va_end(ap);
	if (k < 0 || (size_t)k >= META_MAX - *n) {
		*n = META_MAX;
		return 0;
	}
	*n += (size_t)k;
	return 1;
}

/* "seq": a number when every row shares it, else a list; "pos": {"from","n"} when consecutive. */
static int put_rows(strap_llama *h, size_t *n, const int32_t *rows, int count)
{
	if (count == 0) /* a ubatch none of whose rows asks for logits: the pruned layer is empty */
		return put(h->meta, n, ",\"seq\":[],\"pos\":[]}");
	int same = 1, consecutive = 1;
	for (int i = 1; i < count; i++) {
		same &= h->seq[rows[i]] == h->seq[rows[0]];
		consecutive &= h->pos[rows[i]] == h->pos[rows[i - 1]] + 1;
	}
	if (same) {
		put(h->meta, n, ",\"seq\":%d", h->seq[rows[0]]);
	} else {
		put(h->meta, n, ",\"seq\":[");
		for (int i = 0; i < count; i++)
			put(h->meta, n, i ? ",%d" : "%d", h->seq[rows[i]]);
		put(h->meta, n, "]");
	}
	if (consecutive)
		return put(h->meta, n, ",\"pos\":{\"from\":%d,\"n\":%d}}", h->pos[rows[0]], count);
	put(h->meta, n, ",\"pos\":[");
	for (int i = 0; i < count; i++)
		put(h->meta, n, i ? ",%d" : "%d", h->pos[rows[i]]);
	return put(h->meta, n, "]}");
}

static int write_node(strap_llama *h, struct ggml_tensor *t, int by_weight, int weight_layer)
{
	const char *gname = ggml_get_name(t);
	char base[BASE_MAX];
	int layer;
	split_name(gname, base, &layer);
	/* an attention output found by its weight is recorded as the attn_out-N it stands for
	 * (model.layers.N.self_attn; "attn_out-N" with raw names: its own name, "node_K", is only
	 * its index in this graph) */
	char alias[BASE_MAX + 16];
	if (by_weight) {
		snprintf(base, sizeof base, "attn_out");
		layer = weight_layer;
		snprintf(alias, sizeof alias, "attn_out-%d", layer);
	}

	/* rows: the outermost dimension whose extent is the ubatch's row count, else its output
	 * row count (the last layer pruned to the rows asking for logits, trap 2) */
	const int32_t *rows = NULL;
	int count = 0, row_dim = 0;
	for (int d = 3; d >= 1 && !rows; d--)
		if (t->ne[d] == h->ub_rows) {
			for (int i = 0; i < h->ub_rows; i++)
				h->row_tmp[i] = h->ub_start + i;
			rows = h->row_tmp;
			count = h->ub_rows;
			row_dim = d;
		}
	for (int d = 3; d >= 1 && !rows; d--)
		if (t->ne[d] == h->ub_outputs) {
			rows = h->out_rows;
			count = h->ub_outputs;
			row_dim = d;
		}
	if (!rows)
		return fail(h, STRAP_E_INVALID,
			    "%s: shape [%lld,%lld,%lld,%lld] has no dimension of the ubatch's %d rows or its %d "
			    "output rows; not written",
			    gname, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
			    h->ub_rows, h->ub_outputs);
	/* One row: every dimension of extent 1 could be the rows'; take the innermost one above
	 * ne[0] ([n_embd, 1] → 1, RoPE'd Q [head_dim, n_head, 1] → 2, its permuted view
	 * [head_dim, 1, n_head] → 1), so a token's tensor keeps the rank it has in a many-row pass
	 * (ggml_n_dims drops trailing 1s). */
	if (count == 1) {
		row_dim = 1;
		while (row_dim < 3 && t->ne[row_dim] != 1)
			row_dim++;
	}
	int n_dims = ggml_n_dims(t);
	if (n_dims < row_dim + 1)
		n_dims = row_dim + 1;
	int dtype = dtype_of(t->type);
	int64_t shape[4];
	int ndim;
	size_t nbytes;
	size_t n = 0;
	put(h->meta, &n, "{\"ggml_name\":\"%s\",\"ggml_op\":\"%s\"", gname, ggml_op_name(t->op));
	if (by_weight)
		put(h->meta, &n, ",\"ggml_weight\":\"%s\"", t->src[0]->name);
	if (dtype) {
		ndim = n_dims;
		for (int i = 0; i < n_dims; i++)
			shape[i] = t->ne[n_dims - 1 - i];
		nbytes = (size_t)ggml_nelements(t) * ggml_type_size(t->type);
	} else {
		/* raw quantized blocks, STREAM_FORMAT.md 4.1: u8 [ne[n-1], ..., ne[1], row bytes] */
		size_t row = strap_ggml_row_size(t->type, t->ne[0]);
		const char *tn = strap_ggml_type_name(t->type);
		if (!row || !tn)
			return fail(h, STRAP_E_INVALID, "%s: ggml type %d cannot be written", gname, (int)t->type);
		dtype = STRAP_DTYPE_U8;
		ndim = n_dims < 2 ? 2 : n_dims;
		for (int i = 0; i < ndim - 1; i++)
			shape[i] = t->ne[ndim - 1 - i];
		shape[ndim - 1] = (int64_t)row;
		nbytes = row * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
		put(h->meta, &n, ",\"ggml_type\":\"%s\",\"ggml_ne\":[%lld", tn, (long long)t->ne[0]);
		for (int i = 1; i < n_dims; i++)
			put(h->meta, &n, ",%lld", (long long)t->ne[i]);
		put(h->meta, &n, "]");
	}
	if (!put_rows(h, &n, rows, count))
		return fail(h, STRAP_E_TOO_LARGE, "%s: the meta of %d rows exceeds %d bytes", gname, count, META_MAX);

	char name[NAME_MAX_LEN];
	record_name(h, by_weight ? alias : gname, base, layer, name, sizeof name);
	int e = strap_session_write_with(h->s, name, dtype, shape, ndim, nbytes, h->meta, copy_tensor, t);
	if (h->on_record)
		h->on_record(h->on_record_data, t, name, shape, ndim, h->meta, e);
	if (e < 0) {
		strap_error se;
		strap_session_last_error(h->s, &se);
		return fail(h, e, "%s (%s): %s", name, gname, se.message);
	}
	h->stats.records++;
	h->stats.bytes += nbytes;
	return STRAP_OK;
}

bool strap_llama_eval_callback(struct ggml_tensor *t, bool ask, void *user_data)
{
	strap_llama *h = user_data;
	if (ask) {
		h->stats.nodes_asked++;
		int prev = h->prev ? h->prev(t, true, h->prev_data) : 0;
		h->prev_wants = prev;
		h->pending = NULL;
		if (h->err.code != STRAP_OK)
			return prev;
		const char *gname = ggml_get_name(t);
		if (h->in_decode && is_token_lookup(t))
			start_ubatch(h, t);
		char base[BASE_MAX];
		int layer;
		int r = split_name(gname, base, &layer) ? match(h, base, layer) : -1;
		int by_weight = 0;
		if (r < 0 && h->attn_out_by_weight && (layer = attn_output_layer(t)) >= 0) {
			r = match(h, "attn_out", layer);
			by_weight = 1;
		}
		if (r < 0)
			return prev;
		if (!h->in_decode) {
			fail(h, STRAP_E_INVALID, "%s: llama_decode without strap_llama_begin_decode: not captured",
			     gname);
			return prev;
		}
		if (!h->have_ubatch) {
			fail(h, STRAP_E_INVALID, "%s: a node before any token-embedding lookup (an embeddings batch?)",
			     gname);
			return prev;
		}
		if (layer >= h->n_layer)
			return prev; /* a layer the model does not have (the nextn/MTP layers) */
		unsigned char *taken = &h->taken[(size_t)r * (size_t)(h->n_layer + 1) + (size_t)(layer + 1)];
		if (*taken) {
			h->stats.duplicates++;
			return prev;
		}
		*taken = 1;
		h->pending = t;
		h->pending_by_weight = by_weight;
		h->pending_layer = layer;
		return true;
	}
	int ok = 1;
	if (t == h->pending) {
		h->pending = NULL;
		/* A failed write stops this split's remaining nodes (the scheduler breaks out of its
		 * loop); end_decode reports the error. */
		if (write_node(h, t, h->pending_by_weight, h->pending_layer) != STRAP_OK)
			ok = 0;
	}
	if (h->prev && h->prev_wants && !h->prev(t, false, h->prev_data))
		ok = 0;
	return ok;
}

void strap_llama_last_error(const strap_llama *h, strap_error *out)
{
	*out = h->err;
}

strap_llama_stats strap_llama_get_stats(const strap_llama *h)
{
	return h->stats;
}
