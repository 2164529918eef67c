"""The writer thread: turns the records of the model's thread into JSON lines and writes
them to the sink, so the model's thread only records."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, List, Optional

from . import native
from .attention_lines import AttentionLines
from .._cuda import wait_event
from .records import (ALLOC, ALLOC_OUT, ATTENTION, ATTENTION_KV, BEGIN, ELEMENTWISE, FORWARD, HANDOFF, KV, LINEAR,
                      MODULE, PARAMETERS, PREBUILT, TIMING, Rec)
from .sites import Site
from .state import WriterState
from .templates import ENCODER

__all__ = ["Writer", "WriterThread", "YIELD_NS"]

log = logging.getLogger("llm_instrumentation")

#: The writer thread gives the interpreter lock back after this much work (ns).
YIELD_NS = 200_000


def _no_kind(*rec: Any) -> List[Any]:
    raise TypeError("a resource record of no kind records.Rec knows")


class Writer:
    """Writes batches of records (on the writer thread; the tests call it directly).

    Args:
        state: the writer's state.
        lines: makes each record's lines.
        sink: receives the lines (``write``).
        longest: ``[site]``, shared with the wrappers: the module that took longest in the
            last forward pass written (the records go to the writer as it starts).
    """

    def __init__(self, state: WriterState, lines: AttentionLines, sink: Any, longest: List[Optional[Site]]) -> None:
        self.state = state
        self.lines = lines
        self.sink = sink
        self.longest = longest
        #: How long that module took (ns), when it is a Linear: one torch call that holds no
        #: interpreter lock, during which the writer need not give the lock back.
        self.longest_ns = 0
        handlers: List[Callable[..., List[Any]]] = [_no_kind] * (max(Rec) + 1)
        for tag, fn in ((BEGIN, lines.begin), (LINEAR, lines.linear), (MODULE, lines.module),
                        (ALLOC_OUT, lines.alloc_out), (ALLOC, lines.alloc), (ATTENTION_KV, lines.attention_kv),
                        (HANDOFF, lines.handoff), (ATTENTION, lines.attention_raw), (KV, lines.kv_raw),
                        (FORWARD, lines.forward), (PARAMETERS, lines.parameters), (ELEMENTWISE, lines.elementwise),
                        (PREBUILT, lines.prebuilt)):
            handlers[tag] = fn
        assert _no_kind not in handlers[1:], "a record kind without a writer method"
        self.handlers = handlers

    def write_batch(self, recs: List[Any], quiet_until: int = 0) -> None:
        """Build, count, serialize and write one batch.

        Until ``quiet_until`` (``perf_counter_ns``) the model's thread is known to be in a
        long Linear's torch call, which does not want the interpreter lock: no need to give it
        back before then (each ``sleep(0)`` costs ~20 µs of CPU and ~80 µs here)."""
        c0 = time.thread_time_ns()
        try:
            self._write(recs, quiet_until)
        finally:
            self.state.writer_cpu_ns += time.thread_time_ns() - c0

    def _write(self, recs: List[Any], quiet_until: int) -> None:
        st = self.state
        enc = ENCODER.encode
        out_lines: List[bytes] = []
        counts = st.counts
        clock = time.perf_counter_ns
        last = max(clock(), quiet_until - YIELD_NS)
        render = native.render if self.lines.fast else None
        handlers = self.handlers
        waited = -1
        i, n = 0, len(recs)
        while i < n:
            if render is not None and LINEAR <= recs[i][0] <= KV:
                # The records of the timing wrappers whose templates are known, in C; it
                # stops at any other record (taken below) and after YIELD_NS of work.
                j = render(st, recs, i, out_lines, last + YIELD_NS)
                if j > i:
                    i = j
                    if clock() - last > YIELD_NS:
                        time.sleep(0)
                        last = clock()
                    continue
            r = recs[i]
            if render is not None and waited != i and LINEAR <= r[0] <= KV and type(r[TIMING]) is tuple:
                # The C writer stops at a CUDA event pair whose end event has not completed:
                # wait for it here, the interpreter lock free, and let C write it (it also
                # stops where no template is made yet: then the record is written below).
                wait_event(r[TIMING][1])
                waited = i
                continue
            i += 1
            out = handlers[r[0]](*r[1:])
            if out and type(out[0]) is bytes:  # a fast path: serialized and counted already
                out_lines += out
            else:
                for ev in out:
                    name = ev["event"]
                    counts[name] = counts.get(name, 0) + 1
                    if name == "compute_execution" and ev.get("operation") != "model_forward":
                        f = ev.get("flops")
                        if f:
                            st.total_flops += f
                        d = ev.get("duration_us")
                        if d is not None and not ev.get("elementwise") and ev.get("operation") != "attention":
                            st.total_compute_us += d
                    elif name == "component_handoff":
                        st.component_flows += 1
                    out_lines.append(enc(ev).encode() + b"\n")
            # Give the GIL back every 0.2 ms of work: a model thread returning from a torch op
            # otherwise waits up to the interpreter's switch interval (5 ms) to get it. (Once
            # per record cost more than the records: sleep(0) is a system call.)
            if clock() - last > YIELD_NS:
                time.sleep(0)
                last = clock()
        if st.long_site is not None:
            self.longest[0] = st.long_site
            self.longest_ns = st.long_ns if st.long_site.kind == "linear" else 0
        if out_lines:
            self.sink.write(out_lines)
            st.events_written += len(out_lines)


class WriterThread:
    """The thread that runs a :class:`Writer`. Errors are kept and raised at the next
    :meth:`sync` (``flush``/``close``): nothing is dropped silently."""

    def __init__(self, writer: Writer) -> None:
        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.writer = writer
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="strap-resources", daemon=True)
        self._thread.start()

    def put(self, recs: List[Any], quiet_until: int = 0) -> None:
        self._q.put((recs, quiet_until))

    def sync(self) -> None:
        done = threading.Event()
        self._q.put(done)
        done.wait()
        if self.error is not None:
            err, self.error = self.error, None
            raise RuntimeError(f"resource events could not be written: {err}") from err

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.writer.write_batch(*item)
            except BaseException as e:  # kept for the model's thread; never dropped silently
                log.error("llm_instrumentation: writing resource events failed: %s", e)
                if self.error is None:
                    self.error = e

