"""The optional C extension of the client (everything else is in pyproject.toml).

``llm_instrumentation._speedups`` (``_speedups.c``) writes a record into the ring in one
call, and times modules and writes resource events for the resource monitor; it is built
against CPython's limited API (one ``.abi3.so`` for CPython 3.10 and later).
``optional=True``: where no C compiler is found, or the build fails, the package installs
without it and the client takes its Python paths, which write the same bytes.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "llm_instrumentation._speedups",
            ["src/llm_instrumentation/_speedups.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
)
