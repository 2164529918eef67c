"""A capture set: the streams of every rank of one distributed job, listed by one manifest
(docs/DISTRIBUTED.md D4), and read back as whole tensors (D5).

This module owns the manifest format, version 1: building it from the streams alone
(:func:`build`), writing it (:func:`write`, temp file + rename), loading and checking it
(:func:`load`), and rank 0 writing it when a capture ends (:func:`end_of_capture`). Reading a
set, with sharded tensors stitched back from their pieces, is :func:`open_capture_set`.

Command line::

    python -m llm_instrumentation.capture_set build 'cap.rank*-of-*.strap' -o cap.capture-set.json
    python -m llm_instrumentation.capture_set inspect cap.capture-set.json
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _distributed
from ._source import filesystem, is_url
from .errors import StrapError
from .stream import DROP, END, FOOTER_MAGIC, TENSOR, TOKEN, StreamReader, Tensor, open_stream

log = logging.getLogger("llm_instrumentation")

FORMAT = "strap-capture-set"
VERSION = 1
#: A manifest larger than this is refused (it lists streams, not data).
MAX_SIZE = 64 << 20
#: Seconds rank 0 waits, once its own capture has ended, for the other ranks' captures to end
#: (their facts through the process group's store, or their streams by name without one).
WAIT_FOR_RANKS = 60.0
#: ``STRAP_CAPTURE_SET=0`` (false/no/off): rank 0 writes no manifest at the end of a capture
#: (and no rank takes part in gathering its facts).
OPT_OUT_ENV = "STRAP_CAPTURE_SET"

PathLike = Union[str, "os.PathLike[str]"]


class CaptureSetError(StrapError, ValueError):
    """A manifest that breaks its format or its checks, or streams that do not make a set."""


# ----- the manifest ------------------------------------------------------------------------------


def manifest_path(stream_path: str) -> str:
    """Where a job's manifest goes: ``{stem}.capture-set.json`` beside the streams, the rank
    marker taken off (``cap.rank00000-of-00002.strap`` → ``cap.capture-set.json``)."""
    head, base = os.path.split(stream_path)
    stem, ext = os.path.splitext(base)
    if stem == "":
        stem = base
    stem = _distributed._RANKED.sub("", stem)
    return os.path.join(head, stem + ".capture-set.json")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _module_of(record_name: str, modules: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The ``distributed.modules`` entry a record name belongs to (``name``, ``name.out1``,
    ``name.key`` are one module's)."""
    n = record_name
    while True:
        m = modules.get(n)
        if isinstance(m, dict):
            return m
        if "." not in n:
            return None
        n = n.rsplit(".", 1)[0]


#: A rank's ``role`` (D4): ``replica`` stores nothing by design (every module it captures is
#: replicated and tp rank 0 of its group stores it: a vLLM engine's tp ranks > 0); every other
#: rank is ``primary``.
ROLE_PRIMARY = "primary"
ROLE_REPLICA = "replica"
ROLES = (ROLE_PRIMARY, ROLE_REPLICA)


def rank_role(d: Any) -> str:
    """A rank's ``role`` from its stream header's ``distributed`` object (D4): ``replica``
    when it is a tp rank > 0 under ``replicated: "tp_rank0"`` whose ``modules`` name at least
    one module and every one ``replicated``; else ``primary``. strapd's ``internal/captureset``
    (``RoleOf``) applies the same rule."""
    if not isinstance(d, dict):
        return ROLE_PRIMARY
    tp, mods = d.get("tp_rank"), d.get("modules")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0 or d.get("replicated") != "tp_rank0" \
            or not isinstance(mods, dict) or not mods:
        return ROLE_PRIMARY
    if all(isinstance(m, dict) and m.get("kind") == "replicated" for m in mods.values()):
        return ROLE_REPLICA
    return ROLE_PRIMARY


def rank_entry(reader: StreamReader, stream: str) -> Dict[str, Any]:
    """One rank's object of the manifest, from its stream alone (D4's second table).

    Args:
        reader: the rank's open stream.
        stream: what the manifest's ``stream`` key says (a relative or absolute path, a URL).

    Returns:
        the rank's object.

    Raises:
        CaptureSetError: the stream's header has no ``distributed`` object.
    """
    meta = reader.metadata
    cm: Dict[str, Any] = meta["client_metadata"] if isinstance(meta.get("client_metadata"), dict) else {}
    d: Any = cm.get("distributed")
    if not isinstance(d, dict) or not isinstance(d.get("rank"), int):
        raise CaptureSetError(f"{reader.path}: its header has no client_metadata.distributed: not one rank's stream "
                              f"of a distributed job")
    counts = 0
    tok_first: Optional[int] = None
    tok_end = 0
    forwards = 0
    first: Dict[str, int] = {}
    if reader.indexed:
        for i, e in enumerate(reader._index_entries):
            name, typ, _, _, step, fwd, _ = e
            if typ in (TENSOR, DROP, TOKEN):
                counts += 1
            if typ == TOKEN:
                tok_first = step if tok_first is None else min(tok_first, step)
                tok_end = max(tok_end, step + 1)
            elif typ == TENSOR:
                forwards = max(forwards, fwd + 1)
                first.setdefault(name, i)
        firsts = {pk.name: pk for pk in reader._parse_entries(sorted(first.values()))}
        ends = list(reader.packets(select=lambda n, t: t == END))
    else:
        firsts = {}
        ends = []
        for pk in reader.packets():
            if pk.type in (TENSOR, DROP, TOKEN):
                counts += 1
            if pk.type == TOKEN:
                tok_first = pk.step if tok_first is None else min(tok_first, pk.step)
                tok_end = max(tok_end, pk.step + 1)
            elif pk.type == TENSOR:
                forwards = max(forwards, pk.forward + 1)
                firsts.setdefault(pk.name, pk)
            elif pk.type == END:
                ends.append(pk)
    status = ends[-1].meta.get("status", "open") if ends else "open"
    tp_size = d.get("tp_size", 1)
    dmods: Dict[str, Any] = d["modules"] if isinstance(d.get("modules"), dict) else {}
    modules: Dict[str, Any] = {}
    for name, pk in firsts.items():
        pm = pk.meta if isinstance(pk.meta, dict) else {}
        shard = pm.get("shard")
        if isinstance(shard, dict):
            modules[name] = {"kind": "sharded", "axis": shard.get("axis"), "full_shape": shard.get("full_shape")}
            continue
        m = _module_of(name, dmods)
        local = tp_size == 1 or (m is not None and m.get("kind") == "local")
        modules[name] = {"kind": "local" if local else "replicated"}
    return {
        "rank": d["rank"], "local_rank": d.get("local_rank"), "host": d.get("host"),
        "tp_rank": d.get("tp_rank", 0), "pp_stage": d.get("pp_stage", 0), "dp_rank": d.get("dp_rank", d["rank"]),
        "role": rank_role(d), "stream": stream, "session": meta.get("session"), "strapd_host": meta.get("host"),
        "fingerprint": cm.get("fingerprint"), "status": status,
        "tokens": [tok_first if tok_first is not None else 0, tok_end if tok_first is not None else 0],
        "forwards": forwards, "packets": counts, "bytes": reader.size, "modules": modules,
    }


def _stream_ref(path: str, manifest_dir: Optional[str]) -> str:
    if is_url(path) or manifest_dir is None:
        return path
    a = os.path.abspath(path)
    rel = os.path.relpath(a, os.path.abspath(manifest_dir))
    return a if rel.startswith("..") else rel


def _expand(streams: Union[PathLike, Sequence[PathLike]], storage_options: Optional[Dict[str, Any]]) -> List[str]:
    items = [streams] if isinstance(streams, (str, os.PathLike)) else list(streams)
    out: List[str] = []
    for it in items:
        s = os.fspath(it)
        if any(c in s for c in "*?["):
            if is_url(s):
                fs, p = filesystem(s, storage_options)
                proto = s.split("://", 1)[0]
                hits = sorted(f"{proto}://{h}" for h in fs.glob(p))
            else:
                hits = sorted(glob.glob(s))
            if not hits:
                raise CaptureSetError(f"{s}: no stream matches")
            out.extend(hits)
        else:
            out.append(s)
    return out


def assemble(entries: List[Dict[str, Any]], distributed: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """The manifest of the ranks' objects ``entries`` (any order), given each rank's
    ``distributed`` header object (for the layout and the job id).

    Raises:
        CaptureSetError: two streams of one rank, ranks of different world sizes or
            layouts, a rank missing.
    """
    if not entries:
        raise CaptureSetError("no streams: a capture set needs one stream per rank")
    by_rank: Dict[int, Dict[str, Any]] = {}
    for e in entries:
        r = e["rank"]
        if r in by_rank:
            raise CaptureSetError(f"rank {r}: two streams ({by_rank[r]['stream']} and {e['stream']})")
        by_rank[r] = e
    worlds = {distributed[r].get("world_size") for r in by_rank}
    if len(worlds) != 1:
        raise CaptureSetError(f"the streams name different world sizes {sorted(map(str, worlds))}")
    world: Any = worlds.pop()
    lows = min(by_rank)
    layout = {k: distributed[lows].get(k, 1 if k != "dp_size" else world) for k in ("tp_size", "pp_size", "dp_size")}
    for r in by_rank:
        other = {k: distributed[r].get(k, 1 if k != "dp_size" else world) for k in layout}
        if other != layout:
            raise CaptureSetError(f"rank {r}: layout {other} differs from rank {lows}'s {layout}")
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        raise CaptureSetError(f"ranks {missing} of {world}: no stream (key 'ranks')")
    jid = distributed[0].get("job_id") or str(by_rank[0]["session"])
    return {"format": FORMAT, "version": VERSION, "created": _now(), "job_id": jid, "world_size": world,
            "layout": layout, "ranks": [by_rank[r] for r in range(world)]}


def build(streams: Union[PathLike, Sequence[PathLike]], manifest: Optional[PathLike] = None,
          storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The manifest of a job, from its streams alone (rank 0 died, or the files moved).

    Args:
        streams: stream paths, globs (``"cap.rank*-of-*.strap"``) or ``s3://`` URLs (globs too).
        manifest: where the manifest will be written: local streams are named relative to
            its directory when under it, else by absolute path (None: absolute paths).
        storage_options: fsspec options for URLs.

    Returns:
        the manifest (checked by :func:`check` against the layout).

    Raises:
        CaptureSetError: no streams, a stream that is not one rank's, a rank missing or twice.
    """
    mdir = os.path.dirname(os.path.abspath(os.fspath(manifest))) if manifest is not None else None
    entries: List[Dict[str, Any]] = []
    dist: Dict[int, Dict[str, Any]] = {}
    for s in _expand(streams, storage_options):
        with open_stream(s, storage_options) as r:
            if not isinstance(r, StreamReader):
                raise CaptureSetError(f"{s}: a 1.3.1 stream, not one rank's strap stream")
            e = rank_entry(r, _stream_ref(s, mdir))
            dist[e["rank"]] = r.metadata["client_metadata"]["distributed"]
        entries.append(e)
    m = assemble(entries, dist)
    check(m, mdir, open_streams=False)
    return m


def write(path: PathLike, manifest: Dict[str, Any]) -> str:
    """Write ``manifest`` to ``path`` durably: a temp file beside it, written whole, fsync,
    rename, the directory's fsync (:func:`.checkpoint.write_atomic`, libstrap's).

    Returns:
        the path written.

    Raises:
        CaptureSetError: a manifest over :data:`MAX_SIZE`.
        OSError: naming the step and the path; the old manifest is left as it was.
    """
    p = os.path.abspath(os.fspath(path))
    data = (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode()
    if len(data) > MAX_SIZE:
        raise CaptureSetError(f"{p}: a manifest of {len(data)} bytes is over the {MAX_SIZE >> 20} MiB limit")
    from . import checkpoint

    checkpoint.write_atomic(p, data, mode=0o644)
    return p


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check(m: Dict[str, Any], manifest_dir: Optional[str], open_streams: bool = True,
          storage_options: Optional[Dict[str, Any]] = None) -> None:
    """D4's checks; each failure names the rank and the key.

    Args:
        m: the manifest.
        manifest_dir: its directory (relative stream paths are under it).
        open_streams: also check each stream's header (``session``, ``distributed.rank``).
        storage_options: fsspec options for URLs.

    Raises:
        CaptureSetError: the first check that fails.
    """
    if not isinstance(m, dict):
        raise CaptureSetError("a manifest is a JSON object")
    if m.get("format") != FORMAT:
        raise CaptureSetError(f"key 'format': {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("version") != VERSION:
        raise CaptureSetError(f"key 'version': {m.get('version')!r}, this reader reads {VERSION}")
    world: Any = m.get("world_size")
    if not _int(world) or world < 1:
        raise CaptureSetError(f"key 'world_size': {world!r} is not a positive integer")
    lay = m.get("layout")
    if not isinstance(lay, dict) or not all(_int(lay.get(k)) and lay[k] >= 1 for k in ("tp_size", "pp_size", "dp_size")):
        raise CaptureSetError(f"key 'layout': {lay!r} needs positive integers tp_size, pp_size, dp_size")
    if lay["tp_size"] * lay["pp_size"] * lay["dp_size"] != world:
        raise CaptureSetError(f"key 'layout': {lay['tp_size']}·{lay['pp_size']}·{lay['dp_size']} is not the "
                              f"world size {world}")
    ranks = m.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world:
        raise CaptureSetError(f"key 'ranks': {len(ranks) if isinstance(ranks, list) else ranks!r} entries for a world "
                              f"of {world}")
    places: Dict[Tuple[int, int, int], int] = {}
    for i, e in enumerate(ranks):
        if not isinstance(e, dict) or e.get("rank") != i:
            raise CaptureSetError(f"ranks[{i}]: key 'rank' is {e.get('rank') if isinstance(e, dict) else e!r}, "
                                  f"expected {i} (one entry per rank, in rank order)")
        for k, size in (("tp_rank", "tp_size"), ("pp_stage", "pp_size"), ("dp_rank", "dp_size")):
            if not _int(e.get(k)) or not 0 <= e[k] < lay[size]:
                raise CaptureSetError(f"rank {i}: key {k!r} = {e.get(k)!r} is outside its size {lay[size]}")
        place = (e["tp_rank"], e["pp_stage"], e["dp_rank"])
        if place in places:
            raise CaptureSetError(f"rank {i}: key 'tp_rank'/'pp_stage'/'dp_rank' {place} is rank {places[place]}'s "
                                  f"place too")
        places[place] = i
        if not isinstance(e.get("stream"), str) or not e["stream"]:
            raise CaptureSetError(f"rank {i}: key 'stream' is not a path or URL")
        if not isinstance(e.get("modules"), dict):
            raise CaptureSetError(f"rank {i}: key 'modules' is not an object")
        # role: absent in manifests written before it (D4)
        if "role" in e and e["role"] not in ROLES:
            raise CaptureSetError(f"rank {i}: key 'role' is {e['role']!r}, expected one of {list(ROLES)}")
        if e.get("role") == ROLE_REPLICA and e["modules"]:
            raise CaptureSetError(f"rank {i}: key 'role': a replica stores no record, but 'modules' names "
                                  f"{len(e['modules'])}")
    if not open_streams:
        return
    for e in ranks:
        s = stream_location(e["stream"], manifest_dir)
        if not is_url(s) and not os.path.exists(s):
            raise CaptureSetError(f"rank {e['rank']}: key 'stream': {s} does not exist")
        with open_stream(s, storage_options) as r:
            meta = r.metadata
            d = (meta.get("client_metadata") or {}).get("distributed") or {}
            if meta.get("session") != e.get("session"):
                raise CaptureSetError(f"rank {e['rank']}: key 'session': the manifest says {e.get('session')!r}, "
                                      f"the stream {s} says {meta.get('session')!r}")
            if d.get("rank") != e["rank"]:
                raise CaptureSetError(f"rank {e['rank']}: key 'rank': the stream {s} is rank {d.get('rank')!r}'s")
            if "role" in e and rank_role(d) != e["role"]:
                raise CaptureSetError(f"rank {e['rank']}: key 'role': the manifest says {e['role']!r}, the stream "
                                      f"header of {s} makes it {rank_role(d)!r}")


def stream_location(ref: str, manifest_dir: Optional[str]) -> str:
    """A manifest's ``stream`` value as a path or URL to open."""
    if is_url(ref) or os.path.isabs(ref) or manifest_dir is None:
        return ref
    return os.path.join(manifest_dir, ref)


def load(path: PathLike, check_streams: bool = True, storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Read a manifest and run D4's checks.

    Args:
        path: the manifest (a file or URL).
        check_streams: also open each stream's header and check it against its entry.
        storage_options: fsspec options for URLs.

    Returns:
        the manifest (unknown keys kept, never needed).

    Raises:
        CaptureSetError: not JSON, over 64 MiB, or a failed check.
    """
    p = os.fspath(path)
    if is_url(p):
        fs, inner = filesystem(p, storage_options)
        if fs.size(inner) > MAX_SIZE:
            raise CaptureSetError(f"{p}: over the {MAX_SIZE >> 20} MiB a manifest may be")
        raw = fs.cat_file(inner)
        mdir = p.rsplit("/", 1)[0]
    else:
        if os.path.getsize(p) > MAX_SIZE:
            raise CaptureSetError(f"{p}: over the {MAX_SIZE >> 20} MiB a manifest may be")
        with open(p, "rb") as f:
            raw = f.read()
        mdir = os.path.dirname(os.path.abspath(p))
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise CaptureSetError(f"{p}: not JSON: {e}") from None
    check(m, mdir, open_streams=check_streams, storage_options=storage_options)
    return m


# ----- rank 0 writes it when the capture ends -----------------------------------------------------


def enabled(env: Optional[Dict[str, str]] = None) -> bool:
    """Whether a capture ends by writing the manifest (``STRAP_CAPTURE_SET`` not 0/false/no/off)."""
    return _distributed.env_switch(OPT_OUT_ENV, env)


def _ended(path: str) -> bool:
    """Whether the stream at ``path`` has its footer (strapd finished it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < 16:
                return False
            f.seek(-8, os.SEEK_END)
            return f.read(8) == FOOTER_MAGIC
    except OSError:
        return False


def _in_group(info: _distributed.RankInfo) -> bool:
    """Whether an initialised process group of the job's size carries the ranks' facts."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() == info.world_size)


def failed_start(info: _distributed.RankInfo, why: BaseException) -> None:
    """Called by a rank whose capture did not start (refused, a bad option): with a process
    group, rank 0 then gets this rank's error in place of its facts and writes no manifest
    at once, instead of waiting for a capture end that will never come. Never raises."""
    try:
        if _in_group(info):
            _distributed.store_announce("capture-set", info, f"rank {info.rank}: its capture did not start: {why}")
    except Exception as e:  # the capture's own error is what the caller raises
        log.error("llm_instrumentation: could not tell rank 0 that this capture did not start: %s", e)


def end_of_capture(stream_path: str, info: _distributed.RankInfo, wait: Optional[float] = None) -> Optional[str]:
    """Called by every rank as its capture ends: rank 0 writes the job's manifest.

    With an initialised process group of the job's size, each rank's facts (read from its
    own, finished stream) reach rank 0 through the group's key-value store
    (:func:`_distributed.store_exchange`, no collective): the other ranks return at once, rank
    0 waits up to ``wait`` seconds for every rank to end a capture (a rank that died never
    will). Without one, rank 0 waits up to ``wait`` seconds for the other ranks' streams (by
    their per-rank names) to end and reads them. Either way, a rank not heard from in time is
    named in the log and no manifest is written (``capture_set build`` makes it later).

    Args:
        stream_path: this rank's stream.
        info: this rank.
        wait: seconds rank 0 waits for the other ranks (None: :data:`WAIT_FOR_RANKS`).

    Returns:
        the manifest's path on rank 0 when written, else None.
    """
    out = manifest_path(stream_path)
    wait = WAIT_FOR_RANKS if wait is None else wait
    if _in_group(info):
        try:
            with open_stream(stream_path) as r:
                mine: Any = (rank_entry(r, stream_path), r.metadata["client_metadata"]["distributed"])
        except Exception as e:  # the others still gather: rank 0 reports this rank's failure
            mine = f"rank {info.rank}: {e}"
        try:
            got = _distributed.store_exchange("capture-set", info, mine, to_all=False, timeout=wait)
        except TimeoutError as e:
            log.error("llm_instrumentation: no capture-set manifest written: %s (build it later: "
                      "python -m llm_instrumentation.capture_set build)", e)
            return None
        if got is None:  # not rank 0
            return None
        gathered: List[Any] = got
        bad = [g for g in gathered if isinstance(g, str)]
        if bad:
            log.error("llm_instrumentation: no capture-set manifest written: %s", "; ".join(bad))
            return None
        mdir = os.path.dirname(out)
        entries = [dict(g[0], stream=_stream_ref(g[0]["stream"], mdir)) for g in gathered]
        m = assemble(entries, {g[0]["rank"]: g[1] for g in gathered})
        check(m, mdir, open_streams=False)
        return write(out, m)
    if info.rank != 0:
        return None
    if not _distributed.per_rank_enabled():
        log.warning("llm_instrumentation: no capture-set manifest written: without a process group rank 0 finds "
                    "the other ranks' streams by their per-rank names, which %s=0 turned off (build it later: "
                    "python -m llm_instrumentation.capture_set build)", _distributed.OPT_OUT_ENV)
        return None
    names = [_distributed.rank_path(_distributed._RANKED.sub("", os.path.splitext(stream_path)[0])
                                    + os.path.splitext(stream_path)[1],
                                    _distributed.RankInfo(r, info.world_size, None, None, "", "env"))
             for r in range(info.world_size)]
    deadline = time.monotonic() + wait
    while not all(_ended(n) for n in names):
        if time.monotonic() > deadline:
            missing = [n for n in names if not _ended(n)]
            log.error("llm_instrumentation: no capture-set manifest written: after %.0f s these ranks' streams had "
                      "not ended: %s (build it later: python -m llm_instrumentation.capture_set build)", wait, missing)
            return None
        time.sleep(0.2)
    return write(out, build(names, out))


# ----- reading: whole tensors (D5) -----------------------------------------------------------------


class Record(NamedTuple):
    """One record of a capture set: a whole tensor (or, with ``whole=False``, one stored piece).

    Attributes:
        step, forward, name: as in the streams.
        dp_rank, pp_stage: the rank group it comes from.
        tensor: a ``torch.Tensor`` (stitched when sharded).
        tp_rank: the tensor-parallel rank of a piece or of a ``local`` record of a tp rank;
            None for a whole tensor (stitched, replicated, or with tp_size 1).
        shard: a piece's shard descriptor (``whole=False``), else None.
    """

    step: int
    forward: int
    name: str
    dp_rank: int
    pp_stage: int
    tensor: Any
    tp_rank: Optional[int] = None
    shard: Optional[Dict[str, Any]] = None


def piece_order(name: str, pieces: Sequence[Tuple[Dict[str, Any], Sequence[int]]]) -> List[int]:
    """Check that pieces ``[(shard descriptor, stored shape), ...]`` make one whole tensor and
    return their indices in offset order.

    Raises:
        CaptureSetError: pieces that disagree (axis, full shape, other axes), a gap or an
            overlap along the axis, or a tensor not covered to its end.
    """
    d0 = pieces[0][0]
    axis: Any = d0.get("axis")
    full: Any = d0.get("full_shape")
    if not _int(axis) or not isinstance(full, list) or not 0 <= axis < len(full):
        raise CaptureSetError(f"{name}: bad shard descriptor {d0}")
    order = sorted(range(len(pieces)), key=lambda i: pieces[i][0].get("offset", -1))
    pos = 0
    for i in order:
        d, shape = pieces[i][0], list(pieces[i][1])
        if d.get("axis") != axis or d.get("full_shape") != full:
            raise CaptureSetError(f"{name}: pieces disagree: {d} and {d0}")
        if len(shape) != len(full) or any(shape[j] != full[j] for j in range(len(full)) if j != axis):
            raise CaptureSetError(f"{name}: a piece of shape {shape} is no piece of {full} along axis {axis}")
        off: Any = d.get("offset")
        if off != pos:
            what = "missing" if _int(off) and off > pos else "overlapping"
            raise CaptureSetError(f"{name}: piece {what} at offset {pos} along axis {axis} (next piece starts at {off})")
        pos += shape[axis]
    if pos != full[axis]:
        raise CaptureSetError(f"{name}: pieces cover [0, {pos}) of {full[axis]} along axis {axis}: piece missing")
    return order


def stitch(name: str, pieces: List[Tuple[Dict[str, Any], Any]]) -> Any:
    """The whole tensor from its pieces ``[(shard descriptor, torch.Tensor), ...]``:
    ``torch.cat`` along the axis in offset order, exact.

    Raises:
        CaptureSetError: as :func:`piece_order`: never a short tensor.
    """
    import torch

    order = piece_order(name, [(d, tuple(t.shape)) for d, t in pieces])
    return torch.cat([pieces[i][1] for i in order], dim=pieces[0][0]["axis"])


class CaptureSet:
    """The streams of one job, read together. Use :func:`open_capture_set`.

    Attributes:
        manifest: the manifest (loaded, or built from the streams given).
        ranks: the open streams, in rank order.
    """

    def __init__(self, manifest: Dict[str, Any], manifest_dir: Optional[str],
                 storage_options: Optional[Dict[str, Any]] = None) -> None:
        self.manifest = manifest
        mdir = manifest_dir
        self.ranks: List[StreamReader] = []
        try:
            for e in manifest["ranks"]:
                r = open_stream(stream_location(e["stream"], mdir), storage_options)
                self.ranks.append(r)
        except BaseException:
            self.close()
            raise
        self.layout = manifest["layout"]

    def groups(self) -> List[Tuple[int, int]]:
        """The (dp_rank, pp_stage) groups, sorted."""
        return sorted({(e["dp_rank"], e["pp_stage"]) for e in self.manifest["ranks"]})

    def _members(self, dp_rank: int, pp_stage: int) -> List[Tuple[int, StreamReader]]:
        out = [(e["tp_rank"], self.ranks[i]) for i, e in enumerate(self.manifest["ranks"])
               if e["dp_rank"] == dp_rank and e["pp_stage"] == pp_stage]
        return sorted(out, key=lambda x: x[0])

    def _group_records(self, dp_rank: int, pp_stage: int, names: Optional[Sequence[str]],
                       whole: bool) -> Iterator[Record]:
        """The records of one (dp, pp) group, in (step, forward, name) order."""
        keyed: Dict[Tuple[int, int, str, int], List[Tuple[int, Tensor]]] = {}
        for tp_rank, r in self._members(dp_rank, pp_stage):
            seen: Dict[Tuple[int, int, str], int] = {}
            for t in r:
                if names is not None and t.name not in names:
                    continue
                k3 = (t.step, t.forward, t.name)
                n = seen.get(k3, 0)
                seen[k3] = n + 1
                keyed.setdefault((t.step, t.forward, t.name, n), []).append((tp_rank, t))
        for key in sorted(keyed):
            step, fwd, name, _ = key
            got = keyed[key]
            shards = [(tp, t) for tp, t in got if isinstance(t.meta, dict) and isinstance(t.meta.get("shard"), dict)]
            if shards:
                if len(shards) != len(got):
                    raise CaptureSetError(f"{name} (step {step}, forward {fwd}, dp_rank {dp_rank}, pp_stage {pp_stage}): "
                                          f"some tp ranks stored it sharded, some whole")
                if not whole:
                    for tp, t in shards:
                        yield Record(step, fwd, name, dp_rank, pp_stage, t.tensor(), tp, t.meta["shard"])
                    continue
                tp_size = shards[0][1].meta["shard"].get("tp_size")
                try:
                    whole_t = stitch(name, [(t.meta["shard"], t.tensor()) for _, t in shards])
                except CaptureSetError as e:
                    raise CaptureSetError(f"{e} (record step {step}, forward {fwd}, dp_rank {dp_rank}, pp_stage "
                                          f"{pp_stage}; pieces from tp ranks {[tp for tp, _ in shards]} of "
                                          f"{tp_size})") from None
                yield Record(step, fwd, name, dp_rank, pp_stage, whole_t)
                continue
            replicas = [(tp, t) for tp, t in got if isinstance(t.meta, dict) and isinstance(t.meta.get("replica"), dict)]
            if replicas:
                tp, t = min(replicas, key=lambda x: x[0])
                if tp != 0:
                    raise CaptureSetError(f"{name} (step {step}, forward {fwd}, dp_rank {dp_rank}, pp_stage "
                                          f"{pp_stage}): replicated, but tp rank 0's copy is missing")
                yield Record(step, fwd, name, dp_rank, pp_stage, t.tensor())
                continue
            if len(got) == 1 and got[0][0] == 0:
                yield Record(step, fwd, name, dp_rank, pp_stage, got[0][1].tensor())
                continue
            for tp, t in got:  # local records of tp ranks: each its own
                yield Record(step, fwd, name, dp_rank, pp_stage, t.tensor(), tp)

    def records(self, names: Optional[Sequence[str]] = None, whole: bool = True) -> Iterator[Record]:
        """Every record of every rank, in (step, forward) order; ties: dp_rank, pp_stage, name.

        Args:
            names: only these record names (None: all).
            whole: stitch sharded names (True), or yield the stored pieces with their
                descriptor (``Record.shard``).

        Yields:
            :class:`Record` s. Sharded tensors are stitched exactly (``torch.cat`` of the
            pieces in offset order); a missing or overlapping piece raises
            :class:`CaptureSetError` naming the record.
        """
        import heapq

        its = [self._group_records(dp, pp, names, whole) for dp, pp in self.groups()]
        yield from heapq.merge(*its, key=lambda rec: (rec.step, rec.forward, rec.dp_rank, rec.pp_stage, rec.name))

    def tensors(self, name: str, dp_rank: int = 0) -> List[Any]:
        """The whole tensors of record ``name`` of data-parallel replica ``dp_rank``, in order
        (from whichever pipeline stage holds it)."""
        return [rec.tensor for rec in self.records([name]) if rec.dp_rank == dp_rank]

    def tokens(self, dp_rank: int = 0) -> List[Dict[str, Any]]:
        """The recorded tokens of replica ``dp_rank``: those of its lowest rank that has any."""
        for i, e in enumerate(self.manifest["ranks"]):
            if e["dp_rank"] == dp_rank and e["tokens"][1] > e["tokens"][0]:
                return [{"token_index": pk.step, **pk.meta}
                        for pk in self.ranks[i].packets(select=lambda n, t: t == TOKEN)]
        return []

    def close(self) -> None:
        for r in self.ranks:
            r.close()

    def __enter__(self) -> "CaptureSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_capture_set(source: Union[PathLike, Sequence[PathLike]],
                     storage_options: Optional[Dict[str, Any]] = None) -> CaptureSet:
    """Open the streams of a distributed job as one set (docs/DISTRIBUTED.md D5).

    Args:
        source: a manifest (``*.json``, checked as :func:`load` does), or the streams: a
            glob, a list of paths, or ``s3://`` URLs (a manifest is built from them).
        storage_options: fsspec options for URLs.

    Returns:
        the :class:`CaptureSet`.

    Example:
        >>> with open_capture_set("cap.capture-set.json") as cs:  # doctest: +SKIP
        ...     for rec in cs.records():
        ...         print(rec.step, rec.forward, rec.name, rec.dp_rank, rec.tensor.shape)
    """
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".json"):
        p = os.fspath(source)
        m = load(p, storage_options=storage_options)
        mdir: Optional[str] = p.rsplit("/", 1)[0] if is_url(p) else os.path.dirname(os.path.abspath(p))
    else:
        m, mdir = build(source, None, storage_options), None
    return CaptureSet(m, mdir, storage_options)


# ----- command line -----------------------------------------------------------------------------


def _inspect(m: Dict[str, Any]) -> str:
    lay = m["layout"]
    lines = [f"capture set {m['job_id']}: {m['world_size']} ranks, tp {lay['tp_size']} × pp {lay['pp_size']} × "
             f"dp {lay['dp_size']}, created {m.get('created')}"]
    for e in m["ranks"]:
        kinds: Dict[str, int] = {}
        for v in e["modules"].values():
            kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
        lines.append(f"  rank {e['rank']:>4} host {e['host']} tp {e['tp_rank']} pp {e['pp_stage']} dp {e['dp_rank']} "
                     f"{e.get('role', '?'):<7} "
                     f"{e['status']:<9} tokens [{e['tokens'][0]}, {e['tokens'][1]}) forwards {e['forwards']} "
                     f"packets {e['packets']} bytes {e['bytes']} modules "
                     f"{', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}  {e['stream']}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llm_instrumentation.capture_set",
                                 description="Build or inspect a capture-set manifest (docs/DISTRIBUTED.md).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="rebuild a manifest from the ranks' streams")
    b.add_argument("streams", nargs="+", help="stream paths, globs or s3:// URLs")
    b.add_argument("-o", "--output", required=True, help="the manifest to write")
    i = sub.add_parser("inspect", help="check a manifest and print the set")
    i.add_argument("manifest")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "build":
            m = build(a.streams, a.output)
            print(write(a.output, m))
            return 0
        m = load(a.manifest)
        print(json.dumps(m, indent=1) if a.json else _inspect(m))
        return 0
    except (CaptureSetError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
