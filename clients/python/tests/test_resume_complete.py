"""Issue 41: resume_from_checkpoint=True on a capture that finished (its stream ends with
END, status complete) is refused with CaptureCompleteError and keeps every byte; it never
cuts the stream back to its last token (or, without per-token tracking, to its header)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from genloop import INTERVAL, generate

from llm_instrumentation import CaptureCompleteError, CheckpointError, capture_activations, open_stream
from llm_instrumentation import checkpoint as ckpt

_model = None


def model():
    global _model
    if _model is None:
        _model = tiny_llama()
    return _model


def _complete(sock: str, out: Path, per_token: bool) -> bytes:
    kw = dict(track_per_token=True, checkpoint_interval_tokens=INTERVAL) if per_token else {}
    with capture_activations(model(), preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                             **kw) as fw:
        if per_token:
            generate(fw, model(), n_tokens=6)
        else:
            with torch.no_grad():
                for n in range(3):
                    model()(input_ids=torch.tensor([[1, 5, 9, 33 + n]]), use_cache=False)
    with open_stream(out) as r:
        end = r.end()
        assert end is not None and end.meta["status"] == "complete"
    assert not os.path.exists(ckpt.default_path(out))
    return out.read_bytes()


@pytest.mark.parametrize("per_token", [False, True], ids=["no-per-token-tracking", "per-token-tracking"])
def test_resume_of_a_complete_capture_keeps_every_byte(real_strapd, tmp_path, per_token):
    out = tmp_path / "done.strap"
    before = _complete(real_strapd.socket, out, per_token)
    # A resume needs per-token tracking; the capture it resumes may not have had it (issue 41's
    # 313 MB stream had no TOKEN packet, so its resume point was the end of the file header).
    with pytest.raises(CaptureCompleteError) as ei:
        with capture_activations(model(), preset="balanced", output_path=out, socket_path=real_strapd.socket,
                                 autostart_daemon=False, resume_from_checkpoint=True, track_per_token=True,
                                 checkpoint_interval_tokens=INTERVAL) as fw:
            generate(fw, model(), n_tokens=6)
    assert out.read_bytes() == before, "a refused resume changed the complete stream"
    e = ei.value
    assert isinstance(e, CheckpointError) and e.path == str(out) and 0 < e.cut_bytes < len(before)
    msg = str(e)
    assert "complete capture" in msg and f"would cut {e.cut_bytes} bytes" in msg and "Nothing was changed" in msg
    assert "new output_path" in msg
    # Nothing in the message suggests a call that would lose the capture.
    assert "overwrite" not in msg and "resume_from_checkpoint=True" not in msg


def test_resume_of_a_complete_capture_with_a_stale_checkpoint(real_strapd, tmp_path):
    """A checkpoint left beside a finished stream (written before the END, not deleted) does
    not make the resume cut the stream back to it either."""
    out = tmp_path / "done.strap"
    with capture_activations(model(), preset="balanced", output_path=out, socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=INTERVAL,
                             checkpoint_path=str(tmp_path / "keep.ckpt.json")) as fw:
        generate(fw, model(), n_tokens=6)
        ck = (tmp_path / "keep.ckpt.json").read_bytes()
    Path(ckpt.default_path(out)).write_bytes(ck)
    before = out.read_bytes()
    with pytest.raises(CaptureCompleteError):
        with capture_activations(model(), preset="balanced", output_path=out, socket_path=real_strapd.socket,
                                 autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=INTERVAL,
                                 resume_from_checkpoint=True) as fw:
            generate(fw, model(), n_tokens=6)
    assert out.read_bytes() == before
