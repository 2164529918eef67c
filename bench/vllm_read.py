"""Reading a vLLM capture back by request: what ``list_requests``, ``load_request`` and
``iter_requests`` cost on a real capture directory (docs/VLLM.md 4).

Prints CPU seconds (this process's, getrusage) for ``list_requests``; ``load_request`` of the
first ``--sample`` requests (per request); and ``iter_requests`` over every request, with the
process's anonymous memory (``RssAnon``) before and at its highest while iterating (the streams
are read through ``mmap``: their pages are page cache, counted in ``RssFile``, not here).

Usage: .venv-vllm/bin/python bench/vllm_read.py DIR [--sample 3] [--module NAME ...]
       (DIR: a ``STRAP_VLLM_OUTPUT`` directory, e.g. the ``caps/`` that bench/vllm_ab.py writes)
"""

from __future__ import annotations

import argparse
import resource


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_anon_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--sample", type=int, default=3, help="requests to time load_request on")
    ap.add_argument("--module", action="append", default=None, help="load only these modules")
    a = ap.parse_args()
    import torch  # noqa: F401  (imported before any timing: the readers' first tensor would import it)

    from llm_instrumentation.vllm import iter_requests, list_requests, load_request

    c = cpu()
    ids = list_requests(a.dir)
    print(f"list_requests: {len(ids)} requests in {cpu() - c:.2f} CPU-s")
    if not ids:
        return
    c = cpu()
    sample = ids[:a.sample]
    for rid in sample:
        load_request(a.dir, rid, a.module)
    per = (cpu() - c) / len(sample)
    print(f"load_request: {per:.3f} CPU-s per request ({len(sample)} timed; all {len(ids)}: ~{per * len(ids):.0f} CPU-s)")
    base = peak = rss_anon_mib()
    c = cpu()
    n = rows = 0
    for r in iter_requests(a.dir, a.module):
        n += 1
        rows += r.positions.numel()
        peak = max(peak, rss_anon_mib())
    took = cpu() - c
    print(f"iter_requests: {n} requests, {rows} rows in {took:.2f} CPU-s ({took / n * 1e3:.1f} ms per request); "
          f"RssAnon {base:.0f} MiB before, {peak:.0f} MiB at most while iterating")


if __name__ == "__main__":
    main()
