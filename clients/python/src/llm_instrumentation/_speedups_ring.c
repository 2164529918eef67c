/*
 * The ring as a type of the _speedups module, Ring: libstrap's ring (clients/c/common/strap_ringbuf.h:
 * the sealed memfd and its mapping, head and tail, the PAD that ends the region, the pages
 * populated ahead of the first lap, a RELEASE's checks, the published cursor's release store),
 * which _ring.py subclasses and _session.py writes records into. What moves the head once a
 * session is open is libstrap's session (_speedups_session.c: its put and put_cuda are the
 * hooks' common record in one call).
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

/* ----- space --------------------------------------------------------------------------------- */

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
    {"release", ring_release, METH_O, release_doc},
    {"populate", ring_populate, METH_O, populate_doc},
    {"write_header", ring_write_header, METH_O, write_header_doc},
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
