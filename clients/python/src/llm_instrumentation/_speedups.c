/*
 * The capture's hot path in C (docs/PERFORMANCE.md):
 *
 * - write_record: the per-record copy into the ring ("Client cost per record inside
 *   decoding"). During token-by-token decoding a capture hook runs between kernels that
 *   stream the model's weights through the caches, so the Python that writes a record runs
 *   cold: the header slice assignment, the struct.pack_into of the changing fields and
 *   ctypes.memmove took about 7 us per record there (against under 1 us in a warm loop),
 *   most of it the code those three paths touch. write_record does the same three stores in
 *   one call.
 *
 * - write_record_sum: the same record whose payload is the sum of two arrays, computed into
 *   the ring in one pass: the vLLM plugin's decoder-layer output (hidden_states + residual),
 *   without torch allocating the sum and the copy reading it again (docs/VLLM.md 9).
 *
 * - bind_cuda_memcpy: the cudaMemcpyAsync the session's put_cuda (_speedups_session.c) queues a
 *   small CUDA record's payload with, device memory into the ring (registered as pinned
 *   memory) on the model's stream: what torch's copy_(non_blocking=True) queues, without the
 *   dispatch, the three ring views and the Python around them (docs/GPU.md, "How the client
 *   copies from the GPU"). The CUDA runtime is not linked: bind_cuda_memcpy takes the address
 *   of cudaMemcpyAsync in the libcudart the process already loaded (torch's), found by _cuda.py.
 *
 * - the ring layout itself (docs/PROTOCOL.md 2): its constants and the encoders of the ring
 *   header and of TENSOR, PAD and TOKEN records, which _ring.py and _session.py use. They are
 *   libstrap's own (clients/c/common/strap_ring.h, header-only, compiled in here as libstrap
 *   compiles it), so the client side writes the record header in one place.
 *
 * - the stream lock (docs/CHECKPOINTS.md 5) and the per-rank stream name (docs/DISTRIBUTED.md):
 *   libstrap's own too (clients/c/common/strap_streamlock.h, strap_rank.h), bound here for
 *   _streamlock.py and _distributed.py. stream_lock lets the GIL go while it waits for a gone
 *   holder's lock, taking it back every 50 ms to run the signal handlers.
 *
 * - the connection to strapd with its autostart (docs/PROTOCOL.md 1): libstrap's
 *   clients/c/common/strap_connect.h, bound here for _daemon.py; connect_daemon lets the GIL go
 *   while it waits for the autostart lock or a starting daemon, as stream_lock does.
 *
 * - the control messages (docs/PROTOCOL.md 1): libstrap's encoders of every body a client sends
 *   and its decoder of every reply (clients/c/common/strap_wire.c, strap_json.c), bound in
 *   _speedups_wire.c for the tests' typed bodies (tests/wire.py).
 *
 * Built against the limited API of CPython 3.10 (one .abi3.so for every later CPython).
 * Required: the client's ring code is this module (a source install needs a C compiler; the
 * wheels carry it compiled). The resource monitor's C paths are the other extension,
 * resources/_native.c.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "strap.h"
#include "strap_connect.h"
#include "strap_rank.h"
#include "strap_ring.h"
#include "strap_streamlock.h"

#include "_speedups.h"

PyDoc_STRVAR(write_record_doc,
             "write_record(dst, header, seq, record_len, step, forward, payload_off, src, n)\n"
             "--\n\n"
             "Write one TENSOR record at address dst: the encoded header area (bytes), then seq,\n"
             "record_len, step and forward (strap_ring.h's sr_put_record_fields), then n payload bytes copied\n"
             "from address src to dst + payload_off. The caller owns both addresses: dst a writable\n"
             "ring mapping with record_len bytes free, src a live contiguous tensor's data pointer.");

/* The nine arguments of write_record (and write_record_sum's first ones), parsed and checked. */
typedef struct {
    const char *hdr;
    Py_ssize_t hdr_len;
    uint64_t dst, seq, rec_len, step, forward, payload_off, src, n;
} Record;

static int
parse_record(const char *fn, PyObject *const *args, Record *r)
{
    char *hdr;
    if (PyBytes_AsStringAndSize(args[1], &hdr, &r->hdr_len) < 0)
        return -1;
    r->hdr = hdr;
    if (u64_arg(args[0], "dst", &r->dst) || u64_arg(args[2], "seq", &r->seq) ||
        u64_arg(args[3], "record_len", &r->rec_len) || u64_arg(args[4], "step", &r->step) ||
        u64_arg(args[5], "forward", &r->forward) || u64_arg(args[6], "payload_off", &r->payload_off) ||
        u64_arg(args[7], "src", &r->src) || u64_arg(args[8], "n", &r->n))
        return -1;
    /* What the addresses cannot be checked for, the sizes can: a header that would not
     * hold the four fields, or a header or payload reaching past the record. */
    if (r->dst == 0 || (r->n > 0 && r->src == 0) || r->hdr_len < SR_RECORD_FIXED ||
        (uint64_t)r->hdr_len > r->payload_off || r->payload_off > r->rec_len || r->n > r->rec_len - r->payload_off) {
        PyErr_Format(PyExc_ValueError, "%s: header of %zd bytes, payload of %llu at %llu, record of %llu", fn,
                     r->hdr_len, (unsigned long long)r->n, (unsigned long long)r->payload_off,
                     (unsigned long long)r->rec_len);
        return -1;
    }
    return 0;
}

/* The header area, then seq, record_len, step and forward; returns the record's address. */
static unsigned char *
put_header(const Record *r)
{
    unsigned char *d = (unsigned char *)(uintptr_t)r->dst;
    memcpy(d, r->hdr, (size_t)r->hdr_len);
    sr_put_record_fields(d, r->seq, r->rec_len, r->step, r->forward);
    return d;
}

static PyObject *
write_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "write_record takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    Record r;
    if (parse_record("write_record", args, &r) < 0)
        return NULL;
    unsigned char *d = put_header(&r);
    if (r.n > 0)
        memcpy(d + r.payload_off, (const void *)(uintptr_t)r.src, (size_t)r.n);
    Py_RETURN_NONE;
}

/* write_record_sum's element types (SUM_*), and the conversions torch's CPU add makes for
 * them: bfloat16 and float16 are added in float32 and rounded back to nearest even, as
 * ATen's reduced-precision add does (c10's round_to_nearest_even, and the IEEE half
 * conversion of c10/util/Half.h, the FP16 library's, done by hand so that no compiler
 * _Float16 support is needed). Compiled without -ffast-math: the rounding tricks below
 * depend on IEEE float arithmetic done as written. */
enum { SUM_F32 = 0, SUM_BF16 = 1, SUM_F16 = 2 };

static inline uint32_t
f32_bits(float f)
{
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    return w;
}

static inline float
f32_from(uint32_t w)
{
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

static inline uint16_t
bf16_from_f32(float f)
{
    if (f != f)
        return 0x7FC0; /* c10::BFloat16's NaN */
    uint32_t w = f32_bits(f);
    return (uint16_t)((w + 0x7FFFu + ((w >> 16) & 1u)) >> 16);
}

static inline float
f32_from_f16(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = f32_from((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = f32_from((two_w >> 17) | (126u << 23)) - 0.5f;
    return f32_from(sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized)));
}

static inline uint16_t
f16_from_f32(float f)
{
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = f32_from((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : exp_bits + mantissa_bits));
}

#if defined(__x86_64__) && defined(__GNUC__)
#define SUM_F16C 1
#include <immintrin.h>
/* float16 by the F16C conversions torch's vectorized CPU add uses (the by-hand ones above
 * are 4-5x slower), 8 elements at a time; returns how many it summed. */
__attribute__((target("avx,f16c"))) static uint64_t
sum_f16_f16c(uint16_t *restrict d, const uint16_t *restrict x, const uint16_t *restrict y, uint64_t count)
{
    uint64_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 s = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))));
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}

/* float32 and bfloat16, 8 elements at a time (gcc -O2 leaves the plain loops scalar). A
 * bfloat16 NaN sum becomes 0xFFFF here, as in torch's AVX2 conversion (cvtfp32_bf16), and
 * 0x7FC0 in the scalar loop, as in torch's scalar one. */
__attribute__((target("avx2"))) static uint64_t
sum_f32_avx2(float *restrict d, const float *restrict x, const float *restrict y, uint64_t count)
{
    uint64_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    return i;
}

__attribute__((target("avx2"))) static uint64_t
sum_bf16_avx2(uint16_t *restrict d, const uint16_t *restrict x, const uint16_t *restrict y, uint64_t count)
{
    const __m256i ones = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF), nan = _mm256_set1_epi32(0xFFFF);
    uint64_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 a = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16));
        __m256 b = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(y + i))), 16));
        __m256 s = _mm256_add_ps(a, b);
        __m256i w = _mm256_castps_si256(s);
        __m256i r = _mm256_add_epi32(_mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(w, 16), ones), bias), w);
        r = _mm256_srli_epi32(r, 16);
        r = _mm256_blendv_epi8(nan, r, _mm256_castps_si256(_mm256_cmp_ps(s, s, _CMP_ORD_Q)));
        /* 8 u32 lanes (each < 0x10000) to 8 u16: pack within 128-bit halves, then order them */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(p));
    }
    return i;
}
#define SUM_AVX2 1
#else
#define SUM_F16C 0
#define SUM_AVX2 0
#endif

static void
sum_into(void *dst, const void *a, const void *b, uint64_t count, int type)
{
    uint64_t i;
    if (type == SUM_F32) {
        float *restrict d = dst;
        const float *restrict x = a, *restrict y = b;
        i = 0;
#if SUM_AVX2
        if (__builtin_cpu_supports("avx2"))
            i = sum_f32_avx2(d, x, y, count);
#endif
        for (; i < count; i++)
            d[i] = x[i] + y[i];
    } else if (type == SUM_BF16) {
        uint16_t *restrict d = dst;
        const uint16_t *restrict x = a, *restrict y = b;
        i = 0;
#if SUM_AVX2
        if (__builtin_cpu_supports("avx2"))
            i = sum_bf16_avx2(d, x, y, count);
#endif
        for (; i < count; i++)
            d[i] = bf16_from_f32(f32_from((uint32_t)x[i] << 16) + f32_from((uint32_t)y[i] << 16));
    } else {
        uint16_t *restrict d = dst;
        const uint16_t *restrict x = a, *restrict y = b;
        i = 0;
#if SUM_F16C
        if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"))
            i = sum_f16_f16c(d, x, y, count);
#endif
        for (; i < count; i++)
            d[i] = f16_from_f32(f32_from_f16(x[i]) + f32_from_f16(y[i]));
    }
}

/* Payloads from this size on are summed without the GIL: another Python thread of the
 * engine (its output processing) runs meanwhile. */
#define SUM_NOGIL_BYTES (256u << 10)

PyDoc_STRVAR(write_record_sum_doc,
             "write_record_sum(dst, header, seq, record_len, step, forward, payload_off, a, b, count, type)\n"
             "--\n\n"
             "write_record whose payload is the elementwise sum of two arrays, written straight into the\n"
             "ring: count elements at addresses a and b (contiguous, CPU) of type 0 float32, 1 bfloat16\n"
             "or 2 float16, their sum at dst + payload_off, in one pass and without an intermediate\n"
             "array. The bytes are torch's a + b on the CPU (reduced types added in float32, rounded to\n"
             "nearest even), NaN payloads aside: a NaN sum is a NaN. The vLLM plugin's decoder-layer\n"
             "output, hidden_states + residual (llm_instrumentation/vllm/_fused.py).");

static PyObject *
write_record_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "write_record_sum takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    uint64_t b, count;
    long type = PyLong_AsLong(args[10]);
    if (type == -1 && PyErr_Occurred())
        return NULL;
    if (type != SUM_F32 && type != SUM_BF16 && type != SUM_F16) {
        PyErr_Format(PyExc_ValueError, "write_record_sum: type %ld is not 0 (float32), 1 (bfloat16) or 2 (float16)",
                     type);
        return NULL;
    }
    if (u64_arg(args[8], "b", &b) || u64_arg(args[9], "count", &count))
        return NULL;
    const uint64_t item = type == SUM_F32 ? 4 : 2;
    if (count > UINT64_MAX / item) {
        PyErr_SetString(PyExc_ValueError, "write_record_sum: count too large");
        return NULL;
    }
    /* parse_record checks the payload of count * item bytes against the record, src is a. */
    PyObject *argv[9];
    for (int i = 0; i < 8; i++)
        argv[i] = args[i];
    PyObject *n = PyLong_FromUnsignedLongLong((unsigned long long)(count * item));
    if (n == NULL)
        return NULL;
    argv[8] = n;
    Record r;
    int rc = parse_record("write_record_sum", argv, &r);
    Py_DECREF(n);
    if (rc < 0)
        return NULL;
    if (r.n > 0 && b == 0) {
        PyErr_SetString(PyExc_ValueError, "write_record_sum: b is 0");
        return NULL;
    }
    unsigned char *d = put_header(&r);
    if (r.n >= SUM_NOGIL_BYTES) {
        PyThreadState *ts = PyEval_SaveThread();
        sum_into(d + r.payload_off, (const void *)(uintptr_t)r.src, (const void *)(uintptr_t)b, count, (int)type);
        PyEval_RestoreThread(ts);
    } else if (r.n > 0) {
        sum_into(d + r.payload_off, (const void *)(uintptr_t)r.src, (const void *)(uintptr_t)b, count, (int)type);
    }
    Py_RETURN_NONE;
}

/* cudaMemcpyAsync(dst, src, count, kind, stream) -> cudaError_t, from the CUDA runtime's
 * header; kind 2 is cudaMemcpyDeviceToHost. */
typedef speedups_cuda_memcpy_fn cuda_memcpy_async_fn;
static cuda_memcpy_async_fn cuda_memcpy_async;

speedups_cuda_memcpy_fn
speedups_cuda_memcpy(void)
{
    return cuda_memcpy_async;
}

PyDoc_STRVAR(bind_cuda_memcpy_doc,
             "bind_cuda_memcpy(addr)\n"
             "--\n\n"
             "Use the function at address addr as cudaMemcpyAsync in Session.put_cuda (0 unbinds).\n"
             "The caller vouches that addr is that function of a CUDA runtime loaded in this process.");

static PyObject *
bind_cuda_memcpy(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t addr;
    if (u64_arg(arg, "addr", &addr))
        return NULL;
    cuda_memcpy_async = (cuda_memcpy_async_fn)(uintptr_t)addr;
    Py_RETURN_NONE;
}

/* ----- the ring layout (strap_ring.h) for _ring.py and _session.py -------------------------- */

PyDoc_STRVAR(encode_ring_header_doc,
             "encode_ring_header(ring_size)\n"
             "--\n\n"
             "The 4096-byte RingHeader (bytes) of a ring of ring_size bytes: 4096 + a positive\n"
             "multiple of 64, else ValueError.");

static PyObject *
encode_ring_header(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t size;
    if (u64_arg(arg, "ring_size", &size))
        return NULL;
    if (size <= SR_HEADER_SIZE || (size - SR_HEADER_SIZE) % 64)
        return PyErr_Format(PyExc_ValueError, "ring_size %llu: data region %lld must be > 0 and a multiple of 64",
                            (unsigned long long)size, (long long)size - SR_HEADER_SIZE);
    PyObject *out = PyBytes_FromStringAndSize(NULL, SR_HEADER_SIZE);
    if (out != NULL)
        sr_encode_ring_header((uint8_t *)PyBytes_AsString(out), size);
    return out;
}

PyDoc_STRVAR(encode_record_header_doc,
             "encode_record_header(dtype, shape, seq, record_len, step, forward, payload_len, name, meta,\n"
             "                     part_offset, tensor_len, part)\n"
             "--\n\n"
             "A TENSOR record's header area (bytes, payload_off long): the fixed part, shape (a sequence\n"
             "of ints), name and meta (bytes), zero padded. ValueError for more than 8 dimensions, a\n"
             "name of 0 or over 4096 bytes, meta over 65536 bytes.");

static PyObject *
encode_record_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("encode_record_header", nargs, 12) < 0)
        return NULL;
    Py_ssize_t ndim = PySequence_Size(args[1]);
    if (ndim < 0)
        return NULL;
    uint64_t shape[SR_MAX_NDIM];
    if (ndim > SR_MAX_NDIM)
        return PyErr_Format(PyExc_ValueError, "tensor has %zd dimensions; the ring carries at most %d", ndim,
                            SR_MAX_NDIM);
    for (Py_ssize_t i = 0; i < ndim; i++) {
        PyObject *d = PySequence_GetItem(args[1], i);
        int bad = d == NULL || u64_arg(d, "shape", &shape[i]);
        Py_XDECREF(d);
        if (bad)
            return NULL;
    }
    long dtype = PyLong_AsLong(args[0]);
    if (dtype == -1 && PyErr_Occurred())
        return NULL;
    if (dtype < 0 || dtype > 255)
        return PyErr_Format(PyExc_ValueError, "dtype %ld is not a wire dtype id (0..255)", dtype);
    uint64_t seq, rec_len, step, forward, payload_len, part_offset, tensor_len;
    if (u64_arg(args[2], "seq", &seq) || u64_arg(args[3], "record_len", &rec_len) || u64_arg(args[4], "step", &step) ||
        u64_arg(args[5], "forward", &forward) || u64_arg(args[6], "payload_len", &payload_len) ||
        u64_arg(args[9], "part_offset", &part_offset) || u64_arg(args[10], "tensor_len", &tensor_len))
        return NULL;
    char *name, *meta;
    Py_ssize_t name_len, meta_len;
    if (PyBytes_AsStringAndSize(args[7], &name, &name_len) < 0 ||
        PyBytes_AsStringAndSize(args[8], &meta, &meta_len) < 0)
        return NULL;
    if (name_len < 1 || name_len > SR_MAX_NAME)
        return PyErr_Format(PyExc_ValueError, "module name of %zd bytes (allowed 1..%d)", name_len, SR_MAX_NAME);
    if (meta_len > SR_MAX_META)
        return PyErr_Format(PyExc_ValueError, "record meta of %zd bytes exceeds %d", meta_len, SR_MAX_META);
    /* flags: True/1 is PART (what callers before FP8 records pass), 2 FP8 */
    long flags = PyLong_AsLong(args[11]);
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    if (flags & ~(long)(SR_FLAG_PART | SR_FLAG_FP8) || flags == (SR_FLAG_PART | SR_FLAG_FP8))
        return PyErr_Format(PyExc_ValueError, "record flags %ld: PART (1) or FP8 (2)", flags);
    uint64_t area = sr_header_area((int)ndim, (size_t)name_len, (size_t)meta_len);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)area);
    if (out != NULL)
        sr_encode_record_header((uint8_t *)PyBytes_AsString(out), (int)dtype, shape, (int)ndim, seq, rec_len, step,
                                forward, payload_len, name, (size_t)name_len, meta, (size_t)meta_len, part_offset,
                                tensor_len, (flags & SR_FLAG_PART) != 0);
    if (out != NULL && flags & SR_FLAG_FP8)
        sr_set_record_flags((uint8_t *)PyBytes_AsString(out), SR_FLAG_FP8);
    return out;
}

PyDoc_STRVAR(header_area_doc, "header_area(ndim, name_len, meta_len)\n"
                              "--\n\n"
                              "Bytes from a record's start to its payload (payload_off): 64-aligned.");

static PyObject *
header_area(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("header_area", nargs, 3) < 0)
        return NULL;
    uint64_t ndim, name_len, meta_len;
    if (u64_arg(args[0], "ndim", &ndim) || u64_arg(args[1], "name_len", &name_len) ||
        u64_arg(args[2], "meta_len", &meta_len))
        return NULL;
    if (ndim > SR_MAX_NDIM || name_len > SR_MAX_NAME || meta_len > SR_MAX_META)
        return PyErr_Format(PyExc_ValueError, "header_area(%llu, %llu, %llu): past the ring's limits",
                            (unsigned long long)ndim, (unsigned long long)name_len, (unsigned long long)meta_len);
    return PyLong_FromUnsignedLongLong(sr_header_area((int)ndim, (size_t)name_len, (size_t)meta_len));
}

PyDoc_STRVAR(encode_pad_header_doc, "encode_pad_header(record_len)\n"
                                    "--\n\n"
                                    "A PAD record's 80-byte header (only magic, kind and record_len are set).");

static PyObject *
encode_pad_header(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t len;
    if (u64_arg(arg, "record_len", &len))
        return NULL;
    uint8_t h[SR_RECORD_FIXED];
    memset(h, 0, sizeof h); /* sr_encode_pad writes min(80, record_len) bytes: the rest is zero */
    sr_encode_pad(h, len);
    return PyBytes_FromStringAndSize((const char *)h, sizeof h);
}

PyDoc_STRVAR(token_record_len_doc, "token_record_len(text_len)\n"
                                   "--\n\n"
                                   "Ring bytes of a TOKEN record whose text is text_len bytes.");

static PyObject *
token_record_len(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t n;
    if (u64_arg(arg, "text_len", &n))
        return NULL;
    if (n > UINT32_MAX)
        return PyErr_Format(PyExc_ValueError, "token text of %llu bytes", (unsigned long long)n);
    return PyLong_FromUnsignedLongLong(sr_token_record_len((size_t)n));
}

PyDoc_STRVAR(encode_token_record_doc,
             "encode_token_record(seq, index, token_id, position, text)\n"
             "--\n\n"
             "A whole TOKEN record (bytes): index in step, position in forward and token_id in\n"
             "part_offset (both two's complement), the UTF-8 text (bytes) as payload at offset 128.\n"
             "ValueError for a text over 65536 bytes.");

static PyObject *
encode_token_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("encode_token_record", nargs, 5) < 0)
        return NULL;
    uint64_t seq, index, token_id, position;
    char *text;
    Py_ssize_t text_len;
    if (u64_arg(args[0], "seq", &seq) || u64_arg(args[1], "index", &index) ||
        u64_masked(args[2], "token_id", &token_id) || u64_masked(args[3], "position", &position) ||
        PyBytes_AsStringAndSize(args[4], &text, &text_len) < 0)
        return NULL;
    if (text_len > SR_MAX_TOKEN_TEXT)
        return PyErr_Format(PyExc_ValueError, "token text of %zd bytes exceeds %d", text_len, SR_MAX_TOKEN_TEXT);
    uint64_t n = sr_token_record_len((size_t)text_len);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (out != NULL)
        sr_encode_token_record((uint8_t *)PyBytes_AsString(out), seq, index, (int64_t)token_id, (int64_t)position, text,
                               (size_t)text_len);
    return out;
}

/* Bytes [off, off + n) of a bytes-like object that slices to bytes (bytes, bytearray, mmap,
 * memoryview); NULL with an exception, or when fewer than n bytes are there. */
static PyObject *
slice_bytes(PyObject *buf, Py_ssize_t off, Py_ssize_t n, const char **p)
{
    PyObject *sl = PySequence_GetSlice(buf, off, off + n);
    if (sl == NULL)
        return NULL;
    PyObject *b = PyBytes_FromObject(sl);
    Py_DECREF(sl);
    if (b == NULL)
        return NULL;
    if (PyBytes_Size(b) != n) {
        PyErr_Format(PyExc_ValueError, "record header at %zd: %zd bytes there, %zd needed", off, PyBytes_Size(b), n);
        Py_DECREF(b);
        return NULL;
    }
    *p = PyBytes_AsString(b);
    return b;
}

static uint64_t
le(const char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | (unsigned char)p[i];
    return v;
}

PyDoc_STRVAR(parse_record_header_doc,
             "parse_record_header(buf, off)\n"
             "--\n\n"
             "Decode the record header at offset off of buf (bytes, bytearray, mmap, memoryview), for tests\n"
             "and debugging: a dict of its fields, with shape, name and meta for a TENSOR record.");

static PyObject *
parse_record_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("parse_record_header", nargs, 2) < 0)
        return NULL;
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    const char *h;
    PyObject *fixed = slice_bytes(args[0], off, SR_RECORD_FIXED, &h);
    if (fixed == NULL)
        return NULL;
    unsigned kind = (unsigned)le(h + 4, 2), ndim = (unsigned char)h[7];
    uint64_t name_len = le(h + 56, 2), meta_len = le(h + 60, 4);
    PyObject *shape = NULL, *name = NULL, *meta = NULL, *var = NULL, *out = NULL;
    if (kind == SR_KIND_TENSOR) {
        const char *v;
        var = slice_bytes(args[0], off + SR_RECORD_FIXED, (Py_ssize_t)(8 * ndim + name_len + meta_len), &v);
        if (var == NULL)
            goto done;
        shape = PyTuple_New(ndim);
        for (unsigned i = 0; shape != NULL && i < ndim; i++) {
            PyObject *d = PyLong_FromUnsignedLongLong(le(v + 8 * i, 8));
            if (d == NULL || PyTuple_SetItem(shape, i, d) < 0)
                Py_CLEAR(shape);
        }
        name = PyUnicode_DecodeUTF8(v + 8 * ndim, (Py_ssize_t)name_len, "strict");
        meta = PyBytes_FromStringAndSize(v + 8 * ndim + name_len, (Py_ssize_t)meta_len);
    } else {
        shape = PyTuple_New(0);
        name = PyUnicode_FromString("");
        meta = PyBytes_FromStringAndSize("", 0);
    }
    if (shape == NULL || name == NULL || meta == NULL)
        goto done;
    out = Py_BuildValue("{s:y#,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:O}", "magic", h,
                        (Py_ssize_t)4, "kind", kind, "dtype", (unsigned)(unsigned char)h[6], "ndim", ndim, "seq",
                        (unsigned long long)le(h + 8, 8), "record_len", (unsigned long long)le(h + 16, 8), "step",
                        (unsigned long long)le(h + 24, 8), "forward", (unsigned long long)le(h + 32, 8), "payload_off",
                        (unsigned long long)le(h + 40, 8), "payload_len", (unsigned long long)le(h + 48, 8), "name_len",
                        (unsigned long long)name_len, "flags", (unsigned long long)le(h + 58, 2), "meta_len",
                        (unsigned long long)meta_len, "part_offset", (unsigned long long)le(h + 64, 8), "tensor_len",
                        (unsigned long long)le(h + 72, 8), "shape", shape, "name", name, "meta", meta);
done:
    Py_XDECREF(shape);
    Py_XDECREF(name);
    Py_XDECREF(meta);
    Py_XDECREF(var);
    Py_DECREF(fixed);
    return out;
}

/* ----- the stream lock (docs/CHECKPOINTS.md 5): libstrap's strap_streamlock.h ----- */

/* An optional path argument (None: NULL) as a file-system-encoded bytes object in *held. */
static int
opt_path(PyObject *o, PyObject **held, const char **out)
{
    *held = NULL;
    *out = NULL;
    if (o == NULL || o == Py_None)
        return 0;
    if (!PyUnicode_FSConverter(o, held))
        return -1;
    *out = PyBytes_AsString(*held);
    return *out == NULL ? -1 : 0;
}

/* Between two polls of a wait without the GIL: take it back, run the signal handlers (a
 * KeyboardInterrupt stops the wait), let it go again. */
typedef struct {
    PyThreadState *ts;
} lock_wait;

static int
lock_interrupted(void *p)
{
    lock_wait *w = p;
    PyEval_RestoreThread(w->ts);
    int failed = PyErr_CheckSignals() < 0;
    w->ts = PyEval_SaveThread();
    return failed;
}

PyDoc_STRVAR(stream_lock_doc,
             "stream_lock(fd, st_dev, st_ino, wait, path, mark=None, locks_file=None)\n"
             "--\n\n"
             "Take the stream's exclusive flock on fd, whose os.fstat gives st_dev and st_ino\n"
             "(strap_streamlock.h's stl_lock; the GIL is released while it waits for a gone holder, up to\n"
             "wait seconds). mark: a path to mark the capture live with once locked. locks_file: read\n"
             "instead of /proc/locks. Returns (verdict, pid, errno, message): verdict LOCK_LOCKED,\n"
             "LOCK_LIVE_HERE, LOCK_LIVE, LOCK_UNKNOWN, LOCK_TIMEOUT or LOCK_ERROR; pid 0 when no holder\n"
             "was found.");

static PyObject *
stream_lock(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    unsigned long long dev, ino;
    double wait;
    PyObject *path, *mark_o = Py_None, *locks_o = Py_None, *mark_b = NULL, *locks_b = NULL, *out = NULL;
    const char *mark, *locks;
    if (!PyArg_ParseTuple(args, "iKKdO&|OO:stream_lock", &fd, &dev, &ino, &wait, PyUnicode_FSConverter, &path, &mark_o,
                          &locks_o))
        return NULL;
    stl_result *r = NULL;
    const char *p = PyBytes_AsString(path);
    if (p == NULL || opt_path(mark_o, &mark_b, &mark) < 0 || opt_path(locks_o, &locks_b, &locks) < 0)
        goto done;
    if (wait != wait) {
        PyErr_SetString(PyExc_ValueError, "stream_lock: wait is NaN, not a number of seconds");
        goto done;
    }
    if (wait < 0)
        wait = 0; /* as a deadline already past: a gone holder's lock is not waited for */
    r = PyMem_Malloc(sizeof *r);
    if (r == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    lock_wait w = {PyEval_SaveThread()};
    int v = stl_lock(fd, (dev_t)dev, (ino_t)ino, p, wait, locks, mark, lock_interrupted, &w, r);
    PyEval_RestoreThread(w.ts);
    if (v != STL_INTERRUPTED) /* else the signal handler's exception is set */
        out = Py_BuildValue("(iiiN)", v, (int)r->pid, r->err, PyUnicode_DecodeFSDefault(r->msg));
done:
    PyMem_Free(r);
    Py_DECREF(path);
    Py_XDECREF(mark_b);
    Py_XDECREF(locks_b);
    return out;
}

PyDoc_STRVAR(stream_lock_holder_doc, "stream_lock_holder(st_dev, st_ino, locks_file=None)\n"
                                     "--\n\n"
                                     "The pid that holds the flock on the file, read from /proc/locks (or locks_file)\n"
                                     "as stl_holder does; 0 when none is found.");

static PyObject *
stream_lock_holder(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long dev, ino;
    PyObject *locks_o = Py_None, *locks_b;
    const char *locks;
    if (!PyArg_ParseTuple(args, "KK|O:stream_lock_holder", &dev, &ino, &locks_o) ||
        opt_path(locks_o, &locks_b, &locks) < 0)
        return NULL;
    PyThreadState *ts = PyEval_SaveThread();
    pid_t pid = stl_holder((dev_t)dev, (ino_t)ino, locks);
    PyEval_RestoreThread(ts);
    Py_XDECREF(locks_b);
    return PyLong_FromLong((long)pid);
}

PyDoc_STRVAR(stream_alive_doc, "stream_alive(pid)\n"
                               "--\n\n"
                               "Whether pid is a running process (a zombie is not), as stl_alive decides.");

static PyObject *
stream_alive(PyObject *self, PyObject *arg)
{
    (void)self;
    long pid = PyLong_AsLong(arg);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    if (pid <= 0 || pid > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "stream_alive: pid %ld is not a process id", pid);
        return NULL;
    }
    return PyBool_FromLong(stl_alive((pid_t)pid));
}

PyDoc_STRVAR(stream_mark_live_doc, "stream_mark_live(st_dev, st_ino, path)\n"
                                   "--\n\n"
                                   "Mark this process's capture of the file as live, writing path (stl_mark_live).");

static PyObject *
stream_mark_live(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long dev, ino;
    PyObject *path;
    if (!PyArg_ParseTuple(args, "KKO&:stream_mark_live", &dev, &ino, PyUnicode_FSConverter, &path))
        return NULL;
    const char *p = PyBytes_AsString(path);
    int rc = p == NULL ? -2 : stl_mark_live((dev_t)dev, (ino_t)ino, p);
    Py_DECREF(path);
    if (rc == -1)
        PyErr_NoMemory();
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(stream_mark_ended_doc, "stream_mark_ended(st_dev, st_ino)\n"
                                    "--\n\n"
                                    "This process's capture of the file has stopped or aborted (stl_mark_ended).");

static PyObject *
stream_mark_ended(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long dev, ino;
    if (!PyArg_ParseTuple(args, "KK:stream_mark_ended", &dev, &ino))
        return NULL;
    stl_mark_ended((dev_t)dev, (ino_t)ino);
    Py_RETURN_NONE;
}

/* ----- the per-rank stream name (docs/DISTRIBUTED.md): libstrap's strap_rank.h ----- */

PyDoc_STRVAR(rank_path_doc, "rank_path(path, rank, world_size)\n"
                            "--\n\n"
                            "path with the rank's marker .rankRRRRR-of-WWWWW before its extension (strap_rank.h's\n"
                            "srk_rank_path); a path that already carries this rank's marker is returned as it is.");

static PyObject *
rank_path(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path, *out = NULL;
    long long rank, world;
    if (!PyArg_ParseTuple(args, "O&LL:rank_path", PyUnicode_FSConverter, &path, &rank, &world))
        return NULL;
    const char *p = PyBytes_AsString(path);
    if (p != NULL && (rank < 0 || world <= rank))
        PyErr_Format(PyExc_ValueError, "rank_path: rank %lld is outside a world of %lld", rank, world);
    else if (p != NULL) {
        size_t n = srk_rank_path(p, rank, world, NULL, 0);
        char *buf = PyMem_Malloc(n + 1);
        if (buf == NULL)
            PyErr_NoMemory();
        else {
            srk_rank_path(p, rank, world, buf, n + 1);
            out = PyUnicode_DecodeFSDefaultAndSize(buf, (Py_ssize_t)n);
            PyMem_Free(buf);
        }
    }
    Py_DECREF(path);
    return out;
}

PyDoc_STRVAR(connect_daemon_doc,
             "connect_daemon(path, autostart, binary, timeout, lock_timeout, autostart_hint, socket_hint,\n"
             "               binary_hint)\n"
             "--\n\n"
             "Connect to strapd on path (resolved), starting it when nobody answers and autostart is set\n"
             "(strap_connect.h's sk_connect: the autostart lock, the detached daemon, its exit status at\n"
             "start-up). The GIL is released while it waits; a signal's exception stops the wait. binary:\n"
             "the strapd to start, or None ($STRAPD_BIN, then PATH). lock_timeout < 0: 3 x timeout. The\n"
             "hints finish the messages. Returns (fd, started_pid, log, message): fd -1 and message on\n"
             "failure; started_pid the daemon this call started (0: none), log its log file.");

static PyObject *
connect_daemon(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path, *bin_o, *bin_b = NULL, *out = NULL;
    int autostart;
    double timeout, lock_timeout;
    const char *bin, *ahint, *shint, *bhint;
    if (!PyArg_ParseTuple(args, "O&pOddsss:connect_daemon", PyUnicode_FSConverter, &path, &autostart, &bin_o, &timeout,
                          &lock_timeout, &ahint, &shint, &bhint))
        return NULL;
    sk_result *r = NULL;
    const char *p = PyBytes_AsString(path);
    if (p == NULL || opt_path(bin_o, &bin_b, &bin) < 0)
        goto done;
    if (timeout != timeout || lock_timeout != lock_timeout) {
        PyErr_SetString(PyExc_ValueError, "connect_daemon: a timeout is NaN, not a number of seconds");
        goto done;
    }
    r = PyMem_Malloc(sizeof *r);
    if (r == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    lock_wait w = {PyEval_SaveThread()};
    sk_options o = {bin, timeout, lock_timeout, ahint, shint, bhint, lock_interrupted, &w};
    int fd = sk_connect(p, autostart, &o, r);
    PyEval_RestoreThread(w.ts);
    if (fd != SK_INTERRUPTED) /* else the signal handler's exception is set */
        out = Py_BuildValue("(iiNN)", fd, r->started_pid, PyUnicode_DecodeFSDefault(r->log),
                            PyUnicode_DecodeFSDefault(r->msg));
done:
    PyMem_Free(r);
    Py_DECREF(path);
    Py_XDECREF(bin_b);
    return out;
}

PyDoc_STRVAR(status_doc, "status(path) -> str\n"
                         "--\n\n"
                         "libstrap's strap_status: HELLO, then STATUS to the daemon on path (no autostart),\n"
                         "the STATUS_REPLY body (JSON). The GIL is let go. OSError(code, message) on failure.");

static PyObject *
status(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *path;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    size_t len = 1 << 16, needed = 0;
    PyObject *out = NULL;
    for (int i = 0; i < 4 && out == NULL; i++) {
        char *buf = PyMem_Malloc(len);
        if (buf == NULL) {
            PyErr_NoMemory();
            break;
        }
        strap_error err;
        int e;
        const char *p = PyBytes_AsString(path);
        Py_BEGIN_ALLOW_THREADS;
        e = strap_status(p, buf, len, &needed, &err);
        Py_END_ALLOW_THREADS;
        if (e == STRAP_OK)
            out = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
        PyMem_Free(buf);
        if (e == STRAP_E_TOO_LARGE && needed > len) {
            len = needed;
            continue;
        }
        if (e != STRAP_OK) {
            PyObject *v = Py_BuildValue("(is)", e, err.message);
            if (v != NULL) {
                PyErr_SetObject(PyExc_OSError, v);
                Py_DECREF(v);
            }
            break;
        }
    }
    Py_DECREF(path);
    return out;
}

static PyMethodDef methods[] = {
    {"status", status, METH_O, status_doc},
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL, write_record_doc},
    {"write_record_sum", (PyCFunction)(void (*)(void))write_record_sum, METH_FASTCALL, write_record_sum_doc},
    {"bind_cuda_memcpy", (PyCFunction)bind_cuda_memcpy, METH_O, bind_cuda_memcpy_doc},
    {"encode_ring_header", encode_ring_header, METH_O, encode_ring_header_doc},
    {"encode_record_header", (PyCFunction)(void (*)(void))encode_record_header, METH_FASTCALL,
     encode_record_header_doc},
    {"header_area", (PyCFunction)(void (*)(void))header_area, METH_FASTCALL, header_area_doc},
    {"encode_pad_header", encode_pad_header, METH_O, encode_pad_header_doc},
    {"token_record_len", token_record_len, METH_O, token_record_len_doc},
    {"encode_token_record", (PyCFunction)(void (*)(void))encode_token_record, METH_FASTCALL, encode_token_record_doc},
    {"parse_record_header", (PyCFunction)(void (*)(void))parse_record_header, METH_FASTCALL, parse_record_header_doc},
    {"stream_lock", stream_lock, METH_VARARGS, stream_lock_doc},
    {"stream_lock_holder", stream_lock_holder, METH_VARARGS, stream_lock_holder_doc},
    {"stream_alive", stream_alive, METH_O, stream_alive_doc},
    {"stream_mark_live", stream_mark_live, METH_VARARGS, stream_mark_live_doc},
    {"stream_mark_ended", stream_mark_ended, METH_VARARGS, stream_mark_ended_doc},
    {"rank_path", rank_path, METH_VARARGS, rank_path_doc},
    {"connect_daemon", connect_daemon, METH_VARARGS, connect_daemon_doc},
    {NULL, NULL, 0, NULL},
};

/* The control messages' encoders and decoders (_speedups_wire.c). */
extern PyMethodDef speedups_wire_methods[];
extern PyMethodDef speedups_checkpoint_methods[]; /* the checkpoint file (_speedups_checkpoint.c) */
extern PyMethodDef speedups_fp8_methods[];
extern PyMethodDef speedups_resume_methods[];  /* the resume point (_speedups_resume.c) */
extern PyMethodDef speedups_channel_methods[]; /* the control connection's datagrams (_speedups_channel.c) */

/* strap_ring.h's constants, under the names _ring.py gives them; strap_streamlock.h's verdicts. */
static int
module_exec(PyObject *m)
{
    if (PyModule_AddFunctions(m, speedups_wire_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(m, speedups_checkpoint_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(m, speedups_fp8_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(m, speedups_resume_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(m, speedups_channel_methods) < 0)
        return -1;
    if (speedups_ring_add(m) < 0 || speedups_session_add(m) < 0)
        return -1;
    static const struct {
        const char *name;
        long value;
    } consts[] = {
        {"HEADER_SIZE", SR_HEADER_SIZE},
        {"RING_VERSION", SR_RING_VERSION},
        {"PUBLISHED_OFFSET", SR_PUBLISHED_OFFSET},
        {"RECORD_FIXED", SR_RECORD_FIXED},
        {"SEQ_OFFSET", SR_SEQ_OFFSET},
        {"TOKEN_PAYLOAD_OFFSET", SR_TOKEN_PAYLOAD_OFFSET},
        {"KIND_TENSOR", SR_KIND_TENSOR},
        {"KIND_PAD", SR_KIND_PAD},
        {"KIND_TOKEN", SR_KIND_TOKEN},
        {"FLAG_PART", SR_FLAG_PART},
        {"FLAG_FP8", SR_FLAG_FP8},
        {"FP8_HEADER", SR_FP8_HEADER},
        {"MAX_NAME", SR_MAX_NAME},
        {"MAX_META", SR_MAX_META},
        {"MAX_NDIM", SR_MAX_NDIM},
        {"MAX_TOKEN_TEXT", SR_MAX_TOKEN_TEXT},
        {"LOCK_LOCKED", STL_LOCKED},
        {"LOCK_LIVE_HERE", STL_LIVE_HERE},
        {"LOCK_LIVE", STL_LIVE},
        {"LOCK_UNKNOWN", STL_UNKNOWN},
        {"LOCK_TIMEOUT", STL_TIMEOUT},
        {"LOCK_ERROR", STL_ERROR},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
            return -1;
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "llm_instrumentation._speedups",
    "The capture's ring layout and record writes in C (libstrap's strap_ring.h).",
    0,
    methods,
    module_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&module);
}
