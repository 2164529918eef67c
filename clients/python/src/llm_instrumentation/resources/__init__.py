"""Resource events of a PyTorch model: memory, compute, MLP, attention→MLP handoff, KV cache.

The event types and field names follow the LLaMA resource instrumentation the project was
seeded with (``memory_allocation``, ``compute_execution``, ``mlp_operation``,
``component_handoff``, ``resource_session_start`` / ``resource_session_summary``) plus
``kv_cache_update``; docs/RESOURCE_EVENTS.md is the field reference. What is measured and
what is computed is said on every event: durations are measured (CUDA events on a GPU,
``perf_counter`` around the module on a CPU), FLOPs are computed from tensor shapes
(``"flops_source": "computed_from_shapes"``), throughputs follow from the two.

The package is cut at the monitor's thread boundary (docs/ARCHITECTURE.md):

- ``levels``: the level and the ``STRAP_RESOURCE_*`` settings (a leaf: ``config`` imports it);
- ``records``: THE schema of what the model's thread hands the writer (the C header is
  generated from it);
- model thread: ``sites`` (what each module is), ``caches``, ``wrappers``, ``elementwise``,
  ``recorders``;
- writer thread: ``events`` (the builders and the one place each figure is computed),
  ``templates``, ``lines``/``attention_lines``, ``state``, ``writer``, ``native`` (the C paths);
- ``sinks`` (a JSONL file, or strapd), ``system`` (memory readings), ``monitor`` (life cycle).

The names below are importable from here as before; the monitor's are loaded on first use,
so that importing the level does not import torch, threads or the C extension.

Example:
    >>> from llm_instrumentation.resources import monitor_resources  # doctest: +SKIP
    >>> with monitor_resources(model, level="DETAILED", path="run.resources.jsonl") as mon:
    ...     model(input_ids)
"""

from __future__ import annotations

import importlib
from typing import Any

from .levels import MINIMAL_ALLOCATION_BYTES, ResourceLevel, ResourceSettings, resource_settings_from_env

__all__ = [
    "ResourceLevel",
    "ResourceMonitor",
    "ResourceSettings",
    "monitor_resources",
    "resource_settings_from_env",
    "JsonlSink",
    "SessionSink",
    "MINIMAL_ALLOCATION_BYTES",
]

#: Names loaded on first access, by the module that defines them.
_LAZY = {
    "ResourceMonitor": "monitor",
    "monitor_resources": "monitor",
    "JsonlSink": "sinks",
    "SessionSink": "sinks",
    "FLOPS_PER_ELEMENT": "sites",
    "ATTENTION_NAMES": "sites",
    "MLP_NAMES": "sites",
    "MLP_OPS": "sites",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
