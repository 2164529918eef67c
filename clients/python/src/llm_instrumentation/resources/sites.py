"""Which modules of a model the monitor times, and what each one is (a :class:`Site`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from .._anatomy import ATTENTION_NAMES, LAYER_RE, MLP_NAMES, MLP_OPS, activation_name, describe_model
from .levels import ResourceLevel

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

__all__ = ["FLOPS_PER_ELEMENT", "Site", "classify", "component_of", "layer_of", "layer_prefix"]

#: FLOPs per element assumed for the non-matmul modules. They are conventions, not
#: measurements, and every event using one says so (``flops_per_element``).
FLOPS_PER_ELEMENT = {
    "rms_norm": 4,      # square, mean (add), rsqrt-scale, weight multiply
    "layer_norm": 7,    # mean, subtract, square, mean, rsqrt-scale, weight, bias
    "silu": 4,          # x * sigmoid(x): exp, add, divide, multiply
    "gelu": 8,          # tanh approximation
    "relu": 1,
    "elementwise": 1,
}


class Site:
    """One timed module: what it is, where it sits, and what its events repeat.

    ``static`` is a Linear's (weight shape, weight dtype, weight+bias bytes, in_features,
    out_features); ``attn_static`` an attention's (sequence first, heads, head dim, cache
    layer) for the writer; ``t0``/``ev0`` the model's start time (its pre hook).
    """

    __slots__ = ("name", "mod", "kind", "level", "layer_id", "component", "mlp_op", "activation", "leaf",
                 "t0", "ev0", "n_heads", "head_dim", "flops_per_element", "static", "attn_static")

    def __init__(self, name: str, mod: Any, kind: str, level: ResourceLevel, layer_id: Optional[int],
                 component: str) -> None:
        self.name = name
        self.mod = mod
        self.kind = kind
        self.level = level
        self.layer_id = layer_id
        self.component = component
        self.mlp_op: Optional[str] = None
        self.activation: Optional[str] = None
        self.leaf = name.rsplit(".", 1)[-1] if name else "model"
        self.t0 = 0
        self.ev0: Any = None
        self.n_heads: Optional[int] = None
        self.head_dim: Optional[int] = None
        self.flops_per_element: Optional[int] = None
        self.static: Any = None
        self.attn_static: Any = None


def layer_prefix(model: "nn.Module") -> Optional[str]:
    """The name of the model's list of decoder blocks (``model.layers``), None if it has none."""
    try:
        prefix = describe_model(model).get("layer_prefix")
        return prefix if isinstance(prefix, str) else None
    except Exception:  # any model without a recognisable block list
        return None


def layer_of(name: str, prefix: Optional[str]) -> Optional[int]:
    """The decoder block a module belongs to (None outside the blocks)."""
    if prefix and name.startswith(prefix + "."):
        head = name[len(prefix) + 1:].split(".", 1)[0]
        if head.isdigit():
            return int(head)
        return None
    m = LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def component_of(name: str, mod: "nn.Module") -> str:
    """``attention``, ``mlp``, ``norm``, ``embedding``, ``model``, or the module's own name."""
    parts = name.split(".") if name else []
    if not parts:
        return "model"
    for p in parts:
        if p in ATTENTION_NAMES:
            return "attention"
        if p in MLP_NAMES:
            return "mlp"
    cls = type(mod).__name__.lower()
    if "norm" in cls:
        return "norm"
    if "embed" in cls or "embed" in parts[-1]:
        return "embedding"
    return parts[-1]


def classify(model: "nn.Module", name: str, mod: "nn.Module", parents: Dict[str, "nn.Module"],
             prefix: Optional[str]) -> Optional[Site]:
    """The site of module ``name`` (None: not timed itself, e.g. a decoder block)."""
    import torch.nn as nn

    layer = layer_of(name, prefix)
    comp = component_of(name, mod)
    leaf = name.rsplit(".", 1)[-1] if name else ""
    cls = type(mod).__name__
    if name == "":
        return Site(name, mod, "model", ResourceLevel.MINIMAL, None, "model")
    if isinstance(mod, nn.Linear) or cls == "Conv1D":
        s = Site(name, mod, "linear", ResourceLevel.MINIMAL, layer, comp)
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if comp == "mlp" and leaf in MLP_OPS:
            s.mlp_op = MLP_OPS[leaf]
            pm = parents.get(parent)
            act = getattr(pm, "act_fn", None) or getattr(pm, "act", None) or getattr(pm, "activation_fn", None)
            s.activation = activation_name(act) if act is not None else None
            if s.activation is None:
                ha = getattr(getattr(model, "config", None), "hidden_act", None)
                s.activation = ha if isinstance(ha, str) else None
        return s
    has_children = any(True for _ in mod.children())
    if leaf in ATTENTION_NAMES and has_children:
        s = Site(name, mod, "attention", ResourceLevel.MINIMAL, layer, "attention")
        cfg = getattr(mod, "config", None) or getattr(model, "config", None)
        heads = getattr(mod, "num_heads", None) or getattr(cfg, "num_attention_heads", None) \
            or getattr(cfg, "n_head", None)
        hd = getattr(mod, "head_dim", None)
        if hd is None and heads:
            hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
            hd = hidden // heads if hidden else None
        s.n_heads = int(heads) if heads else None
        s.head_dim = int(hd) if hd else None
        return s
    if leaf in MLP_NAMES and has_children:
        return Site(name, mod, "mlp", ResourceLevel.DETAILED, layer, "mlp")
    if has_children:
        return None
    low = cls.lower()
    if "norm" in low:
        s = Site(name, mod, "norm", ResourceLevel.DETAILED, layer, comp)
        s.flops_per_element = FLOPS_PER_ELEMENT["rms_norm" if "rms" in low else "layer_norm"]
        return s
    act = activation_name(mod)
    if act is not None:
        s = Site(name, mod, "activation", ResourceLevel.DETAILED, layer, comp)
        s.activation = act
        s.flops_per_element = FLOPS_PER_ELEMENT.get(act, FLOPS_PER_ELEMENT["elementwise"])
        return s
    if isinstance(mod, nn.Embedding):
        return Site(name, mod, "embedding", ResourceLevel.DETAILED, layer, "embedding")
    return Site(name, mod, "leaf", ResourceLevel.VERBOSE, layer, comp)
