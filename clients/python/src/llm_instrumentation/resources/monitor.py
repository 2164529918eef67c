"""The resource monitor's life cycle: start, run-time control, flush, close and the summary.

The work is split at the thread boundary: the model's thread records (``recorders.py``,
``wrappers.py``), hands the records over, the writer thread renders them (``writer.py``,
``lines.py``) and the sink ships the lines (``sinks.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Union

from .attention_lines import AttentionLines
from .events import MIB
from .levels import ResourceLevel, resource_settings_from_env
from .records import PREBUILT
from .recorders import Recorder
from .sinks import JsonlSink
from .state import WriterState
from .system import MemoryReader, now_us, peak_rss
from .writer import Writer, WriterThread

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

__all__ = ["ResourceMonitor", "monitor_resources"]

Level = Union[ResourceLevel, str, int]


class ResourceMonitor:
    """Records resource events of ``model`` while it runs.

    Args:
        model: a ``torch.nn.Module`` (Hugging Face or not).
        level: MINIMAL, DETAILED or VERBOSE (name or :class:`ResourceLevel`); None takes
            ``STRAP_RESOURCE_LOG_LEVEL`` and falls back to MINIMAL.
        path: JSONL file to write (standalone mode); None takes ``STRAP_RESOURCE_LOG_PATH``.
            Exactly one of a path or a ``sink`` is used.
        sink: an object with ``write(lines)``, ``flush()`` and ``close()`` receiving the
            serialized event lines (the capture session uses this to send them to strapd).
        session_id: put on every event (default ``resource_sess_<UTC time>_<pid>``).
        step_fn: returns the token step of the forward pass that is starting (default: the
            value set with :meth:`set_step`, 0 at first).
        capture_bytes_fn: returns the bytes a live capture has handed to strapd so far; the
            per-forward event then carries the bytes of its forward pass.
        forward_fn: returns the number of the forward pass that is starting (default: the
            monitor counts the passes it sees); a capture passes its own counter so events
            and stream packets agree.
        enabled: False starts disabled (no hooks); None follows
            ``STRAP_RESOURCE_LOG_DISABLED``.
        flush_events: records kept before they go to the writer thread (at the end of a
            forward pass).
        flush_interval: seconds after which they go anyway (None: only by count, at
            :meth:`flush` and at :meth:`close`).
        environ: the environment to read the settings from (default ``os.environ``).

    Attributes:
        recorder: the model thread's half (``recorders.Recorder``).
        writer: the writer thread's (``writer.Writer``; its ``state`` holds the counters).

    Raises:
        ValueError: a bad level, or neither a path nor a sink.
    """

    def __init__(self, model: "nn.Module", level: Optional[Level] = None,
                 path: Union[str, "os.PathLike[str]", None] = None, *, sink: Any = None,
                 session_id: Optional[str] = None, step_fn: Optional[Callable[[], int]] = None,
                 capture_bytes_fn: Optional[Callable[[], int]] = None,
                 forward_fn: Optional[Callable[[], int]] = None, enabled: Optional[bool] = None,
                 flush_events: int = 512, flush_interval: Optional[float] = 0.5,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        settings = resource_settings_from_env(environ)
        self.model = model
        self.level = ResourceLevel.parse(level) if level is not None else (settings.level or ResourceLevel.MINIMAL)
        if sink is None:
            p = path if path is not None else settings.path
            if p is None:
                raise ValueError("ResourceMonitor needs a path (or STRAP_RESOURCE_LOG_PATH) or a sink")
            sink = JsonlSink(p)
            self.path: Optional[str] = sink.path
        else:
            self.path = getattr(sink, "path", None)
        self._sink = sink
        self._enabled = (not settings.disabled) if enabled is None else bool(enabled)
        self.session_id = session_id or "resource_sess_" + datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y%m%d_%H%M%S_%f") + f"_{os.getpid()}"
        self._memory = MemoryReader()
        self.recorder = Recorder(model, self._memory, step_fn, forward_fn, capture_bytes_fn, flush_events,
                                 flush_interval)
        state = WriterState(self.session_id)
        self.writer = Writer(state, AttentionLines(state, self._memory.read), sink, self.recorder.longest)
        self.recorder.writer = self.writer
        self._thread: Optional[WriterThread] = None
        self._started = False
        self._closed = False
        self._param_bytes = 0

    # ----- what the monitor has measured ---------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether hooks are installed and events recorded."""
        return self._enabled

    @property
    def fast(self) -> bool:
        """False: every module timed by the general wrapper and every event made by the
        builders (slower; the tests compare both paths). Set before :meth:`start`."""
        return self.recorder.fast

    @fast.setter
    def fast(self, value: bool) -> None:
        self.recorder.fast = self.writer.lines.fast = bool(value)

    @property
    def counts(self) -> Dict[str, int]:
        """Events written so far, by type."""
        return self.writer.state.counts

    @property
    def total_flops(self) -> int:
        return self.writer.state.total_flops

    @property
    def total_compute_us(self) -> float:
        return self.writer.state.total_compute_us

    @property
    def component_flows(self) -> int:
        return self.writer.state.component_flows

    @property
    def events_written(self) -> int:
        return self.writer.state.events_written

    @property
    def forwards(self) -> int:
        """Forward passes of the model seen."""
        return self.recorder.forwards

    @property
    def hook_ns(self) -> int:
        """Time spent inside the monitor's hooks and wrappers (model thread), in ns: the
        monitor's own cost there, measured."""
        return self.recorder.hook_ns

    @property
    def writer_cpu_ns(self) -> int:
        """CPU time of the writer thread, in ns."""
        return self.writer.state.writer_cpu_ns

    # ----- life cycle ----------------------------------------------------------------------------

    def start(self) -> "ResourceMonitor":
        """Write ``resource_session_start`` and the parameter allocations; install the hooks
        (unless disabled)."""
        if self._started:
            raise RuntimeError("resource monitor already started")
        self._started = True
        rec = self.recorder
        dev = self._model_device()
        cuda = rec.cuda = self._memory.cuda = self.writer.state.cuda = dev.type == "cuda"
        import torch

        if cuda:
            rec.cuda_total = torch.cuda.get_device_properties(dev).total_memory
            try:  # SM utilisation only where NVML can say it; never estimated.
                import pynvml

                pynvml.nvmlInit()
                rec.nvml = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
            except Exception:
                rec.nvml = None
        start = {
            "event": "resource_session_start",
            "resource_id": f"session_{self.session_id}",
            "timestamp": now_us(),
            "iso_timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            "session_id": self.session_id,
            "level": self.level.name,
            "enabled": self._enabled,
            "model_class": type(self.model).__name__,
            "device": str(dev),
            "timing": "cuda_event" if cuda else "perf_counter",
            "torch_version": torch.__version__,
            "pid": os.getpid(),
            "nvml": rec.nvml is not None,
        }
        self._thread = rec.thread = WriterThread(self.writer)
        # A script that never closes its monitor still gets its events and summary written.
        atexit.register(self.close)
        rec.records.append((PREBUILT, start))
        try:
            if self._enabled:
                self._param_bytes = rec.parameter_events(self.level)
                rec.install(self.level)
            self.flush()
        except BaseException:
            atexit.unregister(self.close)
            rec.uninstall()
            self._closed = True
            self._thread.stop()
            self._sink.close()
            self._memory.close()
            raise
        return self

    def set_level(self, level: Level) -> None:
        """Change the level while running (the hooks are re-installed)."""
        self.level = ResourceLevel.parse(level)
        if self._enabled and self._started and not self._closed:
            self.recorder.uninstall()
            self.recorder.install(self.level)

    def disable(self) -> None:
        """Stop recording: the hooks are removed (no cost while disabled)."""
        self._enabled = False
        self.recorder.uninstall()

    def enable(self) -> None:
        """Record again after :meth:`disable`."""
        if self._closed:
            raise RuntimeError("resource monitor is closed")
        if not self._enabled:
            self._enabled = True
            if self._started:
                self.recorder.install(self.level)

    def set_step(self, step: int) -> None:
        """The token step the next forward passes belong to (when no ``step_fn``)."""
        self.recorder.step = int(step)

    def flush(self) -> None:
        """Write every recorded event now (on a GPU the writer waits for their CUDA events).

        Raises:
            RuntimeError: writing failed (the cause is chained).
        """
        if self._thread is None:
            raise RuntimeError("resource monitor not started")
        self.recorder.hand_off()
        self._thread.sync()
        self._sink.flush()

    def close(self) -> Dict[str, Any]:
        """Remove the hooks, write ``resource_session_summary``, flush and close the sink.

        Returns:
            the summary event.
        """
        if self._closed:
            return {}
        atexit.unregister(self.close)
        rec = self.recorder
        rec.uninstall()
        self._closed = True
        t = self._thread
        try:
            if t is not None:
                rec.hand_off()
                t.sync()  # every event counted before the summary is made
            summary = self._summary()
            if t is not None:
                rec.records.append((PREBUILT, summary))
                rec.hand_off()
                t.sync()
        finally:
            if t is not None:
                t.stop()
            self._sink.flush()
            self._sink.close()
            self._memory.close()
        return summary

    def __enter__(self) -> "ResourceMonitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _model_device(self) -> "torch.device":
        import torch

        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def _summary(self) -> Dict[str, Any]:
        st = self.writer.state
        ev: Dict[str, Any] = {
            "event": "resource_session_summary",
            "resource_id": f"session_{self.session_id}_summary",
            "timestamp": now_us(),
            "iso_timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            "session_id": self.session_id,
            "level": self.level.name,
            "forwards": self.recorder.forwards,
            "parameter_bytes": self._param_bytes,
            "total_compute_flops": st.total_flops,
            "total_compute_gflops": st.total_flops / 1e9,
            "total_compute_us": st.total_compute_us,
            "component_flows": st.component_flows,
            "events": dict(st.counts),
            "monitor_hook_us": self.recorder.hook_ns / 1000.0,
            "monitor_writer_cpu_us": st.writer_cpu_ns / 1000.0,
        }
        peak: Optional[int]
        if st.cuda:
            import torch

            peak = max(st.peak_device, torch.cuda.max_memory_allocated())
            ev["total_memory_bytes"] = peak
            ev["total_memory_source"] = "torch.cuda.max_memory_allocated"
        else:
            peak = peak_rss()
            ev["total_memory_bytes"] = peak
            ev["total_memory_source"] = "proc_self_status_VmHWM"
        ev["total_memory_mb"] = peak / MIB if peak is not None else None
        return ev


@contextlib.contextmanager
def monitor_resources(model: "nn.Module", level: Optional[Level] = None,
                      path: Union[str, "os.PathLike[str]", None] = None, **kwargs: Any) -> Iterator[ResourceMonitor]:
    """Record resource events of ``model`` into a JSONL file while the block runs.

    Args:
        model: the model.
        level: MINIMAL / DETAILED / VERBOSE (default ``STRAP_RESOURCE_LOG_LEVEL`` or MINIMAL).
        path: the JSONL file (default ``STRAP_RESOURCE_LOG_PATH``).
        **kwargs: passed to :class:`ResourceMonitor`.

    Yields:
        the running monitor (``set_level``, ``disable``, ``enable``, ``flush``, ``set_step``).

    Example:
        >>> with monitor_resources(model, "MINIMAL", "r.jsonl") as mon:  # doctest: +SKIP
        ...     model(ids)
    """
    mon = ResourceMonitor(model, level, path, **kwargs)
    mon.start()
    try:
        yield mon
    finally:
        mon.close()
