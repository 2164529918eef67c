/*
 * The per-rank stream name of docs/DISTRIBUTED.md, written once for the client side: one rank
 * of a job of several writes {stem}.rank{RANK:05d}-of-{WORLD:05d}{ext}, the marker before the
 * extension as Python's os.path.splitext finds it (the last dot of the name, unless only dots
 * come before it: ".strap" has none). A path that already ends its stem with this rank's
 * marker (one a capture of this rank returned, given again) is kept. libstrap (src/rank.c)
 * and the Python client's extension (_speedups.c, behind _distributed.rank_path) both name
 * streams with it.
 *
 * Plain C99, header-only (static inline), no allocation, no strtol (nothing newer than glibc
 * 2.17 for the wheels).
 */
#ifndef STRAP_RANK_H
#define STRAP_RANK_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Where the extension of path's last component starts (its length when it has none). */
static inline size_t
srk_stem_end(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    const char *dot = strrchr(base, '.'), *p = base;
    while (*p == '.')
        p++;
    if (!dot || dot < p)
        return strlen(path);
    return (size_t)(dot - path);
}

/* The value of the digits s[0..n) when it equals want (no overflow: longer runs compare as
 * numbers digit by digit). */
static inline bool
srk_digits_are(const char *s, size_t n, long long want)
{
    unsigned long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (v > (unsigned long long)want)
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return want >= 0 && v == (unsigned long long)want;
}

/* Whether stem[0..n) ends with ".rank<5 or more digits>-of-<5 or more digits>" naming rank of
 * world. */
static inline bool
srk_has_marker(const char *stem, size_t n, long long rank, long long world)
{
    size_t i = n;
    while (i > 0 && stem[i - 1] >= '0' && stem[i - 1] <= '9')
        i--;
    if (n - i < 5 || i < 4 || memcmp(stem + i - 4, "-of-", 4) != 0)
        return false;
    size_t j = i - 4, k = j;
    while (k > 0 && stem[k - 1] >= '0' && stem[k - 1] <= '9')
        k--;
    if (j - k < 5 || k < 5 || memcmp(stem + k - 5, ".rank", 5) != 0)
        return false;
    return srk_digits_are(stem + k, j - k, rank) && srk_digits_are(stem + i, n - i, world);
}

/* path's per-rank name for rank of world into out[0..len) (NUL-terminated when len > 0).
 * Returns the name's length; a result >= len was cut short (as snprintf). */
static inline size_t
srk_rank_path(const char *path, long long rank, long long world, char *out, size_t len)
{
    size_t stem_end = srk_stem_end(path);
    if (srk_has_marker(path, stem_end, rank, world))
        return (size_t)snprintf(out, len, "%s", path);
    return (size_t)snprintf(out, len, "%.*s.rank%05lld-of-%05lld%s", (int)stem_end, path, rank, world, path + stem_end);
}

#endif
