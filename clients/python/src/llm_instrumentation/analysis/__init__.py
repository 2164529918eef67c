"""Summaries computed from a stream FILE (never from the capture config), and 1.3.1's
plotting helpers (:mod:`.visualization`; pandas / matplotlib / plotly come with the
``strap-llm[analysis]`` extra and are imported only when a helper runs)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from .._capture_files import tokens_path
from ..stream import DROP, END, TENSOR, TOKEN, open_stream
from ..tracking import TokenMap
from .visualization import (
    analyze_circuits,
    build_packet_dataframe,
    create_interactive_dashboard,
    load_stream_packets,
    plot_token_progression,
    visualize_attention_patterns,
)

__all__ = [
    "analyze_activations",
    "analyze_activations_with_tokens",
    "analyze_circuits",
    "build_packet_dataframe",
    "create_interactive_dashboard",
    "load_stream_packets",
    "plot_token_progression",
    "visualize_attention_patterns",
]

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import InstrumentationFramework


def stream_codec(r: Any) -> str:
    """The codec a stream was written with: the header's ``codec`` (strap streams), the
    detected one (1.3.1 streams), or ``"unknown"``."""
    if getattr(r, "legacy", False):
        return str(r.codec)
    c = r.metadata.get("codec") if isinstance(r.metadata, dict) else None
    return str(c) if c else "unknown"


def analyze_activations(stream_path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Summarise a capture file (a strap stream or a 1.3.1 ``.stream``).

    Args:
        stream_path: the stream file.

    Returns:
        1.3.1's keys: ``"stream_path"`` (str), ``"compression"`` (the codec the file was
        written with), ``"packets"`` (TENSOR packets, parts counted one by one),
        ``"total_compressed_bytes"`` (payload bytes on disk), ``"per_layer"``
        {name: {count, bytes, dtype, shape, raw_bytes, stored_bytes}} (``count``: whole
        tensors; ``bytes`` = ``stored_bytes``, on disk; ``shape`` of the module's first
        tensor); and ours: ``"tensors"`` (whole tensors),
        ``"total_raw_bytes"``, ``"total_stored_bytes"`` (= ``total_compressed_bytes``),
        ``"file_bytes"``, ``"compression_ratio"`` (raw / stored, 1.0 when nothing stored),
        ``"drops"`` {count, bytes, by_module {name: {count, bytes}}}, ``"tokens"`` (TOKEN
        packets), ``"forwards"`` (distinct forward counters; None for a 1.3.1 file),
        ``"end_status"`` (``"complete"``/``"aborted"``/``"error"``, ``"missing"`` when the
        stream was cut short, ``"unknown"`` for a 1.3.1 file, which has no END), ``"end"``
        (the END meta), ``"truncated_at"``, ``"metadata"``, ``"lossy"``, ``"legacy"``
        (True for a 1.3.1 file: its dtype is assumed, see ``_legacy131``). ``"lossy"`` (also in each ``per_layer`` entry) is None for a lossless
        capture, else ``{mode, bound}`` (what was asked) and the achieved errors that strapd
        measured on the decoded values and recorded per packet (docs/COMPRESSION.md 6):
        ``max_abs_err`` (max over packets), ``rel_l2_err`` (the worst packet's), ``packets``,
        ``lossless_blocks`` (blocks stored exactly: flagged fallbacks) and ``exceeded``
        (packets whose achieved error is over the bound; always 0 unless strapd has a bug).
        Codecs that code by rows (``fp8``, ``transform``) add ``"rows"``: ``n`` (rows measured),
        ``rel_l2_max`` and ``cos_min`` (exact over every row: per-row relative L2 error and
        cosine of decoded vs original), ``rel_l2_p50``/``rel_l2_p99`` and
        ``cos_p50``/``cos_p01`` (the worst packet's percentiles).

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
    with open_stream(stream_path) as r:
        legacy = bool(getattr(r, "legacy", False))
        for pk in r.packets():
            if pk.type == TENSOR:
                packets += 1
                raw += pk.raw_len
                stored += pk.stored_len
                forwards.add(pk.forward)
                d = per_layer.get(pk.name)
                if d is None:
                    d = per_layer[pk.name] = {"count": 0, "bytes": 0, "dtype": pk.dtype, "shape": list(pk.shape),
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
                d["bytes"] += pk.stored_len
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
        if legacy:
            end_status = "unknown"
        else:
            end_status = (end or {}).get("status", "missing") if end is not None else "missing"
        result = {
            "stream_path": os.fspath(stream_path),
            "compression": stream_codec(r),
            "packets": packets,
            "total_compressed_bytes": stored,
            "tensors": tensors,
            "per_layer": per_layer,
            "total_raw_bytes": raw,
            "total_stored_bytes": stored,
            "file_bytes": r.size,
            "compression_ratio": (raw / stored) if stored else 1.0,
            "drops": drops,
            "tokens": tokens,
            "forwards": None if legacy else len(forwards),
            "end_status": end_status,
            "end": end,
            "truncated_at": r.truncated_at,
            "metadata": r.metadata,
            "lossy": lossy,
            "legacy": legacy,
        }
    return result


def lossy_exceeds(rep: Dict[str, Any]) -> bool:
    """Whether one packet's ``"lossy"`` report is over its bound: ``abs`` compares
    ``max_abs_err``, ``rel`` and ``fp16`` with a value compare ``rel_l2_err``, ``fp8`` with a
    value and ``transform`` (a per-row bound) also its worst row (``rows.rel_l2_max``)."""
    mode, bound = rep.get("mode"), float(rep.get("bound") or 0.0)
    if mode == "abs":
        return float(rep.get("max_abs_err", 0.0)) > bound
    if mode == "rel" or (mode == "fp16" and bound > 0):
        return float(rep.get("rel_l2_err", 0.0)) > bound
    if mode in ("fp8", "transform") and bound > 0:
        rows = rep.get("rows")
        row_max = float(rows.get("rel_l2_max", 0.0)) if isinstance(rows, dict) else 0.0
        return float(rep.get("rel_l2_err", 0.0)) > bound or row_max > bound
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
    rows = rep.get("rows")
    if isinstance(rows, dict) and int(rows.get("n", 0)) > 0:
        a = acc.get("rows")
        if a is None:
            acc["rows"] = {k: (int(v) if k == "n" else float(v)) for k, v in rows.items()
                           if k in ("n", "rel_l2_max", "rel_l2_p50", "rel_l2_p99", "cos_min", "cos_p50", "cos_p01")}
        else:
            a["n"] += int(rows["n"])
            for k in ("rel_l2_max", "rel_l2_p50", "rel_l2_p99"):
                a[k] = max(a[k], float(rows.get(k, 0.0)))
            for k in ("cos_min", "cos_p50", "cos_p01"):
                a[k] = min(a[k], float(rows.get(k, 1.0)))
    return acc


def tokens_file_candidates(stream_path: Union[str, os.PathLike]) -> List[str]:
    """Where a capture's tokens file may be, in order: ``<stem>_tokens.json`` for a
    ``<stem>.stream`` (what captures write, as 1.3.1 did); ``{stream_path}_tokens.json``
    (what captures write for other names, and wrote for every name before); and what 1.3.1
    wrote, ``stream_path.replace(".stream", "_tokens.json")`` (every occurrence,
    directories too)."""
    p = os.fspath(stream_path)
    out = [tokens_path(p)]
    for cand in (p + "_tokens.json", p.replace(".stream", "_tokens.json")):
        if cand not in out and cand != p:
            out.append(cand)
    return out


def analyze_activations_with_tokens(stream_path: Union[str, os.PathLike],
                                    framework: Optional["InstrumentationFramework"] = None) -> Dict[str, Any]:
    """:func:`analyze_activations` plus the tokens and an exact per-token breakdown.

    Every packet of a strap stream carries its ``step``: the number of tokens recorded
    before the forward pass that produced it, so packets of step ``k`` belong to token ``k``
    (the token that forward pass chose). Tokens recorded after the forward passes (from
    ``model.generate()``'s output) are matched to them in order instead
    (:class:`~llm_instrumentation.tracking.TokenMap`). Nothing is divided evenly.

    Tokens come from the stream's TOKEN packets when it has any (``source: "stream"``);
    otherwise from the framework's token tracker when given and non-empty
    (``source: "framework"``); otherwise from the tokens file beside the stream
    (:func:`tokens_file_candidates`; ``source: "file"``, how a 1.3.1 capture kept them);
    otherwise the token metadata is empty (``source: "none"``).

    Args:
        stream_path: the stream file.
        framework: the capture's framework (optional; 1.3.1 required it).

    Returns:
        the analysis dict plus 1.3.1's keys: ``token_metadata`` {total_tokens,
        tokens:[{token_index, token_id, token_text, position}], source} and, when there are
        tokens and packets, ``packets_per_token`` and ``bytes_per_token`` (floats: TENSOR
        packets and bytes on disk divided by the token count); and ours, per step:
        ``packets_per_step`` {token: TENSOR packets} (the "step" keys are tokens, as above); ``bytes_per_step`` {step: {raw,
        stored}}; ``per_token_modules`` {step: {module: {packets, raw_bytes,
        stored_bytes}}}; ``per_step`` {step: {packets, raw_bytes}}; and
        ``bytes_per_token_mean`` {raw, stored} over the steps seen. A 1.3.1 file records no
        steps: its per-step dicts are empty.
    """
    result = analyze_activations(stream_path)
    toks = []
    # Sums per (step, forward pass) first: which token a forward pass belongs to is known
    # only once the TOKEN packets after it are read (TokenMap).
    per_fwd: Dict[Tuple[int, int], Dict[str, Dict[str, int]]] = {}
    tmap = TokenMap()
    with open_stream(stream_path) as r:
        for pk in r.packets():
            if pk.step is None:
                continue  # a 1.3.1 stream: no steps, no tokens in it
            tmap.feed(pk.type, pk.step, pk.forward)
            if pk.type == TOKEN:
                toks.append({"token_index": pk.step, "token_id": pk.meta.get("token_id"),
                             "token_text": pk.meta.get("text", ""), "position": pk.meta.get("position", pk.step)})
            elif pk.type == TENSOR:
                m = per_fwd.setdefault((pk.step, pk.forward), {}).setdefault(
                    pk.name, {"packets": 0, "raw_bytes": 0, "stored_bytes": 0})
                m["packets"] += 1
                m["raw_bytes"] += pk.raw_len
                m["stored_bytes"] += pk.stored_len
    tmap.finish()
    per_step: Dict[int, Dict[str, int]] = {}
    packets_per_step: Dict[int, int] = {}
    bytes_per_step: Dict[int, Dict[str, int]] = {}
    per_mod: Dict[int, Dict[str, Dict[str, int]]] = {}
    for (step, fwd), mods in sorted(per_fwd.items(), key=lambda kv: kv[0][1]):
        tok = tmap.token_of(step, fwd)
        s = per_step.setdefault(tok, {"packets": 0, "raw_bytes": 0})
        b = bytes_per_step.setdefault(tok, {"raw": 0, "stored": 0})
        for name, st in mods.items():
            s["packets"] += st["packets"]
            s["raw_bytes"] += st["raw_bytes"]
            packets_per_step[tok] = packets_per_step.get(tok, 0) + st["packets"]
            b["raw"] += st["raw_bytes"]
            b["stored"] += st["stored_bytes"]
            m = per_mod.setdefault(tok, {}).setdefault(name, {"packets": 0, "raw_bytes": 0, "stored_bytes": 0})
            for k in m:
                m[k] += st[k]
    source = "stream" if toks else "none"
    extra: Dict[str, Any] = {}
    if not toks and framework is not None and getattr(framework, "tokens", None):
        toks = [dict(t) for t in framework.tokens]
        source = "framework"
    if not toks:
        for cand in tokens_file_candidates(stream_path):
            if cand != os.fspath(stream_path) and os.path.isfile(cand):
                with open(cand, "r", encoding="utf-8") as f:
                    doc = json.load(f)
                if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
                    raise ValueError(f"{cand} is not a tokens file (no 'tokens' list)")
                toks = doc["tokens"]
                extra = {k: v for k, v in doc.items() if k not in ("tokens", "total_tokens")}
                source = "file"
                break
    result["token_metadata"] = {"total_tokens": len(toks), "tokens": toks, "source": source, **extra}
    n_tok = len(toks)
    if n_tok > 0 and result["packets"] > 0:
        result["packets_per_token"] = result["packets"] / n_tok
        result["bytes_per_token"] = result["total_compressed_bytes"] / n_tok
    result["per_step"] = per_step
    result["packets_per_step"] = packets_per_step
    result["bytes_per_step"] = bytes_per_step
    result["per_token_modules"] = per_mod
    n = len(bytes_per_step)
    result["bytes_per_token_mean"] = {
        "raw": sum(b["raw"] for b in bytes_per_step.values()) / n if n else 0.0,
        "stored": sum(b["stored"] for b in bytes_per_step.values()) / n if n else 0.0,
    }
    return result
