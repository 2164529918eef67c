"""One live capture per stream file (docs/CHECKPOINTS.md 5, issue 25): a second capture of
the file a live capture writes fails at once, naming the file and the holder, and the first
capture's stream survives whole — in one process and across two, through the real strapd.
A lock left by a process that is gone is still waited for (a killed client's session that
strapd is ending)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import strapd_bin, tiny_gpt2

from llm_instrumentation import CheckpointError, StreamInUseError, capture_activations, open_stream
from llm_instrumentation import _streamlock

HERE = Path(__file__).resolve().parent


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 1000, (1, 6), generator=torch.Generator().manual_seed(seed))


def forward(model, seed: int) -> None:
    with torch.no_grad():
        model(ids(seed))


def check_whole(path: Path, forwards: int, pid: int) -> None:
    """The stream at ``path`` is one complete capture of ``forwards`` forward passes by ``pid``."""
    with open_stream(path) as r:
        assert r.metadata["client_metadata"]["client"]["pid"] == pid and r.metadata["peer"]["pid"] == pid
        end = r.end()
        assert end is not None and end.meta["status"] == "complete"
        seen = sorted({t.forward for t in r.tensors()})
        assert seen == list(range(forwards)), seen
    v = subprocess.run([str(strapd_bin()), "verify", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_second_capture_in_one_process_fails_first_intact(real_strapd, tmp_path):
    out = tmp_path / "cap.strap"
    model = tiny_gpt2()
    kw = dict(preset="fast_capture", socket_path=real_strapd.socket, autostart_daemon=False)
    with capture_activations(model, output_path=out, **kw) as fw:
        forward(model, 0)
        size = out.stat().st_size
        t0 = time.monotonic()
        with pytest.raises(StreamInUseError) as ei:
            with capture_activations(tiny_gpt2(), output_path=out, **kw):
                pytest.fail("a second capture of a live stream started")
        took = time.monotonic() - t0
        msg = str(ei.value)
        assert str(out) in msg and f"this process (pid {os.getpid()})" in msg, msg
        assert ei.value.pid == os.getpid() and ei.value.path == str(out)
        assert isinstance(ei.value, CheckpointError)  # what code catching the old error still sees
        assert took < 5, f"refused after {took:.1f}s: a live holder must not be waited for"
        assert out.stat().st_size >= size, "the live stream was cut"
        forward(model, 1)  # the first capture goes on unharmed
    check_whole(out, 2, os.getpid())
    # Stopped: the same process may capture the file again (and replace it).
    with capture_activations(model, output_path=out, **kw) as fw:
        forward(model, 0)
    check_whole(out, 1, os.getpid())


CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from conftest import strapd_bin, tiny_gpt2
    from llm_instrumentation import capture_activations
    model = tiny_gpt2()
    with capture_activations(model, output_path={out!r}, preset="fast_capture", socket_path={sock!r},
                             autostart_daemon=False) as fw:
        for i in range(3):
            with torch.no_grad():
                model(torch.randint(0, 1000, (1, 6), generator=torch.Generator().manual_seed(i)))
            if i == 0:
                print("started", flush=True)
                sys.stdin.readline()  # held live until the parent has tried its capture
    print("done", flush=True)
""")


def test_second_capture_in_another_process_fails_first_intact(real_strapd, tmp_path):
    out = tmp_path / "cap.strap"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(HERE), out=str(out), sock=real_strapd.socket)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line == "started\n", (line, child.stderr.read() if child.poll() is not None else "")
        with pytest.raises(StreamInUseError) as ei:
            with capture_activations(tiny_gpt2(), output_path=out, preset="fast_capture", socket_path=real_strapd.socket,
                                     autostart_daemon=False):
                pytest.fail("a second capture of a live stream started")
        assert ei.value.pid == child.pid and f"process {child.pid}" in str(ei.value) and str(out) in str(ei.value)
        child.stdin.write("go\n")
        child.stdin.flush()
        rest, err = child.communicate(timeout=60)
        assert child.returncode == 0 and rest == "done\n", err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    check_whole(out, 3, child.pid)


def test_lock_of_a_gone_process_is_waited_for(tmp_path):
    """A holder that has exited, its lock kept by another descriptor of the same open file
    (strapd's, in a real capture): lock_stream waits and then takes the lock."""
    path = tmp_path / "s.strap"
    path.write_bytes(b"kept")
    # The locker exits at once; the sleeper it started keeps the locked descriptor 3 s.
    code = textwrap.dedent(f"""
        import fcntl, os, subprocess, sys
        fd = os.open({str(path)!r}, os.O_WRONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], pass_fds=(fd,))
    """)
    subprocess.run([sys.executable, "-c", code], check=True)  # exited and reaped: the holder is gone
    fd = os.open(path, os.O_RDWR)
    try:
        assert _streamlock.lock_holder(fd) is not None, "no /proc/locks entry for the held lock"
        t0 = time.monotonic()
        _streamlock.lock_stream(fd, 30, str(path))
        assert 0.5 < time.monotonic() - t0 < 20
    finally:
        os.close(fd)
    assert path.read_bytes() == b"kept"


def test_lock_of_a_gone_process_times_out(tmp_path):
    path = tmp_path / "s.strap"
    path.write_bytes(b"kept")
    code = textwrap.dedent(f"""
        import fcntl, os, subprocess, sys
        fd = os.open({str(path)!r}, os.O_WRONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], pass_fds=(fd,))
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(StreamInUseError, match="still holds the stream lock after 0s"):
            _streamlock.lock_stream(fd, 0.3, str(path))
    finally:
        os.close(fd)


def test_lock_holder_reads_proc_locks(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        locks = tmp_path / "locks"
        locks.write_text(
            f"1: POSIX  ADVISORY  WRITE 11 {dev} 0 EOF\n"        # not a flock
            f"2: FLOCK  ADVISORY  READ  12 {dev} 0 EOF\n"        # shared, not ours
            f"3: FLOCK  ADVISORY  WRITE 4242 {dev} 0 EOF\n"
            f"3: -> FLOCK  ADVISORY  WRITE 13 {dev} 0 EOF\n"     # a waiter
            f"4: FLOCK  ADVISORY  WRITE 14 00:01:{st.st_ino + 1} 0 EOF\n")
        assert _streamlock.lock_holder(fd, str(locks)) == 4242
        # A file system whose device /proc/locks shows differently: the inode alone decides
        # when one holder has it, and none is named when two do.
        locks.write_text(f"1: FLOCK  ADVISORY  WRITE 77 ff:ff:{st.st_ino} 0 EOF\n")
        assert _streamlock.lock_holder(fd, str(locks)) == 77
        locks.write_text(f"1: FLOCK  ADVISORY  WRITE 77 ff:ff:{st.st_ino} 0 EOF\n"
                         f"2: FLOCK  ADVISORY  WRITE 78 fe:ff:{st.st_ino} 0 EOF\n")
        assert _streamlock.lock_holder(fd, str(locks)) is None
        assert _streamlock.lock_holder(fd, str(tmp_path / "missing")) is None
    finally:
        os.close(fd)


def test_zombie_is_not_alive():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited, not reaped
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            if b") Z" in f.read():
                break
        time.sleep(0.02)
    assert not _streamlock._alive(p.pid)
    p.wait()
    assert not _streamlock._alive(p.pid)
    assert _streamlock._alive(os.getpid())


def _gone_holder(path: Path, hold_s: float) -> None:
    """A lock whose taker has exited, kept ``hold_s`` seconds by its child's copy of the descriptor."""
    code = textwrap.dedent(f"""
        import fcntl, os, subprocess, sys
        fd = os.open({str(path)!r}, os.O_WRONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep({hold_s})"], pass_fds=(fd,))
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_wait_lets_go_of_the_gil_and_a_signal_stops_it(tmp_path):
    """The wait runs in libstrap's C (strap_streamlock.h) without the GIL: another thread keeps
    running meanwhile, and a signal handler's exception ends the wait at once."""
    import signal
    import threading

    path = tmp_path / "s.strap"
    path.write_bytes(b"kept")
    _gone_holder(path, 8)
    fd = os.open(path, os.O_RDWR)
    ticks, stop = [0], threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    class Stop(Exception):
        pass

    def on_alarm(signum, frame):
        raise Stop()

    t = threading.Thread(target=tick)
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.raises(StreamInUseError, match="still holds the stream lock after 1s"):
            t.start()
            _streamlock.lock_stream(fd, 1.0, str(path))
        stop.set()
        t.join()
        assert ticks[0] > 20, f"the other thread ran {ticks[0]} times during a 1 s wait: the GIL was held"
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        with pytest.raises(Stop):
            _streamlock.lock_stream(fd, 30, str(path))
        assert time.monotonic() - t0 < 3, "the signal did not stop the wait"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        stop.set()
        os.close(fd)
    assert path.read_bytes() == b"kept"


def test_own_live_capture_refused_then_waited_for_once_ended(tmp_path):
    """This process's capture marked live: refused at once, naming it; marked ended (its
    strapd session still ending): waited for, here until the deadline."""
    path = tmp_path / "s.strap"
    path.write_bytes(b"kept")
    fd, fd2 = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        _streamlock.lock_stream(fd, 0, str(path))
        key = _streamlock.mark_live(fd, str(path))
        with pytest.raises(StreamInUseError, match=r"this process \(pid \d+\) that has not stopped, writing") as ei:
            _streamlock.lock_stream(fd2, 30, str(path))
        assert ei.value.pid == os.getpid() and ei.value.path == str(path)
        _streamlock.mark_ended(key)
        t0 = time.monotonic()
        with pytest.raises(StreamInUseError, match="has ended"):
            _streamlock.lock_stream(fd2, 0.3, str(path))
        assert time.monotonic() - t0 >= 0.25
        with pytest.raises(OSError):
            _streamlock.lock_stream(10**6, 0, str(path))  # not a descriptor: fstat fails
    finally:
        os.close(fd)
        os.close(fd2)
