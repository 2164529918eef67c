"""Writes the llm_instrumentation 1.3.1 stream fixtures in testdata/compat131/.

1.3.1's writer (core/streaming.py + core/compression.py), restated: per tensor, fp32 is cast
to fp16, the bytes (``tensor.cpu().numpy().tobytes()``) are compressed as a whole
(``lz4.frame.compress(level 1)``, ``zstd.ZstdCompressor(level=3).compress``, or kept raw)
and written as ``struct.pack("!HI", len(name), len(data)) + name + data``.

    python write_v131_streams.py             # (re)write the fixtures
    python write_v131_streams.py --check-wheel DIR [--deps DIR]
        # run 1.3.1's own StreamingSerializer (unpacked wheel in DIR, aiofiles in --deps)
        # on the same tensors and compare its files with these, byte for byte

The tests decode the fixtures and compare with :func:`fixture_tensors`; they do not
re-run this script (compressed bytes may differ between lz4/zstd versions).
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
from pathlib import Path
from typing import List, Tuple

import numpy as np

OUT = Path(__file__).resolve().parents[4] / "testdata" / "compat131"
CODECS = ("lz4", "zstd", "none")


def fixture_tensors() -> List[Tuple[str, np.ndarray]]:
    """The captured outputs, in hook order: 1.3.1 hooked the root (name ``""``) and its
    direct children, so a forward gave the children first and the root last. Two forwards."""
    out = []
    for fwd in range(2):
        n = 3 + fwd  # the sequence grows by one position per forward
        x = np.arange(n * 16, dtype=np.float32)
        out.append(("embed_tokens", (np.sin(x * 0.37) * 3).reshape(1, n, 16).astype(np.float32)))
        out.append(("norm", (np.cos(x * 0.11) * 0.5).reshape(1, n, 16).astype(np.float16)))
        out.append(("lm_head", (x[: n * 8] * 0.25 - 7).reshape(1, n, 8).astype(np.float32)))
        out.append(("", (x[: n * 8] * -0.5 + 1000).reshape(1, n, 8).astype(np.float32)))
    return out


def stored_values(t: np.ndarray) -> np.ndarray:
    """What 1.3.1 kept of ``t``: fp32 became fp16, other dtypes were kept."""
    return t.astype(np.float16) if t.dtype == np.float32 else t


def v131_payload(t: np.ndarray, codec: str) -> bytes:
    raw = stored_values(t).tobytes()
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(raw, compression_level=1)
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(raw)
    return raw


def v131_packet(name: str, t: np.ndarray, codec: str) -> bytes:
    nb = name.encode("utf-8")
    data = v131_payload(t, codec)
    return struct.pack("!HI", len(nb), len(data)) + nb + data


def write_all(out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for codec in CODECS:
        (out / f"{codec}.stream").write_bytes(b"".join(v131_packet(n, t, codec) for n, t in fixture_tensors()))


def check_wheel(wheel_dir: str, deps: str) -> int:
    """Run 1.3.1's StreamingSerializer on the fixture tensors; compare with our files."""
    import tempfile

    import torch

    sys.path[:0] = [wheel_dir, deps]
    from llm_instrumentation.core.streaming import StreamingSerializer  # 1.3.1's

    mod = sys.modules[StreamingSerializer.__module__].__file__ or ""
    if not mod.startswith(str(Path(wheel_dir).resolve())) and not mod.startswith(wheel_dir):
        raise SystemExit(f"imported {mod}, not the 1.3.1 wheel in {wheel_dir}")
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for codec in CODECS:
            path = Path(d) / f"{codec}.stream"

            async def run() -> None:
                s = StreamingSerializer(buffer_size=1 << 20, num_workers=1, compression_algo=codec)
                await s.start_streaming(str(path))
                for name, t in fixture_tensors():
                    await s.enqueue_tensor(name, torch.from_numpy(t.copy()))
                await s.stop_streaming()

            asyncio.run(run())
            theirs, ours = path.read_bytes(), (OUT / f"{codec}.stream").read_bytes()
            same = theirs == ours
            bad += not same
            print(f"{codec}: 1.3.1 wrote {len(theirs)} bytes, fixture {len(ours)} bytes, identical={same}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-wheel", metavar="DIR", help="unpacked llm_instrumentation 1.3.1 wheel")
    ap.add_argument("--deps", default="", help="directory holding aiofiles (1.3.1 imports it)")
    a = ap.parse_args()
    if a.check_wheel:
        return check_wheel(a.check_wheel, a.deps)
    write_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
