"""The model thread's half of the monitor: installs the wrappers and the model's hooks,
records plain values as records (``records.py``) and hands them to the writer thread.

Each hook adds its own time to ``hook_ns`` (the monitor's measured cost in the model's
thread; torch's dispatch of a hook is not included). The step and forward pass of the
records are not repeated on each: a BEGIN record at the start of every forward pass gives
them to the writer, which also sums the pass's FLOPs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .._cuda import device_memory
from .elementwise import ElementwiseMode
from .events import tensor_meta
from .levels import MINIMAL_ALLOCATION_BYTES, ResourceLevel
from .records import ALLOC, BEGIN, ELEMENTWISE, FORWARD, HANDOFF, LINEAR, MODULE, PARAMETERS, UNREAD
from .sites import Site, classify, component_of, layer_of, layer_prefix
from .system import MemoryReader
from .wrappers import NOT_SET, WrappedForward, attention_forward, cuda_event, fast_forward, first_tensor, \
    general_forward, mlp_forward

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

    from .writer import Writer, WriterThread

__all__ = ["Recorder"]


class Recorder:
    """Records what the model's modules cost, on the model's thread.

    Args:
        model: the model.
        memory: the memory reader (shared with the writer).
        step_fn, forward_fn, capture_bytes_fn: the monitor's (``ResourceMonitor``).
        flush_events, flush_interval: when records go to the writer at the end of a pass.
    """

    def __init__(self, model: "nn.Module", memory: MemoryReader, step_fn: Optional[Callable[[], int]],
                 forward_fn: Optional[Callable[[], int]], capture_bytes_fn: Optional[Callable[[], int]],
                 flush_events: int, flush_interval: Optional[float]) -> None:
        self.model = model
        self.memory = memory
        self.step_fn = step_fn
        self.forward_fn = forward_fn
        self.capture_bytes_fn = capture_bytes_fn
        self.flush_events = max(1, int(flush_events))
        self.flush_interval = flush_interval
        self.level = ResourceLevel.MINIMAL
        self.verbose = self.detailed = False
        #: The records not handed to the writer yet; the wrappers hold its ``append``.
        self.records: List[Tuple[Any, ...]] = []
        #: Records before this index belong to forward passes that have ended.
        self.pass_start = 0
        self.last_flush = time.monotonic()
        self.thread: Optional["WriterThread"] = None
        self.writer: Optional["Writer"] = None
        #: ``[site]``: the module that took longest in the last pass the writer saw (the
        #: writer sets it, the wrappers hand the ended passes over as it starts).
        self.longest: List[Optional[Site]] = [None]
        self.step = 0
        self.forward = -1
        self.forwards = 0
        self.hook_ns = 0
        #: The running pass's memory cell (``records.FIELDS``): None outside a pass.
        self.forward_memory: Optional[List[Any]] = None
        self.stack: List[Site] = []
        self.attn_end: Dict[Optional[int], Tuple[int, Any]] = {}
        self.alloc_min = -1
        self.any_cuda = self.cuda = False
        self.cuda_total: Optional[int] = None
        self.nvml: Any = None
        self.tensor: Any = None
        #: False: every module timed by the general wrapper (the tests compare both paths).
        self.fast = True
        self.prefix = layer_prefix(model)
        self._root: Optional[Site] = None
        self._root_input: Any = None
        self._capture0 = 0
        self._mode: Any = None
        self._handles: List[Any] = []
        self._site_cache: Dict[str, Tuple[Any, Optional[Site]]] = {}
        self._wrapped: List[Tuple[Any, Any, Any]] = []

    # ----- installation --------------------------------------------------------------------------

    def install(self, level: ResourceLevel) -> None:
        """Wrap the modules ``level`` records and hook the model."""
        if self._handles:
            return
        import torch

        self.tensor = torch.Tensor
        self._root = None
        self.level = level
        self.verbose = level >= ResourceLevel.VERBOSE
        self.detailed = level >= ResourceLevel.DETAILED
        # Checked once here rather than on every call: only allocations the level keeps are
        # recorded, and only a model with CUDA parameters needs CUDA events.
        self.alloc_min = MINIMAL_ALLOCATION_BYTES if level == ResourceLevel.MINIMAL else -1
        self.any_cuda = self.cuda or any(p.is_cuda for p in self.model.parameters())
        mods = dict(self.model.named_modules())
        for name, mod in mods.items():
            # The same site object across re-installs (set_level, enable): the writer's
            # templates are keyed by it.
            known = self._site_cache.get(name)
            if known is not None and known[0] is mod:
                site = known[1]
            else:
                site = classify(self.model, name, mod, mods, self.prefix)
                self._site_cache[name] = (mod, site)
            if site is None or site.level > level:
                continue
            if site.kind == "model":
                self._root = site
                self._handles.append(mod.register_forward_pre_hook(self._model_pre, with_kwargs=True))
                continue
            self._wrap(site, mod)
        # The root's end hook last: it runs after every other hook of the root.
        self._handles.append(self.model.register_forward_hook(self._model_post, with_kwargs=True, always_call=True))

    def _wrap(self, site: Site, mod: Any) -> None:
        if site.kind == "linear":
            w = mod.weight
            if type(mod).__name__ == "Conv1D":  # GPT-2 stores (in, out)
                in_f, out_f = int(w.shape[0]), int(w.shape[1])
            else:
                in_f, out_f = int(w.shape[1]), int(w.shape[0])
            wbytes = w.numel() * w.element_size()
            b = getattr(mod, "bias", None)
            if b is not None:
                wbytes += b.numel() * b.element_size()
            site.static = (tuple(w.shape), w.dtype, wbytes, in_f, out_f)
            tag = LINEAR
        else:
            tag = MODULE
        prev = mod.__dict__.get("forward", NOT_SET)
        orig = mod.forward
        active = [True]
        if site.kind == "attention":
            forward = attention_forward(self, site, mod, orig, active)
        elif site.kind == "mlp":
            forward = mlp_forward(self, site, orig, active)
        elif self.verbose or self.any_cuda or not self.fast:
            forward = general_forward(self, site, tag, orig, active)
        else:
            # A Linear (or GPT-2 Conv1D) that runs its class's own forward returns
            # input.shape[:-1] + (out_features,): the writer derives the output shape.
            import torch.nn as nn

            fwd = type(mod).forward
            derived = prev is NOT_SET and site.kind == "linear" and (
                fwd is nn.Linear.forward or (type(mod).__name__ == "Conv1D"
                                             and type(mod).__module__.startswith("transformers.")))
            forward = fast_forward(self, site, tag, orig, active, derived)
        # The wrapper's class calls the closure itself (no frame of its own in between).
        cls = type("WrappedForward", (WrappedForward,), {"__call__": staticmethod(forward)})
        wrapper = cls(forward, orig, mod, prev, active)
        mod.__dict__["forward"] = wrapper
        self._wrapped.append((mod, wrapper, prev))

    def uninstall(self) -> None:
        """Remove the hooks and restore each module's ``forward``."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, fwd, prev in self._wrapped:
            if mod.__dict__.get("forward") is fwd:
                if prev is NOT_SET:
                    del mod.__dict__["forward"]
                else:
                    mod.__dict__["forward"] = prev
            else:
                # Something wrapped the module's forward after us: ours stays in its chain
                # and only passes the call on from now.
                fwd.active[0] = False
        self._wrapped.clear()
        self._exit_mode()

    def _exit_mode(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    # ----- the model's hooks ---------------------------------------------------------------------

    def _model_pre(self, module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        clock = time.perf_counter_ns
        t = clock()
        fwd = self.forward = self.forward_fn() if self.forward_fn is not None else self.forward + 1
        self.forwards += 1
        step = self.step_fn() if self.step_fn is not None else self.step
        records = self.records
        self.pass_start = len(records)
        records.append((BEGIN, step, fwd, time.time_ns() - clock()))
        cap = self.capture_bytes_fn
        self._capture0 = cap() if cap is not None else 0
        # The memory reading every module-output allocation of this pass carries: taken once
        # per pass (_end_forward on a GPU, the writer on the CPU) instead of once per allocation.
        self.forward_memory = [None]
        root = self._root
        if root is not None:
            # first_tensor of the positional arguments, or else of the keyword arguments.
            t_in = None
            tensor = self.tensor
            for v in (args if args else kwargs.values()):
                if isinstance(v, tensor):
                    t_in = v
                    break
            # Shape and dtype: all the model_forward event says of its input.
            self._root_input = (t_in.shape, t_in.dtype) if t_in is not None else None
            probe = next(iter(self.model.parameters()), None) if self.cuda else None
            root.ev0 = cuda_event() if probe is not None and probe.is_cuda else None
            root.t0 = clock()
        self.stack.clear()
        self.attn_end.clear()
        if self.verbose and self._mode is None:
            self._mode = ElementwiseMode(self)
            self._mode.__enter__()
        self.hook_ns += clock() - t

    def _model_post(self, module: Any, args: Any, kwargs: Dict[str, Any], output: Any) -> None:
        t = time.perf_counter_ns()
        try:
            self._end_forward(output)
        finally:
            self.hook_ns += time.perf_counter_ns() - t

    def _end_forward(self, output: Any) -> None:
        self._exit_mode()
        cell, self.forward_memory = self.forward_memory, None
        if cell is None:
            cell = [None]
        if self.cuda:
            cell[0] = self.memory.read()
        # On the CPU the writer reads the RSS as it writes the pass (Lines.pass_memory): here
        # a /proc read would be the model thread's first system call after the pass's
        # compute, tens of µs on a virtual machine against 2 µs warm.
        root = self._root
        if root is None or output is None:  # None: the forward pass raised
            return
        logits = getattr(output, "logits", None)
        out = logits if logits is not None else first_tensor(output, self.tensor)
        cap = self.capture_bytes_fn() - self._capture0 if self.capture_bytes_fn is not None else None
        sm = None
        if self.nvml is not None:
            try:
                import pynvml

                sm = float(pynvml.nvmlDeviceGetUtilizationRates(self.nvml).gpu)
            except Exception:
                sm = None
        t1 = time.perf_counter_ns()
        if root.ev0 is None:
            timing: Any = t1 - root.t0
        else:
            timing, root.ev0 = (root.ev0, cuda_event()), None
        self.records.append((FORWARD, root, time.time_ns(), timing, self._root_input,
                             out.shape if out is not None else None, cap, cell, sm))
        self._root_input = None
        if len(self.records) >= self.flush_events or (
                self.flush_interval is not None and time.monotonic() - self.last_flush > self.flush_interval):
            self.hand_off()

    # ----- what the wrappers call ----------------------------------------------------------------

    def pop(self, site: Site) -> None:
        st = self.stack
        if st and st[-1] is site:
            st.pop()
        elif site in st:
            st.remove(site)

    def memory_cell(self) -> List[Any]:
        """The memory reading of an allocation outside a forward pass of the model."""
        return [self.memory.read()]

    def alloc(self, site: Site, t: "torch.Tensor", tc: int) -> None:
        """A module's output allocation at ``tc`` (``perf_counter_ns``; the caller has applied
        the level's size filter)."""
        cell = self.forward_memory
        if cell is None:  # outside a forward pass of the model: read the memory now
            cell = self.memory_cell()
        self.records.append((ALLOC, site, tc, "module_output", t.nbytes, t.shape, t.dtype, t.is_cuda, t.data_ptr(),
                             cell))

    def handoff(self, site: Site, t: Optional["torch.Tensor"], tc: int) -> None:
        """The attention→MLP handoff of the MLP starting at ``tc`` (``perf_counter_ns``)."""
        prev = self.attn_end.pop(site.layer_id, None)
        if prev is None or t is None:
            return
        t_end, cuda_end = prev
        timing: Any = (cuda_end, cuda_event()) if cuda_end is not None else tc - t_end
        if self.cuda:
            frac: Any = device_memory()[0] / self.cuda_total if self.cuda_total else None
            src = "cuda_allocated_over_total"
        else:
            frac = UNREAD  # the machine's memory use: read by the writer (Lines.handoff)
            src = "proc_meminfo_used_over_total"
        self.records.append((HANDOFF, site, tc, timing, t.shape, t.dtype, t.is_cuda, frac, src))

    def elementwise(self, op: str, out: Any, dur_ns: int) -> None:
        """An element-wise torch function's output and duration (VERBOSE)."""
        if not isinstance(out, self.tensor):
            return
        site = self.stack[-1] if self.stack else self._root
        if site is None:
            return
        self.records.append((ELEMENTWISE, site, time.time_ns(), op, tensor_meta(out), dur_ns))

    def parameter_events(self, level: ResourceLevel) -> int:
        """Record each module's parameters (MINIMAL: only those over 1 MiB); their bytes."""
        total = 0
        self.records.append((BEGIN, self.step, -1, time.time_ns() - time.perf_counter_ns()))
        for name, mod in self.model.named_modules():
            params = [p for p in mod.parameters(recurse=False)]
            if not params:
                continue
            nbytes = sum(p.numel() * p.element_size() for p in params)
            total += nbytes
            if level == ResourceLevel.MINIMAL and nbytes <= MINIMAL_ALLOCATION_BYTES:
                continue
            site = Site(name, mod, "params", ResourceLevel.MINIMAL, layer_of(name, self.prefix),
                        component_of(name, mod))
            w = getattr(mod, "weight", None)
            first = w if w is not None else params[0]
            self.records.append((PARAMETERS, site, time.time_ns(), "parameters", nbytes, tuple(first.shape),
                                 first.dtype, first.is_cuda, first.data_ptr(), self.memory.read()))
        return total

    # ----- hand-off to the writer ----------------------------------------------------------------

    def hand_off(self) -> None:
        """Pass the recorded values to the writer thread."""
        # Copied and emptied rather than replaced: the wrappers hold its append method.
        recs = self.records[:]
        self.records.clear()
        self.pass_start = 0
        self.last_flush = time.monotonic()
        if recs:
            assert self.thread is not None
            self.thread.put(recs)

    def hand_off_passes(self) -> None:
        """Pass the records of the forward passes that have ended to the writer thread.
        Called as the module that took longest in the previous pass starts (``longest``):
        the writer then builds and writes them while that module's torch call runs without
        the interpreter lock, instead of competing with the model's thread for it. The
        running pass's records stay: its allocations wait for the memory reading taken at
        its end."""
        n = self.pass_start
        if n:
            recs = self.records[:n]
            del self.records[:n]
            self.pass_start = 0
            self.last_flush = time.monotonic()
            assert self.thread is not None and self.writer is not None
            self.thread.put(recs, time.perf_counter_ns() + self.writer.longest_ns * 4 // 5)
