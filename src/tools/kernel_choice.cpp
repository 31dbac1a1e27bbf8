// Decode-variant timing, its JSON form, and applying a stored choice.
#include "tools/kernel_choice.h"

#include <algorithm>
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
  const std::string here = machine_cpu_name(), isa = isa_name(active_isa());
  if (cpu != here)
    return "decode kernels: the profile was measured on '" + cpu + "', this is '" + here +
           "': using the default variants (run `kvserve probe` here to choose)";
  if (c.isa != isa)
    return "decode kernels: the profile chose for " + c.isa + ", this run uses " + isa +
           ": using the default variants (run `kvserve probe` with this ISA to choose)";
  for (const DecodeChoice& d : c.types) set_decode_variant(weight_type_from_name(d.type), d.variant);
  return "";
}

std::string apply_default_profile_choices() {
  const std::string path = default_profile_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  try {
    const HardwareProfile p = load_profile(path);
    return apply_decode_choices(p.decode, p.cpu);
  } catch (const std::exception& e) {
    return std::string("decode kernels: default variants; the profile could not be read: ") + e.what();
  }
}

}  // namespace kvs::tools
