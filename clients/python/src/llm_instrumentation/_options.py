"""The options of one capture session, checked once, in one frozen dataclass.

``capture_activations`` and ``InstrumentationFramework`` take these as keyword parameters
(the documented public API); both turn them into a :class:`SessionOptions` and hand that on,
so each option is validated and normalized in one place.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple, Union

from . import _distributed
from . import checkpoint as ckpt
from .resources.levels import ResourceLevel

PathArg = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class SessionOptions:
    """Where and how one capture runs (everything but the model and its config).

    Paths are stored absolute. Construction checks the combination and raises on a bad one.
    When the process is one rank of several (:mod:`._distributed`: ``torch.distributed`` or
    ``RANK``/``WORLD_SIZE``), ``output_path`` and an explicit ``checkpoint_path`` or
    ``trace_path`` get the rank's marker (``cap.strap`` → ``cap.rank00001-of-00002.strap``),
    unless ``STRAP_RANK_STREAMS=0`` keeps them as given.

    Attributes:
        output_path: the stream file (None until a capture names one).
        modules: extra fnmatch patterns on module names, added to the config's.
        socket_path: strapd control socket (None: PROTOCOL.md 1 resolution).
        autostart_daemon: start ``strapd serve`` when no daemon answers.
        track_per_token: keep a token tracker; tokens become TOKEN packets.
        stall_timeout: seconds to wait for ring space before raising.
        checkpoint_interval_tokens: make a checkpoint every N recorded tokens (None: never).
        checkpoint_path: checkpoint file as given (None: ``{output_path}.ckpt.json``).
        resume_from_checkpoint: continue the capture the checkpoint describes.
        overwrite_checkpoint: what a fresh capture does with a checkpoint of an earlier one
            at its checkpoint path: True deletes it and the stream; False refuses
            (``CheckpointError``); None (not given) keeps that capture by moving its stream
            and checkpoint aside to ``<stem>.interrupted-N<ext>``, with a warning (a 1.3.1
            checkpoint, which 1.3.1 itself overwrote, is deleted with a warning).
        lock_wait: seconds to wait for the stream's lock when resuming (a session that is
            still ending holds it).
        trace_path: kernel trace file: None follows ``config.trace``, True the default
            path, False none, else that path.
        resource_level: resource events (docs/RESOURCE_EVENTS.md): None follows
            ``config.resource_level``, then ``STRAP_RESOURCE_LOG_LEVEL``; False none; else
            ``"MINIMAL"``/``"DETAILED"``/``"VERBOSE"`` (stored as the level's name).
        upload: ``"s3://bucket/prefix"`` strapd uploads the stream into while it captures
            (None: the config's, else the daemon's ``serve --upload``, if any).
        upload_free_local: strapd frees the stream's uploaded bytes on the local disk while
            it captures (``serve --upload-free-local`` for this session; needs an upload).
        parallel_layout: the job's parallel layout as given (docs/DISTRIBUTED.md D1): None,
            a ``DeviceMesh``, a dict or a :class:`~._distributed.ParallelLayout`; refused in
            a single process.
        sharding: ``{fnmatch pattern: spec}`` (D2), stored checked as ``((pattern, kind), ...)``.
        replicated: ``"tp_rank0"`` (replicated outputs stored by tensor-parallel rank 0 only)
            or ``"every_rank"``.
        rank: this process's rank (None: a single process), detected once here.
        layout: this rank's resolved layout (None: a single process).
    """

    output_path: Optional[str] = None
    modules: Tuple[str, ...] = ()
    socket_path: Optional[str] = None
    autostart_daemon: bool = True
    track_per_token: bool = False
    stall_timeout: float = 120.0
    checkpoint_interval_tokens: Optional[int] = None
    checkpoint_path: Optional[str] = None
    resume_from_checkpoint: bool = False
    overwrite_checkpoint: Optional[bool] = None
    lock_wait: float = 30.0
    trace_path: Optional[Union[str, bool]] = None
    resource_level: Optional[Union[str, int, bool]] = None
    upload: Optional[str] = None
    upload_free_local: bool = False
    parallel_layout: Any = None
    sharding: Any = None
    replicated: str = "tp_rank0"
    rank: Optional[_distributed.RankInfo] = field(default=None, init=False, compare=False)
    layout: Optional[_distributed.Layout] = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        check_tracking(self.track_per_token, self.checkpoint_interval_tokens, self.checkpoint_path,
                       self.resume_from_checkpoint, self.overwrite_checkpoint)
        # Frozen: normalized values are set once, here, and never change afterwards.
        set_ = object.__setattr__
        info = _distributed.detect()
        set_(self, "rank", info)
        set_(self, "layout", _distributed.resolve_layout(self.parallel_layout, info))
        if not (isinstance(self.sharding, tuple) and all(isinstance(k, _distributed.ModuleKind) for _, k in self.sharding)):
            set_(self, "sharding", _distributed.check_sharding(self.sharding))  # a tuple: checked already (replace)
        if self.replicated not in _distributed.REPLICATED_MODES:
            raise ValueError(f"replicated={self.replicated!r}: expected one of {list(_distributed.REPLICATED_MODES)}")
        rank = info if _distributed.per_rank_enabled() else None

        def path(p: Optional[PathArg]) -> Optional[str]:
            a = _abs(p)
            # Every rank runs the same call: a path of its own keeps them apart.
            return _distributed.rank_path(a, rank) if a is not None and rank is not None else a

        set_(self, "output_path", path(self.output_path))
        set_(self, "checkpoint_path", path(self.checkpoint_path))
        set_(self, "modules", tuple(self.modules or ()))
        if self.trace_path is not None and not isinstance(self.trace_path, bool):
            set_(self, "trace_path", path(self.trace_path))
        if self.resource_level is True:
            raise ValueError("resource_level=True: name a level (MINIMAL, DETAILED, VERBOSE) or pass False")
        if self.resource_level is not None and self.resource_level is not False:
            set_(self, "resource_level", ResourceLevel.parse(self.resource_level).name)
        if self.upload is not None:
            set_(self, "upload", check_upload_url(self.upload))
        if not isinstance(self.upload_free_local, bool):
            raise TypeError(f"upload_free_local={self.upload_free_local!r}: expected True or False")

    def with_capture(self, **changes: Any) -> "SessionOptions":
        """A copy with other per-capture options (checked again).

        Args:
            changes: fields to replace.

        Returns:
            the new options.
        """
        return dataclasses.replace(self, **changes)

    @property
    def checkpoint_file(self) -> Optional[str]:
        """Where checkpoints go: ``checkpoint_path``, or ``{output_path}.ckpt.json`` when
        checkpointing or resuming; None when neither (or no output path yet)."""
        if self.output_path is None:
            return None
        if self.checkpoint_interval_tokens is None and not self.resume_from_checkpoint and self.checkpoint_path is None:
            return None
        return self.checkpoint_path if self.checkpoint_path is not None else ckpt.default_path(self.output_path)


def _abs(p: Optional[PathArg]) -> Optional[str]:
    return os.path.abspath(os.fspath(p)) if p is not None else None


_BUCKET = re.compile(r"[a-z0-9.-]{3,63}")


def check_upload_url(url: Any) -> str:
    """Check an upload target (strapd applies the same rules, internal/upload/url.go).

    Args:
        url: ``"s3://bucket"`` or ``"s3://bucket/prefix"``.

    Returns:
        the URL as given.

    Raises:
        ValueError: not an ``s3://`` URL, a bucket name S3 refuses, or an empty, ``.`` or
            ``..`` segment in the prefix.
    """
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"upload={url!r}: expected an s3://bucket/prefix URL")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"upload={url!r}: bucket name {bucket!r} must be 3 to 63 characters of a-z, 0-9, '-' and '.'")
    prefix = prefix.strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise ValueError(f"upload={url!r}: empty, '.' or '..' segment in the key prefix")
    return url


def check_tracking(track_per_token: Any, checkpoint_interval_tokens: Any, checkpoint_path: Any,
                   resume_from_checkpoint: Any, overwrite_checkpoint: Any) -> None:
    """Check the tracking and checkpoint options together.

    Args:
        track_per_token: must be a bool.
        checkpoint_interval_tokens: None or a positive int.
        checkpoint_path: None or a path.
        resume_from_checkpoint: must be a bool.
        overwrite_checkpoint: a bool, or None (not given).

    Raises:
        TypeError: a flag that is not a bool.
        ValueError: a bad interval, or options that exclude or need each other.
    """
    if not isinstance(track_per_token, bool):
        raise TypeError(f"track_per_token must be a bool, got {track_per_token!r}")
    if not isinstance(resume_from_checkpoint, bool):
        raise TypeError(f"resume_from_checkpoint must be a bool, got {resume_from_checkpoint!r}")
    if overwrite_checkpoint is not None and not isinstance(overwrite_checkpoint, bool):
        raise TypeError(f"overwrite_checkpoint must be a bool or None, got {overwrite_checkpoint!r}")
    if checkpoint_interval_tokens is not None and (
            isinstance(checkpoint_interval_tokens, bool) or not isinstance(checkpoint_interval_tokens, int)
            or checkpoint_interval_tokens <= 0):
        raise ValueError(f"checkpoint_interval_tokens must be a positive int, got {checkpoint_interval_tokens!r}")
    checkpoints = checkpoint_interval_tokens is not None or checkpoint_path is not None or resume_from_checkpoint
    if checkpoints and not track_per_token:
        raise ValueError("checkpoints and resume need track_per_token=True: a checkpoint is taken every "
                         "checkpoint_interval_tokens recorded tokens, and resume restores the tracker's tokens")
    if checkpoint_path is not None and checkpoint_interval_tokens is None and not resume_from_checkpoint:
        raise ValueError("checkpoint_path without checkpoint_interval_tokens or resume_from_checkpoint: "
                         "set checkpoint_interval_tokens=N to write checkpoints there")
    if resume_from_checkpoint and overwrite_checkpoint is True:
        raise ValueError("resume_from_checkpoint and overwrite_checkpoint exclude each other")
