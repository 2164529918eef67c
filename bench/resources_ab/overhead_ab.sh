#!/bin/bash
# Same-run A/B of make bench's resource rows (resource_overhead.py), the tree before issue 23
# vs after, alternating, the order flipped each round. BASE: a checkout of the tree before
# (git archive 73a1f9d clients/python | tar -x -C $BASE, then python setup.py build_ext
# --inplace in $BASE/clients/python); RES: this tree (its extensions built in place); OUT: a
# directory for the JSON. docs/PERFORMANCE.md "The resources/ package split" has the run.
set -u
: "${BASE:?}" "${RES:?}" "${OUT:?}"
cd /tmp
PY=${PY:-$RES/.venv/bin/python}
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="base res"; else order="res base"; fi
  for t in $order; do
    if [ $t = base ]; then src=$BASE/clients/python/src; else src=$RES/clients/python/src; fi
    echo "round $round $t start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$src $PY $src/../benchmarks/resource_overhead.py --threads 1 --pairs 3 --workloads prefill,decode \
      --json $OUT/ab-$t-$round.json > $OUT/ab-$t-$round.log 2>&1
    echo "round $round $t end $(date -u +%T) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
