"""Element-wise torch functions inside the model, timed at VERBOSE through a
``TorchFunctionMode`` (its class is made on first use: torch is imported then)."""

from __future__ import annotations

import time
from typing import Any, Dict

__all__ = ["ElementwiseMode"]


def _table() -> Dict[Any, str]:
    import torch
    import torch.nn.functional as F

    T = torch.Tensor
    return {
        torch.add: "add", T.add: "add", T.__add__: "add", T.__radd__: "add", T.__iadd__: "add", T.add_: "add",
        torch.sub: "sub", T.sub: "sub", T.__sub__: "sub", T.__rsub__: "sub",
        torch.mul: "mul", T.mul: "mul", T.__mul__: "mul", T.__rmul__: "mul", T.__imul__: "mul", T.mul_: "mul",
        torch.div: "div", T.div: "div", T.__truediv__: "div", T.__rtruediv__: "div",
        torch.pow: "pow", T.pow: "pow", T.__pow__: "pow",
        torch.rsqrt: "rsqrt", T.rsqrt: "rsqrt", torch.exp: "exp", T.exp: "exp", torch.neg: "neg", T.neg: "neg",
        T.__neg__: "neg", torch.sigmoid: "sigmoid", torch.tanh: "tanh",
        F.silu: "silu", F.gelu: "gelu", F.relu: "relu", torch.cos: "cos", torch.sin: "sin",
    }


def _make_class() -> Any:
    from torch.overrides import TorchFunctionMode

    class _Mode(TorchFunctionMode):
        """Times element-wise torch functions called inside the model (VERBOSE)."""

        def __init__(self, recorder: Any) -> None:
            super().__init__()
            self.recorder = recorder
            self.table = _table()

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            op = self.table.get(func)
            if op is None:
                return func(*args, **kwargs)
            t0 = time.perf_counter_ns()
            out = func(*args, **kwargs)
            self.recorder.elementwise(op, out, time.perf_counter_ns() - t0)
            return out

    return _Mode


_CLASS: Any = None


def ElementwiseMode(recorder: Any) -> Any:
    """A mode that hands each element-wise op to ``recorder.elementwise`` (enter it)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(recorder)
