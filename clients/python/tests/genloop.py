"""The deterministic generation loop shared by the resume tests and their child process:
greedy decoding of the tiny Llama without a KV cache, so each forward pass depends only on
the tokens so far and a resumed run regenerates exactly the packets of an uninterrupted one."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

PROMPT = [1, 5, 9, 33, 100, 7]
N_TOKENS = 12
INTERVAL = 4


def generate(fw: Any, model: Any, n_tokens: int = N_TOKENS, delay: float = 0.0, echo: bool = False,
             prompt: Optional[Sequence[int]] = None, on_token: Optional[Callable[[int], None]] = None) -> None:
    """Generate until ``n_tokens`` are recorded, from ``prompt`` (default PROMPT) and the
    tokens already recorded; ``on_token(step)`` after each."""
    import torch

    tr = fw.token_tracker
    ids = list(PROMPT if prompt is None else prompt) + [t["token_id"] for t in tr.tokens]
    with torch.no_grad():
        while tr.step < n_tokens:
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
            nxt = int(logits[0, -1].argmax())
            tr.record_token(nxt, f"<{nxt}>")
            ids.append(nxt)
            if echo:
                print(f"token {tr.step}", flush=True)
            if on_token is not None:
                on_token(tr.step)
            if delay:
                time.sleep(delay)
