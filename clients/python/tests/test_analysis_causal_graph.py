"""Causal graphs from stored activations (real strapd captures): a tiny residual model in
which one path carries the effect, with decoys that are active but causally inert."""

from __future__ import annotations

import json

import networkx as nx
import pytest
import torch
from torch import nn

from llm_instrumentation import capture_activations
from llm_instrumentation.analysis.causal_graph import (
    OUTPUT,
    CausalGraph,
    Component,
    decoder_components,
    patching_graph,
)

pytestmark = pytest.mark.integration
D, V, T = 8, 6, 4
E_TOK, E_MID, E_OUT, E_DECOY, E_BIAS = 0, 1, 2, 3, 4


class Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(·)). Identity norms keep the
    arithmetic exact; the components are linear maps with planted weights."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.Identity(), nn.Identity()
        self.attn, self.mlp = nn.Linear(D, D), nn.Linear(D, D)
        for m in (self.attn, self.mlp):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Planted(nn.Module):
    """Token identity (direction E_TOK) → layers.0.mlp writes E_MID → layers.2.attn reads
    E_MID, writes E_OUT → the unembedding reads E_OUT only. Decoys: layers.1.attn copies the
    token direction into E_DECOY, which nothing reads (large clean/corrupt difference, no
    effect); layers.1.mlp writes a large constant (active, identical on both inputs);
    layers.0.attn reads E_TOK and writes E_DECOY too."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        with torch.no_grad():
            self.embed.weight.zero_()
            self.embed.weight[:, E_TOK] = torch.arange(V, dtype=torch.float32)  # token id along E_TOK
            self.embed.weight[:, 5] = 1.0
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.ln_f = nn.Identity()
        self.unembed = nn.Linear(D, V, bias=False)
        with torch.no_grad():
            L = self.layers
            L[0].mlp.weight[E_MID, E_TOK] = 2.0
            L[2].attn.weight[E_OUT, E_MID] = 1.5
            L[1].attn.weight[E_DECOY, E_TOK] = 5.0
            L[0].attn.weight[E_DECOY, E_TOK] = -3.0
            L[1].mlp.bias[E_BIAS] = 7.0
            self.unembed.weight.zero_()
            self.unembed.weight[1, E_OUT] = 1.0
            self.unembed.weight[2, E_OUT] = -1.0
            self.unembed.weight[3, E_BIAS] = 0.3  # reads the constant: no difference either way

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for b in self.layers:
            x = b(x)
        return self.unembed(self.ln_f(x))


COMPONENTS = [Component(f"layers.{i}.{c}", f"layers.{i}.ln_{1 if c == 'attn' else 2}")
              for i in range(3) for c in ("attn", "mlp")]


def logit_diff(logits: torch.Tensor) -> float:
    return float((logits[:, -1, 1] - logits[:, -1, 2]).mean())


def capture(model, inputs, out, socket):
    with torch.no_grad():
        with capture_activations(model, preset="balanced", output_path=out, socket_path=socket,
                                 autostart_daemon=False, modules=["layers.*.attn", "layers.*.mlp"]) as fw:
            for x in inputs:
                model(x)
    assert fw.summary["drops"] == 0


@pytest.fixture
def planted(real_strapd, tmp_path):
    model = Planted().eval()
    clean = [torch.tensor([[0, 1, 2, 5]]), torch.tensor([[3, 3, 1, 4]])]
    corrupt = [torch.tensor([[0, 1, 2, 1]]), torch.tensor([[3, 3, 1, 0]])]
    capture(model, clean, tmp_path / "clean.strap", real_strapd.socket)
    capture(model, corrupt, tmp_path / "corrupt.strap", real_strapd.socket)
    return model, clean, corrupt, tmp_path


def test_finds_the_planted_path(planted):
    model, clean, corrupt, tmp = planted
    g = patching_graph(model, tmp / "clean.strap", tmp / "corrupt.strap", clean, corrupt, logit_diff,
                       components=COMPONENTS, output_reader="ln_f")
    assert g.baseline["clean"] != g.baseline["corrupt"] and g.stored_vs_live == 0.0
    eff = {n: a["effect"] for n, a in g.nodes.items()}
    # patching either component of the path restores the whole clean behaviour
    assert eff["layers.0.mlp"] == pytest.approx(1.0, abs=1e-5)
    assert eff["layers.2.attn"] == pytest.approx(1.0, abs=1e-5)
    for decoy in ("layers.0.attn", "layers.1.attn", "layers.1.mlp", "layers.2.mlp"):
        assert eff[decoy] == pytest.approx(0.0, abs=1e-5), decoy
    e = {k: a["effect"] for k, a in g.edges.items()}
    assert e[("layers.0.mlp", "layers.2.attn")] == pytest.approx(1.0, abs=1e-5)
    assert e[("layers.2.attn", OUTPUT)] == pytest.approx(1.0, abs=1e-5)
    # layers.0.mlp acts only through layers.2.attn: no direct effect on the output
    assert e[("layers.0.mlp", OUTPUT)] == pytest.approx(0.0, abs=1e-5)
    nodes, edges = g.important(0.5)
    assert sorted(nodes) == ["layers.0.mlp", "layers.2.attn"]
    assert sorted(edges) == [("layers.0.mlp", "layers.2.attn"), ("layers.2.attn", OUTPUT)]
    # edges only go forward in model order, into every later reader and the output
    assert len(g.edges) == sum(6 - k for k in range(6))

    G = g.to_networkx()
    assert isinstance(G, nx.DiGraph)
    strong = nx.DiGraph([(i, j) for i, j, a in G.edges(data=True) if abs(a["effect"]) > 0.5])
    assert nx.has_path(strong, "layers.0.mlp", OUTPUT)
    assert list(nx.all_simple_paths(strong, "layers.0.mlp", OUTPUT)) == [["layers.0.mlp", "layers.2.attn", OUTPUT]]
    g.save_json(tmp / "g.json")
    back = CausalGraph.load_json(tmp / "g.json")
    assert back.nodes == g.nodes and back.edges == g.edges
    assert json.loads((tmp / "g.json").read_text())["format"] == "strap-causal-graph"
    g.save_png(tmp / "g.png")
    assert (tmp / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refuses_a_capture_of_other_inputs(planted):
    model, clean, corrupt, tmp = planted
    other = [torch.tensor([[0, 1, 2, 2]]), torch.tensor([[3, 3, 1, 1]])]
    with pytest.raises(ValueError, match="differ from the model's live ones"):
        patching_graph(model, tmp / "clean.strap", tmp / "corrupt.strap", clean, other, logit_diff,
                       components=COMPONENTS, output_reader="ln_f", edges=False)
    with pytest.raises(ValueError, match="no captured output"):
        patching_graph(model, tmp / "clean.strap", tmp / "corrupt.strap", clean, corrupt, logit_diff,
                       components=[Component("embed")], edges=False)


def test_llama_last_block_restores_clean(real_strapd, tmp_path):
    """On a real HF model: components found automatically; patching the last block's whole
    output with its stored clean value gives exactly the clean metric."""
    from conftest import tiny_llama

    model = tiny_llama()
    comps, final = decoder_components(model)
    assert comps[0] == Component("model.layers.0.self_attn", "model.layers.0.input_layernorm")
    assert comps[1] == Component("model.layers.0.mlp", "model.layers.0.post_attention_layernorm")
    assert final == "model.norm" and len(comps) == 8
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 1000, (1, 7), generator=g)
    corrupt = clean.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 17) % 1000
    for name, x in (("clean", clean), ("corrupt", corrupt)):
        with torch.no_grad():
            with capture_activations(model, preset="balanced", output_path=tmp_path / f"{name}.strap",
                                     socket_path=real_strapd.socket, autostart_daemon=False):
                model(input_ids=x)

    def metric(out):
        return float(out.logits[0, -1, 5] - out.logits[0, -1, 9])

    res = patching_graph(model, tmp_path / "clean.strap", tmp_path / "corrupt.strap", {"input_ids": clean},
                         {"input_ids": corrupt}, metric, components=[Component("model.layers.3", None)],
                         output_reader=None, edges=False)
    assert res.nodes["model.layers.3"]["effect"] == pytest.approx(1.0, abs=1e-4)
    full = patching_graph(model, tmp_path / "clean.strap", tmp_path / "corrupt.strap", {"input_ids": clean},
                          {"input_ids": corrupt}, metric)
    assert set(full.nodes) == {c.name for c in comps} | {OUTPUT}
    assert len(full.edges) == sum(8 - k for k in range(8))
    assert full.stored_vs_live == 0.0
    assert all((c.name, OUTPUT) in full.edges for c in comps)
    assert all(torch.isfinite(torch.tensor(a["effect"])) for a in full.edges.values())
