"""Reading a vLLM capture directory back by request (docs/VLLM.md 4).

Each worker's stream holds per step one ``vllm.rows`` record (which request and position
each row is), the captured modules' records of the same rows, and a ``vllm.sampled`` record
of the step's generated tokens; all of one step share its ``forward`` number. A request is
put back together from every step that holds rows of it, in position order.
"""

from __future__ import annotations

import glob
import os
import re
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import torch

from ._worker import FINISHED, INDEX_FORMAT, ROWS, SAMPLED

PathArg = Union[str, "os.PathLike[str]"]

_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


class RequestCapture(Dict[str, "torch.Tensor"]):
    """One request's capture: ``{module_name: tensor[positions, ...]}`` (rows in position
    order, one per position that had a forward pass), with what says which rows those are.

    Attributes:
        request_id: the id ``RequestOutput.request_id`` carries.
        engine_request_id: the engine's internal id (the stream's).
        token_ids: every token of the request, prompt then generated (int64).
        prompt_len: how many of ``token_ids`` are the prompt.
        positions: the position of each row of the module tensors (int64, increasing): the
            prompt and every generated token but the last, less ``missing``.
        missing: positions before the last row with no forward pass here: prompt tokens
            served from vLLM's prefix cache (docs/VLLM.md 5), or steps lost to a dropped or
            cut-off record.
        recomputed: positions computed more than once (preemption with recompute); the
            last computation is kept.
        streams: the stream files read.
        finished: why the engine finished the request, from the stream's ``vllm.finished``
            record: ``"length_capped"``, ``"stopped"`` (a stop or EOS token), ``"aborted"``
            (the client aborted or disconnected; also a stop *string*, which vLLM's front end
            turns into an abort), ``"error"``, ... (docs/VLLM.md 3); None when the stream has
            no such record (the engine was killed, or still runs, before telling the worker).
    """

    request_id: str
    engine_request_id: str
    token_ids: "torch.Tensor"
    prompt_len: int
    positions: "torch.Tensor"
    missing: List[int]
    recomputed: List[int]
    streams: List[str]
    finished: Optional[str]

    @property
    def aborted(self) -> bool:
        """Whether vLLM finished the request by an abort (``finished == "aborted"``)."""
        return self.finished == "aborted"


def streams(source: PathArg) -> List[str]:
    """The streams of a vLLM capture: a directory's ``*.strap`` files, or the ranks' streams
    of a capture set's manifest (``*.capture-set.json``, checked as
    :func:`llm_instrumentation.capture_set.load` checks it: every stream there, of its rank
    and session).

    Raises:
        FileNotFoundError: no stream.
        CaptureSetError: a manifest that fails its checks.
    """
    src = os.fspath(source)
    if os.path.isfile(src) and src.endswith(".json"):
        from .. import capture_set

        m = capture_set.load(src)
        mdir = os.path.dirname(os.path.abspath(src))
        return [capture_set.stream_location(e["stream"], mdir) for e in m["ranks"]]
    paths = sorted(glob.glob(os.path.join(src, "*.strap")))
    if not paths:
        raise FileNotFoundError(f"no .strap streams in {src}")
    return paths


def _open(path: str) -> Any:
    from ..stream import open_stream

    r = open_stream(path)
    meta = (getattr(r, "metadata", None) or {}).get("client_metadata", {}).get("vllm")
    if not isinstance(meta, dict):
        r.close()
        return None
    if meta.get("index_format") != INDEX_FORMAT:
        r.close()
        raise ValueError(f"{path}: vLLM index format {meta.get('index_format')}, this reader reads {INDEX_FORMAT}")
    return r


def _external(internal: str, randomized: bool) -> str:
    return _SUFFIX.sub("", internal) if randomized else internal


def _index_metas(r: Any) -> Iterator[Tuple[str, Dict[str, Any], int]]:
    from ..stream import TENSOR

    for pk in r.packets(select=lambda n, t: t == TENSOR and n in (ROWS, SAMPLED)):
        if pk.part_offset == 0:
            yield pk.name, pk.meta, pk.forward


#: (internal id, stream) → the forward passes whose rows hold the request there
Forwards = Dict[Tuple[str, str], Set[int]]


def _scan(directory: PathArg) -> Tuple[Dict[str, Dict[str, List[str]]], Forwards]:
    """external id → internal id → streams holding rows of it; and the forward passes of
    each request's rows in each stream (reading only the index records' metadata)."""
    found: Dict[str, Dict[str, List[str]]] = {}
    forwards: Forwards = {}
    for path in streams(directory):
        r = _open(path)
        if r is None:
            continue
        with r:
            randomized = bool(r.metadata["client_metadata"]["vllm"].get("request_id_randomized", True))
            for name, meta, fwd in _index_metas(r):
                if name != ROWS:
                    continue
                for rid in meta.get("requests", ()):
                    paths = found.setdefault(_external(rid, randomized), {}).setdefault(rid, [])
                    if path not in paths:
                        paths.append(path)
                    forwards.setdefault((rid, path), set()).add(fwd)
    return found, forwards


def _scan_ids(directory: PathArg) -> Dict[str, Dict[str, List[str]]]:
    """external id → internal id → streams holding rows of it."""
    return _scan(directory)[0]


def list_requests(directory: PathArg) -> List[str]:
    """The requests captured in a directory, as ``RequestOutput.request_id`` names them, in
    the order their first rows were written.

    Args:
        directory: ``STRAP_VLLM_OUTPUT`` of the engine(s), or the capture-set manifest of
            one engine's workers (``<stem>.capture-set.json``: only its streams are read).

    Returns:
        request ids.

    Example:
        >>> for rid in list_requests("/data/caps"):
        ...     acts = load_request("/data/caps", rid)
    """
    return list(_scan_ids(directory))


class _Assembly:
    """One request's rows as the streams are read (:func:`load_request`, :func:`iter_requests`)."""

    def __init__(self, internal: str, external: str, paths: List[str]) -> None:
        self.internal, self.external, self.paths = internal, external, paths
        self.prompt: Optional[List[int]] = None
        self.generated: Dict[int, int] = {}
        self.input_ids: Dict[int, int] = {}
        self.per_module: Dict[str, Dict[int, "torch.Tensor"]] = {}
        self.recomputed: Set[int] = set()
        self.finished: Optional[str] = None
        self.finished_tokens = -1
        # Positions the stream being read computed: one computed twice in one stream was
        # recomputed (preemption); the same positions in two streams are two pipeline
        # stages' layers.
        self.here: Set[int] = set()
        self.rows: Optional[Tuple[int, int, List[int]]] = None  # this step's (start, count, positions)

    def step_rows(self, t: Any, i: int) -> None:
        """The ``vllm.rows`` record ``t`` of a step, this request at index ``i`` of its requests."""
        counts = t.meta["counts"]
        start, count = sum(counts[:i]), counts[i]
        block = t.tensor()[start:start + count]
        pos = block[:, 0].tolist()
        for p, tok in zip(pos, block[:, 1].tolist()):
            if p in self.here:
                self.recomputed.add(p)
            self.here.add(p)
            if tok >= 0 or p not in self.input_ids:  # -1: the model was given no token ids
                self.input_ids[p] = tok
        new = (t.meta.get("new") or {}).get(self.internal)
        if new is not None and self.prompt is None:
            self.prompt = list(new["prompt"])
        self.rows = (start, count, pos)

    def module(self, name: str, x: "torch.Tensor") -> None:
        """A captured module's record of the step whose rows :meth:`step_rows` took."""
        assert self.rows is not None
        start, count, pos = self.rows
        rows = x[start:start + count]
        d = self.per_module.setdefault(name, {})
        for k, p in enumerate(pos):
            d[p] = rows[k]

    def build(self) -> RequestCapture:
        import torch

        internal = self.internal
        if self.prompt is None:
            raise ValueError(f"request {internal!r}: its first rows (with the prompt) are not in the streams")
        tokens = list(self.prompt)
        for p in sorted(self.generated):
            if p != len(tokens):
                raise ValueError(f"request {internal!r}: generated token at position {p}, expected {len(tokens)}")
            tokens.append(self.generated[p])
        last = len(tokens) - 2  # the last token never had a forward pass
        input_ids = self.input_ids
        if len(tokens) in input_ids:
            # Rows past the sampled tokens: a stream without vllm.sampled records for them (a
            # runner whose sampled tokens this plugin does not see, e.g. async scheduling,
            # docs/VLLM.md 5). The rows' input ids are the tokens; the last of them had a forward.
            while len(tokens) in input_ids:
                tokens.append(input_ids[len(tokens)])
            last = len(tokens) - 1
        for p, tok in input_ids.items():
            if tok >= 0 and p <= last + 1 and p < len(tokens) and tokens[p] != tok:
                raise ValueError(f"request {internal!r}: position {p} was computed with token {tok}, "
                                 f"the request's token there is {tokens[p]}")
        # A position is kept where every module has it (a record dropped under backpressure
        # "drop" leaves it out of that step's modules: then it counts as missing).
        per_module = self.per_module
        kept = sorted(p for p in input_ids if p <= last and all(p in d for d in per_module.values()))
        out = RequestCapture()
        for name, d in per_module.items():
            out[name] = torch.stack([d[p] for p in kept]) if kept else torch.empty(0)
        out.request_id = self.external
        out.engine_request_id = internal
        out.token_ids = torch.tensor(tokens, dtype=torch.int64)
        out.prompt_len = len(self.prompt)
        out.positions = torch.tensor(kept, dtype=torch.int64)
        top = kept[-1] if kept else -1
        have = set(kept)
        out.missing = [p for p in range(top) if p not in have]
        out.recomputed = sorted(p for p in self.recomputed if p <= last)
        out.streams = list(self.paths)
        out.finished = self.finished
        # The worker counted the request's tokens when it learnt of the finish; with
        # vllm.sampled records (not under async scheduling) the stream must hold exactly those.
        if self.generated and self.finished_tokens >= 0 and self.finished_tokens != len(tokens):
            raise ValueError(f"request {internal!r}: finished with {self.finished_tokens} tokens, the stream "
                             f"holds {len(tokens)}")
        return out


def _rows_of(t: Any, wanted: Dict[str, _Assembly]) -> Iterator[Tuple[int, _Assembly, Any]]:
    """(row, assembly, the record's tensor) for each row of a ``vllm.sampled`` or
    ``vllm.finished`` record ``t`` that belongs to a wanted request; the tensor is decoded only
    when one does."""
    who = t.meta.get("requests", [])
    if not any(rid in wanted for rid in who):
        return
    data = t.tensor()
    for k, rid in enumerate(who):
        hit = wanted.get(rid)
        if hit is not None:
            yield k, hit, data


def _read(path: str, wanted: Dict[str, _Assembly], want: Optional[Set[str]],
          pop_finished: bool = False, forwards: Optional[Set[int]] = None) -> Iterator[_Assembly]:
    """One pass over one stream, feeding every request of ``wanted`` (internal id →
    assembly); with ``pop_finished``, a request leaves ``wanted`` and is yielded at its
    ``vllm.finished`` record (nothing of it follows in the stream), mid-pass. ``forwards``:
    read only the steps of these forward passes (and every ``vllm.finished`` record), which
    an indexed stream does without reading the rest."""
    r = _open(path)
    if r is None:
        return
    for a in wanted.values():
        a.here = set()
    with r:
        cur_fwd: Optional[int] = None
        active: List[_Assembly] = []  # the requests with rows in the current step
        tensors = iter(r) if forwards is None else \
            r.tensors_where(lambda name, fwd: fwd in forwards or name == FINISHED)
        for t in tensors:
            if t.name == ROWS:
                cur_fwd = t.forward
                for a in active:
                    a.rows = None
                active = []
                for i, rid in enumerate(t.meta.get("requests", [])):
                    hit = wanted.get(rid)
                    if hit is not None:
                        hit.step_rows(t, i)
                        active.append(hit)
            elif t.name == SAMPLED:
                for k, hit, data in _rows_of(t, wanted):
                    hit.generated[int(data[k, 0])] = int(data[k, 1])
            elif t.name == FINISHED:
                for k, hit, data in list(_rows_of(t, wanted)):
                    rid = hit.internal
                    hit.finished = str(t.meta["reasons"][k])
                    hit.finished_tokens = int(data[k])
                    if pop_finished:
                        hit.rows = None
                        if hit in active:
                            active.remove(hit)
                        yield wanted.pop(rid)
            elif active and t.forward == cur_fwd and (want is None or t.name in want):
                x = t.tensor()
                for a in active:
                    a.module(t.name, x)


def _resolve(ids: Dict[str, Dict[str, List[str]]], request_id: str,
             directory: PathArg) -> Tuple[str, str, List[str]]:
    """(internal id, external id, streams) of ``request_id`` (either kind of id)."""
    if request_id in ids:
        cands = ids[request_id]
        if len(cands) > 1:
            raise ValueError(f"request id {request_id!r} names {len(cands)} engine requests in "
                             f"{os.fspath(directory)}: {sorted(cands)}; pass one of them")
        internal, paths = next(iter(cands.items()))
        return internal, request_id, paths
    for ext, cands in ids.items():
        if request_id in cands:
            return request_id, ext, cands[request_id]
    raise KeyError(f"no request {request_id!r} in {os.fspath(directory)}")


def load_request(directory: PathArg, request_id: str, modules: Optional[Sequence[str]] = None) -> RequestCapture:
    """One request's captured modules, rows in position order, and its token ids.

    Reads the index records of every stream, then only the steps that hold the request's
    rows (an indexed stream, i.e. one whose capture ended, skips the rest without reading
    it; a stream cut short is read whole); to read many requests, iterate
    :func:`iter_requests`, which reads each stream once for all of them.

    Args:
        directory: ``STRAP_VLLM_OUTPUT`` of the engine(s), or a capture-set manifest
            (:func:`list_requests`).
        request_id: the id ``RequestOutput.request_id`` carries (or the engine's internal id).
        modules: module names to load (default: every captured one).

    Returns:
        a :class:`RequestCapture`: ``{module_name: tensor[rows, ...]}`` with ``positions``,
        ``token_ids``, ``prompt_len``, ``missing``, ``recomputed``.

    Raises:
        KeyError: no such request.
        ValueError: the id names requests of more than one engine run (pass the internal id
            from the message), or the stream's rows disagree with its tokens.
    """
    ids, forwards = _scan(directory)
    internal, external, paths = _resolve(ids, request_id, directory)
    a = _Assembly(internal, external, paths)
    want = set(modules) if modules is not None else None
    for path in paths:
        for _ in _read(path, {internal: a}, want, forwards=forwards.get((internal, path), set())):
            pass
    return a.build()


def iter_requests(directory: PathArg, modules: Optional[Sequence[str]] = None) -> Iterator[RequestCapture]:
    """Every captured request of a directory, as :func:`load_request` gives each, reading
    each stream once (``load_request`` per request reads the streams once per request).

    Requests whose rows are in one stream (an engine of one worker, or tensor parallelism,
    where rank 0 stores) are yielded as their ``vllm.finished`` record is read, the rest at
    the end of their stream, so memory holds the requests in flight. Requests spread over
    several streams (pipeline stages, each storing its layers) are yielded once all their
    streams are read: memory then holds all of them; pass ``modules`` to bound it.

    Args:
        directory: ``STRAP_VLLM_OUTPUT`` of the engine(s), or a capture-set manifest.
        modules: module names to load (default: every captured one).

    Yields:
        a :class:`RequestCapture` per request, ``request_id`` as ``RequestOutput`` carries it.

    Raises:
        ValueError: as :func:`load_request`, for the request concerned.

    Example:
        >>> for req in iter_requests("/data/caps", modules=["model.layers.4"]):
        ...     save(req.request_id, req["model.layers.4"])  # doctest: +SKIP
    """
    want = set(modules) if modules is not None else None
    groups: Dict[Tuple[str, ...], Dict[str, _Assembly]] = {}
    ids, forwards = _scan(directory)
    for external, cands in ids.items():
        for internal, paths in cands.items():
            groups.setdefault(tuple(paths), {})[internal] = _Assembly(internal, external, list(paths))
    for group, wanted in groups.items():
        if len(group) == 1:
            for a in _read(group[0], wanted, want, pop_finished=True):
                yield a.build()
        else:
            # Several streams (pipeline stages, or the segments a request ran across): of each,
            # only the steps holding these requests' rows (an indexed stream skips the rest).
            for path in group:
                fw: Set[int] = set()
                for rid in wanted:
                    fw |= forwards.get((rid, path), set())
                for _ in _read(path, wanted, want, forwards=fw):
                    pass
        for a in wanted.values():  # not finished in the stream (still running, or killed)
            yield a.build()
