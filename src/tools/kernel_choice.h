// Per-machine kernel choices that `kvserve probe` makes on the real matmul
// and keeps in the profile; every command that loads a model applies them
// when they were measured on this CPU:
//  - the packed decode kernels' variant (panels per pass, prefetch distance;
//    kernels/decode_variant.h), timed candidate by candidate, interleaved;
//    applied with the ISA it was timed on (AMX runs the AVX-512 decode);
//  - where AMX tiles take over from VNNI (kernels/amx_rows.h): per weight
//    type the threshold n whose measured points at and above it gain most
//    from tiles, both timed side by side.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "kernels/amx_rows.h"
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

// The ISA name decode choices are stored and applied under: the active
// one, with Isa::Amx as "avx512" (its decode kernels are the AVX-512 ones).
std::string decode_isa_name();

nlohmann::json decode_choices_to_json(const DecodeChoices& c);
DecodeChoices decode_choices_from_json(const nlohmann::json& j);  // throws std::invalid_argument

// Sets the kernels' variants from a profile measured on `cpu` with the
// choices `c`. Applies nothing, and says why, when the CPU model or the
// active ISA differ (another machine's best is no guide). Returns a one-line
// note for stderr, empty when there was nothing to say.
std::string apply_decode_choices(const DecodeChoices& c, const std::string& cpu);

// One weight type's AMX-vs-VNNI timing at n activation rows (ops/s each).
struct AmxPoint {
  int n = 0;
  double vnni = 0, amx = 0;
};
struct AmxChoice {
  std::string type;          // lower-case ggml name
  int min_rows = kAmxNever;  // tiles from this n on; kAmxNever: tiles never won
  std::vector<AmxPoint> points;  // ascending n
};
struct AmxChoices {
  std::vector<AmxChoice> types;
  bool empty() const { return types.empty(); }
};

// The point n from which tiles take over: the one whose points at and above
// it gain most together (sum of log amx/vnni), so a single noisy point does
// not decide; kAmxNever when no threshold gains.
int amx_crossover(const std::vector<AmxPoint>& points);

nlohmann::json amx_choices_to_json(const AmxChoices& c);  // "min_rows": null for never
AmxChoices amx_choices_from_json(const nlohmann::json& j);  // throws std::invalid_argument

// Sets the AMX thresholds from a profile measured on `cpu`; applies nothing,
// and says why, when the CPU differs. Silent where AMX is not in use (the
// thresholds then change nothing).
std::string apply_amx_choices(const AmxChoices& c, const std::string& cpu);

// The default profile's choices applied (load_all calls this once): silent
// without a profile; a malformed one is reported, not fatal.
std::string apply_default_profile_choices();

}  // namespace kvs::tools
