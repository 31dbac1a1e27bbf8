#!/usr/bin/env bash
# kvserve against llama.cpp (the peer), side by side on this machine.
#
#   bash ../shared/peer/build-llama-cpp.sh GIT_DIR      # prints PEER_BIN_DIR
#   bash scripts/bench-vs-peer.sh PEER_BIN_DIR [bench/bench_vs_peer.py options]
#
# Makes the bench models (kvserve F16; Q4_0, Q8_0, Q4_K_M by the peer's
# llama-quantize), runs `kvserve bench` and `llama-bench` interleaved at 1
# and 2 threads (add --batched for batched-bench at B = 1, 4, 16), and prints
# one markdown table with ratios and the CPU model. CI does not run it (the
# peer is not there); a quiet machine is needed for figures that mean much.
set -euo pipefail
cd "$(dirname "$0")/.."
peer=${1:-}
if [ -z "$peer" ]; then
  echo "usage: bash scripts/bench-vs-peer.sh PEER_BIN_DIR [options]" >&2
  echo "  build the peer first: bash ../shared/peer/build-llama-cpp.sh GIT_DIR (prints PEER_BIN_DIR)" >&2
  exit 2
fi
shift
for tool in llama-bench llama-quantize llama-batched-bench; do
  if [ ! -x "$peer/$tool" ]; then
    echo "bench-vs-peer: $peer/$tool not found: PEER_BIN_DIR must be the peer's bin/ folder" >&2
    echo "  (bash ../shared/peer/build-llama-cpp.sh GIT_DIR builds it and prints that folder)" >&2
    exit 2
  fi
done
if [ ! -x ./build/kvserve ]; then
  echo "bench-vs-peer: ./build/kvserve not found: run bash scripts/build.sh first" >&2
  exit 2
fi
exec python3 bench/bench_vs_peer.py --peer "$peer" "$@"
