"""How much the resource monitor records, and the settings the environment gives it.

A leaf module: ``config.py`` and ``_options.py`` import :class:`ResourceLevel` at their top
without pulling in the monitor (torch, threads, the C extension).
"""

from __future__ import annotations

import enum
import os
from typing import Mapping, Optional, Tuple, Union

__all__ = ["MINIMAL_ALLOCATION_BYTES", "ResourceLevel", "ResourceSettings", "resource_settings_from_env"]

#: At MINIMAL only allocations larger than this are reported (seed: "> 1 MB").
MINIMAL_ALLOCATION_BYTES = 1 << 20


class ResourceLevel(enum.IntEnum):
    """How much is recorded (seed 003's levels).

    MINIMAL: matrix multiplications (every ``Linear``), attention, MLP projections, the KV
    cache, one event per forward pass, and allocations larger than 1 MiB. DETAILED: also
    norms, activation functions, embeddings, the attention→MLP handoff and every allocation.
    VERBOSE: also element-wise tensor operations (add, mul, ...) and every other leaf module.
    """

    MINIMAL = 1
    DETAILED = 2
    VERBOSE = 3

    @classmethod
    def parse(cls, value: Union["ResourceLevel", str, int]) -> "ResourceLevel":
        """A level from a name (case-insensitive), an int 1–3, or a level.

        Raises:
            ValueError: anything else, naming the accepted values.
        """
        if isinstance(value, ResourceLevel):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        raise ValueError(f"resource level must be one of MINIMAL, DETAILED, VERBOSE, got {value!r}")


_ENV = {
    "level": ("STRAP_RESOURCE_LOG_LEVEL", "LLAMA_RESOURCE_LOG_LEVEL"),
    "path": ("STRAP_RESOURCE_LOG_PATH", "LLAMA_RESOURCE_LOG_PATH"),
    "disabled": ("STRAP_RESOURCE_LOG_DISABLED", "LLAMA_RESOURCE_DISABLED"),
}


class ResourceSettings:
    """What the environment asks for.

    Attributes:
        level: the level set (None when neither variable is set).
        path: the log path set (None when unset).
        disabled: resource tracking is switched off for the process.
    """

    def __init__(self, level: Optional[ResourceLevel], path: Optional[str], disabled: bool) -> None:
        self.level = level
        self.path = path
        self.disabled = disabled

    def __repr__(self) -> str:
        return f"ResourceSettings(level={self.level!r}, path={self.path!r}, disabled={self.disabled})"


def _env_value(environ: Mapping[str, str], key: str) -> Tuple[Optional[str], Optional[str]]:
    for name in _ENV[key]:
        v = environ.get(name)
        if v is not None and v.strip() != "":
            return name, v.strip()
    return None, None


def resource_settings_from_env(environ: Optional[Mapping[str, str]] = None) -> ResourceSettings:
    """Read ``STRAP_RESOURCE_LOG_LEVEL``, ``STRAP_RESOURCE_LOG_PATH`` and
    ``STRAP_RESOURCE_LOG_DISABLED`` (the seed's ``LLAMA_RESOURCE_LOG_LEVEL``,
    ``LLAMA_RESOURCE_LOG_PATH`` and ``LLAMA_RESOURCE_DISABLED`` are aliases; the STRAP name
    wins when both are set).

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        the settings.

    Raises:
        ValueError: a level that is not MINIMAL/DETAILED/VERBOSE, or a disabled flag that is
            not a boolean word (1/0, true/false, yes/no, on/off).
    """
    env = os.environ if environ is None else environ
    name, lv = _env_value(env, "level")
    level = None
    if lv is not None:
        try:
            level = ResourceLevel.parse(lv)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    _, path = _env_value(env, "path")
    name, dv = _env_value(env, "disabled")
    disabled = False
    if dv is not None:
        low = dv.lower()
        if low in ("1", "true", "yes", "on"):
            disabled = True
        elif low in ("0", "false", "no", "off"):
            disabled = False
        else:
            raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {dv!r}")
    return ResourceSettings(level, path, disabled)
