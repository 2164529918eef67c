"""The events, as dicts, and the one Python place each of their figures is computed.

The builders (:class:`EventBuilder`) make every event the general way; the writer's
templates (``lines.py``) are made from what they make, and fill in the changing values with
the figure functions below — the same functions, so both paths write the same numbers.
The C writer (``_native.c``) mirrors the figures of the records it renders; the golden files
(``testdata/resource_events``) and ``tests/test_resources_c.py`` hold the two to the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .._cuda import wait_event
from .sites import FLOPS_PER_ELEMENT, Site
from .state import WriterState
from .system import pressure_word

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MIB", "EventBuilder", "Meta", "attention_flops", "attention_tokens", "cuda_duration_us", "dname",
           "kv_figures", "linear_flops", "meta", "numel", "per_us", "short_dtype", "tensor_meta"]

#: What an event needs of a tensor: (shape, dtype, bytes, on a GPU).
Meta = Tuple[Any, Any, int, bool]
#: An event's context: its site, timestamp (µs), step and forward pass.
Ctx = Tuple[Site, int, int, int]

MIB = 1 << 20
_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}
_ITEMSIZE: Dict[Any, int] = {}


# ----- tensors -----------------------------------------------------------------------------------

def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def itemsize(dtype: Any) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        import torch

        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def meta(shape: Any, dtype: Any, is_cuda: bool = False) -> Optional[Meta]:
    """What an event needs of a tensor, from the shape and dtype a wrapper recorded."""
    if shape is None:
        return None
    return (shape, dtype, numel(shape) * itemsize(dtype), is_cuda)


def tensor_meta(t: "torch.Tensor") -> Meta:
    """What an event needs of a tensor, taken at once (no reference to the tensor is kept)."""
    return (tuple(t.shape), t.dtype, t.numel() * t.element_size(), t.is_cuda)


def dname(dtype: Any) -> str:
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def short_dtype(dtype: Any) -> str:
    n = dname(dtype)
    return _DTYPE_SHORT.get(n, n)


def tdesc(name: str, m: Optional[Meta]) -> Dict[str, Any]:
    if m is None:
        return {"name": name, "shape": None, "dtype": None}
    return {"name": name, "shape": list(m[0]), "dtype": dname(m[1])}


# ----- figures -----------------------------------------------------------------------------------

def per_us(amount: float, d_us: float) -> float:
    """A rate in G/s of ``amount`` (FLOPs or bytes) over ``d_us`` µs."""
    return amount / (d_us * 1e3)


def linear_flops(out_shape: Sequence[int], in_f: int, out_f: int) -> int:
    """``2·M·K·N`` of a Linear: M rows (output elements / out_features), K in, N out; bias
    adds not counted."""
    return 2 * (numel(out_shape) // out_f if out_f else 0) * in_f * out_f


def attention_tokens(xs: Any, seq_first: bool) -> Tuple[int, int]:
    """Query length and batch of an attention's input shape (``nn.MultiheadAttention``
    without ``batch_first`` takes (seq, batch, embed))."""
    if xs is None:
        return 0, 1
    n = len(xs)
    q_len = xs[0 if seq_first else -2] if n >= 2 else 0
    batch = xs[1 if seq_first else 0] if n >= 3 else 1
    return q_len, batch


def attention_flops(batch: int, heads: Optional[int], q_len: int, kv_len: int, head_dim: Optional[int]) -> Optional[int]:
    """QKᵀ and the weighted sum of V, dense (a causal kernel may skip the masked half): the
    q/k/v/o projections are their own ``mul_mat`` events. None: head layout unknown."""
    return 4 * batch * heads * q_len * kv_len * head_dim if heads and head_dim else None


def kv_figures(length: int, before: int, nbytes: int, prev_bytes: Optional[int]) -> Tuple[float, float, int]:
    """A cache layer's hit ratio, bytes per token and growth in bytes since its previous
    update (a cache that starts again — a new sequence — grows from nothing)."""
    grew_from = prev_bytes if prev_bytes is not None and before > 0 else 0
    if length:
        return before / length, nbytes / length, nbytes - grew_from
    return 0.0, 0.0, nbytes - grew_from


def derive(ev: Dict[str, Any]) -> None:
    """Throughputs that follow from a measured duration and a computed size."""
    d = ev.get("duration_us")
    if not d or d <= 0:
        return
    f = ev.get("flops")
    if f:
        ev["throughput_gflops_per_s"] = per_us(f, d)
    b = ev.get("bytes_accessed")
    if b:
        ev["memory_throughput_gbps"] = per_us(b, d)
    n = ev.get("data_size_bytes")
    if n is not None and ev.get("event") == "component_handoff":
        ev["transfer_bandwidth_gbps"] = per_us(n, d)


def cuda_duration_us(pair: Tuple[Any, Any]) -> float:
    """A CUDA event pair's measured duration in µs, once its end event has completed (waited
    for here): what an event of a CUDA-timed record says, whichever path writes it."""
    start, end = pair
    wait_event(end)
    return start.elapsed_time(end) * 1000.0


def set_timing(ev: Dict[str, Any], timing: Any) -> None:
    """A measured duration: ns on the host clock (an int), a CUDA event pair (waited for here)
    or the µs such a pair measured (a float: ``lines.timing_us`` resolved it to make a
    template, or found it not finite)."""
    if type(timing) is int:
        ev["duration_us"] = timing / 1000.0
        ev["duration_source"] = "perf_counter"
    else:
        ev["duration_us"] = timing if type(timing) is float else cuda_duration_us(timing)
        ev["duration_source"] = "cuda_event"
    derive(ev)


class EventBuilder:
    """Makes the events of the records, as dicts (writer thread)."""

    def __init__(self, state: WriterState) -> None:
        self.state = state

    def base(self, event: str, ctx: Ctx, word: str) -> Dict[str, Any]:
        site, ts, step, fwd = ctx
        st = self.state
        st.seq += 1
        layer = site.layer_id
        return {
            "event": event,
            "resource_id": f"{'gpu' if st.cuda else 'cpu'}_{word}_layer_"
                           f"{layer if layer is not None else 'none'}_{site.leaf}_{ts}_{st.seq}",
            "timestamp": ts,
            "session_id": st.session_id,
            "step": step,
            "forward": fwd,
            "layer_id": layer,
            "component_type": site.component,
            "module": site.name,
        }

    def linear(self, ctx: Ctx, timing: Any, xm: Optional[Meta], om: Meta, flops: int,
               static: Any) -> List[Dict[str, Any]]:
        site = ctx[0]
        wshape, wdtype, wbytes, in_f, out_f = static
        ev = self.base("compute_execution", ctx, "compute")
        ev["operation"] = "mul_mat"
        ev["input_tensors"] = [tdesc("input", xm), {"name": "weight", "shape": list(wshape), "dtype": dname(wdtype)}]
        ev["output_shape"] = list(om[0])
        ev["flops"] = flops
        ev["compute_intensity_gflops"] = flops / 1e9
        ev["flops_source"] = "computed_from_shapes"
        ev["bytes_accessed"] = (xm[2] if xm is not None else 0) + wbytes + om[2]
        set_timing(ev, timing)
        out = [ev]
        if site.mlp_op is not None:
            op = site.mlp_op
            m = self.base("mlp_operation", ctx, "mlp")
            in_bytes = xm[2] if xm is not None else 0
            m["mlp_operation"] = op
            m["weight_shape"] = list(wshape)
            m["activation_shape"] = list(om[0])
            m["intermediate_dim"] = in_f if op == "down_proj" else out_f
            m["intermediate_size_bytes"] = in_bytes if op == "down_proj" else om[2]
            m["intermediate_size_mb"] = m["intermediate_size_bytes"] / MIB
            # Input and output of the projection are both live while it runs.
            m["activation_memory_peak_bytes"] = in_bytes + om[2]
            m["activation_memory_peak_mb"] = (in_bytes + om[2]) / MIB
            m["activation_memory_peak_source"] = "computed_input_plus_output"
            m["activation_function"] = site.activation
            m["flops"] = flops
            m["duration_us"] = ev.get("duration_us")
            m["duration_source"] = ev.get("duration_source")
            m["compute_resource_id"] = ev["resource_id"]
            out.append(m)
        return out

    def attention(self, ctx: Ctx, timing: Any, xm: Optional[Meta], om: Optional[Meta], q_len: int, kv_len: int,
                  km: Optional[Meta], vm: Optional[Meta], flops: Optional[int]) -> List[Dict[str, Any]]:
        ev = self.base("compute_execution", ctx, "compute")
        ev["operation"] = "attention"
        ev["input_tensors"] = [tdesc("hidden_states", xm)]
        if km is not None:
            ev["input_tensors"] += [tdesc("key_cache", km), tdesc("value_cache", vm)]
        if om is not None:
            ev["output_shape"] = list(om[0])
        ev["query_tokens"] = q_len
        ev["key_tokens"] = kv_len
        if flops is not None:
            ev["flops"] = flops
            ev["compute_intensity_gflops"] = flops / 1e9
            ev["flops_source"] = "computed_from_shapes"
            ev["flops_covers"] = "scores_and_weighted_sum_dense"
        else:
            ev["flops"] = None
            ev["flops_source"] = "unknown_head_layout"
        set_timing(ev, timing)
        return [ev]

    def kv(self, ctx: Ctx, idx: int, km: Meta, vm: Optional[Meta], before: int) -> List[Dict[str, Any]]:
        ev = self.base("kv_cache_update", ctx, "kv")
        shape, length, nbytes, hit, bpt, growth = self.kv_step(idx, km, vm, before)
        ev["cache_length_tokens"] = length
        ev["previous_length_tokens"] = before
        ev["new_tokens"] = length - before
        ev["reused_tokens"] = before
        ev["cache_hit_ratio"] = hit
        ev["cache_bytes"] = nbytes
        ev["cache_mb"] = nbytes / MIB
        ev["bytes_per_token"] = bpt
        ev["growth_bytes"] = growth
        ev["key_shape"] = list(shape)
        ev["value_shape"] = list(vm[0]) if vm is not None else None
        ev["precision"] = short_dtype(km[1])
        ev["memory_type"] = "vram" if km[3] else "host"
        ev["size_source"] = "tensor_nbytes"
        return [ev]

    def kv_step(self, idx: int, km: Meta, vm: Optional[Meta], before: int) -> Tuple[Any, int, int, float, float, int]:
        """Layer ``idx``'s cache after this pass: key shape, length in tokens, bytes, hit
        ratio, bytes per token and growth (the bytes are remembered for the next pass)."""
        shape = km[0]
        length = int(shape[-2]) if len(shape) >= 2 else 0
        nbytes = km[2] + (vm[2] if vm is not None else 0)
        kvb = self.state.kv_bytes
        hit, bpt, growth = kv_figures(length, before, nbytes, kvb.get(idx))
        kvb[idx] = nbytes
        return shape, length, nbytes, hit, bpt, growth

    def module(self, ctx: Ctx, timing: Any, xm: Optional[Meta], om: Meta, cls: str) -> List[Dict[str, Any]]:
        site = ctx[0]
        ev = self.base("compute_execution", ctx, "compute")
        kind = site.kind
        ev["operation"] = kind if kind in ("norm", "activation", "embedding") else cls
        if site.activation and kind == "activation":
            ev["activation_function"] = site.activation
        ev["input_tensors"] = [tdesc("input", xm)]
        ev["output_shape"] = list(om[0])
        if kind in ("norm", "activation"):
            fpe = site.flops_per_element or 1
            flops = fpe * numel(om[0])
            ev["flops"] = flops
            ev["compute_intensity_gflops"] = flops / 1e9
            ev["flops_source"] = "computed_from_shapes"
            ev["flops_per_element"] = fpe
            ev["bytes_accessed"] = (xm[2] if xm is not None else 0) + om[2]
        else:
            ev["flops"] = 0
            ev["flops_source"] = "not_counted"
            ev["bytes_accessed"] = om[2]
        set_timing(ev, timing)
        return [ev]

    def forward(self, ctx: Ctx, timing: Any, inm: Any, out_shape: Any, cap: Optional[int], mem: Dict[str, Any],
                sm: Optional[float]) -> List[Dict[str, Any]]:
        st = self.state
        flops = st.pass_flops
        ev = self.base("compute_execution", ctx, "compute")
        ev["operation"] = "model_forward"
        if inm is not None:
            ev["input_tensors"] = [tdesc("input", inm)]
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
            st.peak_device = max(st.peak_device, mem["device_memory_peak_bytes"])
        if sm is not None:
            ev["sm_utilization_percent"] = sm
            ev["sm_utilization_source"] = "nvml_device_sample"
        set_timing(ev, timing)
        return [ev]

    def alloc(self, ctx: Ctx, kind: str, size: int, shape: Any, dtype: Any, is_cuda: bool, ptr: int,
              mem: Dict[str, Any]) -> List[Dict[str, Any]]:
        ev = self.base("memory_allocation", ctx, "memory")
        ev["allocation_kind"] = kind
        ev["allocation_size_bytes"] = size
        ev["allocation_size_mb"] = size / MIB
        ev["memory_type"] = "vram" if is_cuda else "host"
        ev["tensor_shape"] = list(shape)
        ev["precision"] = short_dtype(dtype)
        ev["memory_address"] = hex(ptr)
        ev["size_source"] = "tensor_nbytes"
        ev.update(mem)
        return [ev]

    def handoff(self, ctx: Ctx, timing: Any, tm: Meta, frac: Optional[float], src: str) -> List[Dict[str, Any]]:
        ev = self.base("component_handoff", ctx, "flow")
        ev["resource_id"] = ev["resource_id"].replace(f"_{ctx[0].leaf}_", "_attention_to_mlp_", 1)
        ev["from_component"] = "attention"
        ev["to_component"] = "mlp"
        ev["data_size_bytes"] = tm[2]
        ev["data_size_mb"] = tm[2] / MIB
        ev["tensor_shape"] = list(tm[0])
        # The gap holds the residual add and the post-attention norm; on one device nothing
        # is copied, so this is the effective rate of the handoff, not a link bandwidth.
        ev["bandwidth_source"] = "bytes_over_measured_gap"
        set_timing(ev, timing)
        ev["memory_pressure"] = pressure_word(frac)
        ev["memory_used_fraction"] = frac
        ev["memory_pressure_source"] = src
        return [ev]

    def elementwise(self, ctx: Ctx, op: str, om: Meta, dur_ns: int) -> List[Dict[str, Any]]:
        ev = self.base("compute_execution", ctx, "compute")
        ev["operation"] = op
        ev["elementwise"] = True
        ev["output_shape"] = list(om[0])
        flops = numel(om[0]) * FLOPS_PER_ELEMENT["elementwise"]
        self.state.pass_flops += flops
        ev["flops"] = flops
        ev["compute_intensity_gflops"] = flops / 1e9
        ev["flops_source"] = "computed_from_shapes"
        ev["flops_per_element"] = FLOPS_PER_ELEMENT["elementwise"]
        ev["bytes_accessed"] = om[2]
        ev["duration_us"] = dur_ns / 1000.0
        # On a GPU this is the host time of the launch: a CUDA event pair per element-wise
        # op would cost more than the op.
        ev["duration_source"] = "perf_counter_launch_only" if om[3] else "perf_counter"
        derive(ev)
        return [ev]
