"""Issue 41: resume_from_checkpoint=True on a capture that finished (its stream ends with
END, status complete, and its checkpoint was deleted at the clean finish) is refused with
CaptureCompleteError and keeps every byte; it never cuts the stream back to its last token
(or, without per-token tracking, to its header). A capture stopped by an error in the
capturing code also ends complete but keeps its checkpoint, and resumes:
test_job_resume.py, test_resume.py::test_leftover_checkpoint_is_never_loaded_silently."""

from __future__ import annotations

import json
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


def _job_env(monkeypatch, start: str, other_tokens: int, tmp_path: Path) -> None:
    """Rank 0 of a job of 2 restarted for the ``start``-th time; rank 1 (only a file here)
    says it can keep ``other_tokens`` tokens (the file exchange, docs/DISTRIBUTED.md D3)."""
    monkeypatch.setenv("STRAP_CAPTURE_SET", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", start)
    other = tmp_path / "cap.rank00001-of-00002.strap.job-resume.json"
    other.write_text(json.dumps({"start": f"job/{start}", "rank": 1, "value": other_tokens}))


def test_complete_rank_of_a_job(real_strapd, tmp_path, monkeypatch, one_torch_thread):
    """One rank of a job finished while another died: the job resumes every rank from the
    point the other reached, so the finished rank is cut back too — with a warning saying how
    many bytes — and ends equal to an uninterrupted capture. When every rank finished there is
    nothing to resume: CaptureCompleteError, every byte kept."""
    out = tmp_path / "cap.strap"
    ranked = tmp_path / "cap.rank00000-of-00002.strap"
    kw = dict(preset="balanced", output_path=out, socket_path=real_strapd.socket, autostart_daemon=False,
              track_per_token=True, checkpoint_interval_tokens=INTERVAL)
    _job_env(monkeypatch, "0", 0, tmp_path)
    with capture_activations(model(), **kw) as fw:
        generate(fw, model(), n_tokens=8)
    reference = ranked.read_bytes()
    assert not os.path.exists(ckpt.default_path(str(ranked)))

    _job_env(monkeypatch, "1", 8, tmp_path)  # every rank finished
    with pytest.raises(CaptureCompleteError, match="complete capture"):
        with capture_activations(model(), resume_from_checkpoint=True, **kw) as fw:
            generate(fw, model(), n_tokens=8)
    assert ranked.read_bytes() == reference

    _job_env(monkeypatch, "2", 3, tmp_path)  # rank 1 died at token 3
    with pytest.warns(UserWarning, match=r"complete capture of 8 tokens, but another rank of the job reached only 3"
                                         r".*so \d+ bytes of it .* are cut and generated again"):
        with capture_activations(model(), resume_from_checkpoint=True, **kw) as fw:
            assert fw.resume_step == 3
            generate(fw, model(), n_tokens=8)
    ref = tmp_path / "ref.strap"
    ref.write_bytes(reference)
    assert _packets(ranked) == _packets(ref)


def _packets(path: Path) -> list:
    with open_stream(path) as r:
        return [(p.type, p.name, p.seq, p.step, p.forward, bytes(p.stored()), json.dumps(p.meta, sort_keys=True))
                for p in r.packets()]
