/*
 * The resource monitor's hot paths in C (docs/RESOURCE_EVENTS.md, docs/PERFORMANCE.md
 * "Resource events on decode"): TimedForward, the timing wrapper of a module on the CPU
 * (wrappers.fast_forward), and render, the writer's filling of the templates of the records
 * those wrappers make (lines.py, attention_lines.py). The Python code holds the logic; these
 * do what its fast paths do, for the records they know, and hand everything else back to it.
 *
 * The records, template keys and entries, and the writer state's attribute names are
 * records.py's schema, compiled in from the generated _records.h. register(), which
 * native.py calls at import, compares that schema with records.py's and raises naming the
 * first row that differs; a template entry of the wrong length raises naming its items. A
 * drift fails; it never sends every record to the Python paths unnoticed.
 *
 * The filling of a template itself is plain C (_render_core.h, no Python API), so a C client
 * can compile it; this file is the CPython glue around it. Built against the limited API of
 * CPython 3.10 (one .abi3.so for every later CPython).
 */
#include "_native.h"

#include <time.h>

int
native_repr_double(char *out, size_t cap, double v)
{
    char *s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return -1;
    size_t n = strlen(s);
    int rc = n < cap ? (int)n : -1;
    if (rc >= 0)
        memcpy(out, s, n);
    PyMem_Free(s);
    return rc;
}

/* The clock of time.perf_counter_ns on Linux: the wrapper's readings and the monitor's
 * Python readings are compared and subtracted. */
long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

PyObject *str_shape, *str_dtype, *str_nbytes, *str_data_ptr, *str_attn_static, *key_out, *key_handoff;
PyObject *str_query, *str_elapsed_time, *key_attention_str, *key_kv_str;
PyObject *state_attr[N_STATE], *recorder_attr[N_RECORDER], *count_keys[N_COUNT], *mem_keys[N_MEMORY];
PyObject *tag_obj[REC_PREBUILT + 1];
PyObject *unread;

/* A record's kind (item 0), -1 when it has none. */
long
tag_of(PyObject *r)
{
    long tag = PyLong_AsLong(PyTuple_GetItem(r, 0));
    if (tag == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return tag;
}

int
registered(void)
{
    if (unread == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "llm_instrumentation.resources._native: register() was not called "
                                            "(resources/native.py does it at import)");
        return 0;
    }
    return 1;
}

/* ----- register: the schema compiled in against records.py's ------------------------------- */

PyDoc_STRVAR(register_doc, "register(schema_items, unread)\n"
                           "--\n\n"
                           "Compare records.schema_items() with the schema this module was compiled with (_records.h)\n"
                           "and keep records.UNREAD. Raises RuntimeError naming the first row that differs.");

static PyObject *
register_schema(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "register(schema_items: list, unread)");
        return NULL;
    }
    PyObject *rows = args[0];
    Py_ssize_t n = PyList_Size(rows);
    for (Py_ssize_t i = 0; i < n || i < N_SCHEMA_ITEMS; i++) {
        if (i >= n || i >= N_SCHEMA_ITEMS) {
            const SchemaItem *c = i < N_SCHEMA_ITEMS ? &schema_items[i] : NULL;
            PyErr_Format(PyExc_RuntimeError,
                         "resource record schema: records.py has %zd rows, the compiled _records.h %d (first "
                         "extra: %s %s %d %s); run make generate and rebuild the extension",
                         n, N_SCHEMA_ITEMS, c ? c->section : "(records.py)", c ? c->owner : "", c ? c->index : (int)i,
                         c ? c->name : "");
            return NULL;
        }
        const char *section, *owner, *name;
        int index;
        if (!PyArg_ParseTuple(PyList_GetItem(rows, i), "ssis", &section, &owner, &index, &name))
            return NULL;
        const SchemaItem *c = &schema_items[i];
        if (strcmp(section, c->section) || strcmp(owner, c->owner) || index != c->index || strcmp(name, c->name)) {
            PyErr_Format(PyExc_RuntimeError,
                         "resource record schema drift: %s %s[%d] is '%s' in records.py, but %s %s[%d] is '%s' in "
                         "the compiled _records.h; run make generate and rebuild the extension",
                         section, owner, index, name, c->section, c->owner, c->index, c->name);
            return NULL;
        }
    }
    PyObject *old = unread;
    Py_INCREF(args[1]);
    unread = args[1];
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* ----- the timing wrapper ---------------------------------------------------------------------- */

/* recorder.hook_ns += ns */
static int
add_hook_ns(PyObject *rec, long long ns)
{
    PyObject *cur = PyObject_GetAttr(rec, recorder_attr[RECORDER_HOOK_NS]);
    if (cur == NULL)
        return -1;
    long long v = PyLong_AsLongLong(cur);
    Py_DECREF(cur);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromLongLong(v + ns);
    if (nv == NULL)
        return -1;
    int rc = PyObject_SetAttr(rec, recorder_attr[RECORDER_HOOK_NS], nv);
    Py_DECREF(nv);
    return rc;
}

typedef struct {
    PyObject_HEAD
    PyObject *rec;      /* the Recorder: its hook_ns, forward_memory, memory_cell */
    PyObject *orig;     /* the module's forward */
    PyObject *general;  /* the general wrapper: every call this one does not time itself */
    PyObject *finish;   /* general.finish: an output that is not a plain tensor */
    PyObject *hand_off; /* passes ended forward passes to the writer */
    PyObject *records;  /* the recorder's record list */
    PyObject *site;
    PyObject *tag;    /* REC_LINEAR or REC_MODULE */
    PyObject *tensor; /* torch.Tensor: only exact tensors take this path */
    PyObject *lng;    /* [site]: the longest module of the last pass */
    PyObject *active; /* [bool]: False once the monitor unwrapped the module */
    int derived;      /* the output shape follows from the input's (not recorded) */
    long long alloc_min;
} TimedForward;

#define TF_FIELDS(X)                                                                                                   \
    X(rec) X(orig) X(general) X(finish) X(hand_off) X(records) X(site) X(tag) X(tensor) X(lng) X(active)

static int
tf_traverse(TimedForward *self, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(self->f);
    TF_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int
tf_clear(TimedForward *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    TF_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void
tf_dealloc(TimedForward *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tf_clear(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
tf_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *o[11];
    int derived;
    long long alloc_min;
    if (kwargs != NULL && PyDict_Size(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "TimedForward takes no keyword arguments");
        return NULL;
    }
    if (!registered())
        return NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOpL:TimedForward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &derived, &alloc_min))
        return NULL;
    long tag = PyLong_Check(o[7]) ? PyLong_AsLong(o[7]) : -1;
    if (!PyList_Check(o[5]) || !PyList_Check(o[9]) || !PyList_Check(o[10]) || PyList_Size(o[9]) != 1 ||
        PyList_Size(o[10]) != 1 || !PyType_Check(o[8]) || (tag != REC_LINEAR && tag != REC_MODULE)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "TimedForward: records must be a list, tag LINEAR or MODULE, tensor a "
                                         "type, longest and active one-item lists");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    TimedForward *self = (TimedForward *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject **dst[11] = {&self->rec,  &self->orig, &self->general, &self->finish, &self->hand_off, &self->records,
                          &self->site, &self->tag,  &self->tensor,  &self->lng,    &self->active};
    for (int i = 0; i < 11; i++) {
        Py_INCREF(o[i]);
        *dst[i] = o[i];
    }
    self->derived = derived;
    self->alloc_min = alloc_min;
    return (PyObject *)self;
}

/* wrappers.fast_forward's closure: the module's call timed on the monotonic clock; a LINEAR
 * or MODULE record (records.FIELDS) appended, and an ALLOC_OUT record for an output over
 * the level's size. */
static PyObject *
tf_call(TimedForward *self, PyObject *args, PyObject *kwargs)
{
    PyObject *x = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : NULL;
    if (x == NULL || (PyObject *)Py_TYPE(x) != self->tensor || PyList_GetItem(self->active, 0) != Py_True) {
        PyErr_Clear();
        return PyObject_Call(self->general, args, kwargs);
    }
    if (PyList_GetItem(self->lng, 0) == self->site) {
        long long t = monotonic_ns();
        PyObject *r = PyObject_CallNoArgs(self->hand_off);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        if (add_hook_ns(self->rec, monotonic_ns() - t) < 0)
            return NULL;
    }
    long long t0 = monotonic_ns();
    PyObject *out = PyObject_Call(self->orig, args, kwargs);
    long long t1 = monotonic_ns();
    if (out == NULL)
        return NULL;
    if ((PyObject *)Py_TYPE(out) != self->tensor) {
        PyObject *r = PyObject_CallFunction(self->finish, "OOOLL", self->site, args, out, t0, t1);
        Py_DECREF(out);
        return r;
    }
    PyObject *xs = NULL, *xd = NULL, *os = NULL, *od = NULL, *t1o = NULL, *dur = NULL, *rec = NULL, *nb = NULL;
    xs = PyObject_GetAttr(x, str_shape);
    xd = xs ? PyObject_GetAttr(x, str_dtype) : NULL;
    if (xd != NULL) {
        if (self->derived) {
            Py_INCREF(Py_None);
            os = Py_None;
        } else {
            os = PyObject_GetAttr(out, str_shape);
        }
    }
    od = os ? PyObject_GetAttr(out, str_dtype) : NULL;
    t1o = od ? PyLong_FromLongLong(t1) : NULL;
    dur = t1o ? PyLong_FromLongLong(t1 - t0) : NULL;
    rec = dur ? PyTuple_New(LINEAR_LEN) : NULL;
    if (rec == NULL)
        goto fail;
    PUT(rec, 0, self->tag);
    PUT(rec, LINEAR_SITE, self->site);
    PUT(rec, LINEAR_END, t1o);
    PUT(rec, LINEAR_TIMING, dur);
    PUT(rec, LINEAR_IN_SHAPE, xs);
    PUT(rec, LINEAR_IN_DTYPE, xd);
    PUT(rec, LINEAR_OUT_SHAPE, os);
    PUT(rec, LINEAR_OUT_DTYPE, od);
    if (PyList_Append(self->records, rec) < 0)
        goto fail;
    nb = PyObject_GetAttr(out, str_nbytes);
    if (nb == NULL)
        goto fail;
    long long n = PyLong_AsLongLong(nb);
    if (n == -1 && PyErr_Occurred())
        goto fail;
    if (n > self->alloc_min) {
        /* the memory reading of the pass, or of now outside one */
        PyObject *cell = PyObject_GetAttr(self->rec, recorder_attr[RECORDER_FORWARD_MEMORY]);
        if (cell == Py_None) {
            Py_DECREF(cell);
            cell = PyObject_CallMethodObjArgs(self->rec, recorder_attr[RECORDER_MEMORY_CELL], NULL);
        }
        PyObject *dp = cell ? PyObject_GetAttr(out, str_data_ptr) : NULL;
        PyObject *ptr = dp ? PyObject_CallNoArgs(dp) : NULL;
        PyObject *arec = ptr ? PyTuple_New(ALLOC_OUT_LEN) : NULL;
        int rc = -1;
        if (arec != NULL) {
            PUT(arec, 0, tag_obj[REC_ALLOC_OUT]);
            PUT(arec, ALLOC_OUT_SITE, self->site);
            PUT(arec, ALLOC_OUT_END, t1o);
            PUT(arec, ALLOC_OUT_NBYTES, nb);
            PUT(arec, ALLOC_OUT_IN_SHAPE, xs);
            PUT(arec, ALLOC_OUT_OUT_SHAPE, os);
            PUT(arec, ALLOC_OUT_OUT_DTYPE, od);
            PUT(arec, ALLOC_OUT_ADDRESS, ptr);
            PUT(arec, ALLOC_OUT_MEMORY, cell);
            rc = PyList_Append(self->records, arec);
        }
        Py_XDECREF(cell);
        Py_XDECREF(dp);
        Py_XDECREF(ptr);
        Py_XDECREF(arec);
        if (rc < 0)
            goto fail;
    }
    if (add_hook_ns(self->rec, monotonic_ns() - t1) < 0)
        goto fail;
    Py_DECREF(xs);
    Py_DECREF(xd);
    Py_DECREF(os);
    Py_DECREF(od);
    Py_DECREF(t1o);
    Py_DECREF(dur);
    Py_DECREF(rec);
    Py_DECREF(nb);
    return out;
fail:
    Py_XDECREF(xs);
    Py_XDECREF(xd);
    Py_XDECREF(os);
    Py_XDECREF(od);
    Py_XDECREF(t1o);
    Py_XDECREF(dur);
    Py_XDECREF(rec);
    Py_XDECREF(nb);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(tf_doc, "TimedForward(recorder, orig, general, finish, hand_off, records, site, tag, tensor, longest,\n"
                     "             active, derived, alloc_min)\n"
                     "--\n\n"
                     "The resource monitor's wrapper of a module's forward on the CPU (wrappers.fast_forward):\n"
                     "times the call and records shapes and dtypes.");

static PyType_Slot tf_slots[] = {
    {Py_tp_new, tf_new},
    {Py_tp_call, tf_call},
    {Py_tp_dealloc, tf_dealloc},
    {Py_tp_traverse, tf_traverse},
    {Py_tp_clear, tf_clear},
    {Py_tp_doc, (void *)tf_doc},
    {0, NULL},
};

static PyType_Spec tf_spec = {
    "llm_instrumentation.resources._native.TimedForward",
    sizeof(TimedForward),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    tf_slots,
};

static PyMethodDef methods[] = {
    {"register", (PyCFunction)(void (*)(void))register_schema, METH_FASTCALL, register_doc},
    {"render", (PyCFunction)(void (*)(void))render, METH_FASTCALL, render_doc},
    {"template_key", (PyCFunction)(void (*)(void))template_key, METH_FASTCALL, template_key_doc},
    {NULL, NULL, 0, NULL},
};

static int
intern_all(PyObject **dst, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if ((dst[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    return 0;
}

static int
exec_module(PyObject *m)
{
    str_shape = PyUnicode_InternFromString("shape");
    str_dtype = PyUnicode_InternFromString("dtype");
    str_nbytes = PyUnicode_InternFromString("nbytes");
    str_data_ptr = PyUnicode_InternFromString("data_ptr");
    str_attn_static = PyUnicode_InternFromString("attn_static");
    key_out = PyUnicode_InternFromString("out");
    key_handoff = PyUnicode_InternFromString("handoff");
    str_query = PyUnicode_InternFromString("query");
    str_elapsed_time = PyUnicode_InternFromString("elapsed_time");
    key_attention_str = PyUnicode_InternFromString("attention");
    key_kv_str = PyUnicode_InternFromString("kv");
    if (!str_shape || !str_dtype || !str_nbytes || !str_data_ptr || !str_attn_static || !key_out || !key_handoff ||
        !str_query || !str_elapsed_time || !key_attention_str || !key_kv_str ||
        intern_all(mem_keys, slot_names + SLOT_PROCESS_RSS_BYTES, N_MEMORY) ||
        intern_all(state_attr, state_names, N_STATE) || intern_all(recorder_attr, recorder_names, N_RECORDER) ||
        intern_all(count_keys, count_names, N_COUNT))
        return -1;
    for (int i = 0; i <= REC_PREBUILT; i++)
        if ((tag_obj[i] = PyLong_FromLong(i)) == NULL)
            return -1;
    PyObject *tp = PyType_FromSpec(&tf_spec);
    if (tp == NULL)
        return -1;
    if (PyModule_AddObject(m, "TimedForward", tp) < 0) {
        Py_DECREF(tp);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "llm_instrumentation.resources._native",
    "The resource monitor's C paths (optional; the Python paths write the same bytes).",
    0,
    methods,
    module_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&module);
}
