"""Scans of many captures with Dask, planned from their chunk manifests
(:mod:`llm_instrumentation.manifest`): every captured tensor is one Dask task that fetches
its byte range(s), checks the CRC and decodes, so a cluster (or a laptop's threads) reads
the captures in parallel from object storage without a copy (docs/ANALYSIS.md 6).

Dask is optional (``pip install 'strap-llm[dask]'``), imported when a function runs.

Example:
    >>> ms = [load_manifest(u) for u in ("s3://caps/a.strap", "s3://caps/b.strap")]  # doctest: +SKIP
    >>> x = module_array(ms, "model.layers.2")            # dask array [rows, d_model]
    >>> module_statistics(ms).loc["model.layers.2", "mean_norm"]                      # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..manifest import load_manifest, read_chunk_rows

__all__ = ["module_array", "module_statistics", "packet_dataframe", "tensor_chunks"]

Manifest = Dict[str, Any]
ManifestLike = Union[Manifest, str, "os.PathLike[str]"]


def _dask() -> Tuple[Any, Any]:
    try:
        import dask
        import dask.array as da
    except ModuleNotFoundError:
        raise ImportError("Dask is needed here: pip install 'strap-llm[dask]'") from None
    return dask, da


def _manifests(ms: Union[ManifestLike, Sequence[ManifestLike]],
               storage_options: Optional[Dict[str, Any]]) -> List[Manifest]:
    if isinstance(ms, (dict, str, os.PathLike)):
        ms = [ms]
    return [m if isinstance(m, dict) else load_manifest(m, storage_options) for m in ms]


def tensor_chunks(manifest: Manifest, module: str) -> List[List[Dict[str, Any]]]:
    """The chunks of ``module`` grouped into whole tensors, in file order (a tensor stored
    as PART packets is its parts; one whose parts do not all appear is left out, with a
    warning, as the stream reader leaves it out)."""
    out: List[List[Dict[str, Any]]] = []
    pending: Optional[List[Dict[str, Any]]] = None
    incomplete = 0
    for c in manifest["chunks"]:
        if c["module"] != module:
            continue
        part = c.get("part")
        if part is None:
            out.append([c])
            continue
        if pending is not None:
            last = pending[-1]
            if part["offset"] != last["part"]["offset"] + last["raw_len"] or \
                    part["tensor_len"] != last["part"]["tensor_len"]:
                incomplete += 1
                pending = None
        if pending is None:
            if part["offset"] != 0:
                incomplete += 1
                continue
            pending = []
        pending.append(c)
        if part["offset"] + c["raw_len"] == part["tensor_len"]:
            out.append(pending)
            pending = None
    incomplete += pending is not None
    if incomplete:
        warnings.warn(f"{manifest['object']}: {incomplete} tensor(s) of {module} whose parts did not all arrive "
                      "are left out", stacklevel=3)
    return out


def _rows(obj: str, size: int, chunks: List[Dict[str, Any]], storage_options: Optional[Dict[str, Any]],
          dtype: Any) -> np.ndarray:
    x = read_chunk_rows({"object": obj, "size": size}, chunks, storage_options)
    return x.astype(dtype, copy=False) if dtype is not None else x


def module_array(manifests: Union[ManifestLike, Sequence[ManifestLike]], module: str,
                 storage_options: Optional[Dict[str, Any]] = None, dtype: Any = np.float32) -> Any:
    """The rows of ``module`` in every capture as one Dask array ``[rows, width]``.

    One block per captured tensor (its ``prod(shape[:-1])`` rows), in manifest order and
    file order; computing a block fetches and decodes that tensor's byte range(s) only.

    Args:
        manifests: manifests (dicts), or paths / URLs of manifests or of their streams.
        module: the module name.
        storage_options: fsspec options for the objects (and the manifests).
        dtype: the array's dtype (``None``: as :meth:`~llm_instrumentation.stream.Tensor.numpy`
            gives it: the captured one, bfloat16/float8 as float32).

    Raises:
        ValueError: the module is in none of the manifests, or its tensors are not per-token
            rows of one width.
    """
    dask, da = _dask()
    blocks = []
    width: Optional[int] = None
    for m in _manifests(manifests, storage_options):
        for chunks in tensor_chunks(m, module):
            shape = chunks[0]["shape"]
            if len(shape) not in (2, 3):
                raise ValueError(f"{m['object']}: {module} has shape {shape}, not [B, T, d] or [T, d]")
            if width is None:
                width = shape[-1]
            elif shape[-1] != width:
                raise ValueError(f"{module}: tensors of widths {width} and {shape[-1]}")
            rows = int(np.prod(shape[:-1]))
            out_dtype = np.dtype(dtype) if dtype is not None else _numpy_dtype(chunks[0]["dtype"])
            d = dask.delayed(_rows, pure=True)(m["object"], int(m["size"]), chunks, storage_options, dtype)
            blocks.append(da.from_delayed(d, shape=(rows, width), dtype=out_dtype))
    if not blocks:
        raise ValueError(f"no tensor of {module!r} in the manifests")
    return da.concatenate(blocks, axis=0)


def _numpy_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return np.dtype(np.float32)
    return np.dtype(name)


def module_statistics(manifests: Union[ManifestLike, Sequence[ManifestLike]],
                      modules: Optional[Sequence[str]] = None, quantiles: Sequence[float] = (0.5, 0.9, 0.99),
                      storage_options: Optional[Dict[str, Any]] = None, scheduler: Optional[str] = None) -> Any:
    """Per-module statistics over every capture, computed by Dask in one pass over the bytes.

    Columns: ``rows``, ``width``, ``mean`` and ``std`` (over all values), ``mean_abs``,
    ``max_abs``, ``sparsity`` (share of exact zeros), ``mean_norm`` (mean L2 norm of a
    row) and ``norm_q{q}`` for each quantile ``q`` of the row norms (exact: the norms, one
    number per row, are gathered and ``numpy.quantile`` taken). Sums run in float64.

    Args:
        manifests: as :func:`module_array`.
        modules: default every module with per-token rows (2-D or 3-D tensors).
        quantiles: of the row norms.
        storage_options: fsspec options.
        scheduler: Dask scheduler (``"threads"``, ``"processes"``, ``"sync"``; default
            Dask's, or a ``dask.distributed.Client`` when one is active).

    Returns:
        a ``pandas.DataFrame`` indexed by module.
    """
    import pandas as pd

    dask, da = _dask()
    ms = _manifests(manifests, storage_options)
    if modules is None:
        seen: Dict[str, None] = {}
        for m in ms:
            for c in m["chunks"]:
                if len(c["shape"]) in (2, 3):
                    seen.setdefault(c["module"])
        modules = list(seen)
    work = {}
    for name in modules:
        x = module_array(ms, name, storage_options, dtype=np.float64)
        norms = da.sqrt((x * x).sum(axis=1))
        work[name] = (x.shape, x.sum(), (x * x).sum(), abs(x).sum(), abs(x).max(), (x == 0).sum(), norms)
    got = dask.compute(work, scheduler=scheduler)[0]
    rows = []
    for name in modules:
        shape, s1, s2, sabs, mabs, zeros, norms = got[name]
        n = shape[0] * shape[1]
        mean = s1 / n
        rec = {"module": name, "rows": shape[0], "width": shape[1], "mean": mean,
               "std": float(np.sqrt(max(s2 / n - mean * mean, 0.0))), "mean_abs": sabs / n, "max_abs": mabs,
               "sparsity": zeros / n, "mean_norm": float(norms.mean())}
        for q, v in zip(quantiles, np.quantile(norms, list(quantiles))):
            rec[f"norm_q{q:g}"] = float(v)
        rows.append(rec)
    return pd.DataFrame(rows).set_index("module")


def _packet_frame(stream: str, index: int, storage_options: Optional[Dict[str, Any]]) -> Any:
    from .visualization import build_packet_dataframe, load_stream_packets

    df = build_packet_dataframe(load_stream_packets(stream, storage_options=storage_options))
    df.insert(0, "stream", index)
    df.insert(1, "stream_path", stream)
    return df


def packet_dataframe(streams: Sequence[Union[str, "os.PathLike[str]"]],
                     storage_options: Optional[Dict[str, Any]] = None) -> Any:
    """The packet DataFrame of :func:`~llm_instrumentation.analysis.visualization.build_packet_dataframe`
    for many streams as one ``dask.dataframe`` (one partition per stream, read where the
    partition is computed), with ``stream`` (index into ``streams``) and ``stream_path`` first.

    The first stream is read here to fix the columns (Dask's ``meta``). Object columns
    (``shape``, tuples) stay objects (Dask's conversion to strings is off for this frame).
    """
    dask, _ = _dask()
    import dask.dataframe as dd

    paths = [os.fspath(s) for s in streams]
    if not paths:
        raise ValueError("no streams given")
    first = _packet_frame(paths[0], 0, storage_options)
    parts = [dask.delayed(_packet_frame, pure=True)(p, i, storage_options) for i, p in enumerate(paths)]
    # Dask would turn object columns (``shape``: tuples) into strings; keep them as pandas has them.
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_delayed(parts, meta=first.iloc[:0])
