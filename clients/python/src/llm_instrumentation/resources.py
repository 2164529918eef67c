"""Resource events of a PyTorch model: memory, compute, MLP, attention→MLP handoff, KV cache.

The event types and field names follow the LLaMA resource instrumentation the project was
seeded with (``memory_allocation``, ``compute_execution``, ``mlp_operation``,
``component_handoff``, ``resource_session_start`` / ``resource_session_summary``) plus
``kv_cache_update``; docs/RESOURCE_EVENTS.md is the field reference. What is measured and
what is computed is said on every event: durations are measured (CUDA events on a GPU,
``perf_counter`` around the module on a CPU), FLOPs are computed from tensor shapes
(``"flops_source": "computed_from_shapes"``), throughputs follow from the two.

The monitor has its own forward pre/post hooks, independent of the capture hooks, so it works
alone (writing ``STRAP_RESOURCE_LOG_PATH`` itself) or inside ``capture_activations``.

Example:
    >>> from llm_instrumentation.resources import monitor_resources  # doctest: +SKIP
    >>> with monitor_resources(model, level="DETAILED", path="run.resources.jsonl") as mon:
    ...     model(input_ids)
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import enum
import functools
import json
import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

__all__ = [
    "ResourceLevel",
    "ResourceMonitor",
    "ResourceSettings",
    "monitor_resources",
    "resource_settings_from_env",
    "JsonlSink",
    "SessionSink",
    "MINIMAL_ALLOCATION_BYTES",
]

log = logging.getLogger("llm_instrumentation")

#: At MINIMAL only allocations larger than this are reported (seed: "> 1 MB").
MINIMAL_ALLOCATION_BYTES = 1 << 20

#: FLOPs per element assumed for the non-matmul modules. They are conventions, not
#: measurements, and every event using one says so (``flops_per_element``).
FLOPS_PER_ELEMENT = {
    "rms_norm": 4,      # square, mean (add), rsqrt-scale, weight multiply
    "layer_norm": 7,    # mean, subtract, square, mean, rsqrt-scale, weight, bias
    "silu": 4,          # x * sigmoid(x): exp, add, divide, multiply
    "gelu": 8,          # tanh approximation
    "relu": 1,
    "elementwise": 1,
}

_VERBOSE = 3  # ResourceLevel.VERBOSE, compared in the hooks without the enum's lookup

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "intermediate")
#: Linear layers of an MLP, by the names Llama/Mistral, Mixtral, GPT-2 and GPT-NeoX use.
MLP_OPS = {
    "gate_proj": "gate_proj", "w1": "gate_proj",
    "up_proj": "up_proj", "w3": "up_proj", "c_fc": "up_proj", "fc1": "up_proj", "dense_h_to_4h": "up_proj",
    "down_proj": "down_proj", "w2": "down_proj", "c_proj": "down_proj", "fc2": "down_proj",
    "dense_4h_to_h": "down_proj",
}
_ACTIVATIONS = {"silu": "silu", "siluactivation": "silu", "swish": "silu", "gelu": "gelu",
                "geluactivation": "gelu", "newgeluactivation": "gelu", "gelutanh": "gelu",
                "pytorchgelutanh": "gelu", "fastgeluactivation": "gelu", "quickgeluactivation": "gelu",
                "relu": "relu", "reluactivation": "relu", "relu2": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}
_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}
_LAYER_RE = re.compile(r"\.(\d+)(?:\.|$)")

try:
    # The CPU timing wrapper and the writer's template filling in C (_speedups.c says why);
    # without them the Python paths below do the same and write the same bytes.
    from ._speedups import SLOT_NAMES as _SLOT_NAMES, TimedForward as _TimedForward, render as _render
except ImportError:  # pragma: no cover - exercised by the tests with them hidden
    _TimedForward = _render = None
    _SLOT_NAMES = ()


class ResourceLevel(enum.IntEnum):
    """How much is recorded (seed 003's levels).

    MINIMAL: matrix multiplications (every ``Linear``), attention, MLP projections, the KV
    cache, one event per forward pass, and allocations larger than 1 MiB. DETAILED: also
    norms, activation functions, embeddings, the attention→MLP handoff and every allocation.
    VERBOSE: also element-wise tensor operations (add, mul, ...) and every other leaf module.
    """

    MINIMAL = 1
    DETAILED = 2
    VERBOSE = 3

    @classmethod
    def parse(cls, value: Union["ResourceLevel", str, int]) -> "ResourceLevel":
        """A level from a name (case-insensitive), an int 1–3, or a level.

        Raises:
            ValueError: anything else, naming the accepted values.
        """
        if isinstance(value, ResourceLevel):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        raise ValueError(f"resource level must be one of MINIMAL, DETAILED, VERBOSE, got {value!r}")


# ----- environment ---------------------------------------------------------------------------

_ENV = {
    "level": ("STRAP_RESOURCE_LOG_LEVEL", "LLAMA_RESOURCE_LOG_LEVEL"),
    "path": ("STRAP_RESOURCE_LOG_PATH", "LLAMA_RESOURCE_LOG_PATH"),
    "disabled": ("STRAP_RESOURCE_LOG_DISABLED", "LLAMA_RESOURCE_DISABLED"),
}


class ResourceSettings:
    """What the environment asks for.

    Attributes:
        level: the level set (None when neither variable is set).
        path: the log path set (None when unset).
        disabled: resource tracking is switched off for the process.
    """

    def __init__(self, level: Optional[ResourceLevel], path: Optional[str], disabled: bool) -> None:
        self.level = level
        self.path = path
        self.disabled = disabled

    def __repr__(self) -> str:
        return f"ResourceSettings(level={self.level!r}, path={self.path!r}, disabled={self.disabled})"


def _env_value(environ: Mapping[str, str], key: str) -> Tuple[Optional[str], Optional[str]]:
    for name in _ENV[key]:
        v = environ.get(name)
        if v is not None and v.strip() != "":
            return name, v.strip()
    return None, None


def resource_settings_from_env(environ: Optional[Mapping[str, str]] = None) -> ResourceSettings:
    """Read ``STRAP_RESOURCE_LOG_LEVEL``, ``STRAP_RESOURCE_LOG_PATH`` and
    ``STRAP_RESOURCE_LOG_DISABLED`` (the seed's ``LLAMA_RESOURCE_LOG_LEVEL``,
    ``LLAMA_RESOURCE_LOG_PATH`` and ``LLAMA_RESOURCE_DISABLED`` are aliases; the STRAP name
    wins when both are set).

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        the settings.

    Raises:
        ValueError: a level that is not MINIMAL/DETAILED/VERBOSE, or a disabled flag that is
            not a boolean word (1/0, true/false, yes/no, on/off).
    """
    env = os.environ if environ is None else environ
    name, lv = _env_value(env, "level")
    level = None
    if lv is not None:
        try:
            level = ResourceLevel.parse(lv)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    _, path = _env_value(env, "path")
    name, dv = _env_value(env, "disabled")
    disabled = False
    if dv is not None:
        low = dv.lower()
        if low in ("1", "true", "yes", "on"):
            disabled = True
        elif low in ("0", "false", "no", "off"):
            disabled = False
        else:
            raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {dv!r}")
    return ResourceSettings(level, path, disabled)


# ----- sinks ---------------------------------------------------------------------------------

class JsonlSink:
    """Appends event lines to a file: the standalone mode (no daemon involved)."""

    def __init__(self, path: Union[str, os.PathLike], append: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | (0 if append else os.O_TRUNC)
        self._fd = os.open(self.path, flags, 0o644)

    def write(self, lines: Sequence[bytes]) -> None:
        """Write whole lines (each ends in ``\\n``) with one ``write(2)``."""
        data = b"".join(lines)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def flush(self) -> None:
        """Lines are written unbuffered; nothing is held back."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SessionSink:
    """Sends event lines to strapd as RESOURCES messages (PROTOCOL.md 1.4) over a capture
    session's connection; strapd appends them to the resource log passed with OPEN.

    Args:
        send: sends one RESOURCES body (bytes of a JSON object) as one message.
        max_body: the largest body one message may carry.
        path: the resource log strapd writes (for ``ResourceMonitor.path``).
    """

    def __init__(self, send: Callable[[bytes], None], max_body: int, path: Optional[str] = None) -> None:
        self._send = send
        self._max = max_body
        self.path = path
        self.messages = 0

    def write(self, lines: Sequence[bytes]) -> None:
        """Send the lines in as few messages as fit.

        Raises:
            ValueError: one event alone is larger than a message can carry.
        """
        head, tail = b'{"events":[', b"]}"
        room = self._max - len(head) - len(tail)
        batch: List[bytes] = []
        size = 0
        for line in lines:
            ev = line.rstrip(b"\n")
            if len(ev) + 1 > room:
                raise ValueError(f"a resource event of {len(ev)} bytes does not fit in one message "
                                 f"({self._max} bytes)")
            if batch and size + len(ev) + 1 > room:
                self._flush_batch(head, tail, batch)
                batch, size = [], 0
            batch.append(ev)
            size += len(ev) + 1
        if batch:
            self._flush_batch(head, tail, batch)

    def _flush_batch(self, head: bytes, tail: bytes, batch: List[bytes]) -> None:
        self._send(head + b",".join(batch) + tail)
        self.messages += 1

    def flush(self) -> None:
        """Messages are sent as they are made."""

    def close(self) -> None:
        """The connection belongs to the capture session."""


# ----- helpers -------------------------------------------------------------------------------

def _now_us() -> int:
    return time.time_ns() // 1000






#: ``torch.Tensor``, set when hooks are installed (this module imports torch only then).
_TENSOR: Any = None
#: Not read yet in this forward pass.
_UNREAD = object()


def _first_tensor(x: Any) -> Optional["torch.Tensor"]:
    tensor = _TENSOR
    if tensor is None:
        import torch

        tensor = torch.Tensor
    if isinstance(x, tensor):
        return x
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        for v in x:
            if isinstance(v, tensor):
                return v
    return None




def _layer_of(name: str, prefix: Optional[str]) -> Optional[int]:
    if prefix and name.startswith(prefix + "."):
        head = name[len(prefix) + 1:].split(".", 1)[0]
        if head.isdigit():
            return int(head)
        return None
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def _component(name: str, mod: "nn.Module") -> str:
    parts = name.split(".") if name else []
    if not parts:
        return "model"
    for p in parts:
        if p in ATTENTION_NAMES:
            return "attention"
        if p in MLP_NAMES:
            return "mlp"
    cls = type(mod).__name__.lower()
    if "norm" in cls:
        return "norm"
    if "embed" in cls or "embed" in parts[-1]:
        return "embedding"
    return parts[-1]


def _activation_name(mod: Any) -> Optional[str]:
    key = type(mod).__name__.lower()
    if key in _ACTIVATIONS:
        return _ACTIVATIONS[key]
    if "gelu" in key:
        return "gelu"
    if "silu" in key or "swish" in key:
        return "silu"
    return None


class _Rss:
    """The process's resident set size from ``/proc/self/statm`` (one pread)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: Optional[int] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def read(self) -> Optional[int]:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _peak_rss() -> Optional[int]:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


#: Seconds a reading of the machine's memory use serves the forward passes that follow: the
#: kernel makes /proc/meminfo anew on each read (about 0.1 ms here), a cost per decoding step.
_FRAC_MAX_AGE = 0.25


def _host_memory_fraction() -> Optional[float]:
    try:
        total = avail = None
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1])
                elif line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1])
                if total is not None and avail is not None:
                    return 1.0 - avail / total
    except (OSError, ValueError, ZeroDivisionError):
        pass
    return None


def _pressure_word(fraction: Optional[float]) -> Optional[str]:
    if fraction is None:
        return None
    return "low" if fraction < 0.5 else "medium" if fraction < 0.8 else "high"


def _cache_layer(cache: Any, idx: int) -> Tuple[Optional["torch.Tensor"], Optional["torch.Tensor"]]:
    """Keys and values of one layer of a Hugging Face cache (``Cache.layers`` in 4.56+,
    ``key_cache``/``value_cache`` before, or the legacy tuple of tuples)."""
    if cache is None:
        return None, None
    inner = getattr(cache, "self_attention_cache", None)
    if inner is not None:
        cache = inner
    layers = getattr(cache, "layers", None)
    if layers is not None:
        if idx < len(layers):
            lay = layers[idx]
            return getattr(lay, "keys", None), getattr(lay, "values", None)
        return None, None
    kc = getattr(cache, "key_cache", None)
    if kc is not None:
        vc = getattr(cache, "value_cache", None)
        if idx < len(kc):
            return kc[idx], (vc[idx] if vc is not None and idx < len(vc) else None)
        return None, None
    if isinstance(cache, (tuple, list)) and idx < len(cache):
        item = cache[idx]
        if isinstance(item, (tuple, list)) and len(item) >= 2:
            return item[0], item[1]
    return None, None


def _kv_len(k: Optional["torch.Tensor"]) -> int:
    if k is None or k.dim() < 2 or k.numel() == 0:
        return 0
    return int(k.shape[-2])


class _Site:
    """One hooked module: what it is, and its in-flight start time."""

    __slots__ = ("name", "mod", "kind", "level", "layer_id", "component", "mlp_op", "activation", "leaf",
                 "t0", "ev0", "n_heads", "head_dim", "flops_per_element", "static", "attn_static")

    def __init__(self, name: str, mod: Any, kind: str, level: ResourceLevel, layer_id: Optional[int],
                 component: str) -> None:
        self.name = name
        self.mod = mod
        self.kind = kind
        self.level = level
        self.layer_id = layer_id
        self.component = component
        self.mlp_op: Optional[str] = None
        self.activation: Optional[str] = None
        self.leaf = name.rsplit(".", 1)[-1] if name else "model"
        self.t0 = 0
        self.ev0: Any = None
        self.n_heads: Optional[int] = None
        self.head_dim: Optional[int] = None
        self.flops_per_element: Optional[int] = None
        self.static: Any = None
        # An attention module's (seq_first, heads, head_dim, cache layer) for the writer.
        self.attn_static: Any = None


class _WrappedForward:
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
        if self.prev is _UNREAD:
            return _own_forward(new)
        return copy.deepcopy(self.prev, memo)

    def __reduce__(self) -> Any:
        if self.prev is _UNREAD:
            return (_own_forward, (self.mod,))
        return (_identity, (self.prev,))


def _own_forward(mod: Any) -> Any:
    """``mod``'s class's forward, bound to ``mod``."""
    return type(mod).forward.__get__(mod)


def _identity(x: Any) -> Any:
    return x


def _cuda_event() -> Any:
    """A CUDA event recorded now on the current stream (timing enabled)."""
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _timing(t0: int, t1: int, ev0: Any) -> Any:
    """A module's duration as a record holds it: ns between two ``perf_counter_ns`` readings,
    or, when it started with a CUDA event, that event and one recorded now (the writer thread
    resolves the pair)."""
    return t1 - t0 if ev0 is None else (ev0, _cuda_event())


def _cache_from(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    for key in ("cache", "past_key_values", "past_key_value", "layer_past"):
        v = kwargs.get(key)
        if v is not None:
            return v
    return None


# ----- the monitor ---------------------------------------------------------------------------

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

    Raises:
        ValueError: a bad level, or neither a path nor a sink.
    """

    def __init__(self, model: "nn.Module", level: Union[ResourceLevel, str, int, None] = None,
                 path: Union[str, os.PathLike, None] = None, *, sink: Any = None,
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
        self._step_fn = step_fn
        self._capture_bytes_fn = capture_bytes_fn
        self._forward_fn = forward_fn
        self._flush_events = max(1, int(flush_events))
        self._flush_interval = flush_interval
        self._step = 0
        self._forward = -1
        self._cur_step = 0
        self._lock = threading.Lock()
        # Plain values recorded by the hooks: (builder, args...); built into events, counted,
        # serialized and written by the writer thread.
        self._records: List[Tuple[Any, ...]] = []
        self._writer: Optional[_Writer] = None
        self._root: Optional[_Site] = None
        self._last_flush = time.monotonic()
        self._handles: List[Any] = []
        self._sites: List[_Site] = []
        self._stack: List[_Site] = []
        self._attn_end: Dict[Optional[int], Tuple[int, Any]] = {}
        self._kv_prev_bytes: Dict[int, int] = {}
        self._mode: Any = None
        self._root_input: Any = None
        self._rss = _Rss()
        self._seq = 0
        self._started = False
        self._closed = False
        self._forward_capture0 = 0
        self._fwd_mem: Optional[List[Any]] = None
        self._alloc_min = -1
        self._any_cuda = False
        # Writer thread: the step, forward pass and FLOPs so far of the records it builds,
        # and the templates of the fast paths.
        self._w_step = 0
        self._w_fwd = -1
        self._w_flops = 0
        # The machine's memory use in the pass the writer builds (read at its first handoff).
        self._w_frac: Any = _UNREAD
        self._w_frac_at = float("-inf")
        # Wall clock minus perf_counter_ns: the wrappers record their end times on the
        # monotonic clock; the writer turns them into Unix time with the offset read at the
        # start of the forward pass (``_w_begin``).
        self._w_off = time.time_ns() - time.perf_counter_ns()
        # The module that took longest in the last forward pass the writer saw (``[site]``,
        # set after each batch, read by the wrappers: the records go to the writer as it
        # starts), and the writer's running maximum over the pass it is building.
        self._long: List[Optional[_Site]] = [None]
        # How long that module took (ns), when it is a Linear: one torch call that holds no
        # interpreter lock, during which the writer need not give the lock back.
        self._long_ns = 0
        self._w_long = 0
        self._w_long_site: Optional[_Site] = None
        # Records before this index belong to forward passes that have ended.
        self._pass_start = 0
        self._tpl: Dict[Any, Any] = {}
        # The writer methods of the records of the timing wrappers, one bound method each:
        # the C writer (``_render``) knows a record by it.
        self._build_linear = self._w_linear
        self._build_module = self._w_module
        self._build_alloc = self._w_alloc_out
        self._build_attention = self._w_attention_kv
        self._build_walloc = self._w_alloc
        self._build_handoff = self._w_handoff
        # False: every module timed by the general wrapper and every event built by the
        # general builders (the tests compare both paths).
        self._fast = True
        self._site_cache: Dict[str, Tuple[Any, Optional[_Site]]] = {}
        self._wrapped: List[Tuple[Any, Any, Any]] = []
        self._cuda = False
        self._cuda_total: Optional[int] = None
        self._nvml: Any = None
        # Totals for the summary.
        self.counts: Dict[str, int] = {}
        self.total_flops = 0
        self.total_compute_us = 0.0
        self.component_flows = 0
        self.forwards = 0
        self.events_written = 0
        #: time spent inside the monitor's hooks (model thread) and CPU time of its writer
        #: thread, in ns: the monitor's own cost, measured.
        self.hook_ns = 0
        self.writer_cpu_ns = 0
        self._param_bytes = 0
        self._peak_device = 0
        self._arch_prefix = self._layer_prefix()

    # ----- public control ------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether hooks are installed and events recorded."""
        return self._enabled

    def start(self) -> "ResourceMonitor":
        """Write ``resource_session_start`` and the parameter allocations; install the hooks
        (unless disabled)."""
        if self._started:
            raise RuntimeError("resource monitor already started")
        self._started = True
        dev = self._model_device()
        self._cuda = dev.type == "cuda"
        if self._cuda:
            import torch

            self._cuda_total = torch.cuda.get_device_properties(dev).total_memory
            try:  # SM utilisation only where NVML can say it; never estimated.
                import pynvml  # type: ignore[import-not-found]

                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
            except Exception:
                self._nvml = None
        import torch

        start = {
            "event": "resource_session_start",
            "resource_id": f"session_{self.session_id}",
            "timestamp": _now_us(),
            "iso_timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            "session_id": self.session_id,
            "level": self.level.name,
            "enabled": self._enabled,
            "model_class": type(self.model).__name__,
            "device": str(dev),
            "timing": "cuda_event" if self._cuda else "perf_counter",
            "torch_version": torch.__version__,
            "pid": os.getpid(),
            "nvml": self._nvml is not None,
        }
        self._writer = _Writer(self)
        # A script that never closes its monitor still gets its events and summary written.
        atexit.register(self.close)
        self._records.append((self._b_prebuilt, start))
        try:
            if self._enabled:
                self._parameter_events()
                self._install()
            self.flush()
        except BaseException:
            atexit.unregister(self.close)
            self._uninstall()
            self._closed = True
            self._writer.stop()
            self._sink.close()
            self._rss.close()
            raise
        return self

    def set_level(self, level: Union[ResourceLevel, str, int]) -> None:
        """Change the level while running (the hooks are re-installed)."""
        new = ResourceLevel.parse(level)
        with self._lock:
            self.level = new
        if self._enabled and self._started and not self._closed:
            self._uninstall()
            self._install()

    def disable(self) -> None:
        """Stop recording: the hooks are removed (no cost while disabled)."""
        self._enabled = False
        self._uninstall()

    def enable(self) -> None:
        """Record again after :meth:`disable`."""
        if self._closed:
            raise RuntimeError("resource monitor is closed")
        if not self._enabled:
            self._enabled = True
            if self._started:
                self._install()

    def set_step(self, step: int) -> None:
        """The token step the next forward passes belong to (when no ``step_fn``)."""
        self._step = int(step)

    def flush(self) -> None:
        """Write every recorded event now (on a GPU the writer waits for their CUDA events).

        Raises:
            RuntimeError: writing failed (the cause is chained).
        """
        if self._writer is None:
            raise RuntimeError("resource monitor not started")
        self._hand_off()
        self._writer.sync()
        self._sink.flush()

    def close(self) -> Dict[str, Any]:
        """Remove the hooks, write ``resource_session_summary``, flush and close the sink.

        Returns:
            the summary event.
        """
        if self._closed:
            return {}
        atexit.unregister(self.close)
        self._uninstall()
        self._closed = True
        w = self._writer
        try:
            if w is not None:
                self._hand_off()
                w.sync()  # every event counted before the summary is made
            summary = self._summary()
            if w is not None:
                self._records.append((self._b_prebuilt, summary))
                self._hand_off()
                w.sync()
        finally:
            if w is not None:
                w.stop()
            self._sink.flush()
            self._sink.close()
            self._rss.close()
        return summary

    def __enter__(self) -> "ResourceMonitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- installation --------------------------------------------------------------------

    def _layer_prefix(self) -> Optional[str]:
        try:
            from .core.auto_detect import detect_model_architecture

            return detect_model_architecture(self.model).get("layer_prefix")
        except Exception:  # any model without a recognisable block list
            return None

    def _model_device(self) -> "torch.device":
        import torch

        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def _classify(self, name: str, mod: "nn.Module", parents: Dict[str, "nn.Module"]) -> Optional[_Site]:
        import torch.nn as nn

        layer = _layer_of(name, self._arch_prefix)
        comp = _component(name, mod)
        leaf = name.rsplit(".", 1)[-1] if name else ""
        cls = type(mod).__name__
        if name == "":
            return _Site(name, mod, "model", ResourceLevel.MINIMAL, None, "model")
        if isinstance(mod, nn.Linear) or cls == "Conv1D":
            s = _Site(name, mod, "linear", ResourceLevel.MINIMAL, layer, comp)
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            if comp == "mlp" and leaf in MLP_OPS:
                s.mlp_op = MLP_OPS[leaf]
                pm = parents.get(parent)
                act = getattr(pm, "act_fn", None) or getattr(pm, "act", None) or getattr(pm, "activation_fn", None)
                s.activation = _activation_name(act) if act is not None else None
                if s.activation is None:
                    ha = getattr(getattr(self.model, "config", None), "hidden_act", None)
                    s.activation = ha if isinstance(ha, str) else None
            return s
        if leaf in ATTENTION_NAMES and any(True for _ in mod.children()):
            s = _Site(name, mod, "attention", ResourceLevel.MINIMAL, layer, "attention")
            cfg = getattr(mod, "config", None) or getattr(self.model, "config", None)
            heads = getattr(mod, "num_heads", None) or getattr(cfg, "num_attention_heads", None) \
                or getattr(cfg, "n_head", None)
            hd = getattr(mod, "head_dim", None)
            if hd is None and heads:
                hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
                hd = hidden // heads if hidden else None
            s.n_heads = int(heads) if heads else None
            s.head_dim = int(hd) if hd else None
            return s
        if leaf in MLP_NAMES and any(True for _ in mod.children()):
            return _Site(name, mod, "mlp", ResourceLevel.DETAILED, layer, "mlp")
        if any(True for _ in mod.children()):
            return None
        low = cls.lower()
        if "norm" in low:
            s = _Site(name, mod, "norm", ResourceLevel.DETAILED, layer, comp)
            s.flops_per_element = FLOPS_PER_ELEMENT["rms_norm" if "rms" in low else "layer_norm"]
            return s
        act = _activation_name(mod)
        if act is not None:
            s = _Site(name, mod, "activation", ResourceLevel.DETAILED, layer, comp)
            s.activation = act
            s.flops_per_element = FLOPS_PER_ELEMENT.get(act, FLOPS_PER_ELEMENT["elementwise"])
            return s
        if isinstance(mod, nn.Embedding):
            return _Site(name, mod, "embedding", ResourceLevel.DETAILED, layer, "embedding")
        return _Site(name, mod, "leaf", ResourceLevel.VERBOSE, layer, comp)

    def _install(self) -> None:
        if self._handles:
            return
        global _TENSOR
        import torch

        _TENSOR = torch.Tensor
        self._root = None
        level = self.level
        # Checked once here rather than on every hook: only allocations the level keeps are
        # recorded, and only a model with CUDA parameters needs CUDA events.
        self._alloc_min = MINIMAL_ALLOCATION_BYTES if level == ResourceLevel.MINIMAL else -1
        self._any_cuda = self._cuda or any(p.is_cuda for p in self.model.parameters())
        mods = dict(self.model.named_modules())
        self._sites = []
        for name, mod in mods.items():
            # The same site object across re-installs (set_level, enable): the writer's
            # templates are keyed by it.
            known = self._site_cache.get(name)
            if known is not None and known[0] is mod:
                site = known[1]
            else:
                site = self._classify(name, mod, mods)
                self._site_cache[name] = (mod, site)
            if site is None or site.level > level:
                continue
            self._sites.append(site)
            if site.kind == "model":
                self._root = site
                self._handles.append(mod.register_forward_pre_hook(self._model_pre, with_kwargs=True))
                continue
            self._wrap(site, mod)
        # The root's end hook last: it runs after every other hook of the root.
        self._handles.append(self.model.register_forward_hook(self._model_post, with_kwargs=True, always_call=True))

    def _wrap(self, site: _Site, mod: Any) -> None:
        """Time a module by wrapping its ``forward`` (an instance attribute, as accelerate's
        hooks do) rather than with a pre and a post hook: one Python call instead of torch's
        hook dispatch and two hooks, and a module without hooks keeps torch's fast call path.
        Used for every hooked module but the model itself: the modules timed alone (Linear,
        norms, activations, embeddings, leaves), attention (its keyword arguments are the
        wrapper's) and the MLP (its start ends the attention→MLP handoff)."""
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
            build = self._build_linear
        else:
            build = self._build_module
        prev = mod.__dict__.get("forward", _UNREAD)
        orig = mod.forward
        active = [True]
        if site.kind == "attention":
            forward = self._attention_forward(site, mod, orig, active)
        elif site.kind == "mlp":
            forward = self._mlp_forward(site, orig, active)
        elif self.level >= ResourceLevel.VERBOSE or self._any_cuda or not self._fast:
            forward = self._general_forward(site, build, orig, active)
        else:
            # A Linear (or GPT-2 Conv1D) that runs its class's own forward returns
            # input.shape[:-1] + (out_features,): the writer derives the output shape.
            import torch.nn as nn

            fwd = type(mod).forward
            derived = prev is _UNREAD and site.kind == "linear" and (
                fwd is nn.Linear.forward or (type(mod).__name__ == "Conv1D"
                                             and type(mod).__module__.startswith("transformers.")))
            forward = self._fast_forward(site, build, orig, active, derived)
        # The wrapper's class calls the closure itself (no frame of its own in between).
        cls = type("_WrappedForward", (_WrappedForward,), {"__call__": staticmethod(forward)})
        wrapper = cls(forward, orig, mod, prev, active)
        mod.__dict__["forward"] = wrapper
        self._wrapped.append((mod, wrapper, prev))

    def _fast_forward(self, site: _Site, build: Any, orig: Any, active: List[bool], derived: bool) -> Any:
        """The wrapper of a module on the CPU below VERBOSE: one clock read on each side of the
        call and one after the record; the input's shape and dtype and the output's dtype
        (and its shape, unless ``derived``). The wall-clock timestamp is made by the writer
        from the end time (``_w_off``). In C (``_speedups.TimedForward``) where the extension
        is built: a Python wrapper costs a few microseconds per call, each decoding step calls
        it for every Linear."""
        general = self._general_forward(site, build, orig, active)
        if _TimedForward is not None:
            return _TimedForward(self, orig, general, general._finish, self._build_alloc,  # type: ignore[attr-defined]
                                 self._hand_off_passes, self._records, site, build, _TENSOR, self._long, active,
                                 derived, self._alloc_min)
        clock = time.perf_counter_ns
        tensor = _TENSOR
        append = self._records.append
        alloc_min = self._alloc_min
        alloc = self._build_alloc
        long = self._long
        hand_off = self._hand_off_passes

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not (args and type(args[0]) is tensor and active[0]):
                return general(*args, **kwargs)
            if long[0] is site:
                t = clock()
                hand_off()
                self.hook_ns += clock() - t
            t0 = clock()
            output = orig(*args, **kwargs)
            t1 = clock()
            if type(output) is not tensor:
                return general._finish(site, args, output, t0, t1)
            x = args[0]
            xs = x.shape
            os_ = None if derived else output.shape
            od = output.dtype
            append((build, site, t1, t1 - t0, xs, x.dtype, os_, od))
            n = output.nbytes
            if n > alloc_min:
                cell = self._fwd_mem
                if cell is None:  # outside a forward pass of the model: read the memory now
                    cell = [self._mem_now()]
                append((alloc, site, t1, n, xs, os_, od, output.data_ptr(), cell))
            self.hook_ns += clock() - t1
            return output

        return forward

    def _mem_cell(self) -> List[Any]:
        """The memory reading of an allocation outside a forward pass of the model (the C
        wrapper's; ``_fast_forward`` does the same)."""
        return [self._mem_now()]

    def _general_forward(self, site: _Site, build: Any, orig: Any, active: List[bool]) -> Any:
        """The wrapper for every case: CUDA events, the VERBOSE module stack, inputs that are
        not a plain tensor in the first position."""
        verbose = self.level >= ResourceLevel.VERBOSE
        any_cuda = self._any_cuda
        stack = self._stack
        clock = time.perf_counter_ns
        tensor = _TENSOR
        append = self._records.append
        alloc_min = self._alloc_min
        long = self._long

        def finish(site: _Site, args: Tuple[Any, ...], output: Any, t0: int, t1: int, ev0: Any = None) -> Any:
            out = output if type(output) is tensor else _first_tensor(output)
            if out is not None:
                x = args[0] if args and type(args[0]) is tensor else _first_tensor(args)
                timing = _timing(t0, t1, ev0)
                if x is not None:
                    append((build, site, t1, timing, x.shape, x.dtype, out.shape, out.dtype))
                else:
                    append((build, site, t1, timing, None, None, out.shape, out.dtype))
                if out.nbytes > alloc_min:
                    self._alloc(site, out, t1)
            self.hook_ns += clock() - t1
            return output

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return orig(*args, **kwargs)
            t = clock()
            if long[0] is site:
                self._hand_off_passes()
            if verbose:
                stack.append(site)
            ev0 = None
            if any_cuda:
                x0 = _first_tensor(args)
                if x0 is not None and x0.is_cuda:
                    ev0 = _cuda_event()
            t0 = clock()
            self.hook_ns += t0 - t
            output = orig(*args, **kwargs)
            t1 = clock()
            if verbose:
                self._pop(site)
            return finish(site, args, output, t0, t1, ev0)

        forward._finish = finish  # type: ignore[attr-defined]
        return forward

    def _mlp_forward(self, site: _Site, orig: Any, active: List[bool]) -> Any:
        """The wrapper of an MLP (DETAILED): its start ends the attention→MLP handoff; its
        output is an allocation."""
        verbose = self.level >= ResourceLevel.VERBOSE
        stack = self._stack
        clock = time.perf_counter_ns
        tensor = _TENSOR
        alloc_min = self._alloc_min
        long = self._long

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return orig(*args, **kwargs)
            t = clock()
            if long[0] is site:
                self._hand_off_passes()
            if verbose:
                stack.append(site)
            self._handoff(site, args[0] if args and type(args[0]) is tensor else _first_tensor(args), t)
            self.hook_ns += clock() - t
            output = orig(*args, **kwargs)
            t1 = clock()
            if verbose:
                self._pop(site)
            out = output if type(output) is tensor else _first_tensor(output)
            if out is not None and out.nbytes > alloc_min:
                self._alloc(site, out, t1)
            self.hook_ns += clock() - t1
            return output

        if verbose or self._any_cuda or not self._fast:
            return forward
        return self._mlp_fast(site, orig, active)

    def _mlp_fast(self, site: _Site, orig: Any, active: List[bool]) -> Any:
        """The MLP wrapper on the CPU below VERBOSE: ``_handoff`` and ``_alloc`` inline."""
        clock = time.perf_counter_ns
        tensor = _TENSOR
        append = self._records.append
        alloc_min = self._alloc_min
        long = self._long
        hand_off = self._hand_off_passes
        attn_end = self._attn_end
        layer_id = site.layer_id
        w_handoff, w_alloc = self._build_handoff, self._build_walloc
        src = "proc_meminfo_used_over_total"

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return orig(*args, **kwargs)
            t = clock()
            if long[0] is site:
                hand_off()
            prev = attn_end.pop(layer_id, None)
            if prev is not None:
                x = args[0] if args and type(args[0]) is tensor else _first_tensor(args)
                if x is not None:
                    # The machine's memory use: read by the writer (_w_handoff).
                    append((w_handoff, site, t, t - prev[0], x.shape, x.dtype, False, _UNREAD, src))
            t0 = clock()
            self.hook_ns += t0 - t
            output = orig(*args, **kwargs)
            t1 = clock()
            out = output if type(output) is tensor else _first_tensor(output)
            if out is not None:
                n = out.nbytes
                if n > alloc_min:
                    cell = self._fwd_mem
                    if cell is None:  # outside a forward pass of the model: read the memory now
                        cell = [self._mem_now()]
                    append((w_alloc, site, t1, "module_output", n, out.shape, out.dtype, False, out.data_ptr(),
                            cell))
            self.hook_ns += clock() - t1
            return output

        return forward

    def _attention_forward(self, site: _Site, mod: Any, orig: Any, active: List[bool]) -> Any:
        """The wrapper of an attention module: its duration, the query and key lengths, the
        KV cache before and after the call (read from the cache it was given)."""
        verbose = self.level >= ResourceLevel.VERBOSE
        handoff = self.level >= ResourceLevel.DETAILED
        any_cuda = self._any_cuda
        stack = self._stack
        clock = time.perf_counter_ns
        tensor = _TENSOR
        append = self._records.append
        alloc_min = self._alloc_min
        attn_end = self._attn_end
        idx = getattr(mod, "layer_idx", None)
        idx = site.layer_id if idx is None else idx
        # nn.MultiheadAttention without batch_first takes (seq, batch, embed).
        seq_first = getattr(mod, "batch_first", True) is False
        heads, head_dim = site.n_heads, site.head_dim
        w_attention, w_kv = self._w_attention_raw, self._w_kv_raw
        long = self._long
        layer_id = site.layer_id

        def finish(args: Tuple[Any, ...], kwargs: Dict[str, Any], x: Any, cache: Any, before: int, output: Any,
                   t0: int, t1: int, ev0: Any) -> Any:
            out = output[0] if type(output) is tuple and output and type(output[0]) is tensor \
                else _first_tensor(output)
            k = v = None
            if cache is not None:
                k, v = _cache_layer(cache, idx)
                if k is not None and k.numel() == 0:
                    k = v = None
            if x is not None:
                xs = x.shape
                n = len(xs)
                q_len = xs[0 if seq_first else -2] if n >= 2 else 0
                batch = xs[1 if seq_first else 0] if n >= 3 else 1
            else:
                xs = None
                q_len, batch = 0, 1
            if k is not None:
                kv_len = _kv_len(k)
            else:
                # Cross-attention (a key given apart from the query) attends to the key's length.
                key = args[1] if len(args) > 1 else kwargs.get("key")
                kv_len = q_len
                if key is not None and hasattr(key, "shape") and key.dim() >= 2:
                    kv_len = int(key.shape[0 if seq_first else -2])
            flops = 4 * batch * heads * q_len * kv_len * head_dim if heads and head_dim else None
            timing = _timing(t0, t1, ev0)
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
                append((w_attention, site, t1, timing, xs, x.dtype if x is not None else None,
                        any_cuda and x is not None and x.is_cuda, out.shape, out.dtype, cu,
                        q_len, kv_len, kv, flops))
                if handoff:
                    attn_end[layer_id] = (clock(), self._cuda_mark(out) if cu else None)
                if out.nbytes > alloc_min:
                    self._alloc(site, out, t1)
            else:
                append((w_attention, site, t1, timing, xs, x.dtype if x is not None else None,
                        any_cuda and x is not None and x.is_cuda, None, None, False, q_len, kv_len, kv, flops))
            if kv is not None:
                append((w_kv, site, t1, idx, kv, before))
            self.hook_ns += clock() - t1
            return output

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return orig(*args, **kwargs)
            t = clock()
            if long[0] is site:
                self._hand_off_passes()
            if verbose:
                stack.append(site)
            cache = _cache_from(args, kwargs)
            if cache is not None and idx is not None:
                before = _kv_len(_cache_layer(cache, idx)[0])
            else:
                before = 0
                cache = None
            x = args[0] if args else kwargs.get("hidden_states")
            ev0 = _cuda_event() if any_cuda and x is not None and x.is_cuda else None
            t0 = clock()
            self.hook_ns += t0 - t
            output = orig(*args, **kwargs)
            t1 = clock()
            if verbose:
                self._pop(site)
            return finish(args, kwargs, x, cache, before, output, t0, t1, ev0)

        if verbose or any_cuda or not self._fast or idx is None:
            return forward
        return self._attention_fast(site, orig, active, idx, seq_first, finish)

    def _attention_fast(self, site: _Site, orig: Any, active: List[bool], idx: int, seq_first: bool,
                        finish: Any) -> Any:
        """The attention wrapper on the CPU below VERBOSE, for the common case — a cache with
        per-layer ``keys``/``values`` (``Cache.layers``), a tensor in and a tensor first out:
        it records the shapes and dtypes of the input, the output and the layer's cache before
        and after the call, and one record makes the attention, KV-cache (and output
        allocation) events; query and key lengths and FLOPs are the writer's to work out.
        Anything else is finished as the general wrapper does (``finish``)."""
        clock = time.perf_counter_ns
        tensor = _TENSOR
        append = self._records.append
        alloc_min = self._alloc_min
        attn_end = self._attn_end if self.level >= ResourceLevel.DETAILED else None
        long = self._long
        hand_off = self._hand_off_passes
        layer_id = site.layer_id
        record = self._build_attention
        alloc = self._build_walloc
        site.attn_static = (seq_first, site.n_heads, site.head_dim, idx)

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return orig(*args, **kwargs)
            t = clock()
            if long[0] is site:
                hand_off()
            # _cache_from, unrolled.
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
                # _cache_layer, keeping the layer list to read the keys after the call.
                inner = getattr(cache, "self_attention_cache", None)
                layers = getattr(cache if inner is None else inner, "layers", None)
                if layers is None:
                    before = _kv_len(_cache_layer(cache, idx)[0])
                elif idx < len(layers):
                    k0 = getattr(layers[idx], "keys", None)
                    if k0 is not None:
                        kb = k0.shape
            x = args[0] if args else get("hidden_states")
            t0 = clock()
            self.hook_ns += t0 - t
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
                            out = output[0]
                            if attn_end is not None:
                                attn_end[layer_id] = (clock(), None)
                            n = out.nbytes
                            if n > alloc_min:
                                cell = self._fwd_mem
                                if cell is None:  # outside a forward pass of the model
                                    cell = [self._mem_now()]
                                al: Any = (alloc, site, t1, "module_output", n, out.shape, out.dtype, False,
                                           out.data_ptr(), cell)
                            else:
                                al = None
                            append((record, site, t1, t1 - t0, x.shape, x.dtype, out.shape, out.dtype, kb, ks,
                                    k.dtype, v.shape, v.dtype, al))
                            self.hook_ns += clock() - t1
                            return output
                before = _kv_len_of(kb)
            return finish(args, kwargs, x, cache, before, output, t0, t1, None)

        return forward

    def _uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, fwd, prev in self._wrapped:
            if mod.__dict__.get("forward") is fwd:
                if prev is _UNREAD:
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

    # ----- timing --------------------------------------------------------------------------

    def _start_timer(self, site: _Site, t: Optional["torch.Tensor"]) -> None:
        site.ev0 = _cuda_event() if t is not None and t.is_cuda else None
        site.t0 = time.perf_counter_ns()

    def _stop_cuda(self, site: _Site) -> Any:
        """The CUDA event pair of a module timed on the GPU (resolved by the writer thread,
        which waits for the GPU instead of the model's thread)."""
        ev0, site.ev0 = site.ev0, None
        return (ev0, _cuda_event())

    def _mem_now(self) -> Dict[str, Any]:
        if self._cuda:
            import torch

            return {"device_memory_allocated_bytes": torch.cuda.memory_allocated(),
                    "device_memory_reserved_bytes": torch.cuda.memory_reserved(),
                    "device_memory_peak_bytes": torch.cuda.max_memory_allocated(),
                    "memory_source": "torch.cuda.memory_stats"}
        rss = self._rss.read()
        return {"process_rss_bytes": rss, "memory_source": "proc_self_statm"} if rss is not None else {}

    # ----- hooks: record plain values now, build the events in the writer thread ------------
    #
    # Each hook adds its own time to ``hook_ns`` (the monitor's measured cost in the model's
    # thread; torch's dispatch of a hook is not included). The step and forward pass of the
    # records are not repeated on each: a ``_w_begin`` record at the start of every forward
    # pass gives them to the writer, which also sums the pass's FLOPs.

    def _model_pre(self, module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        clock = time.perf_counter_ns
        t = clock()
        fwd = self._forward = self._forward_fn() if self._forward_fn is not None else self._forward + 1
        self.forwards += 1
        step = self._cur_step = self._step_fn() if self._step_fn is not None else self._step
        records = self._records
        self._pass_start = len(records)
        records.append((self._w_begin, step, fwd, time.time_ns() - clock()))
        cap = self._capture_bytes_fn
        self._forward_capture0 = cap() if cap is not None else 0
        # The memory reading every module-output allocation of this pass carries: taken once
        # per pass (_end_forward on a GPU, the writer on the CPU) instead of once per allocation.
        self._fwd_mem = [None]
        root = self._root
        if root is not None:
            # _first_tensor of the positional arguments, or else of the keyword arguments.
            t_in = None
            tensor = _TENSOR
            for v in (args if args else kwargs.values()):
                if isinstance(v, tensor):
                    t_in = v
                    break
            # Shape and dtype: all the model_forward event says of its input.
            self._root_input = (t_in.shape, t_in.dtype) if t_in is not None else None
            if self._cuda:
                self._start_timer(root, self._probe_cuda_tensor())
            else:
                root.ev0 = None
                root.t0 = clock()
        self._stack.clear()
        self._attn_end.clear()
        if self.level >= _VERBOSE and self._mode is None:
            self._mode = _ElementwiseMode(self)
            self._mode.__enter__()
        self.hook_ns += clock() - t

    def _probe_cuda_tensor(self) -> Optional["torch.Tensor"]:
        for p in self.model.parameters():
            return p
        return None

    def _model_post(self, module: Any, args: Any, kwargs: Dict[str, Any], output: Any) -> None:
        t = time.perf_counter_ns()
        try:
            self._end_forward(output)
        finally:
            self.hook_ns += time.perf_counter_ns() - t

    def _end_forward(self, output: Any) -> None:
        if self._mode is not None:
            self._exit_mode()
        cell, self._fwd_mem = self._fwd_mem, None
        if cell is None:
            cell = [None]
        if self._cuda:
            cell[0] = self._mem_now()
        # On the CPU the writer reads the RSS as it writes the pass (``_pass_mem``): here a
        # /proc read would be the model thread's first system call after the pass's compute,
        # tens of µs on a virtual machine against 2 µs warm.
        root = self._root
        if root is None or output is None:  # None: the forward pass raised
            return
        logits = getattr(output, "logits", None)
        out = logits if logits is not None else _first_tensor(output)
        cap = self._capture_bytes_fn() - self._forward_capture0 if self._capture_bytes_fn is not None else None
        sm = None
        if self._nvml is not None:
            try:
                import pynvml  # type: ignore[import-not-found]

                sm = float(pynvml.nvmlDeviceGetUtilizationRates(self._nvml).gpu)
            except Exception:
                sm = None
        t1 = time.perf_counter_ns()
        timing = t1 - root.t0 if root.ev0 is None else self._stop_cuda(root)
        self._records.append((self._w_forward, root, time.time_ns(), timing, self._root_input,
                              out.shape if out is not None else None, cap, cell, sm))
        self._root_input = None
        if len(self._records) >= self._flush_events or (
                self._flush_interval is not None and time.monotonic() - self._last_flush > self._flush_interval):
            self._hand_off()

    def _pop(self, site: _Site) -> None:
        st = self._stack
        if st and st[-1] is site:
            st.pop()
        elif site in st:
            st.remove(site)

    def _cuda_mark(self, t: "torch.Tensor") -> Any:
        return _cuda_event() if t.is_cuda else None

    def _alloc(self, site: _Site, t: "torch.Tensor", tc: int) -> None:
        """A module's output allocation at ``tc`` (``perf_counter_ns``; the caller has applied
        the level's size filter)."""
        cell = self._fwd_mem
        if cell is None:  # outside a forward pass of the model: read the memory now
            cell = [self._mem_now()]
        self._records.append((self._build_walloc, site, tc, "module_output", t.nbytes, t.shape, t.dtype,
                              t.is_cuda, t.data_ptr(), cell))

    def _parameter_events(self) -> None:
        total = 0
        self._records.append((self._w_begin, self._step, -1, time.time_ns() - time.perf_counter_ns()))
        for name, mod in self.model.named_modules():
            params = [p for p in mod.parameters(recurse=False)]
            if not params:
                continue
            nbytes = sum(p.numel() * p.element_size() for p in params)
            total += nbytes
            if self.level == ResourceLevel.MINIMAL and nbytes <= MINIMAL_ALLOCATION_BYTES:
                continue
            site = _Site(name, mod, "params", ResourceLevel.MINIMAL, _layer_of(name, self._arch_prefix),
                         _component(name, mod))
            w = getattr(mod, "weight", None)
            first = w if w is not None else params[0]
            self._records.append((self._g, self._b_alloc, site, time.time_ns(), "parameters", nbytes,
                                  tuple(first.shape), first.dtype, first.is_cuda, first.data_ptr(), self._mem_now()))
        self._param_bytes = total

    def _handoff(self, site: _Site, t: Optional["torch.Tensor"], tc: int) -> None:
        """The attention→MLP handoff of the MLP starting at ``tc`` (``perf_counter_ns``)."""
        prev = self._attn_end.pop(site.layer_id, None)
        if prev is None or t is None:
            return
        t_end, cuda_end = prev
        if cuda_end is not None:
            timing: Any = (cuda_end, _cuda_event())
        else:
            timing = tc - t_end
        if self._cuda:
            import torch

            frac = torch.cuda.memory_allocated() / self._cuda_total if self._cuda_total else None
            src = "cuda_allocated_over_total"
        else:
            frac = _UNREAD  # the machine's memory use: read by the writer (_w_handoff)
            src = "proc_meminfo_used_over_total"
        self._records.append((self._build_handoff, site, tc, timing, t.shape, t.dtype, t.is_cuda, frac, src))

    def _elementwise(self, op: str, out: Any, dur_ns: int) -> None:
        import torch

        if not isinstance(out, torch.Tensor):
            return
        site = self._stack[-1] if self._stack else self._root
        if site is None:
            return
        self._records.append((self._g, self._b_elementwise, site, time.time_ns(), op, _tm(out), dur_ns))

    # ----- builders (writer thread) --------------------------------------------------------

    def _base(self, event: str, ctx: Tuple[_Site, int, int, int], word: str) -> Dict[str, Any]:
        site, ts, step, fwd = ctx
        self._seq += 1
        layer = site.layer_id
        return {
            "event": event,
            "resource_id": f"{'gpu' if self._cuda else 'cpu'}_{word}_layer_"
                           f"{layer if layer is not None else 'none'}_{site.leaf}_{ts}_{self._seq}",
            "timestamp": ts,
            "session_id": self.session_id,
            "step": step,
            "forward": fwd,
            "layer_id": layer,
            "component_type": site.component,
            "module": site.name,
        }

    @staticmethod
    def _timing(ev: Dict[str, Any], timing: Any) -> None:
        if isinstance(timing, tuple):
            start, end = timing
            end.synchronize()
            ev["duration_us"] = start.elapsed_time(end) * 1000.0
            ev["duration_source"] = "cuda_event"
        else:
            ev["duration_us"] = timing / 1000.0
            ev["duration_source"] = "perf_counter"
        _derive(ev)

    def _b_linear(self, ctx: Any, timing: Any, xm: Any, om: Any, flops: int, static: Any) -> List[Dict[str, Any]]:
        site = ctx[0]
        wshape, wdtype, wbytes, in_f, out_f = static
        ev = self._base("compute_execution", ctx, "compute")
        ev["operation"] = "mul_mat"
        ev["input_tensors"] = [_tdesc("input", xm), {"name": "weight", "shape": list(wshape),
                                                      "dtype": _dname(wdtype)}]
        ev["output_shape"] = list(om[0])
        ev["flops"] = flops
        ev["compute_intensity_gflops"] = flops / 1e9
        ev["flops_source"] = "computed_from_shapes"
        ev["bytes_accessed"] = (xm[2] if xm is not None else 0) + wbytes + om[2]
        self._timing(ev, timing)
        out = [ev]
        if site.mlp_op is not None:
            op = site.mlp_op
            m = self._base("mlp_operation", ctx, "mlp")
            in_bytes = xm[2] if xm is not None else 0
            m["mlp_operation"] = op
            m["weight_shape"] = list(wshape)
            m["activation_shape"] = list(om[0])
            m["intermediate_dim"] = in_f if op == "down_proj" else out_f
            m["intermediate_size_bytes"] = in_bytes if op == "down_proj" else om[2]
            m["intermediate_size_mb"] = m["intermediate_size_bytes"] / (1 << 20)
            # Input and output of the projection are both live while it runs.
            m["activation_memory_peak_bytes"] = in_bytes + om[2]
            m["activation_memory_peak_mb"] = (in_bytes + om[2]) / (1 << 20)
            m["activation_memory_peak_source"] = "computed_input_plus_output"
            m["activation_function"] = site.activation
            m["flops"] = flops
            m["duration_us"] = ev.get("duration_us")
            m["duration_source"] = ev.get("duration_source")
            m["compute_resource_id"] = ev["resource_id"]
            out.append(m)
        return out

    def _b_attention(self, ctx: Any, timing: Any, xm: Any, om: Any, q_len: int, kv_len: int, km: Any, vm: Any,
                     flops: Optional[int]) -> List[Dict[str, Any]]:
        ev = self._base("compute_execution", ctx, "compute")
        ev["operation"] = "attention"
        ev["input_tensors"] = [_tdesc("hidden_states", xm)]
        if km is not None:
            ev["input_tensors"] += [_tdesc("key_cache", km), _tdesc("value_cache", vm)]
        if om is not None:
            ev["output_shape"] = list(om[0])
        ev["query_tokens"] = q_len
        ev["key_tokens"] = kv_len
        if flops is not None:
            # QK^T and the weighted sum of V, dense (a causal kernel may skip the masked
            # half); the q/k/v/o projections are their own mul_mat events.
            ev["flops"] = flops
            ev["compute_intensity_gflops"] = flops / 1e9
            ev["flops_source"] = "computed_from_shapes"
            ev["flops_covers"] = "scores_and_weighted_sum_dense"
        else:
            ev["flops"] = None
            ev["flops_source"] = "unknown_head_layout"
        self._timing(ev, timing)
        return [ev]

    def _b_kv(self, ctx: Any, idx: int, km: Any, vm: Any, before: int) -> List[Dict[str, Any]]:
        ev = self._base("kv_cache_update", ctx, "kv")
        shape, length, nbytes, growth = self._kv_step(idx, km, vm, before)
        ev["cache_length_tokens"] = length
        ev["previous_length_tokens"] = before
        ev["new_tokens"] = length - before
        ev["reused_tokens"] = before
        ev["cache_hit_ratio"] = before / length if length else 0.0
        ev["cache_bytes"] = nbytes
        ev["cache_mb"] = nbytes / (1 << 20)
        ev["bytes_per_token"] = nbytes / length if length else 0.0
        ev["growth_bytes"] = growth
        ev["key_shape"] = list(shape)
        ev["value_shape"] = list(vm[0]) if vm is not None else None
        ev["precision"] = _short(km[1])
        ev["memory_type"] = "vram" if km[3] else "host"
        ev["size_source"] = "tensor_nbytes"
        return [ev]

    def _kv_step(self, idx: int, km: Any, vm: Any, before: int) -> Tuple[Any, int, int, int]:
        """Layer ``idx``'s cache after this pass: key shape, length in tokens, bytes, and growth
        in bytes since the previous pass (remembered here)."""
        shape = km[0]
        length = int(shape[-2]) if len(shape) >= 2 else 0
        nbytes = km[2] + (vm[2] if vm is not None else 0)
        prev = self._kv_prev_bytes.get(idx)
        # A cache that starts again (a new sequence) grows from nothing; it did not shrink.
        grew_from = prev if prev is not None and before > 0 else 0
        self._kv_prev_bytes[idx] = nbytes
        return shape, length, nbytes, nbytes - grew_from

    def _b_module(self, ctx: Any, timing: Any, xm: Any, om: Any, cls: str) -> List[Dict[str, Any]]:
        site = ctx[0]
        ev = self._base("compute_execution", ctx, "compute")
        kind = site.kind
        ev["operation"] = kind if kind in ("norm", "activation", "embedding") else cls
        if site.activation and kind == "activation":
            ev["activation_function"] = site.activation
        ev["input_tensors"] = [_tdesc("input", xm)]
        ev["output_shape"] = list(om[0])
        numel = _numel(om[0])
        if kind in ("norm", "activation"):
            fpe = site.flops_per_element or 1
            flops = fpe * numel
            ev["flops"] = flops
            ev["compute_intensity_gflops"] = flops / 1e9
            ev["flops_source"] = "computed_from_shapes"
            ev["flops_per_element"] = fpe
            ev["bytes_accessed"] = (xm[2] if xm is not None else 0) + om[2]
        else:
            ev["flops"] = 0
            ev["flops_source"] = "not_counted"
            ev["bytes_accessed"] = om[2]
        self._timing(ev, timing)
        return [ev]

    def _b_forward(self, ctx: Any, timing: Any, inm: Any, out_shape: Any, cap: Optional[int],
                   mem: Dict[str, Any], sm: Optional[float]) -> List[Dict[str, Any]]:
        flops = self._w_flops
        ev = self._base("compute_execution", ctx, "compute")
        ev["operation"] = "model_forward"
        if inm is not None:
            ev["input_tensors"] = [_tdesc("input", inm)]
            if len(inm[0]) >= 2 and not inm[1].is_floating_point:
                ev["tokens_in_forward"] = int(inm[0][-1])
        if out_shape is not None:
            ev["output_shape"] = list(out_shape)
        ev["flops"] = flops
        ev["compute_intensity_gflops"] = flops / 1e9
        ev["flops_source"] = "sum_of_recorded_ops"
        if cap is not None:
            ev["capture_bytes"] = cap
        ev.update(mem)
        if "device_memory_peak_bytes" in mem:
            self._peak_device = max(self._peak_device, mem["device_memory_peak_bytes"])
        if sm is not None:
            ev["sm_utilization_percent"] = sm
            ev["sm_utilization_source"] = "nvml_device_sample"
        self._timing(ev, timing)
        return [ev]

    def _b_alloc(self, ctx: Any, kind: str, size: int, shape: Any, dtype: Any, is_cuda: bool, ptr: int,
                 mem: Dict[str, Any]) -> List[Dict[str, Any]]:
        ev = self._base("memory_allocation", ctx, "memory")
        ev["allocation_kind"] = kind
        ev["allocation_size_bytes"] = size
        ev["allocation_size_mb"] = size / (1 << 20)
        ev["memory_type"] = "vram" if is_cuda else "host"
        ev["tensor_shape"] = list(shape)
        ev["precision"] = _short(dtype)
        ev["memory_address"] = hex(ptr)
        ev["size_source"] = "tensor_nbytes"
        ev.update(mem)
        return [ev]

    def _b_handoff(self, ctx: Any, timing: Any, tm: Any, frac: Optional[float], src: str) -> List[Dict[str, Any]]:
        ev = self._base("component_handoff", ctx, "flow")
        ev["resource_id"] = ev["resource_id"].replace(f"_{ctx[0].leaf}_", "_attention_to_mlp_", 1)
        ev["from_component"] = "attention"
        ev["to_component"] = "mlp"
        ev["data_size_bytes"] = tm[2]
        ev["data_size_mb"] = tm[2] / (1 << 20)
        ev["tensor_shape"] = list(tm[0])
        # The gap holds the residual add and the post-attention norm; on one device nothing
        # is copied, so this is the effective rate of the handoff, not a link bandwidth.
        ev["bandwidth_source"] = "bytes_over_measured_gap"
        self._timing(ev, timing)
        ev["memory_pressure"] = _pressure_word(frac)
        ev["memory_used_fraction"] = frac
        ev["memory_pressure_source"] = src
        return [ev]

    def _b_elementwise(self, ctx: Any, op: str, om: Any, dur_ns: int) -> List[Dict[str, Any]]:
        ev = self._base("compute_execution", ctx, "compute")
        ev["operation"] = op
        ev["elementwise"] = True
        ev["output_shape"] = list(om[0])
        flops = _numel(om[0]) * FLOPS_PER_ELEMENT["elementwise"]
        self._w_flops += flops
        ev["flops"] = flops
        ev["compute_intensity_gflops"] = flops / 1e9
        ev["flops_source"] = "computed_from_shapes"
        ev["flops_per_element"] = FLOPS_PER_ELEMENT["elementwise"]
        ev["bytes_accessed"] = om[2]
        ev["duration_us"] = dur_ns / 1000.0
        # On a GPU this is the host time of the launch: a CUDA event pair per element-wise
        # op would cost more than the op.
        ev["duration_source"] = "perf_counter_launch_only" if om[3] else "perf_counter"
        _derive(ev)
        return [ev]

    @staticmethod
    def _b_prebuilt(ev: Dict[str, Any]) -> List[Dict[str, Any]]:
        return [ev]

    # ----- fast paths (writer thread) ------------------------------------------------------
    #
    # What repeats from one forward pass to the next — a module's name, layer, shapes, FLOPs,
    # byte counts — is serialized once per module and input shape into a %-format template
    # (``_compile``); an event then costs one formatting of its few changing values
    # (timestamp, sequence number, step, forward, duration and what follows from it). The
    # template is made from the event the builder above makes, so both paths write the same
    # fields in the same order.

    def _g(self, builder: Callable[..., List[Dict[str, Any]]], site: _Site, tns: int, *rest: Any) -> List[Any]:
        """An event built the general way (dicts, serialized by the writer loop)."""
        return builder((site, tns // 1000, self._w_step, self._w_fwd), *rest)

    def _pass_mem(self, cell: List[Any]) -> Dict[str, Any]:
        """The memory reading of a forward pass: the one the model's thread took at its end (a
        GPU's), else read now and kept for the pass's other events (the RSS: read here, as
        the writer writes the pass, so the model's thread makes no system call for it)."""
        mem = cell[0]
        if mem is None:
            mem = cell[0] = self._mem_now()
        return mem

    def _w_begin(self, step: int, fwd: int, off: int) -> List[Any]:
        """A forward pass starts: the step and forward number of the records that follow, and
        the wall clock's offset from ``perf_counter_ns`` their end times are read against."""
        self._w_step = step
        self._w_fwd = fwd
        self._w_flops = 0
        self._w_off = off
        self._w_long_site = None
        self._w_long = 0
        if time.monotonic() - self._w_frac_at > _FRAC_MAX_AGE:
            self._w_frac = _UNREAD
        return []

    def _w_forward(self, root: _Site, tns: int, timing: Any, inm: Any, out_shape: Any, cap: Optional[int],
                   cell: List[Any], sm: Optional[float]) -> List[Any]:
        """The model_forward event of a pass: its FLOPs are the writer's sum over the pass."""
        mem = self._pass_mem(cell)
        ctx = (root, tns // 1000, self._w_step, self._w_fwd)
        if type(timing) is not int or sm is not None or not self._fast or "device_memory_peak_bytes" in mem:
            return self._b_forward(ctx, timing, inm, out_shape, cap, mem, sm)
        flops = self._w_flops
        tf = bool(flops) and timing > 0
        key = ("forward", root, inm, out_shape, cap is None, tuple(mem), tf)
        fmt = self._tpl.get(key)
        if fmt is None:
            ev = self._template_of(self._b_forward, ctx, timing, inm, out_shape, cap, mem, sm)[0]
            fmt = self._tpl[key] = _compile(ev, "seq", _FORWARD_SLOTS)
        self._seq = seq = self._seq + 1
        d = timing / 1000.0
        v = dict(mem)
        v.update(ts=ctx[1], seq=seq, step=ctx[2], fwd=ctx[3], fl=flops, gf=flops / 1e9, cap=cap, d=d)
        if tf:
            v["tf"] = flops / (d * 1e3)
        counts = self.counts
        counts["compute_execution"] = counts.get("compute_execution", 0) + 1
        return [(fmt % v).encode()]

    def _w_linear(self, site: _Site, tc: int, timing: Any, xs: Any, xd: Any, os_: Any, od: Any) -> List[Any]:
        if type(timing) is not int:  # a CUDA event pair: resolved and built the general way
            return self._b_linear_rec(site, tc, timing, xs, xd, os_, od)
        if timing > self._w_long:
            self._w_long, self._w_long_site = timing, site
        if not self._fast:
            return self._b_linear_rec(site, tc, timing, xs, xd, os_, od)
        # No output shape: a Linear's own forward, whose output shape follows from the input's.
        key = (site, xs, xd, os_, od, timing > 0)
        tpl = self._tpl.get(key)
        if tpl is None:
            evs = self._template_of(self._b_linear_rec, site, tc, timing, xs, xd, os_, od)
            fmts = [_compile(evs[0], "seq")]
            if len(evs) > 1:
                fmts.append(_compile(evs[1], "seq2"))
            progs = tuple(_program(f) for f in fmts)
            tpl = self._tpl[key] = (fmts, evs[0]["flops"], evs[0]["bytes_accessed"],
                                    None if None in progs else progs)
        fmts, flops, nbytes, _ = tpl
        seq = self._seq + 1
        self._seq = seq + len(fmts) - 1
        d = timing / 1000.0
        v = {"ts": (tc + self._w_off) // 1000, "seq": seq, "seq2": seq + 1, "step": self._w_step,
             "fwd": self._w_fwd, "d": d}
        if timing > 0:
            v["tf"] = flops / (d * 1e3)
            v["tb"] = nbytes / (d * 1e3)
        self._w_flops += flops
        counts = self.counts
        counts["compute_execution"] = counts.get("compute_execution", 0) + 1
        if len(fmts) > 1:
            counts["mlp_operation"] = counts.get("mlp_operation", 0) + 1
        if flops:
            self.total_flops += flops
        self.total_compute_us += d
        return [(f % v).encode() for f in fmts]

    def _b_linear_rec(self, site: _Site, tc: int, timing: Any, xs: Any, xd: Any, os_: Any,
                      od: Any) -> List[Dict[str, Any]]:
        """``_b_linear`` of a wrapper's record (adds its FLOPs to the pass's)."""
        in_f, out_f = site.static[3], site.static[4]
        if os_ is None:  # a Linear's own forward: input.shape[:-1] + (out_features,)
            os_ = xs[:-1] + (out_f,)
        flops = 2 * (_numel(os_) // out_f if out_f else 0) * in_f * out_f
        self._w_flops += flops
        return self._b_linear((site, (tc + self._w_off) // 1000, self._w_step, self._w_fwd), timing,
                              _meta(xs, xd), _meta(os_, od), flops, site.static)

    def _w_module(self, site: _Site, tc: int, timing: Any, xs: Any, xd: Any, os_: Any, od: Any) -> List[Any]:
        cls = type(site.mod).__name__
        tns = tc + self._w_off
        if type(timing) is int and timing > self._w_long:
            self._w_long, self._w_long_site = timing, site
        ctx = (site, tns // 1000, self._w_step, self._w_fwd)
        if type(timing) is not int or not self._fast:
            return self._b_module(ctx, timing, _meta(xs, xd), _meta(os_, od), cls)
        key = (site, xs, xd, os_, od, timing > 0)
        tpl = self._tpl.get(key)
        if tpl is None:
            ev = self._template_of(self._b_module, ctx, timing, _meta(xs, xd), _meta(os_, od), cls)[0]
            fmt = _compile(ev, "seq")
            tpl = self._tpl[key] = (fmt, ev["flops"], ev["bytes_accessed"], ev["operation"] != "attention",
                                    _program(fmt))
        fmt, flops, nbytes, counts_time, _ = tpl
        self._seq = seq = self._seq + 1
        d = timing / 1000.0
        v = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "d": d}
        if timing > 0:
            v["tf"] = flops / (d * 1e3) if flops else 0
            v["tb"] = nbytes / (d * 1e3)
        counts = self.counts
        counts["compute_execution"] = counts.get("compute_execution", 0) + 1
        if flops:
            self.total_flops += flops
        if counts_time:
            self.total_compute_us += d
        return [(fmt % v).encode()]

    def _w_handoff(self, site: _Site, tc: int, timing: Any, shape: Any, dtype: Any, is_cuda: bool,
                   frac: Optional[float], src: str) -> List[Any]:
        if frac is _UNREAD:
            # The machine's memory use moves slowly next to one forward pass: read once per pass,
            # here rather than on the model's thread (/proc/meminfo costs three system calls).
            frac = self._w_frac
            if frac is _UNREAD:
                frac = self._w_frac = _host_memory_fraction()
                self._w_frac_at = time.monotonic()
        ctx = (site, (tc + self._w_off) // 1000, self._w_step, self._w_fwd)
        if type(timing) is not int or not self._fast:
            return self._b_handoff(ctx, timing, _meta(shape, dtype, is_cuda), frac, src)
        variant = (timing > 0) + 2 * (frac is not None)
        key = ("handoff", site, shape, dtype, src, variant)
        tpl = self._tpl.get(key)
        if tpl is None:
            ev = self._template_of(self._b_handoff, ctx, timing, _meta(shape, dtype, is_cuda), frac, src)[0]
            slots = dict(_SLOTS, transfer_bandwidth_gbps="bw")
            names = ["ts", "seq", "ts", "step", "fwd", "d"] + (["bw"] if timing > 0 else [])
            if frac is not None:
                slots.update(memory_pressure="mp", memory_used_fraction="mf")
                names += ["mp", "mf"]
            fmt = _compile(ev, "seq", slots)
            tpl = self._tpl[key] = (_positional(fmt, names), ev["data_size_bytes"], _program(fmt))
        fmt, nbytes, _ = tpl
        self._seq = seq = self._seq + 1
        d = timing / 1000.0
        ts = ctx[1]
        if variant == 3:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, nbytes / (d * 1e3), _PRESSURE_JSON[_pressure_word(frac)],
                          frac)
        elif variant == 2:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, _PRESSURE_JSON[_pressure_word(frac)], frac)
        elif variant == 1:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d, nbytes / (d * 1e3))
        else:
            line = fmt % (ts, seq, ts, ctx[2], ctx[3], d)
        counts = self.counts
        counts["component_handoff"] = counts.get("component_handoff", 0) + 1
        self.component_flows += 1
        return [line.encode()]

    def _w_alloc_out(self, site: _Site, tc: int, size: int, xs: Any, os_: Any, od: Any, ptr: int,
                     cell: List[Any]) -> List[Any]:
        """The output allocation of a module timed by ``_fast_forward`` (on the CPU; the
        shape of a Linear's output follows from its input's)."""
        mem = self._pass_mem(cell)
        if not self._fast:
            if os_ is None:
                os_ = xs[:-1] + (site.static[4],)
            return self._w_alloc(site, tc, "module_output", size, os_, od, False, ptr, cell)
        # The template is keyed by the input's shape rather than the output's made from it. On
        # the CPU a memory reading is the RSS or nothing (``_mem_now``): its length tells which.
        key = ("out", site, size, xs, os_, od, len(mem))
        tpl = self._tpl.get(key)
        if tpl is None:
            shape = os_ if os_ is not None else xs[:-1] + (site.static[4],)
            tpl = self._tpl[key] = self._alloc_template(site, tc, "module_output", size, shape, od, False, ptr, mem)
        return self._alloc_line(tpl, tc, ptr, mem)

    def _alloc_line(self, tpl: Tuple[str, Optional[int], Any], tc: int, ptr: int, mem: Dict[str, Any]) -> List[Any]:
        """A ``memory_allocation`` event from its template (``_alloc_template``)."""
        fmt, host, _ = tpl
        self._seq = seq = self._seq + 1
        ts = (tc + self._w_off) // 1000
        counts = self.counts
        counts["memory_allocation"] = counts.get("memory_allocation", 0) + 1
        if host == 1:
            return [(fmt % (ts, seq, ts, self._w_step, self._w_fwd, hex(ptr), mem["process_rss_bytes"])).encode()]
        if host == 0:
            return [(fmt % (ts, seq, ts, self._w_step, self._w_fwd, hex(ptr))).encode()]
        v = dict(mem)
        v.update(ts=ts, seq=seq, step=self._w_step, fwd=self._w_fwd, addr=hex(ptr))
        return [(fmt % v).encode()]

    def _alloc_template(self, site: _Site, tc: int, kind: str, size: int, shape: Any, dtype: Any, is_cuda: bool,
                        ptr: int, mem: Dict[str, Any]) -> Tuple[str, Optional[int], Any]:
        """The template of a ``memory_allocation`` event, how its memory reading is filled
        in — 1 the host's RSS and 0 no reading (positional slots), None a GPU's (by name) —
        and its C program (``_program``)."""
        ctx = (site, (tc + self._w_off) // 1000, self._w_step, self._w_fwd)
        fmt = _compile(self._template_of(self._b_alloc, ctx, kind, size, shape, dtype, is_cuda, ptr, mem)[0], "seq")
        prog = _program(fmt)
        mk = tuple(mem)
        if mk == _RSS_KEYS:
            return _positional(fmt, ["ts", "seq", "ts", "step", "fwd", "addr", "process_rss_bytes"]), 1, prog
        if not mk:
            return _positional(fmt, ["ts", "seq", "ts", "step", "fwd", "addr"]), 0, prog
        return fmt, None, prog

    def _w_alloc(self, site: _Site, tc: int, kind: str, size: int, shape: Any, dtype: Any, is_cuda: bool,
                 ptr: int, cell: List[Any]) -> List[Any]:
        tns = tc + self._w_off
        mem = self._pass_mem(cell)
        if not self._fast:
            return self._b_alloc((site, tns // 1000, self._w_step, self._w_fwd), kind, size, shape, dtype, is_cuda,
                                 ptr, mem)
        key = (site, kind, size, shape, dtype, is_cuda, tuple(mem))
        tpl = self._tpl.get(key)
        if tpl is None:
            tpl = self._tpl[key] = self._alloc_template(site, tc, kind, size, shape, dtype, is_cuda, ptr, mem)
        return self._alloc_line(tpl, tc, ptr, mem)

    def _w_attention_raw(self, site: _Site, tc: int, timing: Any, xs: Any, xd: Any, xcu: bool, os_: Any, od: Any,
                         ocu: bool, q_len: int, kv_len: int, kv: Any, flops: Optional[int]) -> List[Any]:
        """An attention record of the wrapper (shapes and dtypes as read, end time on
        ``perf_counter_ns``)."""
        if type(timing) is int and timing > self._w_long:
            self._w_long, self._w_long_site = timing, site
        km = vm = None
        if kv is not None:
            km = _meta(kv[0], kv[1], kv[2])
            vm = _meta(kv[3], kv[4], kv[5])
        return self._w_attention(site, tc + self._w_off, timing, _meta(xs, xd, xcu), _meta(os_, od, ocu),
                                 q_len, kv_len, km, vm, flops)

    def _w_kv_raw(self, site: _Site, tc: int, idx: int, kv: Any, before: int) -> List[Any]:
        return self._w_kv(site, tc + self._w_off, idx, _meta(kv[0], kv[1], kv[2]), _meta(kv[3], kv[4], kv[5]),
                          before)

    def _w_attention(self, site: _Site, tns: int, timing: Any, xm: Any, om: Any, q_len: int, kv_len: int, km: Any,
                     vm: Any, flops: Optional[int]) -> List[Any]:
        if flops is not None:
            self._w_flops += flops
        ctx = (site, tns // 1000, self._w_step, self._w_fwd)
        if type(timing) is not int or not self._fast:
            return self._b_attention(ctx, timing, xm, om, q_len, kv_len, km, vm, flops)
        # The cache's shapes, the key length and the FLOPs change every decoding step: they
        # are slots of the template, not part of its key.
        key = ("attention", site, xm, om, km is not None and km[1], vm is not None and vm[1],
               flops is None, timing > 0)
        tpl = self._tpl.get(key)
        if tpl is None:
            ev = self._template_of(self._b_attention, ctx, timing, xm, om, q_len, kv_len, km, vm, flops)[0]
            slots = dict(_SLOTS, query_tokens="qt", key_tokens="kt")
            if km is not None:
                slots["input_tensors"] = "it"
                it = _ENCODER.encode(ev["input_tensors"][:1])[:-1].replace("%", "%%")
                it += ',{"name":"key_cache","shape":%(ks)s,"dtype":' + _ENCODER.encode(_dname(km[1]))
                it += '},{"name":"value_cache","shape":%(vs)s,"dtype":' + _ENCODER.encode(
                    _dname(vm[1]) if vm is not None else None) + "}]"
            else:
                it = None
            if flops is not None:
                slots.update(flops="fl", compute_intensity_gflops="gf")
            tpl = self._tpl[key] = (_compile(ev, "seq", slots), it)
        fmt, it = tpl
        self._seq = seq = self._seq + 1
        d = timing / 1000.0
        v = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "d": d, "qt": q_len, "kt": kv_len}
        if it is not None:
            v["it"] = it % {"ks": _shape_info(km[0])[0], "vs": _shape_info(vm[0])[0] if vm is not None else "null"}
        if flops is not None:
            v["fl"] = flops
            v["gf"] = flops / 1e9
            if timing > 0:
                v["tf"] = flops / (d * 1e3)
            if flops:
                self.total_flops += flops
        counts = self.counts
        counts["compute_execution"] = counts.get("compute_execution", 0) + 1
        return [(fmt % v).encode()]

    def _w_kv(self, site: _Site, tns: int, idx: int, km: Any, vm: Any, before: int) -> List[Any]:
        ctx = (site, tns // 1000, self._w_step, self._w_fwd)
        if not self._fast:
            return self._b_kv(ctx, idx, km, vm, before)
        key = ("kv", site, km[1], km[3], len(km[0]) >= 2, vm is None)
        fmt = self._tpl.get(key)
        if fmt is None:
            prev = self._kv_prev_bytes.get(idx)
            try:
                ev = self._template_of(self._b_kv, ctx, idx, km, vm, before)[0]
            finally:
                if prev is None:
                    self._kv_prev_bytes.pop(idx, None)
                else:
                    self._kv_prev_bytes[idx] = prev
            fmt = self._tpl[key] = _compile(ev, "seq", _KV_SLOTS)
        shape, length, nbytes, growth = self._kv_step(idx, km, vm, before)
        self._seq = seq = self._seq + 1
        v = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "len": length, "prev": before,
             "new": length - before, "reused": before, "hit": before / length if length else 0.0,
             "cb": nbytes, "cmb": nbytes / (1 << 20), "bpt": nbytes / length if length else 0.0,
             "grow": growth, "ks": _shape_info(shape)[0], "vs": _shape_info(vm[0])[0] if vm is not None else "null"}
        counts = self.counts
        counts["kv_cache_update"] = counts.get("kv_cache_update", 0) + 1
        return [(fmt % v).encode()]

    def _w_attention_kv(self, site: _Site, tc: int, timing: int, xs: Any, xd: Any, os_: Any, od: Any, kb: Any,
                        ks: Any, kd: Any, vs: Any, vd: Any, al: Any) -> List[Any]:
        """A record of ``_attention_fast``: the attention event, the output allocation (``al``,
        a record of its own, or None) and the KV-cache event, in the order and with the
        values the general wrapper's records give."""
        if timing > self._w_long:
            self._w_long, self._w_long_site = timing, site
        seq_first, heads, head_dim, idx = site.attn_static
        n = len(xs)
        q_len = xs[0 if seq_first else -2] if n >= 2 else 0
        batch = xs[1 if seq_first else 0] if n >= 3 else 1
        kv_len = ks[-2] if len(ks) >= 2 else 0  # the wrapper passes no empty cache
        flops = 4 * batch * heads * q_len * kv_len * head_dim if heads and head_dim else None
        before = _kv_len_of(kb)
        tns = tc + self._w_off
        if not self._fast:
            km, vm = _meta(ks, kd), _meta(vs, vd)
            out = self._w_attention(site, tns, timing, _meta(xs, xd), _meta(os_, od), q_len, kv_len, km, vm, flops)
            if al is not None:
                out += al[0](*al[1:])
            return out + self._w_kv(site, tns, idx, km, vm, before)
        variant = 0 if flops is None else 2 if flops and timing > 0 else 1
        key = (site, xs, xd, os_, od, kd, vd, variant)
        tpl = self._tpl.get(key)
        if tpl is None:
            tpl = self._tpl[key] = self._attention_kv_templates(site, tns, timing, xs, xd, os_, od, q_len, kv_len,
                                                                ks, kd, vs, vd, flops, before, variant)
        fa, fk, isz_k, isz_v, _, _ = tpl
        sk, nk = _shape_info(ks)
        sv, nv = _shape_info(vs)
        ts = tns // 1000
        step, fwd = self._w_step, self._w_fwd
        seq = self._seq + 1
        d = timing / 1000.0
        if variant == 2:
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, flops, flops / 1e9, d, flops / (d * 1e3))
        elif variant == 1:
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, flops, flops / 1e9, d)
        else:
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, d)
        self._seq = seq
        lines = [line.encode()]
        counts = self.counts
        counts["compute_execution"] = counts.get("compute_execution", 0) + 1
        if flops:
            self._w_flops += flops
            self.total_flops += flops
        if al is not None:
            lines += al[0](*al[1:])
            seq = self._seq
        # _kv_step
        nbytes = nk * isz_k + nv * isz_v
        prev = self._kv_prev_bytes.get(idx)
        grew_from = prev if prev is not None and before > 0 else 0
        self._kv_prev_bytes[idx] = nbytes
        self._seq = seq = seq + 1
        if kv_len:
            hit, bpt = before / kv_len, nbytes / kv_len
        else:
            hit = bpt = 0.0
        lines.append((fk % (ts, seq, ts, step, fwd, kv_len, before, kv_len - before, before, hit, nbytes,
                            nbytes / (1 << 20), bpt, nbytes - grew_from, sk, sv)).encode())
        counts["kv_cache_update"] = counts.get("kv_cache_update", 0) + 1
        return lines

    def _attention_kv_templates(self, site: _Site, tns: int, timing: int, xs: Any, xd: Any, os_: Any, od: Any,
                                q_len: int, kv_len: int, ks: Any, kd: Any, vs: Any, vd: Any, flops: Optional[int],
                                before: int, variant: int) -> Tuple[str, str, int, int, Any, Any]:
        """The positional templates of ``_w_attention_kv`` (attention event, KV-cache event),
        the cache's item sizes and the C programs of both templates, made from the events the
        builders make."""
        ctx = (site, tns // 1000, self._w_step, self._w_fwd)
        km, vm = _meta(ks, kd), _meta(vs, vd)
        ev = self._template_of(self._b_attention, ctx, timing, _meta(xs, xd), _meta(os_, od), q_len, kv_len, km,
                               vm, flops)[0]
        slots = dict(_SLOTS, query_tokens="qt", key_tokens="kt", input_tensors="it")
        if flops is not None:
            slots.update(flops="fl", compute_intensity_gflops="gf")
        it = _ENCODER.encode(ev["input_tensors"][:1])[:-1].replace("%", "%%")
        it += ',{"name":"key_cache","shape":%(ks)s,"dtype":' + _ENCODER.encode(_dname(kd))
        it += '},{"name":"value_cache","shape":%(vs)s,"dtype":' + _ENCODER.encode(_dname(vd)) + "}]"
        fa = _compile(ev, "seq", slots).replace("%(it)s", it)
        pa = _program(fa)
        names = ["ts", "seq", "ts", "step", "fwd", "ks", "vs", "qt", "kt"]
        names += ["d"] if variant == 0 else ["fl", "gf", "d"] if variant == 1 else ["fl", "gf", "d", "tf"]
        fa = _positional(fa, names)
        idx = site.attn_static[3]
        prev = self._kv_prev_bytes.get(idx)
        try:
            ev = self._template_of(self._b_kv, ctx, idx, km, vm, before)[0]
        finally:
            if prev is None:
                self._kv_prev_bytes.pop(idx, None)
            else:
                self._kv_prev_bytes[idx] = prev
        fk = _compile(ev, "seq", _KV_SLOTS)
        pk = _program(fk)
        fk = _positional(fk, ["ts", "seq", "ts", "step", "fwd", "len", "prev", "new", "reused", "hit", "cb", "cmb",
                              "bpt", "grow", "ks", "vs"])
        return fa, fk, _itemsize(kd), _itemsize(vd), pa, pk

    def _template_of(self, builder: Callable[..., List[Dict[str, Any]]], *args: Any) -> List[Dict[str, Any]]:
        """The events ``builder`` makes of a record, as the model for a template (the
        sequence numbers they take are given back)."""
        if len(self._tpl) >= _MAX_TEMPLATES:
            # Many input shapes (prompts of every length): start again rather than grow.
            self._tpl.clear()
        seq, flops = self._seq, self._w_flops
        try:
            return builder(*args)
        finally:
            self._seq, self._w_flops = seq, flops

    # ----- output --------------------------------------------------------------------------

    def _hand_off(self) -> None:
        """Pass the recorded values to the writer thread."""
        # Copied and emptied rather than replaced: the hooks hold its append method.
        recs = self._records[:]
        self._records.clear()
        self._pass_start = 0
        self._last_flush = time.monotonic()
        if recs:
            assert self._writer is not None
            self._writer.put(recs)

    def _hand_off_passes(self) -> None:
        """Pass the records of the forward passes that have ended to the writer thread.
        Called as the module that took longest in the previous pass starts (``_long``): the
        writer then builds and writes them while that module's torch call runs without the
        interpreter lock, instead of competing with the model's thread for it. The running
        pass's records stay: its allocations wait for the memory reading taken at its end."""
        n = self._pass_start
        if n:
            recs = self._records[:n]
            del self._records[:n]
            self._pass_start = 0
            self._last_flush = time.monotonic()
            assert self._writer is not None
            self._writer.put(recs, time.perf_counter_ns() + self._long_ns * 4 // 5)

    def _write_batch(self, recs: List[Any], quiet_until: int = 0) -> None:
        """Writer thread: build, count, serialize and write one batch."""
        c0 = time.thread_time_ns()
        try:
            self._write_batch_inner(recs, quiet_until)
        finally:
            self.writer_cpu_ns += time.thread_time_ns() - c0

    def _write_batch_inner(self, recs: List[Any], quiet_until: int = 0) -> None:
        """Until ``quiet_until`` (``perf_counter_ns``) the model's thread is known to be in a
        long Linear's torch call, which does not want the interpreter lock: no need to give it
        back before then (each ``sleep(0)`` costs ~20 µs of CPU and ~80 µs here)."""
        enc = _ENCODER.encode
        lines: List[bytes] = []
        counts = self.counts
        clock = time.perf_counter_ns
        last = max(clock(), quiet_until - _YIELD_NS)
        render = _render if self._fast else None
        fast = (self._build_linear, self._build_module, self._build_alloc, self._build_attention, self._build_walloc,
                self._build_handoff)
        consts = fast + (self._tpl, counts, self._kv_prev_bytes, _UNREAD)
        i, n = 0, len(recs)
        while i < n:
            if render is not None and recs[i][0] in fast:
                # The records of the timing wrappers whose templates are known, in C; it
                # stops at any other record (taken below) and after _YIELD_NS of work.
                j = render(self, recs, i, lines, last + _YIELD_NS, consts)
                if j > i:
                    i = j
                    if clock() - last > _YIELD_NS:
                        time.sleep(0)
                        last = clock()
                    continue
            r = recs[i]
            i += 1
            out = r[0](*r[1:])
            if out and type(out[0]) is bytes:  # a fast path: serialized and counted already
                lines += out
            else:
                for ev in out:
                    name = ev["event"]
                    counts[name] = counts.get(name, 0) + 1
                    if name == "compute_execution" and ev.get("operation") != "model_forward":
                        f = ev.get("flops")
                        if f:
                            self.total_flops += f
                        d = ev.get("duration_us")
                        if d is not None and not ev.get("elementwise") and ev.get("operation") != "attention":
                            self.total_compute_us += d
                    elif name == "component_handoff":
                        self.component_flows += 1
                    lines.append(enc(ev).encode() + b"\n")
            # Give the GIL back every 0.2 ms of work: a model thread returning from a torch op
            # otherwise waits up to the interpreter's switch interval (5 ms) to get it. (Once
            # per record cost more than the records: sleep(0) is a system call.)
            if clock() - last > _YIELD_NS:
                time.sleep(0)
                last = clock()
        if self._w_long_site is not None:
            self._long[0] = self._w_long_site
            self._long_ns = self._w_long if self._w_long_site.kind == "linear" else 0
        if lines:
            self._sink.write(lines)
            self.events_written += len(lines)

    def _summary(self) -> Dict[str, Any]:
        ev: Dict[str, Any] = {
            "event": "resource_session_summary",
            "resource_id": f"session_{self.session_id}_summary",
            "timestamp": _now_us(),
            "iso_timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            "session_id": self.session_id,
            "level": self.level.name,
            "forwards": self.forwards,
            "parameter_bytes": self._param_bytes,
            "total_compute_flops": self.total_flops,
            "total_compute_gflops": self.total_flops / 1e9,
            "total_compute_us": self.total_compute_us,
            "component_flows": self.component_flows,
            "events": dict(self.counts),
            "monitor_hook_us": self.hook_ns / 1000.0,
            "monitor_writer_cpu_us": self.writer_cpu_ns / 1000.0,
        }
        if self._cuda:
            import torch

            peak = max(self._peak_device, torch.cuda.max_memory_allocated())
            ev["total_memory_bytes"] = peak
            ev["total_memory_source"] = "torch.cuda.max_memory_allocated"
        else:
            peak = _peak_rss()
            ev["total_memory_bytes"] = peak
            ev["total_memory_source"] = "proc_self_status_VmHWM"
        ev["total_memory_mb"] = peak / (1 << 20) if peak is not None else None
        return ev


_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: The writer thread gives the GIL back after this much work (ns).
_YIELD_NS = 200_000

#: What a template's changing fields are called in its %-format (``_compile``): the value
#: of each is formatted with ``%s`` (ints and finite floats read the same as in JSON).
_SLOTS = {"timestamp": "ts", "step": "step", "forward": "fwd", "duration_us": "d",
          "throughput_gflops_per_s": "tf", "memory_throughput_gbps": "tb",
          "process_rss_bytes": "process_rss_bytes", "device_memory_allocated_bytes": "device_memory_allocated_bytes",
          "device_memory_reserved_bytes": "device_memory_reserved_bytes",
          "device_memory_peak_bytes": "device_memory_peak_bytes"}
#: The changing fields of a ``kv_cache_update`` (every one but its names and types).
_KV_SLOTS = dict(_SLOTS, cache_length_tokens="len", previous_length_tokens="prev", new_tokens="new",
                 reused_tokens="reused", cache_hit_ratio="hit", cache_bytes="cb", cache_mb="cmb",
                 bytes_per_token="bpt", growth_bytes="grow", key_shape="ks", value_shape="vs")
#: The changing fields of a model_forward event: also its FLOPs (the pass's sum) and the
#: bytes a capture wrote.
_FORWARD_SLOTS = dict(_SLOTS, flops="fl", compute_intensity_gflops="gf", capture_bytes="cap")
#: A host memory reading's fields (``_mem_now`` on the CPU).
_RSS_KEYS = ("process_rss_bytes", "memory_source")
#: ``memory_pressure`` words as JSON.
_PRESSURE_JSON = {None: "null", "low": '"low"', "medium": '"medium"', "high": '"high"'}
#: Changing fields written as JSON strings.
_QUOTED_SLOTS = {"memory_address": "addr"}


def _compile(ev: Dict[str, Any], seq_slot: str, slots: Optional[Dict[str, str]] = None) -> str:
    """``ev`` serialized as the writer loop would, as a %-format string whose changing
    fields are ``%(slot)s``: ``_SLOTS``, ``_QUOTED_SLOTS`` and the trailing
    ``{timestamp}_{seq}`` of ``resource_id`` (``seq_slot``) and ``compute_resource_id``
    (``seq``). The line ends in ``\\n``."""
    enc = _ENCODER.encode
    slots = _SLOTS if slots is None else slots
    parts = []
    for k, v in ev.items():
        head = enc(k) + ":"
        if k in slots:
            parts.append(head + "%(" + slots[k] + ")s")
        elif k in _QUOTED_SLOTS:
            parts.append(head + "\"%(" + _QUOTED_SLOTS[k] + ")s\"")
        elif k in ("resource_id", "compute_resource_id"):
            prefix = v.rsplit("_", 2)[0] + "_"
            slot = seq_slot if k == "resource_id" else "seq"
            parts.append((head + enc(prefix)[:-1]).replace("%", "%%") + "%(ts)s_%(" + slot + ")s\"")
        else:
            parts.append((head + enc(v)).replace("%", "%%"))
    return "{" + ",".join(parts) + "}\n"


_ITEMSIZE: Dict[Any, int] = {}


#: The slots the C writer fills (``_speedups.render``), by their number there (none without it).
_C_SLOTS = {name: i for i, name in enumerate(_SLOT_NAMES)}
_FORMAT_RE = re.compile(r"%\((\w+)\)s|%%")


def _program(fmt: str) -> Optional[Tuple[bytes, bytes]]:
    """A template (``_compile``) as the C writer runs it: ``(text, ops)`` — its literal text
    as UTF-8 in one piece, and per op three bytes: how many bytes of text come next
    (little-endian u16), then the number of the slot that follows (255: none). None when it
    has a slot the C writer does not fill (any, where the extension is missing)."""
    text = bytearray()
    ops = bytearray()
    lit: List[str] = []
    pos = 0

    def op(code: int) -> None:
        chunk = "".join(lit).encode()
        lit.clear()
        while len(chunk) > 0xFFFF:
            ops.extend((0xFF, 0xFF, 255))
            text.extend(chunk[:0xFFFF])
            chunk = chunk[0xFFFF:]
        ops.extend((len(chunk) & 0xFF, len(chunk) >> 8, code))
        text.extend(chunk)

    for m in _FORMAT_RE.finditer(fmt):
        lit.append(fmt[pos:m.start()])
        pos = m.end()
        if m.group(0) == "%%":
            lit.append("%")
            continue
        code = _C_SLOTS.get(m.group(1))
        if code is None:
            return None
        op(code)
    lit.append(fmt[pos:])
    op(255)
    return bytes(text), bytes(ops)


def _jlist(shape: Sequence[int]) -> str:
    """A shape as the JSON list the encoder writes."""
    return "[" + ",".join(map(str, shape)) + "]"

def _kv_len_of(shape: Any) -> int:
    """``_kv_len`` of a tensor of this shape (None: no tensor)."""
    if shape is None or len(shape) < 2 or 0 in shape:
        return 0
    return int(shape[-2])


#: Shapes the writer has seen, as JSON lists, with their element counts (``_shape_info``).
_SHAPES: Dict[Any, Tuple[str, int]] = {}


def _shape_info(shape: Sequence[int]) -> Tuple[str, int]:
    """``_jlist`` and ``_numel`` of a shape, kept: a cache's shape is the same in every layer
    of a decoding step."""
    got = _SHAPES.get(shape)
    if got is None:
        if len(_SHAPES) >= _MAX_TEMPLATES:
            _SHAPES.clear()
        got = _SHAPES[shape] = (_jlist(shape), _numel(shape))
    return got


def _itemsize(dtype: Any) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        import torch

        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


_SLOT_RE = re.compile(r"%%|%\((\w+)\)s")


def _positional(fmt: str, names: Sequence[str]) -> str:
    """A ``_compile`` template with its named slots made positional (``%s``): formatting a
    tuple costs less than building a dict. ``names`` are the slots in the order the caller
    gives their values; a template whose slots differ (a builder changed) is an error."""
    found: List[str] = []

    def sub(m: "re.Match[str]") -> str:
        if m.group(1) is None:
            return "%%"
        found.append(m.group(1))
        return "%s"

    out = _SLOT_RE.sub(sub, fmt)
    if found != list(names):
        raise RuntimeError(f"template slots {found} are not the expected {list(names)}")
    return out


#: Templates kept per monitor (a few per hooked module and input shape; about 1 KiB each).
_MAX_TEMPLATES = 4096


def _meta(shape: Any, dtype: Any, is_cuda: bool = False) -> Optional[Tuple[Any, Any, int, bool]]:
    """``_tm`` of a tensor from its shape and dtype (what the hooks record)."""
    if shape is None:
        return None
    size = _ITEMSIZE.get(dtype)
    if size is None:
        import torch

        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return (shape, dtype, _numel(shape) * size, is_cuda)


def _tm(t: "torch.Tensor") -> Tuple[Tuple[int, ...], Any, int, bool]:
    """What an event needs of a tensor, taken at once (no reference to the tensor is kept)."""
    return (tuple(t.shape), t.dtype, t.numel() * t.element_size(), t.is_cuda)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dname(dtype: Any) -> str:
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def _short(dtype: Any) -> str:
    n = _dname(dtype)
    return _DTYPE_SHORT.get(n, n)


def _tdesc(name: str, m: Any) -> Dict[str, Any]:
    if m is None:
        return {"name": name, "shape": None, "dtype": None}
    return {"name": name, "shape": list(m[0]), "dtype": _dname(m[1])}


class _Writer:
    """The thread that turns recorded values into JSON lines and writes them, so the
    model's thread only records. Errors are kept and raised at the next flush or close."""

    def __init__(self, monitor: "ResourceMonitor") -> None:
        import queue

        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._mon = monitor
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
                self._mon._write_batch(*item)
            except BaseException as e:  # kept for the model's thread; never dropped silently
                log.error("llm_instrumentation: writing resource events failed: %s", e)
                if self.error is None:
                    self.error = e


def _derive(ev: Dict[str, Any]) -> None:
    """Throughputs that follow from a measured duration and a computed size."""
    d = ev.get("duration_us")
    if not d or d <= 0:
        return
    f = ev.get("flops")
    if f:
        ev["throughput_gflops_per_s"] = f / (d * 1e3)
    b = ev.get("bytes_accessed")
    if b:
        ev["memory_throughput_gbps"] = b / (d * 1e3)
    n = ev.get("data_size_bytes")
    if n is not None and ev.get("event") == "component_handoff":
        ev["transfer_bandwidth_gbps"] = n / (d * 1e3)


def _elementwise_table() -> Dict[Any, str]:
    import torch
    import torch.nn.functional as F

    T = torch.Tensor
    table = {
        torch.add: "add", T.add: "add", T.__add__: "add", T.__radd__: "add", T.__iadd__: "add", T.add_: "add",
        torch.sub: "sub", T.sub: "sub", T.__sub__: "sub", T.__rsub__: "sub",
        torch.mul: "mul", T.mul: "mul", T.__mul__: "mul", T.__rmul__: "mul", T.__imul__: "mul", T.mul_: "mul",
        torch.div: "div", T.div: "div", T.__truediv__: "div", T.__rtruediv__: "div",
        torch.pow: "pow", T.pow: "pow", T.__pow__: "pow",
        torch.rsqrt: "rsqrt", T.rsqrt: "rsqrt", torch.exp: "exp", T.exp: "exp", torch.neg: "neg", T.neg: "neg",
        T.__neg__: "neg", torch.sigmoid: "sigmoid", torch.tanh: "tanh",
        F.silu: "silu", F.gelu: "gelu", F.relu: "relu", torch.cos: "cos", torch.sin: "sin",
    }
    return table


def _make_mode_class() -> Any:
    from torch.overrides import TorchFunctionMode

    class ElementwiseMode(TorchFunctionMode):
        """Times element-wise torch functions called inside the model (VERBOSE)."""

        def __init__(self, monitor: ResourceMonitor) -> None:
            super().__init__()
            self.monitor = monitor
            self.table = _elementwise_table()

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            op = self.table.get(func)
            if op is None:
                return func(*args, **kwargs)
            t0 = time.perf_counter_ns()
            out = func(*args, **kwargs)
            self.monitor._elementwise(op, out, time.perf_counter_ns() - t0)
            return out

    return ElementwiseMode


_MODE_CLASS: Any = None


def _ElementwiseMode(monitor: ResourceMonitor) -> Any:
    global _MODE_CLASS
    if _MODE_CLASS is None:
        _MODE_CLASS = _make_mode_class()
    return _MODE_CLASS(monitor)


@contextlib.contextmanager
def monitor_resources(model: "nn.Module", level: Union[ResourceLevel, str, int, None] = None,
                      path: Union[str, os.PathLike, None] = None, **kwargs: Any) -> Iterator[ResourceMonitor]:
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
