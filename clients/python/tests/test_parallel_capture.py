"""Real ``torchrun`` jobs (gloo on CPU, 2 and 4 ranks) capturing a hand-written decoder split
data-, pipeline- and tensor-parallel (parallel_models.py; child: torchrun_parallel.py),
through the real strapd (docs/DISTRIBUTED.md D1, D2, D4, D5):

- each rank records its place in the layout; rank 0 writes the capture-set manifest, which
  lists what each rank's stream holds and passes ``capture_set.load``'s checks; the manifest
  rebuilt from the streams alone equals it except ``created``;
- the tensors read back through ``open_capture_set`` — sharded ones stitched from their
  pieces — equal, bit for bit, a single-process capture of the same model and inputs;
- replicated outputs are stored by tensor-parallel rank 0 only;
- the capture adds no ``torch.distributed`` call on the model's path (counted).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import strapd_bin
from test_torchrun import free_port

import parallel_models as pm
from llm_instrumentation import capture_activations, open_capture_set, open_stream
from llm_instrumentation import capture_set

HERE = Path(__file__).resolve().parent

#: names of torch.distributed's collectives and point-to-point calls
COLLECTIVE = re.compile(r"all_|barrier|broadcast|gather|scatter|reduce|send|recv")

#: mode → (ranks, tp_size, pp_size, dp_size)
MODES = {"dp": (2, 1, 1, 2), "pp": (2, 1, 2, 1), "tp": (2, 2, 1, 1), "tpdp": (4, 2, 1, 2), "pptp": (4, 2, 2, 1)}


def torchrun(mode: str, sock: str, outdir: "Path | str") -> None:
    n = MODES[mode][0]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS", "STRAP_CAPTURE_SET"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--nnodes=1", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "torchrun_parallel.py"),
           mode, sock, str(outdir)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(HERE))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]


def reference(sock: str, outdir: Path, tp: int, dp_size: int) -> dict:
    """Single-process captures of the whole model (the same split arithmetic, tp_rank None),
    one per data-parallel replica's inputs: ``{dp_rank: {(step, forward, name): tensor}}``.
    One thread, as each rank runs: a matmul's float sums depend on the thread count."""
    model = pm.Decoder(tp=tp, rank=None).eval()
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _reference(model, sock, outdir, dp_size, out)
    finally:
        torch.set_num_threads(threads)
    return out


def _reference(model, sock, outdir, dp_size, out) -> None:
    for dp in range(dp_size):
        path = outdir / f"ref.dp{dp}.strap"
        with torch.no_grad(), capture_activations(model, output_path=path, preset="fast_capture",
                                                  modules=pm.MODULES, socket_path=sock, autostart_daemon=False,
                                                  track_per_token=True) as fw:
            for x in pm.inputs(dp):
                for tok in x[0].tolist():
                    fw.record_token(tok, str(tok))
                model(x)
        with open_stream(path) as r:
            assert "distributed" not in r.metadata["client_metadata"]
            out[dp] = {(t.step, t.forward, t.name): t.tensor() for t in r}


def is_sharded(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in pm.SHARDED + pm.DETECTED)


def check_job(mode: str, sock: str, outdir: Path) -> None:
    world, tp, pp, dp = MODES[mode]
    calls = [json.loads((outdir / f"calls.{r}.json").read_text()) for r in range(world)]
    for r, c in enumerate(calls):
        # the model's own collectives only: as many inside the capture as without it
        assert c["captured"] == c["plain"] and c["captured_names"] == c["plain_names"], (r, c)
        if tp > 1 or pp > 1:
            assert c["plain"] > 0, "the model itself communicates: the count must see it"
        # nor at its start and end: the ranks' facts go through the process group's store
        # (a collective there could pair with another rank's model collective, and a gloo one
        # right before exit can abort the process, as CI saw)
        assert c["session_names"], "the capture asks torch.distributed for its place: the count must see it"
        assert not [n for n in c["session_names"] if COLLECTIVE.search(n)], (r, c["session_names"])
    mpath = outdir / "cap.capture-set.json"
    assert calls[0]["capture_set_path"] == str(mpath) and all(c["capture_set_path"] is None for c in calls[1:])
    m = capture_set.load(mpath)
    assert (m["format"], m["version"], m["world_size"]) == ("strap-capture-set", 1, world)
    assert m["layout"] == {"tp_size": tp, "pp_size": pp, "dp_size": dp}
    assert m["job_id"] == str(m["ranks"][0]["session"])  # torchrun without --rdzv-id: no run id
    places = set()
    for r, e in enumerate(m["ranks"]):
        assert e["stream"] == f"cap.rank{r:05d}-of-{world:05d}.strap" and calls[r]["output_path"] == str(outdir / e["stream"])
        assert (e["status"], e["tokens"], e["forwards"]) == ("complete", [0, 10], 2)
        places.add((e["tp_rank"], e["pp_stage"], e["dp_rank"]))
        with open_stream(outdir / e["stream"]) as s:
            d = s.metadata["client_metadata"]["distributed"]
            assert (d["tp_size"], d["pp_size"], d["dp_size"]) == (tp, pp, dp)
            assert (d["tp_rank"], d["pp_stage"], d["dp_rank"]) == (e["tp_rank"], e["pp_stage"], e["dp_rank"])
            assert d["layout_source"] == {"dp": "default", "pp": "argument", "pptp": "argument"}.get(mode, "device_mesh")
            names = s.names()
            # the manifest lists exactly what the stream holds, with each name's kind
            assert sorted(e["modules"]) == sorted(names)
            for n in names:
                kind = e["modules"][n]["kind"]
                assert kind == ("local" if tp == 1 else "sharded" if is_sharded(n) else "replicated"), (r, n, kind)
            if tp > 1 and e["tp_rank"] > 0:
                assert names and all(is_sharded(n) for n in names), f"rank {r} stored replicated outputs: {names}"
            if tp > 1 and e["tp_rank"] == 0:
                assert any(not is_sharded(n) for n in names)
            for t in s:
                assert ("shard" in t.meta) == (tp > 1 and is_sharded(t.name))
        v = subprocess.run([str(strapd_bin()), "verify", str(outdir / e["stream"])], capture_output=True, text=True)
        assert v.returncode == 0, v.stdout + v.stderr
    assert len(places) == world
    # strapd's own reading of the manifest agrees with the client's (kinds, counts, streams)
    v = subprocess.run([str(strapd_bin()), "verify", str(mpath)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    # rebuilt from the streams alone: the same manifest but for its creation time
    rebuilt = capture_set.build(str(outdir / "cap.rank*-of-*.strap"), outdir / "again.capture-set.json")
    assert {**rebuilt, "created": None} == {**json.loads(mpath.read_text()), "created": None}
    # whole tensors, bit for bit the single-process capture's
    ref = reference(sock, outdir, tp, dp)
    got = {d: {} for d in range(dp)}
    with open_capture_set(mpath) as cs:
        order = []
        for rec in cs.records():
            assert rec.tp_rank is None and rec.shard is None
            key = (rec.step, rec.forward, rec.name)
            assert key not in got[rec.dp_rank], f"{key} twice"
            got[rec.dp_rank][key] = rec.tensor
            order.append((rec.step, rec.forward, rec.dp_rank, rec.pp_stage, rec.name))
        assert order == sorted(order)
        assert cs.tokens(0) and [t["token_index"] for t in cs.tokens(0)] == list(range(10))
        if tp > 1:
            pieces = [rec for rec in cs.records(whole=False) if rec.shard is not None]
            assert pieces and {rec.tp_rank for rec in pieces} == set(range(tp))
    # the dataset over the manifest: the same rows, each tensor once
    from llm_instrumentation.data import ActivationDataset

    for name in ("model.layers.0.mlp.fc1", "model.layers.1"):
        rows = {}
        with ActivationDataset(mpath, modules=name) as ds:
            for x, meta in ds.iter_chunks(0, 1):
                e = m["ranks"][int(meta["stream"][0])]
                key = (e["dp_rank"], int(meta["step"][0]), int(meta["forward"][0]))
                assert key not in rows
                rows[key] = x
        want = {(d, st, fw): t for d in range(dp) for (st, fw, n), t in ref[d].items() if n == name}
        assert sorted(rows) == sorted(want), name
        for key, t in want.items():
            assert torch.equal(rows[key], t.reshape(-1, t.shape[-1])), (name, key)
    for d in range(dp):
        assert sorted(got[d]) == sorted(ref[d]), f"dp {d}: names differ"
        for key, want in ref[d].items():
            g = got[d][key]
            assert g.dtype == want.dtype and g.shape == want.shape and torch.equal(g, want), f"dp {d} {key} differs"


@pytest.mark.parametrize("mode", ["dp", "pp", "tp"])
def test_two_ranks(mode, real_strapd, tmp_path):
    torchrun(mode, real_strapd.socket, tmp_path)
    check_job(mode, real_strapd.socket, tmp_path)


def test_four_ranks_tensor_and_data_parallel(real_strapd, tmp_path):
    torchrun("tpdp", real_strapd.socket, tmp_path)
    check_job("tpdp", real_strapd.socket, tmp_path)


def test_four_ranks_tensor_and_pipeline_parallel(real_strapd, tmp_path):
    torchrun("pptp", real_strapd.socket, tmp_path)
    check_job("pptp", real_strapd.socket, tmp_path)


def test_transformers_tp_plan(real_strapd, tmp_path):
    """transformers' own tensor parallelism (``tp_plan="auto"``, gloo on CPU, 2 ranks): the
    plan says which outputs are pieces (``colwise``: q_proj, up_proj) and which are whole
    (``rowwise`` down_proj and the blocks around them, stored by tp rank 0 only). Stitched,
    the pieces equal a single process's outputs of the same weights to float rounding (the
    ranks' matmuls are split and their partial sums all-reduced: not the same arithmetic as
    one process's, so not bit for bit)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    whole = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
                                         max_position_embeddings=64)).eval()
    whole.save_pretrained(tmp_path / "model")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS", "STRAP_CAPTURE_SET"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "torchrun_hf_tp.py"),
           str(tmp_path / "model"), real_strapd.socket, str(tmp_path)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(HERE))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    m = capture_set.load(tmp_path / "cap.capture-set.json")
    assert m["layout"] == {"tp_size": 2, "pp_size": 1, "dp_size": 1}
    sharded = {n for n, v in m["ranks"][0]["modules"].items() if v["kind"] == "sharded"}
    assert sharded == {f"model.layers.{i}.{s}" for i in range(2) for s in ("self_attn.q_proj", "mlp.up_proj")}
    assert set(m["ranks"][1]["modules"]) == sharded  # tp rank 1 stores no whole output
    assert "model.layers.0.mlp.down_proj" in m["ranks"][0]["modules"]
    with open_stream(tmp_path / m["ranks"][1]["stream"]) as r:
        kinds = r.metadata["client_metadata"]["distributed"]["modules"]
        assert kinds["model.layers.0.self_attn.q_proj"] == {"kind": "sharded", "axis": -1, "source": "tp_plan"}
        assert kinds["model.layers.0.mlp.down_proj"]["kind"] == "replicated"
    from llm_instrumentation.framework import split_output

    seen = {}

    def keep(name, out):
        for rec_name, t in split_output(name, out):
            seen.setdefault(rec_name, []).append(t)

    hooks = [whole.get_submodule(n).register_forward_hook(lambda mod, i, o, n=n: keep(n, o))
             for n, _ in whole.named_modules() if n in m["ranks"][0]["modules"]]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(2):
            whole(torch.randint(0, 100, (1, 6), generator=g))
    for h in hooks:
        h.remove()
    got = {}
    with open_capture_set(tmp_path / "cap.capture-set.json") as cs:
        for rec in cs.records():
            got.setdefault(rec.name, []).append(rec.tensor)
    assert set(got) == set(seen)
    for n, ts in seen.items():
        assert len(got[n]) == len(ts)
        for g_, w in zip(got[n], ts):
            assert g_.shape == w.shape and torch.allclose(g_, w, rtol=1e-4, atol=1e-5), n


def test_two_hosts_two_strapd(strapd_factory, tmp_path):
    """Two "hosts": a strapd each (own socket) and an output directory each; a tensor-parallel
    job whose rank 0 runs on the first and rank 1 on the second. Each daemon served its own
    rank; rank 0's manifest names rank 1's stream by its absolute path in the other
    directory; the set reads back whole, bit for bit the single-process capture's, and
    `strapd verify` of the manifest passes."""
    hosts = [strapd_factory(), strapd_factory()]
    dirs = [tmp_path / "host0", tmp_path / "host1"]
    for d in dirs:
        d.mkdir()
    torchrun("tp", ",".join(h.socket for h in hosts), ",".join(str(d) for d in dirs))
    streams = [dirs[r] / f"cap.rank{r:05d}-of-00002.strap" for r in range(2)]
    assert [s.exists() for s in streams] == [True, True] and not (dirs[0] / streams[1].name).exists()
    for r, h in enumerate(hosts):  # each daemon opened exactly its own rank's stream
        log = Path(h.log).read_text(errors="replace")
        assert str(streams[r]) in log and str(streams[1 - r]) not in log, (r, log[-2000:])
    mpath = dirs[0] / "cap.capture-set.json"
    m = capture_set.load(mpath)
    assert [e["stream"] for e in m["ranks"]] == [streams[0].name, str(streams[1])]
    v = subprocess.run([str(strapd_bin()), "verify", str(mpath)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    ref = reference(hosts[0].socket, tmp_path, 2, 1)
    with open_capture_set(mpath) as cs:
        got = {(rec.step, rec.forward, rec.name): rec.tensor for rec in cs.records()}
    assert sorted(got) == sorted(ref[0])
    for key, want in ref[0].items():
        assert torch.equal(got[key], want), key
