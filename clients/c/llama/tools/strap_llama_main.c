/*
 * strap-llama — greedy generation with llama.cpp, capturing graph nodes into a strapd stream
 * (docs/LLAMA_CPP.md). In the spirit of llama.cpp's llama-simple; linked against the `llama`
 * library only.
 *
 *   strap-llama -m model.gguf -p PROMPT -n N --output capture.strap
 *               [--tensors l_out,attn_out,ffn_out] [--checkpoint-interval-tokens K] [--resume]
 *               [--resource-level MINIMAL|DETAILED|VERBOSE] [--resource-log PATH]
 *
 * One forward pass per token: the prompt's pass produces token 0, each later pass feeds the
 * previous token. Each token is recorded (TOKEN, step = its index) right after it is chosen.
 * At each checkpoint llama.cpp's state (KV cache) is saved beside the stream first, so a resume
 * continues from the very cache the interrupted run had and writes the same bytes.
 * A JSON summary goes to stdout (tokens, timings); llama.cpp's log is silent unless --verbose.
 */
#define _POSIX_C_SOURCE 200809L
#include "strap_llama.h"

#include "llama-resource-instrumentation.h"

#include <ggml-backend.h>
#include <llama.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct opts {
	const char *model, *prompt, *output, *tensors, *socket, *codec, *dump_dir, *also_observe;
	const char *resource_level, *resource_log;
	int n_predict, threads, ctx, ubatch, interval, resume, overwrite, no_capture, last_logits_only;
	int ignore_eos, raw_names, verbose, trace, f32_attention, no_threadpool;
};

static void usage(void)
{
	fprintf(stderr,
		"usage: strap-llama -m MODEL.gguf -p PROMPT -n N --output CAPTURE.strap [options]\n"
		"  --tensors LIST                  graph names, comma-separated (l_out,attn_out,ffn_out; l_out-3 for "
		"one "
		"layer); default l_out\n"
		"  --checkpoint-interval-tokens K  checkpoint (and save llama.cpp's state) every K tokens; 0: never\n"
		"  --resume                        continue from the checkpoint of an interrupted capture\n"
		"  --overwrite                     start over although a checkpoint exists\n"
		"  -t N                            threads (default 1)\n"
		"  --ctx N, --ubatch N             context size (default prompt + N), physical batch size\n"
		"  --last-logits-only              the prompt pass asks logits for its last row only (llama.cpp then "
		"prunes the last layer's rows)\n"
		"  --ignore-eos                    generate N tokens even past an end-of-generation token\n"
		"  --raw-names                     record under graph names (l_out-3), not module names\n"
		"  --codec NAME, --socket PATH     stream codec, strapd socket\n"
		"  --f32-attention                 KV cache in f32 and no flash attention (llama.cpp's defaults, f16 "
		"and "
		"flash attention, round attention to f16)\n"
		"  --no-threadpool                 let ggml make a thread team per graph computation instead of "
		"attaching "
		"one\n"
		"  --trace                         ask strapd for its kernel trace (CAPTURE.trace.jsonl)\n"
		"  --resource-level LEVEL          resource events (MINIMAL, DETAILED, VERBOSE; "
		"docs/RESOURCE_EVENTS.md): "
		"to strapd (CAPTURE.resources.jsonl), or with --no-capture to --resource-log\n"
		"  --resource-log PATH             the resource events' JSONL file without a capture (default "
		"STRAP_RESOURCE_LOG_PATH)\n"
		"  --no-capture                    generate only (the baseline for tokens and speed)\n"
		"  --dump-dir DIR                  also write each captured tensor as ggml_backend_tensor_get returns "
		"it, with a manifest (tests)\n"
		"  --also-observe NAME             a second eval callback, chained, observing node NAME (tests)\n"
		"  --verbose                       llama.cpp's log on stderr\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof *o);
	o->n_predict = 16;
	o->threads = 1;
	o->tensors = "l_out";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL()                                                                                                          \
	do {                                                                                                           \
		if (!v) {                                                                                              \
			fprintf(stderr, "strap-llama: %s needs a value\n", a);                                         \
			return -1;                                                                                     \
		}                                                                                                      \
		i++;                                                                                                   \
	} while (0)
		if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
			VAL();
			o->model = v;
		} else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
			VAL();
			o->prompt = v;
		} else if (!strcmp(a, "-n")) {
			VAL();
			o->n_predict = atoi(v);
		} else if (!strcmp(a, "--output") || !strcmp(a, "-o")) {
			VAL();
			o->output = v;
		} else if (!strcmp(a, "--tensors")) {
			VAL();
			o->tensors = v;
		} else if (!strcmp(a, "--checkpoint-interval-tokens")) {
			VAL();
			o->interval = atoi(v);
		} else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
			VAL();
			o->threads = atoi(v);
		} else if (!strcmp(a, "--ctx")) {
			VAL();
			o->ctx = atoi(v);
		} else if (!strcmp(a, "--ubatch")) {
			VAL();
			o->ubatch = atoi(v);
		} else if (!strcmp(a, "--socket")) {
			VAL();
			o->socket = v;
		} else if (!strcmp(a, "--codec")) {
			VAL();
			o->codec = v;
		} else if (!strcmp(a, "--resource-level")) {
			VAL();
			o->resource_level = v;
		} else if (!strcmp(a, "--resource-log")) {
			VAL();
			o->resource_log = v;
		} else if (!strcmp(a, "--dump-dir")) {
			VAL();
			o->dump_dir = v;
		} else if (!strcmp(a, "--also-observe")) {
			VAL();
			o->also_observe = v;
		} else if (!strcmp(a, "--resume")) {
			o->resume = 1;
		} else if (!strcmp(a, "--overwrite")) {
			o->overwrite = 1;
		} else if (!strcmp(a, "--no-capture")) {
			o->no_capture = 1;
		} else if (!strcmp(a, "--last-logits-only")) {
			o->last_logits_only = 1;
		} else if (!strcmp(a, "--ignore-eos")) {
			o->ignore_eos = 1;
		} else if (!strcmp(a, "--raw-names")) {
			o->raw_names = 1;
		} else if (!strcmp(a, "--f32-attention")) {
			o->f32_attention = 1;
		} else if (!strcmp(a, "--no-threadpool")) {
			o->no_threadpool = 1;
		} else if (!strcmp(a, "--trace")) {
			o->trace = 1;
		} else if (!strcmp(a, "--verbose")) {
			o->verbose = 1;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			exit(0);
		} else {
			fprintf(stderr, "strap-llama: unknown argument %s\n", a);
			return -1;
		}
#undef VAL
	}
	if (!o->model || !o->prompt || (!o->output && !o->no_capture)) {
		fprintf(stderr, "strap-llama: -m, -p and --output are required (--output unless --no-capture)\n");
		return -1;
	}
	if (o->n_predict < 1 || o->threads < 1 || o->interval < 0 || o->ctx < 0 || o->ubatch < 0) {
		fprintf(stderr, "strap-llama: -n and -t must be >= 1; --ctx, --ubatch, the interval >= 0\n");
		return -1;
	}
	return 0;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ud)
{
	(void)ud;
	if (level == GGML_LOG_LEVEL_ERROR)
		fputs(text, stderr);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread): the cost of decoding and capturing, apart from
 * waiting for a CPU shared with strapd and other processes */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: the one that calls llama_decode and, with one thread, computes the
 * graph (ggml's threadpool runs its first worker on the caller); the resource writer and strapd
 * are not in it */
static double thread_cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void json_string(FILE *f, const char *s, size_t n)
{
	fputc('"', f);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* A token's text as llama.cpp renders it, made valid UTF-8 for TOKEN (a piece may end inside a
 * multi-byte character: the incomplete tail is replaced by U+FFFD, as Python's decode does). */
static int token_text(const struct llama_vocab *vocab, llama_token tok, char *buf, int cap)
{
	int n = llama_token_to_piece(vocab, tok, buf, cap - 4, 0, true);
	if (n < 0)
		n = 0;
	int out = 0;
	char tmp[256];
	for (int i = 0; i < n;) {
		unsigned char c = (unsigned char)buf[i];
		int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		int ok = len > 0 && i + len <= n;
		for (int k = 1; ok && k < len; k++)
			ok = ((unsigned char)buf[i + k] >> 6) == 2;
		if (ok) {
			memcpy(tmp + out, buf + i, (size_t)len);
			out += len;
			i += len;
		} else {
			memcpy(tmp + out, "\xef\xbf\xbd", 3);
			out += 3;
			i++;
		}
		if (out > (int)sizeof tmp - 8)
			break;
	}
	memcpy(buf, tmp, (size_t)out);
	return out;
}

/* ----- --dump-dir: the tensors as the callback sees them ----- */

struct dump {
	const char *dir;
	FILE *manifest;
	int n;
	uint64_t step;
	int failed;
};

static const char *dtype_name(enum ggml_type t)
{
	switch (t) {
	case GGML_TYPE_F32: return "float32";
	case GGML_TYPE_F16: return "float16";
	case GGML_TYPE_BF16: return "bfloat16";
	case GGML_TYPE_I32: return "int32";
	default: return NULL;
	}
}

static void dump_record(void *ud, struct ggml_tensor *t, const char *name, const int64_t *shape, int ndim,
			const char *meta, int rc)
{
	struct dump *d = ud;
	const char *dt = dtype_name(t->type);
	if (rc < 0 || !dt || !ggml_is_contiguous(t)) {
		d->failed = 1;
		return;
	}
	size_t nb = ggml_nbytes(t);
	void *buf = malloc(nb ? nb : 1);
	char path[4096];
	snprintf(path, sizeof path, "%s/%d.bin", d->dir, d->n);
	FILE *f = fopen(path, "wb");
	if (!buf || !f) {
		d->failed = 1;
		free(buf);
		if (f)
			fclose(f);
		return;
	}
	ggml_backend_tensor_get(t, buf, 0, nb);
	if (fwrite(buf, 1, nb, f) != nb)
		d->failed = 1;
	fclose(f);
	free(buf);
	fprintf(d->manifest, "{\"kind\":\"tensor\",\"name\":");
	json_string(d->manifest, name, strlen(name));
	fprintf(d->manifest, ",\"dtype\":\"%s\",\"shape\":[", dt);
	for (int i = 0; i < ndim; i++)
		fprintf(d->manifest, i ? ",%lld" : "%lld", (long long)shape[i]);
	fprintf(d->manifest, "],\"step\":%llu,\"forward\":%llu,\"meta\":%s,\"file\":\"%d.bin\"}\n",
		(unsigned long long)d->step, (unsigned long long)d->step, meta, d->n);
	d->n++;
}

/* ----- --also-observe: a callback installed before ours, to show chaining ----- */

struct observer {
	const char *name;
	long seen;
};

static bool observe_cb(struct ggml_tensor *t, bool ask, void *ud)
{
	struct observer *o = ud;
	if (ask)
		return !strcmp(ggml_get_name(t), o->name);
	o->seen++;
	return true;
}

/* ----- llama.cpp state files beside the stream ----- */

static void state_path(const char *output, uint64_t tokens, char *buf, size_t len)
{
	snprintf(buf, len, "%s.llama-state.%llu", output, (unsigned long long)tokens);
}

static int fsync_path(const char *path, int dir)
{
	int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
	if (fd < 0)
		return -1;
	int r = fsync(fd);
	close(fd);
	return r;
}

/* Calls fn(path, tokens, ud) for each state file of `output` ("<output>.llama-state.<tokens>";
 * tokens LLONG_MIN for other names under that prefix). */
static void each_state(const char *output, void (*fn)(const char *, long long, void *), void *ud)
{
	char dirbuf[4096], basebuf[4096];
	snprintf(dirbuf, sizeof dirbuf, "%s", output);
	snprintf(basebuf, sizeof basebuf, "%s", output);
	const char *dir = dirname(dirbuf);
	const char *base = basename(basebuf);
	char prefix[4200];
	snprintf(prefix, sizeof prefix, "%s.llama-state.", base);
	size_t pl = strlen(prefix);
	DIR *dp = opendir(dir);
	if (!dp)
		return;
	struct dirent *e;
	while ((e = readdir(dp))) {
		if (strncmp(e->d_name, prefix, pl))
			continue;
		char *end;
		long long n = strtoll(e->d_name + pl, &end, 10);
		if (*end || !isdigit((unsigned char)e->d_name[pl]))
			n = LLONG_MIN; /* not a state's name: a temporary file of a killed save */
		char p[8400];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		fn(p, n, ud);
	}
	closedir(dp);
}

static void remove_unless(const char *path, long long tokens, void *keep)
{
	if (tokens != *(long long *)keep)
		unlink(path);
}

/* Removes every state file of `output` except the one for `keep` tokens (keep < 0: all). */
static void remove_states(const char *output, long long keep)
{
	each_state(output, remove_unless, &keep);
}

struct newest_state {
	long long limit, found;
};

static void keep_newest(const char *path, long long tokens, void *ud)
{
	(void)path;
	struct newest_state *n = ud;
	if (tokens <= n->limit && tokens > n->found)
		n->found = tokens;
}

/* The most tokens, at most `limit`, that a state file of `output` holds; 0 when none does. */
static long long newest_state(const char *output, long long limit)
{
	struct newest_state n = {limit, 0};
	each_state(output, keep_newest, &n);
	return n.found;
}

static int save_state(struct llama_context *ctx, const char *output, uint64_t tokens, const llama_token *all,
		      size_t n_all)
{
	char path[4200], tmp[4300];
	state_path(output, tokens, path, sizeof path);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	if (!llama_state_save_file(ctx, tmp, all, n_all)) {
		fprintf(stderr, "strap-llama: llama_state_save_file(%s) failed\n", tmp);
		return -1;
	}
	char dirbuf[4200];
	snprintf(dirbuf, sizeof dirbuf, "%s", path);
	if (fsync_path(tmp, 0) || rename(tmp, path) || fsync_path(dirname(dirbuf), 1)) {
		fprintf(stderr, "strap-llama: saving %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

static int split_list(char *s, const char **out, int cap)
{
	int n = 0;
	for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
		if (n == cap)
			return -1;
		out[n++] = tok;
	}
	return n;
}

/* ----- main's steps ----- */

/* What main's steps share: the options, llama.cpp's objects, the capture's, and what the run
 * measured for the summary. A step returns 0, or the exit status (1: an error, said on stderr;
 * 2: a usage error); the process then exits without freeing, as a tool may. */
struct run {
	struct opts o;
	int resource_level; /* 0: no resource events, else MINIMAL (1) .. VERBOSE (3) */
	struct llama_model *model;
	const struct llama_vocab *vocab;
	int n_prompt;
	size_t n_all_cap;
	llama_token *all; /* the prompt's tokens, then the generated ones */
	llama_token *gen; /* all + n_prompt */
	struct llama_context_params cp;
	struct llama_context *ctx;
	struct ggml_threadpool *tp;
	void (*tp_free)(struct ggml_threadpool *);
	strap_session *s; /* NULL under --no-capture */
	strap_llama *h;
	strap_llama_resources *res;
	strap_error err;
	char tensors_buf[4096];
	const char *names[64]; /* --tensors, split in tensors_buf */
	struct dump dump;
	struct observer obs;
	uint64_t start; /* the first token generated here: 0, or the checkpoint's token count */
	int n_gen;      /* tokens known at the end, resumed ones included */
	double t_prompt, t0_decode, c0_decode, tc0_decode, t_decode, c_decode, tc_decode, t_close;
	strap_llama_stats st;
	llama_resource_stats rst;
};

static int resource_level_of(struct run *r)
{
	if (!r->o.resource_level)
		return 0;
	static const char *const lv[] = {"MINIMAL", "DETAILED", "VERBOSE"};
	for (int i = 0; i < 3; i++)
		if (!strcasecmp(r->o.resource_level, lv[i]))
			r->resource_level = i + 1;
	if (!r->resource_level) {
		fprintf(stderr, "strap-llama: --resource-level must be MINIMAL, DETAILED or VERBOSE\n");
		return 2;
	}
	return 0;
}

/* The model, and the prompt's tokens at the head of r->all (room for n_predict more). */
static int load_model_and_prompt(struct run *r)
{
	struct llama_model_params mp = llama_model_default_params();
	r->model = llama_model_load_from_file(r->o.model, mp);
	if (!r->model) {
		fprintf(stderr, "strap-llama: cannot load %s\n", r->o.model);
		return 1;
	}
	r->vocab = llama_model_get_vocab(r->model);
	int plen = (int)strlen(r->o.prompt);
	r->n_prompt = -llama_tokenize(r->vocab, r->o.prompt, plen, NULL, 0, true, true);
	if (r->n_prompt <= 0) {
		fprintf(stderr, "strap-llama: the prompt gives no tokens\n");
		return 1;
	}
	r->n_all_cap = (size_t)r->n_prompt + (size_t)r->o.n_predict;
	r->all = malloc(r->n_all_cap * sizeof *r->all);
	if (!r->all || llama_tokenize(r->vocab, r->o.prompt, plen, r->all, r->n_prompt, true, true) != r->n_prompt) {
		fprintf(stderr, "strap-llama: tokenizing the prompt failed\n");
		return 1;
	}
	r->gen = r->all + r->n_prompt;
	return 0;
}

/* llama.cpp's context parameters: one sequence, the prompt in one batch, --also-observe's
 * callback installed first (the capture's and the resource events' chain after it). */
static void context_params(struct run *r)
{
	struct llama_context_params *cp = &r->cp;
	*cp = llama_context_default_params();
	cp->n_ctx = r->o.ctx ? (uint32_t)r->o.ctx : (uint32_t)(r->n_prompt + r->o.n_predict + 1);
	cp->n_batch = (uint32_t)(r->n_prompt > 1 ? r->n_prompt : 1);
	cp->n_ubatch = r->o.ubatch ? (uint32_t)r->o.ubatch : cp->n_batch;
	cp->n_seq_max = 1;
	cp->n_threads = r->o.threads;
	cp->n_threads_batch = r->o.threads;
	cp->no_perf = true;
	if (r->o.f32_attention) {
		cp->type_k = GGML_TYPE_F32;
		cp->type_v = GGML_TYPE_F32;
		cp->flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
	}
	r->obs = (struct observer){r->o.also_observe, 0};
	if (r->o.also_observe) {
		cp->cb_eval = observe_cb;
		cp->cb_eval_user_data = &r->obs;
	}
}

/* The stream header's metadata: the model, the prompt and the run's shape, as JSON. */
static void capture_metadata(const struct run *r, char *meta, size_t cap)
{
	char arch[64] = "";
	llama_model_meta_val_str(r->model, "general.architecture", arch, sizeof arch);
	size_t mn = (size_t)snprintf(meta, cap, "{\"engine\":\"llama.cpp\",\"model_class\":");
	FILE *mf = fmemopen(meta + mn, cap - mn, "w");
	json_string(mf, arch, strlen(arch));
	fprintf(mf, ",\"model_path\":");
	json_string(mf, r->o.model, strlen(r->o.model));
	fprintf(mf, ",\"n_layer\":%d,\"n_embd\":%d,\"prompt\":", llama_model_n_layer(r->model),
		llama_model_n_embd(r->model));
	json_string(mf, r->o.prompt, strlen(r->o.prompt));
	fprintf(mf, ",\"prompt_tokens\":%d,\"threads\":%d}", r->n_prompt, r->o.threads);
	fputc(0, mf);
	fclose(mf);
}

/* --dump-dir: every record the callback writes, also as a file, listed in manifest.jsonl. */
static int open_dump(struct run *r, strap_llama_params *lp)
{
	char mpath[4200];
	snprintf(mpath, sizeof mpath, "%s/manifest.jsonl", r->o.dump_dir);
	mkdir(r->o.dump_dir, 0755);
	r->dump.dir = r->o.dump_dir;
	r->dump.manifest = fopen(mpath, "w");
	if (!r->dump.manifest) {
		fprintf(stderr, "strap-llama: %s: %s\n", mpath, strerror(errno));
		return 1;
	}
	lp->on_record = dump_record;
	lp->on_record_data = &r->dump;
	return 0;
}

/* The capture: the libstrap session (resumed with --resume) and the eval callback on it. */
static int open_capture(struct run *r)
{
	const struct opts *o = &r->o;
	snprintf(r->tensors_buf, sizeof r->tensors_buf, "%s", o->tensors);
	int n_names = split_list(r->tensors_buf, r->names, 64);
	if (n_names < 1) {
		fprintf(stderr, "strap-llama: --tensors: 1 to 64 names\n");
		return 2;
	}
	char fp[4096], meta[8192];
	struct stat st;
	long long msize = stat(o->model, &st) == 0 ? (long long)st.st_size : -1;
	/* what must not change between a capture and its resume */
	snprintf(fp, sizeof fp,
		 "strap-llama model=%s size=%lld tensors=%s raw=%d n=%d last_logits_only=%d ubatch=%d "
		 "f32_attention=%d",
		 o->model, msize, o->tensors, o->raw_names, o->n_predict, o->last_logits_only, o->ubatch,
		 o->f32_attention);
	capture_metadata(r, meta, sizeof meta);

	strap_session_params sp = strap_default_session_params();
	sp.output_path = o->output;
	sp.socket_path = o->socket;
	sp.codec = o->codec ? o->codec : "none";
	sp.fingerprint = fp;
	sp.metadata_json = meta;
	sp.client_name = "strap-llama/" STRAP_VERSION_STRING;
	sp.resume = o->resume;
	sp.trace = o->trace;
	sp.overwrite_checkpoint = o->overwrite;
	sp.resources = r->resource_level > 0;
	if (sp.resume) {
		/* libstrap would keep the stream's intact prefix, up to its last token; generation can
		 * go on only from a token count llama.cpp's state was saved at (each checkpoint's, or
		 * the next one's when the run was killed between its state and its checkpoint). A
		 * finished capture, or a stream the probe refuses, is left to the open to refuse.
		 * With a checkpoint and no state at all, the open keeps the stream's prefix and the
		 * missing state is an error (resume_from_checkpoint), never a silent start over. */
		strap_resume_point rp;
		char ckpt[4200];
		snprintf(ckpt, sizeof ckpt, "%s.ckpt.json", o->output);
		if (strap_resume_probe(&sp, &rp, &r->err) == STRAP_OK && !rp.complete) {
			long long have = newest_state(o->output, (long long)rp.token_count);
			if (have > 0 || access(ckpt, F_OK) != 0)
				sp.resume_max_tokens = have;
		}
	}
	if (strap_session_open(&sp, &r->s, &r->err) != STRAP_OK) {
		fprintf(stderr, "strap-llama: %s\n", r->err.message);
		return 1;
	}
	strap_llama_params lp = strap_llama_default_params();
	lp.tensors = r->names;
	lp.n_tensors = n_names;
	lp.raw_names = o->raw_names;
	lp.n_batch_max = r->n_prompt;
	if (o->dump_dir && open_dump(r, &lp))
		return 1;
	if (strap_llama_new(r->s, r->model, &lp, &r->h, &r->err) != STRAP_OK ||
	    strap_llama_attach(r->h, &r->cp, &r->err) != STRAP_OK) {
		fprintf(stderr, "strap-llama: %s\n", r->err.message);
		return 1;
	}
	return 0;
}

/* Resource events: through the session (strapd writes CAPTURE.resources.jsonl), or without a
 * capture to --resource-log; the resource callback goes outside the capture's (see
 * strap_llama_resources_attach). */
static int start_resources(struct run *r)
{
	int rrc = r->s ? llama_resource_instrumentation_init_session(r->resource_level, r->s)
		       : llama_resource_instrumentation_init(r->resource_level, r->o.resource_log);
	if (rrc != STRAP_OK) {
		llama_resource_last_error(&r->err);
		fprintf(stderr, "strap-llama: resource events: %s\n", r->err.message);
		return 1;
	}
	char arch[64] = "";
	llama_model_meta_val_str(r->model, "general.architecture", arch, sizeof arch);
	llama_resource_set_model_class(arch[0] ? arch : "llama.cpp");
	/* the MLP's activation: SiLU in the Llama family's feed-forward (build_ffn LLM_FFN_SILU) */
	if (!strcmp(arch, "llama") || !strcmp(arch, "mistral") || !strcmp(arch, "qwen2") || !strcmp(arch, "qwen3"))
		llama_resource_set_activation_function("silu");
	llama_resource_begin_session(NULL);
	if (strap_llama_resources_new(r->model, &r->res, &r->err) != STRAP_OK) {
		fprintf(stderr, "strap-llama: %s\n", r->err.message);
		return 1;
	}
	strap_llama_resources_attach(r->res, &r->cp);
	return 0;
}

/* A persistent thread team, as llama.cpp's own tools attach (llama-cli, llama-bench): without
 * one ggml sets one up per graph computation, and an eval callback splits each graph into one
 * computation per observed node. */
static int attach_threadpool(struct run *r)
{
	ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
	/* ggml-cpu's own functions, looked up as llama.cpp's tools do; copied, as ISO C has no cast
	 * from an object pointer to a function pointer */
	void *fn_new = cpu ? ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new") : NULL;
	void *fn_free = cpu ? ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_free") : NULL;
	struct ggml_threadpool *(*tp_new)(struct ggml_threadpool_params *) = NULL;
	if (fn_new && fn_free) {
		memcpy(&tp_new, &fn_new, sizeof tp_new);
		memcpy(&r->tp_free, &fn_free, sizeof r->tp_free);
	}
	struct ggml_threadpool_params tpp = ggml_threadpool_params_default(r->o.threads);
	r->tp = tp_new ? tp_new(&tpp) : NULL;
	if (!r->tp) {
		fprintf(stderr, "strap-llama: cannot create ggml's CPU threadpool\n");
		return 1;
	}
	llama_attach_threadpool(r->ctx, r->tp, r->tp);
	return 0;
}

static int make_context(struct run *r)
{
	r->ctx = llama_init_from_model(r->model, r->cp);
	if (!r->ctx) {
		fprintf(stderr, "strap-llama: llama_init_from_model failed\n");
		return 1;
	}
	return r->o.no_threadpool ? 0 : attach_threadpool(r);
}

/* Where to start: token 0, or the checkpoint's token count with llama.cpp's state then (the
 * state file saved beside the stream at that checkpoint). */
static int resume_from_checkpoint(struct run *r)
{
	r->start = 0;
	if (!r->s)
		return 0;
	strap_resume_point rp = strap_session_resume_point(r->s);
	if (rp.resumed && rp.token_count > 0) {
		if (rp.forward_count != rp.token_count || rp.token_count > (uint64_t)r->o.n_predict) {
			fprintf(stderr,
				"strap-llama: the checkpoint has %llu tokens and %llu forward passes: not a "
				"strap-llama capture of at most %d tokens\n",
				(unsigned long long)rp.token_count, (unsigned long long)rp.forward_count,
				r->o.n_predict);
			return 1;
		}
		char path[4200];
		state_path(r->o.output, rp.token_count, path, sizeof path);
		llama_token *loaded = malloc(r->n_all_cap * sizeof *loaded);
		size_t n_loaded = 0;
		if (!loaded || !llama_state_load_file(r->ctx, path, loaded, r->n_all_cap, &n_loaded)) {
			fprintf(stderr, "strap-llama: cannot load llama.cpp's state %s for the checkpoint\n", path);
			return 1;
		}
		if (n_loaded != (size_t)r->n_prompt + rp.token_count ||
		    memcmp(loaded, r->all, (size_t)r->n_prompt * sizeof *r->all)) {
			fprintf(stderr, "strap-llama: %s holds %zu tokens, not this prompt's %d + %llu\n", path,
				n_loaded, r->n_prompt, (unsigned long long)rp.token_count);
			return 1;
		}
		memcpy(r->all, loaded, n_loaded * sizeof *r->all);
		free(loaded);
		r->start = rp.token_count;
	}
	/* a state newer than the checkpoint (killed between the two) or left by an old run */
	remove_states(r->o.output, r->start ? (long long)r->start : -1);
	return 0;
}

/* Token k's batch: the whole prompt for k = 0, else the previous token. */
static void fill_batch(const struct run *r, struct llama_batch *batch, int k)
{
	batch->n_tokens = 0;
	if (k == 0) {
		for (int i = 0; i < r->n_prompt; i++) {
			batch->token[i] = r->all[i];
			batch->pos[i] = i;
			batch->n_seq_id[i] = 1;
			batch->seq_id[i][0] = 0;
			batch->logits[i] = !r->o.last_logits_only || i == r->n_prompt - 1;
		}
		batch->n_tokens = r->n_prompt;
	} else {
		batch->token[0] = r->gen[k - 1];
		batch->pos[0] = r->n_prompt + k - 1;
		batch->n_seq_id[0] = 1;
		batch->seq_id[0][0] = 0;
		batch->logits[0] = 1;
		batch->n_tokens = 1;
	}
}

/* One forward pass inside the capture's and the resource events' brackets. 0: done; -1: the
 * capture failed (its error is reported once generation ends); 1: llama_decode failed. */
static int decode_step(struct run *r, struct llama_batch batch, int k)
{
	r->dump.step = (uint64_t)k;
	if (r->h && strap_llama_begin_decode(r->h, &batch, 0) != STRAP_OK)
		return -1;
	if (r->res)
		strap_llama_resources_begin_decode(r->res, k);
	int d = llama_decode(r->ctx, batch);
	if (r->res)
		strap_llama_resources_end_decode(r->res);
	if (r->h && strap_llama_end_decode(r->h) != STRAP_OK)
		return -1;
	if (d != 0) {
		fprintf(stderr, "strap-llama: llama_decode returned %d\n", d);
		return 1;
	}
	return 0;
}

static llama_token greedy(struct llama_context *ctx, int n_vocab)
{
	const float *logits = llama_get_logits_ith(ctx, -1);
	llama_token best = 0;
	for (int v = 1; v < n_vocab; v++)
		if (logits[v] > logits[best])
			best = v;
	return best;
}

/* Token k, chosen: TOKEN (and the --dump-dir manifest's line), then every --checkpoint-interval
 * tokens llama.cpp's state and a checkpoint. */
static int record_token(struct run *r, int k, llama_token best)
{
	char text[256];
	int tl = token_text(r->vocab, best, text, sizeof text);
	if (r->dump.manifest) {
		fprintf(r->dump.manifest, "{\"kind\":\"token\",\"index\":%d,\"token_id\":%d,\"text\":", k, best);
		json_string(r->dump.manifest, text, (size_t)tl);
		fprintf(r->dump.manifest, "}\n");
	}
	if (strap_session_token(r->s, best, text, (size_t)tl, r->n_prompt + k) < 0) {
		strap_session_last_error(r->s, &r->err);
		fprintf(stderr, "strap-llama: token: %s\n", r->err.message);
		return 1;
	}
	uint64_t done = (uint64_t)k + 1;
	if (r->o.interval <= 0 || done % (uint64_t)r->o.interval != 0 || done >= (uint64_t)r->o.n_predict)
		return 0;
	/* llama.cpp's state first, then the checkpoint: a resume needs both, and a state without its
	 * checkpoint is removed at the next start */
	if (save_state(r->ctx, r->o.output, done, r->all, (size_t)r->n_prompt + done))
		return 1;
	if (strap_session_checkpoint(r->s) < 0) {
		strap_session_last_error(r->s, &r->err);
		fprintf(stderr, "strap-llama: checkpoint: %s\n", r->err.message);
		return 1;
	}
	remove_states(r->o.output, (long long)done);
	return 0;
}

/* Greedy generation from r->start to --n-predict tokens (or end of generation), one forward pass
 * per token, timed: the prompt's pass alone, decoding from the first pass after it. */
static int generate(struct run *r)
{
	struct llama_batch batch = llama_batch_init(r->n_prompt, 0, 1);
	int n_vocab = llama_vocab_n_tokens(r->vocab);
	int start = (int)r->start, rc = 0;
	r->n_gen = start;
	for (int k = start; k < r->o.n_predict; k++) {
		fill_batch(r, &batch, k);
		double t = now();
		if (k == start + 1 || (k == start && k > 0)) {
			r->t0_decode = t;
			r->c0_decode = cpu_now();
			r->tc0_decode = thread_cpu_now();
		}
		int d = decode_step(r, batch, k);
		if (d) {
			rc = d > 0 ? d : 0;
			break;
		}
		if (k == 0)
			r->t_prompt = now() - t;
		llama_token best = greedy(r->ctx, n_vocab);
		r->gen[k] = best;
		r->n_gen = k + 1;
		if (r->s && (rc = record_token(r, k, best)))
			break;
		if (!r->o.ignore_eos && llama_vocab_is_eog(r->vocab, best))
			break;
	}
	r->t_decode = r->t0_decode > 0 ? now() - r->t0_decode : 0;
	r->c_decode = r->t0_decode > 0 ? cpu_now() - r->c0_decode : 0;
	r->tc_decode = r->t0_decode > 0 ? thread_cpu_now() - r->tc0_decode : 0;
	llama_batch_free(batch);
	return rc;
}

/* The end of a run, whatever generation returned (rc): the capture's error, the stats, the
 * resource log's end (its summary sent before the session closes), the session's close
 * (strapd drains the ring, writes the index, syncs; timed) and the dump's manifest. */
static int finish(struct run *r, int rc)
{
	if (r->h) {
		strap_error le;
		strap_llama_last_error(r->h, &le);
		if (le.code != STRAP_OK) {
			fprintf(stderr, "strap-llama: capture: %s\n", le.message);
			rc = 1;
		}
		r->st = strap_llama_get_stats(r->h);
	}
	if (r->res)
		llama_resource_end_session();
	r->rst = llama_resource_get_stats();
	if (r->res) {
		strap_error re;
		llama_resource_last_error(&re);
		if (llama_resource_instrumentation_free() != STRAP_OK || re.code != STRAP_OK) {
			fprintf(stderr, "strap-llama: resource events: %s\n", re.message);
			rc = 1;
		}
	}
	if (r->s && rc == 0) {
		strap_closed cl;
		double t0_close = now();
		int closed = strap_session_close(r->s, &cl);
		r->t_close = now() - t0_close;
		if (closed != STRAP_OK) {
			strap_session_last_error(r->s, &r->err);
			fprintf(stderr, "strap-llama: close: %s\n", r->err.message);
			rc = 1;
		} else {
			remove_states(r->o.output, -1);
		}
	}
	if (r->dump.manifest) {
		fclose(r->dump.manifest);
		if (r->dump.failed) {
			fprintf(stderr, "strap-llama: --dump-dir: a record could not be dumped\n");
			rc = 1;
		}
	}
	return rc;
}

/* The summary on stdout: the tokens (all of them, resumed ones included) and the timings. */
static void print_summary(const struct run *r)
{
	int decoded = r->n_gen - (int)r->start - (r->start == 0 ? 1 : 0);
	printf("{\"prompt_tokens\":[");
	for (int i = 0; i < r->n_prompt; i++)
		printf(i ? ",%d" : "%d", r->all[i]);
	printf("],\"tokens\":[");
	for (int i = 0; i < r->n_gen; i++)
		printf(i ? ",%d" : "%d", r->gen[i]);
	printf("],\"resumed_from\":%llu,\"prompt_s\":%.6f,\"decode_s\":%.6f,\"decode_cpu_s\":%.6f,\"decode_tokens\":%d,"
	       "\"records\":%llu,\"bytes\":%llu,\"duplicates_skipped\":%llu,\"ubatches\":%llu,\"observed\":%ld,"
	       "\"resource_events\":%llu,\"resource_self_s\":%.6f,\"decode_thread_cpu_s\":%.6f,\"close_s\":%.6f}\n",
	       (unsigned long long)r->start, r->t_prompt, r->t_decode, r->c_decode, decoded,
	       (unsigned long long)r->st.records, (unsigned long long)r->st.bytes, (unsigned long long)r->st.duplicates,
	       (unsigned long long)r->st.ubatches, r->obs.seen, (unsigned long long)r->rst.events,
	       (double)r->rst.self_ns * 1e-9, r->tc_decode, r->t_close);
}

static void release(struct run *r)
{
	llama_free(r->ctx);
	if (r->tp)
		r->tp_free(r->tp);
	llama_model_free(r->model);
	strap_llama_free(r->h);
	strap_llama_resources_free(r->res);
	strap_session_free(r->s);
	free(r->all);
	llama_backend_free();
}

int main(int argc, char **argv)
{
	static struct run r; /* static: zeroed, and off the stack */
	int rc;
	if (parse(argc, argv, &r.o)) {
		usage();
		return 2;
	}
	if (!r.o.verbose)
		llama_log_set(quiet_log, NULL);
	llama_backend_init();
	if ((rc = load_model_and_prompt(&r)) || (rc = resource_level_of(&r)))
		return rc;
	context_params(&r);
	if (!r.o.no_capture && (rc = open_capture(&r)))
		return rc;
	if (r.resource_level && (rc = start_resources(&r)))
		return rc;
	if ((rc = make_context(&r)) || (rc = resume_from_checkpoint(&r)))
		return rc;
	rc = finish(&r, generate(&r));
	print_summary(&r);
	release(&r);
	return rc;
}
