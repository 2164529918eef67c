"""The C↔Python contract of the resource monitor: records.py is the schema, _records.h is
generated from it, and a drift on either side fails by name — never by the C writer quietly
sending every record to the Python paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from conftest import REPO, tiny_llama
from conftest import generate_with_monitor as decode

from llm_instrumentation.resources import ResourceMonitor, native, records
from llm_instrumentation.resources.records import Rec

HEADER = REPO / "clients/c/common/_records.h"
GENERATOR = REPO / "clients/python/tools/gen_records_header.py"

needs_c = pytest.mark.skipif(not native.available(), reason="llm_instrumentation.resources._native is not built")


def test_header_is_generated_from_records_py() -> None:
    """_records.h is what records.py makes now (make generate writes it)."""
    want = records.c_header()
    got = HEADER.read_text()
    assert got == want, (f"{HEADER.relative_to(REPO)} is stale: records.py changed without `make generate` "
                         "(clients/python/tools/gen_records_header.py); regenerate, rebuild the extension, commit")
    res = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_generator_check_names_a_stale_header(tmp_path: Path) -> None:
    """The generator's --check fails naming the header when records.py and it differ (on a
    copy of the tree: records.py with two fields of a key swapped)."""
    src = REPO / "clients/python"
    work = tmp_path / "python"
    (work / "tools").mkdir(parents=True)
    (work / "src/llm_instrumentation/resources").mkdir(parents=True)
    (work / "tools/gen_records_header.py").write_text(GENERATOR.read_text())
    rec = (src / "src/llm_instrumentation/resources/records.py").read_text()
    swapped = rec.replace('LINEAR: ("site", "in_shape", "in_dtype",', 'LINEAR: ("site", "in_dtype", "in_shape",', 1)
    assert swapped != rec
    (work / "src/llm_instrumentation/resources/records.py").write_text(swapped)
    (tmp_path / "c/common").mkdir(parents=True)
    (tmp_path / "c/common/_records.h").write_text(HEADER.read_text())
    res = subprocess.run([sys.executable, str(work / "tools/gen_records_header.py"), "--check"], capture_output=True,
                         text=True)
    assert res.returncode == 1 and "_records.h is stale" in res.stderr, res.stderr


@needs_c
def test_extension_refuses_a_schema_it_was_not_compiled_with() -> None:
    """register() compares records.py's schema with the compiled one and names the row: a
    key's two fields swapped, a field renamed, a row missing."""
    ext = native.extension
    rows = records.schema_items()
    i = rows.index(("key", "LINEAR", 1, "in_shape"))
    swapped = list(rows)
    swapped[i], swapped[i + 1] = ("key", "LINEAR", 1, "in_dtype"), ("key", "LINEAR", 2, "in_shape")
    with pytest.raises(RuntimeError, match=r"key LINEAR\[1\] is 'in_dtype' in records.py.*'in_shape'"):
        ext.register(swapped, records.UNREAD)
    renamed = [r if r != ("state", "", 0, "seq") else ("state", "", 0, "sequence") for r in rows]
    with pytest.raises(RuntimeError, match=r"state \[0\] is 'sequence' in records.py"):
        ext.register(renamed, records.UNREAD)
    with pytest.raises(RuntimeError, match="records.py has"):
        ext.register(rows[:-1], records.UNREAD)
    ext.register(rows, records.UNREAD)  # the real one still passes


def recorded(tmp_path: Path, level: str) -> Tuple[ResourceMonitor, List[Any]]:
    """The records of a prefill and decoding steps, written by the monitor's writer (so its
    templates exist), and the monitor (closed)."""
    m = tiny_llama()
    recs: List[Any] = []
    mon = ResourceMonitor(m, level, tmp_path / "r.jsonl", environ={}, flush_interval=None)
    with mon:
        thread = mon.recorder.thread
        assert thread is not None
        put = thread.put

        def spy(batch: List[Any], *rest: Any) -> None:
            recs.extend(batch)
            put(batch, *rest)

        thread.put = spy  # type: ignore[method-assign]
        decode(m, mon, 6, 3)
        mon.flush()
    return mon, recs


@pytest.mark.parametrize("level", ["MINIMAL", "DETAILED", "VERBOSE"])
def test_every_record_is_what_records_py_declares(tmp_path: Path, level: str) -> None:
    """The wrappers' records have records.FIELDS' fields, of the declared types."""
    _, recs = recorded(tmp_path, level)
    kinds = set()
    for r in recs:
        records.check_record(r)
        kinds.add(Rec(r[0]))
    assert {Rec.BEGIN, Rec.LINEAR, Rec.FORWARD, Rec.PREBUILT} <= kinds
    if level == "VERBOSE":
        assert Rec.ELEMENTWISE in kinds


def test_check_record_names_the_field() -> None:
    site = type("S", (), {"kind": "linear", "layer_id": 0})()
    good = (Rec.LINEAR, site, 10, 5, (1, 4), torch.float32, None, torch.float32)
    records.check_record(good)
    with pytest.raises(TypeError, match=r"LINEAR record field 3 \(timing\)"):
        records.check_record((Rec.LINEAR, site, 10, 5.0, (1, 4), torch.float32, None, torch.float32))
    with pytest.raises(TypeError, match="LINEAR record has 6 fields, records.py declares 7"):
        records.check_record(good[:-1])


@needs_c
def test_c_and_python_file_templates_under_the_same_keys(tmp_path: Path) -> None:
    """For every record the C writer renders, the key it looks up (template_key) is the key
    the Python writer filed the template under; a difference names the key's field."""
    mon, recs = recorded(tmp_path, "DETAILED")
    templates: Dict[Any, Any] = mon.writer.state.templates
    checked: Dict[str, int] = {}
    for r in recs:
        kind = Rec(r[0])
        if kind not in records.KEYS or type(r[records.pos(kind, "timing")] if "timing" in records.FIELDS[kind]
                                            else 0) is not int:
            continue
        if kind in (Rec.ALLOC_OUT, Rec.ALLOC):
            key = native.extension.template_key(r, r[records.pos(kind, "memory")][0])
        elif kind == Rec.HANDOFF:
            key = native.extension.template_key(r, mon.writer.state.memory_fraction)
        else:
            key = native.extension.template_key(r)
        if key in templates:
            checked[kind.name] = checked.get(kind.name, 0) + 1
            continue
        site = r[1]
        near = [k for k in templates if isinstance(k, tuple) and len(k) == len(key) and site in k]
        assert near, f"{kind.name}: no template of this site at all (key {key!r:.200})"
        diff = [records.KEYS[kind][i] for i, (a, b) in enumerate(zip(key, near[0])) if a != b]
        pytest.fail(f"{kind.name}: the C key differs from the Python writer's in {diff} (records.KEYS[{kind.name}]"
                    f" = {records.KEYS[kind]})")
    assert set(checked) >= {"LINEAR", "MODULE", "ALLOC_OUT", "ALLOC", "ATTENTION_KV", "HANDOFF"}, checked


@needs_c
def test_a_template_entry_of_another_layout_fails_by_name(tmp_path: Path) -> None:
    """An entry that is not the tuple records.ENTRIES declares is an error naming its items,
    not a quiet fallback to Python."""
    mon, recs = recorded(tmp_path, "MINIMAL")
    st = mon.writer.state
    lin = [r for r in recs if r[0] == Rec.LINEAR and type(r[3]) is int and r[3] > 0]
    key = native.extension.template_key(lin[-1])
    assert key in st.templates
    st.templates[key] = st.templates[key][:3]
    with pytest.raises(TypeError, match=r"LINEAR record is not the 4-tuple records.ENTRIES declares "
                                        r"\(formats, flops, nbytes, programs\)"):
        native.render(st, [lin[-1]], 0, [], 1 << 62)


@needs_c
def test_a_record_of_another_length_fails_by_name(tmp_path: Path) -> None:
    mon, recs = recorded(tmp_path, "MINIMAL")
    lin = next(r for r in recs if r[0] == Rec.LINEAR)
    with pytest.raises(TypeError, match="record of kind 2 has 9 items, not what records.FIELDS declares"):
        native.render(mon.writer.state, [lin + (None,)], 0, [], 1 << 62)


def test_writer_methods_take_the_fields_records_py_declares() -> None:
    """Each record kind's writer method (Writer.handlers) takes the record's fields by the
    names and in the order records.FIELDS declares: reordering one side fails here, naming
    the kind."""
    import inspect

    from llm_instrumentation.resources.attention_lines import AttentionLines
    from llm_instrumentation.resources.state import WriterState
    from llm_instrumentation.resources.writer import Writer

    st = WriterState("s")
    w = Writer(st, AttentionLines(st, dict), sink=None, longest=[None])
    for kind in Rec:
        params = tuple(inspect.signature(w.handlers[kind]).parameters)
        assert params == records.FIELDS[kind], f"{kind.name}: the writer takes {params}, records.py declares " \
                                               f"{records.FIELDS[kind]}"
