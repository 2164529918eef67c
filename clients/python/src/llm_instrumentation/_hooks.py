"""Which modules of a model are captured, and the forward hooks that hand their outputs on.

The hooks know nothing of strapd: they call back into the framework, which counts forward
passes and writes the tensors into the session.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import _distributed
from ._anatomy import describe_model
from ._warnings import warn_caller
from .config import HookGranularity, InstrumentationConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn


#: The record name of the root module's output (a record needs a non-empty name; the
#: analysis helpers show 1.3.1's unnamed root the same way).
ROOT_NAME = "<root>"

#: receives one output tensor of a hooked module: ``(record name, tensor, record meta)``;
#: what it returns (the session's record tells whether the record was written) is ignored.
RecordFn = Callable[[str, "torch.Tensor", Optional[Dict[str, Any]]], object]
#: receives one output tensor of a hooked module with a meta that repeats (the same object).
RecordMetaFn = Callable[[str, "torch.Tensor", Dict[str, Any]], object]


def select_modules(
    model: "nn.Module",
    granularity: HookGranularity,
    patterns: Sequence[str] = (),
) -> List[str]:
    """Return the names of the modules to hook, in ``named_modules()`` order.

    Args:
        model: the model.
        granularity: the :class:`HookGranularity`.
        patterns: extra fnmatch patterns on module names, added for every granularity.

    Returns:
        module names (no duplicates); ``""`` is the root module. Raises ValueError when a
        pattern matches nothing.

    A model whose decoder blocks the detector does not find (no list of blocks, e.g. an
    ``nn.Sequential``), given no patterns, gets what 1.3.1 hooked on every model, with one
    warning naming the choice (:func:`falls_back_to_131`): for ``FULL_TENSOR`` /
    ``SAMPLED_SLICES`` the root and its direct children; for ``ATTENTION_ONLY`` /
    ``MLP_ONLY`` the direct children whose names contain ``attn`` / ``mlp`` — possibly none,
    as in 1.3.1, which then captured nothing.
    """
    g = HookGranularity(granularity)
    names = [n for n, _ in model.named_modules() if n]
    arch = describe_model(model)
    if falls_back_to_131(model, g, patterns):
        return _fallback_131(model, g)
    chosen: Set[str] = set()
    if g in (HookGranularity.FULL_TENSOR, HookGranularity.SAMPLED_SLICES):
        chosen.update(arch["blocks"], arch["attention"], arch["mlp"])
    elif g is HookGranularity.ATTENTION_ONLY:
        chosen.update(arch["attention"])
    elif g is HookGranularity.MLP_ONLY:
        chosen.update(arch["mlp"])
    elif g is HookGranularity.RESIDUAL_ONLY:
        chosen.update(arch["blocks"])
    elif g is HookGranularity.ALL_MODULES:
        chosen.update(names)
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"module pattern {pat!r} matches no module of {type(model).__name__}")
        chosen.update(hits)
    return [n for n in names if n in chosen]


#: What 1.3.1 hooked, by granularity, among the root and its direct children (its only
#: candidates): every one, or those whose name contains the word.
_FALLBACK_131 = {HookGranularity.FULL_TENSOR: None, HookGranularity.SAMPLED_SLICES: None,
                 HookGranularity.ATTENTION_ONLY: "attn", HookGranularity.MLP_ONLY: "mlp"}


def falls_back_to_131(model: "nn.Module", granularity: HookGranularity, patterns: Sequence[str] = ()) -> bool:
    """Whether :func:`select_modules` gives ``model`` 1.3.1's choice: no decoder blocks
    found, no patterns, and a granularity 1.3.1 had (``RESIDUAL_ONLY`` and ``ALL_MODULES``
    are ours)."""
    return not patterns and HookGranularity(granularity) in _FALLBACK_131 and describe_model(model)["layer_prefix"] is None


def _fallback_131(model: "nn.Module", g: HookGranularity) -> List[str]:
    """1.3.1's choice for a model without recognised blocks, with one warning naming it."""
    word = _FALLBACK_131[g]
    children = [n for n, _ in model.named_children()]
    chosen = [""] + children if word is None else [n for n in children if word in n]
    what = ", ".join(n or "<root>" for n in chosen) if chosen else \
        f"nothing (no direct child's name contains {word!r}; 1.3.1 captured nothing here either)"
    warn_caller(
        f"{type(model).__name__}: no decoder blocks found (no list of attention/MLP blocks); hooking what 1.3.1 "
        f"hooked for {g.name}: {what}. Pass module patterns (modules=[...]) to choose others")
    return chosen


def split_output(name: str, out: Any) -> List[Tuple[str, "torch.Tensor"]]:
    """The tensors of one module output, with their record names.

    A tensor is ``name``. In a tuple/list, the first tensor is ``name`` and any other
    tensor at index ``i`` is ``name.out{i}`` (non-tensors such as caches and ``None`` are
    skipped). A ``ModelOutput`` / dict: the first tensor value is ``name``, every other tensor
    value ``name.{key}``.

    Args:
        name: the module's name.
        out: what its forward returned.

    Returns:
        ``(record name, tensor)`` pairs, in output order.
    """
    import torch

    if isinstance(out, torch.Tensor):
        return [(name, out)]
    items: List[Tuple[str, Any]]
    if isinstance(out, dict):  # transformers ModelOutput is an OrderedDict
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"out{i}", v) for i, v in enumerate(out)]
    else:
        return []
    res: List[Tuple[str, "torch.Tensor"]] = []
    for key, v in items:
        if isinstance(v, torch.Tensor):
            res.append((name if not res else f"{name}.{key}", v))
    return res


def sample_positions(seq_len: int, spec: Union[int, Tuple[int, ...]]) -> List[int]:
    """The kept positions of a ``SAMPLED_SLICES`` capture.

    Args:
        seq_len: length of the sequence dimension.
        spec: stride k (keeps ``0, k, 2k, ...`` plus ``seq_len - 1``) or explicit positions
            (negative = from the end; out-of-range ones are ignored).

    Returns:
        sorted unique positions.
    """
    if seq_len <= 0:
        return []
    if isinstance(spec, int):
        pos = set(range(0, seq_len, spec))
        pos.add(seq_len - 1)
    else:
        pos = {p + seq_len if p < 0 else p for p in spec}
        pos = {p for p in pos if 0 <= p < seq_len}
    return sorted(pos)


def choose_modules(model: "nn.Module", config: InstrumentationConfig, extra: Sequence[str]) -> List[str]:
    """The names of the modules to hook: the config's granularity and patterns plus ``extra``.

    Args:
        model: the model.
        config: its capture config.
        extra: more fnmatch patterns on module names.

    Returns:
        module names, in ``named_modules`` order.

    Raises:
        ValueError: nothing matches (a capture of nothing is a mistake, not a result),
            except where 1.3.1's choice for a model without recognised blocks is empty
            (``select_modules`` warns; 1.3.1 captured nothing there too).
    """
    patterns = tuple(config.modules) + tuple(extra)
    names = select_modules(model, config.granularity, patterns)
    if not names and not falls_back_to_131(model, config.granularity, patterns):
        raise ValueError(
            f"no module of {type(model).__name__} matches granularity {config.granularity.name}"
            f"{' and patterns ' + str(list(patterns)) if patterns else ''}; pass modules=[...] patterns"
        )
    return list(names)


class Hooks:
    """The forward hooks of one capture on ``model``.

    Args:
        model: the model.
        modules: names of the modules to hook.
        config: the capture config (granularity and sampled positions).
    """

    def __init__(self, model: "nn.Module", modules: Sequence[str], config: InstrumentationConfig) -> None:
        self.model = model
        self.modules = list(modules)
        self.sampled = config.granularity is HookGranularity.SAMPLED_SLICES
        self.spec = config.sampled_positions
        self._handles: List[Any] = []
        #: set by :meth:`set_distributed` for a tensor-parallel rank: the layout, each
        #: module's kind, and whether replicated outputs are stored by every tp rank.
        self._layout: Optional[_distributed.Layout] = None
        self._kinds: Dict[str, _distributed.ModuleKind] = {}
        self._every_rank = False

    def set_distributed(self, layout: Optional[_distributed.Layout], kinds: Dict[str, _distributed.ModuleKind],
                        every_rank: bool) -> None:
        """Hook as a tensor-parallel rank (docs/DISTRIBUTED.md D2); with ``tp_size`` 1 (or no
        layout) the hooks stay the single process's.

        Args:
            layout: this rank's layout.
            kinds: each hooked module's kind (:func:`._distributed.classify`).
            every_rank: store replicated outputs on every tp rank (with a ``replica`` meta).
        """
        tp = layout is not None and layout.tp_size > 1
        self._layout = layout if tp else None
        self._kinds = dict(kinds) if tp else {}
        self._every_rank = every_rank

    def install(self, forward_started: Callable[[], None], forward_ended: Callable[[], None], record: RecordFn,
                record_meta: Optional[RecordMetaFn] = None) -> None:
        """Register the hooks; they call back until :meth:`remove`.

        Args:
            forward_started: called as a forward pass of the whole model begins.
            forward_ended: called once it ended, after every module hook ran.
            record: called with ``(record name, tensor, record meta or None)`` for each
                output tensor of a hooked module.
            record_meta: called instead of ``record`` by a tensor-parallel rank's hooks for
                a record whose meta is the same dict object as the name's previous record's
                (default ``record``).
        """
        model = self.model
        self._handles.append(model.register_forward_pre_hook(lambda m, a: forward_started()))
        mods = dict(model.named_modules())
        lay = self._layout
        for name in self.modules:
            if lay is None:
                self._handles.append(mods[name].register_forward_hook(self._module_hook(name or ROOT_NAME, record)))
                continue
            kind = self._kinds.get(name, _distributed.ModuleKind("detect"))
            if kind.kind == "replicated" and lay.tp_rank > 0 and not self._every_rank:
                continue  # tp rank 0 stores it: no hook here, no copy, no record
            if kind.kind == "local" or (kind.kind == "replicated" and not self._every_rank):
                self._handles.append(mods[name].register_forward_hook(self._module_hook(name or ROOT_NAME, record)))
                continue
            box: List[Any] = []
            box.append(mods[name].register_forward_hook(
                self._tp_hook(name or ROOT_NAME, kind, record, record_meta or record, box)))
            self._handles.append(box[0])
        # Registered last, so it runs after a hook on the root module itself: one PUBLISH per
        # forward pass for the records not yet published.
        self._handles.append(model.register_forward_hook(lambda m, a, o: forward_ended()))

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _module_hook(self, name: str, record: RecordFn) -> Callable[[Any, Any, Any], None]:
        import torch

        sampled, spec, tensor = self.sampled, self.spec, torch.Tensor

        def hook(module: Any, args: Any, output: Any) -> None:
            if not sampled:
                # Runs per module and forward pass: the two common outputs, one tensor and a
                # tuple (attention: output, weights or None), skip the general walk with its
                # (record name, tensor) list; names as split_output gives them.
                if type(output) is tensor:
                    record(name, output, None)
                    return None
                if type(output) is tuple:
                    first = True
                    for i, v in enumerate(output):
                        if isinstance(v, tensor):
                            record(name if first else f"{name}.out{i}", v, None)
                            first = False
                    return None
            for rec_name, t in split_output(name, output):
                meta = None
                if sampled and t.dim() >= 2:
                    import torch

                    pos = sample_positions(int(t.shape[1]), spec)
                    idx = torch.tensor(pos, dtype=torch.long, device=t.device)
                    t = t.detach().index_select(1, idx)
                    meta = {"positions": pos, "dim": 1}
                record(rec_name, t, meta)
            return None  # never replaces the output

        return hook

    def _tp_hook(self, name: str, kind: "_distributed.ModuleKind", record: RecordFn, record_meta: RecordMetaFn,
                 box: List[Any]) -> Callable[[Any, Any, Any], None]:
        """The hook of a tensor-parallel rank for a module whose outputs are sharded, replicated
        and stored by every rank, or not known before its first output (``detect``).

        The meta of a piece is computed once per record name and shape and reused (the
        same dict object each record, which ``record_meta`` keeps encoded in the record's
        layout), so a sharded module costs a dict lookup beyond the single process's hook,
        never a collective: the offset is this rank's by the layout (or the DTensor's own,
        which it computes locally).
        """
        import torch

        lay = self._layout
        assert lay is not None
        sampled, spec = self.sampled, self.spec
        every_rank = self._every_rank
        state = {"kind": kind}
        metas: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
        replica = {"replica": {"tp_rank": lay.tp_rank, "tp_size": lay.tp_size}}

        tensor = torch.Tensor
        by_shape: Dict[Any, Dict[str, Any]] = {}  # the common case's metas, by output shape

        def hook(module: Any, args: Any, output: Any) -> None:
            k = state["kind"]
            if type(output) is tensor and not sampled:
                # The common case, as the single process's hook has one: one plain tensor,
                # a piece of a declared sharded output or a replica stored on this rank.
                if k.kind == "sharded" and k.axis is not None:
                    desc = by_shape.get(output.shape)
                    if desc is None:
                        desc = by_shape[output.shape] = _distributed.shard_meta(tuple(output.shape), k.axis, lay)
                    record_meta(name, output, desc)
                    return None
                if k.kind == "replicated":  # hooked here only when every rank stores it
                    record_meta(name, output, replica)
                    return None
            outs = split_output(name, output)
            if k.kind == "detect":
                # Decided once, by the first output: a DTensor says what it is on each
                # record; a plain tensor is taken to be whole on every tp rank.
                if any(_distributed.dtensor_piece(t) is not None for _, t in outs):
                    k = state["kind"] = _distributed.ModuleKind("dtensor", None, "dtensor")
                else:
                    k = state["kind"] = _distributed.ModuleKind("replicated", None, "default")
                    if lay.tp_rank > 0 and not every_rank:
                        box[0].remove()  # tp rank 0 stores it; this rank never copies it
                        return None
            for rec_name, t in outs:
                piece = _distributed.dtensor_piece(t)
                where: Any = None
                if piece is not None:
                    t, where = piece
                    if where is None and k.kind != "sharded" and lay.tp_rank > 0 and not every_rank:
                        continue  # a replicated DTensor: tp rank 0's record holds it
                axis = where[0] if where is not None else (k.axis if k.kind == "sharded" else None)
                if sampled and t.dim() >= 2:
                    pos = sample_positions(int(t.shape[1]), spec)
                    idx = torch.tensor(pos, dtype=torch.long, device=t.device)
                    t = t.detach().index_select(1, idx)
                    pmeta: Optional[Dict[str, Any]] = {"positions": pos, "dim": 1}
                else:
                    pmeta = None
                if axis is None:  # replicated, stored here because every rank stores it
                    if pmeta is None:
                        record_meta(rec_name, t, replica)
                        continue
                    meta: Optional[Dict[str, Any]] = {**pmeta, **replica}
                else:
                    key = (rec_name, tuple(t.shape), where[1] if where is not None else None)
                    meta = metas.get(key)
                    if meta is None:
                        if where is not None:
                            full = list(where[2])
                            for d in range(len(full)):
                                if d != where[0]:
                                    full[d] = int(t.shape[d])  # a sampled sequence axis keeps its pieces' length
                            meta = _distributed.shard_meta(tuple(t.shape), axis, lay, where[1], full)
                        else:
                            meta = _distributed.shard_meta(tuple(t.shape), axis, lay)
                        metas[key] = meta
                    if pmeta is None:
                        record_meta(rec_name, t, meta)
                        continue
                    meta = {**pmeta, **meta}
                record(rec_name, t, meta)
            return None

        return hook
