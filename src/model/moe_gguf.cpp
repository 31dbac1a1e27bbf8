// GGUF -> mixture-of-experts FFN: the expert keys per architecture and each
// layer's router, expert slices and shared expert, as llama.cpp b4748 and
// ik_llama.cpp name and shape them:
//   llama (Mixtral): MoE when blk.N.ffn_gate_inp exists; experts as wide as
//     feed_forward_length; softmax gating, the top k renormalised.
//   qwen2moe: expert_feed_forward_length (else feed_forward_length / k),
//     a shared expert of expert_shared_feed_forward_length (else
//     feed_forward_length) with a sigmoid gate; top k not renormalised.
//   qwen3moe: expert_feed_forward_length (else feed_forward_length / k);
//     top k renormalised.
// The peers fix the gating per architecture; a file whose gating keys say
// otherwise is refused rather than run differently from what it asks.
#include <cmath>

#include "model/loaders.h"

namespace kvs::detail {

namespace {

struct ArchMoe {
  const char* arch;
  bool required;      // the architecture is MoE only
  bool norm_weights;  // renormalise the top k
  bool shared;        // has a shared expert
};
const ArchMoe kArchMoe[] = {
    {"llama", false, true, false},
    {"mistral", false, true, false},
    {"qwen2moe", true, false, true},
    {"qwen3moe", true, true, false},
};

const ArchMoe* arch_moe(const std::string& arch) {
  for (const ArchMoe& a : kArchMoe)
    if (arch == a.arch) return &a;
  return nullptr;
}

int key_int(const GgufFile& f, const std::string& key, int def, int64_t lo, int64_t hi, bool required) {
  const std::optional<uint64_t> v = f.opt_u64(key);
  if (!v) {
    if (required) throw ModelError(f.path() + ": required key '" + key + "' is missing");
    return def;
  }
  if (*v < uint64_t(lo) || *v > uint64_t(hi))
    throw ModelError(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return int(*v);
}

// Gating keys the peers read for other MoE architectures: accepted only when
// they say what this architecture computes anyway.
void check_gating_keys(const GgufFile& f, const std::string& a, const ArchMoe& am) {
  if (const auto g = f.opt_u64(a + "expert_gating_func"); g && *g != 1)
    throw ModelError(f.path() + ": key '" + a + "expert_gating_func' = " + std::to_string(*g) +
                     " is not supported for " + am.arch + " (1 = softmax is what it computes)");
  if (const auto n = f.opt_bool(a + "expert_weights_norm"); n && *n != am.norm_weights)
    throw ModelError(f.path() + ": key '" + a + "expert_weights_norm' = " + (*n ? "true" : "false") +
                     " is not supported for " + am.arch + " (its experts' weights are " +
                     (am.norm_weights ? "" : "not ") + "renormalised)");
  if (const auto s = f.opt_f64(a + "expert_weights_scale"); s && std::fabs(*s - 1.0) > 1e-6)
    throw ModelError(f.path() + ": key '" + a + "expert_weights_scale' = " + std::to_string(*s) +
                     " is not supported for " + am.arch + " (only 1)");
}

// The 3-D expert tensor `name` ([n_expert, rows, cols], ggml dims {cols, rows,
// n_expert}) as one matrix view per expert.
std::vector<WeightView> expert_slices(const GgufFile& f, const std::string& name, int64_t n_expert, int64_t rows,
                                      int64_t cols) {
  const WeightView all = weight_view(f, f.tensor(name, {cols, rows, n_expert}), n_expert * rows, cols);
  std::vector<WeightView> v(size_t(n_expert), all);
  for (int64_t e = 0; e < n_expert; ++e) {
    v[size_t(e)].rows = rows;
    v[size_t(e)].data = all.row(e * rows);
  }
  return v;
}

}  // namespace

MoeConfig moe_config_from_gguf(const GgufFile& f, const std::string& arch, int ffn_dim) {
  MoeConfig c;
  const ArchMoe* am = arch_moe(arch);
  if (!am) return c;
  const std::string a = arch + ".";
  const bool has_router = f.find_tensor("blk.0.ffn_gate_inp.weight") != nullptr;
  const int count = key_int(f, a + "expert_count", 0, 0, kMaxExperts, am->required || has_router);
  if (!has_router) {
    if (count > 0 || am->required)
      throw ModelError(f.path() + ": tensor 'blk.0.ffn_gate_inp.weight' is missing (key '" + a + "expert_count' = " +
                       std::to_string(count) + ": a mixture-of-experts FFN needs its router)");
    return c;
  }
  if (count == 0)
    throw ModelError(f.path() + ": key '" + a + "expert_count' = 0 but tensor 'blk.0.ffn_gate_inp.weight' exists");
  c.n_expert = count;
  c.n_used = key_int(f, a + "expert_used_count", 0, 1, kMaxExperts, true);
  if (c.n_used > c.n_expert)
    throw ModelError(f.path() + ": key '" + a + "expert_used_count' = " + std::to_string(c.n_used) +
                     " exceeds expert_count " + std::to_string(c.n_expert));
  check_gating_keys(f, a, *am);
  c.gating = MoeGating::SoftmaxTopK;
  c.norm_weights = am->norm_weights;
  c.act = MoeActivation::SwiGLU;
  if (arch == "llama" || arch == "mistral") {
    c.ffn_dim = ffn_dim;
  } else {
    const bool has_key = f.find(a + "expert_feed_forward_length") != nullptr;
    if (!has_key && ffn_dim / c.n_used <= 0)
      throw ModelError(f.path() + ": required key '" + a + "expert_feed_forward_length' is missing (and '" + a +
                       "feed_forward_length' gives no default)");
    c.ffn_dim = key_int(f, a + "expert_feed_forward_length", ffn_dim / c.n_used, 1, 1 << 24, false);
  }
  if (am->shared) {
    const bool has_key = f.find(a + "expert_shared_feed_forward_length") != nullptr;
    if (!has_key && ffn_dim <= 0)
      throw ModelError(f.path() + ": required key '" + a + "expert_shared_feed_forward_length' is missing (and '" +
                       a + "feed_forward_length' gives no default)");
    c.shared_ffn_dim = key_int(f, a + "expert_shared_feed_forward_length", ffn_dim, 1, 1 << 24, false);
  }
  return c;
}

void load_moe_layer(Model& m, int l, LayerWeights& L) {
  const GgufFile& f = *m.gguf_;
  const ModelConfig& c = m.cfg_;
  const MoeConfig& mc = c.moe;
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t dim = c.dim, E = mc.n_expert, F = mc.ffn_dim;
  // Tensors a MoE layer of these architectures never reads: refused, not ignored.
  for (const char* t : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "ffn_gate_up_exps.weight",
                        "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"})
    if (f.find_tensor(p + t))
      throw ModelError(f.path() + ": tensor '" + p + t + "' is not supported in a " + c.arch +
                       " mixture-of-experts layer (kvserve would ignore it)");
  MoeWeights& w = L.moe;
  w.router = matrix(f, p + "ffn_gate_inp.weight", E, dim);               // [n_expert, dim]
  w.gate = expert_slices(f, p + "ffn_gate_exps.weight", E, F, dim);      // E x [ffn_exp, dim]
  w.up = expert_slices(f, p + "ffn_up_exps.weight", E, F, dim);          // E x [ffn_exp, dim]
  w.down = expert_slices(f, p + "ffn_down_exps.weight", E, dim, F);      // E x [dim, ffn_exp]
  if (mc.shared_ffn_dim > 0) {
    const int64_t S = mc.shared_ffn_dim;
    w.sh_gate_inp = vector_f32(m, p + "ffn_gate_inp_shexp.weight", dim);  // [dim]
    w.sh_gate = matrix(f, p + "ffn_gate_shexp.weight", S, dim);           // [shared_ffn, dim]
    w.sh_up = matrix(f, p + "ffn_up_shexp.weight", S, dim);               // [shared_ffn, dim]
    w.sh_down = matrix(f, p + "ffn_down_shexp.weight", dim, S);           // [dim, shared_ffn]
  } else {
    for (const char* t : {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                          "ffn_down_shexp.weight"})
      if (f.find_tensor(p + t))
        throw ModelError(f.path() + ": tensor '" + p + t + "' is not supported: " + c.arch +
                         " has no shared expert (kvserve would ignore it)");
  }
}

}  // namespace kvs::detail
