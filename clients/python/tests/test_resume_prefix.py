"""The resume check (checkpoint.scan_prefix) over the stream reader, on the Go writer's
golden stream: what it accepts, what it refuses, and that it leaves the descriptor usable."""

from __future__ import annotations

import os
import struct

import pytest
from conftest import TESTDATA

from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation.stream import FILE_HEADER, crc32c, open_stream

GOLDEN = TESTDATA / "stream" / "none_basic.strap"
FP = "abcdef"


def _stream(tmp_path, mutate=None):
    """none_basic.strap with a fingerprint in its client metadata (same length, so every
    packet keeps its offset), the header CRC recomputed."""
    if not GOLDEN.exists():
        pytest.skip("testdata/stream not written yet")
    data = bytearray(GOLDEN.read_bytes())
    meta_len = FILE_HEADER.unpack_from(data)[3]
    meta = bytes(data[FILE_HEADER.size:FILE_HEADER.size + meta_len])
    new = meta.replace(b'"client":"golden-test"', b'"fingerprint":"%s"' % FP.encode())
    assert len(new) == len(meta) and new != meta
    data[FILE_HEADER.size:FILE_HEADER.size + meta_len] = new
    struct.pack_into("<I", data, 16, crc32c(bytes(data[:16]) + new))
    if mutate:
        mutate(data)
    p = tmp_path / "s.strap"
    p.write_bytes(bytes(data))
    return p


def _checkpoint(path, n):
    """A checkpoint after the first ``n`` packets of the stream."""
    with open_stream(path) as r:
        pks = list(r.packets())[:n]
    last = pks[-1]
    return ckpt.Checkpoint(stream=str(path), fingerprint=FP, stream_offset=last.end, packets=n,
                           drops=sum(p.type_name == "DROP" for p in pks), last_seq=last.seq,
                           last_packet_offset=last.offset, last_packet_crc=last.crc,
                           token_count=sum(p.type_name == "TOKEN" for p in pks), forward_count=0)


def _scan(path, ck, want=FP):
    fd = os.open(path, os.O_RDWR)
    try:
        return ckpt.scan_prefix(fd, ck, str(path), want)
    finally:
        os.close(fd)


def test_prefix_accepted_and_tokens_restored(tmp_path):
    p = _stream(tmp_path)
    ck = _checkpoint(p, 5)  # four TENSOR packets, then TOKEN 0
    assert _scan(p, ck) == [{"token_index": 0, "token_id": 42, "token_text": "hi", "position": 0}]
    # The caller's descriptor stays open and the mapping is gone: the file can be cut.
    fd = os.open(p, os.O_RDWR)
    ckpt.scan_prefix(fd, ck, str(p), FP)
    os.ftruncate(fd, ck.stream_offset)
    os.close(fd)
    assert os.path.getsize(p) == ck.stream_offset


@pytest.mark.parametrize("change,match", [
    (lambda ck: setattr(ck, "stream_offset", ck.stream_offset - 8), "not the end of a packet"),
    (lambda ck: setattr(ck, "packets", ck.packets + 1), "packets before the offset"),
    (lambda ck: setattr(ck, "last_packet_crc", ck.last_packet_crc ^ 1), "last packet CRC"),
    (lambda ck: setattr(ck, "last_seq", ck.last_seq + 1), "last packet has seq"),
    (lambda ck: setattr(ck, "fingerprint", "other"), "fingerprint differs"),
    (lambda ck: setattr(ck, "stream_offset", 1 << 40), "shorter than the checkpointed offset"),
])
def test_prefix_mismatch_named(tmp_path, change, match):
    p = _stream(tmp_path)
    ck = _checkpoint(p, 5)
    change(ck)
    with pytest.raises(ckpt.CheckpointError, match=match):
        _scan(p, ck)


def test_damaged_packet_inside_prefix_refused(tmp_path):
    # Every packet of the prefix is CRC-checked, not only the last one: resuming after a
    # damaged packet would append to a stream no reader accepts.
    def flip(data):
        data[442 + 100] ^= 0xFF  # inside the second packet

    good = _stream(tmp_path)
    ck1, ck5 = _checkpoint(good, 1), _checkpoint(good, 5)
    p = _stream(tmp_path, flip)
    assert _scan(p, ck1) == []  # the damage lies after this prefix
    with pytest.raises(ckpt.CheckpointError, match="CRC mismatch"):
        _scan(p, ck5)


def test_bad_header_refused(tmp_path):
    p = _stream(tmp_path, lambda d: d.__setitem__(slice(0, 8), b"NOTSTRAP"))
    ck = ckpt.Checkpoint(stream=str(p), fingerprint=FP, stream_offset=978, packets=5, drops=0, last_seq=5,
                         last_packet_offset=842, last_packet_crc=1, token_count=1, forward_count=0)
    with pytest.raises(ckpt.CheckpointError, match="stream header is not valid"):
        _scan(p, ck)


def _point(path, ck, want=FP):
    fd = os.open(path, os.O_RDWR)
    try:
        return ckpt.resume_point(fd, ck, str(path), want)
    finally:
        os.close(fd)


def _unfinished(tmp_path):
    """The golden stream without its END, INDEX and footer: a capture whose strapd was
    killed (the golden one is complete, and a complete capture is never resumed)."""
    p = _stream(tmp_path)
    with open_stream(p) as r:
        end = r.end()
    assert end is not None and end.meta["status"] == "complete"
    os.truncate(p, end.offset)
    return p


def test_resume_point_refuses_a_complete_stream(tmp_path):
    # Issue 41: the resume point would be TOKEN 0's end; the END (complete), the INDEX and
    # the packets of step 1 would be cut. Without a checkpoint (a clean finish deletes it):
    # refused, nothing changed. With one, a capture stopped by an error: it resumes there.
    p = _stream(tmp_path)
    before = p.read_bytes()
    with pytest.raises(ckpt.CaptureCompleteError, match=r"would cut (\d+) bytes .*back to token 1") as ei:
        _point(p, None)
    assert ei.value.cut_bytes == len(before) - 978
    assert p.read_bytes() == before
    assert _point(p, _checkpoint(p, 2)).point.stream_offset == 978


def test_resume_point_without_checkpoint_is_the_last_intact_token(tmp_path):
    # TOKEN 0 ends at 978; the packets of step 1 after it have no TOKEN: they are cut.
    p = _unfinished(tmp_path)
    rp = _point(p, None)
    assert rp.source == "stream" and rp.floor is None
    assert (rp.point.stream_offset, rp.point.packets, rp.point.last_seq, rp.point.token_count) == (978, 5, 5, 1)
    assert rp.point.forward_count == 1 and rp.point.last_packet_offset == 842
    assert rp.tokens == [{"token_index": 0, "token_id": 42, "token_text": "hi", "position": 0}]
    with pytest.raises(ckpt.CheckpointError, match="fingerprint differs"):
        _point(p, None, want="other")


def test_resume_point_goes_past_an_older_checkpoint(tmp_path):
    p = _unfinished(tmp_path)
    rp = _point(p, _checkpoint(p, 2))
    assert rp.source == "stream" and rp.point.stream_offset == 978 and rp.point.token_count == 1
    assert rp.floor is not None and rp.floor.stream_offset == 578
    at = _point(p, _checkpoint(p, 5))  # the checkpoint is the last intact token
    assert at.source == "checkpoint" and at.point.stream_offset == 978


def test_resume_point_stops_at_a_damaged_packet(tmp_path):
    def flip(data):
        data[705 + 100] ^= 0xFF  # inside the fourth TENSOR, before TOKEN 0

    p = _stream(tmp_path, flip)
    rp = _point(p, None)
    assert rp.source == "stream" and rp.point.stream_offset == 288 and rp.point.token_count == 0 and rp.tokens == []
    # A checkpoint whose prefix holds the damaged packet is refused: it is the floor.
    good = tmp_path / "good"
    good.mkdir()
    ck5 = _checkpoint(_stream(good), 5)
    with pytest.raises(ckpt.CheckpointError, match="CRC mismatch"):
        _point(p, ck5)


def test_resume_point_of_an_empty_file_is_token_0(tmp_path):
    # One rule for both clients (libstrap's scan, common/strap_resume.c): an empty file and no
    # checkpoint (a client killed before strapd wrote the header) is a capture from token 0;
    # with a checkpoint, the data it vouches for is gone.
    p = tmp_path / "empty.strap"
    p.write_bytes(b"")
    rp = _point(p, None)
    assert rp.point.stream_offset == 0 and rp.point.token_count == 0 and rp.tokens == [] and rp.floor is None
    good = tmp_path / "good"
    good.mkdir()
    with pytest.raises(ckpt.CheckpointError, match="shorter than the checkpointed offset"):
        _point(p, _checkpoint(_stream(good), 5))
