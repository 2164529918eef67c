/*
 * The control connection's datagrams for the tests' wire.Connection: libstrap's
 * clients/c/common/strap_channel.h (one datagram sent with its descriptors, one received with
 * a timeout, the daemon's last ERROR salvaged from a connection it closed), compiled in as
 * libstrap compiles it. The GIL is let go while a receive waits, taken back every 50 ms to run
 * the signal handlers (a KeyboardInterrupt stops the wait, as select's would).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "strap_channel.h"
#include "strap_wire.h"

#include "_speedups.h"

/* OSError for -errno r, as socket calls raise it (BrokenPipeError, ConnectionResetError...). */
static PyObject *
errno_error(int r)
{
    errno = -r;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyDoc_STRVAR(channel_send_doc,
             "channel_send(fd, data, fds=())\n"
             "--\n\n"
             "Send data (bytes) as one datagram on the connected socket fd, with the descriptors fds\n"
             "(at most 4) as SCM_RIGHTS (strap_channel.h's sch_send). OSError as sendmsg raises it.");

static PyObject *
channel_send(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    const char *data;
    Py_ssize_t n;
    PyObject *fds_o = NULL;
    if (!PyArg_ParseTuple(args, "iy#|O:channel_send", &fd, &data, &n, &fds_o))
        return NULL;
    int fds[SCH_MAX_FDS];
    Py_ssize_t nfds = 0;
    if (fds_o != NULL) {
        PyObject *seq = PySequence_Tuple(fds_o);
        if (seq == NULL)
            return NULL;
        nfds = PyTuple_Size(seq);
        if (nfds > SCH_MAX_FDS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "channel_send: %zd descriptors, at most %d", nfds, SCH_MAX_FDS);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nfds; i++) {
            long v = PyLong_AsLong(PyTuple_GetItem(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            fds[i] = (int)v;
        }
        Py_DECREF(seq);
    }
    int r;
    PyThreadState *ts = PyEval_SaveThread();
    r = sch_send(fd, data, (size_t)n, fds, (int)nfds);
    PyEval_RestoreThread(ts);
    if (r != 0)
        return errno_error(r);
    Py_RETURN_NONE;
}

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

PyDoc_STRVAR(channel_recv_doc,
             "channel_recv(fd, timeout)\n"
             "--\n\n"
             "Receive one datagram from the socket fd, waiting at most timeout seconds (None: until one\n"
             "comes; 0: a poll) — strap_channel.h's sch_recv, the GIL let go while it waits. Returns its\n"
             "bytes (b'' at EOF; a datagram longer than MAX_MESSAGE + 1 bytes is cut there), or None when\n"
             "nothing came in time. OSError as recv raises it.");

static PyObject *
channel_recv(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    PyObject *timeout_o;
    if (!PyArg_ParseTuple(args, "iO:channel_recv", &fd, &timeout_o))
        return NULL;
    double timeout = -1;
    if (timeout_o != Py_None) {
        timeout = PyFloat_AsDouble(timeout_o);
        if (timeout == -1 && PyErr_Occurred())
            return NULL;
        if (isnan(timeout) || timeout < 0)
            timeout = 0;
    }
    enum { CAP = SP_MAX_MESSAGE + 1, SLICE_MS = 50 };
    uint8_t *buf = malloc(CAP);
    if (buf == NULL)
        return PyErr_NoMemory();
    double deadline = timeout < 0 ? 0 : now_s() + timeout;
    ssize_t n;
    for (;;) { /* slices of at most 50 ms; past the deadline one look without waiting */
        int ms = 0;
        if (timeout < 0) {
            ms = SLICE_MS;
        } else if (timeout > 0) {
            double left = deadline - now_s();
            ms = left <= 0 ? 0 : left * 1000 > SLICE_MS ? SLICE_MS : (int)ceil(left * 1000);
        }
        PyThreadState *ts = PyEval_SaveThread();
        n = sch_recv(fd, buf, CAP, ms);
        PyEval_RestoreThread(ts);
        if (n != -EAGAIN || ms == 0)
            break;
        if (PyErr_CheckSignals() < 0) {
            free(buf);
            return NULL;
        }
    }
    PyObject *out;
    if (n == -EAGAIN) {
        out = Py_None;
        Py_INCREF(out);
    } else if (n < 0) {
        out = errno_error((int)n);
    } else {
        out = PyBytes_FromStringAndSize((const char *)buf, n > CAP ? CAP : n);
    }
    free(buf);
    return out;
}

/* sch_salvage's callback: keep the last ERROR (a bytes object in *arg). */
static void
keep_error(const uint8_t *msg, size_t n, void *arg)
{
    PyObject **last = arg;
    sp_reply r;
    char why[200];
    if (*last == NULL && PyErr_Occurred())
        return; /* an earlier copy failed */
    if (sp_decode_reply(msg, n, &r, why, sizeof why) != SP_OK || r.type != SP_ERROR)
        return;
    PyObject *b = PyBytes_FromStringAndSize((const char *)msg, (Py_ssize_t)n);
    Py_XDECREF(*last);
    *last = b;
}

PyDoc_STRVAR(channel_salvage_doc,
             "channel_salvage(fd)\n"
             "--\n\n"
             "The daemon's last ERROR on a connection it closed (strap_channel.h's sch_salvage: every\n"
             "datagram still queued read, past one ECONNRESET): its datagram's bytes, or None.");

static PyObject *
channel_salvage(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    uint8_t *buf = malloc(SP_MAX_MESSAGE + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    PyObject *last = NULL;
    sch_salvage(fd, buf, SP_MAX_MESSAGE + 1, keep_error, &last);
    free(buf);
    if (last == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return last;
}

PyMethodDef speedups_channel_methods[] = {
    {"channel_send", channel_send, METH_VARARGS, channel_send_doc},
    {"channel_recv", channel_recv, METH_VARARGS, channel_recv_doc},
    {"channel_salvage", channel_salvage, METH_O, channel_salvage_doc},
    {NULL, NULL, 0, NULL},
};
