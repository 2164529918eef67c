#!/usr/bin/env python3
"""Build a platform wheel of strap-llm that carries a static strapd.

What makes the wheel platform-specific is the daemon at ``llm_instrumentation/_bin/strapd``
and the client's optional C extensions ``llm_instrumentation/_speedups.abi3.so`` (the ring's
record write) and ``llm_instrumentation/resources/_native.abi3.so`` (the resource monitor's
wrapper and writer). The package is copied to a scratch directory, the binary is placed
there, the extensions are compiled for
the target architecture (``cc`` on the same architecture, else Debian's cross compiler
``<arch>-linux-gnu-gcc``; ``CC_<arch>`` overrides), and setuptools' own ``bdist_wheel`` is
run through the PEP 517 backend with ``--plat-name`` on the scratch copy, where the extension
is package data: a package without ``ext_modules`` built with an explicit platform name gets
the tag ``py3-none-<plat>`` (any Python 3 ≥ 3.10, any glibc/musl of that architecture). The
extension uses CPython's limited API of 3.10 (the ``abi3`` ABI), so it loads into every
CPython the package supports; an interpreter that cannot load it takes the client's Python
path, which writes the same bytes.

Usage (the Makefile's ``wheel`` target):
    python tools/build_wheel.py --binary build/linux_amd64/strapd \
        --plat manylinux_2_17_x86_64 --version 0.1.0 --out dist
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from typing import List
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # clients/python

# ELF e_machine of each architecture a platform tag may name.
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def elf_machine(path: Path) -> int:
    """The e_machine field of a little-endian 64-bit ELF file; raises on anything else."""
    head = path.read_bytes()[:20]
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise SystemExit(f"{path}: not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise SystemExit(f"{path}: not a little-endian 64-bit ELF file")
    return int.from_bytes(head[18:20], "little")


def project_version() -> str:
    text = (HERE / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("pyproject.toml: no version")
    return m.group(1)


SRC = HERE / "src" / "llm_instrumentation"
#: libstrap: the C the extensions share with it (setup.py: clients/c/common), and its sources
#: and header, compiled into _speedups but the resource-event writer for C engines (setup.py).
LIBSTRAP = HERE.parent / "c"
COMMON = LIBSTRAP / "common"
LIBSTRAP_SOURCES = sorted(p for p in (LIBSTRAP / "src").glob("*.c") if not p.name.startswith("resource"))
#: The C extensions (setup.py builds the same from source): path in the wheel, C sources.
EXTENSIONS = {
    "llm_instrumentation/_speedups.abi3.so": sorted(SRC.glob("_speedups*.c")) + sorted(COMMON.glob("*.c"))
    + LIBSTRAP_SOURCES,
    "llm_instrumentation/resources/_native.abi3.so": sorted((SRC / "resources").glob("_native*.c")),
}


def compile_extension(arch: str, sources: List[Path], dest: Path) -> None:
    """Compile an extension's C sources for ``arch`` into ``dest`` and check the result's
    architecture and the glibc it needs."""
    host = platform.machine()
    cc = os.environ.get(f"CC_{arch}") or ("cc" if host == arch else f"{arch}-linux-gnu-gcc")
    if shutil.which(cc) is None:
        raise SystemExit(f"no C compiler {cc!r} for {arch} (Debian: apt-get install gcc-{arch.replace('_', '-')}"
                         f"-linux-gnu; or set CC_{arch})")
    include = sysconfig.get_paths()["include"]
    # -fvisibility=hidden and STRAP_NO_EXPORT: libstrap's symbols stay inside the extension
    # (PyInit_* only)
    cmd = [cc, "-O2", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden", "-DSTRAP_NO_EXPORT", "-Wall", "-Werror",
           "-I", include, "-I", str(COMMON), "-I", str(LIBSTRAP / "src"), "-I", str(LIBSTRAP / "include"),
           *map(str, sources), "-o", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"compiling {dest.name} for {arch} failed: {' '.join(cmd)}")
    if elf_machine(dest) != ELF_MACHINE[arch]:
        raise SystemExit(f"{cc} built {dest} for another architecture than {arch}")
    need = glibc_needed(dest)
    if need > GLIBC_FLOOR:
        raise SystemExit(f"{dest} needs glibc {need}, newer than manylinux_2_17 allows")


#: The manylinux_2_17 tag promises nothing newer than glibc 2.17.
GLIBC_FLOOR = (2, 17)


def glibc_needed(path: Path) -> tuple:
    """The newest glibc symbol version a shared object needs ((0,) for none): the version names
    are strings in its .gnu.version_r section."""
    found = re.findall(rb"GLIBC_(2\.[0-9]+(?:\.[0-9]+)?)", Path(path).read_bytes())
    return max((tuple(int(x) for x in v.split(b".")) for v in found), default=(0,))


def check_wheel(whl: Path, plat: str) -> None:
    """Fail unless the wheel has the expected tag, an executable strapd and the C extension
    for its architecture inside."""
    arch = next(a for a in ELF_MACHINE if plat.endswith("_" + a))
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        wheel_meta = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        tags = [l.split(":", 1)[1].strip() for l in z.read(wheel_meta).decode().splitlines()
                if l.startswith("Tag:")]
        if tags != [f"py3-none-{plat}"]:
            raise SystemExit(f"{whl}: tags {tags}, want py3-none-{plat}")
        info = z.getinfo("llm_instrumentation/_bin/strapd")
        mode = info.external_attr >> 16
        if not mode & 0o111:
            raise SystemExit(f"{whl}: llm_instrumentation/_bin/strapd is not executable (mode {mode:o})")
        for ext in EXTENSIONS:
            if ext not in names:
                raise SystemExit(f"{whl}: no {ext}")
            so = z.read(ext)
            if so[:4] != b"\x7fELF" or int.from_bytes(so[18:20], "little") != ELF_MACHINE[arch]:
                raise SystemExit(f"{whl}: {ext} is not an {arch} ELF file")
        if not any(n.endswith(".dist-info/entry_points.txt") for n in names):
            raise SystemExit(f"{whl}: no entry_points.txt (the strapd console script)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True, type=Path, help="static strapd for the target platform")
    ap.add_argument("--plat", required=True, help="platform tag, e.g. manylinux_2_17_x86_64")
    ap.add_argument("--version", required=True, help="version strapd was built with (must match pyproject)")
    ap.add_argument("--out", required=True, type=Path, help="directory for the wheel")
    args = ap.parse_args()

    if args.version != project_version():
        raise SystemExit(f"strapd built as {args.version} but pyproject.toml says {project_version()}")
    arch = next((a for a in ELF_MACHINE if args.plat.endswith("_" + a)), None)
    if arch is None:
        raise SystemExit(f"platform tag {args.plat}: unknown architecture (know {sorted(ELF_MACHINE)})")
    if elf_machine(args.binary) != ELF_MACHINE[arch]:
        raise SystemExit(f"{args.binary} is not an {arch} binary, but the tag is {args.plat}")

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="strap-wheel-") as tmp:
        work = Path(tmp) / "pkg"
        # A scratch copy keeps setuptools' build/ and egg-info out of the source tree and
        # keeps one architecture's binary from leaking into the other's wheel.
        # setup.py (the extension's source build) stays behind: the scratch copy carries the
        # extension compiled for the target as package data instead.
        shutil.copytree(HERE / "src", work / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "_bin", "*.so"))
        shutil.copy2(HERE / "README.md", work / "README.md")
        pyproject = (HERE / "pyproject.toml").read_text()
        data = '"_bin/strapd"'
        if data not in pyproject:
            raise SystemExit(f"pyproject.toml: package-data has no {data} to add the extension beside")
        so_data = ", ".join(f'"{ext.split("/", 1)[1]}"' for ext in EXTENSIONS)
        (work / "pyproject.toml").write_text(pyproject.replace(data, f'{data}, {so_data}', 1))
        for ext, sources in EXTENSIONS.items():
            compile_extension(arch, sources, work / "src" / ext)
        bindir = work / "src" / "llm_instrumentation" / "_bin"
        bindir.mkdir()
        shutil.copyfile(args.binary, bindir / "strapd")
        (bindir / "strapd").chmod(0o755)
        wheel_dir = Path(tmp) / "wheel"
        wheel_dir.mkdir()
        # setuptools before 70.1 has no bdist_wheel of its own (it needed the wheel package).
        code = (
            "import sys, setuptools; from setuptools import build_meta as b; "
            "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2]); "
            "v >= (70, 1) or sys.exit(f'setuptools {setuptools.__version__} is too old: make wheel needs >= 70.1'); "
            "print(b.build_wheel(sys.argv[1], config_settings={'--build-option': ['--plat-name', sys.argv[2]]}))"
        )
        res = subprocess.run([sys.executable, "-c", code, str(wheel_dir), args.plat], cwd=work,
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stdout + res.stderr)
            raise SystemExit(f"bdist_wheel failed (exit {res.returncode})")
        name = res.stdout.strip().splitlines()[-1]
        whl = wheel_dir / name
        check_wheel(whl, args.plat)
        dest = out / name
        shutil.move(str(whl), dest)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
