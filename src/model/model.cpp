// Model::load: picks the loader by the file's magic, and the identity hash.
#include <openssl/evp.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "kernels/flash_attention.h"
#include "model/loaders.h"

namespace kvs {

namespace detail {

std::string model_identity(const ModelConfig& c, uint64_t file_size, const std::string& path) {
  std::ostringstream s;
  // Every field that changes what the weights compute, plus where they came from.
  s << "kvserve-model-v1|" << c.arch << '|' << c.n_vocab << '|' << c.dim << '|' << c.n_layers << '|'
    << c.n_heads << '|' << c.n_kv_heads << '|' << c.head_dim << '|' << c.ffn_dim << '|' << c.n_rot << '|'
    << c.rope_theta << '|' << c.rms_eps << '|' << static_cast<int>(c.rope) << '|' << c.has_qkv_bias << '|'
    << c.tied_output << '|' << c.sliding_window << '|' << c.weight_bytes << '|' << file_size << '|';
  // What the newer architectures add, only where it differs from the plain
  // llama forward (so the identities of the models before them stay).
  std::ostringstream x;
  for (size_t l = 0; l < c.layer_window.size(); ++l)
    if (c.layer_window[l] != c.sliding_window || c.layer_rope[l] != 0) x << 'w' << l << ':' << c.layer_window[l] << ':' << c.layer_rope[l];
  for (size_t i = 0; i < c.ropes.size(); ++i)
    if (!(c.ropes[i] == RopeConfig{c.rope_theta, 1.f, 0.f, 1.f, 32.f, 1.f, c.ropes[i].n_ctx_orig}))
      x << 'r' << i << ':' << c.ropes[i].theta << ':' << c.ropes[i].freq_scale << ':' << c.ropes[i].ext_factor << ':'
        << c.ropes[i].attn_factor << ':' << c.ropes[i].n_ctx_orig;
  if (c.rope_factors != RopeFactors::None) x << "f" << int(c.rope_factors) << ':' << c.n_ctx_orig;
  if (c.attn_scale != 0.f || c.attn_softcap != 0.f || c.final_softcap != 0.f || c.embd_scale != 0.f)
    x << 's' << c.attn_scale << ':' << c.attn_softcap << ':' << c.final_softcap << ':' << c.embd_scale;
  x << (c.ffn_act == FfnAct::Silu ? "" : "g") << (c.qk_norm ? "q" : "") << (c.post_norms ? "p" : "")
    << (c.fused_qkv ? "k" : "") << (c.fused_gate_up ? "u" : "");
  if (!x.str().empty()) s << "x:" << x.str() << '|';
  if (c.moe.n_expert > 0)  // dense models keep the identity they always had
    s << "moe:" << c.moe.n_expert << ',' << c.moe.n_used << ',' << c.moe.ffn_dim << ',' << c.moe.shared_ffn_dim << ','
      << int(c.moe.gating) << ',' << c.moe.norm_weights << ',' << int(c.moe.act) << '|';
  // The canonical path, so "m.gguf" and "./m.gguf" are the same model.
  std::error_code ec;
  const std::filesystem::path canon = std::filesystem::weakly_canonical(path, ec);
  s << (ec ? path : canon.string());
  return sha256_hex(s.str());
}

std::string sha256_hex(const std::string& msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(msg.data(), msg.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw ModelError("sha256 failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace detail

const float* ModelWeights::rope_factors_for(const ModelConfig& c, int n_ctx) const {
  if (rope_freqs) return rope_freqs;
  if (c.rope_factors != RopeFactors::LongShort) return nullptr;
  return (n_ctx > 0 ? n_ctx : c.n_ctx_train) > c.n_ctx_orig ? rope_long : rope_short;
}

namespace {

// A directory opens as a stream on Linux and reads as garbage sizes: say
// what it is, and which model files it holds.
void require_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return;
  std::string found;
  int shown = 0;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".gguf" && ext != ".bin") continue;
    if (shown++ < 4) found += (found.empty() ? "" : ", ") + e.path().filename().string();
  }
  throw ModelError(path + ": is a directory; pass the model file itself (a .gguf, or a llama2.c .bin)" +
                   (found.empty() ? std::string() : ", e.g. one of: " + found));
}

}  // namespace

bool Model::bf16_attention() const {
  return precision_ == MatmulPrecision::Bf16 && attn::flash_bf16_fits(cfg_.head_dim);
}

std::shared_ptr<const Model> Model::load(const std::string& path, const std::string& tokenizer_path,
                                         const std::function<void(int64_t, int64_t)>& on_repack,
                                         MatmulPrecision precision) {
  if (precision == MatmulPrecision::Bf16) {
    if (!amx_bf16_active())
      throw std::invalid_argument(
          "bf16 matmuls need AMX-BF16 tiles (amx_bf16 in lscpu's flags), which this CPU" +
          std::string(std::getenv("KVS_ISA") ? " under KVS_ISA=" + std::string(std::getenv("KVS_ISA")) : "") +
          " does not offer; drop --prefill-precision bf16 (fp32 is the default and exact)");
    if (!repack_enabled())
      throw std::invalid_argument("bf16 matmuls run on the load-time copy of the weights, which KVS_REPACK=0 turns off");
  }
  require_file(path);
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ModelError(path + ": cannot open model file: " + std::strerror(errno));
    in.read(magic, 4);
  }
  auto m = std::make_shared<Model>();
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    detail::load_gguf(*m, path);
  } else {
    detail::load_llama2c(*m, path, tokenizer_path);
  }
  if (repack_enabled()) {
    std::vector<PackItem> items;
    const bool mapped = m->gguf_ != nullptr;  // only file-mapped data may be released
    for (LayerWeights& l : m->w_.layers) {
      for (WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        if (w->data) items.push_back({w, mapped});
      // Experts are packed slice by slice, like dense matrices.
      MoeWeights& e = l.moe;
      for (WeightView* w : {&e.router, &e.sh_gate, &e.sh_up, &e.sh_down})
        if (w->data) items.push_back({w, mapped});
      for (auto* v : {&e.gate, &e.up, &e.down})
        for (WeightView& w : *v) items.push_back({&w, mapped});
    }
    // A tied output shares its rows with the embedding table, which is read
    // row by row from the file layout: keep those pages.
    items.push_back({&m->w_.output, mapped && !m->cfg_.tied_output});
    m->packed_ = pack_weights(items, on_repack, precision);
    // bf16 products (float matrices; attention, which follows the model's
    // precision) compute other values than fp32 ones: their KV must not be
    // shared with an fp32 load of the same file (prefix cache, tiers), nor
    // with KV an earlier build kept from bf16 matmuls and fp32 attention.
    for (const PackItem& it : items) m->bf16_matmuls_ = m->bf16_matmuls_ || it.w->pack == PackLayout::AmxBf16;
    if (precision == MatmulPrecision::Bf16) m->identity_ = detail::sha256_hex(m->identity_ + "|matmul:bf16|attention:bf16");
    m->precision_ = precision;
  }
  return m;
}

}  // namespace kvs
