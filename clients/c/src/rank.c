/*
 * One rank of a distributed job (docs/DISTRIBUTED.md, the Python client's _distributed.py): which
 * rank this process is, from the launcher's RANK and WORLD_SIZE, and the per-rank stream name
 * that keeps the ranks of one job from writing one file: {stem}.rank{RANK:05d}-of-{WORLD:05d}{ext}
 * (common/strap_rank.h, the one rule both clients compile). STRAP_RANK_STREAMS=0 keeps the path
 * as given (the stream lock then refuses a second rank).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"
#include "strap_rank.h"

/* The white space Python's str.strip() removes (of ASCII). */
static bool blank(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Whether the variable is unset or only white space. */
static bool env_absent(const char *name)
{
	const char *v = getenv(name);
	while (v && blank(*v))
		v++;
	return !v || !*v;
}

/* "" or unset: absent (1); an integer: its value (0); else an error (-1). */
static int env_int(const char *name, long long *out, char *err, size_t errlen)
{
	if (env_absent(name))
		return 1;
	const char *v = getenv(name);
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	while (blank(*end))
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
	/* not a launcher's pair (a lone RANK may mean something else): a single process, as in
	 * Python, before either is parsed */
	if (env_absent("RANK") || env_absent("WORLD_SIZE"))
		return 0;
	if (env_int("RANK", &rank, err, errlen) < 0 || env_int("WORLD_SIZE", &world, err, errlen) < 0)
		return -1;
	if (world <= 1)
		return 0; /* a world of one: a single process */
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
	const char *e = getenv("STRAP_RANK_STREAMS");
	char v[16] = "";
	while (e && blank(*e))
		e++;
	size_t n = e ? strlen(e) : 0;
	while (n && blank(e[n - 1]))
		n--;
	if (n >= sizeof v) {
		snprintf(err, errlen, "STRAP_RANK_STREAMS=%s: expected 1 or 0 (true/false, yes/no, on/off)", e);
		return -1;
	}
	if (n)
		memcpy(v, e, n);
	v[n] = 0;
	if (!*v || !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
		r->per_rank_paths = true;
	else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
		r->per_rank_paths = false;
	else {
		snprintf(err, errlen, "STRAP_RANK_STREAMS=%s: expected 1 or 0 (true/false, yes/no, on/off)", v);
		return -1;
	}
	return 0;
}

char *sp_rank_path(const char *path, const sp_rank *r)
{
	/* the rule is common/strap_rank.h's, which the Python client compiles too */
	size_t n = srk_rank_path(path, r->rank, r->world_size, NULL, 0);
	char *out = malloc(n + 1);
	if (out)
		srk_rank_path(path, r->rank, r->world_size, out, n + 1);
	return out;
}
