"""1.3.1's import path for the framework: ``from llm_instrumentation.core.framework import
InstrumentationFramework, analyze_activations_with_tokens``. The code lives in
:mod:`llm_instrumentation.framework` and :mod:`llm_instrumentation.analysis`."""

from ..analysis import analyze_activations, analyze_activations_with_tokens
from ..config import HookGranularity, InstrumentationConfig
from ..framework import InstrumentationFramework, capture_activations
from ..tracking import TokenTracker

__all__ = ["InstrumentationFramework", "InstrumentationConfig", "HookGranularity", "TokenTracker",
           "analyze_activations", "analyze_activations_with_tokens", "capture_activations"]

#: 1.3.1's name for the tracker ``capture_activations(track_per_token=True)`` yields.
_TokenBoundaryTracker = TokenTracker
