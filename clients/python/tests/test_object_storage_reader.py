"""The stream reader over s3:// (VersityGW) against the same reader over the local file, on
streams built from the spec (strapfake.StreamWriter via test_stream.write_stream): every
dtype and codec, with and without an index, split tensors (PART packets) in the reader, the
manifest and a Dask array, a header longer than the reader's first guess, and a stream cut
short (scanned in read-ahead windows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from s3server import s3  # noqa: F401  (the fixture)
from test_stream import DTYPES, _tensor, write_stream

from llm_instrumentation import open_stream
from llm_instrumentation.manifest import build_manifest, read_chunk_rows

pytestmark = pytest.mark.integration


def same(local, remote) -> None:
    with open_stream(local) as a, open_stream(remote[0], storage_options=remote[1]) as b:
        assert b.source.remote and (a.indexed, a.truncated_at) == (b.indexed, b.truncated_at)
        pa, pb = list(a.packets(include_index=True)), list(b.packets(include_index=True))
        assert [(p.offset, p.type, p.name, p.seq, p.shape, p.meta, p.crc) for p in pa] == \
            [(p.offset, p.type, p.name, p.seq, p.shape, p.meta, p.crc) for p in pb]
        ta, tb = list(a), list(b)
        assert [t.name for t in ta] == [t.name for t in tb]
        for x, y in zip(ta, tb):
            assert x.raw() == y.raw()
        for n in a.names():
            assert [t.raw() for t in a.tensors(n)] == [t.raw() for t in b.tensors(n)]
        assert (a.truncated_at, a.incomplete_tensors) == (b.truncated_at, b.incomplete_tensors)


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("index", [True, False])
def test_all_dtypes(s3, tmp_path, codec, index):  # noqa: F811
    ts = [(f"m.{i}", _tensor(dt, seed=i), None) for i, dt in enumerate(DTYPES)]
    ts.append(("zeros", torch.zeros(300, 4), None))
    # meta longer than the 4 KiB the reader fetches first for a header
    ts.append(("long_meta", torch.zeros(2, 3000, 2), {"positions": list(range(3000)), "dim": 1}))
    p = write_stream(tmp_path / "s.strap", ts, codec=codec, index=index)
    url = s3.upload(p, "reader", f"dtypes-{codec}-{index}.strap")
    same(p, (url, s3.storage_options))


def test_parts_reader_manifest_dask(s3, tmp_path):  # noqa: F811
    big = _tensor(torch.float32, (40, 33), seed=3)
    ts = [("a", _tensor(torch.float32, (2, 4)), None), ("big", big, None), ("a", _tensor(torch.float32, (3, 4)), None),
          ("big", big * 2, None)]
    p = write_stream(tmp_path / "p.strap", ts, codec="zstd", parts=1000)
    url = s3.upload(p, "reader", "parts.strap")
    same(p, (url, s3.storage_options))
    m = build_manifest(url, s3.storage_options)
    bigs = [c for c in m["chunks"] if c["module"] == "big"]
    assert len(bigs) == 12 and all(c["part"] is not None for c in bigs) and m["modules"]["big"]["tensors"] == 2
    assert bigs[0]["part"] == {"offset": 0, "tensor_len": 40 * 33 * 4}
    from llm_instrumentation.analysis.scan import module_array, tensor_chunks

    groups = tensor_chunks(m, "big")
    assert [len(g) for g in groups] == [6, 6]
    np.testing.assert_array_equal(read_chunk_rows(m, groups[1], s3.storage_options), (big * 2).numpy())
    x = module_array([m], "big", s3.storage_options).compute(scheduler="sync")
    np.testing.assert_array_equal(x, torch.cat([big, big * 2]).numpy())
    with pytest.raises(ValueError, match="do not make tensor"):
        read_chunk_rows(m, groups[0][:5], s3.storage_options)


def test_cut_short_stream_scanned(s3, tmp_path):  # noqa: F811
    ts = [(f"m{i % 3}", _tensor(torch.float32, (64, 64), seed=i), None) for i in range(12)]
    p = write_stream(tmp_path / "c.strap", ts, codec="lz4", finish=None)
    data = p.read_bytes()
    cut = tmp_path / "cut.strap"
    cut.write_bytes(data[:len(data) - 100])  # the last packet torn
    url = s3.upload(cut, "reader", "cut.strap")
    same(cut, (url, s3.storage_options))
    with open_stream(url, storage_options=s3.storage_options) as r:
        assert len(list(r)) == 11 and not r.indexed and r.truncated_at is not None
    m = build_manifest(url, s3.storage_options)
    assert m["index"] is None and m["truncated_at"] is not None and len(m["chunks"]) == 11


def _outcome(path, so=None) -> str:
    from llm_instrumentation import StreamFormatError

    try:
        with open_stream(path, storage_options=so) as r:
            n = sum(len(t.raw()) for t in r) + sum(1 for _ in r.packets(include_index=True))
            return f"ok {n} {r.indexed} {r.truncated_at}"
    except StreamFormatError:
        return "error"


def test_damage_found_as_on_a_file(s3, tmp_path):  # noqa: F811
    """One flipped bit anywhere: reading the object fully (every packet listed, every tensor
    decoded) fails exactly when reading the file does. Over object storage a payload's CRC
    is checked when it is fetched, not when it is listed: the same damage, found later."""
    import random

    ts = [(f"m{i % 2}", _tensor(torch.float32, (24, 24), seed=i), {"i": i}) for i in range(5)]
    good = write_stream(tmp_path / "g.strap", ts, codec="lz4").read_bytes()
    rng = random.Random(7)
    bad_seen = 0
    for k in range(40):
        data = bytearray(good)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        p = tmp_path / f"d{k}.strap"
        p.write_bytes(bytes(data))
        url = s3.upload(p, "reader", f"damaged/{k}.strap")
        local, remote = _outcome(p), _outcome(url, s3.storage_options)
        assert local == remote, (pos, local, remote)
        bad_seen += local == "error"
    assert bad_seen >= 30  # nearly every byte is under a CRC


def test_large_payload_fetched_whole_exact_and_checked(s3, tmp_path):  # noqa: F811
    """A payload far larger than the bytes that came with its header is fetched whole (its
    first bytes again) instead of joined to them: the same bytes as the file, one range
    request, ≤ 1/64 more bytes, and a flipped bit in its first bytes (those fetched twice)
    or far into it still found by the packet's CRC."""
    from llm_instrumentation import StreamFormatError
    from llm_instrumentation.stream import HEAD_GUESS, REFETCH_PREFIX_RATIO

    x = _tensor(torch.float32, (256, 512), seed=11)  # 512 KiB, codec none
    p = write_stream(tmp_path / "big.strap", [("big", x, None), ("small", _tensor(torch.float32, (3, 4)), None)])
    with open_stream(p) as r:
        pk = r.tensors("big")[0].packets[0]
        start, stored = pk.payload_start, pk.stored_len
    assert stored >= REFETCH_PREFIX_RATIO * HEAD_GUESS
    url = s3.upload(p, "reader", "big.strap")
    same(p, (url, s3.storage_options))
    with open_stream(url, storage_options=s3.storage_options) as r:
        t = r.tensors("big")[0]
        before, reqs = r.source.bytes_fetched, r.source.requests
        assert t.raw() == x.numpy().tobytes()
        assert r.source.requests - reqs == 1 and r.source.bytes_fetched - before == stored
    good = p.read_bytes()
    for at in (start + 5, start + stored - 7):
        data = bytearray(good)
        data[at] ^= 0x10
        bad = tmp_path / f"bad{at}.strap"
        bad.write_bytes(bytes(data))
        url = s3.upload(bad, "reader", f"big-bad-{at}.strap")
        with open_stream(url, storage_options=s3.storage_options) as r:
            with pytest.raises(StreamFormatError, match="CRC mismatch"):
                r.tensors("big")[0].raw()


def test_server_killed_mid_epoch_is_an_error_then_reads_again(tmp_path):
    """The S3 server SIGKILLed while an ActivationDataset epoch runs: the epoch fails with a
    ConnectionError naming the object (no short epoch passed off as whole); restarted, a new
    epoch reads every row."""
    from s3server import S3Server, versitygw_bin

    from llm_instrumentation.data import ActivationDataset

    pytest.importorskip("s3fs")
    if not versitygw_bin().is_file():
        pytest.skip(f"versitygw not built at {versitygw_bin()} (make versitygw)")
    ts = [("m", _tensor(torch.float32, (2, 64, 32), seed=i), None) for i in range(12)]
    p = write_stream(tmp_path / "k.strap", ts, codec="lz4")
    srv = S3Server(versitygw_bin())
    try:
        url = srv.upload(p, "killed", "k.strap")
        so = srv.storage_options
        ds = ActivationDataset(url, batch_size=16, rank=0, world_size=1, storage_options=so, prefetch=2)
        it = iter(ds)
        next(it)
        srv.kill()
        with pytest.raises(ConnectionError, match="s3://killed/k.strap"):
            for _ in it:
                pass
        srv.start()
        assert sum(b["activation"].shape[0] for b in ds) == ds.rows == 12 * 128
        ds.close()
    finally:
        srv.stop()
