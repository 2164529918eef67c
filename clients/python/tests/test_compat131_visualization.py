"""llm_instrumentation.analysis.visualization (1.3.1's helpers) on real strapd captures:
exact values in their real dtype, packets tied to tokens by step, plots that really draw."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TESTDATA, tiny_llama

pd = pytest.importorskip("pandas")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llm_instrumentation import StreamFormatError, analyze_activations_with_tokens, capture_activations, open_stream  # noqa: E402
from llm_instrumentation.analysis import (  # noqa: E402
    analyze_circuits,
    build_packet_dataframe,
    create_interactive_dashboard,
    load_stream_packets,
    plot_token_progression,
    visualize_attention_patterns,
)


def _capture(real_strapd, path, dtype=None, n_tokens=4, extra_prompt_forward=False):
    m = tiny_llama(dtype)
    with torch.no_grad(), capture_activations(m, preset="balanced", output_path=path, socket_path=real_strapd.socket,
                                              autostart_daemon=False, track_per_token=True) as fw:
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        if extra_prompt_forward:
            m(input_ids=ids[:, :2])  # a second forward pass at step 0: step 0 has twice the packets
        for _ in range(n_tokens):
            nxt = m(input_ids=ids).logits[:, -1, :].argmax(dim=-1, keepdim=True)
            fw.token_tracker.record_token(nxt[0].item(), f"w{nxt[0].item()}")
            ids = torch.cat([ids, nxt], dim=-1)
    return fw


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """One fp32 capture with an uneven number of packets per token."""
    from conftest import Daemon, short_tmpdir, strapd_bin

    b = strapd_bin()
    if not b.is_file():
        pytest.skip(f"strapd binary not built at {b}")
    d = Daemon(b, short_tmpdir())
    try:
        path = tmp_path_factory.mktemp("viz") / "gen.stream"
        fw = _capture(d, path, extra_prompt_forward=True)
    finally:
        d.stop()
    return path, fw


def _png_pixels(fig, path):
    fig.savefig(path, dpi=60)
    plt.close(fig)
    img = plt.imread(path)
    return img[..., :3]


def test_load_stream_packets_exact_values_and_steps(capture):
    path, fw = capture
    rows = load_stream_packets(str(path), "lz4")  # 1.3.1 passed the codec; a strap stream records its own
    with open_stream(path) as r:
        tensors = [(t.name, t.step, t.nbytes, t.shape, t.tensor()) for t in r.tensors()]
    assert len(rows) == len(tensors) == 5 * len(fw.hooked_modules)
    for row, (name, step, nbytes, shape, tt) in zip(rows, tensors):
        v = tt.double().reshape(-1)
        assert row["layer_name"] == name and row["token_index"] == step and row["dtype"] == "float32"
        assert row["uncompressed_bytes"] == nbytes and row["shape"] == shape
        assert row["l2_norm"] == pytest.approx(float(v.norm()), rel=1e-12)
        assert row["mean"] == pytest.approx(float(v.mean()), rel=1e-9, abs=1e-12)
        assert row["max"] == float(v.max()) and row["min"] == float(v.min())
        assert row["sparsity"] == float((v == 0).double().mean())
    assert [r["packet_index"] for r in rows] == list(range(len(rows)))


def test_bf16_statistics_in_real_dtype(real_strapd, tmp_path):
    """1.3.1 dropped bf16 tensors (and read everything as fp16); here they are read as bf16."""
    path = tmp_path / "bf16.stream"
    _capture(real_strapd, path, dtype=torch.bfloat16, n_tokens=1)
    rows = load_stream_packets(path)
    with open_stream(path) as r:
        first = r.tensors()[0].tensor().clone()
    assert first.dtype == torch.bfloat16 and rows[0]["dtype"] == "bfloat16"
    assert rows[0]["l2_norm"] == pytest.approx(float(first.double().norm()), rel=1e-12)


def test_tokens_follow_step_not_an_even_split(capture):
    path, fw = capture
    tm = analyze_activations_with_tokens(str(path), fw)["token_metadata"]
    df = build_packet_dataframe(load_stream_packets(str(path)), tm)
    n = len(fw.hooked_modules)
    per_token = df.groupby("token_index").size().to_dict()
    assert per_token == {0: 2 * n, 1: n, 2: n, 3: n}  # an even split would give 5n/4 each
    assert df.loc[df.token_index == 1, "token_text"].unique().tolist() == [fw.tokens[1]["token_text"]]
    assert (df["compression_ratio"] > 1).all()
    assert list(df.columns[:5]) == ["packet_index", "layer_name", "compressed_bytes", "uncompressed_bytes", "dtype"]


def test_plot_token_progression_draws(capture, tmp_path):
    path, fw = capture
    tm = analyze_activations_with_tokens(str(path), fw)["token_metadata"]
    df = build_packet_dataframe(load_stream_packets(str(path)))
    ax = plot_token_progression(df, tm, metric="l2_norm")
    x, y = ax.lines[0].get_xdata(), ax.lines[0].get_ydata()
    assert list(x) == [0, 1, 2, 3]
    np.testing.assert_allclose(y, [df[df.token_index == k]["l2_norm"].mean() for k in range(4)])
    assert [t.get_text() for t in ax.get_xticklabels()] == [t["token_text"] for t in fw.tokens]
    img = _png_pixels(ax.figure, tmp_path / "prog.png")
    assert img.std() > 0.05 and (img < 0.5).mean() > 0.005  # drawn, not blank


def test_attention_heatmap_draws(capture, tmp_path):
    path, fw = capture
    df = build_packet_dataframe(str(path))
    ax = visualize_attention_patterns(df, metric="std")
    arr = ax.images[0].get_array()
    assert arr.shape == (4, len(fw.hooked_modules))
    want = df[(df.token_index == 2) & (df.layer_name == "model.layers.3.mlp")]["std"].mean()
    col = sorted(df.layer_name.unique()).index("model.layers.3.mlp")
    assert arr[2, col] == pytest.approx(want)
    img = _png_pixels(ax.figure, tmp_path / "heat.png")
    assert img.std() > 0.05


def test_analyze_circuits():
    # synthetic: b follows a, c is its mirror, d is constant (no correlation)
    rows = []
    for k in range(6):
        for layer, v in (("a", k), ("b", 2 * k + 1), ("c", -k), ("d", 5.0)):
            rows.append({"token_index": k, "layer_name": layer, "l2_norm": float(v)})
    res = analyze_circuits(pd.DataFrame(rows))
    pairs = {(r.layer_a, r.layer_b): r.correlation for r in res.itertuples()}
    assert pairs == {("a", "b"): pytest.approx(1.0), ("a", "c"): pytest.approx(-1.0),
                     ("b", "c"): pytest.approx(-1.0)}
    assert res.iloc[0].correlation == pytest.approx(1.0)
    assert len(analyze_circuits(pd.DataFrame(rows), top_k=1)) == 1
    assert analyze_circuits(pd.DataFrame(rows), min_correlation=1.1).empty


def test_analyze_circuits_on_capture(capture):
    path, _ = capture
    res = analyze_circuits(build_packet_dataframe(str(path)), min_correlation=0.0, top_k=100)
    assert list(res.columns) == ["layer_a", "layer_b", "correlation"] and len(res) > 0
    assert res.correlation.between(-1, 1).all() and res.correlation.is_monotonic_decreasing


def test_dashboard_plotly(capture, tmp_path):
    pytest.importorskip("plotly")
    path, fw = capture
    df = build_packet_dataframe(str(path))
    fig = create_interactive_dashboard(df)
    scatter, bars = fig.data
    assert len(scatter.y) == len(df) and np.allclose(scatter.y, df["l2_norm"])
    assert sorted(bars.x) == sorted(fw.hooked_modules)
    html = tmp_path / "dash.html"
    fig.write_html(str(html), include_plotlyjs=False)
    assert "model.layers.0.mlp" in html.read_text()


def test_dashboard_matplotlib_fallback(capture, tmp_path, monkeypatch):
    path, _ = capture
    df = build_packet_dataframe(str(path))
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.warns(UserWarning, match="plotly is not installed"):
        fig = create_interactive_dashboard(df, metric="std")
    img = _png_pixels(fig, tmp_path / "dash.png")
    assert img.std() > 0.05


def test_legacy_131_stream_has_no_tokens():
    p = TESTDATA / "compat131" / "lz4.stream"
    rows = load_stream_packets(str(p), "lz4")
    assert len(rows) == 8 and all(r["token_index"] is None for r in rows)
    assert rows[3]["layer_name"] == "<root>"
    df = build_packet_dataframe(rows)
    assert "token_index" not in df.columns
    # Without tokens to divide them among, the token plots refuse (as 1.3.1 did).
    with pytest.raises(ValueError, match="no token_index"):
        plot_token_progression(df)
    with pytest.raises(ValueError, match="no token_index"):
        analyze_circuits(df)
    # With tokens, 1.3.1's even split, flagged as an estimate (test_compat131_dropin.py).
    with pytest.warns(UserWarning, match="divided evenly"):
        est = build_packet_dataframe(rows, {"total_tokens": 3, "tokens": [{"token_text": t} for t in "abc"]})
    assert est["token_index"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2] and est["token_estimated"].all()
    # the codec override is used, and a wrong one is an error, not a silent skip
    with pytest.raises(StreamFormatError, match="does not decode as zstd"):
        load_stream_packets(str(p), "zstd")
    bad = load_stream_packets(str(p), "zstd", include_failed=True)
    assert len(bad) == 8 and all("error" in r and np.isnan(r["l2_norm"]) for r in bad)


def test_drops_are_reported(tmp_path):
    from test_stream import write_stream

    p = write_stream(tmp_path / "d.strap", [("a", torch.ones(4), None)], drops=[("a", 16)])
    with pytest.warns(UserWarning, match="1 tensors were dropped"):
        rows = load_stream_packets(p)
    assert len(rows) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = load_stream_packets(p, include_failed=True)
    assert [r.get("dropped", False) for r in rows] == [False, True] and np.isnan(rows[1]["mean"])
