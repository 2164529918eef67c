#!/bin/bash
# The cost of `strapd serve --idle-workers` where other work keeps the host busy: the Go
# producer (bench/ingest) pushes SIZE through two daemons of the same binary, one at normal
# priority and one with --idle-workers, alternating, three rounds per codec, to tmpfs; prints
# GB/s and the daemon's CPU ticks per run (docs/PERFORMANCE.md, "Compression workers under
# SCHED_IDLE"). Usage: bench/idle_workers_ingest.sh [bin/strapd] [512MiB]
set -euo pipefail
B=${1:-bin/strapd}; SIZE=${2:-512MiB}
D=$(mktemp -d /tmp/strap-idle-XXXXXX); S=$(mktemp -d /dev/shm/strap-idle-XXXXXX)
go build -o "$D/ingest" ./bench/ingest
"$B" serve --socket "$D/n.sock" --no-probes --memory-limit 576MiB > "$D/n.log" 2>&1 & NP=$!
"$B" serve --socket "$D/i.sock" --no-probes --memory-limit 576MiB --idle-workers > "$D/i.log" 2>&1 & IP=$!
trap 'kill $NP $IP 2>/dev/null; rm -rf "$D" "$S"' EXIT
sleep 1
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
for codec in zstd lz4 shuffle; do
  for r in 1 2 3; do
    for v in normal idle-workers; do
      if [ $v = normal ]; then P=$NP; sock=$D/n.sock; else P=$IP; sock=$D/i.sock; fi
      c0=$(cpu $P)
      gbps=$("$D/ingest" -socket "$sock" -out "$S/x.strap" -codec $codec -bytes "$SIZE" | tail -1 |
        python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["gbps"])')
      echo "$codec round $r $v: $gbps GB/s, daemon $(( $(cpu $P) - c0 )) CPU ticks, load $(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
