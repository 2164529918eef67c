"""The vLLM capture reader on streams written through the real strapd with the layout the
plugin writes (docs/VLLM.md 3), for the cases a CPU engine run does not easily produce:
a position computed twice (preemption with recompute: the last is kept), prompt positions
served from the prefix cache (no rows: reported missing), two engine runs reusing a request
id in one directory, rows that disagree with the tokens, and finish marks. No vLLM needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

pytestmark = pytest.mark.integration

H = 4  # hidden size of the fake layer


def write_stream(path: Path, socket: str, steps: List[Dict[str, Any]], randomized: bool = True,
                 layers: Tuple[int, ...] = (0,), distributed: Optional[Dict[str, Any]] = None,
                 stores: bool = True, samples: bool = True, ids: bool = True) -> None:
    """Write a stream as the plugin does: per step ``vllm.rows`` (+ ``new`` prompts), one
    ``model.layers.L`` record of the same rows per layer of ``layers`` (value = 1000·position +
    request number + 100000·L, so a reader's row or layer mix-up shows), then ``vllm.sampled``
    and TOKENs (``samples``: only a pipeline's last stage samples). ``distributed``: the
    header's object of a worker of several; ``stores`` False: a tp rank > 0, no record;
    ``ids`` False: the rows' token ids -1 (a model called without token ids)."""
    import torch

    from llm_instrumentation import _open
    from llm_instrumentation._session import open_session
    from llm_instrumentation.config import InstrumentationConfig
    from llm_instrumentation.vllm._worker import FINISHED, INDEX_FORMAT, ROWS, SAMPLED

    cfg = InstrumentationConfig.fast_capture()
    plan = cfg.transport_plan()
    model = torch.nn.Linear(1, 1)
    names = [f"model.layers.{n}" for n in layers]
    req = _open.open_request(model, cfg, plan, names, str(path), "sha256:x", None, distributed=distributed)
    req["metadata"] = {**req["metadata"], "vllm": {
        "index_format": INDEX_FORMAT, "modules": {n: "sum" for n in names}, "request_id_randomized": randomized}}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        s = open_session(socket, False, 30.0, plan.ring_size, plan.policy, fd, None, req)
    finally:
        os.close(fd)
    try:
        for fwd, st in enumerate(steps if stores else []):
            done: Dict[str, Tuple[str, int]] = st.get("finished", {})  # request: (reason, tokens)
            if done:
                s.write_tensor(FINISHED, torch.tensor([n for _, n in done.values()], dtype=torch.int64), s.tokens,
                               fwd, {"requests": list(done), "reasons": [why for why, _ in done.values()]})
            rows: List[Tuple[str, int, int]] = st.get("rows", [])  # (request, position, token id)
            if not rows:
                continue
            reqs: List[str] = []
            counts: List[int] = []
            for rid, _, _ in rows:
                if reqs and reqs[-1] == rid:
                    counts[-1] += 1
                else:
                    reqs.append(rid)
                    counts.append(1)
            meta: Dict[str, Any] = {"requests": reqs, "counts": counts}
            if st.get("new"):
                meta["new"] = st["new"]
            s.write_tensor(ROWS, torch.tensor([[p, t if ids else -1] for _, p, t in rows], dtype=torch.int64), s.tokens,
                           fwd, meta)
            for n in layers:
                x = torch.tensor([[value(rid, p, st.get("bias", 0), n)] * H for rid, p, _ in rows])
                s.write_tensor(f"model.layers.{n}", x, s.tokens, fwd)
            sampled = st.get("sampled", []) if samples else []
            if sampled:
                s.write_tensor(SAMPLED, torch.tensor([[p, t] for _, p, t in sampled], dtype=torch.int64), s.tokens,
                               fwd, {"requests": [r for r, _, _ in sampled]})
                for _, p, t in sampled:
                    s.token(s.tokens, t, "", p)
            s.flush()
        s.close()
    finally:
        s.shutdown()


def value(rid: str, p: int, bias: float = 0, layer: int = 0) -> float:
    return 1000.0 * p + int(rid.split("-")[0]) + bias + 100000.0 * layer


def test_recompute_prefix_gap_and_order(real_strapd: Any, tmp_path: Path) -> None:
    from llm_instrumentation.vllm import list_requests, load_request

    a, b = "7-0123abcd", "8-89abcdef"
    steps = [
        # a: prompt 10,11,12 (3 tokens); b: prompt of 4, the first 2 from the prefix cache
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (b, 2, 22), (b, 3, 23)],
         "new": {a: {"prompt": [10, 11, 12], "computed": 0}, b: {"prompt": [20, 21, 22, 23], "computed": 2}},
         "sampled": [(a, 3, 13), (b, 4, 24)]},
        {"rows": [(a, 3, 13), (b, 4, 24)], "sampled": [(a, 4, 14), (b, 5, 25)]},
        # a preempted and recomputed from scratch (positions 0..4 again; bias shows which is kept)
        {"rows": [(b, 5, 25)], "sampled": [(b, 6, 26)]},
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (a, 3, 13), (a, 4, 14)], "bias": 0.5,
         "sampled": [(a, 5, 15)]},
    ]
    write_stream(tmp_path / "one.strap", real_strapd.socket, steps)
    assert list_requests(tmp_path) == ["7", "8"]

    ra = load_request(tmp_path, "7")
    assert ra.engine_request_id == a and ra.request_id == "7"
    assert ra.token_ids.tolist() == [10, 11, 12, 13, 14, 15] and ra.prompt_len == 3
    assert ra.positions.tolist() == [0, 1, 2, 3, 4]
    assert ra.recomputed == [0, 1, 2, 3] and ra.missing == []  # 4 was first computed after the preemption
    assert ra["model.layers.0"][:, 0].tolist() == [value(a, p, 0.5) for p in range(5)]
    assert ra["model.layers.0"].shape == (5, H)

    rb = load_request(tmp_path, b)  # the engine's id works too
    assert rb.request_id == "8"
    assert rb.token_ids.tolist() == [20, 21, 22, 23, 24, 25, 26]
    assert rb.positions.tolist() == [2, 3, 4, 5]
    assert rb.missing == [0, 1]  # served from the prefix cache: no forward here
    assert rb["model.layers.0"][:, 0].tolist() == [value(b, p) for p in (2, 3, 4, 5)]


def test_ambiguous_and_unknown_ids(real_strapd: Any, tmp_path: Path) -> None:
    from llm_instrumentation.vllm import list_requests, load_request

    for n, rid in enumerate(("0-00000001", "0-00000002")):
        write_stream(tmp_path / f"run{n}.strap", real_strapd.socket, [
            {"rows": [(rid, 0, 5), (rid, 1, 6)], "new": {rid: {"prompt": [5, 6], "computed": 0}},
             "sampled": [(rid, 2, 7)]}])
    assert list_requests(tmp_path) == ["0"]
    with pytest.raises(ValueError, match="0-00000001.*0-00000002"):
        load_request(tmp_path, "0")
    assert load_request(tmp_path, "0-00000002").token_ids.tolist() == [5, 6, 7]
    with pytest.raises(KeyError):
        load_request(tmp_path, "1")


def test_rows_disagreeing_with_tokens_are_an_error(real_strapd: Any, tmp_path: Path) -> None:
    from llm_instrumentation.vllm import load_request

    rid = "3-0000000f"
    write_stream(tmp_path / "bad.strap", real_strapd.socket, [
        {"rows": [(rid, 0, 5), (rid, 1, 6)], "new": {rid: {"prompt": [5, 6], "computed": 0}},
         "sampled": [(rid, 2, 7)]},
        {"rows": [(rid, 2, 8)], "sampled": [(rid, 3, 9)]}])  # computed with 8, but 7 was sampled there
    with pytest.raises(ValueError, match="position 2 was computed with token 8"):
        load_request(tmp_path, "3")


def test_tokens_from_rows_without_sampled_records(real_strapd: Any, tmp_path: Path) -> None:
    """Steps whose sampled tokens were not recorded (async scheduling): the generated
    tokens come from the next rows' input ids, and the last row counts."""
    from llm_instrumentation.vllm import load_request

    rid = "4-000000aa"
    write_stream(tmp_path / "nosampled.strap", real_strapd.socket, [
        {"rows": [(rid, 0, 5), (rid, 1, 6)], "new": {rid: {"prompt": [5, 6], "computed": 0}}},
        {"rows": [(rid, 2, 7)]}, {"rows": [(rid, 3, 8)]}])
    r = load_request(tmp_path, "4")
    assert r.token_ids.tolist() == [5, 6, 7, 8]
    assert r.positions.tolist() == [0, 1, 2, 3]
    assert r["model.layers.0"][:, 0].tolist() == [value(rid, p) for p in range(4)]


def test_finish_marks(real_strapd: Any, tmp_path: Path) -> None:
    """``vllm.finished`` records (docs/VLLM.md 3): the reason reaches ``finished``/``aborted``;
    a request with no mark (still running, or the engine killed) has ``finished`` None; a mark
    counting other tokens than the stream holds is an error."""
    from llm_instrumentation.vllm import load_request

    a, b, c = "0-0000000a", "1-0000000b", "2-0000000c"
    write_stream(tmp_path / "fin.strap", real_strapd.socket, [
        {"rows": [(a, 0, 5), (a, 1, 6), (b, 0, 7), (c, 0, 9)],
         "new": {a: {"prompt": [5, 6], "computed": 0}, b: {"prompt": [7], "computed": 0},
                 "2-0000000c": {"prompt": [9], "computed": 0}},
         "sampled": [(a, 2, 8), (b, 1, 3), (c, 1, 4)]},
        {"rows": [(a, 2, 8), (b, 1, 3)], "sampled": [(a, 3, 1), (b, 2, 2)]},
        # a aborted after 2 generated tokens, b finished by length; c's mark counts a token
        # the stream does not have
        {"finished": {a: ("aborted", 4), b: ("length_capped", 3), c: ("stopped", 3)}},
    ])
    ra = load_request(tmp_path, "0")
    assert ra.finished == "aborted" and ra.aborted
    assert ra.token_ids.tolist() == [5, 6, 8, 1] and ra.positions.tolist() == [0, 1, 2]
    rb = load_request(tmp_path, "1")
    assert rb.finished == "length_capped" and not rb.aborted
    with pytest.raises(ValueError, match="finished with 3 tokens, the stream holds 2"):
        load_request(tmp_path, "2")

    d = tmp_path / "unmarked"
    d.mkdir()
    write_stream(d / "run.strap", real_strapd.socket, [
        {"rows": [(a, 0, 5)], "new": {a: {"prompt": [5], "computed": 0}}, "sampled": [(a, 1, 6)]}])
    r = load_request(d, "0")
    assert r.finished is None and not r.aborted


def _same(x: Any, y: Any, same_streams: bool = True) -> None:
    """Two RequestCaptures hold the same tensors and facts (and were read from the same
    stream files, unless ``same_streams`` is off: copies of them)."""
    import torch

    assert sorted(x) == sorted(y)
    for n in x:
        assert torch.equal(x[n], y[n]), n
    for k in ("request_id", "engine_request_id", "prompt_len", "missing", "recomputed", "finished") + \
            (("streams",) if same_streams else ()):
        assert getattr(x, k) == getattr(y, k), k
    assert torch.equal(x.token_ids, y.token_ids) and torch.equal(x.positions, y.positions)


def test_iter_requests_reads_once_what_load_request_reads(real_strapd: Any, tmp_path: Path) -> None:
    """``iter_requests`` gives every request exactly as ``load_request`` does (a recompute, a
    prefix-cache gap, finish marks, a request never finished), yields a request that
    finishes mid-stream before the stream's later requests, and takes ``modules``."""
    from llm_instrumentation.vllm import iter_requests, list_requests, load_request

    a, b, c = "7-0123abcd", "8-89abcdef", "9-00000009"
    steps = [
        {"rows": [(b, 2, 22), (b, 3, 23), (a, 0, 10), (a, 1, 11)],
         "new": {a: {"prompt": [10, 11], "computed": 0}, b: {"prompt": [20, 21, 22, 23], "computed": 2}},
         "sampled": [(b, 4, 24), (a, 2, 12)]},
        {"rows": [(b, 4, 24), (a, 2, 12)], "sampled": [(b, 5, 25), (a, 3, 13)]},
        {"finished": {a: ("length_capped", 4)}},
        {"rows": [(b, 5, 25), (c, 0, 30)], "new": {c: {"prompt": [30], "computed": 0}},
         "sampled": [(b, 6, 26), (c, 1, 31)]},
        # b preempted and recomputed (bias shows the later computation is kept)
        {"rows": [(b, 2, 22), (b, 3, 23), (b, 4, 24), (b, 5, 25), (b, 6, 26)], "bias": 0.5,
         "sampled": [(b, 7, 27)]},
        {"finished": {c: ("aborted", 2)}},
    ]
    write_stream(tmp_path / "one.strap", real_strapd.socket, steps, layers=(0, 1))
    assert list_requests(tmp_path) == ["8", "7", "9"]
    got = list(iter_requests(tmp_path))
    # a finished first (at the third step), c next; b, never finished, at the stream's end
    assert [r.request_id for r in got] == ["7", "9", "8"]
    for r in got:
        _same(r, load_request(tmp_path, r.request_id))
    assert got[2].recomputed == [2, 3, 4, 5] and got[2].missing == [0, 1] and got[2].finished is None
    assert got[2]["model.layers.1"][:, 0].tolist() == [value(b, p, 0.5, 1) for p in range(2, 7)]
    assert got[1].aborted and got[0].finished == "length_capped"
    only = list(iter_requests(tmp_path, modules=["model.layers.1"]))
    assert [sorted(r) for r in only] == [["model.layers.1"]] * 3
    for r in only:
        _same(r, load_request(tmp_path, r.request_id, modules=["model.layers.1"]))


def test_load_request_reads_only_its_steps(real_strapd: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """With the stream's index, ``load_request`` parses the index records and then only the
    packets of the steps holding the request's rows (and the finish marks); the same stream
    cut before its index (read whole) gives the same capture."""
    import shutil

    from llm_instrumentation import stream
    from llm_instrumentation.vllm import load_request

    reqs = [f"{i}-0000000{i}" for i in range(6)]
    steps: List[Dict[str, Any]] = []
    for i, rid in enumerate(reqs):  # one request after another, 3 steps each, then its mark
        steps.append({"rows": [(rid, p, 100 + p) for p in range(4)],
                      "new": {rid: {"prompt": [100, 101, 102, 103], "computed": 0}}, "sampled": [(rid, 4, 104)]})
        steps.append({"rows": [(rid, 4, 104)], "sampled": [(rid, 5, 105)]})
        steps.append({"rows": [(rid, 5, 105)], "sampled": [(rid, 6, 106)]})
        steps.append({"finished": {rid: ("length_capped", 7)}})
    full = tmp_path / "full"
    full.mkdir()
    write_stream(full / "s.strap", real_strapd.socket, steps, layers=(0, 1, 2))

    parsed: List[int] = []
    real_parse = stream.StreamReader._parse

    def counting(self: Any, off: int, *a: Any, **kw: Any) -> Any:
        parsed.append(off)
        return real_parse(self, off, *a, **kw)

    monkeypatch.setattr(stream.StreamReader, "_parse", counting)
    with stream.open_stream(full / "s.strap") as r:
        assert r.indexed
        total = sum(1 for _ in r.packets())
    parsed.clear()
    got = load_request(full, "3")
    # the index records of all 6 requests (6 x 3 rows + 6 x 3 sampled), then request 3's 3
    # steps (rows, 3 layers, sampled) and the 6 marks (a few more: the walks to END)
    indexed = len(parsed)
    assert indexed <= 6 * 3 * 2 + 3 * 5 + 6 + 6, (indexed, total)
    assert got.positions.tolist() == [0, 1, 2, 3, 4, 5] and got.finished == "length_capped"
    assert got["model.layers.2"][:, 0].tolist() == [value(reqs[3], p, 0, 2) for p in range(6)]

    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(full / "s.strap", cut / "s.strap")
    with stream.open_stream(cut / "s.strap") as r:
        at = r.index_offset
    assert at is not None
    os.truncate(cut / "s.strap", at)
    with stream.open_stream(cut / "s.strap") as r:
        assert not r.indexed
    parsed.clear()
    _same(load_request(cut, "3"), got, same_streams=False)
    assert len(parsed) > 2 * indexed, (len(parsed), indexed)  # read whole: every packet, twice
    for rid in ("0", "5"):
        _same(load_request(cut, rid), load_request(full, rid), same_streams=False)


def _worker_rank(rank: int, tp: int, pp: int) -> Dict[str, Any]:
    """A worker's place as the plugin's ``_ranks`` gives it (vLLM orders tp fastest, then pp)."""
    return {"rank": rank, "world_size": tp * pp, "local_rank": rank, "tp_rank": rank % tp, "tp_size": tp,
            "pp_rank": rank // tp, "pp_size": pp, "dp_rank": 0, "dp_size": 1, "dp_engine": None}


def test_pipeline_and_tensor_parallel_capture_set(real_strapd: Any, tmp_path: Path) -> None:
    """tp 2 × pp 2, as the plugin writes it (docs/VLLM.md 5; vLLM's CPU build cannot run
    PP=2 here): each stage's tp rank 0 stores its layers with the step index, the last stage
    also the sampled tokens; tp ranks 1 write a stream with no record. The stream names and
    the headers' ``distributed`` objects are made by the plugin's own code. The manifest
    built from the streams lists every rank with its role, passes ``capture_set.load`` and
    ``strapd verify``, and ``load_request`` through it puts each request's layers of both
    stages together (a preemption recomputed in both stages counts once); a rank's stream
    missing fails the set's check."""
    import subprocess
    import types

    from conftest import strapd_bin

    from llm_instrumentation import capture_set
    from llm_instrumentation.vllm import list_requests, load_request
    from llm_instrumentation.vllm._worker import ROWS, SAMPLED, WorkerCapture, stream_name

    a, b = "7-0123abcd", "8-89abcdef"
    steps = [
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (b, 2, 22), (b, 3, 23)],
         "new": {a: {"prompt": [10, 11, 12], "computed": 0}, b: {"prompt": [20, 21, 22, 23], "computed": 2}},
         "sampled": [(a, 3, 13), (b, 4, 24)]},
        {"rows": [(a, 3, 13), (b, 4, 24)], "sampled": [(a, 4, 14), (b, 5, 25)]},
        {"rows": [(b, 5, 25)], "sampled": [(b, 6, 26)]},
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (a, 3, 13), (a, 4, 14)], "bias": 0.5,
         "sampled": [(a, 5, 15)]},
        {"finished": {a: ("length_capped", 6), b: ("stopped", 7)}},
    ]
    vc = types.SimpleNamespace(instance_id="1765000000123456789")
    paths = []
    for r in range(4):
        place = _worker_rank(r, 2, 2)
        w = WorkerCapture(None, None)  # type: ignore[arg-type]
        w.modules = [(f"model.layers.{place['pp_rank']}", "sum")]
        path = tmp_path / stream_name(vc, place)
        write_stream(path, real_strapd.socket, steps, layers=(place["pp_rank"],),
                     distributed=w._distributed(vc, place), stores=place["tp_rank"] == 0,
                     samples=place["pp_rank"] == 1)
        paths.append(path)
    assert [p.name for p in paths] == [f"vllm-20251206T054640-1765000000123456789.rank0000{r}-of-00004.strap"
                                       for r in range(4)]
    out = capture_set.manifest_path(str(paths[0]))
    assert out == str(tmp_path / "vllm-20251206T054640-1765000000123456789.capture-set.json")
    capture_set.write(out, capture_set.build(str(tmp_path / "*.strap"), out))

    m = capture_set.load(out)
    assert m["layout"] == {"tp_size": 2, "pp_size": 2, "dp_size": 1}
    assert m["job_id"] == "vllm-20251206T054640-1765000000123456789"
    roles = [(e["tp_rank"], e["pp_stage"], sorted(e["modules"]), e["packets"]) for e in m["ranks"]]
    assert roles[1] == (1, 0, [], 0) and roles[3] == (1, 1, [], 0), roles  # replicas: nothing stored
    # ... and the manifest says so explicitly (D4's role), as strapd reads it from the headers
    assert [e["role"] for e in m["ranks"]] == ["primary", "replica", "primary", "replica"]
    assert roles[0][:3] == (0, 0, ["model.layers.0", "vllm.finished", "vllm.rows"])
    assert roles[2][:3] == (0, 1, ["model.layers.1", "vllm.finished", "vllm.rows", "vllm.sampled"])
    assert {e["modules"]["model.layers.0"]["kind"] for e in m["ranks"][:1]} == {"replicated"}
    assert m["ranks"][2]["tokens"] == [0, 6] and m["ranks"][0]["tokens"] == [0, 0]
    v = subprocess.run([str(strapd_bin()), "verify", out], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr

    assert list_requests(out) == ["7", "8"]
    ra = load_request(out, "7")
    assert sorted(ra) == ["model.layers.0", "model.layers.1"]
    assert ra.token_ids.tolist() == [10, 11, 12, 13, 14, 15] and ra.positions.tolist() == [0, 1, 2, 3, 4]
    assert ra.recomputed == [0, 1, 2, 3] and ra.missing == [] and ra.finished == "length_capped"
    for n in (0, 1):
        assert ra[f"model.layers.{n}"][:, 0].tolist() == [value(a, p, 0.5, n) for p in range(5)]
    rb = load_request(out, b)
    assert rb.positions.tolist() == [2, 3, 4, 5] and rb.missing == [0, 1] and rb.finished == "stopped"
    assert rb["model.layers.1"][:, 0].tolist() == [value(b, p, 0, 1) for p in (2, 3, 4, 5)]
    assert {ROWS, SAMPLED} <= set(m["ranks"][2]["modules"])
    # iter_requests over the set: each stage's stream read once, the same requests
    from llm_instrumentation.vllm import iter_requests

    both = list(iter_requests(out))
    assert [r.request_id for r in both] == ["7", "8"]
    _same(both[0], ra)
    _same(both[1], rb)

    # A role that disagrees with the stream header, or a replica listing records, is refused
    # by both readers, naming the rank and the key; a manifest from before the key loads.
    import json

    good = json.loads(Path(out).read_text())
    for r, role, mods, err in ((1, "primary", None, "rank 1: key 'role'"), (0, "replica", {}, "rank 0: key 'role'"),
                               (3, "replica", {"vllm.rows": {"kind": "replicated"}}, "rank 3: key 'role': a replica"),
                               (2, "leader", None, "rank 2: key 'role' is 'leader'")):
        bad = json.loads(json.dumps(good))
        bad["ranks"][r]["role"] = role
        if mods is not None:
            bad["ranks"][r]["modules"] = mods
        bp = tmp_path / "bad.capture-set.json"
        bp.write_text(json.dumps(bad))
        with pytest.raises(capture_set.CaptureSetError, match=err):
            capture_set.load(bp)
        v = subprocess.run([str(strapd_bin()), "verify", str(bp)], capture_output=True, text=True)
        assert v.returncode == 2 and f"rank {r}: role:" in v.stdout + v.stderr, v.stdout + v.stderr
    for e in good["ranks"]:
        del e["role"]
    bp.write_text(json.dumps(good))
    assert [e.get("role") for e in capture_set.load(bp)["ranks"]] == [None] * 4
    assert subprocess.run([str(strapd_bin()), "verify", str(bp)], capture_output=True).returncode == 0
    bp.unlink()

    os.rename(paths[1], str(paths[1]) + ".moved")
    with pytest.raises(capture_set.CaptureSetError, match="rank 1: key 'stream'"):
        load_request(out, "7")


def test_stream_names() -> None:
    """One worker: the name as before (its pid); several: ``<engine stem>.rank<R>-of-<W>.strap``,
    the stem from vLLM's instance id (shared by the engine's workers), ``-dp<R>`` for a
    data-parallel engine whose workers are a world of their own."""
    import types

    from llm_instrumentation.vllm._worker import engine_stem, stream_name

    vc = types.SimpleNamespace(instance_id="1765000000123456789")
    one = dict(_worker_rank(0, 1, 1))
    assert stream_name(vc, one).endswith(f"-{os.getpid()}-rank0.strap")
    assert stream_name(vc, _worker_rank(1, 2, 1)) == "vllm-20251206T054640-1765000000123456789.rank00001-of-00002.strap"
    dp = dict(_worker_rank(0, 2, 1), dp_engine=3)
    assert engine_stem(vc, dp) == "vllm-20251206T054640-1765000000123456789-dp3"
    odd = types.SimpleNamespace(instance_id="a/b c")
    assert engine_stem(odd, _worker_rank(0, 2, 1)).endswith("-abc")


def test_dataset_and_exports_by_request(real_strapd: Any, tmp_path: Path) -> None:
    """``ActivationDataset`` over a vLLM capture directory (and over a capture set of
    workers) reads by request: a unit per request and module, rows in position order, a
    recomputed position once (the last computation), every row labelled with its request,
    position and token; equal to ``load_request``'s tensors. ``export_safetensors`` holds the
    same rows with the requests' ids; ``export_saelens`` cuts each request's consecutive
    positions into sequences, never across a prefix-cache gap or two requests."""
    import torch

    from llm_instrumentation.data import ActivationDataset
    from llm_instrumentation.export import export_saelens, export_safetensors, load_safetensors_export
    from llm_instrumentation.vllm import list_requests, load_request

    a, b = "7-0123abcd", "8-89abcdef"
    steps = [
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (b, 2, 22), (b, 3, 23)],
         "new": {a: {"prompt": [10, 11, 12], "computed": 0}, b: {"prompt": [20, 21, 22, 23], "computed": 2}},
         "sampled": [(a, 3, 13), (b, 4, 24)]},
        {"rows": [(a, 3, 13), (b, 4, 24)], "sampled": [(a, 4, 14), (b, 5, 25)]},
        {"rows": [(b, 5, 25)], "sampled": [(b, 6, 26)]},
        {"rows": [(a, 0, 10), (a, 1, 11), (a, 2, 12), (a, 3, 13), (a, 4, 14)], "bias": 0.5,
         "sampled": [(a, 5, 15)]},
    ]
    cap = tmp_path / "caps"
    cap.mkdir()
    write_stream(cap / "one.strap", real_strapd.socket, steps, layers=(0, 1))
    with ActivationDataset(cap) as ds:
        assert ds.modules == ["model.layers.0", "model.layers.1"]
        assert [r.request_id for r in ds.vllm_requests] == list_requests(cap) == ["7", "8"]
        assert ds.rows == 2 * (5 + 4) and ds.d_model == H
        chunks = list(ds.iter_chunks(0, 1))
        assert len(chunks) == 4  # (module, request) units
        for (x, m), u in zip(chunks, ds.shard_units(0, 1)):
            req = ds.vllm_requests[u.request]
            want = load_request(cap, req.request_id)
            name = ds.modules[u.module]
            assert torch.equal(x, want[name])
            assert m["position"].tolist() == want.positions.tolist() == m["token_index"].tolist()
            assert m["token_id"].tolist() == want.token_ids[want.positions].tolist()
            assert set(m["batch"].tolist()) == {u.request}
        # the recomputed positions 0-3 of request 7 come from the last step that computed them
        x, m = chunks[0]
        assert m["forward"].tolist() == [3, 3, 3, 3, 3] and x[:, 0].tolist() == [value(a, p, 0.5) for p in range(5)]
        rows = list(ActivationDataset(cap, modules="model.layers.1"))
        assert [(r["batch"], r["position"], r["token_id"]) for r in rows] == \
            [(0, p, t) for p, t in enumerate([10, 11, 12, 13, 14])] + [(1, p, 20 + p) for p in range(2, 6)]
        # two shards split the requests, each row once
        every = sorted((int(bi), int(p)) for _, mm in chunks for bi, p in zip(mm["batch"], mm["position"]))
        got = sorted((int(bi), int(p)) for s in range(2) for _, mm in ds.iter_chunks(s, 2)
                     for bi, p in zip(mm["batch"], mm["position"]))
        assert got == every
    # DataLoader workers (forked: the handles of construction), and a copy sent to another
    # process (pickled: no handle, the streams reopened), yield the same rows
    import pickle

    ds2 = ActivationDataset(cap, modules="model.layers.*", batch_size=3)
    want = sorted((int(bi), int(p), float(x[0])) for x, mm in chunks for bi, p, x in zip(mm["batch"], mm["position"], x))
    for src in (torch.utils.data.DataLoader(ds2, batch_size=None, num_workers=2), pickle.loads(pickle.dumps(ds2))):
        got = sorted((int(bi), int(p), float(x[0])) for b in src
                     for bi, p, x in zip(b["batch"], b["position"], b["activation"]))
        assert got == want and len(got) == 18
    ds2.close()

    # Two requests whose rows share both steps: one shard decodes each step tensor once (the
    # iteration's cache), not once per request.
    import llm_instrumentation.data as data_mod

    shared = tmp_path / "shared"
    shared.mkdir()
    write_stream(shared / "s.strap", real_strapd.socket, [
        {"rows": [(a, 0, 10), (a, 1, 11), (b, 0, 20)], "new": {a: {"prompt": [10, 11], "computed": 0},
                                                              b: {"prompt": [20], "computed": 0}},
         "sampled": [(a, 2, 12), (b, 1, 21)]},
        {"rows": [(a, 2, 12), (b, 1, 21)], "sampled": [(a, 3, 13), (b, 2, 22)]}])
    decoded: List[Any] = []
    real = data_mod._decoded
    data_mod._decoded = lambda t, stored=None: decoded.append(t.forward) or real(t, stored)
    try:
        with ActivationDataset(shared) as ds:
            got2 = [(int(m["batch"][0]), m["position"].tolist()) for _, m in ds.iter_chunks(0, 1)]
    finally:
        data_mod._decoded = real
    assert got2 == [(0, [0, 1, 2]), (1, [0, 1])] and sorted(decoded) == [0, 1], decoded

    idx = export_safetensors(cap, tmp_path / "st", modules="model.layers.0")
    assert idx["requests"] == ["7", "8"] and idx["engine_request_ids"] == [a, b] and idx["rows"] == 9
    _, shards = load_safetensors_export(tmp_path / "st")
    sh = list(shards)
    acts = torch.cat([s["activations"] for s in sh])
    assert acts[:, 0].tolist() == [value(a, p, 0.5) for p in range(5)] + [value(b, p) for p in range(2, 6)]
    assert torch.cat([s["position"] for s in sh]).tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert torch.cat([s["batch"] for s in sh]).tolist() == [0] * 5 + [1] * 4

    from llm_instrumentation.export import main as export_main

    assert export_main(["safetensors", str(cap), "--out", str(tmp_path / "cli"), "--modules", "model.layers.1",
                        "--no-progress"]) == 0  # a directory on the command line
    assert load_safetensors_export(tmp_path / "cli")[0]["requests"] == ["7", "8"]

    pytest.importorskip("datasets")
    res = export_saelens(cap, tmp_path / "sae", "model.layers.0", context_size=2)
    # request 7: positions 0-4 -> 2 sequences, 1 row left; request 8: 2-5 -> 2 sequences
    assert res["sequences"] == 4 and res["dropped_rows"] == 1 and res["requests"] == ["7", "8"]
    import datasets

    hf = datasets.load_from_disk(str(tmp_path / "sae"))
    assert [[int(t) for t in row] for row in hf["token_ids"]] == [[10, 11], [12, 13], [22, 23], [24, 25]]
    assert [float(row[0][0]) for row in hf["model.layers.0"]] == \
        [value(a, 0, 0.5), value(a, 2, 0.5), value(b, 2), value(b, 4)]


def test_dataset_over_a_capture_set_and_mixed_sources(real_strapd: Any, tmp_path: Path) -> None:
    """The capture set of tp 2 workers (tp rank 1's stream holds no record) reads as the
    directory does; a vLLM stream beside a stream of another capture is refused."""
    import types

    import torch

    from llm_instrumentation import capture_set
    from llm_instrumentation.data import ActivationDataset
    from llm_instrumentation.vllm import load_request
    from llm_instrumentation.vllm._worker import WorkerCapture, stream_name

    a = "0-0000000a"
    steps = [{"rows": [(a, 0, 5), (a, 1, 6)], "new": {a: {"prompt": [5, 6], "computed": 0}}, "sampled": [(a, 2, 7)]},
             {"rows": [(a, 2, 7)], "sampled": [(a, 3, 8)]}]
    vc = types.SimpleNamespace(instance_id="1765000000123456789")
    for r in range(2):
        place = _worker_rank(r, 2, 1)
        w = WorkerCapture(None, None)  # type: ignore[arg-type]
        w.modules = [("model.layers.0", "sum")]
        write_stream(tmp_path / stream_name(vc, place), real_strapd.socket, steps,
                     distributed=w._distributed(vc, place), stores=r == 0)
    out = capture_set.manifest_path(str(tmp_path / stream_name(vc, _worker_rank(0, 2, 1))))
    capture_set.write(out, capture_set.build(str(tmp_path / "*.strap"), out))
    with ActivationDataset(out) as ds:
        assert ds.capture_set is not None and [r.request_id for r in ds.vllm_requests] == ["0"]
        (x, m), = list(ds.iter_chunks(0, 1))
        assert torch.equal(x, load_request(out, "0")["model.layers.0"]) and m["position"].tolist() == [0, 1, 2]

    other = tmp_path / "other"
    other.mkdir()
    import shutil

    shutil.copy(tmp_path / stream_name(vc, _worker_rank(0, 2, 1)), other / "v.strap")
    from llm_instrumentation import _open
    from llm_instrumentation._session import open_session
    from llm_instrumentation.config import InstrumentationConfig

    cfg = InstrumentationConfig.fast_capture()
    plan = cfg.transport_plan()
    req = _open.open_request(torch.nn.Linear(1, 1), cfg, plan, ["m"], str(other / "plain.strap"), "sha256:y", None)
    fd = os.open(other / "plain.strap", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        s = open_session(real_strapd.socket, False, 30.0, plan.ring_size, plan.policy, fd, None, req)
    finally:
        os.close(fd)
    try:
        s.write_tensor("m", torch.zeros(2, H), 0, 0)
        s.close()
    finally:
        s.shutdown()
    with pytest.raises(ValueError, match="are not vLLM captures"):
        ActivationDataset(other)


def test_module_selection_on_a_pipeline_stage() -> None:
    """On a pipeline stage, layers of other stages are vLLM ``PPMissingLayer``s: a pattern
    selects this stage's layers; one whose every match lives on another stage (``model.norm``
    on the first) selects nothing here instead of refusing the engine; one that matches no
    module at all is still refused."""
    import torch

    from llm_instrumentation.vllm import _names

    def cls(name: str) -> type:
        return type(name, (torch.nn.Module,), {})

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([cls("LlamaDecoderLayer")(), cls("PPMissingLayer")()])
    model.model.norm = cls("PPMissingLayer")()
    assert _names.select(model, ["model.layers.*", "model.norm"]) == [("model.layers.0", _names.SUM)]
    with pytest.raises(ValueError, match="'model.nrom' matches no capturable module"):
        _names.select(model, ["model.layers.*", "model.nrom"])


def test_rows_without_token_ids(real_strapd: Any, tmp_path: Path) -> None:
    """A stream whose rows carry token id -1 (its model was given no token ids: vLLM passes
    them to every pipeline stage of a text model, not to a model fed embeddings) beside one
    with the ids: the known ids are kept, -1 never counts as a disagreement."""
    from llm_instrumentation.data import ActivationDataset
    from llm_instrumentation.vllm import load_request

    rid = "5-000000bb"
    steps = [{"rows": [(rid, 0, 5), (rid, 1, 6)], "new": {rid: {"prompt": [5, 6], "computed": 0}},
              "sampled": [(rid, 2, 7)]}, {"rows": [(rid, 2, 7)], "sampled": [(rid, 3, 8)]}]
    write_stream(tmp_path / "stage0.strap", real_strapd.socket, steps, layers=(0,), samples=False)
    write_stream(tmp_path / "stage1.strap", real_strapd.socket, steps, layers=(1,), ids=False)
    r = load_request(tmp_path, "5")
    assert r.token_ids.tolist() == [5, 6, 7, 8] and r.positions.tolist() == [0, 1, 2] and r.recomputed == []
    assert sorted(r) == ["model.layers.0", "model.layers.1"]
    with ActivationDataset(tmp_path, modules="model.layers.1") as ds:
        (_, m), = list(ds.iter_chunks(0, 1))
        assert m["token_id"].tolist() == [5, 6, 7]
    alone = tmp_path / "alone"  # no stream with the ids: the prompt and sampled tokens still say them
    alone.mkdir()
    write_stream(alone / "x.strap", real_strapd.socket, steps, ids=False)
    assert load_request(alone, "5").token_ids.tolist() == [5, 6, 7, 8]
