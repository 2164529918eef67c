"""A real S3 server for the object-storage tests: VersityGW (posix backend: a bucket is a
directory of a temp dir, an object a file), started once per test session.

The binary comes from ``$STRAP_VERSITYGW`` (what ``make test-python`` passes), ``$VERSITYGW``
or the cache path where ``make versitygw`` builds it
(``~/.cache/strap-llm/versitygw-1.8.0/versitygw``); without it the tests that need it skip,
saying so. Buckets are made and objects uploaded with boto3 (s3fs's mkdir sends a location
constraint that some servers refuse)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

ACCESS, SECRET = "strapkey", "strapsecret12345"
DEFAULT_BIN = Path.home() / ".cache" / "strap-llm" / "versitygw-1.8.0" / "versitygw"


def versitygw_bin(build: bool = False) -> Path:
    """The binary; with ``build``, ``make versitygw`` makes it where it is missing (a skip,
    saying why, where that fails)."""
    p = Path(os.environ.get("STRAP_VERSITYGW") or os.environ.get("VERSITYGW") or DEFAULT_BIN)
    if build and not p.exists():
        repo = Path(__file__).resolve().parents[3]
        r = subprocess.run(["make", "-C", str(repo), "--no-print-directory", "versitygw", f"VERSITYGW={p}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"VersityGW could not be built (make versitygw): {r.stderr[-500:]}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """One running VersityGW: ``endpoint``, ``storage_options`` (s3fs), ``env`` (the AWS
    variables a child process reads), ``client()`` (boto3)."""

    def __init__(self, binary: Path, root: "os.PathLike[str] | None" = None) -> None:
        self.binary = binary
        self.own_root = root is None
        self.root = tempfile.mkdtemp(prefix="vgw") if root is None else os.fspath(root)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(self.root, "versitygw.log"), "wb")
        self.data = os.path.join(self.root, "data")
        os.mkdir(self.data)
        self.start()
        self.storage_options: Dict[str, Any] = {"endpoint_url": self.endpoint, "key": ACCESS, "secret": SECRET}
        self.env = {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self) -> None:
        """(Re)start the server on its port and data directory; returns once it listens."""
        self.proc = subprocess.Popen([str(self.binary), "--access", ACCESS, "--secret", SECRET, "--port",
                                      f"127.0.0.1:{self.port}", "--quiet", "posix", self.data],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"versitygw exited {self.proc.returncode}: see {self.log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("versitygw did not listen within 30 s")
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server (its objects stay in the data directory; :meth:`start` again)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self, secret: str = SECRET) -> Any:
        """A boto3 client (``secret``: another secret key, for refused credentials)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS,
                            aws_secret_access_key=secret, region_name="us-east-1")

    def get(self, bucket: str, key: str) -> bytes:
        """An object's bytes, read with boto3."""
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def bucket(self, name: str) -> str:
        """Make bucket ``name`` (if new); returns it."""
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def upload(self, path: os.PathLike, bucket: str, key: str) -> str:
        """Upload a local file with boto3; returns its ``s3://`` URL."""
        self.bucket(bucket)
        self.client().upload_file(os.fspath(path), bucket, key)
        return f"s3://{bucket}/{key}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """A VersityGW server for the session (skips, naming ``make versitygw``, without one)."""
    pytest.importorskip("s3fs", reason="s3fs not installed: pip install 'strap-llm[s3]'")
    pytest.importorskip("boto3", reason="boto3 not installed (the tests upload with it)")
    b = versitygw_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"versitygw not built at {b} (make versitygw, or set VERSITYGW)")
    srv = S3Server(b)
    yield srv
    srv.stop()
