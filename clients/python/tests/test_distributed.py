"""Per-rank streams under a distributed launcher (docs/DISTRIBUTED.md): the rank detected,
the per-rank name, the ``distributed`` metadata, and the opt-out."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import tiny_gpt2

from llm_instrumentation import capture_activations, open_stream
from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation._distributed import RankInfo, detect, per_rank_enabled, rank_path
from llm_instrumentation._options import SessionOptions
from llm_instrumentation.stream import TOKEN
from llm_instrumentation.framework import tokens_path

R1 = RankInfo(rank=1, world_size=2, local_rank=1, local_world_size=2, host="h", source="env")


@pytest.mark.parametrize("given,want", [
    ("/r/cap.strap", "/r/cap.rank00001-of-00002.strap"),
    ("/r/gen.stream", "/r/gen.rank00001-of-00002.stream"),
    ("/r/cap", "/r/cap.rank00001-of-00002"),
    ("/r/.strap", "/r/.strap.rank00001-of-00002"),
    ("/r/a.b.strap", "/r/a.b.rank00001-of-00002.strap"),
    ("/r/cap.rank00001-of-00002.strap", "/r/cap.rank00001-of-00002.strap"),  # given back: kept
    ("/r/cap.rank00000-of-00002.strap", "/r/cap.rank00000-of-00002.rank00001-of-00002.strap"),
    ("/r/run.ckpt.json", "/r/run.ckpt.rank00001-of-00002.json"),
    # libstrap's rule (clients/c/common/strap_rank.h; clients/c/tests/test_rank.c checks the same)
    ("/r/..strap", "/r/..strap.rank00001-of-00002"),
    ("/r/a.", "/r/a.rank00001-of-00002."),
    ("/r.d/cap", "/r.d/cap.rank00001-of-00002"),
    ("cap.strap", "cap.rank00001-of-00002.strap"),
    ("/r/cap.rank000001-of-000002.strap", "/r/cap.rank000001-of-000002.strap"),
    ("/r/cap.rank0001-of-00002.strap", "/r/cap.rank0001-of-00002.rank00001-of-00002.strap"),
    ("/r/cap.rank\u0660\u0660\u0660\u0660\u0661-of-00002.strap",  # not ASCII digits: no marker
     "/r/cap.rank\u0660\u0660\u0660\u0660\u0661-of-00002.rank00001-of-00002.strap"),
])
def test_rank_path(given, want):
    assert rank_path(given, R1) == want


def test_rank_names_sort_and_never_collide():
    names = [rank_path("/r/cap.strap", RankInfo(r, 12000, None, None, "h", "env")) for r in (11999, 2, 10, 0, 100)]
    assert sorted(names) == [rank_path("/r/cap.strap", RankInfo(r, 12000, None, None, "h", "env"))
                             for r in (0, 2, 10, 100, 11999)]
    assert len(set(names)) == len(names)


def test_detect_from_env():
    assert detect({}) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no ranks
    assert detect({"RANK": "1"}) is None  # a world size is needed
    assert detect({"RANK": "x"}) is None  # not a launcher's pair: not read at all
    info = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert info is not None
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.source) == (3, 8, 1, 2, "env")
    assert info.host and info.metadata() == {"rank": 3, "world_size": 8, "local_rank": 1, "local_world_size": 2,
                                             "host": info.host, "source": "env"}
    info = detect({"RANK": "1", "WORLD_SIZE": "2"})
    assert info is not None and info.local_rank is None and info.local_world_size is None
    with pytest.raises(ValueError, match="RANK='x'"):
        detect({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        detect({"RANK": "2", "WORLD_SIZE": "2"})


def test_opt_out_values():
    assert per_rank_enabled({}) and per_rank_enabled({"STRAP_RANK_STREAMS": "1"})
    assert not per_rank_enabled({"STRAP_RANK_STREAMS": "0"}) and not per_rank_enabled({"STRAP_RANK_STREAMS": "off"})
    with pytest.raises(ValueError, match="STRAP_RANK_STREAMS"):
        per_rank_enabled({"STRAP_RANK_STREAMS": "maybe"})


@pytest.fixture
def rank1(monkeypatch):
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("STRAP_RANK_STREAMS", raising=False)


def test_options_name_every_file_per_rank(rank1, tmp_path):
    o = SessionOptions(output_path=tmp_path / "cap.strap", track_per_token=True, checkpoint_interval_tokens=4)
    assert o.output_path == str(tmp_path / "cap.rank00001-of-00002.strap")
    assert o.checkpoint_file == ckpt.default_path(o.output_path)
    assert tokens_path(o.output_path) == str(tmp_path / "cap.rank00001-of-00002.strap_tokens.json")
    assert o.with_capture(stall_timeout=5.0).output_path == o.output_path  # checked again, not renamed twice
    o = SessionOptions(output_path=tmp_path / "cap.strap", track_per_token=True, checkpoint_interval_tokens=4,
                       checkpoint_path=tmp_path / "run.ckpt.json", trace_path=tmp_path / "t.jsonl")
    assert o.checkpoint_path == str(tmp_path / "run.ckpt.rank00001-of-00002.json")
    assert o.trace_path == str(tmp_path / "t.rank00001-of-00002.jsonl")


def test_opt_out_keeps_the_path(rank1, monkeypatch, tmp_path):
    monkeypatch.setenv("STRAP_RANK_STREAMS", "0")
    assert SessionOptions(output_path=tmp_path / "cap.strap").output_path == str(tmp_path / "cap.strap")


def test_single_process_keeps_the_path(monkeypatch, tmp_path):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert SessionOptions(output_path=tmp_path / "cap.strap").output_path == str(tmp_path / "cap.strap")


def capture(tmp_path, sock):
    model = tiny_gpt2()
    with capture_activations(model, output_path=tmp_path / "cap.strap", preset="fast_capture", socket_path=sock,
                             autostart_daemon=False) as fw:
        with torch.no_grad():
            model(torch.arange(6).unsqueeze(0))
    return fw


def test_capture_writes_the_rank_stream_with_its_metadata(rank1, real_strapd, tmp_path):
    fw = capture(tmp_path, real_strapd.socket)
    want = tmp_path / "cap.rank00001-of-00002.strap"
    assert fw.output_path == str(want)
    assert sorted(os.listdir(tmp_path)) == ["cap.rank00001-of-00002.strap"]
    with open_stream(want) as r:
        d = r.metadata["client_metadata"]["distributed"]
        assert d == {"rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2, "host": d["host"],
                     "source": "env", "tp_rank": 0, "tp_size": 1, "pp_stage": 0, "pp_size": 1, "dp_rank": 1,
                     "dp_size": 2, "layout_source": "default", "job_id": None}
        assert d["host"] and r.metadata["client_metadata"]["output_path"] == str(want)
        assert r.end().meta["status"] == "complete"


def test_opt_out_capture_keeps_path_and_records_rank(rank1, monkeypatch, real_strapd, tmp_path):
    monkeypatch.setenv("STRAP_RANK_STREAMS", "0")
    fw = capture(tmp_path, real_strapd.socket)
    assert fw.output_path == str(tmp_path / "cap.strap")
    with open_stream(tmp_path / "cap.strap") as r:
        assert r.metadata["client_metadata"]["distributed"]["rank"] == 1


def test_single_process_metadata_has_no_rank(monkeypatch, real_strapd, tmp_path):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    capture(tmp_path, real_strapd.socket)
    with open_stream(tmp_path / "cap.strap") as r:
        assert "distributed" not in r.metadata["client_metadata"]


def test_rank_resumes_its_own_stream(rank1, real_strapd, tmp_path):
    """An interrupted rank's capture, run again with resume_from_checkpoint=True by the same
    call, finds its per-rank stream and checkpoint and goes on from them."""
    from genloop import generate

    class Interrupted(Exception):
        pass

    model = tiny_gpt2()
    kw = dict(output_path=tmp_path / "cap.strap", preset="fast_capture", socket_path=real_strapd.socket,
              autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=2)
    with pytest.raises(Interrupted):
        with capture_activations(model, **kw) as fw:
            generate(fw, model, n_tokens=4)
            raise Interrupted
    ranked = tmp_path / "cap.rank00001-of-00002.strap"
    assert os.path.exists(ckpt.default_path(str(ranked))), sorted(os.listdir(tmp_path))
    # A rank alone, with no process group and no torchrun: no job-wide point can be agreed on
    # (docs/DISTRIBUTED.md D3), and the warning says so.
    with pytest.warns(UserWarning, match="resumes .* from its own point, not the point every rank reached"), \
            capture_activations(model, resume_from_checkpoint=True, **kw) as fw:
        assert fw.output_path == str(ranked) and fw.resumed_from in ("checkpoint", "stream")
        assert fw.resume_step == 4
        generate(fw, model, n_tokens=6)
    assert not os.path.exists(tmp_path / "cap.strap")
    with open_stream(ranked) as r:
        assert r.end().meta["status"] == "complete"
        assert sum(1 for pk in r.packets() if pk.type == TOKEN) == 6
