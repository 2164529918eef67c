"""Writes testdata/compat131/signatures.json: the public API of llm_instrumentation 1.3.1,
read from its wheel, for test_compat131_signatures.py (so the tests need no download).

    pip download --no-deps llm-instrumentation==1.3.1 -d /tmp/li131
    python -m zipfile -e /tmp/li131/llm_instrumentation-1.3.1-py3-none-any.whl /tmp/li131_unpacked
    pip install --target /tmp/li131_deps aiofiles          # 1.3.1 imports it
    python gen_signatures.py /tmp/li131_unpacked --deps /tmp/li131_deps

The public API is: each module below, every name it defines or lists in ``__all__`` that does
not start with ``_`` (plus the tracker class 1.3.1's docs name, ``_TokenBoundaryTracker``);
for a class its public methods, dataclass fields, enum members and, for the tracker, the
attributes of an instance.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

OUT = Path(__file__).resolve().parents[4] / "testdata" / "compat131" / "signatures.json"

MODULES = [
    "llm_instrumentation",
    "llm_instrumentation.core",
    "llm_instrumentation.core.config",
    "llm_instrumentation.core.hooks",
    "llm_instrumentation.core.framework",
    "llm_instrumentation.core.auto_detect",
    "llm_instrumentation.core.streaming",
    "llm_instrumentation.core.compression",
    "llm_instrumentation.core.checkpoint",
    "llm_instrumentation.analysis",
    "llm_instrumentation.analysis.visualization",
]
EXTRA = {"llm_instrumentation.core.framework": ["_TokenBoundaryTracker"]}
# Imported helpers of a module that are not part of its API.
FOREIGN = {"contextmanager", "dataclass", "Optional", "Union", "Literal", "PathLike", "Any", "Dict", "List",
           "Tuple", "Sequence", "Protocol", "Callable", "ABC", "abstractmethod", "Enum", "datetime", "os",
           "struct", "np", "pd", "math", "warnings", "torch", "nn", "asyncio", "threading", "lz4", "zstd",
           "aiofiles", "json", "tempfile", "time", "Path", "annotations", "field"}


def params(obj: Any) -> List[Dict[str, Any]]:
    out = []
    for p in inspect.signature(obj).parameters.values():
        d: Dict[str, Any] = {"name": p.name, "kind": p.kind.name, "has_default": p.default is not p.empty}
        if p.default is not p.empty:
            d["default"] = repr(p.default)
        out.append(d)
    return out


def describe(obj: Any) -> Dict[str, Any]:
    if inspect.isclass(obj):
        d: Dict[str, Any] = {"kind": "class"}
        if issubclass(obj, enum.Enum):
            d["members"] = {m.name: m.value for m in obj}
            return d
        if dataclasses.is_dataclass(obj):
            d["fields"] = [f.name for f in dataclasses.fields(obj)]
        try:
            d["init"] = params(obj)
        except (TypeError, ValueError):
            pass
        methods = {}
        for name, raw in vars(obj).items():
            if name.startswith("_"):
                continue
            if isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
                methods[name] = params(getattr(obj, name))
            elif isinstance(raw, property):
                methods[name] = "property"
        d["methods"] = methods
        if obj.__name__ == "_TokenBoundaryTracker":
            d["attrs"] = sorted(a for a in vars(obj()) if not a.startswith("_"))
        return d
    if callable(obj):
        return {"kind": "function", "params": params(obj)}
    return {"kind": "value", "type": type(obj).__name__}


def collect() -> Dict[str, Any]:
    api: Dict[str, Any] = {}
    for modname in MODULES:
        mod = importlib.import_module(modname)
        names = list(getattr(mod, "__all__", []))
        for n, v in vars(mod).items():
            if n.startswith("_") or n in FOREIGN or inspect.ismodule(v):
                continue
            if getattr(v, "__module__", modname) not in (modname, None) and n not in names:
                continue  # imported from elsewhere; described where it is defined
            names.append(n)
        names += EXTRA.get(modname, [])
        api[modname] = {"kind": "module"}
        for n in dict.fromkeys(names):
            api[f"{modname}:{n}"] = describe(getattr(mod, n))
    return api


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel_dir", help="the unpacked llm_instrumentation 1.3.1 wheel")
    ap.add_argument("--deps", default="", help="a directory holding aiofiles")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    sys.path[:0] = [a.wheel_dir] + ([a.deps] if a.deps else [])
    import llm_instrumentation

    src = Path(llm_instrumentation.__file__).resolve()
    if not str(src).startswith(str(Path(a.wheel_dir).resolve())):
        raise SystemExit(f"imported {src}, not the wheel in {a.wheel_dir}")
    api = collect()
    doc = {"package": "llm-instrumentation", "version": "1.3.1", "api": api}
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{len(api)} entries -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
