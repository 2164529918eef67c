"""The plugin's settings, read from the environment of each vLLM process (docs/VLLM.md).

The environment is the one channel that reaches every process vLLM starts (the engine
core and its workers inherit it), whether the engine runs in-process, multi-process or
behind ``vllm serve``; nothing here needs vLLM itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

#: The directory the captures go into; without it the plugin does nothing.
ENV_OUTPUT = "STRAP_VLLM_OUTPUT"
#: Comma-separated fnmatch patterns on transformers' module names (docs/VLLM.md 2).
ENV_MODULES = "STRAP_VLLM_MODULES"
#: An :class:`~llm_instrumentation.config.InstrumentationConfig` preset name.
ENV_PRESET = "STRAP_VLLM_PRESET"
#: ``all`` (default) or ``opt-in``.
ENV_REQUESTS = "STRAP_VLLM_REQUESTS"
#: A size (``512MiB``, ``2GB``, bytes): each worker's stream is ended and a new one begun
#: once this many bytes of records went into it (docs/VLLM.md 3, "Segments").
ENV_ROTATE = "STRAP_VLLM_ROTATE"
#: The ``SamplingParams.extra_args`` key of the per-request switch (also ``vllm_xargs``).
EXTRA_ARG = "strap"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str, name: str) -> int:
    """Bytes from ``"1073741824"``, ``"512MiB"``, ``"2 GB"`` (units B, kB/KB, MB, GB, TB in
    powers of 1000; KiB, MiB, GiB, TiB in powers of 1024; case ignored).

    Raises:
        ValueError: not a positive whole number of bytes with a known unit (``name`` says
            which setting).
    """
    m = re.fullmatch(r"([0-9][0-9.eE+]*)\s*([a-z]*)", text.strip().lower())
    try:
        if m is None:
            raise ValueError(text)
        v = float(m.group(1)) * _UNITS[m.group(2)]
    except (KeyError, ValueError):
        raise ValueError(f"{name}={text!r} is not a size (a number with B, KB, MB, GB, TB or KiB, MiB, GiB, "
                         "TiB)") from None
    if not v >= 1 or v != v or v == float("inf"):
        raise ValueError(f"{name}={text!r} is not a positive size")
    return int(v)

#: What each preset's granularity captures when ``STRAP_VLLM_MODULES`` is not set: the
#: residual stream (every decoder layer's output) unless the preset is about attention or MLP.
_PRESET_MODULES = {
    "attention_analysis": ("model.layers.*.self_attn",),
    "mlp_analysis": ("model.layers.*.mlp",),
}
DEFAULT_MODULES: Tuple[str, ...] = ("model.layers.*",)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    """The plugin's settings.

    Attributes:
        output_dir: where each worker's stream goes (``STRAP_VLLM_OUTPUT``).
        modules: fnmatch patterns on transformers' module names; the default
            ``model.layers.*`` means the decoder layers' outputs only (the residual stream),
            not their submodules (docs/VLLM.md 2).
        preset: the capture config preset (None: :class:`InstrumentationConfig`'s default).
        requests: ``"all"`` (every request unless it opts out with ``extra_args={"strap":
            False}``) or ``"opt-in"`` (only requests with ``extra_args={"strap": True}``).
        rotate_bytes: end a worker's stream and begin the next segment once this many bytes
            of records went into it (``STRAP_VLLM_ROTATE``); None: one stream per worker.
    """

    output_dir: str
    modules: Tuple[str, ...] = DEFAULT_MODULES
    preset: Optional[str] = None
    requests: str = "all"
    rotate_bytes: Optional[int] = None

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Optional["Settings"]:
        """The settings, or None when ``STRAP_VLLM_OUTPUT`` is unset or empty.

        Raises:
            ValueError: a value that is not understood (a typo must not capture something
                other than what was asked, silently).
        """
        env = os.environ if env is None else env
        out = env.get(ENV_OUTPUT, "").strip()
        if not out:
            return None
        preset = env.get(ENV_PRESET, "").strip() or None
        if preset is not None:
            from ..config import PRESETS

            if preset not in PRESETS:
                raise ValueError(f"{ENV_PRESET}={preset!r} is not a preset (choose from {sorted(PRESETS)})")
        raw = env.get(ENV_MODULES, "").strip()
        if raw:
            modules = tuple(p.strip() for p in raw.split(",") if p.strip())
        else:
            modules = _PRESET_MODULES.get(preset or "", DEFAULT_MODULES)
        requests = env.get(ENV_REQUESTS, "all").strip().lower() or "all"
        if requests not in ("all", "opt-in"):
            raise ValueError(f"{ENV_REQUESTS}={requests!r} is not 'all' or 'opt-in'")
        raw = env.get(ENV_ROTATE, "").strip()
        rotate = parse_size(raw, ENV_ROTATE) if raw else None
        return cls(output_dir=os.path.abspath(out), modules=modules, preset=preset, requests=requests,
                   rotate_bytes=rotate)


def wants(extra_args: Optional[Mapping[str, Any]], requests: str) -> bool:
    """Whether a request is captured: its ``extra_args["strap"]`` (a bool, or the strings
    the OpenAI server's ``vllm_xargs`` carry) against the ``requests`` mode.

    Raises:
        ValueError: a switch value that is neither true nor false.
    """
    v = (extra_args or {}).get(EXTRA_ARG)
    if v is None:
        return requests == "all"
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"extra_args[{EXTRA_ARG!r}]={v!r} is not true or false")
