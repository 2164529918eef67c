"""Shared checks for capture tests (fake daemon and real strapd): tensors read back with
open_stream must be bit-identical to what independent plain forward hooks saw."""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from llm_instrumentation import capture_activations, open_stream


def reference_hooks(model: torch.nn.Module, names: Sequence[str]):
    """Plain forward hooks (no llm_instrumentation code) that clone each module's main output."""
    seen: Dict[str, List[torch.Tensor]] = {n: [] for n in names}
    mods = dict(model.named_modules())
    handles = []
    for n in names:
        def hook(mod, args, out, n=n):
            t = out
            if isinstance(t, dict):
                t = next(v for v in t.values() if isinstance(v, torch.Tensor))
            elif isinstance(t, (tuple, list)):
                t = next(v for v in t if isinstance(v, torch.Tensor))
            seen[n].append(t.detach().clone())
        handles.append(mods[n].register_forward_hook(hook))
    return seen, handles


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.uint8) if t.numel() else t


def capture_and_check(model, inputs: List[dict], out_path, socket_path, preset="balanced", config=None,
                      forwards_per_input=1, **kw):
    """Run ``inputs`` through ``model`` under capture with reference hooks on the same
    modules; check the file is exact and complete. Returns (framework, reference dict)."""
    with torch.no_grad():
        with capture_activations(model, preset=None if config else preset, config=config, output_path=out_path,
                                 socket_path=socket_path, autostart_daemon=False, **kw) as fw:
            ref, handles = reference_hooks(model, fw.hooked_modules)
            try:
                for inp in inputs:
                    model(**inp)
            finally:
                for h in handles:
                    h.remove()
    n_fwd = len(inputs) * forwards_per_input
    assert fw.summary["drops"] == 0
    with open_stream(out_path) as r:
        for name in fw.hooked_modules:
            got = r.tensors(name)
            assert len(got) == len(ref[name]) == n_fwd, (name, len(got), len(ref[name]))
            for i, (g, want) in enumerate(zip(got, ref[name])):
                tt = g.tensor()
                assert tt.dtype == want.dtype and tuple(tt.shape) == tuple(want.shape), (name, i)
                assert torch.equal(bits(tt), bits(want)), f"{name} forward {i} differs"
                assert g.forward == i
        assert r.end().meta["status"] == "complete"
    a = fw.analyze_activations()
    main = sum(len(v) for v in ref.values())
    assert a["tensors"] >= main  # secondary outputs (name.outN) come on top
    assert a["per_layer"][fw.hooked_modules[0]]["count"] == n_fwd
    return fw, ref
