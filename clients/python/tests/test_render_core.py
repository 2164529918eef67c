"""clients/c/common/_render_core.h is plain C: it compiles without Python's headers (the C client
can reuse it), and its own double formatting writes what Python's repr writes."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

CORE = REPO / "clients/c/common"
HARNESS = Path(__file__).parent / "c" / "repr_double.c"


def test_render_core_writes_doubles_as_python_repr(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "repr_double"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(CORE), str(HARNESS), "-o", str(exe), "-lm"],
                   check=True)
    rng = random.Random(23)
    values = [0.0, -0.0, 1.0, 0.1, 1e-5, 1e-4, 1e16, 1e15, 1234567890123456.0, 12345678901234567.0, 2.5,
              float("inf"), -float("inf"), 5e-324, 1.7976931348623157e308, 2.0 ** -1022, 1 / 3, 1e22, 1e23]
    for _ in range(30000):
        r = rng.random()
        if r < 0.3:  # any bit pattern
            values.append(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
        elif r < 0.6:  # what the events hold: byte counts in MiB, GFLOPs, throughputs
            values.append(rng.randint(1, 10 ** 12) / rng.choice([1e3, 1e6, 1e9, float(1 << 20)]))
        elif r < 0.8:
            values.append(rng.randint(1, 10 ** 15) / (rng.randint(1, 10 ** 9) * 1e3))
        else:  # next to powers of two, where the round-trip interval is lopsided
            values.append(2.0 ** rng.randint(-1074, 1023) * rng.choice([1, 1.5, 0.75, 1 - 2 ** -52]))
    values = [v for v in values if v == v]
    inp = "".join("%016x\n" % struct.unpack("<Q", struct.pack("<d", v))[0] for v in values)
    out = subprocess.run([str(exe)], input=inp, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(values)
    bad = [(v, got) for v, got in zip(values, out) if got != repr(v)]
    assert not bad, f"{len(bad)} doubles written otherwise than repr: {bad[:5]}"
