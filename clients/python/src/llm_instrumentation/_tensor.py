"""One captured tensor, reassembled from its packets: what a stream reader (``stream.py``)
and the 1.3.1 reader (``_legacy131.py``) hand out. A leaf: both readers import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Tensor"]


class Tensor:
    """One captured tensor (its PART packets reassembled).

    Attributes:
        name, seq (of its first packet), step, forward, dtype (name), shape, meta, packets.
    """

    def __init__(self, packets: List[Any]) -> None:
        first = packets[0]
        self.packets = packets
        self.name = first.name
        self.seq = first.seq
        self.step = first.step
        self.forward = first.forward
        self.dtype: str = first.dtype or "uint8"
        self.shape: Tuple[int, ...] = first.shape
        self.meta = first.meta
        self.nbytes = first.tensor_len

    def __repr__(self) -> str:
        return (f"Tensor(name={self.name!r}, seq={self.seq}, step={self.step}, forward={self.forward}, "
                f"dtype={self.dtype}, shape={self.shape})")

    @property
    def ggml(self) -> Optional[Tuple[str, Tuple[int, ...]]]:
        """For a ggml tensor stored as raw quantized blocks (STREAM_FORMAT.md 4.1: dtype uint8,
        shape ``[ne[n-1], ..., ne[1], row bytes]``, meta ``ggml_type``/``ggml_ne``): its ggml type
        name (``"q4_0"``) and ``ne`` (innermost first); None for any other tensor."""
        m = self.meta
        if self.dtype == "uint8" and isinstance(m, dict) and isinstance(m.get("ggml_type"), str) \
                and isinstance(m.get("ggml_ne"), list) and all(isinstance(v, int) for v in m["ggml_ne"]):
            return m["ggml_type"], tuple(m["ggml_ne"])
        return None

    def raw(self, stored: Optional[List[Any]] = None) -> bytes:
        """The tensor's raw little-endian bytes in C order. ``stored``: its packets' stored
        payloads, one per packet, when the caller fetched them already (object storage)."""
        if stored is not None and len(stored) != len(self.packets):
            raise ValueError(f"{len(stored)} stored payloads for {len(self.packets)} packets")
        if len(self.packets) == 1:
            return self.packets[0].decode() if stored is None else self.packets[0].decode(stored[0])
        buf = bytearray(self.nbytes)
        for i, p in enumerate(self.packets):
            buf[p.part_offset:p.part_offset + p.raw_len] = p.decode() if stored is None else p.decode(stored[i])
        return bytes(buf)

    def numpy(self) -> np.ndarray:
        """The tensor as a numpy array; bfloat16 and float8 are upcast exactly to float32."""
        raw = self.raw()
        name = self.dtype
        if name == "bfloat16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif name in ("float8_e4m3fn", "float8_e5m2"):
            arr = _FP8_TABLES[name]()[np.frombuffer(raw, dtype=np.uint8)]
        elif name == "bool":
            arr = np.frombuffer(raw, dtype=np.uint8).astype(bool)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(name).newbyteorder("<")).copy()
        return arr.reshape(self.shape)

    def tensor(self) -> "torch.Tensor":
        """The tensor as a ``torch.Tensor`` of its original dtype (bf16 stays bf16)."""
        import torch

        raw = bytearray(self.raw())
        dt = getattr(torch, self.dtype)
        if not raw:
            return torch.empty(self.shape, dtype=dt)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(self.shape)


def _fp8_table(exp_bits: int, man_bits: int, bias: int, ieee: bool) -> np.ndarray:
    vals = np.empty(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> man_bits) & ((1 << exp_bits) - 1)
        m = b & ((1 << man_bits) - 1)
        emax = (1 << exp_bits) - 1
        if ieee and e == emax:
            vals[b] = s * np.inf if m == 0 else np.nan
        elif not ieee and e == emax and m == (1 << man_bits) - 1:
            vals[b] = np.nan
        elif e == 0:
            vals[b] = s * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
        else:
            vals[b] = s * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return vals


_fp8_cache: Dict[str, np.ndarray] = {}


def _fp8(name: str, *args: Any) -> Any:
    def get() -> np.ndarray:
        if name not in _fp8_cache:
            _fp8_cache[name] = _fp8_table(*args)
        return _fp8_cache[name]
    return get


_FP8_TABLES = {"float8_e4m3fn": _fp8("float8_e4m3fn", 4, 3, 7, False),
               "float8_e5m2": _fp8("float8_e5m2", 5, 2, 15, True)}
