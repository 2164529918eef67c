"""Rings and the daemon's memory budget (docs/DEPLOY.md "Rings and the memory budget"),
through real processes and the real strapd:

- eight ranks of a small model, every setting default, one daemon started with default
  flags: all eight capture at once and every stream verifies (before, each default ring
  took 256 MiB and its compression reserve as much again: the eighth was refused by the
  4 GiB budget);
- the same with one rank asking for a ring larger than the budget has room for: that rank
  gets an error naming the budget setting and its own, the seven others verify;
- a capture arriving when the budget is short, with the default ring: it gets a smaller
  ring, a warning naming ``strapd serve --memory-limit``, and captures bit for bit;
- the default ring follows the hooked modules' bytes per forward, within its floor and
  ceiling, and an explicit ``max_memory_gb`` is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import strapd_bin, tiny_gpt2

from llm_instrumentation import InstrumentationConfig, capture_activations, open_stream
from llm_instrumentation._ringsize import auto_ring_size
from llm_instrumentation.config import AUTO_RING_MIN_BYTES, DEFAULT_RING_BYTES
from llm_instrumentation.errors import StrapdProtocolError

HERE = Path(__file__).resolve().parent
MODULE = "transformer.h.1.mlp"


def start_ranks(sock: str, outdir: Path, n: int, explicit: dict = {}, started: int = 0) -> list:
    """Start ranks 0..n-1 of n (only the first ``started`` when not 0) of budget_rank.py;
    ``explicit`` maps a rank to the max_memory_gb it asks for."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return [subprocess.Popen([sys.executable, str(HERE / "budget_rank.py"), sock, str(outdir), str(r), str(n),
                              *([str(explicit[r])] if r in explicit else [])],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(HERE))
            for r in range(started or n)]


def wait_all(procs: list) -> list:
    out = []
    for p in procs:
        so, se = p.communicate(timeout=420)
        out.append((p.returncode, so, se))
    return out


def check_stream(path: Path, expect: Path) -> dict:
    """Complete, bit for bit what the rank's hook saw, and ``strapd verify`` passes;
    returns the transport the capture recorded."""
    with open_stream(path) as r:
        end = r.end()
        assert end is not None and end.meta["status"] == "complete", path
        got = r.tensors(MODULE)
        want = torch.load(expect)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert torch.equal(torch.from_numpy(g.numpy()).reshape(w.shape), w), f"{path}: {MODULE} differs"
        transport = r.metadata["client_metadata"]["transport"]
    v = subprocess.run([str(strapd_bin()), "verify", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return transport


def test_eight_ranks_all_defaults(real_strapd, tmp_path):
    results = wait_all(start_ranks(real_strapd.socket, tmp_path, 8))
    for rank, (rc, so, se) in enumerate(results):
        assert rc == 0, f"rank {rank}: {so[-2000:]}{se[-4000:]}\n{real_strapd.log_tail()}"
    for rank in range(8):
        t = check_stream(tmp_path / f"cap{rank}.strap", tmp_path / f"expect.{rank}.pt")
        assert t["ring_size"] == AUTO_RING_MIN_BYTES, t  # a tiny model: the floor


def test_eighth_rank_asks_too_much(strapd_factory, tmp_path):
    # 256 MiB of budget: seven default rings (4 MiB and their reserve each, with room for
    # some O_DIRECT staging) fit; rank 7's 256 MiB ring and its reserve cannot.
    d = strapd_factory("--memory-limit", "256MiB")
    results = wait_all(start_ranks(d.socket, tmp_path, 8, explicit={7: 0.25}))
    rc, so, se = results[7]
    assert rc == 3, f"rank 7: {so}{se[-3000:]}"
    assert "memory_budget" in so and "strapd serve --memory-limit" in so and "max_memory_gb" in so, so
    assert not (tmp_path / "cap7.strap").exists() or os.path.getsize(tmp_path / "cap7.strap") == 0
    for rank in range(7):
        rc, so, se = results[rank]
        assert rc == 0, f"rank {rank}: {so[-2000:]}{se[-4000:]}\n{d.log_tail()}"
        assert "memory" not in se, se  # no warning: their rings fitted as asked
        t = check_stream(tmp_path / f"cap{rank}.strap", tmp_path / f"expect.{rank}.pt")
        assert t["ring_size"] == AUTO_RING_MIN_BYTES, t


def test_short_budget_gives_a_smaller_ring(strapd_factory, tmp_path, one_torch_thread):
    # 12 MiB: one default ring of this model (4 MiB plus its 4 MiB compression reserve)
    # fits; a second capture finds about 4 MiB left.
    d = strapd_factory("--memory-limit", "12MiB")
    holder = start_ranks(d.socket, tmp_path, 2, started=1)  # rank 0 of 2: holds its session until live.1 exists
    deadline = time.monotonic() + 240
    while not (tmp_path / "live.0").exists():
        assert holder[0].poll() is None, holder[0].communicate()
        assert time.monotonic() < deadline, "rank 0 never opened"
        time.sleep(0.05)
    model = tiny_gpt2()
    seen = []
    model.get_submodule(MODULE).register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    g = torch.Generator().manual_seed(7)
    path = tmp_path / "short.strap"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with capture_activations(model, output_path=path, socket_path=d.socket, autostart_daemon=False):
                with torch.no_grad():
                    for _ in range(3):
                        model(torch.randint(0, 1000, (1, 16), generator=g))
    finally:
        (tmp_path / "live.1").touch()
    rc, so, se = wait_all(holder)[0]
    assert rc == 0, so + se
    msgs = [str(w.message) for w in caught if "memory budget" in str(w.message)]
    assert len(msgs) == 1 and "strapd serve --memory-limit" in msgs[0] and "max_memory_gb" in msgs[0], \
        [str(w.message) for w in caught]
    torch.save(seen, tmp_path / "expect.short.pt")
    t = check_stream(path, tmp_path / "expect.short.pt")
    assert 64 << 10 < t["ring_size"] < AUTO_RING_MIN_BYTES and t["ring_shrunk_by_budget_from"] == AUTO_RING_MIN_BYTES, t
    check_stream(tmp_path / "cap0.strap", tmp_path / "expect.0.pt")


def test_short_budget_refuses_an_explicit_ring(strapd_factory, tmp_path):
    d = strapd_factory("--memory-limit", "12MiB")
    model = tiny_gpt2()
    with pytest.raises(StrapdProtocolError) as e:
        with capture_activations(model, output_path=tmp_path / "x.strap", socket_path=d.socket,
                                 autostart_daemon=False, config=InstrumentationConfig(max_memory_gb=0.03125)):
            pass
    assert e.value.code == "memory_budget"
    assert "strapd serve --memory-limit" in str(e.value) and "max_memory_gb" in str(e.value), str(e.value)


def test_default_ring_from_module_shapes():
    from transformers import GPT2Config, GPT2LMHeadModel

    small = tiny_gpt2()
    names = [f"transformer.h.{i}{s}" for i in range(3) for s in ("", ".attn", ".mlp")]
    # 9 modules x 128 wide x 4 B x 128 tokens (its context) x 4 forwards = 2.25 MiB: the floor
    assert auto_ring_size(small, names)[0] == AUTO_RING_MIN_BYTES
    mid = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=100, n_positions=2048)).eval()
    names = [f"transformer.h.{i}{s}" for i in range(4) for s in ("", ".attn", ".mlp")]
    ring, how = auto_ring_size(mid, names)
    assert ring == 12 * 64 * 4 * 1024 * 4, how  # 12 MiB: between floor and ceiling, 1024 tokens
    assert auto_ring_size(mid.half(), names)[0] == ring // 2  # fp16 activations: half the bytes
    # a module whose width is known: the LM head writes vocab-wide logits
    assert auto_ring_size(mid, ["lm_head"])[0] == max(100 * 4 * 1024 * 4 // 4096 * 4096, AUTO_RING_MIN_BYTES)
    with torch.device("meta"):  # shapes only: no 800 MB of weights
        big = GPT2LMHeadModel(GPT2Config(n_embd=2048, n_layer=4, n_head=4, vocab_size=100, n_positions=4096))
    names = [f"transformer.h.{i}{s}" for i in range(4) for s in ("", ".attn", ".mlp")]
    ring, how = auto_ring_size(big, names)  # 12 x 2048 x 4 B x 1024 x 4 = 384 MiB: the ceiling
    assert ring == DEFAULT_RING_BYTES and "ceiling" in how, how
