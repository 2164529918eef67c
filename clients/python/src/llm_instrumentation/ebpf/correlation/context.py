"""1.3.1's module path of :class:`CorrelationContext` and ``DEFAULT_KEY``."""

from ...correlation import DEFAULT_KEY, CorrelationContext

__all__ = ["CorrelationContext", "DEFAULT_KEY"]
