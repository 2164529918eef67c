"""Export captured activations to formats other tools load.

* ``safetensors``: size-bounded shards of rows (``activations [n, d]`` in the captured
  dtype, ``token_ids``, and where each row came from) plus ``index.json`` holding the
  streams' metadata and recorded tokens (docs/ANALYSIS.md 3).
* ``saelens``: the cached-activations layout SAELens trains from
  (``ActivationsStore(cached_activations_path=...)``): a Hugging Face ``datasets`` directory
  whose rows are sequences, ``<hook>: Array2D(context_size, d_in)`` and
  ``token_ids: Sequence(int32, context_size)``.

Command line::

    python -m llm_instrumentation.export safetensors run.strap --modules 'model.layers.2' --out acts/
    python -m llm_instrumentation.export saelens run.strap --module model.layers.2 --out cache/ \\
        --context-size 128
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .data import ActivationDataset, PathLike
from .vllm import _dataset as _vllm

#: Format name and version written into ``index.json``.
SAFETENSORS_FORMAT = "strap-activations"
SAFETENSORS_VERSION = 1
#: Metadata columns stored beside ``activations`` in each shard, with their dtype.
COLUMNS = {"token_ids": torch.int64, "token_index": torch.int64, "stream": torch.int64, "module": torch.int64,
           "step": torch.int64, "forward": torch.int64, "batch": torch.int64, "position": torch.int64,
           "lossy": torch.bool}
# Room for a shard's safetensors header (a few hundred bytes of JSON) under the size bound.
_HEADER_ROOM = 16384


def _progress(total: int, desc: str, enabled: Optional[bool]) -> Any:
    from tqdm.auto import tqdm

    on = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, disable=not on)


def parse_size(s: Union[str, int]) -> int:
    """``"512MB"``, ``"2GiB"``, ``"1e9"`` or an int → bytes."""
    if isinstance(s, int):
        return s
    t = s.strip().lower().replace(" ", "")
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[:-len(u)]) * m)
    return int(float(t))


def _streams_info(ds: ActivationDataset) -> List[Dict[str, Any]]:
    return [{"path": s.path, "metadata": s.metadata, "tokens": ds.tokens(i), "drops": s.drops,
             "incomplete_tensors": s.incomplete} for i, s in enumerate(ds.streams)]


def export_safetensors(paths: Union[PathLike, Sequence[PathLike]], out_dir: PathLike,
                       modules: Union[str, Sequence[str], None] = None, max_shard_bytes: Union[int, str] = "1GiB",
                       dtype: Optional[torch.dtype] = None, progress: Optional[bool] = None) -> Dict[str, Any]:
    """Write the rows of ``modules`` in ``paths`` as safetensors shards of at most
    ``max_shard_bytes`` each, plus ``index.json``.

    Args:
        paths: stream file(s).
        out_dir: created if missing; must not already hold an ``index.json``.
        modules: names or fnmatch patterns (default every module; they must share a width).
        max_shard_bytes: bound on each shard file's size.
        dtype: convert activations (default: keep the captured dtype, bit for bit).
        progress: tqdm bar on stderr (default: only when stderr is a terminal).

    Returns:
        the index (also written to ``out_dir/index.json``).

    Example:
        >>> idx = export_safetensors("run.strap", "acts", modules="model.layers.2")  # doctest: +SKIP
        >>> from safetensors.torch import load_file
        >>> load_file("acts/" + idx["shards"][0]["file"])["activations"].shape   # doctest: +SKIP
    """
    from safetensors.torch import save_file

    limit = parse_size(max_shard_bytes)
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, "index.json")):
        raise FileExistsError(f"{out_dir} already holds an export (index.json)")
    with ActivationDataset(paths, modules, dtype=dtype) as ds:
        if ds.rows == 0:
            raise ValueError(f"no rows to export from {ds.paths} (modules {ds.modules})")
        item = (torch.empty((), dtype=dtype).element_size() if dtype is not None
                else torch.empty((), dtype=getattr(torch, ds.units[0].dtype)).element_size())
        row_bytes = ds.d_model * item + sum(torch.empty((), dtype=d).element_size() for d in COLUMNS.values())
        per_shard = (limit - _HEADER_ROOM) // row_bytes
        if per_shard < 1:
            raise ValueError(f"max_shard_bytes {limit} cannot hold one row of {row_bytes} bytes plus the header")
        n_shards = -(-ds.rows // per_shard)
        shards: List[Dict[str, Any]] = []
        pend: List[Tuple[torch.Tensor, Dict[str, torch.Tensor]]] = []
        have = first = lossy_rows = 0
        dtype_name = None

        def flush(n: int) -> None:
            nonlocal pend, have, first
            xs, ms, taken, rest = [], [], 0, []
            for x, m in pend:
                if taken >= n:
                    rest.append((x, m))
                    continue
                k = min(n - taken, len(x))
                xs.append(x[:k])
                ms.append({c: v[:k] for c, v in m.items()})
                if k < len(x):
                    rest.append((x[k:], {c: v[k:] for c, v in m.items()}))
                taken += k
            tensors = {"activations": torch.cat(xs).contiguous()}
            for c, dt in COLUMNS.items():
                src = "token_id" if c == "token_ids" else c
                tensors[c] = torch.cat([m[src] for m in ms]).to(dt).contiguous()
            name = f"activations-{len(shards):05d}-of-{n_shards:05d}.safetensors"
            path = os.path.join(out_dir, name)
            save_file(tensors, path, metadata={"format": "pt", "first_row": str(first), "rows": str(taken)})
            size = os.path.getsize(path)
            if size > limit:
                raise RuntimeError(f"{path}: {size} bytes exceeds max_shard_bytes {limit}")
            shards.append({"file": name, "rows": taken, "first_row": first, "bytes": size})
            pend, have, first = rest, have - taken, first + taken

        with _progress(ds.rows, "safetensors", progress) as bar:
            for x, m in ds.iter_chunks(0, 1):
                dtype_name = str(x.dtype).removeprefix("torch.")
                lossy_rows += int(m["lossy"].sum())
                pend.append((x, m))
                have += len(x)
                while have >= per_shard:
                    flush(per_shard)
                bar.update(len(x))
            if have:
                flush(have)
        index = {
            "format": SAFETENSORS_FORMAT, "version": SAFETENSORS_VERSION,
            "modules": ds.modules, "d_model": ds.d_model, "dtype": dtype_name, "rows": first,
            "lossy_rows": lossy_rows, "max_shard_bytes": limit,
            "columns": {"activations": "[rows, d_model] in `dtype`",
                        **{c: str(dt).removeprefix("torch.") for c, dt in COLUMNS.items()}},
            "shards": shards, "streams": _streams_info(ds),
        }
        if ds.vllm_requests is not None:
            # A vLLM capture's rows are by request (docs/VLLM.md 4): column `batch` indexes these
            # (the engine's own ids tell apart two engine runs that reused an id).
            index["requests"] = [r.request_id for r in ds.vllm_requests]
            index["engine_request_ids"] = [r.engine_request_id for r in ds.vllm_requests]
    _write_json(os.path.join(out_dir, "index.json"), index)
    return index


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def load_safetensors_export(out_dir: PathLike) -> Tuple[Dict[str, Any], Iterator[Dict[str, torch.Tensor]]]:
    """The index of a safetensors export and an iterator over its shards' tensors."""
    from safetensors.torch import load_file

    with open(os.path.join(out_dir, "index.json")) as f:
        index = json.load(f)
    if index.get("format") != SAFETENSORS_FORMAT:
        raise ValueError(f"{out_dir}/index.json is not a {SAFETENSORS_FORMAT} index")
    return index, (load_file(os.path.join(out_dir, s["file"])) for s in index["shards"])


def _sequences(ds: ActivationDataset, ctx: int) -> Iterator[Tuple[np.ndarray, np.ndarray, int]]:
    """``(acts [n, ctx, d], token_ids [n, ctx], dropped rows)`` per captured tensor: each
    batch row of a tensor cut into whole sequences of ``ctx`` positions. A vLLM request's
    rows (docs/VLLM.md 4) are cut in runs of consecutive positions: a sequence never spans a
    gap (prefix-cache hits) nor two requests."""
    for (x, m), u in zip(ds.iter_chunks(0, 1), ds.shard_units(0, 1)):
        if u.request is not None:
            runs = _vllm.sequence_runs(u, ctx)
            ids = m["token_id"].to(torch.int32)
            if runs:
                yield (torch.stack([x[a:a + n] for a, n in runs]).numpy(),
                       torch.stack([ids[a:a + n] for a, n in runs]).numpy(), len(x) - len(runs) * ctx)
            else:
                yield np.zeros((0, ctx, x.shape[-1]), dtype=x.numpy().dtype), np.zeros((0, ctx), np.int32), len(x)
            continue
        b, t = u.batch, u.seq
        n = t // ctx
        xs = x.reshape(b, t, -1)[:, :n * ctx].reshape(b * n, ctx, -1)
        ids = m["token_id"].reshape(b, t)[:, :n * ctx].reshape(b * n, ctx)
        yield xs.numpy(), ids.to(torch.int32).numpy(), b * (t - n * ctx)


def export_saelens(paths: Union[PathLike, Sequence[PathLike]], out_dir: PathLike, module: str,
                   context_size: Optional[int] = None, hook_name: Optional[str] = None, dtype: str = "float32",
                   max_shard_size: Union[int, str] = "500MB", progress: Optional[bool] = None) -> Dict[str, Any]:
    """Write one module's activations in SAELens's cached-activations layout.

    Each captured tensor's batch rows are cut into sequences of ``context_size`` positions
    (default: the sequence length of the first tensor); positions left over at the end of a
    row are not exported, and their count is returned (and written to
    ``strap_export.json``). Token ids of unrecorded tokens are -1. A vLLM capture is cut
    request by request, in runs of consecutive positions (default ``context_size``: the
    first request's positions); its requests' ids are in ``strap_export.json``.

    Args:
        paths: stream file(s).
        out_dir: must be empty or missing.
        module: one module name (SAELens trains on one hook).
        context_size: positions per sequence.
        hook_name: the column name, i.e. SAELens's ``hook_name`` (default: ``module``).
        dtype: ``"float32"``, ``"float16"`` or ``"float64"`` (Arrow has no bfloat16).
        max_shard_size: Arrow shard size bound passed to ``save_to_disk``.
        progress: tqdm bar on stderr (default: only when stderr is a terminal).

    Returns:
        ``{"sequences", "context_size", "d_in", "hook_name", "dropped_rows", "lossy_rows", ...}``.

    Example:
        >>> export_saelens("run.strap", "cache", "model.layers.2", context_size=128)  # doctest: +SKIP
        >>> # SAELens: ActivationsStore(..., cached_activations_path="cache", hook_name="model.layers.2",
        >>> #                            context_size=128, d_in=d_model, dataset=None, ...)
    """
    import datasets
    from datasets import Array2D, Features, Sequence as HFSequence, Value

    if dtype not in ("float32", "float16", "float64"):
        raise ValueError(f"dtype must be float32, float16 or float64, got {dtype!r}")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty")
    hook = hook_name or module
    with ActivationDataset(paths, [module], dtype=getattr(torch, dtype)) as ds:
        if ds.modules != [module]:
            raise ValueError(f"module {module!r} not found as one module in {ds.paths} (got {ds.modules})")
        units = ds.shard_units(0, 1)
        if not units:
            raise ValueError(f"{module}: no tensors")
        ctx = context_size or units[0].seq
        if ctx < 1:
            raise ValueError(f"context_size must be ≥ 1, got {ctx}")
        n_seq = sum(len(_vllm.sequence_runs(u, ctx)) if u.request is not None else u.batch * (u.seq // ctx)
                    for u in units)
        if n_seq == 0:
            raise ValueError(f"no captured tensor of {module} has {ctx} positions (lengths "
                             f"{sorted({u.seq for u in units})})")
        features = Features({hook: Array2D(shape=(ctx, ds.d_model), dtype=dtype),
                             "token_ids": HFSequence(Value(dtype="int32"), length=ctx)})
        stats = {"dropped_rows": 0, "lossy_rows": sum(u.rows for u in units if u.lossy)}
        tmp = tempfile.mkdtemp(prefix=".strap-export-", dir=os.path.dirname(os.path.abspath(out_dir)) or ".")
        # datasets draws its own bars: ours (rows read from the streams) says it all.
        bars_were_on = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            bar = _progress(n_seq * ctx, "saelens", progress)

            def gen() -> Iterator[Dict[str, Any]]:
                for xs, ids, dropped in _sequences(ds, ctx):
                    stats["dropped_rows"] += dropped
                    for i in range(len(xs)):
                        yield {hook: xs[i], "token_ids": ids[i]}
                    bar.update(len(xs) * ctx)

            with bar:
                hf = datasets.Dataset.from_generator(gen, features=features, cache_dir=tmp)
            hf.save_to_disk(os.fspath(out_dir), max_shard_size=max_shard_size)
            del hf
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if bars_were_on:
                datasets.enable_progress_bars()
        result = {"format": "saelens-cached-activations", "hook_name": hook, "module": module,
                  "context_size": ctx, "d_in": ds.d_model, "dtype": dtype, "sequences": n_seq,
                  "rows": n_seq * ctx, **stats, "streams": _streams_info(ds)}
        if ds.vllm_requests is not None:
            result["requests"] = [r.request_id for r in ds.vllm_requests]
            result["engine_request_ids"] = [r.engine_request_id for r in ds.vllm_requests]
    _write_json(os.path.join(out_dir, "strap_export.json"), result)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m llm_instrumentation.export {safetensors,saelens} ...``"""
    ap = argparse.ArgumentParser(prog="python -m llm_instrumentation.export",
                                 description="Export captured activations (strap streams) to safetensors shards "
                                             "or SAELens's cached-activations layout.")
    sub = ap.add_subparsers(dest="fmt", required=True)
    st = sub.add_parser("safetensors", help="size-bounded safetensors shards + index.json")
    st.add_argument("streams", nargs="+")
    st.add_argument("--out", required=True)
    st.add_argument("--modules", nargs="+", default=None, help="names or fnmatch patterns (default: all)")
    st.add_argument("--max-shard-bytes", default="1GiB")
    st.add_argument("--dtype", default=None, help="convert, e.g. float32 (default: the captured dtype)")
    sl = sub.add_parser("saelens", help="SAELens cached activations (HF datasets Arrow shards)")
    sl.add_argument("streams", nargs="+")
    sl.add_argument("--out", required=True)
    sl.add_argument("--module", required=True)
    sl.add_argument("--context-size", type=int, default=None)
    sl.add_argument("--hook-name", default=None)
    sl.add_argument("--dtype", default="float32", choices=["float32", "float16", "float64"])
    sl.add_argument("--max-shard-size", default="500MB")
    for p in (st, sl):
        g = p.add_mutually_exclusive_group()
        g.add_argument("--progress", dest="progress", action="store_true", default=None)
        g.add_argument("--no-progress", dest="progress", action="store_false")
    a = ap.parse_args(argv)
    # One argument may be a capture-set manifest or a directory (a vLLM capture), not only a stream.
    streams = a.streams[0] if len(a.streams) == 1 else a.streams
    try:
        if a.fmt == "safetensors":
            dt = getattr(torch, a.dtype) if a.dtype else None
            if a.dtype and not isinstance(dt, torch.dtype):
                ap.error(f"unknown dtype {a.dtype}")
            idx = export_safetensors(streams, a.out, a.modules, a.max_shard_bytes, dt, a.progress)
            print(f"{idx['rows']} rows × {idx['d_model']} ({idx['dtype']}) of {len(idx['modules'])} module(s) → "
                  f"{len(idx['shards'])} shard(s) in {a.out}")
        else:
            r = export_saelens(streams, a.out, a.module, a.context_size, a.hook_name, a.dtype, a.max_shard_size,
                               a.progress)
            print(f"{r['sequences']} sequences × {r['context_size']} × {r['d_in']} ({r['dtype']}) as "
                  f"{r['hook_name']!r} → {a.out}" + (f"; {r['dropped_rows']} rows left over (not a whole "
                                                    "sequence) not exported" if r["dropped_rows"] else ""))
    except (ValueError, FileExistsError, OSError) as e:
        print(f"export: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
