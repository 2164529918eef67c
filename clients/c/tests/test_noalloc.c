/* The per-record path allocates nothing (STYLE.md 16): libstrap's calls to malloc, calloc and
 * realloc are routed through counters here (the test links with -Wl,--wrap=...), and between
 * open and close — writes of every kind, PART records, reservations committed and aborted, waits
 * for ring space, flushes, tokens — the count stays at zero. Open and close may allocate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int counting;
static long allocs;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
	allocs += counting;
	return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
	allocs += counting;
	return __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
	allocs += counting;
	return __real_realloc(p, n);
}

static int copy(void *ctx, void *dst, size_t offset, size_t len)
{
	memcpy(dst, (const char *)ctx + offset, len);
	return 0;
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600];
	snprintf(out, sizeof out, "%s/noalloc.strap", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (256 << 10); /* small: the loop wraps the ring and waits for space */
	strap_session *s = th_open(&d, &p);
	static float h[512];
	static uint8_t big[100 << 10], q[36 * 4];
	th_fill(h, sizeof h, 1);
	th_fill(big, sizeof big, 2);
	counting = 1;
	for (int f = 0; f < 300; f++) {
		CHECK_RC(s, strap_session_begin_forward(s), STRAP_OK);
		for (int i = 0; i < 24; i++)
			CHECK_RC(s,
				 strap_session_write(s, "model.layers.0.mlp", STRAP_DTYPE_F32, (int64_t[]){1, 1, 512},
						     3, h, sizeof h, NULL),
				 STRAP_OK);
		CHECK_RC(s,
			 strap_session_write(s, "meta", STRAP_DTYPE_F32, (int64_t[]){512}, 1, h, sizeof h,
					     "{\"dim\":1}"),
			 STRAP_OK);
		CHECK_RC(s, strap_session_write_ggml(s, "q", STRAP_GGML_Q4_0, (int64_t[]){64, 4}, 2, q, sizeof q),
			 STRAP_OK);
		if (f % 50 == 0)
			CHECK_RC(s,
				 strap_session_write_with(s, "big", STRAP_DTYPE_U8, (int64_t[]){sizeof big}, 1,
							  sizeof big, NULL, copy, big),
				 STRAP_OK);
		/* the asynchronous-copy path: two reservations, committed out of order, one aborted */
		strap_reservation r[3];
		for (int i = 0; i < 3; i++)
			CHECK_RC(s,
				 strap_session_reserve(s, "async", STRAP_DTYPE_F32, (int64_t[]){512}, 1, sizeof h, NULL,
						       &r[i]),
				 STRAP_OK);
		CHECK_RC(s, strap_session_abort(s, &r[2]), STRAP_OK);
		memcpy(r[1].data, h, sizeof h);
		CHECK_RC(s, strap_session_commit(s, &r[1]), STRAP_OK);
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		memcpy(r[0].data, h, sizeof h);
		CHECK_RC(s, strap_session_commit(s, &r[0]), STRAP_OK);
		CHECK_RC(s, strap_session_flush(s), STRAP_OK);
		CHECK_RC(s, strap_session_token(s, f, " x", 2, -1), STRAP_OK);
	}
	counting = 0;
	CHECK(allocs == 0, "%ld allocations on the record path", allocs);
	CHECK_RC(s, strap_session_close(s, NULL), STRAP_OK);
	strap_session_free(s);
	th_check_stream(out, NULL);
	th_stop_daemon(&d);
	return th_done("noalloc");
}
