/* strap_session_write_with / _write_ggml_with through a real strapd: the payload produced by
 * the caller's copy function straight into the ring (what a ggml eval callback does for a tensor
 * in device memory or not contiguous): a transposed matrix gathered element by element, a tensor
 * of several PART records (the function called once per part, in order, covering every byte), a
 * quantized ggml tensor; a function failing before anything was committed writes nothing and the
 * session goes on; one failing after a first PART ends the session, and the stream still reads
 * (the cut tensor is not returned). */
#include <stdio.h>
#include <string.h>

#include "harness.h"

typedef struct transposed {
	const float *src; /* rows x cols, row-major; written as cols x rows */
	size_t rows, cols;
	int calls;
} transposed;

static int gather(void *ctx, void *dst, size_t offset, size_t len)
{
	transposed *t = ctx;
	t->calls++;
	float *d = dst;
	for (size_t k = 0; k < len / 4; k++) {
		size_t i = offset / 4 + k; /* element of the cols x rows result */
		d[k] = t->src[(i % t->rows) * t->cols + i / t->rows];
	}
	return 0;
}

typedef struct linear {
	const uint8_t *src;
	size_t next; /* the offset the next call must have */
	int calls, fail_at;
} linear;

static int copy_linear(void *ctx, void *dst, size_t offset, size_t len)
{
	linear *l = ctx;
	if (offset != l->next)
		return -100; /* out of order or overlapping: the test fails on it */
	if (l->calls++ == l->fail_at)
		return 7;
	memcpy(dst, l->src + offset, len);
	l->next = offset + len;
	return 0;
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600], exp_dir[600];
	snprintf(out, sizeof out, "%s/with.strap", d.dir);
	snprintf(exp_dir, sizeof exp_dir, "%s/expect", d.dir);
	th_expect x;
	th_expect_open(&x, exp_dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10);
	strap_session *s = th_open(&d, &p);
	CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);

	static float m[48 * 32], mt[32 * 48];
	th_fill(m, sizeof m, 3);
	for (size_t i = 0; i < 48; i++)
		for (size_t j = 0; j < 32; j++)
			mt[j * 48 + i] = m[i * 32 + j];
	transposed t = {m, 48, 32, 0};
	CHECK_RC(s,
		 strap_session_write_with(s, "kq.T", STRAP_DTYPE_F32, (int64_t[]){32, 48}, 2, sizeof m, NULL, gather,
					  &t),
		 STRAP_OK);
	CHECK(t.calls == 1, "gather called %d times", t.calls);
	th_expect_tensor(&x, "kq.T", "float32", (int64_t[]){32, 48}, 2, 0, 0, NULL, mt, sizeof mt, 1);

	static uint8_t big[200 << 10];
	th_fill(big, sizeof big, 4);
	linear l = {big, 0, 0, -1};
	CHECK_RC(s,
		 strap_session_write_with(s, "big", STRAP_DTYPE_U8, (int64_t[]){sizeof big}, 1, sizeof big, NULL,
					  copy_linear, &l),
		 STRAP_OK);
	/* 64 KiB records of a 128-byte header area: 65408 payload bytes each */
	CHECK(l.calls == 4 && l.next == sizeof big, "parts: %d calls, covered %zu", l.calls, l.next);
	th_expect_tensor(&x, "big", "uint8", (int64_t[]){sizeof big}, 1, 0, 0, NULL, big, sizeof big, 4);

	static uint8_t q[2 * 36];
	th_fill(q, sizeof q, 5);
	linear lq = {q, 0, 0, -1};
	CHECK_RC(s,
		 strap_session_write_ggml_with(s, "blk.1.q", STRAP_GGML_Q4_0, (int64_t[]){64, 2}, 2, sizeof q,
					       copy_linear, &lq),
		 STRAP_OK);
	th_expect_tensor(&x, "blk.1.q", "uint8", (int64_t[]){2, 36}, 2, 0, 0,
			 "{\"ggml_type\":\"q4_0\",\"ggml_ne\":[64,2]}", q, sizeof q, 1);

	/* failing before anything is committed: nothing written, the session goes on */
	linear bad = {big, 0, 0, 0};
	CHECK_RC(s,
		 strap_session_write_with(s, "refused", STRAP_DTYPE_U8, (int64_t[]){100}, 1, 100, NULL, copy_linear,
					  &bad),
		 STRAP_E_INVALID);
	CHECK_RC(s, strap_session_write(s, "after", STRAP_DTYPE_U8, (int64_t[]){10}, 1, big, 10, NULL), STRAP_OK);
	th_expect_tensor(&x, "after", "uint8", (int64_t[]){10}, 1, 0, 0, NULL, big, 10, 1);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);
	th_expect_close(&x);
	th_check_stream(out, &x);

	/* failing after a first PART: the session ends; what was published before still reads */
	snprintf(out, sizeof out, "%s/cut.strap", d.dir);
	p.output_path = out;
	s = th_open(&d, &p);
	CHECK_RC(s, strap_session_write(s, "whole", STRAP_DTYPE_U8, (int64_t[]){10}, 1, big, 10, NULL), STRAP_OK);
	linear cut = {big, 0, 0, 2};
	CHECK_RC(s,
		 strap_session_write_with(s, "cut", STRAP_DTYPE_U8, (int64_t[]){sizeof big}, 1, sizeof big, NULL,
					  copy_linear, &cut),
		 STRAP_E_SYSTEM);
	strap_error e;
	strap_session_last_error(s, &e);
	CHECK(e.fatal && strstr(e.message, "the session ends"), "cut: %s", e.message);
	CHECK_RC(s, strap_session_flush(s), STRAP_E_STATE);
	strap_session_free(s); /* strapd ends the stream: END aborted */
	char cmd[2000], txt[4096];
	snprintf(cmd, sizeof cmd,
		 "'%s' -c 'import sys,time; from llm_instrumentation import open_stream\n"
		 "for _ in range(100):\n"
		 "    r = open_stream(sys.argv[1])\n"
		 "    if r.end() is not None: break\n"
		 "    r.close(); time.sleep(0.05)\n"
		 "print([t.name for t in r], r.end().meta[\"status\"])' '%s' 2>&1",
		 th_env("STRAP_PYTHON"), out);
	int rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "['whole'] aborted"), "cut stream: %s", txt);
	th_stop_daemon(&d);
	return th_done("write_with");
}
