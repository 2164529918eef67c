"""docs/ARCHITECTURE.md matches the tree (issue 39): it names every Go package under cmd/,
internal/ and bench/, every module of the Python package, every part of libstrap and of the
llama.cpp capture, every BPF source and every entry of bench/; it names nothing that is not
there; and the Python package's imports point down its layers, as the doc's layer table
orders them (the facade, ``__init__.py``, is the top layer)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from conftest import REPO
from test_imports import PKG, _modules, import_graph

DOC = REPO / "docs" / "ARCHITECTURE.md"
#: What of clients/c is named file by file; the other folders there (tests, fuzz, bench,
#: cmake) are named as folders.
C_FILE_DIRS = ("src", "include", "common", "llama/src", "llama/include", "llama/tools")
C_FOLDERS = ("tests", "fuzz", "bench", "cmake", "llama/tests")
PY_SUFFIXES = (".py", ".c", ".h", ".pyi")


def named() -> Set[str]:
    """Every `backticked` token of the doc, a folder's trailing slash dropped."""
    return {t.rstrip("/") for t in re.findall(r"`([^`\n]+)`", DOC.read_text())}


def go_packages() -> List[str]:
    """The folders of cmd/, internal/ and bench/ that hold a Go package (a non-test .go file)."""
    out = set()
    for top in ("cmd", "internal", "bench"):
        for f in (REPO / top).rglob("*.go"):
            if not f.name.endswith("_test.go"):
                out.add(f.parent.relative_to(REPO).as_posix())
    return sorted(out)


def c_parts() -> List[str]:
    """libstrap's and the llama.cpp capture's sources and headers, and their test, fuzz,
    bench and cmake folders, by repository path."""
    c = REPO / "clients" / "c"
    out = [p.relative_to(REPO).as_posix() for d in C_FILE_DIRS for p in sorted((c / d).iterdir())
           if p.is_file() and p.suffix in (".c", ".h", ".cpp")]
    out += [f"clients/c/{d}" for d in C_FOLDERS if (c / d).is_dir()]
    return out


def py_files() -> List[str]:
    """The package's files (modules, C extension sources, headers, stubs), relative to it."""
    return sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*")
                  if p.suffix in PY_SUFFIXES and "__pycache__" not in p.parts)


def layer_table() -> Tuple[List[str], Dict[str, int]]:
    """The Python layer table: its layers bottom to top, and each file's layer index.

    A row is ``| N name | `file`, `file` ... | owns |``; N counts up from 1."""
    text = DOC.read_text()
    start = text.index("### Layers of the Python client")
    end = text.index("\n#", start + 1)
    layers: List[str] = []
    where: Dict[str, int] = {}
    for m in re.finditer(r"^\| (\d+) ([a-z ]+?) \| ([^|]+) \|", text[start:end], flags=re.M):
        n, name = int(m.group(1)), m.group(2)
        if not layers or layers[-1] != name:
            assert n == len(layers) + 1, f"layer {n} {name!r} out of order (after {layers})"
            layers.append(name)
        for f in re.findall(r"`([^`]+)`", m.group(3)):
            assert f not in where, f"{f} is in two layers of the table"
            where[f] = n - 1
    return layers, where


def upward_imports(graph: Dict[str, Set[str]], layer: Dict[str, int]) -> List[Tuple[str, str]]:
    """The imports (module -> module) that point to a higher layer than the importer's."""
    return sorted((a, b) for a, bs in graph.items() for b in bs if layer[b] > layer[a])


def test_every_go_package_is_named() -> None:
    pkgs = go_packages()
    assert "internal/server" in pkgs and "cmd/strapd" in pkgs and len(pkgs) > 25
    missing = [p for p in pkgs if p not in named()]
    assert not missing, f"docs/ARCHITECTURE.md does not name these Go packages: {missing}"


def test_every_python_file_is_named() -> None:
    files = py_files()
    assert "resources/levels.py" in files and "vllm/_plugin.py" in files and "_speedups.c" in files
    missing = [f for f in files if f not in named()]
    assert not missing, f"docs/ARCHITECTURE.md does not name these files of llm_instrumentation: {missing}"


def test_every_c_part_is_named() -> None:
    parts = c_parts()
    assert "clients/c/common/strap_wire.c" in parts and "clients/c/llama/tools/strap_llama_main.c" in parts
    missing = [p for p in parts if p not in named()]
    assert not missing, f"docs/ARCHITECTURE.md does not name these parts of clients/c: {missing}"


def test_bpf_and_bench_are_named() -> None:
    want = [p.relative_to(REPO).as_posix() for top in ("bpf", "bench") for p in sorted((REPO / top).iterdir())
            if not p.name.startswith(".") and p.name != "__pycache__"]
    assert "bpf/strap.bpf.c" in want and "bench/ingest" in want
    missing = [p for p in want if p not in named()]
    assert not missing, f"docs/ARCHITECTURE.md does not name these: {missing}"


def test_the_doc_names_nothing_that_is_gone() -> None:
    """A path the doc names under cmd/, internal/, bench/, bpf/ or clients/ exists (a renamed
    package or module cannot linger in the doc); a bare module name of the layer table is
    a file of the package."""
    gone = []
    for t in named():
        if re.fullmatch(r"(cmd|internal|bench|bpf|clients|testdata|deploy)/[\w./-]*", t) and "*" not in t:
            if not (REPO / t).exists():
                gone.append(t)
    _, where = layer_table()
    gone += [f for f in where if not (PKG / f).exists()]
    assert not gone, f"docs/ARCHITECTURE.md names paths that do not exist: {sorted(gone)}"


def test_every_python_module_has_one_layer() -> None:
    layers, where = layer_table()
    assert layers[0] == "leaves" and layers[-1] == "facade", layers
    mods = {n: p.relative_to(PKG).as_posix() for n, p in _modules().items()}
    missing = sorted(f for f in mods.values() if f not in where)
    assert not missing, f"modules not in the layer table of docs/ARCHITECTURE.md: {missing}"
    assert where["__init__.py"] == len(layers) - 1, "the facade is the top layer"


def test_no_upward_imports() -> None:
    """0 imports in the package point up its layers (issue 39): the package's own module
    graph of test_imports.py (lazy imports count, TYPE_CHECKING ones do not)."""
    _, where = layer_table()
    layer = {n: where[p.relative_to(PKG).as_posix()] for n, p in _modules().items()}
    graph = import_graph()
    assert sum(len(v) for v in graph.values()) > 150
    up = upward_imports(graph, layer)
    assert not up, "imports pointing up the layers of docs/ARCHITECTURE.md: " + ", ".join(f"{a} -> {b}" for a, b in up)


@pytest.mark.parametrize("graph,layer,want", [
    ({"a": {"b"}, "b": set()}, {"a": 1, "b": 0}, []),
    ({"a": {"b"}, "b": {"a"}}, {"a": 1, "b": 0}, [("b", "a")]),
    ({"a": {"b"}, "b": set()}, {"a": 0, "b": 0}, []),
])
def test_upward_import_counter(graph: Dict[str, Set[str]], layer: Dict[str, int], want: List[Tuple[str, str]]) -> None:
    assert upward_imports(graph, layer) == want
