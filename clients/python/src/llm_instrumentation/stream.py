"""Reader of strapd stream files (docs/STREAM_FORMAT.md, version 2): pure Python + numpy +
lz4 + zstandard + google-crc32c; torch only for :meth:`Tensor.tensor`.

Every packet's CRC32C is checked when the packet is read. A closed stream is walked through
its INDEX (random access by module); a stream without footer (daemon crash) is scanned, and
a torn last packet ends the scan (``reader.truncated_at`` says where).

The bytes come from a :mod:`~llm_instrumentation._source`: a local file (memory-mapped) or
an object in storage (``s3://...``, byte-range reads). Over object storage a packet's header
is read when the packet is listed and its payload when it is decoded; the CRC of a packet
whose payload was not fetched with its header is checked when the payload is
(docs/OBJECT_STORAGE.md).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from ._dtypes import DTYPES, dtype_name
from ._source import ByteSource, open_source
from ._tensor import Tensor
from .errors import StreamFormatError, UnsupportedCodecError

FILE_MAGIC = b"STRAPSTM"
FILE_VERSION = 2
FILE_HEADER = struct.Struct("<8sHHII4x")  # magic, version, flags, meta_len, crc32c, reserved
PACKET_MAGIC = b"SPKT"
#: magic type dtype ndim header_len name_len codec flags meta_len crc seq step forward raw_len
#: stored_len part_offset tensor_len block_size reserved reserved
PACKET = struct.Struct("<4sHBBIHBBIIQQQQQQQI4x8x")
assert PACKET.size == 96
FOOTER_MAGIC = b"STRAPEND"

TENSOR, DROP, TOKEN, INDEX, END = 1, 2, 3, 4, 5
TYPE_NAMES = {TENSOR: "TENSOR", DROP: "DROP", TOKEN: "TOKEN", INDEX: "INDEX", END: "END"}
CODEC_NONE, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2
FLAG_PART = 1
INDEX_ENTRY = struct.Struct("<IHHQQQQ")
assert INDEX_ENTRY.size == 40
#: Bytes fetched for a packet header whose length is not known yet (remote sources): most
#: headers (96 bytes + shape, name, meta) fit; a longer one costs a second request.
HEAD_GUESS = 4096
#: A remote payload at least this many times its prefix (the bytes that came with its header)
#: is fetched whole, prefix again included, instead of its rest joined to the prefix: at most
#: 1/64 more bytes, one copy of the payload less.
REFETCH_PREFIX_RATIO = 64
#: Read-ahead of a remote source when walking packets of unknown length in file order.
SCAN_AHEAD = 4 << 20
#: Index entries whose headers a remote source fetches in one concurrent batch.
REMOTE_BATCH = 256


def crc32c(data: Any, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``value``."""
    import google_crc32c

    if isinstance(data, bytes):
        return google_crc32c.extend(value, data)
    # google_crc32c takes bytes only: feed views in bounded chunks.
    mv = memoryview(data)
    for i in range(0, len(mv), 8 << 20):
        value = google_crc32c.extend(value, bytes(mv[i:i + (8 << 20)]))
    return value


@dataclass(frozen=True)
class IndexEntry:
    """One entry of a stream's INDEX (STREAM_FORMAT.md 3) and the bytes it may span.

    Attributes:
        name, type, flags, seq, step, forward, offset: the entry's fields.
        span: bytes from ``offset`` to the next packet in the index (or to the INDEX): the
            packet lies within ``[offset, offset + span)`` (the last one's span also holds END).
    """

    name: str
    type: int
    flags: int
    seq: int
    step: int
    forward: int
    offset: int
    span: int


@dataclass
class Packet:
    """One packet as stored (payload not decoded).

    Attributes are the header fields of STREAM_FORMAT.md 3 plus ``offset`` (file position),
    ``type_name``, ``dtype`` (name, or None when not a tensor), ``shape``, ``name`` and
    ``meta`` (decoded JSON dict, ``{}`` when empty).
    """

    offset: int
    type: int
    dtype_id: int
    codec: int
    flags: int
    seq: int
    step: int
    forward: int
    raw_len: int
    stored_len: int
    part_offset: int
    tensor_len: int
    block_size: int
    shape: Tuple[int, ...]
    name: str
    meta: Dict[str, Any]
    payload_start: int
    _reader: "StreamReader" = field(repr=False, compare=False)
    #: the stored CRC32C field (checked against the bytes when the packet was parsed, or,
    #: when only its header was fetched, when its payload is).
    crc: int = 0
    #: CRC32C state after the header (crc field zeroed): the payload continues it.
    _hcrc: int = field(default=0, repr=False, compare=False)
    #: Over object storage: the payload's first bytes, fetched with the header (all of it
    #: for a small packet, CRC-checked then), so that decoding fetches only the rest.
    _prefix: Optional[bytes] = field(default=None, repr=False, compare=False)

    @property
    def type_name(self) -> str:
        """``"TENSOR"``, ``"DROP"``, ``"TOKEN"``, ``"INDEX"`` or ``"END"``."""
        return TYPE_NAMES.get(self.type, str(self.type))

    @property
    def dtype(self) -> Optional[str]:
        """dtype name, or None for non-tensor packets."""
        return dtype_name(self.dtype_id) if self.dtype_id else None

    @property
    def is_part(self) -> bool:
        """Whether this is one PART of a larger tensor."""
        return bool(self.flags & FLAG_PART)

    @property
    def end(self) -> int:
        """File offset just after this packet."""
        return self.payload_start + self.stored_len

    def stored(self) -> Union[bytes, memoryview]:
        """The payload bytes as stored (a view of a local file, no copy; fetched, and
        CRC-checked, from object storage)."""
        return self._reader._payload(self)

    def decode(self, stored: Optional[Union[bytes, memoryview]] = None) -> bytes:
        """The decoded payload (``raw_len`` bytes); ``stored``: the stored payload, when the
        caller fetched it already (:meth:`StreamReader.fetch_payload`)."""
        return self._reader._decode(self, stored)


class StreamReader:
    """An open stream. Use :func:`open_stream`.

    Attributes:
        path: the file or URL.
        version: format version (2).
        metadata: the header's metadata dict.
        indexed: whether the footer index was used.
        truncated_at: offset of a torn final packet (scan mode), else None.
        incomplete_tensors: split tensors whose parts did not all arrive, counted by the
            last full iteration (they are never returned).
        source: where the bytes come from (``source.remote``, ``source.bytes_fetched``).
    """

    def __init__(self, path: Union[str, os.PathLike], *, storage_options: Optional[Dict[str, Any]] = None,
                 source: Optional[ByteSource] = None) -> None:
        """Open ``path`` (a file, or a URL such as ``s3://bucket/key`` read through fsspec with
        ``storage_options``), or read ``source`` (``path`` then only names it in errors)."""
        self.path = os.fspath(path)
        self._src = source if source is not None else open_source(path, storage_options)
        self.source = self._src
        self._remote = self._src.remote
        self.size = self._src.size
        if self.size == 0:
            self._src.close()
            raise StreamFormatError(f"{self.path} is empty, not a strap stream", 0)
        self.truncated_at: Optional[int] = None
        self.incomplete_tensors = 0
        self.indexed = False
        self._index_entries: List[Tuple[str, int, int, int, int, int, int]] = []
        self._spans: List[int] = []
        try:
            self._read_header()
            self._offsets = self._load_index()  # None: no footer, scan instead
        except BaseException:
            self.close()
            raise
        self._scanned: Optional[List[Packet]] = None

    # ----- structure ---------------------------------------------------------------------------

    def _read_header(self) -> None:
        if self.size < FILE_HEADER.size:
            raise StreamFormatError(f"{self.path}: {self.size} bytes is too short for a stream header", 0)
        v = self._src.read(0, FILE_HEADER.size, ahead=HEAD_GUESS if self._remote else 0)
        magic, version, flags, meta_len, crc = FILE_HEADER.unpack_from(v, 0)
        if magic != FILE_MAGIC:
            hint = " (an llm_instrumentation 1.3.1 stream? open it with open_stream)" if magic[:2] != b"ST" else ""
            raise StreamFormatError(f"{self.path}: bad file magic {bytes(magic)!r}{hint}", 0)
        if version != FILE_VERSION:
            raise StreamFormatError(f"{self.path}: stream version {version}, this reader reads {FILE_VERSION}", 8)
        end = FILE_HEADER.size + meta_len
        if end > self.size:
            raise StreamFormatError(f"{self.path}: metadata of {meta_len} bytes runs past the end of the file", 12)
        pad_end = (end + 7) // 8 * 8
        if pad_end > self.size:
            raise StreamFormatError(f"{self.path}: file header padding runs past the end of the file", end)
        v = self._src.read(0, pad_end)
        got = crc32c(bytes(v[0:16]) + bytes(v[FILE_HEADER.size:end]))
        if got != crc:
            raise StreamFormatError(f"{self.path}: file header CRC mismatch (stored {crc:#010x}, computed {got:#010x})", 16)
        try:
            meta = _loads_meta(bytes(v[FILE_HEADER.size:end])) if meta_len else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise StreamFormatError(f"{self.path}: metadata is not JSON: {e}", FILE_HEADER.size) from None
        if not isinstance(meta, dict):
            raise StreamFormatError(f"{self.path}: metadata is not a JSON object", FILE_HEADER.size)
        # Neither the reserved field nor the padding is under the CRC: require zeros (as the
        # Go reader does) so that no byte of the header goes unchecked.
        (reserved,) = struct.unpack_from("<I", v, 20)
        if reserved:
            raise StreamFormatError(f"{self.path}: file header reserved field {reserved:#x}", 20)
        if any(bytes(v[end:pad_end])):
            raise StreamFormatError(f"{self.path}: file header padding not zero", end)
        self.version = version
        self.flags = flags
        self.metadata: Dict[str, Any] = meta
        self.first_packet = pad_end

    def _parse(self, off: int, strict: bool = True, span: Optional[int] = None, lazy: bool = False,
               buf: Optional[Any] = None) -> Optional[Packet]:
        """Parse and CRC-check the packet at ``off``. Returns None for a torn packet at the
        end of the file when ``strict`` is False (scan mode).

        ``span``: bytes from ``off`` known to hold the whole packet (from the index), read in
        one request. ``lazy``: read the header only; the CRC is then checked when the payload
        is read (:meth:`_payload`), unless the packet's bytes were in hand anyway. ``buf``:
        bytes from ``off`` already fetched."""
        if off + PACKET.size > self.size:
            if strict:
                raise StreamFormatError(f"{self.path}: packet header runs past the end of the file", off)
            return None
        ahead = SCAN_AHEAD if self._remote and span is None else 0
        if buf is None:
            want = PACKET.size if span is None else (min(span, HEAD_GUESS) if lazy else span)
            buf = self._src.read(off, max(want, PACKET.size), ahead=ahead)
        (magic, ptype, dt, ndim, header_len, name_len, codec, flags, meta_len, crc, seq, step, fwd,
         raw_len, stored_len, part_offset, tensor_len, block_size) = PACKET.unpack_from(buf, 0)
        if magic != PACKET_MAGIC:
            raise StreamFormatError(f"{self.path}: bad packet magic {bytes(magic)!r}", off)
        if ptype not in TYPE_NAMES:
            raise StreamFormatError(f"{self.path}: unknown packet type {ptype}", off)
        if ndim > 8:
            raise StreamFormatError(f"{self.path}: packet ndim {ndim} > 8", off)
        if header_len != PACKET.size + 8 * ndim + name_len + meta_len:
            raise StreamFormatError(
                f"{self.path}: header_len {header_len} != 96 + 8*{ndim} + {name_len} + {meta_len}", off)
        end = off + header_len + stored_len
        if end > self.size:
            if strict:
                raise StreamFormatError(f"{self.path}: packet of {header_len + stored_len} bytes runs past the end of the file", off)
            return None
        whole = header_len + stored_len
        if len(buf) < (header_len if lazy else whole):
            buf = self._src.read(off, header_len if lazy else whole, ahead=ahead)
        hdr = bytearray(buf[0:header_len])
        hdr[20:24] = b"\0\0\0\0"
        hcrc = crc32c(hdr)
        if len(buf) >= whole:
            got = crc32c(buf[header_len:whole], hcrc)
            if got != crc:
                raise StreamFormatError(f"{self.path}: packet CRC mismatch (stored {crc:#010x}, computed {got:#010x})", off)
        if dt and dt not in DTYPES:
            raise StreamFormatError(f"{self.path}: unknown dtype id {dt}", off)
        shape = struct.unpack_from(f"<{ndim}Q", buf, PACKET.size)
        p = PACKET.size + 8 * ndim
        try:
            name = bytes(buf[p:p + name_len]).decode("utf-8")
            meta_raw = bytes(buf[p + name_len:p + name_len + meta_len])
            meta = _loads_meta(meta_raw) if meta_len else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise StreamFormatError(f"{self.path}: packet name/meta not valid UTF-8 JSON: {e}", off) from None
        if not isinstance(meta, dict):
            raise StreamFormatError(f"{self.path}: packet meta is not a JSON object", off)
        why = _check_fields(ptype, dt, shape, codec, flags, seq, raw_len, stored_len, part_offset, tensor_len,
                            block_size)
        if why:
            raise StreamFormatError(f"{self.path}: {TYPE_NAMES[ptype]} packet: {why}", off)
        # (At most HEAD_GUESS bytes: a packet parsed from a read-ahead window must not keep
        # the window's megabytes alive; decoding fetches whatever is not kept.)
        prefix = bytes(buf[header_len:min(len(buf), whole, header_len + HEAD_GUESS)]) if self._remote else None
        return Packet(off, ptype, dt, codec, flags, seq, step, fwd, raw_len, stored_len, part_offset,
                      tensor_len, block_size, tuple(shape), name, meta, off + header_len, self, crc=crc, _hcrc=hcrc,
                      _prefix=prefix)

    def fetch_payload(self, pk: Packet) -> Union[bytes, memoryview]:
        """``pk``'s stored payload, CRC-checked: over object storage one range request (safe
        from several threads, so a caller can fetch ahead while it decodes); from a file a
        view of the mapping."""
        return self._payload(pk)

    def _payload(self, pk: Packet) -> Union[bytes, memoryview]:
        if not self._remote:
            return self._src.read(pk.payload_start, pk.stored_len)
        pre = pk._prefix or b""
        if len(pre) == pk.stored_len:
            return pre  # came whole with its header, CRC-checked by _parse
        if pre and pk.stored_len >= REFETCH_PREFIX_RATIO * len(pre):
            # A large payload: fetched whole, its first bytes again, rather than joined to
            # the prefix that came with the header (a copy of megabytes, into memory the
            # kernel must fault in and zero, for at most HEAD_GUESS bytes saved).
            pre = b""
        # Fetched now, apart from its header: check it against the packet's CRC.
        rest = self._src.read(pk.payload_start + len(pre), pk.stored_len - len(pre))
        got = crc32c(rest, crc32c(pre, pk._hcrc) if pre else pk._hcrc)
        if got != pk.crc:
            raise StreamFormatError(f"{self.path}: packet CRC mismatch (stored {pk.crc:#010x}, computed {got:#010x})",
                                    pk.offset)
        return pre + bytes(rest) if pre else rest

    def _load_index(self) -> Optional[List[int]]:
        """Offsets of the TENSOR/DROP/TOKEN packets from the footer index, or None when the
        file has no footer."""
        if self.size < self.first_packet + 16:
            return None
        foot = self._src.read(self.size - 16, 16)
        if bytes(foot[8:]) != FOOTER_MAGIC:
            return None
        (idx_off,) = struct.unpack_from("<Q", foot, 0)
        if not self.first_packet <= idx_off < self.size - 16:
            raise StreamFormatError(f"{self.path}: footer index offset {idx_off} out of range", self.size - 16)
        raw = self._src.read(idx_off, self.size - 16 - idx_off)  # one request for the whole INDEX
        pk = self._parse(idx_off, buf=raw)
        assert pk is not None
        if pk.type != INDEX or pk.codec != CODEC_NONE:
            raise StreamFormatError(f"{self.path}: footer points at a {pk.type_name} packet, not an uncompressed INDEX", idx_off)
        if pk.end != self.size - 16:
            raise StreamFormatError(f"{self.path}: bytes between the INDEX packet and the footer", pk.end)
        data = raw[pk.payload_start - idx_off:]
        try:
            (n_names,) = struct.unpack_from("<I", data, 0)
            p = 4
            names = []
            for _ in range(n_names):
                (ln,) = struct.unpack_from("<H", data, p)
                p += 2
                names.append(bytes(data[p:p + ln]).decode("utf-8"))
                p += ln
            (n_entries,) = struct.unpack_from("<Q", data, p)
            p += 8
            if p + n_entries * INDEX_ENTRY.size != len(data):
                raise StreamFormatError(f"{self.path}: INDEX has {n_entries} entries but {len(data) - p} bytes of them", idx_off)
            offsets = []
            entries = []
            for i in range(n_entries):
                ni, typ, fl, seq, step, fwd, off = INDEX_ENTRY.unpack_from(data, p + i * INDEX_ENTRY.size)
                if ni >= n_names or not self.first_packet <= off < idx_off:
                    raise StreamFormatError(f"{self.path}: INDEX entry {i} is out of range", idx_off)
                offsets.append(off)
                entries.append((names[ni], typ, fl, seq, step, fwd, off))
        except (struct.error, UnicodeDecodeError) as e:
            raise StreamFormatError(f"{self.path}: INDEX payload is malformed: {e}", idx_off) from None
        self._index_entries = entries
        # Packets follow each other with nothing between: an entry's packet lies within
        # [its offset, the next entry's); the last one's within [its offset, the INDEX).
        # (Sorted, so that an index out of file order only costs precision, not correctness.)
        order = sorted(set(offsets)) + [idx_off]
        following = {o: order[k + 1] for k, o in enumerate(order[:-1])}
        self._spans = [following[o] - o for o in offsets]
        self.indexed = True
        self._index_offset = idx_off
        return offsets

    def _parse_entries(self, which: Iterable[int]) -> Iterator[Packet]:
        """The packets of index entries ``which`` (in the order given), each checked against
        its entry. A remote source fetches their headers in concurrent batches (only the
        headers: payloads are read when decoded); a file is parsed in place."""
        ents, spans = self._index_entries, self._spans
        if not self._remote:
            for i in which:
                pk = self._parse(ents[i][6], span=spans[i])
                assert pk is not None
                self._check_entry(pk, ents[i])
                yield pk
            return
        batch: List[int] = []
        it = iter(which)
        while True:
            batch = [i for _, i in zip(range(REMOTE_BATCH), it)]
            if not batch:
                return
            bufs = self._src.read_many([(ents[i][6], min(spans[i], HEAD_GUESS)) for i in batch])
            for i, buf in zip(batch, bufs):
                pk = self._parse(ents[i][6], span=spans[i], lazy=True, buf=buf)
                assert pk is not None
                self._check_entry(pk, ents[i])
                yield pk

    def _scan(self) -> List[Packet]:
        if self._scanned is None:
            out: List[Packet] = []
            off = self.first_packet
            while off < self.size:
                pk = self._parse(off, strict=False)
                if pk is None:
                    self.truncated_at = off
                    break
                out.append(pk)
                off = pk.end
            self._scanned = out
        return self._scanned

    # ----- decoding ----------------------------------------------------------------------------

    def _decode(self, pk: Packet, stored: Optional[Union[bytes, memoryview]] = None) -> bytes:
        data = pk.stored() if stored is None else stored
        if pk.codec == CODEC_NONE:
            return bytes(data)
        if pk.block_size <= 0:
            raise StreamFormatError(f"{self.path}: codec {pk.codec} packet with block_size 0", pk.offset)
        n_expected = -(-pk.raw_len // pk.block_size) if pk.raw_len else 0
        try:
            (n,) = struct.unpack_from("<I", data, 0)
            if n != n_expected:
                raise StreamFormatError(
                    f"{self.path}: block table has {n} blocks, raw_len {pk.raw_len} / block_size {pk.block_size} needs {n_expected}",
                    pk.offset)
            sizes = struct.unpack_from(f"<{n}I", data, 4)
        except struct.error:
            raise StreamFormatError(f"{self.path}: block table runs past the payload", pk.offset) from None
        p = 4 + 4 * n
        out = bytearray()
        for i, s in enumerate(sizes):
            raw_block = bool(s & 0x80000000)
            s &= 0x7FFFFFFF
            want = min(pk.block_size, pk.raw_len - i * pk.block_size)
            blk = data[p:p + s]
            if len(blk) != s:
                raise StreamFormatError(f"{self.path}: block {i} runs past the payload", pk.offset)
            p += s
            if raw_block:
                if s != want:
                    raise StreamFormatError(f"{self.path}: stored block {i} has {s} bytes, expected {want}", pk.offset)
                out += blk
                continue
            try:
                dec = _decode_block(pk.codec, bytes(blk), pk.dtype or "uint8", want)
            except UnsupportedCodecError:
                raise UnsupportedCodecError(f"{self.path}: unsupported codec id {pk.codec}", pk.offset) from None
            except Exception as e:
                raise StreamFormatError(f"{self.path}: block {i} does not decode: {e}", pk.offset) from None
            if len(dec) != want:
                raise StreamFormatError(f"{self.path}: block {i} decoded to {len(dec)} bytes, expected {want}", pk.offset)
            out += dec
        if p != len(data):
            raise StreamFormatError(f"{self.path}: {len(data) - p} stray bytes after the last block", pk.offset)
        return bytes(out)

    # ----- public API --------------------------------------------------------------------------

    def packets(self, include_index: bool = False,
                select: Optional[Callable[[str, int], bool]] = None) -> Iterator[Packet]:
        """Every packet in file order (TENSOR parts, DROP, TOKEN, END; INDEX when asked).

        Each is CRC-checked as it is read (over object storage: a packet whose payload is
        not fetched with its header, when its payload is read).

        Args:
            include_index: also yield the INDEX packet.
            select: ``select(name, type)`` → whether to yield a packet; with an index, the
                others are not even read (``select=lambda n, t: t == TOKEN`` reads only
                TOKEN packets).
        """
        if self._offsets is not None:
            which = range(len(self._index_entries)) if select is None else \
                [i for i, e in enumerate(self._index_entries) if select(e[0], e[1])]
            yield from self._parse_entries(which)
            # END sits between the last entry and the INDEX; walk there.
            off = self.first_packet
            if self._index_entries:
                last = len(self._index_entries) - 1
                pk = self._parse(self._index_entries[last][6], span=self._spans[last], lazy=True)
                assert pk is not None
                off = pk.end
            while off < self._index_offset:
                pk = self._parse(off)
                assert pk is not None
                if select is None or select(pk.name, pk.type):
                    yield pk
                off = pk.end
            if include_index:
                idx = self._parse(self._index_offset, span=self.size - 16 - self._index_offset)
                assert idx is not None
                yield idx
        else:
            for pk in self._scan():
                if (pk.type != INDEX or include_index) and (select is None or select(pk.name, pk.type)):
                    yield pk

    def __iter__(self) -> Iterator[Tensor]:
        """Iterate tensors in sequence order (PART packets reassembled; incomplete tensors
        at a torn end are skipped)."""
        return self._tensors(None)

    def tensors_where(self, keep: Callable[[str, int], bool]) -> Iterator[Tensor]:
        """The tensors whose packets ``keep(name, forward)`` selects, in sequence order
        (PART packets reassembled, as by iteration).

        With an index the other packets are not even read; without one (a stream cut before
        its end) every packet is read and CRC-checked, and only the selected ones become
        tensors.

        Args:
            keep: ``keep(name, forward)`` → whether the tensor's packets are wanted.

        Example:
            >>> step7 = list(reader.tensors_where(lambda name, fwd: fwd == 7))  # doctest: +SKIP
        """
        return self._tensors(None, keep)

    def _tensors(self, name: Optional[str], keep: Optional[Callable[[str, int], bool]] = None) -> Iterator[Tensor]:
        # Same rules as the Go reader: the parts of one tensor follow each other in order
        # among that module's packets; a gap (a dropped part, a cut stream) makes the tensor
        # incomplete: counted in ``incomplete_tensors``, never returned.
        pending: Dict[str, List[Packet]] = {}
        incomplete = 0
        for pk in self._packet_source(name, keep):
            if pk.type != TENSOR or (name is not None and pk.name != name) or \
                    (keep is not None and not keep(pk.name, pk.forward)):
                continue
            if not pk.is_part:
                yield Tensor([pk])
                continue
            parts = pending.get(pk.name)
            if parts is not None:
                last = parts[-1]
                if (pk.part_offset != last.part_offset + last.raw_len or pk.tensor_len != last.tensor_len
                        or pk.dtype_id != last.dtype_id or pk.shape != last.shape):
                    incomplete += 1
                    del pending[pk.name]
                    parts = None
            if parts is None:
                if pk.part_offset != 0:
                    incomplete += 1
                    continue
                parts = pending[pk.name] = []
            parts.append(pk)
            if pk.part_offset + pk.raw_len == pk.tensor_len:
                del pending[pk.name]
                yield Tensor(parts)
        self.incomplete_tensors = incomplete + len(pending)

    def _check_entry(self, pk: Packet, entry: Tuple[str, int, int, int, int, int, int]) -> None:
        name, typ, fl, seq, step, fwd, off = entry
        if (pk.name, pk.type, pk.flags, pk.seq, pk.step, pk.forward) != (name, typ, fl, seq, step, fwd):
            raise StreamFormatError(f"{self.path}: INDEX entry disagrees with the packet it points at", off)

    def _packet_source(self, name: Optional[str],
                       keep: Optional[Callable[[str, int], bool]] = None) -> Iterator[Packet]:
        if self._offsets is not None and (name is not None or keep is not None):
            yield from self._parse_entries(
                [i for i, e in enumerate(self._index_entries)
                 if e[1] == TENSOR and (name is None or e[0] == name) and (keep is None or keep(e[0], e[5]))])
            return
        yield from self.packets()

    def entries(self) -> List[IndexEntry]:
        """The footer index, read without touching any packet (empty when not :attr:`indexed`)."""
        return [IndexEntry(*e, span) for e, span in zip(self._index_entries, self._spans)]

    @property
    def index_offset(self) -> Optional[int]:
        """Where the INDEX packet starts (None when not :attr:`indexed`)."""
        return self._index_offset if self.indexed else None

    @classmethod
    def _packets_in(cls, data: Union[bytes, memoryview], offset: int, size: int, path: str) -> List[Packet]:
        """Parse the whole packets held by ``data``, bytes ``[offset, offset + len(data))`` of
        stream ``path`` (``size`` bytes): a range fetched on its own (a chunk of a
        manifest), CRC-checked, without the stream's header or index."""
        r = cls.__new__(cls)
        r.path, r.size, r._remote = path, size, False
        r._src = r.source = _SliceSource(path, data, offset, size)
        out = []
        off, stop = offset, offset + len(data)
        while off < stop:
            pk = r._parse(off)
            assert pk is not None
            if pk.end > stop:
                raise StreamFormatError(f"{path}: packet at {off} runs past the range [{offset}, {stop})", off)
            out.append(pk)
            off = pk.end
        return out

    def tensors(self, name: Optional[str] = None) -> List[Tensor]:
        """The tensors of module ``name`` (every tensor when None), in sequence order."""
        return list(self._tensors(name))

    def names(self) -> List[str]:
        """Module names with at least one TENSOR packet, in first-seen order."""
        seen: Dict[str, None] = {}
        if self._offsets is not None:
            for e in self._index_entries:
                if e[1] == TENSOR:
                    seen.setdefault(e[0])
        else:
            for pk in self._scan():
                if pk.type == TENSOR:
                    seen.setdefault(pk.name)
        return list(seen)

    def end(self) -> Optional[Packet]:
        """The END packet, or None (stream cut short)."""
        last = None
        for pk in self.packets():
            if pk.type == END:
                last = pk
        return last

    def close(self) -> None:
        """Release the mapping and the file (or the remote source's buffers)."""
        src = getattr(self, "_src", None)
        if src is not None:
            src.close()

    def __enter__(self) -> "StreamReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _SliceSource(ByteSource):
    """Bytes ``[base, base + len(data))`` of a stream of ``size`` bytes, fetched elsewhere."""

    def __init__(self, name: str, data: Union[bytes, memoryview], base: int, size: int) -> None:
        self.name, self.size, self._base = name, size, base
        self._data = memoryview(data)

    def read(self, off: int, n: int, ahead: int = 0) -> Union[bytes, memoryview]:
        lo = off - self._base
        if lo < 0 or lo + n > len(self._data):
            n = max(0, min(n, len(self._data) - lo))
            if lo < 0 or n == 0:
                raise StreamFormatError(f"{self.name}: offset {off} is outside the fetched range", off)
        return self._data[lo:lo + n]


MAX_BLOCK_SIZE = 64 << 20


def _loads_meta(raw: bytes) -> Any:
    """Parse metadata JSON as the Go reader does: invalid UTF-8 and an escape of a lone
    surrogate (``"\\udcff"``) are corrupt. ``json`` joins escaped surrogate pairs into one
    code point, so any surrogate left in a parsed string was unpaired."""
    obj = json.loads(raw.decode("utf-8"))
    if b"\\u" in raw:
        _reject_surrogates(obj)
    return obj


def _reject_surrogates(obj: Any) -> None:
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            strs: Iterable[str] = (o,)
        elif isinstance(o, dict):
            strs = o.keys()
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
            continue
        else:
            continue
        for t in strs:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"unpaired surrogate escape in {t!r}") from None


def _check_fields(typ: int, dt: int, shape: Tuple[int, ...], codec: int, flags: int, seq: int, raw_len: int,
                  stored_len: int, part_offset: int, tensor_len: int, block_size: int) -> str:
    """The rules tying header fields together (the same set as the Go reader's
    ``checkFields``). Returns what is wrong, or ``""``."""
    if flags & ~FLAG_PART:
        return f"flags {flags:#x}"
    part = bool(flags & FLAG_PART)
    if typ in (TENSOR, DROP):
        if seq == 0:
            return "seq 0"
        if part:
            if part_offset > tensor_len or raw_len > tensor_len - part_offset:
                return f"part [{part_offset},+{raw_len}) outside tensor_len {tensor_len}"
        elif part_offset != 0 or tensor_len != raw_len:
            return f"not PART but part_offset {part_offset}, tensor_len {tensor_len}, raw_len {raw_len}"
        if typ == TENSOR or dt:
            if dt not in DTYPES:
                return f"dtype {dt}"
            n = DTYPES[dt][1]
            for d in shape:
                n *= d
            if n != tensor_len:
                return f"shape {tuple(shape)} of {DTYPES[dt][0]} is not tensor_len {tensor_len} bytes"
        if typ == DROP and (stored_len or codec or block_size):
            return "DROP with payload/codec"
    else:
        if part or raw_len != stored_len or codec or block_size or part_offset or tensor_len != raw_len:
            return "tensor fields set"
        if typ == TOKEN and seq == 0:
            return "seq 0"
        if typ != TOKEN and seq:
            return f"seq {seq}"
        if typ != INDEX and raw_len:
            return "payload on a packet that has none"
    if typ == TENSOR:
        if codec == CODEC_NONE:
            if block_size or stored_len != raw_len:
                return f"codec none with block_size {block_size}, stored_len {stored_len}, raw_len {raw_len}"
        elif not 1 <= block_size <= MAX_BLOCK_SIZE:
            return f"block_size {block_size} not in 1..{MAX_BLOCK_SIZE}"
    return ""


def _decode_block(codec: int, data: bytes, dtype: str, raw_len: int) -> bytes:
    if codec == CODEC_LZ4:
        import lz4.block

        return lz4.block.decompress(data, uncompressed_size=raw_len)
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len)
    if 16 <= codec <= 63:
        try:
            from . import _activation_codecs
        except ImportError:
            raise UnsupportedCodecError(f"unsupported codec id {codec} (no activation codecs installed)", 0) from None
        return _activation_codecs.decode_block(codec, data, dtype, raw_len)
    raise UnsupportedCodecError(f"unsupported codec id {codec}", 0)


def open_stream(path: Union[str, os.PathLike], storage_options: Optional[Dict[str, Any]] = None) -> StreamReader:
    """Open a strap stream file for reading (also an llm_instrumentation 1.3.1 ``.stream``).

    Args:
        path: the stream file, or a URL of an object (``s3://bucket/key``; ``pip install
            'strap-llm[s3]'``) read by byte range through fsspec: the header and index
            first, then only the packets asked for (docs/OBJECT_STORAGE.md).
        storage_options: for a URL, the fsspec filesystem's options (s3fs:
            ``{"endpoint_url": ..., "key": ..., "secret": ...}``); by default credentials and
            endpoint come from the AWS environment variables and config files.

    Returns:
        a :class:`StreamReader`: iterate it for tensors, ``.tensors(name)``, ``.packets()``,
        ``.metadata``. Use it as a context manager to release the file. A file without the
        ``STRAPSTM`` magic is read as 1.3.1's format by a
        :class:`~llm_instrumentation._legacy131.LegacyStreamReader` (same API, ``legacy``
        True; dtype assumed float16, no shape or step: see that module). An empty file
        reads as a 1.3.1 stream of no packets.

    Raises:
        StreamFormatError: neither a v2 nor a 1.3.1 stream, or corrupt (the message names
            the offset).

    Example:
        >>> with open_stream("run.strap") as r:            # doctest: +SKIP
        ...     for t in r:
        ...         print(t.name, t.shape, t.numpy().mean())
    """
    from . import _legacy131

    src = open_source(path, storage_options)
    try:
        head = bytes(src.read(0, len(FILE_MAGIC), ahead=HEAD_GUESS if src.remote else 0))
        # An empty file: 1.3.1 wrote one for every capture that hooked nothing, so it reads as
        # a 1.3.1 stream of no packets (StreamReader itself, used by resume, still refuses it).
        if not head or _legacy131.is_legacy_header(head):
            if src.remote:
                raise StreamFormatError(f"{os.fspath(path)}: an llm_instrumentation 1.3.1 stream (or empty): "
                                        "1.3.1 streams are read from local files only", 0)
            src.close()
            return _legacy131.LegacyStreamReader(path)  # type: ignore[return-value]
        return StreamReader(path, source=src)
    except BaseException:
        src.close()
        raise
