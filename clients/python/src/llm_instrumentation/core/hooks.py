"""1.3.1's hook API: :class:`HookGranularity`, :class:`HookConfig`, the
:class:`TensorProcessor` protocol and :class:`OptimizedHookManager`.

A capture does not need these (``capture_activations`` places its own hooks); they serve code
that drove 1.3.1's hook manager directly with its own processor. Unlike 1.3.1's, the manager
reaches nested modules (``model.layers.3.self_attn``; 1.3.1 hooked only the root and its
direct children) and hands every tensor of a tuple / ``ModelOutput`` output to the processor.
A model without recognised decoder blocks gets 1.3.1's choice, with a warning: the root
(layer name ``""``, as in 1.3.1) and its direct children, or for attention / MLP
granularity the children whose names contain ``attn`` / ``mlp``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol

from ..config import HookGranularity

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

__all__ = ["HookGranularity", "HookConfig", "TensorProcessor", "HookManager", "OptimizedHookManager"]


@dataclass
class HookConfig:
    """What :class:`OptimizedHookManager` hooks.

    Args:
        granularity: which modules (see :class:`HookGranularity`).
        sampling_rate: for ``SAMPLED_SLICES``, the share of sequence positions (dim 1) kept:
            every ``round(1 / sampling_rate)``-th position plus the last one (1.3.1 kept a
            random subset of elements, which cannot be tied back to positions).
        target_layers: exact ``named_modules()`` names to hook instead of the granularity's
            selection; a name the model lacks is an error.
        compression_enabled: kept for 1.3.1 code; compression is the capture's business.
        async_enabled: passed to the processor as ``metadata["sync"] = not async_enabled``;
            the processor is called inside the hook either way (as in 1.3.1).
    """

    granularity: HookGranularity
    sampling_rate: float = 1.0
    target_layers: Optional[List[str]] = None
    compression_enabled: bool = True
    async_enabled: bool = True

    def __post_init__(self) -> None:
        self.granularity = HookGranularity(self.granularity)
        r = self.sampling_rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {r!r}")


class TensorProcessor(Protocol):
    """Receives each hooked tensor: ``process(tensor, {"layer_name": ..., "sync": ...})``."""

    def process(self, tensor: "torch.Tensor", metadata: Dict[str, Any]) -> bytes: ...


class HookManager(abc.ABC):
    """Places and removes forward hooks on a model."""

    @abc.abstractmethod
    def attach_hooks(self, model: "nn.Module", config: HookConfig) -> None: ...

    @abc.abstractmethod
    def detach_hooks(self) -> None: ...

    @abc.abstractmethod
    def get_metrics(self) -> Dict[str, float]: ...


class OptimizedHookManager(HookManager):
    """Forward hooks that pass each module output to a :class:`TensorProcessor`.

    Example:
        >>> class Sizes:
        ...     def __init__(self): self.seen = []
        ...     def process(self, t, meta): self.seen.append((meta["layer_name"], tuple(t.shape))); return b""
        >>> mgr = OptimizedHookManager(Sizes())                                # doctest: +SKIP
        >>> mgr.attach_hooks(model, HookConfig(HookGranularity.MLP_ONLY))     # doctest: +SKIP
    """

    def __init__(self, tensor_processor: TensorProcessor) -> None:
        self.tensor_processor = tensor_processor
        self.hooks: List[Any] = []
        self.hooked_modules: List[str] = []
        self._tensors = 0
        self._bytes = 0

    def attach_hooks(self, model: "nn.Module", config: HookConfig) -> None:
        """Hook the modules ``config`` selects (nested modules included).

        Raises:
            ValueError: a ``target_layers`` name the model does not have, or nothing selected.
        """
        from .._hooks import falls_back_to_131, select_modules

        mods = dict(model.named_modules())
        if config.target_layers:
            missing = [n for n in config.target_layers if n not in mods]
            if missing:
                raise ValueError(f"target_layers {missing} are not modules of {type(model).__name__}")
            names = list(config.target_layers)
        else:
            names = select_modules(model, config.granularity)
        if not names and (config.target_layers or not falls_back_to_131(model, config.granularity)):
            raise ValueError(f"no module of {type(model).__name__} matches {config.granularity.name}")
        for name in names:
            self.hooks.append(mods[name].register_forward_hook(self._make_hook(name, config)))
            self.hooked_modules.append(name)

    def detach_hooks(self) -> None:
        """Remove every hook this manager placed."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
        self.hooked_modules = []

    def get_metrics(self) -> Dict[str, float]:
        """``{"hooks", "tensors", "bytes"}``: hooks placed, tensors and bytes handed on."""
        return {"hooks": float(len(self.hooks)), "tensors": float(self._tensors), "bytes": float(self._bytes)}

    def _make_hook(self, name: str, config: HookConfig) -> Callable[..., None]:
        from ..framework import sample_positions, split_output

        stride = max(1, round(1 / config.sampling_rate))
        sampled = config.granularity in (HookGranularity.SAMPLED_SLICES,) and stride > 1
        sync = not config.async_enabled

        def hook(module: Any, args: Any, output: Any) -> None:
            import torch

            with torch.no_grad():
                for rec_name, t in split_output(name, output):
                    t = t.detach()
                    meta: Dict[str, Any] = {"layer_name": rec_name, "sync": sync}
                    if sampled and t.dim() >= 2:
                        pos = sample_positions(int(t.shape[1]), stride)
                        t = t.index_select(1, torch.tensor(pos, dtype=torch.long, device=t.device))
                        meta["positions"] = pos
                    self._tensors += 1
                    self._bytes += t.numel() * t.element_size()
                    self.tensor_processor.process(t, meta)

        return hook
