// Decode-variant timing, the AMX crossover, their JSON forms, and applying
// stored choices.
#include "tools/kernel_choice.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "kernels/cpu.h"
#include "tools/probe.h"

namespace kvs::tools {

DecodeTuning tune_decode_variant(GgmlType t, int rounds, const std::function<double()>& pass) {
  const std::vector<DecodeVariant>& cands = decode_variants();
  std::vector<double> best(cands.size(), 0.0);  // passes per second
  for (int r = 0; r < std::max(1, rounds); ++r)
    for (size_t i = 0; i < cands.size(); ++i) {
      set_decode_variant(t, cands[i]);
      const double s = pass();
      if (s > 0) best[i] = std::max(best[i], 1.0 / s);
    }
  const size_t win = size_t(std::max_element(best.begin(), best.end()) - best.begin());
  set_decode_variant(t, cands[win]);
  DecodeTuning out;
  out.choice.type = lower_ascii(type_name(t));
  out.choice.variant = cands[win];
  out.choice.gain = best[0] > 0 ? best[win] / best[0] : 1.0;  // cands[0] is the default
  out.passes_per_s = best[win];
  return out;
}

std::string decode_isa_name() { return isa_name(std::min(active_isa(), Isa::Avx512)); }

nlohmann::json decode_choices_to_json(const DecodeChoices& c) {
  nlohmann::json types = nlohmann::json::object();
  for (const DecodeChoice& d : c.types)
    types[d.type] = {{"panels", d.variant.panels}, {"prefetch", d.variant.prefetch}, {"gain", d.gain}};
  return {{"isa", c.isa}, {"types", types}};
}

DecodeChoices decode_choices_from_json(const nlohmann::json& j) {
  DecodeChoices c;
  try {
    c.isa = j.at("isa").get<std::string>();
    for (const auto& [name, e] : j.at("types").items()) {
      DecodeChoice d;
      d.type = lower_ascii(name);
      d.variant = {e.at("panels").get<int>(), e.at("prefetch").get<int>()};
      d.gain = e.value("gain", 1.0);
      if (!is_decode_variant(d.variant))
        throw std::invalid_argument("decode_variants." + name + " is not a candidate (" + to_string(d.variant) + ")");
      weight_type_from_name(d.type);  // throws for an unknown type
      c.types.push_back(d);
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("malformed decode_variants: ") + e.what());
  }
  return c;
}

std::string apply_decode_choices(const DecodeChoices& c, const std::string& cpu) {
  if (c.empty()) return "";
  const std::string here = machine_cpu_name(), isa = decode_isa_name();
  if (cpu != here)
    return "decode kernels: the profile was measured on '" + cpu + "', this is '" + here +
           "': using the default variants (run `kvserve probe` here to choose)";
  if (c.isa != isa)
    return "decode kernels: the profile chose for " + c.isa + ", this run uses " + isa +
           ": using the default variants (run `kvserve probe` with this ISA to choose)";
  for (const DecodeChoice& d : c.types) set_decode_variant(weight_type_from_name(d.type), d.variant);
  return "";
}

int amx_crossover(const std::vector<AmxPoint>& points) {
  // A threshold puts every measured n at or above it on tiles: pick the one
  // whose points gain most together (sum of log speed-ups), so one noisy
  // point cannot switch tiles off for the large batches they win clearly.
  int from = kAmxNever;
  double gain = 0, best = 0;
  for (auto it = points.rbegin(); it != points.rend(); ++it) {
    if (!(it->amx > 0 && it->vnni > 0)) continue;  // not measured: no evidence either way
    gain += std::log(it->amx / it->vnni);
    if (gain > best) {
      best = gain;
      from = it->n;
    }
  }
  return from;
}

nlohmann::json amx_choices_to_json(const AmxChoices& c) {
  nlohmann::json types = nlohmann::json::object();
  for (const AmxChoice& a : c.types) {
    nlohmann::json pts = nlohmann::json::array();
    for (const AmxPoint& q : a.points) pts.push_back({{"n", q.n}, {"vnni_ops_per_s", q.vnni}, {"amx_ops_per_s", q.amx}});
    types[a.type] = {{"min_rows", a.min_rows >= kAmxNever ? nlohmann::json() : nlohmann::json(a.min_rows)},
                     {"points", pts}};
  }
  return {{"types", types}};
}

AmxChoices amx_choices_from_json(const nlohmann::json& j) {
  AmxChoices c;
  try {
    for (const auto& [name, e] : j.at("types").items()) {
      AmxChoice a;
      a.type = lower_ascii(name);
      if (!amx_tile_type(weight_type_from_name(a.type)))
        throw std::invalid_argument("amx_tiles." + name + ": no AMX kernels for this type");
      const auto& m = e.at("min_rows");
      a.min_rows = m.is_null() ? kAmxNever : m.get<int>();
      if (a.min_rows < 1) throw std::invalid_argument("amx_tiles." + name + ".min_rows must be >= 1 or null");
      for (const auto& q : e.value("points", nlohmann::json::array()))
        a.points.push_back({q.at("n").get<int>(), q.at("vnni_ops_per_s").get<double>(), q.at("amx_ops_per_s").get<double>()});
      c.types.push_back(std::move(a));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("malformed amx_tiles: ") + e.what());
  }
  return c;
}

std::string apply_amx_choices(const AmxChoices& c, const std::string& cpu) {
  if (c.empty() || active_isa() != Isa::Amx) return "";
  const std::string here = machine_cpu_name();
  if (cpu != here)
    return "amx tiles: the profile was measured on '" + cpu + "', this is '" + here +
           "': using the default thresholds (run `kvserve probe` here to choose)";
  for (const AmxChoice& a : c.types) set_amx_min_rows(weight_type_from_name(a.type), a.min_rows);
  return "";
}

std::string apply_default_profile_choices() {
  const std::string path = default_profile_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  try {
    const HardwareProfile p = load_profile(path);
    const std::string d = apply_decode_choices(p.decode, p.cpu), a = apply_amx_choices(p.amx, p.cpu);
    return d.empty() || a.empty() ? d + a : d + "\n" + a;
  } catch (const std::exception& e) {
    return std::string("decode kernels: default variants; the profile could not be read: ") + e.what();
  }
}

}  // namespace kvs::tools
