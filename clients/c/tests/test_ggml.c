/* ggml tensors through a real strapd: f32, f16, bf16 and i32 written by ggml type map to their
 * strap dtype with ne reversed; quantized types (q4_0, q8_0, q6_K) go as raw blocks — dtype
 * uint8, shape [ne[n-1], ..., ne[1], row bytes], meta {"ggml_type","ggml_ne"} (STREAM_FORMAT.md
 * 4.1) — read back bit for bit by Python, verified and inspected by strapd. */
#include <stdio.h>
#include <string.h>

#include "harness.h"

int main(void)
{
	CHECK(strap_ggml_row_size(STRAP_GGML_Q4_0, 64) == 36 && strap_ggml_row_size(STRAP_GGML_Q6_K, 512) == 420 &&
		      strap_ggml_row_size(STRAP_GGML_Q4_0, 33) == 0 && strap_ggml_row_size(31, 32) == 0 &&
		      strap_ggml_row_size(STRAP_GGML_F32, 7) == 28,
	      "row sizes");
	CHECK(strcmp(strap_ggml_type_name(STRAP_GGML_Q4_K), "q4_K") == 0 && strap_ggml_type_name(4) == NULL, "names");
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600];
	snprintf(out, sizeof out, "%s/ggml.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	strap_session *s = th_open(&d, &p);
	static uint8_t buf[1 << 16];
	struct {
		const char *name;
		int type, n_dims;
		int64_t ne[4];
		const char *dtype;
		int quant;
	} cases[] = {
		{"l_out-0", STRAP_GGML_F32, 2, {64, 3}, "float32", 0},
		{"attn_out-0", STRAP_GGML_F16, 3, {8, 4, 2}, "float16", 0},
		{"ffn_out-0", STRAP_GGML_BF16, 1, {16}, "bfloat16", 0},
		{"inp_pos", STRAP_GGML_I32, 1, {5}, "int32", 0},
		{"blk.0.attn_q.weight", STRAP_GGML_Q4_0, 2, {64, 3}, "uint8", 1},
		{"blk.0.ffn_down.weight", STRAP_GGML_Q8_0, 3, {32, 2, 2}, "uint8", 1},
		{"output.weight", STRAP_GGML_Q6_K, 2, {256, 2}, "uint8", 1},
	};
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		size_t rows = 1;
		for (int k = 1; k < cases[i].n_dims; k++)
			rows *= (size_t)cases[i].ne[k];
		size_t row = strap_ggml_row_size(cases[i].type, cases[i].ne[0]), n = rows * row;
		th_fill(buf, n, i + 7);
		CHECK_RC(
			s,
			strap_session_write_ggml(s, cases[i].name, cases[i].type, cases[i].ne, cases[i].n_dims, buf, n),
			STRAP_OK);
		int64_t shape[4];
		for (int k = 0; k < cases[i].n_dims; k++)
			shape[k] = cases[i].ne[cases[i].n_dims - 1 - k];
		char meta[200] = "{}";
		if (cases[i].quant) {
			shape[cases[i].n_dims - 1] = (int64_t)row;
			int m = snprintf(meta, sizeof meta, "{\"ggml_type\":\"%s\",\"ggml_ne\":[",
					 strap_ggml_type_name(cases[i].type));
			for (int k = 0; k < cases[i].n_dims; k++)
				m += snprintf(meta + m, sizeof meta - (size_t)m, "%s%lld", k ? "," : "",
					      (long long)cases[i].ne[k]);
			snprintf(meta + m, sizeof meta - (size_t)m, "]}");
		}
		th_expect_tensor(&x, cases[i].name, cases[i].dtype, shape, cases[i].n_dims, 0, 0, meta, buf, n, 1);
	}
	/* a size that does not match ne is refused */
	CHECK_RC(s, strap_session_write_ggml(s, "bad", STRAP_GGML_Q4_0, (int64_t[]){64, 3}, 2, buf, 100),
		 STRAP_E_INVALID);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);
	/* Python's reader names the ggml type and dequantizes nothing: Tensor.ggml */
	char cmd[2000], txt[4096];
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys; from llm_instrumentation import open_stream; "
		 "print([(t.name, t.ggml) for t in open_stream(sys.argv[1]) if t.ggml])' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	int rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "('blk.0.attn_q.weight', ('q4_0', (64, 3)))") &&
		      strstr(txt, "('output.weight', ('q6_K', (256, 2)))") && !strstr(txt, "l_out"),
	      "Tensor.ggml: %s", txt);
	/* strapd inspect names the ggml type of the raw-block modules */
	snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", th_env("STRAPD_BIN"), out);
	rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "uint8 (ggml q4_0)") && strstr(txt, "uint8 (ggml q6_K)"), "inspect: %s", txt);
	th_stop_daemon(&d);
	return th_done("ggml");
}
