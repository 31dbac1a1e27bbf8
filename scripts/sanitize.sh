#!/usr/bin/env bash
# Builds kvserve and the threaded / server tests with a sanitizer and runs
# them; any sanitizer report fails the run, including one inside a
# `kvserve serve` child that a test spawned (KVS_BINARY is the sanitized
# binary of the same build; the tests check its exit status after SIGTERM).
#
#   bash scripts/sanitize.sh thread    # ThreadSanitizer          -> build-tsan
#   bash scripts/sanitize.sh address   # AddressSanitizer + UBSan -> build-asan
#
# Which tests, and why (scripts/test.sh runs both modes after the main suite):
#   test_threadpool     the compute pool's workers and join protocol
#   test_block_pool, test_prefix_hash, test_kv_window
#                       KV bookkeeping the engine thread and the revoke path use
#   test_scheduler      admission, batching, preemption
#   test_engine_loop    the engine thread against submit/cancel/metrics callers
#   test_api_service    the API over an engine loop: several prompts, cancels
#   test_server         every server feature over real sockets, except the
#                       npm SDK and 256-stream tests (see GTEST_FILTER below)
#   test_server_stress  64 streams, hang-ups, a revoke and /metrics at once
#   test_kv_tier        the tier set's worker against offer/prefetch/take/revoke
#   test_tier_server    servers with disk and Redis tiers, Redis killed and frozen
#   test_disagg_transfer, test_disagg_handover
#                       the UCX progress thread against shippers and the engine loop
#   test_serve_device   the serve loop polling the device monitor and handing
#                       shed limits to the engine thread
#   test_chat_store     session files from disk: truncated, tampered, foreign
# Kernel, model, tokenizer and golden tests are single-threaded numerics that
# the normal Release run covers; under a sanitizer they would cost most of
# the time budget for little.
#
# KVS_SANITIZE_TESTS="test_a test_b" overrides the list.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
  thread) dir=build-tsan ;;
  address) dir=build-asan ;;
  *) echo "usage: $0 thread|address" >&2; exit 2 ;;
esac
read -r -a tests <<< "${KVS_SANITIZE_TESTS:-test_threadpool test_block_pool test_prefix_hash test_kv_window \
test_scheduler test_engine_loop test_api_service test_server test_server_stress test_kv_tier test_tier_server \
test_serve_device test_chat_store test_disagg_transfer test_disagg_handover}"

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_SANITIZE="$mode" -DKVS_BUILD_BENCH=OFF \
  -DKVS_BUILD_FUZZ=OFF "${launcher[@]}" >/dev/null
start=$SECONDS
ninja -C "$dir" -j"$(nproc)" kvserve "${tests[@]}"
echo "sanitize $mode: build ${dir} took $((SECONDS - start)) s"

# Reports are fatal: TSan exits 66 after reporting (all races of the run are
# printed first), ASan and UBSan stop at the first one, LSan fails at exit.
export TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 history_size=4"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 detect_stack_use_after_return=1 check_initialization_order=1 \
strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1"
# UCX (linked for disaggregated serving) patches malloc/mmap at load time to
# track memory registrations; those hooks and the sanitizers' own
# interceptors crash each other. Registration tracking only matters for RDMA.
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
# Nor may UCX install its own handlers for fatal signals: TSan then takes
# ordinary frees for calls inside a signal handler.
export UCX_ERROR_SIGNALS=""
# Left to the normal run: the npm SDK test (API shape, not threading) and
# the 256-stream test (minutes under TSan; test_server_stress covers the
# concurrency with 64 streams plus hang-ups and a revoke).
export GTEST_FILTER="-Server.OpenAiSdkConformance:Server.ManyConcurrentStreams"

run=()
if [ "$mode" = thread ] && setarch "$(uname -m)" -R true 2>/dev/null; then
  # TSan's fixed shadow layout clashes with wide mmap randomisation on new
  # kernels ("unexpected memory mapping"); children inherit the setting.
  run=(setarch "$(uname -m)" -R)
fi
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
start=$SECONDS
cd "$dir"
"${run[@]}" ctest --output-on-failure -j1 --timeout 1200 -R "$regex"
echo "sanitize $mode: tests took $((SECONDS - start)) s"
