"""The capture API: :func:`capture_activations` and :class:`InstrumentationFramework`.

This module is the public surface; the work is done in the parts: options (``_options``),
module selection and hooks (``_hooks``), the capture's life cycle (``_capture``), the
stream, trace, checkpoint and tokens files (``_capture_files``), the OPEN request (``_open``) and
the strapd session (``_session``).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union, overload

from ._anatomy import describe_model
from ._capture import Capture
from ._hooks import sample_positions, split_output
from ._options import SessionOptions, check_tracking
from ._capture_files import tokens_path
from ._warnings import warn_caller
from .checkpoint import CheckpointError
from .config import DEFAULT_CODEC, InstrumentationConfig
from .tracking import TokenTracker

__all__ = ["InstrumentationFramework", "TokenTracker", "capture_activations", "split_output", "sample_positions",
           "CheckpointError", "tokens_path", "SessionOptions", "default_output_path"]

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

PathArg = Union[str, "os.PathLike[str]"]


def _option(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.options, name), doc=doc)


class InstrumentationFramework(Capture):
    """Hooks on a model that stream module outputs to strapd.

    1.3.1's form: ``fw = InstrumentationFramework(config)``, ``fw.instrument_model(model)``,
    then ``with fw.capture_activations(path, track_per_token=...) as tracker:``. The model can
    also be given up front, ``InstrumentationFramework(model, config)`` (either order of the
    two positional arguments; ``model=`` / ``config=`` as keywords). Other parameters: as
    :func:`capture_activations`, plus ``lock_wait`` (seconds a resume waits for the stream's
    lock).

    Attributes:
        model, config: the instrumented model (None before :meth:`instrument_model`) and
            its :class:`InstrumentationConfig`.
        options: the :class:`SessionOptions` of the current (or next) capture.
        hooked_modules: names of the modules with hooks.
        token_tracker: the :class:`TokenTracker` (``None`` unless ``track_per_token``).
        forward_count: forward passes of the model seen so far.
        summary: the daemon's CLOSED body after :meth:`stop`.
        trace_path: the kernel trace file strapd writes (None: no trace).
        resource_monitor: the :class:`~llm_instrumentation.resources.ResourceMonitor` of
            the running capture (None when resource events are off); ``set_level``,
            ``disable``, ``enable``, ``flush`` control it.
        resources_path: ``{output_path}.resources.jsonl`` when resource events are on.
        resource_summary: the monitor's ``resource_session_summary`` after :meth:`stop`.
        last_checkpoint: the last checkpoint written or resumed from (None: none yet).
        resume_step: the step a resumed capture goes on from (0 when not resumed).
        resumed_from: what a resume went on from: ``"checkpoint"`` (the checkpoint's
            offset), ``"stream"`` (the stream's intact prefix, past the checkpoint or
            without one) or ``"checkpoint-1.3.1"`` (a 1.3.1 checkpoint's tokens, in a new
            stream); None when not resumed (also when there was nothing to resume).
        checkpoint_times: seconds each checkpoint took (request to durable file).
        capture_set_path: on rank 0 of a distributed job, the capture-set manifest written
            when the capture ended (docs/DISTRIBUTED.md); None elsewhere.
    """

    output_path = _option("output_path", "absolute path of the stream file (None until a capture is set up).")
    checkpoint_path = _option("checkpoint_file", "where checkpoints go (None when not checkpointing).")
    checkpoint_interval = _option("checkpoint_interval_tokens", "tokens between checkpoints (None: none).")
    resume = _option("resume_from_checkpoint", "whether this capture resumes a checkpoint.")
    overwrite_checkpoint = _option("overwrite_checkpoint", "what a fresh capture does with a leftover checkpoint: "
                                                           "True replaces, False refuses, None moves it aside.")
    socket_path = _option("socket_path", "strapd control socket (None: default resolution).")
    autostart_daemon = _option("autostart_daemon", "whether strapd is started when none answers.")
    stall_timeout = _option("stall_timeout", "seconds to wait for ring space.")
    lock_wait = _option("lock_wait", "seconds a resume waits for the stream's lock.")

    @overload
    def __init__(self, config: InstrumentationConfig, model: Optional["nn.Module"] = None,
                 output_path: Optional[PathArg] = None, modules: Optional[Sequence[str]] = None,
                 socket_path: Optional[str] = None, autostart_daemon: bool = True, track_per_token: bool = False,
                 stall_timeout: float = 120.0, checkpoint_interval_tokens: Optional[int] = None,
                 checkpoint_path: Optional[PathArg] = None, resume_from_checkpoint: bool = False,
                 overwrite_checkpoint: Optional[bool] = None, lock_wait: float = 30.0,
                 trace_path: Optional[Union[PathArg, bool]] = None,
                 resource_level: Optional[Union[str, bool]] = None) -> None: ...

    @overload
    def __init__(self, config: "nn.Module", model: InstrumentationConfig,  # (model, config), positionally
                 output_path: Optional[PathArg] = None, modules: Optional[Sequence[str]] = None,
                 socket_path: Optional[str] = None, autostart_daemon: bool = True, track_per_token: bool = False,
                 stall_timeout: float = 120.0, checkpoint_interval_tokens: Optional[int] = None,
                 checkpoint_path: Optional[PathArg] = None, resume_from_checkpoint: bool = False,
                 overwrite_checkpoint: Optional[bool] = None, lock_wait: float = 30.0,
                 trace_path: Optional[Union[PathArg, bool]] = None,
                 resource_level: Optional[Union[str, bool]] = None) -> None: ...

    def __init__(self, config: Any, model: Any = None, output_path: Optional[PathArg] = None,
                 modules: Optional[Sequence[str]] = None, socket_path: Optional[str] = None,
                 autostart_daemon: bool = True, track_per_token: bool = False, stall_timeout: float = 120.0,
                 checkpoint_interval_tokens: Optional[int] = None, checkpoint_path: Optional[PathArg] = None,
                 resume_from_checkpoint: bool = False, overwrite_checkpoint: Optional[bool] = None, lock_wait: float = 30.0,
                 trace_path: Optional[Union[PathArg, bool]] = None,
                 resource_level: Optional[Union[str, bool]] = None) -> None:
        if not isinstance(config, InstrumentationConfig) and isinstance(model, InstrumentationConfig):
            config, model = model, config  # InstrumentationFramework(model, config)
        if not isinstance(config, InstrumentationConfig):
            raise TypeError(f"config must be an InstrumentationConfig, got {type(config).__name__}")
        opts = SessionOptions(
            output_path=output_path, modules=tuple(modules or ()), socket_path=socket_path,  # type: ignore[arg-type]
            autostart_daemon=autostart_daemon, track_per_token=track_per_token, stall_timeout=stall_timeout,
            checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,  # type: ignore[arg-type]
            resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint,
            lock_wait=lock_wait, trace_path=trace_path, resource_level=resource_level)  # type: ignore[arg-type]
        self._init(model, config, opts)

    def instrument_model(self, model: "nn.Module") -> None:
        """Name the model to capture (1.3.1's way); its hooks go on when a capture starts.

        The same model again does nothing. A framework captures one model: module names
        in a stream do not say which model they belong to.

        Args:
            model: a ``torch.nn.Module``.

        Raises:
            ValueError: a different model than the one already instrumented.
            TypeError: not a module.
        """
        self._attach(model)

    @classmethod
    def from_options(cls, model: "nn.Module", config: InstrumentationConfig,
                     options: SessionOptions) -> "InstrumentationFramework":
        """Build a framework from ready options.

        Args:
            model: the model.
            config: its capture config.
            options: the session options.

        Returns:
            the framework (no capture started).
        """
        fw = cls.__new__(cls)
        fw._init(model, config, options)
        return fw

    @contextlib.contextmanager
    def capture_activations(self, output_path: PathArg, track_per_token: bool = False,
                            checkpoint_interval_tokens: Optional[int] = None,
                            checkpoint_path: Optional[PathArg] = None, resume_from_checkpoint: bool = False,
                            overwrite_checkpoint: Optional[bool] = None) -> Iterator[Optional[TokenTracker]]:
        """Capture into ``output_path`` while the block runs, as the original 1.3.1 API did.

        Args:
            output_path: the stream file (str or ``pathlib.Path``).
            track_per_token, checkpoint_interval_tokens, checkpoint_path,
                resume_from_checkpoint, overwrite_checkpoint: as :func:`capture_activations`.

        Yields:
            the token tracker, or None when not tracking.

        Without a model (no :meth:`instrument_model` yet) the capture still runs, as in
        1.3.1, with a warning: no tensors, but the tracker's tokens go into the stream and
        the tokens file, and checkpoints are made.

        Raises:
            ValueError: invalid combination (interval <= 0, checkpoints without tracking).
            RuntimeError: a capture is running.
            CheckpointError: a stream that does not match its checkpoint, or a leftover
                checkpoint with ``overwrite_checkpoint=False`` (see :func:`capture_activations`).

        Example:
            >>> fw = InstrumentationFramework(InstrumentationConfig())  # doctest: +SKIP
            >>> fw.instrument_model(model)                            # doctest: +SKIP
            >>> with fw.capture_activations("run.stream", track_per_token=True) as tracker:
            ...     tracker.record_token(42, "hi")
        """
        if self._session is not None:
            raise RuntimeError("capture already started")
        # Argument errors come first, with or without a model.
        opts = self.options.with_capture(
            output_path=output_path, track_per_token=track_per_token,
            checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,
            resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint)
        no_model = self.model is None
        if no_model:
            warn_caller("capture_activations before instrument_model(model): no tensors are captured; the stream "
                        "gets only the recorded tokens" + (" and checkpoints" if checkpoint_interval_tokens else "")
                        + " (as 1.3.1 allowed)")
            self._attach_nothing()
        try:
            self._use(opts)
            # 1.3.1's form: its checkpoints carry 1.3.1's `tokens` list, as 1.3.1's did
            # (docs/CHECKPOINTS.md 3); capture_activations(model, ...) leaves it out.
            self.checkpoint_tokens_131 = True
            with self._running():
                yield self.token_tracker
        finally:
            if no_model:
                self._detach_nothing()

    # ----- facts -------------------------------------------------------------------------------

    @property
    def tokens(self) -> List[Dict[str, Any]]:
        """Tokens recorded with :meth:`record_token` (empty without ``track_per_token``)."""
        return self.token_tracker.tokens if self.token_tracker is not None else []

    def record_token(self, token_id: int, token_text: str, position: Optional[int] = None) -> int:
        """Shortcut for ``token_tracker.record_token`` (requires ``track_per_token=True``).

        Args:
            token_id: vocabulary id.
            token_text: decoded text.
            position: sequence position (default: the token's index).

        Returns:
            the token's index.
        """
        if self.token_tracker is None:
            raise RuntimeError("record_token needs capture_activations(..., track_per_token=True)")
        return self.token_tracker.record_token(token_id, token_text, position)

    @property
    def stats(self) -> Dict[str, Any]:
        """Client-side counters: packets written, drops, bytes copied into the ring."""
        s = self._session or self._last_session
        if s is None:
            return {"packets": 0, "drops": 0, "drop_bytes": 0, "bytes_in": 0}
        return {"packets": s.packets, "drops": s.drops, "drop_bytes": s.drop_bytes,
                "bytes_in": s.bytes_in, "drops_by_module": dict(s.drops_by_module)}

    def analyze_activations(self, stream_path: Optional[PathArg] = None, *,
                            data_path: Optional[PathArg] = None) -> Dict[str, Any]:
        """Summarise a stream file — see :func:`llm_instrumentation.analysis.analyze_activations`.

        Args:
            stream_path: the stream (default: this capture's).
            data_path: the same, by the name 1.3.1's docs/API.md gives it (its code said
                ``stream_path``); give one of the two.

        Returns:
            the summary.
        """
        from .analysis import analyze_activations

        if data_path is not None:
            if stream_path is not None:
                raise TypeError("analyze_activations: give stream_path or data_path, not both")
            stream_path = data_path
        p = stream_path if stream_path is not None else self.output_path
        if p is None:
            raise ValueError("no stream: pass a path")
        return analyze_activations(p)


#: 1.3.1 wrote captures here when no output path was given.
DEFAULT_OUTPUT_DIR = "./captures"


@contextlib.contextmanager
def capture_activations(
    model: "nn.Module",
    output_path: Optional[PathArg] = None,
    output_dir: PathArg = DEFAULT_OUTPUT_DIR,
    preset: Optional[str] = None,
    config: Optional[InstrumentationConfig] = None,
    auto_timestamp: bool = True,
    prefix: str = "",
    include_metadata: bool = True,
    *,
    modules: Optional[Sequence[str]] = None,
    track_per_token: bool = False,
    checkpoint_interval_tokens: Optional[int] = None,
    checkpoint_path: Optional[PathArg] = None,
    resume_from_checkpoint: bool = False,
    overwrite_checkpoint: Optional[bool] = None,
    socket_path: Optional[str] = None,
    autostart_daemon: bool = True,
    stall_timeout: float = 120.0,
    trace_path: Optional[Union[PathArg, bool]] = None,
    resource_level: Optional[Union[str, bool]] = None,
    upload: Optional[str] = None,
    upload_free_local: bool = False,
    parallel_layout: Any = None,
    sharding: Optional[Dict[str, Any]] = None,
    replicated: str = "tp_rank0",
) -> Iterator[InstrumentationFramework]:
    """Capture module outputs of ``model`` into a strapd stream file while the block runs.

    The first eight parameters are 1.3.1's, in its order; the rest are keyword-only.

    Args:
        model: a ``torch.nn.Module``.
        output_path: the stream file. None: a new file in ``output_dir`` named as 1.3.1
            named it (:func:`default_output_path`).
        output_dir: directory for the default output path (created).
        preset: name of a preset (``"fast_capture"``, ``"balanced"``, ``"max"``,
            ``"max_compression"``, ``"attention_analysis"``, ``"mlp_analysis"``). Default
            ``"balanced"`` when ``config`` is not given either. Given with ``config``, the
            preset is used, as in 1.3.1, with a warning.
        config: an :class:`InstrumentationConfig`.
        auto_timestamp: put the local time (``%Y%m%d_%H%M%S``) in the default file name.
        prefix: put this first in the default file name.
        include_metadata: put the model's name and the preset (or codec) in the default
            file name.
        modules: extra fnmatch patterns on module names (``["model.layers.*.mlp"]``).
        track_per_token: give the framework a :class:`TokenTracker` (``fw.token_tracker``);
            a packet's ``step`` is the number of tokens recorded before its forward pass,
            and every recorded token is written into the stream as a TOKEN packet.
        checkpoint_interval_tokens: make a durable checkpoint every N recorded tokens
            (needs ``track_per_token``).
        checkpoint_path: checkpoint file (default ``{output_path}.ckpt.json``).
        resume_from_checkpoint: check the stream against the checkpoint (when there is
            one), cut it back to the end of its last intact token (the checkpoint's offset
            at least), restore ``fw.token_tracker.tokens`` and ``fw.resume_step``, and append.
            With neither checkpoint nor stream: a new capture, with a warning. A 1.3.1
            checkpoint and no strap stream: a new stream that starts with its tokens.
        overwrite_checkpoint: what to do with a checkpoint an earlier capture left at the
            checkpoint path (``{output_path}.ckpt.json`` by default) when not resuming:
            True deletes it and starts over; False raises ``CheckpointError``; None (not
            given, as in every 1.3.1 call) keeps that capture by moving its stream and
            checkpoint aside to ``<stem>.interrupted-N<ext>`` with a warning (a 1.3.1
            checkpoint is deleted with a warning, as 1.3.1 overwrote it).
        socket_path: strapd control socket (default: PROTOCOL.md 1 resolution).
        autostart_daemon: start ``strapd serve`` when no daemon answers.
        stall_timeout: seconds to wait for ring space before raising.
        trace_path: where strapd writes its kernel trace for this capture (JSONL snapshots
            of block I/O, off-CPU time, page faults, syscalls, PSI naming this session;
            docs/TRACE_FORMAT.md). None (default) follows ``config.trace`` (off unless set;
            then ``{output_path}.trace.jsonl``); True that default path; False no trace.
            The client opens the file and passes its descriptor; strapd writes a snapshot
            every ``strapd serve --trace-interval`` and one at the session's end.
        resource_level: record resource events (docs/RESOURCE_EVENTS.md: per-module time,
            FLOPs, memory, MLP, attention→MLP handoff, KV cache) at ``"MINIMAL"``,
            ``"DETAILED"`` or ``"VERBOSE"``; strapd writes them to
            ``{output_path}.resources.jsonl``. None (default) follows
            ``config.resource_level``, then ``STRAP_RESOURCE_LOG_LEVEL`` (off when neither
            is set); False never. ``STRAP_RESOURCE_LOG_DISABLED=1`` turns them off whatever
            is asked. ``fw.resource_monitor`` controls them while the capture runs.
        upload: ``"s3://bucket/prefix"``: strapd uploads the stream, its trace, resource log
            and tokens file there while it captures, in parts of bytes already durable on
            disk (docs/OBJECT_STORAGE.md); credentials and endpoint are strapd's (AWS
            environment, shared files, ``serve --s3-endpoint``). None follows
            ``config.upload``, then the daemon's ``serve --upload``. The upload goes on after
            the block ends; ``strapd status`` shows it.
        upload_free_local: strapd frees the stream's bytes on the local disk once they are
            uploaded, while it captures, so a long capture needs a bounded local disk
            (``serve --upload-free-local`` for this session; docs/OBJECT_STORAGE.md
            "Freeing the local disk"). Needs an upload (``upload``, the config's or the
            daemon's); the local stream is then not kept (the object is the copy), and a
            resume needs the same upload target and strapd state directory.
        parallel_layout: for one rank of a distributed job (docs/DISTRIBUTED.md): how the
            ranks split the model: a ``DeviceMesh`` with dimensions named among ``tp``,
            ``pp``, ``dp``, a dict (``{"tp_size": 2}``) or a :class:`ParallelLayout`. None:
            every rank is its own data-parallel replica. Refused in a single process.
        sharding: with ``tp_size`` > 1, what hooked modules' outputs are:
            ``{fnmatch pattern: "replicated" | "local" | {"shard": axis} | Shard(axis)}``,
            first match wins; modules not matched are detected (a DTensor output,
            transformers' ``tp_plan``, else replicated).
        replicated: ``"tp_rank0"`` (default): outputs the same on every tensor-parallel
            rank are stored by tp rank 0 only, other tp ranks do not hook them;
            ``"every_rank"``: every tp rank stores them, marked with a ``replica`` meta.

    Yields:
        the :class:`InstrumentationFramework`; on exit the session is closed and the file
        complete (on an exception inside the block it is still closed cleanly, and the
        checkpoint is kept).

    Raises:
        ValueError: an unknown preset, a bad option combination, or a resume without
            ``output_path``.

    Example:
        >>> with capture_activations(model, "run.stream", preset="balanced") as fw:  # doctest: +SKIP
        ...     model(input_ids)
        >>> fw.analyze_activations()["packets"]  # doctest: +SKIP
    """
    # SessionOptions checks these again; checking first keeps the error a bad combination
    # gets the same whatever else is wrong (preset, config, output path).
    check_tracking(track_per_token, checkpoint_interval_tokens, checkpoint_path, resume_from_checkpoint,
                   overwrite_checkpoint)
    if preset is not None and config is not None:
        warnings.warn(f"capture_activations: both preset={preset!r} and config given; using the preset "
                      f"(as 1.3.1 did) and ignoring config", UserWarning, stacklevel=3)
        config = None
    if config is None:
        config = InstrumentationConfig.from_preset(preset or "balanced")
    elif not isinstance(config, InstrumentationConfig):
        raise TypeError(f"config must be an InstrumentationConfig, got {type(config).__name__}")
    reserved = output_path is None
    if output_path is None:
        if resume_from_checkpoint:
            raise ValueError("resume_from_checkpoint needs the output_path of the capture to resume")
        output_path = default_output_path(model, config, preset, output_dir, auto_timestamp, prefix,
                                          include_metadata)
    started = False
    try:
        opts = SessionOptions(
            output_path=output_path, modules=tuple(modules or ()), socket_path=socket_path,  # type: ignore[arg-type]
            autostart_daemon=autostart_daemon, track_per_token=track_per_token, stall_timeout=stall_timeout,
            checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,  # type: ignore[arg-type]
            resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint,
            trace_path=trace_path, resource_level=resource_level, upload=upload,  # type: ignore[arg-type]
            upload_free_local=upload_free_local, parallel_layout=parallel_layout, sharding=sharding, replicated=replicated)
        fw = InstrumentationFramework.from_options(model, config, opts)
        with fw._running():
            started = True
            yield fw
    finally:
        if reserved and not started:
            _remove_if_empty(os.fspath(output_path))


def default_output_path(model: "nn.Module", config: InstrumentationConfig, preset: Optional[str] = None,
                        output_dir: PathArg = DEFAULT_OUTPUT_DIR, auto_timestamp: bool = True, prefix: str = "",
                        include_metadata: bool = True) -> str:
    """Make ``output_dir`` and reserve a new stream file there, named as 1.3.1 named it.

    The name joins with ``_``: ``prefix`` if given; with ``include_metadata`` the model's
    name (``config.model_type``, else the lowercased class name; characters other than
    letters, digits, ``-`` and ``_`` become ``_``) and ``preset`` (else the config's codec);
    with ``auto_timestamp`` the local time, ``%Y%m%d_%H%M%S``; ``capture`` when that leaves
    nothing; then ``.stream``. 1.3.1 overwrote a capture started in the same second with
    the same name; here ``_1``, ``_2``, ... is added before ``.stream`` instead. The file is
    created empty (exclusively), so two processes never pick the same one.

    Args:
        model: the model.
        config: its config.
        preset: the preset's name, if one was used.
        output_dir: the directory.
        auto_timestamp, prefix, include_metadata: as :func:`capture_activations`.

    Returns:
        the new file's path.

    Example:
        >>> default_output_path(model, cfg, "balanced", "/runs")  # doctest: +SKIP
        '/runs/llama_balanced_20250101_120000.stream'
    """
    os.makedirs(output_dir, exist_ok=True)
    parts = [prefix] if prefix else []
    if include_metadata:
        name = describe_model(model)["family"]
        parts.append("".join(c if c.isalnum() or c in "-_" else "_" for c in name))
        parts.append(preset or config.compression_algorithm or DEFAULT_CODEC)  # a normalized config names one
    if auto_timestamp:
        parts.append(datetime.datetime.now().strftime("%Y%m%d_%H%M%S"))
    stem = os.path.join(os.fspath(output_dir), "_".join(parts) or "capture")
    for n in itertools.count():
        path = f"{stem}.stream" if n == 0 else f"{stem}_{n}.stream"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")  # itertools.count() never ends


def _remove_if_empty(path: str) -> None:
    # A reserved default path whose capture never started would otherwise stay behind as
    # an empty file.
    try:
        if os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass
