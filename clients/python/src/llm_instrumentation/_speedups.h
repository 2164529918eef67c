/*
 * What the translation units of the _speedups module (_speedups.c and its _speedups_*.c) share:
 * the checks of their fast-call arguments (static, so each unit has its own copy), the bound
 * cudaMemcpyAsync and the Ring type's registration. Internal.
 */
#ifndef STRAP_SPEEDUPS_H
#define STRAP_SPEEDUPS_H

#include <stdint.h>

/* An int in [0, 2**64), else ValueError naming `what` (-1). */
static inline int
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

/* An int in [-2**63, 2**63), else ValueError naming `what` (-1). */
static inline int
i64_arg(PyObject *o, const char *what, int64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in [-2**63, 2**63)", what);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* An int masked to 64 bits (two's complement for a negative one), as the wire stores a token's
 * id and position. */
static inline int
u64_masked(PyObject *o, const char *what, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    PyObject *mask = PyLong_FromUnsignedLongLong(UINT64_MAX);
    PyObject *m = mask ? PyNumber_And(o, mask) : NULL;
    Py_XDECREF(mask);
    if (m == NULL)
        return -1;
    *out = (uint64_t)PyLong_AsUnsignedLongLong(m);
    Py_DECREF(m);
    return PyErr_Occurred() ? -1 : 0;
}

/* 0 when a fast-call function `fn` got `want` arguments, else TypeError (-1). */
static inline int
nargs_check(const char *fn, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", fn, want, nargs);
    return -1;
}

/* The cudaMemcpyAsync bound by bind_cuda_memcpy (_speedups.c), NULL when none: the small CUDA
 * records' copies (write_record_cuda; Ring.put_cuda in _speedups_ring.c). */
typedef int (*speedups_cuda_memcpy_fn)(void *, const void *, size_t, int, void *);
#define SPEEDUPS_CUDA_D2H 2
speedups_cuda_memcpy_fn speedups_cuda_memcpy(void);

/* Add the Ring type (_speedups_ring.c) to the module. */
int speedups_ring_add(PyObject *m);
/* The libstrap ring of a Ring object (_speedups_ring.c); NULL with TypeError (not a Ring) or
 * ValueError (closed). The Ring object keeps it. */
struct srb_ring;
struct srb_ring *speedups_ring_srb(PyObject *o);
/* Add the Session type (_speedups_session.c) to the module. */
int speedups_session_add(PyObject *m);
/* A list of serialized events (bytes; a trailing newline not counted) as the arrays
 * sp_pack_resources takes, borrowed from the list (PyMem_Free both; -1 with an exception). */
int speedups_events(PyObject *list, const char ***evs, size_t **lens, Py_ssize_t *n);

#endif
