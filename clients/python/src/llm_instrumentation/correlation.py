"""Correlation spans: mark which request the process is working on, so strapd can attach
the request id to the kernel snapshots that overlap it (docs/TRACE_FORMAT.md,
"Correlation spans").

A span is two lines appended to a spans file — ``start`` when the id is set, ``end`` when it
is unset — each with one ``write(2)`` on an ``O_APPEND`` descriptor, so lines from many
processes and threads never interleave. ``strapd trace --spans FILE`` (and ``llm-prof run
--spans FILE``) read it. The file is ``set_spans_file(path)``'s, else ``$STRAP_SPANS_FILE``;
with neither, the functions here only set the context variable (what 1.3.1 did).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Union

#: The context variable holding the current correlation id (1.3.1's ``DEFAULT_KEY``, same name).
DEFAULT_KEY: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("llm_prof_corr_id", default=None)

_spans_file: Optional[str] = None


def set_spans_file(path: Union[str, "os.PathLike[str]", None]) -> None:
    """Append spans to ``path`` from now on (``None``: back to ``$STRAP_SPANS_FILE``)."""
    global _spans_file
    _spans_file = os.fspath(path) if path is not None else None


def spans_file() -> Optional[str]:
    """The spans file in use, or ``None`` when spans are not recorded."""
    return _spans_file or os.environ.get("STRAP_SPANS_FILE") or None


def _mark(event: str, corr_id: str) -> None:
    path = spans_file()
    if path is None:
        return
    line = json.dumps({"event": event, "corr_id": corr_id, "pid": os.getpid(), "tid": threading.get_native_id(),
                       "t": time.time()}, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        data = line.encode()
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to spans file {path}")
    finally:
        os.close(fd)


def new_correlation_id() -> str:
    """A fresh id, as 1.3.1 made them: ``{pid}-{thread ident}-{time ns}``."""
    return f"{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"


def current_correlation_id() -> Optional[str]:
    """The id set in this context, or ``None``."""
    return DEFAULT_KEY.get()


@contextlib.contextmanager
def correlate(corr_id: Optional[str] = None) -> Iterator[str]:
    """Mark the work inside the ``with`` block as request ``corr_id``.

    Args:
        corr_id: the request id (a fresh one from :func:`new_correlation_id` when omitted).

    Returns:
        A context manager yielding the id; the previous id is restored on exit.

    Example:
        >>> with correlate("req-42"):
        ...     model.generate(**inputs)
    """
    if corr_id is None:
        corr_id = new_correlation_id()
    if not isinstance(corr_id, str) or not corr_id:
        raise ValueError(f"corr_id must be a non-empty string, not {corr_id!r}")
    token = DEFAULT_KEY.set(corr_id)
    _mark("start", corr_id)
    try:
        yield corr_id
    finally:
        _mark("end", corr_id)
        DEFAULT_KEY.reset(token)


@dataclass
class CorrelationContext:
    """1.3.1's context-variable form: ``CorrelationContext.default().set("req-1")`` … ``set(None)``.

    Setting an id ends the span of the id it replaces (in this context) and starts one for
    the new id."""

    enabled: bool
    _var: contextvars.ContextVar[Optional[str]]

    @classmethod
    def default(cls) -> "CorrelationContext":
        return cls(enabled=True, _var=DEFAULT_KEY)

    @classmethod
    def disabled(cls) -> "CorrelationContext":
        return cls(enabled=False, _var=DEFAULT_KEY)

    def current_id(self) -> Optional[str]:
        if not self.enabled:
            return None
        return self._var.get()

    def set(self, corr_id: Optional[str]) -> None:
        if not self.enabled:
            return
        prev = self._var.get()
        if prev == corr_id:
            return
        if prev:
            _mark("end", prev)
        self._var.set(corr_id)
        if corr_id:
            _mark("start", corr_id)

    def new_request(self) -> str:
        if not self.enabled:
            raise RuntimeError("Correlation context disabled")
        corr_id = new_correlation_id()
        self.set(corr_id)
        return corr_id


__all__ = ["CorrelationContext", "DEFAULT_KEY", "correlate", "current_correlation_id", "new_correlation_id",
           "set_spans_file", "spans_file"]
