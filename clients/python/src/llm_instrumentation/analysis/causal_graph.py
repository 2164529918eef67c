"""Causal graphs from stored activations: activation patching and path patching
(docs/ANALYSIS.md 5).

Inputs: a *clean* and a *corrupted* capture of prompts of the same length (forward ``f`` of
one pairs with forward ``f`` of the other), the model, the same inputs, and a metric of the
model's output (e.g. a logit difference). The captured outputs of the components are the
patches — nothing is recomputed to obtain them.

* **Node** ``i``: replay the corrupted input with ``i``'s output replaced by its stored
  clean value; ``effect(i) = (m_patched − m_corrupt) / (m_clean − m_corrupt)`` (1: restores
  the clean behaviour, 0: none of it).
* **Edge** ``i → j`` (path patching through the residual stream): replay the corrupted
  input and add ``clean_i − corrupt_i`` (both stored) to the residual stream *only where
  ``j`` reads it* (the input of ``j``'s reader, e.g. its LayerNorm), every other reader
  seeing the corrupted stream. ``j`` may be ``"output"`` (the final norm before the
  unembedding): the direct effect of ``i``.

Components are ``(name, reader)`` pairs: ``name`` a captured module whose output is added to
the residual stream, ``reader`` the module whose input is the residual stream that ``name``
reads. :func:`decoder_components` finds them in pre-norm decoder models (Llama, GPT-2 …).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..stream import open_stream

OUTPUT = "output"
Inputs = Union[torch.Tensor, Dict[str, Any]]


@dataclass(frozen=True)
class Component:
    """A module that writes into the residual stream.

    Attributes:
        name: the captured module (its output is the patch).
        reader: the module whose *input* is the residual stream ``name`` reads (edges into
            this component patch there); None: edges into it are not measured.
    """

    name: str
    reader: Optional[str] = None


def decoder_components(model: nn.Module) -> Tuple[List[Component], Optional[str]]:
    """Components of a pre-norm decoder (attention then MLP per block, each read through
    its own norm) and the final norm (the ``"output"`` reader).

    The readers are each block's normalisation children in order (first feeds attention,
    second the MLP); the final norm is the last normalisation module outside the blocks.

    Raises:
        ValueError: the structure is not recognised (pass components explicitly).
    """
    from .._anatomy import describe_model

    arch = describe_model(model)
    if not arch["blocks"] or len(arch["attention"]) != len(arch["blocks"]) or len(arch["mlp"]) != len(arch["blocks"]):
        raise ValueError(f"{type(model).__name__}: not a decoder with one attention and one MLP per block; "
                         "pass components=[Component(name, reader), ...]")
    comps: List[Component] = []
    for b, a, m in zip(arch["blocks"], arch["attention"], arch["mlp"]):
        block = model.get_submodule(b)
        norms = [f"{b}.{n}" for n, c in block.named_children() if "norm" in type(c).__name__.lower()]
        if len(norms) < 2:
            raise ValueError(f"{b}: expected two normalisation children (pre-norm block), found {norms}")
        comps += [Component(a, norms[0]), Component(m, norms[1])]
    in_blocks = tuple(b + "." for b in arch["blocks"])
    finals = [n for n, c in model.named_modules()
              if n and "norm" in type(c).__name__.lower() and not n.startswith(in_blocks)]
    return comps, (finals[-1] if finals else None)


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    if isinstance(out, (tuple, list)):
        return next(v for v in out if isinstance(v, torch.Tensor))
    raise TypeError(f"module output of type {type(out).__name__} holds no tensor")


def _replace_first(out: Any, new: torch.Tensor) -> Any:
    if isinstance(out, torch.Tensor):
        return new
    if isinstance(out, dict):
        k = next(k for k, v in out.items() if isinstance(v, torch.Tensor))
        out[k] = new
        return out
    items = list(out)
    i = next(i for i, v in enumerate(items) if isinstance(v, torch.Tensor))
    items[i] = new
    return type(out)(items) if isinstance(out, tuple) and type(out) is tuple else tuple(items)


@dataclass
class CausalGraph:
    """Nodes (components, plus ``"output"``), their patching effects and the path-patching
    edges between them. Effects are normalised (1 = the whole clean−corrupt difference);
    ``raw`` holds the metric differences ``m_patched − m_corrupt``.

    Attributes:
        nodes: ``{name: {"effect", "raw", "order"}}`` (``"output"`` has order ``len(components)``).
        edges: ``{(i, j): {"effect", "raw"}}``.
        baseline: ``{"clean", "corrupt"}`` metric values (mean over pairs).
        stored_vs_live: the largest difference between a stored corrupted output and the
            model's live one on the corrupted input, relative to its RMS (0 for a lossless
            capture of this model on a deterministic device).
    """

    nodes: Dict[str, Dict[str, float]] = field(default_factory=dict)
    edges: Dict[Tuple[str, str], Dict[str, float]] = field(default_factory=dict)
    baseline: Dict[str, float] = field(default_factory=dict)
    stored_vs_live: float = 0.0
    pairs: int = 0

    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph``: node attribute ``effect``/``raw``/``order``, edge
        attribute ``effect``/``raw``."""
        import networkx as nx

        g = nx.DiGraph(baseline=dict(self.baseline), stored_vs_live=self.stored_vs_live, pairs=self.pairs)
        for n, a in self.nodes.items():
            g.add_node(n, **a)
        for (i, j), a in self.edges.items():
            g.add_edge(i, j, **a)
        return g

    def to_dict(self) -> Dict[str, Any]:
        return {"format": "strap-causal-graph", "version": 1, "baseline": self.baseline,
                "stored_vs_live": self.stored_vs_live, "pairs": self.pairs,
                "nodes": [{"name": n, **a} for n, a in self.nodes.items()],
                "edges": [{"source": i, "target": j, **a} for (i, j), a in self.edges.items()]}

    def save_json(self, path: Union[str, os.PathLike]) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load_json(cls, path: Union[str, os.PathLike]) -> "CausalGraph":
        with open(path) as f:
            d = json.load(f)
        if d.get("format") != "strap-causal-graph":
            raise ValueError(f"{path} is not a strap causal graph")
        g = cls(baseline=d["baseline"], stored_vs_live=d["stored_vs_live"], pairs=d["pairs"])
        g.nodes = {n.pop("name"): n for n in d["nodes"]}
        g.edges = {(e.pop("source"), e.pop("target")): e for e in d["edges"]}
        return g

    def important(self, threshold: float = 0.1) -> Tuple[List[str], List[Tuple[str, str]]]:
        """Nodes and edges whose ``|effect| ≥ threshold``."""
        return ([n for n, a in self.nodes.items() if n != OUTPUT and abs(a["effect"]) >= threshold],
                [e for e, a in self.edges.items() if abs(a["effect"]) >= threshold])

    def save_png(self, path: Union[str, os.PathLike], threshold: float = 0.05, title: Optional[str] = None) -> None:
        """Draw the graph: components left to right in model order, node colour = effect,
        edges with ``|effect| ≥ threshold`` (width ∝ |effect|, red negative)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = sorted(self.nodes, key=lambda n: self.nodes[n]["order"])
        pos = {n: (k, (k % 2) * 0.6) for k, n in enumerate(order)}
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(order)), 4))
        vmax = max([abs(a["effect"]) for a in self.nodes.values()] + [1e-9])
        for (i, j), a in self.edges.items():
            e = a["effect"]
            if abs(e) < threshold:
                continue
            (x0, y0), (x1, y1) = pos[i], pos[j]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops=dict(arrowstyle="-|>", lw=0.5 + 4 * min(1.0, abs(e)),
                                        color="tab:red" if e < 0 else "tab:blue", alpha=0.8,
                                        connectionstyle="arc3,rad=0.25", shrinkA=14, shrinkB=14))
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.25 + 0.1 * ((x1 - x0) % 3), f"{e:.2f}", fontsize=7, ha="center")
        cmap = plt.get_cmap("coolwarm")
        for n in order:
            e = self.nodes[n]["effect"]
            x, y = pos[n]
            ax.scatter([x], [y], s=900, color=cmap(0.5 + 0.5 * e / vmax), edgecolors="black", zorder=3)
            ax.text(x, y - 0.38, n, fontsize=7, ha="center", rotation=20)
            ax.text(x, y, f"{e:.2f}", fontsize=7, ha="center", va="center", zorder=4)
        ax.set_xlim(-0.7, len(order) - 0.3)
        ax.set_ylim(-1.0, 1.5)
        ax.axis("off")
        ax.set_title(title or f"activation / path patching (clean {self.baseline.get('clean', 0):.3g}, "
                               f"corrupt {self.baseline.get('corrupt', 0):.3g}; edges |effect| ≥ {threshold})",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def _load(path: Union[str, os.PathLike], names: Sequence[str], forwards: Sequence[int]) -> Dict[str, List[torch.Tensor]]:
    out: Dict[str, List[torch.Tensor]] = {}
    with open_stream(path) as r:
        have = set(r.names())
        for n in names:
            if n not in have:
                raise ValueError(f"{path}: no captured output of {n!r} (captured: {sorted(have)})")
            ts = r.tensors(n)
            if max(forwards) >= len(ts):
                raise ValueError(f"{path}: {n} has {len(ts)} captured forwards, forward {max(forwards)} asked for")
            out[n] = [ts[f].tensor() for f in forwards]
    return out


def _as_list(x: Union[Inputs, Sequence[Inputs]]) -> List[Inputs]:
    if isinstance(x, (torch.Tensor, dict)):
        return [x]
    return list(x)


@torch.no_grad()
def patching_graph(model: nn.Module, clean: Union[str, os.PathLike], corrupt: Union[str, os.PathLike],
                   clean_inputs: Union[Inputs, Sequence[Inputs]], corrupt_inputs: Union[Inputs, Sequence[Inputs]],
                   metric: Callable[[Any], Union[float, torch.Tensor]],
                   components: Optional[Sequence[Union[Component, Tuple[str, Optional[str]]]]] = None,
                   output_reader: Optional[str] = None, edges: bool = True, forwards: Optional[Sequence[int]] = None,
                   tolerance: Optional[float] = None) -> CausalGraph:
    """Activation patching (nodes) and path patching (edges) from two captures.

    Args:
        model: the captured model (eval mode; its forward is replayed).
        clean, corrupt: the two stream files.
        clean_inputs, corrupt_inputs: what was fed for each captured forward (an
            ``input_ids`` tensor or a dict of keyword arguments), in order.
        metric: ``metric(model_output) → float``, e.g. a logit difference.
        components: ``Component``\\ s or ``(name, reader)`` pairs in model order (default
            :func:`decoder_components`).
        output_reader: the module whose input is the final residual stream (default: the
            final norm found by :func:`decoder_components`); None with explicit components
            leaves out the ``"output"`` edges.
        edges: measure edges (``len(components)²/2`` replays per pair) or only nodes.
        forwards: which captured forwards to use (default: one per input pair).
        tolerance: largest allowed difference between stored corrupted outputs and the
            model's live ones, relative to the live output's RMS (default 1e-5 for lossless
            captures, 1e-2 for lossy ones) — a capture of another model or of other inputs
            is refused.

    Returns:
        a :class:`CausalGraph` (effects averaged over the pairs).

    Example:
        >>> def logit_diff(out):
        ...     return float(out.logits[0, -1, good] - out.logits[0, -1, bad])   # doctest: +SKIP
        >>> g = patching_graph(model, "clean.strap", "corrupt.strap", clean_ids, corrupt_ids,
        ...                    logit_diff)                                          # doctest: +SKIP
        >>> g.save_png("graph.png"); g.to_networkx()                                # doctest: +SKIP
    """
    if components is None:
        comps, auto_out = decoder_components(model)
        output_reader = output_reader or auto_out
    else:
        comps = [c if isinstance(c, Component) else Component(*c) for c in components]
    names = [c.name for c in comps]
    if len(set(names)) != len(names):
        raise ValueError(f"components listed twice: {names}")
    mods = dict(model.named_modules())
    for n in names + [c.reader for c in comps if c.reader] + ([output_reader] if output_reader else []):
        if n not in mods:
            raise ValueError(f"{type(model).__name__} has no module {n!r}")
    cin, kin = _as_list(clean_inputs), _as_list(corrupt_inputs)
    if len(cin) != len(kin) or not cin:
        raise ValueError(f"{len(cin)} clean inputs and {len(kin)} corrupted inputs: pass one pair per forward")
    fw = list(forwards) if forwards is not None else list(range(len(cin)))
    if len(fw) != len(cin):
        raise ValueError(f"{len(fw)} forwards for {len(cin)} input pairs")
    stored_clean = _load(clean, names, fw)
    stored_corrupt = _load(corrupt, names, fw)
    lossy = _is_lossy(clean) or _is_lossy(corrupt)
    for n in names:
        for a, b in zip(stored_clean[n], stored_corrupt[n]):
            if a.shape != b.shape:
                raise ValueError(f"{n}: clean {tuple(a.shape)} vs corrupted {tuple(b.shape)}: prompts must have the "
                                 "same length")

    def run(inp: Inputs) -> float:
        out = model(**inp) if isinstance(inp, dict) else model(inp)
        v = metric(out)
        return float(v.item() if isinstance(v, torch.Tensor) else v)

    def hooked(inp: Inputs, hooks: List[Tuple[str, str, Callable[..., Any]]]) -> float:
        handles = []
        try:
            for kind, name, fn in hooks:
                m = mods[name]
                handles.append(m.register_forward_hook(fn) if kind == "out" else
                               m.register_forward_pre_hook(fn, with_kwargs=True))
            return run(inp)
        finally:
            for h in handles:
                h.remove()

    graph = CausalGraph(pairs=len(cin))
    readers = [(c.name, c.reader) for c in comps if c.reader] + ([(OUTPUT, output_reader)] if output_reader else [])
    order = {c.name: k for k, c in enumerate(comps)}
    order[OUTPUT] = len(comps)
    node_raw = {n: 0.0 for n in names}
    edge_raw: Dict[Tuple[str, str], float] = {}
    m_clean_sum = m_corrupt_sum = 0.0
    worst = 0.0
    for p, (ci, ki) in enumerate(zip(cin, kin)):
        m_clean = run(ci)
        # Corrupted baseline, checking the stored corrupted outputs are this model's on this input.
        diffs: Dict[str, float] = {}

        def check(n: str) -> Callable[..., Any]:
            def fn(mod: nn.Module, args: Any, out: Any) -> None:
                live = _first_tensor(out)
                st = stored_corrupt[n][p].to(live.device, live.dtype)
                d = (live.float() - st.float()).abs().max().item() if live.numel() else 0.0
                rms = live.float().pow(2).mean().sqrt().item() if live.numel() else 0.0
                diffs[n] = max(diffs.get(n, 0.0), d / (rms or 1.0))
            return fn

        m_corrupt = hooked(ki, [("out", n, check(n)) for n in names])
        worst = max([worst] + list(diffs.values()))
        tol = tolerance if tolerance is not None else (1e-2 if lossy else 1e-5)
        bad = {n: d for n, d in diffs.items() if d > tol}
        if bad:
            raise ValueError(f"pair {p}: stored corrupted outputs differ from the model's live ones on the corrupted "
                             f"input ({bad}; tolerance {tol}): not a capture of this model on these inputs")
        m_clean_sum += m_clean
        m_corrupt_sum += m_corrupt

        def patch_out(n: str) -> Callable[..., Any]:
            def fn(mod: nn.Module, args: Any, out: Any) -> Any:
                live = _first_tensor(out)
                return _replace_first(out, stored_clean[n][p].to(live.device, live.dtype))
            return fn

        for n in names:
            node_raw[n] += hooked(ki, [("out", n, patch_out(n))]) - m_corrupt
        if not edges:
            continue
        for i in names:
            delta = (stored_clean[i][p].float() - stored_corrupt[i][p].float())

            def add_delta(mod: nn.Module, args: Any, kwargs: Dict[str, Any], delta: torch.Tensor = delta) -> Any:
                if args and isinstance(args[0], torch.Tensor):
                    x = args[0]
                    return (x + delta.to(x.device, x.dtype),) + tuple(args[1:]), kwargs
                k = next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
                if k is None:
                    raise TypeError(f"{type(mod).__name__}: no tensor input to patch")
                kwargs = dict(kwargs)
                kwargs[k] = kwargs[k] + delta.to(kwargs[k].device, kwargs[k].dtype)
                return args, kwargs

            for j, reader in readers:
                if order[j] <= order[i]:
                    continue
                edge_raw[(i, j)] = edge_raw.get((i, j), 0.0) + hooked(ki, [("pre", reader, add_delta)]) - m_corrupt
    n_pairs = len(cin)
    mc, mk = m_clean_sum / n_pairs, m_corrupt_sum / n_pairs
    denom = mc - mk
    if denom == 0:
        raise ValueError(f"the metric is {mc} on both the clean and the corrupted inputs: nothing to attribute")
    graph.baseline = {"clean": mc, "corrupt": mk}
    graph.stored_vs_live = worst
    for n in names:
        r = node_raw[n] / n_pairs
        graph.nodes[n] = {"effect": r / denom, "raw": r, "order": order[n]}
    if output_reader:
        graph.nodes[OUTPUT] = {"effect": 1.0, "raw": denom, "order": order[OUTPUT]}
    for e, v in edge_raw.items():
        r = v / n_pairs
        graph.edges[e] = {"effect": r / denom, "raw": r}
    return graph


def _is_lossy(path: Union[str, os.PathLike]) -> bool:
    with open_stream(path) as r:
        return r.metadata.get("codec") in ("quant", "fp16", "fp8", "transform")
