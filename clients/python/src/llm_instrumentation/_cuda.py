"""GPU tensors: DMA from device memory straight into the shared ring, off the model's path.

The ring mapping is registered once with ``cudaHostRegister`` so a ``non_blocking`` copy goes
directly into shared memory (no host staging buffer). The model's thread never waits for a
copy (docs/PROTOCOL.md 3, docs/GPU.md). Two ways, by size:

- **small tensors** (up to :data:`DIRECT_MAX`, e.g. every record of decoding): one
  asynchronous copy on the model's own stream — the cheapest call for the model's thread
  (decoding is bound by it), and whatever the model queues next (an in-place overwrite of
  this very tensor included) runs after it; the copy's device time is microseconds;
- **large tensors** (prefill): on the model's stream a device snapshot (device-to-device, at
  device-memory speed), then a side stream, ordered after it, copies the snapshot into the
  ring — the model's stream does not wait for the slower host link; the snapshot's memory
  returns to torch's allocator once that copy is done (``record_stream``).

The session publishes a record only once the event recorded after its copy has completed:
:meth:`CudaCopier.copied` polls without blocking (``cudaEventQuery``); :meth:`CudaCopier.wait`
blocks where the protocol must (TOKEN, CHECKPOINT, CLOSE, a full ring). Small copies share
one event per stream they were queued on (the stream current at each copy), recorded when the
session next publishes.

Small contiguous records of a layout seen before take the session's fast path: the C extension
writes the header and queues the payload as one ``cudaMemcpyAsync`` on the model's current
stream (:func:`raw_memcpy`), the same copy ``copy_`` would queue without its dispatch;
``STRAP_CUDA_RAW_COPY=0`` keeps every copy on ``copy_``.

Exercised on a GPU by ``bench/gpu_check.py`` (``make gpu-check``), not by the CPU test suite.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Optional, Set, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ._ring import Ring


#: Tensors of at most this many bytes are copied on the model's stream (see above): at
#: ~45 GB/s into the registered ring (H100, docs/GPU.md) 1 MiB holds the stream ~25 µs, less
#: than the side-stream path costs the model's thread.
DIRECT_MAX = 1 << 20


def _public_timing_event() -> Any:
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _bound_timing_event() -> Callable[[], Any]:
    """:func:`timing_event` through torch's C bindings: ``torch.cuda.Event.record()`` with no
    stream resolves the current stream in Python (``current_stream`` → device-index helpers
    → ``is_available``: 8 % of a MINIMAL decode's profile on an H100 host, docs/GPU.md);
    these are the calls it ends in."""
    import torch

    C = torch._C
    event, stream, record = C._CudaEventBase, C._CudaStreamBase, C._CudaEventBase.record
    get_device, get_stream = C._cuda_getDevice, C._cuda_getCurrentStream

    def timing_event() -> Any:
        ev = event(enable_timing=True)
        sid, dev, kind = get_stream(get_device())
        # torch's stub of the C base omits device_type; torch.cuda.current_stream passes it too
        record(ev, stream(stream_id=sid, device_index=dev, device_type=kind))  # type: ignore[call-arg]
        return ev

    return timing_event


_timing_event: Optional[Callable[[], Any]] = None

#: None until :func:`raw_memcpy` looked; then whether the C extension's Session.put_cuda has
#: a cudaMemcpyAsync bound.
_raw_bound: Optional[bool] = None


def cudart_paths(maps: str = "/proc/self/maps") -> Set[str]:
    """The CUDA runtime libraries (``libcudart.so*``) mapped into this process."""
    paths = set()
    try:
        with open(maps) as f:
            for line in f:
                i = line.find("/")
                if i >= 0 and "/libcudart.so" in line:
                    paths.add(line[i:].rstrip("\n"))
    except OSError:
        pass
    return paths


def bind_raw_memcpy(path: str) -> bool:
    """Bind the C extension's ``Session.put_cuda`` to ``cudaMemcpyAsync`` of the runtime at
    ``path`` (already loaded: opening it again returns the same library). False where the
    extension or the symbol is missing."""
    import ctypes

    try:
        from ._speedups import bind_cuda_memcpy
    except ImportError:
        return False
    try:
        fn = ctypes.CDLL(path).cudaMemcpyAsync
    except (OSError, AttributeError):
        return False
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if not addr:
        return False
    bind_cuda_memcpy(addr)
    return True


def raw_memcpy() -> bool:
    """Whether records may be queued by ``Session.put_cuda``: exactly one CUDA runtime is
    loaded (torch's, so the copies go on the streams torch made with it) and its
    ``cudaMemcpyAsync`` is bound. Looked at once per process; False where torch links the
    runtime statically (no libcudart mapped) or several are loaded."""
    global _raw_bound
    if _raw_bound is None:
        paths = cudart_paths()
        _raw_bound = len(paths) == 1 and bind_raw_memcpy(paths.pop())
    return _raw_bound


def timing_event() -> Any:
    """A timing-enabled CUDA event recorded now on the current device's current stream: what
    ``torch.cuda.Event(enable_timing=True).record()`` does, for a few µs instead of tens.
    Where torch's C bindings differ from what :func:`_bound_timing_event` expects, the public
    path is used from then on."""
    global _timing_event
    if _timing_event is not None:
        return _timing_event()
    try:
        fast = _bound_timing_event()
        ev = fast()
    except (AttributeError, TypeError, ValueError):
        fast = _public_timing_event
        ev = fast()
    _timing_event = fast
    return ev


def device_memory() -> Tuple[int, int, int]:
    """(allocated, reserved, peak allocated) bytes of torch's allocator on the current device:
    ``memory_allocated``, ``memory_reserved`` and ``max_memory_allocated`` in one reading of
    the allocator's statistics (each of those flattens the whole statistics dict in Python:
    ≈ 0.3 ms apiece on an H100 host)."""
    import torch

    try:
        st = torch._C._cuda_memoryStats(torch._C._cuda_getDevice())
        a, r = st["allocated_bytes"]["all"], st["reserved_bytes"]["all"]
        return int(a["current"]), int(r["current"]), int(a["peak"])
    except (AttributeError, KeyError, TypeError):
        return (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated())


def wait_event(ev: Any) -> None:
    """Wait until the CUDA event ``ev`` completed, polling it (``cudaEventQuery``) with short
    sleeps that free the interpreter lock, rather than ``cudaEventSynchronize``: that spins on
    a core and, called from Python, holds up the model's thread whenever it needs the lock."""
    if ev.query():
        return
    pause = 10e-6
    while not ev.query():
        time.sleep(pause)
        pause = min(pause * 2, 200e-6)


class CudaCopier:
    """Copies CUDA tensors into a ring mapping registered as pinned host memory, asynchronously.

    Each :meth:`copy` is followed by :meth:`pending` with the ring head after its record;
    :meth:`copied` and :meth:`wait` say up to which head the bytes have landed.
    """

    def __init__(self, ring: "Ring") -> None:
        import torch

        self._u8: Optional["torch.Tensor"] = ring.u8()
        self.ptr = ring.u8().data_ptr()
        self.size = ring.ring_size
        rc = torch.cuda.cudart().cudaHostRegister(self.ptr, self.size, 0)
        code = int(rc.value) if hasattr(rc, "value") else int(rc)
        if code != 0:
            raise RuntimeError(f"cudaHostRegister of the {self.size}-byte ring failed with cudaError {code}")
        self.registered = True
        #: One side stream per device index (a model may span devices).
        self._streams: Dict[int, Any] = {}
        #: (ring head after the record, sequence number of its last record, the copy's event),
        #: in ring order.
        self._inflight: Deque[Tuple[int, int, Any]] = deque()
        self._last_event: Any = None
        #: The streams (torch's (stream id, device index, device type)) that small copies were
        #: queued on and no event follows yet — the streams current at each copy, not at the
        #: publish: a model may run under ``torch.cuda.stream(s)`` — and (head, seq) after the
        #: last of them.
        self._direct: Set[Tuple[int, int, int]] = set()
        self._direct_head: Optional[Tuple[int, int]] = None
        self._just_direct = False
        #: Small records may be queued by the C extension (:meth:`raw_stream`); each session
        #: also reads ``STRAP_CUDA_RAW_COPY`` (this copier outlives it with a kept ring).
        self.raw = raw_memcpy()
        #: torch's stream triple -> the raw ``cudaStream_t`` (as an int).
        self._raw_streams: Dict[Tuple[int, int, int], int] = {}

    def copy(self, dst: "torch.Tensor", src: "torch.Tensor", private: bool = False) -> None:
        """Queue the copy of ``src`` (CUDA) into ``dst`` (a view of the ring); returns at once.

        The bytes land when an event recorded after the copy completes; the caller passes the
        ring head after the record to :meth:`pending` before publishing anything. ``private``:
        ``src`` belongs to the caller alone (an fp8 payload coded on the model's stream), so a
        large copy takes no snapshot of it."""
        import torch

        if src.numel() * src.element_size() <= DIRECT_MAX:
            dst.copy_(src, non_blocking=True)  # on src's device's current stream: the model's
            self._direct.add(torch._C._cuda_getCurrentStream(src.get_device()))
            self._just_direct = True
            return
        self._seal()  # the small copies before this record come first in ring order
        idx = src.get_device()
        side = self._streams.get(idx)
        if side is None:
            side = self._streams[idx] = torch.cuda.Stream(device=idx)
        # The value at the hook's moment, on the model's stream: whatever the model queues
        # next (an in-place op on this very tensor included) runs after this snapshot.
        snap = src if private else src.clone(memory_format=torch.contiguous_format)
        side.wait_stream(torch.cuda.current_stream(idx))
        with torch.cuda.stream(side):
            dst.copy_(snap, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        snap.record_stream(side)
        self._last_event = ev

    def raw_stream(self, src: "torch.Tensor") -> Optional[Tuple[Tuple[int, int, int], int]]:
        """For a small contiguous record of ``src`` queued by ``Session.put_cuda``: the current
        stream of its device (torch's triple, for :meth:`queued_raw`) and its raw handle; None
        where it must go through :meth:`copy` (not on the current device). The session sends
        only records of at most 64 KiB here (its layouts' ``memmove``), below :data:`DIRECT_MAX`."""
        import torch

        dev = src.get_device()
        if dev != torch._C._cuda_getDevice():
            return None
        key = torch._C._cuda_getCurrentStream(dev)
        raw = self._raw_streams.get(key)
        if raw is None:
            raw = self._raw_streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                             device_type=key[2]).cuda_stream
        return key, raw

    def queued_raw(self, key: Tuple[int, int, int], head: int, seq: int) -> None:
        """A small record was queued on stream ``key`` by ``Session.put_cuda``: as :meth:`copy`
        then :meth:`pending` for it."""
        self._direct.add(key)
        self._direct_head = (head, seq)

    def pending(self, head: int, seq: int) -> None:
        """The records up to ring ``head`` (last sequence number ``seq``) wait for the copy
        queued last."""
        if self._just_direct:
            self._direct_head = (head, seq)
            self._just_direct = False
        elif self._last_event is not None:
            self._inflight.append((head, seq, self._last_event))
            self._last_event = None

    def _seal(self) -> None:
        """Record the event after the small copies queued on the model's streams so far."""
        if self._direct_head is None:
            return
        import torch

        head, seq = self._direct_head
        for sid, dev, kind in sorted(self._direct):
            ev = torch.cuda.Event()
            ev.record(torch.cuda.Stream(stream_id=sid, device_index=dev, device_type=kind))
            self._inflight.append((head, seq, ev))
        self._direct.clear()
        self._direct_head = None

    @property
    def busy(self) -> bool:
        """True while some copy is not known to have completed."""
        return bool(self._inflight) or self._direct_head is not None

    def copied(self) -> Optional[Tuple[int, int]]:
        """(head, seq) of the furthest record whose copy and every earlier one completed, or
        None when the oldest copy has not; never blocks."""
        self._seal()
        done = None
        q = self._inflight
        while q and q[0][2].query():
            head, seq, _ = q.popleft()
            done = (head, seq)
        return done

    def wait(self) -> Optional[Tuple[int, int]]:
        """Block until every queued copy completed; (head, seq) of the last one, or None when
        none was queued. Polls with short sleeps rather than ``cudaEventSynchronize``, so the
        interpreter lock is free for other threads meanwhile."""
        self._seal()
        q = self._inflight
        if not q:
            return None
        last = q[-1]
        while q:  # each event, not only the last: copies on several devices' streams
            wait_event(q.popleft()[2])
        return last[0], last[1]

    def close(self) -> None:
        """Wait for the copies still queued, then unregister the ring mapping."""
        if self.registered:
            import torch

            self.wait()
            for s in self._streams.values():
                s.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.registered = False
        self._inflight.clear()
        self._u8 = None  # the ring's mapping can be closed: no view of it left here
