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

from .config import AUTO_RING_FORWARDS, AUTO_RING_MIN_BYTES, AUTO_RING_TOKENS, DEFAULT_RING_BYTES

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

#: Config attributes that give a model's width and its context length, in the order tried
#: (transformers' names across architectures).
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def _config_int(model: "nn.Module", keys: Sequence[str]) -> Optional[int]:
    cfg = getattr(model, "config", None)
    for k in keys:
        v = getattr(cfg, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def config_width(model: "nn.Module") -> Optional[int]:
    """The hidden size its config states (transformers' names across architectures), or None."""
    return _config_int(model, _WIDTH_KEYS)


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
        return _config_int(model, ("vocab_size",)) or hidden
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
    context = _config_int(model, _CONTEXT_KEYS)
    tokens = min(context, AUTO_RING_TOKENS) if context is not None else AUTO_RING_TOKENS
    want = per_token * elem * tokens * AUTO_RING_FORWARDS
    ring = min(max(want, AUTO_RING_MIN_BYTES), DEFAULT_RING_BYTES)
    ring = (ring + 4095) // 4096 * 4096
    bound = (f", raised to the {AUTO_RING_MIN_BYTES}-byte floor" if want < AUTO_RING_MIN_BYTES
             else f", lowered to the {DEFAULT_RING_BYTES}-byte ceiling" if want > DEFAULT_RING_BYTES else "")
    how = (f"{len(modules)} modules, {per_token} values per token x {elem} B x {tokens} tokens x "
           f"{AUTO_RING_FORWARDS} forwards = {want} bytes{bound}")
    return ring, how
