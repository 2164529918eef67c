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
 * - write_record_cuda: the same record with its payload queued as one cudaMemcpyAsync from
 *   device memory into the ring (registered as pinned memory) on the model's stream: what
 *   torch's copy_(non_blocking=True) queues, without the dispatch, the three ring views and
 *   the Python around them (docs/GPU.md, "How the client copies from the GPU"). The CUDA
 *   runtime is not linked: bind_cuda_memcpy takes the address of cudaMemcpyAsync in the
 *   libcudart the process already loaded (torch's), found by _cuda.py.
 *
 * - store_published: the ring's published cursor (docs/PROTOCOL.md 1.4, 2), a u64 stored
 *   with release semantics after the records below it are complete, so a daemon that reads
 *   it (acquire) when the client died sees those records whole. Python has no release
 *   store; without this module the client publishes with messages only.
 *
 * Built against the limited API of CPython 3.10 (one .abi3.so for every later CPython).
 * Optional: the Python paths write the same bytes wherever this module is missing
 * (tests/test_record_fast_path.py checks both). The resource monitor's C paths are the
 * other extension, resources/_native.c.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* The offset of seq in a TENSOR record header; record_len, step and forward follow it as
 * little-endian u64 (docs/PROTOCOL.md 2). */
#define SEQ_OFF 8

static int
u64_arg(PyObject *o, const char *what, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

PyDoc_STRVAR(write_record_doc,
             "write_record(dst, header, seq, record_len, step, forward, payload_off, src, n)\n"
             "--\n\n"
             "Write one TENSOR record at address dst: the encoded header area (bytes), then seq,\n"
             "record_len, step and forward as little-endian u64 at byte 8, then n payload bytes copied\n"
             "from address src to dst + payload_off. The caller owns both addresses: dst a writable\n"
             "ring mapping with record_len bytes free, src a live contiguous tensor's data pointer.");

/* The nine arguments write_record and write_record_cuda share, parsed and checked. */
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
    if (r->dst == 0 || (r->n > 0 && r->src == 0) || r->hdr_len < SEQ_OFF + 32 ||
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
    put_le64(d + SEQ_OFF, r->seq);
    put_le64(d + SEQ_OFF + 8, r->rec_len);
    put_le64(d + SEQ_OFF + 16, r->step);
    put_le64(d + SEQ_OFF + 24, r->forward);
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

/* cudaMemcpyAsync(dst, src, count, kind, stream) -> cudaError_t, from the CUDA runtime's
 * header; kind 2 is cudaMemcpyDeviceToHost. */
typedef int (*cuda_memcpy_async_fn)(void *, const void *, size_t, int, void *);
#define CUDA_MEMCPY_DEVICE_TO_HOST 2
static cuda_memcpy_async_fn cuda_memcpy_async;

PyDoc_STRVAR(bind_cuda_memcpy_doc,
             "bind_cuda_memcpy(addr)\n"
             "--\n\n"
             "Use the function at address addr as cudaMemcpyAsync in write_record_cuda (0 unbinds).\n"
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

PyDoc_STRVAR(write_record_cuda_doc,
             "write_record_cuda(dst, header, seq, record_len, step, forward, payload_off, src, n, stream)\n"
             "--\n\n"
             "write_record with the payload queued, not copied: n bytes from device address src to\n"
             "dst + payload_off by the bound cudaMemcpyAsync (device to host) on the raw CUDA stream\n"
             "stream. The bytes land when the stream reaches the copy; the caller publishes the\n"
             "record only after an event recorded behind it completed. RuntimeError when no\n"
             "cudaMemcpyAsync is bound or it returns an error (then nothing is written: the header\n"
             "follows the queued copy; the caller does not advance its head).");

static PyObject *
write_record_cuda(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "write_record_cuda takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    cuda_memcpy_async_fn fn = cuda_memcpy_async;
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "write_record_cuda: no cudaMemcpyAsync bound");
        return NULL;
    }
    uint64_t stream;
    Record r;
    if (u64_arg(args[9], "stream", &stream) || parse_record("write_record_cuda", args, &r) < 0)
        return NULL;
    if (r.n > 0) {
        int rc = fn((void *)(uintptr_t)(r.dst + r.payload_off), (const void *)(uintptr_t)r.src, (size_t)r.n,
                    CUDA_MEMCPY_DEVICE_TO_HOST, (void *)(uintptr_t)stream);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "cudaMemcpyAsync of a %llu-byte record failed with cudaError %d",
                         (unsigned long long)r.n, rc);
            return NULL;
        }
    }
    put_header(&r);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(store_published_doc, "store_published(addr, pos)\n"
                                  "--\n\n"
                                  "Store the u64 pos at address addr (8-byte aligned: the ring header's published\n"
                                  "cursor) with release semantics: every store this thread made before, and every one\n"
                                  "that happened-before it, is visible to a reader that loads pos with acquire.");

static PyObject *
store_published(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "store_published takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    uint64_t addr, pos;
    if (u64_arg(args[0], "addr", &addr) || u64_arg(args[1], "pos", &pos))
        return NULL;
    if (addr == 0 || addr % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "store_published: address %#llx is not 8-byte aligned",
                     (unsigned long long)addr);
        return NULL;
    }
    atomic_store_explicit((_Atomic uint64_t *)(uintptr_t)addr, pos, memory_order_release);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL, write_record_doc},
    {"bind_cuda_memcpy", (PyCFunction)bind_cuda_memcpy, METH_O, bind_cuda_memcpy_doc},
    {"write_record_cuda", (PyCFunction)(void (*)(void))write_record_cuda, METH_FASTCALL, write_record_cuda_doc},
    {"store_published", (PyCFunction)(void (*)(void))store_published, METH_FASTCALL, store_published_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "llm_instrumentation._speedups",
    "The capture's ring write in C (optional; the Python path writes the same bytes).",
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
