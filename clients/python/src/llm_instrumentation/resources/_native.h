/*
 * What the resource extension's C files share (_native.c: the module, register and the
 * timing wrapper; _native_keys.c: template keys and an attention record's figures;
 * _native_render.c: the writer's rendering of records; _native_attention.c: the attention
 * wrappers' records). Private to the extension.
 */
#ifndef STRAP_NATIVE_H
#define STRAP_NATIVE_H

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* A double as Python's repr writes it (PyOS_double_to_string): the hook _render_core.h asks for. */
HIDDEN int native_repr_double(char *out, size_t cap, double v);
#define RENDER_DOUBLE native_repr_double
#include "_render_core.h"

/* Sets item i of a new tuple t to v (a new reference to v taken). */
#define PUT(t, i, v) (Py_INCREF(v), PyTuple_SetItem((t), (i), (v)))

/* Interned names and constants (_native.c makes them when the module loads). */
extern HIDDEN PyObject *str_shape, *str_dtype, *str_nbytes, *str_data_ptr, *str_attn_static, *key_out, *key_handoff;
extern HIDDEN PyObject *str_query, *str_elapsed_time; /* a CUDA event's methods */
extern HIDDEN PyObject *key_attention_str, *key_kv_str;
extern HIDDEN PyObject *state_attr[N_STATE], *recorder_attr[N_RECORDER], *count_keys[N_COUNT], *mem_keys[N_MEMORY];
extern HIDDEN PyObject *tag_obj[REC_PREBUILT + 1];
extern HIDDEN PyObject *unread; /* records.UNREAD, set by register() */

HIDDEN long long monotonic_ns(void);
HIDDEN long tag_of(PyObject *r);
HIDDEN int registered(void);

/* What render keeps in C while it runs and writes back to the writer state. */
typedef struct {
    long long seq, off, step, fwd, pass_flops, long_ns, total_flops, flows;
    double total_us;
    PyObject *long_site; /* owned */
    long long counts[N_COUNT];
    PyObject *tpl, *kv_bytes; /* owned: the state's dicts */
} State;

/* The slots every event of a record fills from the state: its µs timestamp (t1, ns on the
 * monotonic clock, moved to the wall clock), seq (the next one), step and forward pass. */
static inline void
event_slots(Values *v, const State *st, long long t1)
{
    v->ints[SLOT_TS] = floordiv1000(t1 + st->off);
    v->ints[SLOT_SEQ] = st->seq + 1;
    v->ints[SLOT_STEP] = st->step;
    v->ints[SLOT_FWD] = st->fwd;
}

/* The pass's longest module so far (its ns on the host clock; a CUDA-timed one does not count,
 * as in Lines.linear): site (borrowed) when t beats it. */
static inline void
note_longest(State *st, long long t, PyObject *site)
{
    if (t > st->long_ns) {
        st->long_ns = t;
        Py_INCREF(site);
        Py_DECREF(st->long_site);
        st->long_site = site;
    }
}

/* The site's (seq_first, heads, head_dim, cache layer) and the figures of an ATTENTION_KV
 * record; 0 when C cannot take it. */
typedef struct {
    long long q_len, batch, kv_len, before, heads, head_dim, flops, nk, nv;
    int has_flops, variant;
    PyObject *idx; /* owned */
} AttnFigures;

/* _native_keys.c */
HIDDEN PyObject *pack(Py_ssize_t n, PyObject **items);
HIDDEN PyObject *bool_obj(int v);
HIDDEN int shape_dims(PyObject *shape, long long *dims, int *n);
HIDDEN long long numel(const long long *dims, int n);
HIDDEN PyObject *key_timed(PyObject *r, int timed, int cuda);
HIDDEN PyObject *key_alloc(PyObject *r, PyObject *mem);
HIDDEN PyObject *key_attention(PyObject *r, int variant);
HIDDEN PyObject *key_handoff_of(PyObject *r, int variant, int cuda);
HIDDEN int read_timing(PyObject *timing, Values *v);
HIDDEN PyObject *key_attention_of(PyObject *r, int variant, int cuda);
HIDDEN PyObject *key_kv_of(PyObject *r, int variant);
HIDDEN int cache_dims(PyObject *kv, Values *v);
HIDDEN int attention_figures(State *st, PyObject *r, Values *v, AttnFigures *f);
HIDDEN PyObject *template_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern HIDDEN const char template_key_doc[];

/* _native_render.c */
HIDDEN PyObject *render(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern HIDDEN const char render_doc[];
HIDDEN int emit_program(Buf *b, PyObject *prog, const Values *v, PyObject *lines);
HIDDEN PyObject *lookup_entry(State *st, PyObject *key, Py_ssize_t want, const char *kind, const char *names);

/* _native_attention.c */
HIDDEN int prepare_alloc(State *st, PyObject *r, PyObject **prog, Values *v);
HIDDEN int emit_alloc(State *st, PyObject *prog, Values *v, PyObject *lines, Buf *b);
HIDDEN int render_attention(State *st, PyObject *r, PyObject *lines, Buf *b);
HIDDEN int render_attention_general(State *st, PyObject *r, PyObject *lines, Buf *b);
HIDDEN int render_kv(State *st, PyObject *r, PyObject *lines, Buf *b);

#endif
