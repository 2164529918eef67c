#!/bin/bash
# The resource writer thread's CPU for a GPU's records (CUDA event pairs, stand-ins: no GPU
# needed), before vs after a change, alternating the two trees in one run:
#   BASE=/tmp/base RES=$PWD ROUNDS=5 REPS=5 bench/resources_ab/cuda_writer_ab.sh
# BASE and RES are checkouts whose clients/python/src has its C extension built
# (python setup.py build_ext --inplace in clients/python). Prints each run's JSON line
# (cuda_writer_replay.py), then per tree and level the median of the runs' medians.
set -eu
: "${BASE:?}" "${RES:?}"
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-5}
PY=${PY:-$RES/.venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  # alternate which tree goes first
  if [ $((r % 2)) = 1 ]; then order="$BASE $RES"; else order="$RES $BASE"; fi
  for level in MINIMAL DETAILED; do
    for t in $order; do
      PYTHONPATH=$t/clients/python/src "$PY" "$HERE/cuda_writer_replay.py" "$level" "$REPS" | tee -a "$out"
    done
  done
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for level in ("MINIMAL", "DETAILED"):
    for tree in ("before", "after"):
        rs = [r for r in rows if r["level"] == level and r["tree"] == tree]
        if rs:
            print(f"{level:8} {tree:6} runs={len(rs)} events/token={rs[0]['events_per_token']:.0f} "
                  f"cuda-timed records/token={rs[0]['cuda_timed_records_per_token']:.0f} "
                  f"writer CPU us/token median={statistics.median(r['writer_cpu_us_per_token_median'] for r in rs):.0f} "
                  f"[{min(r['writer_cpu_us_per_token_median'] for r in rs):.0f}-"
                  f"{max(r['writer_cpu_us_per_token_median'] for r in rs):.0f}] "
                  f"us/cuda-timed record={statistics.median(r['writer_cpu_us_per_cuda_record_median'] for r in rs):.2f}")
PY
rm -f "$out"
