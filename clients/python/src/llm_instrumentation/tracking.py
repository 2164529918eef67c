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

        A capture writes its tokens file itself (:func:`~llm_instrumentation.framework.tokens_path`);
        this is for saving elsewhere.

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


class TokenMap:
    """Which recorded token each forward pass's packets belong to, read off a stream.

    A packet's ``step`` is the number of tokens recorded before its forward pass, which is
    its token when tokens are recorded as they are made (forward, ``record_token``,
    forward, ...). Recorded afterwards, e.g. from ``model.generate()``'s output, every
    packet would be step 0. So the packets are walked in stream order: each run of forward
    passes followed by a run of TOKEN packets is matched from the end, the last token to
    the last forward pass, the one before to the one before, and so on (a generation's
    ``k``-th forward pass chose its ``k``-th token, with or without a KV cache). Forward
    passes left over (more than tokens) go to the run's first token, as their step says;
    tokens left over (more than forward passes: prompt tokens recorded too) get none. With
    one token per run this is exactly the step. Forward passes no token follows keep
    their step.

    Example:
        >>> from llm_instrumentation.stream import TENSOR, TOKEN
        >>> tm = TokenMap()
        >>> for ptype, step, fwd in [(TENSOR, 0, 0), (TENSOR, 0, 1), (TOKEN, 0, 0), (TOKEN, 1, 0)]:
        ...     tm.feed(ptype, step, fwd)
        >>> tm.finish(); tm.token_of(0, 1)
        1
    """

    def __init__(self) -> None:
        from .stream import DROP, TENSOR, TOKEN  # numpy only where streams are read

        self._token_type, self._packet_types = TOKEN, (TENSOR, DROP)
        self._forwards: List[int] = []
        self._tokens: List[int] = []
        self._map: Dict[int, int] = {}

    def feed(self, ptype: int, step: int, forward: int) -> None:
        """Take the next packet in stream order.

        Args:
            ptype: the packet type (``stream.TENSOR``, ``DROP``, ``TOKEN``; others ignored).
            step: its step (a TOKEN's: the token's index).
            forward: its forward pass.
        """
        if ptype == self._token_type:
            self._tokens.append(step)
        elif ptype in self._packet_types:
            if self._tokens:
                self._close()
            if not self._forwards or self._forwards[-1] != forward:
                self._forwards.append(forward)

    def finish(self) -> None:
        """Close the last run (call after the last packet)."""
        if self._tokens:
            self._close()

    def _close(self) -> None:
        fw, toks = self._forwards, self._tokens
        n = min(len(fw), len(toks))
        for f in fw[: len(fw) - n]:
            self._map[f] = toks[0]
        for f, t in zip(fw[len(fw) - n:], toks[len(toks) - n:]):
            self._map[f] = t
        self._forwards, self._tokens = [], []

    def token_of(self, step: int, forward: int) -> int:
        """The token of a packet.

        Args:
            step: the packet's step.
            forward: its forward pass.

        Returns:
            the token's index.
        """
        return self._map.get(forward, step)
