"""Exports of real captures (real strapd): safetensors shards load with
safetensors.torch.load_file and hold the captured rows bit for bit; the SAELens layout loads
with datasets and, where sae-lens is installed, with SAELens's own ActivationsStore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from captest import bits
from conftest import tiny_llama
from datacap import capture_prompts, prompts

from llm_instrumentation.export import export_safetensors, export_saelens, load_safetensors_export

pytestmark = pytest.mark.integration

SRC = Path(__file__).resolve().parents[1] / "src"
BATCHES = [prompts(2, 8, seed=1), prompts(1, 8, seed=2), prompts(3, 8, seed=3)]
_model = {}


@pytest.fixture
def capture(real_strapd, tmp_path):
    if "m" not in _model:
        _model["m"] = tiny_llama()
    out = tmp_path / "c.strap"
    ref = capture_prompts(_model["m"], BATCHES, out, real_strapd.socket, preset="balanced")
    return out, ref


def reference_rows(ref, name):
    """The module's rows in the dataset's order: forward, batch row, position."""
    return torch.cat([t.reshape(-1, t.shape[-1]) for t in ref[name]])


def test_safetensors_shards(capture, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    out, ref = capture
    dest = tmp_path / "st"
    bound = 64 * 1024
    idx = export_safetensors(out, dest, modules=["model.layers.1", "model.layers.3"], max_shard_bytes=bound,
                             progress=False)
    rows = 2 * 6 * 8
    assert idx["rows"] == rows and idx["d_model"] == 256 and idx["dtype"] == "float32"
    assert len(idx["shards"]) == -(-rows // ((bound - 16384) // (256 * 4 + 8 * 8 + 1)))
    assert len(idx["shards"]) > 1
    assert json.loads((dest / "index.json").read_text()) == idx
    acts, cols = [], {}
    for s in idx["shards"]:
        p = dest / s["file"]
        assert os.path.getsize(p) == s["bytes"] <= bound
        t = load_file(p)
        assert t["activations"].shape == (s["rows"], 256)
        with safe_open(p, "pt") as f:
            assert f.metadata()["first_row"] == str(s["first_row"])
        acts.append(t["activations"])
        for k, v in t.items():
            if k != "activations":
                cols.setdefault(k, []).append(v)
    acts = torch.cat(acts)
    cols = {k: torch.cat(v) for k, v in cols.items()}
    want = torch.cat([reference_rows(ref, "model.layers.1"), reference_rows(ref, "model.layers.3")])
    assert torch.equal(bits(acts), bits(want))
    ids = [tid for batch in BATCHES for p in batch for tid in p]
    assert cols["token_ids"].tolist() == ids * 2
    assert cols["module"].tolist() == [0] * 48 + [1] * 48
    assert not cols["lossy"].any()
    st = idx["streams"][0]
    assert [t["token_id"] for t in st["tokens"]] == ids
    assert st["metadata"]["client_metadata"]["model_class"] == "LlamaForCausalLM"
    got_idx, shards = load_safetensors_export(dest)
    assert sum(len(s["activations"]) for s in shards) == rows
    with pytest.raises(FileExistsError):
        export_safetensors(out, dest, modules="model.layers.1")
    with pytest.raises(ValueError, match="cannot hold one row"):
        export_safetensors(out, tmp_path / "tiny", modules="model.layers.1", max_shard_bytes=17000)


def test_cli(capture, tmp_path):
    out, ref = capture
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    res = subprocess.run([sys.executable, "-m", "llm_instrumentation.export", "safetensors", str(out), "--modules",
                          "model.layers.0", "--out", str(tmp_path / "cli"), "--max-shard-bytes", "1MiB"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "48 rows × 256 (float32) of 1 module(s) → 1 shard(s)" in res.stdout
    assert res.stderr == ""  # no progress bar when stderr is not a terminal
    res = subprocess.run([sys.executable, "-m", "llm_instrumentation.export", "saelens", str(out), "--module",
                          "nope", "--out", str(tmp_path / "x")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1 and "export:" in res.stderr and "nope" in res.stderr


@pytest.mark.parametrize("ctx", [8, 3])
def test_saelens_layout_datasets(capture, tmp_path, ctx):
    import datasets

    out, ref = capture
    dest = tmp_path / "sl"
    r = export_saelens(out, dest, "model.layers.2", context_size=ctx, hook_name="blocks.2.hook_resid_post",
                       progress=False)
    n_rows = 6 * 8
    assert r["sequences"] == 6 * (8 // ctx) and r["dropped_rows"] == 6 * (8 % ctx)
    ds = datasets.load_from_disk(str(dest))
    assert ds.features["blocks.2.hook_resid_post"] == datasets.Array2D(shape=(ctx, 256), dtype="float32")
    assert ds.features["token_ids"] == datasets.Sequence(datasets.Value("int32"), length=ctx)
    ds.set_format("torch")
    everything = ds[:len(ds)]
    acts = everything["blocks.2.hook_resid_post"]
    want = torch.cat([t for t in ref["model.layers.2"]])[:, :(8 // ctx) * ctx].reshape(-1, ctx, 256)
    assert acts.shape == want.shape and torch.equal(acts, want)
    ids = torch.tensor([p for batch in BATCHES for p in batch])[:, :(8 // ctx) * ctx].reshape(-1, ctx)
    assert torch.equal(everything["token_ids"].long(), ids)
    assert n_rows == r["rows"] + r["dropped_rows"]


def test_saelens_loads_our_export(capture, tmp_path):
    """SAELens's own loader (ActivationsStore with cached_activations_path) on our export."""
    pytest.importorskip("sae_lens", reason="sae-lens not installed (pip install 'strap-llm[science]')")
    from sae_lens.training.activations_store import ActivationsStore

    out, ref = capture
    dest = tmp_path / "sl"
    export_saelens(out, dest, "model.layers.2", progress=False)
    store = ActivationsStore(model=None, dataset=None, streaming=False, hook_name="model.layers.2",
                             hook_head_index=None, context_size=8, d_in=256, n_batches_in_buffer=2,
                             total_training_tokens=48, store_batch_size_prompts=2, train_batch_size_tokens=16,
                             prepend_bos=False, normalize_activations="none", device=torch.device("cpu"),
                             dtype="float32", cached_activations_path=str(dest))
    acts, toks = store.get_raw_llm_batch()
    want = torch.cat([t for t in ref["model.layers.2"]])
    assert torch.equal(acts, want[:2].reshape(16, 256))
    assert toks.tolist() == [tid for p in BATCHES[0] for tid in p]
    batch = next(store)  # SAELens's mixing buffer over our rows
    assert batch.shape == (16, 256)
