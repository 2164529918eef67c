"""Correlation helpers for propagating corr_id through user code (1.3.1's import path)."""

from ...correlation import DEFAULT_KEY, CorrelationContext

__all__ = ["CorrelationContext", "DEFAULT_KEY"]
