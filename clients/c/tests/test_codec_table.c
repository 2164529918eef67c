/* libstrap's codec table (src/codecs.c) against the golden one, testdata/codec-table/codecs.json,
 * which strapd's codecs (internal/codec TestCodecTable) and the Python client's config
 * (tests/test_codec_table.py) are held to too: the same names in the same order, numbers, level
 * ranges and lossy modes; and sp_codec_check accepting exactly what the table allows. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[1 << 16];
	*n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[*n] = 0;
	return buf;
}

static int field_i64(sj_val obj, const char *key, int64_t *out)
{
	sj_val v;
	return sj_get(obj, key, &v) && sj_i64(v, out);
}

static void check_entry(const sp_codec *c, sj_val g)
{
	sj_val v;
	char name[64] = "";
	CHECK(sj_get(g, "name", &v) && sj_str(v, name, sizeof name, NULL), "an entry without a name");
	CHECK(!strcmp(name, c->name), "libstrap has %s where codecs.json has %s", c->name, name);
	int64_t id = -1;
	CHECK(field_i64(g, "id", &id) && id == c->id, "%s: id %d, codecs.json %lld", c->name, c->id, (long long)id);
	int64_t lv[2] = {-1, -1};
	int k = 0;
	sj_val levels, e;
	const char *it;
	CHECK(sj_get(g, "levels", &levels), "%s: no levels", name);
	for (it = levels.p; k < 2 && sj_array_next(levels, &it, &e); k++)
		CHECK(sj_i64(e, &lv[k]), "%s: a level that is not an integer", name);
	CHECK(k == 2 && lv[0] == c->level_min && lv[1] == c->level_max, "%s: levels %d..%d, codecs.json %lld..%lld",
	      c->name, c->level_min, c->level_max, (long long)lv[0], (long long)lv[1]);
	sj_val modes;
	CHECK(sj_get(g, "lossy_modes", &modes), "%s: no lossy_modes", name);
	int m = 0;
	for (it = modes.p; sj_array_next(modes, &it, &e); m++) {
		char mode[32] = "";
		CHECK(sj_str(e, mode, sizeof mode, NULL), "%s: a mode that is not a string", name);
		CHECK(m < SP_CODEC_MAX_MODES && c->lossy_modes[m] && !strcmp(c->lossy_modes[m], mode),
		      "%s: lossy mode %d is %s in codecs.json, %s here", name, m, mode,
		      m < SP_CODEC_MAX_MODES && c->lossy_modes[m] ? c->lossy_modes[m] : "(none)");
	}
	CHECK(m == SP_CODEC_MAX_MODES || !c->lossy_modes[m], "%s: libstrap has more lossy modes than codecs.json",
	      name);

	/* What strap_session_open checks: the range taken, the levels beside it refused. */
	char err[160];
	for (int l = c->level_min; l <= c->level_max; l++)
		CHECK(sp_codec_check(c->name, l, NULL, err, sizeof err) == 0, "%s level %d refused: %s", name, l, err);
	CHECK(sp_codec_check(c->name, -1, NULL, err, sizeof err) == 0, "%s default level refused: %s", name, err);
	CHECK(sp_codec_check(c->name, c->level_max + 1, NULL, err, sizeof err) != 0 && strstr(err, "out of range"),
	      "%s level %d taken", name, c->level_max + 1);
	for (int i = 0; i < SP_CODEC_MAX_MODES && c->lossy_modes[i]; i++)
		CHECK(sp_codec_check(c->name, -1, c->lossy_modes[i], err, sizeof err) == 0, "%s mode %s refused: %s",
		      name, c->lossy_modes[i], err);
	CHECK(sp_codec_check(c->name, -1, "bogus", err, sizeof err) != 0, "%s took lossy mode bogus", name);
}

int main(void)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/testdata/codec-table/codecs.json", th_env("STRAP_REPO"));
	size_t n = 0;
	char *buf = slurp(path, &n);
	CHECK(buf != NULL, "%s: cannot read", path);
	if (!buf)
		return th_done("codec_table");
	char why[128] = "";
	CHECK(sj_validate(buf, n, why, sizeof why), "%s: %s", path, why);
	sj_val doc = {buf, n}, list, ent;
	while (doc.n && (*doc.p == ' ' || *doc.p == '\n'))
		doc.p++, doc.n--;
	int64_t version = 0;
	CHECK(field_i64(doc, "version", &version) && version == 1, "codecs.json version %lld, this test reads 1",
	      (long long)version);
	CHECK(sj_get(doc, "codecs", &list), "codecs.json has no codecs");
	size_t count;
	const sp_codec *codecs = sp_codecs(&count);
	size_t i = 0;
	for (const char *it = list.p; sj_array_next(list, &it, &ent); i++) {
		CHECK(i < count, "codecs.json lists more codecs than libstrap's %zu", count);
		if (i < count)
			check_entry(&codecs[i], ent);
	}
	CHECK(i == count, "codecs.json lists %zu codecs, libstrap %zu", i, count);
	/* strap_session_open refuses them before it looks for a daemon. */
	const char *bad[][2] = {{"brotli", NULL}, {"lz4", "rel"}};
	const int bad_level[] = {-1, -1};
	for (int b = 0; b < 2; b++) {
		strap_session_params p = strap_default_session_params();
		p.output_path = "/nonexistent/codec_table.strap";
		p.socket_path = "/nonexistent/strapd.sock";
		p.autostart = 0;
		p.codec = bad[b][0];
		p.lossy_mode = bad[b][1];
		p.codec_level = bad_level[b];
		strap_session *s = NULL;
		strap_error e;
		int rc = strap_session_open(&p, &s, &e);
		CHECK(rc == STRAP_E_INVALID && s == NULL && strstr(e.message, p.codec),
		      "codec %s: strap_session_open = %d (%s)", p.codec, rc, e.message);
	}
	strap_session_params p = strap_default_session_params();
	p.output_path = "/nonexistent/codec_table.strap";
	p.socket_path = "/nonexistent/strapd.sock";
	p.autostart = 0;
	p.codec = "zstd";
	p.codec_level = 5;
	strap_session *s = NULL;
	strap_error e;
	CHECK(strap_session_open(&p, &s, &e) == STRAP_E_INVALID && strstr(e.message, "out of range"),
	      "zstd level 5: %s", e.message);
	char err[160];
	CHECK(sp_codec_check("brotli", -1, NULL, err, sizeof err) != 0 && strstr(err, "unknown"), "brotli taken");
	CHECK(sp_codec_check("lz4", 3, "rel", err, sizeof err) != 0 && strstr(err, "lossless"), "lz4 took a bound");
	return th_done("codec_table");
}
