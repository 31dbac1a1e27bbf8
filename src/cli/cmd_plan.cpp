// `kvserve plan`: KV-cache sizing, capacity and decode roofline for a model
// (GGUF metadata or a preset) on a hardware profile. Hardware figures come
// from, in increasing priority: the default profile if one exists, --profile
// or --probe, then explicit --mem / --bandwidth / --flops.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "tools/plan.h"
#include "tools/presets.h"
#include "tools/probe.h"
#include "tools/units.h"

namespace kvs::cli {
namespace {

struct PlanArgs {
  std::string model, preset, weights = "f16";
  std::string mem, bandwidth, flops, profile, scratch;
  std::string tier_disk_read = "2GB/s", tier_redis_read = "1.25GB/s";
  std::string link = "25GB/s";
  bool probe = false, json = false, weights_given = false;
  std::string kv_type = "f16", svg_dir;
  int block_size = 16;
  int64_t batch = 1, ctx = 0, prompt = -1, max_tokens = -1;
  double headroom = 0.05;
  int max_step_tokens = 512;
};

// Streamed matrices by weight type, from the tensor table: every 2-D tensor
// but an untied token_embd (gathered a row per token, never streamed).
std::vector<tools::WeightPart> weight_mix_from_gguf(const std::string& path, bool tied_output) {
  auto f = GgufFile::open(path);
  std::map<std::string, tools::WeightPart> by;
  for (const auto& t : f->tensors()) {
    if (t.dims.size() < 2 || (t.name == "token_embd.weight" && !tied_output)) continue;
    std::string n = type_name(t.type);
    for (char& c : n) c = char(std::tolower(static_cast<unsigned char>(c)));
    auto& w = by[n];
    w.type = n;
    w.bytes += double(t.nbytes);
    w.params += double(t.n_elements());
  }
  std::vector<tools::WeightPart> out;
  for (auto& [n, w] : by) out.push_back(w);
  return out;
}

tools::Hardware resolve_hardware(const PlanArgs& a) {
  using namespace tools;
  Hardware hw;
  if (a.probe) {
    std::fprintf(stderr, "probing this machine (as kvserve probe; a few seconds)...\n");
    hw = hardware_from_profile(run_probe(ProbeOptions{}), "probe");
  } else if (!a.profile.empty()) {
    hw = hardware_from_profile(load_profile(a.profile), "profile " + a.profile);
  } else if (std::filesystem::exists(default_profile_path())) {
    hw = hardware_from_profile(load_profile(default_profile_path()), "profile " + default_profile_path());
  }
  // Say where each figure came from, so a plan can be reproduced.
  std::string src = hw.source;
  const auto from = [&](const char* what, const std::string& where) {
    src += (src.empty() ? "" : "; ") + std::string(what) + " from " + where;
  };
  if (!a.mem.empty()) hw.mem_bytes = parse_size(a.mem), from("memory", "--mem");
  else if (hw.mem_bytes == 0) hw.mem_bytes = machine_memory_bytes(), from("memory", "this machine's RAM");
  if (!a.bandwidth.empty()) hw.bandwidth = parse_bandwidth(a.bandwidth), from("bandwidth", "--bandwidth");
  if (!a.flops.empty()) {
    hw.flops_fp32 = hw.flops_bf16 = hw.flops_int8 = parse_flops(a.flops);
    from("compute", "--flops");
  }
  hw.source = src;
  return hw;
}

// A request must fit one sequence: refused here, before the plan prints,
// rather than planned at more blocks than a sequence can hold. The default
// context is make_plan's: min(2048, the trained context).
void check_request_fits(const PlanArgs& a, const tools::ModelShape& m) {
  const int64_t ctx = a.ctx > 0 ? a.ctx : (m.n_ctx > 0 ? std::min<int64_t>(2048, m.n_ctx) : 2048);
  const std::string where =
      a.ctx > 0 ? "--ctx " + std::to_string(ctx) : "the default context of " + std::to_string(ctx);
  if (a.prompt > ctx)
    throw std::invalid_argument("--prompt " + std::to_string(a.prompt) + " does not fit " + where +
                                " tokens per sequence: raise --ctx or lower --prompt");
  if (a.prompt >= 0 && a.max_tokens >= 0 && a.prompt + a.max_tokens > ctx)
    throw std::invalid_argument("--prompt " + std::to_string(a.prompt) + " + --max-tokens " +
                                std::to_string(a.max_tokens) + " does not fit " + where +
                                " tokens per sequence: raise --ctx or lower them");
}

int run_plan(const PlanArgs& a) {
  using namespace tools;
  // Checked before any work: --mem 0 would otherwise plan, print and then fail.
  if (!a.mem.empty() && parse_size(a.mem) == 0)
    throw std::invalid_argument("--mem must be more than 0 bytes (e.g. --mem 24GiB)");
  PlanInput in;
  if (!a.model.empty()) {
    if (a.weights_given) throw std::invalid_argument("--weights applies to presets; a GGUF's weight types are read from the file");
    in.model = shape_from_gguf(a.model);
    in.weight_mix = weight_mix_from_gguf(a.model, in.model.tied_output);
  } else {
    in.model = priced_shape(find_preset(a.preset), parse_weight_quant(a.weights));
  }
  check_request_fits(a, in.model);
  in.hw = resolve_hardware(a);
  in.kv = parse_kv_format(a.kv_type);
  in.block_size = a.block_size;
  in.batch = a.batch;
  in.ctx = a.ctx;
  in.prompt = a.prompt;
  in.max_tokens = a.max_tokens;
  in.headroom = a.headroom;
  in.max_step_tokens = a.max_step_tokens;
  in.disk_read_bps = parse_bandwidth(a.tier_disk_read);
  in.redis_read_bps = parse_bandwidth(a.tier_redis_read);
  in.link_bps = parse_bandwidth(a.link);
  if (!a.scratch.empty()) in.scratch_bytes = int64_t(parse_size(a.scratch));
  const PlanResult p = make_plan(in);
  if (a.json) std::cout << plan_to_json(p).dump(2) << "\n";
  else std::cout << format_plan(p);
  if (!a.svg_dir.empty()) {
    for (const auto& f : write_plan_plots(p, a.svg_dir)) std::fprintf(stderr, "wrote %s\n", f.c_str());
  }
  if (!p.capacity_error.empty()) {
    std::fprintf(stderr, "kvserve: error: %s\n", p.capacity_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, Runner& run) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* c = app.add_subcommand(
      "plan",
      "KV-cache sizing, capacity and decode roofline for a model on some hardware: KV bytes per token "
      "(and if the model were MHA / MQA), cache size at batch x context, the context where the cache "
      "outgrows the weights, max concurrent sequences for a memory budget, predicted decode tok/s per "
      "batch size and where KV reads overtake weight reads.");
  auto* m = c->add_option("-m,--model", a->model, "GGUF model (metadata and tensor table only; no weights are read)");
  auto* pr = c->add_option("--preset", a->preset, "built-in model shape: " + tools::preset_names());
  m->excludes(pr);
  auto* wq = c->add_option("--weights", a->weights, "weight storage to price a preset at: f32, f16, bf16, q8_0, q6_k, q4_k, q4_0")
      ->capture_default_str();
  c->add_option("--mem", a->mem, "memory budget, e.g. 24GiB (default: the profile's, else this machine's RAM)");
  c->add_option("--bandwidth", a->bandwidth, "memory read bandwidth, e.g. 80GB/s");
  c->add_option("--flops", a->flops, "peak compute rate for every path, e.g. 1T or 800G");
  auto* pf = c->add_option("--profile", a->profile, "hardware profile written by `kvserve probe`");
  auto* pb = c->add_flag("--probe", a->probe, "measure this machine now instead of reading a profile");
  pf->excludes(pb);
  c->add_option("--kv-type", a->kv_type, "KV cache element type: f32, f16, bf16, int8[/gN], int4[/gN]")->capture_default_str();
  c->add_option("--block-size", a->block_size, "KV block size in tokens")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--batch", a->batch, "batch size B for cache size and crossover")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--ctx", a->ctx, "context length S per sequence (default: min(2048, trained context))")
      ->check(CLI::PositiveNumber);
  c->add_option("--prompt", a->prompt, "prompt tokens per request, worst case (default: min(512, ctx/2))")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--max-tokens", a->max_tokens, "generated tokens per request, worst case (default: min(256, ctx - prompt))")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--headroom", a->headroom, "fraction of KV blocks admission keeps free")
      ->capture_default_str()->check(CLI::Range(0.0, 0.999999));
  c->add_option("--max-step-tokens", a->max_step_tokens,
                "most tokens one step appends to a sequence: bounds a windowed KV table of a hybrid cache")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--scratch", a->scratch, "activation scratch memory, e.g. 512MiB (default: one 512-token step)");
  c->add_option("--tier-disk-read", a->tier_disk_read, "read rate of the disk KV tier, for prefix reload times")
      ->capture_default_str();
  c->add_option("--tier-redis-read", a->tier_redis_read, "read rate of the Redis KV tier (the link to it), for prefix reload times")
      ->capture_default_str();
  c->add_option("--link", a->link, "link between prefill and decode workers, for K/V transfer times (disaggregated serving)")
      ->capture_default_str();
  c->add_flag("--json", a->json, "print the plan as JSON");
  c->add_option("--svg", a->svg_dir, "write plots (kv_vs_context, decode_roofline, decode_vs_context) as SVG into DIR");
  c->callback([a, &run, m, pr, wq] {
    if (m->count() == 0 && pr->count() == 0) throw CLI::RequiredError("one of -m/--model or --preset");
    a->weights_given = wq->count() > 0;
    run = [a] { return run_plan(*a); };
  });
}

}  // namespace kvs::cli
