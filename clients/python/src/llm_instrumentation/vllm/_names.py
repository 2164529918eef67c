"""vLLM's modules under transformers' names (docs/VLLM.md 2).

vLLM's Llama and Qwen2 keep transformers' module paths (``model.layers.N.self_attn``, ...)
but not always their outputs: a decoder layer returns ``(hidden_states, residual)`` with the
residual add deferred to the next layer's fused norm, norms given a residual return
``(normed, residual)``, and parallel linear layers return ``(output, bias)``. Each captured
module gets the conversion that makes its record equal to what transformers' module of the
same name returns; a name with no such equal (fused ``qkv_proj``/``gate_up_proj``,
``act_fn``, whose vLLM form multiplies by the up projection, ``lm_head``, which vLLM never
calls as a module) is refused rather than stored under a name that would mislead.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

#: The decoder layer: ``hidden_states + residual`` is transformers' layer output.
SUM = "sum"
#: A tensor, or the first tensor of a tuple (``(normed, residual)``, ``(output, bias)``).
FIRST = "first"

_LAYER = re.compile(r"^model\.layers\.\d+$")
_SUPPORTED = [
    (_LAYER, SUM),
    (re.compile(r"^model\.layers\.\d+\.(self_attn|mlp|input_layernorm|post_attention_layernorm)$"), FIRST),
    (re.compile(r"^model\.layers\.\d+\.self_attn\.o_proj$"), FIRST),
    (re.compile(r"^model\.layers\.\d+\.mlp\.down_proj$"), FIRST),
    (re.compile(r"^model\.(norm|embed_tokens)$"), FIRST),
]

#: Decoder layer classes whose output convention is checked (vLLM 0.32: the residual stream
#: is ``hidden_states + residual``). Another class under ``model.layers.N`` is refused.
DECODER_LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer")


def kind_of(name: str) -> str:
    """How a supported module's output becomes transformers' (:data:`SUM` or :data:`FIRST`).

    Raises:
        KeyError: not a supported name.
    """
    for rx, kind in _SUPPORTED:
        if rx.match(name):
            return kind
    raise KeyError(name)


def _matches(name: str, pattern: str) -> bool:
    # "model.layers.*" means the layers themselves (the residual stream), as transformers'
    # users say it; fnmatch's "*" would also take every submodule.
    if pattern == "model.layers.*":
        return bool(_LAYER.match(name))
    return fnmatch.fnmatchcase(name, pattern)


def select(model: "nn.Module", patterns: Sequence[str]) -> List[Tuple[str, str]]:
    """The modules of a vLLM model to capture, as ``(name, kind)`` in ``named_modules`` order.

    Args:
        model: the model a vLLM worker runs (``LlamaForCausalLM``, ``Qwen2ForCausalLM``).
        patterns: fnmatch patterns on transformers' module names.

    Returns:
        the selected modules.

    Raises:
        ValueError: a pattern that matches no module, or only modules whose vLLM output has
            no transformers equal (the message names them); an unknown decoder layer class.
            A pattern whose matches all live on other pipeline stages selects nothing here.
    """
    named: Dict[str, Any] = dict(model.named_modules())
    chosen: Dict[str, str] = {}
    for p in patterns:
        hits = [n for n in named if n and _matches(n, p)]
        # PPMissingLayer: a layer that lives on another pipeline stage.
        here = [n for n in hits if type(named[n]).__name__ != "PPMissingLayer"]
        if hits and not here:
            continue  # every match lives on other stages (model.norm on the first): theirs to store
        hits = here
        ok, refused = [], []
        for n in hits:
            try:
                ok.append((n, kind_of(n)))
            except KeyError:
                refused.append(n)
        if not ok:
            why = (f"; these have no transformers equal in vLLM: {refused[:6]}" if refused else "")
            raise ValueError(f"STRAP_VLLM_MODULES pattern {p!r} matches no capturable module of "
                             f"{type(model).__name__}{why} (docs/VLLM.md 2)")
        for n, k in ok:
            if k == SUM and type(named[n]).__name__ not in DECODER_LAYERS:
                raise ValueError(f"{n} is a {type(named[n]).__name__}, not one of {DECODER_LAYERS}: its output "
                                 f"convention is unchecked (docs/VLLM.md 2)")
            chosen[n] = k
    return [(n, chosen[n]) for n in named if n in chosen]


def convert(out: Any, kind: str, rows: Any) -> Any:
    """The rows ``rows`` (a slice or an index tensor) of the tensor transformers' module of
    the same name returns, from vLLM's output ``out``. Rows are taken before the sum, so a
    decoder layer's add runs over the captured rows only."""
    if kind == SUM:
        h, r = out
        return h[rows] if r is None else h[rows] + r[rows]
    t = out[0] if isinstance(out, (tuple, list)) else out
    return t[rows]
