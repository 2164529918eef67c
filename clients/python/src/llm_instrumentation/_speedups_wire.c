/*
 * The control messages of docs/PROTOCOL.md 1: libstrap's encoder of every body a client sends and
 * its decoder of every reply (clients/c/common/strap_wire.c, compiled into this extension as
 * libstrap compiles it), bound for the tests' typed bodies (clients/python/tests/wire.py: golden
 * files, malformed replies, fake daemons); the client's own session sends and reads them in C.
 * Part of the _speedups module (its methods are added by _speedups.c's module_exec).
 *
 * Encoders return the whole datagram as bytes, or raise ValueError when it exceeds the
 * protocol's 65536 bytes (or a string holds a NUL the C encoder cannot take). The decoders
 * raise ValueError(reason, code) for bytes the protocol refuses: code is "protocol_version"
 * for a reply of another version, else None; tests/wire.py raises StrapdProtocolError from it.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "strap_wire.h"

#include "_speedups.h"

/* The datagram in b as bytes, or ValueError when it did not fit one message. */
static PyObject *
finish(const sw_buf *b, int type)
{
    if (b->overflow)
        return PyErr_Format(PyExc_ValueError, "%s message exceeds %d bytes", sp_type_name(type), SP_MAX_MESSAGE);
    return PyBytes_FromStringAndSize(b->p, (Py_ssize_t)b->n);
}

/* A str as UTF-8 without NUL (the C encoders take C strings); *n its length (may be NULL). */
static const char *
str_arg(PyObject *o, const char *what, Py_ssize_t *n)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(o, &len);
    if (s == NULL)
        return NULL;
    if (n != NULL)
        *n = len;
    else if (strlen(s) != (size_t)len) {
        PyErr_Format(PyExc_ValueError, "%s holds a NUL character", what);
        return NULL;
    }
    return s;
}

PyDoc_STRVAR(encode_publish_doc, "encode_publish(head, seq) -> bytes: the PUBLISH datagram.");

static PyObject *
encode_publish(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t head, seq;
    if (nargs_check("encode_publish", nargs, 2) < 0 || u64_arg(args[0], "head", &head) < 0 ||
        u64_arg(args[1], "seq", &seq) < 0)
        return NULL;
    char buf[128];
    sw_buf b = {buf, 0, sizeof buf, false};
    sp_enc_publish(&b, head, seq);
    return finish(&b, SP_PUBLISH);
}

PyDoc_STRVAR(encode_token_doc, "encode_token(seq, index, token_id, text, position, head) -> bytes: the TOKEN\n"
                               "datagram (position, head: None to leave them out).");

static PyObject *
encode_token(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t seq, index, head = 0;
    int64_t token_id, position = 0;
    Py_ssize_t text_len;
    const char *text;
    if (nargs_check("encode_token", nargs, 6) < 0 || u64_arg(args[0], "seq", &seq) < 0 ||
        u64_arg(args[1], "index", &index) < 0 || i64_arg(args[2], "token_id", &token_id) < 0 ||
        (text = str_arg(args[3], "text", &text_len)) == NULL ||
        (args[4] != Py_None && i64_arg(args[4], "position", &position) < 0) ||
        (args[5] != Py_None && u64_arg(args[5], "head", &head) < 0))
        return NULL;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    if (buf == NULL)
        return PyErr_NoMemory();
    sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
    sp_enc_token(&b, seq, index, token_id, text, (size_t)text_len, args[4] != Py_None, position, args[5] != Py_None,
                 head);
    PyObject *out = finish(&b, SP_TOKEN);
    PyMem_Free(buf);
    return out;
}

PyDoc_STRVAR(encode_drop_doc, "encode_drop(seq, name, step, forward, bytes, reason) -> bytes: the DROP datagram.");

static PyObject *
encode_drop(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t seq, step, forward, nbytes;
    Py_ssize_t name_len;
    const char *name, *reason;
    if (nargs_check("encode_drop", nargs, 6) < 0 || u64_arg(args[0], "seq", &seq) < 0 ||
        (name = str_arg(args[1], "name", &name_len)) == NULL || u64_arg(args[2], "step", &step) < 0 ||
        u64_arg(args[3], "forward", &forward) < 0 || u64_arg(args[4], "bytes", &nbytes) < 0 ||
        (reason = str_arg(args[5], "reason", NULL)) == NULL)
        return NULL;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    if (buf == NULL)
        return PyErr_NoMemory();
    sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
    sp_enc_drop(&b, seq, name, (size_t)name_len, step, forward, nbytes, reason);
    PyObject *out = finish(&b, SP_DROP);
    PyMem_Free(buf);
    return out;
}

PyDoc_STRVAR(encode_close_doc, "encode_close(seq, head, drops) -> bytes: the CLOSE datagram.");

static PyObject *
encode_close(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t seq, head, drops;
    if (nargs_check("encode_close", nargs, 3) < 0 || u64_arg(args[0], "seq", &seq) < 0 ||
        u64_arg(args[1], "head", &head) < 0 || u64_arg(args[2], "drops", &drops) < 0)
        return NULL;
    char buf[128];
    sw_buf b = {buf, 0, sizeof buf, false};
    sp_enc_close(&b, seq, head, drops);
    return finish(&b, SP_CLOSE);
}

PyDoc_STRVAR(encode_checkpoint_doc, "encode_checkpoint(seq) -> bytes: the CHECKPOINT datagram.");

static PyObject *
encode_checkpoint(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t seq;
    if (u64_arg(arg, "seq", &seq) < 0)
        return NULL;
    char buf[64];
    sw_buf b = {buf, 0, sizeof buf, false};
    sp_enc_checkpoint(&b, seq);
    return finish(&b, SP_CHECKPOINT);
}

PyDoc_STRVAR(encode_status_doc, "encode_status() -> bytes: the STATUS datagram.");

static PyObject *
encode_status(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    char buf[32];
    sw_buf b = {buf, 0, sizeof buf, false};
    sp_enc_status(&b);
    return finish(&b, SP_STATUS);
}

PyDoc_STRVAR(encode_hello_doc, "encode_hello(client, pid) -> bytes: the HELLO datagram (protocol 1).");

static PyObject *
encode_hello(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const char *client;
    int64_t pid;
    if (nargs_check("encode_hello", nargs, 2) < 0 || (client = str_arg(args[0], "client", NULL)) == NULL ||
        i64_arg(args[1], "pid", &pid) < 0)
        return NULL;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    if (buf == NULL)
        return PyErr_NoMemory();
    sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
    sp_enc_hello(&b, client, pid);
    PyObject *out = finish(&b, SP_HELLO);
    PyMem_Free(buf);
    return out;
}

PyDoc_STRVAR(encode_open_doc,
             "encode_open(ring_size, codec, codec_level, policy, block_size, lossy_mode, lossy_value, append_at,\n"
             "resume, memory_hint, metadata, resources, upload, upload_free_local) -> bytes: the OPEN datagram.\n"
             "None leaves a field out; block_size and memory_hint 0 too, resources and upload_free_local\n"
             "false too; append_at goes with resume, a (last_seq, last_crc, packets) tuple; metadata is\n"
             "the JSON object's bytes.");

static PyObject *
encode_open(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("encode_open", nargs, 14) < 0)
        return NULL;
    sp_open_body o;
    memset(&o, 0, sizeof o);
    if (u64_arg(args[0], "ring_size", &o.ring_size) < 0 || (o.codec = str_arg(args[1], "codec", NULL)) == NULL ||
        (o.policy = str_arg(args[3], "policy", NULL)) == NULL)
        return NULL;
    if (args[2] != Py_None) {
        o.has_codec_level = 1;
        if (i64_arg(args[2], "codec_level", &o.codec_level) < 0)
            return NULL;
    }
    if (args[4] != Py_None && u64_arg(args[4], "block_size", &o.block_size) < 0)
        return NULL;
    if (args[5] != Py_None) {
        if ((o.lossy_mode = str_arg(args[5], "lossy mode", NULL)) == NULL)
            return NULL;
        if (args[6] != Py_None) {
            o.has_lossy_value = 1;
            o.lossy_value = PyFloat_AsDouble(args[6]);
            if (o.lossy_value == -1.0 && PyErr_Occurred())
                return NULL;
        }
    }
    if ((args[7] == Py_None) != (args[8] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "OPEN's append_at and resume go together");
        return NULL;
    }
    if (args[7] != Py_None) {
        o.has_resume = 1;
        if (u64_arg(args[7], "append_at", &o.append_at) < 0 ||
            !PyArg_ParseTuple(args[8], "KKK:resume", &o.resume_last_seq, &o.resume_last_crc, &o.resume_packets))
            return NULL;
    }
    if (args[9] != Py_None && u64_arg(args[9], "memory_hint", &o.memory_hint) < 0)
        return NULL;
    if (args[10] != Py_None) {
        char *meta;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(args[10], &meta, &n) < 0)
            return NULL;
        o.metadata = meta, o.metadata_len = (size_t)n;
    }
    if ((o.resources = PyObject_IsTrue(args[11])) < 0 || (o.upload_free_local = PyObject_IsTrue(args[13])) < 0)
        return NULL;
    if (args[12] != Py_None && (o.upload = str_arg(args[12], "upload", NULL)) == NULL)
        return NULL;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    if (buf == NULL)
        return PyErr_NoMemory();
    sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
    sp_enc_open(&b, &o);
    PyObject *out = finish(&b, SP_OPEN);
    PyMem_Free(buf);
    return out;
}

PyDoc_STRVAR(encode_resources_doc,
             "encode_resources(events) -> bytes: the RESOURCES datagram of a list of serialized events\n"
             "(bytes, each a JSON object with a string \"event\"); ValueError when they do not fit one.");

int
speedups_events(PyObject *list, const char ***evs, size_t **lens, Py_ssize_t *n)
{
    *evs = NULL;
    *lens = NULL;
    *n = PyList_Size(list);
    if (*n < 0)
        return -1;
    *evs = PyMem_Calloc((size_t)*n + 1, sizeof **evs);
    *lens = PyMem_Calloc((size_t)*n + 1, sizeof **lens);
    if (*evs == NULL || *lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PyList_GetItem(list, i), &p, &len) < 0)
            return -1;
        while (len > 0 && p[len - 1] == '\n')
            len--;
        (*evs)[i] = p, (*lens)[i] = (size_t)len;
    }
    return 0;
}

static PyObject *
encode_resources(PyObject *self, PyObject *arg)
{
    (void)self;
    const char **evs;
    size_t *lens;
    Py_ssize_t n;
    char *buf = PyMem_Malloc(SP_MAX_MESSAGE);
    PyObject *out = NULL;
    if (speedups_events(arg, &evs, &lens, &n) < 0 || buf == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    sw_buf b = {buf, 0, SP_MAX_MESSAGE, false};
    size_t next = 0;
    char why[256];
    int rc = sp_pack_resources(&b, evs, lens, (size_t)n, &next, why, sizeof why);
    if (rc == SP_E_INVALID)
        PyErr_SetString(PyExc_ValueError, why);
    else if (rc != SP_OK || next != (size_t)n)
        PyErr_Format(PyExc_ValueError, "RESOURCES message exceeds %d bytes", SP_MAX_MESSAGE);
    else
        out = finish(&b, SP_RESOURCES);
done:
    PyMem_Free(evs);
    PyMem_Free(lens);
    PyMem_Free(buf);
    return out;
}

/* ----- reading ----- */

/* ValueError(reason, code): tests/wire.py raises StrapdProtocolError(reason, code=code). The
 * reason quotes the daemon's bytes (cut to fit err): never a decode error of its own. */
static PyObject *
protocol_error(const char *why, const char *code)
{
    PyObject *e = Py_BuildValue("(Nz)", PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace"), code);
    if (e != NULL) {
        PyErr_SetObject(PyExc_ValueError, e);
        Py_DECREF(e);
    }
    return NULL;
}

PyDoc_STRVAR(decode_frame_doc,
             "decode_frame(data) -> (version, type, start, end): the framing of any message (PROTOCOL.md 1.1),\n"
             "its body one valid JSON object at data[start:end]; ValueError(reason, None) otherwise.");

static PyObject *
decode_frame(PyObject *self, PyObject *arg)
{
    (void)self;
    char *d;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &d, &n) < 0)
        return NULL;
    int version, type;
    sj_val body;
    char why[256];
    if (sp_decode_frame((const uint8_t *)d, (size_t)n, &version, &type, &body, why, sizeof why) != SP_OK)
        return protocol_error(why, NULL);
    return Py_BuildValue("(iinn)", version, type, (Py_ssize_t)(body.p - d), (Py_ssize_t)(body.p + body.n - d));
}

static int
set_u64(PyObject *kw, const char *key, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int rc = o == NULL ? -1 : PyDict_SetItemString(kw, key, o);
    Py_XDECREF(o);
    return rc;
}

static int
set_i64(PyObject *kw, const char *key, int64_t v)
{
    PyObject *o = PyLong_FromLongLong(v);
    int rc = o == NULL ? -1 : PyDict_SetItemString(kw, key, o);
    Py_XDECREF(o);
    return rc;
}

static int
set_bool(PyObject *kw, const char *key, int v)
{
    return PyDict_SetItemString(kw, key, v ? Py_True : Py_False);
}

static int
set_str(PyObject *kw, const char *key, const char *s)
{
    PyObject *o = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), NULL);
    int rc = o == NULL ? -1 : PyDict_SetItemString(kw, key, o);
    Py_XDECREF(o);
    return rc;
}

/* A string value the decoder checked, unescaped whole (short: the decoder's own copy). */
static int
set_json_str(PyObject *kw, const char *key, sj_val v, const char *short_copy)
{
    if (v.p == NULL)
        return set_str(kw, key, short_copy);
    char *s = PyMem_Malloc(v.n + 1);
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    sj_str(v, s, v.n + 1, NULL);
    int rc = set_str(kw, key, s);
    PyMem_Free(s);
    return rc;
}

PyDoc_STRVAR(decode_reply_doc,
             "decode_reply(data) -> (version, type, fields): one datagram from the daemon, decoded by\n"
             "libstrap's sp_decode_reply; fields are the body's dataclass keywords (None for STATUS_REPLY,\n"
             "whose validated body the caller reads as JSON). ValueError(reason, code) for anything the\n"
             "protocol refuses.");

static PyObject *
decode_reply(PyObject *self, PyObject *arg)
{
    (void)self;
    char *d;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &d, &n) < 0)
        return NULL;
    sp_reply *r = PyMem_Malloc(sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory();
    char why[512];
    PyObject *kw = NULL, *out = NULL;
    if (sp_decode_reply((const uint8_t *)d, (size_t)n, r, why, sizeof why) != SP_OK) {
        protocol_error(why, r->version != SP_VERSION && r->type != SP_ERROR && r->type != 0 &&
                                    strncmp(why, "daemon speaks protocol", 22) == 0
                                ? "protocol_version"
                                : NULL);
        goto done;
    }
    if (r->type == SP_STATUS_REPLY) {
        out = Py_BuildValue("(iiO)", r->version, r->type, Py_None);
        goto done;
    }
    if ((kw = PyDict_New()) == NULL)
        goto done;
    int rc = 0;
    switch (r->type) {
    case SP_WELCOME:
        rc = set_i64(kw, "protocol", r->u.welcome.protocol) ||
             set_json_str(kw, "daemon", r->u.welcome.daemon_json, r->u.welcome.daemon) ||
             set_i64(kw, "pid", r->u.welcome.pid) || set_i64(kw, "max_message", r->u.welcome.max_message) ||
             (r->u.welcome.has_max_ring_size && set_u64(kw, "max_ring_size", r->u.welcome.max_ring_size));
        break;
    case SP_OPENED:
        rc = set_u64(kw, "session", r->u.opened.session) || set_u64(kw, "block_size", r->u.opened.block_size) ||
             (r->u.opened.upload[0] && set_str(kw, "upload", r->u.opened.upload)) ||
             (r->u.opened.has_published_cursor && set_bool(kw, "published_cursor", r->u.opened.published_cursor)) ||
             (r->u.opened.has_ring_tokens && set_bool(kw, "ring_tokens", r->u.opened.ring_tokens));
        break;
    case SP_RELEASE:
        rc = set_u64(kw, "tail", r->u.release.tail);
        break;
    case SP_CLOSED:
        rc = set_u64(kw, "packets", r->u.closed.packets) || set_u64(kw, "drops", r->u.closed.drops) ||
             set_u64(kw, "bytes_in", r->u.closed.bytes_in) || set_u64(kw, "bytes_out", r->u.closed.bytes_out) ||
             set_u64(kw, "file_bytes", r->u.closed.file_bytes) ||
             (r->u.closed.upload[0] && set_str(kw, "upload", r->u.closed.upload));
        break;
    case SP_ERROR:
        rc = set_str(kw, "code", r->u.error.code) ||
             set_json_str(kw, "message", r->u.error.message_json, r->u.error.message) ||
             set_bool(kw, "fatal", r->u.error.fatal) ||
             (r->u.error.has_fits_ring_size && set_u64(kw, "fits_ring_size", r->u.error.fits_ring_size));
        break;
    case SP_CHECKPOINTED:
        rc = set_u64(kw, "seq", r->u.checkpointed.seq) || set_u64(kw, "offset", r->u.checkpointed.offset) ||
             set_u64(kw, "packets", r->u.checkpointed.packets) || set_u64(kw, "drops", r->u.checkpointed.drops) ||
             set_u64(kw, "tokens", r->u.checkpointed.tokens) ||
             set_u64(kw, "last_offset", r->u.checkpointed.last_offset) ||
             set_u64(kw, "last_crc", r->u.checkpointed.last_crc);
        break;
    }
    if (rc == 0)
        out = Py_BuildValue("(iiO)", r->version, r->type, kw);
done:
    Py_XDECREF(kw);
    PyMem_Free(r);
    return out;
}

PyMethodDef speedups_wire_methods[] = {
    {"encode_publish", (PyCFunction)(void (*)(void))encode_publish, METH_FASTCALL, encode_publish_doc},
    {"encode_token", (PyCFunction)(void (*)(void))encode_token, METH_FASTCALL, encode_token_doc},
    {"encode_drop", (PyCFunction)(void (*)(void))encode_drop, METH_FASTCALL, encode_drop_doc},
    {"encode_close", (PyCFunction)(void (*)(void))encode_close, METH_FASTCALL, encode_close_doc},
    {"encode_checkpoint", encode_checkpoint, METH_O, encode_checkpoint_doc},
    {"encode_status", encode_status, METH_NOARGS, encode_status_doc},
    {"encode_hello", (PyCFunction)(void (*)(void))encode_hello, METH_FASTCALL, encode_hello_doc},
    {"encode_open", (PyCFunction)(void (*)(void))encode_open, METH_FASTCALL, encode_open_doc},
    {"encode_resources", encode_resources, METH_O, encode_resources_doc},
    {"decode_frame", decode_frame, METH_O, decode_frame_doc},
    {"decode_reply", decode_reply, METH_O, decode_reply_doc},
    {NULL, NULL, 0, NULL},
};
