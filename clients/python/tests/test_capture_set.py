"""The parallel layout (docs/DISTRIBUTED.md D1), which modules a tensor-parallel rank hooks
(D2), and the capture-set manifest's building, checks, writing and command line (D4) and
stitching (D5), in one process: ranks given by ``RANK``/``WORLD_SIZE`` (no process group),
captured through the real strapd. The jobs of several processes are test_parallel_capture.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import parallel_models as pm
from s3server import s3  # noqa: F401  (the fixture)
from llm_instrumentation import CaptureSetError, ParallelLayout, Shard, capture_activations, open_capture_set, open_stream
from llm_instrumentation import capture_set
from llm_instrumentation._distributed import RankInfo, check_sharding, classify, resolve_layout, shard_meta
from llm_instrumentation._options import SessionOptions


def info(rank: int, world: int) -> RankInfo:
    return RankInfo(rank, world, None, None, "h", "env")


# ----- D1: the layout -----------------------------------------------------------------------------


def test_layout_default_and_single_process():
    assert resolve_layout(None, None) is None
    lay = resolve_layout(None, info(3, 4))
    assert (lay.tp_size, lay.pp_size, lay.dp_size, lay.dp_rank, lay.layout_source) == (1, 1, 4, 3, "default")
    with pytest.raises(ValueError, match="single process"):
        resolve_layout({"tp_size": 2}, None)


@pytest.mark.parametrize("rank,want", [(0, (0, 0, 0)), (1, (1, 0, 0)), (2, (0, 0, 1)), (5, (1, 1, 0)), (7, (1, 1, 1))])
def test_layout_places_tp_fastest(rank, want):
    # world 8 = pp 2 × dp 2 × tp 2: rank = (pp·dp_size + dp)·tp_size + tp
    lay = resolve_layout({"tp_size": 2, "pp_size": 2}, info(rank, 8))
    assert (lay.tp_rank, lay.pp_stage, lay.dp_rank) == want and lay.dp_size == 2
    assert lay.layout_source == "argument"
    assert resolve_layout(ParallelLayout(tp_size=2, pp_size=2), info(rank, 8)) == lay


def test_layout_errors():
    with pytest.raises(ValueError, match="not a multiple"):
        resolve_layout({"tp_size": 3}, info(0, 4))
    with pytest.raises(ValueError, match="not the world size 4"):
        resolve_layout({"tp_size": 2, "dp_size": 3}, info(0, 4))
    with pytest.raises(ValueError, match="unknown keys \\['cp_size'\\]"):
        resolve_layout({"cp_size": 2}, info(0, 4))
    with pytest.raises(ValueError, match="all three"):
        resolve_layout({"tp_size": 2, "tp_rank": 1}, info(0, 4))
    with pytest.raises(ValueError, match="tp_rank=2 is outside its size 2"):
        resolve_layout({"tp_size": 2, "tp_rank": 2, "pp_stage": 0, "dp_rank": 0}, info(0, 4))
    with pytest.raises(ValueError, match="tp_size=0"):
        resolve_layout({"tp_size": 0}, info(0, 4))
    with pytest.raises(TypeError, match="DeviceMesh, a dict or a ParallelLayout"):
        resolve_layout([2, 1], info(0, 4))
    lay = resolve_layout({"tp_size": 2, "tp_rank": 1, "pp_stage": 0, "dp_rank": 1}, info(0, 4))
    assert (lay.tp_rank, lay.dp_rank, lay.dp_size) == (1, 1, 2)


def test_layout_from_a_device_mesh():
    """A real DeviceMesh (a one-process gloo group): names tp/pp/dp place the rank; another
    name of size 1 places nothing; a mesh of another size than the job is refused."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("fsdp", "tp"))
        lay = resolve_layout(mesh, info(0, 1))
        assert (lay.tp_size, lay.dp_size, lay.layout_source) == (1, 1, "device_mesh")
        with pytest.raises(ValueError, match="holds 1 ranks, the job 2"):
            resolve_layout(mesh, info(0, 2))
        with pytest.raises(ValueError, match="no mesh_dim_names"):
            resolve_layout(init_device_mesh("cpu", (1,)), info(0, 1))
    finally:
        dist.destroy_process_group()


def test_mesh_with_other_dimension_refused_by_name():
    class Mesh:  # what the check reads of a DeviceMesh, for a size this one process cannot build
        mesh_dim_names = ("cp", "tp")

        def size(self, i):
            return 2

    from llm_instrumentation._distributed import _from_mesh

    with pytest.raises(ValueError, match="\\['cp'\\] are not tp, pp or dp"):
        _from_mesh(Mesh(), info(0, 4))


# ----- D2: which modules are what ----------------------------------------------------------------


def test_sharding_specs():
    got = check_sharding({"*.fc1": Shard(2), "*.q": {"shard": 1}, "*.mlp": "replicated", "*.x": "local"})
    assert [(p, k.kind, k.axis) for p, k in got] == [("*.fc1", "sharded", 2), ("*.q", "sharded", 1),
                                                      ("*.mlp", "replicated", None), ("*.x", "local", None)]
    for bad in ({"*": "split"}, {"*": {"shard": -1}}, {"*": {"shard": 1, "x": 2}}, {"": "local"}):
        with pytest.raises(ValueError):
            check_sharding(bad)
    with pytest.raises(TypeError):
        check_sharding(["*"])


def test_classify_first_match_and_tp1():
    lay2 = resolve_layout({"tp_size": 2}, info(1, 2))
    model = pm.Decoder()
    mods = ["model.layers.0.mlp.fc1", "model.layers.0.mlp", "model.layers.0"]
    kinds = classify(model, mods, lay2, check_sharding({"*.fc1": Shard(2), "*.mlp*": "local"}))
    assert [(kinds[m].kind, kinds[m].axis) for m in mods] == [("sharded", 2), ("local", None), ("detect", None)]
    lay1 = resolve_layout(None, info(1, 2))
    assert {k.kind for k in classify(model, mods, lay1, check_sharding({"*": Shard(0)})).values()} == {"local"}


def test_shard_meta():
    lay = resolve_layout({"tp_size": 4}, info(2, 4))
    assert shard_meta((1, 7, 96), -1, lay) == {"shard": {"axis": 2, "offset": 192, "full_shape": [1, 7, 384],
                                                         "tp_rank": 2, "tp_size": 4}}
    with pytest.raises(ValueError, match="outside a tensor of 3"):
        shard_meta((1, 7, 96), 3, lay)


@pytest.fixture
def env_rank(monkeypatch):
    def set_(rank: int, world: int) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    monkeypatch.delenv("STRAP_RANK_STREAMS", raising=False)
    monkeypatch.delenv("STRAP_CAPTURE_SET", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    return set_


def test_options_refuse_layout_in_one_process(monkeypatch, tmp_path):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="single process"):
        SessionOptions(output_path=tmp_path / "c.strap", parallel_layout={"tp_size": 2})
    with pytest.raises(ValueError, match="replicated='all'"):
        SessionOptions(output_path=tmp_path / "c.strap", replicated="all")
    assert SessionOptions(output_path=tmp_path / "c.strap").layout is None


def test_tp_rank1_does_not_hook_replicated_modules(env_rank, real_strapd, tmp_path):
    """tp rank 1 of 2: modules named replicated get no hook at all; a module left to
    detection whose first output is a plain tensor (whole) loses its hook after that output;
    the sharded ones are stored with their shard descriptor. ``every_rank`` hooks them all
    and marks the whole ones as replicas."""
    env_rank(1, 2)
    model = pm.Decoder().eval()
    x = pm.inputs(0)[0]
    sharding = {**pm.SHARDING, **{p: "replicated" for p in pm.WHOLE}}
    for mode in ("tp_rank0", "every_rank"):
        out = tmp_path / mode / "cap.strap"
        with torch.no_grad(), capture_activations(model, output_path=out, preset="fast_capture", modules=pm.MODULES,
                                                  socket_path=real_strapd.socket, autostart_daemon=False,
                                                  parallel_layout={"tp_size": 2}, sharding=sharding,
                                                  replicated=mode) as fw:
            hooked = {n for n, mod in model.named_modules() if mod._forward_hooks and n}  # "": the capture's own
            model(x)
            after = {n for n, mod in model.named_modules() if mod._forward_hooks and n}
        assert not any(mod._forward_hooks for mod in model.modules())  # all removed at the end
        detected = {n for n in fw.hooked_modules if n.endswith(".context")}
        sharded = {n for n in fw.hooked_modules if n.endswith((".q_proj", ".heads", ".fc1", ".act"))}
        whole = set(fw.hooked_modules) - sharded - detected
        assert whole and sharded and detected
        if mode == "tp_rank0":
            assert hooked == sharded | detected and after == sharded
        else:
            assert hooked == after == whole | sharded | detected
        with open_stream(fw.output_path) as r:
            d = r.metadata["client_metadata"]["distributed"]
            assert (d["tp_rank"], d["tp_size"], d["replicated"]) == (1, 2, mode)
            assert d["modules"]["model.layers.0.mlp.fc1"] == {"kind": "sharded", "axis": 2, "source": "argument"}
            assert d["modules"]["model.layers.0.mlp"] == {"kind": "replicated", "source": "argument"}
            assert d["modules"]["model.layers.0.self_attn.context"] == {"kind": "detect", "source": "default"}
            ts = {t.name: t for t in r}
        assert set(ts) == (sharded if mode == "tp_rank0" else whole | sharded | detected)
        fc1 = ts["model.layers.0.mlp.fc1"]
        assert fc1.meta == {"shard": {"axis": 2, "offset": fc1.shape[2], "full_shape": [1, 5, 2 * fc1.shape[2]],
                                      "tp_rank": 1, "tp_size": 2}}
        if mode == "every_rank":
            assert ts["model.layers.0"].meta == {"replica": {"tp_rank": 1, "tp_size": 2}}
            assert ts["model.layers.0.self_attn.context"].meta == {"replica": {"tp_rank": 1, "tp_size": 2}}
        assert fw.capture_set_path is None  # rank 1 writes no manifest


# ----- D4/D5: the manifest and reading -----------------------------------------------------------


def capture_rank(tmp_path, sock, rank: int, world: int, env_rank, tp: int = 1, forwards: int = 2,
                 replicated: str = "tp_rank0"):
    env_rank(rank, world)
    layout = {"tp_size": tp} if tp > 1 else None
    tp_rank = rank % tp
    model = pm.Decoder(tp=tp, rank=tp_rank if tp > 1 else None).eval()
    with torch.no_grad(), capture_activations(model, output_path=tmp_path / "cap.strap", preset="fast_capture",
                                              modules=pm.MODULES, socket_path=sock, autostart_daemon=False,
                                              track_per_token=True, parallel_layout=layout,
                                              sharding=pm.SHARDING, replicated=replicated) as fw:
        for x in pm.inputs(rank // tp, forwards):
            for tok in x[0].tolist():
                fw.record_token(tok, str(tok))
            model(x)
    return fw


def test_rank0_without_process_group_waits_for_streams_and_writes(env_rank, real_strapd, tmp_path):
    """No process group: rank 0 reads the other ranks' ended streams by their names. The CLI
    rebuilds the same manifest; ``inspect`` prints it."""
    capture_rank(tmp_path, real_strapd.socket, 1, 2, env_rank, forwards=3)
    fw = capture_rank(tmp_path, real_strapd.socket, 0, 2, env_rank)
    mpath = tmp_path / "cap.capture-set.json"
    assert fw.capture_set_path == str(mpath)
    m = capture_set.load(mpath)
    assert [(e["rank"], e["dp_rank"], e["forwards"], e["tokens"]) for e in m["ranks"]] == [(0, 0, 2, [0, 10]),
                                                                                           (1, 1, 3, [0, 15])]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = tmp_path / "rebuilt.capture-set.json"
    p = subprocess.run([sys.executable, "-m", "llm_instrumentation.capture_set", "build",
                        str(tmp_path / "cap.rank*-of-*.strap"), "-o", str(out)], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert {**json.loads(out.read_text()), "created": 0} == {**json.loads(mpath.read_text()), "created": 0}
    p = subprocess.run([sys.executable, "-m", "llm_instrumentation.capture_set", "inspect", str(mpath)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "2 ranks, tp 1 × pp 1 × dp 2" in p.stdout and "tokens [0, 15) forwards 3" in p.stdout
    # a glob works as a source too (the manifest is built in memory, absolute paths)
    with open_capture_set(str(tmp_path / "cap.rank*-of-*.strap")) as cs:
        assert len(cs.tensors("model.layers.0", dp_rank=1)) == 3 and len(cs.tensors("model.layers.0")) == 2


def test_rank0_gives_up_after_waiting(env_rank, real_strapd, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(capture_set, "WAIT_FOR_RANKS", 0.5)
    fw = capture_rank(tmp_path, real_strapd.socket, 0, 2, env_rank)
    assert fw.capture_set_path is None and not (tmp_path / "cap.capture-set.json").exists()
    assert "had not ended" in caplog.text and "cap.rank00001-of-00002.strap" in caplog.text
    # the per-rank names turned off: nothing to wait for, said at once
    monkeypatch.setattr(capture_set, "WAIT_FOR_RANKS", 600)
    monkeypatch.setenv("STRAP_RANK_STREAMS", "0")
    fw = capture_rank(tmp_path / "off", real_strapd.socket, 0, 2, env_rank)
    assert fw.capture_set_path is None and "STRAP_RANK_STREAMS=0 turned off" in caplog.text
    # and STRAP_CAPTURE_SET=0: no manifest, nothing said
    monkeypatch.delenv("STRAP_RANK_STREAMS")
    monkeypatch.setenv("STRAP_CAPTURE_SET", "0")
    caplog.clear()
    fw = capture_rank(tmp_path / "none", real_strapd.socket, 0, 2, env_rank)
    assert fw.capture_set_path is None and "manifest" not in caplog.text


@pytest.fixture(params=["tp_rank0"])
def tp_set(env_rank, real_strapd, tmp_path, monkeypatch, request):
    """A tp 2 set (rank 1 first, then rank 0, which writes the manifest), both ranks in this
    one process: the row-parallel sums are left partial (no process group to all-reduce
    over), which changes values, not what is stored where."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: None)
    for rank in (1, 0):
        capture_rank(tmp_path, real_strapd.socket, rank, 2, env_rank, tp=2, replicated=request.param)
    return tmp_path / "cap.capture-set.json"


def test_store_exchange_values_keys_and_missing_ranks():
    """The ranks' facts go through the default group's store (no collective): rank 0 gets
    every rank's value and deletes the keys; a rank not heard from within the store's timeout
    is named. One real gloo group of one process, told it is rank 0 of 2 for the missing case."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from llm_instrumentation import _distributed

    assert not dist.is_initialized()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        one = RankInfo(0, 1, 0, 1, "h", "torch.distributed")
        assert _distributed.store_exchange("t", one, {"a": [1, 2]}, to_all=False) == [{"a": [1, 2]}]
        assert _distributed.store_exchange("t", one, "x", to_all=True) == ["x"]
        default = c10d._get_default_store()
        assert not default.check(["strap-llm/t/0/0"]), "rank 0 deletes what it read (to_all=False)"
        assert default.check(["strap-llm/t/1/0"]), "every rank reads: nobody deletes (to_all=True)"
        default.set_timeout(datetime.timedelta(seconds=2))  # a given store keeps its own (5 min)
        two = RankInfo(0, 2, 0, 2, "h", "torch.distributed")
        with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 sent no t value"):
            _distributed.store_exchange("t", two, 5, to_all=False)
        assert not default.check(["strap-llm/t/2/0"]), "rank 0 deletes what it did get"
        # a caller's bound beats the store's own timeout (a rank that died mid-capture)
        default.set_timeout(datetime.timedelta(seconds=300))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 sent no t value"):
            _distributed.store_exchange("t", two, 5, to_all=False, timeout=0.5)
        assert time.monotonic() - t0 < 30
    finally:
        dist.destroy_process_group()


def test_manifest_checks_name_rank_and_key(tp_set, tmp_path):
    good = json.loads(tp_set.read_text())

    def bad(change, match):
        m = copy.deepcopy(good)
        change(m)
        p = tmp_path / "bad.capture-set.json"
        capture_set.write(p, m)
        with pytest.raises(CaptureSetError, match=match):
            capture_set.load(p)

    bad(lambda m: m.update(format="x"), "key 'format'")
    bad(lambda m: m.update(version=2), "key 'version'")
    bad(lambda m: m["ranks"].pop(), "key 'ranks': 1 entries for a world of 2")
    bad(lambda m: m["layout"].update(tp_size=1), "key 'layout'")
    bad(lambda m: m["ranks"][1].update(tp_rank=0), "rank 1: key 'tp_rank'/'pp_stage'/'dp_rank' \\(0, 0, 0\\)")
    bad(lambda m: m["ranks"][1].update(tp_rank=2), "rank 1: key 'tp_rank' = 2 is outside")
    bad(lambda m: m["ranks"][1].update(session=12345), "rank 1: key 'session'")
    bad(lambda m: m["ranks"][0].update(stream="nope.strap"), "rank 0: key 'stream': .*nope.strap does not exist")
    bad(lambda m: m["ranks"].reverse(), "ranks\\[0\\]: key 'rank' is 1")
    (tmp_path / "notjson.capture-set.json").write_text("{")
    with pytest.raises(CaptureSetError, match="not JSON"):
        capture_set.load(tmp_path / "notjson.capture-set.json")
    # the streams of two ranks swapped: each header names another rank
    m = copy.deepcopy(good)
    m["ranks"][0]["stream"], m["ranks"][1]["stream"] = m["ranks"][1]["stream"], m["ranks"][0]["stream"]
    m["ranks"][0]["session"], m["ranks"][1]["session"] = m["ranks"][1]["session"], m["ranks"][0]["session"]
    capture_set.write(tmp_path / "swap.capture-set.json", m)
    with pytest.raises(CaptureSetError, match="rank 0: key 'rank': the stream .* is rank 1's"):
        capture_set.load(tmp_path / "swap.capture-set.json")


def test_build_errors(tp_set, tmp_path, real_strapd, monkeypatch):
    with pytest.raises(CaptureSetError, match="no stream matches"):
        capture_set.build(str(tmp_path / "none*.strap"))
    with pytest.raises(CaptureSetError, match="ranks \\[1\\] of 2: no stream"):
        capture_set.build([tmp_path / "cap.rank00000-of-00002.strap"])
    with pytest.raises(CaptureSetError, match="rank 0: two streams"):
        capture_set.build([tmp_path / "cap.rank00000-of-00002.strap"] * 2)
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k)
    model = pm.Decoder().eval()
    with torch.no_grad(), capture_activations(model, output_path=tmp_path / "single.strap", modules=pm.MODULES,
                                              socket_path=real_strapd.socket, autostart_daemon=False):
        model(pm.inputs(0)[0])
    with pytest.raises(CaptureSetError, match="single.strap: its header has no client_metadata.distributed"):
        capture_set.build([tmp_path / "cap.rank00000-of-00002.strap", tmp_path / "single.strap"])


def test_stitch_exact_and_errors():
    full = torch.arange(2 * 3 * 8, dtype=torch.float32).reshape(2, 3, 8)
    pieces = [({"axis": 2, "offset": o, "full_shape": [2, 3, 8]}, full[:, :, o:o + n]) for o, n in ((4, 4), (0, 4))]
    assert torch.equal(capture_set.stitch("x", pieces), full)
    uneven = [({"axis": 2, "offset": 0, "full_shape": [2, 3, 8]}, full[:, :, :5]),
              ({"axis": 2, "offset": 5, "full_shape": [2, 3, 8]}, full[:, :, 5:])]
    assert torch.equal(capture_set.stitch("x", uneven), full)
    with pytest.raises(CaptureSetError, match="x: piece missing at offset 4"):
        capture_set.stitch("x", pieces[1:] + [({"axis": 2, "offset": 6, "full_shape": [2, 3, 8]}, full[:, :, 6:])])
    with pytest.raises(CaptureSetError, match="x: piece overlapping at offset 4"):
        capture_set.stitch("x", pieces + [({"axis": 2, "offset": 3, "full_shape": [2, 3, 8]}, full[:, :, 3:4])])
    with pytest.raises(CaptureSetError, match="cover \\[0, 4\\) of 8"):
        capture_set.stitch("x", pieces[1:])
    with pytest.raises(CaptureSetError, match="no piece of"):
        capture_set.stitch("x", [({"axis": 2, "offset": 0, "full_shape": [2, 3, 8]}, full[:1])])


def test_missing_piece_is_an_error_naming_the_record(tp_set, tmp_path, env_rank, real_strapd):
    """Rank 1 captured again with one forward pass where rank 0 has two: stitching forward 1
    finds its piece missing and names the record, never yielding a short tensor; the pieces
    are still there with ``whole=False``."""
    with open_capture_set(tp_set) as cs:
        fc1 = cs.tensors("model.layers.0.mlp.fc1")
        assert len(fc1) == 2 and fc1[0].shape == (1, 5, pm.FFN)
        assert len(cs.tensors("model.layers.0")) == 2  # whole: from tp rank 0
    capture_rank(tmp_path, real_strapd.socket, 1, 2, env_rank, tp=2, forwards=1)
    with pytest.raises(CaptureSetError, match="rank 1: key 'session'"):
        capture_set.load(tp_set)
    streams = str(tmp_path / "cap.rank*-of-*.strap")
    with open_capture_set(streams) as cs:
        with pytest.raises(CaptureSetError, match="piece missing .*record step 10, forward 1, dp_rank 0, pp_stage 0; "
                                                  "pieces from tp ranks \\[0\\] of 2"):
            list(cs.records(["model.layers.0.mlp.fc1"]))
        from llm_instrumentation.data import ActivationDataset

        with pytest.raises(CaptureSetError, match="model.layers.0.mlp.fc1 \\(dp_rank 0, pp_stage 0\\): the tp ranks "
                                                  "hold different numbers of pieces \\{0: 2, 1: 1\\}"):
            ActivationDataset(cs, modules="model.layers.0.mlp.fc1")
        pieces = list(cs.records(["model.layers.0.mlp.fc1"], whole=False))
        assert [(r.forward, r.tp_rank, r.shard["offset"]) for r in pieces] == [(0, 0, 0), (0, 1, pm.FFN // 2),
                                                                               (1, 0, 0)]


@pytest.mark.parametrize("tp_set", ["tp_rank0", "every_rank"], indirect=True)
def test_dataset_and_export_over_a_capture_set(tp_set, tmp_path, monkeypatch):
    """ActivationDataset over a manifest: a sharded module's rows are its stitched tensors'
    rows; a replicated one's come from tp rank 0 only (its every_rank copies never read);
    split into 2 ranks × 2 workers, every stored packet is decoded exactly once over all four
    shards and no row comes twice. The safetensors export takes the manifest too."""
    from llm_instrumentation import stream as stream_mod
    from llm_instrumentation.data import ActivationDataset
    from llm_instrumentation.export import export_safetensors, load_safetensors_export

    with open_capture_set(tp_set) as cs:
        want = {n: cs.tensors(n) for n in ("model.layers.0.mlp.fc1", "model.layers.0")}
        r0 = os.path.basename(cs.ranks[0].path)
    decoded = []
    orig = stream_mod.Packet.decode
    monkeypatch.setattr(stream_mod.Packet, "decode",
                        lambda self, stored=None: decoded.append((os.path.basename(self._reader.path), self.offset))
                        or orig(self, stored))
    for name, width in (("model.layers.0.mlp.fc1", pm.FFN), ("model.layers.0", pm.D)):
        decoded.clear()
        with ActivationDataset(tp_set, modules=name) as ds:
            assert ds.capture_set is not None and ds.d_model == width and ds.rows == 2 * 5
            assert len(ds.units) == 2 and all((u.pieces is not None) == name.endswith("fc1") for u in ds.units)
            chunks = [c for shard in range(4) for c in ds.iter_chunks(shard, 4)]
        assert len(decoded) == len(set(decoded)), "a packet decoded twice"
        n_pieces = 2 if name.endswith("fc1") else 1
        assert len(decoded) == 2 * n_pieces
        if not name.endswith("fc1"):
            assert {f for f, _ in decoded} == {r0}  # replicas of tp rank 1 never read
        got = sorted(chunks, key=lambda c: int(c[1]["forward"][0]))
        assert len(got) == 2
        for (x, meta), w in zip(got, want[name]):
            assert torch.equal(x, w.reshape(-1, width)) and meta["token_id"].tolist() != [-1] * 5
    out = tmp_path / "export"
    idx = export_safetensors(tp_set, out, modules="model.layers.0.mlp.fc1")
    assert idx["rows"] == 10 and idx["d_model"] == pm.FFN and len(idx["streams"]) == 2
    _, batches = load_safetensors_export(out)
    acts = torch.cat([b["activations"] for b in batches])
    assert torch.equal(acts, torch.cat([w.reshape(-1, pm.FFN) for w in want["model.layers.0.mlp.fc1"]]))


def test_capture_set_in_object_storage(tp_set, tmp_path, s3):  # noqa: F811
    """The ranks' streams uploaded to an S3 server (VersityGW): ``build`` from an ``s3://`` glob
    names them by URL, and the set reads the same whole tensors by byte range as from files;
    the dataset over that manifest too."""
    from llm_instrumentation.data import ActivationDataset

    for r in (0, 1):
        s3.upload(tmp_path / f"cap.rank{r:05d}-of-00002.strap", "sets", f"job/cap.rank{r:05d}-of-00002.strap")
    out = tmp_path / "remote.capture-set.json"
    m = capture_set.build("s3://sets/job/cap.rank*-of-*.strap", out, storage_options=s3.storage_options)
    assert [e["stream"] for e in m["ranks"]] == [f"s3://sets/job/cap.rank{r:05d}-of-00002.strap" for r in (0, 1)]
    capture_set.write(out, m)
    local = json.loads(tp_set.read_text())
    for a, b in zip(m["ranks"], local["ranks"]):
        assert {**a, "stream": None} == {**b, "stream": None}
    with open_capture_set(tp_set) as cs_file, open_capture_set(out, storage_options=s3.storage_options) as cs_s3:
        assert all(r.source.remote for r in cs_s3.ranks)
        a, b = list(cs_file.records()), list(cs_s3.records())
        assert [(r.step, r.forward, r.name) for r in a] == [(r.step, r.forward, r.name) for r in b]
        assert all(torch.equal(x.tensor, y.tensor) for x, y in zip(a, b))
    with ActivationDataset(out, modules="model.layers.0.mlp.fc1", storage_options=s3.storage_options) as ds:
        assert ds.rows == 10 and sum(len(x) for x, _ in ds.iter_chunks(0, 1)) == 10
