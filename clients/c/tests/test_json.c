/* The JSON reader (validation, lookups, numbers, strings) and writer (escapes, floats). */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

static int valid(const char *s)
{
	return sj_validate(s, strlen(s), NULL, 0);
}

static sj_val val(const char *s)
{
	sj_val v = {s, strlen(s)};
	return v;
}

int main(void)
{
	const char *good[] = {"{}",
			      "[]",
			      " {\"a\":[1,2.5e3,-0,true,false,null,\"x\"]} ",
			      "\"\\ud83d\\ude00\"",
			      "{\"k\":\"caf\xc3\xa9\"}",
			      "0",
			      "-1.5E+2",
			      "[[[[]]]]"};
	for (size_t i = 0; i < sizeof good / sizeof *good; i++)
		CHECK(valid(good[i]), "should be valid: %s", good[i]);
	const char *bad[] = {"",
			     "{",
			     "{\"a\"}",
			     "{\"a\":}",
			     "[1,]",
			     "{,}",
			     "01",
			     "1.",
			     "1e",
			     "-",
			     "+1",
			     "\"\\x\"",
			     "\"\\ud800\"",
			     "\"\\udc00\"",
			     "\"\\ud800\\u0041\"",
			     "\"\x80\"",
			     "\"\xc0\xaf\"",
			     "\"\xed\xa0\x80\"",
			     "\"\xf4\x90\x80\x80\"",
			     "tru",
			     "nul",
			     "{} {}",
			     "\"a\nb\"",
			     "{1:2}",
			     "[\"\xe2\x82\"]"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		CHECK(!valid(bad[i]), "should be invalid: %s", bad[i]);
	/* nesting limit: 64 levels pass, 65 fail, a million never recurse that deep */
	char deep[200];
	memset(deep, '[', 65);
	memset(deep + 65, ']', 65);
	deep[130] = 0;
	CHECK(!valid(deep), "65 levels accepted");
	CHECK(valid(deep + 1) == 0, "unbalanced accepted");
	memset(deep, '[', 64);
	memset(deep + 64, ']', 64);
	deep[128] = 0;
	CHECK(valid(deep), "64 levels refused");

	char err[100];
	CHECK(!sj_validate("{\"a\":1,}", 8, err, sizeof err) && strstr(err, "at byte"), "reason: %s", err);

	sj_val obj = val("{\"a\":1,\"b\":{\"a\":2},\"a\":3,\"\\u0063\":\"x\\\"y\\u00e9\\ud83d\\ude00\"}"), v;
	CHECK(valid(obj.p), "obj");
	uint64_t u;
	CHECK(sj_get(obj, "a", &v) && sj_u64(v, &u) && u == 3, "last repeated key wins");
	CHECK(sj_get(obj, "c", &v), "escaped key matched after unescaping");
	char s[64];
	bool full;
	CHECK(sj_str(v, s, sizeof s, &full) && full && strcmp(s, "x\"y\xc3\xa9\xf0\x9f\x98\x80") == 0, "unescape: %s",
	      s);
	CHECK(sj_str(v, s, 4, &full) && !full && strcmp(s, "x\"y") == 0, "truncation keeps whole characters: %s", s);
	CHECK(!sj_get(obj, "z", &v), "missing key");
	/* a key with an escaped NUL is not the shorter key (and is never read past its end) */
	sj_val nul = val("{\"tail\\u0000x\":1,\"ta\":2}");
	CHECK(valid(nul.p) && !sj_get(nul, "tail", &v), "escaped NUL key matched a shorter one");
	CHECK(sj_get(nul, "ta", &v) && sj_u64(v, &u) && u == 2, "ta");

	int64_t i64;
	CHECK(sj_u64(val("18446744073709551615"), &u) && u == UINT64_MAX, "u64 max");
	CHECK(!sj_u64(val("18446744073709551616"), &u), "u64 overflow");
	CHECK(!sj_u64(val("-1"), &u) && !sj_u64(val("1.0"), &u) && !sj_u64(val("1e3"), &u), "u64 non-integers");
	CHECK(sj_i64(val("-9223372036854775808"), &i64) && i64 == INT64_MIN, "i64 min");
	CHECK(!sj_i64(val("9223372036854775808"), &i64), "i64 overflow");

	char out[256];
	sw_buf b = {out, 0, sizeof out, false};
	sw_str(&b, "a\"\\\n\r\t\b\f\x01\x1f\xc3\xa9</>", 15);
	out[b.n] = 0;
	CHECK(strcmp(out, "\"a\\\"\\\\\\n\\r\\t\\b\\f\\u0001\\u001f\xc3\xa9</>\"") == 0, "escapes: %s", out);
	/* as Python's repr writes them (json.dumps): fixed notation from 1e-4 up to 1e16 */
	double f[] = {0.001, 12.5, 1e-05, 5.0, 0.1, 1e300, -2.5, 100.0, 1e15, 1e16, 0.0001, 123456.789, -0.0, 1.5e-07};
	const char *fw[] = {
		"0.001", "12.5",   "1e-05",      "5.0",  "0.1",    "1e+300", "-2.5", "100.0", "1000000000000000.0",
		"1e+16", "0.0001", "123456.789", "-0.0", "1.5e-07"};
	for (int i = 0; i < (int)(sizeof f / sizeof *f); i++) {
		b.n = 0;
		sw_f64(&b, f[i]);
		out[b.n] = 0;
		CHECK(strcmp(out, fw[i]) == 0, "float %g written %s, want %s", f[i], out, fw[i]);
	}
	b.n = 0;
	b.cap = 3;
	sw_lit(&b, "abcd");
	CHECK(b.overflow && b.n == 0, "overflow flagged");

	CHECK(sp_utf8_valid("caf\xc3\xa9", 5) && !sp_utf8_valid("\xff", 1) && !sp_utf8_valid("\xed\xb0\x80", 3),
	      "utf8 checks");
	return th_done("json");
}
