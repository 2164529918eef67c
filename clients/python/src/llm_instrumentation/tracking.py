"""Per-token tracking: the :class:`TokenTracker` a capture yields.

A packet's ``step`` is the number of tokens recorded before the forward pass that produced
it, so packet → token mapping is exact (no even split). While a capture is live every
recorded token is also sent to strapd as a TOKEN packet, so the stream alone is complete,
and every ``checkpoint_interval_tokens`` tokens a durable checkpoint is made
(docs/CHECKPOINTS.md).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Union


class TokenTracker:
    """Per-token bookkeeping: ``step`` of a packet = tokens recorded before its forward pass.

    Attributes:
        tokens: one dict per recorded token: ``token_index``, ``token_id``, ``token_text``,
            ``position``. After a resume it holds the checkpointed tokens.
        resume_step: the step a resumed capture goes on from (the number of tokens the
            checkpoint kept); 0 for a fresh capture.
        start_time: ``time.time()`` when the tracker was made (a capture makes it as it
            starts), as in 1.3.1.

    Example:
        >>> tr = TokenTracker()
        >>> tr.record_token(42, "hello")
        0
        >>> tr.step
        1
    """

    def __init__(self) -> None:
        self.tokens: List[Dict[str, Any]] = []
        self.resume_step = 0
        self.start_time: float = time.time()
        # Set by a live capture: sends TOKEN and makes checkpoints. Called after the token
        # is appended, with it.
        self._sink: Optional[Callable[[Dict[str, Any]], None]] = None

    @property
    def step(self) -> int:
        """Tokens recorded so far."""
        return len(self.tokens)

    def record_token(self, token_id: int, token_text: str, position: Optional[int] = None) -> int:
        """Record one token; return its index.

        During a capture the token is written into the stream (TOKEN packet) and, at every
        ``checkpoint_interval_tokens``-th token, a checkpoint is made before this returns.

        Args:
            token_id: vocabulary id (int, numpy integer or 0-d tensor).
            token_text: decoded text.
            position: sequence position (default: the token's index).

        Returns:
            the token's index.
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            token_id = int(token_id)  # accepts numpy / 0-d tensor ids
        idx = len(self.tokens)
        tok = {"token_index": idx, "token_id": token_id, "token_text": str(token_text),
               "position": idx if position is None else int(position)}
        self.tokens.append(tok)
        if self._sink is not None:
            self._sink(tok)
        return idx

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the tokens as 1.3.1's tokens file: ``{"total_tokens", "tokens",
        "capture_duration_seconds"}`` (seconds since :attr:`start_time`), UTF-8 JSON.

        A capture writes ``{output_path}_tokens.json`` itself; this is for saving elsewhere.

        Args:
            path: the JSON file to write (replaced).
        """
        doc = {
            "total_tokens": len(self.tokens),
            "tokens": self.tokens,
            "capture_duration_seconds": time.time() - self.start_time,
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
