"""Checkpoint files and resume checks (docs/CHECKPOINTS.md).

A checkpoint is written by the client only after strapd has answered CHECKPOINTED: every
packet up to the checkpoint is then on disk (fdatasync). The file is replaced atomically
(temp file, fsync, rename, fsync of the directory) by libstrap's C, which appends the token
log too (clients/c/common/strap_checkpoint.c, :func:`write_atomic`). A resume needs no
per-token data from it — the tokens are TOKEN packets in the stream — and its size does not
depend on the capture's length. Beside its own keys it carries 1.3.1's (``total_tokens``,
``last_checkpoint_time``, ``metadata``), and 1.3.1's ``tokens`` list only for a capture started
through 1.3.1's API form (the one part that grows with the capture, docs/CHECKPOINTS.md 3). A
capture that uploads keeps its tokens in a side file appended at each checkpoint, the token
log (:func:`token_log_path`): a resume over a prefix freed after its upload takes the freed
tokens from it. A 1.3.1 checkpoint file (:func:`load_131`) is read too.

Resume reads the stream through a descriptor opened ``O_RDWR`` (never truncating on open),
checks its first ``stream_offset`` bytes against the checkpoint (every packet's framing and
CRC32C, the counts, the last packet's offset, seq and CRC), collects the TOKEN packets to
restore the tracker, and only then cuts the file back to the resume point. The scan is
libstrap's (clients/c/common/strap_resume.c, :func:`resume_point`), one for both clients. The
same descriptor, locked with ``flock``, goes to strapd with ``append_at``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from . import _speedups
from .errors import StrapError
from .stream import crc32c

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
    written again in the same encoding; :func:`write_atomic`), as does the call after a failed
    append, so a crash at any point leaves the log the checkpoint on disk describes. The
    append and its fdatasync are libstrap's (clients/c/common/strap_checkpoint.c,
    ``sck_append_sync``; the GIL let go)."""

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
            try:
                _c.append_sync(self._fd, data, self.path)  # libstrap's sck_append_sync: write all, fdatasync
            except OSError:
                # Part of data may be in the log now: the next call writes the whole log again.
                self.close()
                raise
            self._log = TokenLog(len(encoded), self._log.bytes + len(data), crc32c(data, self._log.crc32c))
        return dataclasses.replace(self._log)

    def close(self) -> None:
        """Close the log (it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_token_log(ck: Checkpoint, stream_path: str) -> List[Dict[str, Any]]:
    """The tokens the checkpoint's token log vouches for (its first ``token_log.bytes``
    bytes, CRC32C-checked, ``token_log.tokens`` lines numbered 0..n-1), as the tracker holds
    them — read by the resume scan's own reader (clients/c/common/strap_resume.c).

    Raises:
        CheckpointError: no log, or one that does not hold what the checkpoint says.
    """
    if ck.token_log is None or ck.path is None:
        raise CheckpointError(f"{stream_path}: the checkpoint has no token log")
    try:
        return list(_c.token_log(stream_path, _ck_tuple(ck), os.fspath(ck.path)))
    except ValueError as e:
        raise CheckpointError(str(e)) from None


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


def write_atomic(path: Union[str, os.PathLike], data: bytes, mode: int = CAPTURE_FILE_MODE) -> None:
    """Replace ``path`` with ``data`` atomically and durably: temp file in the same
    directory (created with ``mode``, default :data:`CAPTURE_FILE_MODE`), write, fsync, rename over ``path``,
    fsync the directory. A crash at any point leaves either the old file or the new one,
    never a mix. libstrap's (clients/c/common/strap_checkpoint.c, ``sck_write_atomic``; the
    GIL let go while it writes).

    Raises:
        OSError: naming the step and the path (the subclass its errno picks). The temp file
            is removed and ``path`` untouched, unless only the directory's fsync failed (the
            new file is in place then).
    """
    _c.write_atomic(os.path.abspath(os.fspath(path)), bytes(data), mode)


def fsync_unlink(path: Union[str, os.PathLike]) -> None:
    """Remove ``path`` and make the removal durable (fsync of the directory), with libstrap's
    ``sck_unlink_durable``. OSError naming the path (FileNotFoundError when there is none)."""
    _c.unlink_durable(os.path.abspath(os.fspath(path)))


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
    """Find where a resume goes on in the stream behind ``fd``, with libstrap's scan
    (clients/c/common/strap_resume.c, bound in _speedups_resume.c; the file is read with the
    GIL let go).

    The checkpoint, when there is one, is the floor: the stream must hold exactly what it
    describes (:func:`scan_prefix`), since that much was fdatasync'd. Past it (or from the
    first packet when there is none) the walk goes on while every packet parses, passes its
    CRC32C check and is a TENSOR, DROP or TOKEN packet with TOKENs numbered in order; the
    prefix kept ends with the last TOKEN packet of that walk, so every packet of each kept
    token's forward pass is intact. A packet after it (a forward pass cut short, an END of
    the aborted session, a torn or damaged packet) is generated again. An empty file without
    a checkpoint (a client killed before strapd wrote the header) is a capture from token 0:
    the point is offset 0.

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
    (off, packets, drops, last_seq, last_off, last_crc, tokens_n, forwards), tokens, source, _, _, done = \
        _scan(fd, ck, path, want_fingerprint, limit, False)
    if ck is not None and off == ck.stream_offset and tokens_n == ck.token_count:
        # replace, not asdict: the tokens list (up to ~800 000 dicts) is not copied.
        point = dataclasses.replace(ck, extra=dict(ck.extra), tokens=None)
    else:
        point = Checkpoint(stream=ck.stream if ck is not None else path,
                           fingerprint=ck.fingerprint if ck is not None else want_fingerprint, stream_offset=off,
                           packets=packets, drops=drops, last_seq=last_seq, last_packet_offset=last_off,
                           last_packet_crc=last_crc, token_count=tokens_n, forward_count=forwards,
                           created=ck.created if ck is not None else "")
    # Without its checkpoint (deleted after a clean finish) an END "complete" is a finished
    # capture. With it, the capture was stopped by an error in the capturing code: the session
    # was closed cleanly and the checkpoint kept to resume from (docs/CHECKPOINTS.md 4).
    complete = None if done is None else CaptureCompleteError(done[0], path=path, cut_bytes=done[1])
    if complete is not None and refuse_complete:
        raise complete
    return ResumePoint(point, tokens, "checkpoint" if source == 1 else "stream", ck, complete)


def _ck_tuple(ck: Checkpoint) -> Tuple[Any, ...]:
    """The checkpoint as the C scan takes it."""
    log = ck.token_log
    return (ck.stream, ck.fingerprint, ck.stream_offset, ck.packets, ck.drops, ck.last_seq, ck.last_packet_offset,
            ck.last_packet_crc, ck.token_count, ck.forward_count,
            None if log is None else (log.tokens, log.bytes, log.crc32c))


def _scan(fd: int, ck: Optional[Checkpoint], path: str, want_fingerprint: Optional[str], limit: Optional[int],
          prefix_only: bool) -> Tuple[Any, ...]:
    """libstrap's scan (_speedups.resume_scan) of the stream behind ``fd`` against ``ck``."""
    c = None if ck is None else _ck_tuple(ck)
    # 1.3.1's list is one copy of a freed prefix's tokens: encoded for the scan only then.
    listed = None
    if ck is not None and ck.tokens is not None and _c.freed_range(fd, 0, ck.stream_offset) is not None:
        listed = json.dumps(ck.tokens, ensure_ascii=False)
    try:
        return tuple(_c.resume_scan(fd, path, c, None if ck is None else ck.path, listed, want_fingerprint, limit,
                                    prefix_only))
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def scan_prefix(fd: int, ck: Checkpoint, path: str, want_fingerprint: Optional[str]) -> List[Dict[str, Any]]:
    """Check the stream behind ``fd`` against ``ck`` and return the checkpointed tokens.

    Every packet of the prefix is read whole: its framing, header fields and metadata by the
    stream reader's rules, its CRC32C against its bytes; then the packet and TOKEN counts, the
    TOKENs numbered 0..n-1, the last packet's offset, seq and CRC. A prefix whose start was
    freed after its upload (:func:`freed_range`) is checked by its header, its last packet and
    the freed tokens' other copy: 1.3.1's ``tokens`` list when the checkpoint carries it, else
    its token log (docs/CHECKPOINTS.md 4).

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
    return list(_scan(fd, ck, path, want_fingerprint, None, True)[1])


def freed_range(fd: int, start: int, end: int) -> Optional[Tuple[int, int]]:
    """The bytes of ``[start, end)`` of the file behind ``fd`` that were freed (holes punched
    by strapd's ``--upload-free-local`` after their upload): from the first hole to the end
    of the last one before ``end``, or None. Found with ``lseek(SEEK_HOLE/SEEK_DATA)``, never
    from the bytes: a run of zeros that was written is data. A file system without
    ``SEEK_HOLE`` reports none. The descriptor's offset is kept."""
    r = _c.freed_range(fd, start, end)
    return None if r is None else (r[0], r[1])
