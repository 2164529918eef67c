"""The resume point of a whole distributed job (docs/DISTRIBUTED.md D3).

When a job of several ranks is restarted with ``resume_from_checkpoint=True``, each rank first
finds the tokens its own stream can keep (docs/CHECKPOINTS.md 4); the job then agrees on the
smallest of those counts and every rank cuts back to it, so no rank keeps tokens that another
one has to generate again. The agreement is made once, at the start of the capture, never on
the model's path:

- an initialised ``torch.distributed`` process group of the job's size: the counts go
  through the group's key-value store (``_distributed.store_exchange``; no collective);
- without one, under ``torchrun`` (``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT``
  name this start of the job; the run id must name this launch: torchrun's default ``none``
  does not) with per-rank stream names: each rank writes its count to
  ``{its stream}.job-resume.json`` and reads every other rank's file of the same start from
  the same directory (which must be shared by the ranks), waiting for them up to
  ``STRAP_JOB_RESUME_WAIT`` seconds (600);
- neither: no agreement can be made; each rank resumes from its own point, with a warning.

A rank that cannot resume (its checkpoint does not match its stream, say) still takes part,
so that no other rank waits for it: every rank then fails, naming the rank and its error.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, List, Optional, Union

from . import _distributed
from ._distributed import RankInfo
from ._ring import _c as _speedups
from ._warnings import warn_caller
from .checkpoint import CheckpointError

#: Seconds a rank waits for the other ranks' counts in the file exchange.
WAIT_ENV = "STRAP_JOB_RESUME_WAIT"
DEFAULT_WAIT_S = 600.0

#: What a rank contributes: the tokens it can keep, or the error that keeps it from resuming.
Own = Union[int, BaseException]
#: Takes this rank's contribution, returns every rank's (ints, or error texts), in rank order.
Exchange = Callable[[Own], List[Union[int, str]]]


def exchange_for(info: RankInfo, output_path: str, per_rank_names: bool) -> Optional[Exchange]:
    """How this rank learns the other ranks' counts, or None when no way exists (warned).

    Args:
        info: this rank.
        output_path: this rank's stream (with its rank marker when ``per_rank_names``).
        per_rank_names: whether the streams carry per-rank names (the file exchange finds the
            other ranks' files by them).

    Returns:
        the exchange, or None.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and info.source == "torch.distributed":
        return lambda own: _gather(info, own)
    run_id = (os.environ.get("TORCHELASTIC_RUN_ID") or "").strip()
    restart = (os.environ.get("TORCHELASTIC_RESTART_COUNT") or "").strip()
    # "none" is torchrun's default run id: every launch has it, so files of an earlier launch
    # in the same directory could not be told from this one's.
    if per_rank_names and run_id and run_id != "none" and restart:
        return lambda own: _files(info, output_path, f"{run_id}/{restart}", own)
    if not per_rank_names:
        why = "the streams do not carry per-rank names (STRAP_RANK_STREAMS=0)"
    elif run_id == "none" and restart:
        why = ("there is no initialised torch.distributed process group, and torchrun's default run id "
               "'none' does not tell this launch from an earlier one (pass --rdzv-id or --standalone)")
    else:
        why = ("there is neither an initialised torch.distributed process group nor torchrun's "
               "TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT")
    warn_caller(f"rank {info.rank} of {info.world_size} resumes {output_path} from its own point, not the point "
                f"every rank reached: {why} (docs/DISTRIBUTED.md D3)")
    return None


def agree(exchange: Exchange, own: Own, info: RankInfo) -> int:
    """The job's resume point: the fewest tokens any rank can keep.

    Args:
        exchange: from :func:`exchange_for`.
        own: this rank's count, or its error (raised again here after the exchange).
        info: this rank.

    Returns:
        the smallest count.

    Raises:
        the rank's own error; CheckpointError naming the other ranks that cannot resume.
    """
    got = exchange(own)
    if isinstance(own, BaseException):
        raise own
    bad = [f"rank {r}: {v}" for r, v in enumerate(got) if isinstance(v, str)]
    if bad:
        raise CheckpointError(f"the job cannot resume: {'; '.join(bad)} (rank {info.rank} could keep {own} tokens "
                              f"and is left as it was)")
    return min(int(v) for v in got)


def _wire(own: Own) -> Union[int, str]:
    return own if isinstance(own, int) else f"{type(own).__name__}: {own}"


def _gather(info: RankInfo, own: Own) -> List[Union[int, str]]:
    try:
        got = _distributed.store_exchange("job-resume", info, _wire(own), to_all=True)
    except TimeoutError as e:
        raise CheckpointError(f"the job cannot agree on a resume point: {e}") from e
    assert got is not None
    return [v if isinstance(v, (int, str)) and not isinstance(v, bool) else f"sent {v!r}" for v in got]


def _files(info: RankInfo, output_path: str, start: str, own: Own) -> List[Union[int, str]]:
    """The file exchange, libstrap's (``strap__job_exchange``, which its own sessions use)."""
    wait = float(os.environ.get(WAIT_ENV, "") or DEFAULT_WAIT_S)
    try:
        return _speedups.job_exchange(output_path, info.rank, info.world_size, start, _wire(own), wait)
    except OSError as e:
        raise CheckpointError(e.args[-1]) from None
