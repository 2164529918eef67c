"""The stream lock (docs/CHECKPOINTS.md 5): one live capture per stream file.

A capture takes ``flock(LOCK_EX)`` on the stream's open file description before it changes
a byte of the file, and passes that descriptor to strapd, whose copy keeps the lock until
the session has ended. A second capture, resume or repair of the same file finds it taken.

Who holds it decides what happens. A lock left by a client that is gone (killed, its
session still being ended by strapd) is waited for: it is released within moments, and the
file is then free to cut or resume. A lock held by a process that is alive — another
process, or a capture of this one that has not stopped — belongs to a capture that is still
writing, and waiting for it would only let this one empty the other's finished stream
(issue 25: two ranks of one job given the same ``output_path``): that fails at once, with
the holder named, before anything is truncated. The holder is read from ``/proc/locks``
(the pid that took the lock); when it cannot be found it is taken to be alive.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Dict, Optional, Tuple

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

#: This process's captures between their OPEN and their stop or abort, by stream file
#: (st_dev, st_ino) -> output path: what tells this process's own live capture (refuse) from
#: its own session that strapd is still ending after an abort (wait).
_live: Dict[_FileKey, str] = {}
_live_mu = threading.Lock()


def file_key(fd: int) -> _FileKey:
    """The (st_dev, st_ino) of the file behind ``fd``."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def mark_live(fd: int, path: str) -> _FileKey:
    """Record that a capture of this process, having just locked ``fd``, is writing its
    file (until :func:`mark_ended` with the key returned)."""
    key = file_key(fd)
    with _live_mu:
        _live[key] = path
    return key


def mark_ended(key: Optional[_FileKey]) -> None:
    """The capture of ``key`` has stopped or aborted (its lock may outlive it for a moment)."""
    if key is None:
        return
    with _live_mu:
        _live.pop(key, None)


def lock_holder(fd: int, locks_file: str = "/proc/locks") -> Optional[int]:
    """The pid that took the ``flock`` on the file behind ``fd``, from ``/proc/locks``; None
    when no entry is found (no such file, the lock was just released, or a file system whose
    device numbers /proc/locks shows differently from ``stat``, when the inode alone does not
    single one out)."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    exact, same_ino = set(), set()
    try:
        with open(locks_file, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "12: FLOCK  ADVISORY  WRITE 4321 00:2a:98765 0 EOF"; waiters have "->" before FLOCK.
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE":
            continue
        try:
            pid = int(parts[4])
        except ValueError:
            continue
        if pid <= 0:
            continue
        if parts[5] == dev:
            exact.add(pid)
        elif parts[5].rsplit(":", 1)[-1] == str(st.st_ino):
            same_ino.add(pid)
    found = exact or same_ino
    return found.pop() if len(found) == 1 else None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not: a killed client not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process, alive
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")
    except (OSError, ValueError):
        return True


def _in_use(path: str, pid: Optional[int], key: _FileKey) -> Optional[StreamInUseError]:
    """The error for a lock held by a live capture, or None when the holder is gone (or is
    this process's own capture that has already stopped or aborted): then it is waited for."""
    if pid == os.getpid():
        with _live_mu:
            live = _live.get(key)
        if live is None:
            return None
        who = f"a capture in this process (pid {pid}) that has not stopped, writing {live!r}"
    elif pid is None:
        who = "a live capture whose process could not be found in /proc/locks"
    elif _alive(pid):
        who = f"a live capture of process {pid}"
    else:
        return None
    return StreamInUseError(
        f"{path} is being written by {who}: a second capture of the same file would destroy that stream, so "
        f"nothing was changed in it. Give this capture another output_path (every rank of a distributed job "
        f"needs its own), or stop the other capture first", path, pid)


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
    """
    deadline = time.monotonic() + wait
    key = file_key(fd)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid = lock_holder(fd)
            if pid is None:
                # Released between the two calls, or not to be found: one retry tells.
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pid = lock_holder(fd)
            err = _in_use(path, pid, key)
            if err is not None:
                raise err from None
            if time.monotonic() >= deadline:
                raise StreamInUseError(
                    f"{path} is in use by a capture that has ended (process {pid}), but its strapd session "
                    f"still holds the stream lock after {wait:.0f}s", path, pid) from None
            time.sleep(0.05)
