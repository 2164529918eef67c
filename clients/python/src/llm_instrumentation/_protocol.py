"""Control-socket messages of docs/PROTOCOL.md section 1, and the client end of the socket.

A message is one SOCK_SEQPACKET datagram: ``"STRP" u16 version u16 type u32 body_len`` then a
JSON object. Bodies are encoded compactly (``separators=(",", ":")``, keys in insertion
order) so that golden byte vectors are stable.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from .errors import StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError

MAGIC = b"STRP"
VERSION = 1
HEADER = struct.Struct("<4sHHI")
MAX_MESSAGE = 65536

HELLO = 1
WELCOME = 2
OPEN = 3
OPENED = 4
PUBLISH = 5
RELEASE = 6
DROP = 7
CLOSE = 8
CLOSED = 9
ERROR = 10
STATUS = 11
STATUS_REPLY = 12
TOKEN = 13
CHECKPOINT = 14
CHECKPOINTED = 15

NAMES = {
    HELLO: "HELLO", WELCOME: "WELCOME", OPEN: "OPEN", OPENED: "OPENED", PUBLISH: "PUBLISH",
    RELEASE: "RELEASE", DROP: "DROP", CLOSE: "CLOSE", CLOSED: "CLOSED", ERROR: "ERROR",
    STATUS: "STATUS", STATUS_REPLY: "STATUS_REPLY", TOKEN: "TOKEN", CHECKPOINT: "CHECKPOINT",
    CHECKPOINTED: "CHECKPOINTED",
}


def encode_message(msg_type: int, body: Optional[Dict[str, Any]] = None, version: int = VERSION) -> bytes:
    """Encode one message.

    Args:
        msg_type: the type number (``HELLO`` ... ``TOKEN``).
        body: the JSON object (``{}`` when None).
        version: header version (tests use other values to check the version error).

    Returns:
        the datagram bytes.

    Example:
        >>> encode_message(STATUS)
        b'STRP\\x01\\x00\\x0b\\x00\\x02\\x00\\x00\\x00{}'
    """
    raw = json.dumps(body if body is not None else {}, separators=(",", ":"), ensure_ascii=False).encode()
    if HEADER.size + len(raw) > MAX_MESSAGE:
        raise ValueError(f"{NAMES.get(msg_type, msg_type)} message of {HEADER.size + len(raw)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(MAGIC, version, msg_type, len(raw)) + raw


def decode_message(data: bytes) -> Tuple[int, int, Dict[str, Any]]:
    """Decode one datagram into ``(version, type, body)``.

    Any version is accepted here (the layout never changes) so that a version-mismatch
    ERROR can be read; callers check the version.

    Raises:
        StrapdProtocolError: short datagram, bad magic, wrong length, body not a JSON object.
    """
    if len(data) < HEADER.size:
        raise StrapdProtocolError(f"message of {len(data)} bytes is shorter than the 12-byte header")
    magic, version, mtype, blen = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise StrapdProtocolError(f"bad message magic {magic!r}")
    if len(data) != HEADER.size + blen:
        raise StrapdProtocolError(f"message length {len(data)} != 12 + body_len {blen}")
    try:
        body = json.loads(bytes(data[HEADER.size:]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StrapdProtocolError(f"message body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise StrapdProtocolError("message body is not a JSON object")
    return version, mtype, body


def error_from_body(body: Dict[str, Any]) -> StrapdProtocolError:
    """Turn an ERROR body into the exception raised to the user."""
    code = str(body.get("code", "unknown"))
    return StrapdProtocolError(
        f"strapd error {code}: {body.get('message', '')}", code=code, fatal=bool(body.get("fatal", True))
    )


class Connection:
    """One client connection to strapd (blocking sends; receives with explicit timeouts).

    Every socket failure (EOF, EPIPE, ECONNRESET) becomes :class:`StrapdConnectionError`.
    """

    def __init__(self, sock: socket.socket, path: str = "") -> None:
        self.sock = sock
        self.path = path
        self.closed = False

    @classmethod
    def connect(cls, path: str, timeout: float = 5.0) -> "Connection":
        """Connect to the daemon socket at ``path`` (raises OSError when nobody answers)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.settimeout(timeout)
            s.connect(path)
            s.settimeout(None)
        except BaseException:
            s.close()
            raise
        return cls(s, path)

    def _dead(self, what: str, err: Optional[BaseException] = None) -> Exception:
        """The exception for a broken connection: the daemon's last ERROR when it sent one
        before closing (it usually does), else StrapdConnectionError."""
        self.closed = True
        last = self._salvage_error()
        if last is not None:
            return last
        detail = f": {err}" if err else ""
        return StrapdConnectionError(f"strapd connection {self.path or ''} {what}{detail}")

    def _salvage_error(self) -> Optional[StrapdProtocolError]:
        # A peer that closes with our messages unread makes the next recv fail with
        # ECONNRESET once (the socket error is cleared by reading it); messages it sent
        # before closing are still queued behind that.
        found = None
        for _ in range(256):
            try:
                data = self.sock.recv(MAX_MESSAGE + 1, socket.MSG_DONTWAIT)
            except ConnectionResetError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                _, mtype, body = decode_message(data)
            except StrapdProtocolError:
                break
            if mtype == ERROR:
                found = error_from_body(body)
        return found

    def send(self, msg_type: int, body: Optional[Dict[str, Any]] = None, fds: Sequence[int] = ()) -> None:
        """Send one message (with ``fds`` as SCM_RIGHTS when given)."""
        data = encode_message(msg_type, body)
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds), socket.MSG_NOSIGNAL)
            else:
                self.sock.sendmsg([data], [], socket.MSG_NOSIGNAL)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._dead("closed by the daemon", e) from None
        except OSError as e:
            raise self._dead(f"failed sending {NAMES.get(msg_type, msg_type)}", e) from None

    def recv(self, timeout: Optional[float]) -> Optional[Tuple[int, Dict[str, Any]]]:
        """Receive one message, waiting at most ``timeout`` seconds (None = forever, 0 = poll).

        Returns:
            ``(type, body)``, or None when nothing arrived in time.

        Raises:
            StrapdConnectionError: EOF or a socket error.
            StrapdProtocolError: a malformed message or a version other than 1.
        """
        if timeout is not None:
            r, _, _ = select.select([self.sock], [], [], max(timeout, 0.0))
            if not r:
                return None
        try:
            data = self.sock.recv(MAX_MESSAGE + 1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except ConnectionResetError as e:
            raise self._dead("reset by the daemon", e) from None
        except OSError as e:
            raise self._dead("failed", e) from None
        if not data:
            raise self._dead("closed by the daemon (EOF)")
        version, mtype, body = decode_message(data)
        if version != VERSION:
            if mtype == ERROR:
                raise error_from_body(body)
            raise StrapdProtocolError(f"daemon speaks protocol {version}, client speaks {VERSION}", code="protocol_version")
        return mtype, body

    def expect(self, want: int, timeout: float, skip: Sequence[int] = ()) -> Dict[str, Any]:
        """Wait for a message of type ``want``; ERROR raises; types in ``skip`` are ignored.

        Raises:
            StrapdTimeoutError: nothing suitable within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StrapdTimeoutError(f"strapd did not answer {NAMES[want]} within {timeout:.0f}s")
            got = self.recv(left)
            if got is None:
                continue
            mtype, body = got
            if mtype == want:
                return body
            if mtype == ERROR:
                raise error_from_body(body)
            if mtype not in skip:
                raise StrapdProtocolError(f"expected {NAMES[want]}, got {NAMES.get(mtype, mtype)}")

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def hello_body(client: str, pid: int) -> Dict[str, Any]:
    """The HELLO body."""
    return {"protocol": VERSION, "client": client, "pid": pid}


def handshake(conn: Connection, client: str, pid: int, timeout: float = 10.0) -> Dict[str, Any]:
    """Send HELLO and return the WELCOME body (checks the daemon's protocol number)."""
    conn.send(HELLO, hello_body(client, pid))
    body = conn.expect(WELCOME, timeout)
    if body.get("protocol") != VERSION:
        raise StrapdProtocolError(f"daemon speaks protocol {body.get('protocol')}, client speaks {VERSION}", code="protocol_version")
    return body


def status(path: str, timeout: float = 5.0) -> Dict[str, Any]:
    """Ask the daemon at ``path`` for its STATUS_REPLY body."""
    import os

    from . import __version__

    conn = Connection.connect(path, timeout)
    try:
        handshake(conn, f"llm_instrumentation/{__version__}", os.getpid(), timeout)
        conn.send(STATUS, {})
        return conn.expect(STATUS_REPLY, timeout)
    finally:
        conn.close()


