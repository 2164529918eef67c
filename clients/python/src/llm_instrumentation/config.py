"""Capture configuration: :class:`InstrumentationConfig`, its presets, and :class:`HookGranularity`.

Every field has an effect (the original 1.3.1 ignored several):

* ``granularity`` picks which modules get hooks (see :class:`HookGranularity`).
* ``compression_algorithm`` / ``compression_level`` are sent to strapd as the session codec.
* ``max_memory_gb`` caps host buffering, as in 1.3.1: it sizes the shared-memory ring (the
  client's whole memory cost) and is sent to strapd as the session's memory hint
  (``OPEN.memory_hint``). A ring larger than the daemon admits (its WELCOME says:
  ``strapd serve --max-ring-size``, 1 GiB by default) is shrunk to fit when the capture
  starts, with one warning; one the daemon's memory budget (``strapd serve
  --memory-limit``) has no room for is refused. None: a ring sized from the hooked modules'
  bytes per forward pass (4 MiB to 0.25 GiB, docs/DEPLOY.md), made smaller, with a
  warning, when the daemon's budget has less room.
* ``target_throughput_gbps`` picks the compression block size and whether the requested codec
  can keep up on this machine; see :meth:`InstrumentationConfig.transport_plan`.
* ``backpressure`` is the ring-full policy: ``"block"`` (lossless, the model waits) or
  ``"drop"`` (the tensor is dropped whole, counted, and recorded as a DROP packet).
* ``sampled_positions`` is the position stride (or explicit positions) of ``SAMPLED_SLICES``.
* ``lossy`` is the error bound of a lossy codec (``quant``, ``fp16``, ``fp8``), sent as ``OPEN.lossy``;
  strapd verifies it per packet and records the achieved error (docs/COMPRESSION.md 6–7).
* ``trace`` asks strapd to write its kernel trace (docs/TRACE_FORMAT.md) beside the capture.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from .resources.levels import ResourceLevel

#: Codecs strapd accepts (docs/COMPRESSION.md 1): generic lossless ``none``/``lz4``/``zstd``,
#: the dtype-aware lossless ``shuffle``, and the opt-in lossy ``quant``, ``fp16`` and ``fp8``
#: (e4m3 with one scale per row: docs/COMPRESSION.md 5) and ``transform`` (a per-block PCA basis,
#: every row within a rel-L2 / cosine bound: docs/COMPRESSION.md 5.2).
SUPPORTED_CODECS: Tuple[str, ...] = ("none", "lz4", "zstd", "shuffle", "quant", "fp16", "fp8", "transform")
#: Codecs that change values; they need a ``lossy`` bound (``fp16`` and ``fp8`` imply their own).
LOSSY_CODECS: Tuple[str, ...] = ("quant", "fp16", "fp8", "transform")
#: Valid ``compression_level`` range per codec, as strapd's codecs define them
#: (internal/codec): lz4 0 = fast compressor, 1–9 = HC with search depth 2^(8+level);
#: zstd 0/1 = fastest, 2 = default, 3 = better, 4 = best compression; shuffle/quant/fp16 0–4;
#: fp8 0 only (its codes are stored as they are).
CODEC_LEVELS: Dict[str, Tuple[int, int]] = {"none": (0, 0), "lz4": (0, 9), "zstd": (0, 4),
                                            "shuffle": (0, 4), "quant": (0, 4), "fp16": (0, 4),
                                            "fp8": (0, 0), "transform": (0, 0)}
#: Bound modes per lossy codec: ``abs`` (max absolute error) and ``rel`` (relative L2 error,
#: i.e. RMS error over the tensor's RMS) for quant; ``fp16`` (its rounding, optionally capped
#: by a relative L2 value) for fp16; ``fp8`` (e4m3 rounding, optionally with a cap on every
#: row's relative L2 error: blocks with a row over it are kept exact) for fp8.
LOSSY_MODES: Dict[str, Tuple[str, ...]] = {"quant": ("abs", "rel"), "fp16": ("fp16",), "fp8": ("fp8",),
                                           "transform": ("transform",)}
#: The per-row rel-L2 bound of codec ``transform`` when none is given: √(1 − 0.995²), which
#: guarantees a per-row cosine ≥ 0.995 (internal/codec.DefaultTransformBound).
TRANSFORM_DEFAULT_BOUND: float = (1 - 0.995**2) ** 0.5
#: Ring-full policies.
BACKPRESSURE_POLICIES: Tuple[str, ...] = ("block", "drop")

#: Single-core encode throughput measured on the reference machine (DESIGN-NOTES.md,
#: 16 MiB of activation-like fp32), in GB/s. Used only by :meth:`transport_plan`.
CODEC_GBPS_PER_CORE: Dict[str, float] = {"none": float("inf"), "lz4": 0.13, "zstd": 0.08,
                                          "shuffle": 0.6, "quant": 0.5, "fp16": 0.5, "fp8": 0.8,
                                          "transform": 0.03}

#: The codec of a config that names none.
DEFAULT_CODEC = "shuffle"

#: Smallest ring accepted: header page + 64 KiB of data.
MIN_RING_BYTES = 4096 + 64 * 1024
#: strapd's default ``--max-ring-size``. A capture fits its ring to the daemon's limit,
#: which WELCOME tells; this one is assumed of a daemon that does not say.
MAX_RING_BYTES = 1 << 30
#: The largest default ring (``max_memory_gb`` None): a capture's default ring is sized from
#: what it writes (:mod:`._ringsize`, docs/DEPLOY.md) between :data:`AUTO_RING_MIN_BYTES`
#: and this; :attr:`InstrumentationConfig.ring_size` before a model is known.
DEFAULT_RING_BYTES = 256 << 20
#: The smallest default ring.
AUTO_RING_MIN_BYTES = 4 << 20
#: A default ring holds this many forward passes ...
AUTO_RING_FORWARDS = 4
#: ... of this many tokens each (or the model's context length when shorter).
AUTO_RING_TOKENS = 1024


class HookGranularity(str, enum.Enum):
    """Which modules a capture hooks.

    Members:
        FULL_TENSOR: every decoder block's output, its attention output and its MLP output
            (found by architecture: ``model.layers.N{,.self_attn,.mlp}``,
            ``transformer.h.N{,.attn,.mlp}``, ``[bert.]encoder.layer.N{,.attention,
            .intermediate,.output}``), whole tensors.
        ATTENTION_ONLY: the attention modules only.
        MLP_ONLY: the MLP modules only (BERT: ``intermediate`` and ``output``).
        RESIDUAL_ONLY: the decoder block outputs (the residual stream) only.
        SAMPLED_SLICES: the FULL_TENSOR modules, but only a subset of token positions along
            the sequence dimension (dim 1 of a ``[batch, seq, ...]`` output): every k-th
            position (k = ``sampled_positions``) plus the last one, or the explicit positions
            given. The kept indices are stored in each record's meta as
            ``{"positions": [...], "dim": 1}``. Outputs with fewer than 2 dimensions are
            stored whole.
        ALL_MODULES: every named submodule (not the root), whole tensors.

    User patterns (``modules=[...]``) are added to the selection for every granularity.
    """

    FULL_TENSOR = "full_tensor"
    ATTENTION_ONLY = "attention_only"
    MLP_ONLY = "mlp_only"
    RESIDUAL_ONLY = "residual_only"
    SAMPLED_SLICES = "sampled_slices"
    ALL_MODULES = "all_modules"


@dataclass(frozen=True)
class TransportPlan:
    """What a config asks of strapd for one session (see :meth:`InstrumentationConfig.transport_plan`)."""

    codec: str
    codec_level: int
    block_size: int
    ring_size: int
    memory_hint: int
    policy: str
    note: str = ""
    lossy: Optional[Dict[str, Any]] = None


@dataclass
class InstrumentationConfig:
    """Capture configuration. Every change is validated: the constructor, attribute
    assignment (``cfg.max_memory_gb = 0.5``) and the ``with_*`` builders all refuse bad values.

    The first four fields are 1.3.1's, in 1.3.1's order, so
    ``InstrumentationConfig(HookGranularity.FULL_TENSOR, "lz4", 2.0, 24)`` works.

    The ``with_*`` builders change this config and return it, as 1.3.1's did: both
    ``cfg = cfg.with_compression("zstd")`` and a bare ``cfg.with_compression("zstd")`` take
    effect. Use :meth:`copy` first for an independent variant (the preset class methods
    return a new config on every call).

    Args:
        granularity: which modules to hook (:class:`HookGranularity` or its string value).
        compression_algorithm: ``"none"``, ``"lz4"``, ``"zstd"``, ``"shuffle"`` (lossless,
            dtype-aware: the default), or the lossy ``"quant"`` / ``"fp16"`` / ``"fp8"``. ``None`` (the
            default) is ``"shuffle"``, and only then may a throughput target lower the codec
            (see :meth:`transport_plan`): a codec you name is the one you get.
        compression_level: codec level (see :data:`CODEC_LEVELS`); ``None`` = 0. lz4 0–9
            (0 fast, 1–9 HC), zstd 0–4 (0/1 fastest, 2 default, 3 better, 4 best),
            shuffle/quant/fp16 0–4, fp8 0.
        lossy: the error bound of a lossy codec, required by ``quant`` and refused by the
            lossless codecs: ``"rel:1e-3"`` (relative L2 error ≤ 1e-3 per tensor),
            ``"abs:1e-2"`` (every value within 1e-2), ``"fp16"`` (fp16 rounding; the
            default for codec ``fp16``), ``"fp16:1e-3"`` (and blocks over rel-L2 1e-3 kept
            exact), ``"fp8"`` (e4m3 with a scale per row; the default for codec ``fp8``),
            ``"fp8:0.04"`` (and blocks holding a row over rel-L2 0.04 kept exact),
            ``"transform"`` (every row's rel-L2 ≤ √(1 − 0.995²), i.e. cosine ≥ 0.995; the default
            for codec ``transform``), ``"transform:0.02"`` (every row's rel-L2 ≤ 0.02),
            ``"transform:cos:0.999"`` (every row's cosine ≥ 0.999, sent as rel-L2 √(1 − 0.999²)), or a dict
            ``{"mode": "rel", "value": 1e-3}``. Stored normalized as
            ``"mode:value"``.
        trace: ask strapd to write its kernel trace (JSONL snapshots naming this session)
            to ``{output_path}.trace.jsonl``; ``capture_activations(trace_path=...)`` picks
            another path. The interval is the daemon's (``strapd serve --trace-interval``).
        resource_level: record resource events (docs/RESOURCE_EVENTS.md) at this level —
            ``"MINIMAL"``, ``"DETAILED"`` or ``"VERBOSE"`` — into
            ``{output_path}.resources.jsonl``; ``None`` (default) leaves it to
            ``capture_activations(resource_level=...)`` and ``STRAP_RESOURCE_LOG_LEVEL``.
            Stored as the level's name. It does not change the stream, so it is not part of
            the capture's fingerprint.
        upload: ``"s3://bucket/prefix"``: strapd uploads the stream (and its trace, resource
            log and tokens file) there while it captures (docs/OBJECT_STORAGE.md);
            ``capture_activations(upload=...)`` overrides it. Not part of the fingerprint.
        target_throughput_gbps: the capture rate you need, or ``None`` for no target.
            It picks the block size and may lower the codec (see :meth:`transport_plan`).
        max_memory_gb: cap on host buffering in GiB, as in 1.3.1: the shared-memory ring
            size (also the daemon's per-session memory hint). None = sized from the hooked
            modules' bytes per forward pass, 4 MiB to 0.25 GiB (and smaller, with a warning,
            when the daemon's ``--memory-limit`` has less room). A ring larger
            than the daemon admits (``strapd serve --max-ring-size``, 1 GiB by default) is
            shrunk to its limit when the capture starts, with a warning.
        backpressure: ``"block"`` (lossless) or ``"drop"``.
        sampled_positions: for ``SAMPLED_SLICES``: a stride k ≥ 1, or explicit positions
            (negative ones count from the end).
        modules: extra fnmatch patterns on ``named_modules()`` names, e.g.
            ``("model.layers.*.mlp",)``.

    Example:
        >>> cfg = InstrumentationConfig.balanced().with_memory_limit(0.5)
        >>> cfg.compression_algorithm, cfg.max_memory_gb
        ('shuffle', 0.5)
        >>> InstrumentationConfig().with_compression("quant", lossy="rel:1e-3").lossy
        'rel:0.001'
    """

    granularity: HookGranularity = HookGranularity.FULL_TENSOR
    compression_algorithm: Optional[str] = None
    target_throughput_gbps: Optional[float] = None
    max_memory_gb: Optional[float] = None
    compression_level: Optional[int] = None
    backpressure: str = "block"
    sampled_positions: Union[int, Tuple[int, ...]] = 8
    modules: Tuple[str, ...] = field(default_factory=tuple)
    lossy: Optional[Union[str, Dict[str, Any]]] = None
    trace: bool = False
    resource_level: Optional[str] = None
    upload: Optional[str] = None

    def __post_init__(self) -> None:
        # Whether the codec was left to the config (None): only then may a throughput
        # target lower it. A codec someone named is kept.
        object.__setattr__(self, "_codec_chosen", self.compression_algorithm is not None)
        self._normalize()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIELDS and self.__dict__.get("_ready"):
            self._update({name: value})
            return
        object.__setattr__(self, name, value)

    def _update(self, changes: Dict[str, Any]) -> "InstrumentationConfig":
        """Apply ``changes`` to this config, all or nothing: they are validated on a copy."""
        unknown = set(changes) - set(_FIELDS)
        if unknown:
            raise TypeError(f"unknown config fields {sorted(unknown)}")
        trial = object.__new__(type(self))
        trial.__dict__.update({f: getattr(self, f) for f in _FIELDS})
        trial.__dict__.update(changes)
        trial._normalize()
        self.__dict__.update({f: trial.__dict__[f] for f in _FIELDS})
        if "compression_algorithm" in changes:
            object.__setattr__(self, "_codec_chosen", changes["compression_algorithm"] is not None)
        return self

    def _normalize(self) -> None:
        try:
            g = HookGranularity(self.granularity)
        except ValueError:
            g = HookGranularity.__members__.get(str(self.granularity).upper())  # type: ignore[assignment]
        if g is None:
            raise ValueError(
                f"granularity {self.granularity!r} is not one of "
                f"{[m.name for m in HookGranularity]}"
            )
        object.__setattr__(self, "granularity", g)
        algo = self.compression_algorithm
        if algo is None:
            algo = DEFAULT_CODEC
        if not isinstance(algo, str) or algo.lower() not in SUPPORTED_CODECS:
            raise ValueError(
                f"compression_algorithm {algo!r} is not supported (choose from {SUPPORTED_CODECS})"
            )
        algo = algo.lower()
        object.__setattr__(self, "compression_algorithm", algo)
        lvl = self.compression_level
        if lvl is not None:
            if isinstance(lvl, bool) or not isinstance(lvl, int):
                raise TypeError(f"compression_level must be an int, got {lvl!r}")
            lo, hi = CODEC_LEVELS[algo]
            if not lo <= lvl <= hi:
                raise ValueError(f"compression_level {lvl} out of range {lo}..{hi} for {algo}")
        object.__setattr__(self, "lossy", _normalize_lossy(algo, self.lossy))
        if not isinstance(self.trace, bool):
            raise TypeError(f"trace must be a bool, got {self.trace!r}")
        if self.resource_level is not None:
            object.__setattr__(self, "resource_level", ResourceLevel.parse(self.resource_level).name)
        if self.upload is not None:
            from ._options import check_upload_url

            object.__setattr__(self, "upload", check_upload_url(self.upload))
        t = self.target_throughput_gbps
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or t == float("inf"):
                raise ValueError(f"target_throughput_gbps must be a positive number, got {t!r}")
        m = self.max_memory_gb
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)) or math.isnan(m):
                raise TypeError(f"max_memory_gb must be a number or None, got {m!r}")
            if math.isinf(m) or m * (1 << 30) < MIN_RING_BYTES:
                raise ValueError(
                    f"max_memory_gb {m} gives a {m * (1 << 30):.0f}-byte ring; at least "
                    f"{MIN_RING_BYTES} bytes needed"
                )
        if self.backpressure not in BACKPRESSURE_POLICIES:
            raise ValueError(
                f"backpressure {self.backpressure!r} is not one of {BACKPRESSURE_POLICIES}"
            )
        sp = self.sampled_positions
        if isinstance(sp, bool):
            raise TypeError("sampled_positions must be an int stride or a sequence of ints")
        if isinstance(sp, int):
            if sp < 1:
                raise ValueError(f"sampled_positions stride must be >= 1, got {sp}")
        else:
            try:
                tup = tuple(sp)
            except TypeError:
                raise TypeError(
                    "sampled_positions must be an int stride or a sequence of ints"
                ) from None
            if not tup or not all(isinstance(p, int) and not isinstance(p, bool) for p in tup):
                raise ValueError(f"sampled_positions must be a non-empty sequence of ints, got {sp!r}")
            object.__setattr__(self, "sampled_positions", tup)
        mods = self.modules
        if isinstance(mods, str):
            mods = (mods,)
        mods = tuple(mods)
        if not all(isinstance(p, str) and p for p in mods):
            raise ValueError(f"modules must be non-empty strings, got {mods!r}")
        object.__setattr__(self, "modules", mods)

    # ----- presets ---------------------------------------------------------------------------

    @classmethod
    def fast_capture(cls) -> "InstrumentationConfig":
        """No compression: the daemon writes straight from the ring (fastest, biggest files)."""
        return cls(compression_algorithm="none")

    @classmethod
    def balanced(cls) -> "InstrumentationConfig":
        """``shuffle`` level 0: lossless, dtype-aware byte planes + entropy coding (1.2× fp32,
        1.5× bf16 at 500–740 MB/s per core; docs/COMPRESSION.md 7). The default."""
        return cls(compression_algorithm="shuffle", compression_level=0)

    @classmethod
    def max(cls) -> "InstrumentationConfig":  # noqa: A003 - name from the 1.3.1 API
        """The strongest lossless codec measured: ``shuffle`` (zstd levels on activations
        compress less and slower; docs/COMPRESSION.md 7–8)."""
        return cls(compression_algorithm="shuffle", compression_level=0)

    @classmethod
    def max_compression(cls) -> "InstrumentationConfig":
        """**Lossy**: ``quant`` with relative L2 error ≤ 1e-3 per tensor, verified by strapd
        (≈3.1–3.4× on fp32). The only lossy preset."""
        return cls(compression_algorithm="quant", compression_level=0, lossy="rel:1e-3")

    @classmethod
    def attention_analysis(cls) -> "InstrumentationConfig":
        """Attention outputs only, ``shuffle``."""
        return cls(granularity=HookGranularity.ATTENTION_ONLY, compression_algorithm="shuffle")

    @classmethod
    def mlp_analysis(cls) -> "InstrumentationConfig":
        """MLP outputs only, ``shuffle``."""
        return cls(granularity=HookGranularity.MLP_ONLY, compression_algorithm="shuffle")

    @classmethod
    def from_preset(cls, name: str) -> "InstrumentationConfig":
        """Return the preset called ``name`` (``"balanced"``, ``"fast_capture"``, ...).

        Raises:
            ValueError: unknown preset name.
        """
        factory = PRESETS.get(name)
        if factory is None:
            raise ValueError(f"unknown preset {name!r} (choose from {sorted(PRESETS)})")
        return factory()

    # ----- builders --------------------------------------------------------------------------

    def copy(self) -> "InstrumentationConfig":
        """An independent config with the same fields (already valid: not re-checked)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def with_compression(self, algo: Optional[str] = None, level: Optional[int] = None,
                         lossy: Optional[Union[str, Dict[str, Any]]] = None, *,
                         algorithm: Optional[str] = None) -> "InstrumentationConfig":
        """Use codec ``algo`` at ``level`` (None = codec default) with error bound ``lossy``
        (required for ``quant``, refused by lossless codecs). ``algorithm=`` is accepted as
        another name for ``algo``. Changes this config and returns it.

        Example:
            >>> InstrumentationConfig().with_compression("fp16").lossy
            'fp16:0.0'
        """
        if (algo is None) == (algorithm is None):
            raise TypeError("with_compression needs the codec, as algo= or algorithm= (not both)")
        return self._update({"compression_algorithm": algo if algo is not None else algorithm,
                             "compression_level": level, "lossy": lossy})

    def with_trace(self, trace: bool = True) -> "InstrumentationConfig":
        """Ask strapd for a kernel trace beside the capture. Changes this config and returns it."""
        return self._update({"trace": trace})

    def with_resources(self, level: Optional[str] = "MINIMAL") -> "InstrumentationConfig":
        """Record resource events at ``level`` (None: off). Changes this config and returns it."""
        return self._update({"resource_level": level})

    @property
    def lossy_bound(self) -> Optional[Dict[str, Any]]:
        """The bound as ``OPEN.lossy`` carries it (``{"mode", "value"}``), or None."""
        if self.lossy is None:
            return None
        mode, _, value = str(self.lossy).partition(":")
        return {"mode": mode, "value": float(value)}

    def with_memory_limit(self, gb: Optional[float]) -> "InstrumentationConfig":
        """Cap host buffering (the ring and the daemon's memory hint) at ``gb`` GiB; see
        ``max_memory_gb``. Changes this config and returns it."""
        return self._update({"max_memory_gb": gb})

    def with_granularity(self, granularity: Union[HookGranularity, str]) -> "InstrumentationConfig":
        """Hook modules at ``granularity``. Changes this config and returns it."""
        return self._update({"granularity": granularity})

    def with_modules(self, patterns: Union[str, Sequence[str]]) -> "InstrumentationConfig":
        """Also hook modules matching the fnmatch ``patterns``. Changes this config and returns it."""
        return self._update({"modules": (patterns,) if isinstance(patterns, str) else tuple(patterns)})

    def with_throughput(self, gbps: Optional[float]) -> "InstrumentationConfig":
        """Set ``target_throughput_gbps`` (1.3.1's name). Changes this config and returns it."""
        return self._update({"target_throughput_gbps": gbps})

    def with_throughput_target(self, gbps: Optional[float]) -> "InstrumentationConfig":
        """Same as :meth:`with_throughput`."""
        return self.with_throughput(gbps)

    def with_backpressure(self, policy: str) -> "InstrumentationConfig":
        """Ring-full policy ``policy`` (``"block"`` or ``"drop"``). Changes this config and returns it."""
        return self._update({"backpressure": policy})

    def with_sampled_positions(self, positions: Union[int, Sequence[int]]) -> "InstrumentationConfig":
        """``sampled_positions`` (stride or explicit positions). Changes this config and returns it."""
        return self._update({"sampled_positions": positions})

    # ----- effects ---------------------------------------------------------------------------

    @property
    def ring_size(self) -> int:
        """Ring bytes: ``max_memory_gb`` GiB rounded down to a multiple of 4096 (None: 0.25
        GiB here, the largest default ring; a capture sizes its default ring from the model,
        :mod:`._ringsize`). A capture shrinks it to what the daemon admits."""
        if self.max_memory_gb is None:
            return DEFAULT_RING_BYTES
        return int(self.max_memory_gb * (1 << 30)) // 4096 * 4096

    def transport_plan(self, cores: Optional[int] = None) -> TransportPlan:
        """Resolve what the session asks of strapd.

        Rules (documented in README.md):

        * block size: 1 MiB; 4 MiB when ``target_throughput_gbps >= 2`` (fewer blocks, less
          per-block overhead); 256 KiB when the target is below 0.5 GB/s (finer parallelism);
          capped at the largest power of two within an eighth of the ring data region
          (min 64 KiB).
        * codec: when a target is set and the codec cannot sustain it on ``cores`` cores
          (per-core rates in :data:`CODEC_GBPS_PER_CORE`): a codec that was named (in the
          constructor, a preset, :meth:`with_compression` or by assignment) is kept, and
          the plan's ``note`` says it may not keep up; the default codec (none named) is
          lowered: shuffle to none. The capture logs the note as a warning and stores it
          in the stream metadata.

        Args:
            cores: cores the daemon can use (default: ``os.cpu_count()``).

        Returns:
            the :class:`TransportPlan`.
        """
        cores = cores or os.cpu_count() or 1
        codec = self.compression_algorithm or DEFAULT_CODEC  # _normalize leaves a name: never None here
        level = self.compression_level or 0
        target = self.target_throughput_gbps
        block = 1 << 20
        note = ""
        if target is not None:
            if target >= 2:
                block = 4 << 20
            elif target < 0.5:
                block = 256 << 10
            sustained = _codec_gbps(codec, level) * cores
            if sustained < target and codec != "none":
                if self.__dict__.get("_codec_chosen", True) or codec in LOSSY_CODECS:
                    # A named codec wins (a none/lz4/zstd comparison must compare those
                    # three); the target only warns. A lossy codec is never swapped either.
                    note = (f"{codec} level {level} may not sustain {target} GB/s on {cores} cores (about "
                            f"{sustained:.2g} GB/s); kept because it was named (leave compression_algorithm "
                            f"unset to let the target lower the default codec)")
                else:
                    note = (f"the default codec {codec} level {level} cannot sustain {target} GB/s on {cores} "
                            f"cores (about {sustained:.2g} GB/s); using none level 0")
                    codec, level = "none", 0
        data_size = self.ring_size - 4096
        cap = 1 << max(16, (data_size // 8).bit_length() - 1)  # power of two <= data/8, >= 64 KiB
        block = min(block, cap)
        return TransportPlan(
            codec=codec,
            codec_level=level,
            block_size=block,
            ring_size=self.ring_size,
            memory_hint=self.ring_size,
            policy=self.backpressure,
            note=note,
            lossy=self.lossy_bound if codec in LOSSY_CODECS else None,
        )

    def to_dict(self) -> Dict[str, Any]:
        """Return the config as JSON-ready data (stored in the stream metadata)."""
        d = dataclasses.asdict(self)
        d["granularity"] = self.granularity.name
        d["sampled_positions"] = (
            self.sampled_positions if isinstance(self.sampled_positions, int) else list(self.sampled_positions)
        )
        d["modules"] = list(self.modules)
        if d["resource_level"] is None:
            del d["resource_level"]  # configs without resource events read as before
        if d["upload"] is None:
            del d["upload"]  # likewise without an upload
        return d


def _normalize_lossy(codec: str, lossy: Any) -> Optional[str]:
    """Validate ``lossy`` against ``codec`` and return it as ``"mode:value"`` (None when
    the codec is lossless). ``fp16`` / ``fp8`` without a bound get ``"fp16:0.0"`` /
    ``"fp8:0.0"`` (their rounding)."""
    if lossy is None:
        if codec in ("fp16", "fp8"):
            return f"{codec}:0.0"
        if codec == "transform":
            return f"transform:{TRANSFORM_DEFAULT_BOUND!r}"
        if codec in LOSSY_CODECS:
            raise ValueError(
                f"codec {codec!r} is lossy and needs a bound: lossy='rel:1e-3' (relative L2 error) "
                f"or 'abs:1e-2' (max absolute error)"
            )
        return None
    if codec not in LOSSY_CODECS:
        raise ValueError(
            f"lossy={lossy!r} needs a lossy codec ({', '.join(LOSSY_CODECS)}); {codec!r} is lossless"
        )
    if isinstance(lossy, dict):
        unknown = set(lossy) - {"mode", "value"}
        if unknown or "mode" not in lossy:
            raise ValueError(f"lossy dict must be {{'mode': ..., 'value': ...}}, got {lossy!r}")
        mode, value = lossy["mode"], lossy.get("value", 0.0)
    elif isinstance(lossy, str):
        mode, sep, v = lossy.strip().partition(":")
        if sep and not v:
            raise ValueError(f"lossy {lossy!r}: missing value after ':'")
        cos = mode == "transform" and v.startswith("cos:")
        if cos:
            v = v[4:]
        elif mode == "transform" and not sep:
            v, sep = repr(TRANSFORM_DEFAULT_BOUND), ":"
        try:
            value = float(v) if sep else 0.0
        except ValueError:
            raise ValueError(f"lossy {lossy!r}: value {v!r} is not a number") from None
        if cos:
            if not 0 < value < 1:
                raise ValueError(f"lossy {lossy!r}: a cosine bound must be in (0, 1)")
            value = (1 - value * value) ** 0.5
    else:
        raise TypeError(f"lossy must be a str like 'rel:1e-3' or a dict, got {lossy!r}")
    if not isinstance(mode, str) or mode not in LOSSY_MODES[codec]:
        raise ValueError(f"lossy mode {mode!r} does not fit codec {codec!r} (modes: {LOSSY_MODES[codec]})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"lossy value must be a number, got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ValueError(f"lossy value {value!r} must be a finite number >= 0")
    if mode in ("abs", "rel") and not value > 0:
        raise ValueError(f"lossy {mode} bound must be > 0, got {value!r}")
    if mode == "transform" and not 0 < value < 1:
        raise ValueError(f"lossy transform bound (per-row rel-L2) must be in (0, 1), got {value!r}")
    return f"{mode}:{value!r}"


_FIELDS: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(InstrumentationConfig))


def _codec_gbps(codec: str, level: int) -> float:
    """Per-core GB/s assumed for ``codec`` at ``level`` (:data:`CODEC_GBPS_PER_CORE`)."""
    per_core = CODEC_GBPS_PER_CORE[codec]
    if codec == "zstd" and level >= 3 or codec == "lz4" and level >= 1:
        per_core /= 4  # better/best zstd and lz4 HC are far slower; coarse, conservative
    return per_core

PRESETS = {
    "fast_capture": InstrumentationConfig.fast_capture,
    "balanced": InstrumentationConfig.balanced,
    "max": InstrumentationConfig.max,
    "max_compression": InstrumentationConfig.max_compression,
    "attention_analysis": InstrumentationConfig.attention_analysis,
    "mlp_analysis": InstrumentationConfig.mlp_analysis,
}
