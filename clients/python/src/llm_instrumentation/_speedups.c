/*
 * The client's hot paths in C (docs/PERFORMANCE.md):
 *
 * - write_record: the per-record copy into the ring ("Client cost per record inside
 *   decoding"). During token-by-token decoding a capture hook runs between kernels that
 *   stream the model's weights through the caches, so the Python that writes a record runs
 *   cold: the header slice assignment, the struct.pack_into of the changing fields and
 *   ctypes.memmove took about 7 us per record there (against under 1 us in a warm loop),
 *   most of it the code those three paths touch. write_record does the same three stores in
 *   one call.
 * - TimedForward and render: the resource monitor's timing wrapper of a module on the CPU
 *   and its writer's formatting of those records into JSON lines ("Resource events on
 *   decode"). resources.py holds the logic; these do what its fast paths do, for the records
 *   they know, and hand everything else back to it.
 *
 * Built against the limited API of CPython 3.10 (one .abi3.so for every later CPython).
 * Optional: the Python paths write the same bytes wherever this module is missing
 * (tests/test_record_fast_path.py and tests/test_resources.py check both).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The offset of seq in a TENSOR record header; record_len, step and forward follow it as
 * little-endian u64 (docs/PROTOCOL.md 2). */
#define SEQ_OFF 8

static int
u64_arg(PyObject *o, const char *what, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "write_record: %s must be an int in [0, 2**64)", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

PyDoc_STRVAR(write_record_doc,
"write_record(dst, header, seq, record_len, step, forward, payload_off, src, n)\n"
"--\n\n"
"Write one TENSOR record at address dst: the encoded header area (bytes), then seq,\n"
"record_len, step and forward as little-endian u64 at byte 8, then n payload bytes copied\n"
"from address src to dst + payload_off. The caller owns both addresses: dst a writable\n"
"ring mapping with record_len bytes free, src a live contiguous tensor's data pointer.");

static PyObject *
write_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "write_record takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    char *hdr;
    Py_ssize_t hdr_len;
    if (PyBytes_AsStringAndSize(args[1], &hdr, &hdr_len) < 0)
        return NULL;
    uint64_t dst, seq, rec_len, step, forward, payload_off, src, n;
    if (u64_arg(args[0], "dst", &dst) || u64_arg(args[2], "seq", &seq) ||
        u64_arg(args[3], "record_len", &rec_len) || u64_arg(args[4], "step", &step) ||
        u64_arg(args[5], "forward", &forward) || u64_arg(args[6], "payload_off", &payload_off) ||
        u64_arg(args[7], "src", &src) || u64_arg(args[8], "n", &n))
        return NULL;
    /* What the addresses cannot be checked for, the sizes can: a header that would not
     * hold the four fields, or a header or payload reaching past the record. */
    if (dst == 0 || (n > 0 && src == 0) || hdr_len < SEQ_OFF + 32 || (uint64_t)hdr_len > payload_off ||
        payload_off > rec_len || n > rec_len - payload_off) {
        PyErr_Format(PyExc_ValueError,
                     "write_record: header of %zd bytes, payload of %llu at %llu, record of %llu",
                     hdr_len, (unsigned long long)n, (unsigned long long)payload_off,
                     (unsigned long long)rec_len);
        return NULL;
    }
    unsigned char *d = (unsigned char *)(uintptr_t)dst;
    memcpy(d, hdr, (size_t)hdr_len);
    put_le64(d + SEQ_OFF, seq);
    put_le64(d + SEQ_OFF + 8, rec_len);
    put_le64(d + SEQ_OFF + 16, step);
    put_le64(d + SEQ_OFF + 24, forward);
    if (n > 0)
        memcpy(d + payload_off, (const void *)(uintptr_t)src, (size_t)n);
    Py_RETURN_NONE;
}

/* ----- the resource monitor's timing wrapper ----------------------------------------------- */

/* The clock of time.perf_counter_ns on Linux: the wrapper's readings and the monitor's
 * Python readings are compared and subtracted. */
static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

static PyObject *str_shape, *str_dtype, *str_nbytes, *str_hook_ns, *str_data_ptr, *str_fwd_mem, *str_mem_cell;


/* monitor.hook_ns += ns */
static int
add_hook_ns(PyObject *mon, long long ns)
{
    PyObject *cur = PyObject_GetAttr(mon, str_hook_ns);
    if (cur == NULL)
        return -1;
    long long v = PyLong_AsLongLong(cur);
    Py_DECREF(cur);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromLongLong(v + ns);
    if (nv == NULL)
        return -1;
    int rc = PyObject_SetAttr(mon, str_hook_ns, nv);
    Py_DECREF(nv);
    return rc;
}

typedef struct {
    PyObject_HEAD
    PyObject *mon;      /* the ResourceMonitor: its hook_ns */
    PyObject *orig;     /* the module's forward */
    PyObject *general;  /* the general wrapper: every call this one does not time itself */
    PyObject *finish;   /* general._finish: an output that is not a plain tensor */
    PyObject *alloc;    /* the writer's method for an output allocation above the level's size */
    PyObject *hand_off; /* passes ended forward passes to the writer */
    PyObject *records;  /* the monitor's record list */
    PyObject *site;
    PyObject *build;    /* the writer's method for these records */
    PyObject *tensor;   /* torch.Tensor: only exact tensors take this path */
    PyObject *lng;      /* [site]: the longest module of the last pass */
    PyObject *active;   /* [bool]: False once the monitor unwrapped the module */
    int derived;        /* the output shape follows from the input's (not recorded) */
    long long alloc_min;
} TimedForward;

#define TF_FIELDS(X) X(mon) X(orig) X(general) X(finish) X(alloc) X(hand_off) X(records) X(site) \
    X(build) X(tensor) X(lng) X(active)

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
    PyObject *o[12];
    int derived;
    long long alloc_min;
    if (kwargs != NULL && PyDict_Size(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "TimedForward takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOpL:TimedForward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &derived, &alloc_min))
        return NULL;
    if (!PyList_Check(o[6]) || !PyList_Check(o[10]) || !PyList_Check(o[11]) || PyList_Size(o[10]) != 1 ||
        PyList_Size(o[11]) != 1 || !PyType_Check(o[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "TimedForward: records must be a list, tensor a type, long and active one-item lists");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    TimedForward *self = (TimedForward *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject **dst[12] = {&self->mon, &self->orig, &self->general, &self->finish, &self->alloc, &self->hand_off,
                          &self->records, &self->site, &self->build, &self->tensor, &self->lng, &self->active};
    for (int i = 0; i < 12; i++) {
        Py_INCREF(o[i]);
        *dst[i] = o[i];
    }
    self->derived = derived;
    self->alloc_min = alloc_min;
    return (PyObject *)self;
}

/* resources.ResourceMonitor._fast_forward's closure: the module's call timed on the
 * monotonic clock; (build, site, t1, t1 - t0, input shape, input dtype, output shape or
 * None, output dtype) appended to the records. */
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
        if (add_hook_ns(self->mon, monotonic_ns() - t) < 0)
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
    PyObject *xs = NULL, *xd = NULL, *os = NULL, *od = NULL, *t1o = NULL, *dur = NULL, *rec = NULL,
             *nb = NULL;
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
    rec = dur ? PyTuple_Pack(8, self->build, self->site, t1o, dur, xs, xd, os, od) : NULL;
    if (rec == NULL || PyList_Append(self->records, rec) < 0)
        goto fail;
    nb = PyObject_GetAttr(out, str_nbytes);
    if (nb == NULL)
        goto fail;
    long long n = PyLong_AsLongLong(nb);
    if (n == -1 && PyErr_Occurred())
        goto fail;
    if (n > self->alloc_min) {
        /* (alloc, site, t1, nbytes, input shape, output shape or None, output dtype, address,
         * [memory reading of the pass, or of now outside one]) */
        PyObject *cell = PyObject_GetAttr(self->mon, str_fwd_mem);
        if (cell == Py_None) {
            Py_DECREF(cell);
            cell = PyObject_CallMethodObjArgs(self->mon, str_mem_cell, NULL);
        }
        PyObject *dp = cell ? PyObject_GetAttr(out, str_data_ptr) : NULL;
        PyObject *ptr = dp ? PyObject_CallNoArgs(dp) : NULL;
        PyObject *arec = ptr ? PyTuple_Pack(9, self->alloc, self->site, t1o, nb, xs, os, od, ptr, cell) : NULL;
        int rc = arec ? PyList_Append(self->records, arec) : -1;
        Py_XDECREF(cell); Py_XDECREF(dp); Py_XDECREF(ptr); Py_XDECREF(arec);
        if (rc < 0)
            goto fail;
    }
    if (add_hook_ns(self->mon, monotonic_ns() - t1) < 0)
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
"TimedForward(monitor, orig, general, finish, alloc, hand_off, records, site, build, tensor,\n"
"             long, active, derived, alloc_min)\n"
"--\n\n"
"The resource monitor's wrapper of a module's forward on the CPU (resources.py,\n"
"ResourceMonitor._fast_forward): times the call and records shapes and dtypes.");

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
    "llm_instrumentation._speedups.TimedForward", sizeof(TimedForward), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, tf_slots,
};

/* ----- the resource writer's templates ---------------------------------------------------- */

/* The slots of a template program, by number; their names (the %(name)s of the Python
 * templates) in slot_names, which the module exports as SLOT_NAMES for resources._program. */
enum {
    SLOT_TS, SLOT_SEQ, SLOT_SEQ2, SLOT_STEP, SLOT_FWD, SLOT_D, SLOT_TF, SLOT_TB, SLOT_ADDR,
    SLOT_RSS, SLOT_DEV_ALLOCATED, SLOT_DEV_RESERVED, SLOT_DEV_PEAK,
    SLOT_KS, SLOT_VS, SLOT_QT, SLOT_KT, SLOT_FL, SLOT_GF, SLOT_LEN, SLOT_PREV, SLOT_NEW, SLOT_REUSED,
    SLOT_HIT, SLOT_CB, SLOT_CMB, SLOT_BPT, SLOT_GROW, SLOT_BW, SLOT_MP, SLOT_MF,
    N_SLOTS, SLOT_NONE = 255
};
static const char *slot_names[N_SLOTS] = {
    "ts", "seq", "seq2", "step", "fwd", "d", "tf", "tb", "addr",
    "process_rss_bytes", "device_memory_allocated_bytes", "device_memory_reserved_bytes", "device_memory_peak_bytes",
    "ks", "vs", "qt", "kt", "fl", "gf", "len", "prev", "new", "reused",
    "hit", "cb", "cmb", "bpt", "grow", "bw", "mp", "mf",
};
/* The memory reading's keys of SLOT_RSS and the three after it, in that order. */
#define N_MEM 4
static const char *mem_names[N_MEM] = {"process_rss_bytes", "device_memory_allocated_bytes",
                                       "device_memory_reserved_bytes", "device_memory_peak_bytes"};
static PyObject *mem_keys[N_MEM];

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int
buf_put(Buf *b, const char *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 2048;
        while (cap < b->len + n)
            cap *= 2;
        char *p = PyMem_Realloc(b->p, cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* Decimal digits of v ending at end: returns where they start. */
static char *
digits(char *end, unsigned long long v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

static int
buf_ll(Buf *b, long long v)
{
    char s[32], *end = s + sizeof s;
    char *p = digits(end, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v);
    if (v < 0)
        *--p = '-';
    return buf_put(b, p, (size_t)(end - p));
}

/* str(v) of a float: repr's shortest round trip. */
static int
buf_double(Buf *b, double v)
{
    char *s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return -1;
    int rc = buf_put(b, s, strlen(s));
    PyMem_Free(s);
    return rc;
}

/* str(ns / 1000.0) without a float conversion: below 10**15 ns the double nearest a
 * three-decimal number is printed by repr as that number, trailing zeros dropped (two
 * numbers with three decimals lie 0.001 apart, many units in the last place there). */
static int
buf_us(Buf *b, long long ns)
{
    if (ns < 0 || ns >= 1000000000000000LL)
        return buf_double(b, (double)ns / 1000.0);
    char s[40], *end = s + 32;
    char *p = digits(end, (unsigned long long)(ns / 1000));
    int frac = (int)(ns % 1000);
    *end++ = '.';
    *end++ = (char)('0' + frac / 100);
    *end++ = (char)('0' + frac / 10 % 10);
    *end++ = (char)('0' + frac % 10);
    while (end[-1] == '0' && end[-2] != '.')
        end--;
    return buf_put(b, p, (size_t)(end - p));
}

/* resources._jlist: a shape as the JSON list "[1,16,6,64]". */
static int
buf_shape(Buf *b, PyObject *shape)
{
    if (shape == NULL || !PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "render: a shape must be a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_Size(shape);
    if (buf_put(b, "[", 1) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
        if ((v == -1 && PyErr_Occurred()) || (i && buf_put(b, ",", 1) < 0) || buf_ll(b, v) < 0)
            return -1;
    }
    return buf_put(b, "]", 1);
}

/* Python's floor division of a by 1000. */
static long long
floordiv1000(long long a)
{
    long long q = a / 1000;
    return (a % 1000 != 0 && a < 0) ? q - 1 : q;
}

/* The values of one event's slots. */
typedef struct {
    long long ints[N_SLOTS];
    double dbl[N_SLOTS];
    int has[N_SLOTS];             /* the memory values present in the reading */
    unsigned long long addr;
    long long timing;             /* SLOT_D */
    int tf_zero;                  /* the module path writes 0 (an int) as the throughput of no FLOPs */
    PyObject *ks, *vs;            /* borrowed shapes */
} Values;

static int
run_program(Buf *b, PyObject *prog, const Values *v)
{
    /* (text, ops): the template's literal text in one piece, and per op three bytes — how
     * many bytes of text come next (little-endian u16), then a slot (SLOT_NONE: none). One
     * contiguous object each, rather than a tuple of parts: the writer runs while the model
     * streams its weights through the caches, and every object touched is a miss. */
    char *text, *ops;
    Py_ssize_t text_len, ops_len;
    if (!PyTuple_Check(prog) || PyTuple_Size(prog) != 2 ||
        PyBytes_AsStringAndSize(PyTuple_GetItem(prog, 0), &text, &text_len) < 0 ||
        PyBytes_AsStringAndSize(PyTuple_GetItem(prog, 1), &ops, &ops_len) < 0 || ops_len % 3 != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "render: a template program must be (text, ops) bytes");
        return -1;
    }
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < ops_len; i += 3) {
        Py_ssize_t len = (unsigned char)ops[i] | ((unsigned char)ops[i + 1] << 8);
        int code = (unsigned char)ops[i + 2];
        if (len > text_len - pos) {
            PyErr_SetString(PyExc_ValueError, "render: a template program reads past its text");
            return -1;
        }
        if (buf_put(b, text + pos, (size_t)len) < 0)
            return -1;
        pos += len;
        int rc;
        switch (code) {
        case SLOT_NONE:
            rc = 0;
            break;
        case SLOT_TS: case SLOT_SEQ: case SLOT_SEQ2: case SLOT_STEP: case SLOT_FWD: case SLOT_QT:
        case SLOT_KT: case SLOT_FL: case SLOT_LEN: case SLOT_PREV: case SLOT_NEW: case SLOT_REUSED:
        case SLOT_CB: case SLOT_GROW:
            rc = buf_ll(b, v->ints[code]);
            break;
        case SLOT_D:
            rc = buf_us(b, v->timing);
            break;
        case SLOT_TF:
            rc = v->tf_zero ? buf_put(b, "0", 1) : buf_double(b, v->dbl[code]);
            break;
        case SLOT_TB: case SLOT_GF: case SLOT_HIT: case SLOT_CMB: case SLOT_BPT: case SLOT_BW: case SLOT_MF:
            rc = buf_double(b, v->dbl[code]);
            break;
        case SLOT_MP: { /* resources._pressure_word of the memory-use fraction, as JSON */
            double f = v->dbl[SLOT_MF];
            const char *w = f < 0.5 ? "\"low\"" : f < 0.8 ? "\"medium\"" : "\"high\"";
            rc = buf_put(b, w, strlen(w));
            break;
        }
        case SLOT_ADDR: { /* hex(ptr) */
            char s[32], *end = s + sizeof s, *p = end;
            unsigned long long a = v->addr;
            do {
                *--p = "0123456789abcdef"[a & 15];
                a >>= 4;
            } while (a);
            *--p = 'x';
            *--p = '0';
            rc = buf_put(b, p, (size_t)(end - p));
            break;
        }
        case SLOT_RSS: case SLOT_DEV_ALLOCATED: case SLOT_DEV_RESERVED: case SLOT_DEV_PEAK:
            if (!v->has[code]) {
                PyErr_Format(PyExc_KeyError, "render: the memory reading has no %s", mem_names[code - SLOT_RSS]);
                return -1;
            }
            rc = buf_ll(b, v->ints[code]);
            break;
        case SLOT_KS: case SLOT_VS:
            rc = buf_shape(b, code == SLOT_KS ? v->ks : v->vs);
            break;
        default:
            PyErr_Format(PyExc_ValueError, "render: unknown template slot %d", code);
            return -1;
        }
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* One line of prog appended to lines. */
static int
emit(Buf *b, PyObject *prog, const Values *v, PyObject *lines)
{
    b->len = 0;
    if (run_program(b, prog, v) < 0)
        return -1;
    PyObject *line = PyBytes_FromStringAndSize(b->p, (Py_ssize_t)b->len);
    if (line == NULL)
        return -1;
    int rc = PyList_Append(lines, line);
    Py_DECREF(line);
    return rc;
}

/* The writer's state render keeps in C while it runs and writes back to the monitor. */
enum { A_W_LONG_SITE, A_TOTAL_US, A_SEQ, A_W_OFF, A_W_STEP, A_W_FWD, A_W_FLOPS, A_W_LONG, A_TOTAL_FLOPS,
       A_FLOWS, A_W_FRAC, N_ATTRS };
static const char *attr_names[N_ATTRS] = {"_w_long_site", "total_compute_us", "_seq", "_w_off", "_w_step",
                                          "_w_fwd", "_w_flops", "_w_long", "total_flops", "component_flows",
                                          "_w_frac"};
static PyObject *attr[N_ATTRS];
/* counts' keys */
enum { C_COMPUTE, C_MLP, C_ALLOC, C_KV, C_HANDOFF, N_COUNTS };
static const char *count_names[N_COUNTS] = {"compute_execution", "mlp_operation", "memory_allocation",
                                            "kv_cache_update", "component_handoff"};
static PyObject *count_keys[N_COUNTS];
static PyObject *str_out, *str_attn_static, *str_handoff;

typedef struct {
    long long seq, off, step, fwd, w_flops, w_long, total_flops, flows;
    double total_us;
    PyObject *long_site; /* owned */
    long long counts[N_COUNTS];
    PyObject *tpl, *kv_prev; /* borrowed */
} State;

static int
get_ll(PyObject *mon, int name, long long *out)
{
    PyObject *o = PyObject_GetAttr(mon, attr[name]);
    if (o == NULL)
        return -1;
    *out = PyLong_AsLongLong(o);
    Py_DECREF(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
set_ll(PyObject *mon, int name, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    int rc = PyObject_SetAttr(mon, attr[name], o);
    Py_DECREF(o);
    return rc;
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

static void
new_long(State *st, long long t, PyObject *site)
{
    if (t > st->w_long) {
        st->w_long = t;
        Py_INCREF(site);
        Py_DECREF(st->long_site);
        st->long_site = site;
    }
}

/* A template entry's item i; NULL (no error) when the entry is not a tuple that long. */
static PyObject *
entry_item(PyObject *entry, Py_ssize_t n, Py_ssize_t i)
{
    return PyTuple_Check(entry) && PyTuple_Size(entry) == n ? PyTuple_GetItem(entry, i) : NULL;
}

/* The template entry of key (a new reference, stolen); NULL without an error: none yet. */
static PyObject *
lookup(State *st, PyObject *key)
{
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(st->tpl, key); /* borrowed */
    Py_DECREF(key);
    return entry;
}

/* Linear (_w_linear) and module (_w_module) records of the timing wrappers:
 * (build, site, t1, timing, input shape, input dtype, output shape or None, output dtype).
 * 1 written, 0 for the Python path, -1 an error. */
static int
render_timed(State *st, PyObject *r, int is_lin, PyObject *lines, Buf *b)
{
    PyObject *timing = PyTuple_GetItem(r, 3), *site = PyTuple_GetItem(r, 1);
    if (!PyLong_CheckExact(timing))
        return 0; /* CUDA events */
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *entry = lookup(st, PyTuple_Pack(6, site, PyTuple_GetItem(r, 4), PyTuple_GetItem(r, 5),
                                               PyTuple_GetItem(r, 6), PyTuple_GetItem(r, 7),
                                               t > 0 ? Py_True : Py_False));
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    /* Linear: (fmts, flops, nbytes, programs); module: (fmt, flops, nbytes, counts_time, program). */
    Py_ssize_t want = is_lin ? 4 : 5;
    PyObject *progs = entry_item(entry, want, want - 1);
    if (progs == NULL || progs == Py_None)
        return 0;
    long long flops = PyLong_AsLongLong(PyTuple_GetItem(entry, 1));
    long long nbytes = PyLong_AsLongLong(PyTuple_GetItem(entry, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (flops < 0 || st->total_flops > LLONG_MAX - flops || st->w_flops > LLONG_MAX - flops)
        return 0; /* beyond 64 bits: Python's ints take over */
    int counts_time = 1;
    if (!is_lin && (counts_time = PyObject_IsTrue(PyTuple_GetItem(entry, 3))) < 0)
        return -1;
    new_long(st, t, site);
    Values v;
    memset(&v, 0, sizeof v);
    v.ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_SEQ2] = st->seq + 2;
    v.ints[SLOT_STEP] = st->step;
    v.ints[SLOT_FWD] = st->fwd;
    v.timing = t;
    double d = (double)t / 1000.0;
    v.tf_zero = !is_lin && flops == 0;
    v.dbl[SLOT_TF] = t > 0 ? (double)flops / (d * 1e3) : 0.0;
    v.dbl[SLOT_TB] = t > 0 ? (double)nbytes / (d * 1e3) : 0.0;
    Py_ssize_t nprog = is_lin ? PyTuple_Size(progs) : 1;
    for (Py_ssize_t k = 0; k < nprog; k++)
        if (emit(b, is_lin ? PyTuple_GetItem(progs, k) : progs, &v, lines) < 0)
            return -1;
    st->seq += nprog;
    st->counts[C_COMPUTE] += 1;
    if (is_lin) {
        st->w_flops += flops;
        if (nprog > 1)
            st->counts[C_MLP] += 1;
    }
    st->total_flops += flops;
    if (counts_time)
        st->total_us += d;
    return 1;
}

/* An allocation's program and values, not yet written: the record of _w_alloc_out (nine
 * items: build, site, t1, size, input shape, output shape or None, dtype, address, cell) or
 * of _w_alloc (ten: build, site, t1, kind, size, shape, dtype, is_cuda, address, cell).
 * 1 ready, 0 for the Python path (no memory reading yet: it reads one), -1 an error. */
static int
prepare_alloc(State *st, PyObject *r, PyObject **prog, Values *v)
{
    Py_ssize_t n = PyTuple_Size(r);
    PyObject *site = PyTuple_GetItem(r, 1), *ptr = PyTuple_GetItem(r, n - 2), *cell = PyTuple_GetItem(r, n - 1);
    if (!PyList_Check(cell) || PyList_Size(cell) != 1)
        return 0;
    PyObject *mem = PyList_GetItem(cell, 0);
    if (!PyDict_Check(mem) || !PyLong_CheckExact(ptr) || !PyLong_CheckExact(PyTuple_GetItem(r, 2)))
        return 0;
    memset(v, 0, sizeof *v);
    for (int k = 0; k < N_MEM; k++) {
        PyObject *m = PyDict_GetItemWithError(mem, mem_keys[k]);
        if (m == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        if (!PyLong_CheckExact(m))
            return 0;
        v->ints[SLOT_RSS + k] = PyLong_AsLongLong(m);
        v->has[SLOT_RSS + k] = 1;
    }
    long long t1 = PyLong_AsLongLong(PyTuple_GetItem(r, 2));
    v->addr = PyLong_AsUnsignedLongLong(ptr);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *key;
    if (n == 9) { /* _w_alloc_out's key: the input's shape, not the output's made from it */
        PyObject *nmem = PyLong_FromSsize_t(PyDict_Size(mem));
        key = nmem ? PyTuple_Pack(7, str_out, site, PyTuple_GetItem(r, 3), PyTuple_GetItem(r, 4),
                                  PyTuple_GetItem(r, 5), PyTuple_GetItem(r, 6), nmem) : NULL;
        Py_XDECREF(nmem);
    } else { /* _w_alloc's: (site, kind, size, shape, dtype, is_cuda, tuple(mem)) */
        PyObject *keys = PySequence_Tuple(mem);
        key = keys ? PyTuple_Pack(7, site, PyTuple_GetItem(r, 3), PyTuple_GetItem(r, 4), PyTuple_GetItem(r, 5),
                                  PyTuple_GetItem(r, 6), PyTuple_GetItem(r, 7), keys) : NULL;
        Py_XDECREF(keys);
    }
    if (key == NULL)
        return -1;
    PyObject *entry = lookup(st, key);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    /* (fmt, how the reading is filled in, program) */
    *prog = entry_item(entry, 3, 2);
    if (*prog == NULL || *prog == Py_None)
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
    st->counts[C_ALLOC] += 1;
    return 1;
}

/* A shape's element count; -1 when it is not a tuple of ints in range. */
static long long
numel(PyObject *shape)
{
    if (!PyTuple_Check(shape))
        return -1;
    long long n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_Size(shape); i++) {
        long long d = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
        if (d < 0 || (d && n > LLONG_MAX / d)) {
            PyErr_Clear();
            return -1;
        }
        n *= d;
    }
    return n;
}

/* A shape's item i from the end (i < 0) or start; -1 when it has none. */
static long long
dim(PyObject *shape, Py_ssize_t i)
{
    Py_ssize_t n = PyTuple_Size(shape);
    if (i < 0)
        i += n;
    if (i < 0 || i >= n)
        return -1;
    long long d = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (d == -1 && PyErr_Occurred())
        PyErr_Clear();
    return d;
}

/* The record of the attention wrapper's fast path (_w_attention_kv): (build, site, t1,
 * timing, input shape, input dtype, output shape, output dtype, key shape before, key shape,
 * key dtype, value shape, value dtype, output allocation record or None) — the attention
 * event, the allocation's and the KV cache's, as _w_attention_kv writes them. */
static int
render_attention(State *st, PyObject *r, PyObject *walloc, PyObject *lines, Buf *b)
{
    PyObject *site = PyTuple_GetItem(r, 1), *timing = PyTuple_GetItem(r, 3), *xs = PyTuple_GetItem(r, 4),
             *kb = PyTuple_GetItem(r, 8), *ks = PyTuple_GetItem(r, 9), *kd = PyTuple_GetItem(r, 10),
             *vs = PyTuple_GetItem(r, 11), *vd = PyTuple_GetItem(r, 12), *al = PyTuple_GetItem(r, 13);
    if (!PyLong_CheckExact(timing) || !PyTuple_Check(xs) || !PyTuple_Check(ks) || !PyTuple_Check(vs) ||
        (kb != Py_None && !PyTuple_Check(kb)))
        return 0;
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *as = PyObject_GetAttr(site, str_attn_static); /* (seq_first, heads, head_dim, idx) */
    if (as == NULL)
        return -1;
    int ok = PyTuple_Check(as) && PyTuple_Size(as) == 4;
    PyObject *heads_o = ok ? PyTuple_GetItem(as, 1) : NULL, *hd_o = ok ? PyTuple_GetItem(as, 2) : NULL;
    PyObject *idx = ok ? PyTuple_GetItem(as, 3) : NULL;
    int seq_first = ok ? PyObject_IsTrue(PyTuple_GetItem(as, 0)) : 0;
    long long heads = 0, head_dim = 0;
    if (ok && heads_o != Py_None)
        heads = PyLong_AsLongLong(heads_o);
    if (ok && hd_o != Py_None)
        head_dim = PyLong_AsLongLong(hd_o);
    int rc = 0;
    if (!ok || seq_first < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        goto out;
    }
    Py_ssize_t n = PyTuple_Size(xs);
    long long q_len = n >= 2 ? dim(xs, seq_first ? 0 : -2) : 0;
    long long batch = n >= 3 ? dim(xs, seq_first ? 1 : 0) : 1;
    long long kv_len = PyTuple_Size(ks) >= 2 ? dim(ks, -2) : 0;
    long long before = 0;
    if (kb != Py_None && PyTuple_Size(kb) >= 2 && numel(kb) != 0)
        before = dim(kb, -2);
    long long nk = numel(ks), nv = numel(vs);
    if (q_len < 0 || batch < 0 || kv_len < 0 || before < 0 || nk < 0 || nv < 0)
        goto out;
    /* flops = 4 * batch * heads * q_len * kv_len * head_dim, when heads and head_dim are known */
    int has_flops = heads != 0 && head_dim != 0;
    long long flops = 0;
    if (has_flops) {
        long long f[6] = {4, batch, heads, q_len, kv_len, head_dim};
        flops = 1;
        for (int i = 0; i < 6; i++) {
            if (f[i] < 0 || (f[i] && flops > LLONG_MAX / f[i]))
                goto out;
            flops *= f[i];
        }
        if (st->total_flops > LLONG_MAX - flops || st->w_flops > LLONG_MAX - flops)
            goto out;
    }
    int variant = !has_flops ? 0 : (flops && t > 0) ? 2 : 1;
    PyObject *var = PyLong_FromLong(variant);
    PyObject *entry = var ? lookup(st, PyTuple_Pack(8, site, xs, PyTuple_GetItem(r, 5), PyTuple_GetItem(r, 6),
                                                    PyTuple_GetItem(r, 7), kd, vd, var)) : NULL;
    Py_XDECREF(var);
    if (entry == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    /* (attention fmt, KV fmt, key item size, value item size, attention program, KV program) */
    PyObject *pa = entry_item(entry, 6, 4), *pk = entry_item(entry, 6, 5);
    if (pa == NULL || pk == NULL || pa == Py_None || pk == Py_None)
        goto out;
    long long isz_k = PyLong_AsLongLong(PyTuple_GetItem(entry, 2)), isz_v = PyLong_AsLongLong(PyTuple_GetItem(entry, 3));
    if (PyErr_Occurred() || (isz_k && nk > (LLONG_MAX / 2) / isz_k) || (isz_v && nv > (LLONG_MAX / 2) / isz_v)) {
        PyErr_Clear();
        goto out;
    }
    /* The output allocation: written between the two, or the whole record goes to Python. */
    PyObject *aprog = NULL;
    Values av;
    if (al != Py_None) {
        if (!PyTuple_Check(al) || PyTuple_Size(al) != 10 || PyTuple_GetItem(al, 0) != walloc)
            goto out;
        rc = prepare_alloc(st, al, &aprog, &av);
        if (rc <= 0)
            goto out;
        rc = 0;
    }
    new_long(st, t, site);
    Values v;
    memset(&v, 0, sizeof v);
    v.ks = ks;
    v.vs = vs;
    v.ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_STEP] = st->step;
    v.ints[SLOT_FWD] = st->fwd;
    v.ints[SLOT_QT] = q_len;
    v.ints[SLOT_KT] = kv_len;
    v.ints[SLOT_FL] = flops;
    v.dbl[SLOT_GF] = (double)flops / 1e9;
    v.timing = t;
    v.tf_zero = 0;
    double d = (double)t / 1000.0;
    v.dbl[SLOT_TF] = t > 0 ? (double)flops / (d * 1e3) : 0.0;
    if (emit(b, pa, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[C_COMPUTE] += 1;
    if (flops) {
        st->w_flops += flops;
        st->total_flops += flops;
    }
    if (aprog != NULL && emit_alloc(st, aprog, &av, lines, b) < 0) {
        rc = -1;
        goto out;
    }
    /* _kv_step: the cache's bytes, and their growth since this layer's last update */
    long long nbytes = nk * isz_k + nv * isz_v, grew_from = 0;
    PyObject *prev = PyDict_GetItemWithError(st->kv_prev, idx); /* borrowed */
    if (prev == NULL && PyErr_Occurred()) {
        rc = -1;
        goto out;
    }
    if (prev != NULL && before > 0) {
        grew_from = PyLong_AsLongLong(prev);
        if (grew_from == -1 && PyErr_Occurred()) {
            rc = -1;
            goto out;
        }
    }
    PyObject *nb = PyLong_FromLongLong(nbytes);
    if (nb == NULL || PyDict_SetItem(st->kv_prev, idx, nb) < 0) {
        Py_XDECREF(nb);
        rc = -1;
        goto out;
    }
    Py_DECREF(nb);
    v.ints[SLOT_SEQ] = st->seq + 1;
    v.ints[SLOT_LEN] = kv_len;
    v.ints[SLOT_PREV] = before;
    v.ints[SLOT_NEW] = kv_len - before;
    v.ints[SLOT_REUSED] = before;
    v.dbl[SLOT_HIT] = kv_len ? (double)before / (double)kv_len : 0.0;
    v.ints[SLOT_CB] = nbytes;
    v.dbl[SLOT_CMB] = (double)nbytes / 1048576.0;
    v.dbl[SLOT_BPT] = kv_len ? (double)nbytes / (double)kv_len : 0.0;
    v.ints[SLOT_GROW] = nbytes - grew_from;
    if (emit(b, pk, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[C_KV] += 1;
    rc = 1;
out:
    Py_DECREF(as);
    return rc;
}

/* The MLP wrapper's handoff record (_w_handoff): (build, site, t1, timing, shape, dtype,
 * is_cuda, memory-use fraction or unread, source). */
static int
render_handoff(State *st, PyObject *mon, PyObject *r, PyObject *unread, PyObject *lines, Buf *b)
{
    PyObject *site = PyTuple_GetItem(r, 1), *timing = PyTuple_GetItem(r, 3), *frac = PyTuple_GetItem(r, 7);
    if (!PyLong_CheckExact(timing))
        return 0;
    long long t = PyLong_AsLongLong(timing), t1 = PyLong_AsLongLong(PyTuple_GetItem(r, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *owned = NULL;
    if (frac == unread) { /* the pass's reading, once the Python path has taken it */
        owned = frac = PyObject_GetAttr(mon, attr[A_W_FRAC]);
        if (frac == NULL)
            return -1;
    }
    int rc = 0;
    if (frac == unread || (frac != Py_None && !PyFloat_CheckExact(frac)))
        goto out;
    int variant = (t > 0) + 2 * (frac != Py_None);
    PyObject *var = PyLong_FromLong(variant);
    PyObject *entry = var ? lookup(st, PyTuple_Pack(6, str_handoff, site, PyTuple_GetItem(r, 4), PyTuple_GetItem(r, 5),
                                                    PyTuple_GetItem(r, 8), var)) : NULL;
    Py_XDECREF(var);
    if (entry == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    /* (fmt, bytes handed over, program) */
    PyObject *prog = entry_item(entry, 3, 2);
    if (prog == NULL || prog == Py_None)
        goto out;
    long long nbytes = PyLong_AsLongLong(PyTuple_GetItem(entry, 1));
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
    double d = (double)t / 1000.0;
    v.dbl[SLOT_BW] = t > 0 ? (double)nbytes / (d * 1e3) : 0.0;
    v.dbl[SLOT_MF] = frac != Py_None ? PyFloat_AsDouble(frac) : 0.0;
    if (emit(b, prog, &v, lines) < 0) {
        rc = -1;
        goto out;
    }
    st->seq += 1;
    st->counts[C_HANDOFF] += 1;
    st->flows += 1;
    rc = 1;
out:
    Py_XDECREF(owned);
    return rc;
}

PyDoc_STRVAR(render_doc,
"render(monitor, records, start, lines, deadline_ns, consts) -> int\n"
"--\n\n"
"The resource writer's fast paths (resources.py: ResourceMonitor._w_linear, _w_module,\n"
"_w_alloc_out, _w_alloc, _w_attention_kv, _w_handoff) for records[start:]: each record of\n"
"those whose template is known becomes its JSON lines, appended to lines, with the monitor's counters\n"
"advanced as those methods advance them. Stops at the first other record, or once the\n"
"monotonic clock passes deadline_ns, and returns the index of the first record not\n"
"written. consts is the monitor's (_build_linear, _build_module, _build_alloc,\n"
"_build_attention, _build_walloc, _build_handoff, _tpl, counts, _kv_prev_bytes) and the\n"
"module's _UNREAD; the caller has checked monitor._fast.");

static PyObject *
render(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "render takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *mon = args[0], *recs = args[1], *lines = args[3], *consts = args[5];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    long long deadline = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(recs) || !PyList_Check(lines) || !PyTuple_Check(consts) || PyTuple_Size(consts) != 10 ||
        !PyDict_Check(PyTuple_GetItem(consts, 6)) || !PyDict_Check(PyTuple_GetItem(consts, 7)) ||
        !PyDict_Check(PyTuple_GetItem(consts, 8))) {
        PyErr_SetString(PyExc_TypeError, "render: records and lines must be lists, consts the monitor's "
                                         "(_build_linear, _build_module, _build_alloc, _build_attention, "
                                         "_build_walloc, _build_handoff, _tpl, counts, _kv_prev_bytes) and _UNREAD");
        return NULL;
    }
    Py_ssize_t n = PyList_Size(recs), i = start;
    if (i >= n)
        return PyLong_FromSsize_t(i);
    /* Passed by the caller once per batch (they stay for the monitor's life): fewer
     * attribute reads per call. */
    PyObject *lin = PyTuple_GetItem(consts, 0), *mod = PyTuple_GetItem(consts, 1),
             *alloc_out = PyTuple_GetItem(consts, 2), *attn = PyTuple_GetItem(consts, 3),
             *walloc = PyTuple_GetItem(consts, 4), *handoff = PyTuple_GetItem(consts, 5),
             *counts = PyTuple_GetItem(consts, 7), *unread = PyTuple_GetItem(consts, 9);
    Py_INCREF(consts); /* keeps the borrowed items alive */
    State st;
    memset(&st, 0, sizeof st);
    st.tpl = PyTuple_GetItem(consts, 6);
    st.kv_prev = PyTuple_GetItem(consts, 8);
    PyObject *tot_us = NULL, *result = NULL;
    Buf b = {NULL, 0, 0};
    int dirty = 0;
    st.long_site = PyObject_GetAttr(mon, attr[A_W_LONG_SITE]);
    tot_us = st.long_site ? PyObject_GetAttr(mon, attr[A_TOTAL_US]) : NULL;
    if (tot_us == NULL || get_ll(mon, A_SEQ, &st.seq) || get_ll(mon, A_W_OFF, &st.off) ||
        get_ll(mon, A_W_STEP, &st.step) || get_ll(mon, A_W_FWD, &st.fwd) || get_ll(mon, A_W_FLOPS, &st.w_flops) ||
        get_ll(mon, A_W_LONG, &st.w_long) || get_ll(mon, A_TOTAL_FLOPS, &st.total_flops) ||
        get_ll(mon, A_FLOWS, &st.flows))
        goto done;
    st.total_us = PyFloat_AsDouble(tot_us);
    if (st.total_us == -1.0 && PyErr_Occurred())
        goto done;

    for (; i < n; i++) {
        PyObject *r = PyList_GetItem(recs, i);
        if (!PyTuple_Check(r) || PyTuple_Size(r) < 8)
            break;
        PyObject *bld = PyTuple_GetItem(r, 0);
        Py_ssize_t size = PyTuple_Size(r);
        int rc;
        if (size == 8 && (bld == lin || bld == mod)) {
            rc = render_timed(&st, r, bld == lin, lines, &b);
        } else if ((size == 9 && bld == alloc_out) || (size == 10 && bld == walloc)) {
            PyObject *prog = NULL;
            Values v;
            rc = prepare_alloc(&st, r, &prog, &v);
            if (rc > 0)
                rc = emit_alloc(&st, prog, &v, lines, &b);
        } else if (size == 14 && bld == attn) {
            rc = render_attention(&st, r, walloc, lines, &b);
        } else if (size == 9 && bld == handoff) {
            rc = render_handoff(&st, mon, r, unread, lines, &b);
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
        int rc = us == NULL || set_ll(mon, A_SEQ, st.seq) || set_ll(mon, A_W_FLOPS, st.w_flops) ||
                 set_ll(mon, A_W_LONG, st.w_long) || PyObject_SetAttr(mon, attr[A_W_LONG_SITE], st.long_site) ||
                 set_ll(mon, A_TOTAL_FLOPS, st.total_flops) || PyObject_SetAttr(mon, attr[A_TOTAL_US], us) ||
                 set_ll(mon, A_FLOWS, st.flows);
        for (int k = 0; k < N_COUNTS && !rc; k++)
            rc = count_add(counts, count_keys[k], st.counts[k]);
        Py_XDECREF(us);
        if (exc_t != NULL) {
            PyErr_Restore(exc_t, exc_v, exc_tb);
        } else if (rc) {
            Py_CLEAR(result);
        }
    }
    PyMem_Free(b.p);
    Py_XDECREF(st.long_site);
    Py_XDECREF(tot_us);
    Py_DECREF(consts);
    return result;
}

static PyMethodDef methods[] = {
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL, write_record_doc},
    {"render", (PyCFunction)(void (*)(void))render, METH_FASTCALL, render_doc},
    {NULL, NULL, 0, NULL},
};

static int
intern_all(PyObject **dst, const char **names, int n)
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
    str_hook_ns = PyUnicode_InternFromString("hook_ns");
    str_data_ptr = PyUnicode_InternFromString("data_ptr");
    str_fwd_mem = PyUnicode_InternFromString("_fwd_mem");
    str_mem_cell = PyUnicode_InternFromString("_mem_cell");
    str_out = PyUnicode_InternFromString("out");
    str_attn_static = PyUnicode_InternFromString("attn_static");
    str_handoff = PyUnicode_InternFromString("handoff");
    if (!str_shape || !str_dtype || !str_nbytes || !str_hook_ns || !str_data_ptr || !str_fwd_mem || !str_mem_cell ||
        !str_out || !str_attn_static || !str_handoff || intern_all(mem_keys, mem_names, N_MEM) ||
        intern_all(attr, attr_names, N_ATTRS) || intern_all(count_keys, count_names, N_COUNTS))
        return -1;
    PyObject *names = PyTuple_New(N_SLOTS);
    if (names == NULL)
        return -1;
    for (int i = 0; i < N_SLOTS; i++) {
        PyObject *name = slot_names[i] ? PyUnicode_FromString(slot_names[i]) : NULL;
        if (name == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_SystemError, "_speedups: slot %d has no name", i);
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SetItem(names, i, name);
    }
    if (PyModule_AddObject(m, "SLOT_NAMES", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
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
    PyModuleDef_HEAD_INIT, "llm_instrumentation._speedups",
    "The client's hot paths in C (optional; the Python paths write the same bytes).",
    0, methods, module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&module);
}
