/* The reply decoder against hostile bytes: each is refused with a reason that says what is
 * wrong, and nothing is read out of bounds (run under ASan). */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

static int decode(const char *body, int type, int version, char *why, size_t cap, sp_reply *r)
{
	static uint8_t d[SP_MAX_MESSAGE + 16];
	size_t n = strlen(body);
	memcpy(d, "STRP", 4);
	d[4] = (uint8_t)version, d[5] = 0, d[6] = (uint8_t)type, d[7] = 0;
	d[8] = (uint8_t)n, d[9] = (uint8_t)(n >> 8), d[10] = (uint8_t)(n >> 16), d[11] = 0;
	memcpy(d + 12, body, n);
	return sp_decode_reply(d, 12 + n, r, why, cap);
}

int main(void)
{
	char why[300];
	sp_reply r;
	struct {
		const char *body;
		int type, version;
		const char *want;
	} bad[] = {
		{"{}", SP_RELEASE, 1, "RELEASE.tail is missing"},
		{"{\"tail\":\"1\"}", SP_RELEASE, 1, "not an unsigned integer"},
		{"{\"tail\":-1}", SP_RELEASE, 1, "not an unsigned integer"},
		{"{\"tail\":1.5}", SP_RELEASE, 1, "not an unsigned integer"},
		{"{\"tail\":true}", SP_RELEASE, 1, "not an unsigned integer"},
		{"{\"tail\":18446744073709551616}", SP_RELEASE, 1, "not an unsigned integer"},
		{"[]", SP_RELEASE, 1, "not a JSON object"},
		{"{\"tail\":1", SP_RELEASE, 1, "not JSON"},
		{"{\"tail\":1}", SP_RELEASE, 2, "daemon speaks protocol 2"},
		{"{\"tail\":1}", 99, 1, "unexpected message type 99"},
		{"{\"tail\":1}", SP_HELLO, 1, "unexpected message type 1"},
		{"{\"protocol\":1,\"daemon\":7,\"pid\":1,\"max_message\":1}", SP_WELCOME, 1, "WELCOME.daemon"},
		{"{\"protocol\":1,\"daemon\":\"d\",\"pid\":1,\"max_message\":1,\"max_ring_size\":\"1\"}", SP_WELCOME, 1,
		 "max_ring_size"},
		{"{\"seq\":1,\"offset\":2,\"packets\":3,\"drops\":0,\"tokens\":0,\"last_offset\":1,\"last_crc\":null}",
		 SP_CHECKPOINTED, 1, "last_crc"},
		{"{\"daemon\":{},\"sessions\":{}}", SP_STATUS_REPLY, 1, "sessions"},
		{"{\"session\":1}", SP_OPENED, 1, "OPENED.block_size"},
		{"{\"session\":1,\"block_size\":2,\"published_cursor\":1}", SP_OPENED, 1, "OPENED.published_cursor"},
		{"{\"a\":\"\\ud800\"}", SP_OPENED, 1, "surrogate"},
		{"{\"a\":\"\xff\"}", SP_OPENED, 1, "UTF-8"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		why[0] = 0;
		int rc = decode(bad[i].body, bad[i].type, bad[i].version, why, sizeof why, &r);
		CHECK(rc == STRAP_E_PROTOCOL && strstr(why, bad[i].want),
		      "case %zu (%s): rc %d, reason \"%s\", want \"%s\"", i, bad[i].body, rc, why, bad[i].want);
	}
	/* framing */
	uint8_t d[32] = "STRP\x01\x00\x06\x00\x05\x00\x00\x00{}";
	CHECK(sp_decode_reply(d, 6, &r, why, sizeof why) == STRAP_E_PROTOCOL && strstr(why, "shorter"), "%s", why);
	CHECK(sp_decode_reply(d, 14, &r, why, sizeof why) == STRAP_E_PROTOCOL && strstr(why, "length"), "%s", why);
	d[0] = 'X';
	CHECK(sp_decode_reply(d, 14, &r, why, sizeof why) == STRAP_E_PROTOCOL && strstr(why, "magic"), "%s", why);

	/* unknown fields are ignored; a malformed ERROR still reads as a fatal error */
	CHECK(decode("{\"session\":1,\"block_size\":2,\"later\":[true]}", SP_OPENED, 1, why, sizeof why, &r) ==
			      STRAP_OK &&
		      r.u.opened.session == 1,
	      "unknown fields: %s", why);
	CHECK(decode("{\"code\":5,\"message\":[1]}", SP_ERROR, 1, why, sizeof why, &r) == STRAP_OK &&
		      strcmp(r.u.error.code, "unknown") == 0 && r.u.error.fatal == 1,
	      "lenient error");
	CHECK(decode("{\"code\":\"limit\",\"message\":\"m\",\"fatal\":false}", SP_ERROR, 7, why, sizeof why, &r) ==
			      STRAP_OK &&
		      strcmp(r.u.error.code, "limit") == 0 && r.u.error.fatal == 0,
	      "error of another version");
	return th_done("reply");
}
