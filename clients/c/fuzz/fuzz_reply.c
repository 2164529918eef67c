/* libFuzzer target: the decoder of every datagram the daemon sends (sp_decode_reply), the one
 * parser of bytes from another process in libstrap and in the Python client (whose _speedups
 * extension compiles common/strap_wire.c), and the JSON lookups it drives; the same
 * bytes go to the stream lock's reader of /proc/locks (stl_holder_in,
 * common/strap_streamlock.h). The checkpoint file's parser has its own target
 * (fuzz_checkpoint.c). Seeds: every file of
 * testdata/protocol, testdata/checkpoint and clients/c/fuzz/corpus. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "session.h"
#include "strap_streamlock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[256];
	sp_reply r;
	if (sp_decode_reply(data, size, &r, why, sizeof why) == STRAP_OK) {
		/* what the client does next with a decoded body */
		if (r.type == SP_STATUS_REPLY) {
			sj_val body = {r.body, r.body_len}, v, e;
			if (sj_get(body, "sessions", &v) && sj_kind(v) == '[') {
				const char *it = v.p;
				while (sj_array_next(v, &it, &e))
					(void)sj_kind(e);
			}
		}
	} else if (strlen(why) >= sizeof why) {
		__builtin_trap();
	}
	/* the same bytes as /proc/locks, asked for the seed's file (08:01:99) and for one its
	 * first bytes name: a holder is a positive pid or none */
	unsigned maj = size > 0 ? data[0] : 8, min = size > 1 ? data[1] : 1;
	uint64_t ino = size > 2 ? data[2] : 99;
	pid_t a = stl_holder_in((const char *)data, size, 8, 1, 99),
	      b = stl_holder_in((const char *)data, size, maj, min, ino);
	if (a < 0 || b < 0)
		__builtin_trap();
	return 0;
}
