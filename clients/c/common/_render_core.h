/*
 * Filling an event template with its changing values, in plain C (no Python API): the part
 * of the resource writer a C client (libstrap, for llama.cpp) can compile as it is.
 *
 * A template program is (text, ops), made by templates.program in Python: the template's
 * literal text in one piece, and per op three bytes — how many bytes of text come next
 * (little-endian u16), then the number of the slot that follows (SLOT_NONE: none; the
 * numbers are records.SLOTS, _records.h). Values holds the slot values of one event.
 *
 * A double is written as Python's repr writes it ("0.1", "1e-05", "12.0"): the includer may
 * define RENDER_DOUBLE(char *out, size_t cap, double v) -> int (bytes written, or -1) before
 * including this file (the CPython extension passes PyOS_double_to_string's); without it,
 * render_repr_double below does the same in plain C (tests/test_render_core.py holds the two
 * to the same text).
 */
#ifndef STRAP_RENDER_CORE_H
#define STRAP_RENDER_CORE_H

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_records.h"

#include <math.h>
#include <stdio.h>

/* v's 17 significant digits (correctly rounded: they always read back as v) and the
 * exponent of the first: one snprintf, the only one in the common case. */
static inline void
digits17(double v, char *d17, int *e17)
{
    char s[40];
    snprintf(s, sizeof s, "%.16e", v);
    char *e = strchr(s, 'e');
    int n = 0;
    for (char *c = s; c < e; c++)
        if (*c >= '0' && *c <= '9')
            d17[n++] = *c;
    d17[n] = 0;
    *e17 = atoi(e + 1);
}

/* The nearest p-digit decimal of v (p < 17) from its 17 digits: rounding them again gives the
 * same digits unless the dropped ones are exactly 5000...: then the exact value decides, and
 * snprintf is asked (glibc rounds v itself, exactly). */
static inline void
nearest_digits(double v, const char *d17, int e17, int p, char *out, int *exp10)
{
    int tie = d17[p] == '5';
    for (int i = p + 1; tie && i < 17; i++)
        tie = d17[i] == '0';
    if (tie) {
        char s[40];
        snprintf(s, sizeof s, "%.*e", p - 1, v);
        char *e = strchr(s, 'e');
        int n = 0;
        for (char *c = s; c < e; c++)
            if (*c >= '0' && *c <= '9')
                out[n++] = *c;
        out[n] = 0;
        *exp10 = atoi(e + 1);
        return;
    }
    memcpy(out, d17, (size_t)p);
    out[p] = 0;
    *exp10 = e17;
    if (d17[p] >= '5') { /* round up, carrying */
        int i = p - 1;
        while (i >= 0 && out[i] == '9')
            out[i--] = '0';
        if (i >= 0) {
            out[i]++;
        } else { /* 99.9 -> 100: one more power of ten, still p digits */
            out[0] = '1';
            *exp10 += 1;
        }
    }
}

/* Whether the n-digit decimal `digits` x 10^exp10 (d.ddd form) reads back as v. */
static inline int
reads_back(double v, const char *digits, int n, int exp10)
{
    char u[48];
    int k = 0;
    u[k++] = digits[0];
    u[k++] = '.';
    for (int i = 1; i < n; i++)
        u[k++] = digits[i];
    if (n == 1)
        u[k++] = '0';
    u[k++] = 'e';
    if (exp10 < 0) {
        u[k++] = '-';
        exp10 = -exp10;
    }
    char x[8];
    int m = 0;
    do {
        x[m++] = (char)('0' + exp10 % 10);
        exp10 /= 10;
    } while (exp10);
    while (m)
        u[k++] = x[--m];
    u[k] = 0;
    return strtod(u, NULL) == v;
}

/* digits (n of them) plus step (+1 or -1) in the last place, still n digits without a leading
 * zero: 1 and t; 0 when it would not be. */
static inline int
neighbour(const char *digits, int n, int step, char *t)
{
    memcpy(t, digits, (size_t)n + 1);
    int i = n - 1;
    if (step > 0) {
        while (i >= 0 && t[i] == '9')
            t[i--] = '0';
        if (i < 0)
            return 0; /* 99..9 + 1 has n + 1 digits */
        t[i]++;
    } else {
        while (i >= 0 && t[i] == '0')
            t[i--] = '9';
        if (i < 0)
            return 0;
        t[i]--;
        if (t[0] == '0')
            return 0; /* 10..0 - 1 has n - 1 digits */
    }
    return 1;
}

/* The nearest p-digit decimal of v that reads back as v, or its neighbour in the last digit
 * that does (next to a power of two the interval that reads back as v is lopsided: the nearest
 * can fall outside it while its neighbour does not): its digits and exponent, 1; else 0. */
static inline int
digits_at(double v, const char *d17, int e17, int p, char *digits, int *exp_out)
{
    if (p >= 17) {
        memcpy(digits, d17, 18);
        *exp_out = e17;
        return 1;
    }
    int exp10;
    nearest_digits(v, d17, e17, p, digits, &exp10);
    *exp_out = exp10;
    if (reads_back(v, digits, p, exp10))
        return 1;
    for (int step = -1; step <= 1; step += 2) {
        char t[24];
        if (neighbour(digits, p, step, t) && reads_back(v, t, p, exp10)) {
            memcpy(digits, t, (size_t)p + 1);
            return 1;
        }
    }
    return 0;
}

/* The shortest decimal that reads back as v (the digits, without sign or point, and the
 * exponent of their first: v = 0.d1d2... x 10^decpt), as David Gay's mode 0 finds it, which
 * Python's repr uses: the fewest digits that round-trip, and of those the nearest to v.
 * Reading back at p digits (with the neighbour) implies it at every p' > p (the p-digit decimal
 * padded with zeros is a p'-digit one, so the nearest on its side reads back too): the fewest is
 * found by bisection, testing 16 and 15 first (most measured ratios need 16 or 17 digits). */
static inline int
shortest_digits(double v, char *digits, int *decpt)
{
    char d17[24], tmp[24];
    int e17, exp10, lo, hi;
    digits17(v, d17, &e17);
    if (!digits_at(v, d17, e17, 16, tmp, &exp10)) {
        lo = 17;
    } else if (!digits_at(v, d17, e17, 15, tmp, &exp10)) {
        lo = 16;
    } else {
        lo = 1;
        hi = 15; /* reads back at hi; find the fewest in [lo, hi] */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (digits_at(v, d17, e17, mid, tmp, &exp10))
                hi = mid;
            else
                lo = mid + 1;
        }
    }
    if (!digits_at(v, d17, e17, lo, digits, &exp10))
        return -1;
    int n = lo;
    while (n > 1 && digits[n - 1] == '0')
        digits[--n] = 0;
    *decpt = exp10 + 1;
    return n;
}

/* repr(v) of a finite or infinite double, in plain C: fixed notation for 1e-4 <= |v| < 1e16
 * (".0" added to a whole number), else d.ddde±XX. Bytes written, or -1 when cap is short. */
static inline int
render_repr_double(char *out, size_t cap, double v)
{
    char s[64], digits[24];
    size_t k = 0;
    if (isnan(v))
        return snprintf(out, cap, "nan") < (int)cap ? 3 : -1;
    if (signbit(v))
        s[k++] = '-';
    if (isinf(v)) {
        memcpy(s + k, "inf", 3);
        k += 3;
    } else if (v == 0) {
        memcpy(s + k, "0.0", 3);
        k += 3;
    } else {
        int decpt, n = shortest_digits(fabs(v), digits, &decpt);
        if (n < 0)
            return -1;
        if (decpt > -4 && decpt <= 16) {
            if (decpt <= 0) {
                s[k++] = '0';
                s[k++] = '.';
                for (int i = 0; i < -decpt; i++)
                    s[k++] = '0';
                memcpy(s + k, digits, (size_t)n);
                k += (size_t)n;
            } else if (decpt < n) {
                memcpy(s + k, digits, (size_t)decpt);
                k += (size_t)decpt;
                s[k++] = '.';
                memcpy(s + k, digits + decpt, (size_t)(n - decpt));
                k += (size_t)(n - decpt);
            } else {
                memcpy(s + k, digits, (size_t)n);
                k += (size_t)n;
                for (int i = n; i < decpt; i++)
                    s[k++] = '0';
                s[k++] = '.';
                s[k++] = '0';
            }
        } else {
            s[k++] = digits[0];
            if (n > 1) {
                s[k++] = '.';
                memcpy(s + k, digits + 1, (size_t)(n - 1));
                k += (size_t)(n - 1);
            }
            k += (size_t)snprintf(s + k, sizeof s - k, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        }
    }
    if (k >= cap)
        return -1;
    memcpy(out, s, k);
    return (int)k;
}

#ifndef RENDER_DOUBLE
#define RENDER_DOUBLE render_repr_double
#endif

#define SLOT_NONE 255

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

/* 0, or -1 when memory ran out. */
static inline int
buf_put(Buf *b, const char *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 2048;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* Decimal digits of v ending at end: returns where they start. */
static inline char *
digits(char *end, unsigned long long v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

static inline int
buf_ll(Buf *b, long long v)
{
    char s[32], *end = s + sizeof s;
    char *p = digits(end, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v);
    if (v < 0)
        *--p = '-';
    return buf_put(b, p, (size_t)(end - p));
}

static inline int
buf_double(Buf *b, double v)
{
    char s[64];
    int n = RENDER_DOUBLE(s, sizeof s, v);
    return n < 0 ? -1 : buf_put(b, s, (size_t)n);
}

/* str(ns / 1000.0) without a float conversion: below 10**15 ns the double nearest a
 * three-decimal number is printed by repr as that number, trailing zeros dropped (two
 * numbers with three decimals lie 0.001 apart, many units in the last place there). */
static inline int
buf_us(Buf *b, long long ns)
{
    if (ns < 0 || ns >= 1000000000000000LL)
        return buf_double(b, (double)ns / 1000.0);
    char s[40], *end = s + 32;
    char *p = digits(end, (unsigned long long)(ns / 1000));
    int frac = (int)(ns % 1000);
    *end++ = '.';
    *end++ = (char)('0' + frac / 100);
    *end++ = (char)('0' + frac / 10 % 10);
    *end++ = (char)('0' + frac % 10);
    while (end[-1] == '0' && end[-2] != '.')
        end--;
    return buf_put(b, p, (size_t)(end - p));
}

/* A shape as the JSON list "[1,16,6,64]" (templates.jlist). */
static inline int
buf_shape(Buf *b, const long long *dims, int n)
{
    if (buf_put(b, "[", 1) < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if ((i && buf_put(b, ",", 1) < 0) || buf_ll(b, dims[i]) < 0)
            return -1;
    return buf_put(b, "]", 1);
}

/* Python's floor division of a by 1000. */
static inline long long
floordiv1000(long long a)
{
    long long q = a / 1000;
    return (a % 1000 != 0 && a < 0) ? q - 1 : q;
}

#define MAX_DIMS 16

/* The values of one event's slots. */
typedef struct {
    long long ints[N_SLOT];
    double dbl[N_SLOT];
    int has[N_SLOT]; /* the memory values present in the reading */
    unsigned long long addr;
    long long timing; /* SLOT_D, ns on the host clock, unless cuda */
    int cuda;         /* SLOT_D is d_us: the µs a CUDA event pair measured (a double, as repr writes it) */
    double d_us;
    int tf_zero; /* the module path writes 0 (an int) as the throughput of no FLOPs */
    long long ks[MAX_DIMS], vs[MAX_DIMS];
    int ks_n, vs_n; /* the key and value shapes' ranks */
} Values;

/* What run_program can fail on, besides memory. */
enum { RENDER_OK = 0, RENDER_NOMEM = -1, RENDER_BAD_PROGRAM = -2, RENDER_NO_MEMORY_VALUE = -3, RENDER_BAD_SLOT = -4 };

/* The event of one program appended to b; RENDER_OK or what went wrong (*bad: the slot). */
static inline int
run_program(Buf *b, const char *text, size_t text_len, const unsigned char *ops, size_t ops_len, const Values *v,
            int *bad)
{
    if (ops_len % 3 != 0)
        return RENDER_BAD_PROGRAM;
    size_t pos = 0;
    for (size_t i = 0; i < ops_len; i += 3) {
        size_t len = (size_t)ops[i] | ((size_t)ops[i + 1] << 8);
        int code = ops[i + 2];
        if (len > text_len - pos)
            return RENDER_BAD_PROGRAM;
        if (buf_put(b, text + pos, len) < 0)
            return RENDER_NOMEM;
        pos += len;
        int rc;
        switch (code) {
        case SLOT_NONE:
            rc = 0;
            break;
        case SLOT_TS:
        case SLOT_SEQ:
        case SLOT_SEQ2:
        case SLOT_STEP:
        case SLOT_FWD:
        case SLOT_QT:
        case SLOT_KT:
        case SLOT_FL:
        case SLOT_LEN:
        case SLOT_PREV:
        case SLOT_NEW:
        case SLOT_REUSED:
        case SLOT_CB:
        case SLOT_GROW:
            rc = buf_ll(b, v->ints[code]);
            break;
        case SLOT_D:
            rc = v->cuda ? buf_double(b, v->d_us) : buf_us(b, v->timing);
            break;
        case SLOT_TF:
            rc = v->tf_zero ? buf_put(b, "0", 1) : buf_double(b, v->dbl[code]);
            break;
        case SLOT_TB:
        case SLOT_GF:
        case SLOT_HIT:
        case SLOT_CMB:
        case SLOT_BPT:
        case SLOT_BW:
        case SLOT_MF:
            rc = buf_double(b, v->dbl[code]);
            break;
        case SLOT_MP: { /* system.pressure_word of the memory-use fraction, as JSON */
            double f = v->dbl[SLOT_MF];
            const char *w = f < 0.5 ? "\"low\"" : f < 0.8 ? "\"medium\"" : "\"high\"";
            rc = buf_put(b, w, strlen(w));
            break;
        }
        case SLOT_ADDR: { /* hex(ptr) */
            char s[32], *end = s + sizeof s, *p = end;
            unsigned long long a = v->addr;
            do {
                *--p = "0123456789abcdef"[a & 15];
                a >>= 4;
            } while (a);
            *--p = 'x';
            *--p = '0';
            rc = buf_put(b, p, (size_t)(end - p));
            break;
        }
        case SLOT_PROCESS_RSS_BYTES:
        case SLOT_DEVICE_MEMORY_ALLOCATED_BYTES:
        case SLOT_DEVICE_MEMORY_RESERVED_BYTES:
        case SLOT_DEVICE_MEMORY_PEAK_BYTES:
            if (!v->has[code]) {
                *bad = code;
                return RENDER_NO_MEMORY_VALUE;
            }
            rc = buf_ll(b, v->ints[code]);
            break;
        case SLOT_KS:
            rc = buf_shape(b, v->ks, v->ks_n);
            break;
        case SLOT_VS:
            rc = buf_shape(b, v->vs, v->vs_n);
            break;
        default:
            *bad = code;
            return RENDER_BAD_SLOT;
        }
        if (rc < 0)
            return RENDER_NOMEM;
    }
    return RENDER_OK;
}

/* The KV cache's figures (events.kv_figures): hit ratio, bytes per token, growth. */
static inline void
kv_figures(long long length, long long before, long long nbytes, int has_prev, long long prev_bytes, double *hit,
           double *bpt, long long *growth)
{
    long long grew_from = has_prev && before > 0 ? prev_bytes : 0;
    *hit = length ? (double)before / (double)length : 0.0;
    *bpt = length ? (double)nbytes / (double)length : 0.0;
    *growth = nbytes - grew_from;
}

/* A rate in G/s of amount over d µs (events.per_us). */
static inline double
per_us(double amount, double d)
{
    return amount / (d * 1e3);
}

/* A rate in G/s of amount over t ns (events.per_us of amount and t / 1000.0 µs). */
static inline double
per_ns(double amount, long long t)
{
    return per_us(amount, (double)t / 1000.0);
}

#endif
