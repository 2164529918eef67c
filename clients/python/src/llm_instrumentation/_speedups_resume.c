/*
 * The resume point of docs/CHECKPOINTS.md 4, bound for checkpoint.py: libstrap's scan
 * (clients/c/common/strap_resume.c, compiled into this extension as libstrap compiles it), so
 * both clients find a resume point, check a checkpointed prefix and read back its tokens with one
 * piece of code. Part of the _speedups module (its methods are added by _speedups.c's
 * module_exec). The GIL is let go while the file is read; it is taken back for each token.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <string.h>

#include "attach.h"
#include "strap_resume.h"

#include "_speedups.h"

typedef struct collect {
    PyObject *list;  /* the tracker's dicts */
    PyObject *loads; /* json.loads, fetched for the first value that is not an int or a str */
    PyThreadState *released;
    int failed;
} collect;

/* A JSON value as Python's json reads it (NULL with an exception set). */
static PyObject *
json_value(collect *c, sj_val v)
{
    if (c->loads == NULL) {
        PyObject *json = PyImport_ImportModule("json");
        if (json == NULL)
            return NULL;
        c->loads = PyObject_GetAttrString(json, "loads");
        Py_DECREF(json);
        if (c->loads == NULL)
            return NULL;
    }
    PyObject *text = PyUnicode_DecodeUTF8(v.p, (Py_ssize_t)v.n, "strict");
    if (text == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(c->loads, text, NULL);
    Py_DECREF(text);
    return r;
}

/* The token as the tracker holds it: {token_index, token_id, token_text, position}. */
static PyObject *
token_dict(collect *c, const srs_token *t)
{
    PyObject *id = NULL, *text = NULL, *pos = NULL, *d = NULL;
    if (t->id_is_int)
        id = PyLong_FromLongLong(t->id_int);
    else if (t->id.p == NULL)
        id = Py_NewRef(Py_None);
    else
        id = json_value(c, t->id);
    if (id == NULL)
        goto out;
    if (t->text != NULL) {
        text = PyUnicode_DecodeUTF8(t->text, (Py_ssize_t)t->text_len, "strict");
    } else {
        /* not a string: the packet's value as it is, a list's as str() makes it (1.3.1's form) */
        PyObject *v = json_value(c, t->text_json);
        if (v != NULL && t->listed) {
            text = PyObject_Str(v);
            Py_DECREF(v);
        } else {
            text = v;
        }
    }
    if (text == NULL)
        goto out;
    pos = t->position_is_int ? PyLong_FromLongLong(t->position_int) : json_value(c, t->position);
    if (pos == NULL)
        goto out;
    d = Py_BuildValue("{sKsOsOsO}", "token_index", (unsigned long long)t->index, "token_id", id, "token_text", text,
                      "position", pos);
out:
    Py_XDECREF(id);
    Py_XDECREF(text);
    Py_XDECREF(pos);
    return d;
}

static int
give(void *user, const srs_token *t)
{
    collect *c = user;
    PyEval_RestoreThread(c->released);
    PyObject *d = token_dict(c, t);
    int rc = d == NULL || PyList_Append(c->list, d) < 0;
    Py_XDECREF(d);
    c->failed = rc;
    c->released = PyEval_SaveThread();
    return rc;
}

/* A str argument into a fixed field (NUL-free). */
static int
str_into(PyObject *o, const char *what, char *out, size_t cap)
{
    Py_ssize_t n;
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &n) : NULL;
    if (s == NULL || (size_t)n >= cap || strlen(s) != (size_t)n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "checkpoint %s must be a str of at most %zu bytes without NUL", what,
                         cap - 1);
        return -1;
    }
    memcpy(out, s, (size_t)n + 1);
    return 0;
}

/* (stream, fingerprint, the eight numbers, token_log or None) into c. */
static int
checkpoint_of(PyObject *t, sck_checkpoint *c)
{
    static const char *const names[] = {"stream_offset",      "packets",         "drops",       "last_seq",
                                        "last_packet_offset", "last_packet_crc", "token_count", "forward_count"};
    uint64_t *nums[] = {&c->stream_offset,      &c->packets,         &c->drops,       &c->last_seq,
                        &c->last_packet_offset, &c->last_packet_crc, &c->token_count, &c->forward_count};
    if (!PyTuple_Check(t) || PyTuple_Size(t) != 11) {
        PyErr_SetString(PyExc_TypeError, "checkpoint must be (stream, fingerprint, 8 numbers, token_log) or None");
        return -1;
    }
    if (str_into(PyTuple_GetItem(t, 0), "stream", c->stream, sizeof c->stream) < 0 ||
        str_into(PyTuple_GetItem(t, 1), "fingerprint", c->fingerprint, sizeof c->fingerprint) < 0)
        return -1;
    for (int i = 0; i < 8; i++)
        if (u64_arg(PyTuple_GetItem(t, 2 + i), names[i], nums[i]) < 0)
            return -1;
    PyObject *log = PyTuple_GetItem(t, 10);
    if (log != Py_None) {
        if (!PyTuple_Check(log) || PyTuple_Size(log) != 3) {
            PyErr_SetString(PyExc_TypeError, "token_log must be (tokens, bytes, crc32c) or None");
            return -1;
        }
        c->has_token_log = true;
        if (u64_arg(PyTuple_GetItem(log, 0), "token_log.tokens", &c->log_tokens) < 0 ||
            u64_arg(PyTuple_GetItem(log, 1), "token_log.bytes", &c->log_bytes) < 0 ||
            u64_arg(PyTuple_GetItem(log, 2), "token_log.crc32c", &c->log_crc32c) < 0)
            return -1;
    }
    return 0;
}

/* A str argument or None (NULL), NUL-free. */
static int
opt_str(PyObject *o, const char *what, const char **out, Py_ssize_t *len)
{
    *out = NULL;
    if (o == Py_None)
        return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &n) : NULL;
    if (s == NULL || strlen(s) != (size_t)n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s must be a str without NUL, or None", what);
        return -1;
    }
    *out = s;
    if (len)
        *len = n;
    return 0;
}

PyDoc_STRVAR(resume_scan_doc,
             "resume_scan(fd, path, checkpoint, checkpoint_path, tokens131, want_fingerprint, limit, prefix_only) "
             "-> (point, tokens, source, size, freed, complete)\n\n"
             "The resume point of the stream behind fd (docs/CHECKPOINTS.md 4; clients/c/common/strap_resume.c). "
             "checkpoint: (stream, fingerprint, stream_offset, packets, drops, last_seq, last_packet_offset, "
             "last_packet_crc, token_count, forward_count, token_log) or None; checkpoint_path: its file (its token "
             "log beside it) or None; tokens131: 1.3.1's tokens list as JSON, or None; limit: None or the most "
             "tokens to keep; prefix_only: check the checkpoint's prefix only. point: (stream_offset, packets, "
             "drops, last_seq, last_packet_offset, last_packet_crc, token_count, forward_count); tokens: the "
             "tracker's dicts; source: 0 empty file, 1 checkpoint, 2 stream; freed: (start, end) or None; "
             "complete: (message, cut_bytes) for a finished capture (no checkpoint), else None. ValueError(reason) "
             "when the stream cannot be resumed, OSError when it cannot be read.");

static PyObject *
resume_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs_check("resume_scan", nargs, 8) < 0)
        return NULL;
    long fdl = PyLong_AsLong(args[0]);
    if (fdl == -1 && PyErr_Occurred())
        return NULL;
    if (fdl < 0 || fdl > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "fd out of range");
        return NULL;
    }
    int fd = (int)fdl;
    sck_checkpoint *ck = NULL;
    const char *path, *ck_path, *list, *want;
    Py_ssize_t list_len = 0;
    long long limit = -1;
    if (opt_str(args[1], "path", &path, NULL) < 0 || opt_str(args[3], "checkpoint_path", &ck_path, NULL) < 0 ||
        opt_str(args[4], "tokens131", &list, &list_len) < 0 || opt_str(args[5], "want_fingerprint", &want, NULL) < 0)
        return NULL;
    if (path == NULL) {
        PyErr_SetString(PyExc_TypeError, "path must be a str");
        return NULL;
    }
    if (args[6] != Py_None && (limit = PyLong_AsLongLong(args[6])) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "limit must be None or >= 0");
        return NULL;
    }
    int prefix_only = PyObject_IsTrue(args[7]);
    if (prefix_only < 0)
        return NULL;
    if (args[2] != Py_None) {
        if ((ck = PyMem_Calloc(1, sizeof *ck)) == NULL)
            return PyErr_NoMemory();
        if (checkpoint_of(args[2], ck) < 0) {
            PyMem_Free(ck);
            return NULL;
        }
    }
    collect c = {PyList_New(0), NULL, NULL, 0};
    PyObject *res = NULL;
    if (c.list == NULL)
        goto out;
    srs_params p = {.fd = fd,
                    .path = path,
                    .ck = ck,
                    .ck_path = ck_path,
                    .tokens131 = list,
                    .tokens131_len = (size_t)list_len,
                    .want_fingerprint = want,
                    .limit = limit,
                    .prefix_only = prefix_only,
                    .refuse_complete = false,
                    .on_token = give,
                    .user = &c};
    srs_result r;
    char why[2048];
    c.released = PyEval_SaveThread();
    int e = srs_resume_point(&p, &r, why, sizeof why);
    PyEval_RestoreThread(c.released);
    if (e == SRS_STOPPED && c.failed)
        goto out; /* the token's exception */
    if (e == SRS_NOMEM) {
        PyErr_NoMemory();
        goto out;
    }
    if (e == SRS_IO) {
        PyErr_SetString(PyExc_OSError, why);
        goto out;
    }
    if (e != SRS_OK) {
        PyErr_SetString(PyExc_ValueError, why);
        goto out;
    }
    PyObject *freed = r.freed ? Py_BuildValue("(KK)", (unsigned long long)r.freed_from, (unsigned long long)r.freed_to)
                              : Py_NewRef(Py_None);
    PyObject *complete = r.complete ? Py_BuildValue("(sK)", why, (unsigned long long)r.cut_bytes) : Py_NewRef(Py_None);
    if (freed != NULL && complete != NULL)
        res = Py_BuildValue("((KKKKKKKK)OiKOO)", (unsigned long long)r.stream_offset, (unsigned long long)r.packets,
                            (unsigned long long)r.drops, (unsigned long long)r.last_seq,
                            (unsigned long long)r.last_packet_offset, (unsigned long long)r.last_packet_crc,
                            (unsigned long long)r.token_count, (unsigned long long)r.forward_count, c.list, r.source,
                            (unsigned long long)r.size, freed, complete);
    Py_XDECREF(freed);
    Py_XDECREF(complete);
out:
    Py_XDECREF(c.list);
    Py_XDECREF(c.loads);
    PyMem_Free(ck);
    return res;
}

PyDoc_STRVAR(token_log_doc,
             "token_log(path, checkpoint, checkpoint_path) -> list of token dicts\n\nThe tokens the checkpoint's token "
             "log vouches for (clients/c/common/strap_resume.c srs_token_log); checkpoint as resume_scan takes it. "
             "ValueError names what the log does not hold; OSError a failed read.");

static PyObject *
token_log(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cko;
    const char *path, *ck_path;
    if (!PyArg_ParseTuple(args, "sOs", &path, &cko, &ck_path))
        return NULL;
    sck_checkpoint *ck = PyMem_Calloc(1, sizeof *ck);
    if (ck == NULL)
        return PyErr_NoMemory();
    collect c = {NULL, NULL, NULL, 0};
    PyObject *res = NULL;
    if (checkpoint_of(cko, ck) < 0 || (c.list = PyList_New(0)) == NULL)
        goto out;
    srs_params p = {
        .fd = -1, .path = path, .ck = ck->has_token_log ? ck : NULL, .ck_path = ck_path, .on_token = give, .user = &c};
    char why[2048];
    c.released = PyEval_SaveThread();
    int e = srs_token_log(&p, why, sizeof why);
    PyEval_RestoreThread(c.released);
    if (e == SRS_STOPPED && c.failed)
        goto out;
    if (e == SRS_NOMEM)
        PyErr_NoMemory();
    else if (e == SRS_IO)
        PyErr_SetString(PyExc_OSError, why);
    else if (e != SRS_OK)
        PyErr_SetString(PyExc_ValueError, why);
    else
        res = Py_NewRef(c.list);
out:
    Py_XDECREF(c.list);
    Py_XDECREF(c.loads);
    PyMem_Free(ck);
    return res;
}

PyDoc_STRVAR(freed_range_doc,
             "freed_range(fd, start, end) -> (from, to) or None\n\nThe bytes of [start, end) freed by strapd's "
             "--upload-free-local (holes; clients/c/common/strap_resume.c srs_freed_range).");

static PyObject *
freed_range(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    unsigned long long start, end;
    if (!PyArg_ParseTuple(args, "iKK", &fd, &start, &end))
        return NULL;
    uint64_t from = 0, to = 0;
    int rc = srs_freed_range(fd, start, end, &from, &to);
    if (rc < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (rc == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)from, (unsigned long long)to);
}

static int
job_interrupted(void *user)
{
    (void)user;
    PyGILState_STATE g = PyGILState_Ensure();
    int r = PyErr_CheckSignals() != 0;
    PyGILState_Release(g);
    return r;
}

PyDoc_STRVAR(job_exchange_doc,
             "job_exchange(output_path, rank, world_size, start, own, wait) -> list\n"
             "--\n\n"
             "libstrap's strap__job_exchange (attach.h; docs/DISTRIBUTED.md D3): this rank's own (its\n"
             "token count, an int, or its error, a str) written to output_path.job-resume.json with\n"
             "start, then every rank's read from the files beside it, waiting up to wait seconds (the\n"
             "GIL let go, signals run). Returns each rank's count (int) or error (str), in rank order.\n"
             "OSError(code, message) when the wait runs out, the path lacks the rank's marker, or the\n"
             "file cannot be written.");

static PyObject *
job_exchange(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path, *own, *out = NULL;
    long long rank, world;
    const char *start;
    double wait;
    if (!PyArg_ParseTuple(args, "O&LLsOd:job_exchange", PyUnicode_FSConverter, &path, &rank, &world, &start, &own,
                          &wait))
        return NULL;
    strap__job j = {.output_path = PyBytes_AsString(path),
                    .start = start,
                    .rank = rank,
                    .world_size = world,
                    .wait_s = wait,
                    .interrupted = job_interrupted};
    if (PyUnicode_Check(own)) {
        j.own_error = PyUnicode_AsUTF8AndSize(own, NULL);
    } else {
        j.own = PyLong_AsUnsignedLongLong(own);
    }
    uint64_t *counts = NULL;
    char *texts = NULL;
    if (PyErr_Occurred() || j.output_path == NULL)
        goto done;
    if (world < 1 || world > (1 << 20) || rank < 0 || rank >= world) {
        PyErr_Format(PyExc_ValueError, "job_exchange: rank %lld of %lld", rank, world);
        goto done;
    }
    counts = PyMem_Calloc((size_t)world, sizeof *counts);
    texts = PyMem_Calloc((size_t)world, STRAP__JOB_TEXT);
    if (counts == NULL || texts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    char why[1200];
    int e;
    Py_BEGIN_ALLOW_THREADS;
    e = strap__job_exchange(&j, counts, texts, why, sizeof why);
    Py_END_ALLOW_THREADS;
    if (PyErr_Occurred())
        goto done;
    if (e) {
        PyObject *v = Py_BuildValue("(is)", e, why);
        if (v != NULL) {
            PyErr_SetObject(PyExc_OSError, v);
            Py_DECREF(v);
        }
        goto done;
    }
    out = PyList_New((Py_ssize_t)world);
    for (long long r = 0; out != NULL && r < world; r++) {
        PyObject *x = counts[r] != UINT64_MAX
                          ? PyLong_FromUnsignedLongLong(counts[r])
                          : PyUnicode_DecodeUTF8(texts + (size_t)r * STRAP__JOB_TEXT,
                                                 (Py_ssize_t)strlen(texts + (size_t)r * STRAP__JOB_TEXT), "replace");
        if (x == NULL)
            Py_CLEAR(out);
        else
            PyList_SetItem(out, (Py_ssize_t)r, x);
    }
done:
    PyMem_Free(counts);
    PyMem_Free(texts);
    Py_DECREF(path);
    return out;
}

PyMethodDef speedups_resume_methods[] = {
    {"resume_scan", (PyCFunction)(void (*)(void))resume_scan, METH_FASTCALL, resume_scan_doc},
    {"freed_range", freed_range, METH_VARARGS, freed_range_doc},
    {"token_log", token_log, METH_VARARGS, token_log_doc},
    {"job_exchange", job_exchange, METH_VARARGS, job_exchange_doc},
    {NULL, NULL, 0, NULL},
};
