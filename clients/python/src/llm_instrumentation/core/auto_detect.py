"""1.3.1's ``llm_instrumentation.core.auto_detect``: ``detect_model_architecture`` and
``create_optimized_config`` (1.3.1's own functions, kept here for code written against it),
and the detector's names from where they live now: :func:`describe_model` in
:mod:`llm_instrumentation._anatomy`, :func:`select_modules` and :func:`falls_back_to_131` in
:mod:`llm_instrumentation._hooks`, :func:`config_for_model` in
:mod:`llm_instrumentation._ringsize`. Nothing in the package imports this module: it is the
compatibility layer's (docs/ARCHITECTURE.md, "The Python client").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from .._anatomy import describe_model
from .._hooks import falls_back_to_131, select_modules
from .._ringsize import config_for_model
from .._warnings import warn_caller
from ..config import InstrumentationConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

__all__ = ["describe_model", "select_modules", "falls_back_to_131", "config_for_model", "detect_model_architecture",
           "create_optimized_config", "PURPOSES"]


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
