"""Hooks on a model, and the context manager that captures through strapd."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _daemon
from . import _protocol as P
from ._ring import Ring
from ._session import CaptureSession
from .config import HookGranularity, InstrumentationConfig
from .core.auto_detect import detect_model_architecture, select_modules

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

log = logging.getLogger("llm_instrumentation")


class TokenTracker:
    """Per-token bookkeeping: ``step`` of a packet = tokens recorded before its forward pass.

    Example:
        >>> tr = TokenTracker()
        >>> tr.record_token(42, "hello")
        0
        >>> tr.step
        1
    """

    def __init__(self) -> None:
        self.tokens: List[Dict[str, Any]] = []

    @property
    def step(self) -> int:
        """Tokens recorded so far."""
        return len(self.tokens)

    def record_token(self, token_id: int, token_text: str, position: Optional[int] = None) -> int:
        """Record one token; return its index.

        Args:
            token_id: vocabulary id.
            token_text: decoded text.
            position: sequence position (default: the token's index).
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            token_id = int(token_id)  # accepts numpy / 0-d tensor ids
        idx = len(self.tokens)
        self.tokens.append({
            "token_index": idx, "token_id": token_id, "token_text": str(token_text),
            "position": idx if position is None else int(position),
        })
        return idx


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


class InstrumentationFramework:
    """Hooks on ``model`` that stream module outputs to strapd.

    Use :func:`capture_activations` rather than building this directly.

    Attributes:
        model: the instrumented model.
        config: the :class:`InstrumentationConfig`.
        output_path: absolute path of the stream file.
        hooked_modules: names of the modules with hooks.
        token_tracker: the :class:`TokenTracker` (``None`` unless ``track_per_token``).
        forward_count: forward passes of the model seen so far.
        summary: the daemon's CLOSED body after :meth:`stop`.
    """

    def __init__(self, model: "nn.Module", config: InstrumentationConfig, output_path: Union[str, os.PathLike],
                 modules: Optional[Sequence[str]] = None, socket_path: Optional[str] = None,
                 autostart_daemon: bool = True, track_per_token: bool = False,
                 stall_timeout: float = 120.0) -> None:
        self.model = model
        self.config = config
        self.output_path = os.path.abspath(os.fspath(output_path))
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
        self.token_tracker: Optional[TokenTracker] = TokenTracker() if track_per_token else None
        self.forward_count = 0
        self.summary: Optional[Dict[str, Any]] = None
        self.plan = config.transport_plan()
        self._session: Optional[CaptureSession] = None
        self._last_session: Optional[CaptureSession] = None
        self._handles: List[Any] = []
        self._forward = 0
        self._step = 0

    # ----- life cycle --------------------------------------------------------------------------

    def start(self) -> "InstrumentationFramework":
        """Connect to strapd (starting it if needed), open the session, install the hooks."""
        from . import __version__

        if self._session is not None:
            raise RuntimeError("capture already started")
        plan = self.plan
        if plan.note:
            log.warning("llm_instrumentation: %s", plan.note)
        Path(self.output_path).parent.mkdir(parents=True, exist_ok=True)
        conn = _daemon.connect(self.socket_path, autostart=self.autostart_daemon)
        ring: Optional[Ring] = None
        out_fd = -1
        try:
            P.handshake(conn, f"llm_instrumentation/{__version__}", os.getpid())
            ring = Ring(plan.ring_size)
            out_fd = os.open(self.output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
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
                    "client": {"pid": os.getpid(), "argv0": os.path.basename(sys.argv[0]) if sys.argv else "",
                               "version": __version__},
                },
            }
            session.open(out_fd, body)
        except BaseException:
            conn.close()
            if ring is not None:
                ring.close()
            if out_fd >= 0:
                os.close(out_fd)
            raise
        os.close(out_fd)  # the daemon holds its own copy
        self._session = session
        self._install_hooks()
        return self

    def _install_hooks(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_forward))
        mods = dict(self.model.named_modules())
        for name in self.hooked_modules:
            self._handles.append(mods[name].register_forward_hook(self._make_hook(name)))

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_model_forward(self, module: Any, args: Any) -> None:
        self._forward = self.forward_count
        self.forward_count += 1
        self._step = self.token_tracker.step if self.token_tracker is not None else 0

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

    def stop(self) -> Dict[str, Any]:
        """Remove the hooks, close the session (the daemon finishes the file) and return the
        CLOSED summary (``packets``, ``drops``, ``bytes_in``, ``bytes_out``, ``file_bytes``)."""
        self._remove_hooks()
        session = self._session
        if session is None:
            return self.summary or {}
        try:
            if session.error is None:
                self.summary = session.close()
            else:
                self.summary = {}
        finally:
            session.shutdown()
            self._last_session = session
            self._session = None
        return self.summary

    def abort(self) -> None:
        """Remove the hooks and drop the connection without CLOSE (the daemon ends the stream
        as ``aborted``)."""
        self._remove_hooks()
        if self._session is not None:
            self._session.shutdown()
            self._session = None

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

        return analyze_activations(path if path is not None else self.output_path)


_CHECKPOINT_MSG = (
    "checkpoints and resume are not implemented in this version of llm_instrumentation; "
    "remove checkpoint_interval_tokens / checkpoint_path / resume_from_checkpoint"
)


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
    socket_path: Optional[str] = None,
    autostart_daemon: bool = True,
    stall_timeout: float = 120.0,
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
        track_per_token: give the framework a :class:`TokenTracker`; a packet's ``step``
            is the number of tokens recorded before its forward pass.
        checkpoint_interval_tokens: not implemented (must be None).
        checkpoint_path: not implemented (must be None).
        resume_from_checkpoint: not implemented (must be False).
        socket_path: strapd control socket (default: PROTOCOL.md 1 resolution).
        autostart_daemon: start ``strapd serve`` when no daemon answers.
        stall_timeout: seconds to wait for ring space before raising.

    Yields:
        the :class:`InstrumentationFramework`; on exit the session is closed and the file
        complete (on an exception inside the block it is still closed cleanly).

    Example:
        >>> with capture_activations(model, preset="balanced", output_path="run.strap") as fw:  # doctest: +SKIP
        ...     model(input_ids)
        >>> fw.analyze_activations()["packets"]  # doctest: +SKIP
    """
    if checkpoint_interval_tokens is not None:
        if isinstance(checkpoint_interval_tokens, bool) or not isinstance(checkpoint_interval_tokens, int) \
                or checkpoint_interval_tokens <= 0:
            raise ValueError(f"checkpoint_interval_tokens must be a positive int, got {checkpoint_interval_tokens!r}")
        raise NotImplementedError(_CHECKPOINT_MSG)
    if checkpoint_path is not None or resume_from_checkpoint:
        raise NotImplementedError(_CHECKPOINT_MSG)
    if not isinstance(track_per_token, bool):
        raise TypeError(f"track_per_token must be a bool, got {track_per_token!r}")
    if preset is not None and config is not None:
        raise ValueError("pass either preset or config, not both")
    if config is None:
        config = InstrumentationConfig.from_preset(preset or "balanced")
    elif not isinstance(config, InstrumentationConfig):
        raise TypeError(f"config must be an InstrumentationConfig, got {type(config).__name__}")
    if output_path is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S_%f")
        output_path = Path(output_dir) / f"capture_{stamp}_{os.getpid()}.strap"
    fw = InstrumentationFramework(model, config, output_path, modules=modules, socket_path=socket_path,
                                  autostart_daemon=autostart_daemon, track_per_token=track_per_token,
                                  stall_timeout=stall_timeout)
    fw.start()
    try:
        yield fw
    except BaseException:
        # Keep what was captured: close cleanly when the connection is intact.
        try:
            fw.stop()
        except Exception as e:  # the user's exception matters more; log ours
            log.error("llm_instrumentation: closing the capture after an error failed: %s", e)
            fw.abort()
        raise
    fw.stop()
