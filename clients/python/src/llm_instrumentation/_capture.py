"""A running capture: the life cycle of one strapd session for a model's hooks — start,
forward-pass and token callbacks, checkpoints, stop. :class:`~.framework.InstrumentationFramework`
is its public face."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _capture_files, _distributed, _open, _ringsize, _streamlock
from . import checkpoint as ckpt
from ._hooks import ROOT_NAME, Hooks, choose_modules
from ._options import SessionOptions
from ._session import CaptureSession, open_session
from .config import AUTO_RING_MIN_BYTES, InstrumentationConfig
from .tracking import TokenTracker

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.nn as nn

log = logging.getLogger("llm_instrumentation")

#: upload states (``strapd status``) in which the object is not being written as it should.
UPLOAD_FAILING = ("retrying", "stalled", "refused", "lost")


class UploadWarning(UserWarning):
    """A capture closed while strapd's upload of it fails (the reason in the message)."""


class Capture:
    """The state and life cycle of captures of one model (see the framework for attributes)."""

    def _init(self, model: Optional["nn.Module"], config: InstrumentationConfig, options: SessionOptions) -> None:
        # Not __init__: the public constructor keeps its documented keyword parameters and
        # turns them into options; it and ``from_options`` both end here.
        self.model: Optional["nn.Module"] = None
        self.config = config
        self.plan = config.transport_plan()
        self.hooked_modules: List[str] = []
        self._hooks: Optional[Hooks] = None
        self.forward_count = 0
        self.summary: Optional[Dict[str, Any]] = None
        self.trace_path: Optional[str] = None
        self.resource_monitor: Optional[Any] = None
        self.resources_path: Optional[str] = None
        self.resource_summary: Optional[Dict[str, Any]] = None
        self._session: Optional[CaptureSession] = None
        self._last_session: Optional[CaptureSession] = None
        self._stream_key: Optional[Tuple[int, int]] = None  # the stream file while this capture writes it (_streamlock)
        self._forward = 0
        self._step = 0
        self._fingerprint: Optional[str] = None
        self._use(options)
        if model is not None:
            self._attach(model)

    def _attach(self, model: "nn.Module") -> None:
        """Make ``model`` the captured one and choose its modules (hooks go on at start)."""
        if model is self.model:
            return
        if self.model is not None:
            # One stream names modules without saying which model they belong to, so two
            # models' "model.layers.0" would be one module to every reader.
            raise ValueError(f"this framework already instruments a {type(self.model).__name__}; module names "
                             f"of two models would collide in one stream: use one framework per model")
        if not callable(getattr(model, "named_modules", None)):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.hooked_modules = choose_modules(model, self.config, self.options.modules)
        self._hooks = Hooks(model, self.hooked_modules, self.config)
        self.model = model
        self._fingerprint = None
        self._size_ring(model)

    def _size_ring(self, model: Optional["nn.Module"]) -> None:
        """Give a config without ``max_memory_gb`` its default ring: sized from the hooked
        modules' bytes per forward (:mod:`._ringsize`); none for a capture without a model
        (it writes no tensors). The block size, in the fingerprint, stays the config's."""
        if self.config.max_memory_gb is not None:
            return
        if model is None:
            ring, how = AUTO_RING_MIN_BYTES, "no model: no tensors"
        else:
            ring, how = _ringsize.auto_ring_size(model, self.hooked_modules)
        log.info("llm_instrumentation: default ring %d bytes (%s)", ring, how)
        self.plan = dataclasses.replace(self.config.transport_plan(), ring_size=ring, memory_hint=ring)

    def _attach_nothing(self) -> None:
        """Capture without a model (1.3.1 allowed ``capture_activations`` before
        ``instrument_model``): a stand-in module with no hooks, so the stream gets the
        tokens and checkpoints and no tensors. :meth:`_detach_nothing` undoes it."""
        self.model = _no_model()
        self.hooked_modules = []
        self._hooks = Hooks(self.model, [], self.config)
        self._fingerprint = None
        self._size_ring(None)

    def _detach_nothing(self) -> None:
        self.model, self._hooks, self.hooked_modules, self._fingerprint = None, None, [], None

    def _use(self, options: SessionOptions) -> None:
        """Make ``options`` the current capture's and reset its per-capture state."""
        self.options = options
        self.token_tracker: Optional[TokenTracker] = TokenTracker() if options.track_per_token else None
        self.last_checkpoint: Optional[ckpt.Checkpoint] = None
        self.resume_step = 0
        self.resumed_from: Optional[str] = None
        self.checkpoint_times: List[float] = []
        self.capture_set_path: Optional[str] = None
        self._started_at = 0.0
        self._clean = False
        # 1.3.1's checkpoint keys: resumes so far, and each token's JSON, encoded once.
        self._resume_count = 0
        self._tokens_json: List[str] = []
        self._tokens_131_left_out = False
        # 1.3.1's `tokens` list in the checkpoints: only for a capture started through 1.3.1's
        # API form (InstrumentationFramework.capture_activations sets it), the one reader of
        # that list (docs/CHECKPOINTS.md 3). The token log: kept by a capture that uploads.
        self.checkpoint_tokens_131 = False
        self._token_log: Optional[ckpt.TokenLogWriter] = None

    def fingerprint(self) -> str:
        """The capture's fingerprint (config, transport, hooked modules, model structure):
        checkpoints and the stream header carry it; a resume must match it.

        Returns:
            ``"sha256:..."``.
        """
        if self.model is None:
            raise RuntimeError("no model: call instrument_model(model) first")
        if self._fingerprint is None:
            self._fingerprint = _open.fingerprint(self.model, self.config, self.plan, self.hooked_modules)
        return self._fingerprint

    # ----- life cycle --------------------------------------------------------------------------

    def start(self) -> "Capture":
        """Connect to strapd (starting it if needed), open the session, install the hooks.
        With ``resume_from_checkpoint`` the stream is checked and cut back first.

        Returns:
            self.
        """
        opts, plan = self.options, self.plan
        if self._session is not None:
            raise RuntimeError("capture already started")
        model, hooks = self.model, self._hooks
        if model is None or hooks is None:
            raise RuntimeError("no model to capture: call instrument_model(model) first")
        if opts.output_path is None:
            raise ValueError("no output_path: pass one to capture_activations")
        if plan.note:
            log.warning("llm_instrumentation: %s", plan.note)
        Path(opts.output_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            out = _capture_files.open_output(opts, self.fingerprint())
        except BaseException as e:
            self._failed_start(e)
            raise
        try:
            return self._start_on(out, model, hooks)
        except BaseException as e:
            _streamlock.mark_ended(out.key)
            self._failed_start(e)
            raise

    def _failed_start(self, why: BaseException) -> None:
        """A rank of several whose capture did not start still takes its part in the end of
        the capture (docs/DISTRIBUTED.md D4), so that rank 0 does not wait for it."""
        from . import capture_set

        info = self.options.rank
        if info is not None and self.options.output_path is not None and capture_set.enabled():
            capture_set.failed_start(info, why)

    def _start_on(self, out: _capture_files.Output, model: "nn.Module", hooks: Hooks) -> "Capture":
        """:meth:`start` once the stream is open and locked."""
        opts, plan = self.options, self.plan
        assert opts.output_path is not None  # checked by start
        self.resumed_from = out.source
        tr = self.token_tracker
        if out.resume is not None:
            assert tr is not None
            tr.tokens, tr.resume_step = out.tokens, out.resume.token_count
            self.resume_step, self.forward_count = out.resume.token_count, out.resume.forward_count
            self.last_checkpoint = out.floor
            log.info("llm_instrumentation: resuming %s from token %d at byte %d (%s)", opts.output_path,
                     out.resume.token_count, out.resume.stream_offset,
                     "its checkpoint" if out.source == "checkpoint" else "the stream's intact prefix")
        elif out.tokens:
            # A 1.3.1 checkpoint's tokens, into a new stream: written first, as TOKEN packets.
            assert tr is not None
            tr.tokens, tr.resume_step = out.tokens, len(out.tokens)
            self.resume_step = len(out.tokens)
            log.info("llm_instrumentation: %s goes on from the %d tokens of a 1.3.1 checkpoint, in a new stream",
                     opts.output_path, len(out.tokens))
        if out.source is not None and tr is not None:
            meta = out.meta_131 or {}
            self._resume_count = _int(meta.get("resume_count")) + 1
            if isinstance(meta.get("start_time"), (int, float)) and not isinstance(meta.get("start_time"), bool):
                tr.start_time = float(meta["start_time"])  # 1.3.1 kept the first run's
        try:
            self.trace_path = _capture_files.resolve_trace(opts, self.config.trace)
            level = _resource_level(opts.resource_level, self.config.resource_level)
            self.resources_path = opts.output_path + ".resources.jsonl" if level is not None else None
            trace_fd = res_fd = None
            try:
                trace_fd = _capture_files.open_trace(self.trace_path, out.resume is not None) if self.trace_path else None
                if self.resources_path is not None:
                    # A resume appends to the events of the capture it continues.
                    flags = os.O_WRONLY | (os.O_APPEND if out.resume is not None else os.O_TRUNC)
                    res_fd = os.open(self.resources_path, flags | os.O_CREAT | os.O_CLOEXEC, 0o640)
                session = open_session(
                    opts.socket_path, opts.autostart_daemon, opts.stall_timeout, plan.ring_size, plan.policy,
                    out.fd, trace_fd,
                    _open.open_request(model, self.config, plan, self.hooked_modules, opts.output_path,
                                       self.fingerprint(), out.resume, upload=self.upload_target,
                                       distributed=self._distributed(model, hooks),
                                       upload_free_local=opts.upload_free_local),
                    resume_seq=out.resume.last_seq if out.resume is not None else 0, resources_fd=res_fd,
                    ring_explicit=self.config.max_memory_gb is not None)
            finally:
                for fd in (trace_fd, res_fd):
                    if fd is not None:
                        os.close(fd)
        finally:
            # strapd keeps its own descriptors, and with the stream's its flock, until the
            # session ends: another capture of the file is refused while this one is live
            # and waits for the lock only once this process has let go (_streamlock).
            os.close(out.fd)
        self._session = session
        self._stream_key = out.key
        self._started_at = time.monotonic()
        if self.token_tracker is not None:
            if out.resume is None:
                for tok in self.token_tracker.tokens:  # a 1.3.1 checkpoint's: the stream holds every token
                    session.token(tok["token_index"], tok["token_id"], tok["token_text"], tok["position"])
            self.token_tracker._sink = self._on_token
        hooks.install(self._on_forward_start, self._on_forward_end, session.record, session.record_meta)
        if level is not None:
            try:
                self._start_resources(session, level, model)
            except BaseException:
                self.abort()
                raise
        return self

    def _distributed(self, model: "nn.Module", hooks: Hooks) -> Optional[Dict[str, Any]]:
        """The ``distributed`` object of a rank of several (docs/DISTRIBUTED.md D1, D2), None
        for a single process; sets the hooks up for this rank's tensor-parallel place."""
        opts = self.options
        info, layout = opts.rank, opts.layout
        if info is None or layout is None:
            hooks.set_distributed(None, {}, False)
            return None
        d = info.metadata()
        d.update(layout.metadata())
        d["job_id"] = _distributed.job_id()
        if layout.tp_size > 1:
            kinds = _distributed.classify(model, self.hooked_modules, layout, opts.sharding)
            hooks.set_distributed(layout, kinds, opts.replicated == "every_rank")
            d["replicated"] = opts.replicated
            d["modules"] = {(n or ROOT_NAME): k.metadata() for n, k in kinds.items()}
        else:
            hooks.set_distributed(None, {}, False)
        return d

    def _start_resources(self, session: CaptureSession, level: str, model: "nn.Module") -> None:
        """The resource monitor, sending its events to strapd over this session. Started
        after the capture's hooks, so its forward hooks see the capture's step and forward
        counter already set and its events carry the stream packets' numbers."""
        from .resources import ResourceMonitor, SessionSink

        sink = SessionSink(session.send_resources, self.resources_path)
        self.resource_summary = None
        self.resource_monitor = ResourceMonitor(
            model, level, sink=sink, step_fn=lambda: self._step, forward_fn=lambda: self._forward,
            capture_bytes_fn=lambda: session.bytes_in, enabled=True).start()

    def _close_resources(self) -> Optional[BaseException]:
        """Close the monitor (its last events go before CLOSE); its error, if any."""
        mon, self.resource_monitor = self.resource_monitor, None
        if mon is None:
            return None
        try:
            self.resource_summary = mon.close()
        except Exception as e:
            log.error("llm_instrumentation: the resource events could not all be sent: %s", e)
            return e
        return None

    def _on_forward_start(self) -> None:
        self._forward = self.forward_count
        self.forward_count += 1
        self._step = self.token_tracker.step if self.token_tracker is not None else 0
        session = self._session
        if session is not None:
            session.step, session.forward = self._step, self._forward

    def _on_forward_end(self) -> None:
        if self._session is not None:
            self._session.flush()

    def _on_token(self, tok: Dict[str, Any]) -> None:
        session = self._session
        if session is None:
            return
        session.token(tok["token_index"], tok["token_id"], tok["token_text"], tok["position"])
        interval = self.options.checkpoint_interval_tokens
        if interval is not None and (tok["token_index"] + 1) % interval == 0:
            self.checkpoint()  # looked up on the instance: tests wrap it to simulate crashes

    def _remove_hooks(self) -> None:
        if self._hooks is not None:
            self._hooks.remove()
        if self.token_tracker is not None:
            self.token_tracker._sink = None

    def checkpoint(self) -> ckpt.Checkpoint:
        """Make a checkpoint now: strapd writes and fdatasyncs every packet sent so far and
        reports the stream's offset and last packet; then the checkpoint file is replaced
        atomically. Called every ``checkpoint_interval_tokens`` tokens; callable directly.

        Returns:
            the checkpoint written.
        """
        session, ck_path, tr = self._session, self.options.checkpoint_file, self.token_tracker
        if session is None or ck_path is None or tr is None:
            raise RuntimeError("checkpoint() needs a live capture with track_per_token=True and a checkpoint path")
        t0 = time.perf_counter()
        c = _capture_files.checkpoint_from(session.checkpoint(), self.options.output_path or "", self.fingerprint(),
                                    tr.step, self.forward_count)
        uploading = self.upload_target is not None or (session.opened is not None and bool(session.opened.upload))
        if uploading:
            # A prefix freed after its upload holds TOKEN packets a resume cannot read back:
            # their one other copy is the token log, durable before this checkpoint is.
            if self._token_log is None:
                self._token_log = ckpt.TokenLogWriter(ckpt.token_log_path(ck_path))
            c.token_log = self._token_log.sync(self._encoded(tr))
        ckpt.write_atomic(ck_path, c.to_json(self._keys_131(c, tr)))
        self.checkpoint_times.append(time.perf_counter() - t0)
        self.last_checkpoint = c
        return c

    def _encoded(self, tr: TokenTracker) -> List[str]:
        """Every recorded token's JSON (:func:`~.checkpoint.encode_token`), each encoded once."""
        enc = self._tokens_json
        if len(enc) > len(tr.tokens):
            del enc[:]
        enc.extend(ckpt.encode_token(t) for t in tr.tokens[len(enc):])
        return enc

    def _keys_131(self, c: ckpt.Checkpoint, tr: TokenTracker) -> Optional[List[str]]:
        """Add 1.3.1's checkpoint keys to ``c`` (``total_tokens``, ``last_checkpoint_time``,
        ``metadata``: ``start_time``, ``resume_count``, ``updated_at``) and return its
        ``tokens`` list as encoded JSON: None unless the capture was started through 1.3.1's
        API form (:attr:`checkpoint_tokens_131`), or when that list would make the file
        larger than a checkpoint may be (then left out, with one warning)."""
        now = time.time()
        c.extra.update({"total_tokens": len(tr.tokens), "last_checkpoint_time": now,
                        "metadata": {"start_time": tr.start_time, "resume_count": self._resume_count,
                                     "updated_at": now}})
        if not self.checkpoint_tokens_131:
            return None
        enc = self._encoded(tr)
        if sum(len(e) + 1 for e in enc) + (64 << 10) > ckpt.MAX_SIZE:
            if not self._tokens_131_left_out:
                self._tokens_131_left_out = True
                log.warning("llm_instrumentation: %d tokens no longer fit a checkpoint file (%d MiB): 1.3.1's "
                            "'tokens' list is left out of the checkpoints from now on (the stream holds every "
                            "token; a resume does not need the list)", len(enc), ckpt.MAX_SIZE >> 20)
            return None
        return enc

    def stop(self) -> Dict[str, Any]:
        """Remove the hooks, close the session (the daemon finishes the file). With tracking,
        the tokens file (:func:`~._capture_files.tokens_path`) is written; after a clean close the checkpoint is
        deleted (it is kept when the session had failed).

        Returns:
            the CLOSED summary (``packets``, ``drops``, ``bytes_in``, ``bytes_out``, ``file_bytes``).
        """
        self._remove_hooks()
        res_err = self._close_resources()
        session = self._session
        if session is None:
            return self.summary or {}
        clean = False
        wrote_tokens = False

        def write_tokens() -> None:
            nonlocal wrote_tokens
            wrote_tokens = True
            tr, out = self.token_tracker, self.options.output_path
            if tr is not None and out is not None:
                took = time.monotonic() - self._started_at if self._started_at else 0.0
                _capture_files.write_tokens_file(out, tr.tokens, took, self.resume_step, self.forward_count,
                                          self.fingerprint())

        try:
            uploading = self.upload_target is not None or (session.opened is not None and session.opened.upload)
            if session.error is None and uploading:
                # strapd uploads the tokens file beside the stream: written first, and
                # passed read-only with CLOSE (PROTOCOL.md 1.3).
                self.summary = self._close_uploading(session, write_tokens)
                clean = True
            elif session.error is None:
                # The tokens file is written while strapd finishes and syncs the stream.
                self.summary = session.close(meanwhile=write_tokens).to_body()
                clean = True
            else:
                self.summary = {}
        finally:
            session.shutdown()
            self._last_session, self._session = session, None
            _streamlock.mark_ended(self._stream_key)
            if not wrote_tokens:
                write_tokens()
            self._end_capture_set()
        if clean and self.summary and self.summary.get("upload"):
            self._check_upload(session)
        ck_path = self.options.checkpoint_file
        if self._token_log is not None:
            self._token_log.close()
        if clean and self._clean and ck_path is not None and os.path.exists(ck_path):
            ckpt.fsync_unlink(ck_path)
        if clean and self._clean and ck_path is not None and os.path.exists(ckpt.token_log_path(ck_path)):
            ckpt.fsync_unlink(ckpt.token_log_path(ck_path))
        if clean and res_err is not None:
            # The capture is complete; its resource log is not, and that must not pass unseen.
            raise RuntimeError(f"capture closed, but its resource events were not all sent: {res_err}") from res_err
        return self.summary

    def _end_capture_set(self) -> None:
        """Every rank as its capture ends: rank 0 writes the job's manifest
        (docs/DISTRIBUTED.md D4). Never raises: the capture itself is complete."""
        from . import capture_set

        info, out = self.options.rank, self.options.output_path
        self.capture_set_path = None
        if info is None or out is None:
            return
        try:
            if not capture_set.enabled():
                return
            self.capture_set_path = capture_set.end_of_capture(out, info)
        except Exception as e:
            log.error("llm_instrumentation: the capture-set manifest was not written: %s", e)

    @property
    def upload_target(self) -> Optional[str]:
        """The s3:// target strapd uploads this capture into (the option's, else the
        config's), or None (then the daemon's ``serve --upload``, if any, applies)."""
        return self.options.upload or self.config.upload

    def _check_upload(self, session: CaptureSession) -> None:
        """Ask strapd how the closed capture's upload goes (a STATUS after CLOSED): one that
        is failing (credentials or bucket refused, the key holding another capture's object,
        a server that does not answer) is a warning with strapd's reason, and the summary's
        ``upload_state`` and ``upload_error``. The capture itself is complete either way."""
        from . import _daemon
        from ._warnings import warn_caller

        summary = self.summary
        if summary is None:
            return
        obj = summary["upload"]
        sid = session.opened.session if session.opened is not None else None
        try:
            rep = _daemon.status(self.options.socket_path)
        except Exception as e:  # the capture is complete; its upload's health is extra
            log.debug("llm_instrumentation: no upload status after CLOSED: %s", e)
            return
        ups = [u for u in rep.get("uploads") or [] if u.get("object") == obj and u.get("session") in (sid, None, 0)]
        mine = [u for u in ups if u.get("session") == sid] or ups
        if not mine:
            return
        u = mine[-1]
        state, err = u.get("state"), u.get("last_error") or ""
        summary["upload_state"] = state
        if err:
            summary["upload_error"] = err
        if state in UPLOAD_FAILING:
            msg = (f"the capture is complete on the local disk (kept), but its upload to {obj} is {state}: {err or 'no reason given'}"
                   + ("" if state in ("refused", "lost") else " (strapd retries it; `strapd status` follows it)"))
            log.warning("llm_instrumentation: %s", msg)
            warn_caller(msg, UploadWarning)

    def _close_uploading(self, session: CaptureSession, write_tokens: Callable[[], None]) -> Dict[str, Any]:
        """CLOSE with the tokens file's descriptor, so strapd uploads it beside the stream."""
        write_tokens()
        fds: List[int] = []
        out = self.options.output_path
        if self.token_tracker is not None and out is not None and os.path.exists(_capture_files.tokens_path(out)):
            fds.append(os.open(_capture_files.tokens_path(out), os.O_RDONLY | os.O_CLOEXEC))
        try:
            return session.close(fds=fds).to_body()
        finally:
            for fd in fds:
                os.close(fd)

    def abort(self) -> None:
        """Remove the hooks and drop the connection without CLOSE (the daemon ends the stream
        as ``aborted``). The checkpoint is kept."""
        self._remove_hooks()
        self._close_resources()
        if self._token_log is not None:
            self._token_log.close()
        if self._session is not None:
            self._session.shutdown()
            self._session = None
            _streamlock.mark_ended(self._stream_key)

    @contextlib.contextmanager
    def _running(self) -> Iterator["Capture"]:
        self.start()
        try:
            yield self
        except BaseException:
            # Keep what was captured: close cleanly when the connection is intact; the
            # checkpoint stays, so the capture can be resumed.
            try:
                self.stop()
            except Exception as e:  # the user's exception matters more; log ours
                log.error("llm_instrumentation: closing the capture after an error failed: %s", e)
                self.abort()
            raise
        self._clean = True
        self.stop()



def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


_NO_MODEL: Any = None


def _no_model() -> "nn.Module":
    """A module standing in for the model of a capture without one: no children, never run."""
    global _NO_MODEL
    if _NO_MODEL is None:
        import torch.nn as nn

        class NoModel(nn.Module):
            """Stands in for the model of a capture that has none (tokens and checkpoints only)."""

        _NO_MODEL = NoModel
    return _NO_MODEL()


def _resource_level(option: Any, config_level: Optional[str]) -> Optional[str]:
    """The resource level of a capture, or None for none: the option (False: none), then
    the config, then ``STRAP_RESOURCE_LOG_LEVEL``; ``STRAP_RESOURCE_LOG_DISABLED`` turns it
    off whatever was asked."""
    from .resources import resource_settings_from_env

    env = resource_settings_from_env()
    if option is False:
        return None
    level = option if option is not None else config_level
    if level is None and env.level is not None:
        level = env.level.name
    if level is not None and env.disabled:
        log.info("llm_instrumentation: resource events off (STRAP_RESOURCE_LOG_DISABLED)")
        return None
    return level
