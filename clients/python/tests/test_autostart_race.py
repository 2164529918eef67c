"""Autostart without a race (issue 37, PROTOCOL.md 1): processes that find no daemon at the
same moment take turns on the flock ``strapd.sock.lock`` beside the socket; one starts strapd,
the others connect to it. Real processes, the real strapd (``STRAPD_BIN``), a private socket
per test (``STRAPD_SOCKET``) and no daemon before each start.

``STRAP_TEST_LONG=1`` (``make test-long``) runs the torchrun launches 20 times each."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List

import pytest
from conftest import Daemon, short_tmpdir, strapd_bin

from llm_instrumentation import _daemon as D
import wire as P
from llm_instrumentation.errors import StrapdConnectionError

HERE = Path(__file__).resolve().parent
LONG = os.environ.get("STRAP_TEST_LONG") == "1"
STARTED = re.compile(r"started strapd \(pid (\d+)\)")


@pytest.fixture
def strapd() -> str:
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b} (make build)")
    return str(b)


@pytest.fixture
def sock():
    d = short_tmpdir()
    yield os.path.join(d, "run", "strapd.sock")
    shutil.rmtree(d, ignore_errors=True)


def env_for(sock: str, strapd: str) -> Dict[str, str]:
    env = dict(os.environ, STRAPD_SOCKET=sock, STRAPD_BIN=strapd, STRAPD_EXIT_IDLE="5s", OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS", "XDG_RUNTIME_DIR"):
        env.pop(k, None)
    return env


def stop(pids: Iterable[int]) -> None:
    """SIGTERM the daemons the test started and wait for them to go."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def one_daemon(sock: str, output: str) -> List[int]:
    """Exactly one process started strapd and exactly one strapd served (its log, beside the
    socket, is the one every autostarted daemon appends to); returns the started pids."""
    pids = [int(m) for m in STARTED.findall(output)]
    log = Path(sock).parent / "strapd.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    serving = [line for line in text.splitlines() if '"msg":"serving"' in line]
    assert len(pids) == 1, f"{len(pids)} processes started strapd: {pids}\n{output[-3000:]}"
    assert len(serving) == 1, f"{len(serving)} daemons served:\n{text[-3000:]}"
    return pids


def verify(strapd: str, path: Path) -> None:
    v = subprocess.run([strapd, "verify", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, f"{path}: {v.stdout}{v.stderr}"


def stale_socket(path: str) -> None:
    """A socket file nobody answers on, as a killed daemon leaves it."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.close()


def test_sixteen_processes_at_once_one_daemon(strapd, sock, tmp_path):
    """16 processes start a capture at the same instant (autostart_fork.py: a barrier they
    all wait on), no daemon running, a stale socket file on the path: all 16 complete, one
    daemon served them all (it took the stale socket over), every stream verifies. Before
    the lock, several processes started a daemon each and the losers' captures failed with
    ``strapd exited with status 1``."""
    n = 16
    stale_socket(sock)
    pids: List[int] = []
    try:
        p = subprocess.run([sys.executable, str(HERE / "autostart_fork.py"), str(tmp_path), str(n)],
                           env=env_for(sock, strapd), capture_output=True, text=True, timeout=600, cwd=str(HERE))
        pids = [int(m) for m in STARTED.findall(p.stdout + p.stderr)]
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        assert p.stdout.count(" wrote ") == n, p.stdout
        one_daemon(sock, p.stdout + p.stderr)
    finally:
        stop(pids)
    for i in range(n):
        verify(strapd, tmp_path / f"cap.{i}.strap")


def torchrun_launch(strapd: str, ranks: int, outdir: Path) -> float:
    """One ``torchrun --standalone`` launch of torchrun_autostart.py on a fresh socket (no
    daemon); checks it completed, one daemon served every rank and each rank's stream
    verifies. Returns the launch's seconds."""
    d = short_tmpdir()
    sock = os.path.join(d, "strapd.sock")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           str(HERE / "torchrun_autostart.py"), str(outdir)]
    t0 = time.monotonic()
    pids: List[int] = []
    try:
        p = subprocess.run(cmd, env=env_for(sock, strapd), capture_output=True, text=True, timeout=600, cwd=str(HERE))
        took = time.monotonic() - t0
        pids = [int(m) for m in STARTED.findall(p.stdout + p.stderr)]
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        one_daemon(sock, p.stdout + p.stderr)
    finally:
        stop(pids)
        shutil.rmtree(d, ignore_errors=True)
    names = sorted(n for n in os.listdir(outdir) if n.endswith(".strap"))
    assert names == [f"cap.rank{r:05d}-of-{ranks:05d}.strap" for r in range(ranks)], names
    for name in names:
        verify(strapd, outdir / name)
    return took


@pytest.mark.parametrize("ranks", [2, 8])
def test_torchrun_autostart(strapd, tmp_path, ranks):
    """``torchrun --standalone --nproc_per_node=N``, no daemon before the launch, every rank
    ``capture_activations(model, preset="balanced", output_path=...)``: the launch completes
    and every rank's stream verifies (before the lock, about 1 launch of 4 with 2 ranks lost
    a rank to the autostart race). STRAP_TEST_LONG=1: STRAP_TORCHRUN_LAUNCHES_<ranks> launches
    (default 20; `make test-long` passes TORCHRUN_LAUNCHES_2 and TORCHRUN_LAUNCHES_8)."""
    launches = int(os.environ.get(f"STRAP_TORCHRUN_LAUNCHES_{ranks}", "20")) if LONG else 1
    times = []
    for i in range(launches):
        out = tmp_path / f"launch{i}"
        out.mkdir()
        try:
            times.append(torchrun_launch(strapd, ranks, out))
        except AssertionError as e:
            raise AssertionError(f"launch {i + 1} of {launches}: {e}") from None
        shutil.rmtree(out)
    print(f"torchrun {ranks} ranks: {launches} launches, {min(times):.1f}-{max(times):.1f} s each")


def hold_lock(sock: str) -> int:
    """Take the autostart lock as another starting process would (its pid written in it)."""
    os.makedirs(os.path.dirname(sock), mode=0o700, exist_ok=True)
    fd = os.open(D.lock_path(sock), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def test_lock_held_too_long_names_lock_and_holder(strapd, sock, monkeypatch):
    """A process that holds the lock past the wait: the error names the lock file, its
    holder's pid and what to do, and this process started no daemon."""
    monkeypatch.setenv("STRAPD_BIN", strapd)
    fd = hold_lock(sock)
    try:
        with pytest.raises(StrapdConnectionError) as ei:
            D.connect(sock, timeout=10, lock_timeout=0.5)
    finally:
        os.close(fd)
    msg = str(ei.value)
    assert D.lock_path(sock) in msg and f"(pid {os.getpid()})" in msg, msg
    assert f"`strapd serve --socket {sock}`" in msg, msg
    assert not (Path(sock).parent / "strapd.log").exists(), "a daemon was started past a held lock"


def test_waiter_uses_the_daemon_the_holder_started(strapd, sock, monkeypatch, capsys):
    """While another process holds the lock, a client that finds no daemon waits and connects
    to the daemon that process starts, starting none of its own."""
    monkeypatch.setenv("STRAPD_BIN", strapd)
    fd = hold_lock(sock)
    got: list = []
    t = threading.Thread(target=lambda: got.append(P.Connection(D.connect(sock, timeout=10))))
    daemon = None
    try:
        t.start()
        time.sleep(0.5)  # the client is waiting on the lock by now
        assert t.is_alive(), "the client did not wait for the lock"
        daemon = Daemon(Path(strapd), os.path.dirname(sock))
        t.join(15)
        assert got, "the client did not connect to the daemon started meanwhile"
        welcome = P.handshake(got[0], "t", os.getpid())
        assert welcome.pid == daemon.proc.pid
        got[0].close()
    finally:
        os.close(fd)
        t.join(15)
        if daemon is not None:
            daemon.stop()
    assert "started strapd" not in capsys.readouterr().err


def test_started_daemon_exiting_0_connects_to_the_live_one(strapd, sock, tmp_path, monkeypatch):
    """The daemon this client starts exits 0 at once: another strapd holds the socket (here
    one started outside any lock, answering a moment later). The client connects to that one
    instead of failing."""
    other = tmp_path / "other-strapd"
    other.write_text(f"#!/bin/sh\n(sleep 0.5; exec '{strapd}' serve --socket \"$3\" --exit-idle 5s) "
                     "</dev/null >/dev/null 2>&1 &\nexit 0\n")
    other.chmod(0o755)
    monkeypatch.setenv("STRAPD_BIN", str(other))
    conn = P.Connection(D.connect(sock, timeout=10))
    try:
        pid = P.handshake(conn, "t", os.getpid()).pid
    finally:
        conn.close()
    stop([pid])
