"""Fidelity of lossy captures as analysis sees it (docs/COMPRESSION.md 10, issue 40).

Given the same rows captured losslessly (``x``) and through a lossy codec (``y``):

* :func:`row_errors`: per-row relative L2 error ``‖y − x‖ / ‖x‖`` and cosine, max and
  percentiles (a row is one token's vector);
* :func:`feature_retention`: with a sparse autoencoder trained on the lossless rows, the
  share of each row's active features (the top-k latents of ``x``) that are still active for
  ``y``;
* :func:`probe_accuracy`: a linear probe trained on lossless rows, scored on lossless and on
  lossy held-out rows (and one trained and scored on lossy rows).
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np
import torch

from .sparse_autoencoder import SparseAutoencoder


def _dist(v: np.ndarray, qs: Sequence[float]) -> Dict[str, float]:
    s = np.sort(v)
    out = {"min": float(s[0]), "max": float(s[-1]), "mean": float(s.mean())}
    for q in qs:  # nearest rank
        out[f"p{q:g}"] = float(s[max(0, int(np.ceil(q / 100 * s.size)) - 1)])
    return out


def row_errors(x: torch.Tensor, y: torch.Tensor) -> Dict[str, Any]:
    """Per-row relative L2 error and cosine of ``y`` against ``x`` (both ``[rows, d]``).

    Args:
        x: the lossless rows.
        y: the same rows through a lossy codec.

    Returns:
        ``{"rows": n, "rel_l2": {min, max, mean, p50, p99}, "cos": {min, max, mean, p1, p50}}``,
        computed in float64; all-zero rows count as rel-L2 0 / cosine 1 when ``y`` is zero too.

    Example:
        >>> row_errors(torch.ones(2, 4), torch.ones(2, 4))["cos"]["min"]
        1.0
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"want two [rows, d] tensors of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    a, b = x.double(), y.double()
    ss, ssy = (a * a).sum(1), (b * b).sum(1)
    sse = ((a - b) ** 2).sum(1)
    zero = ss == 0
    rel = torch.where(zero, torch.where(sse == 0, 0.0, float("inf")), sse.sqrt() / ss.sqrt().clamp_min(1e-300))
    cos = torch.where(zero & (ssy == 0), 1.0, (a * b).sum(1) / (ss * ssy).sqrt().clamp_min(1e-300))
    return {"rows": int(x.shape[0]), "rel_l2": _dist(rel.numpy(), (50, 99)), "cos": _dist(cos.numpy(), (1, 50))}


@torch.no_grad()
def feature_retention(sae: SparseAutoencoder, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int = 4096) -> Dict[str, Any]:
    """Share of each row's active SAE features (``sae.encode(x) > 0``: for a TopK SAE its
    top-k latents) that are also active for the lossy row ``y``.

    Args:
        sae: a sparse autoencoder (trained on lossless rows).
        x: lossless rows ``[rows, d_in]``.
        y: the same rows through a lossy codec.
        batch_size: rows encoded at a time.

    Returns:
        ``{"rows": n, "retention": {min, max, mean, p1, p5, p50}, "weighted": the same for
        the share of the row's feature activation (Σ f(x) over the kept features / Σ f(x)),
        "active_mean": mean active features per lossless row, "top1_kept": share of rows
        whose strongest feature is still active}``; rows with no active feature are left out.

    Example:
        >>> sae = SparseAutoencoder(8, 32, k=4)
        >>> feature_retention(sae, torch.randn(5, 8), torch.randn(5, 8))["rows"] <= 5  # doctest: +SKIP
        True
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"want two [rows, d] tensors of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    sae = sae.eval()
    kept, weighted, active, top1 = [], [], [], []
    for i in range(0, x.shape[0], batch_size):
        fx, fy = sae.encode(x[i : i + batch_size].float()), sae.encode(y[i : i + batch_size].float())
        ax, ay = fx > 0, fy > 0
        n = ax.sum(1)
        ok = n > 0
        kept.append(((ax & ay).sum(1)[ok].double() / n[ok].double()))
        fxd = fx.double()
        weighted.append((fxd * (ax & ay)).sum(1)[ok] / fxd.sum(1)[ok])
        active.append(n[ok].double())
        best = fx.argmax(1, keepdim=True)
        top1.append(ay.gather(1, best).squeeze(1)[ok].double())
    k, a, t = torch.cat(kept).numpy(), torch.cat(active).numpy(), torch.cat(top1).numpy()
    if k.size == 0:
        raise ValueError("no row has an active feature")
    w = torch.cat(weighted).numpy()
    return {"rows": int(k.size), "retention": _dist(k, (1, 5, 50)), "weighted": _dist(w, (1, 5, 50)),
            "active_mean": float(a.mean()), "top1_kept": float(t.mean())}


def _fit_probe(x: torch.Tensor, labels: torch.Tensor, classes: int, steps: int, seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    lin = torch.nn.Linear(x.shape[1], classes)
    with torch.no_grad():
        lin.weight.normal_(0, 0.01, generator=g)
        lin.bias.zero_()
    opt = torch.optim.Adam(lin.parameters(), lr=1e-2, weight_decay=1e-4)
    xn = (x - mean) / std
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(lin(xn), labels).backward()
        opt.step()
    # Fold the standardisation into the layer, so it applies to raw rows.
    with torch.no_grad():
        lin.weight.div_(std)
        lin.bias.sub_(lin.weight @ mean)
    return lin


@torch.no_grad()
def _accuracy(lin: torch.nn.Linear, x: torch.Tensor, labels: torch.Tensor) -> float:
    return float((lin(x).argmax(1) == labels).double().mean())


def probe_accuracy(x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, train_frac: float = 0.7,
                   steps: int = 300, seed: int = 0) -> Dict[str, float]:
    """A linear (softmax) probe for ``labels`` on lossless vs lossy rows.

    Rows are split at random (``seed``) into train and test; one probe is trained (full-batch
    Adam, standardised inputs) on the lossless train rows and scored on the lossless and the
    lossy test rows; another is trained and scored on lossy rows.

    Args:
        x: lossless rows ``[rows, d]``.
        y: the same rows through a lossy codec.
        labels: an integer class per row.
        train_frac: share of rows to train on.
        steps: optimiser steps.
        seed: split and initialisation seed.

    Returns:
        ``{"train_rows", "test_rows", "classes", "lossless": accuracy of the lossless probe on
        lossless test rows, "lossy": the same probe on the lossy test rows, "lossy_trained":
        a probe trained and tested on lossy rows, "agreement": share of test rows where the
        lossless probe predicts the same class for both}``.
    """
    if x.shape != y.shape or x.shape[0] != labels.shape[0]:
        raise ValueError("x, y and labels must have the same rows")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(x.shape[0], generator=g)
    cut = int(train_frac * x.shape[0])
    tr, te = perm[:cut], perm[cut:]
    classes = int(labels.max()) + 1
    xf, yf = x.float(), y.float()
    p = _fit_probe(xf[tr], labels[tr], classes, steps, seed)
    q = _fit_probe(yf[tr], labels[tr], classes, steps, seed)
    with torch.no_grad():
        agree = float((p(xf[te]).argmax(1) == p(yf[te]).argmax(1)).double().mean())
    return {"train_rows": int(tr.numel()), "test_rows": int(te.numel()), "classes": classes,
            "lossless": _accuracy(p, xf[te], labels[te]), "lossy": _accuracy(p, yf[te], labels[te]),
            "lossy_trained": _accuracy(q, yf[te], labels[te]), "agreement": agree}
