"""Find a model's decoder blocks, attention and MLP modules, at any nesting depth; and
1.3.1's ``detect_model_architecture`` / ``create_optimized_config``.

The original 1.3.1 looked only at the root's direct children, so on a Hugging Face model it
found nothing but ``lm_head``. Here the decoder stack is the largest ``nn.ModuleList`` whose
children share one class (``model.layers``, ``transformer.h``, ``bert.encoder.layer``, ...),
and each block's attention / MLP are its direct children with the usual names
(:func:`describe_model`).
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Union, cast

from .._anatomy import ATTENTION_NAMES, MLP_NAMES  # the model anatomy's names, shared with resources/
from .._ringsize import config_width, element_size
from .._warnings import warn_caller
from ..config import HookGranularity, InstrumentationConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn


def _family(model: "nn.Module") -> str:
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if isinstance(mt, str) and mt:
        return mt
    return type(model).__name__.lower()


def _find_block_list(model: "nn.Module") -> Optional[str]:
    import torch.nn as nn

    best: Optional[str] = None
    best_key = (False, 0, 0)
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if len({type(c) for c in mod}) != 1:
            continue
        child_names = {n for n, _ in mod[0].named_children()}
        if not child_names:
            continue  # a list of leaf layers, not of blocks
        # Prefer lists whose items contain attention (decoder/encoder blocks, not MoE
        # experts), then longer lists, then shallower ones.
        key = (bool(child_names & set(ATTENTION_NAMES)), len(mod), -name.count("."))
        if best is None or key > best_key:
            best, best_key = name, key
    return best


def describe_model(model: "nn.Module") -> Dict[str, Any]:
    """Describe a model's layer structure (what the hooks are placed on).

    Args:
        model: any ``torch.nn.Module`` (Hugging Face or not).

    Returns:
        ``{"family", "model_class", "num_layers", "hidden_size", "layer_prefix", "blocks",
        "attention", "mlp"}`` where the last three are lists of ``named_modules()`` names.
        ``family`` is ``config.model_type`` when present (``"llama"``, ``"gpt2"``,
        ``"bert"``, ...), else the lowercase class name.

    Example:
        >>> arch = describe_model(model)      # doctest: +SKIP
        >>> arch["attention"][0]              # doctest: +SKIP
        'model.layers.0.self_attn'
    """
    prefix = _find_block_list(model)
    blocks: List[str] = []
    attention: List[str] = []
    mlp: List[str] = []
    if prefix is not None:
        # _find_block_list names a ModuleList (or Sequential): iterable, in order.
        blist = cast("nn.ModuleList", model.get_submodule(prefix))
        for i, block in enumerate(blist):
            bname = f"{prefix}.{i}" if prefix else str(i)
            blocks.append(bname)
            children = dict(block.named_children())
            for a in ATTENTION_NAMES:
                if a in children:
                    attention.append(f"{bname}.{a}")
                    break
            for m in MLP_NAMES:
                if m in children:
                    mlp.append(f"{bname}.{m}")
                    if m == "intermediate" and "output" in children:
                        # BERT-style: the MLP is intermediate (up + activation) then output.
                        mlp.append(f"{bname}.output")
                    break
    return {
        "family": _family(model),
        "model_class": type(model).__name__,
        "num_layers": len(blocks),
        "hidden_size": config_width(model),
        "layer_prefix": prefix,
        "blocks": blocks,
        "attention": attention,
        "mlp": mlp,
    }


def select_modules(
    model: "nn.Module",
    granularity: HookGranularity,
    patterns: Sequence[str] = (),
) -> List[str]:
    """Return the names of the modules to hook, in ``named_modules()`` order.

    Args:
        model: the model.
        granularity: the :class:`HookGranularity`.
        patterns: extra fnmatch patterns on module names, added for every granularity.

    Returns:
        module names (no duplicates); ``""`` is the root module. Raises ValueError when a
        pattern matches nothing.

    A model whose decoder blocks the detector does not find (no list of blocks, e.g. an
    ``nn.Sequential``), given no patterns, gets what 1.3.1 hooked on every model, with one
    warning naming the choice (:func:`falls_back_to_131`): for ``FULL_TENSOR`` /
    ``SAMPLED_SLICES`` the root and its direct children; for ``ATTENTION_ONLY`` /
    ``MLP_ONLY`` the direct children whose names contain ``attn`` / ``mlp`` — possibly none,
    as in 1.3.1, which then captured nothing.
    """
    g = HookGranularity(granularity)
    names = [n for n, _ in model.named_modules() if n]
    arch = describe_model(model)
    if falls_back_to_131(model, g, patterns):
        return _fallback_131(model, g)
    chosen: Set[str] = set()
    if g in (HookGranularity.FULL_TENSOR, HookGranularity.SAMPLED_SLICES):
        chosen.update(arch["blocks"], arch["attention"], arch["mlp"])
    elif g is HookGranularity.ATTENTION_ONLY:
        chosen.update(arch["attention"])
    elif g is HookGranularity.MLP_ONLY:
        chosen.update(arch["mlp"])
    elif g is HookGranularity.RESIDUAL_ONLY:
        chosen.update(arch["blocks"])
    elif g is HookGranularity.ALL_MODULES:
        chosen.update(names)
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"module pattern {pat!r} matches no module of {type(model).__name__}")
        chosen.update(hits)
    return [n for n in names if n in chosen]


#: What 1.3.1 hooked, by granularity, among the root and its direct children (its only
#: candidates): every one, or those whose name contains the word.
_FALLBACK_131 = {HookGranularity.FULL_TENSOR: None, HookGranularity.SAMPLED_SLICES: None,
                 HookGranularity.ATTENTION_ONLY: "attn", HookGranularity.MLP_ONLY: "mlp"}


def falls_back_to_131(model: "nn.Module", granularity: HookGranularity, patterns: Sequence[str] = ()) -> bool:
    """Whether :func:`select_modules` gives ``model`` 1.3.1's choice: no decoder blocks
    found, no patterns, and a granularity 1.3.1 had (``RESIDUAL_ONLY`` and ``ALL_MODULES``
    are ours)."""
    return not patterns and HookGranularity(granularity) in _FALLBACK_131 and describe_model(model)["layer_prefix"] is None


def _fallback_131(model: "nn.Module", g: HookGranularity) -> List[str]:
    """1.3.1's choice for a model without recognised blocks, with one warning naming it."""
    word = _FALLBACK_131[g]
    children = [n for n, _ in model.named_children()]
    chosen = [""] + children if word is None else [n for n in children if word in n]
    what = ", ".join(n or "<root>" for n in chosen) if chosen else \
        f"nothing (no direct child's name contains {word!r}; 1.3.1 captured nothing here either)"
    warn_caller(
        f"{type(model).__name__}: no decoder blocks found (no list of attention/MLP blocks); hooking what 1.3.1 "
        f"hooked for {g.name}: {what}. Pass module patterns (modules=[...]) to choose others")
    return chosen


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


_ARCH_KEYWORDS = ("gpt", "llama", "qwen", "bert")


def detect_model_architecture(model: "nn.Module") -> str:
    """The model's architecture name, as 1.3.1 computed it.

    ``config.model_type`` lowercased when the model has one; else the first of ``gpt``,
    ``llama``, ``qwen``, ``bert`` found in ``config.architectures[0]``, then in the class
    name; else ``"unknown"``. (An empty ``model_type`` counts as none; 1.3.1 returned ``""``.)

    Args:
        model: any ``torch.nn.Module``.

    Returns:
        the name. The layer structure the hooks use is :func:`describe_model`'s.

    Example:
        >>> detect_model_architecture(model)   # doctest: +SKIP
        'llama'
    """
    name = "unknown"
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt:
        name = str(mt).lower()
    else:
        archs = getattr(cfg, "architectures", None)
        if archs:
            first = str(archs[0]).lower()
            name = next((k for k in _ARCH_KEYWORDS if k in first), "unknown")
    if name == "unknown":
        cls = type(model).__name__.lower()
        name = next((k for k in _ARCH_KEYWORDS if k in cls), "unknown")
    return name


#: The purposes :func:`create_optimized_config` knows.
PURPOSES = ("interpretability", "debugging", "performance_analysis", "full_capture")


def create_optimized_config(model_arch: Union[str, "nn.Module"], purpose: str) -> InstrumentationConfig:
    """A preset chosen by purpose, as in 1.3.1.

    ``interpretability``: :meth:`~InstrumentationConfig.attention_analysis`;
    ``debugging``: :meth:`~InstrumentationConfig.fast_capture`; ``performance_analysis``:
    :meth:`~InstrumentationConfig.balanced`, with zstd for ``gpt``/``llama``/``qwen`` (1.3.1
    also set a 16 GB memory limit there; the default ring is kept instead: a capture fits
    its ring to what strapd admits, 1 GiB by default, and would warn about a cap the
    caller never set); ``full_capture``: :meth:`~InstrumentationConfig.balanced`. Any other
    purpose gets :meth:`~InstrumentationConfig.balanced`, as in 1.3.1, with a warning naming
    the known purposes (1.3.1 said nothing, so a misspelt purpose went unseen).

    Args:
        model_arch: a name from :func:`detect_model_architecture`, or the model itself.
        purpose: one of :data:`PURPOSES` (another: ``balanced()`` with a warning).

    Returns:
        a new :class:`InstrumentationConfig`.

    Example:
        >>> create_optimized_config("llama", "performance_analysis").compression_algorithm
        'zstd'
    """
    if not isinstance(model_arch, str):
        model_arch = detect_model_architecture(model_arch)
    if purpose == "interpretability":
        return InstrumentationConfig.attention_analysis()
    if purpose == "debugging":
        return InstrumentationConfig.fast_capture()
    if purpose == "performance_analysis":
        cfg = InstrumentationConfig.balanced()
        if str(model_arch) in {"gpt", "llama", "qwen"}:
            cfg.with_compression("zstd")
        return cfg
    if purpose == "full_capture":
        return InstrumentationConfig.balanced()
    warn_caller(f"create_optimized_config: unknown purpose {purpose!r}; using balanced() as 1.3.1 did "
                f"(known purposes: {', '.join(PURPOSES)})")
    return InstrumentationConfig.balanced()
