"""analysis.fidelity: per-row errors, SAE feature retention and the linear probe on known inputs."""

from __future__ import annotations

import math

import pytest
import torch

from llm_instrumentation.analysis.fidelity import feature_retention, probe_accuracy, row_errors
from llm_instrumentation.analysis.sparse_autoencoder import SparseAutoencoder


def test_row_errors_known_values() -> None:
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([[3.0, 4.5], [0.0, 1.0], [0.0, 0.0]])
    r = row_errors(x, y)
    assert r["rows"] == 3
    assert r["rel_l2"]["max"] == pytest.approx(math.sqrt(2))  # row 2: orthogonal, same norm
    assert r["rel_l2"]["min"] == 0.0  # the zero row decoded as zero
    assert r["cos"]["min"] == pytest.approx(0.0, abs=1e-12)
    assert r["cos"]["max"] == 1.0
    with pytest.raises(ValueError):
        row_errors(x, y[:2])


def test_feature_retention_identity_and_noise() -> None:
    torch.manual_seed(0)
    sae = SparseAutoencoder(16, 64, k=8)
    x = torch.randn(200, 16)
    same = feature_retention(sae, x, x.clone())
    assert same["retention"]["min"] == 1.0 and same["top1_kept"] == 1.0 and same["active_mean"] == pytest.approx(8)
    other = feature_retention(sae, x, torch.randn(200, 16))
    assert other["retention"]["mean"] < 0.5  # unrelated rows share few of 8 of 64 features
    small = feature_retention(sae, x, x + 1e-3 * torch.randn(200, 16))
    assert other["retention"]["mean"] < small["retention"]["mean"] <= 1.0


def test_probe_accuracy_separable_and_destroyed() -> None:
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 4, (800,), generator=g)
    centers = 5 * torch.randn(4, 10, generator=g)
    x = centers[labels] + torch.randn(800, 10, generator=g)
    r = probe_accuracy(x, x.clone(), labels)
    assert r["lossless"] > 0.95 and r["lossy"] == r["lossless"] and r["agreement"] == 1.0
    noise = probe_accuracy(x, torch.randn(800, 10, generator=g), labels)
    assert noise["lossless"] == r["lossless"] and noise["lossy"] < 0.5
