"""analyze_activations / analyze_activations_with_tokens return 1.3.1's keys with 1.3.1's
types (real strapd captures), next to our exact per-step figures."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from llm_instrumentation import (
    InstrumentationConfig,
    InstrumentationFramework,
    analyze_activations,
    analyze_activations_with_tokens,
    capture_activations,
    open_stream,
)
from llm_instrumentation.stream import TENSOR


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _generate(m, fw, n):
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        for _ in range(n):
            nxt = m(input_ids=ids).logits[:, -1, :].argmax(dim=-1, keepdim=True)
            fw.token_tracker.record_token(nxt[0].item(), f"<{nxt[0].item()}>")
            ids = torch.cat([ids, nxt], dim=-1)


def test_131_keys_and_types(real_strapd, tmp_path, llama):
    out = tmp_path / "gen.stream"
    with capture_activations(llama, preset="max_compression", output_path=out, socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        _generate(llama, fw, 4)
    for a in (analyze_activations(str(out)), fw.analyze_activations(str(out))):
        assert a["stream_path"] == str(out) and isinstance(a["stream_path"], str)
        assert a["compression"] == "quant"  # what strapd wrote, from the header
        assert isinstance(a["packets"], int) and a["packets"] == 4 * len(fw.hooked_modules)
        assert isinstance(a["total_compressed_bytes"], int)
        with open_stream(out) as r:
            on_disk = sum(p.stored_len for p in r.packets() if p.type == TENSOR)
        assert a["total_compressed_bytes"] == on_disk == a["total_stored_bytes"]
        assert set(a["per_layer"]) == set(fw.hooked_modules)
        for name, d in a["per_layer"].items():
            assert isinstance(d["count"], int) and d["count"] == 4
            assert isinstance(d["bytes"], int) and d["bytes"] == d["stored_bytes"]
        assert sum(d["bytes"] for d in a["per_layer"].values()) == a["total_compressed_bytes"]
        assert a["legacy"] is False

    w = analyze_activations_with_tokens(str(out), fw)
    tm = w["token_metadata"]
    assert tm["total_tokens"] == 4 and [t["token_text"] for t in tm["tokens"]] == [t["token_text"] for t in fw.tokens]
    assert set(tm["tokens"][0]) >= {"token_index", "token_id", "token_text"}
    assert isinstance(w["packets_per_token"], float) and w["packets_per_token"] == w["packets"] / 4
    assert isinstance(w["bytes_per_token"], float) and w["bytes_per_token"] == w["total_compressed_bytes"] / 4
    # ours, exact per step: step k = the forward pass that chose token k
    assert w["packets_per_step"] == {k: len(fw.hooked_modules) for k in range(4)}
    assert sum(b["stored"] for b in w["bytes_per_step"].values()) == w["total_compressed_bytes"]


def test_no_tokens_no_per_token_floats(real_strapd, tmp_path, llama):
    out = tmp_path / "plain.stream"
    fw = InstrumentationFramework(llama, InstrumentationConfig.fast_capture(),
                                  socket_path=real_strapd.socket, autostart_daemon=False)
    with torch.no_grad(), fw.capture_activations(str(out)) as tracker:
        assert tracker is None
        llama(input_ids=torch.tensor([[4, 5]]))
    a = analyze_activations_with_tokens(str(out), fw)
    assert a["compression"] == "none"
    assert a["token_metadata"]["total_tokens"] == 0 and a["token_metadata"]["source"] == "none"
    assert "packets_per_token" not in a and "bytes_per_token" not in a  # as 1.3.1: no tokens, no ratio
    assert a["packets_per_step"] == {0: len(fw.hooked_modules)}
