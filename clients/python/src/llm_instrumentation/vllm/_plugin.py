"""The vLLM general plugin (entry point ``vllm.general_plugins``: ``strap``).

vLLM calls :func:`register` in every process it starts, before any work. Without
``STRAP_VLLM_OUTPUT`` it returns at once and changes nothing. With it, it wraps four methods
of vLLM's model runner class, once per process:

- ``load_model``: once the model is loaded, a :class:`~._worker.WorkerCapture` is made for
  the runner (hooks on the chosen modules, a strapd session for the worker's stream);
- ``execute_model``: the step's ``SchedulerOutput`` is handed to the capture (the hooks
  split the flat batch by it) and taken back afterwards;
- ``sample_tokens``: the sampled tokens become a ``vllm.sampled`` record and TOKENs;
- ``shutdown``: the session is closed (the stream gets its END and INDEX);

and adds a worker method, ``llm_instrumentation_checkpoint``, for
:func:`llm_instrumentation.vllm.checkpoint` to call through ``collective_rpc``.

In the engine core's process it also wraps two methods of vLLM's ``Scheduler``, because the
worker is told only *that* a request finished (``SchedulerOutput.finished_req_ids``), not
why: ``_free_request`` notes each finished request's status (aborted, stopped, length
capped, ...), and ``schedule`` attaches the notes of the requests its output lists as
finished to that output (an attribute, which the multi-process executors' pickling carries
to the workers). The worker writes them into its stream as ``vllm.finished`` records.

Wrapping the runner class, rather than asking for a worker extension, works for every way
of starting the engine (``LLM(...)``, ``vllm serve``, in-process or multi-process) without
touching the engine's arguments; the same processes also run the engine front end, where
the wrapped class is never used.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, List, Optional

from ._settings import Settings
from ._worker import FINISH_REASONS, FINISHES_NOTED

# A child of vLLM's logger: its handler prints these lines with the engine's own.
log = logging.getLogger("vllm.llm_instrumentation")

_PATCHED = False
#: the worker method :func:`llm_instrumentation.vllm.checkpoint` calls through collective_rpc
RPC_CHECKPOINT = "llm_instrumentation_checkpoint"
#: the captures made in this process (one per model runner), for :func:`captures`
_CAPTURES: List[Any] = []


def register() -> None:
    """vLLM's plugin entry point. Does nothing unless ``STRAP_VLLM_OUTPUT`` is set.

    Raises:
        ValueError: a setting that is not understood (vLLM reports it at start-up).
    """
    global _PATCHED
    settings = Settings.from_env()
    if settings is None or _PATCHED:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    classes: List[type] = [GPUModelRunner]
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        classes.append(CPUModelRunner)
    except Exception:  # a build without the CPU runner
        pass
    for cls in classes:
        if "load_model" in vars(cls):
            setattr(cls, "load_model", _wrap_load(vars(cls)["load_model"], settings))
    setattr(GPUModelRunner, "execute_model", _wrap_execute(GPUModelRunner.execute_model))
    if hasattr(GPUModelRunner, "sample_tokens"):
        setattr(GPUModelRunner, "sample_tokens", _wrap_sample(GPUModelRunner.sample_tokens))
    if hasattr(GPUModelRunner, "shutdown"):
        setattr(GPUModelRunner, "shutdown", _wrap_shutdown(GPUModelRunner.shutdown))
    try:
        from vllm.v1.core.sched.scheduler import Scheduler

        setattr(Scheduler, "_free_request", _wrap_free(Scheduler._free_request))
        setattr(Scheduler, "schedule", _wrap_schedule(Scheduler.schedule))
    except (ImportError, AttributeError) as e:  # another scheduler layout: no reasons, said so
        log.warning("llm_instrumentation.vllm: finished requests will not say why (%s)", e)
    from vllm.v1.worker.worker_base import WorkerBase

    # A worker method for collective_rpc by name (a callable would need vLLM's insecure
    # pickle serialization between processes): llm_instrumentation.vllm.checkpoint(llm).
    setattr(WorkerBase, RPC_CHECKPOINT, _rpc_checkpoint)
    _PATCHED = True
    log.info("llm_instrumentation.vllm: capture enabled into %s (modules %s, requests %s)",
             settings.output_dir, ",".join(settings.modules), settings.requests)


def _capture_of(runner: Any) -> Optional[Any]:
    return getattr(runner, "_strap_capture", None)


def _wrap_load(orig: Callable[..., Any], settings: Settings) -> Callable[..., Any]:
    @functools.wraps(orig)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        if _capture_of(self) is None:  # a subclass's load_model may call its parent's
            from ._worker import WorkerCapture

            cap = WorkerCapture(self, settings)
            self._strap_capture = cap
            cap.start()
            _CAPTURES.append(cap)
        return out

    return load_model


def _wrap_execute(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        cap = _capture_of(self)
        if cap is None or cap.session is None:
            return orig(self, scheduler_output, *args, **kwargs)
        cap.begin_step(scheduler_output)
        try:
            out = orig(self, scheduler_output, *args, **kwargs)
        finally:
            cap.end_step()
        if out is not None:  # a runner that samples inside execute_model
            cap.sampled(out)
        return out

    return execute_model


def _wrap_sample(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        cap = _capture_of(self)
        if cap is not None and cap.session is not None:
            cap.sampled(out)
        return out

    return sample_tokens


def _wrap_shutdown(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        cap = _capture_of(self)
        if cap is not None:
            cap.close()
        return orig(self, *args, **kwargs)

    return shutdown


def finish_reason(status: Any) -> str:
    """vLLM's finished ``RequestStatus`` as the stream names it: ``FINISHED_ABORTED`` ->
    ``"aborted"``, ``FINISHED_STOPPED`` -> ``"stopped"``, ``FINISHED_LENGTH_CAPPED`` ->
    ``"length_capped"``, and so on."""
    name = getattr(status, "name", str(status))
    return name[len("FINISHED_"):].lower() if name.startswith("FINISHED_") else name.lower()


def _wrap_free(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _free_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            FINISHES_NOTED[request.request_id] = finish_reason(request.status)
        except Exception as e:  # never stop the scheduler: the record then says "unknown"
            log.warning("llm_instrumentation.vllm: finish reason not noted: %s", e)
        return orig(self, request, *args, **kwargs)

    return _free_request


def _wrap_schedule(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        ids = getattr(out, "finished_req_ids", None)
        if ids:
            try:
                setattr(out, FINISH_REASONS, {r: FINISHES_NOTED.pop(r) for r in ids if r in FINISHES_NOTED})
            except Exception as e:
                log.warning("llm_instrumentation.vllm: finish reasons not attached: %s", e)
        return out

    return schedule


def _rpc_checkpoint(worker: Any) -> Optional[dict]:
    """In a worker: checkpoint its capture (None where it stores nothing)."""
    cap = _capture_of(getattr(worker, "model_runner", None))
    return cap.checkpoint() if cap is not None else None


def captures() -> List[Any]:
    """The :class:`~._worker.WorkerCapture` objects of this process."""
    return list(_CAPTURES)
