/*
 * The template keys of the records the C writer renders (records.KEYS, through the generated
 * _records.h) and the figures of an attention record, for render (_native_render.c) and for
 * template_key, which the tests compare with the keys the Python writer files templates under.
 */
#include "_native.h"

PyObject *
pack(Py_ssize_t n, PyObject **items)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PUT(t, i, items[i]);
    return t;
}

PyObject *
bool_obj(int v)
{
    return v ? Py_True : Py_False;
}

/* A shape (a tuple of ints) into dims; 0 when it is not one C can hold (Python takes it). */
int
shape_dims(PyObject *shape, long long *dims, int *n)
{
    if (!PyTuple_Check(shape) || PyTuple_Size(shape) > MAX_DIMS)
        return 0;
    *n = (int)PyTuple_Size(shape);
    for (int i = 0; i < *n; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
        if (dims[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* A shape's element count; -1 when it overflows. */
long long
numel(const long long *dims, int n)
{
    long long e = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0 || (dims[i] && e > LLONG_MAX / dims[i]))
            return -1;
        e *= dims[i];
    }
    return e;
}

/* The key records.KEYS[LINEAR or MODULE] of a record (timed: its duration > 0; cuda: a CUDA
 * event pair's). */
PyObject *
key_timed(PyObject *r, int timed, int cuda)
{
    PyObject *k[KEY_LINEAR_LEN];
    k[KEY_LINEAR_SITE] = PyTuple_GetItem(r, LINEAR_SITE);
    k[KEY_LINEAR_IN_SHAPE] = PyTuple_GetItem(r, LINEAR_IN_SHAPE);
    k[KEY_LINEAR_IN_DTYPE] = PyTuple_GetItem(r, LINEAR_IN_DTYPE);
    k[KEY_LINEAR_OUT_SHAPE] = PyTuple_GetItem(r, LINEAR_OUT_SHAPE);
    k[KEY_LINEAR_OUT_DTYPE] = PyTuple_GetItem(r, LINEAR_OUT_DTYPE);
    k[KEY_LINEAR_TIMED] = bool_obj(timed);
    k[KEY_LINEAR_CUDA_TIMED] = bool_obj(cuda);
    return pack(KEY_LINEAR_LEN, k);
}

/* The key records.KEYS[ALLOC_OUT or ALLOC] of a record (mem: its memory reading). */
PyObject *
key_alloc(PyObject *r, PyObject *mem)
{
    if (PyTuple_Size(r) == ALLOC_OUT_LEN && tag_of(r) == REC_ALLOC_OUT) {
        PyObject *k[KEY_ALLOC_OUT_LEN], *nmem = PyLong_FromSsize_t(PyDict_Size(mem));
        if (nmem == NULL)
            return NULL;
        k[KEY_ALLOC_OUT_OUT] = key_out;
        k[KEY_ALLOC_OUT_SITE] = PyTuple_GetItem(r, ALLOC_OUT_SITE);
        k[KEY_ALLOC_OUT_NBYTES] = PyTuple_GetItem(r, ALLOC_OUT_NBYTES);
        k[KEY_ALLOC_OUT_IN_SHAPE] = PyTuple_GetItem(r, ALLOC_OUT_IN_SHAPE);
        k[KEY_ALLOC_OUT_OUT_SHAPE] = PyTuple_GetItem(r, ALLOC_OUT_OUT_SHAPE);
        k[KEY_ALLOC_OUT_OUT_DTYPE] = PyTuple_GetItem(r, ALLOC_OUT_OUT_DTYPE);
        k[KEY_ALLOC_OUT_MEMORY_FIELDS] = nmem;
        PyObject *key = pack(KEY_ALLOC_OUT_LEN, k);
        Py_DECREF(nmem);
        return key;
    }
    PyObject *k[KEY_ALLOC_LEN], *keys = PySequence_Tuple(mem);
    if (keys == NULL)
        return NULL;
    k[KEY_ALLOC_SITE] = PyTuple_GetItem(r, ALLOC_SITE);
    k[KEY_ALLOC_KIND] = PyTuple_GetItem(r, ALLOC_KIND);
    k[KEY_ALLOC_NBYTES] = PyTuple_GetItem(r, ALLOC_NBYTES);
    k[KEY_ALLOC_SHAPE] = PyTuple_GetItem(r, ALLOC_SHAPE);
    k[KEY_ALLOC_DTYPE] = PyTuple_GetItem(r, ALLOC_DTYPE);
    k[KEY_ALLOC_IS_CUDA] = PyTuple_GetItem(r, ALLOC_IS_CUDA);
    k[KEY_ALLOC_MEMORY_KEYS] = keys;
    PyObject *key = pack(KEY_ALLOC_LEN, k);
    Py_DECREF(keys);
    return key;
}

/* The key records.KEYS[ATTENTION_KV] of a record. */
PyObject *
key_attention(PyObject *r, int variant)
{
    PyObject *k[KEY_ATTENTION_KV_LEN], *var = PyLong_FromLong(variant);
    if (var == NULL)
        return NULL;
    k[KEY_ATTENTION_KV_SITE] = PyTuple_GetItem(r, ATTENTION_KV_SITE);
    k[KEY_ATTENTION_KV_IN_SHAPE] = PyTuple_GetItem(r, ATTENTION_KV_IN_SHAPE);
    k[KEY_ATTENTION_KV_IN_DTYPE] = PyTuple_GetItem(r, ATTENTION_KV_IN_DTYPE);
    k[KEY_ATTENTION_KV_OUT_SHAPE] = PyTuple_GetItem(r, ATTENTION_KV_OUT_SHAPE);
    k[KEY_ATTENTION_KV_OUT_DTYPE] = PyTuple_GetItem(r, ATTENTION_KV_OUT_DTYPE);
    k[KEY_ATTENTION_KV_KEY_DTYPE] = PyTuple_GetItem(r, ATTENTION_KV_KEY_DTYPE);
    k[KEY_ATTENTION_KV_VALUE_DTYPE] = PyTuple_GetItem(r, ATTENTION_KV_VALUE_DTYPE);
    k[KEY_ATTENTION_KV_VARIANT] = var;
    PyObject *key = pack(KEY_ATTENTION_KV_LEN, k);
    Py_DECREF(var);
    return key;
}

/* The key records.KEYS[HANDOFF] of a record. */
PyObject *
key_handoff_of(PyObject *r, int variant, int cuda)
{
    PyObject *k[KEY_HANDOFF_LEN], *var = PyLong_FromLong(variant);
    if (var == NULL)
        return NULL;
    k[KEY_HANDOFF_HANDOFF] = key_handoff;
    k[KEY_HANDOFF_SITE] = PyTuple_GetItem(r, HANDOFF_SITE);
    k[KEY_HANDOFF_SHAPE] = PyTuple_GetItem(r, HANDOFF_SHAPE);
    k[KEY_HANDOFF_DTYPE] = PyTuple_GetItem(r, HANDOFF_DTYPE);
    k[KEY_HANDOFF_FRACTION_SOURCE] = PyTuple_GetItem(r, HANDOFF_FRACTION_SOURCE);
    k[KEY_HANDOFF_VARIANT] = var;
    k[KEY_HANDOFF_CUDA_TIMED] = bool_obj(cuda);
    PyObject *key = pack(KEY_HANDOFF_LEN, k);
    Py_DECREF(var);
    return key;
}

int
attention_figures(State *st, PyObject *r, Values *v, AttnFigures *f)
{
    PyObject *site = PyTuple_GetItem(r, ATTENTION_KV_SITE), *kb = PyTuple_GetItem(r, ATTENTION_KV_KEY_SHAPE_BEFORE);
    long long xs[MAX_DIMS], kbd[MAX_DIMS];
    int xn, kbn = 0;
    if (!shape_dims(PyTuple_GetItem(r, ATTENTION_KV_IN_SHAPE), xs, &xn) ||
        !shape_dims(PyTuple_GetItem(r, ATTENTION_KV_KEY_SHAPE), v->ks, &v->ks_n) ||
        !shape_dims(PyTuple_GetItem(r, ATTENTION_KV_VALUE_SHAPE), v->vs, &v->vs_n) ||
        (kb != Py_None && !shape_dims(kb, kbd, &kbn)))
        return 0;
    PyObject *as = PyObject_GetAttr(site, str_attn_static); /* (seq_first, heads, head_dim, idx) */
    if (as == NULL)
        return -1;
    int ok = PyTuple_Check(as) && PyTuple_Size(as) == 4;
    int seq_first = ok ? PyObject_IsTrue(PyTuple_GetItem(as, 0)) : 0;
    f->heads = f->head_dim = 0;
    if (ok && PyTuple_GetItem(as, 1) != Py_None)
        f->heads = PyLong_AsLongLong(PyTuple_GetItem(as, 1));
    if (ok && PyTuple_GetItem(as, 2) != Py_None)
        f->head_dim = PyLong_AsLongLong(PyTuple_GetItem(as, 2));
    f->idx = ok ? PyTuple_GetItem(as, 3) : NULL;
    Py_XINCREF(f->idx);
    Py_DECREF(as);
    if (!ok || seq_first < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    /* events.attention_tokens, events.attention_flops, caches.kv_len_of */
    f->q_len = xn >= 2 ? xs[seq_first ? 0 : xn - 2] : 0;
    f->batch = xn >= 3 ? xs[seq_first ? 1 : 0] : 1;
    f->kv_len = v->ks_n >= 2 ? v->ks[v->ks_n - 2] : 0;
    f->before = kb != Py_None && kbn >= 2 && numel(kbd, kbn) != 0 ? kbd[kbn - 2] : 0;
    f->nk = numel(v->ks, v->ks_n);
    f->nv = numel(v->vs, v->vs_n);
    if (f->q_len < 0 || f->batch < 0 || f->kv_len < 0 || f->before < 0 || f->nk < 0 || f->nv < 0)
        return 0;
    f->has_flops = f->heads != 0 && f->head_dim != 0;
    f->flops = 0;
    if (f->has_flops) {
        long long m[6] = {4, f->batch, f->heads, f->q_len, f->kv_len, f->head_dim};
        f->flops = 1;
        for (int i = 0; i < 6; i++) {
            if (m[i] < 0 || (m[i] && f->flops > LLONG_MAX / m[i]))
                return 0;
            f->flops *= m[i];
        }
        if (st->total_flops > LLONG_MAX - f->flops || st->pass_flops > LLONG_MAX - f->flops)
            return 0;
    }
    return 1;
}

/* The key records.KEYS[ATTENTION] of a record (its kv None or a 6-tuple: cache_dims). */
PyObject *
key_attention_of(PyObject *r, int variant, int cuda)
{
    PyObject *k[KEY_ATTENTION_LEN], *kv = PyTuple_GetItem(r, ATTENTION_KV), *var = PyLong_FromLong(variant);
    if (var == NULL)
        return NULL;
    k[KEY_ATTENTION_ATTENTION] = key_attention_str;
    k[KEY_ATTENTION_SITE] = PyTuple_GetItem(r, ATTENTION_SITE);
    k[KEY_ATTENTION_IN_SHAPE] = PyTuple_GetItem(r, ATTENTION_IN_SHAPE);
    k[KEY_ATTENTION_IN_DTYPE] = PyTuple_GetItem(r, ATTENTION_IN_DTYPE);
    k[KEY_ATTENTION_IN_CUDA] = PyTuple_GetItem(r, ATTENTION_IN_CUDA);
    k[KEY_ATTENTION_OUT_SHAPE] = PyTuple_GetItem(r, ATTENTION_OUT_SHAPE);
    k[KEY_ATTENTION_OUT_DTYPE] = PyTuple_GetItem(r, ATTENTION_OUT_DTYPE);
    k[KEY_ATTENTION_OUT_CUDA] = PyTuple_GetItem(r, ATTENTION_OUT_CUDA);
    k[KEY_ATTENTION_KEY_DTYPE] = kv != Py_None ? PyTuple_GetItem(kv, 1) : Py_None;
    k[KEY_ATTENTION_VALUE_DTYPE] =
        kv != Py_None && PyTuple_GetItem(kv, 3) != Py_None ? PyTuple_GetItem(kv, 4) : Py_None;
    k[KEY_ATTENTION_VARIANT] = var;
    k[KEY_ATTENTION_CUDA_TIMED] = bool_obj(cuda);
    PyObject *key = pack(KEY_ATTENTION_LEN, k);
    Py_DECREF(var);
    return key;
}

/* The key records.KEYS[KV] of a record (its kv a 6-tuple: cache_dims). */
PyObject *
key_kv_of(PyObject *r, int variant)
{
    PyObject *k[KEY_KV_LEN], *kv = PyTuple_GetItem(r, KV_KV), *var = PyLong_FromLong(variant);
    if (var == NULL)
        return NULL;
    k[KEY_KV_KV] = key_kv_str;
    k[KEY_KV_SITE] = PyTuple_GetItem(r, KV_SITE);
    k[KEY_KV_KEY_DTYPE] = PyTuple_GetItem(kv, 1);
    k[KEY_KV_KEY_CUDA] = PyTuple_GetItem(kv, 2);
    k[KEY_KV_VARIANT] = var;
    PyObject *key = pack(KEY_KV_LEN, k);
    Py_DECREF(var);
    return key;
}

/* A cache's key and value shapes (a record's kv: key shape, dtype, on a GPU, the value's) into
 * v; 0 where C does not take it: not a 6-tuple, no values (the line says null), a shape C cannot
 * hold. */
int
cache_dims(PyObject *kv, Values *v)
{
    if (!PyTuple_Check(kv) || PyTuple_Size(kv) != 6 || PyTuple_GetItem(kv, 3) == Py_None)
        return 0;
    return shape_dims(PyTuple_GetItem(kv, 0), v->ks, &v->ks_n) && shape_dims(PyTuple_GetItem(kv, 3), v->vs, &v->vs_n);
}

/* A record's timing into v: ns on the host clock (an int), or a CUDA event pair (start, end)
 * whose end event has completed, resolved as events.cuda_duration_us resolves one: µs =
 * start.elapsed_time(end) * 1000.0. 1 read; 0 for the Python path: an end event not complete
 * yet (the writer waits for it, _cuda.wait_event, and comes back), an int beyond 64 bits, a
 * duration that is not a finite float (JSON writes NaN or Infinity: the builders' way); -1
 * an error (of query or elapsed_time, as the builders would raise it). */
int
read_timing(PyObject *timing, Values *v)
{
    if (PyLong_CheckExact(timing)) {
        v->timing = PyLong_AsLongLong(timing);
        if (v->timing == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        v->cuda = 0;
        v->d_us = (double)v->timing / 1000.0;
        return 1;
    }
    if (!PyTuple_Check(timing) || PyTuple_Size(timing) != 2)
        return 0;
    PyObject *start = PyTuple_GetItem(timing, 0), *end = PyTuple_GetItem(timing, 1);
    PyObject *done = PyObject_CallMethodObjArgs(end, str_query, NULL);
    if (done == NULL)
        return -1;
    int ok = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (ok <= 0)
        return ok;
    PyObject *ms = PyObject_CallMethodObjArgs(start, str_elapsed_time, end, NULL);
    if (ms == NULL)
        return -1;
    int is_float = PyFloat_CheckExact(ms);
    double d = is_float ? PyFloat_AsDouble(ms) * 1000.0 : 0.0;
    Py_DECREF(ms);
    if (!is_float || !isfinite(d))
        return 0;
    v->cuda = 1;
    v->d_us = d;
    v->timing = 0;
    return 1;
}

/* A record's timing for its key (read_timing); -1 with an error where C would not render it. */
static int
timing_of(PyObject *timing, double *d, int *cuda)
{
    Values v;
    memset(&v, 0, sizeof v);
    int rc = read_timing(timing, &v);
    if (rc == 0)
        PyErr_SetString(PyExc_ValueError, "template_key: a timing C does not render (an event pair not complete, "
                                          "a duration not finite)");
    *d = v.d_us;
    *cuda = v.cuda;
    return rc > 0 ? 0 : -1;
}

PyObject *
template_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 1 || nargs > 2 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) < 2) {
        PyErr_SetString(PyExc_TypeError, "template_key(record: tuple, memory=None)");
        return NULL;
    }
    PyObject *r = args[0];
    long tag = PyLong_AsLong(PyTuple_GetItem(r, 0));
    if (tag == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyTuple_Size(r);
    if ((tag == REC_LINEAR && size == LINEAR_LEN) || (tag == REC_MODULE && size == MODULE_LEN)) {
        double d;
        int cuda;
        if (timing_of(PyTuple_GetItem(r, LINEAR_TIMING), &d, &cuda) < 0)
            return NULL;
        return key_timed(r, d > 0, cuda);
    }
    if ((tag == REC_ALLOC_OUT && size == ALLOC_OUT_LEN) || (tag == REC_ALLOC && size == ALLOC_LEN)) {
        if (nargs < 2 || !PyDict_Check(args[1])) {
            PyErr_SetString(PyExc_TypeError, "template_key: an allocation's key needs its memory reading (a dict)");
            return NULL;
        }
        return key_alloc(r, args[1]);
    }
    if (tag == REC_ATTENTION_KV && size == ATTENTION_KV_LEN) {
        long long t = PyLong_AsLongLong(PyTuple_GetItem(r, ATTENTION_KV_TIMING));
        if (PyErr_Occurred())
            return NULL;
        Values v;
        AttnFigures f;
        memset(&v, 0, sizeof v);
        memset(&f, 0, sizeof f);
        State st;
        memset(&st, 0, sizeof st);
        int rc = attention_figures(&st, r, &v, &f);
        Py_XDECREF(f.idx);
        if (rc <= 0) {
            if (rc == 0)
                PyErr_SetString(PyExc_ValueError, "template_key: an attention record C does not render");
            return NULL;
        }
        return key_attention(r, !f.has_flops ? 0 : (f.flops && t > 0) ? 2 : 1);
    }
    if (tag == REC_ATTENTION && size == ATTENTION_LEN) {
        Values v;
        memset(&v, 0, sizeof v);
        PyObject *kv = PyTuple_GetItem(r, ATTENTION_KV), *fl = PyTuple_GetItem(r, ATTENTION_FLOPS);
        if (kv != Py_None && !cache_dims(kv, &v)) {
            PyErr_SetString(PyExc_ValueError, "template_key: an attention record C does not render");
            return NULL;
        }
        double d;
        int cuda;
        if (timing_of(PyTuple_GetItem(r, ATTENTION_TIMING), &d, &cuda) < 0)
            return NULL;
        int truthy = fl != Py_None ? PyObject_IsTrue(fl) : 0;
        if (truthy < 0)
            return NULL;
        return key_attention_of(r, fl == Py_None ? 0 : (truthy && d > 0) ? 2 : 1, cuda);
    }
    if (tag == REC_KV && size == KV_LEN) {
        Values v;
        memset(&v, 0, sizeof v);
        if (!cache_dims(PyTuple_GetItem(r, KV_KV), &v)) {
            PyErr_SetString(PyExc_ValueError, "template_key: a KV record C does not render");
            return NULL;
        }
        return key_kv_of(r, v.ks_n >= 2);
    }
    if (tag == REC_HANDOFF && size == HANDOFF_LEN) {
        double d;
        int cuda;
        if (timing_of(PyTuple_GetItem(r, HANDOFF_TIMING), &d, &cuda) < 0)
            return NULL;
        PyObject *frac = nargs > 1 ? args[1] : PyTuple_GetItem(r, HANDOFF_MEMORY_FRACTION);
        return key_handoff_of(r, (d > 0) + 2 * (frac != Py_None), cuda);
    }
    PyErr_Format(PyExc_ValueError, "template_key: no template key for a record of kind %ld and %zd items", tag, size);
    return NULL;
}

const char template_key_doc[] =
    "template_key(record, memory=None) -> tuple\n"
    "--\n\n"
    "The template key render looks a record up by (records.KEYS): LINEAR, MODULE, ALLOC_OUT,\n"
    "ALLOC (with its memory reading), ATTENTION_KV or HANDOFF. The tests compare it with the\n"
    "key the Python writer files the template under.";
