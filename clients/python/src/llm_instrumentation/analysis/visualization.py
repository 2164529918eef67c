"""1.3.1's helpers for looking at a capture: per-tensor statistics, token progression plots,
a token × layer heatmap, correlated layers, and a dashboard.

Same functions and signatures as 1.3.1's ``llm_instrumentation.analysis.visualization``,
built on :func:`~llm_instrumentation.stream.open_stream`, so unlike 1.3.1's:

* statistics are computed on the exact tensors in their real dtype (1.3.1 read every payload
  as fp16, whatever it was);
* a packet's token is the stream's ``step`` (the number of tokens recorded before the
  forward pass that produced it), or, for tokens recorded after the forward passes (from
  ``generate()``'s output), the token matched to its forward pass
  (:class:`~llm_instrumentation.tracking.TokenMap`); not an even split of packets over tokens;
* a payload that does not decode is an error unless ``include_failed=True`` (1.3.1 skipped
  it silently), and tensors the capture dropped (DROP packets) are reported.

1.3.1 ``.stream`` files are read too (see ``llm_instrumentation._legacy131``); they record no
step, so their packets have no ``token_index`` of their own. Given ``token_metadata``, the
token helpers then divide their packets evenly among the tokens, in stream order, as 1.3.1
did, and flag every such row ``token_estimated`` (with one warning): an estimate, since
nothing in a 1.3.1 file says which token a packet belongs to.

pandas, matplotlib and plotly are optional (``pip install strap-llm[analysis]``) and imported
only when a function needs them.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "analyze_circuits",
    "build_packet_dataframe",
    "create_interactive_dashboard",
    "load_stream_packets",
    "plot_token_progression",
    "visualize_attention_patterns",
]

PacketLike = Dict[str, Any]

#: Columns of the per-packet statistics, as 1.3.1 named them.
STAT_COLUMNS = ("l2_norm", "mean", "std", "max", "min", "sparsity")
_BASE_COLUMNS = ("packet_index", "layer_name", "compressed_bytes", "uncompressed_bytes", "compression_ratio")

_LEGACY_CODECS = ("lz4", "zstd", "none")


def _pandas() -> Any:
    try:
        import pandas as pd
    except ModuleNotFoundError:
        raise ImportError("pandas is needed here: pip install 'strap-llm[analysis]'") from None
    return pd


def load_stream_packets(
    stream_path: Union[str, os.PathLike],
    compression: Optional[str] = None,
    include_failed: bool = False,
    storage_options: Optional[Dict[str, Any]] = None,
) -> List[PacketLike]:
    """One record per captured tensor, with summary statistics of its exact values.

    Args:
        stream_path: the stream file (strap stream, or 1.3.1 ``.stream``).
        compression: 1.3.1 needed the capture's codec here. A strap stream records its own,
            so the argument is not needed and not used; for a 1.3.1 file it overrides the
            codec detected from the payloads (``"lz4"``, ``"zstd"`` or ``"none"``).
        include_failed: also return a record (statistics NaN, an ``"error"`` string) for a
            tensor whose payload does not decode, and for each tensor the capture dropped
            (``"dropped": True``). Without it a payload that does not decode raises, and
            dropped tensors are counted in a warning.
        storage_options: fsspec options when ``stream_path`` is an object URL
            (``s3://...``, see :func:`~llm_instrumentation.open_stream`).

    Returns:
        dicts in stream order with 1.3.1's keys ``packet_index``, ``layer_name`` (``"<root>"``
        for the root module), ``compressed_bytes`` (on disk), ``uncompressed_bytes``,
        ``l2_norm``, ``mean``, ``std``, ``max``, ``min``, ``sparsity`` (share of exact zeros),
        plus ``dtype``, ``shape``, ``seq``, ``forward`` and ``token_index`` (the packet's token: its step,
        or the token matched to its forward pass, see :class:`~llm_instrumentation.tracking.TokenMap`;
        None for a 1.3.1 file).

    Raises:
        StreamFormatError: the file is not a stream, or a payload does not decode (without
            ``include_failed``).
        ValueError: ``compression`` is not a codec 1.3.1 wrote.

    Example:
        >>> rows = load_stream_packets("run.strap")        # doctest: +SKIP
        >>> rows[0]["layer_name"], rows[0]["token_index"]  # doctest: +SKIP
        ('model.layers.0.self_attn', 0)
    """
    from .._legacy131 import LegacyPacket
    from ..errors import StreamFormatError
    from ..stream import DROP, Tensor, open_stream
    from ..tracking import TokenMap

    if compression is not None and (not isinstance(compression, str) or compression.lower() not in
                                    _LEGACY_CODECS + ("shuffle", "quant", "fp16", "fp8", "transform")):
        raise ValueError(f"compression {compression!r} is not a codec name")
    records: List[PacketLike] = []
    dropped = 0
    with open_stream(stream_path, storage_options) as r:
        legacy = bool(getattr(r, "legacy", False))
        if legacy and compression is not None:
            c = compression.lower()
            if c not in _LEGACY_CODECS:
                raise ValueError(f"a 1.3.1 stream is lz4, zstd or none, not {compression!r}")
            for pk in r.packets():
                # open_stream gives a legacy reader for a 1.3.1 file: its packets are
                # LegacyPackets, whose codec a caller may name (1.3.1 stored none).
                if isinstance(pk, LegacyPacket):
                    pk.codec_name = c
        # Tensors come from iterating the reader (PART packets joined); DROP packets from
        # the packet walk. Both follow file order; merge them by offset.
        # A 1.3.1 packet is one tensor; it is wrapped below, inside the try, because its
        # size may only be known by decoding it.
        items: List[Tuple[int, str, Any]] = (
            [(pk.offset, "p", pk) for pk in r.packets()] if legacy else [(t.packets[0].offset, "t", t) for t in r])
        drops = [pk for pk in r.packets() if pk.type == DROP]
        dropped = len(drops)
        tmap = None
        if not legacy:
            tmap = TokenMap()
            for pk in r.packets():
                tmap.feed(pk.type, pk.step, pk.forward)
            tmap.finish()
        if include_failed:
            items += [(pk.offset, "d", pk) for pk in drops]
            items.sort(key=lambda x: x[0])
        for index, (_, kind, obj) in enumerate(items):
            if kind == "d":
                rec = _record(index, obj.name, 0, obj.tensor_len, obj.dtype, obj.shape, obj.seq, obj.step,
                              obj.forward, legacy)
                rec.update(_empty_tensor_statistics())
                rec["dropped"] = True
                records.append(rec)
                continue
            pks = [obj] if kind == "p" else obj.packets
            stored = sum(p.stored_len for p in pks)
            try:
                t = Tensor(pks) if kind == "p" else obj
                rec = _record(index, t.name, stored, t.nbytes, t.dtype, t.shape, t.seq, t.step, t.forward, legacy)
                rec.update(_compute_tensor_statistics(t.numpy()))
            except StreamFormatError as e:
                if not include_failed:
                    raise
                rec = _record(index, pks[0].name, stored, None, None, (), pks[0].seq, pks[0].step, pks[0].forward,
                              legacy)
                rec.update(_empty_tensor_statistics())
                rec["error"] = str(e)
            records.append(rec)
        del items
    if tmap is not None:
        for rec in records:
            rec["token_index"] = tmap.token_of(rec["token_index"], rec["forward"])
    if dropped and not include_failed:
        warnings.warn(f"{stream_path}: {dropped} tensors were dropped during the capture (DROP packets); "
                      f"include_failed=True lists them", stacklevel=2)
    return records


def _record(index: int, name: str, stored: int, raw: Optional[int], dtype: Optional[str], shape: Sequence[int],
            seq: int, step: Optional[int], forward: Optional[int], legacy: bool) -> PacketLike:
    return {
        "packet_index": index,
        "layer_name": name or "<root>",
        "compressed_bytes": stored,
        "uncompressed_bytes": raw,
        "dtype": dtype,
        "shape": tuple(shape),
        "seq": seq,
        "forward": forward,
        "token_index": None if legacy else step,
    }


def build_packet_dataframe(
    stream_packets: Union[str, os.PathLike, Sequence[PacketLike]],
    token_metadata: Optional[Dict[str, Any]] = None,
) -> "pd.DataFrame":
    """The records of :func:`load_stream_packets` as a DataFrame, sorted by ``packet_index``,
    with ``compression_ratio`` (uncompressed / compressed bytes) and, given
    ``token_metadata`` (``analysis["token_metadata"]``), each packet's ``token_text``.

    Args:
        stream_packets: the records, or a stream path (then loaded here; 1.3.1 refused one).
        token_metadata: ``{"tokens": [{token_index, token_text, ...}]}``.

    Returns:
        a ``pandas.DataFrame``.

    Given ``token_metadata`` for packets without a ``token_index`` (a 1.3.1 file), the
    packets are divided evenly among the tokens in stream order, as 1.3.1 did, and the rows
    are flagged ``token_estimated`` (True), with a warning; packets of a strap stream keep
    their exact token (``token_estimated`` False).
    """
    pd = _pandas()
    if isinstance(stream_packets, (str, os.PathLike)):
        stream_packets = load_stream_packets(stream_packets)
    if not stream_packets:
        return pd.DataFrame(columns=list(_BASE_COLUMNS + STAT_COLUMNS) + ["token_index"])
    df = pd.DataFrame(list(stream_packets))
    if "compression_ratio" not in df.columns and "uncompressed_bytes" in df.columns:
        # NaN where nothing was stored (a dropped tensor)
        df["compression_ratio"] = df["uncompressed_bytes"] / df["compressed_bytes"].replace(0, np.nan)
    if "token_index" in df.columns and df["token_index"].isna().all():
        df = df.drop(columns=["token_index"])
    if token_metadata:
        df = _assign_tokens(df, token_metadata)
    return df.sort_values("packet_index").reset_index(drop=True)


def plot_token_progression(
    packet_stats: "pd.DataFrame",
    token_metadata: Optional[Dict[str, Any]] = None,
    metric: str = "l2_norm",
    ax: Any = None,
) -> Any:
    """Plot the mean of ``metric`` over each token's packets, token by token.

    Args:
        packet_stats: from :func:`build_packet_dataframe`.
        token_metadata: labels the x axis with the tokens' text (up to 20 tokens).
        metric: a column, e.g. ``"l2_norm"``, ``"mean"``, ``"std"``, ``"sparsity"``.
        ax: a matplotlib ``Axes`` to draw on (default: a new figure).

    Returns:
        the matplotlib ``Axes``.

    Raises:
        ValueError: unknown metric, or packets without ``token_index`` and no
            ``token_metadata`` to divide them among (a 1.3.1 file).
    """
    _pandas()
    if metric not in packet_stats.columns:
        raise ValueError(f"Metric '{metric}' not present in packet statistics.")
    if "token_index" not in packet_stats.columns and token_metadata:
        packet_stats = _assign_tokens(packet_stats, token_metadata)
    if "token_index" not in packet_stats.columns:
        raise ValueError(_NO_TOKENS)
    grouped = (packet_stats.dropna(subset=["token_index"]).groupby("token_index")[metric].mean()
               .reset_index().sort_values("token_index"))
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4))
    ax.plot(grouped["token_index"], grouped[metric], marker="o", linewidth=1.5)
    ax.set_xlabel("Token Index")
    ax.set_ylabel(metric.replace("_", " ").title())
    ax.set_title(f"{metric.replace('_', ' ').title()} Progression per Token")
    ax.grid(True, linestyle="--", alpha=0.3)
    if token_metadata and token_metadata.get("tokens"):
        texts = _token_texts(token_metadata)
        xticks = [int(i) for i in grouped["token_index"].tolist()]
        if len(xticks) <= 20:
            ax.set_xticks(xticks)
            ax.set_xticklabels([(texts.get(i) or "").strip() or f"#{i}" for i in xticks], rotation=45, ha="right")
    return ax


def visualize_attention_patterns(
    stream_packets: Union["pd.DataFrame", Sequence[PacketLike]],
    token_metadata: Optional[Dict[str, Any]] = None,
    metric: str = "l2_norm",
    ax: Any = None,
) -> Any:
    """Heatmap of ``metric`` per token (rows) and layer (columns): the mean over that
    token's packets of that layer; 0 where a layer has none.

    Args:
        stream_packets: a DataFrame from :func:`build_packet_dataframe`, or the records.
        token_metadata: tokens, as for :func:`build_packet_dataframe`.
        metric: the statistic shown.
        ax: a matplotlib ``Axes`` (default: a new figure).

    Returns:
        the matplotlib ``Axes``.

    Raises:
        ValueError: packets without ``token_index`` and no ``token_metadata`` to divide
            them among (a 1.3.1 file).
    """
    pd = _pandas()
    if not isinstance(stream_packets, pd.DataFrame):
        packet_stats = build_packet_dataframe(stream_packets, token_metadata)
    else:
        packet_stats = stream_packets.copy()
        if "token_index" not in packet_stats.columns and token_metadata:
            packet_stats = _assign_tokens(packet_stats, token_metadata)
    if "token_index" not in packet_stats.columns:
        raise ValueError(_NO_TOKENS)
    if metric not in packet_stats.columns:
        raise ValueError(f"Metric '{metric}' not present in packet statistics.")
    pivot = (packet_stats.pivot_table(index="token_index", columns="layer_name", values=metric, aggfunc="mean")
             .fillna(0.0).sort_index())
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 4))
    im = ax.imshow(pivot.values, aspect="auto", cmap="magma")
    ax.set_xlabel("Layer")
    ax.set_ylabel("Token Index")
    ax.set_title(f"{metric.replace('_', ' ').title()} Heatmap (Token × Layer)")
    ax.set_xticks(np.arange(len(pivot.columns)))
    ax.set_xticklabels(pivot.columns, rotation=90, fontsize=8)
    ax.set_yticks(np.arange(len(pivot.index)))
    ax.set_yticklabels([int(i) for i in pivot.index])
    plt.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label=metric.replace("_", " ").title())
    return ax


def analyze_circuits(
    packet_stats: "pd.DataFrame",
    metric: str = "l2_norm",
    min_correlation: float = 0.6,
    top_k: int = 8,
) -> "pd.DataFrame":
    """Pairs of layers whose ``metric`` moves together across tokens.

    For each layer, the per-token mean of ``metric`` is a series; pairs whose Pearson
    correlation is at least ``min_correlation`` in absolute value are returned, strongest
    (most positive) first, at most ``top_k``. Layers whose series is constant have no
    correlation and are left out.

    Returns:
        a DataFrame with columns ``layer_a``, ``layer_b``, ``correlation``.

    Raises:
        ValueError: unknown metric, or packets without ``token_index``.
    """
    pd = _pandas()
    if metric not in packet_stats.columns:
        raise ValueError(f"Metric '{metric}' not present in packet statistics.")
    if "token_index" not in packet_stats.columns:
        raise ValueError(_NO_TOKENS)
    pivot = (packet_stats.pivot_table(index="token_index", columns="layer_name", values=metric, aggfunc="mean")
             .dropna(axis=1, how="all"))
    if pivot.empty or pivot.shape[1] < 2:
        return pd.DataFrame(columns=["layer_a", "layer_b", "correlation"])
    corr = pivot.corr()
    records: List[Tuple[str, str, float]] = []
    cols = list(corr.columns)
    for i, a in enumerate(cols):
        for j in range(i + 1, len(cols)):
            v = corr.iloc[i, j]
            if math.isnan(v) or abs(v) < min_correlation:
                continue
            records.append((a, cols[j], float(v)))
    res = pd.DataFrame(records, columns=["layer_a", "layer_b", "correlation"])
    if res.empty:
        return res
    return res.sort_values("correlation", ascending=False).head(top_k).reset_index(drop=True)


def create_interactive_dashboard(
    packet_stats: "pd.DataFrame",
    metric: str = "l2_norm",
    secondary_metric: str = "compression_ratio",
) -> Any:
    """A two-panel dashboard: ``metric`` per packet in stream order, and the mean of
    ``secondary_metric`` per layer.

    Returns:
        a plotly ``Figure`` when plotly is installed, else a matplotlib ``Figure`` (with a
        warning saying so).

    Raises:
        ValueError: a metric that is not a column.
    """
    _pandas()
    for m in (metric, secondary_metric):
        if m not in packet_stats.columns:
            raise ValueError(f"Metric '{m}' not present in packet statistics.")
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ModuleNotFoundError:
        return _matplotlib_dashboard(packet_stats, metric, secondary_metric)
    df = packet_stats.copy()
    df["packet_order"] = np.arange(len(df))
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.15, subplot_titles=[
        f"{metric.replace('_', ' ').title()} per Packet",
        f"{secondary_metric.replace('_', ' ').title()} by Layer",
    ])
    fig.add_trace(go.Scatter(x=df["packet_order"], y=df[metric], mode="lines+markers",
                             hovertext=df["layer_name"], name=metric), row=1, col=1)
    summary = (df.groupby("layer_name")[secondary_metric].mean().reset_index()
               .sort_values(secondary_metric, ascending=False))
    fig.add_trace(go.Bar(x=summary["layer_name"], y=summary[secondary_metric], name=secondary_metric),
                  row=2, col=1)
    fig.update_layout(height=700, showlegend=False)
    fig.update_xaxes(title_text="Packet Order", row=1, col=1)
    fig.update_yaxes(title_text=metric.replace("_", " ").title(), row=1, col=1)
    fig.update_yaxes(title_text=secondary_metric.replace("_", " ").title(), row=2, col=1)
    fig.update_xaxes(title_text="Layer", row=2, col=1)
    return fig


def _matplotlib_dashboard(packet_stats: "pd.DataFrame", metric: str, secondary_metric: str) -> Any:
    import matplotlib.pyplot as plt

    df = packet_stats.copy()
    df["packet_order"] = np.arange(len(df))
    fig, axes = plt.subplots(2, 1, figsize=(12, 8))
    axes[0].plot(df["packet_order"], df[metric], linewidth=1.5)
    axes[0].set_title(f"{metric.replace('_', ' ').title()} per Packet")
    axes[0].set_xlabel("Packet Order")
    axes[0].set_ylabel(metric.replace("_", " ").title())
    axes[0].grid(True, linestyle="--", alpha=0.3)
    summary = (df.groupby("layer_name")[secondary_metric].mean().reset_index()
               .sort_values(secondary_metric, ascending=False))
    axes[1].bar(summary["layer_name"], summary[secondary_metric])
    axes[1].set_title(f"{secondary_metric.replace('_', ' ').title()} by Layer")
    axes[1].set_xlabel("Layer")
    axes[1].set_ylabel(secondary_metric.replace("_", " ").title())
    axes[1].tick_params(axis="x", rotation=90)
    fig.tight_layout()
    warnings.warn("plotly is not installed; the dashboard is a static matplotlib figure", stacklevel=3)
    return fig


_NO_TOKENS = ("packets have no token_index: a 1.3.1 stream records no step, so its packets cannot be tied "
              "to tokens; pass token_metadata to divide them evenly among the tokens as 1.3.1 did (an "
              "estimate, flagged token_estimated), or capture with this client for exact tokens")


def _compute_tensor_statistics(values: np.ndarray) -> PacketLike:
    """Statistics of a tensor's values, accumulated in float64."""
    if values.size == 0:
        return _empty_tensor_statistics()
    v = np.asarray(values).reshape(-1)
    if v.dtype == bool:
        v = v.astype(np.uint8)
    v64 = v.astype(np.float64)
    return {
        "l2_norm": float(np.sqrt(np.dot(v64, v64))),
        "mean": float(v64.mean()),
        "std": float(v64.std()),
        "max": float(v64.max()),
        "min": float(v64.min()),
        "sparsity": float(np.count_nonzero(v == 0) / v.size),
    }


def _empty_tensor_statistics() -> PacketLike:
    return {k: float("nan") for k in STAT_COLUMNS}


def _token_texts(token_metadata: Dict[str, Any]) -> Dict[int, Optional[str]]:
    out: Dict[int, Optional[str]] = {}
    for i, t in enumerate(token_metadata.get("tokens") or []):
        idx = t.get("token_index", i)
        out[int(idx) if idx is not None else i] = t.get("token_text")
    return out


def _assign_tokens(packet_df: "pd.DataFrame", token_metadata: Dict[str, Any]) -> "pd.DataFrame":
    """Add ``token_text`` by each packet's ``token_index`` (its step) and ``token_estimated``
    False. Packets without one (a 1.3.1 file) are divided evenly among the tokens in packet
    order, 1.3.1's rule: the first ``packets % tokens`` tokens get one packet more; those
    rows are ``token_estimated`` True, with a warning. No tokens in the metadata: refused."""
    texts = _token_texts(token_metadata)
    df = packet_df.copy()
    if "token_index" not in df.columns:
        total = int(token_metadata.get("total_tokens") or len(token_metadata.get("tokens") or []))
        if total <= 0:
            raise ValueError(_NO_TOKENS)
        order = df.sort_values("packet_index").index if "packet_index" in df.columns else df.index
        base, extra = divmod(len(df), total)
        idx: List[int] = []
        for t in range(total):
            idx.extend([t] * (base + (1 if t < extra else 0)))
        df.loc[order, "token_index"] = idx[:len(df)]
        df["token_index"] = df["token_index"].astype("int64")
        df["token_estimated"] = True
        from .._warnings import warn_caller

        warn_caller(f"packets have no token_index (a 1.3.1 stream): {len(df)} packets divided evenly among "
                    f"{total} tokens as 1.3.1 did; an estimate (rows flagged token_estimated)")
        positional = list(token_metadata.get("tokens") or [])
        texts = {i: t.get("token_text") for i, t in enumerate(positional)} or texts
    else:
        df["token_estimated"] = False
    df["token_text"] = df["token_index"].map(lambda i: texts.get(int(i)) if i is not None and i == i else None)
    return df
