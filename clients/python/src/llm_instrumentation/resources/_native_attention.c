/*
 * The writer's rendering of the attention wrappers' records (attention_lines.py): an
 * ATTENTION_KV record with its allocation and KV cache events, the general wrapper's
 * ATTENTION and KV records, and the allocations (_native_render.c's render calls these).
 */
#include "_native.h"

/* An allocation's program and values, not yet written: an ALLOC_OUT or ALLOC record.
 * 1 ready, 0 for the Python path (no memory reading yet: it reads one), -1 an error. */
int
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
    PyObject *entry =
        lookup_entry(st, key_alloc(r, mem), ENTRY_ALLOC_LEN, out ? "ALLOC_OUT" : "ALLOC", ENTRY_ALLOC_NAMES);
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

int
emit_alloc(State *st, PyObject *prog, Values *v, PyObject *lines, Buf *b)
{
    v->ints[SLOT_SEQ] = st->seq + 1;
    if (emit_program(b, prog, v, lines) < 0)
        return -1;
    st->seq += 1;
    st->counts[COUNT_MEMORY_ALLOCATION] += 1;
    return 1;
}

/* An ATTENTION_KV record: the attention event, the allocation's and the KV cache's, as
 * AttentionLines.attention_kv writes them. */
int
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
    PyObject *entry =
        lookup_entry(st, key_attention(r, f.variant), ENTRY_ATTENTION_KV_LEN, "ATTENTION_KV", ENTRY_ATTENTION_KV_NAMES);
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
    note_longest(st, t, site);
    event_slots(&v, st, t1);
    v.ints[SLOT_QT] = f.q_len;
    v.ints[SLOT_KT] = f.kv_len;
    v.ints[SLOT_FL] = f.flops;
    v.dbl[SLOT_GF] = (double)f.flops / 1e9;
    v.timing = t;
    v.dbl[SLOT_TF] = t > 0 ? per_ns((double)f.flops, t) : 0.0;
    if (emit_program(b, pa, &v, lines) < 0) {
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
    if (emit_program(b, pk, &v, lines) < 0) {
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

/* An ATTENTION record of the general wrapper (AttentionLines.attention_raw): a GPU's, or a
 * cache layout the CPU wrapper does not read. */
int
render_attention_general(State *st, PyObject *r, PyObject *lines, Buf *b)
{
    PyObject *site = PyTuple_GetItem(r, ATTENTION_SITE), *kv = PyTuple_GetItem(r, ATTENTION_KV);
    PyObject *fl = PyTuple_GetItem(r, ATTENTION_FLOPS);
    Values v;
    memset(&v, 0, sizeof v);
    if (kv != Py_None && !cache_dims(kv, &v))
        return 0;
    int has_flops = fl != Py_None;
    long long flops = 0;
    if (has_flops) {
        if (!PyLong_CheckExact(fl))
            return 0;
        flops = PyLong_AsLongLong(fl);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (flops < 0 || st->total_flops > LLONG_MAX - flops || st->pass_flops > LLONG_MAX - flops)
            return 0; /* beyond 64 bits: Python's ints take over */
    }
    long long t1 = PyLong_AsLongLong(PyTuple_GetItem(r, ATTENTION_END));
    long long qt = PyLong_AsLongLong(PyTuple_GetItem(r, ATTENTION_QUERY_TOKENS));
    long long kt = PyLong_AsLongLong(PyTuple_GetItem(r, ATTENTION_KEY_TOKENS));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    int rt = read_timing(PyTuple_GetItem(r, ATTENTION_TIMING), &v);
    if (rt <= 0)
        return rt;
    int variant = !has_flops ? 0 : (flops && v.d_us > 0) ? 2 : 1;
    PyObject *entry =
        lookup_entry(st, key_attention_of(r, variant, v.cuda), ENTRY_ATTENTION_LEN, "ATTENTION", ENTRY_ATTENTION_NAMES);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *prog = PyTuple_GetItem(entry, ENTRY_ATTENTION_PROGRAM);
    if (prog == Py_None)
        return 0;
    if (!v.cuda)
        note_longest(st, v.timing, site);
    event_slots(&v, st, t1);
    v.ints[SLOT_QT] = qt;
    v.ints[SLOT_KT] = kt;
    v.ints[SLOT_FL] = flops;
    v.dbl[SLOT_GF] = (double)flops / 1e9;
    v.dbl[SLOT_TF] = variant == 2 ? per_us((double)flops, v.d_us) : 0.0;
    if (emit_program(b, prog, &v, lines) < 0)
        return -1;
    st->seq += 1;
    st->counts[COUNT_COMPUTE_EXECUTION] += 1;
    st->pass_flops += flops;
    st->total_flops += flops;
    return 1;
}

/* A KV record of the general attention wrapper (AttentionLines.kv_raw). */
int
render_kv(State *st, PyObject *r, PyObject *lines, Buf *b)
{
    PyObject *idx = PyTuple_GetItem(r, KV_LAYER_INDEX);
    Values v;
    memset(&v, 0, sizeof v);
    if (!cache_dims(PyTuple_GetItem(r, KV_KV), &v))
        return 0;
    long long t1 = PyLong_AsLongLong(PyTuple_GetItem(r, KV_END));
    long long before = PyLong_AsLongLong(PyTuple_GetItem(r, KV_LENGTH_BEFORE));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    PyObject *entry = lookup_entry(st, key_kv_of(r, v.ks_n >= 2), ENTRY_KV_LEN, "KV", ENTRY_KV_NAMES);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *prog = PyTuple_GetItem(entry, ENTRY_KV_PROGRAM);
    if (prog == Py_None)
        return 0;
    long long isz_k = PyLong_AsLongLong(PyTuple_GetItem(entry, ENTRY_KV_KEY_ITEMSIZE));
    long long isz_v = PyLong_AsLongLong(PyTuple_GetItem(entry, ENTRY_KV_VALUE_ITEMSIZE));
    long long nk = numel(v.ks, v.ks_n), nv = numel(v.vs, v.vs_n);
    if (PyErr_Occurred() || nk < 0 || nv < 0 || isz_k < 0 || isz_v < 0 || (isz_k && nk > (LLONG_MAX / 2) / isz_k) ||
        (isz_v && nv > (LLONG_MAX / 2) / isz_v)) {
        PyErr_Clear();
        return 0;
    }
    long long nbytes = nk * isz_k + nv * isz_v, prev_bytes = 0;
    long long length = v.ks_n >= 2 ? v.ks[v.ks_n - 2] : 0;
    /* the cache's bytes, and their growth since this layer's last update (EventBuilder.kv_step) */
    PyObject *prev = PyDict_GetItemWithError(st->kv_bytes, idx); /* borrowed */
    if (prev == NULL && PyErr_Occurred())
        return -1;
    if (prev != NULL) {
        prev_bytes = PyLong_AsLongLong(prev);
        if (prev_bytes == -1 && PyErr_Occurred())
            return -1;
    }
    PyObject *nb = PyLong_FromLongLong(nbytes);
    if (nb == NULL || PyDict_SetItem(st->kv_bytes, idx, nb) < 0) {
        Py_XDECREF(nb);
        return -1;
    }
    Py_DECREF(nb);
    double hit, bpt;
    long long growth;
    kv_figures(length, before, nbytes, prev != NULL, prev_bytes, &hit, &bpt, &growth);
    event_slots(&v, st, t1);
    v.ints[SLOT_LEN] = length;
    v.ints[SLOT_PREV] = before;
    v.ints[SLOT_NEW] = length - before;
    v.ints[SLOT_REUSED] = before;
    v.dbl[SLOT_HIT] = hit;
    v.ints[SLOT_CB] = nbytes;
    v.dbl[SLOT_CMB] = (double)nbytes / 1048576.0;
    v.dbl[SLOT_BPT] = bpt;
    v.ints[SLOT_GROW] = growth;
    if (emit_program(b, prog, &v, lines) < 0)
        return -1;
    st->seq += 1;
    st->counts[COUNT_KV_CACHE_UPDATE] += 1;
    return 1;
}
