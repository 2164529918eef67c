/* The C encoder against the golden wire files Go and Python share (testdata/protocol,
 * testdata/ring): every client message, the ring header, PAD and TENSOR records, byte for
 * byte; and the decoder reads every reply vector to the values it was written from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

static char buf[SP_MAX_MESSAGE + 1];

static size_t load(const char *dir, const char *name, uint8_t *out, size_t cap)
{
	char path[600];
	snprintf(path, sizeof path, "%s/testdata/%s/%s", th_env("STRAP_REPO"), dir, name);
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "missing golden file %s\n", path);
		exit(1);
	}
	size_t n = fread(out, 1, cap, f);
	fclose(f);
	return n;
}

static void same(const char *dir, const char *name, const void *got, size_t n)
{
	static uint8_t want[1 << 17];
	size_t wn = load(dir, name, want, sizeof want);
	CHECK(wn == n && memcmp(want, got, n) == 0, "%s/%s: %zu bytes encoded, golden has %zu%s", dir, name, n, wn,
	      wn == n ? " (contents differ)" : "");
}

static sw_buf fresh(void)
{
	sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
	return b;
}

static void messages(void)
{
	sw_buf b = fresh();
	sp_enc_hello(&b, "llm_instrumentation/0.1.0", 1234);
	same("protocol", "hello.bin", b.p, b.n);

	static const char meta[] = "{\"model_class\":\"LlamaForCausalLM\",\"output_path\":\"/abs/capture.strap\"}";
	sp_open_body o = {.ring_size = 67108864,
			  .codec = "zstd",
			  .has_codec_level = 1,
			  .codec_level = 3,
			  .policy = "block",
			  .block_size = 1048576,
			  .metadata = meta,
			  .metadata_len = strlen(meta)};
	b = fresh();
	sp_enc_open(&b, &o);
	same("protocol", "open.bin", b.p, b.n);

	sp_open_body r = {.ring_size = 67108864,
			  .codec = "lz4",
			  .policy = "block",
			  .has_resume = 1,
			  .append_at = 40960,
			  .resume_last_seq = 5,
			  .resume_last_crc = 3735928559u,
			  .resume_packets = 5};
	b = fresh();
	sp_enc_open(&b, &r);
	same("protocol", "open_resume.bin", b.p, b.n);

	sp_open_body res = {.ring_size = 67108864, .codec = "none", .policy = "block", .resources = 1};
	b = fresh();
	sp_enc_open(&b, &res);
	same("protocol", "open_resources.bin", b.p, b.n);

	/* the OPEN the Python framework builds (test_golden_wire.py::test_open_as_the_client_builds_it) */
	sp_open_body q = {.ring_size = 1 << 26,
			  .codec = "quant",
			  .has_codec_level = 1,
			  .codec_level = 0,
			  .policy = "drop",
			  .block_size = 1 << 20,
			  .lossy_mode = "rel",
			  .has_lossy_value = 1,
			  .lossy_value = 0.001,
			  .memory_hint = 1 << 26,
			  .metadata = "{\"a\":1}",
			  .metadata_len = 7};
	b = fresh();
	sp_enc_open(&b, &q);
	static const char qwant[] = "{\"ring_size\":67108864,\"codec\":\"quant\",\"codec_level\":0,\"policy\":\"drop\","
				    "\"block_size\":1048576,\"lossy\":{\"mode\":\"rel\",\"value\":0.001},"
				    "\"memory_hint\":67108864,\"metadata\":{\"a\":1}}";
	CHECK(b.n == SP_HEADER + strlen(qwant) && memcmp(b.p + SP_HEADER, qwant, strlen(qwant)) == 0,
	      "lossy OPEN: %.*s", (int)(b.n - SP_HEADER), b.p + SP_HEADER);

	b = fresh();
	sp_enc_publish(&b, 4096, 3);
	same("protocol", "publish.bin", b.p, b.n);
	b = fresh();
	sp_enc_drop(&b, 4, "model.layers.3.mlp", 18, 10, 2, 8192, "ring_full");
	same("protocol", "drop.bin", b.p, b.n);
	b = fresh();
	sp_enc_close(&b, 4, 4096, 1);
	same("protocol", "close.bin", b.p, b.n);
	b = fresh();
	sp_enc_status(&b);
	same("protocol", "status.bin", b.p, b.n);
	b = fresh();
	sp_enc_token(&b, 5, 2, 1234, " the", 4, 1, 8, 0, 0);
	same("protocol", "token.bin", b.p, b.n);
	b = fresh();
	sp_enc_token(&b, 9, 3, 42, "!", 1, 0, 0, 1, 8192);
	same("protocol", "token_head.bin", b.p, b.n);
	b = fresh();
	sp_enc_checkpoint(&b, 5);
	same("protocol", "checkpoint.bin", b.p, b.n);

	static const char e1[] = "{\"event\":\"compute_execution\",\"step\":3,\"flops\":65536,\"duration_us\":12.5}";
	static const char e2[] = "{\"event\":\"kv_cache_update\",\"step\":3,\"cache_bytes\":8192}\n";
	const char *evs[] = {e1, e2};
	size_t lens[] = {strlen(e1), strlen(e2)}, next = 0;
	char why[200];
	b = fresh();
	CHECK(sp_pack_resources(&b, evs, lens, 2, &next, why, sizeof why) == STRAP_OK && next == 2, "pack: %s", why);
	same("protocol", "resources.bin", b.p, b.n);
}

static void replies(void)
{
	static uint8_t d[4096];
	char why[300];
	sp_reply r;
	size_t n = load("protocol", "welcome.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_WELCOME &&
		      r.u.welcome.protocol == 1 && r.u.welcome.pid == 42 && r.u.welcome.max_message == 65536 &&
		      r.u.welcome.max_ring_size == 1u << 30 && strcmp(r.u.welcome.daemon, "strapd 0.1.0") == 0,
	      "welcome: %s", why);
	n = load("protocol", "opened.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_OPENED &&
		      r.u.opened.session == 7 && r.u.opened.block_size == 1048576,
	      "opened: %s", why);
	CHECK(!r.u.opened.published_cursor, "opened without published_cursor");
	/* a daemon that takes the published cursor (PROTOCOL.md 1.4) */
	n = load("protocol", "opened_cursor.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_OPENED &&
		      r.u.opened.session == 7 && r.u.opened.block_size == 1048576 && r.u.opened.published_cursor,
	      "opened_cursor: %s", why);
	n = load("protocol", "release.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_RELEASE &&
		      r.u.release.tail == 2048,
	      "release: %s", why);
	n = load("protocol", "closed.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_CLOSED &&
		      r.u.closed.packets == 3 && r.u.closed.drops == 1 && r.u.closed.bytes_in == 12288 &&
		      r.u.closed.bytes_out == 12288 && r.u.closed.file_bytes == 13000,
	      "closed: %s", why);
	n = load("protocol", "checkpointed.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_CHECKPOINTED &&
		      r.u.checkpointed.seq == 5 && r.u.checkpointed.offset == 40960 && r.u.checkpointed.packets == 5 &&
		      r.u.checkpointed.drops == 0 && r.u.checkpointed.tokens == 2 &&
		      r.u.checkpointed.last_offset == 40800 && r.u.checkpointed.last_crc == 3735928559u,
	      "checkpointed: %s", why);
	n = load("protocol", "error_protocol_version.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_ERROR &&
		      strcmp(r.u.error.code, "protocol_version") == 0 && r.u.error.fatal == 1 &&
		      strcmp(r.u.error.message, "client speaks protocol 2, strapd speaks protocol 1") == 0,
	      "error: %s", why);
	CHECK(!r.u.error.has_fits_ring_size, "an ERROR without fits_ring_size decoded one");
	/* the version-mismatch ERROR must be readable whatever its header version says */
	d[4] = 2;
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_ERROR, "v2 error: %s", why);
	/* memory_budget: the room left, which open.c retries a default ring with */
	n = load("protocol", "error_memory_budget.bin", d, sizeof d);
	CHECK(sp_decode_reply(d, n, &r, why, sizeof why) == STRAP_OK && r.type == SP_ERROR &&
		      strcmp(r.u.error.code, "memory_budget") == 0 && r.u.error.has_fits_ring_size &&
		      r.u.error.fits_ring_size == 132116480u && strstr(r.u.error.message, "(--memory-limit)"),
	      "memory_budget error: %s", why);
}

static void ring(void)
{
	static uint8_t rec[8192];
	sr_encode_ring_header(rec, 8256);
	same("ring", "header_8256.bin", rec, 4096);

	memset(rec, 0, 128);
	sr_encode_pad(rec, 128);
	same("ring", "pad_128.bin", rec, 128);

	memset(rec, 0xAA, 256); /* every byte of the record must be written */
	sr_encode_token_record(rec, 9, 4, -7, 36, "h\xc3\xa9llo", 6);
	same("ring", "token_seq9.bin", rec, (size_t)sr_token_record_len(6));

	struct {
		const char *file, *name, *meta;
		int dtype, ndim;
		uint64_t shape[2], seq, step, forward;
		uint8_t payload[64];
		size_t plen;
		int part;
		uint64_t part_offset, tensor_len;
	} cases[] = {
		{"record_f32_2x3.bin", "model.layers.0.mlp", "", 1, 2, {2, 3}, 1, 5, 2, {0}, 24, 0, 0, 0},
		{"record_bf16_meta.bin",
		 "model.layers.3.self_attn",
		 "{\"positions\":[0,4,8],\"dim\":1}",
		 3,
		 2,
		 {1, 4},
		 7,
		 0,
		 0,
		 {0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40},
		 8,
		 0,
		 0,
		 0},
		{"record_part.bin", "lm_head", "", 6, 2, {4, 16}, 12, 9, 3, {0}, 16, 1, 32, 64},
		{"record_scalar_i64.bin", "x", "", 9, 0, {0}, 3, 0, 0, {42}, 8, 0, 0, 0},
	};
	for (int i = 0; i < 6; i++) { /* f32 payload: u32 LE 0x3f800000 + i */
		uint32_t v = 0x3f800000u + (uint32_t)i;
		memcpy(cases[0].payload + 4 * i, &v, 4);
	}
	for (int i = 0; i < 16; i++)
		cases[2].payload[i] = (uint8_t)i;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		size_t ml = strlen(cases[c].meta), nl = strlen(cases[c].name);
		uint64_t hdr = sr_header_area(cases[c].ndim, nl, ml), len = sp_align64(hdr + cases[c].plen);
		memset(rec, 0xAA, sizeof rec); /* every byte of the record must be written */
		sr_encode_record_header(rec, cases[c].dtype, cases[c].shape, cases[c].ndim, cases[c].seq, len,
					cases[c].step, cases[c].forward, cases[c].plen, cases[c].name, nl,
					cases[c].meta, ml, cases[c].part_offset,
					cases[c].part ? cases[c].tensor_len : cases[c].plen, cases[c].part);
		memcpy(rec + hdr, cases[c].payload, cases[c].plen);
		memset(rec + hdr + cases[c].plen, 0, len - hdr - cases[c].plen);
		same("ring", cases[c].file, rec, len);
	}

	/* The FP8 record: its header as the encoder writes it with flag FP8, its payload's layout
	 * (the values are strapd's encoder's; Python's client reproduces them). */
	uint8_t want[512];
	size_t got = load("ring", "record_fp8_bf16_2x4.bin", want, sizeof want);
	const uint64_t shape[2] = {2, 4};
	const char *name = "model.layers.1.mlp";
	uint64_t parts = sr_fp8_parts(8, 4, 524288), plen = sr_fp8_payload_len(8, parts);
	uint64_t hdr = sr_header_area(2, strlen(name), 0), len = sp_align64(hdr + plen);
	CHECK(parts == 2 && plen == 96 && got == len, "fp8: %llu parts, payload_len %llu, record %zu of %llu bytes",
	      (unsigned long long)parts, (unsigned long long)plen, got, (unsigned long long)len);
	CHECK(sr_fp8_parts(8, 4, 3) == 4 && sr_fp8_parts(10, 10, 4) == 3 && sr_fp8_parts(0, 4, 4) == 0, "sr_fp8_parts");
	memset(rec, 0xAA, sizeof rec);
	sr_encode_record_header(rec, 3, shape, 2, 4, len, 2, 1, plen, name, strlen(name), "", 0, 0, 16, 0);
	sr_set_record_flags(rec, SR_FLAG_FP8);
	CHECK(sr_get_le64(want + hdr) == (524288 | parts << 32) && sr_get_le64(want + hdr + 8) == 0,
	      "fp8 payload header");
	memcpy(rec + hdr, want + hdr, plen);
	memset(rec + hdr + plen, 0, len - hdr - plen);
	same("ring", "record_fp8_bf16_2x4.bin", rec, len);
}

int main(void)
{
	messages();
	replies();
	ring();
	return th_done("golden");
}
