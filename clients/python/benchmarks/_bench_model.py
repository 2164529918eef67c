"""The benchmark model shared by the scripts in this directory (docs/PERFORMANCE.md).

A Hugging Face ``LlamaForCausalLM`` built from a config (random init, seed 0, no download):
sized so one 512-token fp32 forward pass takes a fraction of a second on a small CPU
machine. Every benchmark script builds it the same way so their numbers compare.
"""

from __future__ import annotations

import os
import resource
from typing import Any, Dict

#: The default model config of `make bench` (issue 6: hidden 1024, 8 layers, inter 2816).
DEFAULT_MODEL: Dict[str, int] = {"hidden": 1024, "layers": 8, "intermediate": 2816, "vocab": 32000, "heads": 16}

#: Capture sets of the overhead benchmark -> HookGranularity values.
CAPTURE_SETS: Dict[str, str] = {
    "residual": "residual_only",  # decoder block outputs (the residual stream)
    "resid+attn+mlp": "full_tensor",  # + attention and MLP outputs
    "all_modules": "all_modules",  # every named module
}


def build_model(hidden: int, layers: int, intermediate: int, vocab: int, heads: int) -> Any:
    """Return the benchmark ``LlamaForCausalLM`` in eval mode, fp32, on CPU (seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                      max_position_embeddings=4096)
    return LlamaForCausalLM(cfg).eval()


def rss_bytes() -> Dict[str, int]:
    """This process's current and peak resident set (``/proc/self/status`` VmRSS, VmHWM)."""
    out = {"rss": 0, "hwm": 0}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                out["hwm"] = int(line.split()[1]) * 1024
    return out


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def pid_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``, clock ticks):
    how the scripts here read strapd's CPU around a trial."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads() -> int:
    """torch intra-op threads."""
    import torch

    return torch.get_num_threads() or os.cpu_count() or 1
