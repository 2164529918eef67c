"""Finding (and if needed starting) strapd: socket path resolution of PROTOCOL.md 1, the
strapd binary to start, and the connect with its autostart — libstrap's
(``clients/c/common/strap_connect.h`` through ``_speedups``): a detached ``strapd serve``
when nobody answers, started by one process at a time (an flock on ``strapd.sock.lock``
beside the socket, which C clients take too)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from ._ring import _c as _speedups  # imported by _ring, which says what is missing without it
from .errors import StrapdConnectionError

log = logging.getLogger("llm_instrumentation")

ROOT_SOCKET = "/run/strapd/strapd.sock"


def default_socket_path() -> str:
    """The per-user default: ``$XDG_RUNTIME_DIR/strapd/strapd.sock`` or
    ``/tmp/strapd-$UID/strapd.sock``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "strapd", "strapd.sock")
    return f"/tmp/strapd-{os.getuid()}/strapd.sock"


def resolve_socket_path(explicit: Optional[str] = None) -> str:
    """Resolve the control socket path, first match wins (PROTOCOL.md 1).

    Args:
        explicit: a path given by the caller.

    Returns:
        explicit, else ``$STRAPD_SOCKET``, else ``/run/strapd/strapd.sock`` when it exists,
        else :func:`default_socket_path`.
    """
    if explicit:
        return os.fspath(explicit)
    env = os.environ.get("STRAPD_SOCKET")
    if env:
        return env
    if os.path.exists(ROOT_SOCKET):
        return ROOT_SOCKET
    return default_socket_path()


# The daemon a platform wheel carries (tools/build_wheel.py puts it there).
BUNDLED_STRAPD = Path(__file__).resolve().parent / "_bin" / "strapd"

# The console script pip writes for ``strapd`` imports this module; finding it must not
# count as finding the daemon (it would exec find_strapd_binary's answer, or fail).
_SHIM_MARK = b"llm_instrumentation._strapd_cli"


def _is_shim(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return head.startswith(b"#!") and _SHIM_MARK in head


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK) and not _is_shim(path)


def find_strapd_binary() -> Optional[str]:
    """Locate the strapd binary, first match wins: ``$STRAPD_BIN``; the daemon bundled in
    this package (a platform wheel); next to ``sys.executable``; on PATH; ``bin/strapd`` of
    the source checkout this package runs from. The ``strapd`` console-script shim is
    skipped. None when not found."""
    env = os.environ.get("STRAPD_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    if BUNDLED_STRAPD.is_file():
        if os.access(BUNDLED_STRAPD, os.X_OK):
            return str(BUNDLED_STRAPD)
        log.warning("bundled strapd %s is not executable (installed without its mode bits?); skipped",
                    BUNDLED_STRAPD)
    beside = Path(sys.executable).parent / "strapd"
    if _executable(beside):
        return str(beside)
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        cand = Path(d or ".") / "strapd"
        if _executable(cand):
            return str(cand)
    for parent in Path(__file__).resolve().parents:
        gomod = parent / "go.mod"
        if gomod.is_file():
            cand = parent / "bin" / "strapd"
            try:
                is_repo = "github.com/strap-llm/strap" in gomod.read_text(errors="replace")
            except OSError:
                is_repo = False
            if is_repo and cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
            break
    return None


def lock_path(socket_path: str) -> str:
    """The autostart lock beside the socket: ``strapd.sock.lock`` for ``strapd.sock``
    (PROTOCOL.md 1). libstrap takes the same flock on the same file, so Python and C clients
    on one host take turns."""
    return socket_path + ".lock"


def connect(path: Optional[str] = None, autostart: bool = True, timeout: float = 10.0,
            lock_timeout: Optional[float] = None) -> socket.socket:
    """Connect to strapd, starting it when nobody answers and ``autostart`` is set.

    libstrap's connect (``clients/c/common/strap_connect.h``, through ``_speedups``): starting
    is serialized by an flock on :func:`lock_path` (PROTOCOL.md 1): of the processes that find
    no daemon at once, the one holding the lock starts one and keeps the lock until it accepts
    (or fails); the others wait, connecting as soon as it answers. Whoever takes the lock tries
    to connect again first, so a daemon started meanwhile is used, never doubled. A stale
    socket file is left to the new daemon, which replaces it. The daemon (``strapd serve
    --socket PATH``, with ``--sched-idle`` / ``--idle-workers`` when ``STRAPD_SCHED_IDLE`` /
    ``STRAPD_IDLE_WORKERS`` are on) is detached: it outlives this process (a sidecar for later
    captures and resumes) and exits by itself once no client has been connected for
    ``STRAPD_EXIT_IDLE`` (a Go duration, default ``15m``; ``0`` keeps it). Its log goes to
    ``strapd.log`` beside the socket. One that exits with status 0 at start-up found another
    strapd serving on the socket: the connection is to that one.

    Args:
        path: explicit socket path (else resolved by :func:`resolve_socket_path`).
        autostart: start a daemon when none answers (the binary :func:`find_strapd_binary`
            finds).
        timeout: start-up timeout.
        lock_timeout: how long to wait for another process's start (default ``3 * timeout``).

    Returns:
        the connected socket (no handshake yet).

    Raises:
        StrapdConnectionError: nobody answers and autostart is off; no binary; the start
            failed (the message carries the log's tail and what to do); or the lock was held
            past ``lock_timeout`` (the message names the lock and its holder).

    Example:
        >>> conn = connect()  # doctest: +SKIP
    """
    p = resolve_socket_path(path)
    binary = find_strapd_binary() if autostart else None
    fd, started, log_path, why = _speedups.connect_daemon(
        p, autostart, binary, timeout, -1.0 if lock_timeout is None else lock_timeout,
        "leave autostart_daemon on", "STRAPD_SOCKET or socket_path",
        "install the platform wheel, which bundles it; set STRAPD_BIN; put strapd on PATH; or start "
        "`strapd serve` yourself")
    if started:
        msg = f"llm_instrumentation: started strapd (pid {started}) on {p}, log {log_path}"
        # Printed, not only logged: with logging unconfigured a warning would print it twice.
        log.info(msg)
        print(msg, file=sys.stderr)
    if fd < 0:
        raise StrapdConnectionError(why)
    return socket.socket(fileno=fd)


def status(path: Optional[str] = None) -> Dict[str, Any]:
    """The status of the daemon on ``path`` (resolved by :func:`resolve_socket_path`; never
    started): the STATUS_REPLY body (``daemon``, ``sessions``, ``uploads``), asked by libstrap's
    ``strap_status``.

    Raises:
        StrapdConnectionError: nobody answers, or the daemon refused.
    """
    try:
        return json.loads(_speedups.status(resolve_socket_path(path)))
    except OSError as e:
        raise StrapdConnectionError(f"strapd status: {e.args[-1]}") from e
