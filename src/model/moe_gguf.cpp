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
//   gpt-oss (ik_llama.cpp): expert_feed_forward_length required; the top k
//     router logits (+ bias), then a softmax over those k; experts with
//     gate / up / down biases and the clamped SwiGLU.
// The peers fix the gating per architecture (model/arch.h); a file whose
// gating keys say otherwise is refused rather than run differently from
// what it asks. Tensors a layer does not use (a dense FFN beside the experts,
// a shared expert where the architecture has none, expert biases) are
// refused by the loader like any other unused tensor.
#include <cmath>

#include "model/loaders.h"
#include "model/meta.h"

namespace kvs::detail {

namespace {

// Gating keys the peers read for other MoE architectures: accepted only when
// they say what this architecture computes anyway.
void check_gating_keys(const GgufFile& f, const std::string& a, const ArchInfo& am) {
  const std::string arch(am.name);
  // llama.cpp's gating numbers: 1 = softmax over all experts, 3 = softmax over the chosen k (gpt-oss).
  const uint64_t gating = am.gpt_oss ? 3 : 1;
  if (const auto g = f.opt_u64(a + "expert_gating_func"); g && *g != gating)
    throw ModelError(f.path() + ": key '" + a + "expert_gating_func' = " + std::to_string(*g) +
                     " is not supported for " + arch + " (" + std::to_string(gating) + " = " +
                     (am.gpt_oss ? "softmax over the top k" : "softmax") + " is what it computes)");
  if (const auto n = f.opt_bool(a + "expert_weights_norm"); n && *n != am.moe_norm_weights)
    throw ModelError(f.path() + ": key '" + a + "expert_weights_norm' = " + (*n ? "true" : "false") +
                     " is not supported for " + arch + " (its experts' weights are " +
                     (am.moe_norm_weights ? "" : "not ") + "renormalised)");
  if (const auto s = f.opt_f64(a + "expert_weights_scale"); s && std::fabs(*s - 1.0) > 1e-6)
    throw ModelError(f.path() + ": key '" + a + "expert_weights_scale' = " + std::to_string(*s) +
                     " is not supported for " + arch + " (only 1)");
}

// A width key with a default taken from feed_forward_length (the peers' rule).
int width_key(const GgufFile& f, const std::string& key, int def, const std::string& def_key) {
  if (!f.find(key) && def <= 0)
    throw ModelError(f.path() + ": required key '" + key + "' is missing (and '" + def_key + "' gives no default)");
  return meta_int(f, key, def, 1, 1 << 24);
}

}  // namespace

MoeConfig moe_config_from_gguf(const GgufFile& f, const ArchInfo& am, int ffn_dim) {
  MoeConfig c;
  if (am.moe == ArchInfo::Moe::None) return c;
  const std::string a = std::string(am.name) + ".";
  const bool always = am.moe == ArchInfo::Moe::Always;
  const bool has_router = f.find_tensor("blk.0.ffn_gate_inp.weight") != nullptr;
  const int count = meta_int(f, a + "expert_count", (always || has_router) ? std::nullopt : std::optional<int>(0), 0,
                             kMaxExperts);
  if (!has_router) {
    if (count > 0 || always)
      throw ModelError(f.path() + ": tensor 'blk.0.ffn_gate_inp.weight' is missing (key '" + a + "expert_count' = " +
                       std::to_string(count) + ": a mixture-of-experts FFN needs its router)");
    return c;
  }
  if (count == 0)
    throw ModelError(f.path() + ": key '" + a + "expert_count' = 0 but tensor 'blk.0.ffn_gate_inp.weight' exists");
  c.n_expert = count;
  c.n_used = meta_int(f, a + "expert_used_count", std::nullopt, 1, kMaxExperts);
  if (c.n_used > c.n_expert)
    throw ModelError(f.path() + ": key '" + a + "expert_used_count' = " + std::to_string(c.n_used) +
                     " exceeds expert_count " + std::to_string(c.n_expert));
  check_gating_keys(f, a, am);
  c.gating = am.gpt_oss ? MoeGating::TopKSoftmax : MoeGating::SoftmaxTopK;
  c.norm_weights = am.moe_norm_weights;
  c.act = am.gpt_oss ? MoeActivation::SwiGLUClamped : MoeActivation::SwiGLU;
  // llama's experts are feed_forward_length wide; the others have their own
  // key (gpt-oss: required, as the peer reads it).
  const int def = am.gpt_oss ? 0 : ffn_dim / c.n_used;
  c.ffn_dim = always ? width_key(f, a + "expert_feed_forward_length", def, a + "feed_forward_length") : ffn_dim;
  if (am.moe_shared)
    c.shared_ffn_dim = width_key(f, a + "expert_shared_feed_forward_length", ffn_dim, a + "feed_forward_length");
  return c;
}

void load_moe_layer(TensorLoader& t, const ModelConfig& c, const std::string& p, MoeWeights& w) {
  const MoeConfig& mc = c.moe;
  const int64_t dim = c.dim, E = mc.n_expert, F = mc.ffn_dim;
  w.router = t.matrix(p + "ffn_gate_inp.weight", E, dim);             // [n_expert, dim]
  w.gate = t.slices(p + "ffn_gate_exps.weight", E, F, dim);           // E x [ffn_exp, dim]
  w.up = t.slices(p + "ffn_up_exps.weight", E, F, dim);               // E x [ffn_exp, dim]
  w.down = t.slices(p + "ffn_down_exps.weight", E, dim, F);           // E x [dim, ffn_exp]
  if (mc.gating == MoeGating::TopKSoftmax) {  // gpt-oss: every product has its bias
    w.router_bias = t.floats(p + "ffn_gate_inp.bias", {E});           // [n_expert]
    w.gate_bias = t.floats(p + "ffn_gate_exps.bias", {F, E});         // [n_expert, ffn_exp]
    w.up_bias = t.floats(p + "ffn_up_exps.bias", {F, E});             // [n_expert, ffn_exp]
    w.down_bias = t.floats(p + "ffn_down_exps.bias", {dim, E});       // [n_expert, dim]
  }
  if (mc.shared_ffn_dim > 0) {
    const int64_t S = mc.shared_ffn_dim;
    w.sh_gate_inp = t.vector(p + "ffn_gate_inp_shexp.weight", dim);  // [dim]
    w.sh_gate = t.matrix(p + "ffn_gate_shexp.weight", S, dim);        // [shared_ffn, dim]
    w.sh_up = t.matrix(p + "ffn_up_shexp.weight", S, dim);            // [shared_ffn, dim]
    w.sh_down = t.matrix(p + "ffn_down_shexp.weight", dim, S);        // [dim, shared_ffn]
  }
}

}  // namespace kvs::detail
