/* The stream codecs a session may ask for (docs/COMPRESSION.md 1): each one's name, the number
 * stored in packet headers, its codec_level range and the lossy bound modes it takes. The same
 * table as testdata/codec-table/codecs.json, which strapd's codecs (internal/codec) and the
 * Python client's config are held to as well; tests/test_codec_table.c fails when this copy
 * drifts from it. strap_session_open checks its params here, so a wrong name or level is a
 * clear STRAP_E_INVALID before any daemon is asked. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* clang-format off */
static const sp_codec codecs[] = {
	{"none", 0, 0, 0, {NULL}},
	{"lz4", 1, 0, 9, {NULL}},
	{"zstd", 2, 0, 4, {NULL}},
	{"shuffle", 16, 0, 4, {NULL}},
	{"quant", 17, 0, 4, {"abs", "rel"}},
	{"fp16", 18, 0, 4, {"fp16"}},
	{"fp8", 19, 0, 0, {"fp8"}},
	{"transform", 20, 0, 0, {"transform"}},
};
/* clang-format on */

const sp_codec *sp_codecs(size_t *n)
{
	*n = sizeof codecs / sizeof codecs[0];
	return codecs;
}

int sp_codec_check(const char *name, int level, const char *lossy_mode, char *err, size_t errlen)
{
	const sp_codec *c = NULL;
	for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++)
		if (!strcmp(codecs[i].name, name))
			c = &codecs[i];
	if (!c) {
		snprintf(err, errlen, "codec \"%s\" is unknown (none, lz4, zstd, shuffle, quant, fp16, fp8)", name);
		return -1;
	}
	if (level >= 0 && (level < c->level_min || level > c->level_max)) {
		snprintf(err, errlen, "codec_level %d out of range %d..%d for %s (negative: the daemon's default)",
			 level, c->level_min, c->level_max, name);
		return -1;
	}
	if (!lossy_mode)
		return 0;
	for (int i = 0; i < SP_CODEC_MAX_MODES && c->lossy_modes[i]; i++)
		if (!strcmp(c->lossy_modes[i], lossy_mode))
			return 0;
	if (!c->lossy_modes[0])
		snprintf(err, errlen, "codec %s is lossless: it takes no lossy bound (lossy_mode \"%s\")", name,
			 lossy_mode);
	else
		snprintf(err, errlen, "lossy_mode \"%s\" does not fit codec %s (modes: %s%s%s)", lossy_mode, name,
			 c->lossy_modes[0], c->lossy_modes[1] ? ", " : "", c->lossy_modes[1] ? c->lossy_modes[1] : "");
	return -1;
}
