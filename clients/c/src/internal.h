/* Internal interfaces of libstrap, shared by the library's files and its tests (which link the
 * static library); JSON and the control messages come from common/strap_wire.h.
 * Nothing here is exported from the shared library (built with -fvisibility=hidden). */
#ifndef STRAP_INTERNAL_H
#define STRAP_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strap.h"
/* The ring layout (PROTOCOL.md 2): header-only, shared with the Python client's extension. */
#include "strap_ring.h"

/* The control messages and the JSON reader/writer: shared with the Python client's extension. */
#include "strap_wire.h"

/* Every internal symbol carries the library's prefix: a static libstrap.a shares one
 * namespace with its host program. */
#define sp_rank_detect strap__sp_rank_detect
#define sp_rank_path strap__sp_rank_path
#define sr_ggml_dtype strap__sr_ggml_dtype
#define se_set strap__se_set
#define sp_codecs strap__sp_codecs
#define sp_codec_check strap__sp_codec_check

#if defined(__GNUC__)
#define STRAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define STRAP_PRINTF(f, a)
#endif

_Static_assert((int)SP_OK == (int)STRAP_OK && (int)SP_E_INVALID == (int)STRAP_E_INVALID &&
		       (int)SP_E_PROTOCOL == (int)STRAP_E_PROTOCOL && (int)SP_E_TOO_LARGE == (int)STRAP_E_TOO_LARGE,
	       "strap_wire.h's return codes are strap.h's");

static inline uint64_t sp_align64(uint64_t n)
{
	return sr_align64(n);
}

/* ----- the codec table (codecs.c; testdata/codec-table/codecs.json) ----- */
enum { SP_CODEC_MAX_MODES = 2 };
typedef struct sp_codec {
	const char *name;
	int id;
	int level_min, level_max;                        /* codec_level range, inclusive */
	const char *lossy_modes[SP_CODEC_MAX_MODES + 1]; /* NULL-terminated; none: lossless */
} sp_codec;
/* The table, ordered by number; *n entries. */
const sp_codec *sp_codecs(size_t *n);
/* 0 when name is a codec, level negative (the daemon's default) or in its range, and lossy_mode NULL or one of its
 * modes; else -1 with the reason in err. */
int sp_codec_check(const char *name, int level, const char *lossy_mode, char *err, size_t errlen);

/* One rank of a distributed job (rank.c, docs/DISTRIBUTED.md): world_size 0 for a single process. */
typedef struct sp_rank {
	long long rank, world_size, local_rank, local_world_size; /* local_*: -1 when not said */
	char host[256];
	char job_id[256];    /* TORCHELASTIC_RUN_ID, or "" */
	bool per_rank_paths; /* STRAP_RANK_STREAMS not 0/false/no/off */
} sp_rank;
/* This process's rank from RANK, WORLD_SIZE (both set, WORLD_SIZE > 1), LOCAL_RANK,
 * LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID and STRAP_RANK_STREAMS; -1 with a message in err for a
 * value that is not an integer, a rank outside the world or a bad STRAP_RANK_STREAMS. */
int sp_rank_detect(sp_rank *r, char *err, size_t errlen);
/* path with this rank's marker before its extension (malloc'd; NULL: out of memory); a path
 * that already carries the marker is returned as it is. */
char *sp_rank_path(const char *path, const sp_rank *r);

/* ----- ring records: common/strap_ring.h; the dtype tables (record.c) ----- */

/* The strap dtype of a ggml type: > 0 for the float/integer types, 0 for the quantized ones
 * (stored as raw blocks), -1 for a type this library does not know. */
int sr_ggml_dtype(int ggml_type);

/* ----- errors (error.c) ----- */
void se_set(strap_error *e, int code, const char *fmt, ...) STRAP_PRINTF(3, 4);

#endif
