/*
 * A capture session once OPENED, as a type of the _speedups module, Session: libstrap's session
 * (clients/c/src/session.c, compiled into this extension), attached to the connection and the
 * ring the Python client opened (clients/c/src/attach.h). Sequence numbers, PUBLISH batching and
 * the published cursor, RELEASE and backpressure, DROP, TOKEN messages and records, CHECKPOINT
 * and CLOSE are libstrap's; _session.py keeps the tensors (layouts, copies, PART splitting, FP8).
 *
 * Failures raise SessionError(code, message, daemon_code, fatal), code a STRAP_E_* value, which
 * _session.py turns into the client's exceptions. A Python exception raised by the frontier
 * callable or by a signal handler while the session waits for strapd is raised as it is (the
 * session then has failed). Waits for strapd let the GIL go.
 *
 * Locks: libstrap's session has a mutex, and a call that lets the GIL go may hold it while a
 * callback wants the GIL back. Every call that can take the mutex is either made under the
 * Python session's own lock (_session.py: records, flush, tokens, checkpoint, close; one such
 * call at a time) or lets the GIL go before taking it (state, set_mode, set_ring_tokens).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attach.h"
#include "strap_channel.h"
#include "strap_ring.h"

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    strap_session *s;
    srb_ring *rb;
    PyObject *ring;     /* the Ring object: keeps rb */
    PyObject *frontier; /* callable(block) -> None | False | (head, seq), or NULL */
} SessionObject;

static PyObject *session_error; /* SessionError */

/* SessionError for the session's last failure (or the Python exception a callback raised). */
static PyObject *
fail(SessionObject *self, int code)
{
    if (PyErr_Occurred())
        return NULL;
    strap_error err;
    strap_session_last_error(self->s, &err);
    PyObject *v = Py_BuildValue("(issi)", code, err.message, err.daemon_code, err.fatal);
    if (v != NULL) {
        PyErr_SetObject(session_error, v);
        Py_DECREF(v);
    }
    return NULL;
}

/* ----- the callbacks libstrap makes (the GIL may have been let go) ----- */

static int
frontier_cb(void *user, int block, uint64_t *head, uint64_t *seq)
{
    SessionObject *self = user;
    if (self->frontier == NULL) /* no copies of the caller's (set and cleared under the GIL, with
                                   the caller's session lock held) */
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    if (self->frontier != NULL && !PyErr_Occurred()) {
        PyObject *r = PyObject_CallFunctionObjArgs(self->frontier, block ? Py_True : Py_False, NULL);
        if (r == NULL) {
            rc = -1;
        } else if (r == Py_None) {
            rc = 0;
        } else if (r == Py_False) {
            rc = 2;
        } else {
            unsigned long long h, q;
            if (PyArg_ParseTuple(r, "KK", &h, &q)) {
                *head = h;
                *seq = q;
                rc = 1;
            } else {
                rc = -1;
            }
        }
        Py_XDECREF(r);
    } else if (PyErr_Occurred()) {
        rc = -1;
    }
    PyGILState_Release(g);
    return rc;
}

static int
interrupted_cb(void *user)
{
    (void)user;
    PyGILState_STATE g = PyGILState_Ensure();
    int r = PyErr_CheckSignals() != 0;
    PyGILState_Release(g);
    return r;
}

/* ----- construction ----- */

static PyObject *
session_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {
        "sock", "ring",       "policy", "stall_timeout", "max_record",        "publish_bytes",
        "seq",  "session_id", "cursor", "ring_tokens",   "ring_tokens_every", "ring_tokens_seconds",
        NULL};
    int sock, cursor, ring_tokens;
    PyObject *ring;
    const char *policy;
    double stall, rt_seconds;
    unsigned long long max_record, publish_bytes, seq, session_id;
    unsigned int rt_every;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOsdKKKKppId", kwlist, &sock, &ring, &policy, &stall, &max_record,
                                     &publish_bytes, &seq, &session_id, &cursor, &ring_tokens, &rt_every, &rt_seconds))
        return NULL;
    int pol = strcmp(policy, "block") == 0 ? STRAP_POLICY_BLOCK : strcmp(policy, "drop") == 0 ? STRAP_POLICY_DROP : -1;
    if (pol < 0) {
        PyErr_Format(PyExc_ValueError, "policy %s is not 'block' or 'drop'", policy);
        return NULL;
    }
    srb_ring *rb = speedups_ring_srb(ring);
    if (rb == NULL)
        return NULL;
    SessionObject *self = (SessionObject *)PyType_GenericAlloc(type, 0);
    if (self == NULL)
        return NULL;
    self->rb = rb;
    Py_INCREF(ring);
    self->ring = ring;
    strap__attach a = {
        .sock = sock,
        .ring = rb,
        .policy = pol,
        .stall_timeout_s = stall,
        .max_record = max_record,
        .publish_bytes = publish_bytes,
        .seq = seq,
        .session_id = session_id,
        .cursor = cursor != 0,
        .ring_tokens = ring_tokens != 0,
        .ring_tokens_every = rt_every,
        .ring_tokens_seconds = rt_seconds,
        .frontier = frontier_cb,
        .frontier_user = self,
        .interrupted = interrupted_cb,
        .interrupt_user = self,
    };
    strap_error err;
    int e = strap__session_attach(&a, &self->s, &err);
    if (e) {
        PyErr_SetString(e == STRAP_E_NOMEM ? PyExc_MemoryError : PyExc_ValueError, err.message);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* ----- opening (strap__session_open_attached) ----- */

typedef struct {
    PyObject *connect, *take_ring; /* the caller's callables */
    PyObject *rings;               /* the Ring objects taken (a list) */
} OpenCtx;

/* A Python exception in a callback: the open fails with a code, the exception is raised. */
static int
callback_failed(strap_error *err)
{
    err->code = STRAP_E_SYSTEM;
    snprintf(err->message, sizeof err->message, "a Python callback raised");
    return STRAP_E_SYSTEM;
}

static int
open_connect_cb(void *user, strap_error *err)
{
    OpenCtx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    int fd = -1;
    PyObject *r = PyErr_Occurred() ? NULL : PyObject_CallNoArgs(c->connect);
    if (r != NULL) {
        fd = (int)PyLong_AsLong(r);
        Py_DECREF(r);
    }
    if (fd < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "connect returned no descriptor");
    int rc = fd >= 0 ? fd : callback_failed(err); /* a descriptor, or STRAP_E_SYSTEM (< 0) */
    PyGILState_Release(g);
    return rc;
}

static srb_ring *
open_ring_cb(void *user, uint64_t size, strap_error *err)
{
    OpenCtx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    srb_ring *rb = NULL;
    PyObject *r = PyErr_Occurred() ? NULL : PyObject_CallFunction(c->take_ring, "K", (unsigned long long)size);
    if (r != NULL) {
        rb = speedups_ring_srb(r);
        if (rb != NULL && PyList_Append(c->rings, r) < 0)
            rb = NULL;
        Py_DECREF(r);
    }
    if (rb == NULL)
        callback_failed(err);
    PyGILState_Release(g);
    return rb;
}

/* A ring the open did not keep: closed (Ring.close), dropped from the list. */
static void
open_ring_drop_cb(void *user, srb_ring *rb)
{
    OpenCtx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb); /* an exception already raised stays the one raised */
    for (Py_ssize_t i = PyList_Size(c->rings) - 1; i >= 0; i--) {
        PyObject *r = PyList_GetItem(c->rings, i);
        if (speedups_ring_srb(r) != rb) {
            PyErr_Clear();
            continue;
        }
        PyObject *x = PyObject_CallMethod(r, "close", NULL);
        if (x == NULL)
            PyErr_WriteUnraisable(r);
        Py_XDECREF(x);
        PySequence_DelItem(c->rings, i);
        break;
    }
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
    PyGILState_Release(g);
}

/* d[key] as an unsigned 64-bit number (absent or None: def). */
static int
dict_u64(PyObject *d, const char *key, uint64_t def, uint64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    if (v == NULL || v == Py_None) {
        *out = def;
        return 0;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* d[key] as a UTF-8 string borrowed from d (absent or None: NULL). */
static int
dict_str(PyObject *d, const char *key, const char **out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    *out = NULL;
    if (v == NULL || v == Py_None)
        return 0;
    *out = PyUnicode_AsUTF8AndSize(v, NULL);
    return *out == NULL ? -1 : 0;
}

PyDoc_STRVAR(open_doc, "open(connect, take_ring, client, request, metadata, transport, ring_size, ring_explicit, "
                       "ring_setting,\n     out_fd, trace_fd, resources_fd, policy, stall_timeout, seq, defer, "
                       "ring_tokens_every,\n     ring_tokens_seconds) -> (Session, Ring, opened)\n"
                       "--\n\n"
                       "libstrap's open (clients/c/src/open.c): connect() gives a connected socket's descriptor\n"
                       "(the caller's from then on), take_ring(size) a Ring; HELLO, the ring clamped to the daemon's\n"
                       "max_ring_size, OPEN with [ring, out_fd(, trace_fd)(, resources_fd)] (-1: none), OPENED, and\n"
                       "a default ring (ring_explicit False) the daemon's memory budget has no room for tried again\n"
                       "smaller (each ring not kept is closed). request: OPEN's fields (codec, codec_level,\n"
                       "block_size, lossy_mode, lossy_value, resume: (append_at, last_seq, last_crc, packets),\n"
                       "memory_hint, resources, upload, upload_free_local). metadata: the stream's metadata (a JSON\n"
                       "object) but its transport (transport: a JSON object of its members; the ring's size and\n"
                       "ring_shrunk_by_budget_from are added). opened: a dict (sock, session, block_size,\n"
                       "max_record, publish_bytes, published_cursor, ring_tokens, upload, fitted_from,\n"
                       "shrunk_from, max_ring_size). Failures raise SessionError(code, message, daemon_code, fatal,\n"
                       "fits_ring_size). The GIL is let go while it waits.");

static PyObject *
session_open(PyObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {
        "connect",   "take_ring",     "client",       "request", "metadata",          "transport",
        "ring_size", "ring_explicit", "ring_setting", "out_fd",  "trace_fd",          "resources_fd",
        "policy",    "stall_timeout", "seq",          "defer",   "ring_tokens_every", "ring_tokens_seconds",
        NULL};
    OpenCtx c = {NULL, NULL, NULL};
    PyObject *request;
    const char *client, *metadata, *transport, *ring_setting, *policy;
    unsigned long long ring_size, seq;
    int ring_explicit, out_fd, trace_fd, res_fd, defer;
    double stall, rt_seconds;
    unsigned int rt_every;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOsO!ssKpsiiisdKpId", kwlist, &c.connect, &c.take_ring, &client,
                                     &PyDict_Type, &request, &metadata, &transport, &ring_size, &ring_explicit,
                                     &ring_setting, &out_fd, &trace_fd, &res_fd, &policy, &stall, &seq, &defer,
                                     &rt_every, &rt_seconds))
        return NULL;
    int pol = strcmp(policy, "block") == 0 ? STRAP_POLICY_BLOCK : strcmp(policy, "drop") == 0 ? STRAP_POLICY_DROP : -1;
    if (pol < 0) {
        PyErr_Format(PyExc_ValueError, "policy %s is not 'block' or 'drop'", policy);
        return NULL;
    }
    strap__open o = {
        .connect = open_connect_cb,
        .ring = open_ring_cb,
        .ring_drop = open_ring_drop_cb,
        .user = &c,
        .client = client,
        .metadata = metadata,
        .transport = transport,
        .ring_size = ring_size,
        .ring_explicit = ring_explicit != 0,
        .ring_setting = ring_setting,
        .out_fd = out_fd,
        .trace_fd = trace_fd,
        .res_fd = res_fd,
        .defer = defer != 0,
    };
    sp_open_body *b = &o.body;
    uint64_t hint, resources, free_local;
    PyObject *lv = PyDict_GetItemString(request, "lossy_value"), *lvl = PyDict_GetItemString(request, "codec_level"),
             *resume = PyDict_GetItemString(request, "resume");
    long long level = lvl != NULL && lvl != Py_None ? PyLong_AsLongLong(lvl) : 0;
    if ((level == -1 && PyErr_Occurred()) || dict_str(request, "codec", &b->codec) ||
        dict_u64(request, "block_size", 0, &b->block_size) || dict_str(request, "lossy_mode", &b->lossy_mode) ||
        dict_u64(request, "memory_hint", 0, &hint) || dict_u64(request, "resources", 0, &resources) ||
        dict_str(request, "upload", &b->upload) || dict_u64(request, "upload_free_local", 0, &free_local))
        return NULL;
    if (b->codec == NULL) {
        PyErr_SetString(PyExc_ValueError, "open: request has no codec");
        return NULL;
    }
    b->has_codec_level = lvl != NULL && lvl != Py_None;
    b->codec_level = (int64_t)level;
    b->memory_hint = hint;
    b->resources = resources != 0;
    b->upload_free_local = free_local != 0;
    if (lv != NULL && lv != Py_None) {
        b->has_lossy_value = 1;
        b->lossy_value = PyFloat_AsDouble(lv);
        if (b->lossy_value == -1.0 && PyErr_Occurred())
            return NULL;
    }
    if (resume != NULL && resume != Py_None) {
        unsigned long long at, ls, lc, pk;
        if (!PyArg_ParseTuple(resume, "KKKK", &at, &ls, &lc, &pk))
            return NULL;
        b->has_resume = 1;
        b->append_at = at;
        b->resume_last_seq = ls;
        b->resume_last_crc = lc;
        b->resume_packets = pk;
    }
    SessionObject *self = (SessionObject *)PyType_GenericAlloc((PyTypeObject *)type, 0);
    if (self == NULL)
        return NULL;
    c.rings = PyList_New(0);
    strap__opened *op = PyMem_Malloc(sizeof *op);
    if (c.rings == NULL || op == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    o.attach = (strap__attach){
        .policy = pol,
        .stall_timeout_s = stall,
        .seq = seq,
        .ring_tokens_every = rt_every,
        .ring_tokens_seconds = rt_seconds,
        .frontier = frontier_cb,
        .frontier_user = self,
        .interrupted = interrupted_cb,
        .interrupt_user = self,
    };
    strap_error err;
    int e;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__session_open_attached(&o, op, &self->s, &err);
    Py_END_ALLOW_THREADS;
    if (e) {
        if (!PyErr_Occurred()) {
            PyObject *v = Py_BuildValue("(issiK)", e, err.message, err.daemon_code, err.fatal,
                                        (unsigned long long)op->fits_ring_size);
            if (v != NULL) {
                PyErr_SetObject(session_error, v);
                Py_DECREF(v);
            }
        }
        goto fail;
    }
    /* the ring kept is the last one taken (the others were given back) */
    Py_ssize_t n = PyList_Size(c.rings);
    PyObject *ring = n > 0 ? PyList_GetItem(c.rings, n - 1) : NULL;
    if (ring == NULL || speedups_ring_srb(ring) != op->ring) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "open: the ring sent is not the last one taken");
        goto fail;
    }
    Py_INCREF(ring);
    self->ring = ring;
    self->rb = op->ring;
    PyObject *out = Py_BuildValue(
        "(NO{s:i,s:K,s:K,s:K,s:K,s:N,s:N,s:s,s:K,s:K,s:K})", (PyObject *)self, ring, "sock", op->sock, "session",
        (unsigned long long)op->session_id, "block_size", (unsigned long long)op->block_size, "max_record",
        (unsigned long long)op->max_record, "publish_bytes", (unsigned long long)op->publish_bytes, "published_cursor",
        PyBool_FromLong(op->published_cursor), "ring_tokens", PyBool_FromLong(op->ring_tokens), "upload", op->upload,
        "fitted_from", (unsigned long long)op->fitted_from, "shrunk_from", (unsigned long long)op->shrunk_from,
        "max_ring_size", (unsigned long long)op->max_ring_size);
    PyMem_Free(op);
    Py_DECREF(c.rings);
    if (out == NULL) /* the session and its socket go with self */
        return NULL;
    return out;
fail:
    PyMem_Free(op);
    Py_XDECREF(c.rings);
    Py_DECREF(self);
    return NULL;
}

static void
session_dealloc(PyObject *o)
{
    SessionObject *self = (SessionObject *)o;
    PyTypeObject *tp = Py_TYPE(o);
    strap_session_free(self->s);
    Py_XDECREF(self->frontier);
    Py_XDECREF(self->ring);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

/* ----- records ----- */

/* put's arguments: header, record_len, step, forward, payload_off, src, n. */
typedef struct {
    const char *hdr;
    Py_ssize_t hdr_len;
    uint64_t rec_len, step, forward, payload_off, src, n;
} PutArgs;

static int
parse_put(const char *fn, PyObject *const *args, PutArgs *a)
{
    char *hdr;
    if (PyBytes_AsStringAndSize(args[0], &hdr, &a->hdr_len) < 0)
        return -1;
    a->hdr = hdr;
    if (u64_arg(args[1], "record_len", &a->rec_len) || u64_arg(args[2], "step", &a->step) ||
        u64_arg(args[3], "forward", &a->forward) || u64_arg(args[4], "payload_off", &a->payload_off) ||
        u64_arg(args[5], "src", &a->src) || u64_arg(args[6], "n", &a->n))
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

/* The header at the head with its per-record fields (seq: the next one). */
static uint8_t *
put_header(SessionObject *self, const PutArgs *a)
{
    uint8_t *d = srb_at(self->rb, self->rb->head);
    memcpy(d, a->hdr, (size_t)a->hdr_len);
    sr_put_record_fields(d, strap__session_next_seq(self->s), a->rec_len, a->step, a->forward);
    return d;
}

PyDoc_STRVAR(put_doc, "put(header, record_len, step, forward, payload_off, src, n) -> int\n"
                      "--\n\n"
                      "One whole TENSOR record at the head with the next sequence number, when it needs\n"
                      "nothing first (a PAD, space, pages) and the session takes records: the encoded header\n"
                      "area, n payload bytes copied from address src (a live contiguous CPU tensor's data),\n"
                      "the head moved on and, once the unpublished bytes reach publish_bytes, a PUBLISH: its\n"
                      "sequence number. 0, writing nothing, otherwise.");

/* put and put_cuda: the record at the head, its payload copied (src a host address) or queued
 * by cudaMemcpyAsync on a raw CUDA stream (published by the caller once it counted the copy). */
static PyObject *
put_any(PyObject *o, PyObject *const *args, Py_ssize_t nargs, int cuda)
{
    SessionObject *self = (SessionObject *)o;
    const char *fn_name = cuda ? "put_cuda" : "put";
    PutArgs a;
    uint64_t stream = 0;
    if (nargs_check(fn_name, nargs, cuda ? 8 : 7) || parse_put(fn_name, args, &a) < 0 ||
        (cuda && u64_arg(args[7], "stream", &stream)))
        return NULL;
    speedups_cuda_memcpy_fn fn = cuda ? speedups_cuda_memcpy() : NULL;
    if (cuda && fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "put_cuda: no cudaMemcpyAsync bound");
        return NULL;
    }
    if (!strap__session_ready(self->s, a.rec_len))
        return PyLong_FromLong(0);
    uint64_t seq = strap__session_next_seq(self->s);
    uint8_t *d = srb_at(self->rb, self->rb->head);
    if (a.n > 0 && cuda) {
        int rc = fn(d + a.payload_off, (const void *)(uintptr_t)a.src, (size_t)a.n, SPEEDUPS_CUDA_D2H,
                    (void *)(uintptr_t)stream);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "cudaMemcpyAsync of a %llu-byte record failed with cudaError %d",
                         (unsigned long long)a.n, rc);
            return NULL;
        }
    } else if (a.n > 0) {
        memcpy(d + a.payload_off, (const void *)(uintptr_t)a.src, (size_t)a.n);
    }
    put_header(self, &a); /* after the payload: a queued copy's too */
    int e = strap__session_advance(self->s, a.rec_len, a.n, !cuda);
    if (e)
        return fail(self, e);
    return PyLong_FromUnsignedLongLong(seq);
}

static PyObject *
session_put(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    return put_any(o, args, nargs, 0);
}

PyDoc_STRVAR(put_cuda_doc, "put_cuda(header, record_len, step, forward, payload_off, src, n, stream) -> int\n"
                           "--\n\n"
                           "put with the payload queued, not copied: n bytes from device address src by the bound\n"
                           "cudaMemcpyAsync on the raw CUDA stream. Nothing is published: the caller records the\n"
                           "copy's completion, then calls publish(False, True). RuntimeError when no\n"
                           "cudaMemcpyAsync is bound or it fails (nothing written, the head stays).");

static PyObject *
session_put_cuda(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    return put_any(o, args, nargs, 1);
}

PyDoc_STRVAR(claim_doc, "claim(record_len, mode, name, tensor_len, step, forward) -> int\n"
                        "--\n\n"
                        "Room at the head for one record (a PAD first where the region ends too soon, pages\n"
                        "populated): its sequence number. mode 0: now or not at all (0: no room); 1: a tensor's\n"
                        "first record (0: dropped under policy drop, a DROP of tensor_len bytes sent); 2: a\n"
                        "later PART record (waits). Write the record, then advance().");

static PyObject *
session_claim(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    SessionObject *self = (SessionObject *)o;
    uint64_t rec_len, mode, nbytes, step, forward, seq = 0;
    Py_ssize_t name_len;
    if (nargs_check("claim", nargs, 6) || u64_arg(args[0], "record_len", &rec_len) || u64_arg(args[1], "mode", &mode))
        return NULL;
    const char *name = PyUnicode_AsUTF8AndSize(args[2], &name_len);
    if (name == NULL || u64_arg(args[3], "tensor_len", &nbytes) || u64_arg(args[4], "step", &step) ||
        u64_arg(args[5], "forward", &forward))
        return NULL;
    int e;
    if (mode == STRAP__CLAIM_NOW) {
        e = strap__session_claim(self->s, rec_len, (int)mode, name, (size_t)name_len, nbytes, step, forward, &seq);
    } else {
        Py_BEGIN_ALLOW_THREADS;
        e = strap__session_claim(self->s, rec_len, (int)mode, name, (size_t)name_len, nbytes, step, forward, &seq);
        Py_END_ALLOW_THREADS;
    }
    if (e == STRAP_DROPPED || e == STRAP__NO_ROOM)
        return PyLong_FromLong(0);
    if (e)
        return fail(self, e);
    return PyLong_FromUnsignedLongLong(seq);
}

PyDoc_STRVAR(advance_doc, "advance(record_len, payload_len, publish)\n"
                          "--\n\n"
                          "The claimed record is written (its copy queued): its sequence number taken, the head\n"
                          "moved on, its payload counted; with publish, a PUBLISH once publish_bytes are waiting.");

static PyObject *
session_advance(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    SessionObject *self = (SessionObject *)o;
    uint64_t rec_len, plen;
    if (nargs_check("advance", nargs, 3) || u64_arg(args[0], "record_len", &rec_len) ||
        u64_arg(args[1], "payload_len", &plen))
        return NULL;
    int publish = PyObject_IsTrue(args[2]);
    if (publish < 0)
        return NULL;
    int e = strap__session_advance(self->s, rec_len, plen, publish != 0);
    if (e)
        return fail(self, e);
    Py_RETURN_NONE;
}

/* write's copy callback: the Python callable called with (dst address, offset, n, seq,
 * record end) for each record's payload, the GIL taken back for it. */
typedef struct {
    PyObject *fn;
    srb_ring *rb;
    uint64_t hdr; /* the header area's length: the record starts hdr bytes before dst */
} CopyCtx;

static int
copy_cb(void *ctx, void *dst, size_t offset, size_t len)
{
    CopyCtx *c = ctx;
    const uint8_t *rec = (const uint8_t *)dst - c->hdr;
    uint64_t seq = sr_get_le64(rec + SR_SEQ_OFFSET), rec_len = sr_get_le64(rec + SR_SEQ_OFFSET + 8);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r =
        PyObject_CallFunction(c->fn, "KnnKK", (unsigned long long)(uintptr_t)dst, (Py_ssize_t)offset, (Py_ssize_t)len,
                              (unsigned long long)seq, (unsigned long long)(c->rb->head + rec_len));
    int rc = r == NULL ? -1 : 0;
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

PyDoc_STRVAR(write_doc, "write(name, dtype, shape, tensor_len, meta, step, forward, src, copy) -> bool\n"
                        "--\n\n"
                        "One tensor as one record, or PART records where it exceeds the record size: its bytes\n"
                        "copied from address src (src non-zero), or written by copy(dst, offset, n, seq,\n"
                        "record_end) into the ring at address dst for each record (the GIL taken back for it;\n"
                        "an exception it raises fails the write: before the first record nothing is written,\n"
                        "after it the session ends). meta: JSON object bytes, or None. True when written, False\n"
                        "when dropped under policy drop (a DROP sent).");

static PyObject *
session_write(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    SessionObject *self = (SessionObject *)o;
    Py_ssize_t name_len, meta_len = 0;
    uint64_t dtype, nbytes, step, forward, src;
    int64_t shape[SR_MAX_NDIM];
    if (nargs_check("write", nargs, 9))
        return NULL;
    const char *name = PyUnicode_AsUTF8AndSize(args[0], &name_len);
    if (name == NULL || u64_arg(args[1], "dtype", &dtype) || u64_arg(args[3], "tensor_len", &nbytes) ||
        u64_arg(args[5], "step", &step) || u64_arg(args[6], "forward", &forward) || u64_arg(args[7], "src", &src))
        return NULL;
    PyObject *shp = PySequence_Tuple(args[2]);
    if (shp == NULL)
        return NULL;
    Py_ssize_t ndim = PyTuple_Size(shp);
    if (ndim > SR_MAX_NDIM) {
        Py_DECREF(shp);
        PyErr_Format(PyExc_ValueError, "%s: %zd dimensions (at most %d)", name, ndim, SR_MAX_NDIM);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        shape[i] = PyLong_AsLongLong(PyTuple_GetItem(shp, i));
        if (shape[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(shp);
            return NULL;
        }
    }
    Py_DECREF(shp);
    const char *meta = NULL;
    if (args[4] != Py_None) {
        char *m;
        if (PyBytes_AsStringAndSize(args[4], &m, &meta_len) < 0)
            return NULL;
        if (strlen(m) != (size_t)meta_len) { /* libstrap reads it as a C string (bytes end in a NUL) */
            PyErr_Format(PyExc_ValueError, "%s: meta holds a NUL byte", name);
            return NULL;
        }
        meta = m;
    }
    CopyCtx ctx = {args[8] == Py_None ? NULL : args[8], self->rb,
                   sr_header_area((int)ndim, (size_t)name_len, (size_t)meta_len)};
    if (src == 0 && ctx.fn == NULL && nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: %llu bytes and neither src nor copy", name, (unsigned long long)nbytes);
        return NULL;
    }
    int e;
    strap_session *ss = self->s;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__session_write(ss, name, (int)dtype, shape, (int)ndim, src ? (const void *)(uintptr_t)src : NULL,
                             src ? NULL : copy_cb, &ctx, (size_t)nbytes, meta, step, forward);
    Py_END_ALLOW_THREADS;
    if (e == STRAP_DROPPED)
        Py_RETURN_FALSE;
    if (e)
        return fail(self, e);
    Py_RETURN_TRUE;
}

/* ----- messages ----- */

PyDoc_STRVAR(publish_doc, "publish(block, due_only=False)\n"
                          "--\n\n"
                          "One PUBLISH naming every complete record (block: the caller's copies waited for\n"
                          "first); with due_only, only once publish_bytes are waiting.");

static PyObject *
session_publish(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    SessionObject *self = (SessionObject *)o;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "publish(block, due_only=False)");
        return NULL;
    }
    int block = PyObject_IsTrue(args[0]), due = nargs > 1 ? PyObject_IsTrue(args[1]) : 0;
    if (block < 0 || due < 0)
        return NULL;
    int e = strap__session_publish(self->s, block != 0, due != 0);
    if (e)
        return fail(self, e);
    Py_RETURN_NONE;
}

static PyObject *
session_flush(PyObject *o, PyObject *unused)
{
    (void)unused;
    SessionObject *self = (SessionObject *)o;
    int e = strap_session_flush(self->s);
    if (e)
        return fail(self, e);
    Py_RETURN_NONE;
}

static PyObject *
session_drain(PyObject *o, PyObject *unused)
{
    (void)unused;
    SessionObject *self = (SessionObject *)o;
    int e = strap__session_drain(self->s);
    if (e)
        return fail(self, e);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(token_doc, "token(index, token_id, text, position) -> int\n"
                        "--\n\n"
                        "One token, its sequence number returned: a TOKEN record at the head with ring tokens\n"
                        "where it fits, else a TOKEN message naming the records before it (position None: none\n"
                        "given). A text that does not fit one message: SessionError STRAP_E_TOO_LARGE, nothing\n"
                        "sent, the session goes on.");

static PyObject *
session_token(PyObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    SessionObject *self = (SessionObject *)o;
    uint64_t index;
    int64_t token_id, position = -1;
    Py_ssize_t text_len;
    if (nargs_check("token", nargs, 4) || u64_arg(args[0], "index", &index) || i64_arg(args[1], "token_id", &token_id))
        return NULL;
    const char *text = PyUnicode_AsUTF8AndSize(args[2], &text_len);
    if (text == NULL || (args[3] != Py_None && i64_arg(args[3], "position", &position)))
        return NULL;
    uint64_t seq = 0;
    int e = strap__session_token_at(self->s, index, token_id, text, (size_t)text_len, position, &seq);
    if (e)
        return fail(self, e);
    return PyLong_FromUnsignedLongLong(seq);
}

PyDoc_STRVAR(tokens_to_ring_doc,
             "tokens_to_ring(tokens) -> int\n"
             "--\n\n"
             "TOKEN records for (position, token id) pairs, indices from the session's token count\n"
             "on, no text, one doorbell after them: how many (a prefix) were written.");

static PyObject *
session_tokens_to_ring(PyObject *o, PyObject *seqobj)
{
    SessionObject *self = (SessionObject *)o;
    PyObject *fast = PySequence_List(seqobj);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PyList_Size(fast);
    int64_t *v = PyMem_Malloc(sizeof(int64_t) * 2 * (size_t)(n ? n : 1));
    if (v == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long p, t;
        if (!PyArg_ParseTuple(PyList_GetItem(fast, i), "LL", &p, &t)) {
            PyMem_Free(v);
            Py_DECREF(fast);
            return NULL;
        }
        v[i] = p;
        v[n + i] = t;
    }
    Py_DECREF(fast);
    size_t done = 0;
    int e = strap__session_tokens_to_ring(self->s, v, v + n, (size_t)n, &done);
    PyMem_Free(v);
    if (e)
        return fail(self, e);
    return PyLong_FromSize_t(done);
}

PyDoc_STRVAR(checkpoint_doc, "checkpoint(timeout) -> (seq, offset, packets, drops, tokens, last_offset, last_crc)\n"
                             "--\n\n"
                             "CHECKPOINT for every event so far and its CHECKPOINTED (timeout <= 0: the stall\n"
                             "timeout, at least 60 s).");

static PyObject *
session_checkpoint(PyObject *o, PyObject *arg)
{
    SessionObject *self = (SessionObject *)o;
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    uint64_t v[7];
    int e;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__session_checkpoint_exchange(self->s, timeout, v);
    Py_END_ALLOW_THREADS;
    if (e)
        return fail(self, e);
    return Py_BuildValue("(KKKKKKK)", (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
                         (unsigned long long)v[3], (unsigned long long)v[4], (unsigned long long)v[5],
                         (unsigned long long)v[6]);
}

static PyObject *
session_close_send(PyObject *o, PyObject *fdseq)
{
    SessionObject *self = (SessionObject *)o;
    int fds[4];
    PyObject *fast = PySequence_List(fdseq);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PyList_Size(fast);
    if (n > 4) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "close_send: at most 4 descriptors");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        fds[i] = (int)PyLong_AsLong(PyList_GetItem(fast, i));
        if (fds[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    int e;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__session_close_send(self->s, fds, (int)n);
    Py_END_ALLOW_THREADS;
    if (e)
        return fail(self, e);
    Py_RETURN_NONE;
}

static PyObject *
session_close_wait(PyObject *o, PyObject *arg)
{
    SessionObject *self = (SessionObject *)o;
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    strap_closed c;
    char upload[2048];
    int e;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__session_close_wait(self->s, timeout, &c, upload, sizeof upload);
    Py_END_ALLOW_THREADS;
    if (e)
        return fail(self, e);
    return Py_BuildValue("(KKKKKs)", (unsigned long long)c.packets, (unsigned long long)c.drops,
                         (unsigned long long)c.bytes_in, (unsigned long long)c.bytes_out,
                         (unsigned long long)c.file_bytes, upload);
}

PyDoc_STRVAR(send_resources_doc,
             "send_resources(lines) -> int\n"
             "--\n\n"
             "RESOURCES messages (PROTOCOL.md 1.4) for the serialized events (bytes, each a JSON object\n"
             "with a string \"event\", a trailing newline ignored), as few as fit: the number sent. Sent\n"
             "on the connection as they are, beside the session's own messages (a datagram is whole),\n"
             "from any thread; the GIL is let go. ValueError when an event is not one or does not fit a\n"
             "message; OSError when the connection fails.");

static PyObject *
session_send_resources(PyObject *o, PyObject *arg)
{
    SessionObject *self = (SessionObject *)o;
    PyObject *fast = PySequence_List(arg);
    if (fast == NULL)
        return NULL;
    const char **evs;
    size_t *lens;
    Py_ssize_t n;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    PyObject *out = NULL;
    long sent = 0;
    if (speedups_events(fast, &evs, &lens, &n) < 0 || buf == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    int sock = strap__session_sock(self->s), rc = SP_OK, err = 0;
    char why[256] = "";
    Py_BEGIN_ALLOW_THREADS;
    for (size_t next = 0; next < (size_t)n && rc == SP_OK && !err;) {
        sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
        rc = sp_pack_resources(&b, evs, lens, (size_t)n, &next, why, sizeof why);
        int r = rc == SP_OK ? sch_send(sock, b.p, b.n, NULL, 0) : 0;
        if (r != 0)
            err = -r;
        sent += rc == SP_OK && !err;
    }
    Py_END_ALLOW_THREADS;
    if (rc == SP_E_TOO_LARGE)
        PyErr_Format(PyExc_ValueError, "a resource event does not fit in one message (%d bytes)", SP_MAX_MESSAGE);
    else if (rc != SP_OK)
        PyErr_SetString(PyExc_ValueError, why);
    else if (err)
        errno = err, PyErr_SetFromErrno(PyExc_OSError);
    else
        out = PyLong_FromLong(sent);
done:
    Py_DECREF(fast);
    PyMem_Free(evs);
    PyMem_Free(lens);
    PyMem_Free(buf);
    return out;
}

static PyObject *
session_shut(PyObject *o, PyObject *unused)
{
    (void)unused;
    strap__session_shut(((SessionObject *)o)->s);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(state_doc, "state() -> (seq, last_tensor_seq, tokens, records, bytes_in, drops, drop_bytes,\n"
                        "published_head, unsent_tokens, cursor_at, token_records, publishes, cursor, ring_tokens,\n"
                        "deferred, shut, failed, token_messages, token_heads)");

static PyObject *
session_state(PyObject *o, PyObject *unused)
{
    (void)unused;
    strap__state st;
    strap_session *ss = ((SessionObject *)o)->s;
    /* The GIL let go while the session's lock is taken: a thread inside a session call that
     * let the GIL go may hold that lock and want the GIL back (a callback). */
    Py_BEGIN_ALLOW_THREADS;
    strap__session_state(ss, &st);
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(KKKKKKKKKKKKNNNNNKK)", (unsigned long long)st.seq, (unsigned long long)st.last_tensor_seq,
                         (unsigned long long)st.tokens, (unsigned long long)st.records, (unsigned long long)st.bytes_in,
                         (unsigned long long)st.drops, (unsigned long long)st.drop_bytes,
                         (unsigned long long)st.published_head, (unsigned long long)st.unsent_tokens,
                         (unsigned long long)st.cursor_at, (unsigned long long)st.token_records,
                         (unsigned long long)st.publishes, PyBool_FromLong(st.cursor), PyBool_FromLong(st.ring_tokens),
                         PyBool_FromLong(st.deferred), PyBool_FromLong(st.shut), PyBool_FromLong(st.failed),
                         (unsigned long long)st.token_messages, (unsigned long long)st.token_heads);
}

static PyObject *
session_set_ring_tokens(PyObject *o, PyObject *args)
{
    unsigned int every;
    double seconds;
    if (!PyArg_ParseTuple(args, "Id", &every, &seconds))
        return NULL;
    strap_session *ss = ((SessionObject *)o)->s;
    Py_BEGIN_ALLOW_THREADS;
    strap__session_set_ring_tokens(ss, every, seconds);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyObject *
session_set_mode(PyObject *o, PyObject *args)
{
    int cursor, ring_tokens;
    long long seq;
    if (!PyArg_ParseTuple(args, "iiL", &cursor, &ring_tokens, &seq))
        return NULL;
    strap_session *ss = ((SessionObject *)o)->s;
    Py_BEGIN_ALLOW_THREADS;
    strap__session_set_mode(ss, cursor, ring_tokens, (int64_t)seq);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyObject *
session_set_frontier(PyObject *o, PyObject *fn)
{
    SessionObject *self = (SessionObject *)o;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_frontier takes a callable or None");
        return NULL;
    }
    PyObject *old = self->frontier;
    if (fn == Py_None) {
        self->frontier = NULL;
    } else {
        Py_INCREF(fn);
        self->frontier = fn;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef session_methods[] = {
    {"open", (PyCFunction)(void (*)(void))session_open, METH_VARARGS | METH_KEYWORDS | METH_CLASS, open_doc},
    {"put", (PyCFunction)(void (*)(void))session_put, METH_FASTCALL, put_doc},
    {"put_cuda", (PyCFunction)(void (*)(void))session_put_cuda, METH_FASTCALL, put_cuda_doc},
    {"claim", (PyCFunction)(void (*)(void))session_claim, METH_FASTCALL, claim_doc},
    {"advance", (PyCFunction)(void (*)(void))session_advance, METH_FASTCALL, advance_doc},
    {"write", (PyCFunction)(void (*)(void))session_write, METH_FASTCALL, write_doc},
    {"publish", (PyCFunction)(void (*)(void))session_publish, METH_FASTCALL, publish_doc},
    {"flush", session_flush, METH_NOARGS,
     "The end of a forward pass: PUBLISH, or the records left below the published cursor for the next TOKEN "
     "(generating), or with ring tokens the doorbell."},
    {"drain", session_drain, METH_NOARGS, "Handle every pending message (RELEASE, ERROR) without waiting."},
    {"token", (PyCFunction)(void (*)(void))session_token, METH_FASTCALL, token_doc},
    {"tokens_to_ring", session_tokens_to_ring, METH_O, tokens_to_ring_doc},
    {"checkpoint", session_checkpoint, METH_O, checkpoint_doc},
    {"close_send", session_close_send, METH_O,
     "close_send(fds): CLOSE with descriptors; the session takes no more records."},
    {"close_wait", session_close_wait, METH_O,
     "close_wait(timeout) -> (packets, drops, bytes_in, bytes_out, file_bytes, upload): CLOSED."},
    {"send_resources", session_send_resources, METH_O, send_resources_doc},
    {"shut", session_shut, METH_NOARGS, "Refuse records from now on."},
    {"state", session_state, METH_NOARGS, state_doc},
    {"set_ring_tokens", session_set_ring_tokens, METH_VARARGS,
     "set_ring_tokens(every, seconds): ring tokens' doorbell (every <= 1: a TOKEN message per token)."},
    {"set_mode", session_set_mode, METH_VARARGS,
     "set_mode(cursor, ring_tokens, seq): the message flow (1 or 0, -1 kept) and the last sequence number "
     "taken (-1 kept)."},
    {"set_frontier", session_set_frontier, METH_O,
     "set_frontier(fn): fn(block) -> None (every record complete), False (none of the pending copies "
     "is), or (head, seq) of the complete prefix; None removes it."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot session_slots[] = {
    {Py_tp_new, session_new},
    {Py_tp_dealloc, session_dealloc},
    {Py_tp_methods, session_methods},
    {Py_tp_doc, "Session(sock, ring, policy, stall_timeout, max_record, publish_bytes, seq, session_id, cursor, "
                "ring_tokens, ring_tokens_every, ring_tokens_seconds): libstrap's session after OPENED, over the "
                "connection's descriptor (not closed here) and the Ring sent with OPEN."},
    {0, NULL},
};

static PyType_Spec session_spec = {
    "llm_instrumentation._speedups.Session", sizeof(SessionObject), 0, Py_TPFLAGS_DEFAULT, session_slots,
};

int
speedups_session_add(PyObject *m)
{
    session_error = PyErr_NewException("llm_instrumentation._speedups.SessionError", NULL, NULL);
    if (session_error == NULL)
        return -1;
    Py_INCREF(session_error);
    if (PyModule_AddObject(m, "SessionError", session_error) < 0) {
        Py_DECREF(session_error);
        return -1;
    }
    PyObject *t = PyType_FromSpec(&session_spec);
    if (t == NULL)
        return -1;
    if (PyModule_AddObject(m, "Session", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    static const struct {
        const char *name;
        long value;
    } codes[] = {
        {"E_INVALID", STRAP_E_INVALID},   {"E_SYSTEM", STRAP_E_SYSTEM},       {"E_CLOSED", STRAP_E_CLOSED},
        {"E_PROTOCOL", STRAP_E_PROTOCOL}, {"E_DAEMON", STRAP_E_DAEMON},       {"E_TIMEOUT", STRAP_E_TIMEOUT},
        {"E_STATE", STRAP_E_STATE},       {"E_TOO_LARGE", STRAP_E_TOO_LARGE}, {"E_BUSY", STRAP_E_BUSY},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (PyModule_AddIntConstant(m, codes[i].name, codes[i].value) < 0)
            return -1;
    return 0;
}
