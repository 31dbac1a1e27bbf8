// Subcommands of the `kvserve` binary; each lives in its own cmd_*.cpp and
// registers itself on the CLI11 app. A handler returns the process exit code.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace kvs::cli {

// Set by a subcommand's callback; main() runs it after parsing.
using Runner = std::function<int()>;

void add_generate(CLI::App& app, Runner& run);
void add_tokenize(CLI::App& app, Runner& run);
void add_perplexity(CLI::App& app, Runner& run);
void add_eval(CLI::App& app, Runner& run);  // KV cache policy quality
void add_bench(CLI::App& app, Runner& run);
void add_make_model(CLI::App& app, Runner& run);
void add_convert(CLI::App& app, Runner& run);
void add_plan(CLI::App& app, Runner& run);
void add_probe(CLI::App& app, Runner& run);
void add_kv(CLI::App& app, Runner& run);  // kv-sim, kv-bench
void add_batched_bench(CLI::App& app, Runner& run);  // engine-loop throughput, long bursts
void add_serve(CLI::App& app, Runner& run);  // OpenAI-compatible HTTP server
void add_router(CLI::App& app, Runner& run);  // cache-aware router over serve workers
void add_chat(CLI::App& app, Runner& run);    // interactive terminal chat
void add_wipe(CLI::App& app, Runner& run);    // crypto-shred saved chat sessions

}  // namespace kvs::cli
