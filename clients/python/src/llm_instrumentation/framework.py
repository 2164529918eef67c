"""Hooks on a model, and the context manager that captures through strapd."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _daemon
from . import _protocol as P
from . import checkpoint as ckpt
from ._ring import Ring
from ._session import CaptureSession
from .checkpoint import CheckpointError
from .config import HookGranularity, InstrumentationConfig
from .core.auto_detect import detect_model_architecture, select_modules
from .tracking import TokenTracker

__all__ = ["InstrumentationFramework", "TokenTracker", "capture_activations", "split_output", "sample_positions",
           "CheckpointError", "tokens_path"]

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

log = logging.getLogger("llm_instrumentation")


def split_output(name: str, out: Any) -> List[Tuple[str, "torch.Tensor"]]:
    """The tensors of one module output, with their record names.

    A tensor is ``name``. In a tuple/list, the first tensor is ``name`` and any other
    tensor at index ``i`` is ``name.out{i}`` (non-tensors such as caches and ``None`` are
    skipped). A ``ModelOutput`` / dict: the first tensor value is ``name``, every other tensor
    value ``name.{key}``.
    """
    import torch

    if isinstance(out, torch.Tensor):
        return [(name, out)]
    items: List[Tuple[str, Any]]
    if isinstance(out, dict):  # transformers ModelOutput is an OrderedDict
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"out{i}", v) for i, v in enumerate(out)]
    else:
        return []
    res: List[Tuple[str, "torch.Tensor"]] = []
    for key, v in items:
        if isinstance(v, torch.Tensor):
            res.append((name if not res else f"{name}.{key}", v))
    return res


def sample_positions(seq_len: int, spec: Union[int, Tuple[int, ...]]) -> List[int]:
    """The kept positions of a ``SAMPLED_SLICES`` capture.

    Args:
        seq_len: length of the sequence dimension.
        spec: stride k (keeps ``0, k, 2k, ...`` plus ``seq_len - 1``) or explicit positions
            (negative = from the end; out-of-range ones are ignored).

    Returns:
        sorted unique positions.
    """
    if seq_len <= 0:
        return []
    if isinstance(spec, int):
        pos = set(range(0, seq_len, spec))
        pos.add(seq_len - 1)
    else:
        pos = {p + seq_len if p < 0 else p for p in spec}
        pos = {p for p in pos if 0 <= p < seq_len}
    return sorted(pos)


def tokens_path(output_path: Union[str, os.PathLike]) -> str:
    """``{output_path}_tokens.json``: the tokens file of a capture. Appending (never
    replacing a suffix) means it can never be the stream itself, whatever its name."""
    return os.fspath(output_path) + "_tokens.json"


def _check_tracking_args(track_per_token: Any, checkpoint_interval_tokens: Any, checkpoint_path: Any,
                         resume_from_checkpoint: Any, overwrite_checkpoint: Any) -> None:
    if not isinstance(track_per_token, bool):
        raise TypeError(f"track_per_token must be a bool, got {track_per_token!r}")
    for name, v in (("resume_from_checkpoint", resume_from_checkpoint), ("overwrite_checkpoint", overwrite_checkpoint)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {v!r}")
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
    if resume_from_checkpoint and overwrite_checkpoint:
        raise ValueError("resume_from_checkpoint and overwrite_checkpoint exclude each other")


class InstrumentationFramework:
    """Hooks on ``model`` that stream module outputs to strapd.

    Either use :func:`capture_activations`, or build one and use its
    :meth:`capture_activations` context manager (the original 1.3.1 way), which yields the
    token tracker.

    Attributes:
        model: the instrumented model.
        config: the :class:`InstrumentationConfig`.
        output_path: absolute path of the stream file (None until a capture is set up).
        hooked_modules: names of the modules with hooks.
        token_tracker: the :class:`TokenTracker` (``None`` unless ``track_per_token``).
        forward_count: forward passes of the model seen so far.
        summary: the daemon's CLOSED body after :meth:`stop`.
        checkpoint_path: where checkpoints go (None when not checkpointing).
        last_checkpoint: the last checkpoint written or resumed from (None: none yet).
        resume_step: the step a resumed capture goes on from (0 when not resumed).
        checkpoint_times: seconds each checkpoint took (request to durable file).
    """

    def __init__(self, model: "nn.Module", config: InstrumentationConfig,
                 output_path: Optional[Union[str, os.PathLike]] = None,
                 modules: Optional[Sequence[str]] = None, socket_path: Optional[str] = None,
                 autostart_daemon: bool = True, track_per_token: bool = False,
                 stall_timeout: float = 120.0, checkpoint_interval_tokens: Optional[int] = None,
                 checkpoint_path: Optional[Union[str, os.PathLike]] = None, resume_from_checkpoint: bool = False,
                 overwrite_checkpoint: bool = False, lock_wait: float = 30.0,
                 trace_path: Optional[Union[str, os.PathLike, bool]] = None) -> None:
        self.model = model
        self.config = config
        self._trace_arg = trace_path
        #: the kernel trace file strapd writes for this capture (None: no trace).
        self.trace_path: Optional[str] = None
        patterns = tuple(config.modules) + tuple(modules or ())
        self.hooked_modules = select_modules(model, config.granularity, patterns)
        if not self.hooked_modules:
            raise ValueError(
                f"no module of {type(model).__name__} matches granularity {config.granularity.name}"
                f"{' and patterns ' + str(list(patterns)) if patterns else ''}; pass modules=[...] patterns"
            )
        self.socket_path = socket_path
        self.autostart_daemon = autostart_daemon
        self.stall_timeout = stall_timeout
        self.lock_wait = lock_wait
        self.forward_count = 0
        self.summary: Optional[Dict[str, Any]] = None
        self.plan = config.transport_plan()
        self._session: Optional[CaptureSession] = None
        self._last_session: Optional[CaptureSession] = None
        self._handles: List[Any] = []
        self._forward = 0
        self._step = 0
        self.output_path: Optional[str] = None
        self.token_tracker: Optional[TokenTracker] = None
        self.checkpoint_path: Optional[str] = None
        self._setup(output_path, track_per_token, checkpoint_interval_tokens, checkpoint_path,
                    resume_from_checkpoint, overwrite_checkpoint)

    def _setup(self, output_path: Optional[Union[str, os.PathLike]], track_per_token: bool,
               checkpoint_interval_tokens: Optional[int], checkpoint_path: Optional[Union[str, os.PathLike]],
               resume_from_checkpoint: bool, overwrite_checkpoint: bool) -> None:
        _check_tracking_args(track_per_token, checkpoint_interval_tokens, checkpoint_path, resume_from_checkpoint,
                             overwrite_checkpoint)
        self.output_path = os.path.abspath(os.fspath(output_path)) if output_path is not None else None
        self.token_tracker = TokenTracker() if track_per_token else None
        self.checkpoint_interval = checkpoint_interval_tokens
        self.resume = resume_from_checkpoint
        self.overwrite_checkpoint = overwrite_checkpoint
        self.checkpoint_path = None
        if self.output_path is not None and (checkpoint_interval_tokens is not None or resume_from_checkpoint
                                             or checkpoint_path is not None):
            self.checkpoint_path = os.path.abspath(os.fspath(checkpoint_path)) if checkpoint_path is not None \
                else ckpt.default_path(self.output_path)
        self.last_checkpoint: Optional[ckpt.Checkpoint] = None
        self.resume_step = 0
        self.checkpoint_times: List[float] = []
        self._fingerprint: Optional[str] = None
        self._started_at = 0.0
        self._clean = False

    # ----- life cycle --------------------------------------------------------------------------

    def _transport(self) -> Dict[str, Any]:
        plan = self.plan
        return {"codec": plan.codec, "codec_level": plan.codec_level, "block_size": plan.block_size}

    def fingerprint(self) -> str:
        """The capture's fingerprint (config, transport, hooked modules, model structure):
        checkpoints and the stream header carry it; a resume must match it."""
        if self._fingerprint is None:
            self._fingerprint = ckpt.fingerprint(self.model, self.config.to_dict(), self._transport(),
                                                 list(self.hooked_modules))
        return self._fingerprint

    def _open_output(self) -> Tuple[int, Optional[ckpt.Checkpoint]]:
        """Open and lock the stream file; for a resume, check it against the checkpoint,
        restore the tracker and cut the file back to the checkpoint."""
        assert self.output_path is not None
        ck_path = self.checkpoint_path
        if not self.resume:
            leftover = ck_path or ckpt.default_path(self.output_path)
            if os.path.exists(leftover):
                if not self.overwrite_checkpoint:
                    raise CheckpointError(
                        f"a checkpoint of an earlier capture exists at {leftover}: pass resume_from_checkpoint=True "
                        f"to continue that capture, or overwrite_checkpoint=True to start over (the stream "
                        f"{self.output_path} and the checkpoint are then replaced)")
            # Not O_TRUNC: a live capture of the same file must keep its bytes; the lock
            # tells, then the file is emptied.
            fd = os.open(self.output_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                ckpt.lock_stream(fd, min(self.lock_wait, 10.0), self.output_path)
                os.ftruncate(fd, 0)
                if os.path.exists(leftover):
                    ckpt.fsync_unlink(leftover)
            except BaseException:
                os.close(fd)
                raise
            return fd, None
        assert ck_path is not None
        c = ckpt.load(ck_path)
        try:
            fd = os.open(self.output_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {ck_path} names stream {self.output_path}, which does not exist") from None
        try:
            ckpt.lock_stream(fd, self.lock_wait, self.output_path)
            tokens = ckpt.scan_prefix(fd, c, self.output_path, self.fingerprint())
            os.ftruncate(fd, c.stream_offset)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        tr = self.token_tracker
        assert tr is not None
        tr.tokens = tokens
        tr.resume_step = c.token_count
        self.resume_step = c.token_count
        self.forward_count = c.forward_count
        self.last_checkpoint = c
        return fd, c

    def start(self) -> "InstrumentationFramework":
        """Connect to strapd (starting it if needed), open the session, install the hooks.
        With ``resume_from_checkpoint`` the stream is checked and cut back first."""
        from . import __version__

        if self._session is not None:
            raise RuntimeError("capture already started")
        if self.output_path is None:
            raise ValueError("no output_path: pass one to capture_activations")
        plan = self.plan
        if plan.note:
            log.warning("llm_instrumentation: %s", plan.note)
        Path(self.output_path).parent.mkdir(parents=True, exist_ok=True)
        if self.resume and self.checkpoint_path is not None and not os.path.exists(self.checkpoint_path):
            raise CheckpointError(f"resume_from_checkpoint=True but there is no checkpoint at {self.checkpoint_path}")
        out_fd, resume = self._open_output()
        conn = None
        ring: Optional[Ring] = None
        trace_fd: Optional[int] = None
        try:
            trace_fd = self._open_trace(resume is not None)
            conn = _daemon.connect(self.socket_path, autostart=self.autostart_daemon)
            P.handshake(conn, f"llm_instrumentation/{__version__}", os.getpid())
            ring = Ring(plan.ring_size)
            session = CaptureSession(conn, ring, plan.policy, self.stall_timeout)
            arch = detect_model_architecture(self.model)
            body: Dict[str, Any] = {
                "codec": plan.codec,
                "codec_level": plan.codec_level,
                "block_size": plan.block_size,
                "memory_hint": plan.memory_hint,
                "metadata": {
                    "model_class": type(self.model).__name__,
                    "model_family": arch["family"],
                    "capture_config": self.config.to_dict(),
                    "transport": {"codec": plan.codec, "codec_level": plan.codec_level,
                                  "block_size": plan.block_size, "ring_size": plan.ring_size,
                                  "note": plan.note},
                    "modules": self.hooked_modules,
                    "output_path": self.output_path,
                    "fingerprint": self.fingerprint(),
                    "client": {"pid": os.getpid(), "argv0": os.path.basename(sys.argv[0]) if sys.argv else "",
                               "version": __version__},
                },
            }
            if plan.lossy is not None:
                body["lossy"] = plan.lossy
            if resume is not None:
                body["append_at"] = resume.stream_offset
                body["resume"] = {"last_seq": resume.last_seq, "last_crc": resume.last_packet_crc,
                                  "packets": resume.packets}
            session.open(out_fd, body, trace_fd=trace_fd)
            if resume is not None:
                session.seq = resume.last_seq
                session.last_tensor_seq = resume.last_seq
        except BaseException:
            if conn is not None:
                conn.close()
            if ring is not None:
                ring.close()
            os.close(out_fd)
            if trace_fd is not None:
                os.close(trace_fd)
            raise
        # strapd keeps its own descriptor, and with it the stream's flock, until the session
        # ends: a resume or another capture waits for that.
        os.close(out_fd)
        if trace_fd is not None:
            os.close(trace_fd)
        self._session = session
        self._started_at = time.monotonic()
        if self.token_tracker is not None:
            self.token_tracker._sink = self._on_token
        self._install_hooks()
        return self

    def _open_trace(self, resuming: bool) -> Optional[int]:
        """Open the trace file strapd writes into (OPEN's third descriptor), or None.

        ``trace_path``: None follows ``config.trace`` (default ``{output_path}.trace.jsonl``),
        False never traces, True the default path, a path that file. A resumed capture
        appends to its trace (strapd first cuts a line torn by a crash); otherwise the file
        is truncated."""
        arg = self._trace_arg
        if arg is None:
            arg = self.config.trace
        if arg is False:
            self.trace_path = None
            return None
        assert self.output_path is not None
        path = self.output_path + ".trace.jsonl" if arg is True else os.path.abspath(os.fspath(arg))
        if path == self.output_path:
            raise ValueError(f"trace_path {path} is the stream's output_path")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND if resuming else os.O_WRONLY | os.O_TRUNC
        fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.trace_path = path
        return fd

    def _install_hooks(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_forward))
        mods = dict(self.model.named_modules())
        for name in self.hooked_modules:
            self._handles.append(mods[name].register_forward_hook(self._make_hook(name)))
        # Registered last, so it runs after a hook on the root module itself: one PUBLISH per
        # forward pass for the records not yet published.
        self._handles.append(self.model.register_forward_hook(self._on_model_forward_end))

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.token_tracker is not None:
            self.token_tracker._sink = None

    def _on_model_forward(self, module: Any, args: Any) -> None:
        self._forward = self.forward_count
        self.forward_count += 1
        self._step = self.token_tracker.step if self.token_tracker is not None else 0

    def _on_model_forward_end(self, module: Any, args: Any, output: Any) -> None:
        session = self._session
        if session is not None:
            session.flush()

    def _make_hook(self, name: str) -> Any:
        sampled = self.config.granularity is HookGranularity.SAMPLED_SLICES
        spec = self.config.sampled_positions

        def hook(module: Any, args: Any, output: Any) -> None:
            session = self._session
            if session is None:
                return None
            for rec_name, t in split_output(name, output):
                meta = None
                if sampled and t.dim() >= 2:
                    import torch

                    pos = sample_positions(int(t.shape[1]), spec)
                    idx = torch.tensor(pos, dtype=torch.long, device=t.device)
                    t = t.detach().index_select(1, idx)
                    meta = {"positions": pos, "dim": 1}
                session.write_tensor(rec_name, t, self._step, self._forward, meta)
            return None  # never replaces the output

        return hook

    def _on_token(self, tok: Dict[str, Any]) -> None:
        session = self._session
        if session is None:
            return
        session.token(tok["token_index"], tok["token_id"], tok["token_text"], tok["position"])
        if self.checkpoint_interval is not None and (tok["token_index"] + 1) % self.checkpoint_interval == 0:
            self.checkpoint()

    def checkpoint(self) -> ckpt.Checkpoint:
        """Make a checkpoint now: strapd writes and fdatasyncs every packet sent so far and
        reports the stream's offset and last packet; then the checkpoint file is replaced
        atomically. Called every ``checkpoint_interval_tokens`` tokens; callable directly.

        Returns:
            the checkpoint written.
        """
        session = self._session
        if session is None or self.checkpoint_path is None or self.token_tracker is None:
            raise RuntimeError("checkpoint() needs a live capture with track_per_token=True and a checkpoint path")
        t0 = time.perf_counter()
        r = session.checkpoint()
        c = ckpt.Checkpoint(stream=self.output_path or "", fingerprint=self.fingerprint(), stream_offset=r["offset"],
                            packets=r["packets"], drops=r["drops"], last_seq=r["seq"],
                            last_packet_offset=r["last_offset"], last_packet_crc=r["last_crc"],
                            token_count=self.token_tracker.step, forward_count=self.forward_count,
                            created=ckpt.now_rfc3339())
        if r.get("tokens") != c.token_count:
            raise CheckpointError(f"strapd wrote {r.get('tokens')} TOKEN packets, the tracker holds {c.token_count} "
                                  f"tokens: record_token was called outside this capture")
        ckpt.write_atomic(self.checkpoint_path, c.to_json())
        self.checkpoint_times.append(time.perf_counter() - t0)
        self.last_checkpoint = c
        return c

    def _write_tokens_file(self) -> None:
        tr = self.token_tracker
        if tr is None or self.output_path is None:
            return
        doc = {
            "total_tokens": len(tr.tokens),
            "tokens": tr.tokens,
            "capture_duration_seconds": time.monotonic() - self._started_at if self._started_at else 0.0,
            "stream_path": self.output_path,
            "resumed_from_step": self.resume_step,
            "forward_count": self.forward_count,
            "fingerprint": self.fingerprint(),
        }
        ckpt.write_atomic(tokens_path(self.output_path), json.dumps(doc, indent=1).encode())

    def stop(self) -> Dict[str, Any]:
        """Remove the hooks, close the session (the daemon finishes the file) and return the
        CLOSED summary (``packets``, ``drops``, ``bytes_in``, ``bytes_out``, ``file_bytes``).
        With tracking, ``{output_path}_tokens.json`` is written; after a clean close the
        checkpoint is deleted (it is kept when the session had failed)."""
        self._remove_hooks()
        session = self._session
        if session is None:
            return self.summary or {}
        clean = False
        try:
            if session.error is None:
                self.summary = session.close()
                clean = True
            else:
                self.summary = {}
        finally:
            session.shutdown()
            self._last_session = session
            self._session = None
            if self.token_tracker is not None:
                self._write_tokens_file()
        if clean and self._clean and self.checkpoint_path is not None and os.path.exists(self.checkpoint_path):
            ckpt.fsync_unlink(self.checkpoint_path)
        return self.summary

    def abort(self) -> None:
        """Remove the hooks and drop the connection without CLOSE (the daemon ends the stream
        as ``aborted``). The checkpoint is kept."""
        self._remove_hooks()
        if self._session is not None:
            self._session.shutdown()
            self._session = None

    @contextlib.contextmanager
    def capture_activations(self, output_path: Union[str, os.PathLike], track_per_token: bool = False,
                            checkpoint_interval_tokens: Optional[int] = None,
                            checkpoint_path: Optional[Union[str, os.PathLike]] = None,
                            resume_from_checkpoint: bool = False,
                            overwrite_checkpoint: bool = False) -> Iterator[Optional[TokenTracker]]:
        """Capture into ``output_path`` while the block runs; yields the token tracker
        (None when not tracking), as the original 1.3.1 API did.

        Args:
            output_path: the stream file (str or ``pathlib.Path``).
            track_per_token: keep a :class:`TokenTracker`; each packet's ``step`` is the number
                of tokens recorded before its forward pass, and each token is a TOKEN packet.
            checkpoint_interval_tokens: make a durable checkpoint every N recorded tokens.
            checkpoint_path: checkpoint file (default ``{output_path}.ckpt.json``).
            resume_from_checkpoint: continue the capture the checkpoint describes.
            overwrite_checkpoint: start over although a checkpoint of an earlier capture exists.

        Yields:
            the tracker, or None.

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
        self._setup(output_path, track_per_token, checkpoint_interval_tokens, checkpoint_path,
                    resume_from_checkpoint, overwrite_checkpoint)
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
        """Shortcut for ``token_tracker.record_token`` (requires ``track_per_token=True``)."""
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

    def analyze_activations(self, path: Optional[Union[str, os.PathLike]] = None) -> Dict[str, Any]:
        """Summarise a stream file (default: this capture's) — see
        :func:`llm_instrumentation.analysis.analyze_activations`."""
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
    output_path: Optional[Union[str, os.PathLike]] = None,
    output_dir: Union[str, os.PathLike] = "./captures",
    modules: Optional[Sequence[str]] = None,
    track_per_token: bool = False,
    checkpoint_interval_tokens: Optional[int] = None,
    checkpoint_path: Optional[Union[str, os.PathLike]] = None,
    resume_from_checkpoint: bool = False,
    overwrite_checkpoint: bool = False,
    socket_path: Optional[str] = None,
    autostart_daemon: bool = True,
    stall_timeout: float = 120.0,
    trace_path: Optional[Union[str, os.PathLike, bool]] = None,
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
    _check_tracking_args(track_per_token, checkpoint_interval_tokens, checkpoint_path, resume_from_checkpoint,
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
    fw = InstrumentationFramework(model, config, output_path, modules=modules, socket_path=socket_path,
                                  autostart_daemon=autostart_daemon, track_per_token=track_per_token,
                                  stall_timeout=stall_timeout, checkpoint_interval_tokens=checkpoint_interval_tokens,
                                  checkpoint_path=checkpoint_path, resume_from_checkpoint=resume_from_checkpoint,
                                  overwrite_checkpoint=overwrite_checkpoint, trace_path=trace_path)
    with fw._running():
        yield fw
