"""The extensions as built for this checkout need nothing newer than the wheels' glibc floor
(manylinux_2_17): the wheel build refuses more (tools/build_wheel.py), but only `make test-dist`
builds wheels, so a new libc call in the shared C (stat and fcntl bind their 64-bit versions,
2.33 and 2.28, under the 64-bit offsets Python.h asks for) is caught here, in `make test`."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("build_wheel", REPO / "clients/python/tools/build_wheel.py")
build_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_wheel)


@pytest.mark.parametrize("module", ["llm_instrumentation._speedups", "llm_instrumentation.resources._native"])
def test_extension_needs_at_most_glibc_2_17(module):
    try:
        path = Path(importlib.import_module(module).__file__)
    except ImportError as e:  # _native is optional; _speedups is not
        if module.endswith("_native"):
            pytest.skip(f"{module} is not built here: {e}")
        raise
    need = build_wheel.glibc_needed(path)
    assert need > (2,), f"{path}: no GLIBC version names found: not a glibc shared object?"
    assert need <= build_wheel.GLIBC_FLOOR, (
        f"{path} needs glibc {'.'.join(map(str, need))}: newer than manylinux_2_17 (find the symbol with "
        f"`objdump -T {path} | grep GLIBC_2.[2-9]`)")
