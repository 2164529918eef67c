"""Capture every layer of every request from vLLM (docs/VLLM.md).

A vLLM *general plugin* (entry point group ``vllm.general_plugins``, name ``strap``, so it
loads in every process vLLM starts): with ``STRAP_VLLM_OUTPUT=DIR`` set, each worker
streams the chosen modules' outputs for every captured request, prompt and generated
tokens, split by request and position, through strapd into ``DIR``; without it the plugin
does nothing. Settings (environment, read in each process):

- ``STRAP_VLLM_OUTPUT``: the directory (one stream per worker).
- ``STRAP_VLLM_MODULES``: comma-separated fnmatch patterns on transformers' module names;
  default ``model.layers.*``, the decoder layers' outputs (the residual stream).
- ``STRAP_VLLM_PRESET``: an :class:`~llm_instrumentation.InstrumentationConfig` preset
  (codec; ``attention_analysis``/``mlp_analysis`` also choose the modules).
- ``STRAP_VLLM_REQUESTS``: ``all`` (default; a request opts out with
  ``SamplingParams(extra_args={"strap": False})``) or ``opt-in`` (only requests with
  ``extra_args={"strap": True}``; the OpenAI server's ``vllm_xargs`` carry it).

The model must run eagerly (``enforce_eager=True``): forward hooks do not fire inside
compiled graphs or CUDA graphs, and the plugin refuses to start rather than capture nothing.

An engine of several workers (tensor or pipeline parallel) writes one stream per worker and,
from rank 0 at shutdown, their capture set's manifest (docs/DISTRIBUTED.md D4).

Reading: :func:`list_requests`, :func:`load_request` and :func:`iter_requests` (every
request, each stream read once) of a directory, or of an engine's capture-set manifest; :class:`~llm_instrumentation.data.ActivationDataset` and the exports
read a vLLM capture by request (docs/VLLM.md 4).

Example:
    >>> # STRAP_VLLM_OUTPUT=/data/caps python serve.py, then:
    >>> from llm_instrumentation.vllm import list_requests, load_request
    >>> r = load_request("/data/caps", list_requests("/data/caps")[0])
    >>> r["model.layers.0"].shape, r.positions, r.token_ids
"""

from __future__ import annotations

from typing import Any, List, Optional

from ._plugin import register
from ._reader import RequestCapture, iter_requests, list_requests, load_request
from ._settings import Settings

__all__ = ["register", "list_requests", "load_request", "iter_requests", "RequestCapture", "Settings", "checkpoint"]


def checkpoint(llm: Any) -> List[Optional[dict]]:
    """Make everything each worker of ``llm`` captured so far durable in its stream, so
    :func:`load_request` sees finished requests while the engine goes on.

    Args:
        llm: a ``vllm.LLM`` (its ``collective_rpc`` runs this in every worker, by the method
            name the plugin adds to vLLM's workers).

    Returns:
        per worker ``{"path", "offset", "packets", "tokens"}`` (None: a worker that stores
        nothing, e.g. a tensor-parallel rank other than 0).

    The workers have the method only where the plugin is active (``STRAP_VLLM_OUTPUT`` set
    when vLLM started); vLLM's own error says so otherwise.
    """
    from ._plugin import RPC_CHECKPOINT

    return llm.collective_rpc(RPC_CHECKPOINT)
