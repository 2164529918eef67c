"""The capture API: :func:`capture_activations` and :class:`InstrumentationFramework`.

This module only ties the parts together: options (``_options``), module selection and
hooks (``_hooks``), the stream, trace, checkpoint and tokens files (``_resume``), the OPEN
request (``_open``) and the strapd session (``_session``).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _daemon, _open, _resume
from . import _protocol as P
from . import checkpoint as ckpt
from ._hooks import Hooks, choose_modules, sample_positions, split_output
from ._options import SessionOptions, check_tracking
from ._resume import tokens_path
from ._ring import Ring
from ._session import CaptureSession
from .checkpoint import CheckpointError
from .config import InstrumentationConfig
from .tracking import TokenTracker

__all__ = ["InstrumentationFramework", "TokenTracker", "capture_activations", "split_output", "sample_positions",
           "CheckpointError", "tokens_path", "SessionOptions"]

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

log = logging.getLogger("llm_instrumentation")
PathArg = Union[str, "os.PathLike[str]"]


def _option(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.options, name), doc=doc)


class InstrumentationFramework:
    """Hooks on ``model`` that stream module outputs to strapd.

    Either use :func:`capture_activations`, or build one and use its
    :meth:`capture_activations` context manager (the original 1.3.1 way), which yields the
    token tracker. Parameters: as :func:`capture_activations`, plus ``lock_wait`` (seconds a
    resume waits for the stream's lock).

    Attributes:
        model, config: the instrumented model and its :class:`InstrumentationConfig`.
        options: the :class:`SessionOptions` of the current (or next) capture.
        hooked_modules: names of the modules with hooks.
        token_tracker: the :class:`TokenTracker` (``None`` unless ``track_per_token``).
        forward_count: forward passes of the model seen so far.
        summary: the daemon's CLOSED body after :meth:`stop`.
        trace_path: the kernel trace file strapd writes (None: no trace).
        last_checkpoint: the last checkpoint written or resumed from (None: none yet).
        resume_step: the step a resumed capture goes on from (0 when not resumed).
        checkpoint_times: seconds each checkpoint took (request to durable file).
    """

    output_path = _option("output_path", "absolute path of the stream file (None until a capture is set up).")
    checkpoint_path = _option("checkpoint_file", "where checkpoints go (None when not checkpointing).")
    checkpoint_interval = _option("checkpoint_interval_tokens", "tokens between checkpoints (None: none).")
    resume = _option("resume_from_checkpoint", "whether this capture resumes a checkpoint.")
    overwrite_checkpoint = _option("overwrite_checkpoint", "whether a leftover checkpoint is replaced.")
    socket_path = _option("socket_path", "strapd control socket (None: default resolution).")
    autostart_daemon = _option("autostart_daemon", "whether strapd is started when none answers.")
    stall_timeout = _option("stall_timeout", "seconds to wait for ring space.")
    lock_wait = _option("lock_wait", "seconds a resume waits for the stream's lock.")

    def __init__(self, model: "nn.Module", config: InstrumentationConfig, output_path: Optional[PathArg] = None,
                 modules: Optional[Sequence[str]] = None, socket_path: Optional[str] = None,
                 autostart_daemon: bool = True, track_per_token: bool = False, stall_timeout: float = 120.0,
                 checkpoint_interval_tokens: Optional[int] = None, checkpoint_path: Optional[PathArg] = None,
                 resume_from_checkpoint: bool = False, overwrite_checkpoint: bool = False, lock_wait: float = 30.0,
                 trace_path: Optional[Union[PathArg, bool]] = None) -> None:
        opts = SessionOptions(
            output_path=output_path, modules=tuple(modules or ()), socket_path=socket_path,  # type: ignore[arg-type]
            autostart_daemon=autostart_daemon, track_per_token=track_per_token, stall_timeout=stall_timeout,
            checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,  # type: ignore[arg-type]
            resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint,
            lock_wait=lock_wait, trace_path=trace_path)  # type: ignore[arg-type]
        self._init(model, config, opts)

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

    def _init(self, model: "nn.Module", config: InstrumentationConfig, options: SessionOptions) -> None:
        self.model = model
        self.config = config
        self.plan = config.transport_plan()
        self.hooked_modules = choose_modules(model, config, options.modules)
        self._hooks = Hooks(model, self.hooked_modules, config)
        self.forward_count = 0
        self.summary: Optional[Dict[str, Any]] = None
        self.trace_path: Optional[str] = None
        self._session: Optional[CaptureSession] = None
        self._last_session: Optional[CaptureSession] = None
        self._forward = 0
        self._step = 0
        self._fingerprint: Optional[str] = None
        self._use(options)

    def _use(self, options: SessionOptions) -> None:
        """Make ``options`` the current capture's and reset its per-capture state."""
        self.options = options
        self.token_tracker: Optional[TokenTracker] = TokenTracker() if options.track_per_token else None
        self.last_checkpoint: Optional[ckpt.Checkpoint] = None
        self.resume_step = 0
        self.checkpoint_times: List[float] = []
        self._started_at = 0.0
        self._clean = False

    def fingerprint(self) -> str:
        """The capture's fingerprint (config, transport, hooked modules, model structure):
        checkpoints and the stream header carry it; a resume must match it.

        Returns:
            ``"sha256:..."``.
        """
        if self._fingerprint is None:
            self._fingerprint = _open.fingerprint(self.model, self.config, self.plan, self.hooked_modules)
        return self._fingerprint

    # ----- life cycle --------------------------------------------------------------------------

    def start(self) -> "InstrumentationFramework":
        """Connect to strapd (starting it if needed), open the session, install the hooks.
        With ``resume_from_checkpoint`` the stream is checked and cut back first.

        Returns:
            self.
        """
        from . import __version__

        opts, plan = self.options, self.plan
        if self._session is not None:
            raise RuntimeError("capture already started")
        if opts.output_path is None:
            raise ValueError("no output_path: pass one to capture_activations")
        if plan.note:
            log.warning("llm_instrumentation: %s", plan.note)
        Path(opts.output_path).parent.mkdir(parents=True, exist_ok=True)
        out = _resume.open_output(opts, self.fingerprint())
        if out.resume is not None:
            tr = self.token_tracker
            assert tr is not None
            tr.tokens, tr.resume_step = out.tokens, out.resume.token_count
            self.resume_step, self.forward_count = out.resume.token_count, out.resume.forward_count
            self.last_checkpoint = out.resume
        conn: Optional[P.Connection] = None
        ring: Optional[Ring] = None
        trace_fd: Optional[int] = None
        try:
            self.trace_path = _resume.resolve_trace(opts, self.config.trace)
            if self.trace_path is not None:
                trace_fd = _resume.open_trace(self.trace_path, out.resume is not None)
            conn = _daemon.connect(opts.socket_path, autostart=opts.autostart_daemon)
            P.handshake(conn, f"llm_instrumentation/{__version__}", os.getpid())
            ring = Ring(plan.ring_size)
            session = CaptureSession(conn, ring, plan.policy, opts.stall_timeout)
            session.open(out.fd, _open.open_request(self.model, self.config, plan, self.hooked_modules,
                                                    opts.output_path, self.fingerprint(), out.resume),
                         trace_fd=trace_fd)
            if out.resume is not None:
                session.seq = session.last_tensor_seq = out.resume.last_seq
        except BaseException:
            if conn is not None:
                conn.close()
            if ring is not None:
                ring.close()
            raise
        finally:
            # strapd keeps its own descriptors, and with the stream's its flock, until the
            # session ends: a resume or another capture waits for that.
            os.close(out.fd)
            if trace_fd is not None:
                os.close(trace_fd)
        self._session = session
        self._started_at = time.monotonic()
        if self.token_tracker is not None:
            self.token_tracker._sink = self._on_token
        self._hooks.install(self._on_forward_start, self._on_forward_end, self._on_record)
        return self

    def _on_forward_start(self) -> None:
        self._forward = self.forward_count
        self.forward_count += 1
        self._step = self.token_tracker.step if self.token_tracker is not None else 0

    def _on_forward_end(self) -> None:
        if self._session is not None:
            self._session.flush()

    def _on_record(self, name: str, t: "torch.Tensor", meta: Optional[Dict[str, Any]]) -> None:
        if self._session is not None:
            self._session.write_tensor(name, t, self._step, self._forward, meta)

    def _on_token(self, tok: Dict[str, Any]) -> None:
        session = self._session
        if session is None:
            return
        session.token(tok["token_index"], tok["token_id"], tok["token_text"], tok["position"])
        interval = self.options.checkpoint_interval_tokens
        if interval is not None and (tok["token_index"] + 1) % interval == 0:
            self.checkpoint()  # looked up on the instance: tests wrap it to simulate crashes

    def _remove_hooks(self) -> None:
        self._hooks.remove()
        if self.token_tracker is not None:
            self.token_tracker._sink = None

    def checkpoint(self) -> ckpt.Checkpoint:
        """Make a checkpoint now: strapd writes and fdatasyncs every packet sent so far and
        reports the stream's offset and last packet; then the checkpoint file is replaced
        atomically. Called every ``checkpoint_interval_tokens`` tokens; callable directly.

        Returns:
            the checkpoint written.
        """
        session, ck_path, tr = self._session, self.options.checkpoint_file, self.token_tracker
        if session is None or ck_path is None or tr is None:
            raise RuntimeError("checkpoint() needs a live capture with track_per_token=True and a checkpoint path")
        t0 = time.perf_counter()
        c = _resume.checkpoint_from(session.checkpoint(), self.options.output_path or "", self.fingerprint(),
                                    tr.step, self.forward_count)
        ckpt.write_atomic(ck_path, c.to_json())
        self.checkpoint_times.append(time.perf_counter() - t0)
        self.last_checkpoint = c
        return c

    def stop(self) -> Dict[str, Any]:
        """Remove the hooks, close the session (the daemon finishes the file). With tracking,
        ``{output_path}_tokens.json`` is written; after a clean close the checkpoint is
        deleted (it is kept when the session had failed).

        Returns:
            the CLOSED summary (``packets``, ``drops``, ``bytes_in``, ``bytes_out``, ``file_bytes``).
        """
        self._remove_hooks()
        session = self._session
        if session is None:
            return self.summary or {}
        clean = False
        try:
            if session.error is None:
                self.summary = session.close().to_body()
                clean = True
            else:
                self.summary = {}
        finally:
            session.shutdown()
            self._last_session, self._session = session, None
            tr, out = self.token_tracker, self.options.output_path
            if tr is not None and out is not None:
                took = time.monotonic() - self._started_at if self._started_at else 0.0
                _resume.write_tokens_file(out, tr.tokens, took, self.resume_step, self.forward_count,
                                          self.fingerprint())
        ck_path = self.options.checkpoint_file
        if clean and self._clean and ck_path is not None and os.path.exists(ck_path):
            ckpt.fsync_unlink(ck_path)
        return self.summary

    def abort(self) -> None:
        """Remove the hooks and drop the connection without CLOSE (the daemon ends the stream
        as ``aborted``). The checkpoint is kept."""
        self._remove_hooks()
        if self._session is not None:
            self._session.shutdown()
            self._session = None

    @contextlib.contextmanager
    def capture_activations(self, output_path: PathArg, track_per_token: bool = False,
                            checkpoint_interval_tokens: Optional[int] = None,
                            checkpoint_path: Optional[PathArg] = None, resume_from_checkpoint: bool = False,
                            overwrite_checkpoint: bool = False) -> Iterator[Optional[TokenTracker]]:
        """Capture into ``output_path`` while the block runs, as the original 1.3.1 API did.

        Args:
            output_path: the stream file (str or ``pathlib.Path``).
            track_per_token, checkpoint_interval_tokens, checkpoint_path,
                resume_from_checkpoint, overwrite_checkpoint: as :func:`capture_activations`.

        Yields:
            the token tracker, or None when not tracking.

        Raises:
            ValueError: invalid combination (interval <= 0, checkpoints without tracking).
            CheckpointError: resume without a checkpoint, a stream that does not match it, or
                a leftover checkpoint when resume was not asked for.

        Example:
            >>> fw = InstrumentationFramework(model, InstrumentationConfig())  # doctest: +SKIP
            >>> with fw.capture_activations("run.strap", track_per_token=True) as tracker:
            ...     tracker.record_token(42, "hi")
        """
        if self._session is not None:
            raise RuntimeError("capture already started")
        self._use(self.options.with_capture(
            output_path=output_path, track_per_token=track_per_token,
            checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,
            resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint))
        with self._running():
            yield self.token_tracker

    @contextlib.contextmanager
    def _running(self) -> Iterator["InstrumentationFramework"]:
        self.start()
        try:
            yield self
        except BaseException:
            # Keep what was captured: close cleanly when the connection is intact; the
            # checkpoint stays, so the capture can be resumed.
            try:
                self.stop()
            except Exception as e:  # the user's exception matters more; log ours
                log.error("llm_instrumentation: closing the capture after an error failed: %s", e)
                self.abort()
            raise
        self._clean = True
        self.stop()

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

    def analyze_activations(self, path: Optional[PathArg] = None) -> Dict[str, Any]:
        """Summarise a stream file — see :func:`llm_instrumentation.analysis.analyze_activations`.

        Args:
            path: the stream (default: this capture's).

        Returns:
            the summary.
        """
        from .analysis import analyze_activations

        p = path if path is not None else self.output_path
        if p is None:
            raise ValueError("no stream: pass a path")
        return analyze_activations(p)


@contextlib.contextmanager
def capture_activations(
    model: "nn.Module",
    preset: Optional[str] = None,
    config: Optional[InstrumentationConfig] = None,
    output_path: Optional[PathArg] = None,
    output_dir: PathArg = "./captures",
    modules: Optional[Sequence[str]] = None,
    track_per_token: bool = False,
    checkpoint_interval_tokens: Optional[int] = None,
    checkpoint_path: Optional[PathArg] = None,
    resume_from_checkpoint: bool = False,
    overwrite_checkpoint: bool = False,
    socket_path: Optional[str] = None,
    autostart_daemon: bool = True,
    stall_timeout: float = 120.0,
    trace_path: Optional[Union[PathArg, bool]] = None,
) -> Iterator[InstrumentationFramework]:
    """Capture module outputs of ``model`` into a strapd stream file while the block runs.

    Args:
        model: a ``torch.nn.Module``.
        preset: name of a preset (``"fast_capture"``, ``"balanced"``, ``"max"``,
            ``"max_compression"``, ``"attention_analysis"``, ``"mlp_analysis"``). Default
            ``"balanced"`` when ``config`` is not given either.
        config: an :class:`InstrumentationConfig` (exclusive with ``preset``).
        output_path: the stream file; default ``output_dir/capture_<UTC time, µs>_<pid>.strap``.
        output_dir: directory for the default output path.
        modules: extra fnmatch patterns on module names (``["model.layers.*.mlp"]``).
        track_per_token: give the framework a :class:`TokenTracker` (``fw.token_tracker``);
            a packet's ``step`` is the number of tokens recorded before its forward pass,
            and every recorded token is written into the stream as a TOKEN packet.
        checkpoint_interval_tokens: make a durable checkpoint every N recorded tokens
            (needs ``track_per_token``).
        checkpoint_path: checkpoint file (default ``{output_path}.ckpt.json``).
        resume_from_checkpoint: check the stream against the checkpoint, cut it back there,
            restore ``fw.token_tracker.tokens`` and ``fw.resume_step``, and append.
        overwrite_checkpoint: start a new capture although a checkpoint exists (it is deleted).
        socket_path: strapd control socket (default: PROTOCOL.md 1 resolution).
        autostart_daemon: start ``strapd serve`` when no daemon answers.
        stall_timeout: seconds to wait for ring space before raising.
        trace_path: where strapd writes its kernel trace for this capture (JSONL snapshots
            of block I/O, off-CPU time, page faults, syscalls, PSI naming this session;
            docs/TRACE_FORMAT.md). None (default) follows ``config.trace`` (off unless set;
            then ``{output_path}.trace.jsonl``); True that default path; False no trace.
            The client opens the file and passes its descriptor; strapd writes a snapshot
            every ``strapd serve --trace-interval`` and one at the session's end.

    Yields:
        the :class:`InstrumentationFramework`; on exit the session is closed and the file
        complete (on an exception inside the block it is still closed cleanly, and the
        checkpoint is kept).

    Example:
        >>> with capture_activations(model, preset="balanced", output_path="run.strap") as fw:  # doctest: +SKIP
        ...     model(input_ids)
        >>> fw.analyze_activations()["packets"]  # doctest: +SKIP
    """
    check_tracking(track_per_token, checkpoint_interval_tokens, checkpoint_path, resume_from_checkpoint,
                   overwrite_checkpoint)
    if preset is not None and config is not None:
        raise ValueError("pass either preset or config, not both")
    if config is None:
        config = InstrumentationConfig.from_preset(preset or "balanced")
    elif not isinstance(config, InstrumentationConfig):
        raise TypeError(f"config must be an InstrumentationConfig, got {type(config).__name__}")
    if output_path is None:
        if resume_from_checkpoint:
            raise ValueError("resume_from_checkpoint needs the output_path of the capture to resume")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S_%f")
        output_path = Path(output_dir) / f"capture_{stamp}_{os.getpid()}.strap"
    opts = SessionOptions(
        output_path=output_path, modules=tuple(modules or ()), socket_path=socket_path,  # type: ignore[arg-type]
        autostart_daemon=autostart_daemon, track_per_token=track_per_token, stall_timeout=stall_timeout,
        checkpoint_interval_tokens=checkpoint_interval_tokens, checkpoint_path=checkpoint_path,  # type: ignore[arg-type]
        resume_from_checkpoint=resume_from_checkpoint, overwrite_checkpoint=overwrite_checkpoint,
        trace_path=trace_path)  # type: ignore[arg-type]
    fw = InstrumentationFramework.from_options(model, config, opts)
    with fw._running():
        yield fw
