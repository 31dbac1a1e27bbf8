// Per-machine choice of the packed decode kernels' variant (panels per pass,
// prefetch distance; kernels/decode_variant.h): `kvserve probe` times every
// candidate on the real matmul, interleaved, and keeps the fastest in the
// profile; every command that loads a model applies the profile's choice when
// it was measured on this CPU with this ISA.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "kernels/decode_variant.h"

namespace kvs::tools {

struct DecodeChoice {
  std::string type;        // lower-case ggml name
  DecodeVariant variant;   // the fastest candidate
  double gain = 1.0;       // its pass rate over the default's
};

struct DecodeChoices {
  std::string isa;  // the ISA the kernels were timed on ("avx2", "avx512")
  std::vector<DecodeChoice> types;
  bool empty() const { return types.empty(); }
};

// Times `pass` (one decode product per weight copy; returns seconds) under
// every candidate for type `t`, `rounds` rounds with the candidates
// interleaved inside each round so drift hits all alike; keeps each
// candidate's best pass. Leaves the fastest set for `t` and returns it with
// the passes per second it reached.
struct DecodeTuning {
  DecodeChoice choice;
  double passes_per_s = 0;
};
DecodeTuning tune_decode_variant(GgmlType t, int rounds, const std::function<double()>& pass);

nlohmann::json decode_choices_to_json(const DecodeChoices& c);
DecodeChoices decode_choices_from_json(const nlohmann::json& j);  // throws std::invalid_argument

// Sets the kernels' variants from a profile measured on `cpu` with the
// choices `c`. Applies nothing, and says why, when the CPU model or the
// active ISA differ (another machine's best is no guide). Returns a one-line
// note for stderr, empty when there was nothing to say.
std::string apply_decode_choices(const DecodeChoices& c, const std::string& cpu);

// The default profile's choices applied (load_all calls this once): silent
// without a profile; a malformed one is reported, not fatal.
std::string apply_default_profile_choices();

}  // namespace kvs::tools
