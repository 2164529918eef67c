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
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

static int
py_repr_double(char *out, size_t cap, double v)
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
#define RENDER_DOUBLE py_repr_double
#include "_render_core.h"

/* The clock of time.perf_counter_ns on Linux: the wrapper's readings and the monitor's
 * Python readings are compared and subtracted. */
static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

static PyObject *str_shape, *str_dtype, *str_nbytes, *str_data_ptr, *str_attn_static, *key_out, *key_handoff;
static PyObject *state_attr[N_STATE], *recorder_attr[N_RECORDER], *count_keys[N_COUNT], *mem_keys[N_MEMORY];
static PyObject *tag_obj[REC_PREBUILT + 1];
static PyObject *unread; /* records.UNREAD, set by register() */

/* A record's kind (item 0), -1 when it has none. */
static long
tag_of(PyObject *r)
{
    long tag = PyLong_AsLong(PyTuple_GetItem(r, 0));
    if (tag == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return tag;
}

static int
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

PyDoc_STRVAR(register_doc,
"register(schema_items, unread)\n"
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
                         n, N_SCHEMA_ITEMS, c ? c->section : "(records.py)", c ? c->owner : "",
                         c ? c->index : (int)i, c ? c->name : "");
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
    PyObject *tag;      /* REC_LINEAR or REC_MODULE */
    PyObject *tensor;   /* torch.Tensor: only exact tensors take this path */
    PyObject *lng;      /* [site]: the longest module of the last pass */
    PyObject *active;   /* [bool]: False once the monitor unwrapped the module */
    int derived;        /* the output shape follows from the input's (not recorded) */
    long long alloc_min;
} TimedForward;

#define TF_FIELDS(X) X(rec) X(orig) X(general) X(finish) X(hand_off) X(records) X(site) X(tag) X(tensor) \
    X(lng) X(active)

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
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOpL:TimedForward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8], &o[9], &o[10], &derived, &alloc_min))
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
    PyObject **dst[11] = {&self->rec, &self->orig, &self->general, &self->finish, &self->hand_off, &self->records,
                          &self->site, &self->tag, &self->tensor, &self->lng, &self->active};
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
#define PUT(t, i, v) (Py_INCREF(v), PyTuple_SetItem((t), (i), (v)))
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
        Py_XDECREF(cell); Py_XDECREF(dp); Py_XDECREF(ptr); Py_XDECREF(arec);
        if (rc < 0)
            goto fail;
    }
    if (add_hook_ns(self->rec, monotonic_ns() - t1) < 0)
        goto fail;
    Py_DECREF(xs); Py_DECREF(xd); Py_DECREF(os); Py_DECREF(od);
    Py_DECREF(t1o); Py_DECREF(dur); Py_DECREF(rec); Py_DECREF(nb);
    return out;
fail:
    Py_XDECREF(xs); Py_XDECREF(xd); Py_XDECREF(os); Py_XDECREF(od);
    Py_XDECREF(t1o); Py_XDECREF(dur); Py_XDECREF(rec); Py_XDECREF(nb);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(tf_doc,
"TimedForward(recorder, orig, general, finish, hand_off, records, site, tag, tensor, longest,\n"
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
    "llm_instrumentation.resources._native.TimedForward", sizeof(TimedForward), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, tf_slots,
};

/* ----- the writer's templates ------------------------------------------------------------------ */

/* What render keeps in C while it runs and writes back to the writer state. */
typedef struct {
    long long seq, off, step, fwd, pass_flops, long_ns, total_flops, flows;
    double total_us;
    PyObject *long_site;         /* owned */
    long long counts[N_COUNT];
    PyObject *tpl, *kv_bytes;    /* owned: the state's dicts */
} State;

/* A shape (a tuple of ints) into dims; 0 when it is not one C can hold (Python takes it). */
static int
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

/* The program (text, ops) of a template entry run into lines. */
static int
emit(Buf *b, PyObject *prog, const Values *v, PyObject *lines)
{
    char *text, *ops;
    Py_ssize_t text_len, ops_len;
    if (!PyTuple_Check(prog) || PyTuple_Size(prog) != 2 ||
        PyBytes_AsStringAndSize(PyTuple_GetItem(prog, 0), &text, &text_len) < 0 ||
        PyBytes_AsStringAndSize(PyTuple_GetItem(prog, 1), &ops, &ops_len) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "render: a template program must be (text, ops) bytes");
        return -1;
    }
    b->len = 0;
    int bad = 0;
    switch (run_program(b, text, (size_t)text_len, (const unsigned char *)ops, (size_t)ops_len, v, &bad)) {
    case RENDER_OK:
        break;
    case RENDER_NOMEM:
        PyErr_NoMemory();
        return -1;
    case RENDER_BAD_PROGRAM:
        PyErr_SetString(PyExc_ValueError, "render: a template program reads past its text");
        return -1;
    case RENDER_NO_MEMORY_VALUE:
        PyErr_Format(PyExc_KeyError, "render: the memory reading has no %s", slot_names[bad]);
        return -1;
    default:
        PyErr_Format(PyExc_ValueError, "render: unknown template slot %d", bad);
        return -1;
    }
    PyObject *line = PyBytes_FromStringAndSize(b->p, (Py_ssize_t)b->len);
    if (line == NULL)
        return -1;
    int rc = PyList_Append(lines, line);
    Py_DECREF(line);
    return rc;
}

/* The template entry under key (stolen): borrowed; NULL without an error when none is made
 * yet; NULL with a TypeError naming the items when it is not the tuple records.ENTRIES says. */
static PyObject *
lookup(State *st, PyObject *key, Py_ssize_t want, const char *kind, const char *names)
{
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(st->tpl, key); /* borrowed */
    Py_DECREF(key);
    if (entry != NULL && (!PyTuple_Check(entry) || PyTuple_Size(entry) != want)) {
        PyErr_Format(PyExc_TypeError,
                     "render: the template entry of a %s record is not the %zd-tuple records.ENTRIES declares "
                     "(%s): the writer (lines.py) and records.py differ",
                     kind, want, names);
        return NULL;
    }
    return entry;
}

static PyObject *
pack(Py_ssize_t n, PyObject **items)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PUT(t, i, items[i]);
    return t;
}

static PyObject *
bool_obj(int v)
{
    return v ? Py_True : Py_False;
}

/* The key records.KEYS[LINEAR or MODULE] of a record. */
static PyObject *
key_timed(PyObject *r, long long t)
{
    PyObject *k[KEY_LINEAR_LEN];
    k[KEY_LINEAR_SITE] = PyTuple_GetItem(r, LINEAR_SITE);
    k[KEY_LINEAR_IN_SHAPE] = PyTuple_GetItem(r, LINEAR_IN_SHAPE);
    k[KEY_LINEAR_IN_DTYPE] = PyTuple_GetItem(r, LINEAR_IN_DTYPE);
    k[KEY_LINEAR_OUT_SHAPE] = PyTuple_GetItem(r, LINEAR_OUT_SHAPE);
    k[KEY_LINEAR_OUT_DTYPE] = PyTuple_GetItem(r, LINEAR_OUT_DTYPE);
    k[KEY_LINEAR_TIMED] = bool_obj(t > 0);
    return pack(KEY_LINEAR_LEN, k);
}

/* LINEAR and MODULE records. 1 written, 0 for the Python path, -1 an error. */
static int
render_timed(State *st, PyObject *r, int is_lin, PyObject *lines, Buf *b)
{
    PyObject *timing = PyTuple_GetItem(r, LINEAR_TIMING), *site = PyTuple_GetItem(r, LINEAR_SITE);
    if (!PyLong_CheckExact(timing))
        return 0; /* CUDA events */
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, LINEAR_END));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *entry = is_lin ? lookup(st, key_timed(r, t), ENTRY_LINEAR_LEN, "LINEAR", ENTRY_LINEAR_NAMES)
                             : lookup(st, key_timed(r, t), ENTRY_MODULE_LEN, "MODULE", ENTRY_MODULE_NAMES);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *progs = PyTuple_GetItem(entry, is_lin ? ENTRY_LINEAR_PROGRAMS : ENTRY_MODULE_PROGRAM);
    if (progs == Py_None)
        return 0;
    long long flops = PyLong_AsLongLong(PyTuple_GetItem(entry, is_lin ? ENTRY_LINEAR_FLOPS : ENTRY_MODULE_FLOPS));
    long long nbytes = PyLong_AsLongLong(PyTuple_GetItem(entry, is_lin ? ENTRY_LINEAR_NBYTES : ENTRY_MODULE_NBYTES));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (flops < 0 || st->total_flops > LLONG_MAX - flops || st->pass_flops > LLONG_MAX - flops)
        return 0; /* beyond 64 bits: Python's ints take over */
    int counts_time = 1;
    if (!is_lin && (counts_time = PyObject_IsTrue(PyTuple_GetItem(entry, ENTRY_MODULE_COUNTS_TIME))) < 0)
        return -1;
    if (t > st->long_ns) {
        st->long_ns = t;
        Py_INCREF(site);
        Py_DECREF(st->long_site);
        st->long_site = site;
    }
    Values v;
    memset(&v, 0, sizeof v);
    v.ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_SEQ2] = st->seq + 2;
    v.ints[SLOT_STEP] = st->step;
    v.ints[SLOT_FWD] = st->fwd;
    v.timing = t;
    v.tf_zero = !is_lin && flops == 0;
    v.dbl[SLOT_TF] = t > 0 ? per_ns((double)flops, t) : 0.0;
    v.dbl[SLOT_TB] = t > 0 ? per_ns((double)nbytes, t) : 0.0;
    Py_ssize_t nprog = is_lin ? PyTuple_Size(progs) : 1;
    for (Py_ssize_t k = 0; k < nprog; k++)
        if (emit(b, is_lin ? PyTuple_GetItem(progs, k) : progs, &v, lines) < 0)
            return -1;
    st->seq += nprog;
    st->counts[COUNT_COMPUTE_EXECUTION] += 1;
    if (is_lin) {
        st->pass_flops += flops;
        if (nprog > 1)
            st->counts[COUNT_MLP_OPERATION] += 1;
    }
    st->total_flops += flops;
    if (counts_time)
        st->total_us += (double)t / 1000.0;
    return 1;
}

/* The key records.KEYS[ALLOC_OUT or ALLOC] of a record (mem: its memory reading). */
static PyObject *
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

/* An allocation's program and values, not yet written: an ALLOC_OUT or ALLOC record.
 * 1 ready, 0 for the Python path (no memory reading yet: it reads one), -1 an error. */
static int
prepare_alloc(State *st, PyObject *r, PyObject **prog, Values *v)
{
    int out = PyTuple_Size(r) == ALLOC_OUT_LEN;
    PyObject *ptr = PyTuple_GetItem(r, out ? ALLOC_OUT_ADDRESS : ALLOC_ADDRESS);
    PyObject *cell = PyTuple_GetItem(r, out ? ALLOC_OUT_MEMORY : ALLOC_MEMORY);
    PyObject *end = PyTuple_GetItem(r, out ? ALLOC_OUT_END : ALLOC_END);
    if (!PyList_Check(cell) || PyList_Size(cell) != 1)
        return 0;
    PyObject *mem = PyList_GetItem(cell, 0);
    if (!PyDict_Check(mem) || !PyLong_CheckExact(ptr) || !PyLong_CheckExact(end))
        return 0;
    memset(v, 0, sizeof *v);
    for (int k = 0; k < N_MEMORY; k++) {
        PyObject *m = PyDict_GetItemWithError(mem, mem_keys[k]);
        if (m == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        if (!PyLong_CheckExact(m))
            return 0;
        v->ints[SLOT_PROCESS_RSS_BYTES + k] = PyLong_AsLongLong(m);
        v->has[SLOT_PROCESS_RSS_BYTES + k] = 1;
    }
    long long t1 = PyLong_AsLongLong(end);
    v->addr = PyLong_AsUnsignedLongLong(ptr);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *entry = lookup(st, key_alloc(r, mem), ENTRY_ALLOC_LEN, out ? "ALLOC_OUT" : "ALLOC", ENTRY_ALLOC_NAMES);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    *prog = PyTuple_GetItem(entry, ENTRY_ALLOC_PROGRAM);
    if (*prog == Py_None)
        return 0;
    v->ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v->ints[SLOT_STEP] = st->step;
    v->ints[SLOT_FWD] = st->fwd;
    return 1;
}

static int
emit_alloc(State *st, PyObject *prog, Values *v, PyObject *lines, Buf *b)
{
    v->ints[SLOT_SEQ] = st->seq + 1;
    if (emit(b, prog, v, lines) < 0)
        return -1;
    st->seq += 1;
    st->counts[COUNT_MEMORY_ALLOCATION] += 1;
    return 1;
}

/* A shape's element count; -1 when it overflows. */
static long long
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

/* The key records.KEYS[ATTENTION_KV] of a record. */
static PyObject *
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

/* The site's (seq_first, heads, head_dim, cache layer) and the figures of an ATTENTION_KV
 * record; 0 when C cannot take it. */
typedef struct {
    long long q_len, batch, kv_len, before, heads, head_dim, flops, nk, nv;
    int has_flops, variant;
    PyObject *idx; /* owned */
} AttnFigures;

static int
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

/* An ATTENTION_KV record: the attention event, the allocation's and the KV cache's, as
 * AttentionLines.attention_kv writes them. */
static int
render_attention(State *st, PyObject *r, PyObject *lines, Buf *b)
{
    PyObject *site = PyTuple_GetItem(r, ATTENTION_KV_SITE), *timing = PyTuple_GetItem(r, ATTENTION_KV_TIMING);
    PyObject *al = PyTuple_GetItem(r, ATTENTION_KV_ALLOCATION);
    if (!PyLong_CheckExact(timing))
        return 0;
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, ATTENTION_KV_END));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    Values v;
    memset(&v, 0, sizeof v);
    AttnFigures f;
    memset(&f, 0, sizeof f);
    int rc = attention_figures(st, r, &v, &f);
    if (rc <= 0)
        goto out;
    rc = 0;
    f.variant = !f.has_flops ? 0 : (f.flops && t > 0) ? 2 : 1;
    PyObject *entry = lookup(st, key_attention(r, f.variant), ENTRY_ATTENTION_KV_LEN, "ATTENTION_KV",
                             ENTRY_ATTENTION_KV_NAMES);
    if (entry == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    PyObject *pa = PyTuple_GetItem(entry, ENTRY_ATTENTION_KV_ATTENTION_PROGRAM);
    PyObject *pk = PyTuple_GetItem(entry, ENTRY_ATTENTION_KV_KV_PROGRAM);
    if (pa == Py_None || pk == Py_None)
        goto out;
    long long isz_k = PyLong_AsLongLong(PyTuple_GetItem(entry, ENTRY_ATTENTION_KV_KEY_ITEMSIZE));
    long long isz_v = PyLong_AsLongLong(PyTuple_GetItem(entry, ENTRY_ATTENTION_KV_VALUE_ITEMSIZE));
    if (PyErr_Occurred() || (isz_k && f.nk > (LLONG_MAX / 2) / isz_k) || (isz_v && f.nv > (LLONG_MAX / 2) / isz_v)) {
        PyErr_Clear();
        goto out;
    }
    /* The output allocation: written between the two, or the whole record goes to Python. */
    PyObject *aprog = NULL;
    Values av;
    if (al != Py_None) {
        if (!PyTuple_Check(al) || PyTuple_Size(al) != ALLOC_LEN || tag_of(al) != REC_ALLOC)
            goto out;
        rc = prepare_alloc(st, al, &aprog, &av);
        if (rc <= 0)
            goto out;
        rc = 0;
    }
    if (t > st->long_ns) {
        st->long_ns = t;
        Py_INCREF(site);
        Py_DECREF(st->long_site);
        st->long_site = site;
    }
    v.ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_STEP] = st->step;
    v.ints[SLOT_FWD] = st->fwd;
    v.ints[SLOT_QT] = f.q_len;
    v.ints[SLOT_KT] = f.kv_len;
    v.ints[SLOT_FL] = f.flops;
    v.dbl[SLOT_GF] = (double)f.flops / 1e9;
    v.timing = t;
    v.dbl[SLOT_TF] = t > 0 ? per_ns((double)f.flops, t) : 0.0;
    if (emit(b, pa, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[COUNT_COMPUTE_EXECUTION] += 1;
    if (f.flops) {
        st->pass_flops += f.flops;
        st->total_flops += f.flops;
    }
    if (aprog != NULL && emit_alloc(st, aprog, &av, lines, b) < 0) {
        rc = -1;
        goto out;
    }
    /* the cache's bytes, and their growth since this layer's last update */
    long long nbytes = f.nk * isz_k + f.nv * isz_v, prev_bytes = 0;
    PyObject *prev = PyDict_GetItemWithError(st->kv_bytes, f.idx); /* borrowed */
    if (prev == NULL && PyErr_Occurred()) {
        rc = -1;
        goto out;
    }
    if (prev != NULL) {
        prev_bytes = PyLong_AsLongLong(prev);
        if (prev_bytes == -1 && PyErr_Occurred()) {
            rc = -1;
            goto out;
        }
    }
    PyObject *nb = PyLong_FromLongLong(nbytes);
    if (nb == NULL || PyDict_SetItem(st->kv_bytes, f.idx, nb) < 0) {
        Py_XDECREF(nb);
        rc = -1;
        goto out;
    }
    Py_DECREF(nb);
    double hit, bpt;
    long long growth;
    kv_figures(f.kv_len, f.before, nbytes, prev != NULL, prev_bytes, &hit, &bpt, &growth);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_LEN] = f.kv_len;
    v.ints[SLOT_PREV] = f.before;
    v.ints[SLOT_NEW] = f.kv_len - f.before;
    v.ints[SLOT_REUSED] = f.before;
    v.dbl[SLOT_HIT] = hit;
    v.ints[SLOT_CB] = nbytes;
    v.dbl[SLOT_CMB] = (double)nbytes / 1048576.0;
    v.dbl[SLOT_BPT] = bpt;
    v.ints[SLOT_GROW] = growth;
    if (emit(b, pk, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[COUNT_KV_CACHE_UPDATE] += 1;
    rc = 1;
out:
    Py_XDECREF(f.idx);
    return rc;
}

/* The key records.KEYS[HANDOFF] of a record. */
static PyObject *
key_handoff_of(PyObject *r, int variant)
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
    PyObject *key = pack(KEY_HANDOFF_LEN, k);
    Py_DECREF(var);
    return key;
}

/* A HANDOFF record; the memory-use fraction when unread is the pass's reading in the state
 * (once the Python path has taken it). */
static int
render_handoff(State *st, PyObject *state, PyObject *r, PyObject *lines, Buf *b)
{
    PyObject *timing = PyTuple_GetItem(r, HANDOFF_TIMING), *frac = PyTuple_GetItem(r, HANDOFF_MEMORY_FRACTION);
    if (!PyLong_CheckExact(timing))
        return 0;
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, HANDOFF_START));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *owned = NULL;
    if (frac == unread) {
        owned = frac = PyObject_GetAttr(state, state_attr[STATE_MEMORY_FRACTION]);
        if (frac == NULL)
            return -1;
    }
    int rc = 0;
    if (frac == unread || (frac != Py_None && !PyFloat_CheckExact(frac)))
        goto out;
    int variant = (t > 0) + 2 * (frac != Py_None);
    PyObject *entry = lookup(st, key_handoff_of(r, variant), ENTRY_HANDOFF_LEN, "HANDOFF", ENTRY_HANDOFF_NAMES);
    if (entry == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    PyObject *prog = PyTuple_GetItem(entry, ENTRY_HANDOFF_PROGRAM);
    if (prog == Py_None)
        goto out;
    long long nbytes = PyLong_AsLongLong(PyTuple_GetItem(entry, ENTRY_HANDOFF_NBYTES));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        goto out;
    }
    Values v;
    memset(&v, 0, sizeof v);
    v.ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_STEP] = st->step;
    v.ints[SLOT_FWD] = st->fwd;
    v.timing = t;
    v.dbl[SLOT_BW] = t > 0 ? per_ns((double)nbytes, t) : 0.0;
    v.dbl[SLOT_MF] = frac != Py_None ? PyFloat_AsDouble(frac) : 0.0;
    if (emit(b, prog, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[COUNT_COMPONENT_HANDOFF] += 1;
    st->flows += 1;
    rc = 1;
out:
    Py_XDECREF(owned);
    return rc;
}

/* ----- render: the state in, the records rendered, the state out -------------------------------- */

static int
get_ll(PyObject *state, int name, long long *out)
{
    PyObject *o = PyObject_GetAttr(state, state_attr[name]);
    if (o == NULL)
        return -1;
    *out = PyLong_AsLongLong(o);
    Py_DECREF(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
set_ll(PyObject *state, int name, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    int rc = PyObject_SetAttr(state, state_attr[name], o);
    Py_DECREF(o);
    return rc;
}

/* The state's dict attribute name (a new reference), or NULL with a TypeError naming it. */
static PyObject *
get_dict(PyObject *state, int name)
{
    PyObject *d = PyObject_GetAttr(state, state_attr[name]);
    if (d != NULL && !PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "render: the writer state's %s must be a dict", state_names[name]);
        Py_CLEAR(d);
    }
    return d;
}

static int
count_add(PyObject *counts, PyObject *name, long long k)
{
    if (k == 0)
        return 0;
    PyObject *cur = PyDict_GetItemWithError(counts, name); /* borrowed */
    if (cur == NULL && PyErr_Occurred())
        return -1;
    long long v = 0;
    if (cur != NULL) {
        v = PyLong_AsLongLong(cur);
        if (v == -1 && PyErr_Occurred())
            return -1;
    }
    PyObject *nv = PyLong_FromLongLong(v + k);
    if (nv == NULL)
        return -1;
    int rc = PyDict_SetItem(counts, name, nv);
    Py_DECREF(nv);
    return rc;
}

PyDoc_STRVAR(render_doc,
"render(state, records, start, lines, deadline_ns) -> int\n"
"--\n\n"
"The writer's fast paths (lines.py: Lines.linear, module, alloc_out, alloc,\n"
"handoff; attention_lines.py: attention_kv) for records[start:]: each LINEAR, MODULE,\n"
"ALLOC_OUT, ALLOC, ATTENTION_KV or HANDOFF record whose template is made becomes its JSON\n"
"lines, appended to lines, with the writer state (records.STATE) advanced as those methods\n"
"advance it. Stops at the first other record, or once the monotonic clock passes\n"
"deadline_ns, and returns the index of the first record not written.");

static PyObject *
render(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "render takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!registered())
        return NULL;
    PyObject *state = args[0], *recs = args[1], *lines = args[3];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    long long deadline = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(recs) || !PyList_Check(lines)) {
        PyErr_SetString(PyExc_TypeError, "render: records and lines must be lists");
        return NULL;
    }
    Py_ssize_t n = PyList_Size(recs), i = start;
    if (i >= n)
        return PyLong_FromSsize_t(i);
    State st;
    memset(&st, 0, sizeof st);
    PyObject *tot_us = NULL, *counts = NULL, *result = NULL;
    Buf b = {NULL, 0, 0};
    int dirty = 0;
    st.tpl = get_dict(state, STATE_TEMPLATES);
    st.kv_bytes = st.tpl ? get_dict(state, STATE_KV_BYTES) : NULL;
    counts = st.kv_bytes ? get_dict(state, STATE_COUNTS) : NULL;
    st.long_site = counts ? PyObject_GetAttr(state, state_attr[STATE_LONG_SITE]) : NULL;
    tot_us = st.long_site ? PyObject_GetAttr(state, state_attr[STATE_TOTAL_COMPUTE_US]) : NULL;
    if (tot_us == NULL || get_ll(state, STATE_SEQ, &st.seq) || get_ll(state, STATE_CLOCK_OFFSET, &st.off) ||
        get_ll(state, STATE_STEP, &st.step) || get_ll(state, STATE_FORWARD, &st.fwd) ||
        get_ll(state, STATE_PASS_FLOPS, &st.pass_flops) || get_ll(state, STATE_LONG_NS, &st.long_ns) ||
        get_ll(state, STATE_TOTAL_FLOPS, &st.total_flops) || get_ll(state, STATE_COMPONENT_FLOWS, &st.flows))
        goto done;
    st.total_us = PyFloat_AsDouble(tot_us);
    if (st.total_us == -1.0 && PyErr_Occurred())
        goto done;

    for (; i < n; i++) {
        PyObject *r = PyList_GetItem(recs, i);
        if (!PyTuple_Check(r) || PyTuple_Size(r) < 2)
            break;
        long tag = tag_of(r);
        Py_ssize_t size = PyTuple_Size(r);
        int rc;
        if ((tag == REC_LINEAR && size == LINEAR_LEN) || (tag == REC_MODULE && size == MODULE_LEN)) {
            rc = render_timed(&st, r, tag == REC_LINEAR, lines, &b);
        } else if ((tag == REC_ALLOC_OUT && size == ALLOC_OUT_LEN) || (tag == REC_ALLOC && size == ALLOC_LEN)) {
            PyObject *prog = NULL;
            Values v;
            rc = prepare_alloc(&st, r, &prog, &v);
            if (rc > 0)
                rc = emit_alloc(&st, prog, &v, lines, &b);
        } else if (tag == REC_ATTENTION_KV && size == ATTENTION_KV_LEN) {
            rc = render_attention(&st, r, lines, &b);
        } else if (tag == REC_HANDOFF && size == HANDOFF_LEN) {
            rc = render_handoff(&st, state, r, lines, &b);
        } else if (tag >= REC_LINEAR && tag <= REC_HANDOFF) {
            PyErr_Format(PyExc_TypeError, "render: a record of kind %ld has %zd items, not what records.FIELDS "
                                          "declares (the wrappers and records.py differ)", tag, size);
            goto done;
        } else {
            break;
        }
        if (rc < 0)
            goto done;
        if (rc == 0)
            break;
        dirty = 1;
        if (monotonic_ns() > deadline) {
            i++;
            break;
        }
    }
    result = PyLong_FromSsize_t(i);
done:
    /* What was written is counted, even when a later record failed. */
    if (dirty) {
        PyObject *exc_t = NULL, *exc_v = NULL, *exc_tb = NULL;
        PyErr_Fetch(&exc_t, &exc_v, &exc_tb);
        PyObject *us = PyFloat_FromDouble(st.total_us);
        int rc = us == NULL || set_ll(state, STATE_SEQ, st.seq) || set_ll(state, STATE_PASS_FLOPS, st.pass_flops) ||
                 set_ll(state, STATE_LONG_NS, st.long_ns) ||
                 PyObject_SetAttr(state, state_attr[STATE_LONG_SITE], st.long_site) ||
                 set_ll(state, STATE_TOTAL_FLOPS, st.total_flops) ||
                 PyObject_SetAttr(state, state_attr[STATE_TOTAL_COMPUTE_US], us) ||
                 set_ll(state, STATE_COMPONENT_FLOWS, st.flows);
        for (int k = 0; k < N_COUNT && !rc; k++)
            rc = count_add(counts, count_keys[k], st.counts[k]);
        Py_XDECREF(us);
        if (exc_t != NULL) {
            PyErr_Restore(exc_t, exc_v, exc_tb);
        } else if (rc) {
            Py_CLEAR(result);
        }
    }
    free(b.p);
    Py_XDECREF(st.long_site);
    Py_XDECREF(st.tpl);
    Py_XDECREF(st.kv_bytes);
    Py_XDECREF(counts);
    Py_XDECREF(tot_us);
    return result;
}

PyDoc_STRVAR(template_key_doc,
"template_key(record, memory=None) -> tuple\n"
"--\n\n"
"The template key render looks a record up by (records.KEYS): LINEAR, MODULE, ALLOC_OUT,\n"
"ALLOC (with its memory reading), ATTENTION_KV or HANDOFF. The tests compare it with the\n"
"key the Python writer files the template under.");

static PyObject *
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
        long long t = PyLong_AsLongLong(PyTuple_GetItem(r, LINEAR_TIMING));
        return PyErr_Occurred() ? NULL : key_timed(r, t);
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
    if (tag == REC_HANDOFF && size == HANDOFF_LEN) {
        long long t = PyLong_AsLongLong(PyTuple_GetItem(r, HANDOFF_TIMING));
        if (PyErr_Occurred())
            return NULL;
        PyObject *frac = nargs > 1 ? args[1] : PyTuple_GetItem(r, HANDOFF_MEMORY_FRACTION);
        return key_handoff_of(r, (t > 0) + 2 * (frac != Py_None));
    }
    PyErr_Format(PyExc_ValueError, "template_key: no template key for a record of kind %ld and %zd items", tag, size);
    return NULL;
}

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
    if (!str_shape || !str_dtype || !str_nbytes || !str_data_ptr || !str_attn_static || !key_out || !key_handoff ||
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
    PyModuleDef_HEAD_INIT, "llm_instrumentation.resources._native",
    "The resource monitor's C paths (optional; the Python paths write the same bytes).",
    0, methods, module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&module);
}
