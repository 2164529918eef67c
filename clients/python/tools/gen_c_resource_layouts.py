#!/usr/bin/env python3
"""Write the C client's resource-event layouts from the Python builders (``make generate-records``).

libstrap's seed-003 API (clients/c/include/llama-resource-instrumentation.h) writes the events of
docs/RESOURCE_EVENTS.md. It does not describe them a second time: the Python builders
(``resources/events.py``, ``EventBuilder``) are run here on sample records, and what they make —
each event's keys in order, and the values that are the same whatever the inputs
(``flops_source``, ``size_source``, ...) — becomes ``clients/c/src/resource_layouts.h``. The C
side fills the keys in that order with its own values and formats them with
``clients/c/common/_render_core.h`` (the Python writer's C filling: Python's repr of a double, µs from
integer ns). A key the builders add, drop or move makes the header stale (``--check`` exits 1
naming it; ``tests/test_c_resource_layouts.py``); a key with no C value fails the C build
(``-Wswitch``: the field enum is generated, the switch over it is not).

The same run writes the golden events (``testdata/resource_events/cases/c_api.jsonl``: the builders'
events of ``CASES``, serialized as the writer serializes them) and ``clients/c/tests/
resource_cases.h`` (the same ``CASES`` as C initialisers): ``test_resource_api.c`` renders each
case and must produce the golden line byte for byte.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE / "src"))

from llm_instrumentation.resources.events import MIB, EventBuilder, tdesc  # noqa: E402
from llm_instrumentation.resources.sites import FLOPS_PER_ELEMENT  # noqa: E402
from llm_instrumentation.resources.state import WriterState  # noqa: E402
from llm_instrumentation.resources.templates import ENCODER  # noqa: E402

HEADER = REPO / "clients/c/src/resource_layouts.h"
CASES_HEADER = REPO / "clients/c/tests/resource_cases.h"
GOLDEN = REPO / "testdata/resource_events/cases/c_api.jsonl"

#: Keys whose value the builders set to a constant: the header carries it as JSON.
CONSTANT_KEYS = ("event", "flops_source", "size_source", "activation_memory_peak_source", "bandwidth_source",
                 "memory_source", "flops_covers")

#: Bytes per element of the dtypes the cases use (the builders take byte counts, not dtypes).
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32"}


def site(name: str, kind: str, layer: Optional[int], component: str, mlp_op: Optional[str] = None,
         activation: Optional[str] = None, fpe: Optional[int] = None) -> Any:
    """What a builder reads of a Site, without a torch module behind it."""
    return types.SimpleNamespace(name=name, kind=kind, layer_id=layer, component=component,
                                 leaf=name.rsplit(".", 1)[-1] if name else "model", mlp_op=mlp_op,
                                 activation=activation, flops_per_element=fpe)


def numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def meta(shape: Tuple[int, ...], dtype: str) -> Tuple[Tuple[int, ...], str, int, bool]:
    return (shape, dtype, numel(shape) * _ITEM[dtype], False)


# ----- the cases: one builder call each, the C test makes the same event ------------------------
# layout, then the call's inputs. Timestamps in µs, durations in ns, seq = the event's number.

CASES: List[Dict[str, Any]] = [
    dict(layout="MUL_MAT", name="model.layers.3.self_attn.q_proj", layer=3, component="attention", ts=1764200000123456,
         seq=7, step=2, forward=5, x=((1, 5, 64), "float32"), w=((64, 64), "float16"), out=((1, 5, 64), "float32"),
         duration_ns=12345),
    dict(layout="MUL_MAT", name="lm_head", layer=None, component="lm_head", ts=1764200000999999, seq=100, step=0,
         forward=0, x=((1, 1, 64), "float32"), w=((32000, 64), "float32"), out=((1, 1, 32000), "float32"),
         duration_ns=1000001),
    dict(layout="MUL_MAT", name="model.layers.0.mlp.up_proj", layer=0, component="mlp", ts=1, seq=1, step=0,
         forward=0, x=((1, 1, 64), "float32"), w=((172, 64), "float32"), out=((1, 1, 172), "float32"), duration_ns=0),
    dict(layout="MLP", name="model.layers.1.mlp.gate_proj", layer=1, component="mlp", mlp_op="gate_proj",
         activation="silu", ts=1764200000200000, seq=12, step=4, forward=4, x=((1, 3, 64), "float32"),
         w=((172, 64), "float32"), out=((1, 3, 172), "float32"), duration_ns=777),
    dict(layout="MLP", name="model.layers.1.mlp.down_proj", layer=1, component="mlp", mlp_op="down_proj",
         activation=None, ts=1764200000200100, seq=14, step=4, forward=4, x=((1, 3, 172), "float32"),
         w=((64, 172), "float16"), out=((1, 3, 64), "float32"), duration_ns=123456789),
    dict(layout="OP_COUNTED", name="model.layers.2.input_layernorm", kind="norm", op="rms_norm", fpe=4, layer=2,
         component="norm", ts=1764200000300000, seq=20, step=1, forward=1, x=((1, 7, 64), "float32"),
         out=((1, 7, 64), "float32"), duration_ns=3001),
    dict(layout="OP_ACTIVATION", name="model.layers.2.mlp.act_fn", kind="activation", op="silu",
         activation="silu", fpe=4, layer=2, component="mlp", ts=1764200000300500, seq=21, step=1, forward=1,
         x=((1, 7, 172), "float32"), out=((1, 7, 172), "float32"), duration_ns=999),
    dict(layout="OP_UNCOUNTED", name="model.layers.2.self_attn.softmax", kind="leaf", op="soft_max", layer=2,
         component="attention", ts=1764200000300900, seq=22, step=1, forward=1, x=((1, 4, 7, 7), "float32"),
         out=((1, 4, 7, 7), "float32"), duration_ns=50),
    dict(layout="ALLOC", name="model.layers.5.self_attn.o_proj", layer=5, component="attention",
         ts=1764200000400000, seq=30, step=3, forward=3, kind="module_output", shape=(1, 9, 64), dtype="float32",
         address=0x7F8B40001000, rss=123456789),
    dict(layout="ALLOC", name="model.embed_tokens", layer=None, component="embedding", ts=1764200000400001, seq=31,
         step=0, forward=0, kind="parameters", shape=(32000, 64), dtype="bfloat16", address=0x10, rss=None),
    dict(layout="HANDOFF", name="model.layers.6.mlp", layer=6, component="mlp", ts=1764200000500000, seq=40, step=2,
         forward=2, shape=(1, 1, 64), dtype="float32", duration_ns=4321, fraction=0.4375),
    dict(layout="HANDOFF", name="model.layers.7.mlp", layer=7, component="mlp", ts=1764200000500001, seq=41, step=2,
         forward=2, shape=(1, 2, 64), dtype="float16", duration_ns=0, fraction=None),
    dict(layout="HANDOFF", name="model.layers.0.mlp", layer=0, component="mlp", ts=5, seq=2, step=0, forward=0,
         shape=(2, 64), dtype="float32", duration_ns=1, fraction=0.91),
    dict(layout="FORWARD", name="", layer=None, component="model", ts=1764200000600000, seq=50, step=9, forward=9,
         flops=123456789012, out=None, rss=987654321, duration_ns=2500000),
    dict(layout="FORWARD", name="", layer=None, component="model", ts=1764200000600001, seq=51, step=10, forward=10,
         flops=0, out=None, rss=None, duration_ns=0),
]


def build(case: Dict[str, Any]) -> Dict[str, Any]:
    """The builder's event of one case."""
    st = WriterState("resource_sess_20261127_024500_000001_4242")
    st.seq = case["seq"] - 1 - (1 if case["layout"] == "MLP" else 0)
    b = EventBuilder(st)
    lay = case["layout"]
    kind = case.get("kind", "linear") if lay.startswith("OP_") else "linear"
    s = site(case["name"], kind, case["layer"], case["component"], case.get("mlp_op"), case.get("activation"),
             case.get("fpe"))
    ctx = (s, case["ts"], case["step"], case["forward"])
    if lay in ("MUL_MAT", "MLP"):
        xm, om = meta(*case["x"]), meta(*case["out"])
        wshape, wdtype = case["w"]
        out_f, in_f = wshape
        flops = 2 * (numel(om[0]) // out_f) * in_f * out_f
        static = (wshape, wdtype, numel(wshape) * _ITEM[wdtype], in_f, out_f)
        evs = b.linear(ctx, case["duration_ns"], xm, om, flops, static)
        return evs[1] if lay == "MLP" else evs[0]
    if lay.startswith("OP_"):
        return b.module(ctx, case["duration_ns"], meta(*case["x"]), meta(*case["out"]), case["op"])[0]
    if lay == "ALLOC":
        mem = {"process_rss_bytes": case["rss"], "memory_source": "proc_self_statm"} if case["rss"] else {}
        return b.alloc(ctx, case["kind"], numel(case["shape"]) * _ITEM[case["dtype"]], case["shape"], case["dtype"],
                       False, case["address"], mem)[0]
    if lay == "HANDOFF":
        tm = meta(case["shape"], case["dtype"])
        src = "proc_meminfo_used_over_total"
        return b.handoff(ctx, case["duration_ns"], tm, case["fraction"], src)[0]
    if lay == "FORWARD":
        st.pass_flops = case["flops"]
        mem = {"process_rss_bytes": case["rss"], "memory_source": "proc_self_statm"} if case["rss"] else {}
        return b.forward(ctx, case["duration_ns"], None, case["out"], None, mem, None)[0]
    raise ValueError(lay)


#: One sample per layout, every optional key present (a duration, a memory reading, a fraction).
def samples() -> Dict[str, Dict[str, Any]]:
    pick = {"MUL_MAT": 0, "MLP": 3, "OP_COUNTED": 5, "OP_ACTIVATION": 6, "OP_UNCOUNTED": 7, "ALLOC": 8,
            "HANDOFF": 10, "FORWARD": 13}
    out = {k: build(CASES[i]) for k, i in pick.items()}
    out["TENSOR"] = tdesc("input", meta((1,), "float32"))
    return out


def c_ident(key: str) -> str:
    return "LRI_F_" + key.upper()


def header() -> str:
    lays = samples()
    keys: List[str] = []
    for ev in lays.values():
        for k in ev:
            if k not in keys:
                keys.append(k)
    out = ["/* Generated from the Python builders (resources/events.py) by",
           " * clients/python/tools/gen_c_resource_layouts.py (make generate-records). Do not edit:",
           " * tests/test_c_resource_layouts.py fails while it is stale. Each layout is the builders'",
           " * keys in their order; a constant is the JSON value the builders always give that key. */",
           "#ifndef STRAP_RESOURCE_LAYOUTS_H", "#define STRAP_RESOURCE_LAYOUTS_H", "", "/* clang-format off */", "",
           "/* Every key of every layout. */",
           "enum lri_field {"]
    out += [f"\t{c_ident(k)}," for k in keys]
    out += ["\tLRI_N_FIELDS", "};", "", "/* The key as JSON with its colon, by field. */",
            "static const char *const lri_field_key[LRI_N_FIELDS] = {"]
    out += [f"\t{ENCODER.encode(ENCODER.encode(k) + ':')}," for k in keys]
    out += ["};", "", "/* The events the C client writes. */", "enum lri_layout {"]
    out += [f"\tLRI_L_{name}," for name in lays]
    out += ["\tLRI_N_LAYOUTS", "};", "", "struct lri_slot {", "\tenum lri_field field;",
            "\tconst char *constant; /* JSON, or NULL: the C side's value */", "};", ""]
    for name, ev in lays.items():
        out.append(f"static const struct lri_slot lri_layout_{name.lower()}[] = {{")
        for k, v in ev.items():
            const = ENCODER.encode(ENCODER.encode(v)) if k in CONSTANT_KEYS else "NULL"
            out.append(f"\t{{{c_ident(k)}, {const}}},")
        out.append("};")
    out += ["", "static const struct {", "\tconst struct lri_slot *slots;", "\tint n;", "} lri_layouts[LRI_N_LAYOUTS] = {"]
    out += [f"\t{{lri_layout_{n.lower()}, (int)(sizeof lri_layout_{n.lower()} / sizeof lri_layout_{n.lower()}[0])}},"
            for n in lays]
    out += ["};", "", f"#define LRI_MIB {MIB}",
            f"#define LRI_FPE_RMS_NORM {FLOPS_PER_ELEMENT['rms_norm']}",
            f"#define LRI_FPE_LAYER_NORM {FLOPS_PER_ELEMENT['layer_norm']}",
            f"#define LRI_FPE_SILU {FLOPS_PER_ELEMENT['silu']}",
            f"#define LRI_FPE_GELU {FLOPS_PER_ELEMENT['gelu']}",
            f"#define LRI_FPE_RELU {FLOPS_PER_ELEMENT['relu']}",
            f"#define LRI_FPE_ELEMENTWISE {FLOPS_PER_ELEMENT['elementwise']}", "",
            "/* clang-format on */", "#endif", ""]
    return "\n".join(out)


def c_str(s: Optional[str]) -> str:
    return "NULL" if s is None else ENCODER.encode(s)


def c_shape(shape: Optional[Tuple[int, ...]]) -> str:
    if shape is None:
        return "{0}, -1"
    return "{" + ", ".join(str(d) for d in shape) + "}, " + str(len(shape))


def cases_header() -> str:
    """CASES as C: struct lri_case initialisers (test_resource_api.c defines the struct)."""
    out = ["/* Generated by clients/python/tools/gen_c_resource_layouts.py with",
           " * testdata/resource_events/cases/c_api.jsonl: the inputs of each golden event. Do not edit. */",
           "/* clang-format off */", "static const struct lri_case lri_cases[] = {"]
    for c in CASES:
        x = c.get("x")
        w = c.get("w")
        o = c.get("out")
        tshape = c.get("shape")
        fr = c.get("fraction")
        fields = [
            f".layout = LRI_L_{c['layout']}", f".module = {c_str(c['name'])}",
            f".layer = {-1 if c['layer'] is None else c['layer']}", f".component = {c_str(c['component'])}",
            f".ts = {c['ts']}LL", f".seq = {c['seq']}", f".step = {c['step']}", f".forward = {c['forward']}",
            f".op = {c_str(c.get('op'))}", f".mlp_op = {c_str(c.get('mlp_op'))}",
            f".activation = {c_str(c.get('activation'))}", f".fpe = {c.get('fpe') or 0}",
            f".x = {{{c_shape(x[0] if x else None)}, {c_str(x[1] if x else None)}}}",
            f".w = {{{c_shape(w[0] if w else None)}, {c_str(w[1] if w else None)}}}",
            f".out = {{{c_shape(o[0] if o else None)}, {c_str(o[1] if o else None)}}}",
            f".t = {{{c_shape(tshape)}, {c_str(c.get('dtype'))}}}",
            f".kind = {c_str(c.get('kind'))}", f".address = {c.get('address', 0)}ULL",
            f".rss = {c['rss'] if c.get('rss') else -1}LL", f".duration_ns = {c.get('duration_ns', 0)}LL",
            f".fraction = {repr(fr) if fr is not None else '-1.0'}", f".flops = {c.get('flops', 0)}LL",
        ]
        out.append("\t{" + ", ".join(fields) + "},")
    out += ["};", "/* clang-format on */", ""]
    return "\n".join(out)


def golden() -> str:
    return "".join(ENCODER.encode(build(c)) + "\n" for c in CASES)


def outputs() -> List[Tuple[Path, str]]:
    return [(HEADER, header()), (CASES_HEADER, cases_header()), (GOLDEN, golden())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 naming each stale file; write nothing")
    args = ap.parse_args()
    stale = 0
    for path, text in outputs():
        rel = path.relative_to(REPO)
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{rel} is stale: the Python builders changed; run make generate-records", file=sys.stderr)
                stale = 1
        else:
            path.write_text(text)
            print(f"wrote {rel}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
