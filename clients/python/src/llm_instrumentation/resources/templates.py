"""Event templates: what repeats from one forward pass to the next, serialized once.

A module's name, layer, shapes, FLOPs and byte counts are the same in every pass; an event is
made once by its builder (``events.py``), serialized as the writer loop would, and kept as a
%-format string whose changing fields are slots (``%(ts)s``): an event then costs one
formatting of its few changing values. :func:`program` turns a template into what the C
writer runs (``_native.c``): its literal text and a table of (length, slot number) ops.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .events import numel
from .records import SLOTS

__all__ = ["ENCODER", "FORWARD_SLOTS", "KV_SLOTS", "MAX_TEMPLATES", "PRESSURE_JSON", "RSS_KEYS", "SLOT_NUMBERS",
           "TIMED_SLOTS", "compile_template", "jlist", "positional", "program", "shape_info"]

ENCODER = json.JSONEncoder(separators=(",", ":"))

#: Templates kept per monitor (a few per timed module and input shape; about 1 KiB each),
#: then started again: many input shapes (prompts of every length) would grow them forever.
MAX_TEMPLATES = 4096

#: What a template's changing fields are called in its %-format: the value of each is
#: formatted with ``%s`` (ints and finite floats read the same as in JSON).
TIMED_SLOTS = {"timestamp": "ts", "step": "step", "forward": "fwd", "duration_us": "d",
               "throughput_gflops_per_s": "tf", "memory_throughput_gbps": "tb",
               "process_rss_bytes": "process_rss_bytes",
               "device_memory_allocated_bytes": "device_memory_allocated_bytes",
               "device_memory_reserved_bytes": "device_memory_reserved_bytes",
               "device_memory_peak_bytes": "device_memory_peak_bytes"}
#: The changing fields of a ``kv_cache_update`` (every one but its names and types).
KV_SLOTS = dict(TIMED_SLOTS, cache_length_tokens="len", previous_length_tokens="prev", new_tokens="new",
                reused_tokens="reused", cache_hit_ratio="hit", cache_bytes="cb", cache_mb="cmb",
                bytes_per_token="bpt", growth_bytes="grow", key_shape="ks", value_shape="vs")
#: The changing fields of a model_forward event: also its FLOPs (the pass's sum), the
#: bytes a capture wrote and a GPU's SM utilization (NVML).
FORWARD_SLOTS = dict(TIMED_SLOTS, flops="fl", compute_intensity_gflops="gf", capture_bytes="cap",
                     sm_utilization_percent="sm")
#: A host memory reading's fields (``MemoryReader.read`` on the CPU).
RSS_KEYS = ("process_rss_bytes", "memory_source")
#: ``memory_pressure`` words as JSON.
PRESSURE_JSON = {None: "null", "low": '"low"', "medium": '"medium"', "high": '"high"'}
#: Changing fields written as JSON strings.
_QUOTED_SLOTS = {"memory_address": "addr"}
#: The slots the C writer fills, by their number there.
SLOT_NUMBERS = {name: i for i, name in enumerate(SLOTS)}
_FORMAT_RE = re.compile(r"%\((\w+)\)s|%%")


def compile_template(ev: Dict[str, Any], seq_slot: str, slots: Optional[Dict[str, str]] = None) -> str:
    """``ev`` serialized as the writer loop would, as a %-format string whose changing
    fields are ``%(slot)s``: ``slots`` (default ``TIMED_SLOTS``), the quoted ones and the
    trailing ``{timestamp}_{seq}`` of ``resource_id`` (``seq_slot``) and
    ``compute_resource_id`` (``seq``). The line ends in ``\\n``."""
    enc = ENCODER.encode
    slots = TIMED_SLOTS if slots is None else slots
    parts = []
    for k, v in ev.items():
        head = enc(k) + ":"
        if k in slots:
            parts.append(head + "%(" + slots[k] + ")s")
        elif k in _QUOTED_SLOTS:
            parts.append(head + "\"%(" + _QUOTED_SLOTS[k] + ")s\"")
        elif k in ("resource_id", "compute_resource_id"):
            prefix = v.rsplit("_", 2)[0] + "_"
            slot = seq_slot if k == "resource_id" else "seq"
            parts.append((head + enc(prefix)[:-1]).replace("%", "%%") + "%(ts)s_%(" + slot + ")s\"")
        else:
            parts.append((head + enc(v)).replace("%", "%%"))
    return "{" + ",".join(parts) + "}\n"


def program(fmt: str) -> Optional[Tuple[bytes, bytes]]:
    """A template as the C writer runs it: ``(text, ops)`` — its literal text as UTF-8 in one
    piece, and per op three bytes: how many bytes of text come next (little-endian u16),
    then the number of the slot that follows (255: none). None when it has a slot the C
    writer does not fill."""
    text = bytearray()
    ops = bytearray()
    lit: List[str] = []
    pos = 0

    def op(code: int) -> None:
        chunk = "".join(lit).encode()
        lit.clear()
        while len(chunk) > 0xFFFF:
            ops.extend((0xFF, 0xFF, 255))
            text.extend(chunk[:0xFFFF])
            chunk = chunk[0xFFFF:]
        ops.extend((len(chunk) & 0xFF, len(chunk) >> 8, code))
        text.extend(chunk)

    for m in _FORMAT_RE.finditer(fmt):
        lit.append(fmt[pos:m.start()])
        pos = m.end()
        if m.group(0) == "%%":
            lit.append("%")
            continue
        code = SLOT_NUMBERS.get(m.group(1))
        if code is None:
            return None
        op(code)
    lit.append(fmt[pos:])
    op(255)
    return bytes(text), bytes(ops)


_SLOT_RE = re.compile(r"%%|%\((\w+)\)s")


def positional(fmt: str, names: Sequence[str]) -> str:
    """A template with its named slots made positional (``%s``): formatting a tuple costs
    less than building a dict. ``names`` are the slots in the order the caller gives their
    values; a template whose slots differ (a builder changed) is an error."""
    found: List[str] = []

    def sub(m: "re.Match[str]") -> str:
        if m.group(1) is None:
            return "%%"
        found.append(m.group(1))
        return "%s"

    out = _SLOT_RE.sub(sub, fmt)
    if found != list(names):
        raise RuntimeError(f"template slots {found} are not the expected {list(names)}")
    return out


def jlist(shape: Sequence[int]) -> str:
    """A shape as the JSON list the encoder writes."""
    return "[" + ",".join(map(str, shape)) + "]"


#: Shapes the writer has seen, as JSON lists, with their element counts (``shape_info``).
_SHAPES: Dict[Any, Tuple[str, int]] = {}


def shape_info(shape: Sequence[int]) -> Tuple[str, int]:
    """``jlist`` and ``numel`` of a shape, kept: a cache's shape is the same in every layer
    of a decoding step."""
    got = _SHAPES.get(shape)
    if got is None:
        if len(_SHAPES) >= MAX_TEMPLATES:
            _SHAPES.clear()
        got = _SHAPES[shape] = (jlist(shape), numel(shape))
    return got
