"""1.3.1's ``StreamingSerializer``: writes tensors into a 1.3.1 ``.stream`` file (its
docs/STREAM_FORMAT.md: ``!HI`` header, name, payload from :class:`TensorCompressionManager`).

A capture does not use this: ``capture_activations`` streams through strapd into the v2
format (dtype, shape, step, checksums; docs/STREAM_FORMAT.md). This serves code that drove
1.3.1's serializer directly; its files read back with :func:`~llm_instrumentation.open_stream`
like any 1.3.1 stream. Same asyncio methods as 1.3.1 (``start_streaming``,
``enqueue_tensor``, ``stop_streaming``). Unlike 1.3.1's, packets are written in the order
they were enqueued whatever ``num_workers`` is, and a tensor that cannot be written (a
dtype numpy lacks, a name over 65535 bytes, a payload over 4 GiB) is not skipped silently:
the first such error is raised by ``stop_streaming``. ``buffer_size`` no longer limits a
packet (there is no in-process ring); it must still be positive.
"""

from __future__ import annotations

import asyncio
import struct
from typing import IO, TYPE_CHECKING, List, Optional

from .compression import TensorCompressionManager

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["StreamingSerializer"]

_HEADER = struct.Struct("!HI")


class StreamingSerializer:
    """Writes ``(layer name, tensor)`` pairs as 1.3.1 packets from an asyncio loop.

    Args:
        buffer_size: 1.3.1's ring size; checked positive, otherwise unused.
        num_workers: compression tasks (compression runs in threads, so they overlap).
        compression_algo: ``"lz4"`` (default), ``"zstd"`` or ``"none"``.

    Example:
        >>> async def write(path, tensors):                      # doctest: +SKIP
        ...     s = StreamingSerializer(compression_algo="zstd")
        ...     await s.start_streaming(path)
        ...     for name, t in tensors.items():
        ...         await s.enqueue_tensor(name, t)
        ...     await s.stop_streaming()
    """

    def __init__(self, buffer_size: int = 128 * 1024 * 1024, num_workers: int = 4,
                 compression_algo: str = "lz4") -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        self.buffer_size = buffer_size
        self.num_workers = max(1, int(num_workers))
        self.compressor = TensorCompressionManager()
        self.compressor._strategy(compression_algo)  # refuses an unknown codec now, not at the first tensor
        self.compressor.current_strategy = compression_algo
        self.running = False
        self.input_queue: asyncio.Queue = asyncio.Queue()
        self.writer_task: Optional[asyncio.Task] = None
        self.compression_tasks: List[asyncio.Task] = []
        self._order: asyncio.Queue = asyncio.Queue()
        self._file: Optional[IO[bytes]] = None
        self._error: Optional[BaseException] = None

    async def start_streaming(self, output_path: str, resume: bool = False) -> None:
        """Open ``output_path`` (appending with ``resume``, else replacing it) and start the tasks.

        Raises:
            RuntimeError: already streaming.
        """
        if self.running:
            raise RuntimeError("Streaming is already running.")
        self._file = open(output_path, "ab" if resume else "wb")
        self._error = None
        self.running = True
        self.writer_task = asyncio.create_task(self._writer())
        self.compression_tasks = [asyncio.create_task(self._compression_worker()) for _ in range(self.num_workers)]

    async def enqueue_tensor(self, layer_name: str, tensor: "torch.Tensor") -> None:
        """Queue one tensor; packets are written in the order of these calls.

        Raises:
            RuntimeError: not streaming.
        """
        if not self.running:
            raise RuntimeError("Streaming has not been started.")
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        # The writer waits on the futures in call order, so workers may finish in any order.
        await self._order.put(done)
        await self.input_queue.put((layer_name, tensor, done))

    async def stop_streaming(self) -> None:
        """Write everything queued, close the file.

        Raises:
            the first error of a tensor that could not be written (the others were written).
        """
        if not self.running:
            return
        for _ in self.compression_tasks:
            await self.input_queue.put(None)
        await asyncio.gather(*self.compression_tasks)
        await self._order.put(None)
        self.running = False
        if self.writer_task is not None:
            await self.writer_task
        assert self._file is not None
        self._file.close()
        self._file = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    async def _compression_worker(self) -> None:
        while True:
            item = await self.input_queue.get()
            try:
                if item is None:
                    return
                name, tensor, done = item
                try:
                    done.set_result(await asyncio.to_thread(self._packet, name, tensor))
                except Exception as e:  # handed to the writer, raised by stop_streaming
                    done.set_exception(e)
            finally:
                self.input_queue.task_done()

    def _packet(self, name: str, tensor: "torch.Tensor") -> bytes:
        name_b = name.encode("utf-8")
        payload, _ = self.compressor.compress_tensor(tensor)
        if len(name_b) > 0xFFFF or len(payload) > 0xFFFFFFFF:
            raise ValueError(f"{name!r}: a 1.3.1 packet holds a name of at most 65535 bytes and a payload of at "
                             f"most 4 GiB (name {len(name_b)}, payload {len(payload)} bytes)")
        return _HEADER.pack(len(name_b), len(payload)) + name_b + payload

    async def _writer(self) -> None:
        f = self._file
        assert f is not None
        while True:
            done = await self._order.get()
            if done is None:
                break
            try:
                packet: bytes = await done
            except Exception as e:
                if self._error is None:
                    self._error = e
                continue
            f.write(packet)
        f.flush()
