"""The dtype table of docs/STREAM_FORMAT.md section 4 (ids are part of the wire format)."""

from __future__ import annotations

from typing import Dict, Tuple

#: id -> (name, element size in bytes)
DTYPES: Dict[int, Tuple[str, int]] = {
    1: ("float32", 4),
    2: ("float16", 2),
    3: ("bfloat16", 2),
    4: ("float64", 8),
    5: ("int8", 1),
    6: ("uint8", 1),
    7: ("int16", 2),
    8: ("int32", 4),
    9: ("int64", 8),
    10: ("bool", 1),
    11: ("float8_e4m3fn", 1),
    12: ("float8_e5m2", 1),
}

#: name -> id
DTYPE_IDS: Dict[str, int] = {name: i for i, (name, _) in DTYPES.items()}


def dtype_name(dtype_id: int) -> str:
    """Return the name of a dtype id, or raise ValueError for an unknown id."""
    try:
        return DTYPES[dtype_id][0]
    except KeyError:
        raise ValueError(f"unknown dtype id {dtype_id}") from None


def dtype_size(dtype_id: int) -> int:
    """Return the element size of a dtype id, or raise ValueError for an unknown id."""
    try:
        return DTYPES[dtype_id][1]
    except KeyError:
        raise ValueError(f"unknown dtype id {dtype_id}") from None


def torch_dtype_id(dtype: object) -> int:
    """Map a ``torch.dtype`` to its wire id.

    Raises:
        TypeError: the dtype has no wire id (complex, quantized, ...).
    """
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_IDS[name]
    except KeyError:
        raise TypeError(
            f"tensor dtype {dtype} cannot be captured (supported: {', '.join(DTYPE_IDS)})"
        ) from None


def torch_dtype(name: str) -> object:
    """Return the ``torch.dtype`` of a wire dtype name (imports torch)."""
    import torch

    return getattr(torch, name)
