"""Reading a layer's keys and values out of the KV caches Hugging Face models are given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["cache_from", "cache_layer", "kv_len", "kv_len_of"]

#: The keyword arguments an attention module's cache comes in, by transformers version.
CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def cache_from(kwargs: Dict[str, Any]) -> Any:
    """The cache an attention module was called with (None: none)."""
    for key in CACHE_KWARGS:
        v = kwargs.get(key)
        if v is not None:
            return v
    return None


def cache_layer(cache: Any, idx: int) -> Tuple[Optional["torch.Tensor"], Optional["torch.Tensor"]]:
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


def kv_len(k: Optional["torch.Tensor"]) -> int:
    """A cached key tensor's length in tokens (0: none, or empty)."""
    if k is None or k.dim() < 2 or k.numel() == 0:
        return 0
    return int(k.shape[-2])


def kv_len_of(shape: Any) -> int:
    """``kv_len`` of a tensor of this shape (None: no tensor)."""
    if shape is None or len(shape) < 2 or 0 in shape:
        return 0
    return int(shape[-2])
