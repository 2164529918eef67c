"""A real ``torchrun --nproc_per_node=2`` job on CPU (gloo) capturing through the real strapd
with the same ``capture_activations(output_path=".../cap.strap")`` call on both ranks
(docs/DISTRIBUTED.md): two streams, one per rank, each complete, each with its rank's
metadata and exactly its rank's tensors; no ``cap.strap`` written, nothing overwritten."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from conftest import strapd_bin

from llm_instrumentation import open_stream

HERE = Path(__file__).resolve().parent
MODULE = "transformer.h.1.mlp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(sock: str, outdir: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS"):
        env.pop(k, None)
    env.update(env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "torchrun_capture.py"),
           sock, str(outdir)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(HERE))


def check_rank_stream(path: Path, rank: int, expect: Path) -> int:
    """The stream is complete, names ``rank`` in its metadata, holds exactly the tensors that
    rank's hook saw, and verifies; returns the writing process's pid."""
    with open_stream(path) as r:
        meta = r.metadata["client_metadata"]
        d = meta["distributed"]
        assert (d["rank"], d["world_size"], d["local_rank"], d["local_world_size"], d["source"]) == \
            (rank, 2, rank, 2, "torch.distributed"), d
        assert d["host"] == socket.gethostname()
        assert meta["output_path"] == str(path)
        end = r.end()
        assert end is not None and end.meta["status"] == "complete"
        got = r.tensors(MODULE)
        want = torch.load(expect)
        assert len(got) == len(want) == 3 + rank
        for g, w in zip(got, want):
            assert torch.equal(torch.from_numpy(g.numpy()).reshape(w.shape), w), f"rank {rank}: {MODULE} differs"
        pid = r.metadata["peer"]["pid"]
    v = subprocess.run([str(strapd_bin()), "verify", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return pid


def test_torchrun_two_ranks_two_streams(real_strapd, tmp_path):
    p = torchrun(real_strapd.socket, tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".strap"))
    assert names == ["cap.rank00000-of-00002.strap", "cap.rank00001-of-00002.strap"], names
    pids = {check_rank_stream(tmp_path / name, rank, tmp_path / f"expect.{rank}.pt") for rank, name in enumerate(names)}
    assert len(pids) == 2, "both streams from one process"


def test_torchrun_one_path_opted_out_second_rank_refused(real_strapd, tmp_path):
    """STRAP_RANK_STREAMS=0 keeps the one path on both ranks: the issue's job. One rank's
    capture is refused at once, naming the file and the other rank's pid; the other rank's
    stream is whole."""
    p = torchrun(real_strapd.socket, tmp_path, STRAP_RANK_STREAMS="0")
    assert p.returncode != 0
    refused = [line for line in p.stdout.splitlines() if " refused: " in line]
    assert len(refused) == 1, p.stdout + p.stderr[-3000:]
    loser = int(refused[0].split()[1])
    winner = 1 - loser
    assert str(tmp_path / "cap.strap") in refused[0] and "live capture of process" in refused[0], refused[0]
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".strap")) == ["cap.strap"]
    pid = check_rank_stream(tmp_path / "cap.strap", winner, tmp_path / f"expect.{winner}.pt")
    assert f"process {pid}" in refused[0]


def test_rank_dying_mid_capture_does_not_hold_rank0(real_strapd, tmp_path):
    """Rank 1 dies inside its capture (no launcher to end the job: two processes started by
    hand, env:// rendezvous). Rank 0 waits ``WAIT_FOR_RANKS`` (here 3 s) for its facts — not
    the process group's 30-minute store timeout —, names the rank it did not hear from, writes
    no manifest, and ends with its own stream whole."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE="2", STRAP_TEST_RANK1_DIES="3")
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRAP_RANK_STREAMS"):
        env.pop(k, None)
    cmd = [sys.executable, str(HERE / "torchrun_capture.py"), real_strapd.socket, str(tmp_path)]
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(HERE))
             for r in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert procs[1].returncode == 9, outs[1][1][-3000:]
    assert procs[0].returncode == 0, outs[0][0][-3000:] + outs[0][1][-5000:]
    assert "ranks [1] of 2 sent no capture-set value" in outs[0][1], outs[0][1][-3000:]
    assert not (tmp_path / "cap.capture-set.json").exists()
    check_rank_stream(tmp_path / "cap.rank00000-of-00002.strap", 0, tmp_path / "expect.0.pt")
