"""`make demo`: capture a real Hugging Face Llama-architecture model through strapd.

No weights can be downloaded here, so the model is built from a small `LlamaConfig` with a
fixed seed. The capture goes PyTorch hooks → memfd ring → strapd (started automatically if
none is running) → stream file; the table below is read back from that file.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llm_instrumentation import capture_activations, open_stream


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
