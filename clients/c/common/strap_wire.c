/* Control messages of docs/PROTOCOL.md 1: the encoders of every body a client sends (field
 * order and compact JSON as internal/control/bodies.go writes them, so the golden vectors in
 * testdata/protocol come out byte for byte) and the decoder of every reply, which is the one
 * parser here of bytes from another process (fuzzed by clients/c/fuzz/fuzz_reply.c). libstrap and
 * the Python client's _speedups extension both compile this file (strap_wire.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strap_wire.h"

const char *
sp_type_name(int type)
{
    static const char *const names[] = {
        "?",      "HELLO", "WELCOME", "OPEN",         "OPENED", "PUBLISH",    "RELEASE",      "DROP",     "CLOSE",
        "CLOSED", "ERROR", "STATUS",  "STATUS_REPLY", "TOKEN",  "CHECKPOINT", "CHECKPOINTED", "RESOURCES"};
    return type > 0 && type <= SP_RESOURCES ? names[type] : "unknown";
}

/* ----- writing ----- */

void
sw_raw(sw_buf *b, const void *s, size_t n)
{
    if (b->overflow || n > b->cap - b->n) {
        b->overflow = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void
sw_lit(sw_buf *b, const char *s)
{
    sw_raw(b, s, strlen(s));
}

void
sw_u64(sw_buf *b, uint64_t v)
{
    char t[24];
    int i = 24;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    sw_raw(b, t + i, (size_t)(24 - i));
}

void
sw_i64(sw_buf *b, int64_t v)
{
    if (v < 0) {
        sw_raw(b, "-", 1);
        sw_u64(b, v == INT64_MIN ? (uint64_t)INT64_MAX + 1 : (uint64_t)-v);
        return;
    }
    sw_u64(b, (uint64_t)v);
}

void
sw_f64(sw_buf *b, double v)
{
    char t[40];
    if (!isfinite(v)) { /* JSON has no NaN/inf: the caller validated; write null */
        sw_lit(b, "null");
        return;
    }
    int prec = 0; /* digits after the first: the fewest that read back as v */
    for (; prec < 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec, v);
        if (strtod(t, NULL) == v)
            break;
    }
    int exp = atoi(strchr(t, 'e') + 1);
    /* Python's repr: fixed notation for 1e-4 <= |v| < 1e16, a float looking like one (5.0) */
    if (exp >= -4 && exp < 16) {
        snprintf(t, sizeof t, "%.*f", prec > exp ? prec - exp : 0, v);
        if (!strchr(t, '.'))
            strcat(t, ".0");
    }
    sw_lit(b, t);
}

void
sw_str(sw_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    sw_raw(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, flushed at each escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[6];
        switch (c) {
        case '"':
            e = "\\\"";
            break;
        case '\\':
            e = "\\\\";
            break;
        case '\n':
            e = "\\n";
            break;
        case '\r':
            e = "\\r";
            break;
        case '\t':
            e = "\\t";
            break;
        case '\b':
            e = "\\b";
            break;
        case '\f':
            e = "\\f";
            break;
        default:
            if (c < 0x20) {
                u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0';
                u[4] = hex[c >> 4], u[5] = hex[c & 15];
            }
        }
        if (!e && c >= 0x20) {
            run++;
            continue;
        }
        sw_raw(b, s + i - run, run);
        run = 0;
        if (e)
            sw_lit(b, e);
        else
            sw_raw(b, u, 6);
    }
    sw_raw(b, s + n - run, run);
    sw_raw(b, "\"", 1);
}

void
sp_enc_begin(sw_buf *b, int type)
{
    b->n = 0;
    b->overflow = false;
    uint8_t h[SP_HEADER] = {'S', 'T', 'R', 'P', SP_VERSION, 0, (uint8_t)type, (uint8_t)(type >> 8)};
    sw_raw(b, h, sizeof h);
}

void
sp_enc_finish(sw_buf *b)
{
    if (b->overflow || b->n < SP_HEADER)
        return;
    uint32_t len = (uint32_t)(b->n - SP_HEADER);
    uint8_t *h = (uint8_t *)b->p + 8;
    h[0] = (uint8_t)len, h[1] = (uint8_t)(len >> 8), h[2] = (uint8_t)(len >> 16), h[3] = (uint8_t)(len >> 24);
    if (b->n > SP_MAX_MESSAGE)
        b->overflow = true;
}

static void
key(sw_buf *b, const char *k, bool first)
{
    if (!first)
        sw_raw(b, ",", 1);
    sw_raw(b, "\"", 1);
    sw_lit(b, k);
    sw_raw(b, "\":", 2);
}

void
sp_enc_hello(sw_buf *b, const char *client, int64_t pid)
{
    sp_enc_begin(b, SP_HELLO);
    sw_raw(b, "{", 1);
    key(b, "protocol", true);
    sw_u64(b, SP_VERSION);
    key(b, "client", false);
    sw_str(b, client, strlen(client));
    key(b, "pid", false);
    sw_i64(b, pid);
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_open(sw_buf *b, const sp_open_body *o)
{
    sp_enc_begin(b, SP_OPEN);
    sw_raw(b, "{", 1);
    key(b, "ring_size", true);
    sw_u64(b, o->ring_size);
    key(b, "codec", false);
    sw_str(b, o->codec, strlen(o->codec));
    if (o->has_codec_level) {
        key(b, "codec_level", false);
        sw_i64(b, o->codec_level);
    }
    key(b, "policy", false);
    sw_str(b, o->policy, strlen(o->policy));
    if (o->block_size) {
        key(b, "block_size", false);
        sw_u64(b, o->block_size);
    }
    if (o->lossy_mode) {
        key(b, "lossy", false);
        sw_raw(b, "{", 1);
        key(b, "mode", true);
        sw_str(b, o->lossy_mode, strlen(o->lossy_mode));
        if (o->has_lossy_value) {
            key(b, "value", false);
            sw_f64(b, o->lossy_value);
        }
        sw_raw(b, "}", 1);
    }
    if (o->has_resume) {
        key(b, "append_at", false);
        sw_u64(b, o->append_at);
        key(b, "resume", false);
        sw_raw(b, "{", 1);
        key(b, "last_seq", true);
        sw_u64(b, o->resume_last_seq);
        key(b, "last_crc", false);
        sw_u64(b, o->resume_last_crc);
        key(b, "packets", false);
        sw_u64(b, o->resume_packets);
        sw_raw(b, "}", 1);
    }
    if (o->memory_hint) {
        key(b, "memory_hint", false);
        sw_u64(b, o->memory_hint);
    }
    if (o->metadata) {
        key(b, "metadata", false);
        sw_raw(b, o->metadata, o->metadata_len);
    }
    if (o->resources) {
        key(b, "resources", false);
        sw_lit(b, "true");
    }
    if (o->upload) {
        key(b, "upload", false);
        sw_str(b, o->upload, strlen(o->upload));
    }
    if (o->upload_free_local) {
        key(b, "upload_free_local", false);
        sw_lit(b, "true");
    }
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_publish(sw_buf *b, uint64_t head, uint64_t seq)
{
    sp_enc_begin(b, SP_PUBLISH);
    sw_raw(b, "{", 1);
    key(b, "head", true);
    sw_u64(b, head);
    key(b, "seq", false);
    sw_u64(b, seq);
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_drop(sw_buf *b, uint64_t seq, const char *name, size_t name_len, uint64_t step, uint64_t forward, uint64_t bytes,
            const char *reason)
{
    sp_enc_begin(b, SP_DROP);
    sw_raw(b, "{", 1);
    key(b, "seq", true);
    sw_u64(b, seq);
    key(b, "name", false);
    sw_str(b, name, name_len);
    key(b, "step", false);
    sw_u64(b, step);
    key(b, "forward", false);
    sw_u64(b, forward);
    key(b, "bytes", false);
    sw_u64(b, bytes);
    key(b, "reason", false);
    sw_str(b, reason, strlen(reason));
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_token(sw_buf *b, uint64_t seq, uint64_t index, int64_t token_id, const char *text, size_t text_len,
             int has_position, int64_t position, int has_head, uint64_t head)
{
    sp_enc_begin(b, SP_TOKEN);
    sw_raw(b, "{", 1);
    key(b, "seq", true);
    sw_u64(b, seq);
    key(b, "index", false);
    sw_u64(b, index);
    key(b, "token_id", false);
    sw_i64(b, token_id);
    key(b, "text", false);
    sw_str(b, text ? text : "", text ? text_len : 0);
    if (has_position) {
        key(b, "position", false);
        sw_i64(b, position);
    }
    if (has_head) {
        key(b, "head", false);
        sw_u64(b, head);
    }
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_checkpoint(sw_buf *b, uint64_t seq)
{
    sp_enc_begin(b, SP_CHECKPOINT);
    sw_raw(b, "{", 1);
    key(b, "seq", true);
    sw_u64(b, seq);
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_close(sw_buf *b, uint64_t seq, uint64_t head, uint64_t drops)
{
    sp_enc_begin(b, SP_CLOSE);
    sw_raw(b, "{", 1);
    key(b, "seq", true);
    sw_u64(b, seq);
    key(b, "head", false);
    sw_u64(b, head);
    key(b, "drops", false);
    sw_u64(b, drops);
    sw_raw(b, "}", 1);
    sp_enc_finish(b);
}

void
sp_enc_status(sw_buf *b)
{
    sp_enc_begin(b, SP_STATUS);
    sw_lit(b, "{}");
    sp_enc_finish(b);
}

static sj_val
trim(const char *p, size_t n)
{
    while (n && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\n' || p[n - 1] == '\r'))
        n--;
    sj_val v = {p, n};
    return v;
}

int
sp_pack_resources(sw_buf *b, const char *const *events, const size_t *lens, size_t n, size_t *next, char *err,
                  size_t errlen)
{
    static const char open[] = "{\"events\":[", close[] = "]}";
    sp_enc_begin(b, SP_RESOURCES);
    sw_lit(b, open);
    size_t first = *next, i = *next;
    for (; i < n; i++) {
        char why[128];
        if (!events[i] || !sj_validate(events[i], lens[i], why, sizeof why)) {
            snprintf(err, errlen, "resource event %zu is not JSON: %s", i, events[i] ? why : "NULL");
            return SP_E_INVALID;
        }
        sj_val ev = trim(events[i], lens[i]), name;
        if (sj_kind(ev) != '{' || !sj_get(ev, "event", &name) || sj_kind(name) != '"' || name.n < 3) {
            snprintf(err, errlen, "resource event %zu is not a JSON object with a non-empty string \"event\"", i);
            return SP_E_INVALID;
        }
        size_t need = ev.n + (i > first ? 1 : 0) + sizeof close - 1;
        if (b->n + need > SP_MAX_MESSAGE) {
            if (i == first) {
                snprintf(err, errlen, "resource event %zu of %zu bytes does not fit one %d-byte message", i, ev.n,
                         SP_MAX_MESSAGE);
                return SP_E_TOO_LARGE;
            }
            break;
        }
        if (i > first)
            sw_raw(b, ",", 1);
        sw_raw(b, ev.p, ev.n);
    }
    sw_lit(b, close);
    sp_enc_finish(b);
    *next = i;
    return b->overflow ? SP_E_TOO_LARGE : SP_OK;
}

/* ----- reading ----- */

int
sp_decode_frame(const uint8_t *d, size_t n, int *version, int *type, sj_val *body, char *err, size_t errlen)
{
    *version = 0, *type = 0;
    if (n < SP_HEADER) {
        snprintf(err, errlen, "message of %zu bytes is shorter than the 12-byte header", n);
        return SP_E_PROTOCOL;
    }
    if (memcmp(d, "STRP", 4) != 0) {
        snprintf(err, errlen, "bad message magic %02x%02x%02x%02x", d[0], d[1], d[2], d[3]);
        return SP_E_PROTOCOL;
    }
    *version = d[4] | d[5] << 8;
    *type = d[6] | d[7] << 8;
    uint64_t blen = (uint64_t)d[8] | (uint64_t)d[9] << 8 | (uint64_t)d[10] << 16 | (uint64_t)d[11] << 24;
    if (n != SP_HEADER + blen) {
        snprintf(err, errlen, "message length %zu != 12 + body_len %llu", n, (unsigned long long)blen);
        return SP_E_PROTOCOL;
    }
    const char *p = (const char *)d + SP_HEADER;
    char why[128];
    if (!sj_validate(p, (size_t)blen, why, sizeof why)) {
        snprintf(err, errlen, "%s body is not JSON: %s", sp_type_name(*type), why);
        return SP_E_PROTOCOL;
    }
    *body = trim(p, (size_t)blen);
    if (sj_kind(*body) != '{') {
        snprintf(err, errlen, "%s body is not a JSON object", sp_type_name(*type));
        return SP_E_PROTOCOL;
    }
    return SP_OK;
}

/* One body being read: the first failure is kept, worded as "TYPE without field 'f'" or
 * "TYPE.f is VALUE, expected KIND". */
typedef struct rd {
    sj_val body;
    const char *what;
    char *err;
    size_t errlen;
    bool ok;
} rd;

/* How much of v a message quotes: all of it up to max bytes, else a prefix of max - 3 that ends
 * on a whole UTF-8 character (followed by "..."). */
static int
quoted(sj_val v, size_t max)
{
    if (v.n <= max)
        return (int)v.n;
    size_t n = max - 3;
    while (n > 0 && ((unsigned char)v.p[n] & 0xC0) == 0x80)
        n--;
    return (int)n;
}

static void
rd_bad(rd *r, const char *field, sj_val v, const char *want)
{
    if (r->ok && r->err)
        snprintf(r->err, r->errlen, "%s.%s is %.*s%s, expected %s", r->what, field, quoted(v, 64), v.p,
                 v.n > 64 ? "..." : "", want);
    r->ok = false;
}

/* 1 and *v when the field is there (an optional one not null); 0 when absent, which fails a
 * required field. */
static int
rd_field(rd *r, const char *field, bool required, sj_val *v)
{
    if (!sj_get(r->body, field, v)) {
        if (required && r->ok && r->err)
            snprintf(r->err, r->errlen, "%s without field '%s': %.*s%s", r->what, field, quoted(r->body, 200),
                     r->body.p, r->body.n > 200 ? "..." : "");
        if (required)
            r->ok = false;
        return 0;
    }
    return required || sj_kind(*v) != 'z';
}

static uint64_t
rd_u64(rd *r, const char *field, bool required, int *has)
{
    sj_val v;
    uint64_t x = 0;
    int there = rd_field(r, field, required, &v);
    if (there && !sj_u64(v, &x))
        rd_bad(r, field, v, "an integer >= 0");
    if (has)
        *has = there;
    return x;
}

static int64_t
rd_i64(rd *r, const char *field)
{
    sj_val v;
    int64_t x = 0;
    if (rd_field(r, field, true, &v) && !sj_i64(v, &x))
        rd_bad(r, field, v, "an integer");
    return x;
}

static int
rd_bool(rd *r, const char *field, int *has)
{
    sj_val v;
    bool x = false;
    *has = rd_field(r, field, false, &v);
    if (*has && !sj_bool(v, &x))
        rd_bad(r, field, v, "a boolean");
    return x;
}

/* A string field into out; whole: it must fit (else it may be cut). */
static void
rd_str(rd *r, const char *field, bool required, char *out, size_t cap, bool whole, sj_val *raw)
{
    sj_val v;
    bool full = true;
    out[0] = 0;
    if (!rd_field(r, field, required, &v))
        return;
    if (!sj_str(v, out, cap, &full))
        rd_bad(r, field, v, "a string");
    else if (whole && !full)
        rd_bad(r, field, v, "a string of at most 2047 bytes");
    else if (raw)
        *raw = v;
}

/* A list whose elements are objects. */
static void
rd_objects(rd *r, const char *field, bool required)
{
    sj_val v, e;
    if (!rd_field(r, field, required, &v))
        return;
    if (sj_kind(v) != '[') {
        rd_bad(r, field, v, "a list");
        return;
    }
    for (const char *it = v.p; sj_array_next(v, &it, &e);)
        if (sj_kind(e) != '{') {
            rd_bad(r, field, e, "a list of objects");
            return;
        }
}

static void
decode_error(sj_val v, sp_reply *r)
{
    /* Lenient: an error report must never be lost to a type check. */
    sj_val f;
    bool b;
    strcpy(r->u.error.code, "unknown");
    r->u.error.fatal = 1;
    if (sj_get(v, "code", &f) && !sj_str(f, r->u.error.code, sizeof r->u.error.code, NULL))
        strcpy(r->u.error.code, "unknown");
    if (sj_get(v, "message", &f) && sj_str(f, r->u.error.message, sizeof r->u.error.message, NULL))
        r->u.error.message_json = f;
    if (sj_get(v, "fatal", &f) && sj_bool(f, &b))
        r->u.error.fatal = b;
    r->u.error.has_fits_ring_size = sj_get(v, "fits_ring_size", &f) && sj_u64(f, &r->u.error.fits_ring_size);
    if (!r->u.error.has_fits_ring_size)
        r->u.error.fits_ring_size = 0;
}

int
sp_decode_reply(const uint8_t *d, size_t n, sp_reply *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    sj_val v;
    int rc = sp_decode_frame(d, n, &r->version, &r->type, &v, err, errlen);
    if (rc != SP_OK)
        return rc;
    r->body = v.p;
    r->body_len = v.n;
    if (r->type == SP_ERROR) {
        decode_error(v, r);
        return SP_OK;
    }
    if (r->version != SP_VERSION) {
        snprintf(err, errlen, "daemon speaks protocol %d, client speaks %d", r->version, SP_VERSION);
        return SP_E_PROTOCOL;
    }
    rd x = {v, sp_type_name(r->type), err, errlen, true};
    switch (r->type) {
    case SP_WELCOME:
        r->u.welcome.protocol = rd_i64(&x, "protocol");
        rd_str(&x, "daemon", true, r->u.welcome.daemon, sizeof r->u.welcome.daemon, false, &r->u.welcome.daemon_json);
        r->u.welcome.pid = rd_i64(&x, "pid");
        r->u.welcome.max_message = rd_i64(&x, "max_message");
        r->u.welcome.max_ring_size = rd_u64(&x, "max_ring_size", false, &r->u.welcome.has_max_ring_size);
        break;
    case SP_OPENED:
        r->u.opened.session = rd_u64(&x, "session", true, NULL);
        r->u.opened.block_size = rd_u64(&x, "block_size", true, NULL);
        rd_str(&x, "upload", false, r->u.opened.upload, sizeof r->u.opened.upload, true, NULL);
        r->u.opened.published_cursor = rd_bool(&x, "published_cursor", &r->u.opened.has_published_cursor);
        r->u.opened.ring_tokens = rd_bool(&x, "ring_tokens", &r->u.opened.has_ring_tokens);
        break;
    case SP_RELEASE:
        r->u.release.tail = rd_u64(&x, "tail", true, NULL);
        break;
    case SP_CLOSED:
        r->u.closed.packets = rd_u64(&x, "packets", true, NULL);
        r->u.closed.drops = rd_u64(&x, "drops", true, NULL);
        r->u.closed.bytes_in = rd_u64(&x, "bytes_in", true, NULL);
        r->u.closed.bytes_out = rd_u64(&x, "bytes_out", true, NULL);
        r->u.closed.file_bytes = rd_u64(&x, "file_bytes", true, NULL);
        rd_str(&x, "upload", false, r->u.closed.upload, sizeof r->u.closed.upload, true, NULL);
        break;
    case SP_CHECKPOINTED:
        r->u.checkpointed.seq = rd_u64(&x, "seq", true, NULL);
        r->u.checkpointed.offset = rd_u64(&x, "offset", true, NULL);
        r->u.checkpointed.packets = rd_u64(&x, "packets", true, NULL);
        r->u.checkpointed.drops = rd_u64(&x, "drops", true, NULL);
        r->u.checkpointed.tokens = rd_u64(&x, "tokens", true, NULL);
        r->u.checkpointed.last_offset = rd_u64(&x, "last_offset", true, NULL);
        r->u.checkpointed.last_crc = rd_u64(&x, "last_crc", true, NULL);
        break;
    case SP_STATUS_REPLY: {
        sj_val f;
        if (rd_field(&x, "daemon", true, &f) && sj_kind(f) != '{')
            rd_bad(&x, "daemon", f, "an object");
        rd_objects(&x, "sessions", false);
        rd_objects(&x, "uploads", false);
        break;
    }
    default:
        snprintf(err, errlen, "unexpected message type %d (%s) from the daemon", r->type, sp_type_name(r->type));
        return SP_E_PROTOCOL;
    }
    return x.ok ? SP_OK : SP_E_PROTOCOL;
}
