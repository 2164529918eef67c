"""The optional C extensions of the client (everything else is in pyproject.toml).

``llm_instrumentation._speedups`` (``_speedups.c``) writes a record into the ring in one
call; ``llm_instrumentation.resources._native`` (``resources/_native*.c``, with the generated
``resources/_records.h``) times modules and writes resource events for the resource
monitor. Both are built against CPython's limited API (one ``.abi3.so`` for CPython 3.10
and later). ``optional=True``: where no C compiler is found, or a build fails, the package
installs without it and the client takes its Python paths, which write the same bytes.
"""

from pathlib import Path

from setuptools import Extension, setup

LIMITED = dict(py_limited_api=True, define_macros=[("Py_LIMITED_API", "0x030A0000")], extra_compile_args=["-O2"],
               optional=True)

#: The resource extension's C files, and the headers they include (_records.h is generated
#: from records.py: make generate).
NATIVE_SOURCES = sorted(p.name for p in (Path(__file__).parent / "src/llm_instrumentation/resources").glob("_native*.c"))
NATIVE_HEADERS = ["_native.h", "_render_core.h", "_records.h"]

setup(
    ext_modules=[
        Extension("llm_instrumentation._speedups", ["src/llm_instrumentation/_speedups.c"], **LIMITED),
        Extension("llm_instrumentation.resources._native",
                  [f"src/llm_instrumentation/resources/{f}" for f in NATIVE_SOURCES],
                  depends=[f"src/llm_instrumentation/resources/{f}" for f in NATIVE_HEADERS], **LIMITED),
    ],
)
