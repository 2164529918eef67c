/*
 * test_api.c — libstrap_llama's refusals and its attach, against a real model and strapd
 * (run by test_strap_llama.py: test_api MODEL.gguf SOCKET OUTPUT). Exit 0 when every check
 * holds; each failed check is printed.
 */
#include "strap_llama.h"

#include <llama.h>

#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                                               \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			failures++;                                                                                    \
			fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                                     \
			fprintf(stderr, __VA_ARGS__);                                                                  \
			fputc('\n', stderr);                                                                           \
		}                                                                                                      \
	} while (0)

static bool other_cb(struct ggml_tensor *t, bool ask, void *ud)
{
	(void)t;
	(void)ask;
	(void)ud;
	return false;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
	(void)level;
	(void)text;
	(void)ud;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: test_api MODEL.gguf SOCKET OUTPUT\n");
		return 2;
	}
	llama_log_set(quiet, NULL);
	llama_backend_init();
	struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
	CHECK(model != NULL, "model %s", argv[1]);
	if (!model)
		return 1;
	int n_layer = llama_model_n_layer(model);

	strap_session_params sp = strap_default_session_params();
	sp.output_path = argv[3];
	sp.socket_path = argv[2];
	sp.autostart = 0;
	strap_session *s;
	strap_error err;
	CHECK(strap_session_open(&sp, &s, &err) == STRAP_OK, "open: %s", err.message);

	/* new(): names and parameters */
	strap_llama *h = NULL;
	strap_llama_params lp = strap_llama_default_params();
	char past[32];
	snprintf(past, sizeof past, "l_out-%d", n_layer);
	const char *bad_layer[] = {past};
	lp.tensors = bad_layer;
	lp.n_tensors = 1;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_E_INVALID && !h &&
		      strstr(err.message, "past the model"),
	      "%s", err.message);
	const char *twice[] = {"l_out", "l_out-1"};
	lp.tensors = twice;
	lp.n_tensors = 2;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_E_INVALID && strstr(err.message, "given twice"), "%s",
	      err.message);
	const char *empty[] = {""};
	lp.tensors = empty;
	lp.n_tensors = 1;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_E_INVALID, "%s", err.message);
	lp.tensors = NULL; /* default: l_out */
	lp.n_tensors = 0;
	lp.n_batch_max = 0;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_E_INVALID, "%s", err.message);
	lp.n_batch_max = 8;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_OK && h, "%s", err.message);

	/* attach(): refuses several KV streams; keeps a callback already set */
	struct llama_context_params cp = llama_context_default_params();
	cp.n_seq_max = 2;
	cp.kv_unified = false;
	CHECK(strap_llama_attach(h, &cp, &err) == STRAP_E_INVALID && cp.cb_eval == NULL &&
		      strstr(err.message, "kv_unified"),
	      "%s", err.message);
	cp.n_seq_max = 1;
	cp.cb_eval = other_cb;
	cp.cb_eval_user_data = &failures;
	CHECK(strap_llama_attach(h, &cp, &err) == STRAP_OK, "%s", err.message);
	CHECK(cp.cb_eval == strap_llama_eval_callback && cp.cb_eval_user_data == h, "attach did not install");
	CHECK(strap_llama_attach(h, &cp, &err) == STRAP_OK, "a second attach");
	cp.n_ctx = 64;
	cp.n_batch = 16;
	cp.n_ubatch = 16;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	CHECK(ctx != NULL, "context");

	/* begin_decode: a batch over n_batch_max is refused (and the handle keeps the error) */
	struct llama_batch b = llama_batch_init(16, 0, 1);
	b.n_tokens = 9;
	for (int i = 0; i < 9; i++) {
		b.token[i] = 1 + i;
		b.pos[i] = i;
		b.n_seq_id[i] = 1;
		b.seq_id[i][0] = 0;
		b.logits[i] = i == 8;
	}
	CHECK(strap_llama_begin_decode(h, &b, 0) == STRAP_E_INVALID, "9 rows over n_batch_max 8");
	strap_error le;
	strap_llama_last_error(h, &le);
	CHECK(le.code == STRAP_E_INVALID && strstr(le.message, "n_batch_max"), "%s", le.message);
	CHECK(strap_llama_end_decode(h) == STRAP_E_INVALID, "the first error stays");
	strap_llama_free(h);

	/* a decode the handle was not told about: an error, not a silent gap */
	lp.n_batch_max = 16;
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_OK, "%s", err.message);
	llama_free(ctx);
	cp = llama_context_default_params();
	cp.n_ctx = 64;
	cp.n_batch = 16;
	cp.n_ubatch = 16;
	CHECK(strap_llama_attach(h, &cp, &err) == STRAP_OK, "%s", err.message);
	ctx = llama_init_from_model(model, cp);
	b.n_tokens = 4;
	CHECK(llama_decode(ctx, b) == 0, "decode");
	strap_llama_last_error(h, &le);
	CHECK(le.code == STRAP_E_INVALID && strstr(le.message, "without strap_llama_begin_decode"), "%s", le.message);
	strap_llama_free(h);

	/* and a decode it was told about writes one record per layer */
	CHECK(strap_llama_new(s, model, &lp, &h, &err) == STRAP_OK, "%s", err.message);
	llama_free(ctx);
	cp = llama_context_default_params();
	cp.n_ctx = 64;
	cp.n_batch = 16;
	cp.n_ubatch = 16;
	CHECK(strap_llama_attach(h, &cp, &err) == STRAP_OK, "%s", err.message);
	ctx = llama_init_from_model(model, cp);
	CHECK(strap_llama_begin_decode(h, &b, 0) == STRAP_OK, "begin");
	CHECK(llama_decode(ctx, b) == 0, "decode");
	CHECK(strap_llama_end_decode(h) == STRAP_OK, "end");
	strap_llama_stats st = strap_llama_get_stats(h);
	CHECK(st.records == (uint64_t)n_layer && st.ubatches == 1, "%llu records, %llu ubatches",
	      (unsigned long long)st.records, (unsigned long long)st.ubatches);

	llama_batch_free(b);
	llama_free(ctx);
	strap_llama_free(h);
	CHECK(strap_session_close(s, NULL) == STRAP_OK, "close");
	strap_session_free(s);
	llama_model_free(model);
	llama_backend_free();
	if (failures)
		fprintf(stderr, "%d check(s) failed\n", failures);
	return failures ? 1 : 0;
}
