"""GPU tensors: DMA from device memory straight into the shared ring.

The ring mapping is registered once with ``cudaHostRegister`` so a ``non_blocking`` copy on
a side stream goes directly into shared memory (no staging buffer). The record is published
only after the copy's CUDA event completed (PROTOCOL.md 3). Not exercised by the CPU test
suite: it needs a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ._ring import Ring


class CudaCopier:
    """Copies CUDA tensors into a ring mapping registered as pinned host memory."""

    def __init__(self, ring: "Ring") -> None:
        import torch

        self._u8 = ring.u8()
        self.ptr = self._u8.data_ptr()
        self.size = ring.ring_size
        rc = torch.cuda.cudart().cudaHostRegister(self.ptr, self.size, 0)
        code = int(rc.value) if hasattr(rc, "value") else int(rc)
        if code != 0:
            raise RuntimeError(f"cudaHostRegister of the {self.size}-byte ring failed with cudaError {code}")
        self.registered = True
        self.stream: Any = torch.cuda.Stream()

    def copy(self, dst: "torch.Tensor", src: "torch.Tensor") -> None:
        """Copy ``src`` (CUDA) into ``dst`` (a view of the ring); returns once the bytes landed."""
        import torch

        with torch.cuda.device(src.device):
            self.stream.wait_stream(torch.cuda.current_stream(src.device))
            with torch.cuda.stream(self.stream):
                dst.copy_(src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            src.record_stream(self.stream)
        ev.synchronize()

    def close(self) -> None:
        """Unregister the ring mapping."""
        if self.registered:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.registered = False
