"""Where a stream reader's bytes come from: a local file (memory-mapped, zero copy) or an
object in storage reached through fsspec (``s3://bucket/key``: byte-range GETs).

One reader (``stream.py``) parses both; a source only answers "these bytes, please". A
remote source fetches exactly the ranges asked for (a small read-ahead only where the
reader does not know how long a packet is), so reading one module of a capture fetches that
module's packets and the index, not the object (docs/OBJECT_STORAGE.md).
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .errors import StreamFormatError

__all__ = ["ByteSource", "FileSource", "RemoteSource", "is_url", "open_source", "filesystem"]

Buffer = Union[bytes, memoryview]


def is_url(path: Any) -> bool:
    """Whether ``path`` names an object through a protocol (``s3://...``), not a local file."""
    if not isinstance(path, str):
        return False
    head, sep, _ = path.partition("://")
    return bool(sep) and head.isidentifier() and head.lower() != "file"


def filesystem(url: str, storage_options: Optional[Dict[str, Any]] = None) -> Tuple[Any, str]:
    """The fsspec filesystem and the path inside it for ``url``.

    Credentials and endpoint come the standard way: the AWS environment variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``...) and shared
    config files through botocore, or ``storage_options`` (``{"endpoint_url": ..., "key":
    ..., "secret": ...}`` for s3fs).

    Raises:
        ImportError: fsspec or the protocol's implementation (s3fs) is not installed; the
            message names the extra to install.
    """
    proto = url.partition("://")[0].lower()
    extra = "s3" if proto in ("s3", "s3a") else None
    try:
        import fsspec
    except ModuleNotFoundError:
        raise ImportError(f"reading {proto}:// needs fsspec: pip install 'strap-llm[{extra or 's3'}]'") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        hint = f"pip install 'strap-llm[{extra}]'" if extra else "install the fsspec implementation of that protocol"
        raise ImportError(f"reading {proto}:// needs {e.name or 'its fsspec implementation'}: {hint}") from None
    return fs, path


class ByteSource:
    """The bytes of one stream: ``size`` and ``read(offset, n)``.

    Attributes:
        name: the path or URL (for error messages).
        size: total bytes.
        remote: True when each read is a network request (the reader then batches and
            defers work, see ``stream.py``).
        bytes_fetched, requests: what a remote source has fetched so far (0 for a file).
    """

    name: str
    size: int
    remote = False
    bytes_fetched = 0
    requests = 0

    def read(self, off: int, n: int, ahead: int = 0) -> Buffer:
        """Bytes ``[off, off+n)`` (clipped to the end). ``ahead``: a remote source may fetch
        that many more bytes in the same request and serve the next reads from them."""
        raise NotImplementedError

    def read_many(self, ranges: Sequence[Tuple[int, int]]) -> List[Buffer]:
        """Several ``(offset, n)`` ranges at once (a remote source fetches them concurrently)."""
        return [self.read(o, n) for o, n in ranges]

    def close(self) -> None:
        """Release what the source holds."""


class FileSource(ByteSource):
    """A local file, memory-mapped: reads are views of the mapping (no copy)."""

    def __init__(self, path: str, fd: Optional[int] = None) -> None:
        self.name = path
        self._f = open(path, "rb") if fd is None else None
        self.size = os.fstat(self._f.fileno() if self._f is not None else fd).st_size  # type: ignore[arg-type]
        self._mm: Optional[mmap.mmap] = None
        self.view: memoryview = memoryview(b"")
        if self.size:
            # mmap keeps its own duplicate of the descriptor, so a caller's fd stays the caller's.
            self._mm = mmap.mmap(self._f.fileno() if self._f is not None else fd,  # type: ignore[arg-type]
                                 self.size, access=mmap.ACCESS_READ)
            self.view = memoryview(self._mm)

    def read(self, off: int, n: int, ahead: int = 0) -> Buffer:
        return self.view[off:off + n]

    def close(self) -> None:
        try:
            self.view.release()
        except BufferError:
            pass
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a packet view still exported: the mapping goes with its last view
        if self._f is not None:
            self._f.close()


class RemoteSource(ByteSource):
    """An object reached through fsspec, read by byte range.

    One window of read-ahead serves the reader's small reads (headers of packets whose length
    it does not know yet); everything else is one exact ranged GET per request, several at
    once through the filesystem's ``cat_ranges``. Safe to use from several threads and
    after a fork (the filesystem is re-made in a child process).
    """

    remote = True

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None) -> None:
        self.name = url
        self.url = url
        self.storage_options = dict(storage_options or {})
        self._pid = os.getpid()
        self._fs, self._path = filesystem(url, self.storage_options)
        self._lock = threading.Lock()
        self._win_off = 0
        self._win: bytes = b""
        self.bytes_fetched = 0
        self.requests = 0
        try:
            self.size = int(self._fs.size(self._path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such object") from None

    def _filesystem(self) -> Any:
        if os.getpid() != self._pid:
            # A forked child (DataLoader worker): an async filesystem's event loop thread did
            # not survive the fork; make a fresh instance for this process.
            self._fs, self._path = filesystem(self.url, dict(self.storage_options, skip_instance_cache=True))
            self._pid = os.getpid()
        return self._fs

    def _fetch(self, off: int, n: int) -> bytes:
        end = min(off + n, self.size)
        if end <= off:
            return b""
        try:
            data = self._filesystem().cat_file(self._path, start=off, end=end)
        except OSError:
            raise
        except Exception as err:  # botocore's connection and protocol errors are not OSErrors
            raise ConnectionError(f"{self.name}: reading bytes [{off}, {end}): {err}") from err
        if len(data) != end - off:
            raise StreamFormatError(f"{self.name}: asked for bytes [{off}, {end}), got {len(data)} "
                                    "(the object changed while it was read?)", off)
        with self._lock:
            self.bytes_fetched += len(data)
            self.requests += 1
        return data

    def read(self, off: int, n: int, ahead: int = 0) -> Buffer:
        with self._lock:
            w_off, win = self._win_off, self._win
        if w_off <= off and off + n <= w_off + len(win):
            return memoryview(win)[off - w_off:off - w_off + n]
        data = self._fetch(off, n + ahead)
        if ahead:
            with self._lock:
                self._win_off, self._win = off, data
            return memoryview(data)[:n]
        return data

    def read_many(self, ranges: Sequence[Tuple[int, int]]) -> List[Buffer]:
        todo = [(o, min(o + n, self.size)) for o, n in ranges]
        if len(todo) <= 1:
            return [self._fetch(o, e - o) for o, e in todo]
        fs = self._filesystem()
        try:
            got = fs.cat_ranges([self._path] * len(todo), [o for o, _ in todo], [e for _, e in todo],
                                on_error="raise")
        except OSError:
            raise
        except Exception as err:  # botocore's connection and protocol errors are not OSErrors
            raise ConnectionError(f"{self.name}: reading {len(todo)} byte ranges: {err}") from err
        out: List[Buffer] = []
        for (o, e), data in zip(todo, got):
            if isinstance(data, BaseException):
                raise data
            if len(data) != e - o:
                raise StreamFormatError(f"{self.name}: asked for bytes [{o}, {e}), got {len(data)} "
                                        "(the object changed while it was read?)", o)
            out.append(data)
        with self._lock:
            self.bytes_fetched += sum(len(d) for d in out)
            self.requests += len(out)
        return out

    def close(self) -> None:
        self._win = b""


def open_source(path: Union[str, "os.PathLike[str]"], storage_options: Optional[Dict[str, Any]] = None,
                fd: Optional[int] = None) -> ByteSource:
    """A :class:`RemoteSource` for a URL, else a :class:`FileSource`."""
    if fd is None and is_url(path):
        return RemoteSource(str(path), storage_options)
    if storage_options:
        raise ValueError(f"storage_options given for a local path {os.fspath(path)!r}")
    return FileSource(os.fspath(path), fd)
