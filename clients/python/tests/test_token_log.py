"""The token log beside a checkpoint (docs/CHECKPOINTS.md 2-3) follows its checkpoint: moved
aside with it when a new capture keeps an interrupted one, removed with it when a capture
overwrites it or finishes cleanly. (Written and read by real captures that upload:
test_upload_free.py.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from llm_instrumentation import capture_activations
from llm_instrumentation import checkpoint as ckpt
from test_resume import model


class Crash(Exception):
    pass


def _interrupted(sock: str, out: Path) -> Path:
    """An interrupted capture (its checkpoint kept) with a token log beside the checkpoint."""
    with pytest.raises(Crash):
        with capture_activations(model(), preset="balanced", output_path=out, socket_path=sock,
                                 autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=2) as fw:
            for k in range(4):
                fw.token_tracker.record_token(k, f"t{k}")
            raise Crash
    ck = Path(ckpt.default_path(out))
    log = Path(ckpt.token_log_path(ck))
    log.write_text("".join(ckpt.encode_token({"token_index": i, "token_id": i, "token_text": f"t{i}", "position": i})
                           + "\n" for i in range(4)))
    return log


def _run(sock: str, out: Path, **kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with capture_activations(model(), preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                                 track_per_token=True, checkpoint_interval_tokens=2, **kw) as fw:
            fw.token_tracker.record_token(1, "a")


def test_moved_aside_with_its_checkpoint(real_strapd, tmp_path):
    out = tmp_path / "run.strap"
    log = _interrupted(real_strapd.socket, out)
    data = log.read_bytes()
    _run(real_strapd.socket, out)  # a new capture: the interrupted one is kept as run.interrupted-1.strap
    aside = ckpt.default_path(tmp_path / "run.interrupted-1.strap")
    assert Path(ckpt.token_log_path(aside)).read_bytes() == data and Path(aside).exists()
    assert not log.exists()


def test_removed_on_overwrite_and_clean_finish(real_strapd, tmp_path):
    out = tmp_path / "run.strap"
    log = _interrupted(real_strapd.socket, out)
    _run(real_strapd.socket, out, overwrite_checkpoint=True)
    assert not log.exists() and not Path(ckpt.default_path(out)).exists()
    log = _interrupted(real_strapd.socket, out)
    _run(real_strapd.socket, out, resume_from_checkpoint=True)  # resumed and finished cleanly
    assert not log.exists() and not Path(ckpt.default_path(out)).exists()
