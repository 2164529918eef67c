"""Reading captures from object storage (docs/OBJECT_STORAGE.md) against a real S3 server
(VersityGW, tests/s3server.py) and a real capture (real strapd): exact read-back through
``open_stream("s3://...")``, only one module's bytes fetched for ``tensors(name)``, the
chunk manifest, ActivationDataset over objects, and the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
from captest import bits
from conftest import tiny_llama
from datacap import capture_prompts, prompts
from s3server import S3Server, s3  # noqa: F401  (the fixture)

from llm_instrumentation import StreamFormatError, open_stream
from llm_instrumentation.data import ActivationDataset
from llm_instrumentation.manifest import build_manifest, load_manifest, read_chunk_rows, write_manifest

pytestmark = pytest.mark.integration

LAYERS = ["model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"]
BATCHES = [prompts(2, 16, seed=1), prompts(1, 16, seed=2), prompts(2, 16, seed=3), prompts(1, 16, seed=4)]


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Tuple[Path, Dict[str, List[torch.Tensor]]]:
    """One real multi-module capture (4 layers, 4 forward passes), made once for the module."""
    from conftest import Daemon, strapd_bin, short_tmpdir

    b = strapd_bin()
    if not b.is_file():
        pytest.skip(f"strapd binary not built at {b}")
    import shutil

    sock = short_tmpdir()
    d = Daemon(b, sock)
    try:
        out = tmp_path_factory.mktemp("cap") / "multi.strap"
        ref = capture_prompts(tiny_llama(), BATCHES, out, d.socket, preset="balanced", modules=LAYERS)
    finally:
        d.stop()
        shutil.rmtree(sock, ignore_errors=True)
    return out, ref


@pytest.fixture(scope="module")
def url(s3, capture) -> str:  # noqa: F811
    return s3.upload(capture[0], "caps", "runs/multi.strap")


class FetchCounter:
    """Counts the bytes s3fs fetches (its ``_cat_file``, which ``cat_file`` and ``cat_ranges``
    both go through): the fsspec layer, below our reader."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import s3fs

        self.ranges: List[Tuple[int, int]] = []
        orig = s3fs.S3FileSystem._cat_file

        async def counted(fs, path, version_id=None, start=None, end=None, **kw):
            data = await orig(fs, path, version_id=version_id, start=start, end=end, **kw)
            self.ranges.append((start, len(data)))
            return data

        monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", counted)

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.ranges)


def test_read_back_exact(s3, capture, url):  # noqa: F811
    path, ref = capture
    with open_stream(path) as loc, open_stream(url, storage_options=s3.storage_options) as rem:
        assert rem.indexed and rem.source.remote and rem.metadata == loc.metadata
        assert rem.names() == loc.names() and set(LAYERS) <= set(loc.names())
        got_l, got_r = list(loc), list(rem)
        assert len(got_r) == len(got_l) == len(loc.names()) * len(BATCHES)
        for a, b in zip(got_l, got_r):
            assert (a.name, a.seq, a.step, a.forward, a.shape, a.dtype) == (b.name, b.seq, b.step, b.forward,
                                                                             b.shape, b.dtype)
            assert a.raw() == b.raw()
        assert [(p.offset, p.type, p.crc) for p in loc.packets(include_index=True)] == \
            [(p.offset, p.type, p.crc) for p in rem.packets(include_index=True)]
        # and equal to what the modules really produced
        for name in LAYERS:
            ts = rem.tensors(name)
            assert len(ts) == len(ref[name])
            for t, want in zip(ts, ref[name]):
                assert torch.equal(bits(t.tensor()), bits(want))


def test_one_module_fetches_about_its_bytes(s3, capture, url, monkeypatch):  # noqa: F811
    path, _ = capture
    with open_stream(path) as loc:
        name = LAYERS[2]
        module_bytes = sum(p.end - p.offset for p in loc.packets() if p.name == name)
        index_bytes = loc.size - loc.index_offset
        header_bytes = loc.first_packet
        file_bytes = loc.size
    assert module_bytes < file_bytes / 4  # many modules: reading one must not mean reading all
    count = FetchCounter(monkeypatch)
    with open_stream(url, storage_options=s3.storage_options) as rem:
        opened = count.bytes
        ts = rem.tensors(name)
        arrays = [t.numpy() for t in ts]
    assert len(arrays) == len(BATCHES)
    fetched = count.bytes
    # The open reads the file header (+ its read-ahead window) and the index.
    assert opened <= header_bytes + 4096 + index_bytes
    assert fetched <= 1.1 * module_bytes + index_bytes + header_bytes + 4096, (fetched, module_bytes, count.ranges)


def test_corrupt_object_is_an_error(s3, capture):  # noqa: F811
    data = bytearray(capture[0].read_bytes())
    with open_stream(capture[0]) as loc:
        pk = loc.tensors(LAYERS[1])[0].packets[0]
    data[pk.payload_start + 5] ^= 0x40  # one bit of one payload
    bad = capture[0].parent / "bad.strap"
    bad.write_bytes(bytes(data))
    u = s3.upload(bad, "caps", "runs/bad.strap")
    with open_stream(u, storage_options=s3.storage_options) as rem:
        t = rem.tensors(LAYERS[1])[0]  # listed from its header: the payload is not fetched yet
        with pytest.raises(StreamFormatError, match="CRC mismatch"):
            t.raw()


def test_errors_are_clear(s3, monkeypatch):  # noqa: F811
    with pytest.raises(FileNotFoundError, match="no such object"):
        open_stream("s3://caps/runs/none.strap", storage_options=s3.storage_options)
    with pytest.raises(ValueError, match="storage_options given for a local path"):
        open_stream("x.strap", storage_options={"anon": True})
    legacy = Path(__file__).resolve().parents[3] / "testdata" / "compat131" / "lz4.stream"
    u = s3.upload(legacy, "caps", "legacy/lz4.stream")
    with pytest.raises(StreamFormatError, match="1.3.1 streams are read from local files only"):
        open_stream(u, storage_options=s3.storage_options)
    # neither boto3 nor s3fs (a process where they cannot be imported): the error names the
    # extra to install
    code = ("import sys; sys.modules['s3fs'] = None; sys.modules['boto3'] = None\n"
            "from llm_instrumentation import open_stream\n"
            "try:\n    open_stream('s3://caps/runs/multi.strap')\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'strap-llm[s3]'" in out.stdout, (out.stdout, out.stderr)
    # without credentials: a clear error naming the object, not a botocore traceback
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    code = ("from llm_instrumentation import open_stream\n"
            f"try:\n    open_stream('s3://caps/runs/multi.strap', storage_options={{'endpoint_url': {s3.endpoint!r}}})\n"
            "except ConnectionError as e:\n    print('ConnectionError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(env, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent"))
    assert "ConnectionError s3://caps/runs/multi.strap: Unable to locate credentials" in out.stdout, \
        (out.stdout, out.stderr)


def test_credentials_from_environment(s3, url, monkeypatch):  # noqa: F811
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with open_stream(url) as r:  # no storage_options: AWS_* variables, as botocore reads them
        assert set(LAYERS) <= set(r.names())


def test_manifest(s3, capture, url, tmp_path):  # noqa: F811
    path, ref = capture
    m_local = build_manifest(path)
    m = build_manifest(url, s3.storage_options)
    assert m["format"] == "strap-chunk-manifest" and m["version"] == 1 and m["object"] == url
    assert {k: v for k, v in m.items() if k != "object"} == {k: v for k, v in m_local.items() if k != "object"}
    with open_stream(path) as r:
        assert list(m["modules"]) == r.names()
        tens = [p for p in r.packets() if p.type == 1]
        assert [(c["module"], c["offset"], c["length"], c["seq"]) for c in m["chunks"]] == \
            [(p.name, p.offset, p.end - p.offset, p.seq) for p in tens]
        assert m["index"] == {"offset": r.index_offset, "length": r.size - r.index_offset}
    # token ranges: forward f of B × 16 tokens read the B·16 tokens recorded before it
    n_tok = sum(len(b) * 16 for b in BATCHES)
    assert m["tokens"]["count"] == n_tok and m["tokens"]["runs"][0]["first"] == 0
    ends = np.cumsum([len(b) * 16 for b in BATCHES])
    for c in m["chunks"]:
        assert c["tokens"] == [int(ends[c["forward"]] - len(BATCHES[c["forward"]]) * 16), int(ends[c["forward"]])]
    # each chunk read on its own (as another engine would) is the module's tensor
    for name in ref:
        cs = [c for c in m["chunks"] if c["module"] == name]
        for c, want in zip(cs, ref[name]):
            rows = read_chunk_rows(m, [c], s3.storage_options)
            assert np.array_equal(rows, want.reshape(-1, want.shape[-1]).numpy())
    # written beside the object, and read back
    dest = write_manifest(url, storage_options=s3.storage_options)
    assert dest == url + ".manifest.json"
    assert load_manifest(url, s3.storage_options) == json.loads(json.dumps(m))
    # the command line, credentials from the environment
    env = dict(__import__("os").environ, **s3.env)
    out = subprocess.run([sys.executable, "-m", "llm_instrumentation.manifest", str(path), url], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{len(m['chunks'])} chunks of {len(m['modules'])} module(s)" in out.stdout
    assert json.loads(Path(str(path) + ".manifest.json").read_text())["chunks"] == m["chunks"]


def test_dataset_over_objects(s3, capture, url):  # noqa: F811
    path, _ = capture
    kw = dict(modules=LAYERS[1:3], batch_size=24, dtype=torch.float32, rank=0, world_size=1)
    with ActivationDataset(path, **kw) as loc, \
            ActivationDataset([url], storage_options=s3.storage_options, **kw) as rem:
        assert rem.paths == [url] and rem.rows == loc.rows and rem.tokens(0) == loc.tokens(0)
        a, b = list(loc), list(rem)
        assert len(a) == len(b) > 1
        for x, y in zip(a, b):
            assert set(x) == set(y)
            for k in x:
                assert torch.equal(x[k], y[k]), k
    # DataLoader workers (forked) reopen the object
    ds = ActivationDataset([url], storage_options=s3.storage_options, **kw)
    rows = sum(int(b["activation"].shape[0]) for b in
               torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert rows == ds.rows
    ds.close()


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_torchrun_sae_from_s3_equals_single_process(s3, capture, tmp_path):  # noqa: F811
    """``torchrun --nproc_per_node=2`` (gloo) training from two s3:// objects, each rank its
    own shard, equals one process trained on the two ranks' batches concatenated (same
    seed, same data order)."""
    from s3server import _free_port

    from llm_instrumentation.analysis.sparse_autoencoder import SparseAutoencoder, train_sae

    path, _ = capture
    urls = [s3.upload(path, "caps", "ddp/a.strap"), s3.upload(path, "caps", "ddp/b.strap")]
    bs, seed = 16, 3
    kw = dict(modules=LAYERS, batch_size=bs, drop_last=True, shuffle=True, seed=seed, dtype=torch.float32)
    shards = [list(ActivationDataset([path, path], rank=r, world_size=2, **kw)) for r in range(2)]
    steps = min(len(s) for s in shards)
    assert steps >= 8
    tokens = steps * 2 * bs
    out = tmp_path / "sae.safetensors"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(EXAMPLES / "train_sae_ddp.py"),
           *urls, "--module", "model.layers.[0-3]", "--batch-size", str(bs), "--tokens", str(tokens),
           "--seed", str(seed), "--dead-tokens", str(10**9), "--out", str(out)]  # the pattern: LAYERS
    env = dict(__import__("os").environ, **s3.env, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(Path(str(out) + ".report.json").read_text())
    assert rep["world_size"] == 2 and rep["tokens"] == tokens and rep["steps"] == steps

    ref_batches = [torch.cat([shards[0][i]["activation"], shards[1][i]["activation"]]) for i in range(steps)]
    torch.set_num_threads(1)
    ref, ref_rep = train_sae(ref_batches, tokens, seed=seed, dead_tokens=10**9, device="cpu", distributed=False)
    assert ref_rep.steps == steps
    got = SparseAutoencoder.load(str(out))
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(got.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=k)
    # and the training moved the weights (the comparison is not of two initialisations)
    torch.manual_seed(seed)
    init = SparseAutoencoder(ref.d_in, ref.d_sae, kind=ref.kind, k=ref.k)
    assert not torch.allclose(init.W_enc, got.W_enc, atol=1e-4)


def test_dask_scan_equals_numpy(s3, capture):  # noqa: F811
    """Dask arrays and statistics planned from the chunk manifests of two s3:// objects equal
    numpy on the same tensors read locally; the packet dataframe of many streams equals
    the per-stream pandas one."""
    import pandas as pd

    from llm_instrumentation.analysis.scan import module_array, module_statistics, packet_dataframe
    from llm_instrumentation.analysis.visualization import build_packet_dataframe

    path, _ = capture
    urls = [s3.upload(path, "caps", "dask/a.strap"), s3.upload(path, "caps", "dask/b.strap")]
    for u in urls:
        write_manifest(u, storage_options=s3.storage_options)
    ms = [load_manifest(u, s3.storage_options) for u in urls]
    with open_stream(path) as r:
        names = [n for n in r.names() if len(r.tensors(n)[0].shape) in (2, 3)]
        ref = {n: np.concatenate([t.numpy().reshape(-1, t.shape[-1]) for t in r.tensors(n)] * 2) for n in names}
    assert set(LAYERS) <= set(names)
    x = module_array(ms, LAYERS[1], s3.storage_options)
    assert x.shape == ref[LAYERS[1]].shape and x.numblocks[0] == 2 * len(BATCHES)
    assert np.array_equal(x.compute(scheduler="threads"), ref[LAYERS[1]].astype(np.float32))
    stats = module_statistics(urls, storage_options=s3.storage_options, scheduler="threads")
    assert list(stats.index) == names
    for n in names:
        a = ref[n].astype(np.float64)
        norms = np.linalg.norm(a, axis=1)
        want = {"rows": a.shape[0], "width": a.shape[1], "mean": a.mean(), "std": a.std(), "mean_abs": np.abs(a).mean(),
                "max_abs": np.abs(a).max(), "sparsity": (a == 0).mean(), "mean_norm": norms.mean(),
                "norm_q0.5": np.quantile(norms, 0.5), "norm_q0.9": np.quantile(norms, 0.9),
                "norm_q0.99": np.quantile(norms, 0.99)}
        for k, v in want.items():
            assert stats.loc[n, k] == pytest.approx(v, rel=1e-9, abs=1e-12), (n, k)
    ddf = packet_dataframe(urls, storage_options=s3.storage_options)
    got = ddf.compute(scheduler="threads").reset_index(drop=True)
    one = build_packet_dataframe(str(path))
    want = pd.concat([one.assign(stream=i) for i in range(2)], ignore_index=True)
    assert list(got["stream_path"].unique()) == urls
    got = got.drop(columns=["stream_path"])[list(want.columns)]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_export_from_object_equals_local(s3, capture, url, tmp_path, monkeypatch):  # noqa: F811
    """``python -m llm_instrumentation.export`` of an s3:// object (credentials and endpoint
    from the AWS variables) writes the same shards as from the local file."""
    env = dict(__import__("os").environ, **s3.env)
    for src, out in ((str(capture[0]), tmp_path / "loc"), (url, tmp_path / "rem")):
        p = subprocess.run([sys.executable, "-m", "llm_instrumentation.export", "safetensors", src, "--modules",
                            *LAYERS[:2], "--out", str(out), "--no-progress"], env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
    a, b = json.loads((tmp_path / "loc" / "index.json").read_text()), json.loads((tmp_path / "rem" / "index.json").read_text())
    assert b["streams"][0]["path"] == url and a["rows"] == b["rows"] > 0
    from safetensors.torch import load_file

    assert [sh["file"] for sh in a["shards"]] == [sh["file"] for sh in b["shards"]]
    for sh in a["shards"]:
        x, y = load_file(str(tmp_path / "loc" / sh["file"])), load_file(str(tmp_path / "rem" / sh["file"]))
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)
