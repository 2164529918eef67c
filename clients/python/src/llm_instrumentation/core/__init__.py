"""1.3.1's ``llm_instrumentation.core`` package: ``capture_activations`` here, and the
``core.config`` / ``core.framework`` / ``core.hooks`` / ``core.auto_detect`` modules.

``capture_activations`` is resolved on first access: the framework itself imports
``core.auto_detect``, so importing it here eagerly would be circular.
"""

from typing import Any

__all__ = ["capture_activations"]


def __getattr__(name: str) -> Any:
    if name == "capture_activations":
        from ..framework import capture_activations

        return capture_activations
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
