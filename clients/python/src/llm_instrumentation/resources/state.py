"""What the writer thread keeps from one record to the next, as one object."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from .records import STATE, UNREAD

__all__ = ["WriterState"]


class WriterState:
    """The writer's state: the running forward pass, the sequence number, the counters the
    summary reports, and the templates. The C writer (``_native.render``) reads and advances
    the attributes ``records.STATE`` names; the rest are Python's alone.

    Attributes:
        seq: the last event's sequence number (``resource_id``'s tail).
        clock_offset: Unix time minus ``perf_counter_ns`` at the running pass's start: the
            wrappers' end times become timestamps with it.
        step, forward: the running pass's token step and number.
        pass_flops: the FLOPs of the running pass so far (its ``model_forward`` sums them).
        long_ns, long_site: the longest module of the running pass, and its time.
        total_flops, total_compute_us, component_flows, counts: the summary's totals.
        memory_fraction, memory_fraction_at: the machine's memory use for the handoffs, and
            when it was read (``UNREAD``: not yet in this pass).
        templates: the event templates by key (``records.KEYS``).
        kv_bytes: each cache layer's bytes at its last update (its growth is against them).
        peak_device: the highest device memory a pass reported.
        events_written, writer_cpu_ns: lines written; the writer thread's CPU time.
        session_id, cuda: the session's id; whether events say ``gpu_``.
    """

    __slots__ = STATE + ("memory_fraction_at", "peak_device", "events_written", "writer_cpu_ns", "session_id",
                         "cuda")

    def __init__(self, session_id: str) -> None:
        self.seq = 0
        self.clock_offset = time.time_ns() - time.perf_counter_ns()
        self.step = 0
        self.forward = -1
        self.pass_flops = 0
        self.long_ns = 0
        self.long_site: Any = None
        self.total_flops = 0
        self.total_compute_us = 0.0
        self.component_flows = 0
        self.memory_fraction: Any = UNREAD
        self.memory_fraction_at = float("-inf")
        self.templates: Dict[Any, Any] = {}
        self.counts: Dict[str, int] = {}
        self.kv_bytes: Dict[Any, int] = {}
        self.peak_device = 0
        self.events_written = 0
        self.writer_cpu_ns = 0
        self.session_id = session_id
        self.cuda = False

    def snapshot(self) -> Dict[str, Any]:
        """The attributes, copied (the tests compare two writers' end states)."""
        out: Dict[str, Any] = {}
        for name in self.__slots__:
            v = getattr(self, name)
            out[name] = dict(v) if isinstance(v, dict) else v
        return out

    def restore(self, snap: Dict[str, Any], templates: Optional[Dict[Any, Any]] = None) -> None:
        """Back to ``snap`` (the templates: ``templates``, else none)."""
        for name, v in snap.items():
            setattr(self, name, dict(v) if isinstance(v, dict) else v)
        self.templates = {} if templates is None else templates
