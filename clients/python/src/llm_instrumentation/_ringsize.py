"""The default ring of a capture, sized from what it will write (docs/DEPLOY.md, "Rings and
the memory budget").

A capture whose config leaves ``max_memory_gb`` unset gets a ring of
:data:`~.config.AUTO_RING_FORWARDS` forward passes of :data:`~.config.AUTO_RING_TOKENS`
tokens (fewer when the model's context is shorter), each token writing the hooked modules'
output widths times the model's element size — known from the parameter shapes before the
first forward, because the ring is created and sent in ``OPEN`` when the capture starts.
The result lies between :data:`~.config.AUTO_RING_MIN_BYTES` and
:data:`~.config.DEFAULT_RING_BYTES` (the ring every capture got before). A pass larger than
the ring still goes through whole: a record over a quarter of the ring is written in parts
that wait for ring space (lossless under ``backpressure="block"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from ._anatomy import config_int, config_width, describe_model
from .config import (AUTO_RING_FORWARDS, AUTO_RING_MIN_BYTES, AUTO_RING_TOKENS, DEFAULT_RING_BYTES, HookGranularity,
                     InstrumentationConfig)

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

#: Config attributes that give a model's context length, in the order tried (transformers'
#: names across architectures; the width's are ``_anatomy.WIDTH_KEYS``).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def _model_width(model: "nn.Module") -> Optional[int]:
    """The model's hidden size: its config's, else the first embedding's width."""
    import torch.nn as nn

    w = config_width(model)
    if w is not None:
        return w
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return int(m.embedding_dim)
    return None


def _module_width(model: "nn.Module", module: "nn.Module", name: str, hidden: int) -> int:
    """Output features per token of one hooked module: a linear layer's (``out_features``,
    or GPT-2's ``Conv1D.nf``), an embedding's, the root's logits (``vocab_size``), else the
    model's hidden size (a block, an attention or an MLP returns the residual width)."""
    import torch.nn as nn

    if not name:
        return config_int(model, ("vocab_size",)) or hidden
    for attr in ("out_features", "nf"):
        v = getattr(module, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    if isinstance(module, nn.Embedding):
        return int(module.embedding_dim)
    return hidden


def element_size(model: "nn.Module") -> int:
    """Bytes per value of the model's first floating-point parameter (4 without one)."""
    for p in model.parameters():
        if p.is_floating_point():
            return int(p.element_size())
    return 4


def auto_ring_size(model: "nn.Module", modules: Sequence[str]) -> Tuple[int, str]:
    """The default ring of a capture of ``modules`` of ``model`` (module docstring).

    Args:
        model: the model.
        modules: the hooked module names.

    Returns:
        ``(ring_size, how)``: bytes, a multiple of 4096, and how they were reached (for the
        log and the stream metadata).

    Example:
        >>> auto_ring_size(tiny_gpt2, ["transformer.h.0", "transformer.h.1"])  # doctest: +SKIP
        (4194304, '2 modules, 64 values per token x 4 B x 1024 tokens x 4 forwards = 1048576 bytes, raised to the 4194304-byte floor')
    """
    hidden = _model_width(model)
    if hidden is None:
        return DEFAULT_RING_BYTES, "the model's width is unknown: the largest default ring"
    mods = dict(model.named_modules())
    per_token = sum(_module_width(model, mods[n], n, hidden) for n in modules if n in mods)
    elem = element_size(model)
    context = config_int(model, _CONTEXT_KEYS)
    tokens = min(context, AUTO_RING_TOKENS) if context is not None else AUTO_RING_TOKENS
    want = per_token * elem * tokens * AUTO_RING_FORWARDS
    ring = min(max(want, AUTO_RING_MIN_BYTES), DEFAULT_RING_BYTES)
    ring = (ring + 4095) // 4096 * 4096
    bound = (f", raised to the {AUTO_RING_MIN_BYTES}-byte floor" if want < AUTO_RING_MIN_BYTES
             else f", lowered to the {DEFAULT_RING_BYTES}-byte ceiling" if want > DEFAULT_RING_BYTES else "")
    how = (f"{len(modules)} modules, {per_token} values per token x {elem} B x {tokens} tokens x "
           f"{AUTO_RING_FORWARDS} forwards = {want} bytes{bound}")
    return ring, how


def config_for_model(
    model: "nn.Module",
    target_throughput_gbps: Optional[float] = None,
    max_memory_gb: Optional[float] = None,
    granularity: HookGranularity = HookGranularity.FULL_TENSOR,
) -> InstrumentationConfig:
    """Build a config sized for ``model``.

    The ring is sized to hold at least 8 block outputs of a 2048-token sequence at the
    model's hidden size in its parameter dtype (min 64 MiB, max 1 GiB) unless
    ``max_memory_gb`` is given; the codec is lz4 (a named codec: a throughput target lz4
    cannot sustain is noted by :meth:`InstrumentationConfig.transport_plan`, not acted on).

    Args:
        model: the model to capture.
        target_throughput_gbps: optional capture-rate target.
        max_memory_gb: ring size override.
        granularity: hook granularity.

    Returns:
        an :class:`InstrumentationConfig`.

    Example:
        >>> cfg = config_for_model(model, target_throughput_gbps=1.0)  # doctest: +SKIP
    """
    if max_memory_gb is None:
        arch = describe_model(model)
        hidden = arch["hidden_size"] or 4096
        need = 8 * 2048 * hidden * element_size(model)
        need = min(max(need, 64 << 20), 1 << 30)
        max_memory_gb = need / (1 << 30)
    return InstrumentationConfig(
        granularity=granularity,
        compression_algorithm="lz4",
        target_throughput_gbps=target_throughput_gbps,
        max_memory_gb=max_memory_gb,
    )
