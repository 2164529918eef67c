"""An ActivationDataset epoch read from an S3 object against the same epoch read from the
local file (docs/OBJECT_STORAGE.md): same capture, same machine, the S3 server (VersityGW,
posix backend) serving the object from a file on the same disk.

A real capture (real strapd, a small Llama built from a config) of several modules is made
once and uploaded with boto3; then rounds alternate local and s3:// epochs of one module
(float32 batches of ``--rows`` rows). Each is timed in two parts: construction (opening:
the header, the index and the selected packets' headers; a one-off per dataset) and the
epoch proper (iterating every batch), and the bytes fetched over the network are counted.
The s3:// dataset fetches up to ``prefetch`` tensors ahead with threads (its default, 8);
a ``prefetch=0`` epoch is measured too, one ranged GET at a time.

Usage::

    .venv/bin/python clients/python/benchmarks/object_storage_bench.py --strapd bin/strapd \\
        [--versitygw PATH] [--forwards 16] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))  # s3server.py: the tests' VersityGW runner
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_cost import start_strapd  # noqa: E402
from s3server import S3Server, versitygw_bin  # noqa: E402

from llm_instrumentation import capture_activations, open_stream  # noqa: E402
from llm_instrumentation._source import RemoteSource  # noqa: E402
from llm_instrumentation.data import ActivationDataset  # noqa: E402


def capture(strapd: str, d: str, out: Path, forwards: int, batch: int, seq: int, hidden: int, layers: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                                         num_attention_heads=8, num_key_value_heads=4, vocab_size=1000)).eval()
    proc, sock = start_strapd(strapd, d)
    try:
        with torch.no_grad(), capture_activations(model, preset="balanced", output_path=out, socket_path=sock,
                                                  autostart_daemon=False,
                                                  modules=[f"model.layers.{i}" for i in range(layers)]) as fw:
            for _ in range(forwards):
                model(input_ids=torch.randint(0, 1000, (batch, seq)))
        assert fw.summary["drops"] == 0
    finally:
        proc.terminate()
        proc.wait(30)


def epoch(path: str, module: str, rows_per_batch: int, **kw: Any) -> Dict[str, float]:
    t0 = time.perf_counter()
    ds = ActivationDataset(path, modules=module, batch_size=rows_per_batch, dtype=torch.float32, rank=0,
                           world_size=1, **kw)
    t1 = time.perf_counter()
    rows = 0
    for b in ds:
        rows += b["activation"].shape[0]
    t2 = time.perf_counter()
    fetched = sum(r.source.bytes_fetched for r in ds._readers)
    ds.close()
    assert rows == ds.rows
    return {"construct_s": t1 - t0, "iterate_s": t2 - t1, "epoch_s": t2 - t0, "rows": rows,
            "bytes_fetched": fetched}


def fetch_only(srv: S3Server, url: str, ranges: List[Any], rounds: int, direct: bool = True) -> Dict[str, float]:
    """The module's byte ranges fetched alone (the byte source's ``read_many``: concurrent
    ranged GETs through botocore, or with ``direct=False`` through s3fs's ``cat_ranges``), no
    decoding: the transport's own throughput and CPU, client and server, on this machine."""
    from llm_instrumentation._source import RemoteSource

    RemoteSource.direct_s3 = direct
    src = RemoteSource(url, srv.storage_options)
    RemoteSource.direct_s3 = True
    tck = os.sysconf("SC_CLK_TCK")

    def server_cpu() -> float:
        f = Path(f"/proc/{srv.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tck

    n = sum(b - a for a, b in ranges)
    walls, client, server = [], [], []
    for _ in range(rounds):
        c0, s0, t0 = time.process_time(), server_cpu(), time.perf_counter()
        src.read_many([(a, b - a) for a, b in ranges])
        walls.append(time.perf_counter() - t0)
        client.append(time.process_time() - c0)
        server.append(server_cpu() - s0)
    return {"bytes": n, "mb_s": n / statistics.median(walls) / 1e6,
            "client_cpu_s_per_gb": statistics.median(client) / (n / 1e9),
            "server_cpu_s_per_gb": statistics.median(server) / (n / 1e9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strapd", default=str(HERE.parents[2] / "bin" / "strapd"))
    ap.add_argument("--versitygw", default=None, help="default: $STRAP_VERSITYGW or make versitygw's cache path")
    ap.add_argument("--forwards", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="prompts per forward pass")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096, help="rows per dataset batch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.versitygw:
        os.environ["STRAP_VERSITYGW"] = a.versitygw
    vgw = versitygw_bin()
    if not (vgw.is_file() and os.access(vgw, os.X_OK)):
        raise SystemExit(f"versitygw not built at {vgw} (make versitygw, or --versitygw PATH)")
    tmp = tempfile.mkdtemp(prefix="strap-objbench-", dir="/var/tmp")
    srv = None
    try:
        local = Path(tmp) / "cap.strap"
        capture(a.strapd, tmp, local, a.forwards, a.batch, a.seq, a.hidden, a.layers)
        srv = S3Server(vgw)
        t0 = time.perf_counter()
        url = srv.upload(local, "bench", "cap.strap")
        upload_s = time.perf_counter() - t0
        module = "model.layers.1"
        with open_stream(local) as r:
            size = r.size
            module_bytes = sum(p.end - p.offset for p in r.packets() if p.name == module)
            module_raw = sum(p.raw_len for p in r.packets() if p.name == module)
            codec = sorted({p.codec for p in r.packets() if p.name == module})
            ranges = [(p.offset, p.end) for p in r.packets() if p.name == module]
            n_tensors = len(r.tensors(module))
        so = srv.storage_options
        runs: Dict[str, List[Dict[str, float]]] = {"local": [], "s3": [], "s3_prefetch0": [], "s3_fsspec": []}

        def through_fsspec(**kw: Any) -> Dict[str, float]:
            RemoteSource.direct_s3 = False  # the reader before botocore was used directly
            try:
                return epoch(url, module, a.rows, storage_options=so, **kw)
            finally:
                RemoteSource.direct_s3 = True

        epoch(str(local), module, a.rows)  # warm: page cache, imports
        epoch(url, module, a.rows, storage_options=so)
        for _ in range(a.rounds):
            runs["local"].append(epoch(str(local), module, a.rows))
            runs["s3"].append(epoch(url, module, a.rows, storage_options=so))
            runs["s3_prefetch0"].append(epoch(url, module, a.rows, storage_options=so, prefetch=0))
            runs["s3_fsspec"].append(through_fsspec())
        c0 = time.process_time()
        for _ in range(a.rounds):
            epoch(str(local), module, a.rows)
        local_cpu = (time.process_time() - c0) / a.rounds
        transport = fetch_only(srv, url, ranges, a.rounds)
        transport_fsspec = fetch_only(srv, url, ranges, a.rounds, direct=False)
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("construct_s", "iterate_s", "epoch_s")}
               for k, v in runs.items()}
        rows = runs["local"][0]["rows"]
        res = {
            "capture_bytes": size, "module": module, "module_stored_bytes": module_bytes, "module_raw_bytes": module_raw,
            "codec_ids": codec, "cores": os.cpu_count(), "tensors": n_tensors, "rows": rows, "width": a.hidden, "dataset_batch_rows": a.rows, "rounds": a.rounds,
            "upload_s": upload_s, "median": med,
            # throughput ratios (s3:// over local): the epoch proper, and with construction
            "ratio_iterate": med["local"]["iterate_s"] / med["s3"]["iterate_s"],
            "ratio_iterate_prefetch0": med["local"]["iterate_s"] / med["s3_prefetch0"]["iterate_s"],
            "ratio_iterate_fsspec": med["local"]["iterate_s"] / med["s3_fsspec"]["iterate_s"],
            "ratio_with_construction": med["local"]["epoch_s"] / med["s3"]["epoch_s"],
            "local_mb_s": module_raw / med["local"]["iterate_s"] / 1e6,
            "s3_mb_s": module_raw / med["s3"]["iterate_s"] / 1e6,
            "s3_bytes_fetched_per_epoch": statistics.median(r["bytes_fetched"] for r in runs["s3"]),
            "local_epoch_cpu_s_per_gb": local_cpu / (module_raw / 1e9), "transport": transport,
            "transport_fsspec": transport_fsspec,
            "loadavg": os.getloadavg(), "runs": runs,
        }
        print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
