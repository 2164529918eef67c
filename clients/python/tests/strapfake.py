"""Test doubles written from the specs: a stream writer (STREAM_FORMAT.md) and an in-process
fake strapd (PROTOCOL.md) that validates every record it reads. They let the client be tested
end to end without the Go daemon; the integration tests use the real one."""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import google_crc32c
import lz4.block
import zstandard

import wire as P
from llm_instrumentation._ring import HEADER_SIZE, KIND_PAD, KIND_TENSOR, parse_record_header
from llm_instrumentation.stream import FILE_HEADER, INDEX_ENTRY, PACKET

#: The RingHeader as this fake daemon reads it (PROTOCOL.md 2): magic, version, ring_size,
#: data_offset, data_size. The client's encoder is libstrap's (_speedups); this is a reader's own.
RING_HEADER = struct.Struct("<4sIQQQ")

CODEC_IDS = {"none": 0, "lz4": 1, "zstd": 2}
DT_SIZES = {1: 4, 2: 2, 3: 2, 4: 8, 5: 1, 6: 1, 7: 2, 8: 4, 9: 8, 10: 1, 11: 1, 12: 1}


def encode_blocks(codec: str, raw: bytes, block_size: int, level: int = 0) -> bytes:
    """Block table + blocks (STREAM_FORMAT.md 5); incompressible blocks stored raw."""
    blocks = [raw[i:i + block_size] for i in range(0, len(raw), block_size)]
    sizes, out = [], []
    for b in blocks:
        if codec == "lz4":
            c = lz4.block.compress(b, store_size=False)
        else:
            c = zstandard.ZstdCompressor(level={0: 1, 1: 1, 2: 3, 3: 7, 4: 19}[level], write_content_size=True).compress(b)
        if len(c) >= len(b):
            sizes.append(len(b) | 0x80000000)
            out.append(b)
        else:
            sizes.append(len(c))
            out.append(c)
    return struct.pack(f"<I{len(sizes)}I", len(sizes), *sizes) + b"".join(out)


class StreamWriter:
    """Writes a v2 stream into a binary file object."""

    def __init__(self, f: Any, metadata: Dict[str, Any], codec: str = "none", level: int = 0,
                 block_size: int = 1 << 20) -> None:
        self.f = f
        self.codec = codec
        self.level = level
        self.block_size = block_size
        self.pos = 0
        self.names: List[str] = []
        self.entries: List[Tuple[int, int, int, int, int, int, int]] = []
        meta = json.dumps(metadata).encode()
        h16 = FILE_HEADER.pack(b"STRAPSTM", 2, 0, len(meta), 0)[:16]
        crc = google_crc32c.value(h16 + meta)
        head = FILE_HEADER.pack(b"STRAPSTM", 2, 0, len(meta), crc) + meta
        head += bytes((-len(head)) % 8)
        self._w(head)

    def _w(self, b: bytes) -> None:
        self.f.write(b)
        self.pos += len(b)

    def packet(self, ptype: int, *, dtype: int = 0, shape: Tuple[int, ...] = (), name: str = "",
               meta: bytes = b"", seq: int = 0, step: int = 0, forward: int = 0, raw: bytes = b"",
               part_offset: int = 0, tensor_len: Optional[int] = None, flags: int = 0,
               raw_len: Optional[int] = None, codec: Optional[str] = None) -> int:
        codec = self.codec if codec is None else codec
        if ptype != 1 or not raw or codec not in ("lz4", "zstd"):
            codec = "none"  # the fake encodes only lz4/zstd; shuffle/quant/fp16 sessions are stored raw
        payload = raw if codec == "none" else encode_blocks(codec, raw, self.block_size, self.level)
        nb = name.encode()
        raw_len = len(raw) if raw_len is None else raw_len
        tensor_len = raw_len if tensor_len is None else tensor_len
        header_len = 96 + 8 * len(shape) + len(nb) + len(meta)
        hdr = PACKET.pack(b"SPKT", ptype, dtype, len(shape), header_len, len(nb), CODEC_IDS[codec], flags,
                          len(meta), 0, seq, step, forward, raw_len, len(payload), part_offset, tensor_len,
                          0 if codec == "none" else self.block_size)
        body = hdr + struct.pack(f"<{len(shape)}Q", *shape) + nb + meta
        crc = google_crc32c.value(body + payload)
        body = body[:20] + struct.pack("<I", crc) + body[24:]
        off = self.pos
        if ptype in (1, 2, 3):
            if name not in self.names:
                self.names.append(name)
            self.entries.append((self.names.index(name), ptype, flags, seq, step, forward, off))
        self._w(body + payload)
        return off

    def finish(self, status: str, packets: int, drops: int, error: str = "", index: bool = True) -> None:
        meta = {"status": status, "packets": packets, "drops": drops}
        if error:
            meta["error"] = error
        self.packet(5, meta=json.dumps(meta).encode())
        if not index:
            return
        idx = struct.pack("<I", len(self.names))
        for n in self.names:
            nb = n.encode()
            idx += struct.pack("<H", len(nb)) + nb
        idx += struct.pack("<Q", len(self.entries))
        for e in self.entries:
            idx += INDEX_ENTRY.pack(*e)
        off = self.packet(4, raw=idx, codec="none")
        self._w(struct.pack("<Q", off) + b"STRAPEND")


class FakeStrapd:
    """A small strapd: one thread per connection, every record checked as PROTOCOL.md says.

    Args:
        path: socket path.
        write_delay: seconds slept per TENSOR record before release (slow disk).
    """

    def __init__(self, path: str, write_delay: float = 0.0, die_after_packets: Optional[int] = None,
                 error_after_packets: Optional[int] = None, release_backwards_after: Optional[int] = None) -> None:
        self.path = path
        #: After this many RELEASEs, one more that moves the tail back to 0 (a hostile daemon).
        self.release_backwards_after = release_backwards_after
        self.write_delay = write_delay
        self.die_after_packets = die_after_packets
        self.error_after_packets = error_after_packets
        self.errors: List[str] = []
        self.sessions: List[Dict[str, Any]] = []
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lsock.bind(path)
        self.lsock.listen(8)
        self._stop = False
        self._threads: List[threading.Thread] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        self._stop = True
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()
        for t in self._threads:
            t.join(5)

    def _send(self, c: socket.socket, mtype: int, body: Dict[str, Any]) -> None:
        c.sendmsg([P.encode_message(mtype, body)], [], socket.MSG_NOSIGNAL)

    def _serve(self, c: socket.socket) -> None:
        sess: Dict[str, Any] = {}
        try:
            self._serve_inner(c, sess)
        except Exception as e:  # recorded for the test to assert on
            self.errors.append(f"{type(e).__name__}: {e}")
            try:
                self._send(c, P.ERROR, {"code": "bad_record", "message": str(e), "fatal": True})
            except OSError:
                pass
            if "w" in sess:
                sess["w"].finish("error", sess["packets"], sess["drops"], str(e))
        finally:
            if "out" in sess:
                sess["out"].close()
            if "mm" in sess:
                sess["mm"].close()
            c.close()

    def _serve_inner(self, c: socket.socket, sess: Dict[str, Any]) -> None:
        data = c.recv(65536)
        ver, mt, body = P.decode_message(data)
        if ver != 1:
            self._send(c, P.ERROR, {"code": "protocol_version", "message": f"client speaks protocol {ver}, strapd speaks protocol 1", "fatal": True})
            return
        assert mt == P.HELLO, mt
        self._send(c, P.WELCOME, {"protocol": 1, "daemon": "fakestrapd 0", "pid": os.getpid(), "max_message": 65536})
        msg, fds, _, _ = socket.recv_fds(c, 65536, 4)
        _, mt, body = P.decode_message(msg)
        if mt == P.STATUS:
            self._send(c, P.STATUS_REPLY, {"daemon": {"sessions": len(self.sessions)}, "sessions": []})
            return
        assert mt == P.OPEN and len(fds) == 2, (mt, fds)
        ring_fd, out_fd = fds
        seals = fcntl.fcntl(ring_fd, 1034)  # F_GET_SEALS
        assert seals & 0x6 == 0x6, f"ring not sealed: {seals:#x}"
        size = os.fstat(ring_fd).st_size
        assert size == body["ring_size"]
        mm = mmap.mmap(ring_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        os.close(ring_fd)
        sess["mm"] = mm
        magic, ver, rs, doff, dsize = RING_HEADER.unpack_from(mm, 0)
        assert (magic, ver, rs, doff, dsize) == (b"SRNG", 1, size, 4096, size - 4096)
        out = os.fdopen(out_fd, "wb")
        sess["out"] = out
        meta = {"strapd_version": "fake", "session": len(self.sessions) + 1, "codec": body["codec"],
                "codec_level": body.get("codec_level", 0), "block_size": body.get("block_size", 1 << 20),
                "policy": body["policy"], "client_metadata": body["metadata"]}
        w = StreamWriter(out, meta, codec=body["codec"], level=body.get("codec_level", 0),
                         block_size=body.get("block_size", 1 << 20))
        sess.update(w=w, packets=0, drops=0, publishes=0, open=body)
        self.sessions.append(sess)
        self._send(c, P.OPENED, {"session": len(self.sessions), "block_size": w.block_size})
        tail = 0
        expect = 1
        bytes_in = 0
        while True:
            data = c.recv(65536)
            if not data:
                w.finish("aborted", sess["packets"], sess["drops"])
                sess["status"] = "aborted"
                return
            _, mt, body = P.decode_message(data)
            if mt == P.PUBLISH:
                sess["publishes"] += 1
                head = body["head"]
                while tail < head:
                    off = HEADER_SIZE + tail % dsize
                    r = parse_record_header(mm, off)
                    assert r["magic"] == b"SREC", r
                    assert r["record_len"] % 64 == 0 and r["record_len"] >= 64
                    assert tail % dsize + r["record_len"] <= dsize, "record wraps"
                    assert tail + r["record_len"] <= head, "record past head"
                    if r["kind"] == KIND_PAD:
                        assert tail % dsize + r["record_len"] == dsize, "pad not to end"
                        tail += r["record_len"]
                        continue
                    assert r["kind"] == KIND_TENSOR
                    assert r["seq"] == expect, f"expected seq {expect}, found {r['seq']}"
                    expect += 1
                    assert r["payload_off"] % 64 == 0 and r["payload_off"] + r["payload_len"] <= r["record_len"]
                    n = 1
                    for s in r["shape"]:
                        n *= s
                    assert n * DT_SIZES[r["dtype"]] == r["tensor_len"]
                    if r["flags"] & 1:
                        assert r["part_offset"] + r["payload_len"] <= r["tensor_len"]
                    else:
                        assert r["tensor_len"] == r["payload_len"]
                    p0 = off + r["payload_off"]
                    raw = bytes(mm[p0:p0 + r["payload_len"]])
                    if self.write_delay:
                        time.sleep(self.write_delay)
                    w.packet(1, dtype=r["dtype"], shape=r["shape"], name=r["name"], meta=r["meta"], seq=r["seq"],
                             step=r["step"], forward=r["forward"], raw=raw, part_offset=r["part_offset"],
                             tensor_len=r["tensor_len"], flags=r["flags"])
                    sess["packets"] += 1
                    bytes_in += r["payload_len"]
                    if sess["packets"] == self.die_after_packets:
                        sess["status"] = "died"
                        return  # closes the connection without a word, like a crashed daemon
                    if sess["packets"] == self.error_after_packets:
                        self._send(c, P.ERROR, {"code": "write_failed", "message": "ENOSPC", "fatal": True})
                        w.finish("error", sess["packets"], sess["drops"], "ENOSPC")
                        sess["status"] = "error"
                        return
                    tail += r["record_len"]
                assert tail == head
                assert body["seq"] == expect - 1, (body, expect)
                self._send(c, P.RELEASE, {"tail": tail})
                sess["releases"] = sess.get("releases", 0) + 1
                if sess["releases"] == self.release_backwards_after:
                    self._send(c, P.RELEASE, {"tail": 0})
            elif mt == P.DROP:
                assert body["seq"] == expect, f"DROP expected seq {expect}, found {body['seq']}"
                expect += 1
                w.packet(2, name=body["name"], seq=body["seq"], step=body["step"], forward=body["forward"],
                         meta=json.dumps({"reason": body["reason"]}).encode(), raw_len=body["bytes"])
                sess["drops"] += 1
                sess["packets"] += 1  # like strapd: TENSOR, DROP and TOKEN packets count
            elif mt == P.TOKEN:
                assert body["seq"] == expect, f"TOKEN expected seq {expect}, found {body['seq']}"
                expect += 1
                meta = {"token_id": body["token_id"], "text": body["text"], "position": body.get("position", body["index"])}
                w.packet(3, name="token", seq=body["seq"], step=body["index"],
                         meta=json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
                sess["packets"] += 1
            elif mt == P.CLOSE:
                assert body["seq"] == expect - 1 and body["head"] == tail and body["drops"] == sess["drops"], (body, expect, tail)
                w.finish("complete", sess["packets"], sess["drops"])
                out.flush()
                sess["status"] = "complete"
                self._send(c, P.CLOSED, {"packets": sess["packets"], "drops": sess["drops"], "bytes_in": bytes_in,
                                         "bytes_out": w.pos, "file_bytes": w.pos})
                return
            else:
                raise AssertionError(f"unexpected message {mt}")

