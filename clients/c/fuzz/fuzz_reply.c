/* libFuzzer target: the decoder of every datagram the daemon sends (sp_decode_reply), the one
 * parser in libstrap of bytes from another process, and the JSON lookups it drives. Seeds:
 * every file of testdata/protocol and clients/c/fuzz/corpus. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

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
	/* the same bytes as a checkpoint file body */
	if (sj_validate((const char *)data, size, why, sizeof why)) {
		sj_val doc = {(const char *)data, size}, v;
		char s[32];
		uint64_t u;
		while (doc.n && *doc.p != '{' && *doc.p != '[')
			doc.p++, doc.n--;
		if (sj_get(doc, "fingerprint", &v))
			sj_str(v, s, sizeof s, NULL);
		if (sj_get(doc, "stream_offset", &v))
			sj_u64(v, &u);
	}
	return 0;
}
