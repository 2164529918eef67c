"""The capture inside one vLLM worker: forward hooks on the model the worker runs, the
batch split by request, and one strapd session writing the worker's stream (docs/VLLM.md).

vLLM runs every scheduled request in one flat batch per step: row ``i`` of a module's
output is one token of one request. Per step this writes one ``vllm.rows`` record (int64
``[rows, 2]``: position and input token id of each captured row, meta naming the requests
in row order and how many rows each holds), then one record per captured module holding
the same rows, then, once the step's tokens are sampled, one ``vllm.sampled`` record
(int64 ``[k, 2]``: position and token id, meta naming each row's request) followed by one
TOKEN per generated token in the same order. Every record of a step carries the step's
forward counter, which is how a reader pairs them (docs/VLLM.md 3).

The engine must not stop because of the capture: an error here (strapd gone, a batch
layout this code does not know) is logged once, the capture of this worker ends, and vLLM
goes on serving.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _names
from ._settings import Settings, wants

if TYPE_CHECKING:  # pragma: no cover
    import torch

# A child of vLLM's logger: its handler prints these lines with the engine's own.
log = logging.getLogger("vllm.llm_instrumentation")

#: Record names of the step index, of the sampled tokens and of the finished requests
#: (docs/VLLM.md 3).
ROWS = "vllm.rows"
SAMPLED = "vllm.sampled"
FINISHED = "vllm.finished"
#: the attribute of a SchedulerOutput holding ``{request id: finish reason}``
FINISH_REASONS = "strap_finish_reasons"
#: request id -> finish reason, noted by this process's scheduler (the plugin's wrapper of
#: ``Scheduler._free_request``) and not yet attached to a SchedulerOutput (the last requests
#: of an in-process engine are never scheduled after they finish: the worker's close reads
#: them here)
FINISHES_NOTED: Dict[str, str] = {}
#: The reason of a finish the scheduler did not tell (docs/VLLM.md 3).
UNKNOWN = "unknown"
#: The layout of those records; a reader refuses a stream of another.
INDEX_FORMAT = 1


class WorkerCapture:
    """The capture of one worker's model runner.

    Args:
        runner: vLLM's model runner (``GPUModelRunner`` or a subclass), its model loaded.
        settings: the plugin's settings.
    """

    def __init__(self, runner: Any, settings: Settings) -> None:
        self.runner = runner
        self.settings = settings
        self.session: Any = None
        self.path: Optional[str] = None
        self.modules: List[Tuple[str, str]] = []
        self.failed = False
        #: whether this worker stores records (tp rank 0 of its pipeline stage); the others
        #: write a stream without records (docs/VLLM.md 5)
        self.stores = True
        #: this worker's place (:func:`_ranks`), set by :meth:`start`
        self.rank: Dict[str, Any] = {}
        #: the capture set's manifest, once this worker (rank 0 of several) wrote it
        self.capture_set_path: Optional[str] = None
        self.forward = 0
        self._handles: List[Any] = []
        #: CaptureSession.record_sum and tokens_to_ring (the fused writes, docs/VLLM.md 9), set
        #: by _install; called with the session first, so a benchmark can switch them off
        self._record_sum: Any = None
        self._record_tokens: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._paused = False
        self._sched: Any = None
        #: this step's captured rows: None, or (rows selector, request ids, counts)
        self._rows: Any = None
        #: per captured request seen: whether it is captured (absent: not seen yet)
        self._want: Dict[str, bool] = {}
        #: per captured request: the last position computed in the current step
        self._last_pos: Dict[str, int] = {}
        #: captured requests whose first rows were written (their prompt is in the stream)
        self._seen: set = set()
        #: with ``STRAP_VLLM_ROTATE``: the stream's segment number; the stream name segments
        #: are numbered from
        self.segment = 0
        self._base_name: Optional[str] = None
        #: each rotation's (close, open) milliseconds: the engine waits for both between steps
        self.rotations: List[Tuple[float, float]] = []

    # ----- set-up ------------------------------------------------------------------------------

    def start(self) -> "WorkerCapture":
        """Check the engine runs hooks, choose the modules, open the session, install hooks.

        Raises:
            RuntimeError: the engine compiles the model or captures CUDA graphs (forward
                hooks would not fire inside them: run with ``enforce_eager=True``).
            ValueError: a module pattern that selects nothing capturable.
        """
        runner = self.runner
        vc = runner.vllm_config
        _check_eager(vc)
        model = runner.get_model()
        self.modules = _names.select(model, self.settings.modules)
        rank = _ranks(vc)
        self.rank = rank
        if self.settings.rotate_bytes is not None and rank["world_size"] > 1:
            raise ValueError(f"STRAP_VLLM_ROTATE works with an engine of one worker: this one has "
                             f"{rank['world_size']} (tp {rank['tp_size']} x pp {rank['pp_size']}), whose capture set "
                             "names one stream per rank (docs/VLLM.md 3)")
        # Every supported module's output is replicated across tensor-parallel ranks (after
        # their all-reduce): tp rank 0 of each pipeline stage stores it once. The other tp
        # ranks still write a stream, holding no record, so that the engine's workers make
        # a capture set with one stream per rank (docs/DISTRIBUTED.md D4, docs/VLLM.md 5).
        self.stores = rank["tp_rank"] == 0
        self._open(model, vc, rank)
        atexit.register(self.close)
        if not self.stores:
            log.info("llm_instrumentation.vllm: tensor-parallel rank %d stores no record (tp rank 0 holds the "
                     "replicated outputs); its stream %s makes the capture set whole", rank["tp_rank"], self.path)
            return self
        self._install()
        log.info("llm_instrumentation.vllm: capturing %d modules of %s into %s", len(self.modules),
                 type(model).__name__, self.path)
        return self

    def _install(self) -> None:
        # imported here, not at the top: the plugin module loads in every vLLM process,
        # capturing or not, and this pulls in the session's modules
        from .._session import CaptureSession

        self._record_sum = CaptureSession.record_sum
        self._record_tokens = CaptureSession.tokens_to_ring
        model = self.runner.get_model()
        self._handles.append(model.register_forward_pre_hook(self._on_forward_pre, with_kwargs=True))
        named = dict(model.named_modules())
        for name, kind in self.modules:
            self._handles.append(named[name].register_forward_hook(functools.partial(self._on_output, name, kind)))
        self._handles.append(model.register_forward_hook(self._on_forward_end))

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` took the hooks off."""
        return self._paused

    def pause(self) -> None:
        """Take the hooks off, the session kept open: the model runs as without the plugin
        (the per-step wrappers left are a few attribute reads). Steps run while paused leave
        nothing in the stream, their sampled tokens included, so a request running across a
        pause does not read back (``load_request`` finds a gap in its tokens): pause between
        batches. Finished requests are still marked. Used by bench/vllm_ab.py to time plain
        and captured batches in one engine."""
        if self.session is None or self.failed or self._paused or not self.stores:
            return
        for h in self._handles:
            h.remove()
        self._handles = []
        self._rows = None
        self._paused = True

    def resume(self) -> None:
        """Put the hooks back after :meth:`pause`."""
        if self.session is None or self.failed or not self._paused or not self.stores:
            return
        self._paused = False
        self._install()

    def _open(self, model: Any, vc: Any, rank: Dict[str, int]) -> None:
        import dataclasses

        from .. import _open
        from .._session import open_session
        from ..config import AUTO_RING_MIN_BYTES, InstrumentationConfig

        cfg = InstrumentationConfig.from_preset(self.settings.preset) if self.settings.preset \
            else InstrumentationConfig()
        plan = cfg.transport_plan()
        if cfg.max_memory_gb is None:
            ring = _ring_size(vc, len(self.modules)) if self.stores else AUTO_RING_MIN_BYTES
            plan = dataclasses.replace(plan, ring_size=ring, memory_hint=ring)
        os.makedirs(self.settings.output_dir, exist_ok=True)
        if self._base_name is None:
            self._base_name = stream_name(vc, rank)
        name = self._base_name
        if self.settings.rotate_bytes is not None:
            name = segment_name(name, self.segment)
        self.path = os.path.join(self.settings.output_dir, name)
        names = [n for n, _ in self.modules]
        fp = _open.fingerprint(model, cfg, plan, names)
        dist = self._distributed(vc, rank)
        req = _open.open_request(model, cfg, plan, names, self.path, fp, None, distributed=dist)
        req["metadata"] = {**req["metadata"], "vllm": self._metadata(vc, rank)}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
        try:
            self.session = open_session(None, True, 120.0, plan.ring_size, plan.policy, fd, None, req,
                                        ring_explicit=cfg.max_memory_gb is not None)
        finally:
            os.close(fd)  # strapd holds its own descriptor

    def _distributed(self, vc: Any, rank: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The stream header's ``distributed`` object of a worker of several (the capture
        set's facts, docs/DISTRIBUTED.md D1, D2; vLLM's own place for each key), None for an
        engine of one worker."""
        if rank["world_size"] <= 1:
            return None
        import socket

        d: Dict[str, Any] = {
            "rank": rank["rank"], "world_size": rank["world_size"], "local_rank": rank["local_rank"],
            "local_world_size": None, "host": socket.gethostname(), "source": "torch.distributed",
            "tp_rank": rank["tp_rank"], "tp_size": rank["tp_size"], "pp_stage": rank["pp_rank"],
            "pp_size": rank["pp_size"], "dp_rank": rank["dp_rank"], "dp_size": rank["dp_size"],
            "layout_source": "vllm", "job_id": engine_stem(vc, rank),
        }
        if rank["tp_size"] > 1:
            # What the tp ranks' outputs are (D2): every capturable module's output, and the
            # batch index records, are the same on every tp rank; tp rank 0 stores them.
            d["replicated"] = "tp_rank0"
            d["modules"] = {n: {"kind": "replicated", "source": "vllm"}
                            for n in [ROWS, SAMPLED, FINISHED] + [n for n, _ in self.modules]}
        return d

    def _metadata(self, vc: Any, rank: Dict[str, int]) -> Dict[str, Any]:
        """The stream header's ``vllm`` object (docs/VLLM.md 3)."""
        import vllm
        from vllm import envs

        mc = vc.model_config
        return {
            "index_format": INDEX_FORMAT,
            "vllm_version": getattr(vllm, "__version__", "?"),
            "model": str(mc.model),
            "dtype": str(mc.dtype).replace("torch.", ""),
            "modules": {n: k for n, k in self.modules},
            "requests": self.settings.requests,
            # The worker sees the engine's internal request ids: the id given to vLLM plus
            # "-" and 8 random hex digits, unless this is set (docs/VLLM.md 4).
            "request_id_randomized": not bool(getattr(envs, "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", False)),
            **{k: rank[k] for k in ("rank", "tp_rank", "tp_size", "pp_rank", "pp_size")},
            **({"segment": self.segment} if self.settings.rotate_bytes is not None else {}),
        }

    # ----- per step ----------------------------------------------------------------------------

    def begin_step(self, scheduler_output: Any) -> None:
        """Before ``execute_model``: the step's schedule (what the hooks split rows by)."""
        if not self.stores:
            return
        self._sched = scheduler_output
        fin = getattr(scheduler_output, "finished_req_ids", None)
        if fin:
            reasons = getattr(scheduler_output, FINISH_REASONS, None) or {}
            done = {r: reasons.get(r) or FINISHES_NOTED.pop(r, UNKNOWN) for r in fin if r in self._seen}
            for r in fin:
                self._want.pop(r, None)
                self._seen.discard(r)
            if done:
                self._finished(done)
        # After the finish marks, which belong with the requests' last rows in this segment.
        rot = self.settings.rotate_bytes
        if rot is not None and self.session is not None and not self.failed and self.session.bytes_in >= rot:
            self._rotate()

    def _rotate(self) -> None:
        """End this segment's stream (CLOSE: strapd writes its index; it is whole, readable and
        movable from now on) and begin the next one, between two steps. Requests running
        across the boundary have rows in both; the reader puts them together."""
        s, self.session = self.session, None
        try:
            t0 = time.perf_counter()
            summary = s.close().to_body()
            closed, t1 = self.path, time.perf_counter()
            self.segment += 1
            self._open(self.runner.get_model(), self.runner.vllm_config, self.rank)
            # the engine waits for both (it is between two steps): said, so a size can be chosen
            self.rotations.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
            log.info("llm_instrumentation.vllm: segment %s closed in %.1f ms (%s), %s opened in %.1f ms", closed,
                     (t1 - t0) * 1e3, summary, self.path, (time.perf_counter() - t1) * 1e3)
        except Exception as e:
            self._fail(e)
        finally:
            s.shutdown()

    def _finished(self, done: Dict[str, str]) -> None:
        """A ``vllm.finished`` record: the requests whose capture ends, and why."""
        if self.failed or self.session is None:
            return
        try:
            import torch

            counts = []
            for r in done:
                st = self.runner.requests.get(r)
                n = -1
                if st is not None:
                    n = len(getattr(st, "prompt_token_ids", None) or ()) + len(getattr(st, "output_token_ids", ()))
                counts.append(n)
            s = self.session
            s.write_tensor(FINISHED, torch.tensor(counts, dtype=torch.int64), s.tokens, self.forward,
                           {"requests": list(done), "reasons": list(done.values())})
        except Exception as e:
            self._fail(e)

    def end_step(self) -> None:
        """After ``execute_model``: hooks that fire outside a step (warm-up, profiling,
        dummy runs) capture nothing."""
        self._sched = None

    def _on_forward_pre(self, module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        self._rows = None
        if self.failed or self._sched is None:
            return
        try:
            self._plan(args, kwargs)
        except Exception as e:
            self._fail(e)

    def _plan(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        import torch

        runner, sched = self.runner, self._sched
        req_ids = list(runner.input_batch.req_ids)
        counts = [int(sched.num_scheduled_tokens.get(r, 0)) for r in req_ids]
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        qsl = _query_start_loc(len(req_ids))
        if qsl is not None and qsl != starts:
            raise RuntimeError(f"the forward context's query_start_loc {qsl} disagrees with the schedule's rows "
                               f"{starts} for requests {req_ids}: this vLLM lays the batch out differently")
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if positions is None or positions.dim() != 1:
            raise RuntimeError("the model was called without 1-D positions (M-RoPE and other position "
                               "layouts are not supported)")
        n = starts[-1]
        if positions.shape[0] < n:
            raise RuntimeError(f"{positions.shape[0]} position rows for {n} scheduled tokens")
        self._last_pos = {}
        segs: List[Tuple[str, int, int]] = []
        for r, s, c in zip(req_ids, starts, counts):
            if c and self._wants(r):
                segs.append((r, s, c))
        if not segs:
            return
        if sum(c for _, _, c in segs) == segs[-1][1] + segs[-1][2] - segs[0][1]:
            sel: Any = slice(segs[0][1], segs[-1][1] + segs[-1][2])  # contiguous: a view
        else:
            sel = torch.cat([torch.arange(s, s + c) for _, s, c in segs]).to(positions.device)
        pos = positions[sel]
        ids = input_ids[sel] if input_ids is not None else torch.full_like(pos, -1)
        rows = torch.stack([pos.to(torch.int64), ids.to(torch.int64)], dim=1).cpu()
        pos_list = rows[:, 0].tolist()
        meta: Dict[str, Any] = {"requests": [r for r, _, _ in segs], "counts": [c for _, _, c in segs]}
        new: Dict[str, Any] = {}
        k = 0
        for r, _, c in segs:
            if r not in self._seen:
                # A request's first rows: its prompt, and the first position computed (past
                # the prompt tokens served from the prefix cache, which have no forward).
                self._seen.add(r)
                st = runner.requests.get(r)
                new[r] = {"prompt": list(getattr(st, "prompt_token_ids", None) or []), "computed": int(pos_list[k])}
            self._last_pos[r] = pos_list[k + c - 1]
            k += c
        if new:
            meta["new"] = new
        pre = getattr(sched, "preempted_req_ids", None)
        if pre:
            meta["preempted"] = sorted(r for r in pre if self._want.get(r))
        s = self.session
        s.step, s.forward = s.tokens, self.forward
        s.write_tensor(ROWS, rows, s.step, s.forward, meta)
        self._rows = sel

    def _wants(self, r: str) -> bool:
        w = self._want.get(r)
        if w is None:
            st = self.runner.requests.get(r)
            sp = getattr(st, "sampling_params", None) if st is not None else None
            try:
                w = wants(getattr(sp, "extra_args", None), self.settings.requests)
            except ValueError as e:
                log.warning("llm_instrumentation.vllm: request %s not captured: %s", r, e)
                w = False
            self._want[r] = w
        return w

    def _on_output(self, name: str, kind: str, module: Any, args: Any, out: Any) -> None:
        rows = self._rows
        if rows is None or self.failed:
            return
        try:
            if kind == _names.SUM and out[1] is not None and self._record_sum(self.session, name, out[0], out[1],
                                                                             rows):
                return  # summed straight into the ring slot
            t = _names.convert(out, kind, rows)
            if t.is_cuda and kind != _names.SUM:
                # vLLM's fused norms overwrite their inputs in place later in the pass; the
                # ring copy of a CUDA tensor runs on a side stream (unchecked on a GPU yet).
                t = t.clone()
            self.session.record(name, t, None)
        except Exception as e:
            self._fail(e)

    def _on_forward_end(self, module: Any, args: Any, out: Any) -> None:
        if self._rows is None or self.failed:
            return
        try:
            self.session.flush()
        except Exception as e:
            self._fail(e)
        self.forward += 1

    def sampled(self, output: Any) -> None:
        """After sampling: a ``vllm.sampled`` record and one TOKEN per generated token of
        each captured request of the step (``ModelRunnerOutput``; anything else, e.g. an
        async output not resolved yet, is left alone)."""
        if self.failed or self.session is None or not self.stores:
            return
        req_ids = getattr(output, "req_ids", None)
        toks = getattr(output, "sampled_token_ids", None)
        if not req_ids or toks is None or not self._last_pos:
            return
        try:
            import torch

            rows: List[Tuple[int, int]] = []
            who: List[str] = []
            for i, r in enumerate(req_ids):
                last = self._last_pos.get(r)
                if last is None or i >= len(toks):
                    continue
                got = toks[i]
                got = got.tolist() if hasattr(got, "tolist") else list(got)
                for j, t in enumerate(got):
                    rows.append((last + 1 + j, int(t)))
                    who.append(r)
            self._last_pos = {}
            if not rows:
                return
            s = self.session
            s.write_tensor(SAMPLED, torch.tensor(rows, dtype=torch.int64), s.tokens, self.forward - 1,
                           {"requests": who})
            # the step's TOKENs as ring records under one lock; any left (no
            # ring tokens, or no room) as TOKEN messages
            for (p, t) in rows[self._record_tokens(s, rows):]:
                s.token(s.tokens, t, "", p)
        except Exception as e:
            self._fail(e)

    # ----- end ---------------------------------------------------------------------------------

    def _fail(self, e: BaseException) -> None:
        if self.failed:
            return
        self.failed = True
        log.error("llm_instrumentation.vllm: capture of this worker stopped (vLLM goes on): %s: %s",
                  type(e).__name__, e, exc_info=e)
        for h in self._handles:
            h.remove()
        self._handles = []
        s, self.session = self.session, None
        if s is not None:
            try:
                s.shutdown()  # without CLOSE: strapd ends the stream as aborted
            except Exception:  # pragma: no cover - already failing
                pass

    def close(self) -> Optional[Dict[str, Any]]:
        """End the capture: remove the hooks, CLOSE the session (strapd finishes the stream).
        Idempotent; called when the model runner shuts down and at exit.

        Returns:
            the CLOSED summary, or None when nothing was open.
        """
        with self._lock:
            if self._closed:
                return None
            self._closed = True
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.session is not None and self._seen:
            # Requests that finished in the engine's last steps: an in-process engine is not
            # scheduled again to tell this worker, but its scheduler noted them here.
            done = {r: FINISHES_NOTED.pop(r) for r in list(self._seen) if r in FINISHES_NOTED}
            if done:
                self._finished(done)
        s, self.session = self.session, None
        if s is None:
            self._end_of_set(RuntimeError("its capture stopped") if self.failed else None)
            return None
        summary: Optional[Dict[str, Any]] = None
        err: Optional[BaseException] = None
        try:
            summary = s.close().to_body()
            log.info("llm_instrumentation.vllm: %s closed: %s", self.path, summary)
        except Exception as e:
            log.error("llm_instrumentation.vllm: closing %s failed: %s", self.path, e)
            err = e
        finally:
            s.shutdown()
        self._end_of_set(err)
        return summary

    def _end_of_set(self, failed: Optional[BaseException]) -> None:
        """Once this worker's stream has ended: the capture set's manifest (docs/DISTRIBUTED.md
        D4), for an engine of several workers. Each worker hands rank 0 the facts of its
        finished stream through the process group's key-value store (no collective); rank 0
        writes ``{stem}.capture-set.json`` beside the streams. A worker whose capture
        stopped tells rank 0, which then writes none. Never raises: the engine is shutting
        down, and the streams are whole either way (``capture_set build`` makes the manifest
        from them later)."""
        r = self.rank
        if not r or r.get("world_size", 1) <= 1 or self.path is None:
            return
        try:
            from .. import _distributed, capture_set

            if not capture_set.enabled():
                return
            if r["world_size"] != r["tp_size"] * r["pp_size"] * r["dp_size"]:
                if r["rank"] == 0:
                    log.warning("llm_instrumentation.vllm: no capture-set manifest: %d workers are not tp %d × pp %d "
                                "× dp %d (another kind of parallelism)", r["world_size"], r["tp_size"],
                                r["pp_size"], r["dp_size"])
                return
            import socket

            info = _distributed.RankInfo(r["rank"], r["world_size"], r["local_rank"], None, socket.gethostname(),
                                         "torch.distributed")
            if failed is not None:
                capture_set.failed_start(info, failed)
                return
            self.capture_set_path = capture_set.end_of_capture(self.path, info, wait=_set_wait())
            if self.capture_set_path is not None:
                log.info("llm_instrumentation.vllm: capture set %s written", self.capture_set_path)
        except Exception as e:
            log.error("llm_instrumentation.vllm: no capture-set manifest: %s: %s (build it later: python -m "
                      "llm_instrumentation.capture_set build)", type(e).__name__, e)

    def checkpoint(self) -> Optional[Dict[str, Any]]:
        """Make every record and token sent so far durable in the stream (strapd writes
        and fdatasyncs them), so a reader sees them while the engine runs.

        Returns:
            ``{"path", "offset", "packets", "tokens"}``, or None when this worker stores nothing.
        """
        s = self.session
        if s is None or self.failed or not self.stores:
            return None
        c = s.checkpoint()
        return {"path": self.path, "offset": c.offset, "packets": c.packets, "tokens": c.tokens}


def _check_eager(vc: Any) -> None:
    """Forward hooks do not fire inside a compiled graph or a captured CUDA graph."""
    mc, cc = vc.model_config, vc.compilation_config
    mode = getattr(cc, "mode", None)
    cg = getattr(cc, "cudagraph_mode", None)
    compiled = mode is not None and getattr(mode, "name", str(mode)) != "NONE"
    graphs = cg is not None and getattr(cg, "name", str(cg)) != "NONE"
    if (compiled or graphs) and not getattr(mc, "enforce_eager", False):
        raise RuntimeError(
            f"STRAP_VLLM_OUTPUT is set, but this engine runs the model compiled (mode {mode}, CUDA graphs "
            f"{cg}): forward hooks would not fire inside it. Start vLLM with enforce_eager=True "
            f"(--enforce-eager), or unset STRAP_VLLM_OUTPUT (docs/VLLM.md 5)")


def engine_stem(vc: Any, rank: Dict[str, Any]) -> str:
    """The name every worker of one engine shares: ``vllm-<UTC time>-<instance id>``, from
    vLLM's ``VllmConfig.instance_id`` (made once in the engine and handed to each worker),
    plus ``-dp<R>`` for a data-parallel engine whose workers form a world of their own."""
    iid = str(getattr(vc, "instance_id", "") or "")
    if iid.isdigit():  # vLLM 0.32: time.time_ns() of the config
        t = datetime.datetime.fromtimestamp(int(iid) / 1e9, datetime.timezone.utc)
    else:
        t = datetime.datetime.now(datetime.timezone.utc)
        iid = iid or str(os.getpid())
    stem = f"vllm-{t.strftime('%Y%m%dT%H%M%S')}-{''.join(c for c in iid if c.isalnum() or c in '-_')}"
    if rank.get("dp_engine") is not None:
        stem += f"-dp{rank['dp_engine']}"
    return stem


def stream_name(vc: Any, rank: Dict[str, Any]) -> str:
    """A worker's stream file name: ``vllm-<UTC time>-<pid>-rank0.strap`` for an engine of one
    worker; ``<engine stem>.rank<R>-of-<W>.strap`` (the per-rank names of docs/DISTRIBUTED.md,
    so that the capture set's manifest is ``<engine stem>.capture-set.json``) for several."""
    if rank["world_size"] <= 1:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        return f"vllm-{stamp}-{os.getpid()}-rank{rank['rank']}.strap"
    return f"{engine_stem(vc, rank)}.rank{rank['rank']:05d}-of-{rank['world_size']:05d}.strap"


def segment_name(name: str, segment: int) -> str:
    """The stream name of segment ``segment`` of a rotating worker (``STRAP_VLLM_ROTATE``):
    ``vllm-<time>-<pid>-rank0.seg00003.strap`` for ``vllm-<time>-<pid>-rank0.strap``."""
    stem, ext = os.path.splitext(name)
    return f"{stem}.seg{segment:05d}{ext}"


def _set_wait() -> float:
    """How long rank 0 waits for the other workers' facts: within the grace vLLM gives a
    worker to exit before it sends SIGTERM (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, 5 s)."""
    try:
        from vllm import envs

        grace = float(envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)
    except Exception:
        grace = 5.0
    return max(1.0, grace - 1.0)


def _ranks(vc: Any = None) -> Dict[str, Any]:
    """This worker's place: global rank and world size (of torch.distributed, which vLLM
    initialises in every worker), local rank, tensor-, pipeline- and data-parallel rank and
    size. vLLM orders ranks tp fastest, then pp, then dp."""
    from vllm.distributed import parallel_state as ps

    def get(fn: str, default: int) -> int:
        try:
            return int(getattr(ps, fn)())
        except Exception:
            return default

    rank, world = 0, 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    pp_rank = pp_size = None
    try:
        g = ps.get_pp_group()
        pp_rank, pp_size = g.rank_in_group, g.world_size
    except Exception:
        pass
    local_rank: Optional[int] = None
    try:
        local_rank = int(ps.get_world_group().local_rank)
    except Exception:
        pass
    tp_rank = get("get_tensor_model_parallel_rank", 0)
    tp_size = get("get_tensor_model_parallel_world_size", 1)
    pp_rank, pp_size = pp_rank or 0, pp_size or 1
    # Data parallelism: vLLM's world spans the data-parallel engines when their workers
    # share one (then the rank says the replica); else each engine's workers are a world of
    # their own, and its replica number goes into the stem instead (dp_engine).
    pc = getattr(vc, "parallel_config", None)
    dp_cfg = int(getattr(pc, "data_parallel_size", 1) or 1)
    dp_cfg_rank = int(getattr(pc, "data_parallel_rank", 0) or 0)
    group = tp_size * pp_size
    dp_engine: Optional[int] = None
    if dp_cfg > 1 and world == group * dp_cfg:
        dp_rank, dp_size = rank // group, dp_cfg
    else:
        dp_rank, dp_size = 0, max(1, world // group)
        if dp_cfg > 1:
            dp_engine = dp_cfg_rank
    return {"rank": rank, "world_size": world, "local_rank": local_rank, "tp_rank": tp_rank, "tp_size": tp_size,
            "pp_rank": pp_rank, "pp_size": pp_size, "dp_rank": dp_rank, "dp_size": dp_size, "dp_engine": dp_engine}


def _query_start_loc(num_reqs: int) -> Optional[List[int]]:
    """``query_start_loc[:num_reqs + 1]`` of the current forward context's attention
    metadata (any layer's: they share it), or None where there is none to check against."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return None
        md = get_forward_context().attn_metadata
    except Exception:
        return None
    if isinstance(md, list):  # micro-batches: not split here
        return None
    if isinstance(md, dict):
        md = next(iter(md.values()), None)
    q = getattr(md, "query_start_loc", None)
    if q is None:
        return None
    return [int(v) for v in q[:num_reqs + 1].tolist()]


def _ring_size(vc: Any, n_modules: int) -> int:
    """A ring for two steps of the largest batch the scheduler makes (every captured module's
    rows plus the index), between the client's floor and strapd's default limit."""
    from ..config import AUTO_RING_MIN_BYTES, MAX_RING_BYTES

    tokens = int(getattr(vc.scheduler_config, "max_num_batched_tokens", 2048) or 2048)
    hidden = int(vc.model_config.get_hidden_size())
    item = int(getattr(vc.model_config.dtype, "itemsize", 4))
    per_step = tokens * (hidden * item * n_modules + 16) + 64 * (n_modules + 2)
    want = 2 * per_step + (1 << 20)
    return max(AUTO_RING_MIN_BYTES, min(MAX_RING_BYTES, (want + 4095) // 4096 * 4096))
