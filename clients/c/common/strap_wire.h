/* The control messages of docs/PROTOCOL.md 1, client side, written once: the JSON reader
 * (strap_json.c: strict validation, then lookups) and writer, the encoder of every body a
 * client sends and the decoder of every reply (strap_wire.c). libstrap builds its sessions on
 * them (the Python client's too); the _speedups extension exposes them to the Python tests'
 * typed bodies (tests/wire.py). Nothing here allocates; nothing includes libstrap's or Python's headers. */
#ifndef STRAP_WIRE_H
#define STRAP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every symbol carries libstrap's internal prefix: a static libstrap.a shares one namespace
 * with its host program (and the Python extension compiles them hidden). */
#define sj_validate strap__sj_validate
#define sj_kind strap__sj_kind
#define sj_get strap__sj_get
#define sj_u64 strap__sj_u64
#define sj_i64 strap__sj_i64
#define sj_bool strap__sj_bool
#define sj_str strap__sj_str
#define sj_strn strap__sj_strn
#define sj_array_next strap__sj_array_next
#define sj_object_next strap__sj_object_next
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
#define sp_decode_frame strap__sp_decode_frame
#define sp_decode_reply strap__sp_decode_reply
#define sp_pack_resources strap__sp_pack_resources
#define sp_type_name strap__sp_type_name

/* Return codes, the values of libstrap's STRAP_OK, STRAP_E_INVALID, STRAP_E_PROTOCOL and
 * STRAP_E_TOO_LARGE (strap.h), which libstrap passes on as they are. */
enum {
    SP_OK = 0,
    SP_E_INVALID = -1,
    SP_E_PROTOCOL = -6,
    SP_E_TOO_LARGE = -10,
};

/* ----- protocol constants (docs/PROTOCOL.md 1.1) ----- */
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

/* "HELLO" ... "RESOURCES"; "unknown" for any other number. */
const char *sp_type_name(int type);

/* ----- JSON reading (strap_json.c): validation without allocation, then member lookup ----- */

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
 * is not a string. *full (may be NULL) is set false when it was truncated. The unescaped text
 * is never longer than v.n bytes. */
bool sj_str(sj_val v, char *out, size_t cap, bool *full);
/* sj_str, and the unescaped length in *len (may be NULL): a string may hold \u0000. */
bool sj_strn(sj_val v, char *out, size_t cap, bool *full, size_t *len);
/* Iterate an array: *it starts at v.p; returns false at the end. */
bool sj_array_next(sj_val arr, const char **it, sj_val *elem);
/* Iterate an object's members: *it starts at v.p; key is the member's name as a JSON string
 * (sj_str unescapes it), val its value; returns false at the end. */
bool sj_object_next(sj_val obj, const char **it, sj_val *key, sj_val *val);
/* Every byte sequence is valid UTF-8 (no surrogates, no overlongs). */
bool sp_utf8_valid(const char *s, size_t n);

/* ----- JSON / message writing (strap_wire.c) into a fixed buffer, never allocating ----- */

typedef struct sw_buf {
    char *p;
    size_t n, cap;
    bool overflow;
} sw_buf;

void sw_raw(sw_buf *b, const void *s, size_t n);
void sw_lit(sw_buf *b, const char *s);
void sw_u64(sw_buf *b, uint64_t v);
void sw_i64(sw_buf *b, int64_t v);
/* The shortest decimal that reads back as v, laid out as Python's repr writes it (fixed
 * notation from 1e-4 up to 1e16, with ".0" on a whole number; else d.ddde+XX). */
void sw_f64(sw_buf *b, double v);
/* A JSON string of n bytes of UTF-8 (escaped as Python's json.dumps(ensure_ascii=False)). */
void sw_str(sw_buf *b, const char *s, size_t n);

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

/* Pack events[*next..] into one RESOURCES datagram (as many as fit 64 KiB, at least one);
 * advances *next. Returns SP_OK, or SP_E_TOO_LARGE when events[*next] alone does not fit,
 * or SP_E_INVALID when one is not a JSON object with a non-empty string "event" (err says). */
int sp_pack_resources(sw_buf *b, const char *const *events, const size_t *lens, size_t n, size_t *next, char *err,
                      size_t errlen);

/* ----- replies (strap_wire.c): everything the daemon sends a client ----- */

typedef struct sp_reply {
    int type;
    int version;
    union {
        struct {
            int64_t protocol, pid, max_message;
            int has_max_ring_size;
            uint64_t max_ring_size; /* 0 when absent */
            char daemon[128];       /* truncated; daemon_json: the whole string as sent */
            sj_val daemon_json;
        } welcome;
        struct {
            uint64_t session, block_size;
            /* published_cursor, ring_tokens: 1 when true (PROTOCOL.md 1.4); has_*: the field
             * was sent (a boolean, not null) */
            int published_cursor, has_published_cursor;
            int ring_tokens, has_ring_tokens;
            char upload[2048]; /* the object strapd uploads the stream into; "" = none */
        } opened;
        struct {
            uint64_t tail;
        } release;
        struct {
            uint64_t packets, drops, bytes_in, bytes_out, file_bytes;
            char upload[2048]; /* "" = none */
        } closed;
        struct {
            char code[64];
            char message[1024]; /* truncated; message_json: the whole string (p NULL: none) */
            sj_val message_json;
            int fatal;
            /* memory_budget: the largest ring the budget had room for (0: none) */
            int has_fits_ring_size;
            uint64_t fits_ring_size;
        } error;
        struct {
            uint64_t seq, offset, packets, drops, tokens, last_offset, last_crc;
        } checkpointed;
    } u;
    /* The body as validated: an object (STATUS_REPLY's is checked to hold an object "daemon",
     * and lists of objects "sessions" and "uploads" where present). */
    const char *body;
    size_t body_len;
} sp_reply;

/* The framing of any message (PROTOCOL.md 1.1): magic, length, a body that is one valid JSON
 * object (*body: that object without surrounding white space). Any version. Returns SP_OK or
 * SP_E_PROTOCOL with a reason in err. */
int sp_decode_frame(const uint8_t *d, size_t n, int *version, int *type, sj_val *body, char *err, size_t errlen);

/* Decode one datagram from the daemon. Returns SP_OK or SP_E_PROTOCOL with a reason in err.
 * Fields the decoder does not know are ignored (PROTOCOL.md 1.1: forward compatible); an
 * optional field sent as null counts as absent. An ERROR is decoded leniently (a malformed
 * field takes the default: code "unknown", message "", fatal true) whatever its header
 * version, so a version-mismatch ERROR always reaches the caller; any other type must carry
 * version 1. Never allocates. */
int sp_decode_reply(const uint8_t *d, size_t n, sp_reply *r, char *err, size_t errlen);

#endif
