/*
 * One rank of a distributed job (docs/DISTRIBUTED.md, the Python client's _distributed.py): which
 * rank this process is, from the launcher's RANK and WORLD_SIZE, and the per-rank stream name
 * that keeps the ranks of one job from writing one file: {stem}.rank{RANK:05d}-of-{WORLD:05d}{ext}.
 * STRAP_RANK_STREAMS=0 keeps the path as given (the stream lock then refuses a second rank).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

/* "" or unset: absent (1); an integer: its value (0); else an error (-1). */
static int env_int(const char *name, long long *out, char *err, size_t errlen)
{
	const char *v = getenv(name);
	if (!v)
		return 1;
	while (*v == ' ' || *v == '\t')
		v++;
	if (!*v)
		return 1;
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	while (*end == ' ' || *end == '\t' || *end == '\n')
		end++;
	if (errno || *end) {
		snprintf(err, errlen, "environment variable %s=%s is not an integer", name, getenv(name));
		return -1;
	}
	*out = x;
	return 0;
}

int sp_rank_detect(sp_rank *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof *r);
	r->local_rank = r->local_world_size = -1;
	long long rank = 0, world = 0;
	int a = env_int("RANK", &rank, err, errlen), b = env_int("WORLD_SIZE", &world, err, errlen);
	if (a < 0 || b < 0)
		return -1;
	if (a || b || world <= 1)
		return 0; /* not a launcher's pair, or a world of one: a single process */
	if (rank < 0 || rank >= world) {
		snprintf(err, errlen, "rank %lld is outside a world of %lld processes (RANK, WORLD_SIZE)", rank, world);
		return -1;
	}
	long long lr, lw;
	int c = env_int("LOCAL_RANK", &lr, err, errlen), d = env_int("LOCAL_WORLD_SIZE", &lw, err, errlen);
	if (c < 0 || d < 0)
		return -1;
	r->rank = rank;
	r->world_size = world;
	r->local_rank = c == 0 ? lr : -1;
	r->local_world_size = d == 0 ? lw : -1;
	if (gethostname(r->host, sizeof r->host - 1) != 0)
		r->host[0] = 0;
	const char *job = getenv("TORCHELASTIC_RUN_ID");
	snprintf(r->job_id, sizeof r->job_id, "%s", job ? job : "");
	const char *v = getenv("STRAP_RANK_STREAMS");
	while (v && (*v == ' ' || *v == '\t'))
		v++;
	if (!v || !*v || !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
		r->per_rank_paths = true;
	else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
		r->per_rank_paths = false;
	else {
		snprintf(err, errlen, "STRAP_RANK_STREAMS=%s: expected 1 or 0 (true/false, yes/no, on/off)", v);
		return -1;
	}
	return 0;
}

/* Whether stem ends with ".rank<5+ digits>-of-<5+ digits>" naming this rank and world. */
static bool has_marker(const char *stem, size_t n, const sp_rank *r)
{
	/* walk back over "-of-DIGITS" and ".rankDIGITS" */
	size_t i = n;
	while (i > 0 && stem[i - 1] >= '0' && stem[i - 1] <= '9')
		i--;
	size_t wd = n - i;
	if (wd < 5 || i < 4 || memcmp(stem + i - 4, "-of-", 4) != 0)
		return false;
	size_t j = i - 4, k = j;
	while (k > 0 && stem[k - 1] >= '0' && stem[k - 1] <= '9')
		k--;
	size_t rd = j - k;
	if (rd < 5 || k < 5 || memcmp(stem + k - 5, ".rank", 5) != 0)
		return false;
	return strtoll(stem + k, NULL, 10) == r->rank && strtoll(stem + i, NULL, 10) == r->world_size;
}

char *sp_rank_path(const char *path, const sp_rank *r)
{
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	/* Python's os.path.splitext: the last dot of the name, unless the name is all leading dots
	 * before it (".strap" has no extension) */
	const char *dot = strrchr(base, '.');
	const char *p = base;
	while (*p == '.')
		p++;
	if (!dot || dot < p)
		dot = base + strlen(base);
	size_t stem_end = (size_t)(dot - path);
	if (has_marker(path, stem_end, r))
		return strdup(path);
	char marker[64];
	int m = snprintf(marker, sizeof marker, ".rank%05lld-of-%05lld", r->rank, r->world_size);
	size_t n = strlen(path) + (size_t)m + 1;
	char *out = malloc(n);
	if (!out)
		return NULL;
	snprintf(out, n, "%.*s%s%s", (int)stem_end, path, marker, dot);
	return out;
}
