// Small random models the tests make at run time.
#pragma once
#include <string>

#include "test_util.h"
#include "tools/make_model.h"

namespace kvs::test {

// A Gemma 2 shaped model with two KV tables (full and 16-token windows):
// 4 layers of dim 64, head size 32, context 256, F16. Returns its path.
inline std::string make_windowed_gemma2(const std::string& file) {
  MakeModelOptions mo;
  mo.out = temp_dir() + "/" + file;
  mo.arch = "gemma2";
  mo.dim = 64;
  mo.n_layers = 4;
  mo.head_dim = 32;
  mo.n_ctx = 256;
  mo.window = 16;
  mo.type = GgmlType::F16;
  mo.progress = false;
  make_random_model(mo);
  return mo.out;
}

// A small random mixture-of-experts model of `arch` (llama, qwen2moe,
// qwen3moe): dim 128, 8 heads over 2 KV heads, 4 experts of FFN width 96,
// 2 used per token (qwen2moe: plus a shared expert of width 160); seed 3.
// The options only, written to temp_dir()/file once the caller makes it.
inline MakeModelOptions tiny_moe_options(const std::string& arch, GgmlType type, const std::string& file) {
  MakeModelOptions o;
  o.arch = arch;
  o.dim = 128;
  o.n_heads = 8;
  o.n_kv_heads = 2;
  o.ffn_dim = 96;
  o.n_expert = 4;
  o.n_expert_used = 2;
  if (arch == "qwen2moe") o.shared_ffn = 160;
  o.type = type;
  o.progress = false;
  o.seed = 3;
  o.out = temp_dir() + "/" + file;
  return o;
}

}  // namespace kvs::test
