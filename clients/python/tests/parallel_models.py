"""A small decoder written by hand in tensor- and pipeline-parallel form, for the multi-rank
capture tests (test_parallel_capture.py, child torchrun_parallel.py).

One set of full weights (``torch.manual_seed(0)``) is built identically on every rank, and
each rank keeps its slice: column-parallel linears (``q_proj``/``k_proj``/``v_proj``,
``mlp.fc1``) keep rows ``[r·n/tp, (r+1)·n/tp)`` of the weight, so their outputs are the
last-axis pieces of the whole output; attention runs on this rank's heads
(``self_attn.heads`` outputs its heads' context, a piece too; ``self_attn.context`` hands
it on as a DTensor on a rank given a DeviceMesh, so the capture must find the piece from the
DTensor's placements); row-parallel linears
(``o_proj``, ``mlp.fc2``) multiply their input piece by their column slice and the ranks
sum the partial results with ``dist.all_reduce`` — the model's own collective, after which
every tp rank holds the same tensor (the attention, MLP and block outputs: replicated).

The single-process reference (``tp_rank=None``) holds the whole weights and computes the
same pieces one after the other with the same shapes, then concatenates (column) or adds
in rank order (row): float arithmetic of a split matmul differs from an unsplit one, so
"the same model" means the same split, and then the stitched pieces of the ranks equal the
reference bit for bit. With tp_size 2 the sum ``p0 + p1`` is the all-reduce's exactly
(float addition commutes).

Module names are Llama's (``model.layers.N.self_attn``, ``.mlp``), so the capture's
FULL_TENSOR choice finds the blocks; a pipeline stage keeps only its layers, under their
global index (``model.layers`` is a ``ModuleDict``), so names match the reference's.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

D, HEADS, FFN, LAYERS, VOCAB = 32, 4, 64, 2, 50

#: the sub-modules captured besides the blocks, attention and MLP (their outputs are pieces)
SHARDED = ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.heads", "model.layers.*.mlp.fc1",
           "model.layers.*.mlp.act"]
SHARDING = {p: {"shard": 2} for p in SHARDED}
#: the blocks, attention and MLP outputs (whole on every tp rank after the all-reduce)
WHOLE = ["model.layers.[0-9]", "model.layers.[0-9].self_attn", "model.layers.[0-9].mlp"]
#: a DTensor output (a piece on a tp rank given a mesh), named by no ``sharding`` pattern
DETECTED = ["model.layers.*.self_attn.context"]
MODULES = WHOLE + SHARDED + DETECTED


def _chunks(w: torch.Tensor, n: int, dim: int) -> List[torch.Tensor]:
    return [c.contiguous() for c in w.chunk(n, dim=dim)]


class Column(nn.Module):
    """Column-parallel linear: rank ``r`` keeps output rows of chunk ``r``."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, tp: int, rank: Optional[int]) -> None:
        super().__init__()
        ws, bs = _chunks(w, tp, 0), _chunks(b, tp, 0)
        keep = range(tp) if rank is None else [rank]
        self.ws = nn.ParameterList([nn.Parameter(ws[i]) for i in keep])
        self.bs = nn.ParameterList([nn.Parameter(bs[i]) for i in keep])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [F.linear(x, w, b) for w, b in zip(self.ws, self.bs)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class Row(nn.Module):
    """Row-parallel linear: rank ``r`` multiplies input piece ``r`` by its column slice; the
    partial results are summed across the tp ranks (all-reduce), then the bias added."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, tp: int, rank: Optional[int], group=None) -> None:
        super().__init__()
        ws = _chunks(w, tp, 1)
        keep = range(tp) if rank is None else [rank]
        self.ws = nn.ParameterList([nn.Parameter(ws[i]) for i in keep])
        self.b = nn.Parameter(b.clone())
        self.tp, self.rank, self.group = tp, rank, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank is None:
            xs = _chunks(x, self.tp, -1)
            out = F.linear(xs[0], self.ws[0])
            for xi, w in zip(xs[1:], self.ws[1:]):
                out = out + F.linear(xi, w)
        else:
            out = F.linear(x, self.ws[0])
            if self.tp > 1:
                import torch.distributed as dist

                dist.all_reduce(out, group=self.group)
        return out + self.b


class Heads(nn.Module):
    """Scaled dot-product attention over this rank's heads; output ``[B, T, heads·hd]``."""

    def __init__(self, n_heads: int, hd: int, chunks: int) -> None:
        super().__init__()
        self.n_heads, self.hd, self.chunks = n_heads, hd, chunks

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for qc, kc, vc in zip(_chunks(q, self.chunks, -1), _chunks(k, self.chunks, -1), _chunks(v, self.chunks, -1)):
            b, t, _ = qc.shape
            h = self.n_heads // self.chunks

            def split(x: torch.Tensor) -> torch.Tensor:
                return x.view(b, t, h, self.hd).transpose(1, 2)

            s = split(qc) @ split(kc).transpose(-1, -2) / math.sqrt(self.hd)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            p = s.masked_fill(mask, float("-inf")).softmax(-1)
            outs.append((p @ split(vc)).transpose(1, 2).reshape(b, t, h * self.hd))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class AsDTensor(nn.Module):
    """On a tp rank given a DeviceMesh: its input as a DTensor sharded on the last axis over
    the mesh's ``tp`` dimension (no communication: ``run_check=False``); elsewhere the input.
    Nothing in ``sharding=`` names it: the capture tells the piece from the DTensor."""

    def __init__(self, mesh=None) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor):
        if self.mesh is None:
            return x
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(x, self.mesh["tp"], [Shard(2)], run_check=False)


class Attention(nn.Module):
    def __init__(self, ws: dict, tp: int, rank: Optional[int], group=None, mesh=None) -> None:
        super().__init__()
        self.q_proj = Column(ws["wq"], ws["bq"], tp, rank)
        self.k_proj = Column(ws["wk"], ws["bk"], tp, rank)
        self.v_proj = Column(ws["wv"], ws["bv"], tp, rank)
        self.heads = Heads(HEADS if rank is None else HEADS // tp, D // HEADS, tp if rank is None else 1)
        self.context = AsDTensor(mesh if rank is not None else None)
        self.o_proj = Row(ws["wo"], ws["bo"], tp, rank, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.context(self.heads(self.q_proj(x), self.k_proj(x), self.v_proj(x)))
        return self.o_proj(c.to_local() if hasattr(c, "to_local") else c)


class MLP(nn.Module):
    def __init__(self, ws: dict, tp: int, rank: Optional[int], group=None) -> None:
        super().__init__()
        self.fc1 = Column(ws["w1"], ws["b1"], tp, rank)
        self.act = nn.GELU()
        self.fc2 = Row(ws["w2"], ws["b2"], tp, rank, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, ws: dict, tp: int, rank: Optional[int], group=None, mesh=None) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attn = Attention(ws, tp, rank, group, mesh)
        self.post_attention_layernorm = nn.LayerNorm(D)
        self.mlp = MLP(ws, tp, rank, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, layers: nn.ModuleDict, embed: Optional[nn.Embedding]) -> None:
        super().__init__()
        self.embed_tokens = embed
        self.layers = layers


class Decoder(nn.Module):
    """The model, or a pipeline stage of it (``stages`` > 1: stage ``stage`` keeps layers
    ``[stage·L/stages, (stage+1)·L/stages)``; the first embeds, the last has the head;
    activations go from stage to stage by ``dist.send``/``recv`` inside ``forward``)."""

    def __init__(self, tp: int = 1, rank: Optional[int] = None, stage: int = 0, stages: int = 1,
                 group=None, pp_peers: Sequence[int] = (), mesh=None) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g) * 0.2

        emb = rnd(VOCAB, D)
        all_ws = [{"wq": rnd(D, D), "bq": rnd(D), "wk": rnd(D, D), "bk": rnd(D), "wv": rnd(D, D), "bv": rnd(D),
                   "wo": rnd(D, D), "bo": rnd(D), "w1": rnd(FFN, D), "b1": rnd(FFN), "w2": rnd(D, FFN), "b2": rnd(D)}
                  for _ in range(LAYERS)]
        head = rnd(VOCAB, D)
        per = LAYERS // stages
        mine = range(stage * per, (stage + 1) * per)
        layers = nn.ModuleDict({str(i): Layer(all_ws[i], tp, rank, group, mesh) for i in mine})
        embed = nn.Embedding(VOCAB, D, _weight=emb.clone()) if stage == 0 else None
        self.model = Inner(layers, embed)
        self.lm_head = nn.Linear(D, VOCAB, bias=False) if stage == stages - 1 else None
        if self.lm_head is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(head)
        self.stage, self.stages, self.pp_peers = stage, stages, list(pp_peers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        b, t = input_ids.shape
        if self.model.embed_tokens is not None:
            x = self.model.embed_tokens(input_ids)
        else:
            x = torch.empty(b, t, D)
            dist.recv(x, src=self.pp_peers[self.stage - 1])
        for layer in self.model.layers.values():
            x = layer(x)
        if self.lm_head is None:
            dist.send(x.contiguous(), dst=self.pp_peers[self.stage + 1])
            return x
        return self.lm_head(x)


def inputs(dp_rank: int, forwards: int = 2, seq: int = 5) -> List[torch.Tensor]:
    """The token ids of data-parallel replica ``dp_rank``'s forward passes."""
    g = torch.Generator().manual_seed(100 + dp_rank)
    return [torch.randint(0, VOCAB, (1, seq), generator=g) for _ in range(forwards)]
