"""The shared-memory ring of docs/PROTOCOL.md section 2: a sealed memfd the client writes
records into and strapd reads after each PUBLISH.

Layout: a 4096-byte ``RingHeader`` then ``data_size`` bytes of records. Positions only grow;
position ``p`` lives at file offset ``4096 + p % data_size``. Records start and end on
64-byte boundaries and never wrap (a PAD record fills the end of the region instead).

The layout itself — the constants, and the encoders of the ring header and of TENSOR, PAD and
TOKEN records — is libstrap's (``clients/c/common/strap_ring.h``), and so is the ring: the
sealed memfd, its mapping, head and tail, the PADs, the populated pages and a RELEASE's checks
(``strap_ringbuf.h``), all compiled into the ``_speedups`` extension. This module names them
for the session and keeps what is the Python client's own: the torch view of the mapping, its
CUDA registration, and the idle ring of a process.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

try:
    from . import _speedups as _c
except ImportError as e:  # pragma: no cover - a source install without a C compiler
    raise ImportError(
        "llm_instrumentation._speedups is missing: the ring is written by this C extension. The wheels carry it "
        "compiled; an install from source needs a C compiler (gcc or clang) and Python's headers "
        f"(clients/python/README.md): {e}") from e

if TYPE_CHECKING:  # pragma: no cover
    import torch

HEADER_SIZE: int = _c.HEADER_SIZE
RING_VERSION: int = _c.RING_VERSION
#: RingHeader offset of the published cursor (docs/PROTOCOL.md 1.4, 2)
PUBLISHED_OFFSET: int = _c.PUBLISHED_OFFSET
#: a record's fixed header (shape, name and meta follow)
RECORD_FIXED: int = _c.RECORD_FIXED
KIND_TENSOR: int = _c.KIND_TENSOR
KIND_PAD: int = _c.KIND_PAD
#: a generated token written into the ring (PROTOCOL.md 2, "TOKEN records"; OPENED ring_tokens)
KIND_TOKEN: int = _c.KIND_TOKEN
FLAG_PART: int = _c.FLAG_PART
#: the payload is the tensor already coded as fp8 (PROTOCOL.md 2, "FP8 records")
FLAG_FP8: int = _c.FLAG_FP8
MAX_NAME: int = _c.MAX_NAME
MAX_META: int = _c.MAX_META
MAX_NDIM: int = _c.MAX_NDIM
#: the longest token text a TOKEN record carries
MAX_TOKEN_TEXT: int = _c.MAX_TOKEN_TEXT

#: Return the 4096-byte RingHeader for a ring of ``ring_size`` bytes (ValueError unless
#: 4096 + a positive multiple of 64).
encode_ring_header = _c.encode_ring_header
#: Encode a PAD record's 80-byte header (only magic, kind and record_len are set).
encode_pad_header = _c.encode_pad_header
#: Ring bytes of a TOKEN record whose text is ``text_len`` bytes: 128 + the text, 64-aligned.
token_record_len = _c.token_record_len


def align64(n: int) -> int:
    """Round ``n`` up to a multiple of 64."""
    return (n + 63) & ~63


def header_area(ndim: int, name: bytes, meta: bytes) -> int:
    """Bytes from a record's start to its payload (``payload_off``): 64-aligned."""
    return _c.header_area(ndim, len(name), len(meta))


def encode_record_header(
    *,
    dtype: int,
    shape: Sequence[int],
    seq: int,
    record_len: int,
    step: int,
    forward: int,
    payload_len: int,
    name: bytes,
    meta: bytes = b"",
    part_offset: int = 0,
    tensor_len: Optional[int] = None,
    part: bool = False,
    fp8: bool = False,
) -> bytes:
    """Encode a TENSOR record's header area (fixed part, shape, name, meta), zero-padded to
    ``payload_off``.

    Args:
        dtype: wire dtype id.
        shape: the whole tensor's shape.
        seq: the record's sequence number (≥ 1).
        record_len: bytes to the next record (multiple of 64).
        step: tokens recorded before the forward pass.
        forward: forward-pass counter.
        payload_len: raw payload bytes in this record.
        name: UTF-8 module name (1–4096 bytes).
        meta: UTF-8 JSON object or empty.
        part_offset: offset of this payload within the tensor (PART only).
        tensor_len: whole tensor bytes (default ``payload_len``).
        part: set the PART flag.
        fp8: set the FP8 flag: the payload is the tensor coded as fp8 (PROTOCOL.md 2, "FP8
            records"); ``tensor_len`` is then the tensor's raw bytes.

    Returns:
        ``payload_off`` bytes.

    Raises:
        ValueError: more than 8 dimensions, a name of 0 or over 4096 bytes, meta over 64 KiB.
    """
    return _c.encode_record_header(dtype, shape, seq, record_len, step, forward, payload_len, name, meta,
                                   part_offset, payload_len if tensor_len is None else tensor_len,
                                   FLAG_FP8 if fp8 else int(part))


def encode_token_record(*, seq: int, index: int, token_id: int, position: int, text: bytes) -> bytes:
    """Encode a whole TOKEN record (PROTOCOL.md 2): the token's index in ``step``, its
    position in ``forward`` and its id in ``part_offset`` (both two's complement), the
    UTF-8 text as payload at offset 128; the other fields zero.

    Raises:
        ValueError: the text is longer than :data:`MAX_TOKEN_TEXT`.
    """
    return _c.encode_token_record(seq, index, token_id, position, text)


def parse_record_header(buf: Any, off: int = 0) -> dict:
    """Decode a record header (tests and debugging). Returns a dict of its fields."""
    return _c.parse_record_header(buf, off)


class Ring(_c.Ring):
    """A sealed memfd ring mapped read-write by the client: libstrap's ring
    (``clients/c/common/strap_ringbuf.h``, the ``_speedups.Ring`` type), plus what only the
    Python client needs of it: a torch view of the mapping, the CUDA registration, and the
    process that made it.

    Attributes (the C type's):
        fd: the memfd (sent to strapd in OPEN).
        ring_size: total bytes.
        data_size: bytes of the record region.
        head: next write position (bytes written since the start, never wraps).
        tail: newest position released by strapd (:meth:`release`).
        populated: data bytes from the start already populated.
    """

    def __init__(self, ring_size: int, name: str = "strap-ring") -> None:
        #: the process that made the ring: a forked child shares its pages and must not reuse it
        self.pid = os.getpid()
        self._u8: Optional["torch.Tensor"] = None
        #: The :class:`~._cuda.CudaCopier` that registered this mapping with CUDA, or None: the
        #: registration (≈ 140 ms for a 1 GiB ring on an H100 host) lives as long as the
        #: mapping, across the captures that reuse the ring; :meth:`close` undoes it.
        self.cuda: Any = None

    def _bytes(self) -> Any:
        """A ctypes array over the whole mapping that keeps the mapping (:attr:`mapping`, the
        C object that unmaps it when it goes) alive while any view of it lives. It holds the
        mapping, not the ring: the ring caches a view (:meth:`u8`), and a ring held by its
        own view would be a cycle the collector cannot see through torch's storage."""
        arr = (ctypes.c_uint8 * self.ring_size).from_address(self.base)
        arr._mapping = self.mapping
        return arr

    @property
    def mm(self) -> memoryview:
        """A writable memoryview of the whole mapping (tests and debugging)."""
        return memoryview(self._bytes())

    def u8(self) -> "torch.Tensor":
        """A ``torch.uint8`` view of the whole mapping (created once, no copy)."""
        if self._u8 is None:
            import warnings

            import torch

            if self.closed:
                raise ValueError("the ring is closed")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the buffer is writable; torch warns anyway
                self._u8 = torch.frombuffer(self._bytes(), dtype=torch.uint8)
        return self._u8

    def address(self) -> int:
        """The mapping's address, for copying with ``memmove``; valid while the ring lives."""
        return int(self.base)

    def close(self) -> None:
        """Close the memfd (idempotent); a CUDA registration of the mapping is undone first,
        once the copies into it are done. The mapping goes with the last view of it."""
        cuda, self.cuda = self.cuda, None
        if cuda is not None:
            cuda.close()
        self._u8 = None  # the mapping goes with the last view (and the ring)
        super().close()


# ----- one idle ring per process -----------------------------------------------------------------

#: Seconds a ring is kept after a clean close for the next capture of the same process. A
#: fresh ring costs its first lap: every page written is allocated and zeroed by the kernel
#: (about 2.5 µs a page even populated in bulk: 33 ms for the 48 MiB of one 512-token
#: forward pass of the benchmark model), and closing it frees them again (about 10 ms).
#: A process that captures again within this time reuses the pages; one that does not
#: gets its memory back when the time is up.
IDLE_KEEP_S = 30.0

_idle_lock = threading.Lock()
_idle: Optional[Ring] = None
_idle_timer: Optional[threading.Timer] = None


def take_ring(ring_size: int) -> Ring:
    """A ring of ``ring_size`` bytes at position 0: the idle ring this process kept, when it
    has that size, else a new one.

    Args:
        ring_size: total bytes (header included).

    Returns:
        the ring; the caller owns it until it closes it or passes it to :func:`keep_ring`.
    """
    global _idle
    with _idle_lock:
        ring, _idle = _idle, None
        _cancel_timer()
    if ring is not None:
        if ring.ring_size == ring_size and ring.pid == os.getpid() and ring.fd >= 0:
            ring.reset()
            return ring
        ring.close()  # in a forked child this closes the child's copies only
    return Ring(ring_size)


def keep_ring(ring: Ring) -> None:
    """Keep ``ring`` for the next :func:`take_ring` of this process, for at most
    :data:`IDLE_KEEP_S` seconds; a ring kept before is closed. Only a ring whose session
    ended cleanly (the daemon answered CLOSED, so it reads it no more) may be kept."""
    global _idle, _idle_timer
    timer = threading.Timer(IDLE_KEEP_S, _expire, args=(ring,))
    timer.daemon = True  # never keeps the interpreter alive
    with _idle_lock:
        old, _idle = _idle, ring
        _cancel_timer()
        _idle_timer = timer
        timer.start()
    if old is not None and old is not ring:
        old.close()


def release_idle_ring() -> None:
    """Close the idle ring now, if this process keeps one (its pages go back at once)."""
    global _idle
    with _idle_lock:
        ring, _idle = _idle, None
        _cancel_timer()
    if ring is not None:
        ring.close()


def _expire(ring: Ring) -> None:
    global _idle
    with _idle_lock:
        if _idle is not ring:
            return  # taken, or replaced, in the meantime
        _idle = None
    ring.close()


def _cancel_timer() -> None:
    global _idle_timer
    if _idle_timer is not None:
        _idle_timer.cancel()
        _idle_timer = None
