"""A distributed job killed and restarted resumes every rank from the point all ranks
reached (docs/DISTRIBUTED.md D3): real ``torchrun --nproc_per_node=2`` jobs on CPU, the real
strapd, one rank SIGKILLed on the first start (torchrun stops the others and starts the whole
job again); every rank's stream must then equal an uninterrupted job's packet for packet,
every rank must resume from the same token, and a rank that had more tokens gives them up.
Both ways the ranks agree are run: a gloo process group, and files beside the streams.

``make test`` runs two kill points; ``make test-long`` (STRAP_TEST_LONG) runs STRAP_JOB_KILL_RUNS
(default twelve) more."""

from __future__ import annotations

import json
import os
import random
import uuid
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from genloop import N_TOKENS
from test_resume import packets
from test_torchrun import free_port

from llm_instrumentation import _job_resume, capture_activations
from llm_instrumentation._distributed import RankInfo
from llm_instrumentation.checkpoint import CheckpointError

HERE = Path(__file__).resolve().parent
WRITES_PER_FORWARD = 12  # tensor writes per forward pass of the tiny Llama under "balanced"
_reference: Dict[str, List[Tuple]] = {}


def torchrun(sock: str, outdir: Path, exchange: str, kill: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS"):
        env.pop(k, None)
    # c10d rendezvous: each start of the job is a new round (static rendezvous would hand the
    # restarted ranks the store keys of the first start, and gloo would dial dead ranks).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1", "--max-restarts=1",
           "--monitor-interval=0.1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
           f"--rdzv-id=job-{uuid.uuid4().hex[:12]}",  # a run id naming this launch (the file exchange needs one)
           str(HERE / "torchrun_resume.py"), sock, str(outdir), exchange, kill]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(HERE))


def streams(outdir: Path) -> List[Path]:
    return [outdir / f"cap.rank{r:05d}-of-00002.strap" for r in range(2)]


def reference(sock: str, tmp: Path) -> List[List[Tuple]]:
    if not _reference:
        out = tmp / "reference"
        out.mkdir()
        p = torchrun(sock, out, "files", "none")
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        _reference["packets"] = [packets(s) for s in streams(out)]
    return _reference["packets"]


def run_and_check(sock: str, tmp: Path, exchange: str, kill: str) -> None:
    out = tmp / "job"
    out.mkdir()
    p = torchrun(sock, out, exchange, kill)
    log = p.stdout[-3000:] + p.stderr[-6000:]
    assert p.returncode == 0, log
    starts = [(int(r), int(s), int(m), src) for r, s, m, src in
              re.findall(r"rank (\d) start (\d) resumed (\d+) from (None|stream|checkpoint|job-minimum)", p.stdout)]
    restarted = sorted(x for x in starts if x[1] == 1)
    assert [x[0] for x in restarted] == [0, 1], f"{kill}: the job did not start again on both ranks\n{log}"
    points = {m for _, _, m, _ in restarted}
    assert len(points) == 1, f"{kill}: the ranks resumed from different tokens {restarted}\n{log}"
    who, what, k = kill.split(":")
    if what == "token":  # the killed rank had exactly k tokens: nobody may keep more
        assert points.pop() <= int(k), f"{kill}: resumed past the killed rank's tokens {restarted}"
    ref = reference(sock, tmp)
    for rank, s in enumerate(streams(out)):
        got = packets(s)
        assert len(got) == len(ref[rank]), (kill, rank, len(got), len(ref[rank]))
        for i, (a, b) in enumerate(zip(got, ref[rank])):
            assert a == b, f"{kill}: rank {rank} packet {i} differs: {a[:9]} vs {b[:9]}"
        assert sum(1 for q in got if q[0] == 3) == N_TOKENS
    return restarted


KILLS = [pytest.param("pg", "1:token:6", id="pg-rank1-after-token6"),
         pytest.param("files", f"0:write:{WRITES_PER_FORWARD * 5 + 7}", id="files-rank0-inside-forward6")]


@pytest.mark.parametrize("exchange,kill", KILLS)
def test_job_resumes_every_rank_from_the_common_point(real_strapd, tmp_path, exchange, kill):
    run_and_check(real_strapd.socket, tmp_path, exchange, kill)


def long_kills() -> List[Tuple[str, str]]:
    rng = random.Random(int(os.environ.get("STRAP_KILL_SEED", "25")))
    out = []
    for i in range(int(os.environ.get("STRAP_JOB_KILL_RUNS", "12"))):  # every 4 cover both exchanges x both kinds
        r = rng.randrange(2)
        if i % 2:
            out.append(("pg" if i % 4 == 1 else "files", f"{r}:token:{rng.randrange(1, N_TOKENS)}"))
        else:
            out.append(("files" if i % 4 == 0 else "pg", f"{r}:write:{rng.randrange(1, WRITES_PER_FORWARD * N_TOKENS)}"))
    return out


@pytest.mark.skipif(not os.environ.get("STRAP_TEST_LONG"), reason="STRAP_JOB_KILL_RUNS (12) more kill points: make test-long")
@pytest.mark.parametrize("exchange,kill", [pytest.param(e, k, id=f"{e}-{k.replace(':', '-')}") for e, k in long_kills()])
def test_job_resume_random_kills(real_strapd, tmp_path, exchange, kill):
    run_and_check(real_strapd.socket, tmp_path, exchange, kill)


def test_agree_takes_the_minimum_and_names_failed_ranks():
    info = RankInfo(0, 3, 0, 3, "h", "env")
    assert _job_resume.agree(lambda own: [own, 7, 3], 5, info) == 3
    with pytest.raises(CheckpointError, match=r"rank 2: CheckpointError: stream damaged"):
        _job_resume.agree(lambda own: [own, 7, "CheckpointError: stream damaged"], 5, info)
    mine = CheckpointError("my checkpoint is bad")
    with pytest.raises(CheckpointError, match="my checkpoint is bad"):
        _job_resume.agree(lambda own: [_job_resume._wire(own), 7, 3], mine, info)


def test_file_exchange_needs_the_rank_marker(tmp_path):
    info = RankInfo(1, 2, None, None, "h", "env")
    with pytest.raises(CheckpointError, match=r"does not carry rank 1's marker \.rank00001-of-00002"):
        _job_resume._files(info, str(tmp_path / "cap.strap"), "job/1", 3)


def test_file_exchange_waits_for_every_rank_then_times_out(tmp_path, monkeypatch):
    """Rank 1's count reaches rank 0 through its file; a file of another start of the job is
    not taken; a rank that never writes one ends the wait with an error naming it."""
    monkeypatch.setenv(_job_resume.WAIT_ENV, "0.3")
    s0 = str(tmp_path / "cap.rank00000-of-00002.strap")
    s1 = str(tmp_path / "cap.rank00001-of-00002.strap")
    i0, i1 = RankInfo(0, 2, 0, 2, "h", "env"), RankInfo(1, 2, 1, 2, "h", "env")
    (tmp_path / "cap.rank00001-of-00002.strap.job-resume.json").write_text(
        '{"start": "job/0", "rank": 1, "value": 2}')  # the job's earlier start: stale
    with pytest.raises(CheckpointError, match=r"rank 0 waited 0.3s for the resume point of rank 1 .*job/1"):
        _job_resume._files(i0, s0, "job/1", 9)
    assert _job_resume._files(i1, s1, "job/1", 4) == [9, 4]  # rank 0's file of this start is there
    assert _job_resume._files(i0, s0, "job/1", 9) == [9, 4]


def test_cut_back_before_the_checkpoint_rewrites_it(real_strapd, tmp_path, monkeypatch, one_torch_thread):
    """Rank 0 of a job holds 10 tokens (checkpoint at 8); the other rank reached 3. The
    resume cuts rank 0 back to 3 — before its checkpoint — and first rewrites the checkpoint
    to that point, so that a crash right after the cut resumes from it again; the capture
    then ends equal to an uninterrupted one."""
    from genloop import generate
    from test_resume import assert_same_as_reference, capture

    from llm_instrumentation import checkpoint as ckpt

    monkeypatch.setenv("STRAP_CAPTURE_SET", "0")  # rank 1 is only a file here: no manifest to wait for
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    out = tmp_path / "cap.strap"
    ranked = tmp_path / "cap.rank00000-of-00002.strap"
    other = tmp_path / "cap.rank00001-of-00002.strap.job-resume.json"

    class Crash(Exception):
        pass

    import test_resume
    with pytest.raises(Crash):
        with capture_activations(test_resume.model(), preset="balanced", output_path=out,
                                 socket_path=real_strapd.socket, autostart_daemon=False, track_per_token=True,
                                 checkpoint_interval_tokens=4) as fw:
            generate(fw, test_resume.model(), n_tokens=10)
            raise Crash
    assert ckpt.load(ckpt.default_path(str(ranked))).token_count == 8
    for start, crash in (("1", True), ("2", False)):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", start)
        other.write_text(json.dumps({"start": f"job/{start}", "rank": 1, "value": 3}))
        if crash:
            with pytest.raises(Crash):
                with capture_activations(test_resume.model(), preset="balanced", output_path=out,
                                         socket_path=real_strapd.socket, autostart_daemon=False, track_per_token=True,
                                         checkpoint_interval_tokens=4, resume_from_checkpoint=True) as fw:
                    assert (fw.resume_step, fw.resumed_from) == (3, "job-minimum")
                    c = ckpt.load(ckpt.default_path(str(ranked)))
                    assert c.token_count == 3 and c.stream_offset == os.path.getsize(ranked)
                    doc = json.loads(Path(ckpt.default_path(str(ranked))).read_text())
                    # capture_activations(model, ...): no 1.3.1 tokens list (docs/CHECKPOINTS.md 3)
                    assert doc["total_tokens"] == 3 and "tokens" not in doc
                    raise Crash  # before any new token: the rewritten checkpoint is the floor
        else:
            fw = capture(real_strapd.socket, out, resume=True)
            assert fw.resume_step == 3 and fw.resumed_from == "checkpoint"
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k)  # the reference is a single process's capture
    assert_same_as_reference(real_strapd.socket, ranked, tmp_path, fw)


def test_default_run_id_is_no_identity(tmp_path, monkeypatch):
    """torchrun's default run id ('none') is the same for every launch: files of an earlier
    launch could be taken for this one's, so no file exchange is made (a warning says why and
    how to name the launch)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    info = RankInfo(0, 2, 0, 2, "h", "env")
    with pytest.warns(UserWarning, match="default run id 'none'.*--rdzv-id or --standalone"):
        assert _job_resume.exchange_for(info, str(tmp_path / "cap.rank00000-of-00002.strap"), True) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    assert _job_resume.exchange_for(info, str(tmp_path / "cap.rank00000-of-00002.strap"), True) is not None
