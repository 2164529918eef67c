"""Sparse autoencoders on captured activations (docs/ANALYSIS.md 4).

Two kinds, both ``x̂ = W_dec f + b_dec`` with unit-norm decoder rows:

* ``topk`` (Gao et al. 2024): ``f = TopK_k(ReLU(W_enc (x - b_dec) + b_enc))``; loss MSE plus
  the AuxK term, which lets latents that have not fired for ``dead_tokens`` tokens
  reconstruct the residual (so fewer of them stay dead).
* ``relu`` (ReLU + L1): ``f = ReLU(W_enc (x - b_dec) + b_enc)``; loss MSE + ``l1`` × Σ f.

Inputs are centred by the data mean and scaled so that E‖x‖² = d_in (both estimated from
the first batches and stored in the model), so ``l1`` and the learning rate do not depend on
the activations' scale. Metrics are on the original scale: explained variance
``1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²``, L0 (mean active latents per token), dead fraction (latents
that never fired over the evaluated tokens).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

Batch = Union[torch.Tensor, Dict[str, Any]]


def _acts(b: Batch) -> torch.Tensor:
    x = b["activation"] if isinstance(b, dict) else b
    if x.dim() != 2:
        raise ValueError(f"expected batches of rows [n, d], got shape {tuple(x.shape)}")
    return x


class SparseAutoencoder(nn.Module):
    """A TopK or ReLU+L1 sparse autoencoder.

    Args:
        d_in: width of the activations.
        d_sae: number of latents (features).
        kind: ``"topk"`` or ``"relu"``.
        k: active latents per token (topk).
        l1: L1 coefficient (relu), on the normalised scale.

    Example:
        >>> sae = SparseAutoencoder(384, 1536, kind="topk", k=32)
        >>> x_hat, f = sae(torch.randn(8, 384))
        >>> tuple(x_hat.shape), int((f != 0).sum(-1).max()) <= 32
        ((8, 384), True)
    """

    # Buffers (register_buffer below): tensors, which nn.Module's attribute typing cannot tell.
    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, d_in: int, d_sae: int, kind: str = "topk", k: int = 32, l1: float = 5.0) -> None:
        super().__init__()
        if kind not in ("topk", "relu"):
            raise ValueError(f"kind must be 'topk' or 'relu', got {kind!r}")
        if kind == "topk" and not 0 < k <= d_sae:
            raise ValueError(f"k must be in 1..d_sae={d_sae}, got {k}")
        self.d_in, self.d_sae, self.kind, self.k, self.l1 = d_in, d_sae, kind, k, l1
        w = torch.randn(d_sae, d_in)
        w /= w.norm(dim=1, keepdim=True)
        self.W_dec = nn.Parameter(w.clone())
        self.W_enc = nn.Parameter(w.t().clone())
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("scale", torch.ones(()))

    def config(self) -> Dict[str, Any]:
        return {"d_in": self.d_in, "d_sae": self.d_sae, "kind": self.kind, "k": self.k, "l1": self.l1}

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.mean.dtype) - self.mean) / self.scale

    def pre_acts(self, xn: torch.Tensor) -> torch.Tensor:
        return (xn - self.b_dec) @ self.W_enc + self.b_enc

    def _activate(self, pre: torch.Tensor) -> torch.Tensor:
        f = torch.relu(pre)
        if self.kind == "topk":
            v, i = f.topk(self.k, dim=-1)
            f = torch.zeros_like(f).scatter_(-1, i, v)
        return f

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[n, d_sae]`` of raw activations ``x [n, d_in]``."""
        return self._activate(self.pre_acts(self.normalize(x)))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """Reconstruction on the original scale."""
        return (f @ self.W_dec + self.b_dec) * self.scale + self.mean

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        f = self.encode(x)
        return self.decode(f), f

    @torch.no_grad()
    def fit_normalization(self, x: torch.Tensor) -> None:
        """Set the centring mean and the scale (E‖x − mean‖² = d_in) from a sample."""
        x = x.to(self.mean.dtype)
        self.mean.copy_(x.mean(0))
        self.scale.copy_(((x - self.mean).pow(2).sum(-1).mean() / self.d_in).sqrt().clamp_min(1e-12))

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))

    def save(self, path: str) -> None:
        """Write weights and config to a safetensors file."""
        import json

        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, path,
                  metadata={"config": json.dumps(self.config())})

    @classmethod
    def load(cls, path: str, device: Union[str, torch.device] = "cpu") -> "SparseAutoencoder":
        """Read what :meth:`save` wrote."""
        import json

        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(path, "pt") as f:
            cfg = json.loads(f.metadata()["config"])
        sae = cls(**cfg)
        sae.load_state_dict(load_file(path))
        return sae.to(device)


@dataclass
class SAEReport:
    """Training summary; metrics measured on the last evaluation (see :func:`evaluate`).

    Attributes:
        tokens: rows trained on; steps: optimiser steps; seconds: training wall time.
        explained_variance, mse, l0, dead_fraction: as in :func:`evaluate`.
        history: ``{"tokens", "mse", "l0"}`` per logged step (on training batches).
    """

    config: Dict[str, Any]
    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    explained_variance: float = float("nan")
    mse: float = float("nan")
    l0: float = float("nan")
    dead_fraction: float = float("nan")
    eval_tokens: int = 0
    history: List[Dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _batches_forever(data: Iterable[Batch]) -> Iterator[torch.Tensor]:
    epoch = 0
    while True:
        got = False
        for b in data:
            got = True
            yield _acts(b)
        if not got:
            raise ValueError("the training data yielded no batches")
        epoch += 1
        if hasattr(data, "set_epoch"):
            data.set_epoch(epoch)


def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _distributed(flag: Optional[bool]) -> Tuple[bool, int]:
    """(whether to train data-parallel, world size): ``flag`` None means "when a
    ``torch.distributed`` group of more than one process is initialised"."""
    import torch.distributed as dist

    on = dist.is_available() and dist.is_initialized()
    if flag and not on:
        raise ValueError("distributed=True needs an initialised torch.distributed process group "
                         "(torch.distributed.init_process_group, e.g. under torchrun)")
    if not on or flag is False:
        return False, 1
    world = dist.get_world_size()
    return world > 1 or bool(flag), world


class _TrainStep(nn.Module):
    """One training step's loss, as a module so that DistributedDataParallel can wrap it
    (DDP averages gradients across ranks during ``backward``)."""

    def __init__(self, sae: SparseAutoencoder, dead_tokens: int, aux_k: int, aux_coefficient: float,
                 world: int) -> None:
        super().__init__()
        self.sae = sae
        self.dead_tokens, self.aux_k, self.aux_coefficient, self.world = dead_tokens, aux_k, aux_coefficient, world

    def forward(self, x: torch.Tensor, since_fired: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sae = self.sae
        xn = sae.normalize(x)
        pre = sae.pre_acts(xn)
        f = sae._activate(pre)
        xn_hat = f @ sae.W_dec + sae.b_dec
        err = xn - xn_hat
        mse = err.pow(2).sum(-1).mean()
        loss = mse
        if sae.kind == "relu":
            loss = loss + sae.l1 * f.sum(-1).mean()
        fired = (f > 0).any(0)
        rows = x.shape[0]
        if self.world > 1:
            # Dead latents are counted over every rank's rows, as one process would over the
            # concatenated batch.
            import torch.distributed as dist

            fi = fired.to(torch.int32)
            dist.all_reduce(fi, op=dist.ReduceOp.MAX)
            fired = fi > 0
            rows *= self.world
        since_fired += rows
        since_fired[fired] = 0
        dead = since_fired >= self.dead_tokens
        if sae.kind == "topk" and self.aux_coefficient > 0 and bool(dead.any()):
            # AuxK: the dead latents' top activations try to model what the live ones missed.
            ka = min(self.aux_k, int(dead.sum()))
            dpre = torch.relu(pre).masked_fill(~dead, 0)
            v, i = dpre.topk(ka, dim=-1)
            aux_hat = torch.zeros_like(dpre).scatter_(-1, i, v) @ sae.W_dec
            aux = (err.detach() - aux_hat).pow(2).sum(-1).mean() / err.detach().pow(2).sum(-1).mean().clamp_min(1e-12)
            loss = loss + self.aux_coefficient * aux
        return loss, mse.detach(), f.detach()


def _gather_rows(x: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's ``x`` concatenated in rank order (all ranks' batches must match in shape)."""
    import torch.distributed as dist

    shapes: List[Any] = [None] * world
    dist.all_gather_object(shapes, tuple(x.shape))
    if len(set(shapes)) != 1:
        raise ValueError(f"distributed training needs batches of one shape on every rank, got {shapes} "
                         "(ActivationDataset(..., batch_size=n, drop_last=True))")
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def train_sae(data: Iterable[Batch], total_tokens: int, *, d_sae: Optional[int] = None, expansion: int = 4,
              kind: str = "topk", k: int = 32, l1: float = 5.0, lr: float = 1e-3, device: Union[str, torch.device,
              None] = "auto", seed: int = 0, dead_tokens: int = 200_000, aux_k: Optional[int] = None,
              aux_coefficient: float = 1 / 32, eval_data: Optional[Iterable[Batch]] = None,
              log_every: int = 50, sae: Optional[SparseAutoencoder] = None,
              distributed: Optional[bool] = None) -> Tuple[SparseAutoencoder, SAEReport]:
    """Train an SAE on batches of rows (an :class:`~llm_instrumentation.data.ActivationDataset`
    with ``batch_size``, a DataLoader over one, or tensors ``[n, d]``) for ``total_tokens`` rows,
    cycling the data (``set_epoch`` between passes) when it is shorter.

    Data-parallel training (``torch.distributed``, e.g. under ``torchrun``): each rank passes
    its own shard (an ``ActivationDataset`` shards by rank itself) in batches of one size
    (``drop_last=True``); the step is wrapped in ``DistributedDataParallel``, which averages
    the gradients, so a step equals one process's step on the ranks' batches concatenated in
    rank order: the normalisation is fitted on every rank's first batch, dead latents are
    counted over all ranks' rows and ``total_tokens`` counts the rows of all ranks. (The
    AuxK term is each rank's ratio, averaged: the one part that is not the concatenated
    batch's.) docs/ANALYSIS.md 4 shows it with ``torchrun``.

    Args:
        data: batches; ``dict`` batches use their ``"activation"``.
        total_tokens: rows to train on (the run stops at the first batch reaching it).
        d_sae: latents (default ``expansion × d_in``).
        kind, k, l1: see :class:`SparseAutoencoder`.
        lr: Adam learning rate.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``…
        seed: initialisation seed.
        dead_tokens: a latent that has not fired for this many tokens is dead (AuxK).
        aux_k: latents of the AuxK term (default ``d_in // 2``); aux_coefficient its weight.
        eval_data: batches for the final metrics (default: the training data, one pass).
        log_every: steps between history entries.
        sae: continue training this model instead of a new one.
        distributed: train data-parallel across the initialised ``torch.distributed`` group
            (default: when one of more than one process is initialised).

    Returns:
        ``(sae, report)`` (the plain model, not the DDP wrapper; the report's metrics are
        over every rank's evaluation rows, its ``history`` of this rank's batches).

    Example:
        >>> ds = ActivationDataset("run.strap", "model.layers.2", batch_size=4096, shuffle=True,
        ...                        dtype=torch.float32)                       # doctest: +SKIP
        >>> sae, rep = train_sae(ds, total_tokens=2_000_000, expansion=4, k=32)  # doctest: +SKIP
        >>> rep.explained_variance, rep.l0, rep.dead_fraction                     # doctest: +SKIP
    """
    dev = resolve_device(device)
    ddp, world = _distributed(distributed)
    it = _batches_forever(data)
    first = next(it).to(dev, torch.float32)
    d_in = first.shape[1]
    torch.manual_seed(seed)
    if sae is None:
        sae = SparseAutoencoder(d_in, d_sae or expansion * d_in, kind=kind, k=k, l1=l1).to(dev)
        sae.fit_normalization(_gather_rows(first, world) if ddp else first)
    else:
        sae = sae.to(dev)
    aux_k = aux_k or max(1, d_in // 2)
    step: nn.Module = _TrainStep(sae, dead_tokens, aux_k, aux_coefficient, world if ddp else 1)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        step = DistributedDataParallel(step, device_ids=[dev.index or 0] if dev.type == "cuda" else None)
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    since_fired = torch.zeros(sae.d_sae, dtype=torch.long, device=dev)
    report = SAEReport(config=sae.config(), device=str(dev))
    t0 = time.perf_counter()
    x: Optional[torch.Tensor] = first
    while report.tokens < total_tokens:
        if x is None:
            x = next(it).to(dev, torch.float32)
        loss, mse, f = step(x, since_fired)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if sae.W_dec.grad is not None:
            # Keep only the gradient component orthogonal to each unit-norm decoder row.
            w = sae.W_dec.detach()
            sae.W_dec.grad -= (sae.W_dec.grad * w).sum(-1, keepdim=True) * w
        opt.step()
        sae.normalize_decoder()
        report.tokens += x.shape[0] * (world if ddp else 1)
        report.steps += 1
        if report.steps % log_every == 0 or report.tokens >= total_tokens:
            report.history.append({"tokens": report.tokens, "mse": float(mse) * float(sae.scale) ** 2,
                                   "l0": float((f > 0).sum(-1).float().mean())})
        x = None
    if dev.type == "cuda":
        torch.cuda.synchronize()
    report.seconds = time.perf_counter() - t0
    m = evaluate(sae, eval_data if eval_data is not None else data, distributed=ddp)
    report.explained_variance, report.mse, report.l0 = m["explained_variance"], m["mse"], m["l0"]
    report.dead_fraction, report.eval_tokens = m["dead_fraction"], int(m["tokens"])
    return sae, report


@torch.no_grad()
def evaluate(sae: Any, data: Iterable[Batch], max_tokens: Optional[int] = None,
             device: Union[str, torch.device, None] = None, distributed: bool = False) -> Dict[str, float]:
    """Explained variance, MSE per token, L0 and dead fraction of ``sae`` over ``data``
    (one pass, or ``max_tokens`` rows; with ``distributed``, over every rank's ``data``:
    the sums are all-reduced, ``max_tokens`` is per rank).

    ``sae`` is a :class:`SparseAutoencoder` or anything with ``encode``/``decode`` and a
    ``d_sae`` (or ``cfg.d_sae``) — a SAELens SAE works too.
    """
    dev = device or next(iter(sae.parameters())).device
    d_sae = getattr(sae, "d_sae", None) or sae.cfg.d_sae
    n = 0
    sse = torch.zeros((), dtype=torch.float64, device=dev)
    s1: Optional[torch.Tensor] = None
    s2 = torch.zeros((), dtype=torch.float64, device=dev)
    l0 = torch.zeros((), dtype=torch.float64, device=dev)
    fired = torch.zeros(d_sae, dtype=torch.bool, device=dev)
    for b in data:
        x = _acts(b).to(dev, torch.float32)
        if max_tokens is not None and n + x.shape[0] > max_tokens:
            x = x[:max_tokens - n]
        f = sae.encode(x)
        x_hat = sae.decode(f)
        xd = x.double()
        sse += (xd - x_hat.double()).pow(2).sum()
        s1 = xd.sum(0) if s1 is None else s1 + xd.sum(0)
        s2 += xd.pow(2).sum()
        nz = f != 0
        l0 += nz.sum()
        fired |= nz.any(0)
        n += x.shape[0]
        if max_tokens is not None and n >= max_tokens:
            break
    if distributed:
        import torch.distributed as dist

        d_in = getattr(sae, "d_in", None) or sae.cfg.d_in
        if s1 is None:
            s1 = torch.zeros(d_in, dtype=torch.float64, device=dev)
        sums = torch.cat([torch.stack([sse, s2, l0, torch.tensor(float(n), dtype=torch.float64, device=dev)]), s1])
        dist.all_reduce(sums)
        sse, s2, l0, n, s1 = sums[0], sums[1], sums[2], int(sums[3]), sums[4:]
        fi = fired.to(torch.int32)
        dist.all_reduce(fi, op=dist.ReduceOp.MAX)
        fired = fi > 0
    if n == 0:
        raise ValueError("no rows to evaluate on")
    assert s1 is not None
    total_var = s2 - s1.pow(2).sum() / n
    return {"tokens": n, "explained_variance": float(1 - sse / total_var) if total_var > 0 else float("nan"),
            "mse": float(sse / n), "l0": float(l0 / n), "dead_fraction": float((~fired).sum()) / d_sae,
            "dead_features": int((~fired).sum())}


@dataclass
class TopToken:
    """One of a feature's top-activating token positions."""

    activation: float
    stream: int
    forward: int
    batch: int
    position: int
    token_index: int
    token_id: int
    text: str


@torch.no_grad()
def feature_activations(sae: SparseAutoencoder, paths: Any, module: str, batch_size: int = 4096,
                        device: Union[str, torch.device, None] = None) -> Iterator[Dict[str, torch.Tensor]]:
    """Apply ``sae`` to every token of ``module`` in stream(s) ``paths``, in file order.

    Yields one dict per batch: the row metadata of :class:`ActivationDataset` (``stream``,
    ``forward``, ``position``, ``token_id``…) and ``features`` ``[n, d_sae]`` (on CPU).
    """
    for _, b in _feature_activations(sae, paths, module, batch_size, device):
        yield b


def _feature_activations(sae: SparseAutoencoder, paths: Any, module: str, batch_size: int,
                         device: Union[str, torch.device, None]) -> Iterator[Tuple[Any, Dict[str, torch.Tensor]]]:
    from ..data import ActivationDataset

    dev = torch.device(device) if device is not None else next(sae.parameters()).device
    with ActivationDataset(paths, [module], batch_size=batch_size, dtype=torch.float32, rank=0,
                           world_size=1) as ds:
        for b in ds:
            out = {k: v for k, v in b.items() if k != "activation"}
            out["features"] = sae.encode(b["activation"].to(dev)).cpu()
            yield ds, out


@torch.no_grad()
def top_activating_tokens(sae: SparseAutoencoder, paths: Any, module: str, n: int = 10,
                          features: Optional[Sequence[int]] = None, batch_size: int = 4096,
                          device: Union[str, torch.device, None] = None) -> Dict[int, List[TopToken]]:
    """The ``n`` token positions with the highest activation of each feature (default every
    feature that fired), highest first, with their token ids and texts from the stream."""
    best_v: Optional[torch.Tensor] = None
    best_i: Optional[torch.Tensor] = None
    metas: List[Dict[str, torch.Tensor]] = []
    ds_ref = None
    offset = 0
    for ds, b in _feature_activations(sae, paths, module, batch_size, device):
        ds_ref = ds
        f = b.pop("features")
        if features is not None:
            f = f[:, list(features)]
        metas.append({k: b[k] for k in ("stream", "forward", "batch", "position", "token_index", "token_id")})
        m = min(n, f.shape[0])
        v, i = f.t().topk(m, dim=1)
        i = i + offset
        if best_v is None:
            best_v, best_i = v, i
        else:
            assert best_i is not None
            cv, ci = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
            top = cv.topk(min(n, cv.shape[1]), dim=1)
            best_v, best_i = top.values, ci.gather(1, top.indices)
        offset += f.shape[0]
    if best_v is None or ds_ref is None:
        return {}
    assert best_i is not None
    cols = {k: torch.cat([m[k] for m in metas]) for k in metas[0]}
    texts = [dict((t["token_index"], t["text"]) for t in ds_ref.tokens(s)) for s in range(len(ds_ref.paths))]
    out: Dict[int, List[TopToken]] = {}
    ids = list(features) if features is not None else list(range(best_v.shape[0]))
    for row, feat in enumerate(ids):
        lst = []
        for v, i in zip(best_v[row].tolist(), best_i[row].tolist()):
            if v <= 0:
                continue
            s, ti = int(cols["stream"][i]), int(cols["token_index"][i])
            lst.append(TopToken(v, s, int(cols["forward"][i]), int(cols["batch"][i]), int(cols["position"][i]), ti,
                                int(cols["token_id"][i]), texts[s].get(ti, "")))
        if lst or features is not None:
            out[feat] = lst
    return out
