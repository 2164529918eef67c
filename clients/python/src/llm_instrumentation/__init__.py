"""llm_instrumentation: capture LLM activations through the strapd daemon.

Example:
    >>> from llm_instrumentation import capture_activations, open_stream   # doctest: +SKIP
    >>> with capture_activations(model, preset="balanced", output_path="run.strap") as fw:
    ...     model(input_ids)
    >>> with open_stream("run.strap") as r:
    ...     [t.name for t in r]
"""

from __future__ import annotations

from ._version import __version__

from .analysis import analyze_activations, analyze_activations_with_tokens
from .config import HookGranularity, InstrumentationConfig
from .core.compression import TensorCompressionManager
from .core.hooks import HookConfig
from .core.streaming import StreamingSerializer
from .errors import (
    StrapdConnectionError,
    StrapdProtocolError,
    StrapdTimeoutError,
    StrapdWriteError,
    StrapError,
    StreamFormatError,
    UnsupportedCodecError,
)
from .checkpoint import CaptureCompleteError, CheckpointError
from ._streamlock import StreamInUseError
from .correlation import correlate
from .framework import InstrumentationFramework, capture_activations
from ._capture import UploadWarning
from .tracking import TokenTracker
from .stream import StreamReader, Tensor, open_stream
from ._distributed import ParallelLayout, Shard

__all__ = [
    "__version__",
    "analyze_activations",
    "analyze_activations_with_tokens",
    "capture_activations",
    "CaptureSet",
    "CaptureSetError",
    "open_capture_set",
    "ParallelLayout",
    "Shard",
    "CaptureCompleteError",
    "CheckpointError",
    "correlate",
    "HookConfig",
    "HookGranularity",
    "InstrumentationConfig",
    "InstrumentationFramework",
    "open_stream",
    "StrapError",
    "StrapdConnectionError",
    "StrapdProtocolError",
    "StrapdTimeoutError",
    "StrapdWriteError",
    "StreamFormatError",
    "StreamInUseError",
    "StreamingSerializer",
    "StreamReader",
    "Tensor",
    "TensorCompressionManager",
    "TokenTracker",
    "UnsupportedCodecError",
    "UploadWarning",
]

_LAZY = {"CaptureSet", "CaptureSetError", "open_capture_set"}


def __getattr__(name: str) -> "object":
    # capture_set is imported on first use: ``python -m llm_instrumentation.capture_set``
    # must find it not yet imported by the package (runpy warns otherwise).
    if name in _LAZY:
        from . import capture_set

        return getattr(capture_set, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
