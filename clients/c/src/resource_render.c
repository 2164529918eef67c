/* Rendering of the C client's resource events (resource_render.h). The layouts are generated
 * from the Python builders; which optional key a builder leaves out is mirrored here, next to
 * the rule's Python source (events.derive, EventBuilder.module, MemoryReader.read). */
#include "resource_render.h"

#define LLAMA_RESOURCE_NO_GGML
#include "llama-resource-instrumentation.h"

#include <math.h>
#include <string.h>

/* _render_core.h is the Python writer's plain-C filling, shared as it is (no Python API). */
#include "_render_core.h"

static int put(lri_buf *b, const char *s, size_t n)
{
	return buf_put((Buf *)(void *)b, s, n);
}

int lri_put(lri_buf *b, const char *s, size_t n)
{
	return put(b, s, n);
}

static int put_s(lri_buf *b, const char *s)
{
	return put(b, s, strlen(s));
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii): \uXXXX beyond ASCII, UTF-16
 * surrogate pairs above U+FFFF; a byte that is not UTF-8 becomes U+FFFD. */
static int put_str(lri_buf *b, const char *s)
{
	if (!s)
		return put(b, "null", 4);
	const unsigned char *p = (const unsigned char *)s;
	if (put(b, "\"", 1) < 0)
		return -1;
	while (*p) {
		/* a run of characters written as they are, in one piece */
		const unsigned char *q = p;
		while (*q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\')
			q++;
		if (q > p) {
			if (put(b, (const char *)p, (size_t)(q - p)) < 0)
				return -1;
			p = q;
			continue;
		}
		unsigned c = *p;
		char esc[16];
		int n = 0;
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			n = 2;
		} else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
			esc[0] = '\\';
			esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : 'f';
			n = 2;
		} else if (c < 0x20 || c == 0x7f) {
			n = snprintf(esc, sizeof esc, c == 0x7f ? "%c" : "\\u%04x", c);
		} else if (c < 0x80) {
			esc[0] = (char)c;
			n = 1;
		}
		if (n) {
			if (put(b, esc, (size_t)n) < 0)
				return -1;
			p++;
			continue;
		}
		/* UTF-8 */
		unsigned cp = 0xFFFD;
		int len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
		int ok = len > 0;
		for (int i = 1; ok && i < len; i++)
			ok = (p[i] & 0xC0) == 0x80;
		if (ok) {
			cp = len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
			for (int i = 1; i < len; i++)
				cp = (cp << 6) | (p[i] & 0x3Fu);
			if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) ||
			    (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
				ok = 0;
		}
		if (!ok) {
			cp = 0xFFFD;
			len = 1;
		}
		if (cp >= 0x10000) {
			unsigned v = cp - 0x10000;
			n = snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
		} else {
			n = snprintf(esc, sizeof esc, "\\u%04x", cp);
		}
		if (put(b, esc, (size_t)n) < 0)
			return -1;
		p += len;
	}
	return put(b, "\"", 1);
}

static int put_ll(lri_buf *b, long long v)
{
	return buf_ll((Buf *)(void *)b, v);
}

/* Doubles already written, by their bits: most of an event's doubles are the same every pass
 * (a module's GFLOPs, an MLP's sizes in MiB), and the shortest repr costs a snprintf and a few
 * strtod. Direct-mapped, per thread (the writer thread renders; tests render on theirs). */
#define DBL_CACHE 1024
static _Thread_local struct {
	uint64_t bits;
	unsigned char len; /* 0: empty */
	char s[31];
} dbl_cache[DBL_CACHE];

static int put_dbl(lri_buf *b, double v)
{
	uint64_t bits;
	memcpy(&bits, &v, sizeof bits);
	uint64_t h = bits * 0x9E3779B97F4A7C15ULL;
	unsigned i = (unsigned)(h >> 54) & (DBL_CACHE - 1);
	if (dbl_cache[i].len && dbl_cache[i].bits == bits)
		return put(b, dbl_cache[i].s, dbl_cache[i].len);
	char s[64];
	int n = RENDER_DOUBLE(s, sizeof s, v);
	if (n < 0)
		return -1;
	if ((size_t)n < sizeof dbl_cache[i].s) {
		dbl_cache[i].bits = bits;
		dbl_cache[i].len = (unsigned char)n;
		memcpy(dbl_cache[i].s, s, (size_t)n);
	}
	return put(b, s, (size_t)n);
}

static int put_shape(lri_buf *b, const struct lri_tensor *t)
{
	if (t->ndim < 0)
		return put(b, "null", 4);
	if (put(b, "[", 1) < 0)
		return -1;
	for (int i = 0; i < t->ndim; i++)
		if ((i && put(b, ",", 1) < 0) || put_ll(b, (long long)t->shape[i]) < 0)
			return -1;
	return put(b, "]", 1);
}

/* "{device}_{word}_layer_{n|none}_{leaf}_{ts}_{seq}" (EventBuilder.base), as one JSON string
 * (the leaf escaped as Python escapes the f-string; the rest is ASCII) */
static int put_id(lri_buf *b, const struct lri_values *v, const char *word, long long seq)
{
	if (put(b, "\"", 1) < 0 || put_s(b, v->device) < 0 || put(b, "_", 1) < 0 || put_s(b, word) < 0 ||
	    put(b, "_layer_", 7) < 0)
		return -1;
	if ((v->layer < 0 ? put(b, "none", 4) : put_ll(b, v->layer)) < 0 || put(b, "_", 1) < 0)
		return -1;
	size_t mark = b->len;
	if (put_str(b, v->leaf) < 0)
		return -1;
	/* put_str wrote the leaf between quotes: drop them */
	memmove(b->p + mark, b->p + mark + 1, b->len - mark - 2);
	b->len -= 2;
	if (put(b, "_", 1) < 0 || put_ll(b, v->ts) < 0 || put(b, "_", 1) < 0 || put_ll(b, seq) < 0)
		return -1;
	return put(b, "\"", 1);
}

static int put_tensor(lri_buf *b, const struct lri_tensor *t)
{
	const struct lri_slot *sl = lri_layouts[LRI_L_TENSOR].slots;
	if (put(b, "{", 1) < 0)
		return -1;
	for (int i = 0; i < lri_layouts[LRI_L_TENSOR].n; i++) {
		int rc = (i && put(b, ",", 1) < 0) || put_s(b, lri_field_key[sl[i].field]) < 0 ? -1 : 0;
		if (rc)
			return -1;
		switch ((int)sl[i].field) {
		case LRI_F_NAME: rc = put_str(b, t->name); break;
		case LRI_F_SHAPE: rc = put_shape(b, t); break;
		case LRI_F_DTYPE: rc = put_str(b, t->ndim < 0 ? NULL : t->dtype); break;
		default: return -1;
		}
		if (rc < 0)
			return -1;
	}
	return put(b, "}", 1);
}

static double per_ns_of(long long amount, long long ns)
{
	return per_ns((double)amount, ns);
}

/* Whether the builders write this key for these values (the ones they may leave out). */
static int present(enum lri_layout lay, enum lri_field f, const struct lri_values *v)
{
	switch (f) {
	case LRI_F_THROUGHPUT_GFLOPS_PER_S: /* events.derive: a duration and FLOPs */
		return v->duration_ns > 0 && v->flops != 0;
	case LRI_F_MEMORY_THROUGHPUT_GBPS: return v->duration_ns > 0 && v->bytes_accessed != 0;
	case LRI_F_TRANSFER_BANDWIDTH_GBPS: return v->duration_ns > 0;
	case LRI_F_PROCESS_RSS_BYTES: /* MemoryReader.read: {} when /proc cannot say */
	case LRI_F_MEMORY_SOURCE: return v->rss >= 0;
	case LRI_F_ACTIVATION_FUNCTION: /* EventBuilder.module: only with an activation */
		return lay != LRI_L_OP_ACTIVATION || v->activation != NULL;
	default: return 1;
	}
}

static int put_field(lri_buf *b, enum lri_layout lay, enum lri_field f, const struct lri_values *v)
{
	switch (f) {
	case LRI_F_EVENT: return -1; /* always a constant */
	case LRI_F_RESOURCE_ID: return put_id(b, v, v->word, v->seq);
	case LRI_F_TIMESTAMP: return put_ll(b, v->ts);
	case LRI_F_SESSION_ID: return put_str(b, v->session_id);
	case LRI_F_STEP: return put_ll(b, v->step);
	case LRI_F_FORWARD: return put_ll(b, v->forward);
	case LRI_F_LAYER_ID: return v->layer < 0 ? put(b, "null", 4) : put_ll(b, v->layer);
	case LRI_F_COMPONENT_TYPE: return put_str(b, v->component);
	case LRI_F_MODULE: return put_str(b, v->module);
	case LRI_F_OPERATION: return put_str(b, v->operation);
	case LRI_F_INPUT_TENSORS:
		if (put(b, "[", 1) < 0)
			return -1;
		for (int i = 0; i < v->n_inputs; i++)
			if ((i && put(b, ",", 1) < 0) || put_tensor(b, &v->inputs[i]) < 0)
				return -1;
		return put(b, "]", 1);
	case LRI_F_OUTPUT_SHAPE:
	case LRI_F_ACTIVATION_SHAPE:
	case LRI_F_TENSOR_SHAPE: return put_shape(b, &v->out);
	case LRI_F_WEIGHT_SHAPE: return put_shape(b, &v->weight);
	case LRI_F_FLOPS: return put_ll(b, v->flops);
	case LRI_F_COMPUTE_INTENSITY_GFLOPS: return put_dbl(b, (double)v->flops / 1e9);
	case LRI_F_BYTES_ACCESSED: return put_ll(b, v->bytes_accessed);
	case LRI_F_DURATION_US: return buf_us((Buf *)(void *)b, v->duration_ns);
	case LRI_F_DURATION_SOURCE: return put_str(b, v->duration_source);
	case LRI_F_THROUGHPUT_GFLOPS_PER_S: return put_dbl(b, per_ns_of(v->flops, v->duration_ns));
	case LRI_F_MEMORY_THROUGHPUT_GBPS: return put_dbl(b, per_ns_of(v->bytes_accessed, v->duration_ns));
	case LRI_F_MLP_OPERATION: return put_str(b, v->mlp_operation);
	case LRI_F_INTERMEDIATE_DIM: return put_ll(b, v->intermediate_dim);
	case LRI_F_INTERMEDIATE_SIZE_BYTES: return put_ll(b, v->intermediate_bytes);
	case LRI_F_INTERMEDIATE_SIZE_MB: return put_dbl(b, (double)v->intermediate_bytes / LRI_MIB);
	case LRI_F_ACTIVATION_MEMORY_PEAK_BYTES: return put_ll(b, v->peak_bytes);
	case LRI_F_ACTIVATION_MEMORY_PEAK_MB: return put_dbl(b, (double)v->peak_bytes / LRI_MIB);
	case LRI_F_ACTIVATION_FUNCTION: return put_str(b, v->activation);
	case LRI_F_COMPUTE_RESOURCE_ID: return put_id(b, v, "compute", v->compute_seq);
	case LRI_F_FLOPS_PER_ELEMENT: return put_ll(b, v->flops_per_element);
	case LRI_F_ALLOCATION_KIND: return put_str(b, v->allocation_kind);
	case LRI_F_ALLOCATION_SIZE_BYTES: return put_ll(b, v->size_bytes);
	case LRI_F_ALLOCATION_SIZE_MB: return put_dbl(b, (double)v->size_bytes / LRI_MIB);
	case LRI_F_MEMORY_TYPE: return put_str(b, v->memory_type);
	case LRI_F_PRECISION: return put_str(b, v->precision);
	case LRI_F_MEMORY_ADDRESS: {
		char s[32];
		int n = snprintf(s, sizeof s, "\"0x%llx\"", (unsigned long long)v->address);
		return put(b, s, (size_t)n);
	}
	case LRI_F_PROCESS_RSS_BYTES: return put_ll(b, v->rss);
	case LRI_F_FROM_COMPONENT: return put_str(b, v->from);
	case LRI_F_TO_COMPONENT: return put_str(b, v->to);
	case LRI_F_DATA_SIZE_BYTES: return put_ll(b, v->data_bytes);
	case LRI_F_DATA_SIZE_MB: return put_dbl(b, (double)v->data_bytes / LRI_MIB);
	case LRI_F_TRANSFER_BANDWIDTH_GBPS: return put_dbl(b, per_ns_of(v->data_bytes, v->duration_ns));
	case LRI_F_MEMORY_PRESSURE: /* system.pressure_word */
		if (v->fraction < 0)
			return put(b, "null", 4);
		return put_s(b, v->fraction < 0.5 ? "\"low\"" : v->fraction < 0.8 ? "\"medium\"" : "\"high\"");
	case LRI_F_MEMORY_USED_FRACTION: return v->fraction < 0 ? put(b, "null", 4) : put_dbl(b, v->fraction);
	case LRI_F_MEMORY_PRESSURE_SOURCE: return put_str(b, v->fraction_source);
	/* constants of every layout that has them (resource_layouts.h) */
	case LRI_F_FLOPS_SOURCE:
	case LRI_F_SIZE_SOURCE:
	case LRI_F_ACTIVATION_MEMORY_PEAK_SOURCE:
	case LRI_F_BANDWIDTH_SOURCE:
	case LRI_F_MEMORY_SOURCE:
	case LRI_F_NAME:
	case LRI_F_SHAPE:
	case LRI_F_DTYPE:
	case LRI_N_FIELDS: break;
	}
	(void)lay;
	return -1;
}

int lri_render(lri_buf *b, enum lri_layout layout, const struct lri_values *v)
{
	if ((int)layout < 0 || layout >= LRI_N_LAYOUTS)
		return -1;
	const struct lri_slot *sl = lri_layouts[layout].slots;
	size_t mark = b->len;
	int first = 1;
	if (put(b, "{", 1) < 0)
		goto fail;
	for (int i = 0; i < lri_layouts[layout].n; i++) {
		if (!present(layout, sl[i].field, v))
			continue;
		if ((!first && put(b, ",", 1) < 0) || put_s(b, lri_field_key[sl[i].field]) < 0)
			goto fail;
		first = 0;
		int rc = sl[i].constant ? put_s(b, sl[i].constant) : put_field(b, layout, sl[i].field, v);
		if (rc < 0)
			goto fail;
	}
	if (put(b, "}\n", 2) < 0)
		goto fail;
	return 0;
fail:
	b->len = mark;
	return -1;
}

const char *lri_short_dtype(const char *dtype)
{
	static const char *const map[][2] = {{"float32", "f32"}, {"float16", "f16"}, {"bfloat16", "bf16"},
					     {"float64", "f64"}, {"int64", "i64"},   {"int32", "i32"},
					     {"int8", "i8"},     {"uint8", "u8"},    {"bool", "bool"}};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (!strcmp(map[i][0], dtype))
			return map[i][1];
	return dtype;
}

/* ----- the events: each figure computed once, as events.py computes it ----------------------- */

static long long numel(const llama_resource_tensor *t)
{
	long long n = 1;
	for (int i = 0; t && i < t->ndim; i++)
		n *= (long long)t->shape[i];
	return n;
}

static struct lri_tensor desc(const llama_resource_tensor *t, const char *name)
{
	struct lri_tensor d = {name, NULL, -1, NULL};
	if (t && t->ndim >= 0) {
		d.shape = t->shape;
		d.ndim = t->ndim;
		d.dtype = t->dtype;
	}
	return d;
}

static const char *leaf_of(const char *module)
{
	if (!module || !*module)
		return "model";
	const char *dot = strrchr(module, '.');
	return dot ? dot + 1 : module;
}

static void base(struct lri_values *v, const struct lri_ctx *c, const char *word, const char *module)
{
	memset(v, 0, sizeof *v);
	v->device = "cpu";
	v->word = word;
	v->leaf = leaf_of(module);
	v->session_id = c->session_id;
	v->ts = c->ts;
	v->seq = c->seq;
	v->step = c->step;
	v->forward = c->forward;
	v->layer = c->layer;
	v->component = c->component;
	v->module = module ? module : "";
	v->rss = -1;
	v->fraction = -1;
	v->out.ndim = -1;
	v->weight.ndim = -1;
}

static long long inner(const llama_resource_tensor *t)
{
	return t && t->ndim > 0 ? (long long)t->shape[t->ndim - 1] : 0;
}

int lri_event_mul_mat(lri_buf *b, const struct lri_ctx *c, const char *module, const llama_resource_tensor *weight,
		      const llama_resource_tensor *input, const llama_resource_tensor *out, long long duration_ns,
		      const char *duration_source, const char *mlp_op, const char *activation, long long *flops)
{
	struct lri_values v;
	base(&v, c, "compute", module);
	/* K: the weight's in_features (its innermost dimension), else the input's */
	long long k = weight && weight->ndim > 0 ? inner(weight) : inner(input);
	long long n_out = out && out->ndim > 0 ? inner(out) : 0;
	long long in_bytes = input ? (long long)input->nbytes : 0;
	long long out_bytes = out ? (long long)out->nbytes : 0;
	if (!input && n_out > 0) /* the seed's LOG_MLP_OPERATION gives no input: its bytes follow from K */
		in_bytes = out_bytes / n_out * k;
	struct lri_tensor ins[2] = {desc(input, "input"), desc(weight, "weight")};
	v.operation = "mul_mat";
	v.inputs = ins;
	v.n_inputs = weight ? 2 : 1;
	v.out = desc(out, NULL);
	v.flops = 2 * k * numel(out);
	v.bytes_accessed = in_bytes + (weight ? (long long)weight->nbytes : 0) + out_bytes;
	v.duration_ns = duration_ns;
	v.duration_source = duration_source;
	*flops = v.flops;
	if (lri_render(b, LRI_L_MUL_MAT, &v) < 0)
		return -1;
	if (!mlp_op)
		return 1;
	int down = !strcmp(mlp_op, "down_proj");
	v.word = "mlp";
	v.compute_seq = c->seq;
	v.seq = c->seq + 1;
	v.mlp_operation = mlp_op;
	v.weight = desc(weight, NULL);
	if (!weight) { /* (out_features, in_features) */
		static const int64_t none = 0;
		v.weight.shape = &none;
		v.weight.ndim = -1;
	}
	v.intermediate_dim = down ? k : n_out;
	v.intermediate_bytes = down ? in_bytes : out_bytes;
	v.peak_bytes = in_bytes + out_bytes;
	v.activation = activation;
	if (lri_render(b, LRI_L_MLP, &v) < 0)
		return -1;
	return 2;
}

int lri_event_op(lri_buf *b, const struct lri_ctx *c, const char *module, const char *operation,
		 const llama_resource_tensor *inputs, int n_inputs, const llama_resource_tensor *out,
		 long long duration_ns, const char *duration_source, long long *flops)
{
	struct lri_values v;
	base(&v, c, "compute", module);
	struct lri_tensor ins[8];
	if (n_inputs > 8)
		n_inputs = 8;
	long long in_bytes = 0;
	for (int i = 0; i < n_inputs; i++) {
		ins[i] = desc(&inputs[i], inputs[i].name ? inputs[i].name : "input");
		in_bytes += (long long)inputs[i].nbytes;
	}
	v.operation = operation;
	v.inputs = ins;
	v.n_inputs = n_inputs;
	v.out = desc(out, NULL);
	v.duration_ns = duration_ns;
	v.duration_source = duration_source;
	/* EventBuilder.module: a norm or an activation is named by its kind and counted per element
	 * (sites.FLOPS_PER_ELEMENT); an embedding lookup and any other op are not counted. */
	enum lri_layout lay = LRI_L_OP_UNCOUNTED;
	long long out_bytes = out ? (long long)out->nbytes : 0;
	if (!strcmp(operation, "rms_norm") || !strcmp(operation, "norm") || !strcmp(operation, "layer_norm")) {
		lay = LRI_L_OP_COUNTED;
		v.operation = "norm";
		v.flops_per_element = strcmp(operation, "rms_norm") ? LRI_FPE_LAYER_NORM : LRI_FPE_RMS_NORM;
	} else if (!strcmp(operation, "silu") || !strcmp(operation, "swiglu") || !strcmp(operation, "gelu") ||
		   !strcmp(operation, "geglu") || !strcmp(operation, "relu") || !strcmp(operation, "reglu")) {
		lay = LRI_L_OP_ACTIVATION;
		v.operation = "activation";
		v.activation = operation;
		v.flops_per_element = operation[0] == 'g'   ? LRI_FPE_GELU
				      : operation[0] == 'r' ? LRI_FPE_RELU
							    : LRI_FPE_SILU;
	}
	if (lay == LRI_L_OP_UNCOUNTED) {
		v.flops = 0;
		v.bytes_accessed = out_bytes;
	} else {
		v.flops = v.flops_per_element * numel(out);
		v.bytes_accessed = in_bytes + out_bytes;
	}
	*flops = v.flops;
	return lri_render(b, lay, &v) < 0 ? -1 : 1;
}

int lri_event_alloc(lri_buf *b, const struct lri_ctx *c, const char *module, const char *kind,
		    const llama_resource_tensor *t, long long rss)
{
	struct lri_values v;
	base(&v, c, "memory", module);
	v.allocation_kind = kind;
	v.size_bytes = (long long)t->nbytes;
	v.memory_type = "host";
	v.out = desc(t, NULL);
	v.precision = t->dtype ? lri_short_dtype(t->dtype) : NULL;
	v.address = t->address;
	v.rss = rss;
	return lri_render(b, LRI_L_ALLOC, &v) < 0 ? -1 : 1;
}

int lri_event_handoff(lri_buf *b, const struct lri_ctx *c, const char *module, const char *from, const char *to,
		      const llama_resource_tensor *t, long long duration_ns, const char *duration_source,
		      double fraction, const char *fraction_source)
{
	struct lri_values v;
	base(&v, c, "flow", module);
	char leaf[192];
	int n = snprintf(leaf, sizeof leaf, "%s_to_%s", from, to); /* "attention_to_mlp" */
	if (n < 0 || (size_t)n >= sizeof leaf)
		return -1;
	v.leaf = leaf;
	v.from = from;
	v.to = to;
	v.data_bytes = t ? (long long)t->nbytes : 0;
	v.out = desc(t, NULL);
	v.duration_ns = duration_ns;
	v.duration_source = duration_source;
	v.fraction = fraction;
	v.fraction_source = fraction_source;
	return lri_render(b, LRI_L_HANDOFF, &v) < 0 ? -1 : 1;
}

int lri_event_forward(lri_buf *b, const struct lri_ctx *c, long long flops, long long duration_ns,
		      const char *duration_source, long long rss)
{
	struct lri_values v;
	base(&v, c, "compute", "");
	v.operation = "model_forward";
	v.flops = flops;
	v.duration_ns = duration_ns;
	v.duration_source = duration_source;
	v.rss = rss;
	return lri_render(b, LRI_L_FORWARD, &v) < 0 ? -1 : 1;
}

/* ----- session start and summary ----- */

static int put_kv_str(lri_buf *b, const char *key, const char *v)
{
	return put_s(b, key) < 0 || put_str(b, v) < 0 ? -1 : 0;
}

static int put_kv_ll(lri_buf *b, const char *key, long long v)
{
	return put_s(b, key) < 0 || put_ll(b, v) < 0 ? -1 : 0;
}

int lri_event_session_start(lri_buf *b, const char *session_id, long long ts, const char *iso, const char *level,
			    int enabled, const char *model_class, long long pid)
{
	size_t mark = b->len;
	char id[256];
	snprintf(id, sizeof id, "session_%s", session_id);
	if (put_kv_str(b, "{\"event\":", "resource_session_start") || put_kv_str(b, ",\"resource_id\":", id) ||
	    put_kv_ll(b, ",\"timestamp\":", ts) || put_kv_str(b, ",\"iso_timestamp\":", iso) ||
	    put_kv_str(b, ",\"session_id\":", session_id) || put_kv_str(b, ",\"level\":", level) ||
	    put_s(b, enabled ? ",\"enabled\":true" : ",\"enabled\":false") < 0 ||
	    put_kv_str(b, ",\"model_class\":", model_class) || put_kv_str(b, ",\"device\":", "cpu") ||
	    put_kv_str(b, ",\"timing\":", "clock_monotonic") || put_kv_ll(b, ",\"pid\":", pid) ||
	    put_s(b, ",\"nvml\":false}\n") < 0) {
		b->len = mark;
		return -1;
	}
	return 1;
}

int lri_event_session_summary(lri_buf *b, const struct lri_summary *s)
{
	size_t mark = b->len;
	char id[256];
	snprintf(id, sizeof id, "session_%s_summary", s->session_id);
	int bad = put_kv_str(b, "{\"event\":", "resource_session_summary") || put_kv_str(b, ",\"resource_id\":", id) ||
		  put_kv_ll(b, ",\"timestamp\":", s->ts) || put_kv_str(b, ",\"iso_timestamp\":", s->iso) ||
		  put_kv_str(b, ",\"session_id\":", s->session_id) || put_kv_str(b, ",\"level\":", s->level) ||
		  put_kv_ll(b, ",\"forwards\":", s->forwards) ||
		  put_kv_ll(b, ",\"parameter_bytes\":", s->parameter_bytes) ||
		  put_kv_ll(b, ",\"total_compute_flops\":", s->total_flops) ||
		  put_s(b, ",\"total_compute_gflops\":") < 0 || put_dbl(b, (double)s->total_flops / 1e9) < 0 ||
		  put_s(b, ",\"total_compute_us\":") < 0 || put_dbl(b, (double)s->total_compute_ns / 1000.0) < 0 ||
		  put_kv_ll(b, ",\"component_flows\":", s->component_flows) || put_s(b, ",\"events\":{") < 0;
	int first = 1;
	for (int i = 0; !bad && i < s->n_counts; i++) {
		if (!s->counts[i])
			continue;
		bad = put_s(b, first ? "" : ",") < 0 || put_str(b, s->count_names[i]) < 0 || put(b, ":", 1) < 0 ||
		      put_ll(b, s->counts[i]) < 0;
		first = 0;
	}
	bad = bad || put_s(b, "},\"monitor_hook_us\":") < 0 || buf_us((Buf *)(void *)b, s->hook_ns) < 0;
	if (!bad && s->peak_rss >= 0)
		bad = put_kv_ll(b, ",\"total_memory_bytes\":", s->peak_rss) ||
		      put_kv_str(b, ",\"total_memory_source\":", "proc_self_status_VmHWM") ||
		      put_s(b, ",\"total_memory_mb\":") < 0 || put_dbl(b, (double)s->peak_rss / LRI_MIB) < 0;
	else if (!bad)
		bad = put_s(b, ",\"total_memory_mb\":null") < 0;
	if (bad || put(b, "}\n", 2) < 0) {
		b->len = mark;
		return -1;
	}
	return 1;
}
