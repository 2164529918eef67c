/* The resume point of docs/CHECKPOINTS.md 4, client side, written once: the scan of a stream's
 * prefix against its checkpoint and the intact run past it, with the tokens of the kept prefix.
 * libstrap's src/resume.c finds its sessions' resume points with it; the Python client's
 * _speedups extension binds it in _speedups_resume.c for checkpoint.resume_point and
 * checkpoint.scan_prefix. It reads the file (pread, lseek) and the checkpoint's token log; it
 * cuts nothing (the caller cuts it). A scan allocates a few buffers of fixed size (SRS_BUF each,
 * a 256 KiB read window; at most 3.3 MiB), never more however large the file or whatever its
 * bytes say. Nothing here includes libstrap's or Python's headers. */
#ifndef STRAP_RESUME_H
#define STRAP_RESUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strap_checkpoint.h"
#include "strap_wire.h"

#define srs_resume_point strap__srs_resume_point
#define srs_freed_range strap__srs_freed_range
#define srs_token_log strap__srs_token_log

/* The scan's buffers' size: large payloads are CRC-checked through one in pieces; a packet header, the
 * file header's metadata or one line of the token log longer than this is refused (strapd writes
 * none: its control messages, which they come from, are at most 64 KiB). */
#define SRS_BUF (1 << 20)

/* Return codes. */
enum {
    SRS_OK = 0,
    SRS_REFUSED = 1,  /* the stream cannot be resumed (why says what differs); nothing changed */
    SRS_COMPLETE = 2, /* refuse_complete and a finished capture: why is the message */
    SRS_IO = 3,       /* a read failed: why names it, errno is kept */
    SRS_NOMEM = 4,
    SRS_STOPPED = 5, /* on_token returned non-zero */
};

/* Where the point came from. */
enum {
    SRS_EMPTY = 0,      /* no checkpoint and an empty file: a capture from token 0 */
    SRS_CHECKPOINT = 1, /* the prefix ends at the checkpoint */
    SRS_STREAM = 2,     /* past the checkpoint, or without one: the stream's intact run */
};

/* One token of the kept prefix, as a TOKEN packet's metadata or a list entry holds it. The
 * pointers are valid during the call only. A value is its JSON text (p NULL: absent); the
 * integer and the unescaped text are given beside it when it is one. */
typedef struct srs_token {
    uint64_t index;
    sj_val id;
    bool id_is_int;
    int64_t id_int;
    sj_val text_json;
    const char *text; /* unescaped when text_json is a string (may hold NUL); else NULL */
    size_t text_len;
    sj_val position; /* absent: the token's index is its position */
    bool position_is_int;
    int64_t position_int;
    bool listed; /* from 1.3.1's "tokens" list or the token log (a freed prefix), not a packet */
} srs_token;

/* Called with each token of the kept prefix, index 0 first, in order; non-zero stops the scan
 * (SRS_STOPPED). On any return other than SRS_OK the tokens given are not a prefix to keep. */
typedef int (*srs_token_fn)(void *user, const srs_token *t);

typedef struct srs_params {
    int fd;           /* the stream, open for reading; its offset is kept */
    const char *path; /* the stream's path, for messages */
    /* The checkpoint (sck_parse'd; NULL: none), the floor: its prefix must be exactly what it
     * says. ck_path: its file, whose token log ("<ck_path>.tokens.jsonl") vouches for a freed
     * prefix's tokens (NULL: none). tokens131: 1.3.1's "tokens" list the checkpoint carries, as
     * JSON text (NULL: none), the other copy of a freed prefix's tokens. */
    const sck_checkpoint *ck;
    const char *ck_path;
    const char *tokens131;
    size_t tokens131_len;
    /* This capture's fingerprint: the stream header (and the checkpoint) must carry it. NULL:
     * not compared (with a checkpoint only: the header must carry the checkpoint's). */
    const char *want_fingerprint;
    /* Keep at most this many tokens (a job's common point, docs/DISTRIBUTED.md D3), before the
     * checkpoint too (whose prefix is checked in full first). < 0: no limit. */
    int64_t limit;
    /* Check the checkpoint's prefix only (ck required): no walk past it, no limit. */
    bool prefix_only;
    /* A finished capture (no checkpoint; an END "complete" follows the point): SRS_COMPLETE.
     * false: SRS_OK, with complete set and the message in why all the same. */
    bool refuse_complete;
    srs_token_fn on_token; /* may be NULL */
    void *user;
} srs_params;

typedef struct srs_result {
    /* The prefix to keep, in the checkpoint's terms. */
    uint64_t stream_offset, packets, drops, last_seq, last_packet_offset, last_packet_crc, token_count, forward_count;
    int source;            /* SRS_EMPTY, SRS_CHECKPOINT, SRS_STREAM */
    uint64_t size;         /* the file's size */
    uint64_t first_packet; /* the end of the file header (0: SRS_EMPTY) */
    /* Bytes of the checkpointed prefix freed after their upload (holes), [freed_from, freed_to). */
    bool freed;
    uint64_t freed_from, freed_to;
    /* An END "complete" follows the point (no checkpoint): a finished capture. end_offset: the
     * END's; cut_*: what a cut at the point would drop (bytes to the end of the file; the
     * TENSOR, DROP and TOKEN packets before the END; the TOKENs among them). */
    bool complete;
    uint64_t end_offset, cut_bytes, cut_packets, cut_tokens;
} srs_result;

/* Find the resume point of p->fd (docs/CHECKPOINTS.md 4). Every packet of the checkpointed prefix
 * is read whole: its framing, header fields and metadata by the stream reader's rules
 * (STREAM_FORMAT.md 3), its CRC32C against its bytes; then the counts, TOKENs numbered 0..n-1, the
 * last packet's offset, seq and CRC. A prefix whose start was freed (srs_freed_range) is checked
 * by its last packet and its tokens' other copy (1.3.1's list, else the token log). Past it the
 * intact run of TENSOR, DROP and TOKEN packets is kept up to its last TOKEN (or TOKEN limit - 1).
 * Returns SRS_OK with *r filled, or a code with the reason in why (Python's messages; the
 * stream's path in front). */
int srs_resume_point(const srs_params *p, srs_result *r, char *why, size_t whylen);

/* The tokens p->ck's token log ("<p->ck_path>.tokens.jsonl") vouches for, given to p->on_token
 * one by one, index 0 first: its first log_bytes bytes, CRC32C-checked before any token is given,
 * holding exactly log_tokens lines of JSON numbered 0..n-1 (the checks a freed prefix's resume
 * makes; bytes past log_bytes are not read). Only p->path (for messages), p->ck, p->ck_path,
 * p->on_token and p->user are used. Returns SRS_OK, SRS_REFUSED (no log, or one that does not
 * hold what the checkpoint says; why names it), SRS_IO, SRS_NOMEM or SRS_STOPPED. */
int srs_token_log(const srs_params *p, char *why, size_t whylen);

/* The bytes of [start, end) of the file behind fd freed by strapd's --upload-free-local (holes):
 * from the first hole to the end of the last one before end. Found with lseek(SEEK_HOLE/SEEK_DATA),
 * never from the bytes (zeros written are data); a file system without SEEK_HOLE has none. The
 * descriptor's offset is kept. Returns 1 (found, [*from, *to)), 0 (none) or -1 (errno). */
int srs_freed_range(int fd, uint64_t start, uint64_t end, uint64_t *from, uint64_t *to);

#endif
