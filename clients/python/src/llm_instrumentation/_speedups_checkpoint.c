/*
 * The checkpoint file of docs/CHECKPOINTS.md 3, bound for checkpoint.py: libstrap's parser and
 * encoder (clients/c/common/strap_checkpoint.c, compiled into this extension as libstrap
 * compiles it), so the client side reads and writes checkpoints once. Part of the _speedups
 * module (its methods are added by _speedups.c's module_exec).
 *
 * checkpoint_parse raises ValueError(reason) for a file the format refuses; checkpoint_encode
 * raises ValueError for facts no reader would take back (or a member that is not JSON).
 *
 * The durable writes are libstrap's too (the same file's sck_write_atomic, sck_unlink_durable,
 * sck_append_sync), the GIL let go around the I/O: write_atomic, unlink_durable and
 * append_sync raise OSError(errno, message naming the step and the path), the subclass its
 * errno picks (FileNotFoundError, PermissionError...), as os's functions do.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "strap_checkpoint.h"

#include "_speedups.h"

/* A JSON string value unescaped, as str (NULL with an exception set). */
static PyObject *
json_str(sj_val v)
{
    char *buf = PyMem_Malloc(v.n + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    PyObject *s = NULL;
    if (sj_str(v, buf, v.n + 1, NULL))
        s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "strict");
    else
        PyErr_SetString(PyExc_ValueError, "not a JSON string");
    PyMem_Free(buf);
    return s;
}

/* [(name, value as JSON bytes)] of the document's members that are not the format's, in the
 * file's order (a repeated name comes twice: the caller keeps the last, as the reader does). */
static PyObject *
other_members(sj_val doc)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    const char *it = doc.p;
    sj_val k, v;
    while (sj_object_next(doc, &it, &k, &v)) {
        PyObject *key = json_str(k);
        if (key == NULL)
            goto fail;
        Py_ssize_t kl;
        const char *ks = PyUnicode_AsUTF8AndSize(key, &kl);
        if (ks == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        if (sck_format_key(ks, (size_t)kl)) {
            Py_DECREF(key);
            continue;
        }
        PyObject *pair = Py_BuildValue("(Ny#)", key, v.p, (Py_ssize_t)v.n);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

PyDoc_STRVAR(checkpoint_parse_doc,
             "checkpoint_parse(data: bytes) -> (stream, fingerprint, created, stream_offset, packets, drops, "
             "last_seq, last_packet_offset, last_packet_crc, token_count, forward_count, token_log, others, "
             "tokens)\n\nParse and check a checkpoint file (the rules of internal/checkpoint Parse). token_log: "
             "(tokens, bytes, crc32c) or None; others: [(name, value as JSON bytes)] of the members that are "
             "not the format's; tokens: 1.3.1's list as JSON bytes, or None. ValueError(reason) for a file the "
             "format refuses.");

static PyObject *
checkpoint_parse(PyObject *self, PyObject *arg)
{
    (void)self;
    char *buf;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &buf, &n) < 0)
        return NULL;
    sck_checkpoint *c = PyMem_Malloc(sizeof *c); /* 5 KiB of names: not on the stack */
    if (c == NULL)
        return PyErr_NoMemory();
    char why[256];
    PyObject *res = NULL, *created = NULL, *log = NULL, *others = NULL, *tokens = NULL;
    if (sck_parse(buf, (size_t)n, c, why, sizeof why) != 0) {
        PyErr_SetString(PyExc_ValueError, why);
        goto out;
    }
    if (c->created.p != NULL)
        created = json_str(c->created);
    else
        created = PyUnicode_FromString("");
    if (created == NULL)
        goto out;
    if (c->has_token_log)
        log = Py_BuildValue("(KKK)", (unsigned long long)c->log_tokens, (unsigned long long)c->log_bytes,
                            (unsigned long long)c->log_crc32c);
    else
        log = Py_NewRef(Py_None);
    if (log == NULL)
        goto out;
    sj_val doc = {buf, (size_t)n};
    while (doc.n && *doc.p != '{')
        doc.p++, doc.n--;
    if ((others = other_members(doc)) == NULL)
        goto out;
    if (c->tokens.p != NULL)
        tokens = PyBytes_FromStringAndSize(c->tokens.p, (Py_ssize_t)c->tokens.n);
    else
        tokens = Py_NewRef(Py_None);
    if (tokens == NULL)
        goto out;
    res = Py_BuildValue("(ssOKKKKKKKKOOO)", c->stream, c->fingerprint, created, (unsigned long long)c->stream_offset,
                        (unsigned long long)c->packets, (unsigned long long)c->drops, (unsigned long long)c->last_seq,
                        (unsigned long long)c->last_packet_offset, (unsigned long long)c->last_packet_crc,
                        (unsigned long long)c->token_count, (unsigned long long)c->forward_count, log, others, tokens);
out:
    Py_XDECREF(created);
    Py_XDECREF(log);
    Py_XDECREF(others);
    Py_XDECREF(tokens);
    PyMem_Free(c);
    return res;
}

/* A str or bytes as UTF-8 bytes (borrowed from o); -1 with an exception. */
static int
text_arg(PyObject *o, const char *what, const char **s, Py_ssize_t *n)
{
    if (PyBytes_Check(o)) {
        char *p;
        if (PyBytes_AsStringAndSize(o, &p, n) < 0)
            return -1;
        *s = p;
        return 0;
    }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str or bytes", what);
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(o, n);
    return *s == NULL ? -1 : 0;
}

/* A str without NUL into a fixed field of cap bytes. */
static int
name_arg(PyObject *o, const char *what, char *out, size_t cap)
{
    const char *s;
    Py_ssize_t n;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return -1;
    }
    if ((s = PyUnicode_AsUTF8AndSize(o, &n)) == NULL)
        return -1;
    if ((size_t)n >= cap || strlen(s) != (size_t)n) {
        PyErr_Format(PyExc_ValueError, "%s must be a str of at most %zu bytes without NUL", what, cap - 1);
        return -1;
    }
    memcpy(out, s, (size_t)n + 1);
    return 0;
}

/* The members of a list as sck_member (into *out, PyMem_Malloc'd; with_keys: (name, JSON)
 * pairs, else JSON texts); *bytes grows by their size. -1 with an exception. */
static int
members_arg(PyObject *list, const char *what, bool with_keys, sck_member **out, size_t *count, size_t *bytes)
{
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list", what);
        return -1;
    }
    Py_ssize_t len = PyList_Size(list);
    *out = PyMem_Malloc(sizeof **out * (size_t)(len ? len : 1));
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *e = PyList_GetItem(list, i), *value = e; /* borrowed: the list holds them */
        sck_member *m = &(*out)[i];
        Py_ssize_t kl = 0, vl;
        m->key = NULL;
        if (with_keys) {
            if (!PyTuple_Check(e) || PyTuple_Size(e) != 2) {
                PyErr_Format(PyExc_TypeError, "%s entries must be (name, JSON) pairs", what);
                return -1;
            }
            if (text_arg(PyTuple_GetItem(e, 0), "a member's name", &m->key, &kl) < 0)
                return -1;
            value = PyTuple_GetItem(e, 1);
        }
        if (text_arg(value, what, &m->json, &vl) < 0)
            return -1;
        m->key_len = (size_t)kl;
        m->json_len = (size_t)vl;
        *bytes += 6 * (size_t)kl + (size_t)vl + 8; /* a name escaped at worst \u00XX a byte */
    }
    *count = (size_t)len;
    return 0;
}

PyDoc_STRVAR(checkpoint_encode_doc,
             "checkpoint_encode(stream, fingerprint, created, stream_offset, packets, drops, last_seq, "
             "last_packet_offset, last_packet_crc, token_count, forward_count, token_log, others, tokens) -> "
             "bytes\n\nThe checkpoint file's bytes (docs/CHECKPOINTS.md 3). token_log: (tokens, bytes, crc32c) "
             "or None; others: [(name, value as JSON)] written after the format's members; tokens: 1.3.1's "
             "list, each entry one token's JSON, written last, or None. ValueError for facts no reader would "
             "take back, or a member that is not one JSON value.");

static PyObject *
checkpoint_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("checkpoint_encode", nargs, 14) < 0)
        return NULL;
    sck_checkpoint *c = PyMem_Calloc(1, sizeof *c);
    if (c == NULL)
        return PyErr_NoMemory();
    sck_member *others = NULL, *tokens = NULL;
    size_t nothers = 0, ntokens = 0, cap = 1024;
    char *buf = NULL;
    PyObject *res = NULL;
    const char *created;
    Py_ssize_t created_len;
    static const char *const names[] = {"stream_offset",      "packets",         "drops",       "last_seq",
                                        "last_packet_offset", "last_packet_crc", "token_count", "forward_count"};
    uint64_t *nums[] = {&c->stream_offset,      &c->packets,         &c->drops,       &c->last_seq,
                        &c->last_packet_offset, &c->last_packet_crc, &c->token_count, &c->forward_count};
    if (name_arg(args[0], "stream", c->stream, sizeof c->stream) < 0 ||
        name_arg(args[1], "fingerprint", c->fingerprint, sizeof c->fingerprint) < 0)
        goto out;
    if (!PyUnicode_Check(args[2]) || (created = PyUnicode_AsUTF8AndSize(args[2], &created_len)) == NULL ||
        strlen(created) != (size_t)created_len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "created must be a str without NUL");
        goto out;
    }
    for (int i = 0; i < 8; i++)
        if (u64_arg(args[3 + i], names[i], nums[i]) < 0)
            goto out;
    if (args[11] != Py_None) {
        if (!PyTuple_Check(args[11]) || PyTuple_Size(args[11]) != 3) {
            PyErr_SetString(PyExc_TypeError, "token_log must be (tokens, bytes, crc32c) or None");
            goto out;
        }
        c->has_token_log = true;
        if (u64_arg(PyTuple_GetItem(args[11], 0), "token_log.tokens", &c->log_tokens) < 0 ||
            u64_arg(PyTuple_GetItem(args[11], 1), "token_log.bytes", &c->log_bytes) < 0 ||
            u64_arg(PyTuple_GetItem(args[11], 2), "token_log.crc32c", &c->log_crc32c) < 0)
            goto out;
    }
    cap += 6 * (strlen(c->stream) + strlen(c->fingerprint) + (size_t)created_len);
    if (members_arg(args[12], "others", true, &others, &nothers, &cap) < 0)
        goto out;
    if (args[13] != Py_None && members_arg(args[13], "tokens", false, &tokens, &ntokens, &cap) < 0)
        goto out;
    if ((buf = PyMem_Malloc(cap)) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    sw_buf b = {buf, 0, cap, false};
    char why[256];
    if (sck_encode(&b, c, created, others, nothers, args[13] != Py_None ? tokens : NULL, ntokens, why, sizeof why) != 0)
        PyErr_SetString(PyExc_ValueError, why);
    else
        res = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
out:
    PyMem_Free(buf);
    PyMem_Free(others);
    PyMem_Free(tokens);
    PyMem_Free(c);
    return res;
}

/* OSError(-r, why): the subclass of the errno (FileNotFoundError...) as OSError's constructor
 * picks it. NULL. */
static PyObject *
os_error(int r, const char *why)
{
    PyObject *e = PyObject_CallFunction(PyExc_OSError, "is", -r, why);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* A bytes argument (borrowed: bytes do not change while the GIL is let go). -1 with TypeError. */
static int
bytes_arg(PyObject *o, const char *what, char **p, Py_ssize_t *n)
{
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes", what);
        return -1;
    }
    return PyBytes_AsStringAndSize(o, p, n);
}

PyDoc_STRVAR(write_atomic_doc,
             "write_atomic(path, data: bytes, mode: int) -> None\n\nReplace path with data atomically and "
             "durably (strap_checkpoint.c's sck_write_atomic): a temp file PATH.tmp.PID beside it created with "
             "mode, every byte written, fsync, rename over path, fsync of the directory. On a failure before the "
             "rename the temp file is removed and path untouched. OSError naming the step and the path.");

static PyObject *
write_atomic(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("write_atomic", nargs, 3) < 0)
        return NULL;
    PyObject *path = NULL;
    char *data;
    Py_ssize_t n;
    if (!PyUnicode_FSConverter(args[0], &path))
        return NULL;
    long mode = PyLong_AsLong(args[2]);
    if (bytes_arg(args[1], "data", &data, &n) < 0 || (mode == -1 && PyErr_Occurred())) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AsString(path);
    char why[1024];
    PyThreadState *ts = PyEval_SaveThread();
    int r = sck_write_atomic(p, data, (size_t)n, (int)mode, why, sizeof why);
    PyEval_RestoreThread(ts);
    Py_DECREF(path);
    if (r != 0)
        return os_error(r, why);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(unlink_durable_doc,
             "unlink_durable(path) -> None\n\nRemove path and fsync its directory (strap_checkpoint.c's "
             "sck_unlink_durable). OSError naming the step and the path (FileNotFoundError when there is none).");

static PyObject *
unlink_durable(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    const char *p = PyBytes_AsString(path);
    char why[1024];
    PyThreadState *ts = PyEval_SaveThread();
    int r = sck_unlink_durable(p, why, sizeof why);
    PyEval_RestoreThread(ts);
    Py_DECREF(path);
    if (r != 0)
        return os_error(r, why);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(append_sync_doc,
             "append_sync(fd: int, data: bytes, name: str) -> None\n\nAppend data to fd (opened O_APPEND; "
             "every byte written, EINTR retried), then fdatasync (strap_checkpoint.c's sck_append_sync): the "
             "token log's step at each checkpoint. OSError naming the step and name; part of data may then be "
             "in the file.");

static PyObject *
append_sync(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("append_sync", nargs, 3) < 0)
        return NULL;
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0)
        return NULL;
    char *data;
    Py_ssize_t n;
    if (bytes_arg(args[1], "data", &data, &n) < 0)
        return NULL;
    PyObject *name = NULL;
    if (!PyUnicode_FSConverter(args[2], &name))
        return NULL;
    const char *p = PyBytes_AsString(name);
    char why[1024];
    PyThreadState *ts = PyEval_SaveThread();
    int r = sck_append_sync(fd, p, data, (size_t)n, why, sizeof why);
    PyEval_RestoreThread(ts);
    Py_DECREF(name);
    if (r != 0)
        return os_error(r, why);
    Py_RETURN_NONE;
}

PyMethodDef speedups_checkpoint_methods[] = {
    {"checkpoint_parse", checkpoint_parse, METH_O, checkpoint_parse_doc},
    {"checkpoint_encode", (PyCFunction)(void (*)(void))checkpoint_encode, METH_FASTCALL, checkpoint_encode_doc},
    {"write_atomic", (PyCFunction)(void (*)(void))write_atomic, METH_FASTCALL, write_atomic_doc},
    {"unlink_durable", unlink_durable, METH_O, unlink_durable_doc},
    {"append_sync", (PyCFunction)(void (*)(void))append_sync, METH_FASTCALL, append_sync_doc},
    {NULL, NULL, 0, NULL},
};
