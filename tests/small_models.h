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

}  // namespace kvs::test
