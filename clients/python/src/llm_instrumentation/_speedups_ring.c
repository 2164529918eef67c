/*
 * The ring as a type of the _speedups module, Ring: libstrap's ring (clients/c/common/strap_ringbuf.h:
 * the sealed memfd and its mapping, head and tail, the PAD that ends the region, the pages
 * populated ahead of the first lap, a RELEASE's checks, the published cursor's release store),
 * which _ring.py subclasses and _session.py writes records into. The common case of a record,
 * a whole record with nothing to do first, is one call (put, put_cuda): the check, the header
 * and the payload, and the head moved on.
 *
 * The mapping belongs to a small object of its own (Ring.mapping, unmapped when it goes): views
 * of the mapping that _ring.py hands to torch hold that object, not the ring, so no view
 * outlives the mapping and a ring that caches a view (its torch tensor) makes no reference
 * cycle the collector cannot see through. close closes the memfd only.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "strap_ring.h"
#include "strap_ringbuf.h"

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    srb_ring r;
    int closed;
    PyObject *mapping; /* the MappingObject that unmaps r.base */
} RingObject;

/* The ring's mapping, unmapped when the last reference goes. */
typedef struct {
    PyObject_HEAD
    void *base;
    size_t size;
} MappingObject;

static PyObject *mapping_type;
static PyObject *ring_type; /* Ring, for speedups_ring_srb's check */

static void
mapping_dealloc(PyObject *o)
{
    MappingObject *self = (MappingObject *)o;
    PyTypeObject *tp = Py_TYPE(o);
    if (self->base)
        munmap(self->base, self->size);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

static PyObject *
mapping_get_address(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(((MappingObject *)o)->base);
}

static PyObject *
mapping_get_size(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromSize_t(((MappingObject *)o)->size);
}

static PyGetSetDef mapping_getset[] = {
    {"address", mapping_get_address, NULL, "the mapping's address", NULL},
    {"size", mapping_get_size, NULL, "its bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot mapping_slots[] = {
    {Py_tp_dealloc, mapping_dealloc},
    {Py_tp_getset, mapping_getset},
    {Py_tp_doc, "A ring's mapping (Ring.mapping): unmapped when the last reference to it goes."},
    {0, NULL},
};

static PyType_Spec mapping_spec = {
    "llm_instrumentation._speedups.RingMapping", sizeof(MappingObject), 0, Py_TPFLAGS_DEFAULT, mapping_slots,
};

static PyObject *
ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"ring_size", "name", NULL};
    unsigned long long size;
    PyObject *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "K|O", kwlist, &size, &name))
        return NULL;
    RingObject *self = (RingObject *)PyType_GenericAlloc(type, 0);
    if (self == NULL)
        return NULL;
    char why[256];
    self->r.fd = -1;
    if (srb_create(&self->r, size, why, sizeof why) != 0) {
        if (errno == EINVAL)
            PyErr_SetString(PyExc_ValueError, why);
        else
            PyErr_Format(PyExc_OSError, "%s", why);
        Py_DECREF(self);
        return NULL;
    }
    MappingObject *m = (MappingObject *)PyType_GenericAlloc((PyTypeObject *)mapping_type, 0);
    if (m == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    m->base = self->r.base;
    m->size = (size_t)self->r.ring_size;
    self->mapping = (PyObject *)m;
    return (PyObject *)self;
}

static void
ring_dealloc(PyObject *o)
{
    RingObject *self = (RingObject *)o;
    PyTypeObject *tp = Py_TYPE(o);
    if (self->mapping != NULL)
        self->r.base = NULL; /* the mapping object unmaps it, once no view is left */
    srb_destroy(&self->r);
    Py_XDECREF(self->mapping);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

static int
ring_open(RingObject *self)
{
    if (!self->closed)
        return 0;
    PyErr_SetString(PyExc_ValueError, "the ring is closed");
    return -1;
}

/* ----- the record fast path ------------------------------------------------------------------ */

/* put's and put_cuda's first eight arguments: header, seq, record_len, step, forward,
 * payload_off, src, n. */
typedef struct {
    const char *hdr;
    Py_ssize_t hdr_len;
    uint64_t seq, rec_len, step, forward, payload_off, src, n;
} PutArgs;

static int
parse_put(const char *fn, PyObject *const *args, PutArgs *a)
{
    char *hdr;
    if (PyBytes_AsStringAndSize(args[0], &hdr, &a->hdr_len) < 0)
        return -1;
    a->hdr = hdr;
    if (u64_arg(args[1], "seq", &a->seq) || u64_arg(args[2], "record_len", &a->rec_len) ||
        u64_arg(args[3], "step", &a->step) || u64_arg(args[4], "forward", &a->forward) ||
        u64_arg(args[5], "payload_off", &a->payload_off) || u64_arg(args[6], "src", &a->src) ||
        u64_arg(args[7], "n", &a->n))
        return -1;
    if ((a->n > 0 && a->src == 0) || a->hdr_len < SR_RECORD_FIXED || (uint64_t)a->hdr_len > a->payload_off ||
        a->payload_off > a->rec_len || a->n > a->rec_len - a->payload_off || a->rec_len % 64) {
        PyErr_Format(PyExc_ValueError, "%s: header of %zd bytes, payload of %llu at %llu, record of %llu", fn,
                     a->hdr_len, (unsigned long long)a->n, (unsigned long long)a->payload_off,
                     (unsigned long long)a->rec_len);
        return -1;
    }
    return 0;
}

static uint8_t *
put_header(RingObject *self, const PutArgs *a)
{
    uint8_t *d = srb_at(&self->r, self->r.head);
    memcpy(d, a->hdr, (size_t)a->hdr_len);
    sr_put_record_fields(d, a->seq, a->rec_len, a->step, a->forward);
    return d;
}

PyDoc_STRVAR(put_doc, "put(header, seq, record_len, step, forward, payload_off, src, n)\n"
                      "--\n\n"
                      "Write one whole TENSOR record at the head and move the head past it, when it needs\n"
                      "nothing first: it fits before the end of the region, in space known to be free, in\n"
                      "pages populated (strap_ringbuf.h's srb_ready). The encoded header area (bytes), then\n"
                      "seq, record_len, step and forward, then n payload bytes copied from address src (a\n"
                      "live contiguous CPU tensor's data pointer) to payload_off. True when written; False,\n"
                      "writing nothing, when the record needs a PAD, space or pages first, or the ring is\n"
                      "closed.");

static PyObject *
ring_put(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    RingObject *self = (RingObject *)o;
    PutArgs a;
    if (nargs_check("put", nargs, 8) || parse_put("put", args, &a) < 0)
        return NULL;
    if (self->closed || !srb_ready(&self->r, a.rec_len))
        Py_RETURN_FALSE;
    uint8_t *d = put_header(self, &a);
    if (a.n > 0)
        memcpy(d + a.payload_off, (const void *)(uintptr_t)a.src, (size_t)a.n);
    self->r.head += a.rec_len;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(put_cuda_doc, "put_cuda(header, seq, record_len, step, forward, payload_off, src, n, stream)\n"
                           "--\n\n"
                           "put with the payload queued, not copied: n bytes from device address src by the bound\n"
                           "cudaMemcpyAsync (bind_cuda_memcpy; device to host) on the raw CUDA stream stream. The\n"
                           "bytes land when the stream reaches the copy; the caller publishes the record only after\n"
                           "an event recorded behind it completed. False as put's; RuntimeError when no\n"
                           "cudaMemcpyAsync is bound or it returns an error (then nothing is written and the head\n"
                           "stays).");

static PyObject *
ring_put_cuda(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    RingObject *self = (RingObject *)o;
    PutArgs a;
    uint64_t stream;
    if (nargs_check("put_cuda", nargs, 9) || parse_put("put_cuda", args, &a) < 0 || u64_arg(args[8], "stream", &stream))
        return NULL;
    speedups_cuda_memcpy_fn fn = speedups_cuda_memcpy();
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "put_cuda: no cudaMemcpyAsync bound");
        return NULL;
    }
    if (self->closed || !srb_ready(&self->r, a.rec_len))
        Py_RETURN_FALSE;
    if (a.n > 0) {
        uint8_t *d = srb_at(&self->r, self->r.head);
        int rc = fn(d + a.payload_off, (const void *)(uintptr_t)a.src, (size_t)a.n, SPEEDUPS_CUDA_D2H,
                    (void *)(uintptr_t)stream);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "cudaMemcpyAsync of a %llu-byte record failed with cudaError %d",
                         (unsigned long long)a.n, rc);
            return NULL;
        }
    }
    put_header(self, &a); /* the header follows the queued copy */
    self->r.head += a.rec_len;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(put_token_doc,
             "put_token(seq, index, token_id, position, text)\n"
             "--\n\n"
             "Write a TOKEN record (PROTOCOL.md 2, \"TOKEN records\") of sequence number seq at the head, a\n"
             "PAD first where the region ends too soon, and move the head past it: the token's index,\n"
             "its id and position (ints, stored as two's complement u64), its UTF-8 text (bytes, at most\n"
             "MAX_TOKEN_TEXT). True when written; False, writing nothing, when it does not fit the space\n"
             "known to be free now (strap_ringbuf.h's srb_put_token) or the ring is closed.");

static PyObject *
ring_put_token(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    RingObject *self = (RingObject *)o;
    uint64_t seq, index, token_id, position;
    char *text;
    Py_ssize_t n;
    if (nargs_check("put_token", nargs, 5) || u64_arg(args[0], "seq", &seq) || u64_arg(args[1], "index", &index) ||
        u64_masked(args[2], "token_id", &token_id) || u64_masked(args[3], "position", &position) ||
        PyBytes_AsStringAndSize(args[4], &text, &n) < 0)
        return NULL;
    if ((uint64_t)n > SR_MAX_TOKEN_TEXT) {
        PyErr_Format(PyExc_ValueError, "put_token: a text of %zd bytes exceeds %d", n, SR_MAX_TOKEN_TEXT);
        return NULL;
    }
    if (self->closed)
        Py_RETURN_FALSE;
    return PyBool_FromLong(srb_put_token(&self->r, seq, index, (int64_t)token_id, (int64_t)position, text, (size_t)n));
}

/* ----- space --------------------------------------------------------------------------------- */

PyDoc_STRVAR(placement_doc, "placement(record_len)\n"
                            "--\n\n"
                            "(pad_len, needed) for a record written at the head: the PAD needed first (0 when the\n"
                            "record fits before the end of the region) and the bytes of free space it takes.");

static PyObject *
ring_placement(PyObject *o, PyObject *arg)
{
    RingObject *self = (RingObject *)o;
    uint64_t rec_len;
    if (u64_arg(arg, "record_len", &rec_len))
        return NULL;
    uint64_t pad = srb_pad_for(&self->r, rec_len);
    return Py_BuildValue("(KK)", (unsigned long long)pad, (unsigned long long)(pad + rec_len));
}

PyDoc_STRVAR(fits_doc, "fits(needed)\n"
                       "--\n\n"
                       "Whether needed bytes can be written now without overwriting unreleased data.");

static PyObject *
ring_fits(PyObject *o, PyObject *arg)
{
    uint64_t needed;
    if (u64_arg(arg, "needed", &needed))
        return NULL;
    return PyBool_FromLong(srb_fits(&((RingObject *)o)->r, needed));
}

PyDoc_STRVAR(release_doc, "release(tail)\n"
                          "--\n\n"
                          "Apply a RELEASE: tails only grow and never pass the head (PROTOCOL.md 3). ValueError\n"
                          "(the tail unchanged) for a tail past the head or behind the one released: the daemon\n"
                          "would be reading bytes it gave back, a protocol error.");

static PyObject *
ring_release(PyObject *o, PyObject *arg)
{
    uint64_t tail;
    char why[256];
    if (u64_arg(arg, "tail", &tail))
        return NULL;
    if (srb_release(&((RingObject *)o)->r, tail, why, sizeof why) != 0) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(populate_doc, "populate(end)\n"
                           "--\n\n"
                           "Populate the pages up to data position end (and a chunk beyond) before the first lap\n"
                           "writes there. Only a speed-up.");

static PyObject *
ring_populate(PyObject *o, PyObject *arg)
{
    RingObject *self = (RingObject *)o;
    uint64_t end;
    if (u64_arg(arg, "end", &end) || ring_open(self))
        return NULL;
    srb_populate(&self->r, end);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(place_doc, "place(pad_len, record_len)\n"
                        "--\n\n"
                        "Make the head ready for a record of record_len bytes: a PAD of pad_len bytes (from\n"
                        "placement: the rest of the region; 0: none) written and the head moved past it, the\n"
                        "pages populated. ValueError unless the space is free (fits).");

static PyObject *
ring_place(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    RingObject *self = (RingObject *)o;
    uint64_t pad, rec_len;
    if (nargs_check("place", nargs, 2) || u64_arg(args[0], "pad_len", &pad) ||
        u64_arg(args[1], "record_len", &rec_len) || ring_open(self))
        return NULL;
    /* a PAD fills the rest of the region, nothing else */
    uint64_t rest = self->r.data_size - self->r.head % self->r.data_size;
    if ((pad != 0 && pad != rest) || (pad == 0 && rec_len > rest) || !srb_fits(&self->r, pad + rec_len)) {
        PyErr_Format(PyExc_ValueError, "place: a %llu-byte PAD and a %llu-byte record do not fit at head %llu",
                     (unsigned long long)pad, (unsigned long long)rec_len, (unsigned long long)self->r.head);
        return NULL;
    }
    srb_place(&self->r, pad, rec_len);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(write_header_doc, "write_header(header)\n"
                               "--\n\n"
                               "Write a record's header area (bytes) at the head; return the record's file offset.\n"
                               "The head stays (the caller moves it past the whole record).");

static PyObject *
ring_write_header(PyObject *o, PyObject *arg)
{
    RingObject *self = (RingObject *)o;
    char *hdr;
    Py_ssize_t n;
    if (ring_open(self) || PyBytes_AsStringAndSize(arg, &hdr, &n) < 0)
        return NULL;
    uint64_t off = self->r.head % self->r.data_size;
    if ((uint64_t)n > self->r.data_size - off) {
        PyErr_Format(PyExc_ValueError, "write_header: %zd bytes do not fit before the end of the region", n);
        return NULL;
    }
    memcpy(srb_at(&self->r, self->r.head), hdr, (size_t)n);
    return PyLong_FromUnsignedLongLong(SR_HEADER_SIZE + off);
}

PyDoc_STRVAR(write_raw_doc, "write_raw(file_off, data)\n"
                            "--\n\n"
                            "Copy bytes into the mapping at file offset file_off (tests, tiny payloads).");

static PyObject *
ring_write_raw(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    RingObject *self = (RingObject *)o;
    uint64_t off;
    char *data;
    Py_ssize_t n;
    if (nargs_check("write_raw", nargs, 2) || u64_arg(args[0], "file_off", &off) || ring_open(self) ||
        PyBytes_AsStringAndSize(args[1], &data, &n) < 0)
        return NULL;
    if (off > self->r.ring_size || (uint64_t)n > self->r.ring_size - off) {
        PyErr_Format(PyExc_ValueError, "write_raw: %zd bytes at %llu are past the ring", n, (unsigned long long)off);
        return NULL;
    }
    memcpy(self->r.base + off, data, (size_t)n);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(store_published_doc, "store_published(pos)\n"
                                  "--\n\n"
                                  "Store the published cursor (PROTOCOL.md 1.4, \"Deferred PUBLISH\") with release\n"
                                  "semantics: every record below pos complete before a daemon that loads it sees it.");

static PyObject *
ring_store_published(PyObject *o, PyObject *arg)
{
    RingObject *self = (RingObject *)o;
    uint64_t pos;
    if (u64_arg(arg, "pos", &pos) || ring_open(self))
        return NULL;
    srb_store_published(&self->r, pos);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(reset_doc, "reset()\n"
                        "--\n\n"
                        "Start again at position 0 for a new session (a kept ring): the pages stay populated,\n"
                        "the published cursor goes back to 0.");

static PyObject *
ring_reset(PyObject *o, PyObject *unused)
{
    (void)unused;
    RingObject *self = (RingObject *)o;
    if (ring_open(self))
        return NULL;
    srb_reset(&self->r);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(close_doc, "close()\n"
                        "--\n\n"
                        "Close the memfd (idempotent); nothing is written into the ring after. The mapping\n"
                        "goes with the object, once no view of it is left.");

static PyObject *
ring_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    RingObject *self = (RingObject *)o;
    self->closed = 1;
    srb_close_fd(&self->r);
    Py_RETURN_NONE;
}

static PyMethodDef ring_methods[] = {
    {"put", (PyCFunction)(void (*)(void))ring_put, METH_FASTCALL, put_doc},
    {"put_cuda", (PyCFunction)(void (*)(void))ring_put_cuda, METH_FASTCALL, put_cuda_doc},
    {"put_token", (PyCFunction)(void (*)(void))ring_put_token, METH_FASTCALL, put_token_doc},
    {"placement", ring_placement, METH_O, placement_doc},
    {"fits", ring_fits, METH_O, fits_doc},
    {"release", ring_release, METH_O, release_doc},
    {"populate", ring_populate, METH_O, populate_doc},
    {"place", (PyCFunction)(void (*)(void))ring_place, METH_FASTCALL, place_doc},
    {"write_header", ring_write_header, METH_O, write_header_doc},
    {"write_raw", (PyCFunction)(void (*)(void))ring_write_raw, METH_FASTCALL, write_raw_doc},
    {"store_published", ring_store_published, METH_O, store_published_doc},
    {"reset", ring_reset, METH_NOARGS, reset_doc},
    {"close", ring_close, METH_NOARGS, close_doc},
    {NULL, NULL, 0, NULL},
};

/* ----- attributes ---------------------------------------------------------------------------- */

static PyObject *
get_u64(uint64_t v)
{
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *
ring_get_head(PyObject *o, void *c)
{
    (void)c;
    return get_u64(((RingObject *)o)->r.head);
}

static int
ring_set_head(PyObject *o, PyObject *v, void *c)
{
    (void)c;
    RingObject *self = (RingObject *)o;
    uint64_t head;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "head cannot be deleted");
        return -1;
    }
    if (u64_arg(v, "head", &head))
        return -1;
    /* the head moves forward, past whole records in free space */
    if (head < self->r.tail || head - self->r.tail > self->r.data_size || head % 64) {
        PyErr_Format(PyExc_ValueError, "head %llu: not a 64-byte position within the region past tail %llu",
                     (unsigned long long)head, (unsigned long long)self->r.tail);
        return -1;
    }
    self->r.head = head;
    return 0;
}

static PyObject *
ring_get_tail(PyObject *o, void *c)
{
    (void)c;
    return get_u64(((RingObject *)o)->r.tail);
}

static PyObject *
ring_get_populated(PyObject *o, void *c)
{
    (void)c;
    return get_u64(((RingObject *)o)->r.populated);
}

static PyObject *
ring_get_used(PyObject *o, void *c)
{
    (void)c;
    return get_u64(srb_used(&((RingObject *)o)->r));
}

static PyObject *
ring_get_fd(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromLong(((RingObject *)o)->r.fd);
}

static PyObject *
ring_get_ring_size(PyObject *o, void *c)
{
    (void)c;
    return get_u64(((RingObject *)o)->r.ring_size);
}

static PyObject *
ring_get_data_size(PyObject *o, void *c)
{
    (void)c;
    return get_u64(((RingObject *)o)->r.data_size);
}

static PyObject *
ring_get_base(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(((RingObject *)o)->r.base);
}

static PyObject *
ring_get_closed(PyObject *o, void *c)
{
    (void)c;
    return PyBool_FromLong(((RingObject *)o)->closed);
}

static PyObject *
ring_get_mapping(PyObject *o, void *c)
{
    (void)c;
    PyObject *m = ((RingObject *)o)->mapping;
    Py_INCREF(m);
    return m;
}

static PyGetSetDef ring_getset[] = {
    {"mapping", ring_get_mapping, NULL, "the mapping's owner: a view of the mapping holds it", NULL},
    {"head", ring_get_head, ring_set_head, "next write position (bytes written since the start, never wraps)", NULL},
    {"tail", ring_get_tail, NULL, "newest position released by strapd", NULL},
    {"populated", ring_get_populated, NULL, "data bytes from the start populated (2**64-1: all)", NULL},
    {"used", ring_get_used, NULL, "bytes written but not yet released", NULL},
    {"fd", ring_get_fd, NULL, "the memfd sent to strapd in OPEN (-1 once closed)", NULL},
    {"ring_size", ring_get_ring_size, NULL, "total bytes", NULL},
    {"data_size", ring_get_data_size, NULL, "bytes of the record region", NULL},
    {"base", ring_get_base, NULL, "the mapping's address (valid while the object lives)", NULL},
    {"closed", ring_get_closed, NULL, "close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ring_slots[] = {
    {Py_tp_new, ring_new},
    {Py_tp_dealloc, ring_dealloc},
    {Py_tp_methods, ring_methods},
    {Py_tp_getset, ring_getset},
    {Py_tp_doc, "Ring(ring_size)\n--\n\n"
                "A sealed memfd ring of ring_size bytes (4096 + a positive multiple of 64) mapped read-write:\n"
                "libstrap's ring (strap_ringbuf.h). ValueError for a bad size, OSError when the kernel\n"
                "refuses it."},
    {0, NULL},
};

static PyType_Spec ring_spec = {
    "llm_instrumentation._speedups.Ring", sizeof(RingObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, ring_slots,
};

int
speedups_ring_add(PyObject *m)
{
    mapping_type = PyType_FromSpec(&mapping_spec);
    if (mapping_type == NULL)
        return -1;
    PyObject *t = PyType_FromSpec(&ring_spec);
    if (t == NULL)
        return -1;
    Py_INCREF(t);
    ring_type = t;
    if (PyModule_AddObject(m, "Ring", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

srb_ring *
speedups_ring_srb(PyObject *o)
{
    if (ring_type == NULL || !PyObject_TypeCheck(o, (PyTypeObject *)ring_type)) {
        PyErr_SetString(PyExc_TypeError, "a _speedups.Ring is required");
        return NULL;
    }
    RingObject *r = (RingObject *)o;
    if (r->closed || r->r.base == NULL) {
        PyErr_SetString(PyExc_ValueError, "the ring is closed");
        return NULL;
    }
    return &r->r;
}
