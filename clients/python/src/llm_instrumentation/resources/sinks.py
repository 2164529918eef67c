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
        send: sends one RESOURCES body (bytes of a JSON object) as one message.
        max_body: the largest body one message may carry.
        path: the resource log strapd writes (for ``ResourceMonitor.path``).
    """

    def __init__(self, send: Callable[[bytes], None], max_body: int, path: Optional[str] = None) -> None:
        self._send = send
        self._max = max_body
        self.path = path
        self.messages = 0

    def write(self, lines: Sequence[bytes]) -> None:
        """Send the lines in as few messages as fit.

        Raises:
            ValueError: one event alone is larger than a message can carry.
        """
        head, tail = b'{"events":[', b"]}"
        room = self._max - len(head) - len(tail)
        batch: List[bytes] = []
        size = 0
        for line in lines:
            ev = line.rstrip(b"\n")
            if len(ev) + 1 > room:
                raise ValueError(f"a resource event of {len(ev)} bytes does not fit in one message "
                                 f"({self._max} bytes)")
            if batch and size + len(ev) + 1 > room:
                self._flush_batch(head, tail, batch)
                batch, size = [], 0
            batch.append(ev)
            size += len(ev) + 1
        if batch:
            self._flush_batch(head, tail, batch)

    def _flush_batch(self, head: bytes, tail: bytes, batch: List[bytes]) -> None:
        self._send(head + b",".join(batch) + tail)
        self.messages += 1

    def flush(self) -> None:
        """Messages are sent as they are made."""

    def close(self) -> None:
        """The connection belongs to the capture session."""
