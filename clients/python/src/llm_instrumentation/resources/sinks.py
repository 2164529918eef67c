"""Where the writer's event lines go: a JSONL file (standalone) or strapd (inside a capture)."""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence, Union

__all__ = ["JsonlSink", "SessionSink"]


class JsonlSink:
    """Appends event lines to a file: the standalone mode (no daemon involved)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], append: bool = False) -> None:
        self.path: Optional[str] = os.path.abspath(os.fspath(path))
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | (0 if append else os.O_TRUNC)
        self._fd = os.open(self.path, flags, 0o640)

    def write(self, lines: Sequence[bytes]) -> None:
        """Write whole lines (each ends in ``\\n``) with one ``write(2)``."""
        data = b"".join(lines)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def flush(self) -> None:
        """Lines are written unbuffered; nothing is held back."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SessionSink:
    """Sends event lines to strapd as RESOURCES messages (PROTOCOL.md 1.4) over a capture
    session's connection; strapd appends them to the resource log passed with OPEN.

    Args:
        send: packs the lines into as few RESOURCES messages as fit and sends them
            (libstrap's ``_speedups.Session.send_resources``); returns how many it sent.
        path: the resource log strapd writes (for ``ResourceMonitor.path``).
    """

    def __init__(self, send: Callable[[Sequence[bytes]], int], path: Optional[str] = None) -> None:
        self._send = send
        self.path = path
        self.messages = 0

    def write(self, lines: Sequence[bytes]) -> None:
        """Send the lines in as few messages as fit.

        Raises:
            ValueError: one event alone is larger than a message can carry.
        """
        if lines:
            self.messages += self._send(lines)

    def flush(self) -> None:
        """Messages are sent as they are made."""

    def close(self) -> None:
        """The connection belongs to the capture session."""
