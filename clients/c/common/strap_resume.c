/* The resume point of docs/CHECKPOINTS.md 4 (strap_resume.h). libstrap and the Python client's
 * _speedups extension both compile this file. The packet rules are the stream reader's
 * (clients/python/src/llm_instrumentation/stream.py _parse and _check_fields, Go's
 * internal/stream checkFields), and the messages are the ones the Python client raised before it
 * bound this file, which its tests match. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <nmmintrin.h>
#define SRS_HW_CRC 1
#endif

#include "strap_resume.h"

enum {
    READ_AHEAD = 256 << 10,
    PKT_FIXED = 96,
    FILE_FIXED = 24,
    T_TENSOR = 1,
    T_DROP = 2,
    T_TOKEN = 3,
    T_INDEX = 4,
    T_END = 5
};
#define MAX_BLOCK_SIZE (64u << 20)

/* Element sizes by dtype id (docs/STREAM_FORMAT.md 3; _dtypes.py DTYPES); 0: unknown. */
static const uint8_t dtype_size[] = {0, 4, 2, 2, 8, 1, 1, 2, 4, 8, 1, 1, 1};
static const char *const dtype_names[] = {"",     "float32",       "float16",    "bfloat16", "float64",
                                          "int8", "uint8",         "int16",      "int32",    "int64",
                                          "bool", "float8_e4m3fn", "float8_e5m2"};
static const char *const type_names[] = {"", "TENSOR", "DROP", "TOKEN", "INDEX", "END"};

/* ----- the scan's state ----- */

typedef struct scan {
    const srs_params *p;
    char *why;
    size_t whylen;
    uint8_t *buf; /* SRS_BUF bytes */
    uint8_t *win; /* READ_AHEAD bytes of the file from woff (wlen of them read) */
    uint64_t woff, wlen;
    uint64_t size, first;
    bool hw;
    uint32_t table[256];
    sj_val meta; /* the file header's metadata, in buf until the walk reuses it */
} scan;

/* One packet as parsed: its fixed header's fields, and its name and metadata in the window or
 * s->buf (until the next packet is read). */
typedef struct pkt {
    uint64_t off, end, seq, step, forward, raw_len, stored_len, part_offset, tensor_len;
    uint32_t type, dtype, ndim, header_len, name_len, codec, flags, meta_len, crc, block_size;
    uint64_t shape[8];
    sj_val meta;
} pkt;

static int
fail(scan *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (s->why && s->whylen)
        vsnprintf(s->why, s->whylen, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t
le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ----- CRC32C (Castagnoli), as every stream packet carries it ----- */

#ifdef SRS_HW_CRC
__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t crc, const uint8_t *b, size_t n)
{
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t v;
        memcpy(&v, b, 8);
        c = _mm_crc32_u64(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *b++);
    return ~c32;
}
#endif

/* Continue a CRC32C (start with 0) over n bytes. */
static uint32_t
crc32c(const scan *s, uint32_t crc, const void *p, size_t n)
{
    const uint8_t *b = p;
#ifdef SRS_HW_CRC
    if (s->hw)
        return crc_hw(crc, b, n);
#endif
    crc = ~crc;
    while (n--)
        crc = s->table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void
crc_init(scan *s)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        s->table[i] = c;
    }
#ifdef SRS_HW_CRC
    unsigned a, b, c, d;
    s->hw = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
#endif
}

/* ----- reading ----- */

/* All n bytes at off, EINTR retried; false on EOF or an error (errno 0 on EOF). */
static bool
pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0;
            return false;
        }
        done += (size_t)r;
    }
    return true;
}

static int
io_fail(scan *s, const char *what, uint64_t off)
{
    if (errno == 0)
        return fail(s, SRS_REFUSED, "%s: the file changed while it was read (%s at %" PRIu64 ")", s->p->path, what,
                    off);
    return fail(s, SRS_IO, "%s: read %s at %" PRIu64 ": %s", s->p->path, what, off, strerror(errno));
}

/* Python's repr of a str (quotes, escapes), which its messages used. */
static void
repr_str(char *out, size_t cap, const char *str, size_t n)
{
    bool sq = memchr(str, '\'', n) != NULL, dq = memchr(str, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    size_t o = 0;
    if (cap < 8) {
        if (cap)
            out[0] = 0;
        return;
    }
    out[o++] = q;
    for (size_t i = 0; i < n && o + 6 < cap; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c == '\\' || c == (unsigned char)q)
            o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
        else if (c == '\n')
            o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (c == '\r')
            o += (size_t)snprintf(out + o, cap - o, "\\r");
        else if (c == '\t')
            o += (size_t)snprintf(out + o, cap - o, "\\t");
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o++] = q;
    out[o] = 0;
}

/* Python's repr of 8 bytes (a magic). */
static void
repr_bytes(char *out, size_t cap, const uint8_t *b, size_t n)
{
    size_t o = (size_t)snprintf(out, cap, "b'");
    for (size_t i = 0; i < n && o + 6 < cap; i++) {
        if (b[i] == '\\' || b[i] == '\'')
            o += (size_t)snprintf(out + o, cap - o, "\\%c", b[i]);
        else if (b[i] == '\n' || b[i] == '\r' || b[i] == '\t')
            o += (size_t)snprintf(out + o, cap - o, "\\%c", b[i] == '\n' ? 'n' : b[i] == '\r' ? 'r' : 't');
        else if (b[i] < 0x20 || b[i] >= 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", b[i]);
        else
            out[o++] = (char)b[i];
    }
    snprintf(out + o, cap - o, "'");
}

/* The file header (STREAM_FORMAT.md 2), as StreamReader._read_header checks it: s->first and
 * s->meta set. On failure the stream reader's reason in why (after "{path}: "). */
static int
read_header(scan *s)
{
    const char *path = s->p->path;
    uint8_t h[FILE_FIXED];
    if (s->size < FILE_FIXED)
        return fail(s, SRS_REFUSED, "%s: %" PRIu64 " bytes is too short for a stream header", path, s->size);
    if (!pread_all(s->p->fd, h, FILE_FIXED, 0))
        return io_fail(s, "the file header", 0);
    if (memcmp(h, "STRAPSTM", 8) != 0) {
        char r[64];
        repr_bytes(r, sizeof r, h, 8);
        return fail(s, SRS_REFUSED, "%s: bad file magic %s%s", path, r,
                    memcmp(h, "ST", 2) != 0 ? " (an llm_instrumentation 1.3.1 stream? open it with open_stream)" : "");
    }
    uint64_t version = le(h + 8, 2), meta_len = le(h + 12, 4), end = FILE_FIXED + meta_len, pad = (end + 7) / 8 * 8;
    if (version != 2)
        return fail(s, SRS_REFUSED, "%s: stream version %" PRIu64 ", this reader reads 2", path, version);
    if (end > s->size)
        return fail(s, SRS_REFUSED, "%s: metadata of %" PRIu64 " bytes runs past the end of the file", path, meta_len);
    if (pad > s->size)
        return fail(s, SRS_REFUSED, "%s: file header padding runs past the end of the file", path);
    if (pad - FILE_FIXED > SRS_BUF)
        return fail(s, SRS_REFUSED, "%s: metadata of %" PRIu64 " bytes is more than a client reads (%d)", path,
                    meta_len, SRS_BUF);
    if (!pread_all(s->p->fd, s->buf, (size_t)(pad - FILE_FIXED), FILE_FIXED))
        return io_fail(s, "the file header", FILE_FIXED);
    uint32_t got = crc32c(s, crc32c(s, 0, h, 16), s->buf, (size_t)meta_len), stored = (uint32_t)le(h + 16, 4);
    if (got != stored)
        return fail(s, SRS_REFUSED, "%s: file header CRC mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 ")",
                    path, stored, got);
    char jwhy[96];
    if (meta_len && !sj_validate((const char *)s->buf, (size_t)meta_len, jwhy, sizeof jwhy))
        return fail(s, SRS_REFUSED, "%s: metadata is not JSON: %s", path, jwhy);
    if (meta_len && sj_kind((sj_val){(const char *)s->buf, (size_t)meta_len}) != '{')
        return fail(s, SRS_REFUSED, "%s: metadata is not a JSON object", path);
    if (le(h + 20, 4))
        return fail(s, SRS_REFUSED, "%s: file header reserved field 0x%" PRIx64, path, le(h + 20, 4));
    for (uint64_t i = meta_len; i < pad - FILE_FIXED; i++)
        if (s->buf[i])
            return fail(s, SRS_REFUSED, "%s: file header padding not zero", path);
    s->first = pad;
    s->meta = (sj_val){(const char *)s->buf, (size_t)meta_len};
    return SRS_OK;
}

/* The stream header's client_metadata.fingerprint, repr'd as Python printed it (None: none). */
static void
header_fingerprint(const scan *s, char *fp, size_t cap, bool *has, char *repr, size_t rcap)
{
    sj_val cm, v;
    size_t n = 0;
    bool full = false;
    *has = s->meta.n && sj_get(s->meta, "client_metadata", &cm) && sj_kind(cm) == '{' &&
           sj_get(cm, "fingerprint", &v) && sj_strn(v, fp, cap, &full, &n) && full && strlen(fp) == n;
    if (*has)
        repr_str(repr, rcap, fp, n);
    else
        snprintf(repr, rcap, "None"), fp[0] = 0;
}

/* The rules tying a packet's header fields together (stream.py _check_fields, Go checkFields):
 * true, or false with the reason in out. */
static bool
check_fields(const pkt *k, char *out, size_t cap)
{
    uint32_t t = k->type;
    if (k->flags & ~1u) {
        snprintf(out, cap, "flags %#x", k->flags);
        return false;
    }
    bool part = k->flags & 1;
    if (t == T_TENSOR || t == T_DROP) {
        if (k->seq == 0) {
            snprintf(out, cap, "seq 0");
            return false;
        }
        if (part) {
            if (k->part_offset > k->tensor_len || k->raw_len > k->tensor_len - k->part_offset) {
                snprintf(out, cap, "part [%" PRIu64 ",+%" PRIu64 ") outside tensor_len %" PRIu64, k->part_offset,
                         k->raw_len, k->tensor_len);
                return false;
            }
        } else if (k->part_offset != 0 || k->tensor_len != k->raw_len) {
            snprintf(out, cap, "not PART but part_offset %" PRIu64 ", tensor_len %" PRIu64 ", raw_len %" PRIu64,
                     k->part_offset, k->tensor_len, k->raw_len);
            return false;
        }
        if (t == T_TENSOR || k->dtype) {
            if (k->dtype == 0 || k->dtype >= sizeof dtype_size) {
                snprintf(out, cap, "dtype %u", k->dtype);
                return false;
            }
            uint64_t n = dtype_size[k->dtype];
            bool over = false;
            for (uint32_t i = 0; i < k->ndim; i++) {
                if (k->shape[i] && n > UINT64_MAX / k->shape[i])
                    over = true;
                n = over ? 0 : n * k->shape[i];
            }
            if (over || n != k->tensor_len) {
                size_t o = (size_t)snprintf(out, cap, "shape (");
                for (uint32_t i = 0; i < k->ndim && o < cap; i++)
                    o += (size_t)snprintf(out + o, cap - o, "%s%" PRIu64, i ? ", " : "", k->shape[i]);
                if (o < cap)
                    snprintf(out + o, cap - o, "%s) of %s is not tensor_len %" PRIu64 " bytes", k->ndim == 1 ? "," : "",
                             dtype_names[k->dtype], k->tensor_len);
                return false;
            }
        }
        if (t == T_DROP && (k->stored_len || k->codec || k->block_size)) {
            snprintf(out, cap, "DROP with payload/codec");
            return false;
        }
    } else {
        if (part || k->raw_len != k->stored_len || k->codec || k->block_size || k->part_offset ||
            k->tensor_len != k->raw_len) {
            snprintf(out, cap, "tensor fields set");
            return false;
        }
        if (t == T_TOKEN && k->seq == 0) {
            snprintf(out, cap, "seq 0");
            return false;
        }
        if (t != T_TOKEN && k->seq) {
            snprintf(out, cap, "seq %" PRIu64, k->seq);
            return false;
        }
        if (t != T_INDEX && k->raw_len) {
            snprintf(out, cap, "payload on a packet that has none");
            return false;
        }
    }
    if (t == T_TENSOR) {
        if (k->codec == 0) {
            if (k->block_size || k->stored_len != k->raw_len) {
                snprintf(out, cap, "codec none with block_size %u, stored_len %" PRIu64 ", raw_len %" PRIu64,
                         k->block_size, k->stored_len, k->raw_len);
                return false;
            }
        } else if (k->block_size < 1 || k->block_size > MAX_BLOCK_SIZE) {
            snprintf(out, cap, "block_size %u not in 1..%u", k->block_size, MAX_BLOCK_SIZE);
            return false;
        }
    }
    return true;
}

/* n bytes at off (n <= READ_AHEAD, within the file) through the window: packets that follow one
 * another are read READ_AHEAD bytes at a time. NULL: a read failed (errno kept; 0 at EOF). */
static const uint8_t *
window(scan *s, uint64_t off, size_t n)
{
    if (off >= s->woff && off - s->woff + n <= s->wlen)
        return s->win + (off - s->woff);
    size_t len = s->size - off < READ_AHEAD ? (size_t)(s->size - off) : READ_AHEAD;
    s->wlen = 0;
    if (len < n || !pread_all(s->p->fd, s->win, len, off)) {
        if (len < n)
            errno = 0;
        return NULL;
    }
    s->woff = off;
    s->wlen = len;
    return s->win;
}

/* The packet at off as StreamReader._parse reads it strictly: SRS_OK, or SRS_REFUSED with the
 * reader's reason (after "{path}: ") in why. lazy: its header only, the payload's CRC unchecked
 * (complete_end's walk). */
static int
read_packet(scan *s, uint64_t off, pkt *k, bool lazy)
{
    const char *path = s->p->path;
    if (off > s->size || s->size - off < PKT_FIXED)
        return fail(s, SRS_REFUSED, "%s: packet header runs past the end of the file", path);
    const uint8_t *h = window(s, off, PKT_FIXED);
    if (!h)
        return io_fail(s, "a packet header", off);
    if (memcmp(h, "SPKT", 4) != 0) {
        char r[64];
        repr_bytes(r, sizeof r, h, 4);
        return fail(s, SRS_REFUSED, "%s: bad packet magic %s", path, r);
    }
    *k = (pkt){.off = off,
               .type = (uint32_t)le(h + 4, 2),
               .dtype = h[6],
               .ndim = h[7],
               .header_len = (uint32_t)le(h + 8, 4),
               .name_len = (uint32_t)le(h + 12, 2),
               .codec = h[14],
               .flags = h[15],
               .meta_len = (uint32_t)le(h + 16, 4),
               .crc = (uint32_t)le(h + 20, 4),
               .seq = le(h + 24, 8),
               .step = le(h + 32, 8),
               .forward = le(h + 40, 8),
               .raw_len = le(h + 48, 8),
               .stored_len = le(h + 56, 8),
               .part_offset = le(h + 64, 8),
               .tensor_len = le(h + 72, 8),
               .block_size = (uint32_t)le(h + 80, 4)};
    if (k->type < T_TENSOR || k->type > T_END)
        return fail(s, SRS_REFUSED, "%s: unknown packet type %u", path, k->type);
    if (k->ndim > 8)
        return fail(s, SRS_REFUSED, "%s: packet ndim %u > 8", path, k->ndim);
    if ((uint64_t)k->header_len != PKT_FIXED + 8 * (uint64_t)k->ndim + k->name_len + (uint64_t)k->meta_len)
        return fail(s, SRS_REFUSED, "%s: header_len %u != 96 + 8*%u + %u + %u", path, k->header_len, k->ndim,
                    k->name_len, k->meta_len);
    if (s->size - off < k->header_len || s->size - off - k->header_len < k->stored_len)
        return fail(s, SRS_REFUSED, "%s: packet of %" PRIu64 " bytes runs past the end of the file", path,
                    (uint64_t)k->header_len + k->stored_len);
    if (k->header_len > SRS_BUF)
        return fail(s, SRS_REFUSED, "%s: packet header of %u bytes is more than a client reads (%d)", path,
                    k->header_len, SRS_BUF);
    k->end = off + k->header_len + k->stored_len;
    /* a small packet whole from the window, a larger one's header (into buf past the window's size) */
    uint64_t whole = k->end - off, have = whole <= READ_AHEAD ? whole : k->header_len;
    if (have <= READ_AHEAD)
        h = window(s, off, (size_t)have);
    else if (pread_all(s->p->fd, s->buf, k->header_len, off))
        h = s->buf;
    else
        h = NULL;
    if (!h)
        return io_fail(s, "a packet header", off);
    for (uint32_t i = 0; i < k->ndim; i++)
        k->shape[i] = le(h + PKT_FIXED + 8 * i, 8);
    if (!lazy) {
        /* the CRC covers the header with its own field as zero, then the payload */
        static const uint8_t zero[4];
        uint32_t crc = crc32c(s, crc32c(s, crc32c(s, 0, h, 20), zero, 4), h + 24, k->header_len - 24);
        crc = crc32c(s, crc, h + k->header_len, (size_t)(have - k->header_len));
        /* the rest through buf (after the header when the header is there) */
        uint8_t *chunk = h == s->buf ? s->buf + k->header_len : s->buf;
        size_t room = h == s->buf ? SRS_BUF - k->header_len : SRS_BUF;
        for (uint64_t at = off + have; at < k->end;) {
            size_t n = k->end - at < room ? (size_t)(k->end - at) : room;
            if (!pread_all(s->p->fd, chunk, n, at))
                return io_fail(s, "a packet's payload", at);
            crc = crc32c(s, crc, chunk, n);
            at += n;
        }
        if (crc != k->crc)
            return fail(s, SRS_REFUSED, "%s: packet CRC mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 ")",
                        path, k->crc, crc);
    }
    if (k->dtype && k->dtype >= sizeof dtype_size)
        return fail(s, SRS_REFUSED, "%s: unknown dtype id %u", path, k->dtype);
    const char *name = (const char *)h + PKT_FIXED + 8 * k->ndim;
    k->meta = (sj_val){name + k->name_len, k->meta_len};
    char jwhy[96] = "";
    if (!sp_utf8_valid(name, k->name_len))
        return fail(s, SRS_REFUSED, "%s: packet name/meta not valid UTF-8 JSON: the name is not UTF-8", path);
    if (k->meta_len && !sj_validate(k->meta.p, k->meta.n, jwhy, sizeof jwhy))
        return fail(s, SRS_REFUSED, "%s: packet name/meta not valid UTF-8 JSON: %s", path, jwhy);
    if (k->meta_len && sj_kind(k->meta) != '{')
        return fail(s, SRS_REFUSED, "%s: packet meta is not a JSON object", path);
    char fwhy[200];
    if (!check_fields(k, fwhy, sizeof fwhy))
        return fail(s, SRS_REFUSED, "%s: %s packet: %s", path, type_names[k->type], fwhy);
    return SRS_OK;
}

/* ----- tokens ----- */

/* A token's value of a JSON object (absent: p NULL). */
static void
member(sj_val obj, const char *key, sj_val *v)
{
    if (!obj.n || !sj_get(obj, key, v))
        *v = (sj_val){NULL, 0};
}

/* Fill t from a TOKEN packet's metadata ({token_id, text, position}) or a list entry
 * ({token_index, token_id, token_text, position}); text unescaped into tb (cap bytes). */
static void
make_token(srs_token *t, uint64_t index, sj_val obj, bool listed, char *tb, size_t cap)
{
    memset(t, 0, sizeof *t);
    t->index = index;
    t->listed = listed;
    member(obj, "token_id", &t->id);
    t->id_is_int = t->id.p && sj_i64(t->id, &t->id_int);
    member(obj, listed ? "token_text" : "text", &t->text_json);
    bool full = false;
    if (t->text_json.p && sj_strn(t->text_json, tb, cap, &full, &t->text_len) && full)
        t->text = tb;
    else if (!t->text_json.p)
        t->text = "", t->text_len = 0;
    member(obj, "position", &t->position);
    t->position_is_int = t->position.p && sj_i64(t->position, &t->position_int);
    if (!t->position.p)
        t->position_is_int = true, t->position_int = (int64_t)index;
}

static int
emit(scan *s, const srs_token *t)
{
    if (s->p->on_token && s->p->on_token(s->p->user, t) != 0)
        return fail(s, SRS_STOPPED, "%s: stopped while the tokens were read", s->p->path);
    return SRS_OK;
}

/* Two JSON values the same (integers by value, anything else by its text). */
static bool
same_json(sj_val a, bool ai, int64_t av, sj_val b, bool bi, int64_t bv)
{
    if (ai || bi)
        return ai && bi && av == bv;
    if (!a.p || !b.p)
        return !a.p && !b.p;
    return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

/* A token as Python's repr of the tracker's dict printed it (roughly: JSON values). */
static void
token_text(char *out, size_t cap, const srs_token *t)
{
    char txt[160];
    if (t->text)
        repr_str(txt, sizeof txt, t->text, t->text_len > 120 ? 120 : t->text_len);
    else
        snprintf(txt, sizeof txt, "%.*s", t->text_json.n > 120 ? 120 : (int)t->text_json.n, t->text_json.p);
    char pos[48];
    if (t->position_is_int)
        snprintf(pos, sizeof pos, "%" PRId64, t->position_int);
    else
        snprintf(pos, sizeof pos, "%.*s", t->position.n > 40 ? 40 : (int)t->position.n, t->position.p);
    snprintf(out, cap, "{'token_index': %" PRIu64 ", 'token_id': %.*s, 'token_text': %s, 'position': %s}", t->index,
             t->id.p ? (t->id.n > 40 ? 40 : (int)t->id.n) : 4, t->id.p ? t->id.p : "None", txt, pos);
}

/* ----- the checkpointed prefix ----- */

static int
check_fingerprints(scan *s)
{
    const sck_checkpoint *ck = s->p->ck;
    char fp[1100], got[2300], want[2300];
    bool has;
    header_fingerprint(s, fp, sizeof fp, &has, got, sizeof got);
    repr_str(want, sizeof want, ck->fingerprint, strlen(ck->fingerprint));
    if (!has || strcmp(fp, ck->fingerprint) != 0)
        return fail(s, SRS_REFUSED, "fingerprint differs: checkpoint %s, stream header %s", want, got);
    const char *w = s->p->want_fingerprint;
    if (w && strcmp(w, ck->fingerprint) != 0) {
        repr_str(got, sizeof got, w, strlen(w));
        return fail(s, SRS_REFUSED,
                    "fingerprint differs: checkpoint %s, this capture (config + model) %s; resume with the same "
                    "model, config, preset and modules",
                    want, got);
    }
    return SRS_OK;
}

/* The prefix walked packet by packet (checkpoint.py _check_prefix). Its tokens are given to
 * on_token when give. */
static int
check_prefix(scan *s, bool give)
{
    const sck_checkpoint *ck = s->p->ck;
    const char *path = s->p->path;
    int e = check_fingerprints(s);
    if (e)
        return e;
    uint64_t packets = 0, tokens = 0, end = s->first;
    bool numbered = true, have_last = false;
    pkt last = {0};
    char *tb = malloc(SRS_BUF);
    if (!tb)
        return fail(s, SRS_NOMEM, "out of memory");
    for (uint64_t off = s->first; off < ck->stream_offset; off = last.end) {
        pkt k;
        if ((e = read_packet(s, off, &k, false))) {
            if (e == SRS_REFUSED) {
                char inner[700];
                snprintf(inner, sizeof inner, "%s", s->why);
                e = fail(s, SRS_REFUSED,
                         "%s: no valid packet at offset %" PRIu64 " (before the checkpointed offset %" PRIu64 "): %s",
                         path, off, ck->stream_offset, inner);
            }
            goto out;
        }
        if (k.type != T_TENSOR && k.type != T_DROP && k.type != T_TOKEN) {
            e = fail(s, SRS_REFUSED, "%s: %s packet at offset %" PRIu64 ", inside the checkpointed prefix", path,
                     type_names[k.type], k.off);
            goto out;
        }
        if (k.type == T_TOKEN) {
            numbered = numbered && k.step == tokens;
            if (give && numbered) {
                srs_token t;
                make_token(&t, k.step, k.meta, false, tb, SRS_BUF);
                if ((e = emit(s, &t)))
                    goto out;
            }
            tokens++;
        }
        packets++;
        last = k;
        have_last = true;
        end = k.end;
    }
    if (end != ck->stream_offset)
        e = fail(s, SRS_REFUSED,
                 "%s: checkpointed offset %" PRIu64 " is not the end of a packet (a packet ends at %" PRIu64 ")", path,
                 ck->stream_offset, end);
    else if (packets != ck->packets)
        e = fail(s, SRS_REFUSED, "%s: %" PRIu64 " packets before the offset, checkpoint says %" PRIu64, path, packets,
                 ck->packets);
    else if (tokens != ck->token_count)
        e = fail(s, SRS_REFUSED, "%s: %" PRIu64 " tokens before the offset, checkpoint says %" PRIu64, path, tokens,
                 ck->token_count);
    else if (!numbered)
        e = fail(s, SRS_REFUSED, "%s: TOKEN packets are not numbered 0..%" PRId64, path, (int64_t)tokens - 1);
    else if (have_last && last.off != ck->last_packet_offset)
        e = fail(s, SRS_REFUSED, "%s: last packet starts at %" PRIu64 ", checkpoint says %" PRIu64, path, last.off,
                 ck->last_packet_offset);
    else if (have_last && last.seq != ck->last_seq)
        e = fail(s, SRS_REFUSED, "%s: last packet has seq %" PRIu64 ", checkpoint says %" PRIu64, path, last.seq,
                 ck->last_seq);
    else if (have_last && last.crc != ck->last_packet_crc)
        e = fail(s, SRS_REFUSED, "%s: last packet CRC 0x%08" PRIx32 ", checkpoint says 0x%08" PRIx64, path, last.crc,
                 ck->last_packet_crc);
out:
    free(tb);
    return e;
}

/* Walk the tokens of 1.3.1's list (a JSON array) or of the token log (one JSON object a line):
 * each must be numbered 0..n-1; given to on_token when give, the last one kept in *lastv. */
typedef struct listing {
    scan *s;
    const char *where;
    bool give;
    uint64_t n;
    srs_token last;
    char *tb, *lastb; /* SRS_BUF each: the text of the token given, the last one's copy */
    char lastjson[3][256];
} listing;

static int
listed_token(listing *l, sj_val entry)
{
    scan *s = l->s;
    sj_val idx;
    int64_t i = -1;
    if (sj_kind(entry) != '{' || !sj_get(entry, "token_index", &idx) || !sj_i64(idx, &i) || (uint64_t)i != l->n ||
        i < 0)
        return fail(s, SRS_REFUSED, "%s: %s is not numbered 0..n-1 (entry %" PRIu64 ": %.*s)", s->p->path, l->where,
                    l->n, entry.n > 200 ? 200 : (int)entry.n, entry.p);
    srs_token t;
    make_token(&t, l->n, entry, true, l->tb, SRS_BUF);
    int e = l->give ? emit(s, &t) : SRS_OK;
    if (e)
        return e;
    /* the last token is compared with the last TOKEN packet: keep a copy of it */
    l->last = t;
    if (t.text && t.text_len) {
        memcpy(l->lastb, t.text, t.text_len);
        l->last.text = l->lastb;
    }
    sj_val *vals[3] = {&l->last.id, &l->last.text_json, &l->last.position};
    for (int v = 0; v < 3; v++) {
        if (!vals[v]->p)
            continue;
        size_t n = vals[v]->n < sizeof l->lastjson[v] ? vals[v]->n : sizeof l->lastjson[v] - 1;
        memcpy(l->lastjson[v], vals[v]->p, n);
        *vals[v] = (sj_val){l->lastjson[v], n};
    }
    l->n++;
    return SRS_OK;
}

/* The token log beside the checkpoint (checkpoint.py read_token_log): its first log_bytes bytes,
 * their CRC32C, log_tokens lines of JSON. Read twice through the scan's buffer (the CRC first,
 * so no token is given before the bytes are known to be the ones vouched for). */
static int
read_token_log(listing *l)
{
    scan *s = l->s;
    const sck_checkpoint *ck = s->p->ck;
    const char *path = s->p->path;
    if (!ck->has_token_log || !s->p->ck_path)
        return fail(s, SRS_REFUSED, "%s: the checkpoint has no token log", path);
    char lp[4200];
    snprintf(lp, sizeof lp, "%s.tokens.jsonl", s->p->ck_path);
    int fd = open(lp, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(s, SRS_REFUSED, "%s: the checkpoint's token log %s: [Errno %d] %s: '%s'", path, lp, errno,
                    strerror(errno), lp);
    int e = SRS_OK;
    uint64_t want = ck->log_bytes, have = 0, lines = 0;
    uint32_t crc = 0;
    char last = '\n';
    while (have < want) {
        size_t n = want - have < SRS_BUF ? (size_t)(want - have) : SRS_BUF;
        ssize_t r = pread(fd, s->buf, n, (off_t)have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            e = fail(s, SRS_IO, "%s: the checkpoint's token log %s: %s", path, lp, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        crc = crc32c(s, crc, s->buf, (size_t)r);
        for (ssize_t i = 0; i < r; i++)
            lines += s->buf[i] == '\n';
        last = (char)s->buf[r - 1];
        have += (uint64_t)r;
    }
    if (have < want) {
        e = fail(s, SRS_REFUSED, "%s: the token log %s is %" PRIu64 " bytes, the checkpoint vouches for %" PRIu64, path,
                 lp, have, want);
        goto out;
    }
    if (crc != ck->log_crc32c) {
        e = fail(s, SRS_REFUSED,
                 "%s: the token log %s's first %" PRIu64 " bytes have CRC32C 0x%08" PRIx32
                 ", the checkpoint says 0x%08" PRIx64,
                 path, lp, want, crc, ck->log_crc32c);
        goto out;
    }
    if (last != '\n' || lines != ck->log_tokens) {
        e = fail(s, SRS_REFUSED,
                 "%s: the token log %s holds %" PRIu64 " lines in its first %" PRIu64
                 " bytes, the checkpoint says %" PRIu64 " tokens",
                 path, lp, lines, want, ck->log_tokens);
        goto out;
    }
    /* the lines, each whole in the buffer: a chunk ends at its last newline */
    for (uint64_t at = 0; at < want;) {
        size_t n = want - at < SRS_BUF ? (size_t)(want - at) : SRS_BUF;
        if (!pread_all(fd, s->buf, n, at)) {
            e = errno ? fail(s, SRS_IO, "%s: the token log %s: %s", path, lp, strerror(errno))
                      : fail(s, SRS_REFUSED, "%s: the token log %s changed while it was read", path, lp);
            goto out;
        }
        const char *b = (const char *)s->buf, *nl = memrchr(b, '\n', n);
        if (!nl) {
            e = fail(s, SRS_REFUSED, "%s: the token log %s: a line is longer than a client reads (%d)", path, lp,
                     SRS_BUF);
            goto out;
        }
        size_t used = (size_t)(nl - b) + 1;
        for (const char *p = b; p < b + used;) {
            const char *q = memchr(p, '\n', (size_t)(b + used - p));
            char jwhy[96];
            if (!sj_validate(p, (size_t)(q - p), jwhy, sizeof jwhy)) {
                e = fail(s, SRS_REFUSED, "%s: the token log %s: a line is not JSON: %s", path, lp, jwhy);
                goto out;
            }
            if ((e = listed_token(l, (sj_val){p, (size_t)(q - p)})))
                goto out;
            p = q + 1;
        }
        at += used;
    }
out:
    close(fd);
    return e;
}

/* A prefix whose start was freed (checkpoint.py _check_freed_prefix): the header and fingerprints,
 * the checkpoint's last packet, the tokens' other copy. */
static int
check_freed_prefix(scan *s, uint64_t from, uint64_t to, bool give)
{
    const sck_checkpoint *ck = s->p->ck;
    const char *path = s->p->path;
    int e = check_fingerprints(s);
    if (e)
        return e;
    char what[600];
    snprintf(what, sizeof what,
             "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the stream were freed after their upload (strapd serve "
             "--upload-free-local)",
             path, from, to);
    if (ck->packets == 0 || to > ck->last_packet_offset)
        return fail(s, SRS_REFUSED,
                    "%s, up to or past the checkpoint's last packet (at %" PRIu64 "): the checkpointed prefix cannot "
                    "be checked; the stream cannot be resumed from this checkpoint",
                    what, ck->last_packet_offset);
    if (!s->p->tokens131 && !ck->has_token_log)
        return fail(s, SRS_REFUSED,
                    "%s, and the checkpoint has neither a token log nor 1.3.1's 'tokens' list: the freed tokens are "
                    "nowhere else, so this capture cannot be resumed with a freed prefix",
                    what);
    listing l = {
        .s = s, .where = s->p->tokens131 ? "the checkpoint's tokens list" : "the checkpoint's token log", .give = give};
    l.tb = malloc(SRS_BUF);
    l.lastb = malloc(SRS_BUF);
    if (!l.tb || !l.lastb) {
        e = fail(s, SRS_NOMEM, "out of memory");
        goto out;
    }
    /* the listed tokens first (the token log is read through the scan's buffer), then the
     * checkpoint's last packet */
    if (s->p->tokens131) {
        sj_val arr = {s->p->tokens131, s->p->tokens131_len}, el;
        char jwhy[96];
        if (!sj_validate(arr.p, arr.n, jwhy, sizeof jwhy) || sj_kind(arr) != '[') {
            e = fail(s, SRS_REFUSED, "%s: the checkpoint's tokens list is not a JSON list", path);
            goto out;
        }
        for (const char *it = arr.p; sj_array_next(arr, &it, &el);)
            if ((e = listed_token(&l, el)))
                goto out;
    } else if ((e = read_token_log(&l))) {
        goto out;
    }
    pkt k = {0};
    bool found = ck->last_packet_offset < ck->stream_offset;
    if (found && (e = read_packet(s, ck->last_packet_offset, &k, false))) {
        if (e == SRS_REFUSED) {
            char inner[700];
            snprintf(inner, sizeof inner, "%s", s->why);
            e = fail(s, SRS_REFUSED, "%s: no valid packet at the checkpoint's last packet offset %" PRIu64 ": %s", path,
                     ck->last_packet_offset, inner);
        }
        goto out;
    }
    if (!found || k.end != ck->stream_offset) {
        char endtxt[32];
        if (found)
            snprintf(endtxt, sizeof endtxt, "%" PRIu64, k.end);
        else
            snprintf(endtxt, sizeof endtxt, "None");
        e = fail(s, SRS_REFUSED,
                 "%s: the checkpoint's last packet (at %" PRIu64
                 ") ends at %s, not at the checkpointed offset %" PRIu64,
                 path, ck->last_packet_offset, endtxt, ck->stream_offset);
    } else if (k.type != T_TENSOR && k.type != T_DROP && k.type != T_TOKEN) {
        e = fail(s, SRS_REFUSED, "%s: %s packet at offset %" PRIu64 ", inside the checkpointed prefix", path,
                 type_names[k.type], k.off);
    } else if (k.seq != ck->last_seq) {
        e = fail(s, SRS_REFUSED, "%s: last packet has seq %" PRIu64 ", checkpoint says %" PRIu64, path, k.seq,
                 ck->last_seq);
    } else if (k.crc != ck->last_packet_crc) {
        e = fail(s, SRS_REFUSED, "%s: last packet CRC 0x%08" PRIx32 ", checkpoint says 0x%08" PRIx64, path, k.crc,
                 ck->last_packet_crc);
    } else if (l.n != ck->token_count) {
        e = fail(s, SRS_REFUSED, "%s: %s holds %" PRIu64 " tokens, its token_count says %" PRIu64, path, l.where, l.n,
                 ck->token_count);
    } else if (k.type == T_TOKEN) {
        srs_token mine;
        make_token(&mine, k.step, k.meta, false, l.tb, SRS_BUF);
        const srs_token *t = &l.last;
        bool same =
            l.n && k.step == l.n - 1 &&
            same_json(mine.id, mine.id_is_int, mine.id_int, t->id, t->id_is_int, t->id_int) &&
            ((mine.text && t->text && mine.text_len == t->text_len && memcmp(mine.text, t->text, mine.text_len) == 0) ||
             (!mine.text && !t->text && same_json(mine.text_json, false, 0, t->text_json, false, 0))) &&
            same_json(mine.position, mine.position_is_int, mine.position_int, t->position, t->position_is_int,
                      t->position_int);
        if (!same) {
            char a[400], b[400] = "None";
            token_text(a, sizeof a, &mine);
            if (l.n)
                token_text(b, sizeof b, t);
            e = fail(s, SRS_REFUSED,
                     "%s: the last TOKEN packet (step %" PRIu64 ": %s) is not the checkpoint's last token (%s)", path,
                     k.step, a, b);
        }
    }
out:
    free(l.tb);
    free(l.lastb);
    return e;
}

/* ----- past the point ----- */

/* The intact run from r's point on (checkpoint.py _intact_tail): r advances to each TOKEN's end. */
static int
intact_tail(scan *s, srs_result *r, int64_t limit)
{
    uint64_t packets = r->packets, drops = r->drops, forwards = r->forward_count, tokens = r->token_count;
    char *tb = malloc(SRS_BUF);
    if (!tb)
        return fail(s, SRS_NOMEM, "out of memory");
    int e = SRS_OK;
    for (uint64_t off = r->stream_offset; off < s->size;) {
        if (limit >= 0 && tokens >= (uint64_t)limit)
            break;
        pkt k;
        if ((e = read_packet(s, off, &k, false))) {
            if (e == SRS_REFUSED)
                e = SRS_OK; /* a torn or damaged packet ends the intact run */
            break;
        }
        if (k.type != T_TENSOR && k.type != T_DROP && k.type != T_TOKEN)
            break; /* END/INDEX of the aborted session: the capture goes on before it */
        if (k.type == T_TOKEN && k.step != tokens)
            break;
        packets++;
        off = k.end;
        if (k.type == T_DROP)
            drops++;
        if (k.type != T_TOKEN) {
            /* TOKEN packets carry no forward: the next pass is the one after the last with a packet */
            forwards = k.forward + 1 > forwards ? k.forward + 1 : forwards;
            continue;
        }
        srs_token t;
        make_token(&t, k.step, k.meta, false, tb, SRS_BUF);
        if ((e = emit(s, &t)))
            break;
        tokens++;
        r->stream_offset = k.end;
        r->packets = packets;
        r->drops = drops;
        r->last_seq = k.seq;
        r->last_packet_offset = k.off;
        r->last_packet_crc = k.crc;
        r->token_count = tokens;
        r->forward_count = forwards;
    }
    free(tb);
    return e;
}

/* An END "complete" after the point (checkpoint.py complete_end): headers only, stopping at a
 * torn or damaged packet, an INDEX or an END of another status. */
static bool
complete_end(scan *s, srs_result *r)
{
    uint64_t packets = 0, tokens = 0;
    char *saved = s->why;
    s->why = NULL; /* the walk's failures are not the caller's */
    bool found = false;
    for (uint64_t off = r->stream_offset; off < s->size;) {
        pkt k;
        if (read_packet(s, off, &k, true) != SRS_OK || k.type == T_INDEX)
            break;
        if (k.type == T_END) {
            sj_val st;
            char status[32];
            bool full = false;
            found = k.meta.n && sj_get(k.meta, "status", &st) && sj_str(st, status, sizeof status, &full) && full &&
                    strcmp(status, "complete") == 0;
            if (found) {
                r->end_offset = k.off;
                r->cut_packets = packets;
                r->cut_tokens = tokens;
                r->cut_bytes = s->size - r->stream_offset;
            }
            break;
        }
        packets++;
        tokens += k.type == T_TOKEN;
        off = k.end;
    }
    s->why = saved;
    return found;
}

/* ----- the resume point ----- */

int
srs_freed_range(int fd, uint64_t start, uint64_t end, uint64_t *from, uint64_t *to)
{
#if defined(SEEK_HOLE) && defined(SEEK_DATA)
    if (start >= end)
        return 0;
    off_t saved = lseek(fd, 0, SEEK_CUR);
    int rc = 0;
    off_t hole = lseek(fd, (off_t)start, SEEK_HOLE);
    if (hole < 0) {
        rc = errno == ENXIO || errno == EINVAL || errno == EOPNOTSUPP ? 0 : -1;
        goto out;
    }
    if ((uint64_t)hole >= end)
        goto out;
    for (off_t pos = hole;;) {
        off_t data = lseek(fd, pos, SEEK_DATA);
        if (data < 0 && errno != ENXIO) {
            rc = -1;
            goto out;
        }
        if (data < 0 || (uint64_t)data >= end) {
            *from = (uint64_t)hole, *to = end, rc = 1;
            goto out;
        }
        off_t next = lseek(fd, data, SEEK_HOLE);
        if (next < 0) {
            rc = -1;
            goto out;
        }
        if ((uint64_t)next >= end) {
            *from = (uint64_t)hole, *to = (uint64_t)data, rc = 1;
            goto out;
        }
        pos = next;
    }
out:
    if (saved >= 0) {
        int keep = errno;
        lseek(fd, saved, SEEK_SET);
        errno = keep;
    }
    return rc;
#else
    (void)fd, (void)start, (void)end, (void)from, (void)to;
    return 0;
#endif
}

static void
point_from(srs_result *r, const sck_checkpoint *ck)
{
    r->stream_offset = ck->stream_offset;
    r->packets = ck->packets;
    r->drops = ck->drops;
    r->last_seq = ck->last_seq;
    r->last_packet_offset = ck->last_packet_offset;
    r->last_packet_crc = ck->last_packet_crc;
    r->token_count = ck->token_count;
    r->forward_count = ck->forward_count;
}

static void
point_start(srs_result *r, uint64_t first)
{
    r->stream_offset = first;
    r->packets = r->drops = r->last_seq = r->last_packet_offset = r->last_packet_crc = 0;
    r->token_count = r->forward_count = 0;
}

static int
resume_point(scan *s, srs_result *r)
{
    const srs_params *p = s->p;
    const sck_checkpoint *ck = p->ck;
    const char *path = p->path;
    off_t size = lseek(p->fd, 0, SEEK_END); /* no fstat: a newer glibc symbol than the wheels may use */
    if (size < 0)
        return fail(s, SRS_IO, "%s: %s", path, strerror(errno));
    s->size = r->size = (uint64_t)size;
    if (ck && s->size < ck->stream_offset)
        return fail(s, SRS_REFUSED,
                    "%s is %" PRIu64 " bytes, shorter than the checkpointed offset %" PRIu64
                    ": data reported durable is gone; the stream cannot be resumed",
                    path, s->size, ck->stream_offset);
    if (!ck && s->size == 0) {
        r->source = SRS_EMPTY; /* a client killed before strapd wrote the header: from token 0 */
        return SRS_OK;
    }
    int e = read_header(s);
    if (e == SRS_REFUSED) {
        char inner[700];
        snprintf(inner, sizeof inner, "%s", s->why);
        return fail(s, SRS_REFUSED, "%s: %s: %s", path,
                    ck ? "stream header is not valid"
                       : "there is no checkpoint and the stream header is not valid either (nothing to resume from)",
                    inner);
    }
    if (e)
        return e;
    r->first_packet = s->first;
    int fr = srs_freed_range(p->fd, s->first, ck ? ck->stream_offset : s->size, &r->freed_from, &r->freed_to);
    if (fr < 0)
        return fail(s, SRS_IO, "%s: lseek(SEEK_HOLE): %s", path, strerror(errno));
    r->freed = fr == 1;
    if (r->freed && !ck)
        return fail(s, SRS_REFUSED,
                    "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the stream were freed after their upload (strapd serve "
                    "--upload-free-local) and there is no checkpoint to resume from",
                    path, r->freed_from, r->freed_to);
    int64_t limit = p->prefix_only ? -1 : p->limit;
    if (ck) {
        /* the prefix's tokens are the point's unless the limit goes back before it */
        bool give = !(limit >= 0 && (uint64_t)limit < ck->token_count);
        e = r->freed ? check_freed_prefix(s, r->freed_from, r->freed_to, give) : check_prefix(s, give);
        if (e)
            return e;
        point_from(r, ck);
        r->source = SRS_CHECKPOINT;
        if (p->prefix_only)
            return SRS_OK;
    } else {
        char fp[1100], got[2300], want[2300];
        bool has;
        header_fingerprint(s, fp, sizeof fp, &has, got, sizeof got);
        const char *w = p->want_fingerprint ? p->want_fingerprint : "";
        if (!has || strcmp(fp, w) != 0) {
            repr_str(want, sizeof want, w, strlen(w));
            return fail(s, SRS_REFUSED,
                        "fingerprint differs: stream header %s, this capture (config + model) %s; resume with the "
                        "same model, config, preset and modules",
                        got, want);
        }
        point_start(r, s->first);
        r->source = SRS_STREAM;
    }
    if (limit >= 0 && (uint64_t)limit < r->token_count) {
        if (r->freed)
            return fail(s, SRS_REFUSED,
                        "%s: the job-wide resume point (%" PRId64
                        " tokens) lies before this rank's checkpoint (%" PRIu64 " tokens), and bytes [%" PRIu64
                        ", %" PRIu64 ") of its stream were freed after their upload "
                        "(strapd serve --upload-free-local): the stream cannot be cut back into them; resume every "
                        "rank from its own checkpoint (or restart the capture)",
                        path, limit, r->token_count, r->freed_from, r->freed_to);
        point_start(r, s->first); /* back before the checkpoint: walked again from the first packet */
    }
    if ((e = intact_tail(s, r, limit)))
        return e;
    r->source = ck && r->stream_offset == ck->stream_offset ? SRS_CHECKPOINT : SRS_STREAM;
    /* Without its checkpoint (deleted after a clean finish) an END "complete" is a finished
     * capture. With it, the capture was stopped by an error in the capturing code (the session
     * closed cleanly, the checkpoint kept to resume from), or a process ended between its END and
     * the checkpoint's removal: it resumes (docs/CHECKPOINTS.md 4). */
    if (!ck && complete_end(s, r)) {
        r->complete = true;
        fail(s, SRS_OK,
             "%s is a complete capture (its stream ends with END, status complete, at offset %" PRIu64
             "): there is nothing to resume, and resuming would cut %" PRIu64 " bytes of it (%" PRIu64
             " packets, %" PRIu64 " tokens, the END and INDEX) back to token %" PRIu64
             ". Nothing was changed. To capture again, give a new output_path; `strapd resume %s` describes the "
             "stream",
             path, r->end_offset, r->cut_bytes, r->cut_packets, r->cut_tokens, r->token_count, path);
        if (p->refuse_complete)
            return SRS_COMPLETE;
    }
    return SRS_OK;
}

/* A scan of p, its message into why (cleared); NULL, why saying so, when out of memory. */
static scan *
scan_new(const srs_params *p, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = 0;
    scan *s = calloc(1, sizeof *s);
    if (s)
        *s = (scan){.p = p, .why = why, .whylen = whylen};
    else if (why && whylen)
        snprintf(why, whylen, "out of memory");
    return s;
}

int
srs_resume_point(const srs_params *p, srs_result *r, char *why, size_t whylen)
{
    memset(r, 0, sizeof *r);
    scan *s = scan_new(p, why, whylen);
    if (!s)
        return SRS_NOMEM;
    int e;
    if (p->prefix_only && !p->ck)
        e = fail(s, SRS_REFUSED, "%s: a prefix check needs a checkpoint", p->path);
    else if (!(s->buf = malloc(SRS_BUF)) || !(s->win = malloc(READ_AHEAD)))
        e = fail(s, SRS_NOMEM, "out of memory");
    else {
        crc_init(s);
        e = resume_point(s, r);
    }
    free(s->buf);
    free(s->win);
    free(s);
    return e;
}

int
srs_token_log(const srs_params *p, char *why, size_t whylen)
{
    scan *s = scan_new(p, why, whylen);
    if (!s)
        return SRS_NOMEM;
    listing l = {.s = s, .where = "the checkpoint's token log", .give = true};
    int e;
    if (!p->ck)
        e = fail(s, SRS_REFUSED, "%s: the checkpoint has no token log", p->path);
    else if (!(s->buf = malloc(SRS_BUF)) || !(l.tb = malloc(SRS_BUF)) || !(l.lastb = malloc(SRS_BUF)))
        e = fail(s, SRS_NOMEM, "out of memory");
    else {
        crc_init(s);
        e = read_token_log(&l);
    }
    free(l.tb);
    free(l.lastb);
    free(s->buf);
    free(s);
    return e;
}
