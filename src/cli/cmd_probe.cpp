// `kvserve probe`: measures this machine's memory read bandwidth and peak
// arithmetic rates, prints them and saves a profile for `kvserve plan`.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "tools/probe.h"
#include "tools/progress.h"
#include "tools/units.h"

namespace kvs::cli {
namespace {

struct ProbeArgs {
  std::string out, size = "1GiB", kernels = "f16,bf16,q8_0,q4_0,q4_k,q5_k,q6_k";
  int threads = 0, runs = 5;
  double seconds = 0.2;
  bool json = false, no_save = false;
};

// Where the profile will be saved, checked before the minutes of measuring
// (a directory, or a folder this user cannot write, failed only at the end).
void check_profile_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw std::invalid_argument("the profile path " + path + " is a directory; name a file (e.g. " +
                                (fs::path(path) / "profile.json").string() + ")");
  // The nearest folder that exists is where save_profile writes or creates.
  fs::path dir = fs::path(path).parent_path();
  while (!dir.empty() && !fs::exists(dir, ec)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::invalid_argument("cannot write the profile under " + dir.string() +
                                "; choose another path with -o or pass --no-save");
}

int run_probe_cmd(const ProbeArgs& a) {
  if (!a.no_save) check_profile_path(a.out.empty() ? tools::default_profile_path() : a.out);
  tools::ProbeOptions opt;
  opt.buffer_bytes = tools::parse_size(a.size);
  opt.max_threads = a.threads;
  opt.runs = a.runs;
  opt.flops_seconds = a.seconds;
  opt.kernel_types.clear();
  if (a.kernels != "none") {
    std::string cur;
    for (char ch : a.kernels + ",") {
      if (ch == ',') {
        if (!cur.empty()) opt.kernel_types.push_back(cur);
        cur.clear();
      } else if (ch != ' ') {
        cur += ch;
      }
    }
  }
  // On a terminal a bar counts the measurements; in a log each one is a line.
  tools::Progress bar("probe", tools::probe_stages(opt));
  int64_t done = 0;
  const auto log = [&](const std::string& s) {
    if (bar.enabled()) bar.update(++done, s.substr(0, 60));
    else std::fprintf(stderr, "  %s\n", s.c_str());
  };
  const tools::HardwareProfile p = tools::run_probe(opt, log);
  bar.finish();
  if (a.json) std::cout << tools::profile_to_json(p).dump(2) << "\n";
  else std::cout << tools::format_profile(p);
  if (!a.no_save) {
    const std::string path = a.out.empty() ? tools::default_profile_path() : a.out;
    tools::save_profile(p, path);
    std::fprintf(stderr, "saved profile to %s (use: kvserve plan --profile %s)\n", path.c_str(), path.c_str());
  }
  return 0;
}

}  // namespace

void add_probe(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ProbeArgs>();
  CLI::App* c = app.add_subcommand(
      "probe",
      "Measure this machine for `kvserve plan`: memory read bandwidth (multi-threaded streaming read of a "
      "buffer much larger than the cache), peak ops/s of the FP32 FMA, BF16 dot and INT8 dot paths per "
      "thread count, core count, and the engine's own matmul per weight type (weight bytes/s at n=1, "
      "ops/s at n=16 and n=128), which `plan` uses for its expected decode rate. With AMX: the int8 tile peak, "
      "the bf16 one where AMX-BF16 exists (the roofline of --prefill-precision bf16), the FP32 FMA rate while "
      "tile products run (the exact tile kernels' float chain, which `bench` counts in its roofline), and, per "
      "AMX weight type, the batch n from which tiles beat VNNI over the measured batches (applied to later runs). Prints the "
      "figures and saves a JSON profile.");
  c->add_option("-o,--out", a->out, "profile path (default: $KVS_PROFILE or ~/.config/kvserve/profile.json)");
  c->add_option("--size", a->size, "bandwidth buffer size; keep it far above the last-level cache")->capture_default_str();
  c->add_option("--threads", a->threads, "most threads to use (default: every logical core)")->check(CLI::NonNegativeNumber);
  c->add_option("--runs", a->runs, "bandwidth passes per thread count (best is kept)")->capture_default_str()->check(CLI::Range(1, 1000));
  c->add_option("--seconds", a->seconds, "duration of each compute measurement")->capture_default_str()->check(CLI::Range(0.001, 60.0));
  c->add_option("--kernels", a->kernels,
                "weight types whose kvs::matmul is timed (comma-separated ggml names), or none")
      ->capture_default_str();
  c->add_flag("--json", a->json, "print the profile as JSON");
  c->add_flag("--no-save", a->no_save, "only print, do not write the profile");
  c->callback([a, &run] { run = [a] { return run_probe_cmd(*a); }; });
}

}  // namespace kvs::cli
