/* A capture through a real strapd: f32, f16, bf16 and i32 tensors (and f64, a scalar, a record
 * with meta, an empty tensor) over several forward passes with tokens, read back bit for bit by
 * Python's open_stream and checked by `strapd verify` / `strapd inspect`; the kernel trace file
 * strapd writes beside it; STATUS during the session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

int main(void)
{
	th_daemon d;
	const char *extra[] = {"--no-bpf", NULL}; /* /proc collectors: a trace without root */
	if (th_start_daemon(&d, extra) != 0)
		return 1;
	char out[600], exp_dir[600];
	snprintf(out, sizeof out, "%s/capture.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);

	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.trace = 1;
	p.ring_size = 4096 + (1 << 20);
	p.metadata_json = "{\"model_class\":\"TinyLlama\",\"capture_config\":{\"layers\":[0,1]}}";
	strap_session *s = th_open(&d, &p);

	static uint8_t buf[3][64 << 10];
	struct {
		const char *name, *dname;
		int dtype, ndim;
		int64_t shape[3];
		size_t esize;
	} mods[] = {
		{"model.layers.0.mlp", "float32", STRAP_DTYPE_F32, 3, {1, 4, 64}, 4},
		{"model.layers.0.self_attn", "float16", STRAP_DTYPE_F16, 3, {1, 4, 64}, 2},
		{"model.layers.1", "bfloat16", STRAP_DTYPE_BF16, 2, {4, 96}, 2},
		{"model.embed_tokens.ids", "int32", STRAP_DTYPE_I32, 1, {7}, 4},
	};
	uint64_t seed = 1;
	for (int fwd = 0; fwd < 5; fwd++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		for (size_t m = 0; m < sizeof mods / sizeof *mods; m++) {
			size_t n = mods[m].esize;
			for (int i = 0; i < mods[m].ndim; i++)
				n *= (size_t)mods[m].shape[i];
			th_fill(buf[0], n, seed++);
			CHECK_RC(s,
				 strap_session_write(s, mods[m].name, mods[m].dtype, mods[m].shape, mods[m].ndim,
						     buf[0], n, NULL),
				 STRAP_OK);
			th_expect_tensor(&x, mods[m].name, mods[m].dname, mods[m].shape, mods[m].ndim, (uint64_t)fwd,
					 (uint64_t)fwd, NULL, buf[0], n, 1);
		}
		if (fwd == 2) {
			double v = 3.25;
			CHECK_RC(s,
				 strap_session_write(s, "lm_head.temperature", STRAP_DTYPE_F64, NULL, 0, &v, 8, NULL),
				 STRAP_OK);
			th_expect_tensor(&x, "lm_head.temperature", "float64", NULL, 0, 2, 2, NULL, &v, 8, 1);
			int64_t sh[2] = {2, 3};
			const char *meta = "{\"positions\":[0,4,8],\"dim\":1}";
			th_fill(buf[1], 24, 99);
			CHECK_RC(s,
				 strap_session_write(s, "model.layers.1.sampled", STRAP_DTYPE_F32, sh, 2, buf[1], 24,
						     meta),
				 STRAP_OK);
			th_expect_tensor(&x, "model.layers.1.sampled", "float32", sh, 2, 2, 2, meta, buf[1], 24, 1);
			int64_t empty[2] = {0, 5};
			CHECK_RC(s, strap_session_write(s, "empty", STRAP_DTYPE_F32, empty, 2, NULL, 0, NULL),
				 STRAP_OK);
			th_expect_tensor(&x, "empty", "float32", empty, 2, 2, 2, NULL, "", 0, 1);
		}
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		char text[32];
		int tl = snprintf(text, sizeof text, fwd == 1 ? "caf\xc3\xa9 \"%d\"\n" : " tok%d", fwd);
		CHECK_RC(s, strap_session_token(s, 1000 + fwd, text, (size_t)tl, -1), STRAP_OK);
		char esc[64];
		snprintf(esc, sizeof esc, fwd == 1 ? "caf\xc3\xa9 \\\"%d\\\"\\n" : " tok%d", fwd);
		th_expect_token(&x, (uint64_t)fwd, 1000 + fwd, esc);
	}
	/* STATUS while the session is live lists it */
	static char status[1 << 16];
	size_t need = 0;
	strap_error se;
	int rc = strap_status(d.socket, status, sizeof status, &need, &se);
	CHECK(rc == STRAP_OK && strstr(status, "\"sessions\"") && strstr(status, "capture.strap"), "status %d: %s %s",
	      rc, se.message, status);
	rc = strap_status(d.socket, status, 8, &need, &se);
	CHECK(rc == STRAP_E_TOO_LARGE && need > 8, "small status buffer: rc %d need %zu", rc, need);

	strap_closed c;
	CHECK_RC(s, strap_session_close(s, &c), STRAP_OK);
	strap_session_stats st = strap_session_get_stats(s);
	CHECK(c.packets == st.records + st.tokens && c.drops == 0 && st.records == 23 && st.tokens == 5,
	      "CLOSED packets %llu, records %llu, tokens %llu", (unsigned long long)c.packets,
	      (unsigned long long)st.records, (unsigned long long)st.tokens);
	/* after close nothing more is accepted */
	CHECK_RC(s, strap_session_write(s, "late", STRAP_DTYPE_F32, NULL, 0, buf[0], 4, NULL), STRAP_E_STATE);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);

	char cmd[2000], txt[1 << 16];
	snprintf(cmd, sizeof cmd, "'%s' inspect --json '%s'", th_env("STRAPD_BIN"), out);
	th_run(cmd, txt, sizeof txt);
	CHECK(strstr(txt, "model.layers.0.self_attn") && strstr(txt, "bfloat16") && strstr(txt, "int32"), "inspect: %s",
	      txt);
	/* the stream header carries the OPEN metadata: the caller's and the library's */
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys; from llm_instrumentation import open_stream; m=open_stream(sys.argv[1]).metadata"
		 "[\"client_metadata\"]; print(m[\"model_class\"], m[\"capture_config\"][\"layers\"], "
		 "m[\"client\"][\"name\"], "
		 "m[\"output_path\"])' '%s'",
		 th_env("STRAP_PYTHON"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "TinyLlama [0, 1] libstrap/0.1.0") && strstr(txt, "/capture.strap"),
	      "metadata: %s", txt);
	/* strapd wrote the kernel trace through the third descriptor */
	char trace[800];
	snprintf(trace, sizeof trace, "%s.trace.jsonl", out);
	struct stat tst;
	CHECK(stat(trace, &tst) == 0 && tst.st_size > 0, "trace file %s is empty or missing", trace);
	th_stop_daemon(&d);
	return th_done("capture");
}
