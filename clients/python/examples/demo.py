"""`make demo`: capture a real Hugging Face Llama-architecture model through strapd.

No weights can be downloaded here, so the model is built from a small `LlamaConfig` with a
fixed seed. The capture goes PyTorch hooks → memfd ring → strapd (started automatically if
none is running) → stream file; the table below is read back from that file.

Then a generation loop: greedy decoding with the KV cache, per-token tracking (every token
is a TOKEN packet, every packet carries its step) and a durable checkpoint every 8 tokens;
the bytes per token are read back from the stream.

Last, a generation captured with the kernel trace (as root: strapd's BPF probes) and resource
events (DETAILED: per-module time, FLOPs, memory, KV cache), turned into the HTML report of
``python -m llm_instrumentation.report``; its path and the three biggest costs are printed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llm_instrumentation import analyze_activations_with_tokens, capture_activations, open_stream


def main() -> int:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1024,
    )
    model = LlamaForCausalLM(config).eval()
    out_dir = os.environ.get("DEMO_OUTPUT_DIR") or tempfile.mkdtemp(prefix="strap-demo-")
    output = os.path.join(out_dir, "llama-demo.strap")
    prompts = torch.randint(0, config.vocab_size, (4, 1, 64), generator=torch.Generator().manual_seed(1))

    t0 = time.perf_counter()
    with capture_activations(model, preset="balanced", output_path=output) as framework:
        with torch.no_grad():
            for ids in prompts:
                model(ids)
    elapsed = time.perf_counter() - t0

    analysis = framework.analyze_activations(output)
    print(f"\ncaptured {len(prompts)} forward passes of LlamaForCausalLM "
          f"({config.num_hidden_layers} layers, hidden {config.hidden_size}) in {elapsed:.2f} s")
    print(f"stream: {output}\n")
    header = f"{'module':<32} {'packets':>7} {'dtype':>9} {'shape':>14} {'raw':>10} {'stored':>10} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name, row in analysis["per_layer"].items():
        shape = "x".join(str(d) for d in row["shape"])
        ratio = row["raw_bytes"] / row["stored_bytes"] if row["stored_bytes"] else float("inf")
        print(f"{name:<32} {row['count']:>7} {row['dtype']:>9} {shape:>14} "
              f"{row['raw_bytes']:>10} {row['stored_bytes']:>10} {ratio:>6.2f}")
    print("-" * len(header))
    print(f"{'total':<32} {analysis['packets']:>7} {'':>9} {'':>14} "
          f"{analysis['total_raw_bytes']:>10} {analysis['total_stored_bytes']:>10} "
          f"{analysis['compression_ratio']:>6.2f}")
    print(f"drops: {analysis['drops']['count']}   end: {analysis['end_status']}")

    # Read one tensor back to show the file is self-describing.
    with open_stream(output) as reader:
        first = next(iter(reader))
        t = first.tensor()
        print(f"\nfirst record: {first.name} step={first.step} forward={first.forward} "
              f"{t.dtype} {tuple(t.shape)} mean={t.float().mean().item():+.4f}")

    generate(model, os.path.join(out_dir, "llama-generate.strap"))
    report(model, os.path.join(out_dir, "llama-report.strap"))
    return 0


def greedy(model: LlamaForCausalLM, prompt: torch.Tensor, tracker: Any, n_tokens: int) -> None:
    """Greedy decoding with the KV cache; each new token is recorded (a TOKEN packet)."""
    with torch.no_grad():
        ids, past = prompt, None
        while tracker.step < n_tokens:
            res = model(input_ids=ids, cache=past, use_cache=True)
            past = res.cache
            nxt = int(res.logits[0, -1].argmax())
            tracker.record_token(nxt, f"<{nxt}>")
            ids = torch.tensor([[nxt]])


@contextlib.contextmanager
def report_daemon():
    """A strapd of its own for the report's capture, taking a kernel snapshot every 100 ms
    (`strapd serve --trace-interval`; the default 5 s would give a one-second capture one
    snapshot and its timelines one point). Yields its socket path; stopped afterwards."""
    from llm_instrumentation._daemon import find_strapd_binary

    binary = find_strapd_binary()
    if binary is None:
        raise SystemExit("no strapd binary found (set STRAPD_BIN or run `make build`)")
    sock_dir = tempfile.mkdtemp(prefix="strapd-report-")  # short: socket paths are limited to 108 bytes
    sock = os.path.join(sock_dir, "strapd.sock")
    log = open(os.path.join(sock_dir, "strapd.log"), "ab")
    proc = subprocess.Popen([binary, "serve", "--socket", sock, "--trace-interval", "100ms"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"strapd did not start; log {log.name}")
            time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def report(model: LlamaForCausalLM, output: str, n_tokens: int = 160) -> None:
    """Capture with the kernel trace and resource events, then build the report."""
    root = os.geteuid() == 0
    if not root:
        print("\nnot root: the kernel trace needs strapd's BPF probes (CAP_BPF + CAP_PERFMON); "
              "capturing without it, the report's block I/O and system figures are skipped")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("\nmatplotlib is not installed (pip install strap-llm[report]): report skipped")
        return
    from llm_instrumentation.report import build_report

    prompt = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(3))
    with report_daemon() as sock:
        t0 = time.perf_counter()
        with capture_activations(model, preset="balanced", output_path=output, track_per_token=True,
                                 trace_path=root, resource_level="DETAILED", socket_path=sock) as fw:
            greedy(model, prompt, fw.token_tracker, n_tokens)
        elapsed = time.perf_counter() - t0
    r = build_report(output)
    print(f"\ncaptured {n_tokens} tokens with {'the kernel trace and ' if root else ''}resource events "
          f"in {elapsed:.2f} s")
    print(f"resource events: {output}.resources.jsonl" + (f"\nkernel trace: {fw.trace_path}" if root else ""))
    print(f"report: {r['html']} ({len(r['figures'])} figures)")
    print("three biggest costs:")
    for i, c in enumerate(r["costs"], 1):
        share = f" ({c['share'] * 100:.1f} % of the wall time)" if c.get("share") else ""
        print(f"  {i}. {c['label']}: {c['seconds']:.3f} s{share}")


def generate(model: LlamaForCausalLM, output: str, n_tokens: int = 32, every: int = 8) -> None:
    """Greedy generation with per-token tracking and checkpoints; bytes per token."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    t0 = time.perf_counter()
    with capture_activations(model, preset="balanced", output_path=output, track_per_token=True,
                             checkpoint_interval_tokens=every, overwrite_checkpoint=True) as fw:
        greedy(model, prompt, fw.token_tracker, n_tokens)  # a checkpoint every `every` tokens
    elapsed = time.perf_counter() - t0
    a = analyze_activations_with_tokens(output, fw)
    cks = fw.checkpoint_times
    print(f"\ngenerated {n_tokens} tokens (greedy, KV cache) in {elapsed:.2f} s, "
          f"{len(cks)} checkpoints of {1e3 * sum(cks) / max(1, len(cks)):.1f} ms on average "
          f"(strapd fdatasync + atomic checkpoint file; deleted after the clean finish)")
    print(f"stream: {output}\ntokens: {output}_tokens.json\n")
    header = f"{'token':>5} {'id':>5} {'packets':>7} {'raw bytes':>10} {'stored':>10} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    toks = {t["token_index"]: t for t in a["token_metadata"]["tokens"]}
    for step in sorted(a["bytes_per_step"]):
        b = a["bytes_per_step"][step]
        tid = toks[step]["token_id"] if step in toks else "-"
        print(f"{step:>5} {tid:>5} {a['packets_per_step'][step]:>7} {b['raw']:>10} {b['stored']:>10} "
              f"{b['raw'] / b['stored'] if b['stored'] else float('inf'):>6.2f}")
    m = a["bytes_per_token_mean"]
    print("-" * len(header))
    print(f"bytes per token: {m['raw']:.0f} raw, {m['stored']:.0f} stored "
          f"(token 0 includes the {prompt.shape[1]}-token prompt)")
    big = max(a["per_token_modules"][n_tokens - 1].items(), key=lambda kv: kv[1]["raw_bytes"])
    print(f"largest module at the last token: {big[0]} ({big[1]['raw_bytes']} raw bytes)")


if __name__ == "__main__":
    sys.exit(main())
