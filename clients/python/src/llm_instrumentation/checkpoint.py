"""Checkpoint files and resume checks (docs/CHECKPOINTS.md).

A checkpoint is written by the client only after strapd has answered CHECKPOINTED: every
packet up to the checkpoint is then on disk (fdatasync). The file is replaced atomically
(temp file, fsync, rename, fsync of the directory). A resume needs no per-token data from
it — the tokens are TOKEN packets in the stream — and its size does not depend on the
capture's length. Beside its own keys it carries 1.3.1's (``total_tokens``,
``last_checkpoint_time``, ``metadata``), and 1.3.1's ``tokens`` list only for a capture started
through 1.3.1's API form (the one part that grows with the capture, docs/CHECKPOINTS.md 3). A
capture that uploads keeps its tokens in a side file appended at each checkpoint, the token
log (:func:`token_log_path`): a resume over a prefix freed after its upload takes the freed
tokens from it. A 1.3.1 checkpoint file (:func:`load_131`) is read too.

Resume reads the stream through a descriptor opened ``O_RDWR`` (never truncating on open),
checks its first ``stream_offset`` bytes against the checkpoint (fingerprint, packet count,
last sequence number, offset and CRC32C of the last packet, recomputed from the bytes),
collects the TOKEN packets to restore the tracker, and only then cuts the file back to the
checkpoint. The same descriptor, locked with ``flock``, goes to strapd with ``append_at``.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from . import _speedups
from .errors import StrapError
from .errors import StreamFormatError
from .stream import DROP, END, INDEX, TENSOR, TOKEN, Packet, StreamReader, crc32c

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

FORMAT = "strap-checkpoint"
VERSION = 1
SUFFIX = ".ckpt.json"
#: Largest checkpoint file read or written: 1.3.1's ``tokens`` list takes about 80 bytes a
#: token, so this holds some 800 000 tokens; past that the list is left out (with a warning).
MAX_SIZE = 64 << 20
#: The mode the client creates a capture's files with (stream, checkpoint, tokens file, trace,
#: resource events), before the umask: never readable by other users; the file's group (a
#: setgid directory's, which is kept) may read it unless the umask takes that away
#: (docs/DEPLOY.md, "File modes").
CAPTURE_FILE_MODE = 0o640
#: 1.3.1's keys, written beside ours (``tokens`` only by 1.3.1's API form; it is kept apart
#: from ``extra`` when a checkpoint is parsed).
KEYS_131 = ("total_tokens", "tokens", "last_checkpoint_time", "metadata")
#: The token log's name: the checkpoint's path plus this (docs/CHECKPOINTS.md 3).
TOKEN_LOG_SUFFIX = ".tokens.jsonl"
#: The fields of a token as the ``tokens`` list and the token log write it, in this order.
TOKEN_KEYS = ("token_index", "token_id", "token_text", "position")
#: The checkpoint file's encoder and parser, libstrap's (clients/c/common/strap_checkpoint.c,
#: bound in _speedups_checkpoint.c); no stub: Any.
_c: Any = _speedups


class CheckpointError(StrapError, ValueError):
    """A checkpoint is missing, unreadable, or does not match the stream or the capture."""


class CaptureCompleteError(CheckpointError):
    """``resume_from_checkpoint=True`` on a capture that finished: its stream ends with END
    (status ``complete``) and its checkpoint is gone (deleted after the clean finish), so
    there is nothing to resume and a resume would cut it. Nothing was changed.

    Attributes:
        path: the stream.
        cut_bytes: the bytes a resume would have cut.
    """

    def __init__(self, message: str, path: str = "", cut_bytes: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.cut_bytes = cut_bytes


@dataclass
class TokenLog:
    """The ``token_log`` key: how much of the token log (:func:`token_log_path`) the
    checkpoint vouches for — its first ``bytes`` bytes, ``tokens`` lines (one per token,
    numbered 0..n-1, as many as ``token_count``), whose CRC32C is ``crc32c``."""

    tokens: int
    bytes: int
    crc32c: int


@dataclass
class Checkpoint:
    """One checkpoint file (field meanings: docs/CHECKPOINTS.md)."""

    stream: str
    fingerprint: str
    stream_offset: int
    packets: int
    drops: int
    last_seq: int
    last_packet_offset: int
    last_packet_crc: int
    token_count: int
    forward_count: int
    created: str = ""
    format: str = FORMAT
    version: int = VERSION
    extra: Dict[str, Any] = field(default_factory=dict)
    #: The token log's extent, for a capture that keeps one (it uploads); None: none.
    token_log: Optional[TokenLog] = None
    #: 1.3.1's ``tokens`` list as the file holds it (None: left out). A resume over a freed
    #: prefix takes the freed tokens from it when there is no token log. Never written by
    #: :meth:`to_json` from here.
    tokens: Optional[List[Any]] = field(default=None, repr=False)
    #: The file this checkpoint was read from (:func:`load`; None: parsed from bytes); its
    #: token log lies beside it. Not written.
    path: Optional[str] = field(default=None, repr=False, compare=False)

    def to_json(self, tokens_json: Optional[List[str]] = None) -> bytes:
        """The file's bytes, written by libstrap's encoder (one form for both clients: compact
        JSON, the format's keys in Go's order, then :attr:`extra`'s, then ``tokens``).

        Args:
            tokens_json: 1.3.1's ``tokens`` list, each token already encoded as JSON
                (:func:`encode_token`; a capture keeps them encoded, so a checkpoint joins
                strings instead of encoding every token again); written as the last key.
                None: no ``tokens``.

        Raises:
            CheckpointError: numbers no reader would take back, or an :attr:`extra` value
                that is not JSON (NaN, infinity).
        """
        log = self.token_log
        try:
            return _c.checkpoint_encode(
                self.stream, self.fingerprint, self.created, self.stream_offset, self.packets, self.drops,
                self.last_seq, self.last_packet_offset, self.last_packet_crc, self.token_count, self.forward_count,
                None if log is None else (log.tokens, log.bytes, log.crc32c),
                [(k, json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for k, v in self.extra.items()],
                tokens_json)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"checkpoint of {self.stream} not written: {e}") from None

    @classmethod
    def parse(cls, data: bytes, path: str = "checkpoint") -> "Checkpoint":
        """Parse and check a checkpoint with libstrap's parser (the same rules as Go
        ``checkpoint.Parse``; golden files: testdata/checkpoint)."""
        try:
            (stream, fp, created, offset, packets, drops, last_seq, last_off, last_crc, token_count, forward_count,
             log, others, tokens) = _c.checkpoint_parse(bytes(data))
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        return cls(stream=stream, fingerprint=fp, stream_offset=offset, packets=packets, drops=drops,
                   last_seq=last_seq, last_packet_offset=last_off, last_packet_crc=last_crc, token_count=token_count,
                   forward_count=forward_count, created=created,
                   extra={k: json.loads(v) for k, v in others},
                   token_log=None if log is None else TokenLog(*log),
                   tokens=None if tokens is None else json.loads(tokens))


def token_log_path(checkpoint_path: Union[str, os.PathLike]) -> str:
    """The token log beside a checkpoint: ``{checkpoint_path}.tokens.jsonl``."""
    return os.fspath(checkpoint_path) + TOKEN_LOG_SUFFIX


def encode_token(t: Dict[str, Any]) -> str:
    """One token as the ``tokens`` list and the token log hold it (keys :data:`TOKEN_KEYS`)."""
    return json.dumps({k: t[k] for k in TOKEN_KEYS}, ensure_ascii=False)


def token_log_extent(tokens_json: List[str]) -> TokenLog:
    """The :class:`TokenLog` of a log holding exactly these encoded tokens, one a line."""
    data = "".join(e + "\n" for e in tokens_json).encode()
    return TokenLog(tokens=len(tokens_json), bytes=len(data), crc32c=crc32c(data))


class TokenLogWriter:
    """Keeps a capture's token log (:func:`token_log_path`) in step with its checkpoints:
    :meth:`sync` appends the tokens recorded since the last call and makes them durable
    (fdatasync) before the checkpoint that vouches for them is written, so a checkpoint costs
    the tokens since the one before, not the capture's length. The first call of a capture
    writes the whole log to a temp file renamed over the old one (a resumed capture's tokens,
    written again in the same encoding), so a crash at any point leaves the log the
    checkpoint on disk describes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._log = TokenLog(0, 0, 0)

    def sync(self, encoded: List[str]) -> TokenLog:
        """Bring the log up to ``encoded`` (every token of the capture, encoded by
        :func:`encode_token`; only those past the last call are written).

        Returns:
            the log's extent for the checkpoint about to be written.
        """
        if self._fd is None or len(encoded) < self._log.tokens:
            self.close()
            data = "".join(e + "\n" for e in encoded).encode()
            write_atomic(self.path, data)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self._log = TokenLog(len(encoded), len(data), crc32c(data))
            return dataclasses.replace(self._log)
        if len(encoded) > self._log.tokens:
            data = "".join(e + "\n" for e in encoded[self._log.tokens:]).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
            self._log = TokenLog(len(encoded), self._log.bytes + len(data), crc32c(data, self._log.crc32c))
        return dataclasses.replace(self._log)

    def close(self) -> None:
        """Close the log (it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_token_log(ck: Checkpoint, stream_path: str) -> List[Dict[str, Any]]:
    """The tokens the checkpoint's token log vouches for (its first ``token_log.bytes``
    bytes, CRC32C-checked), as the tracker holds them.

    Raises:
        CheckpointError: no log, or one that does not hold what the checkpoint says.
    """
    if ck.token_log is None or ck.path is None:
        raise CheckpointError(f"{stream_path}: the checkpoint has no token log")
    p, log = token_log_path(ck.path), ck.token_log
    try:
        with open(p, "rb") as f:
            data = f.read(log.bytes)
    except OSError as e:
        raise CheckpointError(f"{stream_path}: the checkpoint's token log {p}: {e}") from None
    if len(data) < log.bytes:
        raise CheckpointError(f"{stream_path}: the token log {p} is {len(data)} bytes, the checkpoint vouches for "
                              f"{log.bytes}")
    if crc32c(data) != log.crc32c:
        raise CheckpointError(f"{stream_path}: the token log {p}'s first {log.bytes} bytes have CRC32C "
                              f"{crc32c(data):#010x}, the checkpoint says {log.crc32c:#010x}")
    lines = data.split(b"\n")
    if lines[-1] != b"" or len(lines) - 1 != log.tokens:
        raise CheckpointError(f"{stream_path}: the token log {p} holds {len(lines) - 1} lines in its first "
                              f"{log.bytes} bytes, the checkpoint says {log.tokens} tokens")
    try:
        return [json.loads(line) for line in lines[:-1]]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{stream_path}: the token log {p}: a line is not JSON: {e}") from None


@dataclass
class Checkpoint131:
    """A checkpoint file written by llm_instrumentation 1.3.1: its tokens and metadata.

    Attributes:
        tokens: as the tracker holds them (``token_index`` 0, 1, ... in order; 1.3.1's
            ``token_index``, which was the position, is kept as ``position``).
        metadata: 1.3.1's ``metadata`` (``start_time``, ``resume_count``, ``updated_at``).
    """

    tokens: List[Dict[str, Any]]
    metadata: Dict[str, Any]


def load_131(path: Union[str, os.PathLike]) -> Optional[Checkpoint131]:
    """Read ``path`` as a 1.3.1 checkpoint: a JSON object with a ``tokens`` list and none of
    our ``format`` key. None when it is not one (ours, or not JSON: :func:`load` says what).

    Raises:
        CheckpointError: a 1.3.1 checkpoint whose tokens are not ``{token_id, token_text}``
            objects.
    """
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_SIZE + 1)
        d = json.loads(data.decode("utf-8")) if len(data) <= MAX_SIZE else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(d, dict) or "format" in d or not isinstance(d.get("tokens"), list):
        return None
    tokens = []
    for i, t in enumerate(d["tokens"]):
        if not isinstance(t, dict) or isinstance(t.get("token_id"), bool) or not isinstance(t.get("token_id"), int):
            raise CheckpointError(f"{p}: 1.3.1 checkpoint token {i} is not {{token_id, token_text}}: {t!r}")
        pos = t.get("token_index", i)
        tokens.append({"token_index": i, "token_id": t["token_id"], "token_text": str(t.get("token_text", "")),
                       "position": pos if isinstance(pos, int) and not isinstance(pos, bool) else i})
    meta = d.get("metadata")
    return Checkpoint131(tokens, dict(meta) if isinstance(meta, dict) else {})


def default_path(output_path: Union[str, os.PathLike]) -> str:
    """``{output_path}.ckpt.json``."""
    return os.fspath(output_path) + SUFFIX


def load(path: Union[str, os.PathLike]) -> Checkpoint:
    """Read the checkpoint at ``path`` (CheckpointError when absent or invalid)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_SIZE + 1)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {p}") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {p}: {e}") from None
    ck = Checkpoint.parse(data, p)
    ck.path = os.path.abspath(p)
    return ck


def write_atomic(path: Union[str, os.PathLike], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably: temp file in the same
    directory, write, fsync, rename over ``path``, fsync the directory. A crash at any point
    leaves either the old file or the new one, never a mix."""
    p = os.path.abspath(os.fspath(path))
    d = os.path.dirname(p)
    tmp = f"{p}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, CAPTURE_FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, p)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fsync_unlink(path: Union[str, os.PathLike]) -> None:
    """Remove ``path`` and make the removal durable (fsync of the directory)."""
    p = os.path.abspath(os.fspath(path))
    os.unlink(p)
    dfd = os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fingerprint(model: "nn.Module", config_dict: Dict[str, Any], transport: Dict[str, Any],
                modules: List[str]) -> str:
    """A SHA-256 over what must not change between a capture and its resume: the capture
    config, the transport (codec, level, block size), the hooked modules, the model class,
    its config (Hugging Face ``config.to_dict()`` when it has one) and every parameter's and
    buffer's name, shape and dtype. Parameter values are not hashed (too costly for large
    models); the resumed generation itself re-creates the same packets only with the same
    weights, which the byte-equality tests check."""
    h = hashlib.sha256()
    cfg = getattr(model, "config", None)
    model_cfg: Any = None
    if cfg is not None and hasattr(cfg, "to_dict"):
        model_cfg = {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version", "_name_or_path")}
    doc = {"capture_config": config_dict, "transport": transport, "modules": modules,
           "model_class": type(model).__name__, "model_config": model_cfg}
    h.update(json.dumps(doc, sort_keys=True, default=str).encode())
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
    return "sha256:" + h.hexdigest()


def now_rfc3339() -> str:
    """The current UTC time, RFC 3339."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ResumePoint:
    """Where a resumed capture goes on (docs/CHECKPOINTS.md section 4).

    Attributes:
        point: the prefix to keep, in the checkpoint's terms (``stream_offset``,
            ``packets``, ``last_seq``, ``last_packet_crc``, ``token_count``, ...): the
            checkpoint file itself, or one made from the stream's intact prefix.
        tokens: the tokens of the TOKEN packets in that prefix.
        source: ``"checkpoint"`` (the prefix ends at the checkpoint) or ``"stream"`` (it
            goes on past the checkpoint, or there is none, up to the last intact token).
        floor: the checkpoint file, or None when there is none.
        complete: for a finished capture found with ``refuse_complete=False`` (one rank of a
            job), the :class:`CaptureCompleteError` a resume of it alone raises; else None.
    """

    point: Checkpoint
    tokens: List[Dict[str, Any]]
    source: str
    floor: Optional[Checkpoint]
    complete: Optional[CheckpointError] = None


def resume_point(fd: int, ck: Optional[Checkpoint], path: str, want_fingerprint: str,
                 limit: Optional[int] = None, refuse_complete: bool = True) -> ResumePoint:
    """Find where a resume goes on in the stream behind ``fd``.

    The checkpoint, when there is one, is the floor: the stream must hold exactly what it
    describes (:func:`scan_prefix`), since that much was fdatasync'd. Past it (or from the
    first packet when there is none) the walk goes on while every packet parses, passes its
    CRC32C check and is a TENSOR, DROP or TOKEN packet with TOKENs numbered in order; the
    prefix kept ends with the last TOKEN packet of that walk, so every packet of each kept
    token's forward pass is intact. A packet after it (a forward pass cut short, an END of
    the aborted session, a torn or damaged packet) is generated again.

    Args:
        fd: the stream, open for reading (the caller keeps and closes it).
        ck: the checkpoint file's contents, or None when there is none.
        path: the stream's path, for messages.
        want_fingerprint: this capture's fingerprint; the stream header must carry it.
        limit: keep at most this many tokens (the job-wide resume point of a distributed
            job, docs/DISTRIBUTED.md D3): the prefix then ends with TOKEN packet
            ``limit - 1`` (with 0, at the end of the file header), also when that lies
            before the checkpoint — whose prefix is still checked in full first.
        refuse_complete: raise :class:`CaptureCompleteError` for a finished capture (END
            ``complete`` after the point, no checkpoint); False: return the point with
            ``complete`` set (a rank of a job, whose resume point the job decides).

    Returns:
        the resume point.

    Raises:
        CheckpointError: the checkpointed prefix does not match, or (without a checkpoint)
            the stream header is not valid or names another capture.
    """
    reader = _prefix_reader(fd, ck, path)
    try:
        freed = freed_range(fd, reader.first_packet, ck.stream_offset if ck is not None else reader.size)
        if freed is not None and ck is None:
            raise CheckpointError(
                f"{path}: bytes [{freed[0]}, {freed[1]}) of the stream were freed after their upload "
                f"(strapd serve --upload-free-local) and there is no checkpoint to resume from")
        if ck is not None:
            if freed is not None:
                tokens = _check_freed_prefix(reader, ck, path, want_fingerprint, freed)
            else:
                tokens = _check_prefix(reader, ck, path, want_fingerprint)
            start = ck.stream_offset
            # replace, not asdict: the tokens list (up to ~800 000 dicts) is not copied.
            base = dataclasses.replace(ck, extra=dict(ck.extra), tokens=None)
        else:
            client_meta = reader.metadata.get("client_metadata")
            stream_fp = client_meta.get("fingerprint") if isinstance(client_meta, dict) else None
            if stream_fp != want_fingerprint:
                raise CheckpointError(
                    f"fingerprint differs: stream header {stream_fp!r}, this capture (config + model) "
                    f"{want_fingerprint!r}; resume with the same model, config, preset and modules")
            tokens, start = [], reader.first_packet
            base = Checkpoint(stream=path, fingerprint=want_fingerprint, stream_offset=start, packets=0, drops=0,
                              last_seq=0, last_packet_offset=0, last_packet_crc=0, token_count=0, forward_count=0)
        if limit is not None and limit < base.token_count:
            if freed is not None:
                raise CheckpointError(
                    f"{path}: the job-wide resume point ({limit} tokens) lies before this rank's checkpoint "
                    f"({base.token_count} tokens), and bytes [{freed[0]}, {freed[1]}) of its stream were freed "
                    f"after their upload (strapd serve --upload-free-local): the stream cannot be cut back "
                    f"into them; resume every rank from its own checkpoint (or restart the capture)")
            # Back before the checkpoint: walked again from the first packet (checked above).
            tokens, start = [], reader.first_packet
            base = Checkpoint(stream=base.stream, fingerprint=base.fingerprint, stream_offset=start, packets=0,
                              drops=0, last_seq=0, last_packet_offset=0, last_packet_crc=0, token_count=0,
                              forward_count=0, created=base.created, extra=base.extra)
        point, tokens = _intact_tail(reader, base, start, tokens, limit)
        # Without its checkpoint (deleted after a clean finish) an END "complete" is a
        # finished capture. With it, the capture was stopped by an error in the capturing
        # code: the session was closed cleanly and the checkpoint kept to resume from.
        complete = _complete_error(reader, point, path) if ck is None else None
        if complete is not None and refuse_complete:
            raise complete
    finally:
        # The caller truncates the file next: the mapping must be gone by then.
        reader.close()
    source = "checkpoint" if ck is not None and point.stream_offset == ck.stream_offset else "stream"
    return ResumePoint(point, tokens, source, ck, complete)


def complete_end(reader: StreamReader, start: int) -> Optional[Tuple[Packet, int, int]]:
    """The END packet with status ``complete`` that follows ``start`` (a packet boundary), if
    the stream has one: walked header by header (no payload is read), stopping at a torn or
    damaged packet, an INDEX or an END of another status.

    Returns:
        (the END packet, the TENSOR/DROP/TOKEN packets between ``start`` and it, the TOKEN
        packets among them), or None.
    """
    off, packets, tokens = start, 0, 0
    try:
        while off < reader.size:
            pk = reader._parse(off, lazy=True)
            assert pk is not None  # strict parsing raises instead
            if pk.type == END:
                return (pk, packets, tokens) if pk.meta.get("status") == "complete" else None
            if pk.type == INDEX:
                return None
            packets += 1
            tokens += pk.type == TOKEN
            off = pk.end
    except StreamFormatError:
        return None
    return None


def _complete_error(reader: StreamReader, point: Checkpoint, path: str) -> Optional[CaptureCompleteError]:
    """The :class:`CaptureCompleteError` for a resume at ``point`` that would cut a finished
    capture (an END with status ``complete`` follows it), or None."""
    found = complete_end(reader, point.stream_offset)
    if found is None:
        return None
    end, packets, tokens = found
    cut = reader.size - point.stream_offset
    return CaptureCompleteError(
        f"{path} is a complete capture (its stream ends with END, status complete, at offset {end.offset}): "
        f"there is nothing to resume, and resuming would cut {cut} bytes of it ({packets} packets, {tokens} tokens, "
        f"the END and INDEX) back to token {point.token_count}. Nothing was changed. To capture again, give a new "
        f"output_path; `strapd resume {path}` describes the stream", path=path, cut_bytes=cut)


def _prefix_reader(fd: int, ck: Optional[Checkpoint], path: str) -> StreamReader:
    """A reader of the stream behind ``fd`` for a resume check: the file must still hold
    everything ``ck`` (when given) reported durable, and its header must parse."""
    if ck is not None:
        size = os.fstat(fd).st_size
        if size < ck.stream_offset:
            raise CheckpointError(
                f"{path} is {size} bytes, shorter than the checkpointed offset {ck.stream_offset}: "
                f"data reported durable is gone; the stream cannot be resumed")
    try:
        return StreamReader(path, fd=fd, use_index=False)
    except StreamFormatError as e:
        what = "stream header is not valid" if ck is not None else \
            "there is no checkpoint and the stream header is not valid either (nothing to resume from)"
        raise CheckpointError(f"{path}: {what}: {e}") from None


def _intact_tail(reader: StreamReader, base: Checkpoint, start: int, tokens: List[Dict[str, Any]],
                 limit: Optional[int] = None) -> Tuple[Checkpoint, List[Dict[str, Any]]]:
    """Extend ``base`` (the prefix up to ``start``) to the end of the last TOKEN packet of
    the intact run of packets that follows it, or of TOKEN packet ``limit - 1``."""
    best = base
    packets, drops, forwards = base.packets, base.drops, base.forward_count
    toks = list(tokens)
    try:
        for pk in reader.walk(reader.size, start):
            if limit is not None and len(toks) >= limit:
                break
            if pk.type not in (TENSOR, DROP, TOKEN):
                break  # END/INDEX of the aborted session: the capture goes on before it
            if pk.type == TOKEN and pk.step != len(toks):
                break
            packets += 1
            if pk.type == DROP:
                drops += 1
            if pk.type != TOKEN:
                # The forward counter is not stored with TOKEN packets: the next forward
                # pass is the one after the last that left a packet.
                forwards = max(forwards, pk.forward + 1)
                continue
            toks.append(_token(pk))
            best = Checkpoint(stream=base.stream, fingerprint=base.fingerprint, stream_offset=pk.end,
                              packets=packets, drops=drops, last_seq=pk.seq, last_packet_offset=pk.offset,
                              last_packet_crc=pk.crc, token_count=len(toks), forward_count=forwards,
                              created=base.created)
    except StreamFormatError:
        pass  # a torn or damaged packet ends the intact run
    return best, toks[:best.token_count]


def _token(pk: Packet) -> Dict[str, Any]:
    return {"token_index": pk.step, "token_id": pk.meta.get("token_id"), "token_text": pk.meta.get("text", ""),
            "position": pk.meta.get("position", pk.step)}


def scan_prefix(fd: int, ck: Checkpoint, path: str, want_fingerprint: Optional[str]) -> List[Dict[str, Any]]:
    """Check the stream behind ``fd`` against ``ck`` and return the checkpointed tokens.

    The prefix is walked with the stream reader (:meth:`StreamReader.walk`), so every
    packet in it is parsed by the same rules and CRC-checked as when the stream is read. A
    prefix whose start was freed after its upload (:func:`freed_range`) is checked as
    :func:`resume_point` does: the header, the last packet, the checkpoint's tokens list.

    Args:
        fd: the stream, open for reading (not consumed: the caller keeps and closes it).
        ck: the checkpoint.
        path: the stream's path, for messages.
        want_fingerprint: this capture's fingerprint (None: do not compare).

    Returns:
        the tokens of the TOKEN packets in the prefix, as the tracker holds them.

    Raises:
        CheckpointError: naming the first thing that differs.
    """
    reader = _prefix_reader(fd, ck, path)
    try:
        freed = freed_range(fd, reader.first_packet, ck.stream_offset)
        if freed is not None:
            return _check_freed_prefix(reader, ck, path, want_fingerprint, freed)
        return _check_prefix(reader, ck, path, want_fingerprint)
    finally:
        # The caller truncates the file next: the mapping must be gone by then.
        reader.close()


def freed_range(fd: int, start: int, end: int) -> Optional[Tuple[int, int]]:
    """The bytes of ``[start, end)`` of the file behind ``fd`` that were freed (holes punched
    by strapd's ``--upload-free-local`` after their upload): from the first hole to the end
    of the last one before ``end``, or None. Found with ``lseek(SEEK_HOLE/SEEK_DATA)``, never
    from the bytes: a run of zeros that was written is data. A file system without
    ``SEEK_HOLE`` reports none. The descriptor's offset is kept."""
    seek_hole, seek_data = getattr(os, "SEEK_HOLE", None), getattr(os, "SEEK_DATA", None)
    if seek_hole is None or seek_data is None or start >= end:
        return None
    saved = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        try:
            hole = os.lseek(fd, start, seek_hole)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.EINVAL, errno.EOPNOTSUPP):
                return None
            raise
        if hole >= end:
            return None
        pos = hole
        while True:
            try:
                data = os.lseek(fd, pos, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return hole, end
                raise
            if data >= end:
                return hole, end
            nxt = os.lseek(fd, data, seek_hole)
            if nxt >= end:
                return hole, data
            pos = nxt
    finally:
        os.lseek(fd, saved, os.SEEK_SET)


def _check_fingerprints(reader: StreamReader, ck: Checkpoint, want_fingerprint: Optional[str]) -> None:
    client_meta = reader.metadata.get("client_metadata")
    stream_fp = client_meta.get("fingerprint") if isinstance(client_meta, dict) else None
    if stream_fp != ck.fingerprint:
        raise CheckpointError(f"fingerprint differs: checkpoint {ck.fingerprint!r}, stream header {stream_fp!r}")
    if want_fingerprint is not None and want_fingerprint != ck.fingerprint:
        raise CheckpointError(
            f"fingerprint differs: checkpoint {ck.fingerprint!r}, this capture (config + model) {want_fingerprint!r}; "
            f"resume with the same model, config, preset and modules")


def _check_freed_prefix(reader: StreamReader, ck: Checkpoint, path: str, want_fingerprint: Optional[str],
                        freed: Tuple[int, int]) -> List[Dict[str, Any]]:
    """Check a checkpointed prefix whose start was freed after its upload: the packets
    there cannot be walked, so the checkpoint is trusted for them (it was written only after
    strapd made them durable, and strapd frees nothing past the last-but-one checkpoint's
    last packet). What is still checked: the file header and fingerprints, the last packet
    (its offset, seq and CRC32C against its bytes, ending exactly at ``stream_offset``), and
    the freed tokens' one other copy: 1.3.1's ``tokens`` list when the checkpoint carries
    it, else its token log (:func:`read_token_log`: as many bytes as it vouches for, their
    CRC32C); either must be numbered 0..n-1, as many as the checkpoint counts, the last one
    matching the last packet when that is its TOKEN."""
    _check_fingerprints(reader, ck, want_fingerprint)
    what = f"{path}: bytes [{freed[0]}, {freed[1]}) of the stream were freed after their upload (strapd serve --upload-free-local)"
    if ck.packets == 0 or freed[1] > ck.last_packet_offset:
        raise CheckpointError(f"{what}, up to or past the checkpoint's last packet (at {ck.last_packet_offset}): "
                              f"the checkpointed prefix cannot be checked; the stream cannot be resumed from this checkpoint")
    if ck.tokens is None and ck.token_log is None:
        raise CheckpointError(f"{what}, and the checkpoint has neither a token log nor 1.3.1's 'tokens' list: the "
                              f"freed tokens are nowhere else, so this capture cannot be resumed with a freed prefix")
    listed = ck.tokens if ck.tokens is not None else read_token_log(ck, path)
    where = "the checkpoint's tokens list" if ck.tokens is not None else "the checkpoint's token log"
    last = None
    try:
        for pk in reader.walk(ck.stream_offset, ck.last_packet_offset):
            last = pk
            break
    except StreamFormatError as e:
        raise CheckpointError(f"{path}: no valid packet at the checkpoint's last packet offset {ck.last_packet_offset}: {e}") from None
    if last is None or last.end != ck.stream_offset:
        end = None if last is None else last.end
        raise CheckpointError(f"{path}: the checkpoint's last packet (at {ck.last_packet_offset}) ends at {end}, "
                              f"not at the checkpointed offset {ck.stream_offset}")
    if last.type not in (TENSOR, DROP, TOKEN):
        raise CheckpointError(f"{path}: {last.type_name} packet at offset {last.offset}, inside the checkpointed prefix")
    if last.seq != ck.last_seq:
        raise CheckpointError(f"{path}: last packet has seq {last.seq}, checkpoint says {ck.last_seq}")
    if last.crc != ck.last_packet_crc:
        raise CheckpointError(f"{path}: last packet CRC {last.crc:#010x}, checkpoint says {ck.last_packet_crc:#010x}")
    tokens: List[Dict[str, Any]] = []
    for i, t in enumerate(listed):
        if not isinstance(t, dict) or t.get("token_index") != i:
            raise CheckpointError(f"{path}: {where} is not numbered 0..n-1 (entry {i}: {t!r})")
        tokens.append({"token_index": i, "token_id": t.get("token_id"), "token_text": str(t.get("token_text", "")),
                       "position": t.get("position", i)})
    if len(tokens) != ck.token_count:
        raise CheckpointError(f"{path}: {where} holds {len(tokens)} tokens, its token_count says {ck.token_count}")
    if last.type == TOKEN:
        mine = _token(last)
        if last.step != len(tokens) - 1 or (tokens and mine != tokens[-1]):
            raise CheckpointError(f"{path}: the last TOKEN packet (step {last.step}: {mine!r}) is not the checkpoint's "
                                  f"last token ({tokens[-1] if tokens else None!r})")
    return tokens


def _check_prefix(reader: StreamReader, ck: Checkpoint, path: str,
                  want_fingerprint: Optional[str]) -> List[Dict[str, Any]]:
    _check_fingerprints(reader, ck, want_fingerprint)
    packets = 0
    last: Optional[Packet] = None
    tokens: List[Dict[str, Any]] = []
    try:
        for pk in reader.walk(ck.stream_offset):
            if pk.type not in (TENSOR, DROP, TOKEN):
                raise CheckpointError(f"{path}: {pk.type_name} packet at offset {pk.offset}, inside the "
                                      f"checkpointed prefix")
            if pk.type == TOKEN:
                tokens.append(_token(pk))
            packets += 1
            last = pk
    except StreamFormatError as e:
        raise CheckpointError(f"{path}: no valid packet at offset {e.offset} (before the checkpointed offset "
                              f"{ck.stream_offset}): {e}") from None
    end = last.end if last is not None else reader.first_packet
    if end != ck.stream_offset:
        raise CheckpointError(f"{path}: checkpointed offset {ck.stream_offset} is not the end of a packet "
                              f"(a packet ends at {end})")
    if packets != ck.packets:
        raise CheckpointError(f"{path}: {packets} packets before the offset, checkpoint says {ck.packets}")
    if len(tokens) != ck.token_count:
        raise CheckpointError(f"{path}: {len(tokens)} tokens before the offset, checkpoint says {ck.token_count}")
    if [t["token_index"] for t in tokens] != list(range(len(tokens))):
        raise CheckpointError(f"{path}: TOKEN packets are not numbered 0..{len(tokens) - 1}")
    if last is not None:
        # The walk already checked the last packet's bytes against its stored CRC; what is
        # left is whether it is the packet the checkpoint names.
        if last.offset != ck.last_packet_offset:
            raise CheckpointError(f"{path}: last packet starts at {last.offset}, checkpoint says {ck.last_packet_offset}")
        if last.seq != ck.last_seq:
            raise CheckpointError(f"{path}: last packet has seq {last.seq}, checkpoint says {ck.last_seq}")
        if last.crc != ck.last_packet_crc:
            raise CheckpointError(f"{path}: last packet CRC {last.crc:#010x}, checkpoint says {ck.last_packet_crc:#010x}")
    return tokens
