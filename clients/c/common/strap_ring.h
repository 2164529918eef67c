/*
 * The ring layout of docs/PROTOCOL.md 2, written once for the client side: the 4096-byte
 * RingHeader, and the TENSOR, PAD and TOKEN record headers. libstrap (src/open.c,
 * src/session.c, through src/internal.h) and the Python client's extension (_speedups.c,
 * whose constants and encoders _ring.py and _session.py use) both place records with these
 * functions; strapd's reader (internal/shm) is the other side, and the golden records of
 * testdata/ring hold the two together (clients/c/tests/test_golden.c,
 * clients/python/tests/test_golden_wire.py).
 *
 * Plain C99, header-only (static inline: nothing to link, no symbol a host program could
 * clash with), little-endian stores byte by byte (any host), no allocation.
 */
#ifndef STRAP_RING_H
#define STRAP_RING_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    /* RingHeader: magic "SRNG", version, ring_size, data_offset, data_size, then the
     * published cursor; the data region starts here. */
    SR_HEADER_SIZE = 4096,
    SR_RING_VERSION = 1,
    /* RingHeader offset of the published cursor: a u64 stored with release semantics once
     * every record below it is complete (PROTOCOL.md 1.4). */
    SR_PUBLISHED_OFFSET = 32,
    /* A record's fixed header; shape, name and meta follow, padded to a 64-byte boundary. */
    SR_RECORD_FIXED = 80,
    /* seq, record_len, step and forward: four u64 from this offset of a record. Of two whole
     * records of one module output with one dtype and shape, only seq, step and forward differ
     * (sr_put_record_fields). */
    SR_SEQ_OFFSET = 8,
    /* A TOKEN record's text starts here. */
    SR_TOKEN_PAYLOAD_OFFSET = 128,
    SR_KIND_TENSOR = 1,
    SR_KIND_PAD = 2,
    SR_KIND_TOKEN = 3,
    SR_FLAG_PART = 1,
    /* A TENSOR record whose payload is the tensor already coded as fp8 (PROTOCOL.md 2, "FP8
     * records"; strapd's internal/shm FlagFP8). libstrap writes none; the Python client does. */
    SR_FLAG_FP8 = 2,
    /* An FP8 payload's header: u32 block_values, u32 parts, u32 status, u32 reserved. */
    SR_FP8_HEADER = 16,
    /* FP8 status bits: why a record carries no codes (strapd writes a DROP for it). */
    SR_FP8_NONFINITE = 1,
    SR_FP8_TINY_SCALE = 2,
    SR_FP8_OVER_BOUND = 4,
    SR_MAX_NAME = 4096,
    SR_MAX_META = 65536,
    SR_MAX_NDIM = 8,
    SR_MAX_TOKEN_TEXT = 65536,
};

static inline void
sr_put_le16(uint8_t *p, uint64_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void
sr_put_le32(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void
sr_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t
sr_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint64_t
sr_align64(uint64_t n)
{
    return (n + 63) & ~(uint64_t)63;
}

/* Bytes from a record's start to its payload (payload_off): 64-aligned. */
static inline uint64_t
sr_header_area(int ndim, size_t name_len, size_t meta_len)
{
    return sr_align64(SR_RECORD_FIXED + 8 * (uint64_t)ndim + name_len + meta_len);
}

/* Ring bytes of a TOKEN record whose text is text_len bytes. */
static inline uint64_t
sr_token_record_len(size_t text_len)
{
    return SR_TOKEN_PAYLOAD_OFFSET + sr_align64(text_len);
}

/* Row parts of an FP8 record's tensor: n values in rows of row_len, cut into blocks of
 * block_values values; every row begun in a block is one part of it (COMPRESSION.md 5.1). */
static inline uint64_t
sr_fp8_parts(uint64_t n, uint64_t row_len, uint64_t block_values)
{
    uint64_t p = 0;
    if (!n || !row_len || !block_values)
        return 0;
    for (uint64_t off = 0; off < n; off += block_values) {
        uint64_t nb = n - off < block_values ? n - off : block_values;
        uint64_t into = off % row_len, first = row_len - into < nb ? row_len - into : nb;
        uint64_t row = row_len < nb ? row_len : nb;
        p += 1 + (nb - first + row - 1) / row;
    }
    return p;
}

/* payload_len of an FP8 record of n values in parts row parts: the header, the f32 scales
 * padded to 8, four f64 sums a part, the n codes. */
static inline uint64_t
sr_fp8_payload_len(uint64_t n, uint64_t parts)
{
    return ((SR_FP8_HEADER + 4 * parts + 7) & ~(uint64_t)7) + 32 * parts + n;
}

/* The 4096-byte RingHeader of a ring of ring_size bytes (4096 + a positive multiple of 64). */
static inline void
sr_encode_ring_header(uint8_t *dst, uint64_t ring_size)
{
    memset(dst, 0, SR_HEADER_SIZE);
    memcpy(dst, "SRNG", 4);
    sr_put_le32(dst + 4, SR_RING_VERSION);
    sr_put_le64(dst + 8, ring_size);
    sr_put_le64(dst + 16, SR_HEADER_SIZE);
    sr_put_le64(dst + 24, ring_size - SR_HEADER_SIZE);
}

/* The fields in which records of one layout differ, and record_len between them (so that one
 * run of stores writes all four). */
static inline void
sr_put_record_fields(uint8_t *rec, uint64_t seq, uint64_t record_len, uint64_t step, uint64_t forward)
{
    sr_put_le64(rec + SR_SEQ_OFFSET, seq);
    sr_put_le64(rec + SR_SEQ_OFFSET + 8, record_len);
    sr_put_le64(rec + SR_SEQ_OFFSET + 16, step);
    sr_put_le64(rec + SR_SEQ_OFFSET + 24, forward);
}

/* A TENSOR record's header area (fixed part, shape, name, meta), zero padded to payload_off.
 * The caller has checked ndim (<= SR_MAX_NDIM), name_len (1..SR_MAX_NAME) and meta_len
 * (<= SR_MAX_META). */
static inline void
sr_encode_record_header(uint8_t *dst, int dtype, const uint64_t *shape, int ndim, uint64_t seq, uint64_t record_len,
                        uint64_t step, uint64_t forward, uint64_t payload_len, const char *name, size_t name_len,
                        const char *meta, size_t meta_len, uint64_t part_offset, uint64_t tensor_len, int part)
{
    uint64_t off = sr_header_area(ndim, name_len, meta_len);
    memcpy(dst, "SREC", 4);
    sr_put_le16(dst + 4, SR_KIND_TENSOR);
    dst[6] = (uint8_t)dtype;
    dst[7] = (uint8_t)ndim;
    sr_put_record_fields(dst, seq, record_len, step, forward);
    sr_put_le64(dst + 40, off);
    sr_put_le64(dst + 48, payload_len);
    sr_put_le16(dst + 56, name_len);
    sr_put_le16(dst + 58, part ? SR_FLAG_PART : 0);
    sr_put_le32(dst + 60, meta_len);
    sr_put_le64(dst + 64, part_offset);
    sr_put_le64(dst + 72, tensor_len);
    uint8_t *p = dst + SR_RECORD_FIXED;
    for (int i = 0; i < ndim; i++, p += 8)
        sr_put_le64(p, shape[i]);
    memcpy(p, name, name_len);
    p += name_len;
    if (meta_len)
        memcpy(p, meta, meta_len);
    p += meta_len;
    memset(p, 0, (size_t)(dst + off - p));
}

/* Set a TENSOR record's flags (SR_FLAG_PART, SR_FLAG_FP8) after sr_encode_record_header, which
 * writes PART or none. */
static inline void
sr_set_record_flags(uint8_t *rec, unsigned flags)
{
    sr_put_le16(rec + 58, flags);
}

/* A PAD record's header: magic, kind and record_len, the rest zero. Only min(80, record_len)
 * bytes are written: a PAD may be one 64-byte slot at the very end of the region, where the
 * header's zero tail would run past the mapping (strapd reads only those three fields). */
static inline void
sr_encode_pad(uint8_t *dst, uint64_t record_len)
{
    uint8_t h[SR_RECORD_FIXED] = {'S', 'R', 'E', 'C'};
    sr_put_le16(h + 4, SR_KIND_PAD);
    sr_put_le64(h + 16, record_len);
    memcpy(dst, h, record_len < sizeof h ? (size_t)record_len : sizeof h);
}

/* A whole TOKEN record (sr_token_record_len(text_len) bytes): the token's index in step, its
 * position in forward and its id in part_offset (both two's complement), the text as payload
 * at SR_TOKEN_PAYLOAD_OFFSET; every other byte zero. text_len <= SR_MAX_TOKEN_TEXT. */
static inline void
sr_encode_token_record(uint8_t *dst, uint64_t seq, uint64_t index, int64_t token_id, int64_t position, const char *text,
                       size_t text_len)
{
    uint64_t n = sr_token_record_len(text_len);
    memset(dst, 0, SR_TOKEN_PAYLOAD_OFFSET);
    memcpy(dst, "SREC", 4);
    sr_put_le16(dst + 4, SR_KIND_TOKEN);
    sr_put_record_fields(dst, seq, n, index, (uint64_t)position);
    sr_put_le64(dst + 40, SR_TOKEN_PAYLOAD_OFFSET);
    sr_put_le64(dst + 48, text_len);
    sr_put_le64(dst + 64, (uint64_t)token_id);
    if (text_len)
        memcpy(dst + SR_TOKEN_PAYLOAD_OFFSET, text, text_len);
    memset(dst + SR_TOKEN_PAYLOAD_OFFSET + text_len, 0, (size_t)(n - SR_TOKEN_PAYLOAD_OFFSET - text_len));
}

#endif
