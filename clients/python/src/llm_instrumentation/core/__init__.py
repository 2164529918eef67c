"""1.3.1's ``llm_instrumentation.core`` package: ``capture_activations`` here, and the
``core.config`` / ``core.framework`` / ``core.hooks`` / ``core.auto_detect`` modules.

``capture_activations`` is resolved on first access, so that importing ``core.config`` does
not import the capture framework. The package is the compatibility layer: nothing else in
``llm_instrumentation`` imports it (docs/ARCHITECTURE.md, "The Python client").
"""

from typing import Any

__all__ = ["capture_activations"]


def __getattr__(name: str) -> Any:
    if name == "capture_activations":
        from ..framework import capture_activations

        return capture_activations
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
