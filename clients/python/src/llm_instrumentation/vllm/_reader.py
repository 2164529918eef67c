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


def _index_metas(r: Any) -> Iterator[Tuple[str, Dict[str, Any]]]:
    from ..stream import TENSOR

    for pk in r.packets(select=lambda n, t: t == TENSOR and n in (ROWS, SAMPLED)):
        if pk.part_offset == 0:
            yield pk.name, pk.meta


def _scan_ids(directory: PathArg) -> Dict[str, Dict[str, List[str]]]:
    """external id → internal id → streams holding rows of it."""
    found: Dict[str, Dict[str, List[str]]] = {}
    for path in streams(directory):
        r = _open(path)
        if r is None:
            continue
        with r:
            randomized = bool(r.metadata["client_metadata"]["vllm"].get("request_id_randomized", True))
            for name, meta in _index_metas(r):
                if name != ROWS:
                    continue
                for rid in meta.get("requests", ()):
                    paths = found.setdefault(_external(rid, randomized), {}).setdefault(rid, [])
                    if path not in paths:
                        paths.append(path)
    return found


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


def load_request(directory: PathArg, request_id: str, modules: Optional[Sequence[str]] = None) -> RequestCapture:
    """One request's captured modules, rows in position order, and its token ids.

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
    import torch

    ids = _scan_ids(directory)
    internal: Optional[str] = None
    external = request_id
    paths: List[str] = []
    if request_id in ids:
        cands = ids[request_id]
        if len(cands) > 1:
            raise ValueError(f"request id {request_id!r} names {len(cands)} engine requests in "
                             f"{os.fspath(directory)}: {sorted(cands)}; pass one of them")
        internal, paths = next(iter(cands.items()))
    else:
        for ext, cands in ids.items():
            if request_id in cands:
                internal, paths, external = request_id, cands[request_id], ext
                break
    if internal is None:
        raise KeyError(f"no request {request_id!r} in {os.fspath(directory)}")
    want: Optional[Set[str]] = set(modules) if modules is not None else None

    prompt: Optional[List[int]] = None
    generated: Dict[int, int] = {}
    input_ids: Dict[int, int] = {}
    per_module: Dict[str, Dict[int, "torch.Tensor"]] = {}
    recomputed: Set[int] = set()
    finished: Optional[str] = None
    finished_tokens = -1
    for path in paths:
        r = _open(path)
        if r is None:
            continue
        # Positions this stream computed: one computed twice in one stream was recomputed
        # (preemption); the same positions in two streams are two pipeline stages' layers.
        here: Set[int] = set()
        with r:
            cur_fwd: Optional[int] = None
            cur_rows: Optional[Tuple[int, int, List[int]]] = None  # (start, count, positions)
            for t in r:
                if t.name == ROWS:
                    cur_fwd, cur_rows = t.forward, None
                    reqs = t.meta.get("requests", [])
                    if internal not in reqs:
                        continue
                    i = reqs.index(internal)
                    counts = t.meta["counts"]
                    start, count = sum(counts[:i]), counts[i]
                    block = t.tensor()[start:start + count]
                    pos = block[:, 0].tolist()
                    for p, tok in zip(pos, block[:, 1].tolist()):
                        if p in here:
                            recomputed.add(p)
                        here.add(p)
                        if tok >= 0 or p not in input_ids:  # -1: the model was given no token ids
                            input_ids[p] = tok
                    new = (t.meta.get("new") or {}).get(internal)
                    if new is not None and prompt is None:
                        prompt = list(new["prompt"])
                    cur_rows = (start, count, pos)
                elif t.name == SAMPLED:
                    who = t.meta.get("requests", [])
                    if internal not in who:
                        continue
                    data = t.tensor()
                    for k, rid in enumerate(who):
                        if rid == internal:
                            generated[int(data[k, 0])] = int(data[k, 1])
                elif t.name == FINISHED:
                    who = t.meta.get("requests", [])
                    if internal in who:
                        k = who.index(internal)
                        finished = str(t.meta["reasons"][k])
                        finished_tokens = int(t.tensor()[k])
                elif cur_rows is not None and t.forward == cur_fwd and (want is None or t.name in want):
                    start, count, pos = cur_rows
                    x = t.tensor()[start:start + count]
                    d = per_module.setdefault(t.name, {})
                    for k, p in enumerate(pos):
                        d[p] = x[k]
    if prompt is None:
        raise ValueError(f"request {internal!r}: its first rows (with the prompt) are not in the streams")
    tokens = list(prompt)
    for p in sorted(generated):
        if p != len(tokens):
            raise ValueError(f"request {internal!r}: generated token at position {p}, expected {len(tokens)}")
        tokens.append(generated[p])
    last = len(tokens) - 2  # the last token never had a forward pass
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
    kept = sorted(p for p in input_ids if p <= last and all(p in d for d in per_module.values()))
    out = RequestCapture()
    for name, d in per_module.items():
        out[name] = torch.stack([d[p] for p in kept]) if kept else torch.empty(0)
    out.request_id = external
    out.engine_request_id = internal
    out.token_ids = torch.tensor(tokens, dtype=torch.int64)
    out.prompt_len = len(prompt)
    out.positions = torch.tensor(kept, dtype=torch.int64)
    top = kept[-1] if kept else -1
    have = set(kept)
    out.missing = [p for p in range(top) if p not in have]
    out.recomputed = sorted(p for p in recomputed if p <= last)
    out.streams = list(paths)
    out.finished = finished
    # The worker counted the request's tokens when it learnt of the finish; with vllm.sampled
    # records (not under async scheduling) the stream must hold exactly those.
    if generated and finished_tokens >= 0 and finished_tokens != len(tokens):
        raise ValueError(f"request {internal!r}: finished with {finished_tokens} tokens, the stream holds "
                         f"{len(tokens)}")
    return out
