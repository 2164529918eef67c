"""The fourteen 1.3.1 call forms of issue 28, each as a 1.3.1 user writes it (real strapd,
reached through ``STRAPD_SOCKET`` so the calls carry no argument of ours). One test per line
of the issue, numbered as there; each failed before the change that made it pass.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import REPO, TESTDATA

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llm_instrumentation import *  # noqa: E402,F401,F403  (as a 1.3.1 script does)
from llm_instrumentation import open_stream  # noqa: E402
from llm_instrumentation.checkpoint import CaptureCompleteError  # noqa: E402
from llm_instrumentation.core.auto_detect import create_optimized_config  # noqa: E402
from llm_instrumentation.core.hooks import OptimizedHookManager  # noqa: E402
from llm_instrumentation.stream import TENSOR, TOKEN  # noqa: E402


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, real_strapd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STRAPD_SOCKET", real_strapd.socket)
    return tmp_path


def _packets(path):
    """(type, name, step) of each TENSOR and TOKEN packet."""
    with open_stream(path) as r:
        return [(p.type, p.name, p.step) for p in r.packets() if p.type in (TENSOR, TOKEN)]


class _AttnMlp(nn.Module):
    """No list of blocks: the detector finds nothing; 1.3.1 hooked children by name."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.mlp(self.attn(x)))


# 1 ---------------------------------------------------------------------------------------------

def test_01_unrecognised_model_gets_131_hooks(in_tmp):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with pytest.warns(UserWarning, match=r"no decoder blocks found.*FULL_TENSOR: <root>, 0, 1, 2") as rec:
        with capture_activations(model, preset="balanced", output_path="s.stream") as fw:
            with torch.no_grad():
                out = model(torch.randn(2, 16))
    assert len([w for w in rec if "decoder blocks" in str(w.message)]) == 1
    assert fw.hooked_modules == ["", "0", "1", "2"]
    with open_stream("s.stream") as r:
        got = {t.name: t.tensor() for t in r}
    assert sorted(got) == ["0", "1", "2", "<root>"]
    assert torch.equal(got["<root>"], out) and got["1"].shape == (2, 32)

    seen = []

    class Processor:
        def process(self, tensor, metadata):
            seen.append(metadata["layer_name"])
            return b""

    mgr = OptimizedHookManager(Processor())
    with pytest.warns(UserWarning, match="no decoder blocks"):
        mgr.attach_hooks(model, HookConfig(HookGranularity.FULL_TENSOR))
    model(torch.randn(1, 16))
    assert len(mgr.hooks) == 4 and seen == ["0", "1", "2", ""]  # 1.3.1 named the root ""

    m2 = _AttnMlp()
    with pytest.warns(UserWarning, match="MLP_ONLY: mlp"):
        with capture_activations(m2, preset="mlp_analysis", output_path="m.stream") as fw:
            m2(torch.randn(1, 8))
    assert fw.hooked_modules == ["mlp"] and {n for _, n, _ in _packets("m.stream") if n} == {"mlp"}
    # No child named like an MLP: 1.3.1 captured nothing, and so does this (with the warning).
    with pytest.warns(UserWarning, match="hooking what 1.3.1 hooked for MLP_ONLY: nothing"):
        with capture_activations(model, preset="mlp_analysis", output_path="n.stream") as fw:
            model(torch.randn(1, 16))
    assert analyze_activations("n.stream")["packets"] == 0


# 2 ---------------------------------------------------------------------------------------------

def test_02_llm_prof_writes_lists_where_131_did():
    from llm_instrumentation.cli.llm_prof import snapshot_to_events

    snap = {"interval_s": 1.0, "page_faults": {"42": 7}, "pressure": {}, "memory": {}}
    (mem,) = snapshot_to_events(snap, ["mem"], None)
    assert mem["top_faulting_threads"] == []
    assert [t["faults"] for t in mem["top_faulting_threads"]] == []  # 1.3.1's notebook iterates it


# 3 ---------------------------------------------------------------------------------------------

def test_03_named_codec_wins_over_throughput_target(in_tmp, caplog):
    rows = {}
    for codec in ("none", "lz4", "zstd"):
        cfg = InstrumentationConfig(HookGranularity.FULL_TENSOR, codec, 2.0)  # 1.3.1's positional form
        rows[codec] = cfg.transport_plan(cores=2).codec
    assert rows == {"none": "none", "lz4": "lz4", "zstd": "zstd"}
    model = _Tiny()
    cfg = InstrumentationConfig(compression_algorithm="zstd", target_throughput_gbps=50.0)
    with capture_activations(model, config=cfg, output_path="z.stream"):
        model(torch.tensor([[1, 2]]))
    assert analyze_activations("z.stream")["compression"] == "zstd"
    assert any("may not sustain 50.0 GB/s" in r.getMessage() for r in caplog.records)


# 4 ---------------------------------------------------------------------------------------------

def test_04_empty_stream_reads_as_empty_131_stream(tmp_path):
    from llm_instrumentation.analysis import load_stream_packets

    p = tmp_path / "attention_only.stream"
    p.write_bytes(b"")
    a = analyze_activations(str(p))
    assert a["packets"] == 0 and a["per_layer"] == {} and a["legacy"]
    assert load_stream_packets(str(p)) == []
    with open_stream(p) as r:
        assert list(r) == [] and r.legacy


# 5 ---------------------------------------------------------------------------------------------

def test_05_cli_llm_prof_main():
    from llm_instrumentation.cli import llm_prof_main
    from llm_instrumentation.cli.llm_prof import main

    assert llm_prof_main is main


# 6 ---------------------------------------------------------------------------------------------

def test_06_analyze_activations_data_path(in_tmp):
    model = _Tiny()
    fw = InstrumentationFramework(InstrumentationConfig.balanced())
    fw.instrument_model(model)
    with fw.capture_activations("d.stream"):
        model(torch.tensor([[1, 2]]))
    assert fw.analyze_activations(data_path="d.stream") == fw.analyze_activations("d.stream")
    assert fw.analyze_activations(data_path="d.stream")["packets"] == 6  # 2 blocks, their attention and MLP


# 7 ---------------------------------------------------------------------------------------------

def _readme_parser() -> str:
    text = (REPO / "clients" / "python" / "README.md").read_text()
    section = text[text.index("## Migrating from 1.3.1"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    (code,) = [b for b in blocks if "def iter_packets" in b]
    return code


def test_07_131_parsers_cannot_read_new_captures_readme_shows_open_stream(in_tmp):
    model = nn.Sequential(nn.Linear(4, 3))
    with capture_activations(model, preset="fast_capture", output_path="new.stream", modules=["0"]):
        with torch.no_grad():
            out = model(torch.ones(1, 4))
    # The parser 1.3.1's docs/STREAM_FORMAT.md gives reads garbage from a new capture.
    data = Path("new.stream").read_bytes()
    name_len, data_len = struct.unpack("!HI", data[:6])
    assert data[6:6 + name_len] not in (b"0", b"<root>") or 6 + name_len + data_len > len(data)
    # The replacement the README shows reads both formats.
    ns: dict = {}
    exec(_readme_parser(), ns)  # noqa: S102 - the documented snippet, run as written
    got = dict(ns["iter_packets"]("new.stream"))
    assert np.array_equal(got["0"], out.numpy())
    old = dict(ns["iter_packets"](str(TESTDATA / "compat131" / "lz4.stream")))
    assert old and all(v.dtype == np.float16 for v in old.values())


# 8 ---------------------------------------------------------------------------------------------

def test_08_capture_without_model_keeps_tokens_and_checkpoints(in_tmp):
    fw = InstrumentationFramework(InstrumentationConfig(HookGranularity.FULL_TENSOR, "none"))
    with pytest.raises(ValueError):  # argument errors first, model or not
        with fw.capture_activations("x.stream", track_per_token=True, checkpoint_interval_tokens=0):
            pass
    with pytest.warns(UserWarning, match="before instrument_model"):
        with fw.capture_activations("x.stream", track_per_token=True, checkpoint_interval_tokens=2) as tracker:
            for i in range(3):
                tracker.record_token(10 + i, f"t{i}")
            assert Path("x.stream.ckpt.json").exists()
    assert len(fw.checkpoint_times) == 1
    assert [(t, s) for t, _, s in _packets("x.stream")] == [(TOKEN, 0), (TOKEN, 1), (TOKEN, 2)]
    doc = json.loads(Path("x_tokens.json").read_text())
    assert [t["token_id"] for t in doc["tokens"]] == [10, 11, 12]
    assert fw.model is None  # instrument_model still takes the model afterwards
    fw.instrument_model(_Tiny())


# 9 ---------------------------------------------------------------------------------------------

def _gen(tracker, model, ids, n):
    for _ in range(n):
        with torch.no_grad():
            nxt = int(model(torch.tensor([ids])).argmax()) % 10
        tracker.record_token(nxt, str(nxt))
        ids.append(nxt)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Linear(4, 4)
        self.mlp = nn.Linear(4, 4)

    def forward(self, h):
        return h + self.mlp(self.self_attn(h))


class _Tiny(nn.Module):
    """A decoder-shaped model the detector recognises (a list of blocks)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(4, 10)

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.layers:
            h = block(h)
        return self.head(h).sum(1)


def test_09_checkpoints_carry_131_keys_and_131_checkpoints_resume(in_tmp):
    cfg = InstrumentationConfig(HookGranularity.FULL_TENSOR, "none")
    model = _Tiny()
    fw = InstrumentationFramework(cfg)
    fw.instrument_model(model)
    with pytest.raises(RuntimeError, match="stop"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fw.capture_activations("r.stream", track_per_token=True, checkpoint_interval_tokens=2) as tracker:
            _gen(tracker, model, [1, 2], 5)
            raise RuntimeError("stop")
    doc = json.loads(Path("r.stream.ckpt.json").read_text())
    assert doc["format"] == "strap-checkpoint" and doc["token_count"] == 4  # ours
    assert doc["total_tokens"] == 4 and len(doc["tokens"]) == 4  # 1.3.1's
    assert doc["metadata"]["resume_count"] == 0 and doc["metadata"]["start_time"] <= doc["last_checkpoint_time"]
    assert [t["token_id"] for t in doc["tokens"]] == [t["token_id"] for t in fw.tokens[:4]]
    # Our resume goes on from the stream (5 tokens intact) and counts the resume.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fw.capture_activations("r.stream", track_per_token=True, checkpoint_interval_tokens=2,
                                    resume_from_checkpoint=True) as tracker:
            assert len(tracker.tokens) == 5
            _gen(tracker, model, [1, 2] + [t["token_id"] for t in tracker.tokens], 1)
            doc = json.loads(Path("r.stream.ckpt.json").read_text())
            assert doc["total_tokens"] == 6 and doc["metadata"]["resume_count"] == 1
    # A 1.3.1 checkpoint with no strap stream: its tokens go on, into a new stream.
    old = {"version": 1, "total_tokens": 2, "last_checkpoint_time": 1.0,
           "metadata": {"start_time": 1.0, "resume_count": 2, "updated_at": 1.0},
           "tokens": [{"token_index": 0, "token_id": 7, "token_text": "a"},
                      {"token_index": 1, "token_id": 8, "token_text": "b"}]}
    Path("o.stream.ckpt.json").write_text(json.dumps(old))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fw.capture_activations("o.stream", track_per_token=True, checkpoint_interval_tokens=1,
                                    resume_from_checkpoint=True) as tracker:
            assert [t["token_id"] for t in tracker.tokens] == [7, 8] and fw.resumed_from == "checkpoint-1.3.1"
            _gen(tracker, model, [1, 2, 7, 8], 1)
            doc = json.loads(Path("o.stream.ckpt.json").read_text())
            assert doc["total_tokens"] == 3 and doc["metadata"]["resume_count"] == 3
            assert doc["metadata"]["start_time"] == 1.0
    kinds = [(t, s) for t, _, s in _packets("o.stream")]
    assert kinds[:2] == [(TOKEN, 0), (TOKEN, 1)] and (TENSOR, 2) in kinds and kinds[-1] == (TOKEN, 2)
    # A 1.3.1 checkpoint beside a finished strap stream (END complete): nothing to go on
    # from, and a resume must not cut a finished capture: refused, every byte kept.
    Path("r.stream.ckpt.json").write_text(json.dumps(old))
    finished = Path("r.stream").read_bytes()
    with pytest.raises(CaptureCompleteError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fw.capture_activations("r.stream", track_per_token=True, resume_from_checkpoint=True):
            pass
    assert Path("r.stream").read_bytes() == finished
    # Beside a strap stream cut short (its END and what follows lost, as in a crash): the
    # stream says where to go on.
    with open_stream("r.stream") as r:
        end = next(p.offset for p in r.packets() if p.type_name == "END")
    Path("r.stream").write_bytes(finished[:end])
    with pytest.warns(UserWarning, match="1.3.1 checkpoint"):
        with fw.capture_activations("r.stream", track_per_token=True, resume_from_checkpoint=True) as tracker:
            assert len(tracker.tokens) == 6


# 10 --------------------------------------------------------------------------------------------

def test_10_resume_with_nothing_starts_fresh(in_tmp):
    fw = InstrumentationFramework(InstrumentationConfig(HookGranularity.FULL_TENSOR, "none"))
    fw.instrument_model(_Tiny())
    with pytest.warns(UserWarning, match="starting a new capture"):
        with fw.capture_activations("f.stream", track_per_token=True, checkpoint_interval_tokens=4,
                                    resume_from_checkpoint=True) as tracker:
            _gen(tracker, fw.model, [1], 2)
    assert fw.resume_step == 0 and len(fw.tokens) == 2 and fw.resumed_from is None
    assert [s for t, _, s in _packets("f.stream") if t == TOKEN] == [0, 1]
    assert analyze_activations("f.stream")["end_status"] == "complete"


# 11 --------------------------------------------------------------------------------------------

def test_11_rerun_after_interrupt_keeps_the_earlier_capture(in_tmp):
    model = _Tiny()
    fw = InstrumentationFramework(InstrumentationConfig(HookGranularity.FULL_TENSOR, "none"))
    fw.instrument_model(model)

    def cell(n):
        with fw.capture_activations("cell.stream", track_per_token=True, checkpoint_interval_tokens=2) as tracker:
            _gen(tracker, model, [3], n)
            if n == 5:
                raise KeyboardInterrupt  # the notebook's stop button

    with pytest.raises(KeyboardInterrupt), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cell(5)
    first = Path("cell.stream").read_bytes()
    with pytest.warns(UserWarning, match=r"earlier, unfinished capture .* moved to .*cell\.interrupted-1\.stream"):
        cell(3)  # the same cell again, as 1.3.1 allowed
    assert len(fw.tokens) == 3 and not Path("cell.stream.ckpt.json").exists()
    assert Path("cell.interrupted-1.stream").read_bytes() == first
    kept_text = Path("cell.interrupted-1.stream.ckpt.json").read_text()
    kept = json.loads(kept_text)
    assert kept["stream"].endswith("cell.interrupted-1.stream") and kept["total_tokens"] == 4
    with fw.capture_activations("cell.interrupted-1.stream", track_per_token=True, resume_from_checkpoint=True) as tr:
        assert len(tr.tokens) == 5  # the earlier capture goes on
    # Strict callers still get the refusal; a 1.3.1 checkpoint is overwritten, as 1.3.1 did.
    Path("cell.stream.ckpt.json").write_text(kept_text)
    with pytest.raises(CheckpointError, match="overwrite_checkpoint=True"):
        with fw.capture_activations("cell.stream", track_per_token=True, overwrite_checkpoint=False):
            pass
    Path("cell.stream.ckpt.json").write_text(json.dumps({"version": 1, "total_tokens": 0, "tokens": []}))
    with pytest.warns(UserWarning, match="removing the 1.3.1 checkpoint"):
        with fw.capture_activations("cell.stream", track_per_token=True):
            pass
    assert not Path("cell.interrupted-2.stream").exists()


# 12 --------------------------------------------------------------------------------------------

def test_12_token_plots_on_131_streams_divide_evenly(tmp_path):
    from llm_instrumentation.analysis import (analyze_circuits, build_packet_dataframe, load_stream_packets,
                                              plot_token_progression, visualize_attention_patterns)

    rows = load_stream_packets(str(TESTDATA / "compat131" / "zstd.stream"))
    meta = {"total_tokens": 3, "tokens": [{"token_text": f"tok-{i}"} for i in range(3)]}
    with pytest.warns(UserWarning, match="divided evenly among 3 tokens"):
        df = build_packet_dataframe(rows, token_metadata=meta)
    n = len(rows)
    base, extra = divmod(n, 3)
    want = sum(([t] * (base + (t < extra)) for t in range(3)), [])
    assert df["token_index"].tolist() == want and df["token_estimated"].all()
    assert df["token_text"].tolist() == [f"tok-{t}" for t in want]
    assert plot_token_progression(df, token_metadata=meta) is not None
    assert visualize_attention_patterns(df, token_metadata=meta) is not None
    assert set(analyze_circuits(df).columns) == {"layer_a", "layer_b", "correlation"}
    plt.close("all")


# 13 --------------------------------------------------------------------------------------------

def test_13_tensor_compression_manager_and_streaming_serializer(tmp_path):
    from llm_instrumentation import StreamingSerializer, TensorCompressionManager

    with open_stream(TESTDATA / "compat131" / "lz4.stream") as r:
        pk = next(iter(r.packets()))
        want = pk.decode()
        stored = pk.stored()
    m = TensorCompressionManager()
    assert m.decompress_tensor(stored, "lz4") == want
    payload, ratio = m.compress_tensor(torch.linspace(0, 1, 64))
    assert np.array_equal(np.frombuffer(m.decompress_tensor(payload), np.float16),
                          torch.linspace(0, 1, 64).half().numpy()) and ratio > 0

    async def write(path):
        s = StreamingSerializer(num_workers=2, compression_algo="zstd")
        await s.start_streaming(path)
        for i in range(5):
            await s.enqueue_tensor(f"layer_{i}", torch.full((3, 4), float(i)))
        await s.stop_streaming()

    out = tmp_path / "ser.stream"
    asyncio.run(write(str(out)))
    with open_stream(out) as r:
        assert r.codec == "zstd"
        assert [(t.name, float(t.numpy()[0])) for t in r] == [(f"layer_{i}", float(i)) for i in range(5)]


# 14 --------------------------------------------------------------------------------------------

def test_14_unknown_purpose_is_balanced_with_a_warning():
    with pytest.warns(UserWarning, match="unknown purpose 'summarization'"):
        cfg = create_optimized_config("llama", purpose="summarization")
    assert cfg == InstrumentationConfig.balanced()
