#!/usr/bin/env bash
# Builds everything and runs every test, in three builds:
#   build/       Release (-O3): the whole ctest suite (unit, golden, CLI and
#                server tests reading ../shared) and a bounded libFuzzer run
#                of the GGUF parser (clang, build-fuzz/).
#   build-tsan/  ThreadSanitizer and
#   build-asan/  AddressSanitizer + UBSan (scripts/sanitize.sh): kvserve and
#                the tests with threads or a server in them (thread pool, KV
#                pool and prefix index, scheduler, engine loop, test_server,
#                test_server_stress); the kernel, model, tokenizer and golden
#                tests are single-threaded numerics and run in Release only.
#                Any sanitizer report, in a test or in a `kvserve serve` it
#                started, fails the run.
# KVS_SKIP_SANITIZERS=1 skips the two sanitizer builds (a quick local run).
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
(cd build && ctest --output-on-failure -j2 --timeout 1800)
if [ "${KVS_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash scripts/sanitize.sh thread
  bash scripts/sanitize.sh address
fi
