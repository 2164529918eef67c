"""The sdist is complete: it carries every C file the extensions compile, libstrap's included
(clients/c: its shared C, its sources, its header, as ``libstrap/``), and a wheel built from it alone, away from the checkout,
has both extensions (about 8 s: it compiles them; ``make test-dist`` runs it beside the wheels'
test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

PY = REPO / "clients" / "python"
LIBSTRAP = REPO / "clients" / "c"

#: setuptools' PEP 517 backend, as pip and ``python -m build`` call it, in the given directory.
BACKEND = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def backend(hook: str, cwd: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-c", BACKEND, hook, str(out)], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return out / res.stdout.strip().splitlines()[-1]


def test_sdist_builds_a_wheel_with_both_extensions(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    # A scratch checkout of the two folders the sdist comes from (keeps build/ and egg-info out
    # of the tree).
    work = tmp_path / "checkout" / "clients"
    shutil.copytree(PY, work / "python", ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "*.egg-info", "*.so", "build", "_bin", ".pytest_cache", "tests", "benchmarks",
        "examples"))
    for sub in ("common", "src", "include"):
        shutil.copytree(LIBSTRAP / sub, work / "c" / sub)
    sdist = backend("build_sdist", work / "python", tmp_path / "sdist")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        t.extractall(tmp_path / "unpacked", filter="data")
    compiled = {str(p.relative_to(PY)) for p in (PY / "src").rglob("*.c")}
    assert compiled and compiled <= names, f"missing from the sdist: {sorted(compiled - names)}"
    shared = {f"libstrap/{sub}/{p.name}" for sub in ("common", "src") for p in (LIBSTRAP / sub).iterdir()
              if p.suffix in (".c", ".h") and not p.name.startswith("resource")} | {"libstrap/include/strap.h"}
    assert shared and shared <= names, f"missing from the sdist: {sorted(shared - names)}"
    root = tmp_path / "unpacked" / sdist.name[:-len(".tar.gz")]
    for f in shared:
        assert (root / f).read_bytes() == (LIBSTRAP / f[len("libstrap/"):]).read_bytes()
    # Away from the checkout: nothing but the sdist's own files to build from. The extensions
    # are optional, so their presence in the wheel is what shows they compiled.
    assert not (root.parent.parent / "c").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", BACKEND, "build_wheel", str(tmp_path / "wheel")], cwd=root,
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    whl = tmp_path / "wheel" / res.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(whl) as z:
        sos = sorted(n for n in z.namelist() if n.endswith(".so"))
    assert sos == ["llm_instrumentation/_speedups.abi3.so", "llm_instrumentation/resources/_native.abi3.so"], sos
