"""An HTTP proxy in front of the test S3 server: it forwards every request as it came (the
Host header kept, so SigV4 signatures still verify), records each request's method, path,
query and headers, can withhold the server's answer to a CompleteMultipartUpload after
the server completed the object (the window in which a killed strapd has the object
complete on the server and not in its own state), and can add a server-side encryption
confirmation to the answers of object writes."""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit


class Request:
    """One request the proxy forwarded."""

    def __init__(self, method: str, path: str, headers: Dict[str, str], status: int) -> None:
        self.method = method
        u = urlsplit(path)
        self.path = u.path
        self.query = parse_qs(u.query, keep_blank_values=True)
        self.headers = headers
        self.status = status

    @property
    def kind(self) -> str:
        """The S3 operation, for the ones the tests count."""
        q = self.query
        if self.method == "PUT" and "partNumber" in q:
            return "UploadPartCopy" if "x-amz-copy-source" in self.headers else "UploadPart"
        if self.method == "POST" and "uploads" in q:
            return "CreateMultipartUpload"
        if self.method == "POST" and "uploadId" in q:
            return "CompleteMultipartUpload"
        if self.method == "PUT":
            return "CopyObject" if "x-amz-copy-source" in self.headers else "PutObject"
        return self.method

    def __repr__(self) -> str:
        return f"{self.kind} {self.path} -> {self.status}"


class S3Proxy:
    """``endpoint`` is the proxy's URL; ``requests`` what went through it."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.requests: List[Request] = []
        self.lock = threading.Lock()
        self.hold_complete = threading.Event()  # set: withhold CompleteMultipartUpload answers
        self.held = threading.Event()  # set once one answer is withheld
        self.release = threading.Event()  # set: the withheld connections are closed unanswered
        # An x-amz-server-side-encryption answer added to object writes (a server that
        # implements SSE: VersityGW takes the request headers and ignores them).
        self.confirm_sse: Optional[str] = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding"):
                    raise RuntimeError("chunked request bodies are not forwarded by this proxy")
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items()}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                req = Request(self.command, self.path, {k.lower(): v for k, v in headers.items()}, resp.status)
                with proxy.lock:
                    proxy.requests.append(req)
                if req.kind == "CompleteMultipartUpload" and proxy.hold_complete.is_set():
                    # The server completed the object; its answer never reaches the client.
                    proxy.held.set()
                    proxy.release.wait()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                if proxy.confirm_sse and resp.status == 200 and req.kind in ("CreateMultipartUpload", "PutObject"):
                    self.send_header("x-amz-server-side-encryption", proxy.confirm_sse)
                # A HEAD's Content-Length is the object's size, not the (empty) body's.
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, kind: str, path: Optional[str] = None) -> int:
        """How many requests of an operation (for one object's path) went through."""
        with self.lock:
            return sum(1 for r in self.requests if r.kind == kind and (path is None or r.path == path))

    def of(self, kind: str) -> List[Request]:
        with self.lock:
            return [r for r in self.requests if r.kind == kind]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
