"""Captured activations as a PyTorch dataset: one row of ``[d_model]`` per token position.

:class:`ActivationDataset` reads one or many stream files (docs/STREAM_FORMAT.md), or objects
in S3-compatible storage (docs/OBJECT_STORAGE.md), through
:func:`llm_instrumentation.open_stream` and yields rows with where they came from
(stream, step, forward, position, token id). It is an ``IterableDataset`` that shards by
whole tensors across DataLoader workers and distributed ranks, so every row comes out
exactly once per epoch, and it can shuffle through a buffer of bounded size.

Which token a row belongs to is read from the stream's TOKEN packets (``record_token``): a
forward pass of step ``s`` whose input is ``B × L`` tokens is taken to read the ``B·L``
tokens recorded last before it, in ``input_ids.flatten()`` order (token indices
``s - B·L … s - 1``). That holds when every input token was recorded before the forward
pass: a prompt recorded token by token, then generation with or without a KV cache. Rows
whose token was not recorded get ``token_id = token_index = -1``.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import glob
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _activation_codecs
from ._source import is_url
from .vllm import _dataset as _vllm
from .stream import DROP, TENSOR, TOKEN, Tensor, open_stream

import torch
from torch.utils.data import IterableDataset, get_worker_info

PathLike = Union[str, "os.PathLike[str]"]

#: Codec ids of the lossy activation codecs (docs/COMPRESSION.md): quant, fp16, fp8.
LOSSY_CODECS = (_activation_codecs.QUANT, _activation_codecs.FP16, _activation_codecs.FP8,
                _activation_codecs.TRANSFORM)
#: Stored bytes of the tensors an object-storage epoch fetches ahead, at most (see ``prefetch``).
PREFETCH_BYTES = 256 << 20
#: Keys of a row (and of a batch) besides ``activation``, all integer (``lossy`` bool).
META_KEYS = ("stream", "module", "step", "forward", "batch", "position", "token_index", "token_id", "lossy")


@dataclass(frozen=True)
class Unit:
    """One captured tensor of a selected module: the dataset's unit of sharding.

    Attributes:
        stream: index into :attr:`ActivationDataset.paths`.
        module: index into :attr:`ActivationDataset.modules`.
        ordinal: the tensor's index among its module's tensors in that stream.
        step, forward: as in the stream.
        shape: the stored shape (``[B, T, d]`` or ``[T, d]``).
        dtype: the stored dtype name.
        positions: the kept sequence positions of a ``SAMPLED_SLICES`` record, else None.
        lossy: whether a lossy codec stored it (values within the capture's bound, not exact).
        pieces: for a tensor of a capture set stored as pieces by several tensor-parallel
            ranks (docs/DISTRIBUTED.md): ``((stream, ordinal), ...)`` in offset order, and
            ``shape`` is the whole tensor's; None for a tensor stored whole.
        axis: the axis the pieces are joined along (None when not in pieces).
        request: for a vLLM capture (docs/VLLM.md 4): the request, an index into
            :attr:`ActivationDataset.vllm_requests`; the unit is that request's rows of one
            module, ``shape [positions, d]``, ``positions`` theirs, in order; None otherwise.
        runs: a vLLM unit's rows: ``((stream, ordinal, first row, rows), ...)`` in position
            order, slices of the module's step tensors.
    """

    stream: int
    module: int
    ordinal: int
    step: int
    forward: int
    shape: Tuple[int, ...]
    dtype: str
    positions: Optional[Tuple[int, ...]]
    lossy: bool
    pieces: Optional[Tuple[Tuple[int, int], ...]] = None
    axis: Optional[int] = None
    request: Optional[int] = None
    runs: Optional[Tuple[Tuple[int, int, int, int], ...]] = None

    @property
    def batch(self) -> int:
        return self.shape[0] if len(self.shape) == 3 else 1

    @property
    def seq(self) -> int:
        return self.shape[-2]

    @property
    def rows(self) -> int:
        return self.batch * self.seq


def _env_int(*names: str) -> Optional[int]:
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"environment variable {n}={v!r} is not an integer") from None
    return None


def resolve_rank(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """This process's (rank, world_size): explicit arguments first, then an initialised
    ``torch.distributed`` group, then the ``RANK`` / ``WORLD_SIZE`` environment variables
    that ``torchrun`` sets, else ``(0, 1)``.

    Raises:
        ValueError: only one of the pair given, or rank outside ``[0, world_size)``.
    """
    if (rank is None) != (world_size is None):
        raise ValueError("pass rank and world_size together (or neither)")
    if rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            r, w = _env_int("RANK"), _env_int("WORLD_SIZE")
            if (r is None) != (w is None):
                raise ValueError("RANK and WORLD_SIZE must be set together")
            rank, world_size = (r, w) if r is not None else (0, 1)
    assert world_size is not None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def _select(names: Sequence[str], patterns: Sequence[str]) -> List[str]:
    out = []
    for n in names:
        if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns):
            out.append(n)
    return out


class _StreamInfo:
    """What the dataset learnt from one stream at construction."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.metadata: Dict[str, Any] = {}
        #: token index → (token_id, recorded position, text)
        self.tokens: Dict[int, Tuple[int, int, str]] = {}
        self.drops: Dict[str, int] = {}
        self.incomplete: Dict[str, int] = {}
        self.truncated_at: Optional[int] = None

    def token_arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        """Dense token-id table: ids[k] for k in [0, n) and a mask of recorded indices."""
        n = max(self.tokens) + 1 if self.tokens else 0
        ids = np.full(n, -1, dtype=np.int64)
        known = np.zeros(n, dtype=bool)
        for k, (tid, _, _) in self.tokens.items():
            ids[k] = tid
            known[k] = True
        return ids, known


class ActivationDataset(IterableDataset):
    """Rows of captured activations, ``[d_model]`` per token position, from stream files.

    Each selected module's tensors must be ``[B, T, d]`` or ``[T, d]`` (the last axis is the
    row); a row keeps the captured dtype (bit for bit) unless ``dtype`` converts it.

    Sharding: the units of work are whole tensors. With ``R`` ranks and ``W`` DataLoader
    workers each of the ``R·W`` shards takes every ``R·W``-th tensor (after the epoch's
    permutation when ``shuffle``), so every row comes out exactly once per epoch across all
    of them. Ranks are not balanced to equal row counts (a DDP loop must tolerate uneven
    ends, e.g. ``torch.distributed.algorithms.join.Join``).

    Shuffling (``shuffle=True``): the tensor order is permuted per epoch (the same
    permutation on every rank, from ``seed`` and :meth:`set_epoch`), and rows pass through a
    buffer of at most ``shuffle_buffer`` rows: memory is bounded by
    ``shuffle_buffer × d × itemsize`` plus one decoded tensor and one batch, whatever the
    size of the capture.

    A capture set (docs/DISTRIBUTED.md: a ``*.capture-set.json`` manifest, or an open
    :class:`~llm_instrumentation.capture_set.CaptureSet`) reads its ranks' streams as one
    capture: a tensor stored as pieces by the tensor-parallel ranks of a (dp_rank, pp_stage)
    group is one unit whose pieces are read and joined by the one shard that takes it; an
    output replicated on every tp rank comes from tp rank 0 only (copies stored with
    ``replicated="every_rank"`` are never read); a data-parallel replica's or pipeline
    stage's tensors are units of their own. So no byte is read by two shards, nor twice.

    A vLLM capture (docs/VLLM.md 4: the plugin's directory, its streams, or the capture set
    of an engine's workers) is read by request: a unit is one request's rows of one module in
    position order (a position computed twice keeps its last computation), and each row
    says its request (``batch``: an index into :attr:`vllm_requests`), its ``position``
    (also ``token_index``) and the ``token_id`` there. A step's tensor holds rows of several
    requests: an iteration decodes it once while its cache (256 MiB) still holds it, so
    across shards a step tensor may be decoded by each shard that takes one of its requests.

    Args:
        paths: one stream file or several; object URLs (``s3://bucket/key``) are read by
            byte range (docs/OBJECT_STORAGE.md): the index and the headers at construction,
            each selected tensor's bytes when an epoch reaches it. Or a capture set. Or a
            local directory: its ``*.strap`` streams.
        modules: module names or fnmatch patterns (``"model.layers.*.mlp"``); default:
            every module with tensors, which must then share one width.
        batch_size: yield batches of this many rows (dicts of stacked tensors; use
            ``DataLoader(ds, batch_size=None)``). ``None`` yields single rows.
        drop_last: drop each shard's last short batch.
        shuffle: permute tensors per epoch and mix rows through the shuffle buffer.
        shuffle_buffer: rows held by the shuffle buffer.
        seed: base of every random choice (per epoch and per shard).
        dtype: convert rows to this torch dtype (``None`` keeps the captured one).
        lossy: ``"keep"`` (rows flagged ``lossy=True``), ``"skip"`` or ``"error"`` for
            tensors stored by a lossy codec.
        rank, world_size: this process's distributed rank; default :func:`resolve_rank`
            (``torch.distributed``, then ``RANK``/``WORLD_SIZE``).
        storage_options: fsspec options for object URLs (s3fs: ``{"endpoint_url": ...}``);
            default: the AWS environment variables and config files.
        prefetch: tensors whose bytes threads fetch ahead of the one being decoded, when
            the streams are objects (hides each range request's latency behind decoding),
            never more than :data:`PREFETCH_BYTES` of them at once (always at least one); 0
            for none. Local files are read in place.

    Example:
        >>> ds = ActivationDataset("run.strap", modules="model.layers.2", batch_size=4096,
        ...                        shuffle=True, dtype=torch.float32)     # doctest: +SKIP
        >>> for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        ...     x = batch["activation"]                                 # [4096, d_model]
    """

    def __init__(self, paths: Union[PathLike, Sequence[PathLike]], modules: Union[str, Sequence[str], None] = None,
                 *, batch_size: Optional[int] = None, drop_last: bool = False, shuffle: bool = False,
                 shuffle_buffer: int = 65536, seed: int = 0, dtype: Optional["torch.dtype"] = None,
                 lossy: str = "keep", rank: Optional[int] = None, world_size: Optional[int] = None,
                 storage_options: Optional[Dict[str, Any]] = None, prefetch: int = 8) -> None:
        super().__init__()
        #: the capture set's manifest, when ``paths`` was one (the streams are its ranks')
        self.capture_set: Optional[Dict[str, Any]] = None
        #: a vLLM capture's requests (``batch`` of a row indexes them), else None
        self.vllm_requests: Optional[List[Any]] = None
        paths = self._capture_set_streams(paths, storage_options)
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths: List[str] = [os.fspath(p) if is_url(p) else os.path.abspath(os.fspath(p)) for p in paths]
        self.storage_options = dict(storage_options) if storage_options else None
        if prefetch < 0:
            raise ValueError(f"prefetch must be ≥ 0, got {prefetch}")
        self.prefetch = int(prefetch)
        if not self.paths:
            raise ValueError("no stream paths given")
        if isinstance(modules, str):
            modules = [modules]
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if shuffle and shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be ≥ 1, got {shuffle_buffer}")
        if lossy not in ("keep", "skip", "error"):
            raise ValueError(f"lossy must be 'keep', 'skip' or 'error', got {lossy!r}")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.shuffle_buffer = int(shuffle_buffer)
        self.seed = int(seed)
        self.dtype = dtype
        self.lossy = lossy
        self._rank_args = (rank, world_size)
        resolve_rank(rank, world_size)  # validate now, resolve again in the worker
        self.epoch = 0
        self.streams: List[_StreamInfo] = []
        self.units: List[Unit] = []
        self.modules: List[str] = []
        # Tensor handles from construction, reused by this process and by forked workers
        # (their packets were CRC-checked once, here); dropped when pickled.
        self._handles: Optional[Dict[Tuple[int, str], List[Tensor]]] = {}
        self._readers: List[Any] = []
        try:
            self._plan(list(modules) if modules is not None else None)
        except BaseException:
            self.close()
            raise
        widths = {u.shape[-1] for u in self.units}
        if len(widths) > 1:
            by = {self.modules[u.module]: u.shape[-1] for u in self.units}
            raise ValueError(f"selected modules have different widths {by}: select modules of one width")
        self.d_model: int = widths.pop() if widths else 0
        self._warn_losses()

    # ----- construction ----------------------------------------------------------------------

    def _capture_set_streams(self, paths: Any, storage_options: Optional[Dict[str, Any]]) -> Any:
        """A capture set's stream locations (and its manifest kept), else ``paths`` as given."""
        from . import capture_set as cs

        if isinstance(paths, cs.CaptureSet):
            self.capture_set = paths.manifest
            return [r.path for r in paths.ranks]
        if isinstance(paths, (str, os.PathLike)) and os.fspath(paths).endswith(".json"):
            p = os.fspath(paths)
            self.capture_set = cs.load(p, storage_options=storage_options)
            mdir = p.rsplit("/", 1)[0] if is_url(p) else os.path.dirname(os.path.abspath(p))
            return [cs.stream_location(e["stream"], mdir) for e in self.capture_set["ranks"]]
        if isinstance(paths, (str, os.PathLike)) and os.path.isdir(paths):
            found = sorted(glob.glob(os.path.join(os.fspath(paths), "*.strap")))
            if not found:
                raise FileNotFoundError(f"no .strap streams in {os.fspath(paths)}")
            return found
        return paths

    def _plan(self, patterns: Optional[List[str]]) -> None:
        for path in self.paths:
            self._readers.append(self._open(path))
        vllm = [_vllm.is_vllm(r.metadata) for r in self._readers]
        if any(vllm):
            if not all(vllm):
                raise ValueError(f"{[p for p, v in zip(self.paths, vllm) if not v]} are not vLLM captures, "
                                 f"{[p for p, v in zip(self.paths, vllm) if v]} are: read them apart")
            _vllm.plan(self, patterns, self._readers, Unit, _StreamInfo)
            return
        mod_index: Dict[str, int] = {}
        for si, path in enumerate(self.paths):
            info = _StreamInfo(path)
            r = self._readers[si]
            info.metadata = r.metadata
            names = r.names()
            chosen = names if patterns is None else _select(names, patterns)
            sel = set(chosen)
            # One pass over the packets (each CRC-checked once, here): TOKEN (ids), DROP
            # (lost records, reported) and the selected modules' TENSOR packets, grouped
            # into whole tensors by the reader's rule (STREAM_FORMAT.md 7), in file order
            # as ``r.tensors(name)`` returns them.
            groups: Dict[str, List[Tensor]] = {n: [] for n in chosen}
            pending: Dict[str, List[Any]] = {}
            # With an index only these packets are read (over object storage: their headers).
            for pk in r.packets(select=lambda n, t: t != TENSOR or n in sel):
                if pk.type == TENSOR:
                    if pk.name in sel:
                        self._group(pk, pending, groups, info)
                elif pk.type == TOKEN:
                    m = pk.meta
                    info.tokens[pk.step] = (int(m.get("token_id", -1)), int(m.get("position", pk.step)),
                                            str(m.get("text", "")))
                elif pk.type == DROP and (patterns is None or _select([pk.name], patterns)):
                    info.drops[pk.name] = info.drops.get(pk.name, 0) + 1
            for name in pending:
                info.incomplete[name] = info.incomplete.get(name, 0) + 1
            info.truncated_at = r.truncated_at
            for name in chosen:
                mi = mod_index.setdefault(name, len(mod_index))
                assert self._handles is not None
                self._handles[(si, name)] = groups[name]
                if self.capture_set is None:
                    for k, t in enumerate(groups[name]):
                        self.units.append(self._unit(si, mi, k, t))
            self.streams.append(info)
        if self.capture_set is not None:
            self._plan_set(mod_index)
        self.modules = list(mod_index)
        if patterns is not None and not self.modules:
            raise ValueError(f"no module of {self.paths} matches {patterns}")

    def _plan_set(self, mod_index: Dict[str, int]) -> None:
        """The units of a capture set, group by group (docs/DISTRIBUTED.md): pieces joined
        into one unit (checked now: a missing or overlapping piece fails here, naming the
        record), replicas of tp ranks > 0 left out."""
        from . import capture_set as cs

        assert self.capture_set is not None and self._handles is not None
        groups: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}
        for si, e in enumerate(self.capture_set["ranks"]):
            groups.setdefault((e["dp_rank"], e["pp_stage"]), []).append((e["tp_rank"], si))
        for (dp, pp), members in sorted(groups.items()):
            members.sort()
            for name, mi in mod_index.items():
                held = [(tp, si, self._handles.get((si, name), [])) for tp, si in members]
                held = [h for h in held if h[2]]
                if not held:
                    continue
                if any(isinstance(h[2][0].meta.get("shard"), dict) for h in held):
                    self._plan_pieces(dp, pp, name, mi, held)
                    continue
                for tp, si, ts in held:
                    for k, t in enumerate(ts):
                        if tp != 0 and isinstance(t.meta.get("replica"), dict):
                            continue  # tp rank 0's copy is the one read
                        self.units.append(self._unit(si, mi, k, t))
        self.units.sort(key=lambda u: (u.step, u.forward, u.stream, u.module))

    def _plan_pieces(self, dp: int, pp: int, name: str, mi: int, held: List[Tuple[int, int, List[Tensor]]]) -> None:
        from . import capture_set as cs

        where = f"{name} (dp_rank {dp}, pp_stage {pp})"
        counts = {tp: len(ts) for tp, _, ts in held}
        if len(set(counts.values())) != 1:
            raise cs.CaptureSetError(f"{where}: the tp ranks hold different numbers of pieces {counts}: piece missing")
        for k in range(len(held[0][2])):
            ts = [(si, t) for _, si, t in ((tp, si, ts[k]) for tp, si, ts in held)]
            t0 = ts[0][1]
            rec = f"{where}, record step {t0.step}, forward {t0.forward}"
            if any((t.step, t.forward) != (t0.step, t0.forward) for _, t in ts):
                raise cs.CaptureSetError(f"{rec}: the tp ranks' pieces {k} are of different forward passes")
            if not all(isinstance(t.meta.get("shard"), dict) for _, t in ts):
                raise cs.CaptureSetError(f"{rec}: some tp ranks stored it sharded, some whole")
            try:
                order = cs.piece_order(name, [(t.meta["shard"], t.shape) for _, t in ts])
            except cs.CaptureSetError as e:
                raise cs.CaptureSetError(f"{e} ({rec})") from None
            d = t0.meta["shard"]
            first = ts[order[0]]
            u = self._unit(first[0], mi, k, first[1])
            lossy = any(self._unit(si, mi, k, t).lossy for si, t in ts)
            self.units.append(dataclasses.replace(u, shape=tuple(d["full_shape"]), lossy=lossy,
                                                  pieces=tuple((ts[i][0], k) for i in order), axis=d["axis"]))

    @staticmethod
    def _group(pk: Any, pending: Dict[str, List[Any]], groups: Dict[str, List[Tensor]], info: _StreamInfo) -> None:
        """Collect PART packets into whole tensors: the parts of one tensor follow each
        other among its module's packets; one that does not continue the previous ends that
        tensor as incomplete (never returned, counted)."""
        if not pk.is_part:
            groups[pk.name].append(Tensor([pk]))
            return
        parts = pending.get(pk.name)
        if parts is not None:
            last = parts[-1]
            if (pk.part_offset != last.part_offset + last.raw_len or pk.tensor_len != last.tensor_len
                    or pk.dtype_id != last.dtype_id or pk.shape != last.shape):
                info.incomplete[pk.name] = info.incomplete.get(pk.name, 0) + 1
                del pending[pk.name]
                parts = None
        if parts is None:
            if pk.part_offset != 0:
                info.incomplete[pk.name] = info.incomplete.get(pk.name, 0) + 1
                return
            parts = pending[pk.name] = []
        parts.append(pk)
        if pk.part_offset + pk.raw_len == pk.tensor_len:
            del pending[pk.name]
            groups[pk.name].append(Tensor(parts))

    def _open(self, path: str) -> Any:
        return open_stream(path, self.storage_options if is_url(path) else None)

    def _unit(self, si: int, mi: int, k: int, t: Tensor) -> Unit:
        shape = tuple(t.shape)
        where = f"{self.paths[si]}: {t.name} forward {t.forward}"
        if len(shape) not in (2, 3):
            raise ValueError(f"{where}: shape {shape} is not [B, T, d] or [T, d]; select modules whose "
                             "outputs are per-token rows")
        positions = None
        pos = t.meta.get("positions")
        if pos is not None:
            if t.meta.get("dim") != len(shape) - 2 or len(pos) != shape[-2]:
                raise ValueError(f"{where}: sampled positions {t.meta.get('dim')}/{len(pos)} do not match shape {shape}")
            positions = tuple(int(p) for p in pos)
        lossy = any(p.codec in LOSSY_CODECS or "lossy" in p.meta for p in t.packets)
        if lossy and self.lossy == "error":
            raise ValueError(f"{where}: stored by a lossy codec (lossy='error')")
        return Unit(si, mi, k, t.step, t.forward, shape, t.dtype, positions, lossy)

    def _warn_losses(self) -> None:
        for s in self.streams:
            if s.drops:
                warnings.warn(f"{s.path}: records dropped during capture (not in the dataset): {s.drops}",
                              stacklevel=3)
            if s.incomplete:
                warnings.warn(f"{s.path}: split tensors whose parts did not all arrive (not in the dataset): "
                              f"{s.incomplete}", stacklevel=3)
            if s.truncated_at is not None:
                warnings.warn(f"{s.path}: stream cut short at offset {s.truncated_at}; rows up to it are read",
                              stacklevel=3)

    # ----- bookkeeping -----------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows in one epoch over all shards (lossy tensors excluded when ``lossy='skip'``)."""
        return sum(u.rows for u in self.units if not (u.lossy and self.lossy == "skip"))

    @property
    def nbytes(self) -> int:
        """Bytes of the selected tensors as captured (their raw size)."""
        from ._dtypes import DTYPES

        size = {name: sz for name, sz in DTYPES.values()}
        return sum(u.rows * u.shape[-1] * size[u.dtype] for u in self.units
                   if not (u.lossy and self.lossy == "skip"))

    @property
    def drops(self) -> Dict[str, int]:
        """DROP packets of the selected modules, summed over streams (rows that were never written)."""
        out: Dict[str, int] = {}
        for s in self.streams:
            for k, v in s.drops.items():
                out[k] = out.get(k, 0) + v
        return out

    def tokens(self, stream: int = 0) -> List[Dict[str, Any]]:
        """The recorded tokens of one stream: ``token_index``, ``token_id``, ``position``, ``text``."""
        return [{"token_index": k, "token_id": tid, "position": pos, "text": text}
                for k, (tid, pos, text) in sorted(self.streams[stream].tokens.items())]

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (the permutation and shuffle-buffer seeds). Call it before each
        epoch's iterator is made; with ``persistent_workers`` the workers keep their copy."""
        self.epoch = int(epoch)

    def shard_units(self, shard: int, n_shards: int) -> List[Unit]:
        """The tensors shard ``shard`` of ``n_shards`` reads this epoch, in order."""
        order = list(range(len(self.units)))
        if self.shuffle:
            g = np.random.default_rng([self.seed, self.epoch])
            order = list(g.permutation(len(self.units)))
        picked = [self.units[i] for i in order[shard::n_shards]]
        if self.lossy == "skip":
            picked = [u for u in picked if not u.lossy]
        return picked

    def close(self) -> None:
        """Release the files held since construction (iteration reopens them)."""
        for r in self._readers:
            r.close()
        self._readers = []
        self._handles = None

    def __enter__(self) -> "ActivationDataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        # Readers hold an mmap: a spawned worker or another rank reopens the files instead.
        st = dict(self.__dict__)
        st["_handles"] = None
        st["_readers"] = []
        return st

    # ----- iteration -------------------------------------------------------------------------

    def _shard(self) -> Tuple[int, int]:
        rank, world = resolve_rank(*self._rank_args)
        wi = get_worker_info()
        wid, nw = (wi.id, wi.num_workers) if wi is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _tensor_of(self, u: Unit, opened: Dict[Tuple[int, str], List[Tensor]], readers: List[Any],
                   stream: Optional[int] = None) -> Tensor:
        """The stored tensor of unit ``u`` (of its piece in ``stream``, for a unit in pieces)."""
        name = self.modules[u.module]
        si = u.stream if stream is None else stream
        key = (si, name)
        if self._handles is not None and key in self._handles:
            return self._handles[key][u.ordinal]
        if key not in opened:
            r = self._open(self.paths[si])
            readers.append(r)
            opened[key] = r.tensors(name)
        ts = opened[key]
        if u.ordinal >= len(ts) or (ts[u.ordinal].step, ts[u.ordinal].forward) != (u.step, u.forward):
            raise RuntimeError(f"{self.paths[si]}: {name} tensor {u.ordinal} is not the one seen at "
                               "construction (the file changed)")
        return ts[u.ordinal]

    def _joined(self, u: Unit, opened: Dict[Tuple[int, str], List[Tensor]], readers: List[Any]) -> "torch.Tensor":
        """A unit in pieces, read (each piece once, by this shard only) and joined, exact."""
        assert u.pieces is not None and u.axis is not None
        return torch.cat([_decoded(self._tensor_of(u, opened, readers, si)) for si, _ in u.pieces], dim=u.axis)

    def _unit_rows(self, u: Unit, t: Optional[Tensor], token_tables: Dict[int, Tuple[np.ndarray, np.ndarray]],
                   stored: Optional[List[Any]] = None, x: Optional["torch.Tensor"] = None
                   ) -> Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]:
        if x is None:
            assert t is not None
            x = _decoded(t, stored)
        if self.dtype is not None:
            x = x.to(self.dtype)
        d = u.shape[-1]
        x = x.reshape(u.rows, d)
        b, n_seq = u.batch, u.seq
        pos = np.asarray(u.positions if u.positions is not None else range(n_seq), dtype=np.int64)
        full_len = int(pos.max()) + 1 if u.positions is not None and len(pos) else n_seq
        batch_idx = np.repeat(np.arange(b, dtype=np.int64), n_seq)
        position = np.tile(pos, b)
        # The forward of step s read the B·L tokens recorded just before it.
        tok_index = u.step - b * full_len + batch_idx * full_len + position
        ids, known = token_tables[u.stream]
        ok = (tok_index >= 0) & (tok_index < min(u.step, len(ids)))
        ok[ok] = known[tok_index[ok]]
        token_id = np.full(u.rows, -1, dtype=np.int64)
        token_id[ok] = ids[tok_index[ok]]
        tok_index = np.where(ok, tok_index, -1)
        n = u.rows
        meta = {
            "stream": torch.full((n,), u.stream, dtype=torch.int64),
            "module": torch.full((n,), u.module, dtype=torch.int64),
            "step": torch.full((n,), u.step, dtype=torch.int64),
            "forward": torch.full((n,), u.forward, dtype=torch.int64),
            "batch": torch.from_numpy(batch_idx),
            "position": torch.from_numpy(position),
            "token_index": torch.from_numpy(tok_index),
            "token_id": torch.from_numpy(token_id),
            "lossy": torch.full((n,), u.lossy, dtype=torch.bool),
        }
        return x, meta

    def iter_chunks(self, shard: Optional[int] = None, n_shards: Optional[int] = None
                    ) -> Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]]:
        """Unshuffled rows of one shard, one ``(activations [n, d], meta {key: [n]})`` pair
        per tensor (the fast path for exporters). Default shard: this worker's. The
        activations may be read-only views of the decoded bytes: copy before writing."""
        if shard is None or n_shards is None:
            shard, n_shards = self._shard()
        tables = {i: s.token_arrays() for i, s in enumerate(self.streams)}
        opened: Dict[Tuple[int, str], List[Tensor]] = {}
        readers: List[Any] = []
        units = self.shard_units(shard, n_shards)
        cache = _vllm.StepCache()
        try:
            if (self.prefetch and any(is_url(p) for p in self.paths) and not any(u.pieces for u in units)
                    and self.vllm_requests is None):
                yield from self._prefetched(units, opened, readers, tables)
                return
            for u in units:
                if u.request is not None:
                    yield _vllm.rows_of(self, u, opened, readers, cache, _decoded)
                elif u.pieces is not None:
                    yield self._unit_rows(u, None, tables, x=self._joined(u, opened, readers))
                else:
                    yield self._unit_rows(u, self._tensor_of(u, opened, readers), tables)
        finally:
            for r in readers:
                r.close()

    def _prefetched(self, units: List[Unit], opened: Dict[Tuple[int, str], List[Tensor]], readers: List[Any],
                    tables: Dict[int, Tuple[np.ndarray, np.ndarray]]
                    ) -> Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]]:
        """Units in order, their bytes fetched by threads up to ``prefetch`` tensors (and
        :data:`PREFETCH_BYTES`) ahead while this thread decodes: a range request waits on
        the network, and fetching and decoding then overlap without decodes contending."""
        from concurrent.futures import Future, ThreadPoolExecutor

        tensors = [self._tensor_of(u, opened, readers) for u in units]  # headers only: cheap
        sizes = [sum(p.stored_len for p in t.packets) for t in tensors]

        def fetch(t: Tensor) -> List[Any]:
            return [p._reader.fetch_payload(p) for p in t.packets]

        pending: "collections.deque[Future[List[Any]]]" = collections.deque()
        in_flight = 0
        # As many range requests at once as tensors ahead: against S3 one connection carries
        # about 100 MB/s, less than one thread decodes, so the fetches must run side by side
        # (against the local server of the benchmark 2 at once measured the same as 8).
        with ThreadPoolExecutor(self.prefetch, thread_name_prefix="strap-prefetch") as pool:
            try:
                k = 0
                for i, u in enumerate(units):
                    while k < len(units) and k - i < self.prefetch and (k == i or in_flight + sizes[k] <= PREFETCH_BYTES):
                        pending.append(pool.submit(fetch, tensors[k]))
                        in_flight += sizes[k]
                        k += 1
                    stored = pending.popleft().result()
                    in_flight -= sizes[i]
                    yield self._unit_rows(u, tensors[i], tables, stored)
            finally:
                for f in pending:
                    f.cancel()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        shard, n_shards = self._shard()
        chunks = self._chunks_unshuffled(shard, n_shards)
        if self.shuffle:
            chunks = _shuffle_buffer(chunks, self.shuffle_buffer,
                                     torch.Generator().manual_seed(hash((self.seed, self.epoch, shard)) & (2**63 - 1)))
        if self.batch_size is None:
            for x, meta in chunks:
                cols = {k: v.tolist() for k, v in meta.items()}
                for i in range(x.shape[0]):
                    row = {k: cols[k][i] for k in META_KEYS}
                    row["activation"] = x[i].clone()
                    yield row
        else:
            yield from _batches(chunks, self.batch_size, self.drop_last)

    def _chunks_unshuffled(self, shard: int, n_shards: int) -> Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]]:
        return self.iter_chunks(shard, n_shards)


def _decoded(t: Tensor, stored: Optional[List[Any]] = None) -> "torch.Tensor":
    """The tensor's decoded bytes as a torch tensor, without a further copy (``stored``: its
    packets' payloads, fetched ahead).

    ``Tensor.raw()`` returns a bytes object made for this call and referenced by nothing
    else, so the tensor may own its memory (writes land in that private object); a
    one-byte object may be CPython's shared singleton, so that case is copied."""
    raw = t.raw(stored)
    dt = getattr(torch, t.dtype)
    if not raw:
        return torch.empty(t.shape, dtype=dt)
    buf: Any = raw if len(raw) > 1 else bytearray(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable"
        return torch.frombuffer(buf, dtype=torch.uint8).view(dt).reshape(t.shape)


def _batches(chunks: Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]], size: int, drop_last: bool
             ) -> Iterator[Dict[str, "torch.Tensor"]]:
    """Regroup chunks of any size into batches of exactly ``size`` rows (the last may be
    short). A batch inside one chunk is a view of it (no copy)."""
    pend: List[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]] = []
    have = 0

    def emit(n: int) -> Dict[str, "torch.Tensor"]:
        nonlocal pend, have
        xs, ms, taken = [], [], 0
        rest: List[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]] = []
        for x, m in pend:
            if taken >= n:
                rest.append((x, m))
                continue
            k = min(n - taken, x.shape[0])
            xs.append(x[:k])
            ms.append({key: v[:k] for key, v in m.items()})
            if k < x.shape[0]:
                rest.append((x[k:], {key: v[k:] for key, v in m.items()}))
            taken += k
        pend, have = rest, have - taken
        out = {key: (torch.cat([m[key] for m in ms]) if len(ms) > 1 else ms[0][key]) for key in META_KEYS}
        out["activation"] = torch.cat(xs) if len(xs) > 1 else xs[0]
        return out

    for x, m in chunks:
        if x.shape[0] == 0:
            continue
        pend.append((x, m))
        have += x.shape[0]
        while have >= size:
            yield emit(size)
    if have and not drop_last:
        yield emit(have)


def _shuffle_buffer(chunks: Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]], cap: int,
                    gen: "torch.Generator") -> Iterator[Tuple["torch.Tensor", Dict[str, "torch.Tensor"]]]:
    """Mix rows through a buffer of ``cap`` rows: once full, each incoming row takes the
    place of a random buffered row, which goes out. Every row comes out exactly once.
    The metadata columns travel as one int64 matrix (one gather/scatter per chunk)."""
    buf_x: Optional["torch.Tensor"] = None
    buf_m: Optional["torch.Tensor"] = None
    keys: List[str] = []
    dtypes: Dict[str, "torch.dtype"] = {}
    fill = 0

    def unpack(mm: "torch.Tensor") -> Dict[str, "torch.Tensor"]:
        return {k: mm[:, j].to(dtypes[k]) for j, k in enumerate(keys)}

    for x, m in chunks:
        n = x.shape[0]
        if n == 0:
            continue
        if buf_x is None:
            keys = list(m)
            dtypes = {k: v.dtype for k, v in m.items()}
            buf_x = torch.empty((cap, x.shape[1]), dtype=x.dtype)
            buf_m = torch.empty((cap, len(keys)), dtype=torch.int64)
        assert buf_m is not None
        mm = torch.stack([m[k].to(torch.int64) for k in keys], 1)
        i = 0
        if fill < cap:
            k = min(cap - fill, n)
            buf_x[fill:fill + k] = x[:k]
            buf_m[fill:fill + k] = mm[:k]
            fill += k
            i = k
        while i < n:
            k = min(cap, n - i)
            slots = torch.randperm(cap, generator=gen)[:k]
            out_x = buf_x.index_select(0, slots)
            out_m = buf_m.index_select(0, slots)
            buf_x.index_copy_(0, slots, x[i:i + k])
            buf_m.index_copy_(0, slots, mm[i:i + k])
            i += k
            yield out_x, unpack(out_m)
    if fill:
        assert buf_x is not None and buf_m is not None
        perm = torch.randperm(fill, generator=gen)
        yield buf_x.index_select(0, perm), unpack(buf_m.index_select(0, perm))
