"""Finding (and if needed starting) strapd: socket path resolution of PROTOCOL.md 1 and a
detached ``strapd serve`` when nobody answers, started by one process at a time (an flock on
``strapd.sock.lock`` beside the socket, shared with libstrap)."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ._protocol import Connection
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


def _tail(path: Path, n: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-n:].decode("utf-8", "replace")


def lock_path(socket_path: str) -> str:
    """The autostart lock beside the socket: ``strapd.sock.lock`` for ``strapd.sock``
    (PROTOCOL.md 1). libstrap takes the same flock on the same file, so Python and C clients
    on one host take turns."""
    return socket_path + ".lock"


def _lock_holder(fd: int) -> str:
    """The pid the lock's holder wrote into it, as text for an error message."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _open_lock(path: str, socket_path: str) -> int:
    # Read-write so the holder can write its pid; read-only is enough for flock when the
    # file belongs to another user of a shared socket directory.
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            return os.open(path, flags | os.O_CLOEXEC, 0o644)
        except PermissionError:
            continue
        except OSError as e:
            raise StrapdConnectionError(
                f"cannot open the autostart lock {path}: {e} (set STRAPD_SOCKET to a path in a directory "
                f"you can write, or start `strapd serve --socket {socket_path}` yourself)") from None
    raise StrapdConnectionError(
        f"cannot open the autostart lock {path}: permission denied (set STRAPD_SOCKET to a path in a "
        f"directory you can write, or start `strapd serve --socket {socket_path}` yourself)")


def _try_connect(path: str) -> Optional[Connection]:
    try:
        return Connection.connect(path)
    except OSError:
        return None


def start_daemon(path: str, binary: Optional[str] = None, timeout: float = 10.0) -> Connection:
    """Start ``strapd serve --socket path`` detached, wait until it accepts, return a connection.

    The caller holds the autostart lock (:func:`connect` takes it): this function alone does
    not keep two processes from starting a daemon each. The daemon outlives this process (it
    is a sidecar for later captures and resumes too) and exits by itself once no client has
    been connected for ``STRAPD_EXIT_IDLE`` (a Go duration, default ``15m``; ``0`` keeps it
    running). Its log goes to ``strapd.log`` beside the socket. A daemon that exits with
    status 0 at start-up found another one serving on the socket: the connection is to that
    one.

    Raises:
        StrapdConnectionError: no binary, it exited, or it did not answer within ``timeout``
            (the message carries the log tail and what to do).
    """
    binary = binary or find_strapd_binary()
    if binary is None:
        raise StrapdConnectionError(
            f"no strapd answers on {path} and no strapd binary was found "
            "(install the platform wheel, which bundles it; set STRAPD_BIN; put strapd on PATH; "
            "or start `strapd serve` yourself)"
        )
    sock_dir = Path(path).parent
    sock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = sock_dir / "strapd.log"
    with open(log_path, "ab") as logf:
        args = [binary, "serve", "--socket", path, "--exit-idle", os.environ.get("STRAPD_EXIT_IDLE", "15m")]
        if os.environ.get("STRAPD_SCHED_IDLE", "") not in ("", "0"):
            args.append("--sched-idle")  # the model's threads preempt its compression (DEPLOY.md)
        if os.environ.get("STRAPD_IDLE_WORKERS", "") not in ("", "0"):
            args.append("--idle-workers")  # only the compression workers (DEPLOY.md, CPU priority)
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    msg = f"llm_instrumentation: started strapd (pid {proc.pid}) on {path}, log {log_path}"
    # Printed, not only logged: with logging unconfigured a warning would print it twice.
    log.info(msg)
    print(msg, file=sys.stderr)
    deadline = time.monotonic() + timeout
    while True:
        rc = proc.poll()
        conn = _try_connect(path)
        if conn is not None:
            return conn
        if rc is not None and rc != 0:
            raise StrapdConnectionError(
                f"strapd exited with status {rc} at start-up; log {log_path}:\n{_tail(log_path)}\n"
                f"(fix what the log says; run `{binary} serve --socket {path}` to see it happen; or point "
                "STRAPD_BIN at a working strapd)")
        if time.monotonic() > deadline:
            what = (f"strapd (pid {proc.pid}) exited with status 0, reporting another strapd on the socket, "
                    "but nothing answers there" if rc == 0 else
                    f"strapd (pid {proc.pid}) did not accept connections on {path}")
            raise StrapdConnectionError(
                f"{what} within {timeout:.0f}s; log {log_path}:\n{_tail(log_path)}\n"
                f"(check `strapd status --socket {path}`; start `strapd serve --socket {path}` yourself; "
                "or set STRAPD_SOCKET to another path)")
        time.sleep(0.05)


def connect(path: Optional[str] = None, autostart: bool = True, timeout: float = 10.0,
            lock_timeout: Optional[float] = None) -> Connection:
    """Connect to strapd, starting it when nobody answers and ``autostart`` is set.

    Starting is serialized by an flock on :func:`lock_path` (PROTOCOL.md 1): of the processes
    that find no daemon at once, the one holding the lock starts one and keeps the lock until
    it accepts (or exits); the others wait, connecting as soon as it answers. Whoever takes
    the lock tries to connect again first, so a daemon started meanwhile is used, never
    doubled. A stale socket file is left to the new daemon, which replaces it.

    Args:
        path: explicit socket path (else resolved by :func:`resolve_socket_path`).
        autostart: start a daemon when none answers.
        timeout: start-up timeout.
        lock_timeout: how long to wait for another process's start (default ``3 * timeout``).

    Returns:
        a connected :class:`~._protocol.Connection` (no handshake yet).

    Raises:
        StrapdConnectionError: nobody answers and autostart is off; the start failed; or the
            lock was held past ``lock_timeout`` (the message names the lock and its holder).

    Example:
        >>> conn = connect()  # doctest: +SKIP
    """
    p = resolve_socket_path(path)
    try:
        return Connection.connect(p)
    except (FileNotFoundError, ConnectionRefusedError) as e:
        if not autostart:
            raise StrapdConnectionError(
                f"no strapd answers on {p}: {e} (start `strapd serve --socket {p}` first, or leave "
                "autostart_daemon on)") from None
    except OSError as e:
        raise StrapdConnectionError(f"cannot connect to strapd on {p}: {e} (check that STRAPD_SOCKET or "
                                    f"socket_path names strapd's socket; `strapd status --socket {p}`)") from None
    try:
        Path(p).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StrapdConnectionError(f"cannot create the socket directory of {p}: {e} (set STRAPD_SOCKET to a "
                                    "path in a directory you can write)") from None
    lock = lock_path(p)
    fd = _open_lock(lock, p)
    try:
        wait = 3 * timeout if lock_timeout is None else lock_timeout
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            # Another process is starting a daemon: use it as soon as it answers.
            conn = _try_connect(p)
            if conn is not None:
                return conn
            if time.monotonic() > deadline:
                raise StrapdConnectionError(
                    f"no strapd answers on {p} after waiting {wait:.0f}s for the autostart lock {lock}, held by "
                    f"another process starting strapd{_lock_holder(fd)}; if that process is stuck, end it (the "
                    f"lock goes with it), or start `strapd serve --socket {p}` yourself")
            time.sleep(0.02)
        conn = _try_connect(p)  # a daemon started while this process waited for the lock
        if conn is not None:
            return conn
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # read-only: the pid only names the holder in others' errors
        return start_daemon(p, timeout=timeout)
    finally:
        os.close(fd)  # releases the flock
