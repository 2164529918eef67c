"""The plugin's two hot writes into the ring, each in one pass (docs/VLLM.md 9): a decoder
layer's output summed straight into the ring, and a step's sampled tokens as TOKEN records
under one lock.

vLLM's decoder layer returns ``(hidden_states, residual)``; transformers' layer output is
their sum. Computed with torch and then recorded, the sum costs a new tensor (for a prefill
step megabytes of freshly faulted pages) that the ring copy then reads again.
:func:`record_sum` writes the record's header and the sum of the two tensors' rows into the
ring slot in one C pass (``_speedups.write_record_sum``): no intermediate tensor, the same
bytes as ``hidden[rows] + residual[rows]`` (float32, bfloat16, float16 on the CPU).

:func:`record_sum` is the session's whole-record fast path (``CaptureSession.record`` in ``_session.py``)
with a sum for a copy: the same layout, the same space checks, the same counters and the
size-triggered publish. What that path would not write in place (a record needing a PAD
and no space for it, no space known to be free, PART records, a closed or failed session,
rows given as an index tensor, tensors that are not plain contiguous CPU tensors of one
supported dtype) is left to the caller, which computes the sum and records it as before.

:func:`record_tokens` is ``CaptureSession.token``'s ring path (PROTOCOL.md 1.4, "ring
tokens") for the k tokens of a step at once: the same TOKEN records with the same sequence
numbers and indices, one lock and one doorbell (PUBLISH when due) for the step instead of
one each per token. Against a strapd without ring tokens it writes nothing and the caller
sends TOKEN messages as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from .. import _session
from .._ring import HEADER_SIZE, token_record_len
from .._ring import _c as _speedups
from ..errors import StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: torch dtype -> write_record_sum's element type; filled on first use (torch imported then).
_TYPES: dict = {}


def _type_of(dtype: Any) -> Optional[int]:
    if not _TYPES:
        import torch

        _TYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    return _TYPES.get(dtype)


def record_sum(session: Any, name: str, h: "torch.Tensor", r: "torch.Tensor", rows: Any) -> bool:
    """Write ``h[rows] + r[rows]`` as one record of ``name`` at the current step and forward
    pass, summed straight into the ring.

    Args:
        session: the worker's open :class:`~llm_instrumentation._session.CaptureSession`.
        name: the record name (``model.layers.N``).
        h: the decoder layer's ``hidden_states``, ``[tokens, hidden]``.
        r: its ``residual``, the same shape and dtype.
        rows: the captured rows, a ``slice`` of the batch.

    Returns:
        True when the record was written; False when nothing was written and the caller
        must record the sum itself (the cases in the module's docstring).

    Raises:
        StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError: from draining
            strapd's messages or the publish that follows a record crossing
            ``publish_bytes``, as from ``record`` (the session keeps the error).

    Example:
        >>> if not record_sum(s, "model.layers.0", h, r, slice(0, 5)):
        ...     s.record("model.layers.0", h[0:5] + r[0:5], None)
    """
    if type(rows) is not slice or _session._c_write_record is None:
        return False
    typ = _type_of(h.dtype)
    if typ is None or r.dtype is not h.dtype or h.dim() != 2 or r.shape != h.shape or not h.is_cpu \
            or not r.is_cpu or not h.is_contiguous() or not r.is_contiguous():
        return False
    start, stop, step = rows.indices(h.shape[0])
    if step != 1 or stop <= start:
        return False
    lay = session._layouts.get(name)
    width = h.shape[1]
    if lay is None or lay.dtype is not h.dtype or lay.shape != (stop - start, width) or lay.cls is not type(h):
        lay = session._layout(name, h[start:stop])
        if lay is None:
            return False  # PART records
    rec_len = lay.record_len
    item = h.element_size()
    ring = session.ring
    with session._lock:
        if session._shut or session.error is not None:
            return False
        try:
            pad, needed = ring.placement(rec_len)
            if not ring.fits(needed):
                session.drain()  # RELEASEs received since the last publish free space
                pad, needed = ring.placement(rec_len)
                if not ring.fits(needed):
                    return False  # the caller's record waits (or drops) as the policy says
            if pad:
                ring.write_pad(pad)
            head = ring.head
            if head + rec_len > ring.populated:
                ring.populate(head + rec_len)
            seq = session.seq + 1
            off = start * width * item
            _speedups.write_record_sum(session._ring_addr + HEADER_SIZE + head % ring.data_size, lay.header, seq,
                                       rec_len, session.step, session.forward, lay.hdr_area, h.data_ptr() + off,
                                       r.data_ptr() + off, (stop - start) * width, typ)
            session.seq = seq
            ring.head = head = head + rec_len
            session.last_tensor_seq = seq
            if session._cuda is not None:
                session._cuda.pending(head, seq)
            session.packets += 1
            session.bytes_in += lay.tensor_len
            if head - session.published_head >= session.publish_bytes:
                session._publish(block=False)
            return True
        except (StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError) as e:
            session.error = e
            raise


def record_tokens(session: Any, toks: Sequence[Tuple[int, int]]) -> int:
    """Write TOKEN records for ``toks`` (position, token id), in order, with indices from
    ``session.tokens`` on and no text, into the ring; ring the doorbell once after them.

    Args:
        session: the worker's open session.
        toks: the step's sampled tokens.

    Returns:
        how many of ``toks`` (a prefix) were written: 0 against a strapd without ring tokens
        or on a closed or failed session, fewer than all when the ring has no room for the
        next one; the caller sends the rest with ``session.token`` (which never waits for
        ring space either).

    Raises:
        StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError: from draining or
            the doorbell's PUBLISH (the session keeps the error).

    Example:
        >>> n = record_tokens(s, [(5, 17), (9, 4)])
        >>> for p, t in [(5, 17), (9, 4)][n:]:
        ...     s.token(s.tokens, t, "", p)
    """
    if not session._ring_tokens or not toks:
        return 0
    ring = session.ring
    rec_len = token_record_len(0)
    encode = _speedups.encode_token_record
    done = 0
    with session._lock:
        if session._shut or session.error is not None:
            return 0
        try:
            for pos, tid in toks:
                pad, needed = ring.placement(rec_len)
                if not ring.fits(needed):
                    session.drain()
                    pad, needed = ring.placement(rec_len)
                    if not ring.fits(needed):
                        break
                if pad:
                    ring.write_pad(pad)
                ring.populate(ring.head + rec_len)
                seq = session.seq + 1
                ring.write_header(encode(seq, session.tokens, tid, pos, b""))
                session.seq = seq
                ring.head += rec_len
                session.last_tensor_seq = seq
                session.tokens += 1
                session._unsent_tokens += 1
                done += 1
            if done:
                session._doorbell()
        except (StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError) as e:
            session.error = e
            raise
    return done
