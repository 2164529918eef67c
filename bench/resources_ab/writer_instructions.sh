#!/bin/bash
# Instructions per token of the resource writer thread (and the model's thread), before vs
# after the resources/ split, counted by valgrind's callgrind: independent of the machine's
# load, unlike CPU time. BASE and RES as for overhead_ab.sh; OUT a directory.
#   BASE=/tmp/base73 RES=$PWD OUT=/tmp/wi bench/resources_ab/writer_instructions.sh
# Each tree runs 4 and 20 tokens (after 8 warm-up tokens); per token = (20 − 4) / 16. The
# model's thread's figure varies from run to run under valgrind (waits for the interpreter
# lock are counted where they spin): read the writer's.
set -eu
: "${BASE:?}" "${RES:?}" "${OUT:?}"
mkdir -p "$OUT"
PY=${PY:-$RES/.venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
for t in base res; do
  if [ $t = base ]; then src=$BASE/clients/python/src; else src=$RES/clients/python/src; fi
  for n in 4 20; do
    PYTHONHASHSEED=0 SRC=$src TOKENS=$n PYTHONPATH=$src valgrind --tool=callgrind --separate-threads=yes \
      --callgrind-out-file="$OUT/cg.$t$n" "$PY" "$HERE/writer_instructions.py" >/dev/null 2>"$OUT/err.$t$n.txt" &
  done
done
wait
for t in base res; do
  # thread files: -01 the model's thread; the writer is the last thread the script starts
  w4=$(ls "$OUT"/cg.${t}4-* | sort | tail -1); w20=$(ls "$OUT"/cg.${t}20-* | sort | tail -1)
  a=$(grep -h '^totals' "$w4" | cut -d' ' -f2); b=$(grep -h '^totals' "$w20" | cut -d' ' -f2)
  m4=$(grep -h '^totals' "$OUT/cg.${t}4-01" | cut -d' ' -f2); m20=$(grep -h '^totals' "$OUT/cg.${t}20-01" | cut -d' ' -f2)
  echo "$t writer_instructions_per_token $(( (b - a) / 16 )) model_thread_instructions_per_token $(( (m20 - m4) / 16 ))"
done
