"""Real captures for the data / export / analysis tests: prompts run through a model under
capture_activations (real strapd), each prompt's tokens recorded before its forward pass,
with independent plain hooks keeping what each module really produced."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from captest import reference_hooks

from llm_instrumentation import InstrumentationConfig, capture_activations


def prompts(n: int, length: int, vocab: int = 1000, seed: int = 0) -> List[List[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def capture_prompts(model: torch.nn.Module, batches: Sequence[Sequence[Sequence[int]]], out: Path, socket: str,
                    preset: Optional[str] = "fast_capture", config: Optional[InstrumentationConfig] = None,
                    record: bool = True, modules: Optional[Sequence[str]] = None
                    ) -> Dict[str, List[torch.Tensor]]:
    """Run each batch (a list of equal-length prompts) as one forward pass; record its
    tokens (flattened, position = index in the prompt) before it. Returns the reference
    outputs per hooked module, one per forward."""
    with torch.no_grad():
        with capture_activations(model, preset=None if config else preset, config=config, output_path=out,
                                 socket_path=socket, autostart_daemon=False, track_per_token=True,
                                 modules=modules) as fw:
            ref, handles = reference_hooks(model, fw.hooked_modules)
            try:
                for batch in batches:
                    if record:
                        for p in batch:
                            for i, tid in enumerate(p):
                                fw.record_token(tid, f"<{tid}>", position=i)
                    model(input_ids=torch.tensor([list(p) for p in batch]))
            finally:
                for h in handles:
                    h.remove()
    assert fw.summary["drops"] == 0
    return ref
