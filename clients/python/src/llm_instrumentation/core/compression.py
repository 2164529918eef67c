"""1.3.1's ``TensorCompressionManager``: compresses a tensor the way 1.3.1's writer did, and
decompresses a payload of a 1.3.1 ``.stream`` (its only documented way to do so).

A capture does not use this: strapd compresses, with every codec of docs/COMPRESSION.md,
and :func:`~llm_instrumentation.open_stream` gives tensors back bit-exact with dtype and
shape. This is for code written against 1.3.1 that builds or reads 1.3.1 payloads itself;
the codecs are the ones the 1.3.1 stream reader (``llm_instrumentation._legacy131``) uses.

What 1.3.1 did, and this does too: fp32 tensors are cast to fp16 before compressing (so a
round trip loses precision), other dtypes keep their bytes; ``compress_tensor`` returns
``(payload, raw bytes / payload bytes)``. 1.3.1 also listed ``"fp16"`` and ``"delta"``
strategies that raised ``NotImplementedError``; they are not offered here.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from .._legacy131 import compress_payload, decompress_payload

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CompressionStrategy", "LZ4Strategy", "ZstdStrategy", "NoneStrategy", "TensorCompressionManager"]


class CompressionStrategy(abc.ABC):
    """One codec of 1.3.1's payloads: ``compress`` / ``decompress`` bytes."""

    #: the codec's name in a 1.3.1 stream
    codec = ""
    compression_level: Optional[int] = None

    def compress(self, data: bytes) -> bytes:
        """Compress ``data`` as 1.3.1 did."""
        return compress_payload(self.codec, data, self.compression_level)

    def decompress(self, data: bytes) -> bytes:
        """Decompress one payload (StreamFormatError when it is not a valid frame)."""
        return decompress_payload(self.codec, data)

    def get_ratio(self) -> float:
        """1.3.1 returned a placeholder here (0.0, or 1.0 for none); so does this: the ratio
        of one call is the second value of :meth:`TensorCompressionManager.compress_tensor`."""
        return 1.0 if self.codec == "none" else 0.0


class LZ4Strategy(CompressionStrategy):
    """One LZ4 frame per payload (level 1, as 1.3.1)."""

    codec = "lz4"

    def __init__(self, compression_level: int = 1) -> None:
        self.compression_level = compression_level


class ZstdStrategy(CompressionStrategy):
    """One zstd frame per payload (level 3, as 1.3.1)."""

    codec = "zstd"

    def __init__(self, compression_level: int = 3) -> None:
        self.compression_level = compression_level


class NoneStrategy(CompressionStrategy):
    """The bytes as they are."""

    codec = "none"


class TensorCompressionManager:
    """1.3.1's tensor codec front: ``current_strategy`` names the codec (``"lz4"``, the
    default, ``"zstd"`` or ``"none"``).

    Example:
        >>> import torch
        >>> m = TensorCompressionManager()
        >>> payload, ratio = m.compress_tensor(torch.zeros(64))
        >>> len(m.decompress_tensor(payload))       # fp16 bytes, as 1.3.1 stored them
        128
    """

    def __init__(self) -> None:
        self.strategies: Dict[str, CompressionStrategy] = {
            "lz4": LZ4Strategy(), "zstd": ZstdStrategy(), "none": NoneStrategy()}
        self.current_strategy = "lz4"

    def _strategy(self, key: Optional[str]) -> CompressionStrategy:
        k = key or self.current_strategy
        s = self.strategies.get(k)
        if s is None:
            raise ValueError(f"Unsupported compression strategy: {k!r} (1.3.1 payloads are "
                             f"{', '.join(sorted(self.strategies))}; strapd's codecs are for captures)")
        return s

    def compress_tensor(self, tensor: "torch.Tensor") -> Tuple[bytes, float]:
        """Compress a tensor as 1.3.1's writer did (fp32 → fp16 first).

        Args:
            tensor: any tensor (moved to the CPU; bf16 has no numpy dtype and is refused, as
                in 1.3.1).

        Returns:
            ``(payload, ratio)``: the payload and its raw size over its compressed size.
        """
        import torch

        strategy = self._strategy(None)
        t = tensor.detach()
        if t.dtype == torch.float32:
            t = t.to(torch.float16)
        raw = t.cpu().contiguous().numpy().tobytes()
        out = strategy.compress(raw)
        return out, (len(raw) / len(out) if out else 0.0)

    def decompress_tensor(self, data: bytes, strategy: Optional[str] = None) -> bytes:
        """Decompress one 1.3.1 payload.

        Args:
            data: the payload.
            strategy: its codec (default: ``current_strategy``).

        Returns:
            the tensor's bytes (fp16 for what was fp32; rebuild with
            ``numpy.frombuffer(b, numpy.float16)``: 1.3.1 stored no shape).

        Raises:
            ValueError: an unknown strategy.
            StreamFormatError: the payload is not a valid frame of that codec.
        """
        return self._strategy(strategy).decompress(data)
