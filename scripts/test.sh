#!/usr/bin/env bash
# Builds everything and runs every test: the ctest suite (unit, golden,
# CLI tests reading ../shared) and a bounded fuzzing run of the GGUF parser.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [ ! -d ../shared ]; then
  echo "warning: ../shared not found; golden and model tests will fail" >&2
fi
# Bounded libFuzzer run on the GGUF parser (clang build, separate dir).
if command -v clang++ >/dev/null; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVS_BUILD_FUZZ=ON -DKVS_BUILD_TESTS=OFF \
    -DKVS_BUILD_BENCH=OFF >/dev/null
  ninja -C build-fuzz -j"$(nproc)" fuzz_gguf
  mkdir -p build-fuzz/corpus && cp -n fuzz/corpus/gguf/* build-fuzz/corpus/ 2>/dev/null || true
  ./build-fuzz/fuzz_gguf -max_total_time="${KVS_FUZZ_SECONDS:-60}" -rss_limit_mb=2048 -max_len=65536 \
    build-fuzz/corpus fuzz/corpus/gguf 2>&1 | tail -n 3
fi
cd build && ctest --output-on-failure -j2 --timeout 1800
