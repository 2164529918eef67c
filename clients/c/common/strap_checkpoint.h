/* The checkpoint file of docs/CHECKPOINTS.md 3, client side, written once: its encoder and its
 * parser with the format's rules (the same as internal/checkpoint Parse; the golden files of
 * testdata/checkpoint hold Go, libstrap and the Python client to them). libstrap's
 * src/checkpoint.c writes and reads its checkpoints with them; the Python client's _speedups
 * extension compiles this file and binds it in _speedups_checkpoint.c for checkpoint.py. The
 * durable writes are here too, one for both clients: the atomic replace of a file (temp file,
 * fsync, rename, directory fsync), the durable unlink, and the token log's append + fdatasync.
 * Reading the file and the token log's bookkeeping (its extent, its CRC32C) stay with each
 * client. Nothing here allocates; nothing includes libstrap's or Python's headers. */
#ifndef STRAP_CHECKPOINT_H
#define STRAP_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strap_wire.h"

#define sck_parse strap__sck_parse
#define sck_encode strap__sck_encode
#define sck_check strap__sck_check
#define sck_format_key strap__sck_format_key
#define sck_rfc3339 strap__sck_rfc3339
#define sck_write_atomic strap__sck_write_atomic
#define sck_fsync_dir strap__sck_fsync_dir
#define sck_unlink_durable strap__sck_unlink_durable
#define sck_append_sync strap__sck_append_sync

/* The largest checkpoint file read or written, as internal/checkpoint MaxSize: 1.3.1's
 * "tokens" list (about 80 bytes a token) is what makes a checkpoint large. */
#define SCK_MAX_SIZE (64 << 20)

/* A checkpoint's facts. stream and fingerprint are NUL-terminated (at most 4095 and 1023
 * bytes: a longer one is refused); the rest are the file's numbers. */
typedef struct sck_checkpoint {
    char stream[4096];
    char fingerprint[1024];
    uint64_t stream_offset, packets, drops, last_seq, last_packet_offset, last_packet_crc, token_count, forward_count;
    /* "token_log": how much of the token log beside the checkpoint it vouches for */
    bool has_token_log;
    uint64_t log_tokens, log_bytes, log_crc32c;
    /* Parsed only (the encoder takes them as arguments), spans into the parsed bytes:
     * "created" as a JSON string (p NULL: absent or null) and 1.3.1's "tokens" list as a JSON
     * array (p NULL: none, or not a list), whose entries listed_tokens counts (-1: none). */
    sj_val created, tokens;
    int64_t listed_tokens;
} sck_checkpoint;

/* One member beside the format's (a 1.3.1 key such as "metadata", or one a later version
 * adds): its name (UTF-8, unescaped) and its value as JSON text. Also one entry of 1.3.1's
 * "tokens" list (key unused). */
typedef struct sck_member {
    const char *key;
    size_t key_len;
    const char *json;
    size_t json_len;
} sck_member;

/* Parse and check a checkpoint file's n bytes: strict JSON (strap_json.c), the required
 * fields, their types and ranges, and the numbers' consistency. Unknown members are allowed
 * (sj_object_next over the document finds them; sck_format_key tells them apart). Returns 0,
 * or -1 with a reason naming the field and its value in why (truncated to whylen). */
int sck_parse(const char *buf, size_t n, sck_checkpoint *c, char *why, size_t whylen);

/* The rules on the numbers alone (sck_parse applies them; sck_encode refuses to write what
 * breaks them). 0, or -1 with the reason in why. */
int sck_check(const sck_checkpoint *c, char *why, size_t whylen);

/* Whether a member's name (UTF-8, unescaped, n bytes) is one of the format's own, which the
 * parser reads into sck_checkpoint ("tokens" included) and the encoder writes itself. */
bool sck_format_key(const char *key, size_t n);

/* Write the checkpoint file: compact JSON, the format's members in the order of Go's
 * checkpoint.Checkpoint (format, version, stream, created, fingerprint, the numbers,
 * token_log when there is one), then extra (each value must be one JSON value, each name
 * one that is not the format's), then, when tokens is not NULL, 1.3.1's "tokens" list of
 * ntokens entries (each one JSON object as the client encodes a token; not validated: the
 * list may hold 64 MiB), and a newline. created is written as given (sck_rfc3339 makes one).
 * Returns 0, or -1 with the reason in why: numbers that break sck_check, an extra member
 * that is not valid, or b too small (b->overflow). */
int sck_encode(sw_buf *b, const sck_checkpoint *c, const char *created, const sck_member *extra, size_t nextra,
               const sck_member *tokens, size_t ntokens, char *why, size_t whylen);

/* The current UTC time, RFC 3339 with microseconds ("2026-12-06T16:25:26.117819Z"), into out
 * (at least 32 bytes). */
void sck_rfc3339(char *out, size_t cap);

/* ----- durable files (docs/CHECKPOINTS.md 3) -----
 * Each returns 0, or -errno with why (truncated to whylen; why may be NULL) naming the step,
 * the path it acted on and the system's reason, e.g. "rename /d/x.tmp.42 to /d/x: No space
 * left on device". Paths are at most SCK_PATH_MAX - 1 bytes (-ENAMETOOLONG past that). They
 * call no allocator and hold no lock: the Python binding lets the GIL go around them. */
#define SCK_PATH_MAX 4096

/* Replace path with data's n bytes atomically and durably: a temp file beside it
 * ("PATH.tmp.PID", created with mode before the umask, O_CLOEXEC), every byte written
 * (EINTR retried), fsync, close, rename over path, fsync of the directory. On a failure before
 * the rename the temp file is removed and path is untouched; after it (the directory's fsync)
 * path holds the new bytes, which a crash may still undo. A crash at any point leaves either
 * the old file or the new one, never a mix. */
int sck_write_atomic(const char *path, const void *data, size_t n, int mode, char *why, size_t whylen);

/* fsync the directory that holds path (the part before its last '/'; "." when none), which
 * makes a rename, a creation or an unlink of path durable. */
int sck_fsync_dir(const char *path, char *why, size_t whylen);

/* Remove path and make the removal durable (sck_fsync_dir). -ENOENT when there is none. */
int sck_unlink_durable(const char *path, char *why, size_t whylen);

/* Append data's n bytes to fd (opened O_APPEND; EINTR retried until every byte is written),
 * then fdatasync: the token log's step at each checkpoint. name (may be NULL) is the file's
 * path, for why. On a failure part of the bytes may have been written: the caller must not
 * append after them (the Python client rewrites the whole log with sck_write_atomic). */
int sck_append_sync(int fd, const char *name, const void *data, size_t n, char *why, size_t whylen);

#endif
