"""A vLLM capture as :class:`~llm_instrumentation.data.ActivationDataset` rows: per request,
in position order (docs/VLLM.md 4, docs/ANALYSIS.md 2).

A vLLM worker's module records hold one step's flat batch: rows of several requests, each
at its own positions (docs/VLLM.md 3). Read as an ordinary capture, a row's position and
token would be wrong. Here the step index (``vllm.rows``) says which request and position
each row is, and the dataset's unit of work becomes one request's rows of one module:
``shape [positions, d]``, rows in position order, one per position that had a forward pass
(a position computed twice, by a preemption with recompute, keeps its last computation, as
:func:`~llm_instrumentation.vllm.load_request` does). The row metadata says, per row:
``batch`` the request (``ActivationDataset.vllm_requests[batch]`` its id), ``position`` and
``token_index`` its position in the request, ``token_id`` the token there, ``step``,
``forward`` and ``stream`` where the row was stored.

The index records themselves (``vllm.rows``, ``vllm.sampled``, ``vllm.finished``) are never
dataset modules.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ._worker import FINISHED, INDEX_FORMAT, ROWS, SAMPLED

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..data import ActivationDataset, Unit

#: The records that index a step, never rows of a module.
INDEX_RECORDS = (ROWS, SAMPLED, FINISHED)
#: Decoded step tensors an iteration keeps, at most (bytes): a step's tensor holds rows of
#: every request of the step, and the units of one module are read one request after another.
CACHE_BYTES = 256 << 20


class StepCache(collections.OrderedDict):
    """Decoded step tensors of one iteration, ``(stream, record name, ordinal) → tensor``,
    least recently used first, with their bytes counted (:data:`CACHE_BYTES` at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0


@dataclasses.dataclass
class VLLMRequest:
    """A request of a vLLM capture dataset.

    Attributes:
        request_id: the id ``RequestOutput.request_id`` carries.
        engine_request_id: the engine's internal id (the stream's).
        token_ids: the token at each position that has a row, by position.
    """

    request_id: str
    engine_request_id: str
    token_ids: Dict[int, int]


def is_vllm(metadata: Dict[str, Any]) -> bool:
    """Whether a stream header is a vLLM worker's (``client_metadata.vllm``)."""
    cm = metadata.get("client_metadata")
    return isinstance(cm, dict) and isinstance(cm.get("vllm"), dict)


def select(names: List[str], patterns: Optional[List[str]]) -> List[str]:
    """The module names of a vLLM stream that ``patterns`` select (names or fnmatch
    patterns; None: all), the index records never."""
    names = [n for n in names if n not in INDEX_RECORDS]
    if patterns is None:
        return names
    return [n for n in names if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]


def plan(ds: "ActivationDataset", patterns: Optional[List[str]], readers: List[Any], unit_cls: Any,
         info_cls: Any) -> None:
    """Fill ``ds.units``, ``ds.modules``, ``ds.vllm_requests`` (and the per-stream facts)
    for the vLLM streams ``readers`` (open, in ``ds.paths`` order).

    Args:
        ds: the dataset being built.
        patterns: module names or patterns (None: every module).
        readers: the open streams.
        unit_cls, info_cls: the dataset's ``Unit`` and per-stream facts classes (passed in:
            this module does not import the dataset's, which imports it).

    Raises:
        ValueError: a stream of another index format, a selected module whose records are not
            ``[rows, d]``, a module record without the step index of its forward pass, or no
            module matching ``patterns``.
    """
    from ..stream import DROP, TENSOR, TOKEN
    from ._reader import _external

    assert ds._handles is not None
    mod_index: Dict[str, int] = {}
    requests: Dict[str, int] = {}
    reqs: List[VLLMRequest] = []
    # (request, module) -> position -> (stream, ordinal, row, step, forward)
    where: Dict[Tuple[int, int], Dict[int, Tuple[int, int, int, int, int]]] = {}
    lossy_of: Dict[Tuple[int, int], bool] = {}
    dtype_of: Dict[int, str] = {}
    width_of: Dict[int, int] = {}
    for si, r in enumerate(readers):
        path = ds.paths[si]
        vm = r.metadata["client_metadata"]["vllm"]
        if vm.get("index_format") != INDEX_FORMAT:
            raise ValueError(f"{path}: vLLM index format {vm.get('index_format')}, this reader reads {INDEX_FORMAT}")
        randomized = bool(vm.get("request_id_randomized", True))
        info = info_cls(path)
        info.metadata = r.metadata
        chosen = select(r.names(), patterns)
        sel = set(chosen) | {ROWS}
        groups: Dict[str, List[Any]] = {n: [] for n in sel}
        pending: Dict[str, List[Any]] = {}
        for pk in r.packets(select=lambda n, t: t != TENSOR or n in sel):
            if pk.type == TENSOR:
                ds._group(pk, pending, groups, info)
            elif pk.type == TOKEN:
                m = pk.meta
                info.tokens[pk.step] = (int(m.get("token_id", -1)), int(m.get("position", pk.step)),
                                        str(m.get("text", "")))
            elif pk.type == DROP and select([pk.name], patterns):
                info.drops[pk.name] = info.drops.get(pk.name, 0) + 1
        for name in pending:
            info.incomplete[name] = info.incomplete.get(name, 0) + 1
        info.truncated_at = r.truncated_at
        # Each step's rows: forward -> [(request, position, token id)] in row order.
        steps: Dict[int, List[Tuple[int, int, int]]] = {}
        for t in groups.pop(ROWS):
            ids = t.meta.get("requests", [])
            counts = t.meta.get("counts", [])
            data = t.tensor().tolist()
            if sum(counts) != len(data) or len(ids) != len(counts):
                raise ValueError(f"{path}: vllm.rows of forward {t.forward}: counts {counts} for {len(data)} rows")
            rows: List[Tuple[int, int, int]] = []
            k = 0
            for rid, c in zip(ids, counts):
                ext = _external(rid, randomized)
                ri = requests.get(rid)
                if ri is None:
                    ri = requests[rid] = len(reqs)
                    reqs.append(VLLMRequest(ext, rid, {}))
                for pos, tok in data[k:k + c]:
                    rows.append((ri, int(pos), int(tok)))
                    if tok >= 0 or int(pos) not in reqs[ri].token_ids:  # -1: no token ids given
                        reqs[ri].token_ids[int(pos)] = int(tok)
                k += c
            steps[t.forward] = rows
        for name in chosen:
            mi = mod_index.setdefault(name, len(mod_index))
            ds._handles[(si, name)] = groups[name]
            for k, t in enumerate(groups[name]):
                shape = tuple(t.shape)
                of_step = steps.get(t.forward)
                if of_step is None:
                    raise ValueError(f"{path}: {name} forward {t.forward} has no vllm.rows record: the stream does "
                                     "not say which request each row is")
                if len(shape) != 2 or shape[0] != len(of_step):
                    raise ValueError(f"{path}: {name} forward {t.forward}: shape {shape} is not "
                                     f"[{len(of_step)} rows, d]")
                dtype_of.setdefault(mi, t.dtype)
                width_of.setdefault(mi, shape[1])
                lossy = ds._unit(si, mi, k, t).lossy
                for row, (ri, pos, _) in enumerate(of_step):
                    # Later computations of a position (a recompute after preemption) replace
                    # earlier ones: the streams are read in file order.
                    where.setdefault((ri, mi), {})[pos] = (si, k, row, t.step, t.forward)
                    if lossy:
                        lossy_of[(ri, mi)] = True
        ds.streams.append(info)
    units: List[Any] = []
    for (ri, mi), at in where.items():
        positions = sorted(at)
        first = at[positions[0]]
        runs: List[Tuple[int, int, int, int]] = []  # (stream, ordinal, first row, rows)
        for p in positions:
            si, k, row = at[p][:3]
            if runs and runs[-1][:2] == (si, k) and runs[-1][2] + runs[-1][3] == row:
                runs[-1] = (si, k, runs[-1][2], runs[-1][3] + 1)
            else:
                runs.append((si, k, row, 1))
        units.append(unit_cls(first[0], mi, ri, first[3], first[4], (len(positions), width_of[mi]), dtype_of[mi],
                          tuple(positions), lossy_of.get((ri, mi), False), request=ri, runs=tuple(runs)))
    # Module by module, each module's requests in the order they were first seen: the
    # requests of one step follow each other, so their step tensors are decoded once while
    # they stay in the iteration's cache.
    units.sort(key=lambda u: (u.module, u.request))
    ds.units = units
    ds.modules = list(mod_index)
    ds.vllm_requests = reqs
    if patterns is not None and not ds.modules:
        raise ValueError(f"no module of {ds.paths} matches {patterns}")


def rows_of(ds: "ActivationDataset", u: "Unit", opened: Dict[Tuple[int, str], List[Any]], readers: List[Any],
            cache: StepCache, decode: Any
            ) -> Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]:
    """One request's rows of one module, ``(activations [n, d], meta {key: [n]})``.

    Args:
        ds, u: the dataset and the unit (one request, one module).
        opened, readers: streams this iteration reopened (a worker sent the dataset).
        cache: decoded step tensors of this iteration, at most :data:`CACHE_BYTES`.
        decode: the dataset's tensor decoder (``Tensor`` → ``torch.Tensor``).
    """
    import torch

    assert u.runs is not None and u.positions is not None and u.request is not None and ds.vllm_requests is not None
    name = ds.modules[u.module]
    parts: List["torch.Tensor"] = []
    stream: List[int] = []
    step: List[int] = []
    forward: List[int] = []
    for si, k, first, n in u.runs:
        key = (si, name, k)
        x = cache.get(key)
        t = _stored(ds, si, name, k, opened, readers)
        if x is None:
            x = decode(t)
            cache[key] = x
            cache.nbytes += x.numel() * x.element_size()
            while cache.nbytes > CACHE_BYTES and len(cache) > 1:
                _, old = cache.popitem(last=False)
                cache.nbytes -= old.numel() * old.element_size()
        else:
            cache.move_to_end(key)
        parts.append(x.reshape(t.shape)[first:first + n])
        stream += [si] * n
        step += [t.step] * n
        forward += [t.forward] * n
    x = torch.cat(parts) if len(parts) > 1 else parts[0]
    if ds.dtype is not None:
        x = x.to(ds.dtype)
    pos = torch.tensor(u.positions, dtype=torch.int64)
    toks = ds.vllm_requests[u.request].token_ids
    n = len(u.positions)
    meta = {
        "stream": torch.tensor(stream, dtype=torch.int64),
        "module": torch.full((n,), u.module, dtype=torch.int64),
        "step": torch.tensor(step, dtype=torch.int64),
        "forward": torch.tensor(forward, dtype=torch.int64),
        "batch": torch.full((n,), u.request, dtype=torch.int64),
        "position": pos,
        "token_index": pos.clone(),
        "token_id": torch.tensor([toks[p] for p in u.positions], dtype=torch.int64),
        "lossy": torch.full((n,), u.lossy, dtype=torch.bool),
    }
    return x, meta


def _stored(ds: "ActivationDataset", si: int, name: str, k: int, opened: Dict[Tuple[int, str], List[Any]],
            readers: List[Any]) -> Any:
    """Tensor ``k`` of record ``name`` in stream ``si``: the handle from construction, or
    the stream reopened (a DataLoader worker that was sent the dataset)."""
    key = (si, name)
    if ds._handles is not None and key in ds._handles:
        return ds._handles[key][k]
    if key not in opened:
        r = ds._open(ds.paths[si])
        readers.append(r)
        opened[key] = r.tensors(name)
    return opened[key][k]


def sequence_runs(u: "Unit", ctx: int) -> List[Tuple[int, int]]:
    """``(first row, rows)`` of each whole sequence of ``ctx`` consecutive positions in one
    request's unit: a gap (positions with no forward pass, e.g. from the prefix cache) ends a
    run, and what is left of a run shorter than ``ctx`` is not a sequence."""
    assert u.positions is not None
    out: List[Tuple[int, int]] = []
    start = 0
    pos = u.positions
    for i in range(1, len(pos) + 1):
        if i == len(pos) or pos[i] != pos[i - 1] + 1:
            n = (i - start) // ctx
            out.extend((start + j * ctx, ctx) for j in range(n))
            start = i
    return out

