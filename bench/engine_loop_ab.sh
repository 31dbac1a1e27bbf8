#!/usr/bin/env bash
# Old engine loop against new, side by side on one machine, interleaved
# (A B A B): /metrics and 429 latency while a long prefill runs
# (bench/latency_under_prefill.py), and engine-loop decode throughput
# (`kvserve batched-bench`, aggregate decode S_TG). One JSON line per run.
#
#   bash bench/engine_loop_ab.sh OLD_BINARY NEW_BINARY MODEL [REPS] [PROMPT_WORDS]
#   bash bench/engine_loop_ab.sh /tmp/kvserve-old build/kvserve /tmp/bench-1.1b-q8_0.gguf 2 1900
set -euo pipefail
old=$1 new=$2 model=$3 reps=${4:-2} words=${5:-1900}
here=$(cd "$(dirname "$0")" && pwd)
grep -m1 "model name" /proc/cpuinfo
lscpu | grep -E "^(CPU family|Model):" | tr -s ' ' | paste -sd' '
latency() {  # binary label
  local port log pid
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  log=$(mktemp)
  "$1" serve -m "$model" --port "$port" --ctx 4096 --max-seqs 1 --max-queue 0 --max-request-share 1 -t 2 \
    > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "listening on" "$log" && break; sleep 0.1; done
  echo "{\"binary\": \"$2\", \"latency\": $(python3 "$here/latency_under_prefill.py" --url "http://127.0.0.1:$port" \
       --prompt-words "$words")}"
  kill "$pid"; wait "$pid" || true; rm -f "$log"
}
decode() {  # binary label
  echo "{\"binary\": \"$2\", \"batched\": $("$1" batched-bench -m "$model" --npl 1,4,16 -p 128 -n 32 -t 2 --json 2>/dev/null)}"
}
for _ in $(seq "$reps"); do
  latency "$old" old; latency "$new" new
  decode "$old" old; decode "$new" new
done
