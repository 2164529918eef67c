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

import datetime
import json
import os
import re
import socket
import sys
import fnmatch
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _speedups as _c

#: The environment variable that turns per-rank stream names off (``0``, ``false``, ``no``, ``off``).
OPT_OUT_ENV = "STRAP_RANK_STREAMS"

#: A rank's marker at the end of a stem (what :func:`rank_path` adds, ASCII digits only).
_RANKED = re.compile(r"\.rank([0-9]{5,})-of-([0-9]{5,})$")


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


#: The mesh dimension names a parallel layout understands (docs/DISTRIBUTED.md D1).
MESH_DIMS = ("tp", "pp", "dp")


@dataclass(frozen=True)
class ParallelLayout:
    """How the ranks of a job split the model and the data (docs/DISTRIBUTED.md D1).

    Give sizes (``tp_size``, ``pp_size``, optionally ``dp_size``): this rank's place follows
    from its rank, ranks placed as a DeviceMesh of shape ``(pp, dp, tp)`` (tp fastest). Or
    give this rank's place as well (``tp_rank``, ``pp_stage``, ``dp_rank``, all three).

    Attributes:
        tp_size, pp_size: tensor- and pipeline-parallel degrees (default 1).
        dp_size: data-parallel replicas (None: ``world_size / (tp_size·pp_size)``).
        tp_rank, pp_stage, dp_rank: this rank's place (None: from the rank).

    Example:
        >>> capture_activations(model, output_path="cap.strap",
        ...                     parallel_layout=ParallelLayout(tp_size=2))  # doctest: +SKIP
    """

    tp_size: int = 1
    pp_size: int = 1
    dp_size: Optional[int] = None
    tp_rank: Optional[int] = None
    pp_stage: Optional[int] = None
    dp_rank: Optional[int] = None


@dataclass(frozen=True)
class Layout:
    """This rank's place in the resolved layout: the ``distributed`` object's layout fields."""

    tp_rank: int
    tp_size: int
    pp_stage: int
    pp_size: int
    dp_rank: int
    dp_size: int
    layout_source: str

    def metadata(self) -> Dict[str, Any]:
        return asdict(self)


_LAYOUT_KEYS = ("tp_size", "pp_size", "dp_size", "tp_rank", "pp_stage", "dp_rank")


def _pos_int(name: str, v: Any, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"parallel_layout: {name}={v!r} must be an integer >= {minimum}")
    return v


def resolve_layout(given: Any, info: Optional[RankInfo]) -> Optional[Layout]:
    """This rank's place in the job's parallel layout.

    Args:
        given: ``parallel_layout`` as the caller gave it: None, a ``DeviceMesh`` whose
            ``mesh_dim_names`` are among ``tp``, ``pp``, ``dp``, a dict of
            :class:`ParallelLayout`'s fields, or a :class:`ParallelLayout`.
        info: this process's rank (None: a single process).

    Returns:
        the layout (``layout_source`` ``"device_mesh"``, ``"argument"`` or ``"default"``), or
        None for a single process given nothing.

    Raises:
        ValueError: a layout in a single process, unknown mesh dimension names or dict keys,
            sizes whose product is not the world size, a place outside the sizes.
        TypeError: something that is none of the above.
    """
    if given is None:
        if info is None:
            return None
        return Layout(0, 1, 0, 1, info.rank, info.world_size, "default")
    if info is None:
        raise ValueError("parallel_layout given in a single process (no torch.distributed process group, "
                         "no RANK/WORLD_SIZE of a world above 1): there is no layout to place this rank in")
    if _is_device_mesh(given):
        return _from_mesh(given, info)
    if isinstance(given, dict):
        unknown = sorted(set(given) - set(_LAYOUT_KEYS))
        if unknown:
            raise ValueError(f"parallel_layout: unknown keys {unknown}; expected some of {list(_LAYOUT_KEYS)}")
        given = ParallelLayout(**given)
    if not isinstance(given, ParallelLayout):
        raise TypeError(f"parallel_layout must be a DeviceMesh, a dict or a ParallelLayout, got {type(given).__name__}")
    world = info.world_size
    tp = _pos_int("tp_size", given.tp_size, 1)
    pp = _pos_int("pp_size", given.pp_size, 1)
    if given.dp_size is None:
        if world % (tp * pp):
            raise ValueError(f"parallel_layout: world_size {world} is not a multiple of tp_size·pp_size = {tp * pp}")
        dp = world // (tp * pp)
    else:
        dp = _pos_int("dp_size", given.dp_size, 1)
    if tp * pp * dp != world:
        raise ValueError(f"parallel_layout: tp_size·pp_size·dp_size = {tp}·{pp}·{dp} = {tp * pp * dp}, "
                         f"not the world size {world}")
    places = (given.tp_rank, given.pp_stage, given.dp_rank)
    if all(p is None for p in places):
        r = info.rank
        tp_rank, rest = r % tp, r // tp
        dp_rank, pp_stage = rest % dp, rest // dp
    elif any(p is None for p in places):
        raise ValueError("parallel_layout: give all three of tp_rank, pp_stage, dp_rank, or none (then the rank "
                         "places this process)")
    else:
        tp_rank, pp_stage, dp_rank = (_pos_int(n, v, 0) for n, v in zip(("tp_rank", "pp_stage", "dp_rank"), places))
        for n, v, size in (("tp_rank", tp_rank, tp), ("pp_stage", pp_stage, pp), ("dp_rank", dp_rank, dp)):
            if v >= size:
                raise ValueError(f"parallel_layout: {n}={v} is outside its size {size}")
    return Layout(tp_rank, tp, pp_stage, pp, dp_rank, dp, "argument")


def _is_device_mesh(obj: Any) -> bool:
    mod = sys.modules.get("torch.distributed.device_mesh")
    cls = getattr(mod, "DeviceMesh", None) if mod is not None else None
    return cls is not None and isinstance(obj, cls)


def _from_mesh(mesh: Any, info: RankInfo) -> Layout:
    names = tuple(mesh.mesh_dim_names or ())
    if not names:
        raise ValueError("parallel_layout: the DeviceMesh has no mesh_dim_names; name its dimensions tp, pp, dp")
    # A dimension of size 1 places nothing, whatever its name (transformers' mesh is
    # ("pp", "fsdp", "tp") with the sizes not asked for at 1); another name of a larger
    # size would split the ranks in a way a capture does not know how to read back.
    other = [n for i, n in enumerate(names) if n not in MESH_DIMS and int(mesh.size(i)) > 1]
    if other:
        raise ValueError(f"parallel_layout: mesh dimensions {other} are not tp, pp or dp (a capture places a rank "
                         f"by those three only; other dimensions may only have size 1)")
    sizes = {n: 1 for n in MESH_DIMS}
    places = {n: 0 for n in MESH_DIMS}
    for i, n in enumerate(names):
        if n not in MESH_DIMS:
            continue
        sizes[n] = int(mesh.size(i))
        places[n] = int(mesh.get_local_rank(mesh_dim=i))
    if sizes["tp"] * sizes["pp"] * sizes["dp"] != info.world_size:
        raise ValueError(f"parallel_layout: the DeviceMesh holds {sizes['tp'] * sizes['pp'] * sizes['dp']} ranks, "
                         f"the job {info.world_size}")
    return Layout(places["tp"], sizes["tp"], places["pp"], sizes["pp"], places["dp"], sizes["dp"], "device_mesh")


def job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The launcher's id of this job run (``TORCHELASTIC_RUN_ID``), or None (also for
    ``none``, what torchrun sets when given no ``--rdzv-id``)."""
    v = (os.environ if env is None else env).get("TORCHELASTIC_RUN_ID", "").strip()
    return v if v and v != "none" else None


# ----- replicated, sharded and local outputs (docs/DISTRIBUTED.md D2) ------------------------------


@dataclass(frozen=True)
class Shard:
    """A module output split along ``axis`` over the tensor-parallel ranks (``sharding=``)."""

    axis: int


#: What a module's output is, per module: ``local``, ``replicated``, ``sharded`` (with ``axis``),
#: or ``detect`` (decided from its first output: a DTensor's placements, else replicated).
@dataclass(frozen=True)
class ModuleKind:
    kind: str
    axis: Optional[int] = None
    source: str = "default"

    def metadata(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"kind": self.kind}
        if self.axis is not None:
            d["axis"] = self.axis
        d["source"] = self.source
        return d


REPLICATED_MODES = ("tp_rank0", "every_rank")

#: transformers' tensor-parallel styles (``model.tp_plan``) and what they leave in a module's
#: output: a shard of the last axis, a tensor every tp rank holds whole, or this rank's own
#: partial result (``local_rowwise``: not reduced; stored on every rank, never stitched).
_TP_STYLE_SHARDED = ("colwise", "local_colwise", "packed_colwise", "local_packed_colwise")
_TP_STYLE_LOCAL = ("local_rowwise", "local_packed_rowwise", "local")


def parse_spec(pattern: str, spec: Any) -> ModuleKind:
    """One ``sharding={pattern: spec}`` entry as a :class:`ModuleKind`.

    Raises:
        ValueError: a spec that is not ``"replicated"``, ``"local"``, ``{"shard": axis}`` or
            :class:`Shard` (axis a non-negative integer).
    """
    if isinstance(spec, Shard):
        axis: Any = spec.axis
    elif isinstance(spec, dict) and set(spec) == {"shard"}:
        axis = spec["shard"]
    elif spec in ("replicated", "local"):
        return ModuleKind(spec, None, "argument")
    else:
        raise ValueError(f"sharding[{pattern!r}] = {spec!r}: expected 'replicated', 'local', {{'shard': axis}} "
                         f"or Shard(axis)")
    if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
        raise ValueError(f"sharding[{pattern!r}]: axis {axis!r} must be a non-negative integer (counted on the "
                         f"stored tensor)")
    return ModuleKind("sharded", axis, "argument")


def check_sharding(sharding: Any) -> Tuple[Tuple[str, ModuleKind], ...]:
    """``sharding=`` checked: ``((pattern, kind), ...)`` in the order given."""
    if sharding is None:
        return ()
    if not isinstance(sharding, dict):
        raise TypeError(f"sharding must be a dict of fnmatch pattern to spec, got {type(sharding).__name__}")
    out = []
    for pattern, spec in sharding.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"sharding: pattern {pattern!r} is not a non-empty string")
        out.append((pattern, parse_spec(pattern, spec)))
    return tuple(out)


def classify(model: Any, modules: Sequence[str], layout: Optional[Layout],
             sharding: Sequence[Tuple[str, ModuleKind]]) -> Dict[str, ModuleKind]:
    """What each hooked module's output is (docs/DISTRIBUTED.md D2).

    With ``tp_size`` 1 (or no layout) every module is local. Otherwise: the first matching
    ``sharding`` pattern; else transformers' tensor-parallel plan of a model it sharded
    (``model.tp_size`` set: ``colwise`` → sharded on the last axis, ``rowwise`` and others
    that leave whole tensors → replicated, ``local_rowwise`` → local); else ``detect``: the
    first output decides (a DTensor by its placements, any other tensor replicated).

    Args:
        model: the model.
        modules: the hooked modules' names (``""`` is the root).
        layout: this rank's layout.
        sharding: the checked ``sharding=`` entries.

    Returns:
        ``{module name: kind}``.
    """
    if layout is None or layout.tp_size == 1:
        return {m: ModuleKind("local") for m in modules}
    plan = _tp_plan(model)
    out: Dict[str, ModuleKind] = {}
    for m in modules:
        kind = next((k for p, k in sharding if fnmatch.fnmatchcase(m, p)), None)
        if kind is None and plan:
            style = next((s for p, s in plan.items() if fnmatch.fnmatchcase(m, p)), None)
            if style is not None:
                if style in _TP_STYLE_SHARDED:
                    kind = ModuleKind("sharded", -1, "tp_plan")  # -1: the last axis, made exact per record
                elif style in _TP_STYLE_LOCAL:
                    kind = ModuleKind("local", None, "tp_plan")
                else:
                    kind = ModuleKind("replicated", None, "tp_plan")
            else:
                kind = ModuleKind("replicated", None, "tp_plan")  # around the plan's modules: reduced, whole
        out[m] = kind if kind is not None else ModuleKind("detect")
    return out


def _tp_plan(model: Any) -> Dict[str, str]:
    """transformers' tensor-parallel plan of a model it sharded (empty otherwise: a model
    that carries a plan but was loaded whole holds whole outputs)."""
    size = getattr(model, "_tp_size", None)
    if not isinstance(size, int) or size <= 1:
        return {}
    plan = getattr(model, "tp_plan", None)
    return dict(plan) if isinstance(plan, dict) else {}


def shard_meta(shape: Tuple[int, ...], axis: int, layout: Layout, offset: Optional[int] = None,
               full_shape: Optional[List[int]] = None) -> Dict[str, Any]:
    """The record meta of one piece of a sharded output (STREAM_FORMAT.md 3).

    Args:
        shape: the stored (local) shape.
        axis: the split axis (negative counts from the end).
        layout: this rank's layout.
        offset, full_shape: the piece's offset along ``axis`` and the whole tensor's shape
            (None: equal pieces, ``offset = tp_rank·local``, ``full = local·tp_size``).

    Returns:
        ``{"shard": {"axis", "offset", "full_shape", "tp_rank", "tp_size"}}``.

    Raises:
        ValueError: ``axis`` outside the tensor.
    """
    nd = len(shape)
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise ValueError(f"shard axis {axis} is outside a tensor of {nd} dimensions")
    if offset is None or full_shape is None:
        full = list(shape)
        full[a] = shape[a] * layout.tp_size
        offset = layout.tp_rank * shape[a]
    else:
        full = list(full_shape)
    return {"shard": {"axis": a, "offset": int(offset), "full_shape": [int(v) for v in full],
                      "tp_rank": layout.tp_rank, "tp_size": layout.tp_size}}


def dtensor_piece(t: Any) -> Optional[Tuple[Any, Optional[Tuple[int, int, List[int]]]]]:
    """A DTensor output as ``(local tensor, (axis, offset, full shape))`` when sharded along
    one axis, ``(local tensor, None)`` when replicated; None when ``t`` is no DTensor.

    Raises:
        ValueError: a placement a capture cannot store as one piece (a partial sum, or
            shards along several axes).
    """
    mod = sys.modules.get("torch.distributed.tensor")
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    if cls is None or not isinstance(t, cls):
        return None
    placements = t.placements
    shards = [(i, p) for i, p in enumerate(placements) if p.is_shard()]
    if any(p.is_partial() for p in placements):
        raise ValueError(f"a DTensor output with a Partial placement {placements}: not a piece of a whole tensor")
    local = t.to_local()
    if not shards:
        return local, None
    dims = {p.dim for _, p in shards}
    if len(dims) != 1:
        raise ValueError(f"a DTensor output sharded along several axes {placements}: not stored as one piece")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    full = list(t.shape)
    _, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, placements)
    axis = dims.pop()
    axis = axis + len(full) if axis < 0 else axis
    return local, (axis, int(offsets[axis]), full)


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


def env_switch(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """An on/off environment variable that is on unless set to 0/false/no/off (any case).

    Raises:
        ValueError: any other value, naming the variable.
    """
    v = (os.environ if env is None else env).get(name, "").strip().lower()
    if v in ("", "1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={v!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def per_rank_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether per-rank stream names are on (``STRAP_RANK_STREAMS`` not set to 0/false/no/off)."""
    return env_switch(OPT_OUT_ENV, env)


def rank_path(path: str, info: RankInfo) -> str:
    """``path`` with this rank's marker before its extension:
    ``cap.strap`` → ``cap.rank00001-of-00002.strap`` (the extension as :func:`os.path.splitext`
    finds it; a name of leading dots only has none). A path that already carries this rank's
    marker (ASCII digits; a path a capture of this rank returned, given again) is kept.

    Args:
        path: a stream (or checkpoint, or trace) path.
        info: the rank.

    Returns:
        the per-rank path.

    Example:
        >>> rank_path("/runs/cap.strap", RankInfo(1, 2, 1, 2, "h", "env"))
        '/runs/cap.rank00001-of-00002.strap'
    """
    # The rule is libstrap's (clients/c/common/strap_rank.h), compiled into _speedups: the
    # C client names a rank's stream the same way.
    return str(_c.rank_path(path, info.rank, info.world_size))


# ----- exchanging small facts between ranks (D3, D4) -----------------------------------------------

#: How many exchanges of each kind this process made: the ranks of a job make them in the same
#: order (the same call on every rank), so the count names the exchange in the store's keys.
_EXCHANGES: Dict[str, int] = {}


def store_exchange(kind: str, info: RankInfo, value: Any, to_all: bool,
                   timeout: Optional[float] = None) -> Optional[List[Any]]:
    """Every rank's ``value`` (JSON) through the key-value store of the initialised default
    process group — never a collective on the group itself.

    A collective here would pair up with whatever collective another rank is in (a rank that
    ends its capture while another is still in the model's all-reduce), and a gloo collective
    right before the process exits can abort it: gloo's worker thread drops its last reference to
    the work's tensors after the caller has returned, and when that happens while the
    interpreter is finalizing it takes the GIL of a dying interpreter (``std::terminate``,
    SIGABRT; seen in CI). Store operations run on the calling thread and are done when they
    return.

    Args:
        kind: what is exchanged (a key segment, e.g. ``"capture-set"``).
        info: this rank (its world size must be the default group's).
        value: this rank's value, JSON-serialisable.
        to_all: every rank gets every value (and waits for them); else only rank 0 does, the
            other ranks return at once, and rank 0 deletes the keys after reading them.
        timeout: seconds to wait for the other ranks' values (None: the store's own timeout,
            the process group's — 30 min by default).

    Returns:
        the values by rank, or None on a rank that gets none.

    Raises:
        TimeoutError: a rank's value did not come within ``timeout`` (or the store's); the
            message names the ranks not heard from. With ``to_all=False`` rank 0 deletes the
            values it did get (a late rank's value stays in the store, which ends with the group).
    """
    store, keys = _exchange_keys(kind, info)
    store.set(keys[info.rank], json.dumps(value))
    if not to_all and info.rank != 0:
        return None
    try:
        if timeout is None:
            store.wait(keys)
        else:
            store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception as e:  # torch raises DistStoreError or RuntimeError, by version
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not to_all:
            for k in keys:
                if store.check([k]):
                    store.delete_key(k)
        raise TimeoutError(f"ranks {missing} of {info.world_size} sent no {kind} value: {e}") from e
    got = [json.loads(store.get(k)) for k in keys]
    if not to_all:
        for k in keys:
            store.delete_key(k)
    return got


def store_announce(kind: str, info: RankInfo, value: Any) -> None:
    """This rank's value for a ``to_all=False`` exchange it takes part in without waiting —
    a rank whose capture did not start, so that rank 0 hears why instead of waiting for the
    end of a capture that will never come. On rank 0 (which would only read) the exchange's
    number just moves on, as on every other rank."""
    store, keys = _exchange_keys(kind, info)
    if info.rank != 0:
        store.set(keys[info.rank], json.dumps(value))


def _exchange_keys(kind: str, info: RankInfo) -> Tuple[Any, List[str]]:
    """The default group's store and the keys of this process's next exchange of ``kind``."""
    from torch.distributed import distributed_c10d as c10d

    n = _EXCHANGES[kind] = _EXCHANGES.get(kind, -1) + 1
    return c10d._get_default_store(), [f"strap-llm/{kind}/{n}/{r}" for r in range(info.world_size)]
