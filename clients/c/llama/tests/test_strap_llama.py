"""llama.cpp capture through its eval callback, end to end: the real strap-llama (linked against
llama.cpp's libllama) writing through the real strapd; read back with Go (strapd verify /
inspect) and Python (open_stream) and compared with what the callback itself read from ggml
(--dump-dir: ggml_backend_tensor_get of every captured node)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROMPT, REPO, run_llama, strap_llama_cmd, strapd_cli

from llm_instrumentation import _streamlock, open_stream

READBACK = REPO / "clients/c/tests/readback.py"
COMPARE = REPO / "clients/c/tests/compare_streams.py"
N_LAYER = 4  # tiny_model


def tensors_of(path: Path):
    with open_stream(str(path)) as r:
        return [(t.name, t.step, t.forward, t.dtype, tuple(t.shape), t.meta, t.numpy().copy()) for t in r]


def complete(path: Path) -> bool:
    """The stream ends with END, status complete (its session closed cleanly)."""
    try:
        with open_stream(path) as r:
            end = r.end()
    except Exception:  # a stream cut short inside a packet
        return False
    return end is not None and end.meta.get("status") == "complete"


def wait_session_ended(path: Path) -> None:
    """Wait until strapd has ended a killed client's session: it then closes the stream's
    descriptor, and with it the stream lock (docs/CHECKPOINTS.md 5). No file: nothing to wait for."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _streamlock.lock_stream(fd, 30, str(path))
    finally:
        os.close(fd)


def tokens_of(path: Path):
    with open_stream(str(path)) as r:
        return [(p.step, p.meta["token_id"]) for p in r.packets() if p.type_name == "TOKEN"]


def test_capture_reads_back_bit_exact_in_go_and_python(strapd, tiny_model, tmp_path):
    out, dump = tmp_path / "cap.strap", tmp_path / "dump"
    n = 6
    res = run_llama(tiny_model, "--output", str(out), "--tensors", "l_out,attn_out,ffn_out,attn_norm-2,result_norm,embd",
                    "--dump-dir", str(dump), socket_path=strapd.socket, n=n)
    n_prompt = len(res["prompt_tokens"])
    assert len(res["tokens"]) == n and res["records"] == n * (3 * N_LAYER + 3)

    # Python: every tensor and token bit for bit as the callback read it from ggml
    rb = subprocess.run([sys.executable, str(READBACK), str(out), str(dump)], capture_output=True, text=True)
    assert rb.returncode == 0, rb.stdout + rb.stderr
    # Go: the stream verifies and inspect lists the module names of the Python vocabulary
    v = strapd_cli("verify", str(out))
    assert v.returncode == 0 and v.stdout.startswith("OK"), v.stdout + v.stderr
    ins = strapd_cli("inspect", str(out))
    assert ins.returncode == 0, ins.stderr
    for name in ("model.layers.0 ", "model.layers.3.self_attn", "model.layers.3.mlp",
                 "model.layers.2.input_layernorm", "model.norm", "model.embed_tokens"):
        assert name in ins.stdout, (name, ins.stdout)
    assert f"tokens: {n}" in ins.stdout

    # rows: the prompt's pass has every prompt position, each decode pass its one position
    ts = tensors_of(out)
    assert len(ts) == res["records"]
    for name, step, fwd, dtype, shape, meta, arr in ts:
        assert step == fwd and dtype == "float32" and shape[-1] == 64
        rows = n_prompt if fwd == 0 else 1
        assert shape == (rows, 64), (name, shape)
        assert meta["seq"] == 0
        assert meta["pos"] == {"from": 0 if fwd == 0 else n_prompt + fwd - 1, "n": rows}
        assert arr.any() and (abs(arr) < 1e4).all()
    ops = {m["ggml_name"]: m["ggml_op"] for _, _, _, _, _, m, _ in ts}
    assert ops["l_out-0"] == "ADD" and ops["attn_out-0"] == "MUL_MAT" and ops["ffn_out-0"] == "MUL_MAT"
    assert ops["attn_norm-2"] == "MUL" and ops["result_norm"] == "MUL" and ops["embd"] == "GET_ROWS"
    # tokens: one TOKEN per decoded token, step = its index, the ids strap-llama printed
    assert tokens_of(out) == list(enumerate(res["tokens"]))
    # the residual stream is what it should be: l_out-N = ffn_out-N + ffn_inp-N, where
    # ffn_inp-N = attn_out-N + l_out-(N-1); checked at float32 rounding
    by = {(m["ggml_name"], fwd): a for _, _, fwd, _, _, m, a in ts}
    for f in range(n):
        for layer in range(1, N_LAYER):
            want = by[(f"ffn_out-{layer}", f)] + (by[(f"attn_out-{layer}", f)] + by[(f"l_out-{layer - 1}", f)])
            got = by[(f"l_out-{layer}", f)]
            assert abs(got - want).max() <= 1e-5 * max(1.0, abs(want).max()), (layer, f)


def test_tokens_identical_with_and_without_capture(strapd, tiny_model, tmp_path):
    for threads in ("1", "2"):
        plain = run_llama(tiny_model, "--no-capture", "-t", threads, n=24)
        cap = run_llama(tiny_model, "--output", str(tmp_path / f"c{threads}.strap"), "--tensors",
                        "l_out,attn_out,ffn_out", "-t", threads, socket_path=strapd.socket, n=24)
        assert cap["tokens"] == plain["tokens"], threads
        assert len(set(plain["tokens"])) > 5, "the model should not repeat one token"
        assert tokens_of(tmp_path / f"c{threads}.strap") == list(enumerate(plain["tokens"]))


def test_identical_bytes_run_to_run_and_across_threads(strapd, tiny_model, tmp_path):
    a, b = tmp_path / "a.strap", tmp_path / "b.strap"
    run_llama(tiny_model, "--output", str(a), "-t", "1", socket_path=strapd.socket)
    run_llama(tiny_model, "--output", str(b), "-t", "2", socket_path=strapd.socket)
    ta, tb = tensors_of(a), tensors_of(b)
    assert len(ta) == len(tb) == 8 * N_LAYER
    for x, y in zip(ta, tb):
        assert x[:6] == y[:6] and x[6].tobytes() == y[6].tobytes(), x[0]


def test_repeated_node_names_take_the_first(strapd, tiny_model, tmp_path):
    """Qcur-0 names three nodes (the projection, its reshape, RoPE): the first is taken, the
    others counted as skipped."""
    out = tmp_path / "q.strap"
    res = run_llama(tiny_model, "--output", str(out), "--tensors", "Qcur-0", "--raw-names",
                    socket_path=strapd.socket, n=4)
    ts = tensors_of(out)
    assert [t[0] for t in ts] == ["Qcur-0"] * 4
    assert all(t[5]["ggml_op"] == "MUL_MAT" for t in ts)
    assert res["duplicates_skipped"] == 2 * 4


def test_pruned_last_layer_is_labelled(strapd, tiny_model, tmp_path):
    """With logits on the last prompt row only, llama.cpp computes the last layer's rows after
    attention for that row only: the record has one row, labelled with its position."""
    out = tmp_path / "p.strap"
    res = run_llama(tiny_model, "--output", str(out), "--tensors", "l_out,attn_out", "--last-logits-only",
                    socket_path=strapd.socket, n=3)
    n_prompt = len(res["prompt_tokens"])
    first = {t[0]: t for t in tensors_of(out) if t[2] == 0}
    assert first[f"model.layers.{N_LAYER - 1}"][4] == (1, 64)
    assert first[f"model.layers.{N_LAYER - 1}"][5]["pos"] == {"from": n_prompt - 1, "n": 1}
    # attn_out of the last layer comes before the pruning: every row
    assert first[f"model.layers.{N_LAYER - 1}.self_attn"][4] == (n_prompt, 64)
    assert first["model.layers.0"][5]["pos"] == {"from": 0, "n": n_prompt}
    # and the kept row equals the same row of an unpruned capture (same numbers, bit for bit:
    # the last layer's rows are computed independently)
    full = tmp_path / "f.strap"
    run_llama(tiny_model, "--output", str(full), "--tensors", "l_out,attn_out", socket_path=strapd.socket, n=3)
    full0 = {t[0]: t for t in tensors_of(full) if t[2] == 0}
    a = first[f"model.layers.{N_LAYER - 1}"][6][0]
    b = full0[f"model.layers.{N_LAYER - 1}"][6][-1]
    assert abs(a - b).max() <= 1e-5 * abs(b).max()


def test_rows_continue_across_ubatches(strapd, tiny_model, tmp_path):
    out = tmp_path / "u.strap"
    res = run_llama(tiny_model, "--output", str(out), "--tensors", "l_out-1", "--ubatch", "4",
                    socket_path=strapd.socket, n=2)
    n_prompt = len(res["prompt_tokens"])
    assert n_prompt > 8
    first = [t for t in tensors_of(out) if t[2] == 0]
    want, p = [], 0
    while p < n_prompt:
        want.append({"from": p, "n": min(4, n_prompt - p)})
        p += 4
    assert [t[5]["pos"] for t in first] == want
    assert [t[4][0] for t in first] == [w["n"] for w in want]
    assert res["ubatches"] == len(want) + 1


def test_chained_callback_still_observes(strapd, tiny_model, tmp_path):
    """A callback already in the context parameters is kept: it is asked about every node and
    called for the nodes it wants, including one strap also takes."""
    for name in ("ffn_norm-1", "l_out-1"):
        out = tmp_path / f"{name}.strap"
        res = run_llama(tiny_model, "--output", str(out), "--tensors", "l_out", "--also-observe", name,
                        socket_path=strapd.socket, n=5)
        assert res["observed"] == 5, name
        assert len(tensors_of(out)) == 5 * N_LAYER


def test_bad_names_and_configs_are_refused(strapd, tiny_model, tmp_path):
    r = run_llama(tiny_model, "--output", str(tmp_path / "x.strap"), "--tensors", f"l_out-{N_LAYER}",
                  socket_path=strapd.socket, check=False)
    assert r["rc"] != 0 and "past the model's 4" in r["stderr"]
    r = run_llama(tiny_model, "--output", str(tmp_path / "y.strap"), "--tensors", "l_out,l_out-2",
                  socket_path=strapd.socket, check=False)
    assert r["rc"] != 0 and "given twice" in r["stderr"]


def _kill_when(cmd, cond, timeout=120.0):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not cond():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_sigkill_after_a_checkpoint_then_resume_equals_uninterrupted(strapd, kill_model, tmp_path):
    full, cut = tmp_path / "full.strap", tmp_path / "cut.strap"
    args = ("--tensors", "l_out,attn_out", "--checkpoint-interval-tokens", "4")
    ref = run_llama(kill_model, "--output", str(full), *args, socket_path=strapd.socket, n=20)
    ckpt = Path(str(cut) + ".ckpt.json")
    _kill_when(strap_llama_cmd(kill_model, "--output", str(cut), *args, socket_path=strapd.socket, n=20),
               lambda: ckpt.exists())
    # without --resume the checkpoint is not silently dropped
    r = run_llama(kill_model, "--output", str(cut), *args, socket_path=strapd.socket, n=20, check=False)
    assert r["rc"] != 0 and "checkpoint" in r["stderr"]
    res = run_llama(kill_model, "--output", str(cut), *args, "--resume", socket_path=strapd.socket, n=20)
    assert res["resumed_from"] > 0 and res["tokens"] == ref["tokens"]
    eq = subprocess.run([sys.executable, str(COMPARE), str(full), str(cut)], capture_output=True, text=True)
    assert eq.returncode == 0, eq.stdout + eq.stderr
    assert not list(tmp_path.glob("*.llama-state.*")) and not ckpt.exists()


def test_resume_without_llama_state_is_an_error(strapd, kill_model, tmp_path):
    cut = tmp_path / "cut.strap"
    args = ("--tensors", "l_out", "--checkpoint-interval-tokens", "3")
    ckpt = Path(str(cut) + ".ckpt.json")
    _kill_when(strap_llama_cmd(kill_model, "--output", str(cut), *args, socket_path=strapd.socket, n=20),
               lambda: ckpt.exists())
    for f in tmp_path.glob("cut.strap.llama-state.*"):
        f.unlink()
    r = run_llama(kill_model, "--output", str(cut), *args, "--resume", socket_path=strapd.socket, n=20, check=False)
    assert r["rc"] != 0 and "llama.cpp's state" in r["stderr"], r["stderr"]


def test_resume_between_checkpoints_goes_on_from_a_saved_state(strapd, kill_model, tmp_path):
    """Killed with tokens intact past its checkpoint and no llama.cpp state at their count (the
    stream's intact prefix ends between two checkpoints): the resume goes on from the newest
    state at or before it, and the stream equals the uninterrupted one (CI, stop 45: libstrap
    kept 8 tokens past a checkpoint of 5 and strap-llama looked for a state of 8)."""
    n, every = 24, 6
    args = ("--tensors", "l_out", "--checkpoint-interval-tokens", str(every))
    full = tmp_path / "full.strap"
    ref = run_llama(kill_model, "--output", str(full), *args, socket_path=strapd.socket, n=n)
    per_token = (ref["decode_s"] + ref["prompt_s"]) / n
    ckpt_of = lambda out: Path(str(out) + ".ckpt.json")  # noqa: E731
    for attempt in range(12):
        out = tmp_path / f"cut{attempt}.strap"
        # from the first checkpoint, 1.5 to 4.5 tokens on
        p = subprocess.Popen(strap_llama_cmd(kill_model, "--output", str(out), *args, socket_path=strapd.socket, n=n),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not ckpt_of(out).exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(per_token * (1.5 + 3 * (attempt % 4) / 4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if p.returncode != -signal.SIGKILL:
            continue
        wait_session_ended(out)
        got = len(tokens_of(out))
        states = sorted(int(f.name.rsplit(".", 1)[1]) for f in tmp_path.glob(out.name + ".llama-state.*")
                        if f.name.rsplit(".", 1)[1].isdigit())
        if got % every == 0 or got in states or not states or got == n:
            continue  # not the case under test: kill again
        res = run_llama(kill_model, "--output", str(out), *args, "--resume", socket_path=strapd.socket, n=n)
        assert res["resumed_from"] == max(s for s in states if s <= got), (got, states, res["resumed_from"])
        assert res["tokens"] == ref["tokens"]
        eq = subprocess.run([sys.executable, str(COMPARE), str(full), str(out)], capture_output=True, text=True)
        assert eq.returncode == 0, eq.stdout + eq.stderr
        return
    pytest.fail("no kill in 12 landed between two checkpoints with tokens past the first")


@pytest.mark.long
def test_random_sigkill_then_resume_equals_uninterrupted(strapd, kill_model, tmp_path):
    """strap-llama SIGKILLed at random moments of its decode, until STRAP_KILL_LLAMA_RUNS kills
    landed mid-generation (tokens before and after checkpoints), each resumed (and sometimes
    killed again) to the end: every stream equals the uninterrupted one packet for packet."""
    import random

    runs = int(os.environ.get("STRAP_KILL_LLAMA_RUNS", "10"))
    seed = int(os.environ.get("STRAP_KILL_SEED", str(random.randrange(1 << 30))))
    print(f"STRAP_KILL_SEED={seed}")
    rng = random.Random(seed)
    n = 48
    args = ("--tensors", "l_out,attn_out,ffn_out", "--checkpoint-interval-tokens", "5")
    full = tmp_path / "full.strap"
    t0 = time.monotonic()
    ref = run_llama(kill_model, "--output", str(full), *args, socket_path=strapd.socket, n=n)
    total = time.monotonic() - t0
    decode = ref["decode_s"] + ref["prompt_s"]
    startup = max(0.0, total - decode)
    killed_at = []  # tokens in the stream at each kill that landed mid-generation
    i = 0
    while len(killed_at) < runs:
        assert i < 4 * runs, f"only {len(killed_at)} of {4 * runs} kills landed mid-generation (seed {seed})"
        out = tmp_path / f"k{i}.strap"
        i += 1
        resume = False
        while True:
            cmd = strap_llama_cmd(kill_model, "--output", str(out), *args, *(("--resume",) if resume else ()),
                                  socket_path=strapd.socket, n=n)
            if resume and rng.random() < 0.7:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                assert p.returncode == 0, p.stderr
                res = json.loads(p.stdout)
                break
            size0 = out.stat().st_size if out.exists() else 0
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Start the random delay when the session has begun writing (the stream appeared or
            # grew), not after a start-up time guessed from the reference run: loading the model
            # and opening the session vary by more than a 48-token decode lasts.
            began = time.monotonic() + 10 * (startup + decode) + 5
            while p.poll() is None and time.monotonic() < began:
                if out.exists() and out.stat().st_size > size0:
                    break
                time.sleep(0.002)
            time.sleep(rng.random() * decode)
            p.send_signal(signal.SIGKILL)
            p.wait()
            if p.returncode != -signal.SIGKILL:  # it had finished: nothing was killed
                res = json.loads(p.stdout.read())
                break
            # strapd may still be ending the killed client's session (a resume's cut to its
            # append_at, the last records): read the stream once it has let go of the stream
            # lock, as a resume does.
            wait_session_ended(out)
            got = len(tokens_of(out)) if out.exists() and out.stat().st_size else 0
            if 0 < got < n:
                killed_at.append(got)
            if got == n and complete(out):
                # Killed after its session closed (END complete): the capture is finished,
                # and a resume of it is refused, never a cut (issue 41). Its stream must
                # already be the uninterrupted one.
                res = {"tokens": ref["tokens"]}
                break
            resume = True
        assert res["tokens"] == ref["tokens"], (seed, i)
        eq = subprocess.run([sys.executable, str(COMPARE), str(full), str(out)], capture_output=True, text=True)
        assert eq.returncode == 0, (seed, i, eq.stdout + eq.stderr)
    print(f"tokens in the stream at each mid-generation kill: {killed_at}")


def test_report_on_a_llama_capture(strapd, tiny_model, tmp_path):
    """The report reads a llama.cpp capture and its kernel trace (figures from the trace; the
    per-layer and per-token figures need resource events, which strap-llama does not send)."""
    pytest.importorskip("matplotlib")
    from llm_instrumentation.report import build_report

    out = tmp_path / "r.strap"
    run_llama(tiny_model, "--output", str(out), "--tensors", "l_out", "--trace", socket_path=strapd.socket, n=40)
    trace = Path(str(out) + ".trace.jsonl")
    assert trace.exists() and trace.stat().st_size > 0
    r = build_report(str(out), progress=False)
    assert r["figures"], r["notes"]
    page = Path(r["html"]).read_text()
    assert page.count("data:image/png;base64,") == len(r["figures"])
    assert "40" in page  # the token count in the summary
    # every figure decodes in headless Chromium (as clients/python/tests/test_report.py checks)
    import re
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        if os.environ.get("CI"):
            pytest.fail("chromium not installed (make chromium)")
        pytest.skip("chromium not installed (make chromium)")
    probe = Path(r["out_dir"]) / "probe.html"
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load',()=>{const im=[...document."
                                  "images];const ok=im.filter(i=>i.complete&&i.naturalWidth>0).length;"
                                  "document.title='IMAGES '+ok+'/'+im.length;});</script></body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"<title>IMAGES (\d+)/(\d+)</title>", dom.stdout)
    assert m, dom.stdout[:500] + dom.stderr[-2000:]
    assert int(m.group(1)) == int(m.group(2)) == len(r["figures"])


def test_strided_view_is_gathered_in_c_order(strapd, tiny_model, tmp_path):
    """A non-contiguous node (the attention's permuted view of Q) is copied row by row from its
    strides: it equals the transpose of the contiguous node it views, bit for bit."""
    out = tmp_path / "v.strap"
    run_llama(tiny_model, "--output", str(out), "--tensors", "Qcur-0 (view),Qcur-0 (view) (permuted)", "--raw-names",
              socket_path=strapd.socket, n=3)
    ts = tensors_of(out)
    assert [t[0] for t in ts] == ["Qcur-0 (view)", "Qcur-0 (view) (permuted)"] * 3
    for f in range(3):
        (_, _, _, _, s1, m1, a), (_, _, _, _, s2, m2, b) = ts[2 * f], ts[2 * f + 1]
        assert m1["ggml_op"] == "VIEW" and m2["ggml_op"] == "PERMUTE"
        assert s1[1:] == (4, 16) and s2 == (4, s1[0], 16), (s1, s2)  # [rows, heads, dim] → [heads, rows, dim]
        assert m1["pos"] == m2["pos"]
        assert b.tobytes() == a.transpose(1, 0, 2).copy().tobytes()


def test_ubatches_without_outputs_write_empty_pruned_records(strapd, tiny_model, tmp_path):
    """A prompt in ubatches of 4 with logits on its last row only: the ubatches before the last
    compute the pruned last layer for no row at all; each still gets its record, with 0 rows."""
    out = tmp_path / "z.strap"
    res = run_llama(tiny_model, "--output", str(out), "--tensors", f"l_out-{N_LAYER - 1},l_out-0", "--raw-names",
                    "--ubatch", "4", "--last-logits-only", socket_path=strapd.socket, n=2)
    n_prompt = len(res["prompt_tokens"])
    last = [t for t in tensors_of(out) if t[0] == f"l_out-{N_LAYER - 1}" and t[2] == 0]
    n_ub = (n_prompt + 3) // 4
    assert [t[4] for t in last] == [(0, 64)] * (n_ub - 1) + [(1, 64)]
    assert [t[5]["pos"] for t in last] == [[]] * (n_ub - 1) + [{"from": n_prompt - 1, "n": 1}]
    assert len([t for t in tensors_of(out) if t[0] == "l_out-0" and t[2] == 0]) == n_ub


def test_api_refusals_and_attach(strapd, tiny_model, tmp_path):
    """tests/test_api.c: bad names, a batch over n_batch_max, several KV streams refused by attach,
    a callback already set kept, a decode not announced reported, one record per layer."""
    from conftest import STRAP_LLAMA

    exe = STRAP_LLAMA.parent / "test_strap_llama_api"
    p = subprocess.run([str(exe), str(tiny_model), strapd.socket, str(tmp_path / "api.strap")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    v = strapd_cli("verify", str(tmp_path / "api.strap"))
    assert v.returncode == 0, v.stdout + v.stderr
