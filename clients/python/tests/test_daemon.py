"""Socket path resolution, binary discovery and autostart (PROTOCOL.md 1)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_gpt2

from llm_instrumentation import StrapdConnectionError, capture_activations, open_stream
from llm_instrumentation import _daemon as D
import wire as P

FAKE_SCRIPT = Path(__file__).with_name("fake_strapd_bin.py")


@pytest.fixture
def fake_bin(tmp_path):
    """An executable 'strapd' that runs the fake daemon with this interpreter."""
    b = tmp_path / "strapd"
    b.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_SCRIPT} \"$@\"\n")
    b.chmod(0o755)
    return str(b)


@pytest.mark.parametrize("explicit,env,xdg,want", [
    ("/x/a.sock", {"STRAPD_SOCKET": "/y/b.sock"}, "/run/user/1", "/x/a.sock"),
    (None, {"STRAPD_SOCKET": "/y/b.sock"}, "/run/user/1", "/y/b.sock"),
    (None, {}, "/run/user/1", "/run/user/1/strapd/strapd.sock"),
    (None, {}, None, f"/tmp/strapd-{os.getuid()}/strapd.sock"),
])
def test_resolve_socket_path(monkeypatch, explicit, env, xdg, want):
    monkeypatch.delenv("STRAPD_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if xdg:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    monkeypatch.setattr(D, "ROOT_SOCKET", "/nonexistent/strapd.sock")
    assert D.resolve_socket_path(explicit) == want


def test_root_socket_preferred_when_present(monkeypatch, tmp_path):
    root = tmp_path / "root.sock"
    root.touch()
    monkeypatch.delenv("STRAPD_SOCKET", raising=False)
    monkeypatch.setattr(D, "ROOT_SOCKET", str(root))
    assert D.resolve_socket_path() == str(root)


def test_find_binary_env(monkeypatch, tmp_path, fake_bin):
    monkeypatch.setenv("STRAPD_BIN", fake_bin)
    assert D.find_strapd_binary() == fake_bin
    monkeypatch.setenv("STRAPD_BIN", str(tmp_path / "missing"))
    assert D.find_strapd_binary() is None


def _exe(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_find_binary_order(monkeypatch, tmp_path):
    """STRAPD_BIN, then the bundled daemon, then beside the interpreter, then PATH; the
    console-script shim is never taken for the daemon."""
    bundled = _exe(tmp_path / "pkg" / "_bin" / "strapd")
    onpath = _exe(tmp_path / "path" / "strapd")
    shim = _exe(tmp_path / "venv" / "bin" / "strapd",
                "#!/venv/bin/python\nimport sys\nfrom llm_instrumentation._strapd_cli import main\n")
    monkeypatch.delenv("STRAPD_BIN", raising=False)
    monkeypatch.setattr(D, "BUNDLED_STRAPD", bundled)
    monkeypatch.setattr(D.sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{onpath.parent}")
    assert D.find_strapd_binary() == str(bundled)
    monkeypatch.setenv("STRAPD_BIN", str(onpath))
    assert D.find_strapd_binary() == str(onpath)
    monkeypatch.delenv("STRAPD_BIN")
    bundled.unlink()
    # the shim sits beside the interpreter and first on PATH: both skipped
    assert D.find_strapd_binary() == str(onpath)
    real_beside = _exe(tmp_path / "venv2" / "bin" / "strapd")
    monkeypatch.setattr(D.sys, "executable", str(tmp_path / "venv2" / "bin" / "python"))
    assert D.find_strapd_binary() == str(real_beside)


def test_bundled_not_executable_is_skipped(monkeypatch, tmp_path, caplog):
    bundled = _exe(tmp_path / "_bin" / "strapd")
    bundled.chmod(0o644)
    onpath = _exe(tmp_path / "path" / "strapd")
    monkeypatch.delenv("STRAPD_BIN", raising=False)
    monkeypatch.setattr(D, "BUNDLED_STRAPD", bundled)
    monkeypatch.setattr(D.sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(onpath.parent))
    with caplog.at_level("WARNING", logger="llm_instrumentation"):
        assert D.find_strapd_binary() == str(onpath)
    assert "not executable" in caplog.text


def test_shim_without_binary_says_so(monkeypatch, tmp_path, capsys):
    from llm_instrumentation import _strapd_cli

    monkeypatch.setenv("STRAPD_BIN", str(tmp_path / "missing"))
    with pytest.raises(SystemExit) as ei:
        _strapd_cli.main()
    assert ei.value.code == 127
    assert "carries no strapd binary" in capsys.readouterr().err


def test_no_daemon_no_autostart(sockdir):
    with pytest.raises(StrapdConnectionError, match="no strapd answers"):
        D.connect(os.path.join(sockdir, "none.sock"), autostart=False)


def test_autostart_failure_has_log_tail(monkeypatch, sockdir, fake_bin):
    monkeypatch.setenv("STRAPD_BIN", fake_bin)
    monkeypatch.setenv("FAKE_STRAPD_MODE", "--fail")
    with pytest.raises(StrapdConnectionError, match="permission denied"):
        D.connect(os.path.join(sockdir, "sub", "s.sock"), autostart=True, timeout=10)
    assert oct(os.stat(os.path.join(sockdir, "sub")).st_mode & 0o777) == "0o700"


def test_autostart_then_capture(monkeypatch, sockdir, tmp_path, capsys, fake_bin):
    monkeypatch.setenv("STRAPD_BIN", fake_bin)
    monkeypatch.delenv("FAKE_STRAPD_MODE", raising=False)
    # the stand-in daemon is a Python process: give it longer than strapd's 10 s on a busy box
    real_connect = D.connect
    monkeypatch.setattr(D, "connect", lambda p, autostart=True, timeout=10.0: real_connect(p, autostart, 60.0))
    path = os.path.join(sockdir, "auto", "strapd.sock")
    m = tiny_gpt2()
    pid = None
    try:
        with torch.no_grad():
            with capture_activations(m, preset="balanced", output_path=tmp_path / "a.strap", socket_path=path) as fw:
                m(input_ids=torch.tensor([[1, 2, 3]]))
        assert "started strapd" in capsys.readouterr().err
        assert os.path.exists(os.path.join(sockdir, "auto", "strapd.log"))
        conn = P.Connection.connect(path)
        pid = P.handshake(conn, "t", os.getpid()).pid
        conn.close()
        with open_stream(tmp_path / "a.strap") as r:
            assert len(r.tensors()) == fw.summary["packets"] > 0
    finally:
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.05)


def test_autostarted_daemon_exits_when_idle(monkeypatch, sockdir):
    """The real strapd, autostarted, stays while a client is connected and exits by itself once
    none has been for STRAPD_EXIT_IDLE; the next connect starts a fresh one."""
    from conftest import strapd_bin

    monkeypatch.setenv("STRAPD_BIN", str(strapd_bin()))
    monkeypatch.setenv("STRAPD_EXIT_IDLE", "1s")
    path = os.path.join(sockdir, "idle", "strapd.sock")
    conn = P.Connection(D.connect(path, autostart=True))
    pid = P.handshake(conn, "t", os.getpid()).pid
    time.sleep(2.5)  # connected for longer than the idle time: must still be there
    os.kill(pid, 0)
    conn.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGTERM)
        pytest.fail(f"autostarted strapd {pid} still running 15 s after its last client left")
    with pytest.raises(StrapdConnectionError, match="no strapd answers"):
        D.connect(path, autostart=False)
    log = Path(sockdir, "idle", "strapd.log").read_text()
    assert "no connection for the idle time" in log


def _policies(pid: int) -> dict:
    """Scheduling policy (field 41 of /proc/PID/task/TID/stat) of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            st = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        out[int(tid)] = int(st[st.rindex(")") + 2:].split()[38])
    return out


def test_sched_idle_daemon_every_thread(monkeypatch, sockdir):
    """STRAPD_SCHED_IDLE=1: the autostarted strapd runs `serve --sched-idle`; every thread of
    it, those the Go runtime starts while it serves a capture included, is under SCHED_IDLE
    (policy 5); with STRAPD_IDLE_WORKERS=1 (`--idle-workers`) only the compression workers'
    threads are (one per CPU Go uses), the rest of the daemon not; with neither, none is."""
    import torch

    from conftest import strapd_bin

    from llm_instrumentation import capture_activations

    monkeypatch.setenv("STRAPD_BIN", str(strapd_bin()))
    for idle in ("all", "workers", "none"):
        monkeypatch.delenv("STRAPD_SCHED_IDLE", raising=False)
        monkeypatch.delenv("STRAPD_IDLE_WORKERS", raising=False)
        if idle == "all":
            monkeypatch.setenv("STRAPD_SCHED_IDLE", "1")
        elif idle == "workers":
            monkeypatch.setenv("STRAPD_IDLE_WORKERS", "1")
        path = os.path.join(sockdir, f"idle-{idle}", "strapd.sock")
        monkeypatch.setenv("STRAPD_SOCKET", path)
        conn = P.Connection(D.connect(path, autostart=True))
        pid = P.handshake(conn, "t", os.getpid()).pid
        try:
            model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
            out = os.path.join(sockdir, f"cap-{idle}.strap")
            with torch.no_grad(), capture_activations(model, output_path=out, modules=["0"], socket_path=path):
                for _ in range(50):
                    model(torch.randn(256, 64))
            pol = _policies(pid)
            assert len(pol) >= 3
            idle_threads = sum(1 for v in pol.values() if v == 5)
            if idle == "all":
                assert set(pol.values()) == {5}, pol
            elif idle == "workers":
                assert 1 <= idle_threads <= (os.cpu_count() or 1), pol
                assert idle_threads < len(pol), pol
            else:
                assert idle_threads == 0, pol
        finally:
            conn.close()
            os.kill(pid, signal.SIGTERM)
