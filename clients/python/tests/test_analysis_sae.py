"""Sparse autoencoders on real activations: trained all-MiniLM-L6-v2 run over standard-library
docstrings under capture (real strapd), SAEs trained on the ActivationDataset."""

from __future__ import annotations

import pytest
import torch
from datacap import capture_texts, minilm, stdlib_texts

from llm_instrumentation.analysis.sparse_autoencoder import (
    SparseAutoencoder,
    evaluate,
    feature_activations,
    top_activating_tokens,
    train_sae,
)
from llm_instrumentation.data import ActivationDataset

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]
MODULE = "encoder.layer.3"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    from conftest import Daemon, short_tmpdir, strapd_bin
    import os
    import shutil

    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    model, tok = minilm()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    d = short_tmpdir()
    daemon = Daemon(b, d)
    try:
        tmp = tmp_path_factory.mktemp("sae")
        train, held = tmp / "train.strap", tmp / "held.strap"
        texts = stdlib_texts(100)
        capture_texts(model, tok, texts[:80], train, daemon.socket, [MODULE])
        capture_texts(model, tok, texts[80:], held, daemon.socket, [MODULE])
    finally:
        torch.set_num_threads(threads)
        daemon.stop()
        shutil.rmtree(d, ignore_errors=True)
    return train, held


@pytest.mark.parametrize("kind", ["topk", "relu"])
def test_sae_reduces_reconstruction_error(captured, kind):
    train, held = captured
    ds = ActivationDataset(train, MODULE, batch_size=256, shuffle=True, shuffle_buffer=2048, dtype=torch.float32)
    assert ds.rows > 2000 and ds.d_model == 384
    held_ds = ActivationDataset(held, MODULE, batch_size=1024, dtype=torch.float32)
    torch.manual_seed(0)
    untrained = SparseAutoencoder(384, 4 * 384, kind=kind, k=32, l1=2.0)
    untrained.fit_normalization(next(iter(ds))["activation"])
    before = evaluate(untrained, held_ds)
    sae, rep = train_sae(ds, total_tokens=6 * ds.rows, expansion=4, kind=kind, k=32, l1=2.0, lr=2e-3,
                         device="cpu", eval_data=held_ds, dead_tokens=3 * ds.rows)
    assert rep.tokens >= 6 * ds.rows and rep.eval_tokens == held_ds.rows
    # held-out tokens: the trained SAE reconstructs far better than the same SAE untrained
    assert rep.mse < 0.5 * before["mse"], (before, rep)
    assert rep.explained_variance > (0.6 if kind == "topk" else 0.5), rep
    if kind == "topk":
        assert rep.l0 <= 32
    else:
        assert rep.l0 < 0.5 * 4 * 384
    assert 0 <= rep.dead_fraction < 0.9
    assert rep.history and rep.history[-1]["mse"] < rep.history[0]["mse"]


def test_apply_and_top_tokens(captured, tmp_path):
    train, held = captured
    ds = ActivationDataset(train, MODULE, batch_size=512, shuffle=True, dtype=torch.float32)
    sae, rep = train_sae(ds, total_tokens=2 * ds.rows, expansion=4, k=16, device="cpu")
    path = str(tmp_path / "sae.safetensors")
    sae.save(path)
    again = SparseAutoencoder.load(path)
    x = next(iter(ActivationDataset(held, MODULE, batch_size=64, dtype=torch.float32)))["activation"]
    assert torch.equal(again.encode(x), sae.encode(x))
    batches = list(feature_activations(sae, held, MODULE, batch_size=300))
    n = sum(len(b["features"]) for b in batches)
    assert n == ActivationDataset(held, MODULE).rows
    f = torch.cat([b["features"] for b in batches])
    assert ((f != 0).sum(1) <= 16).all()
    top = top_activating_tokens(sae, held, MODULE, n=5)
    assert top
    feat, lst = max(top.items(), key=lambda kv: kv[1][0].activation)
    vals = [t.activation for t in lst]
    assert vals == sorted(vals, reverse=True) and len(lst) <= 5
    # the listed activations are the feature's real top values, with the stream's tokens
    assert vals[0] == pytest.approx(float(f[:, feat].max()))
    ids = torch.cat([b["token_id"] for b in batches])
    best = int(f[:, feat].argmax())
    assert lst[0].token_id == int(ids[best]) and lst[0].text != ""
