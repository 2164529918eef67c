/* The golden checkpoint files (testdata/checkpoint): the clients' reader (sck_parse,
 * common/strap_checkpoint.c) parses each file to the facts expect.json names, the same facts
 * the Go reader (internal/checkpoint TestGolden) and the Python client, which binds the same C
 * (tests/test_checkpoint_golden.py), are held to, and refuses every file expect.json marks
 * invalid (1.3.1's among them). The clients' writer (sck_encode) gives the files it wrote back
 * byte for byte from what the reader parsed of them. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"
#include "session.h"

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *b = malloc(cap);
	size_t r;
	while (b && (r = fread(b + len, 1, cap - len, f)) > 0) {
		len += r;
		if (len == cap) {
			char *nb = realloc(b, cap *= 2);
			if (!nb) {
				free(b);
				b = NULL;
				break;
			}
			b = nb;
		}
	}
	fclose(f);
	*n = len;
	return b;
}

static bool want_u64(sj_val facts, const char *key, uint64_t *out)
{
	sj_val v;
	return sj_get(facts, key, &v) && sj_u64(v, out);
}

/* The files the writer wrote (libstrap's in a real capture, the Python client's through the
 * same C): written again from what was parsed of them, with their other members and 1.3.1's
 * tokens list as they were, they come out byte for byte. */
static void check_encoded(const char *name, const char *buf, size_t n, const sck_checkpoint *c)
{
	if (strcmp(name, "libstrap.ckpt.json") != 0 && strncmp(name, "client-", 7) != 0)
		return;
	static sck_member extra[64], tokens[64];
	static char keys[64][64], created[64];
	size_t nextra = 0, ntokens = 0;
	sj_val doc = {buf, n}, k, v;
	const char *it = doc.p;
	while (sj_object_next(doc, &it, &k, &v) && nextra < 64) {
		bool full;
		CHECK(sj_str(k, keys[nextra], sizeof keys[nextra], &full) && full, "%s: a long key", name);
		if (sck_format_key(keys[nextra], strlen(keys[nextra])))
			continue;
		extra[nextra] = (sck_member){keys[nextra], strlen(keys[nextra]), v.p, v.n};
		nextra++;
	}
	if (c->tokens.p) {
		it = c->tokens.p;
		while (sj_array_next(c->tokens, &it, &v) && ntokens < 64)
			tokens[ntokens++] = (sck_member){NULL, 0, v.p, v.n};
	}
	CHECK(c->created.p && sj_str(c->created, created, sizeof created, NULL), "%s: no created", name);
	static char out[1 << 16];
	sw_buf b = {out, 0, sizeof out, false};
	char why[256] = "";
	int rc = sck_encode(&b, c, created, extra, nextra, c->tokens.p ? tokens : NULL, ntokens, why, sizeof why);
	CHECK(rc == 0, "%s: not written again: %s", name, why);
	CHECK(rc == 0 && b.n == n && memcmp(out, buf, n) == 0, "%s: written again as\n%.*s", name, (int)b.n, out);
	/* a buffer too small: refused, never cut */
	sw_buf small = {out, 0, n - 1, false};
	CHECK(sck_encode(&small, c, created, extra, nextra, c->tokens.p ? tokens : NULL, ntokens, why, sizeof why) ==
			      -1 &&
		      small.overflow,
	      "%s: written into %zu bytes", name, n - 1);
}

/* The writer refuses what no reader would take back. */
static void check_encoder_refuses(void)
{
	static sck_checkpoint c = {.stream = "/s",
				   .fingerprint = "f",
				   .stream_offset = 100,
				   .packets = 2,
				   .last_seq = 2,
				   .last_packet_offset = 50,
				   .token_count = 1};
	static char out[4096];
	char why[256];
	sw_buf b = {out, 0, sizeof out, false};
	CHECK(sck_encode(&b, &c, "t", NULL, 0, NULL, 0, why, sizeof why) == 0, "a valid checkpoint refused: %s", why);
	sck_checkpoint bad = c;
	bad.last_packet_offset = 100;
	CHECK(sck_encode(&b, &bad, "t", NULL, 0, NULL, 0, why, sizeof why) == -1 && strstr(why, "last_packet_offset"),
	      "last_packet_offset at the end written: %s", why);
	bad = c;
	bad.has_token_log = true, bad.log_tokens = 2, bad.log_bytes = 10;
	CHECK(sck_encode(&b, &bad, "t", NULL, 0, NULL, 0, why, sizeof why) == -1 && strstr(why, "token_log"),
	      "a token log of 2 tokens for 1 written: %s", why);
	sck_member own = {"stream", 6, "1", 1}, notjson = {"x", 1, "{", 1};
	CHECK(sck_encode(&b, &c, "t", &own, 1, NULL, 0, why, sizeof why) == -1 && strstr(why, "stream"),
	      "a second \"stream\" written: %s", why);
	CHECK(sck_encode(&b, &c, "t", &notjson, 1, NULL, 0, why, sizeof why) == -1 && strstr(why, "JSON"),
	      "an extra member that is not JSON written: %s", why);
}

static void check_file(const char *dir, const char *name, sj_val facts)
{
	char path[8400];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	size_t n = 0;
	char *buf = slurp(path, &n);
	CHECK(buf != NULL, "%s: cannot read", path);
	if (!buf)
		return;
	sck_checkpoint c;
	char why[256] = "";
	int rc = sck_parse(buf, n, &c, why, sizeof why);
	if (rc == 0)
		check_encoded(name, buf, n, &c);
	free(buf);
	sj_val v;
	bool valid = false;
	CHECK(sj_get(facts, "valid", &v) && sj_bool(v, &valid), "%s: no \"valid\" in expect.json", name);
	if (!valid) {
		CHECK(rc == -1 && why[0], "%s: accepted, expect.json says it is not valid", name);
		return;
	}
	CHECK(rc == 0, "%s: refused: %s", name, why);
	if (rc != 0)
		return;
	char str[4096];
	CHECK(sj_get(facts, "stream", &v) && sj_str(v, str, sizeof str, NULL) && strcmp(str, c.stream) == 0,
	      "%s: stream %s", name, c.stream);
	CHECK(sj_get(facts, "fingerprint", &v) && sj_str(v, str, sizeof str, NULL) && strcmp(str, c.fingerprint) == 0,
	      "%s: fingerprint %s", name, c.fingerprint);
	struct {
		const char *k;
		uint64_t got;
	} f[] = {{"stream_offset", c.stream_offset},
		 {"packets", c.packets},
		 {"drops", c.drops},
		 {"last_seq", c.last_seq},
		 {"last_packet_offset", c.last_packet_offset},
		 {"last_packet_crc", c.last_packet_crc},
		 {"token_count", c.token_count},
		 {"forward_count", c.forward_count}};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		uint64_t w = 0;
		CHECK(want_u64(facts, f[i].k, &w) && w == f[i].got, "%s: %s parsed %llu, expected %llu", name, f[i].k,
		      (unsigned long long)f[i].got, (unsigned long long)w);
	}
	int64_t listed = -2;
	CHECK(sj_get(facts, "listed_tokens", &v) && sj_i64(v, &listed) && listed == c.listed_tokens,
	      "%s: listed_tokens parsed %lld, expected %lld", name, (long long)c.listed_tokens, (long long)listed);
	CHECK(sj_get(facts, "token_log", &v), "%s: no token_log in expect.json", name);
	if (sj_kind(v) == 'z') {
		CHECK(!c.has_token_log, "%s: a token log parsed where there is none", name);
	} else {
		uint64_t t = 0, b = 0, crc = 0;
		CHECK(c.has_token_log && want_u64(v, "tokens", &t) && want_u64(v, "bytes", &b) &&
			      want_u64(v, "crc32c", &crc) && t == c.log_tokens && b == c.log_bytes &&
			      crc == c.log_crc32c,
		      "%s: token_log parsed %d {%llu, %llu, %llu}", name, c.has_token_log,
		      (unsigned long long)c.log_tokens, (unsigned long long)c.log_bytes,
		      (unsigned long long)c.log_crc32c);
	}
}

int main(void)
{
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/testdata/checkpoint", th_env("STRAP_REPO"));
	char path[4200];
	snprintf(path, sizeof path, "%s/expect.json", dir);
	size_t n = 0;
	char *exp = slurp(path, &n);
	CHECK(exp && sj_validate(exp, n, NULL, 0), "%s: missing or not JSON", path);
	if (!exp)
		return th_done("test_checkpoint_golden");
	sj_val doc = {exp, n}, files;
	while (doc.n && *doc.p != '{')
		doc.p++, doc.n--;
	CHECK(sj_get(doc, "files", &files) && sj_kind(files) == '{', "expect.json: no \"files\" object");
	DIR *d = opendir(dir);
	CHECK(d != NULL, "%s: cannot list", dir);
	int seen = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name), sl = strlen(".ckpt.json");
		if (l <= sl || strcmp(e->d_name + l - sl, ".ckpt.json") != 0)
			continue;
		sj_val facts;
		CHECK(sj_get(files, e->d_name, &facts), "%s: not in expect.json", e->d_name);
		if (sj_kind(facts) == '{')
			check_file(dir, e->d_name, facts);
		seen++;
	}
	if (d)
		closedir(d);
	CHECK(seen >= 10, "only %d golden files", seen);
	/* a size the readers refuse before parsing: more than 64 MiB */
	static sck_checkpoint c;
	char why[256] = "";
	CHECK(sck_parse("{}", (size_t)SCK_MAX_SIZE + 1, &c, why, sizeof why) == -1 && strstr(why, "64 MiB"),
	      "65 MiB accepted: %s", why);
	check_encoder_refuses();
	free(exp);
	printf("%d golden checkpoint files\n", seen);
	return th_done("test_checkpoint_golden");
}
