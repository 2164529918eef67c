"""The C extensions of the client (everything else is in pyproject.toml).

``llm_instrumentation._speedups`` (``_speedups*.c``) is libstrap, the C client, compiled in
with its Python bindings: the ring's layout and the ring itself, the control messages'
encoders and reply decoder with their JSON and their datagrams, the session after OPENED
(sequence numbers, PUBLISH batching and the published cursor, RELEASE and backpressure, DROP,
TOKEN, CHECKPOINT, CLOSE: ``clients/c/src/session.c``, bound by ``_speedups_session.c``), the
checkpoint file, the resume point, the stream lock, the per-rank stream name and the connect
with its autostart; ``llm_instrumentation.resources._native`` (``resources/_native*.c``) times
modules and writes resource events for the resource monitor. Both are built against CPython's
limited API (one ``.abi3.so`` for CPython 3.10 and later). ``_speedups`` is required (the
client has no other ring, session or message encoder: a source install needs a C compiler);
``_native`` is ``optional=True``: where it cannot be built the package installs without it and
the resource monitor takes its Python paths, which write the same bytes.

libstrap is ``clients/c`` in a checkout: its shared C (``common/``: also the resource events'
template filling ``_render_core.h`` and its schema ``_records.h``, generated from
``resources/records.py``), its sources (``src/``, all but the resource-event writer for C
engines) and its header (``include/strap.h``). An sdist carries a copy of those at
``libstrap/`` (the ``sdist`` command below puts it there), so a wheel builds from the sdist
alone.
"""

import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.sdist import sdist as _sdist

HERE = Path(__file__).resolve().parent
#: libstrap: the sdist's copy (``libstrap/``) when there is one, else ``../c`` of the checkout.
LIBSTRAP = next((d for d in (HERE / "libstrap", HERE.parent / "c") if (d / "common").is_dir()), None)
if LIBSTRAP is None:
    raise SystemExit(f"{HERE}: no libstrap (libstrap/ of an sdist, or ../c of a checkout)")
#: The shared C (``common/``), libstrap's sources (``src/``: its session, compiled in whole but
#: the resource-event writer for C engines) and its header (``include/``).
COMMON = LIBSTRAP / "common"
COMMON_FILES = sorted(p.name for p in COMMON.iterdir() if p.suffix in (".h", ".c"))
LIBSTRAP_SRC = sorted(p.name for p in (LIBSTRAP / "src").iterdir()
                      if p.suffix in (".h", ".c") and not p.name.startswith("resource"))

#: -fvisibility=hidden: libstrap's internal symbols (strap_wire.c's strap__*) stay inside the
#: extension; only PyInit_* is exported.
LIMITED = dict(py_limited_api=True, define_macros=[("Py_LIMITED_API", "0x030A0000")],
               extra_compile_args=["-O2", "-fvisibility=hidden"], include_dirs=[str(COMMON)])
#: _speedups: libstrap's headers too (its sources define _GNU_SOURCE themselves).
SPEEDUPS_ARGS = dict(LIMITED, define_macros=[("Py_LIMITED_API", "0x030A0000"), ("STRAP_NO_EXPORT", "1")],
                     include_dirs=[str(COMMON), str(LIBSTRAP / "src"), str(LIBSTRAP / "include")],
                     extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread"], extra_link_args=["-pthread"])

#: _speedups' own C files (_speedups.c and its _speedups_*.c units); every .c of the shared C
#: is compiled into it too.
SPEEDUPS_SOURCES = sorted(f"src/llm_instrumentation/{p.name}"
                          for p in (HERE / "src/llm_instrumentation").glob("_speedups*.c"))

#: The resource extension's C files, and the headers they include.
NATIVE_SOURCES = sorted(p.name for p in (HERE / "src/llm_instrumentation/resources").glob("_native*.c"))
NATIVE_HEADERS = ["src/llm_instrumentation/resources/_native.h"]


def _rel(p: Path) -> str:
    """A path relative to this directory (setuptools refuses absolute source paths:
    ``../c/...`` in a checkout, ``libstrap/...`` in an sdist)."""
    return os.path.relpath(p, HERE)


def _common_depends() -> list:
    """The shared C as build dependencies."""
    return [_rel(COMMON / f) for f in COMMON_FILES]


def _common_sources(*names: str) -> list:
    """Shared C files compiled into an extension."""
    return [_rel(COMMON / f) for f in names]


#: What the sdist carries of libstrap (``libstrap/`` in it): the folders and the files taken.
SDIST_LIBSTRAP = {"common": COMMON_FILES, "src": LIBSTRAP_SRC, "include": ["strap.h"]}


class sdist(_sdist):
    """setuptools' sdist, plus libstrap from ``../c`` as ``libstrap/`` (its shared C, its
    sources, its header): files outside the project cannot be listed, and without them the
    sdist would build no extension."""

    def make_release_tree(self, base_dir: str, files: list) -> None:
        super().make_release_tree(base_dir, files)
        for sub, names in SDIST_LIBSTRAP.items():
            dst = Path(base_dir) / "libstrap" / sub
            dst.mkdir(parents=True, exist_ok=True)
            for f in names:
                shutil.copy2(LIBSTRAP / sub / f, dst / f)


setup(
    cmdclass={"sdist": sdist},
    ext_modules=[
        Extension("llm_instrumentation._speedups",
                  [*SPEEDUPS_SOURCES, *_common_sources(*(f for f in COMMON_FILES if f.endswith(".c"))),
                   *(_rel(LIBSTRAP / "src" / f) for f in LIBSTRAP_SRC if f.endswith(".c"))],
                  depends=["src/llm_instrumentation/_speedups.h", _rel(LIBSTRAP / "include" / "strap.h"),
                           *_common_depends(), *(_rel(LIBSTRAP / "src" / f) for f in LIBSTRAP_SRC)],
                  **SPEEDUPS_ARGS),
        Extension("llm_instrumentation.resources._native",
                  [f"src/llm_instrumentation/resources/{f}" for f in NATIVE_SOURCES],
                  depends=NATIVE_HEADERS + _common_depends(), optional=True, **LIMITED),
    ],
)
