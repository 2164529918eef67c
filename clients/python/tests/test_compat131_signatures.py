"""Our public API against llm_instrumentation 1.3.1's, read from its wheel into
testdata/compat131/signatures.json (tests/compat131/gen_signatures.py).

Compatible means: the name imports from the same module path; every 1.3.1 parameter exists
here under the same name, at the same position when 1.3.1 allowed it positionally, with a
default wherever 1.3.1 had one; any parameter we add has a default; classes have 1.3.1's
methods (same rules), dataclass fields, enum members and instance attributes. Default
values may differ (ours are documented).

KNOWN_DIFFERENT lists what is not compatible yet, with why; the test fails when that list is
wrong in either direction, so fixing a name means removing it here.
"""

from __future__ import annotations

import importlib
import inspect
import json
from typing import Any, Dict, List

import pytest
from conftest import TESTDATA

SIGS = json.loads((TESTDATA / "compat131" / "signatures.json").read_text())

# name -> the problems accepted for it (substrings of the checker's messages; "missing"
# for a name we do not provide at all).
KNOWN_DIFFERENT: Dict[str, List[str]] = {
    # 1.3.1's tracker took its checkpoint manager; checkpoints are strapd's here and the
    # capture makes the tracker.
    "llm_instrumentation.core.framework:_TokenBoundaryTracker": ["'checkpoint_manager' missing"],
    # 1.3.1 listed these strategies but they only raised NotImplementedError; not offered.
    "llm_instrumentation.core.compression:DeltaEncodingStrategy": ["missing"],
    "llm_instrumentation.core.compression:FP16Strategy": ["missing"],
    # Checkpoints are strapd's (docs/CHECKPOINTS.md); 1.3.1's JSON token snapshots are not kept.
    "llm_instrumentation.core.checkpoint": ["missing"],
    "llm_instrumentation.core.checkpoint:CheckpointManager": ["missing"],
    "llm_instrumentation.core.checkpoint:CheckpointState": ["missing"],
}

def resolve(key: str) -> Any:
    modname, _, name = key.partition(":")
    mod = importlib.import_module(modname)
    return getattr(mod, name) if name else mod


def param_problems(where: str, theirs: List[Dict[str, Any]], obj: Any) -> List[str]:
    try:
        ours = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError) as e:
        return [f"{where}: no signature ({e})"]
    out = []
    by_name = {p.name: (i, p) for i, p in enumerate(ours)}
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    for i, t in enumerate(theirs):
        if t["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if not any(p.kind.name == t["kind"] for p in ours):
                out.append(f"{where}: no {t['kind']} ({t['name']})")
            continue
        if t["name"] not in by_name:
            out.append(f"{where}: parameter {t['name']!r} missing")
            continue
        j, p = by_name[t["name"]]
        if t["kind"] in positional and (j != i or p.kind.name not in positional):
            out.append(f"{where}: parameter {t['name']!r} at position {j} ({p.kind.name}), 1.3.1 has it at {i}")
        if t["has_default"] and p.default is p.empty:
            out.append(f"{where}: parameter {t['name']!r} has no default (1.3.1: {t['default']})")
    names = {t["name"] for t in theirs}
    for p in ours:
        if p.name not in names and p.default is p.empty and p.kind.name not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            out.append(f"{where}: extra parameter {p.name!r} without a default")
    return out


def problems(key: str, desc: Dict[str, Any]) -> List[str]:
    try:
        obj = resolve(key)
    except (ImportError, AttributeError) as e:
        return [f"{key}: missing ({e})"]
    kind = desc["kind"]
    if kind == "module":
        return []
    if kind == "function":
        return param_problems(key, desc["params"], obj) if callable(obj) else [f"{key}: not callable"]
    if kind == "value":
        return [] if type(obj).__name__ == desc["type"] else [f"{key}: a {type(obj).__name__}, 1.3.1 a {desc['type']}"]
    if not inspect.isclass(obj):
        return [f"{key}: not a class"]
    out = []
    for m, v in desc.get("members", {}).items():
        if m not in obj.__members__ or obj[m].value != v:
            out.append(f"{key}: enum member {m}={v!r} missing")
    if "init" in desc:
        out += param_problems(f"{key}()", desc["init"], obj)
    for f in desc.get("fields", []):
        if not hasattr(obj, "__dataclass_fields__") or f not in obj.__dataclass_fields__:
            out.append(f"{key}: field {f!r} missing")
    for m, sig in desc.get("methods", {}).items():
        if not hasattr(obj, m):
            out.append(f"{key}.{m}: missing")
        elif sig != "property":
            out += param_problems(f"{key}.{m}", sig, getattr(obj, m))
    if desc.get("attrs"):
        inst = obj()
        out += [f"{key}: instance attribute {a!r} missing" for a in desc["attrs"] if not hasattr(inst, a)]
    return out


def all_problems() -> Dict[str, List[str]]:
    res = {}
    for key, desc in SIGS["api"].items():
        p = problems(key, desc)
        if p:
            res[key] = p
    return res


def test_signatures_file_is_131():
    assert SIGS["version"] == "1.3.1" and len(SIGS["api"]) > 40


def test_public_api_compatible_with_131():
    found = all_problems()
    unexpected = [m for k, msgs in found.items() for m in msgs
                  if not any(a in m for a in KNOWN_DIFFERENT.get(k, []))]
    fixed = sorted(set(KNOWN_DIFFERENT) - set(found))
    assert not unexpected, "incompatible with 1.3.1:\n" + "\n".join(unexpected)
    assert not fixed, f"compatible now, remove from KNOWN_DIFFERENT: {fixed}"


@pytest.mark.parametrize("key", sorted(KNOWN_DIFFERENT))
def test_known_differences_are_real(key):
    assert key in SIGS["api"], f"{key} is not a 1.3.1 name"
    assert problems(key, SIGS["api"][key])


def test_report_compatibility(capsys):
    """Prints the count (``pytest -s``): 1.3.1 names, and how many are compatible."""
    found = all_problems()
    names = [k for k in SIGS["api"]]
    ok = [k for k in names if k not in found]
    with capsys.disabled():
        print(f"\n1.3.1 public names: {len(names)}, compatible: {len(ok)}, different: {sorted(found)}")
    assert len(ok) + len(found) == len(names)
    assert len(ok) >= 47, "fewer 1.3.1 names are compatible than before"


def test_checker_catches_differences():
    """The checker itself: a moved, a missing and a default-less parameter are reported."""
    def f(b, a=1, *, c): ...

    theirs = [{"name": "a", "kind": "POSITIONAL_OR_KEYWORD", "has_default": False},
              {"name": "b", "kind": "POSITIONAL_OR_KEYWORD", "has_default": True, "default": "2"},
              {"name": "d", "kind": "POSITIONAL_OR_KEYWORD", "has_default": False}]
    msgs = " | ".join(param_problems("f", theirs, f))
    assert "'a' at position 1" in msgs and "'b' has no default" in msgs and "'d' missing" in msgs
    assert "extra parameter 'c'" in msgs
