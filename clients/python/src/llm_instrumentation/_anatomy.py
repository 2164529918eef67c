"""Model anatomy: the names Hugging Face and similar models give their parts.

One table for everything that looks for a model's attention, MLP and MLP projections: the
capture's architecture detection (``core/auto_detect.py``) and the resource monitor's module
classification (``resources/sites.py``). A leaf: it imports nothing of the package.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

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
