"""Chunk manifests: where every captured tensor of a stream lies (object, byte range, module,
token range), as a small JSON document beside the stream, so that engines other than this
reader (Dask, Spark, a training job's data loader) can schedule byte-range reads of an
object without opening it first. The format is docs/OBJECT_STORAGE.md, "Chunk manifest"
(``strap-chunk-manifest``, version 1).

A chunk is one TENSOR packet: the smallest unit that can be fetched and decoded alone (a
tensor split into PART packets is several chunks, joined by ``part``).

Command line::

    python -m llm_instrumentation.manifest s3://bucket/run.strap [--endpoint-url URL] [--out PATH|-]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ._source import filesystem, is_url
from .stream import DROP, TENSOR, TOKEN, StreamReader, open_stream

__all__ = ["FORMAT", "VERSION", "build_manifest", "manifest_path", "write_manifest", "load_manifest",
           "read_chunk_rows", "main"]

FORMAT = "strap-chunk-manifest"
VERSION = 1
#: Suffix of the manifest written beside a stream (``run.strap`` → ``run.strap.manifest.json``).
SUFFIX = ".manifest.json"

PathOrURL = Union[str, "os.PathLike[str]"]


def manifest_path(stream: PathOrURL) -> str:
    """Where the manifest of ``stream`` is written by default: beside it, ``+ .manifest.json``."""
    return os.fspath(stream) + SUFFIX


def _token_range(shape: Sequence[int], step: int, meta: Dict[str, Any]) -> Optional[List[int]]:
    """Token indices ``[first, end)`` a per-token tensor covers (docs/ANALYSIS.md 2: the
    forward pass of step ``s`` over ``B × L`` tokens read tokens ``s − B·L … s − 1``)."""
    if len(shape) not in (2, 3):
        return None
    b = shape[0] if len(shape) == 3 else 1
    pos = meta.get("positions")
    length = int(max(pos)) + 1 if isinstance(pos, list) and pos else shape[-2]
    first = step - b * length
    return [first, step] if first >= 0 else None


def build_manifest(stream: PathOrURL, storage_options: Optional[Dict[str, Any]] = None,
                   reader: Optional[StreamReader] = None) -> Dict[str, Any]:
    """The chunk manifest of one stream.

    Reads the stream's index and the headers of its TENSOR and DROP packets (over object
    storage: the index, then the headers in concurrent batches; no payload).

    Args:
        stream: a stream file or object URL (``s3://bucket/key``).
        storage_options: fsspec options for a URL (see :func:`~llm_instrumentation.open_stream`).
        reader: an open reader of ``stream`` to use instead of opening it.

    Returns:
        the manifest (a JSON-ready dict; format in docs/OBJECT_STORAGE.md).

    Raises:
        StreamFormatError: the stream is damaged; ValueError: a 1.3.1 stream (no manifest).

    Example:
        >>> m = build_manifest("s3://caps/run.strap")                   # doctest: +SKIP
        >>> [(c["module"], c["offset"], c["length"]) for c in m["chunks"][:2]]  # doctest: +SKIP
    """
    own = reader is None
    r = open_stream(stream, storage_options) if reader is None else reader
    try:
        if not isinstance(r, StreamReader):
            raise ValueError(f"{os.fspath(stream)}: an llm_instrumentation 1.3.1 stream has no index to list")
        chunks: List[Dict[str, Any]] = []
        modules: Dict[str, Dict[str, Any]] = {}
        drops: Dict[str, int] = {}
        for pk in r.packets(select=lambda n, t: t in (TENSOR, DROP)):
            if pk.type == DROP:
                drops[pk.name] = drops.get(pk.name, 0) + 1
                continue
            if pk.type != TENSOR:
                continue
            length = pk.end - pk.offset
            whole = not pk.is_part or pk.part_offset + pk.raw_len == pk.tensor_len
            chunks.append({
                "module": pk.name, "offset": pk.offset, "length": length, "seq": pk.seq, "step": pk.step,
                "forward": pk.forward, "dtype": pk.dtype, "shape": list(pk.shape), "codec": pk.codec,
                "raw_len": pk.raw_len,
                "part": {"offset": pk.part_offset, "tensor_len": pk.tensor_len} if pk.is_part else None,
                "tokens": _token_range(pk.shape, pk.step, pk.meta)})
            m = modules.setdefault(pk.name, {"dtype": pk.dtype, "width": pk.shape[-1] if pk.shape else None,
                                             "tensors": 0, "rows": 0, "chunks": 0, "stored_bytes": 0,
                                             "raw_bytes": 0})
            m["chunks"] += 1
            m["stored_bytes"] += length
            m["raw_bytes"] += pk.raw_len
            if whole:
                m["tensors"] += 1
                if len(pk.shape) in (2, 3):
                    m["rows"] += int(np.prod(pk.shape[:-1]))
            if m["dtype"] != pk.dtype:
                m["dtype"] = None  # mixed: say so rather than name one
            if m["width"] != (pk.shape[-1] if pk.shape else None):
                m["width"] = None
        tokens = _token_runs(r)
        idx = r.index_offset
        return {
            "format": FORMAT, "version": VERSION, "object": os.fspath(stream), "size": r.size,
            "stream_version": r.version, "metadata": r.metadata,
            "index": {"offset": idx, "length": r.size - idx} if idx is not None else None,
            "truncated_at": r.truncated_at,
            "modules": modules, "drops": drops, "tokens": tokens, "chunks": chunks,
        }
    finally:
        if own:
            r.close()


def _token_runs(r: StreamReader) -> Dict[str, Any]:
    """TOKEN packets as runs of adjacent packets (one fetch each): from the index alone when
    there is one."""
    runs: List[Dict[str, Any]] = []
    count = 0
    if r.indexed:
        items = [(e.offset, e.span, e.step) for e in r.entries() if e.type == TOKEN]
    else:
        items = [(pk.offset, pk.end - pk.offset, pk.step) for pk in r.packets(select=lambda n, t: t == TOKEN)]
    for off, ln, step in items:
        count += 1
        last = runs[-1] if runs else None
        if last is not None and last["offset"] + last["length"] == off and last["end"] == step:
            last["length"] += ln
            last["end"] = step + 1
        else:
            runs.append({"offset": off, "length": ln, "first": step, "end": step + 1})
    return {"count": count, "runs": runs}


def _write_text(path: str, text: str, storage_options: Optional[Dict[str, Any]]) -> None:
    if is_url(path):
        fs, p = filesystem(path, storage_options)
        fs.pipe_file(p, text.encode("utf-8"))
    else:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def write_manifest(stream: PathOrURL, out: Optional[PathOrURL] = None,
                   storage_options: Optional[Dict[str, Any]] = None) -> str:
    """Build the manifest of ``stream`` and write it (default: beside it, see
    :func:`manifest_path`; an object URL is written as an object). Returns where."""
    m = build_manifest(stream, storage_options)
    dest = os.fspath(out) if out is not None else manifest_path(stream)
    _write_text(dest, json.dumps(m, indent=1, sort_keys=False) + "\n", storage_options)
    return dest


def load_manifest(path: PathOrURL, storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Read and check a manifest (a file or object URL; given a stream's path, its default
    manifest beside it).

    Raises:
        ValueError: not a ``strap-chunk-manifest`` of a version this reads.
    """
    p = os.fspath(path)
    if not p.endswith(".json"):
        p = manifest_path(p)
    if is_url(p):
        fs, fp = filesystem(p, storage_options)
        raw = fs.cat_file(fp)
    else:
        with open(p, "rb") as f:
            raw = f.read()
    m = json.loads(raw)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{p}: not a {FORMAT} document")
    if m.get("version") != VERSION:
        raise ValueError(f"{p}: manifest version {m.get('version')}, this reads {VERSION}")
    for key in ("object", "size", "chunks", "modules"):
        if key not in m:
            raise ValueError(f"{p}: manifest has no {key!r}")
    return m


def read_chunk_rows(manifest: Dict[str, Any], chunks: Sequence[Dict[str, Any]],
                    storage_options: Optional[Dict[str, Any]] = None, fs: Any = None) -> np.ndarray:
    """The rows ``[n, width]`` of one tensor of a manifest: its chunks (one, or its PART
    chunks in order) fetched by byte range, CRC-checked, decoded and joined.

    Args:
        manifest: from :func:`build_manifest` / :func:`load_manifest`.
        chunks: the tensor's chunk(s).
        storage_options: fsspec options for the object.
        fs: an fsspec filesystem to use (default: from the object's URL; a local path reads
            the file).

    Returns:
        a numpy array in the captured dtype (bfloat16 and float8 upcast to float32, as
        :meth:`~llm_instrumentation.stream.Tensor.numpy`), shape ``[prod(shape[:-1]), shape[-1]]``.
    """
    from ._tensor import Tensor

    obj = manifest["object"]
    if fs is None and is_url(obj):
        fs, path = filesystem(obj, storage_options)
    else:
        path = obj
    ranges = [(c["offset"], c["offset"] + c["length"]) for c in chunks]
    if fs is not None:
        datas = fs.cat_ranges([path] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges])
    else:
        datas = []
        with open(path, "rb") as f:
            for a, b in ranges:
                f.seek(a)
                datas.append(f.read(b - a))
    packets = []
    for c, (a, b), data in zip(chunks, ranges, datas):
        if isinstance(data, BaseException):
            raise data
        pks = StreamReader._packets_in(data, a, int(manifest["size"]), obj)
        if len(pks) != 1 or pks[0].name != c["module"] or pks[0].seq != c["seq"]:
            raise ValueError(f"{obj}: bytes [{a}, {b}) are not the manifest's chunk {c['module']} seq {c['seq']} "
                             "(the object changed since the manifest was made?)")
        packets.append(pks[0])
    t = Tensor(packets)
    if packets[0].is_part:
        if sum(p.raw_len for p in packets) != t.nbytes:
            raise ValueError(f"{obj}: the parts given do not make tensor {c['module']} seq {packets[0].seq} whole")
    x = t.numpy()
    return x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m llm_instrumentation.manifest STREAM... [--out PATH|-] [--endpoint-url URL]``"""
    ap = argparse.ArgumentParser(prog="python -m llm_instrumentation.manifest",
                                 description="Write the chunk manifest (docs/OBJECT_STORAGE.md) of strap streams, "
                                             "files or object URLs, beside each (STREAM.manifest.json).")
    ap.add_argument("streams", nargs="+")
    ap.add_argument("--out", default=None, help="where to write (one stream only); '-' prints it")
    ap.add_argument("--endpoint-url", default=None,
                    help="S3 endpoint of a server other than AWS (default: $AWS_ENDPOINT_URL or AWS)")
    a = ap.parse_args(argv)
    if a.out is not None and len(a.streams) > 1:
        ap.error("--out takes one stream")
    so = {"endpoint_url": a.endpoint_url} if a.endpoint_url else None
    status = 0
    for s in a.streams:
        try:
            opts = so if is_url(s) else None
            if a.out == "-":
                print(json.dumps(build_manifest(s, opts), indent=1))
                continue
            dest = write_manifest(s, a.out, opts)
            m = load_manifest(dest, opts)
            print(f"{s}: {len(m['chunks'])} chunks of {len(m['modules'])} module(s), "
                  f"{m['tokens']['count']} tokens → {dest}")
        except (ValueError, OSError, ImportError) as e:
            print(f"manifest: {s}: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
