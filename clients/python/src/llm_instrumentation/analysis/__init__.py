"""Summaries computed from a stream FILE (never from the capture config)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from ..stream import DROP, END, TENSOR, TOKEN, open_stream

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import InstrumentationFramework


def analyze_activations(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Summarise a capture file.

    Args:
        path: the stream file.

    Returns:
        ``{"packets"`` (TENSOR packets, parts counted one by one), ``"tensors"`` (whole
        tensors), ``"per_layer"`` {name: {count, dtype, shape, raw_bytes, stored_bytes}}
        (``shape`` of the module's first tensor; count of whole tensors),
        ``"total_raw_bytes"``, ``"total_stored_bytes"`` (payload bytes on disk),
        ``"file_bytes"``, ``"compression_ratio"`` (raw / stored, 1.0 when nothing stored),
        ``"drops"`` {count, bytes, by_module {name: {count, bytes}}}, ``"tokens"`` (TOKEN
        packets), ``"forwards"`` (distinct forward counters), ``"end_status"``
        (``"complete"``/``"aborted"``/``"error"``, or ``"missing"`` when the stream was cut
        short), ``"end"`` (the END meta), ``"truncated_at"``, ``"metadata"``,
        ``"lossy"``}. ``"lossy"`` (also in each ``per_layer`` entry) is None for a lossless
        capture, else ``{mode, bound}`` (what was asked) and the achieved errors that strapd
        measured on the decoded values and recorded per packet (docs/COMPRESSION.md 6):
        ``max_abs_err`` (max over packets), ``rel_l2_err`` (the worst packet's), ``packets``,
        ``lossless_blocks`` (blocks stored exactly: flagged fallbacks) and ``exceeded``
        (packets whose achieved error is over the bound; always 0 unless strapd has a bug).

    Example:
        >>> analyze_activations("run.strap")["compression_ratio"]   # doctest: +SKIP
        1.18
    """
    per_layer: Dict[str, Dict[str, Any]] = {}
    drops: Dict[str, Any] = {"count": 0, "bytes": 0, "by_module": {}}
    packets = tensors = tokens = 0
    raw = stored = 0
    forwards = set()
    end: Optional[Dict[str, Any]] = None
    lossy: Optional[Dict[str, Any]] = None
    with open_stream(path) as r:
        for pk in r.packets():
            if pk.type == TENSOR:
                packets += 1
                raw += pk.raw_len
                stored += pk.stored_len
                forwards.add(pk.forward)
                d = per_layer.get(pk.name)
                if d is None:
                    d = per_layer[pk.name] = {"count": 0, "dtype": pk.dtype, "shape": list(pk.shape),
                                              "raw_bytes": 0, "stored_bytes": 0, "lossy": None}
                rep = pk.meta.get("lossy") if isinstance(pk.meta, dict) else None
                if isinstance(rep, dict):
                    d["lossy"] = fold_lossy(d["lossy"], rep)
                    lossy = fold_lossy(lossy, rep)
                if pk.part_offset + pk.raw_len == pk.tensor_len:
                    d["count"] += 1
                    tensors += 1
                d["raw_bytes"] += pk.raw_len
                d["stored_bytes"] += pk.stored_len
            elif pk.type == DROP:
                drops["count"] += 1
                drops["bytes"] += pk.tensor_len
                m = drops["by_module"].setdefault(pk.name, {"count": 0, "bytes": 0})
                m["count"] += 1
                m["bytes"] += pk.tensor_len
            elif pk.type == TOKEN:
                tokens += 1
            elif pk.type == END:
                end = pk.meta
        result = {
            "packets": packets,
            "tensors": tensors,
            "per_layer": per_layer,
            "total_raw_bytes": raw,
            "total_stored_bytes": stored,
            "file_bytes": r.size,
            "compression_ratio": (raw / stored) if stored else 1.0,
            "drops": drops,
            "tokens": tokens,
            "forwards": len(forwards),
            "end_status": (end or {}).get("status", "missing") if end is not None else "missing",
            "end": end,
            "truncated_at": r.truncated_at,
            "metadata": r.metadata,
            "lossy": lossy,
        }
    return result


def lossy_exceeds(rep: Dict[str, Any]) -> bool:
    """Whether one packet's ``"lossy"`` report is over its bound: ``abs`` compares
    ``max_abs_err``, ``rel`` and ``fp16`` with a value compare ``rel_l2_err``."""
    mode, bound = rep.get("mode"), float(rep.get("bound") or 0.0)
    if mode == "abs":
        return float(rep.get("max_abs_err", 0.0)) > bound
    if mode == "rel" or (mode == "fp16" and bound > 0):
        return float(rep.get("rel_l2_err", 0.0)) > bound
    return False


def fold_lossy(acc: Optional[Dict[str, Any]], rep: Dict[str, Any]) -> Dict[str, Any]:
    """Add one packet's ``"lossy"`` meta to a running summary (None starts one)."""
    if acc is None:
        acc = {"mode": rep.get("mode"), "bound": rep.get("bound", 0.0), "max_abs_err": 0.0, "rel_l2_err": 0.0,
               "packets": 0, "lossless_blocks": 0, "exceeded": 0}
    acc["max_abs_err"] = max(acc["max_abs_err"], float(rep.get("max_abs_err", 0.0)))
    acc["rel_l2_err"] = max(acc["rel_l2_err"], float(rep.get("rel_l2_err", 0.0)))
    acc["packets"] += 1
    acc["lossless_blocks"] += int(rep.get("lossless_blocks", 0))
    acc["exceeded"] += int(lossy_exceeds(rep))
    return acc


def analyze_activations_with_tokens(path: Union[str, os.PathLike],
                                    framework: Optional["InstrumentationFramework"] = None) -> Dict[str, Any]:
    """:func:`analyze_activations` plus an exact per-token breakdown, read from the stream.

    Every packet carries its ``step``: the number of tokens recorded before the forward
    pass that produced it, so packets of step ``k`` belong to token ``k`` (the token that
    forward pass chose). Nothing is divided evenly.

    Tokens come from the stream's TOKEN packets when it has any (``source: "stream"``);
    otherwise from the framework's token tracker when given and non-empty
    (``source: "framework"``); otherwise the token metadata is empty (``source: "none"``).

    Args:
        path: the stream file.
        framework: the capture's framework (optional).

    Returns:
        the analysis dict plus ``token_metadata`` {total_tokens, tokens:[{token_index,
        token_id, token_text, position}], source}; ``packets_per_token`` {step: TENSOR
        packets}; ``bytes_per_token`` {step: {raw, stored}} (payload bytes decoded and on
        disk); ``per_token_modules`` {step: {module: {packets, raw_bytes, stored_bytes}}};
        ``per_step`` {step: {packets, raw_bytes}} (kept from earlier versions); and
        ``bytes_per_token_mean`` {raw, stored} over the steps seen.
    """
    result = analyze_activations(path)
    toks = []
    per_step: Dict[int, Dict[str, int]] = {}
    packets_per_token: Dict[int, int] = {}
    bytes_per_token: Dict[int, Dict[str, int]] = {}
    per_mod: Dict[int, Dict[str, Dict[str, int]]] = {}
    with open_stream(path) as r:
        for pk in r.packets():
            if pk.type == TOKEN:
                toks.append({"token_index": pk.step, "token_id": pk.meta.get("token_id"),
                             "token_text": pk.meta.get("text", ""), "position": pk.meta.get("position", pk.step)})
            elif pk.type == TENSOR:
                s = per_step.setdefault(pk.step, {"packets": 0, "raw_bytes": 0})
                s["packets"] += 1
                s["raw_bytes"] += pk.raw_len
                packets_per_token[pk.step] = packets_per_token.get(pk.step, 0) + 1
                b = bytes_per_token.setdefault(pk.step, {"raw": 0, "stored": 0})
                b["raw"] += pk.raw_len
                b["stored"] += pk.stored_len
                m = per_mod.setdefault(pk.step, {}).setdefault(pk.name, {"packets": 0, "raw_bytes": 0,
                                                                         "stored_bytes": 0})
                m["packets"] += 1
                m["raw_bytes"] += pk.raw_len
                m["stored_bytes"] += pk.stored_len
    source = "stream" if toks else "none"
    if not toks and framework is not None and framework.tokens:
        toks = [dict(t) for t in framework.tokens]
        source = "framework"
    result["token_metadata"] = {"total_tokens": len(toks), "tokens": toks, "source": source}
    result["per_step"] = per_step
    result["packets_per_token"] = packets_per_token
    result["bytes_per_token"] = bytes_per_token
    result["per_token_modules"] = per_mod
    n = len(bytes_per_token)
    result["bytes_per_token_mean"] = {
        "raw": sum(b["raw"] for b in bytes_per_token.values()) / n if n else 0.0,
        "stored": sum(b["stored"] for b in bytes_per_token.values()) / n if n else 0.0,
    }
    return result
