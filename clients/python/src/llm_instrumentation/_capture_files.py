"""The files of a capture around the stream: locking and cutting the stream for a fresh
capture or a resume, the trace file, checkpoint files and the tokens file
(docs/CHECKPOINTS.md, docs/TRACE_FORMAT.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from . import checkpoint as ckpt
from . import _distributed, _job_resume, _streamlock
from ._options import SessionOptions
from ._warnings import warn_caller
from .checkpoint import CAPTURE_FILE_MODE, CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from ._session import Checkpointed


def tokens_path(output_path: Union[str, "os.PathLike[str]"]) -> str:
    """The tokens file of a capture.

    For a stream named ``<stem>.stream`` it is ``<stem>_tokens.json``, the name 1.3.1 gave
    it, so scripts that open that file keep working. Any other name gets ``_tokens.json``
    appended: 1.3.1 replaced ``.stream`` wherever it occurred and so, for a path without
    it, wrote the tokens over the stream itself; appending can never name the stream.

    Args:
        output_path: the stream file.

    Returns:
        the tokens file's path (never the stream's).

    Example:
        >>> tokens_path("/runs/gen.stream"), tokens_path("/runs/gen.strap")
        ('/runs/gen_tokens.json', '/runs/gen.strap_tokens.json')
    """
    p = os.fspath(output_path)
    head, base = os.path.split(p)
    if base.endswith(".stream") and base != ".stream":
        return os.path.join(head, base[: -len(".stream")] + "_tokens.json")
    return p + "_tokens.json"


@dataclass
class Output:
    """The locked stream file, ready for OPEN.

    Attributes:
        fd: the descriptor (the caller closes it once strapd holds its own copy).
        resume: the prefix the capture goes on from (the checkpoint, or one made from the
            stream's intact prefix), or None for a fresh stream.
        tokens: the tokens of that prefix; for a fresh stream, the tokens of a 1.3.1
            checkpoint it goes on from (the capture writes them first); else empty.
        source: what the capture goes on from: ``"checkpoint"`` or ``"stream"`` (the
            prefix's end), ``"checkpoint-1.3.1"`` (a 1.3.1 checkpoint's tokens, new stream);
            None for a fresh capture.
        floor: the checkpoint file found on a resume (None: none).
        meta_131: 1.3.1's ``metadata`` of the checkpoint gone on from (``start_time``,
            ``resume_count``; ours carry it too), or None.
        key: the stream file's (st_dev, st_ino), marked live in this process
            (:func:`._streamlock.mark_live`) from the moment it was locked; the capture
            marks it ended when it stops, aborts or fails to start.
    """

    fd: int
    resume: Optional[ckpt.Checkpoint] = None
    tokens: List[Dict[str, Any]] = field(default_factory=list)
    source: Optional[str] = None
    floor: Optional[ckpt.Checkpoint] = None
    meta_131: Optional[Dict[str, Any]] = None
    key: Optional[Tuple[int, int]] = None


def open_output(opts: SessionOptions, fingerprint: str) -> Output:
    """Open and lock the stream file. Fresh: empty it, after dealing with a checkpoint left
    by an earlier capture (:func:`_leftover`). Resume: check it against the checkpoint, when
    there is one, and cut it back to the end of its last intact token (docs/CHECKPOINTS.md 4);
    with nothing to resume, or only a 1.3.1 checkpoint, a new stream. In one rank of a
    distributed job, the job first agrees on the point every rank reached and the stream is
    cut back to it (:mod:`._job_resume`, docs/DISTRIBUTED.md D3).

    Args:
        opts: the session options (``output_path`` set).
        fingerprint: this capture's fingerprint; a resume must match it.

    Returns:
        the locked output.

    Raises:
        CheckpointError: a leftover checkpoint with ``overwrite_checkpoint=False``, a
            stream that does not match the checkpoint or the capture, a checkpoint whose
            stream is gone, or a 1.3.1 stream to append to; in a distributed job, also
            another rank's such error, or no answer from the other ranks.
        StreamInUseError: a live capture is writing the stream (nothing was changed in it).
    """
    out = opts.output_path
    assert out is not None
    ck_path = opts.checkpoint_file
    if not opts.resume_from_checkpoint:
        leftover = ck_path or ckpt.default_path(out)
        if os.path.exists(leftover) and opts.overwrite_checkpoint is not True:
            _leftover(opts, out, leftover)
        return _fresh(out, opts, leftover if opts.overwrite_checkpoint else None)
    assert ck_path is not None  # resume implies per-token tracking, hence a checkpoint path
    info = _distributed.detect()
    exchange = None
    if info is not None:
        exchange = _job_resume.exchange_for(info, out, _distributed.per_rank_enabled())
    if exchange is None:
        return _cut(*_open_resume(opts, fingerprint), None, ck_path)
    assert info is not None
    try:
        o, rp = _open_resume(opts, fingerprint, in_job=True)
    except Exception as e:
        _job_resume.agree(exchange, e, info)  # raises e once every rank has heard of it
        raise
    try:
        m = _job_resume.agree(exchange, rp.point.token_count if rp is not None else len(o.tokens), info)
        if rp is not None and rp.complete is not None:
            _complete_rank(rp, m, info)
    except BaseException:
        _streamlock.mark_ended(o.key)
        os.close(o.fd)
        raise
    return _cut(o, rp, m, ck_path)


def _complete_rank(rp: ckpt.ResumePoint, m: int, info: "_distributed.RankInfo") -> None:
    """A rank whose capture finished, in a job that resumes: when another rank holds fewer
    tokens (it did not finish), the job goes on from there on every rank, so this one is cut
    back too (a warning says how much); when none does, there is nothing to resume:
    :class:`CaptureCompleteError`, nothing changed (docs/DISTRIBUTED.md D3)."""
    assert rp.complete is not None
    if m >= rp.point.token_count:
        raise rp.complete
    rp.complete = CheckpointError(
        f"rank {info.rank}: {rp.point.stream} is a complete capture of {rp.point.token_count} tokens, but another "
        f"rank of the job reached only {m}: the job resumes from token {m} on every rank")


def _open_resume(opts: SessionOptions, fingerprint: str,
                 in_job: bool = False) -> Tuple[Output, Optional[ckpt.ResumePoint]]:
    """Open and lock the stream of a resume and find its resume point, changing nothing yet.
    A finished capture raises :class:`~.checkpoint.CaptureCompleteError`, unless ``in_job``
    (one rank of a job): then the point says so, and the job decides (:func:`_complete_rank`).

    Returns:
        the output and, for a stream to go on from, its resume point (None: a new stream).
    """
    out, ck_path = opts.output_path, opts.checkpoint_file
    assert out is not None and ck_path is not None
    c: Optional[ckpt.Checkpoint] = None
    old: Optional[ckpt.Checkpoint131] = None
    if os.path.exists(ck_path):
        old = ckpt.load_131(ck_path)
        if old is None:
            c = ckpt.load(ck_path)
    try:
        fd = os.open(out, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        if c is not None:
            raise CheckpointError(f"checkpoint {ck_path} names stream {out}, which does not exist") from None
        if old is None:
            # 1.3.1 started over here; a restart script passes resume_from_checkpoint=True
            # every time, including the first.
            warn_caller(f"resume_from_checkpoint=True but there is no checkpoint at {ck_path} and no stream at "
                          f"{out}: starting a new capture")
        return _from_131(_fresh(out, opts, None), old), None
    key = None
    try:
        _streamlock.lock_stream(fd, opts.lock_wait, out)
        key = _streamlock.mark_live(fd, out)
        if c is None and os.fstat(fd).st_size == 0:
            # A client killed before strapd wrote the header: nothing was captured, so
            # the resume is a capture from token 0 into the same file.
            return _from_131(Output(fd, source="stream", key=key), old), None
        if _is_131_stream(fd, out):
            raise CheckpointError(
                f"{out} is an llm_instrumentation 1.3.1 stream: a capture cannot append to it. Move it aside "
                f"(open_stream still reads it); resume_from_checkpoint=True then starts a new stream"
                + (f" with the {len(old.tokens)} tokens of the 1.3.1 checkpoint {ck_path}" if old else ""))
        if old is not None:
            warn_caller(f"{ck_path} is a 1.3.1 checkpoint; the stream {out} says itself where the capture "
                          f"goes on, so the checkpoint's tokens are not used")
        rp = ckpt.resume_point(fd, c, out, fingerprint, refuse_complete=not in_job)
    except BaseException:
        _streamlock.mark_ended(key)
        os.close(fd)
        raise
    meta = c.extra.get("metadata") if c is not None else None
    return Output(fd, None, [], rp.source, c, meta if isinstance(meta, dict) else None, key), rp


def _cut(o: Output, rp: Optional[ckpt.ResumePoint], limit: Optional[int], ck_path: str) -> Output:
    """Cut the stream back to its resume point (or to the job's, ``limit`` tokens, when that
    is earlier) and make the output say so.

    A cut before the checkpoint rewrites the checkpoint first, to the new point (durable: it
    lies inside the fdatasync'd prefix), so that a crash after the cut never leaves a
    checkpoint that describes bytes no longer there.
    """
    if rp is None:
        if limit is not None and len(o.tokens) > limit:  # a 1.3.1 checkpoint's tokens
            o.tokens, o.source = o.tokens[:limit], "job-minimum"
        return o
    out = rp.point.stream
    finished = rp.complete  # a finished rank the job cuts back (_complete_rank)
    try:
        if limit is not None and limit < rp.point.token_count:
            # refuse_complete: a finished rank's cut was decided by the job (_complete_rank).
            rp = ckpt.resume_point(o.fd, rp.floor, out, rp.point.fingerprint, limit, refuse_complete=False)
            if rp.point.token_count != limit:
                raise CheckpointError(f"{out}: the stream changed while the job agreed on its resume point "
                                      f"(token {limit} wanted, {rp.point.token_count} found)")
            if o.floor is not None and limit < o.floor.token_count:
                c = rp.point
                c.extra = dict(o.floor.extra)
                c.extra["total_tokens"] = limit
                c.created = ckpt.now_rfc3339()
                enc = [ckpt.encode_token(t) for t in rp.tokens]
                if o.floor.token_log is not None:
                    # The log's first `limit` lines, written in the same encoding: the
                    # log itself stays as it is (the next checkpoint rewrites it).
                    c.token_log = ckpt.token_log_extent(enc)
                # 1.3.1's list only where the checkpoint had it (1.3.1's API form), and
                # left out past the size a checkpoint may have, as a capture does.
                toks: Optional[List[str]] = enc if o.floor.tokens is not None else None
                if sum(len(t) + 1 for t in toks or ()) + (64 << 10) > ckpt.MAX_SIZE:
                    toks = None
                ckpt.write_atomic(ck_path, c.to_json(toks))
                o.floor = c
            rp = ckpt.ResumePoint(rp.point, rp.tokens, "job-minimum", rp.floor)
        if finished is not None:
            warn_caller(f"{finished}, so {os.fstat(o.fd).st_size - rp.point.stream_offset} bytes of it (its END and "
                        f"INDEX included) are cut and generated again")
        os.ftruncate(o.fd, rp.point.stream_offset)
        os.fsync(o.fd)
    except BaseException:
        _streamlock.mark_ended(o.key)
        os.close(o.fd)
        raise
    o.resume, o.tokens, o.source = rp.point, rp.tokens, rp.source
    return o


def _is_131_stream(fd: int, path: str) -> bool:
    """Whether the non-empty file behind ``fd`` reads as a 1.3.1 stream (not a strap one)."""
    from . import _legacy131
    from .errors import StreamFormatError

    if not _legacy131.is_legacy_header(os.pread(fd, 8, 0)):
        return False
    try:
        _legacy131.LegacyStreamReader(path).close()
    except StreamFormatError:
        return False  # neither format: the resume check says what is wrong with it
    return True


def _fresh(out: str, opts: SessionOptions, remove: Optional[str]) -> Output:
    """Create or empty the stream for a new capture and lock it; then remove ``remove`` (a
    leftover checkpoint being overwritten) when given."""
    # Not O_TRUNC: a live capture of the same file must keep its bytes; the lock tells
    # (_streamlock refuses a live holder at once), and only then is the file emptied.
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, CAPTURE_FILE_MODE)
    key = None
    try:
        _streamlock.lock_stream(fd, min(opts.lock_wait, 10.0), out)
        key = _streamlock.mark_live(fd, out)
        os.ftruncate(fd, 0)
        if remove is not None:
            for p in (remove, ckpt.token_log_path(remove)):
                if os.path.exists(p):
                    ckpt.fsync_unlink(p)
    except BaseException:
        _streamlock.mark_ended(key)
        os.close(fd)
        raise
    return Output(fd, key=key)


def _from_131(o: Output, old: Optional[ckpt.Checkpoint131]) -> Output:
    """A new stream that goes on from a 1.3.1 checkpoint's tokens (when there is one)."""
    if old is not None:
        o.tokens, o.source, o.meta_131 = old.tokens, "checkpoint-1.3.1", old.metadata
    return o


#: Files beside a stream that belong to its capture, moved with it by :func:`_leftover`.
_SIDECARS = (".trace.jsonl", ".resources.jsonl")


def _leftover(opts: SessionOptions, out: str, leftover: str) -> None:
    """A fresh capture found the checkpoint of an earlier one at ``leftover``.

    ``overwrite_checkpoint=False`` refuses. Not given (None: every 1.3.1 call, e.g. a notebook
    cell run again after it was interrupted): a 1.3.1 checkpoint is removed, as 1.3.1
    overwrote it; ours keeps the earlier capture by moving its stream, checkpoint, trace,
    resource events and tokens file aside to ``<stem>.interrupted-N<ext>`` (the first N
    free), where ``resume_from_checkpoint=True`` on that path continues it. With no stream
    (or an empty one) there is nothing to keep and the checkpoint is removed. Each case warns.
    """
    if opts.overwrite_checkpoint is False:
        raise CheckpointError(
            f"a checkpoint of an earlier capture exists at {leftover}: pass resume_from_checkpoint=True "
            f"to continue that capture, or overwrite_checkpoint=True to start over (the stream "
            f"{out} and the checkpoint are then replaced)")
    if ckpt.load_131(leftover) is not None:
        warn_caller(f"removing the 1.3.1 checkpoint {leftover} of an earlier capture (1.3.1 overwrote it too); "
                      f"resume_from_checkpoint=True would have gone on from its tokens")
        ckpt.fsync_unlink(leftover)
        return
    try:
        fd = os.open(out, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    if fd is None or os.fstat(fd).st_size == 0:
        if fd is not None:
            os.close(fd)
        warn_caller(f"removing the checkpoint {leftover} of an earlier capture whose stream {out} is missing or "
                      f"empty (nothing to keep)")
        ckpt.fsync_unlink(leftover)
        return
    try:
        # A live capture of this stream holds the lock: its files are not moved.
        _streamlock.lock_stream(fd, min(opts.lock_wait, 10.0), out)
        stem, ext = os.path.splitext(out)
        n = 1
        while True:
            aside = f"{stem}.interrupted-{n}{ext}"
            if not any(os.path.exists(p) for p in (aside, ckpt.default_path(aside), tokens_path(aside))):
                break
            n += 1
        os.rename(out, aside)
    finally:
        os.close(fd)
    moved = [aside]
    try:
        ckpt.load(leftover)  # checks it; then the same JSON, naming where its stream went
        with open(leftover, "rb") as f:
            d = json.loads(f.read())
        d["stream"] = aside
        ckpt.write_atomic(ckpt.default_path(aside), json.dumps(d, ensure_ascii=False).encode())
        ckpt.fsync_unlink(leftover)
    except CheckpointError:
        os.rename(leftover, ckpt.default_path(aside))  # not readable: kept as it is
    moved.append(ckpt.default_path(aside))
    if os.path.exists(ckpt.token_log_path(leftover)):
        os.rename(ckpt.token_log_path(leftover), ckpt.token_log_path(ckpt.default_path(aside)))
        moved.append(ckpt.token_log_path(ckpt.default_path(aside)))
    for old, new in [(out + sfx, aside + sfx) for sfx in _SIDECARS] + [(tokens_path(out), tokens_path(aside))]:
        if os.path.exists(old):
            os.rename(old, new)
            moved.append(new)
    warn_caller(
        f"a checkpoint of an earlier, unfinished capture was at {leftover}: that capture is kept, moved to "
        f"{', '.join(moved)}; resume it with resume_from_checkpoint=True and output_path={aside!r}. Pass "
        f"overwrite_checkpoint=True to replace such a capture instead, or False to refuse")


def resolve_trace(opts: SessionOptions, config_trace: Union[bool, str, None]) -> Optional[str]:
    """The trace file of a capture, or None for no trace.

    Args:
        opts: the session options (``trace_path``: None follows ``config_trace``, False
            never traces, True the default ``{output_path}.trace.jsonl``, else that path).
        config_trace: the config's ``trace`` setting.

    Returns:
        the absolute path, or None.

    Raises:
        ValueError: the trace path is the stream itself.
    """
    arg = opts.trace_path if opts.trace_path is not None else config_trace
    if arg is None or arg is False:
        return None
    assert opts.output_path is not None
    path = opts.output_path + ".trace.jsonl" if arg is True else os.path.abspath(os.fspath(arg))
    if path == opts.output_path:
        raise ValueError(f"trace_path {path} is the stream's output_path")
    return path


def open_trace(path: str, resuming: bool) -> int:
    """Open the trace file strapd writes into (OPEN's third descriptor).

    A resumed capture appends to its trace (strapd first cuts a line torn by a crash and
    needs to read for that); otherwise the file is truncated.

    Args:
        path: the trace file.
        resuming: whether the capture is a resume.

    Returns:
        the descriptor.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND if resuming else os.O_WRONLY | os.O_TRUNC
    return os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, CAPTURE_FILE_MODE)


def checkpoint_from(reply: "Checkpointed", stream: str, fingerprint: str, token_count: int,
                    forward_count: int) -> ckpt.Checkpoint:
    """The checkpoint file for a CHECKPOINTED reply.

    Args:
        reply: strapd's answer (everything up to it is durable).
        stream: the stream's path.
        fingerprint: the capture's fingerprint.
        token_count: tokens the tracker holds.
        forward_count: forward passes so far.

    Returns:
        the checkpoint.

    Raises:
        CheckpointError: strapd wrote another number of TOKEN packets than the tracker
            holds (tokens were recorded outside the capture).
    """
    if reply.tokens != token_count:
        raise CheckpointError(f"strapd wrote {reply.tokens} TOKEN packets, the tracker holds {token_count} "
                              f"tokens: record_token was called outside this capture")
    return ckpt.Checkpoint(stream=stream, fingerprint=fingerprint, stream_offset=reply.offset, packets=reply.packets,
                           drops=reply.drops, last_seq=reply.seq, last_packet_offset=reply.last_offset,
                           last_packet_crc=reply.last_crc, token_count=token_count, forward_count=forward_count,
                           created=ckpt.now_rfc3339())


def write_tokens_file(output_path: str, tokens: List[Dict[str, Any]], duration_s: float, resume_step: int,
                      forward_count: int, fingerprint: str) -> None:
    """Write the tokens file (:func:`tokens_path`) atomically (the 1.3.1 tokens file, plus where the
    capture resumed and its fingerprint).

    Args:
        output_path: the stream file.
        tokens: the tracker's tokens.
        duration_s: seconds the capture ran.
        resume_step: the step a resumed capture went on from (0: not resumed).
        forward_count: forward passes of the model.
        fingerprint: the capture's fingerprint.
    """
    doc = {
        "total_tokens": len(tokens),
        "tokens": tokens,
        "capture_duration_seconds": duration_s,
        "stream_path": output_path,
        "resumed_from_step": resume_step,
        "forward_count": forward_count,
        "fingerprint": fingerprint,
    }
    ckpt.write_atomic(tokens_path(output_path), json.dumps(doc, indent=1).encode())
