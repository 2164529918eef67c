"""The durable writes of checkpoint.py (write_atomic, fsync_unlink, TokenLogWriter's append) are
libstrap's (clients/c/common/strap_checkpoint.c, bound in _speedups_checkpoint.c): the file
replaced atomically, a failure an OSError naming the step and the path with the old file intact
and no temp file left, a failed append followed by a whole rewrite. (libstrap's own:
clients/c/tests/test_durable.c.)"""

from __future__ import annotations

import errno
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from llm_instrumentation import checkpoint as ckpt


def _temps(d) -> list:
    return sorted(p.name for p in d.iterdir() if ".tmp." in p.name)


def test_write_atomic_replaces_with_the_capture_mode(tmp_path):
    p = tmp_path / "a.ckpt.json"
    old = os.umask(0)
    try:
        ckpt.write_atomic(p, b"first\n")
    finally:
        os.umask(old)
    assert p.read_bytes() == b"first\n"
    assert p.stat().st_mode & 0o777 == ckpt.CAPTURE_FILE_MODE
    ino = p.stat().st_ino
    ckpt.write_atomic(str(p), bytearray(b"second, longer\n"))  # any bytes-like, a str path
    assert p.read_bytes() == b"second, longer\n"
    assert p.stat().st_ino != ino  # renamed over, never rewritten in place
    assert _temps(tmp_path) == []


def test_write_atomic_failures_name_the_step_and_keep_the_old_file(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        ckpt.write_atomic(tmp_path / "missing" / "b.json", b"x")
    assert e.value.errno == errno.ENOENT
    assert f"open {tmp_path}/missing/b.json.tmp.{os.getpid()}" in str(e.value)
    d = tmp_path / "isdir"
    d.mkdir()
    with pytest.raises(IsADirectoryError, match=r"rename .*/isdir\.tmp\.\d+ to .*/isdir"):
        ckpt.write_atomic(d, b"x")
    assert d.is_dir() and _temps(tmp_path) == []


def test_write_atomic_failed_write_leaves_the_old_file(tmp_path):
    """A write that fails half way (RLIMIT_FSIZE: EFBIG past 4 bytes, in a child so that the
    limit stays there): OSError, the old file as it was, no temp file."""
    p = tmp_path / "d.json"
    ckpt.write_atomic(p, b"old\n")
    code = textwrap.dedent(f"""
        import errno, resource, signal
        from llm_instrumentation import checkpoint as ckpt
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            ckpt.write_atomic({str(p)!r}, b"new, longer than 4 bytes\\n")
        except OSError as e:
            assert e.errno == errno.EFBIG, e
            print(e)
        else:
            print("no error")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"[Errno {errno.EFBIG}] write {p}.tmp."), out
    assert p.read_bytes() == b"old\n"
    assert _temps(tmp_path) == []


def test_fsync_unlink(tmp_path):
    p = tmp_path / "g.json"
    ckpt.write_atomic(p, b"g\n")
    ckpt.fsync_unlink(p)
    assert not p.exists()
    with pytest.raises(FileNotFoundError, match=f"unlink {p}"):
        ckpt.fsync_unlink(p)


def test_token_log_failed_append_rewrites_whole(tmp_path):
    """An append that fails raises OSError naming the log; the next sync writes the whole log
    again (part of the failed append may be in the file)."""
    p = tmp_path / "x.ckpt.json.tokens.jsonl"
    toks = [ckpt.encode_token({"token_index": i, "token_id": i, "token_text": f"t{i}", "position": i}) for i in range(6)]
    w = ckpt.TokenLogWriter(str(p))
    w.sync(toks[:2])
    assert w._fd is not None
    ro = os.open(p, os.O_RDONLY)
    os.dup2(ro, w._fd)  # the log's descriptor now refuses writes
    os.close(ro)
    with pytest.raises(OSError, match=f"write to {p}") as e:
        w.sync(toks[:4])
    assert e.value.errno == errno.EBADF
    assert w._fd is None
    assert w.sync(toks) == ckpt.token_log_extent(toks)
    assert p.read_bytes() == "".join(t + "\n" for t in toks).encode()
    w.close()


def test_no_durable_write_of_its_own():
    """checkpoint.py and capture_set.py leave the temp file, fsync, rename and fdatasync to
    libstrap's C (a manifest written by one os.write could be cut short without an error)."""
    from llm_instrumentation import capture_set

    for mod in (ckpt, capture_set):
        src = inspect.getsource(mod)
        for call in ("os.fsync", "os.fdatasync", "os.replace", "os.rename", "os.write(", ".tmp."):
            assert call not in src, (mod.__name__, call)


def test_capture_set_manifest_mode_and_old_file_kept(tmp_path):
    from llm_instrumentation import capture_set

    p = tmp_path / "job.capture.json"
    old = os.umask(0)
    try:
        capture_set.write(p, {"a": 1})
    finally:
        os.umask(old)
    assert json.loads(p.read_text()) == {"a": 1} and (p.stat().st_mode & 0o777) == 0o644
    with pytest.raises(OSError, match="missing"):
        capture_set.write(tmp_path / "missing" / "x.json", {"a": 2})
    assert json.loads(p.read_text()) == {"a": 1}
