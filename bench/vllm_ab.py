"""vLLM with and without capture, side by side (issue 42's benchmark; docs/VLLM.md 9).

A random Llama 1024x8 (float32, saved with save_pretrained from a config), batches of 16 and
32 requests with prompts of 32-128 tokens and 32 tokens generated each, greedy, prefix
caching off (so every batch computes every position), eager. Modes:

- ``plain``: vLLM with the strap plugin paused (hooks off; the session stays open);
- ``strap``: the plugin capturing every decoder layer's output (the residual stream) of every
  request to disk through strapd, then ``checkpoint`` (strapd wrote and fdatasynced it);
- ``unfused``: ``strap`` with the plugin's fused writes off (``CaptureSession.record_sum`` and
  ``tokens_to_ring``: the layer sum computed by torch and then copied into the ring, one
  ``session.token`` per token), i.e. the plugin before issue 42's cut, in the same engine: a
  before/after under the same load;
- ``strap-batch``, ``strap-idle``: ``strap`` with every thread of strapd put under
  ``SCHED_BATCH`` (no wake-up preemption) or ``SCHED_IDLE`` by this script for the batch, and
  back to ``SCHED_OTHER`` after it;
- ``hooks``: forward hooks on the same layers appending ``hidden + residual`` (the residual
  stream, as strap stores it) to a Python list, then one ``torch.save`` of the list and an
  fsync (what vllm-lens does, plus the write to disk);
- ``vanilla``: a second engine, in its own process, started without the plugin at all (checks
  that ``plain`` is plain);
- ``extract``: a third engine with vLLM's native ``extract_hidden_states`` (a speculative
  "draft model" plus ``ExampleHiddenStatesConnector``) saving the same layers' hidden states:
  timed until every request's file is written (prompt tokens only: that is what it saves).

Each engine lives in its own long-lived worker process (this script with ``--worker``), is
started once and warmed up once per mode; the parent then asks the workers for one batch at
a time, rotating the order of the modes every round, so every mode's batch runs next to the
others under the same load of this shared machine. A round's ratio ``kept = plain time /
mode time`` compares batches run seconds apart; the figure is the median over rounds with
the spread. Besides wall time each batch records the worker's CPU seconds (all its threads,
getrusage) and strapd's (``/proc/<pid>/stat`` utime + stime), which load does not inflate
the way it inflates wall time, and the bytes each mode wrote; and what else the machine did
meanwhile: the other processes' and the kernel's CPU (``/proc/stat`` less the engine and
strapd), the kernel threads' (``PF_KTHREAD``) alone, the hypervisor's steal, and the engine's
preemptions and minor page faults (getrusage).

``--profile`` runs every ``strap`` batch under cProfile in the engine process and prints where
the plugin's time goes (the parts of docs/VLLM.md 9: the layer outputs' conversion and ring
copy, the step index, the sampled tokens, the end of each pass), cumulative CPU seconds of the
engine's thread per batch; cProfile inflates them, so the batch's own-time figures of such a run are not the benchmark's.

Usage: .venv-vllm/bin/python bench/vllm_ab.py --strapd bin/strapd [--rounds 5]
       [--batches 16,32] [--modes plain,strap,strap-batch,strap-idle,unfused,hooks,vanilla,extract]
       [--preset fast_capture]
       [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

LAYERS = 8
HIDDEN = 1024
MAX_TOKENS = 32
RESULT = "@@vllm_ab "  # the prefix of a worker's result line (vLLM logs to stdout too)
TICK = os.sysconf("SC_CLK_TCK")


def prompt_lengths(n: int, seed: int) -> List[int]:
    rng = random.Random(seed)
    return [rng.randint(32, 128) for _ in range(n)]


def prompts_for(n: int, seed: int, vocab: int) -> List[List[int]]:
    rng = random.Random(seed + 1000)
    return [[rng.randrange(3, vocab) for _ in range(k)] for k in prompt_lengths(n, seed)]


# ----- worker ------------------------------------------------------------------------------


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class GCTime:
    """Python's cyclic garbage collections in this process, timed (gc.callbacks): a batch's
    collections of generation 2 walk every tracked object of the engine's process."""

    def __init__(self) -> None:
        import gc

        self.s = [0.0, 0.0, 0.0]
        self.n = [0, 0, 0]
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.s[g] += time.perf_counter() - self._t
            self.n[g] += 1

    def snapshot(self) -> Tuple[List[float], List[int]]:
        return list(self.s), list(self.n)


def _rusage_counts() -> Dict[str, int]:
    """The engine process's preemptions, waits and page faults so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"preempted": r.ru_nivcsw, "waited": r.ru_nvcsw, "minflt": r.ru_minflt}


#: ``--profile``: the plugin's parts, as (label, file suffix, function names); a function's
#: cumulative time is counted once per part (the first name of a part found on the stack).
PARTS = [
    ("layer outputs (hooks)", "vllm/_worker.py", ("_on_output",)),
    ("  conversion (_names.convert)", "vllm/_names.py", ("convert",)),
    ("  fused sum into the ring (session.record_sum)", "_session.py", ("record_sum",)),
    ("  ring copy (session.record)", "_session.py", ("record",)),
    ("step index (_plan)", "vllm/_worker.py", ("_plan",)),
    ("end of pass (flush)", "vllm/_worker.py", ("_on_forward_end",)),
    ("sampled tokens (sampled)", "vllm/_worker.py", ("sampled",)),
    ("  TOKENs (session.token)", "_session.py", ("token",)),
    ("  TOKENs into the ring (session.tokens_to_ring)", "_session.py", ("tokens_to_ring",)),
    ("step start (begin_step)", "vllm/_worker.py", ("begin_step",)),
]


def profile_parts(prof: Any) -> Dict[str, Any]:
    """Cumulative seconds and calls of each of :data:`PARTS` in a finished cProfile run."""
    import pstats

    st = pstats.Stats(prof)
    out: Dict[str, Any] = {}
    for label, suffix, names in PARTS:
        for (fname, _line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            if func in names and fname.endswith(suffix):
                got = out.setdefault(label, [0.0, 0])
                got[0] += ct
                got[1] += nc
    return out


class Worker:
    """One engine, run batch by batch on the parent's request."""

    def __init__(self, kind: str, model: str, out: Path, profile: bool = False) -> None:
        from vllm import LLM

        self.kind, self.out, self.profile = kind, out, profile
        kw: Dict[str, Any] = {}
        if kind == "extract":
            self.extract_dir = out / "extract"
            self.extract_dir.mkdir(parents=True, exist_ok=True)
            kw.update(
                enable_chunked_prefill=False,
                speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                    "draft_model_config": {"hf_config": {
                                        # hidden states entering layer i+1 = layer i's output;
                                        # LAYERS = the last layer's output, unnormed
                                        "eagle_aux_hidden_state_layer_ids": list(range(1, LAYERS + 1))}}},
                kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"shared_storage_path": str(self.extract_dir)}})
        self.llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
                       max_model_len=256, kv_cache_memory_bytes=1 << 30, seed=0, enable_prefix_caching=False,
                       **kw)
        self.cap: Any = None
        if kind == "plugin":
            from llm_instrumentation.vllm._plugin import captures

            caps = captures()
            if len(caps) != 1 or caps[0].session is None:
                raise SystemExit(f"plugin worker: expected one open capture in this process, got {caps}")
            self.cap = caps[0]
            self.cap.pause()
            # The time the engine's thread spends in the plugin's code (hooks, step wrappers,
            # the sampled tokens): its direct cost, which the machine's load moves little;
            # its CPU time (the thread's) even less: a thread waiting for a core is not counted.
            for name in ("_on_forward_pre", "_on_output", "_on_forward_end", "sampled", "begin_step"):
                setattr(self.cap, name, self._timed(getattr(self.cap, name)))
        self.in_plugin = 0.0
        self.in_plugin_cpu = 0.0
        self.gc = GCTime()
        with open(Path(model) / "config.json") as f:
            self.vocab = json.load(f)["vocab_size"]

    def _timed(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.in_plugin += time.perf_counter() - t
                self.in_plugin_cpu += time.thread_time() - c

        return timed

    def _model(self) -> Any:
        return self.cap.runner.get_model() if self.cap is not None else None

    def run(self, mode: str, n: int, seed: int) -> Dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(n, seed, self.vocab)]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
        res: Dict[str, Any] = {"mode": mode, "n": n}
        handles: List[Any] = []
        buf: List[Any] = []
        cap: Any = self.cap
        if mode in ("strap", "unfused"):
            before = cap.checkpoint()
            pk0, tok0 = cap.session.packets, cap.session.tokens
            cap.resume()
            if mode == "unfused":
                fused = cap._record_sum, cap._record_tokens
                cap._record_sum, cap._record_tokens = (lambda *a: False), (lambda *a: 0)
        elif mode == "hooks":
            model = self._model()

            def keep(_m: Any, _a: Any, out: Any) -> None:
                t, c = time.perf_counter(), time.thread_time()
                h, r = out
                buf.append(h + r if r is not None else h.clone())
                self.in_plugin += time.perf_counter() - t
                self.in_plugin_cpu += time.thread_time() - c

            for i in range(LAYERS):
                handles.append(model.get_submodule(f"model.layers.{i}").register_forward_hook(keep))
        elif mode == "plain" and cap is not None and not cap.paused:
            raise SystemExit("plain run with the capture on")
        self.in_plugin = 0.0
        self.in_plugin_cpu = 0.0
        prof: Any = None
        if self.profile and mode in ("strap", "unfused"):
            import cProfile

            # the engine thread's CPU time, not wall time: a shared machine's load would
            # otherwise be counted into every part
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
        n0 = _rusage_counts()
        g0 = self.gc.snapshot()
        c0, t0 = _cpu_self(), time.monotonic()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        t1 = time.monotonic()
        if prof is not None:
            prof.disable()
            res["profile"] = profile_parts(prof)
        if mode in ("strap", "unfused"):
            cap.pause()
            if mode == "unfused":
                cap._record_sum, cap._record_tokens = fused
            after = cap.checkpoint()
            res.update(bytes=after["offset"] - before["offset"], packets=cap.session.packets - pk0,
                       tokens=cap.session.tokens - tok0, drops=cap.session.drops)
        elif mode == "hooks":
            for h in handles:
                h.remove()
            import torch

            path = self.out / f"hooks-{os.getpid()}.pt"
            with open(path, "wb") as f:
                torch.save(buf, f)
                f.flush()
                os.fsync(f.fileno())
            res.update(bytes=path.stat().st_size)
            buf.clear()
        elif mode == "extract":
            import fcntl

            total = 0
            for o in outs:
                p = (o.kv_transfer_params or {}).get("hidden_states_path")
                if p is None:
                    raise SystemExit(f"extract: request {o.request_id} has no hidden_states_path")
                with open(p + ".lock") as lf:
                    fcntl.flock(lf, fcntl.LOCK_SH)  # held by the connector's writer until written
                total += os.path.getsize(p)
            res.update(bytes=total)
        t2, c2 = time.monotonic(), _cpu_self()
        res.update({k: v - n0[k] for k, v in _rusage_counts().items()})
        g1 = self.gc.snapshot()
        # the cyclic collector's time in this batch, and its generation-2 (full) collections
        res.update(gc_s=sum(g1[0]) - sum(g0[0]), gc_full=g1[1][2] - g0[1][2], gc_full_s=g1[0][2] - g0[0][2])
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if got != n * MAX_TOKENS:
            raise SystemExit(f"{mode}: generated {got} tokens, expected {n * MAX_TOKENS}")
        # in_plugin_s: the engine thread's time in the capture's code during generate (strap:
        # the plugin's hooks and step wrappers; hooks: the list hooks; plain: the paused
        # plugin's wrappers); save_s: after generate, until the bytes are on disk
        # in_plugin_cpu_s: the same, the thread's CPU time
        res.update(generate_s=t1 - t0, total_s=t2 - t0, cpu_s=c2 - c0, in_plugin_s=self.in_plugin,
                   in_plugin_cpu_s=self.in_plugin_cpu, save_s=t2 - t1)
        if mode == "hooks":
            (self.out / f"hooks-{os.getpid()}.pt").unlink()
        if mode == "extract":
            for p in self.extract_dir.iterdir():
                p.unlink()
        return res


def worker_main(kind: str, model: str, out: str, profile: bool) -> None:
    w = Worker(kind, model, Path(out), profile)
    print(RESULT + json.dumps({"ready": kind}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        try:
            res = w.run(req["mode"], req["n"], req["seed"])
        except SystemExit as e:
            res = {"error": str(e)}
        print(RESULT + json.dumps(res), flush=True)
    if w.cap is not None:
        w.cap.close()


# ----- parent ------------------------------------------------------------------------------


def start_strapd(binary: str, sock: str) -> subprocess.Popen:
    p = subprocess.Popen([binary, "serve", "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(sock)
            s.close()
            return p
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise SystemExit(f"strapd did not start on {sock}")
            time.sleep(0.05)


def machine_cpu() -> Dict[str, float]:
    """Core-seconds the whole machine spent so far, by kind (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        v = [int(x) / TICK for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return {"busy": user + nice + system + irq + softirq, "system": system + irq + softirq, "idle": idle,
            "iowait": iowait, "steal": steal}


#: modes that are ``strap`` with strapd's threads under another scheduling policy for the
#: batch (set by the parent before it, SCHED_OTHER again after): SCHED_BATCH (a woken strapd
#: does not preempt the engine's running threads) and SCHED_IDLE (strapd runs only on a core
#: nothing else wants).
SCHED_MODES = {"strap-batch": os.SCHED_BATCH, "strap-idle": os.SCHED_IDLE}


def set_policy(pid: int, policy: int) -> None:
    """Every thread of ``pid`` under ``policy`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except ProcessLookupError:
            pass  # the thread exited meanwhile


PF_KTHREAD = 0x00200000  # /proc/PID/stat's flags: a kernel thread


def kernel_threads_cpu() -> float:
    """CPU seconds the kernel's own threads (writeback's kworkers, ksoftirqd, ...) used so
    far, summed over the live ones: what the kernel does on behalf of everyone, apart from
    the interrupts and system calls /proc/stat counts to the processes themselves."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[6]) & PF_KTHREAD:  # field 9, flags
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


class Child:
    def __init__(self, kind: str, model: Path, out: Path, env: Dict[str, str], log: Path, profile: bool) -> None:
        self.kind = kind
        self.log = open(log, "w")
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", kind, "--model", str(model), "--out", str(out)]
                                  + (["--profile"] if profile else []),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        self.ready = self._read()

    def _read(self) -> Dict[str, Any]:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
            self.log.write(line)
        self.log.flush()
        return {"error": f"{self.kind} worker exited ({self.p.wait()}); see {self.log.name}"}

    def ask(self, **req: Any) -> Dict[str, Any]:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.p.poll() is None:
            try:
                self.ask(quit=True)
            except (BrokenPipeError, OSError):
                pass
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--strapd", default="bin/strapd")
    ap.add_argument("--out", default="build/bench-vllm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--modes", default="plain,strap,hooks,vanilla,extract",
                    help="of plain, strap, strap-batch, strap-idle, unfused, hooks, vanilla, extract")
    ap.add_argument("--preset", default="fast_capture", help="STRAP_VLLM_PRESET of the strap mode")
    ap.add_argument("--profile", action="store_true",
                    help="run the strap batches under cProfile and print the plugin's parts (cumulative s)")
    ap.add_argument("--json", default=None, help="write every batch's figures here (default OUT/results.json)")
    ap.add_argument("--summarize", default=None, metavar="RUNS_JSONL",
                    help="only print the summary of the batches in a runs.jsonl an earlier run wrote")
    a = ap.parse_args()
    if a.worker:
        worker_main(a.worker, a.model, a.out, a.profile)
        return
    if a.summarize:
        done = [json.loads(ln) for ln in open(a.summarize) if ln.strip()]
        summarize(done, list(dict.fromkeys(r["mode"] for r in done)), list(dict.fromkeys(r["n"] for r in done)))
        return

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(a.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=HIDDEN, intermediate_size=2816, num_hidden_layers=LAYERS,
                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                 max_position_embeddings=256)).eval().save_pretrained(out / "model")
    modes = [m for m in a.modes.split(",") if m]
    batches = [int(x) for x in a.batches.split(",")]
    sockdir = tempfile.mkdtemp(prefix="strap-", dir="/tmp")
    sock = os.path.join(sockdir, "strapd.sock")
    daemon = start_strapd(os.path.abspath(a.strapd), sock)
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRAP_VLLM_")}
    base.update(STRAPD_SOCKET=sock, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    children: Dict[str, Child] = {}
    failed: Dict[str, str] = {}  # mode -> why it was left out
    rows: List[Dict[str, Any]] = []
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; modes {modes}; batches {batches}; {a.rounds} rounds", flush=True)
    try:
        wanted = {"plugin": any(owner(m) == "plugin" for m in modes), "vanilla": "vanilla" in modes,
                  "extract": "extract" in modes}
        for kind, on in wanted.items():
            if not on:
                continue
            env = dict(base)
            if kind == "plugin":
                env.update(STRAP_VLLM_OUTPUT=str(out / "caps"), STRAP_VLLM_PRESET=a.preset)
            t = time.monotonic()
            c = Child(kind, out / "model", out, env, out / f"{kind}.log", a.profile)
            if "error" in c.ready:
                print(f"{kind} engine did not start: {c.ready['error']}", flush=True)
                c.stop()
                failed.update({m: f"engine did not start: {c.ready['error']}" for m in modes if owner(m) == kind})
                modes = [m for m in modes if owner(m) != kind]
                continue
            children[kind] = c
            print(f"{kind} engine up in {time.monotonic() - t:.0f} s", flush=True)
        for n in batches:
            for m in modes:  # warm-up: one batch per mode, not timed
                r = children[owner(m)].ask(mode=wire(m), n=n, seed=n)
                if "error" in r:
                    why = r["error"] + last_error(out / f"{owner(m)}.log")
                    print(f"warm-up {m} x{n} failed: {why}", flush=True)
                    failed[m] = why
                    modes = [x for x in modes if x != m]
            for rnd in range(a.rounds):
                order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                for m in order:
                    if m in SCHED_MODES:
                        set_policy(daemon.pid, SCHED_MODES[m])
                    s0, m0, k0 = proc_cpu(daemon.pid), machine_cpu(), kernel_threads_cpu()
                    try:
                        r = children[owner(m)].ask(mode=wire(m), n=n, seed=n)
                    finally:
                        if m in SCHED_MODES:
                            set_policy(daemon.pid, os.SCHED_OTHER)
                    if "error" in r:
                        raise SystemExit(f"{m} x{n} round {rnd}: {r['error']}")
                    m1, k1 = machine_cpu(), kernel_threads_cpu()
                    r.update(mode=m, round=rnd, strapd_cpu_s=proc_cpu(daemon.pid) - s0, load=os.getloadavg()[0],
                             **{f"machine_{k}_s": m1[k] - m0[k] for k in m0})
                    # every other process's and the kernel's threads' CPU in this batch (the
                    # kernel's writeback, the parent, anything else running)
                    r["others_cpu_s"] = r["machine_busy_s"] - r["cpu_s"] - r["strapd_cpu_s"]
                    r["kthreads_cpu_s"] = k1 - k0
                    rows.append(r)
                    (out / "runs.jsonl").open("a").write(json.dumps(r) + "\n")  # kept if a later step fails
                    print(f"  x{n} round {rnd} {m:8s} generate {r['generate_s']:6.2f} s  total {r['total_s']:6.2f} s  "
                          f"in capture {r['in_plugin_s'] + r['save_s']:5.2f} s "
                          f"(thread cpu {r['in_plugin_cpu_s']:5.3f} s)  "
                          f"cpu {r['cpu_s']:6.2f} s  strapd cpu {r['strapd_cpu_s']:5.2f} s"
                          + (f"  {r['bytes'] / 2**20:7.1f} MiB" if r.get("bytes") else "")
                          + f"  others {r['others_cpu_s']:5.2f} s (kernel threads {r['kthreads_cpu_s']:4.2f} s) steal {r['machine_steal_s']:4.2f} s"
                          f"  preempted {r['preempted']} waited {r['waited']} minflt {r['minflt']}"
                          f"  gc {r.get('gc_s', 0):.3f} s ({r.get('gc_full', 0)} full, {r.get('gc_full_s', 0):.3f} s)"
                          + f"  load {os.getloadavg()[0]:.2f}", flush=True)
                    for label, (ct, nc) in r.get("profile", {}).items():
                        print(f"      {label:48s} {ct:6.3f} s  {nc:6d} calls", flush=True)
    finally:
        for c in children.values():
            c.stop()
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)
    summary = summarize(rows, modes, batches)
    for m, why in failed.items():
        print(f"  {m}: not measured: {why}")
    path = Path(a.json) if a.json else out / "results.json"
    path.write_text(json.dumps({"cpu": cpu, "cores": os.cpu_count(), "preset": a.preset, "rounds": a.rounds,
                                "summary": summary, "failed": failed, "runs": rows}, indent=1))
    print(f"figures: {path}")


def last_error(log: Path) -> str:
    """The last exception a worker's log holds and the source line it came from (e.g. why
    vLLM's native extraction fails on a CPU), for the summary."""
    import re

    try:
        lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in log.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[\w.]*(Error|Exception): ", lines[i]):
            where = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].startswith("File ")), "")
            return f" ({lines[i]}" + (f"; at {where})" if where else ")")
    return ""


def owner(mode: str) -> str:
    return {"vanilla": "vanilla", "extract": "extract"}.get(mode, "plugin")


def wire(mode: str) -> str:
    return "plain" if mode == "vanilla" else "strap" if mode in SCHED_MODES else mode


def summarize(rows: List[Dict[str, Any]], modes: List[str], batches: List[int]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for n in batches:
        rounds = sorted({r["round"] for r in rows if r["n"] == n})
        by = {(r["round"], r["mode"]): r for r in rows if r["n"] == n}
        rows_n = sum(prompt_lengths(n, n)) + n * (MAX_TOKENS - 1)  # positions with a forward pass
        print(f"\nbatch of {n} requests ({rows_n} positions computed, {n * MAX_TOKENS} tokens generated); "
              f"kept = plain / mode, per round, median [min, max]:")
        res: Dict[str, Any] = {"positions": rows_n, "generated": n * MAX_TOKENS}
        for m in modes:
            if m == "plain":
                continue
            kept = [by[(i, "plain")]["generate_s"] / by[(i, m)]["total_s"] for i in rounds if (i, m) in by]
            # CPU seconds of the engine's process plus strapd's, both sides (strapd idles
            # through a plain batch too)
            kept_cpu = [(by[(i, "plain")]["cpu_s"] + by[(i, "plain")]["strapd_cpu_s"])
                        / (by[(i, m)]["cpu_s"] + by[(i, m)]["strapd_cpu_s"]) for i in rounds if (i, m) in by]
            if not kept:
                continue
            mine = [by[(i, m)] for i in rounds if (i, m) in by]
            d: Dict[str, Any] = {
                "kept_median": statistics.median(kept), "kept_min": min(kept), "kept_max": max(kept),
                "kept_cpu_median": statistics.median(kept_cpu),
                "total_s_median": statistics.median(r["total_s"] for r in mine),
                "bytes": statistics.median(r.get("bytes", 0) for r in mine)}
            d["in_engine_share"] = statistics.median((r["in_plugin_s"] + r["save_s"]) / r["total_s"] for r in mine)
            # the engine thread's own time per batch in the capture's code, wall and CPU
            d["in_plugin_s_median"] = statistics.median(r["in_plugin_s"] for r in mine)
            d["in_plugin_cpu_s_median"] = statistics.median(r.get("in_plugin_cpu_s", float("nan")) for r in mine)
            # The same batch's time less the capture's own: the engine thread's time in the
            # capture's code and after generate, plus strapd's CPU above idle as if all of it
            # were taken from the engine (2 cores, both busy with the model): a load-robust
            # estimate of kept, blind only to what the copies cost the model's kernels
            # (memory bandwidth, caches), which the wall-time ratio alone would show.
            bound = []
            for i in rounds:
                if (i, m) not in by:
                    continue
                r, p = by[(i, m)], by[(i, "plain")]
                idle = p["strapd_cpu_s"] / p["total_s"] * r["total_s"]
                own = r["in_plugin_s"] + r["save_s"] + max(0.0, r["strapd_cpu_s"] - idle)
                bound.append((r["total_s"] - own) / r["total_s"])
            d["kept_own_cost"] = statistics.median(bound)
            if m in ("strap", "unfused") or m in SCHED_MODES:
                # strapd's CPU less what it spends idle (its rate over the round's plain batch)
                net = [by[(i, m)]["strapd_cpu_s"] - by[(i, "plain")]["strapd_cpu_s"] / by[(i, "plain")]["total_s"]
                       * by[(i, m)]["total_s"] for i in rounds if (i, m) in by]
                sc = statistics.median(net)
                pk = statistics.median(r["packets"] for r in mine)
                d.update(strapd_cpu_s=sc, strapd_cpu_gross_s=statistics.median(r["strapd_cpu_s"] for r in mine),
                         packets=pk, strapd_us_per_packet=sc / pk * 1e6,
                         strapd_us_per_position=sc / rows_n * 1e6, strapd_us_per_token=sc / (n * MAX_TOKENS) * 1e6,
                         drops=max(r["drops"] for r in mine))
            res[m] = d
            line = (f"  {m:8s} kept {d['kept_median']:.3f} [{d['kept_min']:.3f}, {d['kept_max']:.3f}]  "
                    f"cpu-time kept {d['kept_cpu_median']:.3f}  own-cost kept {d['kept_own_cost']:.3f}  "
                    f"median {d['total_s_median']:.2f} s  own time {d['in_plugin_s_median']:.3f} s "
                    f"(thread cpu {d['in_plugin_cpu_s_median']:.3f} s)")
            if d["bytes"]:
                line += f"  {d['bytes'] / 2**20:.1f} MiB"
            if m in ("strap", "unfused") or m in SCHED_MODES:
                line += (f"  strapd {d['strapd_cpu_s']:.2f} cpu-s over idle = {d['strapd_us_per_packet']:.0f} us/packet "
                         f"({d['packets']:.0f} packets), {d['strapd_us_per_position']:.0f} us/position, "
                         f"{d['strapd_us_per_token']:.0f} us/generated token; {d['drops']} drops")
            print(line)
        # what else the machine did per batch, by mode (medians): other processes' and the
        # kernel's CPU, the hypervisor's steal, the engine's preemptions and page faults
        extra = ("others_cpu_s", "kthreads_cpu_s", "machine_steal_s", "preempted", "minflt", "gc_s", "gc_full")
        for m in modes:
            mine = [by[(i, m)] for i in rounds if (i, m) in by and "gc_s" in by[(i, m)]]
            if mine:
                med = {k: statistics.median(r[k] for r in mine) for k in extra}
                res.setdefault(m, {}).update({f"{k}_median": v for k, v in med.items()})
                print(f"  {m:8s} per batch: others' cpu {med['others_cpu_s']:.2f} s (kernel threads "
                      f"{med['kthreads_cpu_s']:.2f} s), Python's collector {med['gc_s']:.3f} s "
                      f"({med['gc_full']:.0f} full), steal {med['machine_steal_s']:.2f} s, "
                      f"engine preempted {med['preempted']:.0f}x, minor faults {med['minflt']:.0f}")
        plain = [by[(i, "plain")]["generate_s"] for i in rounds if (i, "plain") in by]
        if plain:
            res["plain_s_median"] = statistics.median(plain)
            print(f"  plain    median {res['plain_s_median']:.2f} s")
        out[str(n)] = res
    return out


if __name__ == "__main__":
    main()
