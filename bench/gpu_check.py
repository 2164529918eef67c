"""`make gpu-check`: the whole GPU check in one call, for a bare NVIDIA machine with no network.

The machine is expected to have ``python3`` with torch and transformers (and so numpy) and
nothing of ours. Everything else comes prepared in ``--inputs`` (``make gpu-check-inputs`` on
a machine with the registries): ``wheels/`` holds the client wheel with its static strapd and
the client's binary dependencies (lz4, zstandard, google-crc32c) for CPython 3.10–3.13. The
script installs them with ``pip --no-index --target`` into a scratch directory (the system's
site-packages is not touched) and then, within a time budget (default 8 minutes):

1. **CUDA tests** (docs/GPU.md): the memfd ring registered with ``cudaHostRegister``
   (``_cuda.CudaCopier``); a producer that overwrites a captured tensor in place right after
   the hook (the side-stream copy must hold the value of the hook's moment); exact bf16, fp16
   and fp32 round trips from device tensors through strapd, for every codec the presets use.
2. **Overhead**: a 1B-shape Llama (hidden 2048, 16 layers, GQA 32/8 heads, inter 8192) in
   bf16 built from a config on the GPU; greedy decoding with per-token tracking and prefill
   passes, plain vs ``fast_capture`` vs ``balanced`` capturing every layer's residual,
   attention and MLP outputs, in interleaved rounds (the order rotates each round); kept =
   plain time / captured time per round, the median over rounds.
3. **Resource events** on decoding: ``MINIMAL`` and ``DETAILED`` vs plain; the events must be
   timed by CUDA events (``duration_source: cuda_event``).

It writes ``gpu-check.json`` and ``gpu-check.log`` into ``--out`` (the device tool's ``$OUT``)
and exits non-zero when a correctness test failed; overhead targets (decode ≥ 0.95, prefill
``fast_capture`` ≥ 0.97) are judged in the JSON, not by the exit status.

``--dry-run`` runs the same code on the CPU with a tiny model and one round (CI runs it, so
the script cannot rot); the CUDA-only checks report ``skipped`` with the reason.

Usage::

    python3 bench/gpu_check.py --inputs build/gpu-check --out "$OUT" [--budget-s 480] [--dry-run]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

#: The model of the overhead rounds on a GPU: Llama-3.2-1B's shape (vocab trimmed to 32000).
GPU_MODEL: Dict[str, int] = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "intermediate": 8192,
                             "vocab": 32000}
#: The same rounds on the CPU in a dry run: seconds, not minutes.
DRY_MODEL: Dict[str, int] = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
                             "vocab": 256}
#: Targets of issue 27 on the GPU (kept = plain tokens/s over captured tokens/s).
TARGETS = {"decode_balanced": 0.95, "decode_fast_capture": 0.95, "prefill_fast_capture": 0.97,
           # issue 40: prefill kept with fp8 coded on the GPU over the kept of fast_capture
           "prefill_fp8_device_over_fast_capture": 1.8}

_LOG: Optional[Any] = None
_T0 = time.monotonic()


def log(*msg: Any) -> None:
    line = f"[gpu-check {time.monotonic() - _T0:7.1f}s] " + " ".join(str(m) for m in msg)
    print(line, file=sys.stderr, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()


# ---------------------------------------------------------------------------------------------
# Install from the prepared inputs


def install(inputs: Path, site: Path) -> Dict[str, Any]:
    """Install the client and its binary dependencies from ``inputs/wheels`` into ``site``."""
    wheels = inputs / "wheels"
    ours = sorted(glob.glob(str(wheels / "strap_llm-*.whl")))
    if not ours:
        raise SystemExit(f"gpu-check: no strap_llm wheel in {wheels}: run `make gpu-check-inputs` on a machine "
                         f"with the registries first, then carry {inputs} along")
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(site),
           "--find-links", str(wheels), ours[-1], "lz4", "zstandard", "google-crc32c"]
    log("install:", " ".join(cmd))
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"gpu-check: pip install from {wheels} failed:\n{out.stdout}\n{out.stderr}")
    sys.path.insert(0, str(site))
    import llm_instrumentation

    where = Path(llm_instrumentation.__file__).resolve()
    if site.resolve() not in where.parents:
        raise SystemExit(f"gpu-check: llm_instrumentation imported from {where}, not from {site}")
    strapd = where.parent / "_bin" / "strapd"
    if not os.access(strapd, os.X_OK):
        raise SystemExit(f"gpu-check: the wheel carries no executable strapd at {strapd}")
    os.environ["STRAPD_BIN"] = str(strapd)
    ver = subprocess.run([str(strapd), "version"], capture_output=True, text=True, timeout=30)
    try:
        from llm_instrumentation import _speedups  # type: ignore[attr-defined]  # noqa: F401
        speedups = True
    except ImportError:
        speedups = False
    return {"wheel": os.path.basename(ours[-1]), "seconds": round(time.monotonic() - t0, 2),
            "client": str(where.parent), "strapd": str(strapd), "strapd_version": ver.stdout.strip(),
            "c_extension": speedups, "command": " ".join(cmd)}


def environment(dev: str) -> Dict[str, Any]:
    import torch

    env: Dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cpu_count": os.cpu_count(), "device": dev, "kernel": platform.release()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError as e:
        env["transformers"] = f"missing: {e}"
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_bytes=p.total_memory, cuda=torch.version.cuda,
                   capability=f"{p.major}.{p.minor}")
    smi = shutil.which("nvidia-smi")
    if smi:
        r = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = r.stdout.strip() or r.stderr.strip()
    return env


# ---------------------------------------------------------------------------------------------
# Correctness tests


def _bits(t: Any) -> Any:
    """The tensor's raw bits on the CPU, for bit-for-bit comparison of any dtype."""
    import torch

    t = t.detach().contiguous().cpu()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def test_ring_register(dev: str, tmp: Path) -> Dict[str, Any]:
    """The sealed memfd ring registers as pinned memory; a side-stream copy lands exactly."""
    if dev != "cuda":
        return {"status": "skipped", "why": "no CUDA device (dry run): cudaHostRegister cannot be called"}
    import torch

    from llm_instrumentation._cuda import CudaCopier
    from llm_instrumentation._ring import Ring

    ring = Ring(4096 + 64 * (1 << 20))
    try:
        copier = CudaCopier(ring)
        try:
            src = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
            n = src.numel() * src.element_size()
            dst = ring.u8()[4096:4096 + n].view(torch.bfloat16).view(src.shape)
            t0 = time.perf_counter()
            copier.copy(dst, src)
            dt = time.perf_counter() - t0
            same = bool(torch.equal(_bits(dst), _bits(src)))
            # the bytes are in the memfd itself, not only in the tensor view: read them through the fd
            raw = os.pread(ring.fd, n, 4096)
            via_fd = raw == _bits(src).numpy().tobytes()
            return {"status": "passed" if same and via_fd else "failed", "bytes": n, "copy_s": dt,
                    "gb_per_s": n / dt / 1e9, "equal_view": same, "equal_via_fd": via_fd}
        finally:
            copier.close()
    finally:
        ring.close()


class _Producer:
    """A module that overwrites its submodule's output in place right after the hooks ran."""

    def __new__(cls, dim: int, dev: str, dtype: Any) -> Any:
        import torch
        from torch import nn

        class Producer(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.proj = nn.Linear(dim, dim, bias=False)
                self.spin = nn.Linear(dim, dim, bias=False)

            def forward(self, x: Any) -> Any:
                y = self.proj(x)        # captured here (PUBLISH once the copy's event completed)
                y.mul_(-3.0).add_(1.0)  # overwritten at once on the model's stream
                z = self.spin(y)        # and more work queued behind it
                return z

        torch.manual_seed(0)
        return Producer().to(device=dev, dtype=dtype).eval()


def _captured(path: Path, name: str) -> List[Any]:
    from llm_instrumentation import open_stream

    with open_stream(str(path)) as r:
        return [t.tensor() for t in r.tensors(name)]


def test_overwrite_after_publish(dev: str, tmp: Path, small: bool) -> Dict[str, Any]:
    """Each captured record holds the value of the hook's moment, not the overwritten one:
    16 MiB records (the side-stream path of ``_cuda``) and 8 KiB ones (the model-stream path)."""
    from llm_instrumentation import _cuda

    big = _overwrite_case(dev, tmp, *((64, 8, 4) if small else (4096, 2048, 24)))
    # Small records: the C extension's cudaMemcpyAsync (the session's put_cuda; the copier
    # counts each it queued), then torch's copy_ alone.
    queue = _cuda.CudaCopier.queued_raw
    raw = [0]

    def counted(self: Any, *args: Any) -> None:
        raw[0] += 1
        queue(self, *args)

    _cuda.CudaCopier.queued_raw = counted  # type: ignore[method-assign]
    try:
        little = _overwrite_case(dev, tmp, *((64, 1, 4) if small else (4096, 1, 48)))
        little["raw_copies"] = raw[0]
        # the same ring (kept from the capture before, its copier with it): the switch is
        # read per session, so none of these may take the C path
        os.environ["STRAP_CUDA_RAW_COPY"] = "0"
        try:
            little_copy = _overwrite_case(dev, tmp, *((64, 1, 4) if small else (4096, 1, 48)))
        finally:
            os.environ.pop("STRAP_CUDA_RAW_COPY", None)
    finally:
        _cuda.CudaCopier.queued_raw = queue  # type: ignore[method-assign]
    little_copy["raw_copies"] = raw[0] - little["raw_copies"]
    if little_copy["raw_copies"]:
        little_copy["status"] = "failed"
        little_copy["error"] = "STRAP_CUDA_RAW_COPY=0 did not keep the records on copy_"
    out = {"large": big, "small": little, "small_copy_": little_copy}
    if dev == "cuda":  # a stream of the model's own: CUDA only
        out["small_inner_stream"] = _inner_stream_case(tmp, 64 if small else 4096, 4 if small else 48)
    ok = all(c["status"] == "passed" for c in out.values())
    if dev == "cuda" and raw[0] == 0:
        # the raw path was not taken: say why in the JSON (it is not a failure: copy_ is used)
        out["raw_copy_unavailable"] = {"cudart_paths": sorted(_cuda.cudart_paths()),
                                       "extension": queue is not None}
    return {"status": "passed" if ok else "failed", **out}


def _inner_stream_case(tmp: Path, dim: int, iters: int) -> Dict[str, Any]:
    """A module run by its parent under a stream of its own, behind queued work: its small
    record's copy goes on that stream, and the publish at the end of the pass (on the default
    stream, idle by then) must still wait for it."""
    import torch
    from torch import nn

    from llm_instrumentation import capture_activations

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(dim, dim, bias=False)
            self.s = torch.cuda.Stream()
            self.big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

        def forward(self, x: Any) -> Any:
            self.s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.s):
                for _ in range(20):  # ≈ a few ms queued ahead of the copy on this stream
                    self.big @ self.big
                y = self.proj(x)  # captured here, on self.s
                y.mul_(-3.0)
            # No wait of the default stream for self.s: nothing here consumes y there, so only
            # an event on self.s (the stream the copy was queued on) says when the copy landed.
            return y

    torch.manual_seed(0)
    model = Inner().to(device="cuda", dtype=torch.bfloat16).eval()
    ref: List[Any] = []
    h = model.proj.register_forward_hook(lambda m, a, out: ref.append(out.detach().clone()))
    path = tmp / "inner.strap"
    try:
        with torch.no_grad(), capture_activations(model, preset="fast_capture", output_path=str(path),
                                                  modules=["proj"]):
            for _ in range(iters):
                model(torch.randn(1, dim, device="cuda", dtype=torch.bfloat16))
    finally:
        h.remove()
    got = _captured(path, "proj")
    bad = [i for i, (a, b) in enumerate(zip(got, ref)) if not torch.equal(_bits(a), _bits(b))]
    path.unlink(missing_ok=True)
    return {"status": "passed" if len(got) == iters and not bad else "failed", "records": len(got),
            "expected": iters, "mismatched_records": bad, "bytes_per_record": dim * 2}


def _overwrite_case(dev: str, tmp: Path, dim: int, rows: int, iters: int) -> Dict[str, Any]:
    import torch

    from llm_instrumentation import capture_activations

    model = _Producer(dim, dev, torch.bfloat16)
    ref: List[Any] = []
    # registered before the capture's hook: runs first, clones on the model's stream
    h = model.proj.register_forward_hook(lambda m, a, out: ref.append(out.detach().clone()))
    path = tmp / "overwrite.strap"
    try:
        with torch.no_grad(), capture_activations(model, preset="fast_capture", output_path=str(path),
                                                  modules=["proj"]) as fw:
            for i in range(iters):
                x = torch.randn(rows, dim, device=dev, dtype=torch.bfloat16)
                model(x)
        summ = fw.summary or {}
    finally:
        h.remove()
    got = _captured(path, "proj")
    bad = [i for i, (a, b) in enumerate(zip(got, ref)) if not torch.equal(_bits(a), _bits(b))]
    ok = len(got) == iters and not bad
    path.unlink(missing_ok=True)
    return {"status": "passed" if ok else "failed", "records": len(got), "expected": iters,
            "mismatched_records": bad, "bytes_per_record": rows * dim * 2, "drops": summ.get("drops", 0)}


def test_dtype_roundtrips(dev: str, tmp: Path, small: bool) -> Dict[str, Any]:
    """bf16, fp16 and fp32 device tensors read back bit for bit, through every lossless codec."""
    import torch
    from torch import nn

    from llm_instrumentation import InstrumentationConfig, capture_activations

    dim, rows = (32, 4) if small else (2048, 512)
    out: Dict[str, Any] = {}
    failed = False
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for codec in ("none", "lz4", "zstd", "shuffle"):
            torch.manual_seed(1)
            model = nn.Sequential(nn.Linear(dim, dim), nn.GELU()).to(device=dev, dtype=dtype).eval()
            ref: List[Any] = []
            h = model[1].register_forward_hook(lambda m, a, o: ref.append(o.detach().clone()))
            path = tmp / f"rt-{codec}.strap"
            cfg = InstrumentationConfig.balanced().with_compression(codec)
            try:
                with torch.no_grad(), capture_activations(model, config=cfg, output_path=str(path), modules=["1"]):
                    for _ in range(3):
                        model(torch.randn(rows, dim, device=dev, dtype=dtype) * 8)
            finally:
                h.remove()
            got = _captured(path, "1")
            same = len(got) == 3 and all(a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
                                         for a, b in zip(got, ref))
            key = f"{str(dtype).replace('torch.', '')}/{codec}"
            out[key] = {"equal": same, "records": len(got)}
            failed |= not same
            path.unlink(missing_ok=True)
    return {"status": "failed" if failed else "passed", "cases": out}


def test_fp8_device(dev: str, tmp: Path, small: bool) -> Dict[str, Any]:
    """fp8 coded on the device (issue 40): the payload _fp8_device.encode writes on the GPU is
    the one it writes on the CPU (codes, scales, status and largest errors byte for byte, the
    float64 sums to 1e-12: another reduction order), and a capture with codec fp8 whose CUDA
    tensors the client coded reads back what strapd's own coding of them gives."""
    import torch
    from torch import nn

    from llm_instrumentation import InstrumentationConfig, capture_activations
    from llm_instrumentation import _fp8_device as F

    out: Dict[str, Any] = {}
    failed = False
    g = torch.Generator().manual_seed(40)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, row, bv in ((8, 384, 1 << 19), (7, 384, 1000), (3, 5000, 2048)):
            x = (torch.randn(rows, row, generator=g) * torch.exp(torch.randn(rows, 1, generator=g))).to(dtype)
            x[1] = 0
            cpu = F.encode(x, bv).numpy().tobytes()
            gpu = F.encode(x.to(dev), bv).cpu().numpy().tobytes()
            np_ = F.parts(x.numel(), row, bv)
            so = (16 + 4 * np_ + 7) // 8 * 8
            sums_c = torch.frombuffer(bytearray(cpu[so:so + 32 * np_]), dtype=torch.float64).view(-1, 4)
            sums_g = torch.frombuffer(bytearray(gpu[so:so + 32 * np_]), dtype=torch.float64).view(-1, 4)
            same = cpu[:so] == gpu[:so] and cpu[so + 32 * np_:] == gpu[so + 32 * np_:] \
                and torch.equal(sums_c[:, 3], sums_g[:, 3]) \
                and torch.allclose(sums_g[:, :3], sums_c[:, :3], rtol=1e-12, atol=0)
            key = f"{str(dtype).replace('torch.', '')}/{rows}x{row}/blocks{bv}"
            out[key] = {"equal": same, "sums_bit_equal": bool(torch.equal(sums_c[:, :3], sums_g[:, :3]))}
            failed |= not same
    dim, n = (32, 4) if small else (2048, 512)
    got: Dict[str, List[Any]] = {}
    for mode in ("cuda", "off"):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(dim, dim), nn.GELU()).to(device=dev, dtype=torch.bfloat16).eval()
        path = tmp / f"fp8-{mode}.strap"
        os.environ["STRAP_FP8_CLIENT"] = mode
        try:
            with torch.no_grad(), capture_activations(model, config=InstrumentationConfig.balanced().with_compression(
                    "fp8"), output_path=str(path), modules=["1"]):
                for _ in range(3):
                    model(torch.randn(n, dim, device=dev, dtype=torch.bfloat16) * 8)
        finally:
            os.environ.pop("STRAP_FP8_CLIENT", None)
        got[mode] = _captured(path, "1")
        path.unlink(missing_ok=True)
    same = len(got["cuda"]) == len(got["off"]) == 3 and all(torch.equal(_bits(a), _bits(b))
                                                            for a, b in zip(got["cuda"], got["off"]))
    out["capture_coded_on_device_reads_as_strapd_coded"] = same
    failed |= not same
    return {"status": "failed" if failed else "passed", "cases": out}


# ---------------------------------------------------------------------------------------------
# Diagnostics: the machine's own limits, to read the overhead figures against


def _gbps(n: int, secs: List[float]) -> float:
    return round(n / statistics.median(secs) / 1e9, 2)


def diagnostics(dev: str, tmp: Path, small: bool) -> Dict[str, Any]:
    """Copy bandwidths (device→registered ring, →pinned, →pageable, device→device), whether
    ``Event.synchronize`` frees the interpreter lock, and the scratch disk's write rate."""
    import threading

    import torch

    out: Dict[str, Any] = {}
    n = (4 << 20) if small else (64 << 20)
    # the disk the captures go to: write n*16 bytes (1 GiB on a GPU) and fdatasync
    buf = os.urandom(1 << 20) * 16
    total = n * 16
    p = tmp / "disk-probe.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        left = total
        while left > 0:
            left -= os.write(fd, buf[:min(left, len(buf))])
        os.fdatasync(fd)
        out["disk_write_fdatasync_gb_per_s"] = round(total / (time.perf_counter() - t) / 1e9, 2)
    finally:
        os.close(fd)
        p.unlink(missing_ok=True)
    out["disk_probe_bytes"] = total
    if dev != "cuda":
        out["gpu"] = "skipped: no CUDA device (dry run)"
        return out
    from llm_instrumentation._cuda import CudaCopier
    from llm_instrumentation._ring import Ring

    src = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def timed(fn: Callable[[], None], reps: int = 5) -> List[float]:
        fn()
        torch.cuda.synchronize()
        secs = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            secs.append(time.perf_counter() - t)
        return secs

    pinned = torch.empty(n // 2, dtype=torch.bfloat16, pin_memory=True)
    pageable = torch.empty(n // 2, dtype=torch.bfloat16)
    out["d2h_pinned_gb_per_s"] = _gbps(n, timed(lambda: pinned.copy_(src, non_blocking=True)))
    out["d2h_pageable_gb_per_s"] = _gbps(n, timed(lambda: pageable.copy_(src)))
    out["d2d_clone_gb_per_s"] = _gbps(n, timed(lambda: src.clone()))
    ring = Ring(4096 + 2 * n)
    try:
        cop = CudaCopier(ring)
        try:
            dst = ring.u8()[4096:4096 + n].view(torch.bfloat16)
            out["ring_is_pinned"] = bool(dst.is_pinned())
            out["d2h_registered_ring_gb_per_s"] = _gbps(n, timed(lambda: dst.copy_(src, non_blocking=True)))

            def via_copier() -> None:
                cop.copy(dst, src)
                cop.pending(1, 1)
                cop.wait()

            out["copier_gb_per_s"] = _gbps(n, timed(via_copier))
            # the model thread's time to queue one small record's copy (decode-sized: 4 KiB)
            small_src = src[:2048]
            small_dst = ring.u8()[4096:4096 + 4096].view(torch.bfloat16)
            t = time.perf_counter()
            for _ in range(200):
                cop.copy(small_dst, small_src)
                cop.pending(1, 1)
            queued = (time.perf_counter() - t) / 200
            cop.wait()
            out["copier_queue_us_per_4kib_record"] = round(queued * 1e6, 1)
        finally:
            cop.close()
    finally:
        ring.close()
    # Does a thread waiting in Event.synchronize() let another Python thread run?
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    def gil_share(wait: Callable[[Any], None]) -> float:
        for _ in range(80):  # ≈ 100 ms of matrix products queued, before the other thread runs
            a @ a
        ev = torch.cuda.Event()
        ev.record()
        th = threading.Thread(target=spin)
        th.start()
        c0, t0 = count[0], time.perf_counter()
        wait(ev)
        dt = time.perf_counter() - t0
        c1 = count[0]
        stop.set()
        th.join()
        stop.clear()
        return round((c1 - c0) / dt, 0)

    from llm_instrumentation._cuda import wait_event

    out["other_thread_loops_per_s_during_synchronize"] = gil_share(lambda ev: ev.synchronize())
    out["other_thread_loops_per_s_during_wait_event"] = gil_share(wait_event)
    th_t = time.perf_counter()
    c = 0
    while time.perf_counter() - th_t < 0.05:
        c += 1
    out["loops_per_s_alone"] = round(c / 0.05, 0)
    return out


def strapd_cpu_s() -> Optional[float]:
    """User + system CPU seconds of the running strapd processes (None: none found)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, found = 0.0, False
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        if st[st.index("(") + 1:st.rindex(")")] != "strapd":
            continue
        fields = st[st.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / tick
        found = True
    return total if found else None


# ---------------------------------------------------------------------------------------------
# Overhead rounds


def build_llama(m: Dict[str, int], dev: str, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=m["hidden"], intermediate_size=m["intermediate"], num_hidden_layers=m["layers"],
                      num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], vocab_size=m["vocab"],
                      max_position_embeddings=8192)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def _sync(dev: str) -> None:
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()


def _cache_kw(out: Any) -> Dict[str, Any]:
    if "cache" in out:
        return {"cache": out["cache"]}
    return {"past_key_values": out.past_key_values}


def greedy(model: Any, prompt: Any, n: int, fw: Any = None) -> List[int]:
    out = model(input_ids=prompt, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ids = []
    for _ in range(n):
        tid = int(nxt)  # a sync point per token, as in every real decoding loop
        ids.append(tid)
        if fw is not None:
            fw.record_token(tid, str(tid))
        out = model(input_ids=nxt, use_cache=True, **_cache_kw(out))
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return ids


def rounds(variants: Dict[str, Callable[[], Dict[str, Any]]], budget_s: float, max_rounds: int,
           min_rounds: int) -> List[Dict[str, Dict[str, Any]]]:
    """Run every variant once per round, rotating the order, until the budget or ``max_rounds``."""
    names = list(variants)
    for n in names:  # warm-up: kernels, allocator, daemon start
        variants[n]()
    out: List[Dict[str, Dict[str, Any]]] = []
    t0 = time.monotonic()
    per_round = None
    while len(out) < max_rounds:
        if len(out) >= min_rounds and per_round is not None and time.monotonic() - t0 + per_round > budget_s:
            break
        r0 = time.monotonic()
        k = len(out) % len(names)
        row = {n: variants[n]() for n in names[k:] + names[:k]}
        out.append(row)
        per_round = time.monotonic() - r0
        log("  round", len(out), " ".join(
            f"{n}={row[n]['s']:.3f}s" + (f"(strapd {row[n]['strapd_cpu_s']:.3f} cpu-s)"
                                         if row[n].get("strapd_cpu_s") is not None else "") for n in names))
    return out


def kept(rows: List[Dict[str, Dict[str, Any]]], base: str, name: str) -> Dict[str, Any]:
    ratios = [r[base]["s"] / r[name]["s"] for r in rows]
    return {"kept": statistics.median(ratios), "kept_min": min(ratios), "kept_max": max(ratios),
            "s_median": statistics.median(r[name]["s"] for r in rows)}


def perf(dev: str, tmp: Path, m: Dict[str, int], a: argparse.Namespace, budget_s: float) -> Dict[str, Any]:
    import torch

    from llm_instrumentation import InstrumentationConfig, capture_activations

    t0 = time.monotonic()
    model = build_llama(m, dev, torch.bfloat16)
    log(f"model built in {time.monotonic() - t0:.1f}s:", m, "bf16 on", dev)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, m["vocab"], (1, a.prompt), generator=gen).to(dev)
    prefill = torch.randint(0, m["vocab"], (1, a.prefill), generator=gen).to(dev)
    path = tmp / "perf.strap"
    res: Dict[str, Any] = {"model": m, "dtype": "bfloat16", "prompt_tokens": a.prompt, "new_tokens": a.new,
                           "prefill_tokens": a.prefill, "prefill_passes": a.passes,
                           "capture_set": "every layer's residual + attention + MLP (full_tensor)"}
    ids_plain: List[int] = []

    def decode_plain() -> Dict[str, Any]:
        _sync(dev)
        t = time.perf_counter()
        ids = greedy(model, prompt, a.new)
        _sync(dev)
        ids_plain[:] = ids
        return {"s": time.perf_counter() - t}

    def decode_captured(preset: str, level: Optional[str] = None, keep: bool = False,
                        raw_copy: bool = True) -> Callable[[], Dict[str, Any]]:
        cfg = InstrumentationConfig.from_preset(preset).with_granularity("full_tensor")

        def run() -> Dict[str, Any]:
            _sync(dev)
            c0 = strapd_cpu_s() or 0.0
            # read when the session's copier is made: the C extension's cudaMemcpyAsync per
            # small record (the default), or torch's copy_ for every one
            os.environ["STRAP_CUDA_RAW_COPY"] = "1" if raw_copy else "0"
            t = time.perf_counter()
            try:
                with capture_activations(model, config=cfg, output_path=str(path), track_per_token=True,
                                         resource_level=level) as fw:
                    t_in = time.perf_counter()
                    ids = greedy(model, prompt, a.new, fw)
                    _sync(dev)
                    t_out = time.perf_counter()
            finally:
                os.environ.pop("STRAP_CUDA_RAW_COPY", None)
            s = time.perf_counter() - t
            c1 = strapd_cpu_s()
            summ = fw.summary or {}
            if ids_plain and ids != ids_plain:
                raise RuntimeError(f"greedy ids differ under {preset}/{level}: the capture changed the model")
            if summ.get("drops"):
                raise RuntimeError(f"{preset}: capture dropped {summ['drops']} tensors")
            row = {"s": s, "packets": int(summ.get("packets", 0)), "bytes_in": int(summ.get("bytes_in", 0)),
                   "strapd_cpu_s": None if c1 is None else round(c1 - c0, 4),
                   "open_s": round(t_in - t, 4), "close_s": round(t + s - t_out, 4)}
            if keep:
                row["resource_log"] = _resource_summary(Path(str(path) + ".resources.jsonl"))
            _cleanup(path)
            return row

        return run

    def prefill_plain() -> Dict[str, Any]:
        _sync(dev)
        t = time.perf_counter()
        for _ in range(a.passes):
            model(input_ids=prefill, use_cache=False)
        _sync(dev)
        return {"s": time.perf_counter() - t}

    def prefill_captured(preset: str, fp8_client: Optional[str] = None) -> Callable[[], Dict[str, Any]]:
        """``fp8_client``: codec fp8, coded on the GPU ("cuda") or by strapd ("off")."""
        cfg = InstrumentationConfig.from_preset(preset).with_granularity("full_tensor")
        if fp8_client:
            cfg = cfg.with_compression("fp8")

        def run() -> Dict[str, Any]:
            _sync(dev)
            c0 = strapd_cpu_s() or 0.0
            if fp8_client:
                os.environ["STRAP_FP8_CLIENT"] = fp8_client  # read when the session is made
            t = time.perf_counter()
            try:
                with capture_activations(model, config=cfg, output_path=str(path)) as fw:
                    for _ in range(a.passes):
                        model(input_ids=prefill, use_cache=False)
                    _sync(dev)
                    t_passes = time.perf_counter() - t  # the passes, before the drain at close
            finally:
                os.environ.pop("STRAP_FP8_CLIENT", None)
            s = time.perf_counter() - t  # includes the drain at close
            c1 = strapd_cpu_s()
            summ = fw.summary or {}
            if summ.get("drops"):
                raise RuntimeError(f"{preset}: capture dropped {summ['drops']} tensors")
            _cleanup(path)
            return {"s": s, "passes_s": round(t_passes, 4), "packets": int(summ.get("packets", 0)),
                    "bytes_in": int(summ.get("bytes_in", 0)),
                    "strapd_cpu_s": None if c1 is None else round(c1 - c0, 4)}

        return run

    sections = [x for x in ("decode", "prefill", "resources") if x in a.sections]
    share = budget_s / max(len(sections), 1)
    with torch.no_grad():
        if "decode" in sections:
            names = ("fast_capture", "balanced", "fast_capture_copy_")
            log("decode rounds: plain, " + ", ".join(names))
            d = rounds({"plain": decode_plain, "fast_capture": decode_captured("fast_capture"),
                        "balanced": decode_captured("balanced"),
                        "fast_capture_copy_": decode_captured("fast_capture", raw_copy=False)},
                       share, a.max_rounds, a.min_rounds)
            res["decode"] = {n: kept(d, "plain", n) for n in names}
            res["decode"]["plain_tok_s"] = a.new / statistics.median(r["plain"]["s"] for r in d)
            res["decode"]["rounds"] = d
        if "prefill" in sections:
            names = ("fast_capture", "balanced", "fp8_device", "fp8_strapd")
            log("prefill rounds: plain, " + ", ".join(names))
            p = rounds({"plain": prefill_plain, "fast_capture": prefill_captured("fast_capture"),
                        "balanced": prefill_captured("balanced"),
                        "fp8_device": prefill_captured("fast_capture", "cuda"),
                        "fp8_strapd": prefill_captured("fast_capture", "off")}, share, a.max_rounds, a.min_rounds)
            res["prefill"] = {n: kept(p, "plain", n) for n in names}
            res["prefill"]["rounds"] = p
        if "resources" in sections:
            log("resource-event rounds: plain, MINIMAL, DETAILED (a standalone monitor, no tensor capture)")
            r = rounds({"plain": decode_plain, "minimal": decode_resources("MINIMAL", model, prompt, a, dev, path),
                        "detailed": decode_resources("DETAILED", model, prompt, a, dev, path)},
                       share, a.max_rounds, a.min_rounds)
            res["resources"] = {n: kept(r, "plain", n) for n in ("minimal", "detailed")}
            res["resources"]["rounds"] = r
            res["resources"]["log"] = {n: r[-1][n].get("resource_log") for n in ("minimal", "detailed")}
        if a.profile:
            res["profiles"] = profile({"decode_plain": decode_plain,
                                       "decode_fast_capture": decode_captured("fast_capture"),
                                       "resources_minimal": decode_resources("MINIMAL", model, prompt, a, dev, path)},
                                      Path(a.out))
    return res


def profile(trials: Dict[str, Callable[[], Dict[str, Any]]], out: Path) -> Dict[str, str]:
    """One more trial of each under cProfile (the model's thread); the top functions by own
    time into ``profile-NAME.txt``. cProfile slows Python calls: read the shares, not the
    seconds."""
    import cProfile
    import io
    import pstats

    files = {}
    for name, fn in trials.items():
        pr = cProfile.Profile()
        pr.enable()
        fn()
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(40)
        pstats.Stats(pr, stream=buf).sort_stats("cumtime").print_stats("llm_instrumentation", 30)
        f = out / f"profile-{name}.txt"
        f.write_text(buf.getvalue())
        files[name] = str(f)
        log(f"profile {name}: {f}")
    return files


def decode_resources(level: str, model: Any, prompt: Any, a: argparse.Namespace, dev: str,
                     path: Path) -> Callable[[], Dict[str, Any]]:
    """Decoding with resource events at ``level`` and no tensor capture (an empty module set)."""
    from llm_instrumentation.resources import monitor_resources

    log_path = path.with_suffix(f".{level.lower()}.resources.jsonl")

    def run() -> Dict[str, Any]:
        _sync(dev)
        t = time.perf_counter()
        with monitor_resources(model, level=level, path=str(log_path)) as mon:
            out = model(input_ids=prompt, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for step in range(a.new):
                int(nxt)
                mon.set_step(step + 1)
                out = model(input_ids=nxt, use_cache=True, **_cache_kw(out))
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(dev)
        s = time.perf_counter() - t
        row = {"s": s, "resource_log": _resource_summary(log_path)}
        log_path.unlink(missing_ok=True)
        return row

    return run


def _resource_summary(p: Path) -> Dict[str, Any]:
    if not p.exists():
        return {"missing": str(p)}
    types: Dict[str, int] = {}
    sources: Dict[str, int] = {}
    cost: Dict[str, Any] = {}
    with open(p) as f:
        for line in f:
            ev = json.loads(line)
            types[ev.get("event", "?")] = types.get(ev.get("event", "?"), 0) + 1
            if "duration_source" in ev:
                sources[ev["duration_source"]] = sources.get(ev["duration_source"], 0) + 1
            if ev.get("event") == "resource_session_summary":
                # The monitor's own cost: the model thread's hooks and the writer thread's CPU
                # (the writer holds the interpreter lock the model's thread needs).
                cost = {k: ev.get(k) for k in ("monitor_hook_us", "monitor_writer_cpu_us")}
    return {"events": sum(types.values()), "event_types": types, "duration_sources": sources, **cost}


def _cleanup(path: Path) -> None:
    for p in glob.glob(str(path) + "*"):
        os.unlink(p)


# ---------------------------------------------------------------------------------------------


def main() -> int:
    global _LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", default="build/gpu-check", help="prepared by `make gpu-check-inputs`")
    ap.add_argument("--out", default=os.environ.get("OUT") or "build/gpu-check/out")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, one round: check the script itself")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of the whole check")
    ap.add_argument("--prompt", type=int, default=None)
    ap.add_argument("--new", type=int, default=None, help="generated tokens per decode trial")
    ap.add_argument("--prefill", type=int, default=None, help="tokens per prefill pass")
    ap.add_argument("--passes", type=int, default=3, help="prefill passes per trial (the drain included)")
    ap.add_argument("--max-rounds", type=int, default=None)
    ap.add_argument("--min-rounds", type=int, default=None)
    ap.add_argument("--sections", default="decode,prefill,resources",
                    help="which overhead rounds to run (comma-separated); targets of the others are not judged")
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, one trial each under cProfile: profile-*.txt in --out")
    a = ap.parse_args()
    dry = a.dry_run
    a.prompt = a.prompt or (8 if dry else 32)
    a.new = a.new or (6 if dry else 64)
    a.prefill = a.prefill or (32 if dry else 1024)
    a.max_rounds = a.max_rounds or (1 if dry else 9)
    a.min_rounds = a.min_rounds or (1 if dry else 3)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    _LOG = open(out / "gpu-check.log", "w")
    scratch = Path(tempfile.mkdtemp(prefix="strap-gpu-check-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(scratch))  # the autostarted strapd's socket lives here
    os.environ["STRAPD_EXIT_IDLE"] = "30s"
    res: Dict[str, Any] = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "dry_run": dry,
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tests": {}}
    failed = False
    try:
        res["install"] = install(Path(a.inputs), scratch / "site")
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev == "cpu" and not dry:
            raise SystemExit("gpu-check: torch sees no CUDA device; use --dry-run to check the script on a CPU")
        res["environment"] = environment(dev)
        log("environment:", json.dumps(res["environment"]))
        tests: List[Tuple[str, Callable[[], Dict[str, Any]]]] = [
            ("ring_register", lambda: test_ring_register(dev, scratch)),
            ("overwrite_after_publish", lambda: test_overwrite_after_publish(dev, scratch, dry)),
            ("dtype_roundtrips", lambda: test_dtype_roundtrips(dev, scratch, dry)),
            ("fp8_device", lambda: test_fp8_device(dev, scratch, dry)),
        ]
        for name, fn in tests:
            t0 = time.monotonic()
            try:
                r = fn()
            except Exception as e:  # a test that raises is a failed test, and the rest still run
                r = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            r["seconds"] = round(time.monotonic() - t0, 2)
            res["tests"][name] = r
            failed |= r["status"] == "failed"
            log(f"test {name}: {r['status']}", {k: v for k, v in r.items() if k not in ("traceback", "cases")})
            if r["status"] == "failed" and "traceback" in r:
                log(r["traceback"])
        try:
            res["diagnostics"] = diagnostics(dev, scratch, dry)
        except Exception as e:  # a diagnostic that breaks is reported, and the rounds still run
            res["diagnostics"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        log("diagnostics:", json.dumps(res["diagnostics"]))
        left = a.budget_s - (time.monotonic() - _T0) - 30  # 30 s for writing and the daemon's exit
        try:
            res["perf"] = perf(dev, scratch, DRY_MODEL if dry else GPU_MODEL, a, max(left, 10.0))
            res["targets"] = judge(res["perf"], dry)
            for k, v in res["targets"].items():
                log(f"target {k}: {v}")
        except Exception as e:
            failed = True
            res["perf_error"] = f"{type(e).__name__}: {e}"
            log("perf failed:", traceback.format_exc())
    finally:
        res["seconds"] = round(time.monotonic() - _T0, 1)
        res["status"] = "failed" if failed else "passed"
        with open(out / "gpu-check.json", "w") as f:
            json.dump(res, f, indent=1, default=str)
        log(f"done in {res['seconds']}s: {res['status']}; wrote {out / 'gpu-check.json'}")
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


def judge(p: Dict[str, Any], dry: bool) -> Dict[str, Any]:
    got: Dict[str, float] = {}
    if "decode" in p:
        got.update(decode_balanced=p["decode"]["balanced"]["kept"],
                   decode_fast_capture=p["decode"]["fast_capture"]["kept"])
    if "prefill" in p:
        got["prefill_fast_capture"] = p["prefill"]["fast_capture"]["kept"]
        got["prefill_fp8_device_over_fast_capture"] = p["prefill"]["fp8_device"]["kept"] / p["prefill"]["fast_capture"]["kept"]
    out: Dict[str, Any] = {}
    for k, target in TARGETS.items():
        if k not in got:
            out[k] = {"target": target, "met": None, "why": "not run (--sections)"}
            continue
        out[k] = {"kept": round(got[k], 4), "target": target,
                  "met": None if dry else got[k] >= target}  # a CPU dry run judges nothing
    if "resources" not in p:
        return out
    detailed = p["resources"]["log"].get("detailed") or {}
    src = detailed.get("duration_sources", {})
    out["resource_events_cuda_timed"] = {"duration_sources": src,
                                         "met": None if dry else bool(src.get("cuda_event"))}
    return out


if __name__ == "__main__":
    sys.exit(main())
