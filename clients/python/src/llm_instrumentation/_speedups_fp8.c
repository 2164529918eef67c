/*
 * The fp8 codec's block decoder (codec 19, docs/COMPRESSION.md 5.1) for _activation_codecs.py:
 * each value is float32(E4M3[code] * scale) for its row part's scale, then the packet's dtype
 * (float16: round to nearest even; bfloat16: (u + 0x7FFF + ((u >> 16) & 1)) >> 16 on the bits),
 * bit for bit as internal/codec decodes it and as the numpy decoder this replaces did
 * (tests/test_fp8_speedups.py holds both paths to that). numpy's gather and rounding passes
 * gave 1.3 GB/s of float32 and 0.5 GB/s of bfloat16 per CPU-second; this is one pass.
 *
 * The AVX2 path (F16C for float16) builds each value from the code's bits instead of a table
 * gather: e >= 1 is the float32 with exponent e + 120 and mantissa m << 20; e = 0 is
 * (1 + m/8) * 2^-6 - 2^-6 = m * 2^-9, exact. CPUs without them take the portable loop.
 * Part of the _speedups module (its methods are added by _speedups.c's module_exec).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_speedups.h"

/* STRAP_FP8_PORTABLE builds the portable loop alone, as on other CPUs (a compile check). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(STRAP_FP8_PORTABLE)
#define FP8_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* The element types fp8 decodes to (the dtype argument). */
enum { FP8_F32 = 0, FP8_F16 = 1, FP8_BF16 = 2 };

static inline uint32_t
f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float
u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Little-endian loads and stores on any host (the stream and the result are little-endian;
 * compilers make these one load or store on x86 and arm64). */
static inline uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void
put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void
put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* The value of every code (0x7F and 0xFF, NaN, are refused before use), as codec.E4M3. */
static float e4m3[256];
static int e4m3_ready;

static void
e4m3_init(void)
{
    for (unsigned c = 0; c < 256; c++) {
        unsigned e = (c >> 3) & 15, m = c & 7;
        float v = e == 0 ? (float)m * (1.0f / 512) : u2f(((e + 120u) << 23) | (m << 20));
        e4m3[c] = (c & 0x80) ? -v : v;
    }
    e4m3_ready = 1;
}

static inline uint16_t
to_bf16(uint32_t u)
{
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* float32 bits to float16 bits, round to nearest even, overflow to inf (no NaN comes here):
 * numpy's astype(float16) and Go's dtype.Float32ToFloat16. Subnormals are rounded by a float
 * add whose unit in the last place is half the smallest float16 subnormal. */
static inline uint16_t
to_f16(uint32_t x)
{
    uint32_t sign = x & 0x80000000u;
    uint16_t o;
    x ^= sign;
    if (x >= 0x47800000u) /* >= 2^16 */
        o = 0x7C00;
    else if (x < 0x38800000u) { /* below 2^-14 */
        float f = u2f(x) + 0.5f;
        o = (uint16_t)(f2u(f) - 0x3F000000u);
    } else {
        uint32_t odd = (x >> 13) & 1u;
        x = x - (112u << 23) + 0xFFFu + odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* Decodes k codes with scale s into out (k elements of kind) from element i on; returns
 * whether a NaN code was seen. */
static int
decode_portable(const uint8_t *c, size_t i, size_t k, float s, int kind, uint8_t *out)
{
    unsigned bad = 0;
    for (; i < k; i++) {
        unsigned code = c[i];
        bad |= ((code & 0x7Fu) + 1u) & 0x80u;
        uint32_t y = f2u(e4m3[code] * s);
        if (kind == FP8_F32)
            put_le32(out + 4 * i, y);
        else
            put_le16(out + 2 * i, kind == FP8_BF16 ? to_bf16(y) : to_f16(y));
    }
    return bad != 0;
}

#ifdef FP8_X86
/* 1 when the CPU and the OS give AVX2 and F16C (the YMM state saved: XCR0 bits 1 and 2). */
static int
have_avx2(void)
{
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX) || !(c & bit_F16C))
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 6) != 6)
        return 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
}

/* decode_portable for the leading multiple of 8 codes, 8 a turn; returns how many it did
 * (*bad set on a NaN code). */
__attribute__((target("avx2,f16c"))) static size_t
decode_avx2(const uint8_t *c, size_t k, float s, int kind, uint8_t *out, int *bad)
{
    const __m256i emmask = _mm256_set1_epi32(0x7F << 20), ebits = _mm256_set1_epi32(0x78),
                  nan = _mm256_set1_epi32(0x7F), signbit = _mm256_set1_epi32((int)0x80000000u),
                  normal = _mm256_set1_epi32(120 << 23), tiny = _mm256_set1_epi32(121 << 23),
                  zero = _mm256_setzero_si256(), rnd = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256 min_normal = _mm256_set1_ps(0x1p-6f), vs = _mm256_set1_ps(s);
    __m256i badv = zero;
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(c + i)));
        badv = _mm256_or_si256(badv, _mm256_cmpeq_epi32(_mm256_and_si256(u, nan), nan));
        __m256i em = _mm256_and_si256(_mm256_slli_epi32(u, 20), emmask);
        __m256 sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(u, ebits), zero));
        __m256 vn = _mm256_castsi256_ps(_mm256_add_epi32(em, normal));
        __m256 vsub = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(em, tiny)), min_normal);
        __m256 v = _mm256_blendv_ps(vn, vsub, sub);
        v = _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(u, 24), signbit)));
        __m256 y = _mm256_mul_ps(v, vs);
        if (kind == FP8_F32) {
            _mm256_storeu_ps((float *)(void *)(out + 4 * i), y);
        } else if (kind == FP8_F16) {
            _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
        } else {
            __m256i b = _mm256_castps_si256(y);
            b = _mm256_add_epi32(_mm256_add_epi32(b, rnd), _mm256_and_si256(_mm256_srli_epi32(b, 16), one));
            b = _mm256_srli_epi32(b, 16);
            b = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
            _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), _mm256_castsi256_si128(b));
        }
    }
    *bad |= !_mm256_testz_si256(badv, badv);
    return i;
}
#endif

/* -1: not probed yet; 0: portable; 1: AVX2 and F16C. */
static int fp8_simd = -1;

PyDoc_STRVAR(fp8_decode_doc,
             "fp8_decode(addr, size, dtype, n, row_len, first, portable=False) -> bytes: the n values\n"
             "of the fp8 block (mode 0) of size bytes at address addr, as dtype 0 float32, 1 float16,\n"
             "2 bfloat16 (little-endian). The caller keeps the buffer alive and has checked the header\n"
             "(row_len, first, size = 9 + 4 * row parts + n); ValueError for a scale that is negative,\n"
             "-0 or not finite, or a NaN code. portable: skip the AVX2 loop (tests).");

static PyObject *
fp8_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t addr, size, kind, n, row_len, first;
    if (nargs != 6 && nargs_check("fp8_decode", nargs, 7) < 0)
        return NULL;
    if (u64_arg(args[0], "addr", &addr) < 0 || u64_arg(args[1], "size", &size) < 0 ||
        u64_arg(args[2], "dtype", &kind) < 0 || u64_arg(args[3], "n", &n) < 0 ||
        u64_arg(args[4], "row_len", &row_len) < 0 || u64_arg(args[5], "first", &first) < 0)
        return NULL;
    int portable = 0;
    if (nargs == 7 && (portable = PyObject_IsTrue(args[6])) < 0)
        return NULL;
    /* The bounds that keep every access inside the block; Python has checked them, they
     * are cheap to check again. */
    if (kind > FP8_BF16 || addr == 0 || n == 0 || n > ((uint64_t)1 << 40) || first < 1 || first > row_len || first > n)
        return PyErr_Format(PyExc_ValueError, "fp8_decode: bad arguments");
    uint64_t groups = 1 + (n - first + row_len - 1) / row_len;
    if (size != 9 + 4 * groups + n)
        return PyErr_Format(PyExc_ValueError, "fp8_decode: %llu bytes for %llu rows of %llu values",
                            (unsigned long long)size, (unsigned long long)groups, (unsigned long long)n);
    const uint8_t *src = (const uint8_t *)(uintptr_t)addr, *scales = src + 9, *codes = scales + 4 * groups;
    for (uint64_t g = 0; g < groups; g++) {
        uint32_t b = le32(scales + 4 * g);
        if ((b & 0x80000000u) || (b & 0x7F800000u) == 0x7F800000u)
            return PyErr_Format(PyExc_ValueError, "scale negative or not finite");
    }
    size_t w = kind == FP8_F32 ? 4 : 2;
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * w));
    if (res == NULL)
        return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AsString(res);
    if (!e4m3_ready)
        e4m3_init();
#ifdef FP8_X86
    if (fp8_simd < 0)
        fp8_simd = have_avx2();
#else
    fp8_simd = 0;
#endif
    int simd = fp8_simd && !portable, bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (uint64_t g = 0, lo = 0; g < groups; g++) {
        uint64_t hi = g == 0 ? first : (lo + row_len < n ? lo + row_len : n);
        float s = u2f(le32(scales + 4 * g));
        size_t k = (size_t)(hi - lo), done = 0;
        uint8_t *o = out + w * lo;
#ifdef FP8_X86
        if (simd)
            done = decode_avx2(codes + lo, k, s, (int)kind, o, &bad);
#else
        (void)simd;
#endif
        bad |= decode_portable(codes + lo, done, k, s, (int)kind, o);
        lo = hi;
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        Py_DECREF(res);
        return PyErr_Format(PyExc_ValueError, "NaN code in an fp8 block");
    }
    return res;
}

PyMethodDef speedups_fp8_methods[] = {
    {"fp8_decode", (PyCFunction)(void (*)(void))fp8_decode, METH_FASTCALL, fp8_decode_doc},
    {NULL, NULL, 0, NULL},
};
