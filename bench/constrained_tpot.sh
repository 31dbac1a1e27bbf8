#!/usr/bin/env bash
# TPOT with and without constrained decoding, side by side, interleaved
# (free, json-object, free, json-object, ...), greedy and at temperature 1,
# batch 1 and 8 (`kvserve batched-bench`'s per-request TPOT p50 column).
#
#   bash bench/constrained_tpot.sh MODEL [REPS] [BINARY]
set -euo pipefail
model=$1 reps=${2:-3} bin=${3:-build/kvserve}
grep -m1 "model name" /proc/cpuinfo
lscpu | grep -E "^(CPU family|Model):" | tr -s ' ' | paste -sd' '
for r in $(seq "$reps"); do
  for temp in 0 1; do
    for g in "" "--json-object"; do
      out=$("$bin" batched-bench -m "$model" --npl 1,8 -p 32 -n 64 -t 2 --temp "$temp" $g --json 2>/dev/null)
      echo "{\"rep\": $r, \"temp\": $temp, \"grammar\": \"${g:-none}\", \"rows\": $(echo "$out" | python3 -c 'import sys,json; print(json.dumps([{k: x[k] for k in ("b","tpot_ms_p50","s_tg")} for x in json.load(sys.stdin)["rows"]]))')}"
    done
  done
done
