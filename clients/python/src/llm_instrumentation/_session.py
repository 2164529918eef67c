"""One capture session: a :class:`~._ring.Ring` plus the control connection that publishes
records into it (docs/PROTOCOL.md 1.3–1.4).

From OPENED on the session is libstrap's (``clients/c/src/session.c``, compiled into
``_speedups`` and bound by ``_speedups_session.c``): it hands out sequence numbers, makes room
at the head (a PAD first where a record would cross the end of the region; RELEASEs drained;
waiting for space, or under policy ``drop`` dropping a whole tensor before its first record
with one DROP of its ``tensor_len``, never a part of it), publishes in batches (one
``PUBLISH{head, seq}`` once the unpublished bytes reach ``publish_bytes``, at the end of each
forward pass, and before anything that must follow the records in sequence order), defers a
generating pass's PUBLISH to the next TOKEN through the published cursor, writes tokens into
the ring as TOKEN records where strapd takes them, and sends CHECKPOINT and CLOSE. Records of
CUDA tensors are named by no message before their copies completed: the session asks this
module's copier (:mod:`._cuda`) for the completed prefix.

What is here is the tensors: per module output, the encoded header and sizes kept while its
dtype and shape stay (a small record is one C call, ``Session.put``: the header, a
``memmove`` of the payload, the head moved on); other records claimed at the head, written
here (one ``copy_`` from the live tensor into the mapping, asynchronous for a CUDA tensor),
then advanced; tensors whose record would exceed a quarter of the data region as PART
records; FP8 records coded on the device.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from . import _daemon
from ._dtypes import dtype_size, torch_dtype_id
from ._ring import (HEADER_SIZE, Ring, align64, encode_record_header,
                    header_area, keep_ring, take_ring)
from ._ring import _c as _speedups  # imported by _ring, which says what is missing without it
from .errors import StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError, StrapdWriteError

if TYPE_CHECKING:  # pragma: no cover
    import torch


#: Which tensors the client codes as fp8 itself when the session's codec is ``fp8``
#: (``STRAP_FP8_CLIENT``; docs/COMPRESSION.md 10.1, "Coded on the device"): ``cuda`` (the
#: default: CUDA tensors, coded on their GPU before the device-to-host copy), ``all`` (CPU
#: tensors too), ``off`` (strapd codes everything).
FP8_CLIENT_MODES = ("cuda", "all", "off")
#: CUDA tensors below this size go raw, for strapd to code: coding one is some twenty kernel
#: launches on the model's stream, more than a decoding step's small records are worth (their
#: bytes are few); the packets are the same either way.
FP8_DEVICE_MIN = 64 << 10

#: Tensors up to this size are copied with one ``memmove`` from their data pointer. Below it
#: torch's ``copy_`` dispatch and the three ring views it needs cost more than the bytes; above
#: it ``copy_`` is faster, using torch's intra-op threads (docs/PERFORMANCE.md section 5).
SMALL_COPY = 64 << 10

#: The hooks' fast path in record() is libstrap's session's own call, Session.put (put_cuda for
#: a small CUDA tensor: the payload one queued cudaMemcpyAsync, _cuda.py): the cached header
#: area, seq, record_len, step and forward, the payload, the space checked and the head moved
#: (libstrap's strap_ring.h; the session never writes a header field itself). Tests set
#: _c_write_record to None to send records through write_tensor instead.
_c_write_record: Optional[Callable[..., None]] = _speedups.write_record


class Opened(NamedTuple):
    """OPENED: the session's number, the codec's block size, the object strapd uploads the
    stream into ("" none), whether strapd takes the published cursor and TOKEN records."""

    session: int
    block_size: int
    upload: str
    published_cursor: bool
    ring_tokens: bool


class Closed(NamedTuple):
    """CLOSED: the stream is complete and synced."""

    packets: int
    drops: int
    bytes_in: int
    bytes_out: int
    file_bytes: int
    upload: Optional[str]

    def to_body(self) -> Dict[str, Any]:
        """CLOSED's body (its JSON object, no ``upload`` when there is none)."""
        return {k: v for k, v in self._asdict().items() if v is not None}


class Checkpointed(NamedTuple):
    """CHECKPOINTED: every packet up to ``seq`` is on disk (fields: PROTOCOL.md 1.4)."""

    seq: int
    offset: int
    packets: int
    drops: int
    tokens: int
    last_offset: int
    last_crc: int


class _Layout(NamedTuple):
    """What repeats between the records of one module output while its dtype and shape stay:
    the encoded header area (``seq``, ``step`` and ``forward`` zero, patched per record) and
    the sizes. Only tensors written as one whole record (not PART) have one."""

    dtype: Any  # torch.dtype
    size: Any  # torch.Size, compared with the next tensor's
    cls: type
    header: bytes
    hdr_area: int
    record_len: int
    tensor_len: int
    shape: Tuple[int, ...]
    memmove: bool


#: libstrap's claim modes (``Session.claim``, clients/c/src/attach.h) used here: room now or
#: nothing (record_sum); a tensor's record (no room drops it under policy drop, else waits).
CLAIM_NOW, CLAIM_POLICY = 0, 1

#: Ring tokens (PROTOCOL.md 1.4): a PUBLISH after this many tokens at most ...
RING_TOKENS_EVERY = 16
#: ... or this many seconds after the last message, whichever comes first: strapd is woken
#: about once per 16 tokens while decoding instead of once per token, and a live reader of
#: the stream (status, follow) lags it by at most that.
RING_TOKENS_SECONDS = 0.25


#: torch dtype -> ``_speedups.write_record_sum``'s element type; filled on first use (torch
#: is imported then, not at import time).
_SUM_TYPES: Dict[Any, int] = {}


def _sum_type(dtype: Any) -> Optional[int]:
    if not _SUM_TYPES:
        import torch

        _SUM_TYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    return _SUM_TYPES.get(dtype)


class CaptureSession:
    """Client side of one strapd session.

    From OPENED on the session is libstrap's (``clients/c/src/session.c``, bound as
    ``_speedups.Session``): sequence numbers, PUBLISH batching and the published cursor,
    RELEASE and backpressure, DROP, TOKEN messages and records, CHECKPOINT and CLOSE. What is
    left here is the tensors: their layouts, their copies into the ring, PART and FP8 records.

    Made by :func:`open_session` (libstrap's open); directly, over a connected socket and a
    ring (the tests' peers).

    Args:
        sock: the control connection after OPENED (closed by :meth:`shutdown`).
        ring: the ring sent.
        policy: ``"block"`` or ``"drop"``.
        stall_timeout: seconds to wait for ring space (or an answer) before raising
            :class:`StrapdTimeoutError` while the daemon is alive but not releasing.
        part_size: maximum record size for splitting (default: a quarter of the region).
        publish_bytes: unpublished bytes that trigger a PUBLISH without waiting for
            :meth:`flush` (default: an eighth of the region, at most 4 MiB), so the daemon
            starts on large tensors while the forward pass goes on.
        opened: libstrap's session and OPENED's facts, from :func:`open_session`.
    """

    def __init__(self, sock: socket.socket, ring: Ring, policy: str = "block",
                 stall_timeout: float = 120.0, part_size: Optional[int] = None,
                 publish_bytes: Optional[int] = None, opened: Optional[Tuple[Any, Dict[str, Any]]] = None) -> None:
        if policy not in ("block", "drop"):
            raise ValueError(f"policy {policy!r} is not 'block' or 'drop'")
        self.sock = sock
        self.ring = ring
        self.policy = policy
        self.stall_timeout = stall_timeout
        self.max_record = (part_size or ring.data_size // 4) // 64 * 64
        self.publish_bytes = max(64, publish_bytes or min(ring.data_size // 8, 4 << 20))
        if opened is not None:
            self.max_record, self.publish_bytes = opened[1]["max_record"], opened[1]["publish_bytes"]
        self._rt = (RING_TOKENS_EVERY, RING_TOKENS_SECONDS)
        #: libstrap's session (None after :meth:`shutdown`)
        self._s: Any = opened[0] if opened is not None else self._attach(0, 0, False, False)
        #: its state when it ended (:meth:`shutdown`): the counters stay readable
        self._final: Optional[Tuple[Any, ...]] = None
        self.drops_by_module: Dict[str, Dict[str, int]] = {}
        self.opened: Optional[Opened] = None
        self.closed_summary: Optional[Closed] = None
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        #: the ring's CUDA copier once this session copied from a CUDA tensor (:attr:`_cuda`)
        self._copier: Any = None
        #: Small CUDA records of a known layout go through Session.put_cuda (:meth:`record`).
        self._cuda_raw = False
        self._layouts: Dict[str, _Layout] = {}
        #: per name: the meta object of :meth:`record_meta`'s last record and its layout
        self._meta_layouts: Dict[str, Tuple[Dict[str, Any], _Layout]] = {}
        self._ring_addr = ring.address()
        self._shut = False
        #: The current forward pass's numbers, set by the capture as each pass begins; the
        #: hooks' :meth:`record` writes them into every record of the pass.
        self.step = 0
        self.forward = 0
        #: (block_size, bound) of a session whose codec is fp8 and whose client codes
        #: tensors itself (:attr:`fp8_client`); set at OPENED.
        self._fp8: Optional[Tuple[int, float]] = None
        mode = os.environ.get("STRAP_FP8_CLIENT", "cuda")
        if mode not in FP8_CLIENT_MODES:
            raise ValueError(f"STRAP_FP8_CLIENT={mode!r}: expected one of {', '.join(FP8_CLIENT_MODES)}")
        #: which tensors are coded as fp8 here rather than by strapd (FP8_CLIENT_MODES)
        self.fp8_client = mode
        #: records written coded as fp8 by this client
        self.fp8_records = 0

    # ----- libstrap's state ----------------------------------------------------------------------

    def _attach(self, seq: int, session_id: int, cursor: bool, ring_tokens: bool) -> Any:
        """libstrap's session over this connection and ring (``_speedups.Session``)."""
        return _speedups.Session(self.sock.fileno(), self.ring, self.policy, float(self.stall_timeout),
                                 self.max_record, self.publish_bytes, seq, session_id, cursor, ring_tokens, *self._rt)

    def _state(self) -> Tuple[Any, ...]:
        """``_speedups.Session.state()``, or the state it ended with."""
        return self._final if self._s is None else self._s.state()  # type: ignore[return-value]

    def _set_mode(self, cursor: int = -1, ring_tokens: int = -1, seq: int = -1) -> None:
        if self._s is not None:
            self._s.set_mode(cursor, ring_tokens, seq)

    #: the last sequence number taken (set: before any record, the tests' golden records)
    seq = property(lambda self: self._state()[0], lambda self, v: self._set_mode(seq=int(v)))
    last_tensor_seq = property(lambda self: self._state()[1], doc="the last record's sequence number")
    tokens = property(lambda self: self._state()[2], doc="tokens recorded by this session")
    packets = property(lambda self: self._state()[3], doc="records written into the ring")
    bytes_in = property(lambda self: self._state()[4], doc="payload bytes written into the ring")
    drops = property(lambda self: self._state()[5], doc="tensors dropped (policy drop)")
    drop_bytes = property(lambda self: self._state()[6], doc="bytes of the dropped tensors")
    published_head = property(lambda self: self._state()[7], doc="the head the last message named")
    _unsent_tokens = property(lambda self: self._state()[8])
    _cursor_at = property(lambda self: self._state()[9])
    #: the flow chosen at OPENED (set: the tests' comparisons of one flow with another)
    _cursor = property(lambda self: self._state()[12], lambda self, v: self._set_mode(cursor=int(bool(v))))
    _ring_tokens = property(lambda self: self._state()[13], lambda self, v: self._set_mode(ring_tokens=int(bool(v))))
    _deferred = property(lambda self: self._state()[14])

    def message_counts(self) -> Dict[str, int]:
        """Messages this session sent so far: ``publish`` (PUBLISH), ``token`` (TOKEN
        messages), ``token_head`` (TOKEN messages that named the records before them), and
        ``token_records`` (tokens written into the ring instead)."""
        st = self._state()
        return {"publish": st[11], "token": st[17], "token_head": st[18], "token_records": st[10]}

    @property
    def ring_tokens_every(self) -> int:
        """With ring tokens, a PUBLISH once this many tokens are unnamed by a message, or
        :attr:`ring_tokens_seconds` after the last message, whichever comes first; ``<= 1``
        keeps one TOKEN message per token (PROTOCOL.md 1.4)."""
        return self._rt[0]

    @ring_tokens_every.setter
    def ring_tokens_every(self, v: int) -> None:
        self._rt = (int(v), self._rt[1])
        if self._s is not None:
            self._s.set_ring_tokens(*self._rt)

    @property
    def ring_tokens_seconds(self) -> float:
        """See :attr:`ring_tokens_every`."""
        return self._rt[1]

    @ring_tokens_seconds.setter
    def ring_tokens_seconds(self, v: float) -> None:
        self._rt = (self._rt[0], float(v))
        if self._s is not None:
            self._s.set_ring_tokens(*self._rt)

    @property
    def _cuda(self) -> Any:
        """The ring's CUDA copier (:mod:`._cuda`) once this session copied from a CUDA tensor;
        set, libstrap's session asks it which records are complete before naming them."""
        return self._copier

    @_cuda.setter
    def _cuda(self, copier: Any) -> None:
        self._copier = copier
        if self._s is not None:
            self._s.set_frontier(None if copier is None else _frontier(copier))

    def _failed(self, e: Any) -> BaseException:
        """The client's exception for libstrap's ``SessionError``; one that ends the session
        (not a refused argument) is kept in :attr:`error`."""
        exc = _error(e)
        if not isinstance(exc, ValueError):
            self.error = exc
        return exc

    # ----- open / close ------------------------------------------------------------------------

    def close(self, timeout: Optional[float] = None, meanwhile: Optional[Callable[[], None]] = None,
              fds: Sequence[int] = ()) -> Closed:
        """Send CLOSE and wait for CLOSED.

        Args:
            timeout: seconds to wait (default: ``stall_timeout``, at least 60).
            meanwhile: called once CLOSE is sent, before waiting: work of the client's own
                (its tokens file, with its fsyncs) then overlaps the daemon's last writes
                and ``fdatasync`` instead of following them.
            fds: descriptors sent with CLOSE: the tokens file, read-only, when the session
                uploads (PROTOCOL.md 1.3; strapd uploads it beside the stream).

        Returns:
            the CLOSED body.
        """
        with self._lock:
            s = self._session()
            try:
                # CLOSE counts every record up to it: a later one (a hook on another thread)
                # would belong to no session; refused from now on, as after shutdown.
                s.close_send(list(fds))
                self._shut = True
                if meanwhile is not None:
                    meanwhile()
                c = s.close_wait(float(timeout or 0))
            except _speedups.SessionError as e:
                raise self._failed(e) from None
            self.closed_summary = Closed(packets=c[0], drops=c[1], bytes_in=c[2], bytes_out=c[3], file_bytes=c[4],
                                         upload=c[5] or None)
            return self.closed_summary

    def shutdown(self) -> None:
        """Release the socket and ring (after close, or to abandon the session). After a
        clean close the ring is kept for the process's next capture (:func:`~._ring.keep_ring`):
        the daemon answered CLOSED, so it reads the ring no more.

        Records are refused from :meth:`close` on (:meth:`record` and :meth:`write_tensor`
        return False without writing): a hook still running on another thread must not write
        into an unmapped ring, or into the ring kept for the next capture."""
        with self._lock:
            self._shut = True
            if self._s is not None:
                self._s.shut()
                self._final = self._s.state()
                self._s = None  # libstrap's session goes before the connection it used
        self.sock.close()
        # The ring's CUDA registration stays with the ring (Ring.cuda): a kept ring is reused
        # registered; Ring.close waits for any copy still running, then unregisters.
        self._cuda = None
        self._cuda_raw = False
        if self.closed_summary is not None and self.error is None:
            keep_ring(self.ring)
        else:
            self.ring.close()

    # ----- messages ----------------------------------------------------------------------------

    def send_resources(self, lines: Sequence[bytes]) -> int:
        """RESOURCES messages for the serialized events (libstrap packs them, as few as fit),
        sent beside the session's own from any thread: how many were sent."""
        s = self._s
        if s is None:
            raise StrapdConnectionError("the session was shut down")
        try:
            return s.send_resources(lines)
        except OSError as e:
            raise StrapdConnectionError(f"send RESOURCES to strapd: {e}") from e

    def _check(self) -> None:
        if self.error is not None:
            raise StrapdConnectionError(f"session already failed: {self.error}") from self.error

    def _session(self) -> Any:
        """libstrap's session, after :meth:`_check` (the lock is held)."""
        self._check()
        if self._s is None:
            raise StrapdConnectionError("the session was shut down")
        return self._s

    def drain(self) -> None:
        """Handle every pending message (RELEASE, ERROR) without blocking."""
        with self._lock:
            try:
                self._session().drain()
            except _speedups.SessionError as e:
                raise self._failed(e) from None

    def _publish(self, block: bool = True) -> None:
        """One PUBLISH covering every record written since the last one (none: no-op). A
        record copied from a CUDA tensor is published once its copy completed (:mod:`._cuda`):
        ``block`` waits for every queued copy; without it only the completed prefix goes."""
        with self._lock:
            try:
                self._session().publish(block)
            except _speedups.SessionError as e:
                raise self._failed(e) from None

    def flush(self) -> None:
        """The end of a forward pass of the model: publish every record written so far — or,
        while generating, leave them below the published cursor for the next TOKEN (or, with
        ring tokens, the PUBLISH that names several tokens' passes); records of CUDA tensors
        whose copies are still running go with the next publish."""
        with self._lock:
            try:
                self._session().flush()
            except _speedups.SessionError as e:
                raise self._failed(e) from None

    def record(self, name: str, t: "torch.Tensor", meta: Optional[Dict[str, Any]]) -> bool:
        """The capture hooks' callback: :meth:`write_tensor` with the current forward pass's
        :attr:`step` and :attr:`forward`.

        It runs once per hooked module output, between kernels that stream the model's
        weights through the caches, so its Python runs cold: every call and attribute
        lookup it saves counts. The common case — a whole record of a module output seen
        before with the same dtype and shape, in space known to be free before the end of
        the region — is written here by one call of the C extension (``_speedups.c``);
        anything else goes through :meth:`write_tensor`, which writes the same bytes
        (docs/PERFORMANCE.md, "Client cost per record inside decoding").
        """
        if self._fp8 is not None and self._fp8_wanted(t):
            return self.write_tensor(name, t, self.step, self.forward, meta)
        lay = self._layouts.get(name) if meta is None else None
        if lay is None or _c_write_record is None or lay.dtype is not t.dtype or lay.size != t.shape \
                or lay.cls is not type(t) or not lay.memmove or not t.is_contiguous():
            return self.write_tensor(name, t, self.step, self.forward, meta)
        raw = None
        if not t.is_cpu:
            # A small CUDA record: header and one queued cudaMemcpyAsync in one C call, when
            # the copier found the runtime (_cuda.py); else write_tensor's copy_.
            if not self._cuda_raw or not t.is_cuda:
                return self.write_tensor(name, t, self.step, self.forward, meta)
            raw = self._cuda.raw_stream(t)
            if raw is None:
                return self.write_tensor(name, t, self.step, self.forward, meta)
        rec_len = lay.record_len
        with self._lock:
            s = self._s
            if self._shut or self.error is not None or s is None:
                return self._write_locked(name, lay, t, self.step, self.forward, meta)
            try:
                # One C call: the check that the record needs nothing first (a PAD, space,
                # pages), the header, the payload (or its queued copy), the head moved on and,
                # for a CPU tensor, a PUBLISH once publish_bytes wait.
                if raw is None:
                    seq = s.put(lay.header, rec_len, self.step, self.forward, lay.hdr_area, t.data_ptr(),
                                lay.tensor_len)
                else:
                    seq = s.put_cuda(lay.header, rec_len, self.step, self.forward, lay.hdr_area, t.data_ptr(),
                                     lay.tensor_len, raw[1])
                if not seq:
                    return self._write_locked(name, lay, t, self.step, self.forward, meta)
                if raw is not None:
                    self._cuda.queued_raw(raw[0], self.ring.head, seq)
                    s.publish(False, True)
            except _speedups.SessionError as e:
                raise self._failed(e) from None
            return True

    def write_tensor(self, name: str, t: "torch.Tensor", step: int, forward: int,
                     meta: Optional[Dict[str, Any]] = None) -> bool:
        """Copy ``t`` into the ring as one record (or PART records) and publish it.

        Args:
            name: module name (with a ``.outN`` / ``.key`` suffix for secondary outputs).
            t: the tensor (any device; detached here, never modified).
            step: tokens recorded before this forward pass.
            forward: the forward-pass counter.
            meta: optional JSON-ready dict stored with the record.

        Returns:
            True when written, False when dropped under policy ``drop`` or refused after
            :meth:`shutdown`.

        Raises:
            StrapdConnectionError: the daemon went away.
            StrapdProtocolError: the daemon reported a fatal error.
            TypeError: the dtype cannot be captured.
        """
        if self._fp8 is not None and self._fp8_wanted(t):
            with self._lock:
                if self._shut:
                    return False
                self._session()
                try:
                    done = self._write_fp8(name, t, step, forward, meta)
                    if done is not None:
                        return done
                except _speedups.SessionError as e:
                    raise self._failed(e) from None
        lay = None
        if meta is None:
            lay = self._layouts.get(name)
            if lay is None or lay.dtype is not t.dtype or lay.size != t.shape or lay.cls is not type(t):
                lay = self._layout(name, t)
        with self._lock:
            return self._write_locked(name, lay, t, step, forward, meta)

    def _write_locked(self, name: str, lay: Optional[_Layout], t: "torch.Tensor", step: int, forward: int,
                      meta: Optional[Dict[str, Any]]) -> bool:
        if self._shut:
            return False
        self._session()
        try:
            return self._write_any(name, t, step, forward, meta)
        except _speedups.SessionError as e:
            raise self._failed(e) from None

    def _layout(self, name: str, t: "torch.Tensor", meta_b: bytes = b"") -> Optional[_Layout]:
        """Build and keep the layout of ``name``'s records for ``t``'s dtype and shape (and
        the encoded ``meta_b``, kept apart from the layouts of records without meta); None
        when ``t`` is not a plain strided tensor or needs PART records."""
        import torch

        cls = type(t)
        if (cls is not torch.Tensor and cls is not torch.nn.Parameter) or t.layout is not torch.strided:
            return None
        dt = torch_dtype_id(t.dtype)
        shape = tuple(int(s) for s in t.shape)
        tensor_len = t.numel() * dtype_size(dt)
        name_b = name.encode("utf-8")
        hdr_area = header_area(len(shape), name_b, meta_b)
        rec_len = align64(hdr_area + tensor_len)
        if rec_len > self.max_record:
            return None
        header = encode_record_header(dtype=dt, shape=shape, seq=0, record_len=rec_len, step=0, forward=0,
                                      payload_len=tensor_len, name=name_b, meta=meta_b)
        lay = _Layout(t.dtype, t.shape, cls, header, hdr_area, rec_len, tensor_len, shape,
                      tensor_len <= SMALL_COPY)
        if not meta_b:
            self._layouts[name] = lay
        return lay

    def record_meta(self, name: str, t: "torch.Tensor", meta: Dict[str, Any]) -> bool:
        """:meth:`record` for a record whose meta repeats: the same dict object, record after
        record (a tensor-parallel rank's shard descriptor, docs/DISTRIBUTED.md). Its layout,
        meta encoded in, is kept per name while the object stays the same, so such records
        take the whole-record path of records without meta instead of encoding the meta
        each time. Writes the same bytes as :meth:`write_tensor`."""
        ent = self._meta_layouts.get(name)
        lay = ent[1] if ent is not None and ent[0] is meta else None
        if lay is None or lay.dtype is not t.dtype or lay.size != t.shape or lay.cls is not type(t):
            lay = self._layout(name, t, json.dumps(meta, separators=(",", ":")).encode())
            if lay is None:
                return self.write_tensor(name, t, self.step, self.forward, meta)
            self._meta_layouts[name] = (meta, lay)
        with self._lock:
            s = self._s
            if _c_write_record is None or not lay.memmove or not t.is_cpu or not t.is_contiguous() \
                    or self._shut or self.error is not None or s is None:
                return self._write_locked(name, lay, t, self.step, self.forward, meta)
            try:
                if not s.put(lay.header, lay.record_len, self.step, self.forward, lay.hdr_area, t.data_ptr(),
                             lay.tensor_len):
                    return self._write_locked(name, lay, t, self.step, self.forward, meta)
            except _speedups.SessionError as e:
                raise self._failed(e) from None
            return True

    def _advance(self, rec_len: int, payload_len: int, seq: int) -> None:
        """The record claimed at the head is written (its CUDA copy queued, and counted by the
        copier before any publish can name it): the head moves on, a PUBLISH once due."""
        if self._copier is not None:
            self._copier.pending(self.ring.head + rec_len, seq)
        self._s.advance(rec_len, payload_len, True)

    def _fp8_wanted(self, t: "torch.Tensor") -> bool:
        """Whether ``t`` is coded as fp8 here (the session's codec is fp8)."""
        if t.dtype not in _fp8_dtypes():
            return False
        if t.is_cuda:
            # Under an error bound a part over it is stored losslessly by strapd, but coded
            # here its status is not read (that would stall the stream) and the record would
            # become a DROP: bounded sessions leave CUDA tensors to strapd.
            return self._fp8[1] == 0.0 and t.numel() * t.element_size() >= FP8_DEVICE_MIN  # type: ignore[index]
        return self.fp8_client == "all" and t.is_cpu

    def _write_fp8(self, name: str, t: "torch.Tensor", step: int, forward: int,
                   meta: Optional[Dict[str, Any]]) -> Optional[bool]:
        """Write ``t`` as an FP8 record: coded on its device (``_fp8_device.encode``, in the
        current stream's order), then copied into the ring like any payload; True when
        written, False when dropped (policy ``drop``). None (nothing written) where strapd
        must code it: a record too large for one ring record, or a CPU tensor that e4m3
        cannot carry as strapd's encoder would (the status word says so; a CUDA tensor's is
        not read here: strapd writes a DROP naming it)."""
        from . import _fp8_device as F

        block_size, bound = self._fp8  # type: ignore[misc]
        w = t.element_size()
        if block_size % w:
            return None
        shape = tuple(int(s) for s in t.shape)
        n = t.numel()
        name_b = name.encode("utf-8")
        meta_b = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
        hdr_area = header_area(len(shape), name_b, meta_b)
        plen = F.payload_len(n, F.parts(n, F.row_len(shape, n), block_size // w))
        if align64(hdr_area + plen) > self.max_record:
            return None  # before coding: a record over the ring's record size goes as PARTs
        payload = F.encode(t, block_size // w, bound)
        if t.is_cpu and F.status(payload):
            return None
        written = self._write_coded(name, name_b, meta_b, hdr_area, t, shape, step, forward, payload)
        self.fp8_records += written
        return written

    def _write_any(self, name: str, t: "torch.Tensor", step: int, forward: int,
                   meta: Optional[Dict[str, Any]]) -> bool:
        """Any tensor, by libstrap's write (``Session.write``): one record, or PART records
        where it exceeds the record size; a small contiguous CPU tensor's bytes copied by C
        from its data pointer, any other's by :meth:`_copy` into the ring (torch's ``copy_``,
        asynchronous for a CUDA tensor) as libstrap asks for each record's payload."""
        import torch

        dt = torch_dtype_id(t.dtype)
        shape = tuple(int(s) for s in t.shape)
        tensor_len = t.numel() * dtype_size(dt)
        meta_b = json.dumps(meta, separators=(",", ":")).encode() if meta else None
        src, copy = 0, None
        # (with CUDA copies in the session, every record is counted by the copier: one behind
        # a copy still running is not named before it)
        if self._copier is None and t.is_cpu and tensor_len <= SMALL_COPY \
                and type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout is torch.strided and t.is_contiguous():
            src = t.data_ptr()
        else:
            copy = self._payload_writer(t, shape, tensor_len)
        if self._s.write(name, dt, shape, tensor_len, meta_b, step, forward, src, copy):
            return True
        d = self.drops_by_module.setdefault(name, {"count": 0, "bytes": 0})
        d["count"] += 1
        d["bytes"] += tensor_len
        return False

    def _payload_writer(self, t: "torch.Tensor", shape: Tuple[int, ...], tensor_len: int) -> Callable[..., None]:
        """libstrap's copy callback for ``t``: the payload of the record at ``dst`` (the whole
        tensor, or the PART from byte ``off``), its CUDA copy counted by the copier before
        libstrap can name the record."""
        flat: List[Any] = []
        base = self._ring_addr

        def write(dst: int, off: int, n: int, seq: int, end: int) -> None:
            start = dst - base
            u8 = self.ring.u8()[start:start + n]
            if n == tensor_len:
                self._copy(u8.view(t.dtype).view(shape), t)
            else:
                if not flat:
                    flat.append(_flat_bytes(t))
                self._copy(u8, flat[0][off:off + n])
            if self._copier is not None:
                self._copier.pending(end, seq)

        return write

    def _write_coded(self, name: str, name_b: bytes, meta_b: bytes, hdr_area: int, t: "torch.Tensor",
                     shape: Tuple[int, ...], step: int, forward: int, coded: "torch.Tensor") -> bool:
        """An FP8 record: ``coded`` (one record, checked by the caller to fit) claimed at the
        head, its header and payload written here, then advanced."""
        tensor_len = t.numel() * t.element_size()
        plen = coded.numel()
        rec_len = align64(hdr_area + plen)
        seq = self._s.claim(rec_len, CLAIM_POLICY, name, tensor_len, step, forward)
        if not seq:
            d = self.drops_by_module.setdefault(name, {"count": 0, "bytes": 0})
            d["count"] += 1
            d["bytes"] += tensor_len
            return False
        hdr = encode_record_header(dtype=torch_dtype_id(t.dtype), shape=shape, seq=seq, record_len=rec_len, step=step,
                                   forward=forward, payload_len=plen, name=name_b, meta=meta_b, part_offset=0,
                                   tensor_len=tensor_len, part=False, fp8=True)
        start = self.ring.write_header(hdr) + hdr_area
        self._copy(self.ring.u8()[start:start + plen], coded, private=True)
        self._advance(rec_len, plen, seq)
        return True

    # ----- tokens and checkpoints (docs/CHECKPOINTS.md) ------------------------------------------

    def token(self, index: int, token_id: int, text: str, position: Optional[int]) -> int:
        """Record one token (it takes the next sequence number and becomes a TOKEN packet with
        ``step = index``): a TOKEN record in the ring where strapd takes ring tokens and it
        fits now, else a TOKEN message naming the records before it (a token never waits
        for ring space); return its sequence number.

        Raises:
            ValueError: a text too long for one message, or not encodable as UTF-8: nothing is
                sent, the capture goes on.
        """
        with self._lock:
            s = self._session()
            try:
                return s.token(index, token_id, text, position)
            except _speedups.SessionError as e:
                err = self._failed(e)
                if not isinstance(err, ValueError):
                    raise err from None
                why = str(err)
            except ValueError as e:  # a lone surrogate
                why = str(e)
            raise ValueError(f"token {index}: {why}; the token is not recorded (its text is "
                             f"{len(text.encode('utf-8', 'surrogatepass'))} bytes), the capture goes on") from None

    def tokens_to_ring(self, toks: Sequence[Tuple[int, int]]) -> int:
        """Write TOKEN records for ``toks`` (position, token id), in order, with indices from
        :attr:`tokens` on and no text, into the ring under one lock, and ring the doorbell
        once after them (a batching engine's step: docs/VLLM.md 9).

        Args:
            toks: the step's sampled tokens.

        Returns:
            how many of ``toks`` (a prefix) were written: 0 against a strapd without ring
            tokens or on a closed or failed session, fewer than all when the ring has no room
            for the next one; the caller sends the rest with :meth:`token` (which never waits
            for ring space either). The records and sequence numbers are those :meth:`token`
            would have written one by one.

        Raises:
            StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError: from draining or
                the doorbell's PUBLISH (the session keeps the error).

        Example:
            >>> n = s.tokens_to_ring([(5, 17), (9, 4)])
            >>> for p, t in [(5, 17), (9, 4)][n:]:
            ...     s.token(s.tokens, t, "", p)
        """
        if not toks:
            return 0
        with self._lock:
            s = self._s
            if self._shut or self.error is not None or s is None:
                return 0
            try:
                return s.tokens_to_ring(toks)
            except _speedups.SessionError as e:
                raise self._failed(e) from None

    def record_sum(self, name: str, h: "torch.Tensor", r: "torch.Tensor", rows: Any) -> bool:
        """Write ``h[rows] + r[rows]`` as one record of ``name`` at the current step and
        forward pass, summed straight into the ring slot by one C pass
        (``_speedups.write_record_sum``): no intermediate tensor, the same bytes as torch's
        sum (float32, bfloat16, float16 on the CPU). A vLLM decoder layer returns
        ``(hidden_states, residual)`` and transformers' layer output is their sum
        (docs/VLLM.md 9).

        Args:
            name: the record name (``model.layers.N``).
            h: the layer's ``hidden_states``, ``[tokens, hidden]``.
            r: its ``residual``, the same shape and dtype.
            rows: the captured rows, a ``slice`` of the batch.

        Returns:
            True when the record was written; False when nothing was written and the caller
            must record the sum itself with :meth:`record`: rows given as an index tensor,
            tensors that are not contiguous 2-D CPU tensors of one supported dtype, PART
            records, no ring space free now, a closed or failed session.

        Raises:
            StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError: from draining
                strapd's messages or the publish that follows a record crossing
                ``publish_bytes``, as from :meth:`record` (the session keeps the error).

        Example:
            >>> if not s.record_sum("model.layers.0", h, r, slice(0, 5)):
            ...     s.record("model.layers.0", h[0:5] + r[0:5], None)
        """
        if type(rows) is not slice or _c_write_record is None:
            return False
        typ = _sum_type(h.dtype)
        if typ is None or r.dtype is not h.dtype or h.dim() != 2 or r.shape != h.shape or not h.is_cpu \
                or not r.is_cpu or not h.is_contiguous() or not r.is_contiguous():
            return False
        start, stop, step = rows.indices(h.shape[0])
        if step != 1 or stop <= start:
            return False
        lay = self._layouts.get(name)
        width = h.shape[1]
        if lay is None or lay.dtype is not h.dtype or lay.shape != (stop - start, width) or lay.cls is not type(h):
            lay = self._layout(name, h[start:stop])
            if lay is None:
                return False  # PART records
        rec_len = lay.record_len
        ring = self.ring
        with self._lock:
            s = self._s
            if self._shut or self.error is not None or s is None:
                return False
            try:
                seq = s.claim(rec_len, CLAIM_NOW, name, lay.tensor_len, self.step, self.forward)
                if not seq:
                    return False  # the caller's record waits (or drops) as the policy says
                off = start * width * h.element_size()
                _speedups.write_record_sum(self._ring_addr + HEADER_SIZE + ring.head % ring.data_size, lay.header, seq,
                                           rec_len, self.step, self.forward, lay.hdr_area, h.data_ptr() + off,
                                           r.data_ptr() + off, (stop - start) * width, typ)
                self._advance(rec_len, lay.tensor_len, seq)
                return True
            except _speedups.SessionError as e:
                raise self._failed(e) from None

    def checkpoint(self, timeout: Optional[float] = None) -> Checkpointed:
        """Ask the daemon to make every event sent so far durable.

        Args:
            timeout: seconds to wait (default: ``stall_timeout``, at least 60).

        Returns:
            the CHECKPOINTED body, once strapd has written and fdatasynced every event.
        """
        with self._lock:
            try:
                c = self._session().checkpoint(float(timeout or 0))
            except _speedups.SessionError as e:
                raise self._failed(e) from None
            return Checkpointed(*c)

    def _copy(self, dst: "torch.Tensor", src: "torch.Tensor", private: bool = False) -> None:
        """Copy ``src`` into the ring view ``dst``; CUDA tensors asynchronously (``private``:
        ``src`` is this session's own, which nothing else writes: no snapshot of it)."""
        if src.device.type == "cpu":
            dst.copy_(src.detach())
            return
        if src.device.type == "cuda":
            if self._cuda is None:
                if self.ring.cuda is None:
                    from ._cuda import CudaCopier

                    self.ring.cuda = CudaCopier(self.ring)
                self._cuda = self.ring.cuda
                # per session, not per copier: a kept ring's copier serves the next captures
                self._cuda_raw = self._cuda.raw and os.environ.get("STRAP_CUDA_RAW_COPY", "1") != "0"
            self._cuda.copy(dst, src.detach(), private=private)
            return
        dst.copy_(src.detach().cpu())


_FIT_WARNED: Set[Tuple[int, int]] = set()


def open_session(socket_path: Optional[str], autostart: bool, stall_timeout: float, ring_size: int, policy: str,
                 output_fd: int, trace_fd: Optional[int], request: Dict[str, Any], resume_seq: int = 0,
                 resources_fd: Optional[int] = None, ring_explicit: bool = True) -> CaptureSession:
    """Connect to strapd (starting it when ``autostart``), shake hands, take a ring and open a
    session: libstrap's open (``_speedups.Session.open``, ``clients/c/src/open.c``), over this
    module's connect (:func:`._daemon.connect`) and kept rings (:func:`._ring.take_ring`). On
    any failure the connection and every ring taken are released again.

    A ring larger than the daemon admits (WELCOME's ``max_ring_size``) is shrunk to fit, with
    a warning once per size and limit in a process: ``max_memory_gb`` caps host buffering.
    A default ring (``ring_explicit`` False) that the daemon's memory budget has no room for
    is made as small as the room left (the ``memory_budget`` ERROR's ``fits_ring_size``), with
    a warning naming ``strapd serve --memory-limit``; a ring the user asked for is refused with
    an error naming it and the budget.

    Args:
        socket_path: the control socket (None: default resolution).
        autostart: start ``strapd serve`` when no daemon answers.
        stall_timeout: seconds to wait for ring space.
        ring_size: bytes of the ring.
        policy: ``"block"`` or ``"drop"``.
        output_fd: the stream file (the caller keeps and closes it).
        trace_fd: the trace file, or None (the caller keeps and closes it).
        request: OPEN's fields (:func:`._open.open_request`): ``codec``, ``codec_level``,
            ``block_size``, ``lossy_mode``, ``lossy_value``, ``resume`` (append_at, last_seq,
            last_crc, packets), ``memory_hint``, ``upload``, ``upload_free_local``, and
            ``metadata`` (a dict; its ``transport`` gets the ring's size).
        resume_seq: the last sequence number of a resumed stream (0: fresh); the session
            continues after it.
        resources_fd: the resource log, or None (the caller keeps and closes it).
        ring_explicit: the user chose ``ring_size`` (``max_memory_gb``); False for the
            default ring, which may shrink to the daemon's budget.

    Returns:
        the open session.
    """
    from ._version import __version__

    req = dict(request, resources=resources_fd is not None)
    meta = dict(req.pop("metadata", None) or {})
    transport = meta.pop("transport", None) or {}

    def connect() -> int:  # the descriptor is libstrap's from here on
        return _daemon.connect(socket_path, autostart=autostart).detach()

    rings: List[Ring] = []

    def ring_for(size: int) -> Ring:
        rings.append(take_ring(size))
        return rings[-1]

    try:
        s, ring, opened = _speedups.Session.open(
            connect, ring_for, f"llm_instrumentation/{__version__}", req, _json(meta), _json(transport),
            ring_size, ring_explicit, "max_memory_gb", output_fd, -1 if trace_fd is None else trace_fd,
            -1 if resources_fd is None else resources_fd, policy, float(stall_timeout), resume_seq, True,
            RING_TOKENS_EVERY, RING_TOKENS_SECONDS)
    except _speedups.SessionError as e:
        raise _error(e) from None
    session = CaptureSession(socket.socket(fileno=opened["sock"]), ring, policy, stall_timeout, opened=(s, opened))
    session.opened = Opened(opened["session"], opened["block_size"], opened["upload"],
                            opened["published_cursor"], opened["ring_tokens"])
    if req["codec"] == "fp8" and session.fp8_client != "off":
        session._fp8 = (int(opened["block_size"]), float(req.get("lossy_value") or 0.0))
    session._cuda = session._copier  # libstrap's session asks it which records are complete
    if opened["fitted_from"] and (opened["fitted_from"], opened["max_ring_size"]) not in _FIT_WARNED:
        # Once per size and limit in this process: a script capturing in a loop gets one line.
        # (The warnings module's own once-per-place is reset whenever anything, e.g. torch,
        # enters warnings.catch_warnings.)
        _FIT_WARNED.add((opened["fitted_from"], opened["max_ring_size"]))
        warnings.warn(f"max_memory_gb asks for a {opened['fitted_from'] / (1 << 30):g} GiB ring, more than strapd "
                      f"admits (--max-ring-size {opened['max_ring_size'] / (1 << 30):g} GiB); using "
                      f"{ring.ring_size / (1 << 30):g} GiB (max_memory_gb caps host buffering)", UserWarning,
                      stacklevel=2)
    if opened["shrunk_from"]:
        from ._warnings import warn_caller

        warn_caller(f"strapd's memory budget has room for a {ring.ring_size}-byte ring, not this capture's default "
                    f"{opened['shrunk_from']} bytes: capturing with the smaller ring (the model may wait for strapd "
                    f"more often). Raise the budget with `strapd serve --memory-limit`, or set "
                    f"max_memory_gb to ask for a ring size (then a short budget is an error)")
    return session


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _error(e: Any) -> BaseException:
    """The client's exception for libstrap's ``SessionError`` (code, message, daemon code,
    fatal[, fits_ring_size])."""
    code, message, daemon_code, fatal = e.args[:4]
    if code in (_speedups.E_INVALID, _speedups.E_TOO_LARGE):
        return ValueError(message)
    if code == _speedups.E_DAEMON:
        cls = StrapdWriteError if daemon_code == "write_error" else StrapdProtocolError
        return cls(message, code=daemon_code, fatal=bool(fatal),
                   fits_ring_size=(e.args[4] or None) if len(e.args) > 4 else None)
    if code == _speedups.E_PROTOCOL:
        return StrapdProtocolError(message)
    if code == _speedups.E_TIMEOUT:
        return StrapdTimeoutError(message)
    if code == _speedups.E_STATE:
        return StrapdConnectionError(f"session already failed: {message}")
    return StrapdConnectionError(message)


def _frontier(cuda: Any) -> Callable[[bool], Any]:
    """libstrap's view of the CUDA copies (``Session.set_frontier``): None when every record
    is complete, False when none of the pending copies is, else the (head, seq) of the
    completed prefix (``block``: after waiting for every copy). Over the copier alone: the
    session holds it, and a reference back to the session would be a cycle."""

    def frontier(block: bool) -> Any:
        if not cuda.busy:
            return None
        done = cuda.wait() if block else cuda.copied()
        if done is None:
            return False
        return done if cuda.busy else None  # later copies still in flight: the completed prefix

    return frontier


_FP8_DTYPES: Tuple[Any, ...] = ()


def _fp8_dtypes() -> Tuple[Any, ...]:
    """The dtypes fp8 codes (float32, float16, bfloat16); torch imported at first use."""
    global _FP8_DTYPES
    if not _FP8_DTYPES:
        import torch

        _FP8_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    return _FP8_DTYPES


def _flat_bytes(t: "torch.Tensor") -> "torch.Tensor":
    """The tensor's bytes as a flat uint8 tensor. A view when ``t`` is contiguous; a
    non-contiguous tensor that must be split into parts is made contiguous first (the one
    case with an extra copy). CUDA tensors stay on the GPU."""
    import torch

    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


