/* Internal interfaces of libstrap: JSON reading and writing, the wire encoders and the reply
 * decoder, shared by the library's files and its tests (which link the static library).
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

/* Every internal symbol carries the library's prefix: a static libstrap.a shares one
 * namespace with its host program. */
#define sj_validate strap__sj_validate
#define sj_kind strap__sj_kind
#define sj_get strap__sj_get
#define sj_u64 strap__sj_u64
#define sj_i64 strap__sj_i64
#define sj_bool strap__sj_bool
#define sj_str strap__sj_str
#define sj_array_next strap__sj_array_next
#define sw_raw strap__sw_raw
#define sw_lit strap__sw_lit
#define sw_u64 strap__sw_u64
#define sw_i64 strap__sw_i64
#define sw_f64 strap__sw_f64
#define sw_str strap__sw_str
#define sp_utf8_valid strap__sp_utf8_valid
#define sp_enc_begin strap__sp_enc_begin
#define sp_enc_finish strap__sp_enc_finish
#define sp_enc_hello strap__sp_enc_hello
#define sp_enc_open strap__sp_enc_open
#define sp_enc_publish strap__sp_enc_publish
#define sp_enc_drop strap__sp_enc_drop
#define sp_enc_token strap__sp_enc_token
#define sp_enc_checkpoint strap__sp_enc_checkpoint
#define sp_enc_close strap__sp_enc_close
#define sp_enc_status strap__sp_enc_status
#define sp_decode_reply strap__sp_decode_reply
#define sp_pack_resources strap__sp_pack_resources
#define sp_rank_detect strap__sp_rank_detect
#define sp_rank_path strap__sp_rank_path
#define sp_type_name strap__sp_type_name
#define sr_ggml_dtype strap__sr_ggml_dtype
#define se_set strap__se_set
#define sp_codecs strap__sp_codecs
#define sp_codec_check strap__sp_codec_check

#if defined(__GNUC__)
#define STRAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define STRAP_PRINTF(f, a)
#endif

/* ----- protocol constants (docs/PROTOCOL.md) ----- */
enum {
	SP_VERSION = 1,
	SP_HEADER = 12,
	SP_MAX_MESSAGE = 65536,
	SP_HELLO = 1,
	SP_WELCOME = 2,
	SP_OPEN = 3,
	SP_OPENED = 4,
	SP_PUBLISH = 5,
	SP_RELEASE = 6,
	SP_DROP = 7,
	SP_CLOSE = 8,
	SP_CLOSED = 9,
	SP_ERROR = 10,
	SP_STATUS = 11,
	SP_STATUS_REPLY = 12,
	SP_TOKEN = 13,
	SP_CHECKPOINT = 14,
	SP_CHECKPOINTED = 15,
	SP_RESOURCES = 16,
};

static inline uint64_t sp_align64(uint64_t n)
{
	return sr_align64(n);
}

const char *sp_type_name(int type);

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

/* ----- JSON reading (json.c): validation without allocation, then member lookup ----- */

/* A JSON value inside a validated document: [p, p+n). */
typedef struct sj_val {
	const char *p;
	size_t n;
} sj_val;

/* Check that buf is exactly one JSON value (whitespace around allowed), valid UTF-8, with no
 * unpaired surrogate escape, nesting at most 64 deep. On failure writes a reason into err
 * (may be NULL) and returns false. */
bool sj_validate(const char *buf, size_t n, char *err, size_t errlen);
/* The kind of a validated value: '{', '[', '"', 'n'umber, 't'rue, 'f'alse, 'z' (null). */
char sj_kind(sj_val v);
/* Look up a member of a validated object by key (escapes compared after unescaping; the last
 * of a repeated key counts, as in Go). */
bool sj_get(sj_val obj, const char *key, sj_val *out);
/* An unsigned integer (no sign, fraction or exponent; fits u64). */
bool sj_u64(sj_val v, uint64_t *out);
/* A signed integer that fits i64. */
bool sj_i64(sj_val v, int64_t *out);
bool sj_bool(sj_val v, bool *out);
/* Unescape a string value into out (NUL-terminated, truncated to cap); returns false when v
 * is not a string. *full (may be NULL) is set false when it was truncated. */
bool sj_str(sj_val v, char *out, size_t cap, bool *full);
/* Iterate an array: *it starts at v.p; returns false at the end. */
bool sj_array_next(sj_val arr, const char **it, sj_val *elem);

/* ----- JSON / message writing (wire.c) into a fixed buffer, never allocating ----- */

typedef struct sw_buf {
	char *p;
	size_t n, cap;
	bool overflow;
} sw_buf;

void sw_raw(sw_buf *b, const void *s, size_t n);
void sw_lit(sw_buf *b, const char *s);
void sw_u64(sw_buf *b, uint64_t v);
void sw_i64(sw_buf *b, int64_t v);
/* The shortest decimal that reads back as v (Python's repr, Go's strconv 'g' -1). */
void sw_f64(sw_buf *b, double v);
/* A JSON string of n bytes of UTF-8 (escaped as Python's json.dumps(ensure_ascii=False)). */
void sw_str(sw_buf *b, const char *s, size_t n);
/* Every byte sequence is valid UTF-8 (no surrogates, no overlongs). */
bool sp_utf8_valid(const char *s, size_t n);

/* Message bodies a client sends (field order = internal/control/bodies.go). */
typedef struct sp_open_body {
	uint64_t ring_size;
	const char *codec;
	int has_codec_level;
	int64_t codec_level;
	const char *policy;
	uint64_t block_size;    /* 0 = absent */
	const char *lossy_mode; /* NULL = absent */
	int has_lossy_value;
	double lossy_value;
	uint64_t append_at; /* with resume */
	int has_resume;
	uint64_t resume_last_seq, resume_last_crc, resume_packets;
	uint64_t memory_hint; /* 0 = absent */
	const char *metadata; /* raw JSON object or NULL */
	size_t metadata_len;
	int resources;
	const char *upload;    /* NULL = absent */
	int upload_free_local; /* 0 = absent */
} sp_open_body;

/* Each writes one whole datagram (12-byte header + body) into b; b->overflow when it does
 * not fit (the caller gives SP_MAX_MESSAGE bytes). */
void sp_enc_hello(sw_buf *b, const char *client, int64_t pid);
void sp_enc_open(sw_buf *b, const sp_open_body *o);
void sp_enc_publish(sw_buf *b, uint64_t head, uint64_t seq);
void sp_enc_drop(sw_buf *b, uint64_t seq, const char *name, size_t name_len, uint64_t step, uint64_t forward,
		 uint64_t bytes, const char *reason);
/* has_head: "head":head (the records in [previous head, head) published first; only to a
 * daemon whose OPENED said published_cursor). */
void sp_enc_token(sw_buf *b, uint64_t seq, uint64_t index, int64_t token_id, const char *text, size_t text_len,
		  int has_position, int64_t position, int has_head, uint64_t head);
void sp_enc_checkpoint(sw_buf *b, uint64_t seq);
void sp_enc_close(sw_buf *b, uint64_t seq, uint64_t head, uint64_t drops);
void sp_enc_status(sw_buf *b);
/* Begin a RESOURCES datagram; events are appended raw by the caller, then sp_enc_finish. */
void sp_enc_begin(sw_buf *b, int type);
void sp_enc_finish(sw_buf *b);

/* ----- replies (wire.c): everything the daemon sends a client ----- */

typedef struct sp_reply {
	int type;
	int version;
	union {
		struct {
			int64_t protocol, pid, max_message;
			uint64_t max_ring_size; /* 0 when absent */
			char daemon[128];
		} welcome;
		struct {
			uint64_t session, block_size;
			int published_cursor; /* 1: the daemon takes the published cursor (PROTOCOL.md 1.4) */
			char upload[2048];    /* the object strapd uploads the stream into; "" = none */
		} opened;
		struct {
			uint64_t tail;
		} release;
		struct {
			uint64_t packets, drops, bytes_in, bytes_out, file_bytes;
		} closed;
		struct {
			char code[64];
			char message[1024];
			int fatal;
			/* memory_budget: the largest ring the budget had room for (0: none) */
			int has_fits_ring_size;
			uint64_t fits_ring_size;
		} error;
		struct {
			uint64_t seq, offset, packets, drops, tokens, last_offset, last_crc;
		} checkpointed;
	} u;
	/* STATUS_REPLY: its body, checked to hold an object "daemon" and a list "sessions". */
	const char *body;
	size_t body_len;
} sp_reply;

/* Decode one datagram from the daemon. Returns STRAP_OK or STRAP_E_PROTOCOL with a reason in
 * err. An ERROR is decoded leniently (a malformed field takes the default: code "unknown",
 * fatal true) whatever its header version, so a version-mismatch ERROR always reaches the
 * caller; any other type must carry version 1. Never allocates. */
int sp_decode_reply(const uint8_t *d, size_t n, sp_reply *r, char *err, size_t errlen);

/* ----- ring records: common/strap_ring.h; the dtype tables (record.c) ----- */

/* The strap dtype of a ggml type: > 0 for the float/integer types, 0 for the quantized ones
 * (stored as raw blocks), -1 for a type this library does not know. */
int sr_ggml_dtype(int ggml_type);

/* Pack events[*next..] into one RESOURCES datagram (as many as fit 64 KiB, at least one);
 * advances *next. Returns STRAP_OK, or STRAP_E_TOO_LARGE when events[*next] alone does not fit,
 * or STRAP_E_INVALID when one is not a JSON object with a non-empty string "event" (err says). */
int sp_pack_resources(sw_buf *b, const char *const *events, const size_t *lens, size_t n, size_t *next, char *err,
		      size_t errlen);

/* ----- errors (error.c) ----- */
void se_set(strap_error *e, int code, const char *fmt, ...) STRAP_PRINTF(3, 4);

#endif
