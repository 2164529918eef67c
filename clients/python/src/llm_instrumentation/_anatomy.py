"""Model anatomy: the names Hugging Face and similar models give their parts, and where a
model's decoder blocks, attention and MLP modules are (:func:`describe_model`), at any
nesting depth.

One table and one detector for everything that looks for a model's parts: which modules a
capture hooks (``_hooks.select_modules``), the default ring's size (``_ringsize``), the stream
metadata (``_open``), the resource monitor's module classification (``resources/sites.py``)
and the causal graph (``analysis/causal_graph.py``). A leaf: it imports nothing of the
package, so every layer may use it (docs/ARCHITECTURE.md, "The Python client").

The original 1.3.1 looked only at the root's direct children, so on a Hugging Face model it
found nothing but ``lm_head``. Here the decoder stack is the largest ``nn.ModuleList`` whose
children share one class (``model.layers``, ``transformer.h``, ``bert.encoder.layer``, ...),
and each block's attention / MLP are its direct children with the usual names.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, cast

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

#: Direct children of a block that are its attention module, in preference order.
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
#: Direct children of a block that are its MLP module(s).
MLP_NAMES = ("mlp", "feed_forward", "ffn", "intermediate")
#: Linear layers of an MLP, by the names Llama/Mistral, Mixtral, GPT-2 and GPT-NeoX use, and
#: the role each plays.
MLP_OPS: Dict[str, str] = {
    "gate_proj": "gate_proj", "w1": "gate_proj",
    "up_proj": "up_proj", "w3": "up_proj", "c_fc": "up_proj", "fc1": "up_proj", "dense_h_to_4h": "up_proj",
    "down_proj": "down_proj", "w2": "down_proj", "c_proj": "down_proj", "fc2": "down_proj",
    "dense_4h_to_h": "down_proj",
}
#: Activation modules by lower-cased class name.
ACTIVATIONS: Dict[str, str] = {
    "silu": "silu", "siluactivation": "silu", "swish": "silu", "gelu": "gelu",
    "geluactivation": "gelu", "newgeluactivation": "gelu", "gelutanh": "gelu",
    "pytorchgelutanh": "gelu", "fastgeluactivation": "gelu", "quickgeluactivation": "gelu",
    "relu": "relu", "reluactivation": "relu", "relu2": "relu", "tanh": "tanh", "sigmoid": "sigmoid",
}
#: A block index in a module's dotted name (``model.layers.3.mlp`` → 3).
LAYER_RE = re.compile(r"\.(\d+)(?:\.|$)")


def activation_name(mod: Any) -> Optional[str]:
    """The activation function a module is (``silu``, ``gelu``, ...), None when it is none."""
    key = type(mod).__name__.lower()
    if key in ACTIVATIONS:
        return ACTIVATIONS[key]
    if "gelu" in key:
        return "gelu"
    if "silu" in key or "swish" in key:
        return "silu"
    return None


#: Config attributes that give a model's width, in the order tried (transformers' names
#: across architectures).
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim")


def config_int(model: "nn.Module", keys: Sequence[str]) -> Optional[int]:
    """The first of ``keys`` the model's ``config`` gives as a positive int, or None."""
    cfg = getattr(model, "config", None)
    for k in keys:
        v = getattr(cfg, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def config_width(model: "nn.Module") -> Optional[int]:
    """The hidden size its config states (transformers' names across architectures), or None."""
    return config_int(model, WIDTH_KEYS)


def _family(model: "nn.Module") -> str:
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if isinstance(mt, str) and mt:
        return mt
    return type(model).__name__.lower()


def _find_block_list(model: "nn.Module") -> Optional[str]:
    import torch.nn as nn

    best: Optional[str] = None
    best_key = (False, 0, 0)
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if len({type(c) for c in mod}) != 1:
            continue
        child_names = {n for n, _ in mod[0].named_children()}
        if not child_names:
            continue  # a list of leaf layers, not of blocks
        # Prefer lists whose items contain attention (decoder/encoder blocks, not MoE
        # experts), then longer lists, then shallower ones.
        key = (bool(child_names & set(ATTENTION_NAMES)), len(mod), -name.count("."))
        if best is None or key > best_key:
            best, best_key = name, key
    return best


def describe_model(model: "nn.Module") -> Dict[str, Any]:
    """Describe a model's layer structure (what the hooks are placed on).

    Args:
        model: any ``torch.nn.Module`` (Hugging Face or not).

    Returns:
        ``{"family", "model_class", "num_layers", "hidden_size", "layer_prefix", "blocks",
        "attention", "mlp"}`` where the last three are lists of ``named_modules()`` names.
        ``family`` is ``config.model_type`` when present (``"llama"``, ``"gpt2"``,
        ``"bert"``, ...), else the lowercase class name.

    Example:
        >>> arch = describe_model(model)      # doctest: +SKIP
        >>> arch["attention"][0]              # doctest: +SKIP
        'model.layers.0.self_attn'
    """
    prefix = _find_block_list(model)
    blocks: List[str] = []
    attention: List[str] = []
    mlp: List[str] = []
    if prefix is not None:
        # _find_block_list names a ModuleList (or Sequential): iterable, in order.
        blist = cast("nn.ModuleList", model.get_submodule(prefix))
        for i, block in enumerate(blist):
            bname = f"{prefix}.{i}" if prefix else str(i)
            blocks.append(bname)
            children = dict(block.named_children())
            for a in ATTENTION_NAMES:
                if a in children:
                    attention.append(f"{bname}.{a}")
                    break
            for m in MLP_NAMES:
                if m in children:
                    mlp.append(f"{bname}.{m}")
                    if m == "intermediate" and "output" in children:
                        # BERT-style: the MLP is intermediate (up + activation) then output.
                        mlp.append(f"{bname}.output")
                    break
    return {
        "family": _family(model),
        "model_class": type(model).__name__,
        "num_layers": len(blocks),
        "hidden_size": config_width(model),
        "layer_prefix": prefix,
        "blocks": blocks,
        "attention": attention,
        "mlp": mlp,
    }
