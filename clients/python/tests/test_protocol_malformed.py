"""Malformed replies from the daemon, fed to the client's one parser of them: libstrap's
``sp_decode_reply`` (clients/c/common/strap_wire.c, fuzzed by clients/c/fuzz) through the
``_speedups`` extension. Every datagram either decodes to a typed body or raises
StrapdProtocolError with a reason: never another exception, never a crash."""

from __future__ import annotations

import random
import socket

import pytest
from conftest import TESTDATA

import wire as P
from llm_instrumentation.errors import StrapdProtocolError

PROTO = TESTDATA / "protocol"
REPLY_FILES = ["welcome.bin", "opened.bin", "opened_cursor.bin", "opened_ring_tokens.bin", "release.bin",
               "closed.bin", "checkpointed.bin", "error_memory_budget.bin", "error_protocol_version.bin"]


def _msg(mtype: int, body: bytes, version: int = 1) -> bytes:
    return P.HEADER.pack(P.MAGIC, version, mtype, len(body)) + body


def _decodes_or_refuses(data: bytes) -> None:
    try:
        _, body = P.decode_reply(data)
    except StrapdProtocolError as e:
        assert str(e), data
        return
    assert isinstance(body, P.Body) and body.TYPE in P.REPLIES


@pytest.mark.parametrize("data,why", [
    (b"", "shorter than the 12-byte header"),
    (b"STRP\x01\x00\x06\x00", "shorter"),
    (b"XXXX\x01\x00\x06\x00\x02\x00\x00\x00{}", "magic"),
    (b"STRP\x01\x00\x06\x00\xff\xff\xff\xff{}", "length"),
    (_msg(P.RELEASE, b""), "not JSON"),
    (_msg(P.RELEASE, b'{"tail":1'), "not JSON"),
    (_msg(P.RELEASE, b'{"tail":1} x'), "not JSON"),
    (_msg(P.RELEASE, b'{"tail":NaN}'), "not JSON"),
    (_msg(P.RELEASE, b'{"tail":1,}'), "not JSON"),
    (_msg(P.RELEASE, b'{"a":"\xff"}'), "UTF-8"),
    (_msg(P.RELEASE, b'{"a":"\\ud800"}'), "surrogate"),
    (_msg(P.RELEASE, b"[" * 100 + b"]" * 100), "not JSON"),
    (_msg(P.RELEASE, b"[]"), "not a JSON object"),
    (_msg(P.RELEASE, b'"tail"'), "not a JSON object"),
    (_msg(P.RELEASE, b"{}"), "RELEASE without field 'tail'"),
    (_msg(P.RELEASE, b'{"tail":-1}'), "RELEASE.tail is -1, expected an integer"),
    (_msg(P.RELEASE, b'{"tail":1.5}'), "expected an integer"),
    (_msg(P.RELEASE, b'{"tail":18446744073709551616}'), "expected an integer"),
    (_msg(P.RELEASE, b'{"tail":null}'), "expected an integer"),
    (_msg(P.OPENED, b'{"session":1,"block_size":2,"published_cursor":"yes"}'), "expected a boolean"),
    (_msg(P.OPENED, b'{"session":1,"block_size":2,"upload":7}'), "expected a string"),
    (_msg(P.WELCOME, b'{"protocol":1,"daemon":"d","pid":1}'), "WELCOME without field 'max_message'"),
    (_msg(P.STATUS_REPLY, b'{"daemon":[]}'), "expected an object"),
    (_msg(P.STATUS_REPLY, b'{"daemon":{},"sessions":[1]}'), "expected a list of objects"),
    (_msg(P.HELLO, b'{"protocol":1,"client":"x","pid":1}'), "unexpected message type 1 (HELLO)"),
    (_msg(99, b"{}"), "unexpected message type 99"),
])
def test_malformed_reply_is_a_protocol_error(data, why):
    with pytest.raises(StrapdProtocolError, match=why.replace("(", r"\(").replace(")", r"\)")):
        P.decode_reply(data)


@pytest.mark.parametrize("body", [{"tail": "a" + "\u00e9" * 100}, {"x": "b" + "\u20ac" * 300}])
def test_reasons_quoting_the_reply_stay_text(body):
    # The reason quotes a cut of the daemon's bytes: the cut keeps whole UTF-8 characters.
    with pytest.raises(StrapdProtocolError, match="RELEASE") as ei:
        P.decode_reply(P.encode_message(P.RELEASE, body))
    assert ei.value.code == "client" and "\ufffd" not in str(ei.value) and str(ei.value).endswith(
        ("expected an integer >= 0", "..."))


def test_reply_of_another_version_names_it():
    with pytest.raises(StrapdProtocolError, match="daemon speaks protocol 2, client speaks 1") as ei:
        P.decode_reply(_msg(P.RELEASE, b'{"tail":1}', version=2))
    assert ei.value.code == "protocol_version"


def test_malformed_error_is_still_an_error():
    # An error report must never be lost to a type check: bad fields take the defaults.
    _, err = P.decode_reply(_msg(P.ERROR, b'{"code":5,"message":[1],"fatal":"no","fits_ring_size":-1}', version=3))
    assert err == P.Error(code="unknown", message="", fatal=True)


def test_unknown_fields_and_nulls_are_accepted():
    # PROTOCOL.md 1.1: unknown fields are ignored (a newer daemon may add some); an optional
    # field sent as null is absent.
    body = b'{"session":7,"block_size":1048576,"later":{"x":[1,2,{"y":null}]},"upload":null,"ring_tokens":null}'
    assert P.decode_reply(_msg(P.OPENED, body)) == (1, P.Opened(session=7, block_size=1048576))
    body = b'{"daemon":{"v":"\\u00e9"},"sessions":[{"id":1}],"uploads":null,"new":true}'
    assert P.decode_reply(_msg(P.STATUS_REPLY, body)) == (1, P.StatusReply(daemon={"v": "\u00e9"},
                                                                           sessions=[{"id": 1}]))


def test_long_strings_come_back_whole():
    # The C decoder keeps short copies; the binding unescapes the whole string.
    msg = "m\u00e9\\\"" * 5000
    data = P.encode_message(P.ERROR, {"code": "write_error", "message": msg, "fatal": False})
    err = P.decode_reply(data)[1]
    assert err.message == msg and not err.fatal
    with pytest.raises(Exception, match="write_error"):
        raise err.exception()


@pytest.mark.parametrize("fname", REPLY_FILES)
def test_mutated_golden_replies_never_crash(fname):
    # Truncations, byte flips and insertions of every golden reply (a fixed seed: the C
    # fuzz target explores further, clients/c/fuzz).
    good = (PROTO / fname).read_bytes()
    rng = random.Random(fname)
    _decodes_or_refuses(good)
    for n in range(len(good)):
        _decodes_or_refuses(good[:n])
    for _ in range(1500):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            op = rng.random()
            if op < 0.6:
                b[i] = rng.randrange(256)
            elif op < 0.8:
                b.insert(i, rng.choice(b'{}[]",:\\0123456789-.eEtrufalsn \xff\xc3'))
            else:
                del b[i]
        if len(b) >= 12 and rng.random() < 0.7:  # keep the length right, so the body is parsed
            b[8:12] = (len(b) - 12).to_bytes(4, "little")
        _decodes_or_refuses(bytes(b))


@pytest.mark.parametrize("data,why", [(_msg(P.RELEASE, b'{"tail":"x"}'), "RELEASE.tail"), (b"garbage", "shorter")],
                         ids=["bad-field", "short"])
def test_session_raises_protocol_error_for_a_malformed_reply(data, why):
    """The client's session (libstrap's, attached over a socketpair) reading a malformed reply:
    StrapdProtocolError with the decoder's reason, kept as the session's error."""
    from llm_instrumentation import _ring as R
    from llm_instrumentation._session import CaptureSession

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(a, R.Ring(R.HEADER_SIZE + 64 * 64))
    try:
        b.send(data)
        with pytest.raises(StrapdProtocolError, match=why):
            s.drain()
        assert isinstance(s.error, StrapdProtocolError)
    finally:
        s.shutdown()
        b.close()
