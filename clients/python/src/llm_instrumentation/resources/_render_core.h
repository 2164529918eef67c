/*
 * Filling an event template with its changing values, in plain C (no Python API): the part
 * of the resource writer a C client (libstrap, for llama.cpp) can compile as it is.
 *
 * A template program is (text, ops), made by templates.program in Python: the template's
 * literal text in one piece, and per op three bytes — how many bytes of text come next
 * (little-endian u16), then the number of the slot that follows (SLOT_NONE: none; the
 * numbers are records.SLOTS, _records.h). Values holds the slot values of one event.
 *
 * The includer defines RENDER_DOUBLE(char *out, size_t cap, double v) -> int (bytes written,
 * or -1) before including this file: the shortest text that reads back as v, as Python's
 * repr writes it ("0.1", "1e-05", "12.0"). _native.c passes PyOS_double_to_string's.
 */
#ifndef STRAP_RENDER_CORE_H
#define STRAP_RENDER_CORE_H

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_records.h"

#define SLOT_NONE 255

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

/* 0, or -1 when memory ran out. */
static int
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
static char *
digits(char *end, unsigned long long v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

static int
buf_ll(Buf *b, long long v)
{
    char s[32], *end = s + sizeof s;
    char *p = digits(end, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v);
    if (v < 0)
        *--p = '-';
    return buf_put(b, p, (size_t)(end - p));
}

static int
buf_double(Buf *b, double v)
{
    char s[64];
    int n = RENDER_DOUBLE(s, sizeof s, v);
    return n < 0 ? -1 : buf_put(b, s, (size_t)n);
}

/* str(ns / 1000.0) without a float conversion: below 10**15 ns the double nearest a
 * three-decimal number is printed by repr as that number, trailing zeros dropped (two
 * numbers with three decimals lie 0.001 apart, many units in the last place there). */
static int
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
static int
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
static long long
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
    int has[N_SLOT];              /* the memory values present in the reading */
    unsigned long long addr;
    long long timing;             /* SLOT_D, ns */
    int tf_zero;                  /* the module path writes 0 (an int) as the throughput of no FLOPs */
    long long ks[MAX_DIMS], vs[MAX_DIMS];
    int ks_n, vs_n;               /* the key and value shapes' ranks */
} Values;

/* What run_program can fail on, besides memory. */
enum { RENDER_OK = 0, RENDER_NOMEM = -1, RENDER_BAD_PROGRAM = -2, RENDER_NO_MEMORY_VALUE = -3, RENDER_BAD_SLOT = -4 };

/* The event of one program appended to b; RENDER_OK or what went wrong (*bad: the slot). */
static int
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
        case SLOT_TS: case SLOT_SEQ: case SLOT_SEQ2: case SLOT_STEP: case SLOT_FWD: case SLOT_QT:
        case SLOT_KT: case SLOT_FL: case SLOT_LEN: case SLOT_PREV: case SLOT_NEW: case SLOT_REUSED:
        case SLOT_CB: case SLOT_GROW:
            rc = buf_ll(b, v->ints[code]);
            break;
        case SLOT_D:
            rc = buf_us(b, v->timing);
            break;
        case SLOT_TF:
            rc = v->tf_zero ? buf_put(b, "0", 1) : buf_double(b, v->dbl[code]);
            break;
        case SLOT_TB: case SLOT_GF: case SLOT_HIT: case SLOT_CMB: case SLOT_BPT: case SLOT_BW: case SLOT_MF:
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
        case SLOT_PROCESS_RSS_BYTES: case SLOT_DEVICE_MEMORY_ALLOCATED_BYTES: case SLOT_DEVICE_MEMORY_RESERVED_BYTES:
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
static void
kv_figures(long long length, long long before, long long nbytes, int has_prev, long long prev_bytes, double *hit,
           double *bpt, long long *growth)
{
    long long grew_from = has_prev && before > 0 ? prev_bytes : 0;
    *hit = length ? (double)before / (double)length : 0.0;
    *bpt = length ? (double)nbytes / (double)length : 0.0;
    *growth = nbytes - grew_from;
}

/* A rate in G/s of amount over t ns (events.per_us of amount and t / 1000.0 µs). */
static double
per_ns(double amount, long long t)
{
    double d = (double)t / 1000.0;
    return amount / (d * 1e3);
}

#endif
