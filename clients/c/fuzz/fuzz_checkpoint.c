/* libFuzzer target: the checkpoint file's parser (sck_parse, common/strap_checkpoint.c), which
 * libstrap and the Python client both read checkpoints with, and its writer. What the parser
 * accepts keeps the format's rules (docs/CHECKPOINTS.md 3), and written again (sck_encode,
 * with its other members and 1.3.1's tokens list) it parses to the same facts. Seeds: every
 * file of testdata/checkpoint and clients/c/fuzz/corpus. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strap_checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_MEMBERS = 256 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static sck_checkpoint c, again;
	static sck_member extra[MAX_MEMBERS], tokens[MAX_MEMBERS];
	static char keys[MAX_MEMBERS][256];
	char why[256], created[256];
	if (sck_parse((const char *)data, size, &c, why, sizeof why) != 0) {
		if (strlen(why) >= sizeof why - 1 || !why[0])
			__builtin_trap();
		return 0;
	}
	if (c.stream_offset == 0 || c.last_seq < c.packets || c.drops > c.packets || c.token_count > c.packets ||
	    (c.has_token_log && c.log_tokens != c.token_count) || c.last_packet_crc > UINT32_MAX)
		__builtin_trap();
	size_t nextra = 0, ntokens = 0;
	sj_val doc = {(const char *)data, size}, k, v;
	while (doc.n && *doc.p != '{')
		doc.p++, doc.n--;
	const char *it = doc.p;
	while (sj_object_next(doc, &it, &k, &v)) {
		bool full;
		if (nextra == MAX_MEMBERS || !sj_str(k, keys[nextra], sizeof keys[nextra], &full) || !full ||
		    strlen(keys[nextra]) != strnlen(keys[nextra], sizeof keys[nextra]))
			return 0; /* too many or too long for this check */
		size_t kl = strlen(keys[nextra]);
		if (sck_format_key(keys[nextra], kl))
			continue;
		for (size_t i = 0; i < nextra; i++)
			if (extra[i].key_len == kl && memcmp(extra[i].key, keys[nextra], kl) == 0)
				return 0; /* a repeated key: the last counts, as the clients keep it */
		extra[nextra] = (sck_member){keys[nextra], kl, v.p, v.n};
		nextra++;
	}
	if (c.tokens.p) {
		it = c.tokens.p;
		while (sj_array_next(c.tokens, &it, &v)) {
			if (ntokens == MAX_MEMBERS)
				return 0;
			tokens[ntokens++] = (sck_member){NULL, 0, v.p, v.n};
		}
	}
	bool full = true;
	if (c.created.p && (!sj_str(c.created, created, sizeof created, &full) || !full))
		return 0;
	if (!c.created.p)
		created[0] = 0;
	if (strlen(created) != strnlen(created, sizeof created))
		return 0;
	size_t cap = 2 * size + 4096;
	char *out = malloc(cap);
	if (!out)
		return 0;
	sw_buf b = {out, 0, cap, false};
	if (sck_encode(&b, &c, created, extra, nextra, c.tokens.p ? tokens : NULL, ntokens, why, sizeof why) != 0 ||
	    sck_parse(out, b.n, &again, why, sizeof why) != 0)
		__builtin_trap();
	if (strcmp(again.stream, c.stream) != 0 || strcmp(again.fingerprint, c.fingerprint) != 0 ||
	    again.stream_offset != c.stream_offset || again.packets != c.packets || again.drops != c.drops ||
	    again.last_seq != c.last_seq || again.last_packet_offset != c.last_packet_offset ||
	    again.last_packet_crc != c.last_packet_crc || again.token_count != c.token_count ||
	    again.forward_count != c.forward_count || again.has_token_log != c.has_token_log ||
	    again.log_tokens != c.log_tokens || again.log_bytes != c.log_bytes || again.log_crc32c != c.log_crc32c ||
	    again.listed_tokens != c.listed_tokens)
		__builtin_trap();
	free(out);
	return 0;
}
