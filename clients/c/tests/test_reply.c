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
		{"{}", SP_RELEASE, 1, "RELEASE without field 'tail'"},
		{"{\"tail\":\"1\"}", SP_RELEASE, 1, "RELEASE.tail is \"1\", expected an integer >= 0"},
		{"{\"tail\":-1}", SP_RELEASE, 1, "expected an integer >= 0"},
		{"{\"tail\":1.5}", SP_RELEASE, 1, "expected an integer >= 0"},
		{"{\"tail\":true}", SP_RELEASE, 1, "expected an integer >= 0"},
		{"{\"tail\":18446744073709551616}", SP_RELEASE, 1, "expected an integer >= 0"},
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
		{"{\"daemon\":{},\"sessions\":[1]}", SP_STATUS_REPLY, 1,
		 "STATUS_REPLY.sessions is 1, expected a list of objects"},
		{"{\"daemon\":{},\"uploads\":{}}", SP_STATUS_REPLY, 1, "STATUS_REPLY.uploads is {}, expected a list"},
		{"{\"session\":1,\"block_size\":2,\"ring_tokens\":\"yes\"}", SP_OPENED, 1, "OPENED.ring_tokens"},
		{"{\"session\":1}", SP_OPENED, 1, "OPENED without field 'block_size'"},
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
	/* a reason quotes a cut of the reply that keeps whole UTF-8 characters */
	CHECK(decode("{\"tail\":\"a\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
		     "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
		     "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
		     "\"}",
		     SP_RELEASE, 1, why, sizeof why, &r) == STRAP_E_PROTOCOL &&
		      sp_utf8_valid(why, strlen(why)) && strstr(why, "..., expected"),
	      "cut reason: %s", why);
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
	/* OPENED's and WELCOME's optional fields: absent and null are the same, a value says has_* */
	CHECK(decode("{\"session\":1,\"block_size\":2,\"published_cursor\":false,\"ring_tokens\":true,\"upload\":null}",
		     SP_OPENED, 1, why, sizeof why, &r) == STRAP_OK &&
		      r.u.opened.has_published_cursor && !r.u.opened.published_cursor && r.u.opened.has_ring_tokens &&
		      r.u.opened.ring_tokens && r.u.opened.upload[0] == 0,
	      "opened options: %s", why);
	CHECK(decode("{\"protocol\":1,\"daemon\":\"d\\u00e9\",\"pid\":1,\"max_message\":1,\"max_ring_size\":null}",
		     SP_WELCOME, 1, why, sizeof why, &r) == STRAP_OK &&
		      !r.u.welcome.has_max_ring_size && strcmp(r.u.welcome.daemon, "d\xc3\xa9") == 0 &&
		      r.u.welcome.daemon_json.n == 9,
	      "welcome options: %s", why);
	CHECK(decode("{\"packets\":1,\"drops\":0,\"bytes_in\":1,\"bytes_out\":1,\"file_bytes\":1,\"upload\":\"s3://b/"
		     "k\"}",
		     SP_CLOSED, 1, why, sizeof why, &r) == STRAP_OK &&
		      strcmp(r.u.closed.upload, "s3://b/k") == 0,
	      "closed upload: %s", why);
	return th_done("reply");
}
