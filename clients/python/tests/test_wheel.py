"""The platform wheel brings its own daemon: installed into a fresh venv, with no Go on PATH,
no checkout on sys.path and no STRAPD_BIN, a capture autostarts the bundled strapd.

Runs under `make test-dist`, which builds the wheel and sets STRAP_WHEEL; skipped otherwise.

torch is not downloaded again: the fresh venv gets a ``.pth`` file naming this interpreter's
site-packages, so torch, numpy, transformers, lz4, zstandard and google-crc32c resolve from
there. A path line in a ``.pth`` is appended to sys.path *after* the venv's own
site-packages, and the ``.pth`` files inside that directory are not processed (so an editable
install of this checkout there stays inert); the test asserts the package and the daemon both
come from the fresh venv.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, short_tmpdir

WHEEL = os.environ.get("STRAP_WHEEL")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not WHEEL, reason="needs STRAP_WHEEL (run `make test-dist`)"),
]

CHILD = textwrap.dedent(r'''
    import json, os, sys
    from pathlib import Path
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    import llm_instrumentation as li
    from llm_instrumentation import _daemon as D
    from llm_instrumentation import _session, _speedups, resources
    from llm_instrumentation.resources import native

    venv = Path(sys.argv[1]).resolve()
    out = Path(sys.argv[2])
    binary = D.find_strapd_binary()
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=500, n_positions=64)).eval()
    with torch.no_grad():
        with li.capture_activations(m, preset="balanced", output_path=out) as fw:
            m(input_ids=torch.tensor([[1, 2, 3, 4]]))
    pid = D.status()["daemon"]["pid"]
    with li.open_stream(out) as r:
        n = len(r.tensors())
    # Resource events through the wheel's C wrapper and writer.
    res_path = out.with_name("wheel.resources.jsonl")
    with resources.monitor_resources(m, "MINIMAL", res_path):
        with torch.no_grad():
            m(input_ids=torch.tensor([[1, 2, 3, 4]]))
        c_wrapped = type(m.lm_head.__dict__["forward"]).__dict__["__call__"].__func__
    events = [json.loads(line) for line in res_path.read_text().splitlines()]
    print(json.dumps({
        "package": li.__file__, "binary": binary, "pid": pid,
        "daemon_exe": os.readlink(f"/proc/{pid}/exe"),
        "packets": fw.summary["packets"], "read_back": n,
        "torch_from": torch.__file__,
        "speedups": _speedups.__file__, "speedups_used": _session._c_write_record is not None,
        "resources_c": type(c_wrapped).__name__ == "TimedForward" and native.render is not None,
        "resources_native": native.extension.__file__,
        "mul_mat_events": sum(1 for e in events if e.get("operation") == "mul_mat"),
    }))
''')


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pass


def test_wheel_in_fresh_venv(tmp_path):
    whl = Path(WHEEL).resolve()
    assert whl.is_file(), whl
    assert whl.name.endswith("-py3-none-manylinux_2_17_x86_64.whl"), whl.name
    venv = tmp_path / "venv"
    # ensurepip installs the pip wheel that ships with Python: no network.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    purelib = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    shared = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert shared and not any(Path(p).resolve() == Path(purelib).resolve() for p in shared)
    (Path(purelib) / "_shared_deps.pth").write_text("".join(p + "\n" for p in shared))
    subprocess.run([str(vpy), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--no-index", str(whl)], check=True)

    # The aarch64 wheel's tag is honoured: pip refuses it on this x86_64 machine.
    arm = whl.with_name(whl.name.replace("x86_64", "aarch64"))
    assert arm.is_file(), f"{arm} missing (make wheel builds both)"
    refused = subprocess.run([str(vpy), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
                              "--no-index", str(arm)], capture_output=True, text=True)
    assert refused.returncode != 0 and "not a supported wheel on this platform" in refused.stderr, refused

    sock = short_tmpdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "child.py").write_text(CHILD)
    # PATH: the venv's scripts and the system's, nothing with Go in it.
    path = os.pathsep.join([str(venv / "bin"), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    assert shutil.which("go", path=path) is None, "a go toolchain is on the stripped PATH"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "STRAPD_BIN", "STRAPD_SOCKET", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=path, STRAPD_SOCKET=os.path.join(sock, "strapd.sock"), PYTHONNOUSERSITE="1")
    info = None
    try:
        res = subprocess.run([str(vpy), "child.py", str(venv), str(tmp_path / "w.strap")], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        info = json.loads(res.stdout.strip().splitlines()[-1])
        root = venv.resolve()
        bundled = Path(purelib).resolve() / "llm_instrumentation" / "_bin" / "strapd"
        assert Path(info["package"]).resolve().is_relative_to(root), info
        assert not Path(info["package"]).resolve().is_relative_to(REPO), info
        assert Path(info["binary"]).resolve() == bundled, info
        assert Path(info["daemon_exe"]).resolve() == bundled, info
        assert "started strapd" in res.stderr
        assert info["packets"] == info["read_back"] > 0, info
        # The wheel's C extension (abi3, compiled for the wheel's architecture) is the one
        # loaded, and the session uses it.
        assert Path(info["speedups"]).resolve() == Path(purelib).resolve() / "llm_instrumentation" / "_speedups.abi3.so"
        assert info["speedups_used"], info
        assert info["resources_c"] and info["mul_mat_events"] >= 9, info  # 2 layers x 4 + lm_head
        assert Path(info["resources_native"]).resolve() == \
            Path(purelib).resolve() / "llm_instrumentation" / "resources" / "_native.abi3.so"

        # The console script on the venv's PATH runs the same daemon binary.
        shim = shutil.which("strapd", path=path)
        assert shim is not None and Path(shim).parent == venv / "bin"
        ver = subprocess.run(["strapd", "version"], env=env, cwd=cwd, capture_output=True, text=True)
        assert ver.returncode == 0 and ver.stdout.startswith(f"strapd {whl.name.split('-')[1]} ") and "linux/amd64" in ver.stdout, ver
        vr = subprocess.run(["strapd", "verify", str(tmp_path / "w.strap")], env=env, cwd=cwd,
                            capture_output=True, text=True)
        assert vr.returncode == 0, vr.stdout + vr.stderr
    finally:
        if info:
            _kill(info["pid"])
        shutil.rmtree(sock, ignore_errors=True)
