"""Exceptions raised by llm_instrumentation."""

from __future__ import annotations

from typing import Optional


class StrapError(Exception):
    """Base class of every error raised by llm_instrumentation."""


class StrapdConnectionError(StrapError, ConnectionError):
    """The daemon could not be reached, or the connection to it broke mid-session."""


class StrapdProtocolError(StrapError):
    """The daemon sent something that breaks docs/PROTOCOL.md, or answered with ERROR.

    Attributes:
        code: the ERROR body's ``code`` (e.g. ``"bad_record"``), or ``"client"`` for a
            violation detected by the client.
        fatal: whether the daemon ended the session.
        fits_ring_size: for ``memory_budget``, the largest ring (bytes) the daemon's budget
            had room for when it refused the session (0: none); None otherwise.
    """

    def __init__(self, message: str, code: str = "client", fatal: bool = True,
                 fits_ring_size: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code
        self.fatal = fatal
        self.fits_ring_size = fits_ring_size


class StrapdWriteError(StrapdProtocolError):
    """strapd could not write the stream: a full disk (ENOSPC), an I/O error (EIO), a file
    size limit (``ERROR write_error``). The message names the stream and the space left on
    its file system. Every packet written before the failure stays readable and verifies
    (strapd cuts the file back to the last whole packet), so once space is freed the
    capture can resume (docs/CHECKPOINTS.md)."""


class StrapdTimeoutError(StrapError, TimeoutError):
    """The daemon is alive but did not answer (or release ring space) in time."""


class StreamFormatError(StrapError, ValueError):
    """A stream file is corrupt or not a v2 stream.

    Attributes:
        offset: byte offset in the file where the problem was found.
    """

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} (at offset {offset})")
        self.offset = offset


class UnsupportedCodecError(StreamFormatError):
    """A packet uses a codec id this installation cannot decode."""
