"""The transform codec (docs/COMPRESSION.md 5.2) through the real strapd on the trained
all-MiniLM-L6-v2: every row read back is within the per-row bound of independent hooks'
tensors, each packet's per-row error report equals the one recomputed here, and
analyze_activations / strapd inspect / strapd verify agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_integration_lossy_trace import capture_with_ref, minilm, run

from llm_instrumentation import InstrumentationConfig, analyze_activations, open_stream

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("lossy,bound", [(None, (1 - 0.995**2) ** 0.5), ("transform:0.02", 0.02)])
def test_transform_trained_minilm(real_strapd, tmp_path, lossy, bound) -> None:
    model, enc = minilm()
    cfg = InstrumentationConfig().with_compression("transform", lossy=lossy)
    out = tmp_path / "t.strap"
    fw, ref = capture_with_ref(model, [enc], out, real_strapd.socket, cfg)
    worst = {"rel": 0.0, "cos": 1.0, "rows": 0}
    with open_stream(out) as r:
        for name in fw.hooked_modules:
            got = r.tensors(name)
            assert len(got) == len(ref[name]), name
            for g, want_t in zip(got, ref[name]):
                d = want_t.shape[-1]
                x = want_t.double().reshape(-1, d).numpy()
                y = g.tensor().double().reshape(-1, d).numpy()
                ss = (x * x).sum(1)
                rel = np.sqrt(((x - y) ** 2).sum(1) / np.where(ss > 0, ss, 1))
                cos = np.where(ss > 0, (x * y).sum(1) / np.sqrt(ss * np.maximum((y * y).sum(1), 1e-300)), 1.0)
                assert rel.max() <= bound, (name, rel.max())
                reps = [p.meta["lossy"] for p in g.packets]
                assert all(rp["mode"] == "transform" and rp["bound"] == pytest.approx(bound) for rp in reps)
                if len(reps) == 1 and reps[0]["lossless_blocks"] == 0:
                    rows = reps[0]["rows"]
                    assert rows["n"] == x.shape[0]
                    assert rows["rel_l2_max"] == pytest.approx(rel.max(), rel=1e-9)
                    assert rows["cos_min"] == pytest.approx(cos.min(), rel=1e-9)
                worst["rel"] = max(worst["rel"], float(rel.max()))
                worst["cos"] = min(worst["cos"], float(cos.min()))
                worst["rows"] += x.shape[0]
    assert worst["cos"] >= np.sqrt(1 - bound**2) - 1e-12, worst

    a = analyze_activations(out)
    assert a["end_status"] == "complete" and a["metadata"]["codec"] == "transform"
    lo = a["lossy"]
    assert lo["mode"] == "transform" and lo["exceeded"] == 0
    assert lo["rows"]["rel_l2_max"] == pytest.approx(worst["rel"], rel=1e-9)
    ins = json.loads(run("inspect", "--json", str(out)))
    assert ins["lossy"]["rows"]["rel_l2_max"] == pytest.approx(worst["rel"], rel=1e-9)
    assert "per-row error" in run("inspect", str(out))
    assert "end status complete" in run("verify", str(out))
    # Smaller than fp32 by far more than lossless shuffle's 1.2×.
    assert a["compression_ratio"] > 4, a["compression_ratio"]


def test_transform_needs_to_be_named() -> None:
    assert InstrumentationConfig().compression_algorithm != "transform"
    with pytest.raises(ValueError):
        InstrumentationConfig(compression_algorithm="shuffle", lossy="transform")


def test_transform_resume_equals_uninterrupted(real_strapd, tmp_path, one_torch_thread) -> None:
    """A capture with ``transform`` SIGKILLed inside a forward pass and resumed equals the
    uninterrupted one packet for packet, stored bytes included: the codec's output is a
    function of the block alone (COMPRESSION.md 5.2)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from conftest import tiny_llama
    from genloop import INTERVAL, generate
    from test_resume import packets, wait_session_ended
    from transform_resume_child import CONFIG

    from llm_instrumentation import capture_activations

    def capture(out: Path, resume: bool) -> None:
        m = tiny_llama()
        with capture_activations(m, config=CONFIG, output_path=out, socket_path=real_strapd.socket,
                                 autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=INTERVAL,
                                 resume_from_checkpoint=resume) as fw:
            generate(fw, m)

    ref = tmp_path / "ref.strap"
    capture(ref, False)
    want = packets(ref)
    assert any(p[7] == 20 for p in want), "no packet stored with codec 20"
    out = tmp_path / "run.strap"
    child = Path(__file__).with_name("transform_resume_child.py")
    p = subprocess.run([sys.executable, str(child), real_strapd.socket, str(out), str(12 * INTERVAL + 7)],
                       capture_output=True, text=True, timeout=300, cwd=str(child.parent))
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    wait_session_ended(out)
    capture(out, True)
    got = packets(out)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, f"packet {i} differs: {a[:9]} vs {b[:9]}"
