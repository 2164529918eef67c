"""1.3.1's import path for the configuration: ``from llm_instrumentation.core.config import
InstrumentationConfig``. The classes live in :mod:`llm_instrumentation.config`."""

from ..config import HookGranularity, InstrumentationConfig

__all__ = ["HookGranularity", "InstrumentationConfig"]
