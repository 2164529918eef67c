/* JSON reading for the daemon's replies (and libstrap's checkpoint files): one strict validation pass over
 * the bytes (RFC 8259 grammar, UTF-8, paired surrogate escapes — what strapd itself requires of
 * a body, PROTOCOL.md 1.1), then lookups that scan the validated text. Nothing is allocated:
 * a reply is read on the publish path. */
#include <stdio.h>
#include <string.h>

#include "strap_wire.h"

enum { SJ_MAX_DEPTH = 64 };

typedef struct sj_p {
    const char *p, *end;
    const char *why;
    const char *at;
} sj_p;

static void
ws(sj_p *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool
fail(sj_p *s, const char *why)
{
    if (!s->why) {
        s->why = why;
        s->at = s->p;
    }
    return false;
}

static int
hexv(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool
hex4(const char *p, const char *end, unsigned *out)
{
    if (end - p < 4)
        return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexv(p[i]);
        if (h < 0)
            return false;
        v = v << 4 | (unsigned)h;
    }
    *out = v;
    return true;
}

/* Length of the UTF-8 sequence at p (1..4), 0 when invalid (overlong, surrogate, > U+10FFFF). */
static size_t
utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned min, cp;
    if ((c & 0xE0) == 0xC0) {
        n = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

bool
sp_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t l = utf8_len(p, end);
        if (!l)
            return false;
        p += l;
    }
    return true;
}

static bool
str(sj_p *s)
{
    s->p++; /* opening quote */
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        if (c == '"') {
            s->p++;
            return true;
        }
        if (c < 0x20)
            return fail(s, "control character in a string");
        if (c == '\\') {
            if (s->end - s->p < 2)
                return fail(s, "string ends inside an escape");
            char e = s->p[1];
            if (e == 'u') {
                unsigned u;
                if (!hex4(s->p + 2, s->end, &u))
                    return fail(s, "bad \\u escape");
                s->p += 6;
                if (u >= 0xDC00 && u <= 0xDFFF)
                    return fail(s, "unpaired low surrogate escape");
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned lo;
                    if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || !hex4(s->p + 2, s->end, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return fail(s, "unpaired high surrogate escape");
                    s->p += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0)
                return fail(s, "bad escape");
            s->p += 2;
            continue;
        }
        if (c < 0x80) {
            s->p++;
            continue;
        }
        size_t l = utf8_len((const unsigned char *)s->p, (const unsigned char *)s->end);
        if (!l)
            return fail(s, "invalid UTF-8");
        s->p += l;
    }
    return fail(s, "unterminated string");
}

static bool
digits(sj_p *s)
{
    const char *b = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > b;
}

static bool
num(sj_p *s)
{
    if (*s->p == '-')
        s->p++;
    if (s->p >= s->end)
        return fail(s, "bad number");
    if (*s->p == '0') {
        s->p++;
    } else if (!digits(s)) {
        return fail(s, "bad number");
    }
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (!digits(s))
            return fail(s, "bad fraction");
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (!digits(s))
            return fail(s, "bad exponent");
    }
    return true;
}

static bool
word(sj_p *s, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
        return fail(s, "unexpected character");
    s->p += n;
    return true;
}

static bool
value(sj_p *s, int depth)
{
    ws(s);
    if (s->p >= s->end)
        return fail(s, "unexpected end");
    char c = *s->p;
    if (c == '{' || c == '[') {
        if (depth >= SJ_MAX_DEPTH)
            return fail(s, "nested too deep");
        char close = c == '{' ? '}' : ']';
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return true;
        }
        for (;;) {
            if (c == '{') {
                ws(s);
                if (s->p >= s->end || *s->p != '"')
                    return fail(s, "object key is not a string");
                if (!str(s))
                    return false;
                ws(s);
                if (s->p >= s->end || *s->p != ':')
                    return fail(s, "missing ':'");
                s->p++;
            }
            if (!value(s, depth + 1))
                return false;
            ws(s);
            if (s->p >= s->end)
                return fail(s, "unexpected end");
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p == close) {
                s->p++;
                return true;
            }
            return fail(s, "missing ',' or closing bracket");
        }
    }
    if (c == '"')
        return str(s);
    if (c == '-' || (c >= '0' && c <= '9'))
        return num(s);
    if (c == 't')
        return word(s, "true");
    if (c == 'f')
        return word(s, "false");
    if (c == 'n')
        return word(s, "null");
    return fail(s, "unexpected character");
}

bool
sj_validate(const char *buf, size_t n, char *err, size_t errlen)
{
    sj_p s = {buf, buf + n, NULL, NULL};
    bool ok = value(&s, 0);
    if (ok) {
        ws(&s);
        if (s.p != s.end)
            ok = fail(&s, "trailing bytes after the value");
    }
    if (!ok && err && errlen)
        snprintf(err, errlen, "%s at byte %zu", s.why, (size_t)(s.at - buf));
    return ok;
}

/* Skip one value of an already validated document. */
static const char *
skip(const char *p, const char *end)
{
    sj_p s = {p, end, NULL, NULL};
    value(&s, 0);
    return s.p;
}

static const char *
skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

char
sj_kind(sj_val v)
{
    if (!v.n)
        return 0;
    switch (v.p[0]) {
    case '{':
    case '[':
    case '"':
        return v.p[0];
    case 't':
        return 't';
    case 'f':
        return 'f';
    case 'n':
        return 'z';
    default:
        return 'n';
    }
}

/* Decode the escape at *pp (a validated string token: \uXXXX, a surrogate pair, or a one-letter
 * escape) into its code point and move *pp past it. */
static unsigned
unescape(const char **pp, const char *end)
{
    const char *p = *pp;
    char e = p[1];
    if (e != 'u') {
        *pp = p + 2;
        return (unsigned char)strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e)[1];
    }
    unsigned u = 0;
    hex4(p + 2, end, &u);
    p += 6;
    if (u >= 0xD800 && u <= 0xDBFF) {
        unsigned lo = 0;
        hex4(p + 2, end, &lo);
        p += 6;
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    }
    *pp = p;
    return u;
}

/* cp's UTF-8 encoding into enc; returns its length. */
static size_t
utf8_encode(unsigned cp, unsigned char enc[4])
{
    if (cp < 0x80) {
        enc[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        enc[0] = (unsigned char)(0xC0 | cp >> 6), enc[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        enc[0] = (unsigned char)(0xE0 | cp >> 12), enc[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        enc[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    enc[0] = (unsigned char)(0xF0 | cp >> 18), enc[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    enc[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), enc[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Compare a validated string token (with quotes) to key after unescaping. */
static bool
key_eq(const char *p, const char *end, const char *key)
{
    p++;
    const unsigned char *k = (const unsigned char *)key;
    while (p < end && *p != '"') {
        if (*p == '\\') {
            /* compare the escaped code point's UTF-8 encoding with key */
            unsigned char enc[4];
            size_t n = utf8_encode(unescape(&p, end), enc);
            for (size_t i = 0; i < n; i++) {
                /* the key may end first: an escaped NUL must not match its terminator */
                if (!*k || *k++ != enc[i])
                    return false;
            }
            continue;
        }
        if (!*k || *k++ != (unsigned char)*p++)
            return false;
    }
    return *k == 0;
}

bool
sj_get(sj_val obj, const char *key, sj_val *out)
{
    const char *end = obj.p + obj.n;
    if (sj_kind(obj) != '{')
        return false;
    const char *p = skip_ws(obj.p + 1, end);
    bool found = false;
    while (p < end && *p == '"') {
        const char *k = p;
        p = skip(p, end); /* the key */
        bool match = key_eq(k, p, key);
        p = skip_ws(p, end) + 1; /* ':' */
        p = skip_ws(p, end);
        const char *v = p;
        p = skip(p, end);
        if (match) {
            out->p = v;
            out->n = (size_t)(p - v);
            found = true; /* keep going: the last repeated key counts */
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return found;
}

bool
sj_u64(sj_val v, uint64_t *out)
{
    if (!v.n || v.p[0] < '0' || v.p[0] > '9')
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < v.n; i++) {
        char c = v.p[i];
        if (c < '0' || c > '9')
            return false; /* fraction or exponent: not an integer */
        unsigned d = (unsigned)(c - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

bool
sj_i64(sj_val v, int64_t *out)
{
    if (v.n && v.p[0] == '-') {
        uint64_t m;
        sj_val r = {v.p + 1, v.n - 1};
        if (!sj_u64(r, &m) || m > (uint64_t)INT64_MAX + 1)
            return false;
        *out = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
        return true;
    }
    uint64_t u;
    if (!sj_u64(v, &u) || u > (uint64_t)INT64_MAX)
        return false;
    *out = (int64_t)u;
    return true;
}

bool
sj_bool(sj_val v, bool *out)
{
    char k = sj_kind(v);
    if (k != 't' && k != 'f')
        return false;
    *out = k == 't';
    return true;
}

static void
put(char *out, size_t cap, size_t *n, bool *full, const char *s, size_t len)
{
    if (*n + len >= cap) {
        *full = false;
        return;
    }
    memcpy(out + *n, s, len);
    *n += len;
}

bool
sj_str(sj_val v, char *out, size_t cap, bool *full)
{
    return sj_strn(v, out, cap, full, NULL);
}

bool
sj_strn(sj_val v, char *out, size_t cap, bool *full, size_t *len)
{
    bool f = true;
    if (sj_kind(v) != '"' || cap == 0)
        return false;
    size_t n = 0;
    const char *p = v.p + 1, *end = v.p + v.n - 1;
    while (p < end && f) {
        if (*p != '\\') {
            /* copy whole UTF-8 sequences so a truncation never splits one */
            size_t l = utf8_len((const unsigned char *)p, (const unsigned char *)end);
            if (!l)
                l = 1;
            put(out, cap, &n, &f, p, l);
            p += l;
            continue;
        }
        unsigned char enc[4];
        size_t l = utf8_encode(unescape(&p, end), enc);
        put(out, cap, &n, &f, (const char *)enc, l);
    }
    out[n] = 0;
    if (full)
        *full = f;
    if (len)
        *len = n;
    return true;
}

bool
sj_array_next(sj_val arr, const char **it, sj_val *elem)
{
    const char *end = arr.p + arr.n;
    const char *p = *it;
    if (p == arr.p) /* first call: step over '[' */
        p = skip_ws(p + 1, end);
    if (p >= end || *p == ']')
        return false;
    const char *v = p;
    p = skip(p, end);
    elem->p = v;
    elem->n = (size_t)(p - v);
    p = skip_ws(p, end);
    if (p < end && *p == ',')
        p = skip_ws(p + 1, end);
    *it = p;
    return true;
}

bool
sj_object_next(sj_val obj, const char **it, sj_val *key, sj_val *val)
{
    const char *end = obj.p + obj.n;
    const char *p = *it;
    if (p == obj.p) /* first call: step over '{' */
        p = skip_ws(p + 1, end);
    if (p >= end || *p != '"')
        return false;
    key->p = p;
    p = skip(p, end);
    key->n = (size_t)(p - key->p);
    p = skip_ws(skip_ws(p, end) + 1, end); /* ':' */
    val->p = p;
    p = skip(p, end);
    val->n = (size_t)(p - val->p);
    p = skip_ws(p, end);
    if (p < end && *p == ',')
        p = skip_ws(p + 1, end);
    *it = p;
    return true;
}
