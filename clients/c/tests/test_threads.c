/* One session written from several threads at once (strap.h: session calls are serialized by
 * the session's lock): 4 writer threads and the main thread's tokens and flushes, through a ring
 * small enough that writers wait for space. Every record arrives whole: `strapd verify` passes
 * and Python finds each thread's records complete, in its order, each payload as written. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

enum { THREADS = 4, PER_THREAD = 300, FLOATS = 1000 };

static strap_session *sess;

/* payload of record i of thread t: u32 t, u32 i, then bytes (t * 31 + i + k) & 255 */
static void payload(uint8_t *p, uint32_t t, uint32_t i)
{
	memcpy(p, &t, 4);
	memcpy(p + 4, &i, 4);
	for (size_t k = 8; k < FLOATS * 4; k++)
		p[k] = (uint8_t)(t * 31 + i + k);
}

static void *writer(void *arg)
{
	uint32_t t = (uint32_t)(uintptr_t)arg;
	static __thread uint8_t buf[FLOATS * 4];
	char name[32];
	snprintf(name, sizeof name, "thread.%u", t);
	for (uint32_t i = 0; i < PER_THREAD; i++) {
		payload(buf, t, i);
		CHECK_RC(
			sess,
			strap_session_write(sess, name, STRAP_DTYPE_F32, (int64_t[]){FLOATS}, 1, buf, sizeof buf, NULL),
			STRAP_OK);
	}
	return NULL;
}

int main(void)
{
	th_daemon d;
	if (th_start_daemon(&d, NULL) != 0)
		return 1;
	char out[600];
	snprintf(out, sizeof out, "%s/threads.strap", d.dir);
	strap_session_params p = strap_default_session_params();
	p.output_path = out;
	p.ring_size = 4096 + (128 << 10);
	sess = th_open(&d, &p);
	pthread_t th[THREADS];
	for (uintptr_t t = 0; t < THREADS; t++)
		pthread_create(&th[t], NULL, writer, (void *)t);
	for (int k = 0; k < 50; k++) {
		CHECK_RC(sess, strap_session_flush(sess), STRAP_OK);
		CHECK_RC(sess, strap_session_token(sess, k, "t", 1, -1), STRAP_OK);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	strap_closed c;
	CHECK_RC(sess, strap_session_close(sess, &c), STRAP_OK);
	CHECK(c.packets == THREADS * PER_THREAD + 50, "CLOSED packets %llu", (unsigned long long)c.packets);
	strap_session_free(sess);
	th_check_stream(out, NULL);
	char cmd[2000], txt[4096];
	snprintf(cmd, sizeof cmd,
		 "'%s' - '%s' <<'PY' 2>&1\n"
		 "import struct, sys\n"
		 "from llm_instrumentation import open_stream\n"
		 "seen = {}\n"
		 "with open_stream(sys.argv[1]) as r:\n"
		 "    for x in r:\n"
		 "        b = x.raw(); t, i = struct.unpack_from('<II', b)\n"
		 "        assert x.name == f'thread.{t}', (x.name, t)\n"
		 "        assert i == seen.get(t, 0), (t, i, seen.get(t))\n"
		 "        assert b[8:] == bytes((t * 31 + i + k) & 255 for k in range(8, len(b))), (t, i)\n"
		 "        seen[t] = i + 1\n"
		 "assert seen == {t: %d for t in range(%d)}, seen\n"
		 "print('threads ok', seen)\n"
		 "PY",
		 th_env("STRAP_PYTHON"), out, PER_THREAD, THREADS);
	int rc = th_run(cmd, txt, sizeof txt);
	CHECK(rc == 0 && strstr(txt, "threads ok"), "python check: %s", txt);
	th_stop_daemon(&d);
	return th_done("threads");
}
