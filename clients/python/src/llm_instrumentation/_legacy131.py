"""Reader of llm_instrumentation 1.3.1 ``.stream`` files, so :func:`open_stream` reads them too.

1.3.1's format (its docs/STREAM_FORMAT.md): packets back to back, no file header, each
``!HI`` (big-endian u16 ``name_len``, u32 ``data_len``), the UTF-8 module name, then the
payload: the tensor's bytes, compressed as a whole by the capture's codec (an LZ4 frame, a
zstd frame, or raw). fp32 tensors were cast to fp16 first; other dtypes kept their bytes.
Nothing else was recorded: no dtype, no shape, no codec, no step, no checksum.

So this reader:

* finds the codec from each payload's frame magic when every payload of the file starts
  with one (LZ4 ``04 22 4D 18``, zstd ``28 B5 2F FD``), else takes the file as raw;
* reports each payload as a flat ``float16`` tensor (what 1.3.1 wrote for fp32 and fp16
  models; an odd byte count is reported as ``uint8``), tagged ``meta["dtype_assumed"]``;
* gives packets no step or forward (``None``): the file does not say which token a packet
  belongs to (the per-token analysis helpers divide packets evenly when given tokens, as
  1.3.1 did, and flag that as an estimate);
* stops at a torn last packet (``truncated_at``), and refuses a file whose packets do not
  parse (:class:`StreamFormatError` naming the offset);
* reads an empty file as a stream of no packets (1.3.1 left one behind for every capture
  that hooked nothing).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from .errors import StreamFormatError

HEADER = struct.Struct("!HI")
LZ4_MAGIC = b"\x04\x22\x4d\x18"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: ``metadata["format"]`` of a 1.3.1 stream.
FORMAT = "llm_instrumentation-1.3.1"

#: Largest decoded payload accepted. 1.3.1 refused packets over its 128 MiB ring and
#: activations compress ~1.1–1.4×, so a frame claiming more is corrupt, not big.
MAX_RAW = 1 << 30

# Codec ids as in stream.py, so code that looks at ``Packet.codec`` sees the same numbers.
_CODEC_IDS = {"none": 0, "lz4": 1, "zstd": 2}


class LegacyPacket:
    """One 1.3.1 packet, with the attributes of :class:`llm_instrumentation.stream.Packet`
    that a 1.3.1 file can fill (``step`` and ``forward`` are None)."""

    type = 1  # TENSOR
    flags = 0
    is_part = False
    part_offset = 0
    block_size = 0
    step: Optional[int] = None
    forward: Optional[int] = None
    type_name = "TENSOR"

    def __init__(self, reader: "LegacyStreamReader", index: int, offset: int, name: str, payload_start: int,
                 stored_len: int, codec_name: str) -> None:
        self._reader = reader
        self.index = index
        self.seq = index + 1
        self.offset = offset
        self.name = name
        self.payload_start = payload_start
        self.stored_len = stored_len
        self.codec_name = codec_name
        self.codec = _CODEC_IDS[codec_name]
        self._raw_len: Optional[int] = None

    @property
    def end(self) -> int:
        """File offset just after this packet."""
        return self.payload_start + self.stored_len

    def stored(self) -> bytes:
        """The payload as stored."""
        return self._reader._data[self.payload_start:self.end]

    def decode(self) -> bytes:
        """The decompressed payload.

        Raises:
            StreamFormatError: the payload is not a valid frame of its codec.
        """
        try:
            out = decompress_payload(self.codec_name, self.stored())
        except StreamFormatError as e:
            raise StreamFormatError(f"{self._reader.path}: 1.3.1 packet {self.index} ({self.name!r}) {e}",
                                    self.offset) from None
        self._raw_len = len(out)
        return out

    @property
    def raw_len(self) -> int:
        """Decompressed bytes (from the frame header when it says, else by decoding)."""
        if self._raw_len is None:
            self._raw_len = _content_size(self.codec_name, self.stored())
            if self._raw_len is None:
                self.decode()
        assert self._raw_len is not None
        return self._raw_len

    @property
    def tensor_len(self) -> int:
        return self.raw_len

    @property
    def dtype(self) -> str:
        """``"float16"`` (assumed; see the module doc), ``"uint8"`` for an odd byte count."""
        return "float16" if self.raw_len % 2 == 0 else "uint8"

    @property
    def dtype_id(self) -> int:
        from ._dtypes import DTYPES

        return next(i for i, (n, _) in DTYPES.items() if n == self.dtype)

    @property
    def shape(self) -> Tuple[int, ...]:
        """Flat: 1.3.1 stored no shape."""
        return (self.raw_len // 2,) if self.dtype == "float16" else (self.raw_len,)

    @property
    def meta(self) -> Dict[str, Any]:
        return {"dtype_assumed": True, "codec": self.codec_name}

    def __repr__(self) -> str:
        return f"LegacyPacket(index={self.index}, name={self.name!r}, offset={self.offset}, " \
               f"stored_len={self.stored_len}, codec={self.codec_name})"


def decompress_payload(codec: str, data: bytes) -> bytes:
    """One 1.3.1 payload, decompressed (the reader and ``TensorCompressionManager`` share it).

    Args:
        codec: ``"lz4"``, ``"zstd"`` or ``"none"``.
        data: the payload as stored.

    Returns:
        the tensor's bytes.

    Raises:
        StreamFormatError: not a valid frame of ``codec``, or one claiming more than
            :data:`MAX_RAW` bytes (offset 0: the caller knows where the payload was).
    """
    claimed = _content_size(codec, data)
    if claimed is not None and claimed > MAX_RAW:
        raise StreamFormatError(f"claims {claimed} decoded bytes (more than {MAX_RAW})", 0)
    try:
        if codec == "lz4":
            import lz4.frame

            return lz4.frame.decompress(data)
        if codec == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_RAW)
    except Exception as e:
        raise StreamFormatError(f"does not decode as {codec}: {e}", 0) from None
    if codec == "none":
        return bytes(data)
    raise ValueError(f"1.3.1 wrote lz4, zstd or none payloads, not {codec!r}")


def compress_payload(codec: str, raw: bytes, level: Optional[int] = None) -> bytes:
    """Compress bytes as 1.3.1 did: one LZ4 frame (level 1), one zstd frame (level 3), or as is.

    Args:
        codec: ``"lz4"``, ``"zstd"`` or ``"none"``.
        raw: the bytes.
        level: the codec's level (default: 1.3.1's).

    Returns:
        the payload.
    """
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(raw, compression_level=1 if level is None else level)
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3 if level is None else level).compress(raw)
    if codec == "none":
        return bytes(raw)
    raise ValueError(f"1.3.1 wrote lz4, zstd or none payloads, not {codec!r}")


def _content_size(codec: str, data: bytes) -> Optional[int]:
    if codec == "none":
        return len(data)
    try:
        if codec == "lz4":
            import lz4.frame

            info = lz4.frame.get_frame_info(data)
            n = info.get("content_size", 0)
            # 0 means "not recorded" unless the frame really is empty; decode to know.
            return int(n) if n else None
        import zstandard

        n = zstandard.frame_content_size(data)
        return int(n) if n >= 0 else None
    except Exception:
        return None  # decode() reports the real error


def is_legacy_header(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first 8 bytes, or all of a shorter file)
    cannot be a v2 strap stream, whose ``STRAPSTM`` magic it neither has nor begins:
    :func:`open_stream` then reads it as 1.3.1."""
    return not b"STRAPSTM".startswith(head[:8])


class LegacyStreamReader:
    """An open 1.3.1 stream; the reading API of :class:`llm_instrumentation.stream.StreamReader`.

    Attributes:
        path, size, metadata (``{"format", "codec", "dtype_assumed"}``), codec (``"lz4"``,
        ``"zstd"`` or ``"none"``), legacy (True), indexed (False), truncated_at (offset of a
        torn last packet, else None), incomplete_tensors (0: 1.3.1 never split a tensor).
    """

    legacy = True
    indexed = False
    incomplete_tensors = 0
    version = 0  # not a numbered strap format

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = os.fspath(path)
        self._f = open(self.path, "rb")
        self.size = os.fstat(self._f.fileno()).st_size
        # An empty file is a 1.3.1 stream with no packets: 1.3.1 wrote one for every
        # capture that hooked nothing (ATTENTION_ONLY on a Hugging Face model). mmap refuses
        # a 0-byte mapping, so it reads as empty bytes.
        self._data: Any = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
        self.truncated_at: Optional[int] = None
        try:
            spans = self._walk()
        except BaseException:
            self.close()
            raise
        stored = [self._data[s:s + n] for _, _, s, n in spans if n]
        if stored and all(p[:4] == LZ4_MAGIC for p in stored):
            self.codec = "lz4"
        elif stored and all(p[:4] == ZSTD_MAGIC for p in stored):
            self.codec = "zstd"
        elif stored and all(p[:4] in (LZ4_MAGIC, ZSTD_MAGIC) for p in stored):
            self.codec = "mixed"  # a 1.3.1 resume that changed codec: per packet
        else:
            self.codec = "none"
        self._packets: List[LegacyPacket] = []
        for i, (off, name, start, n) in enumerate(spans):
            c = self.codec
            if c == "mixed":
                c = "lz4" if self._data[start:start + 4] == LZ4_MAGIC else "zstd"
            self._packets.append(LegacyPacket(self, i, off, name, start, n, c))
        self.metadata: Dict[str, Any] = {"format": FORMAT, "codec": self.codec, "dtype_assumed": "float16"}

    def _walk(self) -> List[Tuple[int, str, int, int]]:
        d, size = self._data, self.size
        out: List[Tuple[int, str, int, int]] = []
        off = 0
        while off < size:
            if off + HEADER.size > size:
                self.truncated_at = off
                break
            name_len, data_len = HEADER.unpack_from(d, off)
            start = off + HEADER.size + name_len
            if start + data_len > size:
                if not out:
                    raise StreamFormatError(
                        f"{self.path}: bad file magic {bytes(d[:8])!r}: neither a strap stream (STRAPSTM) nor an "
                        f"llm_instrumentation 1.3.1 stream (its first packet would need {name_len + data_len} "
                        f"bytes, the file has {size - off - HEADER.size})", 0)
                self.truncated_at = off
                break
            try:
                name = d[off + HEADER.size:start].decode("utf-8")
            except UnicodeDecodeError:
                raise StreamFormatError(
                    f"{self.path}: 1.3.1 packet at {off}: module name is not UTF-8"
                    + ("" if out else f" (bad file magic {bytes(d[:8])!r}: not a strap stream either)"),
                    off) from None
            out.append((off, name, start, data_len))
            off = start + data_len
        return out

    def packets(self, include_index: bool = False) -> Iterator[LegacyPacket]:
        """Every packet in file order (all are tensors; ``include_index`` has nothing to add)."""
        return iter(self._packets)

    def __iter__(self) -> Iterator[Any]:
        return self._tensors(None)

    def _tensors(self, name: Optional[str]) -> Iterator[Any]:
        from .stream import Tensor

        for pk in self._packets:
            if name is None or pk.name == name:
                yield Tensor([pk])  # type: ignore[list-item]

    def tensors(self, name: Optional[str] = None) -> List[Any]:
        """The tensors of module ``name`` (every tensor when None), in file order."""
        return list(self._tensors(name))

    def names(self) -> List[str]:
        """Module names, in first-seen order (1.3.1's root module is ``""``)."""
        return list(dict.fromkeys(pk.name for pk in self._packets))

    def end(self) -> None:
        """None: 1.3.1 streams have no END packet."""
        return None

    def close(self) -> None:
        """Release the mapping and the file."""
        if isinstance(self._data, mmap.mmap):
            self._data.close()
        self._f.close()

    def __enter__(self) -> "LegacyStreamReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
