"""The writer's lines of each record: from a template where one is made, else by the
builders (``events.py``). One method per record kind (``records.Rec``); the kinds the C
writer renders (``_native.render``) are made here the same way, byte for byte.

A template is made the first time a module is seen with an input shape (``template_of``
runs the builder and gives back the sequence numbers it took); after that an event costs one
formatting of its changing values.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import system
from .events import EventBuilder, cuda_duration_us, linear_flops, meta, per_us
from .records import UNREAD
from .sites import Site
from .state import WriterState
from .templates import FORWARD_SLOTS, MAX_TEMPLATES, PRESSURE_JSON, RSS_KEYS, TIMED_SLOTS, compile_template, \
    positional, program

__all__ = ["Lines", "timing_us"]

#: A writer method's output: serialized lines (bytes), or event dicts still to serialize.
Out = List[Any]

_INF = float("inf")


def timing_us(timing: Any, fast: bool) -> Tuple[Any, Optional[float]]:
    """A record's timing for the builders, and the µs its template writes. Host clock (int
    ns): as it is, and its µs. A CUDA event pair: with ``fast`` resolved here (its end event
    waited for: ``events.cuda_duration_us``) and both are its µs, or the µs and None where they
    are not finite (JSON writes ``NaN`` or ``Infinity``, a template would write ``nan``/``inf``:
    the builders write those); without, the pair as it is and None (the builders resolve it,
    the way the tests compare against)."""
    if type(timing) is int:
        return timing, timing / 1000.0
    if not fast:
        return timing, None
    if type(timing) is tuple:
        timing = cuda_duration_us(timing)
    return timing, timing if type(timing) is float and -_INF < timing < _INF else None


class Lines:
    """The lines of the records of every kind but the attention's (``attention_lines.py``).

    Args:
        state: the writer's state.
        memory: reads the memory of a pass whose reading the model's thread left to the writer.
    """

    def __init__(self, state: WriterState, memory: Callable[[], Dict[str, Any]]) -> None:
        self.state = state
        self.build = EventBuilder(state)
        self.read_memory = memory
        #: False: every event made by the builders (the tests compare both paths).
        self.fast = True

    def template_of(self, builder: Callable[..., List[Dict[str, Any]]], *args: Any) -> List[Dict[str, Any]]:
        """The events ``builder`` makes of a record, as the model for a template (the
        sequence numbers and FLOPs they count are given back)."""
        st = self.state
        if len(st.templates) >= MAX_TEMPLATES:
            st.templates.clear()
        seq, flops = st.seq, st.pass_flops
        try:
            return builder(*args)
        finally:
            st.seq, st.pass_flops = seq, flops

    def pass_memory(self, cell: List[Any]) -> Dict[str, Any]:
        """The memory reading of a forward pass: the one the model's thread took at its end (a
        GPU's), else read now and kept for the pass's other events (the RSS: read here, as
        the writer writes the pass, so the model's thread makes no system call for it)."""
        mem = cell[0]
        if mem is None:
            mem = cell[0] = self.read_memory()
        return mem

    def _count(self, name: str) -> None:
        counts = self.state.counts
        counts[name] = counts.get(name, 0) + 1

    # ----- one method per record kind ------------------------------------------------------------

    def begin(self, step: int, forward: int, clock_offset: int) -> Out:
        """A forward pass starts: the step and forward number of the records that follow, and
        the wall clock's offset from ``perf_counter_ns`` their end times are read against."""
        st = self.state
        st.step = step
        st.forward = forward
        st.pass_flops = 0
        st.clock_offset = clock_offset
        st.long_site = None
        st.long_ns = 0
        if time.monotonic() - st.memory_fraction_at > system.FRACTION_MAX_AGE:
            st.memory_fraction = UNREAD
        return []

    def prebuilt(self, event: Dict[str, Any]) -> Out:
        return [event]

    def parameters(self, site: Site, wall_ns: int, kind: str, nbytes: int, shape: Any, dtype: Any, is_cuda: bool,
                   address: int,
                   memory: Dict[str, Any]) -> Out:
        st = self.state
        return self.build.alloc((site, wall_ns // 1000, st.step, st.forward), kind, nbytes, shape, dtype, is_cuda,
                                address, memory)

    def elementwise(self, site: Site, wall_ns: int, op: str, tensor: Any, duration_ns: int) -> Out:
        st = self.state
        return self.build.elementwise((site, wall_ns // 1000, st.step, st.forward), op, tensor, duration_ns)

    def forward(self, site: Site, wall_ns: int, timing: Any, input: Any, out_shape: Any, capture_bytes: Optional[int],
                memory: List[Any], sm_utilization: Optional[float]) -> Out:
        """The model_forward event of a pass: its FLOPs are the writer's sum over the pass."""
        st = self.state
        mem = self.pass_memory(memory)
        ctx = (site, wall_ns // 1000, st.step, st.forward)
        cuda = type(timing) is not int
        timing, d = timing_us(timing, self.fast)
        if d is None or not self.fast or (sm_utilization is not None and not -_INF < sm_utilization < _INF):
            return self.build.forward(ctx, timing, input, out_shape, capture_bytes, mem, sm_utilization)
        flops = st.pass_flops
        tf = bool(flops) and d > 0
        key = ("forward", site, input, out_shape, capture_bytes is None, tuple(mem), tf, cuda, sm_utilization is None)
        fmt = st.templates.get(key)
        if fmt is None:
            ev = self.template_of(self.build.forward, ctx, timing, input, out_shape, capture_bytes, mem,
                                  sm_utilization)[0]
            fmt = st.templates[key] = compile_template(ev, "seq", FORWARD_SLOTS)
        st.seq = seq = st.seq + 1
        v = dict(mem)
        v.update(ts=ctx[1], seq=seq, step=ctx[2], fwd=ctx[3], fl=flops, gf=flops / 1e9, cap=capture_bytes, d=d,
                 sm=sm_utilization)
        if tf:
            v["tf"] = per_us(flops, d)
        peak = mem.get("device_memory_peak_bytes")
        if peak is not None:  # as EventBuilder.forward keeps it for the summary
            st.peak_device = max(st.peak_device, peak)
        self._count("compute_execution")
        return [(fmt % v).encode()]

    def linear(self, site: Site, end: int, timing: Any, in_shape: Any, in_dtype: Any, out_shape: Any,
               out_dtype: Any) -> Out:
        st = self.state
        cuda = type(timing) is not int  # a CUDA event pair: templated as well, by the µs it measured
        timing, d = timing_us(timing, self.fast)
        if d is None:
            return self.linear_events(site, end, timing, in_shape, in_dtype, out_shape, out_dtype)
        if not cuda and timing > st.long_ns:
            st.long_ns, st.long_site = timing, site
        if not self.fast:
            return self.linear_events(site, end, timing, in_shape, in_dtype, out_shape, out_dtype)
        # No output shape: a Linear's own forward, whose output shape follows from the input's.
        key = (site, in_shape, in_dtype, out_shape, out_dtype, d > 0, cuda)  # records.KEYS[LINEAR]
        tpl = st.templates.get(key)
        if tpl is None:
            evs = self.template_of(self.linear_events, site, end, timing, in_shape, in_dtype, out_shape, out_dtype)
            fmts = [compile_template(evs[0], "seq")]
            if len(evs) > 1:
                fmts.append(compile_template(evs[1], "seq2"))
            progs = tuple(program(f) for f in fmts)
            # records.ENTRIES[LINEAR]
            tpl = st.templates[key] = (fmts, evs[0]["flops"], evs[0]["bytes_accessed"],
                                       None if None in progs else progs)
        fmts, flops, nbytes, _ = tpl
        seq = st.seq + 1
        st.seq = seq + len(fmts) - 1
        v = {"ts": (end + st.clock_offset) // 1000, "seq": seq, "seq2": seq + 1, "step": st.step,
             "fwd": st.forward, "d": d}
        if d > 0:
            v["tf"] = per_us(flops, d)
            v["tb"] = per_us(nbytes, d)
        st.pass_flops += flops
        self._count("compute_execution")
        if len(fmts) > 1:
            self._count("mlp_operation")
        if flops:
            st.total_flops += flops
        st.total_compute_us += d
        return [(f % v).encode() for f in fmts]

    def linear_events(self, site: Site, tc: int, timing: Any, xs: Any, xd: Any, os_: Any, od: Any) -> Out:
        """The builder's events of a Linear record (its FLOPs added to the pass's)."""
        st = self.state
        in_f, out_f = site.static[3], site.static[4]
        if os_ is None:  # a Linear's own forward: input.shape[:-1] + (out_features,)
            os_ = xs[:-1] + (out_f,)
        flops = linear_flops(os_, in_f, out_f)
        st.pass_flops += flops
        om = meta(os_, od)
        assert om is not None
        return self.build.linear((site, (tc + st.clock_offset) // 1000, st.step, st.forward), timing,
                                 meta(xs, xd), om, flops, site.static)

    def module(self, site: Site, end: int, timing: Any, in_shape: Any, in_dtype: Any, out_shape: Any,
               out_dtype: Any) -> Out:
        st = self.state
        cls = type(site.mod).__name__
        tns = end + st.clock_offset
        cuda = type(timing) is not int
        timing, d = timing_us(timing, self.fast)
        if not cuda and timing > st.long_ns:
            st.long_ns, st.long_site = timing, site
        ctx = (site, tns // 1000, st.step, st.forward)
        om = meta(out_shape, out_dtype)
        assert om is not None
        if d is None or not self.fast:
            return self.build.module(ctx, timing, meta(in_shape, in_dtype), om, cls)
        key = (site, in_shape, in_dtype, out_shape, out_dtype, d > 0, cuda)  # records.KEYS[MODULE]
        tpl = st.templates.get(key)
        if tpl is None:
            ev = self.template_of(self.build.module, ctx, timing, meta(in_shape, in_dtype), om, cls)[0]
            fmt = compile_template(ev, "seq")
            # records.ENTRIES[MODULE]
            tpl = st.templates[key] = (fmt, ev["flops"], ev["bytes_accessed"], ev["operation"] != "attention",
                                       program(fmt))
        fmt, flops, nbytes, counts_time, _ = tpl
        st.seq = seq = st.seq + 1
        v = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "d": d}
        if d > 0:
            v["tf"] = per_us(flops, d) if flops else 0
            v["tb"] = per_us(nbytes, d)
        self._count("compute_execution")
        if flops:
            st.total_flops += flops
        if counts_time:
            st.total_compute_us += d
        return [(fmt % v).encode()]

    def handoff(self, site: Site, start: int, timing: Any, shape: Any, dtype: Any, is_cuda: bool, memory_fraction: Any,
                fraction_source: str) -> Out:
        st = self.state
        if memory_fraction is UNREAD:
            # The machine's memory use moves slowly next to one forward pass: read once per pass,
            # here rather than on the model's thread (/proc/meminfo costs three system calls).
            memory_fraction = st.memory_fraction
            if memory_fraction is UNREAD:
                memory_fraction = st.memory_fraction = system.host_memory_fraction()
                st.memory_fraction_at = time.monotonic()
        ctx = (site, (start + st.clock_offset) // 1000, st.step, st.forward)
        tm = meta(shape, dtype, is_cuda)
        assert tm is not None
        cuda = type(timing) is not int
        timing, d = timing_us(timing, self.fast)
        if d is None or not self.fast:
            return self.build.handoff(ctx, timing, tm, memory_fraction, fraction_source)
        variant = (d > 0) + 2 * (memory_fraction is not None)
        key = ("handoff", site, shape, dtype, fraction_source, variant, cuda)  # records.KEYS[HANDOFF]
        tpl = st.templates.get(key)
        if tpl is None:
            ev = self.template_of(self.build.handoff, ctx, timing, tm, memory_fraction, fraction_source)[0]
            slots = dict(TIMED_SLOTS, transfer_bandwidth_gbps="bw")
            names = ["ts", "seq", "ts", "step", "fwd", "d"] + (["bw"] if d > 0 else [])
            if memory_fraction is not None:
                slots.update(memory_pressure="mp", memory_used_fraction="mf")
                names += ["mp", "mf"]
            fmt = compile_template(ev, "seq", slots)
            # records.ENTRIES[HANDOFF]
            tpl = st.templates[key] = (positional(fmt, names), ev["data_size_bytes"], program(fmt))
        fmt, nbytes, _ = tpl
        st.seq = seq = st.seq + 1
        ts = ctx[1]
        if variant == 3:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, per_us(nbytes, d),
                          PRESSURE_JSON[system.pressure_word(memory_fraction)],
                          memory_fraction)
        elif variant == 2:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, PRESSURE_JSON[system.pressure_word(memory_fraction)],
                          memory_fraction)
        elif variant == 1:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, per_us(nbytes, d))
        else:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d)
        self._count("component_handoff")
        st.component_flows += 1
        return [line.encode()]

    def alloc_out(self, site: Site, end: int, nbytes: int, in_shape: Any, out_shape: Any, out_dtype: Any,
                  address: int, memory: List[Any]) -> Out:
        """The output allocation of a module timed by the CPU wrapper (the shape of a
        Linear's output follows from its input's)."""
        st = self.state
        mem = self.pass_memory(memory)
        if not self.fast:
            if out_shape is None:
                out_shape = in_shape[:-1] + (site.static[4],)
            return self.alloc(site, end, "module_output", nbytes, out_shape, out_dtype, False, address, memory)
        # The template is keyed by the input's shape rather than the output's made from it. On
        # the CPU a memory reading is the RSS or nothing: its length tells which.
        key = ("out", site, nbytes, in_shape, out_shape, out_dtype, len(mem))  # records.KEYS[ALLOC_OUT]
        tpl = st.templates.get(key)
        if tpl is None:
            shape = out_shape if out_shape is not None else in_shape[:-1] + (site.static[4],)
            tpl = st.templates[key] = self.alloc_template(site, end, "module_output", nbytes, shape, out_dtype,
                                                          False, address, mem)
        return self.alloc_line(tpl, end, address, mem)

    def alloc(self, site: Site, end: int, kind: str, nbytes: int, shape: Any, dtype: Any, is_cuda: bool, address: int,
              memory: List[Any]) -> Out:
        st = self.state
        mem = self.pass_memory(memory)
        if not self.fast:
            return self.build.alloc((site, (end + st.clock_offset) // 1000, st.step, st.forward), kind, nbytes, shape,
                                    dtype, is_cuda, address, mem)
        key = (site, kind, nbytes, shape, dtype, is_cuda, tuple(mem))  # records.KEYS[ALLOC]
        tpl = st.templates.get(key)
        if tpl is None:
            tpl = st.templates[key] = self.alloc_template(site, end, kind, nbytes, shape, dtype, is_cuda, address, mem)
        return self.alloc_line(tpl, end, address, mem)

    def alloc_line(self, tpl: Tuple[str, Optional[int], Any], tc: int, ptr: int, mem: Dict[str, Any]) -> Out:
        """A ``memory_allocation`` event from its template (``alloc_template``)."""
        st = self.state
        fmt, host, _ = tpl
        st.seq = seq = st.seq + 1
        ts = (tc + st.clock_offset) // 1000
        self._count("memory_allocation")
        if host == 1:
            return [(fmt % (ts, seq, ts, st.step, st.forward, hex(ptr), mem["process_rss_bytes"])).encode()]
        if host == 0:
            return [(fmt % (ts, seq, ts, st.step, st.forward, hex(ptr))).encode()]
        v = dict(mem)
        v.update(ts=ts, seq=seq, step=st.step, fwd=st.forward, addr=hex(ptr))
        return [(fmt % v).encode()]

    def alloc_template(self, site: Site, tc: int, kind: str, size: int, shape: Any, dtype: Any, is_cuda: bool,
                       ptr: int, mem: Dict[str, Any]) -> Tuple[str, Optional[int], Any]:
        """The entry of a ``memory_allocation`` template (``records.ENTRIES[ALLOC]``): its
        format, how its memory reading is filled in — 1 the host's RSS and 0 no reading
        (positional slots), None a GPU's (by name) — and its C program."""
        st = self.state
        ctx = (site, (tc + st.clock_offset) // 1000, st.step, st.forward)
        fmt = compile_template(self.template_of(self.build.alloc, ctx, kind, size, shape, dtype, is_cuda, ptr, mem)[0],
                               "seq")
        prog = program(fmt)
        mk = tuple(mem)
        if mk == RSS_KEYS:
            return positional(fmt, ["ts", "seq", "ts", "step", "fwd", "addr", "process_rss_bytes"]), 1, prog
        if not mk:
            return positional(fmt, ["ts", "seq", "ts", "step", "fwd", "addr"]), 0, prog
        return fmt, None, prog
