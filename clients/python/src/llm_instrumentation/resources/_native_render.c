/*
 * The writer's rendering of the records of the timing wrappers (lines.py, attention_lines.py):
 * the writer state (records.STATE) in, the templated records written, the state out.
 */
#include "_native.h"

/* The program (text, ops) of a template entry run into lines. */
int
emit_program(Buf *b, PyObject *prog, const Values *v, PyObject *lines)
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
PyObject *
lookup_entry(State *st, PyObject *key, Py_ssize_t want, const char *kind, const char *names)
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

/* LINEAR and MODULE records. 1 written, 0 for the Python path, -1 an error. */
static int
render_timed(State *st, PyObject *r, int is_lin, PyObject *lines, Buf *b)
{
    PyObject *site = PyTuple_GetItem(r, LINEAR_SITE);
    Values v;
    memset(&v, 0, sizeof v);
    int rt = read_timing(PyTuple_GetItem(r, LINEAR_TIMING), &v);
    if (rt <= 0)
        return rt;
    long long t1 = PyLong_AsLongLong(PyTuple_GetItem(r, LINEAR_END));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    int timed = v.d_us > 0;
    PyObject *entry =
        is_lin ? lookup_entry(st, key_timed(r, timed, v.cuda), ENTRY_LINEAR_LEN, "LINEAR", ENTRY_LINEAR_NAMES)
               : lookup_entry(st, key_timed(r, timed, v.cuda), ENTRY_MODULE_LEN, "MODULE", ENTRY_MODULE_NAMES);
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
    /* The longest module of the pass: timed on the host clock (Lines.linear, Lines.module). */
    if (!v.cuda)
        note_longest(st, v.timing, site);
    event_slots(&v, st, t1);
    v.ints[SLOT_SEQ2] = st->seq + 2;
    v.tf_zero = !is_lin && flops == 0;
    v.dbl[SLOT_TF] = timed ? per_us((double)flops, v.d_us) : 0.0;
    v.dbl[SLOT_TB] = timed ? per_us((double)nbytes, v.d_us) : 0.0;
    Py_ssize_t nprog = is_lin ? PyTuple_Size(progs) : 1;
    for (Py_ssize_t k = 0; k < nprog; k++)
        if (emit_program(b, is_lin ? PyTuple_GetItem(progs, k) : progs, &v, lines) < 0)
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
        st->total_us += v.d_us;
    return 1;
}

/* A HANDOFF record; the memory-use fraction when unread is the pass's reading in the state
 * (once the Python path has taken it). */
static int
render_handoff(State *st, PyObject *state, PyObject *r, PyObject *lines, Buf *b)
{
    PyObject *frac = PyTuple_GetItem(r, HANDOFF_MEMORY_FRACTION);
    Values v;
    memset(&v, 0, sizeof v);
    int rt = read_timing(PyTuple_GetItem(r, HANDOFF_TIMING), &v);
    if (rt <= 0)
        return rt;
    long long t1 = PyLong_AsLongLong(PyTuple_GetItem(r, HANDOFF_START));
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
    int timed = v.d_us > 0, variant = timed + 2 * (frac != Py_None);
    PyObject *entry =
        lookup_entry(st, key_handoff_of(r, variant, v.cuda), ENTRY_HANDOFF_LEN, "HANDOFF", ENTRY_HANDOFF_NAMES);
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
    event_slots(&v, st, t1);
    v.dbl[SLOT_BW] = timed ? per_us((double)nbytes, v.d_us) : 0.0;
    v.dbl[SLOT_MF] = frac != Py_None ? PyFloat_AsDouble(frac) : 0.0;
    if (emit_program(b, prog, &v, lines) < 0) {
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

PyObject *
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
        } else if (tag == REC_ATTENTION && size == ATTENTION_LEN) {
            rc = render_attention_general(&st, r, lines, &b);
        } else if (tag == REC_KV && size == KV_LEN) {
            rc = render_kv(&st, r, lines, &b);
        } else if (tag >= REC_LINEAR && tag <= REC_KV) {
            PyErr_Format(PyExc_TypeError,
                         "render: a record of kind %ld has %zd items, not what records.FIELDS "
                         "declares (the wrappers and records.py differ)",
                         tag, size);
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

const char render_doc[] = "render(state, records, start, lines, deadline_ns) -> int\n"
                          "--\n\n"
                          "The writer's fast paths (lines.py: Lines.linear, module, alloc_out, alloc,\n"
                          "handoff; attention_lines.py: attention_kv, attention_raw, kv_raw) for records[start:]:\n"
                          "each LINEAR, MODULE, ALLOC_OUT, ALLOC, ATTENTION_KV, HANDOFF, ATTENTION or KV record whose\n"
                          "template is made becomes its JSON lines (a timed record's duration in int ns on the host\n"
                          "clock, or a CUDA event pair whose end event has completed: it stops at one that has\n"
                          "not), appended to lines, with the writer state (records.STATE) advanced as those methods\n"
                          "advance it. Stops at the first other record, or once the monotonic clock passes\n"
                          "deadline_ns, and returns the index of the first record not written.";
