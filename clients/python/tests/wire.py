"""The tests' typed view of the control messages of docs/PROTOCOL.md section 1: what their
peers (strapfake, socketpair daemons) decode and answer with, and a client end of the socket
for tests that speak to strapd by hand. The client itself sends and receives every message
through libstrap (``_speedups.Session``); this module is the tests' only.

A message is one SOCK_SEQPACKET datagram: ``"STRP" u16 version u16 type u32 body_len`` then a
JSON object. The bytes are libstrap's: every body the client sends is encoded, and every reply
the daemon sends is decoded, by ``clients/c/common/strap_wire.c``, compiled into the
``_speedups`` extension (``_speedups_wire.c``) as libstrap compiles it, and fuzzed there
(``clients/c/fuzz``). This module keeps the typed bodies (frozen dataclasses named and ordered
as internal/control/bodies.go, a field that is None left out), the socket with its
descriptors, the handshake and the exceptions. A reply's unknown fields are ignored, as
PROTOCOL.md 1.1 asks of readers, so a newer daemon can add fields; a malformed reply raises
:class:`StrapdProtocolError`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from llm_instrumentation import _speedups
from llm_instrumentation.errors import StrapdConnectionError, StrapdProtocolError, StrapdTimeoutError, StrapdWriteError

#: libstrap's control messages and their datagrams, compiled into the extension (_speedups_wire.c,
#: _speedups_channel.c); no stub: Any.
_c: Any = _speedups

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
RESOURCES = 16

NAMES = {
    HELLO: "HELLO", WELCOME: "WELCOME", OPEN: "OPEN", OPENED: "OPENED", PUBLISH: "PUBLISH",
    RELEASE: "RELEASE", DROP: "DROP", CLOSE: "CLOSE", CLOSED: "CLOSED", ERROR: "ERROR",
    STATUS: "STATUS", STATUS_REPLY: "STATUS_REPLY", TOKEN: "TOKEN", CHECKPOINT: "CHECKPOINT",
    CHECKPOINTED: "CHECKPOINTED", RESOURCES: "RESOURCES",
}

B = TypeVar("B", bound="Body")


# ----- bodies ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Body:
    """Base of every message body (and of the objects nested in one).

    Subclasses that are whole messages set ``TYPE`` to their type number.
    """

    TYPE: ClassVar[int] = 0
    #: fields holding a nested body, by name (read back by :meth:`from_body`)
    NESTED: ClassVar[Dict[str, Type["Body"]]] = {}

    def to_body(self) -> Dict[str, Any]:
        """The JSON object, fields in declaration order, None fields left out.

        Returns:
            a dict ready for ``json.dumps``.
        """
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v.to_body() if isinstance(v, Body) else v
        return out

    def wire(self) -> bytes:
        """The datagram: libstrap's encoder for a body the client sends; one only the daemon
        sends (which tests and fakes write) from :meth:`to_body`.

        Returns:
            the datagram bytes.

        Raises:
            ValueError: the message exceeds ``MAX_MESSAGE`` bytes.
        """
        enc = _WIRE.get(type(self))
        return enc(self) if enc is not None else encode_message(self.TYPE, self.to_body())

    @classmethod
    def from_body(cls: Type[B], body: Dict[str, Any]) -> B:
        """Build a body from a decoded JSON object. A reply is checked by libstrap's decoder
        (field types included); a body the client sends, which only tests and fakes read back,
        is checked for its required fields.

        Args:
            body: the decoded JSON object.

        Returns:
            the dataclass.

        Raises:
            StrapdProtocolError: a required field is missing or has the wrong type.
        """
        what = NAMES.get(cls.TYPE, cls.__name__)
        if not isinstance(body, dict):
            raise StrapdProtocolError(f"{what} body is not a JSON object: {body!r}")
        if cls.TYPE in REPLIES:
            return decode_reply(encode_message(cls.TYPE, body))[1]  # type: ignore[return-value]
        kw: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in body:
                v, nested = body[f.name], cls.NESTED.get(f.name)
                kw[f.name] = nested.from_body(v) if nested is not None and v is not None else v
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise StrapdProtocolError(f"{what} without field {f.name!r}: {body}")
        return cls(**kw)


@dataclass(frozen=True, kw_only=True)
class Hello(Body):
    """HELLO: opens a connection (client to daemon)."""

    TYPE: ClassVar[int] = HELLO
    protocol: int
    client: str
    pid: int


@dataclass(frozen=True, kw_only=True)
class Welcome(Body):
    """WELCOME: the daemon's answer to HELLO."""

    TYPE: ClassVar[int] = WELCOME
    protocol: int
    daemon: str
    pid: int
    max_message: int
    #: The largest ring OPEN may ask for (``strapd serve --max-ring-size``); None from a
    #: daemon that does not say.
    max_ring_size: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class Lossy(Body):
    """The error bound of a lossy codec as OPEN carries it (docs/COMPRESSION.md 7)."""

    mode: str
    value: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class Resume(Body):
    """What a checkpointed stream prefix ends with (the CHECKPOINTED that wrote it)."""

    last_seq: int
    last_crc: int
    packets: int


@dataclass(frozen=True, kw_only=True)
class Open(Body):
    """OPEN: asks for a session; sent with the ring memfd, the output fd (and the trace fd).

    ``memory_hint`` is advisory (PROTOCOL.md 1.3); ``append_at`` and ``resume`` go together.
    """

    TYPE: ClassVar[int] = OPEN
    ring_size: int
    codec: str
    codec_level: Optional[int] = None
    policy: str
    block_size: Optional[int] = None
    lossy: Optional[Lossy] = None
    append_at: Optional[int] = None
    resume: Optional[Resume] = None
    memory_hint: Optional[int] = None
    metadata: Optional[Dict[str, Any]] = None
    resources: Optional[bool] = None
    upload: Optional[str] = None
    upload_free_local: Optional[bool] = None

    NESTED: ClassVar[Dict[str, Type[Body]]] = {"lossy": Lossy, "resume": Resume}


@dataclass(frozen=True, kw_only=True)
class Opened(Body):
    """OPENED: the daemon's answer to OPEN."""

    TYPE: ClassVar[int] = OPENED
    session: int
    block_size: int
    upload: Optional[str] = None  # the object being uploaded (s3://bucket/key), when one is
    #: the daemon takes the ring's published cursor at client death and TOKEN's ``head``
    #: (PROTOCOL.md 1.4): PUBLISH may be deferred
    published_cursor: Optional[bool] = None
    #: the daemon takes TOKEN records in the ring (PROTOCOL.md 1.4, 2): tokens may go there,
    #: several published by one message
    ring_tokens: Optional[bool] = None


@dataclass(frozen=True, kw_only=True)
class Publish(Body):
    """PUBLISH: every record in [previous head, head) is complete; ``seq`` is the last
    tensor record's sequence number among them."""

    TYPE: ClassVar[int] = PUBLISH
    head: int
    seq: int


@dataclass(frozen=True, kw_only=True)
class Release(Body):
    """RELEASE: the daemon gives ring space back up to ``tail``."""

    TYPE: ClassVar[int] = RELEASE
    tail: int


@dataclass(frozen=True, kw_only=True)
class Drop(Body):
    """DROP: a tensor the client could not place under policy ``drop``."""

    TYPE: ClassVar[int] = DROP
    seq: int
    name: str
    step: int
    forward: int
    bytes: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class Token(Body):
    """TOKEN: one recorded token, written as a TOKEN packet (``position`` absent: ``index``)."""

    TYPE: ClassVar[int] = TOKEN
    seq: int
    index: int
    token_id: int
    text: str
    position: Optional[int] = None
    head: Optional[int] = None  # publishes every record up to it first (OPENED published_cursor)


@dataclass(frozen=True, kw_only=True)
class Close(Body):
    """CLOSE: ends a session after the last PUBLISH."""

    TYPE: ClassVar[int] = CLOSE
    seq: int
    head: int
    drops: int


@dataclass(frozen=True, kw_only=True)
class Closed(Body):
    """CLOSED: the stream is complete and synced."""

    TYPE: ClassVar[int] = CLOSED
    packets: int
    drops: int
    bytes_in: int
    bytes_out: int
    file_bytes: int
    upload: Optional[str] = None  # the object being uploaded (s3://bucket/key), when one is


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Body):
    """CHECKPOINT: make every event up to ``seq`` (the last one taken) durable."""

    TYPE: ClassVar[int] = CHECKPOINT
    seq: int


@dataclass(frozen=True, kw_only=True)
class Checkpointed(Body):
    """CHECKPOINTED: every packet up to ``seq`` is on disk (field meanings: PROTOCOL.md 1.4)."""

    TYPE: ClassVar[int] = CHECKPOINTED
    seq: int
    offset: int
    packets: int
    drops: int
    tokens: int
    last_offset: int
    last_crc: int


@dataclass(frozen=True, kw_only=True)
class Error(Body):
    """ERROR: a failure reported by the daemon.

    The defaults apply to a malformed ERROR only (libstrap's decoder gives a malformed field
    its default): it must still reach the user as an error, and a missing ``fatal`` is taken
    as fatal, the safe reading.
    """

    TYPE: ClassVar[int] = ERROR
    code: str = "unknown"
    message: str = ""
    fatal: bool = True
    #: ``memory_budget`` only: the largest ring the refused OPEN would have fitted in the
    #: budget left (0: none); absent from daemons before it.
    fits_ring_size: Optional[int] = None

    def exception(self) -> StrapdProtocolError:
        """The exception raised to the user for this ERROR.

        Returns:
            a :class:`StrapdProtocolError` carrying ``code``, ``fatal`` and
            ``fits_ring_size`` (:class:`StrapdWriteError` for ``write_error``).
        """
        cls = StrapdWriteError if self.code == "write_error" else StrapdProtocolError
        return cls(f"strapd error {self.code}: {self.message}", code=self.code, fatal=self.fatal,
                   fits_ring_size=self.fits_ring_size)


@dataclass(frozen=True, kw_only=True)
class Status(Body):
    """STATUS: asks for STATUS_REPLY (empty body)."""

    TYPE: ClassVar[int] = STATUS


@dataclass(frozen=True, kw_only=True)
class StatusReply(Body):
    """STATUS_REPLY (PROTOCOL.md 4). Its figures grow with the daemon; the client passes
    them through to the caller, so only the top-level fields are typed here (``uploads``:
    the uploads to object storage the caller may see, absent without any)."""

    TYPE: ClassVar[int] = STATUS_REPLY
    daemon: Dict[str, Any]
    sessions: List[Dict[str, Any]] = field(default_factory=list)
    uploads: Optional[List[Dict[str, Any]]] = None


@dataclass(frozen=True, kw_only=True)
class Resources(Body):
    """RESOURCES: resource events for the session's resource log (docs/RESOURCE_EVENTS.md).

    The monitor's writer thread sends these with :meth:`Connection.send_raw`, the events
    already serialized; this class documents the body and lists its field (its :meth:`wire`
    packs them with libstrap's ``sp_pack_resources``, and fails when they do not fit one message).
    """

    TYPE: ClassVar[int] = RESOURCES
    events: List[Dict[str, Any]]


#: every message body by type number.
BODIES: Dict[int, Type[Body]] = {c.TYPE: c for c in (
    Hello, Welcome, Open, Opened, Publish, Release, Drop, Close, Closed, Error, Status, StatusReply, Token,
    Checkpoint, Checkpointed, Resources)}

#: the messages a client sends (the rest only come from the daemon).
CLIENT_SENDS: Tuple[Type[Body], ...] = (Hello, Open, Publish, Drop, Token, Checkpoint, Close, Status, Resources)



def _open_wire(o: Open) -> bytes:
    # block_size and memory_hint 0, resources and upload_free_local False are left out as
    # None is (libstrap's sp_open_body; the client never sends them).
    meta = None if o.metadata is None else json.dumps(o.metadata, separators=(",", ":"), ensure_ascii=False).encode()
    lossy, r = o.lossy, o.resume
    return _c.encode_open(o.ring_size, o.codec, o.codec_level, o.policy, o.block_size, lossy and lossy.mode,
                          lossy and lossy.value, o.append_at, r and (r.last_seq, r.last_crc, r.packets), o.memory_hint,
                          meta, bool(o.resources), o.upload, bool(o.upload_free_local))


def _hello_wire(h: Hello) -> bytes:
    if h.protocol != VERSION:
        raise ValueError(f"HELLO of protocol {h.protocol}: libstrap writes {VERSION} (encode_message writes others)")
    return _c.encode_hello(h.client, h.pid)


#: libstrap's encoder of each body the client sends (clients/c/common/strap_wire.c).
_WIRE: Dict[type, Callable[[Any], bytes]] = {
    Hello: _hello_wire,
    Open: _open_wire,
    Publish: lambda b: _c.encode_publish(b.head, b.seq),
    Drop: lambda b: _c.encode_drop(b.seq, b.name, b.step, b.forward, b.bytes, b.reason),
    Token: lambda b: _c.encode_token(b.seq, b.index, b.token_id, b.text, b.position, b.head),
    Checkpoint: lambda b: _c.encode_checkpoint(b.seq),
    Close: lambda b: _c.encode_close(b.seq, b.head, b.drops),
    Status: lambda b: _c.encode_status(),
    Resources: lambda b: _c.encode_resources([json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()
                                              for e in b.events]),
}

#: the messages the daemon sends, which libstrap's decoder reads.
REPLIES: Dict[int, Type[Body]] = {c.TYPE: c for c in (Welcome, Opened, Release, Closed, Error, StatusReply,
                                                      Checkpointed)}


def client_fields() -> Dict[str, List[str]]:
    """The top-level fields the client can send, by message name
    (``testdata/protocol/client_bodies.json``; the Go tests check strapd reads each).

    Returns:
        ``{"HELLO": ["client", "pid", "protocol"], ...}``, names sorted.
    """
    return {NAMES[c.TYPE]: sorted(f.name for f in dataclasses.fields(c)) for c in CLIENT_SENDS}


# ----- framing ---------------------------------------------------------------------------------


def encode_message(msg_type: int, body: Optional[Dict[str, Any]] = None, version: int = VERSION) -> bytes:
    """Encode one message from a raw JSON object with ``json.dumps``: for tests and fakes (odd
    messages, the daemon's side). The client sends typed bodies, encoded by libstrap
    (:func:`encode`).

    Args:
        msg_type: the type number (``HELLO`` ... ``CHECKPOINTED``).
        body: the JSON object (``{}`` when None).
        version: header version (tests use other values to check the version error).

    Returns:
        the datagram bytes.

    Raises:
        ValueError: the message exceeds ``MAX_MESSAGE`` bytes.

    Example:
        >>> encode_message(STATUS)
        b'STRP\\x01\\x00\\x0b\\x00\\x02\\x00\\x00\\x00{}'
    """
    raw = json.dumps(body if body is not None else {}, separators=(",", ":"), ensure_ascii=False).encode()
    if HEADER.size + len(raw) > MAX_MESSAGE:
        raise ValueError(f"{NAMES.get(msg_type, msg_type)} message of {HEADER.size + len(raw)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(MAGIC, version, msg_type, len(raw)) + raw


def encode(body: Body) -> bytes:
    """Encode one typed message (libstrap's encoder for every body the client sends).

    Args:
        body: a message body (its class gives the type number).

    Returns:
        the datagram bytes.

    Raises:
        ValueError: the message exceeds ``MAX_MESSAGE`` bytes.

    Example:
        >>> encode(Publish(head=4096, seq=3))
        b'STRP\\x01\\x00\\x05\\x00\\x15\\x00\\x00\\x00{"head":4096,"seq":3}'
    """
    if not body.TYPE:
        raise TypeError(f"{type(body).__name__} is part of a body, not a message")
    return body.wire()


def _protocol_error(e: ValueError) -> StrapdProtocolError:
    # The extension's decoders raise ValueError(reason, code).
    return StrapdProtocolError(e.args[0], code=e.args[1] or "client")


def decode_reply(data: bytes) -> Tuple[int, Body]:
    """Decode one datagram from the daemon with libstrap's ``sp_decode_reply``.

    An ERROR is read leniently whatever its version (a version-mismatch ERROR must reach the
    user); any other reply must carry version 1.

    Args:
        data: one datagram.

    Returns:
        the header version and the body's dataclass.

    Raises:
        StrapdProtocolError: bad framing, a body that is not one valid JSON object, another
            version (code ``protocol_version``), a type the daemon does not send, or a field
            missing or of the wrong type.
    """
    try:
        version, mtype, kw = _c.decode_reply(bytes(data))
    except ValueError as e:
        raise _protocol_error(e) from None
    if kw is None:  # STATUS_REPLY, checked by the decoder: its figures pass through as they are
        body = decode_message(data)[2]
        return version, StatusReply(daemon=body["daemon"], sessions=body.get("sessions") or [],
                                    uploads=body.get("uploads"))
    return version, REPLIES[mtype](**kw)


def decode_message(data: bytes) -> Tuple[int, int, Dict[str, Any]]:
    """Decode one datagram into ``(version, type, body)``: libstrap checks the framing and
    that the body is one valid JSON object (``sp_decode_frame``), ``json`` reads it.

    Any version is accepted here (the layout never changes) so that a version-mismatch
    ERROR can be read; callers check the version.

    Args:
        data: one datagram.

    Returns:
        the header version, the type number and the JSON object.

    Raises:
        StrapdProtocolError: short datagram, bad magic, wrong length, body not a JSON object.
    """
    data = bytes(data)
    try:
        version, mtype, start, end = _c.decode_frame(data)
    except ValueError as e:
        raise _protocol_error(e) from None
    return version, mtype, json.loads(data[start:end])


def decode(data: bytes) -> Tuple[int, Body]:
    """Decode one datagram of any type into ``(version, typed body)``: a reply with
    :func:`decode_reply`, a body the client sends (which only tests' peers receive) from its
    JSON object. The version is returned, not checked, but for a reply.

    Args:
        data: one datagram.

    Returns:
        the header version and the body's dataclass.

    Raises:
        StrapdProtocolError: a framing error (see :func:`decode_message`), an unknown type,
            or a body that does not match its dataclass.
    """
    if int.from_bytes(data[6:8], "little") in REPLIES:
        return decode_reply(data)
    version, mtype, body = decode_message(data)
    cls = BODIES.get(mtype)
    if cls is None:
        raise StrapdProtocolError(f"unknown message type {mtype}")
    return version, cls.from_body(body)


def error_from_body(body: Dict[str, Any]) -> StrapdProtocolError:
    """Turn an ERROR body into the exception raised to the user, read as libstrap reads one:
    malformed fields get the :class:`Error` defaults (an error report is never lost to a type
    check).

    Args:
        body: the decoded ERROR object.

    Returns:
        the exception.
    """
    return Error.from_body(body).exception()


# ----- the connection --------------------------------------------------------------------------


class Connection:
    """One client connection to strapd (blocking sends; receives with explicit timeouts).

    The datagrams go through libstrap's channel (``clients/c/common/strap_channel.h``, bound in
    ``_speedups_channel.c``): sent with their descriptors, received with a timeout, the
    daemon's last ERROR salvaged from a connection it closed. Every socket failure (EOF, EPIPE,
    ECONNRESET) becomes :class:`StrapdConnectionError`, or that ERROR.
    """

    def __init__(self, sock: socket.socket, path: str = "") -> None:
        self.sock = sock
        self.path = path
        self.closed = False

    @classmethod
    def connect(cls, path: str, timeout: float = 5.0) -> "Connection":
        """Connect to the daemon socket at ``path``.

        Args:
            path: the control socket.
            timeout: seconds to wait for the connection.

        Returns:
            the connection (no handshake yet).

        Raises:
            OSError: nobody answers at ``path``.
        """
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
        # libstrap's salvage (clients/c/common/strap_channel.h): a peer that closes with our
        # messages unread makes the next recv fail with ECONNRESET once; messages it sent
        # before closing are still queued behind that. Its last ERROR, decoded.
        data = _c.channel_salvage(self.sock.fileno())
        if data is None:
            return None
        _, msg = decode_reply(data)
        return msg.exception() if isinstance(msg, Error) else None

    def send(self, msg: Body, fds: Sequence[int] = ()) -> None:
        """Send one message.

        Args:
            msg: the typed body.
            fds: descriptors passed with it as SCM_RIGHTS.

        Raises:
            StrapdConnectionError: the daemon closed the connection (or its last ERROR).
        """
        data = msg.wire()
        try:
            _c.channel_send(self.sock.fileno(), data, fds)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._dead("closed by the daemon", e) from None
        except OSError as e:
            raise self._dead(f"failed sending {NAMES.get(msg.TYPE, msg.TYPE)}", e) from None

    def send_raw(self, msg_type: int, body: bytes) -> None:
        """Send one message whose body is already a serialized JSON object (RESOURCES:
        the events are serialized once, by the monitor's writer thread). Safe to call from
        another thread than :meth:`send`: each is one ``sendmsg`` of one datagram.

        Args:
            msg_type: the type number.
            body: the JSON object's bytes.

        Raises:
            ValueError: the message exceeds ``MAX_MESSAGE`` bytes.
            StrapdConnectionError: the daemon closed the connection.
        """
        if HEADER.size + len(body) > MAX_MESSAGE:
            raise ValueError(f"{NAMES.get(msg_type, msg_type)} message of {HEADER.size + len(body)} bytes exceeds "
                             f"{MAX_MESSAGE}")
        try:
            _c.channel_send(self.sock.fileno(), HEADER.pack(MAGIC, VERSION, msg_type, len(body)) + body)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._dead("closed by the daemon", e) from None
        except OSError as e:
            raise self._dead(f"failed sending {NAMES.get(msg_type, msg_type)}", e) from None

    def recv(self, timeout: Optional[float]) -> Optional[Body]:
        """Receive one message, waiting at most ``timeout`` seconds (None = forever, 0 = poll).

        Args:
            timeout: seconds to wait.

        Returns:
            the typed body, or None when nothing arrived in time.

        Raises:
            StrapdConnectionError: EOF or a socket error.
            StrapdProtocolError: a malformed message or a version other than 1.
        """
        try:
            # libstrap's receive (clients/c/common/strap_channel.h), the GIL let go while it waits
            data = _c.channel_recv(self.sock.fileno(), timeout)
        except ConnectionResetError as e:
            raise self._dead("reset by the daemon", e) from None
        except OSError as e:
            raise self._dead("failed", e) from None
        if data is None:
            return None
        if not data:
            raise self._dead("closed by the daemon (EOF)")
        version, msg = decode(data)
        if version != VERSION:  # a reply of another version is refused by decode_reply already
            raise StrapdProtocolError(f"daemon speaks protocol {version}, client speaks {VERSION}", code="protocol_version")
        return msg

    def expect(self, want: Type[B], timeout: float, skip: Sequence[Type[Body]] = ()) -> B:
        """Wait for a message of class ``want``; ERROR raises; classes in ``skip`` are ignored.

        Args:
            want: the body class to wait for.
            timeout: seconds to wait in all.
            skip: body classes that may come first and are dropped.

        Returns:
            the body.

        Raises:
            StrapdTimeoutError: nothing suitable within ``timeout`` seconds.
            StrapdProtocolError: an ERROR, or a message of another type.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StrapdTimeoutError(f"strapd did not answer {NAMES[want.TYPE]} within {timeout:.0f}s")
            got = self.recv(left)
            if got is None:
                continue
            if isinstance(got, want):
                return got
            if isinstance(got, Error):
                raise got.exception()
            if not isinstance(got, tuple(skip)):
                raise StrapdProtocolError(f"expected {NAMES[want.TYPE]}, got {NAMES[got.TYPE]}")

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def handshake(conn: Connection, client: str, pid: int, timeout: float = 10.0) -> Welcome:
    """Send HELLO and wait for WELCOME.

    Args:
        conn: a fresh connection.
        client: the client's name and version.
        pid: the client's pid.
        timeout: seconds to wait for WELCOME.

    Returns:
        the WELCOME body.

    Raises:
        StrapdProtocolError: the daemon speaks another protocol number, or refused.
    """
    conn.send(Hello(protocol=VERSION, client=client, pid=pid))
    w = conn.expect(Welcome, timeout)
    if w.protocol != VERSION:
        raise StrapdProtocolError(f"daemon speaks protocol {w.protocol}, client speaks {VERSION}", code="protocol_version")
    return w


def status(path: str, timeout: float = 5.0) -> Dict[str, Any]:
    """Ask the daemon at ``path`` for its status.

    Args:
        path: the control socket.
        timeout: seconds to wait for each answer.

    Returns:
        the STATUS_REPLY body as a dict (``daemon``, ``sessions``).
    """
    import os

    from llm_instrumentation._version import __version__

    conn = Connection.connect(path, timeout)
    try:
        handshake(conn, f"llm_instrumentation/{__version__}", os.getpid(), timeout)
        conn.send(Status())
        return conn.expect(StatusReply, timeout).to_body()
    finally:
        conn.close()
