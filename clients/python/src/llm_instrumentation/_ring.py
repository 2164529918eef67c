"""The shared-memory ring of docs/PROTOCOL.md section 2: a sealed memfd the client writes
records into and strapd reads after each PUBLISH.

Layout: a 4096-byte ``RingHeader`` then ``data_size`` bytes of records. Positions only grow;
position ``p`` lives at file offset ``4096 + p % data_size``. Records start and end on
64-byte boundaries and never wrap (a PAD record fills the end of the region instead).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

RING_MAGIC = b"SRNG"
RING_VERSION = 1
HEADER_SIZE = 4096
RING_HEADER = struct.Struct("<4sIQQQ")
#: RingHeader offset of the published cursor (docs/PROTOCOL.md 1.4, 2)
PUBLISHED_OFFSET = 32

REC_MAGIC = b"SREC"
KIND_TENSOR = 1
KIND_PAD = 2
#: a generated token written into the ring (PROTOCOL.md 2, "TOKEN records"; OPENED ring_tokens)
KIND_TOKEN = 3
FLAG_PART = 1
#: magic, kind, dtype, ndim, seq, record_len, step, forward, payload_off, payload_len,
#: name_len, flags, meta_len, part_offset, tensor_len
RECORD = struct.Struct("<4sHBBQQQQQQHHIQQ")
assert RECORD.size == 80
MAX_NAME = 4096
MAX_META = 65536
MAX_NDIM = 8
#: the longest token text a TOKEN record carries
MAX_TOKEN_TEXT = 65536

#: Linux 5.14+: fault pages in writable without touching them (not in every Python's mmap).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: On the ring's first lap its pages are populated this far ahead of the head at a time: one
#: madvise for 1024 pages costs less than 1024 page faults taken one by one inside the copies.
POPULATE_CHUNK = 4 << 20
_ALL = 1 << 62

F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x0001)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)


def align64(n: int) -> int:
    """Round ``n`` up to a multiple of 64."""
    return (n + 63) & ~63


def encode_ring_header(ring_size: int) -> bytes:
    """Return the 4096-byte RingHeader for a ring of ``ring_size`` bytes."""
    data_size = ring_size - HEADER_SIZE
    if data_size <= 0 or data_size % 64:
        raise ValueError(f"ring_size {ring_size}: data region {data_size} must be > 0 and a multiple of 64")
    hdr = RING_HEADER.pack(RING_MAGIC, RING_VERSION, ring_size, HEADER_SIZE, data_size)
    return hdr + bytes(HEADER_SIZE - len(hdr))


def header_area(ndim: int, name: bytes, meta: bytes) -> int:
    """Bytes from a record's start to its payload (``payload_off``): 64-aligned."""
    return align64(RECORD.size + 8 * ndim + len(name) + len(meta))


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

    Returns:
        ``payload_off`` bytes.
    """
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise ValueError(f"tensor has {ndim} dimensions; the ring carries at most {MAX_NDIM}")
    if not 1 <= len(name) <= MAX_NAME:
        raise ValueError(f"module name of {len(name)} bytes (allowed 1..{MAX_NAME})")
    if len(meta) > MAX_META:
        raise ValueError(f"record meta of {len(meta)} bytes exceeds {MAX_META}")
    payload_off = header_area(ndim, name, meta)
    if tensor_len is None:
        tensor_len = payload_len
    fixed = RECORD.pack(
        REC_MAGIC, KIND_TENSOR, dtype, ndim, seq, record_len, step, forward, payload_off,
        payload_len, len(name), FLAG_PART if part else 0, len(meta), part_offset, tensor_len,
    )
    body = fixed + struct.pack(f"<{ndim}Q", *shape) + name + meta
    return body + bytes(payload_off - len(body))


def token_record_len(text_len: int) -> int:
    """Ring bytes of a TOKEN record whose text is ``text_len`` bytes: 128 + the text, 64-aligned."""
    return 128 + align64(text_len)


def encode_token_record(*, seq: int, index: int, token_id: int, position: int, text: bytes) -> bytes:
    """Encode a whole TOKEN record (PROTOCOL.md 2): the token's index in ``step``, its
    position in ``forward`` and its id in ``part_offset`` (both two's complement), the
    UTF-8 text as payload at offset 128; the other fields zero.

    Raises:
        ValueError: the text is longer than :data:`MAX_TOKEN_TEXT`.
    """
    if len(text) > MAX_TOKEN_TEXT:
        raise ValueError(f"token text of {len(text)} bytes exceeds {MAX_TOKEN_TEXT}")
    n = token_record_len(len(text))
    fixed = RECORD.pack(REC_MAGIC, KIND_TOKEN, 0, 0, seq, n, index, position & 0xFFFFFFFFFFFFFFFF, 128,
                        len(text), 0, 0, 0, token_id & 0xFFFFFFFFFFFFFFFF, 0)
    return fixed + bytes(128 - RECORD.size) + text + bytes(n - 128 - len(text))


def encode_pad_header(record_len: int) -> bytes:
    """Encode a PAD record's 80-byte header (only magic, kind and record_len are set)."""
    return RECORD.pack(REC_MAGIC, KIND_PAD, 0, 0, 0, record_len, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def parse_record_header(buf: Any, off: int = 0) -> dict:
    """Decode a record header (tests and debugging). Returns a dict of its fields."""
    (magic, kind, dtype, ndim, seq, record_len, step, forward, payload_off, payload_len,
     name_len, flags, meta_len, part_offset, tensor_len) = RECORD.unpack_from(buf, off)
    p = off + RECORD.size
    shape = struct.unpack_from(f"<{ndim}Q", buf, p) if kind == KIND_TENSOR else ()
    p += 8 * len(shape)
    name = bytes(buf[p:p + name_len]).decode() if kind == KIND_TENSOR else ""
    p += name_len
    meta = bytes(buf[p:p + meta_len]) if kind == KIND_TENSOR else b""
    return dict(magic=magic, kind=kind, dtype=dtype, ndim=ndim, seq=seq, record_len=record_len,
                step=step, forward=forward, payload_off=payload_off, payload_len=payload_len,
                name_len=name_len, flags=flags, meta_len=meta_len, part_offset=part_offset,
                tensor_len=tensor_len, shape=tuple(shape), name=name, meta=meta)


class Ring:
    """A sealed memfd ring mapped read-write by the client.

    Attributes:
        fd: the memfd (sent to strapd in OPEN).
        ring_size: total bytes.
        data_size: bytes of the record region.
        head: next write position (bytes written since the start, never wraps).
        tail: newest position released by strapd.
    """

    def __init__(self, ring_size: int, name: str = "strap-ring") -> None:
        if ring_size <= HEADER_SIZE or (ring_size - HEADER_SIZE) % 64:
            raise ValueError(f"ring_size {ring_size} must be 4096 + a positive multiple of 64")
        self.ring_size = ring_size
        self.data_size = ring_size - HEADER_SIZE
        self.head = 0
        self.tail = 0
        self._u8: Optional["torch.Tensor"] = None
        self._addr = 0
        #: the process that made the ring: a forked child shares its pages and must not reuse it
        self.pid = os.getpid()
        #: data-region bytes from the start already populated (first lap only; then past any head)
        self.populated = 0
        #: The :class:`~._cuda.CudaCopier` that registered this mapping with CUDA, or None: the
        #: registration (≈ 140 ms for a 1 GiB ring on an H100 host) lives as long as the
        #: mapping, across the captures that reuse the ring; :meth:`close` undoes it.
        self.cuda: Any = None
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, ring_size)
            self.mm = mmap.mmap(self.fd, ring_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.mm[:HEADER_SIZE] = encode_ring_header(ring_size)
            fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        except BaseException:
            os.close(self.fd)
            raise

    # ----- space -----------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Bytes written but not yet released."""
        return self.head - self.tail

    def placement(self, record_len: int) -> Tuple[int, int]:
        """Return ``(pad_len, needed)`` for a record written at the current head: the PAD
        needed first (0 if the record fits before the end of the region) and the total bytes
        of free space it takes."""
        off = self.head % self.data_size
        pad = self.data_size - off if off + record_len > self.data_size else 0
        return pad, pad + record_len

    def fits(self, needed: int) -> bool:
        """Whether ``needed`` bytes can be written now without overwriting unreleased data."""
        return self.used + needed <= self.data_size

    def release(self, tail: int) -> None:
        """Apply a RELEASE: tails only grow and never pass the head (PROTOCOL.md 3).

        Raises:
            ValueError: ``tail`` is past the head, or behind the tail already released (the
                daemon would be reading bytes it gave back: a protocol error, not ignored).
        """
        if tail > self.head:
            raise ValueError(f"strapd released the ring up to {tail}, past the head {self.head} the client "
                             f"published (a RELEASE may not pass the head, PROTOCOL.md 3)")
        if tail < self.tail:
            raise ValueError(f"strapd moved the ring's tail backwards, from {self.tail} to {tail} (tails only "
                             f"grow, PROTOCOL.md 3)")
        self.tail = tail

    def populate(self, end: int) -> None:
        """Populate the ring's pages up to data position ``end`` (and a chunk beyond) before
        the first lap writes there. Only a speed-up: where the kernel cannot, the writes
        fault the pages in themselves."""
        if end <= self.populated:
            return
        start = self.populated
        stop = min(self.data_size, max(end, start + POPULATE_CHUNK))
        first = (HEADER_SIZE + start) & ~(mmap.PAGESIZE - 1)
        try:
            self.mm.madvise(MADV_POPULATE_WRITE, first, HEADER_SIZE + stop - first)
        except OSError:
            stop = self.data_size  # no MADV_POPULATE_WRITE here: never try again
        # Once the whole region is populated, no position (head never wraps) asks again.
        self.populated = stop if stop < self.data_size else _ALL

    # ----- writing ---------------------------------------------------------------------------

    def _file_off(self, pos: int) -> int:
        return HEADER_SIZE + pos % self.data_size

    def write_pad(self, pad_len: int) -> None:
        """Write a PAD record of ``pad_len`` bytes at the head and advance it."""
        off = self._file_off(self.head)
        # A PAD may be a single 64-byte slot at the very end of the region: its header's zero
        # tail (bytes 64-79) would then run past the mapping. The daemon reads only magic,
        # kind and record_len of a PAD.
        hdr = encode_pad_header(pad_len)[:pad_len]
        self.mm[off:off + len(hdr)] = hdr
        self.head += pad_len

    def write_header(self, hdr: bytes) -> int:
        """Write a record's header area at the head; return the record's file offset."""
        off = self._file_off(self.head)
        self.mm[off:off + len(hdr)] = hdr
        return off

    def write_raw(self, file_off: int, data: bytes) -> None:
        """Copy ``data`` into the mapping at ``file_off`` (tests, tiny payloads)."""
        self.mm[file_off:file_off + len(data)] = data

    def u8(self) -> "torch.Tensor":
        """A ``torch.uint8`` view of the whole mapping (created once, no copy)."""
        if self._u8 is None:
            import warnings

            import torch

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # mmap buffers are writable; torch warns anyway
                self._u8 = torch.frombuffer(self.mm, dtype=torch.uint8)
        return self._u8

    def address(self) -> int:
        """The mapping's address, for copying with ``memmove``; valid while the ring is open
        (the :meth:`u8` view it comes from keeps the mapping exported until :meth:`close`)."""
        if self._addr == 0:
            self._addr = self.u8().data_ptr()
        return self._addr

    def reset(self) -> None:
        """Start again at position 0 for a new session (:func:`take_ring`). The pages stay
        populated; the old records stay in them until overwritten, and the daemon reads only
        what the new session publishes. The published cursor goes back to 0 (unused): the
        header's reserved bytes must be zero at OPEN, and the last session's cursor means
        nothing to the next one."""
        self.head = self.tail = 0
        self.mm[PUBLISHED_OFFSET:PUBLISHED_OFFSET + 8] = bytes(8)

    def close(self) -> None:
        """Unmap and close the memfd (idempotent); a CUDA registration of the mapping is
        undone first, once the copies into it are done."""
        cuda, self.cuda = self.cuda, None
        if cuda is not None:
            cuda.close()
        self._addr = 0
        self._u8 = None
        if getattr(self, "mm", None) is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a view still exists somewhere; the mapping goes with the last reference
            self.mm = None  # type: ignore[assignment]
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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
