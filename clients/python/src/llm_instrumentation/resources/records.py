"""The records the model's thread hands the writer thread: THE schema of the resource monitor.

A record is a tuple ``(kind, field, field, ...)``: an integer tag (below), then the fields
``FIELDS[kind]`` names, in that order. The wrappers (``recorders.py``, ``wrappers.py``) make
them, the writer (``writer.py``, ``lines.py``) and the C extension (``_native.c``) read them.
What the writer keeps between records is declared here too — the keys of its templates
(``KEYS``), the items of a template entry (``ENTRIES``), the writer state's attribute names
(``STATE``), the recorder's (``RECORDER``), the event counters the C writer advances
(``COUNTS``) and the template slots it fills (``SLOTS``) — because the C side reads all of them.

``_records.h`` is generated from this module (``make generate``, which runs
``clients/python/tools/gen_records_header.py``) and committed; ``tests/test_resource_schema.py``
fails, naming the file, when it is stale. At import the extension compares the schema it was
compiled with against this module's (``native.py`` hands it :func:`schema_items`) and raises
naming the first field that differs: a drift never makes the C paths fall back silently.

This module imports nothing but the standard library (the generator loads it by path).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Dict, List, Tuple

__all__ = ["Rec", "FIELDS", "TIMING", "CUDA_TIMED", "KEYS", "ENTRIES", "STATE", "RECORDER", "COUNTS", "SLOTS",
           "MEMORY_SLOTS", "UNREAD", "pos", "schema_items", "check_record", "c_header"]


class Rec(enum.IntEnum):
    """The kinds of record, by their tag (the record's item 0)."""

    BEGIN = 1         # a forward pass starts (step, pass number, clock offset)
    LINEAR = 2        # a Linear / Conv1D timed by a wrapper
    MODULE = 3        # any other module timed by a wrapper (norm, activation, embedding, leaf)
    ALLOC_OUT = 4     # the output of a module timed by the CPU wrapper (its shape may be derived)
    ALLOC = 5         # a module's output allocation
    ATTENTION_KV = 6  # the CPU attention wrapper's one record: attention, allocation and KV cache
    HANDOFF = 7       # the attention→MLP handoff (the MLP wrapper's start)
    ATTENTION = 8     # an attention module by the general wrapper
    KV = 9            # a layer's KV cache by the general attention wrapper
    FORWARD = 10      # a forward pass of the model ends
    PARAMETERS = 11   # a module's parameters (once, at start)
    ELEMENTWISE = 12  # an element-wise torch function (VERBOSE)
    PREBUILT = 13     # an event made whole on the model's thread (session start, summary)


# LINEAR … KV are the kinds the C writer renders: one range, tested once per record.
# Plain ints for the hot paths (an IntEnum member costs a lookup and compares slower).
BEGIN, LINEAR, MODULE, ALLOC_OUT, ALLOC, ATTENTION_KV, HANDOFF = 1, 2, 3, 4, 5, 6, 7
ATTENTION, KV, FORWARD, PARAMETERS, ELEMENTWISE, PREBUILT = 8, 9, 10, 11, 12, 13

_TIMED = ("site", "end", "timing", "in_shape", "in_dtype", "out_shape", "out_dtype")

#: Each kind's fields, after the tag. ``end``/``start`` are ``perf_counter_ns`` readings,
#: ``wall_ns`` Unix time in ns; ``timing`` is ns (an int) or a CUDA event pair (start, end:
#: the writer waits for the end event and reads the µs between them), always item ``TIMING``
#: of a record; ``memory`` is
#: a one-item list shared by a forward pass's records (its memory reading, None until read),
#: or the reading itself for PARAMETERS.
FIELDS: Dict[int, Tuple[str, ...]] = {
    BEGIN: ("step", "forward", "clock_offset"),
    LINEAR: _TIMED,
    MODULE: _TIMED,
    ALLOC_OUT: ("site", "end", "nbytes", "in_shape", "out_shape", "out_dtype", "address", "memory"),
    ALLOC: ("site", "end", "kind", "nbytes", "shape", "dtype", "is_cuda", "address", "memory"),
    ATTENTION_KV: ("site", "end", "timing", "in_shape", "in_dtype", "out_shape", "out_dtype", "key_shape_before",
                   "key_shape", "key_dtype", "value_shape", "value_dtype", "allocation"),
    HANDOFF: ("site", "start", "timing", "shape", "dtype", "is_cuda", "memory_fraction", "fraction_source"),
    ATTENTION: ("site", "end", "timing", "in_shape", "in_dtype", "in_cuda", "out_shape", "out_dtype", "out_cuda",
                "query_tokens", "key_tokens", "kv", "flops"),
    KV: ("site", "end", "layer_index", "kv", "length_before"),
    FORWARD: ("site", "wall_ns", "timing", "input", "out_shape", "capture_bytes", "memory", "sm_utilization"),
    PARAMETERS: ("site", "wall_ns", "kind", "nbytes", "shape", "dtype", "is_cuda", "address", "memory"),
    ELEMENTWISE: ("site", "wall_ns", "op", "tensor", "duration_ns"),
    PREBUILT: ("event",),
}

#: The index of ``timing`` in every record that has one.
TIMING = 3
assert all(f.index("timing") + 1 == TIMING for f in FIELDS.values() if "timing" in f)
#: The kinds whose timing may be a CUDA event pair: the general wrappers' (ATTENTION_KV's
#: wrapper runs on the CPU only). No other kind's item ``TIMING`` is a tuple.
CUDA_TIMED = frozenset((LINEAR, MODULE, HANDOFF, ATTENTION, FORWARD))

#: The keys of the writer's templates of the records the C writer renders: a record field,
#: ``timed`` (timing > 0), ``cuda_timed`` (the duration is a CUDA event pair's: the line says
#: ``cuda_event``), ``variant`` (which optional slots the line has), ``memory_fields``
#: (how many items the memory reading has), ``memory_keys`` (their names), or a literal
#: string in quotes that keeps kinds apart.
KEYS: Dict[int, Tuple[str, ...]] = {
    LINEAR: ("site", "in_shape", "in_dtype", "out_shape", "out_dtype", "timed", "cuda_timed"),
    MODULE: ("site", "in_shape", "in_dtype", "out_shape", "out_dtype", "timed", "cuda_timed"),
    ALLOC_OUT: ("'out'", "site", "nbytes", "in_shape", "out_shape", "out_dtype", "memory_fields"),
    ALLOC: ("site", "kind", "nbytes", "shape", "dtype", "is_cuda", "memory_keys"),
    ATTENTION_KV: ("site", "in_shape", "in_dtype", "out_shape", "out_dtype", "key_dtype", "value_dtype", "variant"),
    HANDOFF: ("'handoff'", "site", "shape", "dtype", "fraction_source", "variant", "cuda_timed"),
    # key_dtype, value_dtype: the cache's (None without one, or without values).
    ATTENTION: ("'attention'", "site", "in_shape", "in_dtype", "in_cuda", "out_shape", "out_dtype", "out_cuda",
                "key_dtype", "value_dtype", "variant", "cuda_timed"),
    # key_dtype, key_cuda: items of the record's kv.
    KV: ("'kv'", "site", "key_dtype", "key_cuda", "variant"),
}

#: The items of a template entry (the value under a key). ``ALLOC_OUT`` shares ``ALLOC``'s.
ENTRIES: Dict[int, Tuple[str, ...]] = {
    LINEAR: ("formats", "flops", "nbytes", "programs"),
    MODULE: ("format", "flops", "nbytes", "counts_time", "program"),
    ALLOC: ("format", "memory_fill", "program"),
    ATTENTION_KV: ("attention_format", "kv_format", "key_itemsize", "value_itemsize", "attention_program",
                   "kv_program"),
    HANDOFF: ("format", "nbytes", "program"),
    ATTENTION: ("format", "program"),
    KV: ("format", "key_itemsize", "value_itemsize", "program"),
}

#: The writer state's attributes (``writer.WriterState``) the C writer reads and advances.
STATE: Tuple[str, ...] = ("seq", "clock_offset", "step", "forward", "pass_flops", "long_ns", "long_site",
                          "total_flops", "total_compute_us", "component_flows", "memory_fraction", "templates",
                          "counts", "kv_bytes")

#: The recorder's attributes (``recorders.Recorder``) the C wrapper reads: its own time,
#: the running pass's memory cell, and the method that reads memory outside a pass.
RECORDER: Tuple[str, ...] = ("hook_ns", "forward_memory", "memory_cell")

#: The event counters (``WriterState.counts`` keys) the C writer advances.
COUNTS: Tuple[str, ...] = ("compute_execution", "mlp_operation", "memory_allocation", "kv_cache_update",
                           "component_handoff")

#: The memory reading's values a template slot takes, in slot order (``SLOTS``).
MEMORY_SLOTS: Tuple[str, ...] = ("process_rss_bytes", "device_memory_allocated_bytes",
                                 "device_memory_reserved_bytes", "device_memory_peak_bytes")

#: The changing values of a template (``%(name)s`` in its %-format, ``templates.py``), by the
#: number the C writer knows each by.
SLOTS: Tuple[str, ...] = ("ts", "seq", "seq2", "step", "fwd", "d", "tf", "tb", "addr") + MEMORY_SLOTS + (
    "ks", "vs", "qt", "kt", "fl", "gf", "len", "prev", "new", "reused", "hit", "cb", "cmb", "bpt", "grow", "bw", "mp",
    "mf")


class _Unread:
    """A value not read yet: the writer reads it (the machine's memory use of a handoff)."""

    _instance = None

    def __new__(cls) -> "_Unread":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNREAD"

    def __reduce__(self) -> str:
        return "UNREAD"


#: The one "not read yet" marker (the C writer knows it by identity: ``native.py`` hands it over).
UNREAD = _Unread()


def pos(kind: int, field: str) -> int:
    """The index of ``field`` in a record of ``kind`` (the tag is item 0)."""
    return 1 + FIELDS[kind].index(field)


def schema_items() -> List[Tuple[str, str, int, str]]:
    """The schema as ``(section, owner, index, name)`` rows, the form the C extension
    compiles in (``_records.h``) and compares at import."""
    rows: List[Tuple[str, str, int, str]] = []
    for kind in Rec:
        rows += [("record", kind.name, i + 1, f) for i, f in enumerate(FIELDS[kind])]
    for table, section in ((KEYS, "key"), (ENTRIES, "entry")):
        for k, names in table.items():
            rows += [(section, Rec(k).name, i, f) for i, f in enumerate(names)]
    for section, names in (("state", STATE), ("recorder", RECORDER), ("count", COUNTS), ("slot", SLOTS),
                           ("memory", MEMORY_SLOTS)):
        rows += [(section, "", i, f) for i, f in enumerate(names)]
    return rows


# ----- validation (the tests run every record of real models through it) ----------------------

def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_shape(v: Any) -> bool:
    return v is None or isinstance(v, tuple)


def _is_dtype(v: Any) -> bool:
    return v is None or type(v).__name__ == "dtype"


def _is_timing(v: Any) -> bool:
    return type(v) is int or (type(v) is tuple and len(v) == 2)


def _is_cell(v: Any) -> bool:
    return type(v) is list and len(v) == 1


_CHECKS: Dict[str, Callable[[Any], bool]] = {
    "site": lambda v: hasattr(v, "kind") and hasattr(v, "layer_id"),
    "end": _is_int, "start": _is_int, "wall_ns": _is_int, "nbytes": _is_int, "duration_ns": _is_int,
    "step": _is_int, "forward": _is_int, "clock_offset": _is_int, "address": _is_int, "layer_index": _is_int,
    "query_tokens": _is_int, "key_tokens": _is_int, "length_before": _is_int,
    "timing": _is_timing,
    "in_shape": _is_shape, "out_shape": _is_shape, "shape": _is_shape, "key_shape": _is_shape,
    "value_shape": _is_shape, "key_shape_before": _is_shape,
    "in_dtype": _is_dtype, "out_dtype": _is_dtype, "dtype": _is_dtype, "key_dtype": _is_dtype,
    "value_dtype": _is_dtype,
    "is_cuda": lambda v: type(v) is bool, "in_cuda": lambda v: type(v) is bool, "out_cuda": lambda v: type(v) is bool,
    "kind": lambda v: type(v) is str, "op": lambda v: type(v) is str, "fraction_source": lambda v: type(v) is str,
    "memory_fraction": lambda v: v is None or v is UNREAD or type(v) is float,
    "flops": lambda v: v is None or type(v) is int,
    "capture_bytes": lambda v: v is None or type(v) is int,
    "sm_utilization": lambda v: v is None or type(v) is float,
    "event": lambda v: type(v) is dict,
    "kv": lambda v: v is None or (type(v) is tuple and len(v) == 6),
    "input": lambda v: v is None or (type(v) is tuple and len(v) == 2),
    "tensor": lambda v: type(v) is tuple and len(v) == 4,
    "allocation": lambda v: v is None or (type(v) is tuple and len(v) > 0 and v[0] == ALLOC),
}


def check_record(rec: Tuple[Any, ...]) -> None:
    """Raise ``TypeError`` naming the kind and field where ``rec`` is not what ``FIELDS``
    declares (its length, or a field of the wrong type)."""
    try:
        kind = Rec(rec[0])
    except (ValueError, IndexError, TypeError):
        raise TypeError(f"resource record {rec!r:.200}: item 0 is not a record kind") from None
    names = FIELDS[kind]
    if len(rec) != 1 + len(names):
        raise TypeError(f"{kind.name} record has {len(rec) - 1} fields, records.py declares {len(names)}: {names}")
    for i, name in enumerate(names):
        v = rec[1 + i]
        if name == "memory":
            ok = type(v) is dict if kind == PARAMETERS else _is_cell(v)
        else:
            ok = _CHECKS[name](v)
        if not ok:
            raise TypeError(f"{kind.name} record field {1 + i} ({name}) is {type(v).__name__} {v!r:.80}, "
                            "not what records.py declares")
        if name == "allocation" and v is not None:
            check_record(v)


# ----- the C header -----------------------------------------------------------------------------

def _c_name(name: str) -> str:
    return name.strip("'").upper()


def c_header() -> str:
    """The text of ``_records.h``: this schema as C constants."""
    out = ["/* Generated from records.py by clients/python/tools/gen_records_header.py (make generate).",
           " * Do not edit: change records.py and regenerate; tests/test_resource_schema.py fails while",
           " * this file is stale, and _native.c compares it with records.py at import. */",
           "#ifndef STRAP_RESOURCE_RECORDS_H", "#define STRAP_RESOURCE_RECORDS_H", "",
           "/* Generated, one row of the schema a line: not for clang-format. */", "/* clang-format off */", ""]
    out.append("/* Record kinds: item 0 of a record. */")
    for kind in Rec:
        out.append(f"#define REC_{kind.name} {int(kind)}")
    out.append("")
    out.append("/* Record fields: their index in the record tuple, and its length. */")
    for kind in Rec:
        for i, f in enumerate(FIELDS[kind]):
            out.append(f"#define {kind.name}_{_c_name(f)} {i + 1}")
        out.append(f"#define {kind.name}_LEN {len(FIELDS[kind]) + 1}")
    out.append("")
    out.append("/* Template keys: the index of each item, and the key's length. */")
    for k, names in KEYS.items():
        kn = Rec(k).name
        for i, f in enumerate(names):
            out.append(f"#define KEY_{kn}_{_c_name(f)} {i}")
        out.append(f"#define KEY_{kn}_LEN {len(names)}")
    out.append("")
    out.append("/* Template entries: the index of each item, and the entry's length. */")
    for k, names in ENTRIES.items():
        kn = Rec(k).name
        for i, f in enumerate(names):
            out.append(f"#define ENTRY_{kn}_{_c_name(f)} {i}")
        out.append(f"#define ENTRY_{kn}_LEN {len(names)}")
        out.append(f'#define ENTRY_{kn}_NAMES "{", ".join(names)}"')
    out.append("")
    for section, names in (("STATE", STATE), ("RECORDER", RECORDER), ("COUNT", COUNTS), ("SLOT", SLOTS)):
        out.append(f"enum {{ {', '.join(f'{section}_{_c_name(n)}' for n in names)}, N_{section} }};")
        out.append(f"static const char *const {section.lower()}_names[N_{section}] = {{")
        out.append("    " + ", ".join(f'"{n}"' for n in names) + ",")
        out.append("};")
    out.append(f"#define N_MEMORY {len(MEMORY_SLOTS)} /* SLOT_{_c_name(MEMORY_SLOTS[0])} and the ones after it */")
    out.append("")
    out.append("/* The whole schema, row by row, as schema_items() gives it: compared at import. */")
    out.append("typedef struct { const char *section, *owner; int index; const char *name; } SchemaItem;")
    out.append("static const SchemaItem schema_items[] = {")
    for section, owner, index, name in schema_items():
        out.append(f'    {{"{section}", "{owner}", {index}, "{name}"}},')
    out.append("};")
    out.append("#define N_SCHEMA_ITEMS ((int)(sizeof schema_items / sizeof schema_items[0]))")
    out.append("")
    out.append("/* clang-format on */")
    out.append("#endif")
    return "\n".join(out) + "\n"
