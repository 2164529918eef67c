"""The client's module graph: no import cycles, and the light modules stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

from conftest import REPO

PKG = REPO / "clients/python/src/llm_instrumentation"


def _modules() -> Dict[str, Path]:
    """Every module of the package by dotted name (C extensions by their source: a .c file
    next to where its .so goes)."""
    mods: Dict[str, Path] = {}
    for p in sorted(PKG.rglob("*.py")) + sorted(PKG.rglob("*.c")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods.setdefault(".".join(parts), p)
    return mods


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (annotations only: never imported at run time)."""
    out: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                out.update(id(n) for n in ast.walk(child))
    return out


def import_graph() -> Dict[str, Set[str]]:
    """Module → the package's modules it imports, at module level or inside functions (a
    lazy import is an edge too: it is the same dependency, paid later)."""
    mods = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in mods.items():
        graph[name] = set()
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name and t.startswith("llm_instrumentation"):
                    graph[name].add(t)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "llm_instrumentation.resources.records" in graph and len(graph) > 40
    found = cycles(graph)
    detail = [[f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c] for c in found]
    assert not found, f"import cycles in the client: {detail}"


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_config_does_not_import_the_monitor() -> None:
    """config (and the package itself) import the resource level, not the monitor: no
    torch, threads or C extension of the monitor until one is made."""
    code = ("import sys, llm_instrumentation.config, llm_instrumentation._options, llm_instrumentation; "
            "heavy = sorted(m for m in sys.modules if m.startswith('llm_instrumentation.resources.') "
            "and m != 'llm_instrumentation.resources.levels'); "
            "assert not heavy, heavy; "
            "from llm_instrumentation.resources import ResourceLevel, ResourceMonitor; "
            "assert 'llm_instrumentation.resources.monitor' in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_resources_modules_stay_small() -> None:
    """No file of the resource monitor (Python or C) over ~600 lines, no class over ~400
    (issue 23)."""
    files = sorted(p for p in (PKG / "resources").iterdir() if p.suffix in (".py", ".c", ".h", ".pyi"))
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        assert text.count("\n") <= 600, f"{path.name}: {text.count(chr(10))} lines"
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                assert n <= 400, f"{path.name}: class {node.name} has {n} lines"
