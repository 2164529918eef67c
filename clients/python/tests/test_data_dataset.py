"""ActivationDataset on real captures (real strapd): rows bit-identical to what the modules
produced, token ids from the stream, every row exactly once across DataLoader workers and
ranks, a bounded shuffle buffer, lossy tensors flagged."""

from __future__ import annotations

import collections
import warnings
from typing import Dict, List, Tuple

import pytest
import torch
from captest import bits
from conftest import tiny_llama
from datacap import capture_prompts, prompts
from torch.utils.data import DataLoader

from llm_instrumentation import InstrumentationConfig
from llm_instrumentation.data import ActivationDataset, _shuffle_buffer, resolve_rank

pytestmark = pytest.mark.integration

_models: Dict[str, torch.nn.Module] = {}


def llama(dtype=None) -> torch.nn.Module:
    key = str(dtype)
    if key not in _models:
        _models[key] = tiny_llama(dtype)
    return _models[key]


# Three forward passes: batch 1 × 9, batch 2 × 9, batch 1 × 9 tokens.
BATCHES = [prompts(1, 9, seed=1), prompts(2, 9, seed=2), prompts(1, 9, seed=3)]
LAYERS = ["model.layers.0", "model.layers.2"]


@pytest.fixture
def capture(real_strapd, tmp_path):
    out = tmp_path / "c.strap"
    ref = capture_prompts(llama(), BATCHES, out, real_strapd.socket, preset="balanced")
    return out, ref


def key(row: Dict) -> Tuple[int, ...]:
    return tuple(int(row[k]) for k in ("stream", "module", "forward", "batch", "position"))


def expected_tokens() -> Dict[Tuple[int, int, int], int]:
    """(forward, batch, position) → token id, from the prompts as they were fed."""
    return {(f, b, p): tid for f, batch in enumerate(BATCHES) for b, pr in enumerate(batch) for p, tid in enumerate(pr)}


def test_rows_bit_exact_with_tokens(capture):
    out, ref = capture
    ds = ActivationDataset(out, modules=LAYERS)
    assert ds.modules == LAYERS and ds.d_model == 256
    assert ds.rows == len(LAYERS) * 9 * 4
    toks = expected_tokens()
    seen = 0
    step = 0
    steps = [sum(len(b) * len(b[0]) for b in BATCHES[:i + 1]) for i in range(len(BATCHES))]
    for row in ds:
        name = ds.modules[row["module"]]
        f, b, p = row["forward"], row["batch"], row["position"]
        want = ref[name][f][b, p]
        assert row["activation"].dtype == want.dtype
        assert torch.equal(bits(row["activation"]), bits(want)), (name, f, b, p)
        assert row["token_id"] == toks[(f, b, p)]
        assert row["step"] == steps[f]
        assert row["token_index"] == steps[f] - len(BATCHES[f]) * 9 + b * 9 + p
        assert row["lossy"] is False and row["stream"] == 0
        seen += 1
        step = max(step, row["step"])
    assert seen == ds.rows
    assert [t["token_id"] for t in ds.tokens()] == [tid for batch in BATCHES for pr in batch for tid in pr]
    ds.close()


def test_batches_bit_exact_and_patterns(capture):
    out, ref = capture
    ds = ActivationDataset(out, modules="model.layers.*.mlp", batch_size=7)
    assert ds.modules == [f"model.layers.{i}.mlp" for i in range(4)]
    got = list(ds)
    assert [len(b["activation"]) for b in got[:-1]] == [7] * (len(got) - 1)
    assert sum(len(b["activation"]) for b in got) == ds.rows == 4 * 36
    x = torch.cat([b["activation"] for b in got])
    meta = {k: torch.cat([b[k] for b in got]) for k in ("module", "forward", "batch", "position")}
    for i in range(len(x)):
        want = ref[ds.modules[meta["module"][i]]][meta["forward"][i]][meta["batch"][i], meta["position"][i]]
        assert torch.equal(bits(x[i]), bits(want))
    with pytest.raises(ValueError, match="no module"):
        ActivationDataset(out, modules="nothing.*")
    ds.close()


def test_width_mismatch_is_refused(real_strapd, tmp_path):
    from conftest import tiny_gpt2

    out = tmp_path / "g.strap"
    # block outputs are [B, T, 128], c_fc's [B, T, 512]
    capture_prompts(tiny_gpt2(), [prompts(1, 6)], out, real_strapd.socket, modules=["transformer.h.0.mlp.c_fc"])
    with pytest.raises(ValueError, match="different widths"):
        ActivationDataset(out, modules=["transformer.h.0", "transformer.h.0.mlp.c_fc"])


def every_row(loader) -> List[Tuple[int, ...]]:
    keys = []
    for b in loader:
        for i in range(len(b["activation"])):
            keys.append(tuple(int(b[k][i]) for k in ("stream", "module", "forward", "batch", "position")))
    return keys


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_4_workers_2_ranks(real_strapd, tmp_path, shuffle):
    outs = []
    for s in range(2):
        out = tmp_path / f"s{s}.strap"
        capture_prompts(llama(), [prompts(1, 5, seed=10 * s + i) for i in range(6)], out, real_strapd.socket,
                        preset="fast_capture")
        outs.append(out)
    ref = ActivationDataset(outs, modules="model.layers.*.self_attn")
    want = [key(r) for r in ref]
    assert len(want) == len(set(want)) == 2 * 4 * 6 * 5
    got = []
    for rank in range(2):
        ds = ActivationDataset(outs, modules="model.layers.*.self_attn", batch_size=16, shuffle=shuffle,
                               shuffle_buffer=20, seed=3, rank=rank, world_size=2)
        got += every_row(DataLoader(ds, batch_size=None, num_workers=4))
    assert len(got) == len(want)
    assert collections.Counter(got) == collections.Counter(want)
    if shuffle:
        assert got != sorted(got)


def test_rank_from_env(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_rank() == (1, 2)
    assert resolve_rank(0, 4) == (0, 4)
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="together"):
        resolve_rank()
    with pytest.raises(ValueError, match="not in"):
        resolve_rank(2, 2)


def test_shuffle_buffer_bounded_and_complete():
    chunks = [(torch.arange(i * 10, i * 10 + 10, dtype=torch.float32)[:, None].repeat(1, 3),
               {"id": torch.arange(i * 10, i * 10 + 10)}) for i in range(12)]
    cap = 16
    out = list(_shuffle_buffer(iter(chunks), cap, torch.Generator().manual_seed(0)))
    ids = torch.cat([m["id"] for _, m in out])
    assert sorted(ids.tolist()) == list(range(120))
    assert ids.tolist() != list(range(120))
    assert all(len(x) <= cap for x, _ in out)
    xs = torch.cat([x for x, _ in out])
    assert torch.equal(xs[:, 0].long(), ids)  # rows travel with their metadata
    # a row cannot leave before the buffer has seen it, nor stay longer than it must
    first = {int(i): n for n, i in enumerate(ids)}
    assert all(first[i] >= i - cap for i in range(120))


def test_bf16_and_dtype_conversion(real_strapd, tmp_path):
    out = tmp_path / "b.strap"
    ref = capture_prompts(llama(torch.bfloat16), [prompts(1, 8)], out, real_strapd.socket, preset="balanced")
    ds = ActivationDataset(out, modules="model.layers.1", batch_size=100)
    (b,) = list(ds)
    assert b["activation"].dtype == torch.bfloat16
    assert torch.equal(bits(b["activation"]), bits(ref["model.layers.1"][0][0]))
    ds32 = ActivationDataset(out, modules="model.layers.1", batch_size=100, dtype=torch.float32)
    (b32,) = list(ds32)
    assert torch.equal(b32["activation"], ref["model.layers.1"][0][0].float())


@pytest.mark.parametrize("codec", ["quant", "fp8", "transform"])
def test_lossy_flagged(real_strapd, tmp_path, codec):
    out = tmp_path / "q.strap"
    if codec == "quant":
        ref = capture_prompts(llama(), [prompts(1, 8)], out, real_strapd.socket, preset="max_compression")
        bound = 1e-3
    else:
        # the opt-in lossy codecs: fp8's per-row error (COMPRESSION.md 5.1), transform's default bound
        cfg = InstrumentationConfig().with_compression(codec)
        ref = capture_prompts(llama(), [prompts(1, 8)], out, real_strapd.socket, config=cfg)
        bound = 0.1
    ds = ActivationDataset(out, modules="model.layers.3", batch_size=100)
    (b,) = list(ds)
    assert b["lossy"].all()
    want = ref["model.layers.3"][0][0]
    err = (b["activation"] - want).norm() / want.norm()
    assert 0 < err <= bound
    assert list(ActivationDataset(out, modules="model.layers.3", lossy="skip")) == []
    with pytest.raises(ValueError, match="lossy"):
        ActivationDataset(out, modules="model.layers.3", lossy="error")


def test_unrecorded_tokens_are_minus_one(real_strapd, tmp_path):
    out = tmp_path / "n.strap"
    capture_prompts(llama(), [prompts(1, 6)], out, real_strapd.socket, record=False)
    rows = list(ActivationDataset(out, modules="model.layers.0"))
    assert len(rows) == 6 and all(r["token_id"] == -1 and r["token_index"] == -1 for r in rows)


def test_pickled_dataset_reopens(capture):
    import pickle

    out, ref = capture
    ds = ActivationDataset(out, modules=LAYERS, batch_size=1000)
    a = list(ds)
    ds2 = pickle.loads(pickle.dumps(ds))
    ds.close()
    b = list(ds2)
    assert torch.equal(a[0]["activation"], b[0]["activation"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ActivationDataset(out, modules=LAYERS).close()  # nothing lost: no warning
