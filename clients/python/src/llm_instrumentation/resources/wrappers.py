"""The wrappers that time a module on the model's thread: each records plain values (shapes,
dtypes, clock readings, CUDA events; no tensor is kept alive) as one record
(``records.FIELDS``) and passes the call on. The writer thread makes the events.

Every timed module but the model itself is wrapped: its ``forward`` becomes an instance
attribute (as accelerate's hooks do) — one Python call instead of torch's hook dispatch of
a pre and a post hook, and a module without hooks keeps torch's fast call path.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .._cuda import timing_event
from . import native
from .caches import cache_from, cache_layer, kv_len, kv_len_of
from .events import attention_flops, attention_tokens
from .records import ALLOC, ALLOC_OUT, ATTENTION, ATTENTION_KV, HANDOFF, KV, UNREAD
from .sites import Site

if TYPE_CHECKING:  # pragma: no cover
    from .recorders import Recorder

__all__ = ["WrappedForward", "attention_forward", "fast_forward", "first_tensor", "general_forward", "mlp_forward",
           "own_forward"]

#: ``forward`` was not an instance attribute before the monitor wrapped it.
NOT_SET = UNREAD


def first_tensor(x: Any, tensor: Any) -> Any:
    """The first tensor of an argument or output (a tensor, a tuple, list or dict of them)."""
    if isinstance(x, tensor):
        return x
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        for v in x:
            if isinstance(v, tensor):
                return v
    return None


#: A timing-enabled CUDA event recorded now on the current stream (``_cuda.timing_event``).
cuda_event = timing_event


def timing_of(t0: int, t1: int, ev0: Any) -> Any:
    """A module's duration as a record holds it: ns between two ``perf_counter_ns`` readings,
    or, when it started with a CUDA event, that event and one recorded now (the writer thread
    resolves the pair)."""
    return t1 - t0 if ev0 is None else (ev0, cuda_event())


class WrappedForward:
    """A module's ``forward`` as the monitor wraps it. It calls the module it was made for,
    so a copy of the module (``copy.deepcopy``, pickle) gets that module's own forward back
    instead of a wrapper that would run the original's weights."""

    def __init__(self, fn: Callable[..., Any], orig: Any, mod: Any, prev: Any, active: List[bool]) -> None:
        self.fn = fn
        self.mod = mod
        self.prev = prev
        self.active = active
        functools.update_wrapper(self, orig)  # name, doc and __wrapped__ (the signature)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        import copy

        new = memo.get(id(self.mod))
        if new is None:  # the wrapper copied without its module: nothing to rebind it to
            return self
        if self.prev is NOT_SET:
            return own_forward(new)
        return copy.deepcopy(self.prev, memo)

    def __reduce__(self) -> Any:
        if self.prev is NOT_SET:
            return (own_forward, (self.mod,))
        return (_identity, (self.prev,))


def own_forward(mod: Any) -> Any:
    """``mod``'s class's forward, bound to ``mod``."""
    return type(mod).forward.__get__(mod)


def _identity(x: Any) -> Any:
    return x


def general_forward(rec: "Recorder", site: Site, tag: int, orig: Any, active: List[bool]) -> Any:
    """The wrapper for every case: CUDA events, the VERBOSE module stack, inputs that are not
    a plain tensor in the first position. Its ``finish`` (an attribute) ends a call another
    wrapper started."""
    verbose = rec.verbose
    any_cuda = rec.any_cuda
    stack = rec.stack
    clock = time.perf_counter_ns
    tensor = rec.tensor
    append = rec.records.append
    alloc_min = rec.alloc_min
    long = rec.longest

    def finish(site: Site, args: Tuple[Any, ...], output: Any, t0: int, t1: int, ev0: Any = None) -> Any:
        out = output if type(output) is tensor else first_tensor(output, tensor)
        if out is not None:
            x = args[0] if args and type(args[0]) is tensor else first_tensor(args, tensor)
            timing = timing_of(t0, t1, ev0)
            if x is not None:
                append((tag, site, t1, timing, x.shape, x.dtype, out.shape, out.dtype))
            else:
                append((tag, site, t1, timing, None, None, out.shape, out.dtype))
            if out.nbytes > alloc_min:
                rec.alloc(site, out, t1)
        rec.hook_ns += clock() - t1
        return output

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not active[0]:
            return orig(*args, **kwargs)
        t = clock()
        if long[0] is site:
            rec.hand_off_passes()
        if verbose:
            stack.append(site)
        ev0 = None
        if any_cuda:
            x0 = first_tensor(args, tensor)
            if x0 is not None and x0.is_cuda:
                ev0 = cuda_event()
        t0 = clock()
        rec.hook_ns += t0 - t
        output = orig(*args, **kwargs)
        t1 = clock()
        if verbose:
            rec.pop(site)
        return finish(site, args, output, t0, t1, ev0)

    forward.finish = finish  # type: ignore[attr-defined]
    return forward


def fast_forward(rec: "Recorder", site: Site, tag: int, orig: Any, active: List[bool], derived: bool) -> Any:
    """The wrapper of a module on the CPU below VERBOSE: one clock read on each side of the
    call and one after the record; the input's shape and dtype and the output's dtype (and
    its shape, unless ``derived``: a Linear's own forward). The wall-clock timestamp is made
    by the writer from the end time. In C (``native.TimedForward``) where the extension is
    built: a Python wrapper costs a few microseconds per call, each decoding step calls it
    for every Linear."""
    general = general_forward(rec, site, tag, orig, active)
    finish = general.finish
    if native.TimedForward is not None:
        return native.TimedForward(rec, orig, general, finish, rec.hand_off_passes, rec.records, site, tag,
                                   rec.tensor, rec.longest, active, derived, rec.alloc_min)
    clock = time.perf_counter_ns
    tensor = rec.tensor
    append = rec.records.append
    alloc_min = rec.alloc_min
    long = rec.longest
    hand_off = rec.hand_off_passes

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not (args and type(args[0]) is tensor and active[0]):
            return general(*args, **kwargs)
        if long[0] is site:
            t = clock()
            hand_off()
            rec.hook_ns += clock() - t
        t0 = clock()
        output = orig(*args, **kwargs)
        t1 = clock()
        if type(output) is not tensor:
            return finish(site, args, output, t0, t1)
        x = args[0]
        xs = x.shape
        os_ = None if derived else output.shape
        od = output.dtype
        append((tag, site, t1, t1 - t0, xs, x.dtype, os_, od))
        n = output.nbytes
        if n > alloc_min:
            cell = rec.forward_memory
            if cell is None:  # outside a forward pass of the model: read the memory now
                cell = rec.memory_cell()
            append((ALLOC_OUT, site, t1, n, xs, os_, od, output.data_ptr(), cell))
        rec.hook_ns += clock() - t1
        return output

    return forward


def mlp_forward(rec: "Recorder", site: Site, orig: Any, active: List[bool]) -> Any:
    """The wrapper of an MLP (DETAILED): its start ends the attention→MLP handoff; its
    output is an allocation."""
    verbose = rec.verbose
    stack = rec.stack
    clock = time.perf_counter_ns
    tensor = rec.tensor
    alloc_min = rec.alloc_min
    long = rec.longest

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not active[0]:
            return orig(*args, **kwargs)
        t = clock()
        if long[0] is site:
            rec.hand_off_passes()
        if verbose:
            stack.append(site)
        rec.handoff(site, args[0] if args and type(args[0]) is tensor else first_tensor(args, tensor), t)
        rec.hook_ns += clock() - t
        output = orig(*args, **kwargs)
        t1 = clock()
        if verbose:
            rec.pop(site)
        out = output if type(output) is tensor else first_tensor(output, tensor)
        if out is not None and out.nbytes > alloc_min:
            rec.alloc(site, out, t1)
        rec.hook_ns += clock() - t1
        return output

    if verbose or rec.any_cuda or not rec.fast:
        return forward
    return _mlp_fast(rec, site, orig, active)


def _mlp_fast(rec: "Recorder", site: Site, orig: Any, active: List[bool]) -> Any:
    """The MLP wrapper on the CPU below VERBOSE: ``Recorder.handoff`` and ``alloc`` inline."""
    clock = time.perf_counter_ns
    tensor = rec.tensor
    append = rec.records.append
    alloc_min = rec.alloc_min
    long = rec.longest
    hand_off = rec.hand_off_passes
    attn_end = rec.attn_end
    layer_id = site.layer_id
    src = "proc_meminfo_used_over_total"

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not active[0]:
            return orig(*args, **kwargs)
        t = clock()
        if long[0] is site:
            hand_off()
        prev = attn_end.pop(layer_id, None)
        if prev is not None:
            x = args[0] if args and type(args[0]) is tensor else first_tensor(args, tensor)
            if x is not None:
                # The machine's memory use: read by the writer (Lines.handoff).
                append((HANDOFF, site, t, t - prev[0], x.shape, x.dtype, False, UNREAD, src))
        t0 = clock()
        rec.hook_ns += t0 - t
        output = orig(*args, **kwargs)
        t1 = clock()
        out = output if type(output) is tensor else first_tensor(output, tensor)
        if out is not None:
            n = out.nbytes
            if n > alloc_min:
                cell = rec.forward_memory
                if cell is None:  # outside a forward pass of the model: read the memory now
                    cell = rec.memory_cell()
                append((ALLOC, site, t1, "module_output", n, out.shape, out.dtype, False, out.data_ptr(), cell))
        rec.hook_ns += clock() - t1
        return output

    return forward


def attention_forward(rec: "Recorder", site: Site, mod: Any, orig: Any, active: List[bool]) -> Any:
    """The wrapper of an attention module: its duration, the query and key lengths, the KV
    cache before and after the call (read from the cache it was given)."""
    verbose = rec.verbose
    handoff = rec.detailed
    any_cuda = rec.any_cuda
    stack = rec.stack
    clock = time.perf_counter_ns
    tensor = rec.tensor
    append = rec.records.append
    alloc_min = rec.alloc_min
    attn_end = rec.attn_end
    idx = getattr(mod, "layer_idx", None)
    idx = site.layer_id if idx is None else idx
    # nn.MultiheadAttention without batch_first takes (seq, batch, embed).
    seq_first = getattr(mod, "batch_first", True) is False
    heads, head_dim = site.n_heads, site.head_dim
    long = rec.longest
    layer_id = site.layer_id

    def finish(args: Tuple[Any, ...], kwargs: Dict[str, Any], x: Any, cache: Any, before: int, output: Any,
               t0: int, t1: int, ev0: Any) -> Any:
        out = output[0] if type(output) is tuple and output and type(output[0]) is tensor \
            else first_tensor(output, tensor)
        k = v = None
        if cache is not None and idx is not None:
            k, v = cache_layer(cache, idx)
            if k is not None and k.numel() == 0:
                k = v = None
        xs = x.shape if x is not None else None
        q_len, batch = attention_tokens(xs, seq_first)
        if k is not None:
            kv_len_ = kv_len(k)
        else:
            # Cross-attention (a key given apart from the query) attends to the key's length.
            key = args[1] if len(args) > 1 else kwargs.get("key")
            kv_len_ = q_len
            if key is not None and hasattr(key, "shape") and key.dim() >= 2:
                kv_len_ = int(key.shape[0 if seq_first else -2])
        flops = attention_flops(batch, heads, q_len, kv_len_, head_dim)
        timing = timing_of(t0, t1, ev0)
        # Shapes and dtypes only: a reference to a cache tensor would keep it alive until
        # the writer got to the record.
        if k is not None:
            kv = (k.shape, k.dtype, any_cuda and k.is_cuda,
                  v.shape if v is not None else None, v.dtype if v is not None else None,
                  any_cuda and v is not None and v.is_cuda)
        else:
            kv = None
        if out is not None:
            cu = any_cuda and out.is_cuda
            append((ATTENTION, site, t1, timing, xs, x.dtype if x is not None else None,
                    any_cuda and x is not None and x.is_cuda, out.shape, out.dtype, cu, q_len, kv_len_, kv, flops))
            if handoff:
                attn_end[layer_id] = (clock(), cuda_event() if cu else None)
            if out.nbytes > alloc_min:
                rec.alloc(site, out, t1)
        else:
            append((ATTENTION, site, t1, timing, xs, x.dtype if x is not None else None,
                    any_cuda and x is not None and x.is_cuda, None, None, False, q_len, kv_len_, kv, flops))
        if kv is not None:
            append((KV, site, t1, idx, kv, before))
        rec.hook_ns += clock() - t1
        return output

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not active[0]:
            return orig(*args, **kwargs)
        t = clock()
        if long[0] is site:
            rec.hand_off_passes()
        if verbose:
            stack.append(site)
        cache = cache_from(kwargs)
        if cache is not None and idx is not None:
            before = kv_len(cache_layer(cache, idx)[0])
        else:
            before = 0
            cache = None
        x = args[0] if args else kwargs.get("hidden_states")
        ev0 = cuda_event() if any_cuda and x is not None and x.is_cuda else None
        t0 = clock()
        rec.hook_ns += t0 - t
        output = orig(*args, **kwargs)
        t1 = clock()
        if verbose:
            rec.pop(site)
        return finish(args, kwargs, x, cache, before, output, t0, t1, ev0)

    if verbose or any_cuda or not rec.fast or idx is None:
        return forward
    return _attention_fast(rec, site, orig, active, idx, seq_first, finish)


def _attention_fast(rec: "Recorder", site: Site, orig: Any, active: List[bool], idx: int, seq_first: bool,
                    finish: Any) -> Any:
    """The attention wrapper on the CPU below VERBOSE, for the common case — a cache with
    per-layer ``keys``/``values`` (``Cache.layers``), a tensor in and a tensor first out: it
    records the shapes and dtypes of the input, the output and the layer's cache before and
    after the call, and one record (ATTENTION_KV) makes the attention, KV-cache (and output
    allocation) events; query and key lengths and FLOPs are the writer's to work out.
    Anything else is finished as the general wrapper does (``finish``)."""
    clock = time.perf_counter_ns
    tensor = rec.tensor
    append = rec.records.append
    alloc_min = rec.alloc_min
    attn_end: Optional[Dict[Any, Any]] = rec.attn_end if rec.detailed else None
    long = rec.longest
    hand_off = rec.hand_off_passes
    layer_id = site.layer_id
    site.attn_static = (seq_first, site.n_heads, site.head_dim, idx)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not active[0]:
            return orig(*args, **kwargs)
        t = clock()
        if long[0] is site:
            hand_off()
        # cache_from, unrolled.
        get = kwargs.get
        cache = get("cache")
        if cache is None:
            cache = get("past_key_values")
            if cache is None:
                cache = get("past_key_value")
                if cache is None:
                    cache = get("layer_past")
        layers = kb = None
        before = 0
        if cache is not None:
            # cache_layer, keeping the layer list to read the keys after the call.
            inner = getattr(cache, "self_attention_cache", None)
            layers = getattr(cache if inner is None else inner, "layers", None)
            if layers is None:
                before = kv_len(cache_layer(cache, idx)[0])
            elif idx < len(layers):
                k0 = getattr(layers[idx], "keys", None)
                if k0 is not None:
                    kb = k0.shape
        x: Any = args[0] if args else get("hidden_states")
        t0 = clock()
        rec.hook_ns += t0 - t
        output = orig(*args, **kwargs)
        t1 = clock()
        if layers is not None:
            # The layer read again: the cache may have made it in this call.
            if idx < len(layers) and type(x) is tensor and type(output) is tuple and output \
                    and type(output[0]) is tensor:
                lay = layers[idx]
                k = getattr(lay, "keys", None)
                v = getattr(lay, "values", None)
                if k is not None and v is not None:
                    ks = k.shape
                    if 0 not in ks:
                        out: Any = output[0]
                        if attn_end is not None:
                            attn_end[layer_id] = (clock(), None)
                        n = out.nbytes
                        if n > alloc_min:
                            cell = rec.forward_memory
                            if cell is None:  # outside a forward pass of the model
                                cell = rec.memory_cell()
                            al: Any = (ALLOC, site, t1, "module_output", n, out.shape, out.dtype, False,
                                       out.data_ptr(), cell)
                        else:
                            al = None
                        append((ATTENTION_KV, site, t1, t1 - t0, x.shape, x.dtype, out.shape, out.dtype, kb, ks,
                                k.dtype, v.shape, v.dtype, al))
                        rec.hook_ns += clock() - t1
                        return output
            before = kv_len_of(kb)
        return finish(args, kwargs, x, cache, before, output, t0, t1, None)

    return forward
