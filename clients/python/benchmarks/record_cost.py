"""The client's fixed cost per record, for decode-size tensors (docs/PERFORMANCE.md 5).

A token-by-token decoder writes many small records: one ``1 x 1 x hidden`` output per hooked
module per forward pass. Their cost is Python, not bytes: the hook, the record header, the
copy into the ring, the publication. This measures it without a model's compute in the way:
a stand-in with the module layout of a Llama decoder (``model.layers.N`` with ``self_attn``
and ``mlp`` children, each returning its input), hooked with the ``full_tensor`` set, so one
forward pass writes ``3 x layers`` records and ends with one PUBLISH, exactly as a decode
step of the real model does.

Each round times ``--forwards`` plain forward passes (no capture) and the same number inside
an open capture (session open and close are outside the timed part), in alternating order.
Per record = (captured - plain) / (forwards x records per forward), for the main thread's CPU
time (``time.thread_time``: waiting for the daemon and other processes' load do not count)
and for wall time. The median over rounds is printed with the range, then a cProfile top
list of one captured round by own time.

Usage::

    python clients/python/benchmarks/record_cost.py [--socket S | --strapd bin/strapd] \\
        [--rounds 9] [--forwards 200] [--hidden 512] [--layers 8] [--preset balanced] [--json out.json]

Without ``--socket`` it starts ``--strapd`` (default ``bin/strapd`` of this repository) on a
temporary socket and stops it at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.nn as nn

from llm_instrumentation import InstrumentationConfig, capture_activations

REPO = Path(__file__).resolve().parents[3]


class _Passthrough(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = _Passthrough()
        self.mlp = _Passthrough()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.self_attn(x)
        self.mlp(x)
        return x


class _Inner(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(layers))


class DecoderShape(nn.Module):
    """Llama's module names and call order, no compute: every hooked module returns its input."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.model = _Inner(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.model.layers:
            x = b(x)
        return x


def start_strapd(binary: str, d: str, name: str = "strapd", extra: Sequence[str] = ()) -> Tuple[subprocess.Popen, str]:
    """Start ``strapd serve`` on ``d/<name>.sock`` (log ``d/<name>.log``) with ``extra`` flags;
    return once it accepts connections."""
    sock = os.path.join(d, f"{name}.sock")
    log = open(os.path.join(d, f"{name}.log"), "wb")
    proc = subprocess.Popen([binary, "serve", "--socket", sock, *extra], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"strapd {name} exited {proc.returncode}; see {d}/{name}.log")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(sock)
            return proc, sock
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"strapd {name} did not come up") from None
            time.sleep(0.05)
        finally:
            s.close()


def timed(fn: Any) -> Tuple[float, float]:
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="a running strapd (default: start --strapd)")
    ap.add_argument("--strapd", default=str(REPO / "bin" / "strapd"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--forwards", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="strap-rc-", dir="/tmp")
    proc = None
    try:
        sock = a.socket
        if sock is None:
            proc, sock = start_strapd(a.strapd, tmp)
        model = DecoderShape(a.layers).eval()
        cfg = InstrumentationConfig.from_preset(a.preset).with_granularity("full_tensor")
        x = torch.randn(1, 1, a.hidden)
        path = os.path.join(tmp, "rc.strap")
        per_forward = 3 * a.layers

        def forwards() -> None:
            for _ in range(a.forwards):
                model(x)

        def captured(prof: Any = None) -> Tuple[float, float]:
            with capture_activations(model, config=cfg, output_path=path, socket_path=sock,
                                     autostart_daemon=False) as fw:
                model(x)  # the first record of a session maps the ring view: not per-record cost
                if prof is not None:
                    prof.enable()
                r = timed(forwards)
                if prof is not None:
                    prof.disable()
            summ = fw.summary or {}
            want = (a.forwards + 1) * per_forward
            if summ.get("packets") != want or summ.get("drops"):
                raise RuntimeError(f"session wrote {summ.get('packets')} packets, {summ.get('drops')} drops; "
                                   f"expected {want}, 0")
            os.remove(path)
            return r

        with torch.no_grad():
            forwards()
            captured()
            rows: List[Dict[str, float]] = []
            for i in range(a.rounds):
                if i % 2 == 0:
                    pc, pw = timed(forwards)
                    cc, cw = captured()
                else:
                    cc, cw = captured()
                    pc, pw = timed(forwards)
                n = a.forwards * per_forward
                rows.append({"cpu_us": (cc - pc) / n * 1e6, "wall_us": (cw - pw) / n * 1e6,
                             "plain_cpu_us_per_forward": pc / a.forwards * 1e6})
                print(f"round {i}: {rows[-1]['cpu_us']:.1f} us/record cpu, {rows[-1]['wall_us']:.1f} wall",
                      file=sys.stderr, flush=True)
            prof_text = ""
            if not a.no_profile:
                prof = cProfile.Profile(time.thread_time)  # CPU time: preemption by other load is not ours
                captured(prof)
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
                prof_text = s.getvalue()

        cpu = [r["cpu_us"] for r in rows]
        wall = [r["wall_us"] for r in rows]
        res = {"preset": a.preset, "hidden": a.hidden, "layers": a.layers, "records_per_forward": per_forward,
               "forwards_per_round": a.forwards, "rounds": a.rounds,
               "cpu_us_per_record": statistics.median(cpu), "cpu_us_min": min(cpu), "cpu_us_max": max(cpu),
               "wall_us_per_record": statistics.median(wall), "wall_us_min": min(wall), "wall_us_max": max(wall),
               "plain_cpu_us_per_forward": statistics.median(r["plain_cpu_us_per_forward"] for r in rows),
               "trials": rows}
        print(f"median client cost per record ({a.preset}, 1x1x{a.hidden} fp32, {per_forward} records/forward): "
              f"{res['cpu_us_per_record']:.1f} us CPU [{min(cpu):.1f}..{max(cpu):.1f}], "
              f"{res['wall_us_per_record']:.1f} us wall [{min(wall):.1f}..{max(wall):.1f}] over {a.rounds} rounds")
        if prof_text:
            print(prof_text)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
