"""Where a stream reader's bytes come from: a local file (memory-mapped, zero copy) or an
object in storage (``s3://bucket/key`` through botocore, other protocols through fsspec:
byte-range GETs).

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

    def __init__(self, path: str) -> None:
        self.name = path
        self._f = open(path, "rb")
        use = self._f.fileno()
        self._mm: Optional[mmap.mmap] = None
        self.view: memoryview = memoryview(b"")
        for _ in range(3):
            self.size = os.fstat(use).st_size
            if not self.size:
                break
            try:
                self._mm = mmap.mmap(use, self.size, access=mmap.ACCESS_READ)
                break
            except ValueError:
                # The file shrank between fstat and mmap (a resume cutting a stream back to its
                # checkpoint, under the stream lock): map what is there now.
                continue
        else:
            self._f.close()
            raise OSError(f"{path}: the file keeps shrinking while it is opened (a capture resuming into it?)")
        if self._mm is not None:
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
        self._f.close()


#: s3fs ``storage_options`` keys the direct S3 reader understands; any other key (or another
#: protocol) reads through fsspec instead.
_S3_OPTION_KEYS = {"endpoint_url", "key", "secret", "token", "anon", "client_kwargs", "config_kwargs", "profile",
                   "skip_instance_cache", "use_listings_cache", "default_block_size", "default_cache_type"}


class _S3Objects:
    """Ranged GETs of one S3 object straight through botocore (boto3's client).

    The reader's hot path is "these N MiB, please"; s3fs answers it through aiobotocore and
    aiohttp, whose Python body reads held the GIL for most of 1.1 CPU-s per GB fetched
    (2.0 through ``cat_ranges``) here, while botocore's synchronous client reads the body with
    blocking ``recv_into`` calls that release it: 0.5 CPU-s per GB, and the fetching threads
    run beside the decoding thread (docs/OBJECT_STORAGE.md, "Performance of reading").
    Credentials and endpoint are the same: s3fs's ``storage_options`` keys are translated, and
    without them botocore reads the AWS environment variables and shared files as s3fs does.
    """

    def __init__(self, bucket: str, key: str, options: Dict[str, Any]) -> None:
        self.bucket, self.key = bucket, key
        self.client = _s3_client(options)
        self._errors = (self.client.exceptions.ClientError,)

    def size(self) -> int:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self.key)["ContentLength"])
        except self._errors as err:
            if str(err.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(f"s3://{self.bucket}/{self.key}: no such object") from None
            raise

    def get(self, off: int, end: int) -> bytes:
        r = self.client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={off}-{end - 1}")
        return r["Body"].read()


_clients: Dict[Tuple[int, str], Any] = {}


def _s3_client(options: Dict[str, Any]) -> Any:
    """One botocore S3 client per process, set of options and AWS environment: making one
    loads the service's model (≈ 100 ms), and a client is safe to share between threads."""
    import json

    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    k = (os.getpid(), json.dumps([options, env], sort_keys=True, default=repr))
    with _pool_lock:
        c = _clients.get(k)
    if c is None:
        c = _make_s3_client(options)
        with _pool_lock:
            c = _clients.setdefault(k, c)
    return c


def _make_s3_client(options: Dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    client_kwargs = dict(options.get("client_kwargs") or {})
    config_kwargs = dict(options.get("config_kwargs") or {})
    config_kwargs.setdefault("max_pool_connections", _FETCH_THREADS)
    if options.get("anon"):
        from botocore import UNSIGNED
        config_kwargs["signature_version"] = UNSIGNED
    session = boto3.session.Session(profile_name=options.get("profile"))
    kw: Dict[str, Any] = {"config": Config(**config_kwargs)}
    for ours, theirs in (("endpoint_url", "endpoint_url"), ("key", "aws_access_key_id"),
                         ("secret", "aws_secret_access_key"), ("token", "aws_session_token")):
        if options.get(ours) is not None:
            kw[theirs] = options[ours]
    kw.update(client_kwargs)
    return session.client("s3", **kw)


#: Ranged GETs of one read_many run at once (threads: their socket reads release the GIL).
_FETCH_THREADS = 8
_pool: Optional[Any] = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _fetch_pool() -> Any:
    """The process's thread pool for ranged GETs (made again in a forked child)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor
            _pool, _pool_pid = ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="strap-s3"), os.getpid()
        return _pool


class RemoteSource(ByteSource):
    """An object in storage, read by byte range.

    ``s3://`` objects are read with botocore's client directly (:class:`_S3Objects`) when boto3
    is installed and the ``storage_options`` are s3fs's usual keys; anything else through
    fsspec. One window of read-ahead serves the reader's small reads (headers of packets whose
    length it does not know yet); everything else is one exact ranged GET per range, several
    at once. Safe to use from several threads and after a fork (the client is re-made in a
    child process).
    """

    remote = True
    #: False: ``s3://`` through fsspec (s3fs) too — the path before botocore was used
    #: directly, kept for comparison (``object_storage_bench.py``'s ``s3_fsspec`` row).
    direct_s3 = True

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None) -> None:
        self.name = url
        self.url = url
        self.storage_options = dict(storage_options or {})
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._win_off = 0
        self._win: bytes = b""
        self.bytes_fetched = 0
        self.requests = 0
        self._connect(False)
        try:
            self.size = self._s3.size() if self._s3 is not None else int(self._fs.size(self._path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such object") from None
        except OSError:
            raise
        except Exception as err:  # botocore's credential, connection and protocol errors
            raise ConnectionError(f"{url}: {err}") from err

    def _connect(self, child: bool) -> None:
        """The client (direct S3) or the filesystem (fsspec) this source reads through."""
        self._s3: Optional[_S3Objects] = None
        self._fs: Any = None
        proto, _, rest = self.url.partition("://")
        bucket, _, key = rest.partition("/")
        direct = self.direct_s3 and proto.lower() in ("s3", "s3a") and bucket and key \
            and set(self.storage_options) <= _S3_OPTION_KEYS
        if direct:
            try:
                self._s3 = _S3Objects(bucket, key, self.storage_options)
                return
            except ImportError:
                pass  # no boto3 (s3fs brings aiobotocore, not boto3): fsspec reads it
        opts = dict(self.storage_options, skip_instance_cache=True) if child else self.storage_options
        self._fs, self._path = filesystem(self.url, opts)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            # A forked child (DataLoader worker): an async filesystem's event loop thread and a
            # client's pooled connections did not survive the fork; make fresh ones here.
            self._connect(True)
            self._pid = os.getpid()

    def _get(self, off: int, end: int) -> bytes:
        try:
            if self._s3 is not None:
                data = self._s3.get(off, end)
            else:
                data = self._fs.cat_file(self._path, start=off, end=end)
        except OSError:
            raise
        except Exception as err:  # botocore's connection and protocol errors are not OSErrors
            raise ConnectionError(f"{self.name}: reading bytes [{off}, {end}): {err}") from err
        if len(data) != end - off:
            raise StreamFormatError(f"{self.name}: asked for bytes [{off}, {end}), got {len(data)} "
                                    "(the object changed while it was read?)", off)
        return data

    def _fetch(self, off: int, n: int) -> bytes:
        end = min(off + n, self.size)
        if end <= off:
            return b""
        self._check_process()
        data = self._get(off, end)
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
        self._check_process()
        out: List[Buffer]
        if self._s3 is not None:
            out = list(_fetch_pool().map(lambda r: self._get(*r) if r[1] > r[0] else b"", todo))
        else:
            try:
                got = self._fs.cat_ranges([self._path] * len(todo), [o for o, _ in todo], [e for _, e in todo],
                                          on_error="raise")
            except OSError:
                raise
            except Exception as err:  # botocore's connection and protocol errors are not OSErrors
                raise ConnectionError(f"{self.name}: reading {len(todo)} byte ranges: {err}") from err
            out = []
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


def open_source(path: Union[str, "os.PathLike[str]"], storage_options: Optional[Dict[str, Any]] = None) -> ByteSource:
    """A :class:`RemoteSource` for a URL, else a :class:`FileSource`."""
    if is_url(path):
        return RemoteSource(str(path), storage_options)
    if storage_options:
        raise ValueError(f"storage_options given for a local path {os.fspath(path)!r}")
    return FileSource(os.fspath(path))
