"""Captures under a distributed launcher (docs/DISTRIBUTED.md): which rank this process is,
and the per-rank stream name that keeps the ranks of one job from sharing a file.

Every rank of a ``torchrun`` job runs the same ``capture_activations(..., output_path=P)``
call. Written as given, all of them would capture into one file; so when the process is one
rank of several, ``P`` becomes ``{stem}.rank{RANK:05d}-of-{WORLD_SIZE:05d}{ext}`` (the tokens
file, checkpoint, trace and resource log follow the stream's name as always). The name is a
function of the rank alone, so a restarted job finds each rank's stream again to resume it.
``STRAP_RANK_STREAMS=0`` keeps ``P`` exactly as given (each rank must then be given its own
path: the stream lock refuses a second live capture of one file).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional

#: The environment variable that turns per-rank stream names off (``0``, ``false``, ``no``, ``off``).
OPT_OUT_ENV = "STRAP_RANK_STREAMS"

_RANKED = re.compile(r"\.rank(\d{5,})-of-(\d{5,})$")


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a distributed job.

    Attributes:
        rank: global rank, 0 ≤ rank < world_size.
        world_size: processes in the job (> 1).
        local_rank: rank on this host (``LOCAL_RANK``), None when the launcher does not say.
        local_world_size: processes on this host (``LOCAL_WORLD_SIZE``), None when not said.
        host: this host's name.
        source: where rank and world size came from: ``"torch.distributed"`` (an initialised
            process group) or ``"env"`` (``RANK`` and ``WORLD_SIZE``).
    """

    rank: int
    world_size: int
    local_rank: Optional[int]
    local_world_size: Optional[int]
    host: str
    source: str

    def metadata(self) -> Dict[str, Any]:
        """The session metadata's ``distributed`` object (the stream header keeps it)."""
        return asdict(self)


def _env_int(env: Mapping[str, str], name: str) -> Optional[int]:
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def detect(env: Optional[Mapping[str, str]] = None) -> Optional[RankInfo]:
    """This process's rank, when it is one of several; None for a single process.

    An initialised ``torch.distributed`` process group decides (its rank and world size);
    without one, the launcher's ``RANK`` and ``WORLD_SIZE``. ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` are taken from the environment when set. torch is not imported
    here: a process group exists only when the program imported it.

    Args:
        env: the environment to read (default ``os.environ``).

    Returns:
        the rank information, or None when the world has one process (or none is said).

    Raises:
        ValueError: a rank variable that is not an integer, or a rank outside the world.
    """
    env = os.environ if env is None else env
    rank = world = None
    source = "env"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and env is os.environ:
        try:
            if dist.is_available() and dist.is_initialized():
                rank, world, source = int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed"
        except (RuntimeError, ValueError):  # a group being torn down: the launcher's env decides
            rank = world = None
    if rank is None:
        if not env.get("RANK", "").strip() or not env.get("WORLD_SIZE", "").strip():
            return None  # not a launcher's pair (a lone RANK may mean something else)
        rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    assert rank is not None and world is not None  # both non-empty, so both parsed
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world} processes (RANK, WORLD_SIZE)")
    return RankInfo(rank=rank, world_size=world, local_rank=_env_int(env, "LOCAL_RANK"),
                    local_world_size=_env_int(env, "LOCAL_WORLD_SIZE"), host=socket.gethostname(), source=source)


def per_rank_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether per-rank stream names are on (``STRAP_RANK_STREAMS`` not set to 0/false/no/off)."""
    v = (os.environ if env is None else env).get(OPT_OUT_ENV, "").strip().lower()
    if v in ("", "1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{OPT_OUT_ENV}={v!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def rank_path(path: str, info: RankInfo) -> str:
    """``path`` with this rank's marker before its extension:
    ``cap.strap`` → ``cap.rank00001-of-00002.strap``. A path that already carries this
    rank's marker (a path a capture of this rank returned, given again) is kept.

    Args:
        path: a stream (or checkpoint, or trace) path.
        info: the rank.

    Returns:
        the per-rank path.

    Example:
        >>> rank_path("/runs/cap.strap", RankInfo(1, 2, 1, 2, "h", "env"))
        '/runs/cap.rank00001-of-00002.strap'
    """
    head, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    if stem == "":  # ".strap": a name that is all extension
        stem, ext = base, ""
    marker = f".rank{info.rank:05d}-of-{info.world_size:05d}"
    m = _RANKED.search(stem)
    if m is not None and int(m.group(1)) == info.rank and int(m.group(2)) == info.world_size:
        return path
    return os.path.join(head, stem + marker + ext)
