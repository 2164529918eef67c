"""The stream lock (docs/CHECKPOINTS.md 5): one live capture per stream file.

A capture takes ``flock(LOCK_EX)`` on the stream's open file description before it changes
a byte of the file, and passes that descriptor to strapd, whose copy keeps the lock until
the session has ended. A second capture, resume or repair of the same file finds it taken:
a live holder (another process, or a capture of this one marked live here and not yet
stopped) fails it at once, naming the holder; a gone one (its strapd session still being
ended) is waited for.

The protocol is libstrap's, written once in ``clients/c/common/strap_streamlock.h`` and
compiled into :mod:`._speedups`: taking the lock, the holder from ``/proc/locks``, live or
gone (a zombie is gone), the wait (the GIL is let go; a signal's exception stops it), this
process's live captures and the messages. What is left here is the Python side: the error's
type, and the file key the callers keep.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from . import _speedups as _c
from .checkpoint import CheckpointError


class StreamInUseError(CheckpointError):
    """The stream file is being written by a live capture, so this one cannot use it.

    Nothing was changed in the file. Attributes: ``path`` (the stream), ``pid`` (the process
    that holds the stream lock, None when it could not be found).
    """

    def __init__(self, message: str, path: str, pid: Optional[int]) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid


_FileKey = Tuple[int, int]


def file_key(fd: int) -> _FileKey:
    """The (st_dev, st_ino) of the file behind ``fd``."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def mark_live(fd: int, path: str) -> _FileKey:
    """Record that a capture of this process, having just locked ``fd``, is writing its
    file (until :func:`mark_ended` with the key returned): what tells this process's own
    live capture (refused) from its own session that strapd is still ending (waited for)."""
    key = file_key(fd)
    _c.stream_mark_live(key[0], key[1], path)
    return key


def mark_ended(key: Optional[_FileKey]) -> None:
    """The capture of ``key`` has stopped or aborted (its lock may outlive it for a moment)."""
    if key is not None:
        _c.stream_mark_ended(key[0], key[1])


def lock_holder(fd: int, locks_file: str = "/proc/locks") -> Optional[int]:
    """The pid that took the ``flock`` on the file behind ``fd``, from ``/proc/locks``; None
    when no entry is found (no such file, the lock was just released, or a file system whose
    device numbers /proc/locks shows differently from ``stat``, when the inode alone does not
    single one out)."""
    st = os.fstat(fd)
    return _c.stream_lock_holder(st.st_dev, st.st_ino, locks_file) or None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not: a killed client not yet reaped)."""
    return bool(_c.stream_alive(pid))


def lock_stream(fd: int, wait: float, path: str) -> None:
    """Take the stream's exclusive ``flock`` (nothing in the file is changed before).

    Args:
        fd: a descriptor of the stream file.
        wait: seconds to wait for a lock left by a capture whose process is gone (its
            strapd session still ending).
        path: the stream's path, for messages.

    Raises:
        StreamInUseError: a live capture holds the lock (at once), or one still held it
            after ``wait`` seconds.
        OSError: the descriptor cannot be locked (``fstat`` or ``flock`` failed).
    """
    st = os.fstat(fd)
    verdict, pid, err, message = _c.stream_lock(fd, st.st_dev, st.st_ino, float(wait), path)
    if verdict == _c.LOCK_LOCKED:
        return
    if verdict == _c.LOCK_ERROR:
        raise OSError(err, message)
    raise StreamInUseError(message, path, pid or None)
