// make-model's mixture-of-experts tensors and keys (make_model_moe.h).
#include "tools/make_model_moe.h"

#include <cmath>
#include <stdexcept>

namespace kvs {

bool moe_model(const MakeModelOptions& o) {
  return o.n_expert > 0 || o.arch == "qwen2moe" || o.arch == "qwen3moe" || o.arch == "gpt-oss";
}

MakeModelOptions moe_defaults(const MakeModelOptions& o) {
  MakeModelOptions m = o;
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("make-model: " + what);
  };
  const bool gpt_oss = o.arch == "gpt-oss";
  const bool moe_arch = o.arch == "qwen2moe" || o.arch == "qwen3moe" || gpt_oss;
  need(o.n_expert >= 0 && o.n_expert_used >= 0 && o.expert_ffn >= 0 && o.shared_ffn >= 0,
       "--experts, --experts-used, --expert-ffn and --shared-ffn must not be negative");
  if (!moe_model(o)) {
    need(o.n_expert_used == 0, "--experts-used needs --experts (or a MoE architecture)");
    need(o.expert_ffn == 0 && o.shared_ffn == 0, "--expert-ffn and --shared-ffn need a MoE model");
    need(!o.expert_type, "--expert-type needs a MoE model");
    return m;
  }
  need(o.arch == "llama" || moe_arch, "--experts is not supported for --arch " + o.arch +
                                          " (MoE: llama, qwen2moe, qwen3moe, gpt-oss)");
  if (m.n_expert == 0) m.n_expert = 8;
  // gpt-oss runs four experts per token (of 32 in gpt-oss-20b, 128 in -120b).
  if (m.n_expert_used == 0) m.n_expert_used = std::min(gpt_oss ? 4 : 2, m.n_expert);
  if (!m.expert_type) m.expert_type = gpt_oss ? GgmlType::MXFP4 : o.type;
  need(m.n_expert <= 256, "--experts " + std::to_string(m.n_expert) + " is above 256");
  need(m.n_expert_used <= m.n_expert, "--experts-used " + std::to_string(m.n_expert_used) + " exceeds --experts " +
                                          std::to_string(m.n_expert));
  // llama's experts are feed_forward_length wide (the key has no other).
  need(o.arch != "llama" || o.expert_ffn == 0, "--expert-ffn is not supported for --arch llama (use --ffn)");
  need(o.arch == "qwen2moe" || o.shared_ffn == 0, "--shared-ffn needs --arch qwen2moe (the one with a shared expert)");
  need(!(o.tied && (o.arch == "qwen2moe" || gpt_oss)),
       "--tied: " + o.arch + " files always have output.weight (the peers require it)");
  if (moe_arch && m.expert_ffn == 0) m.expert_ffn = o.ffn_dim;
  if (o.arch == "qwen2moe" && m.shared_ffn == 0) m.shared_ffn = o.ffn_dim;
  return m;
}

void set_moe_keys(GgufWriter& w, const MakeModelOptions& o) {
  const std::string a = o.arch + ".";
  w.set_u32(a + "expert_count", uint32_t(o.n_expert));
  w.set_u32(a + "expert_used_count", uint32_t(o.n_expert_used));
  if (o.expert_ffn > 0) w.set_u32(a + "expert_feed_forward_length", uint32_t(o.expert_ffn));
  if (o.shared_ffn > 0) w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(o.shared_ffn));
}

void add_moe_ffn(const MakeModelOptions& o, const std::string& p, float down_scale, const RandomTensorFn& random) {
  const int64_t dim = o.dim, E = o.n_expert, F = o.expert_ffn > 0 ? o.expert_ffn : o.ffn_dim;
  const float s_in = 1.f / std::sqrt(float(dim));
  const GgmlType et = o.expert_type.value_or(o.type);
  // Router logits of unit spread: routing decided by clear margins.
  random(p + "ffn_gate_inp.weight", {dim, E}, s_in, GgmlType::F32);                        // [n_expert, dim]
  random(p + "ffn_gate_exps.weight", {dim, F, E}, s_in, et);                               // [n_expert, ffn_exp, dim]
  random(p + "ffn_up_exps.weight", {dim, F, E}, s_in, et);                                 // [n_expert, ffn_exp, dim]
  random(p + "ffn_down_exps.weight", {F, dim, E}, down_scale / std::sqrt(float(F)), et);   // [n_expert, dim, ffn_exp]
  if (o.arch == "gpt-oss") {  // every product has a bias (F32, as the converter keeps them)
    random(p + "ffn_gate_inp.bias", {E}, 0.1f, GgmlType::F32);                             // [n_expert]
    random(p + "ffn_gate_exps.bias", {F, E}, 0.1f, GgmlType::F32);                         // [n_expert, ffn_exp]
    random(p + "ffn_up_exps.bias", {F, E}, 0.1f, GgmlType::F32);                           // [n_expert, ffn_exp]
    random(p + "ffn_down_exps.bias", {dim, E}, 0.1f, GgmlType::F32);                       // [n_expert, dim]
  }
  if (o.shared_ffn > 0) {
    const int64_t S = o.shared_ffn;
    random(p + "ffn_gate_inp_shexp.weight", {dim}, s_in, GgmlType::F32);                   // [dim]
    random(p + "ffn_gate_shexp.weight", {dim, S}, s_in, o.type);                           // [shared_ffn, dim]
    random(p + "ffn_up_shexp.weight", {dim, S}, s_in, o.type);                             // [shared_ffn, dim]
    random(p + "ffn_down_shexp.weight", {S, dim}, down_scale / std::sqrt(float(S)), o.type);  // [dim, shared_ffn]
  }
}

}  // namespace kvs
